"""The turn's tool step: the calls of the model's message, paused or run.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`ToolStep` decides each ready call's fate: an unknown tool or bad arguments answer the
model at once; an interrupt-only tool or a held gate pauses the call (the interrupt book
records it); the rest run, all of one message in one batch: a tool or MCP activity under the
run's idempotency key, or a sub-agent (``workflows.subagents``). What comes back completes,
fails or pauses the call within the turn's budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.activity_io import (
    MCPCallInput,
    MCPSampleInput,
    MCPSampleResult,
    PolicyCall,
    PolicyInput,
    PolicyRequester,
    PolicyResult,
    ToolInput,
    ToolResult,
)
from temporal_agent_interrupts.workflows.answers import SchemaBudget
from temporal_agent_interrupts.workflows.executing import ActivityRunner, Unsealed, classified
from temporal_agent_interrupts.workflows.ids import idempotency_key
from temporal_agent_interrupts.workflows.input_rounds import (
    form_metadata,
    round_problem,
    sample_answer,
)
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, schema_error
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    cut_stored,
    json_size,
    omitted,
    over_turn_budget,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.subagents import SubAgentCalls
from temporal_agent_interrupts.workflows.types import (
    JsonObject,
    PolicyDecision,
    ToolSpec,
)


class ToolStep:
    """Pauses or runs the ready calls of the turn's current message.

    Args:
        state: The conversation's state.
        book: The interrupt book of a turn (every change to a call's status is made there).
        runner: Schedules the tool and MCP activities and takes only sealed results.
        room: Bytes the turn can still take.
        sub_agents: Runs the calls of ``agent_tool`` tools.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        book: Callable[[TurnState], InterruptBook],
        runner: ActivityRunner,
        room: Callable[[TurnState], int],
        sub_agents: SubAgentCalls,
    ) -> None:
        self.s = state
        self._book = book
        self._runner = runner
        self._room = room
        self._sub_agents = sub_agents
        # Tool calls (not sub-agents) under way: sub-agent calls are left to the next run only
        # while there are none (see SubAgentCalls.wait).
        self.running = 0

    async def run_ready(self, turn: TurnState) -> bool:
        """Start every call that is ready; pause the ones that need a human first.

        Returns whether any call paused just now.
        """
        await self._decide_by_policy(turn)
        spec = self.s.spec
        book = self._book(turn)
        now = workflow.now()
        runnable: list[CallState] = []
        paused: list[CallState] = []
        budget = SchemaBudget()  # the message's arguments share one bound: 128 calls, not 128x
        for call in turn.calls:
            if call.status != "ready":
                continue
            tool = spec.tool(call.name) if spec else None
            if call.child is not None:
                # A sub-agent call an earlier run started: it waits on its child again.
                runnable.append(call)
                continue
            if call.input_round is not None:
                # A server's input round: the next form pauses it; all answered, it is retried.
                if self._ask_form(book, call, tool, now=now):
                    paused.append(call)
                else:
                    runnable.append(call)
                continue
            if tool is None:
                available = ", ".join(t.name for t in spec.tools) if spec else ""
                name = call.name
                # Cut short: the model may make 128 such calls in one message.
                available, name = cut_stored(available, 400), cut_stored(name, 200)
                book.complete(call, {"error": f"unknown tool {name!r}; available: {available}"})
            elif tool.interrupt_only:
                schema = tool.input_schema
                problem = None if call.resumed else schema_error(call.args, schema, budget=budget)
                if problem:
                    book.complete(call, {"error": f"invalid arguments: {self._cut(problem)}"})
                else:
                    metadata = call.resumed_metadata if call.resumed else {}
                    book.pause(call, source="interrupt", metadata=metadata, now=now)
                    paused.append(call)
            elif call.policy is not None and call.policy.effect == "deny" and not call.resumed:
                book.decisions.by_policy(call)  # the model hears the policy's refusal; nothing runs
            elif book.gate_holds(call):
                # A grant in force that matches lets it run unasked, recorded as its decision.
                grant = book.decisions.find_grant(call, now=now, budget=budget)
                if grant is None:
                    book.gate(call, now=now)
                    paused.append(call)
                else:
                    book.decisions.let_through(call, grant)
                    call.edit_passes_gate = None
                    runnable.append(call)
            elif (why := book.decisions.stale(call, now=now)) is not None:
                # Approved by a grant that has ended since: the approval is void, it asks again.
                book.decisions.void(call, why, now=now)
                paused.append(call)
            else:
                if call.policy is not None and not call.resumed:
                    book.decisions.by_policy(call)  # allowed by the policy set alone: on record
                call.edit_passes_gate = None  # spent: the edited call runs
                runnable.append(call)
        if runnable:
            # The sub-agent calls of this batch share what is left of the turn's budget of
            # sub-agents (see SubAgentCalls._tree_share).
            self._sub_agents.batch = sum(
                1
                for c in runnable
                if c.child is None and (t := spec.tool(c.name) if spec else None) and t.agent
            )
            # One batch: every call of the message is scheduled in the same workflow task.
            await asyncio.gather(*(self._run_tool(turn, c) for c in runnable))
        return any(c.status == "pending" for c in [*paused, *runnable])

    def _ask_form(
        self, book: InterruptBook, call: CallState, tool: ToolSpec | None, *, now: datetime
    ) -> bool:
        """Pause ``call`` on the next form of its input round; False when every form is
        answered (the call is then retried with the answers)."""
        round_ = call.input_round
        form = round_.next_form() if round_ is not None else None
        if round_ is None or form is None:
            return False
        round_.asking = form.key
        server = tool.mcp.server if tool is not None and tool.mcp is not None else ""
        book.pause(
            call, source="input", metadata=form_metadata(round_, form, server=server), now=now
        )
        return True

    async def _answer_samples(
        self, turn: TurnState, call: CallState, tool: ToolSpec | None
    ) -> None:
        """Have the agent's model answer the round's sampling requests, one activity each (the
        prompt is its input, in history); a request that cannot be answered fails the call,
        which the model hears."""
        round_ = call.input_round
        if round_ is None:
            return
        book = self._book(turn)
        server = tool.mcp.server if tool is not None and tool.mcp is not None else ""
        for ask in round_.unsampled():
            arg = MCPSampleInput(
                agent=self.s.agent,
                chat_id=workflow.info().workflow_id,
                ref=call.ref,
                server=server,
                ask=ask,
            )
            try:
                result: MCPSampleResult = await self._runner.execute(
                    config.MCP_SAMPLE_ACTIVITY,
                    arg,
                    result_type=MCPSampleResult,
                    start_to_close_timeout=config.MCP_SAMPLE_START_TO_CLOSE,
                    heartbeat_timeout=config.MODEL_HEARTBEAT,
                    retry_policy=config.MODEL_RETRY,
                    summary=f"sampling for {call.name}",
                )
            except Unsealed as e:
                why = self._cut(e.reason)
            except ActivityError as e:
                why = self._runner.error(e, what="sampling").message
            else:
                round_.responses[ask.key] = sample_answer(result.text, result.model)
                continue
            book.complete(
                call,
                {
                    "error": f"tool {call.name!r}: its server's sampling request was not "
                    f"answered ({why})"
                },
            )
            return
        if json_size(round_) > self._room(turn):
            book.complete(
                call, {"error": f"tool {call.name!r}: {over_turn_budget('its input round')}"}
            )

    async def _decide_by_policy(self, turn: TurnState) -> None:
        """The agent's policy set decides each ready call it has not decided yet, in one
        activity for the message (``config.POLICY_ACTIVITY``): its result, sealed, is in
        history, so a replay reads the decisions and never evaluates the policy. Calls a person
        already approved (a restart), sub-agents under way and interrupt-only tools are not
        asked. A decision that cannot be had (the activity failed, a worker without the set,
        a result without a worker's seal) is a deny: nothing runs that the policy did not see.
        """
        spec = self.s.spec
        if spec is None or spec.policy_hash is None:
            return
        undecided = [
            c
            for c in turn.calls
            if c.status == "ready"
            and c.policy is None
            and not c.resumed
            and c.child is None
            and (tool := spec.tool(c.name)) is not None
            and not tool.interrupt_only
        ]
        # The policy reads a call's input as the tool would take it: the model hears at once of
        # an input the tool's schema refuses (as the tool would tell it), and nothing is asked.
        budget, book = SchemaBudget(), self._book(turn)
        for c in list(undecided):
            tool = spec.tool(c.name)
            problem = schema_error(c.args, tool.input_schema, budget=budget) if tool else None
            if problem is not None:
                undecided.remove(c)
                book.complete(c, {"error": f"invalid arguments: {self._cut(problem)}"})
        if not undecided:
            return
        result = await self.decide(undecided)
        if isinstance(result, str):
            for c in undecided:
                c.policy = PolicyDecision(
                    effect="deny",
                    reason=f"the agent's policy could not decide this call: {result}",
                    policy_hash=spec.policy_hash,
                )
            return
        for c in undecided:
            c.policy = result.decisions.get(c.ref) or PolicyDecision(
                effect="deny",
                reason="the agent's policy gave no decision for this call",
                policy_hash=result.policy_hash,
            )

    async def decide(self, calls: list[CallState]) -> PolicyResult | str:
        """The policy set's decisions on ``calls`` (one activity, its result sealed), or why
        there are none (the activity failed, or its result had no worker's seal)."""
        # The calls of one message share its turn's requester (who sent the message).
        requester = next((c.requester for c in calls if c.requester is not None), None)
        arg = PolicyInput(
            chat_id=workflow.info().workflow_id,
            agent=self.s.agent,
            calls=[
                PolicyCall(ref=c.ref, tool=c.name, input=c.args, annotations=self._hints(c.name))
                for c in calls
            ],
            requester=PolicyRequester(
                identity=requester.identity,
                verified=requester.verified,
                groups=list(requester.groups) if requester.verified else [],
            )
            if requester is not None
            else None,
        )
        try:
            result: PolicyResult = await self._runner.execute(
                config.POLICY_ACTIVITY,
                arg,
                result_type=PolicyResult,
                start_to_close_timeout=config.POLICY_START_TO_CLOSE,
                retry_policy=RetryPolicy(maximum_attempts=config.POLICY_ATTEMPTS),
                summary="policy",
            )
        except Unsealed as e:
            return self._cut(e.reason)
        except ActivityError as e:
            return self._runner.error(e, what="policy").message
        return result

    def _hints(self, name: str) -> JsonObject | None:
        """An MCP tool's hints as its listing recorded them (None for other tools)."""
        spec = self.s.spec
        tool = spec.tool(name) if spec else None
        return tool.annotations if tool is not None else None

    def _cut(self, text: str) -> str:
        """Text from the model or a tool, cut to a bounded size (it names keys the model made
        up, and may be copied into many calls' responses)."""
        return cut_stored(text, DOOR.note)

    def _tool_retry(self, call: CallState) -> tuple[RetryPolicy, bool]:
        """The retry policy for this run of the call, and whether it is a single attempt.

        One approval, one run: a run a human approved (a restart) gets one attempt unless the
        tool is declared idempotent or brings its own policy. A second attempt would repeat a
        side effect the human approved once.
        """
        spec = self.s.spec
        tool = spec.tool(call.name) if spec else None
        retry = tool.retry if tool else None
        if retry is not None:
            policy = RetryPolicy(
                initial_interval=timedelta(seconds=retry.initial_interval_seconds),
                backoff_coefficient=retry.backoff_coefficient,
                maximum_interval=(
                    timedelta(seconds=retry.maximum_interval_seconds)
                    if retry.maximum_interval_seconds
                    else None
                ),
                maximum_attempts=retry.maximum_attempts,
                non_retryable_error_types=retry.non_retryable_error_types,
            )
            return policy, retry.maximum_attempts == 1
        if call.resumed and not (tool and tool.idempotent):
            return RetryPolicy(maximum_attempts=1), True
        return RetryPolicy(maximum_attempts=config.TOOL_RETRY_ATTEMPTS), False

    async def _run_tool(self, turn: TurnState, call: CallState) -> None:
        spec = self.s.spec
        tool = spec.tool(call.name) if spec else None
        book = self._book(turn)
        if call.child is not None and tool is not None and tool.agent is not None:
            # Started by an earlier run, which continued as new while it waited.
            await self._sub_agents.wait(call, tool.agent, None)
            return
        # A retry after an input round is the same run: the same idempotency key.
        run = call.runs if call.input_round is not None else book.start_run(call)
        chat_id = workflow.info().workflow_id
        arg = ToolInput(
            agent=self.s.agent,
            chat_id=chat_id,
            tool=call.name,
            ref=call.ref,
            args=call.args,
            resumed=call.resumed,
            resumed_metadata=call.resumed_metadata,
            idempotency_key=idempotency_key(chat_id, call.ref, run),
            original_args=call.original_args,
            approved_by=call.approved_by if call.resumed else None,
            approved_digest=call.approved_digest if call.resumed else None,
            policy_hash=(
                call.policy.policy_hash
                if call.resumed and call.policy is not None and call.policy.effect == "ask"
                else None
            ),
        )
        if tool is not None and tool.agent is not None:
            await self._sub_agents.run(call, tool.agent, run=run)
            return
        self.running += 1
        try:
            await self._run_tool_activity(turn, call, tool, arg)
        finally:
            self.running -= 1

    async def _run_tool_activity(
        self, turn: TurnState, call: CallState, tool: ToolSpec | None, arg: ToolInput
    ) -> None:
        retry, single = self._tool_retry(call)
        book = self._book(turn)
        activity = config.TOOL_ACTIVITY
        if tool is not None and tool.mcp is not None:
            # An MCP server's tool: where it goes is data in the definition, as listed.
            activity = config.MCP_ACTIVITY
            arg = MCPCallInput(
                **arg.model_dump(),
                server=tool.mcp.server,
                server_tool=tool.mcp.tool,
                input_round=call.input_round,
            )
        try:
            result = await self._runner.execute(
                activity,
                arg,
                result_type=ToolResult,
                start_to_close_timeout=(
                    timedelta(seconds=tool.timeout_seconds)
                    if tool and tool.timeout_seconds
                    else config.TOOL_START_TO_CLOSE
                ),
                heartbeat_timeout=config.TOOL_HEARTBEAT,
                retry_policy=retry,
                summary=f"tool {call.name}",
            )
        except Unsealed as e:
            # What came back is not a worker's word; the tool may still have run (the
            # worker's own completion is refused once the activity is closed).
            book.complete(
                call,
                {
                    "error": f"tool {call.name!r}: {self._cut(e.reason)}",
                    "note": "it may have taken effect: check before trying again",
                },
            )
            return
        except ActivityError as e:
            timed_out = isinstance(e.cause, TemporalTimeoutError)
            if single and call.resumed and timed_out:
                # An approved run cut short (its timeout passed, or its worker was lost): it
                # is not run again, and the model must not take it as not having happened.
                book.complete(
                    call,
                    {
                        "error": f"tool {call.name!r} timed out and was not retried",
                        "note": "it may have taken effect: check before trying again",
                    },
                )
                return
            error = self._runner.error(e, what=f"tool {call.name!r}")
            book.fail(call, error, uncertain=not classified(e))
            return
        previous, call.input_round = call.input_round, None
        if result.kind == "input_required":
            problem = round_problem(result.input_round, previous)
            if problem is not None or result.input_round is None:
                book.complete(call, {"error": f"tool {call.name!r}: {problem}"})
            elif json_size(result.input_round) > self._room(turn):
                book.complete(
                    call, {"error": f"tool {call.name!r}: {over_turn_budget('its input request')}"}
                )
            else:
                call.input_round = result.input_round
                await self._answer_samples(turn, call, tool)
                if call.status == "done" or self._ask_form(book, call, tool, now=workflow.now()):
                    return
                # Only the model was asked: the retry goes at once.
                await self._run_tool(turn, call)
        elif result.kind == "interrupt":
            metadata = result.metadata or {}
            if json_size(metadata) > self._room(turn):
                metadata = omitted(metadata, why=over_turn_budget("this interrupt's metadata"))
            book.pause(call, source="tool", metadata=metadata, now=workflow.now())
        elif result.kind == "stale":
            # The worker's gate no longer takes this approval: nothing ran; it asks again.
            book.decisions.void(call, self._cut(result.message or "stale"), now=workflow.now())
        elif result.kind == "invalid_input":
            book.complete(call, {"error": f"invalid arguments: {self._cut(result.message or '')}"})
        else:
            output = result.output or {}
            if json_size(output) > self._room(turn):
                # The tool has run: the model must hear that, in a few bytes.
                output = {
                    "error": "output too large for this turn",
                    "detail": f"{over_turn_budget('the output')}; it was dropped",
                }
            book.complete(call, output)

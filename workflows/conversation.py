"""``AgentWorkflow``: one conversation with one agent; the workflow id is the chat id.

This module is the conversation's front door and its run loop; the rooms behind it are:

- :mod:`workflows.turn`: the turn state machine, which emits turn events (:mod:`workflows.events`);
- :mod:`workflows.interrupts`: the interrupt book, every change of a call's status and the one
  way a resume gets in;
- :mod:`workflows.payloads` and :mod:`workflows.limits`: raw payloads decoded and checked at the
  door, results fitted to Temporal's limits;
- :mod:`workflows.audit`, :mod:`workflows.operator_view` and :mod:`workflows.stream`: projections
  (the answer and rejection logs; search attributes, memo and the UI's details panel; the event
  stream clients follow);
- :mod:`workflows.telemetry`: the product's metrics and trace spans, which issue no commands.

Determinism and replay contract:

- The conversation is plain data (:class:`~workflows.types.ConversationState`). The agent's
  definition arrives as data in the ``model_call`` result, so replay never runs the agent's
  current code; this package imports no agent, tool or model code.
- Handlers never raise anything but ``ApplicationError`` (and only update handlers, where failing
  the update is meant). Signals take raw payloads and validate them here, so a malformed signal
  (one encrypted with a key the worker lacks included: ``workflows.payloads.refuse_encrypted``)
  is recorded as a rejection instead of failing the workflow task.
- Whatever enters the conversation passes the checks and budgets of :mod:`workflows.limits`, so
  its state, every activity input, query result and update result stays serializable and under
  Temporal's payload limit.
- Search attributes and the memo are written at fixed points (see :meth:`AgentWorkflow._publish`):
  each write is a command in history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

from temporal_agent_interrupts.workflows import audit, config, operator_view
from temporal_agent_interrupts.workflows.history import carry, page, page_back
from temporal_agent_interrupts.workflows.ids import idempotency_key, message_digest
from temporal_agent_interrupts.workflows.interrupts import ResumeError, pydantic_reason
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    OUT,
    RUN,
    Refused,
    check_json,
    check_label,
    check_size,
    check_text,
    json_size,
)
from temporal_agent_interrupts.workflows.operator_view import OperatorView
from temporal_agent_interrupts.workflows.payloads import (
    ENCRYPTED,
    NO_START,
    RawResume,
    RawStart,
    claimed_identity,
    claimed_token,
    continued_here,
    fit,
    only_argument,
    payload_json,
    read_start,
    rejected,
)
from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL, ConversationStream
from temporal_agent_interrupts.workflows.subagents import SubAgentChild, refused_early
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    HISTORY_IDENTITY,
    CancelInput,
    ConversationInput,
    ConversationResult,
    ConversationState,
    ErrorKind,
    FinishReason,
    HistoryInput,
    HistoryResult,
    JsonObject,
    MCPListingResult,
    MessagesInput,
    MessagesResult,
    PendingResult,
    RejectionsResult,
    ResumeInput,
    SendInput,
    SentMessage,
    StatusResult,
    SubAgentReport,
    TurnResult,
)

__all__ = [
    "AgentWorkflow",
    "idempotency_key",
]


@workflow.defn(name=config.WORKFLOW_TYPE)
class AgentWorkflow:
    @workflow.init
    def __init__(self, input: RawStart = NO_START) -> None:
        # A start is a request: only this conversation's own continue-as-new hands on state
        # (workflows.payloads.read_start says what is taken from any other start).
        carried = continued_here(workflow.info())
        if input.payload.metadata.get("encoding") == ENCRYPTED:
            # Written with a key this worker lacks (the codec left it as it was): perhaps a real
            # conversation that workers with the key can read. The payload converter raises its
            # PayloadKeyMissing, whose message names the key id (and stays readable with keys):
            # this task fails, for a worker with the key to take; nothing is closed or lost.
            workflow.payload_converter().from_payload(input.payload)
        start, refusal = read_start(input, carried=carried)
        self._s: ConversationState = start.state or ConversationState(agent=start.agent)
        self._stream = ConversationStream(start.stream, next_offset=self._s.events_total)
        self._m = TurnMachine(
            self._s,
            publish=self._publish,
            can_now=self._can_now,
            publish_event=self._stream.publish,
            signals_taken=lambda: self._signals,
        )
        # This conversation's own update handlers in progress (the stream's followers, which
        # wait as long as they like, are counted apart: see _can_now).
        self._busy = 0
        # Answers by signal on their way to a sub-agent (see _forward_signal).
        self._forwarding = 0
        # Signals this run has taken (each counts against the server's per-run limit).
        self._signals = 0
        # Updates that wait without doing anything (await_turn), and a close under way: each
        # kind has a share of Temporal's ten in-flight updates (see RUN.turn_waiters).
        self._turn_waiters = 0
        self._closing = False
        self._turn_task: asyncio.Task[str] | None = None
        # Reports to a caller and answers passed on to a sub-agent, under way (see _keep).
        self._side_tasks: set[asyncio.Task[None]] = set()
        # The carried size the status query worked out, and for which state (_carried_size).
        self._carried: tuple[tuple[int, ...], int | None] | None = None
        # What the search attributes say, as last written (see _publish).
        self._published: tuple[object, ...] | None = None
        # What the memo holds (carried over by continue-as-new), so only changes need an
        # upsert. An empty list does not survive the trip into a memo (measured: a start with
        # {"pending": []} records no memo at all), so absent means nothing pending. A memo a
        # start brought is not this conversation's: its keys are removed at the first publish.
        self._memo_pending: list[dict[str, Any]] = (
            workflow.memo_value("pending", []) if carried else []
        )
        self._memo_scrub = [] if carried else sorted(workflow.info().raw_memo)
        # Whether the memo still holds the last batch of answer records (see _publish).
        self._memo_answers = carried and workflow.memo_value("answers", None) is not None
        # The start could not name a conversation at all: it ends at once, closed.
        self._unusable = not start.agent
        if refusal is not None:
            self._reject(handler="start", reason=refusal, payload=[input], via="start")
        # A sub-agent's call (agent_tool): its first message is in the start, and it closes when
        # that turn ends. Not a carried state: a start's own request, checked in run.
        self._task = start.task if not carried and not self._unusable else None
        if self._task is not None:
            self._s.one_turn = True
            self._s.depth = start.depth
            self._s.tree_budget = start.budget

    # ------------------------------------------------------------------------------------------
    # Main loop

    @workflow.run
    async def run(self, input: RawStart = NO_START) -> ConversationResult:
        if self._unusable:
            # Nothing to converse with: closed at once, the refusal in its rejection log.
            self._s.closed = True
            self._publish()
            return self._result()
        # Let the first task's handlers act first: a conversation our client starts with a
        # message was started "running", and publishing before the send's handler has started
        # the turn would write "idle" only to write "running" again.
        await asyncio.sleep(0)
        if self._task is not None:
            problem = self._send_problem(self._task, agent=None, size=len(self._task.encode()))
            if problem:
                self._reject(handler="start", reason=problem, payload=[input], via="start")
                self._s.closed = True
            else:
                self._m.start(self._task)
        self._publish()
        try:
            while True:
                await workflow.wait_condition(
                    lambda: self._s.turn is not None or self._s.closed or self._can_now()
                )
                if self._s.turn is not None:
                    self._turn_task = asyncio.create_task(self._m.drive())
                    guard = asyncio.create_task(self._guard_history())
                    try:
                        outcome = await self._turn_task
                    finally:
                        guard.cancel()
                    self._turn_task = None
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        # The workflow was cancelled while a cancel update was ending the turn:
                        # the turn task absorbed the cancellation, which still stands.
                        raise asyncio.CancelledError()
                    if outcome != "continue_as_new":
                        if self._s.one_turn and self._s.turn is None:
                            # A sub-agent's conversation answers one call: its result is the
                            # workflow's, which the caller's turn awaits.
                            self._s.closed = True
                        continue
                if self._s.closed:
                    break
                # Long conversations stay bounded: carry the state into a fresh run. Nothing a
                # client holds (chat id, refs, stream offsets) changes.
                await workflow.wait_condition(lambda: not self._busy)
                state = self._state_for_next_run()
                if state is None:
                    # Even trimmed, the state would be refused as too large, and the run would
                    # be stuck retrying. Going on in this run is the lesser evil.
                    self._m.can_blocked = True
                    workflow.logger.warning(
                        "conversation state too large to continue-as-new even after trimming; "
                        "staying in this run"
                    )
                    continue
                if self._stream.polls:
                    # Followers are released to pick up the next run; whatever a handler did
                    # meanwhile is in the state carried.
                    self._stream.detach()
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    state = self._state_for_next_run()
                    if state is None:
                        self._stream.reattach()
                        self._m.can_blocked = True
                        continue
                if state.dropped_messages > self._s.dropped_messages:
                    workflow.logger.warning(
                        "dropped the %d oldest messages to carry the conversation into a new run",
                        state.dropped_messages - self._s.dropped_messages,
                    )
                workflow.continue_as_new(
                    ConversationInput(
                        agent=self._s.agent,
                        state=state,
                        stream=self._stream.carry(),
                    )
                )
        except asyncio.CancelledError:
            # The workflow itself was cancelled (e.g. from the UI): the conversation is closed.
            # A turn in progress ends cancelled, so a caller waiting on it gets that answer
            # rather than "workflow execution already completed".
            if self._s.turn is not None:
                self._m.finish_cancelled()
            self._s.closed = True
            self._publish()
            self._stream.detach()
            await workflow.wait_condition(workflow.all_handlers_finished)
            await self._report_end()
            raise
        # Followers read the rest of a closed conversation's stream by query.
        self._stream.detach()
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._publish()
        await self._report_end()
        return self._result()

    async def _report_end(self) -> None:
        """A sub-agent's conversation tells its caller it is closing: a caller that continued
        as new while it waited has no handle on it, and reads its end from it on this report.
        Awaited, so the report leaves before the run closes."""
        await self._tell_caller()

    async def _tell_caller(self) -> None:
        """Signal the caller (as Temporal names it: the parent workflow, never one a start
        input names) a ``sub_agent`` report, a hint; nothing for a conversation of its own."""
        parent = workflow.info().parent
        if parent is None or not self._s.one_turn:
            return
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        try:
            await handle.signal(
                config.SUB_AGENT_SIGNAL, SubAgentReport(chat_id=workflow.info().workflow_id)
            )
        except Exception as e:  # noqa: BLE001  # the caller may have gone: only a hint
            workflow.logger.info("could not tell the caller: %s", type(e).__name__)

    def _result(self) -> ConversationResult:
        return fit(
            ConversationResult(
                chat_id=workflow.info().workflow_id,
                turns=self._s.turns,
                last_turn=self._s.last_turn,
            ),
            # A sub-agent's result is its caller's tool output: the budget of one (the
            # caller's turn measures it again), not of an update's result, which would cut
            # any answer past 48 KiB to a placeholder.
            DOOR.tool_output if self._s.one_turn else OUT.update_result,
        )

    def _can_now(self) -> bool:
        # Not while a handler of ours is at work; the stream's followers are released when the
        # run continues as new.
        if self._m.can_blocked or self._busy or self._m.notifying or self._forwarding:
            return False
        if self._signals >= RUN.can_signals:
            # A fresh run has the server's whole per-run signal allowance again.
            return True
        info = workflow.info()
        length = info.get_current_history_length()
        if info.get_current_history_size() >= RUN.can_bytes or length >= RUN.can_events:
            # Our own bound, far below the server's (which terminates a run at 50 MiB or
            # 51,200 events), and kept even where the server does not suggest it.
            return True
        # The floor on this run's length keeps a state too large for the suggestion threshold
        # from continuing-as-new in a tight loop: each run must do some work first.
        return (
            info.is_continue_as_new_suggested()
            and length >= config.MIN_EVENTS_BEFORE_CONTINUE_AS_NEW
        )

    def _state_for_next_run(self) -> ConversationState | None:
        return carry(self._s, self._m.ref_order, paused=self._m.paused(), budget=OUT.state)

    # ------------------------------------------------------------------------------------------
    # Updates

    @contextmanager
    def _working(self) -> Iterator[None]:
        """Count an update handler of ours as at work (see _can_now)."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    async def _stopped_since(self, seen: int) -> TurnResult:
        """The result of the turn an update started or moved on, once it has stopped (ended or
        paused again): ``seen`` is the stop count read before the update acted."""
        await workflow.wait_condition(lambda: self._m.stops > seen)
        assert self._s.last_turn is not None
        return fit(self._s.last_turn, OUT.update_result)

    async def _withdraw(self, input: CancelInput) -> TurnResult:
        """Cancel the current turn: withdraw what is pending, or stop it while it runs (a model
        call in flight is abandoned, a tool is told to stop); its result once it has stopped."""
        seen = self._m.stops
        self._stop_turn(input)
        return await self._stopped_since(seen)

    def _stop_turn(self, input: CancelInput) -> None:
        self._m.cancel = input
        if self._turn_task is not None and not self._m.waiting_on_human():
            self._turn_task.cancel()

    async def _guard_history(self) -> None:
        """Stop a running turn whose run's history nears Temporal's limits.

        A run continues as new only while no turn runs (or at a pause); a tool or model call
        that runs long, under a flood of signals (each refused, each in history), would take
        the run to the server's limits, where it is terminated and everything in it is out of
        reach. Well before that (:data:`~workflows.limits.RUN.guard_bytes`), the turn is
        cancelled as a caller's cancel would (the model is told what may have taken effect),
        and the run then continues as new. No command unless it acts.
        """
        await workflow.wait_condition(self._history_near_limit)
        if self._m.cancel is None and not self._m.waiting_on_human():
            workflow.logger.warning(
                "the run's history nears Temporal's limits while a turn runs: cancelling the "
                "turn so the conversation can continue as new"
            )
            self._stop_turn(
                CancelInput(
                    reason="the conversation's history neared Temporal's limits while this "
                    "turn ran (a flood of signals or updates); it was stopped to keep the "
                    "conversation",
                    identity=HISTORY_IDENTITY,
                )
            )

    def _history_near_limit(self) -> bool:
        info = workflow.info()
        return (
            info.get_current_history_size() >= RUN.guard_bytes
            or info.get_current_history_length() >= RUN.guard_events
        )

    @workflow.update
    async def send(self, input: SendInput) -> TurnResult:
        """Start a turn with a user message; returns when the turn ends or pauses."""
        with self._working():
            self.validate_send(input)
            repeat = self._repeat(input)
            if repeat is not None:
                # The message is in: whoever sent it again is told how its turn went. Another
                # send of the same task may have started a turn since the check (validators
                # run before handlers): that turn is not this message's.
                result = await self._latest_turn(of=repeat.turn)
                if result is not None and result.turn != repeat.turn:
                    raise rejected(
                        ErrorKind.SEND_REJECTED,
                        f"message {input.message_id!r} was sent already and started turn "
                        f"{repeat.turn}; the conversation has moved on to turn {result.turn}",
                    )
                if result is None:
                    raise rejected(
                        ErrorKind.SEND_REJECTED,
                        f"message {input.message_id!r} was sent already; its turn's result "
                        "is no longer kept (Chat.history has the conversation)",
                    )
                return result.model_copy(update={"repeat": True})
            seen = self._m.stops
            self._m.start(input.text, stream=input.stream, message_id=input.message_id)
            return await self._stopped_since(seen)

    @send.validator
    def validate_send(self, input: SendInput) -> None:
        reason = self._send_problem(
            input.text,
            agent=input.agent,
            size=len(input.text.encode()),
            message_id=input.message_id,
        )
        if reason:
            raise rejected(ErrorKind.SEND_REJECTED, reason)
        if self._repeat(input) is not None:
            self._check_turn_waiters()

    @workflow.update
    async def resume(self, payload: RawResume) -> TurnResult:
        """Answer pending interrupts; returns when the turn ends or pauses again.

        ``payload`` is a :class:`~workflows.types.ResumeInput`, taken raw
        (:data:`~workflows.payloads.RawResume`) so that this workflow, not the data converter,
        decides what is wrong with a bad one and says so. A resume that leaves interrupts
        unanswered returns at once, listing those still pending.
        """
        with self._working():
            try:
                # Accepted, so in history: an answer for a sub-agent goes on to it even where
                # its rules as shown here would refuse it, so that it spends the token there.
                target = self._delegated_target(payload, early=False)
            except Refused as e:
                raise self._refused_update(payload, e) from None
            if target is not None:
                # Its token is in this conversation's history now (the update, the forwarding
                # activity's input), whatever the sub-agent makes of it: spent here too, and
                # the sub-agent spends it too, whatever its verdict (sub_agent_resume).
                self._m.spend_refused(claimed_token([payload]))
                return await self._forward_update(target)
            try:
                resume = self._check_resume(payload)
                seen = self._m.stops
                turn = self._m.resume(resume, via="update")
            except Refused as e:
                raise self._refused_update(payload, e) from None
            if not self._m.book(turn).all_answered():
                return fit(self._m.paused_result(turn), OUT.update_result)
            return await self._stopped_since(seen)

    def _refused_update(self, payload: RawResume, refusal: Refused) -> Exception:
        """A resume update refused in its handler, once accepted: reachable when a duplicate
        passed validation in the same task, or when the validator let it through (an answer a
        caller passed on, see validate_resume). Its payload is in history: its token is spent.
        """
        self._m.spend_refused(claimed_token([payload]))
        self._m.telemetry.rejected("resume", via="update")
        return rejected(ErrorKind.RESUME_REJECTED, refusal.reason, refusal.code)

    async def _forward_update(self, target: tuple[str, SubAgentChild, JsonObject]) -> TurnResult:
        """An answer by update for a sub-agent's interrupt: the child's ``resume`` update
        checks it by its own rules, and its refusal is this update's. It returns as a resume of
        this conversation's own would: once the turn stops again (the sub-agent pauses again,
        or its answer lets the turn go on to its end)."""
        child_id, child, body = target
        outcome = await self._m.children.forward(child_id, child, body, via="update")
        if outcome.refused is not None:
            self._m.telemetry.rejected("resume", via="update")
            # The child's kind of refusal too: "not an approver" stays forbidden through here.
            raise rejected(
                ErrorKind.RESUME_REJECTED,
                f"refused by sub-agent {child_id}: {outcome.refused}",
                outcome.code or "invalid",
            )
        child_result = outcome.result
        if child_result is not None and child_result.finish_reason == FinishReason.INTERRUPTED:
            # Still waiting there (a quorum not met, another call): that is where it stands.
            turn = self._s.turn
            if turn is not None:
                return fit(self._m.paused_result(turn), OUT.update_result)
        # Answered there: the turn goes on once that call is done, unless a sibling (another
        # sub-agent, or a call of this conversation's own) still waits, which is then where
        # the turn stands. A stop before the call is done is no answer to this: a sibling's
        # change, reported while this sub-agent still showed what was just answered.
        await workflow.wait_condition(lambda: child_id not in self._m.children.running)
        seen = self._m.stops
        await workflow.wait_condition(
            lambda: self._m.stops > seen or self._s.turn is None or self._m.last_result_paused()
        )
        if self._m.stops > seen or self._s.turn is None:
            assert self._s.last_turn is not None
            return fit(self._s.last_turn, OUT.update_result)
        turn = self._s.turn
        assert turn is not None
        return fit(self._m.paused_result(turn), OUT.update_result)

    @resume.validator
    def validate_resume(self, payload: RawResume) -> None:
        if self._s.one_turn and _passed_on():
            # An answer the caller passed on: its token is in the caller's history whatever
            # happens here, so a refusal must be on record here too (the handler checks it,
            # and spends the token of one it refuses); a validator's refusal leaves nothing.
            # Anyone may name such an id: it gets them what a signal does.
            return
        try:
            if self._delegated_target(payload) is not None:
                return  # the sub-agent's own resume update checks it, by its own rules
            self._check_resume(payload)
        except Refused as e:
            workflow.logger.info("resume rejected (update): %s", e.reason)
            # A metric is no command: a validator may count what it refuses.
            self._m.telemetry.rejected("resume", via="update")
            raise rejected(ErrorKind.RESUME_REJECTED, e.reason, e.code) from None

    @workflow.update
    async def cancel(self, input: CancelInput) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn); ends it ``cancelled``."""
        with self._working():
            self.validate_cancel(input)
            return await self._withdraw(input)

    @cancel.validator
    def validate_cancel(self, input: CancelInput) -> None:
        if self._s.turn is None:
            raise rejected(
                ErrorKind.CANCEL_REJECTED, "nothing to cancel: no turn is running or paused"
            )
        if self._m.cancel is not None:
            raise rejected(ErrorKind.CANCEL_REJECTED, "a cancellation is already under way")
        self._check_cancel_input(input)

    def _check_cancel_input(self, input: CancelInput) -> None:
        try:
            # The reason is copied into every withdrawn call's response, so it stays short.
            check_text(input.reason, what="reason", limit=DOOR.reason)
            if input.identity is not None:
                check_label(input.identity, what="identity", limit=DOOR.identity)
        except Refused as e:
            raise rejected(ErrorKind.CANCEL_REJECTED, e.reason) from None

    @workflow.update
    async def await_turn(self) -> TurnResult | None:
        """The latest turn's result, once the current turn (if any) has paused or ended."""
        with self._working():
            # Also checked here: validators of one task may all run before any handler.
            self.validate_await_turn()
            return await self._latest_turn()

    async def _latest_turn(self, *, of: int | None = None) -> TurnResult | None:
        """The latest turn's result, once it has paused or ended (or, given ``of``, once a
        turn after that one has started)."""
        self._turn_waiters += 1
        try:
            await workflow.wait_condition(
                lambda: (
                    self._s.turn is None
                    or self._m.waiting_on_human()
                    # Paused on sub-agents, each call of the message paused or ended.
                    or self._m.pause_whole()
                    or (of is not None and self._s.turns != of)
                )
            )
        finally:
            self._turn_waiters -= 1
        result = self._m.last_result()
        if of is not None and self._s.last_turn is not None and self._s.last_turn.turn == of:
            result = self._s.last_turn  # that turn's own end, whatever has started since
        return fit(result, OUT.update_result) if result is not None else None

    @await_turn.validator
    def validate_await_turn(self) -> None:
        self._check_turn_waiters()

    def _check_turn_waiters(self) -> None:
        if self._turn_waiters >= RUN.turn_waiters:
            # Each waits as long as the turn runs, holding one of Temporal's ten in-flight
            # updates: the rest stay free for send, resume and cancel.
            raise rejected(
                ErrorKind.TOO_MANY_WAITING,
                f"{RUN.turn_waiters} callers already wait for this turn to stop; wait for "
                "them, or follow the turn on its stream (Chat.events)",
            )

    @workflow.update
    async def close(self, input: CancelInput) -> ConversationResult:
        """End the conversation: withdraw anything pending and complete the workflow."""
        with self._working():
            self.validate_close(input)
            self._closing = True
            try:
                if self._s.turn is not None:
                    await self._withdraw(input)
            finally:
                self._closing = False
            self._s.closed = True
            return self._result()

    @close.validator
    def validate_close(self, input: CancelInput) -> None:
        if self._s.closed:
            raise rejected(ErrorKind.SEND_REJECTED, "this conversation is already closed")
        if self._closing:
            raise rejected(ErrorKind.CANCEL_REJECTED, "this conversation is being closed already")
        self._check_cancel_input(input)

    # ------------------------------------------------------------------------------------------
    # Signals: every signal name lands here with raw payloads, so a malformed one (bad JSON,
    # wrong types, zero or two arguments) is recorded instead of failing the workflow task.

    @workflow.signal(dynamic=True)
    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._signals += 1
        try:
            payload = only_argument(name, args)
            if name == "resume":
                # A signal is in history whatever is made of it: one with a token goes on to
                # the sub-agent even where its rules as shown here would refuse it, so that
                # the sub-agent spends the token too.
                target = self._delegated_target(payload, early=claimed_token([payload]) is None)
                if target is not None:
                    self._m.spend_refused(claimed_token([payload]))  # as by update
                    self._forward_signal(payload, target)
                else:
                    self._m.resume(self._check_resume(payload), via="signal")
            elif name == "send":
                self._send_signal(payload)
            elif name == config.SUB_AGENT_SIGNAL:
                self._sub_agent_signal(payload)
            elif name == PUBLISH_SIGNAL:
                turn = self._s.turn
                attempt, added = self._stream.accept_publish(
                    payload, key=self._m.streaming_key(), turn=turn.turn if turn else 0
                )
                self._m.model.streamed[attempt] = self._m.model.streamed.get(attempt, "") + added
                self._s.events_total = self._stream.next_offset
            else:
                raise ResumeError(
                    f"unknown signal {name!r}; this workflow accepts 'resume' and 'send'"
                )
        except Refused as e:
            self._reject(handler=name, reason=e.reason, payload=args)
        except Exception as e:  # noqa: BLE001  # a signal must never fail the workflow task
            workflow.logger.exception("signal %r could not be handled", name)
            self._reject(
                handler=name,
                reason=f"internal error handling the signal ({type(e).__name__})",
                payload=args,
            )

    def _sub_agent_signal(self, payload: RawValue) -> None:
        """A sub-agent says what it waits on changed: a hint, read from the child itself."""
        check_size(len(payload.payload.data), limit=DOOR.resume, what="sub-agent report")
        try:
            report = SubAgentReport.model_validate(payload_json(payload))
        except ValidationError as e:
            raise ResumeError(f"malformed sub-agent report: {pydantic_reason(e)}") from None
        if self._m.children.hint(report.chat_id):
            return
        if report.chat_id.startswith(f"{workflow.info().workflow_id}--"):
            # A child of ours that has just finished: its last report crossed its result.
            return
        raise ResumeError("no sub-agent of this conversation runs under that chat id")

    def _delegated_target(
        self, payload: RawResume, *, early: bool = True
    ) -> tuple[str, SubAgentChild, JsonObject] | None:
        """The sub-agent a resume is for, when every entry names one of its interrupts (as
        this conversation shows them); None: it is for this conversation's own (or nothing),
        and is checked here as any resume is.

        Args:
            early: Refuse here what the sub-agent would surely refuse (``refused_early``).
                False once the payload is in this conversation's history: its token then must
                reach the sub-agent, which spends it whatever its verdict.
        """
        if not self._m.children:
            return None
        named = _answered_refs(payload)
        if named is None:
            return None
        body, refs = named
        found = self._m.children.delegated_to(refs)
        if found is None:
            return None
        why = refused_early(body, found[1].requests) if early else None
        if why is not None:
            # Surely refused there: refused here, before it costs the caller's history an
            # activity (a validator's refusal leaves none; a signal's is recorded as any).
            # Of the kind the child's would be: an approver it does not name is forbidden.
            reason, code = why
            raise ResumeError(
                f"refused by sub-agent {found[0]}'s rules, as it shows them: {reason}", code=code
            )
        return found[0], found[1], body

    def _forward_signal(
        self, payload: RawResume, target: tuple[str, SubAgentChild, JsonObject]
    ) -> None:
        """An answer by signal for a sub-agent's interrupt: passed on to the child, whose rules
        check it; a refusal there is recorded here, as any refused signal is."""
        child_id, child, body = target

        async def forward() -> None:
            try:
                outcome = await self._m.children.forward(child_id, child, body, via="signal")
            except Exception as e:  # noqa: BLE001  # an activity failure must not fail the task
                self._reject(
                    handler="resume",
                    reason=f"could not reach sub-agent {child_id} ({type(e).__name__})",
                    payload=[payload],
                )
                return
            finally:
                self._forwarding -= 1
            if outcome.refused is not None:
                self._reject(
                    handler="resume",
                    reason=f"refused by sub-agent {child_id}: {outcome.refused}",
                    payload=[payload],
                )

        # Counted now, in the handler: the run must not continue as new before the answer has
        # reached the sub-agent (it would be dropped, unrecorded), even in this very task.
        self._forwarding += 1
        self._keep(asyncio.create_task(forward()))

    def _send_signal(self, payload: RawValue) -> None:
        size = len(payload.payload.data)
        # Size first: an oversized payload is refused before it is even parsed.
        check_size(size, limit=DOOR.send, what="message")
        body = payload_json(payload)
        check_json(body, what="send")
        try:
            input = SendInput.model_validate(body)
        except ValidationError as e:
            raise ResumeError(f"malformed send: {pydantic_reason(e)}") from None
        problem = self._send_problem(
            input.text, agent=input.agent, size=size, message_id=input.message_id
        )
        if problem:
            raise ResumeError(problem)
        repeat = self._repeat(input)
        if repeat is not None:
            raise ResumeError(
                f"a repeat of message {repeat.message_id!r}, which started turn {repeat.turn}: "
                "nothing to do"
            )
        self._m.start(input.text, stream=input.stream, message_id=input.message_id)

    def _reject(
        self,
        *,
        handler: str,
        reason: str,
        payload: Sequence[RawValue],
        via: Literal["signal", "start"] = "signal",
    ) -> None:
        """Record a refused signal, or what a start asked for that it may not (an update's
        refusal goes back to its caller instead)."""
        record = audit.rejection(
            at=workflow.now(),
            handler=handler,
            reason=reason,
            raw=b"".join(p.payload.data for p in payload),
            identity=claimed_identity(payload) if via == "signal" else None,
            via=via,
        )
        audit.reject(self._s, record)
        self._m.telemetry.rejected(handler, via=via)
        if handler == "resume":
            # The payload is in history now: its token, if valid, must answer nothing later.
            self._m.spend_refused(claimed_token(payload))
        workflow.logger.warning(
            "rejected %r %s from %r: %s",
            record.handler,
            via,
            record.identity or ("the starter" if via == "start" else "unknown sender"),
            record.reason,
        )
        if via == "signal":
            # (A start's refusal is published by the run's first publish, in run.)
            self._publish()

    # ------------------------------------------------------------------------------------------
    # Checks shared by the signal and update paths

    def _repeat(self, input: SendInput) -> SentMessage | None:
        """The latest turn's message, when ``input`` (checked) is that message sent again."""
        if input.message_id is None:
            return None
        return next((m for m in self._s.sent if m.message_id == input.message_id), None)

    def _send_problem(
        self, text: str, *, agent: str | None, size: int, message_id: str | None = None
    ) -> str | None:
        if self._s.closed:
            return "this conversation is closed"
        if agent and agent != self._s.agent:
            return (
                f"chat {workflow.info().workflow_id!r} belongs to agent {self._s.agent!r}, "
                f"not {agent!r}"
            )
        if not text.strip():
            return "the message is empty"
        try:
            check_size(size, limit=DOOR.send, what="message")
            # As stored: a control character takes six bytes of JSON.
            check_text(text, what="the message", limit=DOOR.send)
        except Refused as e:
            return e.reason
        if message_id is not None:
            if not message_id:
                return "the message id is empty: give one, or none"
            try:
                check_label(message_id, what="the message id", limit=DOOR.message_id)
            except Refused as e:
                return e.reason
            sent = next((m for m in self._s.sent if m.message_id == message_id), None)
            if sent is not None:
                if sent.digest != message_digest(text):
                    return (
                        f"message id {message_id!r} was used for another message (turn "
                        f"{sent.turn}); give each message an id of its own"
                    )
                if sent.turn != self._s.turns:
                    return (
                        f"message {message_id!r} was sent already and started turn "
                        f"{sent.turn}; the conversation has moved on to turn {self._s.turns}"
                    )
                return None  # a repeat of the latest turn's message: the handler joins it
        if self._s.turn is not None:
            # A call waiting on a sub-agent that waits on someone is a pause too, not a busy
            # turn: answering is what lets it go on.
            if self._m.paused() or self._m.children.delegated():
                return (
                    "the conversation is paused on interrupts; answer them with resume or "
                    f"withdraw them with cancel first. Pending: {self._pending_listing()}"
                )
            return "a turn is already running; wait for it to finish"
        return None

    def _pending_listing(self) -> str:
        """What the turn waits on, for a refusal: its own calls, then its sub-agents' (with
        the chat each waits in, where it can also be answered)."""
        turn = self._s.turn
        own = [f"{c.name} (ref {c.ref})" for c in self._m.book(turn).pending()] if turn else []
        theirs = [
            f"{r.name} (ref {r.ref}, in sub-agent {r.chat_id})"
            for r in self._m.children.delegated()
        ]
        return ", ".join([*own, *theirs])

    def _check_resume(self, payload: RawResume) -> ResumeInput:
        turn = self._s.turn
        named = _answered_refs(payload) if self._m.children else None
        settled = self._m.children.settled_in_child(named[1]) if named is not None else None
        if settled is not None:
            # (An answer naming a sub-agent's pending call went to it: see _delegated_target.)
            ref, child_id = settled
            raise ResumeError(
                f"ref {ref!r} is not pending: sub-agent {child_id} has settled it already "
                f"(answered, or withdrawn). Pending: {self._pending_listing() or 'nothing'}",
                code="conflict",
            )
        if turn is not None and not self._m.paused() and self._m.children.delegated():
            raise ResumeError(
                "this conversation waits only on its sub-agents' interrupts, and this answer "
                "names others (one resume answers the calls of one sub-agent). Pending: "
                f"{self._pending_listing()}",
                code="not_found",
            )
        if turn is None or not self._m.paused():
            raise ResumeError(
                "nothing is paused: this conversation has no pending interrupts", code="conflict"
            )
        size = len(payload.payload.data)
        try:
            # Size first: an oversized payload is refused before it is even parsed.
            check_size(size, limit=DOOR.resume, what="resume")
        except Refused as e:
            raise ResumeError(e.reason) from None
        return self._m.book(turn).validate(
            payload_json(payload), room=self._m.room(turn), now=workflow.now()
        )

    # ------------------------------------------------------------------------------------------
    # Queries: each result is cut to fit Temporal's payload limit, with stated placeholders.

    @workflow.query
    def pending(self) -> PendingResult:
        turn = self._s.turn
        own = self._m.book(turn).requests() if turn else []
        result = PendingResult(interrupts=[*own, *self._m.children.delegated()])
        return fit(result, OUT.query)

    @workflow.query
    def status(self) -> StatusResult:
        # Front ends ask this while they wait (the web app's streams, agentctl's waits), so it
        # builds only what it returns: the status itself, not the whole operator view (memo
        # entries, the details panel), and the carried size once per state (see _carried_size).
        turn = self._s.turn
        book = self._m.book(turn) if turn else None
        delegated = self._m.children.delegated()
        paused = bool(book.pending()) if book else False
        result = StatusResult(
            chat_id=workflow.info().workflow_id,
            agent=self._s.agent,
            status=operator_view.status(self._s, paused=paused or bool(delegated)),
            turns=self._s.turns,
            model=self._s.spec.model if self._s.spec else None,
            pending=[*(book.requests() if book else []), *delegated],
            last_turn=self._m.last_result(),
            rejections=self._s.rejections_total,
            carried_bytes=self._carried_size(),
            recent_answers=self._s.answers[-10:],
        )
        return fit(result, OUT.query)

    def _carried_size(self) -> int | None:
        """What continue-as-new would carry now, in bytes; None if it could not.

        Working it out serializes the whole conversation (up to 1.6 MiB, and a fit over that:
        tens of milliseconds), so it is worked out once per state a query can see. The state
        changes only in an activation, and each activation that can change it comes with a
        workflow task of its own, so history's length (with the counts that grow within a task)
        tells one state from the next. Kept for this query alone: nothing the workflow decides
        reads it, so replay, which runs no queries, is the same with or without it.
        """
        info = workflow.info()
        key = (
            info.get_current_history_length(),
            len(self._s.messages),
            self._s.turns,
            len(self._s.answers),
            self._s.rejections_total,
            self._s.events_total,
        )
        if self._carried is None or self._carried[0] != key:
            carried = self._state_for_next_run()
            self._carried = (key, json_size(carried) if carried is not None else None)
        return self._carried[1]

    @workflow.query
    def history(self, input: HistoryInput | None = None) -> HistoryResult:
        """The conversation's messages, newest last, and its audit log of answers.

        One result holds the newest messages that fit; ``start`` above 0 says older ones
        remain, read with ``HistoryInput(end=start)`` (``Chat.history()`` reads them all).
        """
        messages = self._s.messages
        end = len(messages) if input is None or input.end is None else input.end
        end = max(0, min(end, len(messages)))
        answers = self._s.answers
        room = OUT.query - json_size(answers) - 1024
        start = page_back(messages, end=end, budget=room)
        result = HistoryResult(
            messages=messages[start:end],
            answers=answers,
            dropped_messages=self._s.dropped_messages,
            start=start,
            answers_dropped=self._s.answers_dropped,
        )
        return fit(result, OUT.query)

    @workflow.query
    def messages(self, input: MessagesInput) -> MessagesResult:
        """A slice of the conversation; the model activity asks when it lacks the start.

        A slice too large for one result stops early, with ``next`` where to go on.
        """
        messages = self._s.messages
        end = len(messages) if input.end is None else max(0, min(input.end, len(messages)))
        start = max(0, min(input.start, end))
        stop = page(messages, start=start, end=end, budget=OUT.query - 1024)
        return MessagesResult(messages=messages[start:stop], next=stop if stop < end else None)

    @workflow.query
    def mcp_listing(self) -> MCPListingResult:
        """The MCP servers' tools in the recorded definition; the model activity asks when two
        of the agent's servers may offer one name (activities.mcp, ``merged_spec``). Within
        the definition's own budget (64 KiB), so within a query result."""
        spec = self._s.spec
        return MCPListingResult(tools=[t for t in spec.tools if t.mcp] if spec else [])

    @workflow.query
    def rejections(self) -> RejectionsResult:
        result = RejectionsResult(rejections=self._s.rejections, total=self._s.rejections_total)
        return fit(result, OUT.query)

    # ------------------------------------------------------------------------------------------
    # What operators see: search attributes, memo and the UI's details panel, projected from
    # the state (workflows.operator_view) and written only where they changed.

    def _report_to_caller(self) -> None:
        """A sub-agent's conversation tells its caller that what it waits on changed."""
        if workflow.info().parent is not None and self._s.one_turn:
            self._keep(asyncio.create_task(self._tell_caller()))

    def _keep(self, task: asyncio.Task[None]) -> None:
        # The loop holds tasks weakly: a reference keeps one alive until it is done.
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _view(self) -> OperatorView:
        turn = self._s.turn
        book = self._m.book(turn) if turn else None
        return operator_view.project(
            self._s,
            chat_id=workflow.info().workflow_id,
            pending=book.pending() if book else [],
            requests=book.requests() if book else [],
            delegated=self._m.children.delegated(),
        )

    def _publish(self) -> None:
        """Write the operator view where it changed.

        Called at fixed points: the run's start and end, a turn's start and each stop, each
        applied answer or expired deadline, each rejected signal. Every upsert is a command in
        history, so a run replays only if it writes at the same points as when it ran.
        """
        view = self._view()
        if view.search_attributes != self._published:
            updates = operator_view.search_attribute_updates(
                workflow.info().typed_search_attributes, agent=self._s.agent, view=view
            )
            if updates:
                workflow.upsert_search_attributes(updates)
            self._published = view.search_attributes
        # Answer records go to the memo as they are made: each write is an event in this
        # run's history, which Temporal keeps after the run closes, so the full trail is
        # readable across runs (``agentctl audit``) whatever the state's budget sheds.
        answers = audit.outbox_batch(self._s) if self._s.audit_outbox else []
        scrub = self._memo_scrub
        if view.memo_pending != self._memo_pending or answers or scrub:
            # Keys a start brought go (None removes a key); "pending" too when nothing is.
            memo: dict[str, Any] = dict.fromkeys(scrub)
            if view.memo_pending or "pending" not in scrub:
                memo["pending"] = view.memo_pending
            self._memo_scrub = []
            if answers:
                memo["answers"] = answers
            elif self._memo_answers:
                # The batch is in history already: off the memo, which every visibility
                # listing returns and continue-as-new copies (None removes the key).
                memo["answers"] = None
            workflow.upsert_memo(memo)
            if view.memo_pending != self._memo_pending:
                self._report_to_caller()
            self._memo_pending = view.memo_pending
            self._memo_answers = bool(answers)
        workflow.set_current_details(view.details)
        if view.status != "running":
            # Between turns (or paused), so no follower of the turn in progress loses items.
            self._stream.trim()


def _passed_on() -> bool:
    """Whether the update being validated is an answer a caller passed on (its id)."""
    info = workflow.current_update_info()
    return info is not None and info.id.startswith(config.SUB_AGENT_ANSWER_UPDATE_PREFIX)


def _answered_refs(payload: RawResume) -> tuple[JsonObject, set[str]] | None:
    """A resume's body and the refs its entries name, read leniently (None: not of that shape,
    or too large; the full check says what is wrong with it)."""
    try:
        check_size(len(payload.payload.data), limit=DOOR.resume, what="resume")
        body = payload_json(payload)
    except Refused:
        return None
    if not isinstance(body, dict):
        return None
    entries = [*(body.get("respond") or []), *(body.get("restart") or [])]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return None
    refs = [e.get("ref") for e in entries]
    if not all(isinstance(r, str) for r in refs):
        return None
    return body, {r for r in refs if isinstance(r, str)}

"""Agents as tools: a call of an ``agent_tool`` runs a conversation with another agent as a
child workflow, and the caller's turn waits on it.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Two parts, handed callables by the turn rather than the turn itself:

- :class:`SubAgentCalls` starts a call's child, waits for its outcome (or leaves the wait to
  the next run when this one continues as new), and cancels it with the turn.
- :class:`Children` keeps what the running children wait on in view (each child's report is
  a hint; what it waits on is read from the child), lists their interrupts as the turn's own,
  and passes an answer given here on to the child it is for, whose rules decide it.

The functions after the classes are the rules both sides share: the child's first message,
its structured answer, and what the caller can tell the child would refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    CancelledError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)

from temporal_agent_interrupts.workflows import audit, config, receipts
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentEnd,
    SubAgentPendingInput,
    SubAgentPendingResult,
    SubAgentResumeInput,
    SubAgentResumeResult,
)
from temporal_agent_interrupts.workflows.executing import ActivityRunner, Unsealed
from temporal_agent_interrupts.workflows.ids import sub_agent_id
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, ResumeError, schema_error
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    RefusalCode,
    Refused,
    check_json,
    cut_stored,
    decode_json,
    json_size,
    over_turn_budget,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationInput,
    ConversationState,
    SubAgentLink,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    ConversationResult,
    ErrorInfo,
    ErrorKind,
    FinishReason,
    InterruptRequest,
    JsonObject,
    Status,
    SubAgentRef,
)


class Children:
    """The sub-agents this turn's calls are running, and what they wait on.

    Args:
        state: The conversation's state.
        runner: Schedules the reads of a child and the answers passed on to it.
        book: The interrupt book of a turn (this turn's own pending interrupts).
        publish: Writes the operator view (a child's interrupts changed).
        report_pause: A child's interrupts changed: the turn reports its pause (``interrupted``
            with what it waits on) once every call of its message has paused or ended.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        runner: ActivityRunner,
        book: Callable[[TurnState], InterruptBook],
        publish: Callable[[], None],
        report_pause: Callable[[], None],
    ) -> None:
        self.s = state
        self._runner = runner
        self._book = book
        self._publish = publish
        self._report_pause = report_pause
        # By child chat id: not state, since a turn with a call running never continues as new
        # (a call left to the next run is carried as its CallState.child).
        self.running: dict[str, SubAgentChild] = {}
        # One sub-agent pending read at a time: each result may be as large as a query's
        # (1.75 MiB), and the server force-fails a workflow task in flight once the events
        # buffered meanwhile pass 2 MiB; twenty children's reads finishing together did.
        self._reading = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self.running)

    async def watch(self, child_id: str, child: SubAgentChild) -> None:
        """Keep what ``child`` waits on in view: read it each time the child says it changed.

        The child's ``sub_agent`` signal is a hint (anyone may send it): what it waits on is
        read from the child itself, by the chain this turn started. When what it waits on
        changed (and is not nothing), the turn reports its pause with the child's interrupts
        (each with its path) and every other it waits on, once the message's other calls have
        paused or ended (``report_pause``).
        """
        while True:
            await workflow.wait_condition(lambda: child.hinted)
            try:
                async with self._reading:
                    # Cleared once it is this child's turn to be read: hints that came while
                    # it queued are answered by this one read.
                    child.hinted = False
                    child.reads += 1
                    number = child.reads
                    found = await self._runner.execute(
                        config.SUB_AGENT_PENDING_ACTIVITY,
                        SubAgentPendingInput(
                            chat_id=child_id, run_id=child.run_id, known=child.digest
                        ),
                        result_type=SubAgentPendingResult,
                        start_to_close_timeout=config.SUB_AGENT_START_TO_CLOSE,
                        # A read lost with its worker is retried in seconds, not after a
                        # minute in which the child's new interrupts would not show here.
                        heartbeat_timeout=config.SUB_AGENT_HEARTBEAT,
                        retry_policy=config.SUB_AGENT_RETRY,
                        summary=f"pending of sub-agent {child_id}",
                    )
            except Unsealed:
                child.hinted = True  # not a worker's read (recorded): read it again
                continue
            except ActivityError as e:
                if isinstance(e.cause, CancelledError):
                    raise asyncio.CancelledError() from None  # the call is over: stop watching
                workflow.logger.warning("could not read sub-agent %s: %s", child_id, e)
                continue
            if child.reread is not None and number >= child.reread:
                child.reread = None  # read since the answer took effect: current again
            if found.ended is not None:
                # Closed: a call whose run started the child hears it from the child's result;
                # a re-attached one from this.
                child.ended = found.ended
                return
            if found.unchanged:
                # What it waits on is what was read last: the report changed nothing (or was
                # not the child's), and the result took a few bytes of history.
                continue
            child.digest = found.digest
            if child.link is not None:
                child.link.digest = found.digest  # carried, should this run continue as new
            quiet = child.quiet_digest is not None and found.digest == child.quiet_digest
            child.quiet_digest = None
            requests = [
                r.model_copy(
                    update={
                        "path": [child.ref, *(r.path or [r.ref])],
                        "chat_id": r.chat_id or child_id,
                    }
                )
                for r in found.interrupts
            ]
            if requests == child.requests:
                continue
            child.requests = requests
            child.shown.update(r.ref for r in requests)
            turn = self.s.turn
            if turn is None:
                return
            if requests and not quiet:
                self._report_pause()
            else:
                self._publish()

    def delegated(self) -> list[InterruptRequest]:
        """The interrupts this turn's sub-agents wait on, in call order, with their paths."""
        turn = self.s.turn
        if turn is None or not self.running:
            return []
        by_ref = {c.ref: c for c in self.running.values()}
        shown = [r for call in turn.calls if call.ref in by_ref for r in by_ref[call.ref].requests]
        # As many as one message's own calls at most: 128 sub-agents of 128 pauses each would
        # otherwise put 16,384 entries in the memo (past its 2 MiB) and rebuild them on every
        # child's change, past the workflow task's deadline. The rest wait in their children
        # (answerable there, or here once shown).
        room = max(DOOR.calls_per_message - len(self._book(turn).pending()), 0)
        return shown[:room]

    def delegated_to(self, refs: set[str]) -> tuple[str, SubAgentChild] | None:
        """The one sub-agent whose interrupts ``refs`` all name (None: none).

        Raises:
            ResumeError: a ref names interrupts of several sub-agents, or also one of this
                turn's own: an answer names only a ref, so it could not say which it is for
                (refs are each conversation's own, and models may give the same call ids).
        """
        if not refs:
            return None
        own = {c.ref for c in self._book(self.s.turn).pending()} if self.s.turn else set()
        found = [
            (child_id, child)
            for child_id, child in self.running.items()
            if refs <= {r.ref for r in child.requests}
        ]
        if not found:
            return None
        clash = refs & own or refs & {r.ref for _, c in found[1:] for r in c.requests}
        if clash:
            where = ", ".join(child_id for child_id, _ in found)
            raise ResumeError(
                f"ref {sorted(clash)[0]!r} names interrupts of more than one conversation "
                f"({where}{', and this one' if refs & own else ''}): answer each on its "
                "sub-agent's own chat (the interrupt's chat_id)"
            )
        return found[0]

    def settled_in_child(self, refs: set[str]) -> tuple[str, str] | None:
        """A ref of ``refs`` that a running sub-agent showed here and no longer waits on, and
        that sub-agent's chat id (None: no such ref)."""
        own = {c.ref for c in self._book(self.s.turn).pending()} if self.s.turn else set()
        for child_id, child in self.running.items():
            settled = (refs & child.shown) - {r.ref for r in child.requests} - own
            if settled:
                return sorted(settled)[0], child_id
        return None

    def hint(self, child_id: str) -> bool:
        """A sub-agent said what it waits on changed; False: no running child of that id."""
        child = self.running.get(child_id)
        if child is None:
            return False
        child.hinted = True
        return True

    async def forward(
        self,
        child_id: str,
        child: SubAgentChild,
        resume: JsonObject,
        *,
        via: Literal["update", "signal"],
    ) -> SubAgentResumeResult:
        """Pass an answer given here to the sub-agent it is for, whose rules check it; and
        record it in this conversation's audit trail with the sub-agent's verdict."""
        result = await self._forward(child_id, child, resume)
        audit.forwarded(
            self.s,
            at=workflow.now(),
            chat_id=child_id,
            body=resume,
            via=via,
            refused=result.refused,
            receipts=receipts.issuer_for(self.s),
            child_receipt=result.result.receipt if result.result is not None else None,
        )
        self._publish()  # the record goes to the memo, where the trail is read from
        return result

    async def _forward(
        self, child_id: str, child: SubAgentChild, resume: JsonObject
    ) -> SubAgentResumeResult:
        # While the answer is on its way, and until a read after it took effect, what was read
        # of the child may list what it has answered: its pause is not whole (workflows.pauses).
        child.answering += 1
        try:
            result: SubAgentResumeResult = await self._runner.execute(
                config.SUB_AGENT_RESUME_ACTIVITY,
                SubAgentResumeInput(chat_id=child_id, run_id=child.run_id, resume=resume),
                result_type=SubAgentResumeResult,
                # The child's turn runs on after the answer (its tool, its model): the wait is as
                # long as that, its liveness the heartbeat; a retry asks for the first attempt's
                # update by its id (sub_agent_resume), never giving the answer twice.
                start_to_close_timeout=config.SUB_AGENT_ANSWER_START_TO_CLOSE,
                heartbeat_timeout=config.SUB_AGENT_ANSWER_HEARTBEAT,
                retry_policy=config.SUB_AGENT_ANSWER_RETRY,
                summary=f"answer for sub-agent {child_id}",
            )
        except Unsealed as e:
            # Not a worker's word (recorded): whether the sub-agent took the answer is read
            # from it again.
            child.hinted = True
            child.reread = child.reads + 1
            return SubAgentResumeResult(refused=f"not confirmed: {e.reason}")
        finally:
            child.answering -= 1
        if result.refused is None:
            child.hinted = True  # read what it waits on now
            child.reread = child.reads + 1
        return result


class SubAgentCalls:
    """Runs the calls of ``agent_tool`` tools, each a child conversation.

    Args:
        state: The conversation's state.
        book: The interrupt book of a turn (a call completes or fails there).
        children: What the running children wait on.
        publish: Writes the operator view (a child's interrupts are off it).
        room: Bytes the turn can still take.
        may_detach: Whether the calls under way may be left to the next run: the run should
            continue as new, and nothing else (a tool call, a handler, a cancellation) is
            under way.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        book: Callable[[TurnState], InterruptBook],
        children: Children,
        publish: Callable[[], None],
        room: Callable[[TurnState], int],
        may_detach: Callable[[], bool],
    ) -> None:
        self.s = state
        self._book = book
        self._children = children
        self._publish = publish
        self._room = room
        self._may_detach = may_detach
        # Sub-agent calls of the batch under way not yet started (see _tree_share).
        self.batch = 0
        # A sub-agent call was left to the next run (the turn then continues as new).
        self.detached = False

    async def run(self, call: CallState, ref: SubAgentRef, *, run: int) -> None:
        """Run a call of an ``agent_tool``: a conversation with ``agent`` as a child workflow.

        The child's id is the caller's chat id and the call's ref (and the run, past the
        first), so it is found from either; its first message is the model's ``input``; its
        interrupts wait in the child (its own rules, history and audit trail) while this call
        runs. Its final text is the call's output; with an output schema, the JSON object its
        final text holds (an answer that does not fit is the model's to hear: the call's
        output says why, and the model may ask again). A child that fails, is cancelled on its own
        or stops at its turn limit fails the call classified (``TOOL_ERROR``); cancelling this
        turn cancels the child (Temporal asks the child to cancel, and waits for it).
        """
        turn = self.s.turn
        assert turn is not None
        book = self._book(turn)
        agent = ref.agent
        # This call and the batch's sub-agent calls after it (gather starts them in order,
        # each running to here before the next).
        batch, self.batch = max(self.batch, 1), max(self.batch - 1, 0)
        task = call.args.get("input")
        if not isinstance(task, str) or not task.strip():
            book.complete(
                call,
                {"error": "invalid arguments: 'input' is the sub-agent's task, a non-empty string"},
            )
            return
        depth = self.s.depth + 1
        if depth > config.MAX_AGENT_DEPTH:
            book.fail(
                call,
                ErrorInfo(
                    status=Status.FAILED_PRECONDITION,
                    message=(
                        f"sub-agent {agent!r} not called: sub-agents nest at most "
                        f"{config.MAX_AGENT_DEPTH} deep"
                    ),
                    kind=ErrorKind.TOOL_ERROR,
                ),
                uncertain=False,
            )
            return
        if turn.sub_agents >= config.MAX_SUB_AGENTS_PER_TURN:
            # The model's to hear (as an unknown tool is), and the turn goes on with the
            # calls that did start.
            book.complete(
                call,
                {
                    "error": f"sub-agent {agent!r} not called: a turn calls at most "
                    f"{config.MAX_SUB_AGENTS_PER_TURN} sub-agents"
                },
            )
            return
        share = self._tree_share(turn, batch=batch)
        if share is None:
            book.complete(
                call,
                {
                    "error": f"sub-agent {agent!r} not called: one message starts at most "
                    f"{config.MAX_SUB_AGENTS_PER_TREE} sub-agents in all, however deep, and "
                    "this one's are spent"
                },
            )
            return
        turn.sub_agents += 1
        child_id = sub_agent_id(workflow.info().workflow_id, call.ref, run)
        try:
            handle = await workflow.start_child_workflow(
                config.WORKFLOW_TYPE,
                ConversationInput(
                    agent=agent,
                    task=with_output_request(task, ref.output_schema),
                    depth=depth,
                    budget=share,
                ),
                id=child_id,
                result_type=ConversationResult,
                static_summary=f"sub-agent {agent} for {call.name}",
                # Not ended with this run: a caller waiting on it may continue as new (see
                # wait), and cancels it itself when its turn is cancelled.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            # Someone else's workflow runs under the id (started first, by anyone who may
            # start workflows): it is not this call's child, and the conversation lives on.
            book.fail(
                call,
                ErrorInfo(
                    status=Status.ALREADY_EXISTS,
                    message=(
                        f"sub-agent {agent!r} not started: a workflow this conversation did "
                        f"not start already runs under its id {child_id!r}"
                    ),
                    kind=ErrorKind.TOOL_ERROR,
                ),
                uncertain=False,
            )
            return
        call.child = SubAgentLink(chat_id=child_id, run_id=handle.first_execution_run_id or "")
        await self.wait(call, ref, handle)

    async def wait(
        self,
        call: CallState,
        ref: SubAgentRef,
        handle: workflow.ChildWorkflowHandle[Any, ConversationResult] | None,
    ) -> None:
        """Wait for the child conversation ``call.child`` names, and complete the call with
        its outcome; or leave the call as it is for the next run (``self.detached``) when this
        run should continue as new and nothing but sub-agents is under way.

        ``handle``: the child this run started; None in a run that continued as new while the
        call waited (the child is no child of this run's): then its outcome is read from it
        (``sub_agent_pending``) when it reports, and every ``config.SUB_AGENT_RECHECK`` in case
        a report crossed the continue-as-new. Cancelling the turn cancels the child either way.
        """
        turn = self.s.turn
        assert turn is not None and call.child is not None
        book = self._book(turn)
        agent = ref.agent
        link = call.child
        child_id = link.chat_id
        attached = handle is None
        child = SubAgentChild(
            ref=call.ref,
            run_id=link.run_id,
            link=link,
            # Re-attached: read at once, the whole list (its digest says whether it changed
            # since the last run read it).
            hinted=attached,
            quiet_digest=link.digest if attached else None,
        )
        self._children.running[child_id] = child
        watch = asyncio.create_task(self._children.watch(child_id, child))
        detached = evicted = False

        def over() -> bool:
            return handle.done() if handle is not None else child.ended is not None

        try:
            while True:
                try:
                    await workflow.wait_condition(
                        lambda: over() or self._may_detach(),
                        timeout=config.SUB_AGENT_RECHECK if attached else None,
                        timeout_summary="sub-agent recheck" if attached else None,
                    )
                except TimeoutError:
                    child.hinted = True  # a report may have crossed the continue-as-new
                    continue
                except asyncio.CancelledError:
                    await self._cancel_child(child_id, handle)
                    raise
                break
            if not over():
                detached = self.detached = True
                return
            if handle is not None:
                result = handle.result()
            else:
                assert child.ended is not None
                if child.ended.result is None:
                    self._child_failed(call, agent, child_id, how=child.ended.status)
                    return
                result = child.ended.result
        except ChildWorkflowError as e:
            # The child failed, was terminated, or was cancelled on its own (an operator, a
            # script): the call fails classified, and this conversation lives on.
            cancelled = isinstance(e.cause, CancelledError)
            self._child_failed(call, agent, child_id, how="cancelled" if cancelled else "failed")
            return
        except GeneratorExit:
            evicted = True  # the run leaves this worker's cache: no workflow calls now
            raise
        finally:
            watch.cancel()
            if not detached:
                gone = self._children.running.pop(child_id, None)
                if gone is not None and gone.requests and self.s.turn is not None and not evicted:
                    self._publish()  # its interrupts are off the operator view
        if result.last_receipt is not None:
            audit.sub_agent_ended(
                self.s,
                at=workflow.now(),
                ref=call.ref,
                name=call.name,
                chat_id=child_id,
                last_receipt=result.last_receipt,
                receipts=receipts.issuer_for(self.s),
            )
        last = result.last_turn
        if last is not None and last.finish_reason == FinishReason.STOP:
            output: JsonObject = {"text": last.text, "chat_id": child_id}
            if ref.output_schema is not None:
                output = structured_output(last.text, ref.output_schema, chat_id=child_id)
            if json_size(output) > self._room(turn):
                # As a tool's output (see _run_tool): the child has answered, the model must
                # hear that in a few bytes, and the turn stays within its budget.
                output = {
                    "error": "output too large for this turn",
                    "detail": f"{over_turn_budget('the output')}; it was dropped",
                    "chat_id": child_id,
                }
            book.complete(call, output)
            return
        reason = last.finish_reason.value if last is not None else "no turn"
        detail = f": {last.error.message}" if last is not None and last.error else ""
        book.fail(
            call,
            ErrorInfo(
                status=last.error.status if last is not None and last.error else Status.ABORTED,
                message=cut_stored(
                    f"sub-agent {agent!r} ({child_id}) ended {reason}{detail}", DOOR.note
                ),
                kind=ErrorKind.TOOL_ERROR,
            ),
            uncertain=False,
        )

    def _child_failed(self, call: CallState, agent: str, child_id: str, *, how: str) -> None:
        """Fail a sub-agent call whose child did not complete (failed, terminated, cancelled
        on its own, timed out or gone): classified, and this conversation lives on."""
        turn = self.s.turn
        assert turn is not None
        cancelled = how == "cancelled"
        said = {"failed": "failed", "cancelled": "was cancelled", "gone": "is gone"}
        self._book(turn).fail(
            call,
            ErrorInfo(
                status=Status.CANCELLED if cancelled else Status.INTERNAL,
                message=f"sub-agent {agent!r} ({child_id}) {said.get(how, how.replace('_', ' '))}",
                kind=ErrorKind.TOOL_ERROR,
            ),
            uncertain=True,
        )

    async def _cancel_child(
        self, child_id: str, handle: workflow.ChildWorkflowHandle[Any, Any] | None
    ) -> None:
        """The turn is being cancelled: so is the child, and the turn waits for it to stop
        (a child this run started), or asks it to (one a previous run started)."""
        if handle is not None:
            handle.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChildWorkflowError):
                await handle
            return
        try:
            await workflow.get_external_workflow_handle(child_id).cancel()
        except Exception as e:  # noqa: BLE001  # closed already, or gone: nothing to cancel
            workflow.logger.info("could not cancel sub-agent %s: %s", child_id, type(e).__name__)

    def _tree_share(self, turn: TurnState, *, batch: int) -> int | None:
        """Debit one sub-agent from the turn's budget (config.MAX_SUB_AGENTS_PER_TREE, or the
        share this conversation was started with) and return the share its child gets for its
        own sub-agents; None: the budget is spent, and the call is not made.

        The ``batch`` calls still to start in this step (this one included) get equal shares,
        and as much again is kept for the turn's later steps: one child each and their shares
        never exceed what is left, so the tree holds no more than the root's budget.
        """
        whole = self.s.tree_budget
        left = turn.tree_left
        if left is None:
            left = config.MAX_SUB_AGENTS_PER_TREE if whole is None else whole
        if left < 1:
            return None
        share = max(0, (left - batch) // (batch + 1))
        turn.tree_left = left - 1 - share
        return share


@dataclass
class SubAgentChild:
    """A sub-agent's conversation one of this turn's calls is running."""

    ref: str
    run_id: str
    # The call's record of it (carried by continue-as-new): its digest is kept current there.
    link: SubAgentLink | None = None
    # The child said what it waits on changed, and it has not been read since.
    hinted: bool = False
    # Re-attached after continue-as-new: the digest the last run read. A first read that finds
    # it is no change (that run reported the pause already), only this run's view of it.
    quiet_digest: str | None = None
    # How the child closed, once a read found it closed.
    ended: SubAgentEnd | None = None
    # What it waits on, as last read, each with its path from this conversation; and the
    # digest of that read (SubAgentPendingInput.known), so a read that finds it unchanged
    # answers in a few bytes.
    requests: list[InterruptRequest] = field(default_factory=list)
    digest: str | None = None
    # Answers on their way to it, and the number of the read that makes what was read of it
    # current again after one took effect (None: it is); reads started so far.
    answering: int = 0
    reread: int | None = None
    reads: int = 0
    # Every ref it has shown here while it runs: an answer for one it no longer waits on is
    # refused as settled there (answered, or withdrawn), not as a ref this conversation never
    # had; and refused here, so that an update's refusal stays out of history.
    shown: set[str] = field(default_factory=set)


OUTPUT_REQUEST = (
    "\n\nAnswer with only a JSON object, no other text, that matches this JSON Schema:\n"
)


def with_output_request(task: str, schema: JsonObject | None) -> str:
    """A sub-agent's first message: the caller's task and, for an ``agent_tool(output=...)``,
    the schema its answer must fit (in words: it works with every model, tools or not)."""
    if schema is None:
        return task
    return task + OUTPUT_REQUEST + json.dumps(schema, sort_keys=True, separators=(",", ":"))


def _unfenced(body: str) -> str:
    """``body`` without a Markdown fence around it (```` ``` ```` or ```` ```json ````, each
    on a line of its own), as models often give JSON although told not to.

    String operations, not a pattern: one with ``\\s*\\n(.*)\\n```$`` backtracks
    quadratically on an opening fence and many whitespace characters (a model's 40 KB took
    seconds, past the SDK's deadlock timeout: the caller's workflow task failed, each retry).
    """
    if not (body.startswith("```") and body.endswith("```")):
        return body
    line_end = body.find("\n")
    opener = body[3:line_end] if line_end >= 0 else ""
    opener = opener.removeprefix("json")
    inner = body[line_end + 1 : -3]
    if line_end < 0 or opener.strip() or not inner.endswith("\n"):
        return body
    return inner.strip()


def structured_output(text: str, schema: JsonObject, *, chat_id: str) -> JsonObject:
    """The call's output for a sub-agent's final ``text`` that must fit ``schema``:
    ``{"output": the object, "chat_id"}``, or ``{"error", "text", "chat_id"}`` saying why it
    does not (the model reads it, and may ask the sub-agent again)."""
    body = text.strip()
    body = _unfenced(body)
    try:
        # The model's text, decoded as a payload is: no nesting or text that could not be
        # stored (or would exhaust the stack) reaches the call's output.
        value = decode_json(body.encode("utf-8", "surrogatepass"))
        check_json(value, what="the answer")
    except Refused as e:
        problem: str | None = e.reason
    else:
        if not isinstance(value, dict):
            problem = "it is not a JSON object"
        else:
            problem = schema_error(value, schema)
        if problem is None:
            return {"output": value, "chat_id": chat_id}
    return {
        "error": f"the sub-agent's answer does not fit the output schema: {problem}",
        "text": text,
        "chat_id": chat_id,
    }


def refused_early(
    body: JsonObject, requests: list[InterruptRequest]
) -> tuple[str, RefusalCode] | None:
    """Why the sub-agent would refuse an answer meant for its ``requests``, and the kind of
    refusal it would give, when the caller can tell from what the child shows (None: only the
    child can decide).

    The child decides every answer; this only keeps what it would surely refuse out of the
    caller's history (an answer passed on is an activity there, and refused ones would
    otherwise grow it). Only rules the shown request states in full: the tool's name, the
    input's digest, and an approver list without groups, for an identity asserted without a
    token (a token is the child's to verify).
    """
    by_ref = {r.ref: r for r in requests}
    token = body.get("identity_token")
    identity = body.get("identity")
    entries = [*(body.get("respond") or []), *(body.get("restart") or [])]
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        request = by_ref.get(str(entry.get("ref")))
        if request is None:
            return None
        name, digest = entry.get("name"), entry.get("input_digest")
        if name != request.name:
            return (
                f"ref {request.ref!r} is an interrupt of {request.name!r}, not {name!r} "
                f"(sub-agent {request.chat_id})",
                "invalid",
            )
        if digest and request.input_digest and digest != request.input_digest:
            return (
                f"the answer for ref {request.ref!r} names another input than the one pending "
                f"(sub-agent {request.chat_id}): read pending again",
                "conflict",
            )
        allowed = request.approvers
        if (
            token is None
            and allowed
            and not request.approvers_omitted
            and not any(a.startswith("group:") for a in allowed)
            and identity not in allowed
        ):
            return (
                f"{identity!r} may not answer {request.name!r} (ref {request.ref}) in sub-agent "
                f"{request.chat_id}: its approvers are {', '.join(allowed)}",
                "forbidden",
            )
    return None

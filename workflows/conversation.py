"""``AgentWorkflow``: one conversation with one agent; the workflow id is the chat id.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

This module is the conversation's run loop, and where Temporal finds its handlers; the rooms
behind it are:

- :mod:`workflows.turn`: the turn state machine, which emits turn events (:mod:`workflows.events`),
  and its parts: the model step, the tool step, agents as tools and the wait for answers
  (:mod:`workflows.model_step`, :mod:`workflows.tool_step`, :mod:`workflows.subagents`,
  :mod:`workflows.waits`), with every activity's result taken sealed (:mod:`workflows.executing`);
- :mod:`workflows.door`, :mod:`workflows.signals`, :mod:`workflows.updates` and
  :mod:`workflows.queries`: what the handlers check and do;
- :mod:`workflows.interrupts`: the interrupt book, every change of a call's status and the one
  way a resume gets in;
- :mod:`workflows.payloads` and :mod:`workflows.limits`: raw payloads decoded and checked at the
  door, results fitted to Temporal's limits;
- :mod:`workflows.audit`, :mod:`workflows.operator_view` and :mod:`workflows.stream`: projections
  (the answer and rejection logs; search attributes, memo and the UI's details panel; the event
  stream clients follow);
- :mod:`workflows.telemetry`: the product's metrics and trace spans, which issue no commands.

Determinism and replay contract:

- The conversation is plain data (:class:`~workflows.state.ConversationState`). The agent's
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
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from temporal_agent_interrupts.workflows import audit, config, operator_view
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentReport,
)
from temporal_agent_interrupts.workflows.door import Door, Handling
from temporal_agent_interrupts.workflows.history import carry
from temporal_agent_interrupts.workflows.ids import idempotency_key
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    OUT,
    RUN,
)
from temporal_agent_interrupts.workflows.operator_view import OperatorView
from temporal_agent_interrupts.workflows.payloads import (
    ENCRYPTED,
    NO_START,
    RawResume,
    RawStart,
    continued_here,
    fit,
    read_start,
)
from temporal_agent_interrupts.workflows.queries import Queries
from temporal_agent_interrupts.workflows.signals import Signals
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
    ConversationState,
)
from temporal_agent_interrupts.workflows.stream import ConversationStream
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    HISTORY_IDENTITY,
    CancelInput,
    ConversationResult,
    GrantsResult,
    HistoryInput,
    HistoryResult,
    MCPListingResult,
    MessagesInput,
    MessagesResult,
    PendingResult,
    PolicyReviewResult,
    RejectionsResult,
    RevokeGrantInput,
    SendInput,
    StatusResult,
    TurnResult,
)
from temporal_agent_interrupts.workflows.updates import Updates

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
            signals_taken=lambda: self._h.signals,
            due=self._due,
        )
        # What this run's handlers have under way, the checks they share, and the handlers.
        self._h = Handling()
        self._door = Door(self._s, machine=self._m, handling=self._h)
        self._signals = Signals(
            self._s,
            machine=self._m,
            door=self._door,
            handling=self._h,
            stream=self._stream,
            publish=self._publish,
            keep=self._keep,
        )
        self._updates = Updates(
            self._s, machine=self._m, door=self._door, handling=self._h, result=self._result
        )
        # Reports to a caller and answers passed on to a sub-agent, under way (see _keep).
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._queries = Queries(self._s, machine=self._m, carried=self._state_for_next_run)
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
            self._signals.reject(handler="start", reason=refusal, payload=[input], via="start")
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
            problem = self._door.send_problem(self._task, agent=None, size=len(self._task.encode()))
            if problem:
                self._signals.reject(handler="start", reason=problem, payload=[input], via="start")
                self._s.closed = True
            else:
                self._m.start(self._task)
        self._publish()
        # Grants with an ``until`` end on a durable timer (no timer while none has one).
        self._keep(asyncio.create_task(self._m.rules.grant_timer()))
        try:
            while True:
                await workflow.wait_condition(
                    lambda: self._s.turn is not None or self._s.closed or self._can_now()
                )
                if self._s.turn is not None:
                    self._h.turn_task = asyncio.create_task(self._m.drive())
                    guard = asyncio.create_task(self._guard_history())
                    try:
                        outcome = await self._h.turn_task
                    finally:
                        guard.cancel()
                    self._h.turn_task = None
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
                await workflow.wait_condition(lambda: not self._h.busy)
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
                last_receipt=self._s.receipt_head.last if self._s.receipt_head else None,
            ),
            # A sub-agent's result is its caller's tool output: the budget of one (the
            # caller's turn measures it again), not of an update's result, which would cut
            # any answer past 48 KiB to a placeholder.
            DOOR.tool_output if self._s.one_turn else OUT.update_result,
        )

    def _can_now(self) -> bool:
        # Not while a handler of ours is at work; the stream's followers are released when the
        # run continues as new.
        if self._m.can_blocked or self._h.busy or self._m.notifying or self._h.forwarding:
            return False
        return self._due()

    def _due(self) -> bool:
        """Whether this run is due to continue as new, whatever holds it now."""
        if self._h.signals >= RUN.can_signals:
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
            self._updates.stop_turn(
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

    # ------------------------------------------------------------------------------------------
    # Updates: declared here, where Temporal finds them, and done in workflows.updates (what
    # each does) and workflows.door (the checks a request passes, by update or by signal).

    @workflow.update
    async def send(self, input: SendInput) -> TurnResult:
        """Start a turn with a user message; returns when the turn ends or pauses."""
        return await self._updates.send(input)

    @send.validator
    def validate_send(self, input: SendInput) -> None:
        self._updates.validate_send(input)

    @workflow.update
    async def resume(self, payload: RawResume) -> TurnResult:
        """Answer pending interrupts; returns when the turn ends or pauses again.

        ``payload`` is a :class:`~workflows.types.ResumeInput`, taken raw
        (:data:`~workflows.payloads.RawResume`) so that this workflow, not the data converter,
        decides what is wrong with a bad one and says so. A resume that leaves interrupts
        unanswered returns at once, listing those still pending.
        """
        return await self._updates.resume(payload)

    @resume.validator
    def validate_resume(self, payload: RawResume) -> None:
        self._updates.validate_resume(payload)

    @workflow.update
    async def cancel(self, input: CancelInput) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn); ends it ``cancelled``."""
        return await self._updates.cancel(input)

    @cancel.validator
    def validate_cancel(self, input: CancelInput) -> None:
        self._updates.validate_cancel(input)

    @workflow.update
    async def review_policy(self) -> PolicyReviewResult:
        """Decide the paused calls again with the policy set the worker holds now
        (``Chat.review_policy``, ``agentctl review-policy``): released, refused or re-asked."""
        return await self._updates.review_policy()

    @review_policy.validator
    def validate_review_policy(self) -> None:
        self._updates.validate_review_policy()

    @workflow.update
    def revoke_grant(self, input: RevokeGrantInput) -> GrantsResult:
        """End a grant now (``Chat.revoke_grant``, ``agentctl revoke-grant``); returns the grants
        still in force."""
        return self._updates.revoke_grant(input)

    @revoke_grant.validator
    def validate_revoke_grant(self, input: RevokeGrantInput) -> None:
        self._updates.validate_revoke_grant(input)

    @workflow.update
    async def await_turn(self) -> TurnResult | None:
        """The latest turn's result, once the current turn (if any) has paused or ended."""
        return await self._updates.await_turn()

    @await_turn.validator
    def validate_await_turn(self) -> None:
        self._updates.validate_await_turn()

    @workflow.update
    async def close(self, input: CancelInput) -> ConversationResult:
        """End the conversation: withdraw anything pending and complete the workflow."""
        return await self._updates.close(input)

    @close.validator
    def validate_close(self, input: CancelInput) -> None:
        self._updates.validate_close(input)

    # ------------------------------------------------------------------------------------------
    # Signals: every signal name lands here with raw payloads (workflows.signals), so a
    # malformed one (bad JSON, wrong types, zero or two arguments) is recorded instead of
    # failing the workflow task.

    @workflow.signal(dynamic=True)
    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._signals.take(name, args)

    # ------------------------------------------------------------------------------------------
    # Queries: declared here, where Temporal finds them; built in workflows.queries.

    @workflow.query
    def pending(self) -> PendingResult:
        return self._queries.pending()

    @workflow.query
    def grants(self) -> GrantsResult:
        """The grants in force: remembered decisions that let matching calls run unasked."""
        return GrantsResult(grants=list(self._s.grants))

    @workflow.query
    def status(self) -> StatusResult:
        return self._queries.status()

    @workflow.query
    def history(self, input: HistoryInput | None = None) -> HistoryResult:
        """The conversation's messages, newest last, and its audit log of answers."""
        return self._queries.history(input)

    @workflow.query
    def messages(self, input: MessagesInput) -> MessagesResult:
        """A slice of the conversation; the model activity asks when it lacks the start."""
        return self._queries.messages(input)

    @workflow.query
    def mcp_listing(self) -> MCPListingResult:
        """The MCP servers' tools in the recorded definition (activities.mcp asks)."""
        return self._queries.mcp_listing()

    @workflow.query
    def rejections(self) -> RejectionsResult:
        return self._queries.rejections()

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
            namespace=workflow.info().namespace,
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

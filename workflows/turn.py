"""The turn state machine: a user message in, model calls and tool runs, pauses, a result out.

One :class:`TurnMachine` per workflow run drives the conversation's current turn over
:class:`~workflows.types.ConversationState`, which is plain data. Every change it makes to the
turn is a transition that emits a turn event (:mod:`workflows.events`): the model's text, its
tool requests, interrupts, answers, tool responses and the turn's end. The interrupt book
(:mod:`workflows.interrupts`) makes every change to a call's status; this module decides when.
What the events add up to is projected elsewhere: the audit log (:mod:`workflows.audit`) here,
as each is emitted; the operator view (:mod:`workflows.operator_view`) when the workflow
publishes.

Determinism: this module runs in the workflow. Ids come from the model's call ids or
``workflow.uuid4()``, time from ``workflow.now()``; the agent's definition is data from the model
activity's result, so replay never runs the agent's current code. A failed turn (model, tool,
bad input) ends ``failed`` and keeps what happened in the conversation; the workflow itself never
fails because of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    ServerError,
    TimeoutType,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from temporal_agent_interrupts.workflows import audit, config, events
from temporal_agent_interrupts.workflows.answers import SchemaBudget
from temporal_agent_interrupts.workflows.history import Digests
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, ResumeError, schema_error
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    HELD,
    OUT,
    RUN,
    KiB,
    RefusalCode,
    Refused,
    check_json,
    cut_stored,
    decode_json,
    human_size,
    json_size,
    names_within,
    omitted,
    shrink,
    stored_size,
)
from temporal_agent_interrupts.workflows.seal import (
    Binding,
    failure_body,
    result_body,
    split_details,
    workflow_keys,
)
from temporal_agent_interrupts.workflows.seal import (
    activity_id as sealed_activity_id,
)
from temporal_agent_interrupts.workflows.telemetry import Telemetry
from temporal_agent_interrupts.workflows.types import (
    DEADLINE_IDENTITY,
    ActivityEndingInput,
    ActivityEndingResult,
    CallState,
    CancelInput,
    ConversationInput,
    ConversationResult,
    ConversationState,
    ErrorInfo,
    ErrorKind,
    FinishReason,
    FunctionResponse,
    InterruptRequest,
    JsonObject,
    MCPCallInput,
    Message,
    ModelInput,
    ModelResult,
    Notice,
    Part,
    ResumeInput,
    SentMessage,
    Status,
    SubAgentEnd,
    SubAgentLink,
    SubAgentPendingInput,
    SubAgentPendingResult,
    SubAgentRef,
    SubAgentResumeInput,
    SubAgentResumeResult,
    ToolInput,
    ToolResult,
    ToolSpec,
    TurnEvent,
    TurnResult,
    TurnState,
)

Outcome = Literal["done", "continue_as_new"]


class _TurnFailed(Exception):
    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class _Unsealed(Exception):
    """An activity's result or failure that no worker sealed (``workflows.seal``): not taken.
    Recorded as a rejection where it is raised."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TurnMachine:
    """Drives the conversation's turns; the workflow's handlers start, answer and cancel them.

    Args:
        state: The conversation's state (shared with the workflow, mutated in place).
        publish: Writes the operator view; called at the fixed points where a run writes it
            (each write is a command in history, so the points may not move).
        can_now: Whether the run should continue as new now (a paused turn waits there).
        publish_event: Puts a turn event on the conversation's stream; returns its offset.
        signals_taken: How many signals this run has taken (a streaming call's share of the
            run's publish signals is what is left of ``RUN.stream_signals``).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        publish: Callable[[], None],
        can_now: Callable[[], bool],
        publish_event: Callable[[TurnEvent], int] | None = None,
        signals_taken: Callable[[], int] = lambda: 0,
    ) -> None:
        self.s = state
        self._publish_event = publish_event
        self._publish = publish
        self._can_now = can_now
        self._signals_taken = signals_taken
        # Refs in the order they were made (the newest are carried by continue-as-new).
        self.ref_order: list[str] = list(state.refs)
        self.refs: set[str] = set(state.refs)
        # Derived from the messages (not state): recomputed after continue-as-new or replay.
        self.digests = Digests()
        # Every time a turn reaches a stop point (paused or ended) this goes up by one; update
        # handlers wait on it to return the turn's result.
        self.stops = 0
        # A cancellation asked for and not yet carried out, and how it came: a caller's, or a
        # deadline whose policy cancels the turn.
        self.cancel: CancelInput | None = None
        self._cancel_via: Literal["cancel", "deadline"] = "cancel"
        # Notifying tools under way (reminders, escalations); best effort, never awaited.
        self._notifying: set[asyncio.Task[None]] = set()
        # Set when this run's state proved too large to carry over; cleared when a turn ends.
        self.can_blocked = False
        # Tool calls (not sub-agents) under way; and whether a sub-agent call was left to the
        # next run (the turn then continues as new; see _wait_sub_agent).
        self._tools_running = 0
        self.detached = False
        # The text published on the stream during the model call under way, by attempt (the
        # workflow publishes whatever of the reply did not get there).
        self.streamed: dict[int, str] = {}
        # The streaming model call's own publisher id (ModelInput.stream_key): only its
        # publishes reach the stream (workflows.stream). None: no call is streaming.
        self.stream_key: str | None = None
        # Metrics and spans: they issue no commands, so they may be called anywhere.
        self.telemetry = Telemetry(state.agent, spec=lambda: self.s.spec)
        # The current turn's interrupt book (see book()).
        self._book: InterruptBook | None = None
        # The sub-agents this turn's calls are running (agent_tool), by child chat id: not
        # state, since a turn with a call running never continues as new.
        self.children: dict[str, SubAgentChild] = {}
        # Activities this run scheduled through _execute, for their ids (workflows.seal).
        self._activities = 0
        # Sub-agent calls of the batch under way not yet started (see _tree_share).
        self._agent_batch = 0
        # One sub-agent pending read at a time: each result may be as large as a query's
        # (1.75 MiB), and the server force-fails a workflow task in flight once the events
        # buffered meanwhile pass 2 MiB; twenty children's reads finishing together did.
        self._reading = asyncio.Lock()

    # ------------------------------------------------------------------------------------------
    # Events

    def emit(self, event: TurnEvent, *, publish: bool = True) -> TurnEvent:
        """Record a turn event, publish it on the stream and fold it into the projections.

        Args:
            publish: False when the event is on the stream already (text the model activity
                published as it arrived).
        """
        result = event.result
        turn = self.s.turn
        number = result.turn if result is not None else turn.turn if turn else self.s.turns
        at = workflow.now()
        offset = None
        if publish and self._publish_event is not None:
            offset = self._publish_event(event.model_copy(update={"turn": number, "at": at}))
        elif self.s.events_total:
            offset = self.s.events_total - 1  # the last item on the stream, published already
        stamped = events.record(self.s, event, turn=number, at=at, offset=offset)
        audit.apply(self.s, stamped)
        self.telemetry.event(stamped, turn.calls if turn else [])
        return stamped

    @property
    def notifying(self) -> bool:
        """Whether a notifying tool is under way (the run waits for it before continuing as
        new, or its notice would be lost)."""
        return bool(self._notifying)

    def book(self, turn: TurnState) -> InterruptBook:
        """The interrupt book of ``turn``'s calls, built once per turn.

        Rebuilt only when the calls are another list: a new turn, or a turn a new run took
        over. The book reads the spec and the spent tokens from the state whenever it asks
        (a model result may bring a new spec mid-turn), and ``self.refs`` is one set for the
        run, so nothing else it holds can go stale.
        """
        book = self._book
        if book is None or book.calls is not turn.calls:
            book = InterruptBook.of_turn(
                self.s, turn.calls, known_refs=self.refs, emit=self.emit, chats=answer_chats
            )
            self._book = book
        return book

    # ------------------------------------------------------------------------------------------
    # What the handlers ask

    def paused(self) -> bool:
        """Whether the turn waits on a human: some interrupt has no answer yet."""
        turn = self.s.turn
        return turn is not None and turn.phase == "tools" and bool(self.book(turn).pending())

    def waiting_on_human(self) -> bool:
        """Paused, and nothing else to do: no sibling call is still running.

        Interrupts are recorded before their siblings run, so a turn can have pending
        interrupts while tools are still at work; its pause is only reported after them.
        """
        turn = self.s.turn
        if turn is None:
            return self.paused()
        return self.paused() and not any(c.status == "ready" for c in turn.calls)

    def room(self, turn: TurnState) -> int:
        """Bytes the turn can still take (see :data:`~workflows.limits.HELD.turn`)."""
        return HELD.turn - self._turn_held(turn)

    def paused_result(self, turn: TurnState) -> TurnResult:
        return TurnResult(
            turn=turn.turn,
            finish_reason=FinishReason.INTERRUPTED,
            text=self._turn_text(turn),
            interrupts=[*self.book(turn).requests(), *self.delegated()],
        )

    def last_result(self) -> TurnResult | None:
        """The latest turn's result: while paused, the pause as it stands now (a new run does
        not carry it, see workflows.history.carry)."""
        turn = self.s.turn
        if turn is not None and (self.paused() or self.delegated()):
            return self.paused_result(turn)
        return self.s.last_turn

    # ------------------------------------------------------------------------------------------
    # What the handlers do

    def start(self, text: str, *, stream: bool = False, message_id: str | None = None) -> None:
        """Begin a turn with a user message (checked by the handler).

        Args:
            stream: Publish the model's text as it arrives, not only once each reply is in.
            message_id: The caller's id for the message, remembered so that the same message
                sent again joins this turn instead of starting another.
        """
        self.s.turns += 1
        if message_id is not None:
            sent = [m for m in self.s.sent if m.message_id != message_id]
            sent.append(
                SentMessage(message_id=message_id, turn=self.s.turns, digest=message_digest(text))
            )
            self.s.sent = sent[-HELD.sent_kept :]
        self.s.turn = TurnState(
            turn=self.s.turns,
            started_at=workflow.now(),
            base_len=len(self.s.messages),
            held=0,
            stream=stream,
        )
        self._append(Message(role="user", parts=[Part(text=text)]))
        self.telemetry.turn_started(self.s.turns)
        self._publish()

    def resume(self, resume: ResumeInput, *, via: Literal["update", "signal"]) -> TurnState:
        """Apply a validated resume to the paused turn."""
        turn = self.s.turn
        assert turn is not None
        self.book(turn).resume(resume, via=via, now=workflow.now())
        turn.stream = turn.stream or resume.stream
        self._publish()
        return turn

    def streaming(self) -> bool:
        """Whether a model call is under way whose text is published as it arrives."""
        turn = self.s.turn
        return turn is not None and turn.stream and turn.phase == "model"

    def streaming_key(self) -> str | None:
        """The publisher id the streaming model call publishes with (None: none streams)."""
        return self.stream_key if self.streaming() else None

    def spend_refused(self, token: str | None) -> None:
        """Spend the identity token of an answer refused after it reached history, if it could
        answer something here (see ``InterruptBook.spend_refused``)."""
        book = InterruptBook([], spec=self.s.spec, spent=self.s.spent_tokens)
        book.spend_refused(token, now=workflow.now())

    # ------------------------------------------------------------------------------------------
    # The machine

    async def drive(self) -> Outcome:
        turn = self.s.turn
        assert turn is not None
        try:
            while True:
                if self.cancel is not None:
                    # A cancel that arrived before this step could be interrupted (e.g. in the
                    # same workflow task as the send that started the turn).
                    self.finish_cancelled()
                    return "done"
                if turn.phase == "model":
                    if turn.model_calls >= self._max_turns():
                        self._finish(FinishReason.MAX_TURNS)
                        return "done"
                    message = await self._call_model(turn)
                    calls = [p.function_call for p in message.parts if p.function_call]
                    if not calls:
                        self._finish(FinishReason.STOP)
                        return "done"
                    self.book(turn).request(
                        [
                            CallState(
                                ref=self._new_ref(fc.id), call_id=fc.id, name=fc.name, args=fc.args
                            )
                            for fc in calls
                        ]
                    )
                    turn.phase = "tools"
                newly_paused = await self._run_ready(turn)
                if self.detached:
                    # Sub-agent calls wait on their children from the next run.
                    self.detached = False
                    if newly_paused:
                        self._stop(self.paused_result(turn))
                    return "continue_as_new"
                book = self.book(turn)
                error = book.first_error()
                if error is not None:
                    self._fail(error)
                    return "done"
                if book.waiting():
                    # Report a pause once. A turn that resumes here after continue-as-new was
                    # already reported paused, and an answer may have reached the new run
                    # before this line: a second report would answer that resume with a stale
                    # "interrupted".
                    if newly_paused:
                        self._stop(self.paused_result(turn))
                    outcome = await self._await_answers(turn)
                    if outcome == "cancel":
                        self.finish_cancelled()
                        return "done"
                    if outcome == "continue_as_new":
                        return outcome
                    book.settle()
                    continue
                self._append(self._tool_message(turn))
                book.clear()
                turn.phase = "model"
        except _TurnFailed as f:
            self._fail(f.error)
            return "done"
        except asyncio.CancelledError:
            if self.cancel is None:
                raise  # the workflow is being cancelled, not just this turn
            self.finish_cancelled()
            return "done"

    def _max_turns(self) -> int:
        return self.s.spec.max_turns if self.s.spec else 10

    def _new_ref(self, call_id: str | None) -> str:
        usable = bool(call_id) and call_id not in self.refs
        if usable:
            # Once old refs are forgotten, a model's id might repeat one; a fresh uuid cannot.
            small = stored_size(call_id or "") <= DOOR.ref
            usable = small and not self.s.refs_forgotten
        ref = call_id if usable and call_id else str(workflow.uuid4())
        self.refs.add(ref)
        self.ref_order.append(ref)
        return ref

    def _append(self, message: Message) -> None:
        """Add a message to the conversation, counting it against the turn's budget."""
        self.s.messages.append(message)
        turn = self.s.turn
        if turn is not None:
            turn.held += json_size(message)

    def _turn_held(self, turn: TurnState) -> int:
        """Bytes the turn holds in the conversation's state: its messages and its calls."""
        return turn.held + self.book(turn).held_bytes()

    async def _call_model(self, turn: TurnState) -> Message:
        spec = self.s.spec
        messages = self.s.messages
        # Only what the model side has not seen goes into history; see ModelInput.
        seen = min(self.s.model_seen, len(messages))
        self._fit_unseen(seen)
        self.streamed = {}
        # A fresh publisher id for each streaming call: known to the workflow and the activity
        # it schedules, not to a signal from outside (unless it reads history: docs/security.md).
        self.stream_key = str(workflow.uuid4()) if turn.stream else None
        try:
            result = await self._ask_model(
                ModelInput(
                    agent=self.s.agent,
                    chat_id=workflow.info().workflow_id,
                    spec_digest=spec.digest if spec else None,
                    new_from=seen,
                    new_messages=messages[seen:],
                    prefix_digest=self.digests.of(messages, seen),
                    history_size=len(messages),
                    stream=turn.stream,
                    turn=turn.turn if turn.stream else None,
                    stream_key=self.stream_key,
                ),
                summary=f"model {spec.model}" if spec else f"model for {self.s.agent}",
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError):
                # Our own cancellation of the turn (or of the workflow) reached the activity:
                # it is a cancellation, not a model failure.
                raise asyncio.CancelledError() from None
            raise _TurnFailed(self._error(e, what="model call")) from None
        finally:
            self.stream_key = None  # the call is over: nothing more of it is taken
        self.telemetry.hosted()  # the worker hosts this agent: its name may label metrics
        if result.spec is not None:
            self.s.spec = result.spec
        # The message, and each of its calls' arguments again in the calls' state.
        adds = json_size(result.message) + sum(
            json_size(p.function_call) for p in result.message.parts if p.function_call
        )
        if adds > self.room(turn):
            raise _TurnFailed(
                ErrorInfo(
                    status=Status.RESOURCE_EXHAUSTED,
                    message=(
                        f"the model's reply ({human_size(adds)}) does not fit in what this "
                        f"turn can still hold; a turn holds at most {human_size(HELD.turn)}"
                    ),
                )
            )
        turn.model_calls += 1
        self._append(result.message)
        self.s.model_seen = len(self.s.messages)
        text = result.message.text()
        attempts, self.streamed = self.streamed, {}
        if text:
            # What the stream lacks of the reply: all of it when nothing streamed; the rest
            # after the attempt whose text it begins with (the one that answered; a publish may
            # not have got through); all of it again when none (the turn's result has the
            # reply that counted).
            streamed = max(
                (t for t in attempts.values() if text.startswith(t)), key=len, default=""
            )
            rest = text[len(streamed) :]
            if rest:
                self.emit(events.text(rest))
            else:
                self.emit(events.text(text), publish=False)
        return result.message

    async def _ask_model(self, request: ModelInput, *, summary: str) -> ModelResult:
        """The model activity's result, asked again while what comes back is not a worker's
        (``workflows.seal``: a reply completed by id from outside), at most
        ``config.UNSEALED_TRIES`` times in a row; then the turn fails, with nothing taken."""
        for _ in range(config.UNSEALED_TRIES):
            if request.stream:
                # Each ask streams anew: its share is what the run has left now, after what
                # the asks before it published.
                left = max(0, RUN.stream_signals - self._signals_taken())
                request = request.model_copy(update={"stream_signals": left})
            try:
                result: ModelResult = await self._execute(
                    config.MODEL_ACTIVITY,
                    request,
                    result_type=ModelResult,
                    start_to_close_timeout=config.MODEL_START_TO_CLOSE,
                    heartbeat_timeout=config.MODEL_HEARTBEAT,
                    retry_policy=config.MODEL_RETRY,
                    summary=summary,
                )
            except _Unsealed:
                continue  # recorded; the model is asked again
            return result
        raise _TurnFailed(
            ErrorInfo(
                status=Status.UNAVAILABLE,
                message=(
                    f"the model call's result was not a worker's {config.UNSEALED_TRIES} times "
                    "in a row (completed from outside the workers?); none of it was taken"
                ),
            )
        )

    def _fit_unseen(self, seen: int) -> None:
        """Keep the model call's input under Temporal's payload limit, come what may.

        The budgets keep the unseen messages (a kept tool message and the new user message)
        under 1.6 MiB; were they ever over :data:`OUT.model_input`, their largest responses
        and texts become stated placeholders, in the conversation itself, rather than the call
        failing its workflow task for good.
        """
        messages = self.s.messages
        unseen = messages[seen:]
        if json_size(unseen) <= OUT.model_input:
            return
        data = [m.model_dump(mode="json") for m in unseen]
        shrink({"messages": data}, OUT.model_input - 4096)
        messages[seen:] = [Message.model_validate(d) for d in data]
        self.digests.cut(seen)
        workflow.logger.warning("the model call's input was over its budget; cut to fit")

    async def _run_ready(self, turn: TurnState) -> bool:
        """Start every call that is ready; pause the ones that need a human first.

        Returns whether any call paused just now.
        """
        spec = self.s.spec
        book = self.book(turn)
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
            elif book.gate_holds(call):
                book.gate(call, now=now)
                paused.append(call)
            else:
                call.edit_passes_gate = None  # spent: the edited call runs
                runnable.append(call)
        if runnable:
            # The sub-agent calls of this batch share what is left of the turn's budget of
            # sub-agents (see _tree_share).
            self._agent_batch = sum(
                1
                for c in runnable
                if c.child is None and (t := spec.tool(c.name) if spec else None) and t.agent
            )
            # One batch: every call of the message is scheduled in the same workflow task.
            await asyncio.gather(*(self._run_tool(turn, c) for c in runnable))
        return any(c.status == "pending" for c in [*paused, *runnable])

    def _cut(self, text: str) -> str:
        """Text from the model or a tool, cut to a bounded size (it names keys the model made
        up, and may be copied into many calls' responses)."""
        return cut_stored(text, DOOR.note)

    async def _execute(self, activity: str, arg: object, **options: Any) -> Any:
        """``workflow.execute_activity``, scheduled again while the workers that take it cannot
        decrypt its input (they lack the payload key this conversation is written with).

        Such an attempt never reached the model or the tool: the worker failed it while
        decoding, so it is no failure of theirs. It is taken as that only with the worker's
        seal (``activities.sealing.Sealer.take``): anyone may fail an activity by id with the
        same text, of a tool that has run. (Only the last attempt is known to be that: a
        tool allowed several attempts may have run in earlier ones on a worker with the key,
        and runs again here, as any retry would.) An approved tool keeps its one run, and the
        paused turn goes on once a worker with the key takes the call (``agent-worker``
        without it stops, naming the key). Each new attempt waits twice as long as the last,
        within ``config.UNDECRYPTABLE_RETRY_*``; the failed attempts stay in history, each
        naming the missing key id. After ``config.UNDECRYPTABLE_GIVE_UP`` from the first such
        failure the call fails (:func:`_activity_error` says its input could not be decrypted).
        """
        delay = config.UNDECRYPTABLE_RETRY_FIRST
        since = None
        what = options.get("summary") or activity
        # The result is read here, not by the SDK: a completion by id carries anyone's bytes,
        # and one the SDK could not convert would fail the workflow task on every replay (a
        # stuck chat). One that does not read as the result type is refused as unsealed.
        result_type: type[Any] = options.pop("result_type")
        # Whether a timeout is checked against history (activity_ending); not for that check's
        # own activity, whose timeouts are refused instead (no check of a check).
        verify: bool = options.pop("verify_timeouts", True)
        while True:
            # Our own id, so the seal binds the result to this activity (workflows.seal).
            self._activities += 1
            activity_id = sealed_activity_id(activity, self._activities)
            scheduled = workflow.now()
            try:
                raw: RawValue = await workflow.execute_activity(
                    activity, arg, activity_id=activity_id, result_type=RawValue, **options
                )
            except ActivityError as e:
                # Sealed first: "never ran" from anyone but a worker would run a tool again.
                self._check_failure(e, activity=activity, activity_id=activity_id, what=what)
                await self._check_server_kind(
                    e,
                    activity=activity,
                    activity_id=activity_id if verify else None,
                    since=scheduled,
                    options=options,
                    what=what,
                )
                key_id = _undecryptable(e)
                if key_id is None:
                    raise
                now = workflow.now()
                since = since or now
                if now - since >= config.UNDECRYPTABLE_GIVE_UP:
                    raise
                # Fixed text and the key id only: the cause's message is not the workflow's.
                workflow.logger.error(
                    "%s did not run: the worker that took it could not decrypt its input (key "
                    "id %s); scheduled again in %s",
                    options.get("summary") or activity,
                    key_id,
                    delay,
                )
                await workflow.sleep(delay, summary="waiting for a worker with the payload key")
                delay = min(delay * 2, config.UNDECRYPTABLE_RETRY_MAX)
                continue
            result = self._read_result(raw, result_type, activity=activity, what=what)
            self._check_result(result, activity=activity, activity_id=activity_id, what=what)
            return result

    def _read_result(
        self, raw: RawValue, result_type: type[Any], *, activity: str, what: str
    ) -> Any:
        """The activity's result as ``result_type``, with its canonical bytes readable.

        Raises:
            _Unsealed: it does not convert (anyone's bytes, completed by id); recorded.
        """
        try:
            result = workflow.payload_converter().from_payload(raw.payload, result_type)
            result_body(result)  # a lone surrogate converts, and then cannot be written
        except Exception as e:
            if _awaits_a_key(e):
                # Encrypted with a key this worker lacks: the task fails until a worker that
                # holds it reads the result (as the SDK's own conversion would), rather than
                # refuse what a worker with the key would take (a replay deciding otherwise).
                raise
            why = f"it does not read as a {result_type.__name__} ({type(e).__name__})"
            self._refuse_result(activity=activity, what=what, why=why)
        return result

    def _binding(self, activity: str, activity_id: str) -> Binding:
        return Binding(
            workflow_id=workflow.info().workflow_id,
            activity_id=activity_id,
            activity_type=activity,
        )

    def _check_result(self, result: Any, *, activity: str, activity_id: str, what: str) -> None:
        """Take ``result`` only with a worker's seal for this very activity (workflows.seal).

        Raises:
            _Unsealed: it has none that verifies; the refusal is recorded.
        """
        keys = workflow_keys()
        seal = getattr(result, "seal", None)
        if keys is None:
            why: str | None = "this worker holds no result keys"
        else:
            why = keys.verify(seal, self._binding(activity, activity_id), result_body(result))
        if why is not None:
            self._refuse_result(activity=activity, what=what, why=why)

    def _check_failure(
        self, err: ActivityError, *, activity: str, activity_id: str, what: str
    ) -> None:
        """Take an activity's ``ApplicationError`` only with a worker's seal for this very
        activity. Failures of the server's own kinds (a timeout, a cancellation the workflow
        asked for) are the server's word, and are taken as they are; but a cancellation while
        nothing is being cancelled was sent by id as a failure, and is refused.

        Raises:
            _Unsealed: an application failure without a seal that verifies; recorded.
        """
        cause = err.cause
        if isinstance(cause, CancelledError):
            task = asyncio.current_task()
            if self.cancel is not None or (task is not None and task.cancelling()):
                return  # the cancellation this turn (or the workflow) asked for
            # The server lets no worker report a cancellation nobody asked for
            # (RespondActivityTaskCanceled* is refused): this one came by id as a failure.
            self._refuse_result(
                activity=activity,
                what=what,
                why="it is a cancellation this conversation did not ask for",
                failure=True,
            )
        if not isinstance(cause, ApplicationError):
            return
        details, seal = split_details(cause.details)
        keys = workflow_keys()
        if keys is None:
            why: str | None = "this worker holds no result keys"
        else:
            body = failure_body(
                type=cause.type,
                message=cause.message,
                non_retryable=cause.non_retryable,
                details=details,
            )
            why = keys.verify(seal, self._binding(activity, activity_id), body)
        if why is not None:
            self._refuse_result(activity=activity, what=what, why=why, failure=True)

    async def _check_server_kind(
        self,
        err: ActivityError,
        *,
        activity: str,
        activity_id: str | None,
        since: datetime,
        options: dict[str, Any],
        what: str,
    ) -> None:
        """Take a failure of the server's own kind only where the server made it (``None``
        for ``activity_id``: no timeout is taken).

        No worker seals a timeout or a server failure, and one failed by id reads the same as
        the server's here. A timeout of a kind this call has no limit for, or sooner than that
        limit since the call was scheduled, is not the server's; nor is a server failure, which
        the server never makes of an activity's ending. Any other timeout is taken once the
        run's history says the server made it (``ActivityTaskTimedOut``, read by the sealed
        ``activity_ending``): a failure sent by id is ``ActivityTaskFailed`` there, whatever
        it says. Refused as unsealed: a model call is asked again, a tool call reaches the
        model as "may have taken effect".

        Raises:
            _Unsealed: a server-kind failure the server did not make; recorded.
        """
        cause = err.cause
        if isinstance(cause, ServerError):
            why = "a server failure is never how the server ends an activity"
        elif isinstance(cause, TemporalTimeoutError):
            limit: timedelta | None = options.get(_TIMEOUT_OPTION.get(cause.type, ""))
            waited = workflow.now() - since
            if limit is None:
                why = f"the call has no {_timeout_name(cause.type)} timeout"
            elif waited < limit:
                why = (
                    f"its {_timeout_name(cause.type)} timeout is {limit}, and only {waited} had "
                    "passed"
                )
            else:
                if activity_id is None:
                    why = "a timeout of the check of how an activity ended is not checked"
                else:
                    ending = await self._ending(activity_id, what=what)
                    if ending == "timed_out":
                        return
                    why = f"the run's history says the call ended {ending}, not timed out"
        else:
            return
        self._refuse_result(activity=activity, what=what, why=why, failure=True)

    async def _ending(self, activity_id: str, *, what: str) -> str:
        """How the run's history says the activity ``activity_id`` ended (``activity_ending``);
        ``unknown`` when no worker's sealed answer came (the refusal is recorded)."""
        try:
            found: ActivityEndingResult = await self._execute(
                config.ACTIVITY_ENDING_ACTIVITY,
                ActivityEndingInput(activity_id=activity_id),
                result_type=ActivityEndingResult,
                start_to_close_timeout=config.ACTIVITY_ENDING_START_TO_CLOSE,
                heartbeat_timeout=config.SUB_AGENT_HEARTBEAT,
                retry_policy=config.SUB_AGENT_RETRY,
                summary=f"how {what} ended",
                verify_timeouts=False,
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError):
                # The turn (or the workflow) is being cancelled: that, not the check, decides.
                raise asyncio.CancelledError() from None
            return "unknown"
        except _Unsealed:
            return "unknown"
        return found.ending

    def _refuse_result(
        self, *, activity: str, what: str, why: str, failure: bool = False
    ) -> NoReturn:
        kind = "failure" if failure else "result"
        record = audit.rejection(
            at=workflow.now(),
            handler=activity,
            reason=f"{what}: a {kind} no worker sealed was not taken: {why}",
            raw=b"",
            identity=None,
            via="activity",
        )
        audit.reject(self.s, record)
        workflow.logger.warning("%s: a %s no worker sealed was not taken: %s", what, kind, why)
        raise _Unsealed(f"{what}: its {kind} was not a worker's ({why})")

    def _error(self, err: ActivityError, *, what: str) -> ErrorInfo:
        error = _activity_error(err, what=what)
        # A tool decides how long its message is, and it is kept and shown.
        return ErrorInfo(
            status=cut_stored(error.status, 40),
            message=cut_stored(error.message, DOOR.note),
            kind=error.kind,
            hosted=error.hosted,
        )

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
        book = self.book(turn)
        if call.child is not None and tool is not None and tool.agent is not None:
            # Started by an earlier run, which continued as new while it waited.
            await self._wait_sub_agent(call, tool.agent, None)
            return
        run = book.start_run(call)
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
        )
        if tool is not None and tool.agent is not None:
            await self._run_sub_agent(call, tool.agent, run=run)
            return
        self._tools_running += 1
        try:
            await self._run_tool_activity(turn, call, tool, arg)
        finally:
            self._tools_running -= 1

    async def _run_tool_activity(
        self, turn: TurnState, call: CallState, tool: ToolSpec | None, arg: ToolInput
    ) -> None:
        retry, single = self._tool_retry(call)
        book = self.book(turn)
        activity = config.TOOL_ACTIVITY
        if tool is not None and tool.mcp is not None:
            # An MCP server's tool: where it goes is data in the definition, as listed.
            activity = config.MCP_ACTIVITY
            arg = MCPCallInput(
                **arg.model_dump(), server=tool.mcp.server, server_tool=tool.mcp.tool
            )
        try:
            result = await self._execute(
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
        except _Unsealed as e:
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
            error = self._error(e, what=f"tool {call.name!r}")
            book.fail(call, error, uncertain=not _classified(e))
            return
        if result.kind == "interrupt":
            metadata = result.metadata or {}
            if json_size(metadata) > self.room(turn):
                metadata = omitted(metadata, why=_over_budget("this interrupt's metadata"))
            book.pause(call, source="tool", metadata=metadata, now=workflow.now())
        elif result.kind == "invalid_input":
            book.complete(call, {"error": f"invalid arguments: {self._cut(result.message or '')}"})
        else:
            output = result.output or {}
            if json_size(output) > self.room(turn):
                # The tool has run: the model must hear that, in a few bytes.
                output = {
                    "error": "output too large for this turn",
                    "detail": f"{_over_budget('the output')}; it was dropped",
                }
            book.complete(call, output)

    async def _run_sub_agent(self, call: CallState, ref: SubAgentRef, *, run: int) -> None:
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
        book = self.book(turn)
        agent = ref.agent
        # This call and the batch's sub-agent calls after it (gather starts them in order,
        # each running to here before the next).
        batch, self._agent_batch = max(self._agent_batch, 1), max(self._agent_batch - 1, 0)
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
                # _wait_sub_agent), and cancels it itself when its turn is cancelled.
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
        await self._wait_sub_agent(call, ref, handle)

    async def _wait_sub_agent(
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
        book = self.book(turn)
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
        self.children[child_id] = child
        watch = asyncio.create_task(self._watch_child(child_id, child))
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
                gone = self.children.pop(child_id, None)
                if gone is not None and gone.requests and self.s.turn is not None and not evicted:
                    self._publish()  # its interrupts are off the operator view
        last = result.last_turn
        if last is not None and last.finish_reason == FinishReason.STOP:
            output: JsonObject = {"text": last.text, "chat_id": child_id}
            if ref.output_schema is not None:
                output = structured_output(last.text, ref.output_schema, chat_id=child_id)
            if json_size(output) > self.room(turn):
                # As a tool's output (see _run_tool): the child has answered, the model must
                # hear that in a few bytes, and the turn stays within its budget.
                output = {
                    "error": "output too large for this turn",
                    "detail": f"{_over_budget('the output')}; it was dropped",
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
        self.book(turn).fail(
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

    def _may_detach(self) -> bool:
        """Whether the sub-agent calls under way may be left for the next run: the run should
        continue as new, and no tool call, handler or cancellation is under way."""
        return self._tools_running == 0 and self.cancel is None and self._can_now()

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

    async def _watch_child(self, child_id: str, child: SubAgentChild) -> None:
        """Keep what ``child`` waits on in view: read it each time the child says it changed.

        The child's ``sub_agent`` signal is a hint (anyone may send it): what it waits on is
        read from the child itself, by the chain this turn started. When it waits on someone
        and this turn has nothing of its own pending, the turn stops ``interrupted`` with the
        child's interrupts (each with its path), as a pause of its own would.
        """
        while True:
            await workflow.wait_condition(lambda: child.hinted)
            try:
                async with self._reading:
                    # Cleared once it is this child's turn to be read: hints that came while
                    # it queued are answered by this one read.
                    child.hinted = False
                    found = await self._execute(
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
            except _Unsealed:
                child.hinted = True  # not a worker's read (recorded): read it again
                continue
            except ActivityError as e:
                if isinstance(e.cause, CancelledError):
                    raise asyncio.CancelledError() from None  # the call is over: stop watching
                workflow.logger.warning("could not read sub-agent %s: %s", child_id, e)
                continue
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
                self._stop(self.paused_result(turn))
            else:
                self._publish()

    def last_result_paused(self) -> bool:
        """Whether the turn waits on someone: for its own interrupts or a sub-agent's."""
        return self.s.turn is not None and (self.paused() or bool(self.delegated()))

    def delegated(self) -> list[InterruptRequest]:
        """The interrupts this turn's sub-agents wait on, in call order, with their paths."""
        turn = self.s.turn
        if turn is None or not self.children:
            return []
        by_ref = {c.ref: c for c in self.children.values()}
        shown = [r for call in turn.calls if call.ref in by_ref for r in by_ref[call.ref].requests]
        # As many as one message's own calls at most: 128 sub-agents of 128 pauses each would
        # otherwise put 16,384 entries in the memo (past its 2 MiB) and rebuild them on every
        # child's change, past the workflow task's deadline. The rest wait in their children
        # (answerable there, or here once shown).
        room = max(DOOR.calls_per_message - len(self.book(turn).pending()), 0)
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
        own = {c.ref for c in self.book(self.s.turn).pending()} if self.s.turn else set()
        found = [
            (child_id, child)
            for child_id, child in self.children.items()
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
        own = {c.ref for c in self.book(self.s.turn).pending()} if self.s.turn else set()
        for child_id, child in self.children.items():
            settled = (refs & child.shown) - {r.ref for r in child.requests} - own
            if settled:
                return sorted(settled)[0], child_id
        return None

    def hint(self, child_id: str) -> bool:
        """A sub-agent said what it waits on changed; False: no running child of that id."""
        child = self.children.get(child_id)
        if child is None:
            return False
        child.hinted = True
        return True

    async def forward(
        self, child_id: str, child: SubAgentChild, resume: JsonObject
    ) -> SubAgentResumeResult:
        """Pass an answer given here to the sub-agent it is for, whose rules check it."""
        try:
            result: SubAgentResumeResult = await self._execute(
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
        except _Unsealed as e:
            # Not a worker's word (recorded): whether the sub-agent took the answer is read
            # from it again.
            child.hinted = True
            return SubAgentResumeResult(refused=f"not confirmed: {e.reason}")
        if result.refused is None:
            child.hinted = True  # read what it waits on now
        return result

    async def _await_answers(
        self, turn: TurnState
    ) -> Literal["answered", "cancel", "continue_as_new"]:
        book = self.book(turn)
        while True:
            if self.cancel is not None:
                return "cancel"
            if book.all_answered():
                return "answered"
            if self._can_now():
                return "continue_as_new"
            deadline = book.next_deadline()
            timeout = None
            if deadline is not None:
                timeout = max(deadline - workflow.now(), timedelta(0))
            try:
                await workflow.wait_condition(
                    lambda: self.cancel is not None or book.all_answered() or self._can_now(),
                    timeout=timeout,
                    timeout_summary="interrupt deadline" if timeout is not None else None,
                )
            except TimeoutError:
                assert deadline is not None  # only a timeout raises it
                await self._deadline_passed(turn, fired=deadline)

    async def _deadline_passed(self, turn: TurnState, *, fired: datetime) -> None:
        """Carry out the deadline policies whose time has come: reminders and escalations
        notify someone (a tool run each); a deadline answers with its default or cancels
        the turn.

        Args:
            fired: The time the timer that fired was set for. It has passed, whatever
                ``workflow.now()`` says: the SDK can hand the activation that delivers the
                timer the time of the run's previous task (a worker that cached the run
                answering a query, taking the task after it timed out on a dead worker's
                sticky queue), while a replay sees the later time. Deciding by the clock
                alone found nothing due there and started the timer again, and the run no
                longer replayed (tests/test_soak_findings.py).
        """
        book = self.book(turn)
        now = max(workflow.now(), fired)
        notices: list[tuple[CallState, str, Literal["reminder", "escalation"]]] = []
        cancelled: list[CallState] = []
        for due in book.due(now):
            if due.action == "remind" and due.notify:
                book.remind(due.call)
                notices.append((due.call, due.notify, "reminder"))
            elif due.action == "escalate" and due.notify:
                book.escalate(due.call)
                notices.append((due.call, due.notify, "escalation"))
            elif due.action == "cancel":
                cancelled.append(due.call)
        if not cancelled:
            # (A deadline that cancels the turn withdraws every call: none expires first.)
            book.expire(now, room=lambda: self.room(turn))
        if cancelled and self.cancel is None:
            names = ", ".join(f"{c.name} (ref {c.ref})" for c in cancelled)
            self.cancel = CancelInput(
                reason=f"nobody answered {names} before the deadline",
                identity=DEADLINE_IDENTITY,
            )
            self._cancel_via = "deadline"
        self._publish()
        # One deadline often falls due for every call of a message at once (the agent-wide
        # one): their notices share one budget, so the task that schedules them stays small.
        budget = max(MIN_NOTICE_BYTES, NOTICES_BUDGET // max(len(notices), 1))
        for call, tool, why in notices:
            # Not awaited: an answer that arrives while a notifying tool runs takes effect at
            # once (a slow pager must not hold up the turn it is about).
            task = asyncio.create_task(self._notify(call, tool, why, budget=budget))
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)

    async def _notify(
        self,
        call: CallState,
        tool: str,
        why: Literal["reminder", "escalation"],
        *,
        budget: int,
    ) -> None:
        """Run a notifying tool about a paused call; a failure is logged, never the turn's.

        Args:
            budget: The most the notice may take: its input and metadata become placeholders
                past it, then its votes are cut (the notifier can ask ``pending`` for all).
        """
        book = self.book(self.s.turn) if self.s.turn else None
        request = book.request_for(call) if book else events.to_request(call)
        notice = Notice(
            chat_id=workflow.info().workflow_id,
            agent=self.s.agent,
            reason=why,
            interrupt=request,
        )
        chat_id = notice.chat_id
        # One key per notice of one pause (a call that pauses again gets new ones).
        number = call.reminded + (1 if call.escalated else 0)
        since = call.since.isoformat() if call.since else ""
        try:
            await workflow.execute_activity(
                config.TOOL_ACTIVITY,
                ToolInput(
                    agent=self.s.agent,
                    chat_id=chat_id,
                    tool=tool,
                    ref=call.ref,
                    args=notice_within(notice, budget),
                    idempotency_key=idempotency_key(chat_id, f"{call.ref}\0{since}\0{why}", number),
                ),
                result_type=ToolResult,
                start_to_close_timeout=config.TOOL_START_TO_CLOSE,
                heartbeat_timeout=config.TOOL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_attempts=config.TOOL_RETRY_ATTEMPTS),
                summary=f"{why} {tool} for {call.name}",
            )
        except ActivityError as e:
            workflow.logger.warning(
                "the %s tool %r about %s (ref %s) failed: %s", why, tool, call.name, call.ref, e
            )

    def _tool_message(self, turn: TurnState) -> Message:
        # One tool message holding every response of the message's calls, in call order.
        return Message(
            role="user",
            parts=[
                Part(
                    function_response=FunctionResponse(
                        id=c.call_id, name=c.name, response=c.output or {}
                    )
                )
                for c in turn.calls
            ],
        )

    # ------------------------------------------------------------------------------------------
    # Stop points: the turn pauses or ends, and whoever waits on it gets its result.

    def _turn_text(self, turn: TurnState) -> str:
        for m in reversed(self.s.messages[turn.base_len :]):
            if m.role == "model":
                return m.text()
        return ""

    def _stop(self, result: TurnResult) -> None:
        self.s.last_turn = result
        if self.s.turn is None:
            # Whatever ended the turn, a cancellation asked for it is spent; and the state
            # may be trimmable now that the turn is over.
            self.cancel = None
            self.can_blocked = False
            self._book = None  # the next turn has a book of its own
        self.stops += 1
        self.emit(events.turn_end(result))
        self._publish()

    def _finish(self, reason: FinishReason) -> None:
        turn = self.s.turn
        assert turn is not None
        result = TurnResult(turn=turn.turn, finish_reason=reason, text=self._turn_text(turn))
        self.s.turn = None
        self._stop(result)

    def _fail(self, error: ErrorInfo) -> None:
        turn = self.s.turn
        assert turn is not None
        if turn.phase == "tools":
            # Interrupts raised and never to be answered: counted as withdrawn.
            now = workflow.now()
            self.telemetry.withdrawn(self.book(turn).pending(), now=now, by_deadline=False)
        if turn.model_calls > 0:
            # What happened stays in the conversation, so the next turn's model knows that
            # an approved side effect took place: every call of the step keeps a response,
            # its failure or that it never ran.
            if turn.phase == "tools" and turn.calls:
                self.book(turn).abandon(error)
                self._append(self._tool_message(turn))
        else:
            # Nothing happened yet (the model never answered): the conversation is left as it
            # was before the turn.
            self.cut_messages(turn.base_len)
        self.s.turn = None
        workflow.logger.warning("turn %d failed: %s %s", turn.turn, error.status, error.message)
        # A conversation whose agent no worker has ever hosted for it (its definition comes
        # with the first model call a hosting worker answers) is a misspelled or unknown agent:
        # it is closed, the reason in this turn's result (the workflow's result too), rather
        # than left running for messages no worker can answer. One that already had a hosting
        # worker keeps going: another worker on the queue lacks the agent, and the turn failed.
        closes = error.kind == ErrorKind.UNKNOWN_AGENT and self.s.spec is None
        if closes:
            self.s.closed = True
        self._stop(
            TurnResult(
                turn=turn.turn, finish_reason=FinishReason.FAILED, error=error, closed=closes
            )
        )

    def finish_cancelled(self) -> None:
        """End the turn ``cancelled``: what is pending is withdrawn, every call keeps a
        response."""
        turn = self.s.turn
        assert turn is not None
        reason = self.cancel.reason if self.cancel else ""
        identity = self.cancel.identity if self.cancel else None
        via, self._cancel_via = self._cancel_via, "cancel"
        self.cancel = None
        if turn.phase == "tools" and turn.calls:
            # Before the calls are withdrawn: only those still pending were waiting on a human.
            pending = self.book(turn).pending()
            self.telemetry.withdrawn(pending, now=workflow.now(), by_deadline=via == "deadline")
            self.book(turn).cancel(reason, identity=identity, via=via)
            # Every call keeps a response, so the history stays valid for the model.
            self._append(self._tool_message(turn))
        elif turn.model_calls == 0:
            # Cancelled before the model answered: as if the message was never sent.
            self.cut_messages(turn.base_len)
        # Otherwise tools already ran this turn: their results stay in the conversation, so
        # the model knows on the next turn what was done.
        result = TurnResult(
            turn=turn.turn, finish_reason=FinishReason.CANCELLED, text=self._turn_text(turn)
        )
        self.s.turn = None
        self._stop(result)

    def cut_messages(self, n: int) -> None:
        del self.s.messages[n:]
        self.digests.cut(n)
        self.s.model_seen = min(self.s.model_seen, n)


NOTICES_BUDGET = 256 * 1024
"""What the notices of one pass of the deadline policies take together."""

MIN_NOTICE_BYTES = 2 * 1024
"""What each notice may take however many fall due at once (128 calls: 256 KiB)."""


def notice_within(notice: Notice, budget: int) -> JsonObject:
    """A notice as its tool's input, within ``budget`` bytes."""
    data = notice.model_dump(mode="json")
    shrink(data, budget)
    votes = data["interrupt"]["votes"]
    while votes and json_size(data) > budget:
        votes.pop()
    return data


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


def answer_chats() -> tuple[str, ...]:
    """The chat ids a token bound to one answer may name here: this conversation's, and for a
    sub-agent each of its callers' up to the first (an answer to a sub-agent's call is sent to a
    caller and forwarded down). Temporal names the parent and the root; the ones between are
    read from this chat's id, which each caller made by extending its own (``sub_agent_id``):
    every ``--`` boundary of it from the root's id on."""
    info = workflow.info()
    own = info.workflow_id
    if info.parent is None:
        return (own,)
    root = info.root.workflow_id if info.root is not None else info.parent.workflow_id
    chats = {own, info.parent.workflow_id, root}
    if own.startswith(f"{root}--"):
        at = len(root)
        while (at := own.find("--", at + 2)) != -1:
            chats.add(own[:at])
    return tuple(sorted(chats))


def sub_agent_id(chat_id: str, ref: str, run: int) -> str:
    """The chat id of a sub-agent's conversation for one run of a call (``agent_tool``)."""
    return f"{chat_id}--{ref}" if run <= 1 else f"{chat_id}--{ref}--{run}"


def message_digest(text: str) -> str:
    """What tells a message sent again from another message under the same id."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def idempotency_key(chat_id: str, ref: str, run: int) -> str:
    """``ToolContext.idempotency_key``: the same for every attempt and replay of one run of a
    call (one approval), different for the next run; fixed-length for any far-side API."""
    return hashlib.sha256(f"{chat_id}\0{ref}\0{run}".encode()).hexdigest()[:32]


def _over_budget(what: str) -> str:
    return f"{what} did not fit in what this turn can still hold ({human_size(HELD.turn)} in all)"


_TIMEOUT_OPTION: dict[TimeoutType | None, str] = {
    TimeoutType.START_TO_CLOSE: "start_to_close_timeout",
    TimeoutType.SCHEDULE_TO_START: "schedule_to_start_timeout",
    TimeoutType.SCHEDULE_TO_CLOSE: "schedule_to_close_timeout",
    TimeoutType.HEARTBEAT: "heartbeat_timeout",
}
"""The ``execute_activity`` option that sets the limit a timeout of each kind says passed."""


def _timeout_name(kind: TimeoutType | None) -> str:
    return kind.name.lower().replace("_", "-") if kind is not None else "unknown"


DECODING_FAILED = "Failed decoding arguments"
"""The message of the error the SDK raises when an activity worker cannot convert the activity's
input (``temporalio/worker/_activity.py``); ``client.codec.DECODING_FAILED``."""

_KEY_ID_IN_MESSAGE = re.compile(r"key id '([A-Za-z0-9._-]{1,64})'")


def _undecryptable(err: ActivityError) -> str | None:
    """The key id (quoted, or ``unknown``) if the attempt failed as the SDK fails an activity
    whose input the worker could not decrypt; else None.

    Only that shape: the attempt's error is the SDK's own "Failed decoding arguments", and a
    ``PayloadKeyMissing`` is in *its* causes. A tool that raises an error of that type itself
    (one reading another conversation through ``AgentClient``, say) has run: its failure is
    the tool's, and is not scheduled again.
    """
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.message == DECODING_FAILED):
        return None
    inner = cause.__cause__
    while inner is not None:
        if isinstance(inner, ApplicationError) and inner.type == ErrorKind.PAYLOAD_KEY_MISSING:
            found = _KEY_ID_IN_MESSAGE.search(inner.message)
            return repr(found[1]) if found else "unknown"
        inner = inner.__cause__
    return None


def _awaits_a_key(error: BaseException) -> bool:
    """Whether ``error`` (or a cause of it) is the codec's ``PayloadKeyMissing`` for a key id
    this process does not hold (not ``corrupt``: a key it holds under that id that does not open
    the payload, which no worker with this key set would open either). ``codec.awaits_a_key``,
    by the class's name: the workflow's sandbox imports the codec module anew."""
    found: BaseException | None = error
    while found is not None:
        if type(found).__name__ == ErrorKind.PAYLOAD_KEY_MISSING:
            return not getattr(found, "corrupt", False)
        found = found.__cause__
    return False


def _classified(err: ActivityError) -> bool:
    """Whether the failure says how it failed: the tool's own ``ToolError``, or an input no
    worker could decrypt (the call never ran)."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    ):
        return True
    return _undecryptable(err) is not None


def _activity_error(err: ActivityError, *, what: str) -> ErrorInfo:
    """A classified error for the caller. Unclassified failures keep their text in history only."""
    key_id = _undecryptable(err)
    if key_id is not None:
        # Given up on (config.UNDECRYPTABLE_GIVE_UP): no worker that took it could read it.
        return ErrorInfo(
            status=Status.UNAVAILABLE,
            message=(
                f"{what} did not run: its input could not be decrypted (key id {key_id}) by "
                "the workers that took it"
            ),
        )
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.MODEL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    ):
        status = str(cause.details[0]) if cause.details else Status.INTERNAL
        hosted = None
        if cause.type == ErrorKind.UNKNOWN_AGENT:
            hosted = _hosted(cause.details[1] if len(cause.details) > 1 else None)
        return ErrorInfo(status=status, message=cause.message, kind=cause.type, hosted=hosted)
    if isinstance(cause, TemporalTimeoutError):
        return ErrorInfo(status=Status.DEADLINE_EXCEEDED, message=f"{what} timed out")
    return ErrorInfo(status=Status.INTERNAL, message=f"{what} failed")


def _hosted(detail: object) -> list[str]:
    """The agent names an ``UnknownAgent`` failure's details carry (the activity's second
    detail), as far as they fit 1 KiB: whoever runs a worker on the queue wrote them, and the
    turn's result holds them."""
    names = detail.get("hosted") if isinstance(detail, dict) else None
    if not isinstance(names, list):
        return []
    return names_within([cut_stored(n, DOOR.agent_name) for n in names if isinstance(n, str)], KiB)

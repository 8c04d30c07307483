"""``AgentWorkflow``: one conversation with one agent; the workflow id is the chat id.

Determinism and replay contract:

- The turn is a state machine over :class:`~workflows.types.ConversationState`, which is plain
  data. The agent's definition arrives as data in the ``model_call`` result, so replay never runs
  the agent's current code; this module imports no agent, tool or model code.
- Ids come from the model's call ids or ``workflow.uuid4()``; time from ``workflow.now()``.
- Handlers never raise anything but ``ApplicationError`` (and only update handlers, where failing
  the update is meant). Signals take raw payloads and validate them here, so a malformed signal
  is recorded as a rejection instead of failing the workflow task.
- Whatever enters the conversation passes the checks and budgets of :mod:`workflows.limits`, so
  its state, every activity input, query result and update result stays serializable and under
  Temporal's payload limit.
- A failed turn (model, tool, bad input) ends ``failed`` and keeps what happened in the
  conversation; the workflow itself never fails because of one.
- Rules added while conversations were already running are decided per run by a patch marker
  (:meth:`AgentWorkflow._version`), so every run replays with the rules it ran under.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from workflows import config
    from workflows.details import render_details, truncate
    from workflows.history import (
        Digests,
        carry,
        legacy_carry,
        page,
        page_back,
        trim_answers,
    )
    from workflows.interrupts import (
        InterruptBook,
        ResumeError,
        pydantic_reason,
        schema_error,
    )
    from workflows.limits import (
        CAN_HISTORY_BYTES,
        CAN_HISTORY_EVENTS,
        MAX_ANSWERS_KEPT,
        MAX_AUDIT_METADATA_BYTES,
        MAX_IDENTITY_BYTES,
        MAX_JSON_DEPTH,
        MAX_NOTE_BYTES,
        MAX_REASON_BYTES,
        MAX_REASON_CHARS,
        MAX_REF_BYTES,
        MAX_REJECTIONS_KEPT,
        MAX_RESUME_BYTES,
        MAX_SEND_BYTES,
        MODEL_INPUT_BUDGET,
        QUERY_BUDGET,
        SERIALIZABLE_DEPTH,
        STATE_BUDGET,
        TURN_BUDGET,
        UPDATE_RESULT_BUDGET,
        Refused,
        check_json,
        check_label,
        check_size,
        check_text,
        cut_stored,
        decode_json,
        digest,
        human_size,
        json_size,
        omitted,
        shrink,
        stored_size,
    )
    from workflows.types import (
        TOOL_APPROVED,
        AgentStatus,
        AnswerRecord,
        CallState,
        CancelInput,
        ConversationInput,
        ConversationResult,
        ConversationState,
        ErrorInfo,
        ErrorKind,
        FinishReason,
        FunctionResponse,
        HistoryInput,
        HistoryResult,
        Message,
        MessagesInput,
        MessagesResult,
        ModelInput,
        ModelResult,
        Part,
        PendingResult,
        Rejection,
        RejectionsResult,
        ResumeInput,
        SendInput,
        Status,
        StatusResult,
        ToolInput,
        ToolResult,
        TurnResult,
        TurnState,
        gate_metadata,
        timed_out_output,
    )

R = TypeVar("R", bound="BaseModel")

TURN_EDGES_PATCH = "turn-edges-2026-11"
DURABLE_INPUT_PATCH = "durable-input-2026-12"


class _TurnFailed(Exception):
    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


def _rejected(kind: ErrorKind, reason: str) -> ApplicationError:
    # Non-retryable: a rejected answer is wrong, not unlucky; retrying cannot help.
    return ApplicationError(reason, type=kind, non_retryable=True)


def _fit(result: R, budget: int) -> R:
    """``result`` within ``budget`` bytes: the largest caller or tool objects in it replaced by
    stated placeholders when it would not fit (Temporal refuses a payload over 2 MiB)."""
    if json_size(result) <= budget:
        return result
    data = result.model_dump(mode="json")
    shrink(data, budget)
    # A turn paused on many interrupts: even as placeholders they may not fit an update's
    # result. The last ones go, counted; ``pending`` lists them all.
    turn = data if "interrupts" in data else data.get("last_turn")
    if isinstance(turn, dict):
        interrupts = turn.get("interrupts") or []
        while interrupts and json_size(data) > budget:
            interrupts.pop()
            turn["interrupts_omitted"] = turn.get("interrupts_omitted", 0) + 1
    return type(result).model_validate(data)


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    @workflow.init
    def __init__(self, input: ConversationInput) -> None:
        self._s: ConversationState = input.state or ConversationState(agent=input.agent)
        # Refs in the order they were made (the newest are carried by continue-as-new).
        self._ref_order: list[str] = list(self._s.refs)
        self._refs: set[str] = set(self._s.refs)
        # Derived from the messages (not state): recomputed after continue-as-new or replay.
        self._digests = Digests()
        # Every time a turn reaches a stop point (paused or ended) this goes up by one; update
        # handlers wait on it to return the turn's result.
        self._stops = 0
        self._cancel: CancelInput | None = None
        self._turn_task: asyncio.Task[str] | None = None
        self._published: tuple[object, ...] | None = None
        # Set when this run's state proved too large to carry over (see _state_for_next_run).
        self._can_blocked = False
        # What the memo holds (carried over by continue-as-new), so only changes need an
        # upsert. None: no "pending" memo, which runs from before the turn-edges patch
        # replace with [] on their first publish (see _publish).
        self._memo_pending: list[dict[str, str]] | None = workflow.memo_value("pending", None)
        # Which rules this run has (see _durable); decided before any handler runs, since
        # validators read it and may not record a marker themselves.
        self._durable_run: bool = workflow.patched(DURABLE_INPUT_PATCH)
        self._edges_run: bool | None = True if self._durable_run else None

    def _depth(self) -> int:
        """The deepest nesting this run accepts (older runs: only what cannot be stored)."""
        return MAX_JSON_DEPTH if self._durable() else SERIALIZABLE_DEPTH

    def _durable(self) -> bool:
        """Whether this run has the durable-input rules of 2026-12 (the door, budgets, one
        approval one run, failed turns that keep what happened, history bounds).

        They change which input a handler accepts and which commands a turn issues, so a run
        begun before them must replay as it ran: Temporal's patch marker says which kind of run
        this is. A new run records it first thing; asking in a run begun earlier records
        nothing (its history has no such marker). Runs begun by continue-as-new are new runs.
        Remove the old branches once no run without the marker can be open.
        """
        return self._durable_run

    def _edges(self) -> bool:
        """Whether this run has the cancellation and pause fixes of 2026-11 (implied by the
        durable-input rules).

        Runs begun before the durable-input rules asked for this marker first thing in ``run``,
        or earlier in a handler of the same first task (after an update's acceptance): it is
        asked for in the same places, so those runs replay exactly.
        """
        if self._edges_run is None:
            self._edges_run = workflow.patched(TURN_EDGES_PATCH)
        return self._edges_run

    # ------------------------------------------------------------------------------------------
    # Main loop

    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationResult:
        if not self._durable_run:
            self._edges()  # where runs before the durable-input rules asked: first thing
        self._publish()
        try:
            while True:
                await workflow.wait_condition(
                    lambda: self._s.turn is not None or self._s.closed or self._can_now()
                )
                if self._s.turn is not None:
                    self._turn_task = asyncio.create_task(self._drive())
                    outcome = await self._turn_task
                    self._turn_task = None
                    task = asyncio.current_task()
                    if self._edges() and task is not None and task.cancelling():
                        # The workflow was cancelled while a cancel update was ending the turn:
                        # the turn task absorbed the cancellation, which still stands.
                        raise asyncio.CancelledError()
                    if outcome != "continue_as_new":
                        continue
                if self._s.closed:
                    break
                # Long conversations stay bounded: carry the state into a fresh run. Nothing a
                # client holds (chat id, refs) changes.
                await workflow.wait_condition(workflow.all_handlers_finished)
                state = self._state_for_next_run()
                if state is None:
                    # Even trimmed, the state would be refused as too large, and the run would
                    # be stuck retrying. Going on in this run is the lesser evil.
                    self._can_blocked = True
                    workflow.logger.warning(
                        "conversation state too large to continue-as-new even after trimming; "
                        "staying in this run"
                    )
                    continue
                if state.dropped_messages > self._s.dropped_messages:
                    workflow.logger.warning(
                        "dropped the %d oldest messages to carry the conversation into a new run",
                        state.dropped_messages - self._s.dropped_messages,
                    )
                workflow.continue_as_new(ConversationInput(agent=self._s.agent, state=state))
        except asyncio.CancelledError:
            # The workflow itself was cancelled (e.g. from the UI): the conversation is closed.
            # A turn in progress ends cancelled, so a caller waiting on it gets that answer
            # rather than "workflow execution already completed".
            edges = self._edges()
            if edges and self._s.turn is not None:
                self._finish_cancelled()
            self._s.closed = True
            self._publish()
            if edges:
                await workflow.wait_condition(workflow.all_handlers_finished)
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._publish()
        return self._result()

    def _result(self) -> ConversationResult:
        return _fit(
            ConversationResult(
                chat_id=workflow.info().workflow_id,
                turns=self._s.turns,
                last_turn=self._s.last_turn,
            ),
            UPDATE_RESULT_BUDGET,
        )

    def _can_now(self) -> bool:
        if self._can_blocked or not workflow.all_handlers_finished():
            return False
        info = workflow.info()
        length = info.get_current_history_length()
        if self._durable() and (
            info.get_current_history_size() >= CAN_HISTORY_BYTES or length >= CAN_HISTORY_EVENTS
        ):
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
        if not self._durable():
            # Whether a run begun before these rules could continue as new is a decision its
            # history records: it is made exactly as that code made it.
            return legacy_carry(self._s, self._refs)
        return carry(self._s, self._ref_order, paused=self._paused(), budget=STATE_BUDGET)

    # ------------------------------------------------------------------------------------------
    # The turn state machine

    async def _drive(self) -> str:
        turn = self._s.turn
        assert turn is not None
        try:
            while True:
                if self._cancel is not None and self._edges():
                    # A cancel that arrived before this step could be interrupted (e.g. in the
                    # same workflow task as the send that started the turn).
                    self._finish_cancelled()
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
                    turn.calls = [
                        CallState(
                            ref=self._new_ref(fc.id), call_id=fc.id, name=fc.name, args=fc.args
                        )
                        for fc in calls
                    ]
                    turn.phase = "tools"
                newly_paused = await self._run_ready(turn)
                book = self._book(turn)
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
                        self._pause_point()
                    outcome = await self._await_answers(turn)
                    if outcome == "cancel":
                        self._finish_cancelled()
                        return "done"
                    if outcome == "continue_as_new":
                        return outcome
                    book.settle()
                    continue
                self._append(self._tool_message(turn))
                turn.calls = []
                turn.phase = "model"
        except _TurnFailed as f:
            self._fail(f.error)
            return "done"
        except asyncio.CancelledError:
            if self._cancel is None:
                raise  # the workflow is being cancelled, not just this turn
            self._finish_cancelled()
            return "done"

    def _max_turns(self) -> int:
        return self._s.spec.max_turns if self._s.spec else 10

    def _new_ref(self, call_id: str | None) -> str:
        usable = bool(call_id) and call_id not in self._refs
        if usable and self._durable():
            # Once old refs are forgotten, a model's id might repeat one; a fresh uuid cannot.
            small = stored_size(call_id or "") <= MAX_REF_BYTES
            usable = small and not self._s.refs_forgotten
        ref = call_id if usable and call_id else str(workflow.uuid4())
        self._refs.add(ref)
        self._ref_order.append(ref)
        return ref

    def _append(self, message: Message) -> None:
        """Add a message to the conversation, counting it against the turn's budget."""
        self._s.messages.append(message)
        turn = self._s.turn
        if turn is not None and turn.held is not None:
            turn.held += json_size(message)

    def _turn_held(self, turn: TurnState) -> int:
        """Bytes the turn holds in the conversation's state: its messages and its calls.

        A turn carried over from a run begun before the count existed has none: it is counted
        afresh (not stored, since validators ask too and must not change state).
        """
        held = turn.held
        if held is None:
            held = sum(json_size(m) for m in self._s.messages[turn.base_len :])
        return held + self._book(turn).held_bytes()

    def _room(self, turn: TurnState) -> int:
        return TURN_BUDGET - self._turn_held(turn)

    async def _call_model(self, turn: TurnState) -> Message:
        spec = self._s.spec
        messages = self._s.messages
        # Only what the model side has not seen goes into history; see ModelInput.
        seen = min(self._s.model_seen, len(messages))
        if self._durable():
            self._fit_unseen(seen)
        try:
            result = await workflow.execute_activity(
                config.MODEL_ACTIVITY,
                ModelInput(
                    agent=self._s.agent,
                    chat_id=workflow.info().workflow_id,
                    spec_digest=spec.digest if spec else None,
                    new_from=seen,
                    new_messages=messages[seen:],
                    prefix_digest=self._digests.of(messages, seen),
                    history_size=len(messages),
                ),
                result_type=ModelResult,
                start_to_close_timeout=config.MODEL_START_TO_CLOSE,
                heartbeat_timeout=config.MODEL_HEARTBEAT,
                retry_policy=config.MODEL_RETRY,
                summary=f"model {spec.model}" if spec else f"model for {self._s.agent}",
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError) and self._edges():
                # Our own cancellation of the turn (or of the workflow) reached the activity:
                # it is a cancellation, not a model failure.
                raise asyncio.CancelledError() from None
            raise _TurnFailed(self._error(e, what="model call")) from None
        if result.spec is not None:
            self._s.spec = result.spec
        if self._durable():
            # The message, and each of its calls' arguments again in the calls' state.
            adds = json_size(result.message) + sum(
                json_size(p.function_call) for p in result.message.parts if p.function_call
            )
            if adds > self._room(turn):
                raise _TurnFailed(
                    ErrorInfo(
                        status=Status.RESOURCE_EXHAUSTED,
                        message=(
                            f"the model's reply ({human_size(adds)}) does not fit in what this "
                            f"turn can still hold; a turn holds at most {human_size(TURN_BUDGET)}"
                        ),
                    )
                )
        turn.model_calls += 1
        self._append(result.message)
        self._s.model_seen = len(self._s.messages)
        return result.message

    def _fit_unseen(self, seen: int) -> None:
        """Keep the model call's input under Temporal's payload limit, come what may.

        The budgets keep the unseen messages (a kept tool message and the new user message)
        under 1.6 MiB; were they ever over :data:`MODEL_INPUT_BUDGET`, their largest responses
        and texts become stated placeholders, in the conversation itself, rather than the call
        failing its workflow task for good.
        """
        messages = self._s.messages
        unseen = messages[seen:]
        if json_size(unseen) <= MODEL_INPUT_BUDGET:
            return
        data = [m.model_dump(mode="json") for m in unseen]
        shrink({"messages": data}, MODEL_INPUT_BUDGET - 4096)
        messages[seen:] = [Message.model_validate(d) for d in data]
        self._digests.cut(seen)
        workflow.logger.warning("the model call's input was over its budget; cut to fit")

    async def _run_ready(self, turn: TurnState) -> bool:
        """Start every call that is ready; pause the ones that need a human first.

        Returns whether any call paused just now.
        """
        spec = self._s.spec
        book = self._book(turn)
        now = workflow.now()
        runnable: list[CallState] = []
        paused: list[CallState] = []
        for call in turn.calls:
            if call.status != "ready":
                continue
            tool = spec.tool(call.name) if spec else None
            if tool is None:
                available = ", ".join(t.name for t in spec.tools) if spec else ""
                name = call.name
                if self._durable():
                    # Cut short: the model may make 128 such calls in one message.
                    available, name = cut_stored(available, 400), cut_stored(name, 200)
                call.status = "done"
                call.output = {"error": f"unknown tool {name!r}; available: {available}"}
            elif tool.interrupt_only:
                problem = None if call.resumed else schema_error(call.args, tool.input_schema)
                if problem:
                    call.status = "done"
                    call.output = {"error": f"invalid arguments: {self._cut(problem)}"}
                else:
                    metadata = call.resumed_metadata if call.resumed else {}
                    book.pause(call, source="interrupt", metadata=metadata, now=now)
                    paused.append(call)
            elif self._gated(call):
                book.pause(
                    call,
                    source="approval",
                    metadata=gate_metadata(call.name),
                    now=now,
                )
                paused.append(call)
            else:
                runnable.append(call)
        if runnable:
            # One batch: every call of the message is scheduled in the same workflow task.
            await asyncio.gather(*(self._run_tool(turn, c) for c in runnable))
        return any(c.status == "pending" for c in [*paused, *runnable])

    def _cut(self, text: str) -> str:
        """Text from the model or a tool, cut to a bounded size (it names keys the model made
        up, and may be copied into many calls' responses)."""
        return cut_stored(text, MAX_NOTE_BYTES) if self._durable() else text

    def _error(self, err: ActivityError, *, what: str) -> ErrorInfo:
        error = _activity_error(err, what=what)
        if not self._durable():
            return error
        # A tool decides how long its message is, and it is kept and shown.
        return ErrorInfo(
            status=cut_stored(error.status, 40),
            message=cut_stored(error.message, MAX_NOTE_BYTES),
        )

    def _gated(self, call: CallState) -> bool:
        approval = self._s.spec.approval if self._s.spec else None
        if approval is None or call.name in approval.allow:
            return False
        return not (call.resumed and call.resumed_metadata.get(TOOL_APPROVED) is True)

    def _tool_retry(self, call: CallState) -> tuple[RetryPolicy, bool]:
        """The retry policy for this run of the call, and whether it is a single attempt.

        One approval, one run: a run a human approved (a restart) gets one attempt unless the
        tool is declared idempotent or brings its own policy. A second attempt would repeat a
        side effect the human approved once.
        """
        spec = self._s.spec
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
        if self._durable() and call.resumed and not (tool and tool.idempotent):
            return RetryPolicy(maximum_attempts=1), True
        return RetryPolicy(maximum_attempts=config.TOOL_RETRY_ATTEMPTS), False

    async def _run_tool(self, turn: TurnState, call: CallState) -> None:
        spec = self._s.spec
        tool = spec.tool(call.name) if spec else None
        retry, single = self._tool_retry(call)
        call.runs += 1
        chat_id = workflow.info().workflow_id
        try:
            result = await workflow.execute_activity(
                config.TOOL_ACTIVITY,
                ToolInput(
                    agent=self._s.agent,
                    chat_id=chat_id,
                    tool=call.name,
                    ref=call.ref,
                    args=call.args,
                    resumed=call.resumed,
                    resumed_metadata=call.resumed_metadata,
                    idempotency_key=idempotency_key(chat_id, call.ref, call.runs),
                ),
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
        except ActivityError as e:
            timed_out = isinstance(e.cause, TemporalTimeoutError)
            if self._durable() and single and call.resumed and timed_out:
                # An approved run cut short (its timeout passed, or its worker was lost): it
                # is not run again, and the model must not take it as not having happened.
                call.status = "done"
                call.output = {
                    "error": f"tool {call.name!r} timed out and was not retried",
                    "note": "it may have taken effect: check before trying again",
                }
                return
            call.status = "failed"
            call.error = self._error(e, what=f"tool {call.name!r}")
            call.uncertain = not _classified(e)
            return
        durable = self._durable()
        if result.kind == "interrupt":
            metadata = result.metadata or {}
            if durable and json_size(metadata) > self._room(turn):
                metadata = omitted(metadata, why=_over_budget("this interrupt's metadata"))
            self._book(turn).pause(call, source="tool", metadata=metadata, now=workflow.now())
        elif result.kind == "invalid_input":
            call.status = "done"
            call.output = {"error": f"invalid arguments: {self._cut(result.message or '')}"}
        else:
            output = result.output or {}
            if durable and json_size(output) > self._room(turn):
                # The tool has run: the model must hear that, in a few bytes.
                output = {
                    "error": "output too large for this turn",
                    "detail": f"{_over_budget('the output')}; it was dropped",
                }
            call.status = "done"
            call.output = output

    async def _await_answers(
        self, turn: TurnState
    ) -> Literal["answered", "cancel", "continue_as_new"]:
        book = self._book(turn)
        while True:
            if self._cancel is not None:
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
                    lambda: self._cancel is not None or book.all_answered() or self._can_now(),
                    timeout=timeout,
                    timeout_summary="interrupt deadline" if timeout is not None else None,
                )
            except TimeoutError:
                now = workflow.now()
                for call in book.expire(now):
                    if self._durable() and json_size(call.answer_output) > self._room(turn):
                        # The declared default does not fit what the turn can still hold.
                        call.answer_output = timed_out_output()
                    self._audit(call, kind="deadline", via="deadline", identity="system:deadline")
                self._trim_answers()
                self._publish()

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
    # Stop points

    def _turn_text(self, turn: TurnState) -> str:
        for m in reversed(self._s.messages[turn.base_len :]):
            if m.role == "model":
                return m.text()
        return ""

    def _stop(self, result: TurnResult) -> None:
        self._s.last_turn = result
        if self._s.turn is None:
            # Whatever ended the turn, a cancellation asked for it is spent; and the state
            # may be trimmable now that the turn is over.
            if self._edges():
                self._cancel = None
            self._can_blocked = False
        self._stops += 1
        self._publish()

    def _pause_point(self) -> None:
        turn = self._s.turn
        assert turn is not None
        self._stop(self._paused_result(turn))

    def _paused_result(self, turn: TurnState) -> TurnResult:
        return TurnResult(
            turn=turn.turn,
            finish_reason=FinishReason.INTERRUPTED,
            text=self._turn_text(turn),
            interrupts=self._book(turn).requests(),
        )

    def _last_result(self) -> TurnResult | None:
        """The latest turn's result: while paused, the pause as it stands now (a new run does
        not carry it, see workflows.history.carry)."""
        turn = self._s.turn
        if turn is not None and self._paused():
            return self._paused_result(turn)
        return self._s.last_turn

    def _finish(self, reason: FinishReason) -> None:
        turn = self._s.turn
        assert turn is not None
        result = TurnResult(turn=turn.turn, finish_reason=reason, text=self._turn_text(turn))
        self._s.turn = None
        self._stop(result)

    def _fail(self, error: ErrorInfo) -> None:
        turn = self._s.turn
        assert turn is not None
        if self._durable() and turn.model_calls > 0:
            # What happened stays in the conversation, so the next turn's model knows that
            # an approved side effect took place: every call of the step keeps a response,
            # its failure or that it never ran.
            if turn.phase == "tools" and turn.calls:
                self._book(turn).abandon(error)
                self._append(self._tool_message(turn))
        else:
            # Nothing happened yet (the model never answered), or a run from before this
            # rule: the conversation is left as it was before the turn.
            self._cut_messages(turn.base_len)
        self._s.turn = None
        workflow.logger.warning("turn %d failed: %s %s", turn.turn, error.status, error.message)
        self._stop(
            TurnResult(
                turn=turn.turn,
                finish_reason=FinishReason.FAILED,
                error=error,
            )
        )

    def _finish_cancelled(self) -> None:
        turn = self._s.turn
        assert turn is not None
        reason = self._cancel.reason if self._cancel else ""
        identity = self._cancel.identity if self._cancel else None
        self._cancel = None
        if turn.phase == "tools" and turn.calls:
            for call in self._book(turn).cancel(reason):
                self._audit(call, kind="cancel", via="cancel", identity=identity)
            self._trim_answers()
            # Every call keeps a response, so the history stays valid for the model.
            self._append(self._tool_message(turn))
        elif turn.model_calls == 0:
            # Cancelled before the model answered: as if the message was never sent.
            self._cut_messages(turn.base_len)
        # Otherwise tools already ran this turn: their results stay in the conversation, so
        # the model knows on the next turn what was done.
        result = TurnResult(
            turn=turn.turn, finish_reason=FinishReason.CANCELLED, text=self._turn_text(turn)
        )
        self._s.turn = None
        self._stop(result)

    def _cut_messages(self, n: int) -> None:
        del self._s.messages[n:]
        self._digests.cut(n)
        self._s.model_seen = min(self._s.model_seen, n)

    # ------------------------------------------------------------------------------------------
    # Updates

    async def _stopped_since(self, seen: int) -> TurnResult:
        """The result of the turn an update started or moved on, once it has stopped (ended or
        paused again): ``seen`` is the stop count read before the update acted."""
        await workflow.wait_condition(lambda: self._stops > seen)
        assert self._s.last_turn is not None
        return _fit(self._s.last_turn, UPDATE_RESULT_BUDGET)

    async def _withdraw(self, input: CancelInput) -> TurnResult:
        """Cancel the current turn: withdraw what is pending, or stop it while it runs (a model
        call in flight is abandoned, a tool is told to stop); its result once it has stopped."""
        seen = self._stops
        self._cancel = input
        if self._turn_task is not None and not self._waiting_on_human():
            self._turn_task.cancel()
        return await self._stopped_since(seen)

    @workflow.update
    async def send(self, input: SendInput) -> TurnResult:
        """Start a turn with a user message; returns when the turn ends or pauses."""
        self.validate_send(input)
        seen = self._stops
        self._start_turn(input.text)
        return await self._stopped_since(seen)

    @send.validator
    def validate_send(self, input: SendInput) -> None:
        reason = self._send_problem(input.text, agent=input.agent, size=len(input.text.encode()))
        if reason:
            raise _rejected(ErrorKind.SEND_REJECTED, reason)

    @workflow.update
    async def resume(self, payload: RawValue) -> TurnResult:
        """Answer pending interrupts; returns when the turn ends or pauses again.

        ``payload`` is a :class:`~workflows.types.ResumeInput`, taken raw so that this
        workflow, not the data converter, decides what is wrong with a bad one and says so.
        A resume that leaves interrupts unanswered returns at once, listing those still pending.
        """
        try:
            resume = self._check_resume(payload)
        except Refused as e:
            # Only reachable when a duplicate passed validation in the same task.
            raise _rejected(ErrorKind.RESUME_REJECTED, e.reason) from None
        seen = self._stops
        turn = self._apply_resume(resume, via="update")
        if not self._book(turn).all_answered():
            return _fit(self._paused_result(turn), UPDATE_RESULT_BUDGET)
        return await self._stopped_since(seen)

    @resume.validator
    def validate_resume(self, payload: RawValue) -> None:
        try:
            self._check_resume(payload)
        except Refused as e:
            workflow.logger.info("resume rejected (update): %s", e.reason)
            raise _rejected(ErrorKind.RESUME_REJECTED, e.reason) from None

    @workflow.update
    async def cancel(self, input: CancelInput) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn); ends it ``cancelled``."""
        self.validate_cancel(input)
        return await self._withdraw(input)

    @cancel.validator
    def validate_cancel(self, input: CancelInput) -> None:
        if self._s.turn is None:
            raise _rejected(
                ErrorKind.CANCEL_REJECTED, "nothing to cancel: no turn is running or paused"
            )
        if self._cancel is not None:
            raise _rejected(ErrorKind.CANCEL_REJECTED, "a cancellation is already under way")
        self._check_cancel_input(input)

    def _check_cancel_input(self, input: CancelInput) -> None:
        if not self._durable():
            return
        try:
            # The reason is copied into every withdrawn call's response, so it stays short.
            check_text(input.reason, what="reason", limit=MAX_REASON_BYTES)
            if input.identity is not None:
                check_label(input.identity, what="identity", limit=MAX_IDENTITY_BYTES)
        except Refused as e:
            raise _rejected(ErrorKind.CANCEL_REJECTED, e.reason) from None

    @workflow.update
    async def await_turn(self) -> TurnResult | None:
        """The latest turn's result, once the current turn (if any) has paused or ended."""
        await workflow.wait_condition(lambda: self._s.turn is None or self._waiting_on_human())
        result = self._last_result()
        return _fit(result, UPDATE_RESULT_BUDGET) if result is not None else None

    @workflow.update
    async def close(self, input: CancelInput) -> ConversationResult:
        """End the conversation: withdraw anything pending and complete the workflow."""
        self._check_cancel_input(input)
        if self._s.turn is not None:
            await self._withdraw(input)
        self._s.closed = True
        return self._result()

    @close.validator
    def validate_close(self, input: CancelInput) -> None:
        if self._s.closed:
            raise _rejected(ErrorKind.SEND_REJECTED, "this conversation is already closed")
        self._check_cancel_input(input)

    # ------------------------------------------------------------------------------------------
    # Signals: every signal name lands here with raw payloads, so a malformed one (bad JSON,
    # wrong types, zero or two arguments) is recorded instead of failing the workflow task.

    @workflow.signal(dynamic=True)
    def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        try:
            if len(args) != 1:
                raise ResumeError(
                    f"signal {name!r} takes exactly one JSON argument, got {len(args)}"
                )
            payload = args[0]
            if name == "resume":
                resume = self._check_resume(payload)
                self._apply_resume(resume, via="signal")
            elif name == "send":
                self._send_signal(payload)
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

    def _send_signal(self, payload: RawValue) -> None:
        size = len(payload.payload.data)
        durable = self._durable()
        if durable:
            # Size first: an oversized payload is refused before it is even parsed.
            check_size(size, limit=MAX_SEND_BYTES, what="message")
        body = self._payload_json(payload)
        check_json(body, what="send", finite=durable, depth=self._depth())
        try:
            input = SendInput.model_validate(body)
        except ValidationError as e:
            raise ResumeError(f"malformed send: {pydantic_reason(e)}") from None
        problem = self._send_problem(input.text, agent=input.agent, size=size)
        if problem:
            raise ResumeError(problem)
        self._start_turn(input.text)

    def _reject(self, *, handler: str, reason: str, payload: Sequence[RawValue]) -> None:
        """Record a refused signal (an update's refusal goes back to its caller instead).

        The record keeps the payload's digest, never its bytes, and only storable text: the
        log itself must never become what cannot be serialized.
        """
        raw = b"".join(p.payload.data for p in payload)
        identity = _claimed_identity(payload)
        if self._durable():
            identity = cut_stored(identity, 200) if identity is not None else None
            handler = cut_stored(handler, 200)
            reason = cut_stored(reason[:MAX_REASON_CHARS], 600)
            fingerprint = digest(raw)
        else:
            # As the code these runs began under recorded it (see _state_for_next_run), except
            # that a lone surrogate, which no state holding it could ever be stored with, is
            # replaced.
            if identity is not None:
                identity = identity.encode("utf-8", "replace").decode("utf-8")[:200]
            reason = reason[:MAX_REASON_CHARS]
            fingerprint = _legacy_digest(raw)
        self._s.rejections.append(
            Rejection(
                at=workflow.now(),
                via="signal",
                handler=handler,
                reason=reason,
                identity=identity,
                digest=fingerprint,
            )
        )
        self._s.rejections_total += 1
        del self._s.rejections[:-MAX_REJECTIONS_KEPT]
        workflow.logger.warning(
            "rejected %r signal from %r: %s", handler, identity or "unknown sender", reason
        )
        self._publish()

    def _payload_json(self, payload: RawValue) -> object:
        encoding = payload.payload.metadata.get("encoding", b"")
        if encoding == b"binary/null":
            raise ResumeError("the payload is empty; send a JSON object")
        if encoding not in (b"json/plain", b""):
            raise ResumeError(
                f"the payload must be JSON, got encoding {encoding.decode(errors='replace')!r}"
            )
        return decode_json(payload.payload.data, strict=self._durable())

    # ------------------------------------------------------------------------------------------
    # Shared by the signal and update paths

    def _paused(self) -> bool:
        """Whether the turn waits on a human: some interrupt has no answer yet."""
        turn = self._s.turn
        return turn is not None and turn.phase == "tools" and bool(self._book(turn).pending())

    def _waiting_on_human(self) -> bool:
        """Paused, and nothing else to do: no sibling call is still running.

        Interrupts are recorded before their siblings run, so a turn can have pending
        interrupts while tools are still at work; its pause is only reported after them.
        """
        turn = self._s.turn
        if turn is None or not self._edges():
            return self._paused()
        return self._paused() and not any(c.status == "ready" for c in turn.calls)

    def _book(self, turn: TurnState) -> InterruptBook:
        return InterruptBook(turn.calls, spec=self._s.spec, known_refs=self._refs)

    def _send_problem(self, text: str, *, agent: str | None, size: int) -> str | None:
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
            check_size(size, limit=MAX_SEND_BYTES, what="message")
            if self._durable():
                # As stored: a control character takes six bytes of JSON.
                check_text(text, what="the message", limit=MAX_SEND_BYTES)
        except Refused as e:
            return e.reason
        if self._s.turn is not None:
            if self._paused():
                pending = ", ".join(
                    f"{c.name} (ref {c.ref})" for c in self._book(self._s.turn).pending()
                )
                return (
                    "the conversation is paused on interrupts; answer them with resume or "
                    f"withdraw them with cancel first. Pending: {pending}"
                )
            return "a turn is already running; wait for it to finish"
        return None

    def _start_turn(self, text: str) -> None:
        self._s.turns += 1
        self._s.turn = TurnState(
            turn=self._s.turns,
            started_at=workflow.now(),
            base_len=len(self._s.messages),
            held=0 if self._durable() else None,
        )
        self._append(Message(role="user", parts=[Part(text=text)]))
        self._publish()

    def _check_resume(self, payload: RawValue) -> ResumeInput:
        turn = self._s.turn
        if turn is None or not self._paused():
            raise ResumeError("nothing is paused: this conversation has no pending interrupts")
        size = len(payload.payload.data)
        try:
            # Size first: an oversized payload is refused before it is even parsed.
            check_size(size, limit=MAX_RESUME_BYTES, what="resume")
        except Refused as e:
            raise ResumeError(e.reason) from None
        durable = self._durable()
        return self._book(turn).validate(
            self._payload_json(payload),
            strict=durable,
            room=self._room(turn) if durable else None,
        )

    def _apply_resume(self, resume: ResumeInput, *, via: Literal["update", "signal"]) -> TurnState:
        turn = self._s.turn
        assert turn is not None
        for call in self._book(turn).apply(resume):
            self._audit(
                call,
                kind=call.answer or "respond",
                via=via,
                identity=resume.identity,
                metadata=resume.metadata,
            )
        self._trim_answers()
        self._publish()
        return turn

    def _audit(
        self,
        call: CallState,
        *,
        kind: Literal["respond", "restart", "cancel", "deadline"],
        via: Literal["update", "signal", "deadline", "cancel"],
        identity: str | None = None,
        metadata: dict[str, object] | None = None,
    ) -> None:
        big = metadata is not None and json_size(metadata) > MAX_AUDIT_METADATA_BYTES
        if big and self._durable():
            # Kept as what identifies it: the record is copied for every answer of a resume.
            metadata = omitted(metadata, why="resume metadata over 4 KiB; its digest is kept")
        self._s.answers.append(
            AnswerRecord(
                at=workflow.now(),
                ref=call.ref,
                name=call.name,
                kind=kind,
                via=via,
                identity=identity,
                metadata=metadata,
            )
        )

    def _trim_answers(self) -> None:
        if self._durable():
            self._s.answers_dropped += trim_answers(self._s.answers)
        else:
            del self._s.answers[:-MAX_ANSWERS_KEPT]

    # ------------------------------------------------------------------------------------------
    # Queries: each result is cut to fit Temporal's payload limit, with stated placeholders.

    @workflow.query
    def pending(self) -> PendingResult:
        turn = self._s.turn
        result = PendingResult(interrupts=self._book(turn).requests() if turn else [])
        return _fit(result, QUERY_BUDGET)

    @workflow.query
    def status(self) -> StatusResult:
        turn = self._s.turn
        carried = self._state_for_next_run()
        result = StatusResult(
            chat_id=workflow.info().workflow_id,
            agent=self._s.agent,
            status=self._status(),
            turns=self._s.turns,
            model=self._s.spec.model if self._s.spec else None,
            pending=self._book(turn).requests() if turn else [],
            last_turn=self._last_result(),
            rejections=self._s.rejections_total,
            carried_bytes=json_size(carried) if carried is not None else None,
        )
        return _fit(result, QUERY_BUDGET)

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
        room = QUERY_BUDGET - json_size(answers) - 1024
        start = page_back(messages, end=end, budget=room)
        result = HistoryResult(
            messages=messages[start:end],
            answers=answers,
            dropped_messages=self._s.dropped_messages,
            start=start,
            answers_dropped=self._s.answers_dropped,
        )
        return _fit(result, QUERY_BUDGET)

    @workflow.query
    def messages(self, input: MessagesInput) -> MessagesResult:
        """A slice of the conversation; the model activity asks when it lacks the start.

        A slice too large for one result stops early, with ``next`` where to go on.
        """
        messages = self._s.messages
        end = len(messages) if input.end is None else max(0, min(input.end, len(messages)))
        start = max(0, min(input.start, end))
        stop = page(messages, start=start, end=end, budget=QUERY_BUDGET - 1024)
        return MessagesResult(messages=messages[start:stop], next=stop if stop < end else None)

    @workflow.query
    def rejections(self) -> RejectionsResult:
        result = RejectionsResult(rejections=self._s.rejections, total=self._s.rejections_total)
        return _fit(result, QUERY_BUDGET)

    # ------------------------------------------------------------------------------------------
    # What operators see: search attributes, memo and the UI's current details.

    def _status(self) -> AgentStatus:
        if self._s.closed:
            return "closed"
        if self._s.turn is None:
            return "idle"
        return "interrupted" if self._paused() else "running"

    def _publish(self) -> None:
        turn = self._s.turn
        pending = self._book(turn).pending() if turn else []
        status = self._status()
        since = min((c.since for c in pending if c.since), default=None)
        names = sorted({c.name for c in pending})
        if self._durable():
            names = _fit_names(names)
        state = (status, tuple(names), since)
        if state != self._published:
            self._upsert_search_attributes(status, names, since)
            self._published = state
        memo = [
            {"name": c.name, "ref": c.ref, "input": truncate(json.dumps(c.args), 200)}
            for c in pending
        ]
        if self._memo_pending is None and self._edges():
            # An empty list does not survive the trip into a memo (measured: a start with
            # {"pending": []} records no memo at all), so absent means nothing pending, and
            # a new run need not spend an event writing [].
            self._memo_pending = []
        if memo != self._memo_pending:
            workflow.upsert_memo({"pending": memo})
            self._memo_pending = memo
        workflow.set_current_details(
            render_details(
                chat_id=workflow.info().workflow_id,
                agent=self._s.agent,
                status=status,
                turns=self._s.turns,
                spec=self._s.spec,
                pending=pending,
                last_turn=self._s.last_turn,
                rejections=self._s.rejections,
                rejections_total=self._s.rejections_total,
            )
        )

    def _upsert_search_attributes(
        self, status: AgentStatus, names: list[str], since: datetime | None
    ) -> None:
        current = workflow.info().typed_search_attributes
        updates = []
        if current.get(config.AGENT_NAME) != self._s.agent:
            updates.append(config.AGENT_NAME.value_set(self._s.agent))
        if current.get(config.AGENT_STATUS) != status:
            updates.append(config.AGENT_STATUS.value_set(status))
        if (current.get(config.PENDING_INTERRUPTS) or []) != names:
            updates.append(
                config.PENDING_INTERRUPTS.value_set(names)
                if names
                else config.PENDING_INTERRUPTS.value_unset()
            )
        if current.get(config.INTERRUPTED_SINCE) != since:
            updates.append(
                config.INTERRUPTED_SINCE.value_set(since)
                if since
                else config.INTERRUPTED_SINCE.value_unset()
            )
        if updates:
            workflow.upsert_search_attributes(updates)


def idempotency_key(chat_id: str, ref: str, run: int) -> str:
    """``ToolContext.idempotency_key``: the same for every attempt and replay of one run of a
    call (one approval), different for the next run; fixed-length for any far-side API."""
    return hashlib.sha256(f"{chat_id}\0{ref}\0{run}".encode()).hexdigest()[:32]


def _fit_names(names: list[str]) -> list[str]:
    """The pending tool names that fit one search-attribute value (Temporal's default limit
    is 2 KiB a value): a reply may pause on many tools, with long names."""
    kept: list[str] = []
    total = 2
    for name in names:
        total += stored_size(name) + 3
        if total > 1536:
            break
        kept.append(name)
    return kept


def _over_budget(what: str) -> str:
    return f"{what} did not fit in what this turn can still hold ({human_size(TURN_BUDGET)} in all)"


def _claimed_identity(payload: Sequence[RawValue]) -> str | None:
    """The sender's identity, if the payload names one; never raises (used on bad input)."""
    if len(payload) != 1:
        return None
    try:
        body = json.loads(payload[0].payload.data)
    except Exception:  # noqa: BLE001  # any malformed payload simply has no identity
        return None
    identity = body.get("identity") if isinstance(body, dict) else None
    return identity if isinstance(identity, str) else None


def _legacy_digest(raw: bytes) -> str:
    """The rejection digest of runs begun before the durable-input rules (with an excerpt of
    the payload, which new runs never keep)."""
    h = hashlib.sha256(raw).hexdigest()[:12]
    text = raw[:120].decode("utf-8", errors="replace")
    return f"sha256:{h} {len(raw)}B {text}{'…' if len(raw) > 120 else ''}"


def _classified(err: ActivityError) -> bool:
    """Whether the tool itself said how it failed (a ``ToolError``)."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    )


def _activity_error(err: ActivityError, *, what: str) -> ErrorInfo:
    """A classified error for the caller. Unclassified failures keep their text in history only."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.MODEL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    ):
        status = str(cause.details[0]) if cause.details else Status.INTERNAL
        return ErrorInfo(status=status, message=cause.message)
    if isinstance(cause, TemporalTimeoutError):
        return ErrorInfo(status=Status.DEADLINE_EXCEEDED, message=f"{what} timed out")
    return ErrorInfo(status=Status.INTERNAL, message=f"{what} failed")

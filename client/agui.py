"""AG-UI 1.0 (the Agent-User Interaction protocol) for every agent: the mapping both ways.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The types and the encoder are the ``ag-ui-protocol`` package's; this module only decides what
each of a conversation's events becomes, and what each resume entry answers.

==============================  ===============================================================
AG-UI                           here
==============================  ===============================================================
thread (``threadId``)           a chat (its workflow id)
run                             a turn: a user message sent, or answers given
``TEXT_MESSAGE_*``              the model's text (``text`` events), one message per model reply
``TOOL_CALL_START/ARGS/END``    a tool the model asked for (``tool_request``); toolCallId = ref
``TOOL_CALL_RESULT``            what the model is told of it (``tool_response``)
``CUSTOM`` ``answer``           an answer applied (who, what kind, the decision)
``RUN_FINISHED`` interrupt      the turn paused: one interrupt per pending call, id = ref (a
                                sub-agent's: toolCallId = the call running it, metadata
                                ``path`` and ``chatId``)
``RUN_FINISHED`` success        the turn ended (``stop``, ``max_turns``)
``RUN_FINISHED`` cancelled      the turn was cancelled
``RUN_ERROR``                   the turn failed, or what was sent was refused (the reason, and
                                the refusal's kind as ``code``)
``resume[]``                    answers: ``resolved`` approves (or, with ``approved: false``,
                                denies) a gated call, responds to an interrupt-only one, edits
                                an editable one with ``input``; ``cancelled`` denies
==============================  ===============================================================

Each frame's SSE id is ``<run start>/<offset>.<n>``: the stream offset of the conversation
event it comes from, the frame's place among that event's frames, and the offset the run began
at. A client that reconnects with ``Last-Event-ID`` gets the frames after it, recomputed from
the conversation's own stream, so there is no gap and no duplicate.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    ResumeEntry,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.encoder import EventEncoder

from temporal_agent_interrupts.workflows.limits import DOOR, Refused, check_label
from temporal_agent_interrupts.workflows.types import (
    APPROVED,
    TOOL_APPROVED,
    FinishReason,
    InterruptRequest,
    JsonObject,
    ToolResponse,
    ToolRestart,
    TurnEvent,
    TurnResult,
    input_digest,
)
from temporal_agent_interrupts.workflows.types import Message as ChatMessage

ANSWER_EVENT = "answer"
"""The ``CUSTOM`` event's name for an answer the conversation applied."""

REASON_APPROVAL = "tool_call"
"""An interrupt's ``reason`` when it asks to approve a tool call (a gated or conditional tool):
AG-UI's core value for an interrupt bound to a tool call awaiting a decision."""

REASON_INPUT = "input_required"
"""An interrupt's ``reason`` when it asks for the tool's output (an interrupt-only tool)."""

DIGEST_KEY = "inputDigest"
"""The key, in an interrupt's ``metadata`` and optionally in a resume entry's, of the digest of
the input shown: an answer carrying it is refused if the call's input has changed since."""

_FRAME_ID = re.compile(r"(\d{1,15})/(\d{1,15})\.(\d{1,6})")

_ENCODER = EventEncoder()

FramePos = tuple[int, int]
"""Where a frame is: the offset of the event it comes from, and its place among its frames."""


class BadResume(ValueError):
    """A resume entry that cannot become an answer; the message says why."""

    def __init__(self, message: str, *, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


def approval_schema(request: InterruptRequest) -> JsonObject:
    """The ``responseSchema`` of an approval: approve or not, why, and (for an editable tool)
    the input to run it with instead."""
    properties: JsonObject = {
        APPROVED: {"type": "boolean"},
        "reason": {"type": "string", "description": "Why, when denied; the model is told."},
    }
    if request.editable:
        properties["input"] = {
            "type": "object",
            "description": "Run the tool with this input instead (a full replacement).",
        }
    return {"type": "object", "properties": properties, "required": [APPROVED]}


# The interrupts answered with data fitting their responseSchema: an interrupt-only tool's,
# and a form an MCP server asked for. The rest are approvals ({"approved": ...}).
_ANSWERED_WITH_DATA = ("interrupt", "input")


def to_interrupt(request: InterruptRequest) -> Interrupt:
    """One pending call as an AG-UI interrupt: id and toolCallId are its ref.

    A sub-agent's call (``agent_tool``) is no tool call of this thread: its id is still its
    ref (what a resume names), its ``toolCallId`` the thread's call that is running the
    sub-agent (the path's first ref), and ``metadata`` carries the ``path`` and the ``chatId``
    it waits in.
    """
    approval = request.source not in _ANSWERED_WITH_DATA
    message = _message(request, approval=approval)
    return Interrupt(
        id=request.ref,
        reason=REASON_APPROVAL if approval else REASON_INPUT,
        message=message,
        tool_call_id=request.path[0] if request.path else request.ref,
        response_schema=(
            approval_schema(request) if approval else (request.output_schema or {"type": "object"})
        ),
        expires_at=request.deadline.isoformat() if request.deadline else None,
        metadata={
            "tool": request.name,
            "input": request.input,
            DIGEST_KEY: request.input_digest,
            "source": request.source,
            "editable": request.editable,
            "approvers": request.approvers,
            "quorum": request.quorum,
            "votes": [v.model_dump(mode="json") for v in request.votes],
            "requester": (
                request.requester.model_dump(mode="json", include={"identity", "verified"})
                if request.requester is not None
                else None
            ),
            "since": request.since.isoformat() if request.since else None,
            # What a person is shown of the call (the summary, fields, risk, why it waits, the
            # user's request and the model's words): render this, not ``input`` or ``details``.
            "shown": request.shown.model_dump(mode="json") if request.shown else None,
            "details": request.metadata,
            **({"path": list(request.path), "chatId": request.chat_id} if request.path else {}),
        },
    )


def _message(request: InterruptRequest, *, approval: bool) -> str:
    """The interrupt's words for a person: the call's summary and why it waits (``shown``);
    the gate's own message ("Tool not in approved list: X") is for programs, and stays in
    ``metadata.details``. A request with nothing shown (a conversation older than ``shown``)
    keeps what it said before."""
    shown = request.shown
    if shown is not None and shown.summary:
        return f"{shown.summary} — {shown.why}" if shown.why else shown.summary
    said = request.metadata.get("message")
    if isinstance(said, str) and said:
        return said
    return f"Approve {request.name}?" if approval else f"{request.name} needs your answer"


def to_answer(
    entry: ResumeEntry, pending: dict[str, InterruptRequest]
) -> ToolResponse | ToolRestart:
    """A resume entry as the answer it gives, built from the call it answers.

    Raises:
        BadResume: the entry names no pending call, or its payload is not an answer to it.
    """
    request = pending.get(entry.interrupt_id)
    if request is None:
        listing = ", ".join(f"{r.name} ({ref})" for ref, r in pending.items()) or "none"
        raise BadResume(
            f"no pending interrupt has id {entry.interrupt_id[:200]!r}; pending: {listing}",
            code="not_found",
        )
    shown = (entry.metadata or {}).get(DIGEST_KEY)
    if shown is not None:
        if not isinstance(shown, str):
            raise BadResume(f"metadata.{DIGEST_KEY} must be a string")
        request = request.model_copy(update={"input_digest": shown})
    if entry.status == "cancelled":
        return request.deny("cancelled")
    return answer_from(request, entry.payload, digest_shown=shown is not None)


def answer_from(
    request: InterruptRequest, payload: Any, *, digest_shown: bool
) -> ToolResponse | ToolRestart:
    """A payload (an object fitting :func:`approval_schema`, or an interrupt-only tool's
    output) as the answer it gives to ``request`` (whose ``input_digest`` is the one shown, when
    ``digest_shown``): the one reading of an approval for AG-UI and the MCP server alike.

    Raises:
        BadResume: the payload is not an answer to it.
    """
    if not isinstance(payload, dict):
        raise BadResume(
            f"the payload for {request.name!r} ({request.ref}) must be an object "
            + (
                f'like {{"{APPROVED}": true}}'
                if request.source not in _ANSWERED_WITH_DATA
                else "fitting its responseSchema"
            )
        )
    body: JsonObject = payload
    if request.source in _ANSWERED_WITH_DATA:
        return request.respond(body)
    approved = body.get(APPROVED)
    if not isinstance(approved, bool):
        raise BadResume(
            f"the payload for {request.name!r} ({request.ref}) needs {APPROVED!r}: true or false"
        )
    unknown = set(body) - {APPROVED, "reason", "input"}
    if unknown:
        raise BadResume(f"unknown payload keys {sorted(unknown)[:5]}: use approved, reason, input")
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise BadResume("the payload's reason must be a string")
    if not approved:
        return request.deny(reason)
    edited = body.get("input")
    if edited is not None:
        if not isinstance(edited, dict):
            raise BadResume("the payload's input must be an object (the tool's whole input)")
        return request.restart({TOOL_APPROVED: True}, input=edited)
    if request.editable and not digest_shown:
        # An editable call's input may have changed since the run that showed it (an edit
        # the gate holds for more approvals keeps the ref): only the digest says which input
        # this approval is for. A non-editable call's input is the one it paused with.
        raise BadResume(
            f"{request.name!r} ({request.ref}) can be edited, so its approval must say which "
            f"input it approves: send metadata.{DIGEST_KEY} from the interrupt shown"
        )
    return request.approve()


def messages_snapshot(
    thread_id: str, messages: Sequence[ChatMessage], pending: Sequence[InterruptRequest]
) -> MessagesSnapshotEvent:
    """The conversation's messages as AG-UI messages.

    Tool calls keep the model's call id where it gave one; otherwise a call is named by its
    place, and a pending call by its ref (matched by tool name and input), so the interrupts
    of a paused turn name calls the snapshot holds.
    """
    by_digest = {(r.name, r.input_digest): r.ref for r in pending}
    out: list[Message] = []
    # The ids the last model message's calls got, in call order: its responses follow it.
    last_calls: list[str] = []
    for i, message in enumerate(messages):
        texts = [p.text for p in message.parts if p.text and not p.thought]
        if message.role == "model":
            calls: list[ToolCall] = []
            last_calls = []
            for j, part in enumerate(message.parts):
                fc = part.function_call
                if fc is None:
                    continue
                ref = fc.id or by_digest.get((fc.name, input_digest(fc.args))) or f"{i}.{j}"
                last_calls.append(ref)
                calls.append(
                    ToolCall(
                        id=ref,
                        function=FunctionCall(name=fc.name, arguments=json.dumps(fc.args)),
                    )
                )
            out.append(
                AssistantMessage(
                    id=f"{thread_id}:message:{i}",
                    content="".join(texts) or None,
                    tool_calls=calls or None,
                )
            )
            continue
        responses = [p.function_response for p in message.parts if p.function_response]
        for j, fr in enumerate(responses):
            call_id = fr.id or (last_calls[j] if j < len(last_calls) else f"{i}.{j}")
            out.append(
                ToolMessage(
                    id=f"{thread_id}:message:{i}.{j}",
                    tool_call_id=call_id,
                    content=json.dumps(fr.response),
                )
            )
        if texts:
            out.append(UserMessage(id=f"{thread_id}:message:{i}", content="".join(texts)))
    return MessagesSnapshotEvent(messages=out)


def user_message_id(messages: Sequence[Message]) -> str | None:
    """The new user message's id as the send's ``message_id``: a run posted again with the
    same message (a client's retry) joins the turn it started. An id that is no fit for one
    (too long, control characters) is used by its digest; an empty one is none."""
    message_id = messages[-1].id
    if not message_id:
        return None
    try:
        check_label(message_id, what="the message id", limit=DOOR.message_id)
    except Refused:
        return "agui-" + hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
    return message_id


def user_text(messages: Sequence[Message]) -> str | None:
    """The new user message of a run: the last message, when it is the user's."""
    if not messages or not isinstance(messages[-1], UserMessage):
        return None
    content = messages[-1].content
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content)


def parse_frame_id(value: str) -> tuple[int, FramePos]:
    """``Last-Event-ID`` read back: the run's start, and the frame's place.

    Raises:
        ValueError: not an id this app sent.
    """
    found = _FRAME_ID.fullmatch(value.strip())
    if found is None:
        raise ValueError(
            "Last-Event-ID is not an id this app sent (<run start>/<offset>.<n>, all digits)"
        )
    start, offset, n = (int(g) for g in found.groups())
    if offset < start:
        raise ValueError("Last-Event-ID names an event before its run's start")
    return start, (offset, n)


def encode(event: BaseEvent, frame_id: str | None = None) -> str:
    """One SSE frame, with the package's encoder (and the id line before it)."""
    data = _ENCODER.encode(event)
    return f"id: {frame_id}\n{data}" if frame_id else data


class RunFrames:
    """One run's frames, from its conversation events: feed them in offset order.

    Stateless across runs and deterministic: the same events give the same frames with the same
    ids, which is what lets a reconnecting client be served the rest of a run from the stream.
    """

    def __init__(
        self, *, thread_id: str, run_id: str, start: int, show_messages: bool = True
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.start = start
        # Whether this run may carry the thread's messages (MESSAGES_SNAPSHOT): a caller who
        # may send or answer but not read gets the outcome without them.
        self.show_messages = show_messages
        self._offset = start
        self._n = 0
        self._text: str | None = None  # the open text message's id
        self.ended = False
        self.answers_only = True

    def _framed(self, events: list[BaseEvent], offset: int) -> list[tuple[FramePos, BaseEvent]]:
        if offset != self._offset:
            self._offset, self._n = offset, 0
        framed = []
        for event in events:
            framed.append(((offset, self._n), event))
            self._n += 1
        return framed

    def frame_id(self, pos: FramePos) -> str:
        return f"{self.start}/{pos[0]}.{pos[1]}"

    def started(self) -> list[tuple[FramePos, BaseEvent]]:
        """``RUN_STARTED``: the first frame of the run's first event."""
        return self._framed(
            [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id)], self.start
        )

    def _close_text(self) -> list[BaseEvent]:
        if self._text is None:
            return []
        message_id, self._text = self._text, None
        return [TextMessageEndEvent(message_id=message_id)]

    def feed(self, event: TurnEvent) -> list[tuple[FramePos, BaseEvent]]:
        """The frames of one conversation event (``turn_end`` gives its run's last frames)."""
        out: list[BaseEvent] = []
        if event.kind != "answer":
            self.answers_only = False
        if event.kind == "text":
            if event.text:
                if self._text is None:
                    self._text = f"{self.thread_id}:text:{event.offset}"
                    out.append(TextMessageStartEvent(message_id=self._text, role="assistant"))
                out.append(TextMessageContentEvent(message_id=self._text, delta=event.text))
        elif event.kind == "tool_request" and event.ref and event.name:
            parent = self._text
            out.extend(self._close_text())
            out.append(
                ToolCallStartEvent(
                    tool_call_id=event.ref, tool_call_name=event.name, parent_message_id=parent
                )
            )
            out.append(ToolCallArgsEvent(tool_call_id=event.ref, delta=json.dumps(event.input)))
            out.append(ToolCallEndEvent(tool_call_id=event.ref))
        elif event.kind == "tool_response" and event.ref:
            out.extend(self._close_text())
            told: JsonObject = (
                event.output
                if event.output is not None
                else {"error": event.error.model_dump(mode="json") if event.error else None}
            )
            out.append(
                ToolCallResultEvent(
                    message_id=f"{self.thread_id}:result:{event.ref}",
                    tool_call_id=event.ref,
                    content=json.dumps(told),
                    role="tool",
                )
            )
        elif event.kind == "answer" and event.answer is not None:
            out.append(
                CustomEvent(
                    name=ANSWER_EVENT,
                    value={
                        "ref": event.ref,
                        "tool": event.name,
                        "kind": event.answer.kind,
                        "decision": event.answer.decision,
                        "identity": event.answer.identity,
                        "verified": event.answer.identity_verified,
                    },
                )
            )
        elif event.kind == "turn_end":
            out.extend(self._close_text())
        return self._framed(out, event.offset)

    def finished(
        self,
        result: TurnResult,
        *,
        offset: int,
        snapshot: MessagesSnapshotEvent | None = None,
        pending: Sequence[InterruptRequest] | None = None,
    ) -> list[tuple[FramePos, BaseEvent]]:
        """The run's last frames for ``result``, as frames of the event at ``offset``.

        Args:
            snapshot: The conversation's messages, sent before an interrupt outcome (the spec
                asks for the state a resume needs before the run that pauses finishes), and
                before any other outcome of a run whose message was a repeat.
            pending: Every pending call, when ``result`` lists only some (a result is cut to
                fit; ``interrupts_omitted`` counts the rest).
        """
        self.ended = True
        out: list[BaseEvent] = [*self._close_text()]
        reason = result.finish_reason
        if snapshot is not None:
            out.append(snapshot)
        if reason == FinishReason.INTERRUPTED:
            requests = list(pending) if pending is not None else result.interrupts
            if requests:
                out.append(
                    RunFinishedEvent(
                        thread_id=self.thread_id,
                        run_id=self.run_id,
                        outcome=RunFinishedInterruptOutcome(
                            interrupts=[to_interrupt(r) for r in requests]
                        ),
                    )
                )
            else:  # answered meanwhile, by someone else: nothing is waited for
                out.append(self._success(result))
        elif reason == FinishReason.FAILED:
            error = result.error
            out.append(
                RunErrorEvent(
                    message=error.message if error else "the turn failed",
                    code=snake(error.kind or error.status) if error else "failed",
                )
            )
        elif reason == FinishReason.CANCELLED:
            out.append(
                RunFinishedEvent(
                    thread_id=self.thread_id,
                    run_id=self.run_id,
                    outcome=RunFinishedCancelledOutcome(),
                )
            )
        else:
            out.append(self._success(result))
        return self._framed(out, offset)

    def _success(self, result: TurnResult) -> RunFinishedEvent:
        return RunFinishedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            result={"text": result.text, "finishReason": result.finish_reason.value},
            outcome=RunFinishedSuccessOutcome(),
        )

    @property
    def last(self) -> int:
        """The offset of the event the latest frames came from."""
        return self._offset


def snake(kind: str) -> str:
    """A product error kind (``UnknownAgent``, ``ModelError``) or status (``INTERNAL``) as the
    snake-case ``code`` every ``RUN_ERROR`` and problem body uses (``unknown_agent``)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", kind).lower()


def refusal(message: str, code: str) -> str:
    """A refused run: one ``RUN_ERROR`` frame, with no id (nothing of the stream to resume)."""
    return encode(RunErrorEvent(message=message, code=code))

"""Turn events: what a turn did, in order; the spine the projections are computed from.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The turn state machine (``workflows/turn.py``) and the interrupt book
(``workflows/interrupts.py``) make every change to a turn through a transition that emits one
of these, and nothing else changes a turn behind their back. Each emitted event goes to
:func:`record`, which stamps it and keeps it, and then to the projections: the audit log
(``workflows/audit.py``), the operator view (``workflows/operator_view.py``) and, next, the
stream a client reads.

Pure code with no Temporal imports: the workflow supplies the time and the turn number, so the
same events come out on replay, and the tests build them without a server.

What the conversation keeps: the newest :data:`MAX_EVENTS_KEPT` events without their payloads
(inputs, outputs, text and results live in the messages, the calls and the answer log, and a
second copy would count against the turn's budget), at most :data:`MAX_STORED_EVENT_BYTES`
each; ``events_total`` counts them all, so offsets keep increasing across continue-as-new.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from temporal_agent_interrupts.workflows.input_rounds import declined, shown_digest
from temporal_agent_interrupts.workflows.limits import (
    KiB,
    cut_stored,
    json_size,
    shrink,
    stored_size,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
)
from temporal_agent_interrupts.workflows.types import (
    APPROVED,
    TOOL_APPROVED,
    AnswerKind,
    AnswerVia,
    Decision,
    ErrorInfo,
    GateDecision,
    Grant,
    InterruptRequest,
    JsonObject,
    Shown,
    TurnAnswer,
    TurnEvent,
    TurnResult,
)

MAX_EVENTS_KEPT = 128
"""Events the conversation's state keeps (the newest); the total counts on."""

MAX_STORED_EVENT_BYTES = 1 * KiB
"""The most one kept event takes as stored JSON (names and identities are cut to fit)."""

# --------------------------------------------------------------------------------------------
# The events, built from the call they are about. Offsets, times and the turn are stamped by
# record().


def text(text: str) -> TurnEvent:
    """The model's visible text of one reply."""
    return TurnEvent(kind="text", text=text)


def tool_request(call: CallState) -> TurnEvent:
    """The model asked for a tool call."""
    return TurnEvent(kind="tool_request", name=call.name, ref=call.ref, input=call.args)


def interrupt(call: CallState, request: InterruptRequest | None = None) -> TurnEvent:
    """A call paused for a human (an interrupt-only tool, the approval gate, or a tool that
    raised an interrupt), or its deadline moved (an escalation)."""
    return TurnEvent(
        kind="interrupt",
        name=call.name,
        ref=call.ref,
        input=call.args,
        interrupt=request or to_request(call),
    )


def answer(
    call: CallState,
    *,
    kind: AnswerKind,
    via: AnswerVia,
    identity: str | None = None,
    verified: bool = False,
    metadata: JsonObject | None = None,
    output: JsonObject | None = None,
    decision: Decision | None = None,
    original_input: JsonObject | None = None,
    grant: str | None = None,
    granted_by: list[str] | None = None,
    subject: str | None = None,
    token_key_id: str | None = None,
) -> TurnEvent:
    """An interrupt was answered: by a caller (respond, restart, edit, a vote), its deadline
    or a cancel.

    Args:
        decision: What the answer decided, when the caller knows better than :func:`decision`
            (a vote, an edit).
        original_input: An edit's input before the edit (``input`` is the edited one).
    """
    return TurnEvent(
        kind="answer",
        name=call.name,
        ref=call.ref,
        input=call.args,
        output=output,
        answer=TurnAnswer(
            kind=kind,
            via=via,
            identity=identity,
            identity_verified=verified,
            metadata=metadata,
            decision=decision or _decision(call, kind=kind, output=output),
            original_input=original_input,
            gate=gate_of_call(call),
            grant=grant,
            granted_by=granted_by,
            requester=call.requester,
            subject=subject if verified else None,
            token_key_id=token_key_id if verified else None,
        ),
    )


def grant_ended(
    grant: Grant,
    *,
    via: AnswerVia,
    identity: str | None,
    decision: Decision,
    reason: str = "",
) -> TurnEvent:
    """A grant ended: revoked (``revoked``) or at its ``until`` (``expired``). Recorded
    against the call whose approval made it."""
    return TurnEvent(
        kind="answer",
        name=grant.tool,
        ref=grant.ref,
        answer=TurnAnswer(
            kind="revoked",
            via=via,
            identity=identity,
            decision=decision,
            metadata={"reason": reason} if reason else None,
            grant=grant.id,
            granted_by=list(grant.granted_by),
        ),
    )


def decision(
    call: CallState,
    *,
    kind: AnswerKind,
    output: JsonObject | None,
    metadata: JsonObject | None = None,
) -> Decision:
    """What an answer decided.

    A deadline expires the call and a cancel cancels it. A restart with ``tool_approved``
    approves a gated or conditional tool. A respond whose output says ``approved: true/false``
    is that; any other respond to a gated or conditional tool denies it (the tool does not
    run). Anything else (a respond to an interrupt-only question, a restart that asks again) is
    an answer.
    """
    if kind == "deadline":
        return "expired"
    if kind == "cancel":
        return "cancelled"
    if kind == "restart":
        said = metadata if metadata is not None else call.answer_metadata
        approved = (said or {}).get(TOOL_APPROVED) is True
        return "approved" if approved and call.source != "interrupt" else "answered"
    if call.source == "input":
        # A server's form: filled in (answered) or declined (a denial).
        return "denied" if declined(output or {}) else "answered"
    said = (output or {}).get(APPROVED)
    if isinstance(said, bool):
        return "approved" if said else "denied"
    return "denied" if call.source != "interrupt" else "answered"


_decision = decision


def tool_response(call: CallState) -> TurnEvent:
    """What the model will be told about a call: its output, or how it failed."""
    return TurnEvent(
        kind="tool_response",
        name=call.name,
        ref=call.ref,
        input=call.args,
        output=call.output,
        error=call.error,
    )


def turn_end(result: TurnResult) -> TurnEvent:
    """The turn stopped: it ended, or it paused (``finish_reason`` interrupted)."""
    return TurnEvent(kind="turn_end", result=result)


def to_request(
    call: CallState,
    *,
    approvers: list[str] | None = None,
    approvers_omitted: int = 0,
    quorum: int = 1,
    editable: bool = False,
    output_schema: JsonObject | None = None,
    gate: GateDecision | None = None,
    issuer: str | None = None,
    shown: Shown | None = None,
    input_schema: JsonObject | None = None,
) -> InterruptRequest:
    """A paused call as the caller sees it (who may answer it and how many approvals it needs
    come from the agent's definition: see ``InterruptBook.requests``)."""
    approvers = approvers or []
    return InterruptRequest(
        name=call.name,
        ref=call.ref,
        input=call.args,
        metadata=call.metadata,
        source=call.source,
        since=call.since,
        deadline=call.deadline,
        approvers=approvers,
        approvers_omitted=approvers_omitted,
        quorum=quorum,
        votes=list(call.votes),
        editable=editable,
        input_digest=shown_digest(call),
        output_schema=output_schema,
        gate=gate,
        issuer=issuer,
        requester=call.requester,
        shown=shown,
        input_schema=input_schema,
    )


def gate_of_call(call: CallState) -> GateDecision | None:
    """The gate decision a call paused on, as the gate wrote it into its metadata (MCP tools'
    gates do; the ToolApproval's message says what it is)."""
    said = call.metadata.get("gate") if call.source == "approval" else None
    if not isinstance(said, dict):
        return None
    try:
        return GateDecision.model_validate(said)
    except ValidationError:
        return None


# --------------------------------------------------------------------------------------------
# On the stream.


def for_stream(event: TurnEvent, *, limit: int) -> list[TurnEvent]:
    """``event`` as stream items of at most ``limit`` bytes each.

    Text is split over several ``text`` events, so none of it is lost; any other event too
    large has its largest inputs and outputs replaced by stated placeholders (and, were that
    not enough, the last interrupts of a turn's result left out, counted).
    """
    if json_size(event) <= limit:
        return [event]
    if event.kind == "text" and event.text:
        room = limit - json_size(event.model_copy(update={"text": ""}))
        return [event.model_copy(update={"text": p}) for p in split_text(event.text, room)]
    data = event.model_dump(mode="json")
    shrink(data, limit)
    result = data.get("result")
    if isinstance(result, dict):
        interrupts = result.get("interrupts") or []
        while interrupts and json_size(data) > limit:
            interrupts.pop()
            result["interrupts_omitted"] = result.get("interrupts_omitted", 0) + 1
    return [TurnEvent.model_validate(data)]


def split_text(text: str, limit: int) -> list[str]:
    """``text`` in consecutive pieces of at most ``limit`` bytes each as stored, each as long as
    that allows."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        # The longest piece that fits: a character takes one to six bytes as stored (\u0001).
        lo, hi = start + 1, min(len(text), start + limit)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if stored_size(text[start:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        pieces.append(text[start:lo])
        start = lo
    return pieces


# --------------------------------------------------------------------------------------------
# Keeping them.


def record(
    state: ConversationState,
    event: TurnEvent,
    *,
    turn: int,
    at: datetime,
    offset: int | None = None,
) -> TurnEvent:
    """Stamp ``event`` with its offset, the turn and the time; keep its stored form.

    Args:
        offset: Its offset on the conversation's stream; None: the next after the last kept.

    Returns the stamped event, payloads and all, for the projections.
    """
    if offset is None:
        offset = state.events_total
    event = event.model_copy(update={"offset": offset, "turn": turn, "at": at})
    state.events_total = max(state.events_total, offset + 1)
    state.events.append(stored(event))
    del state.events[:-MAX_EVENTS_KEPT]
    return event


def stored(event: TurnEvent) -> TurnEvent:
    """The form the conversation keeps: what happened, to which call, by whom; no payloads."""
    answer = event.answer
    if answer is not None:
        identity = cut_stored(answer.identity, 300) if answer.identity is not None else None
        answer = TurnAnswer(
            kind=answer.kind,
            via=answer.via,
            identity=identity,
            decision=answer.decision,
            identity_verified=answer.identity_verified,
        )
    result = event.result
    return TurnEvent(
        offset=event.offset,
        turn=event.turn,
        kind=event.kind,
        at=event.at,
        name=cut_stored(event.name, 200) if event.name is not None else None,
        ref=cut_stored(event.ref, 140) if event.ref is not None else None,
        error=(
            ErrorInfo(status=cut_stored(event.error.status, 40), message="")
            if event.error is not None
            else None
        ),
        answer=answer,
        result=TurnResult(turn=result.turn, finish_reason=result.finish_reason)
        if result is not None
        else None,
    )

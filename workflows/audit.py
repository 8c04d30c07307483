"""The audit log and the rejection log: projections of what the conversation was told.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

- The answer log (``ConversationState.answers``, read by ``Chat.history()``) is the fold of the
  turn's ``answer`` events: :func:`apply` turns each into an :class:`AnswerRecord`.
- A caller's answer for a sub-agent's interrupt, passed on to the sub-agent, is a
  ``forwarded`` record there (:func:`forwarded`), with the sub-agent's verdict.
- The rejection log keeps what a signal sent that the conversation refused (an update's
  refusal goes back to its caller instead): :func:`rejection` builds the record, which keeps
  the payload's digest, never its bytes, and only storable text, so the log itself can never
  become what cannot be serialized.

Pure code with no Temporal imports; both logs are bounded (see :mod:`workflows.limits`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from temporal_agent_interrupts.workflows import receipts as receipt
from temporal_agent_interrupts.workflows.history import trim_answers
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    HELD,
    cut_stored,
    digest,
    json_size,
    omitted,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    JsonObject,
    Rejection,
    TurnEvent,
)


def _paused_since(state: ConversationState, ref: str | None) -> datetime | None:
    """When the turn's call ``ref`` last paused (None: it never did, or it is not this turn's)."""
    calls = state.turn.calls if state.turn is not None else []
    return next((c.since for c in calls if c.ref == ref), None) if ref else None


def _call(state: ConversationState, ref: str | None) -> CallState | None:
    calls = state.turn.calls if state.turn is not None else []
    return next((c for c in calls if c.ref == ref), None) if ref else None


def _subject(call: CallState | None, identity: str | None) -> str | None:
    """A verified approver's account, as their vote on the call recorded it."""
    votes = call.votes if call is not None else []
    return next((v.subject for v in votes if v.identity == identity and v.subject), None)


def apply(
    state: ConversationState, event: TurnEvent, *, receipts: receipt.Issuer | None = None
) -> None:
    """Fold one turn event into the answer log (only ``answer`` events add to it).

    Large metadata is kept as its digest, and the log is held to its byte budget as well as
    its count. The record also waits in ``audit_outbox`` until the workflow writes it to the
    memo (the trail in history, which no budget sheds).
    """
    answer = event.answer
    if event.kind != "answer" or answer is None or event.at is None:
        return
    metadata = answer.metadata
    if metadata is not None and json_size(metadata) > DOOR.audit_metadata:
        # Kept as what identifies it: the record is copied for every answer of a resume.
        metadata = omitted(metadata, why="resume metadata over 4 KiB; its digest is kept")
    output = event.output if answer.kind in ("respond", "deadline", "vote") else None
    edit = answer.kind == "edit"
    record = AnswerRecord(
        at=event.at,
        ref=event.ref or "",
        name=event.name or "",
        kind=answer.kind,
        via=answer.via,
        identity=answer.identity,
        metadata=metadata,
        decision=answer.decision,
        identity_verified=answer.identity_verified,
        output=_kept(output, what="output"),
        input=_kept(event.input, what="edited input") if edit else None,
        original_input=_kept(answer.original_input, what="original input") if edit else None,
        gate=answer.gate,
        grant=answer.grant,
        granted_by=answer.granted_by,
        requester=answer.requester,
        since=_paused_since(state, event.ref),
    )
    if receipts is not None:
        call = _call(state, event.ref)
        record.receipt = receipt.issue(
            state,
            record,
            receipts,
            decided_on=call.args if call is not None else event.input,
            subject=answer.subject or _subject(call, answer.identity),
            token_key_id=answer.token_key_id,
        )
    state.answers.append(record)
    state.audit_outbox.append(record)
    state.answers_dropped += trim_answers(state.answers)


def forwarded(
    state: ConversationState,
    *,
    at: datetime,
    chat_id: str,
    body: JsonObject,
    via: Literal["update", "signal"],
    refused: str | None,
    receipts: receipt.Issuer | None = None,
    child_receipt: str | None = None,
) -> None:
    """Record, in a caller's answer log, an answer given here for a sub-agent's interrupts and
    passed on to it: one ``forwarded`` record per entry, with the sub-agent's verdict.

    The sub-agent applied (or refused) it by its own rules, and its own trail holds what it
    applied; this is the caller's word of what it was given and what came back. ``body`` is the
    answer as given (read leniently: the sub-agent checked it), so every value is bounded here.

    Args:
        chat_id: The sub-agent's chat id.
        refused: The sub-agent's refusal (None: applied).
        receipts: Issues each applied record's receipt (None: none; a refused one has none).
        child_receipt: The id of the receipt the sub-agent issued for the answer (its chain is
            linked from this one's receipts by it).
    """
    identity = body.get("identity")
    metadata = body.get("metadata")
    for key in ("respond", "restart"):
        entries = body.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            output = entry.get("output") if key == "respond" else None
            record = AnswerRecord(
                at=at,
                ref=cut_stored(str(entry.get("ref", "")), DOOR.ref),
                name=cut_stored(str(entry.get("name", "")), 200),
                kind="forwarded",
                via=via,
                identity=cut_stored(identity, 200) if isinstance(identity, str) else None,
                metadata=_kept(metadata if isinstance(metadata, dict) else None, what="metadata"),
                output=_kept(output if isinstance(output, dict) else None, what="output"),
                chat_id=chat_id,
                verdict="applied" if refused is None else "refused",
                verdict_reason=(
                    cut_stored(refused[: DOOR.reason_chars], 600) if refused is not None else None
                ),
            )
            if receipts is not None and refused is None:
                # A refused answer decided nothing: its record stays in the trail, with no
                # receipt (its approver, ref and tool are whatever the sender said, and a
                # receipt's body has no verdict: attack test).
                record.receipt = receipt.issue(
                    state, record, receipts, decided_on=None, child=child_receipt
                )
            state.answers.append(record)
            state.audit_outbox.append(record)
    state.answers_dropped += trim_answers(state.answers)


def sub_agent_ended(
    state: ConversationState,
    *,
    at: datetime,
    ref: str,
    name: str,
    chat_id: str,
    last_receipt: str,
    receipts: receipt.Issuer,
) -> None:
    """Record, in a caller's answer log, that the sub-agent ``chat_id`` (run for the call
    ``ref``) ended with ``last_receipt`` its latest receipt: this record's receipt links it, so
    every receipt of the sub-agent's chain is pinned by the caller's (each names the one
    before it). A sub-agent chain no receipt of its caller links is not taken as one."""
    record = AnswerRecord(at=at, ref=ref, name=name, kind="sub_agent", via="sub_agent")
    record.chat_id = chat_id
    record.receipt = receipt.issue(state, record, receipts, decided_on=None, child=last_receipt)
    state.answers.append(record)
    state.audit_outbox.append(record)
    state.answers_dropped += trim_answers(state.answers)


def _kept(value: JsonObject | None, *, what: str) -> JsonObject | None:
    """A value as the audit record keeps it: whole up to 4 KiB, else its size and digest."""
    if value is not None and json_size(value) > DOOR.audit_metadata:
        return omitted(value, why=f"{what} over 4 KiB; its digest is kept")
    return value


def outbox_batch(state: ConversationState, *, budget: int = HELD.memo_audit) -> list[JsonObject]:
    """Empty the outbox into the memo's ``answers`` batch, within ``budget`` bytes.

    Records beyond the budget keep what identifies them (their outputs and inputs become
    digests) rather than being left out: the trail must name every answer.
    """
    batch: list[JsonObject] = []
    used = 0
    for record in state.audit_outbox:
        data = record.model_dump(mode="json", exclude_none=True)
        size = json_size(data)
        if used + size > budget:
            for key in ("output", "input", "original_input", "metadata"):
                if key in data:
                    data[key] = omitted(data[key], why="left out of this memo batch")
            size = json_size(data)
        batch.append(data)
        used += size
    state.audit_outbox.clear()
    return batch


def rejection(
    *,
    at: datetime,
    handler: str,
    reason: str,
    raw: bytes,
    identity: str | None,
    via: Literal["signal", "start", "activity"] = "signal",
) -> Rejection:
    """The record of a refused signal (or of what a start asked for that it may not).

    Args:
        raw: The payload's bytes (only their digest is kept).
        identity: Whom the payload claims to be from, if anyone.
    """
    return Rejection(
        at=at,
        via=via,
        handler=cut_stored(handler, 200),
        reason=cut_stored(reason[: DOOR.reason_chars], 600),
        identity=cut_stored(identity, 200) if identity is not None else None,
        digest=digest(raw),
    )


def reject(state: ConversationState, record: Rejection) -> None:
    """Keep a rejection: the newest :data:`HELD.rejections_kept`, and the total."""
    state.rejections.append(record)
    state.rejections_total += 1
    del state.rejections[: -HELD.rejections_kept]

"""What operators see of a conversation, computed from its state: a projection, never a source.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Three surfaces, each read without a worker:

- **search attributes** (``AgentName``, ``AgentStatus``, ``PendingInterrupts``,
  ``InterruptedSince``): the Temporal UI's list filters and ``agentctl pending``;
- **the memo's** ``pending`` list (name, ref and a cut of the input of each paused call): what
  the inbox shows for each paused chat;
- **the details panel** (Markdown with the command that answers each interrupt), rendered by
  :mod:`workflows.details`.

:func:`project` computes all three from the conversation's state and the calls the interrupt
book holds pending; the workflow writes only what changed since it last wrote
(:func:`search_attribute_updates`, :meth:`OperatorView.memo_changed`). When it writes is its
choice, not this module's: each write is a command in history, so the points are fixed (see
``AgentWorkflow._publish``).

Pure code: no workflow calls, so the tests run it without a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.common import SearchAttributeUpdate, TypedSearchAttributes

from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.details import render_details
from temporal_agent_interrupts.workflows.limits import (
    json_size,
    memo_input,
    names_within,
    stored_size,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
)
from temporal_agent_interrupts.workflows.text import truncate
from temporal_agent_interrupts.workflows.types import (
    AgentStatus,
    InterruptRequest,
    Shown,
    ShownField,
)

SEARCH_ATTRIBUTE_VALUE_BYTES = 1536
"""What the pending names may take in one search-attribute value (Temporal's default limit is
2 KiB a value)."""


@dataclass(frozen=True)
class OperatorView:
    status: AgentStatus
    # The pending tool names, sorted, as far as they fit one search-attribute value.
    pending_names: tuple[str, ...]
    # When the oldest pending interrupt was raised.
    since: datetime | None
    memo_pending: list[dict[str, Any]]
    details: str

    @property
    def search_attributes(self) -> tuple[object, ...]:
        """What the search attributes say, to compare with what was last written."""
        return (self.status, self.pending_names, self.since)


def status(state: ConversationState, *, paused: bool) -> AgentStatus:
    """``closed``, ``idle`` (no turn), ``interrupted`` (waiting on a human) or ``running``."""
    if state.closed:
        return "closed"
    if state.turn is None:
        return "idle"
    return "interrupted" if paused else "running"


def project(
    state: ConversationState,
    *,
    chat_id: str,
    namespace: str,
    pending: list[CallState],
    requests: list[InterruptRequest],
    delegated: Sequence[InterruptRequest] = (),
) -> OperatorView:
    """The operator's view of ``state``.

    Args:
        namespace: The conversation's (the details' commands name it).
        pending: The calls waiting for an answer, in call order (the interrupt book's).
        requests: The same calls as requests (who may answer, the quorum, the votes), for
            the memo the inbox reads.
        delegated: A sub-agent's interrupts (``agent_tool``), with their paths; the turn
            waits on them as on its own, and every surface shows them after its own.

    Pending names are cut to fit one search-attribute value (a reply may pause on many
    tools, with long names).
    """
    current = status(state, paused=bool(pending) or bool(delegated))
    names = fit_names(sorted({c.name for c in pending} | {r.name for r in delegated}))
    since = [c.since for c in pending if c.since] + [r.since for r in delegated if r.since]
    return OperatorView(
        status=current,
        pending_names=tuple(names),
        since=min(since, default=None),
        memo_pending=[memo_entry(r) for r in [*requests, *delegated]],
        details=render_details(
            chat_id=chat_id,
            namespace=namespace,
            agent=state.agent,
            status=current,
            turns=state.turns,
            spec=state.spec,
            pending=pending,
            last_turn=state.last_turn,
            rejections=state.rejections,
            rejections_total=state.rejections_total,
            answers=state.answers,
            requests=requests,
            delegated=delegated,
            grants=state.grants,
        ),
    )


def memo_entry(request: InterruptRequest) -> dict[str, Any]:
    """One paused call as the inbox reads it from the memo, without a worker: name, ref, the
    input (a JSON object, as ``InterruptRequest.input`` is; over ``OUT.memo_input`` a stated
    placeholder, with ``input_cut``), since when, until when, who may answer and the votes so
    far (keys left out when they say nothing: no deadline, anyone may answer, a quorum of
    one)."""
    shown, cut = memo_input(request.input)
    entry: dict[str, Any] = {
        "name": request.name,
        "ref": request.ref,
        "input": shown,
        "source": request.source,
        # An answer built from the inbox entry carries it: it answers only the input shown.
        "input_digest": request.input_digest,
    }
    if cut:
        entry["input_cut"] = True
    if request.editable:
        # The inbox offers an edit (its form comes from the call's pending request).
        entry["editable"] = True
    if request.path:
        # A sub-agent's interrupt: the path down to it, and the chat it waits in.
        entry["path"] = list(request.path)
        entry["chat_id"] = request.chat_id
    if request.since is not None:
        entry["since"] = request.since.isoformat()
    if request.deadline is not None:
        entry["deadline"] = request.deadline.isoformat()
    if request.approvers:
        # Cut already (see InterruptBook.request_for), and counted, so the inbox does not read
        # a cut list as "not you".
        entry["approvers"] = list(request.approvers)
        if request.approvers_omitted:
            entry["approvers_omitted"] = request.approvers_omitted
    if request.quorum > 1:
        entry["quorum"] = request.quorum
    if request.requester is not None:
        # Who sent the message the call came from, for the approver to see (an identity is
        # at most 256 bytes: DOOR.identity).
        entry["requester"] = request.requester.model_dump(
            mode="json", include={"identity", "verified"}
        )
    if request.votes:
        voters = [v.identity for v in request.votes]
        entry["votes"] = names_within(voters, MEMO_LIST_BYTES)
        if len(entry["votes"]) < len(voters):
            entry["votes_omitted"] = len(voters) - len(entry["votes"])
    if request.shown is not None:
        entry["shown"] = memo_shown(request.shown)
    return entry


MEMO_SHOWN_BYTES = 1536
"""The most a call's ``Shown`` takes in the memo, as JSON: its fields go first, last to first,
then its texts are cut shorter. With the rest of an entry (4 KiB at most) 128 paused calls and a
batch of answer records stay under half the payload Temporal takes (tests/test_web_glue.py)."""


def memo_shown(shown: Shown) -> dict[str, Any]:
    """``shown`` as the memo keeps it: within :data:`MEMO_SHOWN_BYTES` (``Chat.pending()`` has
    it whole)."""
    for text_limit in (160, 80, 40):

        def cut(text: str, limit: int = text_limit) -> str:
            return truncate(text, limit)

        fields = [ShownField(label=cut(f.label), value=cut(f.value)) for f in shown.fields]
        while True:
            small = shown.model_copy(
                update={
                    "title": cut(shown.title),
                    "summary": cut(shown.summary, 2 * text_limit),
                    "why": cut(shown.why),
                    "risk_note": cut(shown.risk_note) if shown.risk_note else None,
                    "asked": cut(shown.asked),
                    "said": cut(shown.said),
                    "fields": fields,
                    "fields_omitted": shown.fields_omitted + len(shown.fields) - len(fields),
                }
            )
            entry = small.model_dump(mode="json", exclude_defaults=True)
            if json_size(entry) <= MEMO_SHOWN_BYTES:
                return entry
            if not fields:
                break
            fields = fields[:-1]
    # Unreachable with the cuts above (40 characters of each text, no fields); kept so the
    # bound holds whatever Shown grows.
    return {"title": truncate(shown.title, 40), "summary": truncate(shown.summary, 80)}


MEMO_LIST_BYTES = 1024
"""What each paused call's approvers, and its votes, may take in the memo: with 128 paused calls
and a batch of answer records the memo stays far under Temporal's limit."""


def search_attribute_updates(
    current: TypedSearchAttributes, *, agent: str, view: OperatorView
) -> list[SearchAttributeUpdate]:
    """The updates that make ``current`` say what ``view`` says (none when it already does)."""
    names = list(view.pending_names)
    updates: list[SearchAttributeUpdate] = []
    if current.get(config.AGENT_NAME) != (agent or None):
        # A start that named no usable agent ("") names none here either.
        updates.append(
            config.AGENT_NAME.value_set(agent) if agent else config.AGENT_NAME.value_unset()
        )
    if current.get(config.AGENT_STATUS) != view.status:
        updates.append(config.AGENT_STATUS.value_set(view.status))
    if (current.get(config.PENDING_INTERRUPTS) or []) != names:
        updates.append(
            config.PENDING_INTERRUPTS.value_set(names)
            if names
            else config.PENDING_INTERRUPTS.value_unset()
        )
    if current.get(config.INTERRUPTED_SINCE) != view.since:
        updates.append(
            config.INTERRUPTED_SINCE.value_set(view.since)
            if view.since
            else config.INTERRUPTED_SINCE.value_unset()
        )
    return updates


def fit_names(names: list[str]) -> list[str]:
    """The pending tool names that fit one search-attribute value."""
    kept: list[str] = []
    total = 2
    for name in names:
        total += stored_size(name) + 3
        if total > SEARCH_ATTRIBUTE_VALUE_BYTES:
            break
        kept.append(name)
    return kept

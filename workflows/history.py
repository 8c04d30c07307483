"""Rolling digests of a conversation's messages, shared by the workflow and the model activity,
and the trimming of a conversation too large to carry into a new run.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

``digest(n)`` identifies the first ``n`` messages. The workflow sends it with every model call so
the activity can tell whether the messages it kept for a chat are exactly the ones the workflow
holds (after a rollback, a restart or another worker they may not be). Pure code: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from temporal_agent_interrupts.workflows.limits import (
    HELD,
    json_size,
)
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    Message,
)

EMPTY = ""


def step(previous: str, message: Message) -> str:
    """The digest of a prefix extended by one message."""
    h = hashlib.sha256(previous.encode())
    h.update(message.model_dump_json().encode())
    return h.hexdigest()[:32]


class Digests:
    """Digests of every prefix of a message list that only grows or is cut short."""

    def __init__(self) -> None:
        self._d: list[str] = [EMPTY]

    def of(self, messages: Sequence[Message], n: int) -> str:
        """The digest of ``messages[:n]``, computing only what is new."""
        while len(self._d) <= n:
            i = len(self._d) - 1
            self._d.append(step(self._d[-1], messages[i]))
        return self._d[n]

    def cut(self, n: int) -> None:
        """Forget digests of prefixes longer than ``n`` (the list was cut to ``n`` messages)."""
        del self._d[n + 1 :]


def _turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indexes of the messages that open a turn: a user message carrying text, not tool results."""
    return [
        i
        for i, m in enumerate(messages)
        if m.role == "user" and not any(p.function_response for p in m.parts)
    ]


def trim_answers(answers: list[AnswerRecord]) -> int:
    """Shed the oldest answer records beyond :data:`HELD.answers_kept` and
    :data:`HELD.answers` bytes, in place. Returns how many went."""
    drop = max(0, len(answers) - HELD.answers_kept)
    sizes = [json_size(a) for a in answers[drop:]]
    total = sum(sizes)
    for size in sizes:
        if total <= HELD.answers:
            break
        total -= size
        drop += 1
    del answers[:drop]
    return drop


def carry(
    state: ConversationState,
    refs: Sequence[str],
    *,
    paused: bool,
    budget: int,
) -> ConversationState | None:
    """The state continue-as-new carries, within ``budget`` bytes; None if it cannot fit.

    ``refs`` are every ref of the conversation, oldest first: the newest :data:`HELD.refs_kept`
    travel (the turn in progress is among them), the rest are counted as forgotten. A paused
    turn's result is left out, since the new run recomputes it from the turn (it would carry
    the pending interrupts twice). Then :func:`fit_state` drops the oldest turns if need be.
    ``state`` is not modified.
    """
    s = state.model_copy()
    kept = list(refs[-HELD.refs_kept :])
    s.refs = kept
    s.refs_forgotten = state.refs_forgotten + len(refs) - len(kept)
    if paused:
        s.last_turn = None
    return fit_state(s, budget=budget)


def fit_state(
    state: ConversationState,
    *,
    budget: int,
    answers_kept: int = 50,
) -> ConversationState | None:
    """The state to carry into the next run, within ``budget`` bytes of JSON; None if it can't fit.

    Continue-as-new carries the whole conversation in one payload, and Temporal refuses one of
    about 2 MB: the run would be stuck retrying the same workflow task. Over budget, the oldest
    answer records go first (down to ``answers_kept``), then the oldest whole turns, never the
    turn in progress; between turns, as a last resort, the last turn too (the model then starts
    afresh, which beats a conversation that cannot go on). Dropped messages are counted in
    ``dropped_messages``. ``state`` is not modified.
    """
    _size = _state_size
    if _size(state) <= budget:
        return state
    s = state.model_copy()
    s.answers = list(state.answers[-answers_kept:])
    if len(state.answers) > answers_kept:
        s.answers_dropped = state.answers_dropped + len(state.answers) - answers_kept
    if _size(s) <= budget:
        return s
    # Cut only where a turn starts, so no call is separated from its response; the turn in
    # progress always stays.
    if state.turn is not None:
        starts = [i for i in _turn_starts(state.messages) if 0 < i <= state.turn.base_len]
    else:
        starts = [i for i in _turn_starts(state.messages) if i > 0]
        starts.append(len(state.messages))
    total = _size(s)
    # Serializing once per message (not once per candidate cut) keeps this linear.
    prefix = [0]
    for m in state.messages:
        prefix.append(prefix[-1] + json_size(m) + 1)  # and its comma
    for cut in starts:
        if total - prefix[cut] > budget:
            continue
        s.messages = list(state.messages[cut:])
        s.dropped_messages = state.dropped_messages + cut
        s.model_seen = max(0, state.model_seen - cut)
        if state.turn is not None:
            s.turn = state.turn.model_copy(update={"base_len": state.turn.base_len - cut})
        if _size(s) <= budget:
            return s
    return None


def page(messages: Sequence[Message], *, start: int, end: int, budget: int) -> int:
    """How far from ``start`` (at most ``end``) the messages fit in ``budget`` bytes; at
    least one message, so every page makes progress."""
    total = 0
    stop = start
    while stop < end:
        total += json_size(messages[stop]) + 1
        if total > budget and stop > start:
            break
        stop += 1
    return stop


def page_back(messages: Sequence[Message], *, end: int, budget: int) -> int:
    """Where a page of the newest messages before ``end`` starts, within ``budget`` bytes
    (at least one message)."""
    total = 0
    start = end
    while start > 0:
        total += json_size(messages[start - 1]) + 1
        if total > budget and start < end:
            break
        start -= 1
    return start


def _state_size(state: ConversationState) -> int:
    # Bytes, not characters: the payload is UTF-8, and CJK text takes three bytes a character.
    return json_size(state)

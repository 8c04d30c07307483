"""What continue-as-new carries stays under Temporal's payload limit (workflows.history.fit_state).

Pure: no server. The end-to-end case is in test_continue_as_new.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporal_agent_interrupts.workflows.history import fit_state
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    FunctionCall,
    FunctionResponse,
    Message,
    Part,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def turn(n: int, *, blob: int = 0) -> list[Message]:
    """One finished turn: user text, a call, its (possibly large) response, the answer."""
    return [
        Message(role="user", parts=[Part(text=f"question {n}")]),
        Message(role="model", parts=[Part(function_call=FunctionCall(name="f", args={}))]),
        Message(
            role="user",
            parts=[Part(function_response=FunctionResponse(name="f", response={"b": "x" * blob}))],
        ),
        Message(role="model", parts=[Part(text=f"answer {n}")]),
    ]


def state(turns: int, *, blob: int, answers: list[AnswerRecord] | None = None) -> ConversationState:
    messages = [m for n in range(turns) for m in turn(n, blob=blob)]
    return ConversationState(
        agent="a", messages=messages, model_seen=len(messages), answers=answers or []
    )


def size(s: ConversationState) -> int:
    return len(s.model_dump_json().encode())


def test_a_state_within_budget_is_carried_unchanged():
    s = state(3, blob=100)
    assert fit_state(s, budget=size(s)) is s


def test_the_oldest_whole_turns_go_first():
    s = state(10, blob=1000)
    fitted = fit_state(s, budget=size(s) // 2)
    assert fitted is not None and size(fitted) <= size(s) // 2
    # Cut at a turn start: the first message is a question, and what is kept is the newest.
    assert fitted.messages[0].text().startswith("question ")
    assert fitted.messages == s.messages[fitted.dropped_messages :]
    assert fitted.dropped_messages % 4 == 0 and fitted.dropped_messages > 0
    assert fitted.model_seen == len(fitted.messages)
    assert len(s.messages) == 40  # the original is untouched


def test_answer_records_go_before_any_message():
    records = [
        AnswerRecord(
            at=NOW, ref=f"r{i}", name="t", kind="respond", via="update", metadata={"m": "y" * 500}
        )
        for i in range(200)
    ]
    s = state(4, blob=10, answers=records)
    fitted = fit_state(s, budget=size(s) // 2, answers_kept=50)
    assert fitted is not None
    assert fitted.messages == s.messages and fitted.dropped_messages == 0
    assert [a.ref for a in fitted.answers] == [f"r{i}" for i in range(150, 200)]


def test_the_turn_in_progress_is_never_cut_and_its_base_moves():
    s = state(6, blob=1000)
    base = len(s.messages)
    s.messages.append(Message(role="user", parts=[Part(text="current")]))
    s.turn = TurnState(turn=7, started_at=NOW, base_len=base)
    fitted = fit_state(s, budget=size(s) - 1000)
    assert fitted is not None and fitted.turn is not None
    assert fitted.messages[fitted.turn.base_len].text() == "current"
    assert s.turn.base_len == base  # the original is untouched


def test_a_state_that_cannot_fit_is_refused():
    # The only turn is the one in progress: nothing may be dropped.
    s = state(0, blob=0)
    s.messages = turn(0, blob=5000)
    s.turn = TurnState(turn=1, started_at=NOW, base_len=0)
    assert fit_state(s, budget=1000) is None


def test_the_budget_is_in_bytes_not_characters():
    # Three bytes a character in UTF-8: a budget counted in characters would let through a
    # payload three times too large.
    s = state(10, blob=0)
    for m in s.messages:
        if m.role == "model" and m.parts[0].text:
            m.parts[0].text = "日本語" * 300
    budget = len(s.model_dump_json()) + 100  # characters: it would "fit"
    fitted = fit_state(s, budget=budget)
    assert fitted is not None and fitted.dropped_messages > 0
    assert size(fitted) <= budget

"""The door and the budgets (workflows.limits, workflows.history, workflows.details), without a
server: what may enter, what a result is cut to, what continue-as-new carries, and what an
operator sees. The end-to-end cases are in test_durable_input.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pydantic_core
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from temporal_agent_interrupts.workflows.history import carry, page, page_back, trim_answers
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    HELD,
    OUT,
    RUN,
    TEMPORAL,
    Refused,
    check_json,
    check_label,
    decode_json,
    json_size,
    shrink,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    AnswerRecord,
    FinishReason,
    FunctionCall,
    InterruptRequest,
    Message,
    Part,
    Rejection,
    StatusResult,
    ToolSpec,
    TurnResult,
)
from tests.test_carried_state import turn as turn_messages

NOW = datetime(2026, 12, 1, tzinfo=UTC)


# --------------------------------------------------------------------------------------------
# The door


def deep(depth: int) -> object:
    value: object = True
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_is_refused_past_the_stated_depth_without_recursion():
    check_json(deep(DOOR.json_depth), what="x")
    with pytest.raises(Refused, match="nested deeper than 64 levels"):
        check_json(deep(DOOR.json_depth + 1), what="x")
    with pytest.raises(Refused):
        check_json(deep(100_000), what="x")  # iterative: no RecursionError


@pytest.mark.parametrize(
    "value",
    [
        "\ud83d",
        {"k": "half \ude00"},
        {"\udfff": 1},
        ["ok", ["\ud800"]],
    ],
)
def test_text_that_is_not_valid_unicode_is_refused_anywhere(value):
    with pytest.raises(Refused, match="not valid Unicode"):
        check_json(value, what="the output")
    # What pydantic-core would have made of it later: an error in every workflow task.
    with pytest.raises(pydantic_core.PydanticSerializationError):
        pydantic_core.to_json(value)


def test_numbers_json_cannot_hold_are_refused():
    for value in (float("nan"), float("inf"), {"a": [float("-inf")]}):
        with pytest.raises(Refused, match="NaN or infinity"):
            check_json(value, what="x")
    for spelled in (b'{"a": NaN}', b"[Infinity]", b"-Infinity"):
        with pytest.raises(Refused, match="is not a JSON value"):
            decode_json(spelled)


def test_a_deadline_answer_too_large_is_refused_at_declaration():
    from temporal_agent_interrupts import interrupt
    from temporal_agent_interrupts.workflows import Agent
    from tests.agents import Answer, Ask

    with pytest.raises(ValueError, match=r"on_timeout is \d+ bytes of JSON; the limit is 4096"):
        interrupt(
            "ask",
            "d",
            input=Ask,
            output=Answer,
            timeout=timedelta(hours=1),
            on_timeout={"approved": False, "note": "n" * 5000},
        )
    with pytest.raises(ValueError, match="on_interrupt_timeout is more than 4096"):
        Agent("a", on_interrupt_timeout={"note": "n" * 5000})


@pytest.mark.parametrize("identity", ["a\nb", "a\x1b[31m", "tab\there", "c1\x9b", "x" * 257])
def test_an_identity_is_one_short_line(identity):
    with pytest.raises(Refused):
        check_label(identity, what="identity", limit=256)


def test_the_budgets_add_up_to_less_than_temporals_limits():
    """The arithmetic in workflows.limits' docstring, so raising one budget cannot quietly
    break another total."""
    refs = HELD.refs_kept * (DOOR.ref + 2)
    rejections = HELD.rejections_kept * 1229  # reason 600, identity and handler 200 each, rest
    turn = HELD.turn + HELD.notes
    carried = turn + HELD.answers + rejections + refs + DOOR.spec + 2 * 1024
    assert carried <= OUT.state < TEMPORAL.payload
    model_input = turn + DOOR.send
    assert model_input <= OUT.model_input < TEMPORAL.payload
    assert OUT.query < TEMPORAL.payload
    accepted = (
        HELD.turn  # answers count against the turn, across every resume of a task
        + TEMPORAL.updates_in_flight * (DOOR.resume_metadata + DOOR.identity)
        + DOOR.model_message  # restart inputs equal the model's arguments
    )
    results = TEMPORAL.updates_in_flight * OUT.update_result
    commands = max(OUT.state, OUT.model_input)
    assert accepted + results + commands <= TEMPORAL.task - 200 * 1024
    assert RUN.can_bytes * 10 <= TEMPORAL.history_bytes
    assert RUN.can_events * 10 <= TEMPORAL.history_events


# --------------------------------------------------------------------------------------------
# Fitting results


def big_request(n: int, kib: int) -> InterruptRequest:
    return InterruptRequest(
        name="t", ref=f"r{n}", input={"q": "i" * kib * 1024}, metadata={"m": "m" * kib * 1024}
    )


def test_a_result_is_shrunk_largest_first_with_stated_placeholders():
    status = StatusResult(
        chat_id="c",
        agent="a",
        status="interrupted",
        turns=1,
        pending=[big_request(n, 100 * (n + 1)) for n in range(4)],
        last_turn=TurnResult(turn=1, finish_reason=FinishReason.INTERRUPTED, text="t" * 300_000),
    )
    data = status.model_dump(mode="json")
    budget = 700 * 1024
    replaced = shrink(data, budget)
    assert replaced > 0 and json_size(data) <= budget
    fitted = StatusResult.model_validate(data)
    # The largest went first: the smallest request kept its input whole.
    assert fitted.pending[0].input == status.pending[0].input
    placeholder = fitted.pending[3].metadata
    assert placeholder["bytes"] > 400 * 1024 and len(placeholder["sha256"]) == 16
    assert "too large for this result" in placeholder["omitted"]


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 600), min_size=1, max_size=12),
    text_kib=st.integers(0, 500),
    budget_kib=st.integers(64, 2048),
)
def test_any_turn_result_fits_any_budget_above_its_skeleton(sizes, text_kib, budget_kib):
    result = TurnResult(
        turn=1,
        finish_reason=FinishReason.INTERRUPTED,
        text="x" * text_kib * 1024,
        interrupts=[big_request(n, kib) for n, kib in enumerate(sizes)],
    )
    data = result.model_dump(mode="json")
    shrink(data, budget_kib * 1024)
    assert json_size(data) <= budget_kib * 1024
    TurnResult.model_validate(data)


# --------------------------------------------------------------------------------------------
# What continue-as-new carries


def max_spec() -> AgentSpec:
    tools = [
        ToolSpec(name=f"tool{n}", description="d" * 200, input_schema={"type": "object"})
        for n in range(100)
    ]
    spec = AgentSpec(name="a", model="m", system="", tools=tools)
    spec.system = "s" * (DOOR.spec - json_size(spec) - 100)
    assert json_size(spec) <= DOOR.spec
    return spec


def max_rejections() -> list[Rejection]:
    return [
        Rejection(
            at=NOW,
            via="signal",
            handler="h" * 200,
            reason="r" * 500,
            identity="i" * 200,
            digest="sha256:0123456789abcdef 1048576B",
        )
        for _ in range(HELD.rejections_kept)
    ]


def max_answers() -> list[AnswerRecord]:
    answers = [
        AnswerRecord(
            at=NOW,
            ref=str(uuid.uuid4()),
            name="t" * 64,
            kind="respond",
            via="signal",
            identity="i" * 256,
            metadata={"m": "m" * 4000},
        )
        for _ in range(HELD.answers_kept)
    ]
    trim_answers(answers)
    return answers


ARGS = {"a": "a" * 500}


def turn_in_progress(
    base: int, *, calls: int, output_kib: int, metadata_kib: int
) -> tuple[list[Message], TurnState]:
    """A paused turn holding as close to the turn budget as these sizes allow."""
    user = Message(role="user", parts=[Part(text="u" * 200_000)])
    model = Message(
        role="model",
        parts=[
            Part(function_call=FunctionCall(id="c" * DOOR.ref, name="t", args={"a": "a" * 500}))
            for _ in range(calls)
        ],
    )
    states = [
        CallState(
            ref=f"{n:0>{DOOR.ref}}",
            name="t",
            args={"a": "a" * 500},
            status="pending" if n % 2 else "done",
            output=None if n % 2 else {"o": "o" * output_kib * 1024},
            metadata={"m": "m" * metadata_kib * 1024} if n % 2 else {},
            since=NOW,
        )
        for n in range(calls)
    ]
    turn = TurnState(turn=9, started_at=NOW, base_len=base, phase="tools", calls=states)
    return [user, model], turn


def held(messages: list[Message], turn: TurnState) -> int:
    """As the workflow counts it (AgentWorkflow._turn_held)."""
    return sum(json_size(m) for m in messages) + sum(json_size(c) for c in turn.calls)


def test_an_update_result_lists_the_interrupts_that_fit_and_counts_the_rest():
    from temporal_agent_interrupts.workflows.payloads import fit as _fit

    result = TurnResult(
        turn=1,
        finish_reason=FinishReason.INTERRUPTED,
        interrupts=[big_request(n, 1) for n in range(128)],
    )
    fitted = _fit(result, 20 * 1024)
    assert json_size(fitted) <= 20 * 1024
    assert fitted.interrupts_omitted > 0
    assert len(fitted.interrupts) + fitted.interrupts_omitted == 128
    assert [i.ref for i in fitted.interrupts] == [f"r{n}" for n in range(len(fitted.interrupts))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    old_turns=st.integers(0, 40),
    old_blob=st.integers(0, 200_000),
    calls=st.integers(1, 128),
    output_kib=st.integers(0, 256),
    metadata_kib=st.integers(0, 256),
    refs=st.sampled_from([0, 500, 5_000, 100_000]),
    paused=st.booleans(),
)
def test_whatever_the_budgets_admit_continue_as_new_can_carry(
    old_turns, old_blob, calls, output_kib, metadata_kib, refs, paused
):
    """Every part at its maximum, in random combinations: the carried state always fits."""
    messages = [m for n in range(old_turns) for m in turn_messages(n, blob=old_blob)]
    turn = None
    if paused:
        current, turn = turn_in_progress(
            len(messages), calls=calls, output_kib=output_kib, metadata_kib=metadata_kib
        )
        if held(current, turn) > HELD.turn + HELD.notes:
            return  # the workflow would have kept this turn within its budget
        messages += current
    last = TurnResult(turn=8, finish_reason=FinishReason.STOP, text="t" * 500_000)
    state = ConversationState(
        agent="a",
        spec=max_spec(),
        messages=messages,
        turn=turn,
        last_turn=last,
        turns=9,
        answers=max_answers(),
        rejections=max_rejections(),
        rejections_total=10**9,
        model_seen=len(messages),
    )
    all_refs = [str(uuid.UUID(int=n)) for n in range(refs)]
    carried = carry(state, all_refs, paused=paused, budget=OUT.state)
    assert carried is not None
    assert json_size(carried) <= OUT.state
    assert len(carried.refs) == min(refs, HELD.refs_kept)
    assert carried.refs_forgotten == max(0, refs - HELD.refs_kept)
    if turn is not None:
        assert carried.turn is not None and carried.turn.calls == turn.calls
        assert carried.last_turn is None  # recomputed from the turn, not carried twice


def test_a_hundred_thousand_refs_are_carried_as_the_newest_thousand():
    refs = [str(uuid.uuid4()) for _ in range(100_000)]
    state = ConversationState(agent="a", refs=refs)
    carried = carry(state, refs, paused=False, budget=OUT.state)
    assert carried is not None
    assert carried.refs == refs[-HELD.refs_kept :]
    assert carried.refs_forgotten == 100_000 - HELD.refs_kept
    assert json_size(carried) < 50 * 1024


def test_between_turns_even_the_last_turn_may_go_rather_than_block_continue_as_new():
    state = ConversationState(agent="a", messages=turn_messages(0, blob=1_900_000))
    carried = carry(state, [], paused=False, budget=OUT.state)
    assert carried is not None and carried.messages == [] and carried.dropped_messages == 4


def test_the_answer_log_sheds_its_oldest_records_by_bytes_and_count():
    answers = [
        AnswerRecord(at=NOW, ref=f"r{n}", name="t", kind="respond", via="update", metadata={})
        for n in range(HELD.answers_kept + 10)
    ]
    assert trim_answers(answers) == 10 and answers[0].ref == "r10"
    heavy = [
        AnswerRecord(
            at=NOW, ref=f"h{n}", name="t", kind="respond", via="update", metadata={"m": "m" * 4000}
        )
        for n in range(100)
    ]
    dropped = trim_answers(heavy)
    assert dropped > 60 and heavy[-1].ref == "h99"
    assert json_size(heavy) <= HELD.answers


def test_pages_make_progress_and_stay_in_budget():
    messages = [Message(role="user", parts=[Part(text="x" * 1000)]) for _ in range(50)]
    one = json_size(messages[0]) + 1
    assert page(messages, start=0, end=50, budget=10 * one) == 10
    assert page(messages, start=5, end=50, budget=10 * one - 1) == 14
    assert page(messages, start=0, end=50, budget=10) == 1  # never an empty page
    assert page_back(messages, end=50, budget=10 * one) == 40
    assert page_back(messages, end=1, budget=10) == 0

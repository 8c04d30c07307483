"""The pure interrupt bookkeeping, without a server: validation, answers, deadlines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from temporal_agent_interrupts.workflows.interrupts import (
    InterruptBook,
    ResumeError,
    schema_error,
)
from temporal_agent_interrupts.workflows.limits import DOOR
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from tests.agents import assistant

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def book(*calls: CallState, known: tuple[str, ...] = ()) -> InterruptBook:
    return InterruptBook(list(calls), spec=assistant.spec(), known_refs=known)


def pending(name: str, ref: str, **args: object) -> CallState:
    c = CallState(ref=ref, name=name, args=dict(args))
    InterruptBook([c], spec=assistant.spec()).pause(c, source="interrupt", metadata={}, now=NOW)
    return c


def reason(b: InterruptBook, raw: object, size: int | None = None) -> str:
    with pytest.raises(ResumeError) as e:
        b.validate(raw, size=size)
    return e.value.reason


def test_valid_respond_and_restart_are_accepted_and_applied():
    a, c = pending("approve", "r1", question="q"), pending("charge", "r2", amount=1)
    b = book(a, c)
    resume = b.validate(
        {
            "respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}],
            "restart": [{"name": "charge", "ref": "r2", "input": {"amount": 1}}],
            "identity": "alice",
        }
    )
    assert [x.ref for x in b.resume(resume, via="update")] == ["r1", "r2"]
    assert b.all_answered()
    b.settle()
    assert (a.status, a.output) == ("done", {"approved": True})
    assert (c.status, c.resumed, c.resumed_metadata) == ("ready", True, {})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([], "must be a JSON object"),
        ("yes", "must be a JSON object"),
        (None, "must be a JSON object"),
        ({}, "empty resume"),
        ({"respond": "x"}, "malformed resume: respond"),
        ({"respond": [{"ref": "r1", "output": {}}]}, "respond.0.name: Field required"),
        ({"respnd": []}, "malformed resume: respnd: Extra inputs are not permitted"),
        ({"respond": [{"name": "approve", "ref": "r9", "output": {}}]}, "unknown ref 'r9'"),
        ({"respond": [{"name": "approve", "ref": "old", "output": {}}]}, "already answered"),
        ({"respond": [{"name": "charge", "ref": "r1", "output": {}}]}, "not 'charge'"),
        ({"respond": [{"name": "approve", "ref": "r1", "output": {"approved": 3}}]}, "approved"),
        ({"respond": [{"name": "approve", "ref": "r1", "output": []}]}, "valid dictionary"),
        (
            {"restart": [{"name": "approve", "ref": "r1", "input": {"question": "other"}}]},
            "changes the tool's input",
        ),
        (
            {
                "respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}],
                "restart": [{"name": "approve", "ref": "r1"}],
            },
            "more than once",
        ),
        (
            {
                "respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}],
                "identity": 7,
            },
            "identity",
        ),
    ],
)
def test_bad_resumes_are_rejected_with_a_reason(raw, expected):
    b = book(pending("approve", "r1", question="q"), known=("old",))
    assert expected in reason(b, raw)
    assert [c.status for c in b.calls] == ["pending"]  # nothing applied


def test_any_object_is_a_valid_respond_for_a_tool_without_output_model():
    b = book(pending("charge", "r2", amount=1))
    b.validate({"respond": [{"name": "charge", "ref": "r2", "output": {"denied": "no"}}]})


def test_nothing_pending_and_oversize():
    done = CallState(ref="r1", name="approve", status="done", output={})
    assert "nothing is paused" in reason(
        book(done), {"respond": [{"name": "approve", "ref": "r1", "output": {}}]}
    )
    b = book(pending("approve", "r1"))
    assert "the limit is 1.00 MiB" in reason(b, {}, size=DOOR.resume + 1)


def test_answered_refs_cannot_be_answered_again():
    b = book(pending("approve", "r1", question="q"), pending("approve", "r2", question="q"))
    ok = {"respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}]}
    b.resume(b.validate(ok), via="update")
    assert "already answered" in reason(b, ok)
    assert [c.ref for c in b.pending()] == ["r2"]


def test_deadlines_expire_to_the_declared_default():
    c = CallState(ref="r1", name="approve")
    spec = assistant.spec().model_copy(
        update={"interrupt_deadline_seconds": 60.0, "on_interrupt_timeout": {"approved": False}}
    )
    b = InterruptBook([c], spec=spec)
    b.pause(c, source="interrupt", metadata={}, now=NOW)
    assert b.next_deadline() == NOW + timedelta(seconds=60)
    assert b.expire(NOW + timedelta(seconds=59)) == []
    assert b.expire(NOW + timedelta(seconds=60)) == [c]
    b.settle()
    assert c.output == {"approved": False}


def test_cancel_gives_every_open_call_a_response():
    done = CallState(ref="r0", name="lookup", status="done", output={"v": 1})
    b = book(done, pending("approve", "r1"))
    b.cancel("stop")
    assert [c.output for c in b.calls] == [{"v": 1}, {"error": "cancelled", "reason": "stop"}]


def test_schema_error_points_at_the_field():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert schema_error({"a": 1}, schema) is None
    assert schema_error({"a": "x"}, schema) == 'a: must be of type "integer"'
    assert "'a' is a required property" in (schema_error({}, schema) or "")


@pytest.mark.parametrize(
    "field",
    [
        {"type": "integer"},
        {"type": "string", "pattern": "^[0-9]+$"},
        {"type": "string", "maxLength": 4},
        {"enum": ["a", "b"]},
        {"const": "a"},
        {"not": {"type": "string"}},
        {"type": "object", "properties": {"x": {"type": "integer"}}},
    ],
)
def test_schema_error_never_quotes_the_value(field: dict[str, object]):
    # A reason is logged and shown in the UI; the rejected value may be a secret.
    secret = "sk-SECRET-token" if field.get("type") != "object" else {"x": "sk-SECRET-token"}
    schema = {"type": "object", "properties": {"t": field}}
    reason = schema_error({"t": secret}, schema)
    assert reason is not None and reason.startswith("t")
    assert "SECRET" not in reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["respond", "restart", "name", "ref", "output", "identity", "x"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
entries = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["approve", "charge", "lookup", ""]),
        "ref": st.sampled_from(["r1", "r2", "old", "zz"]),
        "output": st.one_of(json_values, st.just({"approved": True})),
    }
)
resumes = st.fixed_dictionaries(
    {},
    optional={
        "respond": st.lists(entries, max_size=3),
        "restart": st.lists(entries.map(lambda e: {k: e[k] for k in ("name", "ref")}), max_size=3),
        "identity": st.one_of(st.text(max_size=5), st.integers()),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(json_values, resumes))
def test_validation_is_total_and_only_accepts_pending_answers(raw):
    """Any JSON at all: either a clean ResumeError, or a resume answering distinct pending refs."""
    b = book(
        pending("approve", "r1", question="q"), pending("charge", "r2", amount=1), known=("old",)
    )
    resume, reason = None, ""
    try:
        resume = b.validate(raw)
    except ResumeError as e:
        reason = e.reason
    if resume is None:
        assert reason
        assert [c.status for c in b.calls] == ["pending", "pending"]
        return
    refs = [r.ref for r in resume.respond] + [r.ref for r in resume.restart]
    assert refs and len(refs) == len(set(refs)) and set(refs) <= {"r1", "r2"}
    assert all(r.output.get("approved") is True for r in resume.respond if r.ref == "r1")
    b.resume(resume, via="update")
    assert {c.ref for c in b.calls if c.status == "answered"} == set(refs)

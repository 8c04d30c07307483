"""Turn events and their projections, without a server.

The interrupt book's transitions emit the turn events; the conversation keeps their stored form;
the audit log, the rejection log and the operator view are computed from them and from the
state they leave. Everything here is pure code, exercised directly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, SearchAttributePair, TypedSearchAttributes

from temporal_agent_interrupts.workflows import audit, config, events, operator_view, stream
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, ResumeError
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    json_size,
    stored_size,
)
from temporal_agent_interrupts.workflows.payloads import (
    claimed_identity,
    fit,
    only_argument,
    payload_json,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    ErrorInfo,
    FinishReason,
    PendingResult,
    ResumeInput,
    TurnEvent,
    TurnResult,
)
from tests.agents import assistant

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Recorder:
    """Emits into a conversation's state as the workflow does: stamped, kept, audited."""

    def __init__(self) -> None:
        self.state = ConversationState(agent="assistant", spec=assistant.spec())
        self.emitted: list[TurnEvent] = []

    def __call__(self, event: TurnEvent) -> TurnEvent:
        stamped = events.record(self.state, event, turn=1, at=NOW)
        audit.apply(self.state, stamped)
        self.emitted.append(stamped)
        return stamped

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(e.kind, e.ref) for e in self.emitted]


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


def requested(rec: Recorder, *calls: CallState) -> InterruptBook:
    b = InterruptBook([], spec=assistant.spec(), emit=rec)
    b.request(list(calls))
    return b


# --------------------------------------------------------------------------------------------
# The book's transitions emit the events, in the order things happen.


def test_a_paused_call_answered_by_respond_emits_request_interrupt_answer_response(rec):
    call = CallState(ref="r1", name="approve", args={"question": "pay?"})
    b = requested(rec, call)
    b.pause(call, source="interrupt", metadata={"why": "money"}, now=NOW)
    resume = ResumeInput.model_validate(
        {
            "respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}],
            "identity": "alice",
        }
    )
    b.resume(resume, via="signal")
    b.settle()
    assert rec.kinds() == [
        ("tool_request", "r1"),
        ("interrupt", "r1"),
        ("answer", "r1"),
        ("tool_response", "r1"),
    ]
    request, interrupt, answer, response = rec.emitted
    assert request.input == {"question": "pay?"}
    assert interrupt.interrupt is not None
    assert interrupt.interrupt.metadata == {"why": "money"}
    assert interrupt.interrupt.input == {"question": "pay?"}
    assert answer.answer is not None
    assert (answer.answer.kind, answer.answer.via, answer.answer.identity) == (
        "respond",
        "signal",
        "alice",
    )
    assert answer.output == {"approved": True}
    assert response.output == {"approved": True}
    assert [e.offset for e in rec.emitted] == [0, 1, 2, 3]


def test_a_restart_emits_its_answer_and_leaves_the_call_ready_to_run_again(rec):
    call = CallState(ref="r2", name="charge", args={"amount": 5})
    b = requested(rec, call)
    b.gate(call, now=NOW)
    assert call.source == "approval"
    assert call.metadata == {"message": "Tool not in approved list: charge"}
    resume = ResumeInput.model_validate(
        {"restart": [{"name": "charge", "ref": "r2", "resumed_metadata": {"tool_approved": True}}]}
    )
    b.resume(resume, via="update")
    b.settle()
    assert rec.kinds() == [("tool_request", "r2"), ("interrupt", "r2"), ("answer", "r2")]
    assert call.status == "ready"
    assert call.resumed_metadata == {"tool_approved": True}
    assert b.start_run(call) == 1
    b.complete(call, {"charged": 5})
    assert rec.kinds()[-1] == ("tool_response", "r2")
    assert rec.emitted[-1].output == {"charged": 5}


def test_a_resume_that_no_longer_matches_is_refused_and_emits_nothing(rec):
    call = CallState(ref="r1", name="approve")
    b = requested(rec, call)
    b.pause(call, source="interrupt", metadata={}, now=NOW)
    ok = ResumeInput.model_validate(
        {"respond": [{"name": "approve", "ref": "r1", "output": {"approved": True}}]}
    )
    b.resume(ok, via="update")
    before = len(rec.emitted)
    with pytest.raises(ResumeError, match="nothing is paused"):
        b.resume(ok, via="update")
    assert len(rec.emitted) == before
    assert len(rec.state.answers) == 1


def test_cancel_answers_and_responds_for_every_withdrawn_call(rec):
    done = CallState(ref="r0", name="lookup")
    open_ = CallState(ref="r1", name="approve")
    b = requested(rec, done, open_)
    b.complete(done, {"v": 1})
    b.pause(open_, source="interrupt", metadata={}, now=NOW)
    b.cancel("not today", identity="bob")
    assert rec.kinds()[-2:] == [("answer", "r1"), ("tool_response", "r1")]
    assert rec.emitted[-1].output == {"error": "cancelled", "reason": "not today"}
    [record] = rec.state.answers
    assert (record.ref, record.kind, record.via, record.identity) == (
        "r1",
        "cancel",
        "cancel",
        "bob",
    )


def test_a_deadline_answers_as_the_system_with_the_declared_default(rec):
    spec = assistant.spec().model_copy(
        update={"interrupt_deadline_seconds": 60.0, "on_interrupt_timeout": {"approved": False}}
    )
    call = CallState(ref="r1", name="approve")
    b = InterruptBook([], spec=spec, emit=rec)
    b.request([call])
    b.pause(call, source="interrupt", metadata={}, now=NOW)
    assert b.expire(NOW + timedelta(seconds=59)) == []
    assert b.expire(NOW + timedelta(seconds=60)) == [call]
    answer = rec.emitted[-1]
    assert answer.answer is not None
    assert (answer.answer.kind, answer.answer.identity) == ("deadline", "system:deadline")
    assert answer.output == {"approved": False}
    [record] = rec.state.answers
    assert record.kind == "deadline"


def test_a_deadline_default_that_does_not_fit_becomes_the_stated_timeout(rec):
    spec = assistant.spec().model_copy(
        update={"interrupt_deadline_seconds": 1.0, "on_interrupt_timeout": {"x": "y" * 100}}
    )
    call = CallState(ref="r1", name="approve")
    b = InterruptBook([call], spec=spec, emit=rec)
    b.pause(call, source="interrupt", metadata={}, now=NOW)
    b.expire(NOW + timedelta(seconds=1), room=lambda: 10)
    assert call.answer_output == {"error": "timed out", "approved": False}


def test_a_failed_step_gives_every_call_a_response_when_abandoned(rec):
    ran, failed, never = (
        CallState(ref="a", name="lookup"),
        CallState(ref="b", name="boom"),
        CallState(ref="c", name="charge"),
    )
    b = requested(rec, ran, failed, never)
    b.complete(ran, {"ok": True})
    b.fail(failed, ErrorInfo(status="INTERNAL", message="boom"), uncertain=True)
    # A failure alone is not yet a response: the turn decides what the model is told.
    assert rec.kinds()[-1] == ("tool_response", "a")
    b.abandon(ErrorInfo(status="INTERNAL", message="boom"))
    assert rec.kinds()[-2:] == [("tool_response", "b"), ("tool_response", "c")]
    assert failed.output == {"error": "INTERNAL: boom", "note": "it may have taken effect"}
    assert never.output == {"error": "not run: the turn failed first", "status": "INTERNAL"}


# --------------------------------------------------------------------------------------------
# What the conversation keeps of them.


def test_kept_events_hold_no_payloads_and_offsets_count_on_past_the_bound():
    state = ConversationState(agent="a")
    call = CallState(ref="r", name="lookup", args={"secret": "x" * 500}, output={"v": "y" * 500})
    for _ in range(events.MAX_EVENTS_KEPT + 10):
        events.record(state, events.tool_response(call), turn=3, at=NOW)
    assert state.events_total == events.MAX_EVENTS_KEPT + 10
    assert len(state.events) == events.MAX_EVENTS_KEPT
    assert state.events[0].offset == 10
    assert state.events[-1].offset == events.MAX_EVENTS_KEPT + 9
    kept = state.events[-1]
    assert (kept.kind, kept.ref, kept.name, kept.turn, kept.at) == (
        "tool_response",
        "r",
        "lookup",
        3,
        NOW,
    )
    assert kept.output is None and kept.input is None


def test_the_largest_kept_event_stays_within_its_stated_size():
    call = CallState(ref="r" * 4000, name="n" * 4000, args={"a": "b" * 10_000})
    answer = events.answer(
        call,
        kind="respond",
        via="signal",
        identity="\u0001" * DOOR.identity,
        metadata={"m": "x" * 10_000},
        output={"o": "y" * 10_000},
    )
    failure = TurnEvent(
        kind="tool_response",
        name=call.name,
        ref=call.ref,
        error=ErrorInfo(status="S" * 5000, message="m" * 5000),
    )
    end = events.turn_end(
        TurnResult(turn=1, finish_reason=FinishReason.INTERRUPTED, text="t" * 10_000)
    )
    at = datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    for event in (answer, failure, end, events.text("z" * 10_000)):
        stamped = event.model_copy(update={"offset": 10**15, "turn": 10**9, "at": at})
        assert json_size(events.stored(stamped)) <= events.MAX_STORED_EVENT_BYTES


def test_the_state_carries_the_kept_events_through_its_wire_form():
    rec = Recorder()
    b = requested(rec, CallState(ref="r1", name="lookup"))
    b.complete(b.calls[0], {"v": 1})
    carried = ConversationState.model_validate(rec.state.model_dump(mode="json"))
    assert [(e.offset, e.kind) for e in carried.events] == [
        (0, "tool_request"),
        (1, "tool_response"),
    ]
    assert carried.events_total == 2


# --------------------------------------------------------------------------------------------
# The audit log and the rejection log.


def test_the_answer_log_is_the_fold_of_answer_events_only():
    state = ConversationState(agent="a")
    call = CallState(ref="r1", name="approve")
    for event in (
        events.tool_request(call),
        events.interrupt(call),
        events.answer(call, kind="restart", via="update", identity="carol", metadata={"t": 1}),
        events.tool_response(call),
    ):
        audit.apply(state, events.record(state, event, turn=1, at=NOW))
    assert state.answers == [
        AnswerRecord(
            at=NOW,
            ref="r1",
            name="approve",
            kind="restart",
            via="update",
            identity="carol",
            metadata={"t": 1},
            decision="answered",
        )
    ]


def test_large_resume_metadata_is_kept_as_its_digest():
    state = ConversationState(agent="a")
    call = CallState(ref="r1", name="approve")
    big = {"blob": "x" * 5000}
    event = events.answer(call, kind="respond", via="signal", metadata=big)
    audit.apply(state, events.record(state, event, turn=1, at=NOW))
    kept = state.answers[0].metadata
    assert kept is not None and kept != big
    assert json_size(kept) < 1024


def test_the_answer_log_sheds_its_oldest_records_and_counts_them():
    state = ConversationState(agent="a")
    call = CallState(ref="r", name="approve")
    for i in range(600):
        event = events.answer(call, kind="respond", via="update", identity=f"u{i}")
        audit.apply(state, events.record(state, event, turn=1, at=NOW))
    assert len(state.answers) == 500
    assert state.answers_dropped == 100
    assert state.answers[0].identity == "u100"


def test_a_rejection_keeps_a_digest_and_storable_text_only():
    raw = b'{"identity": "mallory", "respond": "\\ud83d secret"}'
    record = audit.rejection(
        at=NOW, handler="resume", reason="r" * 900, raw=raw, identity="m\ud83d"
    )
    assert record.digest.startswith("sha256:")
    assert b"secret" not in record.model_dump_json().encode()
    assert json_size(record) < 2048
    record.model_dump_json()  # storable: no lone surrogate survives
    state = ConversationState(agent="a")
    for _ in range(25):
        audit.reject(state, record)
    assert (len(state.rejections), state.rejections_total) == (20, 25)


# --------------------------------------------------------------------------------------------
# The operator view.


def paused_state(*calls: CallState) -> tuple[ConversationState, TurnState]:
    turn = TurnState(turn=2, started_at=NOW, base_len=0, phase="tools", calls=list(calls))
    return ConversationState(agent="banker", spec=assistant.spec(), turns=2, turn=turn), turn


def test_the_view_of_a_paused_conversation_names_what_it_waits_on():
    a = CallState(ref="r1", name="charge", args={"amount": 5})
    b = CallState(ref="r2", name="approve", args={"question": "q" * 500})
    state, turn = paused_state(a, b)
    book = InterruptBook(turn.calls, spec=state.spec)
    book.gate(a, now=NOW + timedelta(minutes=1))
    book.pause(b, source="interrupt", metadata={}, now=NOW)
    view = operator_view.project(
        state,
        chat_id="chat-1",
        namespace="default",
        pending=book.pending(),
        requests=book.requests(),
    )
    assert view.status == "interrupted"
    assert view.pending_names == ("approve", "charge")
    assert view.since == NOW
    first = view.memo_pending[0]
    assert (first["name"], first["ref"], first["input"]) == ("charge", "r1", {"amount": 5})
    assert first["source"] == "approval" and first["since"] and "input_cut" not in first
    assert view.memo_pending[1]["input"] == {"question": "q" * 500}  # fits OUT.memo_input
    assert "chat-1" in view.details and "charge" in view.details


@pytest.mark.parametrize(
    ("closed", "turn", "status"),
    [(True, True, "closed"), (False, False, "idle"), (False, True, "running")],
)
def test_the_status_follows_the_state(closed, turn, status):
    state = paused_state()[0] if turn else ConversationState(agent="a")
    state.closed = closed
    assert operator_view.status(state, paused=False) == status


def test_many_long_pending_names_are_cut_to_one_search_attribute_value():
    names = [f"{i:03d}" + "n" * 60 for i in range(100)]
    kept = operator_view.fit_names(names)
    assert kept == names[: len(kept)]
    assert 0 < len(kept) < 100
    assert json_size(kept) <= operator_view.SEARCH_ATTRIBUTE_VALUE_BYTES


def test_search_attributes_are_written_only_where_they_differ():
    state, turn = paused_state(CallState(ref="r1", name="charge", status="pending", since=NOW))
    book = InterruptBook(turn.calls, spec=state.spec)
    view = operator_view.project(
        state, chat_id="c", namespace="default", pending=list(turn.calls), requests=book.requests()
    )
    current = TypedSearchAttributes(
        [
            SearchAttributePair(config.AGENT_NAME, "banker"),
            SearchAttributePair(config.AGENT_STATUS, "interrupted"),
            SearchAttributePair(config.PENDING_INTERRUPTS, ["charge"]),
            SearchAttributePair(config.INTERRUPTED_SINCE, NOW),
        ]
    )
    assert operator_view.search_attribute_updates(current, agent="banker", view=view) == []
    idle = operator_view.project(
        ConversationState(agent="banker"), chat_id="c", namespace="default", pending=[], requests=[]
    )
    updates = operator_view.search_attribute_updates(current, agent="banker", view=idle)
    assert {u.key.name: u.value for u in updates} == {
        "AgentStatus": "idle",
        "PendingInterrupts": None,
        "InterruptedSince": None,
    }


# --------------------------------------------------------------------------------------------
# Raw payloads at the door, results fitted on the way out.


def raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def test_raw_payloads_are_decoded_or_refused_in_words():
    assert payload_json(raw(b'{"a": 1}')) == {"a": 1}
    with pytest.raises(ResumeError, match="empty"):
        payload_json(raw(b"", b"binary/null"))
    with pytest.raises(ResumeError, match="must be JSON"):
        payload_json(raw(b"x", b"binary/protobuf"))
    with pytest.raises(ResumeError, match="exactly one JSON argument, got 2"):
        only_argument("resume", [raw(b"{}"), raw(b"{}")])
    assert claimed_identity([raw(b'{"identity": "dan"}')]) == "dan"
    assert claimed_identity([raw(b"not json")]) is None
    assert claimed_identity([]) is None


def test_a_result_too_large_drops_interrupts_and_counts_them():
    from temporal_agent_interrupts.workflows.types import InterruptRequest

    many = [
        InterruptRequest(name="approve", ref=f"r{i}", input={"q": "x" * 1000}) for i in range(200)
    ]
    result = fit(PendingResult(interrupts=many), 20 * 1024)
    assert json_size(result) <= 20 * 1024


# --------------------------------------------------------------------------------------------
# On the stream: every item within its size, text never lost.


def test_long_text_is_split_over_stream_events_and_nothing_is_lost():
    text = ("é\u0001 ok " * 20_000)[:70_000]
    items = events.for_stream(events.text(text), limit=stream.MAX_ITEM_BYTES)
    assert len(items) > 4
    assert "".join(i.text or "" for i in items) == text
    assert all(json_size(i) <= stream.MAX_ITEM_BYTES for i in items)
    assert all(i.kind == "text" for i in items)


def test_a_large_tool_event_on_the_stream_shows_placeholders_within_its_size():
    call = CallState(
        ref="r1", name="lookup", args={"blob": "x" * 50_000}, output={"y": "z" * 50_000}
    )
    for event in (events.tool_request(call), events.tool_response(call), events.interrupt(call)):
        (item,) = events.for_stream(event, limit=stream.MAX_ITEM_BYTES)
        assert json_size(item) <= stream.MAX_ITEM_BYTES
        assert (item.kind, item.ref, item.name) == (event.kind, "r1", "lookup")
    small = events.tool_request(CallState(ref="r2", name="lookup", args={"k": 1}))
    assert events.for_stream(small, limit=stream.MAX_ITEM_BYTES) == [small]


def test_a_turn_end_paused_on_many_interrupts_fits_one_stream_item():
    from temporal_agent_interrupts.workflows.types import InterruptRequest

    many = [
        InterruptRequest(name="approve", ref=f"r{i}", input={"q": "x" * 300}) for i in range(200)
    ]
    end = events.turn_end(
        TurnResult(turn=1, finish_reason=FinishReason.INTERRUPTED, interrupts=many)
    )
    (item,) = events.for_stream(end, limit=stream.MAX_ITEM_BYTES)
    assert json_size(item) <= stream.MAX_ITEM_BYTES
    assert item.result is not None
    assert len(item.result.interrupts) + item.result.interrupts_omitted == 200


def test_a_poll_result_is_cut_to_its_budget_and_resumes_where_it_was_cut():
    from temporalio.contrib.workflow_streams import PollResult
    from temporalio.contrib.workflow_streams._types import _WorkflowStreamWireItem

    items = [_WorkflowStreamWireItem(topic="events", data="A" * 20_000, offset=i) for i in range(5)]
    cut = stream._cap(PollResult(items=items, next_offset=5), stream.POLL_BUDGET)
    assert [i.offset for i in cut.items] == [0, 1]
    assert (cut.next_offset, cut.more_ready) == (2, True)
    one = stream._cap(PollResult(items=items[:1], next_offset=1), 100)
    assert [i.offset for i in one.items] == [0]  # at least one, however large


def test_only_text_events_are_taken_from_outside_the_workflow():
    from temporalio.contrib.pydantic import pydantic_data_converter

    def wire(event: object) -> str:
        return stream.encode_item(pydantic_data_converter.payload_converter.to_payload(event))

    text_event = TurnEvent(kind="text", text="hi").model_dump(mode="json")
    assert stream._published_text(wire(text_event)) == "hi"
    forged = TurnEvent(kind="turn_end", result=TurnResult(finish_reason=FinishReason.STOP))
    assert stream._published_text(wire(forged.model_dump(mode="json"))) is None
    assert stream._published_text(wire({"kind": "text", "text": ""})) is None
    assert stream._published_text(wire({"kind": "text", "text": "x" * 20_000})) is None
    assert stream._published_text("not base64 at all") is None


def test_text_pieces_are_as_long_as_the_limit_allows():
    pieces = events.split_text("a" * 100_000, 16_000)
    assert "".join(pieces) == "a" * 100_000
    assert [stored_size(p) for p in pieces] == [16_000] * 6 + [4_000]
    wide = events.split_text("é\u0001" * 10_000, 16_000)  # 2 and 6 bytes as stored
    assert "".join(wide) == "é\u0001" * 10_000
    assert all(15_992 <= stored_size(p) <= 16_000 for p in wide[:-1])


# --------------------------------------------------------------------------------------------
# Decisions on record.


@pytest.mark.parametrize(
    ("source", "kind", "metadata", "output", "decided"),
    [
        ("approval", "restart", {"tool_approved": True}, None, "approved"),
        ("tool", "restart", {"tool_approved": True}, None, "approved"),
        ("approval", "restart", {}, None, "answered"),  # it asks again
        ("interrupt", "restart", {"tool_approved": True}, None, "answered"),
        ("approval", "respond", None, {"error": "denied by the user"}, "denied"),
        ("tool", "respond", None, {"anything": 1}, "denied"),  # the tool does not run
        ("interrupt", "respond", None, {"approved": True}, "approved"),
        ("interrupt", "respond", None, {"approved": False, "feedback": "no"}, "denied"),
        ("interrupt", "respond", None, {"priority": "urgent"}, "answered"),
        ("interrupt", "deadline", None, {"approved": False}, "expired"),
        ("approval", "cancel", None, None, "cancelled"),
    ],
)
def test_what_each_answer_decided(source, kind, metadata, output, decided):
    call = CallState(ref="r", name="t", source=source, answer_metadata=metadata)
    assert events.decision(call, kind=kind, output=output) == decided


def test_the_audit_record_keeps_the_decision_and_the_output_or_its_digest():
    state = ConversationState(agent="a")
    call = CallState(ref="r1", name="approve", source="interrupt")
    small = events.answer(call, kind="respond", via="signal", output={"approved": False})
    big = events.answer(call, kind="respond", via="update", output={"reason": "x" * 5000})
    for event in (small, big):
        audit.apply(state, events.record(state, event, turn=1, at=NOW))
    first, second = state.answers
    assert (first.decision, first.output, first.identity_verified) == (
        "denied",
        {"approved": False},
        False,
    )
    assert second.decision == "answered"
    assert second.output is not None and "sha256" in second.output
    assert state.events[-1].answer is not None
    assert state.events[-1].answer.decision == "answered"  # kept in the stored form too

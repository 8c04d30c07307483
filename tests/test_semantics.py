"""The decided semantics (DESIGN.md 1-9), each against a real dev server and a scripted model."""

from __future__ import annotations

import asyncio
import gc
import json
import logging

import pytest
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.errors import ResumeRejected, SendRejected, UnknownAgent
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.workflows.config import MODEL_ACTIVITY
from tests import agents as t
from tests.helpers import (
    assert_no_workflow_task_failed,
    events_of,
    history,
    scheduled_activities,
)


async def test_plain_text_turn_sends_agent_definition(run_worker, model, client):
    model.reply(text("Hello!"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("hi")
    assert res.finish_reason == FinishReason.STOP
    assert res.text == "Hello!"
    req = model.requests[0]
    assert req.model == "gemini-test"  # the googleai/ prefix is stripped
    assert req.system() == "You are a test assistant."
    assert req.tool_names() == ["approve", "lookup", "charge", "boom", "denied", "bad_interrupt"]
    assert req.body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    # Automatic function calling is off: the request carries no AFC loop, one call per model step.
    assert model.calls == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_parallel_calls_run_concurrently_and_completed_siblings_are_not_rerun(
    run_worker, model, client
):
    """Semantics 1 and 7: concurrent calls, interrupts in call order, one tool message."""
    model.reply(
        calls(
            ("lookup", {"key": "a"}, "c1"),
            ("approve", {"question": "ok?"}, "c2"),
            ("lookup", {"key": "b"}, "c3"),
            ("charge", {"amount": 5}, "c4"),
        ),
        text("all done"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("do it all")
        assert res.finish_reason == FinishReason.INTERRUPTED
        assert [(i.name, i.ref) for i in res.interrupts] == [("approve", "c2"), ("charge", "c4")]
        assert t.RUNS == {"lookup": 2, "charge": 1}

        hist = await history(client, chat.id)
        # All three runnable calls were scheduled before any of them completed: one batch.
        kinds = [
            e.event_type
            for e in hist.events
            if e.event_type
            in (
                EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            )
        ]
        assert kinds[:5] == [
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,  # model
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,  # lookup a
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,  # lookup b
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,  # charge
        ]

        approve_i, charge_i = res.interrupts
        res = await chat.resume(
            respond=[approve_i.respond({"approved": True})],
            restart=[charge_i.restart({"tool_approved": True})],
        )
    assert res.finish_reason == FinishReason.STOP
    assert res.text == "all done"
    # lookups were not re-run; only the restarted charge ran again.
    assert t.RUNS == {"lookup": 2, "charge": 2}
    sent = model.requests[1]
    responses = sent.function_responses()
    assert [(r["name"], r["id"]) for r in responses] == [
        ("lookup", "c1"),
        ("approve", "c2"),
        ("lookup", "c3"),
        ("charge", "c4"),
    ]
    assert responses[0]["response"] == {"key": "a", "value": "A"}
    assert responses[1]["response"] == {"approved": True}
    assert responses[3]["response"] == {"charged": 5.0}
    # One tool message: the model's call message, then exactly one content with all responses.
    assert [c["role"] for c in sent.contents] == ["user", "model", "user"]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_refs_use_call_ids_once_and_reach_the_tool(run_worker, model):
    """Semantics 2: a call id is the ref when unused; a reused id gets a fresh uuid."""
    model.reply(
        calls(("lookup", {"key": "x"}, "id-1")),
        text("one"),
        calls(("lookup", {"key": "y"}, "id-1"), ("approve", {"question": "?"})),
        text("two"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("first")
        res = await chat.send("second")
        (pending,) = res.interrupts
        await chat.resume(respond=[pending.respond({"approved": True})])
    assert t.CONTEXTS[0].ref == "id-1"
    assert t.CONTEXTS[0].chat_id == chat.id
    second_ref = t.CONTEXTS[1].ref
    assert second_ref != "id-1" and len(second_ref) == 36  # a workflow uuid4
    assert pending.ref not in ("id-1", second_ref) and len(pending.ref) == 36
    # Function responses echo the model's own call id (none when it gave none).
    assert [r.get("id") for r in model.requests[1].function_responses()] == ["id-1"]
    assert [r.get("id") for r in model.requests[3].function_responses()] == ["id-1", None]


async def test_refs_are_stable_across_replay(run_worker, model, client):
    """With no workflow cache every task replays from history: refs must not move."""
    model.reply(calls(("approve", {"question": "a"}), ("approve", {"question": "b"})), text("ok"))
    async with run_worker(max_cached_workflows=0) as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
        refs = [i.ref for i in res.interrupts]
        assert [i.ref for i in await chat.pending()] == refs
        first, second = res.interrupts
        mid = await chat.resume(respond=[first.respond({"approved": True})])
        assert [i.ref for i in mid.interrupts] == [refs[1]]
        assert [i.ref for i in await chat.pending()] == [refs[1]]
        done = await chat.resume(respond=[second.respond({"approved": False})])
    assert done.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, chat.id)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda i: {"respond": []}, "empty resume"),
        (lambda i: {"respond": [{"name": "approve", "ref": "nope", "output": {}}]}, "unknown ref"),
        (
            lambda i: {"respond": [{"name": "lookup", "ref": i.ref, "output": {"approved": True}}]},
            "is a call to 'approve', not 'lookup'",
        ),
        (
            lambda i: {
                "restart": [{"name": "approve", "ref": i.ref, "input": {"question": "changed"}}]
            },
            "changes the tool's input",
        ),
        (
            lambda i: {
                "respond": [{"name": "approve", "ref": i.ref, "output": {"approved": "yes"}}]
            },
            "does not fit its output schema",
        ),
        (
            lambda i: {
                "respond": [
                    {"name": "approve", "ref": i.ref, "output": {"approved": True}},
                    {"name": "approve", "ref": i.ref, "output": {"approved": False}},
                ]
            },
            "more than once",
        ),
    ],
)
async def test_resume_is_validated_against_the_pending_set(
    run_worker, model, client, build, reason
):
    """Semantics 3: a bad resume is rejected whole, before anything runs, leaving no history."""
    from temporal_agent_interrupts.workflows.types import ResumeInput

    model.reply(calls(("approve", {"question": "q"}), ("lookup", {"key": "k"})), text("done"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
        (pending,) = res.interrupts
        before = await history(client, chat.id)
        payload = ResumeInput.model_validate(build(pending))
        with pytest.raises(ResumeRejected, match=reason):
            await chat.resume(respond=payload.respond, restart=payload.restart)
        after = await history(client, chat.id)
        # The validator rejected it: nothing reached history, nothing ran.
        assert len(after.events) == len(before.events)
        assert await chat.pending() == res.interrupts
        assert t.RUNS == {"lookup": 1}
        assert model.calls == 1
        ok = await chat.resume(respond=[pending.respond({"approved": True})])
    assert ok.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, chat.id)


async def test_resume_while_nothing_is_paused_is_rejected(run_worker, model):
    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hello")
        from temporal_agent_interrupts.workflows.types import ToolResponse

        with pytest.raises(ResumeRejected, match="nothing is paused"):
            await chat.resume(respond=[ToolResponse(name="approve", ref="r", output={})])


async def test_each_interrupt_is_answered_exactly_once(run_worker, model, client):
    """Semantics 4: concurrent and sequential duplicates are rejected; the turn continues once."""
    model.reply(calls(("approve", {"question": "q"})), text("done"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("go")).interrupts
        answer = i.respond({"approved": True})
        results = await asyncio.gather(
            chat.resume(respond=[answer]),
            chat.resume(respond=[answer]),
            chat.resume(respond=[answer]),
            return_exceptions=True,
        )
        ok = [r for r in results if not isinstance(r, BaseException)]
        rejected = [r for r in results if isinstance(r, ResumeRejected)]
        assert len(ok) == 1 and len(rejected) == 2, results
        assert ok[0].finish_reason == FinishReason.STOP
        with pytest.raises(ResumeRejected):
            await chat.resume(respond=[answer])
        hist = await chat.history()
    assert model.calls == 2
    assert [(a.ref, a.kind) for a in hist.answers] == [(i.ref, "respond")]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_partial_answers_accumulate(run_worker, model, client):
    """Semantics 5: the turn continues only once every interrupt has an answer."""
    model.reply(
        calls(("approve", {"question": "a"}), ("approve", {"question": "b"}), say="Two questions."),
        text("both answered"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
        assert res.text == "Two questions."
        a, b = res.interrupts
        mid = await chat.resume(respond=[a.respond({"approved": True})])
        assert mid.finish_reason == FinishReason.INTERRUPTED
        assert [i.ref for i in mid.interrupts] == [b.ref]
        assert model.calls == 1  # nothing continued yet
        done = await chat.resume(respond=[b.respond({"approved": False, "note": "no"})])
    assert done.finish_reason == FinishReason.STOP
    assert done.text == "both answered"
    responses = model.requests[1].function_responses()
    assert [r["response"] for r in responses] == [
        {"approved": True},
        {"approved": False, "note": "no"},
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_restart_reruns_with_metadata_and_can_pause_again(run_worker, model, client):
    """Semantics 6: restart runs the tool again; it may interrupt again on the same ref."""
    model.reply(calls(("charge", {"amount": 12.5})), text("charged"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("charge me")).interrupts
        assert i.metadata == {"amount": 12.5, "attempt": 1}
        assert i.source == "tool"
        again = await chat.resume(restart=[i.restart({"note": "try again"})])
        assert again.finish_reason == FinishReason.INTERRUPTED
        (j,) = again.interrupts
        assert j.ref == i.ref
        assert j.metadata == {"amount": 12.5, "attempt": 2}
        done = await chat.resume(restart=[j.restart({"tool_approved": True})])
    assert done.finish_reason == FinishReason.STOP
    assert t.RUNS["charge"] == 3
    assert [(c.resumed, c.resumed_metadata) for c in t.CONTEXTS] == [
        (False, {}),
        (True, {"note": "try again"}),
        (True, {"tool_approved": True}),
    ]
    assert model.requests[1].function_responses()[0]["response"] == {"charged": 12.5}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_restarting_an_interrupt_only_tool_pauses_again(run_worker, model):
    model.reply(calls(("approve", {"question": "q"})), text("ok"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("go")).interrupts
        again = await chat.resume(restart=[i.restart({"why": "ask again"})])
        assert again.finish_reason == FinishReason.INTERRUPTED
        (j,) = again.interrupts
        assert (j.ref, j.metadata) == (i.ref, {"why": "ask again"})
        done = await chat.resume(respond=[j.respond({"approved": True})])
    assert done.finish_reason == FinishReason.STOP
    assert model.calls == 2


async def test_identity_and_metadata_are_audited_not_sent_to_the_model(run_worker, model):
    """Semantics 7: the audit log keeps who answered; Gemini never sees it."""
    model.reply(calls(("approve", {"question": "q"})), text("ok"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("go")).interrupts
        await chat.resume(
            respond=[i.respond({"approved": True})],
            identity="alice@example.com",
            metadata={"ticket": "SEC-123"},
        )
        hist = await chat.history()
    (record,) = hist.answers
    assert (record.identity, record.metadata, record.via) == (
        "alice@example.com",
        {"ticket": "SEC-123"},
        "update",
    )
    sent = json.dumps(model.requests[1].body)
    assert "alice@example.com" not in sent and "SEC-123" not in sent


async def test_message_while_paused_is_rejected_and_cancel_withdraws(run_worker, model, client):
    """Semantics 8."""
    model.reply(
        calls(("lookup", {"key": "k"}), ("approve", {"question": "q"})),
        text("fresh start"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("go")).interrupts
        with pytest.raises(SendRejected, match="paused on interrupts"):
            await chat.send("something else")
        cancelled = await chat.cancel("changed my mind", identity="bob")
        assert cancelled.finish_reason == FinishReason.CANCELLED
        assert await chat.pending() == []
        with pytest.raises(ResumeRejected, match="nothing is paused"):
            await chat.resume(respond=[i.respond({"approved": True})])
        res = await chat.send("new question")
        hist = await chat.history()
    assert res.finish_reason == FinishReason.STOP
    # The model saw a response for every call of the cancelled message, then the new text.
    last = model.requests[1].contents[-1]["parts"]
    assert last[0]["functionResponse"]["response"] == {"key": "k", "value": "K"}
    assert last[1]["functionResponse"]["response"] == {
        "error": "cancelled",
        "reason": "changed my mind",
    }
    assert last[2] == {"text": "new question"}
    assert [(a.kind, a.identity) for a in hist.answers] == [("cancel", "bob")]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_cancel_with_nothing_to_cancel_is_an_error(run_worker, model):
    from temporal_agent_interrupts import AgentError

    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hello")
        with pytest.raises(AgentError, match="nothing to cancel"):
            await chat.cancel()


async def test_failed_model_call_rolls_back_and_chat_stays_usable(run_worker, model, client):
    """Semantics 9: a failed turn leaves the conversation as before; the workflow lives on."""
    model.reply(
        text("first answer"),
        Reply.error(400, "Request contains an invalid argument."),
        text("second answer"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("one")
        failed = await chat.send("two")
        assert failed.finish_reason == FinishReason.FAILED
        assert failed.error is not None
        assert failed.error.status == "INVALID_ARGUMENT"
        assert "invalid argument" in failed.error.message
        assert model.calls == 2  # a 400 is not retried
        ok = await chat.send("three")
        desc = await client.get_workflow_handle(chat.id).describe()
    assert ok.text == "second answer"
    texts = [c["parts"][0].get("text") for c in model.requests[2].contents]
    assert texts == ["one", "first answer", "three"]
    assert desc.status is not None and desc.status.name == "RUNNING"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_transient_model_errors_are_retried_by_temporal(run_worker, model):
    model.reply(
        Reply.error(503, "overloaded", **{"Retry-After": "0"}),
        text("recovered"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("hi")
    assert res.text == "recovered"
    assert model.calls == 2


async def test_tool_error_keeps_status_and_message(run_worker, model, client):
    model.reply(calls(("denied", {"key": "k9"})))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
    assert res.finish_reason == FinishReason.FAILED
    assert res.error is not None
    assert (res.error.status, res.error.message) == ("PERMISSION_DENIED", "key k9 is not yours")
    assert t.RUNS["denied"] == 1  # classified errors are not retried
    await assert_no_workflow_task_failed(client, chat.id)


async def test_unclassified_exceptions_are_retried_then_internal_without_their_text(
    run_worker, model, client
):
    model.reply(calls(("boom", {"key": "k"})), text("after"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
        assert res.finish_reason == FinishReason.FAILED
        assert res.error is not None
        assert res.error.status == "INTERNAL"
        assert "hunter2" not in res.error.message
        assert res.error.message == "tool 'boom' failed"
        assert t.RUNS["boom"] == 3
        # The detail stays in Temporal's history for operators.
        hist = await history(client, chat.id)
        assert "hunter2" in json.dumps(hist.to_json_dict())
        again = await chat.send("still there?")
    assert again.text == "after"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_interrupt_metadata_must_be_an_object(run_worker, model, client):
    model.reply(calls(("bad_interrupt", {"key": "k"})))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
    assert res.finish_reason == FinishReason.FAILED
    assert res.error is not None
    assert "interrupt metadata must be a JSON object" in res.error.message
    assert "list" in res.error.message
    assert t.RUNS["bad_interrupt"] == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_tool_approval_gates_tools_not_on_the_allow_list(run_worker, model, client):
    model.reply(
        calls(("lookup", {"key": "k"}), ("charge", {"amount": 1}), ("charge", {"amount": 2})),
        text("done"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("gated")
        res = await chat.send("go")
        assert t.RUNS == {"lookup": 1}  # allowed: ran; gated: did not run yet
        first, second = res.interrupts
        assert first.source == "approval"
        assert first.metadata == {"message": "Tool not in approved list: charge"}
        # Restart without approval: pauses again on the same refs, still without running.
        again = await chat.resume(restart=[first.restart(), second.restart()])
        assert again.finish_reason == FinishReason.INTERRUPTED
        assert [i.ref for i in again.interrupts] == [first.ref, second.ref]
        assert t.RUNS == {"lookup": 1}
        # Approve one by restart (it runs, and passes its own check), deny the other by respond.
        done = await chat.resume(
            restart=[first.restart({"tool_approved": True})],
            respond=[second.respond({"denied": "not today"})],
        )
    assert done.finish_reason == FinishReason.STOP
    assert t.RUNS == {"lookup": 1, "charge": 1}
    responses = model.requests[1].function_responses()
    assert [r["response"] for r in responses] == [
        {"key": "k", "value": "K"},
        {"charged": 1.0},
        {"denied": "not today"},
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_unknown_tool_and_bad_arguments_go_back_to_the_model(run_worker, model):
    model.reply(
        calls(("teleport", {"to": "mars"}), ("lookup", {"wrong": 1}), ("approve", {"nope": True})),
        text("sorry"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("go")
    assert res.finish_reason == FinishReason.STOP
    errors = [r["response"]["error"] for r in model.requests[1].function_responses()]
    assert errors[0].startswith("unknown tool 'teleport'")
    assert errors[1].startswith("invalid arguments: key: Field required")
    assert errors[2].startswith("invalid arguments:") and "question" in errors[2]
    assert t.RUNS == {}


async def test_max_turns_ends_a_runaway_loop(run_worker, model):
    model.reply(*[calls(("lookup", {"key": str(n)})) for n in range(4)], text("next turn"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        res = await chat.send("loop")
        assert res.finish_reason == FinishReason.MAX_TURNS
        assert model.calls == 4 and t.RUNS["lookup"] == 4
        nxt = await chat.send("hello again")
    assert nxt.text == "next turn"
    # The cut-short turn's last tool responses and the new text share one user content.
    parts = model.requests[-1].contents[-1]["parts"]
    assert "functionResponse" in parts[0] and parts[-1] == {"text": "hello again"}


async def test_unknown_agent_fails_the_turn_clearly(run_worker, model):
    """A new chat for an agent no worker hosts: the send raises UnknownAgent, and the
    conversation is closed with the failed turn as its result (tests/test_web_glue.py has the
    rest)."""
    async with run_worker() as agents:
        chat = await agents.chat("noSuchAgent")
        with pytest.raises(UnknownAgent) as raised:
            await chat.send("hi")
        result = await chat.handle.result()
    assert raised.value.agent == "noSuchAgent" and "assistant" in raised.value.hosted
    res = result.last_turn
    assert res is not None and res.finish_reason == FinishReason.FAILED and res.closed
    assert res.error is not None
    assert res.error.status == "NOT_FOUND"
    assert "noSuchAgent" in res.error.message
    assert model.calls == 0


async def test_definition_is_recorded_once_then_only_when_it_changes(run_worker, model, client):
    model.reply(text("a"), text("b"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("one")
        await chat.send("two")
    hist = await history(client, chat.id)
    results = [
        e.activity_task_completed_event_attributes.result.payloads[0].data
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    ]
    specs = [json.loads(r)["spec"] for r in results]
    assert specs[0]["name"] == "assistant" and specs[0]["tools"][0]["interrupt_only"] is True
    assert specs[1] is None
    assert scheduled_activities(hist) == [MODEL_ACTIVITY, MODEL_ACTIVITY]


async def test_send_to_another_agents_chat_is_rejected(run_worker, model):
    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant", chat_id="shared-id-" + __name__)
        await chat.send("hello")
        other = await agents.chat("gated", chat_id=chat.id)
        with pytest.raises(SendRejected, match="belongs to agent 'assistant'"):
            await other.send("hijack")
        await chat.close()
        with pytest.raises(SendRejected, match="closed"):
            await chat.send("after close")


async def test_rejected_start_leaves_no_unretrieved_future(run_worker, model, caplog):
    """A send to a closed chat must not leave an exception for the garbage collector to log.

    That finalizer, run mid-import by the GC, was measured corrupting CPython 3.11's AST
    recursion check (SystemError) and crashing pytest's terminal summary.
    """
    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hello")
        await chat.close()
        with pytest.raises(SendRejected):
            await chat.send("after close")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert "never retrieved" not in caplog.text


async def test_cancelling_the_workflow_closes_the_conversation(run_worker, model, client):
    """An operator's 'Cancel' in the UI ends the conversation as closed, not as a failure."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    from temporal_agent_interrupts.workflows.config import AGENT_STATUS

    model.reply(calls(("approve", {"question": "q"})))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("go")
        handle = client.get_workflow_handle(chat.id)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.CANCELED
    assert desc.typed_search_attributes.get(AGENT_STATUS) == "closed"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_model_calls_carry_only_new_messages_in_history(run_worker, model, client):
    """History grows with each turn, not with the square of the conversation's length."""
    turns = 6
    for n in range(turns):
        model.reply(calls(("lookup", {"key": f"k{n}"})), text(f"answer {n}"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        for n in range(turns):
            await chat.send(f"question {n} " + "x" * 2000)
    hist = await history(client, chat.id)
    inputs = [
        json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        if e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_ACTIVITY
    ]
    assert len(inputs) == 2 * turns
    assert [i["new_from"] for i in inputs[:4]] == [0, 2, 4, 6]
    assert all(len(i["new_messages"]) <= 2 and "messages" not in i for i in inputs)
    assert inputs[-1]["history_size"] == 4 * turns - 1
    # Yet the model saw the whole conversation every time.
    assert len(model.requests[-1].contents) == 4 * turns - 1
    sizes = [
        len(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    ]
    assert max(sizes) < 6000

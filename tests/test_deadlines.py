"""Interrupt deadlines are durable timers (semantics 10), tested on the time-skipping server."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporal_agent_interrupts import AgentClient, FinishReason, interrupt, tool
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import Agent, Escalate, Remind, ToolApproval
from temporal_agent_interrupts.workflows.types import Notice
from tests import agents as t
from tests.agents import Answer, Ask, lookup

approve_by_tomorrow = interrupt(
    "approveByTomorrow",
    "Ask a human; they have a day.",
    input=Ask,
    output=Answer,
    timeout=timedelta(hours=24),
    on_timeout={"approved": False, "note": "timed out"},
)

deadline_agent = Agent(
    "deadlineAgent",
    model="gemini-test",
    tools=[approve_by_tomorrow, lookup],
    middleware=[ToolApproval(allow=[])],
    # Every other interrupt (here: the gated lookup) gets an agent-wide hour.
    interrupt_timeout=timedelta(hours=1),
    on_interrupt_timeout={"error": "nobody answered"},
)


async def test_deadline_answers_with_the_default_and_audits_it(skipping, model):
    model.reply(calls(("approveByTomorrow", {"question": "ship it?"})), text("it timed out"))
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(
        skipping.client, agents=[deadline_agent], task_queue=queue, gemini=model.client()
    ):
        chat = await AgentClient(skipping.client, task_queue=queue).chat("deadlineAgent")
        res = await chat.send("go")
        (i,) = res.interrupts
        assert i.deadline is not None and i.since is not None
        assert i.deadline - i.since == timedelta(hours=24)
        # An hour in, it is still waiting.
        await skipping.sleep(timedelta(hours=1))
        assert [p.ref for p in await chat.pending()] == [i.ref]
        await skipping.sleep(timedelta(hours=24))
        done = await chat.last_turn()
        hist = await chat.history()
    assert done is not None and done.finish_reason == FinishReason.STOP
    assert done.text == "it timed out"
    assert model.requests[1].function_responses()[0]["response"] == {
        "approved": False,
        "note": "timed out",
    }
    (record,) = hist.answers
    assert (record.kind, record.identity) == ("deadline", "system:deadline")


async def test_agent_wide_deadline_applies_to_gated_calls(skipping, model):
    model.reply(
        calls(("approveByTomorrow", {"question": "a"}), ("lookup", {"key": "k"})), text("ok")
    )
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(
        skipping.client, agents=[deadline_agent], task_queue=queue, gemini=model.client()
    ):
        chat = await AgentClient(skipping.client, task_queue=queue).chat("deadlineAgent")
        a, gated = (await chat.send("go")).interrupts
        assert gated.source == "approval"
        assert gated.deadline is not None and gated.since is not None
        assert gated.deadline - gated.since == timedelta(hours=1)
        # A human answers one in time; the gated call falls to the agent-wide deadline.
        await chat.resume(respond=[a.respond({"approved": True})])
        await skipping.sleep(timedelta(hours=2))
        done = await chat.last_turn()
    assert done is not None and done.finish_reason == FinishReason.STOP
    responses = [r["response"] for r in model.requests[1].function_responses()]
    assert responses == [{"approved": True}, {"error": "nobody answered"}]
    assert t.RUNS == {}  # the gated tool never ran


# ----------------------------------------------------------------------------------------------
# Escalation: reminders before the deadline, a notifying tool at it, one extension, then the
# final policy. A real 24-hour deadline, skipped through on the time-skipping server.

NOTICES: list[Notice] = []


@tool("pageOfficer", "Tell the duty officer an approval is waiting.")
async def page_officer(notice: Notice) -> dict[str, str]:
    NOTICES.append(notice)
    return {"paged": notice.interrupt.ref}


escalating_approval = interrupt(
    "escalatingApproval",
    "Ask a human; remind them, then page the officer, then give up.",
    input=Ask,
    output=Answer,
    timeout=timedelta(hours=24),
    reminders=[Remind(notify=page_officer, before=timedelta(hours=2))],
    on_timeout=Escalate(notify=page_officer, extend=timedelta(hours=4), then="cancel"),
)

escalating_agent = Agent(
    "escalatingAgent",
    model="gemini-test",
    tools=[escalating_approval],
    # Gated calls: escalate, then answer with a default once the extension passes too.
    interrupt_timeout=timedelta(hours=1),
    on_interrupt_timeout=Escalate(
        notify=page_officer, extend=timedelta(minutes=30), then={"error": "nobody answered"}
    ),
)


async def test_a_24_hour_deadline_reminds_escalates_once_then_cancels(skipping, model):
    NOTICES.clear()
    model.reply(calls(("escalatingApproval", {"question": "ship it?"}, "x1")))
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(
        skipping.client, agents=[escalating_agent], task_queue=queue, gemini=model.client()
    ):
        chat = await AgentClient(skipping.client, task_queue=queue).chat("escalatingAgent")
        (i,) = (await chat.send("go")).interrupts
        assert i.deadline is not None and i.since is not None
        await skipping.sleep(timedelta(hours=21))
        assert NOTICES == []
        # Two hours before the deadline: the reminder.
        await skipping.sleep(timedelta(hours=1, minutes=30))
        assert [(n.reason, n.interrupt.ref) for n in NOTICES] == [("reminder", "x1")]
        # At the deadline: the officer is paged and the call waits four hours more.
        await skipping.sleep(timedelta(hours=2))
        assert [n.reason for n in NOTICES] == ["reminder", "escalation"]
        (still,) = await chat.pending()
        assert still.deadline == i.deadline + timedelta(hours=4)
        assert NOTICES[1].interrupt.deadline == still.deadline
        # Once the extension passes too, the turn is cancelled.
        await skipping.sleep(timedelta(hours=4))
        done = await chat.last_turn()
        hist = await chat.history()
    assert done is not None and done.finish_reason == FinishReason.CANCELLED
    assert len(NOTICES) == 2  # the deadline extends once
    (record,) = hist.answers
    assert (record.kind, record.via, record.decision, record.identity) == (
        "cancel",
        "deadline",
        "cancelled",
        "system:deadline",
    )


async def test_an_escalated_gate_deadline_answers_with_its_final_default(skipping, model):
    NOTICES.clear()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("gave up"))
    queue = f"tq-{uuid.uuid4()}"
    gated_agent = Agent(
        "escalatingGate",
        model="gemini-test",
        tools=[lookup],
        middleware=[ToolApproval(allow=[])],
        interrupt_timeout=timedelta(hours=1),
        on_interrupt_timeout=Escalate(
            notify=page_officer, extend=timedelta(minutes=30), then={"error": "nobody answered"}
        ),
    )
    async with build_worker(
        skipping.client, agents=[gated_agent], task_queue=queue, gemini=model.client()
    ):
        chat = await AgentClient(skipping.client, task_queue=queue).chat("escalatingGate")
        (gated,) = (await chat.send("go")).interrupts
        assert gated.source == "approval"
        await skipping.sleep(timedelta(hours=1, minutes=10))
        assert [(n.reason, n.interrupt.name) for n in NOTICES] == [("escalation", "lookup")]
        await skipping.sleep(timedelta(minutes=30))
        done = await chat.last_turn()
    assert done is not None and done.text == "gave up"
    responses = [r["response"] for r in model.requests[1].function_responses()]
    assert responses == [{"error": "nobody answered"}]
    assert t.RUNS == {}  # the gated tool never ran; the notifying tool is not the model's
    assert "pageOfficer" not in model.requests[0].tool_names()

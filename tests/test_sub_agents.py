"""Agents as tools (``agent_tool``): a sub-agent's conversation is a child workflow of the
caller's, its interrupts wait in the child by the child's rules, its answer is the call's output.

Real dev server, the offline stand-in's rules (``call TOOL {json}``) on the real Gemini wire.
"""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus

from temporal_agent_interrupts import Agent, FinishReason, ToolError, agent_tool, approve, tool
from temporal_agent_interrupts.activities.subagents import with_sub_agents
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.types import GrantScope
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.config import (
    MAX_AGENT_DEPTH,
    SUB_AGENT_RESUME_ACTIVITY,
    SUB_AGENT_SIGNAL,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.subagents import OUTPUT_REQUEST
from tests.agents import SUB_RUNS as RUNS
from tests.agents import SubPayment as Payment
from tests.agents import payments, supervisor
from tests.docs import block
from tests.helpers import assert_no_workflow_task_failed, eventually, server_address
from tests.test_docs_examples import load
from tests.test_durability import replayer


@pytest.fixture
def offline() -> ScriptedModel:
    return ScriptedModel(offline_rules)


def delegate(to: str, amount: float, *, tool_name: str = "payments", child: str = "pay") -> str:
    task = f"call {child} {json.dumps({'to': to, 'amount': amount})}"
    return f"call {tool_name} {json.dumps({'input': task})}"


async def children(client: Client, parent: str, *, count: int = 1) -> list[str]:
    """The chat ids of ``parent``'s sub-agent conversations, once ``count`` are listed."""

    async def listed() -> list[str]:
        query = f'ParentWorkflowId = "{parent}"'
        return sorted([w.id async for w in client.list_workflows(query)])

    return await eventually(listed, lambda ids: len(ids) >= count, timeout=20)


async def paused(chat: Chat) -> list:
    return await eventually(chat.pending, bool, timeout=20)


async def test_a_sub_agent_s_interrupt_surfaces_on_the_caller_and_is_answered_through_it(
    client, offline
):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("bob", 5))
        # The caller's turn pauses with the child's interrupt, its path the caller's call ref
        # and then the child's.
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        (child_id,) = await children(client, parent.id)
        assert i.name == "pay" and i.source == "approval" and i.chat_id == child_id
        assert len(i.path) == 2 and i.path[1] == i.ref and child_id == f"{parent.id}--{i.path[0]}"
        assert [p.ref for p in await parent.pending()] == [i.ref]
        # On the stream, and in the inbox (the memo), under the caller's chat.
        ends = [e async for e in _until_pause(parent)]
        assert ends[-1].result is not None and ends[-1].result.interrupts[0].path == i.path
        inbox = await eventually(
            lambda: agents.pending(agent="supervisor"),
            lambda chats: any(c.chat_id == parent.id for c in chats),
            timeout=20,
        )
        (entry,) = [c for c in inbox if c.chat_id == parent.id]
        assert [e.ref for e in entry.interrupts] == [i.ref]
        assert RUNS["bob"] == 0
        # The child's approvers hold for an answer through the caller: bob may not approve.
        with pytest.raises(ResumeRejected, match="refused by sub-agent"):
            await parent.resume(answers=[approve(i)], identity="bob")
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert "paid" in done.text
        assert RUNS["bob"] == 1
        (record,) = await agents.audit(child_id)
        assert record.identity == "alice" and record.decision == "approved"
        assert record.chat_id is None  # the child's own trail
        # The caller's trail holds it too, naming the conversation it was applied in.
        trail = await agents.audit(parent.id)
        (through,) = [r for r in trail if r.kind not in ("forwarded", "sub_agent")]
        (passed_on,) = [r for r in trail if r.kind == "forwarded"]
        # And its own record that the sub-agent ended, which pins the child's receipts.
        (ended,) = [r for r in trail if r.kind == "sub_agent"]
        assert (ended.chat_id, ended.ref, ended.identity) == (child_id, i.path[0], None)
        assert through.chat_id == child_id and through.ref == i.ref
        assert through.identity == "alice" and through.decision == "approved"
        # And its own record of passing the answer on, with the child's verdict (bob's answer
        # never left the caller: refused by the child's rules as the caller shows them).
        assert (passed_on.kind, passed_on.ref, passed_on.chat_id) == ("forwarded", i.ref, child_id)
        assert (passed_on.identity, passed_on.verdict) == ("alice", "applied")
        # The child's conversation answered its one call and closed.
        desc = await client.get_workflow_handle(child_id).describe()
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        assert await parent.pending() == []
    await assert_no_workflow_task_failed(client, parent.id)
    await assert_no_workflow_task_failed(client, child_id)


async def _until_pause(chat: Chat):
    async for event in chat.events(after=0):
        yield event
        if event.kind == "turn_end":
            return


async def test_two_sub_agents_in_one_message_are_answered_one_at_a_time(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        text = delegate("carol", 1) + "\n" + delegate("dave", 2)
        paused = await parent.send(text)
        assert paused.finish_reason == FinishReason.INTERRUPTED
        both = await eventually(parent.pending, lambda p: len(p) == 2, timeout=20)
        first, second = both
        assert first.chat_id != second.chat_id
        # One through the caller: the turn waits on the other still.
        still = await parent.resume(answers=[approve(first)], identity="alice")
        assert still.finish_reason == FinishReason.INTERRUPTED, still
        left = await eventually(parent.pending, lambda p: len(p) == 1, timeout=20)
        assert [p.ref for p in left] == [second.ref]
        assert RUNS["carol"] == 1 and RUNS["dave"] == 0
        # The other straight on the child's own chat.
        assert second.chat_id is not None
        child = await agents.chat("payments", chat_id=second.chat_id)
        await child.resume(answers=[approve(second)], identity="alice")
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "paid" in done.text
        assert RUNS["carol"] == 1 and RUNS["dave"] == 1  # each ran once, neither again


async def test_cancelling_the_callers_turn_cancels_the_sub_agent(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        paused_turn = await parent.send(delegate("erin", 3))
        assert paused_turn.finish_reason == FinishReason.INTERRUPTED
        (child_id,) = await children(client, parent.id)
        cancelled = await parent.cancel(reason="changed my mind", identity="alice")
        assert cancelled.finish_reason == FinishReason.CANCELLED
        desc = await eventually(
            lambda: client.get_workflow_handle(child_id).describe(),
            lambda d: d.status != WorkflowExecutionStatus.RUNNING,
            timeout=20,
        )
        assert desc.status == WorkflowExecutionStatus.CANCELED
        assert RUNS["erin"] == 0
        # The caller lives on.
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, parent.id)


@tool("refund", "Refund a payment.")
async def refund(inp: Payment) -> dict:
    raise ToolError("FAILED_PRECONDITION", "refunds are closed today")


refunds = Agent("refunds", system="You refund.", tools=[refund])
manager = Agent("manager", system="You manage.", tools=[agent_tool(payments), agent_tool(refunds)])
head = Agent("head", system="You lead.", tools=[agent_tool(manager)])


async def test_a_sub_agent_that_fails_fails_the_call_classified_and_the_caller_lives_on(
    client, offline
):
    async with hosted(client, agents=[manager], model=offline) as agents:
        parent = await agents.chat("manager")
        failed = await parent.send(delegate("frank", 4, tool_name="refunds", child="refund"))
        assert failed.finish_reason == FinishReason.FAILED, failed
        assert failed.error is not None and failed.error.kind == "ToolError"
        assert failed.error.status == "FAILED_PRECONDITION"
        assert "refunds are closed today" in failed.error.message
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, parent.id)


async def test_sub_agents_nest_and_a_grandchild_is_answered_through_the_top(client, offline):
    async with hosted(client, agents=[head], model=offline) as agents:
        parent = await agents.chat("head")
        inner = delegate("gina", 6)
        paused_turn = await parent.send(f"call manager {json.dumps({'input': inner})}")
        assert paused_turn.finish_reason == FinishReason.INTERRUPTED, paused_turn
        (child_id,) = await children(client, parent.id)
        (grandchild_id,) = await children(client, child_id)
        (i,) = paused_turn.interrupts
        assert len(i.path) == 3 and i.chat_id == grandchild_id
        # Through the top: passed on twice, checked by the grandchild's rules.
        with pytest.raises(ResumeRejected):
            await parent.resume(answers=[approve(i)], identity="mallory")
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert RUNS["gina"] == 1


def test_the_worker_hosts_sub_agents_and_refuses_two_agents_of_one_name():
    assert [a.name for a in with_sub_agents([supervisor])] == ["supervisor", "payments"]
    other = Agent("payments", system="Another.")
    with pytest.raises(ValueError, match="payments"):
        with_sub_agents([supervisor, other])
    assert MAX_AGENT_DEPTH >= 2


async def test_a_worker_lost_while_the_child_waits_loses_nothing_and_both_histories_replay(
    client, offline
):
    queue = f"test-{uuid.uuid4()}"
    async with hosted(
        client, agents=[supervisor], model=offline, task_queue=queue, max_cached_workflows=0
    ) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("hank", 8))
        (i,) = paused.interrupts
    # That worker is gone; a brand-new one (nothing cached) takes both conversations up.
    async with hosted(
        client, agents=[supervisor], model=offline, task_queue=queue, max_cached_workflows=0
    ) as agents:
        parent = await agents.chat("supervisor", chat_id=parent.id)
        assert [p.ref for p in await parent.pending()] == [i.ref]
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
    assert RUNS["hank"] == 1
    assert i.chat_id is not None
    for chat_id in (parent.id, i.chat_id):
        hist = await client.get_workflow_handle(chat_id).fetch_history()
        result = await replayer().replay_workflow(hist, raise_on_replay_failure=True)
        assert result.replay_failure is None
        await assert_no_workflow_task_failed(client, chat_id)


async def test_a_forged_sub_agent_report_changes_nothing_and_is_recorded(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("ivy", 9))
        (i,) = paused.interrupts
        handle = client.get_workflow_handle(parent.id)
        # Someone with namespace credentials claims a child of another id, and "answers".
        await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": "someone-else"})
        rejected = await eventually(parent.rejections, lambda r: len(r) >= 1, timeout=20)
        assert "no sub-agent" in rejected[-1].reason
        # A report naming the real child is only a hint: what shows is read from the child.
        await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": i.chat_id})
        assert [p.ref for p in await parent.pending()] == [i.ref]
        assert RUNS["ivy"] == 0
        # An answer by signal through the caller, from the wrong person: refused by the child,
        # recorded here.
        await handle.signal(
            "resume",
            {"restart": [approve(i).model_dump(mode="json")], "identity": "mallory"},
        )
        rejected = await eventually(parent.rejections, lambda r: len(r) >= 2, timeout=20)
        assert "refused by sub-agent" in rejected[-1].reason
        assert RUNS["ivy"] == 0
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP
        assert RUNS["ivy"] == 1
    await assert_no_workflow_task_failed(client, parent.id)


async def test_the_agents_page_s_supervisor_runs_offline_as_printed(
    client, tmp_path, monkeypatch, capsys
):
    for key in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(key, raising=False)
    source = block(
        "# supervisor.py: a supervisor agent with a payments sub-agent, on the offline model",
        lang="python",
    )
    module = load(tmp_path, "supervisor_page", source, monkeypatch)
    await module.main(server_address(client))
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "interrupted pay 2 True",
        "refused by the payments agent's approvers",
        "stop True",
    ], out


class Receipt(BaseModel):
    paid: float
    to: str


ledger = Agent(
    "ledger",
    system="You keep the books.",
    tools=[agent_tool(payments, name="pay_for_receipt", output=Receipt)],
)


def _sent_to_caller(model: ScriptedModel, tool_name: str) -> list[dict]:
    """The outputs of ``tool_name`` the caller's model was sent, in order."""
    return [
        r["response"]
        for request in model.requests
        for r in request.function_responses()
        if r.get("name") == tool_name
    ]


async def test_a_sub_agent_with_an_output_model_answers_with_that_object(client, offline):
    async with hosted(client, agents=[ledger], model=offline) as agents:
        parent = await agents.chat("ledger")
        paused = await parent.send(delegate("ursula", 3, tool_name="pay_for_receipt"))
        (i,) = paused.interrupts
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
    assert RUNS["ursula"] == 1
    # The sub-agent was asked for the schema in its first message; the caller's model got the
    # object it answered, checked against the schema.
    asked = [r.user_text() for r in offline.requests if OUTPUT_REQUEST.strip() in r.user_text()]
    schema = json.dumps(Receipt.model_json_schema(), sort_keys=True, separators=(",", ":"))
    assert set(asked) == {'call pay {"to": "ursula", "amount": 3}' + OUTPUT_REQUEST + schema}
    (sent,) = _sent_to_caller(offline, "pay_for_receipt")
    assert sent == {"output": {"paid": 3.0, "to": "ursula"}, "chat_id": i.chat_id}
    await assert_no_workflow_task_failed(client, parent.id)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("I paid olga.", "not valid JSON"),
        ('```json\n{"paid": 1}\n```', "'to' is a required property"),
        ('["paid", 1]', "not a JSON object"),
        ('{"paid": "lots", "to": "olga"}', 'must be of type "number"'),
        ("[" * 5000 + "]" * 5000, "nested"),
        ('{"paid": 1, "to": "\\ud800"}', "Unicode"),
    ],
)
async def test_a_sub_agent_answer_that_does_not_fit_is_the_callers_model_s_to_hear(
    client, answer, why
):
    clerk = Agent(f"clerk-{uuid.uuid4().hex[:6]}", system="You are a clerk.")
    books = Agent(
        f"books-{uuid.uuid4().hex[:6]}",
        system="You keep the books.",
        tools=[agent_tool(clerk, name="clerk", output=Receipt)],
    )

    def script(request):
        if request.system() == "You are a clerk.":
            return text(answer)  # the sub-agent answers in a shape it was not asked for
        return offline_rules(request)

    model = ScriptedModel(script)
    async with hosted(client, agents=[books], model=model) as agents:
        parent = await agents.chat(books.name)
        done = await parent.send(f"call clerk {json.dumps({'input': 'pay olga 1'})}")
        assert done.finish_reason == FinishReason.STOP, done
    (sent,) = _sent_to_caller(model, "clerk")
    assert sent["error"].startswith("the sub-agent's answer does not fit the output schema")
    assert why in sent["error"], sent["error"]
    assert sent["chat_id"].startswith(f"{parent.id}--") and "output" not in sent
    await assert_no_workflow_task_failed(client, parent.id)


async def test_the_callers_audit_trail_reads_only_the_child_chain_it_started(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        first = await parent.send(delegate("vera", 2))
        (i,) = first.interrupts
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        child_id = i.chat_id
        assert child_id is not None
        # The child has closed; someone with namespace credentials starts a conversation of
        # their own under its id, on the same task queue, and answers in it as "alice".
        await client.start_workflow(
            WORKFLOW_TYPE,
            {"agent": "payments", "task": "call pay " + json.dumps({"to": "wendy", "amount": 1})},
            id=child_id,
            task_queue=agents.task_queue,
        )
        squat = await agents.chat("payments", chat_id=child_id)
        (j,) = await paused(squat)
        await squat.resume(answers=[approve(j)], identity="alice")
        report = await agents.audit_report(parent.id)
        # Only the run the caller started counts: the later start is named, its answer is not
        # in the trail (beside the child's record, the caller's own of passing the answer on).
        applied = [r for r in report.records if r.kind not in ("forwarded", "sub_agent")]
        assert [(r.chat_id, r.identity) for r in applied] == [(child_id, "alice")]
        assert applied[0].ref == i.ref
        (left_out,) = report.untrusted
        assert left_out.chat_id == child_id and left_out.claimed == 1
        assert RUNS["vera"] == 1 and RUNS["wendy"] == 1


async def _forwarded(client: Client, chat_id: str) -> int:
    """How many answers ``chat_id``'s history passed on to a sub-agent (activities scheduled)."""
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    return sum(
        1
        for e in hist.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == SUB_AGENT_RESUME_ACTIVITY
    )


async def test_an_answer_the_sub_agent_surely_refuses_costs_the_caller_no_history(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        first = await parent.send(delegate("xena", 2))
        (i,) = first.interrupts
        handle = client.get_workflow_handle(parent.id)
        # Someone the sub-agent's approvers do not name, by update (refused by the validator:
        # no event) and by signal (recorded as a rejection), and an answer naming another tool.
        with pytest.raises(ResumeRejected, match="may not answer 'pay'"):
            await parent.resume(answers=[approve(i)], identity="bob")
        await handle.signal(
            "resume", {"restart": [approve(i).model_dump(mode="json")], "identity": "bob"}
        )
        wrong = approve(i).model_dump(mode="json") | {"name": "refund"}
        await handle.signal("resume", {"restart": [wrong], "identity": "alice"})
        rejected = await eventually(parent.rejections, lambda r: len(r) >= 2, timeout=20)
        assert "may not answer" in rejected[-2].reason
        assert "is an interrupt of 'pay', not 'refund'" in rejected[-1].reason
        assert await _forwarded(client, parent.id) == 0
        assert [p.ref for p in await parent.pending()] == [i.ref]
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert await _forwarded(client, parent.id) == 1
    assert RUNS["xena"] == 1
    await assert_no_workflow_task_failed(client, parent.id)


async def test_a_grant_asked_for_through_the_caller_is_refused_and_the_approval_still_stands(
    client, offline
):
    """A sub-agent's conversation answers one call and closes: a grant made there would let
    nothing through and be out of the caller's sight. Asked for through the caller, it is
    refused, saying so; the approval without it goes through."""
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate("bob", 5))).interrupts
        before = RUNS["bob"]  # the sub-agents' tool counts are shared by this file's tests
        with pytest.raises(ResumeRejected, match="keeps no grant"):
            await parent.resume(answers=[approve(i, remember=GrantScope())], identity="alice")
        assert RUNS["bob"] == before and await parent.grants() == []
        done = await parent.resume(answers=[approve(i)], identity="alice")
    assert done.finish_reason == FinishReason.STOP and RUNS["bob"] == before + 1
    await assert_no_workflow_task_failed(client, parent.id)

"""Agents as tools, attacked: what someone with namespace credentials, or a caller answering
through the parent, can make of a parent and its sub-agents (review of issue 31)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import ActivityFailureError, Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, agent_tool, approve
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Request, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentResumeInput,
)
from temporal_agent_interrupts.workflows.config import (
    MAX_SUB_AGENTS_PER_TURN,
    SUB_AGENT_RESUME_ACTIVITY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.limits import HELD, json_size
from tests.agents import SUB_RUNS as RUNS
from tests.agents import sub_pay, supervisor
from tests.helpers import eventually


def with_ids(request: Request) -> dict[str, Any]:
    """The offline rules, with the call ids a model may give (Gemini may, OpenAI-style models
    do): the parent's call of ``payments`` is ``sup-1``, each child's call of ``pay`` is ``p1``."""
    reply = offline_rules(request)
    for cand in reply.get("candidates", []):
        for part in cand["content"]["parts"]:
            fc = part.get("functionCall")
            if fc is not None and "id" not in fc:
                fc["id"] = {"payments": "sup-1", "pay": "p1"}.get(fc["name"], "x")
    return reply


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel(with_ids)


def delegate(to: str, amount: float) -> str:
    task = f"call pay {json.dumps({'to': to, 'amount': amount})}"
    return f"call payments {json.dumps({'input': task})}"


async def status(client: Client, wid: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(wid).describe()).status


async def test_id_squatting_the_child_id_does_not_fail_the_parent(client, model):
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        # The attacker starts a conversation of their own under the id the parent's call will
        # use (chat--ref; the ref is the model's call id here, and workflow.uuid4 is seeded
        # from the run id otherwise, so it is no secret either).
        squat = f"{parent.id}--sup-1"
        await client.start_workflow(
            WORKFLOW_TYPE,
            # Its task pauses on the payments agent's gate, so it is still running.
            {"agent": "payments", "task": "call pay " + json.dumps({"to": "mallory", "amount": 1})},
            id=squat,
            task_queue=agents.task_queue,
        )
        await eventually(lambda: client.get_workflow_handle(squat).query("pending"), bool)
        try:
            result = await parent.send(delegate("olga", 1))
        except Exception as e:  # noqa: BLE001  # what happened is the finding
            result = e
        # The parent must not adopt the squatter's conversation, and must live on.
        assert await status(client, parent.id) == WorkflowExecutionStatus.RUNNING, result
        assert not isinstance(result, Exception), result
        assert result.finish_reason == FinishReason.FAILED, result
        assert result.error is not None and result.error.status == "ALREADY_EXISTS", result
        assert RUNS["mallory"] == 0 and RUNS["olga"] == 0
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP


async def test_cancelling_the_child_workflow_does_not_cancel_the_parent(client, model):
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("pete", 1))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.chat_id is not None
        # Anyone who may cancel a workflow (an operator in the UI, a script) cancels the child.
        await client.get_workflow_handle(i.chat_id).cancel()
        await eventually(
            lambda: status(client, i.chat_id or ""),
            lambda s: s != WorkflowExecutionStatus.RUNNING,
            timeout=20,
        )
        last = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=20,
        )
        # The call fails classified; the conversation lives on (issue 31: "a child that fails
        # fails the parent's call as a classified tool error and the parent conversation lives
        # on"; docstring of SubAgentCalls.run: "is cancelled on its own ... fails the call").
        assert await status(client, parent.id) == WorkflowExecutionStatus.RUNNING, last
        assert last is not None and last.finish_reason == FinishReason.FAILED, last


async def test_siblings_with_one_inner_ref_are_each_answered_through_the_parent(client, model):
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        text = delegate("quinn", 1) + "\n" + delegate("rita", 2)
        await parent.send(text)
        first, second = await eventually(parent.pending, lambda p: len(p) == 2, timeout=20)
        assert first.ref == second.ref == "p1" and first.path != second.path
        # The approver approves rita's payment, as shown (digest and all). An answer names
        # only a ref, so the parent cannot tell which child it is for: it must refuse, saying
        # so, rather than pass it to whichever child started first (quinn's).
        with pytest.raises(ResumeRejected, match="more than one conversation"):
            await parent.resume(answers=[approve(second)], identity="alice")
        assert RUNS["quinn"] == 0 and RUNS["rita"] == 0
        assert second.chat_id is not None
        child = await agents.chat("payments", chat_id=second.chat_id)
        await child.resume(answers=[approve(second)], identity="alice")
        await eventually(parent.pending, lambda p: len(p) == 1, timeout=20)
        # One left: now unambiguous, through the parent.
        done = await parent.resume(answers=[approve(first)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert RUNS["quinn"] == 1 and RUNS["rita"] == 1


async def test_the_answer_forwarding_activity_standalone_answers_nothing(client, model):
    async with hosted(client, agents=[supervisor], model=model) as agents:
        victim = await agents.chat("payments")
        paused = await victim.send("call pay " + json.dumps({"to": "sam", "amount": 7}))
        (i,) = paused.interrupts
        run_id = (await client.get_workflow_handle(victim.id).describe()).run_id or ""
        body = {"restart": [approve(i).model_dump(mode="json")], "identity": "alice"}
        handle = await client.start_activity(
            SUB_AGENT_RESUME_ACTIVITY,
            SubAgentResumeInput(chat_id=victim.id, run_id=run_id, resume=body),
            id=f"standalone-{uuid.uuid4()}",
            task_queue=agents.task_queue,
            start_to_close_timeout=timedelta(seconds=30),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
        cause = failed.value.cause
        assert isinstance(cause, ApplicationError) and cause.non_retryable
        assert RUNS["sam"] == 0


async def test_cancelling_the_parent_workflow_cancels_it_and_the_child(client, model):
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("tom", 1))
        (i,) = paused.interrupts
        await client.get_workflow_handle(parent.id).cancel()
        for wid in (parent.id, i.chat_id or ""):
            final = await eventually(
                lambda w=wid: status(client, w),
                lambda s: s != WorkflowExecutionStatus.RUNNING,
                timeout=20,
            )
            assert final == WorkflowExecutionStatus.CANCELED, (wid, final)
        assert RUNS["tom"] == 0


chatty = Agent("chatty", system="You talk at length.")
boss = Agent("boss", system="You ask around.", tools=[agent_tool(chatty)])
BIG = 240 * 1024


def big_replies(request: Request) -> dict[str, Any]:
    if "chatty" not in request.tool_names():
        return text("y" * BIG)  # each child's final text: within one model message's budget
    if request.function_responses():
        return text("heard them all")
    return calls(*[("chatty", {"input": f"talk {n}"}) for n in range(5)])


async def test_big_sub_agent_outputs_stay_within_the_turn_budget(client):
    async with hosted(client, agents=[boss], model=ScriptedModel(big_replies)) as agents:
        parent = await agents.chat("boss")
        done = await parent.send("go")
        assert done.finish_reason == FinishReason.STOP, done
        outputs = [
            p.function_response.response
            for m in (await parent.history()).messages
            for p in m.parts
            if p.function_response is not None
        ]
        assert len(outputs) == 5
        assert sum(json_size(o) for o in outputs) <= HELD.turn, [json_size(o) for o in outputs]
        assert any("too large" in str(o.get("error", "")) for o in outputs), [
            json_size(o) for o in outputs
        ]


ISSUER = TokenIssuer("ES256")
tpay = Agent(
    "tpay",
    system="You pay, verified.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
    trust=ISSUER.trust(),
)
tboss = Agent(
    "tboss",
    system="You delegate, verified.",
    tools=[agent_tool(tpay), sub_pay],
    middleware=[ToolApproval(allow=["tpay"], approvers=["cfo@example.com"])],
    trust=ISSUER.trust(),
)


async def test_a_token_passed_through_the_parent_is_spent_there_too(client):
    async with hosted(client, agents=[tboss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("tboss")
        task = "call pay " + json.dumps({"to": "uma", "amount": 1})
        (i,) = (await parent.send(f"call tpay {json.dumps({'input': task})}")).interrupts
        token = ISSUER.mint("cfo@example.com")
        done = await parent.resume(answers=[approve(i)], identity_token=token)
        assert done.finish_reason == FinishReason.STOP and RUNS["uma"] == 1, done
        # The token is in the parent's history (the update, the forwarding activity's input).
        # Someone who reads it there answers the parent's own next gate with it.
        (j,) = (
            await parent.send("call pay " + json.dumps({"to": "victor", "amount": 9}))
        ).interrupts
        with pytest.raises(ResumeRejected):
            await parent.resume(answers=[approve(j)], identity_token=token)
        assert RUNS["victor"] == 0


def many_pauses(request: Request) -> dict[str, Any]:
    """A hostile (or injected) model: 20 sub-agents, each pausing on 128 gated calls of 1 KiB."""
    if request.function_responses():
        return text("done")
    if "payments" in request.tool_names():
        return calls(*[("payments", {"input": f"go {k}"}) for k in range(20)])
    return calls(*[("pay", {"to": "x" * 900 + str(k), "amount": k}) for k in range(128)])


async def test_many_sub_agent_pauses_never_wedge_the_parent(client):
    async with hosted(client, agents=[supervisor], model=ScriptedModel(many_pauses)) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send("go")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        # Shown as one message's calls would be (128 at most); the parent keeps working.
        shown = await eventually(parent.pending, lambda p: len(p) >= 128, timeout=60)
        assert len(shown) == 128
        hist = await client.get_workflow_handle(parent.id).fetch_history()
        failed = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        assert not [
            (
                e.workflow_task_failed_event_attributes.cause,
                e.workflow_task_failed_event_attributes.failure.message,
                e.workflow_task_failed_event_attributes.failure.stack_trace[:2000],
            )
            for e in hist.events
            if e.event_type == failed
        ]
        assert await status(client, parent.id) == WorkflowExecutionStatus.RUNNING


def many_sub_agents(request: Request) -> dict[str, Any]:
    """A hostile (or injected) model: 20 sub-agents in one message; each answers at once."""
    if "payments" not in request.tool_names():
        return text("paid nothing")
    if request.function_responses():
        return text("done")
    return calls(*[("payments", {"input": f"hello {k}"}) for k in range(20)])


async def test_a_turn_starts_at_most_its_limit_of_sub_agents_and_the_model_hears_the_rest(client):
    model = ScriptedModel(many_sub_agents)
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        done = await parent.send("go")
        assert done.finish_reason == FinishReason.STOP, done

        async def listed() -> list[str]:
            query = f'ParentWorkflowId = "{parent.id}"'
            return [w.id async for w in client.list_workflows(query)]

        # (Visibility lags: wait for as many as were allowed, then see that no more were.)
        started = await eventually(listed, lambda ids: len(ids) >= MAX_SUB_AGENTS_PER_TURN)
        responses = [
            r["response"]
            for req in model.requests
            if "payments" in req.tool_names()
            for r in req.function_responses()
        ]
    assert len(responses) == 20
    answered = [r for r in responses if r.get("text") == "paid nothing"]
    refused = [r for r in responses if "error" in r]
    assert len(answered) == MAX_SUB_AGENTS_PER_TURN and len(started) == MAX_SUB_AGENTS_PER_TURN
    assert len(refused) == 20 - MAX_SUB_AGENTS_PER_TURN
    assert all(f"at most {MAX_SUB_AGENTS_PER_TURN} sub-agents" in r["error"] for r in refused)

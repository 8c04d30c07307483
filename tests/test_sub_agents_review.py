"""Agents as tools, reviewed as an attacker (issue 31, second pass): what someone with namespace
credentials can make a caller do through its sub-agent machinery. Payees are named ``rev_...``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, agent_tool, approve
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Request, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows.config import (
    SUB_AGENT_ANSWER_UPDATE_PREFIX as ANSWER,
)
from temporal_agent_interrupts.workflows.config import (
    SUB_AGENT_PENDING_ACTIVITY,
    SUB_AGENT_SIGNAL,
)
from temporal_agent_interrupts.workflows.subagents import structured_output
from tests.agents import SUB_RUNS as RUNS
from tests.agents import sub_pay, supervisor
from tests.helpers import assert_no_workflow_task_failed, eventually

PAUSES = 64


def wide_pause(request: Request) -> dict[str, Any]:
    """The caller delegates once; the sub-agent pauses on 64 gated payments of ~1 KiB each
    (what a legitimate batch of payments to long-named payees looks like)."""
    if request.function_responses():
        return text("done")
    if "payments" in request.tool_names():
        return calls(("payments", {"input": "pay the batch"}))
    return calls(*[("pay", {"to": f"rev_{k}_" + "x" * 900, "amount": k}) for k in range(PAUSES)])


async def _reads(client: Client, chat_id: str) -> tuple[int, int]:
    """How many pending reads of sub-agents the caller has scheduled, and how many of its
    activities have completed."""
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    scheduled = [
        e
        for e in hist.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == SUB_AGENT_PENDING_ACTIVITY
    ]
    done = [
        e
        for e in hist.events
        if e.event_type
        in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        )
    ]
    all_scheduled = [
        e for e in hist.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    return len(scheduled), len(all_scheduled) - len(done)


async def _size(client: Client, chat_id: str) -> int:
    desc = await client.get_workflow_handle(chat_id).describe()
    return desc.raw_description.workflow_execution_info.history_size_bytes


async def test_a_forged_report_costs_the_caller_a_few_bytes_not_the_sub_agents_pending_list(
    client,
):
    """A ``sub_agent`` report is a hint anyone may send; the caller answers each with a read
    of the child's whole pending list, and that read's result is stored in the caller's
    history. Forged reports then grow the caller's history by the child's pending list each
    (here ~80 KiB per 100-byte signal), so the history guard (32 MiB) cancels the caller's turn
    and the sub-agent's, withdrawing every pending approval, after a few hundred signals
    rather than the ~32,000 the security notes state for a flood."""
    model = ScriptedModel(wide_pause)
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send("go")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        shown = await eventually(parent.pending, lambda p: len(p) >= PAUSES, timeout=60)
        child_id = shown[0].chat_id
        assert child_id
        handle = client.get_workflow_handle(parent.id)
        # Quiet: no read in flight.
        reads, _ = await eventually(
            lambda: _reads(client, parent.id), lambda r: r[1] == 0, timeout=30
        )
        before = await _size(client, parent.id)
        forged = 8
        for k in range(forged):
            await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": child_id})
            await eventually(
                lambda: _reads(client, parent.id),
                lambda r, k=k: r[0] >= reads + k + 1 and r[1] == 0,
                timeout=30,
            )
        grown = await _size(client, parent.id) - before
        assert RUNS[f"rev_0_{'x' * 900}"] == 0
    per_signal = grown / forged
    # A signal and the workflow task it costs are a few KiB; the child's list is not.
    assert per_signal < 8 * 1024, (
        f"each forged report grew the caller's history by {per_signal / 1024:.0f} KiB "
        f"(guard at 32 MiB: ~{32 * 1024 * 1024 / per_signal:.0f} signals cancel the turn)"
    )


ISSUER = TokenIssuer("ES256")
rev_tpay = Agent(
    "rev_tpay",
    system="You pay, verified.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
    trust=ISSUER.trust(),
)
rev_tboss = Agent(
    "rev_tboss",
    system="You delegate, verified.",
    tools=[agent_tool(rev_tpay)],
)


async def test_a_token_refused_by_the_sub_agent_through_its_caller_answers_nothing_later(client):
    """An approver's answer through the caller that the sub-agent refuses (here an edit of a
    tool that is not editable; any refusal past the caller's early checks does) leaves the
    approver's token in the caller's history (the update, the forwarding activity's input),
    while the sub-agent's update validator refused it without a trace: the token is spent
    in the caller but not in the sub-agent. Someone who reads the caller's history answers
    the sub-agent with it, as the approver, within the token's life. Answered on the
    sub-agent's own chat, the same refusal would leave no trace at all."""
    async with hosted(client, agents=[rev_tboss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("rev_tboss")
        task = "call pay " + json.dumps({"to": "rev_tok", "amount": 5})
        (i,) = (await parent.send(f"call rev_tpay {json.dumps({'input': task})}")).interrupts
        assert i.chat_id
        token = ISSUER.mint("cfo@example.com")
        edit = {"name": "pay", "ref": i.ref, "input": {"to": "rev_tok", "amount": 6}}
        handle = client.get_workflow_handle(parent.id)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("resume", {"restart": [edit], "identity_token": token})
        # The attacker reads the caller's history, where the token is in clear text.
        hist = await handle.fetch_history()
        assert token.encode() in hist.to_json().encode() or any(
            token.encode() in e.SerializeToString() for e in hist.events
        )
        # ...and answers the sub-agent directly, as the approver.
        child = await agents.chat("rev_tpay", chat_id=i.chat_id)
        with pytest.raises(ResumeRejected):
            await child.resume(answers=[approve(i)], identity_token=token)
        assert RUNS["rev_tok"] == 0


async def test_a_token_signalled_through_the_caller_and_refused_answers_nothing_later(client):
    """The same by signal: an answer with a token that names the wrong tool is one the
    caller could refuse from what the sub-agent shows, but the signal (token included) is in
    the caller's history whatever it does; it goes on to the sub-agent, which spends the
    token as it refuses the answer."""
    async with hosted(client, agents=[rev_tboss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("rev_tboss")
        task = "call pay " + json.dumps({"to": "rev_sig", "amount": 5})
        (i,) = (await parent.send(f"call rev_tpay {json.dumps({'input': task})}")).interrupts
        assert i.chat_id
        token = ISSUER.mint("cfo@example.com")
        wrong = {"name": "not_pay", "ref": i.ref}
        handle = client.get_workflow_handle(parent.id)
        await handle.signal("resume", {"restart": [wrong], "identity_token": token})
        rejected = await eventually(parent.rejections, lambda r: len(r) >= 1, timeout=30)
        assert "refused by sub-agent" in rejected[-1].reason
        child = await agents.chat("rev_tpay", chat_id=i.chat_id)
        with pytest.raises(ResumeRejected):
            await child.resume(answers=[approve(i)], identity_token=token)
        assert RUNS["rev_sig"] == 0
        # The approver answers with a token of their own, and the call runs once.
        done = await child.resume(
            answers=[approve(i)], identity_token=ISSUER.mint("cfo@example.com")
        )
        assert done.finish_reason == FinishReason.STOP, done
        assert RUNS["rev_sig"] == 1
    await assert_no_workflow_task_failed(client, parent.id)
    await assert_no_workflow_task_failed(client, i.chat_id)


def _accepted_ids(hist: Any) -> list[str]:
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for e in hist.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]


async def test_an_update_named_as_a_passed_on_answer_gets_what_a_signal_would(client):
    """Anyone may give an update the id a caller's passed-on answer has: a sub-agent then takes
    it into history before checking it, and refuses it by the same rules, spending its token
    (what a signal gets); a conversation that is nobody's sub-agent checks it as any update,
    and its refusal leaves no trace."""
    async with hosted(client, agents=[rev_tboss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("rev_tboss")
        task = "call pay " + json.dumps({"to": "rev_named", "amount": 5})
        (i,) = (await parent.send(f"call rev_tpay {json.dumps({'input': task})}")).interrupts
        assert i.chat_id
        child = client.get_workflow_handle(i.chat_id)
        answer = [approve(i).model_dump(mode="json")]
        mallory = ISSUER.mint("mallory@example.com")
        with pytest.raises(WorkflowUpdateFailedError):
            await child.execute_update(
                "resume", {"restart": answer, "identity_token": mallory}, id=f"{ANSWER}mallory"
            )
        assert f"{ANSWER}mallory" in _accepted_ids(await child.fetch_history())
        assert RUNS["rev_named"] == 0
        root = client.get_workflow_handle(parent.id)
        forged = [{"name": "pay", "ref": "no-such-ref"}]
        with pytest.raises(WorkflowUpdateFailedError):
            await root.execute_update("resume", {"restart": forged}, id=f"{ANSWER}forged")
        assert f"{ANSWER}forged" not in _accepted_ids(await root.fetch_history())
        # The approver's answer through the caller runs the call once.
        done = await parent.resume(
            answers=[approve(i)], identity_token=ISSUER.mint("cfo@example.com")
        )
        assert done.finish_reason == FinishReason.STOP, done
        assert RUNS["rev_named"] == 1
    for chat_id in (parent.id, i.chat_id):
        await assert_no_workflow_task_failed(client, chat_id)


class RevReceipt(BaseModel):
    paid: float


rev_json = Agent("rev_json", system="You answer in JSON.")
rev_ledger = Agent(
    "rev_ledger",
    system="You delegate.",
    tools=[agent_tool(rev_json, output=RevReceipt)],
)
FENCED = "```" + "\n" * 40_000 + "x"


def fenced_answer(request: Request) -> dict[str, Any]:
    """The caller asks once; the sub-agent's (hostile, or injected) model answers with a fence
    followed by 40,000 newlines and no closing fence: 40 KB, well within a reply's limits."""
    if "rev_json" not in request.tool_names():
        return text(FENCED)
    if request.function_responses():
        return text("done")
    return calls(("rev_json", {"input": "how much did we pay?"}))


async def test_a_sub_agent_answer_with_an_open_fence_never_fails_the_callers_task(client):
    """The fence matcher for ``agent_tool(output=...)`` backtracks quadratically on an opening
    fence followed by many whitespace characters: 40 KB took seconds of the caller's workflow
    task (holding the GIL: every workflow of the worker stalls), past the SDK's 2 s deadlock
    timeout, so the task failed, and failed again on every retry."""
    async with hosted(client, agents=[rev_ledger], model=ScriptedModel(fenced_answer)) as agents:
        parent = await agents.chat("rev_ledger")
        done = await asyncio.wait_for(parent.send("go"), timeout=60)
        assert done.finish_reason == FinishReason.STOP, done
    await assert_no_workflow_task_failed(client, parent.id)


def test_the_fence_is_read_as_before():
    schema = RevReceipt.model_json_schema()
    for text_, out in [
        ('```json\n{"paid": 1}\n```', {"paid": 1}),
        ('```\n\n  {"paid": 2}  \n\n```', {"paid": 2}),
        ('```json  \n{"paid": 3}\n```', {"paid": 3}),
        ('{"paid": 4}', {"paid": 4}),
    ]:
        assert structured_output(text_, schema, chat_id="c") == {"output": out, "chat_id": "c"}
    for bad in ['``` json\n{"paid": 1}\n```', '```\n{"paid": 1}```', "```\n```", FENCED]:
        assert "error" in structured_output(bad, schema, chat_id="c"), bad

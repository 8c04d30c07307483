"""Agents as tools, finished (issue 45): a message that calls several sub-agents reports its
pause once every one of them has paused or ended and no sibling call still runs, with every
child's interrupts; the caller's audit trail holds each answer it passed on, with the
sub-agent's verdict; and an answer a sub-agent applied stays applied at the caller when the
worker passing it on is lost right after.

Real dev server, the offline stand-in's rules (``call TOOL {json}``) on the real Gemini wire;
the lost worker is a real process, SIGKILLed (``tests/sub_agent_worker.py``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from temporal_agent_interrupts import (
    Agent,
    AgentClient,
    FinishReason,
    Interrupt,
    ToolApproval,
    ToolContext,
    agent_tool,
    approve,
    interrupt,
    tool,
)
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.errors import ChatNotFound, ResumeRejected
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import audit
from temporal_agent_interrupts.workflows.limits import RUN, json_size
from temporal_agent_interrupts.workflows.state import ConversationState
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    InterruptRequest,
    TurnResult,
)
from tests.agents import payments
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.sub_agent_worker import ANSWERED, HOLD_ANSWER, Ledger
from tests.test_sub_agents_continue import _no_task_failed_but_racing_signals
from tests.test_sub_agents_kill import replays, workers


class Payment(BaseModel):
    to: str
    amount: float


@tool("pay", "Pay someone.")
async def pay(inp: Payment) -> dict:
    return {"paid": inp.amount, "to": inp.to}


treasury = Agent(
    "treasury",
    system="You make payments two people approve.",
    tools=[pay],
    middleware=[ToolApproval(approvers=["alice", "bob"], quorum=2)],
)
helper = Agent("helper", system="You answer questions.", tools=[])


class Limits(BaseModel):
    account: str


RELEASE = threading.Event()
"""Holds ``checkLimits`` until the test lets it go (bounded)."""


@tool("checkLimits", "Check an account's spending limits.")
async def check_limits(inp: Limits, ctx: ToolContext) -> dict:
    await asyncio.to_thread(RELEASE.wait, 30)
    if not ctx.resumed_metadata.get("tool_approved"):
        raise Interrupt({"reason": f"the limits of {inp.account} need a look"})
    return {"account": inp.account, "ok": True}


SLOW = threading.Event()
"""Holds ``crawl`` (the ``slowpoke`` sub-agent's one tool) until the test lets it go."""


@tool("crawl", "Look an account over, slowly.")
async def crawl(inp: Limits) -> dict:
    await asyncio.to_thread(SLOW.wait, 60)
    return {"account": inp.account, "looked": True}


slowpoke = Agent("slowpoke", system="You look accounts over.", tools=[crawl])


class Lead(BaseModel):
    question: str


class LeadReply(BaseModel):
    answer: str


ask_lead = interrupt("askLead", "Ask the team lead.", input=Lead, output=LeadReply)

desk = Agent(
    "desk",
    system="You delegate and check.",
    tools=[
        agent_tool(payments, description="Make a payment through the payments agent."),
        agent_tool(treasury, description="Make a payment two people approve."),
        agent_tool(helper, description="Ask the helper."),
        agent_tool(slowpoke, description="Have an account looked over."),
        check_limits,
        ask_lead,
    ],
)


@pytest.fixture
def offline() -> ScriptedModel:
    return ScriptedModel(offline_rules)


def call(tool_name: str, args: dict) -> str:
    return f"call {tool_name} {json.dumps(args)}"


def delegate(to: str, amount: float, *, agent: str = "payments") -> str:
    return call(agent, {"input": call("pay", {"to": to, "amount": amount})})


def forwarded(records: list[AnswerRecord]) -> list[tuple]:
    """The caller's own records of answers it passed on: ref, sub-agent, who, how, verdict."""
    return [
        (r.ref, r.chat_id, r.identity, r.via, r.verdict) for r in records if r.kind == "forwarded"
    ]


async def pending_once_started(chat: Chat) -> list[InterruptRequest]:
    """``chat.pending()``, or nothing while the send that starts the chat is on its way."""
    try:
        return await chat.pending()
    except ChatNotFound:
        return []


# ----------------------------------------------------------------------------------------------
# 1. One message, several sub-agents: the pause is reported whole.


async def test_a_message_calling_two_sub_agents_returns_both_childrens_interrupts(client, offline):
    async with hosted(client, agents=[desk], model=offline) as agents:
        parent = await agents.chat("desk")
        paused = await parent.send(delegate("kai", 1, agent="treasury") + "\n" + delegate("lou", 2))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        # Both children's interrupts, in call order, as pending lists them: nothing arrives
        # "about a second later".
        assert len(paused.interrupts) == 2, paused.interrupts
        a, b = paused.interrupts
        assert a.name == b.name == "pay" and a.chat_id != b.chat_id
        assert [p.ref for p in await parent.pending()] == [a.ref, b.ref]
        # An answer to one (its quorum not met yet) leaves the turn paused on both.
        still = await parent.resume(answers=[approve(a)], identity="alice")
        assert still.finish_reason == FinishReason.INTERRUPTED, still
        assert [i.ref for i in still.interrupts] == [a.ref, b.ref]
        # The other settled there: the turn waits on the first alone.
        left = await parent.resume(answers=[approve(b)], identity="alice")
        assert left.finish_reason == FinishReason.INTERRUPTED, left
        assert [i.ref for i in left.interrupts] == [a.ref]
        done = await parent.resume(answers=[approve(a)], identity="bob")
        assert done.finish_reason == FinishReason.STOP, done
        assert "kai" in done.text and "lou" in done.text
    await assert_no_workflow_task_failed(client, parent.id)


async def test_the_pause_waits_for_a_sibling_tool_and_lists_own_and_sub_agent_interrupts(
    client, offline
):
    """A sub-agent pauses while a sibling tool still runs: the turn reports its pause once the
    tool is done (here it pauses too), listing the message's own interrupts and the child's."""
    RELEASE.clear()
    async with hosted(client, agents=[desk], model=offline) as agents:
        parent = await agents.chat("desk")
        text = "\n".join(
            [
                call("askLead", {"question": "which account?"}),
                call("checkLimits", {"account": "ops"}),
                delegate("mia", 3),
            ]
        )
        sending = asyncio.create_task(parent.send(text))
        try:
            # The child's interrupt is shown on the caller while checkLimits is held.
            await eventually(
                lambda: pending_once_started(parent),
                lambda p: any(i.name == "pay" for i in p),
                timeout=30,
            )
        finally:
            RELEASE.set()
        paused = await asyncio.wait_for(sending, 60)
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        assert sorted(i.name for i in paused.interrupts) == ["askLead", "checkLimits", "pay"]
        (child,) = [i for i in paused.interrupts if i.name == "pay"]
        assert child.chat_id is not None and len(child.path) == 2
        assert sorted(p.ref for p in await parent.pending()) == sorted(
            i.ref for i in paused.interrupts
        )
    await assert_no_workflow_task_failed(client, parent.id)


async def test_a_sub_agent_that_ended_leaves_the_pause_to_the_one_that_waits(client, offline):
    async with hosted(client, agents=[desk], model=offline) as agents:
        parent = await agents.chat("desk")
        paused = await parent.send(call("helper", {"input": "hello"}) + "\n" + delegate("ned", 4))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.name == "pay" and i.chat_id is not None
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert "ned" in done.text
    await assert_no_workflow_task_failed(client, parent.id)


async def test_a_caller_continued_as_new_mid_pause_reports_it_partial_and_last_turn_waits(
    client, offline
):
    """The one pause reported before it is whole: the caller continues as new (a flood of
    signals) while one sub-agent waits on a person and the other is still at work. That
    report says ``partial``; ``last_turn()`` returns once the other has ended, whole."""
    SLOW.clear()
    async with hosted(client, agents=[desk], model=offline) as agents:
        parent = await agents.chat("desk")
        assert (await parent.send("hello")).finish_reason == FinishReason.STOP
        handle = client.get_workflow_handle(parent.id)
        first_run = (await handle.describe()).run_id
        slow = call("slowpoke", {"input": call("crawl", {"account": "x"})})
        # By signal: an update waiting on the turn would hold the run from continuing as new.
        await handle.signal("send", {"text": delegate("kira", 9) + "\n" + slow})
        try:
            (i,) = await eventually(parent.pending, lambda p: len(p) == 1, timeout=30)
            for n in range(RUN.can_signals):  # each refused (the turn is paused), each counted
                await handle.signal("send", {"text": f"flood {n}"})
            await eventually(handle.describe, lambda d: d.run_id != first_run, timeout=30)
            partial = await asyncio.wait_for(_turn_end(parent, turn=2), 30)
            assert partial.finish_reason == FinishReason.INTERRUPTED and partial.partial
            assert [x.ref for x in partial.interrupts] == [i.ref]
        finally:
            SLOW.set()
        whole = await parent.last_turn()
        assert whole is not None and whole.finish_reason == FinishReason.INTERRUPTED, whole
        assert not whole.partial and [x.ref for x in whole.interrupts] == [i.ref]
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert "kira" in done.text and "slowpoke" in done.text
    await _no_task_failed_but_racing_signals(client, parent.id)


async def _turn_end(chat: Chat, *, turn: int) -> TurnResult:
    """The first ``turn_end`` of turn ``turn`` on the chat's stream."""
    async for event in chat.events(after=0):
        if event.kind == "turn_end" and event.result is not None and event.result.turn == turn:
            return event.result
    raise AssertionError("the stream ended")


# ----------------------------------------------------------------------------------------------
# 2. The caller's trail holds each answer it passed on, with the sub-agent's verdict.


async def test_the_callers_audit_trail_holds_each_forwarded_answer_with_the_childs_verdict(
    client, offline
):
    async with hosted(client, agents=[desk], model=offline) as agents:
        parent = await agents.chat("desk")
        paused = await parent.send(delegate("oda", 5, agent="treasury") + "\n" + delegate("pia", 6))
        assert paused.finish_reason == FinishReason.INTERRUPTED
        # In call order: the treasury's (two approvers), then the payments agent's.
        a, b = await eventually(parent.pending, lambda p: len(p) == 2, timeout=30)
        assert a.approvers == ["alice", "bob"] and b.approvers == ["alice"]
        await parent.resume(answers=[approve(a)], identity="alice")
        # A second vote by the same account: only the child can tell (its votes), and refuses.
        with pytest.raises(ResumeRejected, match="refused by sub-agent"):
            await parent.resume(answers=[approve(a)], identity="alice")
        # By signal, as a script answers.
        body = {"restart": [approve(b).model_dump(mode="json")], "identity": "alice"}
        await client.get_workflow_handle(parent.id).signal("resume", body)
        await eventually(parent.pending, lambda p: [x.ref for x in p] == [a.ref], timeout=30)
        done = await parent.resume(answers=[approve(a)], identity="bob")
        assert done.finish_reason == FinishReason.STOP, done
        trail = await eventually(
            lambda: agents.audit(parent.id), lambda r: len(forwarded(r)) == 4, timeout=30
        )
        assert forwarded(trail) == [
            (a.ref, a.chat_id, "alice", "update", "applied"),
            (a.ref, a.chat_id, "alice", "update", "refused"),
            (b.ref, b.chat_id, "alice", "signal", "applied"),
            (a.ref, a.chat_id, "bob", "update", "applied"),
        ]
        mine = [r for r in trail if r.kind == "forwarded"]
        assert all(r.name == "pay" for r in mine)
        refused = mine[1]
        assert refused.verdict_reason is not None and "vote" in refused.verdict_reason
        assert all(r.verdict_reason is None for r in (mine[0], mine[2], mine[3]))
        # The children's own records are in the caller's trail too, as before.
        applied = [r for r in trail if r.kind not in ("forwarded", "sub_agent")]
        assert sorted((r.chat_id, r.identity) for r in applied) == sorted(
            [(a.chat_id, "alice"), (a.chat_id, "bob"), (b.chat_id, "alice")]
        )
    await assert_no_workflow_task_failed(client, parent.id)


def test_a_forwarded_record_is_bounded_as_any_audit_record():
    """Whatever the answer carried (it was read leniently: the sub-agent checks it), the
    caller's record of it keeps a few KiB: large values as their digests, text cut."""
    state = ConversationState(agent="desk")
    big = {"blob": "x" * 50_000}
    body = {
        "respond": [{"name": "n" * 5_000, "ref": "r" * 5_000, "output": big}, "not an entry"],
        "identity": "i" * 5_000,
        "metadata": big,
    }
    audit.forwarded(
        state, at=datetime.now(UTC), chat_id="c--r", body=body, via="signal", refused="no " * 5000
    )
    (record,) = state.answers
    assert state.audit_outbox == [record]
    assert (record.kind, record.via, record.verdict) == ("forwarded", "signal", "refused")
    assert record.output != big and record.metadata != big  # their digests
    assert json_size(record.model_dump(mode="json")) < 4 * 1024


# ----------------------------------------------------------------------------------------------
# 3. The worker passing an answer on is lost after the sub-agent applied it.


async def answer_held(parent: Chat, i: InterruptRequest, tmp_path: Path) -> asyncio.Task[Any]:
    """Approve ``i`` on the caller, the forwarding's first attempt held once the sub-agent has
    its outcome (tests/sub_agent_worker.py ``HOLD_ANSWER``); returns the caller's resume."""
    (tmp_path / HOLD_ANSWER).touch()
    answered = asyncio.create_task(parent.resume(answers=[approve(i)], identity="alice"))
    await eventually(lambda: asyncio.sleep(0, (tmp_path / ANSWERED).exists()), bool, timeout=45)
    return answered


async def test_an_answer_the_sub_agent_applied_before_the_worker_was_lost_is_applied(
    client, tmp_path
):
    """The child applies the answer and its turn ends (it closes); the worker that passed the
    answer on dies before reporting it: the retry gets the child's outcome, and the caller's
    result and trail say applied."""
    ledger = Ledger(tmp_path)
    ledger.create()
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    async with workers(client, queue, tmp_path) as start:
        first = await start()
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate("ines", 7))).interrupts
        answered = await answer_held(parent, i, tmp_path)
        await first.kill()  # the child has taken the answer; its outcome never got back
        (tmp_path / HOLD_ANSWER).unlink()
        await start()
        done = await asyncio.wait_for(answered, 90)
        assert done.finish_reason == FinishReason.STOP, done
        assert "paid" in done.text and "ines" in done.text
        assert await parent.rejections() == []  # nothing said the answer went astray
    assert [r.to for r in ledger.runs()] == ["ines"]
    assert forwarded(await agents.audit(parent.id)) == [
        (i.ref, i.chat_id, "alice", "update", "applied")
    ]
    assert i.chat_id is not None
    await replays(client, parent.id, i.chat_id)


async def test_an_answer_applied_before_the_sub_agent_continued_as_new_stays_applied(
    client, tmp_path
):
    """The child applies the answer and pauses again (a quorum of two); it continues as new
    (a flood of signals) before the lost worker's retry asks for the outcome: the new run
    answers it as applied, not as a second vote."""
    ledger = Ledger(tmp_path)
    ledger.create()
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    async with workers(client, queue, tmp_path) as start:
        first = await start()
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate("jo", 8, agent="treasury"))).interrupts
        assert i.chat_id is not None
        answered = await answer_held(parent, i, tmp_path)
        child = client.get_workflow_handle(i.chat_id)
        before = (await child.describe()).run_id
        for n in range(10):  # each refused (it is paused), each counted against its run
            await child.signal("send", {"text": f"flood {n}"})
        await eventually(child.describe, lambda d: d.run_id != before, timeout=45)
        await first.kill()
        (tmp_path / HOLD_ANSWER).unlink()
        await start()
        still = await asyncio.wait_for(answered, 90)
        # Alice's vote counted: the call waits for a second approver.
        assert still.finish_reason == FinishReason.INTERRUPTED, still
        assert [x.ref for x in still.interrupts] == [i.ref]
        done = await parent.resume(answers=[approve(i)], identity="bob")
        assert done.finish_reason == FinishReason.STOP, done
        assert await parent.rejections() == []
    assert [r.to for r in ledger.runs()] == ["jo"]
    assert forwarded(await agents.audit(parent.id)) == [
        (i.ref, i.chat_id, "alice", "update", "applied"),
        (i.ref, i.chat_id, "bob", "update", "applied"),
    ]
    await replays(client, parent.id)

"""Who may answer: approver lists on interrupt-only tools and on the ToolApproval gate.

Identity is what the caller asserts (verified identity is not built yet), so these tests are
about the rule, not about proof: an answer naming anyone else is refused like any bad resume,
by update (nothing applied, nothing in history) and by signal (recorded as a rejection).
"""

from __future__ import annotations

import pytest

from activities import interrupt
from client import FinishReason, ResumeRejected
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from worker.standin import calls, text
from workflows import Agent, ToolApproval

sign_off = interrupt(
    "signOff",
    "Ask the treasurer to sign off.",
    input=t.Ask,
    output=t.Answer,
    approvers=["alice@example.com", "carol@example.com"],
)

governed = Agent(
    "governed",
    model="gemini-test",
    tools=[sign_off, t.lookup, t.approve],
    middleware=[ToolApproval(allow=["approve"], approvers=["ops@example.com"])],
)


async def test_only_a_listed_approver_may_answer_an_interrupt(run_worker, model, client):
    model.reply(calls(("signOff", {"question": "pay?"}, "s1")), text("paid"))
    async with run_worker(agents=[governed]) as agents:
        chat = await agents.chat("governed")
        (ask,) = (await chat.send("pay the invoice")).interrupts
        with pytest.raises(ResumeRejected, match=r"may be answered only by alice@example.com"):
            await chat.resume(answers=[ask.approve()], identity="bob@example.com")
        with pytest.raises(ResumeRejected, match="an answer with no identity may not"):
            await chat.resume(answers=[ask.approve()])
        # By signal, the same refusal is recorded; the interrupt stays pending.
        await client.get_workflow_handle(chat.id).signal(
            "resume",
            {"respond": [ask.approve().model_dump()], "identity": "mallory@example.com"},
        )
        status = await eventually(chat.status, lambda s: s.rejections == 1)
        assert [i.ref for i in status.pending] == ["s1"]
        (rejection,) = await chat.rejections()
        assert rejection.identity == "mallory@example.com"
        assert "may be answered only by" in rejection.reason
        done = await chat.resume(answers=[ask.approve()], identity="carol@example.com")
        hist = await chat.history()
    assert done.finish_reason == FinishReason.STOP
    assert [(a.ref, a.identity, a.decision) for a in hist.answers] == [
        ("s1", "carol@example.com", "approved")
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_the_gate_has_its_own_approvers(run_worker, model):
    model.reply(calls(("lookup", {"key": "k"}, "l1")), text("looked"))
    async with run_worker(agents=[governed]) as agents:
        chat = await agents.chat("governed")
        (gated,) = (await chat.send("look it up")).interrupts
        assert gated.source == "approval"
        with pytest.raises(ResumeRejected, match=r"only by ops@example\.com"):
            await chat.resume(answers=[gated.approve()], identity="alice@example.com")
        done = await chat.resume(answers=[gated.approve()], identity="ops@example.com")
    assert done.text == "looked"


def test_approver_lists_that_no_answer_could_satisfy_are_refused_when_declared():
    grouped = interrupt("x", "x", input=t.Ask, approvers=["group:treasury"])
    with pytest.raises(ValueError, match="only be checked against a verified identity"):
        Agent("a", tools=[grouped])
    with pytest.raises(ValueError, match="only be checked against a verified identity"):
        Agent("a", middleware=[ToolApproval(approvers=["group:ops"])])
    with pytest.raises(ValueError, match="quorum of 3 from 2 approvers can never be met"):
        ToolApproval(approvers=["a@x", "b@x"], quorum=3)
    with pytest.raises(ValueError, match="quorum must be a whole number"):
        interrupt("x", "x", input=t.Ask, quorum=0)
    with pytest.raises(ValueError, match="a list of identities, not one string"):
        ToolApproval(approvers="ops@example.com")
    with pytest.raises(ValueError, match="approver"):
        interrupt("x", "x", input=t.Ask, approvers=["two\nlines"])

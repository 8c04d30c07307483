"""Approval governance against a real dev server: who may answer, proven; quorum; edits.

- Approver lists on interrupt-only tools and on the ToolApproval gate: an answer naming anyone
  else is refused like any bad resume, by update (nothing applied, nothing in history) and by
  signal (recorded as a rejection).
- Verified identity (``Agent(trust=...)``): the identity on record is the token's; forged,
  expired, untrusted and reused tokens are refused; groups come only from a verified token.
- Quorum: distinct approvals are votes until the last; one denial settles; the same identity
  twice is refused; the tool runs once, after the last vote.
- Edits: an editable tool runs with the edited input, ``ctx.original_input`` has the model's,
  the gate decides again; other tools refuse a changed input.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import BaseModel

from temporal_agent_interrupts import Chat, FinishReason, ToolContext, interrupt, tool
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.types import TurnEvent
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually

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


# ----------------------------------------------------------------------------------------------
# Verified identity

ISSUER = TokenIssuer("RS256")
ROGUE = TokenIssuer("RS256", kid=ISSUER.kid)  # the same key id, another key: a forger
STRANGER = TokenIssuer("ES256")  # a key the agent does not trust

treasury_sign_off = interrupt(
    "treasurySignOff",
    "Ask treasury to sign off.",
    input=t.Ask,
    output=t.Answer,
    approvers=["group:treasury", "cfo@example.com"],
)

verified = Agent(
    "verified",
    model="gemini-test",
    tools=[treasury_sign_off, t.approve],
    trust=ISSUER.trust(),
)


async def test_a_verified_token_is_the_identity_on_record_and_nothing_else_answers(
    run_worker, model, client
):
    model.reply(
        calls(("treasurySignOff", {"question": "pay?"}, "v1")),
        calls(("approve", {"question": "and ship?"}, "v2")),
        text("done"),
    )
    async with run_worker(agents=[verified]) as agents:
        chat = await agents.chat("verified")
        (ask,) = (await chat.send("pay")).interrupts
        assert ask.approvers == ["group:treasury", "cfo@example.com"]
        refusals = {
            "send identity_token": dict(identity="alice@example.com"),
            r"expired at": dict(
                identity_token=ISSUER.mint(
                    "alice@example.com", groups=["treasury"], expires_in=-timedelta(minutes=5)
                )
            ),
            "does not verify": dict(
                identity_token=ROGUE.mint("alice@example.com", groups=["treasury"])
            ),
            "does not trust": dict(
                identity_token=STRANGER.mint("alice@example.com", groups=["treasury"])
            ),
            "not from the issuer": dict(
                identity_token=ISSUER.mint(
                    "alice@example.com", groups=["treasury"], issuer="https://evil.test"
                )
            ),
            # A valid token, but its holder is not in the group.
            r"may be answered only by group:treasury": dict(
                identity_token=ISSUER.mint("bob@example.com", groups=["sales"])
            ),
            # Claiming someone else beside one's own token.
            "does not match the identity token": dict(
                identity="cfo@example.com",
                identity_token=ISSUER.mint("bob@example.com", groups=["treasury"]),
            ),
        }
        for reason, kwargs in refusals.items():
            with pytest.raises(ResumeRejected, match=reason):
                await chat.resume(answers=[ask.approve()], **kwargs)
        assert [p.ref for p in await chat.pending()] == ["v1"]

        token = ISSUER.mint("alice@example.com", groups=["treasury"])
        second = await chat.resume(answers=[ask.approve()], identity_token=token)
        (again,) = second.interrupts
        # The token is spent: its copy in history answers nothing more here.
        with pytest.raises(ResumeRejected, match="already used"):
            await chat.resume(answers=[again.approve()], identity_token=token)
        # By signal from the temporal CLI: a forged token is a recorded rejection...
        forged = {
            "respond": [again.approve().model_dump()],
            "identity_token": ROGUE.mint("carol@example.com"),
        }
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(forged))
        assert code == 0, out
        await eventually(chat.status, lambda s: s.rejections == 1)
        (rejection,) = await chat.rejections()
        assert "does not verify" in rejection.reason
        assert forged["identity_token"] not in rejection.reason
        # ...and a good one answers.
        good = {
            "respond": [again.approve().model_dump()],
            "identity_token": ISSUER.mint("carol@example.com"),
        }
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(good))
        assert code == 0, out
        done = await eventually(chat.last_turn, lambda r: r is not None and r.text == "done")
        hist = await chat.history()
    assert done is not None and done.finish_reason == FinishReason.STOP
    assert [(a.ref, a.identity, a.identity_verified, a.via, a.decision) for a in hist.answers] == [
        ("v1", "alice@example.com", True, "update", "approved"),
        ("v2", "carol@example.com", True, "signal", "approved"),
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_group_approver_needs_a_verified_token_not_a_name(run_worker, model):
    """Without a token nothing answers an agent that verifies; a name that looks like the group
    is no member of it."""
    model.reply(calls(("treasurySignOff", {"question": "pay?"}, "g1")), text("paid"))
    async with run_worker(agents=[verified]) as agents:
        chat = await agents.chat("verified")
        (ask,) = (await chat.send("pay")).interrupts
        with pytest.raises(ResumeRejected, match="send identity_token"):
            await chat.resume(answers=[ask.approve()], identity="group:treasury")
        token = ISSUER.mint("group:treasury")  # a holder named like the group, no groups
        with pytest.raises(ResumeRejected, match="may not begin with 'group:'"):
            await chat.resume(answers=[ask.approve()], identity_token=token)
        token = ISSUER.mint("dave@example.com", groups=["treasury"], claim="sub")
        done = await chat.resume(answers=[ask.approve()], identity_token=token)
        hist = await chat.history()
    assert done.text == "paid"
    assert [(a.identity, a.identity_verified) for a in hist.answers] == [("dave@example.com", True)]


# ----------------------------------------------------------------------------------------------
# Quorum

dual_control = interrupt(
    "dualControl",
    "Two of three officers approve a wire.",
    input=t.Ask,
    output=t.Answer,
    approvers=["alice@example.com", "bob@example.com", "carol@example.com"],
    quorum=2,
)

quorate = Agent(
    "quorate",
    model="gemini-test",
    tools=[dual_control, t.lookup],
    middleware=[
        ToolApproval(allow=[], approvers=["alice@example.com", "bob@example.com"], quorum=2)
    ],
)


async def test_a_quorum_of_two_counts_distinct_votes_and_runs_the_tool_once(
    run_worker, model, client
):
    model.reply(calls(("lookup", {"key": "k"}, "q1")), text("looked"))
    async with run_worker(agents=[quorate]) as agents:
        chat = await agents.chat("quorate")
        (gated,) = (await chat.send("look")).interrupts
        assert (gated.source, gated.quorum, gated.votes) == ("approval", 2, [])
        first = await chat.resume(answers=[gated.approve()], identity="alice@example.com")
        # A vote, not a decision: still paused, showing who voted; the tool has not run.
        assert first.finish_reason == FinishReason.INTERRUPTED
        (still,) = first.interrupts
        assert [v.identity for v in still.votes] == ["alice@example.com"]
        assert t.RUNS["lookup"] == 0
        with pytest.raises(ResumeRejected, match=r"'alice@example\.com' has already voted"):
            await chat.resume(answers=[still.approve()], identity="alice@example.com")
        with pytest.raises(ResumeRejected, match="an answer with no identity may not"):
            await chat.resume(answers=[still.approve()])
        (pending,) = await chat.pending()
        assert [v.identity for v in pending.votes] == ["alice@example.com"]
        # The second vote, by a script's temporal CLI signal, settles it.
        body = {"restart": [still.approve().model_dump()], "identity": "bob@example.com"}
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(body))
        assert code == 0, out
        done = await eventually(chat.last_turn, lambda r: r is not None and r.text == "looked")
        hist = await chat.history()
        events = [e async for e in _events_until_end(chat)]
    assert done is not None
    assert t.RUNS["lookup"] == 1
    assert [(a.kind, a.decision, a.identity, a.via) for a in hist.answers] == [
        ("vote", "vote", "alice@example.com", "update"),
        ("restart", "approved", "bob@example.com", "signal"),
    ]
    votes = [e.answer.kind for e in events if e.kind == "answer" and e.answer is not None]
    assert votes == ["vote", "restart"]
    await assert_no_workflow_task_failed(client, chat.id)


async def _events_until_end(chat: Chat) -> AsyncIterator[TurnEvent]:
    async for e in chat.events(after=0):
        yield e
        if e.kind == "turn_end" and e.result and e.result.finish_reason != "interrupted":
            return


async def test_one_denial_settles_a_quorum(run_worker, model):
    model.reply(calls(("dualControl", {"question": "wire 1M?"}, "d1")), text("not sent"))
    async with run_worker(agents=[quorate]) as agents:
        chat = await agents.chat("quorate")
        (ask,) = (await chat.send("wire")).interrupts
        first = await chat.resume(answers=[ask.approve()], identity="carol@example.com")
        (still,) = first.interrupts
        done = await chat.resume(answers=[still.deny("no")], identity="bob@example.com")
        hist = await chat.history()
        sent = [(r["name"], r["response"]) for r in model.requests[-1].function_responses()]
    assert done.finish_reason == FinishReason.STOP
    assert [(a.decision, a.identity) for a in hist.answers] == [
        ("vote", "carol@example.com"),
        ("denied", "bob@example.com"),
    ]
    # What the model was told: the denial, not the vote.
    assert sent == [("dualControl", {"approved": False, "feedback": "no"})]


# ----------------------------------------------------------------------------------------------
# Edits


class Transfer(BaseModel):
    to: str
    amount: float


EDITED: list[tuple[dict[str, object], dict[str, object] | None]] = []


@tool("transfer", "Move money; a human may change the amount.", editable=True)
async def transfer(inp: Transfer, ctx: ToolContext) -> dict[str, object]:
    EDITED.append((inp.model_dump(), ctx.original_input))
    return {"sent": inp.amount, "to": inp.to}


editing = Agent(
    "editing",
    model="gemini-test",
    tools=[transfer, t.lookup],
    middleware=[ToolApproval(allow=[], approvers=["ops@example.com", "eve@example.com"])],
)


async def test_an_edit_runs_the_tool_with_the_edited_input_on_record(run_worker, model, client):
    EDITED.clear()
    model.reply(calls(("transfer", {"to": "acme", "amount": 900}, "e1")), text("sent"))
    async with run_worker(agents=[editing]) as agents:
        chat = await agents.chat("editing")
        (gated,) = (await chat.send("pay acme 900")).interrupts
        assert gated.editable
        with pytest.raises(ResumeRejected, match="does not fit the tool's input schema"):
            await chat.resume(
                answers=[gated.restart({"tool_approved": True}, input={"to": "acme"})],
                identity="ops@example.com",
            )
        edit = gated.restart({"tool_approved": True}, input={"to": "acme", "amount": 500})
        done = await chat.resume(answers=[edit], identity="ops@example.com")
        hist = await chat.history()
        sent = [(r["name"], r["response"]) for r in model.requests[-1].function_responses()]
    assert done.text == "sent"
    assert EDITED == [({"to": "acme", "amount": 500}, {"to": "acme", "amount": 900})]
    assert sent == [("transfer", {"sent": 500.0, "to": "acme"})]
    (record,) = hist.answers
    assert (record.kind, record.decision, record.identity) == ("edit", "edited", "ops@example.com")
    assert record.input == {"to": "acme", "amount": 500}
    assert record.original_input == {"to": "acme", "amount": 900}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_edit_without_approval_goes_back_through_the_gate(run_worker, model):
    """An edit that does not approve pauses again at the gate, showing the edited input; it
    runs once someone approves that."""
    EDITED.clear()
    model.reply(calls(("transfer", {"to": "acme", "amount": 900}, "e2")), text("sent"))
    async with run_worker(agents=[editing]) as agents:
        chat = await agents.chat("editing")
        (gated,) = (await chat.send("pay acme 900")).interrupts
        proposal = gated.restart({}, input={"to": "acme", "amount": 100})
        again = await chat.resume(answers=[proposal], identity="eve@example.com")
        (regated,) = again.interrupts
        assert EDITED == []
        assert (regated.ref, regated.source, regated.input) == (
            "e2",
            "approval",
            {"to": "acme", "amount": 100},
        )
        done = await chat.resume(answers=[regated.approve()], identity="ops@example.com")
    assert done.text == "sent"
    assert EDITED == [({"to": "acme", "amount": 100}, {"to": "acme", "amount": 900})]


async def test_a_tool_not_declared_editable_refuses_a_changed_input(run_worker, model, client):
    model.reply(calls(("lookup", {"key": "k"}, "n1")), text("looked"))
    async with run_worker(agents=[editing]) as agents:
        chat = await agents.chat("editing")
        (gated,) = (await chat.send("look")).interrupts
        assert not gated.editable
        changed = gated.restart({"tool_approved": True}, input={"key": "other"})
        with pytest.raises(ResumeRejected, match="'lookup' is not declared editable"):
            await chat.resume(answers=[changed], identity="ops@example.com")
        # By signal: recorded, and nothing ran.
        body = {"restart": [changed.model_dump()], "identity": "ops@example.com"}
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(body))
        assert code == 0, out
        status = await eventually(chat.status, lambda s: s.rejections == 1)
        assert [p.ref for p in status.pending] == ["n1"]
    assert t.RUNS["lookup"] == 0
    await assert_no_workflow_task_failed(client, chat.id)

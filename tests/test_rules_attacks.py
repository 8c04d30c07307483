"""Attacks on issue 47's rules (grants, policies, requesters, approvals checked again), each
against a real dev server, as someone holding the namespace's credentials or reaching the web
app would try them. Each test asserts what held, or what a fix made hold (NOTES-attack.md, not
in the repository, has every attempt).

- A web login's assertion, copied, asks for no grant the approver did not choose: it binds the
  grant's scope as it binds the call and the input.
- A grant ``until`` with no UTC offset is refused with a reason, by update and by signal, and
  the pause still answers.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import httpx2
import pytest

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, approve
from temporal_agent_interrupts.activities.runtime import _stale_approval
from temporal_agent_interrupts.client.login import Login, jwt_login
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import governance
from temporal_agent_interrupts.workflows.activity_io import ToolInput
from temporal_agent_interrupts.workflows.types import (
    GrantCondition,
    GrantScope,
    answer_digest,
    input_digest,
    remember_digest,
)
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually
from tests.test_grants import CFO, _pay, payer, payments
from tests.test_web_login import IDP, TWO, exchange_for, gated, paused
from tests.web import answer, served

ANN = Login(identity="ann@example.com")


@pytest.fixture(autouse=True)
def _paid() -> None:
    payments.clear()  # test_grants' tools record here; its own fixture clears it only there


ONLY_KEY = GrantScope(match=[GrantCondition(field="key", op="eq", value="k")])


# ----------------------------------------------------------------------------------------------
# Defect: a web login's assertion bound the call and the input, not the grant (remember).


async def test_an_assertion_for_a_plain_approval_grants_nothing_when_copied(
    run_worker, model, client
):
    """An approver behind the web app's login approves one call and remembers nothing. A copy
    of the assertion (read in flight, or from a caller's history on its way to a sub-agent)
    used to make a grant for every call of the tool for as long as the conversation lives,
    in the approver's verified name: it is refused, and the approval as made still applies."""
    exchange = exchange_for(lambda request: None)
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, TWO)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        (g1, _r1) = await chat.pending()
        made = exchange.assertion(ANN, chat_id=chat.id, calls={"g1": digest["g1"]})
        for wider in (GrantScope(), ONLY_KEY):
            with pytest.raises(ResumeRejected, match="remembers nothing") as refused:
                await chat.resume(answers=[approve(g1, remember=wider)], identity_token=made)
            assert refused.value.code == "forbidden"
        assert await chat.grants() == []
        # The answer the approver chose still applies with the same assertion.
        result = await chat.resume(answers=[approve(g1)], identity_token=made)
        assert [i.ref for i in result.interrupts] == ["r1"]
        assert await chat.grants() == []
        await assert_no_workflow_task_failed(client, chat.id)


async def test_an_assertion_for_one_grant_makes_that_grant_and_no_wider_one(
    run_worker, model, client
):
    exchange = exchange_for(lambda request: None)
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, TWO)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        (g1, _r1) = await chat.pending()
        made = exchange.assertion(
            ANN,
            chat_id=chat.id,
            calls={"g1": digest["g1"]},
            remember={"g1": remember_digest(ONLY_KEY)},
        )
        with pytest.raises(ResumeRejected, match="remembers another scope"):
            await chat.resume(answers=[approve(g1, remember=GrantScope())], identity_token=made)
        await chat.resume(answers=[approve(g1, remember=ONLY_KEY)], identity_token=made)
        (grant,) = await chat.grants()
        assert (grant.tool, grant.match, grant.granted_by) == (
            "lookup",
            ONLY_KEY.match,
            [ANN.identity],
        )
        await assert_no_workflow_task_failed(client, chat.id)


async def test_a_copied_approval_assertion_cannot_deny_and_a_denial_s_cannot_approve(
    run_worker, model, client
):
    """An assertion the app makes names the answer the approver gave (its digest): a copy read
    in flight or from history gives that answer or none, never the opposite decision."""
    exchange = exchange_for(lambda request: None)
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, TWO)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        (g1, r1) = await chat.pending()
        approval, denial = approve(g1), g1.deny("no")
        made = exchange.assertion(
            ANN,
            chat_id=chat.id,
            calls={"g1": digest["g1"]},
            answers={"g1": answer_digest(approval)},
        )
        with pytest.raises(ResumeRejected, match="another answer") as refused:
            await chat.resume(answers=[denial], identity_token=made)
        assert refused.value.code == "forbidden"
        await chat.resume(answers=[approval], identity_token=made)
        no = exchange.assertion(
            ANN,
            chat_id=chat.id,
            calls={"r1": digest["r1"]},
            answers={"r1": answer_digest(r1.deny())},
        )
        with pytest.raises(ResumeRejected, match="another answer"):
            await chat.resume(answers=[approve(r1)], identity_token=no)
        hist = await chat.history()
    assert [(a.ref, a.decision) for a in hist.answers] == [("g1", "approved")]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_the_web_app_binds_the_remember_it_was_asked_for(run_worker, model, client):
    """Behind a login, the approvals API's approve with ``remember`` makes that grant: the app's
    assertion names the scope, and the workflow takes it."""
    exchange = exchange_for(
        jwt_login(IDP.private_key.public_key(), algorithms=["RS256"], issuer=IDP.issuer,
                  audience=IDP.audience)
    )  # fmt: skip
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        as_ann = {
            "Authorization": f"Bearer {IDP.mint(ANN.identity, expires_in=timedelta(hours=1))}"
        }
        async with (
            served(agents_app(agents, identity=exchange)) as base,
            httpx2.AsyncClient(timeout=60) as http,
        ):
            body = {
                "action": "approve",
                "input_digest": digest["g1"],
                "remember": ONLY_KEY.model_dump(mode="json"),
            }
            r = await answer(http, base, chat.id, "g1", body, headers=as_ann)
            assert r.status_code == 200, r.text
        (grant,) = await chat.grants()
        assert (grant.match, grant.granted_by, grant.verified) == (
            ONLY_KEY.match,
            [ANN.identity],
            True,
        )
        await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Defect: an ``until`` with no UTC offset raised a TypeError in the workflow (an internal error).


async def test_an_until_without_an_offset_is_refused_with_a_reason(run_worker, model, client):
    model.reply(calls(_pay(80, "p1")), text("paid 80"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        naive = GrantScope(until=datetime(2030, 1, 1))
        with pytest.raises(ResumeRejected, match="no UTC offset"):
            await chat.resume(answers=[approve(first, remember=naive)], identity=CFO)
        entry = {
            "name": "pay",
            "ref": "p1",
            "resumed_metadata": {"tool_approved": True},
            "input_digest": first.input_digest,
            "remember": {"match": [], "until": "2030-01-01T00:00:00"},
        }
        rc, out = await cli_signal(
            client, chat.id, "resume", json.dumps({"restart": [entry], "identity": CFO})
        )
        assert rc == 0, out

        seen = await eventually(
            chat.rejections, lambda rs: any("no UTC offset" in r.reason for r in rs)
        )
        assert any("no UTC offset" in r.reason for r in seen), [r.reason for r in seen]
        assert await chat.grants() == [] and payments == []
        done = await chat.resume(answers=[approve(first)], identity=CFO)
        assert done.finish_reason == FinishReason.STOP and payments == [(80, None)]
        await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Defect: an approver admitted by a group the cut of their entries dropped was voided forever.


def test_an_approver_s_entries_keep_one_for_every_list_that_admits_them():
    """A verified approver in many groups, where a policy's ask names four of them and the
    gate names a fifth (sorting after them): the entries kept with the approval (five at most)
    used to hold the ask's four and drop the gate's, so the tool activity, which checks the
    worker's gate, found no approver it admits and voided the approval (``stale``) at every
    run, however often it was given again; a grant made by them let nothing through."""
    who = governance.Who(
        identity="ann@example.com", verified=True, groups=("a", "b", "c", "d", "z")
    )
    ask = ["group:a", "group:b", "group:c", "group:d"]
    gate = ["group:z"]
    entries = governance.entries_of(who, [ask, gate])
    assert len(entries) <= governance.MAX_ENTRIES
    assert governance.entries_admit(entries, [ask, gate])
    agent = Agent("ent", model="gemini-test", tools=[t.lookup],
                  middleware=[ToolApproval(approvers=gate)],
                  trust=exchange_for(lambda request: None).trusted_issuer())  # fmt: skip
    args = {"key": "k"}
    run = ToolInput(agent="ent", chat_id="c", tool="lookup", ref="g1", args=args,
                    resumed=True, resumed_metadata={"tool_approved": True},
                    approved_by=[entries], approved_digest=input_digest(args))  # fmt: skip
    assert _stale_approval(agent, run) is None


# ----------------------------------------------------------------------------------------------
# Held: a grant lets through only the tool, and the typed input, it names; a revoke is bounded.


async def test_a_grant_lets_through_only_its_tool_and_typed_inputs_and_a_revoke_is_bounded(
    run_worker, model, client
):
    model.reply(calls(_pay(80, "p1")), text("paid"))
    wire = ("wire", {"amount": 50, "payee": "NL91ABNA0417164300"}, "w1")
    model.reply(calls(wire), text("asked"))
    model.reply(calls(("pay", {"amount": True, "payee": "x"}, "p2")), text("asked"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        # Type confusion in the scope itself: a bound that is a boolean is refused.
        for bad in ({"field": "amount", "op": "le", "value": True}, {"field": "nope"}):
            scope = GrantScope.model_validate({"match": [bad]})
            with pytest.raises(ResumeRejected):
                await chat.resume(answers=[approve(first, remember=scope)], identity=CFO)
        await chat.resume(
            answers=[approve(first, remember=GrantScope.model_validate(
                {"match": [{"field": "amount", "op": "le", "value": 100}]}))],
            identity=CFO,
        )  # fmt: skip
        (grant,) = await chat.grants()
        # Another tool, and an input the schema refuses (true is no amount), still pause.
        (w1,) = (await chat.send("wire 50")).interrupts
        assert w1.ref == "w1"
        await chat.resume(answers=[w1.deny("no")], identity=CFO)
        assert [i.ref for i in (await chat.send("pay true")).interrupts] == ["p2"]
        assert payments == [(80, None)]
        with pytest.raises(Exception, match="reason"):
            await chat.revoke_grant(grant.id, reason="x" * 100_000)
        assert [g.id for g in await chat.grants()] == [grant.id]
        await assert_no_workflow_task_failed(client, chat.id)

"""Remembered decisions (grants) against a real dev server, and the time-skipping server for
expiry.

- An approval with ``remember`` makes a grant: later matching calls of the tool run unasked,
  each with its own audit record naming the grant and who gave it; non-matching calls pause.
- A grant applies at once to matching pending calls; one revoked before such a call ran voids
  its approval (``stale``): it pauses again and the tool does not run.
- Revoked or expired (in skipped time) grants let nothing through, across continue-as-new.
- A quorum tool's grant needs every approval to ask for the same scope.
- Refusals: a grant from someone not an approver, from no one, on an interrupt's answer, on a
  field the tool lacks, ending in the past; a revoke of a grant not in force.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from temporal_agent_interrupts import AgentClient, FinishReason, ToolContext, approve, tool
from temporal_agent_interrupts.errors import GrantRejected, ResumeRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.types import GrantCondition, GrantScope
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually
from tests.test_operator import agentctl

payments: list[tuple[float, object]] = []


class Payment(BaseModel):
    amount: float
    payee: str


@tool("pay", "Pay someone.")
async def pay(inp: Payment, ctx: ToolContext) -> dict[str, object]:
    payments.append((inp.amount, ctx.resumed_metadata.get("grant")))
    return {"paid": inp.amount}


@tool("wire", "Wire money abroad.")
async def wire(inp: Payment) -> dict[str, object]:
    payments.append((-inp.amount, None))
    return {"wired": inp.amount}


CFO = "cfo@example.com"
payer = Agent(
    "payer",
    model="gemini-test",
    tools=[pay, wire, t.lookup, t.approve],
    middleware=[ToolApproval(allow=["lookup"], approvers=[CFO, "ops@example.com"])],
)
two_keys = Agent(
    "twoKeys",
    model="gemini-test",
    tools=[pay],
    middleware=[ToolApproval(approvers=["alice@example.com", "bob@example.com"], quorum=2)],
)
UNDER_100 = GrantScope(match=[GrantCondition(field="amount", op="le", value=100)])


@pytest.fixture(autouse=True)
def _paid() -> None:
    payments.clear()


def _pay(amount: float, ref: str) -> tuple[str, dict[str, object], str]:
    return ("pay", {"amount": amount, "payee": "NL91ABNA0417164300"}, ref)


async def test_a_matching_call_runs_unasked_and_a_revoke_ends_the_grant(run_worker, model, client):
    model.reply(calls(_pay(80, "p1")), text("paid 80"))
    model.reply(calls(_pay(50, "p2")), text("paid 50"))
    model.reply(calls(_pay(500, "p3")), text("not paid"))
    model.reply(calls(_pay(20, "p4")), text("asked"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        with pytest.raises(ResumeRejected, match="may be answered only by"):
            await chat.resume(
                answers=[approve(first, remember=UNDER_100)], identity="bob@example.com"
            )
        assert await chat.grants() == []
        done = await chat.resume(answers=[approve(first, remember=UNDER_100)], identity=CFO)
        assert done.finish_reason == FinishReason.STOP
        (grant,) = await chat.grants()
        assert (grant.tool, grant.granted_by, grant.ref, grant.uses) == ("pay", [CFO], "p1", 0)
        # Matching: it runs with no pause, the tool told which grant approved it.
        second = await chat.send("pay 50")
        assert second.finish_reason == FinishReason.STOP and second.interrupts == []
        assert payments == [(80, None), (50, grant.id)]
        (used,) = await chat.grants()
        assert used.uses == 1
        # Not matching: it pauses as before.
        (big,) = (await chat.send("pay 500")).interrupts
        assert big.ref == "p3"
        await chat.resume(answers=[big.deny("too much")], identity=CFO)
        assert await chat.revoke_grant(grant.id, reason="done for today", identity=CFO) == []
        with pytest.raises(GrantRejected, match="no grant") as refused:
            await chat.revoke_grant(grant.id)
        assert refused.value.code == "not_found"
        (again,) = (await chat.send("pay 20")).interrupts
        assert again.ref == "p4"
        hist = await chat.history()
    assert payments == [(80, None), (50, grant.id)]
    records = [(a.ref, a.kind, a.decision, a.identity, a.grant) for a in hist.answers]
    assert records == [
        ("p1", "restart", "approved", CFO, grant.id),
        ("p2", "granted", "approved", CFO, grant.id),
        ("p3", "respond", "denied", CFO, None),
        ("p1", "revoked", "revoked", CFO, grant.id),
    ]
    assert hist.answers[1].granted_by == [CFO] and hist.answers[1].via == "grant"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_grant_answers_pending_calls_and_a_revoke_voids_one_not_yet_run(
    run_worker, model, client
):
    model.reply(
        calls(_pay(10, "a1"), _pay(20, "a2"), ("wire", {"amount": 5, "payee": "x"}, "w1")),
        text("done"),
    )
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        a1, _, w1 = (await chat.send("pay both, wire one")).interrupts
        partial = await chat.resume(answers=[approve(a1, remember=GrantScope())], identity=CFO)
        # The second payment was answered by the grant at once; the wire still waits.
        assert [i.ref for i in partial.interrupts] == ["w1"]
        (grant,) = await chat.grants()
        assert grant.uses == 1
        await chat.revoke_grant(grant.id)
        stale = await chat.resume(answers=[approve(w1)], identity=CFO)
        # a2 was let through by a grant that has ended: it asks again, nothing ran for it.
        (again,) = stale.interrupts
        assert again.ref == "a2" and again.metadata["reason"] == "stale"
        assert "revoked" in again.metadata["stale"]
        assert sorted(payments) == [(-5, None), (10, None)]
        done = await chat.resume(answers=[approve(again)], identity="ops@example.com")
        hist = await chat.history()
    assert done.finish_reason == FinishReason.STOP
    assert sorted(payments) == [(-5, None), (10, None), (20, None)]
    kinds = [(a.ref, a.kind, a.decision) for a in hist.answers]
    assert ("a2", "granted", "approved") in kinds
    assert ("a2", "voided", "stale") in kinds
    assert kinds[-1] == ("a2", "restart", "approved")
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_quorum_grant_needs_every_approval_to_ask_for_it(run_worker, model):
    model.reply(calls(_pay(10, "q1")), text("paid"))
    model.reply(calls(_pay(11, "q2")), text("paid"))
    model.reply(calls(_pay(12, "q3")), text("paid"))
    async with run_worker(agents=[two_keys]) as agents:
        chat = await agents.chat("twoKeys")
        (q1,) = (await chat.send("pay")).interrupts
        await chat.resume(
            answers=[approve(q1, remember=GrantScope())], identity="alice@example.com"
        )
        await chat.resume(answers=[approve(q1)], identity="bob@example.com")
        assert await chat.grants() == []  # bob did not ask for it: approved, not remembered
        (q2,) = (await chat.send("pay")).interrupts
        for who in ("alice@example.com", "bob@example.com"):
            await chat.resume(answers=[approve(q2, remember=GrantScope())], identity=who)
        (grant,) = await chat.grants()
        assert grant.granted_by == ["alice@example.com", "bob@example.com"]
        third = await chat.send("pay")
    assert third.interrupts == [] and payments[-1] == (12, grant.id)


async def test_grants_are_refused_where_they_cannot_apply(run_worker, model, client):
    model.reply(calls(_pay(10, "r1"), ("approve", {"question": "ok?"}, "i1")), text("ok"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        r1, i1 = (await chat.send("pay")).interrupts
        with pytest.raises(ValueError, match="an interrupt, whose answer is for that call"):
            approve(i1, remember=GrantScope())
        bad_field = GrantScope(match=[GrantCondition(field="amout", op="le", value=1)])
        with pytest.raises(ResumeRejected, match="its input has no field 'amout'"):
            await chat.resume(answers=[approve(r1, remember=bad_field)], identity=CFO)
        past = GrantScope(until=r1.since)
        with pytest.raises(ResumeRejected, match="has passed"):
            await chat.resume(answers=[approve(r1, remember=past)], identity=CFO)
        not_a_number = GrantScope(match=[GrantCondition(field="amount", op="le", value="9")])
        with pytest.raises(ResumeRejected, match="needs a number"):
            await chat.resume(answers=[approve(r1, remember=not_a_number)], identity=CFO)
        # A script's signal asking for a grant on the interrupt's answer, beside an approval
        # that may grant: recorded, refused whole.
        raw = approve(r1, remember=GrantScope()).model_dump(mode="json")
        forged = {"name": "approve", "ref": "i1", "resumed_metadata": {"tool_approved": True}}
        await cli_signal(
            client,
            chat.id,
            "resume",
            json.dumps({"restart": [raw, {**forged, "remember": {}}], "identity": CFO}),
        )
        status = await eventually(chat.status, lambda s: s.rejections == 1)
        (rejection,) = await chat.rejections()
        assert "only the approval of a call a gate paused" in rejection.reason
        assert sorted(i.ref for i in status.pending) == ["i1", "r1"]
        assert await chat.grants() == []
    assert payments == []
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_grant_survives_continue_as_new_and_its_revoke_and_expiry_too(
    small_histories, model
):
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(calls(_pay(1, "c1")), text("paid"))
    model.reply(calls(("wire", {"amount": 5, "payee": "x"}, "w0")), text("wired"))
    for n in range(8):
        model.reply(calls(("lookup", {"key": f"k{n}"}, f"l{n}")), text(f"looked {n}"))
    model.reply(calls(_pay(2, "c2")), text("paid"))
    model.reply(calls(_pay(3, "c3")), text("asked"))
    model.reply(calls(("wire", {"amount": 6, "payee": "x"}, "w9")), text("asked"))
    async with build_worker(client, agents=[payer], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("payer")
        (c1,) = (await chat.send("pay")).interrupts
        first_run = (await client.get_workflow_handle(chat.id).describe()).run_id
        await chat.resume(answers=[approve(c1, remember=GrantScope())], identity=CFO)
        # A second grant, on the wire, that ends a few seconds from now: its timer is set in
        # this run and must fire in the next.
        (w0,) = (await chat.send("wire")).interrupts
        assert w0.since is not None
        soon = GrantScope(until=w0.since + timedelta(seconds=12))
        await chat.resume(answers=[approve(w0, remember=soon)], identity=CFO)
        for n in range(8):
            await chat.send(f"look {n}")
        later = await client.get_workflow_handle(chat.id).describe()
        assert later.run_id != first_run
        assert (await chat.send("pay again")).interrupts == []
        held = await chat.grants()
        assert sorted(g.tool for g in held) == ["pay", "wire"]
        (grant,) = [g for g in held if g.tool == "pay"]
        await chat.revoke_grant(grant.id)
        (c3,) = (await chat.send("pay once more")).interrupts
        await chat.resume(answers=[c3.deny("not now")], identity=CFO)
        await eventually(chat.grants, lambda g: g == [], timeout=30)
        (w9,) = (await chat.send("wire again")).interrupts
        hist = await chat.history()
    assert c3.ref == "c3" and w9.ref == "w9" and [p for p, _ in payments] == [1, -5, 2]
    ended = [(a.decision, a.ref) for a in hist.answers if a.kind == "revoked"]
    assert sorted(ended) == [("expired", "w0"), ("revoked", "c1")]


async def test_a_grant_expires_on_its_timer_in_skipped_time(skipping, model):
    model.reply(calls(_pay(1, "e1")), text("paid"))
    model.reply(calls(_pay(2, "e2")), text("paid"))
    model.reply(calls(_pay(3, "e3")), text("asked"))
    queue = f"tq-{uuid.uuid4()}"
    env: WorkflowEnvironment = skipping
    async with build_worker(env.client, agents=[payer], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(env.client, task_queue=queue).chat("payer")
        (e1,) = (await chat.send("pay")).interrupts
        assert e1.since is not None
        hour = GrantScope(until=e1.since + timedelta(hours=1))
        await chat.resume(answers=[approve(e1, remember=hour)], identity=CFO)
        assert (await chat.send("pay")).interrupts == []
        await env.sleep(timedelta(hours=2))
        grants = await eventually(chat.grants, lambda g: g == [])
        (e3,) = (await chat.send("pay")).interrupts
        hist = await chat.history()
    assert grants == [] and e3.ref == "e3"
    assert [p for p, _ in payments] == [1, 2]
    ended = hist.answers[-1]
    assert (ended.kind, ended.decision, ended.ref) == ("revoked", "expired", "e1")


PAYMENTS_POLICY = """
@id("small")
permit (principal, action == Action::"call", resource == Tool::"pay")
when { context.input.amount <= 100 };

@id("medium")
@effect("ask")
@approvers("controller@example.com")
@deadline("3600")
@reason("payments over 100 need the controller")
permit (principal, action == Action::"call", resource == Tool::"pay")
when { context.input.amount > 100 && context.input.amount <= 10000 };

@id("limit")
@reason("payments over 10,000 are made by treasury")
forbid (principal, action, resource == Tool::"pay")
when { context.input.amount > 10000 };
"""


def _governed(policy_text: str) -> Agent:
    from temporal_agent_interrupts.policies import Policy

    return Agent(
        "ruled",
        model="gemini-test",
        tools=[pay],
        policy=Policy.from_text(policy_text, name="payments.cedar"),
    )


async def test_a_cedar_policy_gives_three_calls_three_outcomes(run_worker, model, client):
    model.reply(calls(_pay(50, "s1"), _pay(500, "m1"), _pay(50000, "l1")), text("done"))
    agent = _governed(PAYMENTS_POLICY)
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat("ruled")
        paused = await chat.send("pay three")
        (medium,) = paused.interrupts
        assert medium.ref == "m1" and medium.approvers == ["controller@example.com"]
        assert medium.metadata["reason"] == "policy"
        assert medium.metadata["message"] == "payments over 100 need the controller"
        assert medium.deadline is not None and medium.since is not None
        assert medium.deadline - medium.since == timedelta(hours=1)
        # The small payment ran at once, the huge one never will.
        assert payments == [(50, None)]
        with pytest.raises(ResumeRejected, match=r"only by controller@example\.com"):
            await chat.resume(answers=[approve(medium)], identity=CFO)
        done = await chat.resume(answers=[approve(medium)], identity="controller@example.com")
        hist = await chat.history()
    assert done.finish_reason == FinishReason.STOP
    assert sorted(payments) == [(50, None), (500, None)]
    refused = next(
        p
        for m in hist.messages
        for p in m.parts
        if p.function_response and p.function_response.id == "l1"
    )
    assert refused.function_response is not None
    assert refused.function_response.response == {
        "error": "denied by policy",
        "reason": "payments over 10,000 are made by treasury",
    }
    records = {(a.ref, a.kind, a.decision, a.identity) for a in hist.answers}
    assert records == {
        ("s1", "policy", "approved", "system:policy"),
        ("l1", "policy", "denied", "system:policy"),
        ("m1", "restart", "approved", "controller@example.com"),
    }
    denied = next(a for a in hist.answers if a.ref == "l1")
    assert denied.metadata is not None and denied.metadata["policy_ids"] == ["limit"]
    assert denied.metadata["policy_hash"] == agent.spec().policy_hash
    await assert_no_workflow_task_failed(client, chat.id)


NEW_POLICY = """
@id("up-to-1000")
permit (principal, action == Action::"call", resource == Tool::"pay")
when { context.input.amount <= 1000 };

@id("over-1000")
@reason("payments over 1,000 are no longer made by this agent")
forbid (principal, action, resource == Tool::"pay")
when { context.input.amount > 1000 };
"""


async def test_a_new_policy_set_releases_one_pending_call_and_denies_another(client, model):
    model.reply(calls(_pay(500, "m1"), _pay(5000, "m2")), text("done"))
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    old, new = _governed(PAYMENTS_POLICY), _governed(NEW_POLICY)
    async with build_worker(client, agents=[old], task_queue=queue, gemini=model.client()):
        chat = await agents.chat("ruled")
        paused = await chat.send("pay two")
        assert [i.ref for i in paused.interrupts] == ["m1", "m2"]
        unchanged = await chat.review_policy()
        assert unchanged.changed == {} and unchanged.policy_hash == old.spec().policy_hash
    async with build_worker(client, agents=[new], task_queue=queue, gemini=model.client()):
        # As an operator runs it after the deploy.
        review = await agentctl(client, "review-policy", chat.id, "--json", task_queue=queue)
        assert review.code == 0, review
        assert review.json()["changed"] == {"m1": "allow", "m2": "deny"}
        assert review.json()["policy_hash"] == new.spec().policy_hash
        done = await eventually(chat.last_turn, lambda t: t is not None and t.text == "done")
        hist = await chat.history()
    assert done is not None and done.finish_reason == FinishReason.STOP
    assert payments == [(500, None)]
    records = {a.ref: a for a in hist.answers}
    assert (records["m1"].kind, records["m1"].decision) == ("policy", "approved")
    assert (records["m2"].kind, records["m2"].decision) == ("policy", "denied")
    for ref in ("m1", "m2"):
        metadata = records[ref].metadata or {}
        assert metadata["policy_hash"] == new.spec().policy_hash
        assert metadata["previous_policy_hash"] == old.spec().policy_hash
    await assert_no_workflow_task_failed(client, chat.id)


four_eyes = Agent(
    "fourEyes",
    model="gemini-test",
    tools=[pay],
    middleware=[
        ToolApproval(approvers=["alice@example.com", "bob@example.com"], separate_duties=True)
    ],
)


async def test_a_grant_never_lets_through_a_call_its_grantor_requested(run_worker, model):
    model.reply(calls(_pay(10, "f1")), text("paid"))
    model.reply(calls(_pay(11, "f2")), text("paid"))
    model.reply(calls(_pay(12, "f3")), text("asked"))
    async with run_worker(agents=[four_eyes]) as agents:
        chat = await agents.chat("fourEyes")
        (f1,) = (await chat.send("pay", identity="alice@example.com")).interrupts
        await chat.resume(answers=[approve(f1, remember=GrantScope())], identity="bob@example.com")
        # Alice's next request runs on Bob's grant; Bob's own does not: it waits for Alice.
        assert (await chat.send("pay", identity="alice@example.com")).interrupts == []
        (f3,) = (await chat.send("pay", identity="bob@example.com")).interrupts
    assert f3.ref == "f3" and f3.requester is not None
    assert f3.requester.identity == "bob@example.com"
    assert [p for p, _ in payments] == [10, 11]


async def test_an_approval_whose_approver_left_the_list_before_the_run_is_stale(client, model):
    model.reply(calls(_pay(10, "x1"), ("wire", {"amount": 7, "payee": "y"}, "x2")), text("done"))
    model.reply(text("paid after all"))
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    narrowed = Agent(
        "payer",
        model="gemini-test",
        tools=[pay, wire, t.lookup, t.approve],
        middleware=[ToolApproval(allow=["lookup"], approvers=[CFO])],
    )
    async with build_worker(client, agents=[payer], task_queue=queue, gemini=model.client()):
        chat = await agents.chat("payer")
        x1, x2 = (await chat.send("pay and wire")).interrupts
        # ops approves the payment; it waits for the wire's answer before it runs.
        waiting = await chat.resume(answers=[approve(x1)], identity="ops@example.com")
        assert [i.ref for i in waiting.interrupts] == ["x2"]
    # A deploy takes ops off the gate's list before the payment has run.
    async with build_worker(client, agents=[narrowed], task_queue=queue, gemini=model.client()):
        stale = await chat.resume(answers=[approve(x2)], identity=CFO)
        (again,) = stale.interrupts
        assert again.ref == "x1" and again.metadata["reason"] == "stale"
        assert "ops@example.com" in again.metadata["stale"]
        assert payments == [(-7, None)]  # the wire ran; the payment did not
        done = await chat.resume(answers=[approve(again)], identity=CFO)
        hist = await chat.history()
    assert done.finish_reason == FinishReason.STOP
    assert payments == [(-7, None), (10, None)]
    voided = [a for a in hist.answers if a.kind == "voided"]
    assert [(a.ref, a.decision, a.via) for a in voided] == [("x1", "stale", "recheck")]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_approval_a_replaced_policy_asked_for_is_decided_again_before_it_runs(
    client, model
):
    model.reply(calls(_pay(500, "n1"), _pay(600, "n2")), text("both paid"))
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    old, new = _governed(PAYMENTS_POLICY), _governed(NEW_POLICY)
    controller = "controller@example.com"
    async with build_worker(client, agents=[old], task_queue=queue, gemini=model.client()):
        chat = await agents.chat("ruled")
        n1, _ = (await chat.send("pay two")).interrupts
        await chat.resume(answers=[approve(n1)], identity=controller)
    async with build_worker(client, agents=[new], task_queue=queue, gemini=model.client()):
        (n2,) = await chat.pending()
        stale = await chat.resume(answers=[approve(n2)], identity=controller)
        # Approved under the old set, run under the new one: neither runs until it is decided
        # again; the review then releases both (the new set allows them).
        assert sorted(i.ref for i in stale.interrupts) == ["n1", "n2"]
        assert all(i.metadata["reason"] == "stale" for i in stale.interrupts)
        assert payments == []

        # As an operator runs it after the deploy, for every paused chat of the agent (found in
        # visibility, which may lag a moment behind the pause).
        async def review_all() -> dict[str, object]:
            ran = await agentctl(
                client, "review-policies", "--agent", "ruled", "--json", task_queue=queue
            )
            assert ran.code == 0, ran
            return ran.json()

        review = await eventually(review_all, lambda r: bool(r["reviewed"]), timeout=20)
        assert review["reviewed"] == [
            {
                "chat_id": chat.id,
                "policy_hash": new.spec().policy_hash,
                "changed": {"n1": "allow", "n2": "allow"},
            }
        ]
        done = await eventually(chat.last_turn, lambda t: t is not None and t.text == "both paid")
    assert done is not None and sorted(p for p, _ in payments) == [500, 600]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_policy_is_asked_only_about_an_input_the_tool_would_take(run_worker, model):
    model.reply(calls(("pay", {"amount": "lots", "payee": "x"}, "b1"), _pay(5, "b2")), text("ok"))
    async with run_worker(agents=[_governed(PAYMENTS_POLICY)]) as agents:
        chat = await agents.chat("ruled")
        done = await chat.send("pay")
        hist = await chat.history()
    assert done.interrupts == [] and payments == [(5, None)]
    responses = {
        p.function_response.id: p.function_response.response
        for m in hist.messages
        for p in m.parts
        if p.function_response is not None
    }
    assert str(responses["b1"]["error"]).startswith("invalid arguments")
    # Only the valid call was decided (and allowed) by the policy; b1 has no policy record.
    assert [(a.ref, a.kind, a.decision) for a in hist.answers] == [("b2", "policy", "approved")]

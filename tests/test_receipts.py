"""Decision receipts checked with no server (issue 50, its first part): the canonical form,
the chain, Ed25519 signatures under rotating keys, and the first broken link named."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import httpx2
import pytest

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.client.receipts import export_chain, verify_chain
from temporal_agent_interrupts.web import agents_app
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys, generate_receipt_key
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.receipts import (
    Receipt,
    ReceiptBody,
    ReceiptChain,
    canonical,
    digest,
)
from tests.agents import supervisor
from tests.helpers import assert_no_workflow_task_failed, current_details, eventually
from tests.test_presentation import PAY, payments_desk
from tests.test_sub_agents import delegate
from tests.test_web_app import paused_entry
from tests.web import answer, served

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def signed(keys: ReceiptKeys, body: ReceiptBody) -> Receipt:
    kid, sig = keys.sign(body.canonical())
    return Receipt(id=body.id(), body=body, key_id=kid, signature=sig)


def chain_of(
    chat_id: str, decisions: list[tuple[str, str]], keys: list[ReceiptKeys], **extra: object
) -> list[Receipt]:
    out: list[Receipt] = []
    prev = None
    for n, (kind, decision) in enumerate(decisions):
        body = ReceiptBody(
            chat_id=chat_id,
            seq=n,
            prev=prev,
            at=T0 + timedelta(minutes=n),
            ref=f"r{n}",
            tool="sendPayment",
            kind=kind,
            decision=decision,
            input_digest=digest({"amount": 7300 + n}),
            approver="cfo@example.com",
            verified=True,
            issuer="https://idp.example.com",
            subject="sha256:ab",
            token_key_id="idp-1",
            **extra if n == 0 else {},  # type: ignore[arg-type]  # test data only
        )
        receipt = signed(keys[min(n * len(keys) // len(decisions), len(keys) - 1)], body)
        out.append(receipt)
        prev = receipt.id
    return out


KEYS = ReceiptKeys.parse(generate_receipt_key("k1"))
DECISIONS = [("vote", "vote"), ("vote", "approved"), ("edit", "edited"), ("deadline", "expired")]


def test_canonical_json_is_sorted_compact_utf8_and_stable():
    assert canonical({"b": 1, "a": [1.5, "é", None]}) == '{"a":[1.5,"é",null],"b":1}'.encode()
    assert digest({"a": 1}) == digest({"a": 1})
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical({"x": float("nan")})


def test_a_whole_chain_verifies_and_every_kind_of_break_is_named():
    receipts = chain_of("chat-1", DECISIONS, [KEYS])
    chain = ReceiptChain(chat_id="chat-1", receipts=receipts, key_ids=["k1"])
    assert verify_chain(chain, KEYS.jwks()).ok

    # One byte flipped in a body: 7300 -> 7301 in the JSON as exported.
    text = chain.model_dump_json()
    flipped = text.replace('"ref":"r2"', '"ref":"r7"')
    found = verify_chain(json.loads(flipped), KEYS.jwks())
    assert not found.ok and "receipt 3 of 4" in (found.where or "")
    assert "does not hash to its id" in (found.why or "")

    removed = chain.model_copy(update={"receipts": [receipts[0], *receipts[2:]]})
    found = verify_chain(removed, KEYS.jwks())
    assert not found.ok and "receipt 2 of 3 (seq 2" in (found.where or "")
    assert "removed" in (found.why or "")

    swapped = chain.model_copy(
        update={"receipts": [receipts[0], receipts[2], receipts[1], receipts[3]]}
    )
    found = verify_chain(swapped, KEYS.jwks())
    assert not found.ok and "receipt 2 of 4" in (found.where or "")

    other = ReceiptKeys.parse(generate_receipt_key("k1"))
    found = verify_chain(chain, other.jwks())
    assert not found.ok and "signature does not verify" in (found.why or "")
    found = verify_chain(chain, {"keys": []})
    assert not found.ok and "does not hold" in (found.why or "")


def test_a_key_rotated_mid_conversation_verifies_with_both_keys_in_the_set():
    old = ReceiptKeys.parse(generate_receipt_key("old"))
    new = ReceiptKeys.parse(generate_receipt_key("new"))
    receipts = chain_of("chat-2", DECISIONS, [old, new])
    assert [r.key_id for r in receipts] == ["old", "old", "new", "new"]
    chain = ReceiptChain(chat_id="chat-2", receipts=receipts)
    both = {"keys": [*old.jwks()["keys"], *new.jwks()["keys"]]}
    assert verify_chain(chain, both).ok
    found = verify_chain(chain, new.jwks())
    assert not found.ok and "receipt 1 of 4" in (found.where or "")


def test_a_sub_agents_chain_is_linked_from_its_callers_receipt():
    child = chain_of("child-1", [("respond", "approved")], [KEYS])
    caller = chain_of(
        "caller-1",
        [("forwarded", "approved"), ("respond", "answered")],
        [KEYS],
        child_chat_id="child-1",
        child=child[-1].id,
    )
    chain = ReceiptChain(chat_id="caller-1", receipts=caller, children={"child-1": child})
    found = verify_chain(chain, KEYS.jwks())
    assert found.ok and found.checked == 3
    cut = chain.model_copy(update={"children": {}})
    found = verify_chain(cut, KEYS.jwks())
    assert not found.ok and "sub-agent chat 'child-1'" in (found.why or "")


def test_a_signature_is_deterministic_so_a_replay_signs_the_same():
    body = chain_of("chat-3", DECISIONS[:1], [KEYS])[0].body
    assert KEYS.sign(body.canonical()) == KEYS.sign(body.canonical())


# ----------------------------------------------------------------------------------------------
# Live: a conversation issues a signed receipt for each decision, chained across its runs.


async def test_a_conversations_decisions_carry_a_signed_chain_that_verifies_offline(
    run_worker, model, client
):
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    model.reply(
        calls(("sendPayment", PAY, "p1")),
        text("paid"),
        calls(("sendPayment", {**PAY, "amount": 10}, "p2")),
        text("not paid"),
    )
    async with run_worker(agents=[payments_desk], receipt_keys=keys) as agents:
        chat = await agents.chat(payments_desk.name)
        (first,) = (await chat.send("Pay the rent.")).interrupts
        await chat.resume(answers=[first.approve()], identity="cfo@example.com")
        (second,) = (await chat.send("Pay ten.")).interrupts
        await chat.resume(answers=[second.deny("no")], identity="cfo@example.com")
        trail = await chat.audit()
    receipts = [r.receipt for r in trail if r.receipt is not None]
    assert [(r.body.seq, r.body.decision, r.body.ref) for r in receipts] == [
        (0, "approved", "p1"),
        (1, "denied", "p2"),
    ]
    assert receipts[0].body.input_digest == digest(PAY)
    assert receipts[1].body.prev == receipts[0].id
    chain = ReceiptChain(chat_id=chat.id, receipts=receipts, key_ids=["r1"])
    assert verify_chain(chain, keys.jwks()).ok
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_sub_agents_chain_is_linked_from_the_callers_receipt_of_the_answer(client):
    """An answer given through the caller: the sub-agent's receipt decides it, and the
    caller's ``forwarded`` receipt names it (``child``); both chains verify together."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    payee = f"payee-{uuid.uuid4().hex[:6]}"
    offline = ScriptedModel(offline_rules)
    async with hosted(client, agents=[supervisor], model=offline, receipt_keys=keys) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate(payee, 5))).interrupts
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP
        child_id = i.chat_id
        assert child_id is not None
        child_trail = await agents.audit(child_id)
        parent_trail = await agents.audit(parent.id)
    (decided,) = [r.receipt for r in child_trail if r.receipt is not None]
    # The caller's trail shows the sub-agent's records too; its own receipts are of its chat.
    own = [r.receipt for r in parent_trail if r.receipt and r.receipt.body.chat_id == parent.id]
    passed_on, ended = own
    assert (passed_on.body.kind, passed_on.body.child_chat_id) == ("forwarded", child_id)
    assert passed_on.body.child == decided.id
    # When the sub-agent ended, the caller pinned its chain's last receipt.
    assert (ended.body.kind, ended.body.child_chat_id, ended.body.child) == (
        "sub_agent",
        child_id,
        decided.id,
    )
    assert ended.body.prev == passed_on.id
    assert decided.body.decision == "approved" and decided.body.approver == "alice"
    chain = ReceiptChain(chat_id=parent.id, receipts=own, children={child_id: [decided]})
    assert verify_chain(chain, keys.jwks()).ok
    # What agentctl audit --export writes from the caller's trail: the same chains.
    exported = export_chain(parent.id, parent_trail)
    assert exported.receipts == own and exported.children == {child_id: [decided]}
    assert verify_chain(exported, keys.jwks()).ok
    # The caller's receipt no longer links the sub-agent's once its chain is cut from the file.
    found = verify_chain(exported.model_copy(update={"children": {}}), keys.jwks())
    assert not found.ok and "sub-agent" in (found.why or "")


async def test_the_chain_runs_on_across_continue_as_new(small_histories, model):
    """Six approvals on a server that suggests continue-as-new after a few events: the
    receipts of every run form one chain, seq 0 to 5, each linking the one before."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    client = small_histories.client
    for n in range(6):
        model.reply(calls(("sendPayment", {**PAY, "amount": n + 1}, f"p{n}")), text(f"paid {n}"))
    async with hosted(client, agents=[payments_desk], model=model, receipt_keys=keys) as agents:
        chat = await agents.chat(payments_desk.name)
        for n in range(6):
            (asked,) = (await chat.send(f"Pay {n + 1}.")).interrupts
            await chat.resume(answers=[asked.approve()], identity="cfo@example.com")
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{chat.id}'")]
        trail = await chat.audit()
    assert len(runs) >= 2
    receipts = [r.receipt for r in trail if r.receipt is not None]
    assert [r.body.seq for r in receipts] == list(range(6))
    assert [r.body.ref for r in receipts] == [f"p{n}" for n in range(6)]
    # Every run's receipts name the conversation's first run: the same conversation.
    info = (await client.get_workflow_handle(chat.id).describe()).raw_description
    first_run = info.workflow_execution_info.first_run_id
    assert first_run in {w.run_id for w in runs}
    assert {r.body.run for r in receipts} == {first_run}
    found = verify_chain(ReceiptChain(chat_id=chat.id, receipts=receipts), keys.jwks())
    assert found.ok and found.run == first_run


async def test_a_start_input_cannot_plant_a_chain_head_or_a_receipt(run_worker, model, client):
    """Someone who may start workflows starts a conversation whose input carries a made-up
    state: a chain head at seq 41 naming a real receipt, and a record with a receipt. Only
    continue-as-new hands on state: the run's first decision is seq 0 with no ``prev``, and the
    planted receipt is in no trail, so a forged chain cannot be grown from a real one."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    real = chain_of("chat-real", DECISIONS, [keys])
    planted = {
        "at": T0.isoformat(),
        "ref": "x1",
        "name": "sendPayment",
        "kind": "respond",
        "via": "update",
        "identity": "cfo@example.com",
        "decision": "approved",
        "receipt": json.loads(real[0].model_dump_json()),
    }
    chat_id = f"chat-{uuid.uuid4()}"
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    async with run_worker(agents=[payments_desk], receipt_keys=keys) as agents:
        await client.start_workflow(
            "AgentWorkflow",
            {
                "agent": payments_desk.name,
                "state": {
                    "agent": payments_desk.name,
                    "receipt_head": {"seq": 41, "last": real[-1].id},
                    "answers": [planted],
                    "audit_outbox": [planted],
                },
            },
            id=chat_id,
            task_queue=agents.task_queue,
        )
        chat = await agents.chat(payments_desk.name, chat_id=chat_id)
        (asked,) = (await chat.send("Pay the rent.")).interrupts
        await chat.resume(answers=[asked.approve()], identity="cfo@example.com")
        trail = await chat.audit()
    (decided,) = [r.receipt for r in trail if r.receipt is not None]
    assert (decided.body.seq, decided.body.prev, decided.body.ref) == (0, None, "p1")
    assert all(r.ref != "x1" for r in trail)
    assert verify_chain(ReceiptChain(chat_id=chat_id, receipts=[decided]), keys.jwks()).ok
    await assert_no_workflow_task_failed(client, chat_id)


IDP = TokenIssuer("ES256", kid="idp-2026")
trusted_desk = Agent(
    "trusted_payments_desk",
    model="gemini-test",
    tools=payments_desk.tools,
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
    trust=IDP.trust(),
)


async def test_a_verified_approvers_receipt_names_the_issuer_the_account_and_the_token_key(
    run_worker, model, client
):
    """A decision proven by a token: its receipt says verified, by which issuer, for which
    account (a fingerprint of ``sub``, not the token) and under which of the issuer's keys;
    the token itself is in no receipt."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    async with run_worker(agents=[trusted_desk], receipt_keys=keys) as agents:
        chat = await agents.chat(trusted_desk.name)
        (asked,) = (await chat.send("Pay the rent.")).interrupts
        token = IDP.mint("cfo@example.com")
        await chat.resume(answers=[asked.approve()], identity_token=token)
        trail = await chat.audit()
    (decided,) = [r.receipt for r in trail if r.receipt is not None]
    body = decided.body
    assert (body.approver, body.verified, body.issuer) == ("cfo@example.com", True, IDP.issuer)
    assert body.token_key_id == "idp-2026"
    assert body.subject is not None and len(body.subject) == 32
    assert token not in decided.model_dump_json()
    assert verify_chain(ReceiptChain(chat_id=chat.id, receipts=[decided]), keys.jwks()).ok


async def test_the_approvals_api_and_the_details_panel_name_the_decisions_receipt(
    run_worker, model, client
):
    """The approver who answers through the approvals API is handed the decision's receipt id;
    the UI's details panel names it under the recent decisions; both are the trail's."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    as_cfo = {"X-Agent-Identity": "cfo@example.com"}
    async with run_worker(agents=[payments_desk], receipt_keys=keys) as agents:
        chat = await agents.chat(payments_desk.name)
        await chat.send("Pay the rent.")
        listed = await paused_entry(agents, payments_desk.name, chat.id)
        (digest,) = [i["input_digest"] for i in listed["interrupts"]]
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            body = {"action": "approve", "input_digest": digest}
            r = await answer(http, base, chat.id, "p1", body, headers=as_cfo)
        assert r.status_code == 200, r.text
        (decided,) = [a.receipt for a in await chat.audit() if a.receipt is not None]
        assert r.json()["receipt"] == decided.id == r.json()["result"]["receipt"]
        panel = await eventually(
            lambda: current_details(client, chat.id), lambda d: decided.id[:16] in d, timeout=20
        )
        assert f"receipt `{decided.id[:16]}`" in panel

"""Decision receipts checked by a third party (issue 50): a chain exported with ``agentctl audit
--export`` from a real conversation verifies with ``agentctl verify`` and the workers' public
keys alone (no server: it runs against an address nothing listens on), and the same file with a
byte flipped, a receipt removed or two swapped fails, naming the first broken link; a key rotated
mid-conversation verifies with both keys in the set, and fails at the first old receipt without
the old key. The keys are published by ``agent-worker --print-receipt-jwks`` and the web app."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
from pydantic import BaseModel

from temporal_agent_interrupts import (
    AgentClient,
    FinishReason,
    ToolContext,
    agent_tool,
    approve,
    interrupt,
    tool,
)
from temporal_agent_interrupts.client.receipts import export_chain
from temporal_agent_interrupts.types import ReceiptChain, verify_chain
from temporal_agent_interrupts.web import agents_app
from temporal_agent_interrupts.worker.receipt_keys import (
    ReceiptKeys,
    dev_receipt_key_file,
    dev_receipt_keys,
    generate_receipt_key,
)
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import hosted
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.types import GrantCondition, GrantScope
from tests.agents import SUB_RUNS, Answer, Ask, payments
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_operator import AGENTCTL, Run, agentctl
from tests.test_receipts import chain_of
from tests.web import served

CFO = "cfo@example.com"
SIGNERS = ["alice@example.com", "bob@example.com"]
WORKER = Path(sys.executable).parent / "agent-worker"


class Payment(BaseModel):
    amount: float
    payee: str


@tool("pay", "Pay someone; the CFO approves and may change the amount.", editable=True)
async def pay(inp: Payment, ctx: ToolContext) -> dict[str, object]:
    return {"paid": inp.amount}


sign_off = interrupt(
    "signOff", "Both signers approve.", input=Ask, output=Answer, approvers=SIGNERS, quorum=2
)
quick = interrupt(
    "quickAsk",
    "Answered within seconds, or it is declined.",
    input=Ask,
    output=Answer,
    timeout=timedelta(seconds=2),
    on_timeout={"approved": False, "note": "timed out"},
)
desk = Agent(
    "receiptDesk",
    model="gemini-test",
    tools=[pay, sign_off, quick, agent_tool(payments, description="Pay through payments.")],
    middleware=[ToolApproval(allow=[], approvers=[CFO])],
)
UNDER_100 = GrantScope(match=[GrantCondition(field="amount", op="le", value=100)])


def _pay(amount: float, ref: str) -> tuple[str, dict[str, object], str]:
    return ("pay", {"amount": amount, "payee": "NL91ABNA0417164300"}, ref)


async def verify(path: Path, keys: Path, *extra: str) -> Run:
    """``agentctl verify`` as a subprocess, with a Temporal address where nothing listens: it
    must not need one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS="127.0.0.1:1", COLUMNS="200", NO_COLOR="1")
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        "verify",
        str(path),
        "--keys",
        str(keys),
        *extra,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return Run(proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode())


def printed_jwks(keys: str) -> dict[str, object]:
    """What ``agent-worker --print-receipt-jwks`` prints for ``AGENT_RECEIPT_KEYS=keys``."""
    done = subprocess.run(
        [str(WORKER), "--print-receipt-jwks"],
        env={**os.environ, "AGENT_RECEIPT_KEYS": keys},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_an_exported_chain_verifies_offline_and_each_tampering_is_named(
    small_histories, model, tmp_path
):
    client = small_histories.client
    tq = f"receipts-{uuid.uuid4()}"
    secret = generate_receipt_key("r1")
    model.reply(calls(("signOff", {"question": "ship Q4?"}, "s1")), text("signed"))
    model.reply(calls(_pay(80, "p1")), text("paid 80"))
    model.reply(calls(_pay(50, "p2")), text("paid 50"))
    model.reply(calls(_pay(500, "p3")), text("paid 400"))
    # A sub-agent: the call to it is approved here, then its own pay is answered through
    # this chat (passed on), and it ends.
    task = 'call pay {"to": "rcpt-child", "amount": 5}'
    model.reply(calls(("payments", {"input": task}, "d1")))
    model.reply(calls(("pay", {"to": "rcpt-child", "amount": 5}, "c1")), text("paid 5"))
    model.reply(text("delegated"))
    model.reply(calls(("quickAsk", {"question": "now?"}, "q1")), text("it timed out"))
    async with hosted(
        client, agents=[desk], model=model, task_queue=tq, receipt_keys=secret
    ) as agents:
        chat = await agents.chat(desk.name)
        # A quorum: a vote, then the approval that completes it.
        (s1,) = (await chat.send("sign off")).interrupts
        await chat.resume(answers=[s1.approve()], identity=SIGNERS[0])
        done = await chat.resume(answers=[s1.approve()], identity=SIGNERS[1])
        assert done.text == "signed"
        # An approval that grants, and a call the grant lets through.
        (p1,) = (await chat.send("pay 80")).interrupts
        await chat.resume(answers=[approve(p1, remember=UNDER_100)], identity=CFO)
        assert (await chat.send("pay 50")).interrupts == []
        # An edit.
        (p3,) = (await chat.send("pay 500")).interrupts
        edit = p3.restart({"tool_approved": True}, input={"amount": 400, "payee": "NL91"})
        assert (await chat.resume(answers=[edit], identity=CFO)).text == "paid 400"
        # A sub-agent, whose call is approved here and whose own pause is answered here.
        (d1,) = (await chat.send("delegate")).interrupts
        (c1,) = (await chat.resume(answers=[approve(d1)], identity=CFO)).interrupts
        assert c1.chat_id == f"{chat.id}--d1"
        assert (await chat.resume(answers=[approve(c1)], identity="alice")).text == "delegated"
        assert SUB_RUNS["rcpt-child"] == 1
        # A deadline's default.
        (asked,) = (await chat.send("quick")).interrupts
        assert asked.deadline is not None
        last = await eventually(
            chat.last_turn, lambda r: r is not None and r.text == "it timed out", timeout=30
        )
        assert last is not None and last.finish_reason == FinishReason.STOP
        runs = [wf.run_id async for wf in client.list_workflows(f'WorkflowId = "{chat.id}"')]
        await assert_no_workflow_task_failed(client, chat.id)

    # It continued as new on the way (small histories): the chain runs across its runs.
    assert len(runs) >= 2
    chain_file = tmp_path / "chain.json"
    exported = await agentctl(
        client, "audit", chat.id, "--export", str(chain_file), "--json", task_queue=tq
    )
    assert exported.code == 0, exported.err
    chain = ReceiptChain.model_validate_json(chain_file.read_text())
    kinds = [r.body.kind for r in chain.receipts]
    assert {"vote", "restart", "granted", "edit", "deadline", "forwarded", "sub_agent"} <= set(
        kinds
    ), kinds
    assert [r.body.seq for r in chain.receipts] == list(range(len(chain.receipts)))
    # The sub-agent's chain: its one decision, linked by the caller's forwarded receipt and
    # pinned by its sub_agent receipt (its last).
    (child,) = chain.children[f"{chat.id}--d1"]
    assert (child.body.approver, child.body.decision) == ("alice", "approved")
    links = {r.body.kind: r.body.child for r in chain.receipts if r.body.child is not None}
    assert links == {"forwarded": child.id, "sub_agent": child.id}
    n = len(chain.receipts) + 1
    assert exported.json()["receipts"] == n and chain.key_ids == ["r1"]
    assert exported.json()["unsigned"] == 0
    # What the trail holds and the file holds are the same receipts.
    trail = await AgentClient(client, task_queue=tq).audit(chat.id)
    assert export_chain(chat.id, trail) == chain

    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(printed_jwks(secret)))
    ok = await verify(chain_file, keys_file)
    assert ok.code == 0, ok.err
    assert ok.out.strip() == f"ok: {n} receipts in 2 chains of {chat.id} verified, signed under r1"
    as_json = await verify(chain_file, keys_file, "--json")
    assert as_json.code == 0 and as_json.json()["checked"] == n

    text_of = chain_file.read_text()
    # One byte flipped: a hex digit of the third receipt's input digest.
    third = chain.receipts[2].body.input_digest
    assert third is not None
    at = text_of.index(third) + len("sha256:")
    flipped = text_of[:at] + ("0" if text_of[at] != "0" else "1") + text_of[at + 1 :]
    assert sum(a != b for a, b in zip(flipped, text_of, strict=True)) == 1
    run = await verify(write(tmp_path / "flipped.json", flipped), keys_file)
    assert run.code == 1, run.err
    own = len(chain.receipts)
    assert f"receipt 3 of {own} (seq 2, ref " in run.err and "does not hash to its id" in run.err

    def edited(receipts: list[object]) -> str:
        raw = json.loads(text_of)
        raw["receipts"] = receipts
        return json.dumps(raw)

    raw = json.loads(text_of)["receipts"]
    run = await verify(write(tmp_path / "removed.json", edited([raw[0], *raw[2:]])), keys_file)
    assert run.code == 1
    assert f"receipt 2 of {own - 1} (seq 2, ref " in run.err and "removed" in run.err
    swapped = [raw[0], raw[2], raw[1], *raw[3:]]
    run = await verify(write(tmp_path / "swapped.json", edited(swapped)), keys_file)
    assert run.code == 1 and f"receipt 2 of {own} (seq 2, ref " in run.err
    # The sub-agent's chain left out: the caller's receipts name it.
    cut = json.loads(text_of)
    cut["children"] = {}
    run = await verify(write(tmp_path / "no-child.json", json.dumps(cut)), keys_file)
    assert run.code == 1 and f"sub-agent chat {chat.id + '--d1'!r}" in run.err
    # An unknown key: another worker's.
    other = tmp_path / "other.json"
    other.write_text(json.dumps(printed_jwks(generate_receipt_key("r2"))))
    run = await verify(chain_file, other)
    assert run.code == 1 and "which the key set does not hold" in run.err
    # Files that do not read: exit 2, and the message names the file.
    run = await verify(tmp_path / "missing.json", keys_file)
    assert run.code == 2 and "missing.json" in run.err and "does not exist" in run.err
    run = await verify(write(tmp_path / "torn.json", text_of[: len(text_of) // 2]), keys_file)
    assert run.code == 2 and "is not JSON" in run.err
    run = await verify(keys_file, keys_file)
    assert run.code == 2 and "is not a receipt chain" in run.err


def write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


async def test_a_key_rotated_mid_conversation_verifies_with_both_keys_and_not_without_the_old(
    run_worker, model, client, tmp_path
):
    old = generate_receipt_key("old")
    new = generate_receipt_key("new")
    tq = f"rotate-{uuid.uuid4()}"
    model.reply(calls(_pay(10, "a1")), text("paid 10"))
    model.reply(calls(_pay(20, "a2")), text("paid 20"))
    model.reply(calls(_pay(30, "b1")), text("paid 30"))
    model.reply(calls(_pay(40, "b2")), text("not paid"))
    async with run_worker(agents=[desk], task_queue=tq, receipt_keys=old) as agents:
        chat = await agents.chat(desk.name)
        for message in ("pay 10", "pay 20"):
            (i,) = (await chat.send(message)).interrupts
            await chat.resume(answers=[i.approve()], identity=CFO)
    # The rotation: the new key first, the old kept listed (a restart with the new setting).
    async with run_worker(agents=[desk], task_queue=tq, receipt_keys=f"{new},{old}") as agents:
        chat = await agents.chat(desk.name, chat_id=chat.id)
        (i,) = (await chat.send("pay 30")).interrupts
        await chat.resume(answers=[i.approve()], identity=CFO)
        (i,) = (await chat.send("pay 40")).interrupts
        await chat.resume(answers=[i.deny("no")], identity=CFO)
        await assert_no_workflow_task_failed(client, chat.id)

    chain_file = tmp_path / "rotated.json"
    exported = await agentctl(client, "audit", chat.id, "--export", str(chain_file), task_queue=tq)
    assert exported.code == 0, exported.err
    chain = ReceiptChain.model_validate_json(chain_file.read_text())
    assert [r.key_id for r in chain.receipts] == ["old", "old", "new", "new"]
    assert chain.key_ids == ["new", "old"]
    assert "wrote 4 receipts of" in exported.out and "signed under new, old" in exported.out

    both = tmp_path / "both.json"
    both.write_text(json.dumps(printed_jwks(f"{new},{old}")))
    run = await verify(chain_file, both)
    assert run.code == 0, run.err
    assert run.out.strip().endswith("signed under new, old")
    only_new = tmp_path / "new.json"
    only_new.write_text(json.dumps(printed_jwks(new)))
    run = await verify(chain_file, only_new)
    assert run.code == 1
    assert "receipt 1 of 4 (seq 0, ref 'a1')" in run.err
    assert "signed under key 'old', which the key set does not hold" in run.err


async def test_the_web_app_publishes_the_public_keys_and_never_a_private_one(client):
    keys = ReceiptKeys.parse(generate_receipt_key("w1"))
    app = agents_app(AgentClient(client, task_queue="unused"), receipt_jwks=keys.jwks())
    async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
        got = await http.get(f"{base}/.well-known/agent-receipt-keys.json")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/jwk-set+json"
    assert got.json() == keys.jwks()
    # What it serves verifies what the key signed.
    chain = ReceiptChain(chat_id="c", receipts=chain_of("c", [("respond", "approved")], [keys]))
    assert verify_chain(chain, got.json()).ok
    private = {"keys": [{**keys.jwks()["keys"][0], "d": "c2VjcmV0"}]}
    with pytest.raises(ValueError, match="private key"):
        agents_app(AgentClient(client, task_queue="unused"), receipt_jwks=private)
    with pytest.raises(ValueError, match="not a JWK Set"):
        agents_app(AgentClient(client, task_queue="unused"), receipt_jwks={"kty": "OKP"})


def test_the_embedded_default_signs_with_a_development_key_that_agent_worker_publishes(
    tmp_path, monkeypatch
):
    """`make run` (nothing configured) signs receipts with a key file made once, owner-only,
    beside the development result key; ``--print-receipt-jwks`` publishes its public half, and
    a receipt signed with it verifies against what was printed."""
    monkeypatch.delenv("AGENT_RECEIPT_KEYS", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    made = dev_receipt_keys()
    path = dev_receipt_key_file()
    assert path.parent == tmp_path / "temporal-agent-interrupts"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert dev_receipt_keys().jwks() == made.jwks()  # made once, read after
    env = {k: v for k, v in os.environ.items() if k != "AGENT_RECEIPT_KEYS"}
    done = subprocess.run(
        [str(WORKER), "--print-receipt-jwks"],
        env={**env, "XDG_STATE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    published = json.loads(done.stdout)
    assert published == made.jwks() and "d" not in published["keys"][0]  # no private key
    chain = ReceiptChain(
        chat_id="chat-dev", receipts=chain_of("chat-dev", [("respond", "answered")], [made])
    )
    assert verify_chain(chain, published).ok
    # Nowhere to read one from: a clear refusal, exit 2.
    empty = tmp_path / "empty"
    refused = subprocess.run(
        [str(WORKER), "--print-receipt-jwks"],
        env={**env, "XDG_STATE_HOME": str(empty)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "no development receipt key" in refused.stderr

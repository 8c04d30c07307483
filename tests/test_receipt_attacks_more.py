"""More attacks on decision receipts (issue 50), as someone holding namespace credentials or
handing an auditor a crafted chain file: each test is one attack on ``verify_chain``,
``agentctl verify``, or a worker that signs. The pure ones need no server; the live ones run a
conversation on the dev server."""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from typer.testing import CliRunner

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.client.cli import app as agentctl
from temporal_agent_interrupts.client.receipts import export_chain, verify_chain
from temporal_agent_interrupts.worker import sandbox_runner
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys, generate_receipt_key
from temporal_agent_interrupts.worker.result_keys import ResultKeys, ResultKeysInterceptor
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.receipts import ReceiptBody, ReceiptChain
from tests.agents import supervisor
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_receipt_attacks import DECISIONS, T0
from tests.test_receipts import chain_of, signed
from tests.test_sub_agents import delegate

KEYS = ReceiptKeys.parse(generate_receipt_key("k1"))
JWKS = KEYS.jwks()


def _file(chain: ReceiptChain) -> dict[str, Any]:
    return json.loads(chain.model_dump_json())


def _good(chat: str = "chat-P") -> ReceiptChain:
    return ReceiptChain(chat_id=chat, receipts=chain_of(chat, DECISIONS, [KEYS]), key_ids=["k1"])


def _with_child(chat: str = "chat-P") -> ReceiptChain:
    """chat-P's chain, whose last receipt (a ``sub_agent`` record) pins its sub-agent's."""
    child_chat = f"{chat}--c1"
    child = chain_of(child_chat, DECISIONS, [KEYS])
    own = chain_of(chat, DECISIONS, [KEYS])
    body = ReceiptBody(
        chat_id=chat, seq=len(own), prev=own[-1].id, at=T0, ref="c1", tool="helper",
        kind="sub_agent", child_chat_id=child_chat, child=child[-1].id,
    )  # fmt: skip
    return ReceiptChain(
        chat_id=chat,
        receipts=[*own, signed(KEYS, body)],
        children={child_chat: child},
        key_ids=["k1"],
    )


def test_the_untouched_files_verify():
    assert verify_chain(_file(_good()), JWKS).ok
    assert verify_chain(_file(_with_child()), JWKS).ok


# --- dropping the oldest receipts ---------------------------------------------------------------


def test_a_chain_with_its_first_receipt_dropped_fails():
    """Fixed: the verifier took whatever receipt came first as the chain's start (for an export
    made after retention ended the oldest runs), so a file with the first decision cut off (a
    denial before an approval, say) verified, and ``agentctl verify`` said "ok"."""
    data = _file(_good())
    del data["receipts"][0]
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "seq 0" in check.why


def test_a_sub_agents_chain_with_its_first_receipts_dropped_fails():
    """Fixed: as the caller's own chain: a sub-agent's chain cut at its start verified, though
    the caller's receipt pins the whole of it."""
    data = _file(_with_child())
    del data["children"]["chat-P--c1"][:2]
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "seq 0" in check.why


def test_a_chain_cut_at_its_start_verifies_only_when_asked_and_says_where_it_starts():
    data = _file(_good())
    del data["receipts"][0]
    check = verify_chain(data, JWKS, partial=True)
    assert check.ok and check.checked == len(DECISIONS) - 1
    assert check.starts == {"chat-P": 1}
    assert verify_chain(_file(_good()), JWKS, partial=True).starts == {}


def test_agentctl_verify_refuses_a_cut_start_unless_told_partial(tmp_path: Path):
    data = _file(_good())
    del data["receipts"][0]
    code, out = _verify(tmp_path, json.dumps(data))
    assert code == 1 and "seq 0" in out
    (tmp_path / "c.json").write_text(json.dumps(data))
    ran = CliRunner().invoke(
        agentctl,
        ["verify", str(tmp_path / "c.json"), "--keys", str(tmp_path / "k.json"), "--partial"],
    )
    assert ran.exit_code == 0 and "starts at seq 1" in ran.output, ran.output


# --- a changed byte in a signature ---------------------------------------------------------------


def _flipped_last(sig: str) -> str:
    """The signature with its last character changed only in the bits base64 does not use."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    n = alphabet.index(sig[-1])
    return sig[:-1] + alphabet[n ^ 1]


@pytest.mark.parametrize(
    "change",
    [
        _flipped_last,
        lambda s: s[:10] + " " + s[10:],
        lambda s: s[:10] + "." + s[10:],
        lambda s: s + "==",
        lambda s: s.replace("-", "+").replace("_", "/") if ("-" in s or "_" in s) else s + "=",
    ],
    ids=["unused-bits", "space", "dot", "padding", "standard-alphabet"],
)
def test_a_changed_byte_in_a_signature_fails(change):
    """Fixed: the signature was read with Python's lenient base64, which drops characters
    outside the alphabet and ignores the last character's unused bits: one byte of a receipt
    flipped (the issue's own test) still verified, and so did a signature with junk in it."""
    data = _file(_good())
    sig = data["receipts"][1]["signature"]
    changed = change(sig)
    assert changed != sig
    data["receipts"][1]["signature"] = changed
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "signature" in check.why


# --- words in the file no worker signed -----------------------------------------------------------


def test_a_top_level_field_no_worker_signed_fails():
    """Fixed: the receipts' unknown fields were refused, but the file's own were dropped
    (``extra="ignore"``), so a file saying ``"attested_by": "the board"`` beside its receipts
    verified."""
    data = _file(_good())
    data["attested_by"] = "the board"
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "no worker signed" in check.why


def test_key_ids_that_are_not_the_receipts_fail():
    """Fixed: the file's ``key_ids`` (which keys it says signed it) was never compared with
    the receipts' own."""
    data = _file(_good())
    data["key_ids"] = ["hsm-root-2026"]
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "key_ids" in check.why
    data["key_ids"] = []  # an older writer's file may leave it empty: nothing claimed
    assert verify_chain(data, JWKS).ok


# --- agentctl verify ---------------------------------------------------------------------------


def _verify(tmp_path: Path, chain_text: str, jwks_text: str | None = None) -> tuple[int, str]:
    (tmp_path / "c.json").write_text(chain_text)
    (tmp_path / "k.json").write_text(jwks_text if jwks_text is not None else json.dumps(JWKS))
    out = CliRunner().invoke(
        agentctl, ["verify", str(tmp_path / "c.json"), "--keys", str(tmp_path / "k.json")]
    )
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    return out.exit_code, out.output


def test_agentctl_verify_exits_2_on_a_duplicated_key(tmp_path: Path):
    """Fixed: a chain file whose receipt says ``"decision": "denied"`` and, later in the same
    object, ``"decision": "approved"``: Python's json keeps the last (the signed one) and the
    file verified, while an auditor reading it, or a tool that keeps the first, reads
    "denied". The same for a key set with a member twice."""
    text = _good().model_dump_json()
    forged = text.replace('"decision":"approved"', '"decision":"denied","decision":"approved"')
    assert _verify(tmp_path, text)[0] == 0
    code, out = _verify(tmp_path, forged)
    assert code == 2 and "duplicate" in out
    keys = json.dumps(JWKS).replace('"kid": "k1"', '"kid": "k0", "kid": "k1"')
    code, out = _verify(tmp_path, text, keys)
    assert code == 2 and "duplicate" in out


@pytest.mark.timeout(30)
def test_agentctl_verify_exits_2_on_a_file_past_its_limit(tmp_path: Path, monkeypatch):
    """Fixed: the file was read whole, however large: ``/dev/zero`` (or a crafted file of
    gigabytes) held the verifier until memory ran out."""
    from temporal_agent_interrupts.client import cli

    monkeypatch.setattr(cli, "VERIFY_FILE_LIMIT", 4096)
    padded = _good().model_dump_json(indent=2) + " " * 4096
    code, out = _verify(tmp_path, padded)
    assert code == 2 and "larger than" in out
    out2 = CliRunner().invoke(agentctl, ["verify", "/dev/zero", "--keys", str(tmp_path / "k.json")])
    assert out2.exit_code == 2 and "larger than" in out2.output


def test_a_verify_of_many_receipts_with_huge_integers_is_quick():
    """Held: a file of many receipts with enormous integers (short of Python's 4300-digit
    limit) is read, checked and refused in time linear in its size."""
    data = _file(_good())
    first = data["receipts"][0]
    data["receipts"] = [
        {**first, "body": {**first["body"], "seq": 10**4000 + n}} for n in range(2000)
    ]
    check = verify_chain(data, JWKS)
    assert not check.ok


# --- live: what a worker signs ------------------------------------------------------------------


async def test_an_answer_the_sub_agent_refused_gets_no_signed_receipt_in_the_caller(client):
    """Fixed: someone with namespace credentials sends, through the caller, an answer for a
    sub-agent's interrupt that the caller cannot judge (it carries a token, the child's to
    check) under any name they like. The child refuses it; the caller still signed a
    ``forwarded`` receipt naming that approver, the call and its tool, and the receipt never
    said it was refused (the verdict is not in the body): a signed receipt for a decision no
    one made. A refused answer now gets a trail record and no receipt, as a refusal on the
    conversation's own calls does."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    payee = f"payee-{uuid.uuid4().hex[:6]}"
    async with hosted(
        client, agents=[supervisor], model=ScriptedModel(offline_rules), receipt_keys=keys
    ) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate(payee, 5))).interrupts
        handle = client.get_workflow_handle(parent.id)
        await handle.signal(
            "resume",
            {
                "restart": [approve(i).model_dump(mode="json")],
                "identity": "ceo@example.com",
                "identity_token": "not-a-token",
            },
        )
        rejected = await eventually(parent.rejections, lambda r: len(r) >= 1, timeout=20)
        assert "refused by sub-agent" in rejected[-1].reason
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP
        trail = await agents.audit(parent.id)
    refused = [r for r in trail if r.kind == "forwarded" and r.verdict == "refused"]
    assert [r.identity for r in refused] == ["ceo@example.com"]  # the trail keeps it
    assert refused[0].receipt is None  # and no worker vouches for it
    exported = export_chain(parent.id, trail)
    assert all(r.body.approver != "ceo@example.com" for r in exported.receipts)
    assert verify_chain(exported, keys.jwks()).ok
    await assert_no_workflow_task_failed(client, parent.id)


async def test_a_replay_on_a_worker_with_another_key_or_none_is_deterministic(client):
    """Held: a conversation with a sub-agent, signed under one key, replays without a
    nondeterminism error on a worker whose key has rotated, and on one with no key at all
    (signing happens in the workflow task; only ids, never signatures, steer what it does)."""
    keys = ReceiptKeys.parse(generate_receipt_key("r1"))
    sealing = ResultKeys(keys=(("test", secrets.token_bytes(32)),))
    payee = f"payee-{uuid.uuid4().hex[:6]}"
    async with hosted(
        client,
        agents=[supervisor],
        model=ScriptedModel(offline_rules),
        receipt_keys=keys,
        result_keys=sealing,
    ) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate(payee, 5))).interrupts
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP
        child_id = i.chat_id
        assert child_id is not None
    histories = [
        await client.get_workflow_handle(chat).fetch_history() for chat in (parent.id, child_id)
    ]
    rotated = ReceiptKeys.parse(generate_receipt_key("r2"))
    for signer in (keys, rotated, None):
        replayer = Replayer(
            workflows=[AgentWorkflow],
            data_converter=pydantic_data_converter,
            interceptors=[ResultKeysInterceptor(sealing, receipt_keys=signer)],
            workflow_runner=sandbox_runner(strict=True),
        )
        for history in histories:
            await replayer.replay_workflow(history)

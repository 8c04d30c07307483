"""Attacks on decision receipts (issue 50), as someone holding namespace credentials or handing
an auditor a crafted chain file: each test is one attack on ``verify_chain``, ``agentctl verify``
or the receipt-keys route. Pure: no server, no worker."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from temporal_agent_interrupts.client.cli import app as agentctl
from temporal_agent_interrupts.client.receipts import public_keys, verify_chain
from temporal_agent_interrupts.web import agents_app
from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys, generate_receipt_key
from temporal_agent_interrupts.workflows.receipts import Receipt, ReceiptBody, ReceiptChain
from tests.test_receipts import chain_of, signed

KEYS = ReceiptKeys.parse(generate_receipt_key("k1"))
OTHER = ReceiptKeys.parse(generate_receipt_key("k1"))  # another worker's key, same kid
JWKS = KEYS.jwks()
DECISIONS = [("vote", "vote"), ("vote", "approved"), ("edit", "edited")]
T0 = datetime(2026, 12, 5, 12, tzinfo=UTC)


def _file(chain: ReceiptChain) -> dict[str, Any]:
    return json.loads(chain.model_dump_json())


def _good(chat: str = "chat-P") -> ReceiptChain:
    return ReceiptChain(chat_id=chat, receipts=chain_of(chat, DECISIONS, [KEYS]))


def _linking(chat: str, child_chat: str, child: Receipt, *, seq: int = 0) -> Receipt:
    body = ReceiptBody(
        chat_id=chat, seq=seq, at=T0, ref="c1", tool="helper", kind="forwarded",
        child_chat_id=child_chat, child=child.id,
    )  # fmt: skip
    return signed(KEYS, body)


def test_the_untouched_file_verifies():
    assert verify_chain(_file(_good()), JWKS).ok


# --- unsigned words in a file that verifies --------------------------------------------------


@pytest.mark.parametrize("where", ["body", "receipt"])
def test_a_field_no_worker_signed_fails(where: str):
    """Fixed: ``extra="ignore"`` dropped an added field before hashing, so a file whose receipt
    said ``"note": "approved by the board"`` (or ``body.approved_by``) verified."""
    data = _file(_good())
    target = data["receipts"][1]["body"] if where == "body" else data["receipts"][1]
    target["approved_by"] = "the board"
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "no worker signed" in check.why


def test_a_coerced_value_fails():
    """Fixed: ``"seq": "1"`` or ``"verified": "yes"`` were coerced to what was signed: the file
    then reads differently from the signed bytes."""
    data = _file(_good())
    data["receipts"][1]["body"]["seq"] = "1"
    assert not verify_chain(data, JWKS).ok
    data = _file(_good())
    data["receipts"][0]["body"]["verified"] = "yes"
    assert not verify_chain(data, JWKS).ok


# --- splicing ---------------------------------------------------------------------------------


def test_another_conversations_chain_spliced_in_as_a_child_fails():
    """Fixed: an unlinked, well-signed chain of chat-Q put in chat-P's ``children`` verified, so
    the file claimed chat-Q's decisions were chat-P's sub-agent's."""
    data = _file(_good())
    data["children"] = {"chat-Q": _file(_good("chat-Q"))["receipts"]}
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "another conversation" in check.why


def test_an_unlinked_child_under_the_callers_prefix_fails():
    """Fixed: a chain under ``chat-P--evil`` (a workflow anyone with namespace credentials may
    start, whose receipts a worker signs) verified as chat-P's sub-agent by its prefix alone.
    A sub-agent's chain is now taken only when a receipt of its caller links it."""
    data = _file(_good())
    data["children"] = {"chat-P--evil": _file(_good("chat-P--evil"))["receipts"]}
    assert not verify_chain(data, JWKS).ok


def test_a_receipt_of_another_chat_under_a_child_key_fails():
    data = _file(_good())
    child = chain_of("chat-P--c1", DECISIONS, [KEYS])
    data["children"] = {"chat-P--c1": _file(_good("chat-Q"))["receipts"]}
    data["receipts"].append(json.loads(_linking("chat-P", "chat-P--c1", child[0], seq=3)
                                       .model_dump_json()))  # fmt: skip
    check = verify_chain(data, JWKS)
    assert not check.ok  # a link to a receipt the child chain does not hold, or chat mismatch


def test_a_link_to_a_receipt_the_child_chain_does_not_hold_fails():
    real = chain_of("chat-P--c1", DECISIONS, [KEYS])
    data = _file(_good())
    last = data["receipts"][-1]["id"]
    link = _linking("chat-P", "chat-P--c1", real[2], seq=3).body.model_copy(update={"prev": last})
    data["receipts"].append(json.loads(signed(KEYS, link).model_dump_json()))
    data["children"] = {"chat-P--c1": [json.loads(r.model_dump_json()) for r in real[:2]]}
    check = verify_chain(data, JWKS)
    assert not check.ok and check.why and "does not hold" in check.why


def test_a_duplicate_seq_fails():
    data = _file(_good())
    data["receipts"].insert(1, data["receipts"][1])
    assert not verify_chain(data, JWKS).ok


def test_a_duplicated_own_chain_under_children_holds_no_unsigned_receipt():
    data = _file(_good())
    data["children"] = {"chat-P": data["receipts"]}
    check = verify_chain(data, JWKS)
    assert not check.ok  # the chat's own id is not its sub-agent's


# --- key sets ---------------------------------------------------------------------------------


def test_two_different_keys_under_one_kid_are_refused():
    """Fixed: the last of two keys under one kid silently won; a set padded with an attacker's
    key after the real one verified the attacker's receipts."""
    padded = {"keys": [*JWKS["keys"], *OTHER.jwks()["keys"]]}
    forged = ReceiptChain(chat_id="chat-P", receipts=chain_of("chat-P", DECISIONS, [OTHER]))
    with pytest.raises(ValueError, match="two different"):
        verify_chain(_file(forged), padded)
    same_twice = {"keys": [*JWKS["keys"], *JWKS["keys"]]}
    assert verify_chain(_file(_good()), same_twice).ok


@pytest.mark.parametrize(
    "entry",
    [
        {"kty": "OKP", "crv": "X25519", "kid": "k1", "x": "AAAA"},
        {"kty": "EC", "crv": "P-256", "kid": "k1", "x": "AAAA", "y": "AAAA"},
        {"kty": "oct", "kid": "k1", "k": "c2VjcmV0"},
    ],
)
def test_a_non_ed25519_key_under_an_ed25519_kid_verifies_nothing(entry: dict[str, str]):
    check = verify_chain(_file(_good()), {"keys": [entry]})
    assert not check.ok and check.why and "does not hold" in check.why


# --- odd input never raises -------------------------------------------------------------------


def _deep(n: int) -> Any:
    value: Any = []
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize(
    "chain",
    [
        [],
        "x",
        None,
        {"chat_id": "c", "receipts": _deep(5000)},
        {"chat_id": "c", "receipts": [{"id": "x", "body": _deep(5000)}]},
        {"chat_id": "c", "children": {"c--1": [{"id": 1}]}},
        {"chat_id": "c", "receipts": [{**_file(_good())["receipts"][0], "signature": "é"}]},
        {"chat_id": "c", "receipts": [{**_file(_good())["receipts"][0], "signature": ""}]},
    ],
)
def test_odd_chains_are_a_failed_check(chain: Any):
    check = verify_chain(chain, JWKS)
    assert not check.ok


def test_odd_key_sets_are_a_value_error():
    for jwks in ([], "x", {"keys": "x"}, {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": 1}]},
                 {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k", "x": "é"}]}):  # fmt: skip
        with pytest.raises(ValueError, match=r"JWK|kid|key|decode"):
            public_keys(jwks)  # type: ignore[arg-type]  # odd input on purpose


# --- agentctl verify --------------------------------------------------------------------------


def _verify(tmp_path: Path, chain_text: str, jwks_text: str) -> int:
    (tmp_path / "c.json").write_text(chain_text)
    (tmp_path / "k.json").write_text(jwks_text)
    out = CliRunner().invoke(
        agentctl, ["verify", str(tmp_path / "c.json"), "--keys", str(tmp_path / "k.json")]
    )
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    return out.exit_code


def test_agentctl_verify_exits_2_on_unreadable_files(tmp_path: Path):
    good = _good().model_dump_json()
    keys = json.dumps(JWKS)
    assert _verify(tmp_path, good, keys) == 0
    assert _verify(tmp_path, "[" * 100_000, keys) == 2
    assert _verify(tmp_path, good, "[" * 100_000) == 2
    assert _verify(tmp_path, good, '{"keys": 1}') == 2
    padded = json.dumps({"keys": [*JWKS["keys"], *OTHER.jwks()["keys"]]})
    assert _verify(tmp_path, good, padded) == 2


def test_agentctl_verify_exits_2_on_a_huge_integer(tmp_path: Path):
    data = _good().model_dump_json().replace('"seq":0', '"seq":' + "1" * 5000, 1)
    assert _verify(tmp_path, data, json.dumps(JWKS)) == 2


# --- the keys route ---------------------------------------------------------------------------


def test_the_route_refuses_a_private_ed25519_key():
    private = {"keys": [{**JWKS["keys"][0], "d": "c2VjcmV0"}]}
    with pytest.raises(ValueError, match="private key"):
        agents_app(object(), receipt_jwks=private)  # type: ignore[arg-type]  # fails first


def test_the_route_never_serves_a_secret_member():
    mixed = {"keys": [*JWKS["keys"], {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}]}
    with pytest.raises(ValueError, match="receipt_jwks"):
        agents_app(object(), receipt_jwks=mixed)  # type: ignore[arg-type]  # fails first


def test_a_receipt_of_another_conversation_under_the_same_chat_id_fails():
    """Once a chat closes, anyone may start a new conversation under its id: its receipts
    name another first run, so one spliced into the chain is named for what it is."""
    body = _good().receipts[1].body.model_copy(update={"run": "run-B"})
    chain = _good()
    first = chain.receipts[0].body.model_copy(update={"run": "run-A"})
    a = signed(KEYS, first)
    b = signed(KEYS, body.model_copy(update={"prev": a.id}))
    check = verify_chain(_file(ReceiptChain(chat_id="chat-P", receipts=[a, b])), JWKS)
    assert not check.ok and check.why and "another conversation under the same chat id" in check.why
    whole = verify_chain(_file(ReceiptChain(chat_id="chat-P", receipts=[a])), JWKS)
    assert whole.ok and whole.run == "run-A"

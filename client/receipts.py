"""Checking decision receipts with no server: a chain file and a JWK Set are all it needs.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:func:`verify_chain` checks, receipt by receipt, oldest first, that

1. the body hashes to the receipt's id (nothing in it changed);
2. the signature verifies under its key id, a key of the given set (the key is known, and the
   body is what a worker signed);
3. it is the next in its chain: its ``seq`` follows the one before, and its ``prev`` is that
   receipt's id (none removed, none reordered, none inserted); every receipt is of the chain's
   chat;
4. a caller's receipt that links a sub-agent's chain (``child``) names a receipt of that chain,
   which is checked the same way.

It stops at the first broken link and names it: which receipt (its position and seq), and why.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from temporal_agent_interrupts.workflows.receipts import Receipt, ReceiptChain


class ChainCheck(BaseModel):
    """What :func:`verify_chain` found: ``ok``, how many receipts it checked, and the first
    broken link (``where``, ``why``) when not ok."""

    ok: bool
    checked: int
    where: str | None = None
    why: str | None = None


def public_keys(jwks: Mapping[str, Any]) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 keys of a JWK Set (``{"keys": [...]}``) by key id; other keys are ignored.

    Raises:
        ValueError: not a JWK Set, or an Ed25519 key that does not decode.
    """
    entries = jwks.get("keys")
    if not isinstance(entries, list):
        raise ValueError('not a JWK Set: no "keys" list')
    found: dict[str, Ed25519PublicKey] = {}
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or entry.get("kty") != "OKP"
            or entry.get("crv") != "Ed25519"
        ):
            continue
        kid, x = entry.get("kid"), entry.get("x")
        if not isinstance(kid, str) or not isinstance(x, str):
            raise ValueError("an Ed25519 key without a kid or x")
        try:
            raw = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
            found[kid] = Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"the key {kid!r} does not decode: {e}") from None
    return found


def _check_one(
    receipt: Receipt,
    keys: Mapping[str, Ed25519PublicKey],
    *,
    chat_id: str,
    seq: int,
    prev: str | None,
) -> str | None:
    body = receipt.body
    data = body.canonical()
    if hashlib.sha256(data).hexdigest() != receipt.id:
        return "its body does not hash to its id: the receipt was changed"
    if receipt.key_id is None or receipt.signature is None:
        return "it is not signed"
    key = keys.get(receipt.key_id)
    if key is None:
        return f"it is signed under key {receipt.key_id!r}, which the key set does not hold"
    try:
        sig = base64.urlsafe_b64decode(receipt.signature + "=" * (-len(receipt.signature) % 4))
        key.verify(sig, data)
    except (InvalidSignature, binascii.Error, ValueError):
        return f"its signature does not verify under key {receipt.key_id!r}"
    if body.chat_id != chat_id:
        return f"it is a receipt of chat {body.chat_id!r}, not of this chain's {chat_id!r}"
    if body.seq != seq:
        return (
            f"its seq is {body.seq}, where {seq} comes next: a receipt before it was removed, "
            "or two were swapped"
        )
    if body.prev != prev:
        return "it does not link the receipt before it (prev): a receipt was removed or swapped"
    return None


def verify_receipts(
    receipts: Sequence[Receipt], keys: Mapping[str, Ed25519PublicKey], *, chat_id: str
) -> ChainCheck:
    """Check one chain, oldest first (see the module's docstring). The first receipt may start
    past seq 0 (an export made after retention ended the oldest runs): it is then taken as the
    chain's start, and said so by ``where`` only if something else is broken."""
    prev: str | None = None
    seq = receipts[0].body.seq if receipts else 0
    if receipts:
        prev = receipts[0].body.prev
    for n, receipt in enumerate(receipts):
        why = _check_one(receipt, keys, chat_id=chat_id, seq=seq, prev=prev)
        if why is not None:
            return ChainCheck(
                ok=False,
                checked=n,
                where=f"receipt {n + 1} of {len(receipts)} (seq {receipt.body.seq}, ref "
                f"{receipt.body.ref!r}) in chat {chat_id!r}",
                why=why,
            )
        prev, seq = receipt.id, seq + 1
    return ChainCheck(ok=True, checked=len(receipts))


def verify_chain(chain: ReceiptChain | Mapping[str, Any], jwks: Mapping[str, Any]) -> ChainCheck:
    """Check an exported chain (``agentctl audit --export``) and the sub-agents' chains it
    links, against a JWK Set. Never raises for what the file says: a file that does not read as
    a chain is a ChainCheck with ``why``.

    Raises:
        ValueError: ``jwks`` is not a JWK Set.
    """
    keys = public_keys(jwks)
    if not isinstance(chain, ReceiptChain):
        try:
            chain = ReceiptChain.model_validate(chain)
        except ValidationError as e:
            return ChainCheck(
                ok=False, checked=0, where="the file", why=f"not a receipt chain: {e}"
            )
    found = verify_receipts(chain.receipts, keys, chat_id=chain.chat_id)
    if not found.ok:
        return found
    checked = found.checked
    done: set[str] = set()
    for receipt in chain.receipts:
        link, child_chat = receipt.body.child, receipt.body.child_chat_id
        if link is None or child_chat is None:
            continue
        child = chain.children.get(child_chat)
        where = (
            f"receipt seq {receipt.body.seq} (ref {receipt.body.ref!r}) in chat {chain.chat_id!r}"
        )
        if child is None or all(r.id != link for r in child):
            return ChainCheck(
                ok=False,
                checked=checked,
                where=where,
                why=(
                    f"it links sub-agent chat {child_chat!r}, whose chain does not hold that "
                    "receipt"
                ),
            )
        if child_chat in done:
            continue
        done.add(child_chat)
        sub = verify_receipts(child, keys, chat_id=child_chat)
        if not sub.ok:
            return sub.model_copy(update={"checked": checked + sub.checked})
        checked += sub.checked
    return ChainCheck(ok=True, checked=checked)

"""Checking decision receipts with no server: a chain file and a JWK Set are all it needs.

Internal: not covered by the 0.1.x stability promise; its public names (:func:`verify_chain`,
:class:`ChainCheck`) are imported from ``temporal_agent_interrupts.types``.

:func:`verify_chain` checks, receipt by receipt, oldest first, that

1. the body hashes to the receipt's id (nothing in it changed);
2. the signature verifies under its key id, a key of the given set (the key is known, and the
   body is what a worker signed);
3. it is the next in its chain: its ``seq`` follows the one before, and its ``prev`` is that
   receipt's id (none removed, none reordered, none inserted); every receipt is of the chain's
   chat;
4. every sub-agent's chain in the file is checked the same way, is reached from the
   conversation's own chain by ``child`` links (a caller's receipt naming a receipt the
   sub-agent's chain holds: a ``forwarded`` answer's, or the ``sub_agent`` record written when
   it ended, which pins its last), and a receipt that links one names a receipt it holds.

It stops at the first broken link and names it: which receipt (its position and seq), and why.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from temporal_agent_interrupts.workflows.receipts import Receipt, ReceiptChain
from temporal_agent_interrupts.workflows.types import AnswerRecord, ReceiptBody, canonical


class ChainCheck(BaseModel):
    """What :func:`verify_chain` found: ``ok``, how many receipts it checked, and the first
    broken link (``where``, ``why``) when not ok."""

    ok: bool
    checked: int
    """Receipts checked and found good (all of them when ``ok``)."""
    where: str | None = None
    """The first broken link: which receipt (its position, seq and ref) in which chat."""
    why: str | None = None
    """What is wrong with it, in words."""
    chats: int = 0
    """Chains checked when ``ok``: the conversation's and each sub-agent's."""
    key_ids: list[str] = []
    """The key ids the receipts are signed under when ``ok``, sorted."""
    starts: dict[str, int] = {}
    """With ``partial``: the chains (by chat id) that start past seq 0, and the seq each
    starts at (the receipts before it are not in the file)."""
    run: str | None = None
    """When ``ok``: the conversation's first run id, as its receipts say (the same across
    continue-as-new): which conversation under the chat id the chain is, when someone started
    another under it after it closed."""


def public_keys(jwks: Mapping[str, Any]) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 keys of a JWK Set (``{"keys": [...]}``) by key id; other keys are ignored.

    Raises:
        ValueError: not a JWK Set, or an Ed25519 key that does not decode.
    """
    entries = jwks.get("keys") if isinstance(jwks, Mapping) else None
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
            key = Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"the key {kid!r} does not decode: {e}") from None
        if kid in found and found[kid] != key:
            # Two keys under one id: which one a receipt names is ambiguous (attack test).
            raise ValueError(f"two different Ed25519 keys under the key id {kid!r}")
        found[kid] = key
    return found


_CHAIN_FIELDS = frozenset(ReceiptChain.model_fields)
_RECEIPT_FIELDS = frozenset(Receipt.model_fields)
_BODY_FIELDS = frozenset(ReceiptBody.model_fields)


def _unsigned_words(raw: Mapping[str, Any]) -> str | None:
    """Why a chain file's receipts say something their signed bodies do not: a field the
    model would drop (``extra="ignore"``), or a value it would coerce (``"7"`` for ``7``),
    is text an auditor reads that no worker signed. None when every receipt is as signed."""
    extra = sorted(str(k) for k in raw if k not in _CHAIN_FIELDS)
    if extra:
        return f"the file holds fields no worker signed: {', '.join(extra)}"
    chats: list[tuple[str, Any]] = [("", raw.get("receipts"))]
    children = raw.get("children")
    if isinstance(children, Mapping):
        chats.extend(children.items())
    for chat, receipts in chats:
        for n, receipt in enumerate(receipts if isinstance(receipts, list) else []):
            where = f"receipt {n + 1}" + (f" of sub-agent chat {chat!r}" if chat else "")
            if not isinstance(receipt, Mapping):
                return f"{where} is not an object"
            extra = sorted(str(k) for k in receipt if k not in _RECEIPT_FIELDS)
            body = receipt.get("body")
            if isinstance(body, Mapping):
                extra += sorted(f"body.{k}" for k in body if k not in _BODY_FIELDS)
            if extra:
                return f"{where} holds fields no worker signed: {', '.join(extra)}"
            try:
                same = canonical(body) == ReceiptBody.model_validate(body).canonical()
            except (TypeError, ValueError, RecursionError):
                same = False
            if not same:
                return f"{where}'s body is not as it was signed (a value is not its canonical form)"
    return None


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _check_one(
    receipt: Receipt,
    keys: Mapping[str, Ed25519PublicKey],
    *,
    chat_id: str,
    seq: int,
    prev: str | None,
    run: str | None,
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
        # Read strictly: the lenient decoder drops characters outside the alphabet and the
        # last character's unused bits, so a changed byte would still verify (attack test).
        if _b64url(sig) != receipt.signature:
            raise ValueError("not the signature's one base64url spelling")
        key.verify(sig, data)
    except (InvalidSignature, binascii.Error, ValueError):
        return f"its signature does not verify under key {receipt.key_id!r}"
    if body.chat_id != chat_id:
        return f"it is a receipt of chat {body.chat_id!r}, not of this chain's {chat_id!r}"
    if body.run != run:
        return (
            f"it is a receipt of the conversation whose first run is {body.run!r}, not of this "
            f"chain's {run!r}: another conversation under the same chat id"
        )
    if body.seq != seq and seq == 0:
        return (
            f"its seq is {body.seq}, where a chain starts at seq 0: the receipts before it are "
            "not in the file (cut from its start; `agentctl verify --partial` takes such a "
            "chain from its first receipt on)"
        )
    if body.seq != seq:
        return (
            f"its seq is {body.seq}, where {seq} comes next: a receipt before it was removed, "
            "or two were swapped"
        )
    if body.prev != prev:
        return "it does not link the receipt before it (prev): a receipt was removed or swapped"
    return None


def _unlinked_child(chain: ReceiptChain) -> str | None:
    """The first sub-agent chain of the file that is not reached from the conversation's own
    chain by ``child`` links (a caller's receipt naming a receipt that chain holds); None when
    every one is (whether each holds the receipt linked is checked later). A sub-agent's
    receipts are vouched for by its caller's: a workflow anyone started under a sub-agent's id
    (or its prefix), however well a worker signed its receipts, is linked by no receipt of the
    caller's (attack test)."""
    reached: set[str] = set()
    frontier = [chain.receipts]
    while frontier:
        for receipt in frontier.pop():
            link, chat = receipt.body.child, receipt.body.child_chat_id
            # Whether the chain holds the receipt linked is checked after the signatures,
            # where the break is named.
            if link is None or chat is None or chat in reached or chat not in chain.children:
                continue
            reached.add(chat)
            frontier.append(chain.children[chat])
    return next((chat for chat in chain.children if chat not in reached), None)


def verify_receipts(
    receipts: Sequence[Receipt],
    keys: Mapping[str, Ed25519PublicKey],
    *,
    chat_id: str,
    partial: bool = False,
) -> ChainCheck:
    """Check one chain, oldest first (see the module's docstring). It starts at seq 0 with no
    ``prev``; with ``partial``, its first receipt may start past it (an export made after
    retention ended the oldest runs) and is then taken as the chain's start, and ``starts``
    says where. Without, a chain cut at its start is a broken one: the decisions before the
    first receipt in the file are not there (attack test)."""
    prev: str | None = None
    seq = receipts[0].body.seq if receipts and partial else 0
    if receipts and partial:
        prev = receipts[0].body.prev
    for n, receipt in enumerate(receipts):
        why = _check_one(
            receipt, keys, chat_id=chat_id, seq=seq, prev=prev, run=receipts[0].body.run
        )
        if why is not None:
            return ChainCheck(
                ok=False,
                checked=n,
                where=f"receipt {n + 1} of {len(receipts)} (seq {receipt.body.seq}, ref "
                f"{receipt.body.ref!r}) in chat {chat_id!r}",
                why=why,
            )
        prev, seq = receipt.id, seq + 1
    start = receipts[0].body.seq if receipts else 0
    return ChainCheck(ok=True, checked=len(receipts), starts={chat_id: start} if start else {})


def verify_chain(
    chain: ReceiptChain | Mapping[str, Any], jwks: Mapping[str, Any], *, partial: bool = False
) -> ChainCheck:
    """Check a conversation's decision receipts against the workers' public keys, with no server.

    ``chain`` is what ``agentctl audit CHAT --export FILE`` writes (a :class:`ReceiptChain`, or
    the JSON of one, parsed); ``jwks`` is the workers' JWK Set (``agent-worker
    --print-receipt-jwks``, or the web app's ``/.well-known/agent-receipt-keys.json``). The
    conversation's chain is checked first, then each sub-agent's in ``children``, receipt by
    receipt, oldest first:

    1. the body hashes to the receipt's id (nothing in it changed);
    2. the signature verifies under its key id, a key of ``jwks``;
    3. it follows the receipt before it (its ``seq`` is the next, its ``prev`` that receipt's
       id: none removed, reordered or inserted) and is of the chain's chat;
    4. every sub-agent's chain is reached from the conversation's by ``child`` links, and a
       receipt that links one names a receipt that chain holds.

    A team that archives receipts in its own store can rebuild a :class:`ReceiptChain` from
    them (each :class:`~temporal_agent_interrupts.types.AnswerRecord`'s ``receipt``) and check
    it here.

    Args:
        chain: The chain, or its JSON as a mapping (a file that does not read as a chain is
            a failed check, not an error).
        jwks: A JWK Set (``{"keys": [...]}``); its Ed25519 keys (``OKP``) are used, others
            ignored.
        partial: Take a chain whose oldest receipts are not in the file (an export made after
            retention ended a conversation's oldest runs) from its first receipt on, and say
            where each such chain starts (``starts``). Without it, every chain must start at
            seq 0: a receipt cut from the start is as broken as one cut from the middle.

    Returns:
        ``ok`` with the receipts and chains checked and the key ids they are signed under; or,
        at the first broken link, ``where`` (which receipt, in which chat) and ``why``.

    Raises:
        ValueError: ``jwks`` is not a JWK Set, or holds an Ed25519 key that does not decode.
    """
    keys = public_keys(jwks)
    if not isinstance(chain, ReceiptChain):
        raw = chain
        try:
            chain = ReceiptChain.model_validate(raw)
        except ValidationError as e:
            return ChainCheck(
                ok=False, checked=0, where="the file", why=f"not a receipt chain: {e}"
            )
        except RecursionError:
            return ChainCheck(ok=False, checked=0, where="the file", why="nested too deep")
        unsigned = _unsigned_words(raw)
        if unsigned is not None:
            return ChainCheck(ok=False, checked=0, where="the file", why=unsigned)
    signed_under = sorted(
        {r.key_id for rs in (chain.receipts, *chain.children.values()) for r in rs if r.key_id}
    )
    if chain.key_ids and chain.key_ids != signed_under:
        # What the file says signed it is words no worker signed: they must be the receipts'.
        return ChainCheck(
            ok=False,
            checked=0,
            where="the file",
            why=f"its key_ids {chain.key_ids!r} are not the receipts' key ids {signed_under!r}",
        )
    unlinked = _unlinked_child(chain)
    if unlinked is not None:
        return ChainCheck(
            ok=False,
            checked=0,
            where=f"sub-agent chat {unlinked!r}",
            why=f"no receipt of chat {chain.chat_id!r} or its linked sub-agents links its chain: "
            "a chain from another conversation, or one no caller vouches for",
        )
    chains: list[tuple[str, list[Receipt]]] = [
        (chain.chat_id, chain.receipts),
        *chain.children.items(),
    ]
    checked = 0
    starts: dict[str, int] = {}
    for chat_id, receipts in chains:
        found = verify_receipts(receipts, keys, chat_id=chat_id, partial=partial)
        if not found.ok:
            return found.model_copy(update={"checked": checked + found.checked})
        checked += found.checked
        starts.update(found.starts)
    for chat_id, receipts in chains:
        for receipt in receipts:
            link, child_chat = receipt.body.child, receipt.body.child_chat_id
            if link is None or child_chat is None:
                continue
            child = chain.children.get(child_chat, [])
            if all(r.id != link for r in child):
                return ChainCheck(
                    ok=False,
                    checked=checked,
                    where=f"receipt seq {receipt.body.seq} (ref {receipt.body.ref!r}) in chat "
                    f"{chat_id!r}",
                    why=f"it links sub-agent chat {child_chat!r}, whose chain does not hold "
                    "that receipt",
                )
    return ChainCheck(
        ok=True,
        checked=checked,
        chats=len(chains),
        key_ids=sorted({r.key_id for _, rs in chains for r in rs if r.key_id is not None}),
        starts=starts,
        run=chain.receipts[0].body.run if chain.receipts else None,
    )


def export_chain(chat_id: str, records: Iterable[AnswerRecord]) -> ReceiptChain:
    """The chain file of a conversation's audit trail (``agentctl audit --export``): each
    record's receipt, the conversation's in ``receipts`` and each sub-agent's (the receipt's
    ``chat_id`` says whose) in ``children``, oldest (lowest ``seq``) first. A record without a
    receipt (written before receipts were issued, or one that decides nothing) is left out; a
    receipt found twice is written once. Nothing is checked here: that is the verifier's."""
    by_chat: dict[str, dict[str, Receipt]] = {}
    for record in records:
        receipt = record.receipt
        if receipt is not None:
            by_chat.setdefault(receipt.body.chat_id, {}).setdefault(receipt.id, receipt)

    def oldest_first(found: dict[str, Receipt]) -> list[Receipt]:
        return sorted(found.values(), key=lambda r: r.body.seq)

    own = oldest_first(by_chat.pop(chat_id, {}))
    children = {child: oldest_first(by_chat[child]) for child in sorted(by_chat)}
    every = [*own, *(r for rs in children.values() for r in rs)]
    return ReceiptChain(
        chat_id=chat_id,
        receipts=own,
        children=children,
        key_ids=sorted({r.key_id for r in every if r.key_id is not None}),
    )

"""Decision receipts: what one decision of a conversation says, in a form a third party checks.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A receipt is a :class:`ReceiptBody` (the chat, the call, the digest of the input decided on, the
decision, who decided and how they were proven, the grant or policy that decided, the time, and
the previous receipt's id), its id (the SHA-256 of the body's canonical JSON) and an Ed25519
signature over that canonical JSON under a key id. The ids chain a conversation's receipts, one
after the other, across continue-as-new; a caller's receipt for an answer it passed on names the
sub-agent's latest receipt (``child``), so a sub-agent's chain is linked from its caller's.

Pure code: no Temporal, no cryptography (the workflow sandbox imports this module). Signing is
the worker's (``worker.receipt_keys``); checking is anyone's, with no server
(``client.receipts``).

**The canonical JSON** (what ids and signatures are computed over, and ``input_digest``): the
value as JSON with object keys sorted by Unicode code point, no whitespace (``,`` and ``:``),
strings as UTF-8 with only the escapes JSON requires, integers in full and floats in their
shortest round-trip form (Python's ``json``), no NaN or infinity; encoded as UTF-8. Times are
ISO 8601 in UTC ending ``Z``, with microseconds when there are any, as pydantic writes them.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from temporal_agent_interrupts.workflows.types import JsonObject, _Wire

RECEIPT_VERSION = 1


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON bytes (see the module's docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8", "surrogatepass")  # deterministic even for a lone surrogate


def digest(value: Any) -> str:
    """``sha256:`` and the hex SHA-256 of ``value``'s canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical(value)).hexdigest()


class ReceiptBody(_Wire):
    """What one decision says. Every field is signed."""

    v: Literal[1] = RECEIPT_VERSION
    chat_id: str
    # The position in the conversation's chain (0 first) and the id of the receipt before it
    # (None for the first).
    seq: int
    prev: str | None = None
    at: datetime
    ref: str
    tool: str
    # The audit record's kind (respond, restart, edit, vote, deadline, cancel, granted,
    # revoked, voided, policy, forwarded) and what it decided.
    kind: str
    decision: str | None = None
    # The digest of the input decided on (canonical JSON), when the decision had one.
    input_digest: str | None = None
    # Who decided: an identity, and how it was proven. ``verified`` with an issuer: a token
    # of that issuer, its subject's fingerprint and its key id; without: what the caller said.
    approver: str | None = None
    verified: bool = False
    issuer: str | None = None
    subject: str | None = None
    token_key_id: str | None = None
    # What decided where no person did: a grant's id, a policy set's hash.
    grant: str | None = None
    policy_hash: str | None = None
    # A caller's record of an answer passed on to a sub-agent: the sub-agent's chat, and the
    # id of its latest receipt when the caller last read it.
    child_chat_id: str | None = None
    child: str | None = None

    def id(self) -> str:
        """The receipt's id: the hex SHA-256 of this body's canonical JSON."""
        return hashlib.sha256(self.canonical()).hexdigest()

    def canonical(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


class Receipt(_Wire):
    """A signed receipt: the body, its id, and an Ed25519 signature of the body's canonical JSON
    (base64url, no padding) under ``key_id`` (a key of the worker's set, published as a JWK)."""

    id: str
    body: ReceiptBody
    key_id: str | None = None
    signature: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ReceiptChain(_Wire):
    """A conversation's receipts, oldest first, as ``agentctl audit --export`` writes them: the
    file ``agentctl verify`` reads."""

    format: Literal["temporal-agent-interrupts/receipts"] = "temporal-agent-interrupts/receipts"
    v: Literal[1] = RECEIPT_VERSION
    chat_id: str
    receipts: list[Receipt] = Field(default_factory=list)
    # The sub-agents' chains, by chat id, each linked from a caller's receipt (``child``).
    children: dict[str, list[Receipt]] = Field(default_factory=dict)
    # The key ids the receipts were signed under (the verifier's JWK Set must hold them).
    key_ids: list[str] = Field(default_factory=list)


def input_of(value: JsonObject | None) -> str | None:
    """The receipt's ``input_digest`` of a decision's input (None when it had none)."""
    return digest(value) if value is not None else None

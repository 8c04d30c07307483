"""Decision receipts: what one decision of a conversation says, in a form a third party checks.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A receipt is a :class:`ReceiptBody` (the chat, the call, the digest of the input decided on, the
decision, who decided and how they were proven, the grant or policy that decided, the time, and
the previous receipt's id), its id (the SHA-256 of the body's canonical JSON) and an Ed25519
signature over that canonical JSON under a key id. The ids chain a conversation's receipts, one
after the other, across continue-as-new; a caller's receipt for an answer it passed on names the
sub-agent's latest receipt (``child``), so a sub-agent's chain is linked from its caller's.

No cryptography here (the workflow sandbox imports this module): signing is the worker's
(``worker.receipt_keys``), reached through an extern function; checking is anyone's, with no
server (``client.receipts``).

**The canonical JSON** (what ids and signatures are computed over, and ``input_digest``): the
value as JSON with object keys sorted by Unicode code point, no whitespace (``,`` and ``:``),
strings as UTF-8 with only the escapes JSON requires, integers in full and floats in their
shortest round-trip form (Python's ``json``), no NaN or infinity; encoded as UTF-8. Times are
ISO 8601 in UTC ending ``Z``, with microseconds when there are any, as pydantic writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from temporalio import workflow

from temporal_agent_interrupts.workflows.state import ConversationState, ReceiptHead
from temporal_agent_interrupts.workflows.types import (
    RECEIPT_VERSION,
    AnswerRecord,
    JsonObject,
    Receipt,
    ReceiptBody,
    ReceiptChain,
    canonical,
    canonical_digest,
)

digest = canonical_digest

__all__ = ["RECEIPT_VERSION", "Receipt", "ReceiptBody", "ReceiptChain", "canonical", "digest"]


def input_of(value: JsonObject | None) -> str | None:
    """The receipt's ``input_digest`` of a decision's input (None when it had none)."""
    return canonical_digest(value) if value is not None else None


Signer = Callable[[bytes], tuple[str, str]]
"""Signs a receipt body's canonical JSON: the key id and the signature (base64url). The worker
gives it to the workflow as an extern function (``worker.receipt_keys``); the key stays there."""

EXTERN = "agent_interrupts.receipt_signer"


def workflow_signer() -> Signer | None:
    """The signer the worker running this workflow gave it; None when it gave none (receipts
    are then issued unsigned, and ``agentctl verify`` says so)."""
    found: Callable[[], Signer] | None = workflow.extern_functions().get(EXTERN)
    return found() if found is not None else None


@dataclass(frozen=True)
class Issuer:
    """What issuing a receipt needs beyond the state: the chat, the signer and the agent's
    trusted issuer (what ``verified`` means)."""

    chat_id: str
    sign: Signer | None
    trusted_issuer: str | None = None
    # The conversation's first run id (ReceiptBody.run).
    run: str | None = None


def issue(
    state: ConversationState,
    record: AnswerRecord,
    issuer: Issuer,
    *,
    decided_on: JsonObject | None,
    subject: str | None = None,
    token_key_id: str | None = None,
    child: str | None = None,
) -> Receipt:
    """The next receipt of the conversation's chain, for ``record``; the chain's head moves on.

    Args:
        decided_on: The input the decision was on (its digest is signed).
        subject: A verified approver's account (a fingerprint of the token's ``sub``).
        token_key_id: The trusted key that verified the approver's token (its kid).
        child: A caller's record of an answer passed on: the sub-agent's receipt for it.
    """
    head = state.receipt_head or ReceiptHead()
    verified = record.identity_verified
    body = ReceiptBody(
        chat_id=issuer.chat_id,
        run=issuer.run,
        seq=head.seq,
        prev=head.last,
        at=record.at,
        ref=record.ref,
        tool=record.name,
        kind=record.kind,
        decision=record.decision,
        input_digest=input_of(decided_on),
        approver=record.identity,
        verified=verified,
        issuer=issuer.trusted_issuer if verified else None,
        subject=subject if verified else None,
        token_key_id=token_key_id if verified else None,
        grant=record.grant,
        policy_hash=state.spec.policy_hash if record.kind == "policy" and state.spec else None,
        child_chat_id=record.chat_id,
        child=child,
    )
    receipt_id = body.id()
    key_id = signature = None
    if issuer.sign is not None:
        key_id, signature = issuer.sign(body.canonical())
    state.receipt_head = ReceiptHead(seq=head.seq + 1, last=receipt_id)
    return Receipt(id=receipt_id, body=body, key_id=key_id, signature=signature)


def issuer_for(state: ConversationState) -> Issuer:
    """The issuer of this run's receipts: its chat, the worker's signer, the agent's issuer."""
    spec = state.spec
    info = workflow.info()
    return Issuer(
        chat_id=info.workflow_id,
        run=info.first_execution_run_id,
        sign=workflow_signer(),
        trusted_issuer=spec.trust.issuer if spec is not None and spec.trust is not None else None,
    )

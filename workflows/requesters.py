"""The requester: who sent the message a turn answers, checked as an answer's sender is.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A message may say who sends it (``SendInput.identity``) and, for an agent that verifies identity
(``trust``), prove it with ``identity_token``: a JWT verified by the same code as an answer's
(:func:`workflows.identity.verify_token`), spent once per conversation in the same book
(:mod:`workflows.tokens`). The rules, in one place:

- without ``trust``, the identity is recorded as asserted (``verified=False``), and a token is
  refused, as an answer's is;
- with ``trust``, an identity is recorded only as a token proves it: a message that names
  someone without a token is refused (an unproven name would sit beside verified ones), one
  that names nobody has no requester;
- a token made for one answer (``ANSWER_CLAIM``) sends nothing, and one made for one message
  (``SEND_CLAIM``) sends only that message in that chat (and answers nothing: see
  ``governance.who``).

The agent's definition comes with the first model call's result, so a conversation's first
message may arrive before it is known: then only its shape is checked at the door, and the
claim waits on the turn (``TurnState.claim``) until the definition arrives; it is decided
before any call of the turn is, and a refusal ends the turn ``failed`` (PERMISSION_DENIED)
with nothing run and the message taken back (:meth:`workflows.turn.TurnMachine.drive`).

Pure code with no Temporal imports: the time and the chat id are passed in, so a replay decides
the same.
"""

from __future__ import annotations

from datetime import datetime

from temporal_agent_interrupts.workflows.governance import (
    GROUP_PREFIX,
    fingerprint,
    spendable,
    verified_person,
)
from temporal_agent_interrupts.workflows.identity import (
    MAX_TOKEN_BYTES,
)
from temporal_agent_interrupts.workflows.limits import DOOR, Refused, check_label
from temporal_agent_interrupts.workflows.state import RequesterClaim, SpentToken
from temporal_agent_interrupts.workflows.tokens import (
    TokenFacts,
    spend,
)
from temporal_agent_interrupts.workflows.types import AgentSpec, Requester


class RequesterError(Refused):
    """A message's sender that is not accepted; ``reason`` says why, without the token."""


def check_shape(identity: str | None, token: str | None) -> None:
    """What the door checks of a message's sender whatever the agent's rules: a one-line
    identity of at most :data:`DOOR.identity` bytes, and a token no larger than any accepted.

    Raises:
        RequesterError: either is malformed (code ``invalid``).
    """
    try:
        if identity is not None:
            check_label(identity, what="identity", limit=DOOR.identity)
            if identity.startswith(GROUP_PREFIX):
                raise Refused(
                    f"an identity may not begin with {GROUP_PREFIX!r}, which names a group"
                )
    except Refused as e:
        raise RequesterError(e.reason) from None
    if token is not None and (
        not token or len(token.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES
    ):
        raise RequesterError(
            f"identity_token must be a JWT of at most {MAX_TOKEN_BYTES} bytes (or left out)"
        )


def settle(
    claim: RequesterClaim,
    *,
    spec: AgentSpec | None,
    spent: list[SpentToken],
    now: datetime,
    chat: str,
) -> Requester | None:
    """The requester ``claim`` proves under ``spec``'s rules (None: it names nobody), with its
    token spent in ``spent``.

    Args:
        spec: The agent's definition (None: not known yet; only an asserted identity is taken,
            and a token is refused, so call this once it is known).
        spent: The conversation's spent tokens; the claim's token is spent here when accepted.
        now: The workflow's time, which the token's expiry is checked against.
        chat: This conversation's chat id (a token made for a message names its chat).

    Raises:
        RequesterError: ``forbidden``: the claim is not accepted, and why.
    """
    requester, facts = _decide(claim, spec=spec, spent=spent, now=now, chat=chat)
    if facts is not None:
        spend(spent, facts, now=now)
    return requester


def check(
    claim: RequesterClaim,
    *,
    spec: AgentSpec | None,
    spent: list[SpentToken],
    now: datetime,
    chat: str,
) -> Requester | None:
    """As :func:`settle`, spending nothing (an update's validator asks this)."""
    return _decide(claim, spec=spec, spent=spent, now=now, chat=chat)[0]


def _decide(
    claim: RequesterClaim,
    *,
    spec: AgentSpec | None,
    spent: list[SpentToken],
    now: datetime,
    chat: str,
) -> tuple[Requester | None, TokenFacts | None]:
    """The requester, and the token it spends (None: it spends none)."""
    check_shape(claim.identity, claim.token)
    trust = spec.trust if spec else None
    if trust is None:
        if claim.token is not None:
            raise RequesterError(
                "this agent does not verify identity tokens: leave out identity_token and say "
                "who sends with identity (recorded as asserted, not verified)",
                code="forbidden",
            )
        if claim.identity is None:
            return None, None
        return Requester(identity=claim.identity, verified=False), None
    if claim.token is None:
        if claim.identity is None:
            return None, None  # nobody said: no requester, as anyone may send
        raise RequesterError(
            f"this agent verifies who sends: send identity_token, a JWT from {trust.issuer} "
            f"for audience {trust.audience}, with the message (or leave out identity)",
            code="forbidden",
        )
    try:
        verified = verified_person(claim.token, trust, now=now)
    except Refused as e:
        raise RequesterError(e.reason, code=e.code) from None
    if verified.binding is not None:
        raise RequesterError(
            "the identity token was made for an answer: it sends no message (the web app "
            "makes one for each message)",
            code="forbidden",
        )
    bound = verified.send
    if bound is not None and bound.chat != chat:
        raise RequesterError(
            "the identity token was made for a message in another conversation: it sends "
            "only there",
            code="forbidden",
        )
    if bound is not None and bound.message != claim.message:
        raise RequesterError(
            "the identity token was made for another message: it sends only that one",
            code="forbidden",
        )
    try:
        facts = spendable(verified, asserted=claim.identity, spent=spent, now=now, by="message")
    except Refused as e:
        raise RequesterError(e.reason, code=e.code) from None
    requester = Requester(
        identity=verified.identity,
        verified=True,
        subject=fingerprint(verified.subject),
        # Bounded: they are kept on the turn and on each of its calls.
        groups=[g for g in verified.groups if len(g.encode()) <= 128][:16],
    )
    return requester, facts


__all__ = ["RequesterError", "check", "check_shape", "settle"]

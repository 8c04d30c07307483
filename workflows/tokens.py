"""The spent-token book: which identity tokens may no longer answer in this conversation.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Every answer with an identity token is in history, so its token must answer nothing more: an
accepted answer spends its token, and so does a refused one that could have answered something
here (``InterruptBook.spend_refused``), since its copy in history outlives the refusal. What is
remembered is what the token *signs* (a digest of its header and claims), never how it is
spelled: the signature's encoding can vary without changing what was signed (base64 padding,
ECDSA's ``(r, n - s)``), and ``workflows.identity`` refuses the non-canonical spellings anyway.

The book is bounded, and no one account (nor many) can fill it for an approver:

- entries are forgotten once the token could no longer be accepted (its expiry plus the leeway;
  tokens valid for more than :data:`MAX_TOKEN_LIFE` are refused, so nothing is kept longer);
- an account (the token's ``sub``) has at most :data:`MAX_PER_SUBJECT` entries of its own: past
  that they are folded into one entry for the account, "every token of it issued by T" (its
  ``iat``; for tokens without one, "expiring by T"), so its older tokens stay spent and any token
  issued afterwards still answers: tokens of an approver harvested from other conversations'
  histories fold only tokens as old as they are;
- accepted answers, and refused tokens of an account some approver list names, share
  :data:`MAX_SPENT_TOKENS` entries; past that the account with the most is folded the same way,
  and only when that many *named* accounts have live entries is a new token refused;
- refused tokens of accounts no list names (they could answer only what anyone may answer) go to
  a pool of their own, :data:`MAX_OFFERED`, the oldest forgotten first: however many accounts an
  attacker has at the issuer, they never take the room an approver's answer needs (a forgotten
  one could answer, once, something anyone may answer).

Pure code with no Temporal imports: it runs in the workflow and gives the same verdict on replay.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporal_agent_interrupts.workflows.state import (
    SpentToken,
)

MAX_SPENT_TOKENS = 512
"""Entries of accepted and named accounts' tokens, at most (about 100 bytes each in the state
continue-as-new carries)."""

MAX_PER_SUBJECT = 32
"""Entries one account holds before its own are folded into one."""

MAX_OFFERED = 256
"""Refused tokens of accounts no approver list names, remembered at most (the oldest go)."""

MAX_TOKEN_LIFE = timedelta(days=1)
"""The longest an identity token may still be valid when it is used."""


@dataclass(frozen=True)
class TokenFacts:
    """What a verified token leaves in the book."""

    digest: str
    """A fingerprint of what the token signs (its header and claims)."""
    subject: str
    """A fingerprint of its account."""
    until: datetime
    """The last instant it could be accepted (its expiry plus the agent's leeway)."""
    issued: datetime | None = None
    """Its ``iat``, when it has one."""

    def entry(self, *, offered: bool = False) -> SpentToken:
        return SpentToken(
            digest=self.digest,
            until=self.until,
            subject=self.subject,
            issued=self.issued,
            kind="offered" if offered else "token",
        )


def live(book: list[SpentToken], now: datetime) -> list[SpentToken]:
    """The entries that still refuse something at ``now``."""
    return [e for e in book if e.until > now]


def is_spent(book: list[SpentToken], token: TokenFacts) -> bool:
    """Whether ``token`` may no longer answer: it was used or offered here, or its account's
    entries were folded after it was issued."""
    for e in book:
        if e.kind == "subject":
            if e.subject != token.subject:
                continue
            if token.issued is not None and e.issued is not None:
                if token.issued <= e.issued:
                    return True
            elif token.until <= e.until:
                return True
        elif e.digest == token.digest:
            return True
    return False


def _kept(book: list[SpentToken]) -> list[SpentToken]:
    """The entries that count against :data:`MAX_SPENT_TOKENS` (not the offered pool)."""
    return [e for e in book if e.kind != "offered"]


def has_room(book: list[SpentToken], token: TokenFacts, *, now: datetime) -> bool:
    """Whether :func:`spend` would keep ``token`` (validators ask: this changes nothing)."""
    entries = _kept(live(book, now))
    if is_spent(book, token) or len(entries) < MAX_SPENT_TOKENS:
        return True
    counts = Counter(e.subject for e in entries)
    # The account's own entries fold into one that covers this token too; or another account's
    # several entries fold into one, making room.
    return counts[token.subject] > 0 or max(counts.values(), default=0) > 1


def spend(
    book: list[SpentToken], token: TokenFacts, *, now: datetime, offered: bool = False
) -> bool:
    """Remember ``token`` in ``book`` (mutated in place); False when there is no room (see
    :func:`has_room`), which leaves the book as it was but for forgetting expired entries.

    Args:
        offered: A refused token of an account no approver list names: into the pool whose
            oldest entries are forgotten first (always True then).
    """
    book[:] = live(book, now)
    if is_spent(book, token):
        return True
    if offered:
        book.append(token.entry(offered=True))
        pool = [e for e in book if e.kind == "offered"]
        if len(pool) > MAX_OFFERED:
            oldest = {id(e) for e in pool[: len(pool) - MAX_OFFERED]}
            book[:] = [e for e in book if id(e) not in oldest]
        return True
    kept = _kept(book)
    mine = sum(1 for e in kept if e.subject == token.subject)
    if mine >= MAX_PER_SUBJECT:
        _fold(book, token.subject, also=token)
        return True
    if len(kept) >= MAX_SPENT_TOKENS:
        if mine:
            _fold(book, token.subject, also=token)
            return True
        heaviest, most = Counter(e.subject for e in kept).most_common(1)[0]
        if most < 2:
            return False
        _fold(book, heaviest)
    book.append(token.entry())
    return True


def _fold(book: list[SpentToken], subject: str | None, *, also: TokenFacts | None = None) -> None:
    """Replace ``subject``'s kept entries with one that spends every token of it issued (or,
    without an ``iat``, expiring) no later than the latest of them, and ``also``."""
    theirs = [e for e in book if e.subject == subject and e.kind != "offered"]
    untils = [e.until for e in theirs] + ([also.until] if also is not None else [])
    issued = [e.issued for e in theirs if e.issued is not None]
    if also is not None and also.issued is not None:
        issued.append(also.issued)
    book[:] = [e for e in book if e.subject != subject or e.kind == "offered"]
    book.append(
        SpentToken(
            digest="",
            until=max(untils),
            subject=subject,
            issued=max(issued) if issued else None,
            kind="subject",
        )
    )


__all__ = [
    "MAX_OFFERED",
    "MAX_PER_SUBJECT",
    "MAX_SPENT_TOKENS",
    "MAX_TOKEN_LIFE",
    "TokenFacts",
    "has_room",
    "is_spent",
    "live",
    "spend",
]

"""The spent-token book: which identity tokens may no longer answer in this conversation.

Every answer with an identity token is in history, so its token must answer nothing more: an
accepted answer spends its token, and so does a refused one that could have answered something
here (``InterruptBook.spend_refused``), since its copy in history outlives the refusal. What is
remembered is what the token *signs* (a digest of its header and claims), never how it is
spelled: the signature's encoding can vary without changing what was signed (base64 padding,
ECDSA's ``(r, n - s)``), and ``workflows.identity`` refuses the non-canonical spellings anyway.

The book is bounded, and no one account can fill it for the others:

- entries are forgotten once the token could no longer be accepted (its expiry plus the leeway;
  tokens valid for more than :data:`MAX_TOKEN_LIFE` are refused, so nothing is kept longer);
- an account (the token's ``sub``) has at most :data:`MAX_PER_SUBJECT` entries of its own: past
  that they are folded into one entry for the account, "every token of it that expires by T",
  so the account's older tokens stay spent and only a token issued afterwards answers;
- past :data:`MAX_SPENT_TOKENS` entries, the account with the most is folded the same way. Only
  when that many *distinct* accounts have live entries is a new token refused (a day of answers
  by over 500 people in one conversation).

Pure code with no Temporal imports: it runs in the workflow and gives the same verdict on replay.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.types import SpentToken

MAX_SPENT_TOKENS = 512
"""Entries the book holds at most (about 100 bytes each in the state continue-as-new carries)."""

MAX_PER_SUBJECT = 32
"""Entries one account holds before its own are folded into one."""

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

    def entry(self) -> SpentToken:
        return SpentToken(digest=self.digest, until=self.until, subject=self.subject)


def live(book: list[SpentToken], now: datetime) -> list[SpentToken]:
    """The entries that still refuse something at ``now``."""
    return [e for e in book if e.until > now]


def is_spent(book: list[SpentToken], token: TokenFacts) -> bool:
    """Whether ``token`` may no longer answer: it was used or offered here, or its account's
    entries were folded after it (it expires no later than the fold)."""
    for e in book:
        if e.kind == "token" and e.digest == token.digest:
            return True
        if e.kind == "subject" and e.subject == token.subject and token.until <= e.until:
            return True
    return False


def has_room(book: list[SpentToken], token: TokenFacts, *, now: datetime) -> bool:
    """Whether :func:`spend` would keep ``token`` (validators ask: this changes nothing)."""
    entries = live(book, now)
    if is_spent(entries, token) or len(entries) < MAX_SPENT_TOKENS:
        return True
    counts = Counter(e.subject for e in entries)
    # The account's own entries fold into one that covers this token too; or another account's
    # several entries fold into one, making room.
    return counts[token.subject] > 0 or max(counts.values(), default=0) > 1


def spend(book: list[SpentToken], token: TokenFacts, *, now: datetime) -> bool:
    """Remember ``token`` in ``book`` (mutated in place); False when there is no room (see
    :func:`has_room`), which leaves the book as it was but for forgetting expired entries."""
    book[:] = live(book, now)
    if is_spent(book, token):
        return True
    mine = sum(1 for e in book if e.subject == token.subject)
    if mine >= MAX_PER_SUBJECT:
        _fold(book, token.subject, also=token.until)
        return True
    if len(book) >= MAX_SPENT_TOKENS:
        counts = Counter(e.subject for e in book)
        if mine:
            _fold(book, token.subject, also=token.until)
            return True
        heaviest, most = counts.most_common(1)[0]
        if most < 2:
            return False
        _fold(book, heaviest)
    book.append(token.entry())
    return True


def _fold(book: list[SpentToken], subject: str | None, *, also: datetime | None = None) -> None:
    """Replace ``subject``'s entries with one that spends every token of it expiring by the
    latest of them (and by ``also``)."""
    theirs = [e for e in book if e.subject == subject]
    until = max([e.until for e in theirs] + ([also] if also is not None else []))
    book[:] = [e for e in book if e.subject != subject]
    book.append(SpentToken(digest="", until=until, subject=subject, kind="subject"))


__all__ = [
    "MAX_PER_SUBJECT",
    "MAX_SPENT_TOKENS",
    "MAX_TOKEN_LIFE",
    "TokenFacts",
    "has_room",
    "is_spent",
    "live",
    "spend",
]

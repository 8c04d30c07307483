"""The spent-token book (``workflows.tokens``): bounded, and no one account fills it for others.

Pure: no server. The attacks through a real conversation are in test_trust_boundary.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporal_agent_interrupts.workflows.state import (
    SpentToken,
)
from temporal_agent_interrupts.workflows.tokens import (
    MAX_OFFERED,
    MAX_PER_SUBJECT,
    MAX_SPENT_TOKENS,
    TokenFacts,
    has_room,
    is_spent,
    spend,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def token(subject: str, n: int, *, minutes: int = 10, issued: int | None = None) -> TokenFacts:
    """The ``n``-th token of ``subject``: issued ``n`` minutes in (or at ``issued``), valid
    ``minutes`` after that."""
    at = NOW + timedelta(minutes=n if issued is None else issued)
    return TokenFacts(
        digest=f"{subject}-{n}", subject=subject, until=at + timedelta(minutes=minutes), issued=at
    )


def test_a_token_is_spent_once_and_forgotten_once_it_could_no_longer_be_accepted():
    book: list[SpentToken] = []
    first = token("alice", 0)
    assert spend(book, first, now=NOW) and spend(book, first, now=NOW)
    assert len(book) == 1 and is_spent(book, first)
    assert not is_spent(book, token("alice", 1))
    spend(book, token("bob", 0), now=NOW + timedelta(hours=1))  # alice's has expired
    assert [e.subject for e in book] == ["bob"]


def test_one_accounts_many_tokens_fold_into_one_entry_that_still_spends_them_all():
    book: list[SpentToken] = []
    mine = [token("mallory", n) for n in range(MAX_PER_SUBJECT * 3)]
    for t in mine:
        assert spend(book, t, now=NOW)
    spend(book, token("alice", 0), now=NOW)
    # However many it uses or offers, the account holds its share of the book and no more.
    assert sum(1 for e in book if e.subject == "mallory") <= MAX_PER_SUBJECT
    assert any(e.kind == "subject" for e in book)
    assert all(is_spent(book, t) for t in mine)  # none of them answers again
    # A token the account is issued afterwards (it expires later) still answers.
    assert not is_spent(book, token("mallory", len(mine) + 5))
    assert not is_spent(book, token("alice", 1))


def test_a_full_book_folds_its_heaviest_account_and_refuses_only_past_distinct_accounts():
    book: list[SpentToken] = []
    spend(book, token("heavy", 0), now=NOW)
    spend(book, token("heavy", 1), now=NOW)
    for n in range(MAX_SPENT_TOKENS - 2):
        spend(book, token(f"user{n}", 0), now=NOW)
    assert len(book) == MAX_SPENT_TOKENS
    newcomer = token("approver", 0)
    assert has_room(book, newcomer, now=NOW)
    assert spend(book, newcomer, now=NOW)  # "heavy" folded to make room
    assert is_spent(book, token("heavy", 0)) and is_spent(book, token("heavy", 1))
    assert len(book) == MAX_SPENT_TOKENS
    # Every entry is now a different account's: one more account cannot be kept...
    stranger = token("stranger", 0)
    assert not has_room(book, stranger, now=NOW) and not spend(book, stranger, now=NOW)
    # ...but an account already there always can (its entries fold).
    assert has_room(book, token("user7", 3), now=NOW)
    assert spend(book, token("user7", 3), now=NOW)
    assert len(book) == MAX_SPENT_TOKENS


def test_a_fold_spends_tokens_as_old_as_those_folded_and_never_a_fresh_one():
    """An approver's tokens harvested from other conversations' histories (issued earlier,
    some valid for a day) and offered here fold the approver's entries: only tokens issued no
    later than they were. A fresh short-lived token, which expires before them, still answers."""
    book: list[SpentToken] = []
    harvested = [token("cfo", n, minutes=24 * 60 - n) for n in range(MAX_PER_SUBJECT + 1)]
    for t in harvested:
        spend(book, t, now=NOW)
    assert any(e.kind == "subject" for e in book)
    assert all(is_spent(book, t) for t in harvested)
    fresh = token("cfo", 0, minutes=5, issued=MAX_PER_SUBJECT + 1)
    assert fresh.until < max(t.until for t in harvested)
    assert not is_spent(book, fresh)


def test_refused_tokens_of_unnamed_accounts_never_take_an_approvers_room():
    book: list[SpentToken] = []
    for n in range(MAX_SPENT_TOKENS + MAX_OFFERED):  # a sign-up flood at the issuer
        assert spend(book, token(f"signup{n}", 0), now=NOW, offered=True)
    assert len(book) == MAX_OFFERED  # the oldest forgotten
    assert is_spent(book, token(f"signup{MAX_SPENT_TOKENS + MAX_OFFERED - 1}", 0))
    approver = token("cfo", 0)
    assert has_room(book, approver, now=NOW) and spend(book, approver, now=NOW)

"""The conversation's standing rules between answers: grants ended (revoked, or at their
``until`` on a durable timer) and paused calls decided again by a new policy set.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`Rules` is a part of the turn state machine (:mod:`workflows.turn`), handed what it needs
as callables; the workflow's ``revoke_grant`` and ``review_policy`` updates and its grant timer
act through it. What a grant or a policy decision means for one call is decided in
:mod:`workflows.grants` and :mod:`workflows.decisions`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows import events, grants
from temporal_agent_interrupts.workflows.activity_io import PolicyResult
from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.state import CallState, ConversationState, TurnState
from temporal_agent_interrupts.workflows.types import (
    DEADLINE_IDENTITY,
    ErrorKind,
    PolicyEffect,
    PolicyReviewResult,
    TurnEvent,
)


class Rules:
    """Grants and policy reviews, over the conversation's state.

    Args:
        state: The conversation's state.
        emit: Records a turn event (the audit log and the stream take it).
        publish: Writes the operator view.
        book: The interrupt book of a turn.
        decide: The policy set's decisions on calls (one sealed activity), or why there are none.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        emit: Callable[[TurnEvent], object],
        publish: Callable[[], None],
        book: Callable[[TurnState], InterruptBook],
        decide: Callable[[list[CallState]], Awaitable[PolicyResult | str]],
    ) -> None:
        self.s = state
        self._emit = emit
        self._publish = publish
        self._book = book
        self._decide = decide

    def revoke_grant(self, grant_id: str, *, identity: str | None, reason: str) -> bool:
        """End grant ``grant_id`` now, recorded; False if none in force has that id. A call it
        let through that has not run yet asks again when its turn reaches it (``stale``)."""
        grant = grants.revoke(self.s, grant_id)
        if grant is None:
            return False
        self._emit(
            events.grant_ended(
                grant, via="update", identity=identity, decision="revoked", reason=reason
            )
        )
        self._publish()
        return True

    def expire_grants(self) -> None:
        """End, recorded, every grant whose ``until`` has come."""
        ended = grants.expire(self.s, workflow.now())
        for grant in ended:
            self._emit(
                events.grant_ended(
                    grant, via="deadline", identity=DEADLINE_IDENTITY, decision="expired"
                )
            )
        if ended:
            self._publish()

    async def grant_timer(self) -> None:
        """End each grant when its ``until`` comes, recorded, whatever the conversation is doing
        (the grants query, the memo and the UI stop showing it then). A call a grant would let
        through after its ``until`` is never let through, timer or not (workflows.grants). No
        timer while no grant has an ``until``."""
        while True:
            seen = (self.s.grants_made, len(self.s.grants))

            def changed(seen: tuple[int, int] = seen) -> bool:
                return (self.s.grants_made, len(self.s.grants)) != seen

            due = grants.next_expiry(self.s.grants)
            if due is None:
                await workflow.wait_condition(changed)
                continue
            delay = due - workflow.now()
            if delay.total_seconds() > 0:
                with contextlib.suppress(TimeoutError):  # its time came: expire it next
                    await workflow.wait_condition(changed, timeout=delay)
                continue
            self.expire_grants()

    async def review_policy(self) -> PolicyReviewResult:
        """Decide the paused calls again with the policy set the worker holds now (one
        policy activity): those now allowed run, those now denied end refused, asks show
        their new approvers (see ``Decisions.redecide``). Nothing changes when the set is
        the one that decided them."""
        turn = self.s.turn
        if turn is None:
            return PolicyReviewResult()
        asked = [c for c in self._book(turn).pending() if c.policy is not None]
        if not asked:
            return PolicyReviewResult()
        result = await self._decide(asked)
        if isinstance(result, str):
            raise ApplicationError(
                f"the policy could not decide again: {result}",
                {"code": "conflict"},
                type=ErrorKind.REVIEW_REJECTED,
                non_retryable=True,
            )
        changed: dict[str, PolicyEffect] = {}
        book = self._book(turn) if self.s.turn is turn else None
        for call in asked:
            decided = result.decisions.get(call.ref)
            # Answered while the policy decided: the answer stands.
            if book is None or decided is None or call.status != "pending":
                continue
            if book.decisions.redecide(call, decided):
                changed[call.ref] = decided.effect
        if changed:
            self._publish()
        return PolicyReviewResult(policy_hash=result.policy_hash, changed=changed)

"""The turn's senders: who a message said sent it, decided once the agent's definition is known.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`Senders` is a part of the turn state machine (:mod:`workflows.turn`), handed what it
needs as callables. A message's claim (its identity, its token) is settled when the turn starts
if the definition is known; on a conversation's first message it waits on the turn until the
model's result brings the definition, and is decided before any call of the turn is. A token
that reached history and was never accepted is spent, so nobody can copy it out and answer with
it (see :mod:`workflows.requesters` for the rules).
"""

from __future__ import annotations

from temporalio import workflow

from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.requesters import RequesterError, settle
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
    RequesterClaim,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import ErrorInfo, ErrorKind, Requester, Status

CLAIMS_LEFT_KEPT = 8
"""Undecided senders' claims kept until the agent's definition comes (see ``drop``): a
conversation whose model never answered takes few messages before it is closed or fixed."""


class Senders:
    """Settles each turn's sender.

    Args:
        state: The conversation's state.
    """

    def __init__(self, state: ConversationState) -> None:
        self.s = state

    def spend_refused(self, token: str | None) -> None:
        """Spend the identity token of an answer or a message refused after it reached
        history, if it could answer something here (see ``InterruptBook.spend_refused``)."""
        book = InterruptBook([], spec=self.s.spec, spent=self.s.spent_tokens)
        book.spend_refused(token, now=workflow.now())

    def at_start(
        self, sender: RequesterClaim | None
    ) -> tuple[Requester | None, RequesterClaim | None]:
        """The requester of a turn starting now, settled when the definition is known (its
        token spent), and else the claim to keep on the turn until it is.

        Raises:
            RequesterError: the sender is refused; nothing has changed.
        """
        if sender is None or self.s.spec is None:
            return None, sender
        requester = settle(
            sender,
            spec=self.s.spec,
            spent=self.s.spent_tokens,
            now=workflow.now(),
            chat=workflow.info().workflow_id,
        )
        return requester, None

    def settle(self, turn: TurnState) -> ErrorInfo | None:
        """Decide the sender a message said it had before the agent's definition was known (a
        conversation's first message), now that the model's result has brought it and before
        any call of the turn is decided; the refusal, if it is refused. Spends first the tokens
        of earlier turns that could not be decided (see :meth:`drop`)."""
        left, self.s.claims_left = self.s.claims_left, []
        for earlier in left:
            self.spend_refused(earlier.token)
        claim = turn.claim
        if claim is None:
            return None
        turn.claim = None  # decided once, whatever the verdict; its token is not kept
        try:
            turn.requester = settle(
                claim,
                spec=self.s.spec,
                spent=self.s.spent_tokens,
                now=workflow.now(),
                chat=workflow.info().workflow_id,
            )
        except RequesterError as e:
            # Its token is in history now: one that could answer here must not, later.
            self.spend_refused(claim.token)
            return ErrorInfo(
                status=Status.PERMISSION_DENIED,
                message=f"the message was refused: {e.reason}",
                kind=ErrorKind.SEND_REJECTED,
            )
        return None

    def drop(self, turn: TurnState) -> None:
        """A turn that ends with its sender undecided (before the definition came): its token,
        in history now, must answer nothing later. Spent at once when the definition is known,
        else when it comes (``claims_left``)."""
        claim, turn.claim = turn.claim, None
        if claim is None or claim.token is None:
            return
        if self.s.spec is not None:
            self.spend_refused(claim.token)
            return
        self.s.claims_left = [*self.s.claims_left, claim][-CLAIMS_LEFT_KEPT:]

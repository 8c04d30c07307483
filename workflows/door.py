"""The conversation's door: the checks every request passes, by signal or by update.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`Door` says what is wrong with a message or an answer before anything acts on it: a
closed conversation, a message sent again, an answer for a ref that is not pending or that a
sub-agent settled, an answer meant for a sub-agent (passed on to it: ``workflows.subagents``).
The signal and update handlers (:mod:`workflows.signals`, :mod:`workflows.updates`) both ask it,
so a request is refused the same way whichever way it came. :class:`Handling` is what this
run's handlers have under way, which the run reads before it continues as new.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio import workflow

from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.ids import message_digest
from temporal_agent_interrupts.workflows.interrupts import ResumeError
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    RUN,
    Refused,
    check_json,
    check_label,
    check_size,
    check_text,
)
from temporal_agent_interrupts.workflows.payloads import RawResume, payload_json, rejected
from temporal_agent_interrupts.workflows.requesters import check as check_requester
from temporal_agent_interrupts.workflows.requesters import check_shape
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
    RequesterClaim,
    SentMessage,
)
from temporal_agent_interrupts.workflows.subagents import SubAgentChild, refused_early
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    CancelInput,
    ErrorKind,
    JsonObject,
    ResumeInput,
    SendInput,
)


@dataclass
class Handling:
    """What this run's handlers have under way; the run continues as new only without it."""

    # This conversation's own update handlers at work (the stream's followers, which wait as
    # long as they like, are counted apart: see AgentWorkflow._can_now).
    busy: int = 0
    # Answers by signal on their way to a sub-agent (see Signals._forward).
    forwarding: int = 0
    # Signals this run has taken (each counts against the server's per-run limit).
    signals: int = 0
    # Updates that wait without doing anything (await_turn), and a close under way: each
    # kind has a share of Temporal's ten in-flight updates (see RUN.turn_waiters).
    turn_waiters: int = 0
    closing: bool = False
    # The turn being driven, while one is (a cancel stops it).
    turn_task: asyncio.Task[str] | None = None


class Door:
    """The checks shared by the signal and update paths.

    Args:
        state: The conversation's state.
        machine: The turn state machine (what the turn waits on).
        handling: What this run's handlers have under way.
    """

    def __init__(
        self, state: ConversationState, *, machine: TurnMachine, handling: Handling
    ) -> None:
        self.s = state
        self._m = machine
        self._h = handling

    def repeat(self, input: SendInput) -> SentMessage | None:
        """The latest turn's message, when ``input`` (checked) is that message sent again."""
        if input.message_id is None:
            return None
        return next((m for m in self.s.sent if m.message_id == input.message_id), None)

    def send_problem(
        self, text: str, *, agent: str | None, size: int, message_id: str | None = None
    ) -> str | None:
        if self.s.closed:
            return "this conversation is closed"
        if agent and agent != self.s.agent:
            return (
                f"chat {workflow.info().workflow_id!r} belongs to agent {self.s.agent!r}, "
                f"not {agent!r}"
            )
        if not text.strip():
            return "the message is empty"
        try:
            check_size(size, limit=DOOR.send, what="message")
            # As stored: a control character takes six bytes of JSON.
            check_text(text, what="the message", limit=DOOR.send)
        except Refused as e:
            return e.reason
        if message_id is not None:
            if not message_id:
                return "the message id is empty: give one, or none"
            try:
                check_label(message_id, what="the message id", limit=DOOR.message_id)
            except Refused as e:
                return e.reason
            sent = next((m for m in self.s.sent if m.message_id == message_id), None)
            if sent is not None:
                if sent.digest != message_digest(text):
                    return (
                        f"message id {message_id!r} was used for another message (turn "
                        f"{sent.turn}); give each message an id of its own"
                    )
                if sent.turn != self.s.turns:
                    return (
                        f"message {message_id!r} was sent already and started turn "
                        f"{sent.turn}; the conversation has moved on to turn {self.s.turns}"
                    )
                return None  # a repeat of the latest turn's message: the handler joins it
        if self.s.turn is not None:
            # A call waiting on a sub-agent that waits on someone is a pause too, not a busy
            # turn: answering is what lets it go on.
            if self._m.paused() or self._m.children.delegated():
                return (
                    "the conversation is paused on interrupts; answer them with resume or "
                    f"withdraw them with cancel first. Pending: {self.pending_listing()}"
                )
            return "a turn is already running; wait for it to finish"
        return None

    def sender(self, input: SendInput) -> RequesterClaim | None:
        """What a message (not a repeat) says of its sender, checked as far as can be now: by
        the agent's rules once its definition is known (``workflows.requesters``), else its
        shape only (the turn decides the rest when the definition arrives). Spends nothing.

        Raises:
            RequesterError: refused, and why (``forbidden`` for a token or identity the
                agent's rules do not accept).
        """
        if input.identity is None and input.identity_token is None:
            return None
        claim = RequesterClaim(
            identity=input.identity,
            token=input.identity_token,
            message=message_digest(input.text),
        )
        if self.s.spec is None:
            check_shape(claim.identity, claim.token)
        else:
            check_requester(
                claim,
                spec=self.s.spec,
                spent=self.s.spent_tokens,
                now=workflow.now(),
                chat=workflow.info().workflow_id,
            )
        return claim

    def pending_listing(self) -> str:
        """What the turn waits on, for a refusal: its own calls, then its sub-agents' (with
        the chat each waits in, where it can also be answered)."""
        turn = self.s.turn
        own = [f"{c.name} (ref {c.ref})" for c in self._m.book(turn).pending()] if turn else []
        theirs = [
            f"{r.name} (ref {r.ref}, in sub-agent {r.chat_id})"
            for r in self._m.children.delegated()
        ]
        return ", ".join([*own, *theirs])

    def check_resume(self, payload: RawResume) -> ResumeInput:
        turn = self.s.turn
        named = answered_refs(payload) if self._m.children else None
        settled = self._m.children.settled_in_child(named[1]) if named is not None else None
        if settled is not None:
            # (An answer naming a sub-agent's pending call went to it: see delegated_target.)
            ref, child_id = settled
            raise ResumeError(
                f"ref {ref!r} is not pending: sub-agent {child_id} has settled it already "
                f"(answered, or withdrawn). Pending: {self.pending_listing() or 'nothing'}",
                code="conflict",
            )
        if turn is not None and not self._m.paused() and self._m.children.delegated():
            raise ResumeError(
                "this conversation waits only on its sub-agents' interrupts, and this answer "
                "names others (one resume answers the calls of one sub-agent). Pending: "
                f"{self.pending_listing()}",
                code="not_found",
            )
        if turn is None or not self._m.paused():
            raise ResumeError(
                "nothing is paused: this conversation has no pending interrupts", code="conflict"
            )
        size = len(payload.payload.data)
        try:
            # Size first: an oversized payload is refused before it is even parsed.
            check_size(size, limit=DOOR.resume, what="resume")
        except Refused as e:
            raise ResumeError(e.reason) from None
        return self._m.book(turn).validate(
            payload_json(payload), room=self._m.room(turn), now=workflow.now()
        )

    def delegated_target(
        self, payload: RawResume, *, early: bool = True
    ) -> tuple[str, SubAgentChild, JsonObject] | None:
        """The sub-agent a resume is for, when every entry names one of its interrupts (as
        this conversation shows them); None: it is for this conversation's own (or nothing),
        and is checked here as any resume is.

        Args:
            early: Refuse here what the sub-agent would surely refuse (``refused_early``).
                False once the payload is in this conversation's history: its token then must
                reach the sub-agent, which spends it whatever its verdict.
        """
        if not self._m.children:
            return None
        named = answered_refs(payload)
        if named is None:
            return None
        body, refs = named
        found = self._m.children.delegated_to(refs)
        if found is None:
            return None
        # What passes on must be writable as the forwarding activity's input: a lone surrogate
        # or nesting past what pydantic-core serializes reads as JSON here, and scheduling the
        # activity with it failed the workflow task (the whole conversation, for an update).
        check_json(body, what="resume")
        why = refused_early(body, found[1].requests) if early else None
        if why is not None:
            # Surely refused there: refused here, before it costs the caller's history an
            # activity (a validator's refusal leaves none; a signal's is recorded as any).
            # Of the kind the child's would be: an approver it does not name is forbidden.
            reason, code = why
            raise ResumeError(
                f"refused by sub-agent {found[0]}'s rules, as it shows them: {reason}", code=code
            )
        return found[0], found[1], body

    def check_cancel_input(self, input: CancelInput) -> None:
        try:
            # The reason is copied into every withdrawn call's response, so it stays short.
            check_text(input.reason, what="reason", limit=DOOR.reason)
            if input.identity is not None:
                check_label(input.identity, what="identity", limit=DOOR.identity)
        except Refused as e:
            raise rejected(ErrorKind.CANCEL_REJECTED, e.reason) from None

    def check_turn_waiters(self) -> None:
        if self._h.turn_waiters >= RUN.turn_waiters:
            # Each waits as long as the turn runs, holding one of Temporal's ten in-flight
            # updates: the rest stay free for send, resume and cancel.
            raise rejected(
                ErrorKind.TOO_MANY_WAITING,
                f"{RUN.turn_waiters} callers already wait for this turn to stop; wait for "
                "them, or follow the turn on its stream (Chat.events)",
            )


def passed_on() -> bool:
    """Whether the update being validated is an answer a caller passed on (its id)."""
    info = workflow.current_update_info()
    return info is not None and info.id.startswith(config.SUB_AGENT_ANSWER_UPDATE_PREFIX)


def answered_refs(payload: RawResume) -> tuple[JsonObject, set[str]] | None:
    """A resume's body and the refs its entries name, read leniently (None: not of that shape,
    or too large; the full check says what is wrong with it)."""
    try:
        check_size(len(payload.payload.data), limit=DOOR.resume, what="resume")
        body = payload_json(payload)
    except Refused:
        return None
    if not isinstance(body, dict):
        return None
    entries = [*(body.get("respond") or []), *(body.get("restart") or [])]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return None
    refs = [e.get("ref") for e in entries]
    if not all(isinstance(r, str) for r in refs):
        return None
    return body, {r for r in refs if isinstance(r, str)}

"""Paused calls announced on the agent's channels (Slack, email), once each, and their end.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

An agent names its channels (``Agent(notify=["approvals"])``); the worker maps each name to a
channel it configured, with its secrets (``activities.notify``). :class:`Announcer` schedules
one ``notify`` activity per channel when a call pauses, and one more per channel that posted
when the call ends (answered through any door, expired, withdrawn or cancelled), so a message
can show its final state.

- Never awaited by the turn: an answer, a deadline or a cancel takes effect at once whatever a
  channel is doing, and a channel that is down is retried (``config.NOTIFY_RETRY``) while the
  turn goes on. What came of each is a ``notified`` record in the audit trail, delivered or not.
- Once per pause: ``CallState.notified`` names the pause it announced (its ``since``), is
  carried across continue-as-new, and the run waits for notifications in flight before it
  continues (``busy``). A retried attempt carries the same ``key``, by which a channel finds
  what an earlier attempt posted.
- Through the sealed runner (``workflows.executing``): a result completed by id is refused, so
  nobody chooses which message the channel later updates.
- Never a reason for a run not to continue as new: once the run is due to (its history past
  the bounds the conversation continues at), new pauses wait for the next run, which announces
  them (``CallState.notified`` says what is still owed), so answers that re-pause a call over
  and over (edits) cannot keep a notification in flight until Temporal terminates the run.
- Each post's end is the end of the pause it announced (its ``Notified``), by the record that
  ended that very pause: a later pause of the call, a revoke of the grant its approval made or
  anything else recorded against the ref afterwards never says how an earlier message ended.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.activity_io import (
    NotifyInput,
    NotifyKind,
    NotifyResult,
    SettledAs,
)
from temporal_agent_interrupts.workflows.executing import ActivityRunner, Unsealed
from temporal_agent_interrupts.workflows.history import trim_answers
from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    RUN,
    cut_stored,
    json_size,
    shrink,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    Notified,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    InterruptRequest,
)

NOTIFY_INPUT_BYTES = 16 * 1024
"""The most one notification's call takes (its input and metadata become placeholders past it:
a channel shows the summary, and links to the whole)."""

MAX_POSTED = 16
"""What a call keeps of each channel's posts (the announcement and its reminders) to update
when it ends: reminders are few, and the state carries it across continue-as-new."""

_SETTLED_BY_DECISION: dict[str, SettledAs] = {
    "approved": "approved",
    "denied": "denied",
    "answered": "answered",
    "edited": "edited",
    "expired": "expired",
    "cancelled": "cancelled",
}


class Announcer:
    """Announces a turn's paused calls on the agent's channels, and their end.

    Args:
        state: The conversation's state.
        runner: The turn's sealed activity runner.
        book: The interrupt book of a turn.
        publish: Writes the operator view (the audit trail's new records go out with it).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        runner: ActivityRunner,
        book: Callable[[TurnState], InterruptBook],
        publish: Callable[[], None],
    ) -> None:
        self.s = state
        self._runner = runner
        self._book = book
        self._publish = publish
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> bool:
        """Whether a notification is under way (the run waits for it before continuing as
        new, or what it posted would not be kept)."""
        return bool(self._tasks)

    def _channels(self) -> list[str]:
        return list(self.s.spec.notify) if self.s.spec else []

    def due(self, turn: TurnState) -> bool:
        """Whether a call of ``turn`` is to be announced (not while the run is due to continue
        as new: the next run does it), or its end posted."""
        if not self._channels():
            return False
        later = _run_due()
        return any((self._announce(c) and not later) or self._settle(c) for c in turn.calls)

    def send(self, turn: TurnState, *, cancelled: bool = False) -> None:
        """Schedule what is due: each newly paused call to every channel, and each announced
        call that is no longer paused to the channels that posted it.

        Args:
            cancelled: The turn is being cancelled: its paused calls are withdrawn.
        """
        channels = self._channels()
        if not channels:
            return
        # A run due to continue as new announces nothing more: the next run announces what is
        # still paused (the state carries what is owed), as one in flight would hold this run.
        # Ends are posted still: one per message posted, and the turn may not wait again.
        later = not cancelled and _run_due()
        book = self._book(turn)
        for call in turn.calls:
            if cancelled and call.notified is not None and not call.notified.settled:
                self._send_settled(book, call, "cancelled", None, False)
            elif self._announce(call) and not later:
                told = call.notified
                if told is not None and not told.settled and told.posted:
                    # Paused again before its last pause's end was posted: post that first.
                    settled, by, verified = self._how_it_ended(call, told)
                    self._send_settled(book, call, settled, by, verified)
                call.notified = Notified(since=call.since)
                request = book.request_for(call)
                for channel in channels:
                    self._start(book, call, channel, "paused", request)
            elif self._settle(call):
                assert call.notified is not None
                settled, by, verified = self._how_it_ended(call, call.notified)
                self._send_settled(book, call, settled, by, verified)

    def remind(
        self,
        turn: TurnState,
        call: CallState,
        channels: tuple[str, ...],
        why: Literal["reminder", "escalation"],
    ) -> None:
        """Post a reminder or an escalation of ``call`` to ``channels`` (each a new message,
        named by its own key, updated with the others when the call ends)."""
        book = self._book(turn)
        if call.notified is None or call.notified.since != call.since:
            call.notified = Notified(since=call.since)
        request = book.request_for(call)
        number = call.reminded + (1 if call.escalated else 0)
        for channel in channels:
            self._start(book, call, channel, why, request, number=number)

    # -- what is due ---------------------------------------------------------------------------

    @staticmethod
    def _announce(call: CallState) -> bool:
        return call.status == "pending" and (
            call.notified is None or call.notified.since != call.since
        )

    @staticmethod
    def _settle(call: CallState) -> bool:
        told = call.notified
        if told is None or told.settled:
            return False
        return call.status != "pending" or told.since != call.since

    def _how_it_ended(self, call: CallState, told: Notified) -> tuple[SettledAs, str | None, bool]:
        """How the pause of ``call`` that ``told`` announced ended, by the audit trail's record
        of the answer that ended it: of that pause (its ``since``), and a decision that ends
        one (not a revoke of the grant it made, a vote, a stale approval)."""
        for record in reversed(self.s.answers):
            if record.ref != call.ref or record.kind in (
                "notified",
                "vote",
                "forwarded",
                "sub_agent",
            ):
                continue
            if record.decision is not None and record.decision not in _SETTLED_BY_DECISION:
                continue
            if record.since is not None and told.since is not None and record.since != told.since:
                continue
            decision = record.decision or "answered"
            settled = _SETTLED_BY_DECISION.get(decision, "answered")
            person = record.via in ("update", "signal")
            return settled, record.identity if person else None, record.identity_verified
        return "withdrawn", None, False

    def _send_settled(
        self,
        book: InterruptBook,
        call: CallState,
        settled: SettledAs,
        by: str | None,
        verified: bool,
    ) -> None:
        told = call.notified
        assert told is not None
        told.settled = True
        request = book.request_for(call)
        for channel, refs in told.posted.items():
            for posted in refs:
                self._start(
                    book,
                    call,
                    channel,
                    "settled",
                    request,
                    settled=settled,
                    by=by,
                    verified=verified,
                    posted=posted,
                )

    # -- the activity ----------------------------------------------------------------------------

    def _start(
        self,
        book: InterruptBook,
        call: CallState,
        channel: str,
        kind: NotifyKind,
        request: InterruptRequest,
        *,
        settled: SettledAs | None = None,
        by: str | None = None,
        verified: bool = False,
        posted: str | None = None,
        number: int = 0,
    ) -> None:
        chat_id = workflow.info().workflow_id
        since = call.since.isoformat() if call.since else ""
        # The pause names the announcement and its end; a reminder is a message of its own.
        named = f"{chat_id}\0{call.ref}\0{since}"
        if kind in ("reminder", "escalation"):
            named += f"\0{kind}\0{number}"
        key = hashlib.sha256(named.encode()).hexdigest()[:32]
        arg = NotifyInput(
            agent=self.s.agent,
            chat_id=chat_id,
            channel=channel,
            kind=kind,
            key=key,
            interrupt=_within(request, NOTIFY_INPUT_BYTES),
            settled=settled,
            settled_by=by,
            settled_by_verified=verified,
            posted=posted,
        )
        # The pause this posts about: what it posts is kept there, and updated when that very
        # pause ends (the call may have paused again by the time the channel answers).
        told = call.notified
        task = asyncio.create_task(self._run(book, call, arg, told))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, book: InterruptBook, call: CallState, arg: NotifyInput, told: Notified | None
    ) -> None:
        reason: str | None = None
        result: NotifyResult | None = None
        try:
            result = await self._runner.execute(
                config.NOTIFY_ACTIVITY,
                arg,
                result_type=NotifyResult,
                start_to_close_timeout=config.NOTIFY_START_TO_CLOSE,
                retry_policy=config.NOTIFY_RETRY,
                summary=f"notify {arg.channel} of {call.name}",
            )
        except Unsealed as e:
            reason = e.reason
        except ActivityError as e:
            # The channel's own words (sealed: a worker's), for whoever reads the trail.
            cause = e.cause
            said = cause.message if isinstance(cause, ApplicationError) else ""
            generic = self._runner.error(e, what=f"the {arg.channel!r} channel").message
            reason = f"{generic}: {said}" if said and said not in generic else generic
        self._record(call, arg, delivered=reason is None, reason=reason)
        if result is not None and result.posted and arg.kind != "settled" and told is not None:
            posted = cut_stored(result.posted, DOOR.ref)
            refs = told.posted.setdefault(arg.channel, [])
            if len(refs) < MAX_POSTED:
                refs.append(posted)
            if told.settled or told is not call.notified:
                # That pause ended while this was on its way (the call may be paused again
                # since, under another Notified): post its end on it now.
                told.settled = True
                settled, by, verified = self._how_it_ended(call, told)
                self._start(
                    book,
                    call,
                    arg.channel,
                    "settled",
                    book.request_for(call),
                    settled=settled,
                    by=by,
                    verified=verified,
                    posted=posted,
                )
        self._publish()

    def _record(
        self, call: CallState, arg: NotifyInput, *, delivered: bool, reason: str | None
    ) -> None:
        record = AnswerRecord(
            at=workflow.now(),
            ref=call.ref,
            name=call.name,
            kind="notified",
            via="notify",
            channel=arg.channel,
            delivered=delivered,
            metadata={"notice": arg.kind, **({"settled": arg.settled} if arg.settled else {})},
            verdict_reason=cut_stored(reason[: DOOR.reason_chars], 600) if reason else None,
        )
        self.s.answers.append(record)
        self.s.audit_outbox.append(record)
        self.s.answers_dropped += trim_answers(self.s.answers)


def _within(request: InterruptRequest, budget: int) -> InterruptRequest:
    """``request`` within ``budget`` bytes: its input and metadata become placeholders past it
    (``limits.shrink``), then its votes are cut."""
    if json_size(request) <= budget:
        return request
    data = request.model_dump(mode="json")
    shrink(data, budget)
    while data.get("votes") and json_size(data) > budget:
        data["votes"].pop()
    return InterruptRequest.model_validate(data)


def _run_due() -> bool:
    """Whether this run is due to continue as new by its history (as the conversation decides
    it, ``workflows.conversation``): past Temporal's suggestion or the conversation's own
    bounds."""
    info = workflow.info()
    length = info.get_current_history_length()
    if info.get_current_history_size() >= RUN.can_bytes or length >= RUN.can_events:
        return True
    return (
        info.is_continue_as_new_suggested() and length >= config.MIN_EVENTS_BEFORE_CONTINUE_AS_NEW
    )

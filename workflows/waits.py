"""The turn's wait for answers: until every interrupt is answered, the turn is cancelled, or
the run should continue as new; and the deadline policies carried out as their times come.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`AnswerWait` is the one place a paused turn sleeps on its own interrupts. A deadline
policy's reminder or escalation runs a notifying tool (never awaited: an answer that arrives
meanwhile takes effect at once); a deadline answers with its default, or cancels the turn.
A sub-agent's wait is its call's (``workflows.subagents``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError

from temporal_agent_interrupts.workflows import config, events
from temporal_agent_interrupts.workflows.activity_io import (
    ToolInput,
)
from temporal_agent_interrupts.workflows.ids import idempotency_key
from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.limits import json_size, shrink
from temporal_agent_interrupts.workflows.notifications import Announcer
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.types import (
    DEADLINE_IDENTITY,
    CancelInput,
    JsonObject,
    Notice,
)


class AnswerWait:
    """Waits for a paused turn's answers, carrying out its deadline policies meanwhile.

    Args:
        state: The conversation's state.
        book: The interrupt book of a turn.
        room: Bytes the turn can still take (an expired call's default must fit).
        can_now: Whether the run should continue as new now.
        cancelling: Whether a cancellation of the turn has been asked for.
        cancel_by_deadline: Asks for the turn's cancellation, as a deadline's policy.
        publish: Writes the operator view.
        announcer: Announces paused calls on the agent's channels, and their end.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        book: Callable[[TurnState], InterruptBook],
        room: Callable[[TurnState], int],
        can_now: Callable[[], bool],
        cancelling: Callable[[], bool],
        cancel_by_deadline: Callable[[CancelInput], None],
        publish: Callable[[], None],
        announcer: Announcer,
    ) -> None:
        self.s = state
        self._book = book
        self._room = room
        self._can_now = can_now
        self._cancelling = cancelling
        self._cancel_by_deadline = cancel_by_deadline
        self._publish = publish
        self._announcer = announcer
        # Notifying tools under way (reminders, escalations); best effort, never awaited.
        self._notifying: set[asyncio.Task[None]] = set()

    @property
    def notifying(self) -> bool:
        """Whether a notifying tool is under way (the run waits for it before continuing as
        new, or its notice would be lost)."""
        return bool(self._notifying) or self._announcer.busy

    async def wait(self, turn: TurnState) -> Literal["answered", "cancel", "continue_as_new"]:
        book = self._book(turn)
        announcer = self._announcer
        while True:
            if self._cancelling():
                announcer.send(turn, cancelled=True)
                return "cancel"
            # Each newly paused call announced, each one answered meanwhile posted as ended.
            announcer.send(turn)
            if book.all_answered():
                return "answered"
            if self._can_now():
                return "continue_as_new"
            deadline = book.next_deadline()
            timeout = None
            if deadline is not None:
                timeout = max(deadline - workflow.now(), timedelta(0))
            try:
                await workflow.wait_condition(
                    lambda: (
                        self._cancelling()
                        or book.all_answered()
                        or self._can_now()
                        or announcer.due(turn)
                    ),
                    timeout=timeout,
                    timeout_summary="interrupt deadline" if timeout is not None else None,
                )
            except TimeoutError:
                assert deadline is not None  # only a timeout raises it
                await self._deadline_passed(turn, fired=deadline)

    async def _deadline_passed(self, turn: TurnState, *, fired: datetime) -> None:
        """Carry out the deadline policies whose time has come: reminders and escalations
        notify someone (a tool run each); a deadline answers with its default or cancels
        the turn.

        Args:
            fired: The time the timer that fired was set for. It has passed, whatever
                ``workflow.now()`` says: the SDK can hand the activation that delivers the
                timer the time of the run's previous task (a worker that cached the run
                answering a query, taking the task after it timed out on a dead worker's
                sticky queue), while a replay sees the later time. Deciding by the clock
                alone found nothing due there and started the timer again, and the run no
                longer replayed (tests/test_soak_findings.py).
        """
        book = self._book(turn)
        now = max(workflow.now(), fired)
        notices: list[tuple[CallState, str, Literal["reminder", "escalation"]]] = []
        cancelled: list[CallState] = []
        posts: list[tuple[CallState, tuple[str, ...], Literal["reminder", "escalation"]]] = []
        for due in book.due(now):
            if due.action in ("remind", "escalate"):
                why: Literal["reminder", "escalation"] = (
                    "reminder" if due.action == "remind" else "escalation"
                )
                if due.action == "remind":
                    book.remind(due.call)
                else:
                    book.escalate(due.call)
                if due.notify:
                    notices.append((due.call, due.notify, why))
                if due.channels:
                    posts.append((due.call, due.channels, why))
            elif due.action == "cancel":
                cancelled.append(due.call)
        if not cancelled:
            # (A deadline that cancels the turn withdraws every call: none expires first.)
            book.expire(now, room=lambda: self._room(turn))
        if cancelled and not self._cancelling():
            names = ", ".join(f"{c.name} (ref {c.ref})" for c in cancelled)
            self._cancel_by_deadline(
                CancelInput(
                    reason=f"nobody answered {names} before the deadline",
                    identity=DEADLINE_IDENTITY,
                )
            )
        self._publish()
        for call, channels, why in posts:
            self._announcer.remind(turn, call, channels, why)
        # One deadline often falls due for every call of a message at once (the agent-wide
        # one): their notices share one budget, so the task that schedules them stays small.
        budget = max(MIN_NOTICE_BYTES, NOTICES_BUDGET // max(len(notices), 1))
        for call, tool, why in notices:
            # Not awaited: an answer that arrives while a notifying tool runs takes effect at
            # once (a slow pager must not hold up the turn it is about).
            task = asyncio.create_task(self._notify(call, tool, why, budget=budget))
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)

    async def _notify(
        self,
        call: CallState,
        tool: str,
        why: Literal["reminder", "escalation"],
        *,
        budget: int,
    ) -> None:
        """Run a notifying tool about a paused call; a failure is logged, never the turn's.

        Args:
            budget: The most the notice may take: its input and metadata become placeholders
                past it, then its votes are cut (the notifier can ask ``pending`` for all).
        """
        book = self._book(self.s.turn) if self.s.turn else None
        request = book.request_for(call) if book else events.to_request(call)
        notice = Notice(
            chat_id=workflow.info().workflow_id,
            agent=self.s.agent,
            reason=why,
            interrupt=request,
        )
        chat_id = notice.chat_id
        # One key per notice of one pause (a call that pauses again gets new ones).
        number = call.reminded + (1 if call.escalated else 0)
        since = call.since.isoformat() if call.since else ""
        try:
            await workflow.execute_activity(
                config.TOOL_ACTIVITY,
                ToolInput(
                    agent=self.s.agent,
                    chat_id=chat_id,
                    tool=tool,
                    ref=call.ref,
                    args=notice_within(notice, budget),
                    idempotency_key=idempotency_key(chat_id, f"{call.ref}\0{since}\0{why}", number),
                ),
                # Read as raw bytes and thrown away: a notice's result decides nothing, and a
                # result completed by id that does not decode as a ToolResult would otherwise
                # fail every workflow task of the chat (issue 44's review, item A).
                result_type=RawValue,
                start_to_close_timeout=config.TOOL_START_TO_CLOSE,
                heartbeat_timeout=config.TOOL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_attempts=config.TOOL_RETRY_ATTEMPTS),
                summary=f"{why} {tool} for {call.name}",
            )
        except ActivityError as e:
            workflow.logger.warning(
                "the %s tool %r about %s (ref %s) failed: %s", why, tool, call.name, call.ref, e
            )


NOTICES_BUDGET = 256 * 1024
"""What the notices of one pass of the deadline policies take together."""


MIN_NOTICE_BYTES = 2 * 1024
"""What each notice may take however many fall due at once (128 calls: 256 KiB)."""


def notice_within(notice: Notice, budget: int) -> JsonObject:
    """A notice as its tool's input, within ``budget`` bytes."""
    data = notice.model_dump(mode="json")
    shrink(data, budget)
    votes = data["interrupt"]["votes"]
    while votes and json_size(data) > budget:
        votes.pop()
    return data

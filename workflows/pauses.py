"""When a turn that waits on sub-agents reports its pause: once the pause is whole.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A sub-agent's interrupts are read from its child as they change, one child at a time, while
the other calls of the message may still be under way (tools running, sub-agents starting or
at work). Reporting at the first child's read gave a caller one child's interrupts and the
rest a moment later; so a child's change makes a report *owed*, and :class:`PauseReports`
makes it once every call of the message has paused or ended (:func:`pause_settled`). The one
exception is a run that continues as new with a report owed, or is due to (its signals spent,
its history long): it reports the pause as it stands, marked ``partial``
(``TurnResult.partial``), since the next run reports a child's pause only when it changes, and
a caller waiting for the report would otherwise hold the run from continuing while the
children's reports, signals past the run's allowance, no longer reach it.

Determinism: runs in the workflow; a report is a stop of the turn (commands: the operator
view's writes), made in the workflow task where the pause became whole, which replay repeats.
A pause that is whole at a child's read (one sub-agent, nothing else under way) is reported
there and then, as before this part existed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow

from temporal_agent_interrupts.workflows.state import CallState, ConversationState, TurnState
from temporal_agent_interrupts.workflows.subagents import SubAgentChild


def pause_settled(calls: list[CallState], running: dict[str, SubAgentChild]) -> bool:
    """Whether a turn's pause is whole: some call of its message is under way, and each one
    that is runs a sub-agent whose child waits on someone (as last read, with no answer on its
    way to it or taken since that read). No tool call runs,
    no sub-agent call is starting or at work: whatever else the message does has paused or
    ended, so a report now lists every interrupt it will have until something is answered.

    False once no call is under way: the turn's own step reports that pause (TurnMachine.drive).
    """
    waiting = {
        child.ref
        for child in running.values()
        if child.requests and not child.answering and child.reread is None
    }
    under_way = [c.ref for c in calls if c.status == "ready"]
    return bool(under_way) and all(ref in waiting for ref in under_way)


class PauseReports:
    """Reports a turn's pause on its sub-agents once it is whole.

    Args:
        state: The conversation's state.
        running: The sub-agents the turn's calls are running, by chat id.
        stop: Stops the turn ``interrupted`` with what it waits on now; ``partial`` marks a
            pause reported before it was whole.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        running: Callable[[], dict[str, SubAgentChild]],
        stop: Callable[[bool], None],
        due: Callable[[], bool] = lambda: False,
    ) -> None:
        self.s = state
        self._running = running
        self._stop = stop
        self._due = due
        # A child's change not reported yet, and the task that reports it once it is whole.
        self.owed = False
        self._task: asyncio.Task[None] | None = None
        # The turn whose pause was reported as it stood because the run was due to continue as
        # new (once a turn: a run kept from continuing, its state too large, reports no more).
        self._reported_due: TurnState | None = None

    def whole(self) -> bool:
        """Whether the turn's pause can be reported whole now (:func:`pause_settled`)."""
        turn = self.s.turn
        return turn is not None and pause_settled(turn.calls, self._running())

    def child_changed(self) -> None:
        """A sub-agent's interrupts changed (and are not none): report the pause now if it is
        whole, else once it is."""
        turn = self.s.turn
        if turn is None:
            return
        if self.whole():
            self.owed = False
            self._stop(False)
        elif not self.owed:
            self.owed = True
            self._task = asyncio.create_task(self._when_whole(turn))

    async def _when_whole(self, turn: TurnState) -> None:
        """Make the owed report once the pause is whole; drop it when the turn's own step
        takes over (no call is under way), the turn ends, or the report was made otherwise."""
        await workflow.wait_condition(
            lambda: (
                not self.owed
                or self.s.turn is not turn
                or not any(c.status == "ready" for c in turn.calls)
                or self.whole()
                or (self._due() and self._reported_due is not turn)
            )
        )
        if self.owed and self.s.turn is turn:
            if self.whole():
                self._stop(False)
            elif (
                self._due()
                and self._reported_due is not turn
                and any(c.status == "ready" for c in turn.calls)
            ):
                # The run is due to continue as new, and what holds it may be the very caller
                # waiting for this report (an update keeps the run from continuing); once its
                # signals are spent, the children's reports no longer reach it either. Reported
                # as it stands, partial; the next run reads every child again at once.
                self._reported_due = turn
                self._stop(True)
        self.owed = False

    def before_continuing(self, *, newly_paused: bool) -> None:
        """The run continues as new with sub-agent calls under way: report now what the next
        run will not (this step's own new pauses, or an owed report), partial unless whole."""
        if newly_paused or self.owed:
            self.owed = False
            self._stop(not self.whole())

"""What the conversation's queries answer: its pending interrupts, its status, its messages,
its rejections. Each result is cut to fit Temporal's payload limit, with stated placeholders.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

``AgentWorkflow`` declares the queries (Temporal finds them on the workflow class) and
:class:`Queries` builds their results. A query issues no command and is never replayed, so
nothing here may change the state.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow

from temporal_agent_interrupts.workflows import operator_view
from temporal_agent_interrupts.workflows.history import page, page_back
from temporal_agent_interrupts.workflows.limits import OUT, json_size
from temporal_agent_interrupts.workflows.payloads import fit
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
)
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    HistoryInput,
    HistoryResult,
    MCPListingResult,
    MessagesInput,
    MessagesResult,
    PendingResult,
    RejectionsResult,
    StatusResult,
)


class Queries:
    """Builds the results of the conversation's queries.

    Args:
        state: The conversation's state.
        machine: The turn state machine (what the turn waits on).
        carried: The state continue-as-new would carry now (None: it could not).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        machine: TurnMachine,
        carried: Callable[[], ConversationState | None],
    ) -> None:
        self.s = state
        self._m = machine
        self._carry = carried
        # The carried size the status query worked out, and for which state (_carried_size).
        self._carried: tuple[tuple[int, ...], int | None] | None = None

    def pending(self) -> PendingResult:
        turn = self.s.turn
        own = self._m.book(turn).requests() if turn else []
        result = PendingResult(interrupts=[*own, *self._m.children.delegated()])
        return fit(result, OUT.query)

    def status(self) -> StatusResult:
        # Front ends ask this while they wait (the web app's streams, agentctl's waits), so it
        # builds only what it returns: the status itself, not the whole operator view (memo
        # entries, the details panel), and the carried size once per state (see _carried_size).
        turn = self.s.turn
        book = self._m.book(turn) if turn else None
        delegated = self._m.children.delegated()
        paused = bool(book.pending()) if book else False
        result = StatusResult(
            chat_id=workflow.info().workflow_id,
            agent=self.s.agent,
            status=operator_view.status(self.s, paused=paused or bool(delegated)),
            turns=self.s.turns,
            model=self.s.spec.model if self.s.spec else None,
            pending=[*(book.requests() if book else []), *delegated],
            last_turn=self._m.last_result(),
            rejections=self.s.rejections_total,
            carried_bytes=self._carried_size(),
            recent_answers=self.s.answers[-10:],
        )
        return fit(result, OUT.query)

    def _carried_size(self) -> int | None:
        """What continue-as-new would carry now, in bytes; None if it could not.

        Working it out serializes the whole conversation (up to 1.6 MiB, and a fit over that:
        tens of milliseconds), so it is worked out once per state a query can see. The state
        changes only in an activation, and each activation that can change it comes with a
        workflow task of its own, so history's length (with the counts that grow within a task)
        tells one state from the next. Kept for this query alone: nothing the workflow decides
        reads it, so replay, which runs no queries, is the same with or without it.
        """
        info = workflow.info()
        key = (
            info.get_current_history_length(),
            len(self.s.messages),
            self.s.turns,
            len(self.s.answers),
            self.s.rejections_total,
            self.s.events_total,
        )
        if self._carried is None or self._carried[0] != key:
            carried = self._carry()
            self._carried = (key, json_size(carried) if carried is not None else None)
        return self._carried[1]

    def history(self, input: HistoryInput | None = None) -> HistoryResult:
        """The conversation's messages, newest last, and its audit log of answers.

        One result holds the newest messages that fit; ``start`` above 0 says older ones
        remain, read with ``HistoryInput(end=start)`` (``Chat.history()`` reads them all).
        """
        messages = self.s.messages
        end = len(messages) if input is None or input.end is None else input.end
        end = max(0, min(end, len(messages)))
        answers = self.s.answers
        room = OUT.query - json_size(answers) - 1024
        start = page_back(messages, end=end, budget=room)
        result = HistoryResult(
            messages=messages[start:end],
            answers=answers,
            dropped_messages=self.s.dropped_messages,
            start=start,
            answers_dropped=self.s.answers_dropped,
        )
        return fit(result, OUT.query)

    def messages(self, input: MessagesInput) -> MessagesResult:
        """A slice of the conversation; the model activity asks when it lacks the start.

        A slice too large for one result stops early, with ``next`` where to go on.
        """
        messages = self.s.messages
        end = len(messages) if input.end is None else max(0, min(input.end, len(messages)))
        start = max(0, min(input.start, end))
        stop = page(messages, start=start, end=end, budget=OUT.query - 1024)
        return MessagesResult(messages=messages[start:stop], next=stop if stop < end else None)

    def mcp_listing(self) -> MCPListingResult:
        """The MCP servers' tools in the recorded definition; the model activity asks when two
        of the agent's servers may offer one name (activities.mcp, ``merged_spec``). Within
        the definition's own budget (64 KiB), so within a query result."""
        spec = self.s.spec
        return MCPListingResult(tools=[t for t in spec.tools if t.mcp] if spec else [])

    def rejections(self) -> RejectionsResult:
        result = RejectionsResult(rejections=self.s.rejections, total=self.s.rejections_total)
        return fit(result, OUT.query)

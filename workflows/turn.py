"""The turn state machine: a user message in, model calls and tool runs, pauses, a result out.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

One :class:`TurnMachine` per workflow run drives the conversation's current turn over
:class:`~workflows.state.ConversationState`, which is plain data. Every change it makes to the
turn is a transition that emits a turn event (:mod:`workflows.events`): the model's text, its
tool requests, interrupts, answers, tool responses and the turn's end. The interrupt book
(:mod:`workflows.interrupts`) makes every change to a call's status; this module decides when.
What the events add up to is projected elsewhere: the audit log (:mod:`workflows.audit`) here,
as each is emitted; the operator view (:mod:`workflows.operator_view`) when the workflow
publishes.

Determinism: this module runs in the workflow. Ids come from the model's call ids or
``workflow.uuid4()``, time from ``workflow.now()``; the agent's definition is data from the model
activity's result, so replay never runs the agent's current code. A failed turn (model, tool,
bad input) ends ``failed`` and keeps what happened in the conversation; the workflow itself never
fails because of one.

The machine holds the turn's phases and its stop points; each step is a part of its own, handed
callables rather than the machine: the model step (:mod:`workflows.model_step`), the tool step
(:mod:`workflows.tool_step`), the sub-agents its calls run (:mod:`workflows.subagents`), and
the wait for answers and deadlines (:mod:`workflows.waits`). Every activity goes through one
runner that takes only sealed results (:mod:`workflows.executing`). A new kind of wait is a part
beside these: the machine's ``drive`` awaits it in the phase it belongs to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from temporalio import workflow

from temporal_agent_interrupts.workflows import audit, events, presentation, receipts
from temporal_agent_interrupts.workflows.executing import ActivityRunner, TurnFailed
from temporal_agent_interrupts.workflows.history import Digests
from temporal_agent_interrupts.workflows.ids import answer_chats, message_digest
from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.limits import DOOR, HELD, json_size, stored_size
from temporal_agent_interrupts.workflows.model_step import ModelStep
from temporal_agent_interrupts.workflows.notifications import Announcer
from temporal_agent_interrupts.workflows.pauses import PauseReports
from temporal_agent_interrupts.workflows.rules import Rules
from temporal_agent_interrupts.workflows.senders import Senders
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    RequesterClaim,
    SentMessage,
    TurnState,
)
from temporal_agent_interrupts.workflows.subagents import Children, SubAgentCalls
from temporal_agent_interrupts.workflows.telemetry import Telemetry
from temporal_agent_interrupts.workflows.tool_step import ToolStep
from temporal_agent_interrupts.workflows.types import (
    CancelInput,
    ErrorInfo,
    ErrorKind,
    FinishReason,
    FunctionCall,
    FunctionResponse,
    Message,
    Part,
    ResumeInput,
    TurnEvent,
    TurnResult,
)
from temporal_agent_interrupts.workflows.waits import AnswerWait

Outcome = Literal["done", "continue_as_new"]


class TurnMachine:
    """Drives the conversation's turns; the workflow's handlers start, answer and cancel them.

    Args:
        state: The conversation's state (shared with the workflow, mutated in place).
        publish: Writes the operator view; called at the fixed points where a run writes it
            (each write is a command in history, so the points may not move).
        can_now: Whether the run should continue as new now (a paused turn waits there).
        publish_event: Puts a turn event on the conversation's stream; returns its offset.
        signals_taken: How many signals this run has taken (a streaming call's share of the
            run's publish signals is what is left of ``RUN.stream_signals``).
        due: Whether the run is due to continue as new, whatever holds it now (a pause owed is
            then reported as it stands: see workflows.pauses).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        publish: Callable[[], None],
        can_now: Callable[[], bool],
        publish_event: Callable[[TurnEvent], int] | None = None,
        signals_taken: Callable[[], int] = lambda: 0,
        due: Callable[[], bool] = lambda: False,
    ) -> None:
        self.s = state
        self._publish_event = publish_event
        self._publish = publish
        self._can_now = can_now
        # Refs in the order they were made (the newest are carried by continue-as-new).
        self.ref_order: list[str] = list(state.refs)
        self.refs: set[str] = set(state.refs)
        # Derived from the messages (not state): recomputed after continue-as-new or replay.
        self.digests = Digests()
        # Every time a turn reaches a stop point (paused or ended) this goes up by one; update
        # handlers wait on it to return the turn's result.
        self.stops = 0
        # A cancellation asked for and not yet carried out, and how it came: a caller's, or a
        # deadline whose policy cancels the turn.
        self.cancel: CancelInput | None = None
        self._cancel_via: Literal["cancel", "deadline"] = "cancel"
        # Set when this run's state proved too large to carry over; cleared when a turn ends.
        self.can_blocked = False
        # Metrics and spans: they issue no commands, so they may be called anywhere.
        self.telemetry = Telemetry(state.agent, spec=lambda: self.s.spec)
        # The current turn's interrupt book (see book()).
        self._book: InterruptBook | None = None
        # The parts, each handed what it needs of the machine.
        self.runner = ActivityRunner(state, cancelling=lambda: self.cancel is not None)
        self.children = Children(
            state,
            runner=self.runner,
            book=self.book,
            publish=publish,
            report_pause=lambda: self.pauses.child_changed(),
        )
        self.pauses = PauseReports(
            state, running=lambda: self.children.running, stop=self._report_pause, due=due
        )
        self.sub_agents = SubAgentCalls(
            state,
            book=self.book,
            children=self.children,
            publish=publish,
            room=self.room,
            may_detach=self._may_detach,
        )
        self.tools = ToolStep(
            state, book=self.book, runner=self.runner, room=self.room, sub_agents=self.sub_agents
        )
        self.model = ModelStep(
            state,
            runner=self.runner,
            digests=self.digests,
            telemetry=self.telemetry,
            emit=self.emit,
            append=self._append,
            room=self.room,
            signals_taken=signals_taken,
        )
        self.senders = Senders(state)
        self.rules = Rules(
            state, emit=self.emit, publish=publish, book=self.book, decide=self.tools.decide
        )
        self.waits = AnswerWait(
            state,
            book=self.book,
            room=self.room,
            can_now=can_now,
            cancelling=lambda: self.cancel is not None,
            cancel_by_deadline=self._cancel_by_deadline,
            publish=publish,
            announcer=Announcer(state, runner=self.runner, book=self.book, publish=publish),
        )

    # ------------------------------------------------------------------------------------------
    # Events

    def emit(self, event: TurnEvent, *, publish: bool = True) -> TurnEvent:
        """Record a turn event, publish it on the stream and fold it into the projections.

        Args:
            publish: False when the event is on the stream already (text the model activity
                published as it arrived).
        """
        result = event.result
        turn = self.s.turn
        number = result.turn if result is not None else turn.turn if turn else self.s.turns
        at = workflow.now()
        offset = None
        if publish and self._publish_event is not None:
            offset = self._publish_event(event.model_copy(update={"turn": number, "at": at}))
        elif self.s.events_total:
            offset = self.s.events_total - 1  # the last item on the stream, published already
        stamped = events.record(self.s, event, turn=number, at=at, offset=offset)
        audit.apply(self.s, stamped, receipts=receipts.issuer_for(self.s))
        self.telemetry.event(stamped, turn.calls if turn else [])
        return stamped

    @property
    def notifying(self) -> bool:
        """Whether a notifying tool is under way (see ``AnswerWait.notifying``)."""
        return self.waits.notifying

    def book(self, turn: TurnState) -> InterruptBook:
        """The interrupt book of ``turn``'s calls, built once per turn.

        Rebuilt only when the calls are another list: a new turn, or a turn a new run took
        over. The book reads the spec and the spent tokens from the state whenever it asks
        (a model result may bring a new spec mid-turn), and ``self.refs`` is one set for the
        run, so nothing else it holds can go stale.
        """
        book = self._book
        if book is None or book.calls is not turn.calls:
            book = InterruptBook.of_turn(
                self.s, turn.calls, known_refs=self.refs, emit=self.emit, chats=answer_chats
            )
            self._book = book
        return book

    # ------------------------------------------------------------------------------------------
    # What the handlers ask

    def paused(self) -> bool:
        """Whether the turn waits on a human: some interrupt has no answer yet."""
        turn = self.s.turn
        return turn is not None and turn.phase == "tools" and bool(self.book(turn).pending())

    def waiting_on_human(self) -> bool:
        """Paused, and nothing else to do: no sibling call is still running.

        Interrupts are recorded before their siblings run, so a turn can have pending
        interrupts while tools are still at work; its pause is only reported after them.
        """
        turn = self.s.turn
        if turn is None:
            return self.paused()
        return self.paused() and not any(c.status == "ready" for c in turn.calls)

    def room(self, turn: TurnState) -> int:
        """Bytes the turn can still take (see :data:`~workflows.limits.HELD.turn`)."""
        return HELD.turn - self._turn_held(turn)

    def _new_ref(self, call_id: str | None) -> str:
        return new_ref(self.s, self.refs, self.ref_order, call_id)

    def paused_result(self, turn: TurnState) -> TurnResult:
        return TurnResult(
            turn=turn.turn,
            finish_reason=FinishReason.INTERRUPTED,
            text=turn_text(self.s, turn),
            interrupts=[*self.book(turn).requests(), *self.children.delegated()],
        )

    def last_result(self) -> TurnResult | None:
        """The latest turn's result: while paused, the pause as it stands now (a new run does
        not carry it, see workflows.history.carry)."""
        turn = self.s.turn
        if turn is not None and (self.paused() or self.children.delegated()):
            return self.paused_result(turn)
        return self.s.last_turn

    def last_result_paused(self) -> bool:
        """Whether the turn waits on someone: for its own interrupts or a sub-agent's."""
        return self.s.turn is not None and (self.paused() or bool(self.children.delegated()))

    # ------------------------------------------------------------------------------------------
    # What the handlers do

    def start(
        self,
        text: str,
        *,
        stream: bool = False,
        message_id: str | None = None,
        sender: RequesterClaim | None = None,
    ) -> None:
        """Begin a turn with a user message (checked by the handler).

        Args:
            stream: Publish the model's text as it arrives, not only once each reply is in.
            message_id: The caller's id for the message, remembered so that the same message
                sent again joins this turn instead of starting another.
            sender: What the message says of its sender (``Door.sender``, checked): settled
                now, its token spent, when the agent's definition is known; else kept on the
                turn until it is (see ``Senders.settle``).

        Raises:
            RequesterError: the sender is refused (only where the handler's check and this
                one disagree); nothing has changed.
        """
        requester, sender = self.senders.at_start(sender)
        self.s.turns += 1
        if message_id is not None:
            sent = [m for m in self.s.sent if m.message_id != message_id]
            sent.append(
                SentMessage(message_id=message_id, turn=self.s.turns, digest=message_digest(text))
            )
            self.s.sent = sent[-HELD.sent_kept :]
        self.s.turn = TurnState(
            turn=self.s.turns,
            started_at=workflow.now(),
            base_len=len(self.s.messages),
            held=0,
            stream=stream,
            requester=requester,
            claim=sender,
        )
        self._append(Message(role="user", parts=[Part(text=text)]))
        self.telemetry.turn_started(self.s.turns)
        self._publish()

    def resume(self, resume: ResumeInput, *, via: Literal["update", "signal"]) -> TurnState:
        """Apply a validated resume to the paused turn."""
        turn = self.s.turn
        assert turn is not None
        self.book(turn).resume(resume, via=via, now=workflow.now())
        turn.stream = turn.stream or resume.stream
        self._publish()
        return turn

    def streaming(self) -> bool:
        """Whether a model call is under way whose text is published as it arrives."""
        turn = self.s.turn
        return turn is not None and turn.stream and turn.phase == "model"

    def streaming_key(self) -> str | None:
        """The publisher id the streaming model call publishes with (None: none streams)."""
        return self.model.stream_key if self.streaming() else None

    # ------------------------------------------------------------------------------------------
    # The machine

    async def drive(self) -> Outcome:
        turn = self.s.turn
        assert turn is not None
        try:
            while True:
                if self.cancel is not None:
                    # A cancel that arrived before this step could be interrupted (e.g. in the
                    # same workflow task as the send that started the turn).
                    self.finish_cancelled()
                    return "done"
                if turn.phase == "model":
                    if turn.model_calls >= (self.s.spec.max_turns if self.s.spec else 10):
                        self._finish(FinishReason.MAX_TURNS)
                        return "done"
                    message = await self.model.call(turn)
                    refused = self.senders.settle(turn)
                    if refused is not None:
                        self._refuse_sender(turn, refused)
                        return "done"
                    calls = [p.function_call for p in message.parts if p.function_call]
                    if not calls:
                        self._finish(FinishReason.STOP)
                        return "done"
                    made = calls_of(self.s, turn, message, calls, ref=self._new_ref)
                    self.book(turn).request(made)
                    turn.phase = "tools"
                newly_paused = await self.tools.run_ready(turn)
                if self.sub_agents.detached:
                    # Sub-agent calls wait on their children from the next run.
                    self.sub_agents.detached = False
                    self.pauses.before_continuing(newly_paused=newly_paused)
                    return "continue_as_new"
                book = self.book(turn)
                error = book.first_error()
                if error is not None:
                    self._fail(error)
                    return "done"
                if book.waiting():
                    # Report a pause once. A turn that resumes here after continue-as-new was
                    # already reported paused, and an answer may have reached the new run
                    # before this line: a second report would answer that resume with a stale
                    # "interrupted".
                    if newly_paused:
                        self._stop(self.paused_result(turn))
                    outcome = await self.waits.wait(turn)
                    if outcome == "cancel":
                        self.finish_cancelled()
                        return "done"
                    if outcome == "continue_as_new":
                        return outcome
                    book.settle()
                    continue
                self._append(tool_message(turn))
                book.clear()
                turn.phase = "model"
        except TurnFailed as f:
            self._fail(f.error)
            return "done"
        except asyncio.CancelledError:
            if self.cancel is None:
                raise  # the workflow is being cancelled, not just this turn
            self.finish_cancelled()
            return "done"

    def _refuse_sender(self, turn: TurnState, error: ErrorInfo) -> None:
        """End a turn whose sender was refused once the definition came: nothing ran but the
        model call, so the message and the model's reply are taken back (as a send refused at
        the door leaves the conversation) and the turn fails with why."""
        turn.model_calls = 0  # as if the model was never asked: _fail takes the message back
        self._fail(error)

    def _append(self, message: Message) -> None:
        """Add a message to the conversation, counting it against the turn's budget."""
        self.s.messages.append(message)
        turn = self.s.turn
        if turn is not None:
            turn.held += json_size(message)

    def _turn_held(self, turn: TurnState) -> int:
        """Bytes the turn holds in the conversation's state: its messages and its calls."""
        return turn.held + self.book(turn).held_bytes()

    def _report_pause(self, partial: bool) -> None:
        """The turn stops ``interrupted`` with what it waits on now (see workflows.pauses)."""
        turn = self.s.turn
        if turn is not None:
            result = self.paused_result(turn)
            self._stop(result.model_copy(update={"partial": True}) if partial else result)

    def _may_detach(self) -> bool:
        """Whether the sub-agent calls under way may be left for the next run: the run should
        continue as new, and no tool call, handler or cancellation is under way."""
        return self.tools.running == 0 and self.cancel is None and self._can_now()

    def _cancel_by_deadline(self, cancel: CancelInput) -> None:
        self.cancel = cancel
        self._cancel_via = "deadline"

    # ------------------------------------------------------------------------------------------
    # Stop points: the turn pauses or ends, and whoever waits on it gets its result.

    def _stop(self, result: TurnResult) -> None:
        self.s.last_turn = result
        if self.s.turn is None:
            # Whatever ended the turn, a cancellation asked for it is spent; and the state
            # may be trimmable now that the turn is over.
            self.cancel = None
            self.can_blocked = False
            self._book = None  # the next turn has a book of its own
        self.stops += 1
        self.emit(events.turn_end(result))
        self._publish()

    def _finish(self, reason: FinishReason) -> None:
        turn = self.s.turn
        assert turn is not None
        result = TurnResult(turn=turn.turn, finish_reason=reason, text=turn_text(self.s, turn))
        self.s.turn = None
        self._stop(result)

    def _fail(self, error: ErrorInfo) -> None:
        turn = self.s.turn
        assert turn is not None
        self.senders.drop(turn)
        if turn.phase == "tools":
            # Interrupts raised and never to be answered: counted as withdrawn.
            now = workflow.now()
            self.telemetry.withdrawn(self.book(turn).pending(), now=now, by_deadline=False)
        if turn.model_calls > 0:
            # What happened stays in the conversation, so the next turn's model knows that
            # an approved side effect took place: every call of the step keeps a response,
            # its failure or that it never ran.
            if turn.phase == "tools" and turn.calls:
                self.book(turn).abandon(error)
                self._append(tool_message(turn))
        else:
            # Nothing happened yet (the model never answered): the conversation is left as it
            # was before the turn.
            self.cut_messages(turn.base_len)
        self.s.turn = None
        workflow.logger.warning("turn %d failed: %s %s", turn.turn, error.status, error.message)
        # A conversation whose agent no worker has ever hosted for it (its definition comes
        # with the first model call a hosting worker answers) is a misspelled or unknown agent:
        # it is closed, the reason in this turn's result (the workflow's result too), rather
        # than left running for messages no worker can answer. One that already had a hosting
        # worker keeps going: another worker on the queue lacks the agent, and the turn failed.
        closes = error.kind == ErrorKind.UNKNOWN_AGENT and self.s.spec is None
        if closes:
            self.s.closed = True
        self._stop(
            TurnResult(
                turn=turn.turn, finish_reason=FinishReason.FAILED, error=error, closed=closes
            )
        )

    def finish_cancelled(self) -> None:
        """End the turn ``cancelled``: what is pending is withdrawn, every call keeps a
        response."""
        turn = self.s.turn
        assert turn is not None
        reason = self.cancel.reason if self.cancel else ""
        identity = self.cancel.identity if self.cancel else None
        via, self._cancel_via = self._cancel_via, "cancel"
        self.cancel = None
        self.senders.drop(turn)
        if turn.phase == "tools" and turn.calls:
            # Before the calls are withdrawn: only those still pending were waiting on a human.
            pending = self.book(turn).pending()
            self.telemetry.withdrawn(pending, now=workflow.now(), by_deadline=via == "deadline")
            self.book(turn).cancel(reason, identity=identity, via=via)
            # Every call keeps a response, so the history stays valid for the model.
            self._append(tool_message(turn))
        elif turn.model_calls == 0:
            # Cancelled before the model answered: as if the message was never sent.
            self.cut_messages(turn.base_len)
        # Otherwise tools already ran this turn: their results stay in the conversation, so
        # the model knows on the next turn what was done.
        result = TurnResult(
            turn=turn.turn, finish_reason=FinishReason.CANCELLED, text=turn_text(self.s, turn)
        )
        self.s.turn = None
        self._stop(result)

    def cut_messages(self, n: int) -> None:
        del self.s.messages[n:]
        self.digests.cut(n)
        self.s.model_seen = min(self.s.model_seen, n)


def tool_message(turn: TurnState) -> Message:
    """One tool message holding every response of the message's calls, in call order."""
    return Message(
        role="user",
        parts=[
            Part(
                function_response=FunctionResponse(
                    id=c.call_id, name=c.name, response=c.output or {}
                )
            )
            for c in turn.calls
        ],
    )


def turn_text(state: ConversationState, turn: TurnState) -> str:
    """The turn's last text from the model (a paused or ended turn's result shows it)."""
    for m in reversed(state.messages[turn.base_len :]):
        if m.role == "model":
            return m.text()
    return ""


def calls_of(
    state: ConversationState,
    turn: TurnState,
    message: Message,
    calls: list[FunctionCall],
    *,
    ref: Callable[[str | None], str],
) -> list[CallState]:
    """The calls of the model's ``message``, new: each with its ref, the turn's requester and
    what a person is shown of the turn it came from (the user's message, the model's words)."""
    asked = state.messages[turn.base_len] if turn.base_len < len(state.messages) else None
    context = presentation.context(asked, message)
    return [
        CallState(
            ref=ref(fc.id),
            call_id=fc.id,
            name=fc.name,
            args=fc.args,
            requester=turn.requester,
            context=context,
        )
        for fc in calls
    ]


def new_ref(state: ConversationState, refs: set[str], order: list[str], call_id: str | None) -> str:
    """A new call's ref: the model's call id when it is usable, else a fresh uuid; added to
    the run's ``refs`` and ``order``."""
    usable = bool(call_id) and call_id not in refs
    if usable:
        # Once old refs are forgotten, a model's id might repeat one; a fresh uuid cannot.
        small = stored_size(call_id or "") <= DOOR.ref
        usable = small and not state.refs_forgotten
    ref = call_id if usable and call_id else str(workflow.uuid4())
    refs.add(ref)
    order.append(ref)
    return ref

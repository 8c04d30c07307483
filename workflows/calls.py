"""The call lifecycle: every change of a tool call's status, each with the turn event it emits.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A call's life (statuses of :class:`~workflows.state.CallState`):

- the model asks for it: :meth:`~Lifecycle.request` makes it ``ready`` (``tool_request``);
- it pauses for a human: :meth:`~Lifecycle.pause`, ``pending`` (``interrupt``); its deadline
  policy may remind someone or extend the deadline (:meth:`~Lifecycle.remind`,
  :meth:`~Lifecycle.escalate`, ``interrupt`` again);
- it runs and finishes: :meth:`~Lifecycle.complete`, ``done`` (``tool_response``), or
  :meth:`~Lifecycle.fail`, ``failed`` (its response comes when the turn gives up on it);
- a human answers: :meth:`~Lifecycle.respond` or :meth:`~Lifecycle.restart`, ``answered``
  (:meth:`~Lifecycle.answered` emits ``answer``); its deadline passes:
  :meth:`~Lifecycle.expire`, ``answered`` (``answer``);
- the answers take effect once none is pending: :meth:`~Lifecycle.settle` (a respond is the
  call's output, ``done`` and ``tool_response``; a restart makes it ``ready`` to run again);
- the turn ends early: :meth:`~Lifecycle.cancel` (``answer`` and ``tool_response`` for each
  withdrawn call) or :meth:`~Lifecycle.abandon` when it failed (``tool_response``).

What is decided about a call (whether an answer is accepted, who may give it, when its
deadline falls) is decided elsewhere (:mod:`workflows.answers`, :mod:`workflows.governance`,
:mod:`workflows.deadlines`); this module only carries it out.

Pure code over the step's ``CallState`` list (which lives in workflow state and is mutated in
place): no Temporal imports, unit-tested in milliseconds, identical on replay.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from temporal_agent_interrupts.workflows import events
from temporal_agent_interrupts.workflows.input_rounds import answered_form
from temporal_agent_interrupts.workflows.limits import json_size
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.types import (
    DEADLINE_IDENTITY,
    AnswerKind,
    AnswerVia,
    Decision,
    ErrorInfo,
    InterruptRequest,
    InterruptSource,
    JsonObject,
    TurnEvent,
    timed_out_output,
)

Emit = Callable[[TurnEvent], object]


class Lifecycle:
    """The transitions of one model message's tool calls.

    Args:
        calls: The step's calls (workflow state, mutated in place).
        emit: Takes each transition's turn event.
        show: A paused call as the caller sees it (who may answer it and how), for the
            ``interrupt`` event; None: as :func:`workflows.events.to_request` shows it.
    """

    def __init__(
        self,
        calls: list[CallState],
        *,
        emit: Emit | None = None,
        show: Callable[[CallState], InterruptRequest] | None = None,
    ) -> None:
        self.calls = calls
        self.emit: Emit = emit or (lambda _: None)
        self._show = show or (lambda call: events.to_request(call))

    # -- views ------------------------------------------------------------------------------

    def pending(self) -> list[CallState]:
        """Calls waiting for an answer, in call order."""
        return [c for c in self.calls if c.status == "pending"]

    def waiting(self) -> list[CallState]:
        """Calls paused, answered or not (the turn continues when none is still pending)."""
        return [c for c in self.calls if c.status in ("pending", "answered")]

    def all_answered(self) -> bool:
        return not self.pending()

    def held_bytes(self) -> int:
        """Bytes the calls hold in the conversation's state (what counts against the turn)."""
        return sum(json_size(c) for c in self.calls)

    def first_error(self) -> ErrorInfo | None:
        for c in self.calls:
            if c.status == "failed" and c.error is not None:
                return c.error
        return None

    # -- the model asks, the tools run ------------------------------------------------------

    def request(self, calls: list[CallState]) -> None:
        """The model's calls of one message become this step's calls (each ``ready``)."""
        self.calls[:] = calls
        for call in calls:
            self.emit(events.tool_request(call))

    def clear(self) -> None:
        """The step is over: its responses went to the model in one message."""
        self.calls.clear()

    def complete(self, call: CallState, output: JsonObject) -> None:
        """The call has its response: it ran, or the runtime answered for it (unknown tool,
        invalid arguments, an approved run cut short)."""
        call.status = "done"
        call.output = output
        call.input_round = None
        self.emit(events.tool_response(call))

    def fail(self, call: CallState, error: ErrorInfo, *, uncertain: bool) -> None:
        """The call's run failed; the turn fails with it, and :meth:`abandon` or :meth:`cancel`
        gives it its response.

        Args:
            uncertain: The failure does not say whether the tool took effect.
        """
        call.status = "failed"
        call.error = error
        call.uncertain = uncertain

    def start_run(self, call: CallState) -> int:
        """Count one more run of the call (one per approval); returns its number."""
        call.runs += 1
        return call.runs

    # -- a pause and its deadline -----------------------------------------------------------

    def pause(
        self,
        call: CallState,
        *,
        source: InterruptSource,
        metadata: JsonObject,
        now: datetime,
        deadline: datetime | None,
    ) -> None:
        """Mark a call pending, with its deadline (see :func:`workflows.deadlines.deadline`)."""
        call.status = "pending"
        call.source = source
        call.metadata = metadata
        call.since = now
        call.deadline = deadline
        # A pause starts afresh: votes and an edit's gate verdict belong to the last one.
        call.votes = []
        call.edit_passes_gate = None
        if source != "input":
            # A server's input request pauses a run already approved: its retry carries that
            # approval (asked once, before the first round), for the worker's gate to check.
            call.granted = None
            call.approved_by = None
            call.approved_digest = None
        call.reminded = 0
        call.escalated = False
        self.emit(events.interrupt(call, self._show(call)))

    def remind(self, call: CallState) -> None:
        """A reminder for ``call`` is sent (its notifying tool is scheduled)."""
        call.reminded += 1

    def escalate(self, call: CallState, *, extend: timedelta) -> None:
        """Extend ``call``'s deadline once; its interrupt event says the new deadline."""
        assert call.deadline is not None
        call.escalated = True
        call.deadline = call.deadline + extend
        self.emit(events.interrupt(call, self._show(call)))

    def reshow(self, call: CallState) -> None:
        """What a pending call waits on changed (a new policy set's ask): its votes start
        afresh, and an ``interrupt`` event shows it as it stands."""
        call.votes = []
        self.emit(events.interrupt(call, self._show(call)))

    def expire(
        self,
        expired: list[CallState],
        *,
        output: Callable[[CallState], JsonObject],
        room: Callable[[], int] | None = None,
    ) -> list[CallState]:
        """Answer calls whose deadline has passed with their timeout default (``output``).

        Args:
            room: Bytes the turn can still take, asked after the defaults are in place; a
                default that does not fit becomes the stated timed-out answer. None: unchecked.
        """
        for call in expired:
            call.status = "answered"
            call.answer = "respond"
            # A server's input request nobody answered in time is declined, whatever default
            # the tool's own interrupts have.
            call.answer_output = timed_out_output() if call.source == "input" else output(call)
        for call in expired:
            if room is not None and json_size(call.answer_output) > room():
                # The declared default does not fit what the turn can still hold.
                call.answer_output = timed_out_output()
            self.emit(
                events.answer(
                    call,
                    kind="deadline",
                    via="deadline",
                    identity=DEADLINE_IDENTITY,
                    output=call.answer_output,
                )
            )
        return expired

    # -- a human answers --------------------------------------------------------------------

    def respond(self, call: CallState, output: JsonObject) -> None:
        """The call is answered with ``output`` as its response (once none is pending)."""
        call.status = "answered"
        call.answer = "respond"
        call.answer_output = output

    def restart(self, call: CallState, metadata: JsonObject) -> None:
        """The call is answered with a restart: it runs again with ``metadata``."""
        call.status = "answered"
        call.answer = "restart"
        call.answer_metadata = metadata

    def edit(self, call: CallState, new_input: JsonObject, *, passes_gate: bool) -> None:
        """Change a call's input (the model's is kept beside it); approvals of the old input do
        not carry over, and ``passes_gate`` is the gate's verdict on the edited call."""
        if call.original_args is None:
            call.original_args = call.args
        call.args = new_input
        call.votes = []
        call.edit_passes_gate = passes_gate

    def answered(
        self,
        call: CallState,
        *,
        kind: AnswerKind,
        via: AnswerVia,
        decision: Decision,
        identity: str | None,
        verified: bool,
        metadata: JsonObject | None,
        output: JsonObject | None = None,
        original_input: JsonObject | None = None,
        grant: str | None = None,
        granted_by: list[str] | None = None,
        subject: str | None = None,
        token_key_id: str | None = None,
    ) -> None:
        """Emit the ``answer`` event of one answer of a resume (a vote included), or of a
        grant's decision (``granted``, ``voided``)."""
        self.emit(
            events.answer(
                call,
                kind=kind,
                via=via,
                identity=identity,
                verified=verified,
                metadata=metadata,
                output=output,
                decision=decision,
                original_input=original_input,
                grant=grant,
                granted_by=granted_by,
                subject=subject,
                token_key_id=token_key_id,
            )
        )

    def settle(self) -> None:
        """Turn answers into progress: a respond is the call's output, a restart re-runs it."""
        for call in self.calls:
            if call.status != "answered":
                continue
            if call.source == "input" and call.input_round is not None:
                # An answer to a server's form: kept for the retry, which the call is ready for
                # once every form of the round is answered (the tool step asks the next one).
                answered_form(call.input_round, call.answer_output or {})
                call.status = "ready"
                call.answer = None
                call.answer_output = None
                call.answer_metadata = None
                continue
            respond = call.answer == "respond"
            if respond:
                call.status = "done"
                call.output = call.answer_output or {}
            else:
                call.status = "ready"
                call.resumed = True
                call.resumed_metadata = call.answer_metadata or {}
            call.answer = None
            call.answer_output = None
            call.answer_metadata = None
            if respond:
                self.emit(events.tool_response(call))

    # -- the turn ends early ----------------------------------------------------------------

    def cancel(
        self, reason: str, *, identity: str | None = None, via: AnswerVia = "cancel"
    ) -> list[CallState]:
        """Withdraw every call without a result: each gets a cancellation response for the model.

        That includes a call whose run was cut short by the cancellation (``failed``): the
        model must not read it as a success.
        """
        withdrawn = []
        for call in self.calls:
            if call.status in ("pending", "answered", "ready", "failed"):
                cut_short = call.status == "failed"
                call.status = "done"
                call.output = {"error": "cancelled", "reason": reason or "cancelled by the user"}
                if cut_short:
                    # Temporal asks a running activity to stop but does not wait for it: the
                    # model must not assume the tool had no effect.
                    call.output["note"] = "stopped while running; it may have taken effect"
                call.answer = None
                call.error = None
                withdrawn.append(call)
        for call in withdrawn:
            self.emit(events.answer(call, kind="cancel", via=via, identity=identity))
            self.emit(events.tool_response(call))
        return withdrawn

    def abandon(self, error: ErrorInfo) -> None:
        """Give every call of a failed step a response, so the conversation keeps what happened.

        A finished call keeps its output; a failed one says how it failed (and, when the
        failure does not tell, that it may have taken effect); a human's respond stands; a call
        that never ran says so.
        """
        for call in self.calls:
            if call.status == "done":
                continue
            if call.status == "failed" and call.error is not None:
                output: JsonObject = {"error": f"{call.error.status}: {call.error.message}"}
                if call.uncertain:
                    output["note"] = "it may have taken effect"
            elif call.status == "answered" and call.answer == "respond":
                output = call.answer_output or {}
            else:
                # The failure itself is in the failed call's own response: only its status here,
                # since this is repeated for every call that did not run.
                output = {"error": "not run: the turn failed first", "status": error.status}
            call.status = "done"
            call.output = output
            call.answer = None
            call.answer_output = None
            call.answer_metadata = None
            self.emit(events.tool_response(call))

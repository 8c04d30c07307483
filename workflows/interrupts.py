"""The interrupt book: the tool calls of one model message, seen as interrupts to answer.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`InterruptBook` is the one object the workflow holds for a turn's calls; it composes
four parts, each pure and tested on its own:

- the call lifecycle (:mod:`workflows.calls`): every change of a call's status, each with the
  turn event it emits;
- resume checking (:mod:`workflows.answers`): shape, match against what is pending, schema fit
  and the turn's byte budget;
- governance (:mod:`workflows.governance`): who may answer (approver lists, groups, verified
  tokens), quorum and votes, and the tokens answers spend;
- deadline policy (:mod:`workflows.deadlines`): defaults, reminders, escalation and expiry.

A resume gets in one way, :meth:`InterruptBook.resume`, by update or by signal, after
:meth:`~InterruptBook.validate` (which the update validator and the signal handler both call,
so they always give the same verdict); the checks run in one fixed order in
:meth:`~InterruptBook.check`, so a resume that breaks several rules is always refused for the
same one.

The agent's spec and the spent-token list are read from their source on every use (see
:meth:`InterruptBook.of_turn`): a model result may bring a new spec in the middle of a turn.

Pure code with no Temporal imports, so it is unit-tested in milliseconds and behaves identically
on replay.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any, Literal

from temporal_agent_interrupts.workflows import answers, deadlines, events, governance, presentation
from temporal_agent_interrupts.workflows.answers import (
    ENTRY_KEYS,
    ResumeError,
    check_resume_fields,
    edits,
    pydantic_reason,
    same_json,
    schema_error,
)
from temporal_agent_interrupts.workflows.calls import Emit, Lifecycle
from temporal_agent_interrupts.workflows.deadlines import Due
from temporal_agent_interrupts.workflows.decisions import Decisions, policy_record
from temporal_agent_interrupts.workflows.governance import (
    EPOCH,
    GROUP_PREFIX,
    REQUEST_APPROVERS_BYTES,
    VOTE_BYTES,
    Who,
    token_facts,
)
from temporal_agent_interrupts.workflows.identity import VerifiedIdentity
from temporal_agent_interrupts.workflows.input_rounds import form_schema
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    SpentToken,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    AnswerKind,
    AnswerVia,
    Decision,
    ErrorInfo,
    EscalateSpec,
    Grant,
    InterruptRequest,
    InterruptSource,
    JsonObject,
    ReminderSpec,
    ResumeInput,
    gate_metadata,
)

__all__ = [
    "ENTRY_KEYS",
    "EPOCH",
    "GROUP_PREFIX",
    "REQUEST_APPROVERS_BYTES",
    "VOTE_BYTES",
    "Due",
    "Emit",
    "InterruptBook",
    "ResumeError",
    "Who",
    "check_resume_fields",
    "pydantic_reason",
    "same_json",
    "schema_error",
    "token_facts",
]


class InterruptBook:
    """The tool calls of one model message, seen as interrupts to answer.

    Wraps the step's ``CallState`` list (which lives in workflow state and is mutated in place);
    every transition hands its turn event to ``emit``.

    Args:
        calls: The step's calls.
        spec: The agent's definition (see :meth:`of_turn` for a book that follows the
            conversation's).
        known_refs: Every ref the conversation has made (an answer to one not pending here
            is told "already answered", not "unknown").
        emit: Takes each transition's turn event.
        spent: The conversation's spent identity tokens (mutated in place when an answer
            spends one).
        chats: The chat ids a token bound to one answer may name: this conversation's, and
            its callers' for a sub-agent (answers to its calls come through them); or
            a function that says, asked only when a bound token arrives.
    """

    def __init__(
        self,
        calls: list[CallState],
        *,
        spec: AgentSpec | None,
        known_refs: Collection[str] = (),
        emit: Emit | None = None,
        spent: list[SpentToken] | None = None,
        chats: Collection[str] | Callable[[], Collection[str]] = (),
    ) -> None:
        spent = spent if spent is not None else []
        self._chats = chats if callable(chats) else lambda: chats
        self._spec: Callable[[], AgentSpec | None] = lambda: spec
        self._spent: Callable[[], list[SpentToken]] = lambda: spent
        # The conversation that keeps grants (None: a book of no conversation, which grants
        # nothing; see of_turn).
        self._state: Callable[[], ConversationState | None] = lambda: None
        self.known_refs = known_refs
        self.lifecycle = Lifecycle(calls, emit=emit, show=self.request_for)
        # Grants, the re-check before a run, and the policy set's decisions (workflows.decisions).
        self.decisions = Decisions(
            self.lifecycle, spec=lambda: self.spec, state=lambda: self._state(), pause=self.pause
        )

    @classmethod
    def of_turn(
        cls,
        state: ConversationState,
        calls: list[CallState],
        *,
        known_refs: Collection[str],
        emit: Emit,
        chats: Collection[str] | Callable[[], Collection[str]] = (),
    ) -> InterruptBook:
        """The book of a turn's ``calls`` that reads the agent's spec and the spent tokens
        from ``state`` whenever it asks, so it can be built once per turn and still see the
        spec a model result brings."""
        book = cls(calls, spec=None, known_refs=known_refs, emit=emit, chats=chats)
        book._spec = lambda: state.spec
        book._spent = lambda: state.spent_tokens
        book._state = lambda: state
        return book

    @property
    def calls(self) -> list[CallState]:
        return self.lifecycle.calls

    @property
    def spec(self) -> AgentSpec | None:
        return self._spec()

    @property
    def spent(self) -> list[SpentToken]:
        return self._spent()

    # -- views ------------------------------------------------------------------------------

    def pending(self) -> list[CallState]:
        """Calls waiting for an answer, in call order."""
        return self.lifecycle.pending()

    def waiting(self) -> list[CallState]:
        """Calls paused, answered or not (the turn continues when none is still pending)."""
        return self.lifecycle.waiting()

    def all_answered(self) -> bool:
        return self.lifecycle.all_answered()

    def held_bytes(self) -> int:
        """Bytes the calls hold in the conversation's state (what counts against the turn)."""
        return self.lifecycle.held_bytes()

    def first_error(self) -> ErrorInfo | None:
        return self.lifecycle.first_error()

    def requests(self) -> list[InterruptRequest]:
        return [self.request_for(c) for c in self.pending()]

    def request_for(self, call: CallState) -> InterruptRequest:
        """A paused call as the caller sees it, with who may answer and how."""
        spec = self.spec
        tool = spec.tool(call.name) if spec else None
        shown, omitted = governance.shown_approvers(spec, call)
        return events.to_request(
            call,
            approvers=shown,
            approvers_omitted=omitted,
            quorum=self.quorum(call),
            editable=tool is not None and tool.editable,
            output_schema=(
                form_schema(call.input_round)
                if call.source == "input"
                else tool.output_schema
                if tool and tool.interrupt_only
                else None
            ),
            gate=events.gate_of_call(call),
            issuer=spec.trust.issuer if spec and spec.trust else None,
            shown=presentation.shown(call, tool),
            input_schema=tool.input_schema if tool is not None and tool.editable else None,
        )

    # -- governance -------------------------------------------------------------------------

    def approvers(self, call: CallState) -> list[str]:
        """Who may answer ``call`` (empty: anyone); see :func:`workflows.governance.approvers`."""
        return governance.approvers(self.spec, call)

    def quorum(self, call: CallState) -> int:
        """How many distinct approvals settle ``call`` (a denial settles it at once)."""
        return governance.quorum(self.spec, call)

    def gate_holds(self, call: CallState) -> bool:
        """Whether a gate (ToolApproval, an MCP tool's own) holds a ready call until someone
        approves it."""
        return governance.gate_holds(self.spec, call)

    def who(self, resume: ResumeInput, *, now: datetime | None) -> Who:
        """Who sent ``resume`` (see :func:`workflows.governance.who`)."""
        return governance.who(resume, spec=self.spec, spent=self.spent, now=now)

    def spend_refused(self, token: str | None, *, now: datetime) -> None:
        """Spend a valid token whose answer was refused after it reached history (see
        :func:`workflows.governance.spend_refused`)."""
        governance.spend_refused(token, spec=self.spec, spent=self.spent, now=now)

    def could_answer(self, verified: VerifiedIdentity) -> Literal["named", "anyone"] | None:
        """What the account a token proves could answer here (see
        :func:`workflows.governance.could_answer`)."""
        return governance.could_answer(self.spec, verified)

    # -- edits ------------------------------------------------------------------------------

    @staticmethod
    def edits(call: CallState, new_input: JsonObject | None) -> bool:
        """Whether a restart's ``input`` changes the call's (as JSON: ``500`` is not ``500.0``)."""
        return edits(call, new_input)

    def is_edit(self, call: CallState, new_input: JsonObject | None) -> bool:
        """Whether a restart is an edit: a changed input to a tool declared editable."""
        return answers.is_edit(self.spec, call, new_input)

    # -- deadline policy --------------------------------------------------------------------

    def deadline_seconds(self, name: str) -> float | None:
        return deadlines.deadline_seconds(self.spec, name)

    def policy(self, call: CallState) -> tuple[EscalateSpec | None, list[ReminderSpec], bool]:
        """The deadline policy of ``call`` (see :func:`workflows.deadlines.policy`)."""
        return deadlines.policy(self.spec, call)

    def next_deadline(self) -> datetime | None:
        """When the next deadline policy acts: a reminder or a deadline."""
        return deadlines.next_deadline(self.spec, self.pending())

    def due(self, now: datetime) -> list[Due]:
        """What the deadline policies do now, for every pending call whose time has come."""
        return deadlines.due(self.spec, self.pending(), now)

    def timeout_output(self, call: CallState) -> JsonObject:
        return deadlines.timeout_output(self.spec, call)

    def remind(self, call: CallState) -> None:
        """A reminder for ``call`` is sent (its notifying tool is scheduled)."""
        self.lifecycle.remind(call)

    def escalate(self, call: CallState) -> None:
        """Extend ``call``'s deadline once; its interrupt event says the new deadline."""
        self.lifecycle.escalate(call, extend=deadlines.extension(self.spec, call))

    def expire(self, now: datetime, *, room: Callable[[], int] | None = None) -> list[CallState]:
        """Answer every pending call whose deadline has passed with its timeout default.

        Args:
            room: Bytes the turn can still take, asked after the defaults are in place; a
                default that does not fit becomes the stated timed-out answer. None: unchecked.
        """
        spec = self.spec
        expired = deadlines.expiring(spec, self.pending(), now)
        return self.lifecycle.expire(
            expired, output=lambda call: deadlines.timeout_output(spec, call), room=room
        )

    # -- validation -------------------------------------------------------------------------

    def validate(
        self,
        raw: Any,
        *,
        size: int | None = None,
        room: int | None = None,
        now: datetime | None = None,
    ) -> ResumeInput:
        """Check a raw resume payload (decoded JSON) against the rules and the pending set.

        Args:
            raw: The decoded payload.
            size: Its size in bytes, when known: over :data:`DOOR.resume` is refused.
            room: Bytes the turn can still take (see :data:`HELD.turn`); None: unchecked.
            now: The workflow's time, which an identity token's expiry is checked against.

        Raises:
            ResumeError: the payload is malformed, too large, or does not match what is
                pending now. Nothing has been applied.
        """
        resume = answers.parse_resume(raw, size=size)
        self.check(resume, room=room, now=now)
        return resume

    def check(
        self,
        resume: ResumeInput,
        *,
        room: int | None = None,
        now: datetime | None = None,
        schemas: bool = True,
    ) -> Who:
        """Check a well-formed resume against what is pending now (and the turn's room);
        returns who sent it.

        The order is part of the contract: a resume that breaks several rules is refused for
        the first, the same way by update and by signal.

        Args:
            schemas: Whether edits and outputs are checked against the tool's schemas (False
                only where :meth:`validate` has just checked this resume: see :meth:`resume`).
        """
        spec = self.spec
        pending = answers.check_match(resume, calls=self.calls, known_refs=self.known_refs)
        who = self.who(resume, now=now)
        governance.check_binding(resume, pending, who=who, chats=self._chats())
        governance.check_approvers(resume, pending, spec=spec, who=who)
        governance.check_duties(resume, pending, spec=spec, who=who)
        # One budget for every schema check of the answer: many entries share the bound.
        budget = answers.SchemaBudget()
        answers.check_restarts(resume, pending, spec=spec, schemas=schemas, budget=budget)
        governance.check_votes(resume, pending, spec=spec, who=who)
        self.decisions.check_remember(resume, pending, who=who, now=now)
        if schemas:
            answers.check_outputs(resume, pending, spec=spec, budget=budget)
        if room is not None:
            vote_bytes = governance.vote_bytes(spec, resume, pending)
            answers.check_room(resume, pending, spec=spec, room=room, vote_bytes=vote_bytes)
        return who

    # -- transitions -------------------------------------------------------------------------

    def request(self, calls: list[CallState]) -> None:
        """The model's calls of one message become this step's calls (each ``ready``)."""
        self.lifecycle.request(calls)

    def clear(self) -> None:
        """The step is over: its responses went to the model in one message."""
        self.lifecycle.clear()

    def complete(self, call: CallState, output: JsonObject) -> None:
        """The call has its response (see :meth:`workflows.calls.Lifecycle.complete`)."""
        self.lifecycle.complete(call, output)

    def fail(self, call: CallState, error: ErrorInfo, *, uncertain: bool) -> None:
        """The call's run failed (see :meth:`workflows.calls.Lifecycle.fail`)."""
        self.lifecycle.fail(call, error, uncertain=uncertain)

    def start_run(self, call: CallState) -> int:
        """Count one more run of the call (one per approval); returns its number."""
        return self.lifecycle.start_run(call)

    def pause(
        self,
        call: CallState,
        *,
        source: InterruptSource,
        metadata: JsonObject,
        now: datetime,
    ) -> None:
        """Mark a call pending, with its deadline from the agent definition."""
        deadline = deadlines.deadline(self.spec, call.name, now=now)
        ask = governance.policy_ask(call) if source == "approval" else None
        if ask is not None and ask.deadline_seconds:
            # A policy's ask may shorten the deadline, never lengthen it.
            asked = now + timedelta(seconds=ask.deadline_seconds)
            deadline = asked if deadline is None else min(deadline, asked)
        self.lifecycle.pause(call, source=source, metadata=metadata, now=now, deadline=deadline)

    def gate(self, call: CallState, *, now: datetime) -> None:
        """Pause a call a gate holds (the ToolApproval, an MCP tool's own) until someone
        approves it; an MCP tool's metadata says what decided it."""
        ask = governance.policy_ask(call)
        if ask is not None:
            metadata: JsonObject = {
                "message": ask.reason or f"A policy asks for approval of {call.name}",
                "reason": "policy",
                "policy": policy_record(ask),
            }
        else:
            metadata = gate_metadata(call.name, governance.gate_decision(self.spec, call.name))
        self.pause(call, source="approval", metadata=metadata, now=now)

    def resume(
        self, resume: ResumeInput, *, via: AnswerVia, now: datetime | None = None
    ) -> list[CallState]:
        """Apply a resume: the one way an answer gets in, by update or by signal.

        Checked again against what is pending now (cheap, and it keeps an unchecked answer from
        ever taking effect); :meth:`validate` has checked the rest, just before, in the same
        handler and with no await between: the schema fit of edits and outputs, the one costly
        check, is not done twice (it depends only on the answer and the tool's schema, so a
        replay decides it the same). An approval of a call that needs a quorum is a vote until
        the last one arrives; a restart with a changed input is an edit.

        Returns the calls answered (a vote leaves its call pending).

        Raises:
            ResumeError: it no longer matches what is pending. Nothing has been applied.
        """
        who = self.check(resume, now=now, schemas=False)
        spec = self.spec
        governance.spend_answer(self.spent, who, now=now)
        by_ref = {c.ref: c for c in self.pending()}
        answered: list[CallState] = []
        said: list[tuple[CallState, AnswerKind, Decision, JsonObject | None, JsonObject | None]]
        said = []
        made: dict[str, Grant] = {}  # grants the resume's approvals made, by the call's ref
        for r in resume.respond:
            call = by_ref[r.ref]
            decision = events.decision(call, kind="respond", output=r.output)
            if governance.vote(spec, call, decision, who, now=now, output=r.output):
                said.append((call, "vote", "vote", r.output, None))
                continue
            self.lifecycle.respond(call, r.output)
            answered.append(call)
            said.append((call, "respond", decision, r.output, None))
        for r in resume.restart:
            call = by_ref[r.ref]
            decision = events.decision(
                call, kind="restart", output=None, metadata=r.resumed_metadata
            )
            kind: AnswerKind = "restart"
            original = None
            if r.input is not None and self.is_edit(call, r.input):
                original = call.original_args or call.args
                passes = governance.edit_passes_gate(
                    spec, call, approved=decision == "approved", who=who
                )
                self.lifecycle.edit(call, r.input, passes_gate=passes)
                kind, decision = "edit", "edited"
            elif governance.vote(spec, call, decision, who, now=now, remember=r.remember):
                said.append((call, "vote", "vote", None, None))
                continue
            self.lifecycle.restart(call, r.resumed_metadata)
            answered.append(call)
            approving = (kind == "restart" and decision == "approved") or (
                kind == "edit" and call.edit_passes_gate is True
            )
            if approving:
                self.decisions.approved(call, who)
            if kind == "restart" and decision == "approved":
                grant = self.decisions.remember(call, r.remember, who=who, now=now)
                if grant is not None:
                    made[call.ref] = grant
            said.append((call, kind, decision, None, original))
        for call, kind, decision, output, original in said:
            grant = made.get(call.ref) if kind == "restart" else None
            self.lifecycle.answered(
                call,
                kind=kind,
                via=via,
                decision=decision,
                identity=who.identity,
                verified=who.verified,
                metadata=resume.metadata,
                output=output,
                original_input=original,
                grant=grant.id if grant else None,
                granted_by=grant.granted_by if grant else None,
                subject=who.subject,
                token_key_id=who.token_key_id,
            )
        if now is not None:
            for grant in made.values():
                answered.extend(self.decisions.apply_to_pending(grant, now=now))
        return answered

    def settle(self) -> None:
        """Turn answers into progress: a respond is the call's output, a restart re-runs it."""
        self.lifecycle.settle()

    def cancel(
        self, reason: str, *, identity: str | None = None, via: AnswerVia = "cancel"
    ) -> list[CallState]:
        """Withdraw every call without a result (see :meth:`workflows.calls.Lifecycle.cancel`)."""
        return self.lifecycle.cancel(reason, identity=identity, via=via)

    def abandon(self, error: ErrorInfo) -> None:
        """Give every call of a failed step a response (see
        :meth:`workflows.calls.Lifecycle.abandon`)."""
        self.lifecycle.abandon(error)

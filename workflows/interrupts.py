"""The interrupt book: every change of a tool call's status, and the one way a resume gets in.

A call's life, and the transition that makes each step (each emits its turn event):

- the model asks for it: :meth:`~InterruptBook.request` (``tool_request``);
- it pauses for a human: :meth:`~InterruptBook.pause` for an interrupt-only tool or a tool that
  raised, :meth:`~InterruptBook.gate` for the ToolApproval gate (``interrupt``);
- it runs and finishes: :meth:`~InterruptBook.complete` (``tool_response``) or
  :meth:`~InterruptBook.fail` (its response comes when the turn gives up on it);
- a human answers: :meth:`~InterruptBook.resume`, the one entry point for a resume, by update or
  signal (``answer``); its deadline passes: :meth:`~InterruptBook.expire` (``answer``);
- the answers take effect once none is pending: :meth:`~InterruptBook.settle` (a respond is the
  call's output, ``tool_response``; a restart makes it ready to run again);
- the turn ends early: :meth:`~InterruptBook.cancel` (``answer`` and ``tool_response`` for each
  withdrawn call) or :meth:`~InterruptBook.abandon` when it failed (``tool_response``).

Where an approver list, a quorum or an edit is decided, it is decided here: validation
(:meth:`~InterruptBook.validate`, which the update validator and the signal handler both call,
so they always give the same verdict) and the answer's effect.

Pure code with no Temporal imports, so it is unit-tested in milliseconds and behaves identically
on replay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from pydantic import ValidationError

from workflows import events
from workflows.events import to_request
from workflows.identity import MAX_TOKEN_BYTES, IdentityError, VerifiedIdentity, verify_token
from workflows.limits import (
    MAX_IDENTITY_BYTES,
    MAX_RESUME_BYTES,
    MAX_RESUME_METADATA_BYTES,
    TURN_BUDGET,
    Refused,
    check_json,
    check_label,
    check_size,
    human_size,
    json_size,
    names_within,
)
from workflows.tokens import MAX_SPENT_TOKENS, MAX_TOKEN_LIFE, TokenFacts, has_room, is_spent, spend
from workflows.types import (
    DEADLINE_IDENTITY,
    AgentSpec,
    AnswerKind,
    AnswerVia,
    CallState,
    Decision,
    ErrorInfo,
    EscalateSpec,
    InterruptRequest,
    InterruptSource,
    JsonObject,
    ReminderSpec,
    ResumeInput,
    SpentToken,
    TurnEvent,
    Vote,
    gate_metadata,
    input_digest,
    timed_out_output,
)

Emit = Callable[[TurnEvent], object]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

REQUEST_APPROVERS_BYTES = 1024
"""What one pending call's approver list may take wherever it is shown (the rest counted)."""

VOTE_BYTES = 400
"""What one kept vote may take as stored JSON (a 256-byte identity, its time and flag)."""

GROUP_PREFIX = "group:"
"""An approver that names a group (its members come from a verified token's groups claim)."""

ENTRY_KEYS = {
    "respond": ("name", "ref", "output", "input_digest"),
    "restart": ("name", "ref", "input", "resumed_metadata", "input_digest"),
}
"""The keys a resume entry may have; any other is most likely a typo, and rejects the resume."""


class ResumeError(Refused):
    """A resume that cannot be applied; ``reason`` says why, in words for the sender."""


@dataclass(frozen=True)
class Who:
    """Who sent an answer: verified from an identity token, or as the caller asserts it."""

    identity: str | None
    verified: bool = False
    groups: tuple[str, ...] = ()
    # The token this answer spends (see ConversationState.spent_tokens, workflows.tokens).
    spent: TokenFacts | None = None
    # A verified identity's account (the token's ``sub``).
    subject: str | None = None

    def may_answer(self, approvers: Collection[str]) -> bool:
        """Whether an approver list admits this sender (empty: anyone). Groups count only
        when verified: an asserted identity has no groups."""
        if not approvers:
            return True
        person = self.identity is not None and not self.identity.startswith(GROUP_PREFIX)
        if person and self.identity in approvers:
            return True
        return self.verified and any(f"{GROUP_PREFIX}{g}" in approvers for g in self.groups)


@dataclass(frozen=True)
class Due:
    """What a deadline policy does now for one pending call."""

    call: CallState
    # "remind": run the reminder's notifying tool; "escalate": notify and extend the deadline;
    # "expire": answer with the timeout default; "cancel": cancel the turn.
    action: str
    notify: str | None = None


def pydantic_reason(err: ValidationError, *, limit: int = 3) -> str:
    """A one-line summary of a pydantic error, naming the offending fields."""
    parts = []
    for e in err.errors()[:limit]:
        where = ".".join(str(x) for x in e["loc"]) or "payload"
        parts.append(f"{where}: {e['msg']}")
    more = len(err.errors()) - limit
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts)


def schema_error(instance: Any, schema: JsonObject) -> str | None:
    """The first way ``instance`` breaks ``schema``, or None when it fits."""
    try:
        validator = Draft202012Validator(schema)
        error = best_match(validator.iter_errors(instance))
    except SchemaError as e:
        return f"the declared schema is invalid: {e.message}"
    except Exception as e:  # noqa: BLE001  # a schema must never fail a workflow task
        # pydantic accepts patterns Python's re cannot compile (\p{L}), among others.
        return f"the declared schema cannot be checked here ({type(e).__name__})"
    if error is None:
        return None
    where = ".".join(str(x) for x in error.absolute_path)
    rule = _rule(error.validator, error.validator_value, error.message)
    return f"{where}: {rule}" if where else rule


def _rule(validator: object, want: object, message: str) -> str:
    """Which rule a value broke, in words that never quote the value itself.

    jsonschema's own messages repeat the offending value; a reason is logged, kept in the
    rejections query and shown in the Temporal UI, and the value may be a secret (a token
    typed into the wrong field).
    """
    if validator in ("required", "dependentRequired"):
        return message  # names the missing property, which comes from the schema
    if validator == "type":
        return f"must be of type {json.dumps(want)}"
    if validator in ("enum", "const"):
        allowed = json.dumps(want, default=str)
        allowed = allowed if len(allowed) <= 200 else allowed[:200] + "…"
        return f"must be {'one of ' if validator == 'enum' else ''}{allowed}"
    if validator == "additionalProperties":
        return message  # names the unexpected keys, not their values
    if isinstance(want, int | float | str) and not isinstance(want, bool):
        return f"fails {validator}={json.dumps(want)}"
    return f"fails the schema's {validator!s} rule"


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``500`` and ``500.0``, or ``true`` and ``1``, are not."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_resume_fields(resume: ResumeInput) -> None:
    """What a resume carries, each part on its own (the client checks this before sending).

    Raises:
        ResumeError: naming the part and the rule it breaks.
    """
    try:
        if resume.identity_token is not None:
            check_size(
                len(resume.identity_token.encode("utf-8", "replace")),
                limit=MAX_TOKEN_BYTES,
                what="identity_token",
            )
        if resume.identity is not None:
            check_label(resume.identity, what="identity", limit=MAX_IDENTITY_BYTES)
        for r in resume.respond:
            what = f"the respond output for {r.name!r}"
            check_json(r.output, what=what)
        for r in resume.restart:
            what = f"the resumed_metadata for {r.name!r}"
            check_json(r.resumed_metadata, what=what)
            if r.input is not None:
                what = f"the restart input for {r.name!r}"
                check_json(r.input, what=what)
        if resume.metadata is not None:
            check_json(resume.metadata, what="metadata")
            # Audit data, kept as its digest over 4 KiB; and each resume's metadata is
            # written again with its acceptance, whatever the turn holds.
            size = json_size(resume.metadata)
            check_size(size, limit=MAX_RESUME_METADATA_BYTES, what="metadata")
    except ResumeError:
        raise
    except Refused as e:
        raise ResumeError(e.reason) from None


def _check_entry_keys(raw: dict[str, Any]) -> None:
    for kind, allowed in ENTRY_KEYS.items():
        entries = raw.get(kind)
        if not isinstance(entries, list):
            continue  # the model validation says what is wrong with it
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                continue
            unknown = [k for k in entry if k not in allowed]
            if unknown:
                names = ", ".join(repr(k[:40]) for k in unknown[:3])
                raise ResumeError(
                    f"{kind}[{i}] has unknown keys {names}; a {kind} entry has {', '.join(allowed)}"
                )


class InterruptBook:
    """The tool calls of one model message, seen as interrupts to answer.

    Wraps the step's ``CallState`` list (which lives in workflow state and is mutated in place);
    every transition hands its turn event to ``emit``.
    """

    def __init__(
        self,
        calls: list[CallState],
        *,
        spec: AgentSpec | None,
        known_refs: Collection[str] = (),
        emit: Emit | None = None,
        spent: list[SpentToken] | None = None,
    ) -> None:
        self.calls = calls
        self.spec = spec
        self.known_refs = known_refs
        self._emit: Emit = emit or (lambda _: None)
        # The conversation's spent identity tokens (mutated in place when an answer spends one).
        self.spent = spent if spent is not None else []

    # -- views ------------------------------------------------------------------------------

    def pending(self) -> list[CallState]:
        """Calls waiting for an answer, in call order."""
        return [c for c in self.calls if c.status == "pending"]

    def waiting(self) -> list[CallState]:
        """Calls paused, answered or not (the turn continues when none is still pending)."""
        return [c for c in self.calls if c.status in ("pending", "answered")]

    def requests(self) -> list[InterruptRequest]:
        return [self.request_for(c) for c in self.pending()]

    def request_for(self, call: CallState) -> InterruptRequest:
        """A paused call as the caller sees it, with who may answer and how."""
        tool = self.spec.tool(call.name) if self.spec else None
        approvers = self.approvers(call)
        # Every pending call shows them, in results, queries, the memo and the stream.
        shown = names_within(approvers, REQUEST_APPROVERS_BYTES)
        return to_request(
            call,
            approvers=shown,
            approvers_omitted=len(approvers) - len(shown),
            quorum=self.quorum(call),
            editable=tool is not None and tool.editable,
        )

    def all_answered(self) -> bool:
        return not self.pending()

    def held_bytes(self) -> int:
        """Bytes the calls hold in the conversation's state (what counts against the turn)."""
        return sum(json_size(c) for c in self.calls)

    def next_deadline(self) -> datetime | None:
        """When the next deadline policy acts: a reminder or a deadline."""
        times = [t for c in self.pending() if (t := self._next_time(c)) is not None]
        return min(times) if times else None

    def _next_time(self, call: CallState) -> datetime | None:
        if call.deadline is None:
            return None
        reminder = self._next_reminder(call)
        if reminder is not None:
            return min(call.deadline - timedelta(seconds=reminder.before_seconds), call.deadline)
        return call.deadline

    def _next_reminder(self, call: CallState) -> ReminderSpec | None:
        reminders = self.policy(call)[1]
        return reminders[call.reminded] if call.reminded < len(reminders) else None

    def policy(self, call: CallState) -> tuple[EscalateSpec | None, list[ReminderSpec], bool]:
        """The deadline policy of ``call``: its escalation, its reminders (earliest first) and
        whether the deadline cancels the turn. An interrupt-only tool with a deadline of its
        own has its own policy; every other paused call has the agent's."""
        if self.spec is None:
            return None, [], False
        tool = self.spec.tool(call.name)
        if tool is not None and tool.interrupt_only and tool.deadline_seconds:
            escalate, reminders, cancel = tool.escalate, tool.reminders, tool.timeout_cancel
        else:
            escalate = self.spec.interrupt_escalate
            reminders = self.spec.interrupt_reminders
            cancel = self.spec.interrupt_timeout_cancel
        ordered = sorted(reminders, key=lambda r: -r.before_seconds)
        return escalate, ordered, cancel

    def due(self, now: datetime) -> list[Due]:
        """What the deadline policies do now, for every pending call whose time has come."""
        due: list[Due] = []
        for call in self.pending():
            if call.deadline is None:
                continue
            escalate, _, cancel = self.policy(call)
            reminder = self._next_reminder(call)
            if call.deadline <= now:
                if escalate is not None and not call.escalated:
                    due.append(Due(call, "escalate", escalate.notify))
                elif escalate.then_cancel if escalate and call.escalated else cancel:
                    due.append(Due(call, "cancel"))
                else:
                    due.append(Due(call, "expire"))
            elif (
                reminder is not None
                and call.deadline - timedelta(seconds=reminder.before_seconds) <= now
            ):
                due.append(Due(call, "remind", reminder.notify))
        return due

    def remind(self, call: CallState) -> None:
        """A reminder for ``call`` is sent (its notifying tool is scheduled)."""
        call.reminded += 1

    def escalate(self, call: CallState) -> None:
        """Extend ``call``'s deadline once; its interrupt event says the new deadline."""
        escalate = self.policy(call)[0]
        assert escalate is not None and call.deadline is not None
        call.escalated = True
        call.deadline = call.deadline + timedelta(seconds=escalate.extend_seconds)
        self._emit(events.interrupt(call, self.request_for(call)))

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
            size: Its size in bytes, when known: over :data:`MAX_RESUME_BYTES` is refused.
            room: Bytes the turn can still take (see :data:`TURN_BUDGET`); None: unchecked.
            now: The workflow's time, which an identity token's expiry is checked against.

        Raises:
            ResumeError: the payload is malformed, too large, or does not match what is
                pending now. Nothing has been applied.
        """
        if size is not None:
            try:
                check_size(size, limit=MAX_RESUME_BYTES, what="resume")
            except Refused as e:
                raise ResumeError(e.reason) from None
        if not isinstance(raw, dict):
            raise ResumeError(
                "resume must be a JSON object with 'respond' and/or 'restart' lists, "
                f"got {_json_type(raw)}"
            )
        _check_entry_keys(raw)
        try:
            resume = ResumeInput.model_validate(raw)
        except ValidationError as e:
            raise ResumeError(f"malformed resume: {pydantic_reason(e)}") from None
        check_resume_fields(resume)
        self.check(resume, room=room, now=now)
        return resume

    def check(
        self,
        resume: ResumeInput,
        *,
        room: int | None = None,
        now: datetime | None = None,
    ) -> Who:
        """Check a well-formed resume against what is pending now (and the turn's room);
        returns who sent it."""
        entries: list[tuple[str, str, str]] = [
            ("respond", r.name, r.ref) for r in resume.respond
        ] + [("restart", r.name, r.ref) for r in resume.restart]
        if not entries:
            raise ResumeError("empty resume: give at least one 'respond' or 'restart' entry")
        pending = {c.ref: c for c in self.pending()}
        if not pending:
            raise ResumeError("nothing is paused: this conversation has no pending interrupts")
        seen: set[str] = set()
        for kind, name, ref in entries:
            if ref in seen:
                raise ResumeError(f"ref {ref!r} is answered more than once in this resume")
            seen.add(ref)
            call = pending.get(ref)
            if call is None:
                raise ResumeError(self._not_pending(ref, pending))
            if call.name != name:
                raise ResumeError(f"ref {ref!r} is a call to {call.name!r}, not {name!r} ({kind})")
        for r in [*resume.respond, *resume.restart]:
            shown = r.input_digest
            if shown is not None and shown != input_digest(pending[r.ref].args):
                # An approval of what was shown must never approve something else.
                raise ResumeError(
                    f"{r.name!r} (ref {r.ref!r}) no longer has the input this answer was shown "
                    "(it was edited since): answer the input it has now (pending lists it)"
                )
        who = self.who(resume, now=now)
        for kind, name, ref in entries:
            allowed = self.approvers(pending[ref])
            if not who.may_answer(allowed):
                sender = repr(who.identity) if who.identity else "an answer with no identity"
                groups = " (groups count only from a verified identity token)"
                unverified = not who.verified and any(a.startswith(GROUP_PREFIX) for a in allowed)
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) may be answered only by {', '.join(allowed)}; "
                    f"{sender} may not ({kind}){groups if unverified else ''}"
                )
        for r in resume.restart:
            call = pending[r.ref]
            tool = self.spec.tool(call.name) if self.spec else None
            editable = tool is not None and tool.editable
            if editable and self.is_edit(call, r.input) and _placeholder(r.input):
                # What a result cut to fit shows in place of a large input: sending it back
                # would make it the tool's input.
                raise ResumeError(
                    f"the input for {r.name!r} (ref {r.ref!r}) is the placeholder a result "
                    "shows for an input left out of it: send the real input, or omit 'input'"
                )
            if not editable and self.edits(call, r.input):
                raise ResumeError(
                    f"restart of {r.name!r} (ref {r.ref!r}) changes the tool's input, and "
                    f"{r.name!r} is not declared editable: a restart re-runs the tool with "
                    "its original input (omit 'input' or send it unchanged)"
                )
            if tool is not None and self.is_edit(call, r.input):
                problem = schema_error(r.input, tool.input_schema)
                if problem:
                    raise ResumeError(
                        f"the edited input for {r.name!r} (ref {r.ref!r}) does not fit the "
                        f"tool's input schema: {problem}"
                    )
        votes: list[tuple[AnswerKind, str, str, JsonObject | None, JsonObject | None]] = []
        votes.extend(("respond", r.name, r.ref, r.output, None) for r in resume.respond)
        votes.extend(("restart", r.name, r.ref, None, r.resumed_metadata) for r in resume.restart)
        for kind, name, ref, output, metadata in votes:
            call = pending[ref]
            quorum = self.quorum(call)
            if quorum <= 1:
                continue
            edit = kind == "restart" and self.is_edit(call, _restart_input(resume, ref))
            said = events.decision(call, kind=kind, output=output, metadata=metadata)
            if not edit and said not in ("approved", "denied"):
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) needs {quorum} approvals: answer it with an "
                    f"approval or a denial ({kind} here decides neither)"
                )
            if said == "approved" and kind == "respond" and call.source != "interrupt":
                # Its output would stand in for the tool's, so the approval would not run it.
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) needs {quorum} approvals: approve it with a "
                    "restart carrying tool_approved (approve() builds it), not a respond"
                )
            if who.identity is None:
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) needs {quorum} approvals from distinct people: "
                    "say who you are (identity)"
                )
            voted = [v.identity for v in call.votes]
            if not edit and _voted(call, who):
                raise ResumeError(
                    f"{who.identity!r} has already voted on {name!r} (ref {ref!r}); "
                    f"{len(voted)} of {quorum} approvals so far ({', '.join(voted)})"
                )
        for r in resume.respond:
            call = pending[r.ref]
            tool = self.spec.tool(call.name) if self.spec else None
            if tool and tool.interrupt_only and tool.output_schema:
                problem = schema_error(r.output, tool.output_schema)
                if problem:
                    raise ResumeError(
                        f"respond output for {r.name!r} (ref {r.ref!r}) does not fit its "
                        f"output schema: {problem}"
                    )
        if room is not None:
            adds = sum(json_size(r.output) for r in resume.respond)
            for r in resume.restart:
                tool = self.spec.tool(r.name) if self.spec else None
                # An interrupt-only tool pauses again showing the metadata: held twice.
                twice = tool is not None and tool.interrupt_only
                adds += json_size(r.resumed_metadata) * (2 if twice else 1)
                if self.is_edit(pending[r.ref], r.input):
                    adds += json_size(r.input)  # the edited input beside the model's
            # A vote is kept with its call until the quorum is met.
            adds += VOTE_BYTES * sum(1 for *_, ref in entries if self.quorum(pending[ref]) > 1)
            if adds > room:
                raise ResumeError(
                    f"this answer adds {human_size(adds)} to a turn that has room for "
                    f"{human_size(max(room, 0))} more (a turn holds at most "
                    f"{human_size(TURN_BUDGET)}): answer with less, or cancel the turn"
                )
        return who

    def who(self, resume: ResumeInput, *, now: datetime | None) -> Who:
        """Who sent ``resume``: the identity its token proves when the agent verifies identity
        (``trust``), else the identity it asserts.

        Raises:
            ResumeError: the agent verifies identity and the token is missing, invalid,
                expired, from a key it does not trust, already spent here, or names someone
                other than ``identity``; or a token came for an agent that verifies none.
        """
        trust = self.spec.trust if self.spec else None
        token = resume.identity_token
        if trust is None:
            if token is not None:
                raise ResumeError(
                    "this agent does not verify identity tokens: leave out identity_token and "
                    "say who you are with identity"
                )
            return Who(identity=resume.identity)
        if token is None:
            raise ResumeError(
                f"this agent verifies who answers: send identity_token, a JWT from "
                f"{trust.issuer} for audience {trust.audience}"
            )
        if now is None:
            raise ResumeError("identity tokens cannot be checked here")  # never in the workflow
        try:
            verified = verify_token(token, trust, now=now)
        except IdentityError as e:
            raise ResumeError(f"identity token refused: {e.reason}") from None
        if verified.identity.startswith(GROUP_PREFIX):
            raise ResumeError(
                f"the identity token names {verified.identity!r}: an identity may not begin "
                f"with {GROUP_PREFIX!r}, which names a group"
            )
        if resume.identity is not None and resume.identity != verified.identity:
            raise ResumeError(
                f"identity {resume.identity!r} does not match the identity token's "
                f"{verified.identity!r}: leave out identity, or send your own token"
            )
        facts = token_facts(verified)
        if is_spent(self.spent, facts):
            raise ResumeError(
                "this identity token was already used or offered to answer in this "
                "conversation: each answer needs a fresh token (the one used is in the "
                "conversation's history)"
            )
        if verified.expires - now > MAX_TOKEN_LIFE:
            # Every token is remembered until it expires, so their number stays bounded.
            raise ResumeError(
                "the identity token is valid for more than a day: use a short-lived token "
                "(minutes), as identity providers issue for this"
            )
        if not has_room(self.spent, facts, now=now):
            raise ResumeError(
                f"{MAX_SPENT_TOKENS} different accounts have answered here with identity tokens "
                "not yet expired: try again once the oldest have expired"
            )
        return Who(
            identity=verified.identity,
            verified=True,
            groups=verified.groups,
            spent=facts,
            # A fingerprint: a token's sub may be kilobytes, and a vote keeps it.
            subject=_fingerprint(verified.subject),
        )

    def quorum(self, call: CallState) -> int:
        """How many distinct approvals settle ``call`` (a denial settles it at once)."""
        if self.spec is None:
            return 1
        if call.source == "approval" or self._gated_tool(call):
            return self.spec.approval.quorum if self.spec.approval else 1
        tool = self.spec.tool(call.name)
        return tool.quorum if tool is not None and call.source == "interrupt" else 1

    def _gated_tool(self, call: CallState) -> bool:
        """A gated tool that raised an interrupt itself: its answer may carry the gate's
        approval (``tool_approved``), so the gate's approvers and quorum apply."""
        gate = self.spec.approval if self.spec else None
        return call.source == "tool" and gate is not None and call.name not in gate.allow

    @staticmethod
    def edits(call: CallState, new_input: JsonObject | None) -> bool:
        """Whether a restart's ``input`` changes the call's (as JSON: ``500`` is not ``500.0``)."""
        return new_input is not None and not same_json(new_input, call.args)

    def is_edit(self, call: CallState, new_input: JsonObject | None) -> bool:
        """Whether a restart is an edit: a changed input (as JSON: ``500`` is not ``500.0``)
        to a tool declared editable. Decided the same way wherever it is asked."""
        tool = self.spec.tool(call.name) if self.spec else None
        return tool is not None and tool.editable and self.edits(call, new_input)

    def approvers(self, call: CallState) -> list[str]:
        """Who may answer ``call`` (empty: anyone): the gate's approvers for a call it paused,
        the tool's own for an interrupt-only tool."""
        if self.spec is None:
            return []
        if call.source == "approval" or self._gated_tool(call):
            return self.spec.approval.approvers if self.spec.approval else []
        tool = self.spec.tool(call.name)
        return tool.approvers if tool is not None and call.source == "interrupt" else []

    def _not_pending(self, ref: str, pending: dict[str, CallState]) -> str:
        answered = {c.ref for c in self.calls if c.status != "pending"}
        listing = ", ".join(f"{c.name} (ref {c.ref})" for c in pending.values())
        if ref in answered or ref in self.known_refs:
            return f"ref {ref!r} is not pending: it was already answered. Pending: {listing}"
        return f"unknown ref {ref!r}. Pending: {listing}"

    # -- transitions -------------------------------------------------------------------------

    def request(self, calls: list[CallState]) -> None:
        """The model's calls of one message become this step's calls (each ``ready``)."""
        self.calls[:] = calls
        for call in calls:
            self._emit(events.tool_request(call))

    def clear(self) -> None:
        """The step is over: its responses went to the model in one message."""
        self.calls.clear()

    def complete(self, call: CallState, output: JsonObject) -> None:
        """The call has its response: it ran, or the runtime answered for it (unknown tool,
        invalid arguments, an approved run cut short)."""
        call.status = "done"
        call.output = output
        self._emit(events.tool_response(call))

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

    def resume(
        self, resume: ResumeInput, *, via: AnswerVia, now: datetime | None = None
    ) -> list[CallState]:
        """Apply a resume: the one way an answer gets in, by update or by signal.

        Checked again against what is pending now (cheap, and it keeps an unchecked answer from
        ever taking effect); :meth:`validate` has checked the rest. An approval of a call that
        needs a quorum is a vote until the last one arrives; a restart with a changed input is
        an edit.

        Returns the calls answered (a vote leaves its call pending).

        Raises:
            ResumeError: it no longer matches what is pending. Nothing has been applied.
        """
        who = self.check(resume, now=now)
        if who.spent is not None:
            self._spend(who.spent, now=now)
        by_ref = {c.ref: c for c in self.pending()}
        answered: list[CallState] = []
        said: list[tuple[CallState, AnswerKind, Decision, JsonObject | None, JsonObject | None]]
        said = []
        for r in resume.respond:
            call = by_ref[r.ref]
            decision = events.decision(call, kind="respond", output=r.output)
            if self._vote(call, decision, who, now=now):
                said.append((call, "vote", "vote", r.output, None))
                continue
            call.status = "answered"
            call.answer = "respond"
            call.answer_output = r.output
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
                self._edit(call, r.input, approved=decision == "approved", who=who)
                kind, decision = "edit", "edited"
            elif self._vote(call, decision, who, now=now):
                said.append((call, "vote", "vote", None, None))
                continue
            call.status = "answered"
            call.answer = "restart"
            call.answer_metadata = r.resumed_metadata
            answered.append(call)
            said.append((call, kind, decision, None, original))
        for call, kind, decision, output, original in said:
            self._emit(
                events.answer(
                    call,
                    kind=kind,
                    via=via,
                    identity=who.identity,
                    verified=who.verified,
                    metadata=resume.metadata,
                    output=output,
                    decision=decision,
                    original_input=original,
                )
            )
        return answered

    def _vote(self, call: CallState, decision: Decision, who: Who, *, now: datetime | None) -> bool:
        """Count an approval of a call that needs a quorum; True while more are needed."""
        quorum = self.quorum(call)
        if quorum <= 1 or decision != "approved" or who.identity is None:
            return False
        if _voted(call, who):
            return True  # refused by check(); never a second vote, never a settled call
        at = now or call.since or EPOCH  # the workflow always passes its time
        call.votes.append(
            Vote(identity=who.identity, verified=who.verified, at=at, subject=who.subject)
        )
        return len(call.votes) < quorum

    def _edit(self, call: CallState, new_input: JsonObject, *, approved: bool, who: Who) -> None:
        """Change a call's input; the approval gate decides again whether the edited call runs
        (the edit passes it only as an approval the gate itself would take)."""
        if call.original_args is None:
            call.original_args = call.args
        call.args = new_input
        call.votes = []  # approvals of the old input do not carry over
        gate = self.spec.approval if self.spec else None
        call.edit_passes_gate = (
            gate is None
            or call.name in gate.allow
            or (approved and gate.quorum <= 1 and who.may_answer(gate.approvers))
        )

    def _spend(self, token: TokenFacts, *, now: datetime | None) -> None:
        """Remember a used token until it can no longer be accepted (see workflows.tokens;
        :meth:`who` has checked there is room)."""
        spend(self.spent, token, now=now or EPOCH)

    def spend_refused(self, token: str | None, *, now: datetime) -> None:
        """Spend a valid token whose answer was refused after it reached history (a rejected
        signal, an update its handler refused): its copy there must answer nothing later.

        Only a token that could answer something in this conversation is spent: a token that
        can answer nothing is no threat in history, and spending it would let anyone fill the
        book with their own refused tokens. One whose account an approver list names is kept
        with the accepted answers (each account's share bounded); one that could answer only
        what anyone may answer goes to a pool of its own, oldest forgotten first, so no number
        of accounts takes the room an approver's answer needs (see workflows.tokens)."""
        trust = self.spec.trust if self.spec else None
        if token is None or trust is None:
            return
        try:
            verified = verify_token(token, trust, now=now)
        except IdentityError:
            return  # it could not answer anything anyway
        could = self.could_answer(verified)
        if verified.expires - now > MAX_TOKEN_LIFE or could is None:
            return  # refused for good (too long-lived), or nothing here it could answer
        spend(self.spent, token_facts(verified), now=now, offered=could == "anyone")

    def could_answer(self, verified: VerifiedIdentity) -> Literal["named", "anyone"] | None:
        """What the account a token proves could answer of the interrupts this agent can raise
        (a call the gate pauses, an interrupt-only tool, a tool that raises one): one whose
        approver list admits it (``"named"``), only ones anyone may answer, or none."""
        spec = self.spec
        if spec is None:
            return None
        who = Who(identity=verified.identity, verified=True, groups=verified.groups)
        gate = spec.approval
        lists: list[list[str]] = []
        for tool in spec.tools:
            if tool.interrupt_only:
                lists.append(tool.approvers)
            elif gate is not None and tool.name not in gate.allow:
                lists.append(gate.approvers)
            else:
                lists.append([])  # a tool that may raise an interrupt: anyone may answer it
        if any(approvers and who.may_answer(approvers) for approvers in lists):
            return "named"
        return "anyone" if any(not approvers for approvers in lists) else None

    def expire(self, now: datetime, *, room: Callable[[], int] | None = None) -> list[CallState]:
        """Answer every pending call whose deadline has passed with its timeout default.

        Args:
            room: Bytes the turn can still take, asked after the defaults are in place; a
                default that does not fit becomes the stated timed-out answer. None: unchecked.
        """
        expired = []
        for call in self.pending():
            escalate, _, cancel = self.policy(call)
            if escalate is not None and not call.escalated:
                continue  # escalated first (see due)
            if escalate.then_cancel if escalate is not None else cancel:
                continue  # the turn is cancelled instead (see due)
            if call.deadline is not None and call.deadline <= now:
                call.status = "answered"
                call.answer = "respond"
                call.answer_output = self.timeout_output(call)
                expired.append(call)
        for call in expired:
            if room is not None and json_size(call.answer_output) > room():
                # The declared default does not fit what the turn can still hold.
                call.answer_output = timed_out_output()
            self._emit(
                events.answer(
                    call,
                    kind="deadline",
                    via="deadline",
                    identity=DEADLINE_IDENTITY,
                    output=call.answer_output,
                )
            )
        return expired

    def timeout_output(self, call: CallState) -> JsonObject:
        escalate = self.policy(call)[0]
        if escalate is not None and call.escalated:
            return dict(escalate.then) if escalate.then is not None else timed_out_output()
        tool = self.spec.tool(call.name) if self.spec else None
        if tool and tool.on_timeout is not None:
            return dict(tool.on_timeout)
        if self.spec and self.spec.on_interrupt_timeout is not None:
            return dict(self.spec.on_interrupt_timeout)
        return timed_out_output()

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
            self._emit(events.answer(call, kind="cancel", via=via, identity=identity))
            self._emit(events.tool_response(call))
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
            self._emit(events.tool_response(call))

    def settle(self) -> None:
        """Turn answers into progress: a respond is the call's output, a restart re-runs it."""
        for call in self.calls:
            if call.status != "answered":
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
                self._emit(events.tool_response(call))

    def pause(
        self,
        call: CallState,
        *,
        source: InterruptSource,
        metadata: JsonObject,
        now: datetime,
    ) -> None:
        """Mark a call pending, with its deadline from the agent definition."""
        call.status = "pending"
        call.source = source
        call.metadata = metadata
        call.since = now
        seconds = self.deadline_seconds(call.name)
        call.deadline = now + timedelta(seconds=seconds) if seconds else None
        # A pause starts afresh: votes and an edit's gate verdict belong to the last one.
        call.votes = []
        call.edit_passes_gate = None
        call.reminded = 0
        call.escalated = False
        self._emit(events.interrupt(call, self.request_for(call)))

    def gate(self, call: CallState, *, now: datetime) -> None:
        """Pause a call the ToolApproval gate holds until someone approves it."""
        self.pause(call, source="approval", metadata=gate_metadata(call.name), now=now)

    def deadline_seconds(self, name: str) -> float | None:
        if self.spec is None:
            return None
        tool = self.spec.tool(name)
        if tool and tool.deadline_seconds:
            return tool.deadline_seconds
        return self.spec.interrupt_deadline_seconds

    def first_error(self) -> ErrorInfo | None:
        for c in self.calls:
            if c.status == "failed" and c.error is not None:
                return c.error
        return None


def _fingerprint(subject: str | None) -> str | None:
    return hashlib.sha256(subject.encode()).hexdigest()[:32] if subject is not None else None


def token_facts(verified: VerifiedIdentity) -> TokenFacts:
    """What a verified token leaves in the spent book: what it signs, its account (``sub``, or
    the identity it names) and until when it could be accepted."""
    account = _fingerprint(verified.subject or verified.identity) or ""
    return TokenFacts(
        digest=verified.digest, subject=account, until=verified.expires, issued=verified.issued
    )


def _voted(call: CallState, who: Who) -> bool:
    """Whether ``who`` has voted on ``call``: the same identity, or the same account (a
    verified token's ``sub``) under another spelling."""
    return any(
        v.identity == who.identity or (who.subject is not None and v.subject == who.subject)
        for v in call.votes
    )


def _placeholder(value: JsonObject | None) -> bool:
    """Whether ``value`` is what a result shows in place of an object left out of it."""
    return value is not None and set(value) == {"omitted", "bytes", "sha256"}


def _restart_input(resume: ResumeInput, ref: str) -> JsonObject | None:
    return next((r.input for r in resume.restart if r.ref == ref), None)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__

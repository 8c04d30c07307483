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

import json
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from pydantic import ValidationError

from workflows import events
from workflows.events import to_request
from workflows.limits import (
    MAX_IDENTITY_BYTES,
    MAX_JSON_DEPTH,
    MAX_RESUME_BYTES,
    MAX_RESUME_METADATA_BYTES,
    SERIALIZABLE_DEPTH,
    TURN_BUDGET,
    Refused,
    check_json,
    check_label,
    check_size,
    check_text,
    human_size,
    json_size,
)
from workflows.types import (
    AgentSpec,
    AnswerVia,
    CallState,
    ErrorInfo,
    InterruptRequest,
    InterruptSource,
    JsonObject,
    ResumeInput,
    TurnEvent,
    gate_metadata,
    timed_out_output,
)

Emit = Callable[[TurnEvent], object]

ENTRY_KEYS = {
    "respond": ("name", "ref", "output"),
    "restart": ("name", "ref", "input", "resumed_metadata"),
}
"""The keys a resume entry may have; any other is most likely a typo, and rejects the resume."""


class ResumeError(Refused):
    """A resume that cannot be applied; ``reason`` says why, in words for the sender."""


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


def check_resume_fields(resume: ResumeInput, *, strict: bool = True) -> None:
    """What a resume carries, each part on its own (the client checks this before sending).

    Without ``strict`` (conversations begun before these rules) only what could never be
    stored is refused: invalid Unicode and nesting past :data:`SERIALIZABLE_DEPTH`.

    Raises:
        ResumeError: naming the part and the rule it breaks.
    """
    depth = MAX_JSON_DEPTH if strict else SERIALIZABLE_DEPTH
    try:
        if resume.identity is not None:
            if strict:
                check_label(resume.identity, what="identity", limit=MAX_IDENTITY_BYTES)
            else:
                check_text(resume.identity, what="identity", limit=MAX_RESUME_BYTES)
        for r in resume.respond:
            what = f"the respond output for {r.name!r}"
            check_json(r.output, what=what, finite=strict, depth=depth)
        for r in resume.restart:
            what = f"the resumed_metadata for {r.name!r}"
            check_json(r.resumed_metadata, what=what, finite=strict, depth=depth)
            if r.input is not None:
                what = f"the restart input for {r.name!r}"
                check_json(r.input, what=what, finite=strict, depth=depth)
        if resume.metadata is not None:
            check_json(resume.metadata, what="metadata", finite=strict, depth=depth)
            if strict:
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
    ) -> None:
        self.calls = calls
        self.spec = spec
        self.known_refs = known_refs
        self._emit: Emit = emit or (lambda _: None)

    # -- views ------------------------------------------------------------------------------

    def pending(self) -> list[CallState]:
        """Calls waiting for an answer, in call order."""
        return [c for c in self.calls if c.status == "pending"]

    def waiting(self) -> list[CallState]:
        """Calls paused, answered or not (the turn continues when none is still pending)."""
        return [c for c in self.calls if c.status in ("pending", "answered")]

    def requests(self) -> list[InterruptRequest]:
        return [to_request(c) for c in self.pending()]

    def all_answered(self) -> bool:
        return not self.pending()

    def held_bytes(self) -> int:
        """Bytes the calls hold in the conversation's state (what counts against the turn)."""
        return sum(json_size(c) for c in self.calls)

    def next_deadline(self) -> datetime | None:
        deadlines = [c.deadline for c in self.pending() if c.deadline is not None]
        return min(deadlines) if deadlines else None

    # -- validation -------------------------------------------------------------------------

    def validate(
        self,
        raw: Any,
        *,
        size: int | None = None,
        strict: bool = True,
        room: int | None = None,
    ) -> ResumeInput:
        """Check a raw resume payload (decoded JSON) against the rules and the pending set.

        Args:
            raw: The decoded payload.
            size: Its size in bytes, when known: over :data:`MAX_RESUME_BYTES` is refused.
            strict: Apply every rule. Conversations begun before some of them were added pass
                False, so that what they accepted then replays the same way.
            room: Bytes the turn can still take (see :data:`TURN_BUDGET`); None: unchecked.

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
        if strict:
            _check_entry_keys(raw)
        try:
            resume = ResumeInput.model_validate(raw)
        except ValidationError as e:
            raise ResumeError(f"malformed resume: {pydantic_reason(e)}") from None
        check_resume_fields(resume, strict=strict)
        self.check(resume, strict=strict, room=room)
        return resume

    def check(self, resume: ResumeInput, *, strict: bool = True, room: int | None = None) -> None:
        """Check a well-formed resume against what is pending now (and the turn's room)."""
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
        for kind, name, ref in entries:
            allowed = self.approvers(pending[ref])
            if allowed and resume.identity not in allowed:
                who = repr(resume.identity) if resume.identity else "an answer with no identity"
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) may be answered only by {', '.join(allowed)}; "
                    f"{who} may not ({kind})"
                )
        for r in resume.restart:
            call = pending[r.ref]
            changed = r.input is not None and (
                not same_json(r.input, call.args) if strict else r.input != call.args
            )
            if changed:
                raise ResumeError(
                    f"restart of {r.name!r} (ref {r.ref!r}) changes the tool's input; a restart "
                    "re-runs the tool with its original input (omit 'input' or send it unchanged)"
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
            if adds > room:
                raise ResumeError(
                    f"this answer adds {human_size(adds)} to a turn that has room for "
                    f"{human_size(max(room, 0))} more (a turn holds at most "
                    f"{human_size(TURN_BUDGET)}): answer with less, or cancel the turn"
                )

    def approvers(self, call: CallState) -> list[str]:
        """Who may answer ``call`` (empty: anyone): the gate's approvers for a call it paused,
        the tool's own for an interrupt-only tool."""
        if self.spec is None:
            return []
        if call.source == "approval":
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

    def resume(self, resume: ResumeInput, *, via: AnswerVia) -> list[CallState]:
        """Apply a resume: the one way an answer gets in, by update or by signal.

        Checked again against what is pending now (cheap, and it keeps an unchecked answer from
        ever taking effect); :meth:`validate` has checked the rest.

        Raises:
            ResumeError: it no longer matches what is pending. Nothing has been applied.
        """
        self.check(resume, strict=False)
        by_ref = {c.ref: c for c in self.pending()}
        answered = []
        for r in resume.respond:
            call = by_ref[r.ref]
            call.status = "answered"
            call.answer = "respond"
            call.answer_output = r.output
            answered.append(call)
        for r in resume.restart:
            call = by_ref[r.ref]
            call.status = "answered"
            call.answer = "restart"
            call.answer_metadata = r.resumed_metadata
            answered.append(call)
        for call in answered:
            kind = call.answer or "respond"
            self._emit(
                events.answer(
                    call,
                    kind=kind,
                    via=via,
                    identity=resume.identity,
                    metadata=resume.metadata,
                    output=call.answer_output if kind == "respond" else None,
                )
            )
        return answered

    def expire(self, now: datetime, *, room: Callable[[], int] | None = None) -> list[CallState]:
        """Answer every pending call whose deadline has passed with its timeout default.

        Args:
            room: Bytes the turn can still take, asked after the defaults are in place; a
                default that does not fit becomes the stated timed-out answer. None: unchecked.
        """
        expired = []
        for call in self.pending():
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
                    identity="system:deadline",
                    output=call.answer_output,
                )
            )
        return expired

    def timeout_output(self, call: CallState) -> JsonObject:
        tool = self.spec.tool(call.name) if self.spec else None
        if tool and tool.on_timeout is not None:
            return dict(tool.on_timeout)
        if self.spec and self.spec.on_interrupt_timeout is not None:
            return dict(self.spec.on_interrupt_timeout)
        return timed_out_output()

    def cancel(self, reason: str, *, identity: str | None = None) -> list[CallState]:
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
            self._emit(events.answer(call, kind="cancel", via="cancel", identity=identity))
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
        self._emit(events.interrupt(call))

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

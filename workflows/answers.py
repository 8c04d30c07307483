"""Resume checking: whether an answer is well formed, matches what is pending, fits its schema
and fits the turn.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Each check raises :class:`ResumeError` with a reason in words for the sender, and changes
nothing. Who may answer, and how many must, is :mod:`workflows.governance`; the book
(:mod:`workflows.interrupts`) runs these checks and those in one fixed order, so the update
validator and the signal handler always give the same verdict.

Pure code with no Temporal imports: unit-tested in milliseconds, identical on replay.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.exceptions import ValidationError as SchemaViolation
from pydantic import ValidationError

from temporal_agent_interrupts.workflows.identity import MAX_TOKEN_BYTES
from temporal_agent_interrupts.workflows.input_rounds import declined, form_schema, shown_digest
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    HELD,
    Refused,
    check_json,
    check_label,
    check_size,
    human_size,
    json_size,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    JsonObject,
    ResumeInput,
)

ENTRY_KEYS = {
    "respond": ("name", "ref", "output", "input_digest"),
    "restart": ("name", "ref", "input", "resumed_metadata", "input_digest", "remember"),
}
"""The keys a resume entry may have; any other is most likely a typo, and rejects the resume."""

Entry = tuple[str, str, str]
"""One answer of a resume: its kind (``respond`` or ``restart``), the tool's name, the ref."""


class ResumeError(Refused):
    """A resume that cannot be applied; ``reason`` says why, in words for the sender."""


# -- reasons -----------------------------------------------------------------------------------


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


ERRORS_WEIGHED = 16
"""How many of a value's schema errors are weighed for the one reported (jsonschema's
``best_match``); the rest are never made."""


@dataclass
class SchemaBudget:
    """What the schema checks of one answer, one model message or one sub-agent's answer may
    still use: shared by all of its checks, so that many entries cannot multiply the bound.

    Counted in values and rules, not time: a replay decides the same.
    """

    values: int = DOOR.schema_values
    """JSON values left to check (see :data:`DOOR.schema_values`)."""
    steps: int = DOOR.schema_steps
    """Schema rules left to apply (see :data:`DOOR.schema_steps`)."""


class _OutOfSteps(Exception):
    """The check used up its budget's steps."""


_budget: ContextVar[SchemaBudget] = ContextVar("schema_budget")
"""The budget of the running check. A context variable, not module state: the workflow modules
are shared by every conversation on the worker (worker/sandbox.py), each on its own thread; the
check sets it and resets it before it returns, and never awaits."""


REF_STEPS = 4
"""What following a ``$ref`` (or ``$dynamicRef``) costs in steps: resolving one takes about as
long as four other rules (bench/schema_bound.py)."""


def _counted(keyword: Callable[..., Any], *, steps: int = 1) -> Callable[..., Any]:
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        budget = _budget.get()
        budget.steps -= steps
        if budget.steps < 0:
            raise _OutOfSteps
        return keyword(validator, value, instance, schema)

    return counted


def _same_key(value: Any) -> Any:
    """A hashable key equal for values JSON Schema calls equal (``1`` and ``1.0``), and
    different for those it does not (``true`` and ``1``)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list | tuple):
        return ("array", tuple(_same_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _same_key(v)) for k, v in value.items()))
    return ("other", repr(value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``uniqueItems`` in one pass: jsonschema's compares every pair of objects (quadratic:
    18 s for 2,000 objects, bench/schema_bound.py)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _same_key(item)
        if key in seen:
            yield SchemaViolation("has non-unique elements")
            return
        seen.add(key)


_BoundedValidator = validators.extend(
    Draft202012Validator,
    validators={
        **{
            k: _counted(v, steps=REF_STEPS if k in ("$ref", "$dynamicRef") else 1)
            for k, v in Draft202012Validator.VALIDATORS.items()
        },
        "uniqueItems": _counted(_unique_items),
    },
)
"""Draft 2020-12, each rule applied counted against the check's budget (and ``uniqueItems``
linear). Made once when the module loads: no registry is touched (no ``version``)."""


def count_values(instance: Any, *, limit: int) -> int:
    """How many JSON values ``instance`` holds (at any depth), counted up to ``limit + 1``: it
    costs at most ``limit`` steps whatever the value's size."""
    stack = [instance]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return seen
        if isinstance(item, dict):
            children: Collection[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if seen + len(stack) + len(children) > limit:
            return limit + 1  # each of them counts: no need to look
        stack.extend(children)
    return seen


def schema_error(
    instance: Any, schema: JsonObject, *, budget: SchemaBudget | None = None
) -> str | None:
    """The first way ``instance`` breaks ``schema``, or None when it fits.

    Bounded, because it runs inside workflow tasks, which the SDK fails as a potential
    deadlock after 2 s (a 940 KB list took jsonschema 5 s: the task failed on every attempt and
    the conversation was wedged). A value is refused, as not fitting, when it holds more JSON
    values than ``budget`` has left (before the schema is read), or when checking it takes
    more rules than that; only the first :data:`ERRORS_WEIGHED` errors are weighed.

    Args:
        budget: Shared by the checks of one answer (or model message); None: a fresh one.
    """
    budget = budget if budget is not None else SchemaBudget()
    count = count_values(instance, limit=budget.values)
    if count > budget.values:
        return (
            f"too large to check against the schema here: at most {DOOR.schema_values:,} "
            "JSON values (items, members and scalars, at any depth) are checked per answer"
        )
    budget.values -= count
    token = _budget.set(budget)
    try:
        validator = _BoundedValidator(schema)
        error = best_match(itertools.islice(validator.iter_errors(instance), ERRORS_WEIGHED))
    except _OutOfSteps:
        return (
            f"too complex to check against the schema here: at most {DOOR.schema_steps:,} "
            "schema rules are applied per answer"
        )
    except SchemaError as e:
        return f"the declared schema is invalid: {e.message}"
    except Exception as e:  # noqa: BLE001  # a schema must never fail a workflow task
        # pydantic accepts patterns Python's re cannot compile (\p{L}), among others.
        return f"the declared schema cannot be checked here ({type(e).__name__})"
    finally:
        _budget.reset(token)
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


# -- edits -------------------------------------------------------------------------------------


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``500`` and ``500.0``, or ``true`` and ``1``, are not."""
    if a != b:
        # Python's equality is the looser (500 == 500.0 == True), and C-fast: unequal there
        # is unequal as JSON, with no need to serialize a 1 MiB edit several times a check.
        return False
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def edits(call: CallState, new_input: JsonObject | None) -> bool:
    """Whether a restart's ``input`` changes the call's (as JSON: ``500`` is not ``500.0``)."""
    return new_input is not None and not same_json(new_input, call.args)


def is_edit(spec: AgentSpec | None, call: CallState, new_input: JsonObject | None) -> bool:
    """Whether a restart is an edit: a changed input (as JSON: ``500`` is not ``500.0``) to a
    tool declared editable. Decided the same way wherever it is asked."""
    tool = spec.tool(call.name) if spec else None
    return tool is not None and tool.editable and edits(call, new_input)


def restart_input(resume: ResumeInput, ref: str) -> JsonObject | None:
    """The input a resume's restart of ``ref`` carries (None: none, or no restart of it)."""
    return next((r.input for r in resume.restart if r.ref == ref), None)


# -- shape -------------------------------------------------------------------------------------


def parse_resume(raw: Any, *, size: int | None = None) -> ResumeInput:
    """A raw resume payload (decoded JSON) as a well-formed resume, each part within its
    bounds; what is pending is not asked.

    Args:
        raw: The decoded payload.
        size: Its size in bytes, when known: over :data:`DOOR.resume` is refused.

    Raises:
        ResumeError: the payload is malformed or too large.
    """
    if size is not None:
        try:
            check_size(size, limit=DOOR.resume, what="resume")
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
    return resume


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
            check_label(resume.identity, what="identity", limit=DOOR.identity)
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
            check_size(size, limit=DOOR.resume_metadata, what="metadata")
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


# -- match -------------------------------------------------------------------------------------


def entries(resume: ResumeInput) -> list[Entry]:
    """The resume's answers in the order they are checked and applied: responds, then
    restarts."""
    return [("respond", r.name, r.ref) for r in resume.respond] + [
        ("restart", r.name, r.ref) for r in resume.restart
    ]


def check_match(
    resume: ResumeInput,
    *,
    calls: Sequence[CallState],
    known_refs: Collection[str] = (),
) -> dict[str, CallState]:
    """Check that every answer names a pending call, once, by its tool's name, and was shown
    the input the call has now; returns the pending calls by ref.

    Args:
        calls: The step's calls (those not pending tell an answered ref from an unknown one).
        known_refs: Every ref the conversation has made, for the same purpose.
    """
    answers = entries(resume)
    if not answers:
        raise ResumeError("empty resume: give at least one 'respond' or 'restart' entry")
    pending = {c.ref: c for c in calls if c.status == "pending"}
    if not pending:
        raise ResumeError(
            "nothing is paused: this conversation has no pending interrupts", code="conflict"
        )
    seen: set[str] = set()
    for _kind, name, ref in answers:
        if ref in seen:
            raise ResumeError(f"ref {ref!r} is answered more than once in this resume")
        seen.add(ref)
        call = pending.get(ref)
        if call is None:
            answered = ref in known_refs or any(c.ref == ref for c in calls)
            raise ResumeError(
                _not_pending(ref, pending, calls=calls, known_refs=known_refs),
                code="conflict" if answered else "not_found",
            )
        if call.name != name:
            raise ResumeError(f"ref {ref!r} is a call to {call.name!r}, not {name!r}")
    for r in [*resume.respond, *resume.restart]:
        shown = r.input_digest
        if shown is not None and shown != shown_digest(pending[r.ref]):
            if pending[r.ref].source == "input":
                raise ResumeError(
                    f"{r.name!r} (ref {r.ref!r}) waits on another form than this answer was "
                    "shown (its server asked again since): answer the form pending now",
                    code="conflict",
                )
            # An approval of what was shown must never approve something else.
            raise ResumeError(
                f"{r.name!r} (ref {r.ref!r}) no longer has the input this answer was shown "
                "(it was edited since): answer the input it has now (pending lists it)",
                code="conflict",
            )
    return pending


def _not_pending(
    ref: str,
    pending: dict[str, CallState],
    *,
    calls: Sequence[CallState],
    known_refs: Collection[str],
) -> str:
    answered = {c.ref for c in calls if c.status != "pending"}
    listing = ", ".join(f"{c.name} (ref {c.ref})" for c in pending.values())
    if ref in answered or ref in known_refs:
        return f"ref {ref!r} is not pending: it was already answered. Pending: {listing}"
    return f"unknown ref {ref!r}. Pending: {listing}"


# -- schema fit --------------------------------------------------------------------------------


def check_restarts(
    resume: ResumeInput,
    pending: dict[str, CallState],
    *,
    spec: AgentSpec | None,
    schemas: bool = True,
    budget: SchemaBudget | None = None,
) -> None:
    """Check each restart's input: unchanged unless the tool is editable, and an edit real
    and (unless ``schemas`` is False: checked already) within the tool's input schema, all
    within one ``budget`` (None: a fresh one)."""
    budget = budget if budget is not None else SchemaBudget()
    for r in resume.restart:
        call = pending[r.ref]
        if call.source == "input":
            raise ResumeError(
                f"{r.name!r} (ref {r.ref!r}) waits on a form its MCP server asked for: answer "
                "it with respond (the form's data) or deny it; a restart does not apply"
            )
        tool = spec.tool(call.name) if spec else None
        editable = tool is not None and tool.editable
        if editable and is_edit(spec, call, r.input) and _placeholder(r.input):
            # What a result cut to fit shows in place of a large input: sending it back
            # would make it the tool's input.
            raise ResumeError(
                f"the input for {r.name!r} (ref {r.ref!r}) is the placeholder a result "
                "shows for an input left out of it: send the real input, or omit 'input'"
            )
        if not editable and edits(call, r.input):
            raise ResumeError(
                f"restart of {r.name!r} (ref {r.ref!r}) changes the tool's input, and "
                f"{r.name!r} is not declared editable: a restart re-runs the tool with "
                "its original input (omit 'input' or send it unchanged)"
            )
        if schemas and tool is not None and is_edit(spec, call, r.input):
            problem = schema_error(r.input, tool.input_schema, budget=budget)
            if problem:
                raise ResumeError(
                    f"the edited input for {r.name!r} (ref {r.ref!r}) does not fit the "
                    f"tool's input schema: {problem}"
                )


def check_outputs(
    resume: ResumeInput,
    pending: dict[str, CallState],
    *,
    spec: AgentSpec | None,
    budget: SchemaBudget | None = None,
) -> None:
    """Check each respond to an interrupt-only tool against its declared output schema, all
    within one ``budget`` (None: a fresh one)."""
    budget = budget if budget is not None else SchemaBudget()
    for r in resume.respond:
        call = pending[r.ref]
        tool = spec.tool(call.name) if spec else None
        if call.source == "input":
            # A server's form: its data must fit the schema the server asked for; a denial
            # declines the form instead.
            schema = form_schema(call.input_round)
            if schema is not None and not declined(r.output):
                asked = schema.get("properties") or {}
                extra = ", ".join(repr(k[:60]) for k in r.output if k not in asked)
                if extra:
                    # A form is flat and asks for these fields only: anything else would reach
                    # the server as the person's answer.
                    raise ResumeError(
                        f"respond output for {r.name!r} (ref {r.ref!r}) has fields the MCP "
                        f"server's form does not ask for: {extra[:300]}"
                    )
                problem = schema_error(r.output, schema, budget=budget)
                if problem:
                    raise ResumeError(
                        f"respond output for {r.name!r} (ref {r.ref!r}) does not fit the form "
                        f"the MCP server asked for: {problem}"
                    )
            continue
        if tool and tool.interrupt_only and tool.output_schema:
            problem = schema_error(r.output, tool.output_schema, budget=budget)
            if problem:
                raise ResumeError(
                    f"respond output for {r.name!r} (ref {r.ref!r}) does not fit its "
                    f"output schema: {problem}"
                )


def _placeholder(value: JsonObject | None) -> bool:
    """Whether ``value`` is what a result shows in place of an object left out of it."""
    return value is not None and set(value) == {"omitted", "bytes", "sha256"}


# -- the turn's byte budget --------------------------------------------------------------------


def check_room(
    resume: ResumeInput,
    pending: dict[str, CallState],
    *,
    spec: AgentSpec | None,
    room: int,
    vote_bytes: int,
) -> None:
    """Check that what the resume adds to the turn fits the room it has left.

    Args:
        room: Bytes the turn can still take (see :data:`HELD.turn`).
        vote_bytes: What the votes it casts keep with their calls until each quorum is met
            (see :func:`workflows.governance.vote_bytes`).
    """
    adds = sum(json_size(r.output) for r in resume.respond)
    for r in resume.restart:
        tool = spec.tool(r.name) if spec else None
        # An interrupt-only tool pauses again showing the metadata: held twice.
        twice = tool is not None and tool.interrupt_only
        adds += json_size(r.resumed_metadata) * (2 if twice else 1)
        if is_edit(spec, pending[r.ref], r.input):
            adds += json_size(r.input)  # the edited input beside the model's
    adds += vote_bytes
    if adds > room:
        raise ResumeError(
            f"this answer adds {human_size(adds)} to a turn that has room for "
            f"{human_size(max(room, 0))} more (a turn holds at most "
            f"{human_size(HELD.turn)}): answer with less, or cancel the turn"
        )

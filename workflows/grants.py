"""Remembered decisions (grants): an approval that also lets later calls of the tool run unasked.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

An approver approving a gated call may ask that the decision be remembered
(``ToolRestart.remember``, a :class:`~workflows.types.GrantScope`): calls of the same tool, in
this conversation, whose input matches every condition of the scope, until its ``until`` or a
revoke. The rules, each decided here:

- Only an approval of a call a gate paused may grant (not an edit, a denial, a respond, or an
  interrupt-only tool's answer): the gate's approvers and quorum are the grant's. A grant needs an
  identity, which its records name.
- A quorum tool's grant needs the quorum: every approval of the call must ask for the same
  scope. When they differ, the call is approved and no grant is made; the narrower decision
  (this call) wins. The grant names every approver of the quorum.
- A grant applies at once to the turn's pending calls it matches, and to every later call the
  gate would pause. Each call it lets through has its own audit record (``granted``), naming
  the grant and who gave it.
- A condition reads the call's input, and only an input the tool's input schema accepts can
  match. Comparisons are strict JSON: equality needs the same type (``100`` is not ``"100"`` or
  ``100.0`` or ``true``), a prefix needs strings, a bound needs numbers (never booleans). A field
  the input lacks never matches. Every failure to match pauses the call as before.
- A grant lives in the conversation's state (it survives continue-as-new), expires on a durable
  timer at ``until``, and ends at once by a revoke. A call it let through that has not run yet
  is checked again just before it runs, and pauses again (``stale``) if the grant has ended.

Pure code over plain data: no Temporal imports, identical on replay; the time is the
workflow's, passed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from temporal_agent_interrupts.workflows.answers import (
    ResumeError,
    SchemaBudget,
    same_json,
    schema_error,
)
from temporal_agent_interrupts.workflows.limits import stored_size
from temporal_agent_interrupts.workflows.state import CallState, ConversationState
from temporal_agent_interrupts.workflows.types import (
    TOOL_APPROVED,
    AgentSpec,
    Grant,
    GrantCondition,
    GrantScope,
    JsonObject,
)

GRANT_KEY = "grant"
"""The key of a let-through call's ``resumed_metadata`` that names its grant (beside
``tool_approved``): the tool is told which grant approved its run."""

MAX_GRANTS = 32
"""Grants in force at once in one conversation (each held in its state)."""

MAX_CONDITIONS = 8
"""Conditions in one grant's pattern."""

MAX_FIELD_BYTES = 128
"""A condition's field path, as stored."""

MAX_VALUE_BYTES = 256
"""A condition's string value, as stored."""

MAX_LIFE = timedelta(days=366)
"""The furthest ``until`` may lie ahead (None, until revoked, is allowed)."""

NUMERIC = ("le", "lt", "ge", "gt")


def check_scope(
    scope: GrantScope,
    call: CallState,
    *,
    spec: AgentSpec | None,
    now: datetime | None,
) -> None:
    """Check a grant's scope is one the conversation can keep and apply.

    Raises:
        ResumeError: too many conditions, a field path or value too large, a bound that is not
            a number, a prefix that is not a string, a field the tool's input does not have,
            or an ``until`` with no UTC offset, in the past or more than :data:`MAX_LIFE` ahead.
    """
    name = call.name
    if len(scope.match) > MAX_CONDITIONS:
        raise ResumeError(
            f"remember on {name!r}: {len(scope.match)} conditions; at most {MAX_CONDITIONS}"
        )
    tool = spec.tool(name) if spec else None
    properties = (tool.input_schema.get("properties") if tool else None) or None
    for c in scope.match:
        if not c.field or stored_size(c.field) > MAX_FIELD_BYTES:
            raise ResumeError(
                f"remember on {name!r}: a condition's field must be a path of at most "
                f"{MAX_FIELD_BYTES} bytes"
            )
        if isinstance(c.value, str) and stored_size(c.value) > MAX_VALUE_BYTES:
            raise ResumeError(
                f"remember on {name!r}: the value for {c.field!r} is over {MAX_VALUE_BYTES} bytes"
            )
        if c.op in NUMERIC and not _number(c.value):
            raise ResumeError(
                f"remember on {name!r}: {c.op!r} on {c.field!r} needs a number, not {c.value!r}"
            )
        if c.op == "prefix" and not isinstance(c.value, str):
            raise ResumeError(
                f"remember on {name!r}: 'prefix' on {c.field!r} needs a string, not {c.value!r}"
            )
        head = c.field.split(".", 1)[0]
        if isinstance(properties, dict) and head not in properties:
            known = ", ".join(sorted(str(k) for k in properties))[:300]
            raise ResumeError(
                f"remember on {name!r}: its input has no field {head!r} (it has: {known})"
            )
    if scope.until is not None and scope.until.utcoffset() is None:
        # A time with no offset is no instant: comparing it with the workflow's (UTC) time
        # would raise, refusing the answer with an internal error instead of a reason.
        raise ResumeError(
            f"remember on {name!r}: until {scope.until.isoformat()} has no UTC offset; give "
            "one (2026-12-31T18:00:00Z)"
        )
    if scope.until is not None and now is not None:
        if scope.until <= now:
            raise ResumeError(f"remember on {name!r}: until {scope.until.isoformat()} has passed")
        if scope.until - now > MAX_LIFE:
            raise ResumeError(
                f"remember on {name!r}: until is more than {MAX_LIFE.days} days ahead; leave it "
                "out for a grant that lasts until revoked"
            )


def live(grant: Grant, now: datetime) -> bool:
    """Whether ``grant`` is in force at ``now`` (a revoked grant is no longer held at all)."""
    return grant.until is None or now < grant.until


def matches(grant: Grant, call: CallState, *, now: datetime) -> bool:
    """Whether ``grant`` lets ``call`` run unasked now, its input already accepted by the
    tool's schema (see :func:`find`): the same tool, in force, and every condition holds."""
    if grant.tool != call.name or not live(grant, now):
        return False
    return all(holds(c, call.args) for c in grant.match)


def holds(condition: GrantCondition, args: JsonObject) -> bool:
    """Whether one condition holds for a call's input (strictly, see the module docstring)."""
    found, value = _lookup(args, condition.field)
    if not found:
        return False
    bound = condition.value
    match condition.op:
        case "eq":
            return type(value) is type(bound) and same_json(value, bound)
        case "prefix":
            return isinstance(value, str) and isinstance(bound, str) and value.startswith(bound)
        case _:
            if not (_number(value) and _number(bound)):
                return False
            assert isinstance(value, int | float) and isinstance(bound, int | float)
            if condition.op == "le":
                return value <= bound
            if condition.op == "lt":
                return value < bound
            if condition.op == "ge":
                return value >= bound
            return value > bound


def find(
    grants: Sequence[Grant],
    call: CallState,
    *,
    spec: AgentSpec | None,
    now: datetime,
    admits: Callable[[Grant], bool] = lambda _: True,
    budget: SchemaBudget | None = None,
) -> Grant | None:
    """The first grant in force that lets ``call`` run unasked, or None.

    Args:
        admits: Whether the grant's grantors could approve ``call`` themselves now (its
            approver lists admit enough of them: see ``InterruptBook.find_grant``).
        budget: Shared with the message's other checks (see
            :class:`~workflows.answers.SchemaBudget`): the input must fit the tool's input
            schema, checked once, and only when some grant of the tool is in force.
    """
    candidates = [g for g in grants if g.tool == call.name and live(g, now) and admits(g)]
    tool = spec.tool(call.name) if spec else None
    if not candidates or tool is None:
        return None
    if schema_error(call.args, tool.input_schema, budget=budget) is not None:
        return None
    return next((g for g in candidates if matches(g, call, now=now)), None)


def held(grants: Sequence[Grant], grant_id: str) -> Grant | None:
    return next((g for g in grants if g.id == grant_id), None)


def stale(call: CallState, grants: Sequence[Grant], *, now: datetime) -> str | None:
    """Why a call a grant let through may no longer run (None: it may): its grant has ended
    (revoked or expired) since it was let through."""
    grant_id = call.granted
    if grant_id is None:
        return None
    grant = held(grants, grant_id)
    if grant is None:
        return f"grant {grant_id} was revoked before the call ran"
    if not live(grant, now):
        return f"grant {grant_id} expired before the call ran"
    return None


def let_through_metadata(grant: Grant) -> JsonObject:
    """The ``resumed_metadata`` of a call a grant lets through: an approved run, naming it."""
    return {TOOL_APPROVED: True, GRANT_KEY: grant.id}


def room(state: ConversationState, *, adding: int) -> bool:
    return len(state.grants) + adding <= MAX_GRANTS


def make(
    state: ConversationState,
    call: CallState,
    scope: GrantScope,
    *,
    granted_by: list[str],
    admitted: list[list[str]],
    subjects: list[str],
    verified: bool,
    now: datetime,
) -> Grant:
    """Make and hold a grant from the approval of ``call`` (checked by :func:`check_scope`)."""
    state.grants_made += 1
    grant = Grant(
        id=f"grant-{state.grants_made}",
        tool=call.name,
        match=list(scope.match),
        until=scope.until,
        granted_by=granted_by,
        admitted=admitted,
        subjects=subjects,
        verified=verified,
        at=now,
        ref=call.ref,
    )
    state.grants.append(grant)
    return grant


def quorum_scope(votes_scopes: Sequence[GrantScope | None]) -> GrantScope | None:
    """The scope a quorum's approvals agree on: every one asked for the same (None: any asked
    for none, or they differ; the call is then approved with no grant)."""
    if not votes_scopes or any(s is None for s in votes_scopes):
        return None
    first = votes_scopes[0]
    assert first is not None
    dumped = first.model_dump(mode="json")
    same = all(s is not None and same_json(s.model_dump(mode="json"), dumped) for s in votes_scopes)
    return first if same else None


def revoke(state: ConversationState, grant_id: str) -> Grant | None:
    """Stop holding grant ``grant_id``; returns it (None: none in force has that id)."""
    grant = held(state.grants, grant_id)
    if grant is not None:
        state.grants = [g for g in state.grants if g.id != grant_id]
    return grant


def expire(state: ConversationState, now: datetime) -> list[Grant]:
    """Stop holding every grant whose ``until`` has come; returns them."""
    ended = [g for g in state.grants if not live(g, now)]
    if ended:
        state.grants = [g for g in state.grants if live(g, now)]
    return ended


def next_expiry(grants: Sequence[Grant]) -> datetime | None:
    """When the next grant in force expires (None: none has an ``until``)."""
    times = [g.until for g in grants if g.until is not None]
    return min(times) if times else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _lookup(args: JsonObject, path: str) -> tuple[bool, Any]:
    value: Any = args
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


_SHOWN_OPS = {"eq": "=", "prefix": "starts with", "le": "≤", "lt": "<", "ge": "≥", "gt": ">"}


def describe_condition(condition: GrantCondition) -> str:
    """One condition as an operator reads it (``amount ≤ 100``, ``payee starts with "NL"``).

    The value is shown as JSON, so ``100`` and ``"100"`` (which match different inputs, see
    :func:`holds`) read differently. Not escaped: each surface escapes for its own medium.
    """
    value = json.dumps(condition.value, ensure_ascii=False)
    return f"{condition.field} {_SHOWN_OPS.get(condition.op, condition.op)} {value}"


def describe_match(match: Sequence[GrantCondition]) -> str:
    """A grant's pattern in words: its conditions joined by "and", or "every call"."""
    return " and ".join(describe_condition(c) for c in match) if match else "every call"

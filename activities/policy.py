"""Policies as data: a Cedar policy set decides each tool call, allow, ask or deny.

Internal: not covered by the 0.1.x stability promise; its public name, :class:`Policy`, is
imported from ``temporal_agent_interrupts.policies``.

Everything here runs on the worker: ``cedarpy`` is a native extension, so no module of
``workflows/`` imports this one. :func:`decide` is a pure function of the policy set and its
arguments (no clock, no environment, no I/O): the workflow records what the policy activity
returns, with the set's hash, and a replay reads that record instead of evaluating again.

The Cedar request for one call:

- principal ``User::"<identity>"`` (``User::"anonymous"`` when the message names nobody), with
  the attribute ``verified``; a verified requester's groups are its parents, ``Group::"name"``;
- action ``Action::"call"``;
- resource ``Tool::"<tool name>"``, with the attributes ``agent`` (the agent's name) and
  ``annotations`` (an MCP tool's annotations; an empty record for any other tool);
- context ``{"input": <the call's validated input>, "agent": <name>, "requester":
  {"identity", "verified", "groups"}}`` (``identity`` is ``""`` when nobody is named).

Cedar itself only permits or forbids. Annotations on its policies say the rest:

- a matching ``forbid`` denies (its ``@reason`` is what the model hears);
- a matching ``permit`` annotated ``@effect("ask")`` asks: ``@approvers("a@x.com,group:ops")``,
  ``@quorum("2")``, ``@deadline("3600")`` (seconds) and ``@reason`` say who, how many and how
  long; one such permit matching makes the call ask, whatever plain permits match too;
- a plain matching ``permit`` allows;
- nothing permitting denies, with the reason "no policy permits this call" (Cedar's default).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import cedarpy
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.activity_io import (
    PolicyInput,
    PolicyRequester,
    PolicyResult,
)
from temporal_agent_interrupts.workflows.agent import check_approvers
from temporal_agent_interrupts.workflows.limits import DOOR, KiB, json_size
from temporal_agent_interrupts.workflows.types import (
    JsonObject,
    PolicyDecision,
    PolicyEffect,
    Status,
)

ANONYMOUS = "anonymous"
"""The principal's id when the message names no sender (``verified`` is then false)."""

NO_PERMIT = "no policy permits this call"
NOT_EVALUATED = "the policy could not be evaluated on this call"
TOO_LARGE = "the call's input is too large or too deeply nested for the policy to read"

NO_POLICY = "NoPolicy"
"""The ``ApplicationError`` type of a decision asked of an agent with no policy on this worker."""
TOO_MANY_CALLS = "PolicyInputRefused"
"""The ``ApplicationError`` type of a decision asked for more calls than a message may make."""

MAX_INPUT_BYTES = 64 * KiB
"""The largest call input (as JSON) given to Cedar; a larger one is denied, unread. Cedar's
evaluation is cheap, but it runs inline on the worker's event loop: bounded, it stays a matter
of milliseconds for a message's 128 calls."""
MAX_INPUT_DEPTH = 16
"""The deepest nesting of a call's input given to Cedar (objects and arrays); deeper is denied."""

# Cedar's Long is a signed 64-bit integer; its decimal() has four digits after the point and
# the same range, divided by 10^4.
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DECIMAL_MIN, _DECIMAL_MAX = Decimal(_LONG_MIN).scaleb(-4), Decimal(_LONG_MAX).scaleb(-4)

_EFFECTS = ("allow", "ask")  # what @effect may say on a permit (a forbid always denies)


class PolicyError(ValueError):
    """A policy set that cannot be used: Cedar refused its text, or an annotation that decides
    an outcome (``@effect``, ``@approvers``, ``@quorum``, ``@deadline``) is malformed. The
    message names the set (its file) and says what is wrong."""


@dataclass(frozen=True)
class _Rule:
    """One policy of a set, as far as deciding needs it: its annotations, read at load."""

    cedar_id: str  # the parser's ``policyN``: what Cedar's diagnostics name
    id: str  # its @id, else cedar_id: what decisions and audit records name
    position: int
    forbid: bool
    effect: PolicyEffect
    reason: str
    approvers: tuple[str, ...]
    quorum: int
    deadline_seconds: float | None


@dataclass(frozen=True)
class Policy:
    """A Cedar policy set that decides each tool call of an agent: allow, ask or deny.

    Build one with :meth:`from_text` or :meth:`from_file` (the text is parsed, and its
    annotations checked, then), and give it to ``Agent(policy=...)``, or run
    ``agent-worker --policy FILE`` to give one to every agent the worker hosts. How requests
    look to Cedar and what the annotations mean: "Policies as data (Cedar)" in Approval
    governance.

    Attributes:
        name: What messages call the set (its file's path, for :meth:`from_file`).
        text: The policy text, as given.
        hash: The sha256, in hex, of the set's canonical form: Cedar's JSON form of the
            policies (``cedarpy.policies_to_json_str``), re-serialized with sorted keys, no
            whitespace and UTF-8. Comments and layout do not change it; a policy's
            conditions, effect, annotations or position do. Conversations record it with
            every decision.
    """

    name: str
    text: str = field(repr=False)  # an agent's repr names its policy, not the whole file
    hash: str
    _: KW_ONLY
    _rules: tuple[_Rule, ...] = field(repr=False, compare=False)
    _set: Any = field(repr=False, compare=False)  # cedarpy.PolicySet (a native handle)

    @classmethod
    def from_text(cls, text: str, *, name: str = "policy") -> Policy:
        """Parse a Cedar policy set.

        Raises:
            PolicyError: Cedar cannot parse it, it holds templates, or an annotation is
                malformed; the message names ``name``.
        """
        try:
            as_json = json.loads(cedarpy.policies_to_json_str(text))
            handle = cedarpy.PolicySet.from_str(text)
        except ValueError as e:
            raise PolicyError(f"{name}: Cedar cannot parse the policy set: {e}") from None
        if as_json.get("templates"):
            # A template needs linking to decide anything; there is nobody here to link it.
            raise PolicyError(f"{name}: templates are not supported, only static policies")
        policies: Mapping[str, Any] = as_json.get("staticPolicies") or {}
        if not policies:
            # An empty set would deny every call, silently: say so at load instead.
            raise PolicyError(f"{name}: the policy set holds no policies")
        rules = sorted((_rule(cid, p, name=name) for cid, p in policies.items()), key=_order)
        ids = [r.id for r in rules]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise PolicyError(f"{name}: policy ids must be unique; repeated: {dupes}")
        canonical = json.dumps(as_json, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        return cls(name, text, digest, _rules=tuple(rules), _set=handle)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Read and parse a Cedar policy file (UTF-8); its path names it in messages.

        Raises:
            PolicyError: the file cannot be read, or :meth:`from_text` refuses it.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyError(f"{path}: cannot read the policy file: {e}") from None
        return cls.from_text(text, name=str(path))

    @property
    def ids(self) -> list[str]:
        """The set's policy ids, in order (each ``@id``, else Cedar's ``policyN``)."""
        return [r.id for r in self._rules]

    def approvers(self) -> list[str]:
        """Every approver an ``ask`` of the set names (the agent checks ``group:`` entries
        against its verified identity, as it does its gates')."""
        return sorted({a for r in self._rules for a in r.approvers})


def _order(rule: _Rule) -> int:
    return rule.position


def _rule(cedar_id: str, policy: Mapping[str, Any], *, name: str) -> _Rule:
    """A policy's annotations, checked: a malformed one is refused at load, not at a call."""
    notes: Mapping[str, str | None] = policy.get("annotations") or {}
    forbid = policy.get("effect") == "forbid"
    own_id = notes.get("id")
    where = f"{name}: policy {own_id or cedar_id}"
    effect = notes.get("effect")
    if forbid:
        if effect not in (None, "deny"):
            raise PolicyError(f"{where}: a forbid always denies; @effect({effect!r}) says not")
        decided: PolicyEffect = "deny"
    elif effect in (None, *_EFFECTS):
        decided = "ask" if effect == "ask" else "allow"
    else:
        raise PolicyError(f"{where}: @effect is 'allow' or 'ask' on a permit, not {effect!r}")
    if decided != "ask":
        asked = [k for k in ("approvers", "quorum", "deadline") if k in notes]
        if asked:
            # Approvers on a policy that never asks would read as a gate and gate nothing.
            raise PolicyError(
                f'{where}: @{", @".join(asked)} only mean something with @effect("ask")'
            )
    approvers = tuple(a.strip() for a in (notes.get("approvers") or "").split(",") if a.strip())
    quorum = _whole(notes.get("quorum"), where=where)
    try:
        check_approvers(approvers, what=where, quorum=quorum)
    except ValueError as e:
        raise PolicyError(str(e)) from None
    return _Rule(
        cedar_id=cedar_id,
        id=own_id or cedar_id,
        position=_position(cedar_id),
        forbid=forbid,
        effect=decided,
        reason=(notes.get("reason") or "").strip(),
        approvers=approvers,
        quorum=quorum,
        deadline_seconds=_seconds(notes.get("deadline"), where=where),
    )


def _position(cedar_id: str) -> int:
    """Where Cedar's parser put a policy: it names the N-th one ``policyN``."""
    digits = cedar_id.removeprefix("policy")
    if not digits.isdigit():
        raise PolicyError(f"unexpected Cedar policy id {cedar_id!r}: is cedarpy 4.12 installed?")
    return int(digits)


def _whole(value: str | None, *, where: str) -> int:
    if value is None:
        return 1
    if not value.strip().isdigit():
        raise PolicyError(f"{where}: @quorum is a whole number, not {value!r}")
    return int(value)


def _seconds(value: str | None, *, where: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise PolicyError(f"{where}: @deadline is a positive number of seconds, not {value!r}")
    return seconds


def decide(
    policy: Policy,
    *,
    agent: str,
    tool: str,
    input: JsonObject,
    annotations: JsonObject | None = None,
    requester: PolicyRequester | None = None,
) -> PolicyDecision:
    """What ``policy`` decides of one call of ``tool`` by ``agent``: allow, ask or deny.

    Pure: the same arguments decide the same (the policy activity's result is recorded, so a
    replay never calls this). See the module docstring for the request Cedar is given.

    Combining, strictest first:

    1. A forbid that matches denies, whatever permits match. A forbid or an ``ask`` permit
       that Cedar could not evaluate (it read an attribute the input lacks, compared a string
       with a number) denies too, as "the policy could not be evaluated": an error must not
       turn a deny or an ask into an allow. A plain permit that errors only permits nothing,
       which is Cedar's own rule and never looser.
    2. Else, an ``ask`` permit that matches asks, even where plain permits match too. When
       several asks match, one applies whole: the one with the largest quorum, then the
       shortest deadline (none is the longest), then the first in the set. Their approver
       lists are not merged: a union would let more people approve, an intersection could
       leave nobody.
    3. Else, a plain permit that matches allows.
    4. Else Cedar's default: deny, "no policy permits this call".

    An input larger than :data:`MAX_INPUT_BYTES` or deeper than :data:`MAX_INPUT_DEPTH` is
    denied unread.
    """
    return decide_many(
        policy,
        agent=agent,
        calls=[(tool, input, annotations)],
        requester=requester,
    )[0]


def decide_many(
    policy: Policy,
    *,
    agent: str,
    calls: Sequence[tuple[str, JsonObject, JsonObject | None]],
    requester: PolicyRequester | None = None,
) -> list[PolicyDecision]:
    """:func:`decide` for each ``(tool, input, annotations)`` of ``calls``, in one Cedar batch."""
    principal, user_entities, who = _principal(requester)
    entities: dict[tuple[str, str], dict[str, Any]] = {
        (e["uid"]["type"], e["uid"]["id"]): e for e in user_entities
    }
    requests: list[dict[str, Any]] = []
    unread: dict[int, PolicyDecision] = {}
    for i, (tool, args, notes) in enumerate(calls):
        context_input = _cedar_input(args)
        if context_input is None:
            unread[i] = _decision(policy, "deny", TOO_LARGE)
            continue
        entities.setdefault(
            ("Tool", tool),
            {
                "uid": {"type": "Tool", "id": tool},
                "attrs": {"agent": agent, "annotations": _cedar_record(notes or {})},
                "parents": [],
            },
        )
        requests.append(
            {
                # The dict form: ids Cedar's surface syntax would refuse (quotes, newlines)
                # stay data.
                "principal": principal,
                "action": {"type": "Action", "id": "call"},
                "resource": {"type": "Tool", "id": tool},
                "context": {"input": context_input, "agent": agent, "requester": who},
            }
        )
    answers = iter(
        cedarpy.is_authorized_batch(requests, policy._set, list(entities.values()))
        if requests
        else []
    )
    return [
        unread[i] if i in unread else _from_cedar(policy, next(answers)) for i in range(len(calls))
    ]


def _principal(
    requester: PolicyRequester | None,
) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, Any]]:
    """The request's principal, the entities it needs, and ``context.requester``."""
    identity = requester.identity if requester is not None and requester.identity else ""
    verified = bool(requester and requester.verified and identity)
    # Groups come only from a verified token (DESIGN: approval governance): an asserted
    # identity's groups are whatever the sender typed.
    groups = sorted(set(requester.groups)) if requester is not None and verified else []
    uid = {"type": "User", "id": identity or ANONYMOUS}
    group_uids = [{"type": "Group", "id": g} for g in groups]
    entities = [
        {"uid": uid, "attrs": {"verified": verified}, "parents": group_uids},
        *({"uid": g, "attrs": {}, "parents": []} for g in group_uids),
    ]
    who = {"identity": identity, "verified": verified, "groups": groups}
    return uid, entities, who


def _from_cedar(policy: Policy, answer: cedarpy.AuthzResult) -> PolicyDecision:
    by_cedar_id = {r.cedar_id: r for r in policy._rules}
    matched = [by_cedar_id[c] for c in answer.diagnostics.reasons if c in by_cedar_id]
    failed = [by_cedar_id[c] for c in _errored(answer.diagnostics.errors) if c in by_cedar_id]
    forbids = sorted((r for r in matched if r.forbid), key=_order)
    if forbids:
        reason = next((r.reason for r in forbids if r.reason), "")
        return _decision(policy, "deny", reason or "a policy forbids this call", forbids)
    unsafe = sorted((r for r in failed if r.forbid or r.effect == "ask"), key=_order)
    if unsafe:
        return _decision(policy, "deny", NOT_EVALUATED, unsafe)
    if answer.decision != cedarpy.Decision.Allow:
        return _decision(policy, "deny", NO_PERMIT)
    asks = sorted((r for r in matched if r.effect == "ask"), key=_strictest)
    if asks:
        chosen = asks[0]
        return PolicyDecision(
            effect="ask",
            reason=chosen.reason,
            approvers=list(chosen.approvers),
            quorum=chosen.quorum,
            deadline_seconds=chosen.deadline_seconds,
            policy_hash=policy.hash,
            policy_ids=[r.id for r in asks],
        )
    allows = sorted(matched, key=_order)
    reason = next((r.reason for r in allows if r.reason), "")
    return _decision(policy, "allow", reason, allows)


def _strictest(rule: _Rule) -> tuple[int, float, int]:
    """The order asks apply in: largest quorum, then shortest deadline, then position."""
    deadline = rule.deadline_seconds if rule.deadline_seconds is not None else math.inf
    return (-rule.quorum, deadline, rule.position)


def _errored(errors: Sequence[str]) -> list[str]:
    """The policies Cedar's errors name (``error while evaluating policy `policy3`: ...``)."""
    found: list[str] = []
    for error in errors:
        start = error.find("`")
        end = error.find("`", start + 1)
        if start >= 0 and end > start:
            found.append(error[start + 1 : end])
    return found


def _decision(
    policy: Policy, effect: PolicyEffect, reason: str, rules: Sequence[_Rule] = ()
) -> PolicyDecision:
    return PolicyDecision(
        effect=effect, reason=reason, policy_hash=policy.hash, policy_ids=[r.id for r in rules]
    )


# --- JSON to Cedar values -----------------------------------------------------------------------
# Cedar has no null and no floating point. Integers within a Long's range are Longs. A float
# whose exact shortest decimal form has at most four digits after the point, within decimal()'s
# range, is a decimal() (compared with .lessThan() and friends, not <); any other number
# (1e300, 0.1234567, an integer past 2^63) is its JSON text, a String, so a policy can still
# see it but no arithmetic comparison on it succeeds (an error, which fails closed: see
# ``decide``). null fields are left out of their record (``has`` is false); arrays are Sets.


def _cedar_input(args: JsonObject) -> dict[str, Any] | None:
    """The call's input as a Cedar record, or None when it is past the bounds."""
    try:
        if json_size(args) > MAX_INPUT_BYTES:
            return None
    except (TypeError, ValueError):
        return None
    if _depth(args) > MAX_INPUT_DEPTH:
        return None
    return _cedar_record(args)


def _depth(value: Any) -> int:
    if isinstance(value, Mapping):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _cedar_record(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): _cedar_value(v) for k, v in obj.items() if v is not None}


def _cedar_value(value: Any) -> Any:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return value
    if isinstance(value, int):
        return value if _LONG_MIN <= value <= _LONG_MAX else str(value)
    if isinstance(value, float):
        return _cedar_decimal(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return _cedar_record(value)
    if isinstance(value, list | tuple):
        return [_cedar_value(v) for v in value if v is not None]
    return str(value)


def _cedar_decimal(value: float) -> Any:
    if not math.isfinite(value):
        return repr(value)
    try:
        exact = Decimal(repr(value))  # the shortest form that reads back as this float
    except InvalidOperation:
        return repr(value)
    exponent = exact.as_tuple().exponent
    if not isinstance(exponent, int) or exponent < -4 or not _DECIMAL_MIN <= exact <= _DECIMAL_MAX:
        return repr(value)
    text = format(exact, "f")
    return {"__extn": {"fn": "decimal", "arg": text if "." in text else f"{text}.0"}}


# --- the activity's body ------------------------------------------------------------------------


def decide_calls(policy: Policy | None, input: PolicyInput) -> PolicyResult:
    """The policy activity's result for ``input``, with ``policy`` (the agent's on this worker).

    Raises:
        ApplicationError: non-retryable ``NoPolicy`` when the agent has no policy here (a
            worker without the ``--policy`` the conversation's definition was recorded with):
            the workflow decides what a call without a decision does, never this worker.
    """
    if policy is None:
        raise ApplicationError(
            f"agent {input.agent[:200]!r} has no policy set on the worker that took this call: "
            "every worker on a task queue must hold the same policy (Agent(policy=) or "
            "agent-worker --policy)",
            Status.FAILED_PRECONDITION,
            type=NO_POLICY,
            non_retryable=True,
        )
    if len(input.calls) > DOOR.calls_per_message:
        raise ApplicationError(
            f"at most {DOOR.calls_per_message} calls are decided at once",
            Status.INVALID_ARGUMENT,
            type=TOO_MANY_CALLS,
            non_retryable=True,
        )
    decisions = decide_many(
        policy,
        agent=input.agent,
        calls=[(c.tool, c.input, c.annotations) for c in input.calls],
        requester=input.requester,
    )
    return PolicyResult(
        decisions={c.ref: d for c, d in zip(input.calls, decisions, strict=True)},
        policy_hash=policy.hash,
    )

"""``Agent`` and ``ToolApproval``: how an agent is declared on the worker.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts`` and ``temporal_agent_interrupts.policies``.

These are in-process specs (frozen dataclasses). The workflow never imports them: the worker turns
an ``Agent`` into an :class:`~workflows.types.AgentSpec` (plain data) and the model activity
records that in history, so changing an agent's code never breaks replay of a conversation
already in flight. Building a spec only calls pydantic's schema generation: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from os import PathLike
from typing import Any, Literal, Protocol, cast

from temporal_agent_interrupts.workflows.identity import check_trust
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    Refused,
    check_label,
    human_size,
    json_size,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    ApprovalSpec,
    EscalateSpec,
    JsonObject,
    ReminderSpec,
    ToolSpec,
    TrustSpec,
)


class ToolDeclaration(Protocol):
    """What an agent needs of a tool: its name and its spec as data.

    :func:`activities.tool` and :func:`activities.interrupt` build the real thing; naming only
    this here keeps ``workflows/`` free of the packages that import it.
    """

    @property
    def name(self) -> str: ...

    def spec(self) -> ToolSpec: ...


class ToolsetDeclaration(Protocol):
    """Tools an agent gets from elsewhere, listed by the model activity when it calls the
    model (an MCP server's: :func:`activities.mcp.mcp_tools`), so they reach the workflow as
    data in the definition it returns. ``toolset`` is a durable key (``mcp:NAME``)."""

    @property
    def toolset(self) -> str: ...


class PolicyDeclaration(Protocol):
    """What an agent needs of a policy set: its name, its hash, and the approvers its asks name.

    ``activities.policy.Policy`` is the real thing (Cedar, a native extension the workflow must
    never import); naming only this here keeps ``workflows/`` free of it.
    """

    @property
    def name(self) -> str: ...

    @property
    def hash(self) -> str: ...

    def approvers(self) -> list[str]: ...


def is_toolset(declared: object) -> bool:
    """Whether an entry of ``Agent.tools`` is a toolset rather than one tool."""
    return isinstance(getattr(declared, "toolset", None), str)


DEFAULT_MODEL = "gemini-flash-latest"
DEFAULT_MAX_TURNS = 10


@dataclass(frozen=True)
class ToolApproval:
    """Middleware: every call to a tool not in ``allow`` pauses for approval before it runs.

    The interrupt's metadata is ``{"message": "Tool not in approved list: NAME"}``. A restart
    with resumed metadata ``{"tool_approved": true}`` runs the tool; a restart without it pauses
    again on the same ref; a respond supplies the output without running the tool.
    Interrupt-only tools are not gated: they pause anyway.

    ``approvers``: the identities that may answer a call the gate paused (empty: anyone who can
    answer). An answer from anyone else is rejected like any bad resume.

    ``separate_duties``: whoever sent the message a paused call came from (its requester,
    ``Chat.send(identity=...)``) may not answer it: approve, deny, edit or vote. Binding with
    verified identity (``trust``); with asserted identities it is advisory.
    """

    _: KW_ONLY
    allow: Sequence[str] = ()
    approvers: Sequence[str] = ()
    quorum: int = 1
    separate_duties: bool = False

    def __post_init__(self) -> None:
        check_approvers(self.approvers, what="ToolApproval", quorum=self.quorum)


def check_approvers(approvers: Sequence[str], *, what: str, quorum: int = 1) -> None:
    """Refuse, at declaration, an approver list or quorum no answer could ever satisfy.

    ``group:NAME`` entries are checked by the agent, which knows whether it verifies identity
    (groups come only from a verified token).

    Raises:
        ValueError: an approver is not a one-line identity of at most 256 bytes; the quorum is
            below 1, or above the number of people an identity-only list names.
    """
    if isinstance(approvers, str):
        raise ValueError(f"{what}: approvers is a list of identities, not one string")
    for approver in approvers:
        try:
            check_label(approver, what="approver", limit=DOOR.identity)
        except Refused as e:
            raise ValueError(f"{what}: {e.reason}") from None
        if approver.startswith("group:") and not approver.removeprefix("group:"):
            raise ValueError(f"{what}: 'group:' needs a group name")
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise ValueError(f"{what}: quorum must be a whole number of at least 1")
    if quorum > DOOR.quorum:
        # Each vote is kept with its call until the quorum is met: bounded, like all state.
        raise ValueError(f"{what}: a quorum is at most {DOOR.quorum}")
    people = set(approvers)
    only_people = people and not any(a.startswith("group:") for a in people)
    if quorum > 1 and only_people and quorum > len(people):
        raise ValueError(
            f"{what}: a quorum of {quorum} from {len(people)} approvers can never be met"
        )


@dataclass(frozen=True)
class TrustedIssuer:
    """Verified identity: answers carry a JWT from this issuer, checked in the workflow.

    Each resume then needs ``identity_token``; the answer's identity is the token's ``email``
    (or ``sub``) and its groups come from ``groups_claim``, for ``group:NAME`` approvers. The
    keys are data in the agent's definition, recorded in history with it, so the check is
    deterministic (expiry is checked against ``workflow.now()``). RS256, ES256 and EdDSA keys
    (and RS384/512, PS256, ES384) are accepted; never a shared secret.

    Args:
        issuer: The ``iss`` tokens must have.
        audience: The ``aud`` tokens must have: give approvals an audience of their own, so
            no token meant for another service answers here.
        jwks: The issuer's public keys as a JWK Set (``{"keys": [...]}``), as its
            ``jwks_uri`` serves it. Include the next key before the issuer rotates to it: a
            conversation checks tokens against the keys its definition had at its last model
            call.
        groups_claim: The claim that lists the holder's groups.
        identity_claim: The claim that names the holder: ``email`` (the default) counts only
            when the token says ``email_verified: true``, else the identity is ``sub``; name
            another (``upn``, ``preferred_username``) if your issuer vouches for it instead.
        leeway: Clock skew allowed on ``exp`` and ``nbf``.
    """

    _: KW_ONLY
    issuer: str
    audience: str
    jwks: JsonObject
    groups_claim: str = "groups"
    identity_claim: str = "email"
    leeway: timedelta = timedelta(seconds=60)

    def spec(self) -> TrustSpec:
        return TrustSpec(
            issuer=self.issuer,
            audience=self.audience,
            jwks=self.jwks,
            groups_claim=self.groups_claim,
            identity_claim=self.identity_claim,
            leeway_seconds=self.leeway.total_seconds(),
        )

    def __post_init__(self) -> None:
        check_trust(self.spec())


@dataclass(frozen=True)
class Remind:
    """A reminder before an interrupt's deadline: ``notify`` (a tool taking a ``Notice``) runs
    ``before`` the deadline, and ``channels`` (names the agent's ``notify=`` uses, configured on
    the worker) are posted the reminder. At least one of the two."""

    _: KW_ONLY
    notify: ToolDeclaration | None = None
    before: timedelta
    channels: Sequence[str] = ()

    def spec(self) -> ReminderSpec:
        if self.before <= timedelta(0):
            raise ValueError("Remind: before must be a positive time")
        if self.notify is None and not self.channels:
            raise ValueError("Remind: give a notify tool, channels, or both")
        check_channels(self.channels, what="Remind: channels")
        return ReminderSpec(
            notify=self.notify.name if self.notify is not None else None,
            before_seconds=self.before.total_seconds(),
            channels=list(dict.fromkeys(self.channels)),
        )


@dataclass(frozen=True)
class Escalate:
    """A deadline that escalates: ``notify`` (a tool taking a ``Notice``) runs, the deadline
    is extended once by ``extend``, and when that passes too, ``then`` applies: a default
    output (None: the timed-out answer) or ``"cancel"``."""

    _: KW_ONLY
    notify: ToolDeclaration | None = None
    extend: timedelta
    then: JsonObject | Literal["cancel"] | None = None
    channels: Sequence[str] = ()

    def spec(self) -> EscalateSpec:
        if self.extend <= timedelta(0):
            raise ValueError("Escalate: extend must be a positive time")
        if self.notify is None and not self.channels:
            raise ValueError("Escalate: give a notify tool, channels, or both")
        check_channels(self.channels, what="Escalate: channels")
        cancel = self.then == "cancel"
        then = dict(self.then) if isinstance(self.then, dict) else None
        if then is not None and json_size(then) > DOOR.on_timeout:
            raise ValueError(f"Escalate: then is more than {DOOR.on_timeout} bytes of JSON")
        return EscalateSpec(
            notify=self.notify.name if self.notify is not None else None,
            channels=list(dict.fromkeys(self.channels)),
            extend_seconds=self.extend.total_seconds(),
            then=then,
            then_cancel=cancel,
        )


OnTimeout = JsonObject | Literal["cancel"] | Escalate
"""What a deadline does: answer with this output, ``"cancel"`` the turn, or ``Escalate``."""


def timeout_policy(
    on_timeout: OnTimeout | None, *, what: str
) -> tuple[JsonObject | None, bool, EscalateSpec | None]:
    """``on_timeout`` as spec data: the default output, whether it cancels, the escalation."""
    if isinstance(on_timeout, Escalate):
        return None, False, on_timeout.spec()
    if on_timeout == "cancel":
        return None, True, None
    if isinstance(on_timeout, str):
        raise ValueError(f"{what}: on_timeout is an output, 'cancel' or Escalate(...)")
    return on_timeout, False, None


MAX_CHANNELS = 8
"""The most channels one agent (or one reminder) names: each paused call schedules one activity
per channel, and each is an action Temporal Cloud bills."""


def check_channels(channels: Sequence[str], *, what: str) -> None:
    """Refuse, at import, more than :data:`MAX_CHANNELS` channel names, or a name that is not a
    short label (it names an activity's summary and a metric's label)."""
    if isinstance(channels, str):
        raise ValueError(f"{what}: a list of channel names, not one string")
    if len(set(channels)) > MAX_CHANNELS:
        raise ValueError(f"{what}: at most {MAX_CHANNELS} channels")
    for name in channels:
        if not isinstance(name, str) or not 0 < len(name) <= 64 or not name.isprintable():
            raise ValueError(f"{what}: a channel name is 1 to 64 printable characters")


def notify_tools(*policies: object) -> list[ToolDeclaration]:
    """The notifying tools named by reminders and escalations (the worker registers them)."""
    found: list[ToolDeclaration] = []
    for p in policies:
        if (
            isinstance(p, Escalate | Remind)
            and p.notify is not None
            and all(t is not p.notify for t in found)
        ):
            found.append(p.notify)
    return found


@dataclass(frozen=True)
class Agent:
    """A Gemini agent: model, system prompt, tools and policies.

    Args:
        name: The agent's durable name; conversations record it.
        model: A Gemini model id. A ``googleai/`` prefix (Genkit style) is accepted.
        system: The system instruction.
        tools: Tools and interrupt-only tools, from :func:`activities.tool` and
            :func:`activities.interrupt`.
        middleware: Policies such as :class:`ToolApproval`.
        max_turns: The most model calls one user turn may make before it ends ``max_turns``.
        interrupt_timeout: A deadline for every interrupt that has none of its own.
        on_interrupt_timeout: What that deadline does: an output to answer with,
            ``"cancel"`` (the turn is cancelled) or :class:`Escalate`.
        interrupt_reminders: :class:`Remind` s before that deadline.
        trust: Verify who answers (:class:`TrustedIssuer`); without it, identity is what the
            caller asserts, and the trust boundary is whoever holds Temporal credentials
            for the namespace.
        policy: A Cedar policy set that decides each tool call, allow, ask or deny
            (``Policy.from_file(path)`` from ``temporal_agent_interrupts.policies``); its hash
            goes into the agent's definition. A path is not taken here: the file is parsed by
            Cedar, which only the worker's side of the package imports.
        notify: The channels each paused call is announced on, by name (``["approvals"]``);
            each worker maps the names to channels it configures (``AgentsPlugin(channels=)``),
            with their secrets.
    """

    name: str
    _: KW_ONLY
    model: str = DEFAULT_MODEL
    system: str | None = None
    tools: Sequence[ToolDeclaration | ToolsetDeclaration] = ()
    middleware: Sequence[ToolApproval] = ()
    max_turns: int = DEFAULT_MAX_TURNS
    interrupt_timeout: timedelta | None = None
    on_interrupt_timeout: OnTimeout | None = None
    interrupt_reminders: Sequence[Remind] = ()
    trust: TrustedIssuer | None = None
    policy: PolicyDeclaration | None = None
    notify: Sequence[str] = ()
    _spec: AgentSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an agent needs a name")
        try:
            # A start names the agent, and is refused past this (workflows.payloads).
            check_label(self.name, what="an agent's name", limit=DOOR.agent_name)
        except Refused as e:
            raise ValueError(e.reason) from None
        keys = [t.toolset for t in self.toolsets()]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"agent {self.name!r} declares toolsets more than once: {dupes}")
        names = [t.name for t in self.own_tools()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agent {self.name!r} declares tools more than once: {dupes}")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        check_channels(self.notify, what=f"agent {self.name!r}: notify")
        if isinstance(self.policy, str | PathLike):
            # Parsing needs Cedar, a native extension this module (which the workflow sandbox
            # imports) must not: the caller's side loads the file.
            raise ValueError(
                f"agent {self.name!r}: policy= takes a Policy: "
                "Policy.from_file(path), from temporal_agent_interrupts.policies"
            )
        timeout_answer, _, _ = timeout_policy(
            self.on_interrupt_timeout, what=f"agent {self.name!r}"
        )
        if timeout_answer is not None and json_size(timeout_answer) > DOOR.on_timeout:
            raise ValueError(
                f"agent {self.name!r}: on_interrupt_timeout is more than "
                f"{DOOR.on_timeout} bytes of JSON (it answers every interrupt that times out)"
            )
        if (self.on_interrupt_timeout is not None or self.interrupt_reminders) and (
            self.interrupt_timeout is None
        ):
            raise ValueError(
                f"agent {self.name!r}: on_interrupt_timeout and interrupt_reminders need an "
                "interrupt_timeout"
            )
        # Built once: the spec is what the worker hands the workflow, and its digest lets the
        # model activity skip re-sending an unchanged definition.
        spec = self._build_spec()
        size = json_size(spec)
        if size > DOOR.spec:
            # Every conversation carries the definition in its state: refused here, at import,
            # rather than in a conversation's workflow task.
            raise ValueError(
                f"agent {self.name!r}: its definition (system prompt and tool schemas) is "
                f"{human_size(size)}; the limit is {human_size(DOOR.spec)}"
            )
        self._check_governance(spec)
        object.__setattr__(self, "_spec", spec)

    def _check_governance(self, spec: AgentSpec) -> None:
        """Refuse, at import, group approvers without verified identity and notifying tools
        that clash with the model's tools."""
        lists = [t.approvers for t in spec.tools]
        if spec.approval is not None:
            lists.append(spec.approval.approvers)
        if self.policy is not None:
            lists.append(self.policy.approvers())
        groups = sorted({a for approvers in lists for a in approvers if a.startswith("group:")})
        if groups and self.trust is None:
            raise ValueError(
                f"agent {self.name!r}: {', '.join(groups)} can only be checked against a "
                "verified identity: give the agent trust=TrustedIssuer(...), or list people"
            )
        for notify in self.notify_tools():
            same = next((t for t in self.own_tools() if t.name == notify.name), None)
            if same is not None and same is not notify:
                raise ValueError(
                    f"agent {self.name!r}: the notifying tool {notify.name!r} has the name of "
                    "another of its tools"
                )
            if notify.spec().interrupt_only:
                raise ValueError(
                    f"agent {self.name!r}: {notify.name!r} notifies someone, so it must be a "
                    "tool with a body, not an interrupt"
                )

    def notify_tools(self) -> list[ToolDeclaration]:
        """The tools reminders and escalations run (the worker registers them beside the
        model's tools; the model is not offered them)."""
        policies: list[object] = [self.on_interrupt_timeout, *self.interrupt_reminders]
        for t in self.own_tools():
            policies.extend(getattr(t, "deadline_policies", ()))
        return notify_tools(*policies)

    def own_tools(self) -> list[ToolDeclaration]:
        """The tools declared here, one by one (not those of its toolsets)."""
        return [cast(ToolDeclaration, t) for t in self.tools if not is_toolset(t)]

    def toolsets(self) -> list[ToolsetDeclaration]:
        """The toolsets (an MCP server's tools), which the model activity lists."""
        return [cast(ToolsetDeclaration, t) for t in self.tools if is_toolset(t)]

    def spec(self) -> AgentSpec:
        """The agent's definition as data, without its toolsets' tools: the model activity
        adds what they list (``activities.runtime``) before recording it in history."""
        return self._spec

    def _build_spec(self) -> AgentSpec:
        on_timeout, cancel, escalate = timeout_policy(
            self.on_interrupt_timeout, what=f"agent {self.name!r}"
        )
        approval = None
        for m in self.middleware:
            if isinstance(m, ToolApproval):
                allow = list(m.allow) if approval is None else [*approval.allow, *m.allow]
                approvers = (
                    list(m.approvers)
                    if approval is None
                    else [
                        *approval.approvers,
                        *m.approvers,
                    ]
                )
                quorum = m.quorum if approval is None else max(approval.quorum, m.quorum)
                # The stricter wins, as for the quorum.
                separate = m.separate_duties or (approval is not None and approval.separate_duties)
                approval = ApprovalSpec(
                    allow=allow, approvers=approvers, quorum=quorum, separate_duties=separate
                )
        spec = AgentSpec(
            name=self.name,
            model=self.model.removeprefix("googleai/"),
            system=self.system,
            tools=[t.spec() for t in self.own_tools()],
            approval=approval,
            max_turns=self.max_turns,
            interrupt_deadline_seconds=(
                self.interrupt_timeout.total_seconds() if self.interrupt_timeout else None
            ),
            on_interrupt_timeout=on_timeout,
            interrupt_timeout_cancel=cancel,
            interrupt_escalate=escalate,
            interrupt_reminders=[r.spec() for r in self.interrupt_reminders],
            trust=self.trust.spec() if self.trust else None,
            policy_hash=self.policy.hash if self.policy is not None else None,
            notify=list(dict.fromkeys(self.notify)),
        )
        spec.digest = spec_digest(spec)
        return spec


def spec_digest(spec: AgentSpec) -> str:
    """What names a definition exactly (``AgentSpec.digest``): the model activity sends the
    definition back only when the workflow's has another."""
    body: dict[str, Any] = spec.model_dump(mode="json", exclude={"digest"})
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:16]

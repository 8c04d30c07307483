"""``Agent`` and ``ToolApproval``: how an agent is declared on the worker.

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
from typing import Any, Protocol

from workflows.limits import (
    MAX_IDENTITY_BYTES,
    MAX_ON_TIMEOUT_BYTES,
    MAX_SPEC_BYTES,
    Refused,
    check_label,
    human_size,
    json_size,
)
from workflows.types import AgentSpec, ApprovalSpec, JsonObject, ToolSpec


class ToolDeclaration(Protocol):
    """What an agent needs of a tool: its name and its spec as data.

    :func:`activities.tool` and :func:`activities.interrupt` build the real thing; naming only
    this here keeps ``workflows/`` free of the packages that import it.
    """

    @property
    def name(self) -> str: ...

    def spec(self) -> ToolSpec: ...


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
    """

    _: KW_ONLY
    allow: Sequence[str] = ()
    approvers: Sequence[str] = ()

    def __post_init__(self) -> None:
        check_approvers(self.approvers, what="ToolApproval")


def check_approvers(approvers: Sequence[str], *, what: str) -> None:
    """Refuse, at declaration, an approver list no answer could ever satisfy.

    Raises:
        ValueError: an approver is not a one-line identity of at most 256 bytes, or names a
            group: groups need verified identity, which this release does not have yet.
    """
    if isinstance(approvers, str):
        raise ValueError(f"{what}: approvers is a list of identities, not one string")
    for approver in approvers:
        try:
            check_label(approver, what="approver", limit=MAX_IDENTITY_BYTES)
        except Refused as e:
            raise ValueError(f"{what}: {e.reason}") from None
        if approver.startswith("group:"):
            raise ValueError(
                f"{what}: {approver!r} is a group; groups need verified identity, which this "
                "release does not have yet: list the identities"
            )


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
        on_interrupt_timeout: The output an interrupt gets when that deadline passes.
    """

    name: str
    _: KW_ONLY
    model: str = DEFAULT_MODEL
    system: str | None = None
    tools: Sequence[ToolDeclaration] = ()
    middleware: Sequence[ToolApproval] = ()
    max_turns: int = DEFAULT_MAX_TURNS
    interrupt_timeout: timedelta | None = None
    on_interrupt_timeout: JsonObject | None = None
    _spec: AgentSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an agent needs a name")
        names = [t.name for t in self.tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agent {self.name!r} declares tools more than once: {dupes}")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        timeout_answer = self.on_interrupt_timeout
        if timeout_answer is not None and json_size(timeout_answer) > MAX_ON_TIMEOUT_BYTES:
            raise ValueError(
                f"agent {self.name!r}: on_interrupt_timeout is more than "
                f"{MAX_ON_TIMEOUT_BYTES} bytes of JSON (it answers every interrupt that times out)"
            )
        # Built once: the spec is what the worker hands the workflow, and its digest lets the
        # model activity skip re-sending an unchanged definition.
        spec = self._build_spec()
        size = json_size(spec)
        if size > MAX_SPEC_BYTES:
            # Every conversation carries the definition in its state: refused here, at import,
            # rather than in a conversation's workflow task.
            raise ValueError(
                f"agent {self.name!r}: its definition (system prompt and tool schemas) is "
                f"{human_size(size)}; the limit is {human_size(MAX_SPEC_BYTES)}"
            )
        object.__setattr__(self, "_spec", spec)

    def spec(self) -> AgentSpec:
        """The agent's definition as data, as recorded in conversation histories."""
        return self._spec

    def _build_spec(self) -> AgentSpec:
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
                approval = ApprovalSpec(allow=allow, approvers=approvers)
        spec = AgentSpec(
            name=self.name,
            model=self.model.removeprefix("googleai/"),
            system=self.system,
            tools=[t.spec() for t in self.tools],
            approval=approval,
            max_turns=self.max_turns,
            interrupt_deadline_seconds=(
                self.interrupt_timeout.total_seconds() if self.interrupt_timeout else None
            ),
            on_interrupt_timeout=self.on_interrupt_timeout,
        )
        body: dict[str, Any] = spec.model_dump(mode="json", exclude={"digest"})
        spec.digest = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()[:16]
        return spec

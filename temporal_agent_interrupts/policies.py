"""What happens while an interrupt waits: ``Remind`` the approvers before its deadline,
``Escalate`` at it, and the ``Notice`` their notifying tool is given; and ``Policy``, a Cedar
policy set that decides each tool call, allow, ask or deny (see Approval governance in the
docs); ``Present`` and ``Show``, how a tool's call reads to the person asked to answer it.

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.policies import Escalate, Notice, Policy, Present, Remind, Show

A namespace of its own because they are written once a team governs its approvals (an
interrupt's ``reminders=`` and ``on_timeout=``, an agent's ``policy=``), not in its first hour;
they live in ``workflows.agent``, ``workflows.types`` and ``activities.policy`` and are
re-exported here, read on first use (``Policy`` imports Cedar, a native extension).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.policy import Policy
    from temporal_agent_interrupts.workflows.agent import Escalate, Remind
    from temporal_agent_interrupts.workflows.types import Notice, Present, Show

_HOME = {
    "Remind": "workflows.agent",
    "Escalate": "workflows.agent",
    # What the notifying tool of either is given: which paused call, and why now.
    "Notice": "workflows.types",
    # A Cedar policy set: parsed on the worker's side, never in the workflow.
    "Policy": "activities.policy",
    # How a call reads to an approver (a tool's ``present=``): its summary, fields and risk.
    "Present": "workflows.types",
    "Show": "workflows.types",
}

__all__ = ["Escalate", "Notice", "Policy", "Present", "Remind", "Show"]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

"""Deterministic code only: the conversation workflow, its wire types and the agent specs.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from temporal_agent_interrupts.workflows.agent import (
    Agent,
    Escalate,
    Remind,
    ToolApproval,
    TrustedIssuer,
)
from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

__all__ = ["Agent", "AgentWorkflow", "Escalate", "Remind", "ToolApproval", "TrustedIssuer"]

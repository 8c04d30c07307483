"""Deterministic code only: the conversation workflow, its wire types and the agent specs."""

from temporal_agent_interrupts.workflows.agent import (
    Agent,
    Escalate,
    Remind,
    ToolApproval,
    TrustedIssuer,
)
from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

__all__ = ["Agent", "AgentWorkflow", "Escalate", "Remind", "ToolApproval", "TrustedIssuer"]

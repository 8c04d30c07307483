"""Deterministic code only: the conversation workflow, its wire types and the agent specs."""

from workflows.agent import Agent, Escalate, Remind, ToolApproval, TrustedIssuer
from workflows.conversation import AgentWorkflow

__all__ = ["Agent", "AgentWorkflow", "Escalate", "Remind", "ToolApproval", "TrustedIssuer"]

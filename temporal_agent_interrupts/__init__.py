"""Durable human-in-the-loop interrupts for Gemini agents, on Temporal.

The names a team needs, in three groups::

    from temporal_agent_interrupts import (
        Agent, ToolApproval, TrustedIssuer, tool, interrupt, Interrupt, ToolContext, ToolError,
        AgentsPlugin, AgentClient, Chat, FinishReason, approve, deny, respond,
    )

Authoring (what an agent is), hosting (``AgentsPlugin`` on the team's own client and worker) and
calling (``AgentClient``, ``Chat``, the answers, and the ``AgentError`` types). Everything else is
importable by its module path (``temporal_agent_interrupts.workflows.types``,
``temporal_agent_interrupts.worker.testing``, ...) and is not re-exported here.

The names resolve on first use, not at import: the workflow sandbox imports this package (the
parent of ``…workflows``) for every conversation it runs, and must not pull in the client, the
activities and google-genai each time. ``__version__`` (the installed distribution's version) is
read the same way, on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.mcp import MCPServerHTTP, MCPServerStdio, mcp_tools
    from temporal_agent_interrupts.activities.subagents import agent_tool
    from temporal_agent_interrupts.activities.tools import (
        Interrupt,
        ToolContext,
        ToolError,
        interrupt,
        tool,
    )
    from temporal_agent_interrupts.client.api import AgentClient, Chat, approve, deny, respond
    from temporal_agent_interrupts.client.stream import EventsGone
    from temporal_agent_interrupts.errors import (
        AgentError,
        CancelRejected,
        ChatNotFound,
        ConnectionConfigError,
        NoWorkerAnswered,
        ResumeRejected,
        SendRejected,
        ServerNotAnswering,
        UnknownAgent,
    )
    from temporal_agent_interrupts.worker.plugin import AgentsPlugin
    from temporal_agent_interrupts.workflows.agent import (
        Agent,
        Escalate,
        Remind,
        ToolApproval,
        TrustedIssuer,
    )
    from temporal_agent_interrupts.workflows.types import FinishReason

    __version__: str

_HOME = {
    # Authoring.
    "Agent": "workflows.agent",
    "ToolApproval": "workflows.agent",
    "TrustedIssuer": "workflows.agent",
    "Escalate": "workflows.agent",
    "Remind": "workflows.agent",
    "tool": "activities.tools",
    "interrupt": "activities.tools",
    "Interrupt": "activities.tools",
    "ToolContext": "activities.tools",
    "ToolError": "activities.tools",
    "mcp_tools": "activities.mcp",
    "MCPServerStdio": "activities.mcp",
    "MCPServerHTTP": "activities.mcp",
    "agent_tool": "activities.subagents",
    # Hosting.
    "AgentsPlugin": "worker.plugin",
    # Calling.
    "AgentClient": "client.api",
    "Chat": "client.api",
    "FinishReason": "workflows.types",
    "approve": "client.api",
    "deny": "client.api",
    "respond": "client.api",
    # What calling can raise: every one is an AgentError.
    "AgentError": "errors",
    "CancelRejected": "errors",
    "ChatNotFound": "errors",
    "ConnectionConfigError": "errors",
    "EventsGone": "client.stream",
    "NoWorkerAnswered": "errors",
    "ResumeRejected": "errors",
    "SendRejected": "errors",
    "ServerNotAnswering": "errors",
    "UnknownAgent": "errors",
}

__all__ = [
    "Agent",
    "AgentClient",
    "AgentError",
    "AgentsPlugin",
    "CancelRejected",
    "Chat",
    "ChatNotFound",
    "ConnectionConfigError",
    "Escalate",
    "EventsGone",
    "FinishReason",
    "Interrupt",
    "MCPServerHTTP",
    "MCPServerStdio",
    "NoWorkerAnswered",
    "Remind",
    "ResumeRejected",
    "SendRejected",
    "ServerNotAnswering",
    "ToolApproval",
    "ToolContext",
    "ToolError",
    "TrustedIssuer",
    "UnknownAgent",
    "agent_tool",
    "approve",
    "deny",
    "interrupt",
    "mcp_tools",
    "respond",
    "tool",
]


_DISTRIBUTION = "temporal-agent-interrupts"


# Hidden from type checkers: a module-level __getattr__ tells pyright and mypy that any name
# exists (its type Any), so `from temporal_agent_interrupts import Agnet` type-checked clean,
# in the docs' blocks and in every user's code; they read the imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name == "__version__":
            # From the installed distribution's metadata, so the version lives in pyproject.toml
            # alone; read on first use, never at import (see the module docstring).
            from importlib.metadata import PackageNotFoundError, version

            try:
                value = version(_DISTRIBUTION)
            except PackageNotFoundError:
                raise AttributeError(
                    f"{__name__}.__version__: the {_DISTRIBUTION} distribution is not installed "
                    f"(a clone on PYTHONPATH has no metadata; `make setup` installs it)"
                ) from None
            globals()[name] = value
            return value
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value  # the next lookup is an ordinary attribute
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""Durable human-in-the-loop interrupts for Gemini agents, on Temporal.

The names a team writes in its first hour, in three groups::

    from temporal_agent_interrupts import (
        Agent, ToolApproval, TrustedIssuer, tool, interrupt, Interrupt, ToolContext, ToolError,
        agent_tool, AgentsPlugin, AgentClient, Chat, FinishReason, approve, deny, respond,
        run_script, AgentError,
    )

Authoring (what an agent is), hosting (``AgentsPlugin`` on the team's own client and worker) and
calling (``AgentClient``, ``Chat``, the answers, and ``AgentError``). The rest of the public
surface is in a few namespaces, each for a later need:

- ``temporal_agent_interrupts.errors``: every error type (all are ``AgentError``\\ s);
- ``temporal_agent_interrupts.types``: what calling reads back (``TurnResult``,
  ``InterruptRequest``, ``TurnStream``, the inbox's entries, ...);
- ``temporal_agent_interrupts.policies``: ``Remind`` and ``Escalate``, for waiting interrupts;
- ``temporal_agent_interrupts.mcp``: tools from MCP servers;
- ``temporal_agent_interrupts.web``: the web front ends' ASGI app and its login;
- ``temporal_agent_interrupts.hosting``: ``build_worker()`` and the connection settings;
- ``temporal_agent_interrupts.testing``: the kit for an agent's tests, and its pytest plugin.

The root and those namespaces' ``__all__`` are the public API, kept stable through 0.1.x (see
CHANGELOG.md); every other module is internal, importable but not covered by that promise. The
names that left the root for a namespace still resolve here until 0.2, with a
``DeprecationWarning`` that names their new home.

The names resolve on first use, not at import: the workflow sandbox imports this package (the
parent of ``…workflows``) for every conversation it runs, and must not pull in the client, the
activities and google-genai each time. ``__version__`` (the installed distribution's version) is
read the same way, on first use.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.subagents import agent_tool
    from temporal_agent_interrupts.activities.tools import (
        Interrupt,
        ToolContext,
        ToolError,
        interrupt,
        tool,
    )
    from temporal_agent_interrupts.client.api import (
        AgentClient,
        Chat,
        approve,
        deny,
        respond,
        run_script,
    )
    from temporal_agent_interrupts.errors import AgentError
    from temporal_agent_interrupts.worker.plugin import AgentsPlugin
    from temporal_agent_interrupts.workflows.agent import Agent, ToolApproval, TrustedIssuer
    from temporal_agent_interrupts.workflows.types import FinishReason

    __version__: str

# Each root name, where it lives, and why it is at the root: a team writes it in its first hour.
_HOME = {
    # Authoring: the agent, its tools, and the gates that pause them.
    "Agent": "workflows.agent",  # every agent is one
    "ToolApproval": "workflows.agent",  # the gate on every tool not allowed outright
    "TrustedIssuer": "workflows.agent",  # who may answer: trust is set with the agent
    "tool": "activities.tools",  # the decorator every tool is written with
    "interrupt": "activities.tools",  # the interrupt-only tool: asking a human is the product
    "Interrupt": "activities.tools",  # what a tool raises to pause for a human
    "ToolContext": "activities.tools",  # a resumed tool reads its answer from it
    "ToolError": "activities.tools",  # a tool's classified failure, without retries
    "agent_tool": "activities.subagents",  # agents as tools: composing agents is authoring
    # Hosting.
    "AgentsPlugin": "worker.plugin",  # the one registration point, on the team's own worker
    # Calling.
    "AgentClient": "client.api",  # the first thing a caller constructs
    "Chat": "client.api",  # a conversation: send, resume, pending
    "FinishReason": "workflows.types",  # every turn's result is branched on it
    "approve": "client.api",  # the answers every interrupt needs: yes,
    "deny": "client.api",  # no (with a reason),
    "respond": "client.api",  # or the tool's output, supplied by the human
    "run_script": "client.api",  # the first script's last line (the SDK's exit abort)
    "AgentError": "errors",  # the one error to catch; its subclasses are in .errors
}

# Names the root exported before 0.1.0's stated surface, and the namespace each moved to: they
# resolve here with a DeprecationWarning until 0.2, then only there.
_MOVED = {
    "Remind": "policies",
    "Escalate": "policies",
    "mcp_tools": "mcp",
    "MCPServerStdio": "mcp",
    "MCPServerHTTP": "mcp",
    "CancelRejected": "errors",
    "ChatNotFound": "errors",
    "ConnectionConfigError": "errors",
    "EventsGone": "errors",
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
    "Chat",
    "FinishReason",
    "Interrupt",
    "ToolApproval",
    "ToolContext",
    "ToolError",
    "TrustedIssuer",
    "agent_tool",
    "approve",
    "deny",
    "interrupt",
    "respond",
    "run_script",
    "tool",
]


_DISTRIBUTION = "temporal-agent-interrupts"


# Hidden from type checkers: a module-level __getattr__ tells pyright and mypy that any name
# exists (its type Any), so `from temporal_agent_interrupts import Agnet` type-checked clean,
# in the docs' blocks and in every user's code; they read the imports above instead (and so
# flag a moved name, whose new path the warning below gives at run time).
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
        moved = _MOVED.get(name)
        if moved is not None and _from_import_check():
            # `from ... import name` first asks whether a submodule is called that; the import
            # itself comes next and warns, so the statement warns once.
            return getattr(importlib.import_module(f"{__name__}.{moved}"), name)
        if moved is not None:
            # Not cached in globals(): every import of the old path warns, not only the first.
            warnings.warn(
                f"{__name__}.{name} is deprecated and will be removed in 0.2: import it from "
                f"{__name__}.{moved} (`from {__name__}.{moved} import {name}`)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(f"{__name__}.{moved}"), name)
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value  # the next lookup is an ordinary attribute
        return value


def _from_import_check() -> bool:
    """Whether the import system's ``_handle_fromlist`` is what looks the name up (two frames
    up: this function's caller is ``__getattr__``)."""
    caller = sys._getframe(2).f_code
    return caller.co_name == "_handle_fromlist" and "importlib" in caller.co_filename


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

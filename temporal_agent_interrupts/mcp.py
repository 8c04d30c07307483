"""Tools from MCP servers: ``mcp_tools(server)`` in an agent's ``tools=``, for a server the
worker starts (``MCPServerStdio``) or reaches over Streamable HTTP (``MCPServerHTTP``).

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.mcp import MCPServerStdio, mcp_tools

A namespace of its own because MCP is one way among others to give an agent tools, and these
names belong together; they live in ``activities.mcp``, which imports the ``mcp`` package, so
they are read on first use: the workflow sandbox imports the package root, never this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.mcp import (
        MCPServerHTTP,
        MCPServerStdio,
        MCPToolset,
        mcp_tools,
    )

_HOME = {
    "mcp_tools": "activities.mcp",
    "MCPServerStdio": "activities.mcp",
    "MCPServerHTTP": "activities.mcp",
    # What mcp_tools() returns, for an agent's tools=[...] annotated by hand.
    "MCPToolset": "activities.mcp",
}

__all__ = ["MCPServerHTTP", "MCPServerStdio", "MCPToolset", "mcp_tools"]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

"""Everything with I/O: the model call, the tool runner, and the tool authoring API."""

from activities.tools import Interrupt, Tool, ToolContext, ToolError, interrupt, tool

__all__ = ["Interrupt", "Tool", "ToolContext", "ToolError", "interrupt", "tool"]

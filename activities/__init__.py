"""Everything with I/O: the model call, the tool runner, and the tool authoring API."""

from activities.tools import Interrupt, Tool, ToolContext, ToolError, interrupt, tool
from workflows.types import Notice

__all__ = ["Interrupt", "Notice", "Tool", "ToolContext", "ToolError", "interrupt", "tool"]

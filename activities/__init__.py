"""Everything with I/O: the model call, the tool runner, and the tool authoring API."""

from temporal_agent_interrupts.activities.tools import (
    Interrupt,
    Tool,
    ToolContext,
    ToolError,
    interrupt,
    tool,
)
from temporal_agent_interrupts.workflows.types import Notice

__all__ = ["Interrupt", "Notice", "Tool", "ToolContext", "ToolError", "interrupt", "tool"]

"""Calling agents: ``AgentClient``, ``Chat``, result types and errors."""

from client.api import (
    DEFAULT_TASK_QUEUE,
    AgentClient,
    AgentError,
    Chat,
    ConnectionConfigError,
    NoWorkerAnswered,
    ResumeRejected,
    SendRejected,
    approve,
    connect_config,
    deny,
    exit_now,
    run_script,
)
from workflows.types import (
    ErrorInfo,
    FinishReason,
    InterruptRequest,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnResult,
)

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "AgentClient",
    "AgentError",
    "Chat",
    "ConnectionConfigError",
    "ErrorInfo",
    "FinishReason",
    "InterruptRequest",
    "NoWorkerAnswered",
    "ResumeRejected",
    "SendRejected",
    "StatusResult",
    "ToolResponse",
    "ToolRestart",
    "TurnResult",
    "approve",
    "connect_config",
    "deny",
    "exit_now",
    "run_script",
]

"""What calling reads back: a turn's result and its interrupts, the answers, a stream's events,
what a conversation reports, the inbox's entries, the audit report and its decision receipts
(with ``verify_chain``, which checks them with no server); and what a tool writes with: the
``Tool`` type, ``ToolError``'s ``Status``, and the approval vocabulary's words.

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.types import InterruptRequest, TurnResult

A namespace of its own because a caller annotates with these types but rarely writes them in
its first hour (``chat.send()`` returns a ``TurnResult`` whether it is imported or not); they
live in ``workflows.types`` (the wire models) and ``client`` (what the client assembles), and
are re-exported here, each read on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.tools import Tool
    from temporal_agent_interrupts.client.audit import AuditReport, UntrustedRun
    from temporal_agent_interrupts.client.inbox import InboxPage, PausedChat, PausedInterrupt
    from temporal_agent_interrupts.client.receipts import ChainCheck, verify_chain
    from temporal_agent_interrupts.client.stream import TurnStream
    from temporal_agent_interrupts.workflows.types import (
        APPROVED,
        FEEDBACK,
        TIMED_OUT,
        TOOL_APPROVED,
        AnswerRecord,
        ConversationResult,
        ErrorInfo,
        Grant,
        GrantCondition,
        GrantScope,
        HistoryResult,
        InterruptRequest,
        Message,
        Part,
        PendingResult,
        Receipt,
        ReceiptBody,
        ReceiptChain,
        Rejection,
        RejectionsResult,
        Requester,
        Shown,
        ShownField,
        Status,
        StatusResult,
        ToolResponse,
        ToolRestart,
        TurnAnswer,
        TurnEvent,
        TurnResult,
        Vote,
    )

_HOME = {
    # A turn and its interrupts (workflows.types: the wire models).
    "TurnResult": "workflows.types",
    "ErrorInfo": "workflows.types",
    "InterruptRequest": "workflows.types",
    "Vote": "workflows.types",
    "Requester": "workflows.types",
    # What a person is shown of a paused call (InterruptRequest.shown).
    "Shown": "workflows.types",
    "ShownField": "workflows.types",
    # The answers approve(), deny() and respond() build.
    "ToolResponse": "workflows.types",
    "ToolRestart": "workflows.types",
    # What an approval may remember (approve(..., remember=GrantScope(...))), and the grants
    # it makes (Chat.grants()).
    "GrantScope": "workflows.types",
    "GrantCondition": "workflows.types",
    "Grant": "workflows.types",
    # Streaming a turn.
    "TurnStream": "client.stream",
    "TurnEvent": "workflows.types",
    "TurnAnswer": "workflows.types",
    # What a conversation reports.
    "StatusResult": "workflows.types",
    "HistoryResult": "workflows.types",
    "PendingResult": "workflows.types",
    "RejectionsResult": "workflows.types",
    "ConversationResult": "workflows.types",
    "Message": "workflows.types",
    "Part": "workflows.types",
    "Rejection": "workflows.types",
    "AnswerRecord": "workflows.types",
    "AuditReport": "client.audit",
    "UntrustedRun": "client.audit",
    # Decision receipts (AnswerRecord.receipt), the chain file agentctl audit --export writes,
    # and the check anyone can run on it with the workers' public keys: no server, no Temporal.
    "Receipt": "workflows.types",
    "ReceiptBody": "workflows.types",
    "ReceiptChain": "workflows.types",
    "verify_chain": "client.receipts",
    "ChainCheck": "client.receipts",
    # The inbox (AgentClient.pending() and pending_page()).
    "PausedChat": "client.inbox",
    "PausedInterrupt": "client.inbox",
    "InboxPage": "client.inbox",
    # What tool() and interrupt() return, for an agent's tools=[...] annotated by hand.
    "Tool": "activities.tools",
    # What a tool writes: ToolError's status (a string works too), and the approval vocabulary's
    # words, which are on the wire and in recorded histories, spelled once in workflows.types.
    "Status": "workflows.types",
    "TOOL_APPROVED": "workflows.types",
    "APPROVED": "workflows.types",
    "FEEDBACK": "workflows.types",
    "TIMED_OUT": "workflows.types",
}

__all__ = [
    "APPROVED",
    "FEEDBACK",
    "TIMED_OUT",
    "TOOL_APPROVED",
    "AnswerRecord",
    "AuditReport",
    "ChainCheck",
    "ConversationResult",
    "ErrorInfo",
    "Grant",
    "GrantCondition",
    "GrantScope",
    "HistoryResult",
    "InboxPage",
    "InterruptRequest",
    "Message",
    "Part",
    "PausedChat",
    "PausedInterrupt",
    "PendingResult",
    "Receipt",
    "ReceiptBody",
    "ReceiptChain",
    "Rejection",
    "RejectionsResult",
    "Requester",
    "Shown",
    "ShownField",
    "Status",
    "StatusResult",
    "Tool",
    "ToolResponse",
    "ToolRestart",
    "TurnAnswer",
    "TurnEvent",
    "TurnResult",
    "TurnStream",
    "UntrustedRun",
    "Vote",
    "verify_chain",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

"""The product's durable names, as the client reads them from Temporal.

The workflow module defines them (``workflows/conversation.py``'s ``@workflow.defn(name=...)``);
the client compares what visibility and histories say against them, with no workflow code to
ask. ``tests/test_durable_names.py`` checks them against a running conversation.
"""

from __future__ import annotations

WORKFLOW_TYPE = "AgentWorkflow"
"""The workflow type of every conversation (``AgentWorkflow``'s ``@workflow.defn`` name)."""

__all__ = ["WORKFLOW_TYPE"]

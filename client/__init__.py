"""Calling agents: ``AgentClient`` and ``Chat`` (``client/api.py``), the inbox, the stream, the
audit trail and ``agentctl``.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Nothing is re-exported here: the names a caller needs are at the package root
(``from temporal_agent_interrupts import AgentClient, Chat, approve, ...``) and in its
namespaces (``temporal_agent_interrupts.types.PausedInterrupt``, ``.errors``, ``.web``, ...).
"""

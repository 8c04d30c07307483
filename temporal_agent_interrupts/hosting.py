"""Running agents outside the plugin-on-your-own-worker path: ``build_worker()`` for a worker of
agents only, the connection settings every entry point shares (``connect_config``,
``DEFAULT_TASK_QUEUE``), ``metrics_runtime`` for an embedding application's Prometheus
endpoint, the namespace's search attributes (``setup_search_attributes``, and the
``MissingSearchAttributes`` a worker refuses to start with), and the channels paused calls are
announced on (``Channel``, the ``NotifyInput`` each call of one is given, ``EmailChannel``, and
``SlackChannel`` with its ``SlackDirectory``).

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.hosting import build_worker, connect_config

A namespace of its own because a team that already runs a Temporal worker needs only
``AgentsPlugin`` (at the root); these are for a process that serves agents alone, or a script
that connects the way ``agent-worker`` and ``agentctl`` do. They live in ``worker`` (which
imports google-genai) and ``connection``, and are read on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.activities.email import EmailChannel
    from temporal_agent_interrupts.activities.notify import Channel
    from temporal_agent_interrupts.activities.slack import SlackChannel, SlackDirectory
    from temporal_agent_interrupts.connection import DEFAULT_TASK_QUEUE, connect_config
    from temporal_agent_interrupts.search_attributes import (
        MissingSearchAttributes,
        setup_search_attributes,
    )
    from temporal_agent_interrupts.worker import DEFAULT_MAX_CACHED_WORKFLOWS, build_worker
    from temporal_agent_interrupts.worker.observability import metrics_runtime
    from temporal_agent_interrupts.workflows.activity_io import NotifyInput

_HOME = {
    "build_worker": "worker",
    "DEFAULT_MAX_CACHED_WORKFLOWS": "worker",
    "connect_config": "connection",
    "DEFAULT_TASK_QUEUE": "connection",
    "metrics_runtime": "worker.observability",
    "setup_search_attributes": "search_attributes",
    "MissingSearchAttributes": "search_attributes",
    # Where paused calls are announced (build_worker(channels=...)): the protocol a channel
    # implements, and what each call of it is given.
    "Channel": "activities.notify",
    "NotifyInput": "workflows.activity_io",
    "EmailChannel": "activities.email",
    "SlackChannel": "activities.slack",
    "SlackDirectory": "activities.slack",
}

__all__ = [
    "DEFAULT_MAX_CACHED_WORKFLOWS",
    "DEFAULT_TASK_QUEUE",
    "Channel",
    "EmailChannel",
    "MissingSearchAttributes",
    "NotifyInput",
    "SlackChannel",
    "SlackDirectory",
    "build_worker",
    "connect_config",
    "metrics_runtime",
    "setup_search_attributes",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

"""Which agents a worker hosts, in its Temporal identity, and who else polls its task queue.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Every worker on a task queue must host the same agents: whichever polls first takes a
conversation's model and tool calls, so a second worker with other agents on the same queue fails
the turns it picks up (``no agent named ...``). Nothing in Temporal stops that, so each worker
names its agents in its identity (shown in the UI's Workers tab too) and ``agent-worker``
looks at the queue's other pollers when it starts.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from temporal_agent_interrupts.workflows import Agent

_MARK = " agents="
# Identities are shown, not parsed by Temporal; keep them to a line.
_MAX_NAMES = 160
# The server lists a poller for minutes after it last polled; a worker that stopped a minute ago
# is not a peer.
RECENT = timedelta(seconds=70)


def agents_digest(names: Sequence[str]) -> str:
    """A short digest of a set of agent names: equal for workers hosting the same agents."""
    return hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()[:8]


def worker_identity(agents: Sequence[Agent]) -> str:
    """``pid@host agents=a,b#digest``: the SDK's default identity, plus what the worker hosts."""
    names = sorted({a.name for a in agents})
    shown = ",".join(names)
    if len(shown) > _MAX_NAMES:
        shown = shown[: _MAX_NAMES - 1] + "…"
    return f"{os.getpid()}@{socket.gethostname()}{_MARK}{shown}#{agents_digest(names)}"


async def unlike_peers(
    client: Client, *, task_queue: str, agents: Sequence[Agent], identity: str | None = None
) -> list[str]:
    """Identities of other workers polling ``task_queue`` lately that host other agents.

    Workers that do not name their agents (another program's, or before this release) are
    left out: nothing can be said about them.
    """
    ours = agents_digest([a.name for a in agents])
    now = datetime.now(UTC)
    found: set[str] = set()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=kind,
            )
        )
        for poller in described.pollers:
            if poller.identity == identity or _MARK not in poller.identity:
                continue
            seen = poller.last_access_time.ToDatetime(tzinfo=UTC)
            if now - seen > RECENT:
                continue
            if poller.identity.rpartition("#")[2] != ours:
                found.add(poller.identity)
    return sorted(found)

"""How long decisions take: ``agentctl stats``, per agent and tool, for a time window.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The same measures as the worker's metrics (``workflows.telemetry``), read back from what
Temporal keeps rather than counted as they happen, so they hold across worker restarts and need
no worker at all:

- pending now: the paused chats visibility lists (``client.inbox``), each interrupt of their
  memo once (a sub-agent's interrupt shown on its caller is counted on the sub-agent's chat);
- decided in the window: each chat's audit trail (``client.audit``), read for the chats
  visibility lists as running, or closed since the window began. Each pause counts once, by
  the first record that ended it: approved, denied, answered (an interrupt-only question's
  answer), edited, defaulted (a deadline answered it with a declared default), expired (a
  deadline answered it with the stated timed-out answer, or cancelled its turn) or cancelled
  (withdrawn with its turn). Votes, stale approvals and grant revocations end no pause.
- time to decision: a record's ``at`` minus its ``since`` (when the call paused), for the
  approvals, denials, answers and edits, as the ``agent_interrupt_wait_seconds`` histogram.
  Records written before ``since`` was recorded count without a time, and their
  cancellations not at all (whether such a call was still pending is not on record).

The work is bounded: at most ``limit`` chats are read for each of the two (the paused ones and
those with answers); :class:`Stats` says when more matched. :func:`tally` is pure.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel

from temporal_agent_interrupts.client.inbox import MAX_PAGE_SIZE, PausedChat, check_agent_name
from temporal_agent_interrupts.errors import AgentError
from temporal_agent_interrupts.workflows.config import AGENT_NAME, WORKFLOW_TYPE
from temporal_agent_interrupts.workflows.telemetry import SETTLING, deadline_outcome
from temporal_agent_interrupts.workflows.types import AnswerRecord

if TYPE_CHECKING:
    from temporal_agent_interrupts.client.api import AgentClient

DEFAULT_LIMIT = 500
"""Chats ``agentctl stats`` reads at most, of each kind, unless told otherwise."""

# How many chats' audit trails are read at once.
_PARALLEL_READS = 8

UNKNOWN_AGENT = "unknown"
"""The agent of a chat whose search attributes do not name one."""


class DecisionTimes(BaseModel):
    """Seconds from a call paused to the answer that decided it (nearest-rank percentiles)."""

    count: int = 0
    median: float | None = None
    p90: float | None = None
    max: float | None = None


class ToolStats(BaseModel):
    """One agent's tool: its calls pending now, and the pauses decided in the window."""

    agent: str
    tool: str
    pending: int = 0
    """Paused now, waiting on a human."""
    oldest_since: datetime | None = None
    """When the longest waiting of them paused."""
    approved: int = 0
    denied: int = 0
    answered: int = 0
    edited: int = 0
    defaulted: int = 0
    expired: int = 0
    cancelled: int = 0
    decision_seconds: DecisionTimes = DecisionTimes()


@dataclass
class _Row:
    pending: int = 0
    oldest_since: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)


def outcome(record: AnswerRecord) -> str | None:
    """How a record ended its pause: a :class:`ToolStats` count's name, or None when it ends
    none (a vote, a stale approval, a grant revoked, a call a grant or the policy set let
    through unasked)."""
    if record.kind == "deadline":
        return "defaulted" if deadline_outcome(record.output) == "default" else "expired"
    if record.decision == "cancelled":
        return "expired" if record.via == "deadline" else "cancelled"
    if record.decision in SETTLING:
        if record.since is None and record.via in ("grant", "policy"):
            return None
        return record.decision
    return None


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``ordered`` (sorted, not empty)."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def times(waits: Iterable[float]) -> DecisionTimes:
    ordered = sorted(waits)
    if not ordered:
        return DecisionTimes()
    return DecisionTimes(
        count=len(ordered),
        median=nearest_rank(ordered, 0.5),
        p90=nearest_rank(ordered, 0.9),
        max=ordered[-1],
    )


def tally(
    paused: Iterable[PausedChat],
    trails: Mapping[str, tuple[str, Sequence[AnswerRecord]]],
    *,
    since: datetime,
    until: datetime,
) -> list[ToolStats]:
    """Per agent and tool, sorted: what ``paused`` waits on now, and what the ``trails`` (each
    chat's agent and audit records, by chat id) decided in ``[since, until)``."""
    rows: dict[tuple[str, str], _Row] = {}
    for chat in paused:
        for interrupt in chat.interrupts:
            if interrupt.path or interrupt.chat_id:
                continue  # a sub-agent's: counted on its own chat
            row = rows.setdefault((chat.agent or UNKNOWN_AGENT, interrupt.name), _Row())
            row.pending += 1
            if interrupt.since is not None and (
                row.oldest_since is None or interrupt.since < row.oldest_since
            ):
                row.oldest_since = interrupt.since
    for agent, records in trails.values():
        ended: set[tuple[str, datetime]] = set()
        for record in records:
            if record.chat_id is not None:
                continue  # a sub-agent's record: counted on its own chat
            how = outcome(record)
            if how is None:
                continue
            if record.since is not None:
                pause = (record.ref, record.since)
                if pause in ended:
                    continue  # a call already decided, withdrawn with its turn
                ended.add(pause)
            elif how in ("cancelled", "expired") and record.kind == "cancel":
                continue  # withdrawn, and never paused
            if not since <= record.at < until:
                continue
            row = rows.setdefault((agent, record.name), _Row())
            row.counts[how] = row.counts.get(how, 0) + 1
            if how in SETTLING and record.since is not None:
                row.waits.append(max((record.at - record.since).total_seconds(), 0.0))
    return [
        ToolStats(
            agent=agent,
            tool=tool,
            pending=row.pending,
            oldest_since=row.oldest_since,
            decision_seconds=times(row.waits),
            **row.counts,
        )
        for (agent, tool), row in sorted(rows.items())
    ]


def window_query(*, since: datetime, agent: str | None, task_queues: Sequence[str] | None) -> str:
    """The visibility query for the chats that may have answers after ``since``: those still
    running, and those closed since."""
    at = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    query = f'WorkflowType="{WORKFLOW_TYPE}" AND (ExecutionStatus="Running" OR CloseTime >= "{at}")'
    if agent is not None:
        check_agent_name(agent)
        query += f' AND AgentName="{agent}"'
    if task_queues:
        for queue in task_queues:
            check_agent_name(queue)  # the same characters are refused
        query += " AND (" + " OR ".join(f'TaskQueue="{q}"' for q in task_queues) + ")"
    return query


class StatsReport(BaseModel):
    """What :func:`read_stats` found, and how much of it it read."""

    tools: list[ToolStats] = []
    paused_read: int = 0
    """Paused chats read (their memos, from visibility)."""
    paused_cut: bool = False
    """More chats were paused than the limit: ``pending`` counts those read only."""
    trails_read: int = 0
    """Chats whose audit trail was read (running, or closed in the window)."""
    trails_cut: bool = False
    """More chats matched than the limit: the decisions are those of the chats read."""
    unreadable: dict[str, str] = {}
    """Chats whose audit trail could not be read, by chat id: why."""


async def _paused(
    agents: AgentClient, *, agent: str | None, limit: int
) -> tuple[list[PausedChat], bool]:
    found: list[PausedChat] = []
    cursor: str | None = None
    while True:
        page = await agents.pending_page(
            agent=agent, limit=min(MAX_PAGE_SIZE, limit + 1 - len(found)), cursor=cursor
        )
        found += page.chats
        cursor = page.next_cursor
        if len(found) > limit:
            return found[:limit], True
        if cursor is None:
            return found, False


async def _window_chats(
    agents: AgentClient, *, since: datetime, agent: str | None, limit: int
) -> tuple[dict[str, str], bool]:
    """Chat id to agent, for at most ``limit`` chats (visibility lists each run: a chat that
    continued as new is listed once per run)."""
    query = window_query(since=since, agent=agent, task_queues=[agents.task_queue])
    chats: dict[str, str] = {}
    async for wf in agents.temporal.list_workflows(query, page_size=MAX_PAGE_SIZE):
        if wf.id in chats:
            continue
        if len(chats) == limit:
            return chats, True
        chats[wf.id] = wf.typed_search_attributes.get(AGENT_NAME) or UNKNOWN_AGENT
    return chats, False


async def read_stats(
    agents: AgentClient,
    *,
    since: datetime,
    until: datetime,
    agent: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> StatsReport:
    """Per agent and tool, what is pending now and what was decided in ``[since, until)``, on
    ``agents``' task queue (see the module's docstring). Reads visibility and histories only:
    no worker is asked.

    Raises:
        ValueError: ``agent`` cannot be put in a visibility query, or ``limit`` is below 1.
        temporalio.service.RPCError: a visibility query failed.
    """
    if limit < 1:
        raise ValueError("limit is at least 1")
    paused, paused_cut = await _paused(agents, agent=agent, limit=limit)
    chats, trails_cut = await _window_chats(agents, since=since, agent=agent, limit=limit)
    gate = asyncio.Semaphore(_PARALLEL_READS)
    trails: dict[str, tuple[str, Sequence[AnswerRecord]]] = {}
    unreadable: dict[str, str] = {}

    async def read(chat_id: str, chat_agent: str) -> None:
        async with gate:
            try:
                report = await agents.audit_report(chat_id)
            except AgentError as e:
                unreadable[chat_id] = str(e)
                return
        trails[chat_id] = (chat_agent, report.records)

    await asyncio.gather(*(read(c, a) for c, a in chats.items()))
    return StatsReport(
        tools=tally(paused, trails, since=since, until=until),
        paused_read=len(paused),
        paused_cut=paused_cut,
        trails_read=len(trails),
        trails_cut=trails_cut,
        unreadable=dict(sorted(unreadable.items())),
    )


__all__ = [
    "DEFAULT_LIMIT",
    "DecisionTimes",
    "StatsReport",
    "ToolStats",
    "nearest_rank",
    "outcome",
    "read_stats",
    "tally",
    "times",
    "window_query",
]

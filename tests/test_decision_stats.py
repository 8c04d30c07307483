"""How long decisions take: the worker's metrics read by an in-memory reader, and ``agentctl
stats`` reading the same from visibility and the audit trail.

A scripted run on the session's dev server (approve one call, deny one, one interrupt that
expires to its declared default, one call left paused), on a worker whose workflow cache is
off, so that every workflow task replays the run so far: the counts must still be exact. The
reader is Temporal's ``MetricBuffer``, the runtime's own in-memory export.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.runtime import BufferedMetricUpdate, MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from temporal_agent_interrupts import FinishReason, interrupt
from temporal_agent_interrupts.activities.telemetry import NOTIFICATIONS, count_notification
from temporal_agent_interrupts.client.stats import outcome, tally, times
from temporal_agent_interrupts.client.views import StatsOutput
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.telemetry import (
    INTERRUPT_WAIT,
    INTERRUPTS_ANSWERED,
    INTERRUPTS_EXPIRED,
    INTERRUPTS_RAISED,
    INTERRUPTS_SETTLED,
)
from temporal_agent_interrupts.workflows.types import AnswerRecord
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually, server_address

AGENTCTL = Path(sys.executable).parent / "agentctl"

hurry = interrupt(
    "hurry",
    "Ask a human who has a second to answer.",
    input=t.Ask,
    output=t.Answer,
    timeout=timedelta(seconds=1),
    on_timeout={"approved": False, "note": "nobody had a second"},
)


class Reader:
    """Every update the runtime's metric buffer has handed over so far, kept."""

    def __init__(self, buffer: MetricBuffer) -> None:
        self.buffer = buffer
        self.updates: list[BufferedMetricUpdate] = []

    async def read(self) -> Reader:
        self.updates += self.buffer.retrieve_updates()
        return self

    def counts(self, name: str, *, agent: str, by: tuple[str, ...]) -> dict[tuple[Any, ...], int]:
        """A counter's total per the ``by`` labels' values (the buffer hands over deltas)."""
        found: Counter[tuple[Any, ...]] = Counter()
        for u in self._of(name, agent):
            found[tuple(u.attributes.get(k) for k in by)] += int(u.value)
        return dict(found)

    def observations(self, name: str, *, agent: str, tool: str) -> list[float]:
        return [float(u.value) for u in self._of(name, agent) if u.attributes.get("tool") == tool]

    def _of(self, name: str, agent: str) -> Iterable[BufferedMetricUpdate]:
        return (
            u for u in self.updates if u.metric.name == name and u.attributes.get("agent") == agent
        )


@pytest.fixture(scope="module")
async def buffered(env: WorkflowEnvironment) -> tuple[Client, Reader]:
    """A client on the session's server whose runtime exports its metrics to memory."""
    buffer = MetricBuffer(100_000)
    client = await Client.connect(
        server_address(env.client),
        namespace=env.client.namespace,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
        data_converter=env.client.data_converter,
    )
    return client, Reader(buffer)


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def agentctl(client: Client, *args: str, task_queue: str) -> Ran:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(
        TEMPORAL_ADDRESS=server_address(client),
        TEMPORAL_NAMESPACE=client.namespace,
        AGENT_TASK_QUEUE=task_queue,
        COLUMNS="200",
        NO_COLOR="1",
    )
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return Ran(proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode())


async def test_a_scripted_run_is_counted_exactly_and_agentctl_stats_agrees(buffered, client):
    metered, reader = buffered
    agent = Agent(
        f"decided-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup, t.charge, hurry],
        # lookup waits for approval; hurry is a question with a deadline and a default.
        middleware=[ToolApproval(allow=["charge"])],
    )
    model = ScriptedModel(
        [
            calls(("lookup", {"key": "a"}, "r-approve")),
            text("looked up"),
            calls(("lookup", {"key": "b"}, "r-deny")),
            text("as you wish"),
            calls(("hurry", {"question": "quick?"}, "r-hurry")),
            text("too late"),
            calls(("lookup", {"key": "c"}, "r-wait")),
        ]
    )
    async with hosted(metered, agents=[agent], model=model, max_cached_workflows=0) as agents:
        approved = await agents.chat(agent.name)
        (call,) = (await approved.send("look a up")).interrupts
        # While it waits: raised, not settled.
        name = agent.name
        await eventually(
            reader.read,
            lambda r: r.counts(INTERRUPTS_RAISED, agent=name, by=("tool",)) == {("lookup",): 1},
            timeout=15,
            interval=0.1,
        )
        assert reader.counts(INTERRUPTS_SETTLED, agent=name, by=("tool",)) == {}
        assert (await approved.resume(answers=[call.approve()])).text == "looked up"

        denied = await agents.chat(agent.name)
        (call,) = (await denied.send("look b up")).interrupts
        assert (await denied.resume(answers=[call.deny("no")])).text == "as you wish"

        defaulted = await agents.chat(agent.name)
        (late,) = (await defaulted.send("hurry")).interrupts
        assert late.deadline is not None
        # The deadline passes on the dev server (a real second), its default answers.
        await eventually(
            defaulted.last_turn,
            lambda r: r is not None and r.finish_reason == FinishReason.STOP,
            timeout=15,
        )

        waiting = await agents.chat(agent.name)
        (still,) = (await waiting.send("look c up")).interrupts
        chats = (approved, denied, defaulted, waiting)

        def settled(r: Reader) -> bool:
            return (
                r.counts(INTERRUPTS_SETTLED, agent=name, by=("tool",))
                == {
                    ("lookup",): 2,
                    ("hurry",): 1,
                }
                and r.counts(INTERRUPTS_RAISED, agent=name, by=("tool",)).get(("lookup",)) == 3
            )

        await eventually(reader.read, settled, timeout=15, interval=0.1)
        raised = reader.counts(INTERRUPTS_RAISED, agent=name, by=("tool",))
        assert raised == {("lookup",): 3, ("hurry",): 1}
        # Pending: raised minus settled, one call of lookup.
        settled_counts = reader.counts(INTERRUPTS_SETTLED, agent=name, by=("tool",))
        pending = {tool: n - settled_counts.get(tool, 0) for tool, n in raised.items()}
        assert pending == {("lookup",): 1, ("hurry",): 0}
        assert reader.counts(INTERRUPTS_ANSWERED, agent=name, by=("tool", "decision")) == {
            ("lookup", "approved"): 1,
            ("lookup", "denied"): 1,
        }
        assert reader.counts(INTERRUPTS_EXPIRED, agent=name, by=("tool", "outcome")) == {
            ("hurry", "default"): 1
        }
        # One time-to-decision observation per decided call, in seconds; none for the default.
        waits = reader.observations(INTERRUPT_WAIT, agent=name, tool="lookup")
        assert len(waits) == 2 and all(0 < w < 60 for w in waits), waits
        assert reader.observations(INTERRUPT_WAIT, agent=name, tool="hurry") == []
        # Bounded labels: never a chat id or a ref.
        labels = {v for u in reader.updates for v in u.attributes.values()}
        assert not labels & {c.id for c in chats}
        assert not labels & {"r-approve", "r-deny", "r-hurry", "r-wait"}

        # agentctl stats reads the same back from visibility and the audit trail (no worker
        # needed, but one is running: the paused chat stays paused).
        def agrees(ran: Ran) -> bool:
            if ran.code != 0:
                return False
            rows = {row.tool: row for row in StatsOutput.model_validate_json(ran.out).tools}
            return set(rows) == {"lookup", "hurry"} and rows["lookup"].pending == 1

        ran = await eventually(
            lambda: agentctl(
                metered,
                "stats",
                "--since",
                "1h",
                "--agent",
                name,
                "--json",
                task_queue=agents.task_queue,
            ),
            agrees,
            timeout=20,
            interval=0.5,
        )
    stats = StatsOutput.model_validate_json(ran.out)
    assert stats.agent == name and not stats.trails_cut and not stats.paused_cut
    assert stats.trails_read == 4 and stats.paused_read == 1 and not stats.unreadable
    lookup, hurried = sorted(stats.tools, key=lambda row: row.tool != "lookup")
    assert (lookup.tool, lookup.pending, lookup.approved, lookup.denied) == ("lookup", 1, 1, 1)
    assert (lookup.defaulted, lookup.expired, lookup.cancelled) == (0, 0, 0)
    assert lookup.oldest_since is not None and lookup.oldest_since == still.since
    assert lookup.decision_seconds.count == 2
    # The audit trail's times are the workflow's, as the histogram's: the same two waits.
    assert lookup.decision_seconds.max == pytest.approx(max(waits), abs=1e-3)
    assert sorted(waits)[0] == pytest.approx(lookup.decision_seconds.median, abs=1e-3)
    assert (hurried.tool, hurried.pending, hurried.defaulted, hurried.expired) == (
        "hurry",
        0,
        1,
        0,
    )
    assert hurried.decision_seconds.count == 0

    # A person's view of the same, and a window before any of it.
    shown = await agentctl(
        metered, "stats", "--since", "1h", "--agent", name, task_queue=agents.task_queue
    )
    assert shown.code == 0 and "lookup" in shown.out and "hurry" in shown.out, shown
    before = datetime.now(UTC) - timedelta(days=2)
    empty = await agentctl(
        metered,
        "stats",
        "--from",
        before.isoformat(),
        "--to",
        (before + timedelta(hours=1)).isoformat(),
        "--agent",
        name,
        "--json",
        task_queue=agents.task_queue,
    )
    assert empty.code == 0, empty
    rows = StatsOutput.model_validate_json(empty.out).tools
    # Only what is pending now; nothing decided in that window.
    assert [(r.tool, r.pending, r.approved + r.denied + r.defaulted) for r in rows] == [
        ("lookup", 1, 0)
    ]
    for chat in chats:
        await assert_no_workflow_task_failed(client, chat.id)


async def test_stats_refuses_a_window_it_cannot_read(client):
    both = await agentctl(
        client, "stats", "--since", "1h", "--from", "2026-01-01T00:00Z", task_queue="q"
    )
    assert both.code == 2 and "not both" in both.err
    bad = await agentctl(client, "stats", "--since", "soon", task_queue="q")
    assert bad.code == 2 and "not a duration" in bad.err
    naive = await agentctl(client, "stats", "--from", "2026-01-01T00:00", task_queue="q")
    assert naive.code == 2 and "offset" in naive.err


async def test_a_notification_is_counted_by_channel_and_outcome_in_an_activity():
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter

    async def notify() -> None:
        count_notification(agent="payments", tool="sendPayment", channel="slack", outcome="sent")
        count_notification(agent="payments", tool="sendPayment", channel="slack", outcome="sent")
        count_notification(agent="payments", tool="sendPayment", channel="email", outcome="failed")

    await env.run(notify)
    found: Counter[tuple[str, ...]] = Counter()
    for u in buffer.retrieve_updates():
        assert u.metric.name == NOTIFICATIONS
        # Temporal's own labels of an activity, and the four bounded ones: nothing else.
        temporal = {"namespace", "task_queue", "activity_type", "service_name"}
        assert set(u.attributes) - temporal == {"agent", "tool", "channel", "outcome"}
        found[tuple(str(u.attributes[k]) for k in ("channel", "outcome"))] += int(u.value)
    assert found == {("slack", "sent"): 2, ("email", "failed"): 1}


# ----------------------------------------------------------------------------------------------
# What agentctl stats counts (pure)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def record(ref: str, *, at: int, since: int | None = 0, **fields: Any) -> AnswerRecord:
    base: dict[str, Any] = {"name": "pay", "kind": "restart", "via": "update"}
    base.update(fields)
    return AnswerRecord(
        at=T0 + timedelta(seconds=at),
        ref=ref,
        since=None if since is None else T0 + timedelta(seconds=since),
        **base,
    )


def test_each_pause_counts_once_by_the_record_that_ended_it():
    trail = [
        record("a", at=10, decision="vote"),  # a vote leaves it waiting
        record("a", at=20, decision="approved"),
        # Withdrawn with its turn after it was approved: not a second outcome.
        record("a", at=30, kind="cancel", via="cancel", decision="cancelled"),
        record("b", at=40, kind="respond", decision="denied"),
        record(
            "c",
            at=50,
            kind="deadline",
            via="deadline",
            decision="expired",
            output={"approved": False, "note": "default"},
        ),
        record(
            "d",
            at=60,
            kind="deadline",
            via="deadline",
            decision="expired",
            output={"error": "timed out", "approved": False},
        ),
        record("e", at=70, kind="cancel", via="deadline", decision="cancelled"),
        record("f", at=80, kind="cancel", via="cancel", decision="cancelled"),
        # A call a grant let through never paused; a stale approval ends nothing.
        record("g", at=90, via="grant", decision="approved", since=None),
        record("h", at=95, via="recheck", kind="voided", decision="stale"),
        # Outside the window.
        record("i", at=500, decision="approved"),
    ]
    (row,) = tally([], {"chat": ("payments", trail)}, since=T0, until=T0 + timedelta(seconds=100))
    counts = row.model_dump(include={"approved", "denied", "defaulted", "expired", "cancelled"})
    assert counts == {"approved": 1, "denied": 1, "defaulted": 1, "expired": 2, "cancelled": 1}
    assert row.decision_seconds.model_dump() == {
        "count": 2,
        "median": 20.0,
        "p90": 40.0,
        "max": 40.0,
    }
    assert outcome(trail[0]) is None and outcome(trail[8]) is None


def test_time_to_decision_uses_nearest_rank():
    assert times([]).count == 0 and times([]).median is None
    spread = times(float(n) for n in range(1, 11))
    assert (spread.median, spread.p90, spread.max) == (5.0, 9.0, 10.0)


def test_the_json_schema_round_trips():
    output = StatsOutput(since=T0, until=T0 + timedelta(hours=1), agent="payments")
    assert StatsOutput.model_validate(json.loads(output.model_dump_json())) == output

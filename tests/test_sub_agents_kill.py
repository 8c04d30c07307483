"""A worker process SIGKILLed while a sub-agent (``agent_tool``) runs loses nothing: the child's
interrupt stays on its caller, an approval through the caller runs the child's tool once, a run
cut short by the kill is reported and not repeated, and both histories replay.

Real dev server, real worker processes (``tests/sub_agent_worker.py``) on the offline model's
rules; each run of the child's gated tool is a row in a SQLite ledger those processes write.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from temporal_agent_interrupts import AgentClient, FinishReason, approve
from temporal_agent_interrupts.workflows.activity_io import (
    ToolInput,
)
from temporal_agent_interrupts.workflows.config import SUB_AGENT_RESUME_ACTIVITY, TOOL_ACTIVITY
from temporal_agent_interrupts.workflows.types import (
    TurnResult,
)
from tests.helpers import assert_no_workflow_task_failed, events_of, eventually, server_address
from tests.sub_agent_worker import HOLD, Ledger
from tests.test_durability import replayer

ROOT = Path(__file__).resolve().parent.parent
WORKER = [sys.executable, "-m", "tests.sub_agent_worker"]


class WorkerProcess:
    """One ``tests.sub_agent_worker`` process; :meth:`kill` is SIGKILL, nothing graceful."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert line.strip() == b"ready", line

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()


@asynccontextmanager
async def workers(
    client: Client, queue: str, directory: Path
) -> AsyncIterator[Callable[[], Awaitable[WorkerProcess]]]:
    """Start worker processes on ``queue`` (``await start()``); none outlives the test."""
    started: list[WorkerProcess] = []

    async def start() -> WorkerProcess:
        proc = await asyncio.create_subprocess_exec(
            *WORKER,
            server_address(client),
            client.namespace,
            queue,
            str(directory),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        worker = WorkerProcess(proc)
        started.append(worker)
        await worker.ready()
        return worker

    try:
        yield start
    finally:
        for worker in started:
            await worker.kill()


def delegate(to: str, amount: float) -> str:
    task = f"call pay {json.dumps({'to': to, 'amount': amount})}"
    return f"call payments {json.dumps({'input': task})}"


async def scheduled_tool_runs(client: Client, chat_id: str) -> list[tuple[ToolInput, int]]:
    """Each run of a tool the conversation scheduled: its input and its retry policy's
    maximum attempts, from history."""
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    found = []
    for event in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED):
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name == TOOL_ACTIVITY:
            (arg,) = await client.data_converter.decode(attrs.input.payloads, [ToolInput])
            found.append((arg, attrs.retry_policy.maximum_attempts))
    return found


async def replays(client: Client, *chat_ids: str) -> None:
    for chat_id in chat_ids:
        hist = await assert_no_workflow_task_failed(client, chat_id)
        result = await replayer().replay_workflow(hist, raise_on_replay_failure=True)
        assert result.replay_failure is None


async def test_a_worker_killed_while_the_sub_agent_waits_loses_nothing(client, tmp_path):
    ledger = Ledger(tmp_path)
    ledger.create()
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    async with workers(client, queue, tmp_path) as start:
        first = await start()
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("bob", 5))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.chat_id == f"{parent.id}--{i.path[0]}" and i.path[1] == i.ref
        await first.kill()
        await start()  # a fresh process: nothing of either conversation in memory
        # Still on the caller, by the same path, and nothing has run.
        shown = await parent.pending()
        assert [(p.path, p.ref, p.chat_id) for p in shown] == [(i.path, i.ref, i.chat_id)]
        assert ledger.runs() == []
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert await parent.pending() == []
    assert done.finish_reason == FinishReason.STOP, done
    assert "paid" in done.text and "bob" in done.text
    # One approval, one run, with the key the child's workflow gave that run.
    assert i.chat_id is not None
    ((scheduled, attempts),) = await scheduled_tool_runs(client, i.chat_id)
    (run,) = ledger.runs()
    assert (run.chat_id, run.ref, run.to, run.resumed) == (i.chat_id, i.ref, "bob", True)
    assert run.idempotency_key == scheduled.idempotency_key and attempts == 1
    child = await client.get_workflow_handle(i.chat_id).describe()
    assert child.status == WorkflowExecutionStatus.COMPLETED
    await replays(client, parent.id, i.chat_id)


@pytest.mark.parametrize("via", ["update", "signal"])
async def test_a_worker_killed_while_the_approved_tool_runs_does_not_run_it_again(
    client, tmp_path, via
):
    """The kill lands while the child's approved run is held and, with it, while the caller's
    forwarding of the answer waits on the child's update: the run is reported "may have taken
    effect", never repeated; the forwarding is retried on the fresh worker and gets the outcome
    of the update it started (the child took the answer once); the caller's turn ends, and an
    answer by update returns it (it once failed a minute later, "Activity task timed out")."""
    ledger = Ledger(tmp_path)
    ledger.create()
    hold = tmp_path / HOLD
    hold.touch()
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    async with workers(client, queue, tmp_path) as start:
        first = await start()
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(delegate("carol", 7))).interrupts
        answer = approve(i)
        answered: asyncio.Task[TurnResult] | None = None
        if via == "update":
            answered = asyncio.create_task(parent.resume(answers=[answer], identity="alice"))
        else:
            body = {"restart": [answer.model_dump(mode="json")], "identity": "alice"}
            await client.get_workflow_handle(parent.id).signal("resume", body)
        await eventually(lambda: asyncio.sleep(0, ledger.runs()), bool, timeout=30)
        desc = await client.get_workflow_handle(parent.id).describe()
        in_flight = [a.activity_type.name for a in desc.raw_description.pending_activities]
        assert SUB_AGENT_RESUME_ACTIVITY in in_flight, in_flight
        await first.kill()  # mid-run: the payment is recorded, the tool has not returned
        hold.unlink()  # were it run again, it would run to its end
        await start()
        if answered is not None:
            done = await asyncio.wait_for(answered, 45)
        else:
            done = await eventually(
                parent.last_turn,
                lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
                timeout=45,
            )
        assert done is not None and done.finish_reason == FinishReason.STOP, done
        assert "may have taken effect" in done.text
        assert await parent.pending() == []
        # By signal, the turn may end before the forwarding's retry has had the child's word.
        await eventually(
            lambda: client.get_workflow_handle(parent.id).describe(),
            lambda d: not d.raw_description.pending_activities,
            timeout=30,
        )
        assert await parent.rejections() == []  # nothing said the answer went astray
        await asyncio.sleep(2)  # nothing runs it later either
    assert i.chat_id is not None
    (run,) = ledger.runs()
    ((scheduled, attempts),) = await scheduled_tool_runs(client, i.chat_id)
    assert run.idempotency_key == scheduled.idempotency_key and attempts == 1
    # One forwarding, whose retry (on the fresh worker) finished it; one answer in the child.
    hist = await client.get_workflow_handle(parent.id).fetch_history()
    forwarded = [
        e.event_id
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        if e.activity_task_scheduled_event_attributes.activity_type.name
        == SUB_AGENT_RESUME_ACTIVITY
    ]
    assert len(forwarded) == 1
    (started,) = [
        e.activity_task_started_event_attributes
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
        if e.activity_task_started_event_attributes.scheduled_event_id == forwarded[0]
    ]
    assert started.attempt == 2
    assert any(
        e.activity_task_completed_event_attributes.scheduled_event_id == forwarded[0]
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    )
    child = await client.get_workflow_handle(i.chat_id).fetch_history()
    assert len(events_of(child, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)) == 1
    await replays(client, parent.id, i.chat_id)

"""What the soak (``bench/soak``) found, each held by a focused test of its own.

1. **A deadline that fell due while the conversation's worker was dead was put off, and the
   run stopped replaying.** The worker holding a paused conversation was killed (no graceful
   shutdown); a fresh worker answered a query about it, so it held the run in its cache; the
   deadline's timer fired, and the task for it went to the dead worker's sticky queue, where it
   timed out ten seconds later. The fresh worker then took the task, but the workflow time the
   SDK gave that activation was the time of the run's previous task, before the deadline: the
   workflow found nothing due and started a new timer for the whole interval again. A replay
   sees the later time and expires the call there instead (an upsert where history has a timer
   started): every later worker without the run cached failed its tasks as nondeterministic,
   and the conversation was stuck. The workflow now takes a fired deadline timer as proof that
   its deadline has passed, whatever ``workflow.now()`` says.

   What remains is the SDK's (temporalio 1.35): the fresh worker runs the workflow on the fired
   timer while it answers the query, and sends what it made with its next task. When that task
   also brings an update or a signal, history has the timer's commands first and a replay the
   update's (``python -m bench.soak.sdk_query_repro`` shows it with a bare workflow). The soak
   counts any run left that way under ``no_standing_task_failure``.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.soak.agent import AGENT, TIMED_OUT
from bench.soak.ledger import Ledger, ModelCalls
from bench.soak.processes import ROOT, child_env, worker_command
from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.worker import sandbox_runner
from temporal_agent_interrupts.workflows import AgentWorkflow
from tests.helpers import events_of, eventually, history, server_address


async def soak_worker(address: str, queue: str, tmp_path: Path) -> asyncio.subprocess.Process:
    """The soak's worker process (its agent, its scripted model), ready to take tasks."""
    cmd = worker_command(
        address=address,
        task_queue=queue,
        ledger=tmp_path / "ledger.sqlite",
        model_calls=tmp_path / "model-calls.sqlite",
        seed=1,
        model_fault_rate=0.0,
        hang_seconds=6.0,
        http_timeout=3.0,
    )
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, env=child_env(), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.strip() == b"ready", line
    return proc


async def test_a_deadline_due_while_its_worker_was_dead_is_applied_then_and_replays(env, tmp_path):
    Ledger(tmp_path / "ledger.sqlite").create()
    ModelCalls(tmp_path / "model-calls.sqlite").create()
    address, queue = server_address(env.client), f"tq-{uuid.uuid4()}"
    agents = AgentClient(env.client, task_queue=queue)
    chat = await agents.chat(AGENT, chat_id=f"soak-finding-{uuid.uuid4().hex[:8]}")
    first = await soak_worker(address, queue, tmp_path)
    second: asyncio.subprocess.Process | None = None
    try:
        paused = await chat.send(f'soak chat={chat.id} turn=1: call quick {{"question": "ok?"}}')
        assert paused.finish_reason == FinishReason.INTERRUPTED
        assert [i.name for i in paused.interrupts] == ["quick"]
        first.send_signal(signal.SIGKILL)  # no graceful shutdown: the run stays on its queue
        await first.wait()
        second = await soak_worker(address, queue, tmp_path)
        # A query now goes to the dead worker's sticky queue first; the fresh worker answers it
        # some seconds later, after the deadline's timer has fired, while the task for that
        # sits on the dead worker's queue: it applies the timer answering the query (what it
        # says depends on that), and holds the run in its cache from then on.
        await chat.status()
        # Followed by query, not by update: an update that lands in the task taking the fired
        # timer meets the SDK problem under this one, which no workflow code can undo: the
        # timer's commands, made while answering the query, go into history before the
        # update's acceptance, and a replay runs the update first (python -m
        # bench.soak.sdk_query_repro shows it with a bare workflow).
        done = await eventually(
            chat.status,
            lambda s: s.status == "idle",
            timeout=120,
            interval=1.0,
        )
        assert done.last_turn is not None and '"timed out"' in done.last_turn.text
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
    hist = await history(env.client, chat.id)
    # The scenario played out: the task for the deadline went to the dead worker and timed out.
    assert events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    # One deadline, one timer: it was not started again once it had fired.
    assert len(events_of(hist, EventType.EVENT_TYPE_TIMER_STARTED)) == 1
    records = await agents.audit(chat.id)
    assert [(r.kind, r.output) for r in records] == [("deadline", TIMED_OUT)]
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=sandbox_runner(strict=True),
    )
    replayed = await replayer.replay_workflow(hist, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure

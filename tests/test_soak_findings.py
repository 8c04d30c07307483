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

2. **A query answered before the workflow task that brings a signal made a run that does not
   replay.** Under the first finding lies the SDK's (temporalio 1.35) own: when a query
   reaches a worker directly, with events the run's workflow task has not yet brought (its
   worker died, or the server restarted, so the task waits out the dead sticky queue), the
   SDK runs the workflow on those events (here a script's ``resume`` signal) to answer the
   query, keeps the commands it made, and sends them with the next task. That task also
   brought the caller's update (``last_turn``): history recorded the signal's commands (the
   approved tool's activity scheduled) before the update's acceptance, while every replay runs
   them together, the update first. The run no longer replayed, every worker without it cached
   failed its tasks for good, and the conversation lost its paused turn. The product's workers
   now refuse that activation (``worker.sandbox.QueryTimeGuard``): the query is put off (the
   client asks again by itself, ``errors.QUERY_PUT_OFF``) and the run is evicted, so the task
   that brings the signal replays it from history with the update, as every replay will.
   ``python -m bench.soak.sdk_query_repro`` still shows the SDK's behaviour with a bare
   workflow on an SDK worker.

3. **A turn nobody asked for, withdrawn by the harness's close.** In one conversation three
   calls of a turn the harness never saw paused, and its close withdrew them (the audit
   trail's cancels by ``soak`` that no attempt of the harness sent). What fits: a send that
   raised (its worker or the server went away) may still get in later, since its request
   outlives the caller's wait; the harness sent the message again once the conversation said
   it had not got it, and when the first got in too, after the second's turn had ended, it
   started another turn with the same message. Nothing told the two apart. A send now carries
   a ``message_id`` (``Chat.send``, the AG-UI message's id, a ``send`` signal's field): the
   same message sent again joins the turn the first one started, and one that comes after the
   conversation has moved on is refused (tests/test_message_ids.py holds it).

4. **An AG-UI run across a server restart ended in an error while its turn went on.** The
   runs the soak sent while the dev server was killed ended in a ``RUN_ERROR`` ("internal
   error (logged by the app)"), or, in the harness's reading, in a failed turn, while the
   turn paused a moment later; a caller that took the run's word for it moved on past a
   pause. Three places let the outage through: the stream's offset query raised Temporal's
   raw error, and neither the stream's follower nor the wait for an accepted update's result
   waited for the server to come back. Now the offset is asked as every query of ``Chat`` is
   (put-off queries asked again, errors the product's own), and a follower and an accepted
   update's result wait through up to a minute of a server that cannot be reached
   (``errors.OUTAGE_GRACE``): the conversation keeps both.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
from temporalio.api.enums.v1 import EventType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.soak.agent import AGENT, TIMED_OUT
from bench.soak.ledger import Ledger, ModelCalls
from bench.soak.processes import ROOT, DevServer, child_env, worker_command
from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.errors import QUERY_PUT_OFF
from temporal_agent_interrupts.worker import build_worker, sandbox_runner
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.worker.sandbox import QueryTimeGuard
from temporal_agent_interrupts.worker.standin import calls
from temporal_agent_interrupts.workflows import AgentWorkflow
from tests import agents as t
from tests.helpers import events_of, eventually, free_port, held, history, server_address
from tests.web import frames, run_input, served


async def soak_worker(
    address: str, queue: str, tmp_path: Path, *, log: Path | None = None, held: bool = False
) -> asyncio.subprocess.Process:
    """The soak's worker process (its agent, its scripted model), ready to take tasks; its log
    (stderr) goes to ``log`` when given. ``held``: connected, but polling only after
    :func:`let_go` (a Python process's start takes seconds under load: it is done before the
    scenario, not inside its window)."""
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
    cmd += ["--held"] if held else []
    stderr = log.open("ab") if log is not None else None
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=ROOT,
            env=child_env(),
            stdin=asyncio.subprocess.PIPE if held else None,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    finally:
        if stderr is not None:
            stderr.close()  # the child has its own copy
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.strip() == (b"held" if held else b"ready"), line
    return proc


async def let_go(proc: asyncio.subprocess.Process) -> None:
    """A held worker polls from now on (returns once it does)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.strip() == b"ready", line


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
        # Followed by query, not by update, so that this test holds the first finding alone
        # (the next test holds the second, an update landing in the task that brings events
        # a query ran first).
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
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(strict=True),
    )
    replayed = await replayer.replay_workflow(hist, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_query_answered_before_the_task_that_brings_a_signal_leaves_the_run_replayable(
    env, tmp_path
):
    """Finding 2: the SDK ran the workflow on a signal while answering a query, and the update
    that came with the signal's task made a history that does not replay.

    The scenario rests on a race the test sets up but cannot force: the signal's task must go
    to the dead worker's sticky queue and time out there. When the query's own wait on that
    queue has already made the server drop the stickiness, the signal's task goes straight to
    the fresh worker and the scenario does not happen. Every attempt asserts the behaviour
    (answered, one payment, replayable); attempts go on until one played the scenario out."""
    played_out = []
    for attempt in range(4):
        played_out.append(await _query_before_the_signals_task(env, tmp_path / f"try-{attempt}"))
        if played_out[-1]:
            break
    assert any(played_out), f"the scenario never played out in {len(played_out)} attempts"


async def _query_before_the_signals_task(env, tmp_path: Path) -> bool:
    """One attempt at finding 2's scenario; whether it played out (the signal's task timed out
    on the dead worker's queue, and the fresh worker refused to answer the query on it)."""
    tmp_path.mkdir(parents=True)
    Ledger(tmp_path / "ledger.sqlite").create()
    ModelCalls(tmp_path / "model-calls.sqlite").create()
    address, queue = server_address(env.client), f"tq-{uuid.uuid4()}"
    agents = AgentClient(env.client, task_queue=queue)
    chat = await agents.chat(AGENT, chat_id=f"soak-finding-{uuid.uuid4().hex[:8]}")
    log = tmp_path / "second-worker.log"
    first = await soak_worker(address, queue, tmp_path)
    second: asyncio.subprocess.Process | None = None
    try:
        second = await soak_worker(address, queue, tmp_path, log=log, held=True)
        paused = await chat.send(
            f'soak chat={chat.id} turn=1: call transfer {{"amount": 7, "to": "acct-9"}}'
        )
        assert paused.finish_reason == FinishReason.INTERRUPTED
        [gate] = paused.interrupts
        assert gate.name == "transfer"
        first.send_signal(signal.SIGKILL)  # no graceful shutdown: the run stays on its queue
        await first.wait()
        await let_go(second)  # started before, so its start is not in the window
        # A query first: no task is pending, so the server sends it to the worker directly,
        # to the dead worker's sticky queue first, where it waits some seconds.
        status = asyncio.create_task(chat.status())
        await asyncio.sleep(0.5)
        # Meanwhile the approval, as a script sends it: its task too goes to the dead worker's
        # queue and waits there until it times out. The query reaches the fresh worker first,
        # with the signal in the history it replays.
        body = {
            "restart": [gate.approve().model_dump(mode="json", exclude_none=True)],
            "identity": "ann@soak",
        }
        await env.client.get_workflow_handle(chat.id).signal("resume", body)
        await asyncio.sleep(0.5)
        # Then the caller waits for the turn (an update), which comes with the task that
        # brings the signal.
        turn = await asyncio.wait_for(chat.last_turn(), 120)
        assert turn is not None and turn.finish_reason == FinishReason.STOP, turn
        # Put off by the worker, and asked again by the client: answered, not failed.
        assert (await asyncio.wait_for(status, 120)).chat_id == chat.id
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
    hist = await history(env.client, chat.id)
    assert not events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    # One approval, one payment.
    runs = Ledger(tmp_path / "ledger.sqlite").runs()
    assert [(r.tool, r.chat_id) for r in runs if r.phase == "effect"] == [("transfer", chat.id)]
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(strict=True),
    )
    replayed = await replayer.replay_workflow(hist, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
    # The scenario played out: a task waited out the dead worker's queue, and the fresh worker
    # was asked before the signal's task reached it.
    timed_out = bool(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT))
    refused = "refused to run the workflow on events no workflow task has brought"
    return timed_out and refused in log.read_text()


def _activation(jobs: list[str], *, at: int, length: int, replaying: bool = False) -> Any:
    act = WorkflowActivation(run_id="r", history_length=length, is_replaying=replaying)
    act.timestamp.FromNanoseconds(at)
    for job in jobs:
        getattr(act.jobs.add(), job).SetInParent()
    return act


def test_the_guard_refuses_only_new_events_at_an_old_tasks_time():
    """What ``QueryTimeGuard`` tells apart, activation by activation."""
    guard = QueryTimeGuard()
    refuse = partial(guard.refuse, workflow_id="w")
    assert refuse(_activation(["initialize_workflow"], at=1, length=3, replaying=True)) is None
    assert refuse(_activation(["signal_workflow"], at=5, length=9)) is None  # a new task
    # Another activation of the same task (same time, same history): its own work.
    assert refuse(_activation(["resolve_activity"], at=5, length=9)) is None
    # A query, or an eviction: neither counts.
    assert refuse(_activation(["query_workflow"], at=5, length=12)) is None
    assert refuse(_activation(["remove_from_cache"], at=5, length=12)) is None
    # Events beyond the last task's history, at its time: what a query ran. Refused, and
    # refused again while no task has come.
    for _ in range(2):
        refused = refuse(_activation(["signal_workflow"], at=5, length=12))
        assert refused is not None and refused.failed.failure.message == QUERY_PUT_OFF
    # The task that brings them comes as a replay (the run was evicted): let through, as is
    # the next task.
    assert refuse(_activation(["signal_workflow"], at=8, length=14, replaying=True)) is None
    assert refuse(_activation(["do_update"], at=9, length=16)) is None


async def test_an_agui_run_across_a_server_restart_finishes_as_its_turn_did(tmp_path, model):
    """Finding 4: a run whose server went away mid-turn ended in a RUN_ERROR ("internal
    error", or "Temporal error: tcp connect error") although its turn went on and paused."""
    server = DevServer(
        db_file=tmp_path / "temporal.db", port=free_port(), log_file=tmp_path / "server.log"
    )
    await server.start()
    slow_model, release = held(calls(("approve", {"question": "ok?"}, "q1")))
    model.reply(slow_model)
    try:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        queue = f"tq-{uuid.uuid4()}"
        async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
            app = agents_app(AgentClient(client, task_queue=queue), dev_loopback=True)
            async with served(app) as base, httpx2.AsyncClient(timeout=120) as http:
                thread = f"thread-{uuid.uuid4()}"
                run = asyncio.create_task(
                    frames(http, f"{base}/agui/careful", run_input(thread, "ask me"))
                )
                await eventually(lambda: asyncio.sleep(0, model.calls), lambda n: n == 1)
                server.kill()  # while the turn waits on its model call
                # Down for longer than the SDK's own retries of a call last.
                await asyncio.sleep(12.0)
                await server.start()  # the same database: the turn is where it was
                release.set()
                seen = await asyncio.wait_for(run, 120)
                pending = await (
                    await AgentClient(client, task_queue=queue).chat("careful", chat_id=thread)
                ).pending()
    finally:
        release.set()
        await server.stop()
    assert [p.ref for p in pending] == ["q1"]
    last = seen[-1].event
    assert last["type"] == "RUN_FINISHED", last
    assert [i["id"] for i in last["outcome"]["interrupts"]] == ["q1"]


async def test_a_stream_offset_asked_while_the_worker_puts_queries_off_is_answered(env, tmp_path):
    """The stream's offset query (AG-UI connect, ``Chat.send_stream``) is asked again when put
    off, as every query of ``Chat`` is, instead of failing with the worker's refusal."""
    Ledger(tmp_path / "ledger.sqlite").create()
    ModelCalls(tmp_path / "model-calls.sqlite").create()
    address, queue = server_address(env.client), f"tq-{uuid.uuid4()}"
    agents = AgentClient(env.client, task_queue=queue)
    chat = await agents.chat(AGENT, chat_id=f"soak-finding-{uuid.uuid4().hex[:8]}")
    log = tmp_path / "second-worker.log"
    first = await soak_worker(address, queue, tmp_path)
    second: asyncio.subprocess.Process | None = None
    try:
        second = await soak_worker(address, queue, tmp_path, log=log, held=True)
        paused = await chat.send(
            f'soak chat={chat.id} turn=1: call transfer {{"amount": 7, "to": "acct-9"}}'
        )
        [gate] = paused.interrupts
        first.send_signal(signal.SIGKILL)
        await first.wait()
        await let_go(second)  # started before, so its start is not in the window
        offset = asyncio.create_task(next_offset(chat))  # as in the second finding's test
        await asyncio.sleep(0.5)
        body = {
            "restart": [gate.approve().model_dump(mode="json", exclude_none=True)],
            "identity": "ann@soak",
        }
        await env.client.get_workflow_handle(chat.id).signal("resume", body)
        await asyncio.sleep(0.5)
        turn = await asyncio.wait_for(chat.last_turn(), 120)
        assert turn is not None and turn.finish_reason == FinishReason.STOP
        got = await asyncio.wait_for(offset, 120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert "refused to run the workflow on events no workflow task has brought" in log.read_text()
    assert isinstance(got, int) and got > 0

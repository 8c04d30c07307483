"""``python -m bench b2 --parked N``: N conversations parked on one worker, then resumed.

The worker runs in a process of its own (``python -m bench.parked worker``), with default
settings and two bench agents (``benchAgent``, and ``benchAgentB`` for the share of the
conversations ``--second-agent-share`` parks under it, so a filtered inbox page selects a
fraction), so its resident memory is measured alone. The client side (this process) parks the
N conversations ``--concurrency`` at a time and, at every ``--checkpoint-every`` parked and at
the end, records:

- the worker's RSS (idle a moment) and the dev server's;
- the inbox's first page (``AgentClient.pending_page()``, what ``GET /api/inbox`` calls, 20
  chats), a page filtered by the second agent, and a page of the longest waiting (those parked
  in the run's first minute, ``waiting_over``: visibility pages newest first, so without it they
  are on the last page), each the median of ``--inbox-reads`` reads;
- the parking rate over the stretch, and how many visibility counts as paused.

Then the worker is restarted with all N parked (SIGTERM, a graceful shutdown, and a new
process), and ``--resume-sample`` of them, chosen at random, are answered: the first alone (its
latency from the new worker's start), the rest ``--concurrency`` at a time (their rate). Each
must finish right, and visibility must still count the others as paused: none lost.
``--resume-all`` then answers the rest. Results go to ``bench/results/<--name>.json`` (``b2``
unless named), rewritten at every checkpoint, so a run cut short keeps what it measured
(``"complete": false`` until it ends); ``--max-park-seconds`` stops parking at the first
checkpoint past that time and goes on to the restart with the N reached.

A paused conversation lives in Temporal; the worker should hold only what it is working on,
so its memory with N parked should stay bounded (the cache, not N).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.client.inbox import paused_query
from temporal_agent_interrupts.codec import data_converter
from temporal_agent_interrupts.worker.devserver import dev_server_command, wait_for_port

log = logging.getLogger("bench.parked")
RESULTS = Path(__file__).parent / "results"
QUEUE = "bench-parked"
AGENT = "benchAgent"
SECOND_AGENT = "benchAgentB"
"""The same agent under another name: a share of the conversations park under it, so an
inbox page filtered by agent selects a fraction of them."""


def rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def serve(address: str, *, cache: int | None = None) -> None:
    """The worker process: default settings, the bench agents, the scripted model in process."""
    from bench.__main__ import BenchModel, act, bench_agent  # only in the worker
    from temporal_agent_interrupts.worker import build_worker  # only in the worker
    from temporal_agent_interrupts.worker.testing import ScriptedModel  # only in the worker
    from temporal_agent_interrupts.workflows import Agent, ToolApproval  # only in the worker

    second = Agent(SECOND_AGENT, model="bench", tools=[act], middleware=[ToolApproval(allow=[])])
    model = ScriptedModel(BenchModel())
    # ScriptedModel records every request it answers (for tests to read): about 4 KiB a
    # conversation, which would be counted as the worker's memory growing with N. Keep none.
    model.requests = _Unrecorded()
    client = await Client.connect(address, data_converter=data_converter())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Default settings, unless an experiment asks for another workflow cache size.
    extra: dict[str, Any] = {} if cache is None else {"max_cached_workflows": cache}
    async with build_worker(
        client,
        agents=[bench_agent, second],
        task_queue=QUEUE,
        gemini=model.client(),
        **extra,
    ):
        print("ready", flush=True)
        await stop.wait()


class _Unrecorded(list[Any]):
    """A list that keeps nothing appended to it."""

    def append(self, item: Any, /) -> None:
        pass


async def settle(pid: int, *, seconds: float = 3.0) -> float:
    """The worker's RSS once it has been idle a moment (what it holds, not what it is doing)."""
    await asyncio.sleep(seconds)
    return rss_mib(pid)


async def start_worker(address: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    cache = [] if args.worker_cache is None else ["--worker-cache", str(args.worker_cache)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "bench.parked", "worker", "--address", address, *cache],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    assert worker.stdout is not None
    line = await asyncio.to_thread(worker.stdout.readline)
    assert line.strip() == "ready", line
    return worker


async def stop_worker(worker: subprocess.Popen[str], *, timeout: float = 60) -> float:
    """SIGTERM (the worker shuts down gracefully) and wait; the seconds it took."""
    t0 = time.perf_counter()
    worker.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(worker.wait, timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        await asyncio.to_thread(worker.wait)
    return time.perf_counter() - t0


async def median_ms(read: Callable[[], Awaitable[Any]], times: int) -> tuple[float, Any]:
    """The median of ``times`` reads, in ms, and the last read's value."""
    samples: list[float] = []
    value: Any = None
    for _ in range(times):
        t0 = time.perf_counter()
        value = await read()
        samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 1), value


async def count_paused(client: Client, *, expect: int | None = None, wait: float = 10.0) -> int:
    """How many conversations visibility lists as paused (waiting up to ``wait`` seconds for
    ``expect``: visibility follows the workflows a moment later)."""
    deadline = time.monotonic() + wait
    while True:
        n = (await client.count_workflows(paused_query(task_queues=[QUEUE]))).count
        if expect is None or n == expect or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.5)


def checkpoints(n: int, every: int) -> list[int]:
    marks = list(range(every, n, every)) if every > 0 else []
    return [*marks, n]


async def measure(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> None:
    result: dict[str, Any] = {
        "command": "python -m bench b2 " + " ".join(args.argv),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0]},
        "python": platform.python_version(),
        "complete": False,
        "target": args.parked,
        "concurrency": args.concurrency,
        "second_agent_share": args.second_agent_share,
        "checkpoints": [],
    }
    port = _free_port()
    # The embedded default keeps its store in a file (worker.devserver); an in-memory store
    # grows the server's memory with every parked conversation (3.6 GiB at 60,000, 7.6 GiB at
    # 70,000, then the server was gone in a run of 2026-12-05), which is not the product's.
    store = None if args.in_memory_store else Path(tempfile.mkdtemp(prefix="b2-")) / "b2.db"
    result["store"] = "memory" if store is None else "file"
    server = subprocess.Popen(
        dev_server_command(db_file=store, port=port, headless=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        await wait_for_port(port, proc=server)
        address = f"127.0.0.1:{port}"
        worker = await start_worker(address, args)
        # AGENT_PAYLOAD_KEYS, as in production: encrypted when set (the worker inherits it).
        client = await Client.connect(address, data_converter=data_converter())
        agents = AgentClient(client, task_queue=QUEUE)
        # Warm up: the first conversations load what every later one shares.
        run = uuid.uuid4().hex[:6]
        for i in range(6):
            chat = await agents.chat(AGENT if i % 2 else SECOND_AGENT, chat_id=f"warm-{run}-{i}")
            res = await chat.send("go warm")
            await chat.resume(restart=[x.restart({"tool_approved": True}) for x in res.interrupts])
        result["rss_mib_before"] = round(await settle(worker.pid, seconds=args.settle), 1)
        sem = asyncio.Semaphore(args.concurrency)
        parking_began = datetime.now(UTC)
        paused: dict[str, tuple[str, Any]] = {}
        every_nth = round(1 / args.second_agent_share) if args.second_agent_share > 0 else 0

        async def park(i: int) -> None:
            agent = SECOND_AGENT if every_nth and i % every_nth == 0 else AGENT
            async with sem:
                chat = await agents.chat(agent, chat_id=f"parked-{run}-{i}")
                res = await chat.send(f"go parked {i}")
                if res.finish_reason == FinishReason.INTERRUPTED:
                    paused[chat.id] = (agent, res.interrupts)

        async def inbox() -> dict[str, Any]:
            first_ms, first = await median_ms(agents.pending_page, args.inbox_reads)
            filtered_ms, filtered = await median_ms(
                lambda: agents.pending_page(agent=SECOND_AGENT), args.inbox_reads
            )
            # The longest waiting: parked in the run's first minute (the cutoff stays put
            # while the reads move on, so each read asks for the same chats).
            cutoff = parking_began + timedelta(minutes=1)
            aged_ms, aged = await median_ms(
                lambda: agents.pending_page(
                    waiting_over=max(datetime.now(UTC) - cutoff, timedelta(0))
                ),
                args.inbox_reads,
            )
            return {
                "inbox_aged_page_ms": aged_ms,
                "inbox_aged_page_chats": len(aged.chats),
                "inbox_aged_all_older": all(
                    c.waiting_since is not None and c.waiting_since <= cutoff for c in aged.chats
                ),
                "inbox_first_page_ms": first_ms,
                "inbox_first_page_chats": len(first.chats),
                "inbox_filtered_page_ms": filtered_ms,
                "inbox_filtered_page_chats": len(filtered.chats),
                "inbox_filtered_all_second_agent": all(
                    c.agent == SECOND_AGENT for c in filtered.chats
                ),
            }

        started = time.perf_counter()
        done = 0
        for mark in checkpoints(args.parked, args.checkpoint_every):
            t0 = time.perf_counter()
            await asyncio.gather(*(park(i) for i in range(done, mark)))
            stretch = time.perf_counter() - t0
            point: dict[str, Any] = {
                "parked": len(paused),
                "park_rate_per_s": round((mark - done) / stretch, 1),
                "elapsed_s": round(time.perf_counter() - started, 1),
                "rss_mib_worker": round(await settle(worker.pid, seconds=args.settle), 1),
                "rss_mib_server": round(rss_mib(server.pid), 1),
                "store_mib": round(_store_bytes(store) / 2**20, 1) if store else None,
                **(await inbox()),
                "visibility_paused": await count_paused(client, expect=len(paused)),
                "load_avg": round(os.getloadavg()[0], 2),
            }
            done = mark
            result["checkpoints"].append(point)
            save(result)
            log.info("checkpoint %s", json.dumps(point))
            if args.max_park_seconds and time.perf_counter() - started > args.max_park_seconds:
                log.info("parking stopped at %d: past --max-park-seconds", done)
                break
        park_s = time.perf_counter() - started
        last = result["checkpoints"][-1]
        result |= {
            "attempted": done,
            "parked": len(paused),
            "park_seconds": round(park_s, 1),
            "start_rate_per_s": round(done / park_s, 1),
            "rss_mib_parked": last["rss_mib_worker"],
        }
        save(result)

        # The restart: the worker goes, a new one comes, and answers find their conversations.
        shutdown_s = await stop_worker(worker)
        t_restart = time.perf_counter()
        worker = await start_worker(address, args)
        ready_s = time.perf_counter() - t_restart
        rng = random.Random(args.seed)
        order = list(paused)
        rng.shuffle(order)
        sample = order[: min(args.resume_sample, len(order))]
        finished: dict[str, bool] = {}

        async def resume(chat_id: str) -> None:
            agent, interrupts = paused[chat_id]
            async with sem:
                chat = await agents.chat(agent, chat_id=chat_id)
                res = await chat.resume(
                    restart=[x.restart({"tool_approved": True}) for x in interrupts]
                )
                finished[chat_id] = res.finish_reason == FinishReason.STOP and res.text == "done"

        restart: dict[str, Any] = {
            "shutdown_s": round(shutdown_s, 2),
            "new_worker_ready_s": round(ready_s, 2),
            "rss_mib_new_worker": round(rss_mib(worker.pid), 1),
            "sample": len(sample),
        }
        first_done = time.perf_counter()
        if sample:
            t0 = time.perf_counter()
            await resume(sample[0])
            first_done = time.perf_counter()
            restart["first_resume_ms"] = round((first_done - t0) * 1000, 1)
            restart["first_resume_after_restart_s"] = round(first_done - t_restart, 2)
            await asyncio.gather(*(resume(c) for c in sample[1:]))
            rest_s = time.perf_counter() - first_done
            if len(sample) > 1:
                restart["resume_rate_per_s"] = round((len(sample) - 1) / rest_s, 1)
        restart["finished_ok"] = sum(finished.values())
        restart["rss_mib_after_sample"] = round(await settle(worker.pid, seconds=args.settle), 1)
        restart["visibility_paused_after"] = await count_paused(
            client, expect=len(paused) - len(sample)
        )
        result["restart"] = restart
        save(result)
        resumed = len(sample)
        resume_s = (time.perf_counter() - first_done) if sample else 0.0
        if args.resume_all and len(order) > len(sample):
            t0 = time.perf_counter()
            await asyncio.gather(*(resume(c) for c in order[len(sample) :]))
            all_s = time.perf_counter() - t0
            result["resume_all"] = {
                "resumed": len(order) - len(sample),
                "resume_rate_per_s": round((len(order) - len(sample)) / all_s, 1),
            }
            resumed, resume_s = len(order), resume_s + all_s
        ok = sum(finished.values())
        still = await count_paused(client, expect=len(paused) - resumed)
        rate = restart.get("resume_rate_per_s", 0.0)
        if "resume_all" in result:
            rate = result["resume_all"]["resume_rate_per_s"]
        result |= {
            "resumed": resumed,
            "rss_mib_after": round(await settle(worker.pid, seconds=args.settle), 1),
            "resume_rate_per_s": rate,
            "resume_to_start_rate": round(rate / result["start_rate_per_s"], 2),
            "finished_ok": ok,
            "still_paused": still,
            # Every conversation asked to park is either finished right or still paused.
            "lost": done - ok - still,
            "complete": True,
        }
        save(result)
    finally:
        if worker is not None:
            await stop_worker(worker, timeout=30)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        if store is not None:
            shutil.rmtree(store.parent, ignore_errors=True)


def _store_bytes(store: Path) -> int:
    """The dev server's store on disk: its SQLite file and the write-ahead log beside it."""
    return sum(p.stat().st_size for p in store.parent.glob(store.name + "*"))


def _free_port() -> int:
    import socket  # one use

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench b2", description=__doc__)
    p.add_argument("role", nargs="?", default="measure", choices=["measure", "worker"])
    p.add_argument("--parked", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--second-agent-share", type=float, default=0.1)
    p.add_argument("--checkpoint-every", type=int, default=10_000)
    p.add_argument("--inbox-reads", type=int, default=7, help="reads per inbox page timed")
    p.add_argument("--resume-sample", type=int, default=1000)
    p.add_argument("--resume-all", action="store_true", help="then answer the rest too")
    p.add_argument("--max-park-seconds", type=float, default=0.0, help="0: park all N")
    p.add_argument("--settle", type=float, default=3.0, help="idle seconds before an RSS read")
    p.add_argument("--seed", type=int, default=51)
    p.add_argument("--address", default="")
    p.add_argument(
        "--worker-cache", type=int, default=None, help="experiments: max cached workflows"
    )
    p.add_argument(
        "--in-memory-store",
        action="store_true",
        help="the dev server without --db-filename (before 2026-12-05's runs); the default is a "
        "file, as the embedded default keeps it",
    )
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="b2", help="the results file's name, without .json")
    args = p.parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "temporalio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.role == "worker":
        asyncio.run(serve(args.address, cache=args.worker_cache))
        os._exit(0)  # skip interpreter teardown, where the SDK can abort (sdk-python issue 300)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    results: dict[str, Any] = {}

    def save(result: dict[str, Any]) -> None:
        results.update(result)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(path)

    asyncio.run(measure(args, save))
    print(json.dumps(results, indent=2), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()

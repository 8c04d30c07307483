"""``python -m bench b2 --parked N``: N conversations parked on one worker, then resumed.

The worker runs in a process of its own (``python -m bench.parked worker``), with default
settings and the bench agent, so its resident memory is measured alone: before, with every
conversation parked, and after all were resumed. The client side (this process) parks them with
``--concurrency`` at a time, resumes them all, and counts those that finished right and those
lost. Writes ``bench/results/b2.json``.

A paused conversation lives in Temporal; the worker should hold only what it is working on,
so its memory with N parked should stay bounded (the cache, not N).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.codec import data_converter
from temporal_agent_interrupts.worker.devserver import dev_server_command, wait_for_port

log = logging.getLogger("bench.parked")
RESULTS = Path(__file__).parent / "results"
QUEUE = "bench-parked"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def serve(address: str, *, cache: int | None = None) -> None:
    """The worker process: default settings, the bench agent, the scripted model in process."""
    from bench.__main__ import BenchModel, bench_agent  # only in the worker
    from temporal_agent_interrupts.worker import build_worker  # only in the worker
    from temporal_agent_interrupts.worker.testing import ScriptedModel  # only in the worker

    client = await Client.connect(address, data_converter=data_converter())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Default settings, unless an experiment asks for another workflow cache size.
    extra: dict[str, Any] = {} if cache is None else {"max_cached_workflows": cache}
    async with build_worker(
        client,
        agents=[bench_agent],
        task_queue=QUEUE,
        gemini=ScriptedModel(BenchModel()).client(),
        **extra,
    ):
        print("ready", flush=True)
        await stop.wait()


async def settle(pid: int, *, seconds: float = 3.0) -> float:
    """The worker's RSS once it has been idle a moment (what it holds, not what it is doing)."""
    await asyncio.sleep(seconds)
    return rss_mib(pid)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen(
        dev_server_command(db_file=None, port=port, headless=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        await wait_for_port(port, proc=server)
        address = f"127.0.0.1:{port}"
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.parked",
                "worker",
                "--address",
                address,
                *(
                    ["--worker-cache", str(args.worker_cache)]
                    if args.worker_cache is not None
                    else []
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
        assert worker.stdout is not None
        line = await asyncio.to_thread(worker.stdout.readline)
        assert line.strip() == "ready", line
        # AGENT_PAYLOAD_KEYS, as in production: encrypted when set (the worker inherits it).
        client = await Client.connect(address, data_converter=data_converter())
        agents = AgentClient(client, task_queue=QUEUE)
        # Warm up: the first conversations load what every later one shares.
        run = uuid.uuid4().hex[:6]
        for i in range(5):
            chat = await agents.chat("benchAgent", chat_id=f"warm-{run}-{i}")
            res = await chat.send("go warm")
            await chat.resume(restart=[x.restart({"tool_approved": True}) for x in res.interrupts])
        before = await settle(worker.pid)
        sem = asyncio.Semaphore(args.concurrency)
        paused: dict[str, Any] = {}

        async def park(i: int) -> None:
            async with sem:
                chat = await agents.chat("benchAgent", chat_id=f"parked-{run}-{i}")
                res = await chat.send(f"go parked {i}")
                if res.finish_reason == FinishReason.INTERRUPTED:
                    paused[chat.id] = (chat, res.interrupts)

        t0 = time.perf_counter()
        await asyncio.gather(*(park(i) for i in range(args.parked)))
        park_s = time.perf_counter() - t0
        parked_rss = await settle(worker.pid)
        finished: dict[str, bool] = {}

        async def resume(chat_id: str) -> None:
            chat, interrupts = paused[chat_id]
            async with sem:
                res = await chat.resume(
                    restart=[x.restart({"tool_approved": True}) for x in interrupts]
                )
                finished[chat_id] = res.finish_reason == FinishReason.STOP and res.text == "done"

        t0 = time.perf_counter()
        await asyncio.gather(*(resume(c) for c in list(paused)))
        resume_s = time.perf_counter() - t0
        after = await settle(worker.pid)
        ok = sum(finished.values())
        return {
            "parked": len(paused),
            "concurrency": args.concurrency,
            "rss_mib_before": round(before, 1),
            "rss_mib_parked": round(parked_rss, 1),
            "rss_mib_after": round(after, 1),
            "start_rate_per_s": round(args.parked / park_s, 1),
            "resume_rate_per_s": round(len(paused) / resume_s, 1),
            "resume_to_start_rate": round((len(paused) / resume_s) / (args.parked / park_s), 2),
            "finished_ok": ok,
            "lost": args.parked - ok,
        }
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _free_port() -> int:
    import socket  # one use

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench b2", description=__doc__)
    p.add_argument("role", nargs="?", default="measure", choices=["measure", "worker"])
    p.add_argument("--parked", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--address", default="")
    p.add_argument(
        "--worker-cache", type=int, default=None, help="experiments: max cached workflows"
    )
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "temporalio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.role == "worker":
        asyncio.run(serve(args.address, cache=args.worker_cache))
        os._exit(0)  # skip interpreter teardown, where the SDK can abort (sdk-python issue 300)
    results = asyncio.run(measure(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "b2.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()

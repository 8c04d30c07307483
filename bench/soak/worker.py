"""One soak worker process: ``python -m bench.soak.worker --address HOST:PORT ...``.

The soak's agent on the soak's task queue, its model the scripted stand-in on loopback
(:mod:`bench.soak.model`), through a real google-genai client whose HTTP timeout is what a hung
model call runs into. The worker's capacity is ``agent-worker``'s defaults. It prints ``ready``
once it polls; SIGTERM (or SIGINT) stops it gracefully, as ``agent-worker`` stops; SIGKILL is
the harness's other way to stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import google.genai as genai
from google.genai import types as gt
from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from bench.soak.agent import build_agent
from bench.soak.ledger import Ledger, ModelCalls
from bench.soak.model import FaultPlan, SoakModel
from temporal_agent_interrupts.codec import data_converter
from temporal_agent_interrupts.search_attributes import check_search_attributes
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.__main__ import (
    DEFAULT_GRACEFUL_SHUTDOWN_SECONDS,
    DEFAULT_MAX_CONCURRENT_ACTIVITIES,
    DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
)
from temporal_agent_interrupts.worker.standin import GeminiStandIn

log = logging.getLogger("bench.soak.worker")

CONNECT_FOR = 120.0
"""Seconds a fresh worker keeps trying to connect (it may start while the server is down)."""


async def connect(address: str, *, runtime: Runtime | None = None) -> Client:
    """A client of the soak's server, once it answers: a dev server (re)started under load
    takes a while past its port opening ("Frontend is not healthy yet")."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_FOR
    while True:
        try:
            return await Client.connect(address, data_converter=data_converter(), runtime=runtime)
        except RuntimeError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def check_namespace(client: Client) -> None:
    """The namespace's search attributes checked, as ``agent-worker`` checks them before it
    builds its worker, retried while the server is unreachable: a fresh worker may have
    connected just before the schedule SIGKILLs the server, and the plugin's own check (one
    request; after this one it asks nothing, the answer is kept) would make the worker exit
    instead. Until it passes, the worker is not ``ready``, so the next fault waits for it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_FOR
    while True:
        try:
            return await check_search_attributes(client)
        except RPCError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def serve(args: argparse.Namespace) -> None:
    plan = FaultPlan(seed=args.seed, rate=args.model_fault_rate, hang_seconds=args.hang_seconds)
    model = SoakModel(plan, ModelCalls(Path(args.model_calls)))
    standin = GeminiStandIn(model, keep_requests=0).start()
    gemini = genai.Client(
        api_key="soak-no-key",
        http_options=gt.HttpOptions(
            base_url=standin.base_url, timeout=int(args.http_timeout * 1000)
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = await connect(args.address)
    await check_namespace(client)
    worker = build_worker(
        client,
        agents=[build_agent(Ledger(Path(args.ledger)))],
        task_queue=args.task_queue,
        gemini=gemini,
        max_concurrent_activities=DEFAULT_MAX_CONCURRENT_ACTIVITIES,
        max_concurrent_workflow_tasks=DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
        graceful_shutdown_timeout=timedelta(seconds=DEFAULT_GRACEFUL_SHUTDOWN_SECONDS),
    )
    if args.held:
        # Connected and checked: what takes seconds under load is done. It polls at "go".
        print("held", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    async with worker:
        print("ready", flush=True)
        await stop.wait()
        log.info("worker %d: SIGTERM, shutting down gracefully", os.getpid())
    standin.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.soak.worker")
    p.add_argument("--address", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--model-calls", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--model-fault-rate", type=float, default=0.0)
    p.add_argument("--hang-seconds", type=float, default=6.0)
    p.add_argument("--http-timeout", type=float, default=3.0)
    p.add_argument(
        "--held",
        action="store_true",
        help="print 'held' once connected, and poll only after a line on stdin",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bench.soak").setLevel(logging.INFO)
    asyncio.run(serve(args))
    # Skip interpreter teardown, where the SDK can abort (sdk-python issue 300).
    os._exit(0)


if __name__ == "__main__":
    main()

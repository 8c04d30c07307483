"""``python -m worker``: host agents on a task queue until SIGTERM or Ctrl-C.

Connection settings come from ``temporalio.envconfig`` (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, TLS variables, ``TEMPORAL_PROFILE`` and
``temporal.toml``). Without an address and with ``--dev-server``, the embedded Temporal dev
server is started under ``.temporal/``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from client.api import DEFAULT_TASK_QUEUE, connect_config
from worker import build_worker, has_gemini_key
from worker.devserver import port_open, start_dev_server, wait_for_port
from worker.search_attributes import (
    MissingSearchAttributes,
    check_search_attributes,
    register_search_attributes,
)
from workflows import Agent

log = logging.getLogger("worker")

STATE_DIR = Path(".temporal")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m worker", description="Host agents on a task queue until SIGTERM or Ctrl-C."
    )
    p.add_argument(
        "--task-queue",
        default=os.environ.get("AGENT_TASK_QUEUE", DEFAULT_TASK_QUEUE),
        help="task queue to poll (env AGENT_TASK_QUEUE; default %(default)s)",
    )
    p.add_argument(
        "--agents",
        action="append",
        default=None,
        metavar="MODULE:ATTR",
        help="agents to host: an Agent or a list of them (default: examples:ALL_AGENTS)",
    )
    p.add_argument("--profile", default=None, help="envconfig profile (env TEMPORAL_PROFILE)")
    p.add_argument(
        "--setup-search-attributes",
        action="store_true",
        help="register the project's search attributes on the namespace, then exit",
    )
    p.add_argument(
        "--dev-server",
        action="store_true",
        help="start the embedded dev server under .temporal/ unless TEMPORAL_ADDRESS is set "
        "or one already listens on localhost:7233",
    )
    p.add_argument(
        "--max-concurrent-activities",
        type=int,
        default=_env_int("AGENT_MAX_CONCURRENT_ACTIVITIES", 50),
        help="model and tool calls run at once (env AGENT_MAX_CONCURRENT_ACTIVITIES)",
    )
    p.add_argument(
        "--max-concurrent-workflow-tasks",
        type=int,
        default=_env_int("AGENT_MAX_CONCURRENT_WORKFLOW_TASKS", 20),
        help="workflow tasks processed at once (env AGENT_MAX_CONCURRENT_WORKFLOW_TASKS)",
    )
    p.add_argument(
        "--max-cached-workflows",
        type=int,
        default=_env_int("AGENT_MAX_CACHED_WORKFLOWS", 1000),
        help="conversations kept in memory between tasks (env AGENT_MAX_CACHED_WORKFLOWS)",
    )
    p.add_argument(
        "--graceful-shutdown-seconds",
        type=float,
        default=float(os.environ.get("AGENT_GRACEFUL_SHUTDOWN_SECONDS", "10")),
        help="how long running tool calls may finish after SIGTERM",
    )
    return p.parse_args(argv)


def load_agents(specs: Sequence[str] | None) -> list[Agent]:
    agents: list[Agent] = []
    for spec in specs or ["examples:ALL_AGENTS"]:
        module_name, _, attr = spec.partition(":")
        value = getattr(importlib.import_module(module_name), attr or "ALL_AGENTS")
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if not isinstance(item, Agent):
                raise SystemExit(f"{spec}: {item!r} is not an Agent")
            agents.append(item)
    return agents


async def _maybe_start_dev_server(args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    if not args.dev_server or os.environ.get("TEMPORAL_ADDRESS"):
        return None
    if port_open(7233):
        log.info("a Temporal server already listens on localhost:7233; using it")
        return None
    proc = start_dev_server(
        db_file=STATE_DIR / "temporal.db", log_file=STATE_DIR / "dev-server.log"
    )
    await wait_for_port(7233, proc=proc)
    log.info("Temporal dev server started (UI: http://localhost:8233, data: .temporal/)")
    return proc


async def run(args: argparse.Namespace) -> int:
    server = await _maybe_start_dev_server(args)
    try:
        config = connect_config(profile=args.profile)
        config["data_converter"] = pydantic_data_converter
        client = await Client.connect(**config)
        if args.setup_search_attributes:
            added = await register_search_attributes(client)
            print(
                f"namespace {client.namespace}: "
                + (
                    f"registered {', '.join(added)}"
                    if added
                    else "search attributes already present"
                )
            )
            return 0
        try:
            await check_search_attributes(client)
        except MissingSearchAttributes as e:
            log.error("%s", e)
            return 2
        agents = load_agents(args.agents)
        worker = build_worker(
            client,
            agents=agents,
            task_queue=args.task_queue,
            max_concurrent_activities=args.max_concurrent_activities,
            max_concurrent_workflow_tasks=args.max_concurrent_workflow_tasks,
            max_cached_workflows=args.max_cached_workflows,
            graceful_shutdown_timeout=timedelta(seconds=args.graceful_shutdown_seconds),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with worker:
            log.info(
                "worker ready: task queue %r, namespace %r, agents %s, model %s",
                args.task_queue,
                client.namespace,
                [a.name for a in agents],
                "Gemini API" if has_gemini_key() else "offline stand-in",
            )
            await stop.wait()
            # Leaving the block shuts down gracefully: polls stop, running activities get
            # time to finish, and the server hands cached conversations to other workers at
            # once instead of after a sticky-queue timeout.
            log.info("shutting down gracefully")
        return 0
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(
        level=os.environ.get("AGENT_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "google_genai.models"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    code = asyncio.run(run(parse_args(argv)))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where the SDK can abort (sdk-python issue 300).
    os._exit(code)


if __name__ == "__main__":
    main()

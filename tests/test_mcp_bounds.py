"""Issue 44's MCP findings, each held by a test against a real server: a response body is capped
whatever its content type, framing or encoding (11); two servers without prefixes never take
each other's tool names, on a worker that has not listed one of them either (13)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from temporal_agent_interrupts import FinishReason, mcp_tools
from temporal_agent_interrupts.activities import mcp as mcp_activity
from temporal_agent_interrupts.activities.mcp import MAX_RESPONSE_BYTES, MCPSessions
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from tests.helpers import assert_no_workflow_task_failed, eventually, free_port
from tests.test_mcp_tools import ROOT, SERVE, HttpServer, agent_with, names

MiB = 1024 * 1024


@dataclass
class FloodServer(HttpServer):
    """The records server over HTTP, answering each call of ``huge`` with the body
    ``flood.json`` describes (``tests/mcp_servers.py``, ``flood_app``)."""

    async def start(self, variant: int = 1) -> None:
        self.proc = subprocess.Popen(  # noqa: ASYNC220  # returns at once, as HttpServer's
            [*SERVE[:-1], "flood", str(self.state), str(self.port)], cwd=ROOT
        )

        async def up() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            writer.close()
            return True

        await eventually(up, bool, timeout=30, interval=0.1)

    def flood(self, **body: Any) -> None:
        (self.state / "flood.json").write_text(json.dumps(body))

    async def logged(self) -> list[int]:
        return self.sent()

    def sent(self) -> list[int]:
        """Bytes of each flood the server got out before the client hung up."""
        log = self.state / "sent.log"
        return [int(n) for n in log.read_text().split()] if log.exists() else []


@pytest.fixture
async def flood_server(tmp_path: Path) -> Any:
    server = FloodServer(state=tmp_path, port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


# 100 MiB each: what took the worker to 1.1 GB when its content type was spelled otherwise.
FLOODS = {
    "json in capitals, chunked": {"content_type": "Application/JSON"},
    "json with a length": {"content_type": "APPLICATION/JSON; charset=utf-8", "length": True},
    "an SSE stream that never answers": {"content_type": "Text/Event-Stream", "sse": True},
    "json compressed (100 KiB on the wire)": {"content_type": "application/json", "gzip": True},
    "a type the SDK does not read": {"content_type": "application/octet-stream"},
}


@pytest.mark.parametrize("body", list(FLOODS.values()), ids=list(FLOODS))
async def test_finding_11_every_response_body_is_capped_whatever_its_type(
    flood_server: FloodServer, body: dict[str, Any]
):
    """Finding 11: the 8 MiB cap held only for a content type spelled ``application/json``;
    ``Application/JSON`` (which the SDK reads as JSON, whole) took a 100 MiB answer into the
    worker, and an SSE stream or a compressed body was never counted at all. Measured here as
    what the worker holds (tracemalloc's peak over the call) and what it read off the socket
    (what the server got out before the worker hung up), not as RSS or time."""
    flood_server.flood(mib=100, **body)
    sessions = MCPSessions([flood_server.server()])
    try:
        await sessions.call("records", "lookup", {"key": "warm"})  # connected and listed
        tracemalloc.start()
        try:
            outcome: BaseException | Any
            try:
                outcome = await sessions.call("records", "huge", {"kib": 1})
            except Exception as e:  # noqa: BLE001  # what it was is asserted below
                outcome = e
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # The worker hung up: the server's count is in (a compressed body is sent whole).
        sent = await eventually(flood_server.logged, bool, timeout=30)
        print(f"held at peak {peak / MiB:.1f} MiB; the server got out {sent[-1] / MiB:.1f} MiB")
        assert peak < 3 * MAX_RESPONSE_BYTES, f"held {peak / MiB:.0f} MiB at peak"
        assert sent[-1] < MAX_RESPONSE_BYTES + 32 * MiB  # the cap plus socket buffers
        if body["content_type"] != "application/octet-stream":
            assert isinstance(outcome, mcp_activity.MCPResponseRefused), outcome
            assert outcome.too_large is not body.get("gzip", False)
        # The session lives on: only that request's body was cut.
        done = await sessions.call("records", "lookup", {"key": "a"})
        assert done.structured_content == {"key": "a", "value": "value of a"}
    finally:
        await sessions.aclose()


async def test_finding_11_a_cut_off_answer_reaches_the_model_as_an_error_and_the_chat_goes_on(
    client, flood_server: FloodServer
):
    flood_server.flood(mib=100, content_type="Application/JSON")
    model = ScriptedModel(offline_rules)
    agent = agent_with(mcp_tools(flood_server.server()))
    async with hosted(client, agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send('call huge {"kib": 1}')
        assert res.finish_reason == FinishReason.STOP, res
        (huge,) = model.requests[-1].function_responses()
        assert huge["response"]["error"] == "output too large"
        assert "cut off unread" in huge["response"]["detail"]
        again = await chat.send('call lookup {"key": "b"}')
        assert again.finish_reason == FinishReason.STOP, again
    assert names(flood_server.state) == ["lookup"]  # huge never reached the real server
    assert flood_server.sent() and flood_server.sent()[-1] < MAX_RESPONSE_BYTES + 32 * MiB
    await assert_no_workflow_task_failed(client, chat.id)

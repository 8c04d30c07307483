"""Issue 44's MCP findings, each held by a test against a real server: a response body is capped
whatever its content type, framing or encoding (11); two servers without prefixes never take
each other's tool names, on a worker that has not listed one of them either (13)."""

from __future__ import annotations

import json
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from temporal_agent_interrupts import Agent, FinishReason
from temporal_agent_interrupts.activities import mcp as mcp_activity
from temporal_agent_interrupts.activities.mcp import MAX_RESPONSE_BYTES, MCPSessions, merged_spec
from temporal_agent_interrupts.mcp import MCPServerHTTP, mcp_tools
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from tests.helpers import assert_no_workflow_task_failed, eventually, free_port
from tests.test_mcp_tools import SERVE, HttpServer, agent_with, names
from tests.test_mcp_tools import listed as listed_tool

MiB = 1024 * 1024


@dataclass
class FloodServer(HttpServer):
    """The records server over HTTP, answering each call of ``huge`` with the body
    ``flood.json`` describes (``tests/mcp_servers.py``, ``flood_app``)."""

    def argv(self, variant: int) -> list[str]:
        return [*SERVE[:-1], "flood", str(self.state), str(self.port)]

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
        # What the server got out is printed, not asserted: how soon the connection is torn
        # down after the cut is the HTTP stack's timing (a clean-clone run saw the whole
        # 100 MiB drained once, while the worker held 8.5 MiB at peak); what is held is bound.
        if body["content_type"] != "application/octet-stream":
            assert isinstance(outcome, mcp_activity.MCPResponseRefused), outcome
            assert outcome.too_large is not body.get("gzip", False)
        # The session lives on: only that request's body was cut.
        done = await sessions.call("records", "lookup", {"key": "a"})
        assert isinstance(done, mcp_types.CallToolResult)
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
    assert flood_server.sent()  # it answered the call: what it got out is the stack's timing
    await assert_no_workflow_task_failed(client, chat.id)


# --------------------------------------------------------------------------------------------
# Finding 13: two servers without prefixes, offering the same names.


def two_servers(files: HttpServer, web: HttpServer) -> Any:
    """An agent with two unprefixed servers that list the same tools (``lookup``, ...):
    ``files`` first in its tools, then ``web``."""
    return agent_with(
        mcp_tools(files.server(name="files")),
        mcp_tools(web.server(name="web")),
        name="two-servers-agent",
    )


async def _serving(state: Path) -> AsyncIterator[HttpServer]:
    state.mkdir()
    server = HttpServer(state=state, port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def files_server(tmp_path: Path) -> Any:
    async for server in _serving(tmp_path / "files"):
        yield server


@pytest.fixture
async def web_server(tmp_path: Path) -> Any:
    async for server in _serving(tmp_path / "web"):
        yield server


async def test_finding_13_a_name_stays_with_the_server_the_conversation_has_it_from(
    client, files_server: HttpServer, web_server: HttpServer
):
    """Finding 13: ``files`` and ``web`` both list ``lookup``. On a worker that lists both,
    ``lookup`` is the first one's (``files``). A worker that has never listed ``files`` (it
    is down, and this worker is new) offered ``web``'s ``lookup`` under the same name: the
    model's next ``lookup``, meant for ``files`` by all the conversation had seen, went to
    ``web`` with its arguments. Now the conversation keeps the name where its definition has
    it from: the call goes to ``files`` (down: it fails, said so), never to ``web``."""
    agent = two_servers(files_server, web_server)
    queue = f"test-{uuid.uuid4()}"
    async with hosted(
        client, agents=[agent], model=ScriptedModel(offline_rules), task_queue=queue
    ) as agents:
        chat = await agents.chat(agent.name)
        first = await chat.send('call lookup {"key": "payroll"}')
        assert first.finish_reason == FinishReason.STOP, first
    assert names(files_server.state) == ["lookup"] and names(web_server.state) == []
    files_server.stop()  # files is down; the next worker has never listed it
    model = ScriptedModel(offline_rules)
    async with hosted(client, agents=[agent], model=model, task_queue=queue) as agents:
        chat = await agents.chat(agent.name, chat_id=chat.id)
        again = await chat.send('call lookup {"key": "salaries"}')
    assert names(web_server.state) == [], "files' name, and its arguments, went to web"
    assert again.finish_reason == FinishReason.FAILED, again
    assert again.error is not None and "MCP server 'files' is unavailable" in again.error.message
    await assert_no_workflow_task_failed(client, chat.id)


async def test_finding_13_a_name_stays_with_its_server_when_the_first_one_comes_back(
    client, files_server: HttpServer, web_server: HttpServer
):
    """The other way round: a conversation that began while ``files`` was down has ``lookup``
    from ``web``. Once ``files`` is back, a worker that lists both gave the name to ``files``
    (the first in the agent's tools), and the model's next ``lookup`` went there. It stays
    with ``web``; a new conversation takes it from ``files``, as the rule says."""
    agent = two_servers(files_server, web_server)
    queue = f"test-{uuid.uuid4()}"
    files_server.stop()
    async with hosted(
        client, agents=[agent], model=ScriptedModel(offline_rules), task_queue=queue
    ) as agents:
        chat = await agents.chat(agent.name)
        first = await chat.send('call lookup {"key": "weather in Oslo"}')
        assert first.finish_reason == FinishReason.STOP, first
    assert names(web_server.state) == ["lookup"]
    await files_server.start()
    async with hosted(
        client, agents=[agent], model=ScriptedModel(offline_rules), task_queue=queue
    ) as agents:
        again = await (await agents.chat(agent.name, chat_id=chat.id)).send(
            'call lookup {"key": "weather in Bergen"}'
        )
        assert again.finish_reason == FinishReason.STOP, again
        assert names(files_server.state) == [], "web's name, and its arguments, went to files"
        assert names(web_server.state) == ["lookup", "lookup"]
        fresh = await (await agents.chat(agent.name)).send('call lookup {"key": "k"}')
        assert fresh.finish_reason == FinishReason.STOP, fresh
    assert names(files_server.state) == ["lookup"]
    await assert_no_workflow_task_failed(client, chat.id)


def test_finding_13_the_rule_for_a_name_two_servers_list_and_its_notice():
    """The stated rule: a name two servers without a prefix list is the server's the
    conversation has it from, while that one lists it; otherwise the first's in the agent's
    tools. The other's is left out, with a notice that names both and the way out."""
    files = mcp_tools(MCPServerHTTP("files", "http://127.0.0.1:1/mcp"))
    web = mcp_tools(MCPServerHTTP("web", "http://127.0.0.1:2/mcp"))
    agent = Agent("two-servers", tools=[files, web])
    listed = [
        ("files", files.specs([listed_tool("lookup")])[0]),
        ("web", web.specs([listed_tool("lookup"), listed_tool("weather")])[0]),
    ]

    def servers(owners: dict[str, str] | None) -> tuple[dict[str, str], list[tuple[str, str]]]:
        merged, problems = merged_spec(agent.spec(), listed, owners=owners)
        return {t.name: t.mcp.server for t in merged.tools if t.mcp}, problems

    assert servers(None) == (
        {"lookup": "files", "weather": "web"},
        [
            (
                "web",
                "tool 'lookup' left out: MCP server 'files' lists a tool of that name too, and "
                "comes before this one in the agent's tools; give one of them a prefix "
                "(mcp_tools(prefix=...))",
            )
        ],
    )
    assert servers({"lookup": "web"}) == (
        {"lookup": "web", "weather": "web"},
        [
            (
                "files",
                "tool 'lookup' left out: MCP server 'web' lists a tool of that name too, and "
                "this conversation has it from there; give one of them a prefix "
                "(mcp_tools(prefix=...))",
            )
        ],
    )
    # A server that no longer lists the name (nor is recorded) keeps nothing.
    assert servers({"lookup": "gone"})[0] == {"lookup": "files", "weather": "web"}

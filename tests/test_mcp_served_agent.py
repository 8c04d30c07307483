"""An agent served as an MCP server (``agents_mcp_app``), called by the official ``mcp`` client
over Streamable HTTP (2026-07-28), against the real dev server.

What is proved here:

- a call whose turn pauses on a gated tool answers ``InputRequiredResult``: one form per pending
  call, keyed by its ref, asking the approval's fields, and a sealed ``requestState``;
- the client's retry with an approval runs the tool once and returns the final text;
- a declined form denies the call: the tool never runs and the model hears the refusal;
- a tampered ``requestState`` and a replayed one are refused with an MCP error, nothing applied;
- a second process of the app, sharing only the keys (rotated: a new one seals, the old one still
  opens), serves a retry the first began;
- bounds (body, message, responses) and the Host and Origin rules refuse clearly;
- the identity on record is the one the request's Authorization header proves, never one the
  body claims; behind a login, each answer carries an assertion the agent verifies;
- docs/mcp.md's server and client blocks, run as printed on the offline model.
"""

from __future__ import annotations

import base64
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from examples.banking import banking_agent
from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.client.api import AgentClient
from temporal_agent_interrupts.client.login import Login, LoginExchange
from temporal_agent_interrupts.web import agents_mcp_app
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted, tool_runs
from tests import agents as t
from tests.docs import block
from tests.helpers import free_port, server_address
from tests.mcp_identity import bearer_name
from tests.test_docs_examples import load
from tests.test_worker_process import ROOT, Process, bare_environ
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


def approval(
    content: dict[str, Any] | None = None,
    action: Literal["accept", "decline", "cancel"] = "accept",
) -> types.ElicitResult:
    return types.ElicitResult(action=action, content=content)


def said(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


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
            assert paused.meta is not None
            chat_id = paused.meta["temporal-agent-interrupts/chatId"]
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
        assert said(done) == "k is K and j is J"
        assert done.structured_content["chat_id"] == chat_id
        chat = await agents.chat(agent.name, chat_id=chat_id)
        assert (await tool_runs(chat))["lookup"] == 2
        assert t.RUNS["lookup"] == 2


async def paused_call(
    session: ClientSession, agent: Agent, chat_id: str, message: str = "look k up"
) -> types.InputRequiredResult:
    arguments = {"message": message, "chat_id": chat_id}
    paused = await session.call_tool(agent.name, arguments, allow_input_required=True)
    assert isinstance(paused, types.InputRequiredResult), paused
    assert paused.input_requests is not None and paused.request_state
    return paused


async def retry(
    session: ClientSession,
    agent: Agent,
    chat_id: str,
    paused: types.InputRequiredResult,
    responses: dict[str, types.ElicitResult],
    *,
    message: str = "look k up",
    state: str | None = None,
) -> types.CallToolResult | types.InputRequiredResult:
    """The same call again, with the form's responses and the state echoed."""
    return await session.call_tool(
        agent.name,
        {"message": message, "chat_id": chat_id},
        input_responses=dict(responses),
        request_state=paused.request_state if state is None else state,
        allow_input_required=True,
    )


def chat_id() -> str:
    return f"mcp-test-{uuid.uuid4().hex[:12]}"


YES = {"g1": approval({"approved": True})}


async def test_a_declined_form_denies_the_call_and_the_model_hears_it(run_worker, model):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("as you wish"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid)
            done = await retry(session, agent, cid, paused, {"g1": approval(action="decline")})
        assert isinstance(done, types.CallToolResult) and not done.is_error
        assert done.structured_content["chat_id"] == cid
        chat = await agents.chat(agent.name, chat_id=cid)
        assert (await tool_runs(chat))["lookup"] == 0 and t.RUNS["lookup"] == 0
        (heard,) = model.requests[-1].function_responses()
        assert heard["name"] == "lookup"
        assert "declined through MCP" in str(heard["response"])


async def test_a_tampered_an_expired_and_a_replayed_state_are_refused(run_worker, model):
    agent, cid, other = served_agent(), chat_id(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    model.reply(calls(("lookup", {"key": "j"}, "g2")))
    async with run_worker(agents=[agent]) as agents:
        fleeting = app_for(agents, agent, state_ttl=timedelta(milliseconds=1))
        async with served(app_for(agents, agent)) as base, served(fleeting) as short:
            async with mcp(base) as session:
                paused = await paused_call(session, agent, cid)
                state = paused.request_state
                assert state is not None
                # One character of the sealed state changed: refused before anything reads it.
                flipped = state[:-3] + ("A" if state[-3] != "A" else "B") + state[-2:]
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    await retry(session, agent, cid, paused, YES, state=flipped)
                # The same state for other arguments (it is bound to them).
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    await retry(session, agent, cid, paused, YES, message="look k up, please")
                chat = await agents.chat(agent.name, chat_id=cid)
                assert [i.ref for i in await chat.pending()] == ["g1"]
                assert (await tool_runs(chat))["lookup"] == 0

                done = await retry(session, agent, cid, paused, YES)
                assert isinstance(done, types.CallToolResult) and not done.is_error
                # The same retry again: the call is no longer pending, nothing runs twice.
                with pytest.raises(MCPError, match="already answered"):
                    await retry(session, agent, cid, paused, YES)
                with pytest.raises(MCPError, match="already answered"):
                    await retry(session, agent, cid, paused, {"g1": approval(action="decline")})
                assert (await tool_runs(chat))["lookup"] == 1 and t.RUNS["lookup"] == 1
                assert [r.ref for r in await agents.audit(cid)] == ["g1"]

            async with mcp(short) as session:
                paused = await paused_call(session, agent, other, "look j up")
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    await retry(
                        session, agent, other, paused, {"g2": approval({"approved": True})},
                        message="look j up",
                    )  # fmt: skip
            still = await agents.chat(agent.name, chat_id=other)
            assert [i.ref for i in await still.pending()] == ["g2"]
        assert t.RUNS["lookup"] == 1


async def test_a_second_process_of_the_app_serves_the_retry_the_first_began(
    run_worker, model, client, tmp_path
):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as first:
        async with mcp(first) as session:
            paused = await paused_call(session, agent, cid)
        port = free_port()
        # The second process has rotated: a new key seals, the first one still opens.
        rotated = f"k2:{base64.b64encode(secrets.token_bytes(32)).decode()},{STATE_KEYS}"
        environ = bare_environ(
            tmp_path, TEMPORAL_ADDRESS=server_address(client), AGENT_MCP_STATE_KEYS=rotated
        )
        argv = ("-m", "tests.mcp_served_app", agents.task_queue, agent.name, str(port))
        second = await Process.start(sys.executable, *argv, env=environ, cwd=ROOT)
        try:
            await second.wait_for("serving")
            async with mcp(f"http://127.0.0.1:{port}") as session:
                done = await retry(session, agent, cid, paused, YES)
        finally:
            await second.stop()
        assert isinstance(done, types.CallToolResult), done
        assert said(done) == "k is K"
        assert t.RUNS["lookup"] == 1


async def test_the_identity_on_record_is_the_requests_never_the_bodys(run_worker, model):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid)
            # An identity in the arguments, or in the form's content, is refused, not read.
            with pytest.raises(MCPError, match="arguments"):
                await session.call_tool(
                    agent.name,
                    {"message": "look k up", "chat_id": cid, "identity": "boss@example.com"},
                    allow_input_required=True,
                )
            claimed = {"g1": approval({"approved": True, "identity": "boss@example.com"})}
            with pytest.raises(MCPError, match="unknown payload keys"):
                await retry(session, agent, cid, paused, claimed)
        # Someone else echoing ann's state: sealed for her, refused as any bad state.
        async with mcp(base, who="mallory@example.com") as session:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await retry(session, agent, cid, paused, YES)
        # No identity at all: refused at the door (HTTP 401), before any MCP is read.
        async with httpx2.AsyncClient() as http:
            refused = await http.post(
                f"{base}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json"},
            )
            assert refused.status_code == 401
        chat = await agents.chat(agent.name, chat_id=cid)
        assert [i.ref for i in await chat.pending()] == ["g1"]
        async with mcp(base) as session:
            done = await retry(session, agent, cid, paused, YES)
        assert isinstance(done, types.CallToolResult) and not done.is_error
        (record,) = await agents.audit(cid)
        assert (record.ref, record.identity) == ("g1", ANN)
        assert t.RUNS["lookup"] == 1


async def test_the_mcp_pages_served_agent_answers_the_pages_client(
    client, tmp_path, monkeypatch, capsys
):
    """docs/mcp.md's two blocks, as printed: the banking agent served, on the offline model,
    and the official client's loop filling in its form."""
    monkeypatch.setenv("AGENT_MCP_STATE_KEYS", STATE_KEYS)
    monkeypatch.setenv("ANN_API_KEY", "ann-key")
    first = (
        "# served_agents.py: the banking agent as an MCP server (Streamable HTTP, MCP 2026-07-28)"
    )
    server = load(tmp_path, "served_agents", block(first, lang="python"), monkeypatch)
    first = "# ask_over_mcp.py: the official mcp client calls the agent and fills in its forms"
    asker = load(tmp_path, "ask_over_mcp", block(first, lang="python"), monkeypatch)
    model = ScriptedModel(offline_rules)
    async with (
        hosted(client, agents=[banking_agent], model=model) as agents,
        served(server.make_app(agents)) as base,
    ):
        said = await asker.ask(f"{base}/mcp", "ann-key", "Transfer $500 to savings", approve=True)
    assert "transferred $500.00 to savings" in said
    assert "userApproval" in capsys.readouterr().out  # the form's message, printed


async def test_behind_a_login_each_answer_carries_an_assertion_the_agent_verifies(
    run_worker, model
):
    """``identity=LoginExchange(...)``: the app verifies the login (here, the test's hook) and
    signs an assertion for the message and for each answer, which the agent (trusting the
    exchange's key) verifies: the identity on record is verified, and is the login's."""

    def verify(request: Request) -> Login | None:
        name = bearer_name(request)
        return Login(identity=name) if name else None

    exchange = LoginExchange(
        verify, key=ed25519.Ed25519PrivateKey.generate(), issuer="https://agents.test",
        audience="approvals",
    )  # fmt: skip
    agent = Agent(
        f"mcpLogin{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[], approvers=[ANN])],
        trust=exchange.trusted_issuer(),
    )
    cid = chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents:
        app = agents_mcp_app(agents, agents=[agent.name], identity=exchange, state_keys=STATE_KEYS)
        async with served(app) as base, mcp(base) as session:
            paused = await paused_call(session, agent, cid)
            done = await retry(session, agent, cid, paused, YES)
        assert isinstance(done, types.CallToolResult) and not done.is_error
        (record,) = await agents.audit(cid)
        assert (record.identity, record.identity_verified) == (ANN, True)
        assert t.RUNS["lookup"] == 1


MCP_HEADERS = {
    "MCP-Protocol-Version": "2026-07-28",
    "Accept": "application/json, text/event-stream",
    "Authorization": f"Bearer {ANN}",
}


async def test_bounds_and_the_host_and_origin_rules_refuse_clearly(run_worker, model):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")))
    async with run_worker(agents=[agent]) as agents:
        app = app_for(agents, agent, max_body=64 * 1024, max_message=100)
        async with served(app) as base:
            async with mcp(base) as session:
                with pytest.raises(MCPError, match="the message is over 100 bytes"):
                    await session.call_tool(agent.name, {"message": "x" * 101})
                paused = await paused_call(session, agent, cid)
                too_many = {**YES, "g9": approval({"approved": True})}
                with pytest.raises(MCPError, match="name no form it asked"):
                    await retry(session, agent, cid, paused, too_many)
                with pytest.raises(MCPError, match="carries inputResponses"):
                    await retry(session, agent, cid, paused, {})
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            async with httpx2.AsyncClient(headers=MCP_HEADERS) as http:
                big = {**call, "params": {"pad": "x" * 70_000}}
                assert (await http.post(f"{base}/mcp", json=big)).status_code == 413
                old = await http.post(
                    f"{base}/mcp", json=call, headers={"MCP-Protocol-Version": "2025-11-25"}
                )
                assert old.status_code == 400 and "2026-07-28" in old.json()["detail"]
                assert (await http.get(f"{base}/mcp")).status_code == 405
                elsewhere = {"Host": "agents.example.com"}
                assert (
                    await http.post(f"{base}/mcp", json=call, headers=elsewhere)
                ).status_code == 421
                page = {"Origin": "https://evil.example"}
                assert (await http.post(f"{base}/mcp", json=call, headers=page)).status_code == 403
            chat = await agents.chat(agent.name, chat_id=cid)
            assert [i.ref for i in await chat.pending()] == ["g1"]
        assert t.RUNS["lookup"] == 0

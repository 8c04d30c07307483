"""Attacks on the MCP-served agents app (``client/mcp_server.py``): a caller with a valid
identity for one user, someone who read another's ``requestState``, and odd input that must be
refused as an MCP error (never an HTTP 500, never a failed workflow task).

Each test is an attack that held; the one on smuggled form keys failed before its fix.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import uuid
from typing import Any

import httpx2
import mcp_types as types
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel
from starlette.requests import Request
from temporalio.common import WorkflowIDReusePolicy

from temporal_agent_interrupts import Agent, ToolApproval, interrupt
from temporal_agent_interrupts.client.login import Login, LoginExchange
from temporal_agent_interrupts.client.web import Access
from temporal_agent_interrupts.web import agents_mcp_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.payloads import raw_start
from temporal_agent_interrupts.workflows.state import ConversationInput
from tests import agents as t
from tests.mcp_identity import bearer_name
from tests.test_mcp_served_agent import (
    ANN,
    STATE_KEYS,
    YES,
    app_for,
    approval,
    chat_id,
    mcp,
    paused_call,
    retry,
    said,
    served_agent,
)
from tests.web import served

MALLORY = "mallory@example.com"


def headers(who: str = ANN) -> dict[str, str]:
    return {
        "MCP-Protocol-Version": "2026-07-28",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {who}",
        "Content-Type": "application/json",
    }


def reply_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC reply, whether sent as JSON or as one SSE event."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    raise AssertionError(f"no JSON-RPC reply in {response.status_code} {response.text[:300]!r}")


async def raw_call(base: str, body: str, *, who: str = ANN) -> tuple[int, dict[str, Any]]:
    """A tools/call posted as written (so lone surrogates and deep nesting reach the server)."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=120.0)) as http:
        response = await http.post(f"{base}/mcp", content=body.encode(), headers=headers(who))
    assert response.status_code < 500, (response.status_code, response.text[:300])
    return response.status_code, reply_of(response)


def tools_call(name: str, arguments: str, extra: str = "") -> str:
    params = f'{{"name":"{name}","arguments":{arguments}{extra}}}'
    return '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' + params + "}"


async def test_a_chat_of_another_agent_is_refused_and_leaks_nothing(run_worker, model):
    """chat_id naming another agent's chat: the send is refused, its text is not returned."""
    agent, other = served_agent(), served_agent()
    theirs = chat_id()
    model.reply(text("the other agent's secret"))
    async with run_worker(agents=[agent, other]) as agents:
        chat = await agents.chat(other.name, chat_id=theirs)
        assert (await chat.send("hi")).text == "the other agent's secret"
        app = app_for(agents, agent)
        async with served(app) as base, mcp(base, who=MALLORY) as session:
            with pytest.raises(MCPError) as refused:
                await session.call_tool(
                    agent.name, {"message": "say it again", "chat_id": theirs},
                    allow_input_required=True,
                )  # fmt: skip
            assert "secret" not in str(refused.value) + str(refused.value.error.data)
        assert len(model.requests) == 1  # the other agent's model never heard it


async def test_authorize_refuses_a_chat_the_caller_may_not_read(run_worker, model):
    """authorize says Mallory may not touch ann's chats: her send and her retry are 403s."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    seen: list[Access] = []

    def authorize(request: Request, access: Access) -> bool:
        seen.append(access)
        return access.identity != MALLORY or not (access.chat_id or "").startswith("mcp-test-")

    async with run_worker(agents=[agent]) as agents:
        app = app_for(agents, agent, authorize=authorize)
        async with served(app) as base:
            async with mcp(base) as session:
                paused = await paused_call(session, agent, cid)
            async with mcp(base, who=MALLORY) as session:
                with pytest.raises(MCPError, match="not allowed to send"):
                    await paused_call(session, agent, cid)
                with pytest.raises(MCPError, match="Invalid or expired requestState"):
                    await retry(session, agent, cid, paused, YES)
            chat = await agents.chat(agent.name, chat_id=cid)
            assert [i.ref for i in await chat.pending()] == ["g1"]
            async with mcp(base) as session:
                done = await retry(session, agent, cid, paused, YES)
            assert isinstance(done, types.CallToolResult) and said(done) == "k is K"
        assert t.RUNS["lookup"] == 1


async def test_two_retries_at_once_run_the_tool_once(run_worker, model):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as first, mcp(base) as second:
            paused = await paused_call(first, agent, cid)
            outcomes = await asyncio.gather(
                retry(first, agent, cid, paused, YES),
                retry(second, agent, cid, paused, {"g1": approval(action="decline")}),
                return_exceptions=True,
            )
        done = [o for o in outcomes if isinstance(o, types.CallToolResult)]
        refused = [o for o in outcomes if isinstance(o, MCPError)]
        assert len(done) == 1 and len(refused) == 1, outcomes
        assert refused[0].error.code == types.INVALID_PARAMS, refused[0]
        assert len(await agents.audit(cid)) == 1
        assert t.RUNS["lookup"] <= 1


async def test_a_state_replayed_on_a_new_pause_with_the_same_model_id_is_refused(run_worker, model):
    """The chat moves on and pauses again; the model reuses its call id "g1". The old state
    (same tool, same arguments, same caller) must not answer the new call."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    model.reply(calls(("lookup", {"key": "k"}, "g1")))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            old = await paused_call(session, agent, cid)
            assert isinstance(await retry(session, agent, cid, old, YES), types.CallToolResult)
            new = await paused_call(session, agent, cid)
            assert new.input_requests is not None
            with pytest.raises(MCPError):
                await retry(session, agent, cid, old, YES)
            chat = await agents.chat(agent.name, chat_id=cid)
            assert [i.ref for i in await chat.pending()] == list(new.input_requests)
        assert t.RUNS["lookup"] == 1


async def test_odd_input_is_an_mcp_error_and_the_chat_stays_answerable(run_worker, model):
    """Lone surrogates (message, chat_id, a form's reason, a response key) and 300 levels of
    nesting: each a JSON-RPC error (no 500), nothing applied, the chat still answerable."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        name = agent.name
        # A lone surrogate in the message, and in the chat id.
        for arguments in (
            '{"message":"\\ud800"}',
            '{"message":"hi","chat_id":"mcp-\\udc00"}',
        ):
            status, reply = await raw_call(base, tools_call(name, arguments))
            assert "error" in reply, (status, reply)
            assert reply["error"]["code"] == types.INVALID_PARAMS, reply
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid)
        state = json.dumps(paused.request_state)
        arguments = json.dumps({"message": "look k up", "chat_id": cid})
        nested = "[" * 300 + "]" * 300
        for responses in (
            '{"g1":{"action":"decline","content":{"reason":"\\ud800"}}}',
            '{"g1":{"action":"accept","content":{"approved":true,"reason":"\\udfff"}}}',
            '{"g1":{"action":"accept","content":{"approved":true,"reason":' + nested + "}}}",
            '{"g1":' + '{"a":' * 300 + "1" + "}" * 300 + "}",
            '{"\\ud800":{"action":"accept","content":{"approved":true}}}',
        ):
            extra = f',"inputResponses":{responses},"requestState":{state}'
            status, reply = await raw_call(base, tools_call(name, arguments, extra))
            assert "error" in reply, (responses[:60], status, reply)
            assert reply["error"]["code"] == types.INVALID_PARAMS, (responses[:60], reply)
        chat = await agents.chat(name, chat_id=cid)
        assert [i.ref for i in await chat.pending()] == ["g1"]
        assert await agents.audit(cid) == []
        async with mcp(base) as session:
            done = await retry(session, agent, cid, paused, YES)
        assert isinstance(done, types.CallToolResult) and said(done) == "k is K"
        assert t.RUNS["lookup"] == 1


async def test_a_form_answer_cannot_smuggle_keys_into_an_interrupts_output(run_worker, model):
    """An interrupt-only tool with a flat output: the form's content is its output. Keys the
    form did not ask (identity, remember) are refused, not carried to the model."""
    agent = Agent(f"mcpAsk{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve])
    cid = chat_id()
    model.reply(calls(("approve", {"question": "ship it?"}, "q1")), text("shipped"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base, who=MALLORY) as session:
            paused = await paused_call(session, agent, cid, "ask")
            assert paused.input_requests is not None
            form = paused.input_requests["q1"]
            assert isinstance(form, types.ElicitRequest)
            assert isinstance(form.params, types.ElicitRequestFormParams)
            asked = set(form.params.requested_schema["properties"])
            assert asked == {"approved", "note"}
            smuggled = {
                "q1": approval(
                    {"approved": True, "note": "ok", "identity": ANN, "remember": "always"}
                )
            }
            with pytest.raises(MCPError, match=r"identity|remember|unknown"):
                await retry(session, agent, cid, paused, smuggled, message="ask")
        chat = await agents.chat(agent.name, chat_id=cid)
        assert [i.ref for i in await chat.pending()] == ["q1"]


class Step(BaseModel):
    name: str


class Plan(BaseModel):
    steps: list[Step]


plan = interrupt("plan", "Ask a human for a plan.", input=t.Ask, output=Plan)


async def test_a_json_output_that_nests_deep_or_holds_a_lone_surrogate_is_refused(
    run_worker, model
):
    """An interrupt-only tool whose output is no flat form: one ``output`` field holding JSON.
    What that JSON decodes to (a lone surrogate by its escape, 300 levels of nesting) must be
    refused as an MCP error, and the chat stay answerable (no failed workflow task)."""
    agent = Agent(f"mcpPlan{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[plan])
    cid = chat_id()
    model.reply(calls(("plan", {"question": "how?"}, "p1")), text("planned"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base, who=MALLORY) as session:
            paused = await paused_call(session, agent, cid, "plan")
            outcomes = []
            for output in (
                '{"steps":[{"name":"\\ud800"}]}',
                '{"steps":[{"name":"a"}],"x":' + "[" * 300 + "]" * 300 + "}",
            ):
                try:
                    got = await retry(
                        session, agent, cid, paused,
                        {"p1": approval({"output": output})}, message="plan",
                    )  # fmt: skip
                    outcomes.append(("answered", got))
                except MCPError as e:
                    outcomes.append((e.error.code, e.error.message))
            chat = await agents.chat(agent.name, chat_id=cid)
            status = await chat.status()
            good = {"p1": approval({"output": '{"steps":[{"name":"a"}]}'})}
            done = await retry(session, agent, cid, paused, good, message="plan")
        assert all(o[0] == types.INVALID_PARAMS for o in outcomes), outcomes
        assert status.status != "closed"
        assert isinstance(done, types.CallToolResult) and said(done) == "planned", done


def login_exchange() -> LoginExchange:
    def verify(request: Request) -> Login | None:
        name = bearer_name(request)
        return Login(identity=name) if name else None

    return LoginExchange(
        verify,
        key=ed25519.Ed25519PrivateKey.generate(),
        issuer="https://agents.test",
        audience="approvals",
    )


async def test_behind_a_login_no_assertion_goes_to_a_chat_on_another_task_queue(run_worker, model):
    """Someone with namespace rights runs a chat on a task queue of their own (their worker
    sees every update, assertion and all). A send naming it is refused; and a chat Ann paused
    here, terminated and started again there on the same ref, refuses her retry: no assertion
    reaches it, the call stays unanswered."""
    exchange = login_exchange()
    agent = Agent(
        f"mcpQueue{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[], approvers=[ANN])],
        trust=exchange.trusted_issuer(),
    )
    away_id, cid = chat_id(), chat_id()
    async with run_worker(agents=[agent]) as home, run_worker(agents=[agent]) as away:
        model.reply(text("from over there"))
        assert (await (await away.chat(agent.name, chat_id=away_id)).send("hi")).text
        app = agents_mcp_app(home, agents=[agent.name], identity=exchange, state_keys=STATE_KEYS)
        async with served(app) as base, mcp(base) as session:
            with pytest.raises(MCPError, match="identity tokens"):
                await session.call_tool(
                    agent.name,
                    {"message": "hello again", "chat_id": away_id},
                    allow_input_required=True,
                )
            model.reply(calls(("lookup", {"key": "k"}, "g1")))
            paused = await paused_call(session, agent, cid)
            await (await home.chat(agent.name, chat_id=cid)).handle.terminate("moved")
            # Started again on the other queue, by hand (a send keeps a closed chat closed).
            temporal = away.temporal
            await temporal.start_workflow(
                AgentWorkflow.run,
                raw_start(
                    ConversationInput(agent=agent.name),
                    converter=temporal.data_converter.payload_converter,
                ),
                id=cid,
                task_queue=away.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
            model.reply(calls(("lookup", {"key": "k"}, "g1")))
            moved = await away.chat(agent.name, chat_id=cid)
            assert [i.ref for i in (await moved.send("look k up")).interrupts] == ["g1"]
            with pytest.raises(MCPError, match="identity tokens"):
                await retry(session, agent, cid, paused, YES)
        assert [i.ref for i in await moved.pending()] == ["g1"]
        assert await away.audit(cid) == []
        assert t.RUNS["lookup"] == 0


async def test_a_caller_who_is_no_approver_can_neither_approve_nor_decline(run_worker, model):
    """Mallory starts the turn herself, so the state is hers; the gate names Ann only."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base, who=MALLORY) as session:
            paused = await paused_call(session, agent, cid)
            for answer in (approval({"approved": True}), approval(action="decline")):
                with pytest.raises(MCPError) as refused:
                    await retry(session, agent, cid, paused, {"g1": answer})
                assert refused.value.error.code == types.INVALID_PARAMS, refused.value
        chat = await agents.chat(agent.name, chat_id=cid)
        assert [i.ref for i in await chat.pending()] == ["g1"]
        assert await agents.audit(cid) == []
        # Ann cannot use Mallory's state either; she answers through the approvals path.
        async with mcp(base) as session:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await retry(session, agent, cid, paused, YES)
        assert t.RUNS["lookup"] == 0


BOB = "bob@example.com"


async def test_an_approval_of_an_input_since_edited_is_refused(run_worker, model):
    """A quorum of two: Ann's form shows version 1; Bob edits it to version 666 (the gate holds
    for a second approval, same ref). Ann's retry approves what she was shown, which is no
    longer what would run: refused, never applied to the edited input."""
    agent = Agent(
        f"mcpEdit{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.release],
        middleware=[ToolApproval(allow=[], approvers=[ANN, BOB], quorum=2)],
    )
    cid = chat_id()
    model.reply(calls(("release", {"service": "api", "version": "1"}, "r1")), text("released"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid, "release api 1")
            chat = await agents.chat(agent.name, chat_id=cid)
            (shown,) = await chat.pending()
            edited = shown.restart(
                {"tool_approved": True}, input={"service": "api", "version": "666"}
            )
            held = await chat.resume(answers=[edited], identity=BOB)
            (now,) = await chat.pending()
            assert now.ref == "r1" and now.input["version"] == "666", (held, now)
            with pytest.raises(MCPError) as refused:
                await retry(
                    session, agent, cid, paused, {"r1": approval({"approved": True})},
                    message="release api 1",
                )  # fmt: skip
            assert refused.value.error.code == types.INVALID_PARAMS, refused.value
        assert [i.ref for i in await chat.pending()] == ["r1"]
        assert t.RUNS["release"] == 0


async def test_a_huge_reason_or_output_is_refused_or_bounded_never_an_internal_error(
    run_worker, model
):
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("denied then"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid)
            huge = {"g1": approval({"approved": False, "reason": "no" * 500_000})}
            try:
                got: Any = await retry(session, agent, cid, paused, huge)
            except MCPError as e:
                got = e
            chat = await agents.chat(agent.name, chat_id=cid)
            status = await chat.status()
        assert status.status != "closed", got
        if isinstance(got, MCPError):
            assert got.error.code == types.INVALID_PARAMS, got
            assert [i.ref for i in await chat.pending()] == ["g1"]
        else:
            assert isinstance(got, types.CallToolResult) and said(got) == "denied then"
        assert t.RUNS["lookup"] == 0


async def test_a_batch_or_a_notification_of_a_retry_applies_nothing_twice(run_worker, model):
    """The same retry twice in one JSON-RPC batch, and as a notification (no id): at most one
    answer is applied, and nothing is a 500."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    async with run_worker(agents=[agent]) as agents, served(app_for(agents, agent)) as base:
        async with mcp(base) as session:
            paused = await paused_call(session, agent, cid)
        arguments = json.dumps({"message": "look k up", "chat_id": cid})
        extra = (
            ',"inputResponses":{"g1":{"action":"accept","content":{"approved":true}}},'
            f'"requestState":{json.dumps(paused.request_state)}'
        )
        one = tools_call(agent.name, arguments, extra)
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=120.0)) as http:
            batch = await http.post(f"{base}/mcp", content=f"[{one},{one}]", headers=headers())
            assert batch.status_code < 500, batch.text[:300]
            note = one.replace('"id":7,', "")
            told = await http.post(f"{base}/mcp", content=note, headers=headers())
            assert told.status_code < 500, told.text[:300]
        await asyncio.sleep(1)
        assert len(await agents.audit(cid)) <= 1
        assert t.RUNS["lookup"] <= 1


async def test_rotation_a_dropped_key_and_an_identity_in_meta(run_worker, model):
    """A state sealed by a key since dropped from the ring is refused; one still in the ring
    (not first) opens. An identity claimed in ``_meta`` is not read: Mallory stays Mallory."""
    agent, cid = served_agent(), chat_id()
    model.reply(calls(("lookup", {"key": "k"}, "g1")), text("k is K"))
    fresh = f"k2:{base64.b64encode(secrets.token_bytes(32)).decode()}"
    async with run_worker(agents=[agent]) as agents:
        dropped = agents_mcp_app(
            agents, agents=[agent.name], identity=bearer_name, state_keys=fresh
        )
        kept = agents_mcp_app(
            agents, agents=[agent.name], identity=bearer_name, state_keys=f"{fresh},{STATE_KEYS}"
        )
        async with served(app_for(agents, agent)) as base, mcp(base, who=MALLORY) as session:
            paused = await paused_call(session, agent, cid)
            arguments = json.dumps({"message": "look k up", "chat_id": cid})
            extra = (
                ',"inputResponses":{"g1":{"action":"accept","content":{"approved":true},'
                f'"_meta":{{"identity":"{ANN}"}}}}}},"requestState":'
                f'{json.dumps(paused.request_state)},"_meta":{{"identity":"{ANN}"}}'
            )
            _, reply = await raw_call(base, tools_call(agent.name, arguments, extra), who=MALLORY)
            assert reply.get("error", {}).get("code") == types.INVALID_PARAMS, reply
            assert "Invalid or expired" not in reply["error"]["message"], reply
        async with served(dropped) as base, mcp(base, who=MALLORY) as session:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await retry(session, agent, cid, paused, {"g1": approval(action="decline")})
        chat = await agents.chat(agent.name, chat_id=cid)
        assert [i.ref for i in await chat.pending()] == ["g1"]
        async with served(kept) as base, mcp(base, who=MALLORY) as session:
            # Opened; refused only because Mallory is no approver.
            with pytest.raises(MCPError, match=r"(?i)ann|approv|may be answered") as refused:
                await retry(session, agent, cid, paused, {"g1": approval(action="decline")})
            assert "Invalid or expired" not in str(refused.value)
        assert await agents.audit(cid) == []
        assert t.RUNS["lookup"] == 0

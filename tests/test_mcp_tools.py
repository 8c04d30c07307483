"""Tools from real MCP servers: listed into the definition, gated by what they say, each call an
activity.

The servers are real (``tests/mcp_servers.py``, the ``mcp`` package's ``MCPServer``): one the
worker starts over stdio, one over Streamable HTTP on loopback behind a bearer token. Each
counts the calls that reach it, so a test proves what did not happen there. The model is the
offline stand-in's rules (``call TOOL {json}``) on the real Gemini wire.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import ActivityFailureError, Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, approve, deny, tool
from temporal_agent_interrupts.activities.mcp import (
    MAX_TOOLS_PER_SERVER,
    MCPResponseRefused,
    MCPSessions,
    merged_spec,
)
from temporal_agent_interrupts.codec import data_converter, generate_key
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.mcp import MCPServerHTTP, MCPServerStdio, mcp_tools
from temporal_agent_interrupts.worker import sandbox_runner
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.activity_io import (
    MCPCallInput,
)
from temporal_agent_interrupts.workflows.config import MCP_ACTIVITY
from temporal_agent_interrupts.workflows.limits import DOOR
from temporal_agent_interrupts.workflows.types import (
    GateDecision,
    ToolSpec,
)
from tests.docs import block
from tests.helpers import (
    assert_no_workflow_task_failed,
    eventually,
    free_port,
    history,
    scheduled_activities,
    server_address,
)
from tests.mcp_servers import TOKEN, calls
from tests.test_data_protection import without_codec
from tests.test_docs_examples import load

ROOT = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-m", "tests.mcp_servers", "http"]
WORKER = [sys.executable, "-m", "tests.mcp_worker"]


@dataclass
class HttpServer:
    """A Streamable HTTP MCP server process on loopback, which a test may stop and start."""

    state: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def server(self, *, name: str = "records", token: str = TOKEN) -> MCPServerHTTP:
        return MCPServerHTTP(name, self.url, headers={"Authorization": f"Bearer {token}"})

    def argv(self, variant: int) -> list[str]:
        """The server's command line: the records server, in ``variant``."""
        return [*SERVE, str(self.state), str(self.port), str(variant)]

    async def start(self, variant: int = 1) -> None:
        # Popen returns at once (it does not wait for the server): nothing blocks the loop.
        self.proc = subprocess.Popen(self.argv(variant), cwd=ROOT)  # noqa: ASYNC220

        async def up() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            writer.close()
            return True

        await eventually(up, bool, timeout=30, interval=0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[HttpServer]:
    server = HttpServer(state=tmp_path, port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


def stdio_server(state: Path) -> MCPServerStdio:
    return MCPServerStdio(
        "records-stdio",
        sys.executable,
        ["-m", "tests.mcp_servers", "stdio", str(state)],
        cwd=str(ROOT),
    )


@pytest.fixture
def offline() -> ScriptedModel:
    """The offline stand-in's rules, recording what the model was sent."""
    return ScriptedModel(offline_rules)


@pytest.fixture(params=["stdio", "http"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """Each MCP transport in turn: (the server as the agent declares it, its state folder)."""
    if request.param == "stdio":
        yield stdio_server(tmp_path), tmp_path
        return
    http = HttpServer(state=tmp_path, port=free_port())
    await http.start()
    try:
        yield http.server(), tmp_path
    finally:
        http.stop()


def agent_with(*toolsets: Any, name: str = "records-agent", **kwargs: Any) -> Agent:
    return Agent(name, system="You manage records.", tools=list(toolsets), **kwargs)


def names(state: Path) -> list[str]:
    return [n for n, _ in calls(state)]


async def test_a_read_only_tool_runs_unasked(client, offline, server):
    declared, state = server
    agent = agent_with(mcp_tools(declared))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send('call lookup {"key": "k1"}')
        assert res.finish_reason == FinishReason.STOP, res
        assert "value of k1" in res.text
    assert calls(state) == [("lookup", {"key": "k1"})]
    # The model was offered the server's tools, as listed.
    assert {"lookup", "delete_record", "touch"} <= set(offline.requests[0].tool_names())
    assert offline.requests[0].tool_schema("lookup")["required"] == ["key"]
    hist = await assert_no_workflow_task_failed(client, chat.id)
    assert scheduled_activities(hist).count(MCP_ACTIVITY) == 1


async def test_a_destructive_tool_pauses_and_runs_once_after_approval(client, offline, server):
    declared, state = server
    agent = agent_with(mcp_tools(declared))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        paused = await chat.send('call delete_record {"key": "k1"}')
        assert paused.finish_reason == FinishReason.INTERRUPTED
        (i,) = paused.interrupts
        assert i.source == "approval"
        assert i.gate == GateDecision(gated=True, reason="annotation", detail="destructiveHint")
        assert i.metadata["gate"]["detail"] == "destructiveHint"
        assert calls(state) == []  # nothing reached the server while it waits
        done = await chat.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert "deleted" in done.text
        records = await agents.audit(chat.id)
    assert calls(state) == [("delete_record", {"key": "k1"})]
    # The run's idempotency key went with it, for a server that deduplicates.
    (key,) = (state / "keys.log").read_text().split()
    assert len(key) == 32 and int(key, 16) >= 0
    (record,) = records
    assert record.decision == "approved" and record.identity == "alice"
    assert record.gate == GateDecision(gated=True, reason="annotation", detail="destructiveHint")
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_denied_call_never_reaches_the_server(client, offline, http_server):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (i,) = (await chat.send('call delete_record {"key": "k1"}')).interrupts
        done = await chat.resume(answers=[deny(i, "not that one")])
        assert done.finish_reason == FinishReason.STOP
        assert "denied" in done.text
        (record,) = await agents.audit(chat.id)
    assert record.decision == "denied" and record.gate is not None
    assert calls(http_server.state) == []
    hist = await history(client, chat.id)
    assert MCP_ACTIVITY not in scheduled_activities(hist)


async def test_the_lists_override_annotations_and_untrusted_gates_everything(
    client, offline, http_server
):
    listed = agent_with(
        mcp_tools(http_server.server(), allow=["touch"], gate=["lookup"]), name="listed"
    )
    untrusted = agent_with(
        mcp_tools(http_server.server(), trust_annotations=False, allow=["touch"]),
        name="untrusted",
    )
    async with hosted(client, agents=[listed, untrusted], model=offline) as agents:
        chat = await agents.chat("listed")
        ran = await chat.send('call touch {"key": "a"}')  # no annotations, but allowed by name
        assert ran.finish_reason == FinishReason.STOP
        (i,) = (await chat.send('call lookup {"key": "b"}')).interrupts  # read-only, gated
        assert i.gate == GateDecision(gated=True, reason="list", detail="gate list")
        await chat.resume(answers=[deny(i)])

        chat = await agents.chat("untrusted")
        (j,) = (await chat.send('call lookup {"key": "c"}')).interrupts
        assert j.gate == GateDecision(
            gated=True, reason="untrusted", detail="trust_annotations=False"
        )
        await chat.resume(answers=[approve(j)])
    assert names(http_server.state) == ["touch", "lookup"]


async def test_a_tool_that_declares_nothing_pauses_and_approvers_and_edits_hold(
    client, offline, http_server
):
    agent = agent_with(
        mcp_tools(http_server.server(), approvers=["alice"], editable=["touch"]),
    )
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (i,) = (await chat.send('call touch {"key": "a"}')).interrupts
        assert i.gate == GateDecision(gated=True, reason="default", detail="no annotations")
        assert i.approvers == ["alice"] and i.editable
        with pytest.raises(ResumeRejected):
            await chat.resume(answers=[approve(i)], identity="mallory")
        done = await chat.resume(
            answers=[i.restart({"tool_approved": True}, input={"key": "b"})], identity="alice"
        )
        assert done.finish_reason == FinishReason.STOP, done
        (record,) = await agents.audit(chat.id)
    assert record.kind == "edit" and record.gate is not None
    assert calls(http_server.state) == [("touch", {"key": "b"})]


async def test_the_agent_s_tool_approval_applies_to_mcp_tools_too(client, offline, http_server):
    agent = agent_with(
        mcp_tools(http_server.server()), middleware=[ToolApproval(allow=[], approvers=["bob"])]
    )
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (i,) = (await chat.send('call lookup {"key": "a"}')).interrupts  # read-only, yet held
        assert i.gate == GateDecision(gated=True, reason="agent", detail="ToolApproval")
        assert i.approvers == ["bob"]
        await chat.resume(answers=[approve(i)], identity="bob")
    assert names(http_server.state) == ["lookup"]


async def test_tool_errors_and_huge_results_reach_the_model_as_errors(client, offline, server):
    declared, state = server
    agent = agent_with(mcp_tools(declared))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send('call fail {"key": "k"} and call huge {"kib": 300}')
        assert res.finish_reason == FinishReason.STOP, res
    fail, huge = offline.requests[-1].function_responses()
    assert "no record k" in fail["response"]["error"]
    assert huge["response"]["error"] == "output too large"
    assert sorted(names(state)) == ["fail", "huge"]  # run at once: either may reach it first
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_server_that_is_down_fails_the_call_clearly_and_the_chat_lives_on(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        assert (await chat.send('call lookup {"key": "a"}')).finish_reason == FinishReason.STOP
        http_server.stop()
        failed = await chat.send('call lookup {"key": "b"}')
        assert failed.finish_reason == FinishReason.FAILED, failed
        assert failed.error is not None and failed.error.status == "UNAVAILABLE"
        assert "MCP server 'records' is unavailable" in failed.error.message
        assert "did not reach it" in failed.error.message
        await http_server.start()  # the worker's session reconnects
        again = await chat.send('call lookup {"key": "c"}')
        assert again.finish_reason == FinishReason.STOP, again
    assert names(http_server.state) == ["lookup", "lookup"]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_chat_paused_across_a_change_of_the_tool_list_resumes_and_replays(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline, max_cached_workflows=0) as agents:
        chat = await agents.chat(agent.name)
        (i,) = (await chat.send('call delete_record {"key": "k1"}')).interrupts
        assert "archive_record" not in offline.requests[-1].tool_names()
        http_server.stop()
        await http_server.start(variant=2)  # a new tool, and a changed schema
        done = await chat.resume(answers=[approve(i)])
        assert done.finish_reason == FinishReason.STOP, done
        # The next model call saw the new list.
        assert "archive_record" in offline.requests[-1].tool_names()
        assert "reason" in offline.requests[-1].tool_schema("delete_record")["properties"]
        res = await chat.send('call archive_record {"key": "k2"}')  # additive: gated
        (j,) = res.interrupts
        assert j.gate == GateDecision(gated=True, reason="annotation", detail="not read-only")
        await chat.resume(answers=[approve(j)])
    assert calls(http_server.state) == [
        ("delete_record", {"key": "k1", "reason": ""}),
        ("archive_record", {"key": "k2"}),
    ]
    hist = await assert_no_workflow_task_failed(client, chat.id)
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(strict=True),
    )
    await replayer.replay_workflow(hist)


async def test_a_worker_killed_mid_call_does_not_repeat_an_approved_call(client, http_server):
    (http_server.state / "slow").write_text("20")
    queue = f"tq-{uuid.uuid4()}"
    address = server_address(client)

    def worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*WORKER, address, client.namespace, queue, http_server.url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def ready(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"

    from tests.mcp_worker import AGENT

    first = worker()
    second: subprocess.Popen[bytes] | None = None
    try:
        await asyncio.to_thread(ready, first)
        from temporal_agent_interrupts import AgentClient

        agents = AgentClient(client, task_queue=queue)
        chat = await agents.chat(AGENT)
        (i,) = (await chat.send('call delete_record {"key": "k1"}')).interrupts
        answered = asyncio.create_task(chat.resume(answers=[approve(i)]))
        await eventually(lambda: asyncio.sleep(0, names(http_server.state)), bool, timeout=30)
        first.send_signal(signal.SIGKILL)  # mid-call: the server has it, the worker dies
        first.wait()
        second = worker()
        await asyncio.to_thread(ready, second)
        done = await asyncio.wait_for(answered, 90)
        assert done.finish_reason == FinishReason.STOP, done
        assert "may have taken effect" in done.text
        await asyncio.sleep(2)  # nothing runs it again later either
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert names(http_server.state) == ["delete_record"]
    hist = await history(client, chat.id)
    scheduled = [
        e
        for e in hist.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == MCP_ACTIVITY
    ]
    assert len(scheduled) == 1
    assert scheduled[0].activity_task_scheduled_event_attributes.retry_policy.maximum_attempts == 1


async def test_the_wrong_credentials_leave_the_tools_out(http_server):
    sessions = MCPSessions([http_server.server(token="wrong")])
    try:
        assert await sessions.list_tools("records") == []
    finally:
        await sessions.aclose()
    good = MCPSessions([http_server.server()])
    try:
        assert "lookup" in [t.name for t in await good.list_tools("records")]
    finally:
        await good.aclose()


# -- what a hostile server lists (pure: no server needed) ---------------------------------------


def listed(name: str, schema: Any = None, **kwargs: Any) -> mcp_types.Tool:
    return mcp_types.Tool.model_construct(
        name=name,
        input_schema={"type": "object", "properties": {}} if schema is None else schema,
        **kwargs,
    )


LIAR = mcp_types.ToolAnnotations(read_only_hint=True, destructive_hint=True)


def test_a_hostile_listing_is_capped_and_checked_tool_by_tool():
    toolset = mcp_tools(MCPServerHTTP("evil", "http://127.0.0.1:1/mcp"), prefix="evil_")
    specs, problems = toolset.specs(
        [
            listed("ok", description="fine"),
            listed("has space"),
            listed("x" * 100),
            listed("ok"),
            listed("deep", {"type": "object", "properties": _nested(80)}),
            listed("big", {"type": "object", "description": "d" * 20_000}),
            listed("array", {"type": "array"}),
            listed("notschema", {"type": "object", "properties": 5}),
            listed("long", description="w" * 5000),
            listed(
                "liar",
                annotations=mcp_types.ToolAnnotations(read_only_hint=True, destructive_hint=True),
            ),
        ]
    )
    assert [s.name for s in specs] == ["evil_ok", "evil_long", "evil_liar"]
    assert all(s.mcp is not None and s.mcp.server == "evil" for s in specs)
    assert specs[0].mcp is not None and specs[0].mcp.tool == "ok"
    assert specs[1].description.endswith("[description cut]") and len(specs[1].description) < 1100
    assert specs[2].gate == GateDecision(gated=True, reason="annotation", detail="destructiveHint")
    assert len(problems) == 7
    assert any("not a name a model can call" in p for p in problems)
    assert any("listed twice" in p for p in problems)
    assert any("nested" in p or "deep" in p for p in problems)
    assert any("16 KiB" in p for p in problems)
    assert any('"type": "object"' in p for p in problems)
    assert any("not a valid JSON Schema" in p for p in problems)

    many, problems = toolset.specs([listed(f"t{n}") for n in range(200)])
    assert len(many) == MAX_TOOLS_PER_SERVER and "136 tools past" in problems[0]


def test_a_server_s_tool_never_replaces_the_agent_s_own_and_the_definition_stays_in_budget():
    @tool("lookup", "The agent's own lookup.")
    def own() -> dict[str, str]:
        return {}

    agent = Agent("own", tools=[own])
    toolset = mcp_tools(MCPServerHTTP("s", "http://127.0.0.1:1/mcp"))
    big = {"type": "object", "description": "d" * 15_000}
    specs, _ = toolset.specs([listed("lookup"), *(listed(f"t{n}", big) for n in range(10))])
    merged, problems = merged_spec(agent.spec(), [("s", specs)])
    assert [t.name for t in merged.tools].count("lookup") == 1
    assert merged.tool("lookup") is not None and merged.tool("lookup").mcp is None  # type: ignore[union-attr]  # asserted just before
    assert len(merged.model_dump_json()) <= DOOR.spec
    assert any("has a tool of that name" in p for _, p in problems)
    assert any("budget" in p for _, p in problems)
    assert merged.digest != agent.spec().digest


def test_declarations_are_checked_where_they_are_written():
    server = MCPServerHTTP("s", "http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="in both allow and gate"):
        mcp_tools(server, allow=["a"], gate=["a"])
    with pytest.raises(ValueError, match="prefix"):
        mcp_tools(server, prefix="1-")
    with pytest.raises(ValueError, match="durable key"):
        MCPServerHTTP("bad name", "http://x")
    with pytest.raises(ValueError, match="quorum"):
        mcp_tools(server, approvers=["a"], quorum=2)
    with pytest.raises(ValueError, match="toolsets more than once"):
        Agent("twice", tools=[mcp_tools(server), mcp_tools(server)])
    assert "Bearer" not in repr(MCPServerHTTP("s", "http://x", headers={"A": "Bearer secret"}))
    assert (
        ToolSpec.model_validate({"name": "n", "description": "", "input_schema": {}}).gate is None
    )


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {"a": {"type": "object", "properties": node}}
    return node


async def test_the_mcp_page_s_agent_runs_offline_as_printed(client, tmp_path, monkeypatch, capsys):
    for key in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(key, raising=False)
    server = block(
        "# records_server.py: an MCP server, built with the mcp package's MCPServer", lang="python"
    )
    (tmp_path / "records_server.py").write_text(server)
    source = block(
        "# records_agent.py: an agent with an MCP server's tools, on the offline model",
        lang="python",
    )
    module = load(tmp_path, "records_agent", source, monkeypatch)
    await module.main(server_address(client))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("stop") and "the first record" in out[0]
    assert out[1] == (
        "interrupted delete_record gated=True reason='annotation' detail='destructiveHint'"
    )
    assert out[2].startswith("stop") and '"deleted": "k1"' in out[2], out


async def test_a_standalone_mcp_activity_never_reaches_the_server(client, offline, http_server):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        handle = await client.start_activity(
            MCP_ACTIVITY,
            MCPCallInput(
                agent=agent.name,
                chat_id="any-chat",
                tool="delete_record",
                ref="r1",
                args={"key": "k1"},
                resumed=True,
                resumed_metadata={"tool_approved": True},
                server="records",
                server_tool="delete_record",
            ),
            id=f"standalone-{uuid.uuid4()}",
            task_queue=agents.task_queue,
            start_to_close_timeout=timedelta(seconds=30),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "NotScheduledByConversation"
    assert calls(http_server.state) == []


async def test_a_response_too_large_to_hold_is_cut_off_and_the_session_recovers(http_server):
    sessions = MCPSessions([http_server.server()])
    try:
        with pytest.raises(MCPResponseRefused) as cut:
            await sessions.call("records", "huge", {"kib": 12 * 1024})  # 12 MiB of JSON
        # It ran there: the activity tells the model so (an error in the output's place).
        assert cut.value.too_large
        done = await sessions.call("records", "lookup", {"key": "a"})
        assert isinstance(done, mcp_types.CallToolResult)
        assert done.structured_content == {"key": "a", "value": "value of a"}
    finally:
        await sessions.aclose()


def test_edits_are_turned_off_for_a_schema_with_regular_expressions():
    toolset = mcp_tools(MCPServerHTTP("s", "http://127.0.0.1:1/mcp"), editable=["a", "b"])
    pattern = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a+)+$"}}}
    specs, problems = toolset.specs([listed("a", pattern), listed("b"), listed("c")])
    assert [(s.name, s.editable) for s in specs] == [("a", False), ("b", True), ("c", False)]
    assert problems == [
        "tool 'a': edits turned off, its input schema has regular expressions (pattern, "
        "patternProperties) or references ($ref) the workflow would have to run"
    ]


def test_edits_are_turned_off_for_a_schema_with_references():
    """Found in review: 40 levels of anyOf over two $refs each (3 KiB) passed the listing with
    edits on, and an edit then ran 2**40 checks in the workflow's update validator (the task
    failed "Potential deadlock", the update with it, and the thread kept a core busy)."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(40)
    }
    defs["d40"] = {"type": "integer"}
    branching = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}
    remote = {"type": "object", "properties": {"x": {"$ref": "http://169.254.169.254/x"}}}
    toolset = mcp_tools(MCPServerHTTP("s", "http://127.0.0.1:1/mcp"), editable=["a", "b", "c"])
    specs, problems = toolset.specs([listed("a", branching), listed("b", remote), listed("c")])
    assert [(s.name, s.editable) for s in specs] == [("a", False), ("b", False), ("c", True)]
    assert len(problems) == 2 and all("references ($ref)" in p for p in problems)


async def test_quorum_deadlines_the_stream_the_inbox_and_encryption_hold_for_mcp_calls(
    client, offline, http_server
):
    encrypted = Client(**{**client.config(), "data_converter": data_converter(generate_key("m"))})
    agent = agent_with(
        mcp_tools(http_server.server(), approvers=["alice", "bob"], quorum=2),
        interrupt_timeout=timedelta(seconds=3),
    )
    async with hosted(encrypted, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        turn = chat.send_stream('call delete_record {"key": "k1"}')
        kinds = [e.kind async for e in turn]
        paused = await turn.result()
        assert "interrupt" in kinds and kinds[-1] == "turn_end"
        (i,) = paused.interrupts
        assert i.quorum == 2 and i.gate is not None
        inbox = await eventually(
            lambda: agents.pending(agent=agent.name, approver="bob"),
            lambda chats: any(c.chat_id == chat.id for c in chats),
            timeout=30,
        )
        (entry,) = [c for c in inbox if c.chat_id == chat.id]
        assert [p.name for p in entry.interrupts] == ["delete_record"]
        voted = await chat.resume(answers=[approve(i)], identity="alice")
        assert voted.finish_reason == FinishReason.INTERRUPTED  # one vote of two
        assert calls(http_server.state) == []
        done = await chat.resume(answers=[approve(i)], identity="bob")
        assert done.finish_reason == FinishReason.STOP, done
        assert names(http_server.state) == ["delete_record"]

        # Nobody answers the next one: its deadline answers, and the server never gets it.
        late = await chat.send('call delete_record {"key": "k2"}')
        assert late.finish_reason == FinishReason.INTERRUPTED
        ended = await eventually(chat.status, lambda s: s.status == "idle", timeout=30)
        assert ended.last_turn is not None and "timed out" in ended.last_turn.text
    assert names(http_server.state) == ["delete_record"]
    # What the server returned is ciphertext in history.
    raw = await without_codec(client).get_workflow_handle(chat.id).fetch_history()
    assert b"deleted" not in b"".join(
        p.data
        for e in raw.events
        if e.HasField("activity_task_completed_event_attributes")
        for p in e.activity_task_completed_event_attributes.result.payloads
    )


@pytest.mark.parametrize(
    ("annotations", "lists", "expected"),
    [
        ({"read_only_hint": True}, {}, (False, "annotation", "readOnlyHint")),
        ({"destructive_hint": True}, {}, (True, "annotation", "destructiveHint")),
        ({}, {}, (True, "annotation", "destructiveHint")),  # MCP's default: destructive
        ({"destructive_hint": False}, {}, (True, "annotation", "not read-only")),
        (None, {}, (True, "default", "no annotations")),
        ({"read_only_hint": True}, {"gate": ["t"]}, (True, "list", "gate list")),
        (None, {"allow": ["t"]}, (False, "list", "allow list")),
        (
            {"read_only_hint": True},
            {"trust_annotations": False},
            (True, "untrusted", "trust_annotations=False"),
        ),
        (None, {"allow": ["t"], "trust_annotations": False}, (False, "list", "allow list")),
    ],
)
def test_the_gate_decides_as_the_docs_table_says(annotations, lists, expected):
    toolset = mcp_tools(MCPServerHTTP("s", "http://127.0.0.1:1/mcp"), **lists)
    said = None if annotations is None else mcp_types.ToolAnnotations(**annotations)
    decision = toolset.decide("t", said)
    assert (decision.gated, decision.reason, decision.detail) == expected


def test_a_listing_keeps_the_boolean_hints_a_policy_reads_only_where_trusted():
    hints = mcp_types.ToolAnnotations(read_only_hint=True, open_world_hint=False, title="Read")
    trusted = mcp_tools(MCPServerHTTP("docs", "http://127.0.0.1:1/mcp"))
    (spec,), _ = trusted.specs([listed("read", annotations=hints)])
    assert spec.annotations == {"readOnlyHint": True, "openWorldHint": False}
    (bare,), _ = trusted.specs([listed("bare")])
    assert bare.annotations is None
    # Told not to trust annotations, the gate ignores them, and so does a policy set.
    untrusted = mcp_tools(MCPServerHTTP("docs", "http://127.0.0.1:1/mcp"), trust_annotations=False)
    (ignored,), _ = untrusted.specs([listed("read", annotations=hints)])
    assert ignored.annotations is None

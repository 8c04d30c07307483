"""The official AG-UI client against the app's AG-UI endpoint, over a real socket.

A web front end built on AG-UI talks to ``POST /agui/{agent}`` through ``@ag-ui/client``'s
``HttpAgent``. These tests run that client (npm ``@ag-ui/client`` 1.0.0, pinned by
``tests/agui_client/package-lock.json``) in node, one scenario a process
(``tests/agui_client/run.mjs``), against ``agents_app`` served by uvicorn on a loopback port, with
a worker hosting an agent whose gated tool counts its runs. The client checks every event itself
(its schema stage and its ``verifyEvents`` order checks, as in any browser): a stream it refuses
fails the run, and the script exits non-zero. Material it does not know it strips with a console
warning, which the report keeps and the tests require to be empty.

- A user message runs until the gated calls pause: ``RUN_FINISHED`` with an ``interrupt``
  outcome, one interrupt per pending call, its id and ``toolCallId`` the call's ref, a reason and
  a response schema. A resume answering each ``resolved`` runs each tool once: its output comes
  back as ``TOOL_CALL_RESULT``, then the model's text, and the run succeeds.
- A resume naming an interrupt the chat does not have is a ``RUN_ERROR``, whether it also covers
  the real one (the client insists a resume cover the pending list it holds) or comes from a fresh
  client with no list; nothing runs, and the chat is still paused on its call, answerable.
- A connection dropped mid-run (between ``TOOL_CALL_START`` and ``TOOL_CALL_END``, and between
  two ``TEXT_MESSAGE_CONTENT`` frames) and reopened with ``Last-Event-ID``, inside the client's
  ``fetch``, gives the client one stream it accepts, frame for frame the run read over one
  unbroken connection, and the same run as an uncut one on another chat.

``make test`` installs the npm packages first (``make agui-client``: ``npm ci`` from the
lockfile). Without node 20+ or the packages, these tests fail saying how to install them; only
``AGENT_TEST_SKIP_AGUI_CLIENT=1``, set by whoever runs the suite, skips them instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from temporal_agent_interrupts import AgentClient
from temporal_agent_interrupts.client.agui import REASON_APPROVAL
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from temporal_agent_interrupts.workflows.config import TOOL_ACTIVITY
from tests.agents import RUNS, ops_agent
from tests.docs import block
from tests.helpers import (
    assert_no_workflow_task_failed,
    free_port,
    scheduled_activities,
)
from tests.test_web_process import web_worker

CLIENT_DIR = Path(__file__).resolve().parent / "agui_client"
SCRIPT = CLIENT_DIR / "run.mjs"
SKIP_ENV = "AGENT_TEST_SKIP_AGUI_CLIENT"
NODE_MAJOR = 20
RUN_TIMEOUT = 120.0
"""A bound on one node process (a scenario takes a few seconds), so a hung run fails."""

HOW_TO_INSTALL = (
    f"install Node.js {NODE_MAJOR} or newer with npm (https://nodejs.org), then run `make "
    f"agui-client` (npm ci --prefix tests/agui_client, which `make test` runs first); or set "
    f"{SKIP_ENV}=1 to skip the AG-UI client tests knowingly"
)

LONG_TEXT = " ".join(f"word{i:05d}" for i in range(4500))
"""About 45 KB: more than two of the stream's 16 KiB text events whatever the timing, so the
reply reaches the client as several ``TEXT_MESSAGE_CONTENT`` frames."""


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the client's packages installed as the lockfile pins them; or a
    failure saying how to install them (a skip only when the person running the suite asked)."""
    if os.environ.get(SKIP_ENV, "").strip() == "1":
        pytest.skip(f"the AG-UI client tests (skipped: {SKIP_ENV}=1)")
    found = shutil.which("node")
    if found is None:
        pytest.fail(
            f"no `node` on PATH: the AG-UI client tests run @ag-ui/client in node; {HOW_TO_INSTALL}"
        )
    version = subprocess.run(
        [found, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < NODE_MAJOR:
        pytest.fail(
            f"`node --version` says {version or 'nothing'}, older than {NODE_MAJOR}: "
            f"{HOW_TO_INSTALL}"
        )
    pinned = json.loads((CLIENT_DIR / "package.json").read_text())["dependencies"]
    for package, wanted in pinned.items():
        manifest = CLIENT_DIR / "node_modules" / package / "package.json"
        if not manifest.is_file():
            pytest.fail(
                f"{package} is not installed in {CLIENT_DIR / 'node_modules'}: {HOW_TO_INSTALL}"
            )
        installed = json.loads(manifest.read_text())["version"]
        if installed != wanted:
            pytest.fail(
                f"{package} {installed} is installed, the lockfile pins {wanted}: run `make "
                f"agui-client` again"
            )
    return found


@asynccontextmanager
async def serving(agents: AgentClient) -> AsyncIterator[str]:
    """The app on a loopback port, in this event loop; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        agents_app(agents, dev_loopback=True), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                if task.done():
                    task.result()  # its start-up error
                    raise AssertionError("uvicorn stopped before it started")
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(30):
                await task
        except TimeoutError:
            server.force_exit = True
            await task


async def agui(node: str, url: str, scenario: str, *options: str) -> dict[str, Any]:
    """Run one scenario of the client; its report, once it says the client completed every run
    (a RUN_ERROR from the server is a completed run) and stripped nothing."""
    env = {k: v for k, v in os.environ.items() if k != "SUPPRESS_TRANSFORMATION_WARNINGS"}
    proc = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        "--url",
        url,
        "--scenario",
        scenario,
        *options,
        cwd=CLIENT_DIR,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"the AG-UI client ({scenario}) ran past {RUN_TIMEOUT} s") from None
    lines = out.decode().strip().splitlines()
    report: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    stderr = err.decode()[-4000:]
    assert proc.returncode == 0 and report.get("ok"), (
        f"the AG-UI client ({scenario}) exited {proc.returncode}: "
        f"{report.get('failure', 'no report')}\nstderr:\n{stderr}"
    )
    assert report["warnings"] == [], f"the client stripped or complained: {report['warnings']}"
    return report


def types(run: dict[str, Any]) -> list[str]:
    return [e["type"] for e in run["events"]]


def the(run: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in run["events"] if e["type"] == kind]


def frame_order(frames: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each data frame's place, from its SSE id ``<run start>/<offset>.<n>``: (the stream offset
    of the conversation event it comes from, the frame's place among that event's frames)."""
    order = []
    starts = set()
    for f in frames:
        if f["data"] is None:
            continue  # a comment (a keep-alive): no event, no id needed
        found = re.fullmatch(r"(\d+)/(\d+)\.(\d+)", f["id"] or "")
        assert found is not None, f
        start, offset, n = (int(g) for g in found.groups())
        starts.add(start)
        order.append((offset, n))
    assert len(starts) == 1, f"one run, one start: {starts}"
    return order


def shape(run: dict[str, Any]) -> dict[str, Any]:
    """A run as its reader sees it, leaving out what differs between two chats (thread, run and
    message ids) and how text happened to be batched (consecutive content frames are one)."""
    kinds: list[str] = []
    for kind in types(run):
        if not (kind == "TEXT_MESSAGE_CONTENT" and kinds and kinds[-1] == kind):
            kinds.append(kind)
    return {
        "types": kinds,
        "text": [t["text"] for t in run["text"]],
        "calls": [
            (c["toolCallId"], c["name"], json.loads(c["args"] or "{}")) for c in run["toolCalls"]
        ],
        "results": [(r["toolCallId"], json.loads(r["content"])) for r in run["toolResults"]],
        "interrupts": [
            (i["id"], i["reason"], i.get("toolCallId"), i.get("responseSchema"))
            for i in run["interrupts"]
        ],
        "outcome": run["outcome"],
    }


async def test_a_pause_is_an_interrupt_outcome_and_a_resolved_resume_runs_each_call_once(
    run_worker, model, client, node
):
    model.reply(
        calls(("lookup", {"key": "a"}, "c1"), ("lookup", {"key": "b"}, "c2"), say="Looking."),
        text("a is A and b is B"),
    )
    agent = ops_agent()
    async with run_worker(agents=[agent]) as agents, serving(agents) as base:
        thread = f"agui-{uuid.uuid4()}"
        report = await agui(
            node,
            f"{base}/agui/{agent.name}",
            "approve",
            "--thread",
            thread,
            "--message",
            "look a and b up",
            "--identity",
            "approver@example.com",
        )
        chat = await agents.chat(agent.name, chat_id=thread)
        ran = await tool_runs(chat)
        audit = await chat.audit()
    paused, resumed = report["runs"]

    assert paused["outcome"] == "interrupt"
    assert [(c["toolCallId"], c["name"], json.loads(c["args"])) for c in paused["toolCalls"]] == [
        ("c1", "lookup", {"key": "a"}),
        ("c2", "lookup", {"key": "b"}),
    ]
    assert all(c["ended"] for c in paused["toolCalls"])
    assert [t["text"] for t in paused["text"]] == ["Looking."]
    assert paused["toolResults"] == []  # nothing ran before the approval
    [finished] = the(paused, "RUN_FINISHED")
    assert finished["outcome"]["interrupts"] == paused["interrupts"]
    assert [i["id"] for i in paused["interrupts"]] == ["c1", "c2"]  # one per pending call
    for interrupt in paused["interrupts"]:
        assert interrupt["toolCallId"] == interrupt["id"]  # the call's ref
        assert interrupt["reason"] == REASON_APPROVAL  # a gated tool call, awaiting a decision
        schema = interrupt["responseSchema"]
        assert schema["type"] == "object" and schema["required"] == ["approved"], schema
        assert schema["properties"]["approved"] == {"type": "boolean"}
    assert [i["id"] for i in paused["pendingAfter"]] == ["c1", "c2"]

    assert resumed["outcome"] == "success", resumed
    # The two calls run at once, and each result is streamed as it comes: in either order.
    assert sorted((r["toolCallId"], json.loads(r["content"])) for r in resumed["toolResults"]) == [
        ("c1", {"key": "a", "value": "A"}),
        ("c2", {"key": "b", "value": "B"}),
    ]
    assert [t["text"] for t in resumed["text"]] == ["a is A and b is B"]
    assert types(resumed)[0] == "RUN_STARTED" and types(resumed)[-1] == "RUN_FINISHED"
    last_result = max(i for i, k in enumerate(types(resumed)) if k == "TOOL_CALL_RESULT")
    assert last_result < types(resumed).index("TEXT_MESSAGE_START")
    assert resumed["pendingAfter"] == []
    assert {e["threadId"] for e in the(paused, "RUN_STARTED") + the(resumed, "RUN_STARTED")} == {
        thread
    }

    assert RUNS["lookup"] == 2 and ran["lookup"] == 2  # each call once, after its approval
    assert {r.ref for r in audit} == {"c1", "c2"}
    assert {r.identity for r in audit} == {"approver@example.com"}  # X-Agent-Identity, dev mode
    hist = await assert_no_workflow_task_failed(client, thread)
    assert scheduled_activities(hist).count(TOOL_ACTIVITY) == 2


async def test_a_resume_naming_an_unknown_interrupt_is_a_run_error_and_runs_nothing(
    run_worker, model, client, node
):
    model.reply(calls(("lookup", {"key": "k"}, "c1")), text("k is K"))
    agent = ops_agent()
    async with run_worker(agents=[agent]) as agents, serving(agents) as base:
        url = f"{base}/agui/{agent.name}"
        thread = f"agui-{uuid.uuid4()}"
        report = await agui(node, url, "refuse-unknown", "--thread", thread, "--unknown-id", "c9")
        chat = await agents.chat(agent.name, chat_id=thread)
        still = await chat.pending()
        hist = await assert_no_workflow_task_failed(client, thread)
        ran_before = RUNS["lookup"]
        # The refusals left the call answerable: a fresh client resumes it by its ref.
        answered = await agui(node, url, "resume", "--thread", thread, "--interrupt-id", "c1")
        ran = await tool_runs(chat)
    paused, covering, unknown_only = report["runs"]

    assert paused["outcome"] == "interrupt" and [i["id"] for i in paused["interrupts"]] == ["c1"]
    for refused in (covering, unknown_only):
        # Refused on the stream, as the run's one event: a RUN_ERROR with no SSE id (nothing of
        # the stream to reattach to), naming the id it does not know and what is pending.
        assert refused["outcome"] == "run_error", refused
        assert refused["http"]["status"] == 200
        assert types(refused) == ["RUN_ERROR"]
        assert [(f["id"], f["type"]) for f in refused["frames"]] == [(None, "RUN_ERROR")]
        assert refused["runError"]["code"] == "not_found", refused["runError"]
        assert "'c9'" in refused["runError"]["message"]
        assert "c1" in refused["runError"]["message"].split("pending:")[1]
    assert [r["interruptId"] for r in covering["resume"]] == ["c1", "c9"]
    # The agent that got the refusal still holds the interrupt it could not settle.
    assert [i["id"] for i in covering["pendingAfter"]] == ["c1"]
    assert ran_before == 0
    assert TOOL_ACTIVITY not in scheduled_activities(hist)  # no tool was ever scheduled
    assert [p.ref for p in still] == ["c1"]

    [resumed] = answered["runs"]
    assert resumed["outcome"] == "success", resumed
    assert [(r["toolCallId"], json.loads(r["content"])) for r in resumed["toolResults"]] == [
        ("c1", {"key": "k", "value": "K"})
    ]
    assert [t["text"] for t in resumed["text"]] == ["k is K"]
    assert RUNS["lookup"] == 1 and ran["lookup"] == 1


async def test_a_connection_cut_mid_run_reattaches_with_last_event_id_and_misses_nothing(
    run_worker, model, client, node
):
    def script() -> None:
        model.reply(
            calls(("lookup", {"key": "k"}, "c1"), say="Looking it up."),
            Reply.streamed(text(LONG_TEXT), pieces=4, interval=0.1),
        )

    script()
    script()
    agent = ops_agent()
    async with run_worker(agents=[agent]) as agents, serving(agents) as base:
        url = f"{base}/agui/{agent.name}"
        whole = await agui(node, url, "approve", "--thread", f"agui-{uuid.uuid4()}")
        assert RUNS["lookup"] == 1
        thread = f"agui-{uuid.uuid4()}"
        cut = await agui(
            node,
            url,
            "approve",
            "--thread",
            thread,
            "--cut-first",
            "TOOL_CALL_START",
            "--cut-second",
            "TEXT_MESSAGE_CONTENT:2",
        )
        ran = await tool_runs(await agents.chat(agent.name, chat_id=thread))
        await assert_no_workflow_task_failed(client, thread)

    for uncut, spliced in zip(whole["runs"], cut["runs"], strict=True):
        assert spliced["cut"]["happened"], spliced["cut"]
        assert spliced["cut"]["reconnectStatus"] == 200
        before = [f["type"] for f in spliced["frames"] if f["connection"] == 1]
        after = [f["type"] for f in spliced["frames"] if f["connection"] == 2]
        # The ids: each frame once, in stream order, across both connections.
        order = frame_order(spliced["frames"])
        assert order == sorted(order) and len(set(order)) == len(order), order
        # Frame for frame what one unbroken connection reads of the same run.
        replay = spliced["replay"]
        assert replay["status"] == 200 and "error" not in replay, replay
        assert [(f["id"], f["data"]) for f in spliced["frames"][1:]] == [
            (f["id"], f["data"]) for f in replay["frames"]
        ]
        # And what the client made of it: the same run as an uncut one on another chat.
        assert shape(spliced) == shape(uncut)
        assert before[0] == "RUN_STARTED" and after[-1] == "RUN_FINISHED"
        if spliced["label"] == "message":
            # Cut between the call's start and its end.
            assert before[-1] == "TOOL_CALL_START" and "TOOL_CALL_END" in after, (before, after)
            assert spliced["outcome"] == "interrupt"
        else:
            # Cut between two content frames of one message.
            assert (
                before.count("TEXT_MESSAGE_CONTENT") == 2 and before[-1] == "TEXT_MESSAGE_CONTENT"
            )
            assert after[0] == "TEXT_MESSAGE_CONTENT" and "TEXT_MESSAGE_END" in after, after
            assert spliced["outcome"] == "success"
            assert [t["text"] for t in spliced["text"]] == [LONG_TEXT]
    assert (
        RUNS["lookup"] == 2 and ran["lookup"] == 1
    )  # once a chat: the reconnect ran nothing again


async def test_the_readmes_agui_client_block_against_make_runs_worker(node, env, tmp_path):
    """The README's ``agui_client.mjs``, as printed, in node with the official client (from
    tests/agui_client's lockfile), against a worker process serving the web app: it pauses on
    the banking agent's approval, approves, and prints the offline model's last reply."""
    port = free_port()
    script = block(
        "// agui_client.mjs: node agui_client.mjs (with make run serving)", lang="js"
    ).replace("127.0.0.1:8234", f"127.0.0.1:{port}")
    (tmp_path / "agui_client.mjs").write_text(script)
    # Where node finds the packages for a script in tmp_path: the lockfile's install.
    (tmp_path / "node_modules").symlink_to(CLIENT_DIR / "node_modules")
    worker = await web_worker(env, tmp_path, port=port, queue=f"tq-{uuid.uuid4()}")
    try:
        await worker.wait_for(f"web app on http://127.0.0.1:{port}")
        await worker.wait_for("worker ready")
        proc = await asyncio.create_subprocess_exec(
            node,
            "agui_client.mjs",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        text = out.decode()
        assert proc.returncode == 0, text
        assert '\'userApproval {"action":"transferMoney"' in text
        assert "transferred $500.00 to savings" in text.splitlines()[-1]
    finally:
        await worker.stop()

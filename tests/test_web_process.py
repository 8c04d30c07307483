"""``agent-worker --web``, as ``make run`` starts it, answered with the README's curl commands.

The README's ``# curl:`` block runs as printed, in a shell, against a worker process hosting
the example agents with the offline model, with the port, the chat id and the two values a
reader copies from the output (the ref and the input digest) put in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx2

from temporal_agent_interrupts import Agent, AgentClient
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.worker.standin import text
from tests import agents as t
from tests.docs import block
from tests.helpers import eventually, free_port, server_address
from tests.test_operator import VISIBILITY_TIMEOUT
from tests.test_worker_process import Process, bare_environ, worker_cli
from tests.web import Frame, frames, run_input


async def web_worker(env: Any, tmp_path: Path, *, port: int, queue: str) -> Process:
    """``agent-worker --web 127.0.0.1:PORT`` on ``queue``, as ``make run`` starts it, hosting
    the example agents on the offline model."""
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=server_address(env.client))
    worker = await Process.start(
        sys.executable,
        "-m",
        "temporal_agent_interrupts.worker",
        "--task-queue",
        queue,
        "--agents",
        "examples",
        "--web",
        f"127.0.0.1:{port}",
        env=environ,
        cwd=tmp_path,
    )
    return worker


async def shell(script: str, *, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    return out.decode()


def objects(text: str) -> list[dict]:
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


async def test_the_readmes_curl_session_against_make_runs_worker(env, tmp_path):
    client = env.client
    port, queue = free_port(), f"tq-{uuid.uuid4()}"
    worker = await web_worker(env, tmp_path, port=port, queue=queue)
    try:
        await worker.wait_for(f"web app on http://127.0.0.1:{port}")
        await worker.wait_for("worker ready")
        chat_id = f"chat-curl-{uuid.uuid4().hex[:8]}"
        script = block("# curl: a conversation that pauses, read and answered over HTTP", lang="sh")
        script = script.replace("localhost:8234", f"localhost:{port}").replace("chat-curl", chat_id)
        lines = script.splitlines()
        # The first command starts the conversation; what a reader copies comes from it.
        cut = next(i for i, line in enumerate(lines) if line.startswith("# ..."))
        first = "\n".join(lines[:cut])
        started = await shell(first, cwd=tmp_path)
        finished = [json.loads(x[6:]) for x in started.splitlines() if x.startswith("data: ")]
        outcome = finished[-1]["outcome"]
        assert finished[-1]["type"] == "RUN_FINISHED" and outcome["type"] == "interrupt"
        (interrupt,) = outcome["interrupts"]
        assert interrupt["metadata"]["tool"] == "userApproval"
        ref, digest = interrupt["id"], interrupt["metadata"]["inputDigest"]

        agents = AgentClient(client, task_queue=queue)
        await eventually(
            lambda: agents.pending(agent="bankingAgent"),
            lambda chats: any(c.chat_id == chat_id for c in chats),
            timeout=VISIBILITY_TIMEOUT,
        )
        rest = "\n".join(lines[len(first.splitlines()) :])
        out = await shell(rest.replace("REF", ref).replace("DIGEST", digest), cwd=tmp_path)
        replies = objects(out)  # curl adds no newline: the replies run together
        inbox, pending, answered, audit = replies
        assert chat_id in [c["chat_id"] for c in inbox["chats"]]
        assert [i["ref"] for i in pending["interrupts"]] == [ref]
        # The approval ran transferMoney; the offline model reports what it did.
        assert answered["result"]["finish_reason"] == "stop", answered
        assert "transferred $500.00 to savings" in answered["result"]["text"]
        assert [(r["ref"], r["identity"]) for r in audit["records"]] == [(ref, "ann@example.com")]
    finally:
        await worker.stop()


async def test_a_web_port_in_use_is_reported_and_the_worker_serves_on(env, tmp_path):
    """The web app is beside the worker, not in its way: a port in use is logged, and the
    worker keeps serving conversations."""
    import socket

    queue = f"tq-{uuid.uuid4()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = await web_worker(env, tmp_path, port=port, queue=queue)
        try:
            await worker.wait_for("the web app on")
            chat = await AgentClient(env.client, task_queue=queue).chat("bankingAgent")
            result = await chat.send("hello")
            assert result.finish_reason == "stop"
        finally:
            await worker.stop()


async def test_dev_identity_refuses_a_public_bind(tmp_path):
    bad = await worker_cli("--web", "0.0.0.0:8234", env=bare_environ(tmp_path), cwd=tmp_path)
    assert bad.proc.returncode == 2
    assert "--web-identity dev serves loopback only" in bad.output


async def sse(response: Any) -> list[Frame]:
    """The SSE frames of a stream already open, to its end."""
    seen: list[Frame] = []
    frame_id: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            frame_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            seen.append(Frame(frame_id, json.loads("\n".join(data))))
            frame_id, data = None, []
    return seen


async def test_a_web_process_short_of_files_refuses_a_stream_with_a_503_and_serves_on(
    env, run_worker, model, tmp_path
):
    """Issue 51: each stream is a file descriptor. ``python -m ...client.web`` under an
    open-file limit it cannot raise (``ulimit -n`` sets the hard one too) says how many
    connections it takes; that many AG-UI streams are held, the next is refused with a 503
    that says why, and the process serves on: the held streams get their run, and a new
    stream is taken once they have ended."""
    agent = Agent(f"files-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.lookup])
    model.reply(text("hi"), text("for everyone"), text("once more"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        port = free_port()
        environ = bare_environ(
            tmp_path,
            TEMPORAL_ADDRESS=server_address(env.client),
            AGENT_TASK_QUEUE=agents.task_queue,
        )
        web = await Process.start(
            "bash",
            "-c",
            'ulimit -n 100 && exec "$0" -m temporal_agent_interrupts.client.web '
            '--identity dev --port "$1"',
            sys.executable,
            str(port),
            env=environ,
            cwd=tmp_path,
        )
        try:
            await web.wait_for("connections at once")
            said = re.search(r"serving at most (\d+) connections at once", web.output)
            assert said, web.output
            room = int(said[1])
            url = f"http://127.0.0.1:{port}/agui/{agent.name}"
            nxt = await next_offset(chat)

            def reader(who: str, offset: int) -> dict[str, str]:
                # A reconnect to the thread's next run: it waits, holding its connection.
                return {"X-Agent-Identity": who, "Last-Event-ID": f"{offset}/{offset}.0"}

            limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
            async with (
                httpx2.AsyncClient(timeout=60, limits=limits) as http,
                contextlib.AsyncExitStack() as streams,
            ):
                held = []
                for i in range(room):  # one by one: each has its answer's head before the next
                    response = await streams.enter_async_context(
                        http.stream(
                            "POST", url, json=run_input(chat.id), headers=reader(f"u{i}@x.org", nxt)
                        )
                    )
                    assert response.status_code == 200, await response.aread()
                    held.append(response)
                refused = await http.post(
                    url, json=run_input(chat.id), headers=reader("one@x.org", nxt)
                )
                assert refused.status_code == 503, refused.text
                assert "as many connections as it can take" in refused.text, refused.text
                assert refused.headers["connection"] == "close"

                await chat.send("for all")
                for got in await asyncio.wait_for(asyncio.gather(*map(sse, held)), 60):
                    shown = "".join(f.event.get("delta", "") for f in got)
                    assert got[-1].type == "RUN_FINISHED" and shown == "for everyone", got
                await streams.aclose()

                after = await next_offset(chat)
                late = asyncio.ensure_future(
                    frames(http, url, run_input(chat.id), headers=reader("late@x.org", after))
                )
                await chat.send("late")
                got = await asyncio.wait_for(late, 60)
                shown = "".join(f.event.get("delta", "") for f in got)
                assert got[-1].type == "RUN_FINISHED" and shown == "once more", got
            assert web.proc.returncode is None, web.output
        finally:
            await web.stop()

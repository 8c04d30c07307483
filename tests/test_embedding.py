"""The product embedded in a team's own Temporal application and FastAPI service, as a new user
does it: from an empty folder, with nothing of this repository on the path.

The folder holds the team's ``workflows.py`` (an agent with a gated tool), ``worker.py`` (a plain
``temporalio`` ``Worker`` on a client with ``AgentsPlugin``) and ``app.py`` (a FastAPI service
that connects in its ``lifespan`` and mounts ``agents_app``). Each runs as a process of its own
with that folder as its working directory, against a namespace made for the test with
``temporal operator namespace create``, so without the search attributes conversations upsert.
The model is the offline stand-in (no key in the environment), whose ``call TOOL {json}`` calls a
tool.

Also here: the server commands the docs show that no other test starts (each answers one
request): ``python -m temporal_agent_interrupts.client.web``.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import uuid
from pathlib import Path

import httpx2

from tests.helpers import create_namespace, eventually, free_port, server_address
from tests.test_worker_process import Process, bare_environ, run_to_end
from tests.web import frames, run_input

BIN = Path(sys.executable).parent
QUEUE = "payments"

WORKFLOWS = '''
"""The team's agent: refunds, each one run only once a person approved it."""

from pathlib import Path

from pydantic import BaseModel

from temporal_agent_interrupts import Agent, ToolApproval, ToolContext, tool


class Refund(BaseModel):
    order_id: str
    amount: float


@tool("refundOrder", "Refund an order.")
async def refund_order(inp: Refund, ctx: ToolContext) -> dict:
    # The team's side effect, which the test counts: one line per run of the tool.
    with Path("refunds.log").open("a") as log:
        log.write(f"{inp.order_id} {inp.amount}\\n")
    return {"refunded": inp.amount, "order_id": inp.order_id}


refund_agent = Agent(
    "refundAgent",
    model="gemini-flash-latest",
    system="You refund orders when asked.",
    tools=[refund_order],
    middleware=[ToolApproval(allow=[])],
)
'''

WORKER = '''
"""The team's worker: their own temporalio Worker; the plugin on the client adds the agents."""

import asyncio
import os

from temporalio.client import Client
from temporalio.worker import Worker

from temporal_agent_interrupts import AgentsPlugin
from workflows import refund_agent


async def main() -> None:
    client = await Client.connect(
        os.environ["TEMPORAL_ADDRESS"],
        namespace=os.environ["TEMPORAL_NAMESPACE"],
        plugins=[AgentsPlugin(agents=[refund_agent])],
    )
    print("payments worker starting", flush=True)
    await Worker(client, task_queue="payments").run()


asyncio.run(main())
'''

APP = '''
"""The team's FastAPI service, with the agents' HTTP API mounted under /agents."""

from contextlib import asynccontextmanager

from fastapi import FastAPI

from temporal_agent_interrupts import AgentClient
from temporal_agent_interrupts.web import agents_app


@asynccontextmanager
async def lifespan(app: FastAPI):
    client = await AgentClient.connect(task_queue="payments")
    app.mount(
        "/agents",
        agents_app(client, identity=lambda request: request.headers.get("x-user")),
    )
    yield


app = FastAPI(lifespan=lifespan)
'''


def team_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    assert list(folder.iterdir()) == []
    for name, source in (("workflows.py", WORKFLOWS), ("worker.py", WORKER), ("app.py", APP)):
        (folder / name).write_text(textwrap.dedent(source).lstrip())
    return folder


def team_environ(tmp_path: Path, *, address: str, namespace: str) -> dict[str, str]:
    """A shell with the project's virtualenv on PATH (as after ``source .venv/bin/activate``),
    the connection in the environment, and nothing of this repository: no ``PYTHONPATH``, no
    ``AGENT_MODULES``."""
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE=namespace)
    for name in ("PYTHONPATH", "AGENT_MODULES"):
        environ.pop(name)
    environ["PATH"] = f"{BIN}{os.pathsep}{environ.get('PATH', '')}"
    return environ


async def test_a_team_embeds_the_agents_in_its_own_worker_and_fastapi_service(env, tmp_path):
    namespace = f"fintech-{uuid.uuid4().hex[:8]}"
    await create_namespace(env.client, namespace)
    folder = team_folder(tmp_path)
    environ = team_environ(tmp_path, address=server_address(env.client), namespace=namespace)

    # 1. The worker refuses the unprepared namespace at start, with the command that fixes it.
    # (run_to_end: it ends by itself, rather than serving and failing the first send.)
    refused = await run_to_end(sys.executable, "worker.py", env=environ, cwd=folder)
    assert refused.proc.returncode != 0, refused.output
    assert "MissingSearchAttributes" in refused.output
    assert f"namespace {namespace!r} lacks the search attributes" in refused.output
    fix = re.search(
        r"^\s*(TEMPORAL_ADDRESS=\S+ TEMPORAL_NAMESPACE=\S+ agent-worker "
        r"--setup-search-attributes)$",
        refused.output,
        re.M,
    )
    assert fix is not None, refused.output

    # 2. The fix, pasted in the same folder: no agents named, no agents module to import.
    done = await run_to_end("bash", "-c", fix[1], env=environ, cwd=folder)
    assert done.proc.returncode == 0, done.output
    assert f"namespace {namespace}: registered" in done.output

    # 3. The worker and the service, as the team runs them.
    worker = await Process.start(sys.executable, "worker.py", env=environ, cwd=folder)
    port = free_port()
    service = await Process.start(
        str(BIN / "uvicorn"), "app:app", "--port", str(port), env=environ, cwd=folder
    )
    try:
        await worker.wait_for("payments worker starting")
        await service.wait_for("Application startup complete")
        base = f"http://127.0.0.1:{port}/agents"
        chat = f"refund-{uuid.uuid4().hex[:8]}"
        ann = {"X-User": "ann@example.com"}
        async with httpx2.AsyncClient(timeout=60) as http:
            # Send a message (AG-UI): the turn pauses on the gated tool, which has not run.
            sent = await frames(
                http,
                f"{base}/agui/refundAgent",
                run_input(chat, 'call refundOrder {"order_id": "A-17", "amount": 25}'),
                headers=ann,
            )
            (shown,) = sent[-1].event["outcome"]["interrupts"]
            assert not (folder / "refunds.log").exists()
            # See it pending (the approvals API), then approve what was shown.
            pending = (await http.get(f"{base}/api/chats/{chat}/pending", headers=ann)).json()
            (call,) = pending["interrupts"]
            assert call["ref"] == shown["id"] and call["name"] == "refundOrder"
            assert call["input"] == {"order_id": "A-17", "amount": 25}
            approved = await http.post(
                f"{base}/api/chats/{chat}/interrupts/{call['ref']}",
                json={"action": "approve", "input_digest": call["input_digest"]},
                headers=ann,
            )
            assert approved.status_code == 200, approved.text
            assert approved.json()["result"]["finish_reason"] == "stop"
            after = await http.get(f"{base}/api/chats/{chat}/pending", headers=ann)
            assert after.json()["interrupts"] == []
        # The tool ran, once.
        assert (folder / "refunds.log").read_text() == "A-17 25.0\n"
    finally:
        await service.stop()
        await worker.stop()
    assert "Traceback" not in worker.output + service.output, worker.output + service.output


async def test_the_standalone_web_app_command_serves(env, tmp_path):
    """``python -m temporal_agent_interrupts.client.web`` (docs/reference/settings.md) as
    printed, from an empty folder: it connects from the environment and answers."""
    folder = tmp_path / "empty"
    folder.mkdir()
    environ = team_environ(tmp_path, address=server_address(env.client), namespace="default")
    port = free_port()
    web = await Process.start(
        sys.executable,
        "-m",
        "temporal_agent_interrupts.client.web",
        "--port",
        str(port),
        "--identity",
        "dev",
        env=environ,
        cwd=folder,
    )
    try:
        await web.wait_for(f"agents app on http://127.0.0.1:{port}/inbox")
        async with httpx2.AsyncClient(timeout=60) as http:

            async def whoami() -> dict[str, str] | None:
                # It says where it serves just before it binds: until then, refused.
                try:
                    r = await http.get(
                        f"http://127.0.0.1:{port}/api/whoami", headers={"X-Agent-Identity": "ann"}
                    )
                except httpx2.ConnectError:
                    return None
                return r.json()

            assert await eventually(whoami, lambda seen: seen is not None, timeout=30) == {
                "identity": "ann",
                "mode": "dev",
            }
    finally:
        await web.stop()

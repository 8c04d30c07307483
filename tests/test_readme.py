"""The README's own session, as a newcomer runs it: their first agent, paused and resumed.

``refunds.py`` and ``ask.py`` are cut out of the README into a folder of their own; the agent runs
under the installed ``agent-worker`` console script started there (nothing on ``PYTHONPATH``),
``ask.py`` runs as printed and leaves the conversation paused, and the README's script block
answers it with the real ``agentctl`` and ``temporal`` commands. A second conversation is
approved through ``make run``'s web app (another worker, another task queue), as the inbox page
does. The tool runs once per approval, counted from Temporal's history. Also: the README stays a
front page (at most 300 lines) whose links all lead somewhere.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import sys
import urllib.request
import uuid
from pathlib import Path

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.worker.testing import tool_runs
from tests.docs import ROOT, block
from tests.helpers import eventually, free_port, server_address
from tests.test_operator import VISIBILITY_TIMEOUT
from tests.test_web_process import shell, web_worker
from tests.test_worker_process import Process, bare_environ

README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def newcomers_folder(tmp_path: Path, *, queue: str, chat_id: str) -> Path:
    """The README's two files in a folder of their own, with a task queue and a chat id of this
    test's own (everything else as printed), and the environment its terminals have: the venv's
    commands on PATH, the dev server's address, no Gemini key."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "refunds.py").write_text(block("# refunds.py", lang="python"))
    ask = block("# ask.py", lang="python")
    assert 'task_queue="refunds"' in ask and 'chat_id="refund-1"' in ask
    ask = ask.replace('task_queue="refunds"', f'task_queue="{queue}"')
    (folder / "ask.py").write_text(ask.replace('chat_id="refund-1"', f'chat_id="{chat_id}"'))
    return folder


def terminal(env, folder: Path, **variables: str) -> dict[str, str]:
    environ = bare_environ(folder, TEMPORAL_ADDRESS=server_address(env.client), **variables)
    environ.pop("PYTHONPATH", None)  # the newcomer's folder has only their own files
    environ.pop("AGENT_MODULES", None)
    environ["PATH"] = f"{BIN}:{environ['PATH']}"  # export PATH="$PWD/.venv/bin:$PATH"
    return environ


async def their_worker(env, folder: Path, queue: str) -> Process:
    """The README's second command, run from the folder holding refunds.py."""
    commands = block(
        "make run   # terminal 1, in the clone: the dev server, the examples, the web app",
        lang="bash",
    ).splitlines()
    (line,) = [c for c in commands if c.startswith("AGENT_TASK_QUEUE=refunds agent-worker")]
    assert line.split("#")[0].split() == [
        "AGENT_TASK_QUEUE=refunds", "agent-worker", "--agents", "refunds"
    ]  # fmt: skip
    worker = await Process.start(
        str(BIN / "agent-worker"), "--agents", "refunds",
        env=terminal(env, folder, AGENT_TASK_QUEUE=queue), cwd=folder,
    )  # fmt: skip
    await worker.wait_for("worker ready")
    return worker


async def ask(env, folder: Path) -> tuple[str, dict]:
    """``python ask.py``: the turn paused on refundOrder; the ref and input it printed."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "python"), "ask.py", cwd=folder, env=terminal(env, folder),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    lines = text.splitlines()
    assert lines[0] == "interrupted", text
    name, ref, rest = lines[1].split(" ", 2)
    assert name == "refundOrder", text
    return ref, ast.literal_eval(rest)  # the dict ask.py printed


async def test_the_readmes_first_agent_pauses_and_a_script_resumes_it(env, tmp_path):
    queue, chat_id = f"refunds-{uuid.uuid4()}", f"refund-{uuid.uuid4().hex[:8]}"
    folder = newcomers_folder(tmp_path, queue=queue, chat_id=chat_id)
    worker = await their_worker(env, folder, queue)
    try:
        ref, inp = await ask(env, folder)
        assert inp == {"order_id": "A-17", "amount": 25.0}
        chat = await AgentClient(env.client, task_queue=queue).chat("refundAgent", chat_id=chat_id)
        assert (await tool_runs(chat)).get("refundOrder", 0) == 0  # paused before it ran

        script = block(
            "export AGENT_TASK_QUEUE=refunds   # agentctl reads your agent's queue as its own",
            lang="bash",
        )
        script = script.replace("refund-1", chat_id).replace(
            "AGENT_TASK_QUEUE=refunds", f"AGENT_TASK_QUEUE={queue}"
        )
        await eventually(
            lambda: AgentClient(env.client, task_queue=queue).pending(agent="refundAgent"),
            lambda chats: any(c.chat_id == chat_id for c in chats),
            timeout=VISIBILITY_TIMEOUT,
        )
        environ = terminal(env, folder)
        out = await shell(script.replace("REF", ref), cwd=folder, env=environ)
        pending, shown = out.split("Signal workflow succeeded")
        assert ref in pending  # agentctl pending printed the ref the script then answers
        # agentctl is on the agent's queue: no warning on this chat's entry (the session's
        # server holds other tests' chats, on queues of their own, which are warned about).
        (ours,) = [entry for entry in pending.split("\n\n") if chat_id in entry]
        assert ref in ours and "not this client's" not in ours
        assert "Last turn 1: stop" in shown and '"refunded": 25.0' in shown  # agentctl show

        result = await chat.last_turn()
        assert result is not None
        assert result.finish_reason == FinishReason.STOP, result
        assert (await tool_runs(chat))["refundOrder"] == 1
        (answer,) = (await chat.history()).answers
        assert (answer.identity, answer.decision, answer.via) == (
            "you@example.com", "approved", "signal"
        )  # fmt: skip
    finally:
        await worker.stop()


async def test_make_runs_inbox_approves_the_newcomers_agent_on_its_own_queue(env, tmp_path):
    """The README sends the newcomer to make run's inbox page: that app, on the examples'
    queue, lists the refund and approves it (the page's own two requests), and the tool runs
    once on the newcomer's worker."""
    queue, chat_id = f"refunds-{uuid.uuid4()}", f"refund-{uuid.uuid4().hex[:8]}"
    folder = newcomers_folder(tmp_path, queue=queue, chat_id=chat_id)
    port = free_port()
    theirs = await their_worker(env, folder, queue)
    make_run = await web_worker(env, tmp_path, port=port, queue=f"agents-{uuid.uuid4()}")
    try:
        await make_run.wait_for(f"web app on http://127.0.0.1:{port}")
        ref, _ = await ask(env, folder)
        base = f"http://127.0.0.1:{port}"

        def inbox() -> list[dict]:
            with urllib.request.urlopen(f"{base}/api/inbox?agent=refundAgent") as r:
                return json.load(r)["chats"]

        chats = await eventually(
            lambda: asyncio.to_thread(inbox),
            lambda chats: any(c["chat_id"] == chat_id for c in chats),
            timeout=VISIBILITY_TIMEOUT,
        )
        (entry,) = [c for c in chats if c["chat_id"] == chat_id]
        (call,) = entry["interrupts"]
        assert call["ref"] == ref and call["name"] == "refundOrder"
        body = json.dumps({"action": "approve", "input_digest": call["input_digest"]}).encode()
        request = urllib.request.Request(
            f"{base}/api/chats/{chat_id}/interrupts/{ref}", data=body, method="POST",
            headers={"content-type": "application/json", "X-Agent-Identity": "you@example.com"},
        )  # fmt: skip

        def post() -> dict:
            with urllib.request.urlopen(request) as r:
                return json.load(r)

        answered = await asyncio.to_thread(post)
        assert answered["result"]["finish_reason"] == "stop", answered
        chat = await AgentClient(env.client, task_queue=queue).chat("refundAgent", chat_id=chat_id)
        assert (await tool_runs(chat))["refundOrder"] == 1
    finally:
        await make_run.stop()
        await theirs.stop()


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"the README has {len(lines)} lines: move detail into docs/"


def test_every_link_in_the_readme_leads_to_a_file_of_the_clone():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert len(local) >= 10, local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def test_the_readme_names_the_pages_of_the_site_in_its_nav():
    """Every docs page the README links is a page the site builds (in mkdocs.yml's nav)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    linked = re.findall(r"\]\(docs/([^)#\s]+\.md)", README.read_text())
    assert linked
    assert not [page for page in linked if f" {page}" not in nav], nav

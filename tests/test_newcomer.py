"""A newcomer's path: the demo's conversation and the offline stand-in model's rules."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from examples import ALL_AGENTS, banking, demo, deploy, shell
from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.connection import DEFAULT_TASK_QUEUE
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.devserver import temporal_cli
from temporal_agent_interrupts.worker.offline_model import BANNER, respond
from temporal_agent_interrupts.worker.standin import GeminiStandIn
from tests.docs import block
from tests.helpers import fake_dev_server, server_address

ROOT = Path(__file__).parent.parent


async def run_demo(
    environ: dict[str, str], *, cwd: Path, stdin: str
) -> subprocess.CompletedProcess[str]:
    """``python -m examples.demo`` as a newcomer runs it, without blocking the worker's loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.demo"],
        input=stdin,
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("stdin", "expected", "approved"),
    [
        ("y\n", "Done: transferred $500.00 to savings", True),
        ("n\n", "The transfer was not approved", False),
        ("", "The transfer was not approved", False),  # no TTY, nothing piped: no
    ],
)
async def test_demo_runs_the_banking_conversation(env, client, tmp_path, stdin, expected, approved):
    environ = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    environ["TEMPORAL_ADDRESS"] = server_address(env.client)
    # The queue `make run` would serve; a test's own, so no other test's worker takes its tasks.
    queue = f"tq-demo-{uuid.uuid4()}"
    environ["AGENT_TASK_QUEUE"] = queue
    proc = await run_demo(environ, cwd=tmp_path, stdin=stdin)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "offline stand-in model" in out
    assert "interrupt: userApproval" in out
    assert '"details": "Transfer $500.00 to savings"' in out
    assert "approve? [y/N]" in out
    assert expected in out
    assert "finish reason: stop" in out
    transferred = "transaction txn-" in out
    assert transferred is approved

    # The closing hints name programs that exist: the temporal binary the project installed
    # (not a `temporal` on PATH), and agentctl for this conversation.
    # Not the embedded server: no localhost UI links, and the CLI told where the server is.
    address = server_address(env.client)
    found = re.search(
        rf"this conversation:  workflow id (demo-[0-9a-f]+) in the UI of {address}\n", out
    )
    assert found is not None, out
    chat_id = found[1]
    assert "localhost:8233" not in out
    assert f"paused ones:        {temporal_cli()} --address {address} workflow list --query" in out
    assert f"(serves task queue {queue!r})" in out
    assert f"{Path(sys.executable).parent / 'agentctl'} show {chat_id}\n" in out

    # The conversation lives on the queue `make run` serves: once the demo's own worker is
    # gone, a worker there (`agent-worker`) answers for it.
    assert (await client.get_workflow_handle(chat_id).describe()).task_queue == queue
    async with build_worker(client, agents=ALL_AGENTS, task_queue=queue):
        chat = await AgentClient(client, task_queue=queue).chat("bankingAgent", chat_id=chat_id)
        status = await chat.status(worker_timeout=timedelta(seconds=30))
    assert status.last_turn is not None
    assert status.last_turn.finish_reason == FinishReason.STOP
    assert ("transaction txn-" in status.last_turn.text) is approved


def test_demo_uses_the_task_queue_make_run_serves(monkeypatch):
    from temporal_agent_interrupts.worker.__main__ import parse_args

    monkeypatch.delenv("AGENT_TASK_QUEUE", raising=False)
    assert demo.task_queue() == DEFAULT_TASK_QUEUE == parse_args([]).task_queue == "agents"
    monkeypatch.setenv("AGENT_TASK_QUEUE", "")  # an env file's empty value counts as unset
    assert demo.task_queue() == DEFAULT_TASK_QUEUE
    monkeypatch.setenv("AGENT_TASK_QUEUE", "mine")
    assert demo.task_queue() == parse_args([]).task_queue == "mine"


def test_demo_prints_programs_as_runnable_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert demo._command(str(tmp_path / ".venv" / "bin" / "temporal")) == ".venv/bin/temporal"
    assert demo._command(str(tmp_path / "temporal")) == "./temporal"  # never looked up on PATH
    elsewhere = str(tmp_path.parent / "bin" / "temporal")
    assert demo._command(elsewhere) == elsewhere


# `make stop`: the Makefile's own recipe, run in a scratch directory with its own .temporal/.


def make(cwd: Path, target: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), *flags, target],
        cwd=cwd,
        # A narrow COLUMNS makes a plain `ps` cut command lines short: stop must not rely on it.
        env={**os.environ, "COLUMNS": "40"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_pid(cwd: Path, pid: int) -> Path:
    pid_file = cwd / ".temporal" / "dev-server.pid"
    pid_file.parent.mkdir(exist_ok=True)
    pid_file.write_text(f"{pid}\n")  # as worker/devserver.py writes it
    return pid_file


def test_make_stop_without_a_pid_file(tmp_path):
    run = make(tmp_path, "stop")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "no dev server running"


def test_make_stop_leaves_a_reused_pid_alone(tmp_path):
    # After `make run` ends the pid file stays behind; its pid may now be anybody's.
    sleeper = "import time; print('up', flush=True); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdout.readline() == "up\n"
    try:
        pid_file = write_pid(tmp_path, other.pid)
        run = make(tmp_path, "stop")
        assert run.returncode == 0, run.stderr
        assert "no dev server running" in run.stdout and "stopped" not in run.stdout
        assert not pid_file.exists()  # the stale file is gone
        assert other.poll() is None  # and the unrelated process still runs
    finally:
        other.kill()
        other.wait()


def test_make_stop_with_a_dead_pid(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid_file = write_pid(tmp_path, gone.pid)
    run = make(tmp_path, "stop")
    assert run.returncode == 0, run.stderr
    assert "no dev server running" in run.stdout
    assert not pid_file.exists()


@pytest.mark.parametrize("starter", ["none recorded", "gone"])
def test_make_stop_stops_an_orphaned_dev_server(tmp_path, starter):
    """A pid file of one line (as before starters were recorded), or one whose starter has
    exited (`make demo` is over: it is no longer the server's parent): the server is stopped."""
    server = fake_dev_server()
    try:
        pid_file = write_pid(tmp_path, server.pid)
        if starter == "gone":
            gone = subprocess.Popen([sys.executable, "-c", "pass"])
            gone.wait()
            pid_file.write_text(f"{server.pid}\n{gone.pid}\n")
        run = make(tmp_path, "stop")
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.strip() == f"stopped the dev server (pid {server.pid})"
        assert server.wait(timeout=10) == -signal.SIGTERM
        assert not pid_file.exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_make_clean_removes_build_leftovers(tmp_path):
    run = make(tmp_path, "clean", "--dry-run")
    assert run.returncode == 0, run.stderr
    removal = next(line for line in run.stdout.splitlines() if line.startswith("rm -rf"))
    assert {".venv", ".temporal", "build", "*.egg-info"} <= set(removal.split())


async def test_offline_model_drives_every_example_agent(client):
    with GeminiStandIn(respond) as offline:
        async with build_worker(
            client,
            agents=[banking.banking_agent, deploy.deploy_agent, shell.shell_agent],
            task_queue="offline",
            gemini=offline.client(),
        ):
            from temporal_agent_interrupts import AgentClient, deny

            agents = AgentClient(client, task_queue="offline")
            bank = await agents.chat("bankingAgent")
            res = await bank.send("Please send $1500 to my checking account")
            (ask,) = res.interrupts
            assert ask.name == "userApproval"
            assert ask.input == {
                "action": "transferMoney",
                "details": "Transfer $1500.00 to checking",
            }
            # Approved, but above the limit: transferMoney pauses on its own (conditional).
            res = await bank.resume(respond=[ask.respond({"approved": True})])
            (large,) = res.interrupts
            assert (large.name, large.source) == ("transferMoney", "tool")
            assert large.metadata == {"reason": "large transfer", "amount": "1500.00"}
            res = await bank.resume(restart=[large.restart({"tool_approved": True})])
            assert res.finish_reason == FinishReason.STOP
            assert res.text.startswith(BANNER)
            assert "transferred $1500.00 to checking" in res.text
            assert any(t.amount == 1500 for t in banking.LEDGER)

            dep = await agents.chat("deployAgent")
            res = await dep.send("Deploy api to staging")
            (gate,) = res.interrupts
            assert gate.metadata == {"message": "Tool not in approved list: deploy"}
            assert gate.input == {"service": "api", "environment": "staging"}
            res = await dep.resume(restart=[gate.restart({"tool_approved": True})])
            assert "Deployed api latest to staging" in res.text
            res = await dep.send("What is the status of api?")
            assert res.finish_reason == FinishReason.STOP  # deployStatus is allowed: no pause
            assert "deployStatus" in res.text

            other = await dep.send("Tell me a joke")
            assert "Set GEMINI_API_KEY" in other.text

            sh = await agents.chat("shellAgent")
            res = await sh.send("Run `echo hello`")
            assert res.finish_reason == FinishReason.STOP  # safe: no pause
            assert "exited with 0" in res.text and "hello" in res.text
            res = await sh.send("Run `rm precious.txt`")
            (risky,) = res.interrupts
            assert risky.metadata == {
                "command": "rm precious.txt",
                "reason": "'rm' is not on the read-only list; it could change files or run others.",
            }
            res = await sh.resume(respond=[deny(risky, "not on my watch")])
            assert "run_shell did not complete: denied by the user" in res.text


def test_stand_in_speaks_both_gemini_methods():
    """generateContent (JSON) and streamGenerateContent (SSE), through the real client."""
    with GeminiStandIn(respond) as offline:
        gemini = offline.client()
        whole = gemini.models.generate_content(model="gemini-flash-latest", contents="hi")
        assert whole.text is not None and whole.text.startswith(BANNER)
        chunks = list(
            gemini.models.generate_content_stream(model="gemini-flash-latest", contents="hi")
        )
        assert "".join(c.text or "" for c in chunks) == whole.text
        assert [r.method for r in offline.requests] == ["generateContent", "streamGenerateContent"]


def test_build_worker_refuses_sdk_retries(client):
    import google.genai as genai
    from google.genai import types as gt

    from examples import ALL_AGENTS

    gemini = genai.Client(
        api_key="unused",
        http_options=gt.HttpOptions(retry_options=gt.HttpRetryOptions(attempts=3)),
    )
    with pytest.raises(ValueError, match="Temporal retries"):
        build_worker(client, agents=ALL_AGENTS, task_queue="never", gemini=gemini)


def readme_python_example() -> str:
    """The client example of "Getting started", as a newcomer would copy it."""
    return block("# terminal 2: python this_file.py", lang="python")


async def test_the_readme_client_example_runs_as_written(env, tmp_path):
    """Against a worker like `make run`'s, three times: its exit status must be its own, never
    the SDK's abort at interpreter exit (sdk-python issue 300)."""
    script = tmp_path / "this_file.py"
    environ = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    environ["TEMPORAL_ADDRESS"] = server_address(env.client)
    queue = f"tq-readme-{uuid.uuid4()}"
    environ["AGENT_TASK_QUEUE"] = queue
    with GeminiStandIn(respond) as offline:
        async with build_worker(
            env.client, agents=ALL_AGENTS, task_queue=queue, gemini=offline.client()
        ):
            for n in range(3):
                # A fresh chat id each time; everything else is the README's text.
                source = readme_python_example().replace('"order-42"', f'"readme-{uuid.uuid4()}"')
                script.write_text(source)
                proc = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, str(script)],
                    cwd=tmp_path,
                    env={**environ, "PYTHONPATH": str(ROOT)},
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert proc.returncode == 0, (n, proc.stdout, proc.stderr)
                assert proc.stdout.startswith("userApproval "), proc.stdout
                assert "transferred $500.00 to savings" in proc.stdout


def test_run_script_exits_with_the_scripts_status(tmp_path):
    cases = {
        "return None": (0, ""),
        "return 3": (3, ""),
        "raise SystemExit('bad input')": (1, "bad input"),
        "raise RuntimeError('boom')": (1, "RuntimeError: boom"),
    }
    for body, (code, err) in cases.items():
        script = tmp_path / "s.py"
        script.write_text(
            "from temporal_agent_interrupts.client.api import run_script\n\n"
            f"async def main():\n    {body}\n\n"
            "run_script(main())\n"
        )
        proc = subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == code, (body, proc.stderr)
        assert err in proc.stderr


def test_the_offline_model_stands_in_only_when_no_gemini_is_configured():
    from temporal_agent_interrupts.worker import has_gemini_key

    assert not has_gemini_key({})
    assert not has_gemini_key({"GOOGLE_GENAI_USE_VERTEXAI": "false"})
    assert has_gemini_key({"GEMINI_API_KEY": "k"}) and has_gemini_key({"GOOGLE_API_KEY": "k"})
    # Vertex AI authenticates with Google Cloud credentials, not a key.
    assert has_gemini_key({"GOOGLE_GENAI_USE_VERTEXAI": "true", "GOOGLE_CLOUD_PROJECT": "p"})


# Who stops the server: `make stop` and the demo's closing text agree on it.


def test_make_stop_leaves_a_server_whose_starter_still_runs_alone(tmp_path):
    # As `make run` records its server: the server's pid, then its own (this test is the parent).
    server = fake_dev_server()
    try:
        pid_file = write_pid(tmp_path, server.pid)
        pid_file.write_text(f"{server.pid}\n{os.getpid()}\n")
        run = make(tmp_path, "stop")
        assert run.returncode != 0  # and so `make clean` keeps the data of a server in use
        assert f"left the dev server (pid {server.pid}) running" in run.stdout
        assert f"it belongs to pid {os.getpid()} (" in run.stdout
        assert "stop that instead" in run.stdout
        assert server.poll() is None
        assert pid_file.exists()
    finally:
        server.kill()
        server.wait()


async def test_the_demo_leaves_a_server_it_did_not_start_alone(env, tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    environ["TEMPORAL_ADDRESS"] = address = server_address(env.client)
    environ["AGENT_TASK_QUEUE"] = f"tq-demo-{uuid.uuid4()}"
    proc = await run_demo(environ, cwd=tmp_path, stdin="n\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Using the Temporal server at {address} (TEMPORAL_ADDRESS)." in proc.stdout
    assert f"The Temporal server at {address} was already running and is left alone:" in proc.stdout
    assert "make stop" not in proc.stdout
    assert "this conversation:  workflow id demo-" in proc.stdout  # where to look, still


def test_make_run_adopts_the_demos_server_so_make_stop_leaves_it_alone(tmp_path):
    """`make demo` leaves its server running; `make run` then uses it. A second demo suggests
    `make stop`, which must not stop the server under the running worker."""
    from temporal_agent_interrupts.worker.devserver import (
        adopt_dev_server,
        recorded_dev_server,
        release_dev_server,
    )

    db_file = tmp_path / ".temporal" / "temporal.db"
    server = fake_dev_server()
    sleeper = "import time; time.sleep(60)"
    # What `ps` shows for `make run`'s worker, which is not the server's parent here.
    worker = subprocess.Popen(
        [sys.executable, "-c", sleeper, "-m", "temporal_agent_interrupts.worker", "--dev-server"]
    )
    try:
        pid_file = write_pid(tmp_path, server.pid)  # the demo's orphan
        assert adopt_dev_server(db_file) == server.pid
        assert pid_file.read_text().split() == [str(server.pid), str(os.getpid())]
        assert adopt_dev_server(db_file) is None  # owned now: nobody else adopts it
        release_dev_server(db_file, server.pid)
        assert pid_file.read_text().split() == [str(server.pid)]  # an orphan again

        pid_file.write_text(f"{server.pid}\n{worker.pid}\n")  # as the worker adopts it
        found = recorded_dev_server(pid_file)
        assert found is not None and found.owner == worker.pid
        run = make(tmp_path, "stop")
        assert run.returncode != 0
        assert f"left the dev server (pid {server.pid}) running" in run.stdout
        assert server.poll() is None
        worker.kill()
        worker.wait()
        run = make(tmp_path, "stop")  # the worker is gone: the orphan may go
        assert run.stdout.strip() == f"stopped the dev server (pid {server.pid})", run.stdout
    finally:
        for child in (server, worker):
            if child.poll() is None:
                child.kill()
                child.wait()


def test_the_demo_does_not_ask_for_make_run_while_it_runs():
    from examples.demo import worker_hint
    from temporal_agent_interrupts.worker.devserver import RecordedServer

    assert worker_hint("agents", None) == "make run   (serves task queue 'agents'), then"
    make_run = RecordedServer(pid=10, owner=11, owner_command="agent-worker --dev-server")
    assert worker_hint("agents", make_run).startswith("make run is already running (pid 11)")
    orphan = RecordedServer(pid=10, owner=None)
    assert worker_hint("agents", orphan).startswith("make run   (serves")

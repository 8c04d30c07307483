"""A newcomer's path: the demo's conversation and the offline stand-in model's rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client import FinishReason
from examples import banking, deploy, shell
from tests.helpers import server_address
from worker import build_worker
from worker.offline_model import BANNER, respond
from worker.standin import GeminiStandIn

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    ("stdin", "expected", "approved"),
    [
        ("y\n", "Done: transferred $500.00 to savings", True),
        ("n\n", "The transfer was not approved", False),
        ("", "The transfer was not approved", False),  # no TTY, nothing piped: no
    ],
)
def test_demo_runs_the_banking_conversation(env, tmp_path, stdin, expected, approved):
    environ = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    environ["TEMPORAL_ADDRESS"] = server_address(env.client)
    proc = subprocess.run(
        [sys.executable, "-m", "client.demo"],
        input=stdin,
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "offline stand-in model" in out
    assert "interrupt: userApproval" in out
    assert '"details": "Transfer $500.00 to savings"' in out
    assert "approve? [y/N]" in out
    assert expected in out
    assert "finish reason: stop" in out
    assert "/namespaces/default/workflows/demo-" in out
    transferred = "transaction txn-" in out
    assert transferred is approved


async def test_offline_model_drives_every_example_agent(client):
    with GeminiStandIn(respond) as offline:
        async with build_worker(
            client,
            agents=[banking.banking_agent, deploy.deploy_agent, shell.shell_agent],
            task_queue="offline",
            gemini=offline.client(),
        ):
            from client import AgentClient, deny

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
                "reason": "The command can modify files.",
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

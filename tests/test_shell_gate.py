"""The shell example's gate (group 5 of the durable-input cases, see test_durable_input.py).

A denylist of first words let ``python3 -c``, ``env``, ``timeout`` and ``sh -c`` run without
approval; the gate is now an allow-list of read-only programs confined to the scratch directory,
and the worker does not host the shell agent unless asked.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from examples.shell import needs_approval
from temporal_agent_interrupts.worker.__main__ import load_agents
from temporal_agent_interrupts.worker.standin import calls, text


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["ls", "-la"], None),
        (["cat", "notes.txt"], None),
        (["grep", "-r", "todo", "src"], None),
        (["python3", "-c", "print(1)"], "not on the read-only list"),
        (["env", "mkdir", "x"], "not on the read-only list"),
        (["timeout", "5", "mkdir", "x"], "not on the read-only list"),
        (["sh", "-c", "ls"], "not on the read-only list"),
        (["/bin/ls"], "not on the read-only list"),
        (["sort", "-o", "out", "in"], "not on the read-only list"),
        (["cat", "/etc/passwd"], "outside the scratch directory"),
        (["cat", "../../proc/self/environ"], "outside the scratch directory"),
        (["cat", "~/.ssh/id_rsa"], "outside the scratch directory"),
        (["grep", "-f/etc/shadow", "x"], "outside the scratch directory"),
        ([], "empty"),
    ],
)
def test_only_known_harmless_commands_skip_approval(argv, why):
    reason = needs_approval(argv)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason


@pytest.mark.parametrize(
    "command",
    [
        "python3 -c \"open('owned', 'w').write('x')\"",
        "env touch owned",
        "timeout 5 touch owned",
        "sh -c 'touch owned'",
        "/usr/bin/touch owned",
        "cat /proc/self/environ",
    ],
)
async def test_the_shell_agent_asks_before_anything_not_known_harmless(
    run_worker, model, client, command
):
    model.reply(calls(("run_shell", {"command": command})), text("not run"))
    async with run_worker() as agents:
        chat = await agents.chat("shellAgent")
        res = await chat.send(f"run {command}")
        (ask,) = res.interrupts
        done = await chat.resume(respond=[ask.respond({"error": "denied by the user"})])
    assert ask.name == "run_shell" and ask.metadata["command"] == command
    assert done.text == "not run"
    assert not (Path(tempfile.gettempdir()) / "shell-agent" / "owned").exists()


async def test_read_only_commands_in_the_scratch_directory_run_at_once(run_worker, model):
    model.reply(calls(("run_shell", {"command": "echo hello"})), text("said hello"))
    async with run_worker() as agents:
        res = await (await agents.chat("shellAgent")).send("run echo hello")
    assert res.text == "said hello"
    (response,) = model.requests[1].function_responses()
    assert response["response"]["stdout"] == "hello\n"


def test_the_worker_does_not_host_the_shell_agent_unless_asked(monkeypatch):
    monkeypatch.setenv("AGENT_MODULES", "examples")  # what make run and the image name
    assert [a.name for a in load_agents(None)] == ["bankingAgent", "deployAgent"]
    asked = load_agents(["examples:ALL_AGENTS", "examples:shell_agent"])
    assert [a.name for a in asked] == ["bankingAgent", "deployAgent", "shellAgent"]

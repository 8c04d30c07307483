"""shellAgent: ``run_shell`` pauses for approval unless a command is on a short read-only list.

A conditional interrupt: a command runs at once only when its program is one of
:data:`READ_ONLY` and none of its arguments leaves the scratch directory (no absolute path, no
``~``, no ``..``). Everything else pauses with the command and the reason; a restart with
``{"tool_approved": true}`` runs it. Commands run without a shell (no pipes, globs or
redirection), in a scratch directory, with a cleared environment, a timeout and an output cap.

Why an allow-list: a list of dangerous first words cannot be complete. Any interpreter runs
anything (``python3 -c``, ``sh -c``, ``perl -e``), many programs run other programs (``env``,
``timeout``, ``nice``, ``xargs``, ``find -exec``, ``busybox``), ordinary tools write files with a
flag (``sort -o``, ``tee``), and a program can be named by any path. So the question asked is not
"is this known to be dangerous" but "is this known to be harmless", and the answer for anything
unknown is: ask a human.

This agent runs commands on the worker's machine. ``agent-worker`` does not host it unless
asked (``--agents examples:ALL_AGENTS --agents examples:shell_agent``).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from temporal_agent_interrupts import Agent, Interrupt, ToolContext, ToolError, tool
from temporal_agent_interrupts.types import TOOL_APPROVED, Status

READ_ONLY = frozenset(
    {"ls", "pwd", "echo", "cat", "head", "tail", "wc", "grep", "stat", "df", "du", "whoami", "id"}
)
"""Programs that only read, run without approval when their arguments stay in the scratch
directory. Deliberately short: each one is known to have no flag that writes, deletes or runs
another program."""

TIMEOUT_SECONDS = 10
OUTPUT_LIMIT = 4000


class RunShellInput(BaseModel):
    command: str = Field(description="A single command line, e.g. 'ls -la'")


class RunShellOutput(BaseModel):
    command: str
    exit_code: int
    stdout: str
    stderr: str


def needs_approval(argv: list[str]) -> str | None:
    """Why this command must be approved first, or None when it may run as it is."""
    if not argv:
        return "The command is empty."
    program = argv[0]
    if program not in READ_ONLY:
        # Named by path, or not on the list: it could do anything.
        return f"{program!r} is not on the read-only list; it could change files or run others."
    for arg in argv[1:]:
        if arg.startswith("-"):
            # An option may carry a path of its own (--file=/etc/x, -f/etc/x).
            outside = "/" in arg or ".." in arg
        else:
            outside = arg.startswith(("/", "~")) or ".." in Path(arg).parts
        if outside:
            return "An argument reaches outside the scratch directory."
    return None


def _environment() -> dict[str, str]:
    # Not the worker's: it holds credentials (a Gemini key, Temporal's API key or TLS paths).
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": "/tmp"}


@tool("run_shell", "Run a shell command after a safety check.")
async def run_shell(inp: RunShellInput, ctx: ToolContext) -> RunShellOutput:
    try:
        argv = shlex.split(inp.command)
    except ValueError as e:
        raise ToolError(Status.INVALID_ARGUMENT, f"cannot parse command: {e}") from None
    reason = needs_approval(argv)
    if reason and not ctx.resumed_metadata.get(TOOL_APPROVED):
        raise Interrupt({"command": inp.command, "reason": reason})
    workdir = Path(tempfile.gettempdir()) / "shell-agent"
    workdir.mkdir(exist_ok=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            env=_environment(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise ToolError(Status.NOT_FOUND, f"command not found: {argv[0]}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_SECONDS)
    except TimeoutError:
        proc.kill()
        raise ToolError(
            Status.DEADLINE_EXCEEDED, f"command ran longer than {TIMEOUT_SECONDS}s"
        ) from None
    return RunShellOutput(
        command=inp.command,
        exit_code=proc.returncode if proc.returncode is not None else -1,
        stdout=out.decode(errors="replace")[:OUTPUT_LIMIT],
        stderr=err.decode(errors="replace")[:OUTPUT_LIMIT],
    )


shell_agent = Agent(
    "shellAgent",
    model="gemini-flash-latest",
    system="You help with the command line. Use run_shell to run commands the user asks for.",
    tools=[run_shell],
)

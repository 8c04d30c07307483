"""shellAgent: ``run_shell`` interrupts only for risky commands (a conditional interrupt).

Safe commands run at once. A command that can change files or processes pauses with the command
and the reason; a restart with ``{"tool_approved": true}`` runs it. Commands run without a shell
(no pipes, globs or redirection), in a scratch directory, with a timeout and an output cap.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from activities import Interrupt, ToolContext, ToolError, tool
from workflows import Agent

RISKY = frozenset(
    {
        "rm",
        "mv",
        "cp",
        "chmod",
        "chown",
        "dd",
        "mkfs",
        "kill",
        "pkill",
        "sudo",
        "truncate",
        "shutdown",
        "reboot",
        "touch",
        "mkdir",
        "rmdir",
        "ln",
        "tee",
        "curl",
        "wget",
    }
)
TIMEOUT_SECONDS = 10
OUTPUT_LIMIT = 4000


class RunShellInput(BaseModel):
    command: str = Field(description="A single command line, e.g. 'ls -la'")


class RunShellOutput(BaseModel):
    command: str
    exit_code: int
    stdout: str
    stderr: str


def is_risky(argv: list[str]) -> bool:
    return not argv or Path(argv[0]).name in RISKY or any(a in (">", ">>", "|") for a in argv)


@tool("run_shell", "Run a shell command after a safety check.")
async def run_shell(inp: RunShellInput, ctx: ToolContext) -> RunShellOutput:
    try:
        argv = shlex.split(inp.command)
    except ValueError as e:
        raise ToolError("INVALID_ARGUMENT", f"cannot parse command: {e}") from None
    if is_risky(argv) and not ctx.resumed_metadata.get("tool_approved"):
        raise Interrupt({"command": inp.command, "reason": "The command can modify files."})
    workdir = Path(tempfile.gettempdir()) / "shell-agent"
    workdir.mkdir(exist_ok=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise ToolError("NOT_FOUND", f"command not found: {argv[0]}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_SECONDS)
    except TimeoutError:
        proc.kill()
        raise ToolError(
            "DEADLINE_EXCEEDED", f"command ran longer than {TIMEOUT_SECONDS}s"
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

"""``make demo``: one banking conversation that pauses for your approval.

Starts the embedded Temporal dev server (unless one already listens on localhost:7233) and leaves
it running with its UI, runs a worker in this process, asks the bankingAgent to transfer $500,
shows the interrupt, reads ``approve? [y/N]`` from stdin (a pipe works: ``echo y | make demo``),
sends the answer as a resume and prints the final answer.

The worker polls the project's task queue (``AGENT_TASK_QUEUE``, default ``agents``), the one
``make run`` serves: once the demo's own worker has gone, ``make run`` answers ``agentctl show``
and the Temporal UI's queries for the demo's conversation.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import NoReturn
from urllib.parse import quote

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from client.api import (
    DEFAULT_TASK_QUEUE,
    AgentClient,
    approve,
    connect_config,
    deny,
    run_script,
)
from examples import ALL_AGENTS
from worker import build_worker, has_gemini_key
from worker.devserver import port_open, start_dev_server, temporal_cli, wait_for_port
from worker.search_attributes import register_search_attributes
from workflows.types import FinishReason

ADDRESS = "localhost:7233"
UI = "http://localhost:8233"


def task_queue() -> str:
    """The queue ``python -m worker`` (``make run``) and ``agentctl`` use by default too."""
    return os.environ.get("AGENT_TASK_QUEUE") or DEFAULT_TASK_QUEUE


def _command(path: str) -> str:
    """A program's path as a shell command: relative to here when under here (``.venv/bin/x``)."""
    # Not resolve(): .venv/bin/python and friends may be symlinks, and their names are the point.
    relative = os.path.relpath(os.path.abspath(path))
    if relative.startswith(os.pardir + os.sep):
        return path
    return relative if os.sep in relative else os.path.join(os.curdir, relative)


def _ask(prompt: str) -> str:
    print(prompt, end="", flush=True)
    line = sys.stdin.readline()  # "" at EOF: no TTY and nothing piped means "no"
    if not sys.stdin.isatty():
        print(line.strip())
    return line.strip().lower()


async def demo() -> int:
    if os.environ.get("TEMPORAL_ADDRESS"):
        print(f"Using the Temporal server at {os.environ['TEMPORAL_ADDRESS']} (TEMPORAL_ADDRESS).")
    elif port_open(7233):
        print(f"Using the Temporal server already listening on {ADDRESS}.")
    else:
        state = Path(".temporal")
        proc = start_dev_server(db_file=state / "temporal.db", log_file=state / "dev-server.log")
        await wait_for_port(7233, proc=proc)
        print(f"Started the Temporal dev server (pid {proc.pid}); data in .temporal/, UI at {UI}")
    config = connect_config()
    config["data_converter"] = pydantic_data_converter
    temporal = await Client.connect(**config)
    # A server we did not start may lack them; registering is idempotent.
    await register_search_attributes(temporal)
    if not has_gemini_key():
        print(
            "No GEMINI_API_KEY set: the offline stand-in model answers (fixed rules, not Gemini)."
        )

    chat_id = f"demo-{uuid.uuid4().hex[:8]}"
    queue = task_queue()
    async with build_worker(temporal, agents=ALL_AGENTS, task_queue=queue):
        agents = AgentClient(temporal, task_queue=queue)
        chat = await agents.chat("bankingAgent", chat_id=chat_id)
        message = "Transfer $500 to savings."
        print(f"\nyou> {message}")
        res = await chat.send(message)
        if res.text:
            print(f"agent> {res.text}")
        while res.finish_reason == FinishReason.INTERRUPTED:
            for i in res.interrupts:
                print("\n-- the conversation is paused --")
                print(f"interrupt: {i.name}")
                print(f"ref:       {i.ref}")
                print(f"input:     {json.dumps(i.input)}")
                if i.metadata:
                    print(f"metadata:  {json.dumps(i.metadata)}")
            approved = _ask("approve? [y/N] ") in ("y", "yes")
            answers = [
                approve(i) if approved else deny(i, "declined in the demo") for i in res.interrupts
            ]
            res = await chat.resume(answers=answers, identity="demo-user")
        print(f"\nagent> {res.text or res.error}")
        print(f"finish reason: {res.finish_reason.value}")
    link = f"{UI}/namespaces/{temporal.namespace}/workflows/{quote(chat_id)}"
    beside = Path(sys.executable).parent / "agentctl"  # installed with the project
    agentctl = _command(str(beside)) if beside.exists() else "agentctl"
    print(
        "\nThe dev server and its UI are still running:\n"
        f"  this conversation:  {link}\n"
        f"  all conversations:  {UI}/namespaces/{temporal.namespace}/workflows\n"
        f"  paused ones:        {_command(temporal_cli())} workflow list --query "
        '\'AgentStatus="interrupted" AND ExecutionStatus="Running"\'\n'
        f"  with a worker:      make run   (serves task queue {queue!r}), then\n"
        f"                      {agentctl} show {chat_id}\n"
        "Stop the server with: make stop"
    )
    return 0


def main() -> NoReturn:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("worker").setLevel(logging.ERROR)  # the stand-in notice is printed above
    run_script(demo())


if __name__ == "__main__":
    main()

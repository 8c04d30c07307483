"""``make demo``: one banking conversation that pauses for your approval.

Uses the configured Temporal server (``TEMPORAL_ADDRESS`` or a profile), else the one listening on
localhost:7233, else starts the embedded dev server and leaves it running with its UI. Then it
checks the server answers as Temporal, runs a worker in this process, asks the bankingAgent to
transfer $500, shows the interrupt, reads ``approve? [y/N]`` from stdin (a pipe works:
``echo y | make demo``), sends the answer as a resume and prints the final answer. Its closing
text says ``make stop`` only for a server ``make stop`` would stop.

The worker polls the project's task queue (``AGENT_TASK_QUEUE``, default ``agents``), the one
``make run`` serves: once the demo's own worker has gone, ``make run`` answers ``agentctl show``
and the Temporal UI's queries for the demo's conversation.

It lives among the examples, not in ``client/``, because it runs a worker: the client imports
nothing from ``worker/``, which imports the client.
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

from examples import ALL_AGENTS
from temporal_agent_interrupts import AgentClient, FinishReason, approve, deny, run_script
from temporal_agent_interrupts.client.api import DEFAULT_ADDRESS, connect_answering
from temporal_agent_interrupts.codec_server import DEFAULT_PORT as CODEC_PORT
from temporal_agent_interrupts.errors import ConnectionConfigError, ServerNotAnswering
from temporal_agent_interrupts.hosting import DEFAULT_TASK_QUEUE, build_worker, connect_config
from temporal_agent_interrupts.payloads import PayloadKeys, data_converter, load_keys
from temporal_agent_interrupts.worker import has_gemini_key
from temporal_agent_interrupts.worker.devserver import (
    DEV_WORKER_ARGS,
    RecordedServer,
    pid_file,
    port_open,
    recorded_dev_server,
    start_dev_server,
    temporal_cli,
    wait_for_port,
)
from temporal_agent_interrupts.worker.result_keys import dev_result_keys
from temporal_agent_interrupts.worker.search_attributes import register_search_attributes

ADDRESS = DEFAULT_ADDRESS
PORT = 7233
UI = "http://localhost:8233"
STATE_DIR = Path(".temporal")


def task_queue() -> str:
    """The queue ``agent-worker`` (``make run``) and ``agentctl`` use by default too."""
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


def closing_lines(
    *, address: str, started: bool, recorded: RecordedServer | None
) -> tuple[str, str | None]:
    """What the demo says about the server it used, before and after the links to it.

    ``make stop`` is offered only for a server it would stop: the one this demo started, or an
    orphaned dev server recorded under ``.temporal/`` (an earlier demo's). A server with a live
    owner (``make run``), or one nothing here recorded, is somebody else's to stop.

    Args:
        address: where the demo connected.
        started: this demo started the server.
        recorded: the dev server ``.temporal/dev-server.pid`` names, when the demo used the
            default address.
    """
    if started or (recorded is not None and recorded.owner is None):
        return "The dev server and its UI are still running:", "Stop the server with: make stop"
    if recorded is not None:
        owner = f"pid {recorded.owner}" + (
            f" ({recorded.owner_command})" if recorded.owner_command else ""
        )
        return (
            f"The dev server at {address} belongs to {owner}, which is still running; "
            "it is left alone:",
            None,
        )
    return f"The Temporal server at {address} was already running and is left alone:", None


def worker_hint(queue: str, recorded: RecordedServer | None) -> str:
    """How to get a worker for the demo's conversation: ``make run``, unless it already runs
    (it owns or adopted the recorded dev server)."""
    if recorded is not None and recorded.owner and DEV_WORKER_ARGS.search(recorded.owner_command):
        return f"make run is already running (pid {recorded.owner}); if it serves {queue!r},"
    return f"make run   (serves task queue {queue!r}), then"


async def demo() -> int:
    try:
        # Without a default, so that "nothing configured" (the dev server's case) shows.
        config = connect_config(default_address=None)
        keys: PayloadKeys = load_keys()  # AGENT_PAYLOAD_KEYS: encrypt what the demo writes
    except ConnectionConfigError as e:
        print(f"Cannot run the demo: {e}", file=sys.stderr)
        return 2
    configured: str | None = config.get("target_host")
    started = False
    if configured:
        source = "TEMPORAL_ADDRESS" if os.environ.get("TEMPORAL_ADDRESS") else "a Temporal profile"
        print(f"Using the Temporal server at {configured} ({source}).")
    elif port_open(PORT):
        print(f"Using the Temporal server already listening on {ADDRESS}.")
    else:
        db_file = STATE_DIR / "temporal.db"
        proc = start_dev_server(
            db_file=db_file,
            log_file=STATE_DIR / "dev-server.log",
            # The UI reads encrypted payloads through the codec server `make run` starts.
            codec_endpoint=f"http://localhost:{CODEC_PORT}" if keys else None,
        )
        await wait_for_port(PORT, proc=proc)
        started = True
        print(f"Started the Temporal dev server (pid {proc.pid}); data in .temporal/, UI at {UI}")
    address = configured or ADDRESS
    # Only a default server this demo did not start can be an earlier one .temporal/ records.
    recorded = (
        None if configured or started else recorded_dev_server(pid_file(STATE_DIR / "temporal.db"))
    )
    config["target_host"] = address
    config["data_converter"] = data_converter(keys)
    try:
        temporal = await connect_answering(config)
    except ServerNotAnswering as e:
        hint = "; `make stop` stops the dev server" if recorded and not recorded.owner else ""
        print(f"Cannot run the demo: {e}{hint}", file=sys.stderr)
        return 1
    except ConnectionConfigError as e:
        print(f"Cannot run the demo: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"Cannot run the demo: cannot connect to Temporal at {address}: {e}", file=sys.stderr)
        return 1
    # A server we did not start may lack them; registering is idempotent.
    await register_search_attributes(temporal)
    if not has_gemini_key():
        print(
            "No GEMINI_API_KEY set: the offline stand-in model answers (fixed rules, not Gemini)."
        )
    if keys:
        print(
            f"Payloads are encrypted with key {keys.encrypting_id!r} (AGENT_PAYLOAD_KEYS); the UI "
            f"shows them in the clear while a codec server runs on port {CODEC_PORT} (make run "
            "starts one)."
        )

    chat_id = f"demo-{uuid.uuid4().hex[:8]}"
    queue = task_queue()
    # The key that seals activity results: AGENT_RESULT_KEYS, else the development key file
    # (`make run` uses it too). The demo's worker serves only the demo's own conversation.
    try:
        result_keys = dev_result_keys()
    except (OSError, ConnectionConfigError) as e:
        print(f"Cannot run the demo: {e}", file=sys.stderr)
        return 2
    async with build_worker(temporal, agents=ALL_AGENTS, task_queue=queue, result_keys=result_keys):
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
    beside = Path(sys.executable).parent / "agentctl"  # installed with the project
    agentctl = _command(str(beside)) if beside.exists() else "agentctl"
    heading, footer = closing_lines(address=address, started=started, recorded=recorded)
    if address == ADDRESS:  # the embedded server's UI
        where = (
            f"  this conversation:  {UI}/namespaces/{temporal.namespace}/workflows/"
            f"{quote(chat_id)}\n"
            f"  all conversations:  {UI}/namespaces/{temporal.namespace}/workflows\n"
        )
        temporal_command = _command(temporal_cli())
    else:  # somebody else's server: its UI is wherever they serve it
        where = f"  this conversation:  workflow id {chat_id} in the UI of {address}\n"
        temporal_command = f"{_command(temporal_cli())} --address {address}"
    print(
        f"\n{heading}\n"
        + where
        + f"  paused ones:        {temporal_command} workflow list --query "
        '\'AgentStatus="interrupted" AND ExecutionStatus="Running"\'\n'
        f"  with a worker:      {worker_hint(queue, recorded)}\n"
        f"                      {agentctl} show {chat_id}" + (f"\n{footer}" if footer else "")
    )
    return 0


def main() -> NoReturn:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("temporal_agent_interrupts.worker").setLevel(
        logging.ERROR
    )  # the stand-in notice is printed above
    run_script(demo())


if __name__ == "__main__":
    main()

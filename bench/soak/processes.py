"""The processes the soak starts, and the one way each is stopped.

Every child is started in a session of its own (a Ctrl-C at the terminal reaches the harness
only, which stops them in order) and with ``PR_SET_PDEATHSIG``: should the harness itself be
killed, the kernel kills its children too, so nothing is left running whatever happens.
Processes are stopped by the pid the harness started, never by name.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.soak.ledger import now as _now
from temporal_agent_interrupts.worker.devserver import dev_server_command, wait_for_port

log = logging.getLogger("bench.soak")

ROOT = Path(__file__).resolve().parent.parent.parent
"""The repository: the children run from it, with it on their path."""

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the harness dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every child: this one, the repository first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def spawn(
    cmd: list[str], *, log_file: Path, stdout: int | IO[bytes] | None = None, **extra: str
) -> subprocess.Popen[bytes]:
    out = open(log_file, "ab")  # noqa: SIM115  # the child's: closed in this process at once
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else out,
            stderr=out,
            cwd=ROOT,
            env=child_env(**extra),
            start_new_session=True,
            preexec_fn=_die_with_parent,  # no threads touch os state here
        )
    finally:
        out.close()


async def stop(proc: subprocess.Popen[bytes], *, grace: float, name: str) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        if not await _exited(proc, grace):
            log.warning("%s (pid %d) did not stop in %.0fs: SIGKILL", name, proc.pid, grace)
            proc.kill()
    await _exited(proc, 30.0)


async def _exited(proc: subprocess.Popen[bytes], within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while proc.poll() is None:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@dataclass
class DevServer:
    """The embedded dev server on its own SQLite file and port (never 7233)."""

    db_file: Path
    port: int
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        cmd = dev_server_command(db_file=self.db_file, port=self.port, headless=True)
        self.proc = spawn(cmd, log_file=self.log_file)
        self.starts += 1
        await wait_for_port(self.port, timeout=60, proc=self.proc)

    def kill(self) -> None:
        """SIGKILL: the fault (the database file stays as the server left it)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None:
            await stop(self.proc, grace=10, name="dev server")


@dataclass
class Worker:
    """One worker process (``bench.soak.worker``)."""

    number: int
    proc: subprocess.Popen[bytes]
    started: float
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


def worker_command(
    *,
    address: str,
    task_queue: str,
    ledger: Path,
    model_calls: Path,
    seed: int,
    model_fault_rate: float,
    hang_seconds: float,
    http_timeout: float,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.soak.worker",
        "--address",
        address,
        "--task-queue",
        task_queue,
        "--ledger",
        str(ledger),
        "--model-calls",
        str(model_calls),
        "--seed",
        str(seed),
        "--model-fault-rate",
        str(model_fault_rate),
        "--hang-seconds",
        str(hang_seconds),
        "--http-timeout",
        str(http_timeout),
    ]


@dataclass
class Exit:
    """A worker that stopped: how, and whether the schedule stopped it."""

    number: int
    pid: int
    at: float
    how: str
    """``sigkill``, ``sigterm`` (the schedule's) or ``unexpected`` (exit code in ``code``)."""
    code: int | None = None
    drained_in: float | None = None
    """After a SIGTERM: seconds until the process had shut down gracefully."""


class Fleet:
    """The worker processes: started, replaced after each kill, watched for other exits."""

    def __init__(self, *, size: int, command: list[str], logs: Path) -> None:
        self.size = size
        self.command = command
        self.logs = logs
        self.workers: list[Worker] = []
        self.retired: list[Worker] = []
        self.exits: list[Exit] = []
        self.started = 0
        self._watching: asyncio.Task[None] | None = None
        self._reaping: set[asyncio.Task[None]] = set()

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        self._watching = asyncio.create_task(self._watch())

    async def _spawn(self) -> Worker:
        self.started += 1
        number = self.started
        proc = spawn(
            self.command, log_file=self.logs / f"worker-{number}.log", stdout=subprocess.PIPE
        )
        worker = Worker(number=number, proc=proc, started=_now())
        self.workers.append(worker)
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if line.strip() == b"ready":
            worker.ready.set()
        else:
            log.error("worker %d (pid %d) did not start: %r", number, proc.pid, line)
        return worker

    async def kill(self, how: str, rng_pick: int) -> Exit | None:
        """Kill one live worker (``sigkill`` or ``sigterm``) and start a fresh one at once."""
        live = [w for w in self.workers if w.alive() and w.ready.is_set()]
        if not live:
            return None
        victim = live[rng_pick % len(live)]
        self.workers.remove(victim)
        self.retired.append(victim)
        exit = Exit(number=victim.number, pid=victim.pid, at=_now(), how=how)
        self.exits.append(exit)
        if how == "sigkill":
            victim.proc.kill()
        else:
            victim.proc.send_signal(signal.SIGTERM)
        task = asyncio.create_task(self._reap(victim, exit))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)
        await self._spawn()
        return exit

    async def _reap(self, worker: Worker, exit: Exit) -> None:
        if not await _exited(worker.proc, 60.0):
            log.warning("worker %d did not stop 60s after SIGTERM: SIGKILL", worker.number)
            worker.proc.kill()
            await _exited(worker.proc, 30.0)
            exit.how += "+sigkill"
        exit.code = worker.proc.returncode
        if exit.how == "sigterm":
            exit.drained_in = _now() - exit.at

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for w in list(self.workers):
                if not w.alive():
                    self.workers.remove(w)
                    self.retired.append(w)
                    code = w.proc.returncode
                    log.error("worker %d (pid %d) exited by itself, code %s", w.number, w.pid, code)
                    self.exits.append(
                        Exit(number=w.number, pid=w.pid, at=_now(), how="unexpected", code=code)
                    )
                    await self._spawn()

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
        await asyncio.gather(
            *(stop(w.proc, grace=20, name=f"worker {w.number}") for w in self.workers),
            *(stop(w.proc, grace=5, name=f"worker {w.number}") for w in self.retired),
        )
        for task in list(self._reaping):
            task.cancel()
        await asyncio.gather(*self._reaping, return_exceptions=True)

"""The fault schedule, made from the seed, and the injector that carries it out.

Process faults (the harness's): a worker SIGKILLed (no graceful shutdown: what it held waits for
Temporal's timeouts, the sticky queue's ~10 s for its cached conversations and the activities'
heartbeat timeouts for what it was running), a worker SIGTERMed (it shuts down gracefully), each
followed at once by a fresh worker; the dev server SIGKILLed and, after a few seconds down,
started again on the same database file and port. Model faults are the workers' own (see
:mod:`bench.soak.model`), logged in the model-calls file with their times.

The schedule is a list of times from ``random.Random(seed)``: at least one server kill and at
least one of each worker kill, then more at the rates asked, spread over the middle of the run
(none in its first tenth or its last fifth, so the soak starts and ends on a whole fleet), at least
:data:`MIN_GAP` apart so one fault is over before the next, and at most one worker down at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bench.soak.ledger import now
from bench.soak.processes import DevServer, Fleet

log = logging.getLogger("bench.soak")

FaultKind = Literal["worker_sigkill", "worker_sigterm", "server_sigkill"]

MIN_GAP = 4.0
"""Seconds between two process faults."""


@dataclass(frozen=True)
class Fault:
    at: float
    """Seconds after the soak started."""
    kind: FaultKind
    pick: int
    """Which live worker (an index, modulo how many there are), or the server's seconds down."""


@dataclass
class Injected:
    """A fault as it happened."""

    kind: str
    at: float
    """Wall-clock time."""
    detail: str = ""


def schedule(
    seed: int,
    *,
    duration: float,
    worker_kills_per_min: float,
    worker_terms_per_min: float,
    server_kills: int,
) -> list[Fault]:
    """The process faults of a run of ``duration`` seconds, from ``seed`` alone."""
    rng = random.Random(f"{seed}-faults")
    lo, hi = 0.1 * duration, 0.8 * duration
    minutes = duration / 60
    counts: dict[FaultKind, int] = {
        "server_sigkill": max(1, server_kills),
        "worker_sigkill": max(1, round(worker_kills_per_min * minutes)),
        "worker_sigterm": max(1, round(worker_terms_per_min * minutes)),
    }
    kinds: list[FaultKind] = [k for k, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    # Evenly spaced slots, each jittered within its share: spread out, and never closer than
    # MIN_GAP when the run has room for them all.
    share = (hi - lo) / len(kinds)
    jitter = max(0.0, share - MIN_GAP)
    faults = []
    for i, kind in enumerate(kinds):
        at = lo + i * share + rng.uniform(0, jitter)
        pick = rng.randrange(2, 6) if kind == "server_sigkill" else rng.randrange(1 << 16)
        faults.append(Fault(at=round(at, 2), kind=kind, pick=pick))
    return faults


class Injector:
    """Carries the schedule out, until the soak stops starting turns."""

    def __init__(
        self,
        faults: list[Fault],
        *,
        fleet: Fleet,
        server: DevServer,
        started: float,
        stopping: asyncio.Event,
        on_server: Callable[[bool], None] = lambda up: None,
    ) -> None:
        self.faults = faults
        self.fleet = fleet
        self.server = server
        self.started = started
        self.stopping = stopping
        self.on_server = on_server
        self.injected: list[Injected] = []

    async def run(self) -> None:
        for fault in self.faults:
            delay = self.started + fault.at - now()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                    return  # stopping: no more faults
                except TimeoutError:
                    pass
            if self.stopping.is_set():
                return
            await self._inject(fault)

    async def _inject(self, fault: Fault) -> None:
        if fault.kind == "server_sigkill":
            down = float(fault.pick)
            at = now()
            self.server.kill()
            self.on_server(False)
            log.warning("fault: dev server SIGKILLed; restarting in %.0fs", down)
            await asyncio.sleep(down)
            await self.server.start()
            self.on_server(True)
            self.injected.append(
                Injected(
                    kind="server_sigkill",
                    at=at,
                    detail=f"down {now() - at:.1f}s, restarted on the same database and port",
                )
            )
            return
        how = "sigkill" if fault.kind == "worker_sigkill" else "sigterm"
        at = now()
        exit = await self.fleet.kill(how, fault.pick)
        if exit is None:
            log.warning("fault %s skipped: no live worker", fault.kind)
            return
        log.warning("fault: worker %d (pid %d) %s; a fresh one started", exit.number, exit.pid, how)
        self.injected.append(
            Injected(kind=fault.kind, at=at, detail=f"worker {exit.number} pid {exit.pid}")
        )

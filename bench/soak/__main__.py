"""``python -m bench.soak`` (``make soak``): conversations under load while workers and the
server are killed, then the invariants checked from what is outside the harness.

One embedded dev server on its own SQLite file (in a temporary directory) and its own port,
``--workers`` worker processes (:mod:`bench.soak.worker`), the web app in a process of its own
(``python -m temporal_agent_interrupts.client.web --identity dev``), and ``--conversations``
slots, each running conversations one after another (:mod:`bench.soak.driver`). Faults follow a
schedule made from ``--seed`` (:mod:`bench.soak.faults`). After ``--duration`` seconds no new
turn starts; what is pending is answered, every conversation's last turn ends and it is closed;
then the checks (:mod:`bench.soak.checks`) run, ``soak.json`` and ``soak.png`` are written to
``--out`` and the figures printed. The exit status is 1 on any violation, 130 after Ctrl-C.

The load is people's, not a flood: a person reads for ``--think`` seconds on average before
answering (35 by default; deadlines are answered within seconds or left to expire) and waits
``--between`` (17) before the next message, so 200 conversations make about five turns a
second. On the 2 cores this was sized on that keeps the machine about half busy (the dev server
on SQLite takes about half of it), so what is measured is what faults do, not what a starved CPU
does: with think 12 and between 6 the same run kept the cores 85% busy, and the approval
latency went from about 1 s to 5 s at the median and from 11 s to 63 s at p99. agentctl is a
process per answer, about a CPU second each: 2% of the answers go that way (8% in short runs, so
that they have some). Runs under five minutes (the test's) are paced faster: 1.5 and 1 s.

Everything started here is stopped here, whatever happens (and, should this process be killed,
by the kernel: see :mod:`bench.soak.processes`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

from bench.soak import checks, report
from bench.soak.driver import Driver, Pace
from bench.soak.faults import Injector, schedule
from bench.soak.ledger import Ledger, ModelCalls, now
from bench.soak.paths import Paths
from bench.soak.processes import DevServer, Fleet, spawn, stop, worker_command
from bench.soak.worker import connect
from temporal_agent_interrupts import AgentClient
from temporal_agent_interrupts.worker.devserver import port_open
from temporal_agent_interrupts.worker.result_keys import ENV_VAR as RESULT_KEYS_VAR
from temporal_agent_interrupts.worker.result_keys import generate_result_key

log = logging.getLogger("bench.soak")

RESULTS = Path(__file__).resolve().parent.parent / "results"


@dataclass(frozen=True)
class Settings:
    duration: float
    conversations: int
    workers: int
    seed: int
    think: float
    between: float
    model_fault_rate: float
    worker_kills_per_min: float
    worker_terms_per_min: float
    server_kills: int
    http_timeout: float
    hang_seconds: float
    drain: float
    agentctl_share: float


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 7233:
            return port


class Soak:
    def __init__(self, settings: Settings, *, out: Path, keep: bool) -> None:
        self.s = settings
        self.out = out
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="soak-"))
        self.queue = f"soak-{uuid.uuid4().hex[:8]}"
        self.server = DevServer(
            db_file=self.dir / "temporal.db", port=free_port(), log_file=self.dir / "server.log"
        )
        self.server_up = False
        self.web_port = free_port()
        self.web_proc: Any = None
        self.web_restarts = 0
        self.ledger = Ledger(self.dir / "ledger.sqlite")
        self.calls = ModelCalls(self.dir / "model-calls.sqlite")
        self.fleet: Fleet | None = None
        self.paths: Paths | None = None
        self.http: httpx2.AsyncClient | None = None
        self.tasks: list[asyncio.Task[Any]] = []

    async def run(self) -> int:
        s = self.s
        log.info(
            "soak in %s: server port %d, web port %d", self.dir, self.server.port, self.web_port
        )
        self.ledger.create()
        self.calls.create()
        await self.server.start()
        self.server_up = True
        client = await connect(self.server.address, runtime=_quiet_runtime())
        agents = AgentClient(client, task_queue=self.queue)
        await self._start_web()
        self.fleet = Fleet(
            size=s.workers,
            command=worker_command(
                address=self.server.address,
                task_queue=self.queue,
                ledger=self.ledger.path,
                model_calls=self.calls.path,
                seed=s.seed,
                model_fault_rate=s.model_fault_rate,
                hang_seconds=s.hang_seconds,
                http_timeout=s.http_timeout,
            ),
            logs=self.dir,
        )
        await self.fleet.start()
        self.http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(180.0, connect=10.0),
            limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50),
        )
        scratch = self.dir / "payloads"
        scratch.mkdir()
        self.paths = Paths(
            agents=agents,
            address=self.server.address,
            task_queue=self.queue,
            web=f"http://127.0.0.1:{self.web_port}",
            http=self.http,
            scratch=scratch,
        )
        stopping = asyncio.Event()
        driver = Driver(
            self.paths,
            seed=s.seed,
            pace=Pace(think=s.think, between=s.between, agentctl_share=s.agentctl_share),
            stopping=stopping,
        )
        started = now()
        faults = schedule(
            s.seed,
            duration=s.duration,
            worker_kills_per_min=s.worker_kills_per_min,
            worker_terms_per_min=s.worker_terms_per_min,
            server_kills=s.server_kills,
        )
        injector = Injector(
            faults,
            fleet=self.fleet,
            server=self.server,
            started=started,
            stopping=stopping,
            on_server=self._server_is,
        )
        samples: list[report.Sample] = []
        self.tasks.append(asyncio.create_task(self._sample(driver, samples)))
        self.tasks.append(asyncio.create_task(self._watch_web()))
        injecting = asyncio.create_task(injector.run())
        self.tasks.append(injecting)
        ramp = min(30.0, 0.1 * s.duration)
        slots = [
            asyncio.create_task(driver.slot(i, delay=ramp * i / s.conversations))
            for i in range(s.conversations)
        ]
        self.tasks += slots
        log.info(
            "soak: %d slots, %d workers, %.0fs, seed %d; %d process faults scheduled",
            s.conversations,
            s.workers,
            s.duration,
            s.seed,
            len(faults),
        )
        await asyncio.sleep(s.duration)
        log.info("soak: %.0fs up: no new turns; answering what is pending", s.duration)
        stopped = now()
        stopping.set()
        await injecting
        await self._whole_fleet()
        _, left = await asyncio.wait(slots, timeout=s.drain)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        ended = now()
        log.info("soak: the last turns took %.0fs", ended - stopped)
        if left:
            log.error("%d slots were still running %.0fs after the stop", len(left), s.drain)
        log.info("soak: checking %d conversations", len(driver.conversations))
        evidence = await checks.gather(self.paths, [c.chat_id for c in driver.conversations])
        log.info("soak: read the evidence in %.0fs; replaying every history", now() - ended)
        await checks.replay(evidence)
        mismatches = await self._cli_audit_sample(driver, evidence)
        log.info("soak: checks done %.0fs after the last turn", now() - ended)
        ledger = self.ledger.runs()
        model_faults = self.calls.faults()
        unexpected = [
            f"worker {e.number} (pid {e.pid}) exited by itself, code {e.code}"
            for e in self.fleet.exits
            if e.how == "unexpected"
        ]
        if self.web_restarts:
            unexpected.append(f"the web app exited by itself {self.web_restarts} times")
        verdict = checks.check(
            driver.conversations,
            evidence,
            ledger,
            unexpected_exits=unexpected,
            cli_audit_mismatches=mismatches,
        )
        settings = {**asdict(s), "ramp": ramp, "task_queue": self.queue, "machine": _machine()}
        summary = report.summarize(
            settings=settings,
            started=started,
            ended=ended,
            conversations=driver.conversations,
            samples=samples,
            injected=injector.injected,
            model_faults=model_faults,
            ledger=ledger,
            verdict=verdict,
            unexpected_web_exits=self.web_restarts,
        )
        summary["faults"]["scheduled"] = [asdict(f) for f in faults]
        summary["faults"]["worker_exits"] = [asdict(e) for e in self.fleet.exits]
        path = report.write(self.out, summary)
        report.plot(
            self.out,
            started=started,
            samples=samples,
            injected=injector.injected,
            model_faults=model_faults,
            attempts=[a for c in driver.conversations for a in c.attempts],
            title=(
                f"soak seed {s.seed}: {s.conversations} slots, {s.workers} workers, "
                f"{s.duration:.0f}s; violations: {summary['violations_total']}"
            ),
        )
        print(report.printed(summary), flush=True)
        print(f"wrote {path} and {self.out / 'soak.png'}", flush=True)
        if summary["violations_total"]:
            self.keep = True
            print(f"kept the run's files (logs, ledger, database) in {self.dir}", flush=True)
        return 1 if summary["violations_total"] else 0

    def _server_is(self, up: bool) -> None:
        self.server_up = up

    async def _sample(self, driver: Driver, samples: list[report.Sample]) -> None:
        before = _cpu_ticks()
        while True:
            await asyncio.sleep(1.0)
            ticks = _cpu_ticks()
            total = ticks[1] - before[1]
            busy = (ticks[0] - before[0]) / total if total else 0.0
            before = ticks
            alive = len(self.fleet.alive()) if self.fleet else 0
            samples.append(
                report.Sample(
                    at=now(),
                    in_flight=len(driver.active),
                    workers=alive,
                    server_up=self.server_up,
                    cpu_busy=round(busy, 3),
                )
            )

    async def _start_web(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "temporal_agent_interrupts.client.web",
            "--identity",
            "dev",
            "--port",
            str(self.web_port),
        ]
        self.web_proc = spawn(
            cmd,
            log_file=self.dir / "web.log",
            TEMPORAL_ADDRESS=self.server.address,
            AGENT_TASK_QUEUE=self.queue,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not port_open(self.web_port):
            if self.web_proc.poll() is not None or loop.time() > deadline:
                raise RuntimeError(f"the web app did not start (see {self.dir / 'web.log'})")
            await asyncio.sleep(0.1)

    async def _watch_web(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.web_proc is not None and self.web_proc.poll() is not None:
                log.error(
                    "the web app exited by itself (code %s): restarting", self.web_proc.returncode
                )
                self.web_restarts += 1
                await self._start_web()

    async def _whole_fleet(self) -> None:
        """Every worker up and polling before the last answers go out."""
        assert self.fleet is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while loop.time() < deadline:
            ready = [w for w in self.fleet.alive() if w.ready.is_set()]
            if len(ready) >= self.s.workers:
                return
            await asyncio.sleep(0.2)
        log.error("the fleet is not whole 60s after the stop")

    async def _cli_audit_sample(
        self, driver: Driver, evidence: dict[str, checks.ChatEvidence]
    ) -> list[str]:
        """``agentctl audit --json`` for a few conversations: it must say what the API says."""
        assert self.paths is not None
        import json

        mismatches: list[str] = []
        chosen = [c.chat_id for c in driver.conversations if c.attempts][
            :: max(1, len(driver.conversations) // 5)
        ][:5]
        for chat_id in chosen:
            code, out = await self.paths._run(  # the harness's own helper
                [str(Path(sys.executable).parent / "agentctl"), "audit", chat_id, "--json"],
                slots=self.paths.agentctl_slots,
            )
            if code != 0:
                mismatches.append(f"agentctl audit {chat_id}: exit {code}: {out[-200:]}")
                continue
            cli = [(r["ref"], r["kind"], r.get("identity")) for r in json.loads(out)["answers"]]
            api = [(r.ref, r.kind, r.identity) for r in evidence[chat_id].records]
            if cli != api:
                mismatches.append(
                    f"agentctl audit {chat_id}: {len(cli)} records, the API {len(api)}"
                )
        return mismatches

    async def cleanup(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.paths is not None:
            self.paths.kill_children()
        if self.http is not None:
            await self.http.aclose()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.web_proc is not None:
            await stop(self.web_proc, grace=10, name="web app")
        await self.server.stop()
        if self.keep:
            log.info("the run's files are in %s", self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _cpu_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


def _quiet_runtime() -> Runtime:
    """The harness's own client: the SDK's retries while the server is down are expected, and
    would fill the terminal (the workers' and the web app's logs keep theirs)."""
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet)))


def _machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "temporalio": version("temporalio"),
        "platform": platform.platform(),
    }


async def main_async(settings: Settings, *, out: Path, keep: bool) -> int:
    soak = Soak(settings, out=out, keep=keep)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        return await soak.run()
    except asyncio.CancelledError:
        if not interrupted:
            raise
        print("soak: interrupted; stopping everything it started", file=sys.stderr, flush=True)
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(soak.cleanup())


def parse_args(argv: list[str] | None = None) -> tuple[Settings, Path, bool]:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of turns (default 600)")
    p.add_argument(
        "--conversations", type=int, default=200, help="conversations in flight (default 200)"
    )
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--seed", type=int, default=2026, help="the fault schedule's and plans' seed")
    p.add_argument("--out", default=str(RESULTS), help="where soak.json and soak.png go")
    p.add_argument(
        "--think",
        type=float,
        default=None,
        help="mean seconds before an answer (default: 35, or 1.5 for runs under 5 minutes)",
    )
    p.add_argument(
        "--between",
        type=float,
        default=None,
        help="mean seconds between turns (default: 17, or 1 under 5 minutes)",
    )
    p.add_argument(
        "--model-fault-rate",
        type=float,
        default=0.04,
        help="share of model calls whose first attempt fails or hangs",
    )
    p.add_argument("--worker-kills-per-min", type=float, default=1.0)
    p.add_argument("--worker-terms-per-min", type=float, default=0.8)
    p.add_argument(
        "--server-kills", type=int, default=None, help="default: one per 5 minutes, at least one"
    )
    p.add_argument(
        "--http-timeout", type=float, default=3.0, help="the google-genai client's timeout, seconds"
    )
    p.add_argument(
        "--drain", type=float, default=300.0, help="seconds the last turns may take after the stop"
    )
    p.add_argument(
        "--agentctl-share",
        type=float,
        default=None,
        help="share of answers sent with agentctl, a process each and the costliest path "
        "(default: 0.02, or 0.08 under 5 minutes, so that a short run has a few)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the run's directory (logs, ledger, database)"
    )
    args = p.parse_args(argv)
    short = args.duration < 300
    settings = Settings(
        duration=args.duration,
        conversations=args.conversations,
        workers=args.workers,
        seed=args.seed,
        think=args.think if args.think is not None else (1.5 if short else 35.0),
        between=args.between if args.between is not None else (1.0 if short else 17.0),
        model_fault_rate=args.model_fault_rate,
        worker_kills_per_min=args.worker_kills_per_min,
        worker_terms_per_min=args.worker_terms_per_min,
        server_kills=args.server_kills
        if args.server_kills is not None
        else max(1, int(args.duration // 300)),
        http_timeout=args.http_timeout,
        hang_seconds=args.http_timeout + 3.0,
        drain=args.drain,
        agentctl_share=(
            args.agentctl_share if args.agentctl_share is not None else (0.08 if short else 0.02)
        ),
    )
    return settings, Path(args.out), args.keep


def main(argv: list[str] | None = None) -> None:
    settings, out, keep = parse_args(argv)
    # Workers seal activity results (workflows.seal): a key for this run, unless one is set;
    # the processes this starts inherit it.
    os.environ.setdefault(RESULT_KEYS_VAR, generate_result_key("bench"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "temporalio", "bench.soak.paths"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    code = asyncio.run(main_async(settings, out=out, keep=keep))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where the SDK can abort (sdk-python issue 300).
    os._exit(code)


if __name__ == "__main__":
    main()

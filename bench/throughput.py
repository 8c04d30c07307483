"""B7 throughput: approval cycles many at a time, ours against the floor, and the server's work.

``python -m bench --only b7``. A round keeps ``in_flight`` cycles running at once (start → pause
at the approval → approve → finish, the cycle B1 times one at a time) until ``per_round`` have
finished; rounds of each variant alternate, rotating who goes first, on the one dev server
``python -m bench`` starts. Per variant:

- cycles per second (all measured cycles over the time their rounds took);
- the dev server's CPU per cycle: ``utime + stime`` of its process and any children, from
  ``/proc``, over each round until the server has gone quiet after it, divided by the round's
  cycles;
- this process's CPU per cycle (workers, driver and the scripted model run here together);
- after the timed part of each round, every finished workflow's history, counted by event type;
- the client calls per cycle, by kind, as the SDK's client interceptor sees them: the driver's
  (starts, updates, signals, queries) and the ones activities make through the worker's client.

The variants are B1's: *ours* and *floor* make the same google-genai call to the same loopback
model; *ours_inprocess* reaches the scripted model through an in-process transport, and *bare*
answers from memory (the floor's engine work alone), as the side-by-side runs with the agent
frameworks do. *floor_view* is bare plus the operator view's five writes (``bench/floor_view.py``):
against bare, what those writes cost alone; with ``--thru-split``, *floor_sa* writes only the
three search-attribute upserts and *floor_memo* only the two memo writes. Ratios are ours /
floor, ours_inprocess / bare and floor_view (floor_sa, floor_memo) / bare, measured in the same
run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    WithStartWorkflowOperation,
    WorkflowHandle,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from bench.floor_view import AGENT_NAME, AGENT_STATUS, FloorViewInput, FloorViewWorkflow
from bench.floor_workflow import FloorInput, FloorWorkflow
from temporal_agent_interrupts import AgentClient, FinishReason

# The variants, in the order the table shows them, and the pairs the ratios compare.
VARIANTS = ("ours", "floor", "ours_inprocess", "bare", "floor_view", "floor_sa", "floor_memo")
PAIRS = (
    ("ours", "floor"),
    ("ours_inprocess", "bare"),
    ("floor_view", "bare"),
    ("floor_sa", "bare"),
    ("floor_memo", "bare"),
)

# The event types a cycle is read by, in this order; any other type seen follows them.
EVENT_ORDER = (
    "WORKFLOW_EXECUTION_STARTED",
    "WORKFLOW_TASK_SCHEDULED",
    "WORKFLOW_TASK_STARTED",
    "WORKFLOW_TASK_COMPLETED",
    "ACTIVITY_TASK_SCHEDULED",
    "ACTIVITY_TASK_STARTED",
    "ACTIVITY_TASK_COMPLETED",
    "WORKFLOW_EXECUTION_SIGNALED",
    "WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
    "WORKFLOW_EXECUTION_UPDATE_COMPLETED",
    "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
    "WORKFLOW_PROPERTIES_MODIFIED",
    "MARKER_RECORDED",
    "TIMER_STARTED",
    "TIMER_FIRED",
    "WORKFLOW_EXECUTION_COMPLETED",
)


# ----------------------------------------------------------------------------------------------
# What the server spends, and what the clients ask of it


def _stat_cpu(pid: int) -> float:
    """``utime + stime`` of one process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """``pid``'s child processes, and theirs (from every thread's ``children`` list)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.append(kid)
                    todo.append(kid)
    return found


def server_cpu(pid: int) -> tuple[float, int]:
    """The CPU seconds of the server process ``pid`` and of any processes it started, and how
    many processes that is. (The ``temporal`` CLI's dev server is one process today.)"""
    pids = [pid, *_descendants(pid)]
    return sum(_stat_cpu(p) for p in pids), len(pids)


async def settled_server_cpu(pid: int, *, interval: float = 0.1, limit: float = 3.0) -> float:
    """The server's CPU seconds once it has gone quiet: read every ``interval`` until one
    interval adds at most a clock tick (at most ``limit`` seconds). A round's last cycles leave
    work the server finishes after their replies (visibility and transfer tasks); read at once,
    it would fall into the next variant's round."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before = server_cpu(pid)[0]
    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        await asyncio.sleep(interval)
        now = server_cpu(pid)[0]
        if now - before <= tick:
            return now
        before = now
    return before


class CallCounter(Interceptor):
    """A client interceptor counting the calls a client makes, by kind: what the SDK's client
    interceptor sees (one update call may be more than one RPC if its result is polled)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Counting(next, self.counts)


class _Counting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, counts: Counter[str]) -> None:
        super().__init__(next)
        self._counts = counts

    async def start_workflow(self, input: Any) -> WorkflowHandle[Any, Any]:
        self._counts["start_workflow"] += 1
        return await super().start_workflow(input)

    async def start_update_with_start_workflow(self, input: Any) -> Any:
        self._counts["update_with_start"] += 1
        return await super().start_update_with_start_workflow(input)

    async def start_workflow_update(self, input: Any) -> Any:
        self._counts["update"] += 1
        return await super().start_workflow_update(input)

    async def signal_workflow(self, input: Any) -> None:
        self._counts["signal"] += 1
        await super().signal_workflow(input)

    async def query_workflow(self, input: Any) -> Any:
        self._counts["query"] += 1
        return await super().query_workflow(input)

    async def describe_workflow(self, input: Any) -> Any:
        self._counts["describe"] += 1
        return await super().describe_workflow(input)

    def fetch_workflow_history_events(self, input: Any) -> Any:
        self._counts["fetch_history"] += 1
        return super().fetch_workflow_history_events(input)

    def list_workflows(self, input: Any) -> Any:
        self._counts["list_workflows"] += 1
        return super().list_workflows(input)

    async def count_workflows(self, input: Any) -> Any:
        self._counts["count_workflows"] += 1
        return await super().count_workflows(input)


class RpcMeter:
    """Every RPC made through a runtime, by operation: the SDK core's own request counters
    (``temporal_request``, ``temporal_long_request``) read from a metric buffer. Clients
    connected with :attr:`runtime`, and workers on them, are counted: the driver's calls, the
    workers' polls, task completions and activity heartbeats alike."""

    def __init__(self) -> None:
        self.buffer = MetricBuffer(1_000_000)
        self.runtime = Runtime(telemetry=TelemetryConfig(metrics=self.buffer))
        self.counts: Counter[str] = Counter()

    def read(self) -> Counter[str]:
        for update in self.buffer.retrieve_updates():
            if update.metric.name in ("temporal_request", "temporal_long_request"):
                self.counts[str(update.attributes.get("operation"))] += int(update.value)
        return self.counts.copy()


def counting_client(client: Client, counter: CallCounter) -> Client:
    """``client``'s connection and converter, with ``counter`` as its only interceptor."""
    return Client(**{**client.config(), "interceptors": [counter]})


def event_name(event_type: int) -> str:
    return EventType.Name(EventType.ValueType(event_type)).removeprefix("EVENT_TYPE_")


async def history_counts(client: Client, workflow_id: str) -> tuple[Counter[str], Counter[str]]:
    """The events of ``workflow_id``'s history (its latest run) by type, and their encoded
    bytes by type."""
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for e in hist.events:
        name = event_name(e.event_type)
        counts[name] += 1
        sizes[name] += e.ByteSize()
    return counts, sizes


# ----------------------------------------------------------------------------------------------
# One cycle of each variant; each returns the workflow id it ran


Cycle = Callable[[str], Awaitable[str]]


def ours_cycle(agents: AgentClient) -> Cycle:
    async def cycle(tag: str) -> str:
        chat = await agents.chat("benchAgent", chat_id=tag)
        res = await chat.send(f"go {tag}")
        assert res.finish_reason == FinishReason.INTERRUPTED, res
        res = await chat.resume(
            restart=[i.restart({"tool_approved": True}) for i in res.interrupts]
        )
        assert res.finish_reason == FinishReason.STOP and res.text == "done", res
        return chat.id

    return cycle


def floor_cycle(
    client: Client,
    task_queue: str,
    *,
    bare: bool,
    view: bool = False,
    search_attributes: bool = True,
    memo: bool = True,
) -> Cycle:
    """The floor's cycle; ``view``: ``FloorViewWorkflow``'s, the floor with the operator
    view's writes (started with the search attributes ours starts with), the search attributes'
    and the memo's unless turned off."""

    async def cycle(tag: str) -> str:
        model_activity = "floor_model_bare" if bare else "floor_model"
        inp = FloorInput(prompt=f"go {tag}", model_activity=model_activity)
        if view:
            start = WithStartWorkflowOperation(
                FloorViewWorkflow.run,
                FloorViewInput(
                    prompt=inp.prompt,
                    model_activity=model_activity,
                    search_attributes=search_attributes,
                    memo=memo,
                ),
                id=tag,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(AGENT_NAME, "benchAgent"),
                        SearchAttributePair(AGENT_STATUS, "running"),
                    ]
                ),
            )
            await client.execute_update_with_start_workflow(
                FloorViewWorkflow.start, start_workflow_operation=start
            )
            handle = await start.workflow_handle()
            answer = await handle.execute_update(FloorViewWorkflow.approve)
        else:
            start = WithStartWorkflowOperation(
                FloorWorkflow.run,
                inp,
                id=tag,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
            await client.execute_update_with_start_workflow(
                FloorWorkflow.start, start_workflow_operation=start
            )
            handle = await start.workflow_handle()
            answer = await handle.execute_update(FloorWorkflow.approve)
        assert answer == "done", answer
        return tag

    return cycle


# ----------------------------------------------------------------------------------------------
# Rounds


@dataclass
class Tally:
    """What one variant's measured rounds added up to."""

    cycles: int = 0
    seconds: float = 0.0
    server_cpu: float = 0.0
    process_cpu: float = 0.0
    round_rates: list[float] = field(default_factory=list)
    round_server_cpu: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    event_bytes: Counter[str] = field(default_factory=Counter)
    histories: int = 0
    driver_calls: Counter[str] = field(default_factory=Counter)
    rpcs: Counter[str] = field(default_factory=Counter)
    worker_calls: Counter[str] = field(default_factory=Counter)

    def report(self) -> dict[str, Any]:
        per = max(self.cycles, 1)
        per_history = max(self.histories, 1)
        events = {k: self.events[k] / per_history for k in _ordered(self.events)}
        sizes = {k: self.event_bytes[k] / per_history for k in _ordered(self.event_bytes)}
        return {
            "cycles": self.cycles,
            "seconds": round(self.seconds, 3),
            "cycles_per_s": self.cycles / self.seconds if self.seconds else None,
            "cycles_per_s_by_round": [round(r, 2) for r in self.round_rates],
            "cycle_latency_median_ms": (
                statistics.median(self.latencies) * 1000 if self.latencies else None
            ),
            "server_cpu_ms_per_cycle": self.server_cpu * 1000 / per,
            "server_cpu_ms_per_cycle_by_round": [round(c, 1) for c in self.round_server_cpu],
            "process_cpu_ms_per_cycle": self.process_cpu * 1000 / per,
            "events_per_cycle": events,
            "history_events_per_cycle": sum(events.values()),
            "event_bytes_per_cycle": sizes,
            "history_bytes_per_cycle": sum(sizes.values()),
            "histories_read": self.histories,
            "driver_calls_per_cycle": {k: v / per for k, v in sorted(self.driver_calls.items())},
            "worker_client_calls_per_cycle": {
                k: v / per for k, v in sorted(self.worker_calls.items())
            },
            "rpcs_per_cycle": {k: v / per for k, v in sorted(self.rpcs.items())},
        }


def _ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; ``None`` where ``b`` is zero (a tiny round can read no server CPU tick)."""
    return a / b if a is not None and b else None


def _ordered(types: Mapping[str, object]) -> list[str]:
    known = [t for t in EVENT_ORDER if t in types]
    return known + sorted(t for t in types if t not in EVENT_ORDER)


async def _round(cycle: Cycle, tags: list[str], in_flight: int) -> tuple[list[str], list[float]]:
    """Runs a cycle for every tag, ``in_flight`` at a time; the workflow ids and latencies."""
    queue = iter(tags)
    ids: list[str] = []
    latencies: list[float] = []

    async def lane() -> None:
        for tag in queue:
            t0 = time.perf_counter()
            ids.append(await cycle(tag))
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(lane() for _ in range(min(in_flight, len(tags)))))
    return ids, latencies


async def _histories(
    client: Client, ids: list[str], in_flight: int
) -> AsyncIterator[tuple[Counter[str], Counter[str]]]:
    sem = asyncio.Semaphore(in_flight)

    async def one(workflow_id: str) -> tuple[Counter[str], Counter[str]]:
        async with sem:
            return await history_counts(client, workflow_id)

    for counts in await asyncio.gather(*(one(i) for i in ids)):
        yield counts


async def b7(
    *,
    cycles: Mapping[str, Cycle],
    reader: Client,
    server_pid: int,
    driver_calls: CallCounter,
    worker_calls: CallCounter,
    rpcs: RpcMeter | None = None,
    in_flight: int,
    per_round: int,
    rounds: int,
    warmup: int,
) -> dict[str, Any]:
    """Runs ``warmup`` unmeasured rounds and then ``rounds`` measured rounds of each variant in
    ``cycles``, interleaved; ``reader`` fetches the histories (outside the timed part)."""
    run = uuid.uuid4().hex[:6]
    names = [n for n in VARIANTS if n in cycles]
    tallies = {n: Tally() for n in names}
    _, processes = server_cpu(server_pid)
    for r in range(warmup + rounds):
        measured = r >= warmup
        for name in names[r % len(names) :] + names[: r % len(names)]:
            tags = [f"b7-{name}-{run}-{r}-{i}" for i in range(per_round)]
            calls0 = (driver_calls.counts.copy(), worker_calls.counts.copy())
            rpcs0 = rpcs.read() if rpcs else Counter()
            srv0, cpu0 = await settled_server_cpu(server_pid), time.process_time()
            t0 = time.perf_counter()
            ids, latencies = await _round(cycles[name], tags, in_flight)
            seconds = time.perf_counter() - t0
            srv1, cpu1 = await settled_server_cpu(server_pid), time.process_time()
            rpcs1 = rpcs.read() if rpcs else Counter()
            if not measured:
                continue
            tally = tallies[name]
            tally.cycles += len(ids)
            tally.seconds += seconds
            tally.round_rates.append(len(ids) / seconds)
            tally.latencies += latencies
            tally.server_cpu += srv1 - srv0
            tally.round_server_cpu.append((srv1 - srv0) * 1000 / len(ids))
            tally.process_cpu += cpu1 - cpu0
            tally.driver_calls.update(driver_calls.counts - calls0[0])
            tally.worker_calls.update(worker_calls.counts - calls0[1])
            tally.rpcs.update(rpcs1 - rpcs0)
            async for counts, sizes in _histories(reader, ids, in_flight):
                tally.events.update(counts)
                tally.event_bytes.update(sizes)
                tally.histories += 1
    reports = {n: t.report() for n, t in tallies.items()}
    ratios: dict[str, Any] = {}
    for ours, floor in PAIRS:
        if ours not in reports or floor not in reports:
            continue
        o, f = reports[ours], reports[floor]
        a, b = tallies[ours], tallies[floor]
        by_round = [x / y for x, y in zip(a.round_rates, b.round_rates, strict=True)]
        cpu_by_round = [
            x / y for x, y in zip(a.round_server_cpu, b.round_server_cpu, strict=True) if y
        ]
        ratios[f"{ours}/{floor}"] = {
            key: _ratio(o[key], f[key])
            for key in (
                "cycles_per_s",
                "server_cpu_ms_per_cycle",
                "process_cpu_ms_per_cycle",
                "history_events_per_cycle",
                "history_bytes_per_cycle",
            )
        }
        ratios[f"{ours}/{floor}"]["cycles_per_s_median_of_rounds"] = statistics.median(by_round)
        ratios[f"{ours}/{floor}"]["server_cpu_ms_per_cycle_median_of_rounds"] = (
            statistics.median(cpu_by_round) if cpu_by_round else None
        )
    return {
        "in_flight": in_flight,
        "cycles_per_round": per_round,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "server_processes": processes,
        "clock_tick_ms": 1000 / os.sysconf("SC_CLK_TCK"),
        "variants": reports,
        "ratios": ratios,
        "targets": {"throughput_at_least": 0.95, "server_cpu_per_cycle_at_most": 1.10},
    }


# ----------------------------------------------------------------------------------------------
# The report


def _num(value: float) -> str:
    """A count per cycle: whole as it is, else to two places (one figure when under 0.1, so
    an event a few cycles had does not read as none)."""
    if value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value >= 0.1 else f"{value:.1g}"


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


def markdown(b: Mapping[str, Any]) -> list[str]:
    v = b["variants"]
    names = [n for n in VARIANTS if n in v]
    head = "| | " + " | ".join(names) + " |"
    rule = "|---|" + "---|" * len(names)
    lines = [
        f"## B7 throughput ({b['in_flight']} cycles in flight; {b['rounds']} rounds of "
        f"{b['cycles_per_round']} cycles each, interleaved, after {b['warmup_rounds']} warm-up)",
        "",
        head,
        rule,
        "| cycles/s | " + " | ".join(f"{v[n]['cycles_per_s']:.2f}" for n in names) + " |",
        "| cycle latency (median) | "
        + " | ".join(f"{v[n]['cycle_latency_median_ms']:.0f} ms" for n in names)
        + " |",
        "| server CPU/cycle | "
        + " | ".join(f"{v[n]['server_cpu_ms_per_cycle']:.1f} ms" for n in names)
        + " |",
        "| process CPU/cycle (workers, driver, model) | "
        + " | ".join(f"{v[n]['process_cpu_ms_per_cycle']:.1f} ms" for n in names)
        + " |",
        "",
    ]
    for pair, r in b["ratios"].items():
        lines.append(
            f"- {pair}: throughput **{_x(r['cycles_per_s'])}** (median of rounds "
            f"{_x(r['cycles_per_s_median_of_rounds'])}; target ≥ "
            f"{b['targets']['throughput_at_least']}), server CPU per cycle "
            f"**{_x(r['server_cpu_ms_per_cycle'])}** (median of rounds "
            f"{_x(r['server_cpu_ms_per_cycle_median_of_rounds'])}; target ≤ "
            f"{b['targets']['server_cpu_per_cycle_at_most']}), process CPU per cycle "
            f"{_x(r['process_cpu_ms_per_cycle'])}, history events "
            f"{_x(r['history_events_per_cycle'])}, history bytes "
            f"{_x(r['history_bytes_per_cycle'])}"
        )
    types = _ordered({t: 1 for n in names for t in v[n]["events_per_cycle"]})
    lines += [
        "",
        "Per cycle, from each finished workflow's history (events by type, and their encoded "
        "size), from the clients' interceptors (calls by kind; *worker* calls are those "
        "activities make) and from the SDK core's request counters (every RPC of the driver and "
        "the workers, by operation; long polls count when they return):",
        "",
        head,
        rule,
    ]
    for t in types:
        cells = [
            f"{_num(v[n]['events_per_cycle'][t])} "
            f"({v[n]['event_bytes_per_cycle'][t] / 1024:.1f} KiB)"
            if v[n]["events_per_cycle"].get(t)
            else "0"
            for n in names
        ]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append(
        "| **all events** | "
        + " | ".join(
            f"**{_num(v[n]['history_events_per_cycle'])}** "
            f"({v[n]['history_bytes_per_cycle'] / 1024:.1f} KiB)"
            for n in names
        )
        + " |"
    )
    for key, label in (("driver_calls_per_cycle", "driver call"),
                       ("worker_client_calls_per_cycle", "worker call"),
                       ("rpcs_per_cycle", "RPC")):  # fmt: skip
        kinds = sorted({k for n in names for k in v[n][key]})
        for k in kinds:
            cells = [_num(v[n][key].get(k, 0)) for n in names]
            lines.append(f"| {label}: {k} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Server CPU is the dev server's `utime + stime` ({b['server_processes']} process(es)) "
        "over each round until it has gone quiet after it, in clock ticks of "
        f"{b['clock_tick_ms']:.0f} ms; process CPU is this process's, where the workers, the "
        "driver and the scripted model run together. On a machine shared with other work, both "
        "rates and CPU move with the load; the ratios are of rounds interleaved in one run.",
        "",
    ]
    return lines

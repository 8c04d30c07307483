"""The soak's figures: ``soak.json``, ``soak.png`` and what is printed."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.soak.checks import Verdict
from bench.soak.driver import REFUSED_KINDS, Attempt, Conversation
from bench.soak.faults import Injected
from bench.soak.ledger import ModelFault, Run

ANSWER_KINDS = ("answer", "duplicate", "retry", "late", "final")


@dataclass(frozen=True)
class Sample:
    at: float
    in_flight: int
    workers: int
    server_up: bool
    cpu_busy: float = 0.0
    """The machine's CPU busy, 0 to 1 of all its cores, over the second before (everything
    on it: this soak and whatever else runs there)."""


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latencies(attempts: Sequence[Attempt]) -> list[tuple[float, float, str]]:
    """(when it came back, seconds it took, path) of every answer accepted with a result: from
    sending it to the turn's next stop (the tool run and the model's reply included)."""
    return [
        (a.done_at, a.done_at - a.sent_at, a.path)
        for a in attempts
        if a.kind in ANSWER_KINDS and a.status == "accepted" and a.result is not None
    ]


def summarize(
    *,
    settings: dict[str, Any],
    started: float,
    ended: float,
    conversations: Sequence[Conversation],
    samples: Sequence[Sample],
    injected: Sequence[Injected],
    model_faults: Sequence[ModelFault],
    ledger: Sequence[Run],
    verdict: Verdict,
    unexpected_web_exits: int,
) -> dict[str, Any]:
    attempts = [a for c in conversations for a in c.attempts]
    turns = [t for c in conversations for t in c.turns]
    by_path: dict[str, Counter[str]] = {}
    for a in attempts:
        if a.kind in ANSWER_KINDS or a.kind in REFUSED_KINDS or a.kind == "cancel":
            by_path.setdefault(a.path, Counter())["sent"] += 1
            by_path[a.path][a.status] += 1
    for path, n in verdict.figures.items():
        if path.startswith("applied_by_"):
            by_path.setdefault(path.removeprefix("applied_by_"), Counter())["applied"] = n
    refusals = [a for a in attempts if a.kind in REFUSED_KINDS]
    lost_races = [a for a in attempts if a.kind in ANSWER_KINDS and a.status in ("refused",)]
    lat = latencies(attempts)
    lat_ms = [s * 1000 for _, s, _ in lat]
    lat_by_path: dict[str, dict[str, Any]] = {}
    for path in sorted({p for _, _, p in lat}):
        values = [s * 1000 for _, s, p in lat if p == path]
        lat_by_path[path] = {
            "p50": _ms(pct(values, 0.5)),
            "p99": _ms(pct(values, 0.99)),
            "n": len(values),
        }
    faults: Counter[str] = Counter(f.kind for f in injected)
    faults.update(f"model_{f.kind}" for f in model_faults)
    effects = [r for r in ledger if r.phase == "effect"]
    total = sum(verdict.violations.values())
    in_flight = [s.in_flight for s in samples]
    return {
        "seed": settings["seed"],
        "settings": settings,
        "wall_seconds": round(ended - started, 1),
        "conversations": {
            "started": len(conversations),
            "finished": sum(1 for c in conversations if c.finished and c.closed),
            "in_flight_max": max(in_flight, default=0),
            "in_flight_mean": round(statistics.fmean(in_flight), 1) if in_flight else 0,
            "in_flight_min_after_ramp": min(
                (
                    s.in_flight
                    for s in samples
                    if started + settings["ramp"] + 2 < s.at < started + settings["duration"]
                ),
                default=0,
            ),
        },
        "machine_cpu_busy": _cpu(samples, started=started, ended=ended),
        "turns": {
            "total": len(turns),
            "per_second": round(len(turns) / settings["duration"], 2),
            "by_plan": dict(sorted(Counter(t.plan for t in turns).items())),
            "by_finish": dict(sorted(Counter(t.finish or "unfinished" for t in turns).items())),
            "sent_by": dict(sorted(Counter(t.via for t in turns).items())),
        },
        "pauses": sum(len(c.seen) for c in conversations),
        "answers": {
            "by_path": {p: dict(sorted(c.items())) for p, c in sorted(by_path.items())},
            "by_kind": dict(sorted(Counter(a.kind for a in attempts).items())),
            "by_action": dict(
                sorted(Counter(a.action for a in attempts if a.kind in ANSWER_KINDS).items())
            ),
            "lost_a_race_and_refused": len(lost_races),
        },
        "refusals": {
            "total": len(refusals),
            "by_kind": dict(sorted(Counter(a.kind for a in refusals).items())),
            "by_path": dict(sorted(Counter(a.path for a in refusals).items())),
            "hostile_payloads": dict(
                sorted(Counter(a.action for a in refusals if a.kind == "hostile").items())
            ),
        },
        "faults": {
            **dict(sorted(faults.items())),
            "unexpected_web_exits": unexpected_web_exits,
            "log": [
                {"at": round(f.at - started, 2), "kind": f.kind, "detail": f.detail}
                for f in injected
            ],
        },
        "tool_runs": {
            "paid": len(effects),
            "by_tool": dict(sorted(Counter(r.tool for r in effects).items())),
            "conditional_pauses": sum(1 for r in ledger if r.phase == "interrupt"),
            "approvals": verdict.figures.get("approvals", 0),
            "model_told_may_have_taken_effect": verdict.figures.get(
                "model_told_may_have_taken_effect", 0
            ),
            "approved_then_cancelled_before_running": verdict.figures.get(
                "approved_then_cancelled_before_running", 0
            ),
        },
        "deadlines_expired": verdict.figures.get("audit_deadline", 0),
        "edits": verdict.figures.get("audit_edit", 0),
        "cancels": verdict.figures.get("audit_cancel", 0),
        "approval_latency_ms": {
            "p50": _ms(pct(lat_ms, 0.5)),
            "p99": _ms(pct(lat_ms, 0.99)),
            "n": len(lat_ms),
            "by_path": lat_by_path,
            "what": "from sending an accepted answer to the turn's next stop (the tool run "
            "and the model's reply included), for the paths that return the turn",
        },
        "violations": verdict.violations,
        "violations_total": total,
        "violation_examples": verdict.examples,
        "figures": verdict.figures,
    }


def _cpu(samples: Sequence[Sample], *, started: float, ended: float) -> dict[str, Any]:
    """The machine's CPU busy while turns ran (all of it, shared with whatever else runs)."""
    busy = [s.cpu_busy for s in samples if started <= s.at <= ended]
    return {
        "mean": round(statistics.fmean(busy), 2) if busy else None,
        "p90": round(pct(busy, 0.9) or 0, 2) if busy else None,
        "cores": os.cpu_count(),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def write(out: Path, summary: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "soak.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def plot(
    out: Path,
    *,
    started: float,
    samples: Sequence[Sample],
    injected: Sequence[Injected],
    model_faults: Sequence[ModelFault],
    attempts: Sequence[Attempt],
    title: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(
        3, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1.4, 3]}
    )
    t = [s.at - started for s in samples]
    ax1.plot(t, [s.in_flight for s in samples], color="tab:blue", label="conversations in flight")
    ax1.set_ylabel("in flight")
    twin = ax1.twinx()
    twin.step(
        t,
        [s.workers for s in samples],
        where="post",
        color="tab:gray",
        alpha=0.6,
        label="workers up",
    )
    twin.plot(
        t,
        [s.cpu_busy * 3 for s in samples],
        color="tab:olive",
        alpha=0.5,
        linewidth=0.8,
        label="machine CPU busy (0-3 = 0-100%)",
    )
    twin.set_ylabel("workers up")
    twin.set_ylim(0, max((s.workers for s in samples), default=3) + 1)
    down = [s.at - started for s in samples if not s.server_up]
    if down:
        ax1.scatter(down, [0] * len(down), marker="|", color="tab:red", label="server down")
    lines = ax1.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax1.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=7)

    rows = {"server_sigkill": 3, "worker_sigkill": 2, "worker_sigterm": 1}
    colors = {
        "server_sigkill": "tab:red",
        "worker_sigkill": "tab:orange",
        "worker_sigterm": "tab:green",
    }
    for f in injected:
        x = f.at - started
        ax2.scatter([x], [rows.get(f.kind, 0)], marker="v", color=colors.get(f.kind, "k"), s=40)
        for ax in (ax1, ax3):
            ax.axvline(x, color=colors.get(f.kind, "k"), alpha=0.25, linewidth=1)
    model_rows = {"http429": -1, "http503": -2, "hang": -3}
    for kind, row in model_rows.items():
        xs = [f.at - started for f in model_faults if f.kind == kind]
        ax2.scatter(xs, [row] * len(xs), marker="|", color="tab:purple", s=30)
    ax2.set_yticks(
        [3, 2, 1, -1, -2, -3],
        [
            "server SIGKILL",
            "worker SIGKILL",
            "worker SIGTERM",
            "model 429",
            "model 503",
            "model hang",
        ],
        fontsize=7,
    )
    ax2.set_ylim(-3.8, 3.8)
    ax2.set_ylabel("faults")

    lat = latencies(attempts)
    if lat:
        span = max(t) if t else max(x - started for x, _, _ in lat)
        window = max(5.0, span / 40)
        xs, p50, p99 = [], [], []
        edge = 0.0
        while edge < span + window:
            values = [s * 1000 for x, s, _ in lat if edge <= x - started < edge + window]
            if values:
                xs.append(edge + window / 2)
                p50.append(pct(values, 0.5))
                p99.append(pct(values, 0.99))
            edge += window
        ax3.plot(xs, p50, marker=".", label="p50")
        ax3.plot(xs, p99, marker=".", label="p99")
        ax3.set_yscale("log")
        ax3.legend(loc="upper left", fontsize=8)
    ax3.set_ylabel("approval latency (ms)")
    ax3.set_xlabel("seconds since start")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def printed(summary: dict[str, Any]) -> str:
    """The figures, as the run prints them."""
    c, t, a, f, r = (
        summary["conversations"],
        summary["turns"],
        summary["answers"],
        summary["faults"],
        summary["tool_runs"],
    )
    lat = summary["approval_latency_ms"]
    lines = [
        f"soak seed {summary['seed']}: {summary['wall_seconds']:.0f}s, "
        f"{summary['settings']['workers']} workers, {summary['settings']['conversations']} slots",
        f"  conversations: {c['started']} started, {c['finished']} finished; in flight max "
        f"{c['in_flight_max']}, mean {c['in_flight_mean']}, at least "
        f"{c['in_flight_min_after_ramp']} after the ramp",
        f"  turns: {t['total']} ({t['per_second']}/s) {t['by_finish']}; pauses {summary['pauses']}",
        "  answers by path: "
        + ", ".join(
            f"{p} {v.get('sent', 0)} sent/{v.get('applied', 0)} applied"
            for p, v in a["by_path"].items()
        ),
        f"  refusals: {summary['refusals']['total']} {summary['refusals']['by_kind']}",
        "  faults: " + ", ".join(f"{k} {v}" for k, v in f.items() if isinstance(v, int)),
        f"  tool runs: {r['paid']} paid {r['by_tool']}, {r['approvals']} approvals, "
        f"{r['model_told_may_have_taken_effect']} told 'may have taken effect'",
        f"  deadlines expired {summary['deadlines_expired']}, edits {summary['edits']}, "
        f"cancels {summary['cancels']}",
        f"  approval latency: p50 {lat['p50']} ms, p99 {lat['p99']} ms (n={lat['n']})",
        f"  machine CPU busy while turns ran: mean {summary['machine_cpu_busy']['mean']}, "
        f"p90 {summary['machine_cpu_busy']['p90']} of {summary['machine_cpu_busy']['cores']} cores",
        "  violations: "
        + ", ".join(f"{k} {v}" for k, v in summary["violations"].items())
        + f"  (total {summary['violations_total']})",
    ]
    for name, examples in summary["violation_examples"].items():
        lines.append(f"    {name}:")
        lines += [f"      {e}" for e in examples]
    return "\n".join(lines)


def readme_figures(summary: dict[str, Any]) -> str:
    """The README's lines on the last full run, made from its ``soak.json`` (the suite checks
    the README has them as made: ``python -m bench.soak.report`` prints them)."""
    c, t, a, f, r = (
        summary["conversations"],
        summary["turns"],
        summary["answers"]["by_path"],
        summary["faults"],
        summary["tool_runs"],
    )
    applied = sum(v.get("applied", 0) for v in a.values())
    paths = ", ".join(f"{PATH_NAMES[p]} {a[p].get('applied', 0):,}" for p in PATH_NAMES if p in a)
    lat = summary["approval_latency_ms"]
    settings = summary["settings"]
    return "\n".join(
        [
            f"- **{c['started']:,} conversations** ({settings['conversations']} in flight at "
            f"once) on {settings['workers']} worker processes for "
            f"{settings['duration'] / 60:.0f} minutes, seed {summary['seed']}: "
            f"{t['total']:,} turns, {summary['pauses']:,} pauses;",
            f"- **{applied:,} answers applied** by every path ({paths}), "
            f"{summary['refusals']['total']:,} refused as they must be (wrong ref or name, "
            f"not an approver, a second answer, hostile payloads), "
            f"{summary['deadlines_expired']:,} deadlines expired, {summary['edits']:,} edits, "
            f"{summary['cancels']:,} cancels;",
            f"- **faults**: {f['worker_sigkill']} worker SIGKILLs, {f['worker_sigterm']} "
            f"SIGTERMs, {f['server_sigkill']} dev-server SIGKILLs and restarts, "
            f"{f['model_hang']} model calls that hung, "
            f"{f['model_http429'] + f['model_http503']} that failed (429, 503);",
            f"- **{r['paid']:,} tool runs** for {r['approvals']:,} approvals, each at most "
            f"once, and exactly once unless the model was told it may have taken effect "
            f"({r['model_told_may_have_taken_effect']}); approval to the turn's next stop "
            f"p50 {lat['p50'] / 1000:.1f} s, p99 {lat['p99'] / 1000:.1f} s;",
            f"- **invariant violations: {summary['violations_total']}**.",
        ]
    )


PATH_NAMES = {
    "update": "update",
    "signal": "`temporal workflow signal`",
    "agentctl": "agentctl",
    "http": "approvals API",
    "agui": "AG-UI",
}


if __name__ == "__main__":
    import sys

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench/results/soak.json")
    print(readme_figures(json.loads(path.read_text())))

"""The soak (``bench/soak``, ``make soak``) in a short run: the harness does what it says, and
under its faults every invariant holds.

Under a minute of turns, twenty conversations, three worker processes, one server kill and a
SIGKILL and a SIGTERM of a worker, with the same checks as the full run (``python -m
bench.soak``, as ``make soak`` runs it, in a subprocess writing into ``tmp_path``). It checks
what happened, never how fast: the figures of record come from the full run in
``bench/results/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.report import readme_figures

ROOT = Path(__file__).parent.parent

PATHS = ("update", "signal", "agentctl", "http", "agui")
FAULTS = (
    "server_sigkill",
    "worker_sigkill",
    "worker_sigterm",
    "model_http429",
    "model_http503",
    "model_hang",
)


@pytest.mark.timeout(400)
def test_a_short_soak_keeps_every_invariant_under_every_fault(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--duration",
            "50",
            "--conversations",
            "20",
            "--workers",
            "3",
            "--seed",
            "29",
            # Enough model faults in a short run for each kind to happen.
            "--model-fault-rate",
            "0.1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    printed = proc.stdout[-4000:] + proc.stderr[-4000:]
    written = tmp_path / "soak.json"
    assert written.exists(), f"the soak wrote no results (exit {proc.returncode}):\n{printed}"
    results = json.loads(written.read_text())
    assert results["violations_total"] == 0, results["violation_examples"]
    assert proc.returncode == 0, printed
    assert set(results["violations"]) >= {
        "approval_ran_at_most_once",
        "approval_ran_once_or_model_told",
        "refused_answer_ran_nothing",
        "no_pause_lost",
        "last_turn_finished",
        "accepted_answer_in_audit_once",
        "no_standing_task_failure",
        "refused_signal_in_rejection_log",
    }
    faults = results["faults"]
    assert all(faults.get(kind, 0) >= 1 for kind in FAULTS), faults
    by_path = results["answers"]["by_path"]
    assert all(by_path.get(path, {}).get("applied", 0) >= 1 for path in PATHS), by_path
    refusals = results["refusals"]["by_kind"]
    assert all(
        refusals.get(kind, 0) >= 1
        for kind in ("wrong_ref", "wrong_name", "non_approver", "second", "hostile")
    ), refusals
    assert results["conversations"]["finished"] == results["conversations"]["started"] >= 20
    assert results["deadlines_expired"] >= 1 and results["edits"] >= 1 and results["cancels"] >= 1
    assert results["tool_runs"]["paid"] >= 1
    assert (tmp_path / "soak.png").stat().st_size > 10_000


def test_the_readme_states_the_figures_of_the_committed_full_run():
    """The README's soak figures are the ones bench/results/soak.json holds, and that run is a
    full one (at least ten minutes, 200 conversations in flight) with no violation."""
    results = json.loads((ROOT / "bench" / "results" / "soak.json").read_text())
    settings = results["settings"]
    assert settings["duration"] >= 600 and settings["conversations"] >= 200
    assert settings["workers"] >= 3 and results["faults"]["server_sigkill"] >= 1
    assert results["violations_total"] == 0, results["violation_examples"]
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- soak figures: python -m bench.soak.report -->\n")
    end = readme.index("<!-- end of soak figures -->")
    shown = readme[start:end].split("\n", 1)[1].strip()
    assert shown == readme_figures(results), "run python -m bench.soak.report to remake them"
    assert (ROOT / "bench" / "results" / "soak.png").stat().st_size > 10_000

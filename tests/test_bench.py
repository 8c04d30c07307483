"""The benchmark still runs (quick mode). A smoke test: it checks results, never timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_bench_quick_mode_produces_every_result(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    b1 = results["b1"]
    samples = b1["samples_ms"]
    assert len(samples["ours_cycle"]) == len(samples["floor_cycle"]) == len(samples["bare_cycle"])
    assert len(samples["ours_cycle"]) == 4
    # What AGENT_PAYLOAD_KEYS costs: ours with encryption on, against ours.
    assert len(samples["ours_encrypted_cycle"]) == 4
    assert set(b1["ratio_encrypted_to_ours"]) == {"start_to_paused", "answer_to_final", "cycle"}
    # What the result seal costs: ours against the same worker with result_keys=UNSIGNED.
    assert len(samples["ours_unsealed_cycle"]) == 4
    assert set(b1["ratio_ours_to_unsealed"]) == {"start_to_paused", "answer_to_final", "cycle"}
    assert b1["ours_unsealed"]["workflow_tasks_per_cycle"] >= 5
    assert "Ratio ours / ours_unsealed" in (tmp_path / "results.md").read_text()
    assert b1["ours"]["workflow_tasks_per_cycle"] >= 5
    assert results["b2"]["finished_right"] == results["b2"]["conversations"] == 20
    assert results["b2"]["lost"] == 0
    assert [r["turns"] for r in results["b3"]["rows"]] == [2, 5]
    assert set(results["b4"]["until_turn_result"]) == {"update", "signal"}
    b6 = results["b6"]
    assert b6["cycle_ms"]["agui"]["n"] == b6["cycle_ms"]["python"]["n"] == 2
    assert set(b6["ratio_agui_to_python"]) == {"cycle", "first_text"}
    assert "## B6 the web app" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.md").read_text().startswith("# Benchmark results")
    assert (tmp_path / "b1_cycle.png").stat().st_size > 1000

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


def test_b2_parked_checkpoints_restart_and_sample(tmp_path):
    """``python -m bench b2`` at a tiny N: checkpoints, the inbox pages, a worker restart and a
    resumed sample, none lost (structure only, never timings)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "b2",
            "--parked",
            "30",
            "--checkpoint-every",
            "15",
            "--second-agent-share",
            "0.25",
            "--resume-sample",
            "5",
            "--inbox-reads",
            "2",
            "--settle",
            "0.1",
            "--out",
            str(tmp_path),
            "--name",
            "b2_tiny",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    b2 = json.loads((tmp_path / "b2_tiny.json").read_text())
    assert b2["complete"] is True
    assert b2["parked"] == b2["attempted"] == 30
    assert [c["parked"] for c in b2["checkpoints"]] == [15, 30]
    for point in b2["checkpoints"]:
        assert point["visibility_paused"] == point["parked"]
        assert point["inbox_first_page_chats"] == min(20, point["parked"])
        # Every 4th conversation is the second agent's: the filter selects those only.
        assert 0 < point["inbox_filtered_page_chats"] < point["parked"]
        assert point["inbox_filtered_all_second_agent"] is True
        assert {"rss_mib_worker", "inbox_first_page_ms", "inbox_filtered_page_ms"} <= set(point)
    restart = b2["restart"]
    assert restart["sample"] == restart["finished_ok"] == 5
    assert restart["visibility_paused_after"] == 25
    assert {"first_resume_ms", "resume_rate_per_s", "rss_mib_new_worker"} <= set(restart)
    assert b2["finished_ok"] == 5 and b2["still_paused"] == 25
    assert b2["lost"] == 0
    assert {"rss_mib_before", "rss_mib_parked", "rss_mib_after", "start_rate_per_s"} <= set(b2)

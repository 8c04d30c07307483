"""The benchmark still runs (quick mode). A smoke test: it checks results, never timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def run_bench(*argv: str) -> None:
    """``python -m bench ARGV`` from the project root, which must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_bench_quick_mode_produces_every_result(tmp_path):
    run_bench("--quick", "--out", str(tmp_path))
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


def test_throughput_benchmark_reports_ratios_and_each_cycles_work(tmp_path):
    """B7 at a tiny size (2 in flight, one round): structured output, not timings."""
    run_bench("--only", "b7", "--quick", "--thru-split", "--out", str(tmp_path))
    b7 = json.loads((tmp_path / "results-b7.json").read_text())["b7"]
    assert (b7["in_flight"], b7["cycles_per_round"], b7["rounds"]) == (2, 2, 1)
    assert b7["server_processes"] >= 1
    variants = b7["variants"]
    assert set(variants) == {
        "ours", "floor", "ours_inprocess", "bare", "floor_view", "floor_sa", "floor_memo"
    }  # fmt: skip
    for name, v in variants.items():
        assert v["cycles"] == v["histories_read"] == 2, name
        assert v["cycles_per_s"] > 0 and v["server_cpu_ms_per_cycle"] >= 0, name
        events = v["events_per_cycle"]
        # What every cycle must contain: started, a pause and an answer by update, and the
        # three activities (model, tool, model), each scheduled, started and completed.
        assert events["WORKFLOW_EXECUTION_STARTED"] == 1, name
        assert events["WORKFLOW_EXECUTION_UPDATE_ACCEPTED"] >= 2, name
        assert events["WORKFLOW_EXECUTION_UPDATE_COMPLETED"] >= 2, name
        for stage in ("SCHEDULED", "STARTED", "COMPLETED"):
            assert events[f"ACTIVITY_TASK_{stage}"] >= 3, (name, stage)
            assert events[f"WORKFLOW_TASK_{stage}"] >= 1, (name, stage)
        assert v["history_events_per_cycle"] == sum(events.values())
        assert v["history_bytes_per_cycle"] > 0
        # The driver: the start (update-with-start) and the approval (an update).
        assert v["driver_calls_per_cycle"]["update_with_start"] == 1, name
        assert v["driver_calls_per_cycle"]["update"] >= 1, name
        # Every RPC, from the SDK core's counters: the workers' task completions among them.
        rpcs = v["rpcs_per_cycle"]
        assert rpcs["RespondWorkflowTaskCompleted"] >= 1, name
        assert rpcs["RespondActivityTaskCompleted"] == 3, name
    for ours in ("ours", "ours_inprocess", "floor_view"):
        # What operators read: the status in search attributes, the pending calls in the memo.
        assert variants[ours]["events_per_cycle"]["UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"] >= 1
        assert variants[ours]["events_per_cycle"]["WORKFLOW_PROPERTIES_MODIFIED"] >= 1
    for floor in ("floor", "bare"):
        assert variants[floor]["events_per_cycle"]["WORKFLOW_EXECUTION_COMPLETED"] == 1
        assert "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" not in variants[floor]["events_per_cycle"]
    assert set(b7["ratios"]) == {
        "ours/floor", "ours_inprocess/bare", "floor_view/bare", "floor_sa/bare", "floor_memo/bare"
    }  # fmt: skip
    # floor_view is bare plus the operator view's writes, as many as ours makes.
    view, bare = variants["floor_view"]["events_per_cycle"], variants["bare"]["events_per_cycle"]
    for kind in ("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES", "WORKFLOW_PROPERTIES_MODIFIED"):
        assert view[kind] == variants["ours"]["events_per_cycle"][kind], kind
    assert sum(view.values()) - sum(bare.values()) == 5
    # --thru-split: one kind of write each.
    sa, memo = variants["floor_sa"]["events_per_cycle"], variants["floor_memo"]["events_per_cycle"]
    assert sa["UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"] == 3 and "WORKFLOW_PROPERTIES_MODIFIED" not in sa
    assert memo["WORKFLOW_PROPERTIES_MODIFIED"] == 2
    assert "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" not in memo
    for pair, ratios in b7["ratios"].items():
        for key in ("cycles_per_s", "cycles_per_s_median_of_rounds", "process_cpu_ms_per_cycle",
                    "history_events_per_cycle", "history_bytes_per_cycle"):  # fmt: skip
            assert ratios[key] > 0, (pair, key)
        # The server's CPU moves in clock ticks: a tiny round may read none for the floor.
        for key in ("server_cpu_ms_per_cycle", "server_cpu_ms_per_cycle_median_of_rounds"):
            assert ratios[key] is None or ratios[key] >= 0, (pair, key)
    md = (tmp_path / "results-b7.md").read_text()
    assert "## B7 throughput" in md and "| UPSERT_WORKFLOW_SEARCH_ATTRIBUTES |" in md
    assert not (tmp_path / "results.json").exists()  # a partial run leaves the page alone


def test_b2_parked_checkpoints_restart_and_sample(tmp_path):
    """``python -m bench b2`` at a tiny N: checkpoints, the inbox pages, a worker restart and a
    resumed sample, none lost (structure only, never timings)."""
    run_bench(
        "b2",
        "--parked", "30",
        "--checkpoint-every", "15",
        "--second-agent-share", "0.25",
        "--resume-sample", "5",
        "--inbox-reads", "2",
        "--settle", "0.1",
        "--out", str(tmp_path),
        "--name", "b2_tiny",
    )  # fmt: skip
    b2 = json.loads((tmp_path / "b2_tiny.json").read_text())
    assert b2["complete"] is True
    assert b2["parked"] == b2["attempted"] == 30
    assert [c["parked"] for c in b2["checkpoints"]] == [15, 30]
    for point in b2["checkpoints"]:
        assert point["visibility_paused"] == point["parked"]
        assert point["inbox_first_page_chats"] == min(20, point["parked"])
        # Every 4th conversation is the second agent's: the filter selects those only.
        assert 0 < point["inbox_filtered_page_chats"] < point["parked"]
        # Parked within the run's first minute, all of them: the page of the longest waiting.
        assert point["inbox_aged_all_older"]
        assert point["inbox_aged_page_chats"] == min(20, point["parked"])
        assert point["store_mib"] > 0  # the store is a file, as the embedded default's
        assert point["inbox_filtered_all_second_agent"] is True
        assert {"rss_mib_worker", "inbox_first_page_ms", "inbox_filtered_page_ms"} <= set(point)
    restart = b2["restart"]
    assert restart["sample"] == restart["finished_ok"] == 5
    assert restart["visibility_paused_after"] == 25
    assert {"first_resume_ms", "resume_rate_per_s", "rss_mib_new_worker"} <= set(restart)
    assert b2["finished_ok"] == 5 and b2["still_paused"] == 25
    assert b2["lost"] == 0
    assert {"rss_mib_before", "rss_mib_parked", "rss_mib_after", "start_rate_per_s"} <= set(b2)

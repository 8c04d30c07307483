"""``python -m bench.cycle_anatomy``: where one approval cycle's server work goes.

One cycle of ours (a message, the model calls a gated tool, the pause, an approval by update,
the tool, the model's answer, idle) and one of the bare floor (``bench.floor_workflow``), each
on a fresh workflow: the history's events by type, the workflow and activity tasks, the
search-attribute and memo writes, and the client's RPCs on each leg (counted at the service
client, so the SDK's own long polls for an update's outcome are in them). Counts, not times:
they do not move with the machine. Writes ``bench/results/cycle_anatomy.json``.

Measured on 2026-12-05 (temporalio 1.35, CLI 1.9.1 / server 1.32), one fresh cycle each:

- events: ours 34, the bare floor 30. The same engine work (5 workflow tasks of 3 events, 3
  activities of 3, the start, 2 updates accepted and completed: 29, the floor's 30 with its
  completion), plus the operator view's 5 writes: 3 ``UpsertWorkflowSearchAttributes`` (pause,
  answer, turn's end) and 2 ``WorkflowPropertiesModified`` (pause, answer). The pause's two and
  the answer's two already go out in one workflow task each (no extra task); Temporal has no
  command that writes both, and none of the five repeats a value already there.
- workflow tasks 5 against 5, activity tasks 3 against 3.
- the caller's RPCs: 2 on each leg against the floor's 1 (the update sent to be accepted, then
  ``PollWorkflowExecutionUpdate`` for its outcome, because ``worker_timeout`` bounds only the
  acceptance); no query or describe on either leg.
- the worker's: 2 ``RecordActivityTaskHeartbeat`` a cycle the floor does not make (the model
  activity beats at its first streamed chunk, each call), each a write of the mutable state:
  14 ``UpdateWorkflowExecution`` persistence writes against 12.
- visibility: 4 upserts against the floor's 1 (and its close).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from bench.__main__ import QUEUE, BenchModel, _free_port, approved, bench_agent
from bench.floor_activities import FloorActivities
from bench.floor_workflow import FloorInput, FloorWorkflow
from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.codec import data_converter
from temporal_agent_interrupts.worker import build_worker, sandbox_runner
from temporal_agent_interrupts.worker.devserver import dev_server_command, wait_for_port
from temporal_agent_interrupts.worker.receipt_keys import ENV_VAR as RECEIPT_KEYS_VAR
from temporal_agent_interrupts.worker.receipt_keys import generate_receipt_key
from temporal_agent_interrupts.worker.result_keys import ENV_VAR as RESULT_KEYS_VAR
from temporal_agent_interrupts.worker.result_keys import generate_result_key
from temporal_agent_interrupts.worker.standin import GeminiStandIn

RESULTS = Path(__file__).parent / "results"


class RpcCounter:
    """Counts the RPCs a client makes (workers poll through the bridge, not through this)."""

    def __init__(self, client: Client) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        service = client.service_client
        inner = service._rpc_call

        async def counted(rpc: str, *args: Any, **kwargs: Any) -> Any:
            self.calls[rpc] += 1
            return await inner(rpc, *args, **kwargs)

        service._rpc_call = counted

    def take(self) -> dict[str, int]:
        out = dict(self.calls)
        self.calls.clear()
        return out


SCRAPED = ("service_requests", "persistence_requests", "visibility_persistence_requests")


def _scrape(port: int) -> collections.Counter[str]:
    """The server's request counters (namespace ``default`` where labelled)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name not in SCRAPED or 'namespace="temporal_system"' in line:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        key = f"{name}:{labels.get('service_name', '')}:{labels.get('operation', '')}"
        out[key] += int(float(line.rsplit(" ", 1)[1]))
    return out


def _delta(after: collections.Counter[str], before: collections.Counter[str]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in sorted(after) if after[k] != before[k]}


async def _anatomy(client: Client, workflow_id: str) -> dict[str, Any]:
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    types = collections.Counter(
        EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in hist.events
    )
    return {
        "events": len(hist.events),
        "workflow_tasks": types["WORKFLOW_TASK_COMPLETED"],
        "activity_tasks": types["ACTIVITY_TASK_SCHEDULED"],
        "properties_modified": types["UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"]
        + types["WORKFLOW_PROPERTIES_MODIFIED"],
        "by_type": dict(sorted(types.items())),
        # What the server stores and moves per cycle: the events' encoded size, by type.
        "history_bytes": sum(e.ByteSize() for e in hist.events),
        "bytes_by_type": dict(
            sorted(
                collections.Counter(
                    {
                        name: sum(
                            e.ByteSize()
                            for e in hist.events
                            if EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") == name
                        )
                        for name in types
                    }
                ).items()
            )
        ),
        "sequence": [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in hist.events],
    }


async def main() -> dict[str, Any]:
    port = _free_port()
    metrics_port = _free_port()
    cmd = dev_server_command(
        db_file=None, port=port, headless=True, extra=["--metrics-port", str(metrics_port)]
    )
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for_port(port, proc=server)
        target = {"target_host": f"127.0.0.1:{port}", "data_converter": data_converter(None)}
        worker_client = await Client.connect(**target)
        # The answering side has a connection of its own, so only its RPCs are counted.
        caller = await Client.connect(**target)
        rpcs = RpcCounter(caller)
        model = BenchModel()
        ours: dict[str, Any] = {}
        floor: dict[str, Any] = {}
        with GeminiStandIn(model) as standin:
            gemini = standin.client()
            floor_acts = FloorActivities(gemini)
            async with (
                build_worker(worker_client, agents=[bench_agent], task_queue=QUEUE, gemini=gemini),
                Worker(
                    worker_client,
                    task_queue="floor",
                    workflows=[FloorWorkflow],
                    activities=[floor_acts.model, floor_acts.model_bare, floor_acts.tool],
                    workflow_runner=sandbox_runner(),
                ),
            ):
                agents = AgentClient(caller, task_queue=QUEUE)
                for _ in range(2):  # the first warms the worker; the second is reported
                    tag = uuid.uuid4().hex[:8]
                    rpcs.take()
                    await asyncio.sleep(1.0)
                    server0 = _scrape(metrics_port)
                    chat = await agents.chat("benchAgent", chat_id=f"anatomy-{tag}")
                    res = await chat.send(f"go {tag}")
                    assert res.finish_reason == FinishReason.INTERRUPTED, res
                    send_rpcs = rpcs.take()
                    res = await chat.resume(restart=[approved(i) for i in res.interrupts])
                    assert res.finish_reason == FinishReason.STOP and res.text == "done", res
                    answer_rpcs = rpcs.take()
                    ours = await _anatomy(worker_client, chat.id)
                    ours["rpcs"] = {"send": send_rpcs, "answer": answer_rpcs}
                    await asyncio.sleep(1.0)
                    server1 = _scrape(metrics_port)
                    ours["server"] = _delta(server1, server0)

                    workflow_id = f"floor-{tag}"
                    start = WithStartWorkflowOperation(
                        FloorWorkflow.run,
                        FloorInput(prompt=f"go {tag}", model_activity="floor_model_bare"),
                        id=workflow_id,
                        task_queue="floor",
                        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                    )
                    await caller.execute_update_with_start_workflow(
                        FloorWorkflow.start, start_workflow_operation=start
                    )
                    send_rpcs = rpcs.take()
                    handle = await start.workflow_handle()
                    assert await handle.execute_update(FloorWorkflow.approve) == "done"
                    answer_rpcs = rpcs.take()
                    floor = await _anatomy(worker_client, workflow_id)
                    floor["rpcs"] = {"send": send_rpcs, "answer": answer_rpcs}
                    await asyncio.sleep(1.0)
                    floor["server"] = _delta(_scrape(metrics_port), server1)
        out = {"ours": ours, "bare": floor}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "cycle_anatomy.json").write_text(json.dumps(out, indent=2) + "\n")
        return out
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    os.environ.setdefault(RESULT_KEYS_VAR, generate_result_key("bench"))
    os.environ.setdefault(RECEIPT_KEYS_VAR, generate_receipt_key("bench"))
    result = asyncio.run(main())
    for name, r in result.items():
        print(
            f"== {name}: {r['events']} events, {r['workflow_tasks']} workflow tasks, "
            f"{r['activity_tasks']} activity tasks, {r['properties_modified']} property writes"
        )
        print("   rpcs:", r["rpcs"])
        print("   server:", json.dumps(r["server"], indent=1))
        print("   by type:", r["by_type"])
        print("   " + "\n   ".join(f"{i + 1:2d} {t}" for i, t in enumerate(r["sequence"])))
    sys.exit(0)

"""``python -m bench.soak.sdk_query_repro``: the SDK problem behind the soak's first finding,
with a bare Temporal workflow and nothing of this project. Exits 1 while the problem stands.

A worker is killed (SIGKILL) while it holds a workflow waiting on a timer. A fresh worker is
started, and the workflow is queried: the server first tries the dead worker's sticky queue,
and some seconds later the fresh worker answers from a full replay. Meanwhile the timer has
fired, and the task for it waits on the dead worker's sticky queue until it times out. The fresh
worker applies the fired timer while answering the query (the workflow code runs on it, with the
previous task's time), and keeps the commands it made for its next task. When that next task
also brings an update, the commands of the timer go into history before the update's
acceptance, while a replay runs the update first (updates and signals before timers): the
history no longer replays, and every worker that takes the run without it in its cache fails
its tasks as nondeterministic.

Seen with temporalio 1.35.0 and the Temporal CLI 1.9.1 dev server (server 1.32.0). The
workflow here upserts its memo when the timer fires; any command does (a timer, an activity).

This runs the SDK's own worker, so it fails for as long as the SDK does: the product's workers
refuse that activation (``worker.sandbox.QueryTimeGuard``, tests/test_soak_findings.py), and
this script says when an SDK upgrade makes the guard unneeded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker


@workflow.defn
class Waiter:
    def __init__(self) -> None:
        self.pings = 0

    @workflow.run
    async def run(self) -> str:
        try:
            await workflow.wait_condition(lambda: self.pings > 0, timeout=timedelta(seconds=5))
        except TimeoutError:
            workflow.upsert_memo({"fired": True})  # a command, as the timer fires
        await workflow.wait_condition(lambda: self.pings > 1)
        return "done"

    @workflow.update
    async def ping(self) -> int:
        self.pings += 1
        return self.pings

    @workflow.query
    def count(self) -> int:
        return self.pings


async def serve(address: str, queue: str) -> None:
    client = await Client.connect(address)
    async with Worker(client, task_queue=queue, workflows=[Waiter]):
        print("ready", flush=True)
        await asyncio.Event().wait()


async def spawn(address: str, queue: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __spec__.name if __spec__ else __file__,
        "worker",
        address,
        queue,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"ready"
    return proc


async def main() -> int:
    # Here, not at the top: the workflow sandbox imports this module, and the workflow must
    # not pull in the project (nor google-genai through it).
    from temporal_agent_interrupts.worker.devserver import temporal_cli

    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), dev_server_log_level="error"
    ) as env:
        address = env.client.service_client.config.target_host
        queue = f"q-{uuid.uuid4()}"
        first = await spawn(address, queue)
        handle = await env.client.start_workflow(
            Waiter.run, id=f"w-{uuid.uuid4()}", task_queue=queue
        )
        await asyncio.sleep(1)  # its first task completes on the first worker: the timer starts
        first.send_signal(signal.SIGKILL)
        await first.wait()
        second = await spawn(address, queue)
        try:
            print("query:", await handle.query(Waiter.count))
            # This update lands in the task that takes the fired timer.
            print("update:", await handle.execute_update(Waiter.ping))
            await handle.execute_update(Waiter.ping)
            print("result:", await handle.result())
            history = await handle.fetch_history()
        finally:
            second.kill()
            await second.wait()
        replayed = await Replayer(workflows=[Waiter]).replay_workflow(
            history, raise_on_replay_failure=False
        )
        print("replay:", replayed.replay_failure or "ok")
        return 1 if replayed.replay_failure else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(serve(sys.argv[2], sys.argv[3]))
    else:
        code = asyncio.run(main())
        sys.stdout.flush()
        os._exit(code)  # skip interpreter teardown, where the SDK can abort (sdk-python #300)

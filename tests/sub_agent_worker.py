"""A worker process hosting a supervisor and its payments sub-agent, for the tests that SIGKILL
it while the sub-agent runs (``tests/test_sub_agents_kill.py``): ``python -m
tests.sub_agent_worker ADDRESS NAMESPACE QUEUE DIR``. It prints ``ready`` once it polls its task
queue.

The sub-agent's gated tool writes each run to a SQLite ledger in ``DIR`` (:class:`Ledger`),
whichever process runs it, with its idempotency key: a counter in the test's own process could
not see a run in this one. While ``DIR/hold`` exists, a run is held after it is recorded, so the
test can kill the worker in the middle of it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from temporal_agent_interrupts import Agent, ToolApproval, ToolContext, agent_tool, tool
from temporal_agent_interrupts.activities import subagents
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel
from temporal_agent_interrupts.workflows import config

LEDGER = "ledger.sqlite"
HOLD = "hold"

PAY_TIMEOUT = timedelta(seconds=4)
"""One run's own timeout, well under the tool heartbeat's 30 s: a run cut short by the kill is
noticed (and reported, not run again) within seconds."""

HOLD_ANSWER = "hold-answer"
"""While ``DIR/hold-answer`` exists, the first attempt of a forwarding of an answer to a
sub-agent (``sub_agent_resume``) is held once it has the sub-agent's outcome, and writes
``DIR/answered``: the test kills the worker there, after the sub-agent took the answer."""
ANSWERED = "answered"
ANSWER_HEARTBEAT = timedelta(seconds=5)
"""The heartbeat limit of a caller's forwarding of an answer to its sub-agent in these processes
(``config.SUB_AGENT_ANSWER_HEARTBEAT`` is 20 s): the forwarding lost with a killed worker is
retried on the fresh one after this. The tests prove that it is retried once, under the same
update id, not how soon; the activity beats at a quarter of it, as with the default."""

STICKY_TIMEOUT = timedelta(seconds=1)
"""How long a workflow task waits on this worker's sticky queue before any worker may take it:
the SDK's default (10 s) would stall each cached conversation that long after the kill."""


@dataclass(frozen=True)
class Run:
    chat_id: str
    ref: str
    idempotency_key: str
    to: str
    resumed: bool
    pid: int


class Ledger:
    """Every run of ``pay``, one row each, from any process. No unique constraint: a second
    run of one approval is a second row, counted by the test, never hidden by the database."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LEDGER

    def _connect(self) -> sqlite3.Connection:
        # One connection per use: a writer may be killed at any moment (the journal keeps the
        # file whole), and runs are few.
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def create(self) -> None:
        conn = self._connect()
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, chat_id TEXT, ref TEXT,"
                " idempotency_key TEXT, recipient TEXT, resumed INTEGER, pid INTEGER)"
            )
        finally:
            conn.close()

    def record(self, run: Run) -> None:
        conn = self._connect()
        try:
            conn.execute(
                "INSERT INTO runs (chat_id, ref, idempotency_key, recipient, resumed, pid)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run.chat_id, run.ref, run.idempotency_key, run.to, int(run.resumed), run.pid),
            )
        finally:
            conn.close()

    def runs(self) -> list[Run]:
        if not self.path.exists():
            return []
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT chat_id, ref, idempotency_key, recipient, resumed, pid FROM runs"
                " ORDER BY id"
            ).fetchall()
        finally:
            conn.close()
        return [Run(c, r, k, to, bool(res), pid) for c, r, k, to, res, pid in rows]


class Payment(BaseModel):
    to: str
    amount: float


def agents(directory: Path) -> list[Agent]:
    ledger = Ledger(directory)
    hold = directory / HOLD

    @tool("pay", "Pay someone.", timeout=PAY_TIMEOUT)
    async def pay(inp: Payment, ctx: ToolContext) -> dict:
        ledger.record(
            Run(ctx.chat_id, ctx.ref, ctx.idempotency_key, inp.to, ctx.resumed, os.getpid())
        )
        if hold.exists():
            await asyncio.Event().wait()  # held until the test kills this process
        return {"paid": inp.amount, "to": inp.to}

    payments = Agent(
        "payments",
        system="You make payments.",
        tools=[pay],
        middleware=[ToolApproval(approvers=["alice"])],
    )
    # Two approvals settle one of its payments: an answer leaves it paused, still waiting.
    treasury = Agent(
        "treasury",
        system="You make payments two people approve.",
        tools=[pay],
        middleware=[ToolApproval(approvers=["alice", "bob"], quorum=2)],
    )
    supervisor = Agent(
        "supervisor",
        system="You delegate.",
        tools=[
            agent_tool(payments, description="Make a payment through the payments agent."),
            agent_tool(treasury, description="Make a payment two people approve."),
        ],
    )
    return [supervisor]


class HoldAfterAnswer(Interceptor):
    """Holds a forwarding's first attempt once the sub-agent has answered it (``HOLD_ANSWER``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _HoldAfterAnswer(next, self.directory)


class _HoldAfterAnswer(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, directory: Path) -> None:
        super().__init__(next)
        self.directory = directory

    async def execute_activity(self, input: ExecuteActivityInput) -> object:
        result = await super().execute_activity(input)
        info = activity.info()
        held = (self.directory / HOLD_ANSWER).exists()
        if info.activity_type == config.SUB_AGENT_RESUME_ACTIVITY and info.attempt == 1 and held:
            (self.directory / ANSWERED).write_text(repr(result))
            await asyncio.Event().wait()  # held until the test kills this process
        return result


def shorten_the_answer_heartbeat() -> None:
    """:data:`ANSWER_HEARTBEAT` for what this process schedules and runs: the workflow reads
    the limit from ``config`` when it schedules the forwarding (the workflow's modules pass
    through the sandbox), the activity its beat from its own import of it."""
    config.SUB_AGENT_ANSWER_HEARTBEAT = ANSWER_HEARTBEAT
    subagents.SUB_AGENT_ANSWER_HEARTBEAT = ANSWER_HEARTBEAT


async def main(address: str, namespace: str, queue: str, directory: str) -> None:
    shorten_the_answer_heartbeat()
    client = await Client.connect(address, namespace=namespace)
    model = ScriptedModel(offline_rules)
    async with build_worker(
        client,
        agents=agents(Path(directory)),
        task_queue=queue,
        gemini=model.client(),
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        interceptors=[HoldAfterAnswer(Path(directory))],
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

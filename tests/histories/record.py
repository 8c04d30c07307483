"""Record the histories under tests/histories/ (run after a deliberate, compatible change).

    .venv/bin/python -m tests.histories.record [NAME ...]   # default: all of them

``edges_v1.json`` is not made here: it was recorded from the same scenario as ``edges_v2`` with
the workflow code from before the turn-edges patch (commit f303de6), to prove that runs begun
under that code still replay. Nor are the three recorded with the code from before the
durable-input patch (commit cbdff4e), each a case that code accepted and the durable-input
rules would refuse or do differently, so they must replay as they ran: ``nested_resume_v2``
(an answer nested 70 levels deep), ``nested_send_v2`` (a workflow started without a message,
then a ``send`` signal with a 70-level junk key) and ``bare_start_v2`` (started without a
message: the turn-edges marker is the run's first command).

``governance_v1`` was recorded with approval governance (verified votes to a quorum by update
and signal, an edit through the gate, a deadline that reminds, escalates and cancels), when a
new run recorded the ``governance-2026-12`` patch marker; it is kept as that shape, and no
longer made here. ``governance_v2`` is the same scenario since the client declares the rules in
the start input: no marker, and the first task publishes after its handlers.

``spine_v1`` was recorded after the turn-events restructure (every kind of turn event, a turn
started by signal, an answer with identity and metadata, a close that withdraws an interrupt).

Each file is a real conversation recorded on a dev server. The replay tests run them against the
current workflow code, so a change that would break conversations already in flight fails CI.
Only re-record when a change is meant to be incompatible, and then version the workflow instead.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from client import AgentClient
from tests import agents as t
from tests.scenarios import (
    banking_conversation,
    cancel_edges_conversation,
    dump_history,
    durable_conversation,
    governance_conversation,
    rich_conversation,
    spine_conversation,
)
from worker import build_worker
from worker.offline_model import respond
from worker.standin import GeminiStandIn
from worker.testing import ScriptedModel, dev_server

HERE = Path(__file__).parent
ALL = ("rich_v1", "banking_v1", "edges_v2", "durable_v1", "spine_v1", "governance_v2")


async def main(names: set[str]) -> None:
    async with dev_server() as env:
        model = ScriptedModel()
        with GeminiStandIn(respond) as offline:
            scripted = model.client()
            async with build_worker(env.client, agents=t.ALL, task_queue="record", gemini=scripted):
                agents = AgentClient(env.client, task_queue="record")
                if "rich_v1" in names:
                    await rich_conversation(agents, model, chat_id="rich_v1")
                if "edges_v2" in names:
                    await cancel_edges_conversation(agents, model, chat_id="edges_v2")
                if "durable_v1" in names:
                    await durable_conversation(agents, model, chat_id="durable_v1")
                if "spine_v1" in names:
                    await spine_conversation(agents, model, chat_id="spine_v1")
                if "governance_v2" in names:
                    await governance_conversation(agents, model, chat_id="governance_v2")
            async with build_worker(
                env.client, agents=t.ALL, task_queue="record-bank", gemini=offline.client()
            ):
                if "banking_v1" in names:
                    await banking_conversation(
                        AgentClient(env.client, task_queue="record-bank"), chat_id="banking_v1"
                    )
        for name in sorted(names):
            (HERE / f"{name}.json").write_text(await dump_history(env.client, name))
            print(f"wrote tests/histories/{name}.json")


if __name__ == "__main__":
    asyncio.run(main(set(sys.argv[1:]) or set(ALL)))
    os._exit(0)  # skip interpreter teardown, where the SDK can abort (sdk-python issue 300)

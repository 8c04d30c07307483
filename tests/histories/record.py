"""Record the histories under tests/histories/ (run after a deliberate, compatible change).

    .venv/bin/python -m tests.histories.record

Each file is a real conversation recorded on a dev server. The replay tests run them against the
current workflow code, so a change that would break conversations already in flight fails CI.
Only re-record when a change is meant to be incompatible, and then version the workflow instead.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from client import AgentClient
from tests import agents as t
from tests.conftest import ScriptedModel
from tests.scenarios import banking_conversation, dump_history, rich_conversation
from worker import build_worker
from worker.devserver import DISPATCH_FLAG, temporal_cli
from worker.offline_model import respond
from worker.standin import GeminiStandIn
from workflows.config import SEARCH_ATTRIBUTES

HERE = Path(__file__).parent


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=list(DISPATCH_FLAG),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
    )
    async with env:
        model = ScriptedModel()
        with model.server, GeminiStandIn(respond) as offline:
            async with build_worker(
                env.client, agents=t.ALL, task_queue="record", gemini=model.server.client()
            ):
                await rich_conversation(
                    AgentClient(env.client, task_queue="record"), model, chat_id="rich"
                )
            async with build_worker(
                env.client, agents=t.ALL, task_queue="record-bank", gemini=offline.client()
            ):
                await banking_conversation(
                    AgentClient(env.client, task_queue="record-bank"), chat_id="banking"
                )
        for wid, name in (("rich", "rich_v1"), ("banking", "banking_v1")):
            (HERE / f"{name}.json").write_text(await dump_history(env.client, wid))
            print(f"wrote tests/histories/{name}.json")


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)  # skip interpreter teardown, where the SDK can abort (sdk-python issue 300)

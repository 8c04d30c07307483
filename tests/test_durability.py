"""A paused turn survives its worker, its server, and a new version of the code (replay)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.worker import build_worker, sandbox_runner
from temporal_agent_interrupts.worker.devserver import DISPATCH_FLAG, temporal_cli
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.worker.standin import GeminiStandIn, calls, text
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed
from tests.histories import load
from tests.scenarios import banking_conversation, durable_conversation, rich_conversation

HISTORIES = Path(__file__).parent / "histories"


def replayer() -> Replayer:
    # The strict sandbox: the workflow's own code is re-imported for each run and restricted,
    # so a clock, random or I/O call anywhere a recorded history reaches fails here, where a
    # worker (which passes that code through, see worker.PASSTHROUGH) would not notice.
    return Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(strict=True),
    )


async def test_paused_turn_is_answered_by_a_brand_new_worker(client, model):
    model.reply(calls(("lookup", {"key": "k"}), ("approve", {"question": "q"})), text("done"))
    queue = f"tq-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=queue)
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await agents.chat("assistant")
        (i,) = (await chat.send("go")).interrupts
    # The first worker is gone; nothing of the conversation lives in this process any more.
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        assert [p.ref for p in await chat.pending()] == [i.ref]
        res = await chat.resume(respond=[i.respond({"approved": True})])
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS == {"lookup": 1}  # the completed sibling was not re-run by the new worker
    assert [r["name"] for r in model.requests[1].function_responses()] == ["lookup", "approve"]
    # The new worker kept nothing of the chat: it asked the workflow for the conversation, and
    # the model got all of it.
    assert [c["role"] for c in model.requests[1].contents] == ["user", "model", "user"]
    assert model.requests[1].contents[0] == {"role": "user", "parts": [{"text": "go"}]}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_paused_turn_survives_a_server_restart(tmp_path, model):
    db = tmp_path / "temporal.db"

    async def server() -> WorkflowEnvironment:
        return await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli(),
            dev_server_database_filename=str(db),
            dev_server_extra_args=list(DISPATCH_FLAG),
            dev_server_log_level="error",
            search_attributes=SEARCH_ATTRIBUTES,
            data_converter=pydantic_data_converter,
        )

    model.reply(calls(("approve", {"question": "survive?"})), text("survived"))
    queue = f"tq-{uuid.uuid4()}"
    async with await server() as env:
        agents = AgentClient(env.client, task_queue=queue)
        async with build_worker(env.client, agents=t.ALL, task_queue=queue, gemini=model.client()):
            chat = await agents.chat("assistant")
            (i,) = (await chat.send("go")).interrupts
    assert db.exists()
    async with await server() as env:
        agents = AgentClient(env.client, task_queue=queue)
        chat = await agents.chat("assistant", chat_id=chat.id)
        async with build_worker(env.client, agents=t.ALL, task_queue=queue, gemini=model.client()):
            assert [p.ref for p in await chat.pending()] == [i.ref]
            res = await chat.resume(respond=[i.respond({"approved": True})])
            assert res.text == "survived"
            await assert_no_workflow_task_failed(env.client, chat.id)


async def test_fresh_histories_replay_deterministically(run_worker, model, client):
    chat_id = f"rich-{uuid.uuid4()}"
    async with run_worker() as agents:
        await rich_conversation(agents, model, chat_id=chat_id)
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    result = await replayer().replay_workflow(hist, raise_on_replay_failure=True)
    assert result.replay_failure is None
    await assert_no_workflow_task_failed(client, chat_id)


async def test_fresh_durable_histories_replay_deterministically(run_worker, model, client):
    """The durable-input paths at full size (budget refusals, outputs over the turn's budget,
    continue-as-new on the run's own history size): every run replays."""
    chat_id = f"durable-{uuid.uuid4()}"
    async with run_worker() as agents:
        await durable_conversation(agents, model, chat_id=chat_id, big=True)
    runs = [wf.run_id async for wf in client.list_workflows(f'WorkflowId = "{chat_id}"')]
    assert len(runs) >= 2  # megabytes of answers and outputs: it continued as new
    for run_id in runs:
        hist = await client.get_workflow_handle(chat_id, run_id=run_id).fetch_history()
        result = await replayer().replay_workflow(hist, raise_on_replay_failure=True)
        assert result.replay_failure is None


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_recorded_histories_still_replay(path: Path):
    """Conversations recorded by earlier code must replay on today's code (in-flight safety)."""
    data = json.loads(path.read_text())
    # A run that has only just started holds no workflow task, and its replay waits forever.
    kinds = [event["eventType"] for event in data["events"]]
    assert "EVENT_TYPE_WORKFLOW_TASK_COMPLETED" in kinds, f"{path.name} recorded no work"
    hist = load(path)
    result = await replayer().replay_workflow(hist, raise_on_replay_failure=True)
    assert result.replay_failure is None


def test_there_are_recorded_histories():
    assert len(sorted(HISTORIES.glob("*.json"))) >= 2


async def test_offline_banking_conversation_replays(run_worker, client):
    chat_id = f"bank-{uuid.uuid4()}"
    with GeminiStandIn(offline_rules) as offline:
        queue = f"tq-{uuid.uuid4()}"
        async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=offline.client()):
            await banking_conversation(AgentClient(client, task_queue=queue), chat_id=chat_id)
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    await replayer().replay_workflow(hist, raise_on_replay_failure=True)

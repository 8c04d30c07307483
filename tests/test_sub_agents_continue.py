"""A caller waiting on its sub-agent continues as new (issue 44, finding 9).

A caller's turn waits on its sub-agent's child workflow for as long as the child waits on a
person. Its run could not continue as new meanwhile (the child would have been ended with it),
so signals kept landing in one run: forged ``sub_agent`` reports reached the history guard,
which cancelled the turn and the sub-agent with it, and past the server's per-run signal limit
every later signal to the caller was refused, answers included. The child is now left running
across the caller's continue-as-new, and the new run waits on it again.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.activities import subagents
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentEnd,
    SubAgentPendingInput,
)
from temporal_agent_interrupts.workflows.config import SUB_AGENT_SIGNAL
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.types import (
    InterruptRequest,
    PendingResult,
)
from tests.agents import SUB_RUNS as RUNS
from tests.agents import supervisor
from tests.helpers import assert_no_workflow_task_failed, events_of, eventually, history


def delegate(to: str, amount: float) -> str:
    task = f"call pay {json.dumps({'to': to, 'amount': amount})}"
    return f"call payments {json.dumps({'input': task})}"


async def _runs(client: Client, chat_id: str) -> list[str]:
    """The run ids of a conversation's chain, oldest first."""
    query = f'WorkflowId = "{chat_id}"'
    found = [w async for w in client.list_workflows(query)]
    return [w.run_id for w in sorted(found, key=lambda w: w.start_time)]


async def _flood_until_continued(client: Client, chat: Chat, child_id: str) -> list[str]:
    """Send forged reports naming the real child until the caller has continued as new."""
    handle = client.get_workflow_handle(chat.id)
    first = (await handle.describe()).run_id
    for _ in range(RUN.can_signals + 2):
        await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": child_id})

    async def current() -> str:
        return (await client.get_workflow_handle(chat.id).describe()).run_id

    await eventually(current, lambda run: run != first, timeout=30)
    return await _runs(client, chat.id)


async def _no_task_failed_but_racing_signals(client: Client, chat_id: str) -> None:
    """Every run of the chain failed no workflow task, but where the server refused a
    continue-as-new because signals arrived meanwhile (``UNHANDLED_COMMAND``): Temporal's own
    answer to that race, retried at once with the new signals."""
    for run in await _runs(client, chat_id):
        hist = await history(client, chat_id, run_id=run)
        failed = events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        causes = {e.workflow_task_failed_event_attributes.cause for e in failed}
        assert causes <= {WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND}, (
            failed[0]
        )


async def _paused(chat: Chat, amount: float, to: str) -> tuple[InterruptRequest, str]:
    """The caller's turn paused on its sub-agent's one interrupt, and the sub-agent's chat id."""
    paused = await chat.send(delegate(to, amount))
    assert paused.finish_reason == FinishReason.INTERRUPTED, paused
    (i,) = paused.interrupts
    assert i.chat_id is not None
    return i, i.chat_id


async def test_a_caller_waiting_on_its_sub_agent_continues_as_new_and_still_gets_its_answer(
    client,
):
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        i, child_id = await _paused(parent, 7, "cas_ann")
        runs = await _flood_until_continued(client, parent, child_id)
        assert len(runs) >= 2, runs
        # The child was not ended with the run that started it, and still waits.
        child = await client.get_workflow_handle(child_id).describe()
        assert child.status == WorkflowExecutionStatus.RUNNING
        # The new run shows the child's interrupt, as the first did, and takes its answer.
        shown = await eventually(parent.pending, lambda p: [x.ref for x in p] == [i.ref])
        assert shown[0].chat_id == child_id and shown[0].path == i.path
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert "paid" in done.text
        assert RUNS["cas_ann"] == 1
        child = await client.get_workflow_handle(child_id).describe()
        assert child.status == WorkflowExecutionStatus.COMPLETED
        # Every forged report was a hint the workflow read the child for; none is a rejection
        # and none ended the turn.
        assert await parent.pending() == []
    await _no_task_failed_but_racing_signals(client, parent.id)
    await assert_no_workflow_task_failed(client, child_id)


async def test_cancelling_a_continued_callers_turn_cancels_its_sub_agent(client):
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        i, child_id = await _paused(parent, 3, "cas_bo")
        await _flood_until_continued(client, parent, child_id)
        await eventually(parent.pending, lambda p: [x.ref for x in p] == [i.ref])
        cancelled = await parent.cancel(reason="changed my mind", identity="alice")
        assert cancelled.finish_reason == FinishReason.CANCELLED, cancelled
        desc = await eventually(
            lambda: client.get_workflow_handle(child_id).describe(),
            lambda d: d.status != WorkflowExecutionStatus.RUNNING,
            timeout=20,
        )
        assert desc.status == WorkflowExecutionStatus.CANCELED
        assert RUNS["cas_bo"] == 0
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP
    await _no_task_failed_but_racing_signals(client, parent.id)


async def test_a_sub_agent_terminated_while_its_caller_was_continued_fails_the_call(client):
    """A terminated child sends no last report: the continued caller learns it at the next
    read of the child (the next report anyone sends, or its periodic recheck)."""
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        i, child_id = await _paused(parent, 4, "cas_cy")
        await _flood_until_continued(client, parent, child_id)
        await eventually(parent.pending, lambda p: [x.ref for x in p] == [i.ref])
        await client.get_workflow_handle(child_id).terminate("an operator")
        await client.get_workflow_handle(parent.id).signal(SUB_AGENT_SIGNAL, {"chat_id": child_id})
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        assert done is not None
        # As when the run that started it sees it end: the call fails classified, the caller
        # lives on.
        assert done.finish_reason == FinishReason.FAILED, done
        assert done.error is not None and done.error.kind == "ToolError"
        assert f"({child_id}) terminated" in done.error.message
        assert RUNS["cas_cy"] == 0
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP
    await _no_task_failed_but_racing_signals(client, parent.id)


async def _squat_when_closed(client: Client, child_id: str, stop: asyncio.Event) -> bool:
    """Start a workflow of someone else's under ``child_id`` the moment the child closes."""
    while not stop.is_set():
        try:
            await client.start_workflow(
                "not-a-conversation", id=child_id, task_queue=f"nobody-{uuid.uuid4()}"
            )
            return True
        except WorkflowAlreadyStartedError:
            await asyncio.sleep(0.01)
    return False


@pytest.mark.parametrize("child_continued", [False, True], ids=["child-one-run", "child-continued"])
async def test_a_workflow_started_under_a_closed_childs_id_does_not_hide_its_result(
    client, monkeypatch: pytest.MonkeyPatch, child_continued: bool
):
    """Once a sub-agent closes, anyone may start a workflow under its id. A continued caller
    read the id's newest chain, found someone else's, and recorded the call as the child gone
    (uncertain) though the child had completed and paid. It follows the chain it started from
    its first run now, through the child's own continue-as-new."""
    read = subagents._pending

    async def slow_read(input: SubAgentPendingInput) -> PendingResult | SubAgentEnd:
        # The caller's read comes after the squatter's start (a busy worker): a race an
        # attacker polling the id wins often, made certain here.
        await asyncio.sleep(1)
        return await read(input)

    monkeypatch.setattr(subagents, "_pending", slow_read)
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        payee = f"cas_sq_{child_continued}"
        i, child_id = await _paused(parent, 5, payee)
        await _flood_until_continued(client, parent, child_id)
        await eventually(parent.pending, lambda p: [x.ref for x in p] == [i.ref])
        child_chat = await agents.chat("payments", chat_id=child_id)
        if child_continued:
            wrong = {"respond": [{"name": "pay", "ref": "nope", "output": {}}]}
            child = client.get_workflow_handle(child_id)
            first = (await child.describe()).run_id
            for n in range(RUN.can_signals):
                await child.signal("resume", wrong)
                await eventually(child_chat.status, lambda s, n=n: s.rejections > n)
            await eventually(
                lambda: client.get_workflow_handle(child_id).describe(),
                lambda d: d.run_id != first,
            )
        stop = asyncio.Event()
        squat = asyncio.create_task(_squat_when_closed(client, child_id, stop))
        # Answered on the sub-agent's own chat: it completes, having paid.
        await child_chat.resume(answers=[approve(i)], identity="alice")
        assert RUNS[payee] == 1
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        stop.set()
        assert await squat
        await client.get_workflow_handle(child_id).terminate("the squatter's, cleaned up")
    assert done is not None and done.finish_reason == FinishReason.STOP, done
    assert "paid" in done.text

"""Long conversations stay bounded (semantics 11): continue-as-new carries everything over.

A dedicated dev server suggests continue-as-new after 40 events instead of thousands, so a few
turns are enough to cross the line, idle or paused.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.errors import SendRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.config import MODEL_ACTIVITY, TOOL_ACTIVITY
from temporal_agent_interrupts.workflows.types import TurnEvent
from tests import agents as t
from tests.helpers import (
    SUGGEST_AFTER_EVENTS,
    assert_no_workflow_task_failed,
    events_of,
    eventually,
)


async def _runs(client, chat_id: str) -> list[str]:
    runs = []
    async for wf in client.list_workflows(f'WorkflowId = "{chat_id}"'):
        runs.append(wf.run_id)
    return runs


async def test_idle_conversation_continues_as_new_and_keeps_its_memory(small_histories, model):
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    for n in range(8):
        model.reply(calls(("lookup", {"key": f"k{n}"}, f"id-{n}")), text(f"answer {n}"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("assistant")
        first_run = None
        for n in range(8):
            res = await chat.send(f"question {n}")
            assert res.text == f"answer {n}"
            if first_run is None:
                first_run = (await client.get_workflow_handle(chat.id).describe()).run_id
        runs = await eventually(lambda: _runs(client, chat.id), lambda r: len(r) >= 2, timeout=15)
        current = await client.get_workflow_handle(chat.id).describe()
        status = await chat.status()
    assert current.run_id != first_run and len(runs) >= 2
    assert status.turns == 8
    # The model still saw the whole conversation: every question and answer so far.
    texts = [p.get("text") for c in model.requests[-1].contents for p in c["parts"] if "text" in p]
    assert texts[:4] == ["question 0", "answer 0", "question 1", "answer 1"]
    assert texts[-1] == "question 7"
    # Refs stay unique across runs: a model call id reused in a later run is not reused as a ref.
    assert len({ctx.ref for ctx in t.CONTEXTS}) == 8
    hist = await client.get_workflow_handle(chat.id).fetch_history()
    assert len(hist.events) <= SUGGEST_AFTER_EVENTS * 2
    await assert_no_workflow_task_failed(client, chat.id)


async def test_paused_conversation_continues_as_new_and_stays_paused(small_histories, model):
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(calls(("approve", {"question": "q"}), ("lookup", {"key": "k"})), text("done"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("assistant")
        (pending,) = (await chat.send("go")).interrupts
        handle = client.get_workflow_handle(chat.id)
        first_run = (await handle.describe()).run_id
        # Rejected signals grow the history while the turn waits for a human. Each is sent once
        # the last is recorded: back to back, more than the embedded default's 20 signals a run
        # would be refused by the server before the run moves on.
        for n in range(SUGGEST_AFTER_EVENTS):
            await handle.signal(
                "resume", {"respond": [{"name": "approve", "ref": f"x{n}", "output": {}}]}
            )
            await eventually(chat.status, lambda s, n=n: s.rejections > n, timeout=15)
        await eventually(lambda: _runs(client, chat.id), lambda r: len(r) >= 2, timeout=15)
        assert (await handle.describe()).run_id != first_run
        assert [p.ref for p in await chat.pending()] == [pending.ref]
        assert (await chat.status()).rejections >= SUGGEST_AFTER_EVENTS
        done = await chat.resume(respond=[pending.respond({"approved": True})])
        current = (await handle.describe()).run_id
        runs = await eventually(lambda: _runs(client, chat.id), lambda r: current in r)
        scheduled: list[str] = []
        for run_id in reversed(runs):
            hist = await client.get_workflow_handle(chat.id, run_id=run_id).fetch_history()
            scheduled += [
                e.activity_task_scheduled_event_attributes.activity_type.name
                for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
            ]
    assert done.finish_reason == FinishReason.STOP
    assert t.RUNS == {"lookup": 1}  # the completed sibling was carried over, not re-run
    responses = model.requests[-1].function_responses()
    assert [r["name"] for r in responses] == ["approve", "lookup"]
    # Across every run: one model call and the lookup before the pause, one model call after.
    assert scheduled == [MODEL_ACTIVITY, TOOL_ACTIVITY, MODEL_ACTIVITY]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_answers_racing_a_continue_as_new_at_the_pause_still_finish_the_turn(
    small_histories, model
):
    """Every few turns the pause point is where continue-as-new happens; an answer that reaches
    the new run together with its first task must still end the turn, not echo the pause."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    turns = 15
    for n in range(turns):
        model.reply(calls(("approve", {"question": f"q{n}"})), text(f"done {n}"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("assistant")
        for n in range(turns):
            (pending,) = (await chat.send(f"turn {n}")).interrupts
            done = await chat.resume(respond=[pending.respond({"approved": True})])
            assert done.finish_reason == FinishReason.STOP, (n, done)
            assert done.text == f"done {n}"
        runs = await _runs(client, chat.id)
    assert len(runs) >= 3
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_conversation_too_large_to_carry_whole_drops_its_oldest_turns(
    small_histories, model
):
    """Continue-as-new carries the conversation in one payload, which Temporal refuses at about
    2 MB; the oldest turns are dropped instead of leaving the run stuck retrying."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    turns = 10
    for n in range(turns):
        model.reply(calls(("big", {"kib": 200})), text(f"answer {n}"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("careful")
        for n in range(turns):
            res = await chat.send(f"question {n}")
            assert res.text == f"answer {n}", (n, res)
        hist = await chat.history()
        runs = await _runs(client, chat.id)
    assert len(runs) >= 3
    assert hist.dropped_messages > 0 and hist.dropped_messages % 4 == 0
    first = hist.dropped_messages // 4
    # What is kept starts at a whole turn and runs to the end.
    assert hist.messages[0].text() == f"question {first}"
    assert hist.messages[-1].text() == f"answer {turns - 1}"
    # The model's last call (before the last trim) also began at a whole turn, with no
    # function response cut off from its call.
    contents = model.requests[-1].contents
    opening = contents[0]["parts"][0]["text"]
    assert opening.startswith("question ") and int(opening.split()[1]) <= first
    assert contents[-1]["parts"][0]["functionResponse"]["name"] == "big"
    assert t.RUNS["big"] == turns
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_stream_reattached_by_offset_across_continue_as_new_has_no_gap(
    small_histories, model
):
    """Offsets go on increasing in the next run; a follower that reattaches with the last offset
    it saw gets every later event once, whichever run published it."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(*[text(f"reply {i}") for i in range(10)])
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("assistant")
        seen: list[TurnEvent] = []
        for i in range(10):
            seen += [ev async for ev in chat.send_stream(f"message {i}")]
        runs = await eventually(lambda: _runs(client, chat.id), lambda r: len(r) >= 2, timeout=15)
        again: list[TurnEvent] = []
        async with asyncio.timeout(20):
            async for ev in chat.events(after=seen[3].offset):
                again.append(ev)
                if ev.offset == seen[-1].offset:
                    break
    assert len(runs) >= 2, "the conversation did not continue as new"
    offsets = [ev.offset for ev in seen]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))  # no gap, no repeat
    assert [(ev.offset, ev.kind, ev.text) for ev in again] == [
        (ev.offset, ev.kind, ev.text) for ev in seen[4:]
    ]
    assert [ev.turn for ev in seen if ev.kind == "turn_end"] == list(range(1, 11))


async def test_message_ids_are_carried_into_the_next_run(small_histories, model):
    """A send repeated after the conversation continued as new still joins its turn."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    for n in range(6):
        model.reply(calls(("lookup", {"key": f"k{n}"}, f"id-{n}")), text(f"answer {n}"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("assistant")
        sent = [await chat.send(f"question {n}", message_id=f"m-{n}") for n in range(6)]
        runs = await eventually(lambda: _runs(client, chat.id), lambda r: len(r) >= 2, timeout=15)
        again = await chat.send("question 5", message_id="m-5")
        with pytest.raises(SendRejected, match="started turn 5; the conversation has moved on"):
            await chat.send("question 4", message_id="m-4")
        status = await chat.status()
    assert len(runs) >= 2
    assert again.repeat and again.model_copy(update={"repeat": False}) == sent[-1]
    assert status.turns == 6 and model.calls == 12
    await assert_no_workflow_task_failed(client, chat.id)

"""Attacks on the workflow core in parts (``git diff 1028060 -- workflows/``).

The turn and the conversation were split into parts that share what the run decides by:
:class:`~workflows.door.Handling` (the update handlers at work, the answers on their way to a
sub-agent, the signals taken, the turn waiters) and the turn machine's cancellation. These
tests hold the invariants that depend on that sharing, from outside, as someone with namespace
credentials would reach them: raw signals and updates against a real worker.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateStage

from temporal_agent_interrupts import AgentError, FinishReason, approve
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.config import (
    SUB_AGENT_RESUME_ACTIVITY,
    SUB_AGENT_SIGNAL,
)
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.state import ConversationState
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    CancelInput,
    SendInput,
    ToolRestart,
    TurnResult,
)
from tests import agents as t
from tests.agents import SUB_RUNS, supervisor
from tests.helpers import assert_no_workflow_task_failed, events_of, eventually, history


async def _runs(client: Client, chat_id: str) -> list[str]:
    """The run ids of a conversation's chain, oldest first."""
    found = [w async for w in client.list_workflows(f'WorkflowId = "{chat_id}"')]
    return [w.run_id for w in sorted(found, key=lambda w: w.start_time)]


# ----------------------------------------------------------------------------------------------
# The turn waiters' cap is one count for both ways of waiting: a message sent again (its send
# joins the running turn) and await_turn. Each waiter holds one of Temporal's ten in-flight
# updates for as long as the turn runs.


async def _accepted_send_repeat(client: Client, chat_id: str, message_id: str, text_: str):
    """A raw ``send`` update repeating a message, once the workflow has accepted it (its handler
    has started, so it holds a waiter's slot)."""
    return await client.get_workflow_handle(chat_id).start_update(
        "send",
        SendInput(text=text_, message_id=message_id),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=TurnResult,
        id=f"repeat-{uuid.uuid4()}",
    )


async def _accepted_await_turn(client: Client, chat_id: str):
    return await client.get_workflow_handle(chat_id).start_update(
        "await_turn",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=TurnResult,
        id=f"wait-{uuid.uuid4()}",
    )


async def test_repeated_sends_fill_the_turn_waiters_cap_that_await_turn_then_meets(
    run_worker, model, client
):
    """Repeats of the running turn's message take the waiters' slots; an ``await_turn`` (and
    a further repeat) is then refused at once, and a cancel still gets in."""
    model.reply(calls(("slow", {"key": "k", "seconds": 60}, "s1")), text("never"))
    async with run_worker(agents=[t.careful]) as agents:
        chat = await agents.chat("careful")
        sending = asyncio.create_task(chat.send("be slow", message_id="m1"))
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1)
        repeats = [
            await _accepted_send_repeat(client, chat.id, "m1", "be slow")
            for _ in range(RUN.turn_waiters)
        ]
        with pytest.raises(AgentError, match="already wait for this turn"):
            await chat.last_turn()
        with pytest.raises(AgentError, match="already wait for this turn"):
            await chat.send("be slow", message_id="m1")
        cancelled = await chat.cancel("enough")
        results = [await r.result() for r in repeats]
        sent = await sending
    assert cancelled.finish_reason == FinishReason.CANCELLED == sent.finish_reason
    assert all(r.finish_reason == FinishReason.CANCELLED and r.repeat for r in results)
    assert t.RUNS["slow"] == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_turn_waits_fill_the_cap_that_a_repeated_send_then_meets(run_worker, model, client):
    """The other way round: ``await_turn`` callers hold the slots, and a repeat of the running
    turn's message is refused at once (it would wait as they do)."""
    model.reply(calls(("slow", {"key": "k", "seconds": 60}, "s1")), text("never"))
    async with run_worker(agents=[t.careful]) as agents:
        chat = await agents.chat("careful")
        sending = asyncio.create_task(chat.send("be slow", message_id="m1"))
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1)
        waits = [await _accepted_await_turn(client, chat.id) for _ in range(RUN.turn_waiters)]
        with pytest.raises(AgentError, match="already wait for this turn"):
            await chat.send("be slow", message_id="m1")
        # By raw update too: the validator refuses it, so it leaves no trace in history.
        with pytest.raises(WorkflowUpdateFailedError):
            await client.get_workflow_handle(chat.id).execute_update(
                "send", SendInput(text="be slow", message_id="m1"), result_type=TurnResult
            )
        cancelled = await chat.cancel("enough")
        results = [await w.result() for w in waits]
        sent = await sending
    assert cancelled.finish_reason == FinishReason.CANCELLED == sent.finish_reason
    assert all(r.finish_reason == FinishReason.CANCELLED for r in results)
    hist = await assert_no_workflow_task_failed(client, chat.id)
    accepted = events_of(hist, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    # The first send, the waits and the cancel: no refused repeat is in history.
    assert len(accepted) == 1 + RUN.turn_waiters + 1


# ----------------------------------------------------------------------------------------------
# An answer by signal for a sub-agent's interrupt is passed on by an activity the signal
# handler starts. The run must not continue as new before it has reached the sub-agent: the
# answer would be dropped, unrecorded (Handling.forwarding, shared by the signal handler and
# the run's continue-as-new decision, and the sub-agent call's may_detach).


def _delegate(to: str, amount: float) -> str:
    task = f"call pay {json.dumps({'to': to, 'amount': amount})}"
    return f"call payments {json.dumps({'input': task})}"


async def test_an_answer_forwarded_by_signal_holds_continue_as_new_until_it_lands(client):
    """The signal that takes the run past its signal allowance (``RUN.can_signals``) is the
    answer for the sub-agent: the run continues as new only once the answer has reached the
    child, which then runs the payment once; nothing is rejected."""
    to = f"fwd_{uuid.uuid4().hex[:8]}"
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(_delegate(to, 5))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.chat_id is not None
        handle = client.get_workflow_handle(parent.id)
        first = (await handle.describe()).run_id
        # Reports naming the real child: hints (each a read of the child), not rejections.
        for _ in range(RUN.can_signals - 1):
            await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": i.chat_id})
        answer = approve(i).model_dump(mode="json")
        key = "restart" if isinstance(approve(i), ToolRestart) else "respond"
        await handle.signal("resume", {key: [answer], "identity": "alice"})
        # The turn ends once the child has taken the answer; an answer dropped with the run
        # would leave it waiting on the child for good.
        try:
            done = await asyncio.wait_for(parent.last_turn(), timeout=60)
        except TimeoutError:
            pytest.fail("the answer passed on by signal never reached the sub-agent")
        assert done is not None and done.finish_reason == FinishReason.STOP, done
        assert "paid" in done.text
        assert SUB_RUNS[to] == 1
        assert await parent.rejections() == []
    # In the run the answer came to, it was passed on, and the child took it, before that run
    # ended: continue-as-new waited for it.
    hist = await history(client, parent.id, run_id=first)
    scheduled = {
        e.event_id
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        if e.activity_task_scheduled_event_attributes.activity_type.name
        == SUB_AGENT_RESUME_ACTIVITY
    }
    assert len(scheduled) == 1, "the answer was not passed on in the run it came to"
    completed = [
        e
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        if e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
    ]
    assert completed, "the run ended before the answer it took had reached the sub-agent"
    # The answer came when the run was due to continue as new (its signal allowance taken),
    # and the run did continue as new, after it.
    taken, found = _signals_up_to_resume(hist)
    assert found and taken >= RUN.can_signals, (taken, found)
    assert len(await _runs(client, parent.id)) >= 2


def _signals_up_to_resume(hist) -> tuple[int, bool]:
    """How many signals the run took up to and including its first ``resume`` signal, and
    whether it had one."""
    n = 0
    for e in events_of(hist, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED):
        n += 1
        if e.workflow_execution_signaled_event_attributes.signal_name == "resume":
            return n, True
    return n, False


# ----------------------------------------------------------------------------------------------
# The wiring of the turn's parts, without a server: one runner (one activity count, so every
# sealed activity id is new), one cancellation read live by every part that asks, and no
# sub-agent detach while a tool runs or a cancellation is under way.


def _machine(*, can_now: bool) -> TurnMachine:
    return TurnMachine(ConversationState(agent="a"), publish=lambda: None, can_now=lambda: can_now)


def test_the_turns_parts_share_one_activity_runner():
    m = _machine(can_now=False)
    assert m.children._runner is m.runner
    assert m.tools._runner is m.runner
    assert m.model._runner is m.runner
    assert m.sub_agents._children is m.children and m.tools._sub_agents is m.sub_agents


def test_every_part_reads_the_turns_cancellation_as_it_is_now():
    m = _machine(can_now=False)
    assert not m.runner._cancelling() and not m.waits._cancelling()
    m.cancel = CancelInput(reason="stop", identity="alice")
    assert m.runner._cancelling() and m.waits._cancelling()
    m.cancel = None
    assert not m.runner._cancelling() and not m.waits._cancelling()


def test_a_deadline_that_cancels_sets_the_machines_cancellation_as_a_deadlines():
    m = _machine(can_now=False)
    m.waits._cancel_by_deadline(CancelInput(reason="nobody answered", identity="system:deadline"))
    assert m.cancel is not None and m.cancel.reason == "nobody answered"
    assert m._cancel_via == "deadline"
    assert m.runner._cancelling() and m.waits._cancelling()


def test_sub_agents_never_detach_while_a_tool_runs_or_a_cancel_is_under_way():
    m = _machine(can_now=True)
    assert m.sub_agents._may_detach()
    m.tools.running = 1
    assert not m.sub_agents._may_detach()
    m.tools.running = 0
    m.cancel = CancelInput(reason="stop")
    assert not m.sub_agents._may_detach()
    m.cancel = None
    assert not _machine(can_now=False).sub_agents._may_detach()

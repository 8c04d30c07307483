"""Attack review of the session's new ways in: ``activity_ending`` (the sealed read of how one of
a conversation's own activities ended), a streaming model call's share of the run's publish
signals (``ModelInput.stream_signals``), and the sealed heartbeat of ``sub_agent_resume``.

Three tests failed on the defect each names (a cancel lost during the check, a retried stream
spending the share again, a heartbeat erased by id turning a taken answer into a refusal); the
fixes are in the commits after them. The others show an attack that holds, on a behaviour no
other test asserts."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.api.workflowservice.v1 import RecordActivityTaskHeartbeatByIdRequest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval, approve
from temporal_agent_interrupts.activities.endings import activity_ending
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.activity_io import (
    ActivityEndingInput,
)
from temporal_agent_interrupts.workflows.config import (
    ACTIVITY_ENDING_ACTIVITY,
    SUB_AGENT_RESUME_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL
from temporal_agent_interrupts.workflows.types import TurnResult
from tests import agents as t
from tests.agents import supervisor
from tests.helpers import eventually
from tests.scenarios import _chain
from tests.test_sealed_results import Held, _activity_rejections, _scheduled
from tests.test_sealed_results_attacks import (
    _complete_raw,
    _fail_raw,
    _json,
    _model_id,
    _timeout,
)
from tests.test_sub_agents_continue import _paused


def _env(**info: object) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, **info)
    return env


@pytest.mark.parametrize(
    "info",
    [
        {"workflow_type": "SomeOtherWorkflow"},
        {"workflow_type": WORKFLOW_TYPE, "workflow_id": ""},
        {"workflow_type": None, "workflow_id": None, "workflow_run_id": None},
    ],
    ids=["another-workflow-type", "no-workflow-id", "standalone"],
)
async def test_activity_ending_is_refused_outside_a_conversation(info: dict[str, object]):
    """Started by a workflow of another type (or with no workflow to read), ``activity_ending``
    refuses before it reads any history: it never answers about a workflow it was not
    scheduled by."""
    with pytest.raises(ApplicationError) as raised:
        await _env(**info).run(activity_ending, ActivityEndingInput(activity_id="model.1.x"))
    assert raised.value.type == "NotScheduledByConversation"
    assert raised.value.non_retryable


async def _publishes(client: Client, chat_id: str, run_id: str | None = None) -> int:
    """Publish signals in the chat's run ``run_id`` (None: its current run)."""
    handle = client.get_workflow_handle(chat_id, run_id=run_id)
    events = [e async for e in handle.fetch_history_events()]
    return sum(
        1
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == PUBLISH_SIGNAL
    )


_RETRYABLE = Failure(
    message="forged",
    application_failure_info=ApplicationFailureInfo(type="Transient", non_retryable=False),
)


async def test_a_retried_streaming_call_stays_within_the_runs_share(run_worker, model, client):
    """A streaming model call whose first attempt fails by id after it has streamed (a
    retryable failure sent by id, which the server retries without the workflow or the stale
    attempt hearing of it): the stale attempt streams on until its heartbeat learns it is
    stale, and a retried attempt publishes nothing (only the first spends the call's share), so
    the run's publishes stay within ``RUN.stream_signals`` and its other signals (an answer
    sent by script, a sub-agent's report) keep the room the share was to leave them."""
    words = " ".join(f"w{k}" for k in range(60))
    reply = Reply.streamed(text(words), pieces=30, interval=0.25)
    model.reply(reply, reply, reply)
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        turn = chat.send_stream("go")
        following = asyncio.create_task(asyncio.wait_for(_drain(turn), 60))
        model_id = await _model_id(client, chat.id)
        # The first attempt fails by id once it has published some; it streams on (the server
        # retried it without telling it) until its next heartbeat learns it is stale. The
        # retry publishes nothing (only a first attempt does) and completes the call.
        await eventually(lambda: _publishes(client, chat.id), lambda n: n >= 5, timeout=20)
        await _fail_raw(client, chat.id, model_id, _RETRYABLE)
        assert await eventually(lambda: _attempt(client, chat.id), lambda n: n != 1) in (0, 2)
        await following
        result = await turn.result()
        # The turn's run (it continues as new after the turn, having taken its signals).
        publishes = await _publishes(client, chat.id, (await _chain(client, chat.id))[0])
    assert result.finish_reason == FinishReason.STOP, result
    assert publishes <= RUN.stream_signals, publishes


async def _attempt(client: Client, chat_id: str) -> int:
    """The attempt the chat's pending model call is on (0: none pending)."""
    desc = await client.get_workflow_handle(chat_id).describe()
    return max((a.attempt for a in desc.raw_description.pending_activities), default=0)


async def _drain(turn) -> None:
    async for _ in turn:
        pass


async def _scheduled_any(client: Client, chat_id: str, activity: str) -> bool:
    try:
        events = [e async for e in client.get_workflow_handle(chat_id).fetch_history_events()]
    except RPCError:  # not started yet
        return False
    return any(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity
        for e in events
    )


async def _approved_until_checked(client: Client, chat: Chat) -> asyncio.Task[TurnResult]:
    """Approve the paused ``slow_charge`` and wait until its timeout is being checked
    (``activity_ending`` scheduled); returns the resume, still under way."""
    (gate,) = (await chat.send("charge 40")).interrupts
    resumed = asyncio.create_task(chat.resume(restart=[gate.restart({"tool_approved": True})]))
    await eventually(
        lambda: _scheduled_any(client, chat.id, ACTIVITY_ENDING_ACTIVITY),
        bool,
        timeout=10,
        interval=0.02,
    )
    return resumed


async def test_a_cancel_while_a_timeout_is_checked_cancels_the_turn(run_worker, model, client):
    """An approved tool times out (the server's own timeout, 1 s); while ``activity_ending``
    waits for a worker (one activity slot here, held by the timed-out tool until it returns),
    the user cancels the turn. The check's activity is cancelled and answers nothing, the
    tool's timeout is refused, and the turn still ends cancelled, the model not asked again."""
    model.reply(calls(("slow_charge", {"amount": 40})), text("asked again after the cancel"))
    async with run_worker(max_concurrent_activities=1) as agents:
        chat = await agents.chat("approvals")
        resumed = await _approved_until_checked(client, chat)
        done = await asyncio.wait_for(chat.cancel("stop"), 30)
        await asyncio.wait_for(resumed, 30)
        cancelled = await _cancel_requested(client, chat.id, ACTIVITY_ENDING_ACTIVITY)
    assert cancelled  # the cancel did land while the check was under way
    assert done.finish_reason == FinishReason.CANCELLED, done
    assert len(model.requests) == 1, len(model.requests)


async def _cancel_requested(client: Client, chat_id: str, activity: str) -> bool:
    events = [e async for e in client.get_workflow_handle(chat_id).fetch_history_events()]
    ids = {
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity
    }
    return any(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
        and e.activity_task_cancel_requested_event_attributes.scheduled_event_id in ids
        for e in events
    )


async def test_a_workflow_cancel_while_a_timeout_is_checked_asks_the_model_nothing_more(
    run_worker, model, client
):
    """As above, but the workflow itself is cancelled (``self.cancel`` is None: only the task
    is cancelling). ``_ending`` still reads the cancelled check as "unknown", but the tool
    calls run under ``asyncio.gather``, whose own cancellation reaches the turn whatever its
    children do: the model is not asked again (the model-call path has no such gather; see
    ``test_a_cancel_while_a_model_timeout_is_checked_cancels_the_turn``)."""
    model.reply(calls(("slow_charge", {"amount": 40})), text("asked again after the cancel"))
    async with run_worker(max_concurrent_activities=1) as agents:
        chat = await agents.chat("approvals")
        resumed = await _approved_until_checked(client, chat)
        handle = client.get_workflow_handle(chat.id)
        await handle.cancel()
        with pytest.raises(Exception):  # noqa: B017, PT011  # the run ends cancelled
            await asyncio.wait_for(handle.result(), 30)
        resumed.cancel()
        cancelled = await _cancel_requested(client, chat.id, ACTIVITY_ENDING_ACTIVITY)
    assert cancelled  # the cancel did land while the check was under way
    assert len(model.requests) == 1, len(model.requests)


async def test_a_cancel_while_a_model_timeout_is_checked_cancels_the_turn(client, monkeypatch):
    """A model call's heartbeat timeout (forged by id past its limit, on its last attempt; a
    server's own is the same here) makes the workflow ask ``activity_ending``; the user
    cancels the turn while that check waits for a worker. The check's cancelled activity was
    read as "no sealed answer", the timeout refused, and the model asked again: the turn ended
    with the new reply, STOP, and the cancel was answered with that."""
    monkeypatch.setattr(config, "MODEL_HEARTBEAT", timedelta(seconds=1))
    monkeypatch.setattr(config, "MODEL_RETRY", RetryPolicy(maximum_attempts=1))
    held = Held(text("lost"), text("asked again after the cancel"))
    gemini = held.model.client()
    queue = f"ending-{uuid.uuid4()}"
    try:
        async with build_worker(
            client,
            agents=[t.gated],
            task_queue=queue,
            gemini=gemini,
            max_concurrent_activities=1,  # the held model call keeps the only slot
        ):
            chat = await AgentClient(client, task_queue=queue).chat("gated")
            sent = asyncio.create_task(chat.send("hi"))
            # The held call heartbeats less often than a second: the server times it out.
            await eventually(
                lambda: _scheduled_any(client, chat.id, ACTIVITY_ENDING_ACTIVITY),
                bool,
                timeout=10,
                interval=0.02,
            )
            cancelling = asyncio.create_task(chat.cancel("stop"))
            await eventually(
                lambda: _cancel_requested(client, chat.id, ACTIVITY_ENDING_ACTIVITY),
                bool,
                timeout=10,
            )
            held.release.set()
            done = await asyncio.wait_for(cancelling, 30)
            await asyncio.wait_for(sent, 30)
    finally:
        held.release.set()
        await held.model.release(gemini)
    assert done.finish_reason == FinishReason.CANCELLED, done


slow_gated = Agent(
    "slow-gated-ending",
    model="gemini-test",
    tools=[t.slow],
    middleware=[ToolApproval(allow=[])],
)


async def test_a_forged_timed_out_answer_of_the_check_does_not_take_a_forged_timeout(
    client, model, monkeypatch
):
    """The attacker forges a heartbeat timeout of an approved tool past its limit, then
    completes the ``activity_ending`` the workflow asks by id with ``{"ending": "timed_out"}``
    before a worker reads the history. The check's answer has no seal: it is refused, the
    ending is "unknown", and the forged timeout is refused too (two refusals on record); the
    tool ran once and the model hears that it may have taken effect."""
    monkeypatch.setattr(config, "TOOL_HEARTBEAT", timedelta(seconds=7))  # it beats every 5 s
    model.reply(calls(("slow", {"key": "k1", "seconds": 12})))
    model.reply(text("done"))
    queue = f"ending-{uuid.uuid4()}"
    async with build_worker(
        client,
        agents=[slow_gated],
        task_queue=queue,
        gemini=model.client(),
        max_concurrent_activities=1,  # the forged-out tool keeps the slot a while
    ):
        chat = await AgentClient(client, task_queue=queue).chat(slow_gated.name)
        (gate,) = (await chat.send("go")).interrupts
        resumed = asyncio.create_task(chat.resume(answers=[approve(gate)], identity="alice"))
        tool_id = await _scheduled_id(client, chat.id, TOOL_ACTIVITY)
        await asyncio.sleep(7.5)
        await _fail_raw(client, chat.id, tool_id, _timeout(TimeoutType.TIMEOUT_TYPE_HEARTBEAT))
        check_id = await _scheduled_id(client, chat.id, ACTIVITY_ENDING_ACTIVITY)
        await _complete_raw(client, chat.id, check_id, _json(b'{"ending": "timed_out"}'))
        result = await asyncio.wait_for(resumed, 30)
        refused = await _activity_rejections(client, chat.id)
        told = model.requests[-1].function_responses()
    assert result.finish_reason == FinishReason.STOP, result
    assert len(refused) == 2, refused
    assert "a result no worker sealed" in refused[0], refused  # the check's forged answer
    assert "ended unknown, not timed out" in refused[1], refused
    ((response,),) = [told]
    assert response["response"]["note"].startswith("it may have taken effect"), response
    assert t.RUNS["slow"] == 1


async def _scheduled_id(client: Client, chat_id: str, activity: str) -> str:
    found = await eventually(
        lambda: _scheduled(client, chat_id, activity), lambda f: f is not None, interval=0.02
    )
    assert found is not None
    return found


async def _heartbeat_recorded(client: Client, chat_id: str, activity_id: str) -> None:
    """Until the server has a heartbeat of the pending activity ``activity_id``: scheduled is
    not started, and on a loaded machine the worker's first heartbeat can come late."""

    async def pending() -> Any:
        described = await client.get_workflow_handle(chat_id).describe()
        found = described.raw_description.pending_activities
        return next((a for a in found if a.activity_id == activity_id), None)

    await eventually(
        pending, lambda a: a is not None and a.HasField("last_heartbeat_time"), timeout=30
    )


class _HoldAfterArmed:
    """The offline model, whose first call after ``armed`` is set waits until ``release``."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.release = threading.Event()
        self._held = False

    def __call__(self, request: Any) -> Any:
        if self.armed.is_set() and not self._held:
            self._held = True
            self.release.wait(20)
        return offline_rules(request)


async def test_a_heartbeat_overwritten_by_id_does_not_turn_a_taken_answer_into_a_refusal(
    client,
):
    """The sealed heartbeat keeps an attacker from choosing the update id (tested elsewhere),
    but not from erasing it: a heartbeat by id with anything else, then a retryable failure by
    id, and the retry is the "worker lost before its first heartbeat" case, forced."""
    hold = _HoldAfterArmed()
    async with hosted(client, agents=[supervisor], model=ScriptedModel(hold)) as agents:
        parent = await agents.chat("supervisor")
        i, _child_id = await _paused(parent, 6, "hb_erase")
        hold.armed.set()
        resumed = asyncio.create_task(parent.resume(answers=[approve(i)], identity="alice"))
        try:
            resume_id = await _scheduled_id(client, parent.id, SUB_AGENT_RESUME_ACTIVITY)
            await _heartbeat_recorded(client, parent.id, resume_id)  # its first, at once
            run_id = (await client.get_workflow_handle(parent.id).describe()).run_id or ""
            await client.workflow_service.record_activity_task_heartbeat_by_id(
                RecordActivityTaskHeartbeatByIdRequest(
                    namespace=client.namespace,
                    workflow_id=parent.id,
                    run_id=run_id,
                    activity_id=resume_id,
                    details=Payloads(payloads=[_json(b'"erased"')]),
                    identity="attacker",
                )
            )
            await _fail_raw(client, parent.id, resume_id, _RETRYABLE)
            await asyncio.sleep(2.5)  # the retry (1 s backoff) asks the sub-agent
        finally:
            hold.release.set()
        done = await asyncio.wait_for(resumed, 30)
    assert done.finish_reason == FinishReason.STOP, done

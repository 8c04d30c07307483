"""Attack review of the session's new ways in: ``activity_ending`` (the sealed read of how one of
a conversation's own activities ended), a streaming model call's share of the run's publish
signals (``ModelInput.stream_signals``), and the sealed heartbeat of ``sub_agent_resume``.

Each ``xfail(strict=True)`` test fails on the defect it names; the others show an attack that
holds, on a behaviour no other test asserts."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.activities.endings import activity_ending
from temporal_agent_interrupts.worker.standin import Reply, text
from temporal_agent_interrupts.workflows.config import WORKFLOW_TYPE
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL
from temporal_agent_interrupts.workflows.types import ActivityEndingInput
from tests.helpers import eventually
from tests.scenarios import _chain
from tests.test_sealed_results_attacks import _fail_raw, _model_id


def _env(**info: object) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, **info)
    return env


@pytest.mark.parametrize(
    "info",
    [
        {"workflow_type": "SomeOtherWorkflow"},
        {"workflow_type": WORKFLOW_TYPE, "workflow_id": ""},
    ],
    ids=["another-workflow-type", "no-workflow-id"],
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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a streaming model call's share (ModelInput.stream_signals) is per attempt: every retry "
        "of the call (MODEL_RETRY, 5 attempts) and every re-ask after an unsealed result sends "
        "up to the whole share again, so one call can spend more than RUN.stream_signals"
    ),
)
async def test_a_retried_streaming_call_stays_within_the_runs_share(run_worker, model, client):
    """A streaming model call whose attempts fail after they have streamed (a transient error
    mid-reply, or a retryable failure sent by id, which the server retries without the workflow
    hearing of it) publishes afresh on each attempt (``"<key>:<attempt>"``, sequence from 1),
    each with the share computed once when the call was scheduled. Here three attempts spend
    more than ``RUN.stream_signals`` between them: the run's other signals (an answer sent by
    script, a sub-agent's report) lose the room the share was to leave them."""
    words = " ".join(f"w{k}" for k in range(60))
    reply = Reply.streamed(text(words), pieces=30, interval=0.25)
    model.reply(reply, reply, reply)
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        turn = chat.send_stream("go")
        following = asyncio.create_task(asyncio.wait_for(_drain(turn), 60))
        model_id = await _model_id(client, chat.id)
        for spent in (5, 10):
            await eventually(
                lambda: _publishes(client, chat.id), lambda n, s=spent: n >= s, timeout=20
            )
            await _fail_raw(client, chat.id, model_id, _RETRYABLE)
        await following
        result = await turn.result()
        # The turn's run (it continues as new after the turn, having taken its signals).
        publishes = await _publishes(client, chat.id, (await _chain(client, chat.id))[0])
    assert result.finish_reason == FinishReason.STOP, result
    assert publishes <= RUN.stream_signals, publishes


async def _drain(turn) -> None:
    async for _ in turn:
        pass

"""The session's attack review (issue 44): on the sealed input reads, the checks of failures of
the server's own kinds, and a caller that continues as new while it waits on its sub-agent.
Each test failed on the defect it names; the fixes are in the commits after it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any, cast

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure, TimeoutFailureInfo
from temporalio.client import Client

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval, approve
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import config
from temporal_agent_interrupts.workflows.config import SUB_AGENT_SIGNAL
from temporal_agent_interrupts.workflows.limits import RUN
from tests import agents as t
from tests.agents import SUB_RUNS as RUNS
from tests.agents import supervisor
from tests.helpers import events_of, eventually, history
from tests.test_sealed_results import _activity_rejections
from tests.test_sealed_results_attacks import (
    _fail_raw,
    _model_call_failed_by_id,
    _timeout,
    _tool_id,
)
from tests.test_sub_agents_continue import _paused


async def _signals_in_run(client: Client, chat_id: str, run_id: str) -> int:
    hist = await history(client, chat_id, run_id=run_id)
    return len(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED))


async def test_an_answer_by_signal_for_a_sub_agent_survives_the_callers_continue_as_new(client):
    """Someone who may signal fills the caller's run to one signal short of its cap; the
    person's answer by signal is the last one, and the caller continues as new at once,
    while the answer is on its way to the sub-agent."""
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        i, child_id = await _paused(parent, 6, "cas_sig")
        handle = client.get_workflow_handle(parent.id)
        first = (await handle.describe()).run_id
        already = await _signals_in_run(client, parent.id, first)
        for _ in range(RUN.can_signals - 1 - already):
            await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": child_id})
        await eventually(
            lambda: _signals_in_run(client, parent.id, first),
            lambda n: n == RUN.can_signals - 1,
        )
        await asyncio.sleep(1)  # the reports read
        assert (await handle.describe()).run_id == first
        body = {"restart": [approve(i).model_dump(mode="json")], "identity": "alice"}
        await handle.signal("resume", body)
        # Polled by query (an update would hold the run from continuing as new).
        await eventually(parent.status, lambda s: s.status == "idle", timeout=20)
        assert RUNS["cas_sig"] == 1
        done = await parent.last_turn()
        assert done is not None and done.finish_reason == FinishReason.STOP, done


HEARTBEAT = timedelta(seconds=7)
"""The approved tool's heartbeat limit in the test below (``config.TOOL_HEARTBEAT`` is 30 s)."""

slow_gated = Agent(
    "slow-gated", model="gemini-test", tools=[t.slow], middleware=[ToolApproval(allow=[])]
)


async def test_a_heartbeat_timeout_by_id_does_not_replace_an_approved_tools_result(
    client, model, monkeypatch
):
    """A heartbeat timeout says the worker stopped heartbeating for the heartbeat limit, not
    that the limit has passed since the call was scheduled: the approved tool heartbeats all
    along (its worker is alive), and the server would never time it out so.

    The limit is 7 s here instead of the 30 s of ``config.TOOL_HEARTBEAT`` (the tool beats every
    5 s, as ``test_ending_attacks`` has it): what is proved is that the limit passed, not how
    long it is, and the test waited it out."""
    monkeypatch.setattr(config, "TOOL_HEARTBEAT", HEARTBEAT)
    model.reply(calls(("slow", {"key": "k1", "seconds": HEARTBEAT.total_seconds() + 6})))
    model.reply(text("done"))
    queue = f"attack-{uuid.uuid4()}"
    async with build_worker(client, agents=[slow_gated], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("slow-gated")
        paused = await chat.send("go")
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        resumed = asyncio.create_task(chat.resume(answers=[approve(i)], identity="alice"))
        tool_id = await _tool_id(client, chat.id)
        await asyncio.sleep(HEARTBEAT.total_seconds() + 1)
        assert t.RUNS["slow_finished"] == 0  # still running, heartbeating
        await _fail_raw(client, chat.id, tool_id, _timeout(TimeoutType.TIMEOUT_TYPE_HEARTBEAT))
        result = await asyncio.wait_for(resumed, 30)
        assert result.finish_reason == FinishReason.STOP, result
        refused = await _activity_rejections(client, chat.id)
        told = model.requests[-1].function_responses()
    # Not taken as the server's timeout: the history says the call was failed by id. The
    # server refuses the tool's own completion once the call is closed, so its output is lost
    # as with any ending sent by id, and the model hears that it may have taken effect; the
    # refusal is on record, and the tool ran once.
    assert len(refused) == 1 and "history says the call ended failed" in refused[0], refused
    ((response,),) = [told]
    assert "timed out and was not retried" not in str(response["response"]), response
    assert "not timed out" in response["response"]["error"], response
    assert response["response"]["note"].startswith("it may have taken effect"), response
    assert t.RUNS["slow"] == 1


# Failures by id whose enum fields hold values the SDK has no member for: it converts them in
# the workflow's activation (TimeoutType(99), ApplicationErrorCategory(99)), and raised there
# on every replay until codec._known_enums read them as unspecified (refused, unsealed).
UNKNOWN_ENUMS: dict[str, Failure] = {
    "timeout-type": Failure(
        message="timed out", timeout_failure_info=TimeoutFailureInfo(timeout_type=cast(Any, 99))
    ),
    "timeout-type-in-cause": Failure(
        message="forged",
        application_failure_info=ApplicationFailureInfo(type="X", non_retryable=True),
        cause=Failure(
            message="timed out",
            timeout_failure_info=TimeoutFailureInfo(timeout_type=cast(Any, 99)),
        ),
    ),
    "application-category": Failure(
        message="forged",
        application_failure_info=ApplicationFailureInfo(
            type="X", non_retryable=True, category=cast(Any, 99)
        ),
    ),
}


@pytest.mark.parametrize("failure", list(UNKNOWN_ENUMS.values()), ids=list(UNKNOWN_ENUMS))
async def test_a_failure_by_id_with_an_unknown_enum_value_fails_no_workflow_task(client, failure):
    result, _ = await _model_call_failed_by_id(client, failure)
    assert result.finish_reason == FinishReason.STOP and result.text == "hello", result

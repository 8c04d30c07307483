"""Session review attacks on the sealed input reads, the server-kind failure checks and the
sub-agent continue-as-new (git diff ea43a67..9ac6ea6)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any, cast

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure, TimeoutFailureInfo
from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval, approve
from temporal_agent_interrupts.activities import subagents
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.config import SUB_AGENT_SIGNAL, TOOL_HEARTBEAT
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.types import (
    PendingResult,
    SubAgentEnd,
    SubAgentPendingInput,
)
from tests import agents as t
from tests.agents import SUB_RUNS as RUNS
from tests.agents import supervisor
from tests.helpers import events_of, eventually, history
from tests.test_sealed_results_attacks import (
    _fail_raw,
    _model_call_failed_by_id,
    _timeout,
    _tool_id,
)
from tests.test_sub_agents_continue import _flood_until_continued, _paused


async def _squat_when_closed(client: Client, child_id: str, stop: asyncio.Event) -> bool:
    """Start a workflow of the attacker's under ``child_id`` the moment the child closes."""
    while not stop.is_set():
        try:
            await client.start_workflow(
                "attacker-anything", id=child_id, task_queue="attacker-queue-nobody-polls"
            )
            return True
        except WorkflowAlreadyStartedError:
            continue
    return False


@pytest.mark.xfail(
    strict=True,
    reason=(
        "sub_agent_pending describes the id's latest chain: a workflow started under the "
        "child's id once it closed hides the child's completed result, and the continued "
        "caller records the call as 'gone' (uncertain) instead of its outcome"
    ),
)
async def test_a_workflow_started_under_a_closed_childs_id_does_not_hide_its_result(
    client, monkeypatch: pytest.MonkeyPatch
):
    # The caller's read of its child is slower than the attacker's start (a busy worker, a
    # backlog on the queue): deterministic here, a race an attacker polling the id often wins.
    read = subagents._pending

    async def slow_read(input: SubAgentPendingInput) -> PendingResult | SubAgentEnd:
        await asyncio.sleep(1)
        return await read(input)

    monkeypatch.setattr(subagents, "_pending", slow_read)
    async with hosted(client, agents=[supervisor], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("supervisor")
        i, child_id = await _paused(parent, 5, "cas_sq")
        await _flood_until_continued(client, parent, child_id)
        await eventually(parent.pending, lambda p: [x.ref for x in p] == [i.ref])
        stop = asyncio.Event()
        squat = asyncio.create_task(_squat_when_closed(client, child_id, stop))
        # Answered on the child's own chat: the child completes (it ran the payment).
        child_chat = await agents.chat("payments", chat_id=child_id)
        await child_chat.resume(answers=[approve(i)], identity="alice")
        assert RUNS["cas_sq"] == 1
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        stop.set()
        squatted = await squat
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(child_id).terminate("cleanup")
        assert squatted
        assert done is not None
        # The child completed and paid: the caller's record says so.
        assert done.finish_reason == FinishReason.STOP, done


async def _signals_in_run(client: Client, chat_id: str, run_id: str) -> int:
    hist = await history(client, chat_id, run_id=run_id)
    return len(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED))


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a resume signal forwarded to a sub-agent runs in a side task _can_now does not wait "
        "for: the caller detaches and continues as new in the same workflow task that "
        "schedules sub_agent_resume, and the answer is dropped with no rejection recorded"
    ),
)
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


slow_gated = Agent(
    "slow-gated", model="gemini-test", tools=[t.slow], middleware=[ToolApproval(allow=[])]
)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "_check_server_kind measures a heartbeat timeout against the time since scheduling: "
        "past 30 s, anyone may fail a heartbeating approved tool by id with a heartbeat "
        "timeout, and its real output is replaced by 'timed out, may have taken effect'"
    ),
)
async def test_a_heartbeat_timeout_by_id_does_not_replace_an_approved_tools_result(client, model):
    """A heartbeat timeout says the worker stopped heartbeating for the heartbeat limit, not
    that the limit has passed since the call was scheduled: the approved tool heartbeats all
    along (its worker is alive), and the server would never time it out so."""
    model.reply(calls(("slow", {"key": "k1", "seconds": TOOL_HEARTBEAT.total_seconds() + 6})))
    model.reply(text("done"))
    queue = f"attack-{uuid.uuid4()}"
    async with build_worker(client, agents=[slow_gated], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("slow-gated")
        paused = await chat.send("go")
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        resumed = asyncio.create_task(chat.resume(answers=[approve(i)], identity="alice"))
        tool_id = await _tool_id(client, chat.id)
        await asyncio.sleep(TOOL_HEARTBEAT.total_seconds() + 1)
        assert t.RUNS["slow_finished"] == 0  # still running, heartbeating
        await _fail_raw(client, chat.id, tool_id, _timeout(TimeoutType.TIMEOUT_TYPE_HEARTBEAT))
        result = await asyncio.wait_for(resumed, 30)
        assert result.finish_reason == FinishReason.STOP, result
        history_ = await chat.history()
        # The model hears the tool's real output, not "timed out, may have taken effect".
        assert "timed out" not in history_.model_dump_json()


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

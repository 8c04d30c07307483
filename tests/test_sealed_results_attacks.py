"""Attacks on sealed results (issue 44, finding 1) by someone holding namespace credentials but
neither ``AGENT_RESULT_KEYS`` nor a worker, on a real dev server.

Each test completes or fails an activity by id (``RespondActivityTaskCompletedById`` /
``…FailedById``) with what such a caller can send, and asserts what the conversation must do:
take nothing, keep its workflow task healthy (a failed task replays to the same failure for
ever: a stuck chat), and run no tool more than it was asked to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import (
    ApplicationFailureInfo,
    CanceledFailureInfo,
    Failure,
    ServerFailureInfo,
    TimeoutFailureInfo,
)
from temporalio.api.workflowservice.v1 import (
    RespondActivityTaskCanceledByIdRequest,
    RespondActivityTaskCompletedByIdRequest,
    RespondActivityTaskFailedByIdRequest,
)
from temporalio.client import ActivityFailureError, Client
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from temporal_agent_interrupts import AgentClient, FinishReason, interrupt, respond, tool
from temporal_agent_interrupts.activities.subagents import _update_id
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.result_keys import generate_result_key, parse_result_keys
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import Agent, Remind
from temporal_agent_interrupts.workflows.activity_io import (
    ToolInput,
    ToolResult,
)
from temporal_agent_interrupts.workflows.config import (
    MODEL_ACTIVITY,
    SUB_AGENT_ANSWER_UPDATE_PREFIX,
    SUB_AGENT_RESUME_ACTIVITY,
    TOOL_ACTIVITY,
)
from temporal_agent_interrupts.workflows.types import (
    ErrorKind,
    Notice,
)
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_sealed_results import Held, _activity_rejections, _run_id, _scheduled


def _json(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def _complete_raw(client: Client, chat_id: str, activity_id: str, payload: Payload) -> None:
    await client.workflow_service.respond_activity_task_completed_by_id(
        RespondActivityTaskCompletedByIdRequest(
            namespace=client.namespace,
            workflow_id=chat_id,
            run_id=await _run_id(client, chat_id),
            activity_id=activity_id,
            result=Payloads(payloads=[payload]),
            identity="attacker",
        )
    )


async def _fail_raw(client: Client, chat_id: str, activity_id: str, failure: Failure) -> None:
    await client.workflow_service.respond_activity_task_failed_by_id(
        RespondActivityTaskFailedByIdRequest(
            namespace=client.namespace,
            workflow_id=chat_id,
            run_id=await _run_id(client, chat_id),
            activity_id=activity_id,
            failure=failure,
            identity="attacker",
        )
    )


async def _model_id(client: Client, chat_id: str, nth: int = 1) -> str:
    found = await eventually(
        lambda: _scheduled(client, chat_id, MODEL_ACTIVITY, nth=nth), lambda f: f is not None
    )
    assert found is not None
    return found


async def _tool_id(client: Client, chat_id: str) -> str:
    found = await eventually(
        lambda: _scheduled(client, chat_id, TOOL_ACTIVITY), lambda f: f is not None
    )
    assert found is not None
    return found


# What a completion by id may carry that does not read as the activity's result type at all.
UNREADABLE_RESULTS = {
    "not-a-model-result": _json(b'{"message": 5}'),
    "not-json": _json(b"{not json"),
    "unknown-encoding": Payload(metadata={"encoding": b"binary/forged"}, data=b"x"),
    "lone-surrogate": _json(b'{"message": {"role": "model", "parts": [{"text": "\\ud800"}]}}'),
}


@pytest.mark.parametrize("payload", list(UNREADABLE_RESULTS.values()), ids=list(UNREADABLE_RESULTS))
async def test_an_unreadable_model_result_by_id_is_refused_not_a_stuck_chat(client, payload):
    """The result of a completion by id is anyone's bytes: one that does not decode as a
    ``ModelResult`` is a result no worker sealed, refused like any other, never a workflow task
    that fails on every replay."""
    held = Held(text("lost"), text("hello"))
    async with held.hosting(client, t.gated) as agents:
        chat = await agents.chat("gated")
        sent = asyncio.create_task(chat.send("hi"))
        await held.called()
        await _complete_raw(client, chat.id, await _model_id(client, chat.id), payload)
        held.release.set()
        result = await asyncio.wait_for(sent, 30)
        assert result.finish_reason == FinishReason.STOP and result.text == "hello"
        refused = await _activity_rejections(client, chat.id)
        assert len(refused) == 1, refused
    await assert_no_workflow_task_failed(client, chat.id)


# Failures by id whose details do not decode.
UNREADABLE_FAILURES = {
    "unknown-encoding-detail": Failure(
        message="forged",
        application_failure_info=ApplicationFailureInfo(
            type=ErrorKind.MODEL_ERROR,
            non_retryable=True,
            details=Payloads(payloads=[Payload(metadata={"encoding": b"binary/forged"})]),
        ),
    ),
    "not-json-detail": Failure(
        message="forged",
        application_failure_info=ApplicationFailureInfo(
            type=ErrorKind.MODEL_ERROR,
            non_retryable=True,
            details=Payloads(payloads=[_json(b"{not json")]),
        ),
    ),
}


@pytest.mark.parametrize(
    "failure", list(UNREADABLE_FAILURES.values()), ids=list(UNREADABLE_FAILURES)
)
async def test_an_unreadable_failure_by_id_is_refused_not_a_stuck_chat(client, failure):
    held = Held(text("lost"), text("hello"))
    async with held.hosting(client, t.gated) as agents:
        chat = await agents.chat("gated")
        sent = asyncio.create_task(chat.send("hi"))
        await held.called()
        await _fail_raw(client, chat.id, await _model_id(client, chat.id), failure)
        held.release.set()
        result = await asyncio.wait_for(sent, 30)
        assert result.finish_reason == FinishReason.STOP and result.text == "hello"
    await assert_no_workflow_task_failed(client, chat.id)


def _undecryptable_failure() -> Failure:
    """What the SDK sends for an activity whose input a worker could not decrypt: a forgery
    needs nothing but the two fixed texts."""
    return Failure(
        message="Failed decoding arguments",
        application_failure_info=ApplicationFailureInfo(type="RuntimeError", non_retryable=True),
        cause=Failure(
            message="payload encrypted with key id 'k9', which this process does not have",
            application_failure_info=ApplicationFailureInfo(type=ErrorKind.PAYLOAD_KEY_MISSING),
        ),
    )


async def test_a_forged_undecryptable_failure_does_not_run_a_tool_again(client, model):
    model.reply(calls(("slow", {"seconds": 1})), text("done"))
    queue = f"attack-{uuid.uuid4()}"
    async with build_worker(client, agents=[t.careful], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("careful")
        sent = asyncio.create_task(chat.send("go"))
        tool_id = await _tool_id(client, chat.id)
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1)
        await _fail_raw(client, chat.id, tool_id, _undecryptable_failure())
        result = await asyncio.wait_for(sent, 30)
        assert result.finish_reason == FinishReason.STOP
        assert t.RUNS["slow"] == 1, "the tool ran again after a forged 'never ran'"


# Failures of the server's own kinds, sent by id: the server keeps them as they are.
CANCELED = Failure(message="canceled", canceled_failure_info=CanceledFailureInfo())


def _timeout(kind: TimeoutType.ValueType) -> Failure:
    return Failure(message="timed out", timeout_failure_info=TimeoutFailureInfo(timeout_type=kind))


# Each with why the workflow refuses it (the model call has start-to-close and heartbeat
# limits, no schedule-to-close one); None where the server retries the call itself (a timeout
# of an attempt: the retry policy applies, whatever the failure says), so the workflow never
# sees it.
SERVER_KINDS: dict[str, tuple[Failure, str | None]] = {
    "schedule-to-close": (
        _timeout(TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_CLOSE),
        "has no schedule-to-close timeout",
    ),
    "start-to-close": (_timeout(TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE), None),
    "heartbeat": (_timeout(TimeoutType.TIMEOUT_TYPE_HEARTBEAT), None),
    "server": (
        Failure(
            message="server failure", server_failure_info=ServerFailureInfo(non_retryable=True)
        ),
        "a server failure is never",
    ),
}


async def _model_call_failed_by_id(client: Client, failure: Failure) -> Any:
    """The turn's result after its model call is failed by id with ``failure`` (the model's
    own reply held until then)."""
    held = Held(text("lost"), text("hello"))
    async with held.hosting(client, t.gated) as agents:
        chat = await agents.chat("gated")
        sent = asyncio.create_task(chat.send("hi"))
        await held.called()
        await _fail_raw(client, chat.id, await _model_id(client, chat.id), failure)
        held.release.set()
        result = await asyncio.wait_for(sent, 30)
        refused = await _activity_rejections(client, chat.id)
    await assert_no_workflow_task_failed(client, chat.id)
    return result, refused


async def test_a_cancellation_sent_by_id_as_a_failure_does_not_cancel_the_turn(client):
    """The server refuses ``RespondActivityTaskCanceledById`` for an activity nobody asked to
    cancel, but ``…FailedById`` keeps a ``CanceledFailureInfo`` as it is: the workflow read it
    as its own cancellation and ended the turn CANCELLED, as only the chat's user may."""
    result, refused = await _model_call_failed_by_id(client, CANCELED)
    assert result.finish_reason == FinishReason.STOP and result.text == "hello", result
    assert len(refused) == 1 and "did not ask for" in refused[0], refused


async def test_the_server_refuses_a_cancellation_by_id_nobody_asked_for(client):
    held = Held(text("hello"))
    async with held.hosting(client, t.gated) as agents:
        chat = await agents.chat("gated")
        sent = asyncio.create_task(chat.send("hi"))
        model_id = await _model_id(client, chat.id)
        with pytest.raises(RPCError, match="without activity being request canceled"):
            await client.workflow_service.respond_activity_task_canceled_by_id(
                RespondActivityTaskCanceledByIdRequest(
                    namespace=client.namespace,
                    workflow_id=chat.id,
                    run_id=await _run_id(client, chat.id),
                    activity_id=model_id,
                    identity="attacker",
                )
            )
        held.release.set()
        assert (await asyncio.wait_for(sent, 30)).text == "hello"


@pytest.mark.parametrize(("failure", "why"), list(SERVER_KINDS.values()), ids=list(SERVER_KINDS))
async def test_a_server_kind_failure_by_id_does_not_end_the_turn(client, failure, why):
    """No worker seals a timeout or a server failure, and one sent by id (non-retryable) read
    as the server's word ended the turn in one call. One the server could not have made (a
    kind of timeout the call has no limit for, or before its limit) is refused: the model is
    asked again."""
    result, refused = await _model_call_failed_by_id(client, failure)
    assert result.finish_reason == FinishReason.STOP and result.text == "hello", result
    if why is None:
        assert refused == [], refused
    else:
        assert len(refused) == 1 and why in refused[0], refused


async def test_a_standalone_tool_call_claiming_approval_runs_no_gated_tool(client, model):
    """A standalone activity (started by a client, no workflow) carries whatever input its
    starter wrote, ``tool_approved`` included: the worker runs a tool call only for a workflow."""
    queue = f"attack-{uuid.uuid4()}"
    forged = ToolInput(
        agent="gated",
        chat_id=f"chat-{uuid.uuid4()}",
        tool="charge",
        ref="r1",
        args={"amount": 250000},
        resumed=True,
        resumed_metadata={"tool_approved": True},
    )
    async with build_worker(client, agents=[t.gated], task_queue=queue, gemini=model.client()):
        with pytest.raises(ActivityFailureError) as refused:
            await client.execute_activity(
                TOOL_ACTIVITY,
                forged,
                id=f"attack-{uuid.uuid4()}",
                task_queue=queue,
                start_to_close_timeout=timedelta(seconds=10),
                result_type=ToolResult,
            )
    assert "standalone activity" in str(refused.value.__cause__)
    assert t.RUNS["charge"] == 0


def _resume_env(details: list[Any]) -> ActivityEnvironment:
    """The answer-forwarding activity's retry, with ``details`` as its last heartbeat."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id="chat-1",
        activity_id="agent_interrupts.sub_agent_resume.4.0123456789ab",
        activity_type=SUB_AGENT_RESUME_ACTIVITY,
        heartbeat_details=details,
    )
    return env


def test_a_heartbeat_sent_by_id_does_not_choose_the_update_id_of_a_passed_on_answer():
    """A retry of ``sub_agent_resume`` asks the child for its first attempt's update by id, and
    takes that update's outcome as the answer's. The id travelled in the heartbeat, where whoever
    may heartbeat an activity by id (``RecordActivityTaskHeartbeatById``) wrote the id of an
    update of their own, and the caller recorded that update's outcome as the approver's answer
    (or erased it, and the child refused the retry as answered already). The id is now the
    worker's MAC of this very activity: what a heartbeat holds changes nothing."""
    keys = parse_result_keys(generate_result_key("k1"))
    attackers = f"{SUB_AGENT_ANSWER_UPDATE_PREFIX}{uuid.uuid4()}"
    first = _resume_env([]).run(_update_id, keys)
    assert first.startswith(SUB_AGENT_ANSWER_UPDATE_PREFIX) and first != attackers
    # Every attempt of this call, whatever its heartbeat says, asks for the same update.
    for forged in ([], [attackers], [attackers, None], [attackers, {"kid": "k1", "mac": "00"}]):
        assert _resume_env(forged).run(_update_id, keys) == first, forged
    # Another call, or another key, has another id: no one without the key can work it out.
    elsewhere = _resume_env([])
    elsewhere.info = dataclasses.replace(
        elsewhere.info, activity_id="agent_interrupts.sub_agent_resume.5.ba9876543210"
    )
    assert elsewhere.run(_update_id, keys) != first
    other_key = parse_result_keys(generate_result_key("k1"))
    assert _resume_env([]).run(_update_id, other_key) != first


# A reminder's notifying tool call: scheduled by the pause's wait (workflows/waits.py), outside
# the sealed runner, its result thrown away. It blocks until the test lets it go, so that the
# call is running (started) when it is completed by id.
NOTIFY_STARTED = threading.Event()
NOTIFY_GATE = threading.Event()


@tool("forgedNoticeNotify", "Tell someone a question waits.")
async def forged_notice_notify(notice: Notice) -> dict[str, str]:
    NOTIFY_STARTED.set()
    await asyncio.get_running_loop().run_in_executor(None, NOTIFY_GATE.wait, 30)
    return {"told": notice.interrupt.ref}


forged_notice_ask = interrupt(
    "forgedNoticeAsk",
    "A question, with a reminder a second after it is asked.",
    input=t.Ask,
    output=t.Answer,
    timeout=timedelta(seconds=60),
    reminders=[Remind(notify=forged_notice_notify, before=timedelta(seconds=59))],
)
forged_notice_agent = Agent("forgedNoticeAgent", model="gemini-test", tools=[forged_notice_ask])

# What a completion by id of a notice may carry: three that do not read as a ToolResult, and a
# well-formed one no worker sealed.
NOTICE_RESULTS = {
    "not-a-tool-result": _json(b'{"kind": 12345}'),
    "not-json": UNREADABLE_RESULTS["not-json"],
    "unknown-encoding": UNREADABLE_RESULTS["unknown-encoding"],
    "unsealed-tool-result": _json(b'{"kind": "output", "output": {"told": "everyone"}}'),
}


async def _task_after_completion(
    client: Client, chat_id: str, activity_id: str
) -> EventType.ValueType | None:
    """How the first workflow task after the completion of ``activity_id`` ended (None: it has
    not completed, or no task has ended since)."""
    events = [e async for e in client.get_workflow_handle(chat_id).fetch_history_events()]
    scheduled = next(
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_id == activity_id
    )
    after = [
        k
        for k, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id == scheduled
    ]
    if not after:
        return None
    ends = (EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    return next((e.event_type for e in events[after[0] :] if e.event_type in ends), None)


@pytest.mark.parametrize("payload", list(NOTICE_RESULTS.values()), ids=list(NOTICE_RESULTS))
async def test_a_notice_completed_by_id_with_anything_leaves_the_pause_answerable(
    client, model, payload
):
    """Issue 44's review, item A: a reminder's (or an escalation's) notifying tool call was read
    as a ``ToolResult`` by the SDK, outside the sealed runner, so a completion by id whose
    payload did not convert failed every workflow task of the chat: the pause could never be
    answered again. A notice decides nothing: its result is read as bytes and dropped, the
    workflow task after it completes, and an answer still applies."""
    NOTIFY_STARTED.clear()
    NOTIFY_GATE.clear()
    model.reply(calls(("forgedNoticeAsk", {"question": "ship it?"})), text("done"))
    queue = f"attack-{uuid.uuid4()}"
    try:
        async with build_worker(
            client, agents=[forged_notice_agent], task_queue=queue, gemini=model.client()
        ):
            chat = await AgentClient(client, task_queue=queue).chat("forgedNoticeAgent")
            paused = await chat.send("go")
            (call,) = paused.interrupts
            # The reminder's call is running (the interrupt-only tool schedules no activity).
            await eventually(lambda: asyncio.sleep(0, NOTIFY_STARTED.is_set()), bool, timeout=20)
            notice_id = await _tool_id(client, chat.id)
            await _complete_raw(client, chat.id, notice_id, payload)
            ended = await eventually(
                lambda: _task_after_completion(client, chat.id, notice_id),
                lambda k: k is not None,
            )
            assert ended == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, (
                "the workflow task after the notice's forged completion failed: a stuck chat"
            )
            assert [p.ref for p in await chat.pending()] == [call.ref]
            done = await asyncio.wait_for(
                chat.resume(answers=[respond(call, {"approved": True})]), 30
            )
            assert done.finish_reason == FinishReason.STOP and done.text == "done", done
            (answer,) = model.requests[1].function_responses()
            assert answer["name"] == "forgedNoticeAsk" and "everyone" not in str(answer)
            assert answer["response"] == {"approved": True}, answer
    finally:
        NOTIFY_GATE.set()
    await assert_no_workflow_task_failed(client, chat.id)

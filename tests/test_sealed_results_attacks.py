"""Attacks on sealed results (issue 44, finding 1) by someone holding namespace credentials but
neither ``AGENT_RESULT_KEYS`` nor a worker, on a real dev server.

Each test completes or fails an activity by id (``RespondActivityTaskCompletedById`` /
``…FailedById``) with what such a caller can send, and asserts what the conversation must do:
take nothing, keep its workflow task healthy (a failed task replays to the same failure for
ever: a stuck chat), and run no tool more than it was asked to.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.api.workflowservice.v1 import (
    RespondActivityTaskCompletedByIdRequest,
    RespondActivityTaskFailedByIdRequest,
)
from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import text
from temporal_agent_interrupts.workflows.config import MODEL_ACTIVITY, TOOL_ACTIVITY
from temporal_agent_interrupts.workflows.types import ErrorKind
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
    gemini = held.model.client()
    queue = f"attack-{uuid.uuid4()}"
    try:
        async with build_worker(client, agents=[t.gated], task_queue=queue, gemini=gemini):
            chat = await AgentClient(client, task_queue=queue).chat("gated")
            sent = asyncio.create_task(chat.send("hi"))
            await _complete_raw(client, chat.id, await _model_id(client, chat.id), payload)
            held.release.set()
            result = await asyncio.wait_for(sent, 30)
            assert result.finish_reason == FinishReason.STOP and result.text == "hello"
            refused = await _activity_rejections(client, chat.id)
            assert len(refused) == 1, refused
        await assert_no_workflow_task_failed(client, chat.id)
    finally:
        held.release.set()
        await held.model.release(gemini)


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
    gemini = held.model.client()
    queue = f"attack-{uuid.uuid4()}"
    try:
        async with build_worker(client, agents=[t.gated], task_queue=queue, gemini=gemini):
            chat = await AgentClient(client, task_queue=queue).chat("gated")
            sent = asyncio.create_task(chat.send("hi"))
            await _fail_raw(client, chat.id, await _model_id(client, chat.id), failure)
            held.release.set()
            result = await asyncio.wait_for(sent, 30)
            assert result.finish_reason == FinishReason.STOP and result.text == "hello"
        await assert_no_workflow_task_failed(client, chat.id)
    finally:
        held.release.set()
        await held.model.release(gemini)

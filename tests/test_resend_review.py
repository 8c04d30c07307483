"""Review of the automatic re-send (client/api.py ``_made_again``), ``waiting_over`` and the
RESOURCE_EXHAUSTED mapping, against a real dev server.

The UnprocessedUpdate here is the server's own: the run's worker is stopped, the answer is
sent, and a stand-in worker (raw gRPC on the chat's task queue) completes the workflow task
that carried it without accepting or refusing it, as a worker that evicted the run does. The
server then rejects the update (RejectUnprocessed); the client sends it again with the same
identity token, and a real worker takes the re-send.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    PollWorkflowTaskQueueRequest,
    RespondWorkflowTaskCompletedRequest,
    RespondWorkflowTaskFailedRequest,
)
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.errors import AgentError, rpc_error
from temporal_agent_interrupts.worker.standin import calls, text
from tests import agents as t
from tests.test_operator import agentctl
from tests.test_requester import fresh, payments


async def _complete_without_taking_the_update(client, task_queue: str) -> int:
    """Poll the chat's task queue as a worker would and complete the first workflow task that
    carries an update without accepting or refusing it; returns how many update messages it
    carried."""
    while True:
        task = await client.workflow_service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                identity="review-stand-in",
            )
        )
        if not task.task_token:
            continue  # an empty long poll
        await client.workflow_service.respond_workflow_task_completed(
            RespondWorkflowTaskCompletedRequest(
                namespace=client.namespace, task_token=task.task_token, identity="review-stand-in"
            )
        )
        if task.messages:
            return len(task.messages)


async def test_a_real_unprocessed_update_is_sent_again_with_the_same_token_and_applied_once(
    run_worker, model, client, monkeypatch
):
    outcomes: list[str] = []
    real = client.workflow_service.update_workflow_execution

    async def counted(req, *args, **kwargs):
        resp = await real(req, *args, **kwargs)
        outcomes.append(resp.outcome.failure.application_failure_info.type or "ok")
        return resp

    monkeypatch.setattr(client.workflow_service, "update_workflow_execution", counted)
    tq = f"review-unprocessed-{uuid.uuid4()}"
    model.reply(calls(("lookup", {"key": "k"}, "r1")), text("looked"))
    async with run_worker(agents=[payments], task_queue=tq) as agents:
        chat = await agents.chat("payments")
        (gated,) = (
            await chat.send("look k up", identity_token=fresh("alice@example.com"))
        ).interrupts
    # No worker now: the answer waits for one; the stand-in takes its task and drops it.
    token = fresh("bob@example.com")
    answering = asyncio.create_task(
        chat.resume(
            answers=[gated.approve()], identity_token=token, worker_timeout=timedelta(minutes=5)
        )
    )
    carried = await _complete_without_taking_the_update(client, tq)
    assert carried == 1
    async with run_worker(agents=[payments], task_queue=tq) as agents:
        done = await answering
        (record,) = await agents.audit(chat.id)
    assert done.finish_reason == FinishReason.STOP and t.RUNS["lookup"] == 1
    assert record.identity == "bob@example.com"
    assert outcomes[0] == "UnprocessedUpdate" and len(outcomes) == 2, outcomes
    # The dropped update left no trace: one accepted update for the answer, none rejected.
    events = [e async for e in client.get_workflow_handle(chat.id).fetch_history_events()]
    accepted = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == "resume"
    ]
    assert len(accepted) == 1
    rejected = [
        e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED
    ]
    assert rejected == []


def test_only_the_in_flight_update_limit_is_called_a_full_slate():
    """Other RESOURCE_EXHAUSTED refusals (a namespace's rate limit, the server's busy) stay
    Temporal's own words, not the in-flight advice."""
    for message in (
        "namespace rate limit exceeded",
        "Too many outstanding requests to the cluster",
        "system is busy",
    ):
        err = rpc_error(RPCError(message, RPCStatusCode.RESOURCE_EXHAUSTED, b""), "c1")
        assert type(err) is AgentError and "in flight" not in str(err), message
        assert err.code != "conflict"


async def test_agentctl_pending_waiting_over_with_an_over_long_number_is_a_usage_error(client):
    """A duration of more digits than Python turns into an int (4300) is a usage error like
    any other over-long one, not a traceback."""
    run = await agentctl(
        client, "pending", "--waiting-over", "9" * 5000 + "d", task_queue=f"tq-{uuid.uuid4()}"
    )
    assert run.code == 2, run.err[-300:]  # it was an internal error (exit 5) before
    assert "--waiting-over" in run.err


async def _fail_tasks(client, task_queue: str, times: int) -> None:
    """Fail the run's next ``times`` workflow tasks, as a worker that crashes on them does."""
    failed = 0
    while failed < times:
        task = await client.workflow_service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                identity="review-stand-in",
            )
        )
        if not task.task_token:
            continue
        await client.workflow_service.respond_workflow_task_failed(
            RespondWorkflowTaskFailedRequest(
                namespace=client.namespace, task_token=task.task_token, identity="review-stand-in"
            )
        )
        failed += 1


async def test_an_answer_sent_while_the_task_fails_is_applied_once(
    run_worker, model, client, monkeypatch
):
    """The run's workflow task has failed three times (a crashing worker) before the answer is
    sent: the server refuses it ('Workflow Task in failed state'), the client sends it again a
    second apart, and once a live worker takes the task the answer is applied once, as its
    sender's."""
    seen: list[str] = []
    refused = asyncio.Event()
    real = client.workflow_service.update_workflow_execution

    async def counted(req, *args, **kwargs):
        try:
            resp = await real(req, *args, **kwargs)
        except RPCError as e:
            seen.append(f"{e.status.name}: {e.message}")
            refused.set()
            raise
        seen.append(resp.outcome.failure.application_failure_info.type or "ok")
        return resp

    monkeypatch.setattr(client.workflow_service, "update_workflow_execution", counted)
    tq = f"review-failing-{uuid.uuid4()}"
    model.reply(calls(("lookup", {"key": "k"}, "r1")), text("looked"))
    async with run_worker(agents=[payments], task_queue=tq) as agents:
        chat = await agents.chat("payments")
        (gated,) = (
            await chat.send("look k up", identity_token=fresh("alice@example.com"))
        ).interrupts
    await client.get_workflow_handle(chat.id).signal("review_nudge")
    await _fail_tasks(client, tq, 3)
    answering = asyncio.create_task(
        chat.resume(
            answers=[gated.approve()],
            identity_token=fresh("bob@example.com"),
            worker_timeout=timedelta(minutes=5),
        )
    )
    await asyncio.wait(
        {asyncio.ensure_future(refused.wait()), answering}, return_when=asyncio.FIRST_COMPLETED
    )
    print("SEEN before worker", seen)
    async with run_worker(agents=[payments], task_queue=tq) as agents:
        done = await answering
        (record,) = await agents.audit(chat.id)
    print("SEEN all", seen)
    assert any("failed state" in s for s in seen), seen
    assert done.finish_reason == FinishReason.STOP and t.RUNS["lookup"] == 1
    assert record.identity == "bob@example.com"

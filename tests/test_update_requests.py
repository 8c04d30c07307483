"""A send and an answer are one request each (issue 51): the update waits for the turn's end,
so the caller makes no second request (a poll for the outcome) when the turn ends within
``worker_timeout``; a turn that runs past it after a worker accepted the update is still waited
for; an update no worker accepts is ``NoWorkerAnswered``, as before."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.api.update.v1 import Outcome, UpdateRef
from temporalio.api.workflowservice.v1 import (
    UpdateWorkflowExecutionRequest,
    UpdateWorkflowExecutionResponse,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts import AgentClient, FinishReason, tool
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.errors import AgentError, NoWorkerAnswered
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import Agent, ToolApproval


class Pause(BaseModel):
    seconds: float


RAN: Counter[str] = Counter()


@tool("wait", "Waits, then says so.")
async def wait(inp: Pause) -> dict[str, object]:
    await asyncio.sleep(inp.seconds)
    RAN["wait"] += 1
    return {"waited": inp.seconds}


slow = Agent("slowDesk", model="gemini-test", tools=[wait], middleware=[ToolApproval()])


class Counted:
    """The RPCs a client's service makes, by name."""

    def __init__(self, client: Client) -> None:
        self.seen: Counter[str] = Counter()
        service = client.workflow_service
        for name in ("update_workflow_execution", "poll_workflow_execution_update",
                     "execute_multi_operation"):  # fmt: skip
            real = getattr(service, name)

            async def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                self.seen[_name] += 1
                return await _real(*args, **kw)

            setattr(service, name, counted)


async def test_a_send_and_an_answer_are_one_request_each(run_worker, model, client):
    caller = await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        data_converter=client.data_converter,
    )
    rpcs = Counted(caller)
    model.reply(calls(("wait", {"seconds": 0}, "w1")), text("done"))
    async with run_worker(agents=[slow]) as agents:
        chat = await AgentClient(caller, task_queue=agents.task_queue).chat(slow.name)
        (asked,) = (await chat.send("wait")).interrupts
        assert rpcs.seen == {"execute_multi_operation": 1}
        done = await chat.resume(answers=[asked.approve()])
        assert done.finish_reason == FinishReason.STOP and done.text == "done"
        assert rpcs.seen == {"execute_multi_operation": 1, "update_workflow_execution": 1}


async def test_a_turn_past_worker_timeout_after_acceptance_is_waited_for(run_worker, model):
    """The answer's turn runs a tool for 3 s, past a 1 s ``worker_timeout``: a worker took the
    answer, so its result is waited for, and the tool ran once."""
    model.reply(calls(("wait", {"seconds": 3}, "w1")), text("done"))
    RAN.clear()
    async with run_worker(agents=[slow]) as agents:
        chat = await agents.chat(slow.name)
        (asked,) = (await chat.send("wait")).interrupts
        done = await chat.resume(answers=[asked.approve()], worker_timeout=timedelta(seconds=1))
        assert done.finish_reason == FinishReason.STOP and done.text == "done"
    assert RAN["wait"] == 1


async def test_an_update_no_worker_accepts_is_no_worker_answered(client):
    agents = AgentClient(client, task_queue=f"nobody-{uuid.uuid4()}")
    chat = await agents.chat(slow.name)
    with pytest.raises(NoWorkerAnswered):
        await chat.send("wait", worker_timeout=timedelta(seconds=1))


class Dropped:
    """The server's answer to an update it dropped unseen (``UnprocessedUpdate``: the workflow
    task that carried it ended without its worker taking it), for the first ``times`` updates
    this client sends; the request itself never reaches the server, as such an update leaves
    nothing there."""

    def __init__(self, client: Client, *, times: int) -> None:
        self.left, self.sent = times, 0
        service = client.workflow_service
        real = service.update_workflow_execution

        async def update(req: UpdateWorkflowExecutionRequest, *args: Any, **kw: Any) -> Any:
            self.sent += 1
            if self.left == 0:
                return await real(req, *args, **kw)
            self.left -= 1
            failure = Failure(
                message="Workflow Update is rejected because it wasn't processed by worker.",
                application_failure_info=ApplicationFailureInfo(
                    type="UnprocessedUpdate", non_retryable=True
                ),
            )
            return UpdateWorkflowExecutionResponse(
                update_ref=UpdateRef(
                    workflow_execution=req.workflow_execution, update_id=req.request.meta.update_id
                ),
                outcome=Outcome(failure=failure),
                stage=UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_COMPLETED,
            )

        service.update_workflow_execution = update  # the stand-in server answer


async def _caller(client: Client) -> Client:
    return await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        data_converter=client.data_converter,
    )


async def test_an_answer_the_server_dropped_unseen_is_sent_again_and_applied_once(
    run_worker, model, client
):
    model.reply(calls(("wait", {"seconds": 0}, "w1")), text("done"))
    RAN.clear()
    caller = await _caller(client)
    dropped = Dropped(caller, times=2)
    async with run_worker(agents=[slow]) as agents:
        chat = await AgentClient(caller, task_queue=agents.task_queue).chat(slow.name)
        (asked,) = (await chat.send("wait")).interrupts
        done = await chat.resume(answers=[asked.approve()], identity="ann")
        assert done.finish_reason == FinishReason.STOP and done.text == "done"
        assert dropped.sent == 3  # two dropped, the third applied
        assert [(a.ref, a.identity) for a in await chat.audit()] == [("w1", "ann")]
    assert RAN["wait"] == 1


async def test_an_answer_dropped_every_time_says_so_and_leaves_the_chat_paused(
    run_worker, model, client
):
    model.reply(calls(("wait", {"seconds": 0}, "w1")), text("done"))
    RAN.clear()
    caller = await _caller(client)
    dropped = Dropped(caller, times=6)
    async with run_worker(agents=[slow]) as agents:
        chat = await AgentClient(caller, task_queue=agents.task_queue).chat(slow.name)
        (asked,) = (await chat.send("wait")).interrupts
        with pytest.raises(
            AgentError, match=r"dropped the request .* unseen .*nothing was applied"
        ):
            await chat.resume(answers=[asked.approve()])
        assert dropped.sent == 6
        assert RAN["wait"] == 0
        assert [p.ref for p in (await chat.status()).pending] == ["w1"]
        # Sent again by the caller, as the error says: applied once.
        done = await chat.resume(answers=[asked.approve()])
        assert done.finish_reason == FinishReason.STOP
    assert RAN["wait"] == 1


async def test_an_answer_refused_for_a_full_update_slate_says_what_still_lands(client, monkeypatch):
    """Temporal holds ten updates in flight a run, and whoever may send updates can fill them
    (tests/test_stream_attacks.py): the server's refusal reads as the product's, and names the
    resume signal, which that limit does not hold back."""
    chat = await AgentClient(client, task_queue=f"tq-{uuid.uuid4()}").chat(slow.name)
    full = RPCError(
        "limit on number of concurrent in-flight updates has been reached (10)",
        RPCStatusCode.RESOURCE_EXHAUSTED,
        b"",
    )

    async def refused(self: Chat, update: Any, arg: Any, **kwargs: Any) -> Any:
        raise full

    monkeypatch.setattr(Chat, "_update_once", refused)
    with pytest.raises(AgentError, match=r"as many requests in flight .* resume signal") as e:
        await chat._update(None, None, worker_timeout=None)
    assert e.value.code == "conflict"


async def test_an_answer_refused_while_the_runs_task_is_failing_is_sent_again_within_worker_timeout(
    client, monkeypatch
):
    """While a run's workflow task is being retried (it timed out on a dead worker), the server
    refuses updates ("Workflow Task in failed state"); nothing was admitted. The answer is sent
    again until a retry takes it, and for no longer than ``worker_timeout``."""
    chat = await AgentClient(client, task_queue=f"tq-{uuid.uuid4()}").chat(slow.name)
    failing = RPCError(
        "Unable to perform workflow execution update due to Workflow Task in failed state.",
        RPCStatusCode.FAILED_PRECONDITION,
        b"",
    )
    sent = 0

    async def refused_twice(self: Chat, update: Any, arg: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        if sent < 3:
            raise failing
        return "taken"

    monkeypatch.setattr(Chat, "_update_once", refused_twice)
    assert await chat._update(None, None, worker_timeout=timedelta(seconds=30)) == "taken"
    assert sent == 3

    async def refused(self: Chat, update: Any, arg: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        raise failing

    sent = 0
    monkeypatch.setattr(Chat, "_update_once", refused)
    with pytest.raises(NoWorkerAnswered, match="workflow task is failing"):
        await chat._update(None, None, worker_timeout=timedelta(seconds=2.5))
    assert sent >= 2  # sent again a second apart, then given up on within worker_timeout

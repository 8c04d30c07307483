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
from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason, tool
from temporal_agent_interrupts.errors import NoWorkerAnswered
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

"""One message's sub-agents, however deep, come out of one budget
(``config.MAX_SUB_AGENTS_PER_TREE``): each caller debits the children it starts and hands each a
share, which the child's start carries and may only narrow (anyone may start a workflow).

Before the budget, a hostile (or injected) model fanned one message out into 272 sub-agent
conversations and 290 model calls two levels deep (issue 44, finding 10).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from temporal_agent_interrupts import Agent, FinishReason, agent_tool
from temporal_agent_interrupts.worker.standin import Request, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.config import MAX_SUB_AGENTS_PER_TREE, WORKFLOW_TYPE
from tests.helpers import assert_no_workflow_task_failed

LEAF, MID = "You are a leaf.", "You are a middle."
fan_leaf = Agent("fan_leaf", system=LEAF)
fan_mid = Agent("fan_mid", system=MID, tools=[agent_tool(fan_leaf)])
fan_top = Agent("fan_top", system="You are the top.", tools=[agent_tool(fan_mid)])

WIDE = 16


def fan_out(request: Request) -> dict[str, Any]:
    """A hostile (or injected) model: every agent that can call a sub-agent calls ``WIDE`` of
    them at once (the top only two when its message says ``two``, a middle one only one when
    its task says ``one``)."""
    if request.function_responses():
        return text("done")
    said = request.user_text()
    if "fan_mid" in request.tool_names():
        mids = 2 if "two" in said else WIDE
        return calls(*[("fan_mid", {"input": f"fan out {k}"}) for k in range(mids)])
    if "fan_leaf" in request.tool_names():
        leaves = 1 if "one" in said else WIDE
        return calls(*[("fan_leaf", {"input": f"leaf {k}"}) for k in range(leaves)])
    return text("a leaf's answer")


def conversations(model: ScriptedModel, system: str) -> int:
    """How many conversations of the agent with ``system`` asked the model (each asks once
    before any tool answers)."""
    return sum(1 for r in model.requests if r.system() == system and not r.function_responses())


def spent(model: ScriptedModel) -> list[dict[str, Any]]:
    """The calls the model heard were not made because the budget was spent."""
    return [
        r["response"]
        for req in model.requests
        for r in req.function_responses()
        if "however deep" in str(r["response"].get("error", ""))
    ]


async def test_one_message_fanning_out_two_levels_deep_starts_at_most_the_trees_budget(client):
    model = ScriptedModel(fan_out)
    async with hosted(client, agents=[fan_top], model=model) as agents:
        top = await agents.chat("fan_top")
        done = await top.send("go")
        assert done.finish_reason == FinishReason.STOP, done
    mids = conversations(model, MID)
    leaves = conversations(model, LEAF)
    # 16 middles; every share is spent by starting them, so no leaf starts (was 16 + 256).
    assert mids == WIDE
    assert mids + leaves <= MAX_SUB_AGENTS_PER_TREE, (mids, leaves)
    assert len(spent(model)) == WIDE * WIDE - leaves
    await assert_no_workflow_task_failed(client, top.id)


async def test_a_narrow_tree_still_delegates_two_levels_within_the_budget(client):
    model = ScriptedModel(fan_out)
    async with hosted(client, agents=[fan_top], model=model) as agents:
        top = await agents.chat("fan_top")
        done = await top.send("go two")
        assert done.finish_reason == FinishReason.STOP, done
    mids = conversations(model, MID)
    leaves = conversations(model, LEAF)
    assert mids == 2
    # Each middle gets a share and starts leaves with it; the rest of its calls are refused.
    assert leaves > 0 and mids + leaves <= MAX_SUB_AGENTS_PER_TREE, (mids, leaves)
    assert len(spent(model)) == 2 * WIDE - leaves


async def _child_budgets(client: Client, chat_id: str) -> list[int | None]:
    """The ``budget`` each child start of ``chat_id`` carried, from its history."""
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    return [
        json.loads(p.data).get("budget")
        for e in hist.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        for p in e.start_child_workflow_execution_initiated_event_attributes.input.payloads
    ]


async def test_a_start_can_narrow_a_sub_agents_budget_but_never_widen_it(client):
    model = ScriptedModel(fan_out)
    async with hosted(client, agents=[fan_top], model=model) as agents:
        queue = agents.task_queue
        # Started from outside as a caller would start it, with a budget of one: one leaf.
        narrow = f"fan-narrow-{uuid.uuid4()}"
        await client.execute_workflow(
            WORKFLOW_TYPE,
            {"agent": "fan_mid", "task": "fan out", "depth": 1, "budget": 1},
            id=narrow,
            task_queue=queue,
        )
        assert await _child_budgets(client, narrow) == [0]
        # With a budget past a whole message's: taken as the whole, so its one leaf gets a
        # share of that, not of a million.
        wide = f"fan-wide-{uuid.uuid4()}"
        await client.execute_workflow(
            WORKFLOW_TYPE,
            {"agent": "fan_mid", "task": "fan out one", "depth": 1, "budget": 10**6},
            id=wide,
            task_queue=queue,
        )
        (share,) = await _child_budgets(client, wide)
        assert share is not None and share < MAX_SUB_AGENTS_PER_TREE
    assert len(spent(model)) == WIDE - 1
    for chat_id in (narrow, wide):
        # Each closes when its turn ends, while its own sub-agent's report may still arrive.
        await assert_no_workflow_task_failed(client, chat_id, racing_signals=True)

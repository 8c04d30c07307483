"""Schema checks inside the workflow are bounded (issue 44, finding 3).

A value checked against a tool's schema inside a workflow task (an edit, a respond's output, a
sub-agent's structured answer) once took jsonschema seconds: the SDK failed the task as a
potential deadlock on every attempt, and the conversation was wedged for good. Each such value
now ends in a stated refusal, the pause stays answerable, and no workflow task fails.

Real dev server; no timing is asserted (bench/schema_bound.py measures the bound).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.client import Client

from temporal_agent_interrupts import (
    Agent,
    AgentClient,
    Chat,
    FinishReason,
    ToolApproval,
    agent_tool,
    interrupt,
    tool,
)
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.answers import SchemaBudget, schema_error
from temporal_agent_interrupts.workflows.interrupts import InterruptBook
from temporal_agent_interrupts.workflows.limits import DOOR
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from tests.agents import Ask
from tests.helpers import assert_no_workflow_task_failed, eventually

HUGE = 470_000
"""List items in the issue's 940 KB edit (``[1] * 470000``): each breaks ``list[str]``."""

TOO_LARGE = "too large to check against the schema here"


class Notice(BaseModel):
    recipients: list[str]
    text: str


SENT: list[int] = []


@tool("notify", "Tell people something; a human may change who.", editable=True)
async def notify(inp: Notice) -> dict[str, int]:
    SENT.append(len(inp.recipients))
    return {"sent": len(inp.recipients)}


class Picks(BaseModel):
    approved: bool
    items: list[str] = []


pick = interrupt("pick", "A human picks items.", input=Ask, output=Picks)

bounded = Agent(
    "bounded",
    model="gemini-test",
    tools=[notify, pick],
    middleware=[ToolApproval(allow=[])],
)


async def _paused(agents: AgentClient, model: ScriptedModel, call: tuple[str, dict[str, Any]]):
    model.reply(calls(call), text("done"))
    chat = await agents.chat("bounded")
    res = await chat.send("go")
    (pending,) = res.interrupts
    return chat, pending


async def _refused_by_signal(client: Client, chat: Chat, payload: dict[str, Any]) -> str:
    """Send ``payload`` as a ``resume`` signal; the reason it was refused for, once recorded."""
    await client.get_workflow_handle(chat.id).signal("resume", payload)
    rejections = await eventually(chat.rejections, bool, timeout=30, interval=0.2)
    (rejection,) = rejections
    assert rejection.via == "signal"
    return rejection.reason


async def test_a_940_kb_edit_by_signal_is_refused_and_the_pause_still_answered(
    run_worker, model, client
):
    SENT.clear()
    async with run_worker(agents=[bounded]) as agents:
        chat, pending = await _paused(
            agents, model, ("notify", {"recipients": ["ops"], "text": "hi"})
        )
        edit = {"recipients": [1] * HUGE, "text": "hi"}
        payload = {
            "restart": [{"name": "notify", "ref": pending.ref, "input": edit}],
            "identity": "eve",
        }
        assert len(json.dumps(payload)) > 900_000
        reason = await _refused_by_signal(client, chat, payload)
        assert "does not fit the tool's input schema" in reason and TOO_LARGE in reason, reason
        assert await chat.pending() == [pending]  # untouched
        # The pause is still answerable: a real edit within the bound runs.
        done = await chat.resume(
            restart=[
                pending.restart(
                    {"tool_approved": True}, input={"recipients": ["a", "b"], "text": "hi"}
                )
            ],
            identity="alice",
        )
        assert done.finish_reason == FinishReason.STOP, done
    assert SENT == [2]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_respond_with_a_huge_list_is_refused_and_the_pause_still_answered(
    run_worker, model, client
):
    async with run_worker(agents=[bounded]) as agents:
        chat, pending = await _paused(agents, model, ("pick", {"question": "which?"}))
        output = {"approved": True, "items": [1] * HUGE}
        payload = {"respond": [{"name": "pick", "ref": pending.ref, "output": output}]}
        reason = await _refused_by_signal(client, chat, payload)
        assert "does not fit its output schema" in reason and TOO_LARGE in reason, reason
        assert await chat.pending() == [pending]
        done = await chat.resume(respond=[pending.respond({"approved": True, "items": ["x"]})])
        assert done.finish_reason == FinishReason.STOP, done
    await assert_no_workflow_task_failed(client, chat.id)


class Receipt(BaseModel):
    paid: float
    lines: list[str]


async def test_a_sub_agent_s_huge_structured_answer_is_refused_and_the_caller_lives_on(client):
    clerk = Agent(f"clerk-{uuid.uuid4().hex[:6]}", system="You are a clerk.")
    books = Agent(
        f"books-{uuid.uuid4().hex[:6]}",
        system="You keep the books.",
        tools=[agent_tool(clerk, name="clerk", output=Receipt)],
    )
    answer = json.dumps({"paid": 1, "lines": [1] * 60_000}, separators=(",", ":"))
    assert len(answer) > 120_000

    def script(request):
        if request.system() == "You are a clerk.":
            return text(answer)  # 60,000 items, each of the wrong type
        return offline_rules(request)

    model = ScriptedModel(script)
    async with hosted(client, agents=[books], model=model) as agents:
        parent = await agents.chat(books.name)
        done = await parent.send(f"call clerk {json.dumps({'input': 'list the lines'})}")
        assert done.finish_reason == FinishReason.STOP, done
        # The caller's model heard why, and the conversation goes on.
        (sent,) = [
            r["response"]
            for request in model.requests
            for r in request.function_responses()
            if r.get("name") == "clerk"
        ]
        assert sent["error"].startswith("the sub-agent's answer does not fit the output schema")
        assert TOO_LARGE in sent["error"], sent["error"]
        again = await parent.send("thanks")
        assert again.finish_reason == FinishReason.STOP, again
    await assert_no_workflow_task_failed(client, parent.id)


# The bound itself, without a server.


def test_one_budget_is_shared_by_the_checks_of_one_answer():
    schema = {"type": "array", "items": {"type": "string"}}
    half = ["a"] * (DOOR.schema_values // 2)
    budget = SchemaBudget()
    assert schema_error(half, schema, budget=budget) is None
    assert schema_error(half[:-2], schema, budget=budget) is None
    assert TOO_LARGE in (schema_error(half, schema, budget=budget) or "")
    # On its own, the same value fits.
    assert schema_error(half, schema) is None


def test_a_schema_that_takes_too_many_steps_is_refused_not_run_on():
    # Each level applies the next twice: 2**16 rules per item, from a few hundred bytes.
    levels: dict[str, Any] = {
        f"d{k}": {"allOf": [{"$ref": f"#/$defs/d{k + 1}"}] * 2} for k in range(16)
    }
    levels["d16"] = {"type": "array"}
    nested = {"$defs": levels, "$ref": "#/$defs/d0"}
    reason = schema_error([[1]] * 100, nested) or ""
    assert "too complex to check against the schema here" in reason


@pytest.mark.parametrize(
    ("value", "fits"),
    [
        ([{"a": 1}, {"a": 1.0}], False),  # equal as JSON Schema compares
        ([1, True], True),
        ([0, False], True),
        ([[1, 2], [2, 1]], True),
        ([{"a": [1]}, {"a": [1]}], False),
        ([{"k": i} for i in range(DOOR.schema_values // 3)], True),
    ],
)
def test_unique_items_is_checked_in_one_pass_as_json_schema_compares(value, fits):
    reason = schema_error(value, {"type": "array", "uniqueItems": True})
    assert (reason is None) == fits, reason


def test_an_accepted_answer_is_schema_checked_once_not_again_when_applied(monkeypatch):
    """validate() checks the schema; resume(), right after it in the same handler, does not
    check it again (the verdict depends only on the answer and the schema)."""
    from temporal_agent_interrupts.workflows import answers

    checked: list[object] = []
    real = answers.schema_error

    def counting(instance: Any, schema: Any, **kwargs: Any) -> str | None:
        checked.append(instance)
        return real(instance, schema, **kwargs)

    monkeypatch.setattr(answers, "schema_error", counting)
    call = CallState(ref="r1", name="pick", args={"question": "q"})
    book = InterruptBook([call], spec=bounded.spec())
    book.pause(call, source="interrupt", metadata={}, now=datetime(2026, 12, 1, tzinfo=UTC))
    output = {"approved": True, "items": ["x"]}
    resume = book.validate({"respond": [{"name": "pick", "ref": "r1", "output": output}]})
    assert book.resume(resume, via="signal") == [call]
    assert checked == [output]

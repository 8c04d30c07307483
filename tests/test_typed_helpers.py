"""The typed helpers Genkit users reach for, on real paused conversations.

``InterruptRequest.input_as(Model)`` / ``metadata_as(Model)`` are Genkit Go's ``InterruptAs[T]``,
``ToolContext.resumed_as(Model)`` its typed ``Resume``. Each gives a validated model instance;
a payload that does not fit says which model, and what it was asked to parse:

- on the caller's side, a pydantic ``ValidationError`` (catchable as usual) titled with the
  model, the tool and the ref;
- inside a tool, a ``ToolError``: the turn fails ``INVALID_ARGUMENT`` (bad resume metadata) or
  ``FAILED_PRECONDITION`` (asked on a run that was not resumed), saying why, rather than an
  unexplained ``INTERNAL`` after retries.
"""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from temporal_agent_interrupts import (
    Agent,
    FinishReason,
    Interrupt,
    ToolApproval,
    ToolContext,
    interrupt,
    tool,
)
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from temporal_agent_interrupts.workflows.types import InterruptRequest
from tests.helpers import assert_no_workflow_task_failed


class Ask(BaseModel):
    ticket_id: str
    summary: str


class Reply(BaseModel):
    priority: Literal["low", "normal", "urgent"]


class Refund(BaseModel):
    ticket_id: str
    amount: float


class OverLimit(BaseModel):
    reason: str
    amount: float


class Approval(BaseModel):
    tool_approved: bool
    approver_note: str


approvals_seen: list[Approval] = []


pick_priority = interrupt("pickPriority", "Ask the lead for a priority.", input=Ask, output=Reply)


@tool("refund", "Refund a ticket; over $100 it asks first.")
async def refund(inp: Refund, ctx: ToolContext) -> dict[str, object]:
    if not ctx.resumed:
        raise Interrupt(OverLimit(reason="refund over $100", amount=inp.amount))
    approval = ctx.resumed_as(Approval)
    approvals_seen.append(approval)
    return {"refunded": inp.amount, "note": approval.approver_note}


@tool("eager", "Reads its resume metadata before asking whether it was resumed.")
async def eager(inp: Refund, ctx: ToolContext) -> dict[str, object]:
    approval = ctx.resumed_as(Approval)  # the author's mistake under test: no ctx.resumed check
    return {"note": approval.approver_note}


typed_agent = Agent(
    "typedAgent",
    model="gemini-test",
    tools=[pick_priority, refund, eager],
    middleware=[ToolApproval(allow=["refund", "eager"])],
)


@pytest.fixture(autouse=True)
def _forget_seen() -> None:
    approvals_seen.clear()


# ---------------------------------------------------------------------------------------------
# InterruptRequest.input_as / metadata_as, on the caller's side.


async def test_input_as_gives_the_interrupt_only_tools_input_as_its_model(run_worker, model):
    model.reply(calls(("pickPriority", {"ticket_id": "T-7", "summary": "Printer on fire"}, "c1")))
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        res = await chat.send("triage T-7")
        (ask,) = res.interrupts
        got = ask.input_as(Ask)
        assert got == Ask(ticket_id="T-7", summary="Printer on fire")
        # The same from what is pending now, which is what an approver's screen reads.
        (pending,) = await chat.pending()
        assert pending.input_as(Ask) == got


async def test_metadata_as_gives_what_the_tools_interrupt_carried(run_worker, model, client):
    model.reply(calls(("refund", {"ticket_id": "T-8", "amount": 250}, "c1")))
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        res = await chat.send("refund T-8")
        (ask,) = res.interrupts
        assert (ask.name, ask.source) == ("refund", "tool")
        assert ask.metadata_as(OverLimit) == OverLimit(reason="refund over $100", amount=250)
        assert ask.input_as(Refund) == Refund(ticket_id="T-8", amount=250)
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_payload_that_does_not_fit_raises_a_validation_error_naming_tool_ref_and_model(
    run_worker, model
):
    model.reply(calls(("refund", {"ticket_id": "T-9", "amount": 250}, "c1")))
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        (ask,) = (await chat.send("refund T-9")).interrupts

    with pytest.raises(ValidationError) as input_error:
        ask.input_as(Ask)  # a Refund's input, read as another tool's
    assert str(input_error.value).startswith(
        f"1 validation error for Ask (the input of 'refund', ref '{ask.ref}')\nsummary\n"
    )
    # pydantic's own errors, unchanged (ticket_id fits; Ask ignores the extra amount).
    (missing,) = input_error.value.errors()
    assert (missing["type"], missing["loc"]) == ("missing", ("summary",))

    with pytest.raises(ValidationError) as metadata_error:
        ask.metadata_as(Reply)
    assert str(metadata_error.value).startswith(
        f"1 validation error for Reply (the metadata of 'refund', ref '{ask.ref}')\npriority\n"
    )
    assert metadata_error.value.errors()[0]["type"] == "missing"


def test_a_custom_validation_error_keeps_its_type_and_message_under_the_new_title():
    """Errors of a validator of the team's own (a ``PydanticCustomError``, whose type pydantic's
    core does not know) come through with their own type and text."""

    class Strict(BaseModel):
        code: str

        @field_validator("code")
        @classmethod
        def known(cls, value: str) -> str:
            raise PydanticCustomError("unknown_code", "no such code {code}", {"code": value})

    request = InterruptRequest(name="lookup", ref="r-1", input={"code": "Z9"})
    with pytest.raises(ValidationError) as caught:
        request.input_as(Strict)
    assert str(caught.value).startswith(
        "1 validation error for Strict (the input of 'lookup', ref 'r-1')\ncode\n  no such code Z9"
    )
    (only,) = caught.value.errors()
    assert (only["type"], only["loc"], only["input"]) == ("unknown_code", ("code",), "Z9")


# ---------------------------------------------------------------------------------------------
# ToolContext.resumed_as, inside a tool.


async def test_resumed_as_gives_the_tool_its_resume_metadata_as_its_model(run_worker, model):
    model.reply(
        calls(("refund", {"ticket_id": "T-10", "amount": 250}, "c1")),
        lambda request: text(f"done: {request.function_responses()[0]['response']}"),
    )
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        (ask,) = (await chat.send("refund T-10")).interrupts
        res = await chat.resume(
            answers=[ask.restart(Approval(tool_approved=True, approver_note="checked the order"))]
        )
        assert res.finish_reason == FinishReason.STOP
        assert approvals_seen == [Approval(tool_approved=True, approver_note="checked the order")]
        (sent,) = model.requests[-1].function_responses()
        assert sent["response"] == {"refunded": 250.0, "note": "checked the order"}


async def test_resume_metadata_that_does_not_fit_fails_the_turn_saying_why(
    run_worker, model, client
):
    """Not ``INTERNAL`` after retries: ``INVALID_ARGUMENT``, naming the ref, the model and the
    field, never the value; the tool ran once for the restart and the conversation goes on."""
    model.reply(calls(("refund", {"ticket_id": "T-11", "amount": 250}, "c1")), text("next turn"))
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        (ask,) = (await chat.send("refund T-11")).interrupts
        res = await chat.resume(answers=[ask.restart({"tool_approved": True, "secret": "s3cr3t"})])
        assert res.finish_reason == FinishReason.FAILED
        assert res.error is not None
        assert res.error.status == "INVALID_ARGUMENT"
        assert res.error.message == (
            f"the resume metadata of call {ask.ref!r} does not fit Approval: "
            "approver_note: Field required"
        )
        assert "s3cr3t" not in res.error.message
        assert approvals_seen == []
        assert (await tool_runs(chat))["refund"] == 2  # the interrupting run and one restart
        assert (await chat.send("and now?")).text == "next turn"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_resumed_as_on_a_run_that_was_not_resumed_says_to_check_resumed_first(
    run_worker, model
):
    model.reply(calls(("eager", {"ticket_id": "T-12", "amount": 5}, "c1")))
    async with run_worker(agents=[typed_agent]) as agents:
        chat = await agents.chat("typedAgent")
        res = await chat.send("go")
        assert res.finish_reason == FinishReason.FAILED
        assert res.error is not None
        assert res.error.status == "FAILED_PRECONDITION"
        assert res.error.message == (
            "resumed_as(Approval) in call 'c1', which was not resumed: check ctx.resumed first"
        )
        assert (await tool_runs(chat))["eager"] == 1  # classified: not retried

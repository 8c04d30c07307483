"""What a person is shown of a paused call (``workflows.presentation``): the tool's own
``Present``, the default from its input schema, the bounds, and the turn it came from."""

from __future__ import annotations

from collections.abc import Mapping

import httpx2
from pydantic import BaseModel, Field

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, interrupt, tool
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.policies import Present, Show
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import presentation
from temporal_agent_interrupts.workflows.presentation import MAX_CONTEXT, MAX_FIELDS, MAX_SUMMARY
from temporal_agent_interrupts.workflows.state import CallState
from temporal_agent_interrupts.workflows.types import (
    Message,
    Part,
    Shown,
    ToolSpec,
    gate_metadata,
)
from tests.helpers import assert_no_workflow_task_failed
from tests.test_web_app import paused_entry
from tests.web import served


class Payment(BaseModel):
    amount: float = Field(title="Amount")
    currency: str
    iban: str = Field(title="Payee IBAN")
    memo: str | None = None


@tool(
    "sendPayment",
    "Send a payment.",
    present=Present(
        summary="Pay {amount} {currency} to {iban}",
        fields=[
            Show(key="amount", label="Amount", format="money"),
            Show(key="iban", label="To", format="iban"),
        ],
        risk="high",
        risk_note="Money leaves the company's account.",
    ),
)
async def send_payment(p: Payment) -> dict[str, bool]:
    return {"sent": True}


@tool("sendPaymentPlain", "Send a payment.")
async def send_plain(p: Payment) -> dict[str, bool]:
    return {"sent": True}


def call(args: Mapping[str, object], **kw: object) -> CallState:
    return CallState.model_validate({"ref": "r1", "name": "sendPayment", "args": args, **kw})


PAY = {"amount": 7300, "currency": "EUR", "iban": "NL91 ABNA 0417 1643 00"}


def test_a_tools_present_writes_its_summary_fields_and_risk():
    shown = presentation.shown(
        call(PAY, source="approval", metadata=gate_metadata("sendPayment")),
        send_payment.spec(),
    )
    assert shown.summary == "Pay 7,300.00 EUR to NL91 …00"
    assert [(f.label, f.value) for f in shown.fields] == [
        ("Amount", "7,300.00"),
        ("To", "NL91 ABNA 0417 1643 00"),
    ]
    # currency is not listed: counted, not shown.
    assert shown.fields_omitted == 1
    assert (shown.risk, shown.risk_note) == ("high", "Money leaves the company's account.")
    assert shown.title == "Send payment"
    # The gate's message is Genkit's vocabulary; a person reads words.
    assert shown.why == "This needs your approval before it runs."
    assert "approved list" not in shown.model_dump_json()


def test_without_a_present_the_schema_gives_titles_and_order():
    shown = presentation.shown(
        call({**PAY, "memo": "rent"}, name="sendPaymentPlain"), send_plain.spec()
    )
    assert [(f.label, f.value) for f in shown.fields] == [
        ("Amount", "7300"),
        ("Currency", "EUR"),
        ("Payee IBAN", "NL91 ABNA 0417 1643 00"),
        ("Memo", "rent"),
    ]
    assert shown.summary.startswith("Send payment plain: Amount 7300, Currency EUR")
    assert shown.risk is None


def test_an_interrupt_only_tool_says_what_it_asks_with_its_description():
    class Ask(BaseModel):
        question: str

    ask = interrupt("askManager", "Ask a manager whether to go on.", input=Ask)
    shown = presentation.shown(
        call({"question": "ship?"}, name="askManager", source="interrupt"), ask.spec()
    )
    assert shown.why == "Ask a manager whether to go on."
    assert shown.fields[0].label == "Question"


def test_hostile_input_is_bounded_and_made_visible():
    huge: dict[str, object] = {f"k{n}": "\u202e" + "x" * 10_000 for n in range(100)}
    huge["nested"] = {"list": list(range(1_000_000))}
    shown = presentation.shown(call(huge), None)
    assert len(shown.fields) == MAX_FIELDS
    assert shown.fields_omitted == 101 - MAX_FIELDS
    assert all(len(f.value) <= 200 and "\u202e" not in f.value for f in shown.fields)
    assert shown.fields[0].value.startswith("\\u202e")
    assert len(shown.summary) <= MAX_SUMMARY


def test_a_summary_placeholder_for_a_missing_key_or_a_brace_is_safe():
    spec = ToolSpec(
        name="t",
        description="",
        input_schema={},
        present=Present(summary="{{literal}} {missing} {a.b} {a}"),
    )
    shown = presentation.shown(call({"a": {"b": 1.5}}), spec)
    assert shown.summary == '{literal} — 1.5 {"b":1.5}'


def test_the_turn_a_call_came_from_is_cut_and_made_visible():
    asked = Message(role="user", parts=[Part(text="please pay the rent\x1b[31m" + "!" * 2000)])
    reply = Message(
        role="model", parts=[Part(text="I will pay it now."), Part(text="hidden", thought=True)]
    )
    ctx = presentation.context(asked, reply)
    assert ctx is not None
    assert ctx.said == "I will pay it now."
    assert ctx.asked.startswith("please pay the rent\\x1b[31m")
    assert len(ctx.asked) <= MAX_CONTEXT
    shown = presentation.shown(call(PAY, context=ctx.model_dump()), send_payment.spec())
    assert (shown.asked, shown.said) == (ctx.asked, ctx.said)
    # No words: nothing on the wire.
    assert presentation.context(None, Message(role="model")) is None


def test_money_and_numbers_are_written_the_same_everywhere():
    assert presentation.write(1234567.891, "money") == "1,234,567.89"
    assert presentation.write("12.5", "money") == "12.50"
    assert presentation.write(True, "money") == "yes"
    assert presentation.write("1e400", "money") == "1e400"
    assert presentation.write("4111111111111111", "masked") == "…1111"
    assert presentation.write("2026-12-05T10:00:00Z", "date") == "2026-12-05 10:00:00Z"
    assert presentation.write(None, "text") == "—"


# ----------------------------------------------------------------------------------------------
# Live: one presentation on every door, against the dev server.

payments_desk = Agent(
    "payments_desk",
    model="gemini-test",
    tools=[send_payment],
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
)


async def test_a_paused_payment_reads_the_same_on_pending_the_inbox_and_the_approvals_api(
    run_worker, model, client
):
    model.reply(
        calls(("sendPayment", PAY, "p1"), say="Paying the March rent now."),
        text("paid"),
    )
    async with run_worker(agents=[payments_desk]) as agents:
        chat = await agents.chat(payments_desk.name)
        res = await chat.send("Pay the landlord 7,300 EUR for March.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        (request,) = res.interrupts
        shown = request.shown
        assert shown is not None
        assert shown.summary == "Pay 7,300.00 EUR to NL91 …00"
        assert shown.asked == "Pay the landlord 7,300 EUR for March."
        assert shown.said == "Paying the March rent now."
        assert shown.risk == "high"
        assert (await chat.pending())[0].shown == shown

        # The inbox reads the memo: the same words, without a worker.
        entry = await paused_entry(agents, payments_desk.name, chat.id)
        (listed,) = entry["interrupts"]
        assert listed["shown"]["summary"] == shown.summary
        assert listed["shown"]["asked"] == shown.asked
        assert listed["shown"]["why"] == "This needs your approval before it runs."

        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            pending = (await http.get(f"{base}/api/chats/{chat.id}/pending")).json()
            assert Shown.model_validate(pending["interrupts"][0]["shown"]) == shown

        await chat.resume(answers=[request.approve()], identity="cfo@example.com")
    await assert_no_workflow_task_failed(client, chat.id)

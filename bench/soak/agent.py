"""The soak's agent: every kind of pause there is, and tools that pay through the ledger.

- ``transfer``: gated (the ToolApproval gate holds every call) and editable; an approved run
  pays, once, through the ledger.
- ``refund``: conditional: allowed by the gate, it pauses itself (``Interrupt``) until it is
  restarted with ``{"tool_approved": true}``, then pays through the ledger.
- ``lookup``: runs freely, a sibling of the calls that pause (completed calls are kept).
- ``confirm``: interrupt-only, answered only by the approvers it names.
- ``quick``: interrupt-only with a short deadline, answered by its ``on_timeout`` when nobody
  answers in time.

The tools run in the worker processes; they sleep a little around the payment so that a worker
killed by the fault schedule is sometimes killed in the middle of one.
"""

from __future__ import annotations

import asyncio
import os
import random
from datetime import timedelta

from pydantic import BaseModel

from bench.soak.ledger import Ledger, Run, now
from temporal_agent_interrupts import Agent, Interrupt, ToolApproval, ToolContext, interrupt, tool
from temporal_agent_interrupts.workflows.types import TOOL_APPROVED

AGENT = "soakAgent"
MODEL = "soak-model"
APPROVERS = ("ann@soak", "bob@soak")
"""Who may answer ``confirm``; anyone else is refused."""
DEADLINE = timedelta(seconds=5)
"""How long a human has to answer ``quick``."""
TIMED_OUT = {"approved": False, "note": "timed out"}
TOOL_PAUSE = (0.05, 0.6)
"""Seconds a paying tool sleeps before and after it pays (a window for a kill)."""


class TransferInput(BaseModel):
    amount: int
    to: str


class RefundInput(BaseModel):
    amount: int
    order: str


class LookupInput(BaseModel):
    q: str


class Question(BaseModel):
    question: str


class Decision(BaseModel):
    approved: bool
    note: str = ""


def build_agent(ledger: Ledger) -> Agent:
    """The agent, its paying tools writing to ``ledger``."""

    async def pay(inp: BaseModel, ctx: ToolContext, *, tool_name: str) -> dict[str, object]:
        await asyncio.sleep(random.uniform(*TOOL_PAUSE))
        run = Run(
            chat_id=ctx.chat_id,
            ref=ctx.ref,
            idempotency_key=ctx.idempotency_key,
            tool=tool_name,
            phase="effect",
            args=inp.model_dump(mode="json"),
            resumed=ctx.resumed,
            pid=os.getpid(),
            at=now(),
        )
        await asyncio.to_thread(ledger.record, run)
        await asyncio.sleep(random.uniform(*TOOL_PAUSE))
        return {"paid": True, **inp.model_dump(mode="json"), "key": ctx.idempotency_key[:12]}

    @tool("transfer", "Move money to an account.", editable=True)
    async def transfer(inp: TransferInput, ctx: ToolContext) -> dict[str, object]:
        return await pay(inp, ctx, tool_name="transfer")

    @tool("refund", "Refund an order; asks for approval first.")
    async def refund(inp: RefundInput, ctx: ToolContext) -> dict[str, object]:
        if not (ctx.resumed and ctx.resumed_metadata.get(TOOL_APPROVED) is True):
            run = Run(
                chat_id=ctx.chat_id,
                ref=ctx.ref,
                idempotency_key=ctx.idempotency_key,
                tool="refund",
                phase="interrupt",
                args=inp.model_dump(mode="json"),
                resumed=ctx.resumed,
                pid=os.getpid(),
                at=now(),
            )
            await asyncio.to_thread(ledger.record, run)
            raise Interrupt({"reason": "refunds need approval", "amount": inp.amount})
        return await pay(inp, ctx, tool_name="refund")

    @tool("lookup", "Look something up.")
    async def lookup(inp: LookupInput) -> dict[str, object]:
        await asyncio.sleep(random.uniform(0.0, 0.2))
        return {"found": inp.q}

    confirm = interrupt(
        "confirm",
        "Ask an approver to confirm.",
        input=Question,
        output=Decision,
        approvers=APPROVERS,
    )
    quick = interrupt(
        "quick",
        "Ask anyone, briefly: the answer defaults to no.",
        input=Question,
        output=Decision,
        timeout=DEADLINE,
        on_timeout=TIMED_OUT,
    )
    return Agent(
        AGENT,
        model=MODEL,
        system="The soak's agent: it does what each message says.",
        tools=[transfer, refund, lookup, confirm, quick],
        middleware=[ToolApproval(allow=["refund", "lookup"])],
    )

"""bankingAgent: an interrupt-only ``userApproval``, then ``transferMoney``.

The model must ask the user before moving money; ``transferMoney`` additionally pauses on its own
for large amounts (a conditional interrupt), which a restart with ``{"tool_approved": true}``
lets through.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from temporal_agent_interrupts import Agent, Interrupt, ToolContext, ToolError, interrupt, tool
from temporal_agent_interrupts.types import (
    APPROVED,
    FEEDBACK,
    TIMED_OUT,
    TOOL_APPROVED,
    Status,
)

LARGE_TRANSFER = 1000.0


class ApprovalAsk(BaseModel):
    action: str = Field(description="The action to be approved")
    details: str = Field(description="Details about the action")


class ApprovalReply(BaseModel):
    approved: bool
    feedback: str = ""


class TransferInput(BaseModel):
    amount: float = Field(description="Amount in dollars")
    to_account: str = Field(description="Destination account, e.g. 'savings'")


class TransferOutput(BaseModel):
    success: bool
    transaction_id: str
    amount: float
    to_account: str


user_approval = interrupt(
    "userApproval",
    "Ask the user for approval before proceeding with a sensitive action.",
    input=ApprovalAsk,
    output=ApprovalReply,
    timeout=timedelta(hours=24),
    on_timeout={APPROVED: False, FEEDBACK: TIMED_OUT},
)

LEDGER: list[TransferOutput] = []
"""Transfers this process made; the example's stand-in for a bank's API."""


@tool("transferMoney", "Transfer money to a specified account.")
async def transfer_money(inp: TransferInput, ctx: ToolContext) -> TransferOutput:
    if inp.amount <= 0:
        raise ToolError(
            Status.INVALID_ARGUMENT, f"transfer amount must be positive, got ${inp.amount:.2f}"
        )
    if inp.amount > LARGE_TRANSFER and not ctx.resumed_metadata.get(TOOL_APPROVED):
        raise Interrupt({"reason": "large transfer", "amount": f"{inp.amount:.2f}"})
    # The key is the same for every attempt of this approved run, across retries, replays and
    # worker restarts: a real bank API deduplicates on it (an Idempotency-Key header), so a
    # transfer cut short and tried again cannot happen twice.
    out = TransferOutput(
        success=True,
        transaction_id=f"txn-{ctx.idempotency_key[:8]}",
        amount=inp.amount,
        to_account=inp.to_account,
    )
    if not any(t.transaction_id == out.transaction_id for t in LEDGER):
        LEDGER.append(out)
    return out


banking_agent = Agent(
    "bankingAgent",
    model="gemini-flash-latest",
    system=(
        "You are a banking assistant. If the user wants to transfer money, ALWAYS call "
        "userApproval first, and call transferMoney only after the user approved. "
        "If the user declines, say that nothing was transferred."
    ),
    tools=[user_approval, transfer_money],
)

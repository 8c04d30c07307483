"""Agents and tools the tests use: every tool counts its runs and remembers its contexts."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.common import RetryPolicy

from examples import banking_agent, deploy_agent, shell_agent
from temporal_agent_interrupts import (
    Interrupt,
    ToolContext,
    ToolError,
    agent_tool,
    interrupt,
    tool,
)
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import Agent, Escalate, Remind, ToolApproval
from temporal_agent_interrupts.workflows.types import Notice

RUNS: Counter[str] = Counter()
CONTEXTS: list[ToolContext] = []

FAST_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=10), maximum_attempts=3)
ONE_SECOND = timedelta(seconds=1)


def reset() -> None:
    RUNS.clear()
    CONTEXTS.clear()


class Ask(BaseModel):
    question: str


class Answer(BaseModel):
    approved: bool
    note: str = ""


class Key(BaseModel):
    key: str


class Charge(BaseModel):
    amount: float


approve = interrupt("approve", "Ask a human to approve.", input=Ask, output=Answer)


@tool("lookup", "Look a key up.")
async def lookup(inp: Key, ctx: ToolContext) -> dict[str, str]:
    RUNS["lookup"] += 1
    CONTEXTS.append(ctx)
    return {"key": inp.key, "value": inp.key.upper()}


@tool("charge", "Charge a card; pauses for approval unless restarted with tool_approved.")
async def charge(inp: Charge, ctx: ToolContext) -> dict[str, object]:
    RUNS["charge"] += 1
    CONTEXTS.append(ctx)
    if not ctx.resumed_metadata.get("tool_approved"):
        raise Interrupt({"amount": inp.amount, "attempt": RUNS["charge"]})
    return {"charged": inp.amount}


@tool("boom", "Always breaks.", retry=FAST_RETRY)
async def boom(inp: Key) -> dict[str, str]:
    RUNS["boom"] += 1
    raise RuntimeError(f"database password is hunter2 ({inp.key})")


@tool("denied", "Refuses, with a classified error.")
async def denied(inp: Key) -> dict[str, str]:
    RUNS["denied"] += 1
    raise ToolError("PERMISSION_DENIED", f"key {inp.key} is not yours")


@tool("bad_interrupt", "Interrupts with a list, which is not allowed.")
async def bad_interrupt(inp: Key) -> dict[str, str]:
    RUNS["bad_interrupt"] += 1
    raise Interrupt(["not", "an", "object"])  # type: ignore[arg-type]  # the mistake under test


class Nope(Exception):
    """An error the ``picky`` tool's retry policy declares non-retryable."""


@tool(
    "picky",
    "Fails with an error its policy says not to retry.",
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=10),
        maximum_attempts=4,
        non_retryable_error_types=["Nope"],
    ),
)
async def picky(inp: Key) -> dict[str, str]:
    RUNS["picky"] += 1
    raise Nope(f"not {inp.key}")


class Nap(BaseModel):
    key: str = ""
    seconds: float = 20


@tool("slow", "Takes a while (until a test cancels it).")
async def slow(inp: Nap) -> dict[str, str]:
    RUNS["slow"] += 1
    await asyncio.sleep(inp.seconds)
    RUNS["slow_finished"] += 1
    return {"key": inp.key}


class Size(BaseModel):
    kib: int


@tool("big", "Returns about as many KiB as asked.")
async def big(inp: Size) -> dict[str, str]:
    RUNS["big"] += 1
    return {"blob": "x" * (inp.kib * 1024 - len('{"blob":""}'))}


class Blob(BaseModel):
    kib: int = 250


@tool("ask_big", "Asks a human, with as many KiB of metadata as it is given.")
async def ask_big(inp: Blob, ctx: ToolContext) -> dict[str, str]:
    RUNS["ask_big"] += 1
    if not ctx.resumed:
        raise Interrupt({"blob": "m" * (inp.kib * 1024 - len('{"blob":""}'))})
    return {"ok": "yes"}


@tool("garbled", "Returns text that is not valid Unicode (half an emoji).")
async def garbled(inp: Key) -> dict[str, str]:
    RUNS["garbled"] += 1
    return {"text": inp.key + "\ud83d"}


class Priority(BaseModel):
    priority: Literal["low", "normal", "urgent"]
    note: str = ""


pick_priority = interrupt(
    "pickPriority", "Ask a human how urgent this is.", input=Ask, output=Priority
)


@tool("slow_charge", "Charges slowly: longer than its one-second timeout.", timeout=ONE_SECOND)
async def slow_charge(inp: Charge, ctx: ToolContext) -> dict[str, object]:
    RUNS["slow_charge"] += 1
    CONTEXTS.append(ctx)
    await asyncio.sleep(2.5)
    RUNS["slow_charge_finished"] += 1
    return {"charged": inp.amount}


@tool(
    "slow_refund",
    "Refunds slowly, and says running twice is harmless.",
    timeout=ONE_SECOND,
    retry=FAST_RETRY,
)
async def slow_refund(inp: Charge) -> dict[str, object]:
    RUNS["slow_refund"] += 1
    await asyncio.sleep(2.5)
    return {"refunded": inp.amount}


@tool("flaky_pay", "Pays; the first attempt of each run fails.", idempotent=True)
async def flaky_pay(inp: Charge, ctx: ToolContext) -> dict[str, object]:
    RUNS["flaky_pay"] += 1
    CONTEXTS.append(ctx)
    if not ctx.resumed_metadata.get("tool_approved"):
        raise Interrupt({"amount": inp.amount})
    attempt = sum(1 for c in CONTEXTS if c.idempotency_key == ctx.idempotency_key)
    if attempt == 1:
        raise RuntimeError("connection reset")
    return {"paid": inp.amount, "key": ctx.idempotency_key}


class Name(BaseModel):
    # A pattern pydantic takes (Rust regex) and Python's re module cannot compile.
    name: str = Field(pattern=r"^\p{L}+$")


ask_name = interrupt("askName", "Ask a human to confirm a name.", input=Name)


careful = Agent("careful", model="gemini-test", tools=[approve, lookup, slow, picky, big])

budget = Agent(
    "budget",
    model="gemini-test",
    tools=[
        approve,
        lookup,
        charge,
        big,
        ask_big,
        garbled,
        pick_priority,
        denied,
        flaky_pay,
        ask_name,
    ],
    max_turns=4,
)

many = Agent("many", model="gemini-test", tools=[lookup], max_turns=40)
"""Long steps: up to 40 model calls a turn (the tests script 128 calls a step)."""

approvals = Agent(
    "approvals",
    model="gemini-test",
    tools=[slow_charge, slow_refund, lookup],
    middleware=[ToolApproval(allow=["lookup"])],
)

assistant = Agent(
    "assistant",
    model="googleai/gemini-test",
    system="You are a test assistant.",
    tools=[approve, lookup, charge, boom, denied, bad_interrupt],
    max_turns=4,
)

gated = Agent(
    "gated",
    model="gemini-test",
    tools=[approve, lookup, charge],
    middleware=[ToolApproval(allow=["lookup"])],
)

# Approval governance: verified identity, a quorum with a group, an editable gated tool, and
# a short deadline that reminds, escalates once and then cancels (recorded as ``governance``).
GOV_ISSUER = TokenIssuer("ES256", kid="gov-1")


class Release(BaseModel):
    service: str
    version: str


@tool("release", "Release a service version; a human may change it.", editable=True)
async def release(inp: Release, ctx: ToolContext) -> dict[str, str]:
    RUNS["release"] += 1
    CONTEXTS.append(ctx)
    return {"released": f"{inp.service}@{inp.version}"}


@tool("notifyOps", "Tell operations an approval is waiting.")
async def notify_ops(notice: Notice) -> dict[str, str]:
    RUNS["notifyOps"] += 1
    return {"told": notice.interrupt.ref}


dual_sign_off = interrupt(
    "dualSignOff",
    "Two of the signers approve.",
    input=Ask,
    output=Answer,
    approvers=["alice@example.com", "bob@example.com", "group:risk"],
    quorum=2,
)

quick_check = interrupt(
    "quickCheck",
    "A question that must be answered within seconds.",
    input=Ask,
    output=Answer,
    timeout=timedelta(seconds=2),
    reminders=[Remind(notify=notify_ops, before=timedelta(seconds=1))],
    on_timeout=Escalate(notify=notify_ops, extend=timedelta(seconds=1), then="cancel"),
)

governed = Agent(
    "governedAgent",
    model="gemini-test",
    tools=[dual_sign_off, release, quick_check],
    middleware=[ToolApproval(allow=[], approvers=["ops@example.com"])],
    trust=GOV_ISSUER.trust(),
)

ALL = [
    assistant,
    gated,
    careful,
    budget,
    approvals,
    many,
    governed,
    banking_agent,
    deploy_agent,
    shell_agent,
]


def ops_agent() -> Agent:
    """A uniquely named agent with all three kinds of interrupt, for operator tests.

    Visibility is shared by every test on the session's server (and paused chats stay paused),
    so a test that lists conversations by ``AgentName`` needs a name no other test uses.
    ``approve`` is interrupt-only, ``charge`` interrupts on its own (conditional), and
    ``lookup`` is gated by ``ToolApproval``.
    """
    return Agent(
        f"ops-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[approve, lookup, charge],
        middleware=[ToolApproval(allow=["charge"])],
    )


# Agents as tools (agent_tool): a supervisor that delegates payments to a sub-agent, whose own
# gate and approver list decide (tests/test_sub_agents.py, the "subagent" recorded history).
SUB_RUNS: Counter[str] = Counter()


class SubPayment(BaseModel):
    to: str
    amount: float


@tool("pay", "Pay someone.")
async def sub_pay(inp: SubPayment) -> dict:
    SUB_RUNS[inp.to] += 1
    return {"paid": inp.amount, "to": inp.to}


payments = Agent(
    "payments",
    system="You make payments.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["alice"])],
)
supervisor = Agent(
    "supervisor",
    system="You delegate.",
    tools=[agent_tool(payments, description="Make a payment through the payments agent.")],
)

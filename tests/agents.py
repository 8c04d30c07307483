"""Agents and tools the tests use: every tool counts its runs and remembers its contexts."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel
from temporalio.common import RetryPolicy

from activities import Interrupt, ToolContext, ToolError, interrupt, tool
from examples import banking_agent, deploy_agent, shell_agent
from workflows import Agent, ToolApproval

RUNS: Counter[str] = Counter()
CONTEXTS: list[ToolContext] = []

FAST_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=10), maximum_attempts=3)


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


careful = Agent("careful", model="gemini-test", tools=[approve, lookup, slow, picky, big])

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

ALL = [assistant, gated, careful, banking_agent, deploy_agent, shell_agent]


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

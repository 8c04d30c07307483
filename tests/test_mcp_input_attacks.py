"""Attacks on MCP input rounds (InputRequiredResult, issue 48): a hostile server
(``tests/mcp_hostile_input.py``, raw JSON results) and whoever holds the namespace's credentials.

Each test that names a finding (D1 to D4) failed before its fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import ActivityFailureError
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.mcp import MCPServerHTTP, mcp_tools
from temporal_agent_interrupts.worker.testing import hosted
from temporal_agent_interrupts.workflows.activity_io import MCPSampleInput, SampleAsk, SampleMessage
from temporal_agent_interrupts.workflows.config import MCP_SAMPLE_ACTIVITY
from temporal_agent_interrupts.workflows.types import DENIED_BY_USER
from tests import test_mcp_tools as mcp_fixtures
from tests.helpers import (
    assert_no_workflow_task_failed,
    events_of,
    eventually,
    free_port,
    history,
)
from tests.mcp_hostile_input import received, script
from tests.mcp_servers import inputs
from tests.test_mcp_tools import HttpServer, agent_with, names

offline = mcp_fixtures.offline
http_server = mcp_fixtures.http_server


class HostileServer(HttpServer):
    def argv(self, variant: int) -> list[str]:
        return [sys.executable, "-m", "tests.mcp_hostile_input", str(self.state), str(self.port)]

    def server(self, *, name: str = "hostile", token: str = "") -> MCPServerHTTP:
        return MCPServerHTTP(name, self.url)


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[HostileServer]:
    server = HostileServer(state=tmp_path, port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


def form(schema: dict[str, Any], message: str = "Fill this in") -> dict[str, Any]:
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": schema},
    }


def asking(requests: dict[str, Any] | None, state: str | None = "s1") -> str:
    body: dict[str, Any] = {"resultType": "input_required"}
    if requests is not None:
        body["inputRequests"] = requests
    if state is not None:
        body["requestState"] = state
    return json.dumps(body)


DONE = json.dumps(
    {
        "resultType": "complete",
        "content": [{"type": "text", "text": "server done"}],
        "structuredContent": {"result": "server done"},
    }
)


async def failed_tasks(client: Any, chat_id: str) -> int:
    hist = await history(client, chat_id)
    return len(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED))


# -- the hostile server works ------------------------------------------------------------------


async def test_hostile_server_scripted_round_pauses_and_retries(client, offline, hostile):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    script(hostile.state, "ask", [asking({"q": form(schema)}), DONE])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (f,) = (await chat.send('call ask {"n": 1}')).interrupts
        assert f.source == "input"
        done = await chat.resume(answers=[f.respond({"name": "x"})])
        assert done.finish_reason == FinishReason.STOP, done
    got = received(hostile.state)
    assert got[1]["inputResponses"] == {"q": {"action": "accept", "content": {"name": "x"}}}
    assert got[1]["requestState"] == "s1"
    await assert_no_workflow_task_failed(client, chat.id)


# -- D1: a server's regular expression runs inside the workflow task ---------------------------

REDOS = {
    "type": "object",
    "properties": {"words": {"type": "string", "title": "Your answer", "pattern": r"^(\w+\s?)+$"}},
}
"""A flat form, as MCP defines it; its pattern backtracks exponentially on an ordinary sentence
that ends with a full stop: 2**(letters) steps (a 30-word English sentence: longer than the age
of the universe). Python's ``re`` holds the GIL throughout: the whole worker process stops."""

STALL_WORDS = 24
"""``ab ab ... ab.``: about 4 s of backtracking here (2**24 steps), past the SDK's 2 s deadlock
detector, and short enough for the test to end."""


async def test_a_forms_pattern_cannot_stall_the_workflow_task(client, offline, hostile):
    script(hostile.state, "ask", [asking({"q": form(REDOS)}), DONE])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        first = await chat.send('call ask {"n": 1}')
        if first.finish_reason == FinishReason.STOP:
            # The fix that refuses regular expressions in a form up front.
            assert "input request refused" in first.text
            return
        (f,) = first.interrupts
        answer = {"words": ("ab " * STALL_WORDS).strip() + "."}
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.05)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        # Refused (does not fit) is fine, if prompt.
        with contextlib.suppress(ResumeRejected, TimeoutError):
            await asyncio.wait_for(chat.resume(answers=[f.respond(answer)]), 15)
        took = time.monotonic() - started
        ticker.cancel()
        fails = await failed_tasks(client, chat.id)
    stalled = max(gaps, default=0.0)
    assert (fails, stalled < 1.0, took < 5) == (0, True, True), (
        f"{fails} workflow task failures; this process's event loop stalled {stalled:.1f}s; "
        f"the answer took {took:.1f}s"
    )


# -- D2: an answer is bound to the call, not to the form it was shown ---------------------------


async def test_an_answer_to_one_form_is_not_taken_as_the_answer_to_the_next(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (one,) = (await chat.send('call survey {"topic": "t"}')).interrupts
        answer = one.respond({"payee": "Bo"})
        assert answer.input_digest  # the answer names what it was shown
        (two,) = (await chat.resume(answers=[answer])).interrupts
        assert (two.ref, two.metadata["round"]) == (one.ref, 2)
        # The same answer again, as a resent signal or a second click sends it.
        with pytest.raises(ResumeRejected):
            await chat.resume(answers=[answer])
    assert len(inputs(http_server.state)) == 1, inputs(http_server.state)


# -- D3: a quorum's form is settled by one of its approvers ------------------------------------


async def test_a_form_on_a_tool_needing_two_approvals_is_not_settled_by_one(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server(), approvers=["alice", "bob"], quorum=2))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send('call transfer {"amount": 900}')).interrupts
        assert gate.quorum == 2
        still = await chat.resume(answers=[approve(gate)], identity="alice")
        (gate,) = still.interrupts
        (f,) = (await chat.resume(answers=[approve(gate)], identity="bob")).interrupts
        assert f.source == "input"
        # Alice alone picks the payee of a transfer two people had to approve.
        await chat.resume(answers=[f.respond({"payee": "Mallory"})], identity="alice")
    assert inputs(http_server.state) == [], "the payee went to the server on one answer"


# -- what held ---------------------------------------------------------------------------------


async def test_a_denial_carrying_data_declines_the_form_and_sends_none_of_it(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send('call transfer {"amount": 5}')).interrupts
        (f,) = (await chat.resume(answers=[approve(gate)])).interrupts
        smuggled = {"error": DENIED_BY_USER, "payee": "Mallory", "content": {"payee": "M"}}
        done = await chat.resume(answers=[f.respond(smuggled)])
        assert done.finish_reason == FinishReason.STOP, done
        records = await agents.audit(chat.id)
    (sent,) = inputs(http_server.state)
    assert sent["answers"] == {"q1": {"action": "decline"}}
    assert records[-1].decision == "denied"


async def test_a_standalone_or_forged_sampling_activity_never_reaches_the_model(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    ask = SampleAsk(
        key="k", messages=[SampleMessage(role="user", text="spend tokens")], max_tokens=1024
    )
    async with hosted(client, agents=[agent], model=offline) as agents:
        handle = await client.start_activity(
            MCP_SAMPLE_ACTIVITY,
            MCPSampleInput(
                agent=agent.name, chat_id="any-chat", ref="r1", server="records", ask=ask
            ),
            id=f"standalone-{uuid.uuid4()}",
            task_queue=agents.task_queue,
            start_to_close_timeout=timedelta(seconds=30),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "NotScheduledByConversation"
    assert offline.requests == []


async def test_a_form_past_its_deadline_is_declined_and_the_call_runs_once(
    client, offline, http_server
):
    # The agent's default for a passed deadline is data that fits the form: not sent.
    agent = agent_with(
        mcp_tools(http_server.server()),
        interrupt_timeout=timedelta(seconds=2),
        on_interrupt_timeout={"payee": "Mallory"},
    )
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (one,) = (await chat.send('call survey {"topic": "t"}')).interrupts
        assert one.source == "input"
        done = await eventually(
            chat.last_turn,
            lambda r: r is not None and r.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        assert done is not None and done.finish_reason == FinishReason.STOP, done
    (sent,) = inputs(http_server.state)
    assert sent["answers"] == {"q1": {"action": "decline"}}
    assert names(http_server.state) == ["survey", "survey"]  # the first call, the decline
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_cancel_while_paused_on_a_form_ends_the_call_without_a_retry(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (one,) = (await chat.send('call survey {"topic": "t"}')).interrupts
        await chat.cancel()
        with pytest.raises(ResumeRejected):
            await chat.resume(answers=[one.respond({"payee": "late"})])
        again = await chat.send('call lookup {"key": "k"}')
        assert again.finish_reason == FinishReason.STOP, again
    assert inputs(http_server.state) == []
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_empty_input_round_fails_the_call_not_the_turn(client, offline, hostile):
    script(hostile.state, "ask", [asking(None, state=None)])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        done = await chat.send('call ask {"n": 1}')
        assert done.finish_reason == FinishReason.STOP, done
        # The server answered with what does not read as MCP: the model hears it, and that the
        # call may have taken effect; the turn and the session go on.
        assert "does not read as MCP" in done.text and "may have taken effect" in done.text
        again = await chat.send('call ask {"n": 2}')
        assert again.finish_reason == FinishReason.STOP, again


async def test_a_maximal_round_pauses_or_fails_the_call_never_a_task(client, offline, hostile):
    # The largest round the bounds allow: 8 forms, each near 16 KiB of flat schema and 4 KiB of
    # message, and a 64 KiB state of odd characters.
    props = {f"p{i:03d}\u2603": {"type": "string", "title": "t" * 100} for i in range(120)}
    big = {f"k{i}": form({"type": "object", "properties": props}, "m" * 4000) for i in range(8)}
    state = '"\\\u00e9' * (64 * 1024 // 5)
    script(hostile.state, "pay", [asking(big, state=state), DONE])
    agent = agent_with(mcp_tools(hostile.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send('call pay {"n": 2}')).interrupts
        after = await chat.resume(answers=[approve(gate)])
        # Paused on the first form, or refused as too large for the turn: never a failed task.
        assert after.finish_reason in (FinishReason.INTERRUPTED, FinishReason.STOP), after
        if after.finish_reason == FinishReason.INTERRUPTED:
            (f,) = after.interrupts
            assert f.source == "input" and f.metadata["forms"] == 8
        # A state-only round (still working) then the answer: retried at once, no pause.
    await assert_no_workflow_task_failed(client, chat.id)

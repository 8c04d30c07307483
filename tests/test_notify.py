"""Paused calls announced on the agent's channels, once each, and their end posted
(``workflows.notifications``, ``activities.notify``), against the dev server."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, interrupt
from temporal_agent_interrupts.policies import Remind
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.activity_io import NotifyInput
from tests.docs import block
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_presentation import PAY, send_payment


@dataclass
class Recording:
    """A channel that keeps what it was told (announce returns a message reference)."""

    announced: list[NotifyInput] = field(default_factory=list)
    settled: list[tuple[NotifyInput, str]] = field(default_factory=list)
    fail: bool = False

    async def announce(self, note: NotifyInput) -> str | None:
        if self.fail:
            raise ApplicationError("the channel is down", non_retryable=True)
        self.announced.append(note)
        return f"msg-{len(self.announced)}"

    async def settle(self, note: NotifyInput, posted: str) -> None:
        self.settled.append((note, posted))


def desk(notify: list[str]) -> Agent:
    return Agent(
        f"desk_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=["cfo@example.com"])],
        notify=notify,
    )


async def test_a_paused_call_is_announced_once_and_its_approval_posted(run_worker, model, client):
    agent = desk(["desk", "other"])
    desk_channel, other = Recording(), Recording()
    model.reply(calls(("sendPayment", PAY, "p1"), say="Paying rent."), text("paid"))
    async with run_worker(
        agents=[agent], channels={"desk": desk_channel, "other": other}
    ) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("Pay the rent.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        (request,) = res.interrupts
        await eventually(lambda: asyncio.sleep(0, desk_channel.announced), lambda a: len(a) == 1)
        (note,) = desk_channel.announced
        assert note.kind == "paused" and note.chat_id == chat.id and note.channel == "desk"
        assert note.interrupt.ref == request.ref
        assert note.interrupt.shown is not None
        assert note.interrupt.shown.summary == "Pay 7,300.00 EUR to NL91 …00"
        assert note.interrupt.shown.asked == "Pay the rent."

        done = await chat.resume(answers=[request.approve()], identity="cfo@example.com")
        assert done.finish_reason == FinishReason.STOP
        await eventually(lambda: asyncio.sleep(0, desk_channel.settled), lambda s: len(s) == 1)
        ((end, posted),) = desk_channel.settled
        assert posted == "msg-1"
        assert (end.kind, end.settled, end.settled_by) == ("settled", "approved", "cfo@example.com")
        assert end.key == note.key
        # Each channel was told once of the pause and once of its end.
        assert len(other.announced) == 1 and len(other.settled) == 1

        async def notified():
            return [r for r in (await chat.history()).answers if r.kind == "notified"]

        records = await eventually(notified, lambda r: len(r) == 4)
        assert {(r.channel, r.delivered, (r.metadata or {}).get("notice")) for r in records} == {
            ("desk", True, "paused"),
            ("desk", True, "settled"),
            ("other", True, "paused"),
            ("other", True, "settled"),
        }
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_channel_that_fails_is_on_record_and_the_turn_goes_on(run_worker, model, client):
    agent = desk(["down", "missing"])
    down = Recording(fail=True)
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    async with run_worker(agents=[agent], channels={"down": down}) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("Pay the rent.")
        (request,) = res.interrupts

        async def notified():
            return [r for r in (await chat.history()).answers if r.kind == "notified"]

        records = await eventually(notified, lambda r: len(r) == 2)
        by_channel = {r.channel: r for r in records}
        assert by_channel["down"].delivered is False
        assert "the channel is down" in (by_channel["down"].verdict_reason or "")
        assert by_channel["missing"].delivered is False
        assert "not configured on this worker" in (by_channel["missing"].verdict_reason or "")
        done = await chat.resume(answers=[request.approve()], identity="cfo@example.com")
        assert done.finish_reason == FinishReason.STOP
        # Nothing was posted, so there is no end to post.
        assert down.settled == []
    await assert_no_workflow_task_failed(client, chat.id)


class Question(BaseModel):
    question: str


class Verdict(BaseModel):
    approved: bool


async def test_a_reminder_is_posted_to_the_channels_and_every_post_shows_the_expiry(
    run_worker, model, client
):
    ask = interrupt(
        "askDesk",
        "Ask the desk whether to go on.",
        input=Question,
        output=Verdict,
        timeout=timedelta(seconds=3),
        on_timeout=Verdict(approved=False),
        reminders=[Remind(channels=["desk"], before=timedelta(seconds=2))],
    )
    agent = Agent(
        f"reminded_{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[ask], notify=["desk"]
    )
    channel = Recording()
    model.reply(calls(("askDesk", {"question": "ship it?"}, "q1")), text("ok"))
    async with run_worker(agents=[agent], channels={"desk": channel}) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("Ask the desk.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        await eventually(lambda: asyncio.sleep(0, channel.settled), lambda s: len(s) == 2)
        assert [n.kind for n in channel.announced] == ["paused", "reminder"]
        # A reminder is a message of its own, and the expiry is shown on both.
        assert len({n.key for n in channel.announced}) == 2
        assert sorted(posted for _, posted in channel.settled) == ["msg-1", "msg-2"]
        assert {(n.settled, n.settled_by) for n, _ in channel.settled} == {("expired", None)}
        last = await chat.last_turn()
        assert last is not None and last.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, chat.id)


def test_a_reminder_names_a_tool_or_channels():
    with pytest.raises(ValueError, match="notify tool, channels, or both"):
        Remind(before=timedelta(seconds=1)).spec()
    assert Remind(channels=["a", "a"], before=timedelta(seconds=1)).spec().channels == ["a"]


async def test_the_governance_pages_channel_of_the_teams_own_is_told_of_a_pause(
    run_worker, model, client, tmp_path
):
    """docs/governance.md's Notifications block, run: its agent, its Pager, its worker."""
    source = block("# notified.py", lang="python")
    namespace: dict[str, object] = {}
    exec(compile(source, "notified.py", "exec"), namespace)  # the page's own code, as written
    agent, pager_type = namespace["agent"], namespace["Pager"]
    assert isinstance(agent, Agent) and isinstance(pager_type, type)
    pager = pager_type()
    model.reply(calls(("deploy", {"service": "api"}, "d1")), text("deployed"))
    async with run_worker(agents=[agent], channels={"pager": pager}) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("Deploy the api.")
        (request,) = res.interrupts
        await eventually(lambda: asyncio.sleep(0, pager.sent), lambda s: len(s) == 1)
        assert pager.sent == ["Deploy: Service api"]
        await chat.resume(answers=[request.approve()], identity="ops@example.com")
    await assert_no_workflow_task_failed(client, chat.id)


def test_an_agents_channels_are_few_and_short_labels():
    with pytest.raises(ValueError, match="at most 8 channels"):
        Agent("too_many", tools=[send_payment], notify=[f"c{n}" for n in range(9)])
    with pytest.raises(ValueError, match="1 to 64 printable"):
        Agent("bad_name", tools=[send_payment], notify=["line\nbreak"])
    with pytest.raises(ValueError, match="not one string"):
        Agent("one_string", tools=[send_payment], notify="slack")

"""The web app's AG-UI streams under reconnects, against a real dev server over real HTTP.

Review findings (issue 44, finding 7): a reconnect (``Last-Event-ID``) to an idle thread waited
for the thread's next run for as long as its client stayed, asking two queries every half
second (20 of them: 74.5 queries a second, 28% of a core); and a chat's stream slots were
counted per chat, so two of one user's reconnects locked every other user of the chat out (429).

Now a stream waiting for a run that has not begun ends after ``reattach_wait``, asking less
often as it waits, and slots are counted per requester. Query costs are counted here, never
timed (timing is bench's).

Issue 51: a connect (no message, no answers, no ``Last-Event-ID``) read the thread's status,
then its messages, then its stream's offset; a turn that ended between the status and the
offset was followed from past its end, and the stream waited ``reattach_wait`` and ended
without ``RUN_FINISHED``. The test makes the turn end right there, every time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx2
from pydantic import BaseModel

from temporal_agent_interrupts import Agent, ToolContext, tool
from temporal_agent_interrupts.client import web
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.types import StatusResult
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.web import Frame, frames, run_input, served

HANG = 60.0
"""A bound on a stream that should end (so a test fails instead of hanging); not a timing."""


def plain() -> Agent:
    return Agent(f"streams-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.lookup])


def counting_queries(monkeypatch: Any) -> Counter[str]:
    """Every query the app's chats ask (``Chat._query``, which ``status``, ``next_offset`` and
    the rest go through), counted by name."""
    asked: Counter[str] = Counter()
    query = Chat._query

    async def counted(self: Chat, what: Any, *args: Any, **kwargs: Any) -> Any:
        asked[what if isinstance(what, str) else what.__name__] += 1
        return await query(self, what, *args, **kwargs)

    monkeypatch.setattr(Chat, "_query", counted)
    return asked


def checks_within(seconds: float) -> int:
    """How many times a stream waiting ``seconds`` for a run may ask where its thread stands:
    once at once, then after each pause of the backoff that ends before the deadline (a busy
    machine only makes it fewer)."""
    checks, waited, pause = 1, 0.0, web.FOLLOW_CHECK_SECONDS
    while waited + pause < seconds:
        waited += pause
        checks += 1
        pause = min(pause * 2, web.FOLLOW_CHECK_MAX_SECONDS)
    return checks


async def test_a_reattach_to_an_idle_thread_ends_within_its_deadline_asking_less_and_less(
    run_worker, model, client, monkeypatch
):
    """The stream ends on its own, with nothing sent, its slot freed, and having asked one
    query per check of the backoff (and the thread's status once); the client reconnects with
    the same id and gets the run once it begins."""
    agent = plain()
    model.reply(text("hi"), text("second"))
    wait = 6.0
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        app = agents_app(
            agents, identity=lambda _: "tester@example.com", reattach_wait=timedelta(seconds=wait)
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=HANG) as http:
            url = f"{base}/agui/{agent.name}"
            nxt = await next_offset(chat)
            reconnect = {"Last-Event-ID": f"{nxt}/{nxt}.0"}
            asked = counting_queries(monkeypatch)
            waiting = asyncio.ensure_future(
                frames(http, url, run_input(chat.id), headers=reconnect)
            )
            done, _ = await asyncio.wait({waiting}, timeout=wait + HANG)
            ended = bool(done)
            if not ended:
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            monkeypatch.undo()
            # 2 queries before the wait (the agent check, the run's start), the thread's status
            # once, and its stream's offset at each check.
            bound = 2 + 1 + checks_within(wait)
            assert ended, f"the reattach was still waiting after {wait + HANG:.0f}s ({asked})"
            assert waiting.result() == []
            assert sum(asked.values()) <= bound, (asked, bound)
            # Its thread idle, its history did not grow: the worker was asked the thread's
            # status and the stream's offset once each, at the reattach, however long it
            # waited (issue 51: each of 1,000 waiting streams asked every 8 s).
            assert asked["status"] == 1 and asked["__temporal_workflow_stream_offset"] == 1, asked
            assert not app.state.agents.streams

            # Reconnecting with the same id, as the client does: the run, once it begins.
            again = asyncio.ensure_future(frames(http, url, run_input(chat.id), headers=reconnect))
            await chat.send("again")
            seen: list[Frame] = await asyncio.wait_for(again, HANG)
            said = "".join(f.event["delta"] for f in seen if f.type == "TEXT_MESSAGE_CONTENT")
            assert said == "second" and seen[-1].type == "RUN_FINISHED", seen
    await assert_no_workflow_task_failed(client, chat.id)


async def test_one_requesters_reconnects_do_not_lock_another_out_of_a_chat(
    run_worker, model, client
):
    """Two reconnects by ann, waiting on the thread's next run, fill ann's slots on the chat
    (a third is 429) and none of bob's: bob's run streams."""
    agent = plain()
    model.reply(text("hi"), text("for bob"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        app = agents_app(agents, identity=lambda request: request.headers.get("x-user"))
        async with served(app) as base, httpx2.AsyncClient(timeout=HANG) as http:
            url = f"{base}/agui/{agent.name}"
            nxt = await next_offset(chat)
            ann = {"X-User": "ann@example.com", "Last-Event-ID": f"{nxt}/{nxt}.0"}
            held = [
                asyncio.ensure_future(frames(http, url, run_input(chat.id), headers=ann))
                for _ in range(web.STREAMS_PER_CHAT)
            ]
            for _ in range(200):
                if sum(app.state.agents.streams.values()) == web.STREAMS_PER_CHAT:
                    break
                await asyncio.sleep(0.02)
            r = await http.post(url, json=run_input(chat.id), headers=ann)
            assert r.status_code == 429 and r.json()["code"] == "too_many_streams"
            # Bob: a new message, and a reconnect.
            bob = {"X-User": "bob@example.com"}
            seen = await frames(http, url, run_input(chat.id, "for bob"), headers=bob)
            said = "".join(f.event["delta"] for f in seen if f.type == "TEXT_MESSAGE_CONTENT")
            assert said == "for bob" and seen[-1].type == "RUN_FINISHED", seen
            # Ann's reconnects were waiting for that very run: they get it, and end.
            for waiting in held:
                got = await asyncio.wait_for(waiting, HANG)
                assert got and got[-1].type == "RUN_FINISHED", got
    await assert_no_workflow_task_failed(client, chat.id)


async def test_the_status_querys_carried_size_follows_every_change(run_worker, model, client):
    """The status query works its carried size out once per state (front ends ask it while
    they wait): asked again it is the same, and each turn, answer or rejection changes it."""
    agent = plain()
    model.reply(text("hi"), text("x" * 20_000))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        first = (await chat.status()).carried_bytes
        assert first is not None and (await chat.status()).carried_bytes == first
        await chat.send("more")
        second = (await chat.status()).carried_bytes
        assert second is not None and second > first + 20_000, (first, second)
        # A refused signal changes the state too (its rejection log), in a task of its own.
        await client.get_workflow_handle(chat.id).signal("resume", {"not": "an answer"})
        third = await eventually(chat.status, lambda s: s.rejections == 1, timeout=HANG)
        assert third.carried_bytes is not None and third.carried_bytes > second
    await assert_no_workflow_task_failed(client, chat.id)


class _Held(BaseModel):
    key: str


_GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}
"""Per chat: set when its ``hold`` tool runs, and what lets it end (the test's loop runs the
worker's activities)."""


@tool("hold", "Runs until the test lets it end.")
async def hold(inp: _Held, ctx: ToolContext) -> dict[str, str]:
    running, release = _GATES[ctx.chat_id]
    running.set()
    await release.wait()
    return {"held": inp.key}


async def test_a_connect_to_a_turn_that_ends_between_its_reads_gets_the_runs_end(
    run_worker, model, client, monkeypatch
):
    """A connect sees the turn running; the turn ends before the connect's next read. The
    stream still ends with the turn's ``RUN_FINISHED`` (its reply), not after
    ``reattach_wait`` with nothing."""
    agent = Agent(f"streams-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[hold])
    model.reply(calls(("hold", {"key": "k"}, "c1")), text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        running, release = _GATES[chat.id] = (asyncio.Event(), asyncio.Event())
        sending = asyncio.ensure_future(chat.send("go"))
        await asyncio.wait_for(running.wait(), HANG)
        # Short, so that a stream waiting for a run that never comes ends well within HANG.
        app = agents_app(
            agents, identity=lambda _: "tester@example.com", reattach_wait=timedelta(seconds=2)
        )
        status = Chat.status
        raced: list[StatusResult] = []

        async def turn_ends_after_the_first_status(self: Chat, **kwargs: Any) -> StatusResult:
            seen = await status(self, **kwargs)
            if self.id == chat.id and not raced and seen.status == "running":
                raced.append(seen)
                release.set()  # the turn ends now, before the connect reads anything else
                await eventually(lambda: status(chat), lambda s: s.status == "idle", timeout=HANG)
            return seen

        try:
            async with served(app) as base, httpx2.AsyncClient(timeout=HANG) as http:
                monkeypatch.setattr(Chat, "status", turn_ends_after_the_first_status)
                seen = await asyncio.wait_for(
                    frames(http, f"{base}/agui/{agent.name}", run_input(chat.id)), HANG
                )
                monkeypatch.undo()
        finally:
            release.set()
            del _GATES[chat.id]
        assert raced, "the connect never saw the turn running"
        assert (await sending).text == "done"
        types = [f.type for f in seen]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
        assert seen[-1].event["result"]["text"] == "done", seen[-1]
    await assert_no_workflow_task_failed(client, chat.id)

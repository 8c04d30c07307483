"""Fifty followers on one chat, and AG-UI subscribers over real HTTP: the answer still lands
(issue 51, "answers never starved by watchers"), against a real dev server.

Temporal lets a workflow have ten updates in flight; an eleventh is refused with
``RESOURCE_EXHAUSTED`` (the Python SDK retries that refusal after a back-off, other clients
fail). Followers poll with updates: the conversation takes four of them at once
(``workflows.stream.MAX_FOLLOWERS``) and refuses the rest, but a refused poll holds a slot too,
from the moment the server admits it until the worker's validator refuses it. Fifty followers
that each asked for a place by update, at once or every time they read by query, filled all
ten (a raw update sent meanwhile was refused). Now the followers of one process send at most
one poll at a time per chat (the others read what it receives), and once the conversation has
refused a place they ask it by query whether one is free before asking for it by update.

Counts, never timings: the polls in flight at once, raw probes refused, events received.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx2
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update import v1 as update_v1
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionRequest
from temporalio.client import Client, RPCError, RPCStatusCode, WorkflowHandle
from temporalio.client import WorkflowUpdateHandle as UpdateHandle
from temporalio.contrib.workflow_streams import PollInput

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import Request, calls, text
from temporal_agent_interrupts.workflows.stream import POLL_UPDATE
from temporal_agent_interrupts.workflows.types import TurnEvent
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.web import Frame, frames, run_input, served

FOLLOWERS = 50
SUBSCRIBERS = 10
HANG = 120.0
"""A bound on what should end (so a test fails instead of hanging); not a timing."""


def held(reply: dict[str, Any]) -> tuple[Callable[[Request], dict[str, Any]], threading.Event]:
    """A scripted model reply that waits until the test releases it (within :data:`HANG`: the
    watchers attach meanwhile, however slowly a loaded machine lets them)."""
    release = threading.Event()

    def respond(_: Request) -> dict[str, Any]:
        release.wait(timeout=HANG)
        return reply

    return respond, release


class PollsInFlight:
    """The stream polls this process has in flight (sent, not yet refused or answered), and the
    most at once: wraps the SDK's ``start_update`` and update ``result``."""

    def __init__(self, monkeypatch: Any) -> None:
        self.now = 0
        self.most = 0
        self.sent = 0
        self._handles: set[str] = set()
        start_update = WorkflowHandle.start_update
        result = UpdateHandle.result

        async def counted_start(handle: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
            if update != POLL_UPDATE:
                return await start_update(handle, update, *args, **kwargs)
            self.sent += 1
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                accepted = await start_update(handle, update, *args, **kwargs)
            except BaseException:
                self.now -= 1
                raise
            self._handles.add(accepted.id)
            return accepted

        async def counted_result(handle: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await result(handle, *args, **kwargs)
            finally:
                if handle.id in self._handles:
                    self._handles.discard(handle.id)
                    self.now -= 1

        monkeypatch.setattr(WorkflowHandle, "start_update", counted_start)
        monkeypatch.setattr(UpdateHandle, "result", counted_result)


async def probe(client: Client, chat_id: str, stop: asyncio.Event, seen: Counter[str]) -> None:
    """Updates sent raw, as a client that does not retry sends them (the server's answer as it
    is), one after another until ``stop``: each a poll the conversation refuses (past the
    stream's end), so it changes nothing. Counts the answers by status."""
    converter = client.data_converter.payload_converter
    args = Payloads(payloads=converter.to_payloads([PollInput(topics=[], from_offset=10**9)]))
    accepted = (
        UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED
    )
    while not stop.is_set():
        request = UpdateWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=chat_id),
            request=update_v1.Request(
                meta=update_v1.Meta(update_id=f"probe-{uuid.uuid4()}", identity="probe"),
                input=update_v1.Input(name=POLL_UPDATE, args=args),
            ),
            wait_policy=update_v1.WaitPolicy(lifecycle_stage=accepted),
        )
        try:
            await client.workflow_service.update_workflow_execution(request, retry=False)
            seen["answered"] += 1
        except RPCError as e:
            seen[RPCStatusCode(e.status).name] += 1
        await asyncio.sleep(0.01)


async def follower(chat: Chat, start: int) -> list[TurnEvent]:
    """The chat's events from ``start`` until a turn ends other than paused."""
    seen = []
    async for event in chat.events(after=start - 1):
        seen.append(event)
        result = event.result
        if result is not None and result.finish_reason != FinishReason.INTERRUPTED:
            return seen
    return seen


async def subscribers(
    http: httpx2.AsyncClient, url: str, chat_id: str
) -> Sequence[asyncio.Future[list[Frame]]]:
    """AG-UI clients attaching to the thread's running turn (a run with no new message), each
    as a user of its own (a user has two streams on a chat); returns once each has been shown
    where the thread stands (its snapshot, or its run's end), so is following it."""
    shown: set[int] = set()

    def seen_state(i: int) -> Callable[[list[Frame]], bool]:
        def stop(seen: list[Frame]) -> bool:
            if seen[-1].type in ("MESSAGES_SNAPSHOT", "RUN_FINISHED"):
                shown.add(i)
            return False

        return stop

    attached = [
        asyncio.ensure_future(
            frames(
                http,
                url,
                run_input(chat_id),
                headers={"X-User": f"watcher{i}@example.com"},
                stop=seen_state(i),
            )
        )
        for i in range(SUBSCRIBERS)
    ]

    async def count() -> int:
        return len(shown | {i for i, f in enumerate(attached) if f.done()})

    await eventually(count, lambda n: n >= SUBSCRIBERS, timeout=HANG)
    return attached


async def test_fifty_followers_and_agui_subscribers_leave_the_answer_room(
    run_worker, model, client, monkeypatch
):
    """One chat paused at an approval, 50 stream followers and 10 AG-UI subscribers attached:
    the answer (through ``Chat.resume``, an update) is applied and the tool runs once; the
    followers never have more than one poll in flight from this process, so a raw update sent
    all along is never refused for want of a slot; every follower gets every event through the
    end of the turn, and every subscriber its run's end."""
    agent = Agent(
        f"watched-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[])],
    )
    to_pause, release_pause = held(calls(("lookup", {"key": "k"}, "c1"), say="Checking."))
    to_end, release_end = held(text("all done"))
    model.reply(text("hi"), to_pause, to_end)
    polls = PollsInFlight(monkeypatch)
    refused: Counter[str] = Counter()
    stop = asyncio.Event()
    try:
        async with run_worker(agents=[agent]) as agents:
            chat = await agents.chat(agent.name)
            await chat.send("hello")
            start = await next_offset(chat)
            probing = asyncio.create_task(probe(client, chat.id, stop, refused))
            following = [asyncio.create_task(follower(chat, start)) for _ in range(FOLLOWERS)]
            app = agents_app(agents, identity=lambda request: request.headers.get("x-user"))

            async with served(app) as base, httpx2.AsyncClient(timeout=HANG) as http:
                url = f"{base}/agui/{agent.name}"
                # A turn runs to the approval with every watcher attached.
                sending = asyncio.create_task(chat.send("pay"))
                await eventually(chat.status, lambda s: s.status == "running", timeout=HANG)
                first_wave = await subscribers(http, url, chat.id)
                release_pause.set()
                paused = await asyncio.wait_for(sending, HANG)
                assert paused.finish_reason == FinishReason.INTERRUPTED
                [pending] = paused.interrupts
                waves: list[list[Frame]] = list(
                    await asyncio.wait_for(asyncio.gather(*first_wave), HANG)
                )
                # The answer, with the 50 followers waiting on the paused chat; the rest of the
                # turn waits on the model while a second wave of subscribers attaches.
                answering: Awaitable[Any] = chat.resume(
                    answers=[pending.approve()], identity="approver@example.com"
                )
                answered = asyncio.ensure_future(answering)
                await eventually(chat.status, lambda s: s.status == "running", timeout=HANG)
                second_wave = await subscribers(http, url, chat.id)
                release_end.set()
                result = await asyncio.wait_for(answered, HANG)
                ends = list(await asyncio.wait_for(asyncio.gather(*second_wave), HANG))
            seen = await asyncio.wait_for(asyncio.gather(*following), HANG)
            end = await next_offset(chat)
            stop.set()
            await probing
    finally:
        stop.set()
        release_pause.set()
        release_end.set()

    # The answer applied: the turn finished, the approved tool ran exactly once.
    assert result.finish_reason == FinishReason.STOP and result.text == "all done", result
    assert t.RUNS["lookup"] == 1, t.RUNS
    # Every follower got every event from where it started through the end of the turn.
    assert len(seen) == FOLLOWERS
    expected = list(range(start, end))
    for events in seen:
        assert [e.offset for e in events] == expected, [e.offset for e in events]
        assert events == seen[0]
    kinds = [e.kind for e in seen[0]]
    assert "interrupt" in kinds and "answer" in kinds and "tool_response" in kinds, kinds
    assert kinds.count("turn_end") == 2 and kinds[-1] == "turn_end", kinds
    # Every AG-UI subscriber saw its run end: at the pause, then at the end of the turn.
    for got in waves:
        assert got and got[-1].type == "RUN_FINISHED", got
        assert got[-1].event["outcome"]["type"] == "interrupt", got[-1]
    for got in ends:
        assert got and got[-1].type == "RUN_FINISHED", got
        assert got[-1].event.get("outcome", {}).get("type") != "interrupt", got[-1]
    # This process never had more than one poll in flight on the chat, and no update sent meanwhile
    # found Temporal's ten in-flight slots taken.
    assert polls.sent >= 1 and polls.most == 1, (polls.most, polls.sent)
    assert refused["answered"] + refused["FAILED_PRECONDITION"] > 0, refused
    assert refused["RESOURCE_EXHAUSTED"] == 0, refused
    await assert_no_workflow_task_failed(client, chat.id)

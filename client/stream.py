"""Following a conversation's events: ``TurnStream`` and ``follow``.

A conversation publishes its turn events on ``temporalio.contrib.workflow_streams`` (see
``workflows/stream.py``); this module reads them. Each event carries its ``offset`` in the
conversation's stream: keep the last one seen, and ``Chat.events(after=offset)`` picks up where it
left off, across worker restarts and continue-as-new, with no gap and no duplicate.

How this maps onto Genkit's streaming interrupts:

=================================================  =================================================
Genkit                                             here
=================================================  =================================================
Go ``agent.Connect(ctx)`` + ``conn.SendText(t)``   ``turn = chat.send_stream(t)``
Go ``for chunk := range conn.Receive()``           ``async for ev in turn:``
Go ``chunk.ToolRequest`` (an interrupt)            ``ev.kind == "interrupt"``, ``ev.interrupt``
Go ``TurnEnd``                                     ``ev.kind == "turn_end"`` (``ev.result``)
Go ``conn.SendResume(...)``                        ``chat.resume_stream(respond=..., restart=...)``
Go ``conn.Output()``                               ``await turn.result()``
Python ``chat.resume_stream(respond=...)``         ``chat.resume_stream(respond=...)``
=================================================  =================================================
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio.client import RPCError, RPCStatusCode
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from client.errors import AgentError, no_worker
from workflows.stream import TOPIC
from workflows.types import TurnEvent, TurnResult

if TYPE_CHECKING:
    from client.api import Chat

POLL_COOLDOWN = timedelta(milliseconds=20)
"""How long a follower waits before asking again once it has caught up (each ask is an update
the conversation's history records, so not zero)."""

_OFFSET_QUERY = "__temporal_workflow_stream_offset"


class EventsGone(AgentError):
    """The events asked for are no longer kept: a conversation keeps the newest part of its
    stream (see ``workflows/stream.py``). ``first`` is the oldest offset still kept."""

    def __init__(self, message: str, *, first: int) -> None:
        super().__init__(message)
        self.first = first


async def follow(
    chat: Chat, *, from_offset: int, starting: Callable[[], bool] = lambda: False
) -> AsyncGenerator[TurnEvent]:
    """Every event of ``chat`` from ``from_offset`` on, as it is published; never ends by itself
    while the conversation is open (after it closes, once the rest is read).

    Args:
        starting: Whether the conversation is being started right now (its first send is on
            its way): until it exists, following waits instead of failing.

    Raises:
        EventsGone: the stream no longer keeps ``from_offset``.
    """
    stream = WorkflowStreamClient.create(chat.client.temporal, chat.id)
    while True:
        items = stream.subscribe(
            [TOPIC], from_offset=from_offset, result_type=TurnEvent, poll_cooldown=POLL_COOLDOWN
        )
        try:
            first = await anext(items)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND and starting():
                await asyncio.sleep(0.02)
                continue
            raise
        except StopAsyncIteration:
            return
        break
    if first.offset > from_offset:
        raise EventsGone(
            f"chat {chat.id!r} no longer keeps events from offset {from_offset}: the oldest it "
            f"keeps is {first.offset}; read from there (Chat.events(after={first.offset - 1}))",
            first=first.offset,
        )
    yield first.data.model_copy(update={"offset": first.offset})
    async for item in items:
        yield item.data.model_copy(update={"offset": item.offset})


async def next_offset(chat: Chat, *, worker_timeout: timedelta | None = None) -> int:
    """The offset the conversation's next event will get (0 for a chat not started yet).

    Raises:
        NoWorkerAnswered: no worker answered within ``worker_timeout``.
    """
    handle = chat.client.temporal.get_workflow_handle(chat.id)
    deadline = asyncio.timeout(worker_timeout.total_seconds() if worker_timeout else None)
    try:
        async with deadline:
            return await handle.query(_OFFSET_QUERY, result_type=int)
    except TimeoutError:
        if not deadline.expired():
            raise
        raise no_worker(worker_timeout, queued=False) from None
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return 0
        raise


class TurnStream:
    """One turn as it happens: ``async for ev in turn`` until ``turn_end``; ``await
    turn.result()`` for its :class:`~workflows.types.TurnResult`.

    Made by ``Chat.send_stream`` and ``Chat.resume_stream``; what they send goes out when the
    stream is first iterated or its result awaited.
    """

    def __init__(
        self,
        chat: Chat,
        start: Callable[[], Awaitable[TurnResult]],
        *,
        worker_timeout: timedelta | None = None,
    ) -> None:
        self._chat = chat
        self._start = start
        self._worker_timeout = worker_timeout
        self._task: asyncio.Task[TurnResult] | None = None
        self._offset = 0
        self._lock = asyncio.Lock()

    @property
    def offset(self) -> int:
        """Where this turn's events start in the conversation's stream."""
        return self._offset

    async def _begin(self) -> asyncio.Task[TurnResult]:
        async with self._lock:
            if self._task is None:
                # Read before sending, so the turn's first event is not missed.
                self._offset = await next_offset(self._chat, worker_timeout=self._worker_timeout)

                async def start() -> TurnResult:
                    return await self._start()

                self._task = asyncio.create_task(start())
            return self._task

    async def result(self) -> TurnResult:
        """The turn's result: the same as ``send()`` / ``resume()`` return."""
        return await (await self._begin())

    def __aiter__(self) -> AsyncIterator[TurnEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TurnEvent]:
        task = await self._begin()
        events = follow(self._chat, from_offset=self._offset, starting=lambda: not task.done())
        following: asyncio.Future[TurnEvent] | None = None
        try:
            while True:
                following = asyncio.ensure_future(events.__anext__())
                await asyncio.wait({following, task}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    refused = task.exception()
                    if refused is not None:
                        # Refused (a paused or closed chat, a bad answer): nothing will come.
                        following.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await following
                        raise refused
                    await asyncio.wait({following})
                event = following.result()
                yield event
                if event.kind == "turn_end":
                    return
        except StopAsyncIteration:
            return
        finally:
            if following is not None and not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
            await events.aclose()

"""Following a conversation's events: ``TurnStream`` and ``follow``.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.errors`` and ``temporal_agent_interrupts.types``.

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
import base64
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from temporalio.api.common.v1 import Payload
from temporalio.client import (
    RPCError,
    RPCStatusCode,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.contrib.workflow_streams import (
    PollInput,
    PollResult,
    WorkflowStreamClient,
    WorkflowStreamItem,
)
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.errors import (
    OUTAGE_GRACE,
    AgentError,
    ChatNotFound,
    rpc_error,
    server_unreachable,
)
from temporal_agent_interrupts.workflows.stream import (
    HISTORY_LONG,
    OFFSET_NOT_REACHED,
    PLACES_QUERY,
    POLL_UPDATE,
    TOPIC,
)
from temporal_agent_interrupts.workflows.types import TurnEvent, TurnResult

if TYPE_CHECKING:
    from temporal_agent_interrupts.client.api import Chat

POLL_COOLDOWN = timedelta(milliseconds=20)
"""How long a follower waits before asking again once it has caught up (each ask is an update
the conversation's history records, so not zero)."""

_OFFSET_QUERY = "__temporal_workflow_stream_offset"

QUERY_READ_FIRST = 0.1
"""How soon a follower that found the conversation's follower places taken reads by query
again when nothing was new; it waits twice as long each time, up to :data:`QUERY_READ_MAX`."""

QUERY_READ_MAX = 2.0
"""The longest a follower reading by query waits between two reads."""

_NO_PLACE = frozenset({"TooManyFollowers", HISTORY_LONG})
"""The conversation's refusals of a follower's poll it takes no more of for now: past its four
(``TooManyFollowers``), or while its run's history is long (workflows/stream.py)."""

_UNPROCESSED = "UnprocessedUpdate"
"""The server's refusal of an update a workflow task carried but its worker never saw."""

SHARED_EVENTS = 64
"""Events the follower that polls for a chat keeps for the other followers of that chat in the
same process (only while there are others)."""

SHARED_WAIT = 10.0
"""How long a follower waits for what another follower of its process receives before reading
by query itself (that follower's reader may have stopped pulling events)."""


class EventsGone(AgentError):
    """The events asked for are no longer kept: a conversation keeps the newest part of its
    stream (see ``workflows/stream.py``). ``first`` is the oldest offset still kept."""

    def __init__(self, message: str, *, first: int) -> None:
        super().__init__(message)
        self.first = first


async def follow(
    chat: Chat,
    *,
    from_offset: int,
    strict: bool = True,
    starting: Callable[[], bool] = lambda: False,
) -> AsyncGenerator[TurnEvent]:
    """Every event of ``chat`` from ``from_offset`` on, as it is published; never ends by itself
    while the conversation is open (after it closes, once the rest is read).

    The followers of one chat in one process (one Temporal client) send one poll at a time
    between them: one follows by update, the others take what it receives (or read by query
    what it no longer holds). So however many follow a chat here, they hold at most one of the
    ten updates Temporal lets a workflow have in flight, and answers keep their room.

    Args:
        strict: ``from_offset`` must still be kept (False: start from the oldest kept).
        starting: Whether the conversation is being started right now (its first send is on
            its way): until it exists, following waits instead of failing.

    Raises:
        EventsGone: the stream no longer keeps ``from_offset`` (``strict``), or a follower fell
            behind what it keeps (its oldest events go at a pause, and at continue-as-new).
    """
    stream = WorkflowStreamClient.create(chat.client.temporal, chat.id)
    loop = asyncio.get_running_loop()
    offset = from_offset  # the next offset to read
    first = True
    down_since: float | None = None
    pause = QUERY_READ_FIRST
    key = (id(chat.client.temporal), chat.id)
    shared = _FOLLOWING.get(key)
    if shared is None:
        shared = _FOLLOWING[key] = _Followers()
    shared.users += 1
    me = object()
    stale = False

    def taken(at: int) -> None:
        nonlocal first, offset, down_since
        down_since = None
        if first:
            first = False
            if strict and at > offset:
                raise _gone(chat, offset, at)
        elif at != offset:
            # The library starts again from the oldest kept when an offset is gone.
            raise _gone(chat, offset, at)
        offset = at + 1

    try:
        while True:
            changed = shared.changed
            # The poll of this process: taken when no follower here holds it, and, once the
            # conversation has refused a place, only when it says one is free (asked by query:
            # a poll it refuses holds an in-flight slot until the worker refuses it). Only the
            # follower reading for this process asks: one places query at a time, not one per
            # follower (a holder of four polls at the stream's end keeps the places taken, and
            # every follower here would otherwise ask, and read, for itself).
            free = False
            if shared.poller is None and shared.reader in (None, me):
                if shared.crowded:
                    if shared.reader is None:
                        shared.reader = me
                        shared.head = offset
                    free = await _place_free(chat)
                else:
                    free = True
            if free and shared.poller is None:
                if shared.reader is me:
                    shared.reader = None
                shared.poller = me
                shared.head = offset
                retry: float | None = None
                # An async generator (its overloads say AsyncIterator): closed below.
                items = cast(
                    "AsyncGenerator[WorkflowStreamItem[TurnEvent]]",
                    stream.subscribe(
                        [TOPIC],
                        from_offset=offset,
                        result_type=TurnEvent,
                        poll_cooldown=POLL_COOLDOWN,
                    ),
                )
                handed_over = False
                try:
                    async for item in items:
                        taken(item.offset)
                        pause = QUERY_READ_FIRST
                        shared.crowded = False
                        event = item.data.model_copy(update={"offset": item.offset})
                        shared.head = offset
                        if shared.users > 1:
                            shared.recent.append((item.offset, event))
                            shared.notify()
                        shared.handing = True
                        yield event
                        if shared.poller is not me:
                            # Another follower here took the poll over while our consumer
                            # held this event (see the stale wait below): stop polling (none
                            # is in flight: the library asks again only once its batch is
                            # taken), and read what that follower receives.
                            handed_over = True
                            break
                        shared.handing = False
                    if not handed_over:
                        return
                except WorkflowUpdateRPCTimeoutOrCancelledError:
                    # The server gave up waiting for a worker to take the poll (a busy one): it
                    # took nothing, so ask again. (Our own cancellation is raised as itself.)
                    retry = 0.0
                except WorkflowUpdateFailedError as e:
                    if followers_full(e):
                        shared.crowded = True
                    elif _not_reached(e):
                        # An offset from the caller (a web client's Last-Event-ID) past the
                        # stream's end: the product's error, not Temporal's raw one.
                        raise AgentError(
                            f"chat {chat.id!r} has not reached offset {offset} yet: follow "
                            "from an offset it has given (Chat.events(after=...))"
                        ) from None
                    elif not _unprocessed(e):
                        raise
                except RPCError as e:
                    if first and e.status == RPCStatusCode.NOT_FOUND and starting():
                        retry = 0.02
                    elif server_unreachable(e):
                        # The server went away (a restart): the conversation keeps its events,
                        # so following picks up where it was once the server is back.
                        now = loop.time()
                        down_since = now if down_since is None else down_since
                        if now - down_since >= OUTAGE_GRACE:
                            raise rpc_error(e, chat.id) from e
                        retry = 1.0
                    else:
                        raise rpc_error(e, chat.id) from e
                finally:
                    await items.aclose()
                    if shared.poller is me:
                        shared.poller = None
                        shared.handing = False
                    shared.notify()
                if retry is not None:
                    await asyncio.sleep(retry)
                    continue
            # Another follower here polls, or the conversation's follower places are taken (by
            # other processes' followers, or by polls that anyone with the namespace's
            # credentials can send directly): what that follower received, or what the
            # conversation keeps, read by query (it takes no place and writes no history).
            read = shared.since(offset)
            # Nothing to ask while this process's poller (or the follower reading by query for
            # it) has received nothing past our offset: what it receives wakes us (and the
            # conversation holds one query at a time while a workflow task runs: one from
            # every follower here would be refused).
            if shared.poller is None and (shared.reader is None or stale):
                # No one reads for this process, or its reader's own consumer stopped taking
                # events (a stale wait): this follower reads for the others from now on.
                shared.reader = me
                shared.head = offset
            leader = shared.poller if shared.poller is not None else shared.reader
            led = leader is not None and leader is not me
            current = led and offset >= shared.head and not stale
            stale = False
            if not read and not current:
                try:
                    read = await _read_by_query(chat, offset)
                except ChatNotFound:
                    if first and starting():
                        await asyncio.sleep(0.02)
                        continue
                    raise
                if read and shared.reader is me:
                    # What the others here wait for: they take it as they take the poller's.
                    if shared.users > 1:
                        shared.recent.extend(read)
                    shared.head = read[-1][0] + 1
                    shared.notify()
            for at, event in read:
                taken(at)
                reading = shared.reader is me
                if reading:
                    shared.handing = True
                yield event
                if reading and shared.reader is me:
                    shared.handing = False
            if read:
                pause = QUERY_READ_FIRST
                continue
            try:
                await asyncio.wait_for(changed.wait(), SHARED_WAIT if led else pause)
            except TimeoutError:
                # The poller (or reader) holds an event its own consumer has not taken (that
                # consumer may have stopped: a web client that no longer reads its stream):
                # read by query once, and take its role over, so that the others here follow
                # by update again instead of by a query every SHARED_WAIT. A poller holding
                # an event has no poll in flight. One waiting on the conversation is not
                # behind, and an idle chat costs the others nothing.
                stale = led and shared.handing
                if stale and shared.poller is not None:
                    shared.poller = None
                    shared.handing = False
            if not led:
                pause = min(pause * 2, QUERY_READ_MAX)
    finally:
        shared.users -= 1
        if shared.reader is me:
            # Another follower here reads (or polls) for the rest from now on.
            shared.reader = None
            shared.handing = False
            shared.notify()
        if shared.users == 0 and _FOLLOWING.get(key) is shared:
            del _FOLLOWING[key]


class _Followers:
    """The followers of one chat in this process: which of them polls, and what it received
    lately, for the others."""

    def __init__(self) -> None:
        self.users = 0
        self.poller: object | None = None
        self.reader: object | None = None
        """The follower that reads by query for the others while none polls (the
        conversation's places taken): one query at a time from this process."""
        self.crowded = False
        """Whether the conversation refused this process's last poll (its places taken)."""
        self.head = 0
        """The offset the poller (or the reader) reads next."""
        self.handing = False
        """Whether the poller (or the reader) waits on its own consumer to take an event (not on
        the conversation)."""
        self.recent: deque[tuple[int, TurnEvent]] = deque(maxlen=SHARED_EVENTS)
        self.changed = asyncio.Event()

    def notify(self) -> None:
        """Wake the followers waiting on what the poller receives."""
        self.changed.set()
        self.changed = asyncio.Event()

    def since(self, offset: int) -> list[tuple[int, TurnEvent]]:
        """The events received lately from ``offset`` on, without a gap (none if ``offset``
        is not among them)."""
        read: list[tuple[int, TurnEvent]] = []
        for at, event in self.recent:
            if at < offset + len(read):
                continue
            if at != offset + len(read):
                break
            read.append((at, event))
        return read


_FOLLOWING: dict[tuple[int, str], _Followers] = {}
"""The followers in this process, by Temporal client and chat."""


async def _place_free(chat: Chat) -> bool:
    """Whether the conversation takes another follower now (its places query); True when it
    cannot say (a worker from before the query, a chat not started yet): ask by update then."""
    try:
        return int(await chat.handle.query(PLACES_QUERY, result_type=int)) > 0
    except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
        return True


def _not_reached(error: WorkflowUpdateFailedError) -> bool:
    """Whether the conversation refused the poll as from past its stream's end."""
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == OFFSET_NOT_REACHED


def _unprocessed(error: WorkflowUpdateFailedError) -> bool:
    """Whether the server dropped the poll without the worker seeing it (``UnprocessedUpdate``:
    the workflow task that carried it ended first); nothing was taken, so ask again."""
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == _UNPROCESSED


async def _read_by_query(chat: Chat, offset: int) -> list[tuple[int, TurnEvent]]:
    """The stream's events from ``offset`` that the conversation keeps, read by the library's
    poll query (its immediate read, which waits for nothing): what its long poll would have
    returned, as (offset, event)."""
    try:
        result = await chat.handle.query(
            POLL_UPDATE, PollInput(topics=[TOPIC], from_offset=offset), result_type=PollResult
        )
    except RPCError as e:
        raise rpc_error(e, chat.id) from e
    converter = chat.client.temporal.data_converter.payload_converter
    read = []
    for item in result.items:
        payload = Payload()
        payload.ParseFromString(base64.b64decode(item.data))
        event = converter.from_payload(payload, TurnEvent)
        read.append((item.offset, event.model_copy(update={"offset": item.offset})))
    return read


def followers_full(error: BaseException) -> bool:
    """Whether ``error`` is the conversation refusing one more follower for now (its places
    taken, or its run's history long): read by query, and ask its places query before polling
    again."""
    cause = error.cause if isinstance(error, WorkflowUpdateFailedError) else None
    return isinstance(cause, ApplicationError) and cause.type in _NO_PLACE


def _gone(chat: Chat, wanted: int, first: int) -> EventsGone:
    return EventsGone(
        f"chat {chat.id!r} no longer keeps events from offset {wanted}: the oldest it keeps is "
        f"{first}; read from there (Chat.events(after={first - 1}))",
        first=first,
    )


async def next_offset(chat: Chat, *, worker_timeout: timedelta | None = None) -> int:
    """The offset the conversation's next event will get (0 for a chat not started yet).

    Asked as every query of ``Chat`` is (``Chat._query``): again while no worker answers, or
    while a worker puts it off (``errors.QUERY_PUT_OFF``), and with Temporal's errors as the
    product's (a server that is down is an ``AgentError`` that says so, not a raw RPC error).

    Raises:
        NoWorkerAnswered: no worker answered within ``worker_timeout``.
        AgentError: Temporal could not be asked.
    """
    try:
        offset = await chat._query(_OFFSET_QUERY, worker_timeout=worker_timeout)
    except ChatNotFound:
        return 0
    return int(offset)


class TurnStream:
    """One turn as it happens: ``async for ev in turn`` until ``turn_end``; ``await
    turn.result()`` for its :class:`~workflows.types.TurnResult`.

    Made by ``Chat.send_stream`` and ``Chat.resume_stream``; what they send goes out when the
    stream is first iterated or its result awaited.
    """

    def __init__(
        self,
        chat: Chat,
        start: Callable[[asyncio.Event], Awaitable[TurnResult]],
        *,
        worker_timeout: timedelta | None = None,
    ) -> None:
        self._chat = chat
        # Sends, sets the event once the conversation has accepted it, returns the result.
        self._start = start
        self._accepted = asyncio.Event()
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
                    return await self._start(self._accepted)

                self._task = asyncio.create_task(start())
            return self._task

    async def result(self) -> TurnResult:
        """The turn's result: the same as ``send()`` / ``resume()`` return."""
        return await (await self._begin())

    async def accepted(self) -> None:
        """Send, and wait until the conversation has taken it: raises its refusal (what
        ``send()`` / ``resume()`` would raise) instead. A front end can say a run has started
        before the first event, which may be a long model call away."""
        task = await self._begin()
        waiter = asyncio.ensure_future(self._accepted.wait())
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        if not self._accepted.is_set():
            waiter.cancel()
            await task  # raises the refusal (or returns: a turn that ended at once)

    async def close(self) -> None:
        """Stop waiting here for what was sent: the turn goes on in the conversation (a
        follower that went away, a client that disconnected), and nothing it raises later is
        left unretrieved."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        elif task is not None and not task.cancelled():
            task.exception()  # retrieved: the caller that went away does not want it

    def __aiter__(self) -> AsyncIterator[TurnEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TurnEvent]:
        task = await self._begin()
        # Nothing is shown until the conversation has taken what was sent: a refused send (a
        # turn of someone else's running, a closed chat) raises, never shows another turn.
        accepted = asyncio.ensure_future(self._accepted.wait())
        await asyncio.wait({accepted, task}, return_when=asyncio.FIRST_COMPLETED)
        if not self._accepted.is_set():
            accepted.cancel()
            await task  # raises the refusal
            return
        events = follow(self._chat, from_offset=self._offset, starting=lambda: not task.done())
        following: asyncio.Future[TurnEvent] | None = None
        # Set once the send or resume has returned: where this turn's events end for now (a
        # resume that leaves interrupts pending stops at once, with no turn_end).
        end: int | None = None
        last = self._offset - 1
        try:
            while True:
                following = asyncio.ensure_future(events.__anext__())
                await asyncio.wait({following, task}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done() and end is None:
                    task.result()  # raises what the send or resume raised
                    end = await next_offset(self._chat, worker_timeout=self._worker_timeout)
                    if end <= last + 1:
                        return
                    await asyncio.wait({following})
                elif not following.done():
                    await asyncio.wait({following})
                event = following.result()
                last = event.offset
                yield event
                if event.kind == "turn_end" and event.result is not None and event.result.closed:
                    # A turn that closed the conversation (an agent no worker hosts): the
                    # send raises for it, and so does following it.
                    await task
                if event.kind == "turn_end" or (end is not None and event.offset >= end - 1):
                    return
        except StopAsyncIteration:
            # The conversation closed: what the send or resume made of it.
            await task
            return
        finally:
            if following is not None and not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
            await events.aclose()

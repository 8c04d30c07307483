"""What both HTTP servers of the product share: the web app (:mod:`client.web`) and the codec
server (:mod:`temporal_agent_interrupts.codec_server`). Both are ASGI applications served by
uvicorn through :func:`serve`, with the connection rules of :class:`ConnectionLimits` enforced by
:func:`limited_protocol`; the Host and Origin rules are :mod:`temporal_agent_interrupts.http_rules`.

uvicorn bounds a request's head in size (``h11_max_incomplete_event_size``) and an idle
keep-alive connection in time, but not a request's head (or body) in time: its keep-alive timer
starts only after a first response, and any byte resets it (Kludex/uvicorn#157), so a client
that trickles a byte every few seconds holds its connection for ever. Nor does it count header
fields, or refuse a ``Transfer-Encoding``. :func:`limited_protocol` subclasses its
``H11Protocol`` for those, and reads four of its members: ``loop``, ``transport``, ``conn``
and ``cycle`` (the request being served, created when its head is complete). The tests of
both servers fail if that changes.

Here too are the two things the codec server holds across requests, for any server that does
CPU work on large bodies: :class:`Pool` (daemon threads, so a decode under way never holds the
process at exit) and :class:`ByteBudget` (bytes reserved at once, first come first served).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

import h11

if TYPE_CHECKING:
    from starlette.types import ASGIApp

_T = TypeVar("_T")

LISTEN_BACKLOG = 128
"""Connections the kernel queues for a listener before they are accepted."""


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What one connection may take of a server, before any application code runs.

    Raises:
        ValueError: a limit that is not positive.
    """

    request_seconds: float
    """From a request's first byte, the time its line and headers (and its body, with
    ``deadline_covers_body``) have to arrive, however slowly they trickle."""
    idle_seconds: float
    """A connection that starts no request for this long is closed, with nothing said: a new
    one, or one kept alive between requests."""
    max_header_bytes: int
    """The request line and headers, in bytes (431 over it)."""
    max_headers: int
    """Header fields of one request (431 over it)."""
    max_connections: int
    """Connections served at once; a request on one more gets 503 (uvicorn's
    ``limit_concurrency``)."""
    deadline_covers_body: bool = False
    """Whether ``request_seconds`` runs until the body's end, not the head's: without it, the
    application bounds its bodies itself."""
    answer_slow_heads: bool = True
    """A request that misses its deadline gets 408 before the close; without it, the
    connection is closed with nothing said."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool) and not value > 0:
                raise ValueError(f"ConnectionLimits.{field.name} must be positive")


def _refusal(status: int, message: str) -> h11.RemoteProtocolError:
    return h11.RemoteProtocolError(message, error_status_hint=status)


def _screen(request: h11.Request, limits: ConnectionLimits) -> h11.RemoteProtocolError | None:
    """Why a request's head is refused before any application sees it (None: it is not)."""
    # h11 bounds what it buffers of an incomplete head; this bounds a complete one exactly.
    head = len(request.target) + sum(len(k) + len(v) for k, v in request.headers)
    if len(request.headers) > limits.max_headers or head > limits.max_header_bytes:
        return _refusal(431, "the request line and headers are too large")
    names = [name for name, _ in request.headers]
    # Whatever the method (an OPTIONS, too, can be chunked): the bytes behind a request framed
    # by a Transfer-Encoding are never read as a request, so a proxy in front that frames by
    # the other header cannot smuggle one past it; and a body's size is known before it is read.
    if b"transfer-encoding" in names:
        if b"content-length" in names:
            return _refusal(400, "both Content-Length and Transfer-Encoding")
        return _refusal(411, "a Content-Length is required (no Transfer-Encoding)")
    return None


def _answer_to(error: h11.RemoteProtocolError) -> tuple[int, str]:
    """The status and message for a request refused by :func:`_screen` or by h11. h11's own
    words are not sent (some quote the request back); its status is a hint, but for a transfer
    coding it does not know (its 501): that is framing refused whatever it says, and with a
    Content-Length a smuggling attempt (400, as for ``chunked``)."""
    said = str(error)
    status = error.error_status_hint
    if said in _OWN_REFUSALS:
        return status, said
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return 431, "the request line and headers are too large"
    if status == HTTPStatus.NOT_IMPLEMENTED or "Transfer-Encoding" in said:
        return 400, "Transfer-Encoding is not accepted: send a Content-Length"
    if "conflicting Content-Length" in said:
        return 400, "conflicting Content-Length headers"
    if "Content-Length" in said:
        return 400, "the Content-Length is not a number of bytes"
    if "peer closed" in said or "peer unexpectedly closed" in said:
        return 400, "the request was cut short"
    return 400, "malformed HTTP request"


_OWN_REFUSALS = frozenset(
    [
        "the request line and headers are too large",
        "both Content-Length and Transfer-Encoding",
        "a Content-Length is required (no Transfer-Encoding)",
    ]
)


class _ScreenedConnection(h11.Connection):
    """h11's connection, refusing the heads :func:`_screen` refuses as h11 refuses malformed
    ones (a ``RemoteProtocolError``), and keeping the last such error for the answer."""

    def __init__(self, limits: ConnectionLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.limits = limits
        self.refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:  # h11's own annotation is a union of event classes and sentinels
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            self.refused = e
            raise
        if isinstance(event, h11.Request) and (refused := _screen(event, self.limits)):
            self.refused = refused
            raise refused
        return event


def limited_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol under ``limits`` (module docstring): deadlines for a request and
    for an idle connection, header fields counted, and a ``Transfer-Encoding`` refused (400 with
    a ``Content-Length``, 411 alone). A refused request gets a short ``text/plain`` answer with
    ``Connection: close``, and the connection is closed after it: nothing behind the request
    is read as another.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _begun = False
        """Bytes of the next request have arrived (its deadline runs)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _ScreenedConnection(limits)

        # -- deadlines --

        def _arm(self, seconds: float, expired: Callable[[], None]) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _waiting(self) -> bool:
            """No request is being served: the next one's head has not all arrived."""
            return self.cycle is None or self.cycle.response_complete

        def _await_request(self) -> None:
            pending = bool(self.conn.trailing_data[0])  # pipelined bytes: it has begun
            self._begun = pending
            if pending:
                self._arm(limits.request_seconds, self._late)
            else:
                self._arm(limits.idle_seconds, self._idle)

        def _idle(self) -> None:
            self._timer = None
            if self._waiting() and not self._begun and not self.transport.is_closing():
                self.transport.close()

        def _late(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            reading_body = (
                limits.deadline_covers_body
                and not self._waiting()
                and self.cycle.more_body
                and self.conn.our_state is h11.SEND_RESPONSE
            )
            if not (self._waiting() or reading_body):
                return  # its request is in: what the application does is its own affair
            if self.cycle is not None and not self.cycle.response_complete:
                # The application may still be reading the body: it hears a disconnect, and
                # sends nothing over the answer below.
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            if limits.answer_slow_heads:
                seconds = f"{limits.request_seconds:g}"
                self._refuse(408, f"the request did not arrive within {seconds} s")
            else:
                self.transport.close()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]  # uvicorn's own annotation narrows it to asyncio.Transport
            self._await_request()

        def data_received(self, data: bytes) -> None:
            if data and not self._begun and self._waiting():
                self._begun = True
                self._arm(limits.request_seconds, self._late)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            cycle = self.cycle
            whole = cycle is not None and (not limits.deadline_covers_body or not cycle.more_body)
            if self._begun and whole and not cycle.response_complete:
                # A whole request is in: the application's deadlines take over.
                self._begun = False
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._await_request()
            super().on_response_complete()  # serves what was pipelined, if it is whole

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        # -- refusals --

        def send_400_response(self, msg: str) -> None:
            # uvicorn's own says "Invalid HTTP request received." for everything, without a
            # length (so chunked, to an HTTP/1.1 client): this one says which limit, framed.
            error = self.conn.refused
            status, message = (
                _answer_to(error) if error is not None else (400, "malformed HTTP request")
            )
            self._refuse(status, message)

        def _refuse(self, status: int, message: str) -> None:
            body = (message + "\n").encode()
            try:
                if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    response = h11.Response(
                        status_code=status,
                        headers=[
                            ("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"),
                            ("X-Content-Type-Options", "nosniff"),
                            ("Connection", "close"),
                        ],
                        reason=HTTPStatus(status).phrase.encode(),
                    )
                    for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                        self.transport.write(self.conn.send(event) or b"")
            except h11.LocalProtocolError:
                pass  # an answer is already under way: nothing more can be said
            self.transport.close()

    return LimitedH11


def bind(host: str, port: int, *, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A listening socket on ``host`` and ``port`` (0: a free one).

    Bound here, not by uvicorn: it exits the process (SystemExit) when it cannot bind, which
    from a task would take the worker serving next to it down too.

    Raises:
        OSError: the address cannot be had (in use, or not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    app: ASGIApp,
    *,
    limits: ConnectionLimits,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    ready: asyncio.Event | None = None,
    graceful_seconds: float = 5,
) -> None:
    """Serve ``app`` with uvicorn under ``limits`` until cancelled, on ``sock`` or on a socket
    bound to ``host`` and ``port``.

    Args:
        graceful_seconds: At shutdown, how long requests under way get to end before their
            connections are closed.

    Raises:
        OSError: the address cannot be bound (in use, or not this machine's).
    """
    import uvicorn

    own = sock is None
    listener = bind(host, port) if sock is None else sock
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",  # the apps have no start-up or shut-down of their own
        http=limited_protocol(limits),
        # The protocol's own deadlines hold first; uvicorn's keep-alive timer (reset by any
        # byte) is the same length, and never the shorter.
        timeout_keep_alive=limits.idle_seconds,  # type: ignore[arg-type]  # a float is what loop.call_later takes
        h11_max_incomplete_event_size=limits.max_header_bytes,
        limit_concurrency=limits.max_connections,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=graceful_seconds,  # type: ignore[arg-type]  # as above
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the caller's own handlers stay
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started and not task.done():  # noqa: ASYNC110  # uvicorn sets a flag, no event
            await asyncio.sleep(0.01)
        if ready is not None:
            ready.set()
        # Shielded: cancelling serve() stops uvicorn the way it stops itself (listeners
        # closed, open streams ended), not by cancelling it midway, which leaves it half
        # running in the event loop.
        await asyncio.shield(task)
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        if own:
            listener.close()


class Pool(concurrent.futures.Executor):
    """A fixed number of daemon threads. ``ThreadPoolExecutor``'s threads are joined when the
    interpreter exits, so a decode under way at a server's stop would hold the process (the
    worker's, under ``make run``) for as long as it takes; these are not waited for."""

    def __init__(self, workers: int, *, name: str) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None
        ] = queue.SimpleQueue()
        self._shut_down = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._lock:  # a job queued behind the threads' stop would never run
            if self._shut_down:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._jobs.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            del job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as e:  # noqa: BLE001  # the caller's to see, as the stdlib pool does
                    future.set_exception(e)
            # Not kept while waiting for the next job: a body or an answer can be 16 MiB.
            del future, call

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while (job := self._jobs.get_nowait()) is not None:
                    job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class ByteBudget:
    """Bytes reserved by requests at once, granted first come, first served (a large request is
    not overtaken for ever by small ones). Used on one event loop only."""

    def __init__(self, capacity: int) -> None:
        self._free = capacity
        self.capacity = capacity
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def reserved(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, size: int, *, timeout: float) -> float:
        """Reserve ``size`` bytes, waiting at most ``timeout`` seconds; the seconds waited.

        Raises:
            TimeoutError: no room in time (nothing is reserved).
        """
        if not self._waiting and size <= self._free:
            self._free -= size
            return 0.0
        loop = asyncio.get_running_loop()
        began = loop.time()
        entry = (size, loop.create_future())
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.release(size)  # granted just as the wait ended: hand it on
            else:
                # Its future was cancelled when the wait ended, but a release may have run
                # since, before this task did, and dropped the entry (see _grant).
                with contextlib.suppress(ValueError):
                    self._waiting.remove(entry)
                self._grant()  # it may have been first in line, holding up smaller ones
            raise
        return loop.time() - began

    def release(self, size: int) -> None:
        self._free += size
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            size, granted = self._waiting[0]
            if granted.done():
                # Its wait ended (its admission time, or a stop) and its task has not yet run
                # to leave the queue: it takes nothing, and holds up nobody.
                self._waiting.popleft()
                continue
            if size > self._free:
                return
            self._waiting.popleft()
            self._free -= size
            granted.set_result(None)

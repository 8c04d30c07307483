"""What both HTTP servers of the product share: the web app (:mod:`client.web`) and the codec
server (:mod:`temporal_agent_interrupts.codec_server`). Both are ASGI applications served by
uvicorn's h11 protocol through :func:`serve`, with the connection rules of
:class:`ConnectionLimits` enforced by :func:`limited_protocol`; the Host and Origin rules are
:mod:`temporal_agent_interrupts.http_rules`.

Internal: not covered by the 0.1.x stability promise; its public name (``serve``) is imported
from ``temporal_agent_interrupts.web``.

uvicorn bounds a request's head in size (``h11_max_incomplete_event_size``) and an idle
keep-alive connection in time, but not a request's head in time: its keep-alive timer starts
only after a first response, and any byte resets it (Kludex/uvicorn#157), so a client that
trickles a byte every few seconds holds its connection for ever. Nor does it count header
fields, refuse a ``Transfer-Encoding``, bound an answer's time, or stop reading a client that
pipelines requests and takes no answer (it reads on after each one, and h11 keeps what it
reads). What :func:`limited_protocol` adds, each per :class:`ConnectionLimits`:

- a deadline for a request's line and headers from its first byte (408, or a quiet close), one
  for a connection that begins no request, and the start of it in the request's scope for the
  application's body deadline (:func:`request_deadline`);
- header fields counted (431) and a ``Transfer-Encoding`` refused (400 with a
  ``Content-Length``, 411 alone), closed, nothing behind it read as a request;
- after a request that asks to upgrade, the connection closed;
- an answer's deadline from its first byte, then a reset (what is queued dropped);
- a close that lingers (the client reads its answer, not a reset), then waits for the kernel's
  queue to empty until the answer's deadline (SIOCOUTQ), then resets;
- at most :data:`_READ_AHEAD_BYTES` of pipelined requests held unparsed;
- a request half closed by the client answered (400 if it was cut short), and so is every
  whole request it pipelined before its end.

:func:`serve` accepts connections itself (a slot first, with ``queue_excess``, so that past the
limit they wait in the kernel's queue) and sets ``TCP_NODELAY`` on each, which asyncio does
not for a socket bound as ours is. The protocol reads uvicorn's ``H11Protocol`` (``conn``,
``cycle``, ``flow``, ``transport``, ``logger`` and the hooks it overrides), its
``RequestResponseCycle``'s state, ``FlowControl`` and ``ServerState``: the raw-socket tests
of both servers fail if those change.

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
import logging
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar, cast

import h11

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

_T = TypeVar("_T")

log = logging.getLogger("temporal_agent_interrupts.http_server")

_READ_AHEAD_BYTES = 64 * 1024
"""Pipelined bytes a connection holds unparsed before it stops reading."""

LISTEN_BACKLOG = 128
"""Connections the kernel queues for a listener before they are accepted."""

FILE_HEADROOM = 64
"""File descriptors :func:`serve` leaves to the rest of the process beyond those it has open
at start (the Temporal client's reconnects, a worker served beside the app, the one more
connection that is accepted only to be refused): connections are capped below the
open-file limit by this much. A server that ran out took no connection at all (the kernel
queued them, unanswered) and left nothing for the rest of the process."""


@dataclass(frozen=True)
class FileRoom:
    """What the open-file limit leaves for connections (:func:`file_room`)."""

    soft: int
    """The soft ``RLIMIT_NOFILE`` now (raised to the hard one where it was lower)."""
    hard: int
    open: int
    """File descriptors the process had open."""

    @property
    def connections(self) -> int:
        """Connections the process can hold with :data:`FILE_HEADROOM` to spare (at least 1)."""
        return max(1, self.soft - self.open - FILE_HEADROOM)


def file_room() -> FileRoom | None:
    """Raise this process's soft open-file limit to its hard one, and say what it leaves for
    connections; None where the platform has no such limit (Windows).

    Each connection is a file descriptor, and the soft limit is often 1,024 where the hard one
    is far higher: a server holding a thousand streams ran out. The hard limit is the
    operator's to set (``ulimit -Hn``, ``LimitNOFILE=``); the soft one any process may raise
    up to it, as Go's runtime does at start.
    """
    try:
        import resource  # Unix's: imported here, so that the web app imports anywhere
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    if soft != infinity and (hard == infinity or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # macOS refuses more than its OPEN_MAX
            log.debug("the open-file limit stays at %d: %s", soft, e)
    # Infinity is no number of files; Linux's own ceiling (nr_open) is 2**20 by default.
    soft, hard = (v if v != infinity else 1 << 20 for v in (soft, hard))
    return FileRoom(soft=soft, hard=hard, open=_open_files())


def _open_files() -> int:
    """File descriptors this process has open (0 where it cannot say)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(where))
    return 0


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What one connection may take of a server, before any application code runs.

    Raises:
        ValueError: a limit that is not positive.
    """

    request_seconds: float
    """From a request's first byte, the time its line and headers have to arrive, however
    slowly they trickle. An application that bounds its body by the same deadline reads it
    from :func:`request_deadline`."""
    idle_seconds: float
    """A connection that starts no request for this long is closed, with nothing said: a new
    one, or one kept alive between requests."""
    max_header_bytes: int
    """The request line and headers, in bytes (431 over it)."""
    max_headers: int
    """Header fields of one request (431 over it)."""
    max_connections: int
    """Connections served at once (see ``queue_excess``)."""
    queue_excess: bool = False
    """Past ``max_connections``, connections wait in the kernel's queue, not accepted (and
    holding no file descriptor) until one closes. Without it they are accepted, and a request
    on one gets 503 (uvicorn's ``limit_concurrency``)."""
    response_seconds: float | None = None
    """From an answer's first byte, the time the client has to take all of it; past it, the
    connection is reset and what is still queued for it dropped. None: no deadline (a stream
    follows a conversation for as long as it runs)."""
    linger_seconds: float | None = None
    """After an answer that closes its connection, what the client still sends is read and
    thrown away for up to this long, so that it reads the answer rather than a reset. None:
    closed at once."""
    answer_slow_heads: bool = True
    """A request that misses its deadline gets 408 before the close; without it, the
    connection is closed with nothing said."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not isinstance(value, bool) and not value > 0:
                raise ValueError(f"ConnectionLimits.{field.name} must be positive")


REQUEST_STARTED = "temporal_agent_interrupts.request_started"
"""The key, in a request's ASGI scope's ``extensions``, of when its first byte arrived
(``loop.time()``)."""


def request_deadline(scope: Mapping[str, Any], limits: ConnectionLimits) -> float:
    """When a request's whole body must be in (``loop.time()``): ``request_seconds`` from its
    first byte, as for its head. Now plus ``request_seconds`` for a request not served by
    :func:`serve` (an application mounted elsewhere)."""
    started = scope.get("extensions", {}).get(REQUEST_STARTED)
    if started is None:
        started = asyncio.get_running_loop().time()
    return float(started) + limits.request_seconds


@dataclass
class Connections:
    """How many connections a server holds now (:func:`serve` counts them)."""

    open: int = 0


class _ClientFaults(logging.LoggerAdapter):
    """uvicorn's protocol logger, its warnings at debug: it warns of every malformed request
    and unsupported upgrade, a client's doing, so anyone who can connect could fill the
    operator's log. Its errors (an application's exception) stay errors."""

    @property
    def level(self) -> int:  # uvicorn reads it to decide on its trace logs
        return self.logger.level

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)


def _unsent(sock: Any) -> int:
    """Bytes the kernel still holds to send on ``sock`` (or has sent, unacknowledged); 0 where
    it cannot say (SIOCOUTQ is Linux's)."""
    try:
        import fcntl  # Unix's: imported here, so that the web app imports anywhere

        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
    except (ImportError, OSError):
        return 0


_SIOCOUTQ = 0x5411  # <linux/sockios.h>, the same as TIOCOUTQ


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
        self.request: h11.Request | None = None
        """The request refused by :func:`_screen`: its head was read whole."""

    def next_event(self) -> Any:  # h11's own annotation is a union of event classes and sentinels
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            self.refused = e
            raise
        if isinstance(event, h11.Request) and (refused := _screen(event, self.limits)):
            self.refused, self.request = refused, event
            raise refused
        return event


class _Transport:
    """A connection's transport as the protocol's application side sees it: a close lingers
    (``ConnectionLimits.linger_seconds``), and the first write of an answer starts its
    deadline. Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._protocol.answering()
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._protocol.closing()


RefusalHeaders = Callable[[list[tuple[bytes, bytes]]], list[tuple[str, str]]]
"""Headers for the protocol's own refusal of a request whose head it read (a
``Transfer-Encoding``, too many fields), from that head's fields (lower-case names): an
application's CORS headers, so that a page it allows can read why."""


def limited_protocol(
    limits: ConnectionLimits,
    *,
    closed: Callable[[], None] | None = None,
    refusal_headers: RefusalHeaders | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol under ``limits`` (module docstring): deadlines for a request's
    head, for an idle connection and for an answer; header fields counted; a
    ``Transfer-Encoding`` refused (400 with a ``Content-Length``, 411 alone). A refused request
    gets a short ``text/plain`` answer with ``Connection: close``, and the connection is closed
    after it: nothing behind the request is read as another. ``closed`` is called once the
    connection is.
    """
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedFlow(FlowControl):
        """uvicorn's flow control, reading no further while h11 holds
        :data:`_READ_AHEAD_BYTES` unparsed. uvicorn reads on after each answer and at each
        receive of the application, whether or not the client takes its answers, and h11 keeps
        what is read: a client that pipelines requests and reads no answer would fill memory
        without end, a read (up to 256 KiB) per request."""

        def __init__(self, transport: asyncio.Transport, conn: h11.Connection) -> None:
            super().__init__(transport)
            self._conn = conn

        def _full(self) -> bool:
            return len(self._conn.trailing_data[0]) >= _READ_AHEAD_BYTES

        def resume_reading(self) -> None:
            if not self._full():
                super().resume_reading()

        def pause_reading_if_full(self) -> None:
            if self._full():
                self.pause_reading()

    class LimitedH11(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _answer_timer: asyncio.TimerHandle | None = None
        _linger_timer: asyncio.TimerHandle | None = None
        _begun = False
        """Bytes of the next request have arrived (its deadline runs)."""
        _started = 0.0
        _stopping = False
        _quiet = False
        """Closed with nothing said (idle, or a head too slow): no linger."""
        _lingering = False
        _answer_deadline = 0.0
        _half_closed = False
        _raw: asyncio.Transport

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _ScreenedConnection(limits)
            self.logger = _ClientFaults(self.logger)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self._raw = transport
            super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]  # a stand-in with the transport's methods
            self._bounded = BoundedFlow(self.transport, self.conn)
            self.flow = self._bounded
            self._await_request()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._timer, self._answer_timer, self._linger_timer):
                if timer is not None:
                    timer.cancel()
            self._timer = self._answer_timer = self._linger_timer = None
            super().connection_lost(exc)
            if closed is not None:
                closed()

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
                self._started = self.loop.time()
                self._arm(limits.request_seconds, self._late)
            else:
                self._arm(limits.idle_seconds, self._idle)

        def _idle(self) -> None:
            self._timer = None
            if self._waiting() and not self._begun and not self.transport.is_closing():
                self._quiet = True  # nothing was asked: nothing to linger for
                self.transport.close()

        def _late(self) -> None:
            self._timer = None
            if not self._waiting() or self.transport.is_closing():
                return  # its head is in: what the application does is its own affair
            if limits.answer_slow_heads:
                seconds = f"{limits.request_seconds:g}"
                self._refuse(408, f"the request did not arrive within {seconds} s")
            else:
                self._quiet = True
                self.transport.close()

        def answering(self) -> None:
            """The transport is written to: the first write of an answer starts its deadline
            (not a ``100 Continue``: the body comes after it, under the request's deadline)."""
            if limits.response_seconds is None or self._answer_timer is not None:
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started and not cycle.response_complete:
                return
            self._answer_deadline = self.loop.time() + limits.response_seconds
            self._answer_timer = self.loop.call_later(limits.response_seconds, self._too_slow)

        def _too_slow(self) -> None:
            self._answer_timer = None
            cycle = self.cycle
            unsent = self._raw.get_write_buffer_size()
            if unsent or (cycle is not None and not cycle.response_complete):
                self.cut_off()

        def cut_off(self) -> None:
            """Reset the connection: what is still queued for the client, here and in the
            kernel, is dropped, not fed to it from an orphaned socket for as long as it reads."""
            sock = self._raw.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self._raw.abort()

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # thrown away: never read as a request
            if data and not self._begun and self._waiting():
                self._begun = True
                self._started = self.loop.time()
                self._arm(limits.request_seconds, self._late)
            super().data_received(data)
            self._bounded.pause_reading_if_full()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and cycle is not before:
                # A whole head is in: its application bounds its body from the same start.
                scope = cast("dict[str, Any]", cycle.scope)  # ASGI's extensions are open
                extensions = scope.setdefault("extensions", {})
                extensions[REQUEST_STARTED] = self._started if self._begun else self.loop.time()
                if any(name == b"upgrade" for name, _ in cycle.scope["headers"]):
                    # No protocol is switched to (uvicorn's websockets are off, in serve):
                    # what follows such a request is never read as another (an h2c preface).
                    cycle.keep_alive = False
                self._begun = False
                self._disarm()
                if self._answer_timer is not None:
                    self._answer_timer.cancel()
                    self._answer_timer = None

        def on_response_complete(self) -> None:
            if self._half_closed and not self._pipelined():
                self.transport.close()  # the client sends no more: its answer was the last
                return
            if not self.transport.is_closing():
                self._await_request()
            super().on_response_complete()  # serves what was pipelined, if it is whole
            if self._half_closed and not self.transport.is_closing():
                # The client's end came behind what it pipelined: a head or a body not whole
                # now never will be.
                cycle = self.cycle
                if self._waiting():
                    self._refuse(400, "the request was cut short")
                elif cycle is not None and self.conn.their_state is h11.SEND_BODY:
                    cycle.disconnected = True  # its application hears a disconnect
                    cycle.message_event.set()
                    self._refuse(400, "the request was cut short")

        def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's Protocol allows True (keep writing); uvicorn's annotation is narrower
            """The client is done sending (it may still read). A request half in is answered
            400 (``the request was cut short``); a whole one not yet answered is answered, then
            the connection closed; a connection idle or answering (a stream) is closed."""
            if self._lingering:
                if self._linger_timer is not None and not self._raw.is_closing():
                    self._linger_end()  # nothing more will come to throw away
                return True  # it may still be reading its answer
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.more_body and not cycle.response_started:
                    cycle.disconnected = True  # its application hears a disconnect
                    cycle.message_event.set()
                    self._refuse(400, "the request was cut short")
                    return True
                if cycle.response_started:
                    return None  # as uvicorn does: a stream's client has gone
                self._half_closed = True  # a whole request, not yet answered: answer it
                return True
            if self._pipelined():
                self._refuse(400, "the request was cut short")
                return True
            return None

        def _pipelined(self) -> bool:
            """Bytes of another request are held unparsed (blank lines, which h11 skips
            before a request, are none)."""
            return bool(self.conn.trailing_data[0].lstrip(b"\r\n"))

        def shutdown(self) -> None:
            self._stopping = True  # the server stops: no linger
            super().shutdown()

        def stop(self) -> None:
            """Close now, the server's grace over: reset if an answer is still queued (a close
            would wait for the client to take it)."""
            self._stopping = True
            if self._raw.get_write_buffer_size():
                self.cut_off()
            elif not self._raw.is_closing():
                self._raw.close()

        def timeout_keep_alive_handler(self) -> None:
            pass  # uvicorn's keep-alive timer: the idle deadline (_idle) is this protocol's

        def closing(self) -> None:
            """The application side closed the transport: linger (module docstring), unless
            the server is stopping or the client has gone; then close once the client has
            taken its answer (:meth:`_close_when_taken`)."""
            raw = self._raw
            if raw.is_closing():
                return
            if self._stopping:
                raw.close()
                return
            self._lingering = True  # what the client still sends is never read as a request
            self._disarm()
            if self._quiet or limits.linger_seconds is None or not raw.can_write_eof():
                self._close_when_taken()
                return
            raw.write_eof()  # after what is queued: the answer first, then the end
            self._linger_timer = self.loop.call_later(limits.linger_seconds, self._linger_end)

        def _linger_end(self) -> None:
            if self._linger_timer is not None:
                self._linger_timer.cancel()
            self._linger_timer = None
            self._close_when_taken()

        def _close_when_taken(self) -> None:
            """Close once the client has taken its answer, here and in the kernel; at the
            answer's deadline, reset what is left. An answer the kernel took whole (a megabyte
            fits its send buffer on loopback) would otherwise be fed, from a socket this server
            no longer counts, to a client that reads it slowly, for as long as it reads."""
            raw = self._raw
            if raw.is_closing():
                return
            sock = raw.get_extra_info("socket")
            queued = raw.get_write_buffer_size() or (sock is not None and _unsent(sock))
            if not queued or limits.response_seconds is None:
                raw.close()
            elif self.loop.time() >= self._answer_deadline:
                self.cut_off()
            else:
                # A kernel count: there is no event to wait for.
                self._linger_timer = self.loop.call_later(0.05, self._close_when_taken)

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
            request = self.conn.request
            extra = []
            if refusal_headers is not None and request is not None:
                extra = refusal_headers([(k.lower(), v) for k, v in request.headers])
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
                            *extra,
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
    sock.setblocking(False)
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
    connections: Connections | None = None,
    refusal_headers: RefusalHeaders | None = None,
) -> None:
    """Serve ``app`` with uvicorn's protocol under ``limits`` until cancelled, on ``sock`` or
    on a socket bound to ``host`` and ``port``.

    It accepts connections itself, not through uvicorn's ``Server``: so that, with
    ``limits.queue_excess``, a connection past ``max_connections`` is not accepted at all.
    It raises the process's soft open-file limit to the hard one, and takes at most as many
    connections as that leaves room for (:func:`file_room`), saying so in its log when that is
    fewer than ``max_connections``; without ``queue_excess``, a request past them gets a 503
    that says why (:func:`_full`), and the connections already served go on.

    Args:
        graceful_seconds: At a stop, how long requests under way get to end before they are
            cancelled and their connections closed.
        connections: Counts the connections open, for the caller's metrics.
        refusal_headers: Headers for the protocol's own refusals (:data:`RefusalHeaders`).

    Raises:
        OSError: the address cannot be bound (in use, or not this machine's).
    """
    import uvicorn
    from uvicorn.server import ServerState

    capacity = limits.max_connections
    room = file_room()
    if room is not None and room.connections < capacity:
        capacity = room.connections
        log.warning(
            "serving at most %d connections at once, not %d: the open-file limit is %d "
            "(hard limit %d) and %d files are open; raise the hard limit (ulimit -Hn, "
            "systemd's LimitNOFILE=) to serve more",
            capacity,
            limits.max_connections,
            room.soft,
            room.hard,
            room.open,
        )
    own = sock is None
    listener = bind(host, port) if sock is None else sock
    listener.setblocking(False)
    state = ServerState()
    if not limits.queue_excess:
        # uvicorn's own limit_concurrency answers "Service Unavailable" and logs nothing the
        # operator sees (its warnings are a client's doing here: _ClientFaults).
        app = _full(app, state=state, capacity=capacity)
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",  # the apps have no start-up or shut-down of their own
        # No websockets: uvicorn would hand an ``Upgrade: websocket`` request to its websocket
        # protocol (``websockets`` is installed, for google-genai), which replaces this one on
        # the transport, so the connection's close is never counted (its slot held for ever)
        # and none of the deadlines hold. Refused as any other upgrade: answered, then closed.
        ws="none",
        # The protocol's own idle deadline holds first; uvicorn's keep-alive timer (reset by
        # any byte) is the same length.
        timeout_keep_alive=limits.idle_seconds,  # type: ignore[arg-type]  # loop.call_later takes a float
        h11_max_incomplete_event_size=limits.max_header_bytes,
        limit_concurrency=None,  # queue_excess's slots, or _full's 503
        server_header=False,
        date_header=False,
    )
    config.load()
    count = connections if connections is not None else Connections()
    slots = asyncio.Semaphore(capacity)

    def lost() -> None:
        count.open -= 1
        if limits.queue_excess:
            slots.release()

    protocol = limited_protocol(limits, closed=lost, refusal_headers=refusal_headers)
    loop = asyncio.get_running_loop()

    async def accept() -> None:
        while True:
            if limits.queue_excess:
                # A slot first, then accept: past the limit, connections wait in the kernel's
                # queue, holding no file descriptor of this process.
                await slots.acquire()
            try:
                client, _ = await loop.sock_accept(listener)
            except (ConnectionAbortedError, InterruptedError):
                if limits.queue_excess:
                    slots.release()
                continue
            except OSError as e:  # out of file descriptors or memory: try again shortly
                if limits.queue_excess:
                    slots.release()
                log.warning("cannot accept a connection: %s", e)
                await asyncio.sleep(0.5)
                continue
            count.open += 1
            # Answers go out as a head and then a body: without this, Nagle's algorithm holds
            # the body for the client's delayed ACK (40 ms a request). asyncio sets it only on
            # a socket made with IPPROTO_TCP, which an accepted one (proto 0) is not.
            with contextlib.suppress(OSError):
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await loop.connect_accepted_socket(
                    lambda: protocol(config=config, server_state=state, app_state={}),  # type: ignore[call-arg]  # uvicorn's protocol takes these
                    client,
                )
            except OSError:
                client.close()
                lost()

    accepting = asyncio.create_task(accept())
    try:
        if ready is not None:
            ready.set()
        await asyncio.shield(accepting)
    finally:
        accepting.cancel()
        await asyncio.gather(accepting, return_exceptions=True)
        if own:
            listener.close()
        # As uvicorn stops: idle connections closed, busy ones after their answer; past the
        # grace, requests under way cancelled and their connections closed.
        for connection in list(state.connections):
            connection.shutdown()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(graceful_seconds):
                while state.tasks:  # noqa: ASYNC110  # uvicorn keeps a set, no event
                    await asyncio.sleep(0.05)
        for connection in list(state.connections):
            connection.stop()  # type: ignore[attr-defined]  # every connection is a LimitedH11
        for task in list(state.tasks):
            task.cancel()
        await asyncio.gather(*state.tasks, return_exceptions=True)
        await asyncio.sleep(0)  # connection_lost runs: every count given back


def _full(app: ASGIApp, *, state: Any, capacity: int) -> ASGIApp:
    """``app``, but a request on a connection past ``capacity`` (uvicorn's ``ServerState``
    counts them, this one too) gets a 503 that says the server is full, with
    ``Connection: close``; the connections within it are served as ever."""
    body = (
        f"this server holds as many connections as it can take ({capacity}): try again shortly\n"
    ).encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    warned = False

    async def full_or_app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal warned
        if scope["type"] != "http" or len(state.connections) <= capacity:
            warned = False
            await app(scope, receive, send)
            return
        if not warned:  # once each time it fills: a flood of them would fill the log
            warned = True
            log.warning("%d connections open, the most this server takes: refusing (503)", capacity)
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return full_or_app


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

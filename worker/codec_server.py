"""``agent-codec-server``: Temporal's remote codec protocol over HTTP.

The Temporal UI (its codec endpoint setting, or the dev server's ``--ui-codec-endpoint``) and the
``temporal`` CLI (``--codec-endpoint``) send payloads here to be shown in the clear: ``POST
/decode`` and ``POST /encode`` take ``{"payloads": [...]}`` (the proto3 JSON of
``temporal.api.common.v1.Payloads``: metadata values and data in base64) and answer the same
shape, through the same codec the workers use (:mod:`client.codec`, keys from
``AGENT_PAYLOAD_KEYS``).

Whoever can reach it can read every conversation of the namespaces it serves (``/decode``), and
encrypt whatever they like under the fleet's key (``/encode``: an encryption oracle), so:

- it listens on 127.0.0.1 unless ``--host`` says otherwise;
- it answers only requests whose ``Host`` header names it: ``localhost``, ``127.0.0.1`` or
  ``[::1]`` with its port, the ``--host`` it listens on, or a name given with ``--allowed-host``
  (a proxy's); others get 403, as does anything that is not a host and a port. A web page
  cannot then reach it by DNS rebinding (a name of the attacker's that resolves to 127.0.0.1
  sends that name as ``Host``). The target must be a path (``/decode``): one in absolute form
  (``http://other/decode``) or ``//other/decode`` names an authority of its own, and gets 400;
- a request must name one of its namespaces in ``X-Namespace`` (the header the UI and the CLI
  send); others get 403;
- browsers get CORS headers only for the origins given with ``--cors-origin`` (the UI's:
  ``http://localhost:8233`` for the dev server, ``https://cloud.temporal.io`` for Temporal
  Cloud); the preflight allows ``content-type``, ``x-namespace`` and ``authorization``;
- answers carry ``Cache-Control: no-store``: a browser keeps no decoded payload on disk;
- it refuses to start without keys (there would be nothing to decode);
- every complete request gets an answer, however malformed (400, or 500 for a fault of its
  own), never a dropped connection.

It checks no ``Authorization`` header itself: put it behind a proxy that does (and terminates
TLS, which the Cloud UI requires) when it must be reachable beyond one machine, and name the
proxy with ``--allowed-host``.

**The HTTP stack, and what it holds under load.** It is asyncio's sockets with h11, a strict,
maintained HTTP/1.1 parser that does no I/O of its own, so every deadline and limit below is
this module's and each has a test (``tests/test_codec_server.py``). Not a web framework:
google-genai sends every model call through aiohttp whenever aiohttp is installed, so adding one
to the worker's image would quietly change how the worker talks to Gemini, and uvicorn's header
phase has no deadline for a whole request. A client over a limit gets an answer, and the
connection is closed after it whenever its request was not read to the end:

- **Framing**: a body comes with a ``Content-Length`` (the UI and the CLI send one). A request
  of any method (a preflight too) with a ``Transfer-Encoding`` as well gets 400, one with a
  ``Transfer-Encoding`` alone 411, and either is closed: the bytes behind it are never read as
  a request, so a proxy in front that frames by the other header cannot smuggle one past it.
  Conflicting or malformed lengths: 400. Methods other than ``POST`` and ``OPTIONS``: 405
  (to a ``HEAD``, without a body).
- **Size**: a body over :data:`MAX_REQUEST_BYTES` (16 MiB) gets 413 before any of it is read;
  the request line and headers over :data:`MAX_HEADER_BYTES` (64 KiB) or
  :data:`MAX_HEADERS` (100) fields get 431. A body carries at most :data:`MAX_PAYLOADS`
  (4096) payloads, and at most 16 JSON values for each of them, counted by its brackets and
  separators before it is parsed (400 otherwise): a body of empty payloads (``{}``, three
  bytes) or of empty lists would otherwise cost a thread minutes, millions of Python objects,
  and an answer forty times its size. An answer is about its body's size, plus at most about
  130 bytes a payload (an encode's wrapping), and goes out in chunks of
  :data:`SEND_CHUNK_BYTES` (256 KiB), the loop free for other clients between them.
- **Time**: a request's line, headers and body must arrive within :data:`REQUEST_SECONDS` (30)
  of its first byte, however slowly they trickle (408, then closed); a connection that starts no
  request for :data:`IDLE_SECONDS` (15: a new one, or one kept alive between requests) is
  closed; a client that does not take its answer within :data:`RESPONSE_SECONDS` (30) is cut
  off, with a reset: what is still queued for it in the kernel is dropped, not fed to it from
  an orphaned socket for as long as it reads. So is an answer the kernel took whole but the
  client has not read when its connection closes (after the same 30 s from the answer's start:
  a close waits for the queue to empty until then). After an answer that closes, what the client
  still sends is read and thrown away for up to :data:`LINGER_SECONDS` (2), so that it reads
  the answer rather than a reset.
- **Connections**: at most :data:`MAX_CONNECTIONS` (64) at once; the next is not accepted until
  one closes, and waits in the kernel's queue (:data:`LISTEN_BACKLOG`, 128). Every connection's
  life is bounded by the deadlines above, so a slot always frees; and file descriptors (shared
  with the worker when it runs inside one) stay bounded too.
- **Memory**: a body of up to :data:`CONNECTION_BODY_BYTES` (64 KiB: the UI's and the CLI's
  decodes) is held in its connection's own room, as its head is, so 4 MiB at most in all
  (64 connections). Larger bodies being read, decoded or answered at once add up to at most
  :data:`MAX_BYTES_IN_FLIGHT` (32 MiB) by their ``Content-Length``, reserved before a body is
  read and freed when its answer is sent. A request that does not fit waits, first come first
  served, for up to :data:`ADMISSION_SECONDS` (10), then gets 503 with ``Retry-After: 1``. So a
  client that claims large bodies and sends nothing of them can keep other large requests
  waiting, for as long as :data:`REQUEST_SECONDS` lets it hold each claim, but never a small
  one. A body
  is turned into its answer payload by payload, never all held twice, so the process holds two
  to three times the budget at the peak (measured), and gives it back once answered (on glibc,
  with the mmap threshold fixed: :data:`MALLOC_MMAP_THRESHOLD`). Tested: six concurrent 16 MiB
  decodes peak under four times the budget and leave under half of it resident; they took the
  standard library's server from 104 to 676 MB.
- **CPU**: at most :data:`MAX_CONCURRENT_REQUESTS` (4) requests are parsed, decrypted and
  rendered at once, in a pool of that many threads; others wait their turn, their bodies held.

**Threads.** The server runs its own event loop in a thread of its own (``codec-server``), and
the CPU work (JSON, AES-GCM, base64) runs in its pool (``codec-server-work``), not on that loop.
The pool's threads are daemons: a decode under way at ``stop()`` is not waited for, by ``stop()``
or by the process's exit.
``make run`` starts it inside the worker process (``worker/__main__.py``), and a request's
sockets, deadlines and waits must never be the worker's event loop's business, nor the worker's
activities theirs: a busy worker does not stall the UI's decodes, and no client, however slow or
malicious, holds anything on the worker's loop. The pool keeps the server's own loop free to
enforce deadlines and accept while a 16 MiB decode runs. What one process cannot avoid is the
GIL: a large decode holds it for tens of milliseconds at a time, which the worker's loop feels as
latency; run the server as its own process (``agent-codec-server``, the compose
``codec`` service) where that matters.

Exit codes: 0 after SIGTERM or Ctrl-C (or a printed ``--generate-key``); 2 for a bad setting (no
keys, unusable keys, a bad option); 1 when it cannot listen on its port.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import json
import logging
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Any, NoReturn, Self, TypeVar

import h11
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from temporal_agent_interrupts.codec import (
    EncryptionCodec,
    PayloadKeyMissing,
    PayloadKeys,
    PayloadKeysError,
    generate_key,
    load_keys,
)
from temporal_agent_interrupts.http_rules import (
    LOOPBACK_NAMES,
    host_allowed,
    origin,
    site_origins,
)
from temporal_agent_interrupts.http_server import ByteBudget as _ByteBudget
from temporal_agent_interrupts.http_server import Pool as _Pool

log = logging.getLogger("temporal_agent_interrupts.worker.codec_server")

_T = TypeVar("_T")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
DEV_UI_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")
"""The embedded dev server's UI, under both names a browser may use for it."""
ALLOWED_HEADERS = "content-type, x-namespace, authorization"
# The limits (module docstring). Each is the default of a field of Limits, for tests and for a
# team that embeds the server with other needs.
#
# Temporal's payload limit is 2 MiB, base64 adds a third and JSON some more; one request may
# carry several payloads (an event's input, say).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# Two of the largest requests at once; about twice this is what the process may hold for them.
MAX_BYTES_IN_FLIGHT = 32 * 1024 * 1024
# The request line and headers. The UI may send its access token and, to localhost, the
# cookies of every local service (a browser's cookies do not care about ports): generous.
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 100
# From a request's first byte to its last: 16 MiB over a slow uplink fits; a client sending one
# byte every few seconds (which a per-read timeout never stops) does not.
REQUEST_SECONDS = 30.0
# A connection with no request started: a browser's keep-alive between decodes, or a client
# that connected and sends nothing.
IDLE_SECONDS = 15.0
RESPONSE_SECONDS = 30.0
# Waiting for room under MAX_BYTES_IN_FLIGHT: longer than a 16 MiB decode takes (about 0.1 s of
# CPU) many times over, so the UI's bursts wait rather than fail.
ADMISSION_SECONDS = 10.0
LINGER_SECONDS = 2.0
# Chromium opens at most six connections to a host, the CLI one or two: room for a team.
MAX_CONNECTIONS = 64
# The work is CPU under one GIL: more threads would not go faster, only hold more memory.
MAX_CONCURRENT_REQUESTS = 4
# A connection's own room for one small body, as it has for its head: the UI's and the CLI's
# decodes are a few kilobytes, and a client that claims large bodies and sends nothing (so
# holding the shared budget for REQUEST_SECONDS) cannot keep them waiting.
CONNECTION_BODY_BYTES = 64 * 1024
# An event's payloads are a handful. A body of empty ones ({} apiece) would cost a thread
# seconds and be answered forty times its size (each grows by its encryption's ~130 bytes).
MAX_PAYLOADS = 4096
# JSON values (counted by their brackets and separators, before parsing) a payload may bring:
# its object, metadata, keys and values. More are refused unparsed: 16 MiB of `[],` would be
# five million Python lists.
_VALUES_PER_PAYLOAD = 16
# An answer's pieces are sent in chunks of about this, the loop free between them.
SEND_CHUNK_BYTES = 256 * 1024
LISTEN_BACKLOG = 128
READ_BYTES = 64 * 1024
# A Content-Length of more digits is refused as malformed (400), not as too large (413).
_MAX_LENGTH_DIGITS = 12
# glibc's malloc raises its mmap threshold after the first large free (up to 32 MiB); from then
# on, buffers of a decode's size are carved from per-thread arenas, which keep them resident.
# Measured (six concurrent 16 MiB decodes): +208 MiB at the peak and +176 MiB kept after; with
# the threshold fixed at this, +64 MiB and +1 MiB. See _fix_malloc_mmap_threshold.
MALLOC_MMAP_THRESHOLD = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter, from glibc's <malloc.h>


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one server holds at once, and for how long (module docstring; the defaults are the
    module's constants).

    Raises:
        ValueError: a limit that is not positive, or a request limit over the byte budget (such
            a request could never be admitted).
    """

    max_request_bytes: int = MAX_REQUEST_BYTES
    max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT
    max_header_bytes: int = MAX_HEADER_BYTES
    max_headers: int = MAX_HEADERS
    max_connections: int = MAX_CONNECTIONS
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS
    connection_body_bytes: int = CONNECTION_BODY_BYTES
    max_payloads: int = MAX_PAYLOADS
    request_seconds: float = REQUEST_SECONDS
    idle_seconds: float = IDLE_SECONDS
    response_seconds: float = RESPONSE_SECONDS
    admission_seconds: float = ADMISSION_SECONDS
    linger_seconds: float = LINGER_SECONDS

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"Limits.{field.name} must be positive")
        if self.max_request_bytes > self.max_bytes_in_flight:
            raise ValueError("Limits.max_request_bytes must not exceed max_bytes_in_flight")


@dataclass(frozen=True)
class Load:
    """What a server holds now (:attr:`CodecServer.load`): for tests, logs and metrics."""

    connections: int
    """Accepted and not yet closed."""
    bytes_in_flight: int
    """The ``Content-Length`` of the bodies admitted and not yet answered."""
    waiting_for_bytes: int
    """Requests waiting for room under the byte budget."""
    processing: int
    """Requests being parsed, transformed or rendered."""
    waiting_to_process: int
    """Requests read, waiting for a thread."""


def _fix_malloc_mmap_threshold() -> None:
    """Fix glibc's mmap threshold at :data:`MALLOC_MMAP_THRESHOLD`, so that a decode's large
    buffers go back to the system when freed, from whichever thread.

    Process-wide, so the worker's too under ``make run``: its allocations of 1 MiB or more are
    mapped and unmapped each time, as glibc does from 128 KiB until it first adjusts. Left alone
    when the environment tunes malloc itself, and off glibc (musl maps large blocks anyway).
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (ValueError, OSError, AttributeError):
        return  # not glibc
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD):
        log.debug("mallopt(M_MMAP_THRESHOLD) refused: large buffers may stay resident")


@dataclass(frozen=True, kw_only=True)
class _Reply:
    status: int
    body: Sequence[bytes]
    """The body in pieces, sent one after another (never joined: an answer can be 16 MiB)."""
    content_type: str = "text/plain; charset=utf-8"
    headers: Sequence[tuple[str, str]] = ()
    close: bool = False
    """Close the connection after it (the request's body was not read, or cannot be trusted)."""


def _text(
    status: int, message: str, *, close: bool = False, headers: Sequence[tuple[str, str]] = ()
) -> _Reply:
    return _Reply(status=status, body=[(message + "\n").encode()], close=close, headers=headers)


def _protocol_refusal(error: h11.RemoteProtocolError) -> _Reply:
    """The answer to a request h11 would not parse. h11's own words are not sent (some quote
    the request back); the status is its hint, but for a transfer coding it does not know
    (its 501): that is framing this server refuses whatever it says, and with a Content-Length
    it is a smuggling attempt (400, as for ``chunked``)."""
    said = str(error)
    if error.error_status_hint == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return _text(431, "the request line and headers are too large", close=True)
    if error.error_status_hint == HTTPStatus.NOT_IMPLEMENTED or "Transfer-Encoding" in said:
        return _text(400, "Transfer-Encoding is not accepted: send a Content-Length", close=True)
    if "conflicting Content-Length" in said:
        return _text(400, "conflicting Content-Length headers", close=True)
    if "Content-Length" in said:
        return _text(400, "the Content-Length is not a number of bytes", close=True)
    if "peer closed" in said or "peer unexpectedly closed" in said:
        return _text(400, "the request was cut short", close=True)
    return _text(400, "malformed HTTP request", close=True)


class _NotPayloads(ValueError):
    """The body is not the proto3 JSON of ``Payloads``."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # as json_format.Parse refuses them
        raise _NotPayloads("duplicate key")
    return found


def _base64(value: object) -> bytes:
    """A proto3 JSON ``bytes`` value, as json_format reads one (standard or URL-safe alphabet,
    padding optional, characters outside the alphabet skipped), without its copies of the text
    when it is well formed: this is the one field that is large."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise _NotPayloads("data is not a string")
    if "-" in value or "_" in value:
        value = value.translate(_URL_SAFE)
    try:
        # An ASCII str is read in place; a decoding that succeeds ends on a whole quantum, so
        # json_format's padding would not have changed it.
        return binascii.a2b_base64(value if value.isascii() else value.encode())
    except binascii.Error:
        encoded = value.encode()  # json_format pads by the UTF-8's length, whatever it holds
        return binascii.a2b_base64(encoded + b"=" * (4 - len(encoded) % 4))


_URL_SAFE = str.maketrans("-_", "+/")


class _TooManyPayloads(ValueError):
    """More payloads in one body than :attr:`Limits.max_payloads`."""


def _json_values(body: bytearray) -> int:
    """At least the number of JSON values in ``body`` less one (each but the first follows a
    comma or a colon, or opens with a bracket), found without parsing it; brackets and
    separators inside strings count too, which only errs high."""
    return sum(body.count(mark) for mark in (b",", b":", b"{", b"["))


def _parse(body: bytearray, *, max_payloads: int) -> list[Payload]:
    """The payloads of a request's body, emptying ``body`` as soon as it has been read (so that
    the text, the JSON and the payloads are never all held at once).

    Raises:
        _TooManyPayloads: more than ``max_payloads``, or more JSON values than they could hold
            (counted before the body is parsed).
        _NotPayloads, json_format.ParseError, ValueError, RecursionError: not ``Payloads``.
    """
    if _json_values(body) > _VALUES_PER_PAYLOAD * max_payloads:
        raise _TooManyPayloads
    text = body.decode("utf-8")  # strict, as json_format.Parse
    body.clear()
    document = json.loads(text, object_pairs_hook=_unique_keys)
    del text
    if not isinstance(document, dict):
        raise _NotPayloads("not an object")
    items = document.pop("payloads", None)
    json_format.ParseDict(document, Payloads())  # any other field is refused, as Parse does
    if items is None:
        return []
    if not isinstance(items, list):
        raise _NotPayloads("payloads is not a list")
    if len(items) > max_payloads:
        raise _TooManyPayloads
    payloads: list[Payload] = []
    for i, item in enumerate(items):
        items[i] = None  # its text goes as its payload comes
        if not isinstance(item, dict):
            raise _NotPayloads("a payload is not an object")
        data = _base64(item.pop("data", None))
        payload = json_format.ParseDict(item, Payload())
        payload.data = data
        del data, item
        payloads.append(payload)
    return payloads


def _render(payload: Payload) -> list[bytes]:
    """A payload's proto3 JSON in pieces, its data base64-encoded once and never copied into a
    larger string. Empties ``payload``'s data."""
    data = payload.data
    payload.ClearField("data")
    head = json.dumps(json_format.MessageToDict(payload), separators=(",", ":"))
    opening = head[:-1] + ("," if head != "{}" else "") + '"data":"'
    return [opening.encode(), base64.b64encode(data), b'"}']


class _Chunks:
    """An answer's pieces joined into chunks of about :data:`SEND_CHUNK_BYTES`, each one send:
    a payload renders as three pieces, some a few bytes long. A piece that large goes alone,
    never copied."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self._open = bytearray()

    def add(self, piece: bytes) -> None:
        if len(piece) >= SEND_CHUNK_BYTES:
            self.flush()
            self.chunks.append(piece)
            return
        self._open += piece
        if len(self._open) >= SEND_CHUNK_BYTES:
            self.flush()

    def flush(self) -> list[bytes]:
        if self._open:
            self.chunks.append(bytes(self._open))
            self._open = bytearray()
        return self.chunks


def _answer(
    body: bytearray, transform: Callable[[Payload], Payload], *, max_payloads: int
) -> _Reply:
    """``POST /decode`` or ``/encode`` of a body read in full: its work off the event loop."""
    try:
        payloads = _parse(body, max_payloads=max_payloads)
    except (json_format.ParseError, ValueError, RecursionError):
        # One answer for both: a body refused by its count of JSON values, before it is
        # parsed, may be either.
        return _text(400, f"the body is not the JSON of Payloads (at most {max_payloads} payloads)")
    answer = _Chunks()
    answer.add(b'{"payloads":[')
    for i in range(len(payloads)):
        try:
            done = transform(payloads[i])
        except PayloadKeyMissing as e:
            # The message names the key id (or says the data is malformed), never a payload.
            return _text(HTTPStatus.UNPROCESSABLE_ENTITY, str(e))
        payloads[i] = Payload()  # the input goes as its answer comes
        if i:
            answer.add(b",")
        for piece in _render(done):
            answer.add(piece)
    answer.add(b"]}")
    return _Reply(status=200, body=answer.flush(), content_type="application/json")


class _Headers:
    """A request's header fields by lower-case name (h11 gives them lower-cased, as bytes)."""

    def __init__(self, fields: Sequence[tuple[bytes, bytes]]) -> None:
        self._fields = fields

    def all(self, name: str) -> list[str]:
        raw = name.encode()
        return [value.decode("latin-1") for key, value in self._fields if key == raw]

    def one(self, name: str) -> str | None:
        """The field's value, None if absent.

        Raises:
            _Refused: it is given more than once (which of them would a proxy have checked?).
        """
        values = self.all(name)
        if len(values) > 1:
            raise _Refused(_text(400, f"more than one {name} header", close=True))
        return values[0] if values else None


class _Refused(Exception):
    """A request refused: its answer."""

    def __init__(self, reply: _Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


@dataclass(frozen=True, kw_only=True)
class _Config:
    codec: EncryptionCodec
    namespaces: frozenset[str]
    origins: frozenset[str]
    hosts: frozenset[str]
    """Allowed ``Host`` values, lower-case: ``name:port`` must match exactly; a name given
    without a port matches it with any port or none."""
    limits: Limits


def _unsent(sock: socket.socket) -> int:
    """Bytes the kernel still holds to send on ``sock`` (or has sent, unacknowledged); 0 where
    it cannot say (SIOCOUTQ is Linux's)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


_SIOCOUTQ = 0x5411  # <linux/sockios.h>, the same as TIOCOUTQ


class _Server:
    """The serving side, on its own loop in its own thread: accepts, and runs each connection."""

    def __init__(self, config: _Config, listener: socket.socket) -> None:
        self.config = config
        self.limits = config.limits
        self.listener = listener
        self.budget = _ByteBudget(self.limits.max_bytes_in_flight)
        self.pool = _Pool(self.limits.max_concurrent_requests, name="codec-server-work")
        # Created on the server's loop (in serve()), the only place they are used.
        self.slots: asyncio.Semaphore | None = None
        self.threads: asyncio.Semaphore | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.processing = 0
        self.waiting_to_process = 0
        self.stopping = asyncio.Event()

    def load(self) -> Load:
        # Read from other threads: each number is one int, read whole under the GIL.
        return Load(
            connections=len(self.connections),
            bytes_in_flight=self.budget.reserved,
            waiting_for_bytes=self.budget.waiting,
            processing=self.processing,
            waiting_to_process=self.waiting_to_process,
        )

    async def serve(self) -> None:
        self.slots = asyncio.Semaphore(self.limits.max_connections)
        self.threads = asyncio.Semaphore(self.limits.max_concurrent_requests)
        accepting = asyncio.create_task(self._accept())
        try:
            await self.stopping.wait()
        finally:
            accepting.cancel()
            for task in list(self.connections):
                task.cancel()
            await asyncio.gather(accepting, *self.connections, return_exceptions=True)
            self.listener.close()
            # A decode already running finishes in its thread; its answer goes nowhere.
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def _accept(self) -> None:
        assert self.slots is not None
        loop = asyncio.get_running_loop()
        while True:
            # A slot first, then accept: past the limit, connections wait in the kernel's
            # backlog, holding no file descriptor of this process.
            await self.slots.acquire()
            try:
                sock, _ = await loop.sock_accept(self.listener)
            except (ConnectionAbortedError, InterruptedError):
                self.slots.release()
                continue
            except OSError as e:  # out of file descriptors or memory: try again shortly
                self.slots.release()
                log.warning("codec server cannot accept a connection: %s", e)
                await asyncio.sleep(0.5)
                continue
            except BaseException:
                self.slots.release()
                raise
            task = asyncio.create_task(_Connection(self, sock).serve())
            self.connections.add(task)
            task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        assert self.slots is not None
        self.connections.discard(task)
        self.slots.release()
        if not task.cancelled() and (error := task.exception()) is not None:
            log.debug("codec server connection failed", exc_info=error)

    async def process(self, body: bytearray, transform: Callable[[Payload], Payload]) -> _Reply:
        """:func:`_answer` in the pool, at most ``max_concurrent_requests`` at once."""
        assert self.threads is not None
        self.waiting_to_process += 1
        try:
            await self.threads.acquire()
        finally:
            self.waiting_to_process -= 1
        self.processing += 1
        try:
            loop = asyncio.get_running_loop()
            work = functools.partial(_answer, max_payloads=self.limits.max_payloads)
            return await loop.run_in_executor(self.pool, work, body, transform)
        finally:
            self.processing -= 1
            self.threads.release()


class _Connection:
    """One client connection: requests one after another (keep-alive, pipelined or not), each
    under the deadlines and limits of the module docstring."""

    def __init__(self, server: _Server, sock: socket.socket) -> None:
        self.server = server
        self.limits = server.limits
        self.config = server.config
        self.sock = sock
        sock.setblocking(False)
        # Answers go out as a head and then a body: without this, Nagle's algorithm holds the
        # body for the client's delayed ACK (40 ms a request).
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
        )
        self.loop = asyncio.get_running_loop()
        self.head_only = False
        """The request is a HEAD: its answer has no body."""
        self.cut_off = False
        """It did not take its answer in time: what is still queued for it is dropped."""
        self.answer_deadline = 0.0
        """When the last answer must have been taken (``loop.time()``)."""

    async def serve(self) -> None:
        linger = True
        try:
            while await self._exchange():
                self.h11.start_next_cycle()
        except asyncio.CancelledError:
            linger = False  # the server is stopping
            raise
        except OSError:
            linger = False  # the client has gone
        finally:
            await self._close(linger=linger and not self.cut_off)

    async def _close(self, *, linger: bool) -> None:
        """Close, first letting the client read what was sent (module docstring).

        An answer the kernel took whole (a megabyte fits its send buffer on loopback) may
        still be queued, unread: a plain close would leave the kernel feeding it, from a
        socket this server no longer counts, for as long as the client reads. So the close
        waits for the queue to empty until the answer's own deadline, and resets what is left
        (as for a client cut off, or a server stopping)."""
        sock = self.sock
        try:
            if linger and not self.cut_off:
                sock.shutdown(socket.SHUT_WR)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.limits.linger_seconds):
                        while await self.loop.sock_recv(sock, READ_BYTES):
                            pass  # thrown away: never read as a request
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(max(self.answer_deadline, self.loop.time())):
                        while _unsent(sock):  # noqa: ASYNC110  # a kernel count: no event to await
                            await asyncio.sleep(0.05)
            if self.cut_off or _unsent(sock):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        finally:
            sock.close()

    async def _receive(self) -> bool:
        """Read more for h11; False at the end of the stream."""
        data = await self.loop.sock_recv(self.sock, READ_BYTES)
        self.h11.receive_data(data)
        return bool(data)

    async def _event(self, deadline: float) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.PAUSED:  # cannot happen: events are taken one request at a time
                raise RuntimeError("h11 paused mid-request")
            if event is not h11.NEED_DATA:
                assert isinstance(event, h11.Event)
                return event
            async with asyncio.timeout_at(deadline):
                await self._receive()

    async def _exchange(self) -> bool:
        """One request and its answer; whether the connection can take another."""
        if not self.h11.trailing_data[0]:  # nothing pipelined: wait for the next request
            try:
                async with asyncio.timeout(self.limits.idle_seconds):
                    if not await self._receive():
                        return False
            except TimeoutError:
                return False  # no request started: nothing to answer
        deadline = self.loop.time() + self.limits.request_seconds
        cors: list[tuple[str, str]] = []
        async with contextlib.AsyncExitStack() as held:
            try:
                event = await self._event(deadline)
                if isinstance(event, h11.ConnectionClosed):
                    return False
                if not isinstance(event, h11.Request):
                    raise RuntimeError(f"h11 gave {type(event).__name__} for a request")
                self.head_only = event.method == b"HEAD"
                headers = _Headers(list(event.headers))
                cors = self._cors(headers)
                reply = await self._handle(event, headers, deadline, held)
            except _Refused as refused:
                reply = refused.reply
            except TimeoutError:
                seconds = f"{self.limits.request_seconds:g}"
                reply = _text(408, f"the request did not arrive within {seconds} s", close=True)
            except h11.RemoteProtocolError as e:
                reply = _protocol_refusal(e)
            except OSError:
                raise  # the client has gone: nobody to answer
            except Exception as e:  # any request, however malformed, is answered
                log.debug("codec server request failed", exc_info=True)
                reply = _text(500, f"internal error ({type(e).__name__})", close=True)
            return await self._send(reply, cors)

    async def _handle(
        self,
        request: h11.Request,
        headers: _Headers,
        deadline: float,
        held: contextlib.AsyncExitStack,
    ) -> _Reply:
        limits = self.limits
        # h11 bounds what it buffers of an incomplete head; this bounds a complete one exactly.
        head = len(request.target) + sum(len(k) + len(v) for k, v in request.headers)
        if len(request.headers) > limits.max_headers or head > limits.max_header_bytes:
            raise _Refused(_text(431, "the request line and headers are too large", close=True))
        # Before anything else, whatever the method: the bytes behind a request framed two ways
        # are never read as a request (an OPTIONS, too, can be chunked).
        if headers.all("transfer-encoding"):
            if headers.all("content-length"):
                raise _Refused(_text(400, "both Content-Length and Transfer-Encoding", close=True))
            raise _Refused(
                _text(411, "a Content-Length is required (no Transfer-Encoding)", close=True)
            )
        if not self._host_allowed(headers.one("host")):
            raise _Refused(_text(403, "host not allowed", close=True))  # its body is not read
        route = self._route(request.target)
        if request.method == b"OPTIONS":
            return self._preflight(route, headers)
        if request.method != b"POST":
            raise _Refused(
                _text(
                    405,
                    "POST /encode or /decode",
                    close=True,
                    headers=[("Allow", "POST, OPTIONS")],
                )
            )
        codec = self.config.codec
        transforms: dict[str, Callable[[Payload], Payload]] = {
            "/encode": codec.encrypt,
            "/decode": codec.decrypt,
        }
        transform = transforms.get(route)
        if transform is None:
            raise _Refused(_text(404, "not found: POST /encode or /decode", close=True))
        size = self._content_length(headers)
        namespace = headers.one("x-namespace")
        if not namespace:
            raise _Refused(_text(400, "the X-Namespace header is required", close=True))
        if namespace not in self.config.namespaces:
            raise _Refused(_text(403, f"namespace {namespace!r} is not served here", close=True))
        if size > limits.connection_body_bytes:  # else it fits the connection's own room
            try:
                waited = await self.server.budget.acquire(size, timeout=limits.admission_seconds)
            except TimeoutError:
                raise _Refused(
                    _text(503, "busy: try again", close=True, headers=[("Retry-After", "1")])
                ) from None
            held.callback(self.server.budget.release, size)  # once its answer is sent
            # The wait for room was the server's, not the client's: it does not count.
            deadline += waited
        if self.h11.they_are_waiting_for_100_continue:
            go_on = h11.InformationalResponse(status_code=100, headers=[])
            async with asyncio.timeout_at(deadline):
                await self._write([self.h11.send(go_on)])
        body = await self._body(size, deadline)
        return await self.server.process(body, transform)

    @staticmethod
    def _route(target: bytes) -> str:
        """The path of an origin-form target (``/decode?...``), or the refusal. A target in
        absolute form (``http://host/decode``) names an authority of its own, which RFC 9112
        says stands in for the Host just checked; ``//host/decode`` is read that way by some
        (and is not ``/decode`` to a proxy that guards the path): neither is served. The query
        is dropped: the UI calls ``POST /decode?preserveStorageRefs=true`` (UI 2.54), and a
        query names no other route."""
        if not target.startswith(b"/") or target.startswith(b"//"):
            raise _Refused(_text(400, "the request target must be a path: /decode", close=True))
        return target.partition(b"?")[0].decode("latin-1")

    def _content_length(self, headers: _Headers) -> int:
        """The body's length, or the refusal: a body has exactly one length, given up front
        (a Transfer-Encoding has been refused already, in :meth:`_handle`)."""
        lengths = headers.all("content-length")  # h11 has made sure they are one number
        if not lengths:
            raise _Refused(_text(411, "a Content-Length is required", close=True))
        if len(lengths[0]) > _MAX_LENGTH_DIGITS:
            raise _Refused(_text(400, "the Content-Length is not a number of bytes", close=True))
        size = int(lengths[0])
        if size > self.limits.max_request_bytes:
            raise _Refused(_text(413, "request too large", close=True))  # the body is not read
        return size

    async def _body(self, size: int, deadline: float) -> bytearray:
        body = bytearray(size)  # one buffer, filled in place, emptied by _parse
        filled = 0
        with memoryview(body) as into:
            while True:
                event = await self._event(deadline)
                if isinstance(event, h11.EndOfMessage):
                    return body
                if not isinstance(event, h11.Data):
                    raise RuntimeError(f"h11 gave {type(event).__name__} in a body")
                into[filled : filled + len(event.data)] = event.data
                filled += len(event.data)

    def _host_allowed(self, host: str | None) -> bool:
        """Whether ``host`` is one of its names (``name:port`` exactly, or a name allowed with
        any port). Read as RFC 9110 spells a Host, ``uri-host [":" port]``, and nothing looser:
        ``localhost:8081:1`` or ``a@localhost:8081`` is no name of its."""
        return host_allowed(host, self.config.hosts)

    def _cors(self, headers: _Headers) -> list[tuple[str, str]]:
        origins = headers.all("origin")
        if len(origins) != 1 or (sent := origin(origins[0])) not in self.config.origins:
            return []
        return [
            # The origin as configured, not as sent: only what was checked goes back.
            ("Access-Control-Allow-Origin", sent),
            ("Access-Control-Allow-Methods", "POST, OPTIONS"),
            ("Access-Control-Allow-Headers", ALLOWED_HEADERS),
            # The UI may send its access token ("pass access token"); it is never stored.
            ("Access-Control-Allow-Credentials", "true"),
            ("Access-Control-Max-Age", "600"),
            ("Vary", "Origin"),
        ]

    def _preflight(self, route: str, headers: _Headers) -> _Reply:
        # A preflight has no body: its end is already here (else the body is not read).
        close = not isinstance(self.h11.next_event(), h11.EndOfMessage)
        if route not in ("/encode", "/decode"):
            return _text(404, "not found", close=close)
        if not self._cors(headers):
            return _text(403, "origin not allowed", close=close)
        return _Reply(status=204, body=[], close=close)

    async def _send(self, reply: _Reply, cors: list[tuple[str, str]]) -> bool:
        """Send ``reply``; whether the connection can take another request."""
        h = self.h11
        if h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return False  # an answer is already under way: nothing more can be said
        headers = [
            ("Content-Type", reply.content_type),
            ("Content-Length", str(sum(len(piece) for piece in reply.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            *reply.headers,
            *cors,
        ]
        if reply.status == HTTPStatus.NO_CONTENT:  # no body, and so no length to give
            headers = [(k, v) for k, v in headers if k not in ("Content-Type", "Content-Length")]
        if reply.close or h.their_state is not h11.DONE:
            headers.append(("Connection", "close"))
        response = h11.Response(
            status_code=reply.status,
            headers=headers,
            reason=HTTPStatus(reply.status).phrase.encode(),
        )
        self.answer_deadline = self.loop.time() + self.limits.response_seconds
        try:
            async with asyncio.timeout_at(self.answer_deadline):
                await self._write([h.send(response)])
                # A HEAD's answer is its head (h11 would refuse the body).
                for piece in () if self.head_only else reply.body:
                    if piece:
                        await self._write(h.send_with_data_passthrough(h11.Data(data=piece)) or [])
                        # sock_sendall does not yield when the kernel takes the whole chunk:
                        # other clients, and deadlines, get their turn between chunks.
                        await asyncio.sleep(0)
                await self._write([h.send(h11.EndOfMessage())])
        except TimeoutError:
            self.cut_off = True  # it does not read its answer
            return False
        return h.our_state is h11.DONE and h.their_state is h11.DONE

    async def _write(self, pieces: Sequence[bytes | None]) -> None:
        for piece in pieces:
            if piece:
                await self.loop.sock_sendall(self.sock, piece)


class CodecServer:
    """The codec server (see the module docstring), in process: ``async with CodecServer(keys,
    ...) as server:``.

    It serves from a thread of its own, with its own event loop and a small pool for the CPU
    work (module docstring, "Threads"), so it never waits on the event loop of the worker it may
    run beside, nor that loop on it. ``make run`` starts one next to the embedded dev server;
    tests start one on a free port (``port=0``). ``url`` is where it listens.

    Args:
        keys: The keys (at least one).
        namespaces: The namespaces it serves (``X-Namespace``).
        cors_origins: Browser origins allowed to call it (exact ``scheme://host[:port]``).
        host: The interface to listen on (loopback by default).
        port: The port; 0 picks a free one.
        allowed_hosts: ``Host`` header values it answers besides its own (loopback names and
            ``host``, with its port): a proxy's name, with or without a port.
        limits: Its deadlines and bounds (the module's constants by default).

    Raises:
        PayloadKeysError: no keys.
    """

    def __init__(
        self,
        keys: PayloadKeys,
        *,
        namespaces: Sequence[str] = ("default",),
        cors_origins: Sequence[str] = (),
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        allowed_hosts: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> None:
        if not keys:
            raise PayloadKeysError(
                f"the codec server needs keys: set {keys.source} (id:base64key[,...])"
            )
        self._codec = EncryptionCodec(keys)
        self._namespaces = frozenset(namespaces)
        self._origins = site_origins(cors_origins, what="--cors-origin")
        self._host = host
        self._port = port
        self._allowed_hosts = tuple(h.strip().lower() for h in allowed_hosts if h.strip())
        self._limits = limits or Limits()
        self._server: _Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    @property
    def load(self) -> Load:
        """What it holds now (all zero when it is not serving)."""
        if self._server is None:
            return Load(0, 0, 0, 0, 0)
        return self._server.load()

    async def start(self) -> Self:
        """Listen, and serve from a thread.

        Raises:
            OSError: the port cannot be had (in use, or not allowed).
            RuntimeError: it is already serving.
        """
        if self._server is not None:
            raise RuntimeError("the codec server is already serving")
        _fix_malloc_mmap_threshold()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # Bound here, so that a port in use is the caller's OSError; served from the thread.
        listener = socket.create_server(
            (self._host, self._port), family=family, backlog=LISTEN_BACKLOG
        )
        listener.setblocking(False)
        port = listener.getsockname()[1]  # the real one, for a port of 0
        own = f"[{self._host}]" if ":" in self._host else self._host
        hosts = frozenset(
            [*(f"{name}:{port}".lower() for name in (*LOOPBACK_NAMES, own)), *self._allowed_hosts]
        )
        config = _Config(
            codec=self._codec,
            namespaces=self._namespaces,
            origins=self._origins,
            hosts=hosts,
            limits=self._limits,
        )
        server = _Server(config, listener)
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run, args=(loop, server), name="codec-server", daemon=True
        )
        self._server, self._loop = server, loop
        self._thread.start()
        host = "localhost" if self._host in ("127.0.0.1", "localhost") else self._host
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self

    async def stop(self) -> None:
        """Stop serving: open connections are closed, a decode under way is not waited for."""
        server, loop, thread = self._server, self._loop, self._thread
        self._server = self._loop = self._thread = None
        if server is None or loop is None or thread is None:
            return
        loop.call_soon_threadsafe(server.stopping.set)
        await asyncio.to_thread(thread.join)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _run(loop: asyncio.AbstractEventLoop, server: _Server) -> None:
    """The ``codec-server`` thread: the server's own loop, until :meth:`CodecServer.stop`."""
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        runner.run(server.serve())


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _Parser(
        prog="agent-codec-server",
        description="Serve Temporal's remote codec protocol (POST /encode, POST /decode) with "
        "the keys in AGENT_PAYLOAD_KEYS, for the Temporal UI and `temporal ... "
        "--codec-endpoint`.",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="interface to listen on (default %(default)s: this machine only)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="URL",
        help="a browser origin allowed to call it, e.g. http://localhost:8233 (the dev "
        "server's UI) or https://cloud.temporal.io; repeat for more (default: none)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="a Host header to answer besides localhost, 127.0.0.1 and [::1] with its port and "
        "the --host it listens on: the name a TLS proxy in front of it forwards; repeat for more "
        "(others get 403, which stops DNS rebinding)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="a namespace it serves (X-Namespace); repeat for more (default: "
        "TEMPORAL_NAMESPACE, else default)",
    )
    p.add_argument(
        "--generate-key",
        nargs="?",
        const="",
        default=None,
        metavar="ID",
        help="print a new id:base64key entry for AGENT_PAYLOAD_KEYS (32 random bytes; the id "
        "defaults to k and today's date) and exit",
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace, keys: PayloadKeys) -> int:
    namespaces = args.namespace or [os.environ.get("TEMPORAL_NAMESPACE") or "default"]
    server = CodecServer(
        keys,
        namespaces=namespaces,
        cors_origins=args.cors_origin,
        host=args.host,
        port=args.port,
        allowed_hosts=args.allowed_host,
    )
    try:
        await server.start()
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, e.strerror or e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "codec server ready on %s (namespaces %s, CORS origins %s, keys %s; %s encrypts)",
        server.url,
        ", ".join(namespaces),
        ", ".join(args.cors_origin) or "none",
        ", ".join(keys.ids),
        keys.encrypting_id,
    )
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    level = (os.environ.get("AGENT_LOG_LEVEL") or "INFO").strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        _exit(2, f"AGENT_LOG_LEVEL={level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.generate_key is not None:
        try:
            print(generate_key(args.generate_key or None))
        except PayloadKeysError as e:
            _exit(2, str(e))
        return
    try:
        keys = load_keys()
    except PayloadKeysError as e:
        _exit(2, str(e))
    if not keys:
        _exit(
            2,
            "AGENT_PAYLOAD_KEYS is not set: the codec server needs the keys the workers use "
            "(generate one with `agent-codec-server --generate-key`)",
        )
    sys.exit(asyncio.run(serve(args, keys)))


def _exit(code: int, message: str) -> NoReturn:
    print(
        f"agent-codec-server: error: {message}",
        file=sys.stderr,
    )
    sys.exit(code)


if __name__ == "__main__":
    main()

"""``agent-codec-server``: Temporal's remote codec protocol over HTTP.

Internal: not covered by the 0.1.x stability promise; its public names (``CodecServer``,
``codec_app``) are imported from ``temporal_agent_interrupts.payloads``, and its command and
flags are documented in docs/reference/settings.md.

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

**Mounting it.** :func:`codec_app` is the same server as an ASGI application (Starlette), for a
team that serves it from its own ASGI app: the checks above, the byte budget and the pool hold
in it; the connection limits below are :func:`temporal_agent_interrupts.http_server.serve`'s,
which its host's server may not keep.

**The HTTP stack, and what it holds under load.** It is the product's one HTTP stack
(:mod:`temporal_agent_interrupts.http_server`, which the web app uses too): Starlette on
uvicorn's h11 protocol, subclassed for the deadlines and limits uvicorn does not keep, and
accepting its connections itself. Not aiohttp: google-genai sends every model call through
aiohttp whenever it is installed, so adding it to the worker's image would quietly change how
the worker talks to Gemini. Each limit below has a test (``tests/test_codec_server*.py``). A
client over a limit gets an answer, and the connection is closed after it whenever its request
was not read to the end:

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
- **Time**: a request's line and headers, then its body, must arrive within
  :data:`REQUEST_SECONDS` (30) of its first byte, however slowly they trickle (408, then
  closed; a wait for room under the byte budget does not count); a connection that starts no
  request for :data:`IDLE_SECONDS` (15: a new one, or one kept alive between requests) is
  closed; a client that does not take its answer within :data:`RESPONSE_SECONDS` (30) of its
  first byte is cut off, with a reset: what is still queued for it, in the server and in the
  kernel, is dropped, not fed to it from an orphaned socket for as long as it reads. After an
  answer that closes, what the client still sends is read and thrown away for up to
  :data:`LINGER_SECONDS` (2), so that it reads the answer rather than a reset. So is an
  answer the kernel took whole (a megabyte fits its send buffer on loopback) but the client
  has not read when its connection closes: a close waits for the kernel's queue (and the
  server's) to empty until the answer's deadline, 30 s from its start, and resets what is
  left, so no orphaned socket feeds it on for as long as the client reads. Until then the
  connection keeps its slot. A client that pipelines requests and reads no answer is read no
  further than 64 KiB ahead of the request being answered.
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
  one. A body is read into one buffer of its length (uvicorn hands it over 64 KiB at a time,
  reading no further ahead), and turned into its answer payload by payload, never all held
  twice, so the process holds two to three times the budget at the peak (measured), and gives
  it back once answered (on glibc, with the mmap threshold fixed: :data:`MALLOC_MMAP_THRESHOLD`).
  Tested: six concurrent 16 MiB decodes peak under four times the budget and leave under half
  of it resident; they took the standard library's server from 104 to 676 MB.
- **CPU**: at most :data:`MAX_CONCURRENT_REQUESTS` (4) requests are parsed, decrypted and
  rendered at once, in a pool of that many threads; others wait their turn, their bodies held.

**Threads.** :class:`CodecServer` runs its own event loop in a thread of its own
(``codec-server``), and the CPU work (JSON, AES-GCM, base64) runs in its pool
(``codec-server-work``), not on that loop. The pool's threads are daemons: a decode under way at
``stop()`` is not waited for, by ``stop()`` or by the process's exit.
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
import functools
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Any, NoReturn, Self

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
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
    cors_headers,
    host_allowed,
    site_origins,
)
from temporal_agent_interrupts.http_server import (
    LISTEN_BACKLOG,
    ByteBudget,
    ConnectionLimits,
    Connections,
    Pool,
    bind,
    request_deadline,
)
from temporal_agent_interrupts.http_server import serve as serve_app

log = logging.getLogger("temporal_agent_interrupts.codec_server")

__all__ = [
    "ADMISSION_SECONDS",
    "CONNECTION_BODY_BYTES",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEV_UI_ORIGINS",
    "IDLE_SECONDS",
    "LINGER_SECONDS",
    "LISTEN_BACKLOG",
    "MALLOC_MMAP_THRESHOLD",
    "MAX_BYTES_IN_FLIGHT",
    "MAX_CONCURRENT_REQUESTS",
    "MAX_CONNECTIONS",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_PAYLOADS",
    "MAX_REQUEST_BYTES",
    "REQUEST_SECONDS",
    "RESPONSE_SECONDS",
    "SEND_CHUNK_BYTES",
    "CodecServer",
    "Limits",
    "Load",
    "codec_app",
    "main",
    "parse_args",
    "serve",
]

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

    def connection_limits(self) -> ConnectionLimits:
        """The part :func:`~temporal_agent_interrupts.http_server.serve` keeps, per
        connection."""
        return ConnectionLimits(
            request_seconds=self.request_seconds,
            idle_seconds=self.idle_seconds,
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
            max_connections=self.max_connections,
            queue_excess=True,
            response_seconds=self.response_seconds,
            linger_seconds=self.linger_seconds,
            answer_slow_heads=True,
        )


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
    """A request's header fields by lower-case name (uvicorn gives them lower-cased, as bytes)."""

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


class _Gone(Exception):
    """The client went away (or was cut off) before its request was in: nobody to answer."""


@dataclass(frozen=True, kw_only=True)
class _Config:
    codec: EncryptionCodec
    namespaces: frozenset[str]
    origins: frozenset[str]
    hosts: frozenset[str]
    """Allowed ``Host`` values, lower-case: ``name:port`` must match exactly; a name given
    without a port matches it with any port or none."""
    limits: Limits


class _State:
    """What one application holds across its requests, on the loop that serves it: the byte
    budget, the pool, and the counts of :class:`Load`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.budget = ByteBudget(limits.max_bytes_in_flight)
        self.pool = Pool(limits.max_concurrent_requests, name="codec-server-work")
        self.threads: asyncio.Semaphore | None = None  # made on the serving loop, at first use
        self.processing = 0
        self.waiting_to_process = 0

    async def process(self, body: bytearray, transform: Callable[[Payload], Payload]) -> _Reply:
        """:func:`_answer` in the pool, at most ``max_concurrent_requests`` at once."""
        if self.threads is None:
            self.threads = asyncio.Semaphore(self.limits.max_concurrent_requests)
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


class _Codec:
    """The codec's ASGI side: every request's checks (module docstring), in the order that
    reads the least of it, then ``/encode`` or ``/decode``. Mounted as Starlette's routes by
    :func:`codec_app`, which sends every request here first (``guard``), so that a Host or a
    method is refused whatever the path."""

    def __init__(self, config: _Config, state: _State) -> None:
        self.config = config
        self.limits = config.limits
        self.connection = config.limits.connection_limits()
        self.state = state

    # -- the guard, before any route --

    async def guard(self, scope: Scope, receive: Receive, send: Send, routed: _Routed) -> None:
        if scope["type"] == "websocket":
            # Refused (a server answers 403), not left unanswered: mounted in a team's app on
            # a server that speaks websockets, a handshake left open is a 500 and an ERROR in
            # its log, for every request anyone sends.
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            return  # no lifespan
        headers = _Headers(scope["headers"])
        cors = self.cors(headers)
        try:
            if not host_allowed(headers.one("host"), self.config.hosts):
                raise _Refused(_text(403, "host not allowed", close=True))  # its body is not read
            path = self._route(scope)
            if scope["method"] == "OPTIONS":
                raise _Refused(self._preflight(path, headers))
            if scope["method"] != "POST":
                raise _Refused(
                    _text(
                        405,
                        "POST /encode or /decode",
                        close=True,
                        headers=[("Allow", "POST, OPTIONS")],
                    )
                )
        except _Refused as refused:
            await _send(
                send,
                refused.reply,
                cors,
                head_only=scope["method"] == "HEAD",
                upgrade=_upgrade(scope),
            )
            return
        # Routed by the raw path: uvicorn's unquoted one would take /d%65code for /decode.
        await routed({**scope, "path": scope.get("root_path", "") + path}, receive, send, cors)

    @staticmethod
    def _route(scope: Scope) -> str:
        """The path of an origin-form target (``/decode?...``), or the refusal. A target in
        absolute form (``http://host/decode``) names an authority of its own, which RFC 9112
        says stands in for the Host just checked; ``//host/decode`` is read that way by some
        (and is not ``/decode`` to a proxy that guards the path): neither is served. The query
        is dropped: the UI calls ``POST /decode?preserveStorageRefs=true`` (UI 2.54), and a
        query names no other route. The raw target, not uvicorn's unquoted path: ``/d%65code``
        names no route of its."""
        target = bytes(scope.get("raw_path") or scope["path"].encode())
        if not target.startswith(b"/") or target.startswith(b"//"):
            raise _Refused(_text(400, "the request target must be a path: /decode", close=True))
        # Mounted (``Mount("/codec", app=codec_app(...))``): the route follows the mount's
        # path, which Starlette gives as ``root_path``. A prefix spelled otherwise in the raw
        # target (``/c%6fdec/decode``) leaves no route of its (404).
        prefix = scope.get("root_path", "").encode("latin-1")
        if prefix:
            target = target[len(prefix) :] if target.startswith(prefix) else b"/"
        return target.decode("latin-1")

    def cors(self, headers: _Headers) -> list[tuple[str, str]]:
        return cors_headers(
            headers.all("origin"),
            self.config.origins,
            methods="POST, OPTIONS",
            headers=ALLOWED_HEADERS,
            # The UI may send its access token ("pass access token"); it is never stored.
            credentials=True,
        )

    def _preflight(self, path: str, headers: _Headers) -> _Reply:
        # A preflight has no body: one that comes with one is not read, and closed after.
        close = any(length.strip() != "0" for length in headers.all("content-length"))
        if path not in _ROUTES:
            return _text(404, "not found", close=close)
        if not self.cors(headers):
            return _text(403, "origin not allowed", close=close)
        return _Reply(status=204, body=[], close=close)

    # -- the routes --

    def route(self, name: str) -> _Endpoint:
        """The ASGI endpoint of ``POST /encode`` or ``/decode``."""
        return _Endpoint(self, "encrypt" if name == "encode" else "decrypt")

    async def _exchange(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        transform: Callable[[Payload], Payload],
        cors: list[tuple[str, str]],
    ) -> None:
        async with contextlib.AsyncExitStack() as held:
            try:
                reply = await self._handle(scope, receive, transform, held)
            except _Refused as refused:
                reply = refused.reply
            except TimeoutError:
                seconds = f"{self.limits.request_seconds:g}"
                reply = _text(408, f"the request did not arrive within {seconds} s", close=True)
            except (_Gone, asyncio.CancelledError):
                # Nobody to answer; a cancellation is the server stopping, which uvicorn would
                # log as the application's error.
                return
            except Exception as e:  # any request, however malformed, is answered
                log.debug("codec server request failed", exc_info=True)
                reply = _text(500, f"internal error ({type(e).__name__})", close=True)
            with contextlib.suppress(asyncio.CancelledError):  # as above
                await _send(send, reply, cors, upgrade=_upgrade(scope))

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        transform: Callable[[Payload], Payload],
        held: contextlib.AsyncExitStack,
    ) -> _Reply:
        limits = self.limits
        headers = _Headers(scope["headers"])
        size = self._content_length(headers)
        namespace = headers.one("x-namespace")
        if not namespace:
            raise _Refused(_text(400, "the X-Namespace header is required", close=True))
        if namespace not in self.config.namespaces:
            raise _Refused(_text(403, f"namespace {namespace!r} is not served here", close=True))
        deadline = request_deadline(scope, self.connection)
        budget = self.state.budget
        if size > limits.connection_body_bytes:  # else it fits the connection's own room
            try:
                waited = await budget.acquire(size, timeout=limits.admission_seconds)
            except TimeoutError:
                raise _Refused(
                    _text(503, "busy: try again", close=True, headers=[("Retry-After", "1")])
                ) from None
            held.callback(budget.release, size)  # once its answer is sent
            # The wait for room was the server's, not the client's: it does not count.
            deadline += waited
        # uvicorn tells a client waiting for 100-continue to go on at the first receive.
        body = await self._body(receive, size, deadline)
        return await self.state.process(body, transform)

    def _content_length(self, headers: _Headers) -> int:
        """The body's length, or the refusal: a body has exactly one length, given up front
        (h11 has made sure the lengths given are one number; a Transfer-Encoding has been
        refused already, by the protocol)."""
        lengths = headers.all("content-length")
        if not lengths:
            raise _Refused(_text(411, "a Content-Length is required", close=True))
        given = lengths[0].strip()
        if len(given) > _MAX_LENGTH_DIGITS or not given.isdigit():
            raise _Refused(_text(400, "the Content-Length is not a number of bytes", close=True))
        size = int(given)
        if size > self.limits.max_request_bytes:
            raise _Refused(_text(413, "request too large", close=True))  # the body is not read
        return size

    async def _body(self, receive: Receive, size: int, deadline: float) -> bytearray:
        body = bytearray(size)  # one buffer, filled in place, emptied by _parse
        filled = 0
        with memoryview(body) as into:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        raise _Gone
                    chunk = message.get("body", b"")
                    if filled + len(chunk) > size:  # h11 frames by the length: cannot happen
                        raise _Refused(_text(400, "the body is longer than its length", close=True))
                    into[filled : filled + len(chunk)] = chunk
                    filled += len(chunk)
                    if not message.get("more_body", False):
                        break
        if filled != size:
            raise _Gone  # its end never came: the client is gone
        return body


def _upgrade(scope: Scope) -> bool:
    return any(name == b"upgrade" for name, _ in scope["headers"])


class _Endpoint:
    """``POST /encode`` or ``/decode`` as an ASGI endpoint (an object, not a function: Starlette
    would take a function for one of a request)."""

    def __init__(self, codec: _Codec, method: str) -> None:
        self.codec = codec
        self.method = method

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cors: list[tuple[str, str]] = scope.get("state", {}).get(_CORS, [])
        # Looked up per request: a test stands a gate in for the codec's method.
        transform = getattr(self.codec.config.codec, self.method)
        await self.codec._exchange(scope, receive, send, transform, cors)


_Routed = Callable[[Scope, Receive, Send, list[tuple[str, str]]], Any]
"""The routes, with the CORS headers the guard found for the request."""
_CORS = "temporal_agent_interrupts.codec_server.cors"
_ROUTES = ("/encode", "/decode")


async def _send(
    send: Send,
    reply: _Reply,
    cors: Sequence[tuple[str, str]],
    *,
    head_only: bool = False,
    upgrade: bool = False,
) -> None:
    """Send ``reply``: its pieces one after another, the loop free between them. After a
    ``HEAD`` (whose answer has no body) or a request that asks to switch protocols (which this
    server never does), the connection is closed: what follows is not read as a request."""
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
    if reply.close or head_only or upgrade:
        headers.append(("Connection", "close"))
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        }
    )
    pieces = list(reply.body)
    del reply
    # A HEAD's answer is its head (uvicorn sends none of the body).
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], b""  # each piece goes as it is sent: an answer is 16 MiB
        if piece:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            # The transport takes a chunk without yielding while the client keeps up: other
            # clients, and deadlines, get their turn between chunks.
            await asyncio.sleep(0)
        del piece
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def codec_app(
    keys: PayloadKeys,
    *,
    namespaces: Sequence[str] = ("default",),
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = LOOPBACK_NAMES,
    limits: Limits | None = None,
) -> Starlette:
    """The codec server as an ASGI application (module docstring), for a team to mount in its
    own (``Mount("/codec", app=codec_app(keys, ...))``) or serve with
    :func:`temporal_agent_interrupts.http_server.serve`.

    Args:
        keys: The keys (at least one).
        namespaces: The namespaces it serves (``X-Namespace``).
        cors_origins: Browser origins allowed to call it (exact ``scheme://host[:port]``).
        allowed_hosts: ``Host`` values it answers: ``name:port`` exactly, or a name alone with
            any port (the loopback names by default). Behind a proxy, the proxy's name.
        limits: Its bounds (the module's constants by default). The per-connection ones hold
            only when :func:`~temporal_agent_interrupts.http_server.serve` serves it.

    Raises:
        PayloadKeysError: no keys.
        ValueError: an entry of ``cors_origins`` is not one site's origin.
    """
    return _application(
        keys,
        namespaces=namespaces,
        cors_origins=cors_origins,
        hosts=frozenset(h.strip().lower() for h in allowed_hosts if h.strip()),
        limits=limits or Limits(),
    )[0]


def _application(
    keys: PayloadKeys,
    *,
    namespaces: Sequence[str],
    cors_origins: Sequence[str],
    hosts: frozenset[str],
    limits: Limits,
) -> tuple[Starlette, _Codec]:
    if not keys:
        raise PayloadKeysError(
            f"the codec server needs keys: set {keys.source} (id:base64key[,...])"
        )
    config = _Config(
        codec=EncryptionCodec(keys),
        namespaces=frozenset(namespaces),
        origins=site_origins(cors_origins, what="--cors-origin"),
        hosts=hosts,
        limits=limits,
    )
    codec = _Codec(config, _State(limits))
    app = Starlette(
        routes=[Route(path, codec.route(path[1:]), methods=["POST"]) for path in _ROUTES]
    )
    # /decode/ is no route of its: not redirected to /decode.
    app.router.redirect_slashes = False

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        cors: list[tuple[str, str]] = scope.get("state", {}).get(_CORS, [])
        await _send(send, _text(404, "not found: POST /encode or /decode", close=True), cors)

    app.router.default = not_found
    router = app.router

    async def routed(
        scope: Scope, receive: Receive, send: Send, cors: list[tuple[str, str]]
    ) -> None:
        scope.setdefault("state", {})[_CORS] = cors
        await router(scope, receive, send)

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        await codec.guard(scope, receive, send, routed)

    # Starlette's own error and exception middleware answer in their own words: every
    # request goes through the guard, which answers each refusal itself.
    app.middleware_stack = guarded
    return app, codec


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
        self._keys = keys
        self._codec = EncryptionCodec(keys)
        self._namespaces = tuple(namespaces)
        self._origins = tuple(cors_origins)
        site_origins(cors_origins, what="--cors-origin")  # refused here, not at start()
        self._host = host
        self._port = port
        self._allowed_hosts = tuple(h.strip().lower() for h in allowed_hosts if h.strip())
        self._limits = limits or Limits()
        self._app: _Codec | None = None
        self._connections = Connections()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    @property
    def load(self) -> Load:
        """What it holds now (all zero when it is not serving)."""
        app = self._app
        if app is None:
            return Load(0, 0, 0, 0, 0)
        # Read from other threads: each number is one int, read whole under the GIL.
        state = app.state
        return Load(
            connections=self._connections.open,
            bytes_in_flight=state.budget.reserved,
            waiting_for_bytes=state.budget.waiting,
            processing=state.processing,
            waiting_to_process=state.waiting_to_process,
        )

    async def start(self) -> Self:
        """Listen, and serve from a thread.

        Raises:
            OSError: the port cannot be had (in use, or not allowed).
            RuntimeError: it is already serving.
        """
        if self._app is not None:
            raise RuntimeError("the codec server is already serving")
        _fix_malloc_mmap_threshold()
        # Bound here, so that a port in use is the caller's OSError; served from the thread.
        listener = bind(self._host, self._port, backlog=LISTEN_BACKLOG)
        port = listener.getsockname()[1]  # the real one, for a port of 0
        own = f"[{self._host}]" if ":" in self._host else self._host
        hosts = frozenset(
            [*(f"{name}:{port}".lower() for name in (*LOOPBACK_NAMES, own)), *self._allowed_hosts]
        )
        app, codec = _application(
            self._keys,
            namespaces=self._namespaces,
            cors_origins=self._origins,
            hosts=hosts,
            limits=self._limits,
        )
        # The codec this server serves with, for tests that stand a gate in for its methods.
        codec.config = dataclasses.replace(codec.config, codec=self._codec)
        self._connections = Connections()
        loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(loop, app, listener, started),
            name="codec-server",
            daemon=True,
        )
        self._app, self._loop = codec, loop
        self._thread.start()
        await asyncio.to_thread(started.wait)
        host = "localhost" if self._host in ("127.0.0.1", "localhost") else self._host
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self

    def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        app: Starlette,
        listener: socket.socket,
        started: threading.Event,
    ) -> None:
        """The ``codec-server`` thread: the server's own loop, until :meth:`stop`."""

        async def serving() -> None:
            self._task = asyncio.current_task()
            started.set()
            try:
                await serve_app(
                    app,
                    limits=self._limits.connection_limits(),
                    sock=listener,
                    # A decode under way is not waited for: its answer would go nowhere.
                    graceful_seconds=0.01,
                    connections=self._connections,
                    # A refusal of the HTTP stack's own (a Transfer-Encoding, too many
                    # fields) carries CORS headers as the server's do: the UI can read why.
                    refusal_headers=lambda fields: cors(_Headers(fields)),
                )
            except asyncio.CancelledError:
                pass  # stop()
            finally:
                listener.close()
                # A decode already running finishes in its thread; its answer goes nowhere.
                pool.shutdown(wait=False, cancel_futures=True)

        codec = self._app
        assert codec is not None
        pool, cors = codec.state.pool, codec.cors
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(serving())

    async def stop(self) -> None:
        """Stop serving: open connections are closed, a decode under way is not waited for."""
        app, loop, thread, task = self._app, self._loop, self._thread, self._task
        self._app = self._loop = self._thread = self._task = None
        if app is None or loop is None or thread is None:
            return
        if task is not None:
            loop.call_soon_threadsafe(task.cancel)
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

"""The codec server under attack: framing, deadlines, and bounds on connections, work and memory.

Every test talks to a real :class:`CodecServer` over loopback with raw sockets, byte for byte as
an attacker (or a proxy in front) would, because a client library would refuse to send most of
these requests. Limits are shrunk through ``Limits`` where the defaults would make a test slow;
the memory test runs with the defaults. What the server does with a request it serves (the UI's
decodes, the CLI's, CORS, Host and namespace checks) is in ``tests/test_data_protection.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from temporal_agent_interrupts.codec import EncryptionCodec, PayloadKeys, generate_key
from temporal_agent_interrupts.codec_server import (
    MAX_BYTES_IN_FLIGHT,
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    CodecServer,
    Limits,
)

KEYS = PayloadKeys.parse(generate_key("k1"))  # random for this run
CODEC = EncryptionCodec(KEYS)
PROC_STATUS = Path("/proc/self/status")
MIB = 1024 * 1024


# --- a raw HTTP client ----------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated field keeps its last value."""
    body: bytes


def _first(data: bytes) -> tuple[Response, bytes] | None:
    """The response at the start of ``data`` (framed by its Content-Length) and what follows,
    or None while it is incomplete."""
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *fields = head.decode("latin-1").split("\r\n")
    match = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", status_line)
    assert match, f"not a status line: {status_line!r}"
    headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
    length = int(headers.get("content-length", "0"))
    if len(rest) < length:
        return None
    return Response(int(match[1]), headers, rest[:length]), rest[length:]


def responses(data: bytes) -> tuple[list[Response], bytes]:
    """The whole responses at the start of ``data``, and what follows them."""
    found: list[Response] = []
    while (first := _first(data)) is not None:
        response, data = first
        found.append(response)
    return found, data


class Raw:
    """One TCP connection to the server, on the test's event loop (the server has its own)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.received = b""

    @classmethod
    async def connect(cls, server: CodecServer, *, receive_buffer: int | None = None) -> Raw:
        sock = socket.socket()
        if receive_buffer is not None:  # before connecting: it sets the window it advertises
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port_of(server)))
        return cls(sock)

    async def send(self, *data: bytes) -> None:
        for piece in data:  # pieces, not joined: a body may be 16 MiB
            await self.loop.sock_sendall(self.sock, piece)

    async def until_eof(self, timeout: float = 20) -> bytes:
        """Everything the server sends until it closes (bounded)."""
        async with asyncio.timeout(timeout):
            while chunk := await self.loop.sock_recv(self.sock, 65536):
                self.received += chunk
        return self.received

    async def response(self, timeout: float = 20) -> Response:
        """The next whole response; what follows it stays for the next call."""
        async with asyncio.timeout(timeout):
            while (first := _first(self.received)) is None:
                chunk = await self.loop.sock_recv(self.sock, 65536)
                assert chunk, f"closed before a whole response: {self.received[:200]!r}"
                self.received += chunk
        response, self.received = first
        return response

    def close(self) -> None:
        self.sock.close()


def port_of(server: CodecServer) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


def request(
    server: CodecServer,
    body: bytes = b"{}",
    *,
    path: str = "/decode",
    method: str = "POST",
    extra: str = "",
    length: bool = True,
) -> bytes:
    """A request head (and body), as bytes on the wire; ``extra`` adds header lines."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\n"
        "X-Namespace: default\r\nContent-Type: application/json\r\n"
        + (f"Content-Length: {len(body)}\r\n" if length else "")
        + extra
        + "\r\n"
    )
    return head.encode() + body


def sealed(*payloads: Payload) -> bytes:
    """The body of a decode request: the payloads, encrypted, as the UI sends them."""
    return json_format.MessageToJson(
        Payloads(payloads=[CODEC.encrypt(p) for p in payloads]), indent=None
    ).encode()


def plain(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def eventually(check: Callable[[], bool], *, what: str, timeout: float = 20) -> None:
    """Poll ``check`` until it holds (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving(limits: Limits | None = None) -> AsyncIterator[CodecServer]:
    async with CodecServer(KEYS, port=0, limits=limits) as server:
        yield server


class Gate:
    """Stands in for the codec's ``decrypt``: holds every call until opened, and records how
    many run at once and on which threads."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.threads: set[str] = set()
        self.had_a_loop = False

    def __call__(self, payload: Payload) -> Payload:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.threads.add(threading.current_thread().name)
        try:
            asyncio.get_running_loop()
            self.had_a_loop = True
        except RuntimeError:
            pass  # as it should be: no event loop runs this work
        try:
            assert self.opened.wait(timeout=60), "the gate was never opened"
            return CODEC.decrypt(payload)
        finally:
            with self.lock:
                self.inside -= 1


# --- framing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n",
        "Content-Length: {n}\r\nTransfer-Encoding: CHUNKED\r\n",
        # Codings h11 itself refuses (its 501): refused the same way.
        "Content-Length: {n}\r\nTransfer-Encoding: gzip, chunked\r\n",
        "Content-Length: {n}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    ],
)
async def test_case10_a_request_with_both_length_headers_is_refused_and_the_connection_closed(
    framing: str,
):
    async with serving() as server:
        # What the attacker wants served: a valid encode, which alone gets a 200.
        smuggled = request(server, json_format.MessageToJson(Payloads()).encode(), path="/encode")
        alone = await Raw.connect(server)
        await alone.send(smuggled)
        assert (await alone.response()).status == 200
        alone.close()

        # A proxy that frames by one header forwards the lot as one request; by the other, the
        # encode is a second request. Sent in one write, as the proxy would.
        chunked = b"0\r\n\r\n"
        head = request(server, b"", length=False, extra=framing.format(n=len(chunked)))
        raw = await Raw.connect(server)
        await raw.send(head + chunked + smuggled)
        answered, rest = responses(await raw.until_eof())
        raw.close()
    assert [r.status for r in answered] == [400], answered
    assert rest == b"", f"more than one answer: {rest[:200]!r}"
    assert answered[0].headers["connection"] == "close"
    assert answered[0].body == b"both Content-Length and Transfer-Encoding\n" or (
        answered[0].body == b"Transfer-Encoding is not accepted: send a Content-Length\n"
    )


async def test_a_chunked_body_is_refused_with_411_and_the_connection_closed():
    """The UI and the CLI send a Content-Length; the budget needs one before the body is read."""
    async with serving() as server:
        body = b'{"payloads":[]}'
        chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        raw = await Raw.connect(server)
        head = request(server, b"", length=False, extra="Transfer-Encoding: chunked\r\n")
        await raw.send(head + chunked + request(server))
        answered, rest = responses(await raw.until_eof())
        raw.close()
    assert [r.status for r in answered] == [411] and rest == b""
    assert b"Content-Length is required" in answered[0].body


@pytest.mark.parametrize(
    ("lengths", "said"),
    [
        ("Content-Length: 2\r\nContent-Length: 3\r\n", b"conflicting Content-Length headers\n"),
        ("Content-Length: 2, 3\r\n", b"conflicting Content-Length headers\n"),
        ("Content-Length: +2\r\n", b"the Content-Length is not a number of bytes\n"),
        ("Content-Length: 1111111111111\r\n", b"the Content-Length is not a number of bytes\n"),
    ],
)
async def test_conflicting_or_malformed_lengths_are_refused_and_the_connection_closed(
    lengths: str, said: bytes
):
    async with serving() as server:
        raw = await Raw.connect(server)
        await raw.send(request(server, b"", length=False, extra=lengths) + b"{}" + request(server))
        answered, rest = responses(await raw.until_eof())
        raw.close()
    assert [(r.status, r.body) for r in answered] == [(400, said)] and rest == b""


# --- deadlines --------------------------------------------------------------------------------


@pytest.mark.parametrize("dribbled", ["head", "body"])
async def test_case10_a_client_that_dribbles_its_request_is_cut_off_at_the_deadline(dribbled: str):
    """One byte at a time never trips a per-read timeout; the whole request has a deadline."""
    body = sealed(plain(b'"hello"'))
    async with serving(limits=Limits(request_seconds=1.0)) as server:
        whole = request(server, body)
        at_once, trickle = (b"", whole) if dribbled == "head" else whole.split(b"\r\n\r\n", 1)
        raw = await Raw.connect(server)
        if at_once:
            await raw.send(at_once + b"\r\n\r\n")
        reading = asyncio.create_task(raw.until_eof())
        sent = 0
        with contextlib.suppress(ConnectionError):
            for byte in trickle:
                if reading.done():
                    break
                await raw.send(bytes([byte]))
                sent += 1
                await asyncio.sleep(0.05)  # the attacker's pace: 20 bytes a second
        answered, rest = responses(await reading)
        raw.close()
    assert [r.status for r in answered] == [408] and rest == b"", answered
    assert answered[0].body == b"the request did not arrive within 1 s\n"
    assert sent < len(trickle), "the whole request got through"


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_time():
    async with serving(limits=Limits(idle_seconds=0.5)) as server:
        raw = await Raw.connect(server)
        for _ in range(2):  # kept alive between requests...
            await raw.send(request(server))
            answer = await raw.response()
            assert answer.status == 200 and "connection" not in answer.headers
        # ... and closed when none comes: EOF, with nothing more said.
        assert await raw.until_eof() == b""
        raw.close()
        silent = await Raw.connect(server)  # connected, never a byte
        assert await silent.until_eof() == b""
        silent.close()


async def test_a_client_that_does_not_read_its_answer_is_cut_off():
    async with serving(limits=Limits(response_seconds=0.5, linger_seconds=0.1)) as server:
        # A small window, and the answer (13 MiB, more than the kernel buffers) never read.
        raw = await Raw.connect(server, receive_buffer=4096)
        await raw.send(request(server, sealed(plain(b"x" * 10 * MIB))))
        # Not yet accepted counts no connection either: see the server take it, then let go.
        await eventually(lambda: server.load.connections == 1, what="the server took it")
        await eventually(
            lambda: server.load.connections == 0,
            what="the connection is cut off while its answer waits",
        )
        raw.close()


# --- connections and requests at once ---------------------------------------------------------


async def test_connections_over_the_limit_wait_until_one_closes():
    async with serving(limits=Limits(max_connections=2)) as server:
        holders = [await Raw.connect(server) for _ in range(2)]
        for holder in holders:
            await holder.send(b"POST /decode HTTP/1.1\r\n")  # a request begun, not finished
        await eventually(lambda: server.load.connections == 2, what="two connections held")
        third = await Raw.connect(server)  # the kernel completes it; the server does not take it
        await third.send(request(server))
        with pytest.raises(TimeoutError):
            await third.response(timeout=0.5)
        assert server.load.connections == 2
        holders[0].close()
        assert (await third.response()).status == 200
        third.close()
        holders[1].close()


async def test_case10_slow_clients_take_no_thread_each_and_no_more_than_the_connection_limit():
    """The issue's second attack: 150 slow clients got 152 threads. Connections are tasks on
    the server's one loop; past MAX_CONNECTIONS they wait in the kernel's backlog."""
    async with serving() as server:
        threads = threading.active_count()
        clients = [await Raw.connect(server) for _ in range(150)]
        for client in clients:
            await client.send(b"POST /decode HTTP/1.1\r\nHost: loc")  # begun, never finished
        await eventually(
            lambda: server.load.connections == MAX_CONNECTIONS,
            what=f"{MAX_CONNECTIONS} connections taken, not {server.load.connections}",
        )
        assert threading.active_count() == threads
        for client in clients:
            client.close()
        await eventually(lambda: server.load.connections == 0, what="all closed")


def test_limits_refuse_what_could_never_be_served():
    with pytest.raises(ValueError, match="max_request_bytes must not exceed"):
        Limits(max_request_bytes=2 * MIB, max_bytes_in_flight=1 * MIB)
    with pytest.raises(ValueError, match="request_seconds must be positive"):
        Limits(request_seconds=0)


async def test_stopping_closes_open_connections():
    server = await CodecServer(KEYS, port=0).start()
    raw = await Raw.connect(server)
    await raw.send(b"POST /decode HTTP/1.1\r\n")
    await eventually(lambda: server.load.connections == 1, what="the connection is taken")
    await server.stop()
    assert await raw.until_eof() == b""
    raw.close()
    assert server.load.connections == 0


async def test_at_most_the_limit_of_requests_are_processed_at_once_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
):
    gate = Gate()
    async with serving(limits=Limits(max_concurrent_requests=2)) as server:
        monkeypatch.setattr(server._codec, "decrypt", gate)  # the codec it serves with
        clients = [await Raw.connect(server) for _ in range(5)]
        body = sealed(plain(b'"hi"'))
        for client in clients:
            await client.send(request(server, body))
        answers = [asyncio.create_task(client.response()) for client in clients]
        # The load counts a request as processing as it hands it to a thread, a moment before
        # the thread is inside the codec: both are waited for (asserting the second at once
        # failed under load).
        await eventually(
            lambda: (
                (server.load.processing, server.load.waiting_to_process, gate.inside) == (2, 3, 2)
            ),
            what=f"two processed and three waiting, not {server.load} ({gate.inside} inside)",
        )
        gate.opened.set()
        assert [(await a).status for a in answers] == [200] * 5
        for client in clients:
            client.close()
    assert gate.most == 2
    assert gate.threads and all(name.startswith("codec-server-work") for name in gate.threads)
    assert not gate.had_a_loop


# --- bytes in flight --------------------------------------------------------------------------


async def test_bodies_over_the_byte_budget_wait_for_room(monkeypatch: pytest.MonkeyPatch):
    gate = Gate()
    limits = Limits(max_bytes_in_flight=2 * MIB, max_request_bytes=1 * MIB)
    async with serving(limits=limits) as server:
        monkeypatch.setattr(server._codec, "decrypt", gate)
        body = sealed(plain(b"x" * (6 * MIB // 10)))  # about 0.8 MiB: two fit, not three
        clients = [await Raw.connect(server) for _ in range(3)]
        for client in clients:
            await client.send(request(server, body))
        answers = [asyncio.create_task(client.response()) for client in clients]
        await eventually(
            lambda: server.load.waiting_for_bytes == 1 and gate.inside == 2,
            what=f"two admitted and one waiting, not {server.load}",
        )
        assert server.load.bytes_in_flight == 2 * len(body) <= limits.max_bytes_in_flight
        gate.opened.set()
        assert [(await a).status for a in answers] == [200] * 3
        for client in clients:
            client.close()
        # Each body's bytes go back once its answer is sent, which the client may read first.
        await eventually(
            lambda: server.load.bytes_in_flight == 0,
            what=f"every body's bytes given back, not {server.load}",
        )


async def test_a_request_that_finds_no_room_in_time_gets_503_and_its_body_is_not_read(
    monkeypatch: pytest.MonkeyPatch,
):
    gate = Gate()
    limits = Limits(max_bytes_in_flight=1 * MIB, max_request_bytes=1 * MIB, admission_seconds=0.3)
    async with serving(limits=limits) as server:
        monkeypatch.setattr(server._codec, "decrypt", gate)
        body = sealed(plain(b"x" * (6 * MIB // 10)))  # about 0.8 MiB: one fits, not two
        first = await Raw.connect(server)
        await first.send(request(server, body))
        await eventually(lambda: gate.inside == 1, what="the first request is processed")
        second = await Raw.connect(server)
        await second.send(request(server, body))
        answered, rest = responses(await second.until_eof())
        assert [(r.status, r.headers.get("retry-after")) for r in answered] == [(503, "1")]
        assert rest == b""
        gate.opened.set()
        assert (await first.response()).status == 200
        first.close()
        second.close()


async def test_a_body_over_the_request_limit_gets_413_before_any_of_it_is_sent():
    async with serving() as server:
        for expect in ("", "Expect: 100-continue\r\n"):
            raw = await Raw.connect(server)
            too_long = f"Content-Length: {MAX_REQUEST_BYTES + 1}\r\n{expect}"
            await raw.send(request(server, b"", length=False, extra=too_long))
            # Nothing of the body was sent: the answer can only come from its length.
            answered, rest = responses(await raw.until_eof())
            raw.close()
            assert [(r.status, r.body) for r in answered] == [(413, b"request too large\n")]
            assert rest == b""


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", PROC_STATUS.read_text(), re.MULTILINE)
    assert match, field
    return int(match[1]) * 1024


class PeakRss:
    """The process's peak resident memory over a stretch: the kernel's high-water mark, reset
    at the start (``/proc/self/clear_refs``), or where that is not allowed, sampled."""

    def __init__(self) -> None:
        self.start = _status_kib("VmRSS")
        self.sampled = self.start
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.sampled = max(self.sampled, _status_kib("VmRSS"))

    def growth(self) -> int:
        if self._sampler is None:
            return _status_kib("VmHWM") - self.start
        self._stop.set()
        self._sampler.join()
        return self.sampled - self.start


async def test_case10_concurrent_large_decodes_keep_the_process_within_a_bound_of_the_byte_budget():
    """The issue's attack: six concurrent 16 MiB decodes took the standard library's server
    from 104 to 676 MB. Now at most MAX_BYTES_IN_FLIGHT of bodies are held at once, each turned
    into its answer payload by payload; the process's peak (its clients' included: they hash
    the answers as they arrive) stays under four times the budget (measured: two to three
    times), and what it took is given back (glibc would keep it in its threads' arenas; see
    codec_server.MALLOC_MMAP_THRESHOLD). Each answer is then checked against one more
    decode, made after the measure and kept whole."""
    data = b"\x07" * (MAX_REQUEST_BYTES * 3 // 4 - 64 * 1024)
    body = sealed(Payload(metadata={"encoding": b"binary/plain"}, data=data))
    assert 15 * MIB < len(body) <= MAX_REQUEST_BYTES
    async with serving() as server:
        head = request(server, b"", length=False, extra=f"Content-Length: {len(body)}\r\n")

        async def decode(*, keep: bool) -> tuple[int, str, bytes]:
            """One decode; its status, its answer's digest, and the answer if ``keep``."""
            raw = await Raw.connect(server)
            try:
                await raw.send(head, body)
                while b"\r\n\r\n" not in raw.received:
                    chunk = await raw.loop.sock_recv(raw.sock, 65536)
                    assert chunk, "closed before the answer's head"
                    raw.received += chunk
                top, _, start = raw.received.partition(b"\r\n\r\n")
                length = re.search(rb"\r\nContent-Length: (\d+)", top)
                assert length, top
                # The answer streamed, hashed chunk by chunk, held only if asked.
                digest, kept, got = hashlib.sha256(start), [start], len(start)
                while got < int(length[1]):
                    chunk = await raw.loop.sock_recv(raw.sock, 65536)
                    assert chunk, "closed before the end of the answer"
                    digest.update(chunk)
                    got += len(chunk)
                    if keep:
                        kept.append(chunk)
                return int(top.split()[1]), digest.hexdigest(), b"".join(kept) if keep else b""
            finally:
                raw.close()

        peak = PeakRss()
        done = await asyncio.wait_for(asyncio.gather(*(decode(keep=False) for _ in range(6))), 120)
        growth = peak.growth()
        resident = _status_kib("VmRSS") - peak.start
        status, digest, whole = await decode(keep=True)
    assert status == 200
    assert [(status, digest)] * 6 == [(status, digest) for status, digest, _ in done]
    (decoded,) = json_format.Parse(whole, Payloads()).payloads
    assert decoded.data == data
    bound = 4 * MAX_BYTES_IN_FLIGHT
    assert growth < bound, f"the process grew {growth / MIB:.0f} MiB, over {bound / MIB:.0f}"
    assert resident < MAX_BYTES_IN_FLIGHT // 2, f"{resident / MIB:.0f} MiB stayed resident"


# --- headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        "X-Big: " + "a" * (70 * 1024) + "\r\n",  # over 64 KiB in one field
        "".join(f"X-Field-{i}: {i}\r\n" for i in range(101)),  # over 100 fields, each small
    ],
    ids=["size", "count"],
)
async def test_headers_over_the_size_or_count_limit_get_431_and_the_connection_closed(extra: str):
    async with serving() as server:
        raw = await Raw.connect(server)
        await raw.send(request(server, extra=extra))
        answered, rest = responses(await raw.until_eof())
        raw.close()
    assert [r.status for r in answered] == [431] and rest == b""


# --- every complete request answered ----------------------------------------------------------


async def test_requests_on_one_connection_are_answered_in_order_pipelined_or_not():
    async with serving() as server:
        raw = await Raw.connect(server)
        hello = sealed(plain(b'"hello"'))
        await raw.send(request(server, hello) + request(server, path="/nowhere") + request(server))
        assert (await raw.response()).status == 200
        assert (await raw.response()).status == 404  # answered, not read: closed after it
        assert await raw.until_eof() == b""
        raw.close()
        # Expect: 100-continue (curl's, for large bodies): told to go on, then answered.
        raw = await Raw.connect(server)
        head = request(server, hello, extra="Expect: 100-continue\r\n")[: -len(hello)]
        await raw.send(head)
        assert (await raw.response()).status == 100
        await raw.send(hello)
        answer = await raw.response()
        raw.close()
    assert answer.status == 200
    (decoded,) = json_format.Parse(answer.body, Payloads()).payloads
    assert decoded == plain(b'"hello"')
    assert answer.headers["cache-control"] == "no-store"


async def test_a_request_cut_short_is_answered_before_the_connection_closes():
    async with serving() as server:
        raw = await Raw.connect(server)
        await raw.send(request(server, b"", length=False, extra="Content-Length: 100\r\n"), b"{}")
        raw.sock.shutdown(socket.SHUT_WR)  # the client is done sending; it still reads
        answered, rest = responses(await raw.until_eof())
        raw.close()
    assert [(r.status, r.body) for r in answered] == [(400, b"the request was cut short\n")]
    assert rest == b""


async def test_other_methods_get_405_naming_the_allowed_ones():
    async with serving() as server:
        raw = await Raw.connect(server)
        await raw.send(request(server, b"", method="GET", length=False))
        answer = await raw.response()
        raw.close()
    assert answer.status == 405 and answer.headers["allow"] == "POST, OPTIONS"


PROTO_JSON_BODIES = [
    json_format.MessageToJson(
        Payloads(payloads=[plain(b'"a"'), Payload(metadata={"k": b"\x00\xff"}, data=b"\xfb\xff")])
    ),
    '{"payloads":[{"metadata":{"encoding":"anNvbi9wbGFpbg"},"data":"-_8"}]}',  # URL-safe, bare
    '{"payloads":[{"data":"QQ"},{"data":"QQ=="},{"data":"Q Q=\\n="},{"data":"QQ==QQ=="}]}',
    '{"payloads":[{"data":"@@@"},{"data":"\\u00e9QQ"},{"data":"QQ@@"}]}',  # skipped characters
    '{"payloads":[{"data":null},{},{"metadata":{}},{"metadata":null}]}',
    '{"payloads":[{"externalPayloads":[{"sizeBytes":"10"}],"data":"QQ=="}]}',
    '{"payloads":null}',
    '{"payloads":[]}',
    "{}",
    # Refused by json_format, so by the server:
    "null",
    '"payloads"',
    '{"payloads":[null]}',
    '{"payloads":{}}',
    '{"payloads":[1]}',
    '{"payloads":[],"other":1}',
    '{"payloads":[],"payloads":[]}',
    '{"payloads":[{"data":"Q"}]}',
    '{"payloads":[{"data":7}]}',
    '{"payloads":[{"metadata":{"k":"Q"}}]}',
    '{"payloads":[{"data":"QQ==","data":"QQ=="}]}',
    "[" * 100_000 + "]" * 100_000,
    "not json",
]


async def test_a_request_carries_at_most_the_payload_limit():
    """Real payloads at the limit are all decoded; one more is refused whole, before any is
    decrypted; so is a body whose count of JSON values no such number of payloads could reach,
    before it is parsed."""
    async with serving(limits=Limits(max_payloads=64)) as server:
        for count, status in ((64, 200), (65, 400)):
            raw = await Raw.connect(server)
            await raw.send(request(server, sealed(*[plain(b'"%d"' % i) for i in range(count)])))
            answer = await raw.response()
            raw.close()
            assert answer.status == status, (count, answer)
            if status == 200:
                decoded = json_format.Parse(answer.body, Payloads()).payloads
                assert [p.data for p in decoded] == [b'"%d"' % i for i in range(count)]
            else:
                refusal = b"the body is not the JSON of Payloads (at most 64 payloads)\n"
                assert answer.body == refusal
        # One payload, but metadata of 64 * 16 keys: refused by its count alone.
        metadata = {f"k{i}": "QQ==" for i in range(64 * 16)}
        body = json.dumps({"payloads": [{"metadata": metadata}]}).encode()
        raw = await Raw.connect(server)
        await raw.send(request(server, body))
        assert (await raw.response()).status == 400
        raw.close()


async def test_a_body_is_read_exactly_as_protobuf_json_reads_it():
    """The server reads the large ``data`` field itself (to avoid json_format's copies of it):
    for each body, it accepts what json_format.Parse accepts, with the same payloads (decoding
    unencrypted payloads gives them back as they are), and refuses the rest with 400. One
    difference is meant: json_format takes ``[]`` for an empty message; it is not Payloads."""
    async with serving() as server:
        invalid_utf8 = b'{"payloads":[{"data":"\xff"}]}'
        for body in [*(text.encode() for text in PROTO_JSON_BODIES), invalid_utf8]:
            text = body.decode("latin-1")
            try:
                expected: Payloads | None = json_format.Parse(body, Payloads())
            except Exception:  # noqa: BLE001 (any refusal of json_format's is the oracle's "no")
                expected = None
            raw = await Raw.connect(server)
            await raw.send(request(server, body))
            answer = await raw.response()
            raw.close()
            if expected is None:
                assert answer.status == 400, (text[:80], answer)
                assert answer.body.startswith(b"the body is not the JSON of Payloads")
            else:
                assert answer.status == 200, (text[:80], answer)
                assert json_format.Parse(answer.body, Payloads()) == expected, text[:80]
                json.loads(answer.body)  # and plain JSON too
        raw = await Raw.connect(server)
        await raw.send(request(server, b"[]"))
        assert (await raw.response()).status == 400
        raw.close()


def test_the_old_import_path_still_works_and_warns_naming_the_new_one():
    """``temporal_agent_interrupts.worker.codec_server`` moved to the package root (issue 46);
    the old path re-exports every public name until 0.2, with a DeprecationWarning that says
    where to go."""
    import importlib
    import sys

    from temporal_agent_interrupts import codec_server

    sys.modules.pop("temporal_agent_interrupts.worker.codec_server", None)
    with pytest.warns(DeprecationWarning, match=r"import temporal_agent_interrupts\.codec_server"):
        old = importlib.import_module("temporal_agent_interrupts.worker.codec_server")
    assert [getattr(old, name) for name in codec_server.__all__] == [
        getattr(codec_server, name) for name in codec_server.__all__
    ]
    assert old.CodecServer is CodecServer


async def test_codec_app_mounted_in_a_teams_own_app_serves_under_its_prefix():
    """``codec_app`` is the same server as an ASGI app: mounted under a prefix in another
    Starlette app (served here by the product's HTTP stack), it decodes at the prefix's
    ``/decode``, routes by the raw target there too, and keeps its Host rule."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from temporal_agent_interrupts import http_server
    from temporal_agent_interrupts.codec_server import codec_app

    app = Starlette(routes=[Mount("/codec", app=codec_app(KEYS))])
    listener = http_server.bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    serving_task = asyncio.create_task(
        http_server.serve(app, limits=Limits().connection_limits(), sock=listener)
    )
    try:

        async def status(path: str, host: str = f"localhost:{port}") -> Response:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = sealed(plain(b'"mounted"'))
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-Namespace: default\r\n"
                "Connection: close\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            received = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            found = _first(received)
            assert found is not None, received
            return found[0]

        served = await status("/codec/decode?x=1")
        assert served.status == 200, served
        assert json_format.Parse(served.body, Payloads()).payloads[0].data == b'"mounted"'
        assert (await status("/codec/d%65code")).status == 404
        assert (await status("/codec/decode", host="evil.example")).status == 403
    finally:
        serving_task.cancel()
        await asyncio.gather(serving_task, return_exceptions=True)
        listener.close()

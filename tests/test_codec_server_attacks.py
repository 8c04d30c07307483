"""A security review's attacks on the codec server, each over real loopback sockets.

A test that fails here is an attack that worked: it asserts the safe behaviour, and its name
says what the server should do. The passing ones are attacks it resisted, kept for coverage.
The raw client and the helpers are ``tests/test_codec_server.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from temporal_agent_interrupts.codec import EncryptionCodec
from temporal_agent_interrupts.codec_server import (
    MAX_PAYLOADS,
    SEND_CHUNK_BYTES,
    CodecServer,
    Limits,
)
from temporal_agent_interrupts.http_server import ByteBudget as _ByteBudget
from tests.test_codec_server import (
    KEYS,
    MIB,
    Gate,
    Raw,
    Response,
    eventually,
    plain,
    port_of,
    request,
    responses,
    sealed,
    serving,
)

ROOT = Path(__file__).resolve().parent.parent
UI = "http://localhost:8233"
ENCODE_NOTHING = json_format.MessageToJson(Payloads(), indent=None).encode()


@contextlib.asynccontextmanager
async def serving_ui(limits: Limits | None = None) -> AsyncIterator[CodecServer]:
    async with CodecServer(KEYS, port=0, cors_origins=[UI], limits=limits) as server:
        yield server


async def exchange(server: CodecServer, data: bytes) -> tuple[list[int], bytes]:
    """Send ``data`` on a new connection; the statuses answered until the server closes, and
    any bytes after the last whole answer."""
    raw = await Raw.connect(server)
    try:
        await raw.send(data)
        answered, rest = responses(await raw.until_eof())
    finally:
        raw.close()
    return [r.status for r in answered], rest


async def one_answer(server: CodecServer, data: bytes) -> Response:
    raw = await Raw.connect(server)
    try:
        await raw.send(data)
        return await raw.response()
    finally:
        raw.close()


async def still_serves(server: CodecServer) -> None:
    """The server still answers an honest decode (its loop and limits survived the attack)."""
    answer = await one_answer(server, request(server, sealed(plain(b'"still here"'))))
    assert answer.status == 200, answer
    await eventually(
        lambda: server.load.bytes_in_flight == 0 and server.load.waiting_for_bytes == 0,
        what=f"the byte budget given back, not {server.load}",
    )


def head(server: CodecServer, *, length: int, extra: str = "", path: str = "/decode") -> bytes:
    return request(
        server, b"", path=path, length=False, extra=f"Content-Length: {length}\r\n{extra}"
    )


def fast(**limits: float) -> Limits:
    """Limits whose idle and linger times do not keep a test waiting."""
    return Limits(**{"idle_seconds": 0.3, "linger_seconds": 0.2, **limits})  # type: ignore[arg-type]


async def whole_answer(raw: Raw, timeout: float = 60) -> tuple[int, bytes, float]:
    """The next answer, however many segments it comes in (``Raw.response`` is quadratic in
    them); its status, its body, and the seconds from now to its first byte."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    first = 0.0
    buffer = bytearray(raw.received)
    async with asyncio.timeout(timeout):
        while b"\r\n\r\n" not in buffer:
            chunk = await loop.sock_recv(raw.sock, 65536)
            assert chunk, "closed before an answer"
            first = first or loop.time() - began
            buffer += chunk
        top, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", top)[1])  # type: ignore[index]
        body = bytearray(rest)
        while len(body) < length:
            chunk = await loop.sock_recv(raw.sock, 1 << 20)
            assert chunk, "closed before the end of the answer"
            body += chunk
    raw.received = bytes(body[length:])
    return int(top.split()[1]), bytes(body[:length]), first


class Sends:
    """Every send the server makes, recorded on its own loop (its transports' ``write``
    wrapped, adding no yield of its own; the h11 server this replaced was watched through
    ``loop.sock_sendall``): per client (by its port), each send's bytes, and whether the
    server's loop ran other work (a callback queued just after that connection's previous send)
    before it."""

    def __init__(self, server: CodecServer, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = server._loop
        assert loop is not None, "not serving"
        self.sizes: dict[int, list[int]] = collections.defaultdict(list)
        self.after_a_turn: dict[int, list[bool]] = collections.defaultdict(list)
        turned: dict[int, bool] = {}
        transport_class = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]  # asyncio's own, the one uvicorn writes through
        write = transport_class.write

        def recorded(transport: asyncio.Transport, data: bytes) -> None:
            if data and asyncio.get_running_loop() is loop:
                port = transport.get_extra_info("peername")[1]
                self.sizes[port].append(len(data))
                self.after_a_turn[port].append(turned.get(port, True))
                turned[port] = False
                loop.call_soon(turned.__setitem__, port, True)
            return write(transport, data)

        monkeypatch.setattr(transport_class, "write", recorded)

    def to(self, raw: Raw) -> tuple[list[int], list[bool]]:
        """The sends to ``raw``."""
        port = raw.sock.getsockname()[1]
        return self.sizes[port], self.after_a_turn[port]


def empty_payloads(size: int) -> bytes:
    """A body of about ``size`` bytes that is nothing but empty payloads: ``{}`` three bytes
    apiece."""
    return b'{"payloads":[' + b",".join([b"{}"] * (size // 3)) + b"]}"


# --- smuggling: a request framed two ways ------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\n",
    ],
    ids=["both-lengths", "chunked-alone"],
)
async def test_a_preflight_framed_by_transfer_encoding_is_closed_and_nothing_behind_it_served(
    framing: str,
):
    """The module docstring: a request with a Transfer-Encoding is closed, "the bytes behind it
    are never read as a request". OPTIONS skips that check (``_preflight`` never calls
    ``_content_length``): h11 frames it as chunked, a zero chunk ends it, the 204/403 keeps the
    connection alive, and what follows is served. A proxy in front that frames by the
    Content-Length forwards the smuggled /encode as the preflight's body, never checking it."""
    async with serving_ui(limits=Limits(idle_seconds=0.5)) as server:
        smuggled = request(server, ENCODE_NOTHING, path="/encode")
        body = b"0\r\n\r\n" + smuggled
        preflight = (
            f"OPTIONS /decode HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\n"
            f"Origin: {UI}\r\nAccess-Control-Request-Method: POST\r\n"
            + framing.format(n=len(body))
            + "\r\n"
        ).encode()
        statuses, rest = await exchange(server, preflight + body)
    assert len(statuses) == 1 and rest == b"", (
        f"answers {statuses}: the bytes behind the preflight were served as a request"
    )


@pytest.mark.parametrize(
    "coding",
    [
        "chunked, identity",
        "identity, chunked",
        "identity",
        "Chunked",
        "CHUNKED",
        " chunked",
        "\tchunked",
        "chunked ",
        "x-chunked",
        "chunked;q=1",
        '"chunked"',
    ],
)
async def test_every_transfer_coding_spelling_is_refused_and_nothing_behind_it_served(coding: str):
    async with serving(limits=fast()) as server:
        body = b"0\r\n\r\n" + request(server, ENCODE_NOTHING, path="/encode")
        for lengths in (f"Content-Length: {len(body)}\r\n", ""):
            data = request(
                server, b"", length=False, extra=f"{lengths}Transfer-Encoding: {coding}\r\n"
            )
            statuses, rest = await exchange(server, data + body)
            assert len(statuses) == 1 and statuses[0] in (400, 411) and rest == b"", (
                coding,
                lengths,
                statuses,
            )
        await still_serves(server)


@pytest.mark.parametrize(
    "fold",
    [
        # The folded line, unfolded, is part of X-A's value: the body is framed by the length.
        "Content-Length: {n}\r\nX-A: b\r\n Transfer-Encoding: chunked\r\n",
        "Content-Length: {n}\r\nX-A: b\r\n\tContent-Length: 0\r\n",
        # A fold at the start of the head: refused.
        " Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n",
    ],
)
async def test_obs_fold_lines_never_frame_a_body(fold: str):
    """RFC 9112 lets a server unfold obs-fold (h11 does) or refuse it. Either way the folded
    line is no header of its own: the body is read by the one Content-Length."""
    async with serving(limits=fast()) as server:
        body = sealed(plain(b'"folded"'))
        data = request(server, b"", length=False, extra=fold.format(n=len(body))) + body
        statuses, rest = await exchange(server, data + request(server))
        assert rest == b""
        assert statuses in ([200, 200], [400]), statuses
        await still_serves(server)


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ("Content-Length: 2\r\nContent-Length: 2\r\n", [200, 200]),  # equal: one length
        ("Content-Length: 2, 2\r\n", [200, 200]),
        ("Content-Length: 002\r\n", [200, 200]),  # leading zeros: the same number
        ("Content-Length: 2\r\nContent-Length: 02\r\n", [400]),  # differently spelt: refused
        ("Content-Length: +2\r\n", [400]),
        ("Content-Length: -2\r\n", [400]),
        ("Content-Length: 2.0\r\n", [400]),
        ("Content-Length: 2e0\r\n", [400]),
        ("Content-Length: 0x2\r\n", [400]),
        ("Content-Length: \xb2\r\n", [400]),  # a superscript two passes str.isdigit()
        ("Content-Length: 2 2\r\n", [400]),
        ("Content-Length: 2,\r\n", [400]),
        ("Content-Length:\r\n", [400]),
        ("Content-Length: 99999999999\r\n", [413]),  # eleven digits: too large, unread
        ("Content-Length: 00000000000000000002\r\n", [400]),  # over twelve digits
        ("Content-Length: 99999999999999999999999999\r\n", [400]),
    ],
)
async def test_a_content_length_is_one_plain_number_or_the_connection_is_closed(
    lengths: str, expected: list[int]
):
    """Each pipelined behind a second request: consistent framing answers both, a refusal
    closes after the first; never a second answer made of the first's body."""
    async with serving(limits=fast()) as server:
        data = request(server, b"", length=False, extra="X-Lengths: here\r\n")
        data = data.replace(b"X-Lengths: here\r\n", lengths.encode("latin-1"))
        statuses, rest = await exchange(server, data + b"{}" + request(server))
    assert statuses == expected and rest == b"", (lengths, statuses)


async def test_a_body_longer_than_its_length_is_the_next_request_and_is_framed_as_one():
    """What follows a body by its Content-Length is read as the next request, with its own
    checks: a forbidden Host behind an allowed one gets 403 and closes."""
    async with serving(limits=fast()) as server:
        honest = request(server, sealed(plain(b'"one"')))
        behind = honest.replace(f"localhost:{port_of(server)}".encode(), b"evil.example")
        statuses, rest = await exchange(server, honest + behind + honest)
    assert statuses == [200, 403] and rest == b""


async def test_http_1_0_keep_alive_is_answered_and_closed():
    async with serving(limits=fast()) as server:
        body = sealed(plain(b'"old"'))
        data = request(server, body, extra="Connection: keep-alive\r\n").replace(
            b"HTTP/1.1", b"HTTP/1.0", 1
        )
        raw = await Raw.connect(server)
        await raw.send(data + data)
        received = await raw.until_eof()
        raw.close()
        answered, rest = responses(received)
    assert [r.status for r in answered] == [200] and rest == b""


async def test_a_request_that_asks_to_upgrade_is_answered_over_http_1_1_and_closed():
    """h11 would switch protocols on a 101; the server never sends one: a plain answer, and
    what was pipelined after it is never read (as a protocol it does not speak)."""
    async with serving(limits=fast()) as server:
        raw = await Raw.connect(server)
        await raw.send(
            request(server, extra="Connection: upgrade\r\nUpgrade: h2c\r\n")
            + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        )
        answered, rest = responses(await raw.until_eof())
        raw.close()
        await still_serves(server)
    assert [r.status for r in answered] == [200] and rest == b""
    assert answered[0].headers.get("connection") == "close"


# --- holding the byte budget -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["silent", "expect-100-continue", "dribbling"])
async def test_bodies_claimed_but_not_sent_do_not_starve_an_honest_request(how: str):
    """Bytes are reserved by Content-Length before the body is read, and held until the request
    deadline (30 s), however little arrives. Two connections that claim a 16 MiB body each and
    send nothing (or one byte a second) hold the whole budget (32 MiB): every honest request
    waits ADMISSION_SECONDS (10) and gets 503, and the attacker renews every 30 s, from two of
    its 64 connections. Shrunk here: a budget of 2 MiB, two claims of 1 MiB."""
    limits = Limits(max_bytes_in_flight=2 * MIB, max_request_bytes=1 * MIB, admission_seconds=1.0)
    async with serving(limits=limits) as server:
        extra = "Expect: 100-continue\r\n" if how == "expect-100-continue" else ""
        attackers = [await Raw.connect(server) for _ in range(2)]
        for attacker in attackers:
            await attacker.send(head(server, length=1 * MIB, extra=extra))
        await eventually(
            lambda: server.load.bytes_in_flight == 2 * MIB,
            what=f"both claims admitted, not {server.load}",
        )

        async def dribble() -> None:
            with contextlib.suppress(OSError):
                while True:
                    for attacker in attackers:
                        await attacker.send(b" ")
                    await asyncio.sleep(0.2)

        dribbling = asyncio.create_task(dribble()) if how == "dribbling" else None
        began = time.monotonic()
        answer = await one_answer(server, request(server, sealed(plain(b'"honest"'))))
        took = time.monotonic() - began
        if dribbling:
            dribbling.cancel()
        for attacker in attackers:
            attacker.close()
    assert answer.status == 200, (
        f"the honest request got {answer.status} {answer.body!r} after {took:.1f} s, while two "
        f"connections held the budget with {'nothing' if how != 'dribbling' else 'a few bytes'}"
    )


async def test_a_client_that_never_sends_its_promised_body_is_cut_off_and_its_bytes_freed():
    async with serving(limits=Limits(request_seconds=1.0, max_request_bytes=MIB)) as server:
        raw = await Raw.connect(server)
        await raw.send(head(server, length=MIB, extra="Expect: 100-continue\r\n"))
        assert (await raw.response()).status == 100
        assert server.load.bytes_in_flight == MIB
        answered, rest = responses(await raw.until_eof())
        raw.close()
        assert [r.status for r in answered] == [408] and rest == b""
        await still_serves(server)


@pytest.mark.parametrize("when", ["mid-body", "waiting-for-room", "waiting-for-a-thread"])
@pytest.mark.parametrize("how", ["fin", "rst"])
async def test_a_client_that_goes_away_gives_back_its_bytes_and_its_slot(
    monkeypatch: pytest.MonkeyPatch, when: str, how: str
):
    gate = Gate()
    limits = Limits(max_bytes_in_flight=2 * MIB, max_request_bytes=MIB, max_concurrent_requests=1)
    async with serving(limits=limits) as server:
        monkeypatch.setattr(server._codec, "decrypt", gate)
        holders: list[Raw] = []
        if when == "waiting-for-room":
            for _ in range(2):
                holders.append(await Raw.connect(server))
                await holders[-1].send(head(server, length=MIB))
        elif when == "waiting-for-a-thread":
            holders.append(await Raw.connect(server))
            await holders[-1].send(request(server, sealed(plain(b'"first"'))))
            await eventually(lambda: gate.inside == 1, what="the first is processed")
        raw = await Raw.connect(server)
        if when == "mid-body":
            await raw.send(head(server, length=MIB), b" " * (MIB // 2))
            await eventually(lambda: server.load.bytes_in_flight == MIB, what="admitted")
        elif when == "waiting-for-room":
            await raw.send(head(server, length=MIB))
            await eventually(lambda: server.load.waiting_for_bytes == 1, what="waiting")
        else:
            await raw.send(request(server, sealed(plain(b'"second"'))))
            await eventually(lambda: server.load.waiting_to_process == 1, what="waiting")
        if how == "rst":
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
        for holder in holders:
            holder.close()
        gate.opened.set()
        await eventually(
            lambda: server.load == type(server.load)(0, 0, 0, 0, 0),
            what=f"everything given back, not {server.load}",
        )
        await still_serves(server)


def test_a_waiter_cancelled_as_room_frees_leaks_no_bytes_and_breaks_no_release():
    """``_ByteBudget``: a wait that ends (its admission timeout, or ``stop()``) cancels its
    future at once, but the waiter leaves the queue only when its task next runs. A release in
    between (another request's answer sent, in the same turn of the loop) pops the cancelled
    entry, takes its bytes, and ``set_result`` on it raises InvalidStateError out of the
    releasing connection; then the waiter's ``remove`` raises ValueError (a 500 in place of its
    503). The bytes are never given back: each time, the budget shrinks for good, until every
    request gets 503."""

    async def attack() -> list[str]:
        budget = _ByteBudget(10)
        await budget.acquire(10, timeout=1)
        waiter = asyncio.create_task(budget.acquire(5, timeout=60))
        await asyncio.sleep(0)
        assert budget.waiting == 1
        problems: list[str] = []
        waiter.cancel()  # what asyncio.timeout does when the admission time is up
        try:
            budget.release(10)  # another request answered, before the waiter runs again
        except Exception as e:  # noqa: BLE001
            problems.append(f"release() raised {e!r}")
        try:
            await waiter
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001
            problems.append(f"the waiter raised {e!r}, not its cancellation")
        if budget.reserved or budget.waiting:
            problems.append(f"{budget.reserved} of 10 bytes stay reserved by nobody")
        return problems

    assert asyncio.run(attack()) == []


async def test_a_busy_server_does_not_leak_its_byte_budget_for_good(
    monkeypatch: pytest.MonkeyPatch,
):
    """The same race over sockets, with no test hook in the server but a transform that holds
    one request. It needs a request's admission time to end in the turn of the loop in which
    another's work completes, which a loop kept busy makes certain: here the long answer of a
    body of empty payloads (see below), sent without yielding. Then the waiter gets 500, not
    503, the request that freed the room fails after its answer, and the whole budget stays
    reserved by nobody: every request after that gets 503, for good."""
    hold = threading.Event()
    codec = EncryptionCodec(KEYS)

    def transform(payload: Payload) -> Payload:
        if payload.data == b"HOLD":
            hold.wait(30)
        return codec.decrypt(payload)

    limits = fast(
        max_bytes_in_flight=MIB,
        max_request_bytes=MIB,
        admission_seconds=0.5,
        max_concurrent_requests=2,
        connection_body_bytes=1,  # every body is the budget's
    )
    async with serving(limits=limits) as server:
        monkeypatch.setattr(server._codec, "decrypt", transform)
        held = await Raw.connect(server)  # H: a small request, held in its thread
        await held.send(request(server, json.dumps({"payloads": [{"data": "SE9MRA=="}]}).encode()))
        await eventually(lambda: server.load.processing == 1, what="H in its thread")
        busy = await Raw.connect(server)  # X: the longest answer the limits allow
        await busy.send(request(server, empty_payloads(3 * limits.max_payloads), path="/encode"))
        waiter = await Raw.connect(server)  # W: wants the whole budget, so waits
        await waiter.send(head(server, length=MIB))
        await eventually(lambda: server.load.waiting_for_bytes == 1, what="W waits")
        waited_from = time.monotonic()
        answering = asyncio.create_task(whole_answer(busy))
        while not busy.received and not answering.done():  # X's answer has begun
            await asyncio.sleep(0.01)
            with contextlib.suppress(BlockingIOError):
                if busy.sock.recv(1, socket.MSG_PEEK):
                    break
        # W's admission time runs out, and H completes, while X's answer is being sent.
        await asyncio.sleep(max(0.0, 0.7 - (time.monotonic() - waited_from)))
        hold.set()
        assert (await answering)[0] == 200
        said = [r.status for r in responses(await waiter.until_eof())[0]]
        for raw in (held, busy, waiter):
            raw.close()
        with contextlib.suppress(AssertionError):
            await eventually(lambda: server.load.bytes_in_flight == 0, what="", timeout=2)
        leaked = server.load.bytes_in_flight
        after = await one_answer(server, request(server, sealed(plain(b'"next"'))))
    assert (said, leaked, after.status) == ([503], 0, 200), (
        f"the waiter got {said}, not 503; {leaked} bytes of {MIB} stay reserved by nobody; the "
        f"next honest request got {after.status} {after.body!r}"
    )


# --- slow and many clients ---------------------------------------------------------------------


async def test_many_honest_clients_at_once_past_the_connection_limit_are_all_served():
    async with serving() as server:
        body = sealed(plain(b'"crowd"'))
        clients = [await Raw.connect(server) for _ in range(150)]
        for client in clients:
            await client.send(request(server, body, extra="Connection: close\r\n"))
        answers = await asyncio.gather(*(client.response(timeout=30) for client in clients))
        for client in clients:
            client.close()
        assert [a.status for a in answers] == [200] * 150
        await eventually(lambda: server.load.connections == 0, what="all closed")


async def test_pipelined_requests_not_read_back_fill_no_memory():
    """A client pipelines requests and never reads an answer: the server reads only as it
    answers, so the client's sends soon block, and it is cut off after RESPONSE_SECONDS."""
    async with serving(limits=Limits(response_seconds=1.0, linger_seconds=0.1)) as server:
        raw = await Raw.connect(server, receive_buffer=4096)
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        one = request(server, sealed(plain(b'"p"' * 200)))
        batch = one * 100
        sent = 0
        with contextlib.suppress(TimeoutError, OSError):
            while sent < 64 * MIB:
                async with asyncio.timeout(2):
                    await raw.send(batch)
                sent += len(batch)
        raw.close()
        # The kernel's buffers, both ways, hold up to about 20 MiB; the server holds a read.
        assert sent < 48 * MIB, f"{sent / MIB:.0f} MiB pipelined without reading an answer"
        await eventually(lambda: server.load.connections == 0, what="cut off")
        await still_serves(server)


async def slow_reader(server: CodecServer) -> tuple[Raw, int]:
    """A 4 MiB decode read back a byte at a time, until the server lets go of it (its
    connection closed, its bytes freed); the client's connection, and what it had read."""
    raw = await Raw.connect(server, receive_buffer=4096)
    await raw.send(request(server, sealed(plain(b"x" * 4 * MIB))))
    got = 0
    try:
        # A hang guard: read so, its answer would take over an hour; the response deadline
        # (a second in these tests) is all that ends it.
        async with asyncio.timeout(20):
            while server.load.connections or server.load.bytes_in_flight:
                got += len(await raw.loop.sock_recv(raw.sock, 1))
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"the slow reader was never let go ({got} bytes read)") from None
    return raw, got


async def test_a_client_that_reads_its_answer_a_byte_at_a_time_is_let_go_and_its_bytes_freed():
    async with serving(limits=fast(response_seconds=1.0)) as server:
        raw, got = await slow_reader(server)
        raw.close()
        assert got < 64 * 1024
        await still_serves(server)


async def test_a_reader_cut_off_gets_no_more_of_its_answer():
    """The cut-off closes the socket gracefully, so the kernel keeps what was queued (megabytes:
    the send buffer grows to tcp_wmem's maximum) and goes on feeding it to the slow reader,
    for as long as it keeps reading, from an orphaned socket: kernel memory no limit of the
    server's counts. An abortive close (SO_LINGER 0: a reset) drops it."""
    async with serving(limits=fast(response_seconds=1.0)) as server:
        raw, _ = await slow_reader(server)
        after = 0
        with contextlib.suppress(OSError):
            async with asyncio.timeout(10):
                while chunk := await raw.loop.sock_recv(raw.sock, 65536):
                    after += len(chunk)
        raw.close()
    assert after < 256 * 1024, f"{after / MIB:.1f} MiB still came after the server let go"


async def test_slowloris_heads_on_every_slot_are_cut_at_the_deadline_and_the_next_served():
    """Every slot (four here) held by a head that never ends. Asserted: each is answered 408
    by the request deadline, naming the one configured (1 s), and closed; the next client,
    waiting in the kernel's backlog meanwhile, is served. No time is measured: without a
    deadline on the head the slots never free and the next is never answered (its hang guard,
    20 s, fails the test); with the default deadline (30 s) in place of the configured one,
    the same, and the 408 would name 30 s."""
    limits = Limits(max_connections=4, request_seconds=1.0, linger_seconds=0.1)
    async with serving(limits=limits) as server:
        loris = [await Raw.connect(server) for _ in range(4)]
        for client in loris:
            await client.send(b"POST /decode HTTP/1.1\r\nHost: l")
        await eventually(lambda: server.load.connections == 4, what="every slot held")
        answer = await one_answer(server, request(server, sealed(plain(b'"next"'))))
        cut = [responses(await client.until_eof(timeout=20)) for client in loris]
        for client in loris:
            client.close()
    assert answer.status == 200, answer
    for answered, rest in cut:
        assert [(r.status, r.body) for r in answered] == [
            (408, b"the request did not arrive within 1 s\n")
        ] and rest == b"", (answered, rest)


# --- absurd JSON ---------------------------------------------------------------------------------


async def test_an_encode_of_many_empty_payloads_is_not_answered_forty_times_its_size():
    """The byte budget counts a request's Content-Length, but an answer can be far larger: each
    ``{}`` (3 bytes) is encrypted into about 130 bytes of JSON. A 16 MiB body of them is a
    700 MiB answer, held whole (in 17 million bytes objects: measured 1.8 GB at the peak,
    scaled from 1 MiB) until sent, and two such requests fit the budget at once. Refusing that
    many payloads (4xx) is safe too. Here 128 KiB."""
    async with serving(limits=fast()) as server:
        body = empty_payloads(128 * 1024)
        raw = await Raw.connect(server)
        await raw.send(request(server, body, path="/encode"))
        status, answer, _ = await whole_answer(raw)
        raw.close()
    assert status >= 400 or len(answer) <= 8 * len(body) + 4096, (
        f"a {len(body) / 1024:.0f} KiB request got a {len(answer) / MIB:.1f} MiB answer "
        f"({len(answer) / len(body):.0f}x)"
    )


async def test_a_body_of_empty_payloads_costs_no_more_than_its_size_in_one_payload(
    monkeypatch: pytest.MonkeyPatch,
):
    """A 16 MiB decode of one payload takes about 0.1 s (the module docstring). 16 MiB of empty
    payloads (5.6 million) is parsed and rendered payload by payload in a thread (about 40 s;
    80 s to encode), then sent as four pieces a payload, each its own send: about 6 minutes
    (measured at 1 MiB: 24 s). No deadline bounds it (REQUEST_SECONDS ends at the body's last
    byte).

    Asserted as counts of the work, not its time: 128 KiB of them (43,690, over MAX_PAYLOADS)
    is refused (400) with not one payload transformed; at the limit (an encode of 4,096, the
    longest answer a byte asked buys), each is transformed once and the answer goes out in
    chunks of SEND_CHUNK_BYTES, one send each after its head, not four sends a payload. The
    defect fails both counts: 43,690 transforms, and some 16,000 sends. What such a body costs
    in time against one payload of the same size is ``bench/codec_flood.py``'s ratio."""
    async with serving(limits=fast()) as server:
        transformed: collections.Counter[str] = collections.Counter()

        def counting(name: str, transform: Callable[[Payload], Payload]) -> None:
            def counted(payload: Payload) -> Payload:
                transformed[name] += 1  # one request at a time: one thread counts
                return transform(payload)

            monkeypatch.setattr(server._codec, name, counted)

        counting("decrypt", server._codec.decrypt)
        counting("encrypt", server._codec.encrypt)
        sends = Sends(server, monkeypatch)
        over = await Raw.connect(server)
        await over.send(request(server, empty_payloads(128 * 1024)))
        status_over, said, _ = await whole_answer(over)
        over.close()
        refused = dict(transformed)
        at_limit = await Raw.connect(server)
        await at_limit.send(request(server, empty_payloads(3 * MAX_PAYLOADS), path="/encode"))
        status_at, answer, _ = await whole_answer(at_limit)
        sent, _ = sends.to(at_limit)
        at_limit.close()
    assert (status_over, refused) == (400, {}), (status_over, said, refused)
    assert status_at == 200 and transformed == {"encrypt": MAX_PAYLOADS}, (status_at, transformed)
    assert len(sent) <= 2 + len(answer) // SEND_CHUNK_BYTES, (
        f"a {len(answer)} byte answer took {len(sent)} sends"
    )


async def test_an_answer_being_sent_does_not_stall_the_servers_loop(
    monkeypatch: pytest.MonkeyPatch,
):
    """``loop.sock_sendall`` returns without yielding whenever the kernel takes the whole
    piece, so ``_send`` sends an answer's pieces (four a payload) back to back without letting
    the loop run: while the answer of a body of empty payloads goes out, no other client is
    accepted, read or answered, and no deadline fires. Measured: one 1 MiB request held an
    honest decode for 22 s; 16 MiB would hold the loop for minutes, and under ``make run``
    the worker's GIL with it. Here the longest answer a request may ask (an encode of
    MAX_PAYLOADS empty payloads, about 530 KiB); an honest decode sent once it has begun.

    Asserted by counting turns of the server's loop, not by timing the honest decode (which
    would race the flood's few chunks): the answer goes out in more than one chunk, and before
    each chunk after the first, the loop ran other work (``Sends``); the honest decode is
    answered. The defect sends thousands of pieces with no turn between them."""
    async with serving(limits=fast()) as server:
        sends = Sends(server, monkeypatch)
        flood = await Raw.connect(server)
        # As many payloads as a request may carry, encoded: the longest answer per byte asked.
        body = empty_payloads(3 * server._limits.max_payloads)
        await flood.send(request(server, body, path="/encode"))
        answering = asyncio.create_task(whole_answer(flood))
        while not answering.done():
            await asyncio.sleep(0.005)
            with contextlib.suppress(BlockingIOError):
                if flood.sock.recv(1, socket.MSG_PEEK):
                    break
        honest = await Raw.connect(server)
        await honest.send(request(server, sealed(plain(b'"honest"'))))
        answer = await honest.response(timeout=60)  # a hang guard
        honest.close()
        status, _, _ = await answering
        sizes, after_a_turn = sends.to(flood)
        flood.close()
    assert status == 200 and answer.status == 200, (status, answer)
    # The head, then the body's chunks: the first follows the head at once.
    assert len(sizes) >= 3, f"the answer went out in {len(sizes) - 1} send(s): no chunks to check"
    stalled = after_a_turn[2:].count(False)
    assert not stalled, f"{stalled} of {len(sizes) - 2} sends followed the one before with no turn"


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 1_000_000 + b"]" * 1_000_000,
        b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
        b'{"payloads":[{"metadata":{"k":' + b"[" * 500_000 + b"]" * 500_000 + b"}}]}",
        b'{"payloads":[],"x":' + b"[" * 500_000 + b"]" * 500_000 + b"}",
        b'{"payloads":[{"externalPayloads":' + b"[" * 500_000 + b"]" * 500_000 + b"}]}",
        b'{"payloads":[{"data":"QQ=="}],"n":' + b"9" * 100_000 + b"}",
    ],
    ids=["arrays", "objects", "in-metadata", "beside-payloads", "in-a-payload", "long-number"],
)
async def test_deeply_nested_or_absurd_json_gets_400_and_the_server_serves_on(body: bytes):
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, body))
        assert answer.status == 400, answer
        assert answer.body.startswith(b"the body is not the JSON of Payloads"), answer
        await still_serves(server)


async def test_a_huge_base64_padded_with_whitespace_decodes_as_protobuf_json_reads_it():
    async with serving(limits=fast()) as server:
        spaced = "QUJD" + " \n\t\r" * (2 * MIB) + "REVG"
        body = json.dumps({"payloads": [{"data": spaced}]}).encode()
        escaped = b'{"payloads":[{"data":"QUJD' + b"\\u0020" * 500_000 + b'REVG"}]}'
        for each in (body, escaped):
            answer = await one_answer(server, request(server, each))
            assert answer.status == 200, answer
            (decoded,) = json_format.Parse(answer.body, Payloads()).payloads
            assert decoded.data == b"ABCDEF"
        await still_serves(server)


INVALID_BASE64 = [
    "=",
    "==",
    "====",
    "Q===",
    "QQ=Q",
    "QQ=QQ==",
    "QUJD=",
    "QUJD==",
    "QUJD====",
    "Q",
    "QUJDR",
    "=QUJD",
    "QU=JD",
    "QUJ\u00e9D",
    "-_-_",
    "+/+/",
    "-/+_",
    "\u0000QUJD",
    "QUJD\u0000",
    "QQ==\u00e9",
    "\u00e9\u00e9QQ",
    "QUI=QUI=",
]


@pytest.mark.parametrize("data", INVALID_BASE64)
async def test_odd_base64_is_read_exactly_as_protobuf_json_reads_it(data: str):
    body = json.dumps({"payloads": [{"data": data}]}).encode()
    try:
        expected: Payloads | None = json_format.Parse(body, Payloads())
    except Exception:  # noqa: BLE001
        expected = None
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, body))
    if expected is None:
        assert answer.status == 400, (data, answer)
    else:
        assert answer.status == 200, (data, answer)
        assert json_format.Parse(answer.body, Payloads()) == expected, data


# --- Host, target, namespace ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["http://evil.example/encode", "https://evil.example:443/encode", "//evil.example/encode"],
)
async def test_a_request_target_that_names_another_authority_is_not_served(target: str):
    """The Host check stands for the authority (DNS rebinding), but a target in absolute form
    names its own, which RFC 9112 says a server must use in the Host's place; and
    ``urlsplit("//evil.example/encode").path`` is ``/encode``, so a proxy that refuses the
    encryption oracle by path prefix (``/encode``) passes ``//x/encode`` through to it.
    Only origin-form (``/encode``) should be served; the rest 400."""
    async with serving(limits=fast()) as server:
        data = request(server, ENCODE_NOTHING, path=target)
        statuses, _ = await exchange(server, data)
    assert statuses != [200], f"POST {target} was served as /encode"
    assert statuses in ([400], [403], [404]), statuses


@pytest.mark.parametrize(
    "extra",
    [
        "Transfer-Encoding: chunked\r\n",
        "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        "".join(f"X-{i}: a\r\n" for i in range(120)) + "Content-Length: 0\r\n",
    ],
    ids=["chunked", "both-lengths", "too-many-fields"],
)
async def test_the_http_stacks_own_refusals_carry_the_uis_cors_headers(extra: str):
    """A request the protocol refuses before the application sees it (its framing, its
    fields) is answered with the CORS headers the application would give its Origin, as the
    h11 server did: a page of the UI can read why, and no other origin gets them."""
    async with serving_ui(limits=fast()) as server:
        port = port_of(server)
        for origin, allowed in ((UI, True), ("http://evil.example", False)):
            data = (
                f"POST /decode HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: {origin}\r\n"
                f"X-Namespace: default\r\n{extra}\r\n"
            ).encode()
            raw = await Raw.connect(server)
            await raw.send(data)
            answered, _ = responses(await raw.until_eof())
            raw.close()
            assert [r.status for r in answered] in ([400], [411], [431]), answered
            given = answered[0].headers.get("access-control-allow-origin")
            assert given == (UI if allowed else None), (origin, answered[0].headers)


@pytest.mark.parametrize("target", ["/d%65code", "/%65ncode", "/decode%2F", "/decode/"])
async def test_a_route_is_its_raw_path_not_a_spelling_of_it(target: str):
    """uvicorn unquotes the path it gives an application (``/d%65code`` is ``/decode`` to
    Starlette's router); a proxy that guards the path (refusing ``/encode``, the oracle) reads
    it raw. The server routes by the raw target, as the h11 server did: 404, and closed."""
    async with serving(limits=fast()) as server:
        statuses, rest = await exchange(server, request(server, ENCODE_NOTHING, path=target))
    assert statuses == [404] and rest == b"", (target, statuses)


@pytest.mark.parametrize("target", ["http://[evil/decode", "//[::1/decode"])
async def test_a_malformed_request_target_gets_400_not_an_internal_error(target: str):
    """``urlsplit`` raises ValueError for a bad IPv6 authority: that is the client's fault,
    answered as the server's own (500, "internal error (ValueError)")."""
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, path=target))
        await still_serves(server)
    assert answer.status == 400, (answer.status, answer.body)


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:{port}", 200),
        ("LOCALHOST:{port}", 200),
        ("[::1]:{port}", 200),
        ("127.0.0.1:{port}", 200),
        ("localhost", 403),  # the port is part of the name
        ("localhost:{port}.evil.example", 403),
        ("localhost.:{port}", 403),
        ("[0:0:0:0:0:0:0:1]:{port}", 403),
        ("[::ffff:127.0.0.1]:{port}", 403),
        ("::1:{port}", 403),
        ("127.1:{port}", 403),
        ("2130706433:{port}", 403),
        ("localhost:{port}@evil.example", 403),
        ("evil.example, localhost:{port}", 403),
        ("localhost:0{port}", 403),
    ],
)
async def test_only_the_servers_own_host_names_are_answered(host: str, status: int):
    async with serving(limits=fast()) as server:
        host = host.format(port=port_of(server))
        data = request(server).replace(
            f"Host: localhost:{port_of(server)}".encode(), b"Host: " + host.encode()
        )
        answer = await one_answer(server, data)
    assert answer.status == status, (host, answer)


async def test_a_host_header_with_a_second_port_is_refused():
    """``_host_allowed`` strips the last ``:digits`` and looks the rest up: ``localhost:P:1``
    becomes ``localhost:P`` and is answered. No browser sends it (so no rebinding through it),
    but it is not a Host (RFC 9110: uri-host [":" port]) and a check that takes it reads
    names loosely; a proxy allowed by name alone (``--allowed-host codec.example``) matches
    ``codec.example:1:2`` too."""
    async with serving(limits=fast()) as server:
        port = port_of(server)
        data = request(server).replace(
            f"Host: localhost:{port}".encode(), f"Host: localhost:{port}:1".encode()
        )
        answer = await one_answer(server, data)
    assert answer.status in (400, 403), answer


@pytest.mark.parametrize(
    ("hosts", "status"),
    [
        ("Host: localhost:{port}\r\nHost: evil.example\r\n", 400),
        ("Host: evil.example\r\nHost: localhost:{port}\r\n", 400),
        ("", 400),  # HTTP/1.1 requires one
    ],
    ids=["allowed-first", "allowed-second", "none"],
)
async def test_two_host_headers_or_none_get_400(hosts: str, status: int):
    async with serving(limits=fast()) as server:
        port = port_of(server)
        data = request(server).replace(
            f"Host: localhost:{port}\r\n".encode(), hosts.format(port=port).encode()
        )
        statuses, rest = await exchange(server, data)
    assert statuses == [status] and rest == b""


async def test_an_http_1_0_request_without_a_host_is_refused():
    async with serving(limits=fast()) as server:
        data = request(server).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        data = data.replace(f"Host: localhost:{port_of(server)}\r\n".encode(), b"")
        statuses, _ = await exchange(server, data)
    assert statuses == [403]


@pytest.mark.parametrize(
    ("namespaces", "status"),
    [
        ("X-Namespace: default\r\nX-Namespace: default\r\n", 400),
        ("X-Namespace: other\r\nX-Namespace: default\r\n", 400),
        ("X-Namespace: default, other\r\n", 403),
        ("X-Namespace: DEFAULT\r\n", 403),
        ("X-Namespace: default\x7f\r\n", 403),
        ("x-NAMESPACE: default\r\n", 200),  # names are case-insensitive
        ("X-Namespace:   default  \r\n", 200),  # whitespace around a value is not part of it
        ("X-Namespace:\r\n", 400),
        ("X-Namespace_: default\r\n", 400),
        ("", 400),
    ],
)
async def test_x_namespace_names_exactly_one_served_namespace(namespaces: str, status: int):
    async with serving(limits=fast()) as server:
        data = request(server).replace(b"X-Namespace: default\r\n", namespaces.encode("latin-1"))
        answer = await one_answer(server, data)
    assert answer.status == status, (namespaces, answer)


# --- CORS ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "null",
        "http://localhost:8233.evil.example",
        "http://localhost:82330",
        "https://localhost:8233",
        "HTTP://LOCALHOST:8233",
        "http://localhost",
        "http://127.0.0.1:8233",  # not given to this server
        f"{UI}, http://evil.example",
    ],
)
async def test_a_preflight_from_an_origin_not_allowed_gets_403_and_no_cors_headers(origin: str):
    async with serving_ui(limits=fast()) as server:
        data = (
            f"OPTIONS /decode HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\nOrigin: {origin}\r\n"
            "Access-Control-Request-Method: POST\r\n"
            "Access-Control-Request-Headers: x-namespace, content-type\r\n\r\n"
        ).encode()
        answer = await one_answer(server, data)
        post = await one_answer(server, request(server, extra=f"Origin: {origin}\r\n"))
    assert answer.status == 403, answer
    assert not any(k.startswith("access-control-") for k in answer.headers), answer.headers
    assert not any(k.startswith("access-control-") for k in post.headers), post.headers


async def test_two_origin_headers_get_no_cors_headers():
    async with serving_ui(limits=fast()) as server:
        answer = await one_answer(
            server, request(server, extra=f"Origin: {UI}\r\nOrigin: http://evil.example\r\n")
        )
    assert not any(k.startswith("access-control-") for k in answer.headers), answer.headers


async def test_a_preflight_from_the_ui_is_allowed():
    async with serving_ui(limits=fast()) as server:
        data = (
            f"OPTIONS /decode HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\nOrigin: {UI}\r\n"
            "Access-Control-Request-Method: POST\r\n\r\n"
        ).encode()
        answer = await one_answer(server, data)
    assert answer.status == 204 and answer.headers["access-control-allow-origin"] == UI


# --- methods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "TRACE", "FOO", "post"])
async def test_methods_other_than_post_and_options_get_405(method: str):
    async with serving(limits=fast()) as server:
        statuses, rest = await exchange(server, request(server, method=method))
        await still_serves(server)
    assert statuses == [405] and rest == b""


async def test_a_head_request_gets_405_without_the_connection_failing(
    caplog: pytest.LogCaptureFixture,
):
    """A HEAD's answer has no body, but ``_send`` sends the 405's text through h11, which
    raises LocalProtocolError ("Too much data for declared Content-Length"): it escapes
    ``_exchange`` (outside its try), fails the connection's task, and is logged as a failure.
    The client gets the head, then a close."""
    caplog.set_level(logging.DEBUG, logger="temporal_agent_interrupts.codec_server")
    async with serving(limits=fast()) as server:
        data = request(server, b"", method="HEAD", length=False)
        raw = await Raw.connect(server)
        await raw.send(data)
        received = await raw.until_eof()
        raw.close()
        await still_serves(server)
    assert received.startswith(b"HTTP/1.1 405 ")
    failures = [
        r
        for r in caplog.records
        # The h11 server's record of a failed connection; on uvicorn's protocol, asyncio's.
        if r.getMessage() == "codec server connection failed" or r.levelno >= logging.ERROR
    ]
    assert not failures, failures[0].exc_info


# --- stopping -----------------------------------------------------------------------------------


# Every deadline three times the hang guards (20 s): a stop() that waits for any of them fails
# its guard. Not longer: the server's thread, still waiting, holds up the test's exit.
NEVER = 60.0
NO_DEADLINES = {
    f"{name}_seconds": NEVER for name in ("request", "idle", "response", "admission", "linger")
}


async def test_stop_does_not_wait_for_requests_in_flight(monkeypatch: pytest.MonkeyPatch):
    """Four connections: one decode held in its thread (a gate the test opens only after
    ``stop()``), one waiting for a thread, one mid-body and one mid-head, with every deadline
    a minute long (``NEVER``). Asserted: ``stop()`` returns while the decode is still held in
    its thread, and every connection is closed. No time is measured: a ``stop()`` that waits
    for the decode waits for a gate opened only after it returns, and one that waits for a
    deadline or a linger waits a minute; either way the hang guard (20 s) fails the test."""
    gate = Gate()
    limits = Limits(
        max_bytes_in_flight=2 * MIB,
        max_request_bytes=MIB,
        max_concurrent_requests=1,
        **NO_DEADLINES,  # type: ignore[arg-type]
    )
    server = await CodecServer(KEYS, port=0, limits=limits).start()
    monkeypatch.setattr(server._codec, "decrypt", gate)
    clients = [await Raw.connect(server) for _ in range(4)]
    await clients[0].send(request(server, sealed(plain(b'"in a thread"'))))
    await eventually(lambda: gate.inside == 1, what="one in a thread")
    await clients[1].send(request(server, sealed(plain(b'"waits for a thread"'))))
    await clients[2].send(head(server, length=MIB), b" " * 1000)  # mid-body
    await clients[3].send(b"POST /decode HTTP/1.1\r\n")  # mid-head
    await eventually(
        lambda: server.load.waiting_to_process == 1 and server.load.connections == 4,
        what=f"all four held, not {server.load}",
    )
    await asyncio.wait_for(server.stop(), 20)  # a hang guard
    still_held = gate.inside
    closed = 0
    for client in clients:
        with contextlib.suppress(ConnectionResetError):  # a reset is a close too
            await client.until_eof(timeout=20)  # a hang guard: TimeoutError fails the test
        closed += 1
        client.close()
    gate.opened.set()
    assert still_held == 1, "stop() returned only once the decode in its thread had finished"
    assert closed == 4
    assert server.load.connections == 0


async def test_stop_with_a_request_waiting_for_room_is_prompt():
    """It takes LINGER_SECONDS (2): the byte budget's race again. ``stop()`` cancels every
    connection in the set's order; a holder that runs before the waiter releases its bytes,
    pops the waiter's cancelled entry, and gets InvalidStateError, which ``_Connection.serve``
    does not take for the cancellation it is: it lingers on its way out. Eight holders and one
    waiter, three times over: a holder comes first in all but one order in 729.

    Asserted without timing it: with every deadline (the linger too) a minute long
    (``NEVER``), ``stop()`` returns, each time. One that lingers waits a minute, and the hang
    guard (20 s) fails it."""
    limits = Limits(
        max_bytes_in_flight=2 * MIB,
        max_request_bytes=256 * 1024,
        **NO_DEADLINES,  # type: ignore[arg-type]
    )
    for _ in range(3):
        server = await CodecServer(KEYS, port=0, limits=limits).start()
        clients = [await Raw.connect(server) for _ in range(9)]
        for client in clients:  # eight fill the budget; the ninth waits for room
            await client.send(head(server, length=256 * 1024))
        await eventually(lambda s=server: s.load.waiting_for_bytes == 1, what="one waits")
        await asyncio.wait_for(server.stop(), 20)  # a hang guard
        for client in clients:
            client.close()
        assert server.load.connections == 0


CHILD = textwrap.dedent(
    """
    import asyncio, socket, sys, threading
    from urllib.parse import urlsplit
    from temporal_agent_interrupts.codec import PayloadKeys, generate_key
    from temporal_agent_interrupts.codec_server import CodecServer

    async def main():
        server = await CodecServer(PayloadKeys.parse(generate_key("k1")), port=0).start()
        port = urlsplit(server.url).port
        # A decode that never ends in its thread (a slow key store, say; a body of empty
        # payloads took minutes before the payload limit).
        server._codec.decrypt = lambda payload: (threading.Event().wait(), payload)[1]
        body = b'{"payloads":[{}]}'
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            f"POST /decode HTTP/1.1\\r\\nHost: localhost:{port}\\r\\nX-Namespace: default\\r\\n"
            f"Content-Length: {len(body)}\\r\\n\\r\\n".encode() + body
        )
        while server.load.processing == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        await server.stop()
        print("stopped", flush=True)

    asyncio.run(main())
    """
)


def test_the_process_exits_promptly_once_the_server_has_stopped():
    """``stop()`` does not wait for a decode under way, but the interpreter does: the pool's
    threads are joined at exit. ``make run``'s worker (and ``agent-codec-server``
    after SIGTERM) then hangs on its way out for as long as the request takes. Here one that
    never ends. Asserted: the process exits, by itself and cleanly, with the decode still
    under way. No time is measured: a process that waits for the decode never exits, and the
    hang guard (20 s) fails the test."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "stopped\n"
        exited: int | None = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            exited = child.wait(timeout=20)  # a hang guard
    finally:
        child.kill()
        child.wait()
    assert exited == 0, (
        "the process did not exit once the server had stopped: it waits for the decode"
        if exited is None
        else f"the process exited with {exited}"
    )


async def test_the_codec_flood_benchmark_still_runs():
    """``bench/codec_flood.py`` holds the time half of the empty-payload and loop-stall tests
    above, as ratios: it still runs, and answers as the tests say (a smoke test of its results,
    never of its timings)."""
    from bench.codec_flood import measure

    out = await measure(1)
    assert out["statuses"] == {
        "one_payload_12KiB": 200,
        "one_payload_128KiB": 200,
        "empty_at_limit_decode_12KiB": 200,
        "empty_at_limit_encode_12KiB": 200,
        "empty_over_limit_128KiB": 400,
        "honest_alone": 200,
    }
    assert set(out["ratios"]) == {
        "empty_at_limit_decode_to_one_payload",
        "empty_at_limit_encode_to_one_payload",
        "empty_over_limit_to_one_payload",
        "honest_during_flood_to_alone",
    }

"""A second security review of the codec server: attacks on what the first review's fixes added
(the per-connection body allowance, ``_Pool``, ``_json_values``, the strict Host, chunked
sending, the cut-off reset, HEAD), each over real loopback sockets.

As in ``tests/test_codec_server_attacks.py``: a test that fails is an attack that worked; it
asserts the safe behaviour. The passing ones are attacks the server resisted, kept for coverage.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import threading

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from temporal_agent_interrupts.codec_server import (
    CONNECTION_BODY_BYTES,
    MAX_PAYLOADS,
    SEND_CHUNK_BYTES,
    CodecServer,
)
from temporal_agent_interrupts.http_server import Pool as _Pool
from tests.test_codec_server import (
    CODEC,
    KEYS,
    MIB,
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
from tests.test_codec_server_attacks import UI, fast, head, one_answer, serving_ui, still_serves

FAILED = "codec server connection failed"


async def exchange(server: CodecServer, data: bytes) -> tuple[list[Response], bytes]:
    """Send ``data`` on a new connection; the answers until the server closes, and any bytes
    after the last whole one."""
    raw = await Raw.connect(server)
    try:
        await raw.send(data)
        return responses(await raw.until_eof(timeout=10))
    finally:
        raw.close()


def with_host(server: CodecServer, data: bytes, host: bytes) -> bytes:
    return data.replace(f"Host: localhost:{port_of(server)}".encode(), b"Host: " + host)


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The h11 server's own record of a failed connection, or any error (on uvicorn's
    protocol, a connection that fails is asyncio's "Fatal error: protocol.data_received() call
    failed")."""
    return [r for r in caplog.records if r.getMessage() == FAILED or r.levelno >= logging.ERROR]


async def read_all(raw: Raw, length: int, *, timeout: float = 20) -> bytes:
    """Exactly ``length`` more bytes (in addition to what ``raw`` already holds)."""
    buffer = bytearray(raw.received)
    async with asyncio.timeout(timeout):
        while len(buffer) < length:
            chunk = await raw.loop.sock_recv(raw.sock, 1 << 20)
            assert chunk, f"closed after {len(buffer)} of {length} bytes"
            buffer += chunk
    raw.received = bytes(buffer[length:])
    return bytes(buffer[:length])


async def whole_answer(raw: Raw, timeout: float = 20) -> tuple[bytes, bytes]:
    """The next answer's head and body, however many segments it comes in."""
    buffer = bytearray(raw.received)
    async with asyncio.timeout(timeout):
        while b"\r\n\r\n" not in buffer:
            chunk = await raw.loop.sock_recv(raw.sock, 65536)
            assert chunk, "closed before an answer"
            buffer += chunk
    top, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", top)
    assert found, top
    raw.received = rest
    return top, await read_all(raw, int(found[1]), timeout=timeout)


# --- latin-1 whitespace: what str.strip() takes and h11 lets through --------------------------


@pytest.mark.parametrize("space", ["\xa0", "\x85"], ids=["nbsp", "nel"])
@pytest.mark.parametrize("kind", ["preflight", "post"])
async def test_an_allowed_origin_with_trailing_latin1_whitespace_is_answered_not_dropped(
    caplog: pytest.LogCaptureFixture, kind: str, space: str
):
    """h11 admits obs-text (0x80-0xff) in a field value; ``_origin`` strips it with
    ``str.strip()`` (NBSP and NEL are whitespace to Python), finds the UI's origin, and
    reflects the raw value in ``Access-Control-Allow-Origin``. h11 encodes header values as
    ASCII: UnicodeEncodeError in ``_send``, outside ``_exchange``'s try, so the connection's
    task fails and the client gets no answer at all (nor does anything pipelined behind it)."""
    caplog.set_level(logging.DEBUG, logger="temporal_agent_interrupts.codec_server")
    async with serving_ui(limits=fast()) as server:
        origin = f"Origin: {UI}{space}\r\n"
        if kind == "preflight":
            data = (
                f"OPTIONS /decode HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\n{origin}"
                "Access-Control-Request-Method: POST\r\n\r\n"
            ).encode("latin-1")
        else:
            data = request(server, extra=origin).decode().encode("latin-1")
        answered, _ = await exchange(server, data)
        await still_serves(server)
    assert len(answered) == 1, f"no answer to a {kind} with Origin {UI!r} + {space!r}"
    assert answered[0].headers.get("access-control-allow-origin") in (None, UI), answered[0]
    assert not failures(caplog), failures(caplog)[0].exc_info


@pytest.mark.parametrize("space", [b"\xa0", b"\x85"], ids=["nbsp", "nel"])
@pytest.mark.parametrize("where", ["after", "before"])
async def test_a_host_padded_with_latin1_whitespace_is_not_one_of_its_names(
    space: bytes, where: str
):
    """``_host_allowed`` strips the Host with ``str.strip()`` before its "uri-host [:port],
    nothing looser" regex: ``localhost:PORT\\xa0`` is answered as ``localhost:PORT``. No
    browser sends it, but it is no RFC 9110 Host, and a proxy in front that routes or checks
    by the exact value (``localhost:PORT\\xa0`` is not its name) passes it through."""
    async with serving(limits=fast()) as server:
        own = f"localhost:{port_of(server)}".encode()
        host = own + space if where == "after" else space + own
        answer = await one_answer(server, with_host(server, request(server), host))
    assert answer.status in (400, 403), (host, answer)


@pytest.mark.parametrize(
    "host",
    [
        "localhost:{port}",
        "LocalHost:{port}",
        "[::1]:{port}",
        "127.0.0.1:{port}",
        " localhost:{port}",
    ],
)
async def test_honest_host_spellings_are_answered(host: str):
    async with serving(limits=fast()) as server:
        value = host.format(port=port_of(server)).encode()
        answer = await one_answer(server, with_host(server, request(server), value))
    assert answer.status == 200, (host, answer)


@pytest.mark.parametrize(
    "host",
    [
        "[::1%25lo]:{port}",  # a zone: browsers never send one in a Host
        "[::1]x:{port}",
        "[::1]:{port}:",
        "localhost:{port}#",
        "localhost:{port}/",
        "localhost:{port}\\",
        "localhost:{port}?",
        "localhost%3a{port}",
        "local%68ost:{port}",
        "[::1]",
        ":{port}",
        "",
    ],
)
async def test_hosts_that_are_not_its_names_are_refused(host: str):
    async with serving(limits=fast()) as server:
        value = host.format(port=port_of(server)).encode()
        answer = await one_answer(server, with_host(server, request(server), value))
    assert answer.status in (400, 403), (host, answer)


async def test_a_proxy_name_allowed_without_a_port_matches_only_that_name():
    async with CodecServer(KEYS, port=0, allowed_hosts=["Codec.Example"], limits=fast()) as server:
        statuses = {}
        for host in (
            b"codec.example",
            b"CODEC.EXAMPLE:443",
            b"codec.example:",
            b"codec.example.:443",
            b"x.codec.example",
            b"codec.example:443:1",
            b"codec.example@evil.example",
        ):
            statuses[host] = (
                await one_answer(server, with_host(server, request(server), host))
            ).status
    assert statuses == {
        b"codec.example": 200,
        b"CODEC.EXAMPLE:443": 200,
        b"codec.example:": 200,
        b"codec.example.:443": 403,
        b"x.codec.example": 403,
        b"codec.example:443:1": 403,
        b"codec.example@evil.example": 403,
    }


# --- the per-connection body allowance -----------------------------------------------------------


async def test_small_bodies_pipelined_on_every_slot_while_the_budget_is_held_are_all_served():
    """Two connections claim the whole shared budget and send nothing; every other slot
    pipelines small decodes (within the connection allowance): all are answered, in order."""
    limits = fast(
        max_bytes_in_flight=2 * MIB,
        max_request_bytes=MIB,
        admission_seconds=0.5,
        max_connections=16,
    )
    async with serving(limits=limits) as server:
        holders = [await Raw.connect(server) for _ in range(2)]
        for holder in holders:
            await holder.send(head(server, length=MIB))
        await eventually(lambda: server.load.bytes_in_flight == 2 * MIB, what="budget held")
        clients = [await Raw.connect(server) for _ in range(14)]
        for n, client in enumerate(clients):
            await client.send(
                *(request(server, sealed(plain(b'"%d-%d"' % (n, i)))) for i in range(5))
            )

        async def five(client: Raw) -> list[bytes]:
            got = []
            for _ in range(5):
                answer = await client.response(timeout=10)
                assert answer.status == 200, answer
                got.append(json_format.Parse(answer.body, Payloads()).payloads[0].data)
            return got

        got = await asyncio.gather(*(five(c) for c in clients))
        for raw in (*holders, *clients):
            raw.close()
    assert got == [[b'"%d-%d"' % (n, i) for i in range(5)] for n in range(14)]


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 503)])
async def test_the_allowance_ends_exactly_at_its_size(extra: int, status: int):
    """A body of exactly CONNECTION_BODY_BYTES is the connection's own (served while the
    budget is held); one byte more is the budget's (503 after the admission time)."""
    limits = fast(max_bytes_in_flight=2 * MIB, max_request_bytes=MIB, admission_seconds=0.3)
    async with serving(limits=limits) as server:
        holders = [await Raw.connect(server) for _ in range(2)]
        for holder in holders:
            await holder.send(head(server, length=MIB))
        await eventually(lambda: server.load.bytes_in_flight == 2 * MIB, what="budget held")
        body = sealed(plain(b""))
        body = body[:-2] + b" " * (CONNECTION_BODY_BYTES + extra - len(body)) + body[-2:]
        assert len(body) == CONNECTION_BODY_BYTES + extra
        answer = await one_answer(server, request(server, body))
        for holder in holders:
            holder.close()
    assert answer.status == status, answer


# --- _json_values: honest bodies, and its count ----------------------------------------------


@pytest.mark.parametrize("keys", [2, 4, 8])
@pytest.mark.parametrize("indent", [None, 2])
async def test_honest_ui_bodies_with_several_metadata_keys_are_decoded(
    keys: int, indent: int | None
):
    """What the UI and the CLI send: a few payloads, with a few metadata keys (encoding,
    messageType, the key id...), compact or indented."""
    extra = {f"meta-{i}": b"value,with:{[marks]}" for i in range(keys - 1)}
    payloads = [Payload(metadata={"encoding": b"json/plain", **extra}, data=b'{"a":[1,2,{"b":3}]}')]
    body = json.dumps(
        json_format.MessageToDict(Payloads(payloads=[CODEC.encrypt(p) for p in payloads * 20])),
        indent=indent,
    ).encode()
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, body))
    assert answer.status == 200, answer
    assert list(json_format.Parse(answer.body, Payloads()).payloads) == payloads * 20


async def test_the_payload_limit_of_honest_encrypted_payloads_is_decoded():
    payloads = [plain(b'"%d"' % i) for i in range(MAX_PAYLOADS)]
    # Sealed before the connection opens: sealing 4,096 payloads on a busy machine took longer
    # than the idle time (0.3 s) the server gives a connection to start its request.
    body = sealed(*payloads)
    async with serving(limits=fast()) as server:
        message = request(server, body)
        raw = await Raw.connect(server)
        await raw.send(message)
        _, body = await whole_answer(raw)
        raw.close()
    assert list(json_format.Parse(body, Payloads()).payloads) == payloads


@pytest.mark.parametrize(
    "body",
    [
        # A value not behind a mark: JSON has none but the first.
        b'{"payloads":[' + b",".join([b"{}"] * MAX_PAYLOADS) + b",{}]}",
        b'{"payloads":[{"externalPayloads":[' + b",".join([b"{}"] * 40_000) + b"]}]}",
        b'{"payloads":[{"metadata":{' + b",".join(b'"%x":""' % i for i in range(40_000)) + b"}}]}",
    ],
    ids=["one-payload-too-many", "external-payloads", "metadata-keys"],
)
async def test_more_json_values_than_the_limit_allows_get_400(body: bytes):
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, body))
        await still_serves(server)
    assert answer.status == 400, answer


# --- chunked sending: answers byte for byte ------------------------------------------------------


@pytest.mark.parametrize(
    "sizes",
    [
        [SEND_CHUNK_BYTES * 3 // 4 - 1],  # base64 one byte under a chunk
        [SEND_CHUNK_BYTES * 3 // 4],  # exactly a chunk
        [SEND_CHUNK_BYTES * 3 // 4 + 1],
        [100] * 3000,  # many small pieces, joined into several chunks
        [SEND_CHUNK_BYTES, 1, SEND_CHUNK_BYTES // 2, 0, 3 * SEND_CHUNK_BYTES],
    ],
    ids=["under", "exact", "over", "many-small", "mixed"],
)
@pytest.mark.parametrize("route", ["/decode", "/encode"])
async def test_a_chunked_answer_is_exactly_its_json_and_its_length(sizes: list[int], route: str):
    payloads = [plain(bytes([65 + i % 26]) * size) for i, size in enumerate(sizes)]
    if route == "/decode":
        body = sealed(*payloads)
    else:
        body = json_format.MessageToJson(Payloads(payloads=payloads), indent=None).encode()
    async with serving(limits=fast()) as server:
        raw = await Raw.connect(server)
        # Two on one connection: the second is framed by the first's Content-Length.
        await raw.send(request(server, body, path=route), request(server, body, path=route))
        answers = [await whole_answer(raw) for _ in range(2)]
        raw.close()
    for top, answer in answers:
        assert top.startswith(b"HTTP/1.1 200 "), top
        got = list(json_format.Parse(answer, Payloads()).payloads)
        if route == "/encode":
            got = [CODEC.decrypt(p) for p in got]
        assert got == payloads
        if route == "/decode":  # the proto3 JSON, "data" given even when empty
            expected = [
                {**json_format.MessageToDict(p), "data": base64.b64encode(p.data).decode()}
                for p in payloads
            ]
            assert json.loads(answer) == {"payloads": expected}
    assert raw.received == b"", "bytes beyond the answers' Content-Lengths"


@pytest.mark.parametrize("path", ["/decode", "/encode", "/nowhere"])
async def test_a_head_gets_a_head_only_and_nothing_pipelined_behind_it_is_served(path: str):
    async with serving(limits=fast()) as server:
        data = request(server, b"", method="HEAD", path=path, length=False)
        raw = await Raw.connect(server)
        await raw.send(data + request(server, path="/encode"))
        received = await raw.until_eof(timeout=10)
        raw.close()
        await still_serves(server)
    top, _, after = received.partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 405 "), received
    assert after == b"", f"a body or a second answer after a HEAD's: {after[:200]!r}"


# --- the cut-off reset, only when intended -------------------------------------------------------


async def test_a_client_that_pauses_but_reads_its_answer_in_time_gets_all_of_it_and_a_fin():
    """The reset is for a client that does not take its answer within RESPONSE_SECONDS; one
    that pauses but reads it in time gets every byte, then an orderly close."""
    data = b"y" * 3 * MIB
    async with serving(limits=fast(response_seconds=2.0)) as server:
        raw = await Raw.connect(server, receive_buffer=65536)
        await raw.send(request(server, sealed(plain(data)), extra="Connection: close\r\n"))
        await asyncio.sleep(0.8)  # the answer waits, part of it queued in the kernel
        _, body = await whole_answer(raw)
        rest = await raw.until_eof(timeout=5)  # a reset would raise ConnectionResetError
        raw.close()
    assert json_format.Parse(body, Payloads()).payloads[0].data == data
    assert rest == b""


async def test_a_100_continue_does_not_start_the_answers_deadline():
    """uvicorn writes ``100 Continue`` through the transport as any answer: the response
    deadline starts at the answer's first byte, not there. A body sent over longer than the
    response deadline (but within the request's) is answered whole."""
    async with serving(limits=fast(response_seconds=0.5, request_seconds=5.0)) as server:
        body = sealed(plain(b'"after a pause"'))
        raw = await Raw.connect(server)
        head = request(server, body, extra="Expect: 100-continue\r\n")[: -len(body)]
        await raw.send(head)
        assert (await raw.response()).status == 100
        for piece in (body[: len(body) // 2], body[len(body) // 2 :]):
            await asyncio.sleep(0.6)  # past the response deadline, twice over in all
            await raw.send(piece)
        answer = await raw.response()
        raw.close()
    assert answer.status == 200, answer


async def test_an_answer_not_taken_in_time_is_cut_off_and_the_slot_freed_for_the_next():
    """One slot, held by a client that never reads its 4 MiB decode's answer: only the
    response deadline (0.5 s here) can free it. Asserted: the next client, waiting in the
    kernel's backlog, is answered; the slow one is reset (the cut-off's abortive close, not an
    orderly one) holding less than its answer. No time is measured: a server that never cuts
    off, or not at the deadline configured (the default is 30 s), never answers the next
    within the hang guard (20 s, ``one_answer``), and an orderly close fails ``reset``."""
    async with serving(limits=fast(response_seconds=0.5, max_connections=1)) as server:
        slow = await Raw.connect(server, receive_buffer=4096)
        answer_size = len(base64.b64encode(b"z" * 4 * MIB))  # its answer's data alone
        await slow.send(request(server, sealed(plain(b"z" * 4 * MIB))))
        await eventually(lambda: server.load.connections == 1, what="the slow client served")
        answer = await one_answer(server, request(server, sealed(plain(b'"next"'))))
        reset = False
        got = 0
        try:
            async with asyncio.timeout(20):  # a hang guard
                while chunk := await slow.loop.sock_recv(slow.sock, 65536):
                    got += len(chunk)
        except ConnectionResetError:
            reset = True
        slow.close()
    assert answer.status == 200, answer
    assert reset, "the client cut off got an orderly close, not a reset"
    assert got < answer_size, f"the slow client got {got} bytes: its whole answer"


@pytest.mark.parametrize("close", ["after-the-answer", "after-idle"])
async def test_a_client_that_never_reads_gets_nothing_once_the_server_lets_go(close: str):
    """The reset only covers a client whose answer did not fit the kernel's send buffer. An
    answer that fits (about 1 MiB on loopback: tcp_wmem autotunes the buffer up to 4 MiB) is
    handed to the kernel whole, so no response deadline ever fires; the connection then closes
    gracefully (after its answer, or after IDLE_SECONDS), and the kernel feeds the whole answer
    from an orphaned socket to a client that never read a byte, for as long as it keeps its
    window shut: memory no limit counts, that leaves the connection slot free for the next
    such client. Every 12 KiB encode of 4096 empty payloads is answered with 530 KiB. Safe:
    what the client has not taken by the answer's deadline is dropped, as for a cut-off (e.g.
    before closing, wait while SIOCOUTQ shows bytes queued, up to RESPONSE_SECONDS from the
    answer's start, then reset if any remain: an honest slow reader still gets its answer)."""
    extra = "Connection: close\r\n" if close == "after-the-answer" else ""
    async with serving(limits=fast(response_seconds=1.0)) as server:
        raw = await Raw.connect(server, receive_buffer=4096)
        await raw.send(request(server, sealed(plain(b"q" * MIB)), extra=extra))
        # The kernel takes the whole request before the server need have accepted the
        # connection: none counted yet is not "let go". It holds it at least until the answer's
        # deadline (a second), as the client reads nothing.
        await eventually(lambda: server.load.connections == 1, what="the server took it")
        await eventually(lambda: server.load.connections == 0, what="the server let go", timeout=5)
        await asyncio.sleep(0.3)
        after = 0
        with contextlib.suppress(OSError):
            async with asyncio.timeout(5):
                while chunk := await raw.loop.sock_recv(raw.sock, 65536):
                    after += len(chunk)
        raw.close()
    assert after < 256 * 1024, f"{after / MIB:.1f} MiB still came after the server let go"


# --- errors: the client's faults are 4xx, the server's own 500, no connection fails ------------


async def test_a_transform_that_fails_is_a_500_and_its_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG, logger="temporal_agent_interrupts.codec_server")

    def broken(payload: Payload) -> Payload:
        raise RuntimeError("a fault of the server's own")

    async with serving(limits=fast(max_concurrent_requests=1)) as server:
        monkeypatch.setattr(server._codec, "decrypt", broken)
        statuses = []
        for _ in range(3):  # one thread: it must survive each fault
            statuses.append((await one_answer(server, request(server, sealed(plain(b"1"))))).status)
        monkeypatch.undo()
        await still_serves(server)
    assert statuses == [500, 500, 500]
    assert not failures(caplog)


@pytest.mark.parametrize(
    "body",
    [
        b'{"payloads":[{"metadata":{"\\ud800":"QQ=="}}]}',
        b'{"payloads":[{"data":"QQ==\\udfff"}]}',
        b'{"payloads":[{"metadata":{"encoding":"YmluYXJ5L2VuY3J5cHRlZA==",'
        b'"encryption-key-id":"/w=="},"data":"' + b"A" * 64 + b'"}]}',
        b'{"payloads":[{"metadata":{"encoding":"YmluYXJ5L2VuY3J5cHRlZA=="},"data":""}]}',
        b'{"payloads":[{"externalPayloads":[{"sizeBytes":"1e999"}]}]}',
        b'{"payloads":[{"externalPayloads":[{"sizeBytes":1e400}]}]}',
        b'{"payloads":[{"externalPayloads":[{"sizeBytes":-1}]}]}',
        b'{"payloads":[{"externalPayloads":[{"sizeBytes":99999999999999999999999}]}]}',
        b'{"payloads":[{"data":"QQ==","data":"QQ=="}]}',
        b'{"payloads":[],"payloads":[]}',
        b"\xef\xbb\xbf{}",
        b'{"payloads":[{"data":"' + "é".encode() * 10 + b'"}]}',
        b"\xff",
        b"{" * 20_000,
    ],
)
@pytest.mark.parametrize("route", ["/decode", "/encode"])
async def test_odd_bodies_are_a_client_fault_not_a_server_fault(
    caplog: pytest.LogCaptureFixture, body: bytes, route: str
):
    caplog.set_level(logging.DEBUG, logger="temporal_agent_interrupts.codec_server")
    async with serving(limits=fast()) as server:
        answer = await one_answer(server, request(server, body, path=route))
    assert answer.status in (200, 400, 422), answer
    assert not failures(caplog)


# --- _Pool ---------------------------------------------------------------------------------------


def test_the_pool_runs_every_job_and_hands_back_every_exception():
    pool = _Pool(2, name="review-pool")
    try:
        futures = [pool.submit(lambda n=n: 1 / (n % 3)) for n in range(30)]
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=5))
            except ZeroDivisionError:
                outcomes.append("ZeroDivisionError")
    finally:
        pool.shutdown(wait=True)
    assert outcomes == ["ZeroDivisionError" if n % 3 == 0 else 1 / (n % 3) for n in range(30)]


def test_the_pool_shut_down_cancels_what_waits_and_lets_what_runs_finish():
    pool = _Pool(1, name="review-pool")
    running = threading.Event()
    release = threading.Event()

    def hold() -> str:
        running.set()
        release.wait(5)
        return "done"

    first = pool.submit(hold)
    assert running.wait(5)
    queued = [pool.submit(lambda: "never") for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert first.result(timeout=5) == "done"
    assert all(f.cancelled() for f in queued)
    for thread in [t for t in threading.enumerate() if t.name.startswith("review-pool")]:
        thread.join(timeout=20)  # a hang guard
        assert not thread.is_alive(), "a pool thread outlived its shutdown"


def test_a_job_submitted_to_a_pool_shut_down_is_refused_not_left_pending():
    """``concurrent.futures.Executor``'s contract (and ``ThreadPoolExecutor``'s behaviour):
    ``submit`` after ``shutdown`` raises RuntimeError. ``_Pool`` queues it behind the threads'
    stop markers, where no thread will ever take it: its future never completes, and whoever
    awaits it (``run_in_executor``) waits for ever, holding the request's body. Latent:
    ``_Server.serve`` shuts the pool down only after every connection has ended."""
    pool = _Pool(1, name="review-pool")
    pool.shutdown(wait=True)
    try:
        future = pool.submit(lambda: "late")
    except RuntimeError:
        return
    with contextlib.suppress(TimeoutError):
        future.result(timeout=0.5)
    assert future.done(), "a job submitted after shutdown is pending for ever"


async def test_stop_leaves_no_pool_threads_once_their_work_is_done(
    monkeypatch: pytest.MonkeyPatch,
):
    release = threading.Event()

    def slow(payload: Payload) -> Payload:
        release.wait(5)
        return CODEC.decrypt(payload)

    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("codec-server-work")]

    before = len(workers())
    server = await CodecServer(KEYS, port=0, limits=fast()).start()
    monkeypatch.setattr(server._codec, "decrypt", slow)
    raw = await Raw.connect(server)
    await raw.send(request(server, sealed(plain(b'"held"'))))
    await eventually(lambda: server.load.processing == 1, what="one in a thread")
    await asyncio.wait_for(server.stop(), 3)
    release.set()
    raw.close()
    await eventually(lambda: len(workers()) == before, what="the pool's threads gone", timeout=5)

"""The shared HTTP stack (temporal_agent_interrupts/http_server.py: uvicorn's h11 protocol under
``ConnectionLimits``) attacked over raw loopback sockets, for what moving onto uvicorn opened
that the hand-written h11 server did not. A test that fails is an attack that worked; each
asserts the safe behaviour.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from temporal_agent_interrupts.codec_server import CodecServer, Limits
from tests.test_codec_server import (
    KEYS,
    Gate,
    Raw,
    eventually,
    plain,
    port_of,
    request,
    responses,
    sealed,
)


def fast(**more: int) -> Limits:
    """The server's limits with its deadlines shrunk, so that a test waits seconds, not 30."""
    return Limits(
        idle_seconds=2.0, request_seconds=2.0, response_seconds=2.0, linger_seconds=0.5, **more
    )


def websocket_upgrade(server: CodecServer, path: str = "/decode") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: localhost:{port_of(server)}\r\nX-Namespace: default\r\n"
        "Connection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


async def test_websocket_upgrades_hold_no_connection_slot_and_log_no_error(
    caplog: pytest.LogCaptureFixture,
):
    """uvicorn hands a ``Upgrade: websocket`` request to its websocket protocol (``websockets``
    is installed: google-genai needs it), which replaces the limited protocol on the transport:
    its close was never counted, so each such request held a slot for ever (past
    ``max_connections`` of them, the server accepted nobody), escaped every deadline, and
    logged an ERROR (a 500). The upgrade is refused as any other: answered, closed, counted."""
    caplog.set_level(logging.DEBUG)
    async with CodecServer(KEYS, port=0, limits=fast(max_connections=2)) as server:
        for _ in range(3):
            raw = await Raw.connect(server)
            await raw.send(websocket_upgrade(server))
            found, _rest = responses(await raw.until_eof(timeout=10))
            raw.close()
            assert [r.status for r in found] and found[0].status != 101
            assert found[0].status < 500
        await eventually(lambda: server.load.connections == 0, what="every slot given back")
        raw = await Raw.connect(server)
        await raw.send(request(server, sealed(plain(b'"x"'))))
        assert (await raw.response(timeout=10)).status == 200
        raw.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def test_codec_app_mounted_on_a_websocket_server_refuses_a_handshake_quietly(
    caplog: pytest.LogCaptureFixture,
):
    """``codec_app`` mounted in a team's app served by plain uvicorn (whose websockets are on):
    its guard returned on a websocket scope without a word, which uvicorn answers 500 with an
    ERROR ("ASGI callable returned without completing handshake"), so anyone could fill the
    team's log, a line per request. The handshake is refused (403), nothing logged as an
    error."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from temporal_agent_interrupts import http_server
    from temporal_agent_interrupts.codec_server import codec_app

    caplog.set_level(logging.INFO)
    app = Starlette(routes=[Mount("/codec", app=codec_app(KEYS))])
    listener = http_server.bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, ws="websockets", log_config=None, lifespan="off"))
    serving_task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await eventually(lambda: server.started, what="uvicorn started")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /codec/decode HTTP/1.1\r\nHost: localhost:{port}\r\n"
            "Connection: Upgrade\r\nUpgrade: websocket\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        received = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert received.startswith(b"HTTP/1.1 403 "), received[:100]
    finally:
        server.should_exit = True
        await asyncio.gather(serving_task, return_exceptions=True)
        listener.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.parametrize("pipelined", [2, 3])
async def test_pipelined_requests_then_a_half_close_are_all_answered(
    monkeypatch: pytest.MonkeyPatch, pipelined: int
):
    """A client that pipelines whole requests and then shuts down its sending side (``nc -N``,
    a proxy passing a client's FIN) is still reading. The protocol closed after the first
    answer, dropping the requests behind it: every complete request gets an answer (the h11
    server's promise). A request cut short behind them gets 400."""
    gate = Gate()
    async with CodecServer(KEYS, port=0, limits=fast()) as server:
        monkeypatch.setattr(server._codec, "decrypt", gate)
        raw = await Raw.connect(server)
        await raw.send(*[request(server, sealed(plain(b'"%d"' % i))) for i in range(pipelined)])
        await raw.send(request(server, b'{"payloads": []}')[:-3])  # cut short
        await eventually(lambda: gate.inside == 1, what="the first request decoding")
        raw.sock.shutdown(socket.SHUT_WR)
        await asyncio.sleep(0.2)  # the end reaches the server while the first is decoding
        gate.opened.set()
        found, rest = responses(await raw.until_eof(timeout=10))
        raw.close()
        assert [r.status for r in found] == [200] * pipelined + [400], (found, rest)
        assert found[-1].body == b"the request was cut short\n"


async def test_blank_lines_after_a_request_and_a_half_close_are_no_request_cut_short():
    """Blank lines behind a body (some clients end a POST with CRLF), then the client's end:
    its one request answered, nothing else (h11 skips blank lines before a request)."""
    async with CodecServer(KEYS, port=0, limits=fast()) as server:
        raw = await Raw.connect(server)
        await raw.send(request(server, sealed(plain(b'"1"'))) + b"\r\n\r\n")
        raw.sock.shutdown(socket.SHUT_WR)
        found, rest = responses(await raw.until_eof(timeout=10))
        raw.close()
        assert [r.status for r in found] == [200], (found, rest)

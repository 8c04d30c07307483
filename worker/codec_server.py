"""``python -m worker.codec_server``: Temporal's remote codec protocol over HTTP.

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
  (a proxy's); others get 403. A web page cannot then reach it by DNS rebinding (a name of the
  attacker's that resolves to 127.0.0.1 sends that name as ``Host``);
- a request must name one of its namespaces in ``X-Namespace`` (the header the UI and the CLI
  send); others get 403;
- browsers get CORS headers only for the origins given with ``--cors-origin`` (the UI's:
  ``http://localhost:8233`` for the dev server, ``https://cloud.temporal.io`` for Temporal
  Cloud); the preflight allows ``content-type``, ``x-namespace`` and ``authorization``;
- it refuses to start without keys (there would be nothing to decode);
- every request gets an answer, however malformed (400, or 500 for a fault of its own), never
  a dropped connection.

It checks no ``Authorization`` header itself: put it behind a proxy that does (and terminates
TLS, which the Cloud UI requires) when it must be reachable beyond one machine, and name the
proxy with ``--allowed-host``.

It is the standard library's threaded HTTP server, not a web framework: google-genai sends every
model call through aiohttp whenever aiohttp is installed, so adding one to the worker's image
would quietly change how the worker talks to Gemini.

Exit codes: 0 after SIGTERM or Ctrl-C (or a printed ``--generate-key``); 2 for a bad setting (no
keys, unusable keys, a bad option); 1 when it cannot listen on its port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import NoReturn, Self
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from client.codec import (
    EncryptionCodec,
    PayloadKeyMissing,
    PayloadKeys,
    PayloadKeysError,
    generate_key,
    load_keys,
)

log = logging.getLogger("worker.codec_server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
DEV_UI_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")
"""The embedded dev server's UI, under both names a browser may use for it."""
ALLOWED_HEADERS = "content-type, x-namespace, authorization"
# Temporal's payload limit is 2 MiB, base64 adds a third and JSON some more; one request may
# carry several payloads (an event's input, say).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# A connection that sends nothing for this long is dropped (a slow client holds a thread).
IDLE_SECONDS = 30
_CONTENT_LENGTH = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() takes "²"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _origin(value: str) -> str:
    return value.strip().rstrip("/")


class _CodecHTTPServer(ThreadingHTTPServer):
    """The listening socket and what every request needs (set by :class:`CodecServer`)."""

    daemon_threads = True
    codec: EncryptionCodec
    namespaces: frozenset[str]
    origins: frozenset[str]
    hosts: frozenset[str]
    """Allowed ``Host`` values, lower-case: ``name:port`` must match exactly; a name given
    without a port matches it with any port or none."""


class _CodecHTTPServer6(_CodecHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    """``POST /encode``, ``POST /decode`` and their CORS preflights; nothing else."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS
    server_version = "agent-codec-server"
    sys_version = ""

    def _cors(self) -> dict[str, str]:
        origin = self.headers.get("Origin")
        if origin is None or _origin(origin) not in self._config.origins:
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            # The UI may send its access token ("pass access token"); it is never stored.
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, message: str) -> None:
        self._send(status, (message + "\n").encode(), "text/plain; charset=utf-8", self._cors())

    @property
    def _route(self) -> str:
        # The path alone: the UI calls POST /decode?preserveStorageRefs=true (UI 2.54), and a
        # query string names no other route.
        return urlsplit(self.path).path

    def _options(self) -> None:
        if self._route not in ("/encode", "/decode"):
            self._refuse(HTTPStatus.NOT_FOUND, "not found")
            return
        headers = self._cors()
        if not headers:
            self._refuse(HTTPStatus.FORBIDDEN, "origin not allowed")
            return
        self.send_response(HTTPStatus.NO_CONTENT)
        for name, value in {**headers, "Content-Length": "0"}.items():
            self.send_header(name, value)
        self.end_headers()

    @property
    def _config(self) -> _CodecHTTPServer:
        server = self.server
        assert isinstance(server, _CodecHTTPServer)
        return server

    def _host_allowed(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        if not host:
            return False
        allowed = self._config.hosts
        name = host.rpartition(":")[0] if re.search(r":[0-9]+$", host) else host
        return host in allowed or name in allowed

    def do_OPTIONS(self) -> None:
        self._answer(self._options)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _answer(self, handle: Callable[[], None]) -> None:
        """Every request gets an answer: a fault here is a 500 with a short message (its
        details go to the log at debug level), never a dropped connection."""
        try:
            if not self._host_allowed():
                self.close_connection = True  # its body, if any, is not read
                self._refuse(HTTPStatus.FORBIDDEN, "host not allowed")
                return
            handle()
        except Exception as e:  # any request, however malformed, is answered
            log.debug("%s %s failed", self.command, self._route, exc_info=True)
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client has gone
                self._refuse(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error ({type(e).__name__})"
                )

    def _post(self) -> None:
        codec = self._config.codec
        transforms: dict[str, Callable[[Payload], Payload]] = {
            "/encode": codec.encrypt,
            "/decode": codec.decrypt,
        }
        transform = transforms.get(self._route)
        if transform is None:
            self._refuse(HTTPStatus.NOT_FOUND, "not found: POST /encode or /decode")
            return
        length = (self.headers.get("Content-Length") or "").strip()
        if not length:
            self.close_connection = True  # a body, if any, is not read
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "a Content-Length is required")
            return
        if not _CONTENT_LENGTH.fullmatch(length):
            self.close_connection = True
            self._refuse(HTTPStatus.BAD_REQUEST, "the Content-Length is not a number of bytes")
            return
        size = int(length)
        if size > MAX_REQUEST_BYTES:
            self.close_connection = True  # the body is not read
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large")
            return
        body = self.rfile.read(size)
        namespace = self.headers.get("X-Namespace")
        if not namespace:
            self._refuse(HTTPStatus.BAD_REQUEST, "the X-Namespace header is required")
            return
        if namespace not in self._config.namespaces:
            self._refuse(HTTPStatus.FORBIDDEN, f"namespace {namespace!r} is not served here")
            return
        try:
            payloads = json_format.Parse(body, Payloads())
        except (json_format.ParseError, UnicodeDecodeError, ValueError):
            self._refuse(HTTPStatus.BAD_REQUEST, "the body is not the JSON of Payloads")
            return
        try:
            done = [transform(p) for p in payloads.payloads]
        except PayloadKeyMissing as e:
            # The message names the key id (or says the data is malformed), never a payload.
            self._refuse(HTTPStatus.UNPROCESSABLE_ENTITY, str(e))
            return
        log.debug("%s %d payloads for namespace %r", self._route[1:], len(done), namespace)
        answer = json_format.MessageToJson(Payloads(payloads=done), indent=None)
        self._send(HTTPStatus.OK, answer.encode(), "application/json", self._cors())

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class CodecServer:
    """The codec server (see the module docstring), in process: ``async with CodecServer(keys,
    ...) as server:``.

    It serves from threads of its own (the standard library's HTTP server: no web framework,
    whose presence would change how google-genai talks to Gemini), so it never waits on the
    event loop of the worker it may run beside. ``make run`` starts one next to the embedded dev
    server; tests start one on a free port (``port=0``). ``url`` is where it listens.

    Args:
        keys: The keys (at least one).
        namespaces: The namespaces it serves (``X-Namespace``).
        cors_origins: Browser origins allowed to call it (exact ``scheme://host[:port]``).
        host: The interface to listen on (loopback by default).
        port: The port; 0 picks a free one.
        allowed_hosts: ``Host`` header values it answers besides its own (loopback names and
            ``host``, with its port): a proxy's name, with or without a port.

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
    ) -> None:
        if not keys:
            raise PayloadKeysError(
                f"the codec server needs keys: set {keys.source} (id:base64key[,...])"
            )
        self._codec = EncryptionCodec(keys)
        self._namespaces = frozenset(namespaces)
        self._origins = frozenset(_origin(o) for o in cors_origins)
        self._host = host
        self._port = port
        self._allowed_hosts = tuple(h.strip().lower() for h in allowed_hosts if h.strip())
        self._server: _CodecHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    async def start(self) -> Self:
        """Listen, and serve from a thread.

        Raises:
            OSError: the port cannot be had (in use, or not allowed).
        """
        kind = _CodecHTTPServer6 if ":" in self._host else _CodecHTTPServer
        server = kind((self._host, self._port), _Handler)
        port = server.server_address[1]  # the real one, for a port of 0
        own = f"[{self._host}]" if ":" in self._host else self._host
        server.codec, server.namespaces, server.origins = (
            self._codec,
            self._namespaces,
            self._origins,
        )
        server.hosts = frozenset(
            [*(f"{name}:{port}".lower() for name in (*LOOPBACK_NAMES, own)), *self._allowed_hosts]
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="codec-server", daemon=True
        )
        self._thread.start()
        host = "localhost" if self._host in ("127.0.0.1", "localhost") else self._host
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()

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
        prog="python -m worker.codec_server",
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
            "(generate one with `python -m worker.codec_server --generate-key`)",
        )
    sys.exit(asyncio.run(serve(args, keys)))


def _exit(code: int, message: str) -> NoReturn:
    print(f"python -m worker.codec_server: error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()

"""Gemini's REST protocol, answered by a script: on loopback HTTP, or in process.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The real ``google-genai`` client talks to it, so the exact production code path runs: request
building, SSE parsing, error mapping. Two ways in:

- :class:`GeminiStandIn`, a loopback HTTP server (``HttpOptions(base_url=...)``): the offline
  model (``worker.offline_model``) when no Gemini key is set, and tests that want a socket;
- :func:`answer`, the same replies for an in-process transport (``worker.testing``).

It implements ``models/{model}:generateContent`` and ``models/{model}:streamGenerateContent``
(with ``alt=sse``), nothing else.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import google.genai as genai
from google.genai import types as gt

log = logging.getLogger(__name__)

_PATH = re.compile(r"^/(?:v1beta|v1|v1alpha)/models/(?P<model>[^:/]+):(?P<method>[A-Za-z]+)")


@dataclass
class Reply:
    """One HTTP answer: a response body (or stream chunks), or an error status."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds between stream chunks: the first goes at once, each next one this much later
    # (a model still producing its reply).
    interval: float = 0.0
    # Set: a stream stops after its first chunk until this is set (at most HOLD_LIMIT): a model
    # still producing its reply for as long as a test wants, which can then tell what reached
    # its reader while the rest was not yet produced, by order rather than by the clock.
    hold: threading.Event | None = None

    @classmethod
    def streamed(
        cls,
        response: dict[str, Any],
        *,
        pieces: int,
        interval: float = 0.0,
        hold: threading.Event | None = None,
    ) -> Reply:
        """``response`` as Gemini streams it: its text in ``pieces`` chunks, ``interval``
        seconds apart, then a last chunk with its calls, finish reason and usage; with
        ``hold``, nothing after the first chunk until it is set."""
        candidate = response["candidates"][0]
        parts = candidate["content"]["parts"]
        text = "".join(p.get("text", "") for p in parts)
        step = max(1, -(-len(text) // max(1, pieces)))
        chunks: list[dict[str, Any]] = [
            {
                "candidates": [
                    {"content": {"role": "model", "parts": [{"text": text[i : i + step]}]}}
                ]
            }
            for i in range(0, len(text), step)
        ]
        others = [p for p in parts if "text" not in p]
        last = {**candidate, "content": {"role": "model", "parts": others}}
        chunks.append({**response, "candidates": [last]})
        return cls(chunks=chunks, interval=interval, hold=hold)

    @classmethod
    def error(cls, status: int, message: str, *, code: str = "", **headers: str) -> Reply:
        """An error as Gemini sends it: ``{"error": {"code", "message", "status"}}``; ``code``
        is the status name (default: the usual one for ``status``)."""
        body = {
            "error": {
                "code": status,
                "message": message,
                "status": code or _STATUS.get(status, "UNKNOWN"),
            }
        }
        return cls(chunks=[body], status=status, headers=headers)


HOLD_LIMIT = 30.0
"""The longest a held stream (``Reply.hold``) waits: a test that never sets it gets its reply."""

_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True)
class Request:
    """What the model was sent."""

    model: str
    method: str
    body: dict[str, Any]

    @property
    def contents(self) -> list[dict[str, Any]]:
        """The conversation sent, as REST contents (``role``, ``parts``)."""
        return self.body.get("contents", [])

    @property
    def last_parts(self) -> list[dict[str, Any]]:
        """The parts of the last content: the user's message, or the tools' responses."""
        contents = self.contents
        return contents[-1].get("parts", []) if contents else []

    def function_responses(self) -> list[dict[str, Any]]:
        """The function responses in the last content, in order."""
        return [p["functionResponse"] for p in self.last_parts if "functionResponse" in p]

    def tool_names(self) -> list[str]:
        """The tools the agent declared, in order."""
        return [d["name"] for d in self._declarations()]

    def tool_schema(self, name: str) -> dict[str, Any] | None:
        """The JSON schema of a declared tool's input (None if it declares none)."""
        for d in self._declarations():
            if d.get("name") == name:
                # google-genai sends the proto name; the REST docs use camelCase or `parameters`.
                for key in ("parameters_json_schema", "parametersJsonSchema", "parameters"):
                    if isinstance(d.get(key), dict):
                        return d[key]
        return None

    def _declarations(self) -> list[dict[str, Any]]:
        return [d for t in self.body.get("tools", []) for d in t.get("functionDeclarations", [])]

    def user_text(self) -> str:
        """The text of the latest user message that has text (what the user last said)."""
        for content in reversed(self.contents):
            if content.get("role", "user") == "user":
                texts = [p["text"] for p in content.get("parts", []) if "text" in p]
                if texts:
                    return " ".join(texts)
        return ""

    def system(self) -> str:
        """The system instruction's text."""
        si = self.body.get("systemInstruction") or {}
        return "".join(p.get("text", "") for p in si.get("parts", []))


Responder = Callable[[Request], "Reply | dict[str, Any]"]


@dataclass(frozen=True)
class Answer:
    """One HTTP response, ready to write."""

    status: int
    content_type: str
    headers: dict[str, str]
    payload: bytes
    # A stream's events, each ready to write, the seconds to wait between them, and what the
    # events after the first wait for (Reply.hold).
    events: tuple[bytes, ...] = ()
    interval: float = 0.0
    hold: threading.Event | None = None

    @property
    def paced(self) -> bool:
        """Whether the stream's events go one by one (not all at once)."""
        return bool(self.events) and (bool(self.interval) or self.hold is not None)


def answer(
    responder: Responder, path: str, raw: bytes, requests: MutableSequence[Request]
) -> Answer:
    """The stand-in's HTTP response to ``POST path`` with body ``raw``.

    Each request it serves is appended to ``requests``. A responder that raises gets a 500
    back, never a hang.
    """
    match = _PATH.match(path)
    if not match:
        return _encode(Reply.error(404, f"the stand-in does not serve {path}"), sse=False)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return _encode(Reply.error(400, "request body is not JSON"), sse=False)
    request = Request(model=match["model"], method=match["method"], body=body)
    requests.append(request)
    try:
        reply = responder(request)
    except Exception as e:  # a broken responder must answer, not hang the client
        log.exception("stand-in responder failed")
        reply = Reply.error(500, f"stand-in responder failed: {type(e).__name__}: {e}")
    if isinstance(reply, dict):
        reply = Reply(chunks=[reply])
    stream = request.method == "streamGenerateContent"
    return _encode(reply, sse=stream and reply.status == 200)


def _encode(reply: Reply, *, sse: bool) -> Answer:
    if sse:
        events = tuple(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in reply.chunks)
        return Answer(
            reply.status,
            "text/event-stream",
            reply.headers,
            b"".join(events),
            events=events,
            interval=reply.interval,
            hold=reply.hold,
        )
    merged = reply.chunks[-1] if reply.chunks else {}
    return Answer(reply.status, "application/json", reply.headers, json.dumps(merged).encode())


def text(value: str, *, finish: str = "STOP") -> dict[str, Any]:
    """A response whose model message is plain text."""
    return _response([{"text": value}], finish=finish)


def calls(
    *items: tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str], say: str = ""
) -> dict[str, Any]:
    """A response with one or more function calls: ``(name, args)`` or ``(name, args, id)``."""
    parts: list[dict[str, Any]] = [{"text": say}] if say else []
    for item in items:
        fc: dict[str, Any] = {"name": item[0], "args": item[1]}
        if len(item) > 2:
            fc["id"] = item[2]
        parts.append({"functionCall": fc})
    return _response(parts)


def _response(parts: list[dict[str, Any]], *, finish: str = "STOP") -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "standin",
    }


class Script:
    """A responder that plays replies in order and fails loudly when it runs out."""

    def __init__(self, replies: Sequence[Reply | dict[str, Any] | Responder]) -> None:
        self._replies = list(replies)
        self._lock = threading.Lock()
        self.index = 0

    def extend(self, replies: Sequence[Reply | dict[str, Any] | Responder]) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __call__(self, request: Request) -> Reply | dict[str, Any]:
        with self._lock:
            if self.index >= len(self._replies):
                # Not retryable: more attempts would only repeat it, and count as calls.
                return Reply.error(
                    400,
                    f"the scripted model has no reply left ({self.index} played); queue more "
                    "with reply(...)",
                    code="FAILED_PRECONDITION",
                )
            reply = self._replies[self.index]
            self.index += 1
        if callable(reply) and not isinstance(reply, dict | Reply):
            return reply(request)
        return reply


class GeminiStandIn:
    """The server. Use as a context manager, or ``start()``/``stop()``.

    ``requests`` records what the model was sent, the last ``keep_requests`` of them (all by
    default, for tests); a long-running worker on the offline model keeps none.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_requests: int | None = None,
    ) -> None:
        self.responder = responder
        self.requests: deque[Request] = deque(maxlen=keep_requests)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes; with Nagle's algorithm on, the body
            # waits for the client's delayed ACK of the headers: 40 ms per call on loopback.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
                log.debug("stand-in: " + format, *args)

            def do_POST(self) -> None:
                stand_in._handle(self)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gemini-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self) -> genai.Client:
        """A real google-genai client pointed at this server (SDK retries off)."""
        return genai.Client(
            api_key="standin-no-key",
            http_options=gt.HttpOptions(base_url=self.base_url, timeout=60_000),
        )

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        # list.append is atomic; the requests are read after the calls that made them.
        reply = answer(self.responder, h.path, raw, self.requests)
        h.send_response(reply.status)
        h.send_header("Content-Type", reply.content_type)
        h.send_header("Content-Length", str(len(reply.payload)))
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.end_headers()
        if reply.paced:
            for i, event in enumerate(reply.events):
                if i == 1 and reply.hold is not None:
                    reply.hold.wait(HOLD_LIMIT)
                if i:
                    time.sleep(reply.interval)
                h.wfile.write(event)
                h.wfile.flush()
            return
        h.wfile.write(reply.payload)

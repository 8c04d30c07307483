"""A loopback stand-in for Slack's Web API, for ``slack-sdk`` pointed at it (``base_url``), and
for the ``response_url`` of clicks; and what Slack sends the interactivity endpoint, signed.

It implements what ``SlackChannel`` and ``SlackInteractivity`` use, as Slack documents them:
``chat.postMessage`` (with message ``metadata``), ``chat.update``, ``conversations.history``
(metadata only with ``include_all_metadata``), ``conversations.open``, ``chat.postEphemeral``,
and ``POST /response/{id}`` as a click's ``response_url``. It records each call, keeps the
messages per conversation, and can hold a post's answer (after it took the message: a worker
killed then has posted without knowing it) or answer every call 500 (Slack down).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.web import served

TOKEN = "xoxb-test-token-never-shown"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[Any]
    metadata: dict[str, Any] | None
    updates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SlackStandIn:
    """The Web API's state: what was called, and each conversation's messages."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    messages: dict[str, list[Message]] = field(default_factory=dict)
    responses: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    # Set: a post is taken, then its answer waits until the event is set.
    hold_posts: asyncio.Event | None = None
    url: str = ""
    _ts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def called(self, method: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == method]

    def posted(self) -> list[Message]:
        return [m for msgs in self.messages.values() for m in msgs]

    # -- the app ---------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/{method}", self._api, methods=["GET", "POST"]),
                Route("/response/{hook}", self._response, methods=["POST"]),
            ]
        )

    async def _params(self, request: Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query_params)
        body = await request.body()
        kind = request.headers.get("content-type", "")
        if body and kind.startswith("application/json"):
            params.update(json.loads(body))
        elif body:
            params.update(dict(parse_qsl(body.decode())))
        return params

    async def _api(self, request: Request) -> Response:
        method = request.path_params["method"]
        params = await self._params(request)
        self.calls.append((method, params))
        if self.down:
            return JSONResponse({"ok": False, "error": "service_unavailable"}, status_code=503)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        handler = {
            "chat.postMessage": self._post,
            "chat.update": self._update,
            "chat.postEphemeral": self._ephemeral,
            "conversations.history": self._history,
            "conversations.open": self._open,
        }.get(method)
        if handler is None:
            return JSONResponse({"ok": False, "error": "unknown_method"})
        return await handler(params)

    async def _post(self, params: dict[str, Any]) -> Response:
        channel = str(params["channel"])
        blocks = params.get("blocks") or []
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        metadata = params.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        message = Message(channel, ts, str(params.get("text") or ""), blocks, metadata)
        self.messages.setdefault(channel, []).append(message)
        if self.hold_posts is not None:
            await self.hold_posts.wait()
        return JSONResponse({"ok": True, "channel": channel, "ts": ts})

    async def _update(self, params: dict[str, Any]) -> Response:
        for message in self.messages.get(str(params["channel"]), []):
            if message.ts == params["ts"]:
                blocks = params.get("blocks") or []
                message.updates.append({"text": params.get("text"), "blocks": blocks})
                message.text, message.blocks = str(params.get("text") or ""), blocks
                return JSONResponse({"ok": True, "channel": message.channel, "ts": message.ts})
        return JSONResponse({"ok": False, "error": "message_not_found"})

    async def _history(self, params: dict[str, Any]) -> Response:
        oldest = float(params.get("oldest") or 0)
        with_metadata = str(params.get("include_all_metadata")).lower() in ("1", "true")
        found = [
            {
                "type": "message",
                "ts": m.ts,
                "text": m.text,
                **({"metadata": m.metadata} if with_metadata and m.metadata else {}),
            }
            for m in reversed(self.messages.get(str(params["channel"]), []))
            if float(m.ts) >= oldest
        ]
        return JSONResponse({"ok": True, "messages": found, "has_more": False})

    async def _open(self, params: dict[str, Any]) -> Response:
        user = str(params["users"])
        return JSONResponse({"ok": True, "channel": {"id": "D" + user[1:]}})

    async def _ephemeral(self, params: dict[str, Any]) -> Response:
        return JSONResponse({"ok": True, "message_ts": f"{int(time.time())}.000000"})

    async def _response(self, request: Request) -> Response:
        self.responses.append(
            {"hook": request.path_params["hook"], **json.loads(await request.body())}
        )
        return Response("ok")


@asynccontextmanager
async def slack_standin() -> AsyncIterator[SlackStandIn]:
    """The stand-in on a free loopback port (``.url`` is its base URL)."""
    standin = SlackStandIn()
    async with served(standin.app()) as url:
        standin.url = url
        try:
            yield standin
        finally:
            if standin.hold_posts is not None:
                standin.hold_posts.set()


# -- what Slack sends the interactivity endpoint -------------------------------------------------


def click_payload(
    message: Message,
    *,
    action: str,
    user: str,
    response_url: str,
    team: str = "T0TEAM",
) -> dict[str, Any]:
    """A ``block_actions`` payload of a click on ``message``'s button ``action``."""
    buttons = [
        e
        for block in message.blocks
        if block.get("type") == "actions"
        for e in block.get("elements", [])
    ]
    pressed = next(b for b in buttons if b["action_id"] == action)
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "example"},
        "user": {"id": user, "username": "someone", "name": "Display Name Anyone Can Set"},
        "api_app_id": "A0APP",
        "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel},
        "channel": {"id": message.channel},
        "message": {"ts": message.ts, "text": message.text, "blocks": message.blocks},
        "response_url": response_url,
        "trigger_id": "1.2.3",
        "actions": [
            {
                "type": "button",
                "action_id": pressed["action_id"],
                "block_id": "tai_answer",
                "value": pressed.get("value"),
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def signed(
    payload: dict[str, Any], *, secret: str = SIGNING_SECRET, at: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """The form body Slack posts, and its signature headers (v0, HMAC-SHA256)."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()) if at is None else at)
    base = f"v0:{stamp}:".encode() + body
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return body, {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": signature,
    }

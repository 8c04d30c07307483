"""Serving the web app in a test: uvicorn on a free loopback port, and reading its SSE frames."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from starlette.applications import Starlette

from temporal_agent_interrupts.client.web import serve
from tests.helpers import free_port


@asynccontextmanager
async def served(app: Starlette) -> AsyncIterator[str]:
    """``app`` on a free loopback port; yields its base URL."""
    port = free_port()
    ready = asyncio.Event()
    task = asyncio.create_task(serve(app, port=port, ready=ready))
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raises why it did not start
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class Frame:
    id: str | None
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.event["type"])


async def frames(
    http: httpx2.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    stop: Callable[[list[Frame]], bool] | None = None,
) -> list[Frame]:
    """POST ``body`` and read the SSE frames until the stream ends (or ``stop`` says so, which
    drops the connection there)."""
    seen: list[Frame] = []
    # json.dumps escapes what UTF-8 cannot carry (a lone surrogate) as JSON allows.
    sent = {"content-type": "application/json", **(headers or {})}
    async with http.stream("POST", url, content=json.dumps(body), headers=sent) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        frame_id: str | None = None
        data: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                frame_id = line[4:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                seen.append(Frame(frame_id, json.loads("\n".join(data))))
                frame_id, data = None, []
                if stop is not None and stop(seen):
                    break
    return seen


def run_input(thread_id: str, text: str | None = None, **more: Any) -> dict[str, Any]:
    """An AG-UI ``RunAgentInput``, as a client sends it."""
    # Each message an id of its own, as AG-UI clients make them: the id is the send's
    # message_id, and a run posted again with it joins the turn it started.
    message = {"id": f"u-{uuid.uuid4().hex[:12]}", "role": "user", "content": text}
    messages = [message] if text else []
    return {"threadId": thread_id, "runId": f"run-{id(more)}", "messages": messages, **more}


async def answer(
    http: httpx2.AsyncClient, base: str, chat_id: str, ref: str, body: Any, **kwargs: Any
) -> httpx2.Response:
    return await http.post(f"{base}/api/chats/{chat_id}/interrupts/{ref}", json=body, **kwargs)


Probe = Callable[[], Awaitable[Any]]


def approval(interrupt: dict[str, Any]) -> dict[str, Any]:
    """The resume entry that approves an AG-UI interrupt as shown (its input digest echoed,
    as an editable tool's approval must)."""
    return {
        "interruptId": interrupt["id"],
        "status": "resolved",
        "payload": {"approved": True},
        "metadata": {"inputDigest": interrupt["metadata"]["inputDigest"]},
    }

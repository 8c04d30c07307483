"""Real MCP servers for the tests, built with the ``mcp`` package's server API (``MCPServer``).

Run as a process: ``python -m tests.mcp_servers stdio STATE_DIR`` (the worker starts it) or
``python -m tests.mcp_servers http STATE_DIR PORT [VARIANT]`` (the test starts it). Every call
of a tool appends a line to ``STATE_DIR/calls.log`` as it starts (``NAME JSON``), so a test
counts what reached the server. The HTTP server refuses a request without ``Authorization:
Bearer`` :data:`TOKEN`. A ``slow`` file in the state folder makes ``delete_record`` wait that
many seconds after it is counted (a call a test kills its worker under).

Variant ``2`` is the same server after a change of its tool list: ``archive_record`` is new,
and ``delete_record`` has another description and an optional ``reason``.

``python -m tests.mcp_servers flood STATE_DIR PORT`` is the HTTP server turned hostile: a call
of ``huge`` is answered with the body ``STATE_DIR/flood.json`` describes (:func:`flood_app`),
and the bytes it got out before the client hung up are appended to ``STATE_DIR/sent.log``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

# At the top: MCPServer reads the tools' annotations (Context) from this module's globals.
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    ListRootsRequest,
    SamplingMessage,
    TextContent,
    ToolAnnotations,
)

TOKEN = "test-mcp-token"

READ_ONLY = {"readOnlyHint": True}
DESTRUCTIVE = {"destructiveHint": True}


def state_token(tool: str, done: int) -> str:
    """The opaque state a test server's asking tool sends after ``done`` answered rounds: odd
    bytes (spaces, quotes, non-ASCII), so a client that does not echo it byte for byte fails."""
    return f'{tool}:{done}:  "état" \u2603 '


def inputs(state: Path) -> list[dict[str, Any]]:
    """What the asking tools were sent back, retry by retry."""
    log = state / "inputs.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def calls(state: Path) -> list[tuple[str, dict[str, Any]]]:
    """The calls that reached the server, in order."""
    log = state / "calls.log"
    if not log.exists():
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for line in log.read_text().splitlines():
        name, _, args = line.partition(" ")
        out.append((name, json.loads(args)))
    return out


def build(state: Path, variant: int = 1) -> MCPServer:
    server = MCPServer("records")

    def count(name: str, args: dict[str, Any]) -> None:
        with (state / "calls.log").open("a") as f:
            f.write(f"{name} {json.dumps(args, sort_keys=True)}\n")
            f.flush()

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(key: str) -> dict[str, Any]:
        """Look a record up by its key."""
        count("lookup", {"key": key})
        return {"key": key, "value": f"value of {key}"}

    if variant == 1:

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        async def delete_record(key: str, ctx: Context) -> dict[str, Any]:
            """Delete a record for good."""
            count("delete_record", {"key": key})
            meta = ctx.request_context.meta or {}
            with (state / "keys.log").open("a") as f:
                f.write(f"{meta.get('temporal-agent-interrupts/idempotencyKey')}\n")
            slow = state / "slow"
            if slow.exists():
                await asyncio.sleep(float(slow.read_text() or "30"))
            return {"deleted": key}

    else:

        @server.tool(name="delete_record", annotations=ToolAnnotations(destructive_hint=True))
        async def delete_record_saying_why(key: str, reason: str = "") -> dict[str, Any]:
            """Delete a record for good, saying why."""
            count("delete_record", {"key": key, "reason": reason})
            return {"deleted": key, "reason": reason}

        @server.tool(annotations=ToolAnnotations(destructive_hint=False))
        def archive_record(key: str) -> dict[str, Any]:
            """Move a record to the archive."""
            count("archive_record", {"key": key})
            return {"archived": key}

    @server.tool()
    def touch(key: str) -> str:
        """Mark a record as seen (declares no annotations)."""
        count("touch", {"key": key})
        return f"touched {key}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def fail(key: str) -> str:
        """Always fails."""
        count("fail", {"key": key})
        # The SDK's own ToolError: its message goes to the client (another exception's is hidden).
        raise ToolError(f"no record {key}")

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    async def transfer(amount: int, ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """Move money; asks the user to confirm the payee first (an input request)."""
        return asking(ctx, "transfer", {"amount": amount}, rounds=1)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def survey(topic: str, ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """Asks two questions, one round each, then answers (read-only: runs unasked)."""
        return asking(ctx, "survey", {"topic": topic}, rounds=2)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def haiku(topic: str, ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """Asks the client's model for a haiku (a sampling request), then returns it."""
        reply = (ctx.input_responses or {}).get("poem")
        if reply is None:
            count("haiku", {"topic": topic})
            return InputRequiredResult(
                input_requests={
                    "poem": CreateMessageRequest(
                        params=CreateMessageRequestParams(
                            messages=[
                                SamplingMessage(
                                    role="user",
                                    content=TextContent(type="text", text=f"A haiku about {topic}"),
                                )
                            ],
                            system_prompt="Be brief.",
                            max_tokens=5000,
                        )
                    )
                },
                request_state="haiku-1",
            )
        count("haiku:done", {"state": ctx.request_state})
        return {"poem": reply.content.text, "model": reply.model}  # type: ignore[union-attr]  # a CreateMessageResult by its key

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def spin(ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """Never done: answers every call with its state alone (still working)."""
        count("spin", {"state": ctx.request_state})
        return InputRequiredResult(request_state=f"spin-{len(ctx.request_state or '')}")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def workspace(ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """Asks the client for its roots, then names them."""
        got = ctx.input_responses or {}
        roots = got.get("roots")
        if roots is None:
            count("workspace", {"round": 0})
            return InputRequiredResult(
                input_requests={"roots": ListRootsRequest()}, request_state="roots-1"
            )
        count("workspace", {"round": 1, "state": ctx.request_state})
        return {"roots": [str(r.uri) for r in roots.roots]}  # type: ignore[union-attr]  # a ListRootsResult by its key

    def asking(
        ctx: Context, name: str, args: dict[str, Any], *, rounds: int
    ) -> dict[str, Any] | InputRequiredResult:
        """One form a round for ``rounds`` rounds; each retry's state and answer are logged
        (``inputs.log``), and the state is checked: it must come back byte for byte."""
        state_in = ctx.request_state
        done = 0 if state_in is None else int(state_in.split(":")[1])
        meta = ctx.request_context.meta or {}
        with (state / "keys.log").open("a") as f:
            f.write(f"{meta.get('temporal-agent-interrupts/idempotencyKey')}\n")
        answers = {
            k: v.model_dump(mode="json", exclude_none=True)
            for k, v in (ctx.input_responses or {}).items()
        }
        if state_in is not None:
            with (state / "inputs.log").open("a") as f:
                f.write(json.dumps({"tool": name, "state": state_in, "answers": answers}) + "\n")
            if state_in != state_token(name, done):
                raise ToolError(f"request state changed: {state_in!r}")
            answer = answers.get(f"q{done}")
            if not answer or answer.get("action") != "accept":
                count(name, {**args, "declined": done})
                return {"declined": True, "round": done}
        if done < rounds:
            if state_in is None:
                count(name, args)
            return InputRequiredResult(
                input_requests={
                    f"q{done + 1}": ElicitRequest(
                        params=ElicitRequestFormParams(
                            message=f"{name}: question {done + 1} of {rounds}",
                            requested_schema={
                                "type": "object",
                                "properties": {
                                    "payee": {"type": "string", "title": "Payee"},
                                    "ok": {"type": "boolean"},
                                },
                                "required": ["payee"],
                            },
                        )
                    )
                },
                request_state=state_token(name, done + 1),
            )
        count(f"{name}:done", {**args, "answers": answers})
        return {"done": True, **args, "answers": answers}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def huge(kib: int) -> str:
        """Returns ``kib`` KiB of text."""
        count("huge", {"kib": kib})
        return "x" * (kib * 1024)

    return server


def http_app(state: Path, variant: int) -> Any:
    """The server's Streamable HTTP app, behind a bearer-token check."""
    from starlette.responses import PlainTextResponse

    app = build(state, variant).streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


async def tool_call(receive: Any) -> tuple[bytes, dict[str, Any] | None]:
    """An HTTP request's whole body, read off ``receive``, and the JSON-RPC request when it is
    a ``tools/call`` with params (None otherwise): what a test server that answers some calls
    itself reads first."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        request = json.loads(body)
    except ValueError:
        request = None
    params = request.get("params") if isinstance(request, dict) else None
    called = isinstance(request, dict) and request.get("method") == "tools/call"
    return body, request if called and isinstance(params, dict) else None


def replaying(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives the body already read once more, then what comes next: the
    request, passed on whole to the real server."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def flood_app(state: Path) -> Any:
    """The HTTP server, answering each call of ``huge`` with a body as large and as odd as
    ``STATE_DIR/flood.json`` says: ``mib`` MiB of it, with ``content_type``, compressed when
    ``gzip`` (sent whatever the client accepts), with a ``Content-Length`` when ``length`` (else
    chunked), as SSE comment lines when ``sse``. Everything else reaches the real server."""
    import gzip

    inner = http_app(state, 1)
    chunk = 64 * 1024

    def bodies(spec: dict[str, Any]) -> tuple[list[tuple[bytes, bytes]], Any, int]:
        total = int(spec["mib"]) * 1024 * 1024
        headers = [(b"content-type", spec["content_type"].encode())]
        if spec.get("gzip"):
            raw = gzip.compress(b"x" * total, compresslevel=9)  # 100 MiB: about 100 KiB
            headers.append((b"content-encoding", b"gzip"))
            parts = [raw[i : i + chunk] for i in range(0, len(raw), chunk)]
            return headers, iter(parts), len(raw)
        line = b": " + b"x" * 1021 + b"\n" if spec.get("sse") else b"x" * 1024
        block = line * (chunk // len(line))
        return headers, (block for _ in range(total // len(block))), total

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        body, request = await tool_call(receive)
        if request is None or request["params"].get("name") != "huge":
            await inner(scope, replaying(body, receive), send)
            return
        spec = json.loads((state / "flood.json").read_text())
        headers, parts, size = bodies(spec)
        if spec.get("length"):
            headers.append((b"content-length", str(size).encode()))
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        sent = 0
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in parts:
            if gone.is_set():
                break
            await send({"type": "http.response.body", "body": part, "more_body": True})
            sent += len(part)
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        watcher.cancel()
        with (state / "sent.log").open("a") as f:
            f.write(f"{sent}\n")

    return app


def main(argv: list[str]) -> None:
    kind, state = argv[0], Path(argv[1])
    if kind == "stdio":
        build(state).run()
        return
    import uvicorn

    if kind == "flood":
        app = flood_app(state)
    else:
        app = http_app(state, int(argv[3]) if len(argv) > 3 else 1)
    uvicorn.run(app, host="127.0.0.1", port=int(argv[2]), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])

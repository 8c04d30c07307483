"""A hostile MCP server for the input-round attacks (tests/test_mcp_input_attacks.py).

``python -m tests.mcp_hostile_input STATE_DIR PORT``: a Streamable HTTP server on loopback that
lists ``ask`` (read-only) and ``pay`` (destructive: gated), both taking ``{"n": int}``. A call of
either is answered with raw JSON the test wrote beforehand: ``STATE_DIR/<tool>.json`` is a list
of JSON-RPC ``result`` objects as *text* (so it may hold what no SDK would serialize: lone
surrogates, odd keys), the k-th call of the tool getting the k-th (the last repeats). Every call
of a scripted tool appends its params (``inputResponses``, ``requestState``, ``_meta``) to
``STATE_DIR/hostile.log``, one JSON line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from tests.mcp_servers import replaying, tool_call

SCRIPTED = ("ask", "pay")


def script(state: Path, tool: str, results: list[str]) -> None:
    """What ``tool`` answers, call by call: JSON texts of ``result`` objects."""
    (state / f"{tool}.json").write_text(json.dumps(results))


def received(state: Path) -> list[dict[str, Any]]:
    """The params of every scripted call that reached the server, in order (raw JSON)."""
    log = state / "hostile.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def build() -> MCPServer:
    server = MCPServer("hostile")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def ask(n: int) -> str:
        """Asks for input (scripted)."""
        return "unscripted"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def pay(n: int) -> str:
        """Pays (scripted; destructive)."""
        return "unscripted"

    return server


def app(state: Path) -> Any:
    inner = build().streamable_http_app()

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        body, request = await tool_call(receive)
        params = request["params"] if request is not None else {}
        tool = params.get("name")
        if request is None or tool not in SCRIPTED or not (state / f"{tool}.json").exists():
            await inner(scope, replaying(body, receive), send)
            return
        with (state / "hostile.log").open("a") as f:
            f.write(json.dumps({"tool": tool, **params}) + "\n")
        results = json.loads((state / f"{tool}.json").read_text())
        mine = sum(1 for line in received(state) if line["tool"] == tool) - 1
        result = results[min(mine, len(results) - 1)]
        out = b'{"jsonrpc": "2.0", "id": ' + json.dumps(request["id"]).encode()
        out += b', "result": ' + result.encode("utf-8", "surrogatepass") + b"}"
        headers = [(b"content-type", b"application/json")]
        session = dict(scope.get("headers") or []).get(b"mcp-session-id")
        if session:
            headers.append((b"mcp-session-id", session))
        headers.append((b"content-length", str(len(out)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out, "more_body": False})

    return serve


def main(argv: list[str]) -> None:
    import uvicorn

    uvicorn.run(app(Path(argv[0])), host="127.0.0.1", port=int(argv[1]), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Tools from MCP servers: ``mcp_tools(server, ...)``, the per-worker sessions, the ``mcp_call``
activity.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.mcp``.

An MCP server's tools become an agent's tools in two steps, both on the worker:

- **Listing.** The model activity lists each server's tools when it calls the model
  (:meth:`MCPSessions.list_specs`) and adds them to the agent's definition as ``ToolSpec`` s:
  name, description, input schema, and the gate's decision with its reason. The definition is
  what the model activity returns, so it reaches the workflow as data recorded in history, and a
  server that changes its tools never changes what a paused conversation replays; the next
  model call sees the new list, as it sees a changed prompt.
- **Calling.** The workflow sends a call of such a tool to the ``mcp_call`` activity, with the
  server's key and the tool's name there from the recorded spec. The activity calls the tool
  through this worker's session with that server, opened on first use and opened again after it
  failed (a worker that restarts simply connects again).

A server is not trusted. What it lists is capped and checked before it enters a definition (a
name the model can call, a description cut to size, a schema that is a bounded JSON Schema
object, at most :data:`MAX_TOOLS_PER_SERVER` tools, the whole within the definition's budget):
a tool that fails is left out and logged, never a failed workflow task. Its annotations are
hints: they choose the default gate (read-only runs, anything else pauses for approval), the
``allow``/``gate`` lists override them by name, and ``trust_annotations=False`` gates every tool
the ``allow`` list does not name. What a call returns is measured like any tool's output.

Credentials (``MCPServerHTTP(headers=...)``, a stdio server's ``env``) stay in the worker's
process: the definition names the server by its key only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from typing import Any

import httpx2
import mcp
import mcp_types
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from temporal_agent_interrupts.workflows.agent import check_approvers, spec_digest
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    KiB,
    Refused,
    check_json,
    cut_stored,
    json_size,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    GateDecision,
    JsonObject,
    MCPToolRef,
    Status,
    ToolSpec,
)

log = logging.getLogger(__name__)

MAX_TOOLS_PER_SERVER = 64
"""The most tools one server adds to an agent (the first ones it lists; the rest are logged)."""

MAX_SCHEMA_BYTES = 16 * KiB
"""The most one tool's input schema may take as JSON; a larger one leaves the tool out."""

MAX_DESCRIPTION_CHARS = 1024
"""What of a tool's description the model is shown (the rest is cut, said so)."""

MAX_LIST_PAGES = 8
"""Pages of ``tools/list`` read at most (a server that pages forever is cut off)."""

CONNECT_TIMEOUT = timedelta(seconds=15)
"""How long opening a session (spawning a stdio server, the HTTP handshake) may take."""

LIST_TIMEOUT = timedelta(seconds=10)
"""How long listing a server's tools may take, at each model call."""

RELIST_AFTER_FAILURE = 10.0
"""Seconds after a server could not be listed during which model calls use its last listing
without trying again: a server that hangs must not add its timeouts to every model call."""

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""The most one response body from an HTTP server may take, whatever its content type (the SDK
reads a JSON one into memory whole, and reads an SSE stream to its end): past it the body is
cut off unread. Bodies are asked for, and only taken, uncompressed, so the bytes counted are
the bytes held (a compressed body could hold a thousand times its size)."""

PING_AFTER = 2.0
"""Seconds a session may sit unused before a call checks it first (a ``tools/list``): a server
that restarted in between is then reconnected to before the call is sent, not after it failed."""

IDEMPOTENCY_META = "temporal-agent-interrupts/idempotencyKey"
"""The ``_meta`` key of a call that carries its idempotency key (``ToolContext.idempotency_key``:
the same for every attempt of one approved run), for a server that deduplicates."""

_SERVER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Gemini's rule for function names: a letter or underscore first, then letters, digits,
# underscores, dots, colons or dashes, at most 64 in all.
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,31}")


# --------------------------------------------------------------------------------------------
# Declaring servers and their tools.


@dataclass(frozen=True)
class MCPServerStdio:
    """An MCP server this worker starts as a subprocess, and talks to over its stdin/stdout.

    Args:
        name: The server's durable key: definitions and histories name the server by it.
        command: The executable (``sys.executable``, ``npx``, ``uvx``).
        args: Its arguments.
        env: Extra environment for it (merged over the SDK's safe defaults); stays on the
            worker.
        cwd: Its working directory.
        roots: What this worker answers when the server asks for the client's roots
            (``file://`` URIs); none by default.
    """

    name: str
    command: str
    args: Sequence[str] = ()
    _: KW_ONLY
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    roots: Sequence[str] = ()

    def __post_init__(self) -> None:
        _check_server_name(self.name)
        _check_roots(self.name, self.roots)

    def transport(self) -> Any:
        return mcp.StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )


@dataclass(frozen=True)
class MCPServerHTTP:
    """An MCP server over Streamable HTTP.

    Args:
        name: The server's durable key: definitions and histories name the server by it.
        url: Its endpoint (``https://host/mcp``).
        headers: Sent with every request (``Authorization: Bearer ...``); they stay on the
            worker and are never shown in a repr.
        roots: What this worker answers when the server asks for the client's roots
            (``file://`` URIs); none by default.
    """

    name: str
    url: str
    _: KW_ONLY
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    roots: Sequence[str] = ()

    def __post_init__(self) -> None:
        _check_server_name(self.name)
        _check_roots(self.name, self.roots)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must be http:// or https://")

    def transport(self) -> Any:
        client = httpx2.AsyncClient(
            headers=dict(self.headers),
            # Temporal owns the call's deadline (the activity's timeout); this bounds a stalled
            # connection.
            timeout=httpx2.Timeout(30.0, read=300.0),
            transport=_CappedTransport(httpx2.AsyncHTTPTransport(), limit=MAX_RESPONSE_BYTES),
        )
        return streamable_http_client(self.url, http_client=client)


TOO_LARGE = "MCP response too large: "
ENCODED = "MCP response refused: "
"""How a refused body's error starts (past the cap, or compressed), so the session can tell it
from others: the SDK reports it as a JSON-RPC error of the call (a JSON body) or as its SSE
stream failing, with this text in the message."""


class ResponseRefused(httpx2.SSEError, httpx2.StreamError):
    """An MCP server's response body passed :data:`MAX_RESPONSE_BYTES`, or came compressed.

    Both of the SDK's kinds of read failure, so that it ends only this request, whichever way
    the body was read: as a failed JSON body (``StreamError``) or a failed SSE stream
    (``SSEError``), never the whole session."""

    def __init__(self, reason: str, *, too_large: bool) -> None:
        super().__init__((TOO_LARGE if too_large else ENCODED) + reason)


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, *, encoding: str) -> None:
        self._inner = inner
        self._limit = limit
        self._encoding = encoding

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding:
            # Decoding happens past this stream, in httpx: a body encoded anyway (it was asked
            # for "identity") is refused before a byte of it is read.
            raise ResponseRefused(
                f"the server sent its response compressed ({self._encoding[:40]}); this "
                "client takes only uncompressed ones",
                too_large=False,
            )
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise ResponseRefused(
                    f"the server's response passed {self._limit // (1024 * 1024)} MiB",
                    too_large=True,
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    """Reads at most ``limit`` bytes of any response body, whatever its content type says
    (``Application/JSON`` is JSON to the SDK too) and however it is framed (a length, chunked,
    an SSE stream): the SDK reads a JSON body into memory whole, and a hostile server could
    send gigabytes, or an SSE stream that never ends. Each request asks for an uncompressed
    body; one that comes compressed anyway is refused (its size is not what it would hold)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, *, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        stream = response.stream
        # Always async here (an AsyncClient's transport); anything else is not read by it.
        if isinstance(stream, httpx2.AsyncByteStream):
            response.stream = _CappedBody(
                stream, self._limit, encoding="" if encoding in ("", "identity") else encoding
            )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


MCPServer = MCPServerStdio | MCPServerHTTP


def _check_roots(name: str, roots: Sequence[str]) -> None:
    if isinstance(roots, str) or any(
        not isinstance(r, str) or not r.startswith("file://") for r in roots
    ):
        raise ValueError(f"MCP server {name!r}: roots must be a list of file:// URIs")


def _check_server_name(name: str) -> None:
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise ValueError(
            f"MCP server name {name!r}: 1 to 64 letters, digits, '_', '.' or '-' (it is a "
            "durable key, recorded in conversations' histories)"
        )


@dataclass(frozen=True)
class MCPToolset:
    """An MCP server's tools as an agent's tools; build it with :func:`mcp_tools`."""

    server: MCPServer
    _: KW_ONLY
    allow: frozenset[str] = frozenset()
    gate: frozenset[str] = frozenset()
    prefix: str = ""
    trust_annotations: bool = True
    approvers: tuple[str, ...] = ()
    quorum: int = 1
    editable: frozenset[str] = frozenset()
    timeout: timedelta | None = None

    @property
    def toolset(self) -> str:
        """The durable key of this toolset (``mcp:SERVER``)."""
        return f"mcp:{self.server.name}"

    def _hints(self, annotations: mcp_types.ToolAnnotations | None) -> JsonObject | None:
        """The tool's boolean hints, for a policy set to read (only where this toolset trusts
        annotations: a policy must not read what the gate was told to ignore)."""
        if not self.trust_annotations or annotations is None:
            return None
        hints = {
            "readOnlyHint": annotations.read_only_hint,
            "destructiveHint": annotations.destructive_hint,
            "idempotentHint": annotations.idempotent_hint,
            "openWorldHint": annotations.open_world_hint,
        }
        return {k: v for k, v in hints.items() if isinstance(v, bool)}

    def decide(self, name: str, annotations: mcp_types.ToolAnnotations | None) -> GateDecision:
        """Whether calls of the server's tool ``name`` pause for approval, and why."""
        if name in self.gate:
            return GateDecision(gated=True, reason="list", detail="gate list")
        if name in self.allow:
            return GateDecision(gated=False, reason="list", detail="allow list")
        if not self.trust_annotations:
            return GateDecision(gated=True, reason="untrusted", detail="trust_annotations=False")
        if annotations is None:
            return GateDecision(gated=True, reason="default", detail="no annotations")
        read_only = annotations.read_only_hint is True
        if read_only and annotations.destructive_hint is True:
            # Both at once contradicts itself: taken as the one that asks.
            return GateDecision(gated=True, reason="annotation", detail="destructiveHint")
        if read_only:
            return GateDecision(gated=False, reason="annotation", detail="readOnlyHint")
        if annotations.destructive_hint is False:
            # Additive, not read-only: it still changes the world.
            return GateDecision(gated=True, reason="annotation", detail="not read-only")
        # destructiveHint true, or unset (MCP's default for a tool that is not read-only).
        return GateDecision(gated=True, reason="annotation", detail="destructiveHint")

    def specs(self, tools: Sequence[mcp_types.Tool]) -> tuple[list[ToolSpec], list[str]]:
        """The server's listed tools as tool specs, and what was left out (and why).

        Pure: the tests feed it hostile listings directly.
        """
        specs: list[ToolSpec] = []
        problems: list[str] = []
        seen: set[str] = set()
        for t in tools:
            name = t.name if isinstance(t.name, str) else ""
            shown = cut_stored(name, 80)
            if len(specs) >= MAX_TOOLS_PER_SERVER:
                problems.append(
                    f"{len(tools) - MAX_TOOLS_PER_SERVER} tools past the first "
                    f"{MAX_TOOLS_PER_SERVER} left out"
                )
                break
            full = f"{self.prefix}{name}"
            if not _FUNCTION_NAME.fullmatch(full):
                problems.append(
                    f"tool {shown!r} left out: {full[:80]!r} is not a name a model can call "
                    "(a letter or '_' first, then letters, digits, '_', '.', ':' or '-', 64 at "
                    "most)"
                )
                continue
            if full in seen:
                problems.append(f"tool {shown!r} left out: listed twice")
                continue
            problem = _schema_problem(t.input_schema)
            if problem is not None:
                problems.append(f"tool {shown!r} left out: its input schema {problem}")
                continue
            description = _description(t)
            try:
                check_json({"d": description}, what="its description")
            except Refused as e:
                problems.append(f"tool {shown!r} left out: {e.reason}")
                continue
            decision = self.decide(name, t.annotations)
            editable = name in self.editable
            if editable and _costly_to_check(t.input_schema):
                # An edit is checked against the schema inside the workflow, where a
                # server's regular expression could stall a workflow task, and so could a
                # few KiB of references that branch into each other (anyOf of two $refs to
                # the next level, 40 levels deep: 2**40 checks), or a remote $ref.
                problems.append(
                    f"tool {shown!r}: edits turned off, its input schema has regular "
                    "expressions (pattern, patternProperties) or references ($ref) the "
                    "workflow would have to run"
                )
                editable = False
            seen.add(full)
            specs.append(
                ToolSpec(
                    name=full,
                    description=description,
                    input_schema=dict(t.input_schema),
                    timeout_seconds=self.timeout.total_seconds() if self.timeout else None,
                    approvers=list(self.approvers),
                    quorum=self.quorum,
                    editable=editable,
                    mcp=MCPToolRef(server=self.server.name, tool=name),
                    gate=decision,
                    annotations=self._hints(t.annotations),
                )
            )
        return specs, problems


def mcp_tools(
    server: MCPServer,
    *,
    allow: Sequence[str] = (),
    gate: Sequence[str] = (),
    prefix: str = "",
    trust_annotations: bool = True,
    approvers: Sequence[str] = (),
    quorum: int = 1,
    editable: Sequence[str] = (),
    timeout: timedelta | None = None,
) -> MCPToolset:
    """An MCP server's tools, as tools of the agent whose ``tools=`` lists this.

    The worker lists them when it calls the model, so the agent has what the server offers at
    that moment; each call runs as an activity through the worker's session with the server.
    Whether a call pauses for approval first is decided per tool, from what the server says
    about it (MCP tool annotations, which are **hints from a server you may not control**):

    - a name in ``gate`` pauses, and a name in ``allow`` runs, whatever its annotations say;
    - otherwise, with ``trust_annotations=False``, it pauses;
    - otherwise ``readOnlyHint: true`` runs, and anything else pauses: ``destructiveHint``,
      a tool that is not read-only, and a tool that declares no annotations.

    The decision and its reason are on the call's interrupt (``InterruptRequest.gate``) and in
    the answer's audit record. The agent's ``ToolApproval``, if any, applies to these tools as
    to any (a tool not in its ``allow`` pauses, with its approvers).

    Args:
        server: ``MCPServerStdio`` or ``MCPServerHTTP``.
        allow: Server tool names that run without asking.
        gate: Server tool names that always pause for approval.
        prefix: Put before each tool's name for the model (``files_``), so that two servers'
            tools, or a server's and the agent's own, cannot clash. A server's tool whose name
            clashes anyway is left out (the agent's own tool wins), and logged.
        trust_annotations: False: every tool not in ``allow`` pauses.
        approvers: Who may answer a call these tools' gate paused (empty: anyone); as
            ``ToolApproval(approvers=)``.
        quorum: How many distinct approvals let such a call run.
        editable: Server tool names whose input an approver may change (an edit; the gate
            decides again for the edited call).
        timeout: The longest one call may take (default: the tool activity's).

    Raises:
        ValueError: a name in both ``allow`` and ``gate``, a prefix that is not the start of a
            function name, or approvers and a quorum no answer could meet.
    """
    for what, names in (("allow", allow), ("gate", gate), ("editable", editable)):
        if isinstance(names, str):
            raise ValueError(f"mcp_tools: {what} is a list of tool names, not one string")
    both = sorted(set(allow) & set(gate))
    if both:
        raise ValueError(f"mcp_tools({server.name!r}): in both allow and gate: {both}")
    if prefix and not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"mcp_tools({server.name!r}): prefix {prefix!r} must start a function name (a "
            "letter or '_', then letters, digits, '_', '.', ':' or '-', 32 at most)"
        )
    check_approvers(approvers, what=f"mcp_tools({server.name!r})", quorum=quorum)
    return MCPToolset(
        server,
        allow=frozenset(allow),
        gate=frozenset(gate),
        prefix=prefix,
        trust_annotations=trust_annotations,
        approvers=tuple(approvers),
        quorum=quorum,
        editable=frozenset(editable),
        timeout=timeout,
    )


def _description(tool: mcp_types.Tool) -> str:
    text = tool.description or tool.title or ""
    if not isinstance(text, str):
        return ""
    if len(text) > MAX_DESCRIPTION_CHARS:
        return text[:MAX_DESCRIPTION_CHARS] + " [description cut]"
    return text


_COSTLY_KEYWORDS = frozenset(
    {"pattern", "patternProperties", "$ref", "$dynamicRef", "$recursiveRef"}
)


def _costly_to_check(schema: object) -> bool:
    """Whether a schema anywhere asks for a regular expression to be run or a reference to be
    followed (or names a property so: the walk does not tell them apart, and errs on the safe
    side). Without references, checking takes time bounded by the schema's size (16 KiB at
    most); with them, a small schema can branch exponentially."""
    if isinstance(schema, dict):
        if not _COSTLY_KEYWORDS.isdisjoint(schema):
            return True
        return any(_costly_to_check(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_costly_to_check(v) for v in schema)
    return False


def _schema_problem(schema: object) -> str | None:
    """Why an input schema cannot be offered to the model, or None."""
    if not isinstance(schema, dict):
        return "is not a JSON object"
    try:
        check_json(schema, what="it")
    except Refused as e:
        return f"cannot be kept ({e.reason})"
    size = json_size(schema)
    if size > MAX_SCHEMA_BYTES:
        return f"is {size // KiB} KiB; the limit is {MAX_SCHEMA_BYTES // KiB} KiB"
    if schema.get("type") != "object":
        return 'does not have "type": "object" at its root'
    return invalid_schema(schema)


def invalid_schema(schema: dict[str, Any]) -> str | None:
    """Why a server's schema is not a valid JSON Schema, or None (checked by its own draft)."""
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        return f"is not a valid JSON Schema ({cut_stored(str(e.message), 200)})"
    except Exception:  # noqa: BLE001  # any failure of a hostile schema is a refusal, not a crash
        return "could not be checked as a JSON Schema"
    return None


# --------------------------------------------------------------------------------------------
# Sessions: one per server per worker.


class MCPResponseRefused(Exception):
    """The server answered the call with a body this worker would not hold (past
    :data:`MAX_RESPONSE_BYTES`, or compressed): cut off unread. The call reached the server,
    which may have acted on it."""

    def __init__(self, message: str, *, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large


class MCPResultUnreadable(Exception):
    """The server answered the call with a result that does not read as MCP. The call reached
    the server, which may have acted on it; the session stays open."""


class MCPUnavailable(Exception):
    """The server could not be reached (the call did not get to it), or the connection was
    lost during the call (``sent``: it may have taken effect)."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class _Session:
    """One open session with a server, owned by a task of its own (the SDK's transports are
    anyio context managers, entered and left in one task)."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.client: mcp.Client | None = None
        self.failed: BaseException | None = None
        self.used = 0.0
        # Calls under way on it: a session in use is never probed, nor closed under them.
        self.busy = 0
        self.retired = False
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def open(self) -> None:
        self._task = asyncio.create_task(self._own(), name=f"mcp session {self.server.name}")
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT.total_seconds()):
                await self._ready.wait()
        except TimeoutError:
            await self.close()
            raise MCPUnavailable(
                f"MCP server {self.server.name!r} did not answer within "
                f"{CONNECT_TIMEOUT.total_seconds():g} s of connecting"
            ) from None
        if self.client is None:
            raise MCPUnavailable(
                f"MCP server {self.server.name!r} could not be reached: {_reason(self.failed)}"
            )

    async def _own(self) -> None:
        try:
            # No response cache: each model call lists what the server has now.
            async with mcp.Client(
                self.server.transport(),
                cache=None,
                mode="auto",
                # Declared so a server may ask (forms, roots): on 2026-07-28 it asks by
                # answering a call with InputRequiredResult, which the call's activity returns
                # to the conversation; a request sent on its own (older revisions) is refused,
                # since nobody can be waited for inside a session.
                elicitation_callback=_elicit_standalone,
                list_roots_callback=_roots_callback(self.server.roots),
            ) as client:
                self.client = client
                self.used = time.monotonic()
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # kept for the caller; the session is over
            self.failed = e
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.client = None
            self._ready.set()

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(task)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except BaseException:  # noqa: BLE001  # the session's own failure, already kept
                pass


def _reason(err: BaseException | None) -> str:
    """A failure's cause in a few words (an ExceptionGroup's first leaf), never a traceback."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    if err is None:
        return "the session closed"
    text = str(err) or type(err).__name__
    return cut_stored(f"{type(err).__name__}: {text}", 300)


async def _elicit_standalone(context: Any, params: Any) -> mcp_types.ErrorData:
    return mcp_types.ErrorData(
        code=mcp_types.INVALID_REQUEST,
        message="this client answers input requests only within a tool call's result "
        "(InputRequiredResult, MCP 2026-07-28)",
    )


def roots_result(roots: Sequence[str]) -> mcp_types.ListRootsResult:
    """What this worker answers a server's roots request with: its configured roots."""
    return mcp_types.ListRootsResult(
        roots=[mcp_types.Root(uri=uri) for uri in roots]  # type: ignore[arg-type]  # FileUrl validates the str
    )


def _roots_callback(roots: Sequence[str]) -> Any:
    async def listed(context: Any) -> mcp_types.ListRootsResult:
        return roots_result(roots)

    return listed


class MCPSessions:
    """This worker's sessions with its agents' MCP servers, by server key."""

    def __init__(self, servers: Sequence[MCPServer]) -> None:
        self._servers: dict[str, MCPServer] = {}
        for s in servers:
            known = self._servers.get(s.name)
            if known is not None and known != s:
                raise ValueError(f"two different MCP servers are named {s.name!r}")
            self._servers[s.name] = s
        self._sessions: dict[str, _Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # The last listing that worked, per server: used while the server cannot be reached.
        self._listed: dict[str, list[mcp_types.Tool]] = {}
        # Problems already logged, so a bad listing is not logged at every model call.
        self._warned: set[str] = set()
        # Until when (monotonic) a server that could not be listed is not asked again.
        self._down_until: dict[str, float] = {}

    def hosts(self, server: str) -> bool:
        return server in self._servers

    def has_listing(self, server: str) -> bool:
        """Whether this worker has listed the server (now, or before it could not be)."""
        return server in self._listed

    async def _session(self, name: str, *, fresh: bool = False) -> _Session:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            session = self._sessions.get(name)
            if session is not None and session.alive and not fresh:
                return session
            if session is not None:
                await self._retire(session)
            session = _Session(self._servers[name])
            self._sessions[name] = session
            await session.open()
            return session

    async def _checked(self, name: str) -> _Session:
        """A session that answered just now: one idle a while is pinged first, and opened
        again if the ping fails (a server that restarted forgets its sessions)."""
        session = await self._session(name)
        if session.busy or time.monotonic() - session.used < PING_AFTER:
            # In use: a call under way may hold the server for long, and a probe that waits
            # behind it is no sign of a dead server (nor may it close the session under it).
            return session
        try:
            assert session.client is not None
            async with asyncio.timeout(LIST_TIMEOUT.total_seconds()):
                # A read every protocol version has (ping is gone from 2026-07-28 on).
                await session.client.list_tools()
        except Exception:  # noqa: BLE001  # any failure: the session is gone, open another
            session = await self._session(name, fresh=True)
        session.used = time.monotonic()
        return session

    async def list_tools(self, name: str) -> list[mcp_types.Tool]:
        """The server's tools now; the last listing that worked if it cannot be reached."""
        if time.monotonic() < self._down_until.get(name, 0.0):
            return self._listed.get(name) or []
        try:
            tools = await self._list(name)
        except MCPUnavailable as e:
            self._down_until[name] = time.monotonic() + RELIST_AFTER_FAILURE
            known = self._listed.get(name)
            self._warn(
                f"{name}:down:{known is not None}",
                "MCP server %r cannot be listed (%s); %s",
                name,
                e,
                "using its last listing" if known is not None else "its tools are left out",
            )
            return known or []
        self._listed[name] = tools
        self._warned = {w for w in self._warned if not w.startswith(f"{name}:down:")}
        return tools

    async def _list(self, name: str) -> list[mcp_types.Tool]:
        for attempt in (1, 2):
            session = await self._checked(name)
            try:
                assert session.client is not None
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                async with asyncio.timeout(LIST_TIMEOUT.total_seconds()):
                    for _ in range(MAX_LIST_PAGES):
                        page = await session.client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if not cursor or len(tools) > MAX_TOOLS_PER_SERVER:
                            break
                session.used = time.monotonic()
                return tools
            except MCPError as e:
                raise MCPUnavailable(f"tools/list failed: {cut_stored(e.message, 300)}") from None
            except Exception as e:  # noqa: BLE001  # a broken session: open another once
                await self._drop(name, session)
                if attempt == 2:
                    raise MCPUnavailable(_reason(e)) from None
        raise AssertionError("unreachable")

    async def _drop(self, name: str, session: _Session) -> None:
        if self._sessions.get(name) is session:
            del self._sessions[name]
        await self._retire(session)

    async def _retire(self, session: _Session) -> None:
        """Close a session no longer used for new calls: now, or once its last call under way
        has finished (a stdio server's process ends with its session)."""
        if session.busy:
            session.retired = True
        else:
            await session.close()

    def roots(self, name: str) -> Sequence[str]:
        """What this worker answers server ``name``'s roots requests with."""
        return self._servers[name].roots

    async def call(
        self,
        name: str,
        tool: str,
        args: JsonObject,
        *,
        idempotency_key: str | None = None,
        input_responses: mcp_types.InputResponses | None = None,
        request_state: str | None = None,
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        """Call ``tool`` on server ``name``: the first time, or again after an input round with
        its answers and the server's state. A server that asks for input is answered by the
        caller (``InputRequiredResult``), never here.

        Raises:
            MCPUnavailable: the server could not be reached (the call was not sent), or the
                connection was lost with the call under way (``sent``).
            MCPResponseRefused: the server's answer was cut off unread (too large, or
                compressed); the session stays open.
            MCPError: the server refused the call (a JSON-RPC error).
        """
        try:
            session = await self._checked(name)
        except MCPUnavailable:
            raise
        except Exception as e:  # noqa: BLE001  # could not connect: the call was never sent
            raise MCPUnavailable(_reason(e)) from None
        assert session.client is not None
        try:
            meta: mcp_types.RequestParamsMeta | None = None
            if idempotency_key:
                meta = {IDEMPOTENCY_META: idempotency_key}
            session.busy += 1
            try:
                result = await _call_tool(
                    session.client,
                    tool,
                    args,
                    meta=meta,
                    input_responses=input_responses,
                    request_state=request_state,
                )
            finally:
                session.busy -= 1
                if session.retired and not session.busy:
                    await session.close()
        except MCPResultUnreadable:
            raise
        except MCPError as e:
            for mark, too_large in ((TOO_LARGE, True), (ENCODED, False)):
                at = e.message.find(mark)
                if at >= 0:
                    # Only this request's body was cut (see ResponseRefused): the session lives.
                    raise MCPResponseRefused(
                        cut_stored(e.message[at + len(mark) :], 300), too_large=too_large
                    ) from None
            if e.code == mcp_types.CONNECTION_CLOSED:
                await self._drop(name, session)
                raise MCPUnavailable(
                    f"the connection to MCP server {name!r} closed during the call", sent=True
                ) from None
            raise
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  # a transport failure with the call sent
            await self._drop(name, session)
            raise MCPUnavailable(
                f"the connection to MCP server {name!r} failed during the call ({_reason(e)})",
                sent=True,
            ) from None
        session.used = time.monotonic()
        return result

    def _warn(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def left_out(self, server: str, problems: Sequence[str]) -> None:
        """Log, once each, the tools a listing left out."""
        for p in problems:
            self._warn(f"{server}:{p}", "MCP server %r: %s", server, p)

    async def aclose(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            with contextlib.suppress(Exception):
                await s.close()


async def _call_tool(
    client: mcp.Client,
    tool: str,
    args: JsonObject,
    *,
    meta: mcp_types.RequestParamsMeta | None,
    input_responses: mcp_types.InputResponses | None,
    request_state: str | None,
) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
    """One ``tools/call``, its input rounds left to the caller (the client's own call would
    answer them in process); resent once after a fresh listing when a 2026-07-28 server says
    the tool's listed schema is stale, as the client's own call does."""
    for attempt in (1, 2):
        try:
            result = await client.session.call_tool(
                tool,
                args,
                input_responses=input_responses,
                request_state=request_state,
                meta=meta,
                allow_input_required=True,
            )
        except MCPError as e:
            if e.code != mcp_types.HEADER_MISMATCH or attempt == 2:
                raise
            await client.list_tools()
            continue
        except ValidationError as e:
            # The server answered, with what does not read as MCP (an input round with
            # neither requests nor state, a result without its type): the call may have
            # taken effect; the session is sound.
            raise MCPResultUnreadable(
                f"{e.error_count()} problem(s), the first: "
                f"{cut_stored(str(e.errors()[0].get('msg', '')), 200)}"
            ) from None
        if not isinstance(result, mcp_types.CallToolResult | mcp_types.InputRequiredResult):
            raise MCPResultUnreadable("the server answered with another kind of result")
        return result
    raise AssertionError("unreachable")


def status_of(error: MCPError) -> Status:
    """A JSON-RPC error from a server as a classified status."""
    code = error.code
    if code == mcp_types.INVALID_PARAMS:
        return Status.INVALID_ARGUMENT
    if code == mcp_types.METHOD_NOT_FOUND:
        return Status.UNIMPLEMENTED
    if code == mcp_types.INVALID_REQUEST:
        return Status.INVALID_ARGUMENT
    return Status.INTERNAL


def result_output(result: mcp_types.CallToolResult) -> JsonObject:
    """A tool call's result as the function response the model gets.

    Structured content (an object) is the output as it is; so is one text block that holds a
    JSON object (how many servers return one); otherwise the text blocks, joined, are
    ``result``. Other blocks (images, audio, resources) are named, never copied into the
    conversation. A result the server marked ``isError`` is the tool's own failure, which MCP
    means the model to see: ``{"error": text}``.
    """
    texts: list[str] = []
    others: list[JsonObject] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            texts.append(block.text)
        else:
            kind = getattr(block, "type", "content")
            others.append({"type": str(kind)[:40], "note": "not kept in the conversation"})
    text = "\n".join(texts)
    if result.is_error:
        out: JsonObject = {"error": text or "the tool failed (no message)"}
    elif isinstance(result.structured_content, dict):
        out = dict(result.structured_content)
    elif result.structured_content is not None:
        out = {"result": result.structured_content}
    else:
        out = _json_object(texts) or {"result": text}
    if others:
        out.setdefault("other_content", others)
    return out


def merged_spec(
    spec: AgentSpec,
    listed: Sequence[tuple[str, list[ToolSpec]]],
    *,
    prefixes: Sequence[tuple[str, str]] = (),
    owners: Mapping[str, str] | None = None,
) -> tuple[AgentSpec, list[tuple[str, str]]]:
    """The agent's own definition with its servers' listed tools added, and what was left out
    (server, why): a name the agent already has, a name in another server's ``prefix``
    (server, prefix pairs: a prefix is that server's, or one server could take another's
    names, and its arguments, while that one is down), a name another server lists too, or a
    tool past the definition's budget (``DOOR.spec``). The digest is the merged definition's.

    A name two servers list (neither has a prefix) is one server's only, by this rule: the
    server the conversation's recorded definition has it from (``owners``: name to server),
    while that server still lists it; otherwise the first of them in the agent's tools. The
    other's tool of that name is left out, said so. (Which server a name means must not turn
    on which worker lists: a call of it goes where the definition says, with arguments the
    model meant for the tool it had seen.)"""
    tools = list(spec.tools)
    own = {t.name for t in tools}
    size = json_size(spec)
    problems: list[tuple[str, str]] = []
    offered: list[tuple[str, ToolSpec]] = []
    for server, specs in listed:
        for t in specs:
            squatted = next(
                (
                    (other, p)
                    for other, p in prefixes
                    if other != server and p and t.name.startswith(p)
                ),
                None,
            )
            if squatted is not None:
                problems.append(
                    (
                        server,
                        f"tool {t.name!r} left out: its name is in the prefix {squatted[1]!r} "
                        f"of MCP server {squatted[0]!r}",
                    )
                )
                continue
            if t.name in own:
                problems.append(
                    (server, f"tool {t.name!r} left out: the agent has a tool of that name")
                )
                continue
            offered.append((server, t))
    # Who lists each name, in the agent's order; and whose it is.
    listers: dict[str, list[str]] = {}
    for server, t in offered:
        listers.setdefault(t.name, []).append(server)
    for server, t in offered:
        servers = listers[t.name]
        kept = (owners or {}).get(t.name)
        owner = kept if kept in servers else servers[0]
        if owner != server:
            why = (
                "this conversation has it from there"
                if owner == kept
                else "comes before this one in the agent's tools"
            )
            problems.append(
                (
                    server,
                    f"tool {t.name!r} left out: MCP server {owner!r} lists a tool of that name "
                    f"too, and {why}; give one of them a prefix (mcp_tools(prefix=...))",
                )
            )
            continue
        grows = json_size(t) + 1
        if size + grows > DOOR.spec:
            problems.append(
                (
                    server,
                    f"tool {t.name!r} left out: the agent's definition would pass its "
                    f"{DOOR.spec // KiB} KiB budget",
                )
            )
            continue
        tools.append(t)
        size += grows
    merged = spec.model_copy(update={"tools": tools})
    merged.digest = spec_digest(merged)
    return merged, problems


def _json_object(texts: list[str]) -> JsonObject | None:
    if len(texts) != 1 or not texts[0].lstrip().startswith("{"):
        return None
    try:
        value = json.loads(texts[0])
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser takes
        return None
    return value if isinstance(value, dict) else None

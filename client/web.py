"""The HTTP face of the product: AG-UI for every agent, an approvals API, an approver's inbox.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.web``.

``agents_app(client)`` is a Starlette application (a FastAPI app can ``mount`` it); uvicorn
serves it (``serve()``, or ``python -m temporal_agent_interrupts.client.web``). It holds no state
of its own beyond the streams it is sending: every answer goes through the conversation's own
checks, every read comes from Temporal.

Routes:
    ``POST /agui/{agent}``                     AG-UI 1.0 runs (see ``client/agui.py``)
    ``GET  /api/inbox``                        chats paused on a human, a page at a time
                                               (``?agent=&approver=&limit=&cursor=``)
    ``GET  /api/chats/{chat_id}/pending``      one chat's pending calls
    ``GET  /api/chats/{chat_id}/audit``        its audit trail
    ``POST /api/chats/{chat_id}/interrupts/{ref}``   answer one call (an approval may carry
                                               ``remember``, a grant's scope)
    ``GET  /api/chats/{chat_id}/grants``       its grants in force (remembered decisions)
    ``POST /api/chats/{chat_id}/grants/{grant_id}/revoke``   end one (body: optional reason)
    ``GET  /api/whoami``                       who this request answers as
    ``GET  /inbox``                            the approver's inbox page
    ``GET  /answer/{token}``                   an email link's answer view (``link_keys=``)
    ``POST /answer/{token}``                   its one answer (see ``client/answer_view.py``)
    ``POST /slack/interactivity``              Slack's button clicks (``slack=``)
    ``GET  /.well-known/agent-receipt-keys.json``   the workers' receipt keys, a JWK Set
                                               (``receipt_jwks=``; public keys only)

Who answers comes from the request, never from the body: a login the application verifies
and the app turns into one short assertion per answer (``identity=LoginExchange(...)``, see
``client/login.py``, for agents with ``trust=``: the login itself never reaches a
conversation), a bearer token that is already a per-answer token of the agent's issuer, passed
on as the answer's identity token (``identity="bearer"``), or the application's own function of
the request. With none, answers are refused, unless the app was made with
``dev_loopback=True``: then it serves loopback clients only and takes the identity from the
``X-Agent-Identity`` header (for trying it out on one machine).

Refusals are ``application/problem+json`` (RFC 9457) with the product's reason as ``detail``
and its kind as ``code``: 400 malformed, 401 no identity, 403 not allowed, 404 no such chat or
call, 409 not now (answered already, edited since shown, busy, closed), 413 too large, 415 not
JSON, 421 a Host this app does not answer to, 422 an answer that does not fit, 429 too many
streams of one requester on one chat, 503 no worker answered. Within an AG-UI stream a refusal
is a ``RUN_ERROR`` with the same reason and code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import inspect
import ipaddress
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from ag_ui.core import MessagesSnapshotEvent, RunAgentInput
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import RPCError, WorkflowExecutionStatus
from temporalio.service import RPCStatusCode

from temporal_agent_interrupts.client import agui
from temporal_agent_interrupts.client.api import WORKER_TIMEOUT, AgentClient, Chat
from temporal_agent_interrupts.client.inbox import MAX_PAGE_SIZE, PAGE_SIZE, check_agent_name
from temporal_agent_interrupts.client.login import Login, LoginExchange, check_per_answer
from temporal_agent_interrupts.client.stream import EventsGone, TurnStream, follow, next_offset
from temporal_agent_interrupts.errors import (
    AgentError,
    CancelRejected,
    ChatNotFound,
    GrantRejected,
    NoWorkerAnswered,
    ResumeRejected,
    SendRejected,
    UnknownAgent,
    rpc_error,
)
from temporal_agent_interrupts.http_rules import (
    LOOPBACK_NAMES,
    cors_headers,
    host_allowed,
    origin,
    site_origins,
)
from temporal_agent_interrupts.http_server import ConnectionLimits
from temporal_agent_interrupts.workflows.config import AGENT_NAME
from temporal_agent_interrupts.workflows.details import truncate, visible
from temporal_agent_interrupts.workflows.identity import MAX_BOUND_CALLS
from temporal_agent_interrupts.workflows.limits import DOOR, KiB, MiB
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    GrantScope,
    HistoryResult,
    InterruptRequest,
    JsonObject,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnEvent,
    TurnResult,
    answer_digest,
    remember_digest,
)

if TYPE_CHECKING:
    # client.slack imports this module; the app only calls what it is given.
    from temporal_agent_interrupts.client.slack import SlackInteractivity

log = logging.getLogger(__name__)

IdentityFunction = Callable[[Request], "str | Awaitable[str | None] | None"]
"""The application's own answer to "who is this?": the identity on record, or None to refuse."""

Action = Literal["send", "answer", "read", "inbox"]


class Access(BaseModel):
    """What a request is about to do, for the application's ``authorize`` function.

    ``send``: start a run with a user message (AG-UI); ``answer``: answer interrupts (AG-UI
    resume entries or the approvals API), ``identity`` is who; ``read``: a chat's messages,
    pending calls, audit trail or stream; ``inbox``: the list of paused chats (``chat_id`` is
    None, ``agent`` the filter asked for).
    """

    model_config = ConfigDict(frozen=True)

    action: Action
    chat_id: str | None = None
    agent: str | None = None
    identity: str | None = None


Authorize = Callable[[Request, Access], "bool | Awaitable[bool]"]
"""The application's own rule: may this request do that? False is a 403; so is raising
:class:`Forbidden`, whose reason the 403 carries."""


class Forbidden(Exception):
    """Raised by an ``authorize`` function to refuse with a reason the caller is shown.

    ``raise Forbidden("answers on payments chats need the payments-approvers group")`` makes a
    403 whose ``detail`` ends with that reason (control characters escaped, cut to
    :data:`MAX_REASON` characters), where returning False says only what was refused. Where
    the app only filters (the inbox's chats, an answer's readable result) it counts as False.
    Returned instead of raised, it refuses the same (an exception is truthy: it would allow).
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


MAX_REASON = 300
"""The most of a :class:`Forbidden` reason a refusal shows (it is the application's text, but
it goes back to whoever was refused)."""

DEV_IDENTITY_HEADER = "x-agent-identity"
DEV_IDENTITY = "dev@localhost"
"""The identity in ``dev_loopback`` mode when the request names none."""

MAX_BODY = 2 * MiB
"""The default limit on a request body. An AG-UI client sends the whole conversation with
every run, so this is more than one answer needs (an answer's own limit, 1 MiB, still holds)."""

INBOX_PAGE = PAGE_SIZE
"""Chats one ``GET /api/inbox`` lists unless ``limit`` says otherwise (``next_cursor`` goes on)."""

STREAMS_PER_CHAT = 2
"""Streams one requester may have open on one chat through this app at once. Each follows the
conversation with updates its history records; the conversation itself admits four followers.
Counted per requester (see ``_App.requester``), so nobody's streams take a chat's from another:
two reconnects of one user locked every other user of the chat out (429) when they were
counted per chat."""

REATTACH_WAIT = timedelta(seconds=30)
"""How long a stream waits for a run that has not begun (a reconnect to an idle thread's next
run, a connect to a turn that has published nothing yet) before it ends, and the client
reconnects with its ``Last-Event-ID``. Such a stream can only ask, by query, whether the run
has begun (see ``_App._follow_run``): without an end, 20 of them asked 74.5 times a second for
as long as their clients stayed, and took 28% of a core."""

HEADER_DEADLINE = 10.0
"""Seconds a request has, from its first byte, to send its whole request line and headers:
uvicorn sets none (any byte resets its keep-alive timer), so a connection that never finishes
one would hold its place for ever, and :data:`CONNECTIONS` of them answer everyone else 503."""

KEEP_ALIVE_SECONDS = 5.0
"""Seconds a connection may stay open with no request begun (a new one, or one kept alive
between requests), up to :data:`HEADER_DEADLINE`."""

MAX_HEADER_BYTES = 64 * KiB
"""The request line and headers, in bytes (431 past it)."""

MAX_HEADERS = 100
"""Header fields in one request (431 past it)."""

BODY_DEADLINE = 30.0
"""Seconds a request has to send its whole body (at most ``max_body``)."""

CONNECTIONS = 4096
"""Connections (and requests in flight) the app takes at once, fewer if the open-file limit
leaves room for fewer (``http_server.file_room``, which raises the soft limit to the hard one
first); past it, a 503 that says the server is full. Each AG-UI stream holds one for as long as
it follows its run: at 1,000, a thousand streams left no room for an inbox page. Per-client
limits are a reverse proxy's work: deploy one in front of anything beyond loopback."""


FOLLOW_CHECK_SECONDS = 0.5
"""How soon a stream with nothing to send first asks where its conversation stands (by query:
its history records nothing of it; a stream waiting for a run to begin asks the server first
whether the history has grown, and the worker only if it has); each time nothing has changed,
it waits twice as long, up to :data:`FOLLOW_CHECK_MAX_SECONDS`."""

FOLLOW_CHECK_MAX_SECONDS = 8.0
"""The longest a stream with nothing to send waits between two asks."""

# How often an answer pinned to a checked run is checked and sent again when that run refused
# it as closed: a continue-as-new in between moves the chat to a new run once.
_PINNED_TRIES = 5

# How many times an AG-UI connect reads where its thread stands when the running turn it saw
# ends between its reads (see _App._where_it_stands).
_CONNECT_TRIES = 3

# A chat id or a ref in a path: printable, no control characters, bounded (a workflow id is at
# most 1,000 bytes on the server; refs are far shorter).
_ID = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]{1,400}")

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

PROBLEM_TYPE = "application/problem+json"

_STATUS_OF_CODE = {"invalid": 422, "forbidden": 403, "conflict": 409, "not_found": 404}


class Problem(Exception):
    """A refused request: its HTTP status, a short code, and the reason."""

    def __init__(self, status: int, code: str, detail: str, *, title: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title or _TITLES.get(status, "Refused")


_TITLES = {
    400: "Bad request",
    401: "Who are you?",
    403: "Not allowed",
    404: "Not found",
    409: "Conflict",
    408: "Too slow",
    413: "Too large",
    415: "Not JSON",
    421: "Wrong host",
    422: "Does not fit",
    429: "Too many streams",
    500: "Internal error",
    502: "Temporal refused",
    503: "No worker answered",
}


def problem_response(problem: Problem) -> JSONResponse:
    return JSONResponse(
        {
            "type": "about:blank",
            "title": problem.title,
            "status": problem.status,
            "detail": problem.detail,
            "code": problem.code,
        },
        status_code=problem.status,
        media_type=PROBLEM_TYPE,
    )


def agent_problem(error: AgentError) -> Problem:
    """A typed error of the product as an HTTP refusal."""
    reason = str(error)
    if isinstance(error, ChatNotFound):
        return Problem(404, "not_found", reason)
    if isinstance(error, UnknownAgent):
        return Problem(404, "unknown_agent", reason)
    if isinstance(error, NoWorkerAnswered):
        return Problem(503, "no_worker", reason)
    if isinstance(error, ResumeRejected):
        code = error.code or "invalid"
        return Problem(_STATUS_OF_CODE.get(code, 422), code, reason)
    if isinstance(error, GrantRejected):
        # No grant with that id in force: 404; a malformed id or reason: 422.
        code = error.code or "invalid"
        return Problem(_STATUS_OF_CODE.get(code, 422), code, reason)
    if isinstance(error, (SendRejected, CancelRejected)):
        return Problem(409, "conflict", reason)
    return Problem(502, "temporal", reason, title="Temporal refused")


# ----------------------------------------------------------------------------------------------
# Bodies.


class AnswerBody(BaseModel):
    """An approver's answer to one call (``POST /api/chats/{chat_id}/interrupts/{ref}``)."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["approve", "deny", "respond", "edit"]
    input_digest: str = Field(min_length=1, max_length=128)
    """The digest of the input the approver was shown (the inbox entry's ``input_digest``)."""
    output: JsonObject | None = None
    input: JsonObject | None = None
    reason: str = Field(default="", max_length=1024)
    metadata: JsonObject | None = None
    remember: GrantScope | None = None
    """With ``approve`` only: also grant, for the calls of the tool in this scope (the
    conversation checks it: only an approver of a gated call may grant)."""


class RevokeGrantBody(BaseModel):
    """``POST /api/chats/{chat_id}/grants/{grant_id}/revoke``: why, for the audit log."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=1024)


REVOKE_BODY = 4 * KiB
"""The most a revoke's body may be: a reason of 1,024 characters, escaped, and its braces."""


async def read_body(request: Request, *, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes, whatever Content-Length says."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Problem(400, "bad_length", "Content-Length is not a number")
        if int(declared[:20]) > limit:
            raise Problem(413, "too_large", f"the body is over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_DEADLINE):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise Problem(413, "too_large", f"the body is over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise Problem(
            408, "too_slow", f"the body did not arrive within {BODY_DEADLINE:g} s"
        ) from None
    except ClientDisconnect:
        # The client went away before its body was in: nothing failed here, and nobody is
        # left to read a response (it was logged as an internal error).
        raise Problem(400, "disconnected", "the client went away before its body arrived") from None
    return b"".join(chunks)


async def read_json(request: Request, *, limit: int) -> Any:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise Problem(415, "not_json", "send the body as application/json")
    raw = await read_body(request, limit=limit)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Problem(400, "malformed_json", f"the body is not JSON: {e}") from None
    except RecursionError:
        raise Problem(400, "malformed_json", "the body nests too deeply") from None
    except ValueError:
        # Not a JSONDecodeError: an integer past Python's digit limit (sys.int_info's
        # default_max_str_digits, 4,300), which json.loads refuses only as it converts it.
        raise Problem(
            400, "malformed_json", "the body holds a number with too many digits"
        ) from None


def _path_id(value: str, *, what: str) -> str:
    if not _ID.fullmatch(value):
        raise Problem(400, "bad_id", f"{what} is empty, too long or holds control characters")
    return value


def _validation_problem(error: ValidationError, *, what: str) -> Problem:
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
    where = ".".join(str(p) for p in first.get("loc", ())) or "the body"
    return Problem(400, "malformed", f"{what}: {where}: {first.get('msg')}")


# ----------------------------------------------------------------------------------------------
# Host, CORS and loopback: the codec server's rules, as ASGI middleware.


def _loopback_client(scope: Scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


PROXY_HEADERS = ("forwarded", "x-real-ip", "via", "client-ip", "true-client-ip")
"""Headers a proxy adds (with every ``x-forwarded-*``): in dev mode a request with any of them
came through one, and a proxy on the same machine makes every client look like loopback."""


def _not_direct_loopback(scope: Scope, headers: list[tuple[str, str]]) -> str | None:
    """Why a request is not one a program on this machine sent straight to the app (None: it
    is), for ``dev_loopback``, which takes anyone's word for who they are.

    A reverse proxy on the same host connects from loopback: nginx's default ``proxy_pass``
    adds no ``X-Forwarded-For`` and sends ``Host`` as the upstream's own address, so neither
    the peer address nor the Host tells its clients from local ones. What it does leave:
    nginx speaks HTTP/1.0 to an upstream unless told otherwise, and most proxies add one of
    :data:`PROXY_HEADERS` or an ``X-Forwarded-*``. A request with either is refused. A proxy
    that adds nothing and speaks HTTP/1.1 cannot be told apart: ``docs/security.md`` says so.
    """
    names = {k for k, _ in headers}
    found = sorted(n for n in names if n in PROXY_HEADERS or n.startswith("x-forwarded-"))
    if found:
        return f"it came through a proxy ({', '.join(found)[:200]})"
    if scope.get("http_version") == "1.0":
        return "it is HTTP/1.0, which a proxy (nginx's default) speaks, not a browser"
    if not _loopback_client(scope):
        return "it did not come from this machine"
    return None


class _Guard:
    """Answers only requests whose ``Host`` names this app; CORS for the origins given only;
    in ``dev_loopback`` mode, loopback clients only."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: frozenset[str],
        origins: frozenset[str],
        loopback_only: bool,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        hosts = [v for k, v in headers if k == "host"]
        if len(hosts) != 1 or not self._host_allowed(hosts[0]):
            await problem_response(
                Problem(421, "wrong_host", "this app does not answer to that Host")
            )(scope, receive, send)
            return
        if self.loopback_only:
            refused = _not_direct_loopback(scope, headers)
            if refused is not None:
                await problem_response(
                    Problem(
                        403,
                        "not_loopback",
                        f"this app serves loopback clients only, directly (dev mode): {refused}",
                    )
                )(scope, receive, send)
                return
        origins = [v for k, v in headers if k == "origin"]
        cors = self._cors(origins)
        if scope["method"] == "OPTIONS":
            status = 204 if cors else 403
            await Response(status_code=status, headers=dict(cors))(scope, receive, send)
            return
        if origins and not cors and not self._same_origin(origins[0], hosts[0], scope):
            # A browser page of another origin: refused outright, not just unreadable, since a
            # simple POST would otherwise still act.
            await problem_response(
                Problem(403, "origin", "requests from this origin are not allowed")
            )(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message["headers"] = [
                    *message.get("headers", []),
                    *((k.lower().encode(), v.encode()) for k, v in cors),
                ]
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _host_allowed(self, host: str) -> bool:
        return host_allowed(host, self.hosts)

    def _same_origin(self, sent: str, host: str, scope: Scope) -> bool:
        scheme = scope.get("scheme", "http")
        return origin(sent).lower() == f"{scheme}://{host.strip().lower()}"

    def _cors(self, origins: list[str]) -> list[tuple[str, str]]:
        return cors_headers(
            origins,
            self.origins,
            methods="GET, POST, OPTIONS",
            headers="authorization, content-type, last-event-id",
        )


# ----------------------------------------------------------------------------------------------
# The app.


class _Identity(BaseModel):
    identity: str | None = None
    token: str | None = Field(default=None, repr=False)
    # A verified login, exchanged for one assertion per answer (never sent itself).
    login: Login | None = None

    @property
    def carries_token(self) -> bool:
        """Whether what is sent for this requester holds an identity token."""
        return self.token is not None or self.login is not None


class _App:
    def __init__(
        self,
        client: AgentClient,
        *,
        identity: Literal["bearer"] | LoginExchange | IdentityFunction | None,
        dev_loopback: bool,
        max_body: int,
        streams_per_chat: int,
        reattach_wait: timedelta,
        worker_timeout: timedelta | None,
        authorize: Authorize | None,
        token_queues: Sequence[str] | None,
        inbox_queues: Sequence[str] | Literal["any"] | None = None,
    ) -> None:
        self.client = client
        self.inbox_queues = inbox_queues
        self.authorize = authorize
        self.token_queues = None if token_queues is None else frozenset(token_queues)
        self.identity = identity
        self.dev = dev_loopback
        self.max_body = max_body
        self.streams_per_chat = streams_per_chat
        self.reattach_wait = reattach_wait
        self.worker_timeout = worker_timeout
        # Open streams by (chat, requester).
        self.streams: Counter[tuple[str, str]] = Counter()

    @property
    def mode(self) -> str:
        if isinstance(self.identity, LoginExchange):
            return "login"
        if self.identity == "bearer":
            return "bearer"
        if self.identity is not None:
            return "function"
        return "dev" if self.dev else "none"

    async def who(self, request: Request) -> _Identity:
        """Who this request answers as.

        Raises:
            Problem: 401, no identity could be had from it.
        """
        if isinstance(self.identity, LoginExchange):
            login = await self.identity.login(request)
            if login is None:
                raise Problem(401, "no_identity", "this request's login was not accepted")
            return _Identity(identity=login.identity, login=login)
        if self.identity == "bearer":
            found = request.headers.get("authorization", "")
            scheme, _, token = found.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Problem(401, "no_identity", "send Authorization: Bearer <identity token>")
            token = token.strip()
            if len(token) > 16 * KiB:
                raise Problem(400, "malformed", "the bearer token is over 16 KiB")
            try:
                check_per_answer(token)
            except ValueError as e:
                raise Problem(401, "not_per_answer", str(e)) from None
            return _Identity(token=token)
        if callable(self.identity):
            given = self.identity(request)
            name = await given if inspect.isawaitable(given) else given
            if not name:
                raise Problem(401, "no_identity", "this request does not say who answers")
            return _Identity(identity=name)
        if self.dev:
            name = request.headers.get(DEV_IDENTITY_HEADER, "").strip() or DEV_IDENTITY
            return _Identity(identity=name[:256])
        raise Problem(
            401,
            "no_identity",
            "this app has no way to know who answers: make it with identity='bearer' or an "
            "identity function (or dev_loopback=True, on one machine)",
        )

    async def allow(self, request: Request, access: Access) -> None:
        """Ask the application's ``authorize``, if it gave one.

        Raises:
            Problem: 403, it said no.
        """
        refused = await self._refusal(request, access)
        if refused is not None:
            what = f" on chat {access.chat_id[:100]!r}" if access.chat_id else ""
            because = f": {refused}" if refused else ""
            raise Problem(403, "forbidden", f"not allowed to {access.action}{what}{because}")

    async def permits(self, request: Request, access: Access) -> bool:
        """What the application's ``authorize`` says (yes, when it gave none)."""
        return await self._refusal(request, access) is None

    async def _refusal(self, request: Request, access: Access) -> str | None:
        """None when ``authorize`` allows ``access``; else the reason it gave ("" for none),
        shown as text and bounded."""
        if self.authorize is None:
            return None
        try:
            said = self.authorize(request, access)
            if inspect.isawaitable(said):
                said = await said
            if isinstance(said, Forbidden):
                # Returned for raised, an easy slip: an exception is truthy, so it would allow.
                raise said
            if isinstance(said, BaseException):
                return ""
            allowed = bool(said)
        except Forbidden as e:
            # Cut before escaping, so a huge reason costs nothing; escapes lengthen it, cut again.
            reason = str(e.reason)
            return truncate(visible(reason[: MAX_REASON + 1]), MAX_REASON)
        return None if allowed else ""

    def chat(self, chat_id: str, agent: str = "") -> Chat:
        return Chat(self.client, agent=agent, chat_id=chat_id)

    async def may_receive_token(self, chat: Chat) -> str:
        """Before anything of a request that carries an identity token reaches ``chat``: that
        it runs on a task queue the app trusts. Whoever polls a chat's task queue answers its
        queries and takes its updates, token and all, and polling any queue is a worker's right
        (a program of one's own, with a workflow named AgentWorkflow, on a queue of its own):
        an approver's fresh token sent there could be shown to every real conversation that
        trusts the same issuer. The task queue comes from the server, not from a worker.

        Returns the run that was checked: the token goes to that run only (``run_id=``), since
        by the time it is sent another run may hold the chat's id (terminated and started again
        on another queue by anyone with namespace write access).

        Raises:
            Problem: 403, the chat runs elsewhere; 404, there is no such chat.
        """
        try:
            described = await chat.handle.describe()
        except RPCError as e:
            raise rpc_error(e, chat.id) from e
        trusted = (
            frozenset([self.client.task_queue]) if self.token_queues is None else self.token_queues
        )
        if described.task_queue not in trusted:
            raise Problem(
                403,
                "forbidden",
                f"chat {chat.id[:100]!r} runs on task queue {described.task_queue[:200]!r}, which "
                "this app does not send identity tokens to (agents_app(token_queues=...))",
            )
        return described.run_id or ""

    def token_for(
        self,
        who: _Identity,
        chat: Chat,
        calls: dict[str, str],
        remember: dict[str, str] | None = None,
        answers: Sequence[ToolResponse | ToolRestart] = (),
    ) -> str | None:
        """The identity token an answer to ``calls`` (ref: the input digest shown) carries: the
        bearer token as sent, or, for a login, an assertion made for that answer alone (each
        call's answer in ``answers``, by its digest), and for the grant it asks for
        (``remember``, ref: the scope's digest), if any.

        Raises:
            Problem: 422, an answer that cannot be written as JSON (too deep: the conversation
                would refuse it anyway), so no assertion can name it.
        """
        if who.login is not None:
            assert isinstance(self.identity, LoginExchange)
            if len(calls) > MAX_BOUND_CALLS:
                raise Problem(
                    400,
                    "malformed",
                    f"answer at most {MAX_BOUND_CALLS} calls at once behind a login (one "
                    f"assertion each time; {len(calls)} were given)",
                )
            try:
                named = {a.ref: answer_digest(a) for a in answers}
            except (ValueError, RecursionError):
                raise Problem(
                    422, "invalid", "the answer cannot be written as JSON (nested too deep)"
                ) from None
            return self.identity.assertion(
                who.login, chat_id=chat.id, calls=calls, remember=remember, answers=named
            )
        return who.token

    async def answer_as(
        self,
        chat: Chat,
        who: _Identity,
        answer: ToolResponse | ToolRestart,
        digest: str,
        *,
        remember: dict[str, str] | None = None,
        metadata: JsonObject | None = None,
    ) -> TurnResult:
        """Send ``answer`` (to the call of the input whose ``digest`` was shown) as ``who``:
        with the token for it (:meth:`token_for`), to the run whose queue was checked
        (:meth:`resume_checked`). The one answer path of the approvals API and the answer
        links."""
        token = self.token_for(who, chat, {answer.ref: digest}, remember, [answer])
        return await self.resume_checked(
            chat,
            who,
            lambda run_id: chat.resume(
                answers=[answer],
                identity=who.identity,
                identity_token=token,
                metadata=metadata,
                worker_timeout=self.worker_timeout,
                run_id=run_id,
            ),
        )

    async def resume_checked(
        self, chat: Chat, who: _Identity, send: Callable[[str | None], Awaitable[Any]]
    ) -> Any:
        """``send(run_id)``, pinned to the run whose task queue was checked when the answer
        carries a token. A run that continued as new in between refuses it as closed: the chat's
        new run is checked and sent to (a few times at most), never an unchecked one."""
        if not who.carries_token:
            return await send(None)
        refused: SendRejected | None = None
        tried: str | None = None
        for attempt in range(_PINNED_TRIES):
            run_id = await self.may_receive_token(chat)
            if refused is not None and run_id == tried:
                if attempt < _PINNED_TRIES - 1 and await _still_running(chat):
                    # Refused while its continue-as-new was completing: the next run is
                    # there in milliseconds.
                    await asyncio.sleep(0.05 * attempt)
                    continue
                raise refused  # the run that was checked is closed, and no other took over
            try:
                return await send(run_id)
            except SendRejected as e:
                refused, tried = e, run_id
        assert refused is not None
        raise refused

    async def requester(self, request: Request, who: _Identity | None) -> str:
        """Whom a stream is counted against: the identity the app's mode reads from the
        request (a bearer token by its digest), else the client's address.

        Asked of every run, reads included: a read needs no identity (a 401 here is only no
        identity to count by), but an application that says who is asking is the one place
        that tells two users behind one proxy apart.
        """
        if who is None and self.mode != "none":
            with contextlib.suppress(Problem):
                who = await self.who(request)
        if who is not None and who.identity:
            return "identity:" + who.identity
        if who is not None and who.token:
            return "token:" + hashlib.sha256(who.token.encode()).hexdigest()
        return "address:" + (request.client.host if request.client else "")

    @property
    def trusted_queues(self) -> list[str]:
        """The task queues whose chats this app lists: its client's, and those it sends
        identity tokens to."""
        return sorted({self.client.task_queue, *(self.token_queues or ())})

    @contextlib.contextmanager
    def stream_slot(self, chat_id: str, requester: str) -> Any:
        key = (chat_id, requester)
        if self.streams[key] >= self.streams_per_chat:
            raise Problem(
                429,
                "too_many_streams",
                f"you have {self.streams_per_chat} streams open on chat {chat_id[:100]!r} "
                "through this app; close one first",
            )
        self.streams[key] += 1
        try:
            yield
        finally:
            self.streams[key] -= 1
            if not self.streams[key]:
                del self.streams[key]

    # -- the approvals API -------------------------------------------------------------------

    async def whoami(self, request: Request) -> Response:
        try:
            who = await self.who(request)
            name = "(identity token)" if who.token is not None else who.identity
        except Problem:
            name = None
        return JSONResponse({"identity": name, "mode": self.mode})

    async def inbox(self, request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        approver = request.query_params.get("approver") or None
        for value, what in ((agent, "agent"), (approver, "approver")):
            if value is not None and (len(value) > 256 or not _ID.fullmatch(value)):
                raise Problem(400, "malformed", f"{what} is too long or holds control characters")
        if agent is not None:
            try:
                check_agent_name(agent)
            except ValueError as e:
                raise Problem(400, "malformed", str(e)) from None
        limit_given = request.query_params.get("limit") or str(INBOX_PAGE)
        if not limit_given.isdigit() or not 1 <= int(limit_given[:6]) <= MAX_PAGE_SIZE:
            raise Problem(400, "malformed", f"limit is a number from 1 to {MAX_PAGE_SIZE}")
        cursor = request.query_params.get("cursor") or None
        await self.allow(request, Access(action="inbox", agent=agent))
        try:
            page = await self.client.pending_page(
                agent=agent,
                approver=approver,
                # The queues this deployment's workers poll: a chat started anywhere else was
                # written by its starter, memo and all (unless the app was told otherwise).
                task_queues=self.inbox_queues or self.trusted_queues,
                limit=int(limit_given),
                cursor=cursor,
            )
        except ValueError as e:  # a cursor this app never handed out
            raise Problem(400, "malformed", str(e)) from None
        except RPCError as e:  # the visibility query itself (a namespace, credentials)
            raise rpc_error(e, "") from e
        # A chat is listed only to a caller who may read it: its entries hold the calls'
        # inputs, as its /pending does.
        shown = [
            c
            for c in page.chats
            if await self.permits(request, Access(action="read", chat_id=c.chat_id, agent=c.agent))
        ]
        return JSONResponse(
            {"chats": [c.model_dump(mode="json") for c in shown], "next_cursor": page.next_cursor}
        )

    async def agent_of(self, chat_id: str) -> str | None:
        """The agent a chat belongs to, for :class:`Access` (its ``AgentName`` search
        attribute, from the server: no worker is asked). None when there is no such chat: the
        rule is asked anyway, and the request then finds no chat (a 404 told before the rule
        would tell whoever may not read it which chats exist)."""
        try:
            described = await self.chat(chat_id).handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise rpc_error(e, chat_id) from e
        return described.typed_search_attributes.get(AGENT_NAME)

    async def pending(self, request: Request) -> Response:
        chat_id = _path_id(request.path_params["chat_id"], what="the chat id")
        agent = await self.agent_of(chat_id)
        await self.allow(request, Access(action="read", chat_id=chat_id, agent=agent))
        interrupts = await self.chat(chat_id).pending(worker_timeout=self.worker_timeout)
        return JSONResponse(
            {"chat_id": chat_id, "interrupts": [i.model_dump(mode="json") for i in interrupts]}
        )

    async def audit(self, request: Request) -> Response:
        chat_id = _path_id(request.path_params["chat_id"], what="the chat id")
        agent = await self.agent_of(chat_id)
        await self.allow(request, Access(action="read", chat_id=chat_id, agent=agent))
        report = await self.client.audit_report(chat_id)
        return JSONResponse({"chat_id": chat_id, **report.model_dump(mode="json")})

    async def answer(self, request: Request) -> Response:
        chat_id = _path_id(request.path_params["chat_id"], what="the chat id")
        ref = _path_id(request.path_params["ref"], what="the ref")
        raw = await read_json(request, limit=min(self.max_body, DOOR.resume))
        try:
            body = AnswerBody.model_validate(raw)
        except ValidationError as e:
            raise _validation_problem(e, what="the answer") from None
        who = await self.who(request)
        agent = await self.agent_of(chat_id)
        await self.allow(
            request, Access(action="answer", chat_id=chat_id, agent=agent, identity=who.identity)
        )
        # What the turn did next (its text, the calls it paused on and their inputs) is the
        # chat's to read: a caller who may answer but not read learns only how it ended.
        readable = await self.permits(
            request, Access(action="read", chat_id=chat_id, agent=agent, identity=who.identity)
        )
        chat = self.chat(chat_id)
        if who.carries_token:
            await self.may_receive_token(chat)
        status = await chat.status(worker_timeout=self.worker_timeout)
        request_for = pending_call(status, ref)
        shown = request_for.model_copy(update={"input_digest": body.input_digest})
        answer = _answer_of(body, shown)
        remember = {ref: remember_digest(body.remember)} if body.remember is not None else None
        result = await self.answer_as(
            chat, who, answer, body.input_digest, remember=remember, metadata=body.metadata
        )
        if not readable:
            withheld = result.model_copy(
                update={
                    "text": "",
                    "interrupts": [],
                    "error": None,
                    "interrupts_omitted": result.interrupts_omitted + len(result.interrupts),
                }
            )
            return JSONResponse(
                {
                    "chat_id": chat_id,
                    "receipt": result.receipt,
                    "result": withheld.model_dump(mode="json"),
                    "result_withheld": True,
                }
            )
        # The decision's receipt id (None: the worker issued none): what an approver keeps to
        # find the decision in an exported chain (agentctl audit --export, agentctl verify).
        result_json = result.model_dump(mode="json")
        return JSONResponse({"chat_id": chat_id, "receipt": result.receipt, "result": result_json})

    async def grants(self, request: Request) -> Response:
        """The chat's grants in force: a read, as its pending calls are."""
        chat_id = _path_id(request.path_params["chat_id"], what="the chat id")
        agent = await self.agent_of(chat_id)
        await self.allow(request, Access(action="read", chat_id=chat_id, agent=agent))
        if agent is None:
            # grants() answers [] for a chat that is gone or closed; no such chat is a 404.
            raise Problem(404, "not_found", f"no chat {chat_id[:100]!r}")
        held = await self.chat(chat_id).grants(worker_timeout=self.worker_timeout)
        return JSONResponse(
            {"chat_id": chat_id, "grants": [g.model_dump(mode="json") for g in held]}
        )

    async def revoke_grant(self, request: Request) -> Response:
        """End one grant. Authorized as an answer (revoking narrows what runs unasked, but it
        still changes what the conversation does, and its record names who did it): the
        identity on record is the request's, when the app's mode has one (a bearer token is
        the agent's to verify, and a revoke carries none: it is recorded with no identity)."""
        chat_id = _path_id(request.path_params["chat_id"], what="the chat id")
        grant_id = _path_id(request.path_params["grant_id"], what="the grant id")
        raw = await read_json(request, limit=min(self.max_body, REVOKE_BODY))
        try:
            body = RevokeGrantBody.model_validate(raw)
        except ValidationError as e:
            raise _validation_problem(e, what="the revoke") from None
        who = await self.who(request)
        agent = await self.agent_of(chat_id)
        await self.allow(
            request, Access(action="answer", chat_id=chat_id, agent=agent, identity=who.identity)
        )
        remaining = await self.chat(chat_id).revoke_grant(
            grant_id,
            reason=body.reason,
            identity=who.identity,
            worker_timeout=self.worker_timeout,
        )
        return JSONResponse(
            {
                "chat_id": chat_id,
                "revoked": grant_id,
                "grants": [g.model_dump(mode="json") for g in remaining],
            }
        )

    # -- AG-UI ---------------------------------------------------------------------------------

    async def agui_run(self, request: Request) -> Response:
        agent = request.path_params["agent"]
        try:
            check_agent_name(agent)
        except ValueError as e:
            raise Problem(400, "malformed", str(e)) from None
        raw = await read_json(request, limit=self.max_body)
        try:
            run = RunAgentInput.model_validate(raw)
        except ValidationError as e:
            raise _validation_problem(e, what="the run input") from None
        thread_id = _path_id(run.thread_id, what="threadId")
        # Echoed in every frame: checked before anything is sent, since one that cannot be
        # encoded (a lone surrogate) broke the stream only once its run had started.
        _path_id(run.run_id, what="runId")
        last_id = request.headers.get("last-event-id")
        resume_from: tuple[int, agui.FramePos] | None = None
        if last_id is not None:
            try:
                resume_from = agui.parse_frame_id(last_id)
            except ValueError as e:
                raise Problem(400, "malformed", str(e)) from None
        answering = bool(run.resume) and resume_from is None
        who = await self.who(request) if answering else None
        sender: Login | None = None
        if answering:
            action: Action = "answer"
        elif resume_from is None and agui.user_text(run.messages) is not None:
            action = "send"
            # Behind a login, the message says who sends it (its turn's requester, verified by
            # an assertion made for this message alone); without one it names nobody, as ever.
            if isinstance(self.identity, LoginExchange):
                sender = await self.identity.login(request)
        else:
            action = "read"  # a reconnect: the thread's messages and stream
        await self.allow(
            request,
            Access(
                action=action,
                chat_id=thread_id,
                agent=agent,
                identity=who.identity if who else None,
            ),
        )
        # A send or an answer shows the thread's messages (a pause's snapshot, a repeat's) only
        # to a caller who may read it as well.
        readable = action == "read" or await self.permits(
            request,
            Access(
                action="read",
                chat_id=thread_id,
                agent=agent,
                identity=who.identity if who else None,
            ),
        )
        slot = self.stream_slot(thread_id, await self.requester(request, who))
        slot.__enter__()  # 429 now, before the stream starts; left in the stream's finally
        chat = self.chat(thread_id, agent)

        async def frames() -> AsyncIterator[str]:
            try:
                if resume_from is not None:
                    async for frame in self._reattach(chat, run, *resume_from):
                        yield frame
                elif run.resume:
                    assert who is not None
                    async for frame in self._resume(chat, run, who, show_messages=readable):
                        yield frame
                else:
                    async for frame in self._send_or_connect(
                        chat, run, show_messages=readable, sender=sender
                    ):
                        yield frame
            except Problem as p:
                yield agui.refusal(p.detail, p.code)
            except AgentError as e:
                p = agent_problem(e)
                yield agui.refusal(p.detail, p.code)
            except Exception:
                # Never a reason from inside: it may hold what the request should not see.
                log.exception("AG-UI run on chat %r failed", thread_id[:100])
                yield agui.refusal("internal error (logged by the app)", "internal")
            finally:
                slot.__exit__(None, None, None)

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _send_or_connect(
        self, chat: Chat, run: RunAgentInput, *, show_messages: bool, sender: Login | None = None
    ) -> AsyncIterator[str]:
        text = agui.user_text(run.messages)
        if text is None:
            async for frame in self._connect(chat, run):
                yield frame
            return
        token = await self.send_token(chat, sender, text) if sender is not None else None
        turn = chat.send_stream(
            text,
            message_id=agui.user_message_id(run.messages),
            identity_token=token,
            worker_timeout=self.worker_timeout,
        )
        await turn.accepted()
        async for frame in self._live(chat, run, turn.offset, turn, show_messages=show_messages):
            yield frame

    async def send_token(self, chat: Chat, sender: Login, text: str) -> str:
        """The assertion a logged-in user's message carries: made for this message in this
        chat alone (it answers nothing), sent only to a chat on a task queue the app trusts
        (``may_receive_token``). A chat that does not exist yet is started by this send on the
        app's own task queue."""
        assert isinstance(self.identity, LoginExchange)
        with contextlib.suppress(ChatNotFound):
            await self.may_receive_token(chat)
        return self.identity.send_assertion(sender, chat_id=chat.id, text=text)

    async def _resume(
        self, chat: Chat, run: RunAgentInput, who: _Identity, *, show_messages: bool
    ) -> AsyncIterator[str]:
        if who.carries_token:
            await self.may_receive_token(chat)
        _same_agent(chat, await chat.status(worker_timeout=self.worker_timeout))
        pending = {i.ref: i for i in await chat.pending(worker_timeout=self.worker_timeout)}
        if not pending:
            raise Problem(409, "conflict", "nothing is paused on this thread: nothing to resume")
        try:
            answers = [agui.to_answer(entry, pending) for entry in run.resume or ()]
        except agui.BadResume as e:
            raise Problem(_STATUS_OF_CODE.get(e.code, 422), e.code, str(e)) from None
        token = self.token_for(
            who,
            chat,
            {a.ref: a.input_digest or pending[a.ref].input_digest for a in answers},
            answers=answers,
        )

        async def accepted(run_id: str | None) -> TurnStream:
            turn = chat.resume_stream(
                answers=answers,
                identity=who.identity,
                identity_token=token,
                worker_timeout=self.worker_timeout,
                run_id=run_id,
            )
            await turn.accepted()
            return turn

        turn = await self.resume_checked(chat, who, accepted)
        async for frame in self._live(chat, run, turn.offset, turn, show_messages=show_messages):
            yield frame

    async def _live(
        self, chat: Chat, run: RunAgentInput, start: int, turn: TurnStream, *, show_messages: bool
    ) -> AsyncIterator[str]:
        frames = agui.RunFrames(
            thread_id=chat.id, run_id=run.run_id, start=start, show_messages=show_messages
        )
        try:
            for pos, event in frames.started():
                yield agui.encode(event, frames.frame_id(pos))
            try:
                async for event in turn:
                    async for frame in self._frames_of(chat, frames, event, turn=turn):
                        yield frame
            except AgentError:
                if frames.ended:
                    # Raised for a turn that already said how it ended (a new chat whose agent
                    # no worker hosts is closed after its failed turn_end): one terminal event.
                    return
                raise
            if not frames.ended:
                # Answers that left others pending: the turn stays paused, with no turn_end;
                # or a repeated message whose turn had stopped already.
                result = await turn.result()
                snapshot = await self._repeat_snapshot(chat, frames, result)
                for pos, ev in frames.finished(result, offset=frames.last, snapshot=snapshot):
                    yield agui.encode(ev, frames.frame_id(pos))
        finally:
            # A client that went away mid-run: the turn goes on; this stream stops waiting.
            await turn.close()

    async def _frames_of(
        self,
        chat: Chat,
        frames: agui.RunFrames,
        event: TurnEvent,
        *,
        after: agui.FramePos | None = None,
        turn: TurnStream | None = None,
    ) -> AsyncIterator[str]:
        out = frames.feed(event)
        if event.kind == "turn_end" and event.result is not None:
            result = event.result
            snapshot = pending = None
            if turn is not None and not result.closed and result.finish_reason != "interrupted":
                # The send returns as its turn stops: whether it was a repeat, joining a turn
                # part of whose events this run did not show.
                try:
                    sent = await turn.result()
                except AgentError:
                    sent = result  # what it raised is shown by the caller (see _live)
                snapshot = await self._repeat_snapshot(chat, frames, sent)
            if result.finish_reason == "interrupted":
                pending = (
                    await chat.pending(worker_timeout=self.worker_timeout)
                    if result.interrupts_omitted
                    else result.interrupts
                )
                if frames.show_messages:
                    history = await chat.history(worker_timeout=self.worker_timeout)
                    snapshot = agui.messages_snapshot(chat.id, history.messages, pending)
            out += frames.finished(result, offset=event.offset, snapshot=snapshot, pending=pending)
        for pos, ev in out:
            if after is None or pos > after:
                yield agui.encode(ev, frames.frame_id(pos))

    async def _repeat_snapshot(
        self, chat: Chat, frames: agui.RunFrames, result: TurnResult
    ) -> MessagesSnapshotEvent | None:
        """For a run whose message was a repeat (a client's retry of a run that got in), the
        thread's messages: its own events began where the first run's turn had got to."""
        if not result.repeat or not frames.show_messages:
            return None
        history = await chat.history(worker_timeout=self.worker_timeout)
        return agui.messages_snapshot(chat.id, history.messages, result.interrupts)

    async def _connect(self, chat: Chat, run: RunAgentInput) -> AsyncIterator[str]:
        """A run with no new message and no answers: where the thread stands. The messages,
        then the pending interrupts (a paused thread) or the rest of the running turn."""
        status, history, start = await self._where_it_stands(chat)
        frames = agui.RunFrames(thread_id=chat.id, run_id=run.run_id, start=start)
        for pos, event in frames.started():
            yield agui.encode(event, frames.frame_id(pos))
        snapshot = agui.messages_snapshot(chat.id, history.messages, status.pending)
        if status.status == "running":
            yield agui.encode(snapshot)
            async for frame in self._follow_run(chat, frames, after=None):
                yield frame
            return
        last = status.last_turn
        if status.status == "interrupted" and status.pending:
            result = TurnResult(
                turn=last.turn if last else 0,
                finish_reason=FinishReason.INTERRUPTED,
                interrupts=status.pending,
            )
        else:
            result = TurnResult(
                turn=last.turn if last else 0,
                finish_reason=FinishReason.STOP,
                text=last.text if last else "",
            )
        for pos, event in frames.finished(
            result, offset=start, snapshot=snapshot, pending=status.pending
        ):
            yield agui.encode(event, frames.frame_id(pos))

    async def _where_it_stands(self, chat: Chat) -> tuple[StatusResult, HistoryResult, int]:
        """The thread's status, its messages, and the offset a running turn is followed from.

        Three queries, so the turn may end between them: a turn that was running at the status
        but had ended by the offset would be followed from past its ``turn_end``, and the
        stream would wait for a run that never comes, then end without ``RUN_FINISHED``. So
        a running turn's status is asked again after the offset: the same turn still running
        then published its end at the offset or later. If it ended, everything is read again
        (the thread now stands elsewhere); after :data:`_CONNECT_TRIES` such ends in a row (a
        thread whose turns keep ending and starting), the last reads are used with the second
        status: a turn running then ends at or after the offset, so the stream still ends, at
        the first ``turn_end`` it meets. A connect to a running turn costs one query more.
        """
        tries = 0
        while True:
            tries += 1
            status = await chat.status(worker_timeout=self.worker_timeout)
            _same_agent(chat, status)
            history = await chat.history(worker_timeout=self.worker_timeout)
            start = await next_offset(chat, worker_timeout=self.worker_timeout)
            if status.status != "running":
                # Its outcome is shown from this status, at once: there is no end to wait for.
                return status, history, start
            again = await chat.status(worker_timeout=self.worker_timeout)
            if again.status == "running" and again.turns == status.turns:
                return status, history, start
            if tries == _CONNECT_TRIES:
                break
        if again.status != "running":
            history = await chat.history(worker_timeout=self.worker_timeout)
        return again, history, start

    async def _reattach(
        self, chat: Chat, run: RunAgentInput, start: int, after: agui.FramePos
    ) -> AsyncIterator[str]:
        """The rest of a run after frame ``after``, recomputed from the conversation's stream."""
        grown = _HistoryGrowth(chat)
        await grown()  # before the reads below: a run that begins after them is seen growing
        status = await chat.status(worker_timeout=self.worker_timeout)
        _same_agent(chat, status)
        offset = await next_offset(chat, worker_timeout=self.worker_timeout)
        if start > offset:
            raise Problem(404, "not_found", "Last-Event-ID names a run this thread never had")
        frames = agui.RunFrames(thread_id=chat.id, run_id=run.run_id, start=start)
        for pos, event in frames.started():
            if pos > after:
                yield agui.encode(event, frames.frame_id(pos))
        # What was just read serves the wait's first check: two queries for the worker, not
        # four (1,000 reattaches at once are 2,000 replays for a worker whose cache is 100).
        seen = _Seen(grown=grown, status=status, offset=offset)
        async for frame in self._follow_run(chat, frames, after=after, seen=seen):
            yield frame

    async def _follow_run(
        self,
        chat: Chat,
        frames: agui.RunFrames,
        *,
        after: agui.FramePos | None,
        seen: _Seen | None = None,
    ) -> AsyncIterator[str]:
        """The run's frames from its start offset until it ends: at its ``turn_end``, or, for
        answers that left others pending (no ``turn_end``), once the stream is read to its end
        and the conversation is still paused."""
        try:
            # A follower takes one of the few places a conversation has for them (MAX_FOLLOWERS
            # in workflows/stream.py) for as long as its long poll waits, and a poll cannot be
            # withdrawn: a client that goes away leaves its place taken until the next event.
            # So nothing is followed until the stream holds something of this run: a reattach
            # to a run not begun yet (an idle thread's next) waits by query, which takes no
            # place, asked only once the history has grown (_HistoryGrowth: the server's word,
            # not a worker's). Otherwise four dropped reattaches left the thread's next run's
            # streams to read by query (client/stream.py's follow, when the places are taken).
            # That wait ends after reattach_wait, with nothing more sent: the client reconnects
            # with the same Last-Event-ID (the run's frames keep their ids whenever it begins),
            # and a client that has gone stops asking.
            loop = asyncio.get_running_loop()
            until = loop.time() + self.reattach_wait.total_seconds()
            pause = FOLLOW_CHECK_SECONDS
            asked = False
            grown = seen.grown if seen is not None else _HistoryGrowth(chat)
            offset = seen.offset if seen is not None else None
            while True:
                if offset is None and await grown():
                    offset = await next_offset(chat, worker_timeout=self.worker_timeout)
                if offset is not None and offset > frames.start:
                    break
                offset = None
                if not asked:
                    # Once: a pause or a turn publishes on the stream, which the offset shows;
                    # only a close may not, and this wait ends by itself.
                    asked = True
                    status = (
                        seen.status
                        if seen is not None
                        else await chat.status(worker_timeout=self.worker_timeout)
                    )
                    if status.status == "closed":
                        break  # following reads what is left, and ends
                    if status.status == "interrupted" and status.pending:
                        for frame in self._paused_frames(frames, status.pending, after=after):
                            yield frame
                        return
                left = until - loop.time()
                if left <= pause:
                    await asyncio.sleep(max(left, 0))
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, FOLLOW_CHECK_MAX_SECONDS)
            events = follow(chat, from_offset=frames.start)
            following: asyncio.Future[TurnEvent] | None = None
            last = frames.start - 1
            pause = FOLLOW_CHECK_SECONDS
            try:
                while not frames.ended:
                    if following is None:
                        following = asyncio.ensure_future(anext(events))
                    done, _ = await asyncio.wait({following}, timeout=pause)
                    if not done:
                        # Nothing new: whether the answers this run showed left the turn
                        # paused (no turn_end comes then), asked less often as nothing changes.
                        pause = min(pause * 2, FOLLOW_CHECK_MAX_SECONDS)
                        if frames.answers_only and await self._paused_after(chat, last):
                            status = await chat.status(worker_timeout=self.worker_timeout)
                            for frame in self._paused_frames(frames, status.pending, after=after):
                                yield frame
                        continue
                    pause = FOLLOW_CHECK_SECONDS
                    event = following.result()
                    following = None
                    last = event.offset
                    async for frame in self._frames_of(chat, frames, event, after=after):
                        yield frame
            finally:
                if following is not None:
                    following.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await following
                await events.aclose()
        except StopAsyncIteration:
            return
        except EventsGone as e:
            raise Problem(
                409, "events_gone", f"{e}: start again without Last-Event-ID to get a snapshot"
            ) from None
        except RPCError as e:
            raise rpc_error(e, chat.id) from e

    @staticmethod
    def _paused_frames(
        frames: agui.RunFrames, pending: list[InterruptRequest], *, after: agui.FramePos | None
    ) -> list[str]:
        """The last frames of a run that ends paused on ``pending`` (answers that left others
        pending: no ``turn_end``)."""
        result = TurnResult(finish_reason=FinishReason.INTERRUPTED, interrupts=pending)
        return [
            agui.encode(ev, frames.frame_id(pos))
            for pos, ev in frames.finished(result, offset=frames.last)
            if after is None or pos > after
        ]

    async def _paused_after(self, chat: Chat, last: int) -> bool:
        """Whether the stream holds nothing after ``last`` and the conversation is paused."""
        if await next_offset(chat, worker_timeout=self.worker_timeout) > last + 1:
            return False
        status = await chat.status(worker_timeout=self.worker_timeout)
        return status.status == "interrupted" and bool(status.pending)


@dataclass(frozen=True, kw_only=True)
class _Seen:
    """What a reattach read of its thread, for the first check of its wait."""

    grown: _HistoryGrowth
    """Asked before the reads below."""
    status: StatusResult
    offset: int


class _HistoryGrowth:
    """Whether a chat's history has grown since last asked (True the first time, and when the
    server cannot say), asked of the server alone (``describe``).

    A stream waiting for a run to begin asked the conversation's stream offset by query at
    every check, and a query is a worker's work: a replay, for a conversation out of its cache
    (100 by default). 1,000 such streams in one web process asked one worker 125 queries a
    second at the 8 s pause, for as long as they waited; in ``python -m bench.followers
    --chats 1000`` the worker then took over 60 s to accept a message or an answer
    (``NoWorkerAnswered``). A run that begins writes history (the message's update, its
    workflow task), so the offset is asked only once the history has grown.
    """

    def __init__(self, chat: Chat) -> None:
        self._chat = chat
        self._length: int | None = None
        self._run: str | None = None

    async def __call__(self) -> bool:
        try:
            described = await self._chat.handle.describe()
        except RPCError:
            return True  # the query says what there is to say (a chat gone, a server away)
        seen = (described.run_id, described.history_length)
        if seen == (self._run, self._length):
            return False
        self._run, self._length = seen
        return True


async def _still_running(chat: Chat) -> bool:
    """Whether the run the chat id names is still open, as the server says (a run whose
    continue-as-new is completing is, for a few milliseconds)."""
    try:
        described = await chat.handle.describe()
    except RPCError:
        return False
    return described.status == WorkflowExecutionStatus.RUNNING


def _same_agent(chat: Chat, status: StatusResult) -> None:
    """Refuse a read or an answer through one agent's path of another agent's thread.

    A send is refused by the conversation itself; reads and answers go to a thread by its id
    alone, and the application's ``authorize`` is told the path's agent (``Access.agent``),
    so a rule by agent would otherwise let a user of one agent reach every other's threads.
    Refused as a thread that does not exist, which is what it is for that agent.

    Raises:
        Problem: 404, the thread is another agent's.
    """
    if status.agent != chat.agent:
        raise Problem(
            404,
            "not_found",
            f"agent {chat.agent[:100]!r} has no conversation {chat.id[:100]!r}",
        )


def pending_call(status: StatusResult, ref: str) -> InterruptRequest:
    """The call ``ref`` the chat is paused on now, as ``status`` says: what an answer to it is
    built from (the approvals API's, the MCP server's).

    Raises:
        Problem: 409, the chat is closed, or the call was answered already; 404, the chat has
            no such pending call.
    """
    chat_id = status.chat_id
    if status.status == "closed":
        raise Problem(409, "conflict", f"chat {chat_id[:100]!r} is closed")
    request_for = {i.ref: i for i in status.pending}.get(ref)
    if request_for is None:
        # (A caller's record of an answer a sub-agent refused answered nothing.)
        answered = any(a.ref == ref and a.verdict != "refused" for a in status.recent_answers)
        if answered:
            raise Problem(
                409, "conflict", f"ref {ref[:100]!r} is not pending: it was already answered"
            )
        raise Problem(404, "not_found", f"chat {chat_id[:100]!r} has no pending call {ref[:100]!r}")
    return request_for


def _answer_of(body: AnswerBody, shown: InterruptRequest) -> ToolResponse | ToolRestart:
    if body.remember is not None and body.action != "approve":
        raise Problem(400, "malformed", "remember goes with an approval only")
    if body.action == "approve":
        try:
            return shown.approve(remember=body.remember)
        except ValueError as e:  # remember on an interrupt-only tool: its answer is one call's
            raise Problem(422, "invalid", str(e)) from None
    if body.action == "deny":
        return shown.deny(body.reason)
    if body.action == "respond":
        if body.output is None:
            raise Problem(400, "malformed", "respond needs output, an object")
        return shown.respond(body.output)
    if body.input is None:
        raise Problem(400, "malformed", "edit needs input, the tool's whole new input")
    return shown.restart({"tool_approved": True}, input=body.input)


def _static(name: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    async def page(_: Request) -> Response:
        try:
            content = (
                resources.files("temporal_agent_interrupts.client")
                .joinpath("static", name)
                .read_bytes()
            )
        except FileNotFoundError:
            raise Problem(404, "not_found", f"{name} is not installed") from None
        return Response(
            content,
            media_type=media_type,
            headers={
                "Content-Security-Policy": _CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache",
            },
        )

    return page


def agents_app(
    client: AgentClient,
    *,
    identity: Literal["bearer"] | LoginExchange | IdentityFunction | None = None,
    dev_loopback: bool = False,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    max_body: int = MAX_BODY,
    streams_per_chat: int = STREAMS_PER_CHAT,
    reattach_wait: timedelta = REATTACH_WAIT,
    worker_timeout: timedelta | None = WORKER_TIMEOUT,
    authorize: Authorize | None = None,
    token_queues: Sequence[str] | None = None,
    inbox_queues: Sequence[str] | Literal["any"] | None = None,
    link_keys: Sequence[bytes | str] = (),
    slack: SlackInteractivity | None = None,
    receipt_jwks: Mapping[str, Any] | None = None,
) -> Starlette:
    """The web front ends' application, for ``client``'s namespace and task queue.

    Args:
        identity: Who answers. A :class:`~client.login.LoginExchange`: the application's
            hook verifies the request's login (a JWT of any algorithm, a session), and each
            answer carries an assertion the app signs for it alone (for agents that trust the
            exchange's key); the login never reaches a conversation. ``"bearer"`` passes the
            request's bearer token on as the answer's identity token, for clients that hold a
            fresh per-answer token of the agent's issuer, never a login: it is written in the
            chat's history, and answers once per chat. A function of the request (sync or
            async) returns the identity on record (agents without ``trust=``), or None.
        dev_loopback: With no ``identity``, take it from the ``X-Agent-Identity`` header (or
            ``dev@localhost``), serving loopback clients only. For one machine, never a
            deployment: anyone who can reach it can say they are anyone.
        cors_origins: Browser origins allowed to call it (exact ``scheme://host[:port]``).
        allowed_hosts: ``Host`` values it answers besides loopback names (a name alone allows
            any port).
        max_body: The largest request body taken, in bytes.
        streams_per_chat: AG-UI streams one requester (the identity the app reads from a
            request, else the client's address) may have open on one chat at once.
        reattach_wait: How long an AG-UI stream waits for a run that has not begun (a
            reconnect to an idle thread) before it ends; the client reconnects.
        worker_timeout: How long a worker may take to accept what the app sends.
        authorize: The application's rule for who may do what (:class:`Access`: send, answer,
            read a chat, list the inbox), a function of the request (sync or async); without
            it, whoever reaches the app may chat with any agent and read any chat, and only
            answers are checked (by identity, against each agent's approvers and trust).
        token_queues: The task queues whose conversations may be sent an identity token (an
            assertion, or the bearer token); None: the client's own task queue. An
            answer with a token to a chat on any other queue is refused (403) before anything
            is sent to it, since whoever polls that queue would receive the token.
        inbox_queues: The task queues whose paused chats ``/api/inbox`` lists; ``"any"``: every
            queue (`make run`, on one machine, where a newcomer's agent has a queue of its
            own). None: the client's own and ``token_queues``, the queues this deployment's
            workers poll: a chat on any other was written by whoever started it, memo and all.
        link_keys: The secrets the email channel signs its answer links with (the
            ``EmailChannel``'s ``link_key``; the first of several is the newest, each
            verifies). Given, the app serves ``/answer/{token}``: the link's approver answers
            as who the link names (behind a ``LoginExchange``, through an assertion it signs,
            as for a login), after confirming with a POST; ``authorize`` is asked as for any
            answer.
        slack: Serve Slack's interactivity endpoint, ``POST /slack/interactivity``: *Approve*
            and *Deny* clicks on a ``SlackChannel``'s messages, verified with the Slack app's
            signing secret and answered as the directory's identity of the clicking user
            (``client/slack.py``).
        receipt_jwks: The workers' receipt keys as a JWK Set (``ReceiptKeys.jwks()``, what
            ``agent-worker --print-receipt-jwks`` prints), served to anyone at
            ``GET /.well-known/agent-receipt-keys.json`` for ``agentctl verify --keys``. Public
            keys only: the app never holds a key that signs.

    Raises:
        TypeError: ``identity`` is none of its forms.
        ValueError: ``dev_loopback`` with ``allowed_hosts`` or ``cors_origins``: development
            mode answers loopback only, and takes anyone's word for who they are. Or an entry
            of ``cors_origins`` is not one site's origin (``null``, ``*``, a path). Or
            ``receipt_jwks`` is not a JWK Set of public keys.
    """
    if (
        identity is not None
        and identity != "bearer"
        and not isinstance(identity, LoginExchange)
        and not callable(identity)
    ):
        raise TypeError("identity is a LoginExchange, 'bearer', a function of the request, or None")
    if dev_loopback and identity is None and (allowed_hosts or cors_origins):
        raise ValueError(
            "dev_loopback serves loopback only: give identity= to serve other hosts or origins"
        )
    origins = site_origins(cors_origins, what="cors_origins")
    state = _App(
        client,
        identity=identity,
        dev_loopback=dev_loopback,
        max_body=max_body,
        streams_per_chat=streams_per_chat,
        reattach_wait=reattach_wait,
        worker_timeout=worker_timeout,
        authorize=authorize,
        token_queues=token_queues,
        inbox_queues=inbox_queues,
    )

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Problem as p:
                return problem_response(p)
            except AgentError as e:
                return problem_response(agent_problem(e))
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path[:200])
                return problem_response(
                    Problem(500, "internal", "internal error (logged by the app)")
                )

        return run

    routes = [
        Route("/agui/{agent}", guarded(state.agui_run), methods=["POST"]),
        Route("/api/whoami", guarded(state.whoami), methods=["GET"]),
        Route("/api/inbox", guarded(state.inbox), methods=["GET"]),
        Route("/api/chats/{chat_id}/pending", guarded(state.pending), methods=["GET"]),
        Route("/api/chats/{chat_id}/audit", guarded(state.audit), methods=["GET"]),
        Route("/api/chats/{chat_id}/interrupts/{ref}", guarded(state.answer), methods=["POST"]),
        Route("/api/chats/{chat_id}/grants", guarded(state.grants), methods=["GET"]),
        Route(
            "/api/chats/{chat_id}/grants/{grant_id}/revoke",
            guarded(state.revoke_grant),
            methods=["POST"],
        ),
        Route("/inbox", guarded(_static("inbox.html", "text/html; charset=utf-8"))),
        Route("/inbox/inbox.js", guarded(_static("inbox.js", "text/javascript; charset=utf-8"))),
        Route("/inbox/inbox.css", guarded(_static("inbox.css", "text/css; charset=utf-8"))),
    ]
    if link_keys:
        from temporal_agent_interrupts.activities.answer_links import AnswerLinks
        from temporal_agent_interrupts.client.answer_view import AnswerView

        view = AnswerView(state, AnswerLinks(link_keys))
        routes.append(Route("/answer/{token}", view.guarded(view.show), methods=["GET"]))
        routes.append(Route("/answer/{token}", view.guarded(view.answer), methods=["POST"]))
    if slack is not None:
        routes.append(
            Route("/slack/interactivity", guarded(slack.endpoint(state)), methods=["POST"])
        )
    if receipt_jwks is not None:
        routes.append(
            Route(RECEIPT_KEYS_PATH, _receipt_keys(receipt_jwks), methods=["GET", "HEAD"])
        )
    app = Starlette(routes=routes)
    hosts = frozenset([*LOOPBACK_NAMES, *(h.strip().lower() for h in allowed_hosts if h.strip())])
    app.add_middleware(
        _Guard,
        hosts=hosts,
        origins=origins,
        loopback_only=dev_loopback and identity is None,
    )
    app.state.agents = state
    return app


RECEIPT_KEYS_PATH = "/.well-known/agent-receipt-keys.json"


def _receipt_keys(jwks: Mapping[str, Any]) -> Callable[[Request], Awaitable[Response]]:
    """The route serving the receipt keys: a JWK Set checked once, here, to hold public keys
    only (a private key's ``d`` is refused, so a misconfigured app never publishes one)."""
    from temporal_agent_interrupts.client.receipts import public_keys

    try:
        public_keys(jwks)
    except ValueError as e:
        raise ValueError(f"receipt_jwks: {e}") from None
    entries = jwks["keys"]
    if any(isinstance(entry, dict) and "d" in entry for entry in entries):
        raise ValueError("receipt_jwks holds a private key (d): give the public JWK Set only")
    # Only what a public Ed25519 key is: a symmetric key (oct, k), or any other member, is
    # refused rather than published.
    public = {"kty", "crv", "kid", "use", "alg", "x"}
    if any(
        not isinstance(entry, dict)
        or entry.get("kty") != "OKP"
        or entry.get("crv") != "Ed25519"
        or not set(entry) <= public
        for entry in entries
    ):
        raise ValueError("receipt_jwks: give public Ed25519 keys only (kty, crv, kid, use, alg, x)")
    body = json.dumps(dict(jwks)).encode()

    async def serve_keys(request: Request) -> Response:
        return Response(
            body,
            media_type="application/jwk-set+json",
            headers={"Cache-Control": "public, max-age=300"},
        )

    return serve_keys


def connection_limits() -> ConnectionLimits:
    """The web app's :class:`~temporal_agent_interrupts.http_server.ConnectionLimits`, read
    when it is served (so a test may shorten the module's constants)."""
    return ConnectionLimits(
        request_seconds=HEADER_DEADLINE,
        idle_seconds=min(KEEP_ALIVE_SECONDS, HEADER_DEADLINE),
        max_header_bytes=MAX_HEADER_BYTES,
        max_headers=MAX_HEADERS,
        max_connections=CONNECTIONS,
        # Past CONNECTIONS a request gets 503 (http_server's _full). Bodies are the
        # app's own (max_body, BODY_DEADLINE: a 408 it writes itself); answers have no
        # deadline: a stream follows its conversation for as long as a turn runs.
        # A connection that never finishes a head is closed with nothing said, as uvicorn
        # closes an idle one: nobody who sent a whole request is left without an answer.
        answer_slow_heads=False,
    )


async def serve(
    app: Starlette, *, host: str = "127.0.0.1", port: int = 8234, ready: asyncio.Event | None = None
) -> None:
    """Serve ``app`` with uvicorn until cancelled, under :func:`connection_limits`.

    Raises:
        OSError: the address cannot be bound (in use, or not this machine's).
    """
    from temporal_agent_interrupts import http_server

    await http_server.serve(
        app,
        limits=connection_limits(),
        host=host,
        port=port,
        ready=ready,
        # Streams follow conversations for as long as a turn runs: at shutdown they get this
        # long to end, then are closed (a client reconnects with Last-Event-ID).
        graceful_seconds=5,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m temporal_agent_interrupts.client.web",
        description="Serve AG-UI, the approvals API and the inbox page for the configured "
        "Temporal namespace (TEMPORAL_ADDRESS etc., as AgentClient.connect reads them).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8234)
    parser.add_argument(
        "--identity",
        choices=["bearer", "dev"],
        default=None,
        help="bearer: answers carry the request's bearer token as identity token (a "
        "per-answer token of the agent's issuer, valid 15 minutes at most: never a login; "
        "behind a login, serve agents_app(identity=LoginExchange(...)) from your own code); "
        "dev: loopback only, identity from X-Agent-Identity",
    )
    parser.add_argument("--cors-origin", action="append", default=[])
    parser.add_argument("--allowed-host", action="append", default=[])
    parser.add_argument(
        "--receipt-jwks",
        metavar="FILE",
        default=None,
        help=f"serve this JWK Set (agent-worker --print-receipt-jwks) at {RECEIPT_KEYS_PATH}",
    )
    args = parser.parse_args(argv)
    receipt_jwks = None
    if args.receipt_jwks is not None:
        try:
            with open(args.receipt_jwks, encoding="utf-8") as f:
                receipt_jwks = json.load(f)
        except (OSError, ValueError) as e:
            parser.error(f"--receipt-jwks {args.receipt_jwks}: {e}")
        if not isinstance(receipt_jwks, dict):
            parser.error(f"--receipt-jwks {args.receipt_jwks}: not a JWK Set")

    async def run() -> None:
        client = await AgentClient.connect()
        dev = args.identity == "dev"
        if dev and args.host not in ("127.0.0.1", "localhost", "::1"):
            parser.error("--identity dev serves loopback only: leave --host at 127.0.0.1")
        app = agents_app(
            client,
            identity="bearer" if args.identity == "bearer" else None,
            dev_loopback=dev,
            cors_origins=args.cors_origin,
            allowed_hosts=args.allowed_host,
            receipt_jwks=receipt_jwks,
        )
        print(f"agents app on http://{args.host}:{args.port}/inbox", flush=True)
        await serve(app, host=args.host, port=args.port)

    from temporal_agent_interrupts.client.api import run_script

    run_script(run())


if __name__ == "__main__":
    main()

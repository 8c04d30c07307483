"""Agents served as an MCP server: each chosen agent one tool, over Streamable HTTP, stateless.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.web``.

``agents_mcp_app(client, agents=[...], identity=..., state_keys=...)`` is a Starlette
application that speaks MCP's 2026-07-28 revision at ``/mcp`` (the official ``mcp`` package's
server, with no sessions). Each agent is a tool named after it, taking ``message`` and an
optional ``chat_id``; a call sends the message to the chat and waits for its turn:

- a turn that ends answers its text (``structuredContent``: the chat id, the turn, how it ended
  and the text, so the caller can go on in the same chat);
- a turn that pauses answers ``InputRequiredResult``: one form (``elicitation/create``, mode
  ``form``) per pending call, keyed by its ref, whose schema is the call's answer (an approval:
  ``approved`` and ``reason``; an interrupt-only tool: its output schema when it is flat, else
  one ``output`` field holding the output as JSON), and a ``requestState`` naming the chat, the
  turn, and each call's ref with the digest of the input its form showed.

The client retries the same call with ``inputResponses`` and the ``requestState`` echoed. The
state is sealed by the ``mcp`` package's ``RequestStateBoundary`` (AES-256-GCM under keys from
``AGENT_MCP_STATE_KEYS`` or ``state_keys=``; the first seals, all open), bound to the tool, its
arguments, this app's audience and the caller's identity, and it expires
(``state_ttl``): a tampered, expired, foreign or someone else's state is refused before anything
here reads it. Each response then becomes an answer through the approvals API's own path
(``client/web.py``): the call must be pending now, the answer carries the digest of the input
the form showed, the identity is the request's (a login exchanged for a per-answer assertion,
a bearer identity token, or the application's function), and the conversation checks it all
again (approvers, trust, quorum, exactly once). Nothing is held between the two requests: any
process of the app, sharing the keys, takes any retry.

A state can be echoed again (it is only sealed, not spent here): the conversation refuses an
answer to a call that is no longer pending, so an answer never applies twice. A retry whose
calls were answered already is refused whole, with nothing applied.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

import jwt
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from temporal_agent_interrupts.client import agui
from temporal_agent_interrupts.client.api import WORKER_TIMEOUT, AgentClient, Chat
from temporal_agent_interrupts.client.inbox import check_agent_name
from temporal_agent_interrupts.client.login import LoginExchange
from temporal_agent_interrupts.client.web import (
    _ID,
    Access,
    Authorize,
    IdentityFunction,
    Problem,
    _App,
    _Guard,
    _Identity,
    agent_problem,
    pending_call,
    problem_response,
)
from temporal_agent_interrupts.codec import PayloadKeys
from temporal_agent_interrupts.errors import AgentError
from temporal_agent_interrupts.http_rules import LOOPBACK_NAMES
from temporal_agent_interrupts.workflows.details import truncate, visible
from temporal_agent_interrupts.workflows.identity import MAX_BOUND_CALLS
from temporal_agent_interrupts.workflows.limits import DOOR, KiB, MiB
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    JsonObject,
    ToolResponse,
    ToolRestart,
    TurnResult,
)

log = logging.getLogger(__name__)

STATE_KEYS_VAR = "AGENT_MCP_STATE_KEYS"
"""Where ``agents_mcp_app`` reads its ``requestState`` keys when given none: ``id:base64key``
entries, comma-separated (the form of ``AGENT_PAYLOAD_KEYS``); the first seals, every one opens.
Every process of the app needs the same set."""

STATE_TTL = timedelta(hours=1)
"""How long a ``requestState`` may be echoed: the time an MCP client's user has to fill its
forms. The calls stay paused after it; they are answered then through the inbox or the
approvals API."""

STATE_AUDIENCE = "temporal-agent-interrupts/mcp"
"""What a state is sealed for, unless ``state_audience`` says otherwise: another service sharing
the keys (a different audience) cannot have its states taken here, nor this app's there."""

MCP_PATH = "/mcp"

CHAT_META = "temporal-agent-interrupts/chatId"
"""The ``_meta`` key of an ``InputRequiredResult`` that names the paused chat."""

MAX_BODY = 1 * MiB + 64 * KiB
"""A request body, in bytes: an answer's own limit (1 MiB) and the envelope around it."""

MAX_MESSAGE = DOOR.send
"""The longest message a call may send, in UTF-8 bytes (the conversation's own limit)."""

MAX_FORMS = 16
"""The most forms one ``InputRequiredResult`` asks (a turn paused on more asks the rest once
these are answered), and so the most responses a retry may carry."""

MAX_FORM_INPUT = 2000
"""How much of a call's input a form's message shows, in characters (its digest binds the
whole input all the same)."""

_PRIMITIVE = frozenset({"string", "number", "integer", "boolean"})
# MCP's tool names: 1 to 128 of these.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_WHO = "agents_mcp_who"


class _Call(BaseModel):
    """A tool's arguments."""

    model_config = ConfigDict(extra="forbid")

    message: str
    chat_id: str | None = Field(default=None, max_length=400)


class _State(BaseModel):
    """What a ``requestState`` holds, before the boundary seals it (it encrypts: the client
    reads none of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    chat: str
    agent: str
    turn: int
    calls: dict[str, str]
    """Each call a form was shown for: its ref, and the digest of the input the form showed."""


def _refuse(problem: Problem) -> MCPError:
    """A refusal as an MCP error: invalid params for what the caller sent (4xx), an internal
    error for what failed here (5xx); the product's reason and code in ``data``."""
    code = types.INVALID_PARAMS if problem.status < 500 else types.INTERNAL_ERROR
    return MCPError(
        code=code,
        message=problem.detail,
        data={"code": problem.code, "status": problem.status},
    )


def _flat(schema: JsonObject | None) -> bool:
    """Whether an output schema is one MCP form can ask: an object of primitive fields."""
    if (
        not schema
        or schema.get("type") != "object"
        or not isinstance(schema.get("properties"), dict)
    ):
        return False
    for field in schema["properties"].values():
        if not isinstance(field, dict):
            return False
        kind = field.get("type")
        if kind not in _PRIMITIVE:
            return False
        if "enum" in field and not all(isinstance(v, str) for v in field["enum"]):
            return False
    return True


def _approval(request: InterruptRequest) -> bool:
    """Whether a call is answered as an approval (a gate's, a tool's own), not with data (an
    interrupt-only tool's output, an MCP server's form): AG-UI's one rule for it."""
    return agui.to_interrupt(request).reason == agui.REASON_APPROVAL


def form_schema(request: InterruptRequest) -> JsonObject:
    """The form an MCP client shows for one pending call: an approval's ``approved`` and
    ``reason`` (AG-UI's schema without its edit, which is no flat field); for a call answered
    with data (an interrupt-only tool, an MCP server's own form), its output schema when it is
    flat, else one ``output`` field for the output as JSON."""
    if _approval(request):
        schema = agui.approval_schema(request)
        properties = {
            k: v
            for k, v in schema["properties"].items()
            if isinstance(v, dict) and v.get("type") in _PRIMITIVE
        }
        return {**schema, "properties": properties}
    if _flat(request.output_schema):
        assert request.output_schema is not None
        return request.output_schema
    wanted = json.dumps(request.output_schema or {"type": "object"}, separators=(",", ":"))
    return {
        "type": "object",
        "properties": {
            "output": {
                "type": "string",
                "description": "The answer, a JSON object fitting " + truncate(wanted, 1000),
            }
        },
        "required": ["output"],
    }


def form_message(request: InterruptRequest) -> str:
    """What the form says: the question AG-UI and the inbox show, and the call's input."""
    shown = agui.to_interrupt(request).message or request.name
    given = json.dumps(request.input, ensure_ascii=False, separators=(", ", ": "))
    return visible(f"{shown}\n{request.name} {truncate(given, MAX_FORM_INPUT)}", multiline=True)


class _Tools:
    """The MCP handlers: one tool per agent, each call a turn."""

    def __init__(
        self,
        door: _App,
        *,
        agents: Sequence[str],
        max_message: int,
        max_forms: int,
    ) -> None:
        self.door = door
        self.agents = tuple(agents)
        self.max_message = max_message
        self.max_forms = max_forms

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[self._tool(a) for a in self.agents])

    def _tool(self, agent: str) -> types.Tool:
        return types.Tool(
            name=agent,
            description=(
                f"Send a message to the agent {agent} and get its answer. A call it makes that "
                "needs a person's answer asks for it (input required); give chat_id (from a "
                "result) to go on in the same conversation."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "message": {"type": "string", "description": "What to say to the agent."},
                    "chat_id": {
                        "type": "string",
                        "description": "The conversation to go on (a new one when left out).",
                    },
                },
                "required": ["message"],
                "additionalProperties": False,
            },
            output_schema={
                "type": "object",
                "properties": {
                    "chat_id": {"type": "string"},
                    "turn": {"type": "integer"},
                    "finish_reason": {"type": "string"},
                    "text": {"type": "string"},
                },
                "required": ["chat_id", "turn", "finish_reason", "text"],
            },
        )

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            return await self._call(ctx, params)
        except Problem as p:
            raise _refuse(p) from None
        except AgentError as e:
            raise _refuse(agent_problem(e)) from None

    async def _call(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if params.name not in self.agents:
            raise Problem(404, "unknown_agent", f"no tool {params.name[:100]!r} here")
        try:
            call = _Call.model_validate(params.arguments or {})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
            raise Problem(400, "malformed", f"the arguments: {where}: {first.get('msg')}") from None
        if call.chat_id is not None and not _ID.fullmatch(call.chat_id):
            raise Problem(400, "bad_id", "chat_id is empty, too long or holds control characters")
        request: Request = ctx.request
        who: _Identity = request.state.agents_mcp_who
        if params.request_state is not None:
            # Opened and checked by the boundary already (seal, expiry, tool, arguments, caller).
            return await self._answer(request, who, params.name, params)
        if params.input_responses:
            raise Problem(400, "malformed", "inputResponses come with the requestState they answer")
        if len(call.message.encode("utf-8", "surrogatepass")) > self.max_message:
            raise Problem(413, "too_large", f"the message is over {self.max_message} bytes")
        chat_id = call.chat_id or f"mcp-{uuid.uuid4()}"
        access = Access(action="send", chat_id=chat_id, agent=params.name, identity=who.identity)
        await self.door.allow(request, access)
        await self.door.allow(request, access.model_copy(update={"action": "read"}))
        chat = Chat(self.door.client, agent=params.name, chat_id=chat_id)
        token = None
        if who.login is not None:
            # Behind a login, the message says who sends it, as an AG-UI send does.
            token = await self.door.send_token(chat, who.login, call.message)
        result = await chat.send(
            call.message, identity_token=token, worker_timeout=self.door.worker_timeout
        )
        return await self._outcome(chat, result)

    async def _answer(
        self, request: Request, who: _Identity, agent: str, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            state = _State.model_validate_json(params.request_state or "")
        except ValidationError:
            # Sealed by this app's keys, so written by it: another version's shape.
            raise Problem(
                400, "stale_state", "the requestState is not one this app reads"
            ) from None
        if state.agent != agent:
            raise Problem(400, "stale_state", "the requestState is another tool's")
        responses = params.input_responses or {}
        if not responses:
            raise Problem(400, "malformed", "a retry carries inputResponses")
        if len(responses) > self.max_forms:
            raise Problem(400, "malformed", f"at most {self.max_forms} inputResponses a retry")
        unknown = sorted(set(responses) - set(state.calls))
        if unknown:
            raise Problem(
                400, "malformed", f"inputResponses name no form it asked: {unknown[0][:100]!r}"
            )
        access = Access(action="answer", chat_id=state.chat, agent=agent, identity=who.identity)
        await self.door.allow(request, access)
        await self.door.allow(request, access.model_copy(update={"action": "read"}))
        chat = Chat(self.door.client, agent=agent, chat_id=state.chat)
        if who.carries_token:
            await self.door.may_receive_token(chat)
        status = await chat.status(worker_timeout=self.door.worker_timeout)
        if status.agent != agent:
            raise Problem(404, "not_found", f"agent {agent[:100]!r} has no such conversation")
        answers: list[ToolResponse | ToolRestart] = []
        for ref, response in responses.items():
            shown = pending_call(status, ref).model_copy(update={"input_digest": state.calls[ref]})
            answers.append(_answer_of(shown, response))
        token = self.door.token_for(
            who, chat, {a.ref: state.calls[a.ref] for a in answers}, answers=answers
        )
        result = await self.door.resume_checked(
            chat,
            who,
            lambda run_id: chat.resume(
                answers=answers,
                identity=who.identity,
                identity_token=token,
                metadata={"via": "mcp"},
                worker_timeout=self.door.worker_timeout,
                run_id=run_id,
            ),
        )
        return await self._outcome(chat, result)

    async def _outcome(
        self, chat: Chat, result: TurnResult
    ) -> types.CallToolResult | types.InputRequiredResult:
        if result.finish_reason == FinishReason.INTERRUPTED:
            pending = (
                await chat.pending(worker_timeout=self.door.worker_timeout)
                if result.interrupts_omitted or not result.interrupts
                else result.interrupts
            )
            if pending:
                asked = pending[: self.max_forms]
                state = _State(
                    chat=chat.id,
                    agent=chat.agent,
                    turn=result.turn,
                    calls={i.ref: i.input_digest for i in asked},
                )
                return types.InputRequiredResult(
                    input_requests={
                        i.ref: types.ElicitRequest(
                            params=types.ElicitRequestFormParams(
                                message=form_message(i), requested_schema=form_schema(i)
                            )
                        )
                        for i in asked
                    },
                    request_state=state.model_dump_json(),
                    # The chat, for a caller that let the app name it: where to go on, or what
                    # to answer through the inbox if its forms are not filled in.
                    _meta={CHAT_META: chat.id},
                )
        failed = result.finish_reason == FinishReason.FAILED or result.error is not None
        text = result.text
        if failed and result.error is not None and not text:
            text = result.error.message
        structured = {
            "chat_id": chat.id,
            "turn": result.turn,
            "finish_reason": str(result.finish_reason),
            "text": text,
        }
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=structured,
            is_error=failed,
        )


def _answer_of(shown: InterruptRequest, response: Any) -> ToolResponse | ToolRestart:
    """One form's response as the answer it gives (declined or cancelled: denied)."""
    if not isinstance(response, types.ElicitResult):
        raise Problem(400, "malformed", f"the response for {shown.ref[:100]!r} is not a form's")
    if response.action != "accept":
        return shown.deny(
            f"{response.action}d through MCP"
            if response.action == "decline"
            else "cancelled through MCP"
        )
    content: Any = dict(response.content or {})
    asked = (shown.output_schema or {}).get("properties")
    if not _approval(shown) and _flat(shown.output_schema) and isinstance(asked, dict):
        # The form asked for these fields and no others: a key it did not ask for (an
        # "identity", a "remember") must not reach the model as the person's answer.
        extra = sorted(str(k)[:60] for k in content if k not in asked)
        if extra:
            raise Problem(
                422,
                "invalid",
                f"the form for {shown.ref[:100]!r} asks no {', '.join(map(repr, extra[:3]))}",
            )
    if not _approval(shown) and not _flat(shown.output_schema):
        given = content.get("output")
        try:
            content = json.loads(given) if isinstance(given, str) else None
        except (ValueError, RecursionError):
            content = None
        if not isinstance(content, dict):
            raise Problem(
                422, "invalid", f"the output for {shown.ref[:100]!r} is not a JSON object"
            )
    try:
        return agui.answer_from(shown, content, digest_shown=True)
    except agui.BadResume as e:
        raise Problem(422, e.code, str(e)) from None


def _principal(ctx: Any) -> str | None:
    """Whom a state is sealed for: the identity the request proved, or for a bearer identity
    token its issuer and subject (read unverified: the conversation verifies the token, and a
    retry brings a fresh one, for the same person)."""
    who: _Identity | None = getattr(ctx.request.state, _WHO, None) if ctx.request else None
    if who is None:
        return None
    if who.identity:
        return "identity:" + who.identity
    if who.token:
        claims = jwt.decode(who.token, options={"verify_signature": False})
        return "token:" + json.dumps([claims.get("iss"), claims.get("sub")])
    return None


class _Door:
    """Before the MCP server: the 2026-07-28 revision only, and who is asking (401 without an
    identity), kept on the request for the handlers and the state's binding. Each request gets
    a session manager of its own, entered and left with it: nothing outlives a request, and the
    app needs no lifespan (it can be mounted anywhere, and ``serve`` runs none)."""

    def __init__(self, server: Server[Any], door: _App, *, max_body: int) -> None:
        self.server = server
        self.door = door
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.method != "POST":
            # No GET stream, no DELETE of a session: there are none.
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        version = request.headers.get("mcp-protocol-version")
        if version not in MODERN_PROTOCOL_VERSIONS:
            await problem_response(
                Problem(
                    400,
                    "protocol_version",
                    "this server speaks MCP "
                    + ", ".join(MODERN_PROTOCOL_VERSIONS)
                    + " only (send MCP-Protocol-Version; no initialize)",
                )
            )(scope, receive, send)
            return
        try:
            who = await self.door.who(request)
        except Problem as p:
            response = problem_response(p)
            if p.status == 401:
                response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[_WHO] = who
        manager = StreamableHTTPSessionManager(
            app=self.server,
            stateless=True,
            # The Host and Origin rules are the web app's (_Guard), for every server the
            # product runs.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=self.max_body,
        )
        async with manager.run():
            await manager.handle_request(scope, receive, send)


def state_security(
    keys: str | Sequence[bytes] | None, *, ttl: timedelta, audience: str
) -> RequestStateSecurity:
    """The boundary's policy: keys from ``keys`` or :data:`STATE_KEYS_VAR`, bound to the caller.

    Raises:
        ValueError: no keys, or keys that cannot be used (the message never shows one).
    """
    if keys is None:
        keys = os.environ.get(STATE_KEYS_VAR, "").strip() or None
        if keys is None:
            raise ValueError(
                f"agents_mcp_app needs state_keys= or {STATE_KEYS_VAR} (id:base64key, 32 random "
                "bytes; the first seals, all open): every process of the app shares them"
            )
    if isinstance(keys, str):
        ring = [k for _, k in PayloadKeys.parse(keys, source="state_keys").keys]
    else:
        ring = [bytes(k) for k in keys]
    return RequestStateSecurity(
        keys=ring,
        ttl=ttl.total_seconds(),
        bind_principal=_principal,
        audience=audience,
    )


def agents_mcp_app(
    client: AgentClient,
    *,
    agents: Sequence[str],
    identity: Literal["bearer"] | LoginExchange | IdentityFunction,
    state_keys: str | Sequence[bytes] | None = None,
    state_ttl: timedelta = STATE_TTL,
    state_audience: str = STATE_AUDIENCE,
    allowed_hosts: Sequence[str] = (),
    max_body: int = MAX_BODY,
    max_message: int = MAX_MESSAGE,
    max_forms: int = MAX_FORMS,
    worker_timeout: timedelta | None = WORKER_TIMEOUT,
    authorize: Authorize | None = None,
    token_queues: Sequence[str] | None = None,
    server_name: str = "temporal-agent-interrupts",
) -> Starlette:
    """``agents`` as an MCP server at ``/mcp`` (Streamable HTTP, 2026-07-28, stateless).

    Serve it with :func:`~client.web.serve`, or mount it in an application of your own (it
    needs no lifespan).

    Args:
        agents: The agents offered, each a tool of its name.
        identity: Who is calling, from the request's HTTP authentication, as ``agents_app``
            reads it: a :class:`~client.login.LoginExchange` (answers carry an assertion made
            for each), ``"bearer"`` (a per-answer identity token of the agent's issuer, passed on
            with answers), or the application's function of the request. A request without
            one is refused (401).
        state_keys: The keys sealing ``requestState``: ``id:base64key[,...]`` or raw keys of
            32 bytes or more; the first seals, every one opens (rotate by putting a new key
            first, and drop the old one after ``state_ttl``). None: :data:`STATE_KEYS_VAR`.
        state_ttl: How long a ``requestState`` may be echoed.
        state_audience: The service a state is sealed for.
        allowed_hosts: ``Host`` values it answers besides loopback names.
        max_body: The largest request body, in bytes (413 past it).
        max_message: The longest message a call sends, in UTF-8 bytes.
        max_forms: The most forms one pause asks at once (and responses a retry carries).
        worker_timeout: How long a worker may take to accept what the app sends.
        authorize: The application's rule (:class:`~client.web.Access`): a call is a
            ``send`` and a retry an ``answer``, each also a ``read`` (it returns the turn).
        token_queues: The task queues whose chats may be sent an identity token (None: the
            client's own), as ``agents_app``'s.
        server_name: The name the server gives itself.

    Raises:
        ValueError: no agents, an agent name that is no MCP tool name, no state keys, or keys
            that cannot be used.
        TypeError: ``identity`` is none of its forms.
    """
    if not agents:
        raise ValueError("agents_mcp_app serves at least one agent")
    for name in agents:
        check_agent_name(name)
        if not _TOOL_NAME.fullmatch(name):
            raise ValueError(f"agent {name[:100]!r} is no MCP tool name (A-Z a-z 0-9 _ . -)")
    if identity != "bearer" and not isinstance(identity, LoginExchange) and not callable(identity):
        raise TypeError("identity is a LoginExchange, 'bearer' or a function of the request")
    if not 1 <= max_forms <= MAX_BOUND_CALLS:
        # Behind a login, one assertion names every call a retry answers.
        raise ValueError(f"max_forms is from 1 to {MAX_BOUND_CALLS}")
    security = state_security(state_keys, ttl=state_ttl, audience=state_audience)
    door = _App(
        client,
        identity=identity,
        dev_loopback=False,
        max_body=max_body,
        streams_per_chat=1,
        reattach_wait=timedelta(0),
        worker_timeout=worker_timeout,
        authorize=authorize,
        token_queues=token_queues,
    )
    tools = _Tools(door, agents=agents, max_message=max_message, max_forms=max_forms)
    server: Server[Any] = Server(
        server_name, on_list_tools=tools.list_tools, on_call_tool=tools.call_tool
    )
    server.middleware.append(RequestStateBoundary(security, default_audience=state_audience))
    app = Starlette(routes=[Route(MCP_PATH, _Door(server, door, max_body=max_body))])
    hosts = frozenset([*LOOPBACK_NAMES, *(h.strip().lower() for h in allowed_hosts if h.strip())])
    app.add_middleware(_Guard, hosts=hosts, origins=frozenset(), loopback_only=False)
    app.state.agents = door
    return app

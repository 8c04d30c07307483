"""One-time answer links: what an email carries so its reader can answer one paused call.

Internal: not covered by the 0.1.x stability promise. The email channel
(``temporal_agent_interrupts.hosting.EmailChannel``) signs links, and the web app
(``agents_app(link_keys=...)``) verifies them; both are given the same secret.

A link is a token: the claims (the agent, the chat, the call's ref, the digest of the input the
email showed, when the call paused, the approver's identity and the groups it was reached
through, and when the link expires) as compact JSON, then an HMAC-SHA256 of them under a key
the channel and the web app share, both base64url. Nothing is stored anywhere: the signature
says the channel wrote the claims, and what makes a link one-time is the conversation itself.
Once the link's answer is applied the call is no longer pending (or, for a quorum, the
approver's vote is on it), so the same link finds nothing to answer; the web app says so before
it sends anything (``client/answer_view.py``). A call that pauses again (a restart that asks
anew) is a new pause, ``since`` differs, and the old link answers nothing there either.

Keys rotate: the first key signs, every key verifies, so a new key is put first in both places
and the old one is dropped once the links it signed have expired.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationError

LINK_LIFETIME = timedelta(days=3)
"""How long a link answers, unless the channel is told otherwise (the call's own deadline, if
sooner, ends it anyway: the call is no longer pending then)."""

MAX_LINK_LIFETIME = timedelta(days=30)
"""The longest life a link may be given."""

MIN_KEY_BYTES = 32
"""A link key's least length: as long as the HMAC-SHA256 output it keys."""

MAX_TOKEN_CHARS = 4096
"""The longest token read: a chat id, a ref, an identity and a few groups fit well within."""

# Binds a signature to this use of the key: a key shared by mistake with something else that
# signs with HMAC-SHA256 cannot be made to sign a link.
_DOMAIN = b"temporal-agent-interrupts/answer-link/1\0"


class LinkClaims(BaseModel):
    """What a link answers, and as whom. Short names keep the URL short."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    agent: str = Field(alias="a", min_length=1, max_length=256)
    chat_id: str = Field(alias="c", min_length=1, max_length=1000)
    ref: str = Field(alias="r", min_length=1, max_length=400)
    input_digest: str = Field(alias="d", min_length=1, max_length=128)
    # When the call paused (ISO 8601, "" when unknown): a call that pauses again on the same
    # ref is another pause, which an older link does not answer.
    since: str = Field(alias="s", max_length=64)
    identity: str = Field(alias="i", min_length=1, max_length=256)
    # The approver lists' ``group:NAME`` entries this approver was reached through (the
    # channel's directory said so when it signed).
    groups: tuple[str, ...] = Field(default=(), alias="g", max_length=16)
    # Unix seconds after which the link answers nothing.
    expires: int = Field(alias="e")

    @property
    def expires_at(self) -> datetime:
        return datetime.fromtimestamp(self.expires, UTC)


class LinkRefused(Exception):
    """A token that is not a link this app can take: why, in words for the person holding it
    (never quoting the token)."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _ALPHABET for c in text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _key_bytes(key: bytes | str) -> bytes:
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) < MIN_KEY_BYTES:
        raise ValueError(
            f"a link key has at least {MIN_KEY_BYTES} bytes (secrets.token_urlsafe(32) makes one)"
        )
    return raw


class AnswerLinks:
    """Signs and verifies answer links with HMAC-SHA256.

    Args:
        keys: The shared secrets, at least 32 bytes each: the first signs, each verifies.
        lifetime: How long a link it signs answers.

    Raises:
        ValueError: no key, a key too short, or a lifetime not between a minute and
            :data:`MAX_LINK_LIFETIME`.
    """

    def __init__(
        self, keys: Sequence[bytes | str] | bytes | str, *, lifetime: timedelta = LINK_LIFETIME
    ) -> None:
        given = [keys] if isinstance(keys, bytes | str) else list(keys)
        if not given:
            raise ValueError("answer links need a key")
        self._keys = [_key_bytes(k) for k in given]
        seconds = lifetime.total_seconds()
        if not math.isfinite(seconds) or not 60 <= seconds <= MAX_LINK_LIFETIME.total_seconds():
            raise ValueError(f"a link's lifetime is between a minute and {MAX_LINK_LIFETIME}")
        self.lifetime = lifetime

    def __repr__(self) -> str:
        # Never the keys.
        return f"AnswerLinks(keys={len(self._keys)}, lifetime={self.lifetime})"

    def sign(
        self,
        *,
        agent: str,
        chat_id: str,
        ref: str,
        input_digest: str,
        since: str,
        identity: str,
        groups: Sequence[str] = (),
        now: float | None = None,
    ) -> str:
        """A token for ``identity`` to answer the call ``ref`` of ``chat_id`` as shown.

        Raises:
            pydantic.ValidationError: a claim past its bound.
        """
        issued = time.time() if now is None else now
        claims = LinkClaims(
            a=agent,
            c=chat_id,
            r=ref,
            d=input_digest,
            s=since,
            i=identity,
            g=tuple(groups),
            e=math.ceil(issued + self.lifetime.total_seconds()),
        )
        body = _b64(
            json.dumps(
                claims.model_dump(by_alias=True, exclude_defaults=True),
                separators=(",", ":"),
                ensure_ascii=False,
            ).encode()
        )
        return f"{body}.{_b64(self._mac(self._keys[0], body))}"

    def verify(self, token: str, *, now: float | None = None) -> LinkClaims:
        """The claims of a token one of the keys signed, not yet expired.

        Raises:
            LinkRefused: malformed, signed by no key held here (or changed since), or expired.
        """
        if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
            raise LinkRefused("this link is not one this app made: it is cut, or changed")
        body, _, sig = token.partition(".")
        try:
            mac = _unb64(sig)
            _unb64(body)
        except (ValueError, binascii.Error):
            raise LinkRefused("this link is not one this app made: it is cut, or changed") from None
        # Every key is tried, each in constant time: which one matched says nothing.
        matched = [hmac.compare_digest(self._mac(k, body), mac) for k in self._keys]
        if not any(matched):
            raise LinkRefused(
                "this link's signature does not check: it was changed, or it was signed with a "
                "key this app no longer holds"
            )
        try:
            claims = LinkClaims.model_validate(json.loads(_unb64(body)))
        except (ValueError, ValidationError):
            # Signed by a key held here, yet not claims this version reads.
            raise LinkRefused("this link is of a form this app does not read") from None
        if (time.time() if now is None else now) >= claims.expires:
            raise LinkRefused(
                f"this link expired at {claims.expires_at:%Y-%m-%d %H:%M} UTC: answer from the "
                "inbox, or ask for a new one"
            )
        return claims

    @staticmethod
    def _mac(key: bytes, body: str) -> bytes:
        return hmac.new(key, _DOMAIN + body.encode("ascii"), hashlib.sha256).digest()


__all__ = [
    "LINK_LIFETIME",
    "MAX_LINK_LIFETIME",
    "MIN_KEY_BYTES",
    "AnswerLinks",
    "LinkClaims",
    "LinkRefused",
]

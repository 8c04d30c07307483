"""The workers' receipt keys (``AGENT_RECEIPT_KEYS``): Ed25519 keys that sign decision receipts
(``workflows.receipts``), and their public half as a JWK Set.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The same ``id:base64key[,id:base64key...]`` form as ``AGENT_PAYLOAD_KEYS``: each key is a 32-byte
Ed25519 seed; the first signs, and every listed key's public half is published, so receipts
signed before a rotation still verify. Rotate by putting a new key first and keeping the old one
listed (its public key must stay in the published set for as long as its receipts are checked).

Ed25519 signatures are deterministic (RFC 8032): the same key signs the same bytes the same way.
That is what lets the conversation sign in its own workflow task, through a function the worker
gives it (never a key in history): a replay on a worker with the same key reproduces each
signature, and a receipt's id, which the chain links, never depends on the signature, so a
replay on a worker whose signing key has rotated since still links the same chain (its memo,
read back from history, keeps the signatures the original run wrote).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from temporal_agent_interrupts.codec import PayloadKeys, generate_key
from temporal_agent_interrupts.worker.result_keys import dev_key_file, dev_key_text

ENV_VAR = "AGENT_RECEIPT_KEYS"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True)
class ReceiptKeys:
    """Ed25519 signing keys by key id; the first signs."""

    keys: tuple[tuple[str, Ed25519PrivateKey], ...]

    @classmethod
    def parse(cls, value: str, *, source: str = ENV_VAR) -> ReceiptKeys:
        """Read ``id:base64seed[,...]`` (32-byte seeds; the first signs).

        Raises:
            PayloadKeysError: an entry that cannot be used; the message never shows a key.
        """
        parsed = PayloadKeys.parse(value, source=source)
        return cls(
            keys=tuple(
                (kid, Ed25519PrivateKey.from_private_bytes(seed)) for kid, seed in parsed.keys
            )
        )

    @property
    def signing_key_id(self) -> str:
        return self.keys[0][0]

    def sign(self, data: bytes) -> tuple[str, str]:
        """``data`` signed by the first key: its key id and the signature (base64url)."""
        kid, key = self.keys[0]
        return kid, b64url(key.sign(data))

    def jwks(self) -> dict[str, Any]:
        """The public keys as a JWK Set (RFC 8037: ``OKP``, ``Ed25519``), every listed key."""
        return {
            "keys": [
                {
                    "kty": "OKP",
                    "crv": "Ed25519",
                    "kid": kid,
                    "use": "sig",
                    "alg": "EdDSA",
                    "x": b64url(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)),
                }
                for kid, key in self.keys
            ]
        }


def resolve_receipt_keys(given: ReceiptKeys | str | None) -> ReceiptKeys | None:
    """The keys given, or ``AGENT_RECEIPT_KEYS`` when none are; None when neither says any
    (receipts are then issued unsigned)."""
    if isinstance(given, ReceiptKeys):
        return given
    text = given if given is not None else os.environ.get(ENV_VAR, "")
    return ReceiptKeys.parse(text) if text.strip() else None


DEV_KEY_FILE = "dev-receipt-keys"
"""The development receipt key file's name, beside the development result key."""


def dev_receipt_key_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where a development machine keeps its receipt key: beside its result key (one per user,
    ``worker.result_keys.dev_key_file``)."""
    return dev_key_file(environ).with_name(DEV_KEY_FILE)


def dev_receipt_keys(path: Path | None = None) -> ReceiptKeys:
    """The receipt keys of a worker on the embedded default (the local dev server, nothing
    configured): ``AGENT_RECEIPT_KEYS`` when set, else the development key file, made once and
    readable by its owner only. So `make run` signs receipts, and ``agent-worker
    --print-receipt-jwks`` publishes the key that checks them. Never used for a configured
    server: a deployment sets ``AGENT_RECEIPT_KEYS`` (or issues its receipts unsigned)."""
    if os.environ.get(ENV_VAR, "").strip():
        return ReceiptKeys.parse(os.environ[ENV_VAR])
    path = path if path is not None else dev_receipt_key_file()
    text = dev_key_text(path, generate_receipt_key, what="receipt")
    return ReceiptKeys.parse(text, source=str(path))


def generate_receipt_key(key_id: str | None = None) -> str:
    """A new ``id:base64seed`` entry for ``AGENT_RECEIPT_KEYS`` (32 bytes from the OS)."""
    return generate_key(key_id)

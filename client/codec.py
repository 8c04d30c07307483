"""Payload encryption: AES-256-GCM on every payload the product writes to Temporal.

``AGENT_PAYLOAD_KEYS`` (``id:base64key[,id:base64key...]``, each key 32 random bytes) turns it
on. The first key encrypts; every listed key decrypts, so keys rotate by putting a new key first
and keeping the old ones listed until nothing written with them is still read (see the README's
"Production: data protection").

An encrypted payload carries ``encoding: binary/encrypted`` and ``encryption-key-id: <id>`` in
its metadata; its data is a 12-byte random nonce followed by the AES-GCM ciphertext (with its
16-byte tag) of the original ``Payload`` proto, serialized. The key id is the associated data, so
a payload cannot be passed off as written under another id.

The codec is always installed, with keys or without: without keys it passes payloads through
unchanged, and decoding an encrypted one raises :class:`PayloadKeyMissing`, whose message names
the key id and the variable, instead of the pydantic converter's "unknown encoding". Payloads
written before encryption was turned on (no ``binary/encrypted`` encoding) still decode.

Nothing here reads the environment at import: entry points call :func:`load_keys` (or
:func:`data_converter` without ``keys``) when they start.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Self

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)

from client.errors import ConnectionConfigError

ENV_VAR = "AGENT_PAYLOAD_KEYS"
ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce; random per payload (2^32 payloads a key stay safe)

# A key id travels in every payload's metadata and in error messages: short, and nothing that
# could be taken for the list's own separators or need quoting.
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class PayloadKeysError(ConnectionConfigError):
    """``AGENT_PAYLOAD_KEYS`` cannot be used; the message says which entry and why (never a
    key's bytes)."""


class PayloadKeyMissing(ConnectionConfigError):
    """A payload was encrypted with a key this process does not have (or with a different key
    under the same id).

    The class name is the failure ``type`` Temporal records when a worker cannot decode an
    activity's input (``workflows.types.ErrorKind.PAYLOAD_KEY_MISSING``): the workflow knows
    from it that the model or tool never ran, and schedules the call again.

    Attributes:
        key_id: The key id the payload names.
    """

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


@dataclasses.dataclass(frozen=True, repr=False)
class PayloadKeys:
    """The parsed ``AGENT_PAYLOAD_KEYS``: ``(id, key)`` pairs, the first one encrypting.

    Its ``repr`` names the ids only: a key's bytes never reach a log or a traceback.
    """

    keys: tuple[tuple[str, bytes], ...] = ()
    source: str = ENV_VAR
    """Where the keys came from, for messages (the variable's name)."""

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for key_id, key in self.keys:
            if not _KEY_ID.fullmatch(key_id):
                raise PayloadKeysError(_bad_id(key_id, self.source))
            if len(key) != KEY_BYTES:
                raise PayloadKeysError(
                    f"{self.source}: key {key_id!r} is {len(key)} bytes; AES-256 needs "
                    f"{KEY_BYTES} (generate one with `python -m worker.codec_server "
                    "--generate-key`)"
                )
            if key_id in seen:
                raise PayloadKeysError(f"{self.source}: key id {key_id!r} is listed twice")
            seen.add(key_id)

    @classmethod
    def parse(cls, value: str, *, source: str = ENV_VAR) -> Self:
        """Read ``id:base64key[,id:base64key...]``; whitespace around entries is ignored, and
        an empty value means no keys.

        Raises:
            PayloadKeysError: an entry without ``:``, a bad id, a key that is not base64 or not
                32 bytes, or an id listed twice. The message names the entry by its position
                and id, never by its key.
        """
        pairs: list[tuple[str, bytes]] = []
        for n, entry in enumerate(value.split(","), start=1):
            entry = entry.strip()
            if not entry:
                continue  # a trailing comma, or an empty value
            key_id, colon, encoded = entry.partition(":")
            key_id, encoded = key_id.strip(), encoded.strip()
            if not colon:
                raise PayloadKeysError(
                    f"{source}: entry {n} is not ID:BASE64KEY (expected "
                    "id:base64key[,id:base64key...])"
                )
            if not _KEY_ID.fullmatch(key_id):
                raise PayloadKeysError(_bad_id(key_id, source))
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise PayloadKeysError(
                    f"{source}: the key of {key_id!r} is not valid base64"
                ) from None
            pairs.append((key_id, key))
        return cls(tuple(pairs), source=source)

    def __repr__(self) -> str:
        return f"PayloadKeys(ids={list(self.ids)!r}, source={self.source!r})"

    def __bool__(self) -> bool:
        return bool(self.keys)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id for key_id, _ in self.keys)

    @property
    def encrypting_id(self) -> str | None:
        """The id new payloads are encrypted with (the first), or None without keys."""
        return self.keys[0][0] if self.keys else None


NO_KEYS = PayloadKeys()
"""No encryption: payloads pass through, and an encrypted one fails to decode by name."""


def _bad_id(key_id: str, source: str) -> str:
    shown = repr(key_id) if len(key_id) <= 80 else repr(key_id[:80]) + "..."
    return (
        f"{source}: key id {shown} is not usable; an id is 1 to 64 letters, digits, '.', '_' or '-'"
    )


def load_keys(environ: Mapping[str, str] | None = None) -> PayloadKeys:
    """The keys ``AGENT_PAYLOAD_KEYS`` lists (:data:`NO_KEYS` when unset or empty).

    Called by entry points (``python -m worker``, ``AgentClient.connect``, ``agentctl``, the
    demo, the bench, the codec server) when they start, never at import.

    Raises:
        PayloadKeysError: the value cannot be used (see :meth:`PayloadKeys.parse`).
    """
    env = os.environ if environ is None else environ
    return PayloadKeys.parse(env.get(ENV_VAR) or "")


def generate_key(key_id: str | None = None) -> str:
    """A new ``id:base64key`` entry for ``AGENT_PAYLOAD_KEYS``: 32 bytes from the OS's CSPRNG.

    Args:
        key_id: The id; by default ``k`` and today's UTC date (``k20261201``), which keeps
            rotated keys in order.

    Raises:
        PayloadKeysError: ``key_id`` is not a usable id.
    """
    key_id = key_id if key_id is not None else f"k{datetime.now(UTC):%Y%m%d}"
    if not _KEY_ID.fullmatch(key_id):
        raise PayloadKeysError(_bad_id(key_id, "--generate-key"))
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode('ascii')}"


MissingKeyHook = Callable[[PayloadKeyMissing], None]


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """AES-256-GCM over whole payloads, with the key id in the metadata (module docstring).

    Args:
        keys: The keys; :data:`NO_KEYS` (the default) passes payloads through.
        on_missing_key: Called with the error, just before it is raised, whenever a payload
            cannot be decrypted here. ``python -m worker`` uses it to stop: a worker that
            cannot read a conversation must leave it to workers that can.
    """

    def __init__(
        self,
        keys: PayloadKeys = NO_KEYS,
        *,
        on_missing_key: MissingKeyHook | None = None,
    ) -> None:
        self.keys = keys
        self.on_missing_key = on_missing_key
        # One cipher per key, made once (the codec runs on every payload).
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys}
        self._encrypting = keys.encrypting_id
        self._where = ""

    def with_context(self, context: SerializationContext) -> Self:
        """The same keys, naming the conversation in error messages (the SDK hands every
        workflow activation and activity task its context)."""
        workflow_id = (
            context.workflow_id
            if isinstance(context, WorkflowSerializationContext | ActivitySerializationContext)
            else None
        )
        if not workflow_id:
            return self
        clone = copy.copy(self)
        clone._where = f"conversation {workflow_id!r}"
        return clone

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._encrypting is None:
            return list(payloads)
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        """``payload`` encrypted with the first key (already encrypted ones are kept as they
        are: a payload copied from history is not wrapped twice)."""
        if self._encrypting is None or payload.metadata.get("encoding") == ENCODING:
            return payload
        key_id = self._encrypting.encode("ascii")
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[self._encrypting].encrypt(nonce, payload.SerializeToString(), key_id)
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id}, data=nonce + sealed
        )

    def decrypt(self, payload: Payload) -> Payload:
        """The original payload; one that is not encrypted is returned as it is.

        Raises:
            PayloadKeyMissing: no key with the payload's id here, or that key does not open it.
        """
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID_METADATA, b"")
        key_id = raw_id.decode("utf-8", "replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise self._missing(
                key_id,
                f"payload encrypted with key id {key_id!r}, which {self.keys.source} does not "
                f"list ({self._listing()}){self._at()}: {self._remedy()}",
            )
        data = payload.data
        try:
            opened = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], raw_id)
            return Payload.FromString(opened)
        except (InvalidTag, DecodeError):
            raise self._missing(
                key_id,
                f"payload encrypted with key id {key_id!r} does not decrypt with the key "
                f"{self.keys.source} gives that id{self._at()}: the id names another key there, "
                "or the payload was altered",
            ) from None

    def _listing(self) -> str:
        ids = self.keys.ids
        return f"it lists {', '.join(ids)}" if ids else "it is not set"

    def _remedy(self) -> str:
        if self.keys:
            return f"add that key to {self.keys.source}, after the key that encrypts"
        return f"set {self.keys.source} to the keys this conversation was written with"

    def _at(self) -> str:
        return f", in {self._where}" if self._where else ""

    def _missing(self, key_id: str, message: str) -> PayloadKeyMissing:
        error = PayloadKeyMissing(message, key_id=key_id)
        if self.on_missing_key is not None:
            self.on_missing_key(error)
        return error


def data_converter(
    keys: PayloadKeys | str | None = None, *, on_missing_key: MissingKeyHook | None = None
) -> DataConverter:
    """The pydantic data converter with the payload codec: what every client and worker here
    connects with. With keys, failure messages and stack traces are encrypted too.

    Args:
        keys: The keys; a string is parsed as ``AGENT_PAYLOAD_KEYS`` is; ``None`` reads
            ``AGENT_PAYLOAD_KEYS`` now (entry points only). :data:`NO_KEYS` turns encryption off
            and still installs the codec, so an encrypted payload fails by name.
        on_missing_key: See :class:`EncryptionCodec`.

    Raises:
        PayloadKeysError: the keys cannot be used.
    """
    if keys is None:
        keys = load_keys()
    elif isinstance(keys, str):
        keys = PayloadKeys.parse(keys)
    converter = dataclasses.replace(
        pydantic_data_converter,
        payload_codec=EncryptionCodec(keys, on_missing_key=on_missing_key),
    )
    if keys:
        # A failure's message and stack trace are not payloads, and a tool's error can quote its
        # input: with keys they travel in the failure's encoded attributes (a payload, so
        # encrypted), and history shows "Encoded failure" in their place. Without keys they stay
        # readable, so a worker that lacks a key can say which one in its task failure.
        converter = dataclasses.replace(
            converter, failure_converter_class=DefaultFailureConverterWithEncodedAttributes
        )
    return converter


def codec_of(converter: DataConverter) -> EncryptionCodec | None:
    """The encryption codec a data converter carries, if it is ours."""
    codec = converter.payload_codec
    return codec if isinstance(codec, EncryptionCodec) else None


__all__ = [
    "ENCODING",
    "ENV_VAR",
    "KEY_BYTES",
    "KEY_ID_METADATA",
    "NONCE_BYTES",
    "NO_KEYS",
    "EncryptionCodec",
    "PayloadKeyMissing",
    "PayloadKeys",
    "PayloadKeysError",
    "codec_of",
    "data_converter",
    "generate_key",
    "load_keys",
]

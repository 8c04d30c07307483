"""Payload encryption: AES-256-GCM on every payload the product writes to Temporal.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.payloads`` (and its errors from ``temporal_agent_interrupts.errors``).

``AGENT_PAYLOAD_KEYS`` (``id:base64key[,id:base64key...]``, each key 32 random bytes) turns it
on. The first key encrypts; every listed key decrypts, so keys rotate by putting a new key first
and keeping the old ones listed until nothing written with them is still read (see
docs/data-protection.md).

An encrypted payload carries ``encoding: binary/encrypted`` and ``encryption-key-id: <id>`` in
its metadata; its data is a 12-byte random nonce followed by the AES-GCM ciphertext (with its
16-byte tag) of the original ``Payload`` proto, serialized. The key id is the associated data, so
a payload cannot be passed off as written under another id.

The codec is always installed, with keys or without: without keys it passes payloads through
unchanged. Payloads written before encryption was turned on (no ``binary/encrypted`` encoding)
still decode.

Decoding is lenient: a payload the codec cannot open (a key id it lacks, a failed tag, data too
short to hold a nonce and a tag) is left as it is, still ``binary/encrypted``. What happens then
is the payload converter's business (:class:`AgentPayloadConverter`, which
:func:`data_converter` installs): converting such a payload to a value raises
:class:`PayloadKeyMissing`, naming the key id, so clients fail as before; but a signal or update
handler that takes raw payloads (``RawValue``) receives it still encrypted and can refuse it in
words, and a payload nobody converts (a signal's argument in history) stops nothing. The SDK
decodes every payload of a workflow activation at once, caller-chosen ones included, so a codec
that raised would let anyone who can signal a conversation fail its workflow task for ever.

Nothing here reads the environment at import: entry points call :func:`load_keys` (or
:func:`data_converter` without ``keys``) when they start.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import dataclasses
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Self, cast

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio import workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    DefaultFailureConverter,
    EncodingPayloadConverter,
    PayloadCodec,
    PayloadConverter,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationErrorCategory, FailureError, TimeoutType

from temporal_agent_interrupts.errors import ConnectionConfigError

ENV_VAR = "AGENT_PAYLOAD_KEYS"
ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce; random per payload (2^32 payloads a key stay safe)
TAG_BYTES = 16  # GCM's tag, at the end of the ciphertext
DECODING_FAILED = "Failed decoding arguments"
"""The message of the error the SDK raises when it cannot convert an activity's or a workflow's
arguments (``temporalio/worker/_activity.py``, ``_workflow_instance.py``); the error that says
why is its cause."""

# A key id travels in every payload's metadata and in error messages: short, and nothing that
# could be taken for the list's own separators or need quoting.
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_QUOTED_ID = 32  # see _named


class PayloadKeysError(ConnectionConfigError):
    """``AGENT_PAYLOAD_KEYS`` cannot be used; the message says which entry and why (never a
    key's bytes)."""


class PayloadKeyMissing(ConnectionConfigError):
    """A payload cannot be decrypted here: it was encrypted with a key this process does not
    have, or (``corrupt``) its id names a key here that does not open it (another key under the
    same id, or data altered or cut short).

    The class name is the failure ``type`` Temporal records when a worker cannot decode an
    activity's input (``workflows.types.ErrorKind.PAYLOAD_KEY_MISSING``): the workflow knows
    from it, under the SDK's "Failed decoding arguments", that the model or tool never ran, and
    schedules the call again.

    Attributes:
        key_id: The key id the payload names (``?`` when it names none that could be an id).
        corrupt: This process has a key with that id, and it does not open the payload.
    """

    def __init__(self, message: str, *, key_id: str, corrupt: bool = False) -> None:
        super().__init__(message)
        self.key_id = key_id
        self.corrupt = corrupt


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
        for n, (key_id, key) in enumerate(self.keys, start=1):
            if not _KEY_ID.fullmatch(key_id):
                raise PayloadKeysError(_bad_id(key_id, self.source, entry=n))
            if len(key) != KEY_BYTES:
                raise PayloadKeysError(
                    f"{self.source}: key {_named(key_id, n)} is {len(key)} bytes; AES-256 needs "
                    f"{KEY_BYTES} (generate one with `agent-codec-server "
                    "--generate-key`)"
                )
            if key_id in seen:
                raise PayloadKeysError(f"{self.source}: key id {_named(key_id, n)} is listed twice")
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
                raise PayloadKeysError(_bad_id(key_id, source, entry=n))
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise PayloadKeysError(
                    f"{source}: key {_named(key_id, n)} is not valid base64"
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


def _named(key_id: str, entry: int) -> str:
    """A usable id as a message names its key: quoted if short. A long one may be a key written
    where the id goes (unpadded, a key's base64 is 43 letters and digits about a quarter of the
    time, a usable id), so it is named by its position and length instead."""
    if len(key_id) <= MAX_QUOTED_ID:
        return repr(key_id)
    return f"at entry {entry} (its id is {len(key_id)} characters)"


def _bad_id(key_id: str, source: str, *, entry: int | None = None) -> str:
    """What is wrong with an id that fails the check, by its length and position only: an
    entry written key first (``base64key:id``) has the key where the id goes, and a message
    must never print a key."""
    where = f"entry {entry}: " if entry is not None else ""
    return (
        f"{source}: {where}the key id ({len(key_id)} characters) is not usable; an id is 1 to "
        "64 letters, digits, '.', '_' or '-', and comes first (id:base64key)"
    )


def load_keys(environ: Mapping[str, str] | None = None) -> PayloadKeys:
    """The keys ``AGENT_PAYLOAD_KEYS`` lists (:data:`NO_KEYS` when unset or empty).

    Called by entry points (``agent-worker``, ``AgentClient.connect``, ``agentctl``, the
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


def _shown_id(raw: bytes) -> tuple[str, str]:
    """A payload's key id as messages show it, and as :attr:`PayloadKeyMissing.key_id` keeps it.

    The id comes from the payload, which whoever wrote it chose: one that could not be an id
    (too long, control characters, not ASCII) is described by its length, never quoted.
    """
    key_id = raw.decode("ascii", "replace")
    if _KEY_ID.fullmatch(key_id):
        return repr(key_id), key_id
    return f"<unusable, {len(raw)} bytes>", "?"


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """AES-256-GCM over whole payloads, with the key id in the metadata (module docstring).

    Args:
        keys: The keys; :data:`NO_KEYS` (the default) passes payloads through.
    """

    def __init__(self, keys: PayloadKeys = NO_KEYS) -> None:
        self.keys = keys
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
        """Each payload decrypted, or left as it is when it cannot be (see the module
        docstring: the payload converter says why, if anything converts it)."""
        return [self._open(p) for p in payloads]

    def _open(self, payload: Payload) -> Payload:
        try:
            return self.decrypt(payload)
        except PayloadKeyMissing:
            return payload

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
            PayloadKeyMissing: no key with the payload's id here, or that key does not open it
                (its data altered, or too short to be a nonce and a tag).
        """
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID_METADATA, b"")
        cipher = self._ciphers.get(raw_id.decode("ascii", "replace"))
        data = payload.data
        if cipher is None or len(data) < NONCE_BYTES + TAG_BYTES:
            raise self.undecryptable(payload)
        try:
            return Payload.FromString(
                cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], raw_id)
            )
        except (InvalidTag, DecodeError):
            raise self.undecryptable(payload) from None

    def undecryptable(self, payload: Payload) -> PayloadKeyMissing:
        """Why an encrypted payload does not decrypt here, as the error to raise: a key id this
        process lacks, or one it has whose key does not open the payload (``corrupt``)."""
        shown, key_id = _shown_id(payload.metadata.get(KEY_ID_METADATA, b""))
        if key_id not in self._ciphers:
            return PayloadKeyMissing(
                f"payload encrypted with key id {shown}, which {self.keys.source} does not "
                f"list ({self._listing()}){self._at()}: {self._remedy()}",
                key_id=key_id,
            )
        size = len(payload.data)
        if size < NONCE_BYTES + TAG_BYTES:
            why = (
                f"is malformed: its data is {size} bytes, shorter than a nonce and a tag "
                f"({NONCE_BYTES + TAG_BYTES}); it was cut short or altered"
            )
        else:
            why = (
                f"does not decrypt with the key {self.keys.source} gives that id: the id names "
                "another key there, or the payload was altered"
            )
        return PayloadKeyMissing(
            f"payload encrypted with key id {shown} {why}{self._at()}", key_id=key_id, corrupt=True
        )

    def _listing(self) -> str:
        ids = self.keys.ids
        return f"it lists {', '.join(ids)}" if ids else "it is not set"

    def _remedy(self) -> str:
        if self.keys:
            return f"add that key to {self.keys.source}, after the key that encrypts"
        return f"set {self.keys.source} to the keys this conversation was written with"

    def _at(self) -> str:
        return f", in {self._where}" if self._where else ""


def _in_workflow_code() -> bool:
    """Whether a conversion runs for a workflow (its activation, or a handler in it), not for an
    activity task or a client.

    ``workflow.in_workflow()`` alone does not tell: the SDK converts a workflow's start input,
    its activities' results and its handlers' arguments in ``activate()``, outside the workflow's
    event loop, on a worker thread that runs no event loop at all (inside the sandbox, for a
    sandboxed workflow). Activity tasks and clients convert on the worker's event loop.
    """
    if workflow.in_workflow() or workflow.unsafe.in_sandbox():
        return True
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


class EncryptedPayloadConverter(EncodingPayloadConverter, WithSerializationContext):
    """``binary/encrypted``: what the codec could not open reaches the payload converter still
    encrypted, and converting it to a value raises :class:`PayloadKeyMissing` with the reason
    (a key id this process lacks, or a key that does not open it).

    Args:
        codec: The codec whose keys the messages name (its context names the conversation).
        on_missing_key: Called with the error just before it is raised, only for an activity's
            input decoded by an activity worker: the one payload a worker meets that its fleet
            wrote (the workflow re-encrypts every activity input with the fleet's key) and that
            no caller chose. ``agent-worker`` stops on it (exit 3). Never called for what a
            workflow converts (its input, signal, update and query arguments, activity results)
            or for a client.
        context: The serialization context (the SDK sets it per task).
    """

    def __init__(
        self,
        codec: EncryptionCodec,
        on_missing_key: MissingKeyHook | None = None,
        context: SerializationContext | None = None,
    ) -> None:
        self._codec = codec
        self._on_missing_key = on_missing_key
        self._context = context

    @property
    def encoding(self) -> str:
        return ENCODING.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None  # never writes: the codec encrypts

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        error = self._codec.undecryptable(payload)
        if (
            self._on_missing_key is not None
            and isinstance(self._context, ActivitySerializationContext)
            and not _in_workflow_code()
        ):
            self._on_missing_key(error)
        raise error

    def with_context(self, context: SerializationContext) -> Self:
        return type(self)(self._codec.with_context(context), self._on_missing_key, context)


UNREADABLE_DETAIL = "(a failure detail that does not convert)"
"""What :class:`ReadingFailureConverter` reads a failure detail it cannot convert as."""


def awaits_a_key(error: BaseException) -> bool:
    """Whether ``error`` (or a cause of it) is a :class:`PayloadKeyMissing` for a key this
    process does not hold (not ``corrupt``): a process that holds the key can read it."""
    found: BaseException | None = error
    while found is not None:
        if isinstance(found, PayloadKeyMissing):
            return not found.corrupt
        found = found.__cause__
    return False


class AgentPayloadConverter(PydanticPayloadConverter):
    """The pydantic payload converter, plus :class:`EncryptedPayloadConverter` for
    ``binary/encrypted`` (last: it never writes, so values never reach it).

    The SDK makes converters from the class with no arguments (a workflow makes its own), so
    the keys and the hook ride on a subclass: :meth:`bound` makes one, and :func:`data_converter`
    installs it.
    """

    codec: ClassVar[EncryptionCodec] = EncryptionCodec(NO_KEYS)
    on_missing_key: ClassVar[MissingKeyHook | None] = None

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)  # through the class: a function kept on an instance would bind
        self._set_converters(
            *self.converters.values(), EncryptedPayloadConverter(cls.codec, cls.on_missing_key)
        )

    @classmethod
    def bound(
        cls, keys: PayloadKeys, on_missing_key: MissingKeyHook | None = None
    ) -> type[AgentPayloadConverter]:
        """A subclass whose instances name ``keys`` in their messages and call
        ``on_missing_key`` (see :class:`EncryptedPayloadConverter`)."""
        attributes = {
            "codec": EncryptionCodec(keys),
            "on_missing_key": staticmethod(on_missing_key) if on_missing_key else None,
        }
        return cast("type[AgentPayloadConverter]", type(cls.__name__, (cls,), attributes))

    def with_context(self, context: SerializationContext) -> Self:
        # Only the encrypted converter takes a context. The SDK's composite would make a whole
        # new pydantic converter, dropping its cache of type adapters, for every conversion.
        clone = copy.copy(self)
        clone.converters = {
            encoding: c.with_context(context) if isinstance(c, WithSerializationContext) else c
            for encoding, c in self.converters.items()
        }
        return clone


def _readable(exception: BaseException) -> str | None:
    """The message of a failure that names no payload's content, kept readable with keys."""
    message = exception.message if isinstance(exception, FailureError) else str(exception)
    if isinstance(exception, PayloadKeyMissing) or message == DECODING_FAILED:
        return message
    return None


class _LenientDetails(PayloadConverter):
    """A payload converter that reads a failure's details one by one, an unconvertible one as
    :data:`UNREADABLE_DETAIL` (but one encrypted with a key this process lacks, which raises)."""

    def __init__(self, inner: PayloadConverter) -> None:
        self.inner = inner

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        return self.inner.to_payloads(values)

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        return self.inner.from_payloads(payloads, type_hints)

    def from_payloads_wrapper(self, payloads: Payloads | None) -> list[Any]:
        if not payloads or not payloads.payloads:
            return []
        details: list[Any] = []
        for payload in payloads.payloads:
            try:
                details.extend(self.inner.from_payloads([payload]))
            except Exception as e:
                if awaits_a_key(e):
                    raise
                details.append(UNREADABLE_DETAIL)
        return details


class ReadingFailureConverter(DefaultFailureConverter):
    """The SDK's failure converter, but a failure detail that does not convert reads as
    :data:`UNREADABLE_DETAIL`. The SDK reads details eagerly, in a workflow's activation; a
    failure completed by id (``RespondActivityTaskFailedById``) carries anyone's bytes, and one
    it could not convert would fail the workflow task on every replay (a stuck chat). No seal
    verifies the placeholder (``workflows.seal``): the workflow refuses the failure. A detail
    encrypted with a key this process lacks still raises: a worker that holds the key reads it.
    """

    def from_failure(self, failure: Failure, payload_converter: PayloadConverter) -> BaseException:
        if not isinstance(payload_converter, _LenientDetails):
            payload_converter = _LenientDetails(payload_converter)
        return super().from_failure(_known_enums(failure), payload_converter)


_TIMEOUT_TYPES = frozenset({0, *(int(t) for t in TimeoutType)})
_CATEGORIES = frozenset({0, *(int(c) for c in ApplicationErrorCategory)})


def _known_enums(failure: Failure) -> Failure:
    """``failure`` with an enum value the SDK has no member for read as unspecified. The SDK
    converts them eagerly (``TimeoutType(n)``), in a workflow's activation: one sent by id with
    any other number raised there on every replay. (Its causes pass through here in turn.)"""
    timeout = failure.timeout_failure_info.timeout_type
    category = failure.application_failure_info.category
    if timeout in _TIMEOUT_TYPES and category in _CATEGORIES:
        return failure
    known = Failure()
    known.CopyFrom(failure)
    if failure.HasField("timeout_failure_info") and timeout not in _TIMEOUT_TYPES:
        known.timeout_failure_info.timeout_type = 0  # type: ignore[assignment]
    if failure.HasField("application_failure_info") and category not in _CATEGORIES:
        known.application_failure_info.category = 0  # type: ignore[assignment]
    return known


class AgentFailureConverter(ReadingFailureConverter):
    """With keys: a failure's message and stack trace travel encrypted (a tool's error can quote
    its input), but for two fixed texts that name no payload's content: the SDK's "Failed
    decoding arguments" and :class:`PayloadKeyMissing`'s message (key ids, the variable, the
    conversation's id). A workflow must read them, though written by a worker with other keys,
    to know that a call never ran; and the failed task says which key id is missing.
    """

    def __init__(self) -> None:
        super().__init__(encode_common_attributes=True)

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        message = _readable(exception)
        if message is not None:
            failure.message = message  # the stack trace stays encrypted


def data_converter(
    keys: PayloadKeys | str | None = None, *, on_missing_key: MissingKeyHook | None = None
) -> DataConverter:
    """The pydantic data converter with the payload codec: what every client and worker here
    connects with. With keys, failure messages and stack traces are encrypted too (but
    :class:`AgentFailureConverter`'s fixed texts).

    Args:
        keys: The keys; a string is parsed as ``AGENT_PAYLOAD_KEYS`` is; ``None`` reads
            ``AGENT_PAYLOAD_KEYS`` now (entry points only). :data:`NO_KEYS` turns encryption off
            and still installs the codec and :class:`AgentPayloadConverter`, so an encrypted
            payload fails by name.
        on_missing_key: See :class:`EncryptedPayloadConverter`: called for an activity's input
            that an activity worker cannot decrypt, and for nothing else.

    Raises:
        PayloadKeysError: the keys cannot be used.
    """
    if keys is None:
        keys = load_keys()
    elif isinstance(keys, str):
        keys = PayloadKeys.parse(keys)
    converter = dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=AgentPayloadConverter.bound(keys, on_missing_key),
        payload_codec=EncryptionCodec(keys),
    )
    if keys:
        # A failure's message and stack trace are not payloads, and a tool's error can quote its
        # input: with keys they travel in the failure's encoded attributes (a payload, so
        # encrypted), and history shows "Encoded failure" in their place, but for the fixed
        # texts that say a payload could not be decrypted (AgentFailureConverter).
        return dataclasses.replace(converter, failure_converter_class=AgentFailureConverter)
    return dataclasses.replace(converter, failure_converter_class=ReadingFailureConverter)


def codec_of(converter: DataConverter) -> EncryptionCodec | None:
    """The encryption codec a data converter carries, if it is ours."""
    codec = converter.payload_codec
    return codec if isinstance(codec, EncryptionCodec) else None


__all__ = [
    "DECODING_FAILED",
    "ENCODING",
    "ENV_VAR",
    "KEY_BYTES",
    "KEY_ID_METADATA",
    "NONCE_BYTES",
    "NO_KEYS",
    "TAG_BYTES",
    "AgentFailureConverter",
    "AgentPayloadConverter",
    "EncryptedPayloadConverter",
    "EncryptionCodec",
    "PayloadKeyMissing",
    "PayloadKeys",
    "PayloadKeysError",
    "codec_of",
    "data_converter",
    "generate_key",
    "load_keys",
]

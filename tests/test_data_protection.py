"""Data protection: payload encryption (``client.codec``) and the codec server.

With ``AGENT_PAYLOAD_KEYS`` set, nothing a conversation holds (the user's message, the model's
text, tool inputs and outputs, answers, identities, the memo the inbox reads) is stored in
Temporal in the clear: the raw history and the workflow's description, read by a client without
the codec, are searched byte by byte for the conversation's distinctive strings. The product's
readers (``AgentClient``, ``agentctl``) and the codec server read them back with the key; keys
rotate; a process without the key fails naming it. A worker stops only for an activity's input
(which its fleet wrote), and the call is scheduled again, not failed; what a caller chooses (a
signal, an update, a query, a start under a foreign key) is refused or fails on its own and
stops nothing. The key parsing and the codec itself are tested without a server first.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    DefaultPayloadConverter,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from examples import ALL_AGENTS as EXAMPLE_AGENTS
from temporal_agent_interrupts import AgentClient, FinishReason, tool
from temporal_agent_interrupts.activities.runtime import AgentActivities
from temporal_agent_interrupts.codec import (
    DECODING_FAILED,
    ENCODING,
    ENV_VAR,
    KEY_ID_METADATA,
    NO_KEYS,
    AgentFailureConverter,
    AgentPayloadConverter,
    EncryptionCodec,
    PayloadKeyMissing,
    PayloadKeys,
    PayloadKeysError,
    ReadingFailureConverter,
    codec_of,
    data_converter,
    generate_key,
    load_keys,
)
from temporal_agent_interrupts.codec_server import CodecServer
from temporal_agent_interrupts.errors import ConnectionConfigError
from temporal_agent_interrupts.worker import agent_converter, build_worker
from temporal_agent_interrupts.worker.devserver import dev_server_command
from temporal_agent_interrupts.worker.result_keys import parse_result_keys
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted, offline
from temporal_agent_interrupts.workflows import Agent, config, executing
from temporal_agent_interrupts.workflows import payloads as workflow_payloads
from temporal_agent_interrupts.workflows.config import (
    AGENT_NAME,
    AGENT_STATUS,
    INTERRUPTED_SINCE,
    PENDING_INTERRUPTS,
    TOOL_ACTIVITY,
)
from temporal_agent_interrupts.workflows.types import ErrorKind, InterruptRequest
from tests import agents as t
from tests.helpers import (
    RESULT_KEYS,
    assert_no_workflow_task_failed,
    eventually,
    server_address,
    temporal_cli,
)
from tests.test_operator import AGENTCTL, VISIBILITY_TIMEOUT
from tests.test_worker_process import Process, bare_environ, free_port

ROOT = Path(__file__).parent.parent
# Random keys for this run: nothing here comes from the environment.
K1 = generate_key("k1")
K2 = generate_key("k2")
UI_ORIGIN = "http://localhost:8233"
OUR_SEARCH_ATTRIBUTES = {AGENT_NAME.name, AGENT_STATUS.name, PENDING_INTERRUPTS.name}


def missing_message(key_id: str) -> str:
    """The start of what every process without the key says (the issue's wording)."""
    return f"payload encrypted with key id {key_id!r}, which {ENV_VAR} does not list"


def key_bytes(entry: str) -> bytes:
    return base64.b64decode(entry.partition(":")[2])


def with_keys(client: Client, keys: str | PayloadKeys) -> Client:
    """The same connection, with the codec and these keys (as ``AGENT_PAYLOAD_KEYS`` gives)."""
    return Client(**{**client.config(), "data_converter": data_converter(keys)})


def without_codec(client: Client) -> Client:
    """The same connection with the plain pydantic converter: what anyone with read access to
    the namespace (or its database) sees."""
    return Client(**{**client.config(), "data_converter": pydantic_data_converter})


# --- key parsing and the codec, no server -------------------------------------------------------


def test_keys_parse_in_order_the_first_encrypting():
    keys = PayloadKeys.parse(f" {K2} ,\n{K1},")  # whitespace and a trailing comma are fine
    assert keys.ids == ("k2", "k1") and keys.encrypting_id == "k2"
    assert keys.keys[1][1] == key_bytes(K1)
    assert PayloadKeys.parse("") == NO_KEYS and not NO_KEYS and NO_KEYS.encrypting_id is None
    assert load_keys({}) == NO_KEYS
    assert load_keys({ENV_VAR: K1}).ids == ("k1",)


UNUSABLE = [
    ("k1", "entry 1 is not ID:BASE64KEY"),
    (f"{K1},nocolon", "entry 2 is not ID:BASE64KEY"),
    (f"bad id:{K1.partition(':')[2]}", "entry 1: the key id (6 characters) is not usable"),
    (f"{K2},k/1:{K1.partition(':')[2]}", "entry 2: the key id (3 characters) is not usable"),
    (f"{'k' * 65}:{K1.partition(':')[2]}", "(65 characters) is not usable; an id is 1 to 64"),
    (f":{K1.partition(':')[2]}", "entry 1: the key id (0 characters) is not usable"),
    ("k1:not base64!!", "key 'k1' is not valid base64"),
    (f"k1:{base64.b64encode(b'x' * 16).decode()}", "key 'k1' is 16 bytes; AES-256 needs 32"),
    (f"{K1},k1:{K2.partition(':')[2]}", "key id 'k1' is listed twice"),
]
"""Each unusable value and what the refusal says."""


# The values hold this run's random keys, and every pytest-xdist worker imports this module and
# draws keys of its own; the workers must collect the same test ids, so these are named by what
# the refusal says instead.
@pytest.mark.parametrize(("value", "says"), UNUSABLE, ids=[says for _, says in UNUSABLE])
def test_unusable_keys_are_refused_by_entry_never_quoting_a_key(value, says):
    with pytest.raises(PayloadKeysError) as caught:
        PayloadKeys.parse(value)
    message = str(caught.value)
    assert message.startswith(f"{ENV_VAR}: ") and says in message
    for entry in (K1, K2):
        assert entry.partition(":")[2] not in message
    # A setting to fix: agentctl and the worker report it as one (exit 2).
    assert isinstance(caught.value, ConnectionConfigError)


# A key whose base64 is all letters and digits: without its padding, a usable id.
ALNUM_KEY = base64.b64encode(b"A" * 32).decode()


@pytest.mark.parametrize(
    "value",
    [
        f"{K1.partition(':')[2]}:k1",  # written key first
        f"{K2},{K1.partition(':')[2]}:k1",
        f"{ALNUM_KEY.rstrip('=')}:k1",  # unpadded: passes as an id; "k1" is no base64
        f"{ALNUM_KEY.rstrip('=')}:key1",  # ... and "key1" is 3 bytes of base64
        f"{ALNUM_KEY.rstrip('=')}:{K1.partition(':')[2]},{ALNUM_KEY.rstrip('=')}:{K2.partition(':')[2]}",
    ],
    # Not the values, which hold this run's random keys (see UNUSABLE above).
    ids=["key-first", "second-entry-key-first", "alnum-key-first", "alnum-key-then-key1", "both"],
)
def test_an_entry_written_key_first_never_shows_the_key(value):
    """An id that fails the check is never quoted (its length and position only), nor is a
    long one that passes it: a key written where the id goes could be either."""
    with pytest.raises(PayloadKeysError) as caught:
        PayloadKeys.parse(value)
    message = str(caught.value)
    assert message.startswith(f"{ENV_VAR}: ") and "entry" in message, message
    for key in (K1.partition(":")[2], K2.partition(":")[2], ALNUM_KEY):
        assert key.rstrip("=")[:16] not in message, message
    with pytest.raises(PayloadKeysError) as built:
        PayloadKeys(((ALNUM_KEY.rstrip("="), b"x" * 3),))
    assert ALNUM_KEY[:16] not in str(built.value) and "(its id is 43 characters)" in str(
        built.value
    )


def test_keys_never_show_their_bytes():
    keys = PayloadKeys.parse(f"{K1},{K2}")
    shown = repr(keys) + str(keys)
    assert "k1" in shown and "k2" in shown
    assert K1.partition(":")[2] not in shown and str(key_bytes(K1)) not in shown


def test_generated_keys_are_fresh_32_byte_entries():
    entry = generate_key("rotation-2")
    assert entry.startswith("rotation-2:") and len(key_bytes(entry)) == 32
    assert key_bytes(generate_key("x")) != key_bytes(generate_key("x"))
    dated = generate_key()
    assert dated.startswith("k20") and PayloadKeys.parse(dated).encrypting_id == dated[:9]
    with pytest.raises(PayloadKeysError):
        generate_key("no spaces")


async def test_the_codec_round_trips_and_binds_the_key_id():
    codec = EncryptionCodec(PayloadKeys.parse(K1))
    original = Payload(metadata={"encoding": b"json/plain", "x": b"y"}, data=b'{"secret": 1}')
    (sealed,) = await codec.encode([original])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID_METADATA] == b"k1"
    assert b"secret" not in sealed.SerializeToString()
    assert len(sealed.data) == 12 + len(original.SerializeToString()) + 16  # nonce + tag
    (again,) = await codec.encode([original])
    assert again.data[:12] != sealed.data[:12]  # a random nonce each time
    assert await codec.decode([sealed, again]) == [original, original]
    # Encrypted once only; plaintext (written before encryption was on) still decodes.
    assert await codec.encode([sealed]) == [sealed]
    assert await codec.decode([original]) == [original]

    # The id is bound: the same key listed under another id does not open it, nor does
    # altered data. Decoding leaves such a payload as it is (the payload converter says why,
    # if anything converts it); decrypting it says why.
    renamed = EncryptionCodec(PayloadKeys.parse(f"k9:{K1.partition(':')[2]}"))
    moved = Payload()
    moved.CopyFrom(sealed)
    moved.metadata[KEY_ID_METADATA] = b"k9"
    assert await renamed.decode([moved]) == [moved]
    with pytest.raises(PayloadKeyMissing, match="key id 'k9' does not decrypt with the key") as e:
        renamed.decrypt(moved)
    assert e.value.corrupt and e.value.key_id == "k9"
    altered = Payload()
    altered.CopyFrom(sealed)
    altered.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    assert await codec.decode([altered]) == [altered]
    with pytest.raises(PayloadKeyMissing, match="or the payload was altered"):
        codec.decrypt(altered)
    with pytest.raises(PayloadKeyMissing, match="or the payload was altered"):
        await data_converter(K1).decode([altered])


@pytest.mark.parametrize("size", [0, 1, 27])
async def test_data_too_short_for_a_nonce_and_a_tag_is_corrupt_and_says_so(size):
    """Not a bare ValueError from the cipher: the key id, and that the data is malformed."""
    codec = EncryptionCodec(PayloadKeys.parse(K1))
    short = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"}, data=bytes(size))
    assert await codec.decode([short]) == [short]
    with pytest.raises(PayloadKeyMissing) as by_codec:
        codec.decrypt(short)
    with pytest.raises(PayloadKeyMissing) as by_converter:
        await data_converter(K1).decode([short])
    for caught in (by_codec, by_converter):
        message = str(caught.value)
        assert caught.value.corrupt and caught.value.key_id == "k1"
        assert f"key id 'k1' is malformed: its data is {size} bytes" in message
        assert "does not list" not in message  # the key is not what is missing
    # Without the key it is the key that is missing.
    with pytest.raises(PayloadKeyMissing, match=missing_message("k1")):
        await data_converter(K2).decode([short])


async def test_a_key_id_that_could_be_no_id_is_never_quoted():
    odd = Payload(
        metadata={"encoding": ENCODING, KEY_ID_METADATA: b"\x1b[31m" + b"z" * 500}, data=b""
    )
    with pytest.raises(PayloadKeyMissing) as caught:
        await data_converter(K1).decode([odd])
    assert "key id <unusable, 505 bytes>" in str(caught.value) and "zzz" not in str(caught.value)
    assert caught.value.key_id == "?"


async def test_without_the_key_a_payload_is_left_encrypted_and_converting_it_names_the_key():
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"1")
    none = EncryptionCodec(NO_KEYS)
    assert await none.encode([plain]) == [plain]
    (sealed,) = await EncryptionCodec(PayloadKeys.parse(K2)).encode([plain])
    # The codec never raises on the way in: what it cannot open stays as it is ...
    assert await none.decode([sealed]) == [sealed]
    in_chat = data_converter(NO_KEYS).with_context(
        WorkflowSerializationContext(namespace="ns", workflow_id="c-1")
    )
    # ... a handler taking raw payloads (the signals, resume) gets it so, to refuse in words ...
    assert await in_chat.decode([sealed], [RawValue]) == [RawValue(sealed)]
    # ... and converting it to a value says which key is missing.
    with pytest.raises(PayloadKeyMissing) as caught:
        await in_chat.decode([sealed])
    assert str(caught.value).startswith(missing_message("k2") + " (it is not set), in ")
    assert "conversation 'c-1'" in str(caught.value) and caught.value.key_id == "k2"
    assert not caught.value.corrupt
    # With other keys it says which it has, and what to do.
    with pytest.raises(PayloadKeyMissing) as other:
        await data_converter(K1).decode([sealed])
    assert str(other.value) == (
        missing_message("k2") + " (it lists k1): add that key to AGENT_PAYLOAD_KEYS, after the "
        "key that encrypts"
    )
    # The failure type the workflow recognises when an activity's input could not be read.
    assert PayloadKeyMissing.__name__ == ErrorKind.PAYLOAD_KEY_MISSING


async def test_the_missing_key_hook_fires_for_an_activitys_input_only():
    """``agent-worker`` stops (exit 3) on the hook: only for a payload its fleet wrote and
    no caller chose, an activity's input decoded by the activity worker."""
    seen: list[PayloadKeyMissing] = []
    converter = data_converter(K1, on_missing_key=seen.append)
    (sealed,) = await EncryptionCodec(PayloadKeys.parse(K2)).encode(
        [Payload(metadata={"encoding": b"json/plain"}, data=b"1")]
    )
    activity = ActivitySerializationContext(
        namespace="ns",
        workflow_id="c-1",
        workflow_type="AgentWorkflow",
        activity_type=TOOL_ACTIVITY,
        activity_id="1",
        activity_task_queue="q",
        is_local=False,
    )
    # A client's read (a query's result, a memo, an update's result): no.
    with pytest.raises(PayloadKeyMissing):
        await converter.with_context(WorkflowSerializationContext("ns", "c-1")).decode([sealed])
    with pytest.raises(PayloadKeyMissing):
        await converter.decode([sealed])
    # A workflow converting an activity's result (in its activation, on a worker thread that
    # runs no event loop): no.
    in_activation = converter.with_context(activity).payload_converter
    with pytest.raises(PayloadKeyMissing):
        await asyncio.to_thread(in_activation.from_payloads, [sealed])
    assert seen == []
    # An activity worker decoding the activity's input, on its event loop: yes.
    with pytest.raises(PayloadKeyMissing) as caught:
        await converter.with_context(activity).decode([sealed])
    assert seen == [caught.value] and "in conversation 'c-1'" in str(caught.value)


async def test_with_keys_failures_are_encrypted_but_for_the_texts_that_say_a_payload_was_not():
    """A workflow must read, from a worker with other keys, that an activity's input could not
    be decrypted (the call never ran): those fixed texts stay readable, nothing else does."""
    converter = data_converter(K1)
    failure = Failure()
    try:
        try:
            raise PayloadKeyMissing(missing_message("k9") + " (it lists k1)", key_id="k9")
        except PayloadKeyMissing as e:
            raise ApplicationError(DECODING_FAILED) from e
    except ApplicationError as e:
        await converter.encode_failure(e, failure)
    assert failure.message == DECODING_FAILED
    assert failure.cause.message == missing_message("k9") + " (it lists k1)"
    assert failure.cause.application_failure_info.type == ErrorKind.PAYLOAD_KEY_MISSING
    # Their stack traces stay encrypted, and any other message is.
    assert not failure.stack_trace and key_id_of(failure.encoded_attributes) == "k1"
    secret = Failure()
    await converter.encode_failure(RuntimeError("password hunter2"), secret)
    assert secret.message == "Encoded failure" and b"hunter2" not in secret.SerializeToString()


def test_the_workflow_knows_an_encrypted_payload_by_the_codecs_own_names():
    assert workflow_payloads.ENCRYPTED == ENCODING
    assert workflow_payloads.KEY_ID_METADATA == KEY_ID_METADATA
    assert executing.DECODING_FAILED == DECODING_FAILED


def activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError(
        "Activity task failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type=TOOL_ACTIVITY,
        activity_id="1",
        retry_state=None,
    )
    err.__cause__ = cause
    return err


def test_only_the_sdks_own_decoding_failure_counts_as_an_input_not_decrypted():
    """The workflow schedules a call again only for the SDK's "Failed decoding arguments" with
    a PayloadKeyMissing among its causes: a tool's own error of that type has run."""
    missing = ApplicationError(
        missing_message("k1") + " (it is not set)", type=ErrorKind.PAYLOAD_KEY_MISSING
    )
    sdk = ApplicationError(DECODING_FAILED)
    sdk.__cause__ = missing
    assert executing.undecryptable(activity_error(sdk)) == "'k1'"
    given_up = executing.activity_error(activity_error(sdk), what="tool 'lookup'")
    assert given_up.message == (
        "tool 'lookup' did not run: its input could not be decrypted (key id 'k1') by the "
        "workers that took it"
    )
    assert executing.classified(activity_error(sdk))  # it did not run: no "may have taken effect"
    # Encrypted by a worker with an older failure converter: still that shape, id unknown.
    hidden = ApplicationError(DECODING_FAILED)
    hidden.__cause__ = ApplicationError("Encoded failure", type=ErrorKind.PAYLOAD_KEY_MISSING)
    assert executing.undecryptable(activity_error(hidden)) == "unknown"
    # A tool's error of that type, raised or wrapped, or the SDK's text without it: not.
    wrapped = ApplicationError("could not read the other chat")
    wrapped.__cause__ = missing
    other = ApplicationError(DECODING_FAILED)
    other.__cause__ = ValueError("bad JSON")
    for cause in (missing, wrapped, other, ApplicationError(DECODING_FAILED)):
        assert executing.undecryptable(activity_error(cause)) is None, cause


async def test_rotation_in_the_codec_new_key_first_old_still_decrypts():
    old = EncryptionCodec(PayloadKeys.parse(K1))
    rotated = EncryptionCodec(PayloadKeys.parse(f"{K2},{K1}"))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"x"')
    (before,) = await old.encode([plain])
    (after,) = await rotated.encode([plain])
    assert after.metadata[KEY_ID_METADATA] == b"k2"
    assert await rotated.decode([before, after]) == [plain, plain]
    with pytest.raises(PayloadKeyMissing, match=missing_message("k2")):
        old.decrypt(after)


def test_the_data_converter_is_pydantic_with_the_codec_and_reads_the_env_only_when_asked(
    monkeypatch,
):
    monkeypatch.setenv(ENV_VAR, K1)
    converter = data_converter()
    assert issubclass(converter.payload_converter_class, AgentPayloadConverter)
    assert issubclass(converter.payload_converter_class, PydanticPayloadConverter)
    assert converter.failure_converter_class is AgentFailureConverter
    codec = codec_of(converter)
    assert codec is not None and codec.keys.ids == ("k1",)
    assert data_converter(NO_KEYS).failure_converter_class is ReadingFailureConverter
    explicit = codec_of(data_converter(NO_KEYS))
    assert explicit is not None and not explicit.keys  # installed, without keys
    assert codec_of(data_converter(K2)).keys.ids == ("k2",)  # type: ignore[union-attr]  # ours
    monkeypatch.setenv(ENV_VAR, "k1:short")
    with pytest.raises(PayloadKeysError):
        data_converter()


def test_the_embedded_dev_server_command_names_the_codec_endpoint():
    cmd = dev_server_command(db_file=None, codec_endpoint="http://localhost:8081")
    assert cmd[cmd.index("--ui-codec-endpoint") + 1] == "http://localhost:8081"
    assert "--ui-codec-endpoint" not in dev_server_command(db_file=None)
    headless = dev_server_command(db_file=None, headless=True, codec_endpoint="http://x:1")
    assert "--ui-codec-endpoint" not in headless  # no UI, nothing to point


def test_the_codec_server_refuses_to_start_without_keys_and_generates_one(tmp_path):
    environ = bare_environ(tmp_path, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "temporal_agent_interrupts.codec_server"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "AGENT_PAYLOAD_KEYS is not set" in run.stderr and "--generate-key" in run.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "temporal_agent_interrupts.codec_server"],
        env={**environ, ENV_VAR: "k1:AAAA"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "key 'k1' is 3 bytes" in bad.stderr
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "temporal_agent_interrupts.codec_server",
            "--generate-key",
            "k7",
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert PayloadKeys.parse(made.stdout.strip()).ids == ("k7",)


# --- reading raw history -----------------------------------------------------------------------


def payloads_in(message: Message, path: str = "") -> Iterator[tuple[str, Payload]]:
    """Every ``Payload`` anywhere in a proto message, with the field path that leads to it."""
    if isinstance(message, Payload):
        yield path, message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        where = f"{path}.{field.name}"
        if field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                if isinstance(item, Message):
                    yield from payloads_in(item, f"{where}[{key}]")
        elif isinstance(value, Message):
            yield from payloads_in(value, where)
        else:  # a repeated field of messages
            for item in value:
                yield from payloads_in(item, where)


def key_id_of(payload: Payload) -> str | None:
    if payload.metadata.get("encoding") != ENCODING:
        return None
    return payload.metadata[KEY_ID_METADATA].decode()


def must_be_plain(path: str) -> bool:
    """Payloads Temporal must read itself: search attributes (indexed for queries); and the
    headers that carry tracing context between processes."""
    return "search_attributes" in path or ".header." in path


async def raw_history(client: Client, chat_id: str) -> list[HistoryEvent]:
    return list((await without_codec(client).get_workflow_handle(chat_id).fetch_history()).events)


async def stored_bytes(client: Client, chat_id: str) -> bytes:
    """Everything Temporal stores about a conversation, as a client without the codec gets it:
    every event of its history, its description (memo and search attributes) and its entry in
    the visibility listing."""
    plain = without_codec(client)
    events = await raw_history(client, chat_id)
    desc = await plain.get_workflow_handle(chat_id).describe()
    listed = [wf.raw_info async for wf in plain.list_workflows(f'WorkflowId = "{chat_id}"')]
    return b"".join(
        [e.SerializeToString() for e in events]
        + [desc.raw_description.SerializeToString()]
        + [info.SerializeToString() for info in listed]
    )


def secrets_in(blob: bytes, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s.encode() in blob]


# --- one encrypted conversation, driven once for the tests that read it ------------------------


@dataclass
class Secrets:
    """The distinctive strings of the conversations below: none may be stored in the clear."""

    message: str
    said: str
    question: str
    key: str
    answer: str
    identity: str
    ticket: str
    reply: str

    @classmethod
    def fresh(cls) -> Secrets:
        s = f"zq{uuid.uuid4().hex[:10]}"
        return cls(
            message=f"{s}-message",
            said=f"{s}-said",
            question=f"{s}-question",
            key=f"{s}-input",
            answer=f"{s}-answer",
            identity=f"{s}@example.com",
            ticket=f"{s}-ticket",
            reply=f"{s}-reply streamed in several chunks",
        )

    def all(self) -> list[str]:
        values = [getattr(self, name) for name in self.__dataclass_fields__]
        # The lookup tool's output is its input upper-cased.
        return [*values, self.key.upper()]


def first_reply(s: Secrets) -> Reply:
    """The model says something and asks twice: an interrupt-only question and a gated lookup."""
    return Reply.streamed(
        calls(("approve", {"question": s.question}), ("lookup", {"key": s.key}), say=s.said),
        pieces=3,
    )


@dataclass
class Encrypted:
    client: Client  # with K1
    agents: AgentClient
    agent: str
    task_queue: str
    paused: str  # left paused on both interrupts
    done: str  # answered, and finished
    secrets: Secrets
    paused_description: bytes  # the raw description while `done` was paused (memo: pending)


def answers_for(res_interrupts: list[InterruptRequest], s: Secrets) -> list[Any]:
    by_name = {i.name: i for i in res_interrupts}
    return [
        by_name["approve"].respond({"approved": True, "note": s.answer}),
        by_name["lookup"].restart({"tool_approved": True}),
    ]


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def agentctl_env(encrypted: Encrypted, *, keys: str | None) -> dict[str, str]:
    """agentctl's environment: this server and task queue, and ``AGENT_PAYLOAD_KEYS`` as given
    (never the shell's)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TEMPORAL_") and k not in (ENV_VAR, "AGENTCTL_IDENTITY")
    }
    env.update(
        TEMPORAL_ADDRESS=server_address(encrypted.client),
        TEMPORAL_NAMESPACE=encrypted.client.namespace,
        AGENT_TASK_QUEUE=encrypted.task_queue,
        COLUMNS="200",
        NO_COLOR="1",
    )
    if keys is not None:
        env[ENV_VAR] = keys
    return env


async def agentctl(env: dict[str, str], *args: str, timeout: float = 60) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return Ran(proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode())


@pytest.fixture(scope="module")
async def encrypted(env: WorkflowEnvironment) -> AsyncIterator[Encrypted]:
    keyed = with_keys(env.client, K1)
    agent = t.ops_agent()
    s = Secrets.fresh()
    model = ScriptedModel([first_reply(s), first_reply(s), Reply.streamed(text(s.reply), pieces=4)])
    queue = f"dp-{uuid.uuid4()}"
    async with hosted(keyed, agents=[agent], model=model, task_queue=queue) as agents:
        paused = await agents.chat(agent.name, chat_id=f"{agent.name}-paused")
        turn = paused.send_stream(s.message)
        seen = [ev async for ev in turn]
        assert s.said in "".join(ev.text or "" for ev in seen if ev.kind == "text")
        assert (await turn.result()).finish_reason == FinishReason.INTERRUPTED

        done = await agents.chat(agent.name, chat_id=f"{agent.name}-done")
        res = await done.send(s.message)
        assert {i.name for i in res.interrupts} == {"approve", "lookup"}
        paused_description = (
            await without_codec(keyed).get_workflow_handle(done.id).describe()
        ).raw_description.SerializeToString()
        turn = done.resume_stream(
            answers=answers_for(res.interrupts, s), identity=s.identity, metadata={"t": s.ticket}
        )
        streamed = "".join([ev.text or "" async for ev in turn if ev.kind == "text"])
        final = await turn.result()
        assert final.finish_reason == FinishReason.STOP and final.text == s.reply
        assert streamed == s.reply
        # The tool ran, on its real input, and the model heard its output.
        (response,) = [r for r in model.requests[-1].function_responses() if r["name"] == "lookup"]
        assert response["response"]["value"] == s.key.upper()
        yield Encrypted(
            client=keyed,
            agents=agents,
            agent=agent.name,
            task_queue=queue,
            paused=paused.id,
            done=done.id,
            secrets=s,
            paused_description=paused_description,
        )


async def test_nothing_a_conversation_holds_is_stored_in_the_clear(encrypted: Encrypted):
    s = encrypted.secrets
    for chat_id in (encrypted.paused, encrypted.done):
        blob = await stored_bytes(encrypted.client, chat_id)
        assert secrets_in(blob, s.all()) == [], chat_id
    assert secrets_in(encrypted.paused_description, s.all()) == []

    # Every payload is encrypted with the first key, but what Temporal itself must index.
    for chat_id in (encrypted.paused, encrypted.done):
        events = await raw_history(encrypted.client, chat_id)
        found = [(p, pl) for e in events for p, pl in payloads_in(e)]
        assert found
        clear = [p for p, pl in found if key_id_of(pl) is None and not must_be_plain(p)]
        assert clear == [], clear
        assert {key_id_of(pl) for p, pl in found if not must_be_plain(p)} == {"k1"}
        # The memo writes (the inbox's pending list, the audit batches) are among them.
        assert any("upserted_memo" in p for p, _ in found)


async def test_search_attributes_hold_only_names_statuses_and_times(encrypted: Encrypted):
    plain = without_codec(encrypted.client)
    desc = await plain.get_workflow_handle(encrypted.paused).describe()
    info = desc.raw_description.workflow_execution_info
    # The memo is opaque without the key: a client without the codec cannot read it.
    assert set(info.memo.fields) >= {"pending"}
    for payload in info.memo.fields.values():
        assert key_id_of(payload) == "k1"
    with pytest.raises(Exception, match="encoding"):
        await desc.memo()
    attributes = desc.typed_search_attributes
    assert attributes.get(AGENT_NAME) == encrypted.agent
    assert attributes.get(AGENT_STATUS) == "interrupted"
    assert sorted(attributes.get(PENDING_INTERRUPTS) or []) == ["approve", "lookup"]
    assert attributes.get(INTERRUPTED_SINCE) is not None
    # Nothing else of ours: Temporal's own attributes aside, these four and no other.
    custom = {
        name
        for name in info.search_attributes.indexed_fields
        if not name.startswith(("Temporal", "BuildIds"))
    }
    assert custom <= {*OUR_SEARCH_ATTRIBUTES, INTERRUPTED_SINCE.name}, custom


async def test_the_inbox_agentctl_and_the_audit_read_it_with_the_key(encrypted: Encrypted):
    s = encrypted.secrets
    # The inbox decodes the memo (visibility alone).
    found = await eventually(
        lambda: encrypted.agents.pending(agent=encrypted.agent),
        lambda chats: [c.chat_id for c in chats] == [encrypted.paused],
        timeout=VISIBILITY_TIMEOUT,
    )
    inputs = " ".join(json.dumps(i.input) for i in found[0].interrupts)
    assert s.question in inputs and s.key in inputs
    # The audit trail decodes the memo batches out of the raw history events.
    (answered, restarted) = sorted(
        await encrypted.agents.audit(encrypted.done), key=lambda r: r.name
    )
    assert answered.output == {"approved": True, "note": s.answer}
    assert answered.identity == restarted.identity == s.identity

    keyed = agentctl_env(encrypted, keys=K1)
    pending = await agentctl(keyed, "pending", "--agent", encrypted.agent, "--json")
    assert pending.code == 0, pending.err
    (chat,) = pending.json()["conversations"]
    assert chat["chat_id"] == encrypted.paused and s.question in pending.out
    show = await agentctl(keyed, "show", encrypted.done, "--json")
    assert show.code == 0, show.err
    assert show.json()["last_turn"]["text"] == s.reply
    audit = await agentctl(keyed, "audit", encrypted.done, "--json")
    assert audit.code == 0, audit.err
    assert s.answer in audit.out and s.identity in audit.out

    # Without the key the inbox still lists the chat, from its search attributes, and says
    # which key would show the rest: one conversation of another key must not hide the others.
    no_keys = agentctl_env(encrypted, keys=None)
    keyless = await agentctl(no_keys, "pending", "--agent", encrypted.agent, "--json")
    assert keyless.code == 0, keyless.err
    (chat,) = keyless.json()["conversations"]
    assert chat["chat_id"] == encrypted.paused and chat["agent"] == encrypted.agent
    assert missing_message("k1") in chat["unreadable"]
    assert chat["interrupts"] and all(i["ref"] == "?" and i["name"] for i in chat["interrupts"])
    assert s.question not in keyless.out + keyless.err
    table = await agentctl(no_keys, "pending", "--agent", encrypted.agent)
    assert table.code == 0 and encrypted.paused in table.out and "'k1'" in table.out, table.out
    # For one conversation each says which key it lacks and where to put it (exit 2: a setting).
    for args in (
        ("show", encrypted.done),
        ("audit", encrypted.done),
    ):
        run = await agentctl(agentctl_env(encrypted, keys=None), *args)
        assert run.code == 2, (args, run.out, run.err)
        assert missing_message("k1") in run.err, (args, run.err)
        assert s.question not in run.out + run.err
    other = await agentctl(agentctl_env(encrypted, keys=K2), "audit", encrypted.done)
    assert other.code == 2 and missing_message("k1") + " (it lists k2)" in other.err


@dataclass
class Answer:
    status: int
    headers: Any
    body: str


def http(method: str, url: str, *, body: bytes | None = None, headers: dict[str, str]) -> Answer:
    """One real HTTP request on loopback (blocking: run it in a thread)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return Answer(r.status, r.headers, r.read().decode())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers, e.read().decode())


async def test_the_codec_server_decodes_them_over_http(encrypted: Encrypted):
    s = encrypted.secrets
    client = encrypted.client
    events = await raw_history(client, encrypted.done)
    sealed = [p for e in events for _, p in payloads_in(e) if key_id_of(p) == "k1"]
    body = json_format.MessageToJson(Payloads(payloads=sealed)).encode()
    async with CodecServer(
        PayloadKeys.parse(K1), namespaces=[client.namespace], cors_origins=[UI_ORIGIN], port=0
    ) as server:
        assert server.url.startswith("http://localhost:")
        decode, encode = f"{server.url}/decode", f"{server.url}/encode"
        headers = {
            "Content-Type": "application/json",
            "X-Namespace": client.namespace,
            "Origin": UI_ORIGIN,
        }

        async def post(url: str, data: bytes, with_headers: dict[str, str]) -> Answer:
            return await asyncio.to_thread(http, "POST", url, body=data, headers=with_headers)

        r = await post(decode, body, headers)
        assert r.status == 200, r.body
        assert r.headers["Access-Control-Allow-Origin"] == UI_ORIGIN
        decoded = json_format.Parse(r.body, Payloads()).payloads
        assert len(decoded) == len(sealed)
        assert all(key_id_of(p) is None for p in decoded)
        assert secrets_in(b"".join(p.data for p in decoded), s.all()) == s.all()
        # As the UI (2.54) calls it: with a query string, on the same route.
        r = await post(f"{decode}?preserveStorageRefs=true", body, headers)
        assert r.status == 200, r.body
        assert len(json_format.Parse(r.body, Payloads()).payloads) == len(sealed)

        # The UI's preflight: allowed for its origin, with the headers it sends.
        preflight = {
            "Origin": UI_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace,authorization",
        }
        r = await asyncio.to_thread(http, "OPTIONS", decode, headers=preflight)
        assert r.status == 204
        allowed = r.headers["Access-Control-Allow-Headers"].replace(" ", "").split(",")
        assert set(allowed) >= {"content-type", "x-namespace", "authorization"}
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        evil = {**preflight, "Origin": "http://evil.example"}
        r = await asyncio.to_thread(http, "OPTIONS", decode, headers=evil)
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        r = await post(decode, body, {**headers, "Origin": "http://evil.example"})
        assert "Access-Control-Allow-Origin" not in r.headers  # a browser would not read it

        # Only the namespaces it serves.
        no_namespace = {k: v for k, v in headers.items() if k != "X-Namespace"}
        for bad, status in ((no_namespace, 400), ({**headers, "X-Namespace": "other"}, 403)):
            r = await post(decode, body, bad)
            assert r.status == status and s.question not in r.body

        # Encode (the UI's signal and update forms) and back.
        mine = Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=b'"hi"')])
        r = await post(encode, json_format.MessageToJson(mine).encode(), headers)
        assert r.status == 200
        (encoded,) = json_format.Parse(r.body, Payloads()).payloads
        assert key_id_of(encoded) == "k1"
        codec = EncryptionCodec(PayloadKeys.parse(K1))
        assert await codec.decode([encoded]) == [mine.payloads[0]]

        # A payload under a key it lacks: refused, naming the key, not the payload.
        (foreign,) = await EncryptionCodec(PayloadKeys.parse(K2)).encode([mine.payloads[0]])
        r = await post(
            decode, json_format.MessageToJson(Payloads(payloads=[foreign])).encode(), headers
        )
        assert r.status == 422 and missing_message("k2") in r.body

        # The Temporal CLI, as an operator runs it: plaintext through the codec endpoint.
        code, shown = await temporal_cli(
            client,
            "workflow",
            "show",
            "--workflow-id",
            encrypted.done,
            "--output",
            "json",
            "--codec-endpoint",
            server.url,
        )
        assert code == 0, shown
        assert {s.question, s.answer} <= set(secrets_in(payload_data(shown), s.all()))
    code, shown = await temporal_cli(
        client, "workflow", "show", "--workflow-id", encrypted.done, "--output", "json"
    )
    assert code == 0 and secrets_in(payload_data(shown), s.all()) == []


def payload_data(cli_json: str) -> bytes:
    """The data of every payload in the CLI's JSON output (proto JSON: base64)."""
    found: list[bytes] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if "metadata" in value and isinstance(value.get("data"), str):
                found.append(base64.b64decode(value["data"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(cli_json[cli_json.index("{") :]))
    return b"".join(found)


async def test_the_raw_check_sees_plaintext_when_no_keys_are_set(client, run_worker, model):
    """The control for the tests above: the same conversation without keys is stored in the
    clear, and the byte search finds it."""
    s = Secrets.fresh()
    agent = t.ops_agent()
    model.reply(first_reply(s))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send(s.message)
        assert res.finish_reason == FinishReason.INTERRUPTED
    blob = await stored_bytes(client, chat.id)
    assert {s.message, s.said, s.question, s.key} <= set(secrets_in(blob, s.all()))


async def test_error_messages_are_encrypted_and_still_reach_the_conversation(env):
    """A tool's error can quote its input: with keys, a failure's message and stack trace are
    encrypted too (history shows "Encoded failure"), and the conversation still reads them."""
    s = f"zq{uuid.uuid4().hex[:10]}"
    agent = Agent(
        f"dp-errors-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.denied, t.boom]
    )
    model = ScriptedModel(
        [calls(("denied", {"key": f"{s}-denied"}), ("boom", {"key": f"{s}-boom"})), text("ok")]
    )
    async with hosted(with_keys(env.client, K1), agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("try both")
        assert res.finish_reason == FinishReason.FAILED
        kept = (await chat.history()).model_dump_json()
    assert f"key {s}-denied is not yours" in kept  # the classified error, decrypted
    failures = await activity_failures(env.client, chat.id)
    assert len(failures) >= 2  # denied once, boom retried
    assert {f.message for f in failures} == {"Encoded failure"}
    assert all(key_id_of(f.encoded_attributes) == "k1" for f in failures)
    assert secrets_in(await stored_bytes(env.client, chat.id), [s]) == []


# --- rotation and missing keys ---------------------------------------------------------------


async def test_keys_rotate_new_payloads_take_the_new_key_and_old_ones_still_read(env):
    """Old key encrypts; then ``AGENT_PAYLOAD_KEYS=new,old``: what is written from then on
    carries the new id, and what was written before still decrypts, in the worker (which
    replays the whole history for every task here) and in the client."""
    agent = t.ops_agent()
    s = Secrets.fresh()
    queue = f"dp-rotate-{uuid.uuid4()}"
    model = ScriptedModel([first_reply(s), text(s.reply)])
    old = with_keys(env.client, K1)
    async with hosted(old, agents=[agent], model=model, task_queue=queue) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send(s.message)
        assert res.finish_reason == FinishReason.INTERRUPTED
    written = len(await raw_history(env.client, chat.id))

    rotated = with_keys(env.client, f"{K2},{K1}")
    async with hosted(
        rotated, agents=[agent], model=model, task_queue=queue, max_cached_workflows=0
    ) as agents:
        chat = await agents.chat(agent.name, chat_id=chat.id)
        final = await chat.resume(answers=answers_for(res.interrupts, s), identity=s.identity)
        assert final.finish_reason == FinishReason.STOP and final.text == s.reply
        audit = await agents.audit(chat.id)
    assert {r.identity for r in audit} == {s.identity}

    events = await raw_history(env.client, chat.id)
    assert len(events) > written

    def ids(part: list[HistoryEvent]) -> set[str | None]:
        return {key_id_of(p) for e in part for path, p in payloads_in(e) if not must_be_plain(path)}

    assert ids(events[:written]) == {"k1"}
    assert ids(events[written:]) == {"k2"}
    sealed = [p for e in events for _, p in payloads_in(e) if key_id_of(p)]
    rotated_codec = codec_of(rotated.data_converter)
    assert rotated_codec is not None
    assert [key_id_of(p) for p in await rotated_codec.decode(sealed)] == [None] * len(sealed)
    with pytest.raises(PayloadKeyMissing, match=missing_message("k2")):
        await old.data_converter.decode([p for p in sealed if key_id_of(p) == "k2"])
    assert secrets_in(await stored_bytes(env.client, chat.id), s.all()) == []


def worker_environ(
    env: WorkflowEnvironment, tmp_path: Path, queue: str, keys: str
) -> dict[str, str]:
    """``agent-worker``'s environment: this server, a task queue of its own, these keys."""
    return bare_environ(
        tmp_path,
        TEMPORAL_ADDRESS=server_address(env.client),
        TEMPORAL_NAMESPACE=env.client.namespace,
        AGENT_TASK_QUEUE=queue,
        AGENT_PAYLOAD_KEYS=keys,
    )


async def events_so_far(client: Client, chat_id: str) -> list[HistoryEvent]:
    """The raw history, or none yet if the conversation has not started."""
    try:
        return await raw_history(client, chat_id)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return []
        raise


def task_failures(events: list[HistoryEvent]) -> list[str]:
    """Each failed workflow task's messages, its causes' included, joined."""
    found = []
    for e in events:
        if e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            continue
        failure, messages = e.workflow_task_failed_event_attributes.failure, []
        while True:
            messages.append(failure.message)
            if not failure.HasField("cause"):
                break
            failure = failure.cause
        found.append(" <- ".join(messages))
    return found


async def test_a_worker_with_other_keys_fails_the_task_serves_others_and_stops_on_an_activity(
    env, tmp_path
):
    """``agent-worker`` holding another key (k2), not the conversation's (k1). Its workflow
    task fails naming the key id (in history, for the UI), and it goes on serving its own
    conversations: a workflow task's payloads are partly the caller's to choose. An activity's
    input is not (the workflow writes it with the fleet's key): meeting one under k1, the worker
    stops (exit 3) instead of failing calls, and a worker with the key takes the call on."""
    queue = f"dp-otherkey-{uuid.uuid4()}"
    keyed = with_keys(env.client, K1)
    worker = await Process.start(
        sys.executable,
        "-m",
        "temporal_agent_interrupts.worker",
        env=worker_environ(env, tmp_path, queue, K2),
        cwd=tmp_path,
    )
    try:
        await worker.wait_for("worker ready")
        chat = await AgentClient(keyed, task_queue=queue).chat("bankingAgent")
        # Refused while the run's workflow task fails, the send is sent again by itself until a
        # worker takes the task (the k1 worker, below): a worker_timeout long enough for that.
        sending = asyncio.create_task(
            chat.send("Transfer $500 to savings.", worker_timeout=timedelta(minutes=5))
        )
        failures = await eventually(
            lambda: events_so_far(env.client, chat.id),
            lambda events: bool(task_failures(events)),
            timeout=30,
        )
        (failed, *_) = task_failures(failures)
        # Readable with keys too: the key id the task lacked (the workflow takes its input raw,
        # and has the converter say what it cannot read).
        assert failed.startswith(missing_message("k1") + " (it lists k2), in conversation"), failed
        assert worker.proc.returncode is None, worker.output

        # Its own conversations go on.
        own = await AgentClient(with_keys(env.client, K2), task_queue=queue).chat("bankingAgent")
        res = await asyncio.wait_for(own.send("Transfer $500 to savings."), 60)
        assert [i.name for i in res.interrupts] == ["userApproval"]
        assert worker.proc.returncode is None, worker.output

        # A worker with k1 takes the k1 conversation's workflow tasks (no activities). Temporal
        # refused the send while the workflow task was failing; sent again by the client, it is
        # taken now, and its model call goes to the k2 worker, which cannot read its input and
        # stops.
        async with hosted(
            keyed,
            agents=EXAMPLE_AGENTS,
            model=ScriptedModel(offline),
            task_queue=queue,
            no_remote_activities=True,
        ):
            assert await worker.wait(timeout=60) == 3, worker.output
            assert not sending.done()  # taken, and waiting for its turn
    finally:
        await worker.stop()
    output = worker.output
    assert missing_message("k1") + " (it lists k2)" in output
    assert f"in conversation {chat.id!r}" in output
    assert "so it stops (exit 3)" in output and "shutting down gracefully" in output

    # A worker with the key runs the call: it never ran, and was not failed.
    async with hosted(keyed, agents=EXAMPLE_AGENTS, model=ScriptedModel(offline), task_queue=queue):
        res = await asyncio.wait_for(sending, 90)
    assert res.finish_reason == FinishReason.INTERRUPTED
    assert [i.name for i in res.interrupts] == ["userApproval"]
    # The model call's next attempt records the failed one: readable, though k2 encrypts
    # failures, so that a workflow would know the call never ran.
    (attempt, *_) = [
        e.activity_task_started_event_attributes.last_failure
        for e in await raw_history(env.client, chat.id)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert attempt.message == DECODING_FAILED
    assert attempt.cause.application_failure_info.type == ErrorKind.PAYLOAD_KEY_MISSING
    assert missing_message("k1") + " (it lists k2)" in attempt.cause.message


async def foreign(value: object, key: str = "zz") -> Payload:
    """``value`` as a payload encrypted with a key none of the workers has."""
    (payload,) = await data_converter(generate_key(key)).encode([value])
    return payload


async def test_a_signal_update_query_or_start_under_a_foreign_key_stops_nothing(env, tmp_path):
    """Whoever can signal, update, query or start a conversation chooses those payloads. One
    encrypted with a key the worker lacks must not stop the worker (every worker would take it
    in turn) nor fail the conversation's workflow task (a signal stays in history): a signal is
    recorded as a rejection naming the key id, an update is rejected, a query fails, and a start
    fails only its own conversation's task. The paused turn still answers."""
    queue = f"dp-foreign-{uuid.uuid4()}"
    keyed = with_keys(env.client, K1)
    worker = await Process.start(
        sys.executable,
        "-m",
        "temporal_agent_interrupts.worker",
        env=worker_environ(env, tmp_path, queue, K1),
        cwd=tmp_path,
    )
    try:
        await worker.wait_for("worker ready")
        agents = AgentClient(keyed, task_queue=queue)
        chat = await agents.chat("bankingAgent")
        (ask,) = (await chat.send("Transfer $500 to savings.")).interrupts
        answer = {"respond": [{"ref": ask.ref, "output": {"approved": True}}]}
        sealed = await foreign(answer)
        reason = "encrypted with key id 'zz', which this worker cannot decrypt"

        # A real `temporal workflow signal`, with the payload's metadata as a script sets it.
        code, out = await temporal_cli(
            env.client,
            "workflow",
            "signal",
            "--workflow-id",
            chat.id,
            "--name",
            "resume",
            "--input-meta",
            "encoding=binary/encrypted",
            "--input-meta",
            "encryption-key-id=zz",
            "--input-base64",
            "--input",
            base64.b64encode(sealed.data).decode(),
        )
        assert code == 0, out
        rejections = await eventually(chat.rejections, lambda found: len(found) == 1, timeout=30)
        assert [(r.via, r.handler, r.reason) for r in rejections] == [("signal", "resume", reason)]
        # A send signal, through the SDK (the keyed client passes an encrypted payload on).
        handle = keyed.get_workflow_handle(chat.id)
        await handle.signal("send", RawValue(await foreign({"text": "hi"})))
        rejections = await eventually(chat.rejections, lambda found: len(found) == 2, timeout=30)
        assert (rejections[-1].handler, rejections[-1].reason) == ("send", reason)

        # The resume update takes raw payloads: its validator refuses it in the same words.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("resume", RawValue(sealed))
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.type == ErrorKind.RESUME_REJECTED
        assert refused.value.cause.message == reason
        # Typed updates fail converting their argument, before any validator: the SDK rejects
        # the update (no event in history), naming the key id.
        for name in ("send", "cancel", "close"):
            with pytest.raises(WorkflowUpdateFailedError) as typed:
                await handle.execute_update(name, RawValue(await foreign({"text": "x"})))
            cause = typed.value.cause
            assert isinstance(cause, ApplicationError) and cause.message == DECODING_FAILED
            assert "payload encrypted with key id 'zz'" in str(cause.cause), name
        # A query fails, and only the query.
        with pytest.raises(WorkflowQueryFailedError):
            await handle.query("history", RawValue(await foreign({"offset": 0})))

        # A conversation started with input under that key fails its own workflow task only.
        started = await keyed.start_workflow(
            "AgentWorkflow",
            RawValue(await foreign({"agent": "bankingAgent"})),
            id=f"dp-foreign-start-{uuid.uuid4()}",
            task_queue=queue,
        )
        failed = await eventually(
            lambda: events_so_far(env.client, started.id),
            lambda events: bool(task_failures(events)),
            timeout=30,
        )
        assert "payload encrypted with key id 'zz'" in task_failures(failed)[0]
        await started.terminate("test: its input was never readable")

        assert worker.proc.returncode is None, worker.output
        await assert_no_workflow_task_failed(env.client, chat.id)
        # The paused turn still answers.
        res = await chat.resume(respond=[ask.respond({"approved": True})])
        assert res.finish_reason == FinishReason.STOP, res
        assert "transferred $500.00 to savings" in res.text
        worker.proc.send_signal(signal.SIGTERM)
        assert await worker.wait(timeout=60) == 0, worker.output
    finally:
        await worker.stop()
    assert "so it stops" not in worker.output


async def test_an_activity_result_the_workflow_cannot_read_fails_its_task_and_stops_nothing(env):
    """A workflow task that cannot read what its conversation wrote (here a model call's result,
    written by a worker that encrypts with k1, read by one with k2 only) fails naming the key
    id; the missing-key hook, which stops ``agent-worker``, is not called for it."""
    agent = t.ops_agent()
    queue = f"dp-result-{uuid.uuid4()}"
    seen: list[PayloadKeyMissing] = []
    reader = Client(
        **{**env.client.config(), "data_converter": data_converter(K2, on_missing_key=seen.append)}
    )
    model = ScriptedModel([text("hello")])
    gemini = model.client()
    try:
        async with (
            build_worker(
                reader, agents=[agent], task_queue=queue, gemini=gemini, no_remote_activities=True
            ),
            Worker(
                with_keys(env.client, f"{K1},{K2}"),  # reads k2, writes k1
                task_queue=queue,
                activities=AgentActivities(
                    [agent], gemini=gemini, result_keys=parse_result_keys(RESULT_KEYS)
                ).activities(),
            ),
        ):
            chat = await AgentClient(with_keys(env.client, K2), task_queue=queue).chat(agent.name)
            sending = asyncio.create_task(chat.send("hi"))
            events = await eventually(
                lambda: events_so_far(env.client, chat.id),
                lambda found: bool(task_failures(found)),
                timeout=30,
            )
            sending.cancel()
    finally:
        await model.release(gemini)
    (failed, *_) = task_failures(events)
    assert missing_message("k1") + " (it lists k2)" in failed, failed
    assert seen == []
    await env.client.get_workflow_handle(chat.id).terminate("test: done")


async def test_a_call_a_worker_could_not_decrypt_runs_later_and_is_never_a_tool_failure(env):
    """An approved tool's one run, taken by a worker without the key: the attempt fails while
    decoding (the tool never ran), the workflow schedules the call again instead of telling the
    model it failed, and a worker with the key runs it once."""
    agent = t.ops_agent()  # lookup is gated
    queue = f"dp-activity-{uuid.uuid4()}"
    keyed = with_keys(env.client, K1)
    model = ScriptedModel([calls(("lookup", {"key": "abc"})), text("done")])
    async with hosted(keyed, agents=[agent], model=model, task_queue=queue) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send("look abc up")).interrupts
    gemini = model.client()
    try:
        # Workflow tasks on a worker with the key; the calls on one without.
        async with build_worker(
            keyed, agents=[agent], task_queue=queue, gemini=gemini, no_remote_activities=True
        ):
            keyless = Worker(
                env.client,  # the session's client: the codec, no keys
                task_queue=queue,
                activities=AgentActivities(
                    [agent], gemini=gemini, result_keys=parse_result_keys(RESULT_KEYS)
                ).activities(),
            )
            async with keyless:
                answering = asyncio.create_task(chat.resume(answers=[gate.approve()]))
                failures = await eventually(
                    lambda: activity_failures(env.client, chat.id),
                    lambda found: len(found) >= 1,
                    timeout=30,
                )
            assert t.RUNS["lookup"] == 0
            with_key = Worker(
                keyed,
                task_queue=queue,
                activities=AgentActivities(
                    [agent], gemini=gemini, result_keys=parse_result_keys(RESULT_KEYS)
                ).activities(),
            )
            async with with_key:
                res = await asyncio.wait_for(answering, 60)
    finally:
        await model.release(gemini)
    assert res.finish_reason == FinishReason.STOP and res.text == "done"
    assert t.RUNS["lookup"] == 1
    (sent,) = model.requests[-1].function_responses()
    assert sent["response"] == {"key": "abc", "value": "ABC"}  # the real output, not an error
    failure = failures[0]
    assert failure.message == "Failed decoding arguments"
    assert failure.cause.application_failure_info.type == ErrorKind.PAYLOAD_KEY_MISSING
    assert missing_message("k1") in failure.cause.message


@tool("reads_elsewhere", "Reads another conversation, written with a key it lacks.")
async def reads_elsewhere(inp: t.Key) -> dict[str, str]:
    t.RUNS["reads_elsewhere"] += 1
    # As a tool using AgentClient on another team's conversation would fail, told not to retry.
    raise ApplicationError(
        missing_message("k9") + " (it lists k1)",
        type=ErrorKind.PAYLOAD_KEY_MISSING,
        non_retryable=True,
    )


async def test_a_tool_failing_with_that_type_has_run_once_and_the_model_hears_it(env):
    """Only the SDK's own "Failed decoding arguments" means a call never ran: a tool that
    raises an error of type PayloadKeyMissing itself has run, and is not run again and again."""
    agent = Agent(f"dp-tool-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[reads_elsewhere])
    model = ScriptedModel([calls(("reads_elsewhere", {"key": "other-chat"})), text("noted")])
    async with hosted(with_keys(env.client, K1), agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        res = await asyncio.wait_for(chat.send("read the other chat"), 60)
        assert res.finish_reason == FinishReason.FAILED
        assert t.RUNS["reads_elsewhere"] == 1
        res = await asyncio.wait_for(chat.send("what happened?"), 60)
        assert res.finish_reason == FinishReason.STOP and res.text == "noted"
    (sent,) = model.requests[-1].function_responses()
    assert sent["name"] == "reads_elsewhere"
    assert sent["response"] == {
        "error": "INTERNAL: tool 'reads_elsewhere' failed",
        "note": "it may have taken effect",
    }
    assert t.RUNS["reads_elsewhere"] == 1
    history = await raw_history(env.client, chat.id)
    assert not [e for e in history if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]


async def test_a_call_no_worker_can_decrypt_fails_after_the_give_up_time(env, monkeypatch):
    """Scheduled again for ``config.UNDECRYPTABLE_GIVE_UP`` (a day; seconds here), then failed
    as what it is: the call never ran, its input could not be decrypted."""
    monkeypatch.setattr(config, "UNDECRYPTABLE_GIVE_UP", timedelta(seconds=3))
    agent = t.ops_agent()  # lookup is gated
    queue = f"dp-giveup-{uuid.uuid4()}"
    keyed = with_keys(env.client, K1)
    model = ScriptedModel([calls(("lookup", {"key": "abc"})), text("done")])
    async with hosted(keyed, agents=[agent], model=model, task_queue=queue) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send("look abc up")).interrupts
    gemini = model.client()
    try:
        async with (
            build_worker(
                keyed, agents=[agent], task_queue=queue, gemini=gemini, no_remote_activities=True
            ),
            Worker(
                env.client,  # the session's client: the codec, no keys
                task_queue=queue,
                activities=AgentActivities(
                    [agent], gemini=gemini, result_keys=parse_result_keys(RESULT_KEYS)
                ).activities(),
            ),
        ):
            res = await asyncio.wait_for(chat.resume(answers=[gate.approve()]), 60)
            kept = (await chat.history()).model_dump_json()
    finally:
        await model.release(gemini)
    assert res.finish_reason == FinishReason.FAILED
    assert t.RUNS["lookup"] == 0
    assert len(await activity_failures(env.client, chat.id)) >= 2  # scheduled again, then not
    said = (
        "UNAVAILABLE: tool 'lookup' did not run: its input could not be decrypted (key id 'k1') "
        "by the workers that took it"
    )
    assert said in kept and "may have taken effect" not in kept


def raw_http(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is, and read the answer until the server closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def post_request(host: str, body: bytes = b"{}", *, length: bytes | None = None) -> bytes:
    return (
        b"POST /decode HTTP/1.1\r\nHost: " + host.encode() + b"\r\nX-Namespace: default\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + (str(len(body)).encode() if length is None else length) + b"\r\n"
        b"\r\n" + body
    )


async def test_the_codec_server_answers_every_request_and_only_its_own_host_names(monkeypatch):
    """A malformed request gets a status and a short message, never a dropped connection; and a
    request whose Host is not the server's own (a DNS-rebinding page) gets 403."""
    async with CodecServer(
        PayloadKeys.parse(K1), port=0, allowed_hosts=["codec.example.com"]
    ) as server:
        port = urlsplit(server.url).port
        assert port is not None

        def status(request: bytes) -> tuple[int, bytes]:
            answer = raw_http(server.url, request)
            assert answer.startswith(b"HTTP/1.1 "), answer  # answered, not dropped
            head, _, body = answer.partition(b"\r\n\r\n")
            return int(head.split()[1]), body

        async def check(request: bytes) -> tuple[int, bytes]:
            return await asyncio.to_thread(status, request)

        ok = f"localhost:{port}"
        assert (await check(post_request(ok)))[0] == 200
        for host in (
            f"127.0.0.1:{port}",
            f"[::1]:{port}",
            "codec.example.com",
            "Codec.Example.com:443",
        ):
            assert (await check(post_request(host)))[0] == 200, host
        # DNS rebinding: the attacker's name, the right address and port.
        for host in (f"evil.example:{port}", "evil.example", f"localhost:{port + 1}", ""):
            code, body = await check(post_request(host))
            assert (code, body) == (403, b"host not allowed\n"), host
        # Content-Length: "\xb2" passes str.isdigit(); too many digits; not a number.
        for length in (b"\xb2", b"1" * 13, b"-1", b"1_0", b"0x10"):
            code, body = await check(post_request(ok, length=length))
            assert code == 400 and b"Content-Length" in body, (length, code, body)
        # Data too short to be encrypted: refused naming the key id.
        short = Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: b"k1"}, data=b"x")
        body = json_format.MessageToJson(Payloads(payloads=[short])).encode()
        code, said = await check(post_request(ok, body))
        assert code == 422 and b"key id 'k1' is malformed" in said, said
        # A fault of its own: 500, a short message, the connection answered.
        codec = server._codec  # the codec it serves with

        def broken(payload: Payload) -> Payload:
            raise RuntimeError("a secret in a message")

        monkeypatch.setattr(codec, "decrypt", broken)
        code, said = await check(post_request(ok, body))
        assert (code, said) == (500, b"internal error (RuntimeError)\n")


async def activity_failures(client: Client, chat_id: str) -> list[Any]:
    return [
        e.activity_task_failed_event_attributes.failure
        for e in await raw_history(client, chat_id)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]


# --- wiring -----------------------------------------------------------------------------------


async def test_agent_client_connects_with_the_keys_of_the_environment(env, monkeypatch):
    address, namespace = server_address(env.client), env.client.namespace
    monkeypatch.setenv(ENV_VAR, K1)
    agents = await AgentClient.connect(address, namespace=namespace)
    codec = codec_of(agents.temporal.data_converter)
    assert codec is not None and codec.keys.ids == ("k1",)
    explicit = await AgentClient.connect(address, namespace=namespace, payload_keys=K2)
    assert codec_of(explicit.temporal.data_converter).keys.ids == ("k2",)  # type: ignore[union-attr]  # ours
    monkeypatch.delenv(ENV_VAR)
    none = await AgentClient.connect(address, namespace=namespace)
    assert codec_of(none.temporal.data_converter) is not None  # installed, without keys
    monkeypatch.setenv(ENV_VAR, "k1:AAAA")
    with pytest.raises(PayloadKeysError, match="key 'k1' is 3 bytes"):
        await AgentClient.connect(address, namespace=namespace)


def test_the_plugin_keeps_a_clients_codec_and_gives_one_to_a_client_without(env, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    keyed = with_keys(env.client, K1).data_converter
    assert agent_converter(keyed) is keyed
    given = agent_converter(DataConverter.default)
    assert issubclass(given.payload_converter_class, AgentPayloadConverter)
    codec = codec_of(given)
    assert codec is not None and not codec.keys
    own = EncryptionCodec(PayloadKeys.parse(K2))
    theirs = dataclasses.replace(DataConverter.default, payload_codec=own)
    kept = agent_converter(theirs)
    assert kept.payload_codec is own
    assert issubclass(kept.payload_converter_class, AgentPayloadConverter)
    # A plain pydantic client (no codec) gets ours too, and the keys given.
    plain = agent_converter(pydantic_data_converter, keys=PayloadKeys.parse(K2))
    assert issubclass(plain.payload_converter_class, AgentPayloadConverter)
    assert codec_of(plain).keys.ids == ("k2",)  # type: ignore[union-attr]  # ours
    # A codec of the team's own and keys too would encrypt twice; a payload converter of the
    # team's own cannot read the workflow's payloads.
    with pytest.raises(ValueError, match="encrypted twice"):
        agent_converter(theirs, keys=PayloadKeys.parse(K1))

    class Theirs(DefaultPayloadConverter):
        pass

    with pytest.raises(ValueError, match="payload converter is Theirs"):
        agent_converter(dataclasses.replace(DataConverter.default, payload_converter_class=Theirs))


async def test_build_worker_encrypts_with_the_envs_keys_and_warns_of_a_codec_without_keys(
    env, monkeypatch, caplog
):
    """``AGENT_PAYLOAD_KEYS`` reaches a client without a codec through the plugin; a client
    connected with the codec and no keys keeps writing in the clear, but not silently."""
    model = ScriptedModel()
    gemini = model.client()
    agents = [t.ops_agent()]

    def built(client: Client) -> tuple[list[str], DataConverter]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="temporal_agent_interrupts.worker"):
            worker = build_worker(
                client, agents=agents, task_queue=f"dp-{uuid.uuid4()}", gemini=gemini
            )
        warned = [r.getMessage() for r in caplog.records if "IN THE CLEAR" in r.getMessage()]
        return warned, worker.client.data_converter

    monkeypatch.setenv(ENV_VAR, K1)
    (warning,), _ = built(env.client)  # the session's client: the codec, no keys
    assert ENV_VAR in warning and "codec.data_converter()" in warning
    assert K1.partition(":")[2] not in warning
    bare = Client(**{**env.client.config(), "data_converter": pydantic_data_converter})
    warned, converter = built(bare)
    assert warned == [] and codec_of(converter).keys.ids == ("k1",)  # type: ignore[union-attr]  # ours
    assert built(with_keys(env.client, K1))[0] == []
    monkeypatch.delenv(ENV_VAR)
    assert built(env.client)[0] == []


async def test_make_runs_dev_server_points_its_ui_at_the_codec_server(tmp_path):
    """``make run`` with keys: the embedded server's UI decodes through the codec server (the
    UI's settings, which the browser reads, name it)."""
    port, ui = free_port(), free_port()
    cmd = dev_server_command(
        db_file=None, port=port, ui_port=ui, codec_endpoint="http://localhost:8081"
    )
    server = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )

    def settings() -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/api/v1/settings", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None

    try:
        found = await eventually(
            lambda: asyncio.to_thread(settings), lambda v: v is not None, timeout=60, interval=0.3
        )
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 20)
    assert found is not None and found["Codec"]["Endpoint"] == "http://localhost:8081"

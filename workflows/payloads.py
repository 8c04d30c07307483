"""What comes in raw and what goes out fitted: payload decoding and result limits.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Signals and the ``resume`` update take raw payloads, so that this code, not the data converter,
decides what is wrong with a bad one and says so (a payload the converter cannot decode would
otherwise be dropped silently, or fail the workflow task). That includes a payload encrypted with
a key the worker lacks: the payload codec leaves it as it is (``client.codec``), and it is
refused here naming its key id. Results going out are cut to fit Temporal's payload limit, with
stated placeholders.

Pure code: no workflow calls (:func:`continued_here` reads a ``workflow.Info`` it is handed),
so the tests run it without a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TypeVar, get_args

from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.config import MAX_AGENT_DEPTH, MAX_SUB_AGENTS_PER_TREE
from temporal_agent_interrupts.workflows.interrupts import ResumeError
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    RefusalCode,
    Refused,
    check_label,
    decode_json,
    json_size,
    shrink,
)
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
)
from temporal_agent_interrupts.workflows.types import (
    ErrorKind,
    ResumeInput,
)

R = TypeVar("R", bound=BaseModel)

# client.codec's ENCODING and KEY_ID_METADATA (the workflow imports nothing from the client; a
# test checks that they agree).
ENCRYPTED = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

RawResume = RawValue
"""The ``resume`` update's and signal's argument: a :class:`~workflows.types.ResumeInput`,
carried raw so the workflow decodes and judges it itself (:func:`raw_resume` makes one). The
SDK hands a handler raw payloads only when its parameter is typed exactly ``RawValue``, which is
why this is an alias and not a type of its own."""


RawStart = RawValue
"""The workflow's input: a :class:`~workflows.state.ConversationInput`, carried raw for the same
reason as :data:`RawResume` (a start is a request, and a malformed one must not fail the
workflow task); :func:`raw_start` makes one, :func:`read_start` reads it."""


NO_START = RawValue(Payload())
"""What a start without an input gives (``temporal workflow start`` without ``--input``): the
SDK passes no argument then, and this default stands in, to be refused like any bad start. (A
start with two or more arguments is decoded before any code of ours runs, and fails its
workflow task: docs/security.md says so.)"""


def raw_start(start: ConversationInput, *, converter: PayloadConverter) -> RawStart:
    """A conversation's start input as the workflow takes it."""
    return RawValue(converter.to_payload(start.model_dump(mode="json", exclude_none=True)))


def continued_here(info: workflow.Info) -> bool:
    """Whether Temporal says this run continued from a run of this chat by continue-as-new,
    the only way carried state may arrive.

    A run begun by a retry or a cron schedule also names the run before it, but its input is
    the one the chat was first started with (anyone's): retries have ``attempt`` above 1, cron
    runs a ``cron_schedule``. The SDK does not expose the initiator itself.
    """
    return info.continued_run_id is not None and info.attempt == 1 and not info.cron_schedule


def read_start(payload: RawValue, *, carried: bool) -> tuple[ConversationInput, str | None]:
    """The run's input, and what it asked for that was refused (None: nothing).

    Continue-as-new's input is the conversation's own: taken whole (a fault there fails the
    workflow task, to be retried by a worker that can read it, rather than lose the state).
    Any other start is a request: only the agent's name (and a sub-agent's ``task``,
    ``depth`` and ``budget``, each only narrowing) is taken; ``state``
    and ``stream`` are refused; one that names no usable agent gives an agent of ``""`` (the
    run then closes at once).

    (A start this worker cannot decrypt never reaches here: see ``AgentWorkflow.__init__``.)

    Raises:
        ResumeError: a carried input that cannot be read.
        pydantic.ValidationError: a carried input that does not parse.
    """
    if carried:
        body = payload_json(payload)
        return ConversationInput.model_validate(body), None
    unusable = ConversationInput(agent="")
    if not payload.payload.data and not payload.payload.metadata:
        return unusable, "the start has no input: it is a JSON object with 'agent'"
    try:
        body = payload_json(payload)
    except Refused as e:
        return unusable, f"the start input is unusable: {e.reason}"
    if not isinstance(body, dict) or not isinstance(body.get("agent"), str) or not body["agent"]:
        return unusable, "the start input names no agent: it is a JSON object with 'agent'"
    agent: str = body["agent"]
    try:
        check_label(agent, what="the agent's name", limit=DOOR.agent_name)
    except Refused as e:
        return unusable, f"the start input names no usable agent: {e.reason}"
    start = ConversationInput(agent=agent)
    task, depth = body.get("task"), body.get("depth")
    if task is not None:
        # A sub-agent's first message (or anyone's: a start, a send and a close in one); the
        # run checks it as it checks any message, and refuses it there.
        if not isinstance(task, str):
            return start, "the start's task is a message: a string"
        start.task = task
        if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0:
            # Bounded here; the run refuses to call a sub-agent past config.MAX_AGENT_DEPTH.
            start.depth = min(depth, MAX_AGENT_DEPTH + 1)
        budget = body.get("budget")
        if isinstance(budget, int) and not isinstance(budget, bool):
            # Only ever narrowed: anyone may start a sub-agent's conversation, and a share of
            # its caller's budget larger than a whole message's would widen the tree.
            start.budget = max(0, min(budget, MAX_SUB_AGENTS_PER_TREE))
    carrying = [k for k in ("state", "stream") if body.get(k) is not None]
    if not carrying:
        return start, None
    return start, (
        f"a start may not carry {' or '.join(repr(k) for k in carrying)}: only this "
        "conversation's own continue-as-new hands them on; it began afresh"
    )


def raw_resume(resume: ResumeInput, *, converter: PayloadConverter) -> RawResume:
    """A resume as the ``resume`` update takes it.

    Raises:
        pydantic_core.PydanticSerializationError: it holds what cannot be serialized (a lone
            surrogate); the client turns that into a ``ResumeRejected``.
    """
    # Left out unless used: a worker from before streaming or identity tokens refuses
    # unknown keys.
    unused = {k for k in ("stream", "identity_token") if not getattr(resume, k)}
    return RawValue(converter.to_payload(resume.model_dump(mode="json", exclude=unused)))


def refuse_encrypted(payload: RawValue) -> None:
    """Refuse a payload the worker could not decrypt (it reaches the workflow still encrypted).

    Raises:
        ResumeError: naming the payload's key id (or its length, if it could be no id).
    """
    metadata = payload.payload.metadata
    if metadata.get("encoding") != ENCRYPTED:
        return
    raw = metadata.get(KEY_ID_METADATA, b"")
    key_id = raw.decode("ascii", "replace")
    # Chosen by the sender: quoted only if it could be an id.
    shown = repr(key_id) if _KEY_ID.fullmatch(key_id) else f"<unusable, {len(raw)} bytes>"
    raise ResumeError(f"encrypted with key id {shown}, which this worker cannot decrypt")


def payload_json(payload: RawValue) -> object:
    """The JSON value a raw payload holds.

    Raises:
        ResumeError: the payload is empty, encrypted with a key the worker lacks, not JSON, or
            not storable.
    """
    refuse_encrypted(payload)
    encoding = payload.payload.metadata.get("encoding", b"")
    if encoding == b"binary/null":
        raise ResumeError("the payload is empty; send a JSON object")
    if encoding not in (b"json/plain", b""):
        raise ResumeError(
            f"the payload must be JSON, got encoding {encoding.decode(errors='replace')!r}"
        )
    return decode_json(payload.payload.data)


def only_argument(name: str, args: Sequence[RawValue]) -> RawValue:
    """A signal's one argument (``temporal workflow signal`` may send none, or several).

    Raises:
        ResumeError: not exactly one.
    """
    if len(args) != 1:
        raise ResumeError(f"signal {name!r} takes exactly one JSON argument, got {len(args)}")
    return args[0]


def claimed_identity(payload: Sequence[RawValue]) -> str | None:
    """The sender's identity, if the payload names one; never raises (used on bad input)."""
    return _claimed(payload, "identity")


def claimed_token(payload: Sequence[RawValue]) -> str | None:
    """The identity token a payload carries, if any; never raises (used on bad input)."""
    return _claimed(payload, "identity_token")


def _claimed(payload: Sequence[RawValue], key: str) -> str | None:
    if len(payload) != 1 or len(payload[0].payload.data) > MAX_CLAIM_SCAN_BYTES:
        return None  # too large to have been a resume; not worth parsing
    try:
        body = json.loads(payload[0].payload.data)
    except Exception:  # noqa: BLE001  # any malformed payload simply has no identity
        return None
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


MAX_CLAIM_SCAN_BYTES = 2 * 1024 * 1024
"""Payloads larger than any resume are not parsed for who sent them (a flood of big junk
signals would otherwise be parsed twice)."""


def rejected(kind: ErrorKind, reason: str, code: RefusalCode = "invalid") -> ApplicationError:
    """An update's refusal, for its caller: ``code`` (see ``RefusalCode``) rides in the
    error's details, so a caller can tell "not yours" from "already answered" without reading
    the reason's words."""
    # Non-retryable: a rejected answer is wrong, not unlucky; retrying cannot help.
    return ApplicationError(reason, {"code": code}, type=kind, non_retryable=True)


def fit(result: R, budget: int) -> R:
    """``result`` within ``budget`` bytes: the largest caller or tool objects in it replaced by
    stated placeholders when it would not fit (Temporal refuses a payload over 2 MiB)."""
    if json_size(result) <= budget:
        return result
    data = result.model_dump(mode="json")
    shrink(data, budget)
    # A turn paused on many interrupts: even as placeholders they may not fit an update's
    # result. The last ones go, counted; ``pending`` lists them all.
    turn = data if "interrupts" in data else data.get("last_turn")
    if isinstance(turn, dict):
        interrupts = turn.get("interrupts") or []
        while interrupts and json_size(data) > budget:
            interrupts.pop()
            turn["interrupts_omitted"] = turn.get("interrupts_omitted", 0) + 1
    return type(result).model_validate(data)


def refusal_code(cause: ApplicationError) -> RefusalCode | None:
    """The refusal's kind from its details (``rejected`` puts it there); a
    worker of an older release sends none."""
    details = cause.details
    first = details[0] if details else None
    code = first.get("code") if isinstance(first, dict) else None
    return next((c for c in get_args(RefusalCode) if c == code), None)

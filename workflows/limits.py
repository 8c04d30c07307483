"""What may enter a conversation, and how much of it: decided once, at the door.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Pure code with no Temporal imports: the workflow, the activities and the client apply the same
rules, and the tests run them without a server.

Why it matters. Temporal refuses a payload over 2 MiB (``limit.blobSize.error``), and a
conversation that produces one (an activity input, an update result, the state carried by
continue-as-new) retries that workflow task for good: every query fails, every caller hangs, the
paused turn is out of reach. pydantic-core cannot serialize text holding a lone UTF-16 surrogate
(``"\\ud83d"``, half an emoji) or JSON nested about 255 levels deep, both of which Python's
``json`` accepts, and that wedges a conversation the same way. So everything that enters is
checked for both (:func:`check_json`, :func:`check_label`), and measured in bytes against the
budgets below, which are sized so that what they add up to stays under Temporal's limits.

The arithmetic, with Temporal's defaults (sizes as stored: compact JSON in UTF-8, where a
control character takes six bytes, ``\u0001``):

- One turn takes in at most :data:`HELD.turn` (1 MiB) of what callers, tools and the model
  send: its messages and its calls' arguments, outputs, answers and metadata. A tool output,
  interrupt metadata or a deadline's default answer that would pass it is replaced by a short
  stated placeholder; an answer that would pass it is refused. The runtime's own notes in
  calls' responses (an error, "unknown tool", "not run", a cancellation) are at most
  :data:`DOOR.note` plus a 1 KiB reason each, 160 KiB for 128 calls: a turn holds at most
  1.16 MiB.
- Continue-as-new carries that turn, the answer log (:data:`HELD.answers`, 128 KiB), the
  rejection log (20 records of at most 1.2 KiB), the newest :data:`HELD.refs_kept` refs (at most
  130 bytes each, 127 KiB), the agent definition (:data:`DOOR.spec`, 64 KiB) and whatever
  older turns fit: 1.49 MiB at most, with the newest turn events (128 of at most 1 KiB each,
  ``workflows.events``) 1.62 MiB, under :data:`OUT.state` (1.625 MiB); older turns are
  dropped first. Beside the state it carries the event stream's newest items, at most 64 KiB as
  measured on the wire (``workflows.stream.CARRY_BYTES``): 1.69 MiB in all.
- A model call's input is the messages the model has not seen: at most one tool message (a
  turn's worth) and one user message (256 KiB), 1.41 MiB; should it ever pass
  :data:`OUT.model_input`, the unseen responses are cut to placeholders.
- One workflow task writes what its updates were accepted with (each answer counts against the
  turn: 1 MiB in all, plus 16 KiB of metadata each and restart inputs equal to the model's
  arguments, 512 KiB in all), their results (:data:`OUT.update_result`, 48 KiB; Temporal
  allows ten in flight, the stream's followers' polls among them, each cut to the same 48 KiB)
  and one model call, tool calls or continue-as-new (1.69 MiB at most): 3.81 MiB, under
  Temporal's 4 MiB for one task.
- Query results are cut to :data:`OUT.query` (1.75 MiB), with stated placeholders; the
  message history is read in pages.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pydantic_core

KiB = 1024
MiB = 1024 * KiB

# --------------------------------------------------------------------------------------------
# The budgets, as five typed values: Temporal's limits, and what the conversation lets in, holds,
# sends out and writes to a run's history, each sized against those limits (the module
# docstring has the arithmetic; tests/test_limits.py adds it up).


@dataclass(frozen=True)
class TemporalLimits:
    """Temporal's limits (server defaults) that the budgets are sized against."""

    payload: int = 2 * MiB
    """``limit.blobSize.error``: the largest payload (input, result, signal, memo) it takes."""
    history_bytes: int = 50 * MiB
    """``limit.historySize.error``: the server terminates a run whose history passes this."""
    history_events: int = 51_200
    """``limit.historyCount.error``: the same, counted in events."""
    task: int = 4 * MiB
    """``system.transactionSizeLimit``: what one workflow task may write to history."""
    updates_in_flight: int = 10
    """``history.maxInFlightUpdates``: updates one workflow may have accepted and unfinished."""
    signals: int = 10_000
    """``history.maximumSignalsPerExecution``: signals one run takes; later ones are refused.
    At this default, 10,000 signals of up to :attr:`payload` each can take a run to
    :attr:`history_bytes` faster than it can continue as new (no run may while signals keep
    arriving), so deployments lower it (``worker.devserver.SIGNALS_PER_RUN``)."""


@dataclass(frozen=True)
class Door:
    """Each thing that enters a conversation, on its own (bytes as stored unless said)."""

    json_depth: int = 64
    """The deepest nesting accepted in any JSON value (pydantic-core stops serializing near
    255, and the conversation's own state wraps a value in about ten more levels)."""
    send: int = 256 * KiB
    """The largest user message, serialized."""
    resume: int = 1 * MiB
    """The largest resume payload, serialized."""
    identity: int = 256
    """The longest identity a resume or cancel may carry, in UTF-8 bytes."""
    message_id: int = 128
    """The longest message id a send may carry, in UTF-8 bytes."""
    agent_name: int = 200
    """The longest agent name, in UTF-8 bytes: a start names one, and it is a search attribute
    (Temporal allows 2 KiB a value) and a metric label."""
    reason: int = 1 * KiB
    """The longest cancel or close reason (it is copied into every withdrawn call's response)."""
    reason_chars: int = 500
    """A rejection's reason is cut to this many characters (and 600 bytes as stored)."""
    tool_output: int = 256 * KiB
    """The largest tool output or interrupt metadata a tool may return, as JSON."""
    model_message: int = 512 * KiB
    """The largest model message accepted from the model."""
    calls_per_message: int = 128
    """The most tool calls one model message may make."""
    ref: int = 128
    """A model call id longer than this, as stored, is not used as a ref (a uuid is made)."""
    note: int = 600
    """The runtime's own text in a call's response (an error message, invalid arguments)."""
    resume_metadata: int = 16 * KiB
    """A resume's ``metadata`` (audit data: kept as its digest over ``audit_metadata``)."""
    audit_metadata: int = 4 * KiB
    """Resume metadata larger than this is kept in the audit log as its size and digest."""
    on_timeout: int = 4 * KiB
    """A deadline's default answer, checked at declaration."""
    spec: int = 64 * KiB
    """The largest agent definition (system prompt and tool schemas), checked at declaration."""
    quorum: int = 16
    """The most approvals a call may need (its votes are kept with it until the last)."""
    schema_values: int = 5_000
    """The most JSON values (each object, array, string, number, boolean or null, at any depth)
    checked against schemas inside the workflow for one answer (its edits and outputs), one
    model message (its arguments to interrupt-only tools) or one sub-agent's structured
    answer. A larger one is refused, as not fitting, before the schema is read."""
    schema_steps: int = 10_000
    """The most schema rules (keywords) applied for the same, whatever the schema makes of the
    value (``anyOf`` branches, ``$ref`` chains, each ``$ref`` counted as four); past it, the
    value is refused. A rule applied to each of a list's items counts once per item. Together they
    keep the checks inside one workflow task a small share of the SDK's 2 s deadlock timeout
    (bench/schema_bound.py measures the worst they allow)."""


DOOR = Door()


@dataclass(frozen=True)
class Held:
    """What a conversation holds, in total."""

    turn: int = 1 * MiB
    """What one turn takes in from callers, tools and the model: its messages and its tool
    calls' arguments, outputs, answers and metadata."""
    notes: int = DOOR.calls_per_message * 1280
    """The most the runtime's own notes add to a turn: a 600-byte note and a 1 KiB cancel reason
    (at most; most notes are shorter) for each of 128 calls, 160 KiB."""
    answers: int = 128 * KiB
    """The answer (audit) log; the oldest records are shed first."""
    answers_kept: int = 500
    """The answer log also keeps at most this many records."""
    memo_audit: int = 256 * KiB
    """The most one memo write's batch of answer records takes (the audit trail in history);
    over it, a record's payloads become digests, never the record itself."""
    rejections_kept: int = 20
    """The rejection log keeps this many records (each at most about 2.5 KiB)."""
    sent_kept: int = 64
    """Message ids remembered (with their turns): a send repeated with an older one is
    refused as a repeat, not taken for a new message."""
    refs_kept: int = 1000
    """Refs carried into a new run; once older ones are forgotten, refs are always fresh."""


@dataclass(frozen=True)
class Out:
    """The largest of each payload the workflow sends out."""

    state: int = 1664 * KiB
    """What continue-as-new may carry (Temporal refuses a payload of 2 MiB)."""
    query: int = 1792 * KiB
    """The largest query result."""
    update_result: int = 48 * KiB
    """The largest update result (interrupts' input and metadata over it show as
    placeholders; ``pending`` has them whole)."""
    memo_input: int = 1 * KiB
    """The largest input a paused call's memo entry holds (the inbox reads it with no worker);
    a larger one is the stated placeholder :func:`memo_input` makes, and ``Chat.pending()`` has
    it whole. The size keeps the memo bounded whatever pauses: 128 calls of at most 1 KiB of
    input, 2 KiB of approvers and votes (``operator_view.MEMO_LIST_BYTES``) and about 1 KiB of
    name, ref, digest and times, plus a batch of answer records (:data:`HELD.memo_audit`,
    256 KiB), is 768 KiB, well under the 2 MiB Temporal takes in one memo payload
    (tests/test_web_glue.py adds it up). Most inputs shown for approval (an amount, a payee, a
    command line) fit whole."""

    @property
    def model_input(self) -> int:
        """The most a model call's input may carry: as much as the state (the budgets keep it
        under 1.41 MiB, and a workflow task's total counts on this bound)."""
        return self.state


@dataclass(frozen=True)
class RunBounds:
    """What one run's history and handlers may reach."""

    can_bytes: int = 4 * MiB
    """A run continues as new once its history passes this (Temporal's default suggestion),
    even where the server is configured not to suggest it."""
    can_events: int = 4096
    """The same, counted in events."""
    guard_bytes: int = 32 * MiB
    """History at which a running turn is stopped so the run can continue as new (Temporal
    terminates a run at 50 MiB): only a flood while a turn runs gets a run here."""
    guard_events: int = 32_768
    """The same in events (Temporal terminates a run at 51,200)."""
    can_signals: int = 10
    """A run continues as new at a pause or between turns once it has taken this many signals
    (its own stream's publishes and sub-agents' reports among them), so that a deployment's
    per-run signal limit (``worker.devserver.SIGNALS_PER_RUN``, 20 on the embedded default)
    is never reached by a conversation's own use: a run past it refuses every signal."""
    stream_signals: int = 14
    """Publish signals a run's streaming model calls may send in all. The deployments this
    product ships and documents take 20 signals a run (``history.maximumSignalsPerExecution``);
    a signal past them is refused, whoever sends it. Streaming a long reply takes up to
    ``workflows.stream.MAX_TEXT_SIGNALS``: unbounded, one reply would spend the run's
    allowance, and every later signal of that run (an answer sent by script, a sub-agent's
    report) would be refused. So the streams of a run share this many, and the rest of their
    text arrives with each reply; at least 6 are left for everything else."""
    turn_waiters: int = 2
    """``await_turn`` updates (``Chat.last_turn()``) waiting at once. With the stream's
    followers (``workflows.stream.MAX_FOLLOWERS``, 4) and one close, the updates that wait take
    at most 7 of Temporal's 10 in flight: send, resume and cancel always find a slot."""


TEMPORAL = TemporalLimits()
HELD = Held()
OUT = Out()
RUN = RunBounds()


RefusalCode = Literal["invalid", "forbidden", "conflict", "not_found"]
"""What kind of refusal, for callers that map it (the HTTP app: 422, 403, 409, 404):
``invalid`` the request itself is wrong (a shape, a size, an output that does not fit);
``forbidden`` this sender may not (not an approver, an identity token refused); ``conflict``
the conversation is not in a state for it (already answered, edited since shown, busy);
``not_found`` it names what the conversation never had (an unknown ref)."""


class Refused(Exception):
    """Input that may not enter a conversation; ``reason`` says why, without quoting it."""

    def __init__(self, reason: str, *, code: RefusalCode = "invalid") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code: RefusalCode = code


def human_size(n: int) -> str:
    """``1.25 MiB``, ``12.0 KiB`` or ``200 bytes``."""
    if n >= MiB:
        return f"{n / MiB:.2f} MiB"
    if n >= KiB:
        return f"{n / KiB:.1f} KiB"
    return f"{n} bytes"


def over_turn_budget(what: str) -> str:
    """Why ``what`` was dropped: it did not fit in what the turn could still hold."""
    return f"{what} did not fit in what this turn can still hold ({human_size(HELD.turn)} in all)"


def check_size(size: int, *, limit: int, what: str) -> None:
    """Refuse ``size`` bytes of ``what`` over ``limit``."""
    if size > limit:
        raise Refused(f"{what} is {human_size(size)}; the limit is {human_size(limit)}")


def _bad_text(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_BAD_TEXT = (
    "holds text that is not valid Unicode (a lone UTF-16 surrogate, as when half of an emoji is "
    "cut off)"
)


def check_json(value: Any, *, what: str) -> None:
    """Refuse a decoded JSON value that could not be stored: text that is not valid Unicode,
    nesting deeper than :data:`DOOR.json_depth` levels, and NaN or infinity, which JSON cannot
    represent.

    Iterative, so no nesting can exhaust Python's stack. It runs inside workflow tasks, on
    values up to a resume's 1 MiB, so it does its work in C and Rust: the nesting walk visits
    only objects and arrays, and text and numbers are checked by serializing. A Python walk
    over every value took 0.5 s for a list of 470,000 numbers, twice per resume by update
    (bench/schema_bound.py measures both).
    """
    limit = DOOR.json_depth
    level: list[Any] = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                children: Iterable[Any] = item.values()
            elif isinstance(item, list | tuple):
                children = item
            else:
                continue
            if depth >= limit:
                raise Refused(f"{what} is nested deeper than {limit} levels")
            # The containers among them, picked in C (exact types: values decoded from JSON).
            children = children if isinstance(children, list) else list(children)
            nests = map(_NESTS.__contains__, map(type, children))
            below.extend(itertools.compress(children, nests))
        level = below
        depth += 1
    try:
        constants = pydantic_core.to_json(value, inf_nan_mode="constants")
        # NaN and infinity are written bare in this mode and quoted in the other: the two
        # differ in length only when there is one (the words may also be text).
        if (b"NaN" in constants or b"Infinity" in constants) and len(constants) != len(
            pydantic_core.to_json(value, inf_nan_mode="strings")
        ):
            raise Refused(f"{what} holds a number JSON cannot represent (NaN or infinity)")
    except pydantic_core.PydanticSerializationError as e:
        if "surrogates not allowed" in str(e):
            raise Refused(f"{what} {_BAD_TEXT}") from None
        _check_values(value, what=what)  # not plain JSON: a walk says what, if anything


_NESTS = frozenset({dict, list, tuple})


def _check_values(value: Any, *, what: str) -> None:
    """:func:`check_json` one value at a time: for what is not plain JSON (a subclass, a
    tuple key), where serializing cannot tell."""
    limit = DOOR.json_depth
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            if _bad_text(item):
                raise Refused(f"{what} {_BAD_TEXT}")
        elif isinstance(item, dict):
            if level >= limit:
                raise Refused(f"{what} is nested deeper than {limit} levels")
            for key, child in item.items():
                if isinstance(key, str) and _bad_text(key):
                    raise Refused(f"{what} {_BAD_TEXT}")
                stack.append((child, level + 1))
        elif isinstance(item, list | tuple):
            if level >= limit:
                raise Refused(f"{what} is nested deeper than {limit} levels")
            stack.extend((child, level + 1) for child in item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise Refused(f"{what} holds a number JSON cannot represent (NaN or infinity)")


def check_label(text: str, *, what: str, limit: int) -> None:
    """Refuse a one-line name (an identity): too long, not valid Unicode, or with control
    characters, which would garble logs, terminals and the UI."""
    if _bad_text(text):
        raise Refused(f"{what} {_BAD_TEXT}")
    if any(_is_control(c) for c in text):
        raise Refused(f"{what} holds control characters (line breaks, escapes); use one line")
    check_size(stored_size(text), limit=limit, what=what)


def check_text(text: str, *, what: str, limit: int) -> None:
    """Refuse free text (a message, a reason) that is not valid Unicode, or longer than
    ``limit`` bytes as stored (JSON: a control character takes six)."""
    if _bad_text(text):
        raise Refused(f"{what} {_BAD_TEXT}")
    check_size(stored_size(text), limit=limit, what=what)


def _is_control(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or 0x7F <= o < 0xA0


def cut_stored(text: str, limit: int) -> str:
    """``text`` cut so that it takes at most ``limit`` bytes as stored (with a ``…`` where it
    was cut), invalid Unicode replaced. For text the runtime keeps from input it does not
    control: error messages, reasons, names."""
    if _bad_text(text):
        text = text.encode("utf-8", "replace").decode("utf-8")
    if stored_size(text) <= limit:
        return text
    while stored_size(text) > limit - 3:
        text = text[: max(0, min(len(text) - 1, len(text) * limit // stored_size(text)))]
    return text + "…"


def stored_size(text: str) -> int:
    """Bytes of ``text`` inside a JSON string, as stored: UTF-8, with escapes (a control
    character takes six), without the quotes."""
    return len(pydantic_core.to_json(text)) - 2


def json_size(value: Any) -> int:
    """Bytes of ``value`` as the pydantic data converter writes it (compact UTF-8 JSON).

    Takes plain JSON values and pydantic models.
    """
    return len(pydantic_core.to_json(value))


def digest(raw: bytes) -> str:
    """A payload's fingerprint for logs: hash prefix and size, never its bytes (which may hold
    the very secret a reason is careful not to quote)."""
    return f"sha256:{hashlib.sha256(raw).hexdigest()[:16]} {len(raw)}B"


def names_within(names: Sequence[str], budget: int) -> list[str]:
    """The first of ``names`` that fit ``budget`` bytes as a stored JSON list (whole names:
    a cut identity would match nobody)."""
    kept: list[str] = []
    used = 2
    for name in names:
        used += stored_size(name) + 1
        if used > budget:
            break
        kept.append(name)
    return kept


def omitted(value: Any, *, why: str) -> dict[str, Any]:
    """A stated placeholder for a JSON object left out of a result or a log."""
    raw = pydantic_core.to_json(value)
    return {"omitted": why, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()[:16]}


MEMO_INPUT_CUT = "too large for the inbox's memo; Chat.pending() has it whole"
"""The ``omitted`` reason of a memo entry's input placeholder (see :func:`memo_input`)."""


def memo_input(value: Any, *, budget: int = OUT.memo_input) -> tuple[dict[str, Any], bool]:
    """A paused call's input as its memo entry holds it, and whether it was cut: the object
    itself when it fits ``budget`` bytes, else an :func:`omitted` placeholder (``omitted``,
    ``bytes``, ``sha256``), a JSON object as well, so a reader never parses a string."""
    if isinstance(value, dict) and json_size(value) <= budget:
        return value, False
    return omitted(value, why=MEMO_INPUT_CUT), True


# --------------------------------------------------------------------------------------------
# Fitting a result into a budget.

BULKY_KEYS = frozenset(
    {
        "input",
        "metadata",
        "output",
        "args",
        "response",
        "answer_output",
        "answer_metadata",
        "resumed_metadata",
    }
)
"""Fields of the wire types that hold caller or tool JSON, and may be replaced by a placeholder."""

TEXT_KEYS = frozenset({"text", "message"})
"""Fields that hold text, and may be cut short."""


def _replaceable(key: str, value: Any) -> bool:
    if key in BULKY_KEYS:
        return isinstance(value, dict) and "omitted" not in value
    return key in TEXT_KEYS and isinstance(value, str) and len(value) > 200


def _candidates(node: Any) -> Iterator[tuple[dict[str, Any], str]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if _replaceable(key, child):
                    yield item, key
                else:
                    stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def shrink(data: dict[str, Any], budget: int) -> int:
    """Make ``data`` (a result, dumped in JSON mode) fit ``budget`` bytes, in place.

    The largest caller or tool objects are replaced by :func:`omitted` placeholders and the
    longest texts are cut, largest first, until it fits. Returns how many were replaced.
    """
    total = json_size(data)
    if total <= budget:
        return 0
    found = [(json_size(parent[key]), parent, key) for parent, key in _candidates(data)]
    found.sort(key=lambda f: f[0], reverse=True)
    replaced = 0
    why = f"too large for this result (the limit is {human_size(budget)})"
    for size, parent, key in found:
        if total <= budget:
            break
        value = parent[key]
        if isinstance(value, str):
            parent[key] = value[:200] + f"… [{human_size(size)} of text cut: {why}]"
        else:
            parent[key] = omitted(value, why=why)
        total -= size - json_size(parent[key])
        replaced += 1
    return replaced


def decode_json(data: bytes) -> Any:
    """Decode a JSON payload body.

    Raises:
        Refused: it is not JSON, or it spells NaN or Infinity, which are not.
    """

    def refuse_constant(name: str) -> Any:
        raise Refused(f"payload is not valid JSON: {name} is not a JSON value")

    try:
        return json.loads(data, parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(f"payload is not valid JSON: {e}") from None
    except RecursionError:
        raise Refused("payload is nested too deeply") from None

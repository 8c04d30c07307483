"""The conversation's event stream: turn events on ``temporalio.contrib.workflow_streams``.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Every turn event the turn machine emits is published here (a projection, like the audit log), and
the model activity publishes the model's text as it arrives. Clients follow the stream from an
offset (``Chat.send_stream``, ``Chat.events``); offsets count every item of the conversation,
across continue-as-new, so a client that reattaches with the last offset it saw gets the rest
with no gap and no duplicate, as long as the conversation still keeps them.

What it costs, and its bounds:

- A publish from the workflow writes nothing to history (the log is rebuilt on replay). A publish
  from the model activity is a signal: the activity batches text, every
  :data:`TEXT_BATCH_SECONDS` at first and less often as a reply goes on, so that a reply adds at
  most :data:`MAX_TEXT_SIGNALS` signals however many chunks it comes in or however long it runs
  (see ``activities/streaming.py``).
- Each follower holds one of Temporal's ten in-flight updates while it waits (the library's
  long poll), and each delivery is an update: about two history events per follower per batch.
  :data:`MAX_FOLLOWERS` wait at once, each for the stream's end at most (a poll past it is
  refused), so a place held by a poll sent directly is free again at the next event; the
  product's followers read by query meanwhile (``client/stream.py``), and so they do while a
  run's history is long (:data:`HISTORY_LONG`).
- Items are at most :data:`MAX_ITEM_BYTES`: longer text is split over several ``text`` events;
  a tool input or output larger than that shows as a stated placeholder (``Chat.pending()`` and
  ``Chat.history()`` have them whole).
- The log keeps the newest :data:`KEEP_BYTES` in a run and carries the newest
  :data:`CARRY_BYTES` into the next one; offsets before that are gone (``Chat.events`` says so).
- One poll's result is at most :data:`POLL_BUDGET`, the same as an update result of ours, so ten
  of them in one workflow task still fit Temporal's 4 MiB (see :mod:`workflows.limits`).

The library registers its handlers itself; two are replaced here. Its publish signal is routed
to the workflow's raw signal handler, so a malformed publish is recorded as a rejection instead of
failing the workflow task, and only the model's text, while a model call streams, from that call
(the publisher id it was given in its input), is taken: whatever a signal from outside sends
reaches no follower as the model's, and nothing of it is kept beyond the text. Its
poll update is wrapped to cut each result to :data:`POLL_BUDGET` and to be counted apart from the
conversation's own handlers, so a follower never holds up continue-as-new or the end of a run.

The library is experimental, and this module leans on it beyond its exported names: its handler
names (the wire protocol its own client speaks, listed in ``WorkflowStream``'s docstring), its
draining refusal's type, and one private flag (see :meth:`ConversationStream.reattach`).
``tests/test_library_guards.py`` fails, naming what moved, when an upgrade changes any of them.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.contrib.workflow_streams import (
    PollInput,
    PollResult,
    PublishInput,
    WorkflowStream,
    WorkflowStreamState,
)
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import TypeAdapter, ValidationError

from temporal_agent_interrupts.workflows import events
from temporal_agent_interrupts.workflows.config import MODEL_RETRY
from temporal_agent_interrupts.workflows.interrupts import ResumeError, pydantic_reason
from temporal_agent_interrupts.workflows.limits import (
    RUN,
    KiB,
    json_size,
)
from temporal_agent_interrupts.workflows.payloads import payload_json
from temporal_agent_interrupts.workflows.types import TurnEvent

TOPIC = "events"
"""The stream topic turn events are published on."""

# The library's handler names: its wire protocol (its own client spells them out the same), kept
# only in private constants there.
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"
POLL_UPDATE = "__temporal_workflow_stream_poll"
OFFSET_QUERY = "__temporal_workflow_stream_offset"
PLACES_QUERY = "__agent_stream_follower_places"
"""How many more followers the conversation takes now (:data:`MAX_FOLLOWERS` less those
waiting; 0 while detached or while its history is long, :data:`HISTORY_LONG`): asked by a
follower before it asks for a place by update, once one was refused, so that followers reading
by query send no update that would only be refused (each refused one holds one of the ten
in-flight slots until the worker refuses it)."""

MAX_ITEM_BYTES = 16 * KiB
"""The largest turn event on the stream, as JSON."""

MAX_PUBLISH_BYTES = 96 * KiB
"""The largest publish signal taken (the model activity sends at most three text events of
16 KiB in one: 64 KiB in base64, and the envelope)."""

MAX_FOLLOWERS = 4
"""Followers waiting at once. Each holds one of the ten updates Temporal lets a workflow have in
flight, and one that went away holds its slot until the next event: the rest stay free for
send, resume, cancel and close."""

TEXT_BATCH_SECONDS = 0.25
"""How often the model activity publishes the text it has received, at most, at first; the
interval doubles after every :data:`TEXT_BATCHES_PER_STEP` batches."""

TEXT_BATCHES_PER_STEP = 8

MAX_TEXT_BATCHES = 32
"""Batches one reply publishes before its end, at most; the rest comes when it is complete."""

MAX_TEXT_SIGNALS = MAX_TEXT_BATCHES + 11
"""Signals one reply adds to history, at most: its batches, and the rest of its text at the
end (a reply is at most 512 KiB, three items of 16 KiB a signal: 11)."""

KEEP_BYTES = 256 * KiB
"""What the log keeps in a run (the newest items); trimmed when a turn stops."""

CARRY_BYTES = 64 * KiB
"""What continue-as-new carries of the log (the newest items): enough for a follower to pick up
the turns around the hand-over; every byte is in the next run's first history event (bench B3
measured 192 KiB adding a sixth to a 1,000-turn conversation's replay)."""

STREAM_DRAINING = "StreamDraining"
"""The refusal type the library's subscriber waits on and retries (its own for a run about to
continue as new; spelled here, as the library exports it only privately: a test checks it)."""

POLL_HISTORY_BYTES = 2 * RUN.can_bytes
"""Past this much history a run takes no more polls (twice where it continues as new, far under
Temporal's 50 MiB): see ``ConversationStream._validate_poll``."""

POLL_HISTORY_EVENTS = 2 * RUN.can_events
"""The same in events (Temporal terminates a run at 51,200)."""

HISTORY_LONG = "StreamHistoryLong"
"""The refusal type of a poll while the run's history is past :data:`POLL_HISTORY_BYTES` or
:data:`POLL_HISTORY_EVENTS`. Not :data:`STREAM_DRAINING`: the library's subscriber asks again
after its cooldown on that (the product's follower every 20 ms), and this lasts until the run
continues as new, which may be the whole of a long tool's run: every follower process would
send a poll refused every few milliseconds, each a workflow task holding one of the ten update
slots while the worker refuses it. The product's follower reads by query on this refusal instead,
as when the places are taken, and asks the places query (0 meanwhile) before it polls again."""

OFFSET_NOT_REACHED = "OffsetNotReached"
"""The refusal type of a poll from past the stream's end (see ``_validate_poll``)."""

POLL_BUDGET = 48 * KiB
"""The most one poll returns (items past it come with the next poll, at once)."""

_PUBLISH = TypeAdapter(PublishInput)


def _wire_size(serialized: int, topic: str) -> int:
    # As the library measures an item in a poll result (base64 of the serialized payload, and its
    # topic), and room for the item's envelope.
    return (serialized * 4 + 2) // 3 + len(topic) + 32


def _serialized_size(encoded: str) -> int:
    """The size of the serialized payload a carried item holds in base64 (exact: the padding
    says how much of the last group is data)."""
    return len(encoded) // 4 * 3 - encoded[-2:].count("=")


class ConversationStream:
    """The workflow's stream. Construct it from the workflow's ``@workflow.init``.

    Args:
        prior: The log carried by continue-as-new, if any.
        next_offset: Where offsets continue when nothing was carried (a run continued from one
            begun before the stream existed).
    """

    def __init__(self, prior: WorkflowStreamState | None, *, next_offset: int) -> None:
        if prior is None and next_offset:
            prior = WorkflowStreamState(base_offset=next_offset)
        # The library insists on being built from a method named __init__ (it reads the
        # caller's frame): this one, called from the workflow's own __init__.
        self._stream = WorkflowStream(prior)
        self._topic = self._stream.topic(TOPIC, type=TurnEvent)
        # The wire size of each item in the library's log, oldest first, for trim(): every item
        # enters it through _append (the library's own publish signal is unregistered below),
        # and the library keeps its log private.
        self._sizes = deque(
            _wire_size(_serialized_size(i.data), i.topic) for i in (prior.log if prior else [])
        )
        self._draining = False
        self.polls = 0
        # The library's long poll and its offset query, as it registered them: taken before the
        # poll update is replaced, so poll() and next_offset reach them through the SDK's
        # public handler registry instead of the library's private methods.
        library_poll = workflow.get_update_handler(POLL_UPDATE)
        library_offset = workflow.get_query_handler(OFFSET_QUERY)
        if library_poll is None or library_offset is None:
            raise RuntimeError(
                "temporalio.contrib.workflow_streams.WorkflowStream no longer registers the "
                f"{POLL_UPDATE!r} update and the {OFFSET_QUERY!r} query this stream wraps"
            )
        self._library_poll: Callable[[PollInput], Awaitable[PollResult]] = library_poll
        self._library_offset: Callable[[], int] = library_offset
        # The last batch taken of each attempt of the call streaming under _marks_key.
        self._marks_key: str | None = None
        self._marks: dict[int, int] = {}
        # The library's publish signal goes to the workflow's raw signal handler instead (see
        # accept_publish), and its poll update through poll() below.
        workflow.set_signal_handler(PUBLISH_SIGNAL, None)
        workflow.set_update_handler(POLL_UPDATE, self.poll, validator=self._validate_poll)
        workflow.set_query_handler(PLACES_QUERY, self.free_places)

    @property
    def next_offset(self) -> int:
        """The offset the next item gets."""
        return self._library_offset()

    def publish(self, event: TurnEvent) -> int:
        """Publish a turn event (split or cut to fit an item); returns its first offset."""
        first = self.next_offset
        for item in events.for_stream(event, limit=MAX_ITEM_BYTES):
            self._append(item)
        return first

    def _append(self, event: TurnEvent) -> None:
        # Converted here as the library would (the workflow's payload converter; a Payload is
        # published as it is), so that its size is known without reading the library's log.
        payload = workflow.payload_converter().to_payloads([event])[0]
        self._topic.publish(payload)
        self._sizes.append(_wire_size(payload.ByteSize(), TOPIC))

    def accept_publish(
        self, payload: RawValue, *, key: str | None, ended: str | None = None, turn: int
    ) -> tuple[int, str]:
        """Take a publish signal: the text of the model call streaming now, from that call.

        The call's activity publishes as ``"<key>:<attempt>"`` (``ModelInput.stream_key``; an
        attempt the call's retry policy allows), with a sequence that grows within an attempt;
        a batch at or below the last one taken of its attempt is a duplicate (a retried signal)
        and is dropped. So is a late publish of the last streaming call that ended (``ended``):
        its activity is ours and may publish until it hears that the workflow stopped waiting
        for it (a turn cancelled while its reply streamed), so it is no refused signal from
        outside; its text is not wanted any more. Nothing of a publish is kept but its text,
        re-made as this turn's events: the library's own per-publisher state stays empty, so
        nothing a signal sends can grow what continue-as-new carries.

        Args:
            key: The streaming call's publisher id (None: no call is streaming).
            ended: The publisher id of our last streaming call that streams no more (it
                ended, or its turn stopped), if any.
            turn: The turn it is streaming for.

        Returns the attempt it came from and the text it added ("" for a duplicate batch).

        Raises:
            ResumeError: anything else, in words for the rejection log.
        """
        if len(payload.payload.data) > MAX_PUBLISH_BYTES:
            raise ResumeError(f"a stream publish is at most {MAX_PUBLISH_BYTES // KiB} KiB")
        body = payload_json(payload)
        try:
            publish = _PUBLISH.validate_python(body)
        except ValidationError as e:
            raise ResumeError(f"malformed stream publish: {pydantic_reason(e)}") from None
        owner, _, attempt_text = publish.publisher_id.rpartition(":")
        attempts = MODEL_RETRY.maximum_attempts
        allowed = attempt_text.isascii() and attempt_text.isdigit()
        allowed = allowed and 1 <= int(attempt_text[:6]) <= attempts
        if ended is not None and owner == ended and owner != key and allowed:
            return int(attempt_text[:6]), ""  # the call is over: what it sends is dropped
        if key is None:
            raise ResumeError("nothing is streaming: only a model call in progress publishes")
        if owner != key or not allowed:
            raise ResumeError(
                "only the model call streaming now publishes on this conversation's stream"
            )
        if not publish.items:
            raise ResumeError("a stream publish carries the model's text: it has no items")
        texts = []
        for entry in publish.items:
            if entry.topic != TOPIC:
                raise ResumeError(f"unknown stream topic {entry.topic[:40]!r}")
            text = _published_text(entry.data)
            if text is None:
                raise ResumeError("only the model's text is published from outside the workflow")
            texts.append(text)
        # Each attempt counts its own batches: a publish under another attempt's number (one
        # who read the key in history) cannot make the real attempt's batches look taken.
        if self._marks_key != key:
            self._marks_key, self._marks = key, {}
        attempt = int(attempt_text)
        if publish.sequence <= self._marks.get(attempt, 0):
            return attempt, ""  # that batch was taken already
        self._marks[attempt] = publish.sequence
        for text in texts:
            self._append(TurnEvent(kind="text", turn=turn, text=text))
        return attempt, "".join(texts)

    def _validate_poll(self, payload: PollInput) -> None:
        if self._draining:
            # The library's own validator refuses this way while detached; the SDK has no way
            # to reach a registered validator, so the refusal is made here, the same.
            raise ApplicationError(
                "this run's followers are detached for continue-as-new", type=STREAM_DRAINING
            )
        if _history_long():
            # Each delivery writes its result to history, and a run can only continue as new at
            # a pause: polls while a long tool runs could take the run to Temporal's limits,
            # where the server terminates it. A refused poll writes nothing; the product's
            # follower reads by query meanwhile and polls again once the places query says a
            # place is free (in the run that continued as new). See HISTORY_LONG.
            raise ApplicationError(
                "this run's history is long: following resumes once it continues as new (at "
                "the turn's next pause or end); read by query (the stream's poll query) "
                "meanwhile",
                type=HISTORY_LONG,
                non_retryable=True,
            )
        if payload.from_offset > self.next_offset:
            # No follower of ours asks past the end (each asks from the offset it reached), and
            # such a poll would hold its place for the whole run, no event ever reaching it:
            # four of them, sent directly by a namespace holder, left the product's followers
            # no place at all.
            raise ApplicationError(
                f"this conversation's stream has not reached offset {payload.from_offset} "
                f"(the next is {self.next_offset})",
                type=OFFSET_NOT_REACHED,
                non_retryable=True,
            )
        if self.polls >= MAX_FOLLOWERS:
            raise ApplicationError(
                f"this conversation has {MAX_FOLLOWERS} followers waiting already; stop one, "
                "or read by query (the stream's poll query) instead",
                type="TooManyFollowers",
                non_retryable=True,
            )

    def free_places(self) -> int:
        """How many more followers would be taken now (:data:`PLACES_QUERY`): none while the
        run takes no polls (detached, or its history long), so that a follower reading by
        query does not ask by update only to be refused."""
        if self._draining or _history_long():
            return 0
        return max(MAX_FOLLOWERS - self.polls, 0)

    async def poll(self, payload: PollInput) -> PollResult:
        """The library's long poll, its result cut to :data:`POLL_BUDGET`."""
        self.polls += 1
        try:
            result = await self._library_poll(payload)
        finally:
            self.polls -= 1
        return _cap(result, POLL_BUDGET)

    def trim(self, budget: int = KEEP_BYTES) -> None:
        """Drop the oldest items until the log holds at most ``budget``."""
        total = sum(self._sizes)
        drop = 0
        while self._sizes and total > budget:
            total -= self._sizes.popleft()
            drop += 1
        if drop:
            # The log held len(self._sizes) + drop items before: its base was that far back.
            self._stream.truncate(self.next_offset - len(self._sizes))

    def detach(self) -> None:
        """Release followers (they pick up the next run, or drain a closed one by query)."""
        self._draining = True
        self._stream.detach_pollers()

    def reattach(self) -> None:
        """Take followers again: the run did not continue as new after all."""
        self._draining = False
        # Private, and no public API serves: the library has no way back from
        # detach_pollers(), and while this flag is set its long poll returns at once, empty,
        # so a follower would spin. Its only other use is the validator, replaced above.
        # Guarded by tests/test_library_guards.py (a follower waits again after reattach).
        self._stream._detaching = False

    def carry(self) -> WorkflowStreamState:
        """The log continue-as-new carries: its newest :data:`CARRY_BYTES`."""
        self.trim(CARRY_BYTES)
        return self._stream.get_state()


def _history_long() -> bool:
    """Whether the run's history is past the point where it takes no more polls."""
    info = workflow.info()
    return (
        info.get_current_history_size() >= POLL_HISTORY_BYTES
        or info.get_current_history_length() >= POLL_HISTORY_EVENTS
    )


def encode_item(payload: Payload) -> str:
    """A stream item as the publish signal carries it: base64 of the serialized ``Payload``
    (the library's documented wire form, ``PublishEntry.data``)."""
    return base64.b64encode(payload.SerializeToString()).decode("ascii")


def _published_text(wire: str) -> str | None:
    """The text of the text event a published item holds, or None if it holds anything else."""
    try:
        payload = Payload()
        payload.ParseFromString(base64.b64decode(wire, validate=True))
        event = TurnEvent.model_validate(json.loads(payload.data))
    except Exception:  # noqa: BLE001  # anything malformed is simply not a text event
        return None
    if event.kind != "text" or not event.text or json_size(event) > MAX_ITEM_BYTES:
        return None
    return event.text


def _cap(result: PollResult, budget: int) -> PollResult:
    """``result`` with at most ``budget`` of items (at least one); the rest come next poll."""
    size = 0
    for i, item in enumerate(result.items):
        size += len(item.data) + len(item.topic) + 32
        if size > budget and i > 0:
            return PollResult(items=result.items[:i], next_offset=item.offset, more_ready=True)
    return result

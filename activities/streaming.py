"""The model's text on the conversation's stream, as Gemini streams it.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The model activity feeds each response chunk to a :class:`TextPublisher`, which publishes the new
visible text on the conversation's stream (``temporalio.contrib.workflow_streams``, topic
``events``) as ``text`` turn events: the first text at once, then what has arrived since, every
:data:`~workflows.stream.TEXT_BATCH_SECONDS` at first, the interval doubling after every eight
batches, and the rest when the reply is complete.

Each publish is one signal, one history event (and a delivery to each follower): a reply adds at
most :data:`~workflows.stream.MAX_TEXT_SIGNALS`, however many chunks it comes in and however
long it runs (``bench/`` measures it). A reader sees the first words at once and the rest of a
long reply in steps of a second or two. Only a call's first attempt publishes (each would spend
the call's share of the run's signals anew): the text of a retried call's reply reaches the
stream when it completes, and the turn's result holds the text of the reply that counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity
from temporalio.contrib.workflow_streams import PublishEntry, PublishInput

from temporal_agent_interrupts.workflows.events import split_text
from temporal_agent_interrupts.workflows.stream import (
    MAX_ITEM_BYTES,
    MAX_TEXT_BATCHES,
    MAX_TEXT_SIGNALS,
    PUBLISH_SIGNAL,
    TEXT_BATCH_SECONDS,
    TEXT_BATCHES_PER_STEP,
    TOPIC,
    encode_item,
)
from temporal_agent_interrupts.workflows.types import TurnEvent

log = logging.getLogger(__name__)


def chunk_text(chunk: dict[str, Any]) -> str:
    """The visible text of one REST-shaped response chunk (thoughts left out)."""
    for cand in chunk.get("candidates") or []:
        parts = (cand.get("content") or {}).get("parts") or []
        return "".join(p["text"] for p in parts if p.get("text") and not p.get("thought"))
    return ""


class TextPublisher:
    """Publishes one model call's text for turn ``turn``; use as an async context manager.

    Publishing never fails the model call: after a publish that does not get through, nothing
    more is sent, and the workflow publishes what the stream lacks when the call completes.

    Args:
        turn: The turn the text is for.
        key: The call's publisher id (``ModelInput.stream_key``): the workflow takes text only
            from publishes that carry it, as ``"<key>:<attempt>"`` (only the first attempt
            publishes).
        signals: The most publish signals to send (``ModelInput.stream_signals``; None: as
            many as one reply takes). Fewer spread their batches over a longer reply (the
            interval doubles sooner); what comes after the last reaches the stream when the
            call completes.
    """

    def __init__(
        self,
        *,
        turn: int,
        key: str,
        interval: float = TEXT_BATCH_SECONDS,
        signals: int | None = None,
    ) -> None:
        self._turn = turn
        self._interval = interval
        # A retried attempt publishes nothing: every attempt would spend the call's share
        # anew; the workflow publishes the reply that counted when the call completes.
        first = activity.info().attempt <= 1
        self._signals = (MAX_TEXT_SIGNALS if signals is None else max(0, signals)) if first else 0
        self._max_batches = min(MAX_TEXT_BATCHES, self._signals)
        # Fewer batches double their interval sooner (a quarter of them a step, at most 8), so
        # they reach further into a long reply: 14 reach about 19 s, 32 about 30 s.
        self._per_step = max(1, min(TEXT_BATCHES_PER_STEP, self._max_batches // 4))
        info = activity.info()
        self._publisher_id = f"{key}:{info.attempt}"
        # The signal is sent here, not through the library's WorkflowStreamClient: its
        # publisher id is its own random one, and this class decides when to send (at most
        # three items per signal, which the workflow takes: workflows.stream.MAX_PUBLISH_BYTES).
        client = activity.client()
        self._handle = client.get_workflow_handle(info.workflow_id or "")
        self._converter = client.data_converter.payload_converter
        self._sequence = 0
        self._buffer: list[str] = []
        self._queue: list[TurnEvent] = []
        self._last = -self._interval
        self._timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Task[None] | None = None
        self._batches = 0
        self._failed = False
        self.published = 0

    async def __aenter__(self) -> TextPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._publish()
        if self._sending is not None:
            await self._sending

    def feed(self, chunk: dict[str, Any]) -> None:
        """Take one response chunk."""
        text = chunk_text(chunk)
        if not text:
            return
        self._buffer.append(text)
        if self._batches >= self._max_batches or self._timer is not None:
            return  # the rest comes with the next batch, or at the end
        interval = self._interval * 2 ** (self._batches // self._per_step)
        wait = self._last + interval - time.monotonic()
        if wait <= 0:
            self._publish()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait, self._publish)

    def _publish(self) -> None:
        self._timer = None
        if not self._buffer:
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        self._last = time.monotonic()
        self._batches += 1
        room = MAX_ITEM_BYTES - 256  # the event's other fields
        self._queue += [
            TurnEvent(kind="text", turn=self._turn, text=p) for p in split_text(text, room)
        ]
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while self._queue and not self._failed:
            if self._sequence >= self._signals:
                # The call's share of the run's signals is spent: the workflow publishes the
                # rest of the reply when the call completes.
                self._failed = True
                return
            batch, self._queue = self._queue[:3], self._queue[3:]
            self._sequence += 1
            publish = PublishInput(
                items=[
                    PublishEntry(topic=TOPIC, data=encode_item(self._converter.to_payload(e)))
                    for e in batch
                ],
                publisher_id=self._publisher_id,
                sequence=self._sequence,
            )
            try:
                await self._handle.signal(PUBLISH_SIGNAL, publish)
            except Exception:  # the stream is a view; the model call goes on
                # Nothing more from here: a batch could grow past what the workflow takes, and
                # text out of order is worse than text that arrives with the reply.
                log.warning("could not publish the model's text on the stream", exc_info=True)
                self._failed = True
                return
            self.published += len(batch)

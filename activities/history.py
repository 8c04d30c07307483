"""The model activity's memory of each conversation, so model calls carry only what is new.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The workflow sends the messages the model side has not seen, plus the digest of the ones before
them. The activity rebuilds the whole conversation from what it kept for the chat, or, when it
kept nothing or something else (another worker, a restart, a rolled-back turn, an eviction), from
the workflow itself through the ``messages`` query. Each message is converted to the REST shape
once, when it first arrives.

What it costs and what it bounds: :class:`ConversationCache` keeps at most ``max_chats``
conversations per worker (1000 by default) and at most ``max_bytes`` of their messages (64 MiB,
measured as the messages' JSON; in memory, with their REST parts, about three times that), least
recently used first out. ``max_chats=0`` keeps nothing: every call after a conversation's first
takes the miss path, a query round trip to the workflow and a fresh conversion of every message.

Why it is kept: ``bench/`` measures the model call after a resume about 6 ms slower without it
(B1, ``ours_nocache``), and a plain turn of a 1,000-turn conversation twice as slow (B3); on a
worker that has evicted the workflow, the query also replays its history first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.gemini import part_to_rest
from temporal_agent_interrupts.workflows.activity_io import (
    ModelInput,
)
from temporal_agent_interrupts.workflows.history import EMPTY, step
from temporal_agent_interrupts.workflows.limits import MiB, json_size
from temporal_agent_interrupts.workflows.types import (
    ErrorKind,
    Message,
    MessagesInput,
)


@dataclass
class Conversation:
    """Messages with their REST parts and the digest of every prefix."""

    messages: list[Message] = field(default_factory=list)
    rest: list[list[dict[str, Any]]] = field(default_factory=list)
    digests: list[str] = field(default_factory=lambda: [EMPTY])
    # The JSON size of each message, so the cache can bound what it holds.
    sizes: list[int] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.messages)

    def head(self, n: int) -> Conversation:
        return Conversation(self.messages[:n], self.rest[:n], self.digests[: n + 1], self.sizes[:n])

    def plus(self, messages: Sequence[Message]) -> Conversation:
        out = Conversation(
            list(self.messages), list(self.rest), list(self.digests), list(self.sizes)
        )
        for m in messages:
            out.messages.append(m)
            out.sizes.append(json_size(m))
            out.rest.append([part_to_rest(p) for p in m.parts])
            out.digests.append(step(out.digests[-1], m))
        return out


class ConversationCache:
    """The conversations this worker has served lately, least recently used first out.

    Holds at most ``max_chats`` conversations and ``max_bytes`` of their messages (see the
    module docstring for what each costs); ``max_chats=0`` keeps none, so every call with
    earlier messages asks the workflow for them. A conversation larger than ``max_bytes`` on
    its own is not kept.
    """

    def __init__(self, *, max_chats: int = 1000, max_bytes: int = 64 * MiB) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, not {max_bytes!r}")
        if isinstance(max_chats, bool) or not isinstance(max_chats, int) or max_chats < 0:
            raise ValueError(
                f"max_chats must be an int >= 0 (0 turns the cache off), not {max_chats!r}"
            )
        self._chats: OrderedDict[str, Conversation] = OrderedDict()
        self._max = max_chats
        self._max_bytes = max_bytes
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def max_chats(self) -> int:
        return self._max

    def __len__(self) -> int:
        return len(self._chats)

    @property
    def bytes(self) -> int:
        """The JSON size of the messages held now."""
        return self._bytes

    def get(self, chat_id: str) -> Conversation | None:
        conv = self._chats.get(chat_id)
        if conv is not None:
            self._chats.move_to_end(chat_id)
        return conv

    def put(self, chat_id: str, conv: Conversation) -> None:
        old = self._chats.pop(chat_id, None)
        if old is not None:
            self._bytes -= old.bytes
        size = conv.bytes
        if self._max == 0 or size > self._max_bytes:
            return
        self._chats[chat_id] = conv
        self._bytes += size
        while len(self._chats) > self._max or self._bytes > self._max_bytes:
            _, evicted = self._chats.popitem(last=False)
            self._bytes -= evicted.bytes

    async def resolve(self, input: ModelInput) -> Conversation:
        """The whole conversation this call is about."""
        n = input.new_from
        kept = self.get(input.chat_id)
        if n == 0:
            prefix = Conversation()
        elif kept is not None and len(kept) >= n and kept.digests[n] == input.prefix_digest:
            self.hits += 1
            prefix = kept.head(n)
        else:
            self.misses += 1
            prefix = await _ask_workflow(input.chat_id, n)
            if prefix.digests[n] != input.prefix_digest:
                # The workflow moved on while this call was being prepared; a retry sees the
                # new state.
                raise ApplicationError(
                    f"chat {input.chat_id}: the conversation changed under this model call",
                    type=ErrorKind.CONVERSATION_CHANGED,
                )
        conv = prefix.plus(input.new_messages)
        if input.history_size is not None and len(conv) != input.history_size:
            raise ApplicationError(
                f"chat {input.chat_id}: rebuilt {len(conv)} messages, expected "
                f"{input.history_size}",
                type=ErrorKind.CONVERSATION_CHANGED,
            )
        return conv


async def _ask_workflow(chat_id: str, n: int) -> Conversation:
    # Imported here: the activity needs the workflow class only for this typed query.
    from temporal_agent_interrupts.workflows import AgentWorkflow

    handle = activity.client().get_workflow_handle(chat_id)
    messages = []
    start = 0
    # In pages: the whole conversation may be larger than one query result can be.
    while start < n:
        result = await handle.query(AgentWorkflow.messages, MessagesInput(start=start, end=n))
        messages += result.messages
        if result.next is None or result.next <= start:
            break
        start = result.next
    return Conversation().plus(messages)

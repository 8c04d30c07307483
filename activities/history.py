"""The model activity's memory of each conversation, so model calls carry only what is new.

The workflow sends the messages the model side has not seen, plus the digest of the ones before
them. The activity rebuilds the whole conversation from what it kept for the chat, or, when it
kept nothing or something else (another worker, a restart, a rolled-back turn), from the
workflow itself through the ``messages`` query. Each message is converted to the REST shape
once, when it first arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gemini import part_to_rest
from workflows.history import EMPTY, step
from workflows.types import ErrorKind, Message, MessagesInput, ModelInput


@dataclass
class Conversation:
    """Messages with their REST parts and the digest of every prefix."""

    messages: list[Message] = field(default_factory=list)
    rest: list[list[dict[str, Any]]] = field(default_factory=list)
    digests: list[str] = field(default_factory=lambda: [EMPTY])

    def __len__(self) -> int:
        return len(self.messages)

    def head(self, n: int) -> Conversation:
        return Conversation(self.messages[:n], self.rest[:n], self.digests[: n + 1])

    def plus(self, messages: Sequence[Message]) -> Conversation:
        out = Conversation(list(self.messages), list(self.rest), list(self.digests))
        for m in messages:
            out.messages.append(m)
            out.rest.append([part_to_rest(p) for p in m.parts])
            out.digests.append(step(out.digests[-1], m))
        return out


class ConversationCache:
    """The conversations this worker has served lately, least recently used first out."""

    def __init__(self, *, max_chats: int = 1000) -> None:
        self._chats: OrderedDict[str, Conversation] = OrderedDict()
        self._max = max_chats
        self.hits = 0
        self.misses = 0

    def get(self, chat_id: str) -> Conversation | None:
        conv = self._chats.get(chat_id)
        if conv is not None:
            self._chats.move_to_end(chat_id)
        return conv

    def put(self, chat_id: str, conv: Conversation) -> None:
        self._chats[chat_id] = conv
        self._chats.move_to_end(chat_id)
        while len(self._chats) > self._max:
            self._chats.popitem(last=False)

    async def resolve(self, input: ModelInput) -> Conversation:
        """The whole conversation this call is about."""
        if input.new_from is None:
            # A call scheduled by the first release: it carries everything.
            return Conversation().plus(input.messages)
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
    from workflows import AgentWorkflow

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

"""Rolling digests of a conversation's messages, shared by the workflow and the model activity.

``digest(n)`` identifies the first ``n`` messages. The workflow sends it with every model call so
the activity can tell whether the messages it kept for a chat are exactly the ones the workflow
holds (after a rollback, a restart or another worker they may not be). Pure code: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from workflows.types import Message

EMPTY = ""


def step(previous: str, message: Message) -> str:
    """The digest of a prefix extended by one message."""
    h = hashlib.sha256(previous.encode())
    h.update(message.model_dump_json().encode())
    return h.hexdigest()[:32]


class Digests:
    """Digests of every prefix of a message list that only grows or is cut short."""

    def __init__(self) -> None:
        self._d: list[str] = [EMPTY]

    def of(self, messages: Sequence[Message], n: int) -> str:
        """The digest of ``messages[:n]``, computing only what is new."""
        while len(self._d) <= n:
            i = len(self._d) - 1
            self._d.append(step(self._d[-1], messages[i]))
        return self._d[n]

    def cut(self, n: int) -> None:
        """Forget digests of prefixes longer than ``n`` (the list was cut to ``n`` messages)."""
        del self._d[n + 1 :]

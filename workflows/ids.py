"""The ids and keys a conversation derives: a sub-agent's chat id, a tool run's idempotency
key, a message's digest, and the chats a token bound to one answer may name.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Leaf functions, shared by the turn's parts and the workflow's handlers; each is a wire format
(ids in Temporal, keys tools see), so none may change once released.
"""

from __future__ import annotations

import hashlib

from temporalio import workflow


def answer_chats() -> tuple[str, ...]:
    """The chat ids a token bound to one answer may name here: this conversation's, and for a
    sub-agent each of its callers' up to the first (an answer to a sub-agent's call is sent to a
    caller and forwarded down). Temporal names the parent and the root; the ones between are
    read from this chat's id, which each caller made by extending its own (``sub_agent_id``):
    every ``--`` boundary of it from the root's id on."""
    info = workflow.info()
    own = info.workflow_id
    if info.parent is None:
        return (own,)
    root = info.root.workflow_id if info.root is not None else info.parent.workflow_id
    chats = {own, info.parent.workflow_id, root}
    if own.startswith(f"{root}--"):
        at = len(root)
        while (at := own.find("--", at + 2)) != -1:
            chats.add(own[:at])
    return tuple(sorted(chats))


def sub_agent_id(chat_id: str, ref: str, run: int) -> str:
    """The chat id of a sub-agent's conversation for one run of a call (``agent_tool``)."""
    return f"{chat_id}--{ref}" if run <= 1 else f"{chat_id}--{ref}--{run}"


def message_digest(text: str) -> str:
    """What tells a message sent again from another message under the same id."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def idempotency_key(chat_id: str, ref: str, run: int) -> str:
    """``ToolContext.idempotency_key``: the same for every attempt and replay of one run of a
    call (one approval), different for the next run; fixed-length for any far-side API."""
    return hashlib.sha256(f"{chat_id}\0{ref}\0{run}".encode()).hexdigest()[:32]

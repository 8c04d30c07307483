"""The inbox: every paused chat in a namespace, read from Temporal's visibility store alone.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.types``.

A paused conversation says so in its search attributes (``AgentStatus="interrupted"``,
``InterruptedSince``) and lists what it waits on in its memo's ``pending`` entries (written by
``workflows.operator_view.memo_entry``: name, ref, the input (an object; a stated placeholder
when it is over ``OUT.memo_input``), since when, until when, who may answer and the votes so
far). Reading them
needs no worker, so the inbox works while none runs.

Whoever holds the namespace's credentials can start a workflow that says it is paused, with any
memo: of another type, on a task queue no worker polls, in an encoding nobody reads, nested past
any parser's limit. The inbox lists what it can read and marks the rest: a chat whose memo does
not decode or parse is listed from its search attributes, ``unreadable`` with the reason (never
the memo's text), and one chat's memo never hides another. Only ``AgentWorkflow`` runs are
listed, each with its task queue, since a run on a queue this deployment's workers do not poll
was never written by them.

The models here are also ``agentctl pending --json``'s schema: evolve them by adding fields.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecution
from temporalio.converter import PayloadConverter

from temporal_agent_interrupts.codec import ENV_VAR, PayloadKeyMissing
from temporal_agent_interrupts.workflows.config import (
    AGENT_NAME,
    INTERRUPTED_SINCE,
    PENDING_INTERRUPTS,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.limits import DOOR, KiB
from temporal_agent_interrupts.workflows.types import (
    GrantScope,
    InterruptSource,
    JsonObject,
    Requester,
    Shown,
    ToolResponse,
    ToolRestart,
    approval,
    denial,
)
from temporal_agent_interrupts.workflows.types import input_digest as digest_of

log = logging.getLogger(__name__)

MAX_PENDING_MEMO = DOOR.calls_per_message * 6 * KiB
"""The largest memo ``pending`` payload the inbox reads: 768 KiB. This product writes at most
128 entries (``DOOR.calls_per_message``: a turn's own calls and its sub-agents' together) of at
most 5.5 KiB each (``OUT.memo_input`` of input, ``MEMO_LIST_BYTES`` each of approvers and votes,
``MEMO_SHOWN_BYTES`` of what a person is shown, name, ref, digest, times:
tests/test_web_glue.py adds it up), 704 KiB; the rest is slack for a sub-agent's path. A
larger one was written by something else: listed from its search attributes, ``unreadable``,
and never parsed."""

PAGE_SIZE = 20
"""Chats one page of the inbox holds unless asked otherwise. The server sends each listed
workflow's memo whole, whatever this bound says: 50 fakes of 1.5 MB on the listed queue took
10.8 s and stalled the event loop 0.8 s (parsing the response) on a busy 2-core machine, so a
page is kept small. Real entries are a few KiB each."""

MAX_PAGE_SIZE = 100
"""The most one page may be asked to hold."""

MAX_CURSOR = 4096
"""The longest cursor taken back (Temporal's page tokens are a few hundred bytes)."""

PAUSED_QUERY = (
    f'WorkflowType="{WORKFLOW_TYPE}" AND AgentStatus="interrupted" AND ExecutionStatus="Running"'
)
"""Every conversation waiting on a human (a closed workflow waits on no one); a workflow of
another type that sets the same search attributes is not a conversation."""


class PausedInterrupt(BaseModel):
    """One call a paused chat waits on, as its memo records it.

    A key the memo leaves out keeps its default: ``memo_entry`` omits what says nothing (no
    deadline, anyone may answer, a quorum of one).
    """

    name: str
    ref: str
    input: JsonObject = {}
    """The tool's input, a JSON object as ``InterruptRequest.input`` is. When it was too large
    for the memo (``OUT.memo_input``, 1 KiB) it is a stated placeholder instead, ``{"omitted":
    why, "bytes": n, "sha256": prefix}``, and ``input_cut`` says so: ``Chat.pending()`` has it
    whole. Answers built here carry ``input_digest`` either way."""
    input_cut: bool = False
    """``input`` is a placeholder, not the input (too large for the memo, or not readable)."""
    source: InterruptSource | None = None
    since: datetime | None = None
    deadline: datetime | None = None
    approvers: list[str] = []
    """Identities or ``group:NAME`` that may answer (empty: anyone); the memo holds 1 KiB of
    them, and counts the rest in ``approvers_omitted``."""
    approvers_omitted: int = 0
    votes_omitted: int = 0
    quorum: int = 1
    votes: list[str] = []
    """Who has approved so far, when it needs a quorum."""
    input_digest: str = ""
    """What names the call's whole input (``InterruptRequest.input_digest``): the answers built
    here carry it, so they answer only the input this entry was written for."""
    path: list[str] = []
    """A sub-agent's call (``agent_tool``), as ``InterruptRequest.path``: the caller's call ref,
    then the ref in the sub-agent's chat and so on down (``ref``, the innermost, is what an
    answer names). Empty: a call of this chat's own."""
    chat_id: str | None = None
    """The sub-agent's chat the call waits in (its rules decide; it may be answered there as
    well as here). None: a call of this chat's own."""
    requester: Requester | None = None
    """Who sent the message the call came from (``verified``: proven by a token of the
    agent's issuer; else asserted). None: the message did not say."""
    editable: bool = False
    """The tool takes an edited input (``InterruptRequest.editable``)."""
    shown: Shown | None = None
    """What a person is shown of the call (``InterruptRequest.shown``), as the memo keeps it:
    its first six fields, each text cut to 160 characters. None: written before there was."""

    def approve(self, *, remember: GrantScope | None = None) -> ToolResponse | ToolRestart:
        """The approving answer, as ``InterruptRequest.approve()`` builds it (send it with
        ``Chat.resume`` on this entry's chat: ``agents.chat(paused.agent,
        chat_id=paused.chat_id)``; no worker query is needed first)."""
        return approval(
            self._source(),
            self.name,
            self.ref,
            input_digest=self._shown_digest(),
            remember=remember,
        )

    def deny(self, reason: str = "") -> ToolResponse:
        """The denying answer, as ``InterruptRequest.deny()`` builds it."""
        return denial(
            self._source(), self.name, self.ref, reason, input_digest=self._shown_digest()
        )

    def respond(self, output: JsonObject | BaseModel) -> ToolResponse:
        """The answer that supplies the tool's output, as ``InterruptRequest.respond()``."""
        if isinstance(output, BaseModel):
            output = output.model_dump(mode="json")
        return ToolResponse(
            name=self.name, ref=self.ref, output=output, input_digest=self._shown_digest()
        )

    def _shown_digest(self) -> str:
        """The digest an answer built here carries: that of the input this entry shows.

        The memo is read as its writer left it, and a start's memo is listed until a worker's
        first task removes it: a starter could show ``{"amount": 1}`` beside the digest of
        ``{"amount": 1000000}``, or no digest at all, and an approval of what was shown would
        approve the other call once the conversation pauses on it. So the digest is computed
        from the input shown, and an entry whose own digest names another input is refused.
        A placeholder (``input_cut``) shows no input: its answer carries the memo's digest,
        and an entry with neither is answered from ``Chat.pending()``.

        Raises:
            ValueError: the entry's digest does not name the input it shows, or it shows a
                placeholder and has no digest.
        """
        if self.input_cut:
            if not self.input_digest:
                raise ValueError(
                    f"the inbox entry for {self.name!r} (ref {self.ref!r}) shows no input and "
                    "no digest of it: answer it from Chat.pending()"
                )
            return self.input_digest
        shown = digest_of(self.input)
        if self.input_digest and self.input_digest != shown:
            raise ValueError(
                f"the inbox entry for {self.name!r} (ref {self.ref!r}) carries the digest of "
                "another input than the one it shows (its memo was not written by the "
                "conversation): answer it from Chat.pending()"
            )
        return shown

    def _source(self) -> InterruptSource:
        if self.source is None:
            # Approving takes a respond or a restart depending on the kind of pause.
            raise ValueError(
                f"the inbox entry for {self.name!r} (ref {self.ref!r}) does not say what kind "
                "of pause it is: answer it from Chat.pending()"
            )
        return self.source

    def awaits(self, approver: str) -> bool:
        """Whether ``approver`` may answer this interrupt and has not voted on it yet.

        Groups cannot be resolved without the approver's token, so a ``group:NAME`` approver
        matches only the same ``group:NAME`` given as ``approver``.
        """
        if approver in self.votes:
            return False
        # A list the memo cut short may name them further on: listed, as a maybe.
        return not self.approvers or approver in self.approvers or self.approvers_omitted > 0


class PausedChat(BaseModel):
    """A conversation paused on a human: what the inbox lists."""

    chat_id: str
    agent: str | None = None
    waiting_since: datetime | None = None
    """When its oldest pending interrupt was raised."""
    interrupts: list[PausedInterrupt] = []
    unreadable: str | None = None
    """Why its memo could not be read here: it is encrypted with a key this process does not
    have (the message names the key id), or it does not decode or parse (the reason says which,
    and never quotes it). Its interrupts are then only the tool names its search attributes
    hold (ref ``?``), and it stays in every approver's list, as a maybe."""
    unreadable_entries: int = 0
    """How many of its memo's pending entries did not parse and are left out of
    ``interrupts``."""
    task_queue: str | None = None
    """The task queue it runs on. A chat on a queue none of this deployment's workers poll was
    never written by them: what its memo says is whatever its starter chose."""


def check_agent_name(agent: str) -> None:
    """Refuse an agent name that cannot be put in a visibility query.

    Raises:
        ValueError: it holds a quote or a backslash (no agent name does).
    """
    if '"' in agent or "\\" in agent:
        raise ValueError("agent names cannot contain quotes or backslashes")


def paused_query(
    agent: str | None = None,
    *,
    task_queues: Sequence[str] | None = None,
    waiting_before: datetime | None = None,
) -> str:
    """The visibility query for paused chats, of ``agent`` only when given, on ``task_queues``
    only when given (None: every queue), paused at ``waiting_before`` or earlier only when given
    (visibility pages newest started first and has no other order: this is how the longest
    waiting are found without walking every page).

    Raises:
        ValueError: ``agent`` or a task queue holds a quote or a backslash, or
            ``task_queues`` is empty.
    """
    query = PAUSED_QUERY
    if agent is not None:
        check_agent_name(agent)
        query += f' AND AgentName="{agent}"'
    if task_queues is not None:
        queues = list(dict.fromkeys(task_queues))
        if not queues:
            raise ValueError("task_queues names no task queue")
        for queue in queues:
            if '"' in queue or "\\" in queue:
                raise ValueError("task queue names cannot contain quotes or backslashes")
        query += " AND (" + " OR ".join(f'TaskQueue="{q}"' for q in queues) + ")"
    if waiting_before is not None:
        if waiting_before.tzinfo is None:
            raise ValueError("waiting_before needs a time zone")
        # isoformat, not strftime: %Y does not pad a year before 1000 on every platform.
        since = waiting_before.astimezone(UTC).isoformat(timespec="microseconds")
        since = since.replace("+00:00", "Z")
        query += f' AND InterruptedSince <= "{since}"'
    return query


def memo_interrupts(items: object) -> list[PausedInterrupt]:
    """The memo's ``pending`` entries; an entry that does not parse is left out (a memo some
    other program wrote: show what can be shown)."""
    return read_entries(items)[0]


def read_entries(items: object) -> tuple[list[PausedInterrupt], int]:
    """The memo's ``pending`` entries that parse, and how many did not (see
    :func:`memo_interrupts`)."""
    if not isinstance(items, list):
        return [], 0
    found: list[PausedInterrupt] = []
    left_out = 0
    for item in items:
        try:
            found.append(PausedInterrupt.model_validate(item))
        except (ValidationError, RecursionError):
            # Pydantic stops at its own depth limit; the guard is for Python's, should an entry
            # reach it first.
            left_out += 1
    if left_out:
        log.debug("%d memo entries left out of the inbox: they do not parse", left_out)
    return found, left_out


def for_approver(chats: Iterable[PausedChat], approver: str) -> list[PausedChat]:
    """Each chat with only the interrupts ``approver`` may still answer; chats left with none
    are left out."""
    kept: list[PausedChat] = []
    for chat in chats:
        if chat.unreadable is not None:
            # Who may answer is in the memo it cannot read: maybe theirs, never "not theirs".
            kept.append(chat)
            continue
        mine = [i for i in chat.interrupts if i.awaits(approver)]
        if mine:
            kept.append(chat.model_copy(update={"interrupts": mine}))
    return kept


def oldest_first(chats: Iterable[PausedChat]) -> list[PausedChat]:
    """Whoever has waited longest first (then by chat id); a chat that does not say since when
    comes last."""
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(chats, key=lambda c: (c.waiting_since or far, c.chat_id))


def paused_chat(wf: WorkflowExecution, pending: object) -> PausedChat:
    """One listed workflow as the inbox shows it; ``pending`` is its memo's ``pending``.

    A ``pending`` that is there but not a list makes the chat :func:`unreadable_chat`.
    """
    if pending is not None and not isinstance(pending, list):
        return unreadable_chat(wf, "its memo's pending calls are not a list")
    interrupts, left_out = read_entries(pending)
    return _listed(wf).model_copy(update={"interrupts": interrupts, "unreadable_entries": left_out})


def _listed(wf: WorkflowExecution) -> PausedChat:
    """What a listed workflow's search attributes and visibility say, with no memo read."""
    return PausedChat(
        chat_id=wf.id,
        agent=wf.typed_search_attributes.get(AGENT_NAME),
        waiting_since=wf.typed_search_attributes.get(INTERRUPTED_SINCE),
        task_queue=wf.task_queue or None,
    )


def unreadable_chat(wf: WorkflowExecution, error: PayloadKeyMissing | str) -> PausedChat:
    """A listed workflow whose memo this process cannot read: what its search attributes say
    (agent, since when, the tool names), and why the rest is not shown.

    Args:
        error: The key that is missing, or why the memo does not read, in words that never
            quote it (:func:`memo_problem`).
    """
    names = wf.typed_search_attributes.get(PENDING_INTERRUPTS) or []
    if isinstance(error, PayloadKeyMissing):
        why = "whose key here does not open it" if error.corrupt else f"which {ENV_VAR} here lacks"
        shown, reason = f"(encrypted with key id {error.key_id!r}, {why})", str(error)
    else:
        shown, reason = "(its memo could not be read)", error
    return _listed(wf).model_copy(
        update={
            "interrupts": [
                PausedInterrupt(name=n, ref="?", input={"omitted": shown}, input_cut=True)
                for n in names
            ],
            "unreadable": reason,
        }
    )


def memo_problem(error: Exception) -> str:
    """Why a memo did not decode, in words: never the exception's message, which quotes the
    memo (pydantic's does) or names an encoding its writer chose."""
    if isinstance(error, RecursionError):
        return "its memo nests too deep to read"
    if isinstance(error, KeyError):
        # The SDK's converter raises KeyError("Unknown payload encoding ...").
        return "its memo is in an encoding this client does not read"
    if isinstance(error, ValueError):
        # json's and pydantic's errors (invalid JSON, past the parser's depth limit, not UTF-8)
        return "its memo is not valid JSON, or nests too deep to read"
    return f"its memo could not be read ({type(error).__name__})"


class InboxPage(BaseModel):
    """One page of the inbox: its chats, oldest waiting first, and where the next page starts."""

    chats: list[PausedChat] = []
    next_cursor: str | None = None
    """Pass it back as ``cursor`` for the next page; None: this was the last."""


def encode_cursor(token: bytes | None) -> str | None:
    """Temporal's page token as the inbox hands it out (URL-safe text)."""
    return base64.urlsafe_b64encode(token).decode() if token else None


def decode_cursor(cursor: str | None) -> bytes | None:
    """A cursor given back, as Temporal's page token (the server checks what it says).

    Raises:
        ValueError: it is not one this inbox could have handed out.
    """
    if not cursor:
        return None
    if len(cursor) > MAX_CURSOR:
        raise ValueError(f"the cursor is over {MAX_CURSOR} characters")
    try:
        token = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("the cursor is not one the inbox handed out") from None
    if not token:
        raise ValueError("the cursor is not one the inbox handed out")
    return token


def _too_large(wf: WorkflowExecution, size: int) -> PausedChat:
    return unreadable_chat(
        wf,
        f"its memo's pending calls take {size} bytes, more than this product writes "
        f"({MAX_PENDING_MEMO}): not read",
    )


async def _listed_page(temporal: Client, listed: Sequence[WorkflowExecution]) -> list[PausedChat]:
    """The chats of one page of the listing, their memos read off the event loop.

    Only the memo's ``pending`` is read, and only when it is no larger than this product
    writes (:data:`MAX_PENDING_MEMO`): whoever holds the namespace's credentials can start a
    workflow that says it is paused with a memo of megabytes, and parsing 60 of those (90 MB)
    on the event loop held it for seconds and the process at a gigabyte. The codec (a payload
    key's decryption) runs on the loop, bounded by that size; parsing and validating run in a
    thread.
    """
    now = datetime.now(UTC)
    chats: list[PausedChat | None] = []
    memos: list[tuple[int, WorkflowExecution, Payload | None]] = []
    codec = temporal.data_converter.payload_codec
    for wf in listed:
        if wf.execution_time is not None and wf.execution_time > now:
            # A delayed start (start_delay): no worker has run it, so what its memo and search
            # attributes say is only what its starter wrote. It waits on no one yet.
            continue
        # Only "pending" is read: the memo also holds the latest batch of audit records.
        payload = wf.raw_info.memo.fields.get("pending")
        if payload is not None and payload.ByteSize() > MAX_PENDING_MEMO:
            chats.append(_too_large(wf, payload.ByteSize()))
            continue
        if payload is not None and codec is not None:
            try:
                (payload,) = await codec.decode([payload])
            except Exception as e:  # noqa: BLE001  # any memo at all: one chat never hides another
                chats.append(_unreadable(wf, e))
                continue
        memos.append((len(chats), wf, payload))
        chats.append(None)
    converter = temporal.data_converter.payload_converter
    read = await asyncio.to_thread(_read_memos, converter, [(wf, p) for _, wf, p in memos])
    for (at, _, _), chat in zip(memos, read, strict=True):
        chats[at] = chat
    return [c for c in chats if c is not None]


def _read_memos(
    converter: PayloadConverter, memos: Sequence[tuple[WorkflowExecution, Payload | None]]
) -> list[PausedChat]:
    """Each workflow's ``pending`` memo payload parsed and checked (in a thread: see
    :func:`_listed_page`)."""
    found: list[PausedChat] = []
    for wf, payload in memos:
        try:
            pending = None if payload is None else converter.from_payloads([payload])[0]
            found.append(paused_chat(wf, pending))
        except Exception as e:  # noqa: BLE001  # any memo at all: one chat never hides another
            found.append(_unreadable(wf, e))
    return found


def _unreadable(wf: WorkflowExecution, error: Exception) -> PausedChat:
    if isinstance(error, PayloadKeyMissing):
        # One conversation written with a key this process lacks (another team's, or one
        # rotated out) must not hide the rest: it is listed from its search attributes.
        return unreadable_chat(wf, error)
    return unreadable_chat(wf, memo_problem(error))


async def paused_page(
    temporal: Client,
    *,
    agent: str | None = None,
    approver: str | None = None,
    task_queues: Sequence[str] | None = None,
    waiting_before: datetime | None = None,
    limit: int = PAGE_SIZE,
    cursor: str | None = None,
) -> InboxPage:
    """One page of the paused chats in ``temporal``'s namespace (see
    :meth:`client.AgentClient.pending_page`): at most ``limit`` chats, in visibility's order
    (newest started first), each page oldest waiting first.

    Raises:
        ValueError: ``agent`` or a task queue cannot be put in a visibility query, ``limit``
            is out of range, or ``cursor`` is not one this inbox handed out.
        temporalio.service.RPCError: the visibility query failed.
    """
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit is from 1 to {MAX_PAGE_SIZE}")
    listing = temporal.list_workflows(
        paused_query(agent, task_queues=task_queues, waiting_before=waiting_before),
        page_size=limit,
        next_page_token=decode_cursor(cursor),
    )
    await listing.fetch_next_page()
    found = await _listed_page(temporal, listing.current_page or [])
    if approver is not None:
        found = for_approver(found, approver)
    return InboxPage(chats=oldest_first(found), next_cursor=encode_cursor(listing.next_page_token))


async def paused_chats(
    temporal: Client,
    *,
    agent: str | None = None,
    approver: str | None = None,
    task_queues: Sequence[str] | None = None,
    waiting_before: datetime | None = None,
) -> list[PausedChat]:
    """Every paused chat in ``temporal``'s namespace, oldest waiting first (see
    :meth:`client.AgentClient.pending`), read a page at a time.

    Raises:
        ValueError: ``agent`` or a task queue cannot be put in a visibility query.
        temporalio.service.RPCError: the visibility query failed.
    """
    found: list[PausedChat] = []
    cursor: str | None = None
    while True:
        page = await paused_page(
            temporal,
            agent=agent,
            approver=approver,
            task_queues=task_queues,
            waiting_before=waiting_before,
            cursor=cursor,
        )
        found += page.chats
        cursor = page.next_cursor
        if cursor is None:
            return oldest_first(found)


__all__ = [
    "MAX_PAGE_SIZE",
    "MAX_PENDING_MEMO",
    "PAGE_SIZE",
    "PAUSED_QUERY",
    "InboxPage",
    "PausedChat",
    "PausedInterrupt",
    "check_agent_name",
    "decode_cursor",
    "encode_cursor",
    "for_approver",
    "memo_interrupts",
    "memo_problem",
    "oldest_first",
    "paused_chat",
    "paused_chats",
    "paused_page",
    "paused_query",
    "read_entries",
    "unreadable_chat",
]

"""``AgentClient`` and ``Chat``: start conversations, send messages, answer interrupts.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts``.

Where to connect lives in ``client.connection`` and the error types in ``client.errors``; both are
re-exported here, so ``from client.api import ConnectionConfigError`` keeps working.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import (
    Client,
    RPCError,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import (
    QueryRejectCondition,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCStatusCode

from temporal_agent_interrupts.client.audit import AuditReport, ClosedRuns, audit_trail
from temporal_agent_interrupts.client.inbox import (
    PAGE_SIZE,
    InboxPage,
    PausedChat,
    PausedInterrupt,
    paused_chats,
    paused_page,
)
from temporal_agent_interrupts.client.stream import EventsGone, TurnStream, follow
from temporal_agent_interrupts.codec import PayloadKeys, data_converter
from temporal_agent_interrupts.connection import (
    CONNECT_TIMEOUT,
    DEFAULT_ADDRESS,
    DEFAULT_TASK_QUEUE,
    connect_answering,
    connect_config,
)
from temporal_agent_interrupts.errors import (
    OUTAGE_GRACE,
    QUERY_PUT_OFF,
    AgentError,
    CancelRejected,
    ChatNotFound,
    ConnectionConfigError,
    NoWorkerAnswered,
    ResumeRejected,
    SendRejected,
    ServerNotAnswering,
    UnknownAgent,
    closing,
    gave_up,
    no_worker,
    raise_update_error,
    rpc_error,
    server_unreachable,
    task_failing,
    turn_error,
    unprocessed,
    worker_missing,
)
from temporal_agent_interrupts.tracing import add_tracing, flush_tracing
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.config import AGENT_NAME, AGENT_STATUS
from temporal_agent_interrupts.workflows.interrupts import check_resume_fields
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    Refused,
    check_label,
    check_text,
    human_size,
)
from temporal_agent_interrupts.workflows.payloads import RawResume, raw_resume, raw_start
from temporal_agent_interrupts.workflows.requesters import check_shape
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    CancelInput,
    ConversationResult,
    Grant,
    GrantScope,
    GrantsResult,
    HistoryInput,
    HistoryResult,
    InterruptRequest,
    JsonObject,
    PolicyReviewResult,
    Rejection,
    ResumeInput,
    RevokeGrantInput,
    SendInput,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnEvent,
    TurnResult,
)

# How long a bounded query waits before asking again after the server answered "no worker"
# early: at once when no worker has polled the task queue lately, or after its own ~30 s limit.
# A worker that starts in the meantime answers the next attempt.
_QUERY_RETRY_INTERVAL = 1.0

# How often a query a worker put off (errors.QUERY_PUT_OFF) is asked again, _QUERY_RETRY_INTERVAL
# apart: it is answered once the run's workflow task has run, which can wait out a dead worker's
# sticky queue (5 s) and the task's own timeout (10 s).
_PUT_OFF_TRIES = 30

# How often an update the server refused while the run was closing (its continue-as-new task in
# flight) is sent again, _CLOSING_PAUSE seconds more apart each time: the next run is there
# once that task completes, in milliseconds.
_CLOSING_RETRIES = 5
_CLOSING_PAUSE = 0.05

# How often a send or an answer the server dropped unseen (errors.unprocessed: the task that
# carried it ended without the worker taking it, say a worker that evicted the run) is sent
# again, _UNPROCESSED_PAUSE seconds more apart each time (3 s in all): nothing was applied, and
# the run's next task, replayed from history, takes it.
_UNPROCESSED_RETRIES = 5
_UNPROCESSED_PAUSE = 0.2

# How far apart a send or an answer is made again while the server refuses it because the run's
# workflow task is failing (errors.task_failing): a task timed out on a dead worker is retried
# within seconds.
_TASK_FAILING_PAUSE = 1.0


WORKER_TIMEOUT = timedelta(seconds=60)
"""The default ``worker_timeout`` of every call that waits on a worker: how long a worker may
take to *accept* an update (send, resume, cancel, close) or to answer a query, never how long
the turn it starts may run (model and tool calls may take minutes). A live worker accepts in
milliseconds; 60 s rides out a worker restart or a deploy (the server hands a task to a new
poller within seconds) while a caller with no worker at all hears so within a minute instead
of hanging. Pass ``worker_timeout=None`` to wait for a worker indefinitely."""


class _Closed(Exception):
    """The conversation's workflow is no longer running (a query with NOT_OPEN said so)."""


def approve(
    interrupt: InterruptRequest | PausedInterrupt, *, remember: GrantScope | None = None
) -> ToolResponse | ToolRestart:
    """The approving answer for an interrupt, in the form its kind needs.

    An interrupt-only approval tool gets ``respond {"approved": true}``; a gated or conditional
    tool gets ``restart`` with ``{"tool_approved": true}`` so it runs with its original input.
    Same as ``interrupt.approve()``; an inbox entry (:class:`PausedInterrupt`) works alike.
    Either way the answer carries the digest of the input shown: it is refused if the call's
    input has changed since (an edit).

    Args:
        remember: Also grant (a call a gate paused only): later calls of the tool in this
            conversation that match the scope run without asking, each recorded with the grant,
            until its ``until`` or ``Chat.revoke_grant``. Applies at once to matching calls
            pending now. See docs/governance.md, "Remembered decisions".

    Raises:
        ValueError: ``remember`` for an interrupt-only tool.
    """
    return interrupt.approve(remember=remember)


def deny(interrupt: InterruptRequest | PausedInterrupt, reason: str = "") -> ToolResponse:
    """The denying answer: the tool does not run; the model is told it was declined.

    Same as ``interrupt.deny(reason)``.
    """
    return interrupt.deny(reason)


def respond(
    interrupt: InterruptRequest | PausedInterrupt, output: JsonObject | BaseModel
) -> ToolResponse:
    """The answer that supplies the tool's output: the tool does not run, the model gets
    ``output``, which must fit the tool's output schema (a model is dumped to JSON first).

    Same as ``interrupt.respond(output)``; an inbox entry works alike.
    """
    return interrupt.respond(output)


class AgentClient:
    """Entry point for callers: one per process, shared by every chat."""

    def __init__(self, temporal: Client, *, task_queue: str = DEFAULT_TASK_QUEUE) -> None:
        self._temporal = temporal
        self.task_queue = task_queue
        # Closed runs' histories never change: each audit reads only a chat's open run again.
        self._closed_runs = ClosedRuns()

    @classmethod
    async def connect(
        cls,
        target_host: str | None = None,
        *,
        namespace: str | None = None,
        task_queue: str | None = None,
        profile: str | None = None,
        config_file: str | None = None,
        connect_timeout: timedelta = CONNECT_TIMEOUT,
        payload_keys: PayloadKeys | str | None = None,
        **connect_kwargs: Any,
    ) -> AgentClient:
        """Connect to Temporal.

        Without arguments the connection comes from ``temporalio.envconfig``
        (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, TLS settings,
        profiles in ``temporal.toml``), the task queue from ``AGENT_TASK_QUEUE``.

        Args:
            target_host: ``host:port``, overriding the configured address.
            namespace: overrides the configured namespace.
            task_queue: the task queue new conversations start on.
            profile: the envconfig profile to load.
            config_file: the envconfig TOML file.
            connect_timeout: how long the server may take to answer before it counts as not
                answering (the SDK alone waits 30 s on a port that accepts and never answers).
            payload_keys: the payload encryption keys (``id:base64key,...`` or
                :class:`client.codec.PayloadKeys`); ``None`` reads ``AGENT_PAYLOAD_KEYS``. The
                codec is installed either way: without keys, payloads pass in the clear and
                an encrypted one fails naming its key id.
            **connect_kwargs: passed on to ``temporalio.client.Client.connect``.

        Raises:
            ConnectionConfigError: the settings are unusable (see :func:`connect_config`), or
                ``AGENT_PAYLOAD_KEYS`` is (``client.codec.PayloadKeysError``).
            ServerNotAnswering: something accepts connections at the address but did not
                answer within ``connect_timeout``.
            RuntimeError: the SDK's own connection errors (refused, TLS, not gRPC).
        """
        config = connect_config(
            target_host, namespace=namespace, profile=profile, config_file=config_file
        )
        config.update(connect_kwargs)
        # OTEL_EXPORTER_OTLP_ENDPOINT: trace this client's calls (see client/tracing.py).
        add_tracing(config, service_name="agent-client")
        # The pydantic converter with the payload codec (AGENT_PAYLOAD_KEYS): DESIGN's "Data
        # protection".
        config["data_converter"] = data_converter(payload_keys)
        temporal = await connect_answering(config, timeout=connect_timeout)
        return cls(
            temporal,
            task_queue=task_queue or os.environ.get("AGENT_TASK_QUEUE") or DEFAULT_TASK_QUEUE,
        )

    @property
    def temporal(self) -> Client:
        """The underlying temporalio client (pydantic data converter)."""
        return self._temporal

    async def chat(self, agent: str, *, chat_id: str | None = None) -> Chat:
        """A conversation with ``agent``: a new one, or the existing chat ``chat_id``.

        Nothing is sent yet; the first ``send`` creates the workflow if it does not exist.
        """
        return Chat(self, agent=agent, chat_id=chat_id or f"chat-{uuid.uuid4()}")

    async def pending(
        self,
        *,
        agent: str | None = None,
        approver: str | None = None,
        task_queues: Sequence[str] | Literal["any"] | None = None,
        waiting_over: timedelta | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> list[PausedChat]:
        """Every chat paused on a human, the longest waiting first.

        Read from Temporal's visibility store alone (search attributes and the memo each
        conversation keeps), so it needs no worker. Visibility is eventually consistent: a
        chat that paused or was answered a moment ago may not show so yet.

        Whoever holds the namespace's credentials can start workflows that say they are
        paused, with memos of megabytes: by default only this client's task queue is listed
        (whoever starts a chat there has it run by this deployment's workers, which rewrite
        its memo), a memo larger than the product writes is not read (the chat is listed
        ``unreadable``; see ``client.inbox.MAX_PENDING_MEMO``), and memos are parsed off the
        event loop.

        Args:
            agent: Only this agent's chats.
            approver: Only the interrupts this identity may answer and has not voted on yet
                (those anyone may answer, and those that list it); chats left with none are
                left out. A ``group:NAME`` approver is matched only by that same
                ``group:NAME``: groups come from identity tokens, which the inbox does not
                have.
            task_queues: The task queues listed (None: this client's own; ``"any"``: every
                queue, each chat with its ``task_queue``, for an operator who reads them as
                such).
            waiting_over: Only chats paused at least this long ago (by their
                ``InterruptedSince``). Pages come in visibility's order, newest started first,
                so with many paused this is how the longest waiting are found on the first
                page rather than the last.
            limit: At most this many chats, one page (see :meth:`pending_page`, which also
                says where the next starts); None reads every page.
            cursor: Where the page starts (a ``next_cursor`` :meth:`pending_page` gave).

        Raises:
            ValueError: ``agent`` or a task queue holds a quote or a backslash, ``limit`` is
                out of range, ``waiting_over`` is negative, or ``cursor`` is not one the inbox
                handed out.
            temporalio.service.RPCError: the visibility query failed.
        """
        if limit is not None or cursor is not None:
            page = await self.pending_page(
                agent=agent,
                approver=approver,
                task_queues=task_queues,
                waiting_over=waiting_over,
                limit=limit or PAGE_SIZE,
                cursor=cursor,
            )
            return page.chats
        return await paused_chats(
            self._temporal,
            agent=agent,
            approver=approver,
            task_queues=self._queues(task_queues),
            waiting_before=_waiting_before(waiting_over),
        )

    async def pending_page(
        self,
        *,
        agent: str | None = None,
        approver: str | None = None,
        task_queues: Sequence[str] | Literal["any"] | None = None,
        waiting_over: timedelta | None = None,
        limit: int = PAGE_SIZE,
        cursor: str | None = None,
    ) -> InboxPage:
        """One page of :meth:`pending`: at most ``limit`` chats (1 to
        ``client.inbox.MAX_PAGE_SIZE``), the longest waiting first within the page, pages in
        visibility's order (newest started first), and ``next_cursor`` for the next page.
        ``waiting_over`` keeps only chats paused at least that long ago, as for
        :meth:`pending` (pass the same with a cursor: the cutoff is taken anew each call).

        Raises:
            ValueError: ``agent`` or a task queue holds a quote or a backslash, ``limit`` is
                out of range, ``waiting_over`` is negative, or ``cursor`` is not one the inbox
                handed out.
            temporalio.service.RPCError: the visibility query failed.
        """
        return await paused_page(
            self._temporal,
            agent=agent,
            approver=approver,
            task_queues=self._queues(task_queues),
            waiting_before=_waiting_before(waiting_over),
            limit=limit,
            cursor=cursor,
        )

    def _queues(self, task_queues: Sequence[str] | Literal["any"] | None) -> Sequence[str] | None:
        if task_queues is None:
            return [self.task_queue]
        if task_queues == "any":
            return None
        return task_queues

    async def audit(self, chat_id: str) -> list[AnswerRecord]:
        """Every answer the conversation ``chat_id`` applied, once each, oldest first, with
        those its sub-agents applied (``agent_tool``: each such record has the sub-agent's
        ``chat_id``; an answer given through the caller is applied, and recorded, there).

        Read from the histories of all its runs (it continues as new as it grows, and its
        state keeps only the newest answers), so it needs no worker, and it holds what the
        state has long shed. Temporal keeps a closed run's history for the namespace's
        retention period: answers in runs older than that are gone, except those the next run
        carried in. Only the conversation's own runs count (see :meth:`audit_report`, which
        also names the runs left out).

        Reads history only: no worker is asked, so there is no ``worker_timeout``.

        Raises:
            ChatNotFound: no conversation ``chat_id``.
            AgentError: Temporal failed the request.
        """
        report = await self.audit_report(chat_id)
        return report.records

    async def audit_report(self, chat_id: str) -> AuditReport:
        """The audit trail (:meth:`audit`), and every run under ``chat_id`` left out of it.

        A run counts only when it is the conversation's own: an ``AgentWorkflow`` on this
        client's task queue, the chat's first run or one it continued as new into (see
        ``client/audit.py``). Anyone with the namespace's credentials can start another run
        under a closed chat's id, with any memo and input; such a run is listed in
        ``untrusted``, with why and how many records it claimed, and none of them is in
        ``records``. Reads history only: no worker is asked.

        Raises:
            ChatNotFound: no conversation ``chat_id``.
            AgentError: Temporal failed the request.
        """
        handle = self._temporal.get_workflow_handle(chat_id)
        try:
            desc = await handle.describe()
        except RPCError as e:
            raise rpc_error(e, chat_id) from e

        try:
            return await audit_trail(
                self._temporal,
                chat_id,
                task_queue=self.task_queue,
                latest_run=desc.run_id,
                closed_runs=self._closed_runs,
            )
        except RPCError as e:
            raise rpc_error(e, chat_id) from e


class Chat:
    """One conversation. Its id is the workflow id."""

    def __init__(self, client: AgentClient, *, agent: str, chat_id: str) -> None:
        self._client = client
        self.agent = agent
        self.id = chat_id

    @property
    def client(self) -> AgentClient:
        """The ``AgentClient`` this chat talks through."""
        return self._client

    @property
    def handle(self) -> WorkflowHandle[AgentWorkflow, ConversationResult]:
        """The conversation's workflow (its latest run)."""
        return self._client.temporal.get_workflow_handle_for(AgentWorkflow.run, self.id)

    async def send(
        self,
        text: str,
        *,
        message_id: str | None = None,
        identity: str | None = None,
        identity_token: str | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
    ) -> TurnResult:
        """Send a user message and wait for the turn to end or pause.

        Args:
            text: The user's message.
            identity: Who sends it: recorded as the turn's requester, on every call it raises,
                shown to approvers and in the audit record of their answers. Without ``trust``
                on the agent it is asserted (``verified=False``), and proves nothing.
            identity_token: For an agent that verifies identity (``trust``): a fresh JWT from
                its trusted issuer that proves who sends (``identity`` may be left out: the
                token names them). Spent once per conversation, as an answer's; a token for an
                agent without ``trust`` is refused. On a conversation's first message it is
                checked once the agent's definition arrives (with the first model call), and a
                refusal ends the turn ``failed`` with nothing run.
            message_id: Your id for this message, to send it again safely: a send that raised
                (a timeout, a server that went away) may still have got in, and the same
                message sent again with the same id joins the turn the first one started,
                returning its result, instead of starting a second turn. Refused with
                :class:`SendRejected` when the id was used for other text, or for a turn
                before the latest (the newest 64 ids are remembered). One line, 128 bytes
                at most.
            worker_timeout: How long a worker may take to accept the message (not to finish the
                turn, which may run long model and tool calls): :data:`WORKER_TIMEOUT` (60 s)
                unless given; ``None`` waits indefinitely.

        Raises:
            SendRejected: the chat is paused on interrupts, busy, closed, or another agent's;
                or ``message_id`` is malformed, or was used before as said above; or the agent's
                rules refuse ``identity`` or ``identity_token`` (``code`` ``forbidden``).
            UnknownAgent: the chat is new and the worker that took it hosts no agent of this
                name (``hosted`` names those it does, ``suggestion`` the closest); the
                conversation was closed, so nothing is left running. A chat that already had
                turns keeps going: its turn ends ``failed`` instead.
            NoWorkerAnswered: no worker accepted the message within ``worker_timeout``.
            AgentError: the server dropped the message unseen by any worker six times running
                (``UnprocessedUpdate``; each drop is sent again by itself, as nothing was
                applied). Nothing was applied: send it again.
        """
        return await self._send(
            text,
            stream=False,
            message_id=message_id,
            identity=identity,
            identity_token=identity_token,
            worker_timeout=worker_timeout,
        )

    def send_stream(
        self,
        text: str,
        *,
        message_id: str | None = None,
        identity: str | None = None,
        identity_token: str | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
    ) -> TurnStream:
        """Send a user message and follow the turn as it happens.

        Iterate the returned :class:`TurnStream` for the turn's events (the model's text as it
        arrives, tool requests, interrupts, answers, tool responses) until ``turn_end``;
        ``await turn.result()`` for the same result :meth:`send` returns. Nothing is sent
        until one of the two is used. Raises as :meth:`send` does, from either (an
        :class:`UnknownAgent` after the ``turn_end`` event it closed on). ``message_id`` is as
        for :meth:`send` (a repeat's stream follows the turn the first send started, from where
        that turn stands); ``identity`` and ``identity_token`` say who sends, as for
        :meth:`send`; ``worker_timeout`` is :data:`WORKER_TIMEOUT` (60 s) unless given, as for
        :meth:`send`.
        """
        return TurnStream(
            self,
            lambda accepted: self._send(
                text,
                stream=True,
                message_id=message_id,
                identity=identity,
                identity_token=identity_token,
                worker_timeout=worker_timeout,
                on_accept=accepted,
            ),
            worker_timeout=worker_timeout,
        )

    async def _send(
        self,
        text: str,
        *,
        stream: bool,
        message_id: str | None,
        worker_timeout: timedelta | None,
        identity: str | None = None,
        identity_token: str | None = None,
        on_accept: asyncio.Event | None = None,
    ) -> TurnResult:
        return await _made_again(
            lambda: self._send_once(
                text,
                stream=stream,
                message_id=message_id,
                worker_timeout=worker_timeout,
                identity=identity,
                identity_token=identity_token,
                on_accept=on_accept,
            ),
            chat_id=self.id,
            worker_timeout=worker_timeout,
        )

    async def _send_once(
        self,
        text: str,
        *,
        stream: bool,
        message_id: str | None,
        worker_timeout: timedelta | None,
        identity: str | None,
        identity_token: str | None,
        on_accept: asyncio.Event | None,
    ) -> TurnResult:
        # Checked here as well as in the workflow: the first send also starts the conversation,
        # and a message refused there would leave a new, empty conversation behind.
        if not text.strip():
            raise SendRejected("the message is empty")
        try:
            check_text(text, what="the message", limit=DOOR.send)
            if message_id is not None:
                if not message_id:
                    raise SendRejected("the message id is empty: give one, or none")
                check_label(message_id, what="the message id", limit=DOOR.message_id)
            check_shape(identity, identity_token)
        except Refused as e:
            raise SendRejected(e.reason) from None
        start = WithStartWorkflowOperation(
            AgentWorkflow.run,
            raw_start(
                ConversationInput(agent=self.agent),
                converter=self._client.temporal.data_converter.payload_converter,
            ),
            id=self.id,
            task_queue=self._client.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # A closed chat stays closed: its id is not reused for a new conversation.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # The send starts a turn at once, so the chat starts out "running"; setting it here
            # spares the workflow an upsert in its first task.
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(AGENT_NAME, self.agent),
                    SearchAttributePair(AGENT_STATUS, "running"),
                ]
            ),
            static_summary=f"{self.agent} conversation",
        )
        send_input = SendInput(
            text=text,
            agent=self.agent,
            stream=stream,
            message_id=message_id,
            identity=identity,
            identity_token=identity_token,
        )
        try:
            if worker_timeout is None and on_accept is None:
                return _checked(
                    await self._client.temporal.execute_update_with_start_workflow(
                        AgentWorkflow.send,
                        send_input,
                        start_workflow_operation=start,
                    ),
                    self.agent,
                )
            if on_accept is None:
                return _checked(
                    await _completed(
                        self._client.temporal,
                        lambda update_id: self._client.temporal.start_update_with_start_workflow(
                            AgentWorkflow.send,
                            send_input,
                            start_workflow_operation=start,
                            wait_for_stage=WorkflowUpdateStage.COMPLETED,
                            id=update_id,
                        ),
                        self.handle,
                        AgentWorkflow.send,
                        run_id=None,
                        worker_timeout=worker_timeout,
                    ),
                    self.agent,
                )
            deadline = asyncio.timeout(worker_timeout.total_seconds() if worker_timeout else None)
            try:
                async with deadline:
                    accepted = await self._client.temporal.start_update_with_start_workflow(
                        AgentWorkflow.send,
                        send_input,
                        start_workflow_operation=start,
                        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    )
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as e:
                raise gave_up(e, worker_timeout, expired=deadline.expired()) from None
            if not _rejected(accepted):
                on_accept.set()
            return _checked(await _outcome(accepted), self.agent)
        except WorkflowUpdateRPCTimeoutOrCancelledError as e:
            raise gave_up(e, None, expired=False) from None
        except WorkflowUpdateFailedError as e:
            _raise_failed(e)
        except WorkflowAlreadyStartedError:
            raise SendRejected(f"chat {self.id!r} is closed") from None
        except RPCError as e:
            if task_failing(e):
                raise  # sent again by _made_again, within worker_timeout
            raise rpc_error(e, self.id) from e
        finally:
            _retrieve_start_outcome(start)

    async def resume(
        self,
        *,
        answers: Sequence[ToolResponse | ToolRestart] = (),
        respond: Sequence[ToolResponse] = (),
        restart: Sequence[ToolRestart] = (),
        identity: str | None = None,
        identity_token: str | None = None,
        metadata: JsonObject | BaseModel | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
        run_id: str | None = None,
    ) -> TurnResult:
        """Answer pending interrupts; waits until the turn ends or pauses again.

        Args:
            answers: Answers of either kind, in any mix: what ``approve()``, ``deny()``,
                ``InterruptRequest.respond()`` and ``.restart()`` return. ``approve()`` gives a
                restart for a gated or conditional tool and a respond for an interrupt-only
                one, so a loop over ``res.interrupts`` can pass its answers here unsorted.
            respond: Outputs for interrupts (the tool does not run); added to ``answers``.
            restart: Re-runs with resume metadata; added to ``answers``.
            identity: Who answers, kept in the audit log (as the caller asserts it).
            identity_token: A JWT from the agent's trusted issuer, for an agent that verifies
                who answers (``Agent(trust=...)``); the identity on record is then the
                token's. Each answer needs a fresh token: one answers once per conversation.
            metadata: Kept with the answers in the audit log; the model never sees it.
            worker_timeout: How long a worker may take to accept the answer (not how long the
                rest of the turn takes): :data:`WORKER_TIMEOUT` (60 s) unless given; ``None`` waits
                indefinitely.
            run_id: Answer only this run of the conversation (one a ``describe`` was checked
                against): refused as :class:`ChatNotFound` when it is no longer running,
                rather than sent to whichever run holds the chat id by then.

        Raises:
            TypeError: an answer is not a ``ToolResponse`` or ``ToolRestart``, or a list holds
                the other kind (a restart in ``respond``).
            ResumeRejected: an entry does not match a pending interrupt, an output does not fit,
                the resume is empty, larger than 1 MiB or more than the turn can still hold,
                or it carries what a conversation cannot store (text that is not valid
                Unicode, nesting deeper than 64 levels, NaN). Nothing was applied. Not retried.
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the answer within ``worker_timeout``.
            AgentError: the server dropped the answer unseen by any worker six times running
                (``UnprocessedUpdate``; each drop is sent again by itself, as nothing was
                applied). Nothing was applied: send it again.
        """
        raw = self._resume_raw(
            answers, respond, restart, identity, metadata, stream=False, token=identity_token
        )
        return await self._update(
            AgentWorkflow.resume, raw, worker_timeout=worker_timeout, run_id=run_id
        )

    def resume_stream(
        self,
        *,
        answers: Sequence[ToolResponse | ToolRestart] = (),
        respond: Sequence[ToolResponse] = (),
        restart: Sequence[ToolRestart] = (),
        identity: str | None = None,
        identity_token: str | None = None,
        metadata: JsonObject | BaseModel | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
        run_id: str | None = None,
    ) -> TurnStream:
        """Answer pending interrupts and follow the rest of the turn as it happens.

        Takes what :meth:`resume` takes; what it refuses before sending (a malformed or
        oversized answer) is raised here, at once. Iterate the returned :class:`TurnStream`
        for the events from the answers on, until ``turn_end`` (the turn ends, or pauses
        again); ``await turn.result()`` for what :meth:`resume` returns. ``worker_timeout``
        bounds how long a worker may take to accept the answers: :data:`WORKER_TIMEOUT` (60 s)
        unless given; ``None`` waits indefinitely. ``run_id`` pins the answer to one run, as
        :meth:`resume`'s does (the events are followed across runs all the same).
        """
        raw = self._resume_raw(
            answers, respond, restart, identity, metadata, stream=True, token=identity_token
        )
        return TurnStream(
            self,
            lambda accepted: self._update(
                AgentWorkflow.resume,
                raw,
                worker_timeout=worker_timeout,
                on_accept=accepted,
                run_id=run_id,
            ),
            worker_timeout=worker_timeout,
        )

    def _resume_raw(
        self,
        answers: Sequence[ToolResponse | ToolRestart],
        respond: Sequence[ToolResponse],
        restart: Sequence[ToolRestart],
        identity: str | None,
        metadata: JsonObject | BaseModel | None,
        *,
        stream: bool,
        token: str | None = None,
    ) -> RawResume:
        if isinstance(metadata, BaseModel):
            metadata = metadata.model_dump(mode="json")
        responses, restarts = _sort_answers(answers, respond, restart)
        payload = ResumeInput(
            respond=responses,
            restart=restarts,
            identity=identity,
            identity_token=token,
            metadata=metadata,
            stream=stream,
        )
        # Checked here as well as in the workflow: an update over about 2 MB breaks the
        # workflow task before any validator sees it, and a bad one needs no round trip.
        try:
            check_resume_fields(payload)
            raw = raw_resume(
                payload, converter=self._client.temporal.data_converter.payload_converter
            )
        except Refused as e:
            raise ResumeRejected(e.reason) from None
        except PydanticSerializationError:
            raise ResumeRejected(
                "the resume holds text that is not valid Unicode (a lone UTF-16 surrogate)"
            ) from None
        size = len(raw.payload.data)
        if size > DOOR.resume:
            raise ResumeRejected(
                f"resume is {human_size(size)}; the limit is {human_size(DOOR.resume)}"
            )
        return raw

    def events(self, *, after: int | None = None) -> AsyncIterator[TurnEvent]:
        """The conversation's events after offset ``after`` (all it keeps when None), then
        live as they happen, until the caller stops iterating (or the chat closes and the rest
        is read).

        Pass the ``offset`` of the last event seen to pick up where a stream left off: across
        worker restarts and continue-as-new there is no gap and no duplicate.

        Raises:
            EventsGone: the conversation no longer keeps the events after ``after``.
        """
        if after is None:
            return follow(self, from_offset=0, strict=False)
        return follow(self, from_offset=after + 1)

    async def pending(
        self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT
    ) -> list[InterruptRequest]:
        """The interrupts the conversation is paused on now (``[]`` if none, or if it is
        closed: a conversation terminated while paused has nothing left to answer).

        Args:
            worker_timeout: How long a worker may take to answer the query: :data:`WORKER_TIMEOUT`
                (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker answered within ``worker_timeout``.
        """
        try:
            result = await self._query(
                AgentWorkflow.pending, worker_timeout=worker_timeout, open_only=True
            )
        except _Closed:
            return []
        return result.interrupts

    async def grants(self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT) -> list[Grant]:
        """The grants in force: remembered decisions that let matching calls of a tool run
        without asking (``approve(..., remember=...)``). ``[]`` once the chat is closed.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker answered within ``worker_timeout``.
        """
        try:
            result: GrantsResult = await self._query(
                AgentWorkflow.grants, worker_timeout=worker_timeout, open_only=True
            )
        except _Closed:
            return []
        return result.grants

    async def revoke_grant(
        self,
        grant_id: str,
        *,
        reason: str = "",
        identity: str | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
    ) -> list[Grant]:
        """End a grant now; returns the grants still in force. A call it let through that has
        not run yet pauses again (``stale``). Recorded in the audit trail with ``identity``
        (asserted: revoking only narrows what runs unasked).

        Raises:
            GrantRejected: no grant ``grant_id`` is in force (revoked or expired already), or
                the id, reason or identity is too long or malformed.
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the revoke within ``worker_timeout``.
        """
        result: GrantsResult = await self._update(
            AgentWorkflow.revoke_grant,
            RevokeGrantInput(id=grant_id, reason=reason, identity=identity),
            worker_timeout=worker_timeout,
        )
        return result.grants

    async def review_policy(
        self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT
    ) -> PolicyReviewResult:
        """Decide the calls paused on the agent's policy set again, with the set the worker
        holds now (after a deploy that changed it): those it now allows run, those it denies
        end refused (each recorded with both sets' hashes), asks show the new approvers.

        Raises:
            AgentError: the agent has no policy set, a review is under way, or the policy
                could not decide (``code`` says which).
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the review within ``worker_timeout``.
        """
        return await self._update(AgentWorkflow.review_policy, None, worker_timeout=worker_timeout)

    async def status(self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT) -> StatusResult:
        """Where the conversation stands: ``closed`` (nothing pending) once its workflow has
        ended, however it ended.

        Args:
            worker_timeout: How long a worker may take to answer the query: :data:`WORKER_TIMEOUT`
                (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker answered within ``worker_timeout``.
        """
        try:
            return await self._query(
                AgentWorkflow.status, worker_timeout=worker_timeout, open_only=True
            )
        except _Closed:
            pass
        # Terminated (or timed out), the workflow ran no code of its own to say it closed:
        # its state is as it was, paused perhaps, but nothing in it can be answered now.
        result: StatusResult = await self._query(
            AgentWorkflow.status, worker_timeout=worker_timeout
        )
        return result.model_copy(update={"status": "closed", "pending": []})

    async def history(self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT) -> HistoryResult:
        """The conversation's messages and its audit log of answers.

        The workflow answers in pages (one query result is limited to under 2 MiB); this
        reads them all.

        Args:
            worker_timeout: How long a worker may take to answer each page's query:
                :data:`WORKER_TIMEOUT` (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker answered within ``worker_timeout``.
        """
        result: HistoryResult = await self._query(
            AgentWorkflow.history, worker_timeout=worker_timeout
        )
        messages, start = list(result.messages), result.start
        for _ in range(5):
            while start > 0:
                older: HistoryResult = await self._query(
                    AgentWorkflow.history, HistoryInput(end=start), worker_timeout=worker_timeout
                )
                if older.dropped_messages != result.dropped_messages or older.start >= start:
                    break  # it continued as new between pages, dropping old turns: again
                messages = [*older.messages, *messages]
                start = older.start
            if start == 0:
                break
            result = await self._query(AgentWorkflow.history, worker_timeout=worker_timeout)
            messages, start = list(result.messages), result.start
        return result.model_copy(update={"messages": messages, "start": start})

    async def audit(self) -> list[AnswerRecord]:
        """Every answer this conversation applied, across all its runs, oldest first: see
        :meth:`AgentClient.audit`."""
        return await self._client.audit(self.id)

    async def rejections(
        self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT
    ) -> list[Rejection]:
        """Recently refused signals (the bounded log operators see in the UI).

        Args:
            worker_timeout: How long a worker may take to answer the query: :data:`WORKER_TIMEOUT`
                (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker answered within ``worker_timeout``.
        """
        result = await self._query(AgentWorkflow.rejections, worker_timeout=worker_timeout)
        return result.rejections

    async def last_turn(
        self, *, worker_timeout: timedelta | None = WORKER_TIMEOUT
    ) -> TurnResult | None:
        """The latest turn's result, waiting while a turn is still running.

        Args:
            worker_timeout: How long a worker may take to accept the request (not how long the
                turn then runs): :data:`WORKER_TIMEOUT` (60 s) unless given; ``None`` waits
                indefinitely.

        Raises:
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the request within ``worker_timeout``.
        """
        return await self._update(AgentWorkflow.await_turn, None, worker_timeout=worker_timeout)

    async def cancel(
        self,
        reason: str = "",
        *,
        identity: str | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
    ) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn): a ``cancelled`` turn.

        ``worker_timeout`` bounds how long a worker may take to accept the cancellation:
        :data:`WORKER_TIMEOUT` (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            CancelRejected: nothing to cancel, or the reason (1 KiB at most) or identity is
                too long or malformed.
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the cancellation within ``worker_timeout``.
        """
        _check_cancel(reason, identity)
        return await self._update(
            AgentWorkflow.cancel,
            CancelInput(reason=reason, identity=identity),
            worker_timeout=worker_timeout,
        )

    async def close(
        self,
        reason: str = "",
        *,
        identity: str | None = None,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
    ) -> ConversationResult:
        """End the conversation; anything pending is withdrawn first.

        ``worker_timeout`` bounds how long a worker may take to accept the request:
        :data:`WORKER_TIMEOUT` (60 s) unless given; ``None`` waits indefinitely.

        Raises:
            CancelRejected: a close is already under way, or the reason or identity is too
                long or malformed.
            SendRejected: the conversation is closed already.
            ChatNotFound: no conversation has this chat id.
            NoWorkerAnswered: no worker accepted the request within ``worker_timeout``.
        """
        _check_cancel(reason, identity)
        return await self._update(
            AgentWorkflow.close,
            CancelInput(reason=reason, identity=identity),
            worker_timeout=worker_timeout,
        )

    async def _update(
        self,
        update: Any,
        arg: Any,
        *,
        worker_timeout: timedelta | None,
        on_accept: asyncio.Event | None = None,
        run_id: str | None = None,
    ) -> Any:
        for attempt in range(_CLOSING_RETRIES + 1):
            try:
                return await _made_again(
                    lambda: self._update_once(
                        update,
                        arg,
                        worker_timeout=worker_timeout,
                        on_accept=on_accept,
                        run_id=run_id,
                    ),
                    chat_id=self.id,
                    worker_timeout=worker_timeout,
                )
            except RPCError as e:
                if not closing(e):
                    raise rpc_error(e, self.id) from e
                if run_id is not None:
                    # The run the answer was pinned to is ending (continued as new, most
                    # likely): to its caller that is a closed run, checked again and re-sent.
                    raise SendRejected(f"chat {self.id!r} is closed") from None
                if attempt == _CLOSING_RETRIES:
                    raise rpc_error(e, self.id) from e
                # The server refuses an update while the run's last task is completing (a
                # continue-as-new); nothing was applied, and the chat's next run takes it.
                await asyncio.sleep(_CLOSING_PAUSE * (attempt + 1))
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _update_once(
        self,
        update: Any,
        arg: Any,
        *,
        worker_timeout: timedelta | None,
        on_accept: asyncio.Event | None,
        run_id: str | None,
    ) -> Any:
        handle = self.handle
        if run_id is not None:
            handle = self._client.temporal.get_workflow_handle_for(
                AgentWorkflow.run, self.id, run_id=run_id
            )
        try:
            args = () if arg is None else (arg,)
            if worker_timeout is None and on_accept is None:
                return await handle.execute_update(update, *args)
            if on_accept is None:
                return await _completed(
                    self._client.temporal,
                    lambda update_id: handle.start_update(
                        update, *args, wait_for_stage=WorkflowUpdateStage.COMPLETED, id=update_id
                    ),
                    handle,
                    update,
                    run_id=run_id,
                    worker_timeout=worker_timeout,
                )
            # Only acceptance is bounded: once a worker has taken the update, the turn it
            # continues may legitimately run for minutes of model and tool calls.
            deadline = asyncio.timeout(worker_timeout.total_seconds() if worker_timeout else None)
            try:
                async with deadline:
                    accepted = await handle.start_update(
                        update, *args, wait_for_stage=WorkflowUpdateStage.ACCEPTED
                    )
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as e:
                # The SDK turns the cancellation into its own error, hence both.
                raise gave_up(e, worker_timeout, expired=deadline.expired()) from None
            if on_accept is not None and not _rejected(accepted):
                on_accept.set()
            return await _outcome(accepted)
        except WorkflowUpdateRPCTimeoutOrCancelledError as e:
            raise gave_up(e, None, expired=False) from None
        except WorkflowUpdateFailedError as e:
            _raise_failed(e)

    async def _query(
        self,
        query: Any,
        *args: Any,
        worker_timeout: timedelta | None = WORKER_TIMEOUT,
        open_only: bool = False,
        continued: int = 0,
        put_off: int = 0,
    ) -> Any:
        condition = QueryRejectCondition.NOT_OPEN if open_only else None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            if worker_timeout is None:
                return await self.handle.query(query, *args, reject_condition=condition)
            return await self._query_within(
                query, *args, condition=condition, worker_timeout=worker_timeout
            )
        except WorkflowQueryRejectedError as e:
            # A query waits behind the workflow task in flight; when that task continued the
            # conversation as new, the run it was sent to is closed but the chat is not: ask
            # the new run (each continue-as-new at a pause is one task, so a few tries do).
            if e.status == WorkflowExecutionStatus.CONTINUED_AS_NEW and continued < 5:
                return await self._query(
                    query,
                    *args,
                    worker_timeout=worker_timeout,
                    open_only=open_only,
                    continued=continued + 1,
                    put_off=put_off,
                )
            raise _Closed() from None
        except WorkflowQueryFailedError as e:
            # Asked again within the caller's worker_timeout too: put off, no worker answered.
            waited = (put_off + 1) * _QUERY_RETRY_INTERVAL
            within = worker_timeout is None or waited < worker_timeout.total_seconds()
            if QUERY_PUT_OFF in str(e) and put_off < _PUT_OFF_TRIES and within:
                await asyncio.sleep(_QUERY_RETRY_INTERVAL)
                return await self._query(
                    query,
                    *args,
                    worker_timeout=worker_timeout,
                    open_only=open_only,
                    continued=continued,
                    put_off=put_off + 1,
                )
            raise AgentError(f"query failed: {e}") from e
        except RPCError as e:
            if worker_timeout is None and worker_missing(e):
                waited = timedelta(seconds=loop.time() - started)
                raise no_worker(None, queued=False, server_waited=waited) from e
            raise rpc_error(e, self.id) from e

    async def _query_within(
        self,
        query: Any,
        *args: Any,
        condition: QueryRejectCondition | None,
        worker_timeout: timedelta,
    ) -> Any:
        """The query, asked again until a worker answers or ``worker_timeout`` runs out.

        The server gives up on a query by itself, when no worker has polled the task queue
        lately (at once) or after about 30 s (whatever ``rpc_timeout`` asks for): either is an
        attempt that failed, not the caller's deadline.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + worker_timeout.total_seconds()
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    left = timedelta(seconds=max(deadline - loop.time(), 0.001))
                    try:
                        return await self.handle.query(
                            query, *args, reject_condition=condition, rpc_timeout=left
                        )
                    except RPCError as e:
                        if not worker_missing(e):
                            raise
                    await asyncio.sleep(_QUERY_RETRY_INTERVAL)
        except TimeoutError:
            raise no_worker(worker_timeout, queued=False) from None


_R = TypeVar("_R")


async def _outcome(handle: WorkflowUpdateHandle[_R]) -> _R:
    """An accepted update's result, waited for through a server that went away meanwhile (a
    restart): the update is in the conversation's history, and its outcome is there to read
    once the server is back, for up to :data:`OUTAGE_GRACE` seconds of not reaching it."""
    loop = asyncio.get_running_loop()
    down_since: float | None = None
    while True:
        try:
            return await handle.result()
        except RPCError as e:
            if not server_unreachable(e):
                raise
            now = loop.time()
            down_since = now if down_since is None else down_since
            if now - down_since >= OUTAGE_GRACE:
                raise
            await asyncio.sleep(1.0)


async def _completed(
    client: Client,
    start: Callable[[str], Awaitable[WorkflowUpdateHandle[_R]]],
    handle: WorkflowHandle[Any, Any],
    update: Any,
    *,
    run_id: str | None,
    worker_timeout: timedelta | None,
) -> _R:
    """An update's result in one request when the turn it starts ends within
    ``worker_timeout``: sent to wait for its completion, not for its acceptance and then a poll
    for the outcome (one RPC a send or an answer instead of two; issue 51).

    Only acceptance is bounded: past ``worker_timeout`` the update's stage is read (the
    server answers at once). Accepted, the turn may legitimately run on for minutes of model
    and tool calls: its outcome is waited for. Not accepted, no worker took it: the caller
    hears so, as before.
    """
    update_id = str(uuid.uuid4())
    deadline = asyncio.timeout(worker_timeout.total_seconds() if worker_timeout else None)
    try:
        async with deadline:
            done = await start(update_id)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as e:
        if not deadline.expired() or not await _accepted(client, handle.id, run_id, update_id):
            raise gave_up(e, worker_timeout, expired=deadline.expired()) from None
        done = handle.get_update_handle_for(update, update_id, workflow_run_id=run_id)
    except RPCError as e:
        if not server_unreachable(e):
            raise
        # The server went away while the request waited for the turn (a restart), for longer
        # than the SDK retries a call. An update it had admitted is in the run's history: its
        # outcome is read once the server is back, waiting through the outage as _outcome
        # does (one it had not admitted is not found then, and raised as such).
        done = handle.get_update_handle_for(update, update_id, workflow_run_id=run_id)
    return await _outcome(done)


async def _accepted(client: Client, workflow_id: str, run_id: str | None, update_id: str) -> bool:
    """Whether a worker has accepted the update ``update_id`` (or completed it): its stage as
    the server knows it now (an update it never admitted is not found)."""
    request = PollWorkflowExecutionUpdateRequest(
        namespace=client.namespace,
        update_ref=UpdateRef(
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""),
            update_id=update_id,
        ),
        identity=client.identity,
        # The lowest stage: answered at once with the stage the update has reached.
        wait_policy=WaitPolicy(
            lifecycle_stage=UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
        ),
    )
    try:
        found = await client.workflow_service.poll_workflow_execution_update(
            request, retry=True, timeout=timedelta(seconds=10)
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    accepted = (
        UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED
    )
    return found.stage >= accepted


def _waiting_before(waiting_over: timedelta | None) -> datetime | None:
    """The latest pause time a chat waiting at least ``waiting_over`` has."""
    if waiting_over is None:
        return None
    if waiting_over < timedelta(0):
        raise ValueError("waiting_over cannot be negative")
    now = datetime.now(UTC)
    # Further back than a datetime goes: nothing paused that early, so the earliest there is.
    earliest = datetime.min.replace(tzinfo=UTC)
    return now - waiting_over if waiting_over < now - earliest else earliest


class _Unprocessed(Exception):
    """A send or an answer the server dropped unseen (:func:`errors.unprocessed`)."""


def _raise_failed(err: WorkflowUpdateFailedError) -> NoReturn:
    """An update's failure as the product's error; one dropped unseen as :class:`_Unprocessed`,
    for :func:`_made_again` to send again."""
    if unprocessed(err):
        raise _Unprocessed() from err
    raise_update_error(err)


async def _made_again(
    attempt: Callable[[], Awaitable[_R]], *, chat_id: str, worker_timeout: timedelta | None
) -> _R:
    """``attempt()``, made again while the server drops it unseen: such an update left no
    trace (no event, nothing applied), so a repeat cannot apply it twice, and a caller that
    heard of it would have to send it again anyway. Made again too while the server refuses it
    because the run's workflow task is failing (a task that timed out on a dead worker is
    retried; nothing was admitted), up to ``worker_timeout``, as a worker that has not taken
    it yet."""
    loop = asyncio.get_running_loop()
    until = None if worker_timeout is None else loop.time() + worker_timeout.total_seconds()
    drops = 0
    while True:
        try:
            return await attempt()
        except _Unprocessed:
            drops += 1
            if drops > _UNPROCESSED_RETRIES:
                break
            await asyncio.sleep(_UNPROCESSED_PAUSE * drops)
        except RPCError as e:
            if not task_failing(e):
                raise
            if until is not None and loop.time() + _TASK_FAILING_PAUSE > until:
                raise no_worker(worker_timeout, queued=False) from e
            await asyncio.sleep(_TASK_FAILING_PAUSE)
    raise AgentError(
        f"the server dropped the request to chat {chat_id!r} unseen by any worker "
        f"{_UNPROCESSED_RETRIES + 1} times (UnprocessedUpdate: a workflow task ended without "
        "its worker taking it); nothing was applied: send it again"
    )


def _rejected(handle: WorkflowUpdateHandle[Any]) -> bool:
    """Whether the workflow refused the update outright (its validator): the server then
    answers the start with the outcome, a failure, and the SDK keeps it on the handle, where
    ``result()`` reads it. No public member tells it from an accepted update before
    ``result()`` (which decodes the failure, through the payload codec) returns, and a stream
    must not announce a run that was refused (tests/test_web_app.py fails if this changes)."""
    outcome = getattr(handle, "_known_outcome", None)
    return outcome is not None and outcome.HasField("failure")


def _checked(result: TurnResult, agent: str) -> TurnResult:
    """``result``, unless the turn closed the conversation for an agent no worker hosts."""
    error = turn_error(result, agent)
    if error is not None:
        raise error
    return result


def _sort_answers(
    answers: Sequence[ToolResponse | ToolRestart],
    respond: Sequence[ToolResponse],
    restart: Sequence[ToolRestart],
) -> tuple[list[ToolResponse], list[ToolRestart]]:
    """Every answer in the list of its kind, or a ``TypeError`` that says what went where."""
    responses: list[ToolResponse] = []
    restarts: list[ToolRestart] = []
    for where, items in (("answers", answers), ("respond", respond), ("restart", restart)):
        if isinstance(items, ToolResponse | ToolRestart | str | dict):
            raise TypeError(f"{where}= takes a list of answers, not one {type(items).__name__}")
        for item in items:
            if isinstance(item, ToolResponse) and where != "restart":
                responses.append(item)
            elif isinstance(item, ToolRestart) and where != "respond":
                restarts.append(item)
            elif isinstance(item, ToolResponse | ToolRestart):
                raise TypeError(
                    f"{where}= got a {type(item).__name__} for {item.name} (ref {item.ref}); "
                    "approve() restarts gated and conditional tools, so pass answers of mixed "
                    "kinds as answers=[...]"
                )
            else:
                raise TypeError(
                    f"{where}= takes ToolResponse and ToolRestart (from approve(), deny(), "
                    f"InterruptRequest.respond() or .restart()), not {type(item).__name__}"
                )
    return responses, restarts


def _check_cancel(reason: str, identity: str | None) -> None:
    try:
        check_text(reason, what="reason", limit=DOOR.reason)
        if identity is not None:
            check_label(identity, what="identity", limit=DOOR.identity)
    except Refused as e:
        raise CancelRejected(e.reason) from None


def _retrieve_start_outcome(start: WithStartWorkflowOperation[Any, Any]) -> None:
    """Mark the start operation's outcome as seen.

    When update-with-start fails, the SDK leaves the start's future holding an exception nobody
    awaits. Its "exception was never retrieved" finalizer then runs wherever the garbage
    collector happens to interrupt; measured here, running inside a later import it corrupts
    CPython 3.11's AST recursion check ("SystemError: AST constructor recursion depth
    mismatch"). Retrieving it now keeps that out of callers' processes.
    """
    # Private: the operation's only public accessor, workflow_handle(), awaits the start; this
    # must look without waiting. Guarded by tests/test_library_guards.py.
    future = start._workflow_handle
    if future.done() and not future.cancelled():
        future.exception()


def run_script(main: Coroutine[Any, Any, object]) -> NoReturn:
    """``asyncio.run(main)`` for a script, then exit at once with its status.

    The Temporal SDK's native threads can abort the interpreter while it shuts down
    ("PyGILState_Release", exit code 134; sdk-python issue 300), after a script did everything
    right. Ending through here skips that teardown: the status is 0, ``main``'s int result,
    ``sys.exit``'s code, 130 on Ctrl-C, or 1 (with the traceback) on an exception.
    """
    code: int
    try:
        result = run_to_exit(main)
        code = result if isinstance(result, int) and not isinstance(result, bool) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001  # reported, then turned into the exit status
        traceback.print_exc()
        code = 1
    exit_now(code)


def run_to_exit(main: Coroutine[Any, Any, _R]) -> _R:
    """``asyncio.run(main)`` for a process that ends with :func:`exit_now`: the loop stays open.

    The SDK's native threads still hand RPC results back to the loop after ``main`` returned
    (a query given up at its deadline, a poll cut short). On a closed loop each hand-back raises
    in that thread, which prints a traceback to stderr while the process is ending, after a
    command's one-line answer. An open loop that no longer runs takes them silently, and
    ``os._exit`` frees it with the process.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        # As asyncio.run does: what main left running is cancelled and let finish its cleanup.
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)


def exit_now(code: int = 0) -> NoReturn:
    """Flush and end the process without interpreter teardown (see :func:`run_script`)."""
    flush_tracing()  # spans still batched; os._exit skips the exit hook that would send them
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_ADDRESS",
    "DEFAULT_TASK_QUEUE",
    "WORKER_TIMEOUT",
    "AgentClient",
    "AgentError",
    "CancelRejected",
    "Chat",
    "ChatNotFound",
    "ConnectionConfigError",
    "EventsGone",
    "NoWorkerAnswered",
    "PausedChat",
    "PausedInterrupt",
    "ResumeRejected",
    "SendRejected",
    "ServerNotAnswering",
    "TurnStream",
    "UnknownAgent",
    "approve",
    "connect_answering",
    "connect_config",
    "deny",
    "exit_now",
    "respond",
    "run_script",
    "run_to_exit",
]

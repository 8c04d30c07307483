"""``AgentClient`` and ``Chat``: start conversations, send messages, answer interrupts."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from temporalio.api.errordetails.v1 import NamespaceNotFoundFailure
from temporalio.client import (
    Client,
    RPCError,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import (
    QueryRejectCondition,
    RawValue,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCStatusCode

from workflows import AgentWorkflow
from workflows.config import AGENT_NAME, AGENT_STATUS
from workflows.interrupts import check_resume_fields
from workflows.limits import (
    MAX_IDENTITY_BYTES,
    MAX_REASON_BYTES,
    MAX_RESUME_BYTES,
    MAX_SEND_BYTES,
    Refused,
    check_label,
    check_text,
    human_size,
)
from workflows.types import (
    CancelInput,
    ConversationInput,
    ConversationResult,
    HistoryInput,
    HistoryResult,
    InterruptRequest,
    JsonObject,
    Rejection,
    ResumeInput,
    SendInput,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnResult,
)

DEFAULT_TASK_QUEUE = "agents"
DEFAULT_ADDRESS = "localhost:7233"

# How long connecting may take before the server counts as not answering. The SDK alone waits
# 30 s on a port that accepts and never speaks gRPC (a hung server, or another program there), and
# then reports it like a refused connection. A healthy server, even across an ocean, answers in
# about a second.
CONNECT_TIMEOUT = timedelta(seconds=10)


class AgentError(Exception):
    """Something the agent runtime refused or could not do; the message says why."""


class ResumeRejected(AgentError):
    """A resume did not match what is pending (or was malformed, or too large)."""


class SendRejected(AgentError):
    """A message was refused: the chat is paused, busy, closed, or belongs to another agent."""


class CancelRejected(AgentError):
    """A cancel or close was refused: nothing to cancel, one already under way, or a reason or
    identity that is too long or malformed."""


class ConnectionConfigError(AgentError):
    """The Temporal connection settings (profile file, ``TEMPORAL_*`` variables) are unusable.

    The message names the setting at fault and how to fix it.
    """


class ServerNotAnswering(AgentError):
    """Something accepts connections at the address but does not answer as Temporal in time.

    Attributes:
        address: The ``host:port`` connected to.
        waited: How long connecting was given.
    """

    def __init__(self, message: str, *, address: str, waited: timedelta) -> None:
        super().__init__(message)
        self.address = address
        self.waited = waited


class NoWorkerAnswered(AgentError):
    """No worker took the request within the ``worker_timeout`` the caller gave.

    Queries and updates are served by a worker, never by the Temporal server alone.

    Attributes:
        waited: The ``worker_timeout`` that ran out. When the caller gave none, how long the
            Temporal server waited before it gave up by itself (about 30 s for a query), or
            zero where that is not known.
        queued: True for an update (send, resume, cancel): it reached Temporal, which keeps it,
            and a worker that picks the conversation up later still applies it (measured on the
            dev server). False for a query: nothing was left behind.
    """

    def __init__(self, message: str, *, waited: timedelta, queued: bool) -> None:
        super().__init__(message)
        self.waited = waited
        self.queued = queued


# How long a bounded query waits before asking again after the server answered "no worker"
# early: at once when no worker has polled the task queue lately, or after its own ~30 s limit.
# A worker that starts in the meantime answers the next attempt.
_QUERY_RETRY_INTERVAL = 1.0


def _seconds(span: timedelta) -> str:
    return f"{round(span.total_seconds(), 1):g}s"


def _no_worker(
    waited: timedelta | None, *, queued: bool, server_waited: timedelta | None = None
) -> NoWorkerAnswered:
    """``waited``: the caller's ``worker_timeout``. None: the caller gave none and the Temporal
    server gave up first, after ``server_waited`` where that was measured."""
    what = "the request stays queued" if queued else "nothing was left behind"
    if waited:
        within = f"within {_seconds(waited)}"
    elif server_waited:
        within = f"before the Temporal server stopped waiting ({_seconds(server_waited)})"
    else:
        within = "before the Temporal server stopped waiting"
    return NoWorkerAnswered(
        f"no worker answered {within} ({what}): none is polling this task queue, all are busy, "
        "or the conversation's workflow task is failing (see its history)",
        waited=waited or server_waited or timedelta(0),
        queued=queued,
    )


def _worker_missing(err: RPCError) -> bool:
    """The server's own answers when no worker took a query: nothing polls the task queue
    ("no poller seen", at once or after its ~30 s limit), or nothing answered in time."""
    return (
        "no poller seen" in err.message
        or "Timeout expired" in err.message
        or err.status == RPCStatusCode.DEADLINE_EXCEEDED
    )


def _missing_namespace(err: RPCError) -> str | None:
    """The namespace the server says does not exist, read from the error's details (a
    workflow that is not found is NOT_FOUND too, and its message can name a namespace id)."""
    if err.status != RPCStatusCode.NOT_FOUND:
        return None
    for detail in err.grpc_status.details:
        failure = NamespaceNotFoundFailure()
        if detail.Unpack(failure):
            return failure.namespace
    return None


def _gave_up(err: BaseException, waited: timedelta | None, *, expired: bool) -> BaseException:
    """What to raise when an update stopped waiting: ours to explain, or the caller's own."""
    if not expired and isinstance(err.__cause__, asyncio.CancelledError):
        # The caller was cancelled (its own timeout, a task group, shutdown): the SDK wrapped
        # that in its update error, but it is the caller's cancellation, not a missing worker.
        return asyncio.CancelledError()
    return _no_worker(waited, queued=True)


_ERRORS: dict[str, type[AgentError]] = {
    "ResumeRejected": ResumeRejected,
    "SendRejected": SendRejected,
    "CancelRejected": CancelRejected,
}


class _Closed(Exception):
    """The conversation's workflow is no longer running (a query with NOT_OPEN said so)."""


def _raise_update_error(err: WorkflowUpdateFailedError) -> NoReturn:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        raise _ERRORS.get(cause.type or "", AgentError)(cause.message) from None
    raise AgentError(str(cause or err)) from err


def approve(interrupt: InterruptRequest) -> ToolResponse | ToolRestart:
    """The approving answer for an interrupt, in the form its kind needs.

    An interrupt-only approval tool gets ``respond {"approved": true}``; a gated or conditional
    tool gets ``restart`` with ``{"tool_approved": true}`` so it runs with its original input.
    """
    if interrupt.source == "interrupt":
        return interrupt.respond({"approved": True})
    return interrupt.restart({"tool_approved": True})


def deny(interrupt: InterruptRequest, reason: str = "") -> ToolResponse:
    """The denying answer: the tool does not run; the model is told it was declined."""
    if interrupt.source == "interrupt":
        return interrupt.respond({"approved": False, "feedback": reason})
    return interrupt.respond({"error": "denied by the user", "reason": reason or "no reason given"})


def connect_config(
    target_host: str | None = None,
    *,
    namespace: str | None = None,
    profile: str | None = None,
    config_file: str | None = None,
    default_address: str | None = DEFAULT_ADDRESS,
) -> dict[str, Any]:
    """Connection settings the Temporal way: a profile file and ``TEMPORAL_*`` variables.

    This is the one place every entry point (``python -m worker``, ``agentctl``,
    ``AgentClient.connect``) reads its connection from, so one set of variables serves them all:
    ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*`` and
    profiles (``TEMPORAL_CONFIG_FILE``, ``TEMPORAL_PROFILE``), all read by
    ``temporalio.envconfig``. Explicit arguments win; without any address the local default
    ``localhost:7233`` is used.

    Args:
        target_host: ``host:port``, overriding the configured address.
        namespace: overrides the configured namespace.
        profile: the profile to load (default: ``TEMPORAL_PROFILE``, else ``default``).
        config_file: the TOML file (default: ``TEMPORAL_CONFIG_FILE``, else
            ``~/.config/temporalio/temporal.toml`` when it exists).
        default_address: the address when nothing configures one. ``None`` leaves
            ``target_host`` out, so a caller can tell "configured" from "defaulted" (``python
            -m worker --dev-server`` starts a server only for the default).

    Returns:
        Keyword arguments for ``temporalio.client.Client.connect``.

    Raises:
        ConnectionConfigError: a named config file does not exist or does not parse, the
            profile is not in it, a certificate or key file it names cannot be read, or the
            address is not ``HOST:PORT`` (no port, a port out of range, a URL scheme).
    """
    # An empty variable means "not set" to whoever wrote `TEMPORAL_API_KEY=` in an env file, but
    # envconfig takes it literally: an empty API key (or TEMPORAL_TLS) turns TLS on, an empty
    # namespace is used as is. Drop empty values before envconfig sees them.
    environ = {k: v for k, v in os.environ.items() if v}
    named_file = config_file or environ.get("TEMPORAL_CONFIG_FILE")
    # envconfig treats a named file that is not there like no file at all: a typo, or a secret
    # that was not mounted into the container, would quietly connect to localhost instead.
    if named_file and not Path(named_file).is_file():
        raise ConnectionConfigError(
            f"the Temporal config file {named_file!r} (config_file or TEMPORAL_CONFIG_FILE) "
            "does not exist"
        )
    try:
        loaded = ClientConfig.load_client_connect_config(
            profile=profile, config_file=config_file, override_env_vars=environ
        )
    except OSError as e:
        # The TLS settings name files; envconfig reads them while loading.
        raise ConnectionConfigError(
            f"cannot read {e.filename!r} named by the Temporal TLS settings "
            f"(TEMPORAL_TLS_* or the profile's tls table): {e.strerror}"
        ) from None
    except RuntimeError as e:
        # envconfig's own ConfigError (a RuntimeError): unknown profile or malformed TOML.
        # Loading does no I/O besides reading files, so nothing else lands here.
        raise ConnectionConfigError(
            _explain_config_error(e, profile=profile, named_file=named_file, environ=environ)
        ) from None
    config: dict[str, Any] = dict(loaded)
    if target_host:
        config["target_host"] = target_host
    if namespace:
        config["namespace"] = namespace
    if "target_host" in config:
        if target_host:
            source = "--address or target_host"
        elif environ.get("TEMPORAL_ADDRESS"):
            source = "TEMPORAL_ADDRESS"
        else:
            wanted = profile or environ.get("TEMPORAL_PROFILE") or "default"
            source = f"the address of the Temporal profile {wanted!r}"
        _check_address(config["target_host"], source=source)
    if default_address is not None:
        config.setdefault("target_host", default_address)
    return config


def _check_address(address: str, *, source: str) -> None:
    """Refuse an address the SDK would misread rather than reject.

    Measured with temporalio 1.35: a host alone (``localhost``) connects to port 80, a word
    alone fails later as a DNS error that reads like an outage, and ``http://host:port`` works
    but prints a two-line deprecation warning. Each is a setting to fix, so it is told as one.
    """
    why: str | None = None
    if "://" in address:
        why = (
            "give HOST:PORT without a scheme, like localhost:7233 (TLS is a setting of its own: "
            "TEMPORAL_TLS, or TEMPORAL_API_KEY)"
        )
    else:
        host, colon, port = address.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        if not colon or not port:
            why = "no port; give HOST:PORT, like localhost:7233"
        elif not host:
            why = "no host; give HOST:PORT, like localhost:7233"
        elif not port.isdigit():
            why = f"the port {port!r} is not a number; give HOST:PORT, like localhost:7233"
        elif not 0 < int(port) < 65536:
            why = f"the port {port} is not between 1 and 65535"
        elif ":" in host and not bracketed:
            why = "an IPv6 host goes in brackets, like [::1]:7233"
        elif any(c.isspace() or c in "/@?#" for c in host):
            why = "the host is not a host name or an IP address; give HOST:PORT"
    if why is not None:
        raise ConnectionConfigError(f"bad Temporal address {address!r} ({source}): {why}")


def _explain_config_error(
    err: RuntimeError, *, profile: str | None, named_file: str | None, environ: dict[str, str]
) -> str:
    wanted = profile or environ.get("TEMPORAL_PROFILE") or "default"
    where = (
        repr(named_file)
        if named_file
        else "the default config file (~/.config/temporalio/temporal.toml; none is named by "
        "TEMPORAL_CONFIG_FILE)"
    )
    try:
        source = Path(named_file) if named_file else None
        known = sorted(ClientConfig.load(config_source=source, override_env_vars=environ).profiles)
    except RuntimeError:
        known = None  # the file itself does not parse: envconfig's message says where
    if known is not None and wanted not in known:
        has = f"profiles there: {', '.join(known)}" if known else "no profiles are defined there"
        return (
            f"the Temporal profile {wanted!r} (--profile or TEMPORAL_PROFILE) is not in "
            f"{where}; {has}"
        )
    return f"cannot load the Temporal connection settings from {where}: {err}"


async def connect_answering(
    config: Mapping[str, Any], *, timeout: timedelta = CONNECT_TIMEOUT
) -> Client:
    """``Client.connect(**config)``, giving up after ``timeout`` instead of the SDK's 30 s.

    Connecting already makes a real Temporal call (``GetSystemInfo``), so a client returned here
    talked to a Temporal server. ``python -m worker`` and ``make demo`` connect through this with
    what :func:`connect_config` returned; ``AgentClient.connect`` does too.

    Raises:
        ServerNotAnswering: no answer within ``timeout``; the message names the address and how
            to fix it.
        ConnectionConfigError: the SDK refused the address before connecting (it cannot parse
            it, e.g. ``[zz]:7233``): a setting to fix, like the ones ``connect_config`` refuses.
        RuntimeError: the SDK's own connection errors (refused, TLS, not gRPC).
    """
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            return await Client.connect(**config)
    except ValueError as e:
        raise ConnectionConfigError(
            f"bad Temporal address {config.get('target_host')!r}: {e}"
        ) from None
    except TimeoutError:
        address = str(config.get("target_host", "?"))
        raise ServerNotAnswering(
            f"the server at {address} is not answering as Temporal (no reply within "
            f"{timeout.total_seconds():g}s): stop whatever listens there, or point "
            "TEMPORAL_ADDRESS at a Temporal server",
            address=address,
            waited=timeout,
        ) from None


class AgentClient:
    """Entry point for callers: one per process, shared by every chat."""

    def __init__(self, temporal: Client, *, task_queue: str = DEFAULT_TASK_QUEUE) -> None:
        self._temporal = temporal
        self.task_queue = task_queue

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
            **connect_kwargs: passed on to ``temporalio.client.Client.connect``.

        Raises:
            ConnectionConfigError: the settings are unusable (see :func:`connect_config`).
            ServerNotAnswering: something accepts connections at the address but did not
                answer within ``connect_timeout``.
            RuntimeError: the SDK's own connection errors (refused, TLS, not gRPC).
        """
        config = connect_config(
            target_host, namespace=namespace, profile=profile, config_file=config_file
        )
        config.update(connect_kwargs)
        config["data_converter"] = pydantic_data_converter
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

    async def send(self, text: str, *, worker_timeout: timedelta | None = None) -> TurnResult:
        """Send a user message and wait for the turn to end or pause.

        Args:
            text: The user's message.
            worker_timeout: How long a worker may take to accept the message (not to finish the
                turn, which may run long model and tool calls). ``None`` waits indefinitely.

        Raises:
            SendRejected: the chat is paused on interrupts, busy, closed, or another agent's.
            NoWorkerAnswered: no worker accepted the message within ``worker_timeout``.
        """
        # Checked here as well as in the workflow: the first send also starts the conversation,
        # and a message refused there would leave a new, empty conversation behind.
        if not text.strip():
            raise SendRejected("the message is empty")
        try:
            check_text(text, what="the message", limit=MAX_SEND_BYTES)
        except Refused as e:
            raise SendRejected(e.reason) from None
        start = WithStartWorkflowOperation(
            AgentWorkflow.run,
            ConversationInput(agent=self.agent),
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
        try:
            if worker_timeout is None:
                return await self._client.temporal.execute_update_with_start_workflow(
                    AgentWorkflow.send,
                    SendInput(text=text, agent=self.agent),
                    start_workflow_operation=start,
                )
            deadline = asyncio.timeout(worker_timeout.total_seconds())
            try:
                async with deadline:
                    accepted = await self._client.temporal.start_update_with_start_workflow(
                        AgentWorkflow.send,
                        SendInput(text=text, agent=self.agent),
                        start_workflow_operation=start,
                        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    )
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as e:
                raise _gave_up(e, worker_timeout, expired=deadline.expired()) from None
            return await accepted.result()
        except WorkflowUpdateRPCTimeoutOrCancelledError as e:
            raise _gave_up(e, None, expired=False) from None
        except WorkflowUpdateFailedError as e:
            _raise_update_error(e)
        except WorkflowAlreadyStartedError:
            raise SendRejected(f"chat {self.id!r} is closed") from None
        except RPCError as e:
            raise _rpc_error(e, self.id) from e
        finally:
            _retrieve_start_outcome(start)

    async def resume(
        self,
        *,
        answers: Sequence[ToolResponse | ToolRestart] = (),
        respond: Sequence[ToolResponse] = (),
        restart: Sequence[ToolRestart] = (),
        identity: str | None = None,
        metadata: JsonObject | BaseModel | None = None,
        worker_timeout: timedelta | None = None,
    ) -> TurnResult:
        """Answer pending interrupts; waits until the turn ends or pauses again.

        Args:
            answers: Answers of either kind, in any mix: what ``approve()``, ``deny()``,
                ``InterruptRequest.respond()`` and ``.restart()`` return. ``approve()`` gives a
                restart for a gated or conditional tool and a respond for an interrupt-only
                one, so a loop over ``res.interrupts`` can pass its answers here unsorted.
            respond: Outputs for interrupts (the tool does not run); added to ``answers``.
            restart: Re-runs with resume metadata; added to ``answers``.
            identity: Who answers, kept in the audit log.
            metadata: Kept with the answers in the audit log; the model never sees it.
            worker_timeout: How long a worker may take to accept the answer (not how long the
                rest of the turn takes); ``None`` waits indefinitely.

        Raises:
            TypeError: an answer is not a ``ToolResponse`` or ``ToolRestart``, or a list holds
                the other kind (a restart in ``respond``).
            ResumeRejected: an entry does not match a pending interrupt, an output does not fit,
                the resume is empty, larger than 1 MiB or more than the turn can still hold,
                or it carries what a conversation cannot store (text that is not valid
                Unicode, nesting deeper than 64 levels, NaN). Nothing was applied. Not retried.
            NoWorkerAnswered: no worker accepted the answer within ``worker_timeout``.
        """
        if isinstance(metadata, BaseModel):
            metadata = metadata.model_dump(mode="json")
        responses, restarts = _sort_answers(answers, respond, restart)
        payload = ResumeInput(
            respond=responses, restart=restarts, identity=identity, metadata=metadata
        )
        # Checked here as well as in the workflow: an update over about 2 MB breaks the
        # workflow task before any validator sees it, and a bad one needs no round trip.
        try:
            check_resume_fields(payload)
            raw = self._client.temporal.data_converter.payload_converter.to_payload(payload)
        except Refused as e:
            raise ResumeRejected(e.reason) from None
        except PydanticSerializationError:
            raise ResumeRejected(
                "the resume holds text that is not valid Unicode (a lone UTF-16 surrogate)"
            ) from None
        if len(raw.data) > MAX_RESUME_BYTES:
            raise ResumeRejected(
                f"resume is {human_size(len(raw.data))}; the limit is "
                f"{human_size(MAX_RESUME_BYTES)}"
            )
        return await self._update(
            AgentWorkflow.resume, RawValue(raw), worker_timeout=worker_timeout
        )

    async def pending(self, *, worker_timeout: timedelta | None = None) -> list[InterruptRequest]:
        """The interrupts the conversation is paused on now (``[]`` if none, or if it is
        closed: a conversation terminated while paused has nothing left to answer)."""
        try:
            result = await self._query(
                AgentWorkflow.pending, worker_timeout=worker_timeout, open_only=True
            )
        except _Closed:
            return []
        return result.interrupts

    async def status(self, *, worker_timeout: timedelta | None = None) -> StatusResult:
        """Where the conversation stands: ``closed`` (nothing pending) once its workflow has
        ended, however it ended."""
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

    async def history(self, *, worker_timeout: timedelta | None = None) -> HistoryResult:
        """The conversation's messages and its audit log of answers.

        The workflow answers in pages (one query result is limited to under 2 MiB); this
        reads them all.
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

    async def rejections(self, *, worker_timeout: timedelta | None = None) -> list[Rejection]:
        """Recently refused signals (the bounded log operators see in the UI)."""
        result = await self._query(AgentWorkflow.rejections, worker_timeout=worker_timeout)
        return result.rejections

    async def last_turn(self, *, worker_timeout: timedelta | None = None) -> TurnResult | None:
        """The latest turn's result, waiting while a turn is still running.

        ``worker_timeout`` bounds how long a worker may take to accept the request.
        """
        return await self._update(AgentWorkflow.await_turn, None, worker_timeout=worker_timeout)

    async def cancel(
        self,
        reason: str = "",
        *,
        identity: str | None = None,
        worker_timeout: timedelta | None = None,
    ) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn): a ``cancelled`` turn.

        ``worker_timeout`` bounds how long a worker may take to accept the cancellation.

        Raises:
            CancelRejected: nothing to cancel, or the reason (1 KiB at most) or identity is
                too long or malformed.
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
        worker_timeout: timedelta | None = None,
    ) -> ConversationResult:
        """End the conversation; anything pending is withdrawn first.

        ``worker_timeout`` bounds how long a worker may take to accept the request.
        """
        _check_cancel(reason, identity)
        return await self._update(
            AgentWorkflow.close,
            CancelInput(reason=reason, identity=identity),
            worker_timeout=worker_timeout,
        )

    async def _update(self, update: Any, arg: Any, *, worker_timeout: timedelta | None) -> Any:
        try:
            args = () if arg is None else (arg,)
            if worker_timeout is None:
                return await self.handle.execute_update(update, *args)
            # Only acceptance is bounded: once a worker has taken the update, the turn it
            # continues may legitimately run for minutes of model and tool calls.
            deadline = asyncio.timeout(worker_timeout.total_seconds())
            try:
                async with deadline:
                    accepted = await self.handle.start_update(
                        update, *args, wait_for_stage=WorkflowUpdateStage.ACCEPTED
                    )
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as e:
                # The SDK turns the cancellation into its own error, hence both.
                raise _gave_up(e, worker_timeout, expired=deadline.expired()) from None
            return await accepted.result()
        except WorkflowUpdateRPCTimeoutOrCancelledError as e:
            raise _gave_up(e, None, expired=False) from None
        except WorkflowUpdateFailedError as e:
            _raise_update_error(e)
        except RPCError as e:
            raise _rpc_error(e, self.id) from e

    async def _query(
        self,
        query: Any,
        *args: Any,
        worker_timeout: timedelta | None = None,
        open_only: bool = False,
        continued: int = 0,
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
                )
            raise _Closed() from None
        except WorkflowQueryFailedError as e:
            raise AgentError(f"query failed: {e}") from e
        except RPCError as e:
            if worker_timeout is None and _worker_missing(e):
                waited = timedelta(seconds=loop.time() - started)
                raise _no_worker(None, queued=False, server_waited=waited) from e
            raise _rpc_error(e, self.id) from e

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
                        if not _worker_missing(e):
                            raise
                    await asyncio.sleep(_QUERY_RETRY_INTERVAL)
        except TimeoutError:
            raise _no_worker(worker_timeout, queued=False) from None


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
        check_text(reason, what="reason", limit=MAX_REASON_BYTES)
        if identity is not None:
            check_label(identity, what="identity", limit=MAX_IDENTITY_BYTES)
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
    future = start._workflow_handle  # no public non-blocking accessor
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
        result = asyncio.run(main)
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


def exit_now(code: int = 0) -> NoReturn:
    """Flush and end the process without interpreter teardown (see :func:`run_script`)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rpc_error(err: RPCError, chat_id: str) -> AgentError:
    # The server reports an update to a finished workflow as NOT_FOUND too, so the message
    # decides first: a closed chat is not a missing one.
    if "already completed" in err.message:
        return SendRejected(f"chat {chat_id!r} is closed")
    namespace = _missing_namespace(err)
    if namespace is not None:
        # A setting at fault, not the chat: every chat id would fail the same way.
        return ConnectionConfigError(
            f"the Temporal namespace {namespace!r} (namespace or TEMPORAL_NAMESPACE) does not "
            "exist on this server"
        )
    if err.status == RPCStatusCode.NOT_FOUND:
        return AgentError(f"no conversation with id {chat_id!r}")
    if _worker_missing(err):
        return _no_worker(None, queued=False)
    return AgentError(f"Temporal error: {err.message}")


__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_ADDRESS",
    "DEFAULT_TASK_QUEUE",
    "AgentClient",
    "AgentError",
    "CancelRejected",
    "Chat",
    "ConnectionConfigError",
    "NoWorkerAnswered",
    "ResumeRejected",
    "SendRejected",
    "ServerNotAnswering",
    "approve",
    "connect_answering",
    "connect_config",
    "deny",
    "exit_now",
    "run_script",
]

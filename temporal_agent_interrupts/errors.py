"""The error types, and how Temporal's failures become them.

Public: ``temporal_agent_interrupts.errors`` is where every error type is imported from, and
every name in its ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.errors import ChatNotFound, ResumeRejected

Every error a caller of ``AgentClient`` and ``Chat`` sees is an ``AgentError`` (also at the
package root); its message says what happened and what to do. ``EventsGone`` (``client.stream``)
and the payload key errors (``codec``) live beside what raises them and are re-exported here,
read on first use: those modules import this one. The helpers below (internal: not in
``__all__``, not covered by the promise) sort the SDK's errors (an update's
``ApplicationError``, an ``RPCError``, an update that stopped waiting) into those types, so that
``client.api`` and ``agentctl`` word each failure the same way.
"""

from __future__ import annotations

import asyncio
import difflib
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from temporalio.api.errordetails.v1 import NamespaceNotFoundFailure
from temporalio.client import RPCError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCStatusCode

from temporal_agent_interrupts._lazy import exports
from temporal_agent_interrupts.workflows.payloads import refusal_code
from temporal_agent_interrupts.workflows.types import ErrorKind, TurnResult

if TYPE_CHECKING:
    from temporal_agent_interrupts.client.stream import EventsGone
    from temporal_agent_interrupts.codec import PayloadKeyMissing, PayloadKeysError

# What a worker answers a query it put off (worker.sandbox.QueryTimeGuard): the query came
# before the workflow task that brings the conversation's newest events; asked again, it is
# answered once that task has run. The client asks again by itself (client.api).
QUERY_PUT_OFF = (
    "query put off: the conversation has events its workflow task has not brought to this "
    "worker yet; ask again"
)


class AgentError(Exception):
    """Something the agent runtime refused or could not do; the message says why.

    Attributes:
        code: For a refusal the conversation made, what kind it is: ``invalid`` (the request
            is wrong), ``forbidden`` (this sender may not), ``conflict`` (not now: already
            answered, edited since shown, busy) or ``not_found`` (an unknown ref); ``None``
            where the conversation did not say. The HTTP app maps it to 422, 403, 409, 404.
    """

    code: str | None = None


class ResumeRejected(AgentError):
    """A resume did not match what is pending (or was malformed, or too large)."""


class SendRejected(AgentError):
    """A message was refused: the chat is paused, busy, closed, or belongs to another agent."""


class CancelRejected(AgentError):
    """A cancel or close was refused: nothing to cancel, one already under way, or a reason or
    identity that is too long or malformed."""


class GrantRejected(AgentError):
    """A revoke was refused: no grant with that id is in force (it was revoked or expired
    already, or never made), or the id, reason or identity is too long or malformed."""


class ChatNotFound(AgentError):
    """No conversation has this chat id: it was never started, or Temporal no longer keeps it
    (its retention after closing has passed).

    Attributes:
        chat_id: The id that names nothing.
    """

    def __init__(self, message: str, *, chat_id: str) -> None:
        super().__init__(message)
        self.chat_id = chat_id


class UnknownAgent(AgentError):
    """No worker on the task queue hosts an agent of this name (a misspelling, or a worker of
    another release); nothing was started, or the conversation that was started is closed.

    Attributes:
        agent: The name asked for.
        hosted: The names the answering worker hosts.
        suggestion: The hosted name closest to ``agent``, if one is close ("did you mean").
    """

    def __init__(
        self, message: str, *, agent: str, hosted: list[str], suggestion: str | None
    ) -> None:
        super().__init__(message)
        self.agent = agent
        self.hosted = hosted
        self.suggestion = suggestion


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


def _seconds(span: timedelta) -> str:
    return f"{round(span.total_seconds(), 1):g}s"


def no_worker(
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


def worker_missing(err: RPCError) -> bool:
    """The server's own answers when no worker took a query: nothing polls the task queue
    ("no poller seen", at once or after its ~30 s limit), or nothing answered in time."""
    return (
        "no poller seen" in err.message
        or "Timeout expired" in err.message
        or err.status == RPCStatusCode.DEADLINE_EXCEEDED
    )


OUTAGE_GRACE = 60.0
"""How long, in seconds, a client keeps waiting through a server it cannot reach (a restart)
for what it already started: an accepted update's outcome, a stream it follows."""


def server_unreachable(err: RPCError) -> bool:
    """The server is not there (down, restarting, the connection cut), as opposed to a server
    that answered with a refusal."""
    if err.status == RPCStatusCode.UNAVAILABLE:
        return True
    # What a connection cut mid-call looks like from the SDK's core (seen when the dev server
    # is killed: UNKNOWN "transport error", CANCELLED "h2 protocol error").
    return err.status in (RPCStatusCode.UNKNOWN, RPCStatusCode.CANCELLED) and any(
        sign in err.message for sign in ("transport error", "h2 protocol error", "connect error")
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


def gave_up(err: BaseException, waited: timedelta | None, *, expired: bool) -> BaseException:
    """What to raise when an update stopped waiting: ours to explain, or the caller's own."""
    if not expired and isinstance(err.__cause__, asyncio.CancelledError):
        # The caller was cancelled (its own timeout, a task group, shutdown): the SDK wrapped
        # that in its update error, but it is the caller's cancellation, not a missing worker.
        return asyncio.CancelledError()
    return no_worker(waited, queued=True)


_ERRORS: dict[str, type[AgentError]] = {
    ErrorKind.RESUME_REJECTED: ResumeRejected,
    ErrorKind.SEND_REJECTED: SendRejected,
    ErrorKind.CANCEL_REJECTED: CancelRejected,
    ErrorKind.GRANT_REJECTED: GrantRejected,
}


UNPROCESSED_UPDATE = "UnprocessedUpdate"
"""The failure type of an update the server dropped unseen: the workflow task that carried it
to a worker completed without the worker accepting or refusing it (a worker that evicted the
run, or put off the task). Nothing was applied and history holds no trace of it."""


def unprocessed(err: WorkflowUpdateFailedError) -> bool:
    """Whether the server dropped the update without a worker seeing it (``UnprocessedUpdate``):
    nothing was applied, so sending it again is safe."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == UNPROCESSED_UPDATE


def raise_update_error(err: WorkflowUpdateFailedError) -> NoReturn:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        error = _ERRORS.get(cause.type or "", AgentError)(cause.message)
        error.code = refusal_code(cause)
        raise error from None
    raise AgentError(str(cause or err)) from err


def task_failing(err: RPCError) -> bool:
    """Whether the server refused an update because the run's workflow task is failing (its
    last attempt failed or timed out, and a retry is due): nothing was admitted, and a retry
    that succeeds (a task timed out on a dead worker, taken by a live one) takes it."""
    return (
        err.status == RPCStatusCode.FAILED_PRECONDITION
        and "Workflow Task in failed state" in err.message
    )


def closing(err: RPCError) -> bool:
    """Whether the server refused an update because the run is completing (its last workflow
    task, a continue-as-new most often, is in flight): nothing was applied, and the chat's next
    run, if any, can take it."""
    return "workflow is closing" in err.message


def rpc_error(err: RPCError, chat_id: str) -> AgentError:
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
        return ChatNotFound(f"no conversation with id {chat_id!r}", chat_id=chat_id)
    if err.status == RPCStatusCode.RESOURCE_EXHAUSTED and "in-flight updates" in err.message:
        # Temporal holds at most 10 updates in flight a run; whoever can send updates can fill
        # them (docs/security.md). Signals are not counted: the resume signal still lands.
        busy = AgentError(
            f"chat {chat_id!r} has as many requests in flight as Temporal allows (10 updates); "
            "nothing was applied. Try again shortly, or answer by the resume signal, which "
            "this limit does not hold back"
        )
        busy.code = "conflict"
        return busy
    if worker_missing(err):
        return no_worker(None, queued=False)
    return AgentError(f"Temporal error: {err.message}")


def unknown_agent(agent: str, hosted: list[str]) -> UnknownAgent:
    """The error for a conversation whose agent the answering worker does not host, with the
    hosted names (structured data from the worker, never read from a message) and the closest
    of them when one is close enough to be a misspelling."""
    close = difflib.get_close_matches(agent, hosted, n=1, cutoff=0.6)
    suggestion = close[0] if close else None
    names = ", ".join(repr(n) for n in hosted) if hosted else "none"
    hint = f"; did you mean {suggestion!r}?" if suggestion else ""
    return UnknownAgent(
        f"no worker on this task queue hosts an agent named {agent!r} (the worker that answered "
        f"hosts {names}){hint} The conversation was closed.",
        agent=agent,
        hosted=hosted,
        suggestion=suggestion,
    )


def turn_error(result: TurnResult, agent: str) -> AgentError | None:
    """What a caller raises for a turn that ended the conversation instead of answering it (a
    first turn for an agent no worker hosts); None for every other result, failed or not."""
    error = result.error
    if result.closed and error is not None and error.kind == ErrorKind.UNKNOWN_AGENT:
        return unknown_agent(agent, list(error.hosted or []))
    return None


# Raised by modules that import this one, so read on first use (see the module docstring).
_HOME = {
    "EventsGone": "client.stream",
    "PayloadKeysError": "codec",
    "PayloadKeyMissing": "codec",
}

# The error types only: the helpers above are the client's own.
__all__ = [
    "AgentError",
    "CancelRejected",
    "ChatNotFound",
    "ConnectionConfigError",
    "EventsGone",
    "GrantRejected",
    "NoWorkerAnswered",
    "PayloadKeyMissing",
    "PayloadKeysError",
    "ResumeRejected",
    "SendRejected",
    "ServerNotAnswering",
    "UnknownAgent",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

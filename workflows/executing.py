"""Activities the turn schedules, and what it takes of what comes back.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`ActivityRunner` schedules a turn's activities (the model call, tool and MCP calls, the
sub-agent reads and answers) under ids of its own, and takes a result or a failure only with
a worker's seal for that very activity (:mod:`workflows.seal`): anyone holding namespace
credentials may complete or fail an activity by id. What it refuses is recorded as a rejection
and raised as :class:`Unsealed`, for the caller to decide what a refusal means for its call.
The functions after the class read the failures the turn takes: which are classified, which
never ran (an input no worker could decrypt), and what the caller is told.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ServerError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from temporal_agent_interrupts.workflows import audit, config
from temporal_agent_interrupts.workflows.activity_io import (
    ActivityEndingInput,
    ActivityEndingResult,
)
from temporal_agent_interrupts.workflows.limits import DOOR, KiB, cut_stored, names_within
from temporal_agent_interrupts.workflows.seal import (
    Binding,
    failure_body,
    result_body,
    split_details,
    workflow_keys,
)
from temporal_agent_interrupts.workflows.seal import (
    activity_id as sealed_activity_id,
)
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
)
from temporal_agent_interrupts.workflows.types import (
    ErrorInfo,
    ErrorKind,
    Status,
)


class TurnFailed(Exception):
    """The turn fails with ``error`` (raised through the turn's steps to the machine)."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class Unsealed(Exception):
    """An activity's result or failure that no worker sealed (``workflows.seal``): not taken.
    Recorded as a rejection where it is raised."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ActivityRunner:
    """Schedules the turn's activities and takes only what a worker sealed.

    Args:
        state: The conversation's state (refusals are recorded in its rejections).
        cancelling: Whether a cancellation of the turn has been asked for (a cancellation
            failure is the turn's own then, not one sent by id).
    """

    def __init__(self, state: ConversationState, *, cancelling: Callable[[], bool]) -> None:
        self.s = state
        self._cancelling = cancelling
        # Activities this run scheduled through execute, for their ids (workflows.seal).
        self._activities = 0

    async def execute(self, activity: str, arg: object, **options: Any) -> Any:
        """``workflow.execute_activity``, scheduled again while the workers that take it cannot
        decrypt its input (they lack the payload key this conversation is written with).

        Such an attempt never reached the model or the tool: the worker failed it while
        decoding, so it is no failure of theirs. It is taken as that only with the worker's
        seal (``activities.sealing.Sealer.take``): anyone may fail an activity by id with the
        same text, of a tool that has run. (Only the last attempt is known to be that: a
        tool allowed several attempts may have run in earlier ones on a worker with the key,
        and runs again here, as any retry would.) An approved tool keeps its one run, and the
        paused turn goes on once a worker with the key takes the call (``agent-worker``
        without it stops, naming the key). Each new attempt waits twice as long as the last,
        within ``config.UNDECRYPTABLE_RETRY_*``; the failed attempts stay in history, each
        naming the missing key id. After ``config.UNDECRYPTABLE_GIVE_UP`` from the first such
        failure the call fails (:func:`_activity_error` says its input could not be decrypted).
        """
        delay = config.UNDECRYPTABLE_RETRY_FIRST
        since = None
        what = options.get("summary") or activity
        # The result is read here, not by the SDK: a completion by id carries anyone's bytes,
        # and one the SDK could not convert would fail the workflow task on every replay (a
        # stuck chat). One that does not read as the result type is refused as unsealed.
        result_type: type[Any] = options.pop("result_type")
        # Whether a timeout is checked against history (activity_ending); not for that check's
        # own activity, whose timeouts are refused instead (no check of a check).
        verify: bool = options.pop("verify_timeouts", True)
        while True:
            # Our own id, so the seal binds the result to this activity (workflows.seal).
            self._activities += 1
            activity_id = sealed_activity_id(activity, self._activities)
            scheduled = workflow.now()
            try:
                raw: RawValue = await workflow.execute_activity(
                    activity, arg, activity_id=activity_id, result_type=RawValue, **options
                )
            except ActivityError as e:
                # Sealed first: "never ran" from anyone but a worker would run a tool again.
                self._check_failure(e, activity=activity, activity_id=activity_id, what=what)
                await self._check_server_kind(
                    e,
                    activity=activity,
                    activity_id=activity_id if verify else None,
                    since=scheduled,
                    options=options,
                    what=what,
                )
                key_id = undecryptable(e)
                if key_id is None:
                    raise
                now = workflow.now()
                since = since or now
                if now - since >= config.UNDECRYPTABLE_GIVE_UP:
                    raise
                # Fixed text and the key id only: the cause's message is not the workflow's.
                workflow.logger.error(
                    "%s did not run: the worker that took it could not decrypt its input (key "
                    "id %s); scheduled again in %s",
                    options.get("summary") or activity,
                    key_id,
                    delay,
                )
                await workflow.sleep(delay, summary="waiting for a worker with the payload key")
                delay = min(delay * 2, config.UNDECRYPTABLE_RETRY_MAX)
                continue
            result = self._read_result(raw, result_type, activity=activity, what=what)
            self._check_result(result, activity=activity, activity_id=activity_id, what=what)
            return result

    def _read_result(
        self, raw: RawValue, result_type: type[Any], *, activity: str, what: str
    ) -> Any:
        """The activity's result as ``result_type``, with its canonical bytes readable.

        Raises:
            Unsealed: it does not convert (anyone's bytes, completed by id); recorded.
        """
        try:
            result = workflow.payload_converter().from_payload(raw.payload, result_type)
            result_body(result)  # a lone surrogate converts, and then cannot be written
        except Exception as e:
            if awaits_a_key(e):
                # Encrypted with a key this worker lacks: the task fails until a worker that
                # holds it reads the result (as the SDK's own conversion would), rather than
                # refuse what a worker with the key would take (a replay deciding otherwise).
                raise
            why = f"it does not read as a {result_type.__name__} ({type(e).__name__})"
            self._refuse_result(activity=activity, what=what, why=why)
        return result

    def _binding(self, activity: str, activity_id: str) -> Binding:
        return Binding(
            workflow_id=workflow.info().workflow_id,
            activity_id=activity_id,
            activity_type=activity,
        )

    def _check_result(self, result: Any, *, activity: str, activity_id: str, what: str) -> None:
        """Take ``result`` only with a worker's seal for this very activity (workflows.seal).

        Raises:
            Unsealed: it has none that verifies; the refusal is recorded.
        """
        keys = workflow_keys()
        seal = getattr(result, "seal", None)
        if keys is None:
            why: str | None = "this worker holds no result keys"
        else:
            why = keys.verify(seal, self._binding(activity, activity_id), result_body(result))
        if why is not None:
            self._refuse_result(activity=activity, what=what, why=why)

    def _check_failure(
        self, err: ActivityError, *, activity: str, activity_id: str, what: str
    ) -> None:
        """Take an activity's ``ApplicationError`` only with a worker's seal for this very
        activity. Failures of the server's own kinds (a timeout, a cancellation the workflow
        asked for) are the server's word, and are taken as they are; but a cancellation while
        nothing is being cancelled was sent by id as a failure, and is refused.

        Raises:
            Unsealed: an application failure without a seal that verifies; recorded.
        """
        cause = err.cause
        if isinstance(cause, CancelledError):
            task = asyncio.current_task()
            if self._cancelling() or (task is not None and task.cancelling()):
                return  # the cancellation this turn (or the workflow) asked for
            # The server lets no worker report a cancellation nobody asked for
            # (RespondActivityTaskCanceled* is refused): this one came by id as a failure.
            self._refuse_result(
                activity=activity,
                what=what,
                why="it is a cancellation this conversation did not ask for",
                failure=True,
            )
        if not isinstance(cause, ApplicationError):
            return
        details, seal = split_details(cause.details)
        keys = workflow_keys()
        if keys is None:
            why: str | None = "this worker holds no result keys"
        else:
            body = failure_body(
                type=cause.type,
                message=cause.message,
                non_retryable=cause.non_retryable,
                details=details,
            )
            why = keys.verify(seal, self._binding(activity, activity_id), body)
        if why is not None:
            self._refuse_result(activity=activity, what=what, why=why, failure=True)

    async def _check_server_kind(
        self,
        err: ActivityError,
        *,
        activity: str,
        activity_id: str | None,
        since: datetime,
        options: dict[str, Any],
        what: str,
    ) -> None:
        """Take a failure of the server's own kind only where the server made it (``None``
        for ``activity_id``: no timeout is taken).

        No worker seals a timeout or a server failure, and one failed by id reads the same as
        the server's here. A timeout of a kind this call has no limit for, or sooner than that
        limit since the call was scheduled, is not the server's; nor is a server failure, which
        the server never makes of an activity's ending. Any other timeout is taken once the
        run's history says the server made it (``ActivityTaskTimedOut``, read by the sealed
        ``activity_ending``): a failure sent by id is ``ActivityTaskFailed`` there, whatever
        it says. Refused as unsealed: a model call is asked again, a tool call reaches the
        model as "may have taken effect".

        Raises:
            Unsealed: a server-kind failure the server did not make; recorded.
        """
        cause = err.cause
        if isinstance(cause, ServerError):
            why = "a server failure is never how the server ends an activity"
        elif isinstance(cause, TemporalTimeoutError):
            limit: timedelta | None = options.get(_TIMEOUT_OPTION.get(cause.type, ""))
            waited = workflow.now() - since
            if limit is None:
                why = f"the call has no {_timeout_name(cause.type)} timeout"
            elif waited < limit:
                why = (
                    f"its {_timeout_name(cause.type)} timeout is {limit}, and only {waited} had "
                    "passed"
                )
            else:
                if activity_id is None:
                    why = "a timeout of the check of how an activity ended is not checked"
                else:
                    ending = await self._ending(activity_id, what=what)
                    if ending == "timed_out":
                        return
                    why = f"the run's history says the call ended {ending}, not timed out"
        else:
            return
        self._refuse_result(activity=activity, what=what, why=why, failure=True)

    async def _ending(self, activity_id: str, *, what: str) -> str:
        """How the run's history says the activity ``activity_id`` ended (``activity_ending``);
        ``unknown`` when no worker's sealed answer came (the refusal is recorded)."""
        try:
            found: ActivityEndingResult = await self.execute(
                config.ACTIVITY_ENDING_ACTIVITY,
                ActivityEndingInput(activity_id=activity_id),
                result_type=ActivityEndingResult,
                start_to_close_timeout=config.ACTIVITY_ENDING_START_TO_CLOSE,
                heartbeat_timeout=config.SUB_AGENT_HEARTBEAT,
                retry_policy=config.SUB_AGENT_RETRY,
                summary=f"how {what} ended",
                verify_timeouts=False,
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError):
                # The turn (or the workflow) is being cancelled: that, not the check, decides.
                raise asyncio.CancelledError() from None
            return "unknown"
        except Unsealed:
            return "unknown"
        return found.ending

    def _refuse_result(
        self, *, activity: str, what: str, why: str, failure: bool = False
    ) -> NoReturn:
        kind = "failure" if failure else "result"
        record = audit.rejection(
            at=workflow.now(),
            handler=activity,
            reason=f"{what}: a {kind} no worker sealed was not taken: {why}",
            raw=b"",
            identity=None,
            via="activity",
        )
        audit.reject(self.s, record)
        workflow.logger.warning("%s: a %s no worker sealed was not taken: %s", what, kind, why)
        raise Unsealed(f"{what}: its {kind} was not a worker's ({why})")

    def error(self, err: ActivityError, *, what: str) -> ErrorInfo:
        error = activity_error(err, what=what)
        # A tool decides how long its message is, and it is kept and shown.
        return ErrorInfo(
            status=cut_stored(error.status, 40),
            message=cut_stored(error.message, DOOR.note),
            kind=error.kind,
            hosted=error.hosted,
        )


_TIMEOUT_OPTION: dict[TimeoutType | None, str] = {
    TimeoutType.START_TO_CLOSE: "start_to_close_timeout",
    TimeoutType.SCHEDULE_TO_START: "schedule_to_start_timeout",
    TimeoutType.SCHEDULE_TO_CLOSE: "schedule_to_close_timeout",
    TimeoutType.HEARTBEAT: "heartbeat_timeout",
}
"""The ``execute_activity`` option that sets the limit a timeout of each kind says passed."""


def _timeout_name(kind: TimeoutType | None) -> str:
    return kind.name.lower().replace("_", "-") if kind is not None else "unknown"


DECODING_FAILED = "Failed decoding arguments"
"""The message of the error the SDK raises when an activity worker cannot convert the activity's
input (``temporalio/worker/_activity.py``); ``client.codec.DECODING_FAILED``."""


_KEY_ID_IN_MESSAGE = re.compile(r"key id '([A-Za-z0-9._-]{1,64})'")


def undecryptable(err: ActivityError) -> str | None:
    """The key id (quoted, or ``unknown``) if the attempt failed as the SDK fails an activity
    whose input the worker could not decrypt; else None.

    Only that shape: the attempt's error is the SDK's own "Failed decoding arguments", and a
    ``PayloadKeyMissing`` is in *its* causes. A tool that raises an error of that type itself
    (one reading another conversation through ``AgentClient``, say) has run: its failure is
    the tool's, and is not scheduled again.
    """
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.message == DECODING_FAILED):
        return None
    inner = cause.__cause__
    while inner is not None:
        if isinstance(inner, ApplicationError) and inner.type == ErrorKind.PAYLOAD_KEY_MISSING:
            found = _KEY_ID_IN_MESSAGE.search(inner.message)
            return repr(found[1]) if found else "unknown"
        inner = inner.__cause__
    return None


def awaits_a_key(error: BaseException) -> bool:
    """Whether ``error`` (or a cause of it) is the codec's ``PayloadKeyMissing`` for a key id
    this process does not hold (not ``corrupt``: a key it holds under that id that does not open
    the payload, which no worker with this key set would open either). ``codec.awaits_a_key``,
    by the class's name: the workflow's sandbox imports the codec module anew."""
    found: BaseException | None = error
    while found is not None:
        if type(found).__name__ == ErrorKind.PAYLOAD_KEY_MISSING:
            return not getattr(found, "corrupt", False)
        found = found.__cause__
    return False


def classified(err: ActivityError) -> bool:
    """Whether the failure says how it failed: the tool's own ``ToolError``, or an input no
    worker could decrypt (the call never ran)."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    ):
        return True
    return undecryptable(err) is not None


def activity_error(err: ActivityError, *, what: str) -> ErrorInfo:
    """A classified error for the caller. Unclassified failures keep their text in history only."""
    key_id = undecryptable(err)
    if key_id is not None:
        # Given up on (config.UNDECRYPTABLE_GIVE_UP): no worker that took it could read it.
        return ErrorInfo(
            status=Status.UNAVAILABLE,
            message=(
                f"{what} did not run: its input could not be decrypted (key id {key_id}) by "
                "the workers that took it"
            ),
        )
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (
        ErrorKind.TOOL_ERROR,
        ErrorKind.MODEL_ERROR,
        ErrorKind.UNKNOWN_AGENT,
    ):
        status = str(cause.details[0]) if cause.details else Status.INTERNAL
        hosted = None
        if cause.type == ErrorKind.UNKNOWN_AGENT:
            hosted = _hosted(cause.details[1] if len(cause.details) > 1 else None)
        return ErrorInfo(status=status, message=cause.message, kind=cause.type, hosted=hosted)
    if isinstance(cause, TemporalTimeoutError):
        return ErrorInfo(status=Status.DEADLINE_EXCEEDED, message=f"{what} timed out")
    return ErrorInfo(status=Status.INTERNAL, message=f"{what} failed")


def _hosted(detail: object) -> list[str]:
    """The agent names an ``UnknownAgent`` failure's details carry (the activity's second
    detail), as far as they fit 1 KiB: whoever runs a worker on the queue wrote them, and the
    turn's result holds them."""
    names = detail.get("hosted") if isinstance(detail, dict) else None
    if not isinstance(names, list):
        return []
    return names_within([cut_stored(n, DOOR.agent_name) for n in names if isinstance(n, str)], KiB)

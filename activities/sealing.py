"""The activities' half of ``workflows.seal``: every result and every failure they return is
sealed for the one activity that asked, so the workflow can tell it from one completed by id
from outside.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, FailureError

from temporal_agent_interrupts.workflows.executing import DECODING_FAILED
from temporal_agent_interrupts.workflows.seal import (
    Binding,
    ResultKeys,
    failure_body,
    result_body,
    seal_detail,
)

R = TypeVar("R", bound=BaseModel)
In = TypeVar("In", bound=BaseModel)


def binding() -> Binding:
    """What the running activity's result is for, as the server told this worker."""
    info = activity.info()
    return Binding(
        workflow_id=info.workflow_id or "",
        activity_id=info.activity_id,
        activity_type=info.activity_type,
    )


class Sealer:
    """Seals results and failures with a worker's :class:`ResultKeys`."""

    def __init__(self, keys: ResultKeys) -> None:
        self.keys = keys

    def result(self, result: R) -> R:
        seal = self.keys.seal(binding(), result_body(result))
        return result if seal is None else result.model_copy(update={"seal": seal})

    def failure(self, error: Exception) -> BaseException:
        """``error`` as a sealed ``ApplicationError``: an ``ApplicationError`` keeps its type,
        message, details and retryability; any other exception reads as the SDK would send it
        (its class name as the type, retryable). Failures the SDK makes of its own kind
        (cancellation, timeouts) pass as they are: the workflow never takes them for a
        worker's word."""
        if self.keys.off or not self.keys.keys:
            return error
        if isinstance(error, ApplicationError):
            kind, message, retry = error.type, error.message, error.non_retryable
            details = list(error.details)
            delay = error.next_retry_delay
        elif isinstance(error, FailureError):
            return error
        else:
            kind, message, retry, details, delay = type(error).__name__, str(error), False, [], None
        seal = self.keys.seal(
            binding(),
            failure_body(type=kind, message=message, non_retryable=retry, details=details),
        )
        sealed = ApplicationError(
            message,
            *details,
            seal_detail(seal),
            type=kind,
            non_retryable=retry,
            next_retry_delay=delay,
        )
        sealed.__cause__ = error.__cause__ if isinstance(error, ApplicationError) else error
        return sealed

    async def run(self, call: Awaitable[R]) -> R:
        """Await ``call``, sealing what it returns or raises."""
        try:
            result = await call
        except Exception as e:
            sealed = self.failure(e)
            if sealed is e:
                raise
            raise sealed from sealed.__cause__
        return self.result(result)

    async def take(
        self, raw: RawValue, input_type: type[In], call: Callable[[In], Awaitable[R]]
    ) -> R:
        """Read the activity's input as ``input_type``, then await ``call`` with it, sealing what
        either returns or raises.

        The activities take their input raw so that this reading happens here, not in the SDK:
        an input the worker cannot read (it lacks the payload key the conversation is written
        with) fails as the SDK fails it, "Failed decoding arguments" from the codec's
        ``PayloadKeyMissing``, but sealed. The workflow schedules such a call again, as one
        that never ran; without the seal, anyone who may fail an activity by id could say so of
        a tool that has run, and have it run again.
        """

        async def read_and_call() -> R:
            try:
                value = activity.payload_converter().from_payload(raw.payload, input_type)
            except Exception as e:
                raise ApplicationError(DECODING_FAILED) from e  # the SDK's own shape
            return await call(value)

        return await self.run(read_and_call())

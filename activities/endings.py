"""``activity_ending``: how one of a conversation's own activities ended, read from its history.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A timeout the server makes and a failure shaped as one, sent by id
(``RespondActivityTaskFailedById`` with a ``TimeoutFailureInfo``), reach the workflow alike; its
history does not hold them alike: the first is ``ActivityTaskTimedOut``, the second
``ActivityTaskFailed``. No worker seals a timeout, so the workflow asks this (sealed) activity
before it takes one (``workflows.executing``, ``ActivityRunner._check_server_kind``).
"""

from __future__ import annotations

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.activity_io import (
    ActivityEnding,
    ActivityEndingInput,
    ActivityEndingResult,
)
from temporal_agent_interrupts.workflows.config import WORKFLOW_TYPE


def _ending(event: HistoryEvent) -> tuple[int, ActivityEnding] | None:
    """The scheduled event id an activity's closing event names, and how it closed (None: not
    such an event)."""
    kind = event.event_type
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
        return event.activity_task_timed_out_event_attributes.scheduled_event_id, "timed_out"
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
        return event.activity_task_failed_event_attributes.scheduled_event_id, "failed"
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
        return event.activity_task_completed_event_attributes.scheduled_event_id, "completed"
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
        return event.activity_task_canceled_event_attributes.scheduled_event_id, "cancelled"
    return None


async def activity_ending(input: ActivityEndingInput) -> ActivityEndingResult:
    """How the activity ``input.activity_id`` of the run that scheduled this ended.

    Only for a conversation's run, about its own history: started any other way (standalone, or
    by a workflow of another type), it is refused, and it never reads another workflow.

    Raises:
        ApplicationError: non-retryable ``NotScheduledByConversation``.
    """
    info = activity.info()
    if not (info.in_workflow and info.workflow_type == WORKFLOW_TYPE and info.workflow_id):
        raise ApplicationError(
            "refused: activity_ending reads only the history of the conversation that scheduled it",
            type="NotScheduledByConversation",
            non_retryable=True,
        )
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    scheduled: int | None = None
    async for event in handle.fetch_history_events():
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and event.activity_task_scheduled_event_attributes.activity_id == input.activity_id
        ):
            scheduled = event.event_id
        elif scheduled is not None:
            ended = _ending(event)
            if ended is not None and ended[0] == scheduled:
                return ActivityEndingResult(ending=ended[1])
        activity.heartbeat()
    return ActivityEndingResult(ending="unknown")

"""Spans and metrics of the model and tool activities.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Spans go through OpenTelemetry's global API: without a tracer provider (tracing off, see
``client/tracing.py``) they cost next to nothing and go nowhere. With the worker's
``TracingInterceptor`` they are children of its ``RunActivity`` span, so in the conversation's
trace. Their attributes name the agent, the chat, the tool and the ref, and say how the call
ended; never a payload: no prompt, message text, tool input or output. An exception is recorded
by its type alone, since its message may quote a tool's input.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from temporalio import activity
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.telemetry import TOOL_CALLS

ToolOutcome = Literal["output", "interrupt", "invalid_input", "stale", "input_required", "error"]
NotificationOutcome = Literal["sent", "failed"]

# A durable identifier, like the workflow's metric names (docs/operating/monitoring.md).
NOTIFICATIONS = "agent_notifications"


@contextmanager
def span(name: str, /, **attributes: AttributeValue | None) -> Iterator[trace.Span]:
    """A span around an activity's work, its attributes prefixed ``agent.``; None is left out."""
    tracer = trace.get_tracer(__name__)
    attrs = {f"agent.{k}": v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(
        name, attributes=attrs, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as e:
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(e).__name__))
            if isinstance(e, ApplicationError) and e.type:
                current.set_attribute("agent.error", e.type)  # an ErrorKind: a bounded name
            raise


def count_tool_call(*, agent: str, tool: str, outcome: ToolOutcome) -> None:
    """One run of a tool, by how it ended (Temporal's own metrics see one activity type for
    every tool). ``tool`` is a tool the worker hosts, so the label is bounded."""
    meter = activity.metric_meter()
    counter = meter.create_counter(TOOL_CALLS, "Tool runs (activity attempts), by outcome.")
    counter.add(1, {"agent": agent, "tool": tool, "outcome": outcome})


def count_notification(
    *, agent: str, tool: str, channel: str, outcome: NotificationOutcome
) -> None:
    """One notice about a paused call to one channel, sent or given up on (after the activity's
    retries: call it once per notice, not per attempt that will be retried).

    Args:
        agent: The agent the worker hosts.
        tool: A tool the agent declares (the paused call's).
        channel: The kind of channel configured on the worker (``slack``, ``slack_dm``,
            ``email``...): never a channel id, an address or an approver's identity, which
            would make series without bound and put people's names in the metrics.
        outcome: ``sent`` or ``failed``.
    """
    meter = activity.metric_meter()
    counter = meter.create_counter(
        NOTIFICATIONS, "Notices of paused calls to the configured channels, sent or failed."
    )
    counter.add(1, {"agent": agent, "tool": tool, "channel": channel, "outcome": outcome})

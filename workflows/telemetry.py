"""What a conversation tells operators as it goes: the product's metrics and trace spans.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The turn state machine (:mod:`workflows.turn`) hands :class:`Telemetry` every turn event it emits
and the interrupts a turn withdraws; the conversation's handlers tell it of refused resumes and
signals. Nothing else calls it, so each metric below is counted in exactly one place.

Determinism and replay contract: nothing here issues a workflow command, reads the environment,
the clock or randomness, or changes the conversation's state, so a history is the same with or
without it, and the recorded histories replay with tracing on or off.

- Metrics go through ``workflow.metric_meter()``, which records nothing while the workflow
  replays: a conversation evicted from the cache and replayed is not counted twice (the tests
  run the metrics with the cache off). Two exceptions, both Temporal's: a workflow task that
  fails and is retried runs live twice (Temporal's own metrics share that); and Temporal's Core
  replays a task that issued no command as part of the next task when that one brings an
  update, calling it live, so what such a task counted counts again when the conversation was
  not in the worker's cache. Of what is counted here, only a refused signal issues no command
  (an interrupt raised, answered or expired always writes the memo or completes an update).
- Spans are ``temporalio.contrib.opentelemetry.workflow.completed_span``: zero-length spans
  stamped with workflow time, which the contrib makes only while not replaying, and only when
  the worker runs its ``TracingInterceptor``. Without the interceptor nothing is made here (the
  contrib's fallback would make spans on every replay, and warn).
- Metric labels are bounded: the agent, the tool (a tool the agent's definition declares, else
  :data:`UNKNOWN_TOOL`; only declared tools pause), a decision, an expiry's outcome or a
  handler; never a chat id. The agent label is the conversation's agent only once
  a model call in this run has come back, which shows the worker hosts an agent of that name;
  before, :data:`UNKNOWN_AGENT`. Whoever may start a workflow names its agent (and may hand it
  any state to carry on from), so a label from the input alone could make series without bound.
  Span attributes add the chat id and the ref, and name the agent as the conversation does.
  Neither ever holds a payload: no tool input or output, message text, answer, identity or
  token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from opentelemetry.util.types import AttributeValue
from temporalio import workflow
from temporalio.common import MetricCounter, MetricHistogramFloat
from temporalio.contrib.opentelemetry import TracingWorkflowInboundInterceptor
from temporalio.contrib.opentelemetry.workflow import completed_span

from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    JsonObject,
    TurnEvent,
    timed_out_output,
)

# Metric names and the histogram's buckets: durable identifiers for dashboards and alerts (the
# docs/operating/monitoring.md lists them). The worker's Prometheus endpoint takes the buckets
# from here.
INTERRUPTS_RAISED = "agent_interrupts_raised"
INTERRUPTS_ANSWERED = "agent_interrupts_answered"
INTERRUPTS_EXPIRED = "agent_interrupts_expired"
INTERRUPTS_SETTLED = "agent_interrupts_settled"
INTERRUPT_WAIT = "agent_interrupt_wait_seconds"
REJECTIONS = "agent_rejections"
TOOL_CALLS = "agent_tool_calls"

INTERRUPT_WAIT_BUCKETS = (
    1.0,
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4 * 3600.0,
    12 * 3600.0,
    86400.0,
    3 * 86400.0,
    7 * 86400.0,
)
"""Seconds: a human answers in a minute or in a week, so the default buckets (milliseconds for
Temporal's own latencies) would put every wait in the last one."""

# Span names (docs/operating/monitoring.md lists them with their attributes).
SPAN_TURN_START = "agent.turn.start"
SPAN_TURN_END = "agent.turn.end"
SPAN_RAISED = "agent.interrupt.raised"
SPAN_ESCALATED = "agent.interrupt.escalated"
SPAN_ANSWERED = "agent.interrupt.answered"
SPAN_EXPIRED = "agent.interrupt.expired"
SPAN_REJECTED = "agent.rejected"
SPAN_MODEL_CALL = "agent.model_call"
SPAN_TOOL_CALL = "agent.tool_call"

UNKNOWN_AGENT = "unknown"
"""The metrics' ``agent`` label before a model call of the run has shown that the worker hosts
the conversation's agent: a refusal before the first message is answered, a conversation naming
an agent no worker hosts, a run continued-as-new while paused until its next model call."""

UNKNOWN_TOOL = "unknown"
"""The metrics' ``tool`` label for a name the agent's definition does not declare."""

RejectedHandler = Literal["resume", "send", "start", "other"]

ExpiredOutcome = Literal["default", "timed_out", "cancelled"]
"""How a deadline ended a call nobody answered (the ``outcome`` label of
:data:`INTERRUPTS_EXPIRED`): ``default``, answered with a declared default (a tool's or the
agent's ``on_timeout``, an escalation's ``then``); ``timed_out``, answered with the stated
timed-out answer (no default declared, or it no longer fit the turn); ``cancelled``, the
deadline's policy cancelled the turn."""

SETTLING = frozenset({"approved", "denied", "answered", "edited"})
"""The decisions of a person's answer that end a pause (a vote leaves the call waiting; a
``stale`` or ``revoked`` record is about a call that was settled before)."""


def deadline_outcome(output: JsonObject | None) -> ExpiredOutcome:
    """Whether a deadline's answer (its output) was a declared default or the stated timed-out
    answer. Shared with ``agentctl stats``, which reads the same from the audit trail."""
    return "timed_out" if output == timed_out_output() else "default"


def rejected_handler(name: str) -> RejectedHandler:
    """A refused signal's name as a bounded label: anyone may send a signal of any name."""
    labels: dict[str, RejectedHandler] = {"resume": "resume", "send": "send", "start": "start"}
    return labels.get(name, "other")


@dataclass(frozen=True)
class _Instruments:
    raised: MetricCounter
    answered: MetricCounter
    expired: MetricCounter
    settled: MetricCounter
    wait: MetricHistogramFloat
    rejections: MetricCounter


class Telemetry:
    """The metrics and spans of one conversation's run.

    Args:
        agent: The conversation's agent: an attribute on every span, and the metrics' ``agent``
            label once :meth:`hosted` has been called (:data:`UNKNOWN_AGENT` until then).
    """

    def __init__(self, agent: str, *, spec: Callable[[], AgentSpec | None] = lambda: None) -> None:
        self.agent = agent
        self._spec = spec
        self._label = UNKNOWN_AGENT
        self._instruments: _Instruments | None = None

    def _tool(self, name: str) -> str:
        """A tool's name as a label: only a tool the agent's definition declares (which comes
        from a worker hosting the agent; only such tools pause), else :data:`UNKNOWN_TOOL`."""
        spec = self._spec()
        return name if spec is not None and spec.tool(name) is not None else UNKNOWN_TOOL

    def hosted(self) -> None:
        """A model call for this conversation's agent came back: the worker that ran it looked
        the agent up by this name (it fails the call for a name it does not host), so the name
        labels the metrics from here on. Not the name in the agent's definition the call may
        return, which a forged start could have put in the state it carries."""
        if self._label != self.agent:
            self._label = self.agent
            self._instruments = None

    def _metrics(self) -> _Instruments:
        # Made on first use, inside the workflow (the meter is the running workflow's), and
        # again when the label changes.
        if self._instruments is None:
            meter = workflow.metric_meter().with_additional_attributes({"agent": self._label})
            self._instruments = _Instruments(
                raised=meter.create_counter(
                    INTERRUPTS_RAISED, "Interrupts raised: a call paused for a human."
                ),
                answered=meter.create_counter(
                    INTERRUPTS_ANSWERED,
                    "Interrupts answered, by decision (cancelled: withdrawn unanswered).",
                ),
                expired=meter.create_counter(
                    INTERRUPTS_EXPIRED,
                    "Interrupts nobody answered before their deadline, by outcome"
                    " (default, timed_out, cancelled).",
                ),
                # Pending calls: raised minus settled, two counters rather than a gauge. A
                # gauge is one value per label set, last write wins, and every conversation of
                # an agent shares its (agent, tool) set, so a conversation could only report
                # its own count over the others'; a label per chat would be unbounded; and
                # Temporal's meter has no up-down counter (its counters refuse a negative add).
                # Each counter is added to once per pause, live only (nothing on replay), so
                # eviction and replay change neither; their difference is exact over any
                # window its series cover (a worker restart resets its counters: the level now
                # is `agentctl stats`, from visibility).
                settled=meter.create_counter(
                    INTERRUPTS_SETTLED,
                    "Interrupts no longer pending (answered, expired or withdrawn): pending"
                    f" calls are {INTERRUPTS_RAISED} minus this.",
                ),
                wait=meter.create_histogram_float(
                    INTERRUPT_WAIT,
                    "Seconds from an interrupt raised to the answer that settled it.",
                    "s",
                ),
                rejections=meter.create_counter(
                    REJECTIONS, "Resumes and signals the conversation refused."
                ),
            )
        return self._instruments

    def _span(self, name: str, **attributes: AttributeValue | None) -> None:
        # Private: the contrib has no public "is tracing on here" check, and its public
        # completed_span falls back to a global tracer (with a DeprecationWarning) when it is
        # off. Guarded by tests/test_library_guards.py.
        if TracingWorkflowInboundInterceptor._from_context() is None:
            return  # no tracing on this worker (see the module's docstring)
        attrs: dict[str, AttributeValue] = {
            "agent.name": self.agent,
            "agent.chat_id": workflow.info().workflow_id,
        }
        attrs.update({f"agent.{k}": v for k, v in attributes.items() if v is not None})
        completed_span(name, attributes=attrs)

    # -- what the turn state machine reports --------------------------------------------------

    def turn_started(self, turn: int) -> None:
        self._span(SPAN_TURN_START, turn=turn)

    def event(self, event: TurnEvent, calls: Sequence[CallState]) -> None:
        """One emitted turn event; ``calls`` are the turn's (the one it is about is among them)."""
        if event.kind not in ("interrupt", "answer", "turn_end"):
            return
        tool = self._tool(event.name or "")
        call = next((c for c in calls if c.ref == event.ref), None) if event.ref else None
        if event.kind == "turn_end" and event.result is not None:
            reason = event.result.finish_reason
            self._span(SPAN_TURN_END, turn=event.turn, finish_reason=str(reason))
        elif event.kind == "interrupt":
            source = event.interrupt.source if event.interrupt else None
            if call is not None and call.escalated:
                # The same pause with a later deadline, not a new one.
                self._span(SPAN_ESCALATED, tool=tool, ref=event.ref, turn=event.turn)
                return
            self._metrics().raised.add(1, {"tool": tool})
            self._span(SPAN_RAISED, tool=tool, ref=event.ref, turn=event.turn, source=source)
        elif event.kind == "answer" and event.answer is not None:
            answer = event.answer
            if answer.kind == "cancel":
                return  # counted by withdrawn(), which knows which calls were still pending
            if answer.kind == "deadline":
                outcome = deadline_outcome(event.output)
                self._metrics().expired.add(1, {"tool": tool, "outcome": outcome})
                self._metrics().settled.add(1, {"tool": tool})
                self._span(SPAN_EXPIRED, tool=tool, ref=event.ref, turn=event.turn)
                return
            decision = answer.decision or "answered"  # (every answer event has one)
            metrics = self._metrics()
            metrics.answered.add(1, {"tool": tool, "decision": decision})
            if decision in SETTLING and call is not None and call.since is not None:
                # (A call let through by a grant or the policy set never paused.)
                metrics.settled.add(1, {"tool": tool})
            waited = None
            if decision != "vote" and call is not None and call.since and event.at:
                # A vote leaves the call waiting; the answer that settles it ends the wait.
                waited = max((event.at - call.since).total_seconds(), 0.0)
                metrics.wait.record(waited, {"tool": tool})
            self._span(
                SPAN_ANSWERED,
                tool=tool,
                ref=event.ref,
                turn=event.turn,
                kind=answer.kind,
                decision=decision,
                via=answer.via,
                waited_seconds=waited,
            )

    def withdrawn(self, calls: Iterable[CallState], *, now: datetime, by_deadline: bool) -> None:
        """Interrupts still pending when their turn was cancelled or failed.

        Args:
            by_deadline: A deadline whose policy cancels the turn did it: the calls whose
                deadline has passed count as expired, the rest as cancelled.
        """
        for call in calls:
            tool = self._tool(call.name)
            self._metrics().settled.add(1, {"tool": tool})
            if by_deadline and call.deadline is not None and call.deadline <= now:
                self._metrics().expired.add(1, {"tool": tool, "outcome": "cancelled"})
                self._span(SPAN_EXPIRED, tool=tool, ref=call.ref)
                continue
            self._metrics().answered.add(1, {"tool": tool, "decision": "cancelled"})
            self._span(SPAN_ANSWERED, tool=tool, ref=call.ref, decision="cancelled")

    # -- what the handlers report ----------------------------------------------------------

    def rejected(self, handler: str, *, via: Literal["update", "signal", "start"]) -> None:
        """A resume (by update), a signal or a start's request the conversation refused."""
        label = rejected_handler(handler)
        self._metrics().rejections.add(1, {"handler": label, "via": via})
        self._span(SPAN_REJECTED, handler=label, via=via)

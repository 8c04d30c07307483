"""Deadline policy: when a paused call's deadline falls, what reminds someone before it, what
escalates it, and what answers it when nobody did.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A paused call gets its deadline from the agent's definition (an interrupt-only tool's own, else
the agent's default for every paused call). Before it, reminders notify someone, earliest first;
at it, an escalation notifies and extends it once; then the timeout default answers the call or
the turn is cancelled. These functions decide; the call's transitions
(:mod:`workflows.calls`) carry the decisions out, each with its turn event.

Functions over plain data (the agent's spec and the calls): no Temporal imports, unit-tested in
milliseconds, identical on replay. The time is always the workflow's, passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    EscalateSpec,
    JsonObject,
    ReminderSpec,
    timed_out_output,
)

DueAction = Literal["remind", "escalate", "expire", "cancel"]


@dataclass(frozen=True)
class Due:
    """What a deadline policy does now for one pending call."""

    call: CallState
    # "remind": run the reminder's notifying tool; "escalate": notify and extend the deadline;
    # "expire": answer with the timeout default; "cancel": cancel the turn.
    action: DueAction
    notify: str | None = None
    # remind, escalate: the channels to post it to (``Remind(channels=)``).
    channels: tuple[str, ...] = ()


def deadline_seconds(spec: AgentSpec | None, name: str) -> float | None:
    """How long a paused call to tool ``name`` waits for an answer (None: for ever)."""
    if spec is None:
        return None
    tool = spec.tool(name)
    if tool and tool.deadline_seconds:
        return tool.deadline_seconds
    return spec.interrupt_deadline_seconds


def deadline(spec: AgentSpec | None, name: str, *, now: datetime) -> datetime | None:
    """The deadline of a call to tool ``name`` paused ``now`` (None: it has none)."""
    seconds = deadline_seconds(spec, name)
    return now + timedelta(seconds=seconds) if seconds else None


def policy(
    spec: AgentSpec | None, call: CallState
) -> tuple[EscalateSpec | None, list[ReminderSpec], bool]:
    """The deadline policy of ``call``: its escalation, its reminders (earliest first) and
    whether the deadline cancels the turn. An interrupt-only tool with a deadline of its
    own has its own policy; every other paused call has the agent's."""
    if spec is None:
        return None, [], False
    tool = spec.tool(call.name)
    if tool is not None and tool.interrupt_only and tool.deadline_seconds:
        escalate, reminders, cancel = tool.escalate, tool.reminders, tool.timeout_cancel
    else:
        escalate = spec.interrupt_escalate
        reminders = spec.interrupt_reminders
        cancel = spec.interrupt_timeout_cancel
    ordered = sorted(reminders, key=lambda r: -r.before_seconds)
    return escalate, ordered, cancel


def next_reminder(spec: AgentSpec | None, call: CallState) -> ReminderSpec | None:
    """The reminder ``call`` has not had yet (None: all have run, or it has none)."""
    reminders = policy(spec, call)[1]
    return reminders[call.reminded] if call.reminded < len(reminders) else None


def next_time(spec: AgentSpec | None, call: CallState) -> datetime | None:
    """When the deadline policy of ``call`` acts next: its next reminder or its deadline."""
    if call.deadline is None:
        return None
    reminder = next_reminder(spec, call)
    if reminder is not None:
        return min(call.deadline - timedelta(seconds=reminder.before_seconds), call.deadline)
    return call.deadline


def next_deadline(spec: AgentSpec | None, pending: Iterable[CallState]) -> datetime | None:
    """When the next deadline policy of the ``pending`` calls acts: a reminder or a deadline."""
    times = [t for c in pending if (t := next_time(spec, c)) is not None]
    return min(times) if times else None


def due(spec: AgentSpec | None, pending: Iterable[CallState], now: datetime) -> list[Due]:
    """What the deadline policies do now, for every pending call whose time has come."""
    found: list[Due] = []
    for call in pending:
        if call.deadline is None:
            continue
        escalate, _, cancel = policy(spec, call)
        reminder = next_reminder(spec, call)
        if call.deadline <= now:
            if escalate is not None and not call.escalated:
                found.append(Due(call, "escalate", escalate.notify, tuple(escalate.channels)))
            elif escalate.then_cancel if escalate and call.escalated else cancel:
                found.append(Due(call, "cancel"))
            else:
                found.append(Due(call, "expire"))
        elif (
            reminder is not None
            and call.deadline - timedelta(seconds=reminder.before_seconds) <= now
        ):
            found.append(Due(call, "remind", reminder.notify, tuple(reminder.channels)))
    return found


def expiring(
    spec: AgentSpec | None, pending: Iterable[CallState], now: datetime
) -> list[CallState]:
    """The pending calls whose deadline has passed and whose policy answers them with the
    timeout default (one not yet escalated is escalated first; one whose policy cancels the
    turn is withdrawn with it instead, see :func:`due`)."""
    found = []
    for call in pending:
        escalate, _, cancel = policy(spec, call)
        if escalate is not None and not call.escalated:
            continue
        if escalate.then_cancel if escalate is not None else cancel:
            continue
        if call.deadline is not None and call.deadline <= now:
            found.append(call)
    return found


def extension(spec: AgentSpec | None, call: CallState) -> timedelta:
    """How far escalating ``call`` extends its deadline (it has an escalation: see
    :func:`due`)."""
    escalate = policy(spec, call)[0]
    assert escalate is not None and call.deadline is not None
    return timedelta(seconds=escalate.extend_seconds)


def timeout_output(spec: AgentSpec | None, call: CallState) -> JsonObject:
    """The answer ``call`` gets when its deadline passes with nobody answering: the
    escalation's, the tool's, the agent's, else the stated timed-out answer."""
    escalate = policy(spec, call)[0]
    if escalate is not None and call.escalated:
        return dict(escalate.then) if escalate.then is not None else timed_out_output()
    tool = spec.tool(call.name) if spec else None
    if tool and tool.on_timeout is not None:
        return dict(tool.on_timeout)
    if spec and spec.on_interrupt_timeout is not None:
        return dict(spec.on_interrupt_timeout)
    return timed_out_output()

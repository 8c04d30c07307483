"""The ``notify`` activity and what a channel is: where a paused call is announced.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

An agent names its channels (``Agent(notify=["approvals"])``); each worker maps the names to
:class:`Channel` objects it configures (``AgentsPlugin(channels={"approvals": ...})``), so their
secrets (a bot token, an SMTP password) live on the worker and never enter history or logs.

The conversation schedules the activity (``workflows.notifications``) once per channel when a
call pauses, and once more when the call ends for a channel that posted something. The activity
takes its input only from the conversation that scheduled it (``for_a_conversation``): a
standalone activity, or one a workflow of somebody else's schedules, could otherwise make the
bot post anything to approvers. What a channel returns is sealed like every other result.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.activity_io import NotifyInput, NotifyResult

log = logging.getLogger(__name__)


@runtime_checkable
class Channel(Protocol):
    """Somewhere a paused call is announced: a Slack channel, approvers' inboxes.

    Both methods may be called more than once for one notification (an attempt that timed out
    or whose worker was lost is retried): ``note.key`` names the pause, and a channel that can
    look up what it posted under that key posts it only once. An exception is retried
    (``config.NOTIFY_RETRY``); the last one is recorded in the conversation's audit trail by its
    message, so a channel's messages must not quote its secrets.
    """

    async def announce(self, note: NotifyInput) -> str | None:
        """Tell the channel that ``note.interrupt`` paused (``note.kind`` "paused"), that its
        deadline is near ("reminder") or was extended once ("escalation"). Returns what
        identifies what was posted, for :meth:`settle` (a Slack message's channel and
        timestamp), or None when the
        channel keeps nothing to update (email)."""
        ...

    async def settle(self, note: NotifyInput, posted: str) -> None:
        """Show that the call ended (``note.settled``, ``note.settled_by``) on what
        :meth:`announce` posted (``posted``)."""
        ...


HEADINGS = {
    "paused": "Approval needed",
    "reminder": "Reminder: approval needed",
    "escalation": "Escalated: approval needed",
}
"""What a message about a paused call is headed with, by the notification's kind."""


def heading(kind: str) -> str:
    """The heading of a message about a paused call: ``Approval needed``, or its reminder's or
    escalation's."""
    return HEADINGS.get(kind, HEADINGS["paused"])


class Notifier:
    """The ``notify`` activity's body: the worker's channels by name."""

    def __init__(self, channels: dict[str, Channel]) -> None:
        for name, channel in channels.items():
            if not isinstance(channel, Channel):
                raise TypeError(
                    f"channel {name!r} is a {type(channel).__name__}, which has no "
                    "announce()/settle() (see temporal_agent_interrupts.hosting.Channel)"
                )
        self._channels = dict(channels)

    def has(self, name: str) -> bool:
        """Whether this worker configures a channel of that name."""
        return name in self._channels

    async def notify(self, note: NotifyInput) -> NotifyResult:
        channel = self._channels.get(note.channel)
        if channel is None:
            # The agent names a channel this worker does not have: nothing to retry.
            raise ApplicationError(
                f"channel {note.channel[:100]!r} is not configured on this worker "
                f"(configured: {sorted(self._channels)[:20]})",
                type="ChannelNotConfigured",
                non_retryable=True,
            )
        if note.kind != "settled":
            # A pause, a reminder or an escalation: each a message of its own (note.kind).
            posted = await channel.announce(note)
            log.info(
                "announced %s (ref %s) of chat %s on channel %r",
                note.interrupt.name[:100],
                note.interrupt.ref[:100],
                note.chat_id[:100],
                note.channel[:100],
            )
            return NotifyResult(posted=posted)
        if note.posted:
            await channel.settle(note, note.posted)
        return NotifyResult()


def attempt() -> int:
    """The activity's attempt number (1 for the first), for a channel that checks for what an
    earlier attempt posted only when there was one."""
    try:
        return activity.info().attempt
    except RuntimeError:
        return 1

"""Slack as a channel: a paused call posted once to a channel and to its approvers' DMs, with
*Approve*, *Deny* and *Open* buttons, and each message updated to how the call ended.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

Worker side only: the bot token lives in :class:`SlackChannel` (``AgentsPlugin(channels=...)``)
and never enters history, logs or an error message. The clicks come back to the web app
(``client/slack.py``), which maps the clicking Slack user through the same
:class:`SlackDirectory` and answers through the approvals path.

Exactly once per pause: each message carries Slack message metadata (event type
:data:`EVENT_TYPE`, payload ``{"key": note.key}``). An attempt after the first (the last one
timed out, or its worker was SIGKILLed after Slack took the post but before the answer came
back) first reads the conversation's recent history with its metadata and takes a message with
that key for its own instead of posting again.

The SDK's synchronous ``WebClient`` runs in a thread: its ``AsyncWebClient`` needs aiohttp, and
with aiohttp importable google-genai moves the model calls onto it (see pyproject.toml). Its
own retries are off; Temporal retries the activity (408, 429 and 5xx, and Slack's transient
errors), and any other refusal is final.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.web import SlackResponse
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.notify import attempt, heading
from temporal_agent_interrupts.workflows.activity_io import NotifyInput, SettledAs
from temporal_agent_interrupts.workflows.text import truncate
from temporal_agent_interrupts.workflows.types import InterruptRequest

log = logging.getLogger(__name__)

EVENT_TYPE = "agent_interrupt"
"""The Slack message metadata event type of every message this channel posts."""

APPROVE = "tai_approve"
DENY = "tai_deny"
OPEN = "tai_open"
"""The buttons' ``action_id``\\ s: what the interactivity endpoint (``client/slack.py``) reads."""

LOOKUP_WINDOW = timedelta(hours=1)
"""How far back a retried announcement looks for what an earlier attempt posted: well past the
notify activity's retries (``config.NOTIFY_RETRY``, minutes)."""

LOOKUP_PAGES = 5
"""Pages of :data:`LOOKUP_PAGE` messages a lookup reads at most (a busy channel's hour)."""
LOOKUP_PAGE = 200

SLACK_TIMEOUT = timedelta(seconds=10)
"""One Web API call's HTTP timeout, under the activity's (``config.NOTIFY_START_TO_CLOSE``)."""

POSTED_BYTES = 120
"""The most the reference to what was posted may take (the conversation keeps 128 bytes of
it): messages past it are found again by their key when the call ends."""

# Slack's own bounds (Block Kit): a section's text, a field, a header, a button's value.
_SECTION = 2900
_FIELD = 1900
_HEADER = 150
_CONTEXT = 1900
_VALUE = 2000
_ASKED = 600
_FIELDS = 10

_USER_ID = re.compile(r"[UW][A-Z0-9]{2,40}")
_CHANNEL_ID = re.compile(r"[CDGZ][A-Z0-9]{2,40}")

# Slack's errors that are worth another attempt (the rest is a setup to fix: a token, a scope,
# a channel the bot is not in).
_TRANSIENT = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)

_ENDED: dict[SettledAs, str] = {
    "approved": "Approved",
    "denied": "Denied",
    "answered": "Answered",
    "edited": "Approved with changes",
    "expired": "Expired",
    "withdrawn": "Withdrawn",
    "cancelled": "Cancelled",
}


def mrkdwn(text: str) -> str:
    """``text`` escaped for Slack's mrkdwn as Slack documents: ``&``, ``<`` and ``>``, so no
    user, channel, link or ``<!everyone>`` can be written into a message."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass(frozen=True)
class SlackDirectory:
    """Who is who in Slack: the team's Slack user ids, each with the identity approver lists
    name, and the groups ``group:NAME`` approvers name.

    The worker reads it to send each approver a DM; the web app reads it to map a click to an
    identity (never the display name, which anyone can change).

    Args:
        users: Slack user id (``U…``/``W…``) to identity (an email, a user name).
        groups: Group name to the identities in it (``group:finance`` approvers).
        team: The Slack workspace (``T…``) the ids belong to; a click from another is refused.

    Raises:
        ValueError: a user id that is not one, an empty identity, or one identity twice.
    """

    users: Mapping[str, str]
    groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    team: str | None = None

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for user, identity in self.users.items():
            if not _USER_ID.fullmatch(user):
                raise ValueError(f"{user[:50]!r} is not a Slack user id (U… or W…)")
            if not identity.strip() or len(identity) > 256:
                raise ValueError(f"the identity of Slack user {user} is empty or too long")
            if identity in seen:
                raise ValueError(f"identity {identity[:100]!r} is given to two Slack users")
            seen.add(identity)
        object.__setattr__(self, "users", dict(self.users))
        object.__setattr__(self, "groups", {k: tuple(v) for k, v in self.groups.items()})

    def identity_of(self, user: str) -> str | None:
        """The identity of Slack user ``user`` (None: not in the directory)."""
        return self.users.get(user)

    def groups_of(self, identity: str) -> tuple[str, ...]:
        """The groups ``identity`` is in, by name."""
        return tuple(name for name, members in self.groups.items() if identity in members)

    def slack_users(self, approvers: Sequence[str]) -> list[str]:
        """The Slack user ids of ``approvers`` (``group:NAME`` through :attr:`groups`), each
        once, in order; approvers not in the directory are left out."""
        by_identity = {identity: user for user, identity in self.users.items()}
        found: list[str] = []
        for approver in approvers:
            if approver.startswith("group:"):
                members = self.groups.get(approver.removeprefix("group:"), ())
            else:
                members = (approver,)
            for identity in members:
                user = by_identity.get(identity)
                if user is not None and user not in found:
                    found.append(user)
        return found


class SlackChannel:
    """A :class:`~temporal_agent_interrupts.hosting.Channel` that posts paused calls to Slack.

    ``AgentsPlugin(channels={"approvals": SlackChannel(token=..., channel="C0123")})`` and
    ``Agent(notify=["approvals"])``. The Slack app needs ``chat:write``; ``im:write`` and
    ``im:history`` for DMs; ``channels:history`` (``groups:history`` for a private channel) so a
    retried post finds the one an earlier attempt made.

    Args:
        token: The bot token (``xoxb-…``): read it from the worker's environment or secret
            store. Never logged, never in history.
        channel: The Slack channel id (``C…``) to post each paused call in.
        dm: Also (or only) send each approver of the call a DM: the directory that maps the
            call's approvers (``group:NAME`` through its groups) to Slack users. A call anyone
            may answer is sent to nobody this way.
        inbox_url: The web app's public URL (``https://approvals.example.com``): an *Open*
            button links to its inbox page, for edits and responds.
        base_url: The Web API's URL (a test's stand-in).
        timeout: One Web API call's HTTP timeout.

    Raises:
        ValueError: neither ``channel`` nor ``dm``, an empty token, or a channel that is not a
            Slack channel id.
    """

    def __init__(
        self,
        *,
        token: str,
        channel: str | None = None,
        dm: SlackDirectory | None = None,
        inbox_url: str | None = None,
        base_url: str = WebClient.BASE_URL,
        timeout: timedelta = SLACK_TIMEOUT,
    ) -> None:
        if not token.strip():
            raise ValueError("a Slack channel needs its bot token")
        if channel is None and dm is None:
            raise ValueError("give channel= (a Slack channel id), dm= (a directory), or both")
        if channel is not None and not _CHANNEL_ID.fullmatch(channel):
            raise ValueError(f"{channel[:50]!r} is not a Slack channel id (C…, G… or D…)")
        self.channel = channel
        self.dm = dm
        self.inbox_url = inbox_url.rstrip("/") if inbox_url else None
        self._client = WebClient(
            token=token,
            base_url=base_url,
            timeout=max(1, int(timeout.total_seconds())),
            retry_handlers=[],  # Temporal owns retries
        )

    def __repr__(self) -> str:
        # Never the token.
        return f"SlackChannel(channel={self.channel!r}, dm={self.dm is not None})"

    # -- Channel -------------------------------------------------------------------------------

    async def announce(self, note: NotifyInput) -> str | None:
        """Post the paused call to the channel and to each approver's DM, once each.

        Slack unavailable is retried, until the call's deadline (if it has one) has passed:
        then the failure is final, and on record, as a message would come too late.
        """
        try:
            return await self._announce(note)
        except ApplicationError as e:
            deadline = note.interrupt.deadline
            if e.non_retryable or deadline is None or datetime.now(UTC) < deadline:
                raise
            raise ApplicationError(
                f"{e.message}; the call's deadline has passed, so it is not tried again",
                type=e.type,
                non_retryable=True,
            ) from None

    async def _announce(self, note: NotifyInput) -> str | None:
        targets = await self._targets(note.interrupt)
        if not targets:
            raise ApplicationError(
                "no approver of this call is in the Slack directory, and no channel is set",
                type="SlackNobodyToTell",
                non_retryable=True,
            )
        retried = attempt() > 1
        blocks, text = paused_message(note, inbox_url=self.inbox_url)
        posted: list[str] = []
        for target in targets:
            ts = await self._find(target, note.key, None) if retried else None
            if ts is None:
                answer = await self._call(
                    self._client.chat_postMessage,
                    channel=target,
                    text=text,
                    blocks=blocks,
                    metadata={"event_type": EVENT_TYPE, "event_payload": {"key": note.key}},
                    unfurl_links=False,
                    unfurl_media=False,
                )
                ts = str(answer.get("ts") or "")
                target = str(answer.get("channel") or target)
            posted.append(f"{target}:{ts}")
        log.info("posted %d Slack message(s) for key %s", len(posted), note.key)
        return _encode(posted)

    async def settle(self, note: NotifyInput, posted: str) -> None:
        """Update each message to how the call ended, without its buttons."""
        refs, more = _decode(posted)
        if more:
            # Past what the conversation keeps: the DMs left out are found by their key.
            listed = {channel for channel, _ in refs}
            for target in await self._targets(note.interrupt):
                if target not in listed:
                    since = note.interrupt.since
                    ts = await self._find(target, note.key, since.timestamp() if since else None)
                    if ts is not None:
                        refs.append((target, ts))
        blocks, text = settled_message(note)
        for channel, ts in refs:
            await self._call(
                self._client.chat_update, channel=channel, ts=ts, text=text, blocks=blocks
            )

    # -- Slack ---------------------------------------------------------------------------------

    async def _targets(self, request: InterruptRequest) -> list[str]:
        """The conversations to post in: the channel, then each approver's DM."""
        targets = [self.channel] if self.channel else []
        if self.dm is not None:
            for user in self.dm.slack_users(request.approvers):
                opened = await self._call(self._client.conversations_open, users=user)
                found = opened.get("channel")
                dm = found.get("id") if isinstance(found, dict) else None
                if isinstance(dm, str) and dm:
                    targets.append(dm)
        return targets

    async def _find(self, channel: str, key: str, oldest: float | None) -> str | None:
        """The ``ts`` of the message with metadata ``key`` in ``channel``'s history since
        ``oldest`` (None: the last :data:`LOOKUP_WINDOW`), or None."""
        if oldest is None:
            oldest = time.time() - LOOKUP_WINDOW.total_seconds()
        cursor: str | None = None
        for _ in range(LOOKUP_PAGES):
            page = await self._call(
                self._client.conversations_history,
                channel=channel,
                oldest=f"{max(oldest - 60, 0):.6f}",
                limit=LOOKUP_PAGE,
                include_all_metadata=True,
                **({"cursor": cursor} if cursor else {}),
            )
            for message in page.get("messages") or []:
                meta = message.get("metadata") or {}
                payload = meta.get("event_payload") or {}
                if meta.get("event_type") == EVENT_TYPE and payload.get("key") == key:
                    return str(message.get("ts"))
            cursor = ((page.get("response_metadata") or {}).get("next_cursor")) or None
            if not cursor:
                return None
        return None

    async def _call(self, call: Callable[..., SlackResponse], **params: Any) -> dict[str, Any]:
        """One Web API call, in a thread, its errors sorted for Temporal: retryable or not, in
        words that never quote the token."""
        method = call.__name__.replace("_", ".")
        try:
            response = await asyncio.to_thread(functools.partial(call, **params))
        except SlackApiError as e:
            raise _sorted(method, e) from None
        except (URLError, OSError, TimeoutError) as e:
            raise ApplicationError(
                f"Slack's {method} did not answer ({type(e).__name__})",
                type="SlackUnavailable",
            ) from None
        return dict(response.data) if isinstance(response.data, dict) else {}


def _sorted(method: str, error: SlackApiError) -> ApplicationError:
    status = error.response.status_code
    data = error.response.data if isinstance(error.response.data, dict) else {}
    code = str(data.get("error") or f"HTTP {status}")[:100]
    retryable = status in (408, 429) or status >= 500 or code in _TRANSIENT
    delay: timedelta | None = None
    after = str(
        error.response.headers.get("Retry-After") or error.response.headers.get("retry-after") or ""
    )
    if retryable and after.isdigit():
        delay = timedelta(seconds=min(int(after), 300))
    return ApplicationError(
        f"Slack refused {method}: {code}",
        type="SlackUnavailable" if retryable else "SlackRefused",
        non_retryable=not retryable,
        next_retry_delay=delay,
    )


def _encode(posted: list[str]) -> str:
    """What was posted, as ``channel:ts`` joined by ``;``, within :data:`POSTED_BYTES` (``;+``
    ends it when some were left out)."""
    out = ""
    for i, ref in enumerate(posted):
        joined = f"{out};{ref}" if out else ref
        if len(joined.encode()) > POSTED_BYTES - 2:
            return out + ";+" if i else joined[: POSTED_BYTES - 2] + ";+"
        out = joined
    return out


def _decode(posted: str) -> tuple[list[tuple[str, str]], bool]:
    refs: list[tuple[str, str]] = []
    more = False
    for part in posted.split(";"):
        if part == "+":
            more = True
            continue
        channel, _, ts = part.partition(":")
        if _CHANNEL_ID.fullmatch(channel) and re.fullmatch(r"\d{1,12}\.\d{1,8}", ts):
            refs.append((channel, ts))
    return refs, more


# -- the messages ------------------------------------------------------------------------------


def _date(moment: Any) -> str:
    """A time as Slack shows it in each reader's own time zone (UTC as the fallback)."""
    epoch = int(moment.timestamp())
    fallback = moment.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{epoch}^{{date_short_pretty}} {{time}}|{fallback}>"


def action_value(note: NotifyInput) -> str:
    """What an *Approve* or *Deny* button carries back: the chat, the call and the digest of the
    input the message shows. Nothing secret: the click is verified, and answered as its
    clicker, by the conversation's own rules."""
    request = note.interrupt
    value = json.dumps(
        {"chat": note.chat_id, "ref": request.ref, "digest": request.input_digest},
        separators=(",", ":"),
    )
    if len(value) > _VALUE:
        raise ApplicationError(
            "the chat id is too long for a Slack button", type="SlackRefused", non_retryable=True
        )
    return value


def paused_message(note: NotifyInput, *, inbox_url: str | None) -> tuple[list[Any], str]:
    """The Block Kit blocks and the fallback text of a paused call's message."""
    request = note.interrupt
    shown = request.shown
    title = shown.title if shown else request.name
    summary = shown.summary if shown else ""
    blocks: list[Any] = [
        {"type": "header", "text": _plain(f"{heading(note.kind)}: {title}", _HEADER)},
    ]
    lines = [f"*{_cut(summary, 600)}*"] if summary else []
    if shown and shown.why:
        lines.append(_cut(shown.why, 600))
    if lines:
        blocks.append(_section("\n".join(lines)))
    if shown and shown.fields:
        blocks.append(
            {
                "type": "section",
                # Verbatim like every other text: no URL, channel name or mention that a
                # value spells out is linked or parsed by Slack.
                "fields": [
                    _md(truncate(f"*{mrkdwn(f.label)}*\n{mrkdwn(f.value)}", _FIELD))
                    for f in shown.fields[:_FIELDS]
                ],
            }
        )
    if shown and shown.risk:
        note_text = f": {_cut(shown.risk_note, 300)}" if shown.risk_note else ""
        blocks.append(_section(f":warning: *Risk {shown.risk}*{note_text}"))
    if shown and shown.asked:
        quoted = "\n".join(f">{line}" for line in _cut(shown.asked, _ASKED).split("\n"))
        blocks.append(_section(f"*Asked*\n{quoted}"))
    if shown and shown.said:
        blocks.append(_section(f"*The agent said*\n{_cut(shown.said, _ASKED)}"))
    blocks.append({"type": "context", "elements": [_md(_facts(note))]})
    blocks.append(
        {"type": "actions", "block_id": "tai_answer", "elements": _buttons(note, inbox_url)}
    )
    text = truncate(f"Approval needed: {title}" + (f": {summary}" if summary else ""), 300)
    return blocks, mrkdwn(text)


def _facts(note: NotifyInput) -> str:
    request = note.interrupt
    facts = [f"Agent *{_cut(note.agent, 100)}*"]
    if request.requester is not None:
        checked = "" if request.requester.verified else " (unverified)"
        facts.append(f"asked by *{_cut(request.requester.identity, 100)}*{checked}")
    if request.approvers:
        names = ", ".join(request.approvers[:10])
        extra = len(request.approvers) - 10 + request.approvers_omitted
        facts.append(f"approvers: {_cut(names, 500)}" + (f" and {extra} more" if extra > 0 else ""))
    if request.quorum > 1:
        facts.append(f"votes {len(request.votes)} of {request.quorum}")
    if request.deadline is not None:
        facts.append(f"answer by {_date(request.deadline)}")
    return truncate(" · ".join(facts), _CONTEXT)


def _buttons(note: NotifyInput, inbox_url: str | None) -> list[Any]:
    buttons: list[Any] = []
    if note.interrupt.source != "input":
        value = action_value(note)
        buttons += [
            {
                "type": "button",
                "action_id": APPROVE,
                "text": _plain("Approve", 75),
                "style": "primary",
                "value": value,
            },
            {
                "type": "button",
                "action_id": DENY,
                "text": _plain("Deny", 75),
                "style": "danger",
                "value": value,
            },
        ]
    if inbox_url:
        buttons.append(
            {
                "type": "button",
                "action_id": OPEN,
                "text": _plain("Open", 75),
                "url": f"{inbox_url}/inbox",
            }
        )
    return buttons


def settled_message(note: NotifyInput) -> tuple[list[Any], str]:
    """The blocks and text a message is updated to when its call ended: no buttons."""
    request = note.interrupt
    title = request.shown.title if request.shown else request.name
    summary = request.shown.summary if request.shown else ""
    ended = _ENDED.get(note.settled or "withdrawn", "Ended")
    by = ""
    if note.settled_by:
        by = f" by {_cut(note.settled_by, 200)}"
    why = {
        "expired": "no answer came in time",
        "withdrawn": "the call is no longer waiting",
        "cancelled": "the turn was cancelled",
    }.get(note.settled or "", "")
    blocks: list[Any] = [
        {"type": "header", "text": _plain(f"{ended}: {title}", _HEADER)},
    ]
    if summary:
        blocks.append(_section(f"*{_cut(summary, 600)}*"))
    blocks.append(
        {
            "type": "context",
            "elements": [
                _md(
                    f"{ended}{by}"
                    + (f": {why}" if why else "")
                    + f" · Agent *{_cut(note.agent, 100)}*"
                )
            ],
        }
    )
    text = truncate(f"{ended}{by}: {title}", 300)
    return blocks, mrkdwn(text)


def _cut(text: str, limit: int) -> str:
    return mrkdwn(truncate(text, limit))


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": truncate(text, limit), "emoji": False}


def _md(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _md(truncate(text, _SECTION))}


__all__ = ["EVENT_TYPE", "SlackChannel", "SlackDirectory", "mrkdwn"]

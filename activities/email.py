"""The email channel: each approver of a paused call gets a message with a one-time link.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

:class:`EmailChannel` is a :class:`~activities.notify.Channel`: the ``notify`` activity calls
:meth:`EmailChannel.announce` when a call pauses. It finds each approver's address (an approver
that is an address is its own; others, and the members of ``group:NAME`` entries, through the
directory it is given), writes one message per approver (plain text and HTML, the call as every
surface shows it) with a link to the web app's answer view signed for that approver alone
(``activities/answer_links.py``), and sends them over SMTP (``aiosmtplib``, on the activity's event
loop). An email cannot be changed once sent, so the end of a call posts nothing.

Secrets (the SMTP password and the link key) live on this object, on the worker: they are never
in a notification's input, history, or a log line, and a failure's message (which the audit
trail records) is scrubbed of the password before it leaves.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from html import escape
from typing import Literal

import aiosmtplib
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.answer_links import LINK_LIFETIME, AnswerLinks
from temporal_agent_interrupts.activities.notify import heading
from temporal_agent_interrupts.workflows.activity_io import NotifyInput
from temporal_agent_interrupts.workflows.text import truncate, visible
from temporal_agent_interrupts.workflows.types import InterruptRequest

log = logging.getLogger(__name__)

Security = Literal["starttls", "ssl", "none"]

SMTP_TIMEOUT = 10.0
"""Seconds one SMTP step (connect, a command) may take: well within the ``notify`` activity's
own timeout, which Temporal retries."""

MAX_RECIPIENTS = 50
"""The most approvers one paused call is emailed to (past it, the first in the approver lists'
order)."""

_PORTS: dict[Security, int] = {"starttls": 587, "ssl": 465, "none": 25}


@dataclass(frozen=True)
class _Recipient:
    identity: str
    address: str
    groups: tuple[str, ...] = field(default=())


def _is_address(text: str) -> bool:
    name, address = parseaddr(text)
    return (
        not name
        and address == text
        and text.count("@") == 1
        and all(part for part in text.split("@"))
        and not any(c.isspace() or ord(c) < 0x20 for c in text)
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ----------------------------------------------------------------------------------------------
# The presentation, as rows of text: the email's body, and the answer view's (client/answer_view).


def when(at: datetime) -> str:
    """A time as the messages and the answer view show it."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def title_and_summary(call: InterruptRequest) -> tuple[str, str]:
    """The call's title and one-line summary (a call written before presentations existed
    shows its tool's name and its input)."""
    if call.shown is not None:
        return call.shown.title, call.shown.summary
    name = visible(truncate(call.name, 100))
    raw = json.dumps(call.input, ensure_ascii=False, sort_keys=True)
    return name, visible(truncate(raw, 300))


def rows(call: InterruptRequest) -> list[tuple[str, str]]:
    """What a person is shown of ``call``, label and value, each plain text already made
    visible and cut by the conversation (escape it for your markup)."""
    out: list[tuple[str, str]] = []
    shown = call.shown
    if shown is not None:
        if shown.why:
            out.append(("Why it waits", shown.why))
        if shown.risk is not None:
            note = f": {shown.risk_note}" if shown.risk_note else ""
            out.append(("Risk", f"{shown.risk}{note}"))
        out.extend((f.label, f.value) for f in shown.fields)
        if shown.fields_omitted:
            out.append(("More", f"{shown.fields_omitted} more field(s) not shown here"))
    if call.requester is not None:
        how = "verified" if call.requester.verified else "as they said"
        out.append(("Requested by", f"{visible(call.requester.identity[:256])} ({how})"))
    if shown is not None and shown.asked:
        out.append(("The request", shown.asked))
    if shown is not None and shown.said:
        out.append(("The agent said", shown.said))
    if call.quorum > 1 or call.votes:
        voters = ", ".join(visible(v.identity[:256]) for v in call.votes[:10]) or "none yet"
        out.append(("Approvals", f"{len(call.votes)} of {call.quorum} ({voters})"))
    if call.deadline is not None:
        out.append(("Deadline", when(call.deadline)))
    return out


def html_rows(call: InterruptRequest) -> str:
    """:func:`rows` as an HTML table, every value escaped."""
    cells = "".join(
        f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>" for label, value in rows(call)
    )
    return f"<table>{cells}</table>"


def text_rows(call: InterruptRequest) -> str:
    """:func:`rows` as plain text, a value's later lines indented under its label."""
    lines = []
    for label, value in rows(call):
        first, *rest = value.splitlines() or [""]
        lines.append(f"{label}: {first}")
        lines.extend(f"    {line}" for line in rest)
    return "\n".join(lines)


class EmailChannel:
    """Emails each approver of a paused call a link that answers it, once.

    Give the web app the same ``link_key`` (``agents_app(link_keys=[...])``): the link opens
    its answer view (``GET /answer/{token}``, which shows the call and answers nothing), and
    the approver confirms there with a POST.

    Args:
        host: The SMTP server (a relay, or your provider's submission host).
        sender: The From address (``approvals@example.com``); its domain names the messages'
            Message-IDs.
        app_url: The web app's public URL (``https://approvals.example.com``), under which
            ``/answer/{token}`` and ``/inbox`` are served.
        link_key: The secret the links are signed with (HMAC-SHA256, at least 32 bytes), the
            same as the web app's; keep it, like the password, in the worker's secret store.
        port: The SMTP port (default: 587 for STARTTLS, 465 for SSL, 25 for none).
        security: ``"starttls"`` (upgrade after connecting, required), ``"ssl"`` (TLS from the
            first byte), or ``"none"`` (plain, for a relay on this machine only).
        username: The SMTP login, if the server asks for one.
        password: Its password: kept on this object alone, never logged nor put in history.
        directory: Approver identity to address, for identities that are not addresses
            (``{"ann": "ann@example.com"}``); an identity that is an address needs no entry.
        groups: ``group:NAME`` approvers' members by group name (``{"finance": ["ann",
            "bo@example.com"]}``), each an identity as above.
        link_lifetime: How long a link answers (the call's deadline may end it sooner).
        timeout: Seconds each SMTP step may take.
        tls_context: The TLS settings (default: the system's trust store, hostnames checked).

    Raises:
        ValueError: a sender or app URL that is not one, a link key shorter than 32 bytes, or a
            password sent in the clear to a server that is not on this machine.
    """

    def __init__(
        self,
        *,
        host: str,
        sender: str,
        app_url: str,
        link_key: bytes | str,
        port: int | None = None,
        security: Security = "starttls",
        username: str | None = None,
        password: str | None = None,
        directory: Mapping[str, str] | None = None,
        groups: Mapping[str, Sequence[str]] | None = None,
        link_lifetime: timedelta = LINK_LIFETIME,
        timeout: float = SMTP_TIMEOUT,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        if not _is_address(sender):
            raise ValueError("sender is an email address (approvals@example.com), nothing more")
        if not app_url.startswith(("https://", "http://")) or any(c.isspace() for c in app_url):
            raise ValueError("app_url is the web app's public URL, https://...")
        if security not in _PORTS:
            raise ValueError("security is 'starttls', 'ssl' or 'none'")
        if security == "none" and password is not None and not _loopback(host):
            raise ValueError(
                "security='none' would send the SMTP password in the clear: use 'starttls' or "
                "'ssl' for a server that is not on this machine"
            )
        self.host = host
        self.port = port if port is not None else _PORTS[security]
        self.security: Security = security
        self.sender = sender
        self.app_url = app_url.rstrip("/")
        self.username = username
        self._password = password
        self._links = AnswerLinks(link_key, lifetime=link_lifetime)
        self.directory = dict(directory or {})
        self.groups = {name: tuple(members) for name, members in (groups or {}).items()}
        self.timeout = timeout
        self._tls = tls_context

    def __repr__(self) -> str:
        # Never the password nor the link key.
        return (
            f"EmailChannel(host={self.host!r}, port={self.port}, security={self.security!r}, "
            f"sender={self.sender!r})"
        )

    # -- the Channel protocol ----------------------------------------------------------------

    async def announce(self, note: NotifyInput) -> str | None:
        """Email each approver of ``note.interrupt`` its link. Returns None: nothing sent can be
        updated.

        SMTP cannot be exactly once: a server that took a message and whose reply was lost, or
        an attempt cut short after some messages went, makes the retried attempt send them
        again. Each attempt sends at most one message per approver, and each message's
        Message-ID is made from the notification's key and the approver, so a retry's copy is
        the same message to mail clients and archives.

        Raises:
            ApplicationError: no approver has an address (not retried), or the server refused
                (a 5xx reply: not retried; a 4xx or no answer: retried).
        """
        if note.kind == "settled":
            # An email cannot be changed once sent: its link says the call's end when opened.
            return None
        call = note.interrupt
        recipients = self.recipients(call)
        if not recipients:
            raise ApplicationError(
                "no approver of this call has an email address (an approver that is not one "
                "needs an entry in the channel's directory, a group its members in groups=)",
                type="NoRecipients",
                non_retryable=True,
            )
        messages = [self.message(note, r) for r in recipients]
        await self._send(messages)
        log.info(
            "emailed %d approver(s) of %s (ref %s) of chat %s",
            len(messages),
            call.name[:100],
            call.ref[:100],
            note.chat_id[:100],
        )
        return None

    async def settle(self, note: NotifyInput, posted: str) -> None:
        """Nothing: an email cannot be changed once sent (a link of a call that ended answers
        nothing, and its page says who answered)."""
        return

    # -- parts ---------------------------------------------------------------------------------

    def address_of(self, identity: str) -> str | None:
        """An approver's address: the directory's, else the identity when it is one."""
        found = self.directory.get(identity)
        if found is not None:
            return found if _is_address(found) else None
        return identity if _is_address(identity) else None

    def recipients(self, call: InterruptRequest) -> list[_Recipient]:
        """Whom ``call`` is emailed to: each approver once, groups expanded through the
        directory, those who voted already left out."""
        voted = {v.identity for v in call.votes}
        found: dict[str, _Recipient] = {}

        def add(identity: str, group: str | None) -> None:
            address = self.address_of(identity)
            if address is None or identity in voted:
                return
            had = found.get(identity)
            groups = (*(had.groups if had else ()), *((group,) if group else ()))
            found[identity] = _Recipient(identity, address, tuple(dict.fromkeys(groups)))

        for entry in call.approvers:
            if entry.startswith("group:"):
                name = entry.removeprefix("group:")
                for member in self.groups.get(name, ()):
                    add(member, name)
            else:
                add(entry, None)
        unmapped = [a for a in call.approvers if not a.startswith("group:")]
        missing = sum(1 for a in unmapped if self.address_of(a) is None)
        if missing:
            log.warning(
                "%d approver(s) of %s (ref %s) have no email address in the channel's directory",
                missing,
                call.name[:100],
                call.ref[:100],
            )
        return list(found.values())[:MAX_RECIPIENTS]

    def link(self, note: NotifyInput, recipient: _Recipient) -> str:
        """The answer view's URL for ``recipient``, signed for them and this pause alone."""
        call = note.interrupt
        token = self._links.sign(
            agent=note.agent,
            chat_id=note.chat_id,
            ref=call.ref,
            input_digest=call.input_digest,
            since=call.since.isoformat() if call.since else "",
            identity=recipient.identity,
            groups=recipient.groups,
        )
        return f"{self.app_url}/answer/{token}"

    def message(self, note: NotifyInput, recipient: _Recipient) -> EmailMessage:
        """One approver's message: the call as every surface shows it, and their link."""
        call = note.interrupt
        title, summary = title_and_summary(call)
        link = self.link(note, recipient)
        until = datetime.now(UTC) + self._links.lifetime
        if call.deadline is not None and call.deadline < until:
            until = call.deadline
        expires = until.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        where = (
            f"Agent {visible(note.agent[:100])}, conversation {visible(note.chat_id[:100])}, "
            f"call {visible(call.ref[:100])}"
        )
        text = "\n".join(
            [
                title,
                summary,
                "",
                text_rows(call),
                "",
                f"Approve or deny (this link is yours, answers once, until {expires}):",
                link,
                "",
                f"Or open the inbox: {self.app_url}/inbox",
                "",
                where,
            ]
        )
        html = (
            '<!doctype html><html><body style="font-family:sans-serif">'
            f"<h2>{escape(title)}</h2><p><strong>{escape(summary)}</strong></p>"
            f"{html_rows(call)}"
            f'<p><a href="{escape(link, quote=True)}">Approve or deny</a> '
            f"(this link is yours, answers once, until {escape(expires)})</p>"
            f'<p>Or open the <a href="{escape(self.app_url, quote=True)}/inbox">inbox</a>.</p>'
            f'<p style="color:#666;font-size:small">{escape(where)}</p></body></html>'
        )
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = recipient.address
        msg["Subject"] = subject(f"{heading(note.kind)}: {summary}")
        msg["Message-ID"] = message_id(note.key, recipient.identity, self.sender)
        msg["Date"] = formatdate(usegmt=True)
        # RFC 3834: no vacation replies to a robot's message.
        msg["Auto-Submitted"] = "auto-generated"
        msg.set_content(text)
        msg.add_alternative(html, subtype="html")
        return msg

    async def _send(self, messages: Sequence[EmailMessage]) -> None:
        smtp = aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            use_tls=self.security == "ssl",
            start_tls=self.security == "starttls",
            timeout=self.timeout,
            tls_context=self._tls,
        )
        try:
            async with smtp:
                if self.username is not None:
                    await smtp.login(self.username, self._password or "")
                for msg in messages:
                    await smtp.send_message(msg)
        except aiosmtplib.SMTPResponseException as e:
            # 5xx is the server's final word (a refused login, a refused sender); 4xx is "later".
            raise ApplicationError(
                f"the SMTP server refused: {e.code} {self._scrub(e.message)}",
                type="SMTPRefused",
                non_retryable=e.code >= 500,
            ) from None
        except (aiosmtplib.SMTPException, OSError) as e:
            raise ApplicationError(
                f"the SMTP server did not answer: {type(e).__name__}: {self._scrub(str(e))}",
                type="SMTPUnavailable",
            ) from None

    def _scrub(self, text: str) -> str:
        """A server's words, cut, without the password (a server may echo what it was sent)."""
        if self._password:
            text = text.replace(self._password, "***")
        return visible(truncate(text, 300))


def subject(text: str) -> str:
    """A Subject header's value from text a model or a user wrote (a call's summary).

    The conversation made it visible (no line breaks), but an RFC 2047 encoded word in it
    (``=?utf-8?b?DQo...?=``) would be decoded by the email package as the header is set, line
    breaks and all: headers, or a whole body, written into the message. ``=?`` never starts one
    here (``= ?``); the text otherwise reads as it was, and is encoded as the package sees fit.
    """
    return truncate(text, 150).replace("=?", "= ?")


def message_id(key: str, identity: str, sender: str) -> str:
    """The Message-ID of the message to ``identity`` about the pause ``key``: the same for
    every attempt, different for every approver and every pause."""
    digest = hashlib.sha256(f"{key}\0{identity}".encode()).hexdigest()[:40]
    domain = sender.rpartition("@")[2] or "localhost"
    return f"<{digest}.answer@{domain}>"


__all__ = [
    "MAX_RECIPIENTS",
    "SMTP_TIMEOUT",
    "EmailChannel",
    "html_rows",
    "message_id",
    "rows",
    "subject",
    "text_rows",
    "title_and_summary",
    "when",
]

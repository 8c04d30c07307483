"""The answer view: where an email's link lands, and the one POST that answers through it.

Internal: not covered by the 0.1.x stability promise; the web app serves it when made with
``agents_app(link_keys=...)`` (``temporal_agent_interrupts.web``), and the email channel
(``temporal_agent_interrupts.hosting.EmailChannel``) renders its messages with the same
presentation.

``GET /answer/{token}`` shows the call the link names, as every surface shows it (the
presentation the conversation wrote: summary, fields, risk, requester, the user's request and
the model's words, votes, deadline), with Approve and Deny in a form. A GET never answers: mail
scanners and link previews follow links. ``POST /answer/{token}`` answers once, through the
same path as every other door of the web app (``resume_checked``: the agent's approvers,
quorum, the digest of the input the email showed, exactly once), with the link's approver as
the identity. For agents with ``trust=``, the app's ``LoginExchange`` signs the per-answer
assertion, as for a login: the link is the login.

A link is one-time without any state here (``activities/answer_links.py``): once its answer is
applied, the call is no longer pending, or the approver's vote is on it, and a link used again
is refused before anything is sent. A token that does not verify (changed, cut, signed by
another key) or has expired is refused before the conversation is asked anything.

Everything shown comes from a conversation, and so from whoever talked to it: it is escaped
for HTML here, and the page runs no script (its Content-Security-Policy allows none, one
stylesheet by its hash, and forms posted to this app only).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Awaitable, Callable
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from temporal_agent_interrupts.activities.answer_links import AnswerLinks, LinkClaims, LinkRefused
from temporal_agent_interrupts.activities.email import html_rows, title_and_summary, when
from temporal_agent_interrupts.client.login import Login, LoginExchange
from temporal_agent_interrupts.errors import AgentError, ChatNotFound, ResumeRejected
from temporal_agent_interrupts.workflows.text import visible
from temporal_agent_interrupts.workflows.types import InterruptRequest, StatusResult

if TYPE_CHECKING:
    from temporal_agent_interrupts.client.web import _App

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 4096
"""The answer form's body: an action and a reason of at most 1,024 characters, encoded."""

MAX_REASON = 1024

VIA = "answer link"
"""The audit record's ``metadata["via"]`` of an answer made through a link."""


# ----------------------------------------------------------------------------------------------
# Pages.

_STYLE = (
    "body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;"
    "color:#1b1b1b}h1{font-size:1.4rem}p.summary{font-size:1.15rem;font-weight:600}"
    "table{border-collapse:collapse;margin:1rem 0}th{text-align:left;vertical-align:top;"
    "padding:.25rem 1rem .25rem 0;color:#555;font-weight:500;white-space:nowrap}"
    "td{white-space:pre-wrap;word-break:break-word;padding:.25rem 0}"
    "button{font:inherit;padding:.5rem 1.25rem;margin-right:.75rem;border-radius:.3rem;"
    "border:1px solid #888;cursor:pointer}button.approve{background:#1f7a3a;color:#fff;"
    "border-color:#1f7a3a}button.deny{background:#fff;color:#a11}"
    "textarea{width:100%;font:inherit}.refused{color:#a11}.small{color:#555;font-size:.9rem}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

CSP = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'none'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""No script at all; the one inline stylesheet by its hash; forms post to this app only."""


def page(status: int, heading: str, body: str) -> HTMLResponse:
    """An HTML page under the view's headers. ``heading`` is text; ``body`` is HTML already
    escaped by the caller."""
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="robots" content="noindex">'
        f"<title>{escape(heading)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escape(heading)}</h1>{body}</body></html>"
    )
    return HTMLResponse(
        html,
        status_code=status,
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            # The token is in the URL: no other site may be told it. Not "no-referrer": a
            # browser then sends the form's POST with "Origin: null", which the app refuses as
            # a request from another site (found by tests/test_email_answer_page.py).
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
            "X-Robots-Tag": "noindex",
        },
    )


def refused(status: int, heading: str, reason: str) -> HTMLResponse:
    return page(status, heading, f'<p class="refused">{escape(reason)}</p>')


class Refusal(Exception):
    """A link that answers nothing now: the page that says why."""

    def __init__(self, status: int, heading: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.heading = heading
        self.reason = reason


# ----------------------------------------------------------------------------------------------
# The routes.


class AnswerView:
    """``GET`` and ``POST /answer/{token}`` for the web app ``app``, verifying with ``links``."""

    def __init__(self, app: _App, links: AnswerLinks) -> None:
        self.app = app
        self.links = links

    def guarded(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Every refusal as a page a person reads (these are opened from an email, not by a
        program), never a reason from inside."""
        from temporal_agent_interrupts.client.web import Problem, agent_problem

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Refusal as r:
                return refused(r.status, r.heading, r.reason)
            except Problem as p:
                return refused(p.status, p.title, p.detail)
            except AgentError as e:
                p = agent_problem(e)
                return refused(p.status, p.title, p.detail)
            except Exception:
                log.exception("%s of an answer link failed", request.method)
                return refused(500, "Something went wrong", "internal error (logged by the app)")

        return run

    def claims(self, request: Request) -> LinkClaims:
        try:
            return self.links.verify(request.path_params["token"])
        except LinkRefused as e:
            expired = "expired" in str(e)
            raise Refusal(
                410 if expired else 403,
                "This link has expired" if expired else "This link is not valid",
                str(e),
            ) from None

    async def pending(self, claims: LinkClaims) -> InterruptRequest:
        """The call the link answers, as the conversation holds it now.

        Raises:
            Refusal: no such chat for the link's agent, the call was answered (by this link or
                any other door), paused again since, its input changed, or this approver's
                vote is on it already.
        """
        chat = self.app.chat(claims.chat_id, claims.agent)
        try:
            status = await chat.status(worker_timeout=self.app.worker_timeout)
        except ChatNotFound:
            raise Refusal(404, "Not found", "the conversation this link names is gone") from None
        if status.agent != claims.agent:
            raise Refusal(404, "Not found", "the conversation this link names is gone")
        call = {i.ref: i for i in status.pending}.get(claims.ref)
        if call is None or (claims.since and call.since and call.since.isoformat() != claims.since):
            raise Refusal(409, "Already answered", _settled(status, claims))
        if call.input_digest != claims.input_digest:
            raise Refusal(
                409,
                "The call changed",
                "the call's input is no longer what this email showed: open the inbox to see "
                "it as it is now",
            )
        if any(v.identity == claims.identity for v in call.votes):
            raise Refusal(
                409,
                "Already answered",
                "this link was used already: your approval is on record, and the call waits "
                f"for {max(call.quorum - len(call.votes), 0)} more",
            )
        return call

    async def show(self, request: Request) -> Response:
        """The call and the form. Reads only (a query: no event in the chat's history)."""
        claims = self.claims(request)
        call = await self.pending(claims)
        title, summary = title_and_summary(call)
        action = "/answer/" + quote(request.path_params["token"], safe="")
        body = (
            f'<p class="summary">{escape(summary)}</p>'
            f"{html_rows(call)}"
            f'<p class="small">You answer as {escape(visible(claims.identity))}. '
            f"This link answers once, until {escape(when(claims.expires_at))}.</p>"
            f'<form method="post" action="{escape(action)}">'
            '<p><label for="reason">A reason, if you deny (optional)</label><br>'
            f'<textarea id="reason" name="reason" rows="2" maxlength="{MAX_REASON}"></textarea>'
            "</p>"
            '<button class="approve" type="submit" name="action" value="approve">Approve</button>'
            '<button class="deny" type="submit" name="action" value="deny">Deny</button>'
            "</form>"
        )
        return page(200, title, body)

    async def answer(self, request: Request) -> Response:
        """The one answer this link makes."""
        from temporal_agent_interrupts.client.web import Access, _Identity, read_body

        claims = self.claims(request)
        form = _form(await read_body(request, limit=MAX_FORM_BYTES))
        action = form.get("action", "")
        reason = form.get("reason", "")
        if action not in ("approve", "deny"):
            raise Refusal(400, "Nothing was chosen", "choose Approve or Deny on the page")
        if len(reason) > MAX_REASON:
            raise Refusal(400, "Too long", f"a reason is at most {MAX_REASON} characters")
        await self.app.allow(
            request,
            Access(
                action="answer",
                chat_id=claims.chat_id,
                agent=claims.agent,
                identity=claims.identity,
            ),
        )
        chat = self.app.chat(claims.chat_id, claims.agent)
        if isinstance(self.app.identity, LoginExchange):
            # The link is the login: the exchange signs this answer's assertion for the
            # approver the link names, with the groups the channel reached them through.
            who = _Identity(
                identity=claims.identity,
                login=Login(identity=claims.identity, groups=claims.groups),
            )
        else:
            who = _Identity(identity=claims.identity)
        if who.carries_token:
            await self.app.may_receive_token(chat)
        call = await self.pending(claims)
        shown = call.model_copy(update={"input_digest": claims.input_digest})
        given = shown.approve() if action == "approve" else shown.deny(reason)
        try:
            result = await self.app.answer_as(
                chat, who, given, claims.input_digest, metadata={"via": VIA}
            )
        except ResumeRejected as e:
            # Another door answered first, or this link's own earlier POST did (the
            # conversation refuses a second answer, and a second vote of one approver).
            from temporal_agent_interrupts.client.web import agent_problem

            p = agent_problem(e)
            raise Refusal(p.status, "Not answered", p.detail) from None
        del result  # what the turn did next is the chat's to read, not the link holder's
        done = "approved" if action == "approve" else "denied"
        more = ""
        if action == "approve" and call.quorum > len(call.votes) + 1:
            left = call.quorum - len(call.votes) - 1
            more = f" It waits for {left} more approval{'s' if left > 1 else ''}."
        return page(
            200,
            "Approved" if action == "approve" else "Denied",
            f"<p>You {done} {escape(title_and_summary(call)[1])}.{escape(more)}</p>"
            '<p class="small">This link answers nothing more.</p>',
        )


def _form(raw: bytes) -> dict[str, str]:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "Bad request", "the form is not URL-encoded") from None
    try:
        parsed = parse_qs(text, keep_blank_values=True, max_num_fields=4, strict_parsing=False)
    except ValueError:
        raise Refusal(400, "Bad request", "the form has fields this page never sends") from None
    return {k: v[0] for k, v in parsed.items() if v}


def _settled(status: StatusResult, claims: LinkClaims) -> str:
    """Who answered the call, as the conversation's newest records say."""
    for record in reversed(status.recent_answers):
        if (
            record.ref != claims.ref
            or record.kind in ("notified", "sub_agent")
            or record.verdict == "refused"
        ):
            continue
        by = f" by {visible(record.identity[:256])}" if record.identity else ""
        decision = record.decision or "answered"
        return f"this call was {decision}{by} at {when(record.at)}: this link answers nothing more"
    return "this call is no longer waiting for an answer: this link answers nothing more"


__all__ = ["CSP", "VIA", "AnswerView"]

"""Slack's interactivity endpoint: an *Approve* or *Deny* click on a paused call's message,
answered through the approvals path as the person the team's directory says clicked.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.web``.

``agents_app(client, slack=SlackInteractivity(signing_secret=..., directory=...))`` serves
``POST /slack/interactivity``, the Request URL of the Slack app's Interactivity settings. Each
request, in this order:

1. Its signature is checked with the app's signing secret (``slack_sdk.signature``: HMAC of
   the timestamp and the body, within five minutes), and a request seen before (the same
   signature again) is refused: 401 before anything else is read, so a forged, tampered, stale
   or replayed click leaves nothing anywhere.
2. The clicking Slack user id (from the signed payload, never a display name) is mapped to an
   identity by the :class:`~activities.slack.SlackDirectory`; a user not in it, or of another
   workspace, is told so and nothing is applied.
3. Slack gets its 200 at once (it gives up after three seconds, and a conversation's worker
   may take longer to take an answer). The answer is then sent as the web app sends every
   answer (``resume_checked``: a token goes only to a run on a trusted queue), bound to the
   input digest the message showed, as the mapped identity: behind a ``LoginExchange``, with
   an assertion the app signs for that answer (agents with ``trust=``); otherwise as asserted.
   The conversation checks approvers and quorum, and applies it once.
4. The clicker is told what came of it in an ephemeral message (the click's ``response_url``):
   taken, refused and why, or, for a call no longer waiting, who answered it or that it
   expired (from the audit trail). The message itself is updated by the worker's
   ``SlackChannel`` when the call ends, whichever door answered it.

The app's ``authorize`` rule is not asked: it reads the app's own logins, which a request from
Slack never carries; the directory is the rule for clicks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from temporal_agent_interrupts.activities.slack import APPROVE, DENY, SlackDirectory
from temporal_agent_interrupts.client.login import Login, LoginExchange
from temporal_agent_interrupts.client.web import (
    Problem,
    _App,  # the web app's state: this route is one of its doors
    _Identity,
    pending_call,
    read_body,
)
from temporal_agent_interrupts.errors import AgentError, ResumeRejected
from temporal_agent_interrupts.workflows.text import truncate
from temporal_agent_interrupts.workflows.types import AnswerRecord

log = logging.getLogger(__name__)

WINDOW_SECONDS = 5 * 60
"""How old a request's timestamp may be (Slack's own advice, and ``SignatureVerifier``'s)."""

MAX_BODY = 256 * 1024
"""The largest interactivity request read (a click's payload echoes its message's blocks)."""

SEEN = 10_000
"""Signatures kept to refuse a replay within :data:`WINDOW_SECONDS`: past it, requests are
refused (503) until the oldest leave the window, rather than one forgotten and replayable."""

SLACK_HOOKS = "https://hooks.slack.com/"


class Unverified(Exception):
    """A request that is not Slack's, or not now: answered 401, nothing more read."""


class Busy(Exception):
    """More signed requests within five minutes than the replay check keeps: answered 503."""


class SlackInteractivity:
    """Slack's interactivity endpoint for :func:`~temporal_agent_interrupts.web.agents_app`.

    Args:
        signing_secret: The Slack app's signing secret (Basic Information). Read it from the
            app's environment or secret store; it is never logged.
        directory: Who is who: the same :class:`~temporal_agent_interrupts.hosting.
            SlackDirectory` the worker's ``SlackChannel`` sends DMs through.
        response_urls: The prefix every click's ``response_url`` must have (Slack's hooks;
            a test's stand-in).
        seen: How many request signatures are kept to refuse replays (:data:`SEEN`). Kept per
            process: behind several replicas, route ``/slack/interactivity`` to one, or accept
            that a replay within five minutes may reach another (the conversation still applies
            each call's answer once).

    Raises:
        ValueError: an empty signing secret.
    """

    def __init__(
        self,
        *,
        signing_secret: str,
        directory: SlackDirectory,
        response_urls: str = SLACK_HOOKS,
        seen: int = SEEN,
    ) -> None:
        self._verifier = SignatureVerifier(signing_secret)
        self.directory = directory
        self.response_urls = response_urls
        self._capacity = seen
        self._seen: OrderedDict[str, int] = OrderedDict()

    def __repr__(self) -> str:
        return f"SlackInteractivity(users={len(self.directory.users)})"

    def endpoint(self, app: _App) -> Callable[[Request], Any]:
        """The route's handler, over the web app's state."""
        return functools.partial(self.handle, app)

    # -- the request ---------------------------------------------------------------------------

    async def handle(self, app: _App, request: Request) -> Response:
        body = await read_body(request, limit=MAX_BODY)
        try:
            self._verify(body, request)
        except Unverified as e:
            return Response(f"refused: {e}", status_code=401, media_type="text/plain")
        except Busy as e:
            return Response(f"refused: {e}", status_code=503, media_type="text/plain")
        click = _click(body)
        if click is None:
            return Response(status_code=200)  # not a button of ours (an Open link's click)
        return Response(status_code=200, background=BackgroundTask(self._answer, app, click))

    def _verify(self, body: bytes, request: Request) -> None:
        stamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        if not stamp.isdigit() or len(stamp) > 12 or not signature or len(signature) > 200:
            raise Unverified("not signed")
        if not self._verifier.is_valid(body=body, timestamp=stamp, signature=signature):
            raise Unverified("a bad or expired signature")
        now = int(time.time())
        while self._seen and next(iter(self._seen.values())) < now - WINDOW_SECONDS - 60:
            self._seen.popitem(last=False)
        key = hashlib.sha256(f"{stamp}:{signature}".encode()).hexdigest()
        if key in self._seen:
            raise Unverified("seen before")
        if len(self._seen) >= self._capacity:
            raise Busy("too many requests in five minutes")
        self._seen[key] = int(stamp)

    # -- the answer ----------------------------------------------------------------------------

    async def _answer(self, app: _App, click: Click) -> None:
        try:
            said = await self._apply(app, click)
        except Exception:
            log.exception("a Slack click on chat %s failed", click.chat_id[:100])
            said = "Something went wrong; nothing was applied. Try again, or open the inbox."
        await self._tell(click, said)

    async def _apply(self, app: _App, click: Click) -> str:
        directory = self.directory
        if directory.team is not None and click.team != directory.team:
            return "This Slack workspace is not the one the approvals are set up for."
        identity = directory.identity_of(click.user)
        if identity is None:
            return (
                "Your Slack account is not in the approvers' directory, so this click was not "
                "applied. Ask the team that runs the agent to add you."
            )
        chat = app.chat(click.chat_id)
        try:
            status = await chat.status(worker_timeout=app.worker_timeout)
            shown = pending_call(status, click.ref)
        except (Problem, AgentError):
            return await self._stale(app, click)
        if shown.input_digest != click.digest:
            # Edited since the message was posted (or a value not ours): the conversation would
            # refuse it as a conflict, which reads as "no longer waiting"; it still waits.
            return (
                "This call's input changed since this message was posted, so this click was not "
                "applied; nothing was changed. Open the inbox to see the call as it is now."
            )
        answer = shown.approve() if click.approve else shown.deny("denied in Slack")
        login = Login(identity=identity, groups=directory.groups_of(identity))
        who = _Identity(
            identity=identity, login=login if isinstance(app.identity, LoginExchange) else None
        )
        token = app.token_for(who, chat, {click.ref: click.digest}, None, [answer])

        async def accepted(run_id: str | None) -> None:
            turn = chat.resume_stream(
                answers=[answer],
                identity=identity,
                identity_token=token,
                metadata={"via": "slack", "slack_user": click.user},
                worker_timeout=app.worker_timeout,
                run_id=run_id,
            )
            try:
                await turn.accepted()
            finally:
                await turn.close()

        try:
            await app.resume_checked(chat, who, accepted)
        except ResumeRejected as e:
            if e.code == "conflict":
                return await self._stale(app, click)
            return f"Not applied: {truncate(str(e), 500)}"
        except Problem as e:
            return f"Not applied: {truncate(e.detail, 500)}"
        verb = "approval" if click.approve else "denial"
        more = f" (it needs {shown.quorum} approvals)" if click.approve and shown.quorum > 1 else ""
        return f"Your {verb} of {shown.shown.title if shown.shown else shown.name} was taken{more}."

    async def _stale(self, app: _App, click: Click) -> str:
        """What became of a call that is no longer waiting, from the audit trail."""
        try:
            records = await app.client.audit(click.chat_id)
        except AgentError:
            records = []
        last = _last_answer(records, click.ref)
        unchanged = "nothing was changed."
        if last is None:
            return f"This call is no longer waiting for an answer; {unchanged}"
        if last.decision == "expired" or last.via == "deadline":
            return f"This call expired before it was answered; {unchanged}"
        if last.via == "cancel":
            return f"This call was withdrawn: its turn was cancelled; {unchanged}"
        if last.via in ("grant", "policy"):
            rule = "a remembered decision" if last.via == "grant" else "the agent's policy"
            return f"This call was already decided ({last.decision}) by {rule}; {unchanged}"
        by = last.identity or "someone"
        what = last.decision or "answered"
        return f"This call was already answered ({what}) by {by}; {unchanged}"

    async def _tell(self, click: Click, text: str) -> None:
        if not click.response_url.startswith(self.response_urls):
            log.warning("a Slack click's response_url is not Slack's; nothing was said")
            return
        hook = WebhookClient(click.response_url, timeout=10)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(
                functools.partial(
                    hook.send,
                    text=truncate(text, 1000),
                    response_type="ephemeral",
                    replace_original=False,
                )
            )


class Click:
    """One verified click on an *Approve* or *Deny* button of ours."""

    def __init__(self, *, payload: dict[str, Any], action: dict[str, Any]) -> None:
        value = json.loads(str(action.get("value") or "{}"))
        self.approve = action.get("action_id") == APPROVE
        self.chat_id = str(value["chat"])
        self.ref = str(value["ref"])
        self.digest = str(value["digest"])
        self.user = str((payload.get("user") or {}).get("id") or "")
        self.team = str((payload.get("team") or {}).get("id") or "")
        self.response_url = str(payload.get("response_url") or "")


def _click(body: bytes) -> Click | None:
    """The click a verified request carries, or None (another kind of interaction)."""
    try:
        form = parse_qs(body.decode(), max_num_fields=5)
        payload = json.loads(form["payload"][0])
        if payload.get("type") != "block_actions":
            return None
        for action in payload.get("actions") or []:
            if action.get("action_id") in (APPROVE, DENY):
                return Click(payload=payload, action=action)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    return None


def _last_answer(records: list[AnswerRecord], ref: str) -> AnswerRecord | None:
    for record in reversed(records):
        if record.ref == ref and record.kind not in ("notified", "vote", "forwarded", "sub_agent"):
            return record
    return None


__all__ = ["SlackInteractivity"]

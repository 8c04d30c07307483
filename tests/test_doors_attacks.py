"""Attacks on the two new doors that answer paused calls (issue 49): Slack's interactivity
endpoint (``client/slack.py``) and its channel (``activities/slack.py``), and the email channel
(``activities/email.py``), its answer links (``activities/answer_links.py``) and the answer view
(``client/answer_view.py``).

Each test is one attack. The offline ones build what a channel writes, or what a door reads,
from hostile values; the others run against the dev server, the loopback Slack stand-in
(``tests/slack_standin.py``) and ``aiosmtpd`` on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import email
import email.policy
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlencode

import httpx2
import pytest
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval
from temporal_agent_interrupts.activities.answer_links import (
    MAX_TOKEN_CHARS,
    AnswerLinks,
    LinkRefused,
)
from temporal_agent_interrupts.activities.email import EmailChannel, html_rows
from temporal_agent_interrupts.activities.slack import (
    APPROVE,
    DENY,
    SlackDirectory,
    paused_message,
    settled_message,
)
from temporal_agent_interrupts.client import slack as slack_door
from temporal_agent_interrupts.client.answer_view import page
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.slack import (
    Busy,
    Click,
    SlackInteractivity,
    Unverified,
    _click,
)
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from temporal_agent_interrupts.workflows.activity_io import NotifyInput
from temporal_agent_interrupts.workflows.types import (
    InterruptRequest,
    Requester,
    Shown,
    ShownField,
    Vote,
)
from tests import slack_worker as w
from tests.helpers import assert_no_workflow_task_failed, eventually, history
from tests.slack_standin import (
    SIGNING_SECRET,
    Message,
    SlackStandIn,
    click_payload,
    signed,
    slack_standin,
)
from tests.test_email_links import KEY, link_of, smtp_server
from tests.test_email_links import channel as mail_channel
from tests.test_presentation import PAY, send_payment
from tests.web import served

pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")

HOSTILE = (
    "<!channel> <https://evil.example|click here> @here #general *bold* &amp; <script>x</script>"
)


def encoded_word(text: str) -> str:
    """``text`` as an RFC 2047 encoded word: what a mail reader shows decoded."""
    return "=?utf-8?b?" + base64.b64encode(text.encode()).decode() + "?="


def hostile_note(**more: Any) -> NotifyInput:
    call = InterruptRequest.model_validate(
        {
            "name": "sendPayment",
            "ref": "p1",
            "input": {"amount": 1},
            "since": datetime(2026, 12, 5, tzinfo=UTC),
            "approvers": ["cfo@example.com", HOSTILE],
            "input_digest": "sha256:abc",
            "deadline": datetime(2026, 12, 6, tzinfo=UTC),
            "quorum": 2,
            "votes": [Vote(identity=HOSTILE, at=datetime(2026, 12, 5, tzinfo=UTC))],
            "requester": Requester(identity=HOSTILE, verified=False),
            "shown": Shown(
                title=f"Send {HOSTILE}",
                summary=f"Pay {HOSTILE}",
                why=HOSTILE,
                fields=[
                    ShownField(label=HOSTILE, value=HOSTILE),
                    ShownField(label="To", value=HOSTILE),
                ],
                risk="high",
                risk_note=HOSTILE,
                asked=HOSTILE,
                said=HOSTILE,
            ),
            **more,
        }
    )
    return NotifyInput(
        agent=HOSTILE, chat_id="chat-1", channel="slack", kind="paused", key="k1", interrupt=call
    )


def _text_objects(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("type") in ("mrkdwn", "plain_text") and isinstance(node.get("text"), str):
            found.append(node)
        for value in node.values():
            found += _text_objects(value)
    elif isinstance(node, list):
        for value in node:
            found += _text_objects(value)
    return found


# ----------------------------------------------------------------------------------------------
# Slack's messages: model- and user-written values in mrkdwn.


def test_slack_every_mrkdwn_text_is_verbatim_and_no_value_writes_a_link_or_mention():
    """A value that spells ``<!channel>``, ``<https://evil|click>``, ``@here`` or ``#general``
    is escaped in every text object, and every mrkdwn object is ``verbatim`` (Slack's default,
    false, links URLs and channel names and parses some mentions in plain text). Before the fix
    the section's *fields* (each shown label and value) were not verbatim."""
    note = hostile_note()
    for blocks, fallback in (
        paused_message(note, inbox_url="https://approvals.example.com"),
        settled_message(note.model_copy(update={"settled": "approved", "settled_by": HOSTILE})),
    ):
        objects = _text_objects(blocks)
        assert objects
        for obj in objects:
            if obj["type"] == "mrkdwn":
                assert obj.get("verbatim") is True, obj
                # The only markup left is ours: Slack's date token, a quote's ``>``.
                stripped = re.sub(r"<!date\^\d+\^[^|<>]*\|[^<>]*>", "", obj["text"])
                stripped = re.sub(r"(?m)^>", "", stripped)
                assert "<" not in stripped and ">" not in stripped, obj
            else:
                assert obj.get("emoji") is False
        assert "<" not in fallback and "&lt;!channel&gt;" in fallback


# ----------------------------------------------------------------------------------------------
# Slack's interactivity endpoint, offline.


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"payload=",
        b"payload=%7Bnot%20json",
        b"payload=%5B%5D",  # a list
        b"payload=null",
        urlencode({"payload": json.dumps({"type": "view_submission"})}).encode(),
        urlencode({"payload": json.dumps({"type": "block_actions", "actions": "x"})}).encode(),
        urlencode(
            {"payload": json.dumps({"type": "block_actions", "actions": [{"action_id": APPROVE}]})}
        ).encode(),
        urlencode(
            {
                "payload": json.dumps(
                    {"type": "block_actions", "actions": [{"action_id": APPROVE, "value": "null"}]}
                )
            }
        ).encode(),
        urlencode(
            {
                "payload": json.dumps(
                    {
                        "type": "block_actions",
                        "actions": [{"action_id": DENY, "value": '["chat","ref","digest"]'}],
                    }
                )
            }
        ).encode(),
        b"&".join([b"a=1"] * 6) + b"&payload=%7B%7D",  # past the five fields read
        b"payload=\xff\xfe",
    ],
)
def test_slack_a_malformed_signed_payload_is_no_click(body: bytes):
    """Whatever a verified body holds that is not one of our buttons with a chat, a ref and a
    digest is taken as another kind of interaction: a 200 and nothing else, never an error."""
    assert _click(body) is None


def _signed_click(
    value: dict[str, Any],
    *,
    user: str = w.CFO,
    team: str = "T0TEAM",
    response_url: str = "https://hooks.slack.com/actions/T/1/x",
) -> Click:
    payload = {
        "type": "block_actions",
        "team": {"id": team} if team else None,
        "user": {"id": user},
        "response_url": response_url,
        "actions": [{"action_id": APPROVE, "value": json.dumps(value)}],
    }
    click = _click(urlencode({"payload": json.dumps(payload)}).encode())
    assert click is not None
    return click


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com.evil.example/actions/x",
        "https://hooks.slack.com@evil.example/actions/x",
        "http://hooks.slack.com/actions/x",
        "https://evil.example/https://hooks.slack.com/",
        "HTTPS://HOOKS.SLACK.COM/actions/x",  # not Slack's own spelling: not followed either
        "//hooks.slack.com/actions/x",
        "file:///etc/passwd",
        "",
    ],
)
async def test_slack_a_response_url_that_is_not_slacks_hooks_is_never_called(
    url: str, monkeypatch: pytest.MonkeyPatch
):
    called: list[str] = []

    class Recorder:
        def __init__(self, target: str, **_: Any) -> None:
            called.append(target)

        def send(self, **_: Any) -> None:
            pass

    monkeypatch.setattr(slack_door, "WebhookClient", Recorder)
    door = SlackInteractivity(signing_secret=SIGNING_SECRET, directory=w.DIRECTORY)
    await door._tell(_signed_click({"chat": "c", "ref": "r", "digest": "d"}, response_url=url), "x")
    assert called == []
    # Slack's own hooks are.
    good = "https://hooks.slack.com/actions/T/1/x"
    await door._tell(
        _signed_click({"chat": "c", "ref": "r", "digest": "d"}, response_url=good), "x"
    )
    assert called == [good]


async def test_slack_another_workspace_a_missing_team_or_an_unmapped_user_is_refused_first():
    """Refused before the app (its client, the chat) is touched at all: ``app`` is None here.
    A payload with no team (an Enterprise Grid org-level click, or a forged one) is refused
    when the directory names its workspace."""
    door = SlackInteractivity(signing_secret=SIGNING_SECRET, directory=w.DIRECTORY)
    value = {"chat": "c", "ref": "r", "digest": "d"}
    for team in ("T0OTHER", "", "t0team"):
        said = await door._apply(None, _signed_click(value, team=team))  # type: ignore[arg-type]
        assert "not the one the approvals are set up for" in said, team
    for user in (w.OUTSIDER, "", "cfo@example.com", "u0cfo"):
        said = await door._apply(None, _signed_click(value, user=user))  # type: ignore[arg-type]
        assert "not in the approvers' directory" in said, user


class _Headers:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


def test_slack_signature_headers_out_of_shape_are_401_and_the_replay_set_never_forgets_early():
    door = SlackInteractivity(signing_secret=SIGNING_SECRET, directory=w.DIRECTORY, seen=2)
    body, headers = signed({"type": "block_actions"})
    for bad in (
        {**headers, "x-slack-request-timestamp": "1" * 13},
        {**headers, "x-slack-request-timestamp": "-1"},
        {**headers, "x-slack-request-timestamp": "\uff11\uff17" + "\uff10" * 8},  # fullwidth
        {**headers, "x-slack-signature": "v0=" + "a" * 300},
        {**headers, "x-slack-signature": headers["x-slack-signature"].upper()},
        {"x-slack-request-timestamp": headers["x-slack-request-timestamp"]},
    ):
        with pytest.raises(Unverified):
            door._verify(body, _Headers(bad))  # type: ignore[arg-type]
    door._verify(body, _Headers(headers))  # type: ignore[arg-type]
    with pytest.raises(Unverified, match="seen before"):
        door._verify(body, _Headers(headers))  # type: ignore[arg-type]
    # Full: a new request waits (503) rather than the oldest being forgotten and replayable.
    other, other_headers = signed({"type": "block_actions", "n": 1})
    door._verify(other, _Headers(other_headers))  # type: ignore[arg-type]
    third, third_headers = signed({"type": "block_actions", "n": 2})
    with pytest.raises(Busy):
        door._verify(third, _Headers(third_headers))  # type: ignore[arg-type]
    with pytest.raises(Unverified, match="seen before"):
        door._verify(body, _Headers(headers))  # type: ignore[arg-type]


def test_slack_directory_refuses_what_it_cannot_tell_apart():
    for users in (
        {"cfo@example.com": "cfo"},  # a name, not an id
        {"U0A": "x", "U0B": "x"},  # one identity twice
        {"U0A": " "},
        {"U0A\n": "x"},
        {"U0A": "x" * 257},
    ):
        with pytest.raises(ValueError, match=r"Slack user|identity"):
            SlackDirectory(users=users)
    directory = SlackDirectory(
        users={"U0A": "ann", "U0B": "bo"}, groups={"finance": ["ann"], "group:finance": ["bo"]}
    )
    # ``group:group:finance`` is not ``group:finance``: bo is reached through neither.
    assert directory.slack_users(["group:finance"]) == ["U0A"]
    assert directory.groups_of("bo") == ("group:finance",)


# ----------------------------------------------------------------------------------------------
# Email: headers, markup and links.


def _mail_note(summary: str, **more: Any) -> NotifyInput:
    call = InterruptRequest.model_validate(
        {
            "name": "sendPayment",
            "ref": "p1",
            "input": {"amount": 1},
            "since": datetime(2026, 12, 5, tzinfo=UTC),
            "approvers": ["cfo@example.com"],
            "input_digest": "sha256:abc",
            "shown": Shown(title="Send payment", summary=summary),
            **more,
        }
    )
    return NotifyInput(
        agent="desk", chat_id="chat-1", channel="mail", kind="paused", key="k1", interrupt=call
    )


def _offline_channel(**more: Any) -> EmailChannel:
    return EmailChannel(
        host="127.0.0.1",
        port=2525,
        security="none",
        sender="approvals@example.com",
        app_url="https://approvals.example.com",
        link_key=KEY,
        **more,
    )


@pytest.mark.parametrize(
    "injected",
    [
        "\r\nBcc: attacker@evil.example",
        "\r\n\r\nAlready approved by the CFO: http://evil.example/answer/x",
        "\nReply-To: attacker@evil.example",
    ],
)
def test_email_an_encoded_word_in_the_summary_writes_no_header_and_no_body(injected: str):
    """The summary is the model's (a payee's name, a currency): visible, one line. But an
    RFC 2047 encoded word in it was decoded by the email package as the Subject was set, CR LF
    and all, so a serialized message carried the model's own headers (Bcc, Reply-To) or ended
    its headers and began a body of the model's choosing. Fixed: ``=?`` never starts an encoded
    word in the Subject (``activities.email.subject``)."""
    mail = _offline_channel()
    note = _mail_note(f"Pay 1 {encoded_word(injected)} to NL91")
    (recipient,) = mail.recipients(note.interrupt)
    raw = mail.message(note, recipient).as_bytes()
    head = raw.split(b"\n\n", 1)[0]
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    assert sorted(parsed.keys()) == sorted(
        [
            "From",
            "To",
            "Subject",
            "Message-ID",
            "Date",
            "Auto-Submitted",
            "MIME-Version",
            "Content-Type",
        ]
    ), head
    assert b"evil.example" not in head
    assert parsed["Subject"].startswith("Approval needed: Pay 1 = ?utf-8?b?")
    assert parsed.get_body(("plain",)) is not None and parsed.get_body(("html",)) is not None


def test_email_an_address_from_the_directory_cannot_carry_headers():
    mail = _offline_channel(
        directory={
            "ann": "ann@example.com\r\nBcc: attacker@evil.example",
            "bo": "bo@example.com, attacker@evil.example",
            "cy": "Cy <attacker@evil.example>",
        }
    )
    note = _mail_note(
        "Pay 1", approvers=["ann", "bo", "cy", "dee@example.com\nBcc: x@evil.example"]
    )
    assert mail.recipients(note.interrupt) == []
    # An address with an encoded word that would decode to a line break: the message is not
    # made at all (the email package refuses it), rather than sent with a header of its own.
    sneaky_address = encoded_word("x\r\nBcc: e@evil.example") + "@b.com"
    sneaky = _offline_channel(directory={"ann": sneaky_address})
    note = _mail_note("Pay 1", approvers=["ann"])
    (recipient,) = sneaky.recipients(note.interrupt)
    with pytest.raises(ValueError, match="CR or LF"):
        sneaky.message(note, recipient)


def test_email_and_answer_view_markup_escape_every_shown_field():
    """Every shown part (title, summary, why, fields, risk note, requester, votes, the user's
    request, the model's words) in the email's HTML and the answer view's table and heading."""
    note = hostile_note()
    mail = _offline_channel(directory={HOSTILE: "x@example.com"})
    recipient = mail.recipients(note.interrupt)[0]
    message = mail.message(note, recipient)
    html_part = message.get_body(("html",))
    assert html_part is not None
    html = html_part.get_content()
    view = page(200, note.interrupt.shown.title, html_rows(note.interrupt)).body.decode()  # type: ignore[union-attr]
    for markup in (html, view):
        assert "<script>" not in markup and "<!channel>" not in markup
        assert "<https://evil" not in markup
        assert "&lt;script&gt;" in markup


def _flip(text: str, i: int) -> str:
    return text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :]


def test_answer_link_every_change_truncation_or_odd_form_is_refused():
    links = AnswerLinks(KEY)
    token = links.sign(
        agent="desk", chat_id="chat-1", ref="p1", input_digest="sha256:abc", since="",
        identity="cfo@example.com",
    )  # fmt: skip
    body, sig = token.split(".")
    refused = [
        *(_flip(token, i) for i in range(len(token)) if token[i] != "."),
        token[:-1],
        token[:-2],
        body,
        body + ".",
        "." + sig,
        token + "=",
        token + ".x",
        token.replace(".", ".."),
        token + "é",
        "é" + token,
        token.replace("-", "+").replace("_", "/"),  # base64, not base64url
        "A" * (MAX_TOKEN_CHARS + 1),
        f"{body}.{sig}" + "A" * MAX_TOKEN_CHARS,
        "",
        ".",
    ]
    for bad in refused:
        if bad == token:
            continue
        with pytest.raises(LinkRefused):
            links.verify(bad)
    # A claim another key signed, with the identity of someone else spliced in, is refused.
    other = AnswerLinks("x" * 40).sign(
        agent="desk", chat_id="chat-1", ref="p1", input_digest="sha256:abc", since="",
        identity="ceo@example.com",
    )  # fmt: skip
    with pytest.raises(LinkRefused):
        links.verify(other.split(".")[0] + "." + sig)


def test_answer_link_a_second_spelling_of_one_signature_answers_nothing_more():
    """base64url's last character carries bits the signature does not use, so a token has
    other spellings that verify to the same claims. Held: nothing counts tokens; a link is
    one-time because the call is answered (or the approver's vote is on it), whatever its
    spelling."""
    links = AnswerLinks(KEY)
    token = links.sign(
        agent="desk", chat_id="chat-1", ref="p1", input_digest="sha256:abc", since="",
        identity="cfo@example.com",
    )  # fmt: skip
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spellings = {token[:-1] + c for c in alphabet}
    taken = [t for t in spellings if _verifies(links, t)]
    assert token in taken and len(taken) > 1
    assert all(links.verify(t) == links.verify(token) for t in taken)


def _verifies(links: AnswerLinks, token: str) -> bool:
    try:
        links.verify(token)
    except LinkRefused:
        return False
    return True


# ----------------------------------------------------------------------------------------------
# Slack against the dev server.

MEMBER = "U0MEMBER"
"""In the directory, in no approver list."""

DIRECTORY = SlackDirectory(
    users={
        w.CFO: "cfo@example.com",
        w.TREASURER: "treasurer@example.com",
        MEMBER: "member@example.com",
    },
    groups={"treasury": ["treasurer@example.com"]},
    team="T0TEAM",
)


@dataclass
class Door:
    agents: AgentClient
    chat: Chat
    message: Message
    slack: SlackStandIn
    http: httpx2.AsyncClient
    base: str

    async def click(
        self,
        *,
        user: str = w.CFO,
        action: str = APPROVE,
        value: dict[str, Any] | None = None,
        base: str | None = None,
    ) -> httpx2.Response:
        payload = click_payload(
            self.message,
            action=action,
            user=user,
            response_url=f"{self.slack.url}/response/{uuid.uuid4().hex[:8]}",
        )
        if value is not None:
            payload["actions"][0]["value"] = json.dumps(value)
        body, headers = signed(payload)
        return await self.http.post(
            f"{base or self.base}/slack/interactivity", content=body, headers=headers
        )

    def value(self) -> dict[str, Any]:
        return json.loads(click_payload(self.message, action=APPROVE, user="U", response_url="")[
            "actions"][0]["value"])  # fmt: skip

    async def replies(self, n: int) -> list[str]:
        seen = await eventually(
            lambda: asyncio.sleep(0, list(self.slack.responses)), lambda r: len(r) >= n, timeout=60
        )
        self.slack.responses.clear()
        return [str(r["text"]) for r in seen]


def _door(slack: SlackStandIn) -> SlackInteractivity:
    return SlackInteractivity(
        signing_secret=SIGNING_SECRET, directory=DIRECTORY, response_urls=f"{slack.url}/response/"
    )


@asynccontextmanager
async def slack_desk(run_worker: Any, model: Any, agent: Agent) -> AsyncIterator[Door]:
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    async with (
        slack_standin() as slack,
        run_worker(agents=[agent], channels={"slack": w.channel(slack.url)}) as agents,
    ):
        chat = await agents.chat(agent.name)
        res = await chat.send("Pay the rent.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        (posted,) = await eventually(lambda: asyncio.sleep(0, slack.posted()), bool)
        app = agents_app(agents, slack=_door(slack))
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            yield Door(agents, chat, copy.deepcopy(posted), slack, http, base)


def _answers(events: Any) -> list[Any]:
    return [
        e
        for e in events
        if e.event_type
        in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        )
    ]


async def test_slack_a_forged_value_a_non_approver_or_a_body_bomb_applies_nothing(
    run_worker, model, client
):
    """A signed click from a mapped user who is no approver of the call; a signed click from
    an approver whose value names another digest than the message showed (an input the
    approver never saw), another ref, another chat; a body past the bound; a thousand signed
    clicks at once on chats that do not exist. None is applied, the tool never runs, and the
    genuine click still answers after them."""
    agent = w.agent(name=f"slack_atk_{uuid.uuid4().hex[:8]}")
    async with slack_desk(run_worker, model, agent) as d:
        before = _answers((await history(client, d.chat.id)).events)
        value = d.value()

        await d.click(user=MEMBER)
        (said,) = await d.replies(1)
        assert "Not applied" in said, said

        # Before the fix: "This call is no longer waiting for an answer", of a call that waits.
        await d.click(value={**value, "digest": "sha256:" + "0" * 64})
        (said,) = await d.replies(1)
        assert "input changed since this message was posted" in said, said

        await d.click(value={**value, "ref": "not-a-ref"})
        (said,) = await d.replies(1)
        assert "no longer waiting" in said, said

        await d.click(value={**value, "chat": f"nobody-{uuid.uuid4().hex}"})
        (said,) = await d.replies(1)
        assert "no longer waiting" in said, said

        bomb = await d.http.post(
            f"{d.base}/slack/interactivity",
            content=b"payload=" + b"A" * (300 * 1024),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert bomb.status_code == 413

        # A thousand signed clicks at once: Slack is answered each time, at once.
        started = time.monotonic()
        many = await asyncio.gather(
            *(d.click(value={**value, "chat": f"nobody-{i}"}) for i in range(1000))
        )
        assert {r.status_code for r in many} == {200}
        assert len(await d.replies(1000)) == 1000
        elapsed = time.monotonic() - started

        assert _answers((await history(client, d.chat.id)).events) == before
        assert [i.ref for i in await d.chat.pending()] == ["p1"]
        assert (await tool_runs(d.chat)).get("sendPayment", 0) == 0

        await d.click()
        (said,) = await d.replies(1)
        assert "was taken" in said
        await eventually(d.chat.status, lambda s: s.status == "idle", timeout=30)
        assert (await tool_runs(d.chat))["sendPayment"] == 1
        assert elapsed < 120
    await assert_no_workflow_task_failed(client, d.chat.id)


async def test_slack_a_click_replayed_to_a_second_app_process_is_not_a_second_vote(
    run_worker, model, client
):
    """The replay set is per process (documented). A click replayed within five minutes to a
    second app process passes its signature check, and is sent: the conversation must still
    count one approver once, so a quorum of two is not met by one person clicking once."""
    agent = Agent(
        f"slack_quorum_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=["cfo@example.com", "treasurer@example.com"], quorum=2)],
        notify=["slack"],
    )
    async with slack_desk(run_worker, model, agent) as d:
        payload = click_payload(
            d.message, action=APPROVE, user=w.CFO, response_url=f"{d.slack.url}/response/r"
        )
        body, headers = signed(payload)
        other_app = agents_app(d.agents, slack=_door(d.slack))
        async with served(other_app) as other:
            first = await d.http.post(
                f"{d.base}/slack/interactivity", content=body, headers=headers
            )
            assert first.status_code == 200
            (said,) = await d.replies(1)
            assert "was taken" in said and "needs 2 approvals" in said
            again = await d.http.post(f"{other}/slack/interactivity", content=body, headers=headers)
            assert again.status_code == 200
            (said,) = await d.replies(1)
            assert "Not applied" in said or "nothing was changed" in said, said
        (pending,) = await d.chat.pending()
        assert [v.identity for v in pending.votes] == ["cfo@example.com"]
        assert (await tool_runs(d.chat)).get("sendPayment", 0) == 0
    await assert_no_workflow_task_failed(client, d.chat.id)


# ----------------------------------------------------------------------------------------------
# Email links against the dev server.


async def _event_count(client: Any, chat_id: str) -> int:
    return len((await client.get_workflow_handle(chat_id).fetch_history()).events)


async def test_email_links_bound_elsewhere_head_options_and_cross_site_posts_answer_nothing(
    run_worker, model, client
):
    """Links signed with the right key but bound to another pause, input, agent, or approver;
    HEAD and OPTIONS on a good link; the good link POSTed from another site's page; the good
    link POSTed twice at once on a quorum of two. Only the one same-site POST counts, once."""
    agent = Agent(
        f"mail_atk_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=["cfo@example.com", "treasurer@example.com"], quorum=2)],
        notify=["mail"],
    )
    bcc = encoded_word("\r\nBcc: e@evil.example")
    hostile = {**PAY, "currency": f"EUR <script>alert(1)</script> {bcc}"}
    model.reply(calls(("sendPayment", hostile, "p1"), say=HOSTILE), text("paid"))
    with smtp_server() as (box, port):
        mail = mail_channel(port)
        async with run_worker(agents=[agent], channels={"mail": mail}) as agents:
            app = agents_app(agents, link_keys=[KEY])
            async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
                mail.app_url = base
                chat = await agents.chat(agent.name)
                res = await chat.send(f"Pay the rent {HOSTILE}")
                assert res.finish_reason == FinishReason.INTERRUPTED
                await eventually(lambda: asyncio.sleep(0, len(box.messages)), lambda n: n == 2)
                by_address = {m["To"]: m for m in box.messages}
                assert set(by_address) == {"cfo@example.com", "treasurer@example.com"}
                for msg in box.messages:
                    assert msg["Bcc"] is None and "evil.example" not in str(msg["Subject"])
                link = link_of(by_address["cfo@example.com"])
                token = link.rsplit("/", 1)[1]
                claims = AnswerLinks(KEY).verify(token)
                kept: dict[str, Any] = {
                    "agent": claims.agent, "chat_id": claims.chat_id, "ref": claims.ref,
                    "input_digest": claims.input_digest, "since": claims.since,
                    "identity": claims.identity,
                }  # fmt: skip
                signer = AnswerLinks(KEY)
                before = await _event_count(client, chat.id)

                # The view escapes what the model and the user wrote.
                view = await http.get(link)
                assert view.status_code == 200, view.text
                assert "<script>" not in view.text and "&lt;script&gt;" in view.text
                assert "<!channel>" not in view.text

                later = (datetime.fromisoformat(claims.since) + timedelta(seconds=1)).isoformat()
                for bad, status in (
                    ({**kept, "since": later}, 409),  # another pause of the same ref
                    ({**kept, "input_digest": "sha256:" + "0" * 64}, 409),  # another input
                    ({**kept, "agent": "another-agent"}, 404),
                    ({**kept, "chat_id": f"nobody-{uuid.uuid4().hex}"}, 404),
                    ({**kept, "ref": "p2"}, 409),
                ):
                    forged = f"{base}/answer/{signer.sign(**bad)}"
                    for method in ("GET", "POST"):
                        r = await http.request(method, forged, data={"action": "approve"})
                        assert r.status_code == status, (bad, method, r.text)
                # Someone the agent never asked, in a link the key signed: the conversation
                # refuses the answer.
                stranger = f"{base}/answer/{signer.sign(**{**kept, 'identity': 'eve@example.com'})}"
                r = await http.post(stranger, data={"action": "approve"})
                assert r.status_code in (403, 409, 422), r.text
                assert "Not answered" in r.text

                head = await http.head(link)
                assert head.status_code == 200 and head.content == b""
                options = await http.options(link, headers={"origin": "https://evil.example"})
                assert options.status_code in (204, 400, 403, 405)
                assert "access-control-allow-origin" not in options.headers
                for origin in ("https://evil.example", "null"):
                    r = await http.post(
                        link, data={"action": "approve"}, headers={"origin": origin}
                    )
                    assert r.status_code == 403, (origin, r.text)
                r = await http.post(
                    link,
                    data={"action": "approve"},
                    headers={"sec-fetch-site": "cross-site", "origin": "https://evil.example"},
                )
                assert r.status_code == 403
                assert (await chat.pending())[0].votes == []

                # The good link twice at once: one vote, the other refused.
                both = await asyncio.gather(
                    http.post(link, data={"action": "approve"}),
                    http.post(link, data={"action": "approve"}),
                )
                assert sorted(r.status_code for r in both)[0] == 200, [r.text for r in both]
                assert sorted(r.status_code for r in both)[1] in (409, 422), [r.text for r in both]
                (pending,) = await chat.pending()
                assert [v.identity for v in pending.votes] == ["cfo@example.com"]
                assert await tool_runs(chat) == {}
                assert await _event_count(client, chat.id) > before

                # The other approver's link completes the quorum.
                done = await http.post(
                    link_of(by_address["treasurer@example.com"]), data={"action": "approve"}
                )
                assert done.status_code == 200, done.text
                await eventually(chat.status, lambda s: s.status == "idle", timeout=30)
                assert await tool_runs(chat) == {"sendPayment": 1}
    await assert_no_workflow_task_failed(client, chat.id)

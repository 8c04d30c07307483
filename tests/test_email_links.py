"""A paused call emailed to its approvers, and answered once from the email's link, against the
dev server, a local SMTP server (``aiosmtpd`` on loopback) and the web app over HTTP.

- an email reaches the SMTP server with the call as every surface shows it, and a link that
  opens the answer view;
- opening the link (a GET, as a mail scanner does) changes nothing: no event in history;
- the link's POST approves once, the tool runs once, and the audit record names the link's
  approver; the same link again is refused, GET or POST;
- a changed link, one signed with another key, or an expired one is refused before anything
  reaches the conversation;
- the SMTP password is in no history event and no log line, including a failed login's record;
- a ``group:NAME`` approver is emailed through the channel's directory, and behind a
  ``LoginExchange`` the link answers as a login does: verified, with the group.
"""

from __future__ import annotations

import base64
import email
import email.policy
import importlib.util
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from email.message import EmailMessage
from typing import Any

import httpx2
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography.hazmat.primitives.asymmetric import ed25519
from temporalio.worker import Worker

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval
from temporal_agent_interrupts.activities.answer_links import AnswerLinks
from temporal_agent_interrupts.client.login import LoginExchange
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.hosting import EmailChannel
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from tests.docs import block
from tests.helpers import assert_no_workflow_task_failed, eventually, free_port
from tests.test_presentation import PAY, send_payment
from tests.web import served

# The server is on loopback, where a password in the clear goes nowhere else.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")

KEY = "an-answer-link-key-of-32-bytes-or-more"
PASSWORD = "smtp-Pa55word-Do-Not-Leak"


class Mailbox:
    """What the SMTP server was given, parsed."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's hook name)
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"


def _authenticate(
    server: Any, session: Any, envelope: Any, mechanism: str, data: Any
) -> AuthResult:
    ok = (
        isinstance(data, LoginPassword)
        and data.login == b"bot"
        and data.password == PASSWORD.encode()
    )
    return AuthResult(success=ok, handled=False)


@contextmanager
def smtp_server() -> Iterator[tuple[Mailbox, int]]:
    """An SMTP server on a free loopback port that asks for a login (plain text: loopback)."""
    box = Mailbox()
    port = free_port()
    controller = Controller(
        box,
        hostname="127.0.0.1",
        port=port,
        authenticator=_authenticate,
        auth_required=True,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


def channel(port: int, *, password: str = PASSWORD, **more: Any) -> EmailChannel:
    return EmailChannel(
        host="127.0.0.1",
        port=port,
        security="none",
        username="bot",
        password=password,
        sender="approvals@example.com",
        app_url="http://127.0.0.1:1",  # set to the served app's once it is up
        link_key=KEY,
        **more,
    )


def desk(approvers: list[str], **more: Any) -> Agent:
    return Agent(
        f"mail_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=approvers)],
        notify=["mail"],
        **more,
    )


def plain(msg: EmailMessage) -> str:
    part = msg.get_body(("plain",))
    assert part is not None
    return part.get_content()


def link_of(msg: EmailMessage) -> str:
    (found,) = re.findall(r"https?://\S+/answer/\S+", plain(msg))
    return found


def secret_forms(password: str) -> list[str]:
    """The password, and the forms SMTP AUTH sends it in."""
    return [
        password,
        base64.b64encode(password.encode()).decode(),
        base64.b64encode(f"\0bot\0{password}".encode()).decode(),
    ]


async def event_count(client: Any, chat_id: str) -> int:
    return len((await client.get_workflow_handle(chat_id).fetch_history()).events)


async def all_events(client: Any, chat_id: str) -> list[bytes]:
    return [
        e.SerializeToString()
        async for e in client.get_workflow_handle(chat_id).fetch_history_events()
    ]


async def test_an_emailed_link_opens_the_answer_view_and_answers_once(
    run_worker, model, client, caplog
):
    caplog.set_level(logging.DEBUG)
    agent = desk(["cfo@example.com"])
    model.reply(calls(("sendPayment", PAY, "p1"), say="Paying the rent."), text("paid"))
    with smtp_server() as (box, port):
        mail = channel(port)
        async with run_worker(agents=[agent], channels={"mail": mail}) as agents:
            app = agents_app(agents, link_keys=[KEY])
            async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
                mail.app_url = base
                chat = await agents.chat(agent.name)
                res = await chat.send("Pay the rent.")
                assert res.finish_reason == FinishReason.INTERRUPTED

                async def delivered():
                    return [r for r in (await chat.history()).answers if r.kind == "notified"]

                (record,) = await eventually(delivered, lambda r: len(r) == 1)
                assert record.delivered is True, record.verdict_reason
                (msg,) = box.messages
                assert msg["To"] == "cfo@example.com"
                assert msg["Subject"] == "Approval needed: Pay 7,300.00 EUR to NL91 …00"
                body = plain(msg)
                for shown in ("Risk: high", "To: NL91 ABNA 0417 1643 00",
                              "The request: Pay the rent.",
                              "The agent said: Paying the rent."):  # fmt: skip
                    assert shown in body, (shown, body)
                link = link_of(msg)
                assert link.startswith(f"{base}/answer/")

                # Opening it shows the call and a form; it answers nothing.
                before = await event_count(client, chat.id)
                view = await http.get(link)
                assert view.status_code == 200, view.text
                assert "Pay 7,300.00 EUR to NL91 …00" in view.text
                assert '<form method="post"' in view.text and 'value="approve"' in view.text
                assert "script-src" not in view.headers["content-security-policy"]
                assert "form-action 'self'" in view.headers["content-security-policy"]
                assert view.headers["referrer-policy"] == "same-origin"
                assert await event_count(client, chat.id) == before
                assert [i.ref for i in await chat.pending()] == ["p1"]

                # Changed, signed elsewhere, or expired: refused, and nothing reaches history.
                token = link.rsplit("/", 1)[1]
                claims = AnswerLinks(KEY).verify(token)
                kept: dict[str, Any] = {
                    "agent": claims.agent, "chat_id": claims.chat_id, "ref": claims.ref,
                    "input_digest": claims.input_digest, "since": claims.since,
                    "identity": claims.identity,
                }  # fmt: skip
                changed = token[:5] + ("x" if token[5] != "x" else "y") + token[6:]
                elsewhere = AnswerLinks("another-key-another-key-another-key!").sign(**kept)
                expired = AnswerLinks(KEY, lifetime=timedelta(minutes=1)).sign(
                    **kept, now=time.time() - 61
                )
                for bad, status, says in (
                    (changed, 403, "This link is not valid"),
                    (elsewhere, 403, "This link is not valid"),
                    (expired, 410, "This link has expired"),
                ):
                    for method in ("GET", "POST"):
                        r = await http.request(
                            method, f"{base}/answer/{bad}", data={"action": "approve"}
                        )
                        assert (r.status_code, says in r.text) == (status, True), r.text
                assert await event_count(client, chat.id) == before

                # The POST answers, once.
                done = await http.post(link, data={"action": "approve"})
                assert done.status_code == 200, done.text
                assert "You approved Pay 7,300.00 EUR to NL91 …00" in done.text
                assert (await chat.status()).status == "idle"
                assert await tool_runs(chat) == {"sendPayment": 1}
                answered = [r for r in (await chat.history()).answers if r.kind != "notified"]
                (approval,) = answered
                assert (approval.identity, approval.decision) == ("cfo@example.com", "approved")
                assert approval.metadata == {"via": "answer link"}

                # The same link again: refused, saying who answered; nothing runs again.
                after = await event_count(client, chat.id)
                for method in ("POST", "GET"):
                    again = await http.request(method, link, data={"action": "approve"})
                    assert again.status_code == 409, again.text
                    assert "approved by cfo@example.com" in again.text
                    assert "answers nothing more" in again.text
                assert await event_count(client, chat.id) == after
                assert await tool_runs(chat) == {"sendPayment": 1}

    await assert_no_workflow_task_failed(client, chat.id)
    # The password went to the SMTP server alone: no event, no log line, as it is or as AUTH
    # sends it (base64, alone for LOGIN, after the user name for PLAIN).
    events = await all_events(client, chat.id)
    for secret in secret_forms(PASSWORD):
        assert not [e for e in events if secret.encode() in e], secret
        assert secret not in caplog.text, secret


async def test_a_refused_smtp_login_is_on_record_without_the_password(
    run_worker, model, client, caplog
):
    caplog.set_level(logging.DEBUG)
    agent = desk(["cfo@example.com"])
    wrong = "Wrong-" + PASSWORD
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    with smtp_server() as (box, port):
        async with run_worker(
            agents=[agent], channels={"mail": channel(port, password=wrong)}
        ) as agents:
            chat = await agents.chat(agent.name)
            await chat.send("Pay the rent.")

            async def notified():
                return [r for r in (await chat.history()).answers if r.kind == "notified"]

            (record,) = await eventually(notified, lambda r: len(r) == 1)
            assert record.delivered is False
            assert "the SMTP server refused: 535" in (record.verdict_reason or "")
            assert box.messages == []
    events = await all_events(client, chat.id)
    for secret in (*secret_forms(wrong), *secret_forms(PASSWORD)):
        assert not [e for e in events if secret.encode() in e], secret
        assert secret not in caplog.text, secret


async def test_a_group_approver_is_emailed_through_the_directory_and_answers_verified(
    run_worker, model, client
):
    exchange = LoginExchange(
        lambda request: None,  # no login of its own here: the link is the login
        key=ed25519.Ed25519PrivateKey.generate(),
        issuer="https://agents.test",
        audience="approvals",
    )
    agent = desk(["group:finance"], trust=exchange.trusted_issuer())
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    with smtp_server() as (box, port):
        mail = channel(
            port,
            directory={"ann": "ann@example.com"},
            groups={"finance": ["ann", "bo@example.com"]},
        )
        async with run_worker(agents=[agent], channels={"mail": mail}) as agents:
            app = agents_app(agents, identity=exchange, link_keys=[KEY])
            async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
                mail.app_url = base
                chat = await agents.chat(agent.name)
                await chat.send("Pay the rent.")
                await eventually(lambda: _count(box), lambda n: n == 2)
                by_address = {m["To"]: m for m in box.messages}
                assert set(by_address) == {"ann@example.com", "bo@example.com"}
                ann = link_of(by_address["ann@example.com"])
                assert AnswerLinks(KEY).verify(ann.rsplit("/", 1)[1]).groups == ("finance",)

                done = await http.post(ann, data={"action": "approve"})
                assert done.status_code == 200, done.text
                (approval,) = [r for r in (await chat.history()).answers if r.kind != "notified"]
                assert (approval.identity, approval.identity_verified) == ("ann", True)
                assert await tool_runs(chat) == {"sendPayment": 1}

                # Bo's link finds the call answered, and says by whom.
                late = await http.get(link_of(by_address["bo@example.com"]))
                assert late.status_code == 409 and "approved by ann" in late.text
    await assert_no_workflow_task_failed(client, chat.id)


async def _count(box: Mailbox) -> int:
    return len(box.messages)


DOCS_SETUP = "# approvals_mail.py: the email channel on the worker, and the web app its links open"
"""The first line of docs/answering/email.md's setup."""


async def test_the_docs_setup_emails_each_approver_and_a_link_answers(
    run_worker, model, client, tmp_path, monkeypatch
):
    """docs/answering/email.md's setup, as printed, with its secrets from the environment; only
    where the SMTP server is changes (this test's, on loopback)."""
    from temporal_agent_interrupts.worker.testing import ScriptedModel

    assert isinstance(model, ScriptedModel)
    from cryptography.hazmat.primitives import serialization

    app_key = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    for name, value in (("SMTP_USERNAME", "bot"), ("SMTP_PASSWORD", PASSWORD),
                        ("ANSWER_LINK_KEY", KEY), ("LOGIN_SECRET", uuid.uuid4().hex * 2),
                        ("AGENTS_APP_KEY", app_key.decode())):  # fmt: skip
        monkeypatch.setenv(name, value)
    path = tmp_path / "approvals_mail.py"
    path.write_text(block(DOCS_SETUP, lang="python"))
    spec = importlib.util.spec_from_file_location(f"approvals_mail_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    assert isinstance(page.worker(client), Worker)
    model.reply(
        calls(("sendPayment", {"amount": 12.5, "iban": "NL91 ABNA 0417 1643 00"}, "p1")),
        text("paid"),
    )
    with smtp_server() as (box, port):
        mail = page.mail
        mail.host, mail.port, mail.security = "127.0.0.1", port, "none"
        async with (
            run_worker(agents=[page.payments], channels={"mail": mail}) as agents,
            served(page.web_app(agents)) as base,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            mail.app_url = base
            chat = await agents.chat(page.payments.name)
            await chat.send("Pay the supplier.")
            await eventually(lambda: _count(box), lambda n: n == 3)
            by_address = {m["To"]: m for m in box.messages}
            assert set(by_address) == {
                "cfo@example.com",
                "ann.lee@example.com",
                "bo@example.com",
            }
            done = await http.post(
                link_of(by_address["cfo@example.com"]), data={"action": "approve"}
            )
            assert done.status_code == 200, done.text
            (approval,) = [r for r in (await chat.history()).answers if r.kind != "notified"]
            assert (approval.identity, approval.identity_verified) == ("cfo@example.com", True)
            assert await tool_runs(chat) == {"sendPayment": 1}
    await assert_no_workflow_task_failed(client, chat.id)

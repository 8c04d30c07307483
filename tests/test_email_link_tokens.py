"""An email's answer link, and the message that carries it, without a server
(``activities/answer_links.py``, ``activities/email.py``): what a link binds, who is written to,
and what a message shows and hides."""

from __future__ import annotations

import email
import email.policy
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from temporal_agent_interrupts.activities.answer_links import AnswerLinks, LinkRefused
from temporal_agent_interrupts.activities.email import EmailChannel, message_id
from temporal_agent_interrupts.workflows.activity_io import NotifyInput
from temporal_agent_interrupts.workflows.types import InterruptRequest, Shown, ShownField, Vote

KEY = "k" * 32
OTHER = "o" * 32
CLAIMS: dict[str, Any] = {
    "agent": "desk",
    "chat_id": "chat-1",
    "ref": "p1",
    "input_digest": "sha256:abc",
    "since": "2026-12-05T10:00:00+00:00",
    "identity": "cfo@example.com",
}


def test_a_link_carries_what_it_answers_and_as_whom():
    links = AnswerLinks(KEY)
    token = links.sign(**CLAIMS, groups=["finance"])
    claims = links.verify(token)
    assert (claims.agent, claims.chat_id, claims.ref) == ("desk", "chat-1", "p1")
    assert (claims.input_digest, claims.identity, claims.groups) == (
        "sha256:abc",
        "cfo@example.com",
        ("finance",),
    )
    # URL-safe as it is: no quoting needed in a path.
    assert all(c.isalnum() or c in "-_." for c in token)


@pytest.mark.parametrize("where", [0, 10, -3])
def test_a_changed_link_is_refused(where):
    token = AnswerLinks(KEY).sign(**CLAIMS)
    at = where % len(token)
    changed = token[:at] + ("A" if token[at] != "A" else "B") + token[at + 1 :]
    with pytest.raises(LinkRefused, match=r"not one this app made|does not check"):
        AnswerLinks(KEY).verify(changed)


def test_a_link_with_another_identity_spliced_in_is_refused():
    mine = AnswerLinks(KEY).sign(**CLAIMS)
    theirs = AnswerLinks(KEY).sign(**{**CLAIMS, "identity": "ceo@example.com"})
    spliced = theirs.split(".")[0] + "." + mine.split(".")[1]
    with pytest.raises(LinkRefused, match="does not check"):
        AnswerLinks(KEY).verify(spliced)


def test_a_link_signed_with_another_key_is_refused_and_rotation_keeps_old_links():
    old = AnswerLinks(OTHER).sign(**CLAIMS)
    with pytest.raises(LinkRefused, match="does not check"):
        AnswerLinks(KEY).verify(old)
    # The new key first (it signs), the old one after it (it still verifies).
    rotated = AnswerLinks([KEY, OTHER])
    assert rotated.verify(old).identity == "cfo@example.com"
    assert AnswerLinks(KEY).verify(rotated.sign(**CLAIMS)).ref == "p1"


def test_an_expired_link_is_refused():
    links = AnswerLinks(KEY, lifetime=timedelta(minutes=5))
    token = links.sign(**CLAIMS, now=time.time() - 301)
    with pytest.raises(LinkRefused, match="expired"):
        links.verify(token)


def test_a_short_key_or_no_key_is_refused():
    with pytest.raises(ValueError, match="32 bytes"):
        AnswerLinks("short")
    with pytest.raises(ValueError, match="need a key"):
        AnswerLinks([])
    assert KEY not in repr(AnswerLinks(KEY))


def channel(**more: Any) -> EmailChannel:
    return EmailChannel(
        host="127.0.0.1",
        port=2525,
        security="none",
        username="bot",
        password="s3cret-pass",
        sender="approvals@example.com",
        app_url="https://approvals.example.com/",
        link_key=KEY,
        **more,
    )


def paused(**more: object) -> NotifyInput:
    call = InterruptRequest.model_validate(
        {
            "name": "sendPayment",
            "ref": "p1",
            "input": {"amount": 1},
            "since": datetime(2026, 12, 5, tzinfo=UTC),
            "approvers": ["cfo@example.com"],
            "input_digest": "sha256:abc",
            "shown": Shown(
                title="Send payment",
                summary="Pay <b>1</b> EUR",
                fields=[ShownField(label="To", value="<script>x</script>")],
                asked="Pay the rent & more",
                said="Paying.",
            ),
            **more,
        }
    )
    return NotifyInput(
        agent="desk", chat_id="chat-1", channel="mail", kind="paused", key="k1", interrupt=call
    )


def test_approvers_are_found_by_address_directory_and_group():
    mail = channel(
        directory={"ann": "ann@example.com", "nobody": "not an address"},
        groups={"finance": ["ann", "bo@example.com", "nobody"]},
    )
    note = paused(approvers=["cfo@example.com", "group:finance", "ann", "nobody", "carl"])
    found = {r.identity: (r.address, r.groups) for r in mail.recipients(note.interrupt)}
    assert found == {
        "cfo@example.com": ("cfo@example.com", ()),
        "ann": ("ann@example.com", ("finance",)),
        "bo@example.com": ("bo@example.com", ("finance",)),
    }
    # Someone whose vote is on the call already is not asked again.
    voted = paused(
        approvers=["cfo@example.com", "bo@example.com"],
        quorum=2,
        votes=[Vote(identity="cfo@example.com", at=datetime(2026, 12, 5, tzinfo=UTC))],
    )
    assert [r.identity for r in mail.recipients(voted.interrupt)] == ["bo@example.com"]


def test_a_message_shows_the_call_escaped_and_links_for_its_approver_alone():
    mail = channel()
    note = paused()
    (recipient,) = mail.recipients(note.interrupt)
    msg = email.message_from_bytes(
        mail.message(note, recipient).as_bytes(), policy=email.policy.default
    )
    assert msg["To"] == "cfo@example.com"
    assert msg["Subject"] == "Approval needed: Pay <b>1</b> EUR"
    assert msg["Message-ID"] == message_id("k1", "cfo@example.com", "approvals@example.com")
    plain_part, html_part = msg.get_body(("plain",)), msg.get_body(("html",))
    assert plain_part is not None and html_part is not None
    plain, html = plain_part.get_content(), html_part.get_content()
    assert "To: <script>x</script>" in plain and "The request: Pay the rent & more" in plain
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "Pay &lt;b&gt;1&lt;/b&gt; EUR" in html and "Pay the rent &amp; more" in html
    link = next(w for w in plain.split() if "/answer/" in w)
    assert link.startswith("https://approvals.example.com/answer/")
    claims = AnswerLinks(KEY).verify(link.rsplit("/", 1)[1])
    assert (claims.identity, claims.ref, claims.since) == (
        "cfo@example.com",
        "p1",
        "2026-12-05T00:00:00+00:00",
    )
    # Neither secret is in the message, nor in the channel's repr.
    for secret in ("s3cret-pass", KEY):
        assert secret not in msg.as_string() and secret not in repr(mail)


def test_a_retried_message_keeps_its_message_id():
    assert message_id("k1", "a@x.com", "b@y.com") == message_id("k1", "a@x.com", "b@y.com")
    assert message_id("k1", "a@x.com", "b@y.com") != message_id("k2", "a@x.com", "b@y.com")
    assert message_id("k1", "a@x.com", "b@y.com") != message_id("k1", "c@x.com", "b@y.com")
    assert message_id("k1", "a@x.com", "b@y.com").endswith("@y.com>")


def test_a_password_in_the_clear_to_another_machine_is_refused():
    with pytest.raises(ValueError, match="in the clear"):
        EmailChannel(
            host="smtp.example.com",
            security="none",
            password="p",
            sender="a@example.com",
            app_url="https://x.example.com",
            link_key=KEY,
        )

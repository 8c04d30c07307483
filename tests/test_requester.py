"""The requester and separation of duties, against a real dev server (and the pure rules without
one).

- A message may say who sends it: recorded on the turn and on each call it raises, shown on the
  pending interrupt, in the inbox, the details panel and the audit record of the answers.
  Verified with a token of the agent's issuer (``trust``), asserted without.
- A send's token is checked as an answer's: forged, expired, reused, made for an answer, made
  for another message: refused. On a conversation's first message (the agent's definition not
  known yet) the refusal fails the turn, nothing runs, and the message is taken back.
- A token a send spent answers nothing; a token made for a message answers nothing.
- Separation of duties: the requester may not answer the calls its own turn raised, by update
  or by signal; another approver may.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import httpx2
import pytest

from temporal_agent_interrupts import FinishReason, interrupt
from temporal_agent_interrupts.client.login import jwt_login
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.errors import ResumeRejected, SendRejected
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import TokenIssuer, error
from temporal_agent_interrupts.workflows import Agent, ToolApproval, governance, requesters
from temporal_agent_interrupts.workflows.governance import Who
from temporal_agent_interrupts.workflows.identity import (
    ANSWER_CLAIM,
    SEND_CLAIM,
    IdentityError,
    verify_token,
)
from temporal_agent_interrupts.workflows.ids import message_digest
from temporal_agent_interrupts.workflows.interrupts import ResumeError
from temporal_agent_interrupts.workflows.state import CallState, RequesterClaim
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    ApprovalSpec,
    Requester,
    ResumeInput,
    SendInput,
    ToolRestart,
    ToolSpec,
)
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, current_details, eventually
from tests.test_web_login import IDP, exchange_for, history_events, scan
from tests.web import answer, frames, run_input, served

ISSUER = TokenIssuer("ES256")
ROGUE = TokenIssuer("ES256", kid=ISSUER.kid)  # the same key id, another key: a forger

payments = Agent(
    "payments",
    model="gemini-test",
    tools=[t.lookup],
    middleware=[ToolApproval(separate_duties=True)],
    trust=ISSUER.trust(),
)

asserted = Agent(
    "assertedPayments",
    model="gemini-test",
    tools=[t.lookup],
    middleware=[ToolApproval(separate_duties=True)],
)

sign_off = interrupt("signOff", "Ask someone to sign off.", input=t.Ask, separate_duties=True)
signing = Agent("signing", model="gemini-test", tools=[sign_off])


def fresh(identity: str, **kwargs: object) -> str:
    return ISSUER.mint(identity, **kwargs)  # type: ignore[arg-type]  # keyword options only


# ---------------------------------------------------------------------------------------------
# Recorded and shown.


async def test_a_verified_requester_is_recorded_shown_and_audited(run_worker, model, client):
    model.reply(calls(("lookup", {"key": "k"}, "r1")), text("looked"))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        # The first message: checked once the definition arrives, before the call is decided.
        paused = await chat.send("look k up", identity_token=fresh("alice@example.com"))
        (gated,) = paused.interrupts
        assert gated.requester is not None
        assert (gated.requester.identity, gated.requester.verified) == ("alice@example.com", True)
        assert gated.requester.subject  # the account, to tell a respelled identity apart
        (pending,) = await chat.pending()
        assert pending.requester == gated.requester
        inbox = await eventually(
            lambda: agents.pending(agent="payments"),
            lambda chats: any(c.chat_id == chat.id for c in chats),
        )
        (entry,) = next(c for c in inbox if c.chat_id == chat.id).interrupts
        assert entry.requester == Requester(identity="alice@example.com", verified=True)
        details = await current_details(client, chat.id)
        assert "requested by `alice@example.com` (verified)" in details
        done = await chat.resume(answers=[gated.approve()], identity_token=fresh("bob@example.com"))
        (record,) = await agents.audit(chat.id)
    assert done.finish_reason == FinishReason.STOP and t.RUNS["lookup"] == 1
    assert record.identity == "bob@example.com"
    assert record.requester is not None and record.requester.identity == "alice@example.com"
    assert record.requester.verified
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_asserted_requester_is_recorded_unverified(run_worker, model, client):
    model.reply(calls(("lookup", {"key": "k"}, "a1")), text("looked"), text("second"))
    async with run_worker(agents=[asserted]) as agents:
        chat = await agents.chat("assertedPayments")
        (gated,) = (await chat.send("look k up", identity="bob@example.com")).interrupts
        assert gated.requester == Requester(identity="bob@example.com", verified=False)
        await chat.resume(answers=[gated.approve()], identity="carol@example.com")
        (record,) = await chat.audit()
        assert record.requester == Requester(identity="bob@example.com", verified=False)
        # A token for an agent that verifies none is refused, as an answer's is.
        with pytest.raises(SendRejected, match="does not verify identity tokens") as refused:
            await chat.send("again", identity_token=fresh("bob@example.com"))
        assert refused.value.code == "forbidden"
        # A message that names nobody has no requester.
        assert (await chat.send("again")).text == "second"
    await assert_no_workflow_task_failed(client, chat.id)


# ---------------------------------------------------------------------------------------------
# Refused tokens.


async def test_a_forged_first_message_token_fails_the_turn_and_runs_nothing(
    run_worker, model, client
):
    model.reply(calls(("lookup", {"key": "k"}, "f1")), calls(("lookup", {"key": "k"}, "f2")))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        failed = await chat.send("look k up", identity_token=ROGUE.mint("alice@example.com"))
        assert failed.finish_reason == FinishReason.FAILED and failed.error is not None
        assert failed.error.status == "PERMISSION_DENIED"
        assert "the message was refused: identity token refused" in failed.error.message
        assert "does not verify" in failed.error.message
        # Nothing ran, nothing waits, and the message was taken back.
        assert t.RUNS["lookup"] == 0 and await chat.pending() == []
        assert (await chat.history()).messages == []
        # An identity without a token, once the definition is known: refused at the door.
        with pytest.raises(SendRejected, match="verifies who sends") as refused:
            await chat.send("look k up", identity="alice@example.com")
        assert refused.value.code == "forbidden"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_expired_reused_and_misbound_send_tokens_are_refused(run_worker, model, client):
    model.reply(text("one"), text("two"))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        used = fresh("alice@example.com")
        assert (await chat.send("hello", identity_token=used)).text == "one"
        bound_elsewhere = {"chat": "another-chat", "message": message_digest("hi")}
        for reason, token in {
            "already used": used,
            "expired at": fresh("alice@example.com", expires_in=-timedelta(minutes=5)),
            "does not verify": ROGUE.mint("alice@example.com"),
            "made for an answer": fresh(
                "alice@example.com",
                extra={ANSWER_CLAIM: {"chat": chat.id, "calls": {"r": "d"}}},
            ),
            "another conversation": fresh("alice@example.com", extra={SEND_CLAIM: bound_elsewhere}),
            "another message": fresh(
                "alice@example.com",
                extra={SEND_CLAIM: {"chat": chat.id, "message": message_digest("other")}},
            ),
        }.items():
            with pytest.raises(SendRejected, match=reason) as refused:
                await chat.send("hi", identity_token=token)
            assert refused.value.code == "forbidden"
        # By signal, a forged token is a recorded rejection, and starts nothing.
        forged = {"text": "hi", "identity_token": ROGUE.mint("alice@example.com")}
        code, out = await cli_signal(client, chat.id, "send", json.dumps(forged))
        assert code == 0, out
        await eventually(chat.status, lambda s: s.rejections == 1)
        (rejection,) = await chat.rejections()
        assert "does not verify" in rejection.reason
        assert forged["identity_token"] not in rejection.reason
        # A token made for this very message sends it.
        mine = {"chat": chat.id, "message": message_digest("hi")}
        done = await chat.send(
            "hi", identity_token=fresh("alice@example.com", extra={SEND_CLAIM: mine})
        )
        assert done.text == "two"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_send_token_answers_nothing(run_worker, model, client):
    """Whoever reads the send in history (or holds the web app's message token) cannot answer
    with it: an identity provider's token was spent by the send, and a message token is not an
    answer token."""
    model.reply(text("one"), calls(("lookup", {"key": "k"}, "s1")), text("looked"))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        await chat.send("hello", identity_token=fresh("alice@example.com"))
        spent = fresh("alice@example.com")
        (gated,) = (await chat.send("look k up", identity_token=spent)).interrupts
        with pytest.raises(ResumeRejected, match="already used"):
            await chat.resume(answers=[gated.approve()], identity_token=spent)
        message_token = fresh(
            "bob@example.com",
            extra={SEND_CLAIM: {"chat": chat.id, "message": message_digest("look k up")}},
        )
        with pytest.raises(ResumeRejected, match="made for sending a message") as refused:
            await chat.resume(answers=[gated.approve()], identity_token=message_token)
        assert refused.value.code == "forbidden"
        assert t.RUNS["lookup"] == 0
        await chat.resume(answers=[gated.approve()], identity_token=fresh("bob@example.com"))
    assert t.RUNS["lookup"] == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_first_message_token_no_turn_could_check_is_spent_once_it_can_be(
    run_worker, model, client
):
    """The first model call fails, so the first message's sender was never decided (no
    definition yet), while its token sits in history: it is spent as soon as a later model
    result brings the definition, and answers nothing."""
    model.reply(error(400, "bad request"), calls(("lookup", {"key": "k"}, "l1")), text("done"))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        left = fresh("bob@example.com")
        failed = await chat.send("hello", identity_token=left)
        assert failed.finish_reason == FinishReason.FAILED
        (gated,) = (await chat.send("look k up")).interrupts
        assert gated.requester is None  # nobody said, this time
        with pytest.raises(ResumeRejected, match="already used"):
            await chat.resume(answers=[gated.approve()], identity_token=left)
        await chat.resume(answers=[gated.approve()], identity_token=fresh("bob@example.com"))
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_message_cannot_bring_its_own_requester(run_worker, model, client):
    """A send's payload has no say in the requester beyond identity and identity_token: a
    ``requester`` (or a ``claim``) key is ignored, as any unknown key of a send is."""
    model.reply(text("hi"), calls(("lookup", {"key": "k"}, "n1")))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        await chat.send("hello? ", identity_token=fresh("bob@example.com"))  # the definition
        forged = {
            "text": "look k up",
            "requester": {"identity": "ceo@example.com", "verified": True},
            "claim": {"identity": "ceo@example.com", "message": "x"},
        }
        code, out = await cli_signal(client, chat.id, "send", json.dumps(forged))
        assert code == 0, out
        (gated,) = await eventually(chat.pending, lambda p: len(p) == 1)
        assert gated.requester is None
    await assert_no_workflow_task_failed(client, chat.id)


# ---------------------------------------------------------------------------------------------
# Separation of duties.


async def test_the_requester_may_not_approve_its_own_call(run_worker, model, client):
    model.reply(calls(("lookup", {"key": "k"}, "d1")), text("looked"))
    async with run_worker(agents=[payments]) as agents:
        chat = await agents.chat("payments")
        (gated,) = (
            await chat.send("look k up", identity_token=fresh("alice@example.com"))
        ).interrupts
        for answer in (gated.approve(), gated.deny("no")):
            with pytest.raises(ResumeRejected, match="separates duties") as refused:
                await chat.resume(answers=[answer], identity_token=fresh("alice@example.com"))
            assert refused.value.code == "forbidden"
        # By signal, as a script sends it: refused, recorded, nothing runs.
        by_signal = {
            "restart": [gated.approve().model_dump()],
            "identity_token": fresh("alice@example.com"),
        }
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(by_signal))
        assert code == 0, out
        await eventually(chat.status, lambda s: s.rejections == 1)
        (rejection,) = await chat.rejections()
        assert "separates duties" in rejection.reason
        assert t.RUNS["lookup"] == 0 and [p.ref for p in await chat.pending()] == ["d1"]
        done = await chat.resume(answers=[gated.approve()], identity_token=fresh("bob@example.com"))
    assert done.text == "looked" and t.RUNS["lookup"] == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_interrupt_only_tool_separates_duties_with_asserted_identities(
    run_worker, model, client
):
    model.reply(calls(("signOff", {"question": "ship?"}, "o1")), text("signed"))
    async with run_worker(agents=[signing]) as agents:
        chat = await agents.chat("signing")
        (ask,) = (await chat.send("ship it", identity="dave@example.com")).interrupts
        with pytest.raises(ResumeRejected, match="separates duties"):
            await chat.resume(answers=[ask.respond({"ok": True})], identity="dave@example.com")
        done = await chat.resume(answers=[ask.respond({"ok": True})], identity="erin@example.com")
    assert done.text == "signed"
    await assert_no_workflow_task_failed(client, chat.id)


# ---------------------------------------------------------------------------------------------
# The pure rules.

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TRUSTED = AgentSpec(name="a", model="m", trust=ISSUER.trust_spec())
UNTRUSTED = AgentSpec(name="a", model="m")


def claim(
    identity: str | None = None, token: str | None = None, message: str = "hi"
) -> RequesterClaim:
    return RequesterClaim(identity=identity, token=token, message=message_digest(message))


def test_the_requester_rules_without_and_with_trust():
    check = requesters.check
    kw = {"spent": [], "now": NOW, "chat": "c"}
    assert check(claim(), spec=UNTRUSTED, **kw) is None
    assert check(claim("bob"), spec=UNTRUSTED, **kw) == Requester(identity="bob")
    with pytest.raises(requesters.RequesterError, match="does not verify identity tokens"):
        check(claim(token="x.y.z"), spec=UNTRUSTED, **kw)
    assert check(claim(), spec=TRUSTED, **kw) is None
    with pytest.raises(requesters.RequesterError, match="verifies who sends"):
        check(claim("bob"), spec=TRUSTED, **kw)
    token = ISSUER.mint("bob@example.com", issued_at=NOW)
    found = check(claim(token=token), spec=TRUSTED, **kw)
    assert found is not None and found.verified and found.identity == "bob@example.com"
    with pytest.raises(requesters.RequesterError, match="does not match"):
        check(claim("mallory@example.com", token), spec=TRUSTED, **kw)
    with pytest.raises(requesters.RequesterError, match="names a group"):
        requesters.check_shape("group:ops", None)
    # Settling spends the token: the same one is refused next time.
    spent: list = []
    requesters.settle(claim(token=token), spec=TRUSTED, spent=spent, now=NOW, chat="c")
    with pytest.raises(requesters.RequesterError, match="already used"):
        check(claim(token=token), spec=TRUSTED, spent=spent, now=NOW, chat="c")


def test_a_token_made_for_an_answer_and_a_message_at_once_is_refused():
    token = ISSUER.mint(
        "bob@example.com",
        issued_at=NOW,
        extra={
            ANSWER_CLAIM: {"chat": "c", "calls": {"r": "d"}},
            SEND_CLAIM: {"chat": "c", "message": "m"},
        },
    )
    with pytest.raises(IdentityError, match="made for one answer or one message"):
        verify_token(token, ISSUER.trust_spec(), now=NOW)
    with pytest.raises(IdentityError, match="'agent_send' claim is not"):
        verify_token(
            ISSUER.mint("b@x", issued_at=NOW, extra={SEND_CLAIM: {"chat": "c"}}),
            ISSUER.trust_spec(),
            now=NOW,
        )


def _gated(requester: Requester | None) -> CallState:
    return CallState(ref="r", name="pay", source="approval", status="pending", requester=requester)


def test_check_duties_refuses_the_same_identity_or_account_only_where_separated():
    spec = AgentSpec(
        name="a", model="m", tools=[ToolSpec(name="pay", description="", input_schema={})],
        approval=ApprovalSpec(separate_duties=True),
    )  # fmt: skip
    resume = ResumeInput(restart=[ToolRestart(name="pay", ref="r")])
    alice = Requester(identity="alice@x", verified=True, subject="acct-1")
    call = _gated(alice)
    assert governance.duties_separated(spec, call)
    for who in (Who(identity="alice@x"), Who(identity="ALICE@x", verified=True, subject="acct-1")):
        with pytest.raises(ResumeError, match="separates duties") as refused:
            governance.check_duties(resume, {"r": call}, spec=spec, who=who)
        assert refused.value.code == "forbidden"
    governance.check_duties(resume, {"r": call}, spec=spec, who=Who(identity="bob@x"))
    governance.check_duties(resume, {"r": _gated(None)}, spec=spec, who=Who(identity="alice@x"))
    off = spec.model_copy(update={"approval": ApprovalSpec()})
    governance.check_duties(resume, {"r": call}, spec=off, who=Who(identity="alice@x"))
    # An allowed tool is not gated, so nothing is separated for it.
    allowed = spec.model_copy(
        update={"approval": ApprovalSpec(allow=["pay"], separate_duties=True)}
    )
    assert not governance.duties_separated(
        allowed, _gated(alice).model_copy(update={"source": "tool"})
    )


def test_new_fields_stay_off_the_wire_when_unset():
    """Recorded histories and agent digests are unchanged by fields nobody set."""
    assert "separate_duties" not in ApprovalSpec().model_dump()
    assert "separate_duties" not in ToolSpec(name="x", description="", input_schema={}).model_dump()
    assert SendInput(text="hi").model_dump(mode="json") == {
        "text": "hi", "agent": None, "stream": False, "message_id": None,
    }  # fmt: skip
    sent = SendInput(text="hi", identity_token="secret.token.value")
    assert "secret.token.value" not in repr(sent)
    assert "requester" not in CallState(ref="r", name="n").model_dump()


# ---------------------------------------------------------------------------------------------
# Through the web app's login.


async def test_a_logged_in_users_message_carries_a_verified_requester(run_worker, model, client):
    """Behind the app's login, an AG-UI message carries an assertion made for that message: the
    requester is the login's, verified, on the interrupt's AG-UI metadata; the same person may
    not approve it (separation of duties), someone else may; no login reaches history, and the
    message's assertion, read from history, answers nothing."""
    exchange = exchange_for(
        jwt_login(
            IDP.private_key.public_key(), algorithms=["RS256"], issuer=IDP.issuer,
            audience=IDP.audience,
        )
    )  # fmt: skip
    agent = Agent(
        "loginPayments",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(separate_duties=True)],
        trust=exchange.trusted_issuer(),
    )
    model.reply(calls(("lookup", {"key": "k"}, "w1")), text("looked"))
    ann = IDP.mint("ann@example.com", expires_in=timedelta(hours=1))
    bob = IDP.mint("bob@example.com", expires_in=timedelta(hours=1))
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, identity=exchange)
        chat_id = f"chat-{uuid.uuid4()}"
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            seen = await frames(
                http,
                f"{base}/agui/{agent.name}",
                run_input(chat_id, "look k up"),
                headers={"Authorization": f"Bearer {ann}"},
            )
            finished = seen[-1].event
            assert finished["type"] == "RUN_FINISHED", [f.event for f in seen]
            (shown,) = finished["outcome"]["interrupts"]
            assert shown["metadata"]["requester"] == {
                "identity": "ann@example.com", "verified": True,
            }  # fmt: skip
            body = {"action": "approve", "input_digest": shown["metadata"]["inputDigest"]}
            mine = await answer(
                http, base, chat_id, "w1", body, headers={"Authorization": f"Bearer {ann}"}
            )
            assert mine.status_code == 403 and "separates duties" in mine.text, mine.text
            # The message's own assertion, copied from history, is no answer either.
            chat = await agents.chat(agent.name, chat_id=chat_id)
            sent = await _send_token_in_history(client, chat_id)
            (gated,) = await chat.pending()
            with pytest.raises(ResumeRejected, match="made for sending a message"):
                await chat.resume(answers=[gated.approve()], identity_token=sent)
            theirs = await answer(
                http, base, chat_id, "w1", body, headers={"Authorization": f"Bearer {bob}"}
            )
            assert theirs.status_code == 200, theirs.text
        (record,) = await chat.audit()
        assert record.identity == "bob@example.com"
        assert record.requester is not None and record.requester.verified
        assert record.requester.identity == "ann@example.com"
        events = await history_events(client, chat_id)
        assert scan(events, ann) == [] and scan(events, bob) == []
    assert t.RUNS["lookup"] == 1
    await assert_no_workflow_task_failed(client, chat_id)


async def _send_token_in_history(client, chat_id: str) -> str:
    """The identity token the chat's first send carried, as anyone who reads history finds it."""
    async for event in client.get_workflow_handle(chat_id).fetch_history_events():
        attrs = event.workflow_execution_update_accepted_event_attributes
        if attrs.accepted_request.input.name == "send":
            (payload,) = attrs.accepted_request.input.args.payloads
            token = json.loads(payload.data).get("identity_token")
            assert isinstance(token, str)
            return token
    raise AssertionError("no send in the chat's history")

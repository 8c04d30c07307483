"""The web app behind a login (client/web.py's identity), against a real dev server over HTTP.

An application mounts the app behind its own login. What an approver's answer carries to the
conversation is never the login itself: the app verifies the login (its own hook), then signs a
short assertion of its own for that one answer, bound to the chat, the call and the input shown,
which the agent verifies as it verifies any identity token (``Agent(trust=...)`` lists the app's
public key). What is proved here:

- a login token (a one-hour JWT, sent over HTTP) appears in no event of the chat's history;
- the same approver answers a second call of the same chat (each answer has its own assertion);
- an HS256 login (a secret only the app holds) answers, through the app's hook;
- an assertion answers nothing but the call it was made for, in the chat it was made for;
- a token is sent only to the run the app checked (its task queue), not to a run that took the
  chat's id in between.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from temporal_agent_interrupts import Agent, ToolApproval, agent_tool
from temporal_agent_interrupts.client import web
from temporal_agent_interrupts.client.api import AgentClient, Chat, approve
from temporal_agent_interrupts.client.login import Login, LoginExchange, jwt_login
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.errors import ResumeRejected, SendRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    StatusResult,
    TurnResult,
    input_digest,
)
from tests import agents as t
from tests.agents import SUB_RUNS, sub_pay
from tests.helpers import SUGGEST_AFTER_EVENTS, assert_no_workflow_task_failed, eventually
from tests.test_operator import VISIBILITY_TIMEOUT
from tests.web import answer, frames, run_input, served

LOOKUP = {"key": "k"}
RELEASE = {"service": "api", "version": "2"}
TWO = calls(("lookup", LOOKUP, "g1"), ("release", RELEASE, "r1"))
"""One model message with two gated calls."""


def gated(trust: Any, *, approvers: Sequence[str] = ("ann@example.com",)) -> Agent:
    return Agent(
        f"login-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup, t.release],
        middleware=[ToolApproval(allow=[], approvers=list(approvers))],
        trust=trust,
    )


async def paused(agents: AgentClient, agent: Agent) -> tuple[Chat, dict[str, str]]:
    chat = await agents.chat(agent.name)
    result = await chat.send("look k up and release api 2")
    assert [i.ref for i in result.interrupts] == ["g1", "r1"]
    return chat, {i.ref: i.input_digest for i in result.interrupts}


# ----------------------------------------------------------------------------------------------
# A token goes to the run whose task queue was checked, not to whatever holds the chat id next.

CAUGHT: list[Any] = []
"""What the impostor's worker was sent (it runs unsandboxed, in this process)."""


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class Impostor:
    """A workflow named like ours on a task queue of its own, polled by a worker of its own,
    started under a real chat's id once that chat's run is gone (terminating and starting
    workflows is what namespace write access grants). It shows the real chat's pending call."""

    @workflow.run
    async def run(self, agent: str) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query(dynamic=True)
    def any_query(self, name: str, args: Sequence[RawValue]) -> Any:
        paused = InterruptRequest(
            name="lookup", ref="g1", input=LOOKUP, source="approval",
            input_digest=input_digest(LOOKUP),
        )  # fmt: skip
        return StatusResult(
            chat_id=workflow.info().workflow_id,
            agent=workflow.memo_value("agent", "", type_hint=str),
            status="interrupted", turns=1, pending=[paused],
        ).model_dump(mode="json")  # fmt: skip

    @workflow.update(dynamic=True)
    async def any_update(self, name: str, args: Sequence[RawValue]) -> Any:
        CAUGHT.append(workflow.payload_converter().from_payload(args[0].payload))
        return TurnResult(turn=1, finish_reason=FinishReason.STOP).model_dump(mode="json")


@pytest.mark.parametrize("when", ["after the check", "as the answer is sent"])
async def test_a_token_goes_only_to_the_run_whose_task_queue_was_checked(
    run_worker, model, client, monkeypatch, when
):
    """``may_receive_token`` describes the chat (its latest run, on a trusted queue); the answer
    then went to the chat's latest run, whichever it was by then. A namespace holder who replaces
    the run in between (terminate, start an impostor under the same id on a queue of their own)
    received the approver's token. The answer is now pinned to the run that was checked: sent
    to a run that is gone, it is refused there, and the chat's run is checked again."""
    CAUGHT.clear()
    issuer = TokenIssuer("ES256")
    agent = gated(issuer.trust())
    model.reply(TWO)
    theirs = f"evil-{uuid.uuid4()}"
    async with (
        run_worker(agents=[agent]) as agents,
        Worker(
            client,
            task_queue=theirs,
            workflows=[Impostor],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
    ):
        chat, digest = await paused(agents, agent)
        replaced: list[str] = []

        async def replace(chat_id: str) -> None:
            if replaced:
                return
            replaced.append(chat_id)
            await client.get_workflow_handle(chat_id).terminate("replaced")
            await client.start_workflow(
                "AgentWorkflow", agent.name, id=chat_id, task_queue=theirs,
                memo={"agent": agent.name},
            )  # fmt: skip

        if when == "after the check":
            checked = web._App.may_receive_token

            async def racing(self: Any, target: Chat) -> Any:
                said = await checked(self, target)
                await replace(target.id)
                return said

            monkeypatch.setattr(web._App, "may_receive_token", racing)
        else:
            sent_by = Chat.resume

            async def sending(self: Chat, **kwargs: Any) -> Any:
                await replace(self.id)
                return await sent_by(self, **kwargs)

            monkeypatch.setattr(Chat, "resume", sending)
        token = issuer.mint("ann@example.com")
        app = agents_app(agents, identity="bearer")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(
                http,
                base,
                chat.id,
                "g1",
                {"action": "approve", "input_digest": digest["g1"]},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert replaced
        sent = [c.get("identity_token") for c in CAUGHT if isinstance(c, dict)]
        assert token not in sent, f"the token went to the impostor's worker ({r.status_code})"
        assert r.status_code == 403 and "does not send identity tokens" in r.text, r.text
        await client.get_workflow_handle(chat.id).terminate("test over")


# ----------------------------------------------------------------------------------------------
# A login never reaches a conversation; one person answers every call they may.

IDP = TokenIssuer("RS256", issuer="https://login.test", audience="our-app")
"""The application's own login provider: it issues one-hour logins (JWTs)."""


def exchange_for(verify: Any) -> LoginExchange:
    """The app's exchange: ``verify`` is the app's hook; its own Ed25519 key signs."""
    return LoginExchange(
        verify,
        key=ed25519.Ed25519PrivateKey.generate(),
        issuer="https://agents.test",
        audience="approvals",
    )


async def history_events(client: Any, chat_id: str) -> list[bytes]:
    """Every event of the chat's history (every run), as the server keeps it."""
    seen: list[bytes] = []
    async for event in client.get_workflow_handle(chat_id).fetch_history_events():
        seen.append(event.SerializeToString())
    return seen


def scan(events: list[bytes], secret: str) -> list[int]:
    """The events whose payloads (or anything else in them) hold ``secret``'s bytes."""
    needle = secret.encode()
    return [i for i, e in enumerate(events) if needle in e]


async def test_a_login_sent_as_a_bearer_token_never_reaches_history(run_worker, model, client):
    """As the docs showed (``identity="bearer"`` behind a JWT login), the approver's one-hour
    login was written in clear text into the ``UPDATE_ACCEPTED`` event, replayable against the
    application's own APIs for the rest of its hour. A bearer token that is a login (valid for
    more than 15 minutes, or no JWT at all) is now refused before anything is sent."""
    issuer = TokenIssuer("ES256", issuer=IDP.issuer, audience=IDP.audience)
    agent = gated(issuer.trust())
    model.reply(TWO)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        login = issuer.mint("ann@example.com", expires_in=timedelta(hours=1))
        opaque = f"session-{uuid.uuid4().hex}{uuid.uuid4().hex}"
        app = agents_app(agents, identity="bearer")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            for token in (login, opaque):
                r = await answer(
                    http,
                    base,
                    chat.id,
                    "g1",
                    {"action": "approve", "input_digest": digest["g1"]},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert r.status_code == 401 and r.json()["code"] == "not_per_answer", r.text
                assert token not in r.text
        events = await history_events(client, chat.id)
        assert scan(events, login) == [] and scan(events, opaque) == []
        assert [i.ref for i in await chat.pending()] == ["g1", "r1"]


async def test_a_login_never_reaches_history_and_one_person_answers_every_call(
    run_worker, model, client, caplog
):
    """Behind a JWT login (a real one-hour RS256 token over HTTP), through the exchange: the
    same approver answers both calls of the chat, each answer with an assertion of its own; no
    event of the chat's history holds the login's bytes, and no log line does."""
    caplog.set_level(logging.DEBUG)
    exchange = exchange_for(
        jwt_login(
            IDP.private_key.public_key(),
            algorithms=["RS256"],
            issuer=IDP.issuer,
            audience=IDP.audience,
        )
    )
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        login = IDP.mint("ann@example.com", expires_in=timedelta(hours=1))
        as_ann = {"Authorization": f"Bearer {login}"}
        app = agents_app(agents, identity=exchange)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{base}/api/whoami", headers=as_ann)).json() == {
                "identity": "ann@example.com",
                "mode": "login",
            }
            first = await answer(
                http,
                base,
                chat.id,
                "g1",
                {"action": "approve", "input_digest": digest["g1"]},
                headers=as_ann,
            )
            assert first.status_code == 200, first.text
            second = await answer(
                http,
                base,
                chat.id,
                "r1",
                {"action": "approve", "input_digest": digest["r1"]},
                headers=as_ann,
            )
            assert second.status_code == 200, second.text
            assert second.json()["result"]["text"] == "done"
            # No login, or a forged one: refused before anything is sent.
            for headers in ({}, {"Authorization": f"Bearer {TokenIssuer().mint('ann@x.y')}"}):
                r = await answer(http, base, chat.id, "g1", {"action": "approve",
                                 "input_digest": digest["g1"]}, headers=headers)  # fmt: skip
                assert r.status_code == 401 and r.json()["code"] == "no_identity", r.text
        records = await chat.audit()
        assert [(r.ref, r.identity, r.identity_verified) for r in records] == [
            ("g1", "ann@example.com", True),
            ("r1", "ann@example.com", True),
        ]
        assert t.RUNS["lookup"] == t.RUNS["release"] == 1
        events = await history_events(client, chat.id)
        assert scan(events, login) == [], "the login is in the chat's history"
        # The scan reads the updates' payloads: each answer's own identity token is there.
        assert len(scan(events, '"identity_token"')) >= 2
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    assert login not in logged
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_hs256_login_answers_through_the_apps_hook(run_worker, model, client):
    """An HS256 login (a secret the application shares with its login service) could not be
    used at all: an agent never trusts a shared secret. The app's hook verifies it; the answer
    carries the app's assertion, with the login's groups (``group:treasury`` approves), by the
    approvals API and by AG-UI."""
    secret = os.urandom(32)
    exchange = exchange_for(jwt_login(secret, algorithms=["HS256"], audience="our-app"))
    agent = gated(exchange.trusted_issuer(), approvers=["group:treasury"])
    model.reply(TWO, text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        now = int(time.time())
        claims = {"sub": "u-17", "email": "bob@example.com", "groups": ["treasury"],
                  "aud": "our-app", "iat": now, "exp": now + 3600}  # fmt: skip
        login = jwt.encode(claims, secret, algorithm="HS256")
        as_bob = {"Authorization": f"Bearer {login}"}
        outsider = jwt.encode({**claims, "groups": ["sales"]}, secret, algorithm="HS256")
        app = agents_app(agents, identity=exchange)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(http, base, chat.id, "g1", {"action": "approve",
                             "input_digest": digest["g1"]},
                             headers={"Authorization": f"Bearer {outsider}"})  # fmt: skip
            assert r.status_code == 403 and "may be answered only by" in r.text, r.text
            r = await answer(
                http,
                base,
                chat.id,
                "g1",
                {"action": "approve", "input_digest": digest["g1"]},
                headers=as_bob,
            )
            assert r.status_code == 200, r.text
            entry = {
                "interruptId": "r1",
                "status": "resolved",
                "payload": {"approved": True},
                "metadata": {"inputDigest": digest["r1"]},
            }
            seen = await frames(
                http,
                f"{base}/agui/{agent.name}",
                run_input(chat.id, resume=[entry]),
                headers=as_bob,
            )
            assert seen[-1].type == "RUN_FINISHED", [f.event for f in seen]
        records = await chat.audit()
        assert [(r.ref, r.identity, r.identity_verified) for r in records] == [
            ("g1", "bob@example.com", True),
            ("r1", "bob@example.com", True),
        ]
        assert scan(await history_events(client, chat.id), login) == []


async def test_an_opaque_session_login_answers_through_the_apps_hook(
    run_worker, model, client, caplog
):
    """An opaque login (a session token looked up in the application's own store, no JWT at
    all) works through the app's hook: the hook reads the store, the answer carries the app's
    assertion with the session's identity and groups, and one session answers both calls. The
    session token is in no event of the chat's history and no log line; an unknown session
    answers nothing."""
    caplog.set_level(logging.DEBUG)
    sessions = {f"sess-{uuid.uuid4().hex}{uuid.uuid4().hex}": Login(
        identity="bob@example.com", groups=("treasury",), subject="u-17"
    )}  # fmt: skip
    (session,) = sessions

    async def from_the_store(request: Any) -> Login | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return sessions.get(token) if scheme.lower() == "bearer" else None

    exchange = exchange_for(from_the_store)
    agent = gated(exchange.trusted_issuer(), approvers=["group:treasury"])
    model.reply(TWO, text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=exchange)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            unknown = f"sess-{uuid.uuid4().hex}"
            r = await answer(http, base, chat.id, "g1", {"action": "approve",
                             "input_digest": digest["g1"]},
                             headers={"Authorization": f"Bearer {unknown}"})  # fmt: skip
            assert r.status_code == 401, r.text
            for ref in ("g1", "r1"):
                r = await answer(
                    http,
                    base,
                    chat.id,
                    ref,
                    {"action": "approve", "input_digest": digest[ref]},
                    headers={"Authorization": f"Bearer {session}"},
                )
                assert r.status_code == 200, r.text
                assert session not in r.text
        last = await chat.last_turn()
        assert last is not None and last.text == "done", last
        records = await chat.audit()
        assert [(r.ref, r.identity, r.identity_verified) for r in records] == [
            ("g1", "bob@example.com", True),
            ("r1", "bob@example.com", True),
        ]
        assert scan(await history_events(client, chat.id), session) == []
        logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
        assert session not in logged
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_assertion_answers_only_the_call_and_chat_it_was_made_for(
    run_worker, model, client
):
    """What an assertion may answer is checked in the workflow, like its issuer, audience and
    expiry: a copy read from one chat's history (or taken in flight) answers nothing in another
    chat, no other call, and no other input; and it answers its own call once."""
    exchange = exchange_for(lambda request: None)
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO, TWO)
    ann = Login(identity="ann@example.com")
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        other, _ = await paused(agents, agent)
        (g1, _r1) = await chat.pending()
        made = exchange.assertion(ann, chat_id=chat.id, calls={"g1": digest["g1"]})
        refusals = {
            "another chat": (other, made, "another conversation", "forbidden"),
            "another call": (chat, made, "other calls", "forbidden"),
            "another input": (
                chat,
                exchange.assertion(ann, chat_id=chat.id, calls={"g1": input_digest({"k": 1})}),
                "another input",
                "conflict",
            ),
        }
        for why, (target, token, reason, code) in refusals.items():
            shown = {i.ref: i for i in await target.pending()}
            ref = "r1" if why == "another call" else "g1"
            with pytest.raises(ResumeRejected) as refused:
                await target.resume(answers=[approve(shown[ref])], identity_token=token)
            assert reason in str(refused.value) and refused.value.code == code, why
        result = await chat.resume(answers=[approve(g1)], identity_token=made)
        assert [i.ref for i in result.interrupts] == ["r1"]
        (record,) = await chat.audit()
        assert (record.identity, record.identity_verified) == ("ann@example.com", True)
        assert await other.audit() == []
        await assert_no_workflow_task_failed(client, chat.id)
        await assert_no_workflow_task_failed(client, other.id)


# ----------------------------------------------------------------------------------------------
# A sub-agent's call, answered through its caller's chat.

SUB_EXCHANGE = exchange_for(
    jwt_login(
        IDP.private_key.public_key(), algorithms=["RS256"], issuer=IDP.issuer, audience=IDP.audience
    )
)
login_payments = Agent(
    f"loginPayments-{uuid.uuid4().hex[:6]}",
    system="You pay, for verified approvers only.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
    trust=SUB_EXCHANGE.trusted_issuer(),
)
login_boss = Agent(
    f"loginBoss-{uuid.uuid4().hex[:6]}", system="You delegate.", tools=[agent_tool(login_payments)]
)


async def test_a_sub_agents_call_is_answered_through_its_caller_with_an_assertion(client):
    """The assertion names the chat the answer was sent to, the caller's; the sub-agent takes
    its caller's id (Temporal's record of its parent) as well as its own, and nothing else."""
    async with hosted(client, agents=[login_boss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat(login_boss.name)
        task = f"call pay {json.dumps({'to': 'login-sub', 'amount': 1})}"
        (i,) = (
            await parent.send(f"call {login_payments.name} {json.dumps({'input': task})}")
        ).interrupts
        assert i.chat_id is not None
        app = agents_app(agents, identity=SUB_EXCHANGE)
        login = IDP.mint("cfo@example.com", expires_in=timedelta(hours=1))
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(
                http,
                base,
                parent.id,
                i.ref,
                {"action": "approve", "input_digest": i.input_digest},
                headers={"Authorization": f"Bearer {login}"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["result"]["finish_reason"] == "stop"
        assert SUB_RUNS["login-sub"] == 1
        (record,) = await agents.audit(i.chat_id)
        assert (record.identity, record.identity_verified) == ("cfo@example.com", True)
        for chat_id in (parent.id, i.chat_id):
            assert scan(await history_events(client, chat_id), login) == []
    await assert_no_workflow_task_failed(client, parent.id)


async def test_an_answer_pinned_to_a_run_that_continued_as_new_goes_to_the_new_run(
    small_histories, model, monkeypatch
):
    """The pin holds the answer to the run that was checked; a real continue-as-new between the
    check and the send closes that run, and the answer is checked against the chat's new run and
    sent there, rather than refused as if the chat were closed."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    exchange = exchange_for(lambda request: Login(identity="ann@example.com"))
    agent = gated(exchange.trusted_issuer())
    model.reply(TWO)
    async with build_worker(client, agents=[agent], task_queue=queue, gemini=model.client()):
        agents = AgentClient(client, task_queue=queue)
        chat, digest = await paused(agents, agent)
        handle = client.get_workflow_handle(chat.id)
        first_run = (await handle.describe()).run_id
        sent_by = Chat.resume
        pinned: list[str | None] = []

        async def sending(self: Chat, **kwargs: Any) -> Any:
            if not pinned:
                # Refused signals make the paused run continue as new (past RUN.can_signals of
                # them, or its history's suggestion); the server takes 20 a run, so one it
                # refuses meanwhile (past the 20, or while the run closes) ends the sending.
                for n in range(SUGGEST_AFTER_EVENTS):
                    try:
                        await handle.signal(
                            "resume",
                            {"respond": [{"name": "lookup", "ref": f"x{n}", "output": {}}]},
                        )
                    except RPCError:
                        break
                await eventually(
                    handle.describe, lambda d: d.run_id != first_run, timeout=VISIBILITY_TIMEOUT
                )
            pinned.append(kwargs.get("run_id"))
            return await sent_by(self, **kwargs)

        monkeypatch.setattr(Chat, "resume", sending)
        app = agents_app(agents, identity=exchange)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(
                http, base, chat.id, "g1", {"action": "approve", "input_digest": digest["g1"]}
            )
        assert r.status_code == 200, r.text
        assert pinned[0] == first_run and pinned[-1] != first_run
        assert [i.ref for i in await chat.pending()] == ["r1"]
        (record,) = await chat.audit()
        assert (record.identity, record.identity_verified) == ("ann@example.com", True)


login_middle = Agent(
    f"loginMiddle-{uuid.uuid4().hex[:6]}",
    system="You delegate.",
    tools=[agent_tool(login_payments)],
)
login_top = Agent(
    f"loginTop-{uuid.uuid4().hex[:6]}", system="You delegate.", tools=[agent_tool(login_middle)]
)


async def test_a_nested_sub_agents_call_is_answered_through_the_top_callers_chat(client):
    """Two levels down: the assertion names the top caller's chat, an ancestor the sub-agent
    knows from Temporal (its root) and from its own id (each sub-agent's id extends its
    caller's)."""
    async with hosted(client, agents=[login_top], model=ScriptedModel(offline_rules)) as agents:
        top = await agents.chat(login_top.name)
        pay = f"call pay {json.dumps({'to': 'login-nested', 'amount': 1})}"
        middle = f"call {login_payments.name} {json.dumps({'input': pay})}"
        (i,) = (
            await top.send(f"call {login_middle.name} {json.dumps({'input': middle})}")
        ).interrupts
        assert i.chat_id is not None and i.chat_id.count("--") >= 2
        app = agents_app(agents, identity=SUB_EXCHANGE)
        login = IDP.mint("cfo@example.com", expires_in=timedelta(hours=1))
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(
                http,
                base,
                top.id,
                i.ref,
                {"action": "approve", "input_digest": i.input_digest},
                headers={"Authorization": f"Bearer {login}"},
            )
            assert r.status_code == 200, r.text
        assert SUB_RUNS["login-nested"] == 1
        (record,) = await agents.audit(i.chat_id)
        assert (record.identity, record.identity_verified) == ("cfo@example.com", True)
    await assert_no_workflow_task_failed(client, top.id)


async def test_an_update_refused_while_its_run_closes_goes_to_the_next_run_or_back_to_the_pin(
    small_histories, monkeypatch
):
    """The server refuses an update while the run's continue-as-new task completes ("workflow
    is closing"; seen once in a clean-clone run of the test above). Nothing was applied: an
    unpinned answer is sent again, to the chat's next run; a pinned one is refused as a closed
    run, which the approvals app checks and sends again."""
    agents = AgentClient(small_histories.client, task_queue=f"tq-{uuid.uuid4()}")
    chat = await agents.chat("anyone")
    closing = RPCError(
        "workflow operation can not be applied because workflow is closing",
        RPCStatusCode.FAILED_PRECONDITION,
        b"",
    )
    sent: list[str | None] = []

    async def once(self: Chat, update: Any, arg: Any, **kwargs: Any) -> Any:
        sent.append(kwargs["run_id"])
        if len(sent) < 3:
            raise closing
        return "taken"

    monkeypatch.setattr(Chat, "_update_once", once)
    assert await chat._update(None, None, worker_timeout=None) == "taken"
    assert sent == [None, None, None]
    sent.clear()
    with pytest.raises(SendRejected, match="is closed"):
        await chat._update(None, None, worker_timeout=None, run_id="run-1")
    assert sent == ["run-1"]

"""Slack's interactivity endpoint (``client/slack.py``): a signed click answers as the
directory's identity of the clicking user, through the approvals path, once; anything not
Slack's, not now or seen before is refused before it reaches anything. Against the dev server
over HTTP, with the clicks' messages posted by the worker's ``SlackChannel`` to a loopback
stand-in of Slack (``tests/slack_standin.py``), which also takes the ephemeral replies."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from cryptography.hazmat.primitives.asymmetric import ed25519
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval
from temporal_agent_interrupts.activities.slack import APPROVE, DENY
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.login import LoginExchange
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.web import SlackInteractivity
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted, tool_runs
from temporal_agent_interrupts.workflows.types import InterruptRequest
from tests import slack_worker as w
from tests.docs import block
from tests.helpers import assert_no_workflow_task_failed, events_of, eventually, history
from tests.slack_standin import (
    SIGNING_SECRET,
    TOKEN,
    Message,
    SlackStandIn,
    click_payload,
    signed,
    slack_standin,
)
from tests.test_docs_examples import load
from tests.test_presentation import PAY, send_payment
from tests.test_slack_messages import quick
from tests.web import served


@dataclass
class Desk:
    """A paused payment, its Slack message, and the web app that takes its clicks."""

    agents: AgentClient
    chat: Chat
    request: InterruptRequest
    message: Message
    # The message as posted, buttons and all: a click may come from a client that has not
    # shown its update yet.
    as_posted: Message
    slack: SlackStandIn
    http: httpx2.AsyncClient
    base: str

    async def click(
        self,
        action: str,
        *,
        user: str = w.CFO,
        team: str = "T0TEAM",
        at: int | None = None,
        secret: str = SIGNING_SECRET,
    ) -> tuple[httpx2.Response, bytes, dict[str, str]]:
        hook = f"{self.slack.url}/response/{uuid.uuid4().hex[:8]}"
        payload = click_payload(
            self.as_posted, action=action, user=user, response_url=hook, team=team
        )
        body, headers = signed(payload, secret=secret, at=at)
        return await self.post(body, headers), body, headers

    async def post(self, body: bytes, headers: dict[str, str]) -> httpx2.Response:
        return await self.http.post(
            f"{self.base}/slack/interactivity", content=body, headers=headers
        )

    async def reply(self) -> str:
        """The ephemeral reply the next click got (through its response_url)."""
        seen = await eventually(
            lambda: asyncio.sleep(0, list(self.slack.responses)), bool, timeout=30
        )
        reply = seen[-1]
        assert reply["response_type"] == "ephemeral" and reply["replace_original"] is False
        self.slack.responses.clear()
        return str(reply["text"])


@asynccontextmanager
async def desk(
    run_worker: Any,
    model: Any,
    agent: Agent,
    *,
    identity: LoginExchange | None = None,
    dm: bool = False,
) -> AsyncIterator[Desk]:
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    async with slack_standin() as slack:
        channel = w.channel(slack.url, dm=dm)
        async with run_worker(agents=[agent], channels={"slack": channel}) as agents:
            chat = await agents.chat(agent.name)
            res = await chat.send("Pay the rent.")
            assert res.finish_reason == FinishReason.INTERRUPTED
            (request,) = res.interrupts
            posted = await eventually(lambda: asyncio.sleep(0, slack.posted()), bool)
            interactivity = SlackInteractivity(
                signing_secret=SIGNING_SECRET,
                directory=w.DIRECTORY,
                response_urls=f"{slack.url}/response/",
            )
            app = agents_app(agents, identity=identity, slack=interactivity)
            async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
                first = posted[-1]
                yield Desk(agents, chat, request, first, copy.deepcopy(first), slack, http, base)


def updates(events: Sequence[Any]) -> list[Any]:
    return [
        e
        for e in events
        if e.event_type
        in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        )
    ]


async def test_a_signed_click_from_a_mapped_approver_runs_the_tool_once_and_updates_the_message(
    run_worker, model, client
):
    agent = w.agent(name=f"slack_{uuid.uuid4().hex[:8]}")
    async with desk(run_worker, model, agent) as d:
        response, _, _ = await d.click(APPROVE)
        # Slack is answered at once; the answer goes on behind it.
        assert response.status_code == 200 and response.content == b""
        assert "was taken" in await d.reply()
        status = await eventually(d.chat.status, lambda s: s.status == "idle", timeout=30)
        assert status.last_turn is not None and status.last_turn.text == "paid"
        assert (await tool_runs(d.chat))["sendPayment"] == 1
        # The worker's channel updated the message to its end, without buttons.
        await eventually(lambda: asyncio.sleep(0, d.message.updates), bool)
        assert "Approved by cfo@example.com" in d.message.text
        assert not [b for b in d.message.blocks if b.get("type") == "actions"]
        (answered,) = [r for r in await d.agents.audit(d.chat.id) if r.kind != "notified"]
        assert (answered.identity, answered.decision, answered.via) == (
            "cfo@example.com",
            "approved",
            "update",
        )
        assert answered.metadata == {"via": "slack", "slack_user": w.CFO}
    await assert_no_workflow_task_failed(client, d.chat.id)


async def test_behind_a_login_exchange_a_click_answers_a_trusted_agent_as_a_verified_group_member(
    run_worker, model, client
):
    """For an agent with ``trust=``, the click is answered with the app's per-answer assertion
    of the directory's identity and groups: ``group:treasury`` admits the treasurer, verified,
    who was sent a DM through the same directory."""
    exchange = LoginExchange(
        lambda _: None,  # no browser logins here: only Slack's clicks answer
        key=ed25519.Ed25519PrivateKey.generate(),
        issuer="https://agents.test",
        audience="approvals",
    )
    agent = Agent(
        f"slack_trusted_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=["group:treasury"])],
        notify=["slack"],
        trust=exchange.trusted_issuer(),
    )
    async with desk(run_worker, model, agent, identity=exchange, dm=True) as d:
        assert [m.channel for m in d.slack.posted()] == [w.CHANNEL, "D0TREASURY"]
        # The CFO is in the directory but not in the group: refused by the conversation.
        await d.click(APPROVE, user=w.CFO)
        assert "Not applied" in await d.reply()
        await d.click(APPROVE, user=w.TREASURER)
        assert "was taken" in await d.reply()
        await eventually(d.chat.status, lambda s: s.status == "idle", timeout=30)
        assert (await tool_runs(d.chat))["sendPayment"] == 1
        (answered,) = [r for r in await d.agents.audit(d.chat.id) if r.kind != "notified"]
        assert answered.identity == "treasurer@example.com"
        assert answered.identity_verified is True
        for message in d.slack.posted():
            await eventually(lambda m=message: asyncio.sleep(0, m.updates), bool)
            assert "Approved by treasurer@example.com" in message.text
    await assert_no_workflow_task_failed(client, d.chat.id)


async def test_a_replayed_tampered_or_stale_click_gets_401_and_leaves_no_event(
    run_worker, model, client
):
    agent = w.agent(name=f"slack_{uuid.uuid4().hex[:8]}")
    async with desk(run_worker, model, agent) as d:
        before = (await history(client, d.chat.id)).events
        payload = click_payload(
            d.message, action=APPROVE, user=w.CFO, response_url=f"{d.slack.url}/response/x"
        )
        body, headers = signed(payload)
        tampered = body.replace(b"U0CFO", b"U0TREASURY")
        assert tampered != body
        refused = [
            await d.post(tampered, headers),  # the body changed after it was signed
            (await d.click(APPROVE, at=int(time.time()) - 5 * 60 - 1))[0],  # stale
            (await d.click(APPROVE, at=int(time.time()) + 5 * 60 + 1))[0],  # from the future
            (await d.click(APPROVE, secret="not-the-apps-secret"))[0],
            await d.post(body, {"content-type": headers["content-type"]}),  # unsigned
        ]
        assert [r.status_code for r in refused] == [401] * len(refused)
        after = (await history(client, d.chat.id)).events
        assert len(after) == len(before) and updates(after) == updates(before)
        assert d.slack.responses == []
        assert await d.chat.pending()

        # The genuine click answers; the same request again is a replay.
        first = await d.post(body, headers)
        assert first.status_code == 200
        await eventually(d.chat.status, lambda s: s.status == "idle", timeout=30)
        answered = (await history(client, d.chat.id)).events
        replay = await d.post(body, headers)
        assert replay.status_code == 401 and b"seen before" in replay.content
        assert len(updates((await history(client, d.chat.id)).events)) == len(updates(answered))
        assert (await tool_runs(d.chat))["sendPayment"] == 1
    await assert_no_workflow_task_failed(client, d.chat.id)


async def test_an_unmapped_slack_user_or_another_workspace_is_refused_and_nothing_is_applied(
    run_worker, model, client
):
    agent = w.agent(name=f"slack_{uuid.uuid4().hex[:8]}")
    async with desk(run_worker, model, agent) as d:
        before = updates((await history(client, d.chat.id)).events)
        response, _, _ = await d.click(APPROVE, user=w.OUTSIDER)
        assert response.status_code == 200
        assert "not in the approvers' directory" in await d.reply()
        # A directory user id, from a workspace the directory is not for.
        await d.click(APPROVE, user=w.CFO, team="T0OTHER")
        assert "not the one the approvals are set up for" in await d.reply()
        assert updates((await history(client, d.chat.id)).events) == before
        assert [i.ref for i in await d.chat.pending()] == [d.request.ref]
        assert d.message.updates == []
    await assert_no_workflow_task_failed(client, d.chat.id)


async def test_a_click_after_the_call_was_answered_through_the_api_changes_nothing_and_says_who(
    run_worker, model, client
):
    agent = w.agent(name=f"slack_{uuid.uuid4().hex[:8]}")
    async with desk(run_worker, model, agent) as d:
        done = await d.chat.resume(answers=[d.request.approve()], identity="treasurer@example.com")
        assert done.finish_reason == FinishReason.STOP
        answered = updates((await history(client, d.chat.id)).events)
        response, _, _ = await d.click(DENY, user=w.CFO)
        assert response.status_code == 200
        said = await d.reply()
        assert "already answered (approved) by treasurer@example.com" in said
        assert "nothing was changed" in said
        assert updates((await history(client, d.chat.id)).events) == answered
        records = [r for r in await d.agents.audit(d.chat.id) if r.kind != "notified"]
        assert [(r.identity, r.decision) for r in records] == [
            ("treasurer@example.com", "approved")
        ]
        assert (await tool_runs(d.chat))["sendPayment"] == 1
    hist = await assert_no_workflow_task_failed(client, d.chat.id)
    # The send, and the one answer.
    assert len(events_of(hist, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)) == 2


async def test_the_slack_pages_setup_posts_a_paused_call_and_answers_its_click_offline(
    client, tmp_path, monkeypatch
):
    """docs/answering/slack.md's module, run as printed, with its secrets in the environment
    and Slack's Web API at the loopback stand-in (``SLACK_API_URL``)."""
    source = block("# approvals_slack.py: imported by the worker and by the web app", lang="python")
    async with slack_standin() as slack:
        monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
        monkeypatch.setenv("SLACK_APPROVALS_CHANNEL", w.CHANNEL)
        monkeypatch.setenv("SLACK_API_URL", f"{slack.url}/api/")
        monkeypatch.setenv("SLACK_SIGNING_SECRET", SIGNING_SECRET)
        page = load(tmp_path, "approvals_slack", source, monkeypatch)
        model = ScriptedModel(
            [calls(("sendPayment", {"amount": 125000, "iban": "DE89"}, "p1")), text("sent")]
        )
        async with hosted(
            client, agents=[page.payments], model=model, channels=page.channels()
        ) as agents:
            chat = await agents.chat("payments")
            res = await chat.send("Pay the supplier.")
            assert res.finish_reason == FinishReason.INTERRUPTED
            posted = await eventually(
                lambda: asyncio.sleep(0, slack.posted()), lambda p: len(p) == 3
            )
            # The channel, and each approver's DM.
            assert [m.channel for m in posted] == [w.CHANNEL, "D024BE7LH", "D0G9QF9C6"]
            app = agents_app(agents, slack=page.interactivity())
            async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
                payload = click_payload(
                    posted[1],
                    action=APPROVE,
                    user="U024BE7LH",
                    team="T061EG9R6",
                    response_url="https://hooks.slack.com/actions/T061EG9R6/1/x",
                )
                body, headers = signed(payload)
                clicked = await http.post(
                    f"{base}/slack/interactivity", content=body, headers=headers
                )
                assert clicked.status_code == 200
                await eventually(chat.status, lambda s: s.status == "idle", timeout=30)
            assert (await tool_runs(chat))["sendPayment"] == 1
            for message in posted:
                await eventually(lambda m=message: asyncio.sleep(0, m.updates), bool)
                assert "Approved by cfo@example.com" in message.text


async def test_a_click_after_the_call_expired_changes_nothing_and_says_so(
    run_worker, model, client
):
    agent = Agent(
        f"slack_quick_{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[quick], notify=["slack"]
    )
    model.reply(calls(("quickAsk", {"question": "ok?"}, "q1")), text("went on"))
    async with (
        slack_standin() as slack,
        run_worker(agents=[agent], channels={"slack": w.channel(slack.url)}) as agents,
    ):
        chat = await agents.chat(agent.name)
        assert (await chat.send("Ask it.")).finish_reason == FinishReason.INTERRUPTED
        (message,) = await eventually(lambda: asyncio.sleep(0, slack.posted()), bool)
        as_posted = copy.deepcopy(message)
        await eventually(chat.status, lambda s: s.status == "idle", timeout=30)
        await eventually(lambda: asyncio.sleep(0, message.updates), bool)
        assert message.text.startswith("Expired")
        interactivity = SlackInteractivity(
            signing_secret=SIGNING_SECRET,
            directory=w.DIRECTORY,
            response_urls=f"{slack.url}/response/",
        )
        app = agents_app(agents, slack=interactivity)
        async with served(app) as base, httpx2.AsyncClient(timeout=30) as http:
            payload = click_payload(
                as_posted, action=APPROVE, user=w.CFO, response_url=f"{slack.url}/response/e"
            )
            body, headers = signed(payload)
            before = updates((await history(client, chat.id)).events)
            clicked = await http.post(f"{base}/slack/interactivity", content=body, headers=headers)
            assert clicked.status_code == 200
            (reply,) = await eventually(lambda: asyncio.sleep(0, slack.responses), bool)
        assert "expired before it was answered" in reply["text"]
        assert updates((await history(client, chat.id)).events) == before
        records = [r for r in await agents.audit(chat.id) if r.kind != "notified"]
        assert [r.kind for r in records] == ["deadline"]
    await assert_no_workflow_task_failed(client, chat.id)

"""A paused call posted to Slack once (to a channel and to each approver's DM), even when its
worker is SIGKILLed mid-post, each message updated to how the call ended, and Slack down for a
whole deadline kept out of the turn and on record. Against the dev server, with ``slack-sdk``
pointed at a loopback stand-in of Slack's Web API (``tests/slack_standin.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, interrupt
from temporal_agent_interrupts.activities.slack import APPROVE, DENY, EVENT_TYPE, OPEN
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from tests import slack_worker as w
from tests.helpers import (
    assert_no_workflow_task_failed,
    events_of,
    eventually,
    history,
    server_address,
)
from tests.slack_standin import TOKEN, Message, slack_standin
from tests.test_presentation import PAY

ROOT = Path(__file__).parent.parent
WORKER = [sys.executable, "-m", "tests.slack_worker"]


def texts(message: Message) -> str:
    """Every text of a message's blocks, as Slack would render them (mrkdwn source)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("text"), str):
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(message.blocks)
    return "\n".join(found)


def buttons(message: Message) -> dict[str, dict[str, Any]]:
    return {
        e["action_id"]: e
        for b in message.blocks
        if b.get("type") == "actions"
        for e in b.get("elements", [])
    }


async def notified(agents: AgentClient, chat_id: str) -> list[Any]:
    return [r for r in await agents.audit(chat_id) if r.kind == "notified"]


async def test_a_paused_call_is_posted_once_to_the_channel_and_each_approvers_dm(
    run_worker, model, client
):
    agent = w.agent(name=f"slack_{uuid.uuid4().hex[:8]}")
    asked = "Pay the rent <!everyone> & see <https://evil.example|the invoice>"
    model.reply(calls(("sendPayment", PAY, "p1"), say="Paying *rent* now."), text("paid"))
    async with slack_standin() as slack:
        channel = w.channel(slack.url, dm=True)
        async with run_worker(agents=[agent], channels={"slack": channel}) as agents:
            chat = await agents.chat(agent.name)
            res = await chat.send(asked, identity="clerk@example.com")
            assert res.finish_reason == FinishReason.INTERRUPTED
            (request,) = res.interrupts
            posted = await eventually(
                lambda: asyncio.sleep(0, slack.posted()), lambda p: len(p) == 3
            )
            # The channel, then each approver's DM.
            assert [m.channel for m in posted] == [w.CHANNEL, "D0CFO", "D0TREASURY"]
            for message in posted:
                assert message.metadata is not None
                assert message.metadata["event_type"] == EVENT_TYPE
                shown = texts(message)
                assert "Approval needed:" in shown
                assert "Pay 7,300.00 EUR to NL91 …00" in shown
                assert "Risk high" in shown and "Money leaves" in shown
                assert "clerk@example.com" in shown
                assert "cfo@example.com, treasurer@example.com" in shown
                # The user's words and the model's, escaped: no mention, no link, no markup.
                assert "&lt;!everyone&gt; &amp; see &lt;https://evil.example|the invoice&gt;" in (
                    shown
                )
                assert "<!everyone>" not in json.dumps(message.blocks)
                assert "<https://evil" not in json.dumps(message.blocks)
                assert "Paying *rent* now." in shown
                found = buttons(message)
                assert set(found) == {APPROVE, DENY, OPEN}
                assert found[OPEN]["url"] == "https://approvals.example.com/inbox"
                value = json.loads(found[APPROVE]["value"])
                assert value == {
                    "chat": chat.id,
                    "ref": request.ref,
                    "digest": request.input_digest,
                }
            assert len({m.metadata["event_payload"]["key"] for m in posted if m.metadata}) == 1
            assert len(slack.called("chat.postMessage")) == 3
            # A first attempt posts without looking: nothing was posted before it.
            assert slack.called("conversations.history") == []

            done = await chat.resume(answers=[request.approve()], identity="cfo@example.com")
            assert done.finish_reason == FinishReason.STOP
            await eventually(
                lambda: asyncio.sleep(0, [m for m in posted if m.updates]),
                lambda u: len(u) == 3,
            )
            for message in posted:
                assert len(message.updates) == 1
                assert "Approved by cfo@example.com" in message.text
                assert buttons(message) == {}
            records = await eventually(lambda: notified(agents, chat.id), lambda r: len(r) == 2)
            assert {(r.delivered, (r.metadata or {}).get("notice")) for r in records} == {
                (True, "paused"),
                (True, "settled"),
            }
    hist = await assert_no_workflow_task_failed(client, chat.id)
    # The bot token is the worker's: never in history.
    assert TOKEN not in json.dumps(hist.to_json_dict())
    # It was sent to Slack with every call, and only as the Authorization header.
    assert all(TOKEN not in json.dumps(params) for _, params in slack.calls)


async def test_a_post_whose_worker_was_killed_is_found_and_not_posted_again(client):
    """The stand-in takes the post and holds its answer; the worker is SIGKILLed; the retry on
    a fresh worker finds the message by its metadata key instead of posting a second."""
    queue = f"tq-{uuid.uuid4()}"
    address = server_address(client)
    async with slack_standin() as slack:
        slack.hold_posts = asyncio.Event()

        def worker() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [*WORKER, address, client.namespace, queue, slack.url],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

        def ready(proc: subprocess.Popen[bytes]) -> None:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"

        first = worker()
        try:
            await asyncio.to_thread(ready, first)
            agents = AgentClient(client, task_queue=queue)
            chat = await agents.chat(w.AGENT)
            paused = await chat.send(f"call sendPayment {json.dumps(PAY)}")
            assert paused.finish_reason == FinishReason.INTERRUPTED
            await eventually(lambda: asyncio.sleep(0, slack.posted()), lambda p: len(p) == 1)
            first.send_signal(signal.SIGKILL)  # Slack has the message; the worker never knew
            await asyncio.to_thread(first.wait)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        held = slack.hold_posts
        slack.hold_posts = None
        held.set()
        (request,) = paused.interrupts
        # The fresh worker takes the notification once its first attempt times out.
        async with hosted(
            client,
            agents=[w.agent()],
            model=ScriptedModel(offline_rules),
            task_queue=queue,
            channels={"slack": w.channel(slack.url)},
        ):
            records = await eventually(
                lambda: notified(agents, chat.id), bool, timeout=120, interval=0.5
            )
            assert [(r.delivered, (r.metadata or {}).get("notice")) for r in records] == [
                (True, "paused")
            ]
            (message,) = slack.posted()
            assert len(slack.called("chat.postMessage")) == 1
            # The retry looked before posting, and found it by its key.
            (looked,) = slack.called("conversations.history")
            assert looked["channel"] == w.CHANNEL
            assert str(looked["include_all_metadata"]).lower() in ("1", "true")

            done = await chat.resume(answers=[request.approve()], identity="cfo@example.com")
            assert done.finish_reason == FinishReason.STOP
            # What the retry found is what the end is posted to.
            await eventually(lambda: asyncio.sleep(0, message.updates), lambda u: len(u) == 1)
            assert "Approved by cfo@example.com" in message.text
    hist = await history(client, chat.id)
    notify_attempts = [
        e
        for e in events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
        if e.activity_task_started_event_attributes.attempt > 1
    ]
    assert notify_attempts, "the first attempt was lost with its worker and retried"
    assert len(slack.posted()) == 1


class Ask(BaseModel):
    question: str


class Answer(BaseModel):
    answer: str


quick = interrupt(
    "quickAsk",
    "A question answered within seconds, or not at all.",
    input=Ask,
    output=Answer,
    timeout=timedelta(seconds=2),
    on_timeout={"answer": "no answer in time"},
)


async def test_slack_down_for_the_whole_deadline_leaves_the_turn_on_time_and_the_failure_on_record(
    run_worker, model, client
):
    agent = Agent(
        f"slack_down_{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[quick], notify=["slack"]
    )
    model.reply(calls(("quickAsk", {"question": "ok?"}, "q1")), text("went on"))
    async with slack_standin() as slack:
        slack.down = True
        async with run_worker(agents=[agent], channels={"slack": w.channel(slack.url)}) as agents:
            chat = await agents.chat(agent.name)
            res = await chat.send("Ask it.")
            assert res.finish_reason == FinishReason.INTERRUPTED
            # The deadline answers while Slack is down: the turn goes on without the channel.
            status = await eventually(
                chat.status, lambda s: s.status == "idle", timeout=30, interval=0.2
            )
            assert status.last_turn is not None and "went on" in status.last_turn.text
            records = await eventually(
                lambda: agents.audit(chat.id),
                lambda r: any(x.kind == "notified" for x in r),
                timeout=60,
                interval=0.5,
            )
    (deadline,) = [r for r in records if r.kind == "deadline"]
    (failed,) = [r for r in records if r.kind == "notified"]
    assert deadline.output == {"answer": "no answer in time"}
    assert failed.channel == "slack" and failed.delivered is False
    assert "Slack" in (failed.verdict_reason or "")
    assert "deadline has passed" in (failed.verdict_reason or "")
    # The turn did not wait for the channel: the deadline was applied before the failure.
    assert deadline.at < failed.at
    # Slack was tried more than once (it was down, not refusing: each retry looks for an
    # earlier attempt's post first), and nothing was posted.
    assert len(slack.called("chat.postMessage")) == 1
    assert len(slack.called("conversations.history")) >= 1
    assert slack.posted() == []
    await assert_no_workflow_task_failed(client, chat.id)

"""A message sent again with its id (``Chat.send(message_id=...)``, an AG-UI message's id, a
``send`` signal's ``message_id``) joins the turn it started: retrying a send that may have got
in never starts a second turn with the same message. Against a real dev server."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx2
import pytest
from temporalio.client import WorkflowUpdateFailedError

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.client.api import AgentClient
from temporal_agent_interrupts.client.web import Access, agents_app
from temporal_agent_interrupts.errors import SendRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually, held
from tests.web import frames, run_input, served


async def test_a_send_repeated_with_its_message_id_gets_the_first_ones_turn(
    run_worker, model, client
):
    model.reply(text("hello back"), text("second answer"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        first = await chat.send("hello", message_id="m-1")
        again = await chat.send("hello", message_id="m-1")
        assert again.repeat and not first.repeat
        assert again.model_copy(update={"repeat": False}) == first
        assert (await chat.status()).turns == 1
        second = await chat.send("and now?", message_id="m-2")
    assert first.finish_reason == FinishReason.STOP and first.text == "hello back"
    assert second.turn == 2 and second.text == "second answer"
    # The model was asked once a message: the repeat reached no model.
    assert model.calls == 2
    assert model.requests[1].contents[0] == {"role": "user", "parts": [{"text": "hello"}]}
    assert [c["parts"][0].get("text") for c in model.requests[1].contents] == [
        "hello",
        "hello back",
        "and now?",
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_repeat_sent_while_its_turn_runs_waits_for_that_turn(run_worker, model, client):
    slow_model, release = held(text("done at last"))
    model.reply(slow_model)
    try:
        async with run_worker() as agents:
            chat = await agents.chat("careful")
            sending = asyncio.create_task(chat.send("hello", message_id="m-1"))
            await eventually(lambda: asyncio.sleep(0, model.calls), lambda n: n == 1)
            # A caller that gave up on the first send, sending again while its turn runs: it
            # is not told a turn is running, and it starts nothing.
            repeating = asyncio.create_task(chat.send("hello", message_id="m-1"))
            await asyncio.sleep(0.5)
            assert not repeating.done()
            release.set()
            first, again = await asyncio.gather(sending, repeating)
            status = await chat.status()
    finally:
        release.set()
    assert again.repeat and again.model_copy(update={"repeat": False}) == first
    assert first.text == "done at last"
    assert status.turns == 1 and model.calls == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_repeat_sent_while_its_turn_is_paused_gets_the_pause(run_worker, model, client):
    model.reply(calls(("approve", {"question": "ok?"}, "q1")), text("thanks"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        paused = await chat.send("ask me", message_id="m-1")
        again = await chat.send("ask me", message_id="m-1")
        assert again.finish_reason == FinishReason.INTERRUPTED and again.repeat
        assert [i.ref for i in again.interrupts] == [i.ref for i in paused.interrupts] == ["q1"]
        # Any other message is still refused while the turn is paused.
        with pytest.raises(SendRejected, match="paused on interrupts"):
            await chat.send("something else", message_id="m-2")
        done = await chat.resume(answers=[paused.interrupts[0].approve()])
        assert done.finish_reason == FinishReason.STOP
        # Once the turn has ended, the repeat gets how it ended (the resume's own result also
        # names the receipt of the decision it made; how the turn ended does not).
        late = await chat.send("ask me", message_id="m-1")
        assert done.receipt is not None and late.receipt is None
        assert late.repeat and late.model_copy(update={"repeat": False}) == done.model_copy(
            update={"receipt": None}
        )
        assert (await chat.status()).turns == 1
    assert model.calls == 2
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_message_id_used_for_other_text_or_an_older_turn_is_refused(
    run_worker, model, client
):
    model.reply(text("one"), text("two"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        await chat.send("first", message_id="m-1")
        with pytest.raises(SendRejected, match="'m-1' was used for another message"):
            await chat.send("not the first", message_id="m-1")
        await chat.send("second", message_id="m-2")
        # A repeat of a message whose turn is over and followed by another: too late to join.
        with pytest.raises(SendRejected, match="started turn 1; the conversation has moved on"):
            await chat.send("first", message_id="m-1")
        with pytest.raises(SendRejected, match="the message id is empty"):
            await chat.send("third", message_id="")
        with pytest.raises(SendRejected, match="message id holds control characters"):
            await chat.send("third", message_id="m\n3")
        with pytest.raises(SendRejected, match="message id is 129 bytes; the limit is 128 bytes"):
            await chat.send("third", message_id="m" * 129)
        # The workflow checks for itself what a client without these checks sends.
        handle = client.get_workflow_handle(chat.id)
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update("send", {"text": "third", "message_id": "m\x003"})
        assert "control characters" in str(raised.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update("send", {"text": "third", "message_id": ""})
        assert "the message id is empty" in str(raised.value.cause)
        assert (await chat.status()).turns == 2
    assert model.calls == 2
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_send_signal_repeated_with_its_message_id_starts_one_turn(
    run_worker, model, client
):
    model.reply(text("warmed"), text("signalled"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        await chat.send("warm up")  # the conversation exists (a signal does not start one)
        body = json.dumps({"text": "from a script", "message_id": "job-42"})
        for _ in range(2):
            code, out = await cli_signal(client, chat.id, "send", body)
            assert code == 0, out
        await eventually(chat.rejections, lambda r: len(r) == 1)
        turn = await chat.last_turn()
        status = await chat.status()
        rejections = await chat.rejections()
    assert turn is not None and turn.text == "signalled" and status.turns == 2
    # The repeat is in the rejection log, with what it repeated.
    (rejection,) = rejections
    assert rejection.handler == "send"
    assert "a repeat of message 'job-42', which started turn 2" in rejection.reason
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_agui_run_posted_again_with_its_message_joins_the_first_runs_turn(
    run_worker, model, client
):
    model.reply(text("hi from the agent"))
    async with run_worker() as agents:
        app = agents_app(AgentClient(client, task_queue=agents.task_queue), dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/careful"
            body = run_input(thread, "hello")
            first = await frames(http, url, body)
            # A client that lost the first response posts the same run again.
            second = await frames(http, url, {**body, "runId": "run-retried"})
        status = await (await agents.chat("careful", chat_id=thread)).status()
    for seen in (first, second):
        assert seen[-1].event["type"] == "RUN_FINISHED", seen[-1]
        assert seen[-1].event["outcome"] == {"type": "success"}
    assert "".join(f.event.get("delta", "") for f in first) == "hi from the agent"
    # The retry's own events began after the turn: it has the thread's messages instead.
    (snapshot,) = [f.event for f in second if f.type == "MESSAGES_SNAPSHOT"]
    assert [(m["role"], m.get("content")) for m in snapshot["messages"]] == [
        ("user", "hello"),
        ("assistant", "hi from the agent"),
    ]
    assert status.turns == 1 and model.calls == 1
    await assert_no_workflow_task_failed(client, thread)
    assert t.RUNS["lookup"] == 0


async def test_a_repeat_that_comes_with_a_new_message_reports_its_own_turn(client, model):
    """A retry of turn 1's message and the next message reach the workflow in one task, the
    retry first: the retry reports turn 1, never the turn the other message started."""
    queue = f"tq-{uuid.uuid4()}"
    model.reply(text("answer one"), text("answer two"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("careful")
        first = await chat.send("hello", message_id="m-1")
    # No worker now: both updates wait on the server and come to the next one in one task.
    repeat = asyncio.create_task(chat.send("hello", message_id="m-1", worker_timeout=None))
    await asyncio.sleep(1.0)
    new = asyncio.create_task(chat.send("next", message_id="m-2", worker_timeout=None))
    await asyncio.sleep(1.0)
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        again, second = await asyncio.wait_for(asyncio.gather(repeat, new), 60)
    assert (again.turn, again.repeat, again.text) == (1, True, "answer one")
    assert again.model_copy(update={"repeat": False}) == first
    assert (second.turn, second.repeat, second.text) == (2, False, "answer two")
    assert model.calls == 2
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_agui_caller_who_may_send_but_not_read_gets_no_messages(run_worker, model, client):
    """The snapshots a send's run carries (a repeat's, a pause's) are the thread's messages:
    a caller the application lets send but not read gets the outcome without them."""
    model.reply(
        text("noted, your PIN is 4321"), text("hi there"), calls(("approve", {"question": "ok?"}))
    )
    asked: list[str] = []

    def authorize(request: object, access: Access) -> bool:
        asked.append(access.action)
        return access.action == "send"  # may post messages, never read the thread

    async with run_worker() as agents:
        thread = f"thread-{uuid.uuid4()}"
        await (await agents.chat("careful", chat_id=thread)).send("remember my PIN 4321")
        app = agents_app(
            AgentClient(client, task_queue=agents.task_queue),
            dev_loopback=True,
            authorize=authorize,
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/careful"
            assert (await http.post(url, json=run_input(thread))).status_code == 403
            body = run_input(thread, "hello")
            mine = await frames(http, url, body)
            again = await frames(http, url, {**body, "runId": "run-2"})
            paused = await frames(http, url, run_input(thread, "ask me"))
    for seen in (mine, again, paused):
        assert seen[-1].event["type"] == "RUN_FINISHED", seen[-1]
        assert "MESSAGES_SNAPSHOT" not in [f.type for f in seen]
        assert "4321" not in str([f.event for f in seen])
    assert paused[-1].event["outcome"]["type"] == "interrupt"
    assert set(asked) == {"read", "send"}

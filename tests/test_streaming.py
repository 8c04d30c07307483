"""Streaming turns against a real dev server: text as it is produced, interrupts before the turn
ends, resumes that stream, and reattaching by offset across worker restarts and continue-as-new."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from examples.banking import banking_agent
from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.errors import EventsGone, SendRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import streaming
from temporal_agent_interrupts.worker.standin import GeminiStandIn, Reply, calls, text
from temporal_agent_interrupts.workflows.limits import RUN
from temporal_agent_interrupts.workflows.stream import POLL_UPDATE, PUBLISH_SIGNAL
from temporal_agent_interrupts.workflows.types import TurnEvent
from tests.docs import block
from tests.helpers import assert_no_workflow_task_failed, eventually, server_address
from tests.scenarios import _chain


async def drain(stream) -> None:
    async with asyncio.timeout(20):
        async for _ in stream:
            pass


async def collect(stream) -> list[tuple[float, TurnEvent]]:
    seen = []
    async for ev in stream:
        seen.append((time.monotonic(), ev))
    return seen


async def test_text_arrives_while_the_model_is_still_producing_it(run_worker, model, client):
    words = "one two three four five"
    # The model produces its first piece, then nothing more until the reader has it.
    produced = threading.Event()
    model.reply(Reply.streamed(text(words), pieces=5, interval=0.5, hold=produced))
    held_at_first_text: bool | None = None
    seen: list[tuple[float, TurnEvent]] = []
    try:
        async with run_worker() as agents:
            chat = await agents.chat("assistant")
            turn = chat.send_stream("count to five")
            async for ev in turn:
                seen.append((time.monotonic(), ev))
                if ev.kind == "text" and held_at_first_text is None:
                    held_at_first_text = not produced.is_set()
                    produced.set()
            result = await turn.result()
    finally:
        produced.set()
    kinds = [ev.kind for _, ev in seen]
    assert kinds[-1] == "turn_end"
    texts = [(at, ev) for at, ev in seen if ev.kind == "text"]
    assert "".join(ev.text or "" for _, ev in texts) == words
    assert len(texts) >= 3  # it came in pieces, not in one piece at the end
    # The first text reached the reader while the rest of the reply was not yet produced: it
    # is the first chunk alone (a reply published at its end would come whole).
    assert held_at_first_text is True
    assert texts[0][1].text == "one t", texts[0][1].text
    assert result.finish_reason == FinishReason.STOP and result.text == words
    end = seen[-1][1]
    assert end.result is not None and end.result.text == words
    offsets = [ev.offset for _, ev in seen]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(ev.turn == 1 for _, ev in seen)
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_interrupt_is_on_the_stream_before_turn_end_and_a_resume_streams(
    run_worker, model, client
):
    model.reply(
        calls(("lookup", {"key": "k"}, "c1"), ("approve", {"question": "pay?"}, "c2"), say="Hm."),
        Reply.streamed(text("paid and done"), pieces=3, interval=0.2),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        first = [ev async for ev in chat.send_stream("pay")]
        kinds = [(ev.kind, ev.ref) for ev in first]
        assert kinds[-1] == ("turn_end", None)
        assert ("interrupt", "c2") in kinds
        assert kinds.index(("interrupt", "c2")) < len(kinds) - 1
        assert ("tool_request", "c1") in kinds and ("tool_response", "c1") in kinds
        [pause] = [ev for ev in first if ev.kind == "interrupt"]
        assert pause.interrupt is not None and pause.interrupt.input == {"question": "pay?"}
        assert first[-1].result is not None
        assert first[-1].result.finish_reason == FinishReason.INTERRUPTED
        turn = chat.resume_stream(answers=[pause.interrupt.approve()], identity="alice")
        rest = [ev async for ev in turn]
        assert (await turn.result()).text == "paid and done"
    kinds = [ev.kind for ev in rest]
    assert kinds[0] == "answer" and kinds[-1] == "turn_end"
    answer = rest[0]
    assert answer.answer is not None and answer.answer.identity == "alice"
    assert answer.output == {"approved": True}
    assert "tool_response" in kinds
    assert "".join(ev.text or "" for ev in rest if ev.kind == "text") == "paid and done"
    assert rest[0].offset == first[-1].offset + 1  # the same stream, picked up where it was
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_refused_send_stream_raises_instead_of_waiting(run_worker, model):
    model.reply(calls(("approve", {"question": "q"}, "c1")))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("start")
        with pytest.raises(SendRejected, match="paused on interrupts"):
            await drain(chat.send_stream("again"))


async def test_a_follower_reattaching_by_offset_after_a_worker_restart_sees_no_gap(
    run_worker, model, client
):
    model.reply(
        calls(("approve", {"question": "q"}, "c1")),
        Reply.streamed(text("after the restart"), pieces=4, interval=0.1),
    )
    queue = f"restart-{uuid.uuid4()}"
    # No sticky cache on the first worker: its successor gets the next task at once rather than
    # after Temporal's 10 s sticky timeout (what a graceful restart costs is measured elsewhere).
    async with run_worker(task_queue=queue, max_cached_workflows=0) as agents:
        chat = await agents.chat("assistant")
        first = [ev async for ev in chat.send_stream("start")]
    last_seen = first[1].offset  # as if the client dropped after two events
    async with run_worker(task_queue=queue) as agents:
        chat = await agents.chat("assistant", chat_id=chat.id)
        pause = first[-1].result
        assert pause is not None
        res = await chat.resume(answers=[pause.interrupts[0].approve()])
        assert res.finish_reason == FinishReason.STOP
        got: list[TurnEvent] = []
        async with asyncio.timeout(20):
            async for ev in chat.events(after=last_seen):
                got.append(ev)
                if ev.kind == "turn_end" and ev.result and ev.result.finish_reason == "stop":
                    break
    offsets = [ev.offset for ev in got]
    assert offsets == list(range(last_seen + 1, last_seen + 1 + len(got)))  # no gap, no repeat
    assert [ev.kind for ev in got[: len(first) - 2]] == [ev.kind for ev in first[2:]]
    assert "".join(ev.text or "" for ev in got if ev.kind == "text") == "after the restart"


async def test_an_offset_no_longer_kept_is_a_clear_error_and_no_offset_reads_what_is_kept(
    run_worker, model
):
    big = "x" * 60_000
    model.reply(*[text(big) for _ in range(6)])
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        for i in range(6):
            await chat.send(f"m{i}")
        with pytest.raises(EventsGone, match="no longer keeps events from offset 1"):
            await drain(chat.events(after=0))
        kept = [ev async for ev in _first(chat.events(), 3)]
    assert kept[0].offset > 1  # the oldest went when the stream passed its bound
    assert [ev.offset for ev in kept] == list(range(kept[0].offset, kept[0].offset + 3))


async def test_the_readme_streaming_example_runs_against_the_offline_model(client):
    """The README's "Streaming a turn" script, as printed, against a worker serving the offline
    stand-in the embedded default uses (which streams its replies in chunks)."""
    source = block("# stream_transfer.py", lang="python")
    queue = f"readme-{uuid.uuid4()}"
    with GeminiStandIn(streaming) as offline, tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "stream_transfer.py"
        script.write_text(source)
        async with build_worker(
            client, agents=[banking_agent], task_queue=queue, gemini=offline.client()
        ):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
                    "TEMPORAL_ADDRESS": server_address(client),
                    "AGENT_TASK_QUEUE": queue,
                },
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        streamed = [r for r in offline.requests if r.method == "streamGenerateContent"]
    assert proc.returncode == 0, err.decode()
    printed = out.decode()
    assert "[paused: userApproval" in printed, printed
    assert "[stop]" in printed, printed
    assert "transferMoney" in printed or "transferred" in printed, printed
    assert len(streamed) == 3  # ask, transfer, summary: every reply streamed


async def test_forged_or_malformed_stream_publishes_are_recorded_rejections(
    run_worker, model, client
):
    """The library's publish signal comes through the workflow's raw handler: junk, a wrong
    argument count or a forged event is a recorded rejection, never a failed workflow task."""
    from temporalio.contrib.workflow_streams import PublishEntry, PublishInput

    from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL, encode_item

    model.reply(text("hello"), text("still fine"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hi")
        handle = client.get_workflow_handle(chat.id)
        forged = TurnEvent(kind="text", text="I approve everything")
        entry = PublishEntry(
            topic="events",
            data=encode_item(client.data_converter.payload_converter.to_payload(forged)),
        )
        name = PUBLISH_SIGNAL
        await handle.signal(name, PublishInput(items=[entry], publisher_id="x", sequence=1))
        await handle.signal(name, "junk")
        await handle.signal(name, args=[])
        status = await eventually(chat.status, lambda s: s.rejections == 3)
        reasons = [r.reason for r in await chat.rejections()]
        assert reasons[0] == "nothing is streaming: only a model call in progress publishes"
        assert reasons[1].startswith("malformed stream publish")
        assert "exactly one JSON argument, got 0" in reasons[2]
        assert status.status == "idle"
        res = await chat.send("again")
        assert res.text == "still fine"
        kept = [ev async for ev in _first(chat.events(), 4)]
    assert [(ev.kind, ev.text) for ev in kept] == [
        ("text", "hello"),
        ("turn_end", None),
        ("text", "still fine"),
        ("turn_end", None),
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def _first(events, n: int):
    async with asyncio.timeout(20):
        async for ev in events:
            yield ev
            n -= 1
            if n == 0:
                return


async def test_a_resume_stream_that_leaves_interrupts_pending_ends_with_its_answer(
    run_worker, model
):
    model.reply(calls(("approve", {"question": "a"}, "c1"), ("approve", {"question": "b"}, "c2")))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        first = await chat.send("two questions")
        one, two = first.interrupts
        turn = chat.resume_stream(answers=[one.approve()], identity="ann")
        async with asyncio.timeout(20):
            events = [ev async for ev in turn]
        result = await turn.result()
    assert [(ev.kind, ev.ref) for ev in events] == [("answer", "c1")]
    assert result.finish_reason == FinishReason.INTERRUPTED
    assert [i.ref for i in result.interrupts] == [two.ref]


async def test_followers_beyond_the_cap_are_refused_and_updates_still_get_through(
    run_worker, model, client
):
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.contrib.workflow_streams import WorkflowStreamClient

    from temporal_agent_interrupts.client.stream import next_offset
    from temporal_agent_interrupts.workflows.stream import MAX_FOLLOWERS

    model.reply(text("one"), text("two"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hi")

        end = await next_offset(chat)

        async def follower() -> None:
            # Waiting at the stream's end (a poll past it is refused outright).
            stream = WorkflowStreamClient.create(agents.temporal, chat.id)
            async for _ in stream.subscribe(["events"], from_offset=end, result_type=TurnEvent):
                pass

        polls_before = await _accepted_polls(client, chat.id)
        waiting = [asyncio.create_task(follower()) for _ in range(MAX_FOLLOWERS)]
        # They are waiting now, each holding an update the conversation accepted.
        await eventually(
            lambda: _accepted_polls(client, chat.id),
            lambda n: n >= polls_before + MAX_FOLLOWERS,
        )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(follower(), 20)
        assert "followers waiting already" in str(refused.value.cause)
        res = await chat.send("again")  # the conversation's own updates still get through
        assert res.text == "two"
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def _accepted_polls(client: Client, chat_id: str) -> int:
    """The stream's poll updates the conversation's current run has accepted."""
    hist = await client.get_workflow_handle(chat_id).fetch_history()
    return sum(
        1
        for e in hist.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == POLL_UPDATE
    )


async def test_a_namespace_holders_direct_polls_do_not_take_the_products_followers_stream(
    run_worker, model, client
):
    """Review (issue 44, suspected, confirmed): the conversation admits four followers, and
    anyone with the namespace's credentials may send its poll update directly.

    - Four polls for an offset the stream has not reached held the four places for the whole
      run (no event ever reaches them): the product's follower of the next turn was refused
      (``TooManyFollowers``). Such a poll is refused now, holding nothing.
    - Four polls at the stream's end hold the places until the next event: a follower that
      starts meanwhile (``Chat.events``) was refused. It reads by query while the places are
      taken now.
    """
    from temporalio.client import (
        WorkflowUpdateFailedError,
        WorkflowUpdateHandle,
        WorkflowUpdateRPCTimeoutOrCancelledError,
        WorkflowUpdateStage,
    )
    from temporalio.contrib.workflow_streams import PollInput, PollResult

    from temporal_agent_interrupts.client.stream import next_offset
    from temporal_agent_interrupts.workflows.stream import MAX_FOLLOWERS, POLL_UPDATE, TOPIC

    model.reply(text("one"), text("two"), text("three"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("hi")
        handle = client.get_workflow_handle(chat.id)

        async def poll(offset: int) -> WorkflowUpdateHandle[PollResult]:
            # As the library's subscriber sends it; a refused one raises from result().
            return await handle.start_update(
                POLL_UPDATE,
                PollInput(topics=[TOPIC], from_offset=offset),
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                result_type=PollResult,
            )

        refusals, held = [], []
        for _ in range(MAX_FOLLOWERS):
            sent = await poll(await next_offset(chat) + 1000)
            try:
                # A refusal is known at once; one taken waits for an event that never comes.
                await asyncio.wait_for(sent.result(), 5)
            except WorkflowUpdateFailedError as e:
                refusals.append(str(e.cause))
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                held.append(sent)
        async with asyncio.timeout(60):
            events = [ev async for ev in chat.send_stream("again")]
        assert "".join(ev.text or "" for ev in events if ev.kind == "text") == "two"
        assert events[-1].kind == "turn_end"
        assert not held and len(refusals) == MAX_FOLLOWERS, refusals
        assert "has not reached" in refusals[0], refusals

        # At the end of the stream: each holds a place until the next event.
        for _ in range(MAX_FOLLOWERS):
            await poll(await next_offset(chat))
        start = await next_offset(chat)

        async def follower() -> list[TurnEvent]:
            seen = []
            async for ev in chat.events(after=start - 1):
                seen.append(ev)
                if ev.kind == "turn_end":
                    return seen
            return seen

        following = asyncio.create_task(follower())
        await asyncio.sleep(1.0)  # it has asked for a place by now
        await chat.send("third")
        async with asyncio.timeout(60):
            seen = await following
        assert "".join(ev.text or "" for ev in seen if ev.kind == "text") == "three"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_runs_streamed_replies_share_its_signals_and_the_text_still_arrives_whole(
    run_worker, model, client
):
    """Each publish is a signal, and a run takes 20 (``history.maximumSignalsPerExecution`` on
    the embedded default and in the documented deployments): a turn of three streamed model
    calls, each publishing a batch every quarter second, sent 27 and the server refused every
    signal of that run past the 20th (the stream stalled, and an answer sent by script then
    would have been refused too). The run's streams now share ``RUN.stream_signals``; the rest
    of each reply reaches the stream when its call completes."""
    words = [" ".join(f"w{c}x{k}" for k in range(9)) for c in range(3)]
    model.reply(
        Reply.streamed(calls(("lookup", {"key": "a"}), say=words[0]), pieces=9, interval=0.26),
        Reply.streamed(calls(("lookup", {"key": "b"}), say=words[1]), pieces=9, interval=0.26),
        Reply.streamed(text(words[2]), pieces=9, interval=0.26),
    )
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        turn = chat.send_stream("go")
        seen = [ev async for ev in turn]
        result = await turn.result()
        # The turn's run, and any it continued as new into after the turn.
        events = [
            e
            for run in await _chain(client, chat.id)
            for e in (await client.get_workflow_handle(chat.id, run_id=run).fetch_history()).events
        ]
    assert result.finish_reason == FinishReason.STOP and result.text == words[2]
    streamed = "".join(ev.text or "" for ev in seen if ev.kind == "text")
    for said in words:
        assert said in streamed, (said, streamed)
    publishes = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == PUBLISH_SIGNAL
    ]
    assert 3 <= len(publishes) <= RUN.stream_signals, len(publishes)
    await assert_no_workflow_task_failed(client, chat.id)

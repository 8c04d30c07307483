"""Edges of a turn: cancellations that land mid-step, running siblings, tool retry policies and
oversized tool results. Each against a real dev server and a scripted model."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from temporal_agent_interrupts import FinishReason
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.config import AGENT_STATUS
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually, held


async def test_cancel_during_a_model_call_ends_the_turn_cancelled(run_worker, model, client):
    """Not ``failed``, and the spent cancellation does not linger to cancel the next pause."""
    slow_model, release = held(text("too late"))
    model.reply(slow_model, calls(("approve", {"question": "ok?"})))
    try:
        async with run_worker() as agents:
            chat = await agents.chat("careful")
            sending = asyncio.create_task(chat.send("hello"))
            await eventually(lambda: asyncio.sleep(0, model.calls), lambda n: n == 1)
            cancelled = await chat.cancel("stop it")
            assert cancelled.finish_reason == FinishReason.CANCELLED
            assert (await sending).finish_reason == FinishReason.CANCELLED
            release.set()

            again = await chat.send("again")
            assert again.finish_reason == FinishReason.INTERRUPTED
            # Still paused: nothing cancelled it behind the caller's back.
            assert [i.name for i in await chat.pending()] == ["approve"]
            assert (await chat.cancel()).finish_reason == FinishReason.CANCELLED
            hist = await chat.history()
    finally:
        release.set()
    # The cancelled message left no trace: the model's second call saw only "again".
    assert model.requests[1].contents == [{"role": "user", "parts": [{"text": "again"}]}]
    assert [a.kind for a in hist.answers] == ["cancel"]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_cancelling_the_workflow_during_a_model_call_closes_it(run_worker, model, client):
    slow_model, release = held(text("too late"))
    model.reply(slow_model)
    try:
        async with run_worker() as agents:
            chat = await agents.chat("careful")
            sending = asyncio.create_task(chat.send("hello"))
            await eventually(lambda: asyncio.sleep(0, model.calls), lambda n: n == 1)
            handle = client.get_workflow_handle(chat.id)
            await handle.cancel()
            with pytest.raises(WorkflowFailureError):
                await handle.result()
            desc = await handle.describe()
            # The caller waiting on the turn hears how it ended.
            assert (await sending).finish_reason == FinishReason.CANCELLED
    finally:
        release.set()
    assert desc.status == WorkflowExecutionStatus.CANCELED
    assert desc.typed_search_attributes.get(AGENT_STATUS) == "closed"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_cancel_while_a_tool_runs_tells_the_model_it_was_cancelled(run_worker, model, client):
    model.reply(calls(("lookup", {"key": "a"}), ("slow", {"key": "b"})), text("ok"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        sending = asyncio.create_task(chat.send("go"))
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1)
        cancelled = await chat.cancel("taking too long")
        assert cancelled.finish_reason == FinishReason.CANCELLED
        await sending
        res = await chat.send("next")
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS["slow_finished"] == 0
    # The finished sibling keeps its result; the cut-short call is not passed off as a success.
    responses = model.requests[1].function_responses()
    assert [r["response"] for r in responses] == [
        {"key": "a", "value": "A"},
        {
            "error": "cancelled",
            "reason": "taking too long",
            "note": "stopped while running; it may have taken effect",
        },
    ]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_pause_is_reported_only_after_its_running_siblings(run_worker, model, client):
    model.reply(calls(("approve", {"question": "ok?"}), ("slow", {"key": "b"})), text("done"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        sending = asyncio.create_task(chat.send("go"))
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1)
        waiting = asyncio.create_task(chat.last_turn())
        await asyncio.sleep(0.5)
        # last_turn waits for the turn to stop: the slow sibling is still running.
        assert not waiting.done()
        assert not sending.done()
        # The interrupt is already pending, for anyone who looks.
        assert [i.name for i in await chat.pending()] == ["approve"]
        await chat.cancel("enough")
        assert (await waiting).finish_reason == FinishReason.CANCELLED
        assert (await sending).finish_reason == FinishReason.CANCELLED
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_tools_non_retryable_error_types_are_honoured(run_worker, model, client):
    model.reply(calls(("picky", {"key": "k"})))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        res = await chat.send("try it")
    assert res.finish_reason == FinishReason.FAILED
    assert t.RUNS["picky"] == 1  # its policy allows 4 attempts, but not for Nope
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_oversized_tool_result_reaches_the_model_as_an_error(run_worker, model, client):
    """The tool ran, so the turn goes on: the model hears its output was too large."""
    model.reply(calls(("big", {"kib": 300})), text("that was too much"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        res = await chat.send("fetch it all")
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS["big"] == 1  # not retried
    (response,) = model.requests[1].function_responses()
    assert response["response"] == {
        "error": "output too large",
        "detail": "tool 'big' returned 300 KiB of output; the limit is 256 KiB (return a "
        "summary, a page or a reference); it was dropped",
    }
    await assert_no_workflow_task_failed(client, chat.id)


def test_an_invalid_retry_policy_is_refused_when_the_tool_is_declared():
    """Not later, when the workflow schedules it: that would fail every workflow task."""
    from datetime import timedelta

    from temporalio.common import RetryPolicy

    from temporal_agent_interrupts import tool

    bad = RetryPolicy(initial_interval=timedelta(seconds=10), maximum_interval=timedelta(seconds=1))
    with pytest.raises(ValueError, match="'flaky': invalid retry policy: maximum_interval"):
        tool("flaky", "Flaky.", retry=bad)
    with pytest.raises(ValueError, match="backoff_coefficient"):
        tool("flaky", "Flaky.", retry=RetryPolicy(backoff_coefficient=0.5))


async def test_a_closed_chat_says_closed_to_every_call(run_worker, model):
    from temporal_agent_interrupts import AgentError

    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        await chat.send("hello")
        await chat.close()
        for call in (
            lambda: chat.resume(respond=[]),
            chat.cancel,
            chat.close,
            chat.last_turn,
        ):
            with pytest.raises(AgentError, match=f"chat '{chat.id}' is closed"):
                await call()


async def test_an_empty_first_message_starts_no_conversation(run_worker, model, client):
    from temporalio.service import RPCError

    from temporal_agent_interrupts.errors import SendRejected

    async with run_worker() as agents:
        chat = await agents.chat("careful")
        with pytest.raises(SendRejected, match="the message is empty"):
            await chat.send("   ")
        with pytest.raises(RPCError, match="not found"):
            await client.get_workflow_handle(chat.id).describe()
    assert model.calls == 0


async def test_last_turn_and_close_can_bound_the_wait_for_a_worker(run_worker, model):
    from datetime import timedelta

    from temporal_agent_interrupts.errors import NoWorkerAnswered

    model.reply(text("hi"))
    async with run_worker() as agents:
        chat = await agents.chat("careful")
        await chat.send("hello")
    # The worker is gone: both give up after the caller's bound, saying why.
    for call in (chat.last_turn, chat.close):
        with pytest.raises(NoWorkerAnswered, match="within 1s") as e:
            await call(worker_timeout=timedelta(seconds=1))
        assert e.value.queued


async def test_a_callers_own_timeout_is_not_reported_as_a_missing_worker(run_worker, model):
    from datetime import timedelta

    slow_model, release = held(text("eventually"))
    model.reply(slow_model)
    try:
        async with run_worker() as agents:
            chat = await agents.chat("careful")
            # The worker took the message at once; the caller just stopped waiting for the turn.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1):
                    await chat.send("hello", worker_timeout=timedelta(seconds=30))
            release.set()
            turn = await chat.last_turn()
    finally:
        release.set()
    assert turn is not None and turn.text == "eventually"

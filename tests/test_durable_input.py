"""Durable under any input: no payload, size or retry can wedge a conversation or repeat a side
effect. Each test is one case found against the code before the durable-input rules, on a real
dev server; the nine groups:

1. unserializable payloads: lone surrogates, nesting too deep, by signal, update and send;
2. totals: answers, tool outputs and metadata that fit alone but not together;
3. one approval, one run: approved runs are not retried behind the human's back;
4. a failed turn keeps what happened;
5. the shell example's gate (tests/test_shell_gate.py);
6. signal floods and terminated conversations;
7. continue-as-new stays possible: refs and logs are bounded;
8. terminal and Markdown injection;
9. smaller ones: the suggested answer, unknown entry keys, payload bytes in rejections, typed
   restart input.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload as ApiPayload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from temporal_agent_interrupts import AgentClient, Chat, FinishReason
from temporal_agent_interrupts.errors import CancelRejected, ResumeRejected, SendRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.devserver import DISPATCH_FLAG
from temporal_agent_interrupts.worker.devserver import temporal_cli as temporal_cli_path
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.worker.testing import dev_server
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    HELD,
    OUT,
    KiB,
    human_size,
    json_size,
)
from temporal_agent_interrupts.workflows.types import InterruptRequest, ResumeInput, TurnResult
from tests import agents as t
from tests.conftest import ScriptedModel
from tests.helpers import (
    NO_WAIT_BETWEEN_RUNS,
    SUGGEST_AFTER_EVENTS,
    assert_no_workflow_task_failed,
    current_details,
    events_of,
    eventually,
    history,
    temporal_cli,
)
from tests.test_operator import agentctl

LONE_SURROGATE = b'"half an emoji \\ud83d"'  # JSON text Python's json accepts


def raw(data: bytes) -> RawValue:
    return RawValue(ApiPayload(metadata={"encoding": b"json/plain"}, data=data))


def nested(depth: int) -> str:
    return "[" * depth + "true" + "]" * depth


async def paused_on_approve(agents: AgentClient, model: ScriptedModel) -> tuple[Chat, str]:
    model.reply(calls(("approve", {"question": "ship?"})), text("shipped"))
    chat = await agents.chat("budget")
    res = await chat.send("go")
    (pending,) = res.interrupts
    return chat, pending.ref


async def rejections_reach(chat: Chat, n: int) -> list[Any]:
    await eventually(chat.status, lambda s: s.rejections >= n)
    return await chat.rejections()


# --------------------------------------------------------------------------------------------
# 1. Unserializable payloads


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"approved": true, "note": ' + LONE_SURROGATE + b"}", id="lone-surrogate"),
        pytest.param(b'{"approved": true, "deep": ' + nested(300).encode() + b"}", id="deep"),
    ],
)
async def test_unserializable_output_by_signal_is_recorded_not_taken_in(
    run_worker, model, client, body
):
    async with run_worker() as agents:
        chat, ref = await paused_on_approve(agents, model)
        payload = b'{"respond": [{"name": "approve", "ref": "%s", "output": %s}]}' % (
            ref.encode(),
            body,
        )
        await client.get_workflow_handle(chat.id).signal("resume", args=[raw(payload)])
        (rejection,) = await rejections_reach(chat, 1)
        assert [i.ref for i in await chat.pending()] == [ref]
        res = await chat.resume(
            respond=[InterruptRequest(name="approve", ref=ref).respond({"approved": True})]
        )
    assert "not valid Unicode" in rejection.reason or "deeper than 64" in rejection.reason
    assert res.text == "shipped"
    await assert_no_workflow_task_failed(client, chat.id)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"approved": true, "note": ' + LONE_SURROGATE + b"}", id="lone-surrogate"),
        pytest.param(b'{"approved": true, "deep": ' + nested(300).encode() + b"}", id="deep"),
    ],
)
async def test_unserializable_output_by_update_is_refused(run_worker, model, client, body):
    async with run_worker() as agents:
        chat, ref = await paused_on_approve(agents, model)
        before = len((await history(client, chat.id)).events)
        payload = b'{"respond": [{"name": "approve", "ref": "%s", "output": %s}]}' % (
            ref.encode(),
            body,
        )
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await client.get_workflow_handle(chat.id).execute_update("resume", args=[raw(payload)])
        assert isinstance(e.value.cause, ApplicationError)
        assert e.value.cause.type == "ResumeRejected"
        assert len((await history(client, chat.id)).events) == before
        assert [i.ref for i in await chat.pending()] == [ref]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_unserializable_send_by_signal_starts_no_turn(run_worker, model, client):
    model.reply(text("hello"), text("still here"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        await chat.send("hi")
        handle = client.get_workflow_handle(chat.id)
        await handle.signal("send", args=[raw(b'{"text": ' + LONE_SURROGATE + b"}")])
        await handle.signal(
            "send", args=[raw(b'{"text": "x", "extra": ' + nested(300).encode() + b"}")]
        )
        rejections = await rejections_reach(chat, 2)
        status = await chat.status()
        res = await chat.send("and now?")
    assert ["not valid Unicode" in r.reason for r in rejections] == [True, False]
    assert "deeper than 64" in rejections[1].reason
    assert status.turns == 1 and status.status == "idle"
    assert res.text == "still here"
    assert model.calls == 2
    await assert_no_workflow_task_failed(client, chat.id)


async def test_unserializable_send_by_update_is_refused(run_worker, model, client):
    model.reply(text("hello"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        await chat.send("hi")
        with pytest.raises(WorkflowUpdateFailedError):
            await client.get_workflow_handle(chat.id).execute_update(
                "send", args=[raw(b'{"text": ' + LONE_SURROGATE + b"}")]
            )
        assert (await chat.status()).turns == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_rejected_resumes_identity_cannot_spoil_the_rejection_log(
    run_worker, model, client
):
    async with run_worker() as agents:
        chat, _ = await paused_on_approve(agents, model)
        bad = (
            b'{"respond": [{"name": "approve", "ref": "forged", "output": {}}], '
            b'"identity": "mallory' + LONE_SURROGATE[1:]
        )
        await client.get_workflow_handle(chat.id).signal("resume", args=[raw(bad + b"}")])
        (rejection,) = await rejections_reach(chat, 1)
        details = (await chat.history()).answers
    assert rejection.identity is not None and rejection.identity.startswith("mallory")
    assert rejection.identity.encode()  # storable: the invalid half was replaced
    assert details == []
    await assert_no_workflow_task_failed(client, chat.id)


async def test_unserializable_metadata_or_identity_on_an_answer_is_refused(
    run_worker, model, client
):
    async with run_worker() as agents:
        chat, ref = await paused_on_approve(agents, model)
        handle = client.get_workflow_handle(chat.id)
        entry = b'{"name": "approve", "ref": "%s", "output": {"approved": true}}' % ref.encode()
        for extra in (
            b'"metadata": {"ticket": ' + LONE_SURROGATE + b"}",
            b'"identity": ' + LONE_SURROGATE,
        ):
            await handle.signal(
                "resume", args=[raw(b'{"respond": [' + entry + b"], " + extra + b"}")]
            )
        rejections = await rejections_reach(chat, 2)
        audit = await chat.history()
        assert [i.ref for i in await chat.pending()] == [ref]
        # The client refuses the same before sending anything.
        with pytest.raises(ResumeRejected, match="not valid Unicode"):
            await chat.resume(
                respond=[InterruptRequest(name="approve", ref=ref).respond({"approved": True})],
                identity="alice\ud83d",
            )
    assert all("not valid Unicode" in r.reason for r in rejections)
    assert audit.answers == []
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_tool_returning_unserializable_text_runs_once_and_the_model_hears_why(
    run_worker, model, client
):
    model.reply(calls(("garbled", {"key": "k"})), text("noted"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        res = await chat.send("go")
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS["garbled"] == 1  # the activity did not fail, so Temporal did not run it again
    (response,) = model.requests[1].function_responses()
    assert response["response"]["error"] == "output not accepted"
    assert "not valid Unicode" in response["response"]["detail"]
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_tool_schema_pythons_re_cannot_compile_does_not_stop_the_conversation(
    run_worker, model, client
):
    """pydantic accepts patterns such as \\p{L}; the workflow checks interrupt-only tools'
    input with jsonschema, on Python's re, which cannot compile them."""
    model.reply(calls(("askName", {"name": "Zoë"})), text("I could not ask"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        res = await chat.send("ask")
        details = await current_details(client, chat.id)
    assert res.text == "I could not ask"
    (response,) = model.requests[1].function_responses()
    assert "the declared schema cannot be checked here" in response["response"]["error"]
    assert "budget" in details
    await assert_no_workflow_task_failed(client, chat.id)


# --------------------------------------------------------------------------------------------
# 2. Totals


async def test_sizes_are_counted_as_stored_not_as_typed(run_worker, model, client):
    """256 KiB of control characters is 1.5 MiB of JSON, six bytes each. After a cancelled turn
    that kept 750 KiB of tool outputs, such a message would take the model call's input past
    2 MiB: it is refused, and the largest message that is accepted still reaches the model."""
    model.reply(
        calls(*[("big", {"kib": 250})] * 3, ("approve", {"question": "q"})),
        text("read it all"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        await chat.send("fetch")
        await chat.cancel("enough")
        with pytest.raises(SendRejected, match=r"the message is 1\.50 MiB"):
            await chat.send("\x01" * 262_144)
        with pytest.raises(WorkflowUpdateFailedError):
            await client.get_workflow_handle(chat.id).execute_update(
                "send", {"text": "\x01" * 262_144, "agent": "budget"}
            )
        largest = "\x01" * (DOOR.send // 6 - 1)
        res = await chat.send(largest)
    assert res.text == "read it all"
    last = model.requests[-1].contents[-1]["parts"]
    assert last[-1] == {"text": largest}
    assert sum("functionResponse" in p for p in last) == 4
    await assert_no_workflow_task_failed(client, chat.id)


async def test_answers_that_fit_alone_but_not_together_are_refused_with_the_reason(
    run_worker, model, client
):
    """Three answers of 900 KB, each under the 1 MiB resume cap, to three interrupts."""
    model.reply(
        calls(
            ("approve", {"question": "a"}),
            ("approve", {"question": "b"}),
            ("approve", {"question": "c"}),
        ),
        text("all answered"),
    )
    note = "n" * 900_000
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        first, second, third = (await chat.send("go")).interrupts
        mid = await chat.resume(respond=[first.respond({"approved": True, "note": note})])
        assert [i.ref for i in mid.interrupts] == [second.ref, third.ref]
        with pytest.raises(ResumeRejected, match="room for") as e:
            await chat.resume(respond=[second.respond({"approved": True, "note": note})])
        assert f"a turn holds at most {human_size(HELD.turn)}" in str(e.value)
        # By signal too: recorded, not applied.
        await client.get_workflow_handle(chat.id).signal(
            "resume", {"respond": [third.respond({"approved": True, "note": note}).model_dump()]}
        )
        (rejection,) = await rejections_reach(chat, 1)
        assert "room for" in rejection.reason
        assert [i.ref for i in await chat.pending()] == [second.ref, third.ref]
        done = await chat.resume(
            respond=[second.respond({"approved": False}), third.respond({"approved": True})]
        )
        status = await chat.status()
    assert done.text == "all answered"
    notes = [r["response"].get("note", "") for r in model.requests[1].function_responses()]
    assert [len(n) for n in notes] == [900_000, 0, 0]
    assert status.carried_bytes is not None and status.carried_bytes <= OUT.state
    await assert_no_workflow_task_failed(client, chat.id)


async def test_parallel_outputs_that_fit_alone_but_not_together_reach_the_model_as_errors(
    run_worker, model, client
):
    """Nine tool outputs of 250 KiB, each under the 256 KiB cap: 2.2 MiB together."""
    model.reply(calls(*[("big", {"kib": 250}) for _ in range(9)]), text("summarised"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        res = await chat.send("fetch everything")
        hist = await chat.history()
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS["big"] == 9  # every tool ran, once
    responses = [r["response"] for r in model.requests[1].function_responses()]
    kept = [r for r in responses if "blob" in r]
    dropped = [r for r in responses if r.get("error") == "output too large for this turn"]
    assert len(kept) + len(dropped) == 9 and kept and dropped
    assert len(kept) * 250 * KiB <= HELD.turn
    assert "it was dropped" in dropped[0]["detail"]
    assert len(hist.messages) == 4
    await assert_no_workflow_task_failed(client, chat.id)


async def test_interrupt_metadata_that_fits_alone_but_not_together_is_left_out_of_the_state(
    run_worker, model, client
):
    """Nine interrupts with 250 KiB of metadata each; every query and result still fits."""
    model.reply(calls(*[("ask_big", {"kib": 250}) for _ in range(9)]), text("all approved"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        res = await chat.send("ask them all")
        assert len(res.interrupts) == 9
        pending = await chat.pending()
        status = await chat.status()
        kept = [i for i in pending if "blob" in i.metadata]
        left_out = [i for i in pending if "omitted" in i.metadata]
        done = await chat.resume(restart=[i.restart({"tool_approved": True}) for i in pending])
    assert len(kept) + len(left_out) == 9 and kept and left_out
    assert "did not fit in what this turn can still hold" in left_out[0].metadata["omitted"]
    assert left_out[0].metadata["bytes"] == 250 * KiB
    assert len(res.model_dump_json()) <= OUT.update_result
    assert len(status.model_dump_json()) <= OUT.query
    assert done.text == "all approved"
    assert t.RUNS["ask_big"] == 18
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_long_cancel_reason_is_refused(run_worker, model, client):
    model.reply(calls(("approve", {"question": "a"}), ("approve", {"question": "b"})), text("ok"))
    reason = "r" * 1_100_000
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        await chat.send("go")
        with pytest.raises(CancelRejected, match=r"reason is 1\.05 MiB; the limit is 1\.0 KiB"):
            await chat.cancel(reason)
        # Past the client, the workflow refuses it too.
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await client.get_workflow_handle(chat.id).execute_update(
                "cancel", {"reason": reason, "identity": "ops"}
            )
        assert isinstance(e.value.cause, ApplicationError)
        assert e.value.cause.type == "CancelRejected"
        assert len(await chat.pending()) == 2
        done = await chat.cancel("too slow")
    assert done.finish_reason == FinishReason.CANCELLED
    await assert_no_workflow_task_failed(client, chat.id)


# --------------------------------------------------------------------------------------------
# 3. One approval, one run


async def test_an_approved_run_that_outlasts_its_timeout_runs_once(run_worker, model, client):
    model.reply(calls(("slow_charge", {"amount": 40})), text("I could not confirm the charge."))
    async with run_worker() as agents:
        chat = await agents.chat("approvals")
        (gate,) = (await chat.send("charge 40")).interrupts
        assert gate.source == "approval"
        res = await chat.resume(restart=[gate.restart({"tool_approved": True})])
        await asyncio.sleep(2)  # long enough for a retry to have started, had there been one
    assert res.finish_reason == FinishReason.STOP
    assert t.RUNS["slow_charge"] == 1
    (response,) = model.requests[1].function_responses()
    assert response["response"] == {
        "error": "tool 'slow_charge' timed out and was not retried",
        "note": "it may have taken effect: check before trying again",
    }
    hist = await history(client, chat.id)
    scheduled = events_of(hist, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    tool_policy = scheduled[1].activity_task_scheduled_event_attributes.retry_policy
    assert tool_policy.maximum_attempts == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_tool_with_its_own_retry_policy_keeps_it_after_approval(run_worker, model, client):
    model.reply(calls(("slow_refund", {"amount": 5})), text("unused"))
    async with run_worker() as agents:
        chat = await agents.chat("approvals")
        (gate,) = (await chat.send("refund 5")).interrupts
        res = await chat.resume(restart=[gate.restart({"tool_approved": True})])
    assert res.finish_reason == FinishReason.FAILED
    assert res.error is not None and res.error.status == "DEADLINE_EXCEEDED"
    assert t.RUNS["slow_refund"] == 3


async def test_idempotency_key_is_stable_within_a_run_and_new_for_each_approval(
    run_worker, model, client
):
    model.reply(
        calls(("flaky_pay", {"amount": 1})),
        text("paid once"),
        calls(("flaky_pay", {"amount": 1})),
        text("paid twice"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        keys = []
        for n in range(2):
            (ask,) = (await chat.send(f"pay {n}")).interrupts
            res = await chat.resume(restart=[ask.restart({"tool_approved": True})])
            assert res.finish_reason == FinishReason.STOP, res
            keys.append(model.requests[-1].function_responses()[0]["response"]["key"])
    approved = [c.idempotency_key for c in t.CONTEXTS if c.resumed]
    # Each approved run: a failed first attempt and a retry (the tool is idempotent), one key.
    assert approved == [keys[0], keys[0], keys[1], keys[1]]
    assert keys[0] != keys[1] and len(keys[0]) == 32
    await assert_no_workflow_task_failed(client, chat.id)


# --------------------------------------------------------------------------------------------
# 4. A failed turn keeps what happened


async def test_a_turn_that_fails_after_an_approved_charge_keeps_the_charge(
    run_worker, model, client
):
    model.reply(
        calls(("charge", {"amount": 70}, "c1")),
        Reply.error(400, "Request contains an invalid argument."),
        text("You were charged $70 already; I will not charge again."),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        (ask,) = (await chat.send("charge me 70")).interrupts
        failed = await chat.resume(restart=[ask.restart({"tool_approved": True})])
        assert failed.finish_reason == FinishReason.FAILED
        again = await chat.send("try again")
    assert again.finish_reason == FinishReason.STOP
    assert t.RUNS["charge"] == 2  # the interrupting run and the approved one, nothing more
    sent = model.requests[2].contents
    # The model is told the charge happened: its call and its result, then the new message.
    assert sent[1]["parts"][0]["functionCall"]["name"] == "charge"
    assert sent[2]["parts"][0]["functionResponse"]["response"] == {"charged": 70}
    assert sent[2]["parts"][-1] == {"text": "try again"}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_failed_step_keeps_its_siblings_results_and_the_failure(run_worker, model, client):
    model.reply(
        calls(("lookup", {"key": "a"}), ("denied", {"key": "b"})),
        text("The lookup worked; the other key is not yours."),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        failed = await chat.send("both")
        again = await chat.send("what happened?")
    assert failed.finish_reason == FinishReason.FAILED
    assert again.finish_reason == FinishReason.STOP
    responses = [
        p["functionResponse"]["response"] for p in model.requests[1].contents[2]["parts"][:2]
    ]
    assert responses == [
        {"key": "a", "value": "A"},
        {"error": "PERMISSION_DENIED: key b is not yours"},
    ]
    await assert_no_workflow_task_failed(client, chat.id)


# --------------------------------------------------------------------------------------------
# 6. Signal floods, and terminated conversations

HISTORY_LIMIT = 12 * 1024 * 1024


@pytest.fixture(scope="module")
async def strict_server() -> AsyncIterator[WorkflowEnvironment]:
    """A server that never suggests continue-as-new and terminates a run at 12 MiB of history
    (the stock limit is 50 MiB), so a flood of a few dozen signals can reach it."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=[
            *DISPATCH_FLAG,
            "--dynamic-config-value",
            "limit.historySize.suggestContinueAsNew=1000000000",
            "--dynamic-config-value",
            "limit.historyCount.suggestContinueAsNew=1000000",
            "--dynamic-config-value",
            f"limit.historySize.error={HISTORY_LIMIT}",
            "--dynamic-config-value",
            f"limit.historySize.warn={HISTORY_LIMIT // 2}",
        ],
        dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
    )
    async with env:
        yield env


async def _runs(client: Client, chat_id: str) -> list[str]:
    return [wf.run_id async for wf in client.list_workflows(f'WorkflowId = "{chat_id}"')]


async def no_task_failed_in_any_run(client: Client, chat_id: str) -> None:
    """Across every run of the conversation (it continued as new), no workflow task failed."""
    for run_id in await _runs(client, chat_id):
        hist = await client.get_workflow_handle(chat_id, run_id=run_id).fetch_history()
        failed = events_of(hist, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        assert not failed, (chat_id, run_id, failed[0].workflow_task_failed_event_attributes)


async def test_a_flood_of_large_junk_signals_never_gets_the_conversation_terminated(
    strict_server, model
):
    """18 MB of junk against a 12 MiB history limit, on a server that never suggests
    continue-as-new: the conversation continues as new on its own history size.

    Each signal waits for the one before it to be taken in: a workflow task during which more
    than 2 MiB of signals arrive is failed by the server itself, which no workflow can prevent
    (the README states that bound).
    """
    client = strict_server.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(calls(("approve", {"question": "q"})), text("survived"))
    junk = {"respond": [{"name": "approve", "ref": "junk", "output": {"pad": "x" * 900_000}}]}
    floods = 20
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("budget")
        (pending,) = (await chat.send("go")).interrupts
        handle = client.get_workflow_handle(chat.id)
        for n in range(floods):
            await handle.signal("resume", junk)
            await eventually(chat.status, lambda s, n=n: s.rejections > n, timeout=30)
        status = await chat.status()
        runs = await _runs(client, chat.id)
        desc = await handle.describe()
        done = await chat.resume(respond=[pending.respond({"approved": True})])
    assert status.status == "interrupted" and [p.ref for p in status.pending] == [pending.ref]
    assert len(runs) >= 3  # it continued as new on its own, the server never suggested it
    assert desc.raw_description.workflow_execution_info.history_size_bytes < HISTORY_LIMIT // 2
    assert done.text == "survived"
    await no_task_failed_in_any_run(client, chat.id)


async def test_a_terminated_conversation_is_closed_with_nothing_pending(run_worker, model, client):
    async with run_worker() as agents:
        chat, _ = await paused_on_approve(agents, model)
        await client.get_workflow_handle(chat.id).terminate("operator")
        pending = await chat.pending()
        status = await chat.status()
    assert pending == []
    assert status.status == "closed" and status.pending == []


# --------------------------------------------------------------------------------------------
# 9. Smaller ones


async def test_unknown_keys_inside_entries_reject_the_resume(run_worker, model, client):
    async with run_worker() as agents:
        chat, ref = await paused_on_approve(agents, model)
        handle = client.get_workflow_handle(chat.id)
        typo = {
            "respond": [{"name": "approve", "ref": ref, "output": {"approved": True}, "ouput": {}}]
        }
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await handle.execute_update("resume", typo)
        assert "respond[0] has unknown keys 'ouput'" in str(e.value.cause)
        await handle.signal("resume", typo)
        (rejection,) = await rejections_reach(chat, 1)
        assert [i.ref for i in await chat.pending()] == [ref]
    assert "unknown keys 'ouput'" in rejection.reason


async def test_rejections_keep_a_digest_of_the_payload_never_its_bytes(run_worker, model, client):
    async with run_worker() as agents:
        chat, _ = await paused_on_approve(agents, model)
        secret = "sk-live-hunter2-" + "x" * 20
        await client.get_workflow_handle(chat.id).signal(
            "resume", {"respond": [{"name": "approve", "ref": "nope", "output": {"token": secret}}]}
        )
        (rejection,) = await rejections_reach(chat, 1)
    assert "hunter2" not in rejection.model_dump_json()
    assert rejection.digest.startswith("sha256:") and rejection.digest.endswith("B")


async def test_a_restart_input_must_equal_the_original_as_json(run_worker, model, client):
    model.reply(calls(("charge", {"amount": 500})), text("charged"))
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        (ask,) = (await chat.send("charge 500")).interrupts
        edited = ask.restart({"tool_approved": True}).model_copy(
            update={"input": {"amount": 500.0}}
        )
        with pytest.raises(ResumeRejected, match="changes the tool's input"):
            await chat.resume(restart=[edited])
        done = await chat.resume(restart=[ask.restart({"tool_approved": True})])
    assert done.text == "charged"
    assert t.RUNS["charge"] == 2


# --------------------------------------------------------------------------------------------
# 7. Continue-as-new stays possible however long the conversation


CALLS_PER_STEP = 128


def many_calls() -> dict[str, Any]:
    """A model reply asking for 128 calls of a tool that does not exist (no activity runs).

    Without call ids, as the Gemini Developer API sends them: every ref is a uuid.
    """
    return calls(*[("nosuch", {}) for _ in range(CALLS_PER_STEP)])


@pytest.fixture(scope="module")
async def small_histories_no_wait() -> AsyncIterator[WorkflowEnvironment]:
    """conftest's ``small_histories``, but starting each new run's first task at once
    (:data:`~tests.helpers.NO_WAIT_BETWEEN_RUNS`). The 40,960-call conversation below continues
    as new 20 times or more, and each send waits for the one before it: the server's second
    between runs was idle time (27 s -> 22 s alone), on the machine the test has to itself. That
    the conversation still continues as new, what it carries and what the model is told do not
    depend on when a run's first task starts."""
    extra = [
        *(
            "--dynamic-config-value",
            f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER_EVENTS}",
        ),
        *("--dynamic-config-value", NO_WAIT_BETWEEN_RUNS),
    ]
    async with dev_server(extra_args=extra) as environment:
        yield environment


async def test_tens_of_thousands_of_tool_calls_still_continue_as_new(
    small_histories_no_wait, model
):
    # A full garbage collection inside one of this conversation's activations (the worker is
    # in process) takes it past the SDK's 2 s deadlock limit: one over the whole suite's
    # objects, which share this process, did in a serial run; one over what this test makes
    # (0.1 to 0.3 s alone) took 2.9 s under the load of a parallel run (`make test`). So the
    # suite's objects are frozen, out of the collector's walk, as agent-worker freezes its
    # start-up objects, and the collector waits until the conversation is over: what the test
    # made (about 1M objects, 0.7 s) is collected once its worker has stopped, before the next
    # test.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        await _tens_of_thousands(small_histories_no_wait, model)
    finally:
        gc.enable()
        gc.collect()
        gc.unfreeze()


async def _tens_of_thousands(small_histories, model) -> None:
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    turns, steps = 20, 16  # 40,960 calls; their refs alone would be 1.6 MB
    # Each turn ends with a long answer, so what continue-as-new carries is mostly text rather
    # than thousands of tiny call parts: a new run's first task decodes the carried state, and
    # with part-heavy state that took 0.5 s here, too near the SDK's 2 s deadlock limit on a
    # busy 2-core machine (a cost of its own, not what this test is about).
    answer = "a" * 300_000
    for turn in range(turns):
        for _ in range(steps):
            model.reply(many_calls())
        model.reply(text(f"turn {turn} done. {answer}"))
    # Then the model gives a call id: with refs forgotten, it cannot be told apart from one.
    model.reply(calls(("lookup", {"key": "k"}, "fresh-id")), text("looked up"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("many")
        for turn in range(turns):
            res = await chat.send(f"turn {turn}")
            # The scripted model records every request, and each holds the conversation so far
            # (thousands of call parts): the 340 of them would hold this process's memory (a
            # full collection over them took 1.6 s), and nothing here reads them.
            model.requests.clear()
            # The answer is kept whole; the update's result, limited to 128 KiB, cuts it.
            assert res.text.startswith(f"turn {turn} done. aaa"), res.text[:100]
        res = await chat.send("look it up")
        status = await chat.status()
        runs = await _runs(client, chat.id)
    assert res.text == "looked up"
    assert len(runs) >= turns
    assert status.carried_bytes is not None and status.carried_bytes <= OUT.state
    (ctx,) = t.CONTEXTS
    assert ctx.ref != "fresh-id"
    uuid.UUID(ctx.ref)
    await no_task_failed_in_any_run(client, chat.id)


async def test_an_audit_log_of_large_answers_still_continues_as_new(small_histories, model):
    """The audit log kept at least 50 records whatever their metadata: 600 KB each made the
    state too large to carry. Metadata is now at most 16 KiB, and kept as a digest over 4 KiB."""
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    turns = 6
    for n in range(turns):
        model.reply(calls(("approve", {"question": f"q{n}"})), text(f"done {n}"))
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("budget")
        for n in range(turns):
            (ask,) = (await chat.send(f"turn {n}")).interrupts
            answer = ask.respond({"approved": True})
            too_much = r"metadata is 586\.0 KiB; the limit is 16\.0 KiB"
            with pytest.raises(ResumeRejected, match=too_much):
                await chat.resume(respond=[answer], metadata={"attachment": "a" * 600_000})
            done = await chat.resume(
                respond=[answer], metadata={"ticket": f"T-{n}", "attachment": "a" * 12_000}
            )
            assert done.text == f"done {n}"
        hist = await chat.history()
        status = await chat.status()
        runs = await _runs(client, chat.id)
    assert len(runs) >= 3
    assert status.carried_bytes is not None and status.carried_bytes <= OUT.state
    assert len(hist.answers) == turns
    kept = hist.answers[-1].metadata
    assert kept is not None and kept["bytes"] > 12_000 and len(kept["sha256"]) == 16
    assert "over 4 KiB" in kept["omitted"]


# --------------------------------------------------------------------------------------------
# 8. Terminal and Markdown injection

ESC = "\x1b"
HOSTILE_TEXT = f"{ESC}]52;c;cm0gLXJmIH4={ESC}\\{ESC}[2J{ESC}[31mfake prompt$ \u202eevil"


async def test_agentctl_shows_control_characters_as_escapes(run_worker, model, client):
    queue_name = f"tq-{uuid.uuid4()}"
    model.reply(calls(("approve", {"question": HOSTILE_TEXT}), say=HOSTILE_TEXT))
    async with run_worker(task_queue=queue_name) as agents:
        chat = await agents.chat("budget", chat_id=f"chat-{ESC}[8m-{uuid.uuid4()}")
        await chat.send("go")
        await client.get_workflow_handle(chat.id).signal(
            f"resume{ESC}[1A",
            {"respond": [], "identity": f"mallory{ESC}[0m"},
        )
        await rejections_reach(chat, 1)
        shown = await agentctl(client, "show", chat.id, task_queue=queue_name)
        listed = await eventually(
            lambda: agentctl(client, "pending", task_queue=queue_name),
            lambda r: "approve" in r.out,
            timeout=20,
        )
    for run in (shown, listed):
        assert run.code == 0, run.err
        assert ESC not in run.out and "\u202e" not in run.out
    assert "\\x1b]52;c;" in shown.out and "\\u202e" in shown.out
    assert "mallory\\x1b[0m" in shown.out and "resume\\x1b[1A" in shown.out
    assert "\\x1b[8m" in listed.out


def shell_words(command: str) -> list[str]:
    """The words bash makes of ``command`` (the panel quotes for bash when it must)."""
    script = 'temporal() { printf "%s\\0" temporal "$@"; }\n' + command
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


def _markdown_tokens(text: str) -> list[Any]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(text)
    flat = []
    for token in tokens:
        flat.append(token)
        flat.extend(token.children or [])
    return flat


async def test_the_details_panel_cannot_be_broken_out_of(run_worker, model, client):
    hostile = "x` [click](http://evil.example) <img src=x onerror=alert(1)>\n```\nrm -rf ~\n```"
    model.reply(calls(("approve", {"question": hostile}), ("charge", {"amount": hostile})))
    async with run_worker(agents=[t.gated]) as agents:
        chat = await agents.chat(
            "gated", chat_id=f"c\n```\ntemporal workflow terminate\n```{uuid.uuid4()}"
        )
        res = await chat.send("go")
        assert len(res.interrupts) == 2
        await client.get_workflow_handle(chat.id).signal(
            "[x](http://evil.example)`", {"respond": []}
        )
        await rejections_reach(chat, 1)
        details = await current_details(client, chat.id)
    tokens = _markdown_tokens(details)
    kinds = {tok.type for tok in tokens}
    assert not kinds & {"link_open", "image", "html_inline", "html_block"}, kinds
    fences = [tok for tok in tokens if tok.type == "fence"]
    assert len(fences) == 2
    for fence_token in fences:
        (command,) = fence_token.content.splitlines()
        argv = shell_words(command)
        assert argv[:6] == [
            "temporal",
            "workflow",
            "signal",
            "--namespace",
            client.namespace,
            "--workflow-id",
        ]
        assert argv[6] == chat.id  # the exact id, newlines and backticks included
        assert json.loads(argv[-1])
    # Every input shows whole, inside one code span.
    code = [tok.content for tok in tokens if tok.type == "code_inline"]
    assert any(json.dumps(hostile)[1:-1] in c for c in code)


# --------------------------------------------------------------------------------------------
# 9. The suggested answer fits the tool


async def test_the_suggested_answer_is_an_approval_or_a_template_to_fill_in(
    run_worker, model, client
):
    model.reply(
        calls(("approve", {"question": "ship?"}), ("pickPriority", {"question": "how urgent?"})),
        text("thanks"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        approve, pick = (await chat.send("go")).interrupts
        details = await current_details(client, chat.id)
        commands = {
            json.loads(shell_words(f.content)[-1])["respond"][0]["name"]: shell_words(f.content)
            for f in _markdown_tokens(details)
            if f.type == "fence"
        }
        assert "- approve it:" in details and "- answer it (replace each <…> first):" in details
        template = commands["pickPriority"][-1]
        assert json.loads(template)["respond"][0]["output"] == {
            "priority": "<priority: low | normal | urgent>"
        }
        for argv in (
            commands["approve"],
            [
                *commands["pickPriority"][:-1],
                template.replace(
                    json.loads(template)["respond"][0]["output"]["priority"], "urgent"
                ),
            ],
        ):
            code, out = await temporal_cli(client, *argv[1:])
            assert code == 0, out
        await eventually(chat.status, lambda s: s.status == "idle")
        done = await chat.last_turn()
        audit = await chat.history()
    assert done is not None and done.text == "thanks"
    assert [r["response"] for r in model.requests[1].function_responses()] == [
        {"approved": True},
        {"priority": "urgent"},
    ]
    assert [a.ref for a in audit.answers] == [approve.ref, pick.ref]


# --------------------------------------------------------------------------------------------
# 2 and 7, as a property: random combinations of maximum-size inputs


MENU: list[tuple[str, dict[str, Any]]] = [
    ("big", {"kib": 256}),
    ("ask_big", {"kib": 256}),
    ("approve", {"question": "q" * 30_000}),
    ("charge", {"amount": 1}),
    ("garbled", {"key": "k"}),
    ("lookup", {"key": "x" * 60_000}),
    ("denied", {"key": "k"}),
]


class Plan:
    """The model's side of a random conversation: each new user message gets a random step of
    up to nine maximum-size calls; tool results get a text answer."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, request: Any) -> dict[str, Any]:
        if any("text" in p for p in request.last_parts):
            n = self.rng.randint(1, 9)
            return calls(*[self.rng.choice(MENU) for _ in range(n)])
        return text("step done")


async def assert_everything_fits(chat: Chat, client: Client) -> None:
    """Every query answers, within its budget, and continue-as-new could carry the state."""
    status = await chat.status()
    assert len(status.model_dump_json().encode()) <= OUT.query
    assert status.carried_bytes is not None and status.carried_bytes <= OUT.state
    pending = await chat.pending()
    assert json_size(pending) <= OUT.query
    await chat.history()
    await chat.rejections()
    handle = client.get_workflow_handle(chat.id)
    await handle.query("history")  # the raw first page, as the CLI reads it


async def random_operation(
    rng: random.Random, chat: Chat, client: Client, results: list[TurnResult], *, first: bool
) -> str:
    pending = [] if first else await chat.pending()
    handle = client.get_workflow_handle(chat.id)
    identity = "i" * 256
    if not pending:
        res = await chat.send(rng.choice(["go", "again", "m" * 250_000]))
        results.append(res)
        return "send"
    kind = rng.choice(["answer", "answer", "answer-signal", "junk", "cancel"])
    if kind == "cancel":
        results.append(await chat.cancel("r" * 1024, identity=identity))
        return kind
    if kind == "junk":
        entry = {"name": pending[0].name, "ref": "nope", "output": {"p": "j" * 900_000}}
        await handle.signal(rng.choice(["resume", "send", "x" * 300]), {"respond": [entry]})
        return kind
    respond, restart = [], []
    for i in rng.sample(pending, rng.randint(1, len(pending))):
        size = rng.choice([0, 100_000, 400_000])
        if i.source == "interrupt":
            respond.append(i.respond({"approved": rng.random() < 0.5, "note": "n" * size}))
        else:
            restart.append(i.restart({"tool_approved": True, "pad": "p" * size}))
    metadata = {"ticket": "t" * rng.choice([0, 5_000, 16_000])}
    if kind == "answer-signal":
        body = ResumeInput(respond=respond, restart=restart, identity=identity, metadata=metadata)
        await handle.signal("resume", body.model_dump(mode="json"))
        return kind
    try:
        res = await chat.resume(
            respond=respond, restart=restart, identity=identity, metadata=metadata
        )
    except ResumeRejected as e:
        refused = str(e)
    else:
        results.append(res)
        return kind
    # Over the turn's budget, or over the resume cap: said so, nothing applied.
    assert "room for" in refused or "the limit is" in refused, refused
    return "answer-refused"


async def test_random_maximum_size_inputs_never_break_a_conversation(small_histories_no_wait):
    """Ten conversations of eight random operations each; after every one, every query and
    the state continue-as-new would carry stay within their limits; no workflow task fails.

    On the server that starts a new run's first task at once (``small_histories_no_wait``):
    none of that depends on when a run's first task starts, and the conversations continue as
    new many times, each a second of idle time on the stock server."""
    client = small_histories_no_wait.client
    queue = f"tq-{uuid.uuid4()}"
    rng = random.Random(20261201)
    model = ScriptedModel(Plan(rng))
    done: Counter[str] = Counter()
    results: list[TurnResult] = []
    async with build_worker(client, agents=t.ALL, task_queue=queue, gemini=model.client()):
        agents = AgentClient(client, task_queue=queue)
        chats = []
        for _ in range(10):
            chat = await agents.chat("budget")
            chats.append(chat)
            for n in range(8):
                done[await random_operation(rng, chat, client, results, first=n == 0)] += 1
                await eventually(chat.status, lambda s: s.status != "running", timeout=30)
                await assert_everything_fits(chat, client)
    assert all(len(r.model_dump_json().encode()) <= OUT.update_result for r in results)
    assert done["send"] >= 10 and done["answer"] + done["answer-signal"] >= 10, done
    assert {FinishReason.STOP, FinishReason.INTERRUPTED, FinishReason.FAILED} <= {
        r.finish_reason for r in results
    }
    for chat in chats:
        await no_task_failed_in_any_run(client, chat.id)


async def test_a_reply_pausing_on_128_interrupts_is_listed_within_the_result_budget(
    run_worker, model, client
):
    # Call ids of 128 characters become the refs: the results list 128 long refs.
    model.reply(
        calls(*[("approve", {"question": "q" * 300}, f"{n:0>128}") for n in range(128)]),
        text("all answered"),
    )
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        res = await chat.send("ask everything")
        pending = await chat.pending()
        done = await chat.resume(respond=[i.respond({"approved": True}) for i in pending])
    assert len(res.model_dump_json().encode()) <= OUT.update_result
    assert len(res.interrupts) + res.interrupts_omitted == len(pending) == 128
    assert done.text == "all answered"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_model_call_id_too_long_to_keep_is_not_taken_as_a_ref(run_worker, model):
    long_id = "\x01" * 100  # 100 characters, 600 bytes as stored
    model.reply(calls(("lookup", {"key": "k"}, long_id), ("lookup", {"key": "j"}, "short")))
    model.reply(text("done"))
    async with run_worker() as agents:
        await (await agents.chat("budget")).send("look")
    refs = [c.ref for c in t.CONTEXTS]
    assert "short" in refs and long_id not in refs
    uuid.UUID(next(r for r in refs if r != "short"))
    # The model still gets its own id back.
    assert [r["id"] for r in model.requests[1].function_responses()] == [long_id, "short"]

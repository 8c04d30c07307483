"""Attacks on the caller's ``forwarded`` audit records, the "pause is whole" reports, and a
forwarding retry's earlier outcome (security review of the sub-agent answer forwarding).

An attacker here holds namespace credentials: they may signal any workflow (``resume`` with a
made-up identity token, which makes the caller pass it on whatever its rules say, or forged
``sub_agent`` reports, which anyone may send), but hold no worker keys.

Real dev server, the offline stand-in's rules (``call TOOL {json}``) on the real Gemini wire.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import Agent, FinishReason, agent_tool, approve
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import audit
from temporal_agent_interrupts.workflows.limits import DOOR, HELD, json_size
from temporal_agent_interrupts.workflows.state import ConversationState
from tests.agents import payments
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_sub_agents_continue import _no_task_failed_but_racing_signals, _runs

boss = Agent(
    "fwdboss",
    system="You delegate payments.",
    tools=[agent_tool(payments, description="Make a payment through the payments agent.")],
)


def delegate(to: str, amount: float) -> str:
    task = "call pay " + json.dumps({"to": to, "amount": amount})
    return f"call payments {json.dumps({'input': task})}"


def raw(body: object) -> RawValue:
    """``body`` as an attacker's client writes it: JSON with ``\\ud800`` escapes, which the
    SDK's own converter would refuse to send, and json.loads reads back as lone surrogates."""
    data = json.dumps(body, ensure_ascii=True).encode()
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))


# ----------------------------------------------------------------------------------------------
# 1. The forwarded record: bounded and storable whatever the answer and the verdict hold.


def test_a_forwarded_record_with_lone_surrogates_and_a_huge_reason_stays_storable():
    """A refusal reason (the child's words, which may echo an attacker's identity) of lone
    surrogates and a megabyte, and entries of huge text: the record is cut to its bounds and
    goes through Temporal's payload converter (the memo upsert), as its batch does.

    (Lone surrogates in the body itself never get this far: the activity input that passes it
    on cannot be encoded; see the update test below.)"""
    state = ConversationState(agent="fwdboss")
    huge = "\U0001f600" * 10 + "x" * 1_000_000
    evil = "\ud800\udfff\udc00" + huge
    body = {
        "respond": [
            {"ref": huge, "name": huge, "output": {"o": huge}},
            {"ref": "r2", "name": "pay"},
        ],
        "restart": [{"ref": "r3", "name": "pay"}, 7, None],
        "identity": huge,
        "metadata": {"m": huge},
    }
    audit.forwarded(
        state, at=datetime.now(UTC), chat_id="c--r", body=body, via="signal", refused=evil
    )
    assert len(state.answers) == 3  # one per dict entry; non-dict entries add none
    for record in state.answers:
        assert record.verdict == "refused"
        assert record.verdict_reason is not None
        assert len(record.verdict_reason.encode("utf-8", "surrogatepass")) <= 600
        assert len(record.verdict_reason) <= DOOR.reason_chars
        assert json_size(record.model_dump(mode="json")) < 4 * 1024
    batch = audit.outbox_batch(state)
    assert json_size(batch) <= HELD.memo_audit
    # Storable: the default converter encodes it (a lone surrogate would raise here).
    (payload,) = DataConverter.default.payload_converter.to_payloads([batch])
    payload.data.decode("utf-8")


def test_a_flood_of_forwarded_records_is_held_to_the_answer_log_bound():
    state = ConversationState(agent="fwdboss")
    entries = [{"ref": f"r{n}", "name": "pay"} for n in range(DOOR.calls_per_message)]
    for _ in range(HELD.answers_kept // len(entries) + 5):
        audit.forwarded(
            state,
            at=datetime.now(UTC),
            chat_id="c--r",
            body={"respond": entries},
            via="signal",
            refused="no",
        )
        state.audit_outbox.clear()
    assert len(state.answers) <= HELD.answers_kept
    assert state.answers_dropped > 0


# ----------------------------------------------------------------------------------------------
# 2. Forged resume signals for a sub-agent's ref (each carries a made-up token, so each is
#    passed on): each is refused there, recorded refused here, bounded, and never fails a task.


async def test_forged_token_signals_for_a_sub_agents_ref_are_recorded_refused_and_bounded(client):
    async with hosted(client, agents=[boss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("fwdboss")
        paused = await parent.send(delegate("wes", 3))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        handle = client.get_workflow_handle(parent.id)
        lone = "\ud800mallory\udfff" + "é" * 3000  # unstorable: never reaches the child
        big = "mallory" + "é" * 3000  # storable, large: reaches it, refused there
        sent = 6
        for n in range(2 * sent):  # past the run's allowance: the chain continues as new
            evil = lone if n % 2 else big
            entry = approve(i).model_dump(mode="json")
            entry["output"] = {"blob": evil}
            body = {
                "respond": [entry],
                "identity": evil,
                "identity_token": f"forged.{n}.{evil}",
                "metadata": {"m": evil},
            }
            await handle.signal("resume", raw(body))
        await eventually(
            lambda: agents.audit(parent.id),
            lambda r: any(x.kind == "forwarded" for x in r),
            timeout=60,
        )
        await asyncio.sleep(5)  # the rest pass on (or, in a run not yet re-attached, not)
        trail = await agents.audit(parent.id)
        mine = [r for r in trail if r.kind == "forwarded"]
        # No record for an answer never passed on, no verdict the attacker chose.
        # Those sent while the new run had not read its child yet are the run's own resumes
        # (unknown refs), refused as any: never more records than storable answers sent.
        assert 1 <= len(mine) <= sent, mine
        assert all(r.verdict == "refused" and r.ref == i.ref for r in mine)
        for r in mine:
            assert r.verdict_reason is not None
            assert len(r.verdict_reason.encode("utf-8", "surrogatepass")) <= 600
            assert json_size(r.model_dump(mode="json")) < 4 * 1024
        # Nothing the child applied: it still waits, and the real approver still answers.
        assert [p.ref for p in await parent.pending()] == [i.ref]
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
    await _no_task_failed_but_racing_signals(client, parent.id)


async def test_an_update_with_lone_surrogates_for_a_sub_agents_ref_is_refused_not_a_wedge(client):
    """By update, the lenient read that finds the sub-agent (answered_refs) let a body through
    whose text the activity input cannot encode: scheduling the forwarding failed the caller's
    workflow task, and the conversation was wedged (the real approver's resume refused with
    "Workflow Task in failed state"). The door now refuses it, with a reason.

    By signal the same body is recorded as a rejection ("could not reach sub-agent"): see
    test_forged_token_signals_for_a_sub_agents_ref_are_recorded_refused_and_bounded."""
    async with hosted(client, agents=[boss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("fwdboss")
        paused = await parent.send(delegate("yve", 5))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        handle = client.get_workflow_handle(parent.id)
        entry = approve(i).model_dump(mode="json")
        body = {"respond": [entry], "identity": "alice", "metadata": {"m": "\ud800"}}
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(handle.execute_update("resume", raw(body)), 15)
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "ResumeRejected", cause
        assert "resume" in cause.message, cause.message
        recovered = await asyncio.wait_for(
            parent.resume(answers=[approve(i)], identity="alice"), 30
        )
    await assert_no_workflow_task_failed(client, parent.id)
    assert recovered.finish_reason == FinishReason.STOP, recovered


# ----------------------------------------------------------------------------------------------
# 3. Forged sub_agent reports: hints only. A flood (past the run's signal allowance, so the
#    chain continues as new) neither reports the pause again, nor marks it partial, nor changes
#    what it lists.


async def test_forged_sub_agent_reports_never_report_the_pause_again(client):
    async with hosted(client, agents=[boss], model=ScriptedModel(offline_rules)) as agents:
        parent = await agents.chat("fwdboss")
        paused = await parent.send(delegate("xia", 4))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        handle = client.get_workflow_handle(parent.id)
        first_run = (await handle.describe()).run_id
        for n in range(25):
            await handle.signal("sub_agent", {"chat_id": i.chat_id})
            if n % 5 == 0:
                await handle.signal("sub_agent", {"chat_id": f"{parent.id}--forged{n}"})
        await eventually(handle.describe, lambda d: d.run_id != first_run, timeout=30)
        # Let the new run re-attach and read its child.
        assert [p.ref for p in await eventually(parent.pending, lambda p: len(p) == 1)] == [i.ref]
        last = await parent.last_turn()
        assert last is not None and not last.partial, last
        assert [x.ref for x in last.interrupts] == [i.ref]
        # The pause was reported once across the whole chain: the turn's stop is one memo
        # write per run at most; count the reports in every run's history.
        reports = 0
        for run in await _runs(client, parent.id):
            events = [
                e
                async for e in client.get_workflow_handle(
                    parent.id, run_id=run
                ).fetch_history_events()
            ]
            reports += sum(
                e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and "pending of sub-agent" in str(e.user_metadata)
                for e in events
            )
        # Each forged hint may cost a read (a few bytes when unchanged), never more than one a
        # hint: bounded by the signals the runs took.
        assert 1 <= reports <= 25 + 5 + 4, reports
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
    await _no_task_failed_but_racing_signals(client, parent.id)

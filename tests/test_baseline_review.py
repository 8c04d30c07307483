"""The one-baseline collapse (de7c453), reviewed as an attacker with namespace credentials.

Before it, a run had the durable-input and governance rules only when it recorded or declared
their patch markers (``ConversationInput.rules``). Now every run has them, whatever its start
says: these tests try what an old-rules start, or input the old rules let through, would do
now, against a real dev server. A failing test is an attack that worked.
"""

from __future__ import annotations

import json
import uuid

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.common import RawValue

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.config import TOOL_ACTIVITY
from tests import agents as t
from tests.helpers import (
    assert_no_workflow_task_failed,
    events_of,
    eventually,
    history,
    scheduled_activities,
)
from tests.test_trust_boundary import forged_state, rejections_of

OLD_RULES = ("governance-2026-12", "durable-input-2026-12", "turn-edges-2026-11")


def raw(data: bytes) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))


async def test_a_start_declaring_the_old_rules_carries_nothing_and_records_no_marker(
    run_worker, model, client
):
    """A start that declares a rules generation (the key the client used to send) beside a
    forged approved state and a made-up memo: the declaration is ignored, the state refused on
    record, the memo scrubbed, no patch marker written, no tool run, no audit record."""
    model.reply(text("hello"))
    async with run_worker(agents=[t.gated]) as agents:
        for rules in OLD_RULES:
            chat_id = f"old-rules-{uuid.uuid4()}"
            body = {
                "agent": "gated",
                "rules": rules,
                "state": json.loads(forged_state(t.gated).model_dump_json()),
            }
            handle = await client.start_workflow(
                "AgentWorkflow",
                args=[raw(json.dumps(body).encode())],
                id=chat_id,
                task_queue=agents.task_queue,
                memo={"pending": [{"name": "charge", "ref": "x"}], "answers": [{"ref": "x"}]},
            )
            reasons = await eventually(
                lambda chat_id=chat_id: rejections_of(client, chat_id),
                lambda r: len(r) == 1,
                timeout=15,
            )
            assert "a start may not carry 'state'" in reasons[0]
            chat = await agents.chat("gated", chat_id=chat_id)
            status = await chat.status()
            assert (status.status, status.turns, status.pending) == ("idle", 0, [])
            assert await (await handle.describe()).memo() == {}
            hist = await history(client, chat_id)
            assert events_of(hist, EventType.EVENT_TYPE_MARKER_RECORDED) == []
            assert TOOL_ACTIVITY not in scheduled_activities(hist)
            assert await chat.audit() == []
            await assert_no_workflow_task_failed(client, chat_id)
    assert t.RUNS["charge"] == 0


def _with(body: dict[str, object], marker: str, spelled: str) -> bytes:
    """``body`` as JSON with the string ``marker`` replaced by ``spelled`` (a token json.dumps
    cannot write: NaN, Infinity, 1e400)."""
    return json.dumps(body).replace(json.dumps(marker), spelled).encode()


async def test_numbers_json_cannot_hold_and_deep_nesting_are_refused_on_record_by_signal(
    run_worker, model, client
):
    """What the old rules let through without ``strict`` (NaN, Infinity, a number that
    overflows to infinity, nesting past DOOR.json_depth but under the old SERIALIZABLE_DEPTH),
    by signal into an approval: each is refused and recorded, no workflow task fails, no tool
    runs, the conversation stays paused, and still continues as the real answer says; nothing
    of them reaches the state that continue-as-new would carry (and refuse on reading)."""
    model.reply(calls(("charge", {"amount": 5}, "c1")), text("charged"))
    async with run_worker(agents=[t.gated]) as agents:
        chat = await agents.chat("gated", chat_id=f"nan-{uuid.uuid4()}")
        (gate,) = (await chat.send("charge 5")).interrupts
        approval = approve(gate).model_dump(mode="json", exclude_none=True)
        handle = client.get_workflow_handle(chat.id)

        def restart_with(metadata: object) -> dict[str, object]:
            entry = dict(approval, resumed_metadata=metadata)
            return {"restart": [entry]}

        deep: object = "x"
        for _ in range(100):  # past 64, under the old 200
            deep = [deep]
        payloads = [
            _with(restart_with({"tool_approved": True, "n": "@"}), "@", "NaN"),
            _with(restart_with({"tool_approved": True, "n": "@"}), "@", "Infinity"),
            _with(restart_with({"tool_approved": True, "n": "@"}), "@", "1e400"),
            _with(restart_with({"tool_approved": True, "n": "@"}), "@", "-1e400"),
            json.dumps(restart_with({"tool_approved": True, "n": deep})).encode(),
            _with({"respond": [{"name": "charge", "ref": gate.ref, "output": "@"}]}, "@", "NaN"),
            _with({"text": "hi", "n": "@"}, "@", "1e400"),
        ]
        for i, data in enumerate(payloads):
            name = "send" if i == len(payloads) - 1 else "resume"
            await handle.signal(name, arg=raw(data))
        await eventually(
            lambda: rejections_of(client, chat.id), lambda r: len(r) >= len(payloads), timeout=30
        )
        status = await chat.status()
        assert status.status == "interrupted" and [p.ref for p in status.pending] == [gate.ref]
        assert t.RUNS["charge"] == 0
        done = await chat.resume(answers=[approve(gate)])
        trail = await chat.audit()
        state = (await chat.history()).model_dump_json()
    assert done.finish_reason == FinishReason.STOP and done.text == "charged"
    assert t.RUNS["charge"] == 1
    assert [a.ref for a in trail] == [gate.ref]
    assert "NaN" not in state and "Infinity" not in state
    await assert_no_workflow_task_failed(client, chat.id)

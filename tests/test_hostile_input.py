"""Hostile input never hurts a paused turn: not lost, not answered twice, not stuck.

Payloads arrive through the real ``temporal`` CLI (signals) and through updates. After every
barrage: the pause is exactly as it was, no tool ran, the model was not called, no workflow task
failed, every signal was recorded as a rejection, and a correct answer still completes the turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload as ApiPayload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import AgentClient, AgentError, Chat, FinishReason
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.limits import DOOR
from temporal_agent_interrupts.workflows.types import InterruptRequest
from tests import agents as t
from tests.conftest import ScriptedModel
from tests.helpers import (
    assert_no_workflow_task_failed,
    cli_signal,
    current_details,
    events_of,
    eventually,
    history,
    temporal_cli,
)
from tests.hostile import HostileGenerator, Payload, oversized

CLI_PAYLOADS = 320
UPDATE_PAYLOADS = 160


async def paused_chat(
    agents: AgentClient, model: ScriptedModel
) -> tuple[Chat, list[InterruptRequest]]:
    """A conversation paused on an interrupt-only approval and a conditional tool, with an
    earlier answered call whose ref a spoofer might reuse."""
    model.reply(
        calls(("lookup", {"key": "old"}, "old-ref")),
        text("looked up"),
        calls(("approve", {"question": "ship?"}), ("charge", {"amount": 9.5})),
        text("all answered"),
    )
    chat = await agents.chat("assistant")
    await chat.send("first")
    res = await chat.send("second")
    assert [i.name for i in res.interrupts] == ["approve", "charge"]
    return chat, res.interrupts


def _raw(p: Payload) -> list[RawValue]:
    return [
        RawValue(ApiPayload(metadata={"encoding": enc.encode()}, data=data)) for data, enc in p.args
    ]


async def _assert_untouched(
    client: Client, chat: Chat, model: ScriptedModel, pending: list[InterruptRequest]
) -> None:
    assert await chat.pending() == pending
    assert t.RUNS == {"lookup": 1, "charge": 1}  # nothing ran again
    assert model.calls == 3
    await assert_no_workflow_task_failed(client, chat.id)


async def _answer(chat: Chat, pending: list[InterruptRequest]) -> None:
    approve, charge = pending
    res = await chat.resume(
        respond=[approve.respond({"approved": True})],
        restart=[charge.restart({"tool_approved": True})],
    )
    assert res.finish_reason == FinishReason.STOP
    assert res.text == "all answered"


async def test_cli_signal_barrage_is_recorded_and_harmless(run_worker, model, client):
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        gen = HostileGenerator(pending, seed=20261129, stale_ref="old-ref")
        payloads = gen.generate(CLI_PAYLOADS, cli=True)
        payloads.append(oversized(pending[0].ref, pending[0].name, size=DOOR.resume))
        assert len(payloads) > CLI_PAYLOADS
        extras = [
            ("Resume", Payload.json("wrong-case name", {"respond": []})),
            ("approve_all", Payload.json("unknown signal", {})),
            ("send", Payload.json("send while paused", {"text": "are you there?"})),
            ("send", Payload.json("send not text", {"text": 5})),
        ]
        sem = asyncio.Semaphore(4)
        # What the server says of a signal it refuses for now (see send).
        again = ("workflow is closing", "exceeded workflow execution limit for signal events")

        async def send(name: str, p: Payload, i: int, tmp: Any) -> None:
            args = p.cli_args()
            if sum(len(a) for a in args) > 100_000:
                # Beyond the OS limit for one argument: the CLI reads it from a file instead.
                path = tmp / f"payload-{i}.json"
                path.write_bytes(p.args[0][0])
                args = ["--input-file", str(path)]
            code, out = 1, ""
            async with sem:
                for attempt in range(20):
                    command = ["workflow", "signal", "--workflow-id", chat.id, "--name", name]
                    code, out = await temporal_cli(client, *command, *args)
                    # A paused run continues as new every RUN.can_signals signals, and the server
                    # takes 20 a run (docs/security.md): a signal that lands while it does, or
                    # past the 20 before it has, is refused, to be sent again, as a script must.
                    if code == 0 or not any(r in out for r in again):
                        break
                    await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            assert code == 0, f"{p.label}: {out}"

        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            await asyncio.gather(
                *(send("resume", p, i, tmp) for i, p in enumerate(payloads)),
                *(send(n, p, 1000 + i, tmp) for i, (n, p) in enumerate(extras)),
            )
        sent = len(payloads) + len(extras)
        stats = await eventually(
            chat.status, lambda s: s.rejections == sent, timeout=60, interval=0.2
        )
        assert stats.status == "interrupted"
        rejections = await chat.rejections()
        assert len(rejections) == 20  # bounded log; the total keeps counting
        assert all(
            r.reason and r.via == "signal" and r.digest.startswith("sha256:") for r in rejections
        )
        await _assert_untouched(client, chat, model, pending)
        # Every run of the chat: a paused run continues as new every RUN.can_signals signals.
        runs = await chain(client, chat.id)
        signaled = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        assert sum(len(events_of(h, signaled)) for h in runs) == sent
        scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        assert sum(len(events_of(h, scheduled)) for h in runs) == 5

        # A correct answer, also from the CLI, still completes the turn.
        approve, charge = pending
        good = {
            "respond": [{"name": approve.name, "ref": approve.ref, "output": {"approved": True}}],
            "restart": [
                {
                    "name": charge.name,
                    "ref": charge.ref,
                    "resumed_metadata": {"tool_approved": True},
                }
            ],
            "identity": "ops@example.com",
        }
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(good))
        assert code == 0, out
        done = await chat.last_turn()
        assert done is not None and done.finish_reason == FinishReason.STOP
        audit = await chat.history()
    assert {(a.ref, a.via, a.identity) for a in audit.answers} == {
        (approve.ref, "signal", "ops@example.com"),
        (charge.ref, "signal", "ops@example.com"),
    }
    assert t.RUNS == {"lookup": 1, "charge": 2}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_update_barrage_is_rejected_without_a_trace(run_worker, model, client):
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        gen = HostileGenerator(pending, seed=7, stale_ref="old-ref")
        payloads = gen.generate(UPDATE_PAYLOADS)
        payloads.append(oversized(pending[0].ref, pending[0].name, size=DOOR.resume))
        before = len((await history(client, chat.id)).events)
        handle = client.get_workflow_handle(chat.id)
        for p in payloads:
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await handle.execute_update("resume", args=_raw(p))
            assert isinstance(e.value.cause, ApplicationError) or p.label in (
                "zero arguments",
                "two arguments",
            ), p.label
        after = len((await history(client, chat.id)).events)
        assert after == before  # validator rejections never reach history
        assert (await chat.status()).rejections == 0
        await _assert_untouched(client, chat, model, pending)
        await _answer(chat, pending)


async def test_signal_and_update_give_the_same_verdict(run_worker, model, client):
    """One validation: for each payload, the update's error is the signal's recorded reason."""
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        gen = HostileGenerator(pending, seed=99, stale_ref="old-ref")
        corpus = [p for p in gen.generate(60) if len(p.args) == 1]
        handle = client.get_workflow_handle(chat.id)
        for i, p in enumerate(corpus):
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await handle.execute_update("resume", args=_raw(p))
            cause = e.value.cause
            assert isinstance(cause, ApplicationError)
            await handle.signal("resume", args=_raw(p))
            recorded = await eventually(chat.status, lambda s, n=i + 1: s.rejections == n)
            assert recorded.rejections == i + 1
            (last,) = (await chat.rejections())[-1:]
            assert last.reason == cause.message[:500], p.label
        await _assert_untouched(client, chat, model, pending)
        await _answer(chat, pending)


async def test_exactly_once_across_update_and_signal(run_worker, model, client):
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        approve, charge = pending
        answer = approve.respond({"approved": True})
        mid = await chat.resume(respond=[answer])  # by update
        assert [i.ref for i in mid.interrupts] == [charge.ref]
        handle = client.get_workflow_handle(chat.id)
        await handle.signal("resume", {"respond": [answer.model_dump()]})  # the same, by signal
        stats = await eventually(chat.status, lambda s: s.rejections == 1)
        (rejection,) = await chat.rejections()
        assert "already answered" in rejection.reason
        assert stats.pending == [mid.interrupts[0]]
        # The other one by signal first, then the same by update: the update is refused.
        restart = charge.restart({"tool_approved": True})
        await handle.signal("resume", {"restart": [restart.model_dump()]})
        done = await chat.last_turn()
        assert done is not None and done.finish_reason == FinishReason.STOP
        with pytest.raises(ResumeRejected, match="nothing is paused"):
            await chat.resume(restart=[restart])
        audit = await chat.history()
    assert [(a.ref, a.via) for a in audit.answers] == [
        (approve.ref, "update"),
        (charge.ref, "signal"),
    ]
    assert [r["response"] for r in model.requests[3].function_responses()] == [
        {"approved": True},
        {"charged": 9.5},
    ]
    assert t.RUNS == {"lookup": 1, "charge": 2}
    await assert_no_workflow_task_failed(client, chat.id)


async def test_rejections_reach_the_ui_and_the_worker_log(run_worker, model, client, caplog):
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        with caplog.at_level(logging.WARNING, logger="temporalio.workflow"):
            await client.get_workflow_handle(chat.id).signal(
                "resume",
                {
                    "respond": [{"name": "approve", "ref": "forged", "output": {}}],
                    "identity": "mallory",
                },
            )
            await eventually(chat.status, lambda s: s.rejections == 1)
        details = await current_details(client, chat.id)
        (rejection,) = await chat.rejections()
    assert rejection.identity == "mallory"
    assert "unknown ref 'forged'" in rejection.reason
    assert "Recent rejected answers" in details and "unknown ref 'forged'" in details
    assert "--name resume --input '" in details and pending[0].ref in details
    assert any("unknown ref 'forged'" in r.getMessage() for r in caplog.records)


async def test_client_caps_resume_size_before_sending(run_worker, model, client):
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        before = len((await history(client, chat.id)).events)
        huge = pending[0].respond({"approved": True, "note": "x" * DOOR.resume})
        with pytest.raises(ResumeRejected, match="limit") as e:
            await chat.resume(respond=[huge])
        assert isinstance(e.value, AgentError)
        assert len((await history(client, chat.id)).events) == before
        await _assert_untouched(client, chat, model, pending)


async def test_send_signal_starts_a_turn_for_scripts(run_worker, model, client):
    model.reply(text("created"), text("hello from a script"))
    async with run_worker() as agents:
        chat = await agents.chat("assistant")
        await chat.send("create the chat")
        code, out = await cli_signal(client, chat.id, "send", json.dumps({"text": "ping"}))
        assert code == 0, out
        res = await eventually(chat.status, lambda s: s.turns == 2 and s.status == "idle")
    assert res.last_turn is not None and res.last_turn.text == "hello from a script"
    assert model.requests[-1].contents[-1] == {"role": "user", "parts": [{"text": "ping"}]}


async def test_cli_update_route_answers_or_says_why(run_worker, model, client):
    """`temporal workflow update execute --name resume` is the synchronous route for scripts."""
    async with run_worker() as agents:
        chat, pending = await paused_chat(agents, model)
        approve, charge = pending
        bad = {"respond": [{"name": "approve", "ref": "nope", "output": {"approved": True}}]}
        code, out = await temporal_cli(
            client,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            chat.id,
            "--name",
            "resume",
            "--input",
            json.dumps(bad),
        )
        assert code != 0
        assert "unknown ref 'nope'" in out
        await _assert_untouched(client, chat, model, pending)
        good = {
            "respond": [{"name": "approve", "ref": approve.ref, "output": {"approved": True}}],
            "restart": [
                {"name": "charge", "ref": charge.ref, "resumed_metadata": {"tool_approved": True}}
            ],
        }
        code, out = await temporal_cli(
            client,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            chat.id,
            "--name",
            "resume",
            "--input",
            json.dumps(good),
        )
    assert code == 0, out
    assert "finish_reason:stop" in out
    assert "text:all answered" in out


async def chain(client: Any, chat_id: str) -> list[Any]:
    """The histories of every run of a chat, newest first (each run's start names the run it
    continued from)."""
    found = []
    run_id: str | None = None
    while True:
        hist = await client.get_workflow_handle(chat_id, run_id=run_id).fetch_history()
        found.append(hist)
        started = hist.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return found
        run_id = started.continued_execution_run_id

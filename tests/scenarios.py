"""Conversations that exercise many paths, shared by the replay tests and the history recorder."""

from __future__ import annotations

import asyncio
import json

from temporalio.client import Client

from client import AgentClient, FinishReason
from tests.conftest import ScriptedModel
from tests.helpers import eventually, held
from worker.standin import Reply, calls, text


async def rich_conversation(agents: AgentClient, model: ScriptedModel, *, chat_id: str) -> None:
    """Parallel calls, a gate, a restart that re-pauses, partial answers, a signal, a rejected
    signal, a failed turn, a cancelled turn and a normal one, on the ``gated`` test agent."""
    model.reply(
        calls(
            ("lookup", {"key": "a"}, "c1"),
            ("charge", {"amount": 3}, "c2"),
            ("approve", {"question": "q"}),
        ),
        text("first turn done"),
        Reply.error(400, "bad request"),
        calls(("approve", {"question": "again"})),
        text("last"),
    )
    chat = await agents.chat("gated", chat_id=chat_id)
    res = await chat.send("start")
    assert res.finish_reason == FinishReason.INTERRUPTED
    charge, approve = res.interrupts
    res = await chat.resume(restart=[charge.restart(), approve.restart()])  # both re-pause
    charge, approve = res.interrupts
    res = await chat.resume(restart=[charge.restart({"tool_approved": True})])  # partial
    assert [i.ref for i in res.interrupts] == [approve.ref]
    handle = agents.temporal.get_workflow_handle(chat.id)
    await handle.signal("resume", "not an object")  # rejected, recorded
    await handle.signal(
        "resume",
        {"respond": [{"name": "approve", "ref": approve.ref, "output": {"approved": True}}]},
    )
    res = await chat.last_turn()
    assert res is not None and res.finish_reason == FinishReason.STOP, res
    res = await chat.send("this one fails")
    assert res.finish_reason == FinishReason.FAILED
    res = await chat.send("ask again")
    assert res.finish_reason == FinishReason.INTERRUPTED
    res = await chat.cancel("never mind")
    assert res.finish_reason == FinishReason.CANCELLED
    res = await chat.send("finish")
    assert res.text == "last"


async def banking_conversation(agents: AgentClient, *, chat_id: str) -> None:
    """The README's example with the offline model: ask, approve, transfer."""
    chat = await agents.chat("bankingAgent", chat_id=chat_id)
    res = await chat.send("Transfer $500 to savings.")
    (approval,) = res.interrupts
    res = await chat.resume(respond=[approval.respond({"approved": True})], identity="alice")
    assert res.finish_reason == FinishReason.STOP, res


async def dump_history(client: Client, workflow_id: str) -> str:
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    return json.dumps(hist.to_json_dict(), indent=1)


async def cancel_edges_conversation(
    agents: AgentClient, model: ScriptedModel, *, chat_id: str
) -> None:
    """Cancellations that land mid-step, on the ``careful`` test agent: a cancel update during
    a model call, the pause after it, a cancel and a wait while a sibling tool runs, and a
    workflow cancellation during a model call.

    Recorded as ``edges_v1`` with the workflow code from before the turn-edges patch (commit
    f303de6), whose outcomes differ (the first cancel fails the turn, the workflow cancel is
    absorbed): the replay test proves such runs still replay. Asserts nothing about outcomes
    so it runs against either code.
    """
    first_call, release_first = held(text("too late"))
    later_call, release_later = held(text("too late"))
    model.reply(
        first_call,
        calls(("approve", {"question": "ok?"})),
        calls(("approve", {"question": "and this?"}), ("slow", {"key": "s", "seconds": 2})),
        text("after the siblings"),
        later_call,
        text("still here"),
    )
    chat = await agents.chat("careful", chat_id=chat_id)
    handle = agents.temporal.get_workflow_handle(chat.id)

    async def calls_made(n: int) -> None:
        await eventually(lambda: asyncio.sleep(0, model.calls), lambda made: made >= n)

    sending = asyncio.create_task(chat.send("hello"))
    await calls_made(1)
    await chat.cancel("stop it")  # during the model call
    release_first.set()
    await sending
    res = await chat.send("again")  # pauses (and, before the patch, cancels itself)
    if res.finish_reason == FinishReason.INTERRUPTED:
        await chat.cancel("no")
    sending = asyncio.create_task(chat.send("with a sibling"))
    await calls_made(3)
    await asyncio.sleep(0.3)  # the slow sibling is running
    waiting = asyncio.create_task(chat.last_turn())
    await chat.cancel("enough")
    await waiting
    await sending
    model.script.index = max(model.script.index, 4)  # skip the reply a cancelled turn never used
    sending = asyncio.create_task(chat.send("one more"))
    await calls_made(4)
    await handle.cancel()  # the workflow itself, during a model call
    release_later.set()
    try:
        await sending
        await chat.send("after the cancel")  # before the patch, the conversation lived on
    except Exception:  # noqa: BLE001  # the patched code closes it instead; either is recorded
        pass

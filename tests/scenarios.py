"""Conversations that exercise many paths, shared by the replay tests and the history recorder."""

from __future__ import annotations

import json

from temporalio.client import Client

from client import AgentClient, FinishReason
from tests.conftest import ScriptedModel
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

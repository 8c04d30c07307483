"""Conversations that exercise many paths, shared by the replay tests and the history recorder."""

from __future__ import annotations

import asyncio
import contextlib
import json

from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason, approve, deny
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from tests import agents as t
from tests.conftest import ScriptedModel
from tests.helpers import eventually, held
from tests.histories import WORKFLOW_ID_KEY


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


async def spine_conversation(agents: AgentClient, model: ScriptedModel, *, chat_id: str) -> None:
    """Every kind of turn event after the turn-events restructure: the rich conversation, then
    a turn started by a ``send`` signal that pauses and is answered by update with an identity
    and metadata, and a close that withdraws a pending interrupt."""
    await rich_conversation(agents, model, chat_id=chat_id)
    model.reply(
        calls(("approve", {"question": "by signal"})),
        text("answered"),
        calls(("charge", {"amount": 9})),
    )
    chat = await agents.chat("gated", chat_id=chat_id)
    handle = agents.temporal.get_workflow_handle(chat_id)
    await handle.signal("send", {"text": "started by a signal"})
    res = await eventually(chat.last_turn, lambda r: r is not None and r.turn == 5)
    assert res is not None and res.finish_reason == FinishReason.INTERRUPTED, res
    (approve,) = res.interrupts
    res = await chat.resume(
        answers=[approve.approve()], identity="alice@example.com", metadata={"ticket": "T-1"}
    )
    assert res.text == "answered", res
    res = await chat.send("charge nine")
    assert res.finish_reason == FinishReason.INTERRUPTED, res
    await chat.close("done for today")


async def governance_conversation(
    agents: AgentClient, model: ScriptedModel, *, chat_id: str
) -> None:
    """Approval governance on the ``governedAgent``: a quorum of two verified votes (one by
    update, one by signal, one voter a group member), an edit that passes the gate, then a
    2-second deadline that reminds, escalates once and cancels the turn."""
    issuer = t.GOV_ISSUER
    model.reply(
        calls(
            ("dualSignOff", {"question": "release?"}, "q1"),
            ("release", {"service": "web", "version": "1.0"}, "r1"),
        ),
        text("released"),
        calls(("quickCheck", {"question": "still there?"}, "c1")),
    )
    chat = await agents.chat("governedAgent", chat_id=chat_id)
    res = await chat.send("release web")
    sign_off, gate = res.interrupts
    res = await chat.resume(
        answers=[sign_off.approve()], identity_token=issuer.mint("alice@example.com")
    )
    assert res.finish_reason == FinishReason.INTERRUPTED, res
    edit = gate.restart({"tool_approved": True}, input={"service": "web", "version": "1.1"})
    res = await chat.resume(answers=[edit], identity_token=issuer.mint("ops@example.com"))
    assert res.finish_reason == FinishReason.INTERRUPTED, res
    body = {
        "respond": [sign_off.approve().model_dump()],
        "identity_token": issuer.mint("carol@example.com", groups=["risk"]),
    }
    await agents.temporal.get_workflow_handle(chat_id).signal("resume", body)
    # Polled by query, which adds nothing to history (``last_turn`` is an update).
    await eventually(chat.status, lambda s: s.status == "idle")
    res = await chat.send("check in")
    assert res.finish_reason == FinishReason.INTERRUPTED, res
    status = await eventually(chat.status, lambda s: s.status == "idle", timeout=15)
    assert status.last_turn is not None, status
    assert status.last_turn.finish_reason == FinishReason.CANCELLED, status


async def banking_conversation(agents: AgentClient, *, chat_id: str) -> None:
    """The README's example with the offline model: ask, approve, transfer."""
    chat = await agents.chat("bankingAgent", chat_id=chat_id)
    res = await chat.send("Transfer $500 to savings.")
    (approval,) = res.interrupts
    res = await chat.resume(respond=[approval.respond({"approved": True})], identity="alice")
    assert res.finish_reason == FinishReason.STOP, res


async def mcp_conversation(agents: AgentClient, *, chat_id: str, agent: str) -> None:
    """An agent with an MCP server's tools (``tests/mcp_servers.py``) on the offline model: a
    read-only call runs, a destructive one is approved by update and runs, one that declares
    nothing is denied by signal, and an approved one whose server asks for input pauses on its
    form, answered by signal (recorded as ``mcp``)."""
    chat = await agents.chat(agent, chat_id=chat_id)
    res = await chat.send('call lookup {"key": "k1"}')
    assert res.finish_reason == FinishReason.STOP, res
    (ask,) = (await chat.send('call delete_record {"key": "k1"}')).interrupts
    res = await chat.resume(answers=[approve(ask)], identity="alice")
    assert res.finish_reason == FinishReason.STOP, res
    (ask,) = (await chat.send('call touch {"key": "k2"}')).interrupts
    handle = agents.temporal.get_workflow_handle(chat_id)
    await handle.signal(
        "resume", {"respond": [deny(ask, "not now").model_dump(mode="json")], "identity": "bob"}
    )
    await eventually(chat.status, lambda s: s.status == "idle", timeout=30)
    # A server that asks for input: the approved call pauses on the server's form, answered by
    # signal, and is retried with the answer and the server's state.
    (ask,) = (await chat.send('call transfer {"amount": 5}')).interrupts
    (form,) = (await chat.resume(answers=[approve(ask)], identity="alice")).interrupts
    assert form.source == "input", form
    await handle.signal(
        "resume",
        {
            "respond": [form.respond({"payee": "Ann"}).model_dump(mode="json")],
            "identity": "bob",
        },
    )
    await eventually(chat.status, lambda s: s.status == "idle", timeout=30)


async def dump_history(client: Client, workflow_id: str, *, run_id: str | None = None) -> str:
    hist = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    # The workflow id beside the events (tests.histories.load): a replay binds each result's
    # seal to it (workflows.seal), and a file's name is not always the chat's id.
    return json.dumps({WORKFLOW_ID_KEY: workflow_id, **hist.to_json_dict()}, indent=1)


async def cancel_edges_conversation(
    agents: AgentClient, model: ScriptedModel, *, chat_id: str
) -> None:
    """Cancellations that land mid-step, on the ``careful`` test agent: a cancel update during
    a model call, the pause after it, a cancel and a wait while a sibling tool runs, and a
    workflow cancellation during a model call (recorded as ``edges``).
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
    res = await chat.send("again")  # pauses
    if res.finish_reason == FinishReason.INTERRUPTED:
        await chat.cancel("no")
    sending = asyncio.create_task(chat.send("with a sibling"))
    await calls_made(3)
    await asyncio.sleep(0.3)  # the slow sibling is running
    waiting = asyncio.create_task(chat.last_turn())
    await chat.cancel("enough")
    await waiting
    await sending
    model.advance_to(4)  # skip the reply a cancelled turn never used
    sending = asyncio.create_task(chat.send("one more"))
    await calls_made(4)
    await handle.cancel()  # the workflow itself, during a model call
    release_later.set()
    with contextlib.suppress(Exception):  # the cancelled workflow closes the conversation
        await sending
        await chat.send("after the cancel")


async def durable_conversation(
    agents: AgentClient, model: ScriptedModel, *, chat_id: str, big: bool = False
) -> None:
    """The durable-input rules, on the ``budget`` test agent: a malformed signal recorded,
    resume metadata kept as a digest, an idempotent tool retried within one approval, a turn
    that fails after an approved charge and keeps it, and a cancel with a reason. With ``big``,
    also an answer over the turn's budget (refused by update and by signal) and tool outputs
    over it: megabytes of history, so replayed fresh rather than kept in the repository.

    Recorded (without ``big``) as ``durable``.
    """
    note = "n" * (900_000 if big else 1000)
    model.reply(
        calls(("approve", {"question": "a"}), ("approve", {"question": "b"})),
        text("both answered"),
        calls(("flaky_pay", {"amount": 3})),
        text("paid"),
        calls(("charge", {"amount": 70}, "c1")),
        Reply.error(400, "Request contains an invalid argument."),
        text("already charged"),
        calls(("approve", {"question": "cancel me"})),
        calls(*[("big", {"kib": 250 if big else 1}) for _ in range(6)]),
        text("summarised"),
    )
    chat = await agents.chat("budget", chat_id=chat_id)
    handle = agents.temporal.get_workflow_handle(chat.id)
    first, second = (await chat.send("start")).interrupts
    await chat.resume(
        respond=[first.respond({"approved": True, "note": note})],
        metadata={"attachment": "a" * 10_000},
        identity="alice",
    )
    if big:
        too_much = second.respond({"approved": True, "note": note})
        with contextlib.suppress(ResumeRejected):  # over the turn's budget
            await chat.resume(respond=[too_much])
        await handle.signal("resume", {"respond": [too_much.model_dump()]})
    await handle.signal("resume", "not an object")
    res = await chat.resume(respond=[second.respond({"approved": False})])
    assert res.text == "both answered", res
    (ask,) = (await chat.send("pay")).interrupts
    res = await chat.resume(restart=[ask.restart({"tool_approved": True})])
    assert res.text == "paid", res
    (ask,) = (await chat.send("charge")).interrupts
    res = await chat.resume(restart=[ask.restart({"tool_approved": True})])
    assert res.finish_reason == FinishReason.FAILED, res
    res = await chat.send("try again")
    assert res.text == "already charged", res
    await chat.send("ask me")
    res = await chat.cancel("no longer needed", identity="bob")
    assert res.finish_reason == FinishReason.CANCELLED, res
    res = await chat.send("fetch it all")
    assert res.text == "summarised", res


async def streamed_conversation(agents: AgentClient, model: ScriptedModel, *, chat_id: str) -> None:
    """Streamed turns: text in pieces, a streamed turn that pauses on an approval, and its
    answer streamed on (each streaming model call with its own publisher id)."""
    model.reply(
        Reply.streamed(text("one two three four"), pieces=4, interval=0.05),
        calls(("approve", {"question": "go on?"}, "s1")),
        Reply.streamed(text("went on, as approved"), pieces=3, interval=0.05),
    )
    chat = await agents.chat("assistant", chat_id=chat_id)
    first = chat.send_stream("count")
    kinds = [ev.kind async for ev in first]
    assert kinds.count("text") >= 2 and kinds[-1] == "turn_end", kinds
    assert (await first.result()).text == "one two three four"
    paused = chat.send_stream("ask first")
    [ev async for ev in paused]
    (approval,) = (await paused.result()).interrupts
    answered = chat.resume_stream(respond=[approval.respond({"approved": True})])
    said = "".join([ev.text or "" async for ev in answered if ev.kind == "text"])
    assert said == "went on, as approved", said
    assert (await answered.result()).finish_reason == FinishReason.STOP


async def continued_conversation(
    agents: AgentClient, model: ScriptedModel, *, chat_id: str, suggest_after: int
) -> list[str]:
    """A conversation that continues as new twice, once idle and once paused, on a server that
    suggests it after ``suggest_after`` events; the run ids, oldest first."""
    for n in range(4):
        model.reply(calls(("lookup", {"key": f"k{n}"}, f"id-{n}")), text(f"answer {n}"))
    model.reply(calls(("approve", {"question": "q"}, "p1"), ("lookup", {"key": "p"})), text("done"))
    chat = await agents.chat("assistant", chat_id=chat_id)
    handle = agents.temporal.get_workflow_handle(chat_id)
    for n in range(4):
        assert (await chat.send(f"question {n}")).text == f"answer {n}"
    (pending,) = (await chat.send("go")).interrupts
    before = len(await _chain(agents.temporal, chat_id))
    wrong = {"respond": [{"name": "approve", "ref": "nope", "output": {}}]}
    base = (await chat.status()).rejections
    for n in range(suggest_after):  # refused signals grow the history while the turn waits
        await handle.signal("resume", wrong)
        # Each once the last is recorded: back to back, more than the embedded default's 20
        # signals a run would be refused by the server before the run moves on.
        await eventually(chat.status, lambda s, n=n: s.rejections > base + n, timeout=15)
    await eventually(lambda: _chain(agents.temporal, chat_id), lambda runs: len(runs) > before)
    done = await chat.resume(respond=[pending.respond({"approved": True})])
    assert done.text == "done", done
    return await _chain(agents.temporal, chat_id)


async def _chain(client: Client, chat_id: str) -> list[str]:
    """The runs of a chat, oldest first, by its continue-as-new links from the newest."""
    runs: list[str] = []
    run_id = (await client.get_workflow_handle(chat_id).describe()).run_id
    while run_id:
        runs.insert(0, run_id)
        history = await client.get_workflow_handle(chat_id, run_id=run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id
    return runs


async def sub_agent_conversation(agents: AgentClient, *, chat_id: str) -> str:
    """A supervisor whose payments sub-agent pauses on its gate; a wrong approver is refused
    through the supervisor, the right one approves through it (recorded as ``subagent`` and
    ``subagent_child``). Returns the child's chat id."""
    chat = await agents.chat(t.supervisor.name, chat_id=chat_id)
    task = 'call pay {"to": "rita", "amount": 7}'
    paused = await chat.send(f"call payments {json.dumps({'input': task})}")
    assert paused.finish_reason == FinishReason.INTERRUPTED, paused
    (ask,) = paused.interrupts
    with contextlib.suppress(ResumeRejected):
        await chat.resume(answers=[approve(ask)], identity="bob")
    done = await chat.resume(answers=[approve(ask)], identity="alice")
    assert done.finish_reason == FinishReason.STOP, done
    assert ask.chat_id is not None
    return ask.chat_id


async def sub_agent_continued_conversation(agents: AgentClient, *, chat_id: str) -> list[str]:
    """A supervisor waiting on its payments sub-agent's gate continues as new under sub-agent
    reports (one at a time, each once read), then is answered: its new run re-attaches to the
    child and learns the child's end from it (recorded as ``subagent_continued_first`` and
    ``subagent_continued_last``). The caller's run ids, oldest first."""
    from temporal_agent_interrupts.workflows.config import SUB_AGENT_SIGNAL
    from temporal_agent_interrupts.workflows.limits import RUN

    chat = await agents.chat(t.supervisor.name, chat_id=chat_id)
    task = 'call pay {"to": "rosa", "amount": 8}'
    paused = await chat.send(f"call payments {json.dumps({'input': task})}")
    assert paused.finish_reason == FinishReason.INTERRUPTED, paused
    (ask,) = paused.interrupts
    handle = agents.temporal.get_workflow_handle(chat_id)
    for _ in range(RUN.can_signals):
        await handle.signal(SUB_AGENT_SIGNAL, {"chat_id": ask.chat_id})
    await eventually(lambda: _chain(agents.temporal, chat_id), lambda runs: len(runs) > 1)
    await eventually(chat.pending, lambda p: [x.ref for x in p] == [ask.ref])
    done = await chat.resume(answers=[approve(ask)], identity="alice")
    assert done.finish_reason == FinishReason.STOP, done
    return await _chain(agents.temporal, chat_id)

"""What a web backend needs from the library, without glue of its own.

- An inbox entry (``AgentClient.pending()``, read with no worker) is answered as it is:
  ``approve``, ``deny`` and ``respond`` take it, and the answer goes to ``Chat.resume`` on the
  entry's chat, with no query to a worker first; an answer built from an entry whose call's
  input was since edited is refused.
- An interrupt's ``input`` has one shape everywhere: an object, in the memo too; too large for
  the memo, a stated placeholder object with ``input_cut``. The memo stays bounded.
- Typed errors: ``ChatNotFound`` for a chat id that names nothing, ``UnknownAgent`` (with the
  hosted names and a "did you mean") for a new chat whose agent no worker hosts, which is closed
  rather than left running; a chat that had a hosting worker keeps today's failed turn.
- Every call that waits on a worker has a finite default timeout.
"""

from __future__ import annotations

import inspect
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval
from temporal_agent_interrupts.client.api import (
    WORKER_TIMEOUT,
    AgentClient,
    Chat,
    approve,
    deny,
    respond,
)
from temporal_agent_interrupts.client.cli import ExitCode, _failure
from temporal_agent_interrupts.client.inbox import MAX_PENDING_MEMO, PausedChat, PausedInterrupt
from temporal_agent_interrupts.errors import (
    ChatNotFound,
    ResumeRejected,
    SendRejected,
    UnknownAgent,
    unknown_agent,
)
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.limits import HELD, OUT, TEMPORAL, json_size
from temporal_agent_interrupts.workflows.operator_view import (
    MEMO_LIST_BYTES,
    MEMO_SHOWN_BYTES,
    memo_entry,
)
from temporal_agent_interrupts.workflows.types import (
    ErrorKind,
    InterruptRequest,
    Requester,
    Shown,
    ShownField,
    Vote,
)
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_operator import VISIBILITY_TIMEOUT, agentctl


def gate_agent() -> Agent:
    """An interrupt-only tool and an editable gated one, under a name unique to the test (the
    inbox lists the whole namespace)."""
    return Agent(
        f"glue-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.approve, t.release],
        middleware=[ToolApproval(allow=[])],
    )


async def entries(agents: AgentClient, agent: str, chat_id: str, n: int) -> PausedChat:
    """The chat as the inbox lists it, once it lists ``n`` pending calls."""

    async def listed() -> list[PausedChat]:
        return [c for c in await agents.pending(agent=agent) if c.chat_id == chat_id]

    (found,) = await eventually(
        listed,
        lambda chats: len(chats) == 1 and len(chats[0].interrupts) == n,
        timeout=VISIBILITY_TIMEOUT,
    )
    return found


# ----------------------------------------------------------------------------------------------
# Answering from the inbox.


async def test_inbox_entries_are_answered_as_they_are(run_worker, model, client):
    """approve, deny and respond take an inbox entry; the answers go straight to resume on the
    entry's chat, from a client that never asked a worker about it."""
    agent = gate_agent()
    model.reply(
        calls(
            ("approve", {"question": "order paper?"}, "a1"),
            ("release", {"service": "api", "version": "2"}, "g1"),
            ("approve", {"question": "order ink?"}, "a2"),
        ),
        text("done"),
    )
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        paused = await chat.send("order things")
        assert [i.ref for i in paused.interrupts] == ["a1", "g1", "a2"]
        # A web backend that holds only what the inbox listed: a fresh client, the entry.
        inbox = AgentClient(client, task_queue=agents.task_queue)
        listed = await entries(inbox, agent.name, chat.id, 3)
        paper, release, ink = listed.interrupts
        assert listed.agent == agent.name
        by_id = await inbox.chat(listed.agent or "", chat_id=listed.chat_id)
        done = await by_id.resume(
            answers=[
                respond(paper, t.Answer(approved=True, note="two boxes")),
                approve(release),
                deny(ink, "we have ink"),
            ],
            identity="ops@example.com",
        )
        sent = {r["name"] + r["id"]: r["response"] for r in model.requests[-1].function_responses()}
    assert done.finish_reason == FinishReason.STOP and done.text == "done"
    assert sent["approvea1"] == {"approved": True, "note": "two boxes"}
    assert sent["approvea2"] == {"approved": False, "feedback": "we have ink"}
    assert sent["releaseg1"] == {"released": "api@2"} and t.RUNS["release"] == 1
    await assert_no_workflow_task_failed(client, chat.id)


async def test_respond_from_a_stale_inbox_entry_is_refused(run_worker, model, client):
    """An entry written for version 2; an edit proposes version 9 (back through the gate): a
    respond built from the old entry would answer for 9, and is refused; one from the fresh
    entry supplies the output, and the tool never runs."""
    agent = gate_agent()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("noted"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        (shown,) = (await chat.send("release api 2")).interrupts
        (old,) = (await entries(agents, agent.name, chat.id, 1)).interrupts
        assert old.input_digest == shown.input_digest
        edit = shown.restart({}, input={"service": "api", "version": "9"})
        (regated,) = (await chat.resume(answers=[edit], identity="eve@example.com")).interrupts
        with pytest.raises(ResumeRejected, match="no longer has the input this answer was shown"):
            await chat.resume(answers=[respond(old, {"released": "by hand"})])

        async def fresh() -> list[PausedInterrupt]:
            return (await entries(agents, agent.name, chat.id, 1)).interrupts

        (new,) = await eventually(
            fresh, lambda found: found[0].input_digest == regated.input_digest
        )
        assert new.input == {"service": "api", "version": "9"}
        done = await chat.resume(answers=[respond(new, {"released": "by hand"})])
        sent = [r["response"] for r in model.requests[-1].function_responses()]
    assert done.text == "noted" and sent == [{"released": "by hand"}]
    assert t.RUNS["release"] == 0


# ----------------------------------------------------------------------------------------------
# One shape for an interrupt's input.


async def test_the_inbox_holds_the_input_as_an_object_or_a_stated_placeholder(
    run_worker, model, client
):
    agent = gate_agent()
    long = "q" * (2 * OUT.memo_input)
    model.reply(
        calls(
            ("approve", {"question": "order paper?"}, "s1"), ("approve", {"question": long}, "l1")
        )
    )
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        small, large = (await chat.send("ask")).interrupts
        listed = await entries(agents, agent.name, chat.id, 2)
        whole = await chat.pending()
    first, second = listed.interrupts
    assert (first.input, first.input_cut) == (small.input, False)
    assert small.input == {"question": "order paper?"}
    # Too large for the memo: an object that says so, never a cut string to parse.
    assert second.input_cut and set(second.input) == {"omitted", "bytes", "sha256"}
    assert second.input["bytes"] == json_size(large.input)
    assert "Chat.pending() has it whole" in second.input["omitted"]
    assert whole[1].input == {"question": long}
    # The answer built from the cut entry still names the whole input.
    assert second.input_digest == large.input_digest

    tq = agents.task_queue
    listing = await agentctl(client, "pending", "--agent", agent.name, "--json", task_queue=tq)
    assert listing.code == 0, listing.err
    (raw,) = [c for c in listing.json()["conversations"] if c["chat_id"] == chat.id]
    assert raw["interrupts"][0]["input"] == {"question": "order paper?"}
    assert raw["interrupts"][1]["input_cut"] is True
    table = await agentctl(client, "pending", "--agent", agent.name, task_queue=tq)
    assert table.code == 0, table.err
    assert "too large for the inbox" in table.out


def test_the_memo_of_a_chat_paused_on_many_calls_stays_bounded():
    """128 paused calls (the most one model message makes), each as large as it may be in the
    memo: huge input, 1 KiB of approvers, a quorum's votes, the longest ref. With a full batch
    of answer records the memo stays under the payload Temporal takes."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    approvers = [f"approver-{n:04d}@example.com" for n in range(40)]
    votes = [Vote(identity=f"voter-{n:04d}@example.com", at=now) for n in range(16)]
    pending = [
        memo_entry(
            InterruptRequest(
                name=f"tool_{n:03d}_" + "x" * 50,
                ref="r" * 128,
                input={"blob": "\u0001" * 100_000},
                source="approval",
                since=now,
                deadline=now + timedelta(days=7),
                approvers=approvers[:32],
                approvers_omitted=8,
                quorum=16,
                votes=votes,
                input_digest="sha256:" + "0" * 64,
                requester=Requester(identity="r" * 256, verified=True),
                shown=Shown(
                    title="\u2028" * 200,
                    summary="\u00e9" * 200,
                    why="\u2028" * 300,
                    fields=[ShownField(label="\u00e9" * 200, value="\u2028" * 200)] * 12,
                    risk="critical",
                    risk_note="\u2028" * 300,
                    asked="\u2028" * 500,
                    said="\u2028" * 500,
                ),
            )
        )
        for n in range(128)
    ]
    assert all(json_size(e["shown"]) <= MEMO_SHOWN_BYTES for e in pending)
    assert pending[0]["shown"]["summary"].startswith("\u00e9")
    assert all(e["input_cut"] and json_size(e["input"]) <= OUT.memo_input for e in pending)
    assert all(json_size(e["approvers"]) <= MEMO_LIST_BYTES for e in pending)
    assert max(json_size(e) for e in pending) <= 5.5 * 1024
    assert json_size({"pending": pending}) <= MAX_PENDING_MEMO
    assert json_size({"pending": pending}) + HELD.memo_audit < TEMPORAL.payload // 2


# ----------------------------------------------------------------------------------------------
# A conversation that does not exist.


async def test_every_call_on_a_missing_chat_raises_chat_not_found(run_worker, model, client):
    async with run_worker(agents=[t.careful]) as agents:
        chat = await agents.chat("careful", chat_id=f"nobody-{uuid.uuid4()}")
        answer = PausedInterrupt(name="approve", ref="r1", source="interrupt").approve()
        calls_on_it = {
            "resume": lambda: chat.resume(answers=[answer]),
            "pending": chat.pending,
            "status": chat.status,
            "history": chat.history,
            "rejections": chat.rejections,
            "last_turn": chat.last_turn,
            "cancel": chat.cancel,
            "close": chat.close,
            "audit": chat.audit,
            "audit_report": lambda: agents.audit_report(chat.id),
        }
        for name, call in calls_on_it.items():
            with pytest.raises(ChatNotFound) as e:
                await call()
            assert e.value.chat_id == chat.id, name
    refused = await agentctl(
        client, "approve", chat.id, "r1", "--wait", "5", task_queue=agents.task_queue
    )
    assert refused.code == 2 and "no conversation with id" in refused.err


# ----------------------------------------------------------------------------------------------
# An agent no worker hosts.


async def test_a_new_chat_for_an_agent_no_worker_hosts_raises_and_is_closed(
    run_worker, model, client
):
    async with run_worker(agents=[t.careful, t.gated]) as agents:
        chat = await agents.chat("carefull")
        with pytest.raises(UnknownAgent, match="did you mean 'careful'") as e:
            await chat.send("hello")
        assert (e.value.agent, e.value.hosted, e.value.suggestion) == (
            "carefull",
            ["careful", "gated"],
            "careful",
        )
        # Closed, not left running: the reason is in its result (and so in the UI).
        result = await chat.handle.result()
        assert result.last_turn is not None and result.last_turn.closed
        error = result.last_turn.error
        assert error is not None and error.kind == ErrorKind.UNKNOWN_AGENT
        assert error.hosted == ["careful", "gated"]
        assert (await chat.handle.describe()).status == WorkflowExecutionStatus.COMPLETED
        with pytest.raises(SendRejected):
            await chat.send("hello again")
        # No name close enough: no suggestion. The stream raises it as the send does.
        far = await agents.chat("somethingElse")
        turn = far.send_stream("hello")
        with pytest.raises(UnknownAgent) as streamed:
            async for _ in turn:
                pass
        assert streamed.value.suggestion is None and "did you mean" not in str(streamed.value)
        with pytest.raises(UnknownAgent):
            await turn.result()
        assert model.calls == 0
    await assert_no_workflow_task_failed(client, chat.id)
    # agentctl: a name it was given that no worker hosts is a usage error, as a missing chat is.
    named = _failure(unknown_agent("carefull", ["careful"]))
    missing = _failure(ChatNotFound("no conversation with id 'x'", chat_id="x"))
    assert named.code == missing.code == ExitCode.USAGE and "did you mean" in named.message


async def test_a_chat_its_worker_hosted_lives_on_when_another_worker_lacks_the_agent(
    run_worker, model, client
):
    """Two workers with different agents on one queue: a turn the wrong one takes fails
    classified, as before, and the conversation goes on once a hosting worker answers."""
    tq = f"glue-{uuid.uuid4()}"
    model.reply(text("one"), text("three"))
    async with run_worker(agents=[t.careful], task_queue=tq) as agents:
        chat = await agents.chat("careful")
        assert (await chat.send("first")).text == "one"
    async with run_worker(agents=[t.gated], task_queue=tq):
        failed = await chat.send("second")
        assert failed.finish_reason == FinishReason.FAILED and not failed.closed
        assert failed.error is not None and failed.error.kind == ErrorKind.UNKNOWN_AGENT
        assert failed.error.hosted == ["gated"]
        assert (await chat.status()).status == "idle"
    async with run_worker(agents=[t.careful], task_queue=tq):
        assert (await chat.send("third")).text == "three"
    await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Finite waits.


def test_every_call_that_waits_on_a_worker_has_a_finite_default():
    waits = [
        Chat.send,
        Chat.send_stream,
        Chat.resume,
        Chat.resume_stream,
        Chat.pending,
        Chat.status,
        Chat.history,
        Chat.rejections,
        Chat.last_turn,
        Chat.cancel,
        Chat.close,
    ]
    assert timedelta(seconds=60) == WORKER_TIMEOUT
    for method in waits:
        default = inspect.signature(method).parameters["worker_timeout"].default
        assert default == WORKER_TIMEOUT, method.__name__
        assert "WORKER_TIMEOUT" in (method.__doc__ or ""), method.__name__
    # The audit reads history only: no worker, no worker_timeout.
    assert "worker_timeout" not in inspect.signature(AgentClient.audit).parameters

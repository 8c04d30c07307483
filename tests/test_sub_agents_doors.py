"""A sub-agent's interrupts answered through the caller by every door a person or a script
uses (``temporal workflow signal``, ``agentctl``, the approvals API, AG-UI), a child's deadline
policy carried out in the child, and a message to a caller that waits on its sub-agent.

Real dev server, the offline stand-in's rules on the real Gemini wire (as
tests/test_sub_agents.py): the supervisor delegates payments to a sub-agent whose approvers are
``alice`` only, and the sub-agent's ``pay`` counts its runs (``SUB_RUNS``).
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import httpx2
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from temporal_agent_interrupts import (
    Agent,
    FinishReason,
    ToolApproval,
    agent_tool,
    approve,
    interrupt,
)
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.errors import ResumeRejected, SendRejected
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows.types import ConversationResult, InterruptRequest
from tests.agents import SUB_RUNS as RUNS
from tests.agents import Answer, Ask, sub_pay, supervisor
from tests.helpers import (
    assert_no_workflow_task_failed,
    cli_signal,
    events_of,
    eventually,
    history,
)
from tests.test_agui_client import agui, serving
from tests.test_agui_client import node as node  # the fixture, shared
from tests.test_operator import VISIBILITY_TIMEOUT, agentctl
from tests.web import answer, served


@pytest.fixture
def offline() -> ScriptedModel:
    return ScriptedModel(offline_rules)


def pays(*payments: tuple[str, float]) -> str:
    """The supervisor's message: one call of the payments sub-agent, whose own message makes
    one ``pay`` call for each of ``payments`` (all in one model message)."""
    task = " ".join(f"call pay {json.dumps({'to': to, 'amount': n})}" for to, n in payments)
    return f"call payments {json.dumps({'input': task})}"


def restart_json(i: InterruptRequest, *, identity: str) -> str:
    """A script's ``resume`` signal that approves ``i``, as ``--input`` takes it."""
    return json.dumps({"restart": [approve(i).model_dump(mode="json")], "identity": identity})


# ----------------------------------------------------------------------------------------------
# temporal workflow signal


async def test_a_signal_by_the_temporal_cli_to_the_caller_answers_the_sub_agent_once(
    client, offline
):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(pays(("sig-a", 1), ("sig-b", 2)))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        first, second = paused.interrupts
        assert first.chat_id == second.chat_id and first.chat_id is not None
        child = await agents.chat("payments", chat_id=first.chat_id)

        # Someone the sub-agent's approvers do not list: refused by the sub-agent, recorded on
        # the caller (where the signal went), and nothing runs.
        code, out = await cli_signal(
            client, parent.id, "resume", restart_json(first, identity="mallory")
        )
        assert code == 0, out
        refused = await eventually(parent.rejections, lambda r: len(r) == 1, timeout=20)
        assert refused[0].handler == "resume" and refused[0].identity == "mallory"
        assert f"refused by sub-agent {first.chat_id}" in refused[0].reason
        assert "alice" in refused[0].reason  # the child's own rule, named
        assert [p.ref for p in await child.pending()] == [first.ref, second.ref]

        # An approver: the child takes it, and waits on the other call still (a message's
        # calls run once all of them are answered).
        code, out = await cli_signal(
            client, parent.id, "resume", restart_json(first, identity="alice")
        )
        assert code == 0, out
        left = await eventually(parent.pending, lambda p: [i.ref for i in p] == [second.ref])
        assert RUNS["sig-a"] == 0
        (record,) = await agents.audit(first.chat_id)
        assert (record.ref, record.identity, record.via) == (first.ref, "alice", "update")
        assert left[0].path == second.path

        # The same signal again: that call is answered; refused and recorded here, saying
        # where it was settled and what is still pending, and not taken twice.
        code, out = await cli_signal(
            client, parent.id, "resume", restart_json(first, identity="alice")
        )
        assert code == 0, out
        refused = await eventually(parent.rejections, lambda r: len(r) == 2, timeout=20)
        assert refused[-1].handler == "resume" and refused[-1].identity == "alice"
        assert refused[-1].reason == (
            f"ref {first.ref!r} is not pending: sub-agent {first.chat_id} has settled it "
            f"already (answered, or withdrawn). Pending: pay (ref {second.ref}, in sub-agent "
            f"{second.chat_id})"
        )
        assert len(await agents.audit(first.chat_id)) == 1

        # The other call, by signal too: the sub-agent answers, the caller's turn ends with it.
        code, out = await cli_signal(
            client, parent.id, "resume", restart_json(second, identity="alice")
        )
        assert code == 0, out
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "sig-a" in done.text and "sig-b" in done.text
        assert (RUNS["sig-a"], RUNS["sig-b"]) == (1, 1)
        # Once more, with the turn over: nothing is paused; each call ran once.
        code, out = await cli_signal(
            client, parent.id, "resume", restart_json(second, identity="alice")
        )
        assert code == 0, out
        refused = await eventually(parent.rejections, lambda r: len(r) == 3, timeout=20)
        assert "nothing is paused" in refused[-1].reason
        assert (RUNS["sig-a"], RUNS["sig-b"]) == (1, 1)
        assert len(await agents.audit(first.chat_id)) == 2
    await assert_no_workflow_task_failed(client, parent.id)
    await assert_no_workflow_task_failed(client, first.chat_id)


ISSUER = TokenIssuer("ES256")
verified_payments = Agent(
    "doorsVerifiedPayments",
    system="You pay, for verified approvers only.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["cfo@example.com"])],
    trust=ISSUER.trust(),
)
verified_boss = Agent(
    "doorsVerifiedBoss", system="You delegate.", tools=[agent_tool(verified_payments)]
)


async def test_a_signal_s_identity_token_through_the_caller_is_checked_by_the_sub_agent(
    client, offline
):
    async with hosted(client, agents=[verified_boss], model=offline) as agents:
        parent = await agents.chat("doorsVerifiedBoss")
        task = f"call pay {json.dumps({'to': 'sig-v', 'amount': 1})}"
        (i,) = (
            await parent.send(f"call doorsVerifiedPayments {json.dumps({'input': task})}")
        ).interrupts
        answer_i = [approve(i).model_dump(mode="json")]

        async def signal(**who: str) -> None:
            code, out = await cli_signal(
                client, parent.id, "resume", json.dumps({"restart": answer_i, **who})
            )
            assert code == 0, out

        # A valid token of someone the sub-agent's approvers do not list; then the approver's
        # name asserted without a token, which an agent with trust does not take.
        await signal(identity_token=ISSUER.mint("eve@example.com"))
        await signal(identity="cfo@example.com")
        refused = await eventually(parent.rejections, lambda r: len(r) == 2, timeout=20)
        assert all(f"refused by sub-agent {i.chat_id}" in r.reason for r in refused), refused
        assert "cfo@example.com" in refused[0].reason
        assert RUNS["sig-v"] == 0
        await signal(identity_token=ISSUER.mint("cfo@example.com"))
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "sig-v" in done.text
        assert RUNS["sig-v"] == 1
        assert i.chat_id is not None
        (record,) = await agents.audit(i.chat_id)
        assert (record.identity, record.identity_verified) == ("cfo@example.com", True)
    await assert_no_workflow_task_failed(client, parent.id)


# ----------------------------------------------------------------------------------------------
# agentctl


async def test_agentctl_lists_the_sub_agent_s_interrupt_on_the_caller_and_answers_through_it(
    client, offline
):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        tq = agents.task_queue
        parent = await agents.chat("supervisor")
        paused = await parent.send(pays(("ctl", 3)))
        (i,) = paused.interrupts
        assert i.chat_id is not None and len(i.path) == 2

        # The inbox (visibility and memo, no worker): the caller's chat, with the path.
        async def listed() -> list[dict]:
            run = await agentctl(
                client, "pending", "--agent", "supervisor", "--json", task_queue=tq
            )
            assert run.code == 0, run.err
            return [c for c in run.json()["conversations"] if c["chat_id"] == parent.id]

        (entry,) = await eventually(listed, lambda c: len(c) == 1, timeout=VISIBILITY_TIMEOUT)
        (shown,) = entry["interrupts"]
        assert (shown["name"], shown["ref"]) == ("pay", i.ref)
        assert shown["path"] == i.path and shown["chat_id"] == i.chat_id
        assert shown["approvers"] == ["alice"]
        table = await agentctl(client, "pending", "--agent", "supervisor", task_queue=tq)
        assert table.code == 0, table.err
        row = next(line for line in table.out.splitlines() if i.ref in line)
        assert "pay" in row
        assert f"sub-agent {i.chat_id}" in table.out

        # show: the caller's pending, with the path and the chat the call waits in.
        show = await agentctl(client, "show", parent.id, "--json", task_queue=tq)
        assert show.code == 0, show.err
        (pending,) = show.json()["pending"]
        assert pending["ref"] == i.ref and pending["path"] == i.path
        assert pending["chat_id"] == i.chat_id
        shown_text = await agentctl(client, "show", parent.id, task_queue=tq)
        assert f"agentctl approve {parent.id} {i.ref}" in shown_text.out
        assert i.chat_id in shown_text.out

        # Answered through the caller's chat id: the sub-agent's approvers decide.
        wrong = await agentctl(
            client, "approve", parent.id, i.ref, "--identity", "bob", task_queue=tq
        )
        assert wrong.code == 1 and "refused by sub-agent" in wrong.err, wrong
        assert "alice" in wrong.err
        assert RUNS["ctl"] == 0
        ok = await agentctl(
            client, "approve", parent.id, i.ref, "--identity", "alice", "--json", task_queue=tq
        )
        assert ok.code == 0, ok.err
        turn = ok.json()["turn"]
        assert turn["finish_reason"] == "stop" and "ctl" in turn["text"], turn
        assert RUNS["ctl"] == 1
        (record,) = await agents.audit(i.chat_id)
        assert record.identity == "alice" and record.ref == i.ref
    await assert_no_workflow_task_failed(client, parent.id)


# ----------------------------------------------------------------------------------------------
# The approvals API


async def test_the_approvals_api_answers_a_sub_agent_s_call_by_the_caller_s_chat_id(
    client, offline
):
    as_eve = {"X-Agent-Identity": "eve@example.com"}
    as_alice = {"X-Agent-Identity": "alice"}
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(pays(("http", 4)))).interrupts
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            pending = (await http.get(f"{base}/api/chats/{parent.id}/pending")).json()
            (shown,) = pending["interrupts"]
            assert shown["ref"] == i.ref and shown["path"] == i.path
            assert shown["chat_id"] == i.chat_id

            async def inbox() -> list[dict]:
                r = await http.get(f"{base}/api/inbox", params={"agent": "supervisor"})
                return [c for c in r.json()["chats"] if c["chat_id"] == parent.id]

            (chat,) = await eventually(inbox, lambda c: len(c) == 1, timeout=VISIBILITY_TIMEOUT)
            (listed,) = chat["interrupts"]
            assert listed["path"] == i.path and listed["chat_id"] == i.chat_id

            body = {"action": "approve", "input_digest": shown["input_digest"]}
            # Not one of the sub-agent's approvers: 403, saying whose rule and which.
            r = await answer(http, base, parent.id, i.ref, body, headers=as_eve)
            assert r.status_code == 403, r.text
            problem = r.json()
            assert problem["code"] == "forbidden"
            assert f"refused by sub-agent {i.chat_id}" in problem["detail"]
            assert "alice" in problem["detail"]
            assert RUNS["http"] == 0

            r = await answer(http, base, parent.id, i.ref, body, headers=as_alice)
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            assert result["finish_reason"] == "stop" and "http" in result["text"]
            assert RUNS["http"] == 1
            # The second click: the caller's turn is over, and its trail says the answer it
            # passed on was applied.
            r = await answer(http, base, parent.id, i.ref, body, headers=as_alice)
            assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
            assert "already answered" in r.json()["detail"]
            assert RUNS["http"] == 1
    await assert_no_workflow_task_failed(client, parent.id)


# ----------------------------------------------------------------------------------------------
# AG-UI, with the official client


async def test_an_agui_run_on_the_caller_pauses_on_the_sub_agent_and_a_resume_answers_it(
    client, offline, node
):
    async with (
        hosted(client, agents=[supervisor], model=offline) as agents,
        serving(agents) as base,
    ):
        thread = f"agui-sub-{uuid.uuid4()}"
        report = await agui(
            node,
            f"{base}/agui/supervisor",
            "approve",
            "--thread",
            thread,
            "--message",
            pays(("agui", 5)),
            "--identity",
            "alice",
        )
        parent = await agents.chat("supervisor", chat_id=thread)
        assert await parent.pending() == []
    paused, resumed = report["runs"]

    assert paused["outcome"] == "interrupt", paused
    (call,) = paused["toolCalls"]
    assert call["name"] == "payments"
    (shown,) = paused["interrupts"]
    # The child's call: its ref is what an answer names; the tool call it belongs to in this
    # thread is the caller's call of the sub-agent; the path and the chat it waits in ride in
    # the metadata.
    assert shown["toolCallId"] == call["toolCallId"]
    path = shown["metadata"]["path"]
    assert path[0] == call["toolCallId"] and path[-1] == shown["id"]
    child_id = shown["metadata"]["chatId"]
    assert child_id == f"{thread}--{call['toolCallId']}"
    assert shown["metadata"]["tool"] == "pay" and shown["metadata"]["approvers"] == ["alice"]
    assert paused["toolResults"] == []

    assert resumed["outcome"] == "success", resumed
    (result,) = resumed["toolResults"]
    assert result["toolCallId"] == call["toolCallId"]
    assert json.loads(result["content"])["chat_id"] == child_id
    assert "agui" in "".join(t["text"] for t in resumed["text"])
    assert RUNS["agui"] == 1
    child = await client.get_workflow_handle(child_id).describe()
    assert child.parent_id == thread and child.status == WorkflowExecutionStatus.COMPLETED
    (record,) = await agents.audit(child_id)
    assert record.identity == "alice"  # X-Agent-Identity (dev mode), checked by the child
    await assert_no_workflow_task_failed(client, thread)


async def test_an_agui_resume_from_someone_the_sub_agent_refuses_is_a_forbidden_run_error(
    client, offline, node
):
    async with (
        hosted(client, agents=[supervisor], model=offline) as agents,
        serving(agents) as base,
    ):
        url = f"{base}/agui/supervisor"
        parent = await agents.chat("supervisor", chat_id=f"agui-sub-{uuid.uuid4()}")
        (i,) = (await parent.send(pays(("agui-eve", 7)))).interrupts
        options = ["--thread", parent.id, "--interrupt-id", i.ref]
        refused = await agui(node, url, "resume", *options, "--identity", "eve")
        [run] = refused["runs"]
        assert run["outcome"] == "run_error", run
        assert run["runError"]["code"] == "forbidden", run["runError"]
        assert f"refused by sub-agent {i.chat_id}" in run["runError"]["message"]
        assert RUNS["agui-eve"] == 0
        assert [p.ref for p in await parent.pending()] == [i.ref]  # still answerable
        answered = await agui(node, url, "resume", *options, "--identity", "alice")
        [run] = answered["runs"]
        assert run["outcome"] == "success", run
        assert RUNS["agui-eve"] == 1
    await assert_no_workflow_task_failed(client, parent.id)


# ----------------------------------------------------------------------------------------------
# A child's deadline


confirm_soon = interrupt(
    "confirmSoon",
    "Ask a human; they have two seconds.",
    input=Ask,
    output=Answer,
    timeout=timedelta(seconds=2),
    on_timeout={"approved": False, "note": "nobody answered in time"},
)
confirm_or_cancel = interrupt(
    "confirmOrCancel",
    "Ask a human; the turn is cancelled if nobody answers in two seconds.",
    input=Ask,
    output=Answer,
    timeout=timedelta(seconds=2),
    on_timeout="cancel",
)
asker = Agent("doorsAsker", system="You ask.", tools=[confirm_soon, confirm_or_cancel])
boss = Agent("doorsBoss", system="You delegate asking.", tools=[agent_tool(asker)])


def ask(tool_name: str, question: str) -> str:
    task = f"call {tool_name} {json.dumps({'question': question})}"
    return f"call doorsAsker {json.dumps({'input': task})}"


async def test_a_sub_agent_s_deadline_answers_in_the_child_and_the_default_reaches_the_caller(
    client, offline
):
    async with hosted(client, agents=[boss], model=offline) as agents:
        parent = await agents.chat("doorsBoss")
        paused = await parent.send(ask("confirmSoon", "ship?"))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.chat_id is not None and i.deadline is not None
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        assert done is not None and done.finish_reason == FinishReason.STOP, done
        assert "nobody answered in time" in done.text
        # The deadline fired in the child: its timer, its audit record.
        (record,) = await agents.audit(i.chat_id)
        assert (record.kind, record.identity, record.ref) == ("deadline", "system:deadline", i.ref)
        child_hist = await history(client, i.chat_id)
        assert events_of(child_hist, EventType.EVENT_TYPE_TIMER_FIRED)
        # The caller's trail holds the child's record, naming the chat it was made in.
        (seen,) = [r for r in await agents.audit(parent.id) if r.kind != "sub_agent"]
        assert seen.chat_id == i.chat_id and seen.model_copy(update={"chat_id": None}) == record
    await assert_no_workflow_task_failed(client, parent.id)
    await assert_no_workflow_task_failed(client, i.chat_id)


async def test_a_sub_agent_s_deadline_that_cancels_fails_the_callers_call_and_it_lives_on(
    client, offline
):
    async with hosted(client, agents=[boss], model=offline) as agents:
        parent = await agents.chat("doorsBoss")
        paused = await parent.send(ask("confirmOrCancel", "ship?"))
        (i,) = paused.interrupts
        assert i.chat_id is not None
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        assert done is not None
        # The deadline fired in the child and cancelled its turn there (its audit record, its
        # result); the caller's call fails classified, naming the sub-agent and how it ended.
        (record,) = await agents.audit(i.chat_id)
        assert (record.ref, record.kind, record.via, record.identity) == (
            i.ref,
            "cancel",
            "deadline",
            "system:deadline",
        )
        handle = client.get_workflow_handle(i.chat_id, result_type=ConversationResult)
        ended = await handle.result()
        assert ended.last_turn is not None
        assert ended.last_turn.finish_reason == FinishReason.CANCELLED
        assert done.finish_reason == FinishReason.FAILED, done
        assert done.error is not None and done.error.kind == "ToolError"
        assert "doorsAsker" in done.error.message and "ended cancelled" in done.error.message
        # The caller's trail holds the child's record, naming the chat it was made in.
        (seen,) = [r for r in await agents.audit(parent.id) if r.kind != "sub_agent"]
        assert seen.chat_id == i.chat_id and seen.model_copy(update={"chat_id": None}) == record
        # The caller's conversation goes on.
        again = await parent.send("hello")
        assert again.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, parent.id)


# ----------------------------------------------------------------------------------------------
# A message while the caller waits on its sub-agent


async def test_a_message_to_a_caller_waiting_on_its_sub_agent_is_refused_as_paused(client, offline):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        (i,) = (await parent.send(pays(("busy", 6)))).interrupts
        with pytest.raises(SendRejected) as refused:
            await parent.send("hello?")
        reason = str(refused.value)
        assert "paused on interrupts" in reason and "already running" not in reason
        assert f"pay (ref {i.ref}" in reason and i.chat_id is not None and i.chat_id in reason
        # By signal: the same words, in the rejection log.
        code, out = await cli_signal(client, parent.id, "send", json.dumps({"text": "hello?"}))
        assert code == 0, out
        (rejection,) = await eventually(parent.rejections, lambda r: len(r) == 1, timeout=20)
        assert rejection.handler == "send" and "paused on interrupts" in rejection.reason
        assert RUNS["busy"] == 0
        done = await parent.resume(answers=[approve(i)], identity="alice")
        assert done.finish_reason == FinishReason.STOP
        assert RUNS["busy"] == 1
    await assert_no_workflow_task_failed(client, parent.id)


async def test_an_update_for_a_call_the_sub_agent_settled_is_refused_before_history(
    client, offline
):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        first, second = (await parent.send(pays(("upd-a", 1), ("upd-b", 2)))).interrupts
        # Refused by the sub-agent's approvers: the kind of refusal stays "forbidden".
        with pytest.raises(ResumeRejected, match="refused by sub-agent") as wrong:
            await parent.resume(answers=[approve(first)], identity="bob")
        assert wrong.value.code == "forbidden"
        still = await parent.resume(answers=[approve(first)], identity="alice")
        assert still.finish_reason == FinishReason.INTERRUPTED
        await eventually(parent.pending, lambda p: [i.ref for i in p] == [second.ref])
        accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        before = len(events_of(await history(client, parent.id), accepted))
        # The same answer again: refused by the caller's validator, so not in its history.
        with pytest.raises(ResumeRejected, match="has settled it already") as again:
            await parent.resume(answers=[approve(first)], identity="alice")
        assert again.value.code == "conflict"
        assert len(events_of(await history(client, parent.id), accepted)) == before
        # A ref neither the caller nor its sub-agent ever had: named as such.
        stray = first.model_copy(update={"ref": "no-such-ref"})
        with pytest.raises(ResumeRejected, match="waits only on its sub-agents") as unknown:
            await parent.resume(answers=[approve(stray)], identity="alice")
        assert unknown.value.code == "not_found"
        assert second.ref in str(unknown.value)
        done = await parent.resume(answers=[approve(second)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
        assert (RUNS["upd-a"], RUNS["upd-b"]) == (1, 1)
    await assert_no_workflow_task_failed(client, parent.id)

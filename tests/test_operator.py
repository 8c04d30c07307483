"""The operator's view: search attributes, memo and UI details, and ``agentctl``.

Everything runs against the session's dev server. ``agentctl`` runs as the installed console
script in a subprocess (or a pseudo-terminal for ``chat``), exactly as an operator runs it; the
worker serving the conversations runs in this process on a task queue of the test's own.
Visibility is eventually consistent, so what it returns is polled for, never slept on.
"""

from __future__ import annotations

import asyncio
import getpass
import io
import json
import os
import re
import shlex
import socket
import sys
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pexpect
import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.query.v1 import WorkflowQuery
from temporalio.api.workflowservice.v1 import QueryWorkflowRequest
from temporalio.client import Client

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.errors import NoWorkerAnswered
from temporal_agent_interrupts.worker.devserver import temporal_cli as temporal_binary
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from temporal_agent_interrupts.workflows.config import (
    AGENT_NAME,
    INTERRUPTED_SINCE,
    PENDING_INTERRUPTS,
)
from temporal_agent_interrupts.workflows.operator_view import memo_shown
from tests import agents as t
from tests.helpers import (
    cli_signal,
    current_details,
    events_of,
    eventually,
    history,
    server_address,
    temporal_cli,
)

AGENTCTL = Path(sys.executable).parent / "agentctl"
VISIBILITY_TIMEOUT = 20.0


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def agentctl_env(client: Client, task_queue: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TEMPORAL_") and k not in ("AGENTCTL_IDENTITY", "AGENT_TASK_QUEUE")
    }
    env.update(
        TEMPORAL_ADDRESS=server_address(client),
        TEMPORAL_NAMESPACE=client.namespace,
        AGENT_TASK_QUEUE=task_queue,
        # Wide enough that rich keeps ids and refs on one line; no colours to parse around.
        COLUMNS="200",
        NO_COLOR="1",
    )
    return env


async def agentctl(client: Client, *args: str, task_queue: str, timeout: float = 60) -> Run:
    """Run the installed ``agentctl`` without blocking the event loop the worker runs on."""
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        *args,
        env=agentctl_env(client, task_queue),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return Run(proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode())


async def ids(client: Client, query: str) -> set[str]:
    return {wf.id async for wf in client.list_workflows(query)}


def default_identity() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def agentctl_in_a_terminal(env: dict[str, str], *args: str) -> tuple[pexpect.spawn, io.StringIO]:
    """``agentctl ARGS`` under a pseudo-terminal, and what it printed so far (for failures)."""
    transcript = io.StringIO()
    child = pexpect.spawn(
        str(AGENTCTL), list(args), env=env, encoding="utf-8", dimensions=(40, 160), timeout=30
    )
    child.logfile_read = transcript
    return child, transcript


def queue() -> str:
    return f"tq-ops-{uuid.uuid4()}"


async def test_search_attributes_find_exactly_the_paused_chats(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    model.reply(
        calls(("approve", {"question": "a?"})),
        calls(("approve", {"question": "b?"}), ("charge", {"amount": 5})),
        calls(("lookup", {"key": "c"})),
        text("hello"),
        text("C done"),
        text("A done"),
    )
    base = f'AgentName="{agent.name}"'
    paused_on = f'{base} AND AgentStatus="interrupted" AND PendingInterrupts='
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        a, b, c, d = [await agents.chat(agent.name, chat_id=f"{agent.name}-{n}") for n in "abcd"]
        (ra, rb, rc, rd) = [await x.send("go") for x in (a, b, c, d)]
        assert [len(r.interrupts) for r in (ra, rb, rc)] == [1, 2, 1]
        assert rd.finish_reason == FinishReason.STOP

        async def lists() -> tuple[set[str], ...]:
            return (
                await ids(client, f'{base} AND AgentStatus="interrupted"'),
                await ids(client, paused_on + '"approve"'),
                await ids(client, paused_on + '"charge"'),
                await ids(client, paused_on + '"lookup"'),
                await ids(client, f'{base} AND AgentStatus="idle"'),
            )

        await eventually(
            lists,
            lambda found: found == ({a.id, b.id, c.id}, {a.id, b.id}, {b.id}, {c.id}, {d.id}),
            timeout=VISIBILITY_TIMEOUT,
        )
        # The same query through the real `temporal` CLI, as an operator would type it.
        code, out = await temporal_cli(
            client, "workflow", "list", "--query", paused_on + '"approve"', "-o", "json"
        )
        assert code == 0, out
        assert {e["execution"]["workflowId"] for e in json.loads(out)} == {a.id, b.id}

        # What visibility holds for B, with no worker involved: search attributes and memo.
        desc = await b.handle.describe()
        assert desc.typed_search_attributes.get(AGENT_NAME) == agent.name
        assert desc.typed_search_attributes.get(PENDING_INTERRUPTS) == ["approve", "charge"]
        assert desc.typed_search_attributes.get(INTERRUPTED_SINCE) == rb.interrupts[0].since
        assert (await desc.memo())["pending"] == [
            {
                "name": i.name,
                "ref": i.ref,
                "input": i.input,
                "source": i.source,
                "input_digest": i.input_digest,
                "since": i.since.isoformat() if i.since else None,
                # What a person is shown: the tool's summary and the user's message.
                "shown": memo_shown(i.shown) if i.shown else None,
            }
            for i in rb.interrupts
        ]
        assert [p["shown"]["summary"] for p in (await desc.memo())["pending"]] == [
            "Approve: Question b?",
            "Charge: Amount 5",
        ]
        assert await desc.static_summary() == f"{agent.name} conversation"

        # The UI's details panel for C carries the exact command that answers it: run it.
        details = await current_details(client, c.id)
        assert f"Waiting on `lookup` (ref `{rc.interrupts[0].ref}`) since 20" in details
        assert '- input: `{"key": "c"}`' in details
        command = re.search(
            r"temporal workflow signal --namespace (\S+) --workflow-id (\S+) --name resume "
            r"--input '([^']+)'",
            details,
        )
        assert command is not None, details
        # The namespace is named: pasted elsewhere than `default`, the command still finds C.
        assert (command[1], command[2]) == (client.namespace, c.id)
        # Run as pasted (the ids here need no quoting), pointed at the test's server.
        argv = [
            temporal_binary(),
            *shlex.split(command[0])[1:],
            "--address",
            server_address(client),
        ]
        done = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await done.communicate()
        assert done.returncode == 0, out
        await eventually(c.status, lambda s: s.status == "idle")
        # Activities are labelled for the UI. The model's name is known from the first model
        # call's result on (the agent's definition reaches the workflow that way).
        summaries = [
            json.loads(e.user_metadata.summary.data)
            for e in events_of(
                await history(client, c.id), EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            )
        ]
        assert summaries == [f"model for {agent.name}", "tool lookup", "model gemini-test"]

        # Answering takes them out of the lists; a partial answer narrows PendingInterrupts.
        await a.resume(respond=[ra.interrupts[0].respond({"approved": True})])
        still = await b.resume(respond=[rb.interrupts[0].respond({"approved": False})])
        assert [i.name for i in still.interrupts] == ["charge"]
        await eventually(
            lists,
            lambda found: found == ({b.id}, set(), {b.id}, set(), {a.id, c.id, d.id}),
            timeout=VISIBILITY_TIMEOUT,
        )
        status = await c.status()
    assert status.last_turn is not None and status.last_turn.text == "C done"
    assert t.RUNS == {"charge": 1, "lookup": 1}


async def test_agentctl_pending_reads_visibility_without_a_worker(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    model.reply(
        calls(("approve", {"question": "first?"})),
        calls(("approve", {"question": "second?"}), ("charge", {"amount": 12.5})),
    )
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        a = await agents.chat(agent.name, chat_id=f"{agent.name}-a")
        b = await agents.chat(agent.name, chat_id=f"{agent.name}-b")
        ra = await a.send("one")
        rb = await b.send("two")
    # No worker from here on.
    await eventually(
        lambda: ids(client, f'AgentName="{agent.name}" AND AgentStatus="interrupted"'),
        lambda found: found == {a.id, b.id},
        timeout=VISIBILITY_TIMEOUT,
    )

    # The reads side by side: none changes what another reads.
    run, table, nobody = await asyncio.gather(
        agentctl(client, "pending", "--agent", agent.name, "--json", task_queue=tq),
        agentctl(client, "pending", "--agent", agent.name, task_queue=tq),
        agentctl(client, "pending", "--agent", f"{agent.name}-none", task_queue=tq),
    )
    assert run.code == 0, run.err
    found = run.json()["conversations"]
    assert [c["chat_id"] for c in found] == [a.id, b.id]  # the longest waiting first
    first, second = found
    assert first["agent"] == second["agent"] == agent.name
    assert datetime.fromisoformat(first["waiting_since"]) == ra.interrupts[0].since
    assert [(i["name"], i["ref"]) for i in second["interrupts"]] == [
        (i.name, i.ref) for i in rb.interrupts
    ]
    assert [i["input"] for i in second["interrupts"]] == [
        {"question": "second?"},
        {"amount": 12.5},
    ]

    assert table.code == 0, table.err
    assert f"Paused conversations for agent {agent.name}: 2" in table.out
    for chat_id, interrupt in [(a.id, ra.interrupts[0]), *((b.id, i) for i in rb.interrupts)]:
        row = next(line for line in table.out.splitlines() if interrupt.ref in line)
        assert interrupt.name in row
        assert chat_id in table.out
    assert '{"question": "second?"}' in table.out

    assert nobody.code == 0 and "No paused conversations" in nobody.out

    # Answering needs a worker: a clear message and exit code 3, and nothing left queued.
    ref = ra.interrupts[0].ref
    answer, show = await asyncio.gather(
        agentctl(client, "approve", a.id, ref, "--wait", "1", task_queue=tq),
        agentctl(client, "show", a.id, "--wait", "1", task_queue=tq),
    )
    assert answer.code == 3, answer
    assert f"no worker answered within 1s on task queue '{tq}'" in answer.err
    assert "is `agent-worker` running?" in answer.err and "Nothing was sent" in answer.err
    assert show.code == 3 and "no worker answered within 1s" in show.err

    # Through the API an update that no worker accepted stays queued in Temporal...
    with pytest.raises(NoWorkerAnswered) as no_worker:
        await b.resume(
            respond=[rb.interrupts[0].respond({"approved": True})],
            worker_timeout=timedelta(seconds=1),
        )
    assert no_worker.value.queued
    async with run_worker(agents=[agent], task_queue=tq):
        # ... and is applied when a worker comes back, while agentctl's left nothing behind.
        await eventually(b.pending, lambda p: [i.name for i in p] == ["charge"])
        assert await a.pending() == ra.interrupts
    accepted = events_of(
        await history(client, a.id), EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    )
    assert len(accepted) == 1  # the first message only


async def test_agentctl_show_approve_restart_and_rejections(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    model.reply(
        calls(
            ("approve", {"question": "ship?"}), ("charge", {"amount": 7}), ("lookup", {"key": "k"})
        ),
        text("all done"),
    )
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("go")
        approve_i, charge_i, lookup_i = res.interrupts

        show = await agentctl(client, "show", chat.id, "--json", task_queue=tq)
        assert show.code == 0, show.err
        view = show.json()
        assert (view["chat_id"], view["agent"], view["status"]) == (
            chat.id,
            agent.name,
            "interrupted",
        )
        assert [(p["name"], p["ref"], p["source"]) for p in view["pending"]] == [
            ("approve", approve_i.ref, "interrupt"),
            ("charge", charge_i.ref, "tool"),
            ("lookup", lookup_i.ref, "approval"),
        ]
        assert view["pending"][1]["metadata"] == {"amount": 7.0, "attempt": 1}
        assert view["last_turn"]["finish_reason"] == "interrupted"
        assert view["rejections_total"] == 0 and view["recent_rejections"] == []

        shown = await agentctl(client, "show", chat.id, task_queue=tq)
        assert shown.code == 0, shown.err
        assert "status interrupted" in shown.out and "paused on approve" in shown.out
        assert f"agentctl approve {chat.id} {approve_i.ref}" in shown.out
        assert "Tool not in approved list: lookup" in shown.out

        # A rejected answer: the reason, exit code 1, and the pause exactly as it was.
        bad = await agentctl(
            client, "respond", chat.id, approve_i.ref, '{"approved": "maybe"}', task_queue=tq
        )
        assert bad.code == 1, bad
        assert "rejected: respond output for 'approve'" in bad.err
        assert "does not fit its output schema" in bad.err
        assert await chat.pending() == res.interrupts

        ok = await agentctl(
            client,
            "approve",
            chat.id,
            approve_i.ref,
            "--identity",
            "alice@example.com",
            "--json",
            task_queue=tq,
        )
        assert ok.code == 0, ok.err
        done = ok.json()
        assert done["identity"] == "alice@example.com"
        # Built from what agentctl showed: it answers only that input (input_digest).
        assert done["respond"] == [
            {
                "name": "approve",
                "ref": approve_i.ref,
                "output": {"approved": True},
                "input_digest": approve_i.input_digest,
            }
        ]
        assert done["restart"] == []
        assert done["turn"]["finish_reason"] == "interrupted"
        assert [i["ref"] for i in done["turn"]["interrupts"]] == [charge_i.ref, lookup_i.ref]

        again = await agentctl(client, "approve", chat.id, approve_i.ref, task_queue=tq)
        assert again.code == 1, again
        assert f"ref '{approve_i.ref}' is not pending" in again.err

        # approve picks restart {"tool_approved": true} for a gated tool.
        gate = await agentctl(client, "approve", chat.id, lookup_i.ref, "--json", task_queue=tq)
        assert gate.code == 0, gate.err
        assert gate.json()["restart"] == [
            {
                "name": "lookup",
                "ref": lookup_i.ref,
                # The original input is not sent back (it could be a placeholder).
                "input": None,
                "resumed_metadata": {"tool_approved": True},
                "input_digest": lookup_i.input_digest,
            }
        ]
        # Partial answers accumulate: nothing runs until every interrupt has its answer.
        assert t.RUNS == {"charge": 1}

        rerun = await agentctl(
            client,
            "restart",
            chat.id,
            charge_i.ref,
            "--metadata",
            '{"tool_approved": true}',
            task_queue=tq,
        )
        assert rerun.code == 0, rerun.err
        assert "turn 1 ended: stop" in rerun.out and "agent> all done" in rerun.out

        usage = await agentctl(client, "respond", chat.id, charge_i.ref, "[1]", task_queue=tq)
        assert usage.code == 2 and "must be a JSON object" in usage.err
        missing = await agentctl(client, "show", f"{chat.id}-nope", task_queue=tq)
        assert missing.code == 2 and "no conversation with id" in missing.err
        answers = (await chat.history()).answers
    assert t.RUNS == {"charge": 2, "lookup": 1}
    assert [r["response"] for r in model.requests[-1].function_responses()] == [
        {"approved": True},
        {"charged": 7.0},
        {"key": "k", "value": "K"},
    ]
    assert [(a.name, a.kind, a.via, a.identity) for a in answers] == [
        ("approve", "respond", "update", "alice@example.com"),
        ("lookup", "restart", "update", default_identity()),
        ("charge", "restart", "update", default_identity()),
    ]


async def test_agentctl_deny_respond_and_cancel(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    model.reply(
        calls(("approve", {"question": "q?"}), ("charge", {"amount": 3}), ("lookup", {"key": "x"})),
        text("understood"),
        calls(("approve", {"question": "again?"})),
    )
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        approve_i, charge_i, lookup_i = (await chat.send("one")).interrupts
        # deny picks the denial each kind needs: an interrupt-only tool's output model, or an
        # error for a gated tool (which then does not run).
        denied = await agentctl(
            client, "deny", chat.id, approve_i.ref, "--reason", "not today", task_queue=tq
        )
        assert denied.code == 0, denied.err
        assert "turn 1 is paused on 2 interrupt(s)" in denied.out
        gated = await agentctl(
            client, "deny", chat.id, lookup_i.ref, "--reason", "no", task_queue=tq
        )
        assert gated.code == 0, gated.err
        answered = await agentctl(
            client, "respond", chat.id, charge_i.ref, '{"skipped": true}', task_queue=tq
        )
        assert answered.code == 0, answered.err
        assert "turn 1 ended: stop" in answered.out and "agent> understood" in answered.out
        assert [r["response"] for r in model.requests[-1].function_responses()] == [
            {"approved": False, "feedback": "not today"},
            {"skipped": True},
            {"error": "denied by the user", "reason": "no"},
        ]

        await chat.send("two")
        cancelled = await agentctl(
            client, "cancel", chat.id, "--reason", "enough", "--json", task_queue=tq
        )
        assert cancelled.code == 0, cancelled.err
        result = cancelled.json()
        assert (result["reason"], result["turn"]["finish_reason"]) == ("enough", "cancelled")
        nothing = await agentctl(client, "cancel", chat.id, task_queue=tq)
        assert nothing.code == 1 and "nothing to cancel" in nothing.err
        hist = await chat.history()
    assert t.RUNS == {"charge": 1}  # the conditional interrupt's first run only
    assert model.calls == 3  # a cancel answers the model's calls without asking it again
    responses = [p.function_response for p in hist.messages[-1].parts if p.function_response]
    assert [r.response for r in responses] == [{"error": "cancelled", "reason": "enough"}]
    assert [(a.name, a.kind, a.identity) for a in hist.answers] == [
        ("approve", "respond", default_identity()),
        ("lookup", "respond", default_identity()),
        ("charge", "respond", default_identity()),
        ("approve", "cancel", default_identity()),
    ]


async def test_agentctl_cancel_does_not_print_the_text_from_before_the_pause(
    run_worker, model, client
):
    agent = t.ops_agent()
    tq = queue()
    said = "I need your approval before doing that."
    model.reply(calls(("approve", {"question": "go?"}), say=said))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("do it")
        assert (res.finish_reason, res.text) == (FinishReason.INTERRUPTED, said)

        cancelled = await agentctl(client, "cancel", chat.id, task_queue=tq)
        assert cancelled.code == 0, cancelled.err
        assert "turn 1 ended: cancelled" in cancelled.out
        # The model's words from before the pause are not the turn's answer: not shown here.
        assert said not in cancelled.out and "agent>" not in cancelled.out

        # show keeps them, labelled for what they are; --json has them as the turn's text.
        shown = await agentctl(client, "show", chat.id, task_queue=tq)
        assert shown.code == 0, shown.err
        assert "Last turn 1: cancelled" in shown.out
        assert f"the agent's last words before the cancel: {said}" in shown.out
        assert "agent>" not in shown.out
        view = (await agentctl(client, "show", chat.id, "--json", task_queue=tq)).json()
        assert (view["last_turn"]["finish_reason"], view["last_turn"]["text"]) == (
            "cancelled",
            said,
        )

        # Nothing pending: the workflow's `pending` query answers an empty list, not null.
        # (The `temporal` CLI prints an empty list as null: `{"interrupts":null}`.)
        raw = await client.workflow_service.query_workflow(
            QueryWorkflowRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=chat.id),
                query=WorkflowQuery(query_type="pending"),
            )
        )
        assert [json.loads(p.data) for p in raw.query_result.payloads] == [{"interrupts": []}]
    assert model.calls == 1


async def test_agentctl_chat_in_a_terminal(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    model.reply(calls(("approve", {"question": "ship it?"})), text("shipped"))
    chat_id = f"{agent.name}-pty"
    env = agentctl_env(client, tq)

    def drive() -> tuple[int | None, str]:
        child, transcript = agentctl_in_a_terminal(
            env, "chat", agent.name, "--id", chat_id, "--identity", "pty-user"
        )
        try:
            child.expect("you>")
            child.sendline("please ship it")
            child.expect("paused on")
            child.expect(r"\[a/d/r/s/c\]")
            child.sendline("a")
            child.expect("shipped")
            child.expect("you>")
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            child.close()
        return child.exitstatus, transcript.getvalue()

    async with run_worker(agents=[agent], task_queue=tq) as agents:
        # pexpect blocks: drive it from a thread so this loop keeps serving the worker.
        code, transcript = await asyncio.to_thread(drive)
        chat = await AgentClient(client, task_queue=tq).chat(agent.name, chat_id=chat_id)
        hist = await chat.history()
        assert agents.task_queue == tq
    assert code == 0, transcript
    assert '{"question": "ship it?"}' in transcript
    assert "interrupt-only tool" in transcript
    assert [(a.name, a.kind, a.identity) for a in hist.answers] == [
        ("approve", "respond", "pty-user")
    ]
    assert model.requests[-1].function_responses()[0]["response"] == {"approved": True}


async def test_agentctl_events_follows_a_chat_answered_by_a_cli_signal(run_worker, model, client):
    """A script answering with `temporal workflow signal` sees the answer and the rest of the
    turn on the stream, as `agentctl events --json` prints it, one object per line."""
    agent = t.ops_agent()
    tq = queue()
    model.reply(calls(("approve", {"question": "ship?"}, "c1")), text("shipped by signal"))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        paused = await chat.send("ship it")
        (interrupt,) = paused.interrupts
        follower = await asyncio.create_subprocess_exec(
            str(AGENTCTL),
            "events",
            chat.id,
            "--json",
            env=agentctl_env(client, tq),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert follower.stdout is not None
        seen: list[dict[str, Any]] = []

        async def read_until(kind: str, finish: str) -> None:
            assert follower.stdout is not None
            while True:
                line = await asyncio.wait_for(follower.stdout.readline(), 30)
                assert line, (await follower.stderr.read()).decode()  # type: ignore[union-attr]  # piped
                seen.append(json.loads(line))
                event = seen[-1]
                if event["kind"] == kind and event.get("result", {}).get("finish_reason") == finish:
                    return

        await read_until("turn_end", "interrupted")  # what was kept: the turn so far
        answer = json.dumps(
            {
                "respond": [
                    {"name": "approve", "ref": interrupt.ref, "output": {"approved": True}}
                ],
                "identity": "script",
            }
        )
        code, out = await cli_signal(client, chat.id, "resume", answer)
        assert code == 0, out
        await read_until("turn_end", "stop")
        await chat.close("done")
        assert await asyncio.wait_for(follower.wait(), 30) == 0  # ends when the chat closes
    offsets = [e["offset"] for e in seen]
    assert offsets == list(range(len(seen)))  # from the first, no gap, no repeat
    kinds = [e["kind"] for e in seen]
    assert kinds[: kinds.index("turn_end")] == ["tool_request", "interrupt"]
    after = seen[kinds.index("turn_end") + 1 :]
    assert [e["kind"] for e in after] == ["answer", "tool_response", "text", "turn_end"]
    assert after[0]["answer"] == {
        "kind": "respond",
        "via": "signal",
        "identity": "script",
        "identity_verified": False,
        "decision": "approved",
    }
    assert after[2]["text"] == "shipped by signal"


async def test_agentctl_chat_streams_text_as_it_arrives(run_worker, model, client):
    agent = t.ops_agent()
    tq = queue()
    # The model produces its first piece, then nothing more until the terminal shows it.
    produced = threading.Event()
    model.reply(Reply.streamed(text("alpha beta gamma omega"), pieces=4, hold=produced))
    env = agentctl_env(client, tq)

    def drive() -> tuple[bool, str]:
        child, transcript = agentctl_in_a_terminal(
            env, "chat", agent.name, "--identity", "pty-user"
        )
        try:
            child.expect("you>")
            child.sendline("stream please")
            child.expect("alpha")
            # Read as the model holds the rest: nothing of it can be on the terminal yet.
            held = not produced.is_set() and "omega" not in transcript.getvalue()
            produced.set()
            child.expect("omega")
            child.expect("you>")
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            produced.set()
            child.close()
        return held, transcript.getvalue()

    async with run_worker(agents=[agent], task_queue=tq):
        held, transcript = await asyncio.to_thread(drive)
    # The first words were on the terminal while the model had not yet produced the rest.
    assert held, transcript
    assert transcript.count("alpha") == 1, transcript  # streamed, not printed again at the end


async def test_every_answer_is_on_record_with_what_it_decided(run_worker, model, client):
    """approve, deny, answer and cancel: the audit log, `agentctl show` and the UI's details
    say what each answer decided, who gave it and by which path."""
    agent = t.ops_agent()
    tq = queue()
    model.reply(
        calls(
            ("approve", {"question": "ship?"}, "q1"),
            ("charge", {"amount": 7}, "c1"),
            ("lookup", {"key": "k"}, "l1"),
        ),
        text("done"),
    )
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("go")
        by_ref = {i.ref: i for i in res.interrupts}
        assert set(by_ref) == {"q1", "c1", "l1"}
        await chat.resume(answers=[by_ref["q1"].approve()], identity="ann")  # by update
        await client.get_workflow_handle(chat.id).signal(  # a denial by signal
            "resume",
            {"respond": [by_ref["c1"].deny("too much").model_dump()], "identity": "bob"},
        )
        await eventually(chat.pending, lambda p: [i.ref for i in p] == ["l1"])
        done = await chat.resume(answers=[by_ref["l1"].approve()], identity="cy")
        assert done.finish_reason == FinishReason.STOP
        hist = await chat.history()
        shown = (await agentctl(client, "show", chat.id, "--json", task_queue=tq)).json()
        details = await current_details(client, chat.id)
    decided = [(a.ref, a.decision, a.identity, a.via) for a in hist.answers]
    assert decided == [
        ("q1", "approved", "ann", "update"),
        ("c1", "denied", "bob", "signal"),
        ("l1", "approved", "cy", "update"),
    ]
    assert hist.answers[1].output == {"error": "denied by the user", "reason": "too much"}
    assert all(a.identity_verified is False for a in hist.answers)
    assert [(a["ref"], a["decision"]) for a in shown["recent_answers"]] == [
        (r, d) for r, d, _, _ in decided
    ]
    assert "### Recent decisions" in details
    assert "**denied** by `bob` (signal)" in details

"""The audit trail across runs, and answering with an identity token from a file.

A conversation's state keeps only its newest answer records; every answer is also written to
its memo, so each run's history holds its share of the trail after the run has continued as new
and the state has shed it. ``AgentClient.audit()`` and ``agentctl audit`` read those histories,
with no worker running. A dedicated dev server suggests continue-as-new after 40 events, so a
few turns span several runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pexpect
import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import ContinueAsNewInitiator
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from temporal_agent_interrupts import AgentClient, FinishReason, Interrupt, ToolContext, tool
from temporal_agent_interrupts.client.audit import RunTrail, judge, merge, read_run
from temporal_agent_interrupts.errors import NoWorkerAnswered
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import Agent, TrustedIssuer
from temporal_agent_interrupts.workflows.types import AnswerRecord
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually
from tests.test_operator import AGENTCTL, Run, agentctl, agentctl_env, agentctl_in_a_terminal

NOTE = "n" * 4000
"""A note that keeps each answer's record just under the 4 KiB it is kept whole up to, so a few
dozen answers pass the state's 128 KiB budget for them."""


class Target(BaseModel):
    target: str


DEPLOYED: list[str] = []


@tool("deploy", "Deploy; a human approves it and may change the target.", editable=True)
async def deploy(inp: Target, ctx: ToolContext) -> dict[str, str]:
    if not ctx.resumed_metadata.get("tool_approved"):
        raise Interrupt({"reason": "deploys need approval"})
    DEPLOYED.append(inp.target)
    return {"deployed": inp.target}


auditing = Agent("auditing", model="gemini-test", tools=[t.approve, deploy], max_turns=4)


async def runs_of(client: Client, chat_id: str) -> list[str]:
    return [wf.run_id async for wf in client.list_workflows(f'WorkflowId = "{chat_id}"')]


Seen = tuple[str, str, str | None, str | None, str]


def seen(records: list[AnswerRecord]) -> list[Seen]:
    return [(r.ref, r.kind, r.decision, r.identity, r.via) for r in records]


async def test_the_trail_keeps_every_answer_across_runs_after_the_state_shed_them(
    small_histories, model
):
    client = small_histories.client
    tq = f"audit-{uuid.uuid4()}"
    turns, width = 9, 4
    for n in range(turns):
        model.reply(
            calls(*(("approve", {"question": f"q{n}.{k}"}, f"a{n}.{k}") for k in range(width))),
            text(f"done {n}"),
        )
    model.reply(calls(("deploy", {"target": "production"}, "d1")), text("deployed"))
    model.reply(calls(("approve", {"question": "one more?"}, "c1")))
    expected: list[Seen] = []
    DEPLOYED.clear()
    async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
        agents = AgentClient(client, task_queue=tq)
        chat = await agents.chat("auditing")
        for n in range(turns):
            asks = (await chat.send(f"turn {n}")).interrupts
            assert [i.ref for i in asks] == [f"a{n}.{k}" for k in range(width)]
            answers = [i.respond({"approved": True, "note": NOTE}) for i in asks]
            who = f"user{n}@example.com"
            if n == 3:
                # One denial among the approvals.
                answers[0] = asks[0].deny("not this one")
            if n == 5:
                # A script's answer, by `temporal workflow signal`.
                who = "script@example.com"
                body = {"respond": [a.model_dump() for a in answers], "identity": who}
                code, out = await cli_signal(client, chat.id, "resume", json.dumps(body))
                assert code == 0, out
                want = f"done {n}"
                await eventually(
                    chat.last_turn,
                    lambda r, want=want: r is not None and r.text == want,
                    timeout=20,
                )
            else:
                done = await chat.resume(answers=answers, identity=who)
                assert (done.finish_reason, done.text) == (FinishReason.STOP, f"done {n}")
            via = "signal" if n == 5 else "update"
            expected += [
                (i.ref, "respond", "denied" if (n, k) == (3, 0) else "approved", who, via)
                for k, i in enumerate(asks)
            ]
        (gated,) = (await chat.send("deploy")).interrupts
        edit = gated.restart({"tool_approved": True}, input={"target": "staging"})
        done = await chat.resume(answers=[edit], identity="ops@example.com")
        assert done.text == "deployed" and DEPLOYED == ["staging"]
        expected.append(("d1", "edit", "edited", "ops@example.com", "update"))
        (last,) = (await chat.send("one more")).interrupts
        cancelled = await chat.cancel("changed my mind", identity="ops@example.com")
        assert cancelled.finish_reason == FinishReason.CANCELLED
        expected.append((last.ref, "cancel", "cancelled", "ops@example.com", "cancel"))
        kept = await chat.history()
        runs = await eventually(lambda: runs_of(client, chat.id), lambda r: len(r) >= 3)
    # The state shed its oldest records; the conversation ran in several runs.
    assert kept.answers_dropped > 0 and len(kept.answers) < len(expected)
    assert len(runs) >= 3

    # No worker from here on: the trail is read from history alone.
    trail = await agents.audit(chat.id)
    assert seen(trail) == expected  # every answer once, oldest first
    assert trail[-len(kept.answers) :] == kept.answers  # what the state keeps is the trail's tail
    assert [r.at for r in trail] == sorted(r.at for r in trail)
    assert trail[0].output == {"approved": True, "note": NOTE}
    assert trail[3 * width].output == {"approved": False, "feedback": "not this one"}
    (edited,) = [r for r in trail if r.kind == "edit"]
    assert (edited.input, edited.original_input) == (
        {"target": "staging"},
        {"target": "production"},
    )
    assert not any(r.identity_verified for r in trail)

    run = await agentctl(client, "audit", chat.id, "--json", task_queue=tq)
    assert run.code == 0, run.err
    assert run.json()["chat_id"] == chat.id
    assert [AnswerRecord.model_validate(a) for a in run.json()["answers"]] == trail
    table = await agentctl(client, "audit", chat.id, task_queue=tq)
    assert table.code == 0, table.err
    assert f"Answers on record for {chat.id}: {len(expected)}" in table.out
    signal_row = next(line for line in table.out.splitlines() if " a5.0 " in line)
    assert "script@example.com (asserted)" in signal_row and " signal " in signal_row
    edit_row = next(line for line in table.out.splitlines() if " d1 " in line)
    assert " edited " in edit_row and '{"target": "staging"}' in edit_row
    await assert_no_workflow_task_failed(client, chat.id)


async def test_audit_of_a_chat_no_worker_has_taken_up_and_of_an_unknown_one(small_histories):
    client = small_histories.client
    tq = f"nobody-{uuid.uuid4()}"
    agents = AgentClient(client, task_queue=tq)
    chat = await agents.chat("auditing")
    with pytest.raises(NoWorkerAnswered):
        await chat.send("anyone there?", worker_timeout=timedelta(seconds=1))
    # Started, with no workflow task done: nothing answered, and nothing needs a worker.
    started = await read_run(client, chat.id, (await chat.handle.describe()).run_id)
    assert started is not None and not started.begun
    assert await agents.audit(chat.id) == []
    empty = await agentctl(client, "audit", chat.id, task_queue=tq)
    assert empty.code == 0 and f"No answers on record for {chat.id}." in empty.out
    await client.get_workflow_handle(chat.id).terminate("test over")

    missing = f"no-such-chat-{uuid.uuid4()}"
    run = await agentctl(client, "audit", missing, task_queue=tq)
    assert run.code == 2 and f"no conversation with id {missing!r}" in run.err


# ----------------------------------------------------------------------------------------------
# Runs the trail does not trust


def forged_record(ref: str) -> dict[str, object]:
    """An answer record as the trail would show it: "approved by cfo@example.com (verified)"."""
    return {
        "at": datetime.now(UTC).isoformat(),
        "ref": ref,
        "name": "approve",
        "kind": "respond",
        "via": "update",
        "identity": "cfo@example.com",
        "identity_verified": True,
        "decision": "approved",
        "output": {"approved": True},
    }


def forged_start(agent: str, ref: str) -> dict[str, object]:
    """A start input carrying a made-up state, as only continue-as-new should."""
    record = forged_record(ref)
    state = {"agent": agent, "answers": [record], "audit_outbox": [record]}
    return {"agent": agent, "state": state}


async def test_case4_the_trail_leaves_out_runs_started_under_a_closed_chats_id(
    small_histories, model
):
    """Temporal's default id-reuse policy lets anyone start a new run under a closed chat's id,
    with a memo and an input full of made-up records. The trail reads only the conversation's
    own runs (``AgentWorkflow``, on this client's task queue, its first run and those it
    continued as new into), and names every other run with why it is left out."""
    client = small_histories.client
    tq = f"forged-{uuid.uuid4()}"
    width = 4
    expected: list[Seen] = []
    async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
        agents = AgentClient(client, task_queue=tq)
        chat = await agents.chat("auditing")
        for n in range(4):
            model.reply(
                calls(*(("approve", {"question": f"{n}.{k}"}, f"f{n}.{k}") for k in range(width))),
                text(f"done {n}"),
            )
            asks = (await chat.send(f"turn {n}")).interrupts
            who = f"user{n}@example.com"
            assert (await chat.resume(answers=[i.approve() for i in asks], identity=who)).text
            expected += [(i.ref, "respond", "approved", who, "update") for i in asks]
        await chat.close()
        real_runs = await eventually(lambda: runs_of(client, chat.id), lambda r: len(r) >= 2)
    # Several runs, linked by the workflow's own continue-as-new: all of them trusted.
    before = await agents.audit_report(chat.id)
    assert seen(before.records) == expected and before.untrusted == []
    clean = await agentctl(client, "audit", chat.id, "--json", task_queue=tq)
    assert clean.code == 0 and "untrusted" not in clean.json(), clean.err
    attack = {"id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE}

    # 1. On a task queue nobody polls: no worker ever runs it, its memo and input claim all.
    nobody = await client.start_workflow(
        "AgentWorkflow",
        forged_start("auditing", "f0.0"),
        id=chat.id,
        task_queue=f"nobody-polls-{uuid.uuid4()}",
        memo={"answers": [forged_record("f0.0")]},
        **attack,
    )
    report = await agents.audit_report(chat.id)
    assert seen(report.records) == expected
    (left_out,) = report.untrusted
    assert left_out.run_id == nobody.result_run_id and left_out.claimed == 3
    assert left_out.reason == (
        f"it ran on another task queue than {tq!r}, which this client's workers poll"
    )
    await nobody.terminate("test over")

    # 2. On the real task queue, taken up by this deployment's worker: a later fresh start.
    async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
        ours = await client.start_workflow(
            "AgentWorkflow",
            forged_start("auditing", "f1.0"),
            id=chat.id,
            task_queue=tq,
            memo={"answers": [forged_record("f1.0")]},
            **attack,
        )
        await eventually(
            lambda: read_run(client, chat.id, ours.result_run_id),
            lambda run: run is not None and run.begun,
        )
    # 3. Another workflow type under the id, on the real queue.
    impostor = await client.start_workflow(
        "Impostor",
        {"agent": "auditing"},
        id=chat.id,
        task_queue=tq,
        memo={"answers": [forged_record("f2.0")]},
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        **attack,
    )
    report = await agents.audit_report(chat.id)
    assert seen(report.records) == expected
    assert seen(await agents.audit(chat.id)) == expected
    assert not any(r.identity == "cfo@example.com" for r in report.records)
    assert [(r.run_id, r.reason) for r in report.untrusted] == [
        (
            nobody.result_run_id,
            f"it ran on another task queue than {tq!r}, which this client's workers poll",
        ),
        (
            ours.result_run_id,
            "a later start under the chat's id (this product's client never begins a second "
            "conversation under one id)",
        ),
        (impostor.result_run_id, "a workflow of another type than AgentWorkflow"),
    ]
    assert [r.claimed for r in report.untrusted][::2] == [3, 1]
    assert report.untrusted[1].claimed >= 3  # and whatever the worker wrote of its state
    assert report.untrusted[2].workflow_type == "Impostor"
    assert all(r.run_id not in real_runs for r in report.untrusted)

    # agentctl prints the trail, then a warning for each run left out; it still succeeds.
    table = await agentctl(client, "audit", chat.id, task_queue=tq)
    assert table.code == 0, table.err
    assert f"Answers on record for {chat.id}: {len(expected)}" in table.out
    assert "cfo@example.com" not in table.out
    warnings = [line for line in table.out.splitlines() if line.startswith("warning: run ")]
    assert len(warnings) == 3
    for line, run in zip(warnings, report.untrusted, strict=True):
        assert line.startswith(f"warning: run {run.run_id} (started ")
        assert line.endswith(f": {run.reason}")
    assert "left out of the trail with the 3 answer records it claimed: " in warnings[0]
    assert table.out.index("Answers on record") < table.out.index("warning: run ")
    as_json = await agentctl(client, "audit", chat.id, "--json", task_queue=tq)
    assert as_json.code == 0, as_json.err
    assert [AnswerRecord.model_validate(a) for a in as_json.json()["answers"]] == report.records
    assert [r["run_id"] for r in as_json.json()["untrusted"]] == [
        r.run_id for r in report.untrusted
    ]
    await impostor.terminate("test over")


async def test_a_first_run_started_with_a_state_holds_none_of_it(small_histories, model):
    """A chat id taken first by a start carrying a conversation's state (which only
    continue-as-new hands on): the workflow refuses the state, so the run is a conversation
    like any other, and its trail has what its workers applied, none of the made-up records."""
    client = small_histories.client
    tq = f"squat-{uuid.uuid4()}"
    chat_id = f"squatted-{uuid.uuid4()}"
    model.reply(calls(("approve", {"question": "q"}, "q1")), text("done"))
    async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
        await client.start_workflow(
            "AgentWorkflow", forged_start("auditing", "s1"), id=chat_id, task_queue=tq
        )
        agents = AgentClient(client, task_queue=tq)
        # The one who meant to start the chat attaches to that run (USE_EXISTING).
        chat = await agents.chat("auditing", chat_id=chat_id)
        (ask,) = (await chat.send("go")).interrupts
        await chat.resume(answers=[ask.approve()], identity="carol@example.com")
        report = await agents.audit_report(chat_id)
        (refused,) = await chat.rejections()
    assert [(r.ref, r.identity) for r in report.records] == [("q1", "carol@example.com")]
    assert report.untrusted == []
    assert refused.via == "start" and "may not carry 'state'" in refused.reason
    await assert_no_workflow_task_failed(client, chat_id)


WORKFLOW = ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_WORKFLOW


def trail(
    run_id: str,
    at: int,
    *,
    previous: str | None = None,
    initiator: int | None = None,
    origin: str | None = None,
    workflow_type: str = "AgentWorkflow",
    task_queue: str = "agents",
) -> RunTrail:
    """One run as its history reads: started ``at`` seconds in, continued from ``previous``."""
    return RunTrail(
        run_id=run_id,
        started=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=at),
        previous=previous,
        initiator=(WORKFLOW if previous else 0) if initiator is None else initiator,
        origin=origin or run_id,
        workflow_type=workflow_type,
        task_queue=task_queue,
    )


def test_only_the_conversations_chain_of_runs_is_trusted():
    """The pure rule, case by case: the earliest head and the runs it continued as new into;
    a reset copy of a chain run (same start event); never a retry, a cron run, a later start,
    another type or queue, or anything that continued from those."""
    runs = [
        trail("a", 0),
        trail("b", 10, previous="a"),
        trail("b-reset", 10, previous="a", origin="b"),  # Temporal copies the start event
        trail("a-reset", 0, origin="a"),
        trail("c", 20, previous="b-reset"),
        trail(
            "retry",
            30,
            previous="c",
            initiator=ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_RETRY,
        ),
        trail(
            "cron",
            31,
            previous="c",
            initiator=ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_CRON_SCHEDULE,
        ),
        trail("later", 40),
        trail("after-later", 50, previous="later"),
        trail("other-type", 41, previous="c", workflow_type="Impostor"),
        trail("other-queue", 42, previous="c", task_queue="elsewhere"),
        trail("after-retry", 60, previous="retry"),
    ]
    verdicts = judge({r.run_id: r for r in runs}, set(), task_queue="agents")
    assert set(verdicts) == {
        "retry",
        "cron",
        "later",
        "after-later",
        "other-type",
        "other-queue",
        "after-retry",
    }
    assert verdicts["after-later"] == "it continued from run later, which is not trusted"
    assert verdicts["retry"].startswith("a retry")
    # Past retention: the first run still there is the one whose predecessor is gone; a later
    # run whose predecessor is gone too began after it.
    kept = [
        trail("b", 10, previous="a"),
        trail("c", 20, previous="b"),
        trail("x", 30, previous="z"),
    ]
    gone = judge({r.run_id: r for r in kept}, {"a", "z"}, task_queue="agents")
    assert gone == {
        "x": "it continued from a run whose history is gone, after the conversation began"
    }


# ----------------------------------------------------------------------------------------------
# Identity tokens from a file


async def run_agentctl(client: Client, *args: str, task_queue: str, **env: str) -> Run:
    """``agentctl ARGS`` with more environment variables (``tests.test_operator.agentctl``
    takes none)."""
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        *args,
        env={**agentctl_env(client, task_queue), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return Run(proc.returncode if proc.returncode is not None else -1, out.decode(), err.decode())


def write_token(path: Path, token: str) -> Path:
    path.write_text(f"\n  {token}\n")  # as editors and `echo` leave it: whitespace is stripped
    return path


async def test_agentctl_answers_with_an_identity_token_from_a_file(
    run_worker, model, client, tmp_path
):
    issuer = TokenIssuer("RS256")
    verifying = Agent(
        f"verifying-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.approve, deploy],
        trust=TrustedIssuer(issuer=issuer.issuer, audience=issuer.audience, jwks=issuer.jwks()),
    )
    alice, bob = issuer.mint("alice@example.com"), issuer.mint("bob@example.com")
    model.reply(
        calls(("approve", {"question": "ship it?"}, "v1")),
        calls(("deploy", {"target": "production"}, "d1")),
        text("shipped"),
    )
    DEPLOYED.clear()
    tq = f"tokens-{uuid.uuid4()}"
    outputs: list[str] = []
    async with run_worker(agents=[verifying], task_queue=tq) as agents:
        chat = await agents.chat(verifying.name)
        (ask,) = (await chat.send("ship")).interrupts

        # A file that is not there, or empty: a usage error, and nothing is sent.
        missing = tmp_path / "missing.jwt"
        no_file = await agentctl(
            client, "approve", chat.id, "v1", "--identity-token-file", str(missing), task_queue=tq
        )
        assert no_file.code == 2
        assert f"the identity token file {str(missing)!r}" in no_file.err
        assert "does not exist" in no_file.err
        empty = write_token(tmp_path / "empty.jwt", "")
        blank = await agentctl(
            client, "approve", chat.id, "v1", "--identity-token-file", str(empty), task_queue=tq
        )
        assert blank.code == 2 and "is empty" in blank.err
        # Without a token, this agent refuses the answer.
        bare = await agentctl(client, "approve", chat.id, "v1", task_queue=tq)
        assert bare.code == 1 and "this agent verifies who answers" in bare.err
        assert [i.ref for i in await chat.pending()] == [ask.ref]

        alice_file = write_token(tmp_path / "alice.jwt", alice)
        approved = await agentctl(
            client,
            "approve",
            chat.id,
            "v1",
            "--identity-token-file",
            str(alice_file),
            "--json",
            task_queue=tq,
        )
        assert approved.code == 0, approved.err
        answer = approved.json()
        assert (answer["identity"], answer["identity_verified"]) == ("alice@example.com", True)
        (gated,) = answer["turn"]["interrupts"]
        assert (gated["name"], gated["ref"], gated["editable"]) == ("deploy", "d1", True)

        # The file named by the environment; a token already spent here is refused.
        edit = ["restart", chat.id, "d1", "--metadata", '{"tool_approved": true}']
        edit += ["--input", '{"target": "staging"}']
        spent = await run_agentctl(
            client, *edit, task_queue=tq, AGENTCTL_IDENTITY_TOKEN_FILE=str(alice_file)
        )
        assert spent.code == 1 and "already used" in spent.err
        bob_file = write_token(tmp_path / "bob.jwt", bob)
        # AGENTCTL_IDENTITY is for answering without a token: with one, the token names who.
        edited = await run_agentctl(
            client,
            *edit,
            task_queue=tq,
            AGENTCTL_IDENTITY_TOKEN_FILE=str(bob_file),
            AGENTCTL_IDENTITY="operator@example.com",
        )
        assert edited.code == 0, edited.err
        assert "as bob@example.com (verified)" in edited.out
        assert "turn 1 ended: stop" in edited.out and DEPLOYED == ["staging"]
        shown = await agentctl(client, "show", chat.id, task_queue=tq)
        assert "alice@example.com (verified)" in shown.out
        outputs += [r.out + r.err for r in (no_file, blank, bare, approved, spent, edited, shown)]

    # No worker: the trail says who answered, proven by a token.
    run = await agentctl(client, "audit", chat.id, "--json", task_queue=tq)
    assert run.code == 0, run.err
    trail = [AnswerRecord.model_validate(a) for a in run.json()["answers"]]
    assert [(r.ref, r.kind, r.decision, r.identity, r.identity_verified) for r in trail] == [
        ("v1", "respond", "approved", "alice@example.com", True),
        ("d1", "edit", "edited", "bob@example.com", True),
    ]
    assert (trail[1].input, trail[1].original_input) == (
        {"target": "staging"},
        {"target": "production"},
    )
    table = await agentctl(client, "audit", chat.id, task_queue=tq)
    assert "bob@example.com (verified)" in table.out
    outputs += [run.out, table.out]
    # The tokens are never printed (they are in the conversation's history, spent).
    for token in (alice, bob):
        assert not any(token in o or token.split(".")[2] in o for o in outputs)


async def test_agentctl_chat_reads_the_token_file_for_each_answer(
    run_worker, model, client, tmp_path
):
    """A token answers once per conversation, so the interactive chat reads the file again for
    every answer: whatever keeps it fresh (an identity provider's agent) is picked up."""
    issuer = TokenIssuer("ES256")
    verifying = Agent(
        f"verifying-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.approve],
        trust=issuer.trust(),
    )
    alice, bob = issuer.mint("alice@example.com"), issuer.mint("bob@example.com")
    model.reply(
        calls(("approve", {"question": "first?"}, "p1")),
        text("first done"),
        calls(("approve", {"question": "second?"}, "p2")),
        text("second done"),
    )
    tq = f"tokens-{uuid.uuid4()}"
    chat_id = f"{verifying.name}-pty"
    token_file = write_token(tmp_path / "token.jwt", alice)

    def drive() -> tuple[int | None, str]:
        child, transcript = agentctl_in_a_terminal(
            agentctl_env(client, tq),
            "chat",
            verifying.name,
            "--id",
            chat_id,
            "--identity-token-file",
            str(token_file),
        )
        try:
            for message, done, next_token in (("one", "first done", bob), ("two", "second", None)):
                child.expect("you>")
                child.sendline(message)
                child.expect("paused on")
                child.expect(r"\[a/d/r/s/c\]")
                child.sendline("a")
                child.expect(done)
                if next_token is not None:
                    write_token(token_file, next_token)  # as a refresher would
            child.expect("you>")
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            child.close()
        return child.exitstatus, transcript.getvalue()

    async with run_worker(agents=[verifying], task_queue=tq) as agents:
        # pexpect blocks: drive it from a thread so this loop keeps serving the worker.
        code, transcript = await asyncio.to_thread(drive)
        trail = await agents.audit(chat_id)
    assert code == 0, transcript
    assert [(r.ref, r.identity, r.identity_verified) for r in trail] == [
        ("p1", "alice@example.com", True),
        ("p2", "bob@example.com", True),
    ]
    assert alice not in transcript and bob not in transcript


def test_agentctl_refuses_a_token_file_it_cannot_read(tmp_path):
    """Checked before connecting: an unreadable or non-text file is a usage error that names
    the file and never shows what is in it."""
    binary = tmp_path / "binary.jwt"
    binary.write_bytes(b"eyJ.secret\xff\xfe")
    beside = write_token(tmp_path / "plain.jwt", "eyJ.secret.value")
    unreadable = beside / "token"  # a path through a file: unreadable even for root
    env = {k: v for k, v in os.environ.items() if k != "AGENTCTL_IDENTITY_TOKEN_FILE"}
    for path, why in ((binary, "is not UTF-8 text"), (unreadable, "cannot be read: Not a dir")):
        done = subprocess.run(
            [str(AGENTCTL), "deny", "c", "r", "--identity-token-file", str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and why in done.stderr, done
        assert f"the identity token file {str(path)!r}" in done.stderr
        assert "eyJ" not in done.stderr and "secret" not in done.stderr


# ----------------------------------------------------------------------------------------------
# Pure parts


def record(at: int, ref: str, **kw: object) -> AnswerRecord:
    when = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=at)
    return AnswerRecord.model_validate(
        {"at": when, "ref": ref, "name": "approve", "kind": "respond", "via": "update", **kw}
    )


def test_merge_counts_each_answer_once_and_orders_them_by_time():
    batches = [record(2, "b", identity="x"), record(2, "a", identity="x"), record(5, "c")]
    # What a run carried into the next, whose predecessor is gone: the same records, and one
    # only it still has.
    carried = [record(1, "old"), record(2, "a", identity="x", output={"a": 1})]
    trail = merge(batches, carried)
    assert [r.ref for r in trail] == ["old", "b", "a", "c"]
    assert trail[2].output is None  # the first source that has a record wins
    # Two answers to one ref by different people (a quorum's votes) are two records.
    votes = merge([record(3, "q", identity="x", kind="vote"), record(3, "q", identity="y")])
    assert len(votes) == 2


def test_a_chain_whose_predecessor_was_deleted_within_retention_is_not_trusted():
    """A run's predecessor gone past retention starts the chain; one gone while it should
    still be kept (the run began after retention's start) was deleted: what it handed on
    cannot be checked, so neither that run nor what follows it is trusted."""
    kept = [trail("b", 10, previous="a"), trail("c", 20, previous="b")]
    runs = {r.run_id: r for r in kept}
    began = kept[0].started
    assert judge(runs, {"a"}, task_queue="agents", retained_since=began + timedelta(days=1)) == {}
    early = judge(runs, {"a"}, task_queue="agents", retained_since=began - timedelta(days=1))
    assert early["b"].startswith("it continued from run a, whose history was deleted")
    assert early["c"] == "it continued from run b, which is not trusted"

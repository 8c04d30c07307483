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
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pexpect
import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

import client.api as client_api
from activities import Interrupt, ToolContext, tool
from client import AgentClient, AnswerRecord, Chat, FinishReason, NoWorkerAnswered
from client.audit import merge, patch_id, read_run
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually
from tests.test_operator import AGENTCTL, Run, agentctl, agentctl_env, agentctl_in_a_terminal
from worker import build_worker
from worker.standin import calls, text
from worker.testing import TokenIssuer, dev_server
from workflows import Agent, TrustedIssuer, compat
from workflows.compat import GOVERNANCE_PATCH

SUGGEST_AFTER_EVENTS = 40
NOTE = "n" * 4000
"""A note that keeps each answer's record just under the 4 KiB it is kept whole up to, so a few
dozen answers pass the state's 128 KiB budget for them."""


@pytest.fixture(scope="module")
async def small_histories() -> AsyncIterator[WorkflowEnvironment]:
    suggest = f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER_EVENTS}"
    async with dev_server(extra_args=["--dynamic-config-value", suggest]) as env:
        yield env


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
    trail = await agents.audit(chat.id, worker_timeout=timedelta(seconds=1))
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


class _BeforeGovernance:
    """``temporalio.workflow`` as ``workflows.compat`` sees it on a worker of the release before
    approval governance: that patch is unknown, so runs begin under the rules before it."""

    def __getattr__(self, name: str) -> object:
        return getattr(workflow, name)

    @staticmethod
    def patched(patch_id: str) -> bool:
        return patch_id != GOVERNANCE_PATCH and workflow.patched(patch_id)


async def test_the_trail_of_a_conversation_begun_before_the_release(
    small_histories, model, monkeypatch
):
    """Runs begun before answers were written to the memo: their answers come from what each
    run carried into the next and, while the newest run is one of them, from its state (read by
    a worker). After an upgrade, the next run keeps the trail in history."""
    client = small_histories.client
    tq = f"upgrade-{uuid.uuid4()}"
    width = 4
    expected: list[Seen] = []

    async def answer_turns(chat: Chat, names: range, who: str) -> None:
        for n in names:
            model.reply(
                calls(*(("approve", {"question": f"{n}.{k}"}, f"u{n}.{k}") for k in range(width))),
                text(f"done {n}"),
            )
            asks = (await chat.send(f"turn {n}")).interrupts
            answers = [i.respond({"approved": True, "note": NOTE}) for i in asks]
            done = await chat.resume(answers=answers, identity=f"{who}{n}@example.com")
            assert done.text == f"done {n}"
            expected.extend(
                (i.ref, "respond", "approved", f"{who}{n}@example.com", "update") for i in asks
            )

    with monkeypatch.context() as previous:
        previous.setattr(compat, "workflow", _BeforeGovernance())
        # And a client of that release, which declared no rules in the start input.
        previous.setattr(client_api, "GOVERNANCE_PATCH", None)
        async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
            agents = AgentClient(client, task_queue=tq)
            chat = await agents.chat("auditing")
            await answer_turns(chat, range(6), "old")
            await chat.status()  # the newest run has been taken up (a query waits for that)
            old_runs = await eventually(lambda: runs_of(client, chat.id), lambda r: len(r) >= 2)
    for run_id in old_runs:
        begun_before = await read_run(client, chat.id, run_id)
        assert begun_before is not None and begun_before.begun and not begun_before.governed
        assert begun_before.batches == []
    # The newest run's answers are in its state only: a worker must read them.
    with pytest.raises(NoWorkerAnswered, match="began before answers were kept in its history"):
        await agents.audit(chat.id, worker_timeout=timedelta(seconds=1))
    failed = await agentctl(client, "audit", chat.id, "--wait", "1", task_queue=tq)
    assert failed.code == 3 and "no worker answered within 1s" in failed.err

    async with build_worker(client, agents=[auditing], task_queue=tq, gemini=model.client()):
        assert seen(await agents.audit(chat.id)) == expected
        # This release's worker: the next run begun keeps the trail in history.
        first_new = len(expected)
        await answer_turns(chat, range(6, 12), "new")
        await chat.status()  # the newest run has been taken up (a query waits for that)
        latest = (await client.get_workflow_handle(chat.id).describe()).run_id
        runs = await eventually(lambda: runs_of(client, chat.id), lambda r: latest in r)
    newest = await read_run(client, chat.id, latest)
    assert newest is not None and newest.governed and latest not in old_runs
    assert len(runs) > len(old_runs)
    trail = await agents.audit(chat.id, worker_timeout=timedelta(seconds=1))  # no worker
    assert seen(trail) == expected
    assert len(expected) - first_new == 6 * width
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
    assert await agents.audit(chat.id, worker_timeout=timedelta(seconds=1)) == []
    empty = await agentctl(client, "audit", chat.id, task_queue=tq)
    assert empty.code == 0 and f"No answers on record for {chat.id}." in empty.out
    await client.get_workflow_handle(chat.id).terminate("test over")

    missing = f"no-such-chat-{uuid.uuid4()}"
    run = await agentctl(client, "audit", missing, task_queue=tq)
    assert run.code == 2 and f"no conversation with id {missing!r}" in run.err


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
    # What a run carried into the next, and what the state holds: the same records, and one
    # from before the memo kept them.
    carried = [record(1, "old"), record(2, "a", identity="x", output={"a": 1})]
    trail = merge(batches, carried)
    assert [r.ref for r in trail] == ["old", "b", "a", "c"]
    assert trail[2].output is None  # the first source that has a record wins
    # Two answers to one ref by different people (a quorum's votes) are two records.
    votes = merge([record(3, "q", identity="x", kind="vote"), record(3, "q", identity="y")])
    assert len(votes) == 2


def test_the_governance_marker_is_recognised():
    def marker(data: bytes) -> dict[str, Payloads]:
        return {"patch-data": Payloads(payloads=[Payload(data=data)])}

    body = json.dumps({"id": GOVERNANCE_PATCH, "deprecated": False}).encode()
    assert patch_id(marker(body)) == GOVERNANCE_PATCH
    assert patch_id(marker(b"not json")) is None
    assert patch_id({}) is None

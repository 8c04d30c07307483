"""A second pass of attacks on grants and policy reviews, as someone holding the namespace's
credentials would try them, each against a real dev server. Every attempt held; each test
asserts what held.

- A flood of ``review_policy`` updates on a paused chat (one under way at a time, the rest
  refused by the validator) fails no workflow task and does not hold off continue-as-new; the
  pause still answers. ``revoke_grant`` of ids never made is refused and leaves no history.
- The policy activity, started standalone, decides nothing; completed by id with a forged
  result that allows everything, it is refused as unsealed and the calls are denied (at the
  message) or stay paused (at a review).
- 32 grants of 8 conditions with values of the largest size: the grants query, the details
  panel and continue-as-new all take them; no task fails.
- ``remember`` with a denial in the same resume: the denial stands. A quorum tool's grant whose
  last vote comes by signal names both approvers and lets the next matching call through.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from temporalio.client import ActivityFailureError, Client
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts import AgentClient, FinishReason, approve
from temporal_agent_interrupts.activities.runtime import AgentActivities
from temporal_agent_interrupts.errors import GrantRejected
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.activity_io import PolicyCall, PolicyInput, PolicyResult
from temporal_agent_interrupts.workflows.config import POLICY_ACTIVITY
from temporal_agent_interrupts.workflows.types import GrantCondition, GrantScope, PolicyDecision
from tests.helpers import assert_no_workflow_task_failed, cli_signal, eventually
from tests.test_grants import (
    CFO,
    PAYMENTS_POLICY,
    UNDER_100,
    _governed,
    _pay,
    payer,
    payments,
    two_keys,
)
from tests.test_sealed_results import _activity_rejections, _forge, _scheduled

CONTROLLER = "controller@example.com"


@pytest.fixture(autouse=True)
def _paid() -> None:
    payments.clear()


async def _length(client: Client, chat_id: str) -> int:
    described = await client.get_workflow_handle(chat_id).describe()
    return described.raw_description.workflow_execution_info.history_length


async def _runs(client: Client, chat_id: str) -> int:
    return len([w async for w in client.list_workflows(f"WorkflowId='{chat_id}'")])


# ----------------------------------------------------------------------------------------------
# Held: a flood of reviews and of unknown revokes.


async def test_a_flood_of_reviews_neither_fails_a_task_nor_holds_off_continue_as_new(
    small_histories, model
):
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(calls(_pay(500, "m1")), text("done"))
    async with build_worker(
        client, agents=[_governed(PAYMENTS_POLICY)], task_queue=queue, gemini=model.client()
    ):
        chat = await AgentClient(client, task_queue=queue).chat("ruled")
        (m1,) = (await chat.send("pay 500")).interrupts
        # Ids never made are refused by the validator: nothing is written.
        before = await _length(client, chat.id)
        for n in range(20):
            with pytest.raises(GrantRejected):
                await chat.revoke_grant(f"grant-{n + 1}")
        assert await _length(client, chat.id) == before
        reviewed, refused = 0, set[str]()
        stop = asyncio.Event()

        async def review() -> None:
            nonlocal reviewed
            while not stop.is_set():
                try:
                    await chat.review_policy()
                    reviewed += 1
                except Exception as e:  # noqa: BLE001
                    refused.add(str(e))

        flood = [asyncio.create_task(review()) for _ in range(3)]
        await asyncio.sleep(1)
        stop.set()
        await asyncio.gather(*flood)
        assert reviewed > 10
        assert all("already under way" in r for r in refused), refused
        # Each review is eleven events or so: the run moved on, many times.
        assert await _runs(client, chat.id) >= 2
        assert [i.ref for i in await chat.pending()] == ["m1"]
        done = await chat.resume(answers=[approve(m1)], identity=CONTROLLER)
        assert done.finish_reason == FinishReason.STOP and payments == [(500, None)]
        await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Held: the policy activity, started standalone or completed by id with a forged result.


async def test_a_standalone_policy_activity_decides_nothing(run_worker, client):
    agent = _governed(PAYMENTS_POLICY)
    async with run_worker(agents=[agent]) as agents:
        asked = PolicyInput(
            chat_id="any-chat",
            agent="ruled",
            calls=[PolicyCall(ref="r1", tool="pay", input={"amount": 50_000, "payee": "x"})],
        )
        handle = await client.start_activity(
            POLICY_ACTIVITY,
            asked,
            id=f"standalone-{uuid.uuid4()}",
            task_queue=agents.task_queue,
            start_to_close_timeout=timedelta(seconds=30),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "NotScheduledByConversation"


async def test_a_forged_policy_result_allowing_everything_is_refused_and_denies(
    run_worker, model, client, monkeypatch
):
    """The policy activity is held on the worker while a forger completes it by id with a
    result that allows every call: at the message, both calls (one the set forbids, one it
    asks about) are denied as undecided; at a review, the review is refused and the call
    stays paused. Nothing is paid."""
    hold = asyncio.Event()
    hold.set()
    real = AgentActivities._policy_decide

    async def held(self: AgentActivities, input: PolicyInput) -> PolicyResult:
        await hold.wait()
        return await real(self, input)

    monkeypatch.setattr(AgentActivities, "_policy_decide", held)
    agent = _governed(PAYMENTS_POLICY)
    digest = agent.spec().policy_hash
    assert digest is not None
    allow = PolicyDecision(effect="allow", policy_hash=digest)
    model.reply(calls(_pay(50_000, "l1"), _pay(500, "m0")), text("done"))
    model.reply(calls(_pay(500, "m1")), text("asked"))

    async def forge_nth(nth: int, result: PolicyResult) -> None:
        found = await eventually(
            lambda: _scheduled(client, chat.id, POLICY_ACTIVITY, nth=nth), lambda f: f is not None
        )
        assert found is not None
        await asyncio.sleep(0.2)  # the worker holds the task
        await _forge(client, chat.id, found, result)
        hold.set()

    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat("ruled")
        hold.clear()
        sent = asyncio.create_task(chat.send("pay two"))
        await forge_nth(1, PolicyResult(decisions={"l1": allow, "m0": allow}, policy_hash=digest))
        first = await sent
        assert first.finish_reason == FinishReason.STOP and first.interrupts == []
        hist = await chat.history()
        assert {(a.ref, a.decision) for a in hist.answers} == {
            ("l1", "denied"),
            ("m0", "denied"),
        }
        assert all("no seal" in (a.metadata or {})["reason"] for a in hist.answers)
        (m1,) = (await chat.send("pay 500")).interrupts
        hold.clear()
        review = asyncio.create_task(chat.review_policy())
        await forge_nth(3, PolicyResult(decisions={"m1": allow}, policy_hash="f" * 64))
        with pytest.raises(Exception, match="no seal"):
            await review
        assert [i.ref for i in await chat.pending()] == [m1.ref]
        refused = await _activity_rejections(client, chat.id)
        assert len(refused) == 2 and all("no seal" in r for r in refused), refused
        assert payments == []
        await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Held: the most grants, each as large as it may be.


def _largest(n: int) -> GrantScope:
    # 256 stored bytes a value: a control character takes six as JSON, an emoji four in UTF-8.
    values = ["\x01" * 42 + f"{n:04d}", "\U0001f600" * 63 + f"{n:04d}"]
    return GrantScope(
        match=[GrantCondition(field="payee", op="prefix", value=values[k % 2]) for k in range(8)]
    )


async def test_thirty_two_grants_of_the_largest_size_fit_everywhere(small_histories, model):
    client = small_histories.client
    queue = f"tq-{uuid.uuid4()}"
    model.reply(
        calls(*[("pay", {"amount": n, "payee": "p"}, f"p{n}") for n in range(32)]), text("done")
    )
    model.reply(calls(("pay", {"amount": 1, "payee": "q"}, "x1")), text("asked"))
    async with build_worker(client, agents=[payer], task_queue=queue, gemini=model.client()):
        chat = await AgentClient(client, task_queue=queue).chat("payer")
        paused = (await chat.send("pay")).interrupts
        assert len(paused) == 32
        done = await chat.resume(
            answers=[approve(p, remember=_largest(n)) for n, p in enumerate(paused)], identity=CFO
        )
        assert done.finish_reason == FinishReason.STOP and len(payments) == 32
        made = await chat.grants()
        assert len(made) == 32
        metadata = await client.get_workflow_handle(chat.id).query("__temporal_workflow_metadata")
        assert len(metadata.current_details.encode()) < 8 * 1024
        # One more turn: the run continues as new with all of them, and they still hold.
        (x1,) = (await chat.send("pay again")).interrupts
        assert x1.ref == "x1"
        await eventually(lambda: _runs(client, chat.id), lambda n: n >= 2)
        assert [g.id for g in await chat.grants()] == [g.id for g in made]
        assert len(await chat.revoke_grant(made[0].id)) == 31
        await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Held: remember together with other answers, and a quorum's last vote by signal.


@pytest.mark.parametrize("deny_first", [False, True], ids=["deny-last", "deny-first"])
async def test_a_grant_made_in_a_resume_does_not_override_a_denial_in_it(
    run_worker, model, client, deny_first
):
    model.reply(calls(_pay(80, "p1"), _pay(90, "p2"), _pay(70, "p3")), text("done"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        p1, p2, p3 = (await chat.send("pay three")).interrupts
        answers = [approve(p1, remember=UNDER_100), p2.deny("no")]
        if deny_first:
            answers.reverse()
        done = await chat.resume(answers=answers, identity=CFO)
        assert done.finish_reason == FinishReason.STOP
        (grant,) = await chat.grants()
        assert sorted(payments, key=lambda p: p[0]) == [(70, grant.id), (80, None)]
        hist = await chat.history()
        decided = {a.ref: (a.kind, a.decision) for a in hist.answers}
        assert decided == {
            p1.ref: ("restart", "approved"),
            p2.ref: ("respond", "denied"),
            p3.ref: ("granted", "approved"),
        }
        await assert_no_workflow_task_failed(client, chat.id)


async def test_a_quorum_grant_whose_last_vote_is_a_signal_names_both(run_worker, model, client):
    model.reply(calls(_pay(80, "p1")), text("done"))
    model.reply(calls(_pay(50, "p2")), text("paid"))
    async with run_worker(agents=[two_keys]) as agents:
        chat = await agents.chat("twoKeys")
        (p1,) = (await chat.send("pay 80")).interrupts
        await chat.resume(answers=[approve(p1, remember=UNDER_100)], identity="alice@example.com")
        entry = {
            "name": "pay",
            "ref": "p1",
            "resumed_metadata": {"tool_approved": True},
            "input_digest": p1.input_digest,
            "remember": UNDER_100.model_dump(mode="json"),
        }
        payload = json.dumps({"restart": [entry], "identity": "bob@example.com"})
        rc, out = await cli_signal(client, chat.id, "resume", payload)
        assert rc == 0, out
        await eventually(chat.last_turn, lambda t: t is not None and t.text == "done")
        (grant,) = await chat.grants()
        assert grant.granted_by == ["alice@example.com", "bob@example.com"]
        second = await chat.send("pay 50")
        assert second.finish_reason == FinishReason.STOP and second.interrupts == []
        assert payments == [(80, None), (50, grant.id)]
        await assert_no_workflow_task_failed(client, chat.id)

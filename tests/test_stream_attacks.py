"""The stream's follower doors under attack, against a real dev server: raw polls and places
queries with hostile payloads, bursts of polls that try to take every update slot, and the shared
poll of one process under joins, leaves, slow readers and dropped polls.

The attacker holds the namespace's credentials: it sends any update or query, with any payload,
straight to the server (no SDK retries, no product client). Counts and outcomes, never timings.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import Payload, Payloads, WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update import v1 as update_v1
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionRequest
from temporalio.client import Client, RPCError, RPCStatusCode

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.worker.result_keys import ResultKeys
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.stream import MAX_FOLLOWERS, PLACES_QUERY, POLL_UPDATE
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed

Stage = UpdateWorkflowExecutionLifecycleStage
ACCEPTED = Stage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED
HANG = 60.0
"""A bound on what should end (so a test fails instead of hanging); not a timing."""


def gated_agent() -> Agent:
    return Agent(
        f"streamed-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[])],
    )


def json_payload(body: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=body)


def poll_args(from_offset: int, topics: Sequence[str] = ()) -> Payloads:
    body = json.dumps({"topics": list(topics), "from_offset": from_offset}).encode()
    return Payloads(payloads=[json_payload(body)])


async def raw_update(
    client: Client,
    chat_id: str,
    name: str,
    args: Payloads,
    *,
    stage: Any = ACCEPTED,
    update_id: str | None = None,
) -> update_v1.Outcome | str:
    """An update sent as a client without retries sends it: its outcome once the stage is
    reached (an empty outcome: accepted, not completed), or the server's refusal by name."""
    request = UpdateWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_execution=WorkflowExecution(workflow_id=chat_id),
        request=update_v1.Request(
            meta=update_v1.Meta(update_id=update_id or f"raw-{uuid.uuid4()}", identity="x"),
            input=update_v1.Input(name=name, args=args),
        ),
        wait_policy=update_v1.WaitPolicy(lifecycle_stage=stage),
    )
    try:
        response = await client.workflow_service.update_workflow_execution(
            request, retry=False, timeout=timedelta(seconds=HANG)
        )
    except RPCError as e:
        return RPCStatusCode(e.status).name
    return response.outcome


def stage(outcome: update_v1.Outcome | str) -> str:
    """What became of an update: accepted (it waits), rejected, completed, or the server's
    refusal by name."""
    if isinstance(outcome, str):
        return outcome
    if outcome.HasField("failure"):
        return "rejected"
    return "completed" if outcome.HasField("success") else "accepted"


async def paused_chat(agents: Any, agent: Agent) -> tuple[Chat, Any]:
    chat = await agents.chat(agent.name)
    paused = await chat.send("pay")
    assert paused.finish_reason == FinishReason.INTERRUPTED, paused
    [pending] = paused.interrupts
    return chat, pending


async def test_a_burst_of_polls_in_one_task_takes_no_more_than_the_places(
    run_worker, model, client
):
    """Ten polls from the stream's end, admitted while no worker runs, all reach the worker in
    one workflow task: the conversation takes at most MAX_FOLLOWERS of them (the rest are
    refused), so Temporal's ten in-flight slots are not all held by polls that wait for the
    next event of a paused chat, and the answer gets in by update."""
    agent = gated_agent()
    model.reply(calls(("lookup", {"key": "k"}, "c1")), text("done"))
    keys = ResultKeys(keys=(("test", secrets.token_bytes(32)),))
    queue = f"test-{uuid.uuid4()}"
    async with run_worker(agents=[agent], task_queue=queue, result_keys=keys) as agents:
        chat, pending = await paused_chat(agents, agent)
        end = await next_offset(chat)
    # Sent while no worker runs: the server admits them all and waits, so the worker that
    # starts next gets them in one workflow task.
    verdicts = [
        asyncio.ensure_future(raw_update(client, chat.id, POLL_UPDATE, poll_args(end)))
        for _ in range(10)
    ]
    await asyncio.sleep(2)  # not an assertion: lets the server admit them before a worker runs
    async with run_worker(agents=[agent], task_queue=queue, result_keys=keys) as agents:
        stages = [stage(v) for v in await asyncio.wait_for(asyncio.gather(*verdicts), HANG)]
        assert stages.count("accepted") <= MAX_FOLLOWERS, stages
        chat = await agents.chat(agent.name, chat_id=chat.id)
        result = await asyncio.wait_for(
            chat.resume(answers=[pending.approve()], identity="approver@example.com"), HANG
        )
    assert result.finish_reason == FinishReason.STOP, result
    assert t.RUNS["lookup"] == 1, t.RUNS
    await assert_no_workflow_task_failed(client, chat.id)


def _nested(depth: int) -> bytes:
    return b'{"topics": ' + b"[" * depth + b"]" * depth + b', "from_offset": 0}'


HOSTILE_POLLS: dict[str, list[Payload]] = {
    "wrong types": [json_payload(b'{"topics": "events", "from_offset": "x"}')],
    "null topics": [json_payload(b'{"topics": null, "from_offset": 0}')],
    "a list of numbers": [json_payload(b'{"topics": [1, {"a": 2}], "from_offset": 0}')],
    "negative offset": [json_payload(b'{"topics": [], "from_offset": -5}')],
    "a huge offset": [json_payload(b'{"topics": [], "from_offset": ' + b"9" * 4000 + b"}")],
    "infinity": [json_payload(b'{"topics": [], "from_offset": 1e400}')],
    "NaN": [json_payload(b'{"topics": [], "from_offset": NaN}')],
    "an extra key": [json_payload(b'{"topics": [], "from_offset": 99999, "x": 1}')],
    "an extra argument": [
        json_payload(b'{"topics": [], "from_offset": 99999}'),
        json_payload(b'{"topics": [], "from_offset": 0}'),
    ],
    "no argument": [],
    "a lone surrogate": [json_payload(b'{"topics": ["\\ud800"], "from_offset": 99999}')],
    "deep nesting": [json_payload(_nested(100_000))],
    "not JSON": [json_payload(b"\xff\xfe{{{")],
    "binary": [Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00" * 64)],
    "an unknown encoding": [Payload(metadata={"encoding": b"made/up"}, data=b"{}")],
    "encrypted-looking": [
        Payload(metadata={"encoding": b"binary/encrypted", "encryption-key-id": b"k"}, data=b"x")
    ],
    "1.5 MB of topics": [
        json_payload(b'{"topics": ["' + b"a" * 1_500_000 + b'"], "from_offset": 99999}')
    ],
    "many topics": [
        json_payload(json.dumps({"topics": ["t"] * 150_000, "from_offset": 99999}).encode())
    ],
}


async def raw_query(client: Client, chat_id: str, name: str, args: list[Payload]) -> str:
    """A query sent raw: its answer as text, or the server's refusal by name."""
    from temporalio.api.query.v1 import WorkflowQuery
    from temporalio.api.workflowservice.v1 import QueryWorkflowRequest

    request = QueryWorkflowRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=chat_id),
        query=WorkflowQuery(query_type=name, query_args=Payloads(payloads=args)),
    )
    try:
        response = await client.workflow_service.query_workflow(
            request, retry=False, timeout=timedelta(seconds=HANG)
        )
    except RPCError as e:
        return f"{RPCStatusCode(e.status).name}: {e.message}"
    return str(response.query_result)


async def test_hostile_polls_and_queries_fail_no_task_lose_no_pause_and_leak_nothing(
    run_worker, model, client
):
    """Every malformed poll update and follower query a namespace holder can send to a paused
    chat is refused or answered harmlessly: no workflow task fails, no poll is left holding a
    place, the approval still lands (the tool runs once), and no answer holds another chat's
    words."""
    agent = gated_agent()
    secret = f"other-chat-secret-{uuid.uuid4().hex}"
    model.reply(calls(("lookup", {"key": "k"}, "c1")), text(secret), text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat, pending = await paused_chat(agents, agent)
        other = await agents.chat(agent.name)
        assert (await other.send(secret)).text == secret
        answers: dict[str, str] = {}
        for what, args in HOSTILE_POLLS.items():
            outcome = await raw_update(client, chat.id, POLL_UPDATE, Payloads(payloads=args))
            answers[f"update {what}"] = stage(outcome) + " " + str(outcome)[:300]
            for query in (POLL_UPDATE, PLACES_QUERY, "__temporal_workflow_stream_offset"):
                answers[f"{query} {what}"] = (await raw_query(client, chat.id, query, args))[:300]
        for what, answer in answers.items():
            assert secret not in answer, what
        # None of them waits: a place is free for each of the product's followers.
        assert not [w for w, a in answers.items() if a.startswith("accepted")], answers
        assert await chat.handle.query(PLACES_QUERY, result_type=int) == MAX_FOLLOWERS
        result = await asyncio.wait_for(
            chat.resume(answers=[pending.approve()], identity="approver@example.com"), HANG
        )
    assert result.finish_reason == FinishReason.STOP, result
    assert t.RUNS["lookup"] == 1, t.RUNS
    await assert_no_workflow_task_failed(client, chat.id)

"""The stream's follower doors under attack, against a real dev server: raw polls and places
queries with hostile payloads, bursts of polls that try to take every update slot, and the shared
poll of one process under joins, leaves, slow readers and dropped polls.

The attacker holds the namespace's credentials: it sends any update or query, with any payload,
straight to the server (no SDK retries, no product client). Counts and outcomes, never timings.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload, Payloads, WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update import v1 as update_v1
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionRequest
from temporalio.client import Client, RPCError, RPCStatusCode, WorkflowHandle
from temporalio.contrib.workflow_streams import PollInput, PollResult

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, interrupt
from temporal_agent_interrupts.client import stream as stream_module
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.errors import AgentError, ResumeRejected
from temporal_agent_interrupts.worker.result_keys import ResultKeys
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows.stream import MAX_FOLLOWERS, PLACES_QUERY, POLL_UPDATE
from temporal_agent_interrupts.workflows.types import TurnEvent
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually

Stage = UpdateWorkflowExecutionLifecycleStage
ACCEPTED = Stage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED
COMPLETED = Stage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_COMPLETED
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


class QueriesInFlight:
    """The follower queries (places and reads) this process has in flight, and the most at
    once: wraps the SDK's ``WorkflowHandle.query``."""

    def __init__(self, monkeypatch: Any) -> None:
        self.now = 0
        self.most = 0
        self.sent = 0
        query = WorkflowHandle.query

        async def counted(handle: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
            if name not in (POLL_UPDATE, PLACES_QUERY):
                return await query(handle, name, *args, **kwargs)
            self.sent += 1
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                return await query(handle, name, *args, **kwargs)
            finally:
                self.now -= 1

        monkeypatch.setattr(WorkflowHandle, "query", counted)


async def hold_places(client: Client, chat: Chat, stop: asyncio.Event) -> int:
    """A namespace holder's polls at the stream's end, four at a time, sent again each time the
    next event frees them, until ``stop``: the conversation's follower places stay taken.
    Returns how many it sent."""
    sent = 0
    while not stop.is_set():
        try:
            end = await next_offset(chat, worker_timeout=timedelta(seconds=HANG))
        except AgentError:
            continue  # a busy conversation (a flood of its own): ask again
        polls = [
            asyncio.ensure_future(
                raw_update(client, chat.id, POLL_UPDATE, poll_args(end), stage=COMPLETED)
            )
            for _ in range(MAX_FOLLOWERS)
        ]
        sent += len(polls)
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([*polls, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        for poll in polls:
            poll.cancel()
    return sent


async def follow_to_end(chat: Chat, start: int) -> list[TurnEvent]:
    """The chat's events from ``start`` until a turn ends other than paused."""
    seen = []
    async for event in chat.events(after=start - 1):
        seen.append(event)
        if event.result is not None and event.result.finish_reason != FinishReason.INTERRUPTED:
            return seen
    return seen


async def test_followers_of_a_crowded_process_share_one_query_at_a_time(
    run_worker, model, client, monkeypatch
):
    """A namespace holder keeps the conversation's four follower places taken; twenty followers
    of the chat in this process then read by query, and share it as they share the poll: one
    query in flight at a time from this process (places or read), not one per follower, and
    every follower still gets every event, in order, once."""
    agent = gated_agent()
    model.reply(calls(("lookup", {"key": "k"}, "c1"), say="Checking."), text("all done"))
    queries = QueriesInFlight(monkeypatch)
    stop = asyncio.Event()
    async with run_worker(agents=[agent]) as agents:
        chat, pending = await paused_chat(agents, agent)
        start = await next_offset(chat)
        holding = asyncio.create_task(hold_places(client, chat, stop))
        await eventually(lambda: chat.handle.query(PLACES_QUERY, result_type=int), lambda n: n == 0)
        queries.most = queries.sent = 0
        following = [asyncio.create_task(follow_to_end(chat, start)) for _ in range(20)]
        # All twenty following, and this process refused a place (it reads by query): the
        # module's own registry of followers says so (no public API tells).
        shared = stream_module._FOLLOWING  # the state under test, read only
        await eventually(
            lambda: asyncio.sleep(0, shared.get((id(client), chat.id))),
            lambda f: f is not None and f.users == 20 and f.crowded and queries.sent >= 2,
        )
        result = await asyncio.wait_for(
            chat.resume(answers=[pending.approve()], identity="approver@example.com"), HANG
        )
        seen = await asyncio.wait_for(asyncio.gather(*following), HANG)
        end = await next_offset(chat)
        stop.set()
        await holding
    assert result.finish_reason == FinishReason.STOP, result
    expected = list(range(start, end))
    for events in seen:
        assert [e.offset for e in events] == expected, [e.offset for e in events]
        assert events == seen[0]
    assert queries.most == 1, (queries.most, queries.sent)
    await assert_no_workflow_task_failed(client, chat.id)


@pytest.mark.parametrize("crowded", [False, True], ids=["polling", "places-held"])
async def test_followers_that_join_leave_and_lag_get_every_event_once_in_order(
    run_worker, model, client, crowded
):
    """The followers of one chat in this process share one poll (or, while a namespace holder
    keeps the places taken, one query read): the first (the poller) leaves mid-way, one joins
    late from the start, one joins late from where the chat is, one stops reading until more
    than the 64 events kept for the others have passed. Each gets every event from where it
    started, in order, once."""
    turns = 40
    agent = Agent(f"chatty-{uuid.uuid4().hex[:8]}", model="gemini-test")
    model.reply(*(text(f"reply {i} " + "words " * 20) for i in range(turns)))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")  # the chat exists: its stream's offsets start here
        start = await next_offset(chat)
        ended = 0
        lag = asyncio.Event()
        stop = asyncio.Event()
        holding = asyncio.create_task(hold_places(client, chat, stop)) if crowded else None
        if crowded:
            await eventually(
                lambda: chat.handle.query(PLACES_QUERY, result_type=int), lambda n: n == 0
            )

        async def read(
            after: int, *, until: int, leave_after: int | None = None, lagging: bool = False
        ) -> list[TurnEvent]:
            seen: list[TurnEvent] = []
            async for event in chat.events(after=after - 1):
                seen.append(event)
                if lagging and len(seen) == 1:
                    await lag.wait()
                if leave_after is not None and len(seen) == leave_after:
                    return seen
                if event.kind == "turn_end" and event.turn >= until:
                    return seen
            return seen

        first_turn = (await chat.status()).turns + 1
        last = first_turn + turns - 2
        leaving = asyncio.create_task(read(start, until=last, leave_after=7))
        await asyncio.sleep(0)  # the first to follow: this process's poller
        steady = asyncio.create_task(read(start, until=last))
        slow = asyncio.create_task(read(start, until=last, lagging=True))
        late: list[asyncio.Task[list[TurnEvent]]] = []
        for i in range(turns - 1):
            await chat.send(f"message {i}")
            ended += 1
            if i == 3:
                late.append(asyncio.create_task(read(start, until=last)))
                late.append(asyncio.create_task(read(await next_offset(chat), until=last)))
        all_seen = await asyncio.wait_for(steady, HANG)
        assert len(all_seen) > 64 + 8, len(all_seen)  # the slow one fell past what is kept
        lag.set()
        slow_seen = await asyncio.wait_for(slow, HANG)
        left = await asyncio.wait_for(leaving, HANG)
        from_start, from_middle = await asyncio.wait_for(asyncio.gather(*late), HANG)
        stop.set()
        if holding is not None:
            await holding
    expected = list(range(start, start + len(all_seen)))
    assert [e.offset for e in all_seen] == expected
    assert all_seen[-1].kind == "turn_end" and all_seen[-1].turn == last
    assert slow_seen == all_seen
    assert from_start == all_seen
    assert left == all_seen[:7]
    assert from_middle and from_middle == all_seen[-len(from_middle) :]
    assert ended == turns - 1


class PollsSent:
    """The stream poll updates this process sends: wraps the SDK's ``start_update``."""

    def __init__(self, monkeypatch: Any) -> None:
        self.sent = 0
        start_update = WorkflowHandle.start_update

        async def counted(handle: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
            if update == POLL_UPDATE:
                self.sent += 1
            return await start_update(handle, update, *args, **kwargs)

        monkeypatch.setattr(WorkflowHandle, "start_update", counted)


async def test_a_follower_of_a_run_whose_history_is_long_reads_by_query_not_by_refused_polls(
    run_worker, model, client, monkeypatch
):
    """A namespace holder's polls from offset 0 take a run's history past the point where it
    takes no more polls while a long tool runs (each a 48 KiB result in history). A follower
    that attaches then does not ask by update again and again (each refused poll holds one of
    the ten update slots until the worker refuses it, and is a workflow task): it reads by
    query, and gets the turn's end once the run has continued as new."""
    say = "a long preamble. " * 6000  # about 100 KiB of the model's text in the stream's log
    model.reply(calls(("slow", {"key": "k", "seconds": 300}, "s1"), say=say), text("done"))
    async with run_worker(agents=[t.careful]) as agents:
        chat = await agents.chat("careful")
        sending = asyncio.create_task(chat.send("be slow"))
        await eventually(lambda: asyncio.sleep(0, t.RUNS["slow"]), lambda n: n == 1, timeout=15)
        outcome: update_v1.Outcome | str = ""
        for _ in range(1400):
            outcome = await raw_update(client, chat.id, POLL_UPDATE, poll_args(0), stage=COMPLETED)
            if stage(outcome) != "completed":
                break
        assert stage(outcome) == "rejected", outcome
        assert await chat.handle.query(PLACES_QUERY, result_type=int) == 0
        polls = PollsSent(monkeypatch)
        queries = QueriesInFlight(monkeypatch)
        end = await next_offset(chat)
        follower = asyncio.create_task(follow_to_end(chat, end))
        await eventually(
            lambda: asyncio.sleep(0, (polls.sent, queries.sent)),
            lambda counts: counts[0] >= 20 or counts[1] >= 4,
            timeout=HANG,
        )
        assert polls.sent <= 2, (polls.sent, queries.sent)
        cancelled = await asyncio.wait_for(chat.cancel("enough"), HANG)
        seen = await asyncio.wait_for(follower, HANG)
        sending.cancel()
    assert cancelled.finish_reason == FinishReason.CANCELLED
    assert seen[-1].kind == "turn_end", seen
    assert [e.offset for e in seen] == list(range(end, end + len(seen)))


async def flood(client: Client, chat_id: str, stop: asyncio.Event, seen: dict[str, int]) -> None:
    """Polls the conversation refuses (past the stream's end), one after another until
    ``stop``: each holds an update slot from the server's admission to the worker's refusal."""
    while not stop.is_set():
        outcome = await raw_update(client, chat_id, POLL_UPDATE, poll_args(10**9))
        key = stage(outcome)
        seen[key] = seen.get(key, 0) + 1


async def test_an_update_flood_with_the_places_held_cannot_stop_an_answer_by_signal(
    run_worker, model, client
):
    """A namespace holder keeps the four follower places taken and floods the chat with polls
    it refuses, from many connections at once, so that Temporal's ten in-flight updates are
    always taken: an answer by update may then be refused ``RESOURCE_EXHAUSTED`` (the SDK
    retries it; other clients fail), but the answer by signal (``resume``), which takes no
    update slot, is applied and the tool runs once."""
    agent = gated_agent()
    model.reply(calls(("lookup", {"key": "k"}, "c1")), text("done"))
    stop = asyncio.Event()
    seen: dict[str, int] = {}
    probes: dict[str, int] = {}
    async with run_worker(agents=[agent]) as agents:
        chat, pending = await paused_chat(agents, agent)
        holding = asyncio.create_task(hold_places(client, chat, stop))
        await eventually(lambda: chat.handle.query(PLACES_QUERY, result_type=int), lambda n: n == 0)
        flooding = [asyncio.create_task(flood(client, chat.id, stop, seen)) for _ in range(24)]
        await eventually(lambda: asyncio.sleep(0, sum(seen.values())), lambda n: n >= 100)
        # What a client that does not retry sees of an update while the flood goes on.
        for _ in range(20):
            key = stage(await raw_update(client, chat.id, POLL_UPDATE, poll_args(10**9)))
            probes[key] = probes.get(key, 0) + 1
        # Chat.resume meanwhile, for a call that is not pending: refused by the conversation
        # if it got a slot (ResumeRejected), by the server if not (not asserted: the race).
        stray = pending.model_copy(update={"ref": "not-pending"})
        try:
            await asyncio.wait_for(chat.resume(answers=[stray.approve()], identity="x"), HANG)
        except ResumeRejected:
            probes["resume reached the conversation"] = 1
        except AgentError as e:
            probes["resume refused: " + str(e)[:80]] = 1
        await chat.handle.signal(
            "resume",
            {
                "restart": [
                    {
                        "name": pending.name,
                        "ref": pending.ref,
                        "resumed_metadata": {"tool_approved": True},
                    }
                ],
                "identity": "approver@example.com",
            },
        )
        # An update of the product's own (Chat.last_turn) meanwhile: refused or not, as the
        # flood leaves it a slot (not asserted: it is the race the flood plays).
        try:
            await asyncio.wait_for(chat.last_turn(), HANG)
            probes["last_turn"] = 1
        except AgentError as e:
            probes["last_turn refused: " + str(e)[:80]] = 1
        await eventually(lambda: asyncio.sleep(0, t.RUNS["lookup"]), lambda n: n == 1, timeout=HANG)
        stop.set()
        await asyncio.gather(holding, *flooding)
    print("flood", seen, "probes", probes)
    assert t.RUNS["lookup"] == 1, t.RUNS
    await assert_no_workflow_task_failed(client, chat.id)


ISSUER = TokenIssuer("RS256")


async def test_a_follower_sees_no_identity_token_and_nothing_a_query_reader_does_not(
    run_worker, model, client
):
    """A follower by update attached while a verified answer (its identity token, and one
    refused token) goes in: no event it gets holds a token, and what it gets is exactly what the
    stream's poll query returns to anyone who may query the chat."""
    sign_off = interrupt(
        "signOff",
        "Ask treasury to sign off.",
        input=t.Ask,
        output=t.Answer,
        approvers=["group:treasury"],
    )
    agent = Agent(
        f"verified-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[sign_off],
        trust=ISSUER.trust(),
    )
    model.reply(text("hello"), calls(("signOff", {"question": "pay?"}, "v1")), text("done"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hi there")  # the chat exists; its stream starts
        start = await next_offset(chat)
        following = asyncio.create_task(follow_to_end(chat, start))
        paused = await chat.send("pay")
        [ask] = paused.interrupts
        refused = ISSUER.mint("bob@example.com", groups=["sales"])
        with pytest.raises(ResumeRejected):
            await chat.resume(answers=[ask.respond({"approved": True})], identity_token=refused)
        token = ISSUER.mint("alice@example.com", groups=["treasury"])
        done = await chat.resume(
            answers=[ask.respond({"approved": True})],
            identity_token=token,
            metadata={"ticket": "T-1"},
        )
        seen = await asyncio.wait_for(following, HANG)
        read = await chat.handle.query(
            POLL_UPDATE, PollInput(topics=[], from_offset=start), result_type=PollResult
        )
    assert done.finish_reason == FinishReason.STOP, done
    wire = json.dumps([e.model_dump(mode="json") for e in seen])
    for secret in (token, refused, token.split(".")[2], refused.split(".")[2]):
        assert secret not in wire
    assert [e.offset for e in seen] == [i.offset for i in read.items]
    converter = client.data_converter.payload_converter
    by_query = []
    for item in read.items:
        payload = Payload()
        payload.ParseFromString(base64.b64decode(item.data))
        event = converter.from_payload(payload, TurnEvent)
        by_query.append(event.model_copy(update={"offset": item.offset}))
    assert seen == by_query
    answers = [e for e in seen if e.kind == "answer"]
    assert answers and all(a.answer and a.answer.identity_verified for a in answers), answers


async def test_a_poller_whose_reader_stalls_hands_the_poll_to_the_others(
    run_worker, model, monkeypatch
):
    """The first follower of a chat in this process polls for the others; its own reader (a web
    client that stops reading its stream) takes one event and no more. The poller sends no poll
    while its event waits, so another follower takes the poll over and follows by update (not
    by a query every ``SHARED_WAIT``), and the stalled one, once it reads again, gets every
    event in order, once."""
    agent = Agent(f"stalled-{uuid.uuid4().hex[:8]}", model="gemini-test")
    model.reply(text("hello"), *(text(f"reply {i}") for i in range(3)))
    polls = PollsSent(monkeypatch)
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        start = await next_offset(chat)
        release = asyncio.Event()
        stalled_at: list[int] = []

        async def stalling() -> list[TurnEvent]:
            seen: list[TurnEvent] = []
            async for event in chat.events(after=start - 1):
                seen.append(event)
                if len(seen) == 1:
                    stalled_at.append(polls.sent)
                    await release.wait()
                if event.kind == "turn_end" and event.turn >= last:
                    return seen
            return seen

        last = (await chat.status()).turns + 3
        stalled = asyncio.create_task(stalling())
        await asyncio.sleep(0)  # the first to follow: this process's poller
        other = asyncio.create_task(follow_until(chat, start, last))
        for i in range(3):
            await chat.send(f"message {i}")
        seen = await asyncio.wait_for(other, HANG)
        polled_while_stalled = polls.sent - stalled_at[0]
        release.set()
        stalled_seen = await asyncio.wait_for(stalled, HANG)
    assert [e.offset for e in seen] == list(range(start, start + len(seen)))
    assert seen[-1].kind == "turn_end" and seen[-1].turn == last
    assert stalled_seen == seen
    assert polled_while_stalled >= 1, polls.sent


async def follow_until(chat: Chat, start: int, last: int) -> list[TurnEvent]:
    """The chat's events from ``start`` until turn ``last`` ends."""
    seen = []
    async for event in chat.events(after=start - 1):
        seen.append(event)
        if event.kind == "turn_end" and event.turn >= last:
            return seen
    return seen


async def test_following_from_an_offset_the_stream_has_not_reached_is_a_typed_refusal(
    run_worker, model, client
):
    """``Chat.events(after=...)`` past the stream's end (a hostile ``Last-Event-ID``): the
    conversation refuses the poll (it would hold a place for the whole run), and the caller
    gets the product's typed error saying so, not Temporal's raw update failure; nothing is
    held and no task fails."""
    agent = Agent(f"ahead-{uuid.uuid4().hex[:8]}", model="gemini-test")
    model.reply(text("hello"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        end = await next_offset(chat)
        with pytest.raises(AgentError, match="has not reached offset"):
            async for _ in chat.events(after=end + 10**9):
                pass
        assert await chat.handle.query(PLACES_QUERY, result_type=int) == MAX_FOLLOWERS
    await assert_no_workflow_task_failed(client, chat.id)

"""The inbox: every paused chat in the namespace, from visibility alone, and who may answer what.

``AgentClient.pending()`` and ``agentctl pending`` read the search attributes and the memo each
conversation keeps, so they are checked here with the worker stopped. Visibility is shared by
every test on the session's server and eventually consistent: agent names are unique to the
test, and what it lists is polled for.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from temporal_agent_interrupts import AgentClient, FinishReason, interrupt
from temporal_agent_interrupts.client import inbox as inbox_module
from temporal_agent_interrupts.client.inbox import (
    MAX_PENDING_MEMO,
    PausedChat,
    PausedInterrupt,
    for_approver,
    memo_interrupts,
    oldest_first,
    read_entries,
)
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import calls
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from temporal_agent_interrupts.workflows.config import (
    AGENT_NAME,
    AGENT_STATUS,
    INTERRUPTED_SINCE,
    PENDING_INTERRUPTS,
)
from temporal_agent_interrupts.workflows.operator_view import memo_shown
from tests import agents as t
from tests.helpers import eventually
from tests.test_operator import VISIBILITY_TIMEOUT, agentctl
from tests.web import served

ALICE = "alice@example.com"
BOB = "bob@example.com"
CAROL = "carol@example.com"
TREASURY = "group:treasury"


class Wire(BaseModel):
    to: str
    amount: float


wire_approval = interrupt(
    "wireApproval",
    "Ask two treasurers to approve a wire.",
    input=Wire,
    output=t.Answer,
    approvers=[ALICE, BOB],
    quorum=2,
    timeout=timedelta(hours=1),
    on_timeout={"approved": False, "note": "timed out"},
)

sign_off = interrupt(
    "signOff", "Ask the treasury group to sign off.", input=t.Ask, approvers=[TREASURY]
)


def treasury_agent() -> Agent:
    """Two interrupt-only tools: one needs two named approvers, the other anyone."""
    return Agent(
        f"inbox-treasury-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[wire_approval, t.approve],
    )


def ops_agent(issuer: TokenIssuer) -> Agent:
    """A group approver (which needs verified identity) and a gate with its own approver."""
    return Agent(
        f"inbox-ops-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[sign_off, t.lookup],
        middleware=[ToolApproval(allow=[], approvers=[CAROL])],
        trust=issuer.trust(),
    )


def only(chats: list[PausedChat], ids: list[str]) -> list[PausedChat]:
    """The chats of this test (others' paused chats share the namespace)."""
    return [c for c in chats if c.chat_id in ids]


def seen(chats: list[PausedChat]) -> list[tuple[str, list[str]]]:
    return [(c.chat_id, [i.ref for i in c.interrupts]) for c in chats]


async def test_the_inbox_lists_paused_chats_and_who_may_answer_them_without_a_worker(
    run_worker, model, client
):
    treasury, ops = treasury_agent(), ops_agent(TokenIssuer("ES256"))
    tq = f"inbox-{uuid.uuid4()}"
    model.reply(
        calls(("wireApproval", {"to": "acme", "amount": 900}, "w1")),
        calls(("approve", {"question": "order paper?"}, "q1")),
        calls(("signOff", {"question": "close the books?"}, "s1"), ("lookup", {"key": "k"}, "l1")),
    )
    async with run_worker(agents=[treasury, ops], task_queue=tq) as agents:
        a1 = await agents.chat(treasury.name, chat_id=f"{treasury.name}-a1")
        a2 = await agents.chat(treasury.name, chat_id=f"{treasury.name}-a2")
        b1 = await agents.chat(ops.name, chat_id=f"{ops.name}-b1")
        (wire,) = (await a1.send("wire 900 to acme")).interrupts
        (question,) = (await a2.send("order paper")).interrupts
        sign, gated = (await b1.send("close the books")).interrupts
        # One of the two approvals the wire needs: it stays pending, with Alice's vote.
        voted = await a1.resume(answers=[wire.approve()], identity=ALICE)
        assert voted.finish_reason == FinishReason.INTERRUPTED
        assert [v.identity for v in voted.interrupts[0].votes] == [ALICE]
        # `agentctl show` (which needs the worker) shows who may answer and the votes so far.
        shown = await agentctl(client, "show", a1.id, task_queue=tq)
        assert shown.code == 0, shown.err
        assert f"approvers  {ALICE}, {BOB}" in shown.out
        assert f"1 of 2 approvals: {ALICE} (asserted)" in shown.out
        decision = next(line for line in shown.out.splitlines() if " vote " in line)
        assert "wireApproval" in decision and f"{ALICE} (asserted)" in decision
    # No worker from here on.
    ids = [a1.id, a2.id, b1.id]
    inbox = AgentClient(client, task_queue=tq)  # the queue its workers poll, whose chats it lists

    def settled(chats: list[PausedChat]) -> bool:
        mine = only(chats, ids)
        listed = seen(mine) == [(a1.id, ["w1"]), (a2.id, ["q1"]), (b1.id, ["s1", "l1"])]
        return listed and mine[0].interrupts[0].votes == [ALICE]  # the vote's memo write too

    everything = await eventually(inbox.pending, settled, timeout=VISIBILITY_TIMEOUT)
    # Oldest waiting first, across the namespace.
    assert everything == oldest_first(everything)
    first, second, third = only(everything, ids)
    assert (first.agent, second.agent, third.agent) == (treasury.name, treasury.name, ops.name)
    assert first.waiting_since == wire.since and third.waiting_since == sign.since
    assert first.interrupts == [
        PausedInterrupt(
            name="wireApproval",
            ref="w1",
            input=wire.input,
            source="interrupt",
            since=wire.since,
            deadline=wire.deadline,
            approvers=[ALICE, BOB],
            quorum=2,
            votes=[ALICE],
            input_digest=wire.input_digest,
            shown=wire.shown
            and PausedInterrupt.model_validate(
                {"name": "x", "ref": "x", "shown": memo_shown(wire.shown)}
            ).shown,
        )
    ]
    assert wire.deadline is not None and wire.since is not None
    assert wire.deadline - wire.since == timedelta(hours=1)
    # Open to anyone: no approvers, no quorum, no deadline.
    assert second.interrupts == [
        PausedInterrupt(
            name="approve",
            ref="q1",
            input=question.input,
            source="interrupt",
            since=question.since,
            input_digest=question.input_digest,
            shown=question.shown
            and PausedInterrupt.model_validate(
                {"name": "x", "ref": "x", "shown": memo_shown(question.shown)}
            ).shown,
        )
    ]
    assert [(i.source, i.approvers) for i in third.interrupts] == [
        ("interrupt", [TREASURY]),
        ("approval", [CAROL]),
    ]
    assert third.interrupts[1].since == gated.since

    assert seen(await inbox.pending(agent=treasury.name)) == [(a1.id, ["w1"]), (a2.id, ["q1"])]
    # Alice voted on the wire already, and may not answer the group's or Carol's interrupts.
    assert seen(only(await inbox.pending(approver=ALICE), ids)) == [(a2.id, ["q1"])]
    assert seen(only(await inbox.pending(approver=BOB), ids)) == [
        (a1.id, ["w1"]),
        (a2.id, ["q1"]),
    ]
    assert seen(only(await inbox.pending(approver=CAROL), ids)) == [
        (a2.id, ["q1"]),
        (b1.id, ["l1"]),
    ]
    # A group is matched by its own name only: without a token there is no membership to read.
    assert seen(only(await inbox.pending(approver=TREASURY), ids)) == [
        (a2.id, ["q1"]),
        (b1.id, ["s1"]),
    ]
    assert seen(await inbox.pending(agent=ops.name, approver=ALICE)) == []
    for_bob = only(await inbox.pending(approver=BOB), ids)

    # agentctl agrees, from visibility alone, and keeps the first release's fields.
    run = await agentctl(client, "pending", "--approver", BOB, "--json", task_queue=tq)
    assert run.code == 0, run.err
    listed = [PausedChat.model_validate(c) for c in run.json()["conversations"]]
    assert only(listed, ids) == for_bob
    raw = next(c for c in run.json()["conversations"] if c["chat_id"] == a1.id)
    assert raw["agent"] == treasury.name and "waiting_since" in raw
    (item,) = raw["interrupts"]
    # The input is an object, as InterruptRequest.input is (it was JSON text until issue 26).
    assert (item["name"], item["ref"], item["input"]) == (
        "wireApproval",
        "w1",
        wire.input,
    )
    assert (item["approvers"], item["quorum"], item["votes"]) == ([ALICE, BOB], 2, [ALICE])

    table = await agentctl(
        client, "pending", "--agent", treasury.name, "--approver", BOB, task_queue=tq
    )
    assert table.code == 0, table.err
    assert f"Paused conversations for agent {treasury.name} that {BOB} may answer: 2" in table.out
    assert "MAY ANSWER" in table.out and "DEADLINE" in table.out
    wire_row = next(line for line in table.out.splitlines() if " w1 " in line)
    assert a1.id in wire_row and ALICE in wire_row and f"{wire.deadline:%H:%M:%S} UTC" in wire_row
    assert "(in 59m" in table.out
    question_row = next(line for line in table.out.splitlines() if " q1 " in line)
    assert "anyone" in question_row
    assert "1 of 2 approvals" in table.out
    nobody = await agentctl(
        client, "pending", "--agent", ops.name, "--approver", ALICE, task_queue=tq
    )
    assert nobody.code == 0 and "No paused conversations" in nobody.out


def test_memo_entries_are_read_and_filtered():
    """An entry with only name, ref and input may be answered by anyone; an entry some other
    program wrote (no name, not an object, its input text instead of an object) is left out,
    not fatal."""
    plain = {"name": "approve", "ref": "r0", "input": {"question": "q"}}
    governed = {
        "name": "wire",
        "ref": "r1",
        "input": {},
        "source": "approval",
        "since": "2030-01-01T00:00:00+00:00",
        "approvers": [ALICE, BOB],
        "quorum": 2,
        "votes": [BOB],
    }
    text = {"name": "approve", "ref": "r2", "input": '{"question": "q"}'}
    entries, left_out = read_entries([plain, governed, {"ref": "no name"}, "junk", text])
    assert left_out == 3
    assert [(i.ref, i.approvers, i.quorum, i.source) for i in entries] == [
        ("r0", [], 1, None),
        ("r1", [ALICE, BOB], 2, "approval"),
    ]
    assert [(i.input, i.input_cut) for i in entries] == [({"question": "q"}, False), ({}, False)]
    assert memo_interrupts(None) == [] and memo_interrupts({"name": "x"}) == []
    chats = [PausedChat(chat_id="c", interrupts=entries)]
    assert seen(for_approver(chats, ALICE)) == [("c", ["r0", "r1"])]
    assert seen(for_approver(chats, BOB)) == [("c", ["r0"])]  # Bob voted on r1
    assert seen(for_approver([PausedChat(chat_id="c", interrupts=entries[1:])], CAROL)) == []


# ----------------------------------------------------------------------------------------------
# Memos nobody should have to read


def raw(data: bytes, encoding: bytes = b"json/plain") -> Payload:
    """A memo value as its starter chose it, bytes and metadata: the SDK passes a ``Payload``
    through as it is."""
    return Payload(metadata={"encoding": encoding}, data=data)


async def start_paused_looking(
    client: Client,
    *,
    agent: str,
    pending: Payload | None,
    workflow: str = "AgentWorkflow",
    task_queue: str | None = None,
    since: datetime = datetime(2030, 1, 1, tzinfo=UTC),
) -> str:
    """A workflow whose search attributes say it is a chat paused on ``approve``, on
    ``task_queue`` (default: one nobody polls), with ``pending`` as its memo's pending calls:
    what anyone with the namespace's credentials can start. (On a queue this deployment's
    workers poll, with none running, its memo stays as written until a worker takes it.)"""
    chat_id = f"{agent}-poison-{uuid.uuid4().hex[:8]}"
    await client.start_workflow(
        workflow,
        {"agent": agent},
        id=chat_id,
        task_queue=task_queue or f"nobody-polls-{uuid.uuid4()}",
        memo={"pending": pending} if pending is not None else None,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(AGENT_NAME, agent),
                SearchAttributePair(AGENT_STATUS, "interrupted"),
                SearchAttributePair(PENDING_INTERRUPTS, ["approve"]),
                SearchAttributePair(INTERRUPTED_SINCE, since),
            ]
        ),
    )
    return chat_id


async def test_case6_a_memo_that_does_not_read_marks_its_chat_and_never_hides_the_others(
    run_worker, model, client
):
    agent = Agent(f"inbox-poison-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve])
    tq = f"inbox-{uuid.uuid4()}"
    model.reply(calls(("approve", {"question": "order paper?"}, "q1")))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        real = await agents.chat(agent.name)
        (asked,) = (await real.send("order paper")).interrupts
    good = {"name": "approve", "ref": "g1", "input": {}}
    deep = b"[" * 100_000 + b"]" * 100_000
    poisoned = {
        "encoding": await start_paused_looking(
            client, agent=agent.name, task_queue=tq, pending=raw(b"zz", b"binary/weird")
        ),
        "json": await start_paused_looking(
            client, agent=agent.name, task_queue=tq, pending=raw(b"{not json")
        ),
        "deep": await start_paused_looking(
            client, agent=agent.name, task_queue=tq, pending=raw(deep)
        ),
        "shape": await start_paused_looking(
            client,
            agent=agent.name,
            task_queue=tq,
            pending=raw(json.dumps({"name": "approve"}).encode()),
        ),
        # Entries that parse are listed; the others are counted.
        "entries": await start_paused_looking(
            client,
            agent=agent.name,
            task_queue=tq,
            pending=raw(json.dumps([good, {"ref": "no name"}, "junk", [[[]]]]).encode()),
        ),
    }
    # Another workflow type that says the same is not a conversation: not listed at all.
    other = await start_paused_looking(
        client, agent=agent.name, pending=raw(json.dumps([good]).encode()), workflow="Impostor"
    )
    ids = [real.id, *poisoned.values()]
    inbox = AgentClient(client, task_queue=tq)

    def listed(chats: list[PausedChat]) -> bool:
        return {c.chat_id for c in chats} >= set(ids)

    everything = await eventually(inbox.pending, listed, timeout=VISIBILITY_TIMEOUT)
    by_id = {c.chat_id: c for c in everything}
    assert other not in by_id
    # The real chat is intact, and its task queue is this client's.
    mine = by_id[real.id]
    assert mine.unreadable is None and mine.unreadable_entries == 0 and mine.task_queue == tq
    assert [(i.name, i.ref, i.since) for i in mine.interrupts] == [("approve", "q1", asked.since)]
    reasons = {
        "encoding": "its memo is in an encoding this client does not read",
        "json": "its memo is not valid JSON, or nests too deep to read",
        "deep": "its memo is not valid JSON, or nests too deep to read",
        "shape": "its memo's pending calls are not a list",
    }
    for kind, reason in reasons.items():
        chat = by_id[poisoned[kind]]
        assert chat.unreadable == reason, kind
        # Listed from its search attributes: the agent, since when, and the tool names.
        assert chat.agent == agent.name and chat.waiting_since == datetime(2030, 1, 1, tzinfo=UTC)
        assert [(i.name, i.ref) for i in chat.interrupts] == [("approve", "?")], kind
        assert chat.task_queue == tq
    partly = by_id[poisoned["entries"]]
    assert partly.unreadable is None and partly.unreadable_entries == 3
    assert [i.ref for i in partly.interrupts] == ["g1"]
    # An approver's inbox keeps what it cannot read, as a maybe.
    assert set(poisoned.values()) <= {c.chat_id for c in await inbox.pending(approver=ALICE)}

    # agentctl lists them all, and succeeds: for the namespace, and for the agent.
    run = await agentctl(client, "pending", "--json", task_queue=tq)
    assert run.code == 0, run.err
    shown = {c["chat_id"]: c for c in run.json()["conversations"]}
    assert set(ids) <= set(shown) and other not in shown
    assert shown[poisoned["encoding"]]["unreadable"] == reasons["encoding"]
    assert shown[poisoned["entries"]]["unreadable_entries"] == 3
    assert shown[real.id]["task_queue"] == tq
    table = await agentctl(client, "pending", "--agent", agent.name, task_queue=tq)
    assert table.code == 0, table.err
    assert f"Paused conversations for agent {agent.name}: {len(ids)}" in table.out
    # Each note on a line of its own, under the table, naming its chat.
    for kind, reason in reasons.items():
        assert f"  {poisoned[kind]}: unreadable: {reason}" in table.out.splitlines(), kind
    assert f"  {poisoned['entries']}: 3 entries could not be read" in table.out.splitlines()
    assert "not this client's" not in table.out  # its own queue's only, by default
    # The reasons never quote what the memo held.
    for quoted in ("binary/weird", "not json", "[[[", "junk", "no name"):
        assert quoted not in table.out and quoted not in run.out
    for chat_id in [real.id, *poisoned.values(), other]:
        await client.get_workflow_handle(chat_id).terminate("test over")


# ----------------------------------------------------------------------------------------------
# A flood of fakes (finding 4 of issue 44)


async def test_fakes_cannot_blind_the_inbox_oversized_memos_are_not_read_and_pages_are_bounded(
    client, monkeypatch
):
    """Whoever holds the namespace's credentials started paused-looking workflows with memos
    of ~1.5 MB: every listing read (and parsed, on the event loop) all of them, and their
    faked ``InterruptedSince`` sorted them first. Now: only the client's own task queue is
    listed by default; a ``pending`` memo larger than the product writes is listed
    ``unreadable`` from its search attributes, never parsed; a page holds at most ``limit``
    chats and its cursor leads through the rest once each; memos are parsed in a thread.
    The queue has no worker, so the fakes' memos stay as their starter wrote them."""
    agent = f"inbox-flood-{uuid.uuid4().hex[:8]}"
    tq = f"inbox-{uuid.uuid4()}"
    entry = {"name": "approve", "ref": "x", "input": {"blob": "y" * 900}}
    huge = json.dumps([{**entry, "ref": f"x{n}"} for n in range(900)]).encode()
    assert len(huge) > MAX_PENDING_MEMO  # past the most the product writes
    small = json.dumps([entry]).encode()
    long_ago = datetime(2001, 1, 1, tzinfo=UTC)
    oversized = [
        await start_paused_looking(
            client, agent=agent, task_queue=tq, pending=raw(huge), since=long_ago
        )
        for _ in range(2)
    ]
    plain = [
        await start_paused_looking(client, agent=agent, task_queue=tq, pending=raw(small))
        for _ in range(3)
    ]
    # On a queue no worker of this deployment polls, waiting "longest" of all.
    elsewhere = await start_paused_looking(
        client, agent=agent, pending=raw(small), since=datetime(1999, 1, 1, tzinfo=UTC)
    )
    ids = [*oversized, *plain]
    inbox = AgentClient(client, task_queue=tq)
    parsed_on: set[int] = set()
    real_paused_chat = inbox_module.paused_chat

    def recorded(wf: Any, pending: object) -> PausedChat:
        parsed_on.add(threading.get_ident())
        return real_paused_chat(wf, pending)

    monkeypatch.setattr(inbox_module, "paused_chat", recorded)

    def listed(chats: list[PausedChat]) -> bool:
        return {c.chat_id for c in chats} >= set(ids)

    everything = await eventually(
        lambda: inbox.pending(agent=agent), listed, timeout=VISIBILITY_TIMEOUT
    )
    by_id = {c.chat_id: c for c in everything}
    # The untrusted queue's chat is not listed, however long it says it has waited.
    assert elsewhere not in by_id
    assert set(by_id) == set(ids)
    for chat_id in oversized:
        chat = by_id[chat_id]
        assert chat.unreadable is not None and "more than this product writes" in chat.unreadable
        assert [(i.name, i.ref) for i in chat.interrupts] == [("approve", "?")]
    for chat_id in plain:
        assert by_id[chat_id].unreadable is None
        assert [i.ref for i in by_id[chat_id].interrupts] == ["x"]
    # Parsed off the event loop: never on this (the loop's) thread.
    assert parsed_on and threading.get_ident() not in parsed_on
    # Asked for, every queue is listed, each chat with its queue.
    anywhere = await eventually(
        lambda: inbox.pending(agent=agent, task_queues="any"),
        lambda chats: elsewhere in {c.chat_id for c in chats},
        timeout=VISIBILITY_TIMEOUT,
    )
    assert {c.chat_id: c.task_queue for c in anywhere}[elsewhere] != tq

    # Pages of at most two, through the cursor: every chat once.
    walked: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await inbox.pending_page(agent=agent, limit=2, cursor=cursor)
        assert len(page.chats) <= 2
        walked += [c.chat_id for c in page.chats]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(walked) == sorted(ids) and pages >= 3
    assert [c.chat_id for c in await inbox.pending(agent=agent, limit=2)] == walked[:2]
    for limit in (0, inbox_module.MAX_PAGE_SIZE + 1):
        with pytest.raises(ValueError, match="limit is from 1"):
            await inbox.pending_page(agent=agent, limit=limit)
    with pytest.raises(ValueError, match="cursor"):
        await inbox.pending_page(agent=agent, cursor="%%%")

    # Over HTTP: the same page, the same report, and no other queue's chat.
    async with (
        served(agents_app(inbox, dev_loopback=True)) as base,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        r = await http.get(f"{base}/api/inbox", params={"agent": agent, "limit": "2"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["chats"]) <= 2 and body["next_cursor"]
        r = await http.get(f"{base}/api/inbox", params={"agent": agent})
        shown = {c["chat_id"]: c for c in r.json()["chats"]}
        assert set(shown) == set(ids) and r.json()["next_cursor"] is None
        assert all("more than this product" in shown[c]["unreadable"] for c in oversized)
        for bad in ({"limit": "0"}, {"limit": "x"}, {"cursor": "%%%"}):
            r = await http.get(f"{base}/api/inbox", params={"agent": agent, **bad})
            assert r.status_code == 400, (bad, r.text)
    for chat_id in [*ids, elsewhere]:
        await client.get_workflow_handle(chat_id).terminate("test over")


async def test_the_longest_waiting_are_found_by_age_without_walking_every_page(
    run_worker, model, client
):
    """Visibility pages newest started first: with many paused, the longest waiting would be
    on the last page. ``waiting_over`` (``agentctl pending --waiting-over``) asks visibility
    for them by ``InterruptedSince`` instead."""
    treasury = treasury_agent()
    tq = f"inbox-age-{uuid.uuid4()}"
    model.reply(
        calls(("approve", {"question": "first?"}, "q1")),
        calls(("approve", {"question": "second?"}, "q2")),
    )
    async with run_worker(agents=[treasury], task_queue=tq) as agents:
        older = await agents.chat(treasury.name, chat_id=f"{treasury.name}-older")
        newer = await agents.chat(treasury.name, chat_id=f"{treasury.name}-newer")
        (first,) = (await older.send("first")).interrupts
        await asyncio.sleep(2.0)  # two pause times far enough apart to cut between
        (second,) = (await newer.send("second")).interrupts
    assert first.since is not None and second.since is not None
    inbox = AgentClient(client, task_queue=tq)
    both = [(older.id, ["q1"]), (newer.id, ["q2"])]
    await eventually(
        lambda: inbox.pending(agent=treasury.name),
        lambda chats: seen(chats) == both,
        timeout=VISIBILITY_TIMEOUT,
    )
    # A cutoff halfway between the two pauses keeps the older only; one before both, none.
    cutoff = first.since + (second.since - first.since) / 2
    over = datetime.now(UTC) - cutoff
    assert seen(await inbox.pending(agent=treasury.name, waiting_over=over)) == [both[0]]
    page = await inbox.pending_page(agent=treasury.name, waiting_over=over, limit=5)
    assert seen(page.chats) == [both[0]] and page.next_cursor is None
    assert await inbox.pending(agent=treasury.name, waiting_over=timedelta(days=1)) == []
    assert seen(await inbox.pending(agent=treasury.name, waiting_over=timedelta(0))) == both
    # Further back than a datetime goes: nothing, not an overflow.
    assert await inbox.pending(agent=treasury.name, waiting_over=timedelta.max) == []
    with pytest.raises(ValueError, match="negative"):
        await inbox.pending(waiting_over=timedelta(seconds=-1))

    aged = await agentctl(
        client, "pending", "--agent", treasury.name, "--waiting-over", "1d", task_queue=tq
    )
    assert aged.code == 0 and "No paused conversations" in aged.out, aged
    # Both paused over a second ago by now (sure of it, not assumed).
    await asyncio.sleep(max(0.0, 1.5 - (datetime.now(UTC) - second.since).total_seconds()))
    listed = await agentctl(
        client, "pending", "--agent", treasury.name, "--waiting-over", "1s", "--json", task_queue=tq
    )
    assert listed.code == 0, listed.err
    assert [c["chat_id"] for c in listed.json()["conversations"]] == [older.id, newer.id]
    for bad, says in [("soon", "is not a duration"), ("99999999999d", "longer than")]:
        refused = await agentctl(client, "pending", "--waiting-over", bad, task_queue=tq)
        assert refused.code == 2 and says in refused.err, refused

"""Attacks on what a paused call shows and where it is announced (issue 49: presentation and
notifications), by someone holding namespace credentials, against the real dev server.

Each test is one attack. Those that hold pin the defence; the defects fixed here
(``workflows/notifications.py``) failed before the fix; the ones left open are strict xfails
that say why.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.client import ActivityFailureError, Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from temporal_agent_interrupts import Agent, Chat, ToolApproval, tool
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import dev_server, hosted
from temporal_agent_interrupts.workflows import presentation
from temporal_agent_interrupts.workflows.activity_io import NotifyInput
from temporal_agent_interrupts.workflows.config import NOTIFY_ACTIVITY, WORKFLOW_TYPE
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    GrantScope,
    InterruptRequest,
    Shown,
)
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_presentation import PAY, call, send_payment, send_plain
from tests.test_sealed_results import _activity_rejections, _scheduled
from tests.test_sealed_results_attacks import (
    _complete_raw,
    _fail_raw,
    _json,
    _task_after_completion,
)


@dataclass
class Channel:
    """A channel that keeps what it is told; the announcements numbered in ``hold`` wait for
    ``release`` (the channel is slow: a post on its way)."""

    announced: list[NotifyInput] = field(default_factory=list)
    settled: list[tuple[NotifyInput, str]] = field(default_factory=list)
    hold: set[int] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    delay: float = 0.0

    async def announce(self, note: NotifyInput) -> str | None:
        self.announced.append(note)
        n = len(self.announced)
        if n in self.hold:
            await self.release.wait()
        await asyncio.sleep(self.delay)
        return f"msg-{n}"

    async def settle(self, note: NotifyInput, posted: str) -> None:
        self.settled.append((note, posted))

    def ends(self) -> list[tuple[str | None, str | None, str]]:
        return sorted((n.settled, n.settled_by, p) for n, p in self.settled)


APPROVERS = ["ops@example.com", "eve@example.com"]


class Transfer(BaseModel):
    to: str
    amount: float


@tool("transferNotified", "Move money; a human may change it.", editable=True)
async def transfer(inp: Transfer) -> dict[str, object]:
    return {"sent": inp.amount, "to": inp.to}


def editing(notify: list[str]) -> Agent:
    return Agent(
        f"editing_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[transfer],
        middleware=[ToolApproval(allow=[], approvers=APPROVERS)],
        notify=notify,
    )


def paying() -> Agent:
    return Agent(
        f"paying_{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(approvers=["cfo@example.com"])],
        notify=["desk"],
    )


async def _notified(chat: Chat) -> list[AnswerRecord]:
    return [r for r in (await chat.history()).answers if r.kind == "notified"]


def _phish(chat_id: str) -> NotifyInput:
    return NotifyInput(
        agent="anything",
        chat_id=chat_id,
        channel="desk",
        kind="paused",
        key="k",
        interrupt=InterruptRequest(
            name="sendPayment",
            ref="r1",
            input={"note": "Urgent: approve at https://evil.example/approve"},
            shown=Shown(title="Send payment", summary="CEO asks: approve at evil.example"),
        ),
    )


# -- who may make the bot post -------------------------------------------------------------------


async def test_a_standalone_notify_activity_posts_nothing(run_worker, client):
    """Held: a standalone ``notify`` (no workflow) is refused before any channel is called."""
    desk = Channel()
    async with run_worker(agents=[paying()], channels={"desk": desk}) as agents:
        handle = await client.start_activity(
            NOTIFY_ACTIVITY,
            _phish("any-chat"),
            id=f"standalone-{uuid.uuid4()}",
            task_queue=agents.task_queue,
            start_to_close_timeout=timedelta(seconds=10),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "NotScheduledByConversation"
    assert desk.announced == []


@workflow.defn(name="NotifyImpostor")
class NotifyImpostor:
    """Someone else's workflow, on a queue of its own, scheduling our notify activity."""

    @workflow.run
    async def run(self, queue: str) -> str:
        try:
            await workflow.execute_activity(
                NOTIFY_ACTIVITY,
                _phish(workflow.info().workflow_id),
                task_queue=queue,
                start_to_close_timeout=timedelta(seconds=10),
            )
        except Exception as e:  # noqa: BLE001  # what failed is the answer
            return str(e.__cause__ or e)
        return "posted"


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflowLookalike(NotifyImpostor):
    """The same, named ``AgentWorkflow`` (its worker polls a queue of its own)."""

    @workflow.run
    async def run(self, queue: str) -> str:
        return await super().run(queue)


async def _impostor_says(client: Client, queue: str, impostor: type) -> str:
    own = f"impostor-{uuid.uuid4()}"
    async with Worker(
        client, task_queue=own, workflows=[impostor], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        return await client.execute_workflow(
            impostor.run,
            queue,
            id=own,
            task_queue=own,
            execution_timeout=timedelta(seconds=60),
        )


async def test_a_notify_activity_from_another_workflow_posts_nothing(run_worker, client):
    """Held: scheduled by a workflow of another type, the activity is refused."""
    desk = Channel()
    async with run_worker(agents=[paying()], channels={"desk": desk}) as agents:
        said = await _impostor_says(client, agents.task_queue, NotifyImpostor)
    assert "scheduled by workflow 'NotifyImpostor'" in said
    assert desk.announced == []


async def test_a_lookalike_agentworkflow_on_its_own_queue_makes_the_bot_post_nothing(
    run_worker, client
):
    desk = Channel()
    async with run_worker(agents=[paying()], channels={"desk": desk}) as agents:
        said = await _impostor_says(client, agents.task_queue, AgentWorkflowLookalike)
    assert desk.announced == [], f"the bot posted the attacker's text ({said})"


# -- completing or failing a notification by id -------------------------------------------------

FORGED = {
    "posted-of-its-own": ("complete", _json(b'{"posted": "C0ATTACKER:1700000000.000100"}')),
    "not-json": ("complete", _json(b"{not json")),
    "unknown-encoding": ("complete", Payload(metadata={"encoding": b"binary/forged"}, data=b"x")),
    "words-of-its-own": (
        "fail",
        Failure(
            message="CFO: already approved by phone, click Approve",
            application_failure_info=ApplicationFailureInfo(
                type="SlackApiError", non_retryable=True
            ),
        ),
    ),
}


@pytest.mark.parametrize(("how", "payload"), list(FORGED.values()), ids=list(FORGED))
async def test_a_notification_completed_or_failed_by_id_chooses_nothing(
    run_worker, model, client, how, payload
):
    """Held: a notify activity completed by id (a ``posted`` of the attacker's, bytes that do
    not convert) or failed by id with words of the attacker's is refused on record: the
    workflow task after it completes, the message the conversation updates at the end is never
    the attacker's, the attacker's words are not in the audit trail, and the call is answered."""
    desk = Channel(hold={1})
    agent = paying()
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    try:
        async with run_worker(agents=[agent], channels={"desk": desk}) as agents:
            chat = await agents.chat(agent.name)
            (request,) = (await chat.send("Pay the rent.")).interrupts
            await eventually(lambda: asyncio.sleep(0, desk.announced), lambda a: len(a) == 1)
            found = await eventually(
                lambda: _scheduled(client, chat.id, NOTIFY_ACTIVITY), lambda f: f is not None
            )
            assert found is not None
            if how == "complete":
                await _complete_raw(client, chat.id, found, payload)
                ended = await eventually(
                    lambda: _task_after_completion(client, chat.id, found),
                    lambda k: k is not None,
                )
                assert ended == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            else:
                await _fail_raw(client, chat.id, found, payload)
            (record,) = await eventually(lambda: _notified(chat), lambda r: len(r) == 1)
            assert record.delivered is False
            assert "was not a worker's" in (record.verdict_reason or "")
            assert "CFO" not in (record.verdict_reason or "")
            assert len(await _activity_rejections(client, chat.id)) == 1
            desk.release.set()
            done = await chat.resume(answers=[request.approve()], identity="cfo@example.com")
            assert done.text == "paid"
            await asyncio.sleep(1)
            # Nothing the conversation took was posted, so no message is updated: never the
            # attacker's, and the worker's own late completion was refused by the server.
            assert desk.settled == []
    finally:
        desk.release.set()
    await assert_no_workflow_task_failed(client, chat.id)


# -- what a message says when its call ends (fixed in workflows/notifications.py) -------------


async def test_an_edit_while_the_announcement_is_on_its_way_never_marks_it_approved(
    run_worker, model, client
):
    """Fixed. The first message (900 to acme) was on its way when an approver's edit (100 to
    evil, not approved) paused the call again. Its reference was then kept under the new
    pause, so when ops approved *that*, the 900-to-acme message was updated to "approved by
    ops", and the edit that ended its pause was never posted on it. Before the fix:
    ``[('approved', 'ops@example.com', 'msg-1'), ('approved', 'ops@example.com', 'msg-2')]``."""
    desk = Channel(hold={1})
    agent = editing(["desk"])
    model.reply(calls(("transferNotified", {"to": "acme", "amount": 900}, "e1")), text("sent"))
    try:
        async with run_worker(agents=[agent], channels={"desk": desk}) as agents:
            chat = await agents.chat(agent.name)
            (gated,) = (await chat.send("pay acme 900")).interrupts
            await eventually(lambda: asyncio.sleep(0, desk.announced), lambda a: len(a) == 1)
            proposal = gated.restart({}, input={"to": "evil", "amount": 100})
            (regated,) = (await chat.resume(answers=[proposal], identity=APPROVERS[1])).interrupts
            await eventually(lambda: asyncio.sleep(0, desk.announced), lambda a: len(a) == 2)
            desk.release.set()
            await chat.resume(answers=[regated.approve()], identity=APPROVERS[0])
            await eventually(lambda: asyncio.sleep(0, desk.settled), lambda s: len(s) == 2)
            assert desk.ends() == [
                ("approved", "ops@example.com", "msg-2"),
                ("edited", "eve@example.com", "msg-1"),
            ]
            assert [n.interrupt.input["to"] for n in desk.announced] == ["acme", "evil"]
    finally:
        desk.release.set()
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_revoke_after_the_approval_never_names_the_revoker_on_the_message(
    run_worker, model, client
):
    """Fixed. The CFO approved (with a grant) while the announcement was on its way; anyone
    may then revoke the grant under any name (it only narrows what runs), and that record, the
    last against the call's ref, was read as how the call ended: the payment's message said
    "answered by mallory". Before the fix: ``[('answered', 'mallory@example.com', 'msg-1')]``."""
    desk = Channel(hold={1})
    agent = paying()
    model.reply(calls(("sendPayment", PAY, "p1")), text("paid"))
    try:
        async with run_worker(agents=[agent], channels={"desk": desk}) as agents:
            chat = await agents.chat(agent.name)
            (request,) = (await chat.send("Pay the rent.")).interrupts
            await eventually(lambda: asyncio.sleep(0, desk.announced), lambda a: len(a) == 1)
            approval = request.approve(remember=GrantScope())
            await chat.resume(answers=[approval], identity="cfo@example.com")
            (grant,) = await chat.grants()
            await chat.revoke_grant(grant.id, identity="mallory@example.com")
            desk.release.set()
            await eventually(lambda: asyncio.sleep(0, desk.settled), lambda s: len(s) == 1)
            assert desk.ends() == [("approved", "cfo@example.com", "msg-1")]
    finally:
        desk.release.set()
    await assert_no_workflow_task_failed(client, chat.id)


# -- a flood that keeps a notification in flight ---------------------------------------------

HISTORY_ERROR = 600
"""Where the ``tiny`` server terminates a run (Temporal's own is 51,200 events): the attack
needs about 30 to 60 edits here, and about 2,600 to 5,000 there."""


@pytest.fixture(scope="module")
async def tiny() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server that suggests continue-as-new after 40 events and terminates a run at
    :data:`HISTORY_ERROR` events."""
    args: list[str] = []
    for value in (
        "limit.historyCount.suggestContinueAsNew=40",
        "limit.historyCount.warn=300",
        f"limit.historyCount.error={HISTORY_ERROR}",
    ):
        args += ["--dynamic-config-value", value]
    async with dev_server(extra_args=args) as environment:
        yield environment


@pytest.mark.parametrize("delay", [0.0, 0.5], ids=["instant-channel", "slow-channel"])
async def test_an_edit_flood_cannot_keep_a_paused_run_from_continuing_as_new(tiny, model, delay):
    """Fixed. Each edit that does not approve pauses the call again, and each pause is
    announced; the run waits for notifications in flight before it continues as new, and
    the history guard leaves a paused turn to continue-as-new. Edits back to back kept one in
    flight, so the run never continued as new and Temporal terminated it at its history limit:
    the paused call and the conversation were lost. Without channels the same flood continues
    as new every ~56 events. Before the fix: instant channel, 63 edits, runs of 72, 210 and
    328 events, then TERMINATED at 599; a 2 s channel, 58 edits, one run TERMINATED at 596;
    both cases here end "chat is closed". Now a run due to continue as new announces no new
    pause (the next run does; ends are still posted, once per message)."""
    client = tiny.client
    agent = editing(["desk"])
    desk = Channel(delay=delay)
    model.reply(calls(("transferNotified", {"to": "acme", "amount": 900}, "e1")), text("sent"))
    async with hosted(client, agents=[agent], model=model, channels={"desk": desk}) as agents:
        chat = await agents.chat(agent.name)
        (request,) = (await chat.send("pay acme 900")).interrupts
        for n in range(80):
            edit = request.restart({}, input={"to": "acme", "amount": n + 1})
            again = await asyncio.wait_for(chat.resume(answers=[edit], identity=APPROVERS[1]), 30)
            (request,) = again.interrupts
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{chat.id}'")]
        assert all(w.status != WorkflowExecutionStatus.TERMINATED for w in runs), runs
        assert len(runs) > 1 and max(w.history_length for w in runs) < HISTORY_ERROR
        done = await asyncio.wait_for(
            chat.resume(answers=[request.approve()], identity=APPROVERS[0]), 30
        )
        assert done.text == "sent"
        # Exactly once: no pause announced twice, and every message posted gets one end
        # (a pause that ended before it was announced is owed nothing).
        keys = [n.key for n in desk.announced]
        assert len(keys) == len(set(keys))
        posted = {f"msg-{n}" for n in range(1, len(keys) + 1)}
        ended = await eventually(
            lambda: asyncio.sleep(0, [p for _, p in desk.settled]),
            lambda e: set(e) == posted,
            timeout=20,
        )
        assert len(ended) == len(posted)
    await assert_no_workflow_task_failed(client, chat.id)


# -- what an approver is shown (workflows/presentation.py, workflows/text.py) ---------------


@pytest.mark.parametrize(
    "hidden",
    ["\u00ad", "\u2062", "\u2064", "\u180e", "\u206a", "\U000e0041", "\u3164"],
    ids=[
        "soft-hyphen",
        "invisible-times",
        "invisible-plus",
        "mongolian-vs",
        "iss",
        "tag-A",
        "hangul-filler",
    ],
)
def test_an_invisible_character_in_a_value_is_made_visible(hidden):
    real = "NL91 ABNA 0417 1643 00"
    forged = "NL91 ABNA" + hidden + " 0417 1643 00"
    shown = presentation.shown(
        call({**PAY, "iban": forged}, name="sendPaymentPlain"), send_plain.spec()
    )
    assert shown.fields[2].value != real
    assert hidden not in shown.fields[2].value and hidden not in shown.summary


def test_bidi_and_zero_width_characters_in_values_are_made_visible():
    """Held: the characters ``visible`` names are escaped in fields and summary alike."""
    for hidden in ("\u202e", "\u200b", "\u2066", "\ufeff", "\u200d"):
        shown = presentation.shown(call({**PAY, "currency": "EUR" + hidden}), send_payment.spec())
        assert hidden not in shown.summary


def test_a_long_value_cannot_push_the_payee_out_of_the_summary():
    spoof = "EUR to NL91 …00 (payee on file)" + "\u2800" * 180
    shown = presentation.shown(
        call({**PAY, "currency": spoof, "iban": "DE89 3704 0044 0532 0130 00"}),
        send_payment.spec(),
    )
    assert "DE89" in shown.summary, shown.summary


def test_a_key_with_a_dot_does_not_show_as_another_field():
    args = {**PAY, "note.Amount": 5, "note": {"Amount": 1}}
    shown = presentation.shown(call(args, name="sendPaymentPlain"), send_plain.spec())
    assert [f.label for f in shown.fields].count("Amount") == 1, shown.fields


def test_two_payees_do_not_read_the_same():
    real = presentation.shown(call(PAY), send_payment.spec())
    other = presentation.shown(call({**PAY, "iban": "NL91 EVIL 9999 9999 00"}), send_payment.spec())
    assert (real.summary, real.fields) != (other.summary, other.fields)

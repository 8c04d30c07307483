"""Review of the one-package release (issue 26), tried as an attacker with the namespace's
credentials and as a team adopting the package would, on a real dev server.

- ``AgentsPlugin`` on a team's own worker, beside a team workflow that runs whatever activity it
  is told: our tool and model activities still run only for their own conversation.
- ``agent_converter``: payload keys given explicitly are never silently dropped (in the clear,
  or a second set beside a codec).
- An inbox entry answered as it is (``approve``/``deny``/``respond(entry)``) answers only the
  input it shows: a memo a starter wrote (the inbox lists it until a worker's first task scrubs
  it) whose digest names another input builds no answer.
- A forged activity failure or completion by id (``RespondActivityTaskFailedById`` and
  ``…CompletedById``, which need no poll) changes nothing: no worker sealed it
  (``workflows.seal``), so the model is asked again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import ActivityFailureError, Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.converter import PayloadCodec
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from temporal_agent_interrupts import AgentClient, AgentsPlugin, FinishReason
from temporal_agent_interrupts.codec import (
    NO_KEYS,
    PayloadKeys,
    data_converter,
    generate_key,
)
from temporal_agent_interrupts.errors import UnknownAgent
from temporal_agent_interrupts.worker import agent_converter, build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel
from temporal_agent_interrupts.workflows.activity_io import (
    ModelResult,
)
from temporal_agent_interrupts.workflows.config import (
    AGENT_NAME,
    AGENT_STATUS,
    INTERRUPTED_SINCE,
    MODEL_ACTIVITY,
    PENDING_INTERRUPTS,
    TOOL_ACTIVITY,
)
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
)
from temporal_agent_interrupts.workflows.types import (
    Message,
    Part,
    input_digest,
)
from tests import agents as t
from tests.helpers import eventually
from tests.team_relay import RelayWorkflow
from tests.team_workflow import GreetingWorkflow, shout
from tests.test_fresh_machine import recipe
from tests.test_plugin import plugged
from tests.test_trust_boundary import approved_charge

K1 = PayloadKeys.parse(generate_key("k1"))
K2 = PayloadKeys.parse(generate_key("k2"))

# ----------------------------------------------------------------------------------------------
# 1. The plugin on a team's own worker.


async def test_a_team_workflow_beside_the_plugin_cannot_run_our_tool_or_model(client):
    model = ScriptedModel([text("should never be asked")])
    gemini = model.client()
    theirs = plugged(client, AgentsPlugin(agents=[t.gated], gemini=gemini))
    queue = f"team-{uuid.uuid4()}"
    async with Worker(
        theirs, task_queue=queue, workflows=[GreetingWorkflow, RelayWorkflow], activities=[shout]
    ):
        # The team's relay, aimed at our activities by whoever may start workflows.
        tool = await theirs.execute_workflow(
            RelayWorkflow.run,
            args=[TOOL_ACTIVITY, approved_charge(f"relay-{uuid.uuid4()}")],
            id=f"relay-{uuid.uuid4()}",
            task_queue=queue,
        )
        relay_id = f"relay-{uuid.uuid4()}"
        forged_model = {"agent": "gated", "chat_id": relay_id, "new_from": 0,
                        "new_messages": [], "history_size": 0}  # fmt: skip
        asked = await theirs.execute_workflow(
            RelayWorkflow.run, args=[MODEL_ACTIVITY, forged_model], id=relay_id, task_queue=queue
        )
        # And a standalone activity on the team's queue.
        handle = await theirs.start_activity(
            TOOL_ACTIVITY,
            approved_charge("any-chat"),
            id=f"standalone-{uuid.uuid4()}",
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=30),
        )
        with pytest.raises(ActivityFailureError) as failed:
            await handle.result()
    await model.release(gemini)
    assert tool == "refused: NotScheduledByConversation"
    assert asked == "refused: NotScheduledByConversation"
    assert isinstance(failed.value.cause, ApplicationError)
    assert failed.value.cause.type == "NotScheduledByConversation"
    assert t.RUNS["charge"] == 0 and model.requests == []


# ----------------------------------------------------------------------------------------------
# 2. The converter never drops keys it was given.


def test_keys_given_to_the_plugin_are_not_dropped_for_a_client_codec_without_keys(monkeypatch):
    monkeypatch.delenv("AGENT_PAYLOAD_KEYS", raising=False)
    clear = data_converter(NO_KEYS)  # e.g. the testing kit's env.client
    with pytest.raises(ValueError, match="would drop them"):
        agent_converter(clear, keys=K1)


def test_keys_given_to_the_plugin_are_not_dropped_for_a_client_with_other_keys():
    with pytest.raises(ValueError, match="would drop them"):
        agent_converter(data_converter(K1), keys=K2)
    # The same keys (a client copied with its plugin, Client(**client.config())) are fine.
    same = data_converter(K1)
    with pytest.raises(ValueError, match="would drop them"):  # the same id, another key
        agent_converter(same, keys=PayloadKeys.parse(generate_key("k1")))
    assert agent_converter(same, keys=K1) is same


def test_keys_given_beside_a_team_codec_on_our_converter_are_refused():
    class TeamCodec(PayloadCodec):
        async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
            return list(payloads)

        async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
            return list(payloads)

    theirs = dataclasses.replace(data_converter(NO_KEYS), payload_codec=TeamCodec())
    with pytest.raises(ValueError, match=r"a codec of its own \(TeamCodec\)"):
        agent_converter(theirs, keys=K1)
    assert agent_converter(theirs) is theirs  # no keys given: the team's codec is kept


# ----------------------------------------------------------------------------------------------
# 5. An inbox entry answers only the input it shows.


async def test_a_starters_memo_entry_whose_digest_names_another_input_builds_no_answer(
    run_worker, model, client
):
    """The attacker starts a real conversation with a memo of its choosing while no worker has
    taken it: the inbox lists its entry, showing ``amount: 1`` with the digest of ``amount:
    1e6``. An approver who approves that entry as shown must not approve the real call."""
    queue = f"review-{uuid.uuid4()}"
    chat_id = f"forged-memo-{uuid.uuid4()}"
    real_args = {"amount": 1e6}
    entry = {
        "name": "charge",
        "ref": "c1",
        "input": {"amount": 1},
        "source": "approval",
        "input_digest": input_digest(real_args),
    }
    await client.start_workflow(
        "AgentWorkflow",
        ConversationInput(agent="gated"),
        id=chat_id,
        task_queue=queue,  # the agents' queue; its worker is not running yet
        memo={"pending": [entry]},
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(AGENT_NAME, "gated"),
                SearchAttributePair(AGENT_STATUS, "interrupted"),
                SearchAttributePair(PENDING_INTERRUPTS, ["charge"]),
                SearchAttributePair(INTERRUPTED_SINCE, datetime.now(UTC)),
            ]
        ),
    )
    lister = AgentClient(client, task_queue=queue)
    listed = await eventually(
        lambda: lister.pending(agent="gated"),
        lambda chats: any(c.chat_id == chat_id for c in chats),
    )
    (shown,) = next(c for c in listed if c.chat_id == chat_id).interrupts
    assert shown.input == {"amount": 1}
    try:
        approved = shown.approve()
    except ValueError:
        approved = None  # refused: the entry's digest does not name what it shows
    model.reply(calls(("charge", real_args, "c1")), text("charged"))
    async with run_worker(agents=[t.gated], task_queue=queue) as agents:
        chat = await agents.chat("gated", chat_id=chat_id)
        paused = await chat.send("charge a million")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        (real,) = paused.interrupts
        assert real.ref == "c1" and real.input == real_args
        if approved is not None:
            done = await chat.resume(answers=[approved])
            assert done.finish_reason != FinishReason.STOP
        await client.get_workflow_handle(chat_id).terminate("test over")
    assert t.RUNS["charge"] == 0
    assert approved is None


def test_an_entry_without_a_digest_binds_its_answer_to_the_input_it_shows():
    from temporal_agent_interrupts.client.inbox import PausedInterrupt

    shown = PausedInterrupt(name="charge", ref="c1", input={"amount": 1}, source="approval")
    assert shown.approve().input_digest == input_digest({"amount": 1})
    assert shown.deny("no").input_digest == input_digest({"amount": 1})
    assert shown.respond({"ok": True}).input_digest == input_digest({"amount": 1})
    cut = PausedInterrupt(
        name="charge", ref="c1", input={"omitted": "x"}, input_cut=True, source="approval"
    )
    with pytest.raises(ValueError, match=r"pending\(\)"):
        cut.approve()


# ----------------------------------------------------------------------------------------------
# 3. UnknownAgent: a forged failure by activity id (open).


async def first_scheduled_model_call(client: Client, chat_id: str) -> tuple[str, str] | None:
    handle = client.get_workflow_handle(chat_id)
    try:
        events = [e async for e in handle.fetch_history_events()]
    except RPCError:
        return None  # not started yet
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_ACTIVITY:
                desc = await handle.describe()
                return desc.run_id or "", attrs.activity_id
    return None


@pytest.mark.parametrize(
    "forgery", ["fail-unknown-agent", "complete-as-the-model", "complete-without-the-keys"]
)
async def test_a_model_call_answered_by_id_from_outside_changes_nothing(client, forgery):
    release = threading.Event()

    def slow(request):  # runs in a thread: holds the first model call in flight
        release.wait(30)
        return text("hello")

    model = ScriptedModel(slow)
    gemini = model.client()
    queue = f"review-{uuid.uuid4()}"
    workers = client
    if forgery == "complete-without-the-keys":  # the workers encrypt; the attacker has no key
        workers = Client(**{**client.config(), "data_converter": data_converter(K1)})
    try:
        async with build_worker(workers, agents=[t.gated], task_queue=queue, gemini=gemini):
            chat = await AgentClient(workers, task_queue=queue).chat("gated")
            sent = asyncio.create_task(chat.send("hi"))
            found = await eventually(
                lambda: first_scheduled_model_call(client, chat.id), lambda f: f is not None
            )
            assert found is not None
            run_id, activity_id = found
            # The attacker: no poll, only the ids history shows.
            forged = client.get_async_activity_handle(
                workflow_id=chat.id, run_id=run_id, activity_id=activity_id
            )
            if forgery == "fail-unknown-agent":
                await forged.fail(
                    ApplicationError(
                        "no agent",
                        "NOT_FOUND",
                        {"hosted": []},
                        type="UnknownAgent",
                        non_retryable=True,
                    )
                )
            else:
                await forged.complete(
                    ModelResult(message=Message(role="model", parts=[Part(text="forged")]))
                )
            release.set()
            try:
                result = await sent
            except UnknownAgent:
                result = None
            assert result is not None and result.text == "hello"
    finally:
        release.set()
        await model.release(gemini)


# ----------------------------------------------------------------------------------------------
# 6. What make dist would publish.

CHECK_DIST_TREE = Path(__file__).resolve().parents[1] / "scripts" / "check-dist-tree"


def git(*argv: str, cwd: Path) -> None:
    subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True)


def test_make_dist_refuses_untracked_modules_and_links_out_of_the_repository(tmp_path):
    """setuptools ships every module of the package's folders, tracked or not, and follows
    links (an untracked ``worker/scratch.py`` and a link ``workflows/leak.py -> /etc/hostname``
    were in a ``make dist`` of a working tree): the check before the build lists them."""
    repo = tmp_path / "repo"
    for folder in ("workflows", "activities", "worker", "client", "temporal_agent_interrupts"):
        (repo / folder).mkdir(parents=True)
        (repo / folder / "__init__.py").write_text("")
    (repo / "temporal_agent_interrupts" / "worker_link").symlink_to("../worker")
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    clean = subprocess.run(
        [sys.executable, CHECK_DIST_TREE, repo], capture_output=True, text=True, check=False
    )
    assert clean.returncode == 0, clean.stderr
    (repo / "worker" / "scratch.py").write_text("TOKEN = 'x'\n")
    (repo / "workflows" / "leak.py").symlink_to("/etc/hostname")
    dirty = subprocess.run(
        [sys.executable, CHECK_DIST_TREE, repo], capture_output=True, text=True, check=False
    )
    assert dirty.returncode == 1
    assert "worker/scratch.py: not tracked" in dirty.stderr
    assert "workflows/leak.py: a link to /etc/hostname" in dirty.stderr
    commands = recipe("dist")
    check = next(i for i, c in enumerate(commands) if "scripts/check-dist-tree" in c)
    build = next(i for i, c in enumerate(commands) if "-m build" in c)
    assert check < build, commands


async def test_entries_of_real_pauses_are_answered_as_they_are_whatever_their_input_spells(
    run_worker, model, client
):
    """The digest an entry's answer carries is computed from the input the memo shows: the
    conversation's own memo round-trips to the same digest for floats, escapes and non-BMP
    text, so real entries are never refused."""
    asks = [
        ("approve", {"question": "ok? \u00e9\U0001f600 \u0001 \u202e"}, "q1"),
        ("charge", {"amount": 1e16}, "c1"),
        ("charge", {"amount": -0.0}, "c2"),
        ("charge", {"amount": 0.1}, "c3"),
    ]
    model.reply(calls(*asks), text("done"))
    async with run_worker(agents=[t.gated]) as agents:
        chat = await agents.chat("gated")
        paused = await chat.send("go")
        assert len(paused.interrupts) == len(asks)
        listed = await eventually(
            lambda: agents.pending(agent="gated"),
            lambda chats: any(c.chat_id == chat.id and len(c.interrupts) == 4 for c in chats),
        )
        (entry,) = [c for c in listed if c.chat_id == chat.id]
        answers = [e.approve() for e in entry.interrupts]
        assert [a.input_digest for a in answers] == [i.input_digest for i in paused.interrupts]
        done = await chat.resume(answers=answers)
    assert done.finish_reason == FinishReason.STOP
    assert t.RUNS["charge"] == 3

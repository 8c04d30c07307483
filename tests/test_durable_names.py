"""The names the client reads Temporal by are the workflow's own.

The client compares what visibility and histories say with ``workflows.config.WORKFLOW_TYPE``,
and the span exporter keeps a received call's name only when ``client.tracing.KNOWN_NAMES`` has
it. The exporter's list is written down in ``client/``, so these tests ask a running
conversation for its definition (the SDK's built-in ``__temporal_workflow_metadata``
query: the handlers as the worker registered them, those the stream adds at run time too, with
no private SDK member) and fail when the workflow gains a name the client does not know.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.worker import Worker

from temporal_agent_interrupts import AgentsPlugin
from temporal_agent_interrupts.tracing import KNOWN_NAMES
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel
from temporal_agent_interrupts.workflows import Agent
from temporal_agent_interrupts.workflows.config import (
    ACTIVITY_PREFIX,
    MODEL_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL
from tests import agents as t
from tests.helpers import events_of, eventually, history
from tests.team_workflow import CallOne
from tests.test_plugin import plugged


async def test_the_names_the_client_knows_are_the_workflows_own(run_worker, model, client):
    agent = Agent(f"names-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.lookup])
    model.reply(calls(("lookup", {"key": "k"}, "l1")), text("found"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        assert (await chat.send("look it up")).text == "found"
        meta: WorkflowMetadata = await chat.handle.query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        # A signal the dynamic handler does not take is recorded as unknown; each name the
        # exporter keeps is taken (refused here for its payload, never for its name).
        for name in [*sorted(KNOWN_NAMES["signal"]), "not-a-signal"]:
            await chat.handle.signal(name, {})
        refused = await eventually(
            chat.rejections, lambda r: len(r) == len(KNOWN_NAMES["signal"]) + 1
        )
    definition = meta.definition
    assert definition.type == WORKFLOW_TYPE
    queries = {q.name for q in definition.query_definitions}
    updates = {u.name for u in definition.update_definitions}
    signals = {s.name for s in definition.signal_definitions}
    # A dynamic query or update would take names nobody can list: the exporter could keep none.
    assert "" not in queries and "" not in updates
    assert queries <= KNOWN_NAMES["query"], f"queries the exporter does not know: {queries}"
    assert updates <= KNOWN_NAMES["update"], f"updates the exporter does not know: {updates}"
    assert signals - {""} <= KNOWN_NAMES["signal"], f"signals it does not know: {signals}"
    # Every name the exporter keeps is one the workflow still has.
    assert queries == KNOWN_NAMES["query"] and updates == KNOWN_NAMES["update"]
    assert PUBLISH_SIGNAL in KNOWN_NAMES["signal"]
    unknown = [r.handler for r in refused if "unknown signal" in r.reason]
    assert unknown == ["not-a-signal"]
    # The activities it schedules, and the ones it can.
    scheduled = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events_of(
            await history(client, chat.id), EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        )
    }
    assert scheduled == {MODEL_ACTIVITY, TOOL_ACTIVITY} == KNOWN_NAMES["activity"]
    assert KNOWN_NAMES["workflow"] == {WORKFLOW_TYPE}


def _team_activity(name: str) -> Callable[[str], Awaitable[str]]:
    async def run(word: str) -> str:
        return f"{name}:{word}"

    return activity.defn(name=name)(run)


GENERIC = ("model_call", "tool_call", "mcp_call", "sub_agent_pending", "sub_agent_resume")


async def test_a_teams_own_activities_of_generic_names_run_beside_the_agents(client):
    """The plugin adds the product's activities to the team's own worker, where one name can be
    registered once: each of them is under ``ACTIVITY_PREFIX``, so a team's own ``tool_call``
    (once a name of ours) neither stops the worker from starting nor is shadowed."""
    plugin = AgentsPlugin(agents=[t.ops_agent()], gemini=ScriptedModel([]).client())
    assert all(name.startswith(ACTIVITY_PREFIX) for name in (MODEL_ACTIVITY, TOOL_ACTIVITY))
    theirs = plugged(client, plugin)
    queue = f"team-{uuid.uuid4()}"
    team = [_team_activity(name) for name in GENERIC]
    async with Worker(theirs, task_queue=queue, workflows=[CallOne], activities=team):
        for name in GENERIC:  # the team's, not ours, answer to the bare names
            got = await theirs.execute_workflow(
                CallOne.run, name, id=f"one-{uuid.uuid4()}", task_queue=queue
            )
            assert got == f"{name}:hi"

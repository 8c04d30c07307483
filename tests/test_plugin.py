"""``AgentsPlugin`` on a team's own client and worker, beside the team's own workflow.

A team that already runs Temporal connects its client with the plugin and builds its own
``Worker``: the agents' workflow and activities join the team's, on the team's task queue, and
the team's own workflow keeps running on the same worker.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from temporal_agent_interrupts import AgentClient, AgentsPlugin, FinishReason, approve
from temporal_agent_interrupts.codec import AgentPayloadConverter
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.plugin import PLUGIN_NAME
from temporal_agent_interrupts.worker.sandbox import PASSTHROUGH, GuardedRunner, OurRunner
from temporal_agent_interrupts.worker.search_attributes import (
    MissingSearchAttributes,
    check_search_attributes,
    missing_search_attributes,
    setup_search_attributes,
)
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES
from tests import agents as test_agents
from tests.helpers import create_namespace, server_address
from tests.team_workflow import GreetingWorkflow, shout


def plugged(client: Client, plugin: AgentsPlugin) -> Client:
    """The team's ``Client.connect(..., plugins=[plugin])``, on the session's connection."""
    config = client.config()
    config["data_converter"] = type(config["data_converter"]).default  # the team's: the SDK's
    config["plugins"] = [plugin]
    return Client(**config)


async def test_the_plugin_hosts_agents_beside_the_teams_own_workflow(client):
    model = ScriptedModel([calls(("lookup", {"key": "k"})), text("found K")])
    gemini = model.client()
    ops = test_agents.ops_agent()  # lookup is gated by its ToolApproval
    plugin = AgentsPlugin(agents=[ops], gemini=gemini)
    theirs = plugged(client, plugin)
    assert issubclass(theirs.data_converter.payload_converter_class, AgentPayloadConverter)
    queue = f"team-{uuid.uuid4()}"
    async with Worker(
        theirs, task_queue=queue, workflows=[GreetingWorkflow], activities=[shout]
    ) as worker:
        # The plugin's additions sit beside the team's, which are all still there.
        active = worker.config(active_config=True)
        assert active.get("workflows") == [GreetingWorkflow, AgentWorkflow]
        activities = list(worker.config(active_config=True).get("activities") or ())
        assert activities[0] is shout
        assert activities[1:] == plugin.agent_activities.activities()
        assert isinstance(worker.config(active_config=True).get("workflow_runner"), OurRunner)

        greeting = await theirs.execute_workflow(
            GreetingWorkflow.run, "ada", id=f"greet-{uuid.uuid4()}", task_queue=queue
        )
        assert greeting == "ADA!"

        agents = AgentClient(theirs, task_queue=queue)
        chat = await agents.chat(ops.name)
        paused = await chat.send("look k up")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        (call,) = paused.interrupts
        assert call.name == "lookup" and test_agents.RUNS["lookup"] == 0  # gated: not run yet
        done = await chat.resume(answers=[approve(call)])
        assert done.finish_reason == FinishReason.STOP and done.text == "found K"
        assert test_agents.RUNS["lookup"] == 1
        (response,) = model.requests[1].function_responses()
        assert response["response"] == {"key": "k", "value": "K"}
    await model.release(gemini)


async def test_the_plugin_on_a_worker_alone_is_refused_with_what_to_do(client):
    plugin = AgentsPlugin(agents=[test_agents.assistant], gemini=ScriptedModel().client())
    bare = Client(**{**client.config(), "data_converter": type(client.data_converter).default})
    with pytest.raises(ValueError, match=r"not on its client.*plugins=\[AgentsPlugin"):
        Worker(bare, task_queue=f"never-{uuid.uuid4()}", plugins=[plugin])


# The SDK's own warning (the same plugin type on the client and the worker) comes first; ours
# refuses where it only warns.
@pytest.mark.filterwarnings("ignore:The same plugin type")
async def test_the_plugin_twice_is_refused(client):
    plugin = AgentsPlugin(agents=[test_agents.assistant], gemini=ScriptedModel().client())
    theirs = plugged(client, plugin)
    with pytest.raises(ValueError, match="AgentWorkflow is already on this worker"):
        Worker(
            theirs,
            task_queue=f"never-{uuid.uuid4()}",
            plugins=[AgentsPlugin(agents=[test_agents.assistant])],
        )
    with pytest.raises(ValueError, match="already carries an AgentsPlugin"):
        build_worker(theirs, agents=[test_agents.assistant], task_queue=f"never-{uuid.uuid4()}")


async def test_a_sandbox_the_team_configured_keeps_its_restrictions_and_gains_the_passthrough(
    client,
):
    plugin = AgentsPlugin(agents=[test_agents.assistant], gemini=ScriptedModel().client())
    theirs = plugged(client, plugin)
    restrictions = SandboxRestrictions.default.with_passthrough_modules("their_models")
    worker = Worker(
        theirs,
        task_queue=f"never-{uuid.uuid4()}",
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    runner = worker.config(active_config=True).get("workflow_runner")
    # Ours (its instances guard queries, worker.sandbox.QueryTimeGuard), with their restrictions.
    assert isinstance(runner, OurRunner)
    passed = runner.restrictions.passthrough_modules
    assert "their_models" in passed and set(PASSTHROUGH) <= passed
    # Unsandboxed is the team's own decision: kept, with the guard in front of it.
    unsandboxed = UnsandboxedWorkflowRunner()
    kept = Worker(theirs, task_queue=f"never-{uuid.uuid4()}", workflow_runner=unsandboxed)
    guarded = kept.config(active_config=True).get("workflow_runner")
    assert isinstance(guarded, GuardedRunner) and guarded.inner is unsandboxed


def test_the_plugin_configures_a_replayer_too():
    plugin = AgentsPlugin(agents=[test_agents.assistant], gemini=ScriptedModel().client())
    replayer = Replayer(workflows=[], plugins=[plugin])
    config = replayer.config(active_config=True)
    assert config.get("workflows") == [AgentWorkflow]
    converter = config.get("data_converter")
    assert converter is not None
    assert issubclass(converter.payload_converter_class, AgentPayloadConverter)
    assert plugin.name() == PLUGIN_NAME


def test_the_plugin_needs_agents():
    with pytest.raises(ValueError, match="at least one agent"):
        AgentsPlugin(agents=[])


async def test_a_worker_of_the_plugin_refuses_a_namespace_without_the_search_attributes(client):
    namespace = f"fintech-{uuid.uuid4().hex[:8]}"
    await create_namespace(client, namespace)
    plugin = AgentsPlugin(agents=[test_agents.ops_agent()], gemini=ScriptedModel().client())
    theirs = plugged(Client(**{**client.config(), "namespace": namespace}), plugin)
    wanted = sorted(key.name for key in SEARCH_ATTRIBUTES)
    assert sorted(await missing_search_attributes(theirs)) == wanted
    queue = f"team-{uuid.uuid4()}"

    def team_worker() -> Worker:
        return Worker(theirs, task_queue=queue, workflows=[GreetingWorkflow], activities=[shout])

    async def in_async_with() -> None:
        async with team_worker():
            await asyncio.Event().wait()  # the refusal cancels this

    # Both ways a team runs a worker end in the refusal, at once, instead of a first send whose
    # workflow tasks all fail; the message names the namespace and the command that fixes it.
    async def run() -> None:
        await team_worker().run()

    for start in (in_async_with, run):
        with pytest.raises(MissingSearchAttributes) as refused:
            await start()
        message = str(refused.value)
        assert f"namespace {namespace!r} lacks" in message
        assert (
            f"TEMPORAL_ADDRESS={server_address(client)} TEMPORAL_NAMESPACE={namespace} "
            "agent-worker --setup-search-attributes"
        ) in message
        assert "setup_search_attributes(client)" in message
    # The public fix, from Python; then the same worker starts and serves.
    assert sorted(await setup_search_attributes(theirs)) == wanted
    assert await setup_search_attributes(theirs) == []  # once is enough
    async with team_worker():
        greeting = await theirs.execute_workflow(
            GreetingWorkflow.run, "ada", id=f"greet-{uuid.uuid4()}", task_queue=queue
        )
    assert greeting == "ADA!"


async def test_a_namespace_found_complete_is_asked_once_and_a_refusal_every_time(
    client, monkeypatch
):
    """``agent-worker`` checks before it builds its worker and the plugin checks as that worker
    starts: the second check asks the server nothing. A refusal is never kept, so a namespace
    fixed after one starts its next worker."""
    namespace = f"fintech-{uuid.uuid4().hex[:8]}"
    await create_namespace(client, namespace)
    theirs = Client(**{**client.config(), "namespace": namespace})
    operator = theirs.operator_service
    original = operator.list_search_attributes
    asked: list[str] = []

    async def counted(request, **kwargs):
        asked.append(request.namespace)
        return await original(request, **kwargs)

    monkeypatch.setattr(operator, "list_search_attributes", counted)
    for _ in range(2):
        with pytest.raises(MissingSearchAttributes):
            await check_search_attributes(theirs)
    assert asked == [namespace, namespace]
    await setup_search_attributes(theirs)
    asked.clear()
    for _ in range(3):
        await check_search_attributes(theirs)
    assert asked == [namespace]

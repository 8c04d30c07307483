"""Record the histories under tests/histories/ (after a deliberate change to the workflow).

    .venv/bin/python -m tests.histories.record [NAME ...]   # default: all of them

Each file is a real conversation recorded on a dev server, by the scenario of the same name in
``tests/scenarios.py``: ``rich`` (parallel calls, a gate, restarts, partial answers, signals,
failed and cancelled turns), ``spine`` (every kind of turn event), ``edges`` (cancellations
racing pauses), ``durable`` (what the door refuses), ``governance`` (verified votes to a quorum
by update and signal, an edit through the gate, a deadline that reminds, escalates and
cancels), ``banking`` (the README's example on the offline model), ``streamed`` (streamed turns,
one paused and answered), ``mcp`` (an MCP server's tools: one runs, one approved, one denied, one
whose server asks for input),
``subagent`` and ``subagent_child`` (a supervisor and its payments sub-agent, the child's gate
answered through the supervisor), and ``continued_first`` and ``continued_last``: the first and the
newest run of a conversation that continued as new, idle and then paused; and
``subagent_continued_first`` and ``subagent_continued_last``: the first and the newest run of a
supervisor that continued as new while it waited on its sub-agent.

The replay tests run them against the current workflow code in the strict sandbox, so a change
that would break conversations in flight fails CI. Before the first release there is one
baseline: a change to the workflow re-records them all. From the first release on, a change
that replays differently is a ``workflow.patched()`` and keeps the old files beside new ones
(README, "Versioning").
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client

from temporal_agent_interrupts import Agent, AgentClient
from temporal_agent_interrupts.mcp import MCPServerStdio, mcp_tools
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond
from temporal_agent_interrupts.worker.standin import GeminiStandIn
from temporal_agent_interrupts.worker.testing import ScriptedModel, dev_server
from tests import agents as t
from tests.helpers import RESULT_KEYS, SUGGEST_AFTER_EVENTS
from tests.scenarios import (
    banking_conversation,
    cancel_edges_conversation,
    continued_conversation,
    dump_history,
    durable_conversation,
    governance_conversation,
    mcp_conversation,
    rich_conversation,
    spine_conversation,
    streamed_conversation,
    sub_agent_continued_conversation,
    sub_agent_conversation,
)

# The suite's key (tests/conftest.py): the replay tests check the recorded seals with it.
os.environ["AGENT_RESULT_KEYS"] = RESULT_KEYS

HERE = Path(__file__).parent
ALL = (
    "rich",
    "banking",
    "edges",
    "durable",
    "spine",
    "governance",
    "streamed",
    "mcp",
    "subagent",
    "subagent_child",
    "continued_first",
    "continued_last",
    "subagent_continued_first",
    "subagent_continued_last",
)
CONTINUED = {"continued_first", "continued_last"}
SUB = {"subagent", "subagent_child"}
SUB_CONTINUED = {"subagent_continued_first", "subagent_continued_last"}


async def main(names: set[str]) -> None:
    scenarios = {
        "rich": rich_conversation,
        "edges": cancel_edges_conversation,
        "durable": durable_conversation,
        "spine": spine_conversation,
        "governance": governance_conversation,
        "streamed": streamed_conversation,
    }
    async with dev_server() as env:
        with GeminiStandIn(respond) as offline:
            for name, scenario in scenarios.items():
                if name not in names:
                    continue
                # A model of its own: scenarios count the model's calls from zero.
                model = ScriptedModel()
                async with build_worker(
                    env.client, agents=t.ALL, task_queue=f"record-{name}", gemini=model.client()
                ):
                    agents = AgentClient(env.client, task_queue=f"record-{name}")
                    await scenario(agents, model, chat_id=name)
            async with build_worker(
                env.client, agents=t.ALL, task_queue="record-bank", gemini=offline.client()
            ):
                if "banking" in names:
                    await banking_conversation(
                        AgentClient(env.client, task_queue="record-bank"), chat_id="banking"
                    )
            if "mcp" in names:
                await record_mcp(env.client, offline)
            child = None
            if names & SUB:
                async with build_worker(
                    env.client,
                    agents=[t.supervisor],
                    task_queue="record-sub",
                    gemini=offline.client(),
                ):
                    child = await sub_agent_conversation(
                        AgentClient(env.client, task_queue="record-sub"), chat_id="subagent"
                    )
            continued: list[str] = []
            if names & SUB_CONTINUED:
                async with build_worker(
                    env.client,
                    agents=[t.supervisor],
                    task_queue="record-sub-continued",
                    gemini=offline.client(),
                ):
                    continued = await sub_agent_continued_conversation(
                        AgentClient(env.client, task_queue="record-sub-continued"),
                        chat_id="subagent_continued",
                    )
        for name in sorted(names - CONTINUED - SUB - SUB_CONTINUED):
            await write(name, await dump_history(env.client, name))
        if child is not None:
            for name, chat in (("subagent", "subagent"), ("subagent_child", child)):
                if name in names:
                    await write(name, await dump_history(env.client, chat))
        if continued:
            # The run that left the call to the next, and the newest: the one that took it up.
            for name, run_id in (
                ("subagent_continued_first", continued[0]),
                ("subagent_continued_last", continued[-1]),
            ):
                if name in names:
                    text = await dump_history(env.client, "subagent_continued", run_id=run_id)
                    await write(name, text)
    if names & CONTINUED:
        await record_continued(names & CONTINUED)


async def record_mcp(client: Client, offline: GeminiStandIn) -> None:
    """On a stdio MCP server from ``tests/mcp_servers.py``, which the worker starts."""
    with tempfile.TemporaryDirectory() as state:
        server = MCPServerStdio(
            "records",
            sys.executable,
            ["-m", "tests.mcp_servers", "stdio", state],
            cwd=str(HERE.parent.parent),
        )
        agent = Agent("recordsAgent", tools=[mcp_tools(server)])
        async with build_worker(
            client, agents=[agent], task_queue="record-mcp", gemini=offline.client()
        ):
            agents = AgentClient(client, task_queue="record-mcp")
            await mcp_conversation(agents, chat_id="mcp", agent=agent.name)


async def record_continued(names: set[str]) -> None:
    """On a server that suggests continue-as-new early (as the tests' ``small_histories``)."""
    suggest = f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER_EVENTS}"
    async with dev_server(extra_args=["--dynamic-config-value", suggest]) as env:
        model = ScriptedModel()
        async with build_worker(
            env.client, agents=t.ALL, task_queue="record", gemini=model.client()
        ):
            agents = AgentClient(env.client, task_queue="record")
            runs = await continued_conversation(
                agents, model, chat_id="continued", suggest_after=SUGGEST_AFTER_EVENTS
            )
        assert len(runs) >= 2, runs
        # The newest run that did work: once the answered turn ends, the server may suggest
        # continue-as-new again, and a run that has only just started holds no workflow task
        # to replay (a replayer waits for one forever).
        texts = {run: await dump_history(env.client, "continued", run_id=run) for run in runs}
        worked = [run for run in runs if texts[run].count('"eventType"') > 3]
        assert len(worked) >= 2, runs
        for name, run_id in (("continued_first", worked[0]), ("continued_last", worked[-1])):
            if name in names:
                await write(name, texts[run_id])


async def write(name: str, text: str) -> None:
    (HERE / f"{name}.json").write_text(text)
    print(f"wrote tests/histories/{name}.json")


if __name__ == "__main__":
    asyncio.run(main(set(sys.argv[1:]) or set(ALL)))
    os._exit(0)  # skip interpreter teardown, where the SDK can abort (sdk-python issue 300)

"""A worker process hosting an agent with an HTTP MCP server's tools, for the test that kills
it mid-call (``tests/test_mcp_tools.py``): ``python -m tests.mcp_worker ADDRESS NAMESPACE QUEUE
URL``. It prints ``ready`` once it polls its task queue."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio.client import Client

from temporal_agent_interrupts import Agent
from temporal_agent_interrupts.mcp import MCPServerHTTP, mcp_tools
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel
from tests.mcp_servers import TOKEN

AGENT = "records-worker-agent"

STICKY_TIMEOUT = timedelta(seconds=1)
"""How long a workflow task waits on this worker's sticky queue before any worker may take it:
with the SDK's default (10 s), the killed worker's conversation stalled that long after its call
ended, before the fresh worker could take it (as in ``tests/sub_agent_worker.py``)."""


def agent(url: str) -> Agent:
    server = MCPServerHTTP("records", url, headers={"Authorization": f"Bearer {TOKEN}"})
    # A call's own timeout, well under the slow server's wait: the run cut short by the kill
    # is reported, not run again.
    return Agent(AGENT, tools=[mcp_tools(server, timeout=timedelta(seconds=6))])


async def main(address: str, namespace: str, queue: str, url: str) -> None:
    client = await Client.connect(address, namespace=namespace)
    model = ScriptedModel(offline_rules)
    async with build_worker(
        client,
        agents=[agent(url)],
        task_queue=queue,
        gemini=model.client(),
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

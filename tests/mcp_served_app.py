"""A second process of the MCP-served agents app, for ``tests/test_mcp_served_agent.py``:
``python -m tests.mcp_served_app QUEUE AGENT PORT``, connected as ``TEMPORAL_ADDRESS`` says,
sealing with the keys ``AGENT_MCP_STATE_KEYS`` holds. It shares nothing with the test's own app
but those keys and the Temporal server. It prints ``serving`` once it listens."""

from __future__ import annotations

import asyncio
import sys

from temporal_agent_interrupts.client.api import AgentClient, run_script
from temporal_agent_interrupts.client.mcp_server import agents_mcp_app
from temporal_agent_interrupts.client.web import serve
from tests.mcp_identity import bearer_name


async def main(queue: str, agent: str, port: int) -> None:
    agents = await AgentClient.connect(task_queue=queue)
    app = agents_mcp_app(agents, agents=[agent], identity=bearer_name)  # keys: the variable
    ready = asyncio.Event()
    serving = asyncio.create_task(serve(app, port=port, ready=ready))
    await ready.wait()
    print("serving", flush=True)
    await serving


if __name__ == "__main__":
    run_script(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

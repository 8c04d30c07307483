"""A worker process hosting the Slack tests' agent, for the test that SIGKILLs it while its post
to Slack waits for an answer (``tests/test_slack_messages.py``): ``python -m tests.slack_worker
ADDRESS NAMESPACE QUEUE SLACK_URL``. It prints ``ready`` once it polls its task queue."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio.client import Client

from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.hosting import SlackChannel, SlackDirectory
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.testing import ScriptedModel
from tests.slack_standin import TOKEN
from tests.test_presentation import send_payment

AGENT = "slack-desk"
CFO, TREASURER, OUTSIDER = "U0CFO", "U0TREASURY", "U0NOBODY"
CHANNEL = "C0APPROVALS"

DIRECTORY = SlackDirectory(
    users={CFO: "cfo@example.com", TREASURER: "treasurer@example.com"},
    groups={"treasury": ["treasurer@example.com"]},
    team="T0TEAM",
)

STICKY_TIMEOUT = timedelta(seconds=1)
"""How long a workflow task waits on this worker's sticky queue before any worker may take it
(the SDK's 10 s would stall the conversation that long after the kill)."""


def agent(*, name: str = AGENT, approvers: list[str] | None = None) -> Agent:
    """The Slack tests' payments agent: every payment waits for an approver, and each pause is
    announced on the ``slack`` channel."""
    return Agent(
        name,
        model="gemini-test",
        tools=[send_payment],
        middleware=[
            ToolApproval(approvers=approvers or ["cfo@example.com", "treasurer@example.com"])
        ],
        notify=["slack"],
    )


def channel(url: str, *, dm: bool = False) -> SlackChannel:
    return SlackChannel(
        token=TOKEN,
        channel=CHANNEL,
        dm=DIRECTORY if dm else None,
        inbox_url="https://approvals.example.com",
        base_url=f"{url}/api/",
    )


async def main(address: str, namespace: str, queue: str, url: str) -> None:
    client = await Client.connect(address, namespace=namespace)
    model = ScriptedModel(offline_rules)
    async with build_worker(
        client,
        agents=[agent()],
        task_queue=queue,
        gemini=model.client(),
        channels={"slack": channel(url)},
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

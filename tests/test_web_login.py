"""The web app behind a login (client/web.py's identity), against a real dev server over HTTP.

An application mounts the app behind its own login. What an approver's answer carries to the
conversation is never the login itself: the app verifies the login (its own hook), then signs a
short assertion of its own for that one answer, bound to the chat, the call and the input shown,
which the agent verifies as it verifies any identity token (``Agent(trust=...)`` lists the app's
public key). What is proved here:

- a login token (a one-hour JWT, sent over HTTP) appears in no event of the chat's history;
- the same approver answers a second call of the same chat (each answer has its own assertion);
- an HS256 login (a secret only the app holds) answers, through the app's hook;
- an assertion answers nothing but the call it was made for, in the chat it was made for;
- a token is sent only to the run the app checked (its task queue), not to a run that took the
  chat's id in between.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import httpx2
import pytest
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.client import web
from temporal_agent_interrupts.client.api import AgentClient, Chat
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import calls
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    StatusResult,
    TurnResult,
    input_digest,
)
from tests import agents as t
from tests.web import answer, served

LOOKUP = {"key": "k"}
RELEASE = {"service": "api", "version": "2"}
TWO = calls(("lookup", LOOKUP, "g1"), ("release", RELEASE, "r1"))
"""One model message with two gated calls."""


def gated(trust: Any, *, approvers: Sequence[str] = ("ann@example.com",)) -> Agent:
    return Agent(
        f"login-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup, t.release],
        middleware=[ToolApproval(allow=[], approvers=list(approvers))],
        trust=trust,
    )


async def paused(agents: AgentClient, agent: Agent) -> tuple[Chat, dict[str, str]]:
    chat = await agents.chat(agent.name)
    result = await chat.send("look k up and release api 2")
    assert [i.ref for i in result.interrupts] == ["g1", "r1"]
    return chat, {i.ref: i.input_digest for i in result.interrupts}


# ----------------------------------------------------------------------------------------------
# A token goes to the run whose task queue was checked, not to whatever holds the chat id next.

CAUGHT: list[Any] = []
"""What the impostor's worker was sent (it runs unsandboxed, in this process)."""


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class Impostor:
    """A workflow named like ours on a task queue of its own, polled by a worker of its own,
    started under a real chat's id once that chat's run is gone (terminating and starting
    workflows is what namespace write access grants). It shows the real chat's pending call."""

    @workflow.run
    async def run(self, agent: str) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query(dynamic=True)
    def any_query(self, name: str, args: Sequence[RawValue]) -> Any:
        paused = InterruptRequest(
            name="lookup", ref="g1", input=LOOKUP, source="approval",
            input_digest=input_digest(LOOKUP),
        )  # fmt: skip
        return StatusResult(
            chat_id=workflow.info().workflow_id,
            agent=workflow.memo_value("agent", "", type_hint=str),
            status="interrupted", turns=1, pending=[paused],
        ).model_dump(mode="json")  # fmt: skip

    @workflow.update(dynamic=True)
    async def any_update(self, name: str, args: Sequence[RawValue]) -> Any:
        CAUGHT.append(workflow.payload_converter().from_payload(args[0].payload))
        return TurnResult(turn=1, finish_reason=FinishReason.STOP).model_dump(mode="json")


@pytest.mark.parametrize("when", ["after the check", "as the answer is sent"])
async def test_a_token_goes_only_to_the_run_whose_task_queue_was_checked(
    run_worker, model, client, monkeypatch, when
):
    """``may_receive_token`` describes the chat (its latest run, on a trusted queue); the answer
    then went to the chat's latest run, whichever it was by then. A namespace holder who replaces
    the run in between (terminate, start an impostor under the same id on a queue of their own)
    received the approver's token. The answer is now pinned to the run that was checked: sent
    to a run that is gone, it is refused there, and the chat's run is checked again."""
    CAUGHT.clear()
    issuer = TokenIssuer("ES256")
    agent = gated(issuer.trust())
    model.reply(TWO)
    theirs = f"evil-{uuid.uuid4()}"
    async with (
        run_worker(agents=[agent]) as agents,
        Worker(
            client,
            task_queue=theirs,
            workflows=[Impostor],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
    ):
        chat, digest = await paused(agents, agent)
        replaced: list[str] = []

        async def replace(chat_id: str) -> None:
            if replaced:
                return
            replaced.append(chat_id)
            await client.get_workflow_handle(chat_id).terminate("replaced")
            await client.start_workflow(
                "AgentWorkflow", agent.name, id=chat_id, task_queue=theirs,
                memo={"agent": agent.name},
            )  # fmt: skip

        if when == "after the check":
            checked = web._App.may_receive_token

            async def racing(self: Any, target: Chat) -> Any:
                said = await checked(self, target)
                await replace(target.id)
                return said

            monkeypatch.setattr(web._App, "may_receive_token", racing)
        else:
            sent_by = Chat.resume

            async def sending(self: Chat, **kwargs: Any) -> Any:
                await replace(self.id)
                return await sent_by(self, **kwargs)

            monkeypatch.setattr(Chat, "resume", sending)
        token = issuer.mint("ann@example.com")
        app = agents_app(agents, identity="bearer")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await answer(
                http,
                base,
                chat.id,
                "g1",
                {"action": "approve", "input_digest": digest["g1"]},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert replaced
        sent = [c.get("identity_token") for c in CAUGHT if isinstance(c, dict)]
        assert token not in sent, f"the token went to the impostor's worker ({r.status_code})"
        assert r.status_code == 403 and "does not send identity tokens" in r.text, r.text
        await client.get_workflow_handle(chat.id).terminate("test over")

"""``agent_tool``: another agent, offered to the model as a tool.

A call of it is a conversation with that agent, run as a child workflow of the caller's (see
``workflows.turn.TurnMachine._run_sub_agent``): its own history, search attributes and audit
trail, its id the caller's chat id and the call's ref (``workflows.turn.sub_agent_id``). The
model's ``input`` is its first message; its final text is the call's output. Its interrupts
wait in the child, by the child's rules; the worker hosting the caller hosts the sub-agent too
(:func:`with_sub_agents`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.heartbeat import heartbeating
from temporal_agent_interrupts.workflows.agent import Agent
from temporal_agent_interrupts.workflows.config import (
    SUB_AGENT_HEARTBEAT_EVERY,
    SUB_AGENT_PENDING_ACTIVITY,
    SUB_AGENT_RESUME_ACTIVITY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.types import (
    PendingResult,
    SubAgentPendingInput,
    SubAgentRef,
    SubAgentResumeInput,
    SubAgentResumeResult,
    ToolSpec,
)


class SubAgentInput(BaseModel):
    """What the model gives a sub-agent: its task, in words."""

    input: str = Field(description="The task for the sub-agent, as a message to it.")


@dataclass(frozen=True)
class AgentTool:
    """Another agent as a tool. Build one with :func:`agent_tool`."""

    agent: Agent
    _: KW_ONLY
    name: str
    description: str

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=SubAgentInput.model_json_schema(),
            agent=SubAgentRef(agent=self.agent.name),
        )


def agent_tool(
    agent: Agent, *, name: str | None = None, description: str | None = None
) -> AgentTool:
    """Offer ``agent`` to another agent's model as a tool.

    Each call starts a conversation with ``agent`` (a child workflow of the caller's) with the
    model's ``input`` as its first message, and returns ``{"text": its final reply, "chat_id":
    the child's chat id}``. While the child waits on a person, the call waits with it; answer
    the child's interrupts on the child's chat (``agents.chat(agent, chat_id=...)``, the inbox
    lists them under the child's chat id). A child that fails fails the call classified.

    Args:
        agent: The sub-agent. The worker that hosts the calling agent hosts it too.
        name: The tool's durable name (default: the agent's name).
        description: What the model reads about it (default: "Ask the NAME agent.").
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"agent_tool takes an Agent, not {type(agent).__name__}")
    return AgentTool(
        agent,
        name=name or agent.name,
        description=description or f"Ask the {agent.name} agent.",
    )


def _reachable(agents: Sequence[Agent]) -> Iterator[Agent]:
    seen: set[int] = set()
    todo = list(agents)
    while todo:
        agent = todo.pop(0)
        if id(agent) in seen:
            continue
        seen.add(id(agent))
        yield agent
        todo.extend(t.agent for t in agent.own_tools() if isinstance(t, AgentTool))


def with_sub_agents(agents: Sequence[Agent]) -> list[Agent]:
    """``agents`` and every agent they call through :func:`agent_tool`, however deep, once each.

    Raises:
        ValueError: two different agents share a name.
    """
    found: dict[str, Agent] = {}
    for agent in _reachable(agents):
        other = found.setdefault(agent.name, agent)
        if other is not agent and other != agent:
            raise ValueError(f"two different agents are named {agent.name!r}")
    return list(found.values())


# ----------------------------------------------------------------------------------------------
# The activities a caller's workflow runs to see and answer its sub-agents' interrupts: a
# workflow can neither query another workflow nor wait for another's update.


def _scheduled_by_parent(input: SubAgentPendingInput | SubAgentResumeInput) -> None:
    """Refuse unless a conversation scheduled this for a child of its own (chat--ref...).

    As the tool activities (``activities.runtime``): whoever may start activities could
    otherwise start these standalone, or from a workflow of their own, and have this worker
    query or answer any conversation, under its identity and with its payload keys.

    Raises:
        ApplicationError: non-retryable ``NotScheduledByConversation``.
    """
    info = activity.info()
    if (
        info.in_workflow
        and info.workflow_type == WORKFLOW_TYPE
        and input.chat_id.startswith(f"{info.workflow_id}--")
    ):
        return
    raise ApplicationError(
        "refused: sub-agent activities act only when scheduled by the conversation that "
        "called the sub-agent",
        type="NotScheduledByConversation",
        non_retryable=True,
    )


def _child(input: SubAgentPendingInput | SubAgentResumeInput) -> WorkflowHandle[Any, Any]:
    _scheduled_by_parent(input)
    # The chain the caller started (first_execution_run_id): a workflow of the same id that
    # someone else started later is not its child, and is not asked.
    return activity.client().get_workflow_handle(input.chat_id, first_execution_run_id=input.run_id)


@activity.defn(name=SUB_AGENT_PENDING_ACTIVITY)
async def sub_agent_pending(input: SubAgentPendingInput) -> PendingResult:
    """A child conversation's pending interrupts, as its ``pending`` query gives them."""
    async with heartbeating(SUB_AGENT_HEARTBEAT_EVERY):
        return await _pending(input)


async def _pending(input: SubAgentPendingInput) -> PendingResult:
    from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

    handle = _child(input)
    # A query names a run, never a chain (it ignores first_execution_run_id): find the chain's
    # current run and ask that one, so a workflow someone else started under the id after the
    # child closed is never read as the child.
    desc = await handle.describe()
    if desc.raw_description.workflow_execution_info.first_run_id != input.run_id:
        raise ApplicationError(
            f"{input.chat_id!r} is no longer the chain this conversation started",
            type="NotTheChild",
            non_retryable=True,
        )
    run = activity.client().get_workflow_handle(input.chat_id, run_id=desc.run_id)
    return await run.query(AgentWorkflow.pending)


def forward_update_id(info: activity.Info, answer: bytes) -> str:
    """The id of the child's ``resume`` update that one forwarding (one scheduled activity)
    gives: the same on every attempt, so a retry gets the outcome of the update an earlier
    attempt started (Temporal keeps one update per id) instead of answering again. The
    answer's digest is part of it: an update someone else sent the child first under the id
    (it is guessable) is taken for this one only if it gave the very same answer."""
    digest = hashlib.sha256(answer).hexdigest()[:32]
    return f"forward-{info.workflow_run_id}-{info.activity_id}-{digest}"


@activity.defn(name=SUB_AGENT_RESUME_ACTIVITY)
async def sub_agent_resume(input: SubAgentResumeInput) -> SubAgentResumeResult:
    """Give a child conversation an answer through its ``resume`` update, which checks it by
    the child's own rules (approvers, quorum, trust, what is pending there).

    The update returns when the child's turn stops again, which may take as long as its tools
    and model do: this heartbeats meanwhile, so a worker lost mid-wait is noticed in seconds,
    and the retry (on another worker) gets that same update's outcome, by its id, even once
    the child has closed: the child takes the answer once.
    """
    from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

    handle = _child(input)
    payload = activity.payload_converter().to_payload(input.resume)
    try:
        async with heartbeating(SUB_AGENT_HEARTBEAT_EVERY):
            result = await handle.execute_update(
                AgentWorkflow.resume,
                RawValue(payload),
                id=forward_update_id(activity.info(), payload.data),
            )
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError) and cause.non_retryable:
            return SubAgentResumeResult(refused=cause.message)
        raise
    return SubAgentResumeResult(result=result)

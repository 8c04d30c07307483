"""``agent_tool``: another agent, offered to the model as a tool.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts``.

A call of it is a conversation with that agent, run as a child workflow of the caller's (see
``workflows.subagents.SubAgentCalls.run``): its own history, search attributes and audit
trail, its id the caller's chat id and the call's ref (``workflows.ids.sub_agent_id``). The
model's ``input`` is its first message; its final text is the call's output. Its interrupts
wait in the child, by the child's rules; the worker hosting the caller hosts the sub-agent too
(:func:`with_sub_agents`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.update.v1 import Outcome
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.activities.heartbeat import heartbeating
from temporal_agent_interrupts.activities.sealing import binding
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentEnd,
    SubAgentEndStatus,
    SubAgentPendingInput,
    SubAgentPendingResult,
    SubAgentResumeInput,
    SubAgentResumeResult,
)
from temporal_agent_interrupts.workflows.agent import Agent
from temporal_agent_interrupts.workflows.config import (
    SUB_AGENT_ANSWER_HEARTBEAT,
    SUB_AGENT_ANSWER_UPDATE_PREFIX,
    SUB_AGENT_HEARTBEAT_EVERY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.payloads import refusal_code
from temporal_agent_interrupts.workflows.seal import ResultKeys
from temporal_agent_interrupts.workflows.types import (
    ConversationResult,
    PendingResult,
    SubAgentRef,
    ToolSpec,
    TurnResult,
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
    output: type[BaseModel] | None = None

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=SubAgentInput.model_json_schema(),
            agent=SubAgentRef(
                agent=self.agent.name,
                output_schema=self.output.model_json_schema() if self.output else None,
            ),
        )


def agent_tool(
    agent: Agent,
    *,
    name: str | None = None,
    description: str | None = None,
    output: type[BaseModel] | None = None,
) -> AgentTool:
    """Offer ``agent`` to another agent's model as a tool.

    Each call starts a conversation with ``agent`` (a child workflow of the caller's) with the
    model's ``input`` as its first message, and returns ``{"text": its final reply, "chat_id":
    the child's chat id}``. While the child waits on a person, the call waits with it, and the
    caller shows the child's interrupts (each with its ``path``); answer them there or on the
    child's own chat. A child that fails fails the call classified.

    With ``output``, the sub-agent's first message asks for one JSON object of that model's
    schema, and the call's output is ``{"output": the object, "chat_id": ...}``; an answer that
    does not fit is ``{"error": why, "text": the answer, "chat_id": ...}``, for the model to
    hear (it may ask again).

    Args:
        agent: The sub-agent. The worker that hosts the calling agent hosts it too.
        name: The tool's durable name (default: the agent's name).
        description: What the model reads about it (default: "Ask the NAME agent.").
        output: A pydantic model the sub-agent's answer must fit (default: plain text).
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"agent_tool takes an Agent, not {type(agent).__name__}")
    if output is not None and not (isinstance(output, type) and issubclass(output, BaseModel)):
        raise TypeError(f"output takes a pydantic model class, not {output!r}")
    return AgentTool(
        agent,
        name=name or agent.name,
        description=description or f"Ask the {agent.name} agent.",
        output=output,
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


async def sub_agent_pending(input: SubAgentPendingInput) -> SubAgentPendingResult:
    """A child conversation's pending interrupts, as its ``pending`` query gives them, with
    their digest; only "unchanged" when their digest is the one the caller last read
    (``input.known``), so that a report that changed nothing costs the caller's history a few
    bytes rather than the whole list."""
    async with heartbeating(SUB_AGENT_HEARTBEAT_EVERY):
        found = await _pending(input)
    if isinstance(found, SubAgentEnd):
        return SubAgentPendingResult(ended=found)
    digest = pending_digest(found)
    if input.known is not None and digest == input.known:
        return SubAgentPendingResult(digest=digest, unchanged=True)
    return SubAgentPendingResult(interrupts=found.interrupts, digest=digest)


def pending_digest(found: PendingResult) -> str:
    """What tells one pending list from another: a digest of it as the query gave it."""
    return hashlib.sha256(found.model_dump_json().encode()).hexdigest()[:32]


_ENDED: dict[WorkflowExecutionStatus, SubAgentEndStatus] = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
}


async def _pending(input: SubAgentPendingInput) -> PendingResult | SubAgentEnd:
    """What the child waits on; or, once its chain has closed, how it ended."""
    from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

    handle = _child(input)
    # A query names a run, never a chain (it ignores first_execution_run_id): find the chain's
    # current run and ask that one, so a workflow someone else started under the id after the
    # child closed is never read as the child.
    try:
        desc = await handle.describe()
        if desc.raw_description.workflow_execution_info.first_run_id != input.run_id:
            # Another chain holds the id now (started once the child's closed): the child's
            # chain is followed from its first run instead.
            desc = await _last_run_of_chain(input.chat_id, input.run_id)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return SubAgentEnd(status="gone")  # deleted (retention, or by hand)
        raise
    if desc is None:
        return SubAgentEnd(status="gone")
    run = activity.client().get_workflow_handle(
        input.chat_id, run_id=desc.run_id, result_type=ConversationResult
    )
    ended = _ENDED.get(desc.status) if desc.status is not None else None
    if ended == "completed":
        return SubAgentEnd(status="completed", result=await run.result(follow_runs=False))
    if ended is not None:
        return SubAgentEnd(status=ended)
    found = await run.query(AgentWorkflow.pending)
    if not found.interrupts and (await run.query(AgentWorkflow.status)).status == "closed":
        # Closing: its last report leaves before its run closes, and a caller that continued
        # as new hears of its end from no one else (but a recheck, much later). It closes
        # as soon as that report is out: wait for it here.
        try:
            return SubAgentEnd(status="completed", result=await run.result(follow_runs=False))
        except WorkflowFailureError as e:
            cancelled = isinstance(e.cause, CancelledError)
            return SubAgentEnd(status="cancelled" if cancelled else "failed")
    return found


async def _last_run_of_chain(
    chat_id: str, first_run_id: str
) -> WorkflowExecutionDescription | None:
    """The description of the newest run of the chain that began with ``first_run_id``, run by
    run through its continue-as-new links (each run's close event names the next); None past
    :data:`_CHAIN_HOPS` runs. Only asked once another chain holds the id, so the child's has
    closed: it has as many runs as it continued as new."""
    client = activity.client()
    run_id = first_run_id
    for _ in range(_CHAIN_HOPS):
        handle = client.get_workflow_handle(chat_id, run_id=run_id)
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            return desc
        following = ""
        closing = handle.fetch_history_events(
            event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
        )
        async for event in closing:
            continued = event.workflow_execution_continued_as_new_event_attributes
            following = continued.new_execution_run_id
        if not following:
            return None
        run_id = following
    return None


_CHAIN_HOPS = 256
"""Runs of a sub-agent's chain followed at most (a one-turn conversation continues as new only
when a flood of signals reaches it while it waits: every ten)."""


async def sub_agent_resume(input: SubAgentResumeInput, *, keys: ResultKeys) -> SubAgentResumeResult:
    """Give a child conversation an answer through its ``resume`` update, which checks it by
    the child's own rules (approvers, quorum, trust, what is pending there).

    Under an id of :data:`SUB_AGENT_ANSWER_UPDATE_PREFIX`: the child takes the answer into its
    history before it checks it, so one it refuses still spends its identity token there, as
    the caller's history (which holds the token) spends it in the caller.

    The update returns when the child's turn stops again, which may take as long as its tools
    and model do: this heartbeats meanwhile, so a worker lost mid-wait is noticed in seconds,
    and the retry (on another worker) gets that same update's outcome, by its id, even once
    the child has closed: the child takes the answer once.
    """
    from temporal_agent_interrupts.workflows.conversation import AgentWorkflow

    handle = _child(input)
    raw = RawValue(activity.payload_converter().to_payload(input.resume))
    update_id = _update_id(keys)
    try:
        # The same id in every attempt: a retry after a lost worker is answered with the first
        # attempt's outcome (Temporal keeps an update's outcome by its id, even once the child
        # has closed), and the answer is never given twice.
        async with heartbeating(
            SUB_AGENT_ANSWER_HEARTBEAT.total_seconds() / 4,
            # Unsealed only: there the id travels in the heartbeat, sent at once.
            details=() if keys.seals else (update_id,),
            at_once=not keys.seals,
        ):
            if activity.info().attempt > 1:
                # A retry: the child may have taken the first attempt's update and moved on.
                earlier = await _earlier_outcome(input, update_id)
                if earlier is not None:
                    return earlier
            result = await handle.execute_update(AgentWorkflow.resume, raw, id=update_id)
    except WorkflowUpdateFailedError as e:
        return _update_failed(e.cause or e)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            # Closed without this answer: an update it took is answered by its id even after
            # the child closes (so a retry of one that got there lands above), a new one is not.
            return SubAgentResumeResult(refused="the sub-agent's conversation has closed")
        raise
    return SubAgentResumeResult(result=result)


async def _earlier_outcome(
    input: SubAgentResumeInput, update_id: str
) -> SubAgentResumeResult | None:
    """The outcome of the update ``update_id``, when a run of the child's chain completed it
    (None: none did, so it is asked for by its id, which joins one still under way).

    Temporal answers an update sent again under its id only from the run that took it, while
    that run is the chain's current one: after the child continued as new (a flood of signals
    while it waits), a retry's update would reach the new run as a second answer (refused as
    given already, or, for a call paused again on the same ref, taken twice); after it closed
    in a later run, as an update for a closed conversation. Its history keeps the outcome:
    the chain's runs are read, first to last, each through its continue-as-new link (the first
    completion under the id is the answer's: anyone who read the id there could send an
    update of their own under it to a later run). Called within the activity's heartbeat.
    """
    _scheduled_by_parent(input)
    client = activity.client()
    run_id = input.run_id
    for _ in range(_CHAIN_HOPS):
        following = ""
        events = client.get_workflow_handle(input.chat_id, run_id=run_id).fetch_history_events()
        try:
            async for event in events:
                completed = event.workflow_execution_update_completed_event_attributes
                if (
                    event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
                    and completed.meta.update_id == update_id
                ):
                    return await _outcome(completed.outcome)
                continued = event.workflow_execution_continued_as_new_event_attributes
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                    following = continued.new_execution_run_id
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None  # past retention, or deleted: asked for by its id instead
            raise
        if not following:
            return None
        run_id = following
    return None


async def _outcome(outcome: Outcome) -> SubAgentResumeResult:
    """A completed update's outcome, as the first attempt would have returned it."""
    converter = activity.client().data_converter
    if outcome.HasField("failure"):
        return _update_failed(await converter.decode_failure(outcome.failure))
    (result,) = await converter.decode(outcome.success.payloads, [TurnResult])
    return SubAgentResumeResult(result=result)


def _update_failed(cause: BaseException) -> SubAgentResumeResult:
    """A failed ``resume`` update of the child: its refusal (a non-retryable ApplicationError:
    the child's rules said no), or else a failure of the call, raised as non-retryable (the
    update's own outcome: a retry under its id would only be told it again)."""
    if isinstance(cause, ApplicationError) and cause.non_retryable:
        return SubAgentResumeResult(refused=cause.message, code=refusal_code(cause))
    raise ApplicationError(
        f"the sub-agent's update failed: {cause}",
        type="SubAgentUpdateFailed",
        non_retryable=True,
    ) from cause


def _update_id(keys: ResultKeys) -> str:
    """The child update's id: the same in every attempt of this activity, and known to no one
    without the workers' result key.

    Not derived from the caller's run alone: a workflow's ids are predictable (its random
    numbers are seeded from its run id), and whoever may answer the child could send an update
    of their own under the id first, which Temporal would then give as this answer's outcome.
    So it is a MAC, under the result key, of this very activity (workflow id and activity id):
    a retry works it out again, and nothing outside the workers chooses or erases it (a
    heartbeat sent by id could do both, when the id travelled there). A key rotated between
    two attempts gives the retry another id: the child then refuses the answer as given
    already (its own exactly-once), and the caller shows where the child stands.

    Without keys (``AGENT_UNSIGNED_RESULTS=1``) the first attempt's random id is read back
    from the heartbeat, as anyone who may heartbeat by id could write it.
    """
    seal = keys.seal(binding(), _UPDATE_ID_BODY)
    if seal is not None:
        return f"{SUB_AGENT_ANSWER_UPDATE_PREFIX}{seal.mac[:32]}"
    details = activity.info().heartbeat_details
    if (
        details
        and isinstance(details[0], str)
        and details[0].startswith(SUB_AGENT_ANSWER_UPDATE_PREFIX)
        and len(details[0]) <= _UPDATE_ID_MAX
    ):
        return details[0]
    return f"{SUB_AGENT_ANSWER_UPDATE_PREFIX}{uuid.uuid4()}"


_UPDATE_ID_MAX = len(SUB_AGENT_ANSWER_UPDATE_PREFIX) + 36
"""An update id of ours: the prefix and a uuid (or 32 characters of a MAC)."""

_UPDATE_ID_BODY = b"sub_agent_resume update id"
"""What the update id's MAC covers besides the activity: a domain of its own (no result's
canonical JSON is this)."""

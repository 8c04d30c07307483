"""The two activities every conversation uses, ``model_call`` and ``tool_call``, and the
others it asks for: MCP calls, sub-agents, how an activity ended, policy decisions.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Both resolve the agent by name from the worker's registry. ``model_call`` also returns the agent's
definition as data when the workflow's copy is missing or stale, which is how the definition gets
into history without an extra activity per turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import google.genai as genai
import mcp_types
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from pydantic import ValidationError
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.endings import activity_ending
from temporal_agent_interrupts.activities.gemini import (
    classify_api_error,
    config_for,
    merge_chunks,
    rest_model_path,
    rest_request,
    to_contents,
)
from temporal_agent_interrupts.activities.heartbeat import heartbeating
from temporal_agent_interrupts.activities.history import ConversationCache
from temporal_agent_interrupts.activities.mcp import (
    MCPError,
    MCPResponseRefused,
    MCPResultUnreadable,
    MCPSessions,
    MCPToolset,
    MCPUnavailable,
    merged_spec,
    result_output,
    status_of,
)
from temporal_agent_interrupts.activities.mcp_input import (
    RoundRefused,
    input_responses,
    read_round,
)
from temporal_agent_interrupts.activities.notify import Channel, Notifier
from temporal_agent_interrupts.activities.policy import Policy, decide_calls
from temporal_agent_interrupts.activities.sealing import Sealer
from temporal_agent_interrupts.activities.streaming import TextPublisher
from temporal_agent_interrupts.activities.subagents import (
    AgentTool,
    sub_agent_pending,
    sub_agent_resume,
)
from temporal_agent_interrupts.activities.telemetry import (
    ToolOutcome,
    count_notification,
    count_tool_call,
    span,
)
from temporal_agent_interrupts.activities.tools import (
    Interrupt,
    Tool,
    ToolContext,
    ToolError,
    output_object,
    to_json_object,
)
from temporal_agent_interrupts.workflows.activity_io import (
    ActivityEndingInput,
    ActivityEndingResult,
    MCPCallInput,
    MCPSampleInput,
    MCPSampleResult,
    ModelInput,
    ModelResult,
    NotifyInput,
    NotifyResult,
    PolicyInput,
    PolicyResult,
    SubAgentPendingInput,
    SubAgentPendingResult,
    SubAgentResumeInput,
    SubAgentResumeResult,
    ToolInput,
    ToolResult,
)
from temporal_agent_interrupts.workflows.agent import Agent, ToolApproval
from temporal_agent_interrupts.workflows.config import (
    ACTIVITY_ENDING_ACTIVITY,
    MCP_ACTIVITY,
    MCP_SAMPLE_ACTIVITY,
    MODEL_ACTIVITY,
    NOTIFY_ACTIVITY,
    NOTIFY_RETRY,
    POLICY_ACTIVITY,
    SUB_AGENT_PENDING_ACTIVITY,
    SUB_AGENT_RESUME_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_TYPE,
)
from temporal_agent_interrupts.workflows.interrupts import pydantic_reason
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    Refused,
    check_json,
    cut_stored,
    human_size,
    json_size,
)
from temporal_agent_interrupts.workflows.seal import ResultKeys
from temporal_agent_interrupts.workflows.telemetry import (
    SPAN_MODEL_CALL,
    SPAN_TOOL_CALL,
    UNKNOWN_AGENT,
    UNKNOWN_TOOL,
)
from temporal_agent_interrupts.workflows.types import (
    TOOL_APPROVED,
    AgentSpec,
    ErrorKind,
    Message,
    Status,
    ToolSpec,
    input_digest,
)

if TYPE_CHECKING:
    # Private module, for genai_transport's return type only (see there for why it is used).
    from google.genai._api_client import BaseApiClient

log = logging.getLogger(__name__)

MAX_SAMPLE_REPLY = 16 * 1024
"""What of the model's reply to a sampling request is kept (and sent to the server)."""

STATE_ONLY_PAUSE = 0.1
"""Seconds the MCP call waits before asking again when a server's input round carries only its
state (it is still working): each such ask counts as a round."""


class AgentActivities:
    """Holds the worker's agents and Gemini client; exposes the activities."""

    def __init__(
        self,
        agents: Sequence[Agent],
        *,
        gemini: genai.Client,
        result_keys: ResultKeys,
        conversation_cache: int = 1000,
        channels: Mapping[str, Channel] | None = None,
    ) -> None:
        """``conversation_cache``: how many conversations the model activity keeps (see
        :mod:`activities.history`); 0 keeps none, so every model call after a conversation's
        first asks the workflow for the earlier messages. ``result_keys``: what every result
        and failure is sealed with (``workflows.seal``). ``channels``: where paused calls are
        announced, by the names agents give them (``Agent(notify=)``; ``activities.notify``)."""
        self._sealer = Sealer(result_keys)
        self._notifier = Notifier(dict(channels or {}))
        self._agents = {a.name: a for a in agents}
        if len(self._agents) != len(agents):
            raise ValueError("two agents share a name")
        self._tools: dict[str, dict[str, Tool[Any]]] = {
            # The notifying tools of reminders and escalations run here too; the model is
            # not offered them (they are not in the agent's spec).
            a.name: {
                t.name: _as_tool(t, agent=a.name)
                for t in [*a.notify_tools(), *a.own_tools()]
                # A sub-agent's calls are child conversations, never this activity's.
                if not isinstance(t, AgentTool)
            }
            for a in agents
        }
        # The notifying tools only reminders and escalations call (never the model).
        self._notifiers: dict[str, frozenset[str]] = {
            a.name: frozenset(_as_tool(t, agent=a.name).name for t in a.notify_tools())
            - {str(getattr(t, "name", "")) for t in a.own_tools()}
            for a in agents
        }
        self._toolsets: dict[str, list[MCPToolset]] = {
            a.name: [_as_toolset(t, agent=a.name) for t in a.toolsets()] for a in agents
        }
        self._policies: dict[str, Policy] = {}
        for a in agents:
            if a.policy is None:
                continue
            if not isinstance(a.policy, Policy):
                # Agent takes any PolicyDeclaration (workflows/ cannot name Cedar's class);
                # only a parsed Cedar set can decide.
                raise ValueError(
                    f"agent {a.name!r}: policy= is {type(a.policy).__name__}, not a Policy "
                    "(Policy.from_file(path), from temporal_agent_interrupts.policies)"
                )
            self._policies[a.name] = a.policy
        self._mcp = MCPSessions([t.server for sets in self._toolsets.values() for t in sets])
        self._gemini = gemini
        self._conversations = ConversationCache(max_chats=conversation_cache)

    @property
    def conversations(self) -> ConversationCache:
        """The model activity's conversation cache (its size and hit/miss counts)."""
        return self._conversations

    def activities(self) -> list[Callable[..., Awaitable[Any]]]:
        return [
            self.model_call,
            self.tool_call,
            self.mcp_call,
            self.sub_agent_pending,
            self.sub_agent_resume,
            self.activity_ending,
            self.policy_decide,
            self.mcp_sample,
            self.notify,
        ]

    @activity.defn(name=NOTIFY_ACTIVITY)
    async def notify(self, input: RawValue) -> NotifyResult:
        """Announce a paused call on one of the worker's channels, or post how it ended
        (``activities.notify``), sealed."""
        return await self._sealer.take(input, NotifyInput, self._notify)

    async def _notify(self, input: NotifyInput) -> NotifyResult:
        # Only the conversation's own: else anyone could make the bot post to approvers.
        for_a_conversation(input.chat_id, what="notification")
        await on_this_queue(what="notification")
        # Labels from what this worker hosts only, so a start naming anything adds no series.
        agent = self._agents.get(input.agent)
        tool = input.interrupt.name
        known = agent is not None and any(t.name == tool for t in agent.spec().tools)
        labels = {
            "agent": agent.name if agent is not None else UNKNOWN_AGENT,
            "tool": tool if known else UNKNOWN_TOOL,
            "channel": input.channel if self._notifier.has(input.channel) else "unknown",
        }
        try:
            result = await self._notifier.notify(input)
        except Exception as e:
            last = activity.info().attempt >= (NOTIFY_RETRY.maximum_attempts or 1)
            if last or (isinstance(e, ApplicationError) and e.non_retryable):
                count_notification(**labels, outcome="failed")
            raise
        count_notification(**labels, outcome="sent")
        return result

    @activity.defn(name=ACTIVITY_ENDING_ACTIVITY)
    async def activity_ending(self, input: RawValue) -> ActivityEndingResult:
        """How one of the conversation's own activities ended, by its history (``endings``),
        sealed."""
        return await self._sealer.take(input, ActivityEndingInput, activity_ending)

    @activity.defn(name=SUB_AGENT_PENDING_ACTIVITY)
    async def sub_agent_pending(self, input: RawValue) -> SubAgentPendingResult:
        """A child conversation's pending interrupts (``activities.subagents``), sealed."""
        return await self._sealer.take(input, SubAgentPendingInput, sub_agent_pending)

    @activity.defn(name=SUB_AGENT_RESUME_ACTIVITY)
    async def sub_agent_resume(self, input: RawValue) -> SubAgentResumeResult:
        """An answer passed on to a child conversation (``activities.subagents``), sealed."""
        keys = self._sealer.keys  # its heartbeat is sealed too (subagents._update_id)
        return await self._sealer.take(
            input, SubAgentResumeInput, lambda inp: sub_agent_resume(inp, keys=keys)
        )

    def _stale_policy(self, agent: Agent, input: ToolInput) -> str | None:
        """Why an approval a policy's ask held no longer stands on this worker: its policy set
        is another one now (a deploy changed it), whose decision on the call nobody has asked
        for yet. The call asks again, and ``review_policy`` decides it with the set as it is."""
        if input.policy_hash is None or not input.resumed:
            return None
        held = self._policies.get(agent.name)
        if held is not None and held.hash == input.policy_hash:
            return None
        return (
            "the agent's policy set changed after this call was decided and approved: decide it "
            "again (agentctl review-policy)"
        )

    @activity.defn(name=MCP_SAMPLE_ACTIVITY)
    async def mcp_sample(self, input: RawValue) -> MCPSampleResult:
        """Answer an MCP server's sampling request with the agent's own model, sealed: the
        prompt is this activity's input (in history), the reply its result."""
        return await self._sealer.take(input, MCPSampleInput, self._mcp_sample)

    async def _mcp_sample(self, input: MCPSampleInput) -> MCPSampleResult:
        # The conversation's own model, for its own call: nobody else's tokens to spend.
        for_a_conversation(input.chat_id, what="MCP sampling request")
        agent = self._agent(input.agent)
        ask = input.ask
        contents = [
            genai_types.Content(
                role="user" if m.role == "user" else "model", parts=[genai_types.Part(text=m.text)]
            )
            for m in ask.messages
        ]
        config = genai_types.GenerateContentConfig(
            system_instruction=ask.system, max_output_tokens=ask.max_tokens
        )
        try:
            async with heartbeating(5.0):
                response = await self._gemini.aio.models.generate_content(
                    model=agent.model, contents=contents, config=config
                )
        except genai_errors.APIError as err:
            raise classify_api_error(err) from err
        text = cut_stored(response.text or "", MAX_SAMPLE_REPLY)
        log.info(
            "answered a sampling request of MCP server %r for chat %s with %s",
            input.server[:100],
            input.chat_id[:100],
            agent.model,
        )
        return MCPSampleResult(text=text, model=agent.model)

    @activity.defn(name=POLICY_ACTIVITY)
    async def policy_decide(self, input: RawValue) -> PolicyResult:
        """Decide a message's tool calls with the agent's Cedar policy set
        (``activities.policy``), sealed: the workflow records the decisions, never the policy."""
        return await self._sealer.take(input, PolicyInput, self._policy_decide)

    async def _policy_decide(self, input: PolicyInput) -> PolicyResult:
        # A decision is the conversation's to ask for: one asked by anyone else would only
        # tell them what the policy says of inputs of their choosing.
        for_a_conversation(input.chat_id, what="policy decision")
        # In-process and bounded (activities.policy): milliseconds, so it stays on the loop.
        return decide_calls(self._policies.get(self._agent(input.agent).name), input)

    @property
    def mcp(self) -> MCPSessions:
        """This worker's sessions with its agents' MCP servers."""
        return self._mcp

    async def spec_for(self, agent: Agent, *, chat_id: str | None = None) -> AgentSpec:
        """The agent's definition now: its own, with what its MCP servers list at this moment
        (each server's last listing that worked, while it cannot be reached).

        ``chat_id``: the conversation whose definition this is, when it has recorded one. Where
        two of the agent's servers may offer one name (they list it both, or one of them has
        never been listed on this worker, so what it offers is unknown here), the recorded
        definition is asked for (the ``mcp_listing`` query): a name stays with the server the
        conversation has it from (``merged_spec``), and a server this worker has never listed
        offers what the conversation recorded of it, as its last listing here would."""
        spec = agent.spec()
        toolsets = self._toolsets.get(agent.name) or []
        if not toolsets:
            return spec
        # Every server at once: each model call waits for the slowest, not for their sum.
        found = await asyncio.gather(*(self._mcp.list_tools(t.server.name) for t in toolsets))
        listed: list[tuple[str, list[ToolSpec]]] = []
        for toolset, tools in zip(toolsets, found, strict=True):
            server = toolset.server.name
            specs, problems = toolset.specs(tools)
            self._mcp.left_out(server, problems)
            listed.append((server, specs))
        owners: dict[str, str] = {}
        if chat_id is not None and _may_share_names(toolsets, listed, self._mcp):
            recorded = await _recorded_mcp_tools(chat_id)
            owners = {t.name: t.mcp.server for t in recorded if t.mcp}
            for i, (toolset, (server, specs)) in enumerate(zip(toolsets, listed, strict=True)):
                if not specs and not self._mcp.has_listing(server):
                    listed[i] = (
                        server,
                        [
                            t
                            for t in recorded
                            if t.mcp
                            and t.mcp.server == server
                            and t.name == toolset.prefix + t.mcp.tool
                        ],
                    )
        merged, problems = merged_spec(
            spec, listed, prefixes=[(t.server.name, t.prefix) for t in toolsets], owners=owners
        )
        for server, problem in problems:
            self._mcp.left_out(server, [problem])
        return merged

    def _agent(self, name: str) -> Agent:
        agent = self._agents.get(name)
        if agent is None:
            # Seen when a second worker with other agents polls the same queue: whichever
            # worker takes the call decides, so say what fixes it.
            raise ApplicationError(
                f"no agent named {name!r} on the worker that took this call from task queue "
                f"{activity.info().task_queue!r} (it hosts {sorted(self._agents)}); every "
                "worker on a task queue must host the same agents: run other agents on a "
                "task queue of their own (AGENT_TASK_QUEUE)",
                Status.NOT_FOUND,
                # As data, so the workflow and the caller never read names out of the message
                # (workflows.executing reads it; client.errors.unknown_agent suggests one).
                {"hosted": sorted(self._agents)},
                type=ErrorKind.UNKNOWN_AGENT,
                non_retryable=True,
            )
        return agent

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_call(self, input: RawValue) -> ModelResult:
        """One Gemini call with the conversation so far; automatic function calling is off."""
        return await self._sealer.take(input, ModelInput, self._model_call_spanned)

    async def _model_call_spanned(self, input: ModelInput) -> ModelResult:
        for_a_conversation(input.chat_id, what="model call")
        hosted = self._agents.get(input.agent)
        with span(
            SPAN_MODEL_CALL,
            name=input.agent,
            chat_id=input.chat_id,
            model=hosted.model if hosted else None,
        ) as current:
            result = await self._model_call(input)
            current.set_attribute("agent.finish_reason", result.finish_reason or "")
            calls = sum(1 for p in result.message.parts if p.function_call)
            current.set_attribute("agent.function_calls", calls)
            return result

    async def _model_call(self, input: ModelInput) -> ModelResult:
        agent = self._agent(input.agent)
        # Listing MCP servers waits on them: heartbeat meanwhile, as for the model.
        async with heartbeating(5.0):
            # A conversation with a recorded definition keeps its names' servers (spec_for).
            spec = await self.spec_for(
                agent, chat_id=input.chat_id if input.spec_digest is not None else None
            )
        conv = await self._conversations.resolve(input)
        try:
            async with heartbeating(5.0):
                if input.stream and input.turn is not None and input.stream_key:
                    # The text goes on the conversation's stream as it arrives.
                    async with TextPublisher(
                        turn=input.turn, key=input.stream_key, signals=input.stream_signals
                    ) as publisher:
                        chunks = await stream_model(
                            self._gemini, spec, conv.messages, conv.rest, on_chunk=publisher.feed
                        )
                else:
                    chunks = await stream_model(self._gemini, spec, conv.messages, conv.rest)
        except genai_errors.APIError as err:
            raise classify_api_error(err) from err
        message, finish, usage = merge_chunks(chunks)
        problem = _reply_problem(message)
        if problem is not None:
            status, text = problem
            # Not retried: each attempt costs a model call, and the conversation must not
            # take in what it could not store.
            raise ApplicationError(text, status, type=ErrorKind.MODEL_ERROR, non_retryable=True)
        # The workflow appends exactly this message; the next call sends only what follows.
        self._conversations.put(input.chat_id, conv.plus([message]))
        log.debug(
            "model %s answered chat %s: %d parts, finish %s",
            spec.model,
            input.chat_id,
            len(message.parts),
            finish,
        )
        return ModelResult(
            message=message,
            finish_reason=finish,
            usage=usage,
            spec=spec if input.spec_digest != spec.digest else None,
        )

    @activity.defn(name=TOOL_ACTIVITY)
    async def tool_call(self, input: RawValue) -> ToolResult:
        """Run one tool call. An ``Interrupt`` comes back as data; a ``ToolError`` fails it."""
        return await self._sealer.take(input, ToolInput, self._tool_call_checked)

    async def _tool_call_checked(self, input: ToolInput) -> ToolResult:
        # Whether it may run (an approval, a gate) is the conversation's decision, made in the
        # workflow: only a conversation's own run may ask.
        for_a_conversation(input.chat_id, what=f"tool call {input.tool[:100]!r}")
        with span(
            SPAN_TOOL_CALL,
            name=input.agent,
            chat_id=input.chat_id,
            tool=input.tool,
            ref=input.ref,
            resumed=input.resumed,
        ) as current:
            agent = self._agent(input.agent)
            tool = self._tools[agent.name].get(input.tool)
            if tool is None or tool.interrupt_only:
                raise ApplicationError(
                    f"agent {agent.name!r} has no runnable tool {input.tool!r}",
                    Status.NOT_FOUND,
                    type=ErrorKind.TOOL_ERROR,
                    non_retryable=True,
                )
            self._check_gate(agent, input)
            stale = _stale_approval(agent, input) or self._stale_policy(agent, input)
            if stale is not None:
                log.warning(
                    "did not run tool call %r for chat %s: its approval is stale (%s)",
                    input.tool[:100],
                    input.chat_id[:100],
                    stale,
                )
                count_tool_call(agent=agent.name, tool=tool.name, outcome="stale")
                return ToolResult(kind="stale", message=stale)
            outcome: ToolOutcome = "error"
            try:
                result = await self._tool_call(input, agent, tool)
                outcome = result.kind
                return result
            finally:
                # A hosted tool's name only, so the label stays bounded.
                count_tool_call(agent=agent.name, tool=tool.name, outcome=outcome)
                current.set_attribute("agent.outcome", outcome)

    def _check_gate(self, agent: Agent, input: ToolInput) -> None:
        """This worker's own gate, whatever the conversation's recorded definition says: a
        tool its agent's ``ToolApproval`` holds runs only as an approved run (``tool_approved``
        in the restart's metadata), as ``mcp_call`` checks for an MCP server's tools. The
        workflow decides who may approve; this keeps a definition that lost its gate (were
        one ever taken from outside the workers) from running a held tool unasked.

        Raises:
            ApplicationError: ``PERMISSION_DENIED``, non-retryable, classified as a tool error.
        """
        if input.tool in self._notifiers[agent.name]:
            return  # a reminder's or an escalation's notice, which the model is never offered
        if not _held_unapproved(agent, input):
            return
        log.warning(
            "refused tool call %r for chat %s: this worker's gate holds it and it carries no "
            "approval",
            input.tool[:100],
            input.chat_id[:100],
        )
        raise ApplicationError(
            f"tool call of {input.tool[:100]!r} refused: this worker's gate holds it, and the "
            "call carries no approval",
            Status.PERMISSION_DENIED,
            type=ErrorKind.TOOL_ERROR,
            non_retryable=True,
        )

    async def _tool_call(self, input: ToolInput, agent: Agent, tool: Tool[Any]) -> ToolResult:
        try:
            args = tool.input.model_validate(input.args)
        except ValidationError as e:
            # The model sent bad arguments: tell it, so it can correct itself.
            return ToolResult(kind="invalid_input", message=pydantic_reason(e))
        ctx = ToolContext(
            chat_id=input.chat_id,
            ref=input.ref,
            agent=agent.name,
            resumed=input.resumed,
            resumed_metadata=dict(input.resumed_metadata),
            # Conversations scheduled before the key existed get one per call.
            idempotency_key=input.idempotency_key
            or hashlib.sha256(f"{input.chat_id}\0{input.ref}".encode()).hexdigest()[:32],
            original_input=input.original_args,
        )
        try:
            async with heartbeating(5.0):
                value = await tool.invoke(args, ctx)
        except Interrupt as i:
            metadata = {} if i.metadata is None else to_json_object(i.metadata)
            if metadata is None:
                raise ApplicationError(
                    f"tool {tool.name!r} raised Interrupt with {type(i.metadata).__name__} "
                    "metadata; interrupt metadata must be a JSON object (a dict or a pydantic "
                    "model)",
                    Status.INVALID_ARGUMENT,
                    type=ErrorKind.TOOL_ERROR,
                    non_retryable=True,
                ) from None
            problem = _unstorable(metadata, tool=tool.name, what="interrupt metadata")
            if problem:
                status, text = problem
                raise ApplicationError(
                    text, status, type=ErrorKind.TOOL_ERROR, non_retryable=True
                ) from None
            return ToolResult(kind="interrupt", metadata=metadata)
        except ToolError as e:
            raise ApplicationError(
                e.message, e.status, type=ErrorKind.TOOL_ERROR, non_retryable=True
            ) from None
        try:
            output = output_object(value)
        except Exception as e:
            raise ApplicationError(
                f"tool {tool.name!r} returned a value that is not JSON-serializable "
                f"({type(value).__name__})",
                Status.INTERNAL,
                type=ErrorKind.TOOL_ERROR,
                non_retryable=True,
            ) from e
        return _ran(output, tool=tool.name)

    @activity.defn(name=MCP_ACTIVITY)
    async def mcp_call(self, input: RawValue) -> ToolResult:
        """Call one tool of an MCP server, through this worker's session with it.

        The server and the tool's name there come from the definition recorded in history
        (what was listed when the model asked for the call). Whether it may run is the
        workflow's decision, as for any tool.
        """
        return await self._sealer.take(input, MCPCallInput, self._mcp_call_checked)

    async def _mcp_call_checked(self, input: MCPCallInput) -> ToolResult:
        for_a_conversation(input.chat_id, what=f"MCP tool call {input.tool[:100]!r}")
        with span(
            SPAN_TOOL_CALL,
            name=input.agent,
            chat_id=input.chat_id,
            tool=input.tool,
            ref=input.ref,
            resumed=input.resumed,
        ) as current:
            agent = self._agent(input.agent)
            toolset = next(
                (t for t in self._toolsets.get(agent.name) or [] if t.server.name == input.server),
                None,
            )
            if toolset is None:
                raise ApplicationError(
                    f"agent {agent.name!r} has no MCP server {input.server[:100]!r} on this worker",
                    Status.NOT_FOUND,
                    type=ErrorKind.TOOL_ERROR,
                    non_retryable=True,
                )
            await self._check_mcp_call(agent, toolset, input)
            outcome: ToolOutcome = "error"
            try:
                result = await self._mcp_call(input)
                outcome = result.kind
                return result
            finally:
                # The recorded spec's name: checked when listed, so the label stays bounded.
                count_tool_call(agent=agent.name, tool=input.tool, outcome=outcome)
                current.set_attribute("agent.outcome", outcome)

    async def _check_mcp_call(self, agent: Agent, toolset: MCPToolset, input: MCPCallInput) -> None:
        """What this worker knows of the call, checked against what it was asked, whatever the
        conversation's recorded definition says: the model activity's result is what the
        workflow records, and one completed by id from outside (docs/security.md, "What stays
        open") could route a name to any tool of the server, marked ungated. The agent's name
        for it must be the toolset's for that tool, the server must list it now, and a call
        this worker's own gates hold must carry an approval."""
        refused: str | None = None
        if input.tool != toolset.prefix + input.server_tool:
            refused = f"{input.tool[:100]!r} is not this worker's name for that tool"
        else:
            listed = {t.name: t for t in await self._mcp.list_tools(input.server)}
            if not self._mcp.has_listing(input.server):
                # Never listed here, and it cannot be now: a server that is down, not a call
                # refused (a worker that listed it before would find it down at the call).
                raise ApplicationError(
                    f"MCP server {input.server[:100]!r} is unavailable: this worker cannot "
                    "list it; the call did not reach it",
                    Status.UNAVAILABLE,
                    type=ErrorKind.TOOL_ERROR,
                    non_retryable=True,
                )
            tool = listed.get(input.server_tool)
            if tool is None:
                refused = "the server does not list that tool to this worker"
            else:
                gated = toolset.decide(tool.name, tool.annotations).gated
                if _held_unapproved(agent, input, gated=gated):
                    refused = "this worker's gate holds it, and the call carries no approval"
        if refused is not None:
            log.warning(
                "refused MCP call %r of server %r for chat %s: %s",
                input.server_tool[:100],
                input.server[:100],
                input.chat_id[:100],
                refused,
            )
            raise ApplicationError(
                f"MCP call of {input.server_tool[:100]!r} on {input.server[:100]!r} refused: "
                f"{refused}",
                Status.PERMISSION_DENIED,
                type=ErrorKind.TOOL_ERROR,
                non_retryable=True,
            )

    async def _mcp_call(self, input: MCPCallInput) -> ToolResult:
        where = f"MCP server {input.server!r}"
        round_ = input.input_round
        try:
            async with heartbeating(5.0):
                while True:
                    result = await self._mcp.call(
                        input.server,
                        input.server_tool,
                        input.args,
                        idempotency_key=input.idempotency_key,
                        input_responses=input_responses(round_) if round_ else None,
                        request_state=round_.request_state if round_ else None,
                    )
                    if not isinstance(result, mcp_types.InputRequiredResult):
                        break
                    round_ = read_round(
                        result, previous=round_, roots=self._mcp.roots(input.server)
                    )
                    if round_.forms or round_.samples:
                        # A person (or the agent's model, in an activity of its own) answers:
                        # the conversation pauses, and a new activity sends the retry. Nothing
                        # waits here.
                        return ToolResult(kind="input_required", input_round=round_)
                    if not round_.responses:
                        # Only state: the server is working; ask again shortly (as the
                        # SDK's own driver does), within the bounded rounds.
                        await asyncio.sleep(STATE_ONLY_PAUSE)
        except RoundRefused as e:
            log.warning("%s: input request refused (%s)", where, e.reason)
            return ToolResult(
                kind="output",
                output={
                    "error": "input request refused",
                    "detail": f"{where} asked for input this client does not take: {e.reason}",
                },
            )
        except MCPResultUnreadable as e:
            log.warning("%s: result does not read as MCP (%s)", where, e)
            return ToolResult(
                kind="output",
                output={
                    "error": "output not accepted",
                    "detail": f"{where} answered with a result that does not read as MCP ({e}); "
                    "the call may have taken effect",
                },
            )
        except MCPResponseRefused as e:
            # The server got the call and answered: the tool may have run, so the model hears
            # it as an error in the output's place and the turn goes on, as for any output
            # too large to keep (_ran); nothing of the body reaches the conversation.
            log.warning(
                "%s: response cut off unread (%s); sent the model an error instead", where, e
            )
            return ToolResult(
                kind="output",
                output={
                    "error": "output too large" if e.too_large else "output not accepted",
                    "detail": f"{where} answered with a response that was cut off unread: {e}; "
                    "the call may have taken effect",
                },
            )
        except MCPUnavailable as e:
            note = (
                "; it may have taken effect: check before trying again"
                if e.sent
                else "; the call did not reach it"
            )
            raise ApplicationError(
                f"{where} is unavailable: {e}{note}",
                Status.UNAVAILABLE,
                type=ErrorKind.TOOL_ERROR,
                non_retryable=True,
            ) from None
        except MCPError as e:
            raise ApplicationError(
                f"{where} refused the call of {input.server_tool[:100]!r}: "
                f"{cut_stored(e.message, 300)}",
                status_of(e),
                type=ErrorKind.TOOL_ERROR,
                non_retryable=True,
            ) from None
        try:
            output = result_output(result)
        except Exception as e:  # a server's malformed result is its failure
            raise ApplicationError(
                f"{where} returned a result that cannot be read",
                Status.INTERNAL,
                type=ErrorKind.TOOL_ERROR,
                non_retryable=True,
            ) from e
        return _ran(output, tool=input.tool)


def _ran(output: Any, *, tool: str) -> ToolResult:
    """A tool's output (a Python tool's or an MCP server's), or, when it cannot be stored, an
    error in its place. The tool has run (its side effects happened): the model must hear that,
    so the turn goes on with an error in place of the output rather than failing (and the
    activity must not fail either, or Temporal would run the tool again)."""
    problem = _unstorable(output, tool=tool, what="output")
    if problem:
        status, text = problem
        log.warning("%s; sent the model an error instead", text)
        error = "output too large" if status == Status.RESOURCE_EXHAUSTED else "output not accepted"
        return ToolResult(
            kind="output", output={"error": error, "detail": f"{text}; it was dropped"}
        )
    return ToolResult(kind="output", output=output)


def _may_share_names(
    toolsets: Sequence[MCPToolset],
    listed: Sequence[tuple[str, list[ToolSpec]]],
    sessions: MCPSessions,
) -> bool:
    """Whether two of an agent's servers without a prefix may offer one name here: they list
    it both, or one of them has never been listed on this worker (what it offers is unknown).
    (A prefixed server's names are its own: merged_spec leaves out another's inside them.)"""
    bare = [(t, specs) for t, (_, specs) in zip(toolsets, listed, strict=True) if not t.prefix]
    if len(bare) < 2:
        return False
    if any(not sessions.has_listing(t.server.name) for t, _ in bare):
        return True
    names = [s.name for _, specs in bare for s in specs]
    return len(names) != len(set(names))


async def _recorded_mcp_tools(chat_id: str) -> list[ToolSpec]:
    """The MCP tools of the definition chat ``chat_id`` recorded (the activity's own
    conversation: ``for_a_conversation`` checked it)."""
    # Imported here: the activity needs the workflow class only for this typed query.
    from temporal_agent_interrupts.workflows import AgentWorkflow

    # This run's: the definition that scheduled this call, not a later run's.
    run_id = activity.info().workflow_run_id
    handle = activity.client().get_workflow_handle(chat_id, run_id=run_id)
    return (await handle.query(AgentWorkflow.mcp_listing)).tools


async def on_this_queue(*, what: str) -> None:
    """Refuse an activity whose workflow runs on another task queue than this worker's.

    ``for_a_conversation`` cannot tell a workflow of another program named ``AgentWorkflow``,
    run by its own worker on a queue of its own, from ours: its activities may still be
    scheduled on our queue. For what reaches people (a notification posts as the company's bot
    to its approvers), the server is asked where the workflow runs: one describe per call.

    Raises:
        ApplicationError: non-retryable ``NotScheduledByConversation``; logged as an error.
    """
    info = activity.info()
    handle = activity.client().get_workflow_handle(
        info.workflow_id or "", run_id=info.workflow_run_id
    )
    queue = (await handle.describe()).task_queue
    if queue == info.task_queue:
        return
    log.error(
        "refused a %s on task queue %r: its workflow %r runs on task queue %r",
        what,
        info.task_queue[:100],
        (info.workflow_id or "")[:100],
        queue[:100],
    )
    raise ApplicationError(
        f"this {what} was scheduled by a workflow on another task queue",
        type="NotScheduledByConversation",
        non_retryable=True,
    )


def for_a_conversation(chat_id: str, *, what: str) -> None:
    """Refuse an activity not scheduled by the ``AgentWorkflow`` run of chat ``chat_id``.

    Temporal lets whoever may start activities start one on any task queue without a workflow
    (the dev server accepts standalone activities), or schedule one from a workflow of their
    own; ``ToolInput`` then says whatever they like (``resumed_metadata: {"tool_approved":
    true}``), and a tool would run with no approval and no record. The activity's info comes
    from the server: a standalone activity has no workflow, and a workflow's id and type are
    what the server ran. (A workflow of another program named ``AgentWorkflow`` on a queue of
    its own would pass; completing workflow tasks is a worker's right, see
    docs/security.md.)

    Raises:
        ApplicationError: non-retryable ``NotScheduledByConversation``; logged as an error.
    """
    info = activity.info()
    if info.in_workflow and info.workflow_type == WORKFLOW_TYPE and info.workflow_id == chat_id:
        return
    source = (
        f"workflow {info.workflow_type!r} (id {(info.workflow_id or '')[:100]!r})"
        if info.in_workflow
        else "no workflow (a standalone activity)"
    )
    log.error(
        "refused a %s on task queue %r: it was scheduled by %s, not by the conversation %r",
        what,
        info.task_queue,
        source,
        chat_id[:100],
    )
    raise ApplicationError(
        f"refused: a {what} runs only for a conversation, scheduled by its own "
        f"{WORKFLOW_TYPE} run; this one was scheduled by {source}",
        Status.PERMISSION_DENIED,
        type=ErrorKind.NOT_A_CONVERSATION,
        non_retryable=True,
    )


def _unstorable(obj: dict[str, Any], *, tool: str, what: str) -> tuple[Status, str] | None:
    """Why a conversation cannot keep ``obj`` (status and message), or None.

    Text that is not valid Unicode or nesting too deep could not be serialized later; more
    than 256 KiB would bloat every later model call and the conversation's state.
    """
    try:
        check_json(obj, what=f"tool {tool!r}'s {what}")
    except Refused as e:
        return Status.INVALID_ARGUMENT, e.reason
    size = json_size(obj)
    if size <= DOOR.tool_output:
        return None
    return Status.RESOURCE_EXHAUSTED, (
        f"tool {tool!r} returned {size // 1024} KiB of {what}; the limit is "
        f"{DOOR.tool_output // 1024} KiB (return a summary, a page or a reference)"
    )


def _reply_problem(message: Message) -> tuple[Status, str] | None:
    """Why the conversation cannot take in the model's reply (status and message), or None."""
    calls = sum(1 for p in message.parts if p.function_call)
    if calls > DOOR.calls_per_message:
        return Status.RESOURCE_EXHAUSTED, (
            f"the model asked for {calls} tool calls in one reply; the limit is "
            f"{DOOR.calls_per_message}"
        )
    try:
        check_json(message.model_dump(mode="json"), what="the model's reply")
    except Refused as e:
        return Status.INVALID_ARGUMENT, e.reason
    size = json_size(message)
    if size > DOOR.model_message:
        return Status.RESOURCE_EXHAUSTED, (
            f"the model's reply is {human_size(size)}; the limit is "
            f"{human_size(DOOR.model_message)}"
        )
    return None


async def stream_model(
    gemini: genai.Client,
    spec: AgentSpec,
    messages: Sequence[Message],
    rest_parts: Sequence[list[dict[str, Any]]] | None = None,
    *,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """``streamGenerateContent`` through the google-genai client, as REST-shaped chunks.

    ``on_chunk`` sees each chunk as it arrives (the stream's text publisher).
    """
    if not gemini.vertexai:
        return await stream_rest(gemini, spec, messages, rest_parts, on_chunk=on_chunk)
    # Vertex AI: google-genai's typed path.
    return await stream_typed(gemini, spec, messages, on_chunk=on_chunk)


def genai_transport(gemini: genai.Client) -> BaseApiClient:
    """google-genai's transport behind ``gemini`` (its sync and async clients share one).

    Private (``Client._api_client``), and no public API serves: google-genai sends only the
    requests it builds from typed models (50 µs a part, see ``activities.gemini``), and parses
    every response into them, which drops the fields it does not type; nor does it expose the
    http options a client was built with. What is relied on: ``async_request_streamed(method,
    path, body)`` yields responses whose ``body`` is one chunk's JSON, and
    ``get_read_only_http_options()`` holds ``retry_options`` (tests/test_library_guards.py).
    """
    return gemini._api_client


async def stream_rest(
    gemini: genai.Client,
    spec: AgentSpec,
    messages: Sequence[Message],
    rest_parts: Sequence[list[dict[str, Any]]] | None = None,
    *,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The Developer API: our request body, the client's transport (see activities.gemini)."""
    stream = await genai_transport(gemini).async_request_streamed(
        "post",
        f"{rest_model_path(spec.model)}:streamGenerateContent?alt=sse",
        rest_request(spec, messages, rest_parts=rest_parts),
    )
    chunks: list[dict[str, Any]] = []
    async for response in stream:
        if response.body:
            chunks.append(json.loads(response.body))
            if on_chunk is not None:
                on_chunk(chunks[-1])
    return chunks


async def stream_typed(
    gemini: genai.Client,
    spec: AgentSpec,
    messages: Sequence[Message],
    *,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """google-genai's public, typed call; chunks dumped back to the REST shape."""
    typed = await gemini.aio.models.generate_content_stream(
        model=spec.model, contents=list(to_contents(messages)), config=config_for(spec)
    )
    chunks: list[dict[str, Any]] = []
    async for chunk in typed:
        chunks.append(chunk.model_dump(mode="json", by_alias=True, exclude_none=True))
        if on_chunk is not None:
            on_chunk(chunks[-1])
    return chunks


def _as_toolset(declared: object, *, agent: str) -> MCPToolset:
    """A declared toolset, checked to be one this runtime can list."""
    if not isinstance(declared, MCPToolset):
        raise TypeError(
            f"agent {agent!r} declares {declared!r}, which is not a toolset this runtime "
            "knows: build one with activities.mcp.mcp_tools"
        )
    return declared


def _as_tool(declared: object, *, agent: str) -> Tool[Any]:
    """A declared tool, checked to be one this runtime can run."""
    if not isinstance(declared, Tool):
        raise TypeError(
            f"agent {agent!r} declares {declared!r}, which is not a tool: build tools with "
            "activities.tool or activities.interrupt"
        )
    return declared


def _stale_approval(agent: Agent, input: ToolInput) -> str | None:
    """Why an approved run may no longer run on this worker (None: it may): checked just
    before the tool runs, against this worker's own ``ToolApproval``, whatever the
    conversation recorded. Its approvers (each by the entries that admitted them: identity,
    ``group:NAME``) must still be admitted, as many as the gate's quorum; and the input must be
    the one they approved. A deploy that narrowed the list between the approval and the run
    voids it: the conversation asks again (``stale``), and nothing runs."""
    if not input.resumed or input.approved_by is None:
        return None
    if input.approved_digest is not None and input_digest(input.args) != input.approved_digest:
        return "its input is not the one that was approved"
    gates = [
        m for m in agent.middleware if isinstance(m, ToolApproval) and input.tool not in m.allow
    ]
    for gate in gates:
        listed = set(gate.approvers)
        admitted = [
            entries
            for entries in input.approved_by
            if not listed or any(e in listed for e in entries)
        ]
        if len(admitted) < gate.quorum:
            who = ", ".join(e[0] for e in input.approved_by if e)[:200] or "nobody named"
            return (
                f"approved by {who}, but this worker's gate now needs {gate.quorum} of "
                f"{', '.join(gate.approvers)[:300] or 'anyone'}"
            )
    return None


def _held_unapproved(agent: Agent, input: ToolInput, *, gated: bool = False) -> bool:
    """Whether this worker's own gates hold the call (its agent's ``ToolApproval``, or
    ``gated``: an MCP server's own decision) and it is not an approved run (``tool_approved``
    in a restart's metadata)."""
    held = gated or any(
        isinstance(m, ToolApproval) and input.tool not in m.allow for m in agent.middleware
    )
    approved = input.resumed and input.resumed_metadata.get(TOOL_APPROVED) is True
    return held and not approved

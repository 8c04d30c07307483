"""What the conversation's activities take and return, and what one conversation tells another.

Internal: not covered by the 0.1.x stability promise; its public name (``NotifyInput``, what a
channel is told) is imported from ``temporal_agent_interrupts.hosting``.

Read by the workflow and the activities (``activities/``): the model call, the tool and MCP
calls, a sub-agent's reads and answers passed on, and how an activity ended. What callers send
and read is in :mod:`workflows.types`; the state carried between runs in :mod:`workflows.state`.
Field names are wire names: recorded histories hold them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    ConversationResult,
    InterruptRequest,
    JsonObject,
    Message,
    PolicyDecision,
    Seal,
    TurnResult,
    _Wire,
)


class SubAgentReport(_Wire):
    """The ``sub_agent`` signal a sub-agent's conversation sends its caller when what it waits
    on changes: only a hint (signals name no sender), so the caller reads the child's pending
    interrupts itself (``SubAgentPendingInput``), and only for a child it started."""

    chat_id: str


class SubAgentPendingInput(_Wire):
    """The ``sub_agent_pending`` activity: read a child conversation's pending interrupts."""

    chat_id: str
    run_id: str
    # The digest of the list last read (SubAgentPendingResult.digest): when the child's list
    # still has it, the read answers "unchanged" in a few bytes instead of the whole list.
    # A ``sub_agent`` report is a hint anyone may send; each costs the caller a read, and a
    # whole list per read (~80 KiB for 64 calls pending) took a few hundred forged reports to
    # the history guard.
    known: str | None = Field(default=None, exclude_if=lambda v: v is None)


class SubAgentPendingResult(_Wire):
    """What the ``sub_agent_pending`` activity read: the child's pending interrupts, as its
    ``pending`` query gives them, and their digest; or only that they are unchanged.

    (Recorded histories hold a ``PendingResult`` here, which reads as this with no digest.)
    """

    interrupts: list[InterruptRequest] = Field(default_factory=list)
    digest: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The list's digest is SubAgentPendingInput.known: ``interrupts`` is left empty.
    unchanged: bool = Field(default=False, exclude_if=lambda v: not v)
    # The child has closed: how, and its result if it completed. A caller that continued as
    # new while it waited learns the call's outcome from this (it has no handle on the child).
    ended: SubAgentEnd | None = Field(default=None, exclude_if=lambda v: v is None)
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


class SubAgentResumeInput(_Wire):
    """The ``sub_agent_resume`` activity: pass an answer given to the caller on to the child
    conversation it is for, as the child's ``resume`` update, so the child's rules check it."""

    chat_id: str
    run_id: str
    resume: JsonObject


ActivityEnding = Literal["timed_out", "failed", "completed", "cancelled", "unknown"]


class ActivityEndingInput(_Wire):
    """The ``activity_ending`` activity: how the run's activity of this id ended."""

    activity_id: str


class ActivityEndingResult(_Wire):
    """How it ended, by the event its history holds: ``timed_out`` only for the server's own
    ``ActivityTaskTimedOut``."""

    ending: ActivityEnding
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


class SubAgentResumeResult(_Wire):
    # The child's turn as it stopped after the answer.
    result: TurnResult | None = None
    # The child's refusal, as its ResumeRejected says it; None when it took the answer.
    refused: str | None = None
    # Its kind (workflows.limits.RefusalCode, spelled out: this module imports none of ours),
    # so the caller refuses the same way: a wrong approver stays "forbidden" (HTTP 403)
    # through the caller. None: the child did not say.
    code: Literal["invalid", "forbidden", "conflict", "not_found"] | None = None
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


SubAgentEndStatus = Literal["completed", "failed", "cancelled", "terminated", "timed_out", "gone"]
"""How a sub-agent's chain closed; ``gone``: it is no longer there to read (deleted, or another
workflow now holds its id)."""


class SubAgentEnd(_Wire):
    """How a sub-agent's conversation closed (``SubAgentPendingResult.ended``)."""

    status: SubAgentEndStatus
    # Its result, when it completed.
    result: ConversationResult | None = Field(default=None, exclude_if=lambda v: v is None)


class ModelInput(_Wire):
    """One model call.

    Only the messages the model side has not seen travel in history (``new_messages``, from
    index ``new_from``); the activity keeps the earlier ones per chat and checks them against
    ``prefix_digest``, asking the workflow for them when it does not have them. Sending the
    whole conversation on every call made history grow with the square of its length.
    """

    agent: str
    chat_id: str
    # The digest of the definition the workflow already holds; the activity sends the
    # definition back only when the worker's differs, to keep history small.
    spec_digest: str | None = None
    new_from: int = 0
    new_messages: list[Message] = Field(default_factory=list)
    prefix_digest: str | None = None
    history_size: int | None = None
    # Publish the reply's text on the conversation's stream as it arrives, as this turn's.
    stream: bool = False
    turn: int | None = None
    # When streaming: this call's own publisher id on the stream; the workflow takes text only
    # from publishes that carry it (workflows.stream), so a signal from outside cannot pass for
    # the model.
    stream_key: str | None = None
    # When streaming: how many publish signals the call may send. A run takes a bounded number
    # of signals (workflows.limits.RUN.stream_signals says why); the text past them reaches the
    # stream when the call completes. None: the most one reply sends.
    stream_signals: int | None = Field(default=None, exclude_if=lambda v: v is None)


class ModelUsage(_Wire):
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class ModelResult(_Wire):
    message: Message
    finish_reason: str | None = None
    usage: ModelUsage | None = None
    spec: AgentSpec | None = None
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


class ToolInput(_Wire):
    agent: str
    chat_id: str
    tool: str
    ref: str
    args: JsonObject = Field(default_factory=dict)
    resumed: bool = False
    resumed_metadata: JsonObject = Field(default_factory=dict)
    # Stable for one run of the call, across retries and replays (ToolContext.idempotency_key).
    idempotency_key: str | None = None
    # An edited call: the model's input (``args`` is the edited one).
    original_args: JsonObject | None = None
    # An approved run of a gated tool: who approved it (each approver's admitting entries:
    # identity and ``group:NAME``s) and the digest of the input they approved. The activity
    # checks both against the worker's own gate before the tool runs (``stale`` if either no
    # longer holds). Left off the wire when unset.
    approved_by: list[list[str]] | None = Field(default=None, exclude_if=lambda v: v is None)
    approved_digest: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The hash of the policy set whose decision held this approved run (a policy's ask): a
    # worker whose set is another one no longer takes the approval (``stale``), and the call
    # waits for a review (``review_policy``). Left off the wire when unset.
    policy_hash: str | None = Field(default=None, exclude_if=lambda v: v is None)


class InputForm(_Wire):
    """One form an MCP server asks a person to fill in an input round (an elicitation request
    in form mode): the server's message and the schema the answer must fit (flat, as MCP
    allows: top-level properties of primitive types)."""

    key: str
    message: str
    requested_schema: JsonObject


class SampleMessage(_Wire):
    """One message of a sampling request's prompt (text only)."""

    role: Literal["user", "assistant"]
    text: str


class SampleAsk(_Wire):
    """A sampling request of an input round: the server asks the agent's own model for a
    reply. The prompt is the activity's input, so history records it."""

    key: str
    messages: list[SampleMessage]
    system: str | None = Field(default=None, exclude_if=lambda v: v is None)
    max_tokens: int


class MCPSampleInput(_Wire):
    """The ``mcp_sample`` activity (``config.MCP_SAMPLE_ACTIVITY``): one sampling request of an
    MCP call's input round, answered by the agent's model."""

    agent: str
    chat_id: str
    ref: str
    server: str
    ask: SampleAsk


class MCPSampleResult(_Wire):
    """The model's reply to a sampling request: text, and the model that made it."""

    text: str
    model: str
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


NotifyKind = Literal["paused", "reminder", "escalation", "settled"]
"""What a notification says: a call paused (announce it); its deadline is near (a reminder) or
passed and was extended once (an escalation: ``interrupt.deadline`` is the new one), each
posted as a new message; or how it ended (update what was posted, where the channel can)."""

SettledAs = Literal["approved", "denied", "answered", "edited", "expired", "withdrawn", "cancelled"]


class NotifyInput(_Wire):
    """The ``notify`` activity (``config.NOTIFY_ACTIVITY``): one channel told of one paused
    call. ``key`` names the pause (the chat, the ref and when it paused), so a channel posts it
    once however often the activity is attempted."""

    agent: str
    chat_id: str
    channel: str
    kind: NotifyKind
    key: str
    # The call as every surface shows it (its input within the notice budget).
    interrupt: InterruptRequest
    # settled: how it ended, by whom (None: no person: a deadline, a cancel), and what the
    # channel answered when it announced the pause (a Slack message's reference).
    settled: SettledAs | None = None
    settled_by: str | None = None
    settled_by_verified: bool = False
    posted: str | None = None


class NotifyResult(_Wire):
    """What the channel answered: a reference to what it posted (a Slack message's channel and
    timestamp), for the update when the call ends; None where it keeps nothing."""

    posted: str | None = None
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


class InputRound(_Wire):
    """An MCP call whose server asked for input instead of answering (``InputRequiredResult``,
    MCP 2026-07-28), carried by the call until the server is asked again with the answers.

    Nothing holds the wait but the conversation's state: the activity returned at once, and
    the retry is a new activity under the same idempotency key, sent ``request_state`` exactly
    as the server gave it.
    """

    # How many input rounds the call has had, this one included (bounded: limits).
    round: int
    # The server's opaque state, echoed byte for byte on the retry.
    request_state: str | None = None
    # The forms people fill, one interrupt each, in the server's order.
    forms: list[InputForm] = Field(default_factory=list)
    # The sampling requests, each answered by the agent's model (in an activity) before the
    # forms are asked. Left off the wire when there are none.
    samples: list[SampleAsk] = Field(default_factory=list, exclude_if=lambda v: not v)
    # The answers so far, by the server's request key, as the server is sent them: a roots
    # request's (the worker answers it from the server's configuration), and each form's
    # (``{"action": "accept", "content": ...}`` or ``{"action": "decline"}``), and each
    # sampling request's (the model's reply, as MCP's ``CreateMessageResult``).
    responses: dict[str, JsonObject] = Field(default_factory=dict)
    # The form the call is paused on now.
    asking: str | None = Field(default=None, exclude_if=lambda v: v is None)

    def unsampled(self) -> list[SampleAsk]:
        """The sampling requests not answered yet."""
        return [a for a in self.samples if a.key not in self.responses]

    def next_form(self) -> InputForm | None:
        """The first form not answered yet (None: the round is complete)."""
        return next((f for f in self.forms if f.key not in self.responses), None)

    def form(self, key: str | None) -> InputForm | None:
        return next((f for f in self.forms if f.key == key), None)


class MCPCallInput(ToolInput):
    """One call of an MCP server's tool (``config.MCP_ACTIVITY``): ``server`` and ``server_tool``
    come from the tool's spec, recorded in history; ``tool`` is the agent's name for it."""

    server: str
    server_tool: str
    # A retry after an input round: the answers and the state to send back. Left off the wire
    # when unset.
    input_round: InputRound | None = Field(default=None, exclude_if=lambda v: v is None)


class ToolResult(_Wire):
    # "stale": an approved run the worker's gate no longer accepts (its approvers no longer
    # admitted, or another input than the one approved): nothing ran, ``message`` says why.
    # "input_required": an MCP server asked for input (``input_round``) before it answers.
    kind: Literal["output", "interrupt", "invalid_input", "stale", "input_required"]
    output: JsonObject | None = None
    metadata: JsonObject | None = None
    message: str | None = None
    input_round: InputRound | None = Field(default=None, exclude_if=lambda v: v is None)
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)


class PolicyRequester(_Wire):
    """Who asked for the calls a policy decides: the message's sender, as the turn recorded it.

    ``groups`` count only when ``verified`` (a token from the agent's trusted issuer): the
    policy activity drops an asserted identity's groups, as the approver check does.
    """

    identity: str
    verified: bool = False
    groups: list[str] = Field(default_factory=list)


class PolicyCall(_Wire):
    """One tool call for the policy to decide: its ref, the tool's name on the agent, and the
    call's validated input."""

    ref: str
    tool: str
    input: JsonObject = Field(default_factory=dict)
    # The tool's MCP annotations (``readOnlyHint``, ``destructiveHint``, ...), when it is an MCP
    # server's tool; the policy reads them as ``resource.annotations``.
    annotations: JsonObject | None = Field(default=None, exclude_if=lambda v: v is None)


class PolicyInput(_Wire):
    """The ``policy_decide`` activity (``config.POLICY_ACTIVITY``): decide a model message's
    tool calls with the policy set the worker holds for ``agent``."""

    chat_id: str
    agent: str
    calls: list[PolicyCall] = Field(default_factory=list)
    requester: PolicyRequester | None = Field(default=None, exclude_if=lambda v: v is None)


class PolicyResult(_Wire):
    """Each call's decision, by ref, and the hash of the policy set that made them (the same
    as each decision's ``policy_hash``)."""

    decisions: dict[str, PolicyDecision] = Field(default_factory=dict)
    policy_hash: str
    # A worker's seal on this result (workflows.seal): a result without a valid one is not taken.
    seal: Seal | None = Field(default=None, exclude_if=lambda v: v is None)

"""The conversation's state, carried from one run to the next by continue-as-new.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Read by the workflow alone (and by the tests that check what a run carries): the turn under way,
its calls, the spent tokens, the messages sent, and the start input that hands the state on.
What callers send and read is in :mod:`workflows.types`; what activities take and return in
:mod:`workflows.activity_io`. Field names are wire names: a carried state written by one release
is read by the next.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from temporal_agent_interrupts.workflows.activity_io import InputRound
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    AnswerRecord,
    CallContext,
    ErrorInfo,
    Grant,
    InterruptSource,
    JsonObject,
    Message,
    PolicyDecision,
    Rejection,
    Requester,
    TurnEvent,
    TurnResult,
    Vote,
    _Wire,
)


class SentMessage(_Wire):
    """A message id a send carried: the turn it started, and its text's digest (the same id
    with other text is refused, not taken as a repeat)."""

    message_id: str
    turn: int
    digest: str


CallStatus = Literal["ready", "done", "pending", "answered", "failed"]


class CallState(_Wire):
    """One tool call of a model message, through its whole life."""

    ref: str
    call_id: str | None = None
    name: str
    args: JsonObject = Field(default_factory=dict)
    status: CallStatus = "ready"
    # ready: whether this run is a restart, and with what metadata.
    resumed: bool = False
    resumed_metadata: JsonObject = Field(default_factory=dict)
    # done: the function response sent to the model.
    output: JsonObject | None = None
    # pending: why and since when.
    source: InterruptSource = "interrupt"
    metadata: JsonObject = Field(default_factory=dict)
    since: datetime | None = None
    deadline: datetime | None = None
    # answered: the answer waiting for its siblings.
    answer: Literal["respond", "restart"] | None = None
    answer_output: JsonObject | None = None
    answer_metadata: JsonObject | None = None
    # failed
    error: ErrorInfo | None = None
    # The failure does not say whether the tool took effect (it timed out, its worker was lost,
    # or it raised an unclassified exception).
    uncertain: bool = False
    runs: int = 0
    # pending, with a quorum: the approvals so far.
    votes: list[Vote] = Field(default_factory=list)
    # Edited: the model's input (``args`` holds the edited one); and, until the call next runs
    # or pauses, whether the edit itself passes the approval gate.
    original_args: JsonObject | None = None
    edit_passes_gate: bool | None = None
    # Deadline policies carried out: reminders sent, and whether the deadline was extended.
    reminded: int = 0
    escalated: bool = False
    # A sub-agent call (``agent_tool``) whose child conversation has started: which one, so a
    # run that continues as new while the call waits on it re-attaches instead of starting
    # another. Left off the wire when unset.
    child: SubAgentLink | None = Field(default=None, exclude_if=lambda v: v is None)
    # The grant that approved this run (workflows.grants), checked again just before it runs;
    # None: a person's approval, or none. Left off the wire when unset.
    granted: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The agent's policy set's decision on this call (activities.policy, recorded in history by
    # its activity's result): a deny refuses it, an ask holds it like a gate. Left off the wire
    # when unset.
    policy: PolicyDecision | None = Field(default=None, exclude_if=lambda v: v is None)
    # An approved run (a person's approval, a quorum's, a grant's): each approver's entries
    # that admitted them (identity, ``group:NAME``), and the digest of the input approved. The
    # tool activity checks them against the worker's own gate just before the tool runs, and a
    # changed list or input voids the approval (``stale``). Left off the wire when unset.
    approved_by: list[list[str]] | None = Field(default=None, exclude_if=lambda v: v is None)
    approved_digest: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # Who sent the message of the turn that made this call (TurnState.requester), kept with
    # the call: separation of duties and what approvers are shown read it here.
    requester: Requester | None = Field(default=None, exclude_if=lambda v: v is None)
    # An MCP call whose server asked for input: the round it is in, until the server is asked
    # again with every answer (it then answers, or asks another round). Left off the wire
    # when unset.
    input_round: InputRound | None = Field(default=None, exclude_if=lambda v: v is None)
    # The turn this call came from, as an approver is shown it (the user's message, the
    # model's words), cut when the call is made. Left off the wire when empty.
    context: CallContext | None = Field(default=None, exclude_if=lambda v: v is None)
    # The announcement of this call's pause on the agent's channels (``Agent(notify=)``):
    # which pause, what each channel posted, and whether its end was posted too. Left off the
    # wire when unset.
    notified: Notified | None = Field(default=None, exclude_if=lambda v: v is None)


class Notified(_Wire):
    """A pause announced on the agent's channels: the pause (its ``since``), what each channel
    answered (``NotifyResult.posted``), and whether the call's end went out."""

    since: datetime | None = None
    # Per channel, what it posted: the announcement, then each reminder and escalation.
    posted: dict[str, list[str]] = Field(default_factory=dict)
    settled: bool = False


class ReceiptHead(_Wire):
    """Where the conversation's chain of decision receipts stands: the next receipt's seq and
    the id of the last one (``workflows.receipts``); carried across continue-as-new."""

    seq: int = 0
    last: str | None = None


class SubAgentLink(_Wire):
    """The child conversation a sub-agent call started: its chat id, the first run id of the
    chain (so a workflow someone starts later under the id is never taken for it), and the
    digest of what it waited on when last read (``SubAgentPendingInput.known``)."""

    chat_id: str
    run_id: str
    digest: str | None = Field(default=None, exclude_if=lambda v: v is None)


class TurnState(_Wire):
    turn: int
    started_at: datetime
    # Length of the message list before this turn, so a failed turn can be rolled back.
    base_len: int
    phase: Literal["model", "tools"] = "model"
    model_calls: int = 0
    # Sub-agent conversations this turn has started (config.MAX_SUB_AGENTS_PER_TURN).
    sub_agents: int = 0
    # What is left of the turn's budget of sub-agent conversations, however deep (None: the
    # whole of it, ConversationState.tree_budget); see config.MAX_SUB_AGENTS_PER_TREE.
    tree_left: int | None = Field(default=None, exclude_if=lambda v: v is None)
    calls: list[CallState] = Field(default_factory=list)
    # Bytes of the messages this turn added (see limits.HELD.turn).
    held: int = 0
    # The model's text is published on the stream as it arrives (asked by send or resume).
    stream: bool = False
    # Who sent the turn's message, as checked (see workflows.requesters). Left off the wire
    # when unset.
    requester: Requester | None = Field(default=None, exclude_if=lambda v: v is None)
    # What the message said of its sender when the agent's definition was not yet known (a
    # conversation's first turn: it comes with the first model call's result): checked as
    # soon as it is, before any call of the turn is decided.
    claim: RequesterClaim | None = Field(default=None, exclude_if=lambda v: v is None)


class RequesterClaim(_Wire):
    """A message's word of who sent it, not yet checked against the agent's rules."""

    identity: str | None = None
    # Never shown in a repr: a credential until it is spent.
    token: str | None = Field(default=None, repr=False)
    # The message's digest (workflows.ids.message_digest): a token made for one message
    # (``identity.SEND_CLAIM``) sends only that one.
    message: str = ""


class SpentToken(_Wire):
    """An identity token that may no longer answer here (see ``workflows.tokens``).

    ``kind="token"``: the one token whose signed part has ``digest``; ``"offered"``: the same,
    for a refused token of an account no approver list names (a pool of its own, oldest
    forgotten first). ``kind="subject"``: every token of the account ``subject`` issued by
    ``issued`` (without one, that stops being accepted by ``until``): what an account's own
    entries are folded into when it has used or offered too many.
    """

    digest: str
    until: datetime
    # A fingerprint of the token's account (``sub``, or the identity it names).
    subject: str | None = None
    kind: Literal["token", "subject", "offered"] = "token"
    # The token's ``iat`` (for a fold: the latest of those it folded).
    issued: datetime | None = None


class ConversationState(_Wire):
    agent: str
    spec: AgentSpec | None = None
    messages: list[Message] = Field(default_factory=list)
    refs: list[str] = Field(default_factory=list)
    turn: TurnState | None = None
    last_turn: TurnResult | None = None
    turns: int = 0
    answers: list[AnswerRecord] = Field(default_factory=list)
    rejections: list[Rejection] = Field(default_factory=list)
    rejections_total: int = 0
    closed: bool = False
    # How many messages the model side has seen: the last call's input and its answer.
    model_seen: int = 0
    # How many of the oldest messages were dropped to keep the state small enough to carry
    # into a new run (see workflows.history.fit_state).
    dropped_messages: int = 0
    # Refs older than the ones in ``refs`` that were forgotten; once any are, a model's call id
    # is never taken as a ref again (it could repeat one), so refs stay unique.
    refs_forgotten: int = 0
    # Answer records shed to keep the log within its budget.
    answers_dropped: int = 0
    # The chain of decision receipts: where it stands (workflows.receipts). Left off the wire
    # until the first receipt.
    receipt_head: ReceiptHead | None = Field(default=None, exclude_if=lambda v: v is None)
    # The newest turn events, without their payloads (those are in the messages and calls);
    # see workflows.events. ``events_total`` is the next event's offset.
    events: list[TurnEvent] = Field(default_factory=list)
    events_total: int = 0
    # Identity tokens already used here, by digest, until they expire: each answers once, so
    # the copy of it in history is spent.
    spent_tokens: list[SpentToken] = Field(default_factory=list)
    # Answer records not yet written to the memo, where the full trail is kept in history
    # across runs (see AgentWorkflow._publish).
    audit_outbox: list[AnswerRecord] = Field(default_factory=list)
    # The newest message ids sends carried (HELD.sent_kept), oldest first.
    sent: list[SentMessage] = Field(default_factory=list)
    # What messages said of their senders that no turn could decide (it ended before the
    # agent's definition came: a first turn whose model call failed or was cancelled): their
    # tokens are in history, so they are spent (as refused answers' are) once the definition
    # comes. The newest few; left off the wire when empty.
    claims_left: list[RequesterClaim] = Field(default_factory=list, exclude_if=lambda v: not v)
    # A sub-agent's conversation (ConversationInput.task): it closes when its turn ends.
    one_turn: bool = Field(default=False, exclude_if=lambda v: not v)
    depth: int = Field(default=0, exclude_if=lambda v: not v)
    # A sub-agent's share of its caller's budget of sub-agents (ConversationInput.budget);
    # None: the whole config.MAX_SUB_AGENTS_PER_TREE.
    tree_budget: int | None = Field(default=None, exclude_if=lambda v: v is None)
    # Remembered decisions in force (workflows.grants), and how many were ever made (their
    # ids count up). Left off the wire while there are none.
    grants: list[Grant] = Field(default_factory=list, exclude_if=lambda v: not v)
    grants_made: int = Field(default=0, exclude_if=lambda v: not v)


class ConversationInput(_Wire):
    """The workflow's input. A start is a request: it names the agent; ``state`` and
    ``stream`` are taken only from the conversation's own continue-as-new (the run refuses them
    from any other start, and records that it did)."""

    agent: str
    # Set only by continue-as-new.
    state: ConversationState | None = None
    # The event stream's newest items and offsets (see workflows.stream); continue-as-new only.
    stream: WorkflowStreamState | None = None
    # A sub-agent's call (``agent_tool``): the conversation's first message, and it closes when
    # that turn ends (its result is the workflow's). Anyone may start one (it is a start, a send
    # and a close); only a parent's call waits for it.
    task: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # How many callers deep this conversation is (0: nobody's sub-agent); see
    # config.MAX_AGENT_DEPTH.
    depth: int = Field(default=0, exclude_if=lambda v: not v)
    # How many sub-agent conversations this one may start in all, however deep: its caller's
    # share (config.MAX_SUB_AGENTS_PER_TREE). A start may only narrow it; None: the whole.
    budget: int | None = Field(default=None, exclude_if=lambda v: v is None)

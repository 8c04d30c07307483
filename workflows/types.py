"""Wire types: everything that crosses a Temporal boundary.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts``, ``temporal_agent_interrupts.types`` and
``temporal_agent_interrupts.policies``.

Workflow input, signals, updates, queries and activity inputs/outputs are all pydantic models in
this one module, which imports only pydantic, the standard library and the stream state type of
``temporalio.contrib.workflow_streams`` (carried by continue-as-new). They are durable schemas:
histories recorded months ago are decoded with them, so evolve them by adding optional fields with
defaults, never by renaming or removing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, LiteralString, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

JsonObject = dict[str, Any]
"""A JSON object, as Gemini's function-call arguments and function responses are."""

M = TypeVar("M", bound=BaseModel)


class _Wire(BaseModel):
    # Unknown fields from a newer writer are ignored rather than fatal, so a rollback of the
    # worker can still decode what a newer one wrote.
    model_config = ConfigDict(extra="ignore")


class Seal(_Wire):
    """A worker's MAC on an activity's result (``workflows.seal``): the key's id, and the MAC."""

    kid: str
    mac: str


# --------------------------------------------------------------------------------------------
# Conversation content, in Gemini's shape.


class FunctionCall(_Wire):
    id: str | None = None
    name: str
    args: JsonObject = Field(default_factory=dict)


class FunctionResponse(_Wire):
    id: str | None = None
    name: str
    response: JsonObject = Field(default_factory=dict)


class Part(BaseModel):
    """One Gemini content part.

    The fields the runtime reads are typed. Everything else Gemini sends (inline data, code
    execution, future fields) is kept verbatim through ``extra="allow"``, because thinking models
    require their parts, thought signatures included, to be sent back unchanged.
    """

    model_config = ConfigDict(extra="allow")

    text: str | None = None
    thought: bool | None = None
    # Base64, as google-genai serializes bytes in JSON mode.
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class Message(_Wire):
    role: Literal["user", "model"]
    parts: list[Part] = Field(default_factory=list)

    def text(self) -> str:
        """The message's visible text: its non-thought text parts, joined."""
        return "".join(p.text for p in self.parts if p.text and not p.thought)


# --------------------------------------------------------------------------------------------
# The agent definition, as data. The worker resolves it from code and records it in history
# through the model activity's result, so replay never depends on the agent's current code.


class RetrySpec(_Wire):
    initial_interval_seconds: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval_seconds: float | None = None
    maximum_attempts: int = 3
    # Exception class names (or ApplicationError types) that end the tool's retries at once.
    non_retryable_error_types: list[str] | None = None


class ReminderSpec(_Wire):
    """A notifying tool run, and the agent's channels told, ``before_seconds`` ahead of an
    interrupt's deadline."""

    notify: str | None = None
    before_seconds: float
    # Channels (``Agent(notify=)`` names) the reminder is posted to. Left off when empty.
    channels: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)


class EscalateSpec(_Wire):
    """At the deadline: run ``notify`` and tell ``channels``, extend the deadline once, then apply
    the final policy."""

    notify: str | None = None
    channels: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    extend_seconds: float
    # The answer once the extended deadline passes too (None: the timed-out answer), or a
    # cancellation of the turn.
    then: JsonObject | None = None
    then_cancel: bool = False


GateReason = Literal["annotation", "list", "default", "untrusted", "agent"]
"""Why a gate decided as it did: the server's annotations, an ``allow``/``gate`` list, the default
for a tool that declares nothing, ``trust_annotations=False``, or the agent's ``ToolApproval``."""


class GateDecision(_Wire):
    """Whether a call of a tool pauses for approval before it runs, and why (MCP tools).

    Decided when the server's tools are listed (``activities.mcp``) and recorded with the
    agent's definition, so a replay decides the same; shown on the call's interrupt and kept in
    its audit record.
    """

    gated: bool
    reason: GateReason
    # What decided it, for people: ``readOnlyHint``, ``destructiveHint``, ``no annotations``,
    # ``gate list``, ``allow list``, ``trust_annotations=False``, ``ToolApproval``.
    detail: str = ""


class MCPToolRef(_Wire):
    """Where an MCP tool's calls go: the server's key on the worker and the tool's own name
    there (the agent's name for it may carry a prefix)."""

    server: str
    tool: str


class SubAgentRef(_Wire):
    """A tool that is another agent (``agent_tool``): each call is a conversation with that
    agent, run as a child workflow of the caller's."""

    agent: str
    # The JSON Schema its reply must fit (``agent_tool(output=...)``): the sub-agent is asked to
    # answer with one JSON object of it, and the call's output is that object. Left off the wire
    # when unset, so a text-only sub-agent's spec (and digest) is what it was.
    output_schema: JsonObject | None = Field(default=None, exclude_if=lambda v: v is None)


ShowFormat = Literal["text", "money", "number", "iban", "masked", "date", "json"]
"""How a shown field's value is written for people: as given; a sum with two decimals and
thousands separated (``7,300.00``); a number with thousands separated; an IBAN or account with
its country and last two characters (``NL91 …00``); the last four characters only (``…4821``);
a date or time as given (an ISO string), with ``T`` read as a space; compact JSON."""

RiskLevel = Literal["low", "medium", "high", "critical"]


class Show(_Wire):
    """One field of a tool's input as an approver is shown it (``Present(fields=...)``).

    ``key`` names a property of the input; a dotted path (``payee.iban``) reaches into nested
    objects. ``label`` is what the person reads (default: the schema's ``title``, else the key
    in words).
    """

    key: str
    label: str | None = None
    format: ShowFormat = "text"


class Present(_Wire):
    """How a tool's call reads to the person asked to approve it, on every surface (the inbox
    page, Slack, email, the UI's details panel, the approvals API, AG-UI).

    For a payment: ``summary="Pay {amount} {currency} to {iban}"``, the amount shown with
    ``format="money"`` and the IBAN with ``format="iban"``, ``risk="high"`` (the Approvals
    page of the docs has the whole example).

    ``summary`` is a one-line template: ``{key}`` is the input's value at ``key``, written by
    its field's ``format`` when ``fields`` lists it (``{{`` and ``}}`` are braces). Without a
    ``Present``, a readable default comes from the input's JSON schema: its titles and formats.
    """

    summary: str | None = None
    fields: list[Show] = Field(default_factory=list)
    risk: RiskLevel | None = None
    risk_note: str | None = None


class ShownField(_Wire):
    label: str
    value: str


class Shown(_Wire):
    """What a person is shown of one paused call: the same on every surface.

    Written by the conversation (``workflows.presentation``) from the tool's ``Present`` (or
    its input schema), the call's input and the turn it came from. Plain text, each part cut to
    a bound and with control and invisible characters made visible; every surface escapes it for
    its own markup (HTML, Slack's mrkdwn, a terminal's).
    """

    title: str
    summary: str
    # Why it waits, in words (the gate's own message is Genkit's vocabulary, for programs).
    why: str = ""
    fields: list[ShownField] = Field(default_factory=list)
    # Fields of the input not shown (past the bound, or not listed by the tool's Present).
    fields_omitted: int = 0
    risk: RiskLevel | None = None
    risk_note: str | None = None
    # Why the agent asks: the user's message that started the turn, and the model's words in
    # the reply that made the call (both cut; empty when there were none).
    asked: str = ""
    said: str = ""


class CallContext(_Wire):
    """The turn a call came from, as a person reading the call is shown it: the user's message
    and the model's words before the call, each cut (``workflows.presentation``)."""

    asked: str = ""
    said: str = ""


class ToolSpec(_Wire):
    name: str
    description: str
    input_schema: JsonObject
    output_schema: JsonObject | None = None
    interrupt_only: bool = False
    timeout_seconds: float | None = None
    retry: RetrySpec | None = None
    # For interrupt-only tools: how long a human has, and the answer given when time runs out.
    deadline_seconds: float | None = None
    on_timeout: JsonObject | None = None
    # Safe to run twice: an approved run may then be retried like any other.
    idempotent: bool = False
    # For interrupt-only tools: the identities (or ``group:NAME``) that may answer (empty:
    # anyone), and how many distinct approvals settle a call.
    approvers: list[str] = Field(default_factory=list)
    quorum: int = 1
    # A restart may change this tool's input (an edit).
    editable: bool = False
    # For interrupt-only tools, what a deadline does besides answering with on_timeout: cancel
    # the turn, or escalate; and the reminders sent before it.
    timeout_cancel: bool = False
    escalate: EscalateSpec | None = None
    reminders: list[ReminderSpec] = Field(default_factory=list)
    # An MCP server's tool: its calls go to the MCP activity (``config.MCP_ACTIVITY``), and its
    # own gate decides whether a call pauses first (its ``approvers`` and ``quorum`` then say
    # who may answer). Left off the wire when unset, so Python tools' specs (and digests) are
    # what they were.
    mcp: MCPToolRef | None = Field(default=None, exclude_if=lambda v: v is None)
    gate: GateDecision | None = Field(default=None, exclude_if=lambda v: v is None)
    # An MCP tool's boolean hints as its server listed them (``readOnlyHint``,
    # ``destructiveHint``, ``idempotentHint``, ``openWorldHint``), which a policy set reads as
    # ``resource.annotations``; None where its toolset does not trust annotations. Left off the
    # wire when unset.
    annotations: JsonObject | None = Field(default=None, exclude_if=lambda v: v is None)
    # Another agent as this tool (``agent_tool``): its calls are child conversations, not
    # activities. Left off the wire when unset, like ``mcp``.
    agent: SubAgentRef | None = Field(default=None, exclude_if=lambda v: v is None)
    # For interrupt-only tools, as ApprovalSpec.separate_duties: the requester of a call may
    # not answer it. Left off the wire when off.
    separate_duties: bool = Field(default=False, exclude_if=lambda v: not v)
    # How a call reads to an approver (``Present``); None: from the input schema. Left off the
    # wire when unset.
    present: Present | None = Field(default=None, exclude_if=lambda v: v is None)


class ApprovalSpec(_Wire):
    allow: list[str] = Field(default_factory=list)
    # The identities (or ``group:NAME``) that may answer a call the gate paused (empty:
    # anyone), and how many distinct approvals let it run.
    approvers: list[str] = Field(default_factory=list)
    quorum: int = 1
    # Separation of duties: whoever sent the message a call came from may not answer it.
    # Left off the wire when off, so the specs (and digests) of agents without it stay as
    # they were.
    separate_duties: bool = Field(default=False, exclude_if=lambda v: not v)


PolicyEffect = Literal["allow", "ask", "deny"]
"""What a policy set decides of one tool call (``activities.policy``): run it, pause it for
approval, or refuse it (the model hears the reason; nothing runs)."""


class PolicyDecision(_Wire):
    """A policy set's decision on one tool call (Cedar, ``activities.policy``).

    Made by an activity and recorded in history with the hash of the policy set that made it: a
    replay reads this and never evaluates the policy again. An ``ask`` names who may approve
    (identities or ``group:NAME``; empty: anyone who may answer), how many distinct approvals
    settle the call, and how long they have.
    """

    effect: PolicyEffect
    reason: str = ""
    approvers: list[str] = Field(default_factory=list)
    quorum: int = Field(default=1, ge=1)
    deadline_seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)
    # The sha256 of the policy set that decided (``Policy.hash``): a new set re-decides.
    policy_hash: str
    # The policies that decided, by their ``@id`` (else Cedar's ``policyN``, N its position in
    # the set), the one whose annotations were applied first.
    policy_ids: list[str] = Field(default_factory=list)


class TrustSpec(_Wire):
    """Whose identity tokens a conversation accepts (``TrustedIssuer`` as data).

    The keys are data in the agent definition, recorded in history with it, so verification
    inside the workflow is deterministic and replays the same way.
    """

    issuer: str
    audience: str
    # A JWK Set: {"keys": [{"kty": ..., "kid": ..., ...}, ...]}; public keys only.
    jwks: JsonObject
    # The claim that lists the holder's groups (for ``group:NAME`` approvers), and the one
    # that names the holder (``email`` counts only with ``email_verified: true``; else ``sub``).
    groups_claim: str = "groups"
    identity_claim: str = "email"
    # Clock skew allowed on ``exp`` and ``nbf``.
    leeway_seconds: float = 60.0


class AgentSpec(_Wire):
    name: str
    model: str
    system: str | None = None
    tools: list[ToolSpec] = Field(default_factory=list)
    approval: ApprovalSpec | None = None
    max_turns: int = 10
    # Agent-wide interrupt deadline; a tool's own deadline takes precedence.
    interrupt_deadline_seconds: float | None = None
    on_interrupt_timeout: JsonObject | None = None
    # The same deadline policies as a tool's, for interrupts without a deadline of their own.
    interrupt_timeout_cancel: bool = False
    interrupt_escalate: EscalateSpec | None = None
    interrupt_reminders: list[ReminderSpec] = Field(default_factory=list)
    # Answers carry identity tokens from this issuer (None: identity is what the caller says).
    trust: TrustSpec | None = None
    digest: str = ""
    # The sha256 of the Cedar policy set the worker decides this agent's tool calls with
    # (``Agent(policy=)``, ``agent-worker --policy``): the workflow asks the policy activity
    # before a call runs. Left off the wire when unset, so specs without a policy (and their
    # digests) are what they were.
    policy_hash: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The channels each paused call is announced on (``Agent(notify=[...])``): names the
    # worker maps to its configured channels (``AgentsPlugin(channels=...)``). Left off the
    # wire when empty.
    notify: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


# --------------------------------------------------------------------------------------------
# Results a caller sees.


class FinishReason(StrEnum):
    STOP = "stop"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MAX_TURNS = "max_turns"


InterruptSource = Literal["interrupt", "approval", "tool", "input"]
"""Why a call paused: an interrupt-only tool, the ToolApproval gate, a tool that raised, or an MCP
server that asked for input (a form to fill, answered with ``respond``)."""


# --------------------------------------------------------------------------------------------
# The approval vocabulary. Approve and deny are sugar on Genkit's two answers (respond and
# restart); these words are on the wire, in recorded histories and in what the model was told,
# so they are spelled here once and never changed.

TOOL_APPROVED = "tool_approved"
"""The ``resumed_metadata`` key that lets a restarted gated or conditional tool run."""

APPROVED = "approved"
"""The output key of an interrupt-only approval tool's answer: ``{"approved": true}``."""

FEEDBACK = "feedback"
"""The output key that carries a human's reason when an interrupt-only tool is denied."""

DENIED_BY_USER = "denied by the user"
"""The ``error`` the model is told when a gated or conditional tool is denied."""

NO_REASON_GIVEN = "no reason given"
"""The denial ``reason`` when the human gave none (for a gated or conditional tool)."""

DEADLINE_IDENTITY = "system:deadline"
"""The identity on record for what a deadline did (answered with its default, or cancelled)."""

HISTORY_IDENTITY = "system:history"

POLICY_IDENTITY = "system:policy"
"""The identity on the record of a call the agent's policy set allowed or denied by itself."""
"""The identity on record when a running turn was stopped because the run's history neared
Temporal's limits (see ``AgentWorkflow._guard_history``)."""

TIMED_OUT = "timed out"
"""The ``error`` of the answer given when nobody answered an interrupt before its deadline."""


def gate_metadata(tool: str, decision: GateDecision | None = None) -> JsonObject:
    """The metadata of a call a gate paused: why it is waiting. A tool with a gate of its own
    (an MCP tool) says what decided it, as ``gate`` too."""
    if decision is None:
        return {"message": f"Tool not in approved list: {tool}"}
    return {
        "message": f"Tool {tool} needs approval ({decision.reason}: {decision.detail})",
        "gate": decision.model_dump(mode="json"),
    }


def timed_out_output() -> JsonObject:
    """The answer given to an interrupt nobody answered in time, when no default is declared."""
    return {"error": TIMED_OUT, APPROVED: False}


def input_digest(args: JsonObject) -> str:
    """What names a call's input exactly: an answer built from an interrupt request carries it
    (``input_digest``), so an answer to an input shown before an edit is refused, not applied
    to what the call holds now. Keys sorted, numbers as JSON spells them (``500`` is not
    ``500.0``), the same test as ``workflows.interrupts.same_json``."""
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------
# Decision receipts (workflows.receipts issues them; client.receipts checks them).

RECEIPT_VERSION = 1


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON bytes (see the module's docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8", "surrogatepass")  # deterministic even for a lone surrogate


def canonical_digest(value: Any) -> str:
    """``sha256:`` and the hex SHA-256 of ``value``'s canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical(value)).hexdigest()


class ReceiptBody(_Wire):
    """What one decision says. Every field is signed.

    Its canonical JSON is every field as written here, nulls included: a field added later
    must be left off when unset (``exclude_if``), or every receipt written before it would no
    longer hash to its id when read back."""

    v: Literal[1] = RECEIPT_VERSION
    chat_id: str
    # The conversation's first run id (the same across continue-as-new): tells it from a later
    # conversation someone started under the same chat id once it had closed.
    run: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The position in the conversation's chain (0 first) and the id of the receipt before it
    # (None for the first).
    seq: int
    prev: str | None = None
    at: datetime
    ref: str
    tool: str
    # The audit record's kind (respond, restart, edit, vote, deadline, cancel, granted,
    # revoked, voided, policy, forwarded) and what it decided.
    kind: str
    decision: str | None = None
    # The digest of the input decided on (canonical JSON), when the decision had one.
    input_digest: str | None = None
    # Who decided: an identity, and how it was proven. ``verified`` with an issuer: a token
    # of that issuer, its subject's fingerprint and its key id; without: what the caller said.
    approver: str | None = None
    verified: bool = False
    issuer: str | None = None
    subject: str | None = None
    token_key_id: str | None = None
    # What decided where no person did: a grant's id, a policy set's hash.
    grant: str | None = None
    policy_hash: str | None = None
    # A caller's record of an answer passed on to a sub-agent: the sub-agent's chat, and the
    # id of its latest receipt when the caller last read it.
    child_chat_id: str | None = None
    child: str | None = None

    def id(self) -> str:
        """The receipt's id: the hex SHA-256 of this body's canonical JSON."""
        return hashlib.sha256(self.canonical()).hexdigest()

    def canonical(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


class Receipt(_Wire):
    """A signed receipt: the body, its id, and an Ed25519 signature of the body's canonical JSON
    (base64url, no padding) under ``key_id`` (a key of the worker's set, published as a JWK)."""

    id: str
    body: ReceiptBody
    key_id: str | None = None
    signature: str | None = Field(default=None, exclude_if=lambda v: v is None)


class ReceiptChain(_Wire):
    """A conversation's receipts, oldest first, as ``agentctl audit --export`` writes them: the
    file ``agentctl verify`` reads."""

    format: Literal["temporal-agent-interrupts/receipts"] = "temporal-agent-interrupts/receipts"
    v: Literal[1] = RECEIPT_VERSION
    chat_id: str
    receipts: list[Receipt] = Field(default_factory=list)
    # The sub-agents' chains, by chat id, each linked from a caller's receipt (``child``).
    children: dict[str, list[Receipt]] = Field(default_factory=dict)
    # The key ids the receipts were signed under (the verifier's JWK Set must hold them).
    key_ids: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Error kinds. A StrEnum equals its string, so these are the very values on the wire.


class ErrorKind(StrEnum):
    """The ``type`` of an ``ApplicationError`` the runtime raises, and that callers match on."""

    MODEL_ERROR = "ModelError"
    TOOL_ERROR = "ToolError"
    UNKNOWN_AGENT = "UnknownAgent"
    CONVERSATION_CHANGED = "ConversationChanged"
    SEND_REJECTED = "SendRejected"
    RESUME_REJECTED = "ResumeRejected"
    CANCEL_REJECTED = "CancelRejected"
    GRANT_REJECTED = "GrantRejected"
    REVIEW_REJECTED = "PolicyReviewRejected"
    TOO_MANY_WAITING = "TooManyWaiting"
    NOT_A_CONVERSATION = "NotScheduledByConversation"
    """An activity that acts on the world was started other than by a conversation's own
    ``AgentWorkflow`` run (a standalone activity, another workflow): it did nothing."""
    PAYLOAD_KEY_MISSING = "PayloadKeyMissing"
    """Not raised here: the failure a worker records when it cannot decrypt an activity's input
    (``client.codec.PayloadKeyMissing``, a payload key it lacks). The call never ran."""


class Status(StrEnum):
    """A classified failure status, as in gRPC and Genkit: ``ErrorInfo.status`` and ToolError."""

    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class ToolResponse(_Wire):
    """Answer an interrupt by supplying the tool's output (the tool does not run)."""

    name: str
    ref: str
    output: JsonObject
    # The digest of the input the answer was shown (InterruptRequest.input_digest): refused
    # when the call's input is no longer that one. None: the answer does not say (and the key
    # is left off the wire, which scripts and recorded histories spell without it).
    input_digest: str | None = Field(default=None, exclude_if=lambda v: v is None)


GrantOp = Literal["eq", "prefix", "le", "lt", "ge", "gt"]
"""How a grant's condition compares a field of a call's input with its value: equal (same
JSON type and value), a string prefix, or a numeric bound (numbers only, never booleans)."""


class GrantCondition(_Wire):
    """One condition of a grant's pattern, on the call's input (checked against the tool's
    input schema first): ``{"field": "amount", "op": "le", "value": 100}``."""

    # Unknown keys refused: a misspelt one ignored would widen what the grant lets through.
    model_config = ConfigDict(extra="forbid")

    # A top-level key of the input, or a dotted path into nested objects ("payee.country").
    field: str
    op: GrantOp = "eq"
    value: str | int | float | bool | None = None


class GrantScope(_Wire):
    """What an approval remembers (``approve(..., remember=...)``): calls of the approved
    tool that match every condition of ``match`` (none: every call of the tool), in this
    conversation, until ``until`` (None: for the rest of the conversation, until revoked)."""

    # As GrantCondition: a misspelt "match" ignored would make a grant for every call.
    model_config = ConfigDict(extra="forbid")

    match: list[GrantCondition] = Field(default_factory=list)
    until: datetime | None = None


def remember_digest(scope: GrantScope) -> str:
    """What names a grant's scope exactly (as :func:`input_digest` names an input): a token made
    for one answer (the web app's assertion) carries it, so a copy of the token can ask for no
    other grant than the one the approver chose."""
    return input_digest(scope.model_dump(mode="json"))


def answer_digest(entry: ToolResponse | ToolRestart) -> str:
    """What names one answer exactly: respond or restart, its output or metadata, an edit's
    input and the grant it asks for (the shown input's digest aside, which a token binds on its
    own). A token made for one answer (the web app's assertion) carries it, so a copy of the
    token can give no other answer: an approval's cannot deny, a denial's cannot approve."""
    kind = "respond" if isinstance(entry, ToolResponse) else "restart"
    return input_digest({"kind": kind, **entry.model_dump(mode="json", exclude={"input_digest"})})


class Grant(_Wire):
    """A remembered decision: calls of ``tool`` matching ``match`` run without asking, until
    ``until`` or a revoke (the ``grants`` query, ``Chat.grants()``, ``agentctl grants``)."""

    id: str
    tool: str
    match: list[GrantCondition] = Field(default_factory=list)
    until: datetime | None = None
    # Who approved it: one approver, or every approval of a quorum.
    granted_by: list[str] = Field(default_factory=list)
    # For each of ``granted_by``, the approver entries that admitted them (their identity and
    # ``group:NAME``s): a later call runs unasked only if its approver lists still admit as many
    # grantors as its quorum needs.
    admitted: list[list[str]] = Field(default_factory=list, exclude_if=lambda v: not v)
    # For each of ``granted_by``, their verified account's fingerprint ("" when asserted): a
    # grant never lets through a call its grantor requested, where duties are separated.
    subjects: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    verified: bool = False
    at: datetime
    # The call whose approval made it.
    ref: str
    # Calls it has let through so far.
    uses: int = 0


class GrantsResult(_Wire):
    grants: list[Grant] = Field(default_factory=list)


class PolicyReviewResult(_Wire):
    """What the ``review_policy`` update did: the hash of the policy set the worker holds now,
    and each pending call whose decision changed, by ref (``allow``: released to run; ``deny``:
    refused; ``ask``: still paused, its approvers as the new set names them)."""

    policy_hash: str | None = None
    changed: dict[str, PolicyEffect] = Field(default_factory=dict)


class RevokeGrantInput(_Wire):
    """The ``revoke_grant`` update: end grant ``id`` now (calls it let through that have not
    run yet pause again, ``stale``). Revoking only narrows what runs unasked, so anyone who may
    send updates may revoke; ``identity`` is recorded as asserted."""

    id: str
    identity: str | None = None
    reason: str = ""


class ToolRestart(_Wire):
    """Answer an interrupt by running the tool again with ``resumed_metadata``."""

    name: str
    ref: str
    # Optional; a changed input is an edit, which only a tool declared editable accepts.
    input: JsonObject | None = None
    resumed_metadata: JsonObject = Field(default_factory=dict)
    # As ToolResponse.input_digest.
    input_digest: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # An approval that also grants: later (and pending) calls of the tool within the scope
    # run without asking (see workflows.grants). Left off the wire when unset.
    remember: GrantScope | None = Field(default=None, exclude_if=lambda v: v is None)


class Requester(_Wire):
    """Who sent the message a turn answers (``SendInput.identity``), as the conversation
    recorded it: on the turn, on each call the turn raised, on its interrupts and in the audit
    record of their answers.

    ``verified``: proven by an identity token from the agent's trusted issuer (``trust``),
    checked as an answer's is; otherwise what the sender asserted, which proves nothing.
    """

    identity: str
    verified: bool = False
    # A verified requester's account (a fingerprint of the token's ``sub``, as Vote.subject):
    # separation of duties refuses the same account under another spelling of the identity.
    subject: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # A verified requester's groups (the token's groups claim; at most 16, each at most 128
    # bytes): what a policy set reads as the principal's groups. Left off when empty.
    groups: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)


class Vote(_Wire):
    """One approval of a call that needs a quorum (a denial settles the call at once)."""

    identity: str
    verified: bool = False
    at: datetime
    # A verified vote's account (a fingerprint of the token's ``sub``): one account votes
    # once, however its tokens spell the identity.
    subject: str | None = None
    # The grant this approval asked for (a quorum tool's grant needs every approval to ask for
    # the same one). Left off the wire when unset.
    remember: GrantScope | None = Field(default=None, exclude_if=lambda v: v is None)
    # With ``remember``: the ``group:NAME`` entries of the approver lists that admitted this
    # voter (a grant checks its grantors again on each later call). Left off when empty.
    groups: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    # On a server's form (source "input"): what names the answer this voter gave; the quorum
    # must give the same one. Left off the wire when unset.
    answer: str | None = Field(default=None, exclude_if=lambda v: v is None)


class InterruptRequest(_Wire):
    """A tool call the conversation is paused on."""

    name: str
    ref: str
    input: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)
    source: InterruptSource = "interrupt"
    since: datetime | None = None
    deadline: datetime | None = None
    # Who may answer (empty: anyone), how many approvals settle it and those given so far.
    approvers: list[str] = Field(default_factory=list)
    # Approvers past the first 1 KiB, left out of ``approvers`` (counted, so a cut list is
    # never read as "not you").
    approvers_omitted: int = 0
    quorum: int = 1
    votes: list[Vote] = Field(default_factory=list)
    # A restart may change the input (``restart(..., input=...)``).
    editable: bool = False
    # What names ``input`` exactly (see input_digest()), whatever this request shows of it; the
    # answers built here carry it, so they answer only the input shown.
    input_digest: str = ""
    # An interrupt-only tool's declared output schema: the shape a respond must have (a web
    # front end builds its form from it). None for gated and conditional tools, whose answer
    # is an approval, and for a tool that declares none.
    output_schema: JsonObject | None = Field(default=None, exclude_if=lambda v: v is None)
    # An editable tool's input schema: what an edit must fit (a web front end builds its edit
    # form from it). None for a tool that is not editable. Left off the wire when unset.
    input_schema: JsonObject | None = Field(default=None, exclude_if=lambda v: v is None)
    # A call a gate paused, of a tool that carries its own gate (an MCP tool): what decided it.
    gate: GateDecision | None = Field(default=None, exclude_if=lambda v: v is None)
    # A sub-agent's interrupt shown on the conversation that called it (``agent_tool``): the
    # caller's call ref, then the ref in the sub-agent's chat (``chat_id``) and so on down.
    # ``ref`` is the innermost, which an answer names; the sub-agent's rules check it.
    path: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    chat_id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # Whose identity tokens an answer must carry (the agent's ``trust``; None: identity is
    # what the caller says). The conversation's own rules say so already; it is here for a
    # caller shown a sub-agent's interrupt, whose rules it cannot read (the details panel
    # suggests a token then, not an identity).
    issuer: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # Who sent the message whose turn raised this call (None: nobody said). Left off the wire
    # when unset.
    requester: Requester | None = Field(default=None, exclude_if=lambda v: v is None)
    # What a person is shown of this call (``Shown``): the tool's summary and fields, its risk,
    # and the user's message and the model's words that led to it. None for a request read
    # from a conversation that predates it.
    shown: Shown | None = Field(default=None, exclude_if=lambda v: v is None)

    def respond(self, output: JsonObject | BaseModel) -> ToolResponse:
        """Build the answer that supplies this tool's output."""
        if isinstance(output, BaseModel):
            output = output.model_dump(mode="json")
        return ToolResponse(
            name=self.name, ref=self.ref, output=output, input_digest=self.input_digest or None
        )

    def restart(
        self,
        resumed_metadata: JsonObject | BaseModel | None = None,
        *,
        input: JsonObject | BaseModel | None = None,
    ) -> ToolRestart:
        """Build the answer that re-runs this tool: with its original input, or with ``input``
        (an edit: only a tool declared ``editable=True`` accepts a changed input).

        The original input is not sent back: the one this request holds may be a placeholder
        for an input too large for the result it came in.
        """
        if isinstance(resumed_metadata, BaseModel):
            resumed_metadata = resumed_metadata.model_dump(mode="json")
        if isinstance(input, BaseModel):
            input = input.model_dump(mode="json")
        return ToolRestart(
            name=self.name,
            ref=self.ref,
            input=input,
            resumed_metadata=resumed_metadata or {},
            input_digest=self.input_digest or None,
        )

    def approve(self, *, remember: GrantScope | None = None) -> ToolResponse | ToolRestart:
        """The approving answer, in the form this interrupt's source needs.

        An interrupt-only approval tool gets ``respond {"approved": true}``; a gated or
        conditional tool gets ``restart`` with ``{"tool_approved": true}``, so it runs with its
        original input.

        Args:
            remember: Also grant: later calls of the tool within this scope run without asking
                (only for a call a gate paused; see ``GrantScope``).
        """
        return approval(
            self.source, self.name, self.ref, input_digest=self.input_digest, remember=remember
        )

    def deny(self, reason: str = "") -> ToolResponse:
        """The denying answer: the tool does not run; the model is told it was declined.

        Args:
            reason: Why, passed on to the model.
        """
        return denial(self.source, self.name, self.ref, reason, input_digest=self.input_digest)

    def input_as(self, model: type[M]) -> M:
        """The tool's input parsed into ``model`` (like Genkit Go's ``InterruptAs[T]``).

        Raises:
            pydantic.ValidationError: the input does not fit ``model``. Its title names the
                model, the tool and the ref (``1 validation error for PriorityAsk (the input
                of 'pickPriority', ref '...')``), and its errors are pydantic's own.
        """
        return _parsed_as(model, self.input, what=f"the input of {self.name!r}, ref {self.ref!r}")

    def metadata_as(self, model: type[M]) -> M:
        """The interrupt's metadata (what the tool's ``Interrupt`` carried, or the gate's
        message) parsed into ``model``.

        Raises:
            pydantic.ValidationError: the metadata does not fit ``model``; titled as in
                :meth:`input_as` (``... (the metadata of 'refundCustomer', ref '...')``).
        """
        what = f"the metadata of {self.name!r}, ref {self.ref!r}"
        return _parsed_as(model, self.metadata, what=what)


def _parsed_as(model: type[M], value: JsonObject, *, what: str) -> M:
    """``model.model_validate(value)``, with a ValidationError whose title says which model and
    what it was asked to parse: pydantic's own names only the model, and one answer often
    reads several interrupts."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        title = f"{model.__name__} ({what})"
        # pydantic-core types an error's details for reading (ErrorDetails) apart from those
        # for building one (InitErrorDetails), and a custom error's type and message as
        # literal strings; these are the very values it gave, handed back.
        errors = cast("list[InitErrorDetails]", e.errors())
        try:
            retitled = ValidationError.from_exception_data(title, errors)
        except KeyError:  # a PydanticCustomError's own type, unknown to pydantic-core
            retitled = ValidationError.from_exception_data(
                title,
                [
                    {"type": PydanticCustomError(cast("LiteralString", err["type"]),
                                                 cast("LiteralString", err["msg"])),
                     "loc": err["loc"], "input": err["input"]}
                    for err in e.errors()
                ],
            )  # fmt: skip
        raise retitled from None


def approval(
    source: InterruptSource,
    name: str,
    ref: str,
    *,
    input_digest: str | None = None,
    remember: GrantScope | None = None,
) -> ToolResponse | ToolRestart:
    """The approving answer to a paused call of ``source``: ``respond {"approved": true}`` for
    an interrupt-only tool, ``restart {"tool_approved": true}`` for a gated or conditional one
    (an interrupt request and an inbox entry build theirs here).

    Raises:
        ValueError: ``remember`` for an interrupt-only tool, whose answer is for one call.
    """
    shown = input_digest or None
    if source == "input":
        # A server's form with nothing to fill (a confirmation): an empty answer accepts it.
        if remember is not None:
            raise ValueError(
                f"remember: {name!r} is paused on a server's input request, whose answer is "
                "for that request alone"
            )
        return ToolResponse(name=name, ref=ref, output={}, input_digest=shown)
    if source == "interrupt":
        if remember is not None:
            raise ValueError(
                f"remember: {name!r} is an interrupt, whose answer is for that call alone; only "
                "the approval of a call a gate paused can be remembered"
            )
        return ToolResponse(name=name, ref=ref, output={APPROVED: True}, input_digest=shown)
    return ToolRestart(
        name=name,
        ref=ref,
        resumed_metadata={TOOL_APPROVED: True},
        input_digest=shown,
        remember=remember,
    )


def denial(
    source: InterruptSource,
    name: str,
    ref: str,
    reason: str = "",
    *,
    input_digest: str | None = None,
) -> ToolResponse:
    """The denying answer to a paused call of ``source`` (the tool does not run)."""
    output: JsonObject = (
        {APPROVED: False, FEEDBACK: reason}
        if source == "interrupt"
        else {"error": DENIED_BY_USER, "reason": reason or NO_REASON_GIVEN}
    )
    return ToolResponse(name=name, ref=ref, output=output, input_digest=input_digest or None)


class ErrorInfo(_Wire):
    status: str
    message: str
    # Optional, added for callers that act on a failure without reading its text:
    # the ``ErrorKind`` the runtime classified it as (``UnknownAgent``, a tool's ``ToolError``,
    # a ``ModelError``), where it did.
    kind: str | None = None
    # For ``UnknownAgent``: the agents the worker that took the call hosts (as data from that
    # worker, cut to 1 KiB of names).
    hosted: list[str] | None = None


class TurnResult(_Wire):
    """How a turn ended (or where it is paused)."""

    turn: int = 0
    finish_reason: FinishReason
    text: str = ""
    interrupts: list[InterruptRequest] = Field(default_factory=list)
    error: ErrorInfo | None = None
    # Pending interrupts left out of ``interrupts`` because the result would be too large
    # (a reply that paused on very many); ``Chat.pending()`` lists every one.
    interrupts_omitted: int = 0
    # The conversation ended with this turn: its first turn asked for an agent no worker on
    # the task queue hosts (``error.kind`` is ``UnknownAgent``), so it was closed rather than
    # left running for a message no worker can answer.
    closed: bool = False
    # A send that repeated the message (its ``message_id``) of the turn it reports: it started
    # nothing, and this is how the turn the first send started stands.
    repeat: bool = False
    # A pause reported while some sub-agent calls of the message were still at work (the
    # conversation continued as new then); ``Chat.last_turn()`` waits until each has paused
    # or ended, and returns the whole pause. Every other pause is reported whole: once every
    # call of the message has paused (a sub-agent's: its child waits on someone) or ended.
    partial: bool = Field(default=False, exclude_if=lambda v: not v)
    # A resume's result: the id of the receipt of the decision it made (the last, when it made
    # several): a caller that passed the answer on links its own receipt to it. Left off the
    # wire when unset.
    receipt: str | None = Field(default=None, exclude_if=lambda v: v is None)


# --------------------------------------------------------------------------------------------
# Handler inputs and query results.


class SendInput(_Wire):
    text: str
    # The agent the caller believes this chat belongs to; a mismatch is rejected.
    agent: str | None = None
    # Publish the model's text on the conversation's stream as it arrives (the turn's other
    # events are always published).
    stream: bool = False
    # The caller's id for this message. A send repeated with it (a retry after a timeout, a
    # send that may or may not have got in) joins the turn the first one started, instead of
    # starting another with the same message.
    message_id: str | None = None
    # Who sends it (recorded as the turn's requester), and for an agent that verifies identity
    # (``trust``) the JWT that proves it, checked and spent as an answer's is. The token is
    # never shown in a repr: it is a credential until it is spent. Both are left off the wire
    # when unset, so the sends recorded before them decode and replay as they were.
    identity: str | None = Field(default=None, exclude_if=lambda v: v is None)
    identity_token: str | None = Field(default=None, repr=False, exclude_if=lambda v: v is None)


class ResumeInput(BaseModel):
    """The ``resume`` payload, by signal or update. Unknown keys are rejected (typo safety)."""

    model_config = ConfigDict(extra="forbid")

    respond: list[ToolResponse] = Field(default_factory=list)
    restart: list[ToolRestart] = Field(default_factory=list)
    identity: str | None = None
    # A JWT from the agent's trusted issuer, when the agent verifies identity (``trust``).
    # Never shown in a repr: it is a credential until it is spent.
    identity_token: str | None = Field(default=None, repr=False)
    metadata: JsonObject | None = None
    # As SendInput.stream: the rest of the turn streams the model's text.
    stream: bool = False


class CancelInput(_Wire):
    reason: str = ""
    identity: str | None = None


EventKind = Literal["text", "tool_request", "interrupt", "tool_response", "answer", "turn_end"]

AnswerKind = Literal[
    "respond",
    "restart",
    "edit",
    "vote",
    "cancel",
    "deadline",
    "forwarded",
    "granted",
    "revoked",
    "voided",
    "policy",
    "notified",
    "sub_agent",
]
"""``granted``: a call a grant let through, or re-approved when the grant was made while it was
pending (the record names the grant and who gave it). ``revoked``: a grant ended, by a revoke or
its expiry (the record's ``ref`` is the call whose approval made it). ``voided``: an approval
checked again just before its call ran no longer held (``stale``); the call paused again.
``policy``: the agent's policy set allowed a call to run unasked, or denied it (the record's
``metadata`` has the set's hash, the deciding policies and the reason).
``forwarded``: a caller's record of an answer given on its chat for a sub-agent's interrupt
and passed on to the sub-agent, with the sub-agent's verdict (the sub-agent's own trail holds
the answer as applied).
``sub_agent``: a caller's record that a sub-agent's conversation ended, written only when the
sub-agent issued receipts: its receipt links the sub-agent's last one (``child``), so the
sub-agent's whole chain is pinned by the caller's (``client.receipts.verify_chain``)."""
ForwardVerdict = Literal["applied", "refused"]
AnswerVia = Literal[
    "update", "signal", "deadline", "cancel", "grant", "policy", "recheck", "notify", "sub_agent"
]
Decision = Literal[
    "approved",
    "denied",
    "answered",
    "edited",
    "expired",
    "cancelled",
    "vote",
    "revoked",
    "stale",
]
"""What an answer decided, as the audit log records it (see ``workflows.events.decision``)."""


class AnswerRecord(_Wire):
    """One applied answer, kept in the conversation's audit log."""

    at: datetime
    ref: str
    name: str
    kind: AnswerKind
    via: AnswerVia
    identity: str | None = None
    metadata: JsonObject | None = None
    # What was decided (None in records written before decisions were recorded), whether the
    # identity was verified (a token from the agent's trusted issuer) rather than asserted,
    # and the answer's output (a respond's or a deadline's; its size and digest above 4 KiB).
    decision: Decision | None = None
    identity_verified: bool = False
    output: JsonObject | None = None
    # An edit: the input the tool runs with, and the model's (each a digest above 4 KiB).
    input: JsonObject | None = None
    original_input: JsonObject | None = None
    # The gate decision the answered call paused on (MCP tools: annotation, list or default).
    gate: GateDecision | None = Field(default=None, exclude_if=lambda v: v is None)
    # In a caller's audit trail, a record of one of its sub-agents (``agent_tool``): the
    # sub-agent's chat id (the answer was applied there, by its rules). The trail's reader sets
    # it (client.audit) on the sub-agent's records; a ``forwarded`` record has it from the
    # caller's workflow, naming the sub-agent it passed the answer on to.
    chat_id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # A ``forwarded`` record: what the sub-agent made of the answer, and why it refused it.
    verdict: ForwardVerdict | None = Field(default=None, exclude_if=lambda v: v is None)
    verdict_reason: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The grant this record is about: made by this approval, used (``granted``) or ended
    # (``revoked``), and who gave it.
    grant: str | None = Field(default=None, exclude_if=lambda v: v is None)
    granted_by: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)
    # Who sent the message whose turn raised the answered call (None: nobody said).
    requester: Requester | None = Field(default=None, exclude_if=lambda v: v is None)
    # A ``notified`` record: the channel a paused call was announced on (or its final state
    # posted to), and whether that reached it; ``verdict_reason`` says why not.
    channel: str | None = Field(default=None, exclude_if=lambda v: v is None)
    delivered: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    # The signed receipt of this decision (workflows.receipts): None for a record that decides
    # nothing (``notified``) or one written before receipts were issued.
    receipt: Receipt | None = Field(default=None, exclude_if=lambda v: v is None)
    # When the answered call paused (None: it never did, as a call a grant or the policy set
    # let through; or a record written before this was kept): ``at`` minus this is how long
    # the decision took (``agentctl stats``).
    since: datetime | None = Field(default=None, exclude_if=lambda v: v is None)


class TurnAnswer(_Wire):
    """Who answered an interrupt, how, and by which path (a turn event's ``answer``)."""

    kind: AnswerKind
    via: AnswerVia
    identity: str | None = None
    # The resume's own metadata (audit data); left out of the events a conversation keeps.
    metadata: JsonObject | None = None
    decision: Decision | None = None
    identity_verified: bool = False
    # An edit's input before the edit (the event's ``input`` is the edited one).
    original_input: JsonObject | None = None
    # As AnswerRecord.gate.
    gate: GateDecision | None = Field(default=None, exclude_if=lambda v: v is None)
    # As AnswerRecord.grant and granted_by.
    grant: str | None = Field(default=None, exclude_if=lambda v: v is None)
    granted_by: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)
    # As AnswerRecord.requester.
    requester: Requester | None = Field(default=None, exclude_if=lambda v: v is None)
    # A verified answer's account (a fingerprint of the token's ``sub``), for its receipt.
    subject: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The trusted key that verified the answer's token (its kid), for its receipt.
    token_key_id: str | None = Field(default=None, exclude_if=lambda v: v is None)


class TurnEvent(_Wire):
    """One step of a turn, as the turn state machine saw it happen.

    Every turn is an ordered list of these; the audit log, the operator view and the stream
    are projections of them (see ``workflows/events.py``). ``offset`` counts every event of the
    conversation, across continue-as-new. The fields set depend on ``kind``:

    - ``text``: ``text``, the model's new visible text.
    - ``tool_request``: ``name``, ``ref``, ``input``: the model asked for a tool call.
    - ``interrupt``: ``name``, ``ref``, ``interrupt``: the call paused for a human.
    - ``answer``: ``name``, ``ref``, ``answer`` (and ``output`` for a respond).
    - ``tool_response``: ``name``, ``ref``, ``output`` or ``error``: what the model will be told.
    - ``turn_end``: ``result``, the TurnResult (a pause ends with ``interrupted``).
    """

    offset: int = 0
    turn: int = 0
    kind: EventKind
    at: datetime | None = None
    text: str | None = None
    name: str | None = None
    ref: str | None = None
    input: JsonObject | None = None
    interrupt: InterruptRequest | None = None
    output: JsonObject | None = None
    error: ErrorInfo | None = None
    answer: TurnAnswer | None = None
    result: TurnResult | None = None


class Rejection(_Wire):
    """An answer, message or start the conversation refused, kept for operators."""

    at: datetime
    # "activity": an activity's result without a worker's seal (workflows.seal), not taken.
    via: Literal["update", "signal", "start", "activity"]
    handler: str
    reason: str
    identity: str | None = None
    digest: str = ""


AgentStatus = Literal["running", "interrupted", "idle", "closed"]


class StatusResult(_Wire):
    chat_id: str
    agent: str
    status: AgentStatus
    turns: int
    model: str | None = None
    pending: list[InterruptRequest] = Field(default_factory=list)
    last_turn: TurnResult | None = None
    rejections: int = 0
    # The bytes continue-as-new would carry now (always under the state budget).
    carried_bytes: int | None = None
    # The newest answers on record (``Chat.history()`` has the whole log the run keeps).
    recent_answers: list[AnswerRecord] = Field(default_factory=list)


class HistoryInput(_Wire):
    """Which page of the history: the newest messages before index ``end`` (None: the end)."""

    end: int | None = None


class HistoryResult(_Wire):
    messages: list[Message] = Field(default_factory=list)
    answers: list[AnswerRecord] = Field(default_factory=list)
    # How many of the oldest messages were dropped before ``messages`` (a very long
    # conversation keeps what fits in one continue-as-new payload).
    dropped_messages: int = 0
    # Where ``messages`` starts among the messages the conversation holds: above 0, the older
    # ones did not fit in one query result; ask again with ``HistoryInput(end=start)``.
    start: int = 0
    # How many of the oldest answer records were shed to keep the log within its budget.
    answers_dropped: int = 0


class RejectionsResult(_Wire):
    rejections: list[Rejection] = Field(default_factory=list)
    total: int = 0


class MCPListingResult(_Wire):
    """The MCP servers' tools in the definition the conversation recorded (the
    ``mcp_listing`` query): which server each name is the conversation's from, and the listing
    a worker that has never listed a server takes for it (``activities.mcp``)."""

    tools: list[ToolSpec] = Field(default_factory=list)


class PendingResult(_Wire):
    interrupts: list[InterruptRequest] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Workflow state, carried across continue-as-new.


class ConversationResult(_Wire):
    chat_id: str
    turns: int
    last_turn: TurnResult | None = None
    # The id of the conversation's latest decision receipt (None: it issued none). A caller
    # links a sub-agent's whole chain by it when the sub-agent ends (``sub_agent`` records).
    last_receipt: str | None = Field(default=None, exclude_if=lambda v: v is None)


# --------------------------------------------------------------------------------------------
# Activities.


class MessagesInput(_Wire):
    start: int = 0
    end: int | None = None


class MessagesResult(_Wire):
    messages: list[Message] = Field(default_factory=list)
    # Where to ask from next when the slice did not fit in one result (None: it is complete).
    next: int | None = None


class Notice(_Wire):
    """What a notifying tool is told (``Escalate(notify=...)``, ``Remind(notify=...)``): which
    paused call, and why now."""

    chat_id: str
    agent: str
    # "reminder": its deadline is near; "escalation": it passed and was extended once
    # (``interrupt.deadline`` is the new one).
    reason: Literal["reminder", "escalation"]
    interrupt: InterruptRequest

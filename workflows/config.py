"""Named configuration the workflow uses: activity names, timeouts, retries, search attributes.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Everything here is a constant; nothing reads the environment. Activity and search-attribute names
are durable identifiers: renaming one breaks conversations already in flight.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy, SearchAttributeKey

WORKFLOW_TYPE = "AgentWorkflow"
"""The conversation's workflow type; the activities act only for a run of it."""

ACTIVITY_PREFIX = "agent_interrupts."
"""Every activity of the product is named under this prefix: the plugin registers them on the
team's own workers, beside the team's own activities, and a worker refuses two activities of one
name. A bare ``tool_call`` of the team's would otherwise stop the worker from starting."""

MODEL_ACTIVITY = ACTIVITY_PREFIX + "model_call"
TOOL_ACTIVITY = ACTIVITY_PREFIX + "tool_call"
MCP_ACTIVITY = ACTIVITY_PREFIX + "mcp_call"
MCP_SAMPLE_ACTIVITY = ACTIVITY_PREFIX + "mcp_sample"
"""Answer an MCP server's sampling request (an input round's) with the agent's own model; the
prompt is the activity's input, recorded in history."""
MCP_SAMPLE_START_TO_CLOSE = timedelta(minutes=2)
NOTIFY_ACTIVITY = ACTIVITY_PREFIX + "notify"
"""Tell one of the worker's channels (Slack, email) that a call paused, or how it ended
(``activities.notify``); scheduled by the conversation, never awaited by its turn."""
NOTIFY_START_TO_CLOSE = timedelta(seconds=10)
NOTIFY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=16),
    # At most about 90 s of a channel being down (31 s of backoff, six attempts of at most 10 s)
    # before the failure is on record. The turn never waits for it (a deadline passes on time
    # however long the channel is down); a run due to continue as new waits for notifications
    # in flight, so this also bounds how long a channel that is down holds that.
    maximum_attempts=6,
    non_retryable_error_types=["NotScheduledByConversation", "ChannelNotConfigured"],
)
POLICY_ACTIVITY = f"{ACTIVITY_PREFIX}policy_decide"
"""Decide a model message's tool calls with the agent's Cedar policy set (``activities.policy``):
the decision is recorded in history, so a replay never evaluates the policy again."""
POLICY_ATTEMPTS = 3
"""Attempts at a message's policy decision before its calls are denied (evaluation is pure: a
failure is a lost worker or a set that cannot load, which a retry may outlast)."""
POLICY_START_TO_CLOSE = timedelta(seconds=30)
"""Evaluation is in-process and bounded (``activities.policy``): milliseconds for a message's
calls; the rest is a worker being slow to pick it up."""
SUB_AGENT_PENDING_ACTIVITY = ACTIVITY_PREFIX + "sub_agent_pending"
SUB_AGENT_RESUME_ACTIVITY = ACTIVITY_PREFIX + "sub_agent_resume"
"""Read a sub-agent's pending interrupts, and pass it an answer given to its caller: the
workflow can neither query another workflow nor wait on its update, an activity can."""
ACTIVITY_ENDING_ACTIVITY = ACTIVITY_PREFIX + "activity_ending"
"""How one of the run's activities ended, as its history says (a timeout the server made, or a
failure sent by id shaped as one): the workflow sees the two alike, its history does not."""
ACTIVITY_ENDING_START_TO_CLOSE = timedelta(seconds=60)
SUB_AGENT_SIGNAL = "sub_agent"
SUB_AGENT_ANSWER_UPDATE_PREFIX = "answer-"
"""The id of every ``resume`` update a caller passes on to its sub-agent starts so: the
sub-agent takes such an answer into its history whatever it makes of it, and one it refuses
spends its identity token there too (the token is in the caller's history already)."""
"""What a sub-agent's conversation signals its caller when what it waits on changes."""
"""Calls of MCP servers' tools, one activity for every server (``MCPCallInput.server``)."""

MODEL_START_TO_CLOSE = timedelta(minutes=5)
# Model and tool activities heartbeat while they wait, so a dead worker is noticed in seconds,
# not after the whole start-to-close timeout.
MODEL_HEARTBEAT = timedelta(seconds=30)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
)

TOOL_START_TO_CLOSE = timedelta(minutes=5)
TOOL_HEARTBEAT = timedelta(seconds=30)
TOOL_RETRY_ATTEMPTS = 3

# A model or tool call whose input the worker that took it could not decrypt (it lacks the
# payload key the conversation is written with) never ran: it is scheduled again, not failed,
# first after this, each time twice as long, at most the second; for at most the third, from
# the first such failure, after which the call fails saying its input could not be decrypted.
UNDECRYPTABLE_RETRY_FIRST = timedelta(seconds=2)
UNDECRYPTABLE_RETRY_MAX = timedelta(minutes=10)
UNDECRYPTABLE_GIVE_UP = timedelta(days=1)

# A run continues as new on Temporal's suggestion only after this many events, so a carried
# state large enough to trip the suggestion at once cannot loop. (Sizes and budgets, including
# the history bounds that need no suggestion, are in workflows.limits.)
MIN_EVENTS_BEFORE_CONTINUE_AS_NEW = 20

AGENT_NAME = SearchAttributeKey.for_keyword("AgentName")
AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
PENDING_INTERRUPTS = SearchAttributeKey.for_keyword_list("PendingInterrupts")
INTERRUPTED_SINCE = SearchAttributeKey.for_datetime("InterruptedSince")

SEARCH_ATTRIBUTES = (AGENT_NAME, AGENT_STATUS, PENDING_INTERRUPTS, INTERRUPTED_SINCE)
"""Every custom search attribute the workflow upserts; the namespace must have them."""

MAX_AGENT_DEPTH = 4
"""How deep sub-agents nest (``agent_tool``): a conversation this many callers deep calls no
further sub-agent (the call fails classified ``FAILED_PRECONDITION``), so an agent that calls
itself, directly or round a loop, stops."""

MAX_SUB_AGENTS_PER_TURN = 16
"""How many sub-agent conversations one turn starts at most (``agent_tool``), over all its
model calls: a model told (or injected) to call sub-agents 128 at a time, each of them doing the
same, would otherwise start 128 + 128² + ... conversations, each with its own model calls. A
call past the limit is not made: its output is an error the model hears. With
:data:`MAX_AGENT_DEPTH` alone, a turn's tree could hold 16 + 16² + 16³ + 16⁴ sub-agents:
:data:`MAX_SUB_AGENTS_PER_TREE` bounds it."""

MAX_SUB_AGENTS_PER_TREE = 32
"""How many sub-agent conversations one message starts in all, however deep (``agent_tool``).
Each conversation that calls a sub-agent debits one from its budget and gives the child a
share of what is left, in the child's start input (``ConversationInput.budget``); the child
debits its own children from that share. A start may only narrow it (anyone may start a
workflow): a larger one is taken as this. Without it, one message fanned out into 272
conversations and 290 model calls two levels deep (69,904 conversations possible four deep).
A call past the budget is not made: its output is an error the model hears."""

SUB_AGENT_START_TO_CLOSE = timedelta(seconds=60)
SUB_AGENT_RETRY = RetryPolicy(maximum_attempts=3)
# An answer passed to a sub-agent waits for the sub-agent's turn to stop again, as a resume of
# the caller's own does: its tools and model calls may take long, so the wait is bounded by a
# heartbeat (a lost worker is noticed in seconds), and each retry asks again under the first
# attempt's update id, which Temporal answers with that update's outcome (never a second answer).
SUB_AGENT_ANSWER_START_TO_CLOSE = timedelta(hours=24)
SUB_AGENT_ANSWER_HEARTBEAT = timedelta(seconds=20)
SUB_AGENT_ANSWER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
)
# The sub-agent pending read heartbeats too (every SUB_AGENT_HEARTBEAT_EVERY seconds), so one
# lost with its worker is retried in seconds rather than at its start-to-close.
SUB_AGENT_HEARTBEAT = timedelta(seconds=10)
# A caller that continued as new while a sub-agent call waited learns the child's end from the
# child's last report, and reads it this often in case that report crossed the continue-as-new
# (a timer: one action an interval on Temporal Cloud, only in such a run).
SUB_AGENT_RECHECK = timedelta(minutes=30)
SUB_AGENT_HEARTBEAT_EVERY = 2.0

UNSEALED_TRIES = 8
"""How many model results in a row without a worker's seal (``workflows.seal``) a turn refuses
and asks again for, before it fails: each is someone completing the call from outside the
workers, and each refusal is recorded."""

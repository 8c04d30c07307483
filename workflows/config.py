"""Named configuration the workflow uses: activity names, timeouts, retries, search attributes.

Everything here is a constant; nothing reads the environment. Activity and search-attribute names
are durable identifiers: renaming one breaks conversations already in flight.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy, SearchAttributeKey

MODEL_ACTIVITY = "model_call"
TOOL_ACTIVITY = "tool_call"

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

MAX_REJECTIONS_KEPT = 20
MIN_EVENTS_BEFORE_CONTINUE_AS_NEW = 20
# What continue-as-new may carry, as JSON. Temporal refuses a payload of about 2 MB (the blob
# size error limit), which would leave the run retrying its workflow task for good.
# The largest function response (or interrupt metadata) a tool may return, as JSON: it is sent
# to the model on every later call and carried by the conversation.
MAX_TOOL_OUTPUT_BYTES = 256 * 1024
MAX_CARRIED_STATE_BYTES = 1_536 * 1024
MAX_ANSWERS_KEPT = 500
MAX_TEXT_IN_DETAILS = 400

AGENT_NAME = SearchAttributeKey.for_keyword("AgentName")
AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
PENDING_INTERRUPTS = SearchAttributeKey.for_keyword_list("PendingInterrupts")
INTERRUPTED_SINCE = SearchAttributeKey.for_datetime("InterruptedSince")

SEARCH_ATTRIBUTES = (AGENT_NAME, AGENT_STATUS, PENDING_INTERRUPTS, INTERRUPTED_SINCE)
"""Every custom search attribute the workflow upserts; the namespace must have them."""

"""The approval vocabulary and the error kinds, spelled once in ``workflows.types``.

These words are on the wire and in recorded histories, so each test pins the exact value or the
exact JSON that was sent before they had one home. No server needed.
"""

from __future__ import annotations

import json

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities.gemini import HTTP_STATUS
from temporal_agent_interrupts.activities.tools import STATUSES, ToolError
from temporal_agent_interrupts.client.api import approve, deny
from temporal_agent_interrupts.workflows.types import (
    APPROVED,
    DENIED_BY_USER,
    FEEDBACK,
    NO_REASON_GIVEN,
    TIMED_OUT,
    TOOL_APPROVED,
    ErrorInfo,
    ErrorKind,
    InterruptRequest,
    InterruptSource,
    Status,
    ToolResponse,
    ToolRestart,
    gate_metadata,
    timed_out_output,
)

SOURCES: tuple[InterruptSource, ...] = ("interrupt", "approval", "tool")


def pending(source: InterruptSource) -> InterruptRequest:
    return InterruptRequest(name="charge", ref="r1", input={"amount": 5}, source=source)


def wire(answer: ToolResponse | ToolRestart) -> str:
    return answer.model_dump_json()


def test_constants_keep_their_values() -> None:
    assert TOOL_APPROVED == "tool_approved"
    assert APPROVED == "approved"
    assert FEEDBACK == "feedback"
    assert DENIED_BY_USER == "denied by the user"
    assert NO_REASON_GIVEN == "no reason given"
    assert TIMED_OUT == "timed out"
    assert gate_metadata("deploy") == {"message": "Tool not in approved list: deploy"}
    assert json.dumps(timed_out_output()) == '{"error": "timed out", "approved": false}'
    # A fresh dict each time: a caller that edits one cannot change the next.
    timed_out_output()["error"] = "x"
    assert timed_out_output()["error"] == "timed out"


def test_approve_an_interrupt_only_tool_responds_approved() -> None:
    answer = pending("interrupt").approve()
    assert isinstance(answer, ToolResponse)
    assert wire(answer) == '{"name":"charge","ref":"r1","output":{"approved":true}}'


@pytest.mark.parametrize("source", ["approval", "tool"])
def test_approve_a_gated_or_conditional_tool_restarts_it(source: InterruptSource) -> None:
    answer = pending(source).approve()
    assert isinstance(answer, ToolRestart)
    # The input is not sent back: the request's copy may be a placeholder for a large one,
    # which an editable tool would take as an edit. The tool runs with its original input.
    assert wire(answer) == (
        '{"name":"charge","ref":"r1","input":null,"resumed_metadata":{"tool_approved":true}}'
    )


@pytest.mark.parametrize(
    ("source", "reason", "output"),
    [
        ("interrupt", "", '{"approved":false,"feedback":""}'),
        ("interrupt", "too much", '{"approved":false,"feedback":"too much"}'),
        ("approval", "", '{"error":"denied by the user","reason":"no reason given"}'),
        ("approval", "no", '{"error":"denied by the user","reason":"no"}'),
        ("tool", "", '{"error":"denied by the user","reason":"no reason given"}'),
        ("tool", "risky", '{"error":"denied by the user","reason":"risky"}'),
    ],
)
def test_deny_per_source(source: InterruptSource, reason: str, output: str) -> None:
    answer = pending(source).deny(reason)
    assert isinstance(answer, ToolResponse)
    assert wire(answer) == '{"name":"charge","ref":"r1","output":' + output + "}"


@pytest.mark.parametrize("source", SOURCES)
def test_client_approve_and_deny_are_the_methods(source: InterruptSource) -> None:
    i = pending(source)
    assert wire(approve(i)) == wire(i.approve())
    assert wire(deny(i)) == wire(i.deny())
    assert wire(deny(i, "why")) == wire(i.deny("why"))


def test_error_kinds_are_the_strings_on_the_wire() -> None:
    assert {k.name: str(k) for k in ErrorKind} == {
        "MODEL_ERROR": "ModelError",
        "TOOL_ERROR": "ToolError",
        "UNKNOWN_AGENT": "UnknownAgent",
        "CONVERSATION_CHANGED": "ConversationChanged",
        "SEND_REJECTED": "SendRejected",
        "RESUME_REJECTED": "ResumeRejected",
        "CANCEL_REJECTED": "CancelRejected",
        "GRANT_REJECTED": "GrantRejected",
        "REVIEW_REJECTED": "PolicyReviewRejected",
        "TOO_MANY_WAITING": "TooManyWaiting",
        "NOT_A_CONVERSATION": "NotScheduledByConversation",
        # The class name of client.codec.PayloadKeyMissing, as a worker records it.
        "PAYLOAD_KEY_MISSING": "PayloadKeyMissing",
    }
    # Matched against the plain string an ApplicationError carries, in a tuple or as a dict key.
    assert "ResumeRejected" in (ErrorKind.TOOL_ERROR, ErrorKind.RESUME_REJECTED)
    by_kind: dict[str, int] = {ErrorKind.SEND_REJECTED: 1}
    assert by_kind.get("SendRejected") == 1


def test_statuses_are_the_grpc_names() -> None:
    assert all(s.name == s.value for s in Status)
    assert len(Status) == 16
    assert {s.value for s in Status} == STATUSES
    assert all(type(s) is str for s in STATUSES)
    assert set(HTTP_STATUS.values()) <= set(Status)
    assert ToolError(Status.NOT_FOUND, "m").status == "NOT_FOUND"
    # The optional fields added since (kind, hosted) are null unless a failure sets them.
    assert ErrorInfo(status=Status.INTERNAL, message="m").model_dump_json(exclude_none=True) == (
        '{"status":"INTERNAL","message":"m"}'
    )


def test_an_application_error_encodes_as_with_plain_strings() -> None:
    def encoded(err: ApplicationError) -> bytes:
        failure = Failure()
        pydantic_data_converter.failure_converter.to_failure(
            err, pydantic_data_converter.payload_converter, failure
        )
        failure.ClearField("stack_trace")
        return failure.SerializeToString()

    typed = ApplicationError("m", Status.NOT_FOUND, type=ErrorKind.TOOL_ERROR, non_retryable=True)
    plain = ApplicationError("m", "NOT_FOUND", type="ToolError", non_retryable=True)
    assert encoded(typed) == encoded(plain)

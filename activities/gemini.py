"""Conversions between the wire ``Message`` and google-genai types, and Gemini error handling."""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.genai import errors as genai_errors
from google.genai import types as gt
from temporalio.exceptions import ApplicationError

from workflows.types import AgentSpec, Message, ModelUsage, Part

# Gemini statuses worth another attempt; everything else in 4xx will fail the same way again.
RETRYABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504})

HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def to_contents(messages: Sequence[Message]) -> list[gt.Content]:
    """Wire messages as Gemini contents, merging consecutive messages of the same role.

    A turn that ended after a tool message (max turns, cancel) is followed by the next user
    message; Gemini wants one user content holding both.
    """
    contents: list[gt.Content] = []
    for m in messages:
        parts = [gt.Part.model_validate(p.model_dump(exclude_none=True)) for p in m.parts]
        if contents and contents[-1].role == m.role:
            contents[-1].parts = [*(contents[-1].parts or []), *parts]
        else:
            contents.append(gt.Content(role=m.role, parts=parts))
    return contents


def config_for(spec: AgentSpec) -> gt.GenerateContentConfig:
    """The request config for an agent: system prompt, declarations, and no automatic calls."""
    declarations = [
        gt.FunctionDeclaration(
            name=t.name,
            description=t.description,
            parameters_json_schema=t.input_schema,
        )
        for t in spec.tools
    ]
    return gt.GenerateContentConfig(
        system_instruction=spec.system or None,
        tools=[gt.Tool(function_declarations=declarations)] if declarations else None,
        # The workflow runs the tool loop itself, one activity per call.
        automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
    )


def merge_chunks(
    chunks: Iterable[gt.GenerateContentResponse],
) -> tuple[Message, str | None, ModelUsage | None]:
    """Fold a response stream into one model message, keeping every part Gemini sent."""
    parts: list[Part] = []
    finish: str | None = None
    usage: ModelUsage | None = None
    blocked: str | None = None
    saw_candidate = False
    for chunk in chunks:
        if chunk.prompt_feedback and chunk.prompt_feedback.block_reason:
            blocked = str(chunk.prompt_feedback.block_reason.value)
        if chunk.usage_metadata:
            u = chunk.usage_metadata
            usage = ModelUsage(
                prompt_tokens=u.prompt_token_count,
                output_tokens=u.candidates_token_count,
                total_tokens=u.total_token_count,
            )
        for cand in chunk.candidates or []:
            saw_candidate = True
            if cand.finish_reason:
                finish = str(cand.finish_reason.value)
            for p in (cand.content.parts if cand.content else None) or []:
                _append_part(
                    parts, Part.model_validate(p.model_dump(mode="json", exclude_none=True))
                )
            break  # one candidate: the agent loop does not use alternatives
    if not saw_candidate and blocked:
        raise ApplicationError(
            f"the model refused the prompt (block reason {blocked})",
            "FAILED_PRECONDITION",
            type="ModelError",
            non_retryable=True,
        )
    return Message(role="model", parts=parts), finish, usage


def _append_part(parts: list[Part], part: Part) -> None:
    # Streaming splits text across chunks; join adjacent plain text pieces of the same kind.
    prev = parts[-1] if parts else None
    if (
        prev is not None
        and prev.text is not None
        and part.text is not None
        and bool(prev.thought) == bool(part.thought)
        and prev.function_call is None
        and part.function_call is None
        and not (prev.model_extra or part.model_extra)
    ):
        prev.text += part.text
        if part.thought_signature:
            prev.thought_signature = part.thought_signature
        return
    parts.append(part)


def classify_api_error(err: genai_errors.APIError) -> ApplicationError:
    """A Gemini API error as an ``ApplicationError`` Temporal can act on.

    Transient statuses stay retryable (honouring Retry-After); other 4xx errors are final. The
    first detail is the status name the turn reports.
    """
    code = int(getattr(err, "code", 0) or 0)
    status = getattr(err, "status", None) or HTTP_STATUS.get(code, "UNKNOWN")
    message = getattr(err, "message", None) or str(err)
    return ApplicationError(
        f"Gemini {code} {status}: {message}",
        status,
        type="ModelError",
        non_retryable=code not in RETRYABLE_HTTP,
        next_retry_delay=_retry_after(err) if code in RETRYABLE_HTTP else None,
    )


def _retry_after(err: genai_errors.APIError) -> timedelta | None:
    response: Any = getattr(err, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    if not value:
        return None
    try:
        return timedelta(seconds=max(0.0, float(value)))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        if when is None:
            return None
        return max(timedelta(0), when - datetime.now(UTC))

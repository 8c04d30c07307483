"""Conversions between the wire ``Message`` and google-genai types, and Gemini error handling.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.genai import errors as genai_errors
from google.genai import types as gt
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.workflows.activity_io import (
    ModelUsage,
)
from temporal_agent_interrupts.workflows.types import (
    AgentSpec,
    ErrorKind,
    Message,
    Part,
    Status,
)

# Gemini statuses worth another attempt; everything else in 4xx will fail the same way again.
RETRYABLE_HTTP = frozenset({408, 429, 500, 502, 503, 504})

HTTP_STATUS = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    408: Status.DEADLINE_EXCEEDED,
    409: Status.ABORTED,
    429: Status.RESOURCE_EXHAUSTED,
    500: Status.INTERNAL,
    501: Status.UNIMPLEMENTED,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}


def to_contents(messages: Sequence[Message]) -> list[gt.Content]:
    """Wire messages as google-genai contents (the typed path, used for Vertex AI).

    Consecutive messages of the same role are merged: a turn that ended after a tool message
    (max turns, cancel) is followed by the next user message, and Gemini wants one user content
    holding both.
    """
    return [
        gt.Content(
            role=role,
            parts=[gt.Part.model_validate(p.model_dump(exclude_none=True)) for p in parts],
        )
        for role, parts in _merged(messages)
    ]


def _merged(messages: Sequence[Message]) -> list[tuple[str, list[Part]]]:
    out: list[tuple[str, list[Part]]] = []
    for m in messages:
        if out and out[-1][0] == m.role:
            out[-1][1].extend(m.parts)
        else:
            out.append((m.role, list(m.parts)))
    return out


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


# ------------------------------------------------------------------------------------------
# The REST shape, built directly.
#
# google-genai turns typed contents into the request body part by part through pydantic, about
# 50 µs a part: a 1,000-turn conversation (4,000 parts) spent 200 ms of CPU per model call on
# it. For the Gemini Developer API the body is built here instead, from the wire messages, and
# sent through the same client's transport (auth, base URL, API version, errors).
# tests/test_gemini_wire.py holds it equal to what google-genai builds.


def part_to_rest(part: Part) -> dict[str, Any]:
    """One part as the REST API takes it. Fields the runtime does not type pass through as
    received (the API accepts its JSON field names in either case)."""
    out: dict[str, Any] = dict(part.model_extra or {})
    if part.text is not None:
        out["text"] = part.text
    if part.thought is not None:
        out["thought"] = part.thought
    if part.thought_signature is not None:
        out["thoughtSignature"] = part.thought_signature
    if part.function_call is not None:
        fc = part.function_call
        call: dict[str, Any] = {"args": fc.args, "name": fc.name}
        if fc.id is not None:
            call["id"] = fc.id
        out["functionCall"] = call
    if part.function_response is not None:
        fr = part.function_response
        response: dict[str, Any] = {"name": fr.name, "response": fr.response}
        if fr.id is not None:
            response["id"] = fr.id
        out["functionResponse"] = response
    return out


_TYPED = {
    "text": "text",
    "thought": "thought",
    "thoughtSignature": "thought_signature",
    "functionCall": "function_call",
    "functionResponse": "function_response",
}


def part_from_rest(data: dict[str, Any]) -> Part:
    """One part as the REST API returns it (camelCase); untyped fields are kept verbatim."""
    return Part.model_validate({_TYPED.get(k, k): v for k, v in data.items()})


def rest_request(
    spec: AgentSpec,
    messages: Sequence[Message],
    *,
    rest_parts: Sequence[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The ``generateContent`` body for the Gemini Developer API.

    ``rest_parts``, when given, holds each message's parts already in the REST shape.
    """
    if rest_parts is None:
        rest_parts = [[part_to_rest(p) for p in m.parts] for m in messages]
    contents: list[dict[str, Any]] = []
    for m, parts in zip(messages, rest_parts, strict=True):
        if contents and contents[-1]["role"] == m.role:
            contents[-1]["parts"] = [*contents[-1]["parts"], *parts]
        else:
            contents.append({"parts": list(parts), "role": m.role})
    body: dict[str, Any] = {"contents": contents}
    if spec.system:
        body["systemInstruction"] = {"parts": [{"text": spec.system}], "role": "user"}
    if spec.tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {
                        "description": t.description,
                        "name": t.name,
                        # google-genai sends this field under its proto name; so do we.
                        "parameters_json_schema": t.input_schema,
                    }
                    for t in spec.tools
                ]
            }
        ]
    body["generationConfig"] = {}
    return body


def rest_model_path(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def merge_chunks(
    chunks: Iterable[dict[str, Any]],
) -> tuple[Message, str | None, ModelUsage | None]:
    """Fold a response stream (REST-shaped chunks) into one model message, keeping every part."""
    parts: list[Part] = []
    finish: str | None = None
    usage: ModelUsage | None = None
    blocked: str | None = None
    saw_candidate = False
    for chunk in chunks:
        feedback = chunk.get("promptFeedback") or {}
        if feedback.get("blockReason"):
            blocked = str(feedback["blockReason"])
        if u := chunk.get("usageMetadata"):
            usage = ModelUsage(
                prompt_tokens=u.get("promptTokenCount"),
                output_tokens=u.get("candidatesTokenCount"),
                total_tokens=u.get("totalTokenCount"),
            )
        for cand in chunk.get("candidates") or []:
            saw_candidate = True
            if cand.get("finishReason"):
                finish = str(cand["finishReason"])
            for p in (cand.get("content") or {}).get("parts") or []:
                _append_part(parts, part_from_rest(p))
            break  # one candidate: the agent loop does not use alternatives
    if not saw_candidate and blocked:
        raise ApplicationError(
            f"the model refused the prompt (block reason {blocked})",
            Status.FAILED_PRECONDITION,
            type=ErrorKind.MODEL_ERROR,
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
    status = getattr(err, "status", None) or HTTP_STATUS.get(code, Status.UNKNOWN)
    message = getattr(err, "message", None) or str(err)
    return ApplicationError(
        f"Gemini {code} {status}: {message}",
        status,
        type=ErrorKind.MODEL_ERROR,
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

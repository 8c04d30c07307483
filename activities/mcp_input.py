"""What an MCP server asks for in an input round, read and bounded on the worker; the answers
sent back.

Internal: not covered by the 0.1.x stability promise.

A server that answers a tool call with ``InputRequiredResult`` (MCP 2026-07-28) is not trusted
any more than its tool list: what it asks for is capped and checked here, in the ``mcp_call``
activity, before any of it reaches the conversation. A form request becomes an
:class:`InputForm` (its message cut to size, its schema a bounded, flat JSON Schema object); a
roots request is answered at once from the server's configuration (``MCPServerStdio(roots=)``,
``MCPServerHTTP(roots=)``); a sampling request becomes a :class:`SampleAsk` (text only, its
prompt and reply bounded), which the workflow has the agent's model answer in an activity of its
own. What cannot be taken (too many requests, too large a state, a URL request, a sampling
request with tools or images) is a :class:`RoundRefused`: the call
fails with its reason, which the model hears; the conversation goes on. See
``workflows.input_rounds`` for the pause and the retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcp_types

from temporal_agent_interrupts.activities.mcp import (
    MAX_SCHEMA_BYTES,
    invalid_schema,
    roots_result,
)
from temporal_agent_interrupts.workflows.activity_io import (
    InputForm,
    InputRound,
    SampleAsk,
    SampleMessage,
)
from temporal_agent_interrupts.workflows.input_rounds import MAX_INPUT_ROUNDS
from temporal_agent_interrupts.workflows.limits import (
    KiB,
    Refused,
    check_json,
    json_size,
)

MAX_INPUT_REQUESTS = 8
"""The most input requests one round may hold (forms and roots together)."""

MAX_REQUEST_STATE = 64 * KiB
"""The largest ``requestState`` a server may ask to have echoed: it is kept in the conversation
until the retry."""

MAX_INPUT_MESSAGE = 4 * KiB
"""The longest message a form may show a person, in bytes of UTF-8."""

MAX_SAMPLE_PROMPT = 16 * KiB
"""The largest prompt (system prompt and messages) a server's sampling request may send the
agent's model."""

MAX_SAMPLE_TOKENS = 1024
"""The most tokens the model may answer a sampling request with (a request asking for more gets
this many)."""

MAX_KEY_CHARS = 128
"""The longest request key a server may use."""


class RoundRefused(Exception):
    """A server's input round this client will not take: the call fails with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_round(
    asked: mcp_types.InputRequiredResult,
    *,
    previous: InputRound | None,
    roots: Sequence[str],
) -> InputRound:
    """The round ``asked`` as the conversation keeps it: its forms, the roots answered, the
    state to echo.

    Raises:
        RoundRefused: past :data:`MAX_INPUT_ROUNDS`, too many requests, too large a state, a
            message or schema out of bounds, a request of a kind this client does not answer.
    """
    number = (previous.round if previous is not None else 0) + 1
    if number > MAX_INPUT_ROUNDS:
        raise RoundRefused(
            f"the server asked for input more than {MAX_INPUT_ROUNDS} times in one call"
        )
    state = asked.request_state
    if state is not None and len(state.encode("utf-8", "surrogatepass")) > MAX_REQUEST_STATE:
        raise RoundRefused(
            f"the server's requestState passes {MAX_REQUEST_STATE // KiB} KiB, which this "
            "client keeps at most"
        )
    requests = asked.input_requests or {}
    if len(requests) > MAX_INPUT_REQUESTS:
        raise RoundRefused(
            f"the server asked for {len(requests)} inputs in one round; the limit is "
            f"{MAX_INPUT_REQUESTS}"
        )
    forms: list[InputForm] = []
    samples: list[SampleAsk] = []
    responses: dict[str, Any] = {}
    for key, request in requests.items():
        if not key or len(key) > MAX_KEY_CHARS:
            raise RoundRefused(f"an input request's key is empty or over {MAX_KEY_CHARS} chars")
        if isinstance(request, mcp_types.ListRootsRequest):
            responses[key] = roots_answer(roots)
        elif isinstance(request, mcp_types.ElicitRequest):
            forms.append(_form(key, request.params))
        elif isinstance(request, mcp_types.CreateMessageRequest):
            samples.append(_sample(key, request.params))
        else:
            raise RoundRefused(
                f"the server asked for {request.method!r}, which this client does not answer"
            )
    try:
        check_json(state, what="the requestState")
    except Refused as e:
        raise RoundRefused(e.reason) from None
    return InputRound(
        round=number, request_state=state, forms=forms, samples=samples, responses=responses
    )


def _sample(key: str, params: mcp_types.CreateMessageRequestParams) -> SampleAsk:
    """A sampling request as the model is asked it: text messages and a system prompt, within
    :data:`MAX_SAMPLE_PROMPT`, its reply capped at :data:`MAX_SAMPLE_TOKENS`. Tools, images and
    audio are refused: the server gets the model's words, nothing the model could do."""
    if params.tools:
        raise RoundRefused("the server's sampling request offers the model tools, refused")
    messages: list[SampleMessage] = []
    for m in params.messages:
        blocks = m.content if isinstance(m.content, list) else [m.content]
        texts: list[str] = []
        for block in blocks:
            if not isinstance(block, mcp_types.TextContent):
                kind = str(getattr(block, "type", "content"))[:40]
                raise RoundRefused(
                    f"the server's sampling request holds {kind!r} content; only text is sent"
                )
            texts.append(block.text)
        messages.append(SampleMessage(role=m.role, text="\n".join(texts)))
    if not messages or messages[-1].role != "user":
        raise RoundRefused("the server's sampling request does not end with a user message")
    system = params.system_prompt or None
    try:
        check_json([system, [m.text for m in messages]], what="the sampling request")
    except Refused as e:
        raise RoundRefused(e.reason) from None
    size = json_size([system, [m.text for m in messages]])
    if size > MAX_SAMPLE_PROMPT:
        raise RoundRefused(
            f"the server's sampling prompt is {size // KiB} KiB; the limit is "
            f"{MAX_SAMPLE_PROMPT // KiB} KiB"
        )
    tokens = max(1, min(int(params.max_tokens or MAX_SAMPLE_TOKENS), MAX_SAMPLE_TOKENS))
    return SampleAsk(key=key, messages=messages, system=system, max_tokens=tokens)


def _form(key: str, params: Any) -> InputForm:
    if not isinstance(params, mcp_types.ElicitRequestFormParams):
        # A URL to open elsewhere (a sign-in, a payment page) is for a person at a screen the
        # server controls: not something a durable pause can hand over.
        raise RoundRefused(
            "the server asked for a URL-mode elicitation, which this client does not answer"
        )
    message, schema = params.message, params.requested_schema
    try:
        check_json({"message": message, "schema": schema}, what="the input request")
    except Refused as e:
        raise RoundRefused(e.reason) from None
    if len(message.encode("utf-8", "surrogatepass")) > MAX_INPUT_MESSAGE:
        raise RoundRefused(
            f"the server's input message passes {MAX_INPUT_MESSAGE // KiB} KiB, the limit"
        )
    problem = _flat_schema_problem(schema)
    if problem is not None:
        raise RoundRefused(f"the form the server asked for (request {key[:60]!r}) {problem}")
    return InputForm(key=key, message=message, requested_schema=schema)


def _flat_schema_problem(schema: object) -> str | None:
    """Why a form's schema cannot be shown and checked, or None.

    An allow-list, as MCP defines forms: a flat object of primitive properties (strings with
    lengths and a format, numbers with bounds, booleans, enums, arrays of strings or enums).
    Anything else is refused, ``pattern`` above all: an answer is checked against the schema
    inside a workflow task, where a regular expression a server wrote could run for hours with
    the interpreter's lock held, stalling every conversation on the worker.
    """
    if not isinstance(schema, dict):
        return "has a schema that is not a JSON object"
    size = json_size(schema)
    if size > MAX_SCHEMA_BYTES:
        return f"has a schema of {size // KiB} KiB; the limit is {MAX_SCHEMA_BYTES // KiB} KiB"
    if schema.get("type") != "object":
        return 'has a schema without "type": "object" at its root'
    extra = set(schema) - _ROOT_KEYS
    if extra:
        return f"has a schema with {_named(extra)}, which MCP forms do not have"
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return "has a schema whose properties are not an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "has a schema whose required is not a list of names"
    for name, prop in properties.items():
        problem = _property_problem(prop)
        if problem is not None:
            return f"has a property {str(name)[:60]!r} that {problem}"
    return invalid_schema(schema)


_ROOT_KEYS = frozenset({"type", "properties", "required", "title", "description", "$schema"})
_LABELS = frozenset({"type", "title", "description", "default"})
_KEYS_OF = {
    "string": _LABELS | {"minLength", "maxLength", "format", "enum", "enumNames", "oneOf", "anyOf"},
    "number": _LABELS | {"minimum", "maximum"},
    "integer": _LABELS | {"minimum", "maximum"},
    "boolean": _LABELS,
    "array": _LABELS | {"items", "minItems", "maxItems", "uniqueItems"},
}
_CHOICE_KEYS = frozenset({"const", "title"})


def _property_problem(prop: object) -> str | None:
    if not isinstance(prop, dict):
        return "is not a JSON object"
    kind = prop.get("type")
    allowed = _KEYS_OF.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        return "is not a primitive (MCP forms are flat)"
    extra = set(prop) - allowed
    if extra:
        return f"has {_named(extra)}, which MCP forms do not have"
    for choices in ("oneOf", "anyOf"):
        listed = prop.get(choices)
        if listed is not None and (
            not isinstance(listed, list)
            or not all(isinstance(c, dict) and set(c) <= _CHOICE_KEYS for c in listed)
        ):
            return f"has a {choices} other than a list of {{const, title}} choices"
    if kind == "array":
        items = prop.get("items")
        if (
            not isinstance(items, dict)
            or items.get("type") != "string"
            or not set(items) <= {"type", "enum", "oneOf", "anyOf"}
        ):
            return "is an array of other than strings"
        if _property_problem(items) is not None:
            return "is an array of other than strings"
    return None


def _named(keys: set[Any]) -> str:
    return ", ".join(repr(str(k)[:40]) for k in sorted(map(str, keys))[:3])


def roots_answer(roots: Sequence[str]) -> dict[str, Any]:
    """The answer to a roots request, as the round keeps it: the server's configured roots."""
    return roots_result(roots).model_dump(mode="json", by_alias=True, exclude_none=True)


def input_responses(round_: InputRound) -> mcp_types.InputResponses:
    """The round's answers as the server is sent them on the retry."""
    out: mcp_types.InputResponses = {}
    for key, value in round_.responses.items():
        if "roots" in value:
            out[key] = mcp_types.ListRootsResult.model_validate(value)
        elif "role" in value:
            out[key] = mcp_types.CreateMessageResult.model_validate(value)
        else:
            out[key] = mcp_types.ElicitResult.model_validate(value)
    return out

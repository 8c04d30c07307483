"""Our REST request body and response parsing agree with google-genai's own, field for field.

The model activity builds the Developer API request itself (google-genai's per-part conversion
cost 200 ms of CPU per call on a 1,000-turn conversation) and sends it through the client's
transport; these tests hold the two paths to the same bytes.
"""

from __future__ import annotations

from typing import Any

from google.genai import Client
from google.genai import _common as genai_common
from google.genai import types as gt
from google.genai.models import _GenerateContentParameters_to_mldev

from temporal_agent_interrupts.activities.gemini import (
    config_for,
    merge_chunks,
    part_from_rest,
    rest_request,
    to_contents,
)
from temporal_agent_interrupts.activities.runtime import stream_rest, stream_typed
from temporal_agent_interrupts.worker.standin import GeminiStandIn, Reply, Request
from temporal_agent_interrupts.workflows.agent import Agent
from temporal_agent_interrupts.workflows.types import FunctionCall, FunctionResponse, Message, Part
from tests.agents import assistant

CONVERSATION = [
    Message(role="user", parts=[Part(text="hi")]),
    Message(
        role="model",
        parts=[
            Part(text="let me think", thought=True, thought_signature="AAFzaWc="),
            Part(text="Looking it up."),
            Part(
                function_call=FunctionCall(id="c1", name="lookup", args={"key": "a", "x_y": [1]}),
                thought_signature="c2lnMg==",
            ),
            Part(function_call=FunctionCall(name="approve", args={})),
        ],
    ),
    Message(
        role="user",
        parts=[
            Part(function_response=FunctionResponse(id="c1", name="lookup", response={"v": "A"})),
            Part(function_response=FunctionResponse(name="approve", response={"ok": True})),
        ],
    ),
    # A cut-short turn's tool message, then the next user text: one content on the wire.
    Message(role="user", parts=[Part(text="and then?")]),
]


def genai_body(agent: Agent, messages: list[Message]) -> dict[str, Any]:
    client = Client(api_key="unused")
    spec = agent.spec()
    params = gt._GenerateContentParameters(
        model=spec.model, contents=to_contents(messages), config=config_for(spec)
    )
    body = _GenerateContentParameters_to_mldev(client._api_client, params, None, params)
    body.pop("_url", None)
    body.pop("config", None)
    return genai_common.encode_unserializable_types(genai_common.convert_to_dict(body))


def test_request_body_equals_google_genais():
    ours = rest_request(assistant.spec(), CONVERSATION)
    assert ours == genai_body(assistant, CONVERSATION)
    assert [c["role"] for c in ours["contents"]] == ["user", "model", "user"]


def test_request_body_for_an_agent_without_system_or_tools():
    bare = Agent("bare", model="gemini-test")
    assert rest_request(bare.spec(), CONVERSATION[:1]) == genai_body(bare, CONVERSATION[:1])


RESPONSE_CHUNKS = [
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "pondering", "thought": True},
                        {"text": "Sure, "},
                    ],
                },
                "index": 0,
            }
        ]
    },
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "here you go.", "thoughtSignature": "c2ln"},
                        {
                            "functionCall": {"id": "f1", "name": "lookup", "args": {"key": "k"}},
                            "thoughtSignature": "c2lnMg==",
                        },
                        {"inlineData": {"mimeType": "image/png", "data": "aGk="}},
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10},
    },
]


def scripted(request: Request) -> Reply:
    return Reply(chunks=RESPONSE_CHUNKS)


async def test_both_paths_read_the_same_message_and_send_the_same_body():
    with GeminiStandIn(scripted) as server:
        gemini = server.client()
        spec = assistant.spec()
        rest = merge_chunks(await stream_rest(gemini, spec, CONVERSATION))
        typed = merge_chunks(await stream_typed(gemini, spec, CONVERSATION))
        sent_rest, sent_typed = (r.body for r in server.requests)
    assert rest == typed
    message, finish, usage = rest
    assert finish == "STOP"
    assert usage is not None and usage.total_tokens == 10
    assert [p.text for p in message.parts[:2]] == ["pondering", "Sure, here you go."]
    assert message.parts[1].thought_signature == "c2ln"
    call = message.parts[2]
    assert call.function_call == FunctionCall(id="f1", name="lookup", args={"key": "k"})
    assert call.thought_signature == "c2lnMg=="
    assert message.parts[3].model_extra == {"inlineData": {"mimeType": "image/png", "data": "aGk="}}
    assert sent_rest == sent_typed


def test_parts_round_trip_through_the_wire_shape():
    part = part_from_rest({"inlineData": {"mimeType": "text/plain", "data": "aGk="}})
    again = to_contents([Message(role="model", parts=[part])])[0].parts
    assert again is not None and again[0].inline_data is not None
    assert again[0].inline_data.mime_type == "text/plain"
    assert rest_request(Agent("a").spec(), [Message(role="model", parts=[part])])["contents"] == [
        {"parts": [{"inlineData": {"mimeType": "text/plain", "data": "aGk="}}], "role": "model"}
    ]


def test_the_answer_digests_the_same_after_the_payload_round_trip():
    """The activity digests the message it returns; the workflow digests what it decoded.

    Equal digests are what lets the next model call carry only the new messages.
    """
    from temporalio.contrib.pydantic import pydantic_data_converter

    from temporal_agent_interrupts.workflows.activity_io import (
        ModelResult,
    )
    from temporal_agent_interrupts.workflows.history import step

    message, finish, usage = merge_chunks(RESPONSE_CHUNKS)
    converter = pydantic_data_converter.payload_converter
    payload = converter.to_payload(ModelResult(message=message, finish_reason=finish, usage=usage))
    decoded = converter.from_payload(payload, ModelResult).message
    assert step("", decoded) == step("", message)

"""The floor's activities: the same google-genai call to the same loopback model as ours."""

from __future__ import annotations

import google.genai as genai
from google.genai import types as gt
from temporalio import activity

from bench.floor_workflow import (
    FloorModelInput,
    FloorModelResult,
    FloorToolInput,
    FloorToolResult,
)


class FloorActivities:
    def __init__(self, gemini: genai.Client) -> None:
        self._gemini = gemini

    @activity.defn(name="floor_model")
    async def model(self, input: FloorModelInput) -> FloorModelResult:
        contents = [gt.Content.model_validate(c) for c in input.contents]
        config = gt.GenerateContentConfig(
            tools=[
                gt.Tool(
                    function_declarations=[
                        gt.FunctionDeclaration(
                            name="act",
                            description="Do it.",
                            parameters_json_schema={"type": "object"},
                        )
                    ]
                )
            ],
            automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
        )
        parts: list[gt.Part] = []
        stream = await self._gemini.aio.models.generate_content_stream(
            model="bench", contents=list(contents), config=config
        )
        async for chunk in stream:
            for cand in chunk.candidates or []:
                if cand.content and cand.content.parts:
                    parts += cand.content.parts
        call = next((p.function_call for p in parts if p.function_call), None)
        return FloorModelResult(
            content={
                "role": "model",
                "parts": [p.model_dump(mode="json", exclude_none=True) for p in parts],
            },
            call_args=dict(call.args or {}) if call else None,
            text="".join(p.text for p in parts if p.text),
        )

    @activity.defn(name="floor_tool")
    async def tool(self, input: FloorToolInput) -> FloorToolResult:
        return FloorToolResult(output={"done": True, **input.args})

    @activity.defn(name="floor_model_bare")
    async def model_bare(self, input: FloorModelInput) -> FloorModelResult:
        """The scripted answer without any I/O: a call first, then the final text."""
        if len(input.contents) == 1:
            part = {"functionCall": {"name": "act", "args": {"n": 1}}}
            return FloorModelResult(content={"role": "model", "parts": [part]}, call_args={"n": 1})
        return FloorModelResult(content={"role": "model", "parts": [{"text": "done"}]}, text="done")

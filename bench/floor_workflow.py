"""The floor: the least a Temporal workflow needs for the same interrupt cycle.

A model activity, a park until an update, a tool activity, a model activity; nothing else (no
interrupt bookkeeping, no search attributes, no memo, no details). The activities do the same
external work as ours (the same google-genai call to the same loopback model), so the ratio
measures orchestration, not the model.

This module holds only the workflow and its types (deterministic, no I/O); the activities are in
``bench.floor_activities``.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow


class FloorInput(BaseModel):
    prompt: str
    # "floor_model" makes the same google-genai call as ours; "floor_model_bare" answers from
    # memory: the engine's absolute floor.
    model_activity: str = "floor_model"


class FloorResult(BaseModel):
    text: str


class FloorModelInput(BaseModel):
    contents: list[dict[str, object]]


class FloorModelResult(BaseModel):
    content: dict[str, object]
    call_args: dict[str, object] | None = None
    text: str = ""


class FloorToolInput(BaseModel):
    args: dict[str, object]


class FloorToolResult(BaseModel):
    output: dict[str, object]


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    def __init__(self) -> None:
        self._parked = False
        self._approved = False
        self._result: str | None = None

    @workflow.run
    async def run(self, input: FloorInput) -> FloorResult:
        contents: list[dict[str, object]] = [{"role": "user", "parts": [{"text": input.prompt}]}]
        first = await workflow.execute_activity(
            input.model_activity,
            FloorModelInput(contents=contents),
            result_type=FloorModelResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        contents.append(first.content)
        self._parked = True
        await workflow.wait_condition(lambda: self._approved)
        out = await workflow.execute_activity(
            "floor_tool",
            FloorToolInput(args=first.call_args or {}),
            result_type=FloorToolResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        contents.append(
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "act", "response": out.output}}],
            }
        )
        final = await workflow.execute_activity(
            input.model_activity,
            FloorModelInput(contents=contents),
            result_type=FloorModelResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        self._result = final.text
        return FloorResult(text=final.text)

    @workflow.update
    async def start(self) -> bool:
        """Returns once the workflow is parked (the pause is seen)."""
        await workflow.wait_condition(lambda: self._parked)
        return True

    @workflow.update
    async def approve(self) -> str:
        """Unparks and returns the final answer."""
        self._approved = True
        await workflow.wait_condition(lambda: self._result is not None)
        return self._result or ""

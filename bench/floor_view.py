"""The floor with an operator view: B7's *floor_view*, what the view's writes cost the server.

``FloorWorkflow``'s cycle (a model activity, a park until an update, a tool activity, a model
activity) plus the writes this product makes in that cycle for operators, at the same points and
of about the same size (read from one of ours' histories on 2026-12-05):

- started with ``AgentName`` and ``AgentStatus="running"``;
- at the pause: the search attributes (``interrupted``, the tool's name, since when), then the
  memo's pending list (one call as the inbox shows it, about 340 bytes);
- at the answer: ``running`` with nothing pending, then the memo's pending list emptied and the
  answer's audit record (about 700 bytes);
- at the turn's end: ``idle``.

Against *bare* (the same workflow without them, both answering the model from memory), its
ratio is the share of the five writes alone, with no other work of ours in it. With
``FloorViewInput.memo`` or ``search_attributes`` off, only the other kind is written (B7's
``--thru-split``: *floor_sa*, *floor_memo*).

Deterministic, no I/O: it runs in the sandbox with ``bench.floor_activities``' activities.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from bench.floor_workflow import (
    FloorInput,
    FloorModelInput,
    FloorModelResult,
    FloorResult,
    FloorToolInput,
    FloorToolResult,
)

AGENT_NAME = SearchAttributeKey.for_keyword("AgentName")
AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
PENDING_INTERRUPTS = SearchAttributeKey.for_keyword_list("PendingInterrupts")
INTERRUPTED_SINCE = SearchAttributeKey.for_datetime("InterruptedSince")

# Stand-ins of the sizes ours writes: what the inbox shows of a paused call, and the audit record
# of its answer with its signed receipt.
_PENDING = {
    "name": "act",
    "ref": "64e47784-1552-4d5f-b328-9e52407e8a1c",
    "input": {"n": 1},
    "source": "approval",
    "input_digest": "e5d5f7c1d225fd6b13623ebb1b5b9d07",
    "shown": {
        "title": "Act",
        "summary": "Act: N 1",
        "why": "This needs your approval before it runs.",
        "fields": [{"label": "N", "value": "1"}],
    },
}
_ANSWER = {
    "ref": "64e47784-1552-4d5f-b328-9e52407e8a1c",
    "name": "act",
    "kind": "restart",
    "via": "update",
    "decision": "approved",
    "identity_verified": False,
    "receipt": {
        "id": "24809c95037d89a20f3e29d7f82eb4411ad89842fb2a2f5355b35c009868799b",
        "body": {
            "v": 1,
            "seq": 0,
            "ref": "64e47784-1552-4d5f-b328-9e52407e8a1c",
            "tool": "act",
            "kind": "restart",
            "decision": "approved",
            "input_digest": "sha256:" + "2bfd14f43d17fc7c" * 4,
            "verified": False,
        },
        "key_id": "bench",
        "signature": "6b3zO8cKsuBj7sgNSo1ZJTuAbBkxgzxLxVxuw5zs" * 2 + "9kd2nXDw",
    },
}


class FloorViewInput(FloorInput):
    search_attributes: bool = True
    memo: bool = True


@workflow.defn(name="FloorViewWorkflow")
class FloorViewWorkflow:
    def __init__(self) -> None:
        self._parked = False
        self._approved = False
        self._result: str | None = None

    @workflow.run
    async def run(self, input: FloorViewInput) -> FloorResult:
        contents: list[dict[str, object]] = [{"role": "user", "parts": [{"text": input.prompt}]}]
        first = await workflow.execute_activity(
            input.model_activity,
            FloorModelInput(contents=contents),
            result_type=FloorModelResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        contents.append(first.content)
        since = workflow.now()
        if input.search_attributes:
            workflow.upsert_search_attributes(
                [
                    AGENT_STATUS.value_set("interrupted"),
                    INTERRUPTED_SINCE.value_set(since),
                    PENDING_INTERRUPTS.value_set(["act"]),
                ]
            )
        if input.memo:
            workflow.upsert_memo({"pending": [{**_PENDING, "since": since.isoformat()}]})
        self._parked = True
        await workflow.wait_condition(lambda: self._approved)
        if input.search_attributes:
            workflow.upsert_search_attributes(
                [
                    AGENT_STATUS.value_set("running"),
                    INTERRUPTED_SINCE.value_unset(),
                    PENDING_INTERRUPTS.value_unset(),
                ]
            )
        if input.memo:
            at = workflow.now().isoformat()
            workflow.upsert_memo(
                {"pending": [], "answers": [{**_ANSWER, "at": at, "since": since.isoformat()}]}
            )
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
        if input.search_attributes:
            workflow.upsert_search_attributes([AGENT_STATUS.value_set("idle")])
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

"""``python -m bench.schema_bound``: what checking an answer against a schema costs inside a
workflow task, now that the check is bounded (issue 44, finding 3).

The SDK fails a workflow task as a potential deadlock ([TMPRL1101]) after 2 s of CPU in one
activation, on whatever machine runs the worker. So each figure is given in milliseconds on this
machine and as a ratio to decoding the largest resume the workflow takes (``json.loads`` of
1 MiB): a machine N times slower scales both alike.

Measured, each the median of a few runs:
- the 940 KB edit of the issue (``recipients: [1] * 470000``), sent by signal (one check) and by
  update (validator, handler, apply), against jsonschema's unbounded ``best_match`` before;
- the worst values the bound allows: 10,000 values (``DOOR.schema_values``) against a plain
  schema, a heavy one (``anyOf`` of object branches), ``uniqueItems`` over objects, and a
  schema that uses up ``DOOR.schema_steps``;
- ``check_json`` over 470,000 numbers, before (a Python walk over every value) and now.

Writes ``bench/results/schema_bound.json``; no timing is asserted anywhere in the tests.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from pydantic import BaseModel

from temporal_agent_interrupts import tool
from temporal_agent_interrupts.workflows import Agent
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, ResumeError
from temporal_agent_interrupts.workflows.limits import DOOR, HELD, _check_values, check_json
from temporal_agent_interrupts.workflows.state import (
    CallState,
)

RESULTS = Path(__file__).parent / "results"
DEADLOCK_SECONDS = 2.0


class Notice(BaseModel):
    recipients: list[str]
    text: str


@tool("notify", "Tell people something; a human may change who.", editable=True)
async def notify(inp: Notice) -> dict[str, str]:
    return {"sent": inp.text}


AGENT = Agent("bench-schema", model="gemini-test", tools=[notify])


def timed(fn: Callable[[], Any], *, runs: int = 5) -> float:
    """The median of ``runs`` runs of ``fn``, in milliseconds."""
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took)


def paused_book() -> InterruptBook:
    call = CallState(ref="r1", name="notify", args={"recipients": ["ops"], "text": "hi"})
    book = InterruptBook([call], spec=AGENT.spec())
    book.pause(call, source="approval", metadata={}, now=_now())
    return book


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 12, 1, tzinfo=UTC)


def old_schema_error(instance: Any, schema: dict[str, Any]) -> object:
    """The check before: every error made, then weighed."""
    return best_match(Draft202012Validator(schema).iter_errors(instance))


def old_check_json(value: Any) -> None:
    _check_values(value, what="x")


def main() -> None:
    edit = {"recipients": [1] * 470_000, "text": "hi"}
    resume = {"restart": [{"name": "notify", "ref": "r1", "input": edit}], "identity": "eve"}
    raw = json.dumps(resume, separators=(",", ":")).encode()
    reference = timed(lambda: json.loads(b"[" + b"1," * (512 * 1024 - 1) + b"1]"))
    schema = AGENT.spec().tool("notify").input_schema  # type: ignore[union-attr]  # declared above

    def by_signal() -> None:
        book = paused_book()
        # Refused, as it should be: the cost is what counts.
        with contextlib.suppress(ResumeError):
            book.validate(json.loads(raw), size=len(raw), room=HELD.turn)

    def by_update() -> None:
        for _ in range(2):  # the validator, then the handler; apply is never reached
            by_signal()

    values = DOOR.schema_values - 1
    plain = {"type": "array", "items": {"type": "string"}}
    branches = [
        {
            "type": "object",
            "properties": {f"k{i}": {"type": "string", "maxLength": 3} for i in range(4)},
            "required": [f"k{b}"],
        }
        for b in range(8)
    ]
    heavy = {"type": "array", "items": {"anyOf": branches}}
    unique = {"type": "array", "uniqueItems": True}
    objects = [{"k": i} for i in range(values // 2)]
    # Each level applies the next twice: 2**16 rules per item, from a few hundred bytes.
    levels: dict[str, Any] = {
        f"d{k}": {"allOf": [{"$ref": f"#/$defs/d{k + 1}"}] * 2} for k in range(16)
    }
    levels["d16"] = {"type": "array"}
    nested = {"$defs": levels, "$ref": "#/$defs/d0"}

    from temporal_agent_interrupts.workflows.answers import schema_error

    figures = {
        "reference_json_loads_1MiB_ms": reference,
        "edit_940KB_schema_before_ms": timed(lambda: old_schema_error(edit, schema), runs=1),
        "edit_940KB_by_signal_ms": timed(by_signal),
        "edit_940KB_by_update_ms": timed(by_update),
        "allowed_plain_ms": timed(lambda: schema_error(["a"] * values, plain)),
        "allowed_heavy_anyOf_ms": timed(lambda: schema_error([{"k7": "x"}] * (values // 2), heavy)),
        "allowed_uniqueItems_objects_ms": timed(lambda: schema_error(objects, unique)),
        "unique_items_objects_before_ms": timed(
            lambda: old_schema_error(objects[:2000], unique), runs=1
        ),
        "steps_used_up_ms": timed(lambda: schema_error([[1]] * (values // 2), nested)),
        "check_json_470k_before_ms": timed(lambda: old_check_json(edit)),
        "check_json_470k_ms": timed(lambda: check_json(edit, what="x")),
    }
    out: dict[str, Any] = {k: round(v, 1) for k, v in figures.items()}
    out["ratios_to_reference"] = {
        k: round(v / reference, 1) for k, v in figures.items() if not k.startswith("reference")
    }
    allowed = ("allowed", "steps", "edit_940KB_by")
    worst = max(v for k, v in figures.items() if k.startswith(allowed))
    out["worst_allowed_share_of_deadlock_timeout"] = round(worst / (DEADLOCK_SECONDS * 1000), 3)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "schema_bound.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""A conversation's whole audit trail, read from the histories of all its runs.

The conversation's state keeps only its newest answer records (the log has a budget, and old
records are shed when it continues as new). The full trail is in Temporal's history instead:
each time a run applies answers it writes them to its memo under ``answers``
(``workflows.audit.outbox_batch``), and every such write is a ``WorkflowPropertiesModified``
event in that run's history, which Temporal keeps after the run closes (for the namespace's
retention period). Reading them needs no worker.

Runs begun before that rule (no ``governance-2026-12`` patch marker) wrote no such batches: for
those the trail falls back on the answers each one carried into its successor (the
continue-as-new input) and, when the newest run is one of them, on what its state holds now
(the ``history`` query, which a worker answers). A run no worker has taken up yet (no workflow
task completed) has applied no answers: what it was carried in with stands for it. Records found
twice are counted once.

:func:`merge` is pure; :func:`audit_trail` does the reading.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows.compat import GOVERNANCE_PATCH
from workflows.types import AnswerRecord, ConversationInput

log = logging.getLogger(__name__)

MEMO_KEY = "answers"
"""The memo key each batch of answer records is written under."""

_PATCH_MARKER = "core_patch"
# How many runs' histories are read at once.
_PARALLEL_READS = 8

RecordKey = tuple[datetime, str, str, str | None]


def record_key(record: AnswerRecord) -> RecordKey:
    """What tells one answer from another: when, which call, how and by whom."""
    return (record.at, record.ref, record.kind, record.identity)


def merge(*sources: Iterable[AnswerRecord]) -> list[AnswerRecord]:
    """Every record once (the first source that has it wins), oldest first.

    Records made at the same instant (the answers of one resume) keep the order they were
    found in, which is the order the workflow applied them.
    """
    seen: set[RecordKey] = set()
    kept: list[AnswerRecord] = []
    for source in sources:
        for record in source:
            key = record_key(record)
            if key not in seen:
                seen.add(key)
                kept.append(record)
    kept.sort(key=lambda r: r.at)
    return kept


def records(items: object) -> list[AnswerRecord]:
    """The answer records of one memo batch; an item that does not parse is left out."""
    if not isinstance(items, list):
        return []
    found: list[AnswerRecord] = []
    for item in items:
        try:
            found.append(AnswerRecord.model_validate(item))
        except ValidationError:
            log.warning("an answer record in the memo does not parse; left out of the trail")
    return found


def patch_id(details: Any) -> str | None:
    """The patch id a ``core_patch`` marker records (``{"id": ..., "deprecated": ...}``)."""
    data = details.get("patch-data") if details is not None else None
    if data is None or not data.payloads:
        return None
    try:
        value = json.loads(data.payloads[0].data)
    except ValueError:
        return None
    return value.get("id") if isinstance(value, dict) else None


@dataclass
class RunTrail:
    """What one run's history holds for the trail."""

    run_id: str
    started: datetime
    # The run it continued from, if any.
    previous: str | None = None
    # Begun under the governance rules: its answers are all in its memo batches.
    governed: bool = False
    # A workflow task has completed: the rules it runs under are decided (a run not taken up
    # by a worker yet has applied no answer of its own).
    begun: bool = False
    batches: list[AnswerRecord] = field(default_factory=list)
    # The continue-as-new input's payload, kept only for a run without the governance rules.
    carried: Payload | None = None


async def read_run(temporal: Client, chat_id: str, run_id: str) -> RunTrail | None:
    """The trail in one run's history; None when Temporal no longer has the run."""
    handle = temporal.get_workflow_handle(chat_id, run_id=run_id)
    run: RunTrail | None = None
    try:
        async for event in handle.fetch_history_events():
            kind = event.event_type
            if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                attrs = event.workflow_execution_started_event_attributes
                run = RunTrail(
                    run_id=run_id,
                    started=event.event_time.ToDatetime(tzinfo=UTC),
                    previous=attrs.continued_execution_run_id or None,
                )
            elif run is None:
                continue
            elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                run.begun = True
            elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
                attrs = event.marker_recorded_event_attributes
                if attrs.marker_name == _PATCH_MARKER and patch_id(attrs.details) == (
                    GOVERNANCE_PATCH
                ):
                    run.governed = True
            elif kind == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
                fields = event.workflow_properties_modified_event_attributes.upserted_memo.fields
                if MEMO_KEY in fields:
                    (batch,) = await temporal.data_converter.decode([fields[MEMO_KEY]])
                    run.batches.extend(records(batch))
                    run.governed = True
            elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                payloads = event.workflow_execution_continued_as_new_event_attributes.input
                if not run.governed and payloads.payloads:  # only a run before the rules needs it
                    run.carried = payloads.payloads[0]
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None  # past the namespace's retention, or never there
        raise
    return run


async def carried_answers(temporal: Client, payload: Payload | None) -> list[AnswerRecord]:
    """The answer records a continue-as-new input (a ``ConversationInput``) carries."""
    if payload is None:
        return []
    (carried,) = await temporal.data_converter.decode([payload], [ConversationInput])
    state = carried.state if isinstance(carried, ConversationInput) else None
    return [*state.answers, *state.audit_outbox] if state is not None else []


async def start_input(temporal: Client, chat_id: str, run_id: str) -> Payload | None:
    """A run's own input (what its predecessor carried into it)."""
    handle = temporal.get_workflow_handle(chat_id, run_id=run_id)
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        return payloads[0] if payloads else None
    return None


async def list_runs(temporal: Client, chat_id: str) -> list[str]:
    """Every run visibility lists for the chat id, closed ones too."""
    if '"' in chat_id or "\\" in chat_id:
        return []  # cannot be quoted in a query: the chain of runs alone is followed
    return [wf.run_id async for wf in temporal.list_workflows(f'WorkflowId = "{chat_id}"')]


async def audit_trail(
    temporal: Client,
    chat_id: str,
    *,
    latest_run: str,
    latest_answers: Callable[[], Awaitable[list[AnswerRecord]]],
) -> list[AnswerRecord]:
    """Every answer the conversation ``chat_id`` applied, once each, oldest first.

    Args:
        latest_run: The run id of its newest run (visibility may not list it yet).
        latest_answers: The answer records its state holds now; asked only when the newest
            run was begun before the governance rules (it needs a worker).

    Raises:
        temporalio.service.RPCError: reading a history or the visibility listing failed.
    """
    runs: dict[str, RunTrail] = {}
    gone: set[str] = set()
    limit = asyncio.Semaphore(_PARALLEL_READS)

    async def read(run_id: str) -> RunTrail | None:
        async with limit:
            return await read_run(temporal, chat_id, run_id)

    # Visibility lists every run (resets too) but may lag; the chain of continue-as-new links
    # from the newest run finds the ones it has not indexed yet.
    wanted = list(dict.fromkeys([latest_run, *await list_runs(temporal, chat_id)]))
    while wanted:
        found = await asyncio.gather(*(read(run_id) for run_id in wanted))
        for run_id, run in zip(wanted, found, strict=True):
            if run is None:
                gone.add(run_id)
            else:
                runs[run_id] = run
        wanted = list(
            dict.fromkeys(
                r.previous
                for r in runs.values()
                if r.previous and r.previous not in runs and r.previous not in gone
            )
        )
    ordered = sorted(runs.values(), key=lambda r: r.started)
    fallback: list[AnswerRecord] = []
    for run in ordered:
        if run.previous in gone:
            # Its predecessor's history is gone: what it carried in is all that is left of it.
            fallback += await carried_answers(
                temporal, await start_input(temporal, chat_id, run.run_id)
            )
        if run.begun and not run.governed:
            fallback += await carried_answers(temporal, run.carried)
    newest = runs.get(latest_run)
    if newest is not None and not newest.begun:
        # Nothing applied here yet: what it holds is what it was carried in with.
        fallback += await carried_answers(
            temporal, await start_input(temporal, chat_id, latest_run)
        )
    elif newest is None or not newest.governed:
        fallback += await latest_answers()
    return merge((r for run in ordered for r in run.batches), fallback)


__all__ = [
    "MEMO_KEY",
    "RunTrail",
    "audit_trail",
    "carried_answers",
    "list_runs",
    "merge",
    "patch_id",
    "read_run",
    "record_key",
    "records",
]

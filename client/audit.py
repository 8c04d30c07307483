"""A conversation's whole audit trail, read from the histories of all its runs, trusting only
what this product wrote.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.types``.

The conversation's state keeps only its newest answer records (the log has a budget, and old
records are shed when it continues as new). The full trail is in Temporal's history instead:
each time a run applies answers it writes them to its memo under ``answers``
(``workflows.audit.outbox_batch``), and every such write is a ``WorkflowPropertiesModified``
event in that run's history, which Temporal keeps after the run closes (for the namespace's
retention period). Reading them needs no worker.

When a run's predecessor is gone (past the namespace's retention), what that predecessor
carried into it (its continue-as-new input) stands for the answers that are gone with it.
Records found twice are counted once.

Whoever holds the namespace's credentials can start a workflow under a closed chat's id
(Temporal's default id-reuse policy allows it), of any type, on any task queue, with any input
and memo: a run no worker ever runs can claim "approved by cfo@example.com (verified)". So a
run's records count only when the run is the conversation's own (:func:`judge`):

- its workflow type is ``AgentWorkflow`` and it ran on this client's task queue, the one this
  deployment's workers poll (a worker runs the workflow's code: what it wrote is the product's);
- it is the conversation's chain: the earliest-started head (a fresh start, or a run whose
  predecessor's history is gone past retention; a fresh start's input is a request, since the
  workflow refuses the state only continue-as-new hands on),
  then every run that continued from a chain run by a continue-as-new the workflow itself made
  (Temporal records ``continued_execution_run_id`` with initiator ``WORKFLOW``). A run reset
  from a chain run is in the chain too: Temporal copies its start event, and the workers that
  poll its queue carry it on.

Any other run under the id (a later fresh start, a retry, a cron run, another type or task
queue, or one that continued from such a run) is untrusted: its records are left out, and the
:class:`AuditReport` names it, with why and how many records it claimed. Records come only from
the memo writes of trusted runs (``WorkflowPropertiesModified``: commands a worker completed),
never from a start event's memo or input; the fallback for a predecessor that is gone reads a
continue-as-new input only across such a workflow-made continue-as-new.

This product's client starts every chat with ``id_reuse_policy=REJECT_DUPLICATE`` (and
``id_conflict_policy=USE_EXISTING``: a send attaches to the open run): a closed chat's id never
begins a second conversation through it, so a later fresh start under a chat's id was made by
something else, and is reported.

:func:`merge` and :func:`judge` are pure; :func:`audit_trail` does the reading.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import ContinueAsNewInitiator, EventType
from temporalio.api.history.v1 import WorkflowExecutionStartedEventAttributes
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.workflows.config import MAX_AGENT_DEPTH, WORKFLOW_TYPE
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
)
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
)

log = logging.getLogger(__name__)

MEMO_KEY = "answers"
"""The memo key each batch of answer records is written under."""

# How many runs' histories are read at once.
_PARALLEL_READS = 8

_BY_WORKFLOW = ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_WORKFLOW
_BY_RETRY = ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_RETRY
_BY_CRON = ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_CRON_SCHEDULE

RecordKey = tuple[datetime, str, str, str | None, str | None]


class UntrustedRun(BaseModel):
    """A run under the chat's id whose records the trail leaves out (see the module docstring)."""

    run_id: str
    started: datetime
    reason: str
    """Why it is not the conversation's, in words."""
    claimed: int = 0
    """How many answer records it carried (its memo writes, its start memo and input)."""
    workflow_type: str = ""
    task_queue: str = ""
    """As its start event says; whoever started it chose both."""
    chat_id: str = ""
    """A sub-agent's chat id, when the run is under one (empty: under the chat asked for)."""


class AuditReport(BaseModel):
    """A conversation's audit trail, and the runs under its id that are not part of it."""

    records: list[AnswerRecord] = []
    """Every answer the conversation applied, once each, oldest first; with the answers its
    sub-agents applied (``agent_tool``, however deep), each with its ``chat_id``."""
    untrusted: list[UntrustedRun] = []
    """Oldest first."""
    gone: list[str] = []
    """Runs the trail's runs continued from whose history Temporal no longer has (past the
    namespace's retention, or deleted): their answers are only what was carried out of them.
    A run deleted before its retention is a gap someone made; this names it."""


def record_key(record: AnswerRecord) -> RecordKey:
    """What tells one answer from another: when, which call, how, by whom, and where."""
    return (record.at, record.ref, record.kind, record.identity, record.chat_id)


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


def records(items: object, *, quiet: bool = False) -> list[AnswerRecord]:
    """The answer records of one memo batch; an item that does not parse is left out (with a
    warning, unless ``quiet``: what an untrusted run claims is only counted)."""
    if not isinstance(items, list):
        return []
    found: list[AnswerRecord] = []
    for item in items:
        try:
            found.append(AnswerRecord.model_validate(item))
        except (ValidationError, RecursionError):
            if not quiet:
                log.warning("an answer record in the memo does not parse; left out of the trail")
    return found


@dataclass
class RunTrail:
    """What one run's history holds for the trail, nothing of it decoded yet (whoever wrote an
    untrusted run chose its payloads, and their encoding)."""

    run_id: str
    started: datetime
    # The run it continued from, if any, and how (a ContinueAsNewInitiator).
    previous: str | None = None
    initiator: int = 0
    # The run whose start event this is: itself, or, for a reset, the run reset from (Temporal
    # copies the start event, and says so).
    origin: str = ""
    workflow_type: str = ""
    task_queue: str = ""
    # A workflow task has completed (a run not taken up by a worker yet has applied no
    # answer of its own).
    begun: bool = False
    # The memo's ``answers`` batches, as written.
    batches: list[Payload] = field(default_factory=list)
    # The child workflows it started (sub-agents: ``agent_tool``), as (workflow id, run id):
    # Temporal records each start its commands made.
    children: list[tuple[str, str]] = field(default_factory=list)

    # Its history holds a close event (completed, failed, continued as new...): it never
    # changes again.
    closed: bool = False

    @property
    def fresh(self) -> bool:
        """Started, not continued from another run."""
        return not self.previous

    @property
    def size(self) -> int:
        """About what it takes in memory, for :class:`ClosedRuns`."""
        return 1024 + sum(p.ByteSize() for p in self.batches) + 200 * len(self.children)


_CLOSE_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)

CLOSED_RUNS_BYTES = 64 * 1024 * 1024
"""What :class:`ClosedRuns` keeps at most (the answer batches of the runs it holds, about)."""


class ClosedRuns:
    """What closed runs' histories hold for the trail, kept across audits: a closed run's
    history never changes, and reading them all again on every ``/audit`` (a chat's runs
    took 1.1 s for 94 MB of history) let one chat make every audit of it that slow. Only the
    open run, at most one per chat id, is read each time. Least recently used first out past
    ``max_bytes``. One per :class:`client.AgentClient`; not shared across namespaces, since
    the key holds the namespace."""

    def __init__(self, *, max_bytes: int = CLOSED_RUNS_BYTES) -> None:
        self.max_bytes = max_bytes
        self._runs: OrderedDict[tuple[str, str, str], RunTrail] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, str, str]) -> RunTrail | None:
        run = self._runs.get(key)
        if run is not None:
            self._runs.move_to_end(key)
        return run

    def put(self, key: tuple[str, str, str], run: RunTrail) -> None:
        if not run.closed or run.size > self.max_bytes or key in self._runs:
            return
        self._runs[key] = run
        self._bytes += run.size
        while self._bytes > self.max_bytes:
            _, dropped = self._runs.popitem(last=False)
            self._bytes -= dropped.size

    def __len__(self) -> int:
        return len(self._runs)


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
                    initiator=attrs.initiator,
                    origin=attrs.original_execution_run_id or run_id,
                    workflow_type=attrs.workflow_type.name,
                    task_queue=attrs.task_queue.name,
                )
            elif run is None:
                continue
            elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                run.begun = True
            elif kind == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
                fields = event.workflow_properties_modified_event_attributes.upserted_memo.fields
                if MEMO_KEY in fields:
                    run.batches.append(fields[MEMO_KEY])
            elif kind in _CLOSE_EVENTS:
                run.closed = True
            elif kind == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = event.child_workflow_execution_started_event_attributes
                run.children.append(
                    (child.workflow_execution.workflow_id, child.workflow_execution.run_id)
                )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None  # past the namespace's retention, or never there
        raise
    return run


def judge(
    runs: Mapping[str, RunTrail],
    gone: Set[str],
    *,
    task_queue: str,
    retained_since: datetime | None = None,
    first_run: str | None = None,
) -> dict[str, str]:
    """Why each run that is not the conversation's own is not (trusted runs are left out).

    Args:
        runs: Every run read, by run id.
        gone: Run ids a run continued from whose history Temporal no longer has.
        task_queue: The task queue this deployment's workers poll.
        retained_since: Runs that closed after this are still within the namespace's
            retention (None: unknown). A run continued from one that is gone although it
            closed then (when the run began) had its predecessor deleted: a gap someone made.
        first_run: The run the conversation began with, when that is known from elsewhere (a
            sub-agent's: the run its caller started); otherwise the earliest fresh start.
    """
    early = _deleted_early(runs, gone, retained_since)
    first = runs.get(first_run) if first_run is not None else head(runs, gone - early)
    verdicts: dict[str, str | None] = {}

    def verdict(run: RunTrail) -> str | None:
        if run.run_id not in verdicts:
            # Runs link back to older runs only; should a chain ever loop, it vouches for none.
            verdicts[run.run_id] = "its chain of runs loops"
            verdicts[run.run_id] = _why_not(run)
        return verdicts[run.run_id]

    def _why_not(run: RunTrail) -> str | None:
        foreign = _foreign(run, task_queue=task_queue)
        if foreign is not None:
            return foreign
        if run.previous and run.initiator == _BY_RETRY:
            return "a retry: it began again with the first run's input, not what a run carried"
        if run.previous and run.initiator == _BY_CRON:
            return "a cron run: it began with its starter's input, not what a run carried"
        if run.previous and run.initiator != _BY_WORKFLOW:
            return "it continued from another run in a way Temporal does not name"
        if run.previous in early:
            return (
                f"it continued from run {run.previous}, whose history was deleted before the "
                "namespace's retention ran out: what it handed on cannot be checked"
            )
        if run.fresh or run.previous in gone:
            if first is not None and run.origin == first.origin:
                return None
            if run.fresh:
                return (
                    "a later start under the chat's id (this product's client never begins a "
                    "second conversation under one id)"
                )
            return "it continued from a run whose history is gone, after the conversation began"
        before = runs.get(run.previous or "")
        if before is None:
            return "it continued from a run that could not be read"
        if verdict(before) is not None:
            return f"it continued from run {before.run_id}, which is not trusted"
        return None

    for run in runs.values():
        verdict(run)
    return {run_id: why for run_id, why in verdicts.items() if why is not None}


def _foreign(run: RunTrail, *, task_queue: str) -> str | None:
    """Why a run is not one this deployment's workers ran, if it is not."""
    if run.workflow_type != WORKFLOW_TYPE:
        return f"a workflow of another type than {WORKFLOW_TYPE}"
    if run.task_queue != task_queue:
        return f"it ran on another task queue than {task_queue!r}, which this client's workers poll"
    return None


def _deleted_early(
    runs: Mapping[str, RunTrail], gone: Set[str], retained_since: datetime | None
) -> set[str]:
    """The gone runs that closed (when their successor began) within retention."""
    if retained_since is None:
        return set()
    return {
        r.previous
        for r in runs.values()
        if r.previous in gone and r.previous is not None and r.started > retained_since
    }


def head(runs: Mapping[str, RunTrail], gone: Set[str]) -> RunTrail | None:
    """The conversation's first run still in history: the earliest-started fresh start, or
    run whose predecessor's history is gone (its runs before it past retention)."""
    heads = [
        r for r in runs.values() if r.fresh or (r.initiator == _BY_WORKFLOW and r.previous in gone)
    ]
    return min(heads, key=lambda r: (r.started, r.origin), default=None)


async def claimed(temporal: Client, chat_id: str, run: RunTrail) -> int:
    """How many answer records an untrusted run carried: in its memo writes, its start memo
    and its start input. Nothing in it is trusted, so what does not decode counts as none."""
    found = 0
    attrs = await start_event(temporal, chat_id, run.run_id)
    start_memo = attrs.memo.fields.get(MEMO_KEY) if attrs is not None else None
    for payload in [*run.batches, *([start_memo] if start_memo is not None else [])]:
        found += len(records(await _decoded(temporal, payload), quiet=True))
    if attrs is not None and attrs.input.payloads:
        value = await _decoded(temporal, attrs.input.payloads[0])
        state = value.get("state") if isinstance(value, dict) else None
        if isinstance(state, dict):
            for key in ("answers", "audit_outbox"):
                found += len(records(state.get(key), quiet=True))
    return found


async def _decoded(temporal: Client, payload: Payload | None) -> object:
    if payload is None:
        return None
    try:
        (value,) = await temporal.data_converter.decode([payload])
    except Exception:  # noqa: BLE001  # what does not decode reads as absent; callers say what that means
        return None
    return value


async def carried_answers(temporal: Client, payload: Payload | None) -> list[AnswerRecord]:
    """The answer records a continue-as-new input (a ``ConversationInput``) carries."""
    if payload is None:
        return []
    (carried,) = await temporal.data_converter.decode([payload], [ConversationInput])
    state = carried.state if isinstance(carried, ConversationInput) else None
    return [*state.answers, *state.audit_outbox] if state is not None else []


async def start_event(
    temporal: Client, chat_id: str, run_id: str
) -> WorkflowExecutionStartedEventAttributes | None:
    """A run's start event (its input and memo), or None when Temporal no longer has it."""
    handle = temporal.get_workflow_handle(chat_id, run_id=run_id)
    try:
        async for event in handle.fetch_history_events():
            return event.workflow_execution_started_event_attributes
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return None


async def start_input(temporal: Client, chat_id: str, run_id: str) -> Payload | None:
    """A run's own input (what its predecessor carried into it, or what its starter sent)."""
    attrs = await start_event(temporal, chat_id, run_id)
    payloads = attrs.input.payloads if attrs is not None else []
    return payloads[0] if payloads else None


async def _retained_since(temporal: Client) -> datetime | None:
    """When the namespace's retention begins now: a run closed since is still kept (None when
    the namespace cannot be described, or keeps histories for ever)."""
    try:
        desc = await temporal.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=temporal.namespace)
        )
    except RPCError:
        return None
    ttl = desc.config.workflow_execution_retention_ttl
    if not ttl.seconds and not ttl.nanos:
        return None
    # A little slack: deletion past retention is a background task, not to the second.
    return datetime.now(UTC) - ttl.ToTimedelta() + timedelta(hours=1)


async def list_runs(temporal: Client, chat_id: str) -> list[str]:
    """Every run visibility lists for the chat id, closed ones too."""
    if '"' in chat_id or "\\" in chat_id:
        return []  # cannot be quoted in a query: the chain of runs alone is followed
    return [wf.run_id async for wf in temporal.list_workflows(f'WorkflowId = "{chat_id}"')]


async def audit_trail(
    temporal: Client,
    chat_id: str,
    *,
    task_queue: str,
    latest_run: str,
    closed_runs: ClosedRuns | None = None,
) -> AuditReport:
    """Every answer the conversation ``chat_id`` applied, once each, oldest first, and the
    runs under its id that are not the conversation's (see the module docstring).

    Args:
        task_queue: The task queue this deployment's workers poll: only runs there are trusted.
        latest_run: The run id of its newest run (visibility may not list it yet).
        closed_runs: Closed runs read before, kept for the next audit (None: every run's
            history is read).

    Raises:
        temporalio.service.RPCError: reading a history or the visibility listing failed.
        client.codec.PayloadKeyMissing: a trusted run's records are encrypted with a key this
            process lacks.
    """
    return await _trail(
        temporal,
        chat_id,
        task_queue=task_queue,
        latest_run=latest_run,
        first_run=None,
        depth=0,
        retained_since=await _retained_since(temporal),
        limit=asyncio.Semaphore(_PARALLEL_READS),
        closed_runs=closed_runs if closed_runs is not None else ClosedRuns(max_bytes=0),
    )


async def _trail(
    temporal: Client,
    chat_id: str,
    *,
    task_queue: str,
    latest_run: str,
    first_run: str | None,
    depth: int,
    retained_since: datetime | None,
    limit: asyncio.Semaphore,
    closed_runs: ClosedRuns,
) -> AuditReport:
    """:func:`audit_trail`, for a conversation ``depth`` callers deep.

    Args:
        first_run: The run it began with, when known (a sub-agent's, from its caller's
            history): only that run's chain is trusted.
        retained_since: As :func:`judge` takes it, read once for the whole trail.
        limit: The reads under way at once, shared by the caller and its sub-agents.
    """
    runs: dict[str, RunTrail] = {}
    gone: set[str] = set()

    async def read(run_id: str) -> RunTrail | None:
        key = (temporal.namespace, chat_id, run_id)
        kept = closed_runs.get(key)
        if kept is not None:
            return kept
        async with limit:
            run = await read_run(temporal, chat_id, run_id)
        if run is not None:
            closed_runs.put(key, run)
        return run

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
    why_not = judge(
        runs,
        gone,
        task_queue=task_queue,
        retained_since=retained_since,
        first_run=first_run,
    )
    ordered = sorted(runs.values(), key=lambda r: (r.started, r.run_id))
    trusted = [run for run in ordered if run.run_id not in why_not]

    batches: list[AnswerRecord] = []
    fallback: list[AnswerRecord] = []
    for run in trusted:
        for payload in run.batches:
            (batch,) = await temporal.data_converter.decode([payload])
            batches += records(batch)
        if run.previous in gone:
            # Its predecessor's history is gone: what it carried in is all that is left of it.
            # (Trusted, so the workflow itself continued as new into it.)
            fallback += await carried_answers(
                temporal, await start_input(temporal, chat_id, run.run_id)
            )

    untrusted = [
        UntrustedRun(
            run_id=run.run_id,
            started=run.started,
            reason=why_not[run.run_id],
            claimed=await claimed(temporal, chat_id, run),
            workflow_type=run.workflow_type,
            task_queue=run.task_queue,
        )
        for run in ordered
        if run.run_id in why_not
    ]
    for run in untrusted:
        # Info, not a warning: the report carries them, and agentctl (no logging set up) would
        # print a warning a second time, through Python's last-resort handler.
        log.info("audit of %r: run %s left out: %s", chat_id, run.run_id, run.reason)
    report = AuditReport(records=merge(batches, fallback), untrusted=untrusted, gone=sorted(gone))
    if depth < MAX_AGENT_DEPTH:
        # Its sub-agents' answers: each child chain as the trusted runs' own commands started
        # it (a workflow someone else began under a child's id is not read as the child).
        children = dict.fromkeys(child for run in trusted for child in run.children)
        subs = await asyncio.gather(
            *(
                _trail(
                    temporal,
                    child_id,
                    task_queue=task_queue,
                    latest_run=child_run,
                    first_run=child_run,
                    depth=depth + 1,
                    retained_since=retained_since,
                    limit=limit,
                    closed_runs=closed_runs,
                )
                for child_id, child_run in children
            )
        )
        for (child_id, _), sub in zip(children, subs, strict=True):
            report.records += [
                r if r.chat_id else r.model_copy(update={"chat_id": child_id}) for r in sub.records
            ]
            report.untrusted += [
                u if u.chat_id else u.model_copy(update={"chat_id": child_id})
                for u in sub.untrusted
            ]
            report.gone += sub.gone
        report.records = merge(report.records)
    return report


__all__ = [
    "CLOSED_RUNS_BYTES",
    "MEMO_KEY",
    "AuditReport",
    "ClosedRuns",
    "RunTrail",
    "UntrustedRun",
    "audit_trail",
    "carried_answers",
    "claimed",
    "head",
    "judge",
    "list_runs",
    "merge",
    "read_run",
    "record_key",
    "records",
    "start_event",
    "start_input",
]

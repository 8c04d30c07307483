"""The invariants, checked after the soak from what is outside the harness's own bookkeeping.

Evidence (:func:`gather`): the ledger (the payment provider's file), every run's history
(fetched through the client), the audit trail (``agents.audit_report``, and ``agentctl audit
--json`` for a sample, which must agree), what the model was told (``Chat.history()``'s tool
responses), the rejection log (the ``rejections`` query: its total counts every refused signal,
its list keeps the last 20) and how each workflow ended. The harness's own record of what it
sent (:class:`~bench.soak.driver.Attempt`) says what should be there.

Each invariant's violations are counted, with a few examples (:func:`check`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory, WorkflowQueryFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from bench.soak.driver import Attempt, Conversation
from bench.soak.ledger import Run
from bench.soak.paths import Paths
from temporal_agent_interrupts.client.audit import list_runs
from temporal_agent_interrupts.errors import AgentError
from temporal_agent_interrupts.worker import sandbox_runner
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    ConversationResult,
    JsonObject,
    Rejection,
    RejectionsResult,
)

log = logging.getLogger("bench.soak")

INVARIANTS = (
    "approval_ran_at_most_once",
    "approval_ran_once_or_model_told",
    "refused_answer_ran_nothing",
    "no_pause_lost",
    "last_turn_finished",
    "accepted_answer_in_audit_once",
    "no_standing_task_failure",
    "refused_signal_in_rejection_log",
    "workers_stopped_only_by_schedule",
)
"""What must hold, each with its own count of violations."""

PAYING = ("transfer", "refund")
UNCERTAIN = "may have taken effect"
EXAMPLES = 5

_TASK_ENDS = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "timed_out",
}


@dataclass
class RunEvidence:
    run_id: str
    last_task: str
    """How the run's last workflow task ended: completed, failed, timed_out (or none)."""
    failed_tasks: list[str]
    """Every workflow task failure in the run, with its cause and message."""
    timed_out_tasks: int
    history: WorkflowHistory
    replay_failure: str | None = None
    """Why the run's history does not replay on today's code (None: it does)."""


@dataclass
class ChatEvidence:
    chat_id: str
    status: str
    result: ConversationResult | None
    records: list[AnswerRecord]
    untrusted: int
    runs: list[RunEvidence]
    responses: dict[str, JsonObject]
    """What the model was told of each call, by call id (= ref)."""
    rejections_total: int
    rejections: list[Rejection]
    errors: list[str] = field(default_factory=list)
    """Queries that failed (a run whose history no longer replays, say)."""
    queried: bool = True
    """Whether what the model was told and the rejection log could be read (a run whose last
    task failed cannot answer queries: its own violation says so)."""


async def gather(
    paths: Paths, chat_ids: Sequence[str], *, parallel: int = 6
) -> dict[str, ChatEvidence]:
    limit = asyncio.Semaphore(parallel)

    async def one(chat_id: str) -> ChatEvidence:
        async with limit:
            for attempt in range(5):
                try:
                    return await _chat_evidence(paths, chat_id)
                except (AgentError, RPCError) as e:
                    if attempt == 4:
                        raise
                    log.warning("reading %s: %s; again", chat_id, e)
                    await asyncio.sleep(2.0)
            raise AssertionError("unreachable")

    found = await asyncio.gather(*(one(c) for c in chat_ids))
    return {e.chat_id: e for e in found}


async def _chat_evidence(paths: Paths, chat_id: str) -> ChatEvidence:
    client = paths.agents.temporal
    handle = client.get_workflow_handle_for(AgentWorkflow.run, chat_id)
    desc = await handle.describe()
    status = desc.status.name if desc.status else "UNKNOWN"
    result = await handle.result() if desc.status == WorkflowExecutionStatus.COMPLETED else None
    report = await paths.agents.audit_report(chat_id)
    runs: list[RunEvidence] = []
    run_ids = list(dict.fromkeys([desc.run_id, *await list_runs(client, chat_id)]))
    while run_ids:
        run_id = run_ids.pop(0)
        evidence, previous = await _run_evidence(paths, chat_id, run_id)
        runs.append(evidence)
        if previous and previous not in {r.run_id for r in runs} and previous not in run_ids:
            run_ids.append(previous)
    errors: list[str] = []
    responses: dict[str, JsonObject] = {}
    rejections = RejectionsResult()
    if all(r.last_task == "completed" for r in runs):
        # Queries replay the run on a worker: one whose last task failed cannot answer.
        chat = paths.chat(chat_id)
        try:
            history = await chat.history()
            rejections = await handle.query(AgentWorkflow.rejections)
        except (AgentError, WorkflowQueryFailedError) as e:
            errors.append(f"a query failed: {e}"[:300])
        else:
            for message in history.messages:
                for part in message.parts:
                    fr = part.function_response
                    if fr is not None and fr.id:
                        responses[fr.id] = fr.response
    queried = all(r.last_task == "completed" for r in runs) and not errors
    return ChatEvidence(
        chat_id=chat_id,
        status=status,
        result=result,
        records=report.records,
        untrusted=len(report.untrusted),
        runs=runs,
        responses=responses,
        rejections_total=rejections.total,
        rejections=rejections.rejections,
        errors=errors,
        queried=queried,
    )


async def _run_evidence(paths: Paths, chat_id: str, run_id: str) -> tuple[RunEvidence, str | None]:
    handle = paths.agents.temporal.get_workflow_handle(chat_id, run_id=run_id)
    last = "none"
    failed: list[str] = []
    timed_out = 0
    previous = None
    history = await handle.fetch_history()
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            previous = (
                event.workflow_execution_started_event_attributes.continued_execution_run_id or None
            )
        if kind in _TASK_ENDS:
            last = _TASK_ENDS[kind]
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attrs = event.workflow_task_failed_event_attributes
            failed.append(f"{attrs.cause}: {attrs.failure.message[:200]}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timed_out += 1
    evidence = RunEvidence(
        run_id=run_id,
        last_task=last,
        failed_tasks=failed,
        timed_out_tasks=timed_out,
        history=history,
    )
    return evidence, previous


async def replay(evidence: dict[str, ChatEvidence]) -> None:
    """Replay every run's history on today's code, as a worker does: one that does not replay
    fails the task of any worker that takes the run without it in its cache, so it is a task
    failure waiting to happen. (The workers' own sandbox: the strict one, which the recorded
    histories replay in, checks the code's calls, not the history, and is slower.)"""
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        interceptors=[ResultKeysInterceptor(resolve_result_keys())],
        workflow_runner=sandbox_runner(),
    )
    runs = {run.run_id: run for ev in evidence.values() for run in ev.runs}
    results = await replayer.replay_workflows(
        _histories(list(runs.values())), raise_on_replay_failure=False
    )
    for run_id, failure in results.replay_failures.items():
        runs[run_id].replay_failure = f"{type(failure).__name__}: {failure}"[:300]


async def _histories(runs: list[RunEvidence]) -> AsyncIterator[WorkflowHistory]:
    for run in runs:
        yield run.history


# ----------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    violations: dict[str, int]
    examples: dict[str, list[str]]
    figures: dict[str, Any]


class _Tally:
    def __init__(self) -> None:
        self.violations: Counter[str] = Counter({name: 0 for name in INVARIANTS})
        self.examples: dict[str, list[str]] = defaultdict(list)

    def bad(self, invariant: str, example: str) -> None:
        assert invariant in INVARIANTS, invariant
        self.violations[invariant] += 1
        if len(self.examples[invariant]) < EXAMPLES:
            self.examples[invariant].append(example)


def _record_owner(record: AnswerRecord, attempts: list[Attempt]) -> Attempt | None:
    """The attempt that sent ``record``'s answer: by the answer id its metadata carries, else
    by ref and identity (each attempt's identity is its own, except the approvers')."""
    answer_id = (record.metadata or {}).get("answer_id")
    if isinstance(answer_id, str):
        return next((a for a in attempts if a.answer_id == answer_id), None)
    if record.kind == "cancel":
        return next(
            (a for a in attempts if a.kind == "cancel" and a.identity == record.identity), None
        )
    candidates = [
        a
        for a in attempts
        if a.kind != "cancel" and a.ref == record.ref and a.identity == record.identity
    ]
    rank = {"accepted": 0, "unknown": 1, "sent": 2, "refused": 3}
    candidates.sort(key=lambda a: rank[a.status])
    return candidates[0] if candidates else None


def check(
    conversations: Sequence[Conversation],
    evidence: dict[str, ChatEvidence],
    ledger: Sequence[Run],
    *,
    unexpected_exits: Sequence[str],
    cli_audit_mismatches: Sequence[str],
) -> Verdict:
    tally = _Tally()
    effects: dict[tuple[str, str], list[Run]] = defaultdict(list)
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in ledger:
        if run.phase == "effect":
            effects[(run.chat_id, run.ref)].append(run)
            by_key[run.idempotency_key].append(run)
    figures: Counter[str] = Counter()
    transient: list[str] = []

    # -- at most once, by call and by idempotency key ------------------------------------------
    for (chat_id, ref), runs in effects.items():
        if len(runs) > 1:
            pids = [r.pid for r in runs]
            tally.bad("approval_ran_at_most_once", f"{chat_id} {ref}: {len(runs)} runs ({pids})")
    for key, runs in by_key.items():
        if len(runs) > 1:
            tally.bad("approval_ran_at_most_once", f"idempotency key {key}: {len(runs)} runs")

    approved: set[tuple[str, str]] = set()
    for conv in conversations:
        ev = evidence.get(conv.chat_id)
        if ev is None:
            tally.bad("last_turn_finished", f"{conv.chat_id}: no evidence could be read")
            continue
        owners, settling = _audit(conv, ev, tally, figures)
        _answers(conv, owners, tally, figures)
        approved |= _approvals(conv, ev, settling, effects, tally, figures)
        _pauses_and_turns(conv, ev, settling, tally)
        for problem in conv.problems:
            figures["slot_problems"] += 1
            if len(transient) < 10:
                transient.append(f"{conv.chat_id}: {problem}"[:300])
        _tasks(conv, ev, tally, figures, transient)
        if ev.queried:
            _rejections(conv, ev, owners, tally, figures)

    for (chat_id, ref), runs in effects.items():
        if (chat_id, ref) not in approved:
            what = f"{chat_id} {ref}: {runs[0].tool} ran"
            tally.bad("refused_answer_ran_nothing", f"{what} with no approval in the audit trail")
    for line in unexpected_exits:
        tally.bad("workers_stopped_only_by_schedule", line)
    for line in cli_audit_mismatches:
        tally.bad("accepted_answer_in_audit_once", line)
    figures_out: dict[str, Any] = dict(sorted(figures.items()))
    figures_out["transient_examples"] = transient
    return Verdict(
        violations=dict(tally.violations),
        examples={k: v for k, v in tally.examples.items() if v},
        figures=figures_out,
    )


def _audit(
    conv: Conversation, ev: ChatEvidence, tally: _Tally, figures: Counter[str]
) -> tuple[dict[int, list[AnswerRecord]], dict[str, list[AnswerRecord]]]:
    """Each audit record's attempt, and each call's records (the first one settled it; a
    cancel may follow, withdrawing the run it let start)."""
    owners: dict[int, list[AnswerRecord]] = defaultdict(list)
    settling: dict[str, list[AnswerRecord]] = defaultdict(list)
    for record in ev.records:
        figures[f"audit_{record.kind}"] += 1
        settling[record.ref].append(record)
        if record.kind == "deadline":
            continue
        owner = _record_owner(record, conv.attempts)
        if owner is None:
            tally.bad(
                "accepted_answer_in_audit_once",
                f"{conv.chat_id} {record.ref}: a {record.kind} by {record.identity!r} nobody sent",
            )
            continue
        owners[owner.id].append(record)
    if ev.untrusted:
        tally.bad("accepted_answer_in_audit_once", f"{conv.chat_id}: {ev.untrusted} runs untrusted")
    return owners, settling


def _answers(
    conv: Conversation,
    owners: dict[int, list[AnswerRecord]],
    tally: _Tally,
    figures: Counter[str],
) -> None:
    """Every accepted answer is in the audit trail once; a refused one never."""
    for a in conv.attempts:
        mine = owners.get(a.id, [])
        where = f"{conv.chat_id} {a.ref}: {a.kind} {a.action} by {a.path} ({a.status})"
        if a.kind == "cancel":
            if mine and a.status == "refused":
                tally.bad("refused_answer_ran_nothing", f"{where} withdrew {len(mine)} calls")
            continue
        if a.expect == "refuse" or a.status == "refused":
            if mine:
                tally.bad("refused_answer_ran_nothing", f"{where} is in the audit trail")
            continue
        if (a.status == "accepted" and len(mine) != 1) or len(mine) > 1:
            tally.bad("accepted_answer_in_audit_once", f"{where}: {len(mine)} audit records")
        if mine:
            figures[f"applied_by_{a.path}"] += 1


def _approvals(
    conv: Conversation,
    ev: ChatEvidence,
    settling: dict[str, list[AnswerRecord]],
    effects: dict[tuple[str, str], list[Run]],
    tally: _Tally,
    figures: Counter[str],
) -> set[tuple[str, str]]:
    """Each approval of a paying tool ran it once, or the model was told it may have taken
    effect; no other answer ran it. Returns the calls approved."""
    approved: set[tuple[str, str]] = set()
    for ref, records in settling.items():
        first = records[0]
        name = first.name
        if name not in PAYING:
            continue
        runs = effects.get((conv.chat_id, ref), [])
        where = f"{conv.chat_id} {ref}"
        if not (first.kind == "restart" and first.decision == "approved") and first.kind != "edit":
            if runs:
                what = f"{first.kind}/{first.decision}"
                tally.bad("refused_answer_ran_nothing", f"{where}: {name} ran after {what}")
            continue
        approved.add((conv.chat_id, ref))
        figures["approvals"] += 1
        if not ev.queried:
            continue  # what the model was told cannot be read (its runs' violations say why)
        told = ev.responses.get(ref)
        if told is None:
            tally.bad("approval_ran_once_or_model_told", f"{where}: the model never heard")
            continue
        said = json.dumps(told)[:160]
        uncertain = UNCERTAIN in json.dumps(told)
        paid = told.get("paid") is True
        figures["model_told_may_have_taken_effect"] += uncertain
        bad = "approval_ran_once_or_model_told"
        if len(runs) == 1:
            if not (paid or uncertain):
                tally.bad(bad, f"{where}: {name} ran; the model was told {said}")
            if paid and told.get("key") != runs[0].idempotency_key[:12]:
                tally.bad(bad, f"{where}: the model was told of another run ({told.get('key')})")
            if first.kind == "edit" and first.input is not None and runs[0].args != first.input:
                tally.bad(bad, f"{where}: edited to {first.input}, ran with {runs[0].args}")
        elif not runs:
            if paid:
                tally.bad(bad, f"{where}: the model was told {name} paid; the ledger has no run")
            elif told.get("error") == "cancelled" and not uncertain:
                figures["approved_then_cancelled_before_running"] += 1
            elif not uncertain:
                tally.bad(bad, f"{where}: approved {name} never ran; the model was told {said}")
    return approved


def _pauses_and_turns(
    conv: Conversation,
    ev: ChatEvidence,
    settling: dict[str, list[AnswerRecord]],
    tally: _Tally,
) -> None:
    """Every pause was answered, expired or withdrawn; every turn ended, the conversation
    closed with as many turns as were sent."""
    for ref, seen in conv.seen.items():
        if not settling.get(ref):
            where = f"{conv.chat_id} {ref} ({seen.name}, turn {seen.turn})"
            tally.bad("no_pause_lost", f"{where}: never answered, expired or withdrawn")
    if not conv.finished or not conv.closed:
        why = "; ".join(conv.problems)[:300]
        tally.bad("last_turn_finished", f"{conv.chat_id}: its slot did not finish it ({why})")
    elif conv.turns and conv.turns[-1].finish in ("", "interrupted"):
        tally.bad("last_turn_finished", f"{conv.chat_id}: turn {conv.turns[-1].number} never ended")
    if not conv.closed:
        return
    if ev.status != "COMPLETED" or ev.result is None:
        tally.bad("last_turn_finished", f"{conv.chat_id}: closed, yet its workflow is {ev.status}")
        return
    if ev.result.turns != conv.sends:
        turns = f"{ev.result.turns} turns in the workflow, {conv.sends} sent"
        tally.bad("last_turn_finished", f"{conv.chat_id}: {turns}")
    last = ev.result.last_turn
    if last is not None and last.finish_reason.value == "interrupted":
        tally.bad("no_pause_lost", f"{conv.chat_id}: its workflow ended paused")


def _tasks(
    conv: Conversation,
    ev: ChatEvidence,
    tally: _Tally,
    figures: Counter[str],
    transient: list[str],
) -> None:
    """Each run's last workflow task completed, and its history replays on today's code."""
    for run in ev.runs:
        figures["workflow_task_failures"] += len(run.failed_tasks)
        figures["workflow_task_timeouts"] += run.timed_out_tasks
        for failure in run.failed_tasks:
            if len(transient) < 20:
                transient.append(f"{conv.chat_id} {run.run_id[:8]}: {failure}")
        where = f"{conv.chat_id} run {run.run_id}"
        if run.last_task != "completed":
            tally.bad(
                "no_standing_task_failure", f"{where}: its last workflow task {run.last_task}"
            )
        if run.replay_failure is not None:
            figures["runs_that_do_not_replay"] += 1
            tally.bad("no_standing_task_failure", f"{where}: does not replay: {run.replay_failure}")
    for error in ev.errors:
        tally.bad("no_standing_task_failure", f"{conv.chat_id}: {error}")


def _rejections(
    conv: Conversation,
    ev: ChatEvidence,
    owners: dict[int, list[AnswerRecord]],
    tally: _Tally,
    figures: Counter[str],
) -> None:
    """Every refused signal is counted in the rejection log (its total counts all; the log
    keeps the last 20), and the log holds nothing else: in particular no stream publish of the
    conversation's own model activity, which may still publish after a cancel ended its turn
    (a cancel racing a streamed reply); the workflow drops those (``accept_publish``)."""
    signals = [a for a in conv.attempts if a.path == "signal"]
    refused = sum(1 for a in signals if a.status == "sent" and not owners.get(a.id))
    unsure = sum(1 for a in signals if a.status == "unknown" and not owners.get(a.id))
    figures["signals_refused_and_recorded"] += refused
    bad = "refused_signal_in_rejection_log"
    if not refused <= ev.rejections_total <= refused + unsure:
        counts = f"{ev.rejections_total} recorded, {refused} refused signals sent"
        tally.bad(bad, f"{conv.chat_id}: {counts} ({unsure} not known to have arrived)")
    identities = {a.identity for a in signals if a.identity}
    for r in ev.rejections:
        if r.handler != "resume" or (r.identity and r.identity not in identities):
            what = f"{r.handler} {r.identity!r} {r.reason[:120]}"
            tally.bad(bad, f"{conv.chat_id}: a rejection nobody here sent: {what}")
    if len(ev.rejections) != min(ev.rejections_total, 20):
        kept = f"the log keeps {len(ev.rejections)} of {ev.rejections_total}"
        tally.bad(bad, f"{conv.chat_id}: {kept}")

"""What ``agentctl`` prints: the rich views for people and the ``--json`` schemas for programs.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Everything shown comes from a conversation, and so from whoever talked to it: it passes through
``visible`` (controls made visible) and rich's ``escape`` before it reaches the terminal.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import typer
from pydantic import BaseModel, Field
from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import WorkflowExecutionDescription, WorkflowExecutionStatus

from temporal_agent_interrupts.client.audit import UntrustedRun
from temporal_agent_interrupts.client.inbox import PausedChat, PausedInterrupt
from temporal_agent_interrupts.client.stats import StatsReport
from temporal_agent_interrupts.workflows.details import shell_word, visible
from temporal_agent_interrupts.workflows.grants import describe_match
from temporal_agent_interrupts.workflows.limits import human_size
from temporal_agent_interrupts.workflows.types import (
    AgentStatus,
    AnswerRecord,
    FinishReason,
    Grant,
    GrantCondition,
    GrantOp,
    InterruptRequest,
    JsonObject,
    Rejection,
    ToolResponse,
    ToolRestart,
    TurnEvent,
    TurnResult,
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------
# ``--json`` output: stable schemas, documented in docs/reference/agentctl.md. Evolve by adding
# fields.


class PendingOutput(BaseModel):
    # Each conversation as ``AgentClient.pending()`` returns it (``client.inbox``): the fields
    # of the first release (chat_id, agent, waiting_since; each interrupt's name, ref and
    # input) and, since approval governance, each interrupt's source, since, deadline,
    # approvers, quorum and votes. An interrupt's input is a JSON object (a stated placeholder
    # with ``input_cut`` when it is too large for the memo).
    conversations: list[PausedChat] = []


class ShowOutput(BaseModel):
    chat_id: str
    agent: str
    status: AgentStatus
    turns: int
    model: str | None = None
    pending: list[InterruptRequest] = []
    last_turn: TurnResult | None = None
    rejections_total: int = 0
    recent_rejections: list[Rejection] = []
    # The newest answers on record: what was decided, by whom, by which path.
    recent_answers: list[AnswerRecord] = []


class ResumeOutput(BaseModel):
    chat_id: str
    # Who answered, as the conversation recorded it: the asserted identity, or the identity
    # token's (None when it could not be read back).
    identity: str | None
    identity_verified: bool = False
    respond: list[ToolResponse] = []
    restart: list[ToolRestart] = []
    turn: TurnResult


class CancelOutput(BaseModel):
    chat_id: str
    identity: str
    reason: str
    turn: TurnResult


class AuditOutput(BaseModel):
    chat_id: str
    # Every answer on record, oldest first, across all the conversation's runs.
    answers: list[AnswerRecord] = []
    # The runs under the chat's id left out of the trail, oldest first: only there when there
    # are any, so the output of a chat with none is as the first release printed it.
    untrusted: list[UntrustedRun] = Field(default_factory=list, exclude_if=lambda runs: not runs)
    # Runs the trail continued from that Temporal no longer has (only there when there are any).
    gone: list[str] = Field(default_factory=list, exclude_if=lambda runs: not runs)


class ExportOutput(BaseModel):
    # ``agentctl audit CHAT --export FILE``: what the chain file it wrote holds.
    chat_id: str
    file: str
    # Receipts written, the conversation's and its sub-agents', and in how many chains.
    receipts: int
    chats: int
    # The key ids they are signed under (the verifier's JWK Set must hold them), and how many
    # are unsigned (a worker with no AGENT_RECEIPT_KEYS issued them: they never verify).
    key_ids: list[str] = []
    unsigned: int = 0
    # Records on the trail without a receipt (written before receipts were issued, or deciding
    # nothing), left out of the file.
    skipped: int = 0


class VerifyOutput(BaseModel):
    # ``agentctl verify FILE --keys JWKS``: the chain holds (``ok``), or the first broken link.
    file: str
    ok: bool
    # The chain's conversation (None when the file does not read as a chain).
    chat_id: str | None = None
    # Receipts found good (all of them when ok), the chains checked and the key ids used.
    checked: int = 0
    chats: int = 0
    key_ids: list[str] = []
    # The first broken link: which receipt in which chat, and why (None when ok).
    where: str | None = None
    why: str | None = None
    # With --partial: the chains that start past seq 0 (by chat id), and the seq each starts at.
    starts: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)


class GrantsOutput(BaseModel):
    chat_id: str
    # The grants in force, oldest first, as the conversation's ``grants`` query has them.
    grants: list[Grant] = []


class RevokeGrantOutput(BaseModel):
    chat_id: str
    # The grant as it stood just before the revoke (None when it could not be read first).
    revoked: Grant | None
    identity: str
    reason: str
    # The grants still in force after it.
    grants: list[Grant] = []


class PolicyReviewOutput(BaseModel):
    chat_id: str
    # The hash of the policy set the worker holds now (None: nothing was paused on a policy).
    policy_hash: str | None = None
    # Each paused call whose decision changed, by ref: allow (released), deny (refused) or ask.
    changed: dict[str, str] = {}


class PolicyReviewsOutput(BaseModel):
    agent: str
    # One entry per paused conversation reviewed (its changes may be none).
    reviewed: list[PolicyReviewOutput] = []
    # The conversations that could not be reviewed, by chat id: why.
    failed: dict[str, str] = {}


class StatsOutput(StatsReport):
    # The window asked for (``[since, until)``) and the agent, when only one was asked for; the
    # fields above are ``client.stats.StatsReport``'s: per agent and tool (``tools``) what is
    # pending now and what was decided in the window, and how many chats were read (``*_cut``:
    # more matched than ``--limit``).
    since: datetime
    until: datetime
    agent: str | None = None


def print_json(model: BaseModel) -> None:
    """One ``--json`` answer on stdout."""
    # Plain text, not rich: the output is for programs, and must not wrap or carry styles.
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Formatting


def _when(at: datetime | None, *, now: datetime | None = None) -> str:
    if at is None:
        return "-"
    now = now or datetime.now(UTC)
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({_age(now - at)} ago)"


def _age(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


def _compact(value: object, limit: int | None = 120) -> str:
    # JSON escapes C0 controls but, with ensure_ascii off, not C1 controls or bidi overrides.
    text = visible(json.dumps(value, separators=(", ", ": "), ensure_ascii=False))
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def inbox_input(interrupt: PausedInterrupt) -> str:
    """An inbox entry's input in a line: the object, or what its placeholder says."""
    if not interrupt.input_cut:
        return _compact(interrupt.input, 200)
    size = interrupt.input.get("bytes")
    if isinstance(size, int):
        return f"(cut: {human_size(size)}, too large for the inbox; `agentctl show` has it whole)"
    return visible(str(interrupt.input.get("omitted", "(not shown)")))


def _deadline(at: datetime, *, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    when = f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if at >= now:
        return f"{when} (in {_age(at - now)})"
    return f"{when} (passed {_age(now - at)} ago)"


def who(identity: str | None, verified: bool) -> str:
    """Who answered, and whether an identity token proved it or the caller only said so."""
    if identity is None:
        return "-"
    return f"{visible(identity)} ({'verified' if verified else 'asserted'})"


def approvals(quorum: int, votes: list[str]) -> str:
    """A quorum's progress: "1 of 2 approvals: alice@example.com"."""
    line = f"{len(votes)} of {quorum} approvals"
    return f"{line}: {', '.join(visible(v) for v in votes)}" if votes else line


def safe(text: str) -> str:
    """One line of untrusted text for rich markup: controls visible, markup escaped."""
    return escape(visible(text))


_KIND = {
    "interrupt": "interrupt-only tool",
    "approval": "approval gate",
    "tool": "raised by the tool",
    "input": "a form its MCP server asks for",
}


def interrupt_panel(interrupt: InterruptRequest, *, chat_id: str | None = None) -> Panel:
    """One pending interrupt, everything an operator needs to decide; long values fold."""
    body = Table.grid(padding=(0, 2))
    body.add_column(style="dim", no_wrap=True)
    body.add_column(overflow="fold")
    body.add_row("ref", Text(visible(interrupt.ref)))
    if interrupt.path:
        # A sub-agent's interrupt (agent_tool): answered here, it is passed on to that chat,
        # whose rules decide (as the UI's details panel says).
        body.add_row("sub-agent", Text(visible(interrupt.chat_id or "")))
        body.add_row("path", Text(" → ".join(visible(step) for step in interrupt.path)))
    body.add_row("kind", Text(_KIND.get(interrupt.source, interrupt.source)))
    body.add_row("input", Text(_compact(interrupt.input, None)))
    if interrupt.metadata:
        body.add_row("metadata", Text(_compact(interrupt.metadata, None)))
    if interrupt.since:
        body.add_row("waiting", Text(f"since {_when(interrupt.since)}"))
    if interrupt.deadline:
        body.add_row("deadline", Text(_deadline(interrupt.deadline)))
    if interrupt.approvers:
        body.add_row("approvers", Text(", ".join(visible(a) for a in interrupt.approvers)))
    if interrupt.quorum > 1:
        votes = [who(v.identity, v.verified) for v in interrupt.votes]
        body.add_row(
            "quorum",
            Text(
                f"{len(votes)} of {interrupt.quorum} approvals"
                + (f": {', '.join(votes)}" if votes else "")
            ),
        )
    if chat_id is not None:
        chat, ref = shell_word(chat_id), shell_word(interrupt.ref)
        commands = f"agentctl approve {chat} {ref}\nagentctl deny {chat} {ref} --reason TEXT"
        if interrupt.editable:
            commands += (
                f"\nagentctl restart {chat} {ref} --metadata '{{\"tool_approved\": true}}' "
                "--input JSON   (an edit)"
            )
        body.add_row("answer", Text(commands))
    return Panel(
        body,
        title=Text.assemble("paused on ", (visible(interrupt.name), "bold")),
        title_align="left",
        expand=False,
    )


def _may_answer(i: PausedInterrupt) -> str:
    """Who may answer a paused interrupt, and its quorum's progress, on separate lines."""
    lines = [visible(a) for a in i.approvers] or ["anyone"]
    if i.quorum > 1:
        lines.append(approvals(i.quorum, i.votes))
    return "\n".join(lines)


def _cut(text: str, limit: int = 80) -> str:
    """Untrusted text on one line, controls visible, at most ``limit`` characters."""
    text = visible(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def chat_notes(chat: PausedChat, *, task_queue: str | None = None) -> list[str]:
    """What ``pending`` says about a chat besides its interrupts: where a sub-agent's call
    waits, why its memo could not be read, how many of its entries were left out, and a task
    queue that is not ``task_queue`` (this client's)."""
    notes: list[str] = []
    if chat.unreadable is not None:
        notes.append(f"unreadable: {_cut(chat.unreadable, 400)}")
    if chat.unreadable_entries:
        n = chat.unreadable_entries
        notes.append(f"{n} {'entry' if n == 1 else 'entries'} could not be read")
    for i in chat.interrupts:
        if i.chat_id is not None:
            notes.append(
                f"{_cut(i.name)} (ref {_cut(i.ref)}) waits in sub-agent {_cut(i.chat_id, 200)}, "
                "by its rules: answer it on this chat or that one"
            )
    if task_queue is not None and chat.task_queue not in (None, task_queue):
        notes.append(
            f"on task queue {_cut(chat.task_queue or '')!r}, not this client's "
            f"{_cut(task_queue)!r}: whatever polls that queue wrote what it says"
        )
    return notes


def paused_view(
    found: list[PausedChat], *, title: str, task_queue: str | None = None
) -> RenderableType:
    """``pending``'s table; a list instead when the terminal is too narrow for one.

    Who may answer and the deadline get columns only when some interrupt has them. A chat's
    notes (:func:`chat_notes`)
    follow the table, or its interrupts in the list.
    """
    now = datetime.now(UTC)
    interrupts = [i for c in found for i in c.interrupts]
    governed = any(i.approvers or i.quorum > 1 for i in interrupts)
    timed = any(i.deadline is not None for i in interrupts)
    # Chat ids and refs are what the operator copies into the next command, so they never wrap
    # (rich's table leaves no-wrap columns alone while it can shrink the others).
    keep = [
        max(len(visible(c.chat_id)) for c in found),
        max((len(visible(i.name)) for i in interrupts), default=1),
        max((len(visible(i.ref)) for i in interrupts), default=1),
    ]
    # Padding and rule (3 a column) plus room for AGENT, WAITING SINCE and INPUT to wrap in,
    # and for MAY ANSWER and DEADLINE when shown.
    extra = (3 + 20 if governed else 0) + (3 + 14 if timed else 0)
    if sum(keep) + 3 * 6 + 8 + 12 + 18 + extra <= out.width:
        table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD)
        columns = ["CHAT ID", "AGENT", "INTERRUPT", "REF", "WAITING SINCE", "INPUT"]
        columns += ["MAY ANSWER"] if governed else []
        columns += ["DEADLINE"] if timed else []
        for column in columns:
            no_wrap = column in ("CHAT ID", "INTERRUPT", "REF")
            table.add_column(column, overflow="fold", no_wrap=no_wrap)
        for c in found:
            rows = c.interrupts or [PausedInterrupt(name="?", ref="?")]
            for n, i in enumerate(rows):
                first = n == 0
                since = "-"
                if c.waiting_since is not None:
                    at = c.waiting_since.astimezone(UTC)
                    since = f"{at:%Y-%m-%d}\n{at:%H:%M:%S} UTC\n({_age(now - at)} ago)"
                cells = [
                    Text(visible(c.chat_id) if first else ""),
                    Text(visible(c.agent or "?") if first else ""),
                    Text(visible(i.name), style="bold"),
                    Text(visible(i.ref)),
                    Text(since if first else ""),
                    Text(inbox_input(i)),
                ]
                if governed:
                    cells.append(Text(_may_answer(i)))
                if timed:
                    cells.append(
                        Text(_deadline(i.deadline, now=now).replace(" (", "\n(", 1))
                        if i.deadline is not None
                        else Text("-")
                    )
                table.add_row(*cells, end_section=n == len(rows) - 1)
        # Notes go under the table, a line each (the console does not wrap them): in a cell
        # they would wrap, and a reason is read whole.
        notes = [
            Text.assemble("  ", (visible(c.chat_id), "bold"), f": {note}", style="yellow")
            for c in found
            for note in chat_notes(c, task_queue=task_queue)
        ]
        return Group(table, *notes) if notes else table
    lines = [Text(title, style="italic"), Text()]
    for c in found:
        # Two lines: a generated chat id (`chat-<uuid>`, 41 characters) with the agent and the
        # waiting time on one line overflowed an 80-column terminal.
        lines.append(Text.assemble((visible(c.chat_id), "bold"), f" · {visible(c.agent or '?')}"))
        lines.append(Text(f"  waiting since {_when(c.waiting_since, now=now)}"))
        for i in c.interrupts:
            lines.append(Text.assemble("  ", (visible(i.name), "bold"), f"  ref {visible(i.ref)}"))
            lines.append(Text(f"    input {inbox_input(i)}"))
            if i.approvers or i.quorum > 1:
                lines.append(Text(f"    may answer {_may_answer(i).replace(chr(10), ' · ')}"))
            if i.deadline is not None:
                lines.append(Text(f"    deadline {_deadline(i.deadline, now=now)}"))
        lines += [
            Text(f"  {note}", style="yellow") for note in chat_notes(c, task_queue=task_queue)
        ]
        lines.append(Text())
    return Group(*lines)


def print_turn(res: TurnResult) -> None:
    """How a turn ended, or the interrupts it paused on."""
    reason = res.finish_reason
    if reason == FinishReason.INTERRUPTED:
        out.print(
            f"turn {res.turn} is [bold yellow]paused[/] on {len(res.interrupts)} interrupt(s):"
        )
        for interrupt in res.interrupts:
            out.print(interrupt_panel(interrupt))
        return
    style = {FinishReason.STOP: "green", FinishReason.FAILED: "red"}.get(reason, "yellow")
    out.print(f"turn {res.turn} ended: [bold {style}]{reason.value}[/]")
    if res.error:
        out.print(f"error: {safe(res.error.status)}: {safe(res.error.message)}")
    # A cancelled turn's text is what the model said before the pause ("I need your
    # approval..."): printed after "ended: cancelled" it would read as the agent's answer.
    if res.text and reason != FinishReason.CANCELLED:
        out.print(Text.assemble(("agent> ", "bold cyan"), visible(res.text, multiline=True)))


def answer_words(answer: ToolResponse | ToolRestart) -> str:
    """An answer in words, for "answered NAME with ..."."""
    if isinstance(answer, ToolResponse):
        return f"respond {_compact(answer.output, None)}"
    words = f"restart with metadata {_compact(answer.resumed_metadata, None)}"
    if answer.remember is not None:
        until = answer.remember.until
        words += (
            f", remembering: {visible(describe_match(answer.remember.match))}"
            f" {'until ' + _deadline(until) if until else 'until revoked'}"
        )
    return words


def closed_as(desc: WorkflowExecutionDescription) -> str | None:
    """How the conversation's workflow ended ("terminated", "timed out"); None while it runs."""
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    return desc.status.name.lower().replace("_", " ") if desc.status else "closed"


def paused_again(chat_id: str, interrupt: InterruptRequest) -> Text:
    """Why the call just answered is pending again, in the words its kind needs."""
    approve_it = f"agentctl approve {shell_word(chat_id)} {shell_word(interrupt.ref)}"
    if interrupt.source == "approval":
        why = (
            'a gated tool runs only when restarted with {"tool_approved": true} '
            f"({approve_it} does that)"
        )
    elif interrupt.source == "tool":
        why = (
            "the tool raised Interrupt again, so its own condition for running still holds "
            '(see its metadata above); a tool that checks {"tool_approved": true} runs with '
            f"{approve_it}"
        )
    elif interrupt.source == "input":
        why = (
            "its MCP server asked for more input (another form, or another round); answer it "
            f"with agentctl respond {shell_word(chat_id)} {shell_word(interrupt.ref)} and the "
            "form's data, or decline it with agentctl deny"
        )
    else:
        why = (
            "an interrupt-only tool has nothing to run, so a restart only asks again; answer "
            f"it with {approve_it}, or with agentctl deny or respond"
        )
    return Text(f"the call paused again on the same ref: {why}", style="bold yellow")


def print_paused(
    found: list[PausedChat],
    *,
    agent: str | None,
    approver: str | None = None,
    task_queue: str | None = None,
) -> None:
    """``agentctl pending``'s answer for a person: oldest first, as ``found`` is sorted.

    ``task_queue`` is this client's: a chat on another is said to be.
    """
    scope = (f" for agent {agent}" if agent else "") + (
        f" that {approver} may answer" if approver else ""
    )
    if not found:
        out.print(f"No paused conversations{safe(scope)}.")
        return
    title = visible(f"Paused conversations{scope}: {len(found)}")
    out.print(paused_view(found, title=title, task_queue=task_queue))
    out.print("Answer with: agentctl approve|deny CHAT_ID REF, or agentctl show CHAT_ID")


def print_status(
    view: ShowOutput, *, ended: str | None, task_queue: str, client_queue: str | None = None
) -> None:
    """``agentctl show``'s answer for a person.

    Args:
        view: what the conversation said about itself.
        ended: how its workflow ended ("terminated"), when Temporal says it is closed.
        client_queue: agentctl's own task queue, whose runs ``agentctl audit`` trusts: a
            conversation on another is audited only with ``--task-queue`` naming its queue.
        task_queue: the queue it runs on.
    """
    closed = view.status == "closed"
    out.print(
        f"[bold]{safe(view.chat_id)}[/] · agent [bold]{safe(view.agent)}[/] · "
        f"status [bold]{view.status}[/]"
        + (f" ({ended})" if ended else "")
        + f" · turns {view.turns}"
        + (f" · model {safe(view.model)}" if view.model else "")
        + f" · task queue {safe(task_queue)}"
    )
    if view.pending:
        for interrupt in view.pending:
            out.print(interrupt_panel(interrupt, chat_id=view.chat_id))
        out.print(
            "Or answer with respond/restart; withdraw every pending interrupt with "
            f"agentctl cancel {escape(shell_word(view.chat_id))}"
        )
    lt = view.last_turn
    if lt is not None and lt.finish_reason != FinishReason.INTERRUPTED:
        out.print(f"Last turn {lt.turn}: [bold]{lt.finish_reason.value}[/]")
        if lt.error:
            out.print(f"  error: {safe(lt.error.status)}: {safe(lt.error.message)}")
        said = visible(lt.text, multiline=True)
        if lt.text and lt.finish_reason == FinishReason.CANCELLED:
            out.print(Text.assemble("  the agent's last words before the cancel: ", said))
        elif lt.text:
            out.print(Text.assemble("  agent> ", said))
    elif lt is not None and closed:
        # Terminated (or timed out) while paused: the turn keeps what it paused on, but
        # none of it is pending any more, so no command to answer it is offered.
        on = ", ".join(visible(i.name) for i in lt.interrupts)
        out.print(
            f"Last turn {lt.turn} was cut off while paused"
            + (f" on {escape(on)}" if on else "")
            + ": the conversation is closed, and nothing in it can be answered."
        )
        if lt.text:
            said = visible(lt.text, multiline=True)
            out.print(Text.assemble("  the agent's last words before the pause: ", said))
    elif lt is not None and lt.text:
        said = visible(lt.text, multiline=True)
        out.print(Text.assemble(f"Last turn {lt.turn} (paused) so far: ", said))
    if view.recent_answers:
        table = Table(title="Recent decisions", title_justify="left")
        for column in ("AT", "TOOL", "REF", "DECISION", "BY", "VIA"):
            table.add_column(column, no_wrap=True)
        for a in view.recent_answers[-10:]:
            table.add_row(
                f"{a.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                Text(visible(a.name)),
                Text(visible(a.ref)),
                a.decision or a.kind,
                Text(who(a.identity, a.identity_verified)),
                a.via,
            )
        out.print(table)
        audit = f"agentctl audit {escape(shell_word(view.chat_id))}"
        if client_queue is not None and task_queue != client_queue:
            # Plain `agentctl audit` leaves its runs out ("No answers on record"). Said, not
            # assumed: whoever polls that queue wrote them, so trusting it is the reader's call.
            queue = escape(shell_word(task_queue))
            audit = (
                f"agentctl --task-queue {queue} audit {escape(shell_word(view.chat_id))} (its "
                f"runs are on task queue {safe(task_queue)}, not this client's "
                f"{safe(client_queue)}: audit trusts them only so, if your workers poll it)"
            )
        out.print(f"Every answer on record: {audit}")
    if view.recent_rejections:
        table = Table(
            title=f"Recent rejected answers ({view.rejections_total} in all)",
            title_justify="left",
        )
        for column in ("AT", "VIA", "HANDLER", "IDENTITY"):
            table.add_column(column, no_wrap=True)
        table.add_column("REASON", overflow="fold")
        for r in view.recent_rejections[-10:]:
            table.add_row(
                f"{r.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                r.via,
                Text(visible(r.handler)),
                Text(visible(r.identity or "-")),
                Text(visible(r.reason)),
            )
        out.print(table)


def answer_summary(record: AnswerRecord) -> str:
    """What an answer said, in a line: an edit's input (and the model's), else its output."""
    if record.kind == "edit":
        text = f"input {_compact(record.input, 80)}"
        if record.original_input is not None:
            text += f" (was {_compact(record.original_input, 60)})"
        return text
    if record.verdict_reason is not None:
        # A caller's record of an answer its sub-agent refused: why, in the sub-agent's words.
        return f"refused: {visible(record.verdict_reason)[:100]}"
    if record.output is not None:
        return _compact(record.output, 100)
    if record.metadata:
        return f"metadata {_compact(record.metadata, 90)}"
    return ""


def print_audit(
    chat_id: str,
    answers: list[AnswerRecord],
    *,
    untrusted: Sequence[UntrustedRun] = (),
    gone: Sequence[str] = (),
) -> None:
    """``agentctl audit``'s answer for a person: every answer on record, oldest first; a table,
    or a list when the terminal is too narrow for one. Then a warning for each run under the
    chat's id that the trail leaves out."""
    _print_trail(chat_id, answers)
    for run in untrusted:
        n = run.claimed
        claims = f" with the {n} answer record{'' if n == 1 else 's'} it claimed" if n else ""
        out.print(
            Text(
                f"warning: run {visible(run.run_id)}"
                + (f" of sub-agent {visible(run.chat_id)}" if run.chat_id else "")
                + " (started "
                f"{run.started.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC) left out of the trail"
                f"{claims}: {visible(run.reason)}",
                style="bold yellow",
            )
        )
    for run_id in gone:
        out.print(
            Text(
                f"note: run {visible(run_id)}, which the trail continued from, is no longer in "
                "Temporal's history (past retention, or deleted): only what it carried on is here",
                style="yellow",
            )
        )


def _print_trail(chat_id: str, answers: list[AnswerRecord]) -> None:
    if not answers:
        out.print(f"No answers on record for {safe(chat_id)}.")
        return
    title = visible(f"Answers on record for {chat_id}: {len(answers)}")
    rows = [
        (
            f"{a.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
            visible(a.name),
            # A sub-agent's answer (agent_tool) names the conversation it was applied in.
            visible(a.ref if not a.chat_id else f"{a.ref} in {a.chat_id}"),
            a.kind,
            a.decision or a.verdict or "-",
            who(a.identity, a.identity_verified),
            a.via,
            receipt_short(a),
            answer_summary(a),
        )
        for a in answers
    ]
    # Every column but the last at its widest, padding and rule (3 a column), and 30 for it;
    # the receipt column only when there is room for it too (--json has each whole).
    widths = [max(len(row[n]) for row in rows) for n in range(8)]
    receipts = any(row[7] for row in rows)
    if sum(widths[:7]) + 3 * 8 + 30 <= out.width:
        shown = [0, 1, 2, 3, 4, 5, 6]
        if receipts and sum(widths) + 3 * 9 + 30 <= out.width:
            shown.append(7)
        table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD)
        names = ("AT", "TOOL", "REF", "KIND", "DECISION", "BY", "VIA", "RECEIPT")
        for n in shown:
            table.add_column(names[n], no_wrap=True)
        table.add_column("OUTPUT / EDIT", overflow="fold")
        for row in rows:
            table.add_row(*(Text(row[n]) for n in shown), Text(row[8]))
        out.print(table)
        return
    lines = [Text(title, style="italic"), Text()]
    for at, name, ref, kind, decision, by, via, receipt, summary in rows:
        lines.append(Text.assemble(f"{at} UTC  ", (name, "bold"), f"  ref {ref}"))
        lines.append(Text(f"  {kind} · {decision} · by {by} · via {via}"))
        if receipt:
            lines.append(Text(f"  receipt {receipt}"))
        if summary:
            lines.append(Text(f"  {summary}"))
    out.print(Group(*lines))


def print_export(summary: ExportOutput) -> None:
    """``agentctl audit --export``'s line: what the chain file holds, and what will not verify."""
    subs = summary.chats - 1
    where = f" ({subs} sub-agent chain{'' if subs == 1 else 's'})" if subs else ""
    keys = ", ".join(summary.key_ids) or "no key"
    out.print(
        Text(
            f"wrote {summary.receipts} receipt{'' if summary.receipts == 1 else 's'} of "
            f"{visible(summary.chat_id)}{where} to {visible(summary.file)}, signed under "
            f"{visible(keys)}"
            + (f"; {summary.skipped} record(s) without one left out" if summary.skipped else "")
        )
    )
    if summary.unsigned:
        out.print(
            Text(
                f"warning: {summary.unsigned} receipt(s) are unsigned (issued by a worker without "
                "AGENT_RECEIPT_KEYS): agentctl verify will refuse them",
                style="bold yellow",
            )
        )


def print_verified(result: VerifyOutput) -> None:
    """``agentctl verify``'s line when the chain holds."""
    out.print(
        Text(
            f"ok: {result.checked} receipt{'' if result.checked == 1 else 's'} in "
            f"{result.chats} chain{'' if result.chats == 1 else 's'} of "
            f"{visible(result.chat_id or '-')} verified, signed under "
            f"{visible(', '.join(result.key_ids))}"
            + "".join(
                f"; the chain of {visible(chat)} starts at seq {seq} (the receipts before it "
                "are not in the file)"
                for chat, seq in sorted(result.starts.items())
            )
        )
    )


RECEIPT_SHOWN = 16
"""Hex characters of a receipt's id shown in a table (its whole id is in ``--json``)."""


def receipt_short(record: AnswerRecord) -> str:
    """A record's receipt id as a table shows it (its first characters), or empty."""
    return record.receipt.id[:RECEIPT_SHOWN] if record.receipt is not None else ""


# --------------------------------------------------------------------------------------------
# Reading what the operator typed


def json_object(value: str, *, what: str) -> JsonObject:
    """A JSON object the operator typed (an argument, or at ``agentctl chat``'s prompt).

    Raises:
        typer.BadParameter: not JSON, or not an object; the message names ``what``.
    """
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise typer.BadParameter(f"{what} is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(f"{what} must be a JSON object, like '{{\"approved\": true}}'")
    return parsed


# The operators of ``--remember-if``, two-character ones first so ``<=`` is not read as ``<``.
_CONDITION_OPS: tuple[tuple[str, GrantOp], ...] = (
    ("<=", "le"),
    (">=", "ge"),
    ("==", "eq"),
    ("^=", "prefix"),
    ("<", "lt"),
    (">", "gt"),
)
# A dotted path of plain keys: a typo such as "amount =<100" must fail here, not become a field
# named "amount =" that no input has (the workflow would refuse it, further from the cause).
_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
_NOT_JSON = object()
CONDITION_FORMS = "field<=n, field<n, field>=n, field>n, field==JSON, field^=prefix"


def grant_condition(text: str) -> GrantCondition:
    """One ``--remember-if`` condition: ``amount<=100``, ``payee^=NL``, ``currency=="EUR"``.

    A bound takes a JSON number, ``==`` a JSON scalar (so a string is quoted: the grant compares
    types strictly, and ``100`` would not match ``"100"``), ``^=`` the rest of the text as the
    prefix.

    Raises:
        typer.BadParameter: no operator, a field that is not a dotted path of keys, a bound that
            is not a number, an ``==`` value that is not a JSON scalar, an empty prefix.
    """
    where = f"--remember-if {text!r}"
    # The first operator in the text splits it (a prefix may hold "<=" itself); at one place
    # the two-character one wins, as _CONDITION_OPS lists them.
    found = [(text.find(symbol), n) for n, (symbol, _) in enumerate(_CONDITION_OPS)]
    first = min(((at, n) for at, n in found if at >= 0), default=None)
    if first is not None:
        at, n = first
        symbol, op = _CONDITION_OPS[n]
        field, raw = text[:at].strip(), text[at + len(symbol) :]
        if not _FIELD_PATH.fullmatch(field):
            raise typer.BadParameter(
                f"{where}: {field!r} is not a field path (keys joined by dots, like payee.country)"
            )
        if op == "prefix":
            if not raw:
                raise typer.BadParameter(f"{where}: the prefix is empty")
            return GrantCondition(field=field, op=op, value=raw)
        try:
            value: object = json.loads(raw)
        except ValueError:
            value = _NOT_JSON
        if op == "eq":
            finite = not isinstance(value, float) or math.isfinite(value)
            if not isinstance(value, str | int | float | bool | None) or not finite:
                raise typer.BadParameter(
                    f"{where}: the value after == is a JSON number, string, true, false or null "
                    f"(quote a string: 'field==\"text\"')"
                )
            return GrantCondition(field=field, op=op, value=value)
        # A boolean is an int to Python, never a bound to a grant (workflows.grants.holds).
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise typer.BadParameter(f"{where}: the bound after {symbol} is not a number")
        return GrantCondition(field=field, op=op, value=value)
    raise typer.BadParameter(f"{where}: no operator; use one of {CONDITION_FORMS}")


# ASCII digits, at most 12 of them: str.isdigit takes other scripts' digits, and int() refuses
# more than 4,300 digits with a ValueError that would not read as a usage error.
_DURATION = re.compile(r"([0-9]{1,12})([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Past this a window or an age reaches back before any conversation (and past what a datetime
# holds, which would raise OverflowError rather than say so).
_LONGEST = timedelta(days=100 * 366)


def duration(text: str, *, option: str = "--since") -> timedelta:
    """A duration such as ``90s``, ``30m``, ``24h``, ``7d``, ``2w`` or ``1h30m``.

    Raises:
        typer.BadParameter: anything else, or zero.
    """
    spelled = text.strip().lower()
    parts = _DURATION.findall(spelled)
    if not parts or "".join(n + u for n, u in parts) != spelled:
        raise typer.BadParameter(f"{option} {text!r} is not a duration, like 30m, 24h or 7d")
    seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise typer.BadParameter(f"{option} {text!r} is not a duration longer than zero")
    if seconds > _LONGEST.total_seconds():
        raise typer.BadParameter(f"{option} {text!r} is longer than {_LONGEST.days} days")
    return timedelta(seconds=seconds)


def instant(text: str, *, option: str) -> datetime:
    """An ISO 8601 instant with its UTC offset (``2026-12-31T18:00Z``).

    Raises:
        typer.BadParameter: not ISO 8601, or no offset.
    """
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{option} {text!r} is not an ISO 8601 time, like 2026-12-31T18:00:00Z"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise typer.BadParameter(f"{option} {text!r} has no UTC offset: add Z or +HH:MM")
    return at


def grant_until(text: str) -> datetime:
    """``--remember-until``: an ISO 8601 instant with its UTC offset (``2026-12-31T18:00Z``).

    Raises:
        typer.BadParameter: not ISO 8601, or no offset (whose time zone would it be?).
    """
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"--remember-until {text!r} is not an ISO 8601 time, like 2026-12-31T18:00:00Z"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise typer.BadParameter(
            f"--remember-until {text!r} has no UTC offset: add Z or +HH:MM, so it names one "
            "instant wherever agentctl runs"
        )
    return at


def print_grants(chat_id: str, grants: Sequence[Grant], *, closed: bool = False) -> None:
    """``agentctl grants``'s answer for a person: the grants in force and how to revoke one."""
    if not grants:
        note = " (the conversation is closed)" if closed else ""
        out.print(f"No grants in force on {safe(chat_id)}{note}.")
        return
    table = Table(
        title=visible(f"Grants in force on {chat_id}: {len(grants)}"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in ("ID", "TOOL", "WHEN", "UNTIL", "GRANTED BY", "USES"):
        no_wrap = column in ("ID", "TOOL")
        table.add_column(column, overflow="fold", no_wrap=no_wrap)
    for g in grants:
        by = ", ".join(visible(b) for b in g.granted_by) or "-"
        table.add_row(
            Text(visible(g.id)),
            Text(visible(g.tool), style="bold"),
            Text(visible(describe_match(g.match))),
            Text(_deadline(g.until) if g.until else "until revoked"),
            Text(f"{by} ({'verified' if g.verified else 'asserted'})"),
            Text(str(g.uses)),
        )
    out.print(table)
    out.print(
        f"Revoke with: agentctl revoke-grant {escape(shell_word(chat_id))} GRANT_ID [--reason TEXT]"
    )


def print_event(ev: TurnEvent, *, as_json: bool) -> None:
    """One event of ``agentctl events``: a JSON object per line, or one readable line."""
    if as_json:
        # One line each, flushed: a program reads them as they come.
        sys.stdout.write(ev.model_dump_json(exclude_none=True) + "\n")
        sys.stdout.flush()
        return
    head = f"[dim]{ev.offset:>6} t{ev.turn}[/] [bold]{ev.kind}[/]"
    if ev.kind == "text":
        out.print(head, Text(visible(ev.text or "", multiline=True)))
    elif ev.kind in ("tool_request", "interrupt"):
        body = ev.interrupt.input if ev.interrupt is not None else ev.input
        out.print(f"{head} {safe(ev.name or '')} ref {safe(ev.ref or '')} {escape(_compact(body))}")
    elif ev.kind == "answer" and ev.answer is not None:
        who = ev.answer.identity or "unknown"
        out.print(
            f"{head} {safe(ev.name or '')} ref {safe(ev.ref or '')}: {ev.answer.kind} by "
            f"{safe(who)} via {ev.answer.via}"
        )
    elif ev.kind == "tool_response":
        body = ev.output if ev.error is None else {"error": ev.error.model_dump()}
        out.print(f"{head} {safe(ev.name or '')} ref {safe(ev.ref or '')} {escape(_compact(body))}")
    elif ev.kind == "turn_end" and ev.result is not None:
        out.print(f"{head} {ev.result.finish_reason.value}")
    else:
        out.print(head)


def _seconds(value: float | None) -> str:
    return "-" if value is None else _age(timedelta(seconds=value))


def print_stats(report: StatsOutput, *, limit: int) -> None:
    """``agentctl stats``' answer for a person: one row per agent and tool."""
    scope = f" of agent {report.agent}" if report.agent else ""
    start, end = (
        t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (report.since, report.until)
    )
    span = f"{start} to {end} UTC"
    if not report.tools:
        out.print(safe(f"No pending or decided calls{scope} from {span}."))
    else:
        table = Table(title=visible(f"Decisions{scope} from {span}"), box=box.SIMPLE)
        for column in ("agent", "tool", "pending", "oldest"):
            table.add_column(column)
        for column in ("approved", "denied", "answered", "edited", "defaulted", "expired"):
            table.add_column(column, justify="right")
        table.add_column("cancelled", justify="right")
        for column in ("median", "p90", "max"):
            table.add_column(column, justify="right")
        now = datetime.now(UTC)
        for row in report.tools:
            times = row.decision_seconds
            table.add_row(
                safe(row.agent),
                safe(row.tool),
                str(row.pending),
                _age(now - row.oldest_since) if row.oldest_since else "-",
                *(
                    str(n)
                    for n in (
                        row.approved,
                        row.denied,
                        row.answered,
                        row.edited,
                        row.defaulted,
                        row.expired,
                        row.cancelled,
                    )
                ),
                _seconds(times.median),
                _seconds(times.p90),
                _seconds(times.max),
            )
        out.print(table)
        out.print("median, p90, max: time to decision of the approvals, denials, answers, edits")
    if report.paused_cut:
        out.print(f"Cut: more than {limit} paused chats; pending counts the first {limit}.")
    if report.trails_cut:
        out.print(
            f"Cut: more than {limit} chats ran in the window; decisions are those of "
            f"{report.trails_read} (raise --limit)."
        )
    for chat_id, why in report.unreadable.items():
        err.print(safe(f"{chat_id}: audit trail not read: {why}"))

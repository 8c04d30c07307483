"""``agentctl``: find paused conversations and answer them from a terminal.

``pending`` reads Temporal's visibility store only (the search attributes and the memo the
workflow keeps), so it works while no worker runs. Everything else asks the conversation itself,
through queries and the validated ``resume``/``cancel`` updates, and therefore needs a worker:
``--wait`` bounds how long one may take to answer.

Exit codes (stable; the README documents them):

- 0: done;
- 1: refused: the conversation rejected the answer, message or cancellation, or the ref is not
  pending; the reason is printed;
- 2: usage error (a bad option or argument, or a bad setting such as an unknown namespace or an
  address that is not HOST:PORT), no such conversation, or it is closed;
- 3: no worker answered within ``--wait``;
- 4: Temporal could not be reached, did not answer within 10 s, or failed the request;
- 5: an internal error: a bug in agentctl, or a conversation that failed to answer a query (its
  workflow task is failing: see its history);
- 130: interrupted (Ctrl-C).

Every error is one line on stderr, never a traceback; click's own usage errors included.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Prompt
from rich.table import Table
from rich.text import Text
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from client.api import (
    DEFAULT_TASK_QUEUE,
    AgentClient,
    AgentError,
    Chat,
    ConnectionConfigError,
    NoWorkerAnswered,
    ResumeRejected,
    SendRejected,
    ServerNotAnswering,
    approve,
    connect_config,
    deny,
    exit_now,
)
from workflows.config import AGENT_NAME, INTERRUPTED_SINCE
from workflows.details import shell_word, visible
from workflows.types import (
    AgentStatus,
    FinishReason,
    InterruptRequest,
    JsonObject,
    Rejection,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnResult,
)


class ExitCode(IntEnum):
    OK = 0
    REFUSED = 1
    USAGE = 2
    NO_WORKER = 3
    UNREACHABLE = 4
    # Not a refusal: a bug here, or a conversation that cannot answer (its query failed).
    INTERNAL = 5
    INTERRUPTED = 130


DEFAULT_WAIT = 30.0

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Fail(Exception):
    """Ends the command with a message on stderr and a documented exit code."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------------------------
# ``--json`` output: stable schemas, documented in the README. Evolve by adding fields.


class MemoInterrupt(BaseModel):
    """One pending interrupt as the workflow's memo records it (visibility, no worker)."""

    name: str
    ref: str
    input: str = ""
    """The tool's input as JSON text, truncated to 200 characters by the workflow."""


class PausedConversation(BaseModel):
    chat_id: str
    agent: str | None = None
    waiting_since: datetime | None = None
    interrupts: list[MemoInterrupt] = []


class PendingOutput(BaseModel):
    conversations: list[PausedConversation] = []


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


class ResumeOutput(BaseModel):
    chat_id: str
    identity: str
    respond: list[ToolResponse] = []
    restart: list[ToolRestart] = []
    turn: TurnResult


class CancelOutput(BaseModel):
    chat_id: str
    identity: str
    reason: str
    turn: TurnResult


def _print_json(model: BaseModel) -> None:
    # Plain text, not rich: the output is for programs, and must not wrap or carry styles.
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Options shared by several commands.


@dataclass(frozen=True)
class Settings:
    address: str | None
    namespace: str | None
    profile: str | None
    task_queue: str


WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0.1,
        help="Seconds a worker may take to answer a query or accept an answer.",
    ),
]
IdentityOption = Annotated[
    str | None,
    typer.Option(
        "--identity",
        envvar="AGENTCTL_IDENTITY",
        help="Who answers, recorded in the conversation's audit log. [default: $USER@hostname]",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (schema in the README).")]
ChatIdArg = Annotated[
    str, typer.Argument(metavar="CHAT_ID", help="The conversation's chat id (its workflow id).")
]
RefArg = Annotated[
    str, typer.Argument(metavar="REF", help="The ref of the pending interrupt to answer.")
]

app = typer.Typer(
    name="agentctl",
    help=(
        "Find agent conversations paused on a human and answer them. Connection settings come "
        "from temporalio.envconfig (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS, "
        "profiles); the options below override them."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(
    ctx: typer.Context,
    address: Annotated[
        str | None, typer.Option(help="Temporal address, host:port. [env: TEMPORAL_ADDRESS]")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="Temporal namespace. [env: TEMPORAL_NAMESPACE]")
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="envconfig profile. [env: TEMPORAL_PROFILE]")
    ] = None,
    task_queue: Annotated[
        str,
        typer.Option(envvar="AGENT_TASK_QUEUE", help="Task queue for new conversations (chat)."),
    ] = DEFAULT_TASK_QUEUE,
) -> None:
    ctx.obj = Settings(address=address, namespace=namespace, profile=profile, task_queue=task_queue)


def _default_identity() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER variable and no passwd entry (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _run(ctx: typer.Context, command: Callable[[AgentClient], Coroutine[Any, Any, None]]) -> None:
    """Connect, run one command, and turn its failure into a message and an exit code."""
    settings: Settings = ctx.obj

    async def main() -> None:
        agents = await _connect(settings)
        try:
            await command(agents)
        except RPCError as e:
            # A Temporal error no command sorted for itself (the server went away mid-command,
            # a permission it refused): not the conversation's verdict, so not "refused".
            raise _Fail(ExitCode.UNREACHABLE, f"Temporal error: {e.message}") from None

    try:
        asyncio.run(main())
    except _Fail as f:
        _error_line(f.message)
        raise typer.Exit(int(f.code)) from None


def _error_line(message: str) -> None:
    err.print(f"[bold red]agentctl:[/] {_show(message)}")


async def _connect(settings: Settings) -> AgentClient:
    try:
        config = connect_config(
            settings.address, namespace=settings.namespace, profile=settings.profile
        )
    except ConnectionConfigError as e:
        # Its messages name the setting at fault ("bad Temporal address 'localhost'
        # (--address ...): no port"), so they stand on their own.
        raise _Fail(ExitCode.USAGE, str(e)) from None
    except Exception as e:  # noqa: BLE001  # any bad profile or variable is reported the same way
        raise _Fail(ExitCode.USAGE, f"bad Temporal connection settings: {e}") from None
    address = config["target_host"]
    try:
        agents = await AgentClient.connect(
            address,
            namespace=config.get("namespace"),
            profile=settings.profile,
            task_queue=settings.task_queue,
        )
    except ServerNotAnswering as e:
        # Something took the connection and never spoke: without a bound the SDK waits 30 s
        # and then reports a raw "Timeout expired" from its first call.
        raise _Fail(
            ExitCode.UNREACHABLE,
            f"cannot reach Temporal at {address}: something accepts connections there but did "
            f"not answer as Temporal within {e.waited.total_seconds():g}s; check --address or "
            "TEMPORAL_ADDRESS, or whether the server is hung",
        ) from None
    except ConnectionConfigError as e:
        # The SDK refuses an address it cannot parse before any connection: a bad setting,
        # unlike a host that does not answer. connect_config catches the common ones first.
        raise _Fail(ExitCode.USAGE, str(e)) from None
    except RuntimeError as e:
        raise _Fail(ExitCode.UNREACHABLE, f"cannot reach Temporal at {address}: {e}") from None
    await _check_namespace(agents, address)
    return agents


async def _check_namespace(agents: AgentClient, address: str) -> None:
    """An unknown namespace is a bad setting (exit 2) whatever the command.

    Left to each command it surfaced as a visibility failure, a missing conversation, or (for
    ``chat``) a new conversation that could not start. Only NOT_FOUND decides: a credential
    that may not describe namespaces still gets to run the command it may run.
    """
    namespace = agents.temporal.namespace
    try:
        await agents.temporal.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _unknown_namespace(namespace, address) from None


def _unknown_namespace(namespace: str, address: str | None = None) -> _Fail:
    where = f" on Temporal at {address}" if address else ""
    return _Fail(
        ExitCode.USAGE,
        f"namespace {namespace!r} does not exist{where} (--namespace or TEMPORAL_NAMESPACE)",
    )


def _wait(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


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


def _show(text: str) -> str:
    """One line of untrusted text for rich markup: controls visible, markup escaped."""
    return escape(visible(text))


_KIND = {
    "interrupt": "interrupt-only tool",
    "approval": "approval gate",
    "tool": "raised by the tool",
}


def _interrupt_panel(interrupt: InterruptRequest, *, chat_id: str | None = None) -> Panel:
    """One pending interrupt, everything an operator needs to decide; long values fold."""
    body = Table.grid(padding=(0, 2))
    body.add_column(style="dim", no_wrap=True)
    body.add_column(overflow="fold")
    body.add_row("ref", Text(visible(interrupt.ref)))
    body.add_row("kind", Text(_KIND.get(interrupt.source, interrupt.source)))
    body.add_row("input", Text(_compact(interrupt.input, None)))
    if interrupt.metadata:
        body.add_row("metadata", Text(_compact(interrupt.metadata, None)))
    if interrupt.since:
        body.add_row("waiting", Text(f"since {_when(interrupt.since)}"))
    if interrupt.deadline:
        body.add_row(
            "deadline", Text(f"{interrupt.deadline.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
        )
    if chat_id is not None:
        chat, ref = shell_word(chat_id), shell_word(interrupt.ref)
        body.add_row(
            "answer",
            Text(f"agentctl approve {chat} {ref}\nagentctl deny {chat} {ref} --reason TEXT"),
        )
    return Panel(
        body,
        title=Text.assemble("paused on ", (visible(interrupt.name), "bold")),
        title_align="left",
        expand=False,
    )


def _paused_view(found: list[PausedConversation], *, title: str) -> RenderableType:
    """``pending``'s table; a list instead when the terminal is too narrow for one."""
    now = datetime.now(UTC)
    # Chat ids and refs are what the operator copies into the next command, so they never wrap
    # (rich's table leaves no-wrap columns alone while it can shrink the others).
    keep = [
        max(len(visible(c.chat_id)) for c in found),
        max((len(visible(i.name)) for c in found for i in c.interrupts), default=1),
        max((len(visible(i.ref)) for c in found for i in c.interrupts), default=1),
    ]
    # Padding and rule (3 a column) plus room for AGENT, WAITING SINCE and INPUT to wrap in.
    if sum(keep) + 3 * 6 + 8 + 12 + 18 <= out.width:
        table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("CHAT ID", "AGENT", "INTERRUPT", "REF", "WAITING SINCE", "INPUT"):
            no_wrap = column in ("CHAT ID", "INTERRUPT", "REF")
            table.add_column(column, overflow="fold", no_wrap=no_wrap)
        for c in found:
            rows = c.interrupts or [MemoInterrupt(name="?", ref="?")]
            for n, i in enumerate(rows):
                first = n == 0
                since = "-"
                if c.waiting_since is not None:
                    at = c.waiting_since.astimezone(UTC)
                    since = f"{at:%Y-%m-%d}\n{at:%H:%M:%S} UTC\n({_age(now - at)} ago)"
                table.add_row(
                    Text(visible(c.chat_id) if first else ""),
                    Text(visible(c.agent or "?") if first else ""),
                    Text(visible(i.name), style="bold"),
                    Text(visible(i.ref)),
                    Text(since if first else ""),
                    Text(visible(i.input)),
                    end_section=n == len(rows) - 1,
                )
        return table
    lines = [Text(title, style="italic"), Text()]
    for c in found:
        # Two lines: a generated chat id (`chat-<uuid>`, 41 characters) with the agent and the
        # waiting time on one line overflowed an 80-column terminal.
        lines.append(Text.assemble((visible(c.chat_id), "bold"), f" · {visible(c.agent or '?')}"))
        lines.append(Text(f"  waiting since {_when(c.waiting_since, now=now)}"))
        for i in c.interrupts:
            lines.append(Text.assemble("  ", (visible(i.name), "bold"), f"  ref {visible(i.ref)}"))
            lines.append(Text(f"    input {visible(i.input)}"))
        lines.append(Text())
    return Group(*lines)


def _print_turn(res: TurnResult) -> None:
    reason = res.finish_reason
    if reason == FinishReason.INTERRUPTED:
        out.print(
            f"turn {res.turn} is [bold yellow]paused[/] on {len(res.interrupts)} interrupt(s):"
        )
        for interrupt in res.interrupts:
            out.print(_interrupt_panel(interrupt))
        return
    style = {FinishReason.STOP: "green", FinishReason.FAILED: "red"}.get(reason, "yellow")
    out.print(f"turn {res.turn} ended: [bold {style}]{reason.value}[/]")
    if res.error:
        out.print(f"error: {_show(res.error.status)}: {_show(res.error.message)}")
    # A cancelled turn's text is what the model said before the pause ("I need your
    # approval..."): printed after "ended: cancelled" it would read as the agent's answer.
    if res.text and reason != FinishReason.CANCELLED:
        out.print(Text.assemble(("agent> ", "bold cyan"), visible(res.text, multiline=True)))


def _answer_words(answer: ToolResponse | ToolRestart) -> str:
    if isinstance(answer, ToolResponse):
        return f"respond {_compact(answer.output, None)}"
    return f"restart with metadata {_compact(answer.resumed_metadata, None)}"


# --------------------------------------------------------------------------------------------
# Talking to one conversation


async def _describe(agents: AgentClient, chat_id: str) -> WorkflowExecutionDescription:
    try:
        return await agents.temporal.get_workflow_handle(chat_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND and "namespace" in e.message.lower():
            raise _unknown_namespace(agents.temporal.namespace) from None
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _Fail(
                ExitCode.USAGE,
                f"no conversation with id {chat_id!r} in namespace {agents.temporal.namespace!r}",
            ) from None
        raise _Fail(ExitCode.UNREACHABLE, f"Temporal error: {e.message}") from None


async def _open(
    agents: AgentClient, chat_id: str, *, running: bool
) -> tuple[Chat, WorkflowExecutionDescription]:
    """The conversation and what Temporal knows about it without asking a worker."""
    desc = await _describe(agents, chat_id)
    ended = _closed_as(desc)
    if running and ended is not None:
        raise _Fail(
            ExitCode.USAGE,
            f"conversation {chat_id!r} is closed ({ended}): there is nothing to answer",
        )
    agent = desc.typed_search_attributes.get(AGENT_NAME) or ""
    return await agents.chat(agent, chat_id=chat_id), desc


def _closed_as(desc: WorkflowExecutionDescription) -> str | None:
    """How the conversation's workflow ended ("terminated", "timed out"); None while it runs."""
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return None
    return desc.status.name.lower().replace("_", " ") if desc.status else "closed"


def _no_worker(
    e: NoWorkerAnswered,
    task_queue: str,
    chat_id: str,
    *,
    answering: bool,
    closed_as: str | None = None,
) -> _Fail:
    """``answering``: an answering command (respond, restart, approve, deny, cancel), which
    asks the conversation (a query) before it sends, so a query that no worker took means
    nothing was sent. Others say nothing about sending: ``show`` sends nothing, and ``chat``
    may have sent earlier messages of the session."""
    # ``waited`` is the --wait given; zero only where Temporal gave up on a request agentctl
    # did not bound (the result of an update a worker had already accepted).
    within = (
        f"within {round(e.waited.total_seconds(), 1):g}s"
        if e.waited
        else "before Temporal stopped waiting"
    )
    message = (
        f"no worker answered {within} on task queue {task_queue!r}; is `python -m worker` running?"
    )
    if closed_as is not None:
        # Reading a closed conversation replays it on a worker; saying it is closed needs none.
        message = (
            f"conversation {chat_id!r} is closed ({closed_as}) and has nothing pending; its last "
            f"state is read by replaying it on a worker, and {message}"
        )
    if e.queued:
        message += (
            " Temporal keeps the request and a worker that picks the conversation up later will "
            f"still apply it: check with `agentctl show {chat_id}` before answering again."
        )
    else:
        # Answering commands look the ref up (a query) before they send: that is what failed.
        message += (" Nothing was sent." if answering else "") + (
            " (`agentctl pending` works without a worker.)"
        )
    return _Fail(ExitCode.NO_WORKER, message)


async def _ask(
    chat: Chat,
    desc: WorkflowExecutionDescription,
    call: Callable[[], Awaitable[Any]],
    *,
    answering: bool,
) -> Any:
    """Run one query or update, mapping its failures to exit codes.

    ``answering``: the command answers or cancels (see :func:`_no_worker`).
    """
    try:
        return await call()
    except NoWorkerAnswered as e:
        raise _no_worker(
            e, desc.task_queue, chat.id, answering=answering, closed_as=_closed_as(desc)
        ) from None
    except AgentError as e:
        raise _failure(e) from None


def _failure(e: AgentError) -> _Fail:
    """The exit code for what the API raised, as the README's table has it."""
    if isinstance(e, ConnectionConfigError):
        return _Fail(ExitCode.USAGE, str(e))
    if isinstance(e.__cause__, RPCError):
        # A Temporal error the API put in words: the conversation closed or went away since
        # agentctl looked it up (what up front is a usage error), or Temporal failed us.
        if isinstance(e, SendRejected) or e.__cause__.status == RPCStatusCode.NOT_FOUND:
            return _Fail(ExitCode.USAGE, str(e))
        return _Fail(ExitCode.UNREACHABLE, str(e))
    if isinstance(e, ResumeRejected | SendRejected):
        return _Fail(ExitCode.REFUSED, f"rejected: {e}")
    if isinstance(e.__cause__, WorkflowQueryFailedError):
        # The conversation could not answer (its code raised, or its workflow task is failing):
        # nothing was refused, and a script must not read it as a rejected answer.
        return _Fail(ExitCode.INTERNAL, str(e))
    return _Fail(ExitCode.REFUSED, str(e))


def _not_pending(chat_id: str, ref: str, pending: list[InterruptRequest]) -> _Fail:
    if not pending:
        return _Fail(
            ExitCode.REFUSED,
            f"rejected: conversation {chat_id!r} has no pending interrupts (ref {ref!r} was "
            "already answered or withdrawn, or the turn moved on)",
        )
    listing = ", ".join(f"{i.name} (ref {i.ref})" for i in pending)
    return _Fail(
        ExitCode.REFUSED,
        f"rejected: ref {ref!r} is not pending on {chat_id!r} (already answered, withdrawn, or "
        f"never asked). Pending now: {listing}",
    )


def _answer(
    ctx: typer.Context,
    chat_id: str,
    ref: str,
    build: Callable[[InterruptRequest], ToolResponse | ToolRestart],
    *,
    identity: str | None,
    wait: float,
    as_json: bool,
) -> None:
    """Every answering command: find REF among the pending interrupts, send one resume."""
    who = identity or _default_identity()

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=True)
        pending: list[InterruptRequest] = await _ask(
            chat, desc, lambda: chat.pending(worker_timeout=_wait(wait)), answering=True
        )
        interrupt = next((i for i in pending if i.ref == ref), None)
        if interrupt is None:
            raise _not_pending(chat_id, ref, pending)
        answer = build(interrupt)
        respond = [answer] if isinstance(answer, ToolResponse) else []
        restart = [answer] if isinstance(answer, ToolRestart) else []
        res: TurnResult = await _ask(
            chat,
            desc,
            lambda: chat.resume(
                respond=respond, restart=restart, identity=who, worker_timeout=_wait(wait)
            ),
            answering=True,
        )
        if as_json:
            _print_json(
                ResumeOutput(
                    chat_id=chat_id, identity=who, respond=respond, restart=restart, turn=res
                )
            )
            return
        out.print(
            f"answered [bold]{_show(interrupt.name)}[/] (ref {_show(ref)}) with "
            f"{escape(_answer_words(answer))} as {_show(who)}"
        )
        _print_turn(res)
        again = next((i for i in res.interrupts if i.ref == ref), None)
        if res.finish_reason == FinishReason.INTERRUPTED and again is not None:
            # Printed as it is, "answered ... turn N is paused" reads as a success.
            out.print(_paused_again(chat_id, again))

    _run(ctx, command)


def _paused_again(chat_id: str, interrupt: InterruptRequest) -> Text:
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
    else:
        why = (
            "an interrupt-only tool has nothing to run, so a restart only asks again; answer "
            f"it with {approve_it}, or with agentctl deny or respond"
        )
    return Text(f"the call paused again on the same ref: {why}", style="bold yellow")


def _json_object(value: str, *, what: str) -> JsonObject:
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise typer.BadParameter(f"{what} is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(f"{what} must be a JSON object, like '{{\"approved\": true}}'")
    return parsed


# --------------------------------------------------------------------------------------------
# Commands


@app.command()
def pending(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option(help="Only this agent's conversations.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every paused conversation in the namespace: chat id, agent, interrupts, waiting since.

    Reads Temporal's visibility store only (search attributes and memo): no worker needed.
    """
    if agent is not None and ('"' in agent or "\\" in agent):
        raise typer.BadParameter("agent names cannot contain quotes or backslashes")

    async def command(agents: AgentClient) -> None:
        query = 'AgentStatus="interrupted" AND ExecutionStatus="Running"'
        if agent:
            query += f' AND AgentName="{agent}"'
        found: list[PausedConversation] = []
        try:
            async for wf in agents.temporal.list_workflows(query):
                memo = await wf.memo()
                interrupts = []
                for item in memo.get("pending") or []:
                    try:
                        interrupts.append(MemoInterrupt.model_validate(item))
                    except ValidationError:
                        continue  # a memo written by some other program: show what we can
                found.append(
                    PausedConversation(
                        chat_id=wf.id,
                        agent=wf.typed_search_attributes.get(AGENT_NAME),
                        waiting_since=wf.typed_search_attributes.get(INTERRUPTED_SINCE),
                        interrupts=interrupts,
                    )
                )
        except RPCError as e:
            raise _Fail(ExitCode.UNREACHABLE, f"visibility query failed: {e.message}") from None
        # Oldest first: whoever has waited longest is the first to look at.
        far = datetime.max.replace(tzinfo=UTC)
        found.sort(key=lambda c: (c.waiting_since or far, c.chat_id))
        if as_json:
            _print_json(PendingOutput(conversations=found))
            return
        scope = f" for agent {agent}" if agent else ""
        if not found:
            out.print(f"No paused conversations{_show(scope)}.")
            return
        title = visible(f"Paused conversations{scope}: {len(found)}")
        out.print(_paused_view(found, title=title))
        out.print("Answer with: agentctl approve|deny CHAT_ID REF, or agentctl show CHAT_ID")

    _run(ctx, command)


@app.command()
def show(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    as_json: JsonFlag = False,
    wait: WaitOption = DEFAULT_WAIT,
) -> None:
    """A conversation's status, pending interrupts, last turn and recent rejections."""

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=False)
        status: StatusResult = await _ask(
            chat, desc, lambda: chat.status(worker_timeout=_wait(wait)), answering=False
        )
        rejections: list[Rejection] = await _ask(
            chat, desc, lambda: chat.rejections(worker_timeout=_wait(wait)), answering=False
        )
        view = ShowOutput(
            chat_id=status.chat_id,
            agent=status.agent,
            status=status.status,
            turns=status.turns,
            model=status.model,
            pending=status.pending,
            last_turn=status.last_turn,
            rejections_total=status.rejections,
            recent_rejections=rejections,
        )
        if as_json:
            _print_json(view)
            return
        closed = view.status == "closed"
        # How it closed, when Temporal says (describe came first; it may have closed since).
        ended = _closed_as(desc) if closed else None
        out.print(
            f"[bold]{_show(view.chat_id)}[/] · agent [bold]{_show(view.agent)}[/] · "
            f"status [bold]{view.status}[/]"
            + (f" ({ended})" if ended else "")
            + f" · turns {view.turns}"
            + (f" · model {_show(view.model)}" if view.model else "")
            + f" · task queue {_show(desc.task_queue)}"
        )
        if view.pending:
            for interrupt in view.pending:
                out.print(_interrupt_panel(interrupt, chat_id=view.chat_id))
            out.print(
                "Or answer with respond/restart; withdraw every pending interrupt with "
                f"agentctl cancel {escape(shell_word(view.chat_id))}"
            )
        lt = view.last_turn
        if lt is not None and lt.finish_reason != FinishReason.INTERRUPTED:
            out.print(f"Last turn {lt.turn}: [bold]{lt.finish_reason.value}[/]")
            if lt.error:
                out.print(f"  error: {_show(lt.error.status)}: {_show(lt.error.message)}")
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
        if rejections:
            table = Table(
                title=f"Recent rejected answers ({view.rejections_total} in all)",
                title_justify="left",
            )
            for column in ("AT", "VIA", "HANDLER", "IDENTITY"):
                table.add_column(column, no_wrap=True)
            table.add_column("REASON", overflow="fold")
            for r in rejections[-10:]:
                table.add_row(
                    f"{r.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                    r.via,
                    Text(visible(r.handler)),
                    Text(visible(r.identity or "-")),
                    Text(visible(r.reason)),
                )
            out.print(table)

    _run(ctx, command)


@app.command()
def respond(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    output: Annotated[
        str, typer.Argument(metavar="JSON", help="The tool's output, a JSON object.")
    ],
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Answer one interrupt with the tool's output (the tool does not run)."""
    value = _json_object(output, what="the output")
    _answer(
        ctx,
        chat_id,
        ref,
        lambda i: i.respond(value),
        identity=identity,
        wait=wait,
        as_json=as_json,
    )


@app.command()
def restart(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    metadata: Annotated[
        str,
        typer.Option(
            help="Resume metadata the tool sees, a JSON object; a gated tool needs "
            "'{\"tool_approved\": true}'."
        ),
    ] = "{}",
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Re-run the interrupted tool with its original input and resume metadata.

    A tool gated by ToolApproval (kind "approval gate") runs only with
    --metadata '{"tool_approved": true}' (agentctl approve sends that); without it the call
    pauses again on the same ref.
    """
    value = _json_object(metadata, what="--metadata")
    _answer(
        ctx,
        chat_id,
        ref,
        lambda i: i.restart(value),
        identity=identity,
        wait=wait,
        as_json=as_json,
    )


@app.command(name="approve")
def approve_command(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Approve an interrupt, in the form its tool needs.

    An interrupt-only tool gets respond {"approved": true}; a gated or conditional tool is
    restarted with resume metadata {"tool_approved": true}, so it runs with its original input.
    """
    _answer(ctx, chat_id, ref, approve, identity=identity, wait=wait, as_json=as_json)


@app.command(name="deny")
def deny_command(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    reason: Annotated[str, typer.Option(help="Why, for the model and the audit log.")] = "",
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Deny: the tool does not run, and the model is told it was declined."""
    _answer(
        ctx,
        chat_id,
        ref,
        lambda i: deny(i, reason),
        identity=identity,
        wait=wait,
        as_json=as_json,
    )


@app.command()
def cancel(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    reason: Annotated[str, typer.Option(help="Why, for the model and the audit log.")] = "",
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Withdraw every pending interrupt (or stop the running turn): the turn ends cancelled."""
    who = identity or _default_identity()

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=True)
        # A query first: when no worker runs it fails without leaving a queued update behind.
        await _ask(chat, desc, lambda: chat.status(worker_timeout=_wait(wait)), answering=True)
        res: TurnResult = await _ask(
            chat,
            desc,
            lambda: chat.cancel(reason, identity=who, worker_timeout=_wait(wait)),
            answering=True,
        )
        if as_json:
            _print_json(CancelOutput(chat_id=chat_id, identity=who, reason=reason, turn=res))
            return
        out.print(f"cancelled turn {res.turn} of {_show(chat_id)} as {_show(who)}")
        _print_turn(res)

    _run(ctx, command)


@app.command()
def chat(
    ctx: typer.Context,
    agent: Annotated[
        str, typer.Argument(metavar="AGENT", help="The agent to talk to, e.g. bankingAgent.")
    ],
    chat_id: Annotated[
        str | None,
        typer.Option("--id", help="Continue this conversation (or create it with this id)."),
    ] = None,
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
) -> None:
    """Talk to an agent; when a turn pauses, answer each interrupt here. Ctrl-D leaves."""
    who = identity or _default_identity()

    async def command(agents: AgentClient) -> None:
        conversation = await agents.chat(agent, chat_id=chat_id)
        session = _ChatSession(
            conversation, task_queue=agents.task_queue, identity=who, wait=_wait(wait)
        )
        await session.run()

    _run(ctx, command)


class _ChatSession:
    """The interactive loop of ``agentctl chat``."""

    def __init__(self, chat: Chat, *, task_queue: str, identity: str, wait: timedelta) -> None:
        self.chat = chat
        self.task_queue = task_queue
        self.identity = identity
        self.wait = wait

    async def run(self) -> None:
        try:
            # Before the banner: a closed conversation or a missing worker is an error on its
            # own, and an existing conversation's banner names the queue it really runs on.
            paused = await self._attach()
            out.print(
                f"Chat [bold]{_show(self.chat.id)}[/] with [bold]{_show(self.chat.agent)}[/] "
                f"(task queue {_show(self.task_queue)}). Type a message; Ctrl-D leaves."
            )
            if paused is not None:
                await self._settle(paused)
            while True:
                try:
                    line = out.input("[bold]you>[/] ")
                except EOFError:
                    out.print()
                    return
                if not line.strip():
                    continue
                try:
                    res = await self.chat.send(line, worker_timeout=self.wait)
                except SendRejected as e:
                    out.print(f"[red]refused:[/] {_show(str(e))}")
                    continue
                await self._settle(res)
        except _Left:
            return
        except NoWorkerAnswered as e:
            raise _no_worker(e, self.task_queue, self.chat.id, answering=False) from None
        except AgentError as e:
            raise _failure(e) from None

    async def _attach(self) -> TurnResult | None:
        """The conversation's pause to answer first, if it exists and is paused."""
        try:
            desc = await self.chat.handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None  # a new conversation: the first message creates it
            raise
        ended = _closed_as(desc)
        if ended is not None:
            raise _Fail(ExitCode.USAGE, f"conversation {self.chat.id!r} is closed ({ended})")
        # An existing conversation runs on the queue it was started on.
        self.task_queue = desc.task_queue
        status = await self.chat.status(worker_timeout=self.wait)
        if not status.pending:
            return None
        last = status.last_turn
        return TurnResult(
            turn=last.turn if last else status.turns,
            finish_reason=FinishReason.INTERRUPTED,
            text=last.text if last else "",
            interrupts=status.pending,
        )

    async def _settle(self, res: TurnResult) -> None:
        """Show the turn; while it is paused, ask the human about each interrupt."""
        shown = ""
        while True:
            # A turn's text is its latest model message: after a resume that pauses again it may
            # be the same message as before, already shown.
            if res.text and res.text != shown:
                said = visible(res.text, multiline=True)
                out.print(Text.assemble(("agent> ", "bold cyan"), said))
                shown = res.text
            if res.finish_reason != FinishReason.INTERRUPTED:
                if res.finish_reason != FinishReason.STOP:
                    out.print(f"(turn {res.turn} ended: {res.finish_reason.value})")
                if res.error:
                    out.print(f"[red]{_show(res.error.status)}:[/] {_show(res.error.message)}")
                return
            answers: list[ToolResponse | ToolRestart] = []
            cancelled = False
            for interrupt in res.interrupts:
                answer = self._decide(interrupt)
                if answer is None:
                    cancelled = True
                    break
                answers.append(answer)
            try:
                if cancelled:
                    res = await self.chat.cancel(
                        "cancelled in agentctl chat",
                        identity=self.identity,
                        worker_timeout=self.wait,
                    )
                else:
                    res = await self.chat.resume(
                        answers=answers, identity=self.identity, worker_timeout=self.wait
                    )
            except ResumeRejected as e:
                out.print(f"[red]rejected:[/] {_show(str(e))}")
                pending = await self.chat.pending(worker_timeout=self.wait)
                if not pending:
                    return
                res = res.model_copy(update={"interrupts": pending})

    def _decide(self, interrupt: InterruptRequest) -> ToolResponse | ToolRestart | None:
        """One interrupt's answer from the human; ``None`` cancels the turn."""
        out.print(_interrupt_panel(interrupt))
        try:
            while True:
                choice = Prompt.ask(
                    Text(
                        "a = approve, d = deny, r = respond with JSON, s = restart, "
                        "c = cancel the turn"
                    ),
                    choices=["a", "d", "r", "s", "c"],
                    console=out,
                )
                if choice == "a":
                    return approve(interrupt)
                if choice == "d":
                    try:
                        reason = out.input("reason (optional): ")
                    except EOFError:  # input piped without a reason line: deny without one
                        out.print()
                        reason = ""
                    return deny(interrupt, reason)
                if choice == "c":
                    return None
                what = "output" if choice == "r" else "resume metadata"
                raw = out.input(f"{what} (a JSON object): ")
                try:
                    value = _json_object(raw or "{}", what=what)
                except typer.BadParameter as e:
                    out.print(f"[red]{_show(str(e))}[/]")
                    continue
                return interrupt.respond(value) if choice == "r" else interrupt.restart(value)
        except EOFError:
            out.print()
            out.print(
                f"Left {_show(self.chat.id)} paused. Answer later with: agentctl approve|deny "
                f"{escape(shell_word(self.chat.id))} {escape(shell_word(interrupt.ref))}"
            )
            raise _Left from None


class _Left(Exception):
    """The human pressed Ctrl-D at an interrupt: leave the conversation paused."""


def main() -> NoReturn:
    """The ``agentctl`` console script."""
    args = sys.argv[1:]
    code: int = 0
    try:
        # Not standalone: click's own usage errors come back here, to be one line like ours
        # instead of a usage block and a boxed message.
        result = app(args=args, prog_name="agentctl", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except typer.TyperException as e:
        code = e.exit_code
        # `agentctl` alone has already printed its help (typer tells this case by name too).
        if type(e).__name__ != "NoArgsIsHelpError":
            _error_line(e.format_message() + _help_hint(e))
    except typer.Abort:  # Ctrl-C at one of click's prompts
        _error_line("aborted")
        code = ExitCode.INTERRUPTED
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001  # a bug: still one line, never a traceback
        _error_line(f"internal error: {type(e).__name__}: {e}")
        code = ExitCode.INTERNAL
    # Skip interpreter teardown, where the Temporal SDK can abort (sdk-python issue 300) and
    # turn a documented exit code into 134.
    exit_now(code)


def _help_hint(e: typer.TyperException) -> str:
    context: typer.Context | None = getattr(e, "ctx", None)  # click's usage errors carry one
    return f" (see {context.command_path} --help)" if context is not None else ""


__all__ = ["ExitCode", "app", "main"]

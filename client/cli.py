"""``agentctl``: find paused conversations and answer them from a terminal.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

``pending`` reads Temporal's visibility store only (the search attributes and the memo the
workflow keeps), so it works while no worker runs. Everything else asks the conversation itself,
through queries and the validated ``resume``/``cancel`` updates, and therefore needs a worker:
``--wait`` bounds how long one may take to answer.

Exit codes (stable; the README documents them):

- 0: done;
- 1: refused: the conversation rejected the answer, message or cancellation, or the ref is not
  pending; the reason is printed;
- 2: usage error (a bad option or argument, or a bad setting such as an unknown namespace, an
  address that is not HOST:PORT, or ``AGENT_PAYLOAD_KEYS`` unusable or lacking the key a
  conversation was encrypted with, or an agent name no worker on the task queue hosts), no such
  conversation, or it is closed;
- 3: no worker answered within ``--wait``;
- 4: Temporal could not be reached, did not answer within 10 s, or failed the request;
- 5: an internal error: a bug in agentctl, or a conversation that failed to answer a query (its
  workflow task is failing: see its history);
- 130: interrupted (Ctrl-C).

Every error is one line on stderr, never a traceback; click's own usage errors included.

This module holds the commands and the exit codes; what they print (rich views and the
``--json`` schemas) is in ``client.views``, and ``agentctl chat``'s interactive loop in
``client.chat_loop``.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.client.api import (
    DEFAULT_TASK_QUEUE,
    AgentClient,
    AgentError,
    Chat,
    ConnectionConfigError,
    EventsGone,
    NoWorkerAnswered,
    ResumeRejected,
    SendRejected,
    ServerNotAnswering,
    approve,
    connect_config,
    deny,
    exit_now,
    run_to_exit,
)
from temporal_agent_interrupts.client.audit import AuditReport
from temporal_agent_interrupts.client.chat_loop import ChatClosed, ChatSession
from temporal_agent_interrupts.client.inbox import PausedChat, check_agent_name
from temporal_agent_interrupts.client.receipts import export_chain, verify_chain
from temporal_agent_interrupts.client.stats import DEFAULT_LIMIT, read_stats
from temporal_agent_interrupts.client.views import (
    AuditOutput,
    CancelOutput,
    ExportOutput,
    GrantsOutput,
    PendingOutput,
    PolicyReviewOutput,
    PolicyReviewsOutput,
    ResumeOutput,
    RevokeGrantOutput,
    ShowOutput,
    StatsOutput,
    VerifyOutput,
    answer_words,
    closed_as,
    duration,
    err,
    grant_condition,
    grant_until,
    instant,
    json_object,
    out,
    paused_again,
    print_audit,
    print_event,
    print_export,
    print_grants,
    print_json,
    print_paused,
    print_stats,
    print_status,
    print_turn,
    print_verified,
    safe,
    who,
)
from temporal_agent_interrupts.errors import ChatNotFound, GrantRejected, UnknownAgent
from temporal_agent_interrupts.search_attributes import (
    SearchAttributesRefused,
    setup_search_attributes,
)
from temporal_agent_interrupts.workflows.config import AGENT_NAME
from temporal_agent_interrupts.workflows.details import shell_word
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    FinishReason,
    Grant,
    GrantScope,
    InterruptRequest,
    PolicyReviewResult,
    ReceiptChain,
    Rejection,
    StatusResult,
    ToolResponse,
    ToolRestart,
    TurnResult,
)

CHAIN_FORMAT = ReceiptChain.model_fields["format"].default
"""What a chain file says it is (``agentctl verify`` refuses, exit 2, a file that does not)."""


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


class _Fail(Exception):
    """Ends the command with a message on stderr and a documented exit code."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--identity-token-file",
        envvar="AGENTCTL_IDENTITY_TOKEN_FILE",
        help="A file holding an identity token (a JWT from the agent's trusted issuer), for an "
        "agent that verifies who answers; the identity on record is then the token's. Each "
        "token answers once per conversation. Never printed.",
        show_default=False,
        dir_okay=False,
    ),
]
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print JSON (schema: docs/reference/agentctl.md).")
]
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


def _asserted(ctx: typer.Context, identity: str | None, *, token: bool) -> str | None:
    """The identity an answer asserts. With an identity token it is the token's: only an
    ``--identity`` given on the command line goes along (and must match it), not
    ``AGENTCTL_IDENTITY`` or the default, which are for answering without one."""
    if not token:
        return identity or _default_identity()
    source = ctx.get_parameter_source("identity")
    if source is not None and source.name == "ENVIRONMENT":
        return None
    return identity


def read_token_file(path: Path) -> str:
    """The identity token in ``path``, whitespace stripped.

    Raises:
        typer.BadParameter: the file is missing, unreadable, not text, or empty. The message
            names the file, never what is in it.
    """
    where = f"the identity token file {str(path)!r} (--identity-token-file)"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise typer.BadParameter(f"{where} does not exist") from None
    except IsADirectoryError:
        raise typer.BadParameter(f"{where} is a directory") from None
    except UnicodeDecodeError:
        raise typer.BadParameter(f"{where} is not UTF-8 text") from None
    except OSError as e:
        raise typer.BadParameter(f"{where} cannot be read: {e.strerror}") from None
    if not token:
        raise typer.BadParameter(f"{where} is empty")
    return token


def _run(ctx: typer.Context, command: Callable[[AgentClient], Coroutine[Any, Any, None]]) -> None:
    """Connect, run one command, and turn its failure into a message and an exit code."""
    settings: Settings = ctx.obj

    async def main() -> None:
        agents = await _connect(settings)
        try:
            await command(agents)
        except ConnectionConfigError as e:
            # A payload encrypted with a key AGENT_PAYLOAD_KEYS does not list (the message names
            # the key id), met wherever the command read it: a setting to fix.
            raise _Fail(ExitCode.USAGE, str(e)) from None
        except RPCError as e:
            # A Temporal error no command sorted for itself (the server went away mid-command,
            # a permission it refused): not the conversation's verdict, so not "refused".
            raise _Fail(ExitCode.UNREACHABLE, f"Temporal error: {e.message}") from None

    try:
        run_to_exit(main())  # the process ends in exit_now (see main)
    except _Fail as f:
        _error_line(f.message)
        raise typer.Exit(int(f.code)) from None


def _error_line(message: str) -> None:
    err.print(f"[bold red]agentctl:[/] {safe(message)}")


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
    ended = closed_as(desc)
    if running and ended is not None:
        raise _Fail(
            ExitCode.USAGE,
            f"conversation {chat_id!r} is closed ({ended}): there is nothing to answer",
        )
    agent = desc.typed_search_attributes.get(AGENT_NAME) or ""
    return await agents.chat(agent, chat_id=chat_id), desc


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
        f"no worker answered {within} on task queue {task_queue!r}; is `agent-worker` running?"
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
            e, desc.task_queue, chat.id, answering=answering, closed_as=closed_as(desc)
        ) from None
    except AgentError as e:
        raise _failure(e) from None


def _failure(e: AgentError) -> _Fail:
    """The exit code for what the API raised, as docs/reference/agentctl.md's table has it."""
    if isinstance(e, ConnectionConfigError | ChatNotFound | UnknownAgent):
        # A bad setting, a chat id that names nothing, an agent name no worker hosts: each is
        # what the command was given, so a usage error (exit 2), as the exit-code table of
        # docs/reference/agentctl.md says.
        return _Fail(ExitCode.USAGE, str(e))
    if isinstance(e.__cause__, RPCError):
        # A Temporal error the API put in words: the conversation closed or went away since
        # agentctl looked it up (what up front is a usage error), or Temporal failed us.
        if isinstance(e, SendRejected) or e.__cause__.status == RPCStatusCode.NOT_FOUND:
            return _Fail(ExitCode.USAGE, str(e))
        return _Fail(ExitCode.UNREACHABLE, str(e))
    if isinstance(e, ResumeRejected | SendRejected | GrantRejected):
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
    token_file: Path | None,
    wait: float,
    as_json: bool,
) -> None:
    """Every answering command: find REF among the pending interrupts, send one resume.

    With ``token_file`` the answer carries its identity token, and the identity on record is
    the token's (``--identity``, when given too, must be the same).
    """
    token = read_token_file(token_file) if token_file is not None else None
    asserted = _asserted(ctx, identity, token=token is not None)

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
                respond=respond,
                restart=restart,
                identity=asserted,
                identity_token=token,
                worker_timeout=_wait(wait),
            ),
            answering=True,
        )
        recorded = asserted
        if token is not None:
            # The token names who answered; the conversation's record says whom it named.
            recorded = await _recorded_identity(chat, ref, wait=wait)
        if as_json:
            print_json(
                ResumeOutput(
                    chat_id=chat_id,
                    identity=recorded,
                    identity_verified=token is not None,
                    respond=respond,
                    restart=restart,
                    turn=res,
                )
            )
            return
        by = who(recorded, token is not None) if recorded else "the identity token's holder"
        out.print(
            f"answered [bold]{safe(interrupt.name)}[/] (ref {safe(ref)}) with "
            f"{escape(answer_words(answer))} as {escape(by)}"
        )
        print_turn(res)
        if isinstance(answer, ToolRestart) and answer.remember is not None:
            out.print(f"grants in force: agentctl grants {escape(shell_word(chat_id))}")
        again = next((i for i in res.interrupts if i.ref == ref), None)
        if res.finish_reason == FinishReason.INTERRUPTED and again is not None:
            # Printed as it is, "answered ... turn N is paused" reads as a success.
            out.print(paused_again(chat_id, again))

    _run(ctx, command)


async def _recorded_identity(chat: Chat, ref: str, *, wait: float) -> str | None:
    """Who the newest answer to ``ref`` is on record from (None when it cannot be read)."""
    try:
        status = await chat.status(worker_timeout=_wait(wait))
    except AgentError:
        return None  # the answer was applied; only the read-back failed
    mine: list[AnswerRecord] = [a for a in status.recent_answers if a.ref == ref]
    return mine[-1].identity if mine else None


# --------------------------------------------------------------------------------------------
# Commands


@app.command()
def pending(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option(help="Only this agent's conversations.")] = None,
    approver: Annotated[
        str | None,
        typer.Option(
            metavar="ID",
            help="Only the interrupts ID may answer and has not voted on yet (open to anyone, "
            "or listing ID; a group:NAME approver only as --approver group:NAME).",
        ),
    ] = None,
    waiting_over: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="Only conversations paused at least DURATION ago (30m, 24h, 7d...).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every paused conversation in the namespace: chat id, agent, interrupts, who may answer,
    deadlines, waiting since.

    Reads Temporal's visibility store only (search attributes and memo): no worker needed.
    """
    if agent is not None:
        try:
            check_agent_name(agent)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    over = duration(waiting_over, option="--waiting-over") if waiting_over is not None else None

    async def command(agents: AgentClient) -> None:
        try:
            found: list[PausedChat] = await agents.pending(
                agent=agent, approver=approver, waiting_over=over
            )
        except RPCError as e:
            raise _Fail(ExitCode.UNREACHABLE, f"visibility query failed: {e.message}") from None
        if as_json:
            print_json(PendingOutput(conversations=found))
            return
        print_paused(found, agent=agent, approver=approver, task_queue=agents.task_queue)

    _run(ctx, command)


@app.command()
def audit(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    as_json: JsonFlag = False,
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            metavar="FILE",
            help="Write the conversation's decision receipts (and its sub-agents') to FILE as "
            "a chain `agentctl verify` checks, instead of printing the trail.",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Every answer a conversation applied, oldest first, across all its runs: when, which
    call, what was decided, by whom (verified by a token, or asserted) and by which path.

    Reads the histories of the conversation's runs: no worker needed.
    """

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=False)
        report: AuditReport = await _ask(
            chat,
            desc,
            lambda: agents.audit_report(chat_id),
            answering=False,
        )
        if export is not None:
            _export(chat_id, report, export, as_json=as_json)
            return
        if as_json:
            print_json(
                AuditOutput(
                    chat_id=chat_id,
                    answers=report.records,
                    untrusted=report.untrusted,
                    gone=report.gone,
                )
            )
            return
        print_audit(chat_id, report.records, untrusted=report.untrusted, gone=report.gone)

    _run(ctx, command)


def _export(chat_id: str, report: AuditReport, path: Path, *, as_json: bool) -> None:
    """Write the trail's receipts to ``path`` as a chain file, and say what it holds."""
    chain = export_chain(chat_id, report.records)
    every = [*chain.receipts, *(r for rs in chain.children.values() for r in rs)]
    try:
        path.write_text(chain.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise _Fail(
            ExitCode.USAGE, f"cannot write {str(path)!r} (--export): {e.strerror or e}"
        ) from None
    summary = ExportOutput(
        chat_id=chat_id,
        file=str(path),
        receipts=len(every),
        chats=1 + len(chain.children),
        key_ids=chain.key_ids,
        unsigned=sum(1 for r in every if r.signature is None),
        skipped=sum(1 for r in report.records if r.receipt is None),
    )
    if as_json:
        print_json(summary)
        return
    print_export(summary)


@app.command()
def verify(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE", help="A chain file `agentctl audit --export` wrote.", dir_okay=False
        ),
    ],
    keys: Annotated[
        Path,
        typer.Option(
            "--keys",
            metavar="JWKS_FILE",
            help="The workers' public keys, a JWK Set (agent-worker --print-receipt-jwks, or "
            "the web app's /.well-known/agent-receipt-keys.json).",
            dir_okay=False,
        ),
    ],
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Take a chain whose oldest receipts are not in the file (an export made "
            "after retention ended the oldest runs) from its first receipt on, and say where "
            "it starts. Without it, a chain must start at seq 0.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Check an exported chain of decision receipts against the workers' public keys, with no
    server and no Temporal connection. Exit 0 when every receipt holds; 1 naming the first
    broken link (a changed byte, a receipt removed, two swapped, an unknown key); 2 when a file
    cannot be read."""
    try:
        chain = _read_json(file, what="FILE")
        if not isinstance(chain, dict) or chain.get("format") != CHAIN_FORMAT:
            raise _Fail(
                ExitCode.USAGE,
                f"{str(file)!r} is not a receipt chain (`agentctl audit CHAT --export FILE` "
                "writes one)",
            )
        jwks = _read_json(keys, what="--keys")
        if not isinstance(jwks, dict):
            raise _Fail(ExitCode.USAGE, f"{str(keys)!r} (--keys) is not a JWK Set")
        try:
            check = verify_chain(chain, jwks, partial=partial)
        except ValueError as e:
            raise _Fail(ExitCode.USAGE, f"{str(keys)!r} (--keys): {e}") from None
    except _Fail as f:
        _error_line(f.message)
        raise typer.Exit(int(f.code)) from None
    if check.ok and check.checked == 0:
        check = check.model_copy(
            update={"ok": False, "where": "the file", "why": "it holds no receipts"}
        )
    chat = chain.get("chat_id")
    result = VerifyOutput(
        file=str(file),
        ok=check.ok,
        chat_id=chat if isinstance(chat, str) else None,
        checked=check.checked,
        chats=check.chats,
        key_ids=check.key_ids,
        where=check.where,
        why=check.why,
        starts=check.starts,
    )
    if as_json:
        print_json(result)
    elif result.ok:
        print_verified(result)
    else:
        _error_line(f"broken at {result.where}: {result.why}")
    if not result.ok:
        raise typer.Exit(int(ExitCode.REFUSED))


VERIFY_FILE_LIMIT = 256 * 1024 * 1024
"""The most bytes ``agentctl verify`` reads of a file (a receipt is under 2 KiB as exported):
past it, the file is refused rather than read until memory runs out (``/dev/zero``)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of a file ``agentctl verify`` reads, refused when a member is named twice:
    json keeps the last, which another reader (or a person) may not."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"a duplicate member {key[:64]!r} in an object")
        found[key] = value
    return found


def _read_json(path: Path, *, what: str) -> Any:
    """The JSON in ``path``; a file that is missing, unreadable, past
    :data:`VERIFY_FILE_LIMIT`, or not JSON (an object naming a member twice included) is a
    usage error naming it (and never showing what is in it)."""
    where = f"{str(path)!r} ({what})"
    try:
        with path.open("rb") as f:
            raw = f.read(VERIFY_FILE_LIMIT + 1)
        if len(raw) > VERIFY_FILE_LIMIT:
            raise _Fail(ExitCode.USAGE, f"{where} is larger than {VERIFY_FILE_LIMIT} bytes")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise _Fail(ExitCode.USAGE, f"{where} does not exist") from None
    except IsADirectoryError:
        raise _Fail(ExitCode.USAGE, f"{where} is a directory") from None
    except UnicodeDecodeError:
        raise _Fail(ExitCode.USAGE, f"{where} is not UTF-8 text") from None
    except OSError as e:
        raise _Fail(ExitCode.USAGE, f"{where} cannot be read: {e.strerror or e}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, and an integer too long
        raise _Fail(ExitCode.USAGE, f"{where} is not JSON: {e}") from None


@app.command()
def stats(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="The window is the last DURATION (30m, 24h, 7d...); the default is 24h.",
        ),
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from", metavar="TIME", help="The window starts at TIME (ISO 8601, with offset)."
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(metavar="TIME", help="The window ends at TIME (default: now)."),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's conversations.")] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=1,
            help="Read at most this many chats (paused ones, and ones run in the window); "
            "the output says when more matched.",
        ),
    ] = DEFAULT_LIMIT,
    as_json: JsonFlag = False,
) -> None:
    """How long decisions take, per agent and tool: calls pending now, and the calls decided
    in the window (approved, denied, answered, edited, defaulted, expired, cancelled) with the
    time to decision (median, p90, max).

    Reads visibility and the chats' histories (their audit trails): no worker needed.
    """
    if since is not None and (from_ is not None or to is not None):
        raise typer.BadParameter("--since or --from/--to, not both")
    if agent is not None:
        try:
            check_agent_name(agent)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    now = datetime.now(UTC)
    until = instant(to, option="--to") if to is not None else now
    if from_ is not None:
        start = instant(from_, option="--from")
    else:
        start = until - duration(since or "24h")
    if start >= until:
        raise typer.BadParameter("the window ends before it starts")

    async def command(agents: AgentClient) -> None:
        try:
            report = await read_stats(agents, since=start, until=until, agent=agent, limit=limit)
        except RPCError as e:
            raise _Fail(ExitCode.UNREACHABLE, f"visibility query failed: {e.message}") from None
        output = StatsOutput(**report.model_dump(), since=start, until=until, agent=agent)
        if as_json:
            print_json(output)
            return
        print_stats(output, limit=limit)

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
            recent_answers=status.recent_answers,
        )
        if as_json:
            print_json(view)
            return
        closed = view.status == "closed"
        # How it closed, when Temporal says (describe came first; it may have closed since).
        ended = closed_as(desc) if closed else None
        print_status(view, ended=ended, task_queue=desc.task_queue, client_queue=agents.task_queue)

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
    identity_token_file: TokenFileOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Answer one interrupt with the tool's output (the tool does not run)."""
    value = json_object(output, what="the output")
    _answer(
        ctx,
        chat_id,
        ref,
        lambda i: i.respond(value),
        identity=identity,
        token_file=identity_token_file,
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
    edited_input: Annotated[
        str | None,
        typer.Option(
            "--input",
            metavar="JSON",
            help="Run the tool with this input instead of the model's, a JSON object: an edit, "
            "which only a tool declared editable accepts (the original stays on record).",
        ),
    ] = None,
    identity: IdentityOption = None,
    identity_token_file: TokenFileOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Re-run the interrupted tool with its original input (or, with --input, an edited one)
    and resume metadata.

    A tool gated by ToolApproval (kind "approval gate") runs only with
    --metadata '{"tool_approved": true}' (agentctl approve sends that); without it the call
    pauses again on the same ref (an edit then pauses at the gate showing the edited input).
    """
    value = json_object(metadata, what="--metadata")
    changed = json_object(edited_input, what="--input") if edited_input is not None else None
    _answer(
        ctx,
        chat_id,
        ref,
        lambda i: i.restart(value, input=changed),
        identity=identity,
        token_file=identity_token_file,
        wait=wait,
        as_json=as_json,
    )


@app.command(name="approve")
def approve_command(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    remember_tool: Annotated[
        bool,
        typer.Option(
            "--remember-tool",
            help="Also grant: every later call of this tool in this conversation runs without "
            "asking (until --remember-until, or agentctl revoke-grant).",
        ),
    ] = False,
    remember_if: Annotated[
        list[str] | None,
        typer.Option(
            "--remember-if",
            metavar="CONDITION",
            help="Also grant, for the calls of this tool whose input meets CONDITION (repeat "
            "for several, all must hold): field<=n, field<n, field>=n, field>n, "
            'field==JSON (a number, "quoted string", true, false, null), field^=prefix.',
            show_default=False,
        ),
    ] = None,
    remember_until: Annotated[
        str | None,
        typer.Option(
            "--remember-until",
            metavar="ISO8601",
            help="The grant ends at this instant (with its offset: 2026-12-31T18:00:00Z); "
            "without it, it lasts until revoked.",
            show_default=False,
        ),
    ] = None,
    identity: IdentityOption = None,
    identity_token_file: TokenFileOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Approve an interrupt, in the form its tool needs.

    An interrupt-only tool gets respond {"approved": true}; a gated or conditional tool is
    restarted with resume metadata {"tool_approved": true}, so it runs with its original input.
    Where a quorum is needed, this is one vote.

    With --remember-tool or --remember-if (a gated call only) the approval is also remembered:
    a grant that lets matching calls of the tool, pending now or later, run without asking.
    """
    scope = remember_scope(tool=remember_tool, conditions=remember_if or [], until=remember_until)

    def build(interrupt: InterruptRequest) -> ToolResponse | ToolRestart:
        try:
            return approve(interrupt, remember=scope)
        except ValueError as e:  # remember on an interrupt-only tool: its answer is one call's
            raise _Fail(ExitCode.REFUSED, f"rejected: {e}") from None

    _answer(
        ctx,
        chat_id,
        ref,
        build,
        identity=identity,
        token_file=identity_token_file,
        wait=wait,
        as_json=as_json,
    )


def remember_scope(*, tool: bool, conditions: list[str], until: str | None) -> GrantScope | None:
    """The grant ``approve``'s --remember options ask for (None: this call only).

    A grant is asked for explicitly, by --remember-tool (the whole tool) or --remember-if (a
    pattern), never implied by --remember-until alone: a script that mistyped its condition
    option must not grant the whole tool.

    Raises:
        typer.BadParameter: both --remember-tool and --remember-if, --remember-until alone, or
            a condition or time that does not parse.
    """
    if tool and conditions:
        raise typer.BadParameter(
            "--remember-tool grants every call of the tool and --remember-if only some: give one"
        )
    if not tool and not conditions:
        if until is not None:
            raise typer.BadParameter(
                "--remember-until needs --remember-tool or --remember-if (what is remembered)"
            )
        return None
    return GrantScope(
        match=[grant_condition(c) for c in conditions],
        until=grant_until(until) if until is not None else None,
    )


@app.command(name="deny")
def deny_command(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    ref: RefArg,
    reason: Annotated[str, typer.Option(help="Why, for the model and the audit log.")] = "",
    identity: IdentityOption = None,
    identity_token_file: TokenFileOption = None,
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
        token_file=identity_token_file,
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
            print_json(CancelOutput(chat_id=chat_id, identity=who, reason=reason, turn=res))
            return
        out.print(f"cancelled turn {res.turn} of {safe(chat_id)} as {safe(who)}")
        print_turn(res)

    _run(ctx, command)


@app.command()
def grants(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    as_json: JsonFlag = False,
    wait: WaitOption = DEFAULT_WAIT,
) -> None:
    """The grants in force on a conversation: remembered approvals that let matching calls of a
    tool run without asking (id, tool, conditions, until, granted by, uses)."""

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=False)
        held: list[Grant] = await _ask(
            chat, desc, lambda: chat.grants(worker_timeout=_wait(wait)), answering=False
        )
        if as_json:
            print_json(GrantsOutput(chat_id=chat_id, grants=held))
            return
        print_grants(chat_id, held, closed=closed_as(desc) is not None)

    _run(ctx, command)


@app.command(name="revoke-grant")
def revoke_grant(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    grant_id: Annotated[
        str, typer.Argument(metavar="GRANT_ID", help="The grant's id (agentctl grants lists them).")
    ],
    reason: Annotated[str, typer.Option(help="Why, for the audit log.")] = "",
    identity: IdentityOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """End a grant now: matching calls ask again. A call it let through that has not run yet
    pauses again (stale). Recorded in the audit log with --identity and --reason."""
    who = identity or _default_identity()

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=True)
        # A query first: when no worker runs it fails without leaving a queued update behind,
        # and it says what is being revoked.
        before: list[Grant] = await _ask(
            chat, desc, lambda: chat.grants(worker_timeout=_wait(wait)), answering=True
        )
        revoked = next((g for g in before if g.id == grant_id), None)
        remaining: list[Grant] = await _ask(
            chat,
            desc,
            lambda: chat.revoke_grant(
                grant_id, reason=reason, identity=who, worker_timeout=_wait(wait)
            ),
            answering=True,
        )
        if as_json:
            print_json(
                RevokeGrantOutput(
                    chat_id=chat_id,
                    revoked=revoked,
                    identity=who,
                    reason=reason,
                    grants=remaining,
                )
            )
            return
        what = f" ({safe(revoked.tool)})" if revoked is not None else ""
        out.print(f"revoked grant {safe(grant_id)}{what} on {safe(chat_id)} as {safe(who)}")
        print_grants(chat_id, remaining)

    _run(ctx, command)


@app.command(name="review-policy")
def review_policy(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """Decide the calls paused on the agent's policy set again, with the set the worker holds
    now (after a deploy that changed it): allowed ones run, denied ones end refused, asks show
    their new approvers. The command names no policy: only the worker's set decides."""

    async def command(agents: AgentClient) -> None:
        chat, desc = await _open(agents, chat_id, running=True)
        # A query first: when no worker runs it fails without leaving a queued update behind.
        await _ask(chat, desc, lambda: chat.status(worker_timeout=_wait(wait)), answering=True)
        review: PolicyReviewResult = await _ask(
            chat, desc, lambda: chat.review_policy(worker_timeout=_wait(wait)), answering=True
        )
        if as_json:
            print_json(
                PolicyReviewOutput(
                    chat_id=chat_id,
                    policy_hash=review.policy_hash,
                    changed={ref: str(effect) for ref, effect in review.changed.items()},
                )
            )
            return
        if not review.changed:
            out.print(f"{safe(chat_id)}: no paused call's decision changed")
            return
        for ref, effect in review.changed.items():
            out.print(f"{safe(ref)}: {safe(str(effect))}")

    _run(ctx, command)


@app.command(name="review-policies")
def review_policies(
    ctx: typer.Context,
    agent: Annotated[
        str,
        typer.Option(help="Review every paused conversation of this agent.", show_default=False),
    ],
    wait: WaitOption = DEFAULT_WAIT,
    as_json: JsonFlag = False,
) -> None:
    """After a deploy that changed an agent's policy set: agentctl review-policy for every
    paused conversation of the agent (found in visibility, as agentctl pending finds them).
    One that cannot be reviewed (no set, closed, no worker) is reported and the rest go on."""
    try:
        check_agent_name(agent)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None

    async def command(agents: AgentClient) -> None:
        try:
            found: list[PausedChat] = await agents.pending(agent=agent)
        except RPCError as e:
            raise _Fail(ExitCode.UNREACHABLE, f"visibility query failed: {e.message}") from None
        reviewed: list[PolicyReviewOutput] = []
        failed: dict[str, str] = {}
        for paused in found:
            chat = await agents.chat(paused.agent, chat_id=paused.chat_id)
            try:
                review = await chat.review_policy(worker_timeout=_wait(wait))
            except AgentError as e:
                failed[paused.chat_id] = str(e)[:300]
                continue
            reviewed.append(
                PolicyReviewOutput(
                    chat_id=paused.chat_id,
                    policy_hash=review.policy_hash,
                    changed={ref: str(effect) for ref, effect in review.changed.items()},
                )
            )
        if as_json:
            print_json(PolicyReviewsOutput(agent=agent, reviewed=reviewed, failed=failed))
        else:
            for r in reviewed:
                changes = ", ".join(f"{ref}: {e}" for ref, e in r.changed.items()) or "unchanged"
                out.print(f"{safe(r.chat_id)}: {safe(changes)}")
            for chat_id, why in failed.items():
                out.print(f"{safe(chat_id)}: not reviewed: {safe(why)}")
            out.print(f"{len(reviewed)} reviewed, {len(failed)} not")
        if failed:
            raise _Fail(ExitCode.REFUSED, f"{len(failed)} conversations were not reviewed")

    _run(ctx, command)


@app.command(name="setup-search-attributes")
def setup_search_attributes_command(ctx: typer.Context) -> None:
    """Register the search attributes conversations upsert on the namespace (once per
    namespace; no agents or worker needed)."""

    async def command(agents: AgentClient) -> None:
        try:
            added = await setup_search_attributes(agents.temporal)
        except SearchAttributesRefused as e:
            raise _Fail(ExitCode.USAGE, str(e)) from None
        namespace = safe(agents.temporal.namespace)
        if added:
            out.print(f"namespace {namespace}: registered {', '.join(added)}")
        else:
            out.print(f"namespace {namespace}: search attributes already present")

    _run(ctx, command)


@app.command()
def events(
    ctx: typer.Context,
    chat_id: ChatIdArg,
    after: Annotated[
        int | None,
        typer.Option(
            "--after",
            min=-1,
            help="Start after this offset (the last one you saw); default: all that is kept.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per event, one per line.")
    ] = False,
) -> None:
    """Follow a conversation's events as they happen: the model's text, tool requests,
    interrupts, answers, tool responses and each turn's end. Ends when the conversation closes
    (after the rest is printed); Ctrl-C stops following."""

    async def command(agents: AgentClient) -> None:
        chat, _ = await _open(agents, chat_id, running=False)
        try:
            async for ev in chat.events(after=after):
                print_event(ev, as_json=as_json)
        except EventsGone as e:
            raise _Fail(ExitCode.USAGE, str(e)) from None
        except AgentError as e:
            raise _failure(e) from None
        except RPCError as e:
            raise _Fail(
                ExitCode.UNREACHABLE, f"could not follow {chat_id!r}: {e.message}"
            ) from None

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
    identity_token_file: TokenFileOption = None,
    requester: Annotated[
        bool,
        typer.Option(
            "--requester",
            help="Each message says who sends it too (the identity, or a token read from "
            "--identity-token-file for each message), recorded as its turn's requester and "
            "shown to approvers. A tool that separates duties then refuses your own answers.",
        ),
    ] = False,
    wait: WaitOption = DEFAULT_WAIT,
) -> None:
    """Talk to an agent; when a turn pauses, answer each interrupt here. Ctrl-D leaves.

    With --identity-token-file each answer carries the token the file holds at that moment
    (a token answers once per conversation, so keep the file fresh).
    """
    token: Callable[[], str] | None = None
    if identity_token_file is not None:
        read_token_file(identity_token_file)  # a bad file is a usage error before anything
        token = partial(read_token_file, identity_token_file)

    asserted = _asserted(ctx, identity, token=token is not None)

    async def command(agents: AgentClient) -> None:
        conversation = await agents.chat(agent, chat_id=chat_id)
        session = ChatSession(
            conversation,
            task_queue=agents.task_queue,
            identity=asserted,
            wait=_wait(wait),
            token=token,
            requester=requester,
        )
        try:
            await session.run()
        except ChatClosed as e:
            raise _Fail(ExitCode.USAGE, str(e)) from None
        except NoWorkerAnswered as e:
            raise _no_worker(e, session.task_queue, conversation.id, answering=False) from None
        except AgentError as e:
            raise _failure(e) from None

    _run(ctx, command)


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

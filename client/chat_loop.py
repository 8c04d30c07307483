"""``agentctl chat``: talk to an agent, and answer each interrupt as the turn pauses on it.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Turns stream: the model's text is printed as it arrives, and an interrupt the moment it is
raised (see ``client/stream.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import typer
from rich.markup import escape
from rich.prompt import Prompt
from rich.text import Text
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.client.api import Chat, ResumeRejected, SendRejected, approve, deny
from temporal_agent_interrupts.client.stream import TurnStream
from temporal_agent_interrupts.client.views import (
    closed_as,
    interrupt_panel,
    json_object,
    out,
    safe,
)
from temporal_agent_interrupts.workflows.details import shell_word, visible
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    ToolResponse,
    ToolRestart,
    TurnResult,
)


class ChatClosed(Exception):
    """The conversation to attach to has ended: there is nothing to talk to."""


class ChatSession:
    """The interactive loop of ``agentctl chat``.

    ``run`` raises what the API raised (``NoWorkerAnswered``, ``AgentError``) and
    ``ChatClosed``; ``agentctl chat`` turns them into messages and exit codes.
    """

    def __init__(
        self,
        chat: Chat,
        *,
        task_queue: str,
        identity: str | None,
        wait: timedelta,
        token: Callable[[], str] | None = None,
        requester: bool = False,
    ) -> None:
        """
        Args:
            identity: Who answers, as asserted (None: the identity token's holder).
            token: Reads the identity token each answer carries (for an agent that verifies
                who answers); read again for every answer, since each token answers once.
            requester: Each message says who sends it too (``identity``, or a token read
                afresh for it), recorded as its turn's requester; off, messages name nobody.
        """
        self.chat = chat
        self.task_queue = task_queue
        self.identity = identity
        self.wait = wait
        self.token = token
        self.requester = requester

    async def run(self) -> None:
        try:
            # Before the banner: a closed conversation or a missing worker is an error on its
            # own, and an existing conversation's banner names the queue it really runs on.
            paused = await self._attach()
            out.print(
                f"Chat [bold]{safe(self.chat.id)}[/] with [bold]{safe(self.chat.agent)}[/] "
                f"(task queue {safe(self.task_queue)}). Type a message; Ctrl-D leaves."
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
                    res, streamed = await self._follow(
                        self.chat.send_stream(
                            line,
                            identity=self.identity if self.requester else None,
                            identity_token=(
                                self.token() if self.requester and self.token else None
                            ),
                            worker_timeout=self.wait,
                        )
                    )
                except SendRejected as e:
                    out.print(f"[red]refused:[/] {safe(str(e))}")
                    continue
                await self._settle(res, shown=res.text if streamed else "")
        except _Left:
            return

    async def _attach(self) -> TurnResult | None:
        """The conversation's pause to answer first, if it exists and is paused."""
        try:
            desc = await self.chat.handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None  # a new conversation: the first message creates it
            raise
        ended = closed_as(desc)
        if ended is not None:
            raise ChatClosed(f"conversation {self.chat.id!r} is closed ({ended})")
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

    async def _follow(self, turn: TurnStream) -> tuple[TurnResult, bool]:
        """Print a turn as it happens; its result, and whether its text was printed."""
        started = printed = False
        async for ev in turn:
            if ev.kind == "text" and ev.text:
                if not started:
                    out.print(Text("agent> ", style="bold cyan"), end="")
                out.print(Text(visible(ev.text, multiline=True)), end="")
                started = printed = True
            elif ev.kind == "interrupt":
                if started:
                    out.print()
                    started = False
                out.print(f"[yellow]paused:[/] {safe(ev.name or '')} (ref {safe(ev.ref or '')})")
        if started:
            out.print()
        return await turn.result(), printed

    async def _settle(self, res: TurnResult, *, shown: str = "") -> None:
        """Show the turn; while it is paused, ask the human about each interrupt."""
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
                    out.print(f"[red]{safe(res.error.status)}:[/] {safe(res.error.message)}")
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
                    res, streamed = await self._follow(
                        self.chat.resume_stream(
                            answers=answers,
                            identity=self.identity,
                            identity_token=self.token() if self.token is not None else None,
                            worker_timeout=self.wait,
                        )
                    )
                    if streamed:
                        shown = res.text
            except ResumeRejected as e:
                out.print(f"[red]rejected:[/] {safe(str(e))}")
                pending = await self.chat.pending(worker_timeout=self.wait)
                if not pending:
                    return
                res = res.model_copy(update={"interrupts": pending})

    def _decide(self, interrupt: InterruptRequest) -> ToolResponse | ToolRestart | None:
        """One interrupt's answer from the human; ``None`` cancels the turn."""
        out.print(interrupt_panel(interrupt))
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
                    value = json_object(raw or "{}", what=what)
                except typer.BadParameter as e:
                    out.print(f"[red]{safe(str(e))}[/]")
                    continue
                return interrupt.respond(value) if choice == "r" else interrupt.restart(value)
        except EOFError:
            out.print()
            out.print(
                f"Left {safe(self.chat.id)} paused. Answer later with: agentctl approve|deny "
                f"{escape(shell_word(self.chat.id))} {escape(shell_word(interrupt.ref))}"
            )
            raise _Left from None


class _Left(Exception):
    """The human pressed Ctrl-D at an interrupt: leave the conversation paused."""


__all__ = ["ChatClosed", "ChatSession"]

"""Every way an answer reaches a conversation, as the soak sends it, and what came back.

- ``update``: the Python API, ``Chat.resume`` (a workflow update);
- ``signal``: ``temporal workflow signal --name resume --input JSON``, the CLI from the venv;
- ``agentctl``: ``agentctl approve|deny|respond|restart|cancel``, the product's CLI;
- ``http``: the approvals API, ``POST /api/chats/{id}/interrupts/{ref}``;
- ``agui``: an AG-UI run with ``resume`` entries, ``POST /agui/{agent}``;

and two ways a message is sent: ``Chat.send`` and an AG-UI run with a user message.

Each call says what happened as an :class:`Outcome`: ``accepted`` (the conversation took it),
``refused`` (the conversation, or the front end on its behalf, said no, and why), ``sent`` (a
signal Temporal took: whether the conversation accepted it only the audit trail and the
rejection log tell), or ``unknown`` (a fault cut the call short: it may or may not have been
applied, which the checks settle from the audit trail).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

import httpx2
from pydantic import ValidationError

from bench.soak.agent import AGENT
from bench.soak.processes import ROOT, child_env
from temporal_agent_interrupts import AgentClient
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.errors import (
    AgentError,
    CancelRejected,
    ChatNotFound,
    ResumeRejected,
    SendRejected,
)
from temporal_agent_interrupts.worker.devserver import temporal_cli
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    JsonObject,
    ToolResponse,
    ToolRestart,
    TurnResult,
)

log = logging.getLogger("bench.soak")

Path_ = Literal["update", "signal", "agentctl", "http", "agui"]
PATHS: tuple[Path_, ...] = ("update", "signal", "agentctl", "http", "agui")
Status = Literal["accepted", "refused", "sent", "unknown"]

WORKER_WAIT = timedelta(seconds=60)
"""How long a worker may take to accept what a path sends (the product's default)."""
CLI_TIMEOUT = 150.0
"""Seconds a CLI run may take before it is killed (and its outcome is unknown)."""


@dataclass
class Outcome:
    status: Status
    result: TurnResult | None = None
    detail: str = ""


@dataclass(frozen=True)
class Answer:
    """What a human decided about one paused call, before a path turns it into a request."""

    action: Literal["approve", "deny", "respond", "edit"]
    output: JsonObject | None = None
    """``respond``: the tool's output."""
    input: JsonObject | None = None
    """``edit``: the tool's new input."""
    reason: str = ""
    """``deny``: why."""

    def build(self, request: InterruptRequest) -> ToolResponse | ToolRestart:
        """The answer as the Python API builds it from the request shown."""
        if self.action == "approve":
            return request.approve()
        if self.action == "deny":
            return request.deny(self.reason)
        if self.action == "respond":
            return request.respond(self.output or {})
        return request.restart({"tool_approved": True}, input=self.input)


@dataclass
class Paths:
    """The paths, bound to one soak run's server, task queue and web app."""

    agents: AgentClient
    address: str
    task_queue: str
    web: str
    """The web app's base URL."""
    http: httpx2.AsyncClient
    scratch: Path
    """Where payloads too long for a command line are written."""
    cli_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(6))
    agentctl_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))
    children: set[asyncio.subprocess.Process] = field(default_factory=set)

    def chat(self, chat_id: str) -> Chat:
        return Chat(self.agents, agent=AGENT, chat_id=chat_id)

    # -- sending a message ------------------------------------------------------------------

    async def send_python(self, chat_id: str, text: str, *, message_id: str) -> TurnResult:
        """``Chat.send``; raises the product's errors."""
        return await self.chat(chat_id).send(
            text, message_id=message_id, worker_timeout=WORKER_WAIT
        )

    async def send_agui(self, chat_id: str, text: str, *, run_id: str, message_id: str) -> Outcome:
        body = {
            "threadId": chat_id,
            "runId": run_id,
            "messages": [{"id": message_id, "role": "user", "content": text}],
        }
        return await self._agui(body, identity=None)

    # -- answering ----------------------------------------------------------------------------

    async def update(
        self,
        chat_id: str,
        answer: ToolResponse | ToolRestart,
        *,
        identity: str,
        metadata: JsonObject,
    ) -> Outcome:
        try:
            result = await self.chat(chat_id).resume(
                answers=[answer], identity=identity, metadata=metadata, worker_timeout=WORKER_WAIT
            )
        except ResumeRejected as e:
            return Outcome("refused", detail=str(e))
        except AgentError as e:
            return Outcome("unknown", detail=f"{type(e).__name__}: {e}")
        return Outcome("accepted", result)

    async def signal(self, chat_id: str, args: list[str], *, name: str = "resume") -> Outcome:
        """``temporal workflow signal`` with ``args`` (``--input``s, or what a hostile payload
        needs); ``sent`` once Temporal has it."""
        cmd = [
            temporal_cli(),
            "workflow",
            "signal",
            "--address",
            self.address,
            "--workflow-id",
            chat_id,
            "--name",
            name,
            *args,
        ]
        code, out = await self._run(cmd, slots=self.cli_slots)
        if code == 0:
            return Outcome("sent")
        if "not found" in out.lower() or "already completed" in out.lower():
            return Outcome("refused", detail=out.strip()[-300:])
        return Outcome("unknown", detail=f"exit {code}: {out.strip()[-300:]}")

    def signal_input(self, payload: JsonObject) -> list[str]:
        """The CLI arguments that send ``payload`` as the one JSON argument (through a file
        when it is too long for a command line)."""
        data = json.dumps(payload)
        if len(data) <= 64_000:
            return ["--input", data]
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.scratch, delete=False) as f:
            f.write(data)
        return ["--input-file", f.name]

    async def agentctl(self, args: list[str]) -> Outcome:
        """``agentctl ARGS --json``: 0 applied, 1 refused, 2 no such or closed chat, else the
        outcome is not known (no worker in time, Temporal unreachable)."""
        # The installed console script, as an operator runs it (the repository first on its
        # path, so it is this tree's code).
        cmd = [str(Path(sys.executable).parent / "agentctl"), *args, "--json"]
        code, out = await self._run(cmd, slots=self.agentctl_slots)
        if code == 0:
            try:
                turn = json.loads(out)["turn"]
                return Outcome("accepted", TurnResult.model_validate(turn))
            except (ValueError, KeyError, ValidationError):
                return Outcome("accepted", detail="no turn in the output")
        if code in (1, 2):
            return Outcome("refused", detail=out.strip()[-300:])
        return Outcome("unknown", detail=f"exit {code}: {out.strip()[-300:]}")

    async def approvals_api(
        self,
        chat_id: str,
        ref: str,
        body: JsonObject,
        *,
        identity: str,
    ) -> Outcome:
        url = f"{self.web}/api/chats/{chat_id}/interrupts/{ref}"
        try:
            response = await self.http.post(url, json=body, headers={"X-Agent-Identity": identity})
        except httpx2.HTTPError as e:
            return Outcome("unknown", detail=f"{type(e).__name__}: {e}")
        if response.status_code == 200:
            result = TurnResult.model_validate(response.json()["result"])
            return Outcome("accepted", result)
        detail = response.text[-300:]
        if 400 <= response.status_code < 500:
            return Outcome("refused", detail=f"{response.status_code} {detail}")
        return Outcome("unknown", detail=f"{response.status_code} {detail}")

    async def agui_resume(
        self, chat_id: str, entry: JsonObject, *, identity: str, run_id: str
    ) -> Outcome:
        body = {"threadId": chat_id, "runId": run_id, "messages": [], "resume": [entry]}
        return await self._agui(body, identity=identity)

    async def cancel(
        self, chat_id: str, *, identity: str, via: Literal["update", "agentctl"]
    ) -> Outcome:
        if via == "agentctl":
            return await self.agentctl(
                [
                    "cancel",
                    chat_id,
                    "--reason",
                    "soak: withdrawn",
                    "--identity",
                    identity,
                    "--wait",
                    str(WORKER_WAIT.total_seconds()),
                ]
            )
        try:
            result = await self.chat(chat_id).cancel(
                "soak: withdrawn", identity=identity, worker_timeout=WORKER_WAIT
            )
        except CancelRejected as e:
            return Outcome("refused", detail=str(e))
        except AgentError as e:
            return Outcome("unknown", detail=f"{type(e).__name__}: {e}")
        return Outcome("accepted", result)

    # -- plumbing -----------------------------------------------------------------------------

    async def _agui(self, body: JsonObject, *, identity: str | None) -> Outcome:
        """An AG-UI run: ``accepted`` once it started (RUN_STARTED), with the result its last
        frame says; ``refused`` when it ended in a RUN_ERROR before starting."""
        headers = {"content-type": "application/json"}
        if identity is not None:
            headers["X-Agent-Identity"] = identity
        url = f"{self.web}/agui/{AGENT}"
        events: list[JsonObject] = []
        try:
            async with self.http.stream(
                "POST", url, content=json.dumps(body), headers=headers
            ) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[-300:]
                    status: Status = "refused" if response.status_code < 500 else "unknown"
                    return Outcome(status, detail=f"{response.status_code} {text}")
                data: list[str] = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        data.append(line[6:])
                    elif line == "" and data:
                        events.append(json.loads("\n".join(data)))
                        data = []
        except httpx2.HTTPError as e:
            started = any(ev.get("type") == "RUN_STARTED" for ev in events)
            return Outcome("unknown", detail=f"{type(e).__name__} (started: {started}): {e}")
        started = any(ev.get("type") == "RUN_STARTED" for ev in events)
        last = events[-1] if events else {}
        if not started:
            code = str(last.get("code", ""))
            if last.get("type") == "RUN_ERROR" and code not in (
                "no_worker",
                "internal",
                "temporal",
            ):
                return Outcome("refused", detail=f"{code}: {last.get('message', '')}"[:300])
            return Outcome("unknown", detail=f"no RUN_STARTED: {last}"[:300])
        detail = str(last.get("type"))
        if last.get("type") == "RUN_ERROR":
            detail = f"RUN_ERROR after the start: {last.get('code')}: {last.get('message')}"[:300]
        return Outcome("accepted", agui_result(last), detail=detail)

    async def _run(self, cmd: list[str], *, slots: asyncio.Semaphore) -> tuple[int, str]:
        async with slots:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                cwd=ROOT,
                env=child_env(
                    TEMPORAL_ADDRESS=self.address,
                    AGENT_TASK_QUEUE=self.task_queue,
                    COLUMNS="200",
                    NO_COLOR="1",
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.children.add(proc)
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return -1, f"killed after {CLI_TIMEOUT:.0f}s"
            finally:
                self.children.discard(proc)
            return proc.returncode if proc.returncode is not None else -1, out.decode(
                errors="replace"
            )

    def kill_children(self) -> None:
        for proc in list(self.children):
            if proc.returncode is None:
                proc.kill()


def agui_result(last: JsonObject) -> TurnResult | None:
    """What a run's last frame says of the turn: paused (with its interrupts), ended or
    cancelled. None when it says nothing for sure, and the conversation is asked instead: a
    RUN_ERROR after the start is the run's error, which may be the stream's (its server went
    away) while the turn goes on; taken for a failed turn, it had the harness move on past a
    pause (tests/test_soak_findings.py, finding 4)."""
    if last.get("type") != "RUN_FINISHED":
        return None
    outcome = last.get("outcome") or {}
    if outcome.get("type") == "interrupt":
        return TurnResult(
            finish_reason=FinishReason.INTERRUPTED,
            interrupts=[agui_request(i) for i in outcome.get("interrupts", [])],
        )
    if outcome.get("type") == "cancelled":
        return TurnResult(finish_reason=FinishReason.CANCELLED)
    reason = (last.get("result") or {}).get("finishReason", "stop")
    return TurnResult(
        finish_reason=FinishReason(reason), text=(last.get("result") or {}).get("text", "")
    )


def agui_request(interrupt: JsonObject) -> InterruptRequest:
    """An AG-UI interrupt as the request the Python API would have shown."""
    meta = interrupt.get("metadata") or {}
    return InterruptRequest(
        name=meta.get("tool", ""),
        ref=interrupt["id"],
        input=meta.get("input") or {},
        source=meta.get("source", "interrupt"),
        editable=bool(meta.get("editable")),
        input_digest=meta.get("inputDigest", ""),
        approvers=meta.get("approvers") or [],
    )


def agui_entry(request: InterruptRequest, answer: Answer) -> JsonObject:
    """The AG-UI resume entry for ``answer`` to ``request`` (its input digest echoed)."""
    meta = {"inputDigest": request.input_digest}
    if answer.action == "respond":
        payload: JsonObject = answer.output or {}
    elif answer.action == "deny":
        payload = {"approved": False, "reason": answer.reason}
    elif answer.action == "edit":
        payload = {"approved": True, "input": answer.input}
    else:
        payload = {"approved": True}
    return {"interruptId": request.ref, "status": "resolved", "payload": payload, "metadata": meta}


def approvals_body(request: InterruptRequest, answer: Answer, *, answer_id: str) -> JsonObject:
    """The approvals API body for ``answer`` to ``request``."""
    body: JsonObject = {
        "action": answer.action,
        "input_digest": request.input_digest,
        "metadata": {"answer_id": answer_id},
    }
    if answer.action == "respond":
        body["output"] = answer.output
    elif answer.action == "edit":
        body["input"] = answer.input
    elif answer.action == "deny":
        body["reason"] = answer.reason
    return body


def agentctl_args(
    chat_id: str, request: InterruptRequest, answer: Answer, *, identity: str
) -> list[str]:
    """``agentctl`` arguments for ``answer`` to ``request``."""
    tail = ["--identity", identity, "--wait", str(WORKER_WAIT.total_seconds())]
    if answer.action == "approve":
        return ["approve", chat_id, request.ref, *tail]
    if answer.action == "deny":
        return ["deny", chat_id, request.ref, "--reason", answer.reason, *tail]
    if answer.action == "respond":
        return ["respond", chat_id, request.ref, json.dumps(answer.output), *tail]
    return [
        "restart",
        chat_id,
        request.ref,
        "--metadata",
        json.dumps({"tool_approved": True}),
        "--input",
        json.dumps(answer.input),
        *tail,
    ]


def signal_payload(
    request: InterruptRequest, answer: Answer, *, identity: str, answer_id: str
) -> JsonObject:
    """The ``resume`` signal's JSON for ``answer`` to ``request``, as a script writes it."""
    built = answer.build(request)
    kind = "respond" if isinstance(built, ToolResponse) else "restart"
    entry = built.model_dump(mode="json", exclude_none=True)
    return {kind: [entry], "identity": identity, "metadata": {"answer_id": answer_id}}


def outcome_of_chat_error(e: Exception) -> Status:
    """A send's error as an outcome: refused by the conversation, or not known."""
    if isinstance(e, SendRejected | ChatNotFound):
        return "refused"
    return "unknown"


__all__ = [
    "PATHS",
    "Answer",
    "Outcome",
    "Paths",
    "agentctl_args",
    "agui_entry",
    "approvals_body",
    "signal_payload",
]

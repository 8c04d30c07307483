"""The conversations: each one a few turns of a seeded plan, answered as people and scripts do.

A slot runs one conversation after another until the soak stops starting turns. A turn sends
one soak message (by ``Chat.send`` or an AG-UI run), and while it is paused the slot answers
the first pending call after a human's pause: approve, deny, edit or respond, or nothing (a
deadline expires), or a cancel; by one of the five paths, sometimes twice or three times at once
(by other paths, sometimes deciding otherwise), sometimes after answers that must be refused
(a wrong ref, a wrong name, a non-approver, a hostile signal) and followed by one (a second
answer). Every attempt is kept, with what came back, for the checks.

Faults make outcomes unknown: a call cut short may or may not have been applied. The slot
never guesses: it asks the conversation where it stands (``await_turn``), answers again where
the call is still pending, and leaves the reckoning of who got in to the audit trail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from temporalio.api.common.v1 import Payload as ApiPayload
from temporalio.common import RawValue
from temporalio.service import RPCError

from bench.soak.agent import APPROVERS, DEADLINE
from bench.soak.ledger import now
from bench.soak.paths import (
    Answer,
    Outcome,
    Path_,
    Paths,
    Status,
    agentctl_args,
    agui_entry,
    approvals_body,
    signal_payload,
)
from temporal_agent_interrupts.errors import (
    AgentError,
    ChatNotFound,
    SendRejected,
)
from temporal_agent_interrupts.workflows.limits import DOOR
from temporal_agent_interrupts.workflows.types import (
    FinishReason,
    InterruptRequest,
    JsonObject,
    TurnResult,
)
from tests.hostile import HostileGenerator, Payload, oversized

log = logging.getLogger("bench.soak")

T = TypeVar("T")

Expect = Literal["accept", "refuse", "either"]
Kind = Literal[
    "answer",
    "duplicate",
    "retry",
    "late",
    "final",
    "wrong_ref",
    "wrong_name",
    "non_approver",
    "second",
    "hostile",
    "cancel",
]
REFUSED_KINDS: frozenset[str] = frozenset(
    {"wrong_ref", "wrong_name", "non_approver", "second", "hostile"}
)
"""Attempts that must be refused, whatever else happens."""

SETTLE_FOR = 300.0
"""Seconds a slot waits, across faults, for a conversation to say where it stands."""


@dataclass
class Attempt:
    """One answer (or cancel) sent, and what came back."""

    id: int
    chat_id: str
    ref: str | None
    tool: str | None
    path: Path_
    kind: Kind
    action: str
    expect: Expect
    identity: str | None
    sent_at: float
    status: Status = "unknown"
    done_at: float = 0.0
    detail: str = ""
    edited: JsonObject | None = None
    via_sdk: bool = False
    """A hostile payload sent by the SDK's raw signal, which the CLI cannot send as it is."""
    result: TurnResult | None = field(default=None, repr=False)
    """What the path said of the turn (kept for the slot, not reported)."""

    @property
    def answer_id(self) -> str:
        return f"a{self.id}"


@dataclass
class Seen:
    """A call the conversation paused on, as the slot saw it."""

    name: str
    source: str
    turn: int
    at: float
    input: JsonObject


@dataclass
class TurnRecord:
    number: int
    plan: str
    via: str
    started: float
    ended: float = 0.0
    finish: str = ""


@dataclass
class Conversation:
    chat_id: str
    slot: int
    started: float
    sends: int = 0
    """Messages the conversation accepted: the turns it must have."""
    labels: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    seen: dict[str, Seen] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    closed_at: float = 0.0
    finished: bool = False
    closed: bool = False
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pace:
    """How people behave, in seconds and shares."""

    think: float
    """The mean pause before an answer (a person reading what to approve)."""
    between: float
    """The mean pause between a conversation's turns."""
    turns: tuple[int, int] = (3, 6)
    agentctl_share: float = 0.08
    """Of the answers, those sent with agentctl (a process each: the costliest path)."""


PLANS = (
    ("transfer", 25),
    ("refund", 20),
    ("confirm", 15),
    ("quick", 12),
    ("multi", 18),
    ("say", 10),
)


class Driver:
    """Runs the slots; holds every conversation for the checks."""

    def __init__(
        self,
        paths: Paths,
        *,
        seed: int,
        pace: Pace,
        stopping: asyncio.Event,
    ) -> None:
        self.paths = paths
        self.seed = seed
        self.pace = pace
        self.stopping = stopping
        self.conversations: list[Conversation] = []
        self.active: set[str] = set()
        self._ids = 0

    # -- slots --------------------------------------------------------------------------------

    async def slot(self, number: int, *, delay: float) -> None:
        rng = random.Random(f"{self.seed}-slot-{number}")
        if await self._wait(delay):
            return
        k = 0
        while not self.stopping.is_set():
            conv = Conversation(
                chat_id=f"soak-{self.seed}-{number}-{k}", slot=number, started=now()
            )
            self.conversations.append(conv)
            self.active.add(conv.chat_id)
            try:
                await self.converse(conv, rng)
                conv.finished = True
            except asyncio.CancelledError:
                conv.problems.append("cancelled before it finished (the harness was stopped)")
                raise
            except Exception as e:
                log.exception("conversation %s failed in the harness", conv.chat_id)
                conv.problems.append(f"harness error: {type(e).__name__}: {e}")
            finally:
                self.active.discard(conv.chat_id)
            k += 1

    async def converse(self, conv: Conversation, rng: random.Random) -> None:
        turns = rng.randint(*self.pace.turns)
        for t in range(turns):
            if self.stopping.is_set() and t > 0:
                break  # stop starting turns
            await self.turn(conv, rng)
            if t < turns - 1:
                await self._wait(rng.uniform(0.2, 2 * self.pace.between))
        await self.close(conv)

    # -- one turn ------------------------------------------------------------------------------

    async def turn(self, conv: Conversation, rng: random.Random) -> None:
        plan = rng.choices([p for p, _ in PLANS], weights=[w for _, w in PLANS])[0]
        conv.labels += 1
        label = conv.labels
        command = _command(plan, rng, label)
        text = f"soak chat={conv.chat_id} turn={label}: {command}"
        via = "agui" if rng.random() < 0.2 else "python"
        record = TurnRecord(number=label, plan=plan, via=via, started=now())
        conv.turns.append(record)
        result = await self.send(conv, text, via=via, label=label)
        while result.finish_reason == FinishReason.INTERRUPTED:
            result = await self.pause(conv, result, rng)
        record.ended = now()
        record.finish = result.finish_reason.value

    async def send(self, conv: Conversation, text: str, *, via: str, label: int) -> TurnResult:
        """Send the turn's message until the conversation has it; the turn's first stop.

        Every attempt carries the message's id, by whichever path: one that raised may still
        get in later (its request outlives the caller's wait), and without the id a resend
        that got in too made a second turn of the same message that nobody answered."""
        expected = conv.sends + 1
        message_id = f"m-{label}"
        for attempt in range(20):
            try:
                if via == "agui" and attempt == 0:
                    out = await self.paths.send_agui(
                        conv.chat_id, text, run_id=f"run-{label}", message_id=message_id
                    )
                    if out.status == "accepted" and out.result is not None:
                        conv.sends = expected
                        if out.result.finish_reason == FinishReason.INTERRUPTED:
                            # The stream's interrupts are shown as AG-UI has them; the
                            # conversation's own list is the one answered.
                            return await self.where(conv)
                        return out.result
                    if out.status == "refused":
                        raise SendRejected(out.detail)
                    if out.status == "accepted":
                        # In, with no word on how its turn went: the conversation has it.
                        conv.problems.append(f"AG-UI send of turn {label}: {out.detail}")
                        conv.sends = expected
                        return await self.where(conv)
                    raise AgentError(f"AG-UI send: {out.detail}")
                result = await self.paths.send_python(conv.chat_id, text, message_id=message_id)
                conv.sends = expected
                return result
            except (AgentError, RPCError) as e:
                detail = f"{type(e).__name__}: {e}"
            # Did it get in? The conversation's turn count says.
            turns = await self._turns(conv)
            if turns >= expected:
                conv.sends = expected
                return await self.where(conv)
            log.info("send to %s not taken (%s); sending again", conv.chat_id, detail[:200])
            await asyncio.sleep(1.0)
        raise RuntimeError(f"{conv.chat_id}: the message of turn {label} never got in")

    # -- a pause ------------------------------------------------------------------------------

    async def pause(self, conv: Conversation, result: TurnResult, rng: random.Random) -> TurnResult:
        """Answer the first pending call (or let it expire, or cancel); where the turn is
        then."""
        for request in result.interrupts:
            if request.ref not in conv.seen:
                conv.seen[request.ref] = Seen(
                    name=request.name,
                    source=request.source,
                    turn=result.turn,
                    at=now(),
                    input=request.input,
                )
        if not result.interrupts:
            return await self.where(conv)
        request = result.interrupts[0]
        stopping = self.stopping.is_set()
        if stopping:
            return await self.final_answer(conv, request)
        plan = self._decide(request, rng)
        if plan == "expire":
            return await self.expire(conv, request, rng)
        think = (
            rng.uniform(0.3, 2.0)
            if request.name == "quick"
            else rng.uniform(0.5, 2 * self.pace.think)
        )
        if await self._wait(think):
            return await self.final_answer(conv, request)
        # Answers that must be refused, sent first (the call is still pending).
        refusals: list[Awaitable[Attempt]] = []
        if rng.random() < 0.08:
            refusals.append(
                self.attempt(
                    conv,
                    request,
                    Answer("approve"),
                    kind="wrong_ref",
                    path=self._path(rng),
                    expect="refuse",
                    ref=f"no-such-{uuid.uuid4().hex[:8]}",
                )
            )
        if rng.random() < 0.06:
            other = "lookup" if request.name != "lookup" else "transfer"
            refusals.append(
                self.attempt(
                    conv,
                    request,
                    Answer("approve"),
                    kind="wrong_name",
                    path=rng.choice(["update", "signal"]),
                    expect="refuse",
                    name=other,
                )
            )
        if request.name == "confirm" and rng.random() < 0.4:
            refusals.append(
                self.attempt(
                    conv,
                    request,
                    Answer("respond", output={"approved": True}),
                    kind="non_approver",
                    path=self._path(rng),
                    expect="refuse",
                    identity=f"mallory-{self._next_id()}@soak",
                )
            )
        if rng.random() < 0.06:
            refusals.append(self.hostile(conv, result.interrupts, rng))
        if refusals:
            await asyncio.gather(*refusals)
        if plan == "cancel":
            await self.cancel(conv, rng)
            return await self.where(conv)
        answer = self._answer(request, rng)
        tasks = [
            self.attempt(
                conv, request, answer, kind="answer", path=self._path(rng), expect="either"
            )
        ]
        if rng.random() < 0.25:
            for _ in range(rng.choice([1, 1, 2])):
                other = answer if rng.random() < 0.7 else self._answer(request, rng)
                tasks.append(
                    self.attempt(
                        conv,
                        request,
                        other,
                        kind="duplicate",
                        path=self._path(rng),
                        expect="either",
                    )
                )
        if rng.random() < 0.04:
            tasks.append(self.cancel(conv, rng))
        done = await asyncio.gather(*tasks)
        settled = await self.settle(conv, request, done)
        if rng.random() < 0.12:
            await self.attempt(
                conv, request, answer, kind="second", path=self._path(rng), expect="refuse"
            )
        return settled

    async def settle(
        self, conv: Conversation, request: InterruptRequest, attempts: list[Attempt]
    ) -> TurnResult:
        """Where the turn stands once the call is answered: answered again (by update) for as
        long as it is still pending with no answer taken."""
        accepted = [a for a in attempts if a.status == "accepted" and a.kind != "cancel"]
        for a in accepted:
            if a.result is not None and _settled(a.result, request.ref):
                return a.result
        for _ in range(10):
            result = await self.where(conv)
            if not _settled(result, request.ref):
                if any(a.status == "accepted" and a.ref == request.ref for a in attempts):
                    conv.problems.append(
                        f"ref {request.ref} still pending after an accepted answer"
                    )
                # Lost to a fault (or refused): answer again, by update.
                retry = await self.attempt(
                    conv, request, Answer("approve"), kind="retry", path="update", expect="either"
                )
                attempts = [*attempts, retry]
                continue
            return result
        raise RuntimeError(f"{conv.chat_id}: ref {request.ref} stayed pending")

    async def expire(
        self, conv: Conversation, request: InterruptRequest, rng: random.Random
    ) -> TurnResult:
        """Let ``quick`` run out; now and then answer it after its deadline (too late,
        unless the conversation has not got to the deadline yet)."""
        deadline = (
            request.deadline.timestamp() if request.deadline else now() + DEADLINE.total_seconds()
        )
        late = rng.random() < 0.25
        if await self._wait(max(0.0, deadline - now()) + (0.5 if late else 0.2)):
            return await self.final_answer(conv, request)
        if late:
            await self.attempt(
                conv,
                request,
                Answer("respond", output={"approved": True, "note": "late"}),
                kind="late",
                path=self._path(rng),
                expect="either",
            )
        loop = asyncio.get_running_loop()
        until = loop.time() + SETTLE_FOR
        while loop.time() < until:
            result = await self.where(conv)
            if _settled(result, request.ref):
                return result
            await asyncio.sleep(1.0)
        conv.problems.append(f"ref {request.ref} ({request.name}) did not expire")
        return await self.final_answer(conv, request)

    async def final_answer(self, conv: Conversation, request: InterruptRequest) -> TurnResult:
        """The soak is stopping: answer what is pending at once, by update."""
        a = await self.attempt(
            conv, request, Answer("approve"), kind="final", path="update", expect="either"
        )
        return await self.settle(conv, request, [a])

    async def close(self, conv: Conversation) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + SETTLE_FOR
        while True:
            try:
                await self.paths.chat(conv.chat_id).close("soak: done", identity="soak")
                break
            except SendRejected as e:
                if "closed" in str(e):
                    break
                detail = str(e)
            except ChatNotFound:
                conv.problems.append("no conversation to close")
                return
            except (AgentError, RPCError) as e:
                detail = f"{type(e).__name__}: {e}"
            if loop.time() > until:
                conv.problems.append(f"could not close: {detail}")
                return
            await asyncio.sleep(1.0)
        conv.closed = True
        conv.closed_at = now()

    # -- attempts -----------------------------------------------------------------------------

    async def attempt(
        self,
        conv: Conversation,
        request: InterruptRequest,
        answer: Answer,
        *,
        kind: Kind,
        path: Path_,
        expect: Expect,
        ref: str | None = None,
        name: str | None = None,
        identity: str | None = None,
    ) -> Attempt:
        number = self._next_id()
        if identity is None:
            identity = (
                APPROVERS[number % len(APPROVERS)]
                if request.name == "confirm"
                else f"{path}-{number}@soak"
            )
        shown = request.model_copy(update={"ref": ref or request.ref, "name": name or request.name})
        a = Attempt(
            id=number,
            chat_id=conv.chat_id,
            ref=shown.ref,
            tool=shown.name,
            path=path,
            kind=kind,
            action=answer.action,
            expect=expect,
            identity=identity,
            sent_at=now(),
            edited=answer.input if answer.action == "edit" else None,
        )
        conv.attempts.append(a)
        out = await self._send(conv.chat_id, shown, answer, a)
        a.status, a.detail, a.done_at, a.result = out.status, out.detail, now(), out.result
        return a

    async def _send(
        self, chat_id: str, shown: InterruptRequest, answer: Answer, a: Attempt
    ) -> Outcome:
        identity = a.identity or ""
        if a.path == "update":
            return await self.paths.update(
                chat_id, answer.build(shown), identity=identity, metadata={"answer_id": a.answer_id}
            )
        if a.path == "signal":
            payload = signal_payload(shown, answer, identity=identity, answer_id=a.answer_id)
            return await self.paths.signal(chat_id, self.paths.signal_input(payload))
        if a.path == "http":
            body = approvals_body(shown, answer, answer_id=a.answer_id)
            return await self.paths.approvals_api(chat_id, shown.ref, body, identity=identity)
        if a.path == "agui":
            return await self.paths.agui_resume(
                chat_id, agui_entry(shown, answer), identity=identity, run_id=f"run-{a.answer_id}"
            )
        return await self.paths.agentctl(agentctl_args(chat_id, shown, answer, identity=identity))

    async def cancel(self, conv: Conversation, rng: random.Random) -> Attempt:
        number = self._next_id()
        via: Path_ = "agentctl" if rng.random() < 0.2 else "update"
        a = Attempt(
            id=number,
            chat_id=conv.chat_id,
            ref=None,
            tool=None,
            path=via,
            kind="cancel",
            action="cancel",
            expect="either",
            identity=f"cancel-{number}@soak",
            sent_at=now(),
        )
        conv.attempts.append(a)
        out = await self.paths.cancel(
            conv.chat_id,
            identity=a.identity or "",
            via="agentctl" if via == "agentctl" else "update",
        )
        a.status, a.detail, a.done_at, a.result = out.status, out.detail, now(), out.result
        return a

    async def hostile(
        self, conv: Conversation, pending: list[InterruptRequest], rng: random.Random
    ) -> Attempt:
        """One hostile ``resume`` signal: each must be refused and recorded."""
        number = self._next_id()
        request = pending[0]
        choice = rng.random()
        via_sdk = False
        if choice < 0.15:
            payload = oversized(request.ref, request.name, size=DOOR.resume)
            label = payload.label
        elif choice < 0.3:
            # A lone surrogate, escaped as JSON allows: the CLI would re-encode it, so the SDK
            # sends these bytes as they are.
            body = json.dumps(
                {
                    "respond": [
                        {
                            "name": request.name,
                            "ref": request.ref,
                            "output": {"approved": True, "note": "\ud800"},
                        }
                    ]
                }
            )
            payload = Payload("lone surrogate", [(body.encode(), "json/plain")])
            label, via_sdk = payload.label, True
        else:
            gen = HostileGenerator(pending, seed=rng.randrange(2**31), stale_ref="t0-0-stale")
            # Not attacks here: an edited input where the tool is editable (an edit), and any
            # output for a gated call when no interrupt-only one is pending (a respond
            # supplies a gated tool's output; only interrupt-only tools declare a schema).
            editable = any(p.editable for p in pending)
            asking = any(p.source == "interrupt" for p in pending)
            valid = {"edited restart input"} if editable else set()
            if not asking:
                valid.add("output breaks schema")
            cases = [c for c in gen.generate(40, cli=True) if c.label not in valid]
            payload = rng.choice(cases)
            label = payload.label
        a = Attempt(
            id=number,
            chat_id=conv.chat_id,
            ref=request.ref,
            tool=request.name,
            path="signal",
            kind="hostile",
            action=label,
            expect="refuse",
            identity=None,
            sent_at=now(),
            via_sdk=via_sdk,
        )
        conv.attempts.append(a)
        if via_sdk:
            out = await self._raw_signal(conv.chat_id, payload)
        else:
            args = payload.cli_args()
            if sum(len(x) for x in args) > 64_000:
                path = self.paths.scratch / f"hostile-{number}.json"
                path.write_bytes(payload.args[0][0])
                args = ["--input-file", str(path)]
            out = await self.paths.signal(conv.chat_id, args)
        a.status, a.detail, a.done_at = out.status, out.detail, now()
        return a

    async def _raw_signal(self, chat_id: str, payload: Payload) -> Outcome:
        handle = self.paths.agents.temporal.get_workflow_handle(chat_id)
        raw = [
            RawValue(ApiPayload(metadata={"encoding": enc.encode()}, data=data))
            for data, enc in payload.args
        ]
        try:
            await handle.signal("resume", args=raw)
        except RPCError as e:
            return Outcome("unknown", detail=f"RPCError: {e.message}")
        return Outcome("sent")

    # -- where the conversation stands ---------------------------------------------------------

    async def where(self, conv: Conversation) -> TurnResult:
        """The turn's result once it has paused or ended (``await_turn``), across faults."""
        result = await self._patiently(conv, lambda: self.paths.chat(conv.chat_id).last_turn())
        if result is None:
            raise RuntimeError(f"{conv.chat_id}: no turn to wait for")
        return result

    async def _turns(self, conv: Conversation) -> int:
        try:
            status = await self._patiently(conv, lambda: self.paths.chat(conv.chat_id).status())
        except ChatNotFound:
            return 0
        return status.turns

    async def _patiently(self, conv: Conversation, call: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        until = loop.time() + SETTLE_FOR
        while True:
            try:
                return await call()
            except ChatNotFound:
                raise
            except (AgentError, RPCError) as e:
                if loop.time() > until:
                    conv.problems.append(f"no answer for {SETTLE_FOR:.0f}s: {e}")
                    raise
                await asyncio.sleep(1.0)

    # -- choices ------------------------------------------------------------------------------

    def _decide(self, request: InterruptRequest, rng: random.Random) -> str:
        if rng.random() < 0.08:
            return "cancel"
        if request.name == "quick" and rng.random() < 0.6:
            return "expire"
        return "answer"

    def _answer(self, request: InterruptRequest, rng: random.Random) -> Answer:
        r = rng.random()
        if request.name == "transfer":
            if r < 0.55:
                return Answer("approve")
            if r < 0.75:
                return Answer("deny", reason="soak: no")
            edited = {**request.input, "amount": int(request.input.get("amount", 1)) + 1000}
            return Answer("edit", input=edited)
        if request.name == "refund":
            return Answer("approve") if r < 0.7 else Answer("deny", reason="soak: no")
        # confirm and quick: interrupt-only, answered with their output.
        approved = r < 0.7
        return Answer("respond", output={"approved": approved, "note": "soak"})

    def _path(self, rng: random.Random) -> Path_:
        if rng.random() < self.pace.agentctl_share:
            return "agentctl"
        return rng.choice(["update", "update", "signal", "http", "agui"])

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def _wait(self, seconds: float) -> bool:
        """Sleep, waking early when the soak stops starting turns; whether it did."""
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True


def _settled(result: TurnResult, ref: str) -> bool:
    return not (
        result.finish_reason == FinishReason.INTERRUPTED
        and any(i.ref == ref for i in result.interrupts)
    )


def _command(plan: str, rng: random.Random, label: int) -> str:
    amount = rng.randint(1, 500)
    if plan == "transfer":
        return f'call transfer {{"amount": {amount}, "to": "acct-{label}"}}'
    if plan == "refund":
        return f'call refund {{"amount": {amount}, "order": "o-{label}"}}'
    if plan == "confirm":
        return f'call confirm {{"question": "ship order o-{label}?"}}'
    if plan == "quick":
        return 'call quick {"question": "go ahead?"}'
    if plan == "multi":
        first = rng.choice(["transfer", "refund"])
        second = rng.choice(["confirm", "quick"])
        paying = (
            f'call transfer {{"amount": {amount}, "to": "acct-{label}"}}'
            if first == "transfer"
            else f'call refund {{"amount": {amount}, "order": "o-{label}"}}'
        )
        asking = (
            f'call confirm {{"question": "and o-{label}?"}}'
            if second == "confirm"
            else 'call quick {"question": "and this?"}'
        )
        return f'{paying} and call lookup {{"q": "q{label}"}} and {asking}'
    return f"say hello {label}"

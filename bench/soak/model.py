"""The workers' scripted model: it does what the user's message says, and fails as seeded.

Each user message of the soak reads ``soak chat=ID turn=N: call TOOL {json} and call TOOL
{json}`` (or ``soak chat=ID turn=N: say TEXT``): the model calls those tools, in one message,
each with the call id ``tN-I-TOOL`` (unique in the conversation, so the workflow takes it as the
call's ref); once the tools have answered it replies with what they returned. The reply depends
only on the conversation, so any worker gives the same one, on any attempt.

Faults: a model call is one conversation at one length. Whether it fails, and how (HTTP 429, HTTP
503, or a hang longer than the google-genai client's timeout), comes from the seed and the call
alone; only its first attempt fails, whichever worker takes it (attempts are counted in a file
the workers share), and Temporal's retry policy makes the next attempt.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from bench.soak.ledger import ModelCalls, ModelFault, now
from temporal_agent_interrupts.worker.offline_model import CallSyntaxError, parse_calls, summary
from temporal_agent_interrupts.worker.standin import Reply, Request, calls, text

_HEAD = re.compile(r"^soak chat=(?P<chat>\S+) turn=(?P<turn>\d+): (?P<rest>.*)$", re.DOTALL)

FAULT_KINDS = ("http429", "http503", "hang")


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    rate: float
    """The share of model calls whose first attempt fails."""
    hang_seconds: float
    """How long a hung call sleeps before it answers: longer than the client's timeout."""


class SoakModel:
    """A ``GeminiStandIn`` responder (see the module docstring)."""

    def __init__(self, plan: FaultPlan, calls: ModelCalls) -> None:
        self.plan = plan
        self.calls = calls

    def __call__(self, request: Request) -> Reply | dict[str, Any]:
        head = _HEAD.match(request.user_text())
        if head is None:
            return text("the soak's model reads only the soak's messages")
        chat, turn = head["chat"], int(head["turn"])
        fault = self._fault(request, chat)
        if fault is not None:
            return fault
        last = request.last_parts
        if any("text" in p for p in last):
            return self._first_step(turn, head["rest"])
        return text(f"done turn {turn}: {summary(request.function_responses())}")

    def _first_step(self, turn: int, rest: str) -> dict[str, Any]:
        if rest.startswith("say "):
            return text(f"turn {turn}: {rest[4:]}")
        try:
            commands = parse_calls(rest)
        except CallSyntaxError as e:
            return text(f"turn {turn}: {e}")
        if not commands:
            return text(f"turn {turn}: nothing to do")
        return calls(
            *((name, args or {}, f"t{turn}-{i}-{name}") for i, (name, args) in enumerate(commands))
        )

    def _fault(self, request: Request, chat: str) -> Reply | None:
        if self.plan.rate <= 0:
            return None
        key = hashlib.sha256(
            f"{chat}|{len(request.contents)}|{request.last_parts!r}".encode()
        ).hexdigest()[:24]
        rng = random.Random(f"{self.plan.seed}|{key}")
        if rng.random() >= self.plan.rate:
            return None
        kind = rng.choice(FAULT_KINDS)
        if self.calls.attempt(key) > 1:
            return None  # a retry: it goes through
        self.calls.fault(ModelFault(kind=kind, chat_id=chat, key=key, pid=os.getpid(), at=now()))
        if kind == "http429":
            return Reply.error(429, "soak: quota exceeded (injected)")
        if kind == "http503":
            return Reply.error(503, "soak: model unavailable (injected)")
        # Longer than the client's timeout: the attempt fails on the worker's side, and the
        # late answer goes to a connection nobody reads any more.
        time.sleep(self.plan.hang_seconds)
        return Reply(chunks=[text("too late")])

"""The conversation's signals: every signal name lands here with raw payloads.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

A signal is in history whatever is made of it, and a handler that raises fails the workflow
task for good: so :class:`Signals` reads each payload itself, and a malformed one (bad JSON,
wrong types, zero or two arguments, a key the worker lacks) is recorded as a rejection in the
conversation's rejection log instead. ``resume`` answers an interrupt (or is passed on to the
sub-agent it is for), ``send`` starts a turn, a sub-agent's report is a hint to read it again,
and the streaming model activity publishes the text it receives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Literal

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

from temporal_agent_interrupts.workflows import audit, config
from temporal_agent_interrupts.workflows.activity_io import (
    SubAgentReport,
)
from temporal_agent_interrupts.workflows.door import Door, Handling
from temporal_agent_interrupts.workflows.interrupts import ResumeError, pydantic_reason
from temporal_agent_interrupts.workflows.limits import DOOR, Refused, check_json, check_size
from temporal_agent_interrupts.workflows.payloads import (
    RawResume,
    claimed_identity,
    claimed_token,
    only_argument,
    payload_json,
)
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
)
from temporal_agent_interrupts.workflows.stream import PUBLISH_SIGNAL, ConversationStream
from temporal_agent_interrupts.workflows.subagents import SubAgentChild
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    JsonObject,
    SendInput,
)


class Signals:
    """Takes the conversation's signals, and records every one it refuses.

    Args:
        state: The conversation's state.
        machine: The turn state machine.
        door: The checks a request passes.
        handling: What this run's handlers have under way.
        stream: The conversation's event stream (a streaming model call publishes to it).
        publish: Writes the operator view (a refused signal is in its rejection count).
        keep: Holds a task under way until it is done.
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        machine: TurnMachine,
        door: Door,
        handling: Handling,
        stream: ConversationStream,
        publish: Callable[[], None],
        keep: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self.s = state
        self._m = machine
        self._door = door
        self._h = handling
        self._stream = stream
        self._publish = publish
        self._keep = keep

    def take(self, name: str, args: Sequence[RawValue]) -> None:
        """Take one signal: act on it, or record why not (never raise)."""
        self._h.signals += 1
        try:
            payload = only_argument(name, args)
            if name == "resume":
                # A signal is in history whatever is made of it: one with a token goes on to
                # the sub-agent even where its rules as shown here would refuse it, so that
                # the sub-agent spends the token too.
                target = self._door.delegated_target(
                    payload, early=claimed_token([payload]) is None
                )
                if target is not None:
                    self._m.senders.spend_refused(claimed_token([payload]))  # as by update
                    self._forward(payload, target)
                else:
                    self._m.resume(self._door.check_resume(payload), via="signal")
            elif name == "send":
                self._send(payload)
            elif name == config.SUB_AGENT_SIGNAL:
                self._sub_agent(payload)
            elif name == PUBLISH_SIGNAL:
                turn = self.s.turn
                key = self._m.streaming_key()
                # A call of ours that streams no more: its turn stopped, or it ended.
                model = self._m.model
                ended = (model.stream_key if key is None else None) or model.ended_stream_key
                attempt, added = self._stream.accept_publish(
                    payload, key=key, ended=ended, turn=turn.turn if turn else 0
                )
                if added:
                    model.streamed[attempt] = model.streamed.get(attempt, "") + added
                self.s.events_total = self._stream.next_offset
            else:
                raise ResumeError(
                    f"unknown signal {name!r}; this workflow accepts 'resume' and 'send'"
                )
        except Refused as e:
            self.reject(handler=name, reason=e.reason, payload=args)
        except Exception as e:  # noqa: BLE001  # a signal must never fail the workflow task
            workflow.logger.exception("signal %r could not be handled", name)
            self.reject(
                handler=name,
                reason=f"internal error handling the signal ({type(e).__name__})",
                payload=args,
            )

    def _sub_agent(self, payload: RawValue) -> None:
        """A sub-agent says what it waits on changed: a hint, read from the child itself."""
        check_size(len(payload.payload.data), limit=DOOR.resume, what="sub-agent report")
        try:
            report = SubAgentReport.model_validate(payload_json(payload))
        except ValidationError as e:
            raise ResumeError(f"malformed sub-agent report: {pydantic_reason(e)}") from None
        if self._m.children.hint(report.chat_id):
            return
        if report.chat_id.startswith(f"{workflow.info().workflow_id}--"):
            # A child of ours that has just finished: its last report crossed its result.
            return
        raise ResumeError("no sub-agent of this conversation runs under that chat id")

    def _forward(self, payload: RawResume, target: tuple[str, SubAgentChild, JsonObject]) -> None:
        """An answer by signal for a sub-agent's interrupt: passed on to the child, whose rules
        check it; a refusal there is recorded here, as any refused signal is."""
        child_id, child, body = target

        async def forward() -> None:
            try:
                outcome = await self._m.children.forward(child_id, child, body, via="signal")
            except Exception as e:  # noqa: BLE001  # an activity failure must not fail the task
                self.reject(
                    handler="resume",
                    reason=f"could not reach sub-agent {child_id} ({type(e).__name__})",
                    payload=[payload],
                )
                return
            finally:
                self._h.forwarding -= 1
            if outcome.refused is not None:
                self.reject(
                    handler="resume",
                    reason=f"refused by sub-agent {child_id}: {outcome.refused}",
                    payload=[payload],
                )

        # Counted now, in the handler: the run must not continue as new before the answer has
        # reached the sub-agent (it would be dropped, unrecorded), even in this very task.
        self._h.forwarding += 1
        self._keep(asyncio.create_task(forward()))

    def _send(self, payload: RawValue) -> None:
        size = len(payload.payload.data)
        # Size first: an oversized payload is refused before it is even parsed.
        check_size(size, limit=DOOR.send, what="message")
        body = payload_json(payload)
        check_json(body, what="send")
        try:
            input = SendInput.model_validate(body)
        except ValidationError as e:
            raise ResumeError(f"malformed send: {pydantic_reason(e)}") from None
        problem = self._door.send_problem(
            input.text, agent=input.agent, size=size, message_id=input.message_id
        )
        if problem:
            raise ResumeError(problem)
        repeat = self._door.repeat(input)
        if repeat is not None:
            raise ResumeError(
                f"a repeat of message {repeat.message_id!r}, which started turn {repeat.turn}: "
                "nothing to do"
            )
        self._m.start(
            input.text,
            stream=input.stream,
            message_id=input.message_id,
            sender=self._door.sender(input),
        )

    def reject(
        self,
        *,
        handler: str,
        reason: str,
        payload: Sequence[RawValue],
        via: Literal["signal", "start"] = "signal",
    ) -> None:
        """Record a refused signal, or what a start asked for that it may not (an update's
        refusal goes back to its caller instead)."""
        record = audit.rejection(
            at=workflow.now(),
            handler=handler,
            reason=reason,
            raw=b"".join(p.payload.data for p in payload),
            identity=claimed_identity(payload) if via == "signal" else None,
            via=via,
        )
        audit.reject(self.s, record)
        self._m.telemetry.rejected(handler, via=via)
        if handler in ("resume", "send"):
            # The payload is in history now: its token, if valid, must answer nothing later.
            self._m.senders.spend_refused(claimed_token(payload))
        workflow.logger.warning(
            "rejected %r %s from %r: %s",
            record.handler,
            via,
            record.identity or ("the starter" if via == "start" else "unknown sender"),
            record.reason,
        )
        if via == "signal":
            # (A start's refusal is published by the run's first publish, in run.)
            self._publish()

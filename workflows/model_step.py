"""The turn's model step: the conversation so far to the model, its reply into the turn.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`ModelStep` asks the model activity for the next message with only what the model side
has not seen (``ModelInput``), keeps that input under Temporal's payload limit, asks again when
what comes back is not a worker's, and adds the reply to the conversation within the turn's
budget. Its text is emitted as the turn's event, less what the stream already carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

from temporal_agent_interrupts.workflows import config, events
from temporal_agent_interrupts.workflows.activity_io import (
    ModelInput,
    ModelResult,
)
from temporal_agent_interrupts.workflows.executing import ActivityRunner, TurnFailed, Unsealed
from temporal_agent_interrupts.workflows.history import Digests
from temporal_agent_interrupts.workflows.limits import HELD, OUT, RUN, human_size, json_size, shrink
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.telemetry import Telemetry
from temporal_agent_interrupts.workflows.types import (
    ErrorInfo,
    Message,
    Status,
    TurnEvent,
)


class ModelStep:
    """Asks the model for the turn's next message.

    Args:
        state: The conversation's state (its messages and spec; the reply is added there).
        runner: Schedules the model activity and takes only a worker's sealed result.
        digests: The conversation's message digests (the model input's ``prefix_digest``).
        telemetry: Told the worker hosts the agent once a model call comes back.
        emit: Records a turn event (the reply's text).
        append: Adds a message to the conversation, counted against the turn's budget.
        room: Bytes the turn can still take.
        signals_taken: How many signals this run has taken (a streaming call's share of the
            run's publish signals is what is left of ``RUN.stream_signals``).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        runner: ActivityRunner,
        digests: Digests,
        telemetry: Telemetry,
        emit: Callable[..., TurnEvent],
        append: Callable[[Message], None],
        room: Callable[[TurnState], int],
        signals_taken: Callable[[], int],
    ) -> None:
        self.s = state
        self._runner = runner
        self._digests = digests
        self._telemetry = telemetry
        self._emit = emit
        self._append = append
        self._room = room
        self._signals_taken = signals_taken
        # The text published on the stream during the model call under way, by attempt (the
        # workflow publishes whatever of the reply did not get there).
        self.streamed: dict[int, str] = {}
        # The streaming model call's own publisher id (ModelInput.stream_key): only its
        # publishes reach the stream (workflows.stream). None: no call is streaming.
        self.stream_key: str | None = None
        # The publisher id of the last streaming call that ended: its activity may still
        # publish after the workflow stopped waiting for it (a turn cancelled while the reply
        # streamed: the activity hears of it at its next heartbeat), and such a publish is
        # dropped, not recorded as a refused signal (workflows.stream.accept_publish).
        self.ended_stream_key: str | None = None

    async def call(self, turn: TurnState) -> Message:
        spec = self.s.spec
        messages = self.s.messages
        # Only what the model side has not seen goes into history; see ModelInput.
        seen = min(self.s.model_seen, len(messages))
        self._fit_unseen(seen)
        self.streamed = {}
        # A fresh publisher id for each streaming call: known to the workflow and the activity
        # it schedules, not to a signal from outside (unless it reads history: docs/security.md).
        self.stream_key = str(workflow.uuid4()) if turn.stream else None
        try:
            result = await self._ask(
                ModelInput(
                    agent=self.s.agent,
                    chat_id=workflow.info().workflow_id,
                    spec_digest=spec.digest if spec else None,
                    new_from=seen,
                    new_messages=messages[seen:],
                    prefix_digest=self._digests.of(messages, seen),
                    history_size=len(messages),
                    stream=turn.stream,
                    turn=turn.turn if turn.stream else None,
                    stream_key=self.stream_key,
                ),
                summary=f"model {spec.model}" if spec else f"model for {self.s.agent}",
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError):
                # Our own cancellation of the turn (or of the workflow) reached the activity:
                # it is a cancellation, not a model failure.
                raise asyncio.CancelledError() from None
            raise TurnFailed(self._runner.error(e, what="model call")) from None
        finally:
            # The call is over: nothing more of it is taken.
            self.ended_stream_key = self.stream_key or self.ended_stream_key
            self.stream_key = None
        self._telemetry.hosted()  # the worker hosts this agent: its name may label metrics
        if result.spec is not None:
            self.s.spec = result.spec
        # The message, and each of its calls' arguments again in the calls' state.
        adds = json_size(result.message) + sum(
            json_size(p.function_call) for p in result.message.parts if p.function_call
        )
        if adds > self._room(turn):
            raise TurnFailed(
                ErrorInfo(
                    status=Status.RESOURCE_EXHAUSTED,
                    message=(
                        f"the model's reply ({human_size(adds)}) does not fit in what this "
                        f"turn can still hold; a turn holds at most {human_size(HELD.turn)}"
                    ),
                )
            )
        turn.model_calls += 1
        self._append(result.message)
        self.s.model_seen = len(self.s.messages)
        text = result.message.text()
        attempts, self.streamed = self.streamed, {}
        if text:
            # What the stream lacks of the reply: all of it when nothing streamed; the rest
            # after the attempt whose text it begins with (the one that answered; a publish may
            # not have got through); all of it again when none (the turn's result has the
            # reply that counted).
            streamed = max(
                (t for t in attempts.values() if text.startswith(t)), key=len, default=""
            )
            rest = text[len(streamed) :]
            if rest:
                self._emit(events.text(rest))
            else:
                self._emit(events.text(text), publish=False)
        return result.message

    async def _ask(self, request: ModelInput, *, summary: str) -> ModelResult:
        """The model activity's result, asked again while what comes back is not a worker's
        (``workflows.seal``: a reply completed by id from outside), at most
        ``config.UNSEALED_TRIES`` times in a row; then the turn fails, with nothing taken."""
        for _ in range(config.UNSEALED_TRIES):
            if request.stream:
                # Each ask streams anew: its share is what the run has left now, after what
                # the asks before it published.
                left = max(0, RUN.stream_signals - self._signals_taken())
                request = request.model_copy(update={"stream_signals": left})
            try:
                result: ModelResult = await self._runner.execute(
                    config.MODEL_ACTIVITY,
                    request,
                    result_type=ModelResult,
                    start_to_close_timeout=config.MODEL_START_TO_CLOSE,
                    heartbeat_timeout=config.MODEL_HEARTBEAT,
                    retry_policy=config.MODEL_RETRY,
                    summary=summary,
                )
            except Unsealed:
                continue  # recorded; the model is asked again
            return result
        raise TurnFailed(
            ErrorInfo(
                status=Status.UNAVAILABLE,
                message=(
                    f"the model call's result was not a worker's {config.UNSEALED_TRIES} times "
                    "in a row (completed from outside the workers?); none of it was taken"
                ),
            )
        )

    def _fit_unseen(self, seen: int) -> None:
        """Keep the model call's input under Temporal's payload limit, come what may.

        The budgets keep the unseen messages (a kept tool message and the new user message)
        under 1.6 MiB; were they ever over :data:`OUT.model_input`, their largest responses
        and texts become stated placeholders, in the conversation itself, rather than the call
        failing its workflow task for good.
        """
        messages = self.s.messages
        unseen = messages[seen:]
        if json_size(unseen) <= OUT.model_input:
            return
        data = [m.model_dump(mode="json") for m in unseen]
        shrink({"messages": data}, OUT.model_input - 4096)
        messages[seen:] = [Message.model_validate(d) for d in data]
        self._digests.cut(seen)
        workflow.logger.warning("the model call's input was over its budget; cut to fit")

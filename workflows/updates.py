"""The conversation's updates: a message, an answer, a cancel, a wait and a close, each
returning the turn's result once it has stopped (paused or ended).

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`Updates` holds what each update does; ``AgentWorkflow`` declares the handlers and
their validators (Temporal finds them on the workflow class) and hands each here. A validator's
refusal leaves no history; a handler's, once accepted, does, so an answer refused there has its
token spent. An answer for a sub-agent's interrupt is passed on to it, and its verdict is this
update's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from temporalio import workflow

from temporal_agent_interrupts.workflows import grants
from temporal_agent_interrupts.workflows.door import Door, Handling, passed_on
from temporal_agent_interrupts.workflows.limits import DOOR, OUT, Refused, check_label, check_text
from temporal_agent_interrupts.workflows.payloads import RawResume, claimed_token, fit, rejected
from temporal_agent_interrupts.workflows.state import (
    ConversationState,
)
from temporal_agent_interrupts.workflows.subagents import SubAgentChild
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    CancelInput,
    ConversationResult,
    ErrorKind,
    FinishReason,
    GrantsResult,
    JsonObject,
    PolicyReviewResult,
    RevokeGrantInput,
    SendInput,
    TurnResult,
)


class Updates:
    """What the conversation's updates do.

    Args:
        state: The conversation's state.
        machine: The turn state machine.
        door: The checks a request passes.
        handling: What this run's handlers have under way.
        result: The conversation's result (a close returns it).
    """

    def __init__(
        self,
        state: ConversationState,
        *,
        machine: TurnMachine,
        door: Door,
        handling: Handling,
        result: Callable[[], ConversationResult],
    ) -> None:
        self.s = state
        self._m = machine
        self._door = door
        self._h = handling
        self._result = result
        # A policy review under way (one at a time: each schedules an activity).
        self._reviewing = False

    @contextmanager
    def _working(self) -> Iterator[None]:
        """Count an update handler of ours as at work (see AgentWorkflow._can_now)."""
        self._h.busy += 1
        try:
            yield
        finally:
            self._h.busy -= 1

    async def _stopped_since(self, seen: int) -> TurnResult:
        """The result of the turn an update started or moved on, once it has stopped (ended or
        paused again): ``seen`` is the stop count read before the update acted."""
        await workflow.wait_condition(lambda: self._m.stops > seen)
        assert self.s.last_turn is not None
        return fit(self.s.last_turn, OUT.update_result)

    async def _withdraw(self, input: CancelInput) -> TurnResult:
        """Cancel the current turn: withdraw what is pending, or stop it while it runs (a model
        call in flight is abandoned, a tool is told to stop); its result once it has stopped."""
        seen = self._m.stops
        self.stop_turn(input)
        return await self._stopped_since(seen)

    def stop_turn(self, input: CancelInput) -> None:
        self._m.cancel = input
        if self._h.turn_task is not None and not self._m.waiting_on_human():
            self._h.turn_task.cancel()

    async def send(self, input: SendInput) -> TurnResult:
        """Start a turn with a user message; returns when the turn ends or pauses."""
        with self._working():
            self.validate_send(input)
            repeat = self._door.repeat(input)
            if repeat is not None:
                # The message is in: whoever sent it again is told how its turn went. Another
                # send of the same task may have started a turn since the check (validators
                # run before handlers): that turn is not this message's.
                result = await self._latest_turn(of=repeat.turn)
                if result is not None and result.turn != repeat.turn:
                    raise rejected(
                        ErrorKind.SEND_REJECTED,
                        f"message {input.message_id!r} was sent already and started turn "
                        f"{repeat.turn}; the conversation has moved on to turn {result.turn}",
                    )
                if result is None:
                    raise rejected(
                        ErrorKind.SEND_REJECTED,
                        f"message {input.message_id!r} was sent already; its turn's result "
                        "is no longer kept (Chat.history has the conversation)",
                    )
                return result.model_copy(update={"repeat": True})
            seen = self._m.stops
            try:
                # Checked by validate_send just above, with no await between: this settles it.
                self._m.start(
                    input.text,
                    stream=input.stream,
                    message_id=input.message_id,
                    sender=self._door.sender(input),
                )
            except Refused as e:
                raise self._refused_send(input, e) from None
            return await self._stopped_since(seen)

    def _refused_send(self, input: SendInput, refusal: Refused) -> Exception:
        """A send refused in its handler, once accepted (its payload is in history): its token,
        if it could answer something here, is spent (``spend_refused``)."""
        self._m.senders.spend_refused(input.identity_token)
        self._m.telemetry.rejected("send", via="update")
        return rejected(ErrorKind.SEND_REJECTED, refusal.reason, refusal.code)

    def validate_send(self, input: SendInput) -> None:
        reason = self._door.send_problem(
            input.text,
            agent=input.agent,
            size=len(input.text.encode()),
            message_id=input.message_id,
        )
        if reason:
            raise rejected(ErrorKind.SEND_REJECTED, reason)
        if self._door.repeat(input) is not None:
            self._door.check_turn_waiters()
            return  # a repeat joins its turn: what it says of its sender is not asked again
        try:
            self._door.sender(input)
        except Refused as e:
            raise rejected(ErrorKind.SEND_REJECTED, e.reason, e.code) from None

    async def resume(self, payload: RawResume) -> TurnResult:
        """Answer pending interrupts; returns when the turn ends or pauses again.

        ``payload`` is a :class:`~workflows.types.ResumeInput`, taken raw
        (:data:`~workflows.payloads.RawResume`) so that this workflow, not the data converter,
        decides what is wrong with a bad one and says so. A resume that leaves interrupts
        unanswered returns at once, listing those still pending.
        """
        with self._working():
            try:
                # Accepted, so in history: an answer for a sub-agent goes on to it even where
                # its rules as shown here would refuse it, so that it spends the token there.
                target = self._door.delegated_target(payload, early=False)
            except Refused as e:
                raise self._refused_update(payload, e) from None
            if target is not None:
                # Its token is in this conversation's history now (the update, the forwarding
                # activity's input), whatever the sub-agent makes of it: spent here too, and
                # the sub-agent spends it too, whatever its verdict (sub_agent_resume).
                self._m.senders.spend_refused(claimed_token([payload]))
                return await self._forward_update(target)
            try:
                resume = self._door.check_resume(payload)
                seen = self._m.stops
                turn = self._m.resume(resume, via="update")
            except Refused as e:
                raise self._refused_update(payload, e) from None
            # The receipt of what this answer decided, for a caller that passed it on.
            head = self.s.receipt_head
            made = {"receipt": head.last} if head is not None else {}
            if not self._m.book(turn).all_answered():
                return fit(self._m.paused_result(turn), OUT.update_result).model_copy(update=made)
            return (await self._stopped_since(seen)).model_copy(update=made)

    def _refused_update(self, payload: RawResume, refusal: Refused) -> Exception:
        """A resume update refused in its handler, once accepted: reachable when a duplicate
        passed validation in the same task, or when the validator let it through (an answer a
        caller passed on, see validate_resume). Its payload is in history: its token is spent.
        """
        self._m.senders.spend_refused(claimed_token([payload]))
        self._m.telemetry.rejected("resume", via="update")
        return rejected(ErrorKind.RESUME_REJECTED, refusal.reason, refusal.code)

    async def _forward_update(self, target: tuple[str, SubAgentChild, JsonObject]) -> TurnResult:
        """An answer by update for a sub-agent's interrupt: the child's ``resume`` update
        checks it by its own rules, and its refusal is this update's. It returns as a resume of
        this conversation's own would: once the turn stops again (the sub-agent pauses again,
        or its answer lets the turn go on to its end)."""
        child_id, child, body = target
        outcome = await self._m.children.forward(child_id, child, body, via="update")
        if outcome.refused is not None:
            self._m.telemetry.rejected("resume", via="update")
            # The child's kind of refusal too: "not an approver" stays forbidden through here.
            raise rejected(
                ErrorKind.RESUME_REJECTED,
                f"refused by sub-agent {child_id}: {outcome.refused}",
                outcome.code or "invalid",
            )
        child_result = outcome.result
        if child_result is not None and child_result.finish_reason == FinishReason.INTERRUPTED:
            # Still waiting there (a quorum not met, another call): that is where it stands.
            turn = self.s.turn
            if turn is not None:
                return fit(self._m.paused_result(turn), OUT.update_result)
        # Answered there: the turn goes on once that call is done, unless a sibling (another
        # sub-agent, or a call of this conversation's own) still waits, which is then where
        # the turn stands. A stop before the call is done is no answer to this: a sibling's
        # change, reported while this sub-agent still showed what was just answered.
        await workflow.wait_condition(lambda: child_id not in self._m.children.running)
        seen = self._m.stops
        await workflow.wait_condition(
            lambda: self._m.stops > seen or self.s.turn is None or self._m.last_result_paused()
        )
        if self._m.stops > seen or self.s.turn is None:
            assert self.s.last_turn is not None
            return fit(self.s.last_turn, OUT.update_result)
        turn = self.s.turn
        assert turn is not None
        return fit(self._m.paused_result(turn), OUT.update_result)

    def validate_resume(self, payload: RawResume) -> None:
        if self.s.one_turn and passed_on():
            # An answer the caller passed on: its token is in the caller's history whatever
            # happens here, so a refusal must be on record here too (the handler checks it,
            # and spends the token of one it refuses); a validator's refusal leaves nothing.
            # Anyone may name such an id: it gets them what a signal does.
            return
        try:
            if self._door.delegated_target(payload) is not None:
                return  # the sub-agent's own resume update checks it, by its own rules
            self._door.check_resume(payload)
        except Refused as e:
            workflow.logger.info("resume rejected (update): %s", e.reason)
            # A metric is no command: a validator may count what it refuses.
            self._m.telemetry.rejected("resume", via="update")
            raise rejected(ErrorKind.RESUME_REJECTED, e.reason, e.code) from None

    async def cancel(self, input: CancelInput) -> TurnResult:
        """Withdraw the pending interrupts (or stop the running turn); ends it ``cancelled``."""
        with self._working():
            self.validate_cancel(input)
            return await self._withdraw(input)

    def validate_cancel(self, input: CancelInput) -> None:
        if self.s.turn is None:
            raise rejected(
                ErrorKind.CANCEL_REJECTED, "nothing to cancel: no turn is running or paused"
            )
        if self._m.cancel is not None:
            raise rejected(ErrorKind.CANCEL_REJECTED, "a cancellation is already under way")
        self._door.check_cancel_input(input)

    def validate_review_policy(self) -> None:
        spec = self.s.spec
        if spec is None or spec.policy_hash is None:
            raise rejected(
                ErrorKind.REVIEW_REJECTED,
                "this conversation's agent has no policy set (as of its last model call)",
            )
        if self._reviewing:
            raise rejected(
                ErrorKind.REVIEW_REJECTED, "a policy review is already under way", "conflict"
            )

    async def review_policy(self) -> PolicyReviewResult:
        """Decide the paused calls again with the worker's policy set (see
        ``TurnMachine.review_policy``). Only a worker's set decides: the update names none."""
        with self._working():
            # Also checked here: validators of one task may all run before any handler.
            self.validate_review_policy()
            self._reviewing = True
            try:
                return await self._m.rules.review_policy()
            finally:
                self._reviewing = False

    def validate_revoke_grant(self, input: RevokeGrantInput) -> None:
        try:
            check_label(input.id, what="grant id", limit=DOOR.ref)
            check_text(input.reason, what="reason", limit=DOOR.reason)
            if input.identity is not None:
                check_label(input.identity, what="identity", limit=DOOR.identity)
        except Refused as e:
            raise rejected(ErrorKind.GRANT_REJECTED, e.reason) from None
        if grants.held(self.s.grants, input.id) is None:
            held = ", ".join(g.id for g in self.s.grants) or "none"
            raise rejected(
                ErrorKind.GRANT_REJECTED,
                f"no grant {input.id!r} is in force here (revoked or expired already, or never "
                f"made); in force: {held}",
                code="not_found",
            )

    def revoke_grant(self, input: RevokeGrantInput) -> GrantsResult:
        """End a grant now; returns the grants still in force."""
        with self._working():
            # Also checked here: validators of one task may all run before any handler.
            self.validate_revoke_grant(input)
            self._m.rules.revoke_grant(input.id, identity=input.identity, reason=input.reason)
            return GrantsResult(grants=list(self.s.grants))

    async def await_turn(self) -> TurnResult | None:
        """The latest turn's result, once the current turn (if any) has paused or ended."""
        with self._working():
            # Also checked here: validators of one task may all run before any handler.
            self.validate_await_turn()
            return await self._latest_turn()

    async def _latest_turn(self, *, of: int | None = None) -> TurnResult | None:
        """The latest turn's result, once it has paused or ended (or, given ``of``, once a
        turn after that one has started)."""
        self._h.turn_waiters += 1
        try:
            await workflow.wait_condition(
                lambda: (
                    self.s.turn is None
                    or self._m.waiting_on_human()
                    # Paused on sub-agents, each call of the message paused or ended.
                    or self._m.pauses.whole()
                    or (of is not None and self.s.turns != of)
                )
            )
        finally:
            self._h.turn_waiters -= 1
        result = self._m.last_result()
        if of is not None and self.s.last_turn is not None and self.s.last_turn.turn == of:
            result = self.s.last_turn  # that turn's own end, whatever has started since
        return fit(result, OUT.update_result) if result is not None else None

    def validate_await_turn(self) -> None:
        self._door.check_turn_waiters()

    async def close(self, input: CancelInput) -> ConversationResult:
        """End the conversation: withdraw anything pending and complete the workflow."""
        with self._working():
            self.validate_close(input)
            self._h.closing = True
            try:
                if self.s.turn is not None:
                    await self._withdraw(input)
            finally:
                self._h.closing = False
            self.s.closed = True
            return self._result()

    def validate_close(self, input: CancelInput) -> None:
        if self.s.closed:
            raise rejected(ErrorKind.SEND_REJECTED, "this conversation is already closed")
        if self._h.closing:
            raise rejected(ErrorKind.CANCEL_REJECTED, "this conversation is being closed already")
        self._door.check_cancel_input(input)

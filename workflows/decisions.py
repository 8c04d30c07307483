"""The interrupt book's part for decisions not made by an answer of the moment: remembered
decisions (grants, :mod:`workflows.grants`), an approval checked again before its run
(``stale``), and the agent's policy set's decisions (``activities.policy``, recorded on each call).

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:class:`Decisions` is composed into :class:`~workflows.interrupts.InterruptBook` (its
``decisions``): the book's resume asks it to check and make grants; the tool step asks it
whether a grant lets a call through, whether an approved call is stale, and to record what the
policy set decided; a policy review asks it to decide a paused call again.

Pure code with no Temporal imports, identical on replay.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from temporal_agent_interrupts.workflows import answers, events, governance, grants
from temporal_agent_interrupts.workflows.answers import ResumeError, same_json
from temporal_agent_interrupts.workflows.calls import Lifecycle
from temporal_agent_interrupts.workflows.governance import Who
from temporal_agent_interrupts.workflows.limits import cut_stored
from temporal_agent_interrupts.workflows.state import CallState, ConversationState
from temporal_agent_interrupts.workflows.types import (
    POLICY_IDENTITY,
    TOOL_APPROVED,
    AgentSpec,
    Grant,
    GrantScope,
    JsonObject,
    PolicyDecision,
    ResumeInput,
    gate_metadata,
    input_digest,
)

Pause = Callable[..., None]


class Decisions:
    """Grants, the re-check before a run, and the policy set's decisions, over a turn's calls.

    Args:
        lifecycle: The turn's call lifecycle (every change of a call's status is made there).
        spec: The agent's definition, read whenever asked.
        state: The conversation that keeps grants (None: a book of no conversation).
        pause: The book's pause (a call paused again gets its deadline there).
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        spec: Callable[[], AgentSpec | None],
        state: Callable[[], ConversationState | None],
        pause: Pause,
    ) -> None:
        self.lifecycle = lifecycle
        self._spec = spec
        self._state = state
        self._pause = pause

    @property
    def spec(self) -> AgentSpec | None:
        return self._spec()

    # -- grants (workflows.grants) ----------------------------------------------------------

    def check_remember(
        self,
        resume: ResumeInput,
        pending: dict[str, CallState],
        *,
        who: Who,
        now: datetime | None,
    ) -> None:
        """Check each ``remember`` of the resume: only on an approval of a call a gate paused,
        from someone named, within the grant bounds and the conversation's room for grants."""
        asked = [r for r in resume.restart if r.remember is not None]
        if not asked:
            return
        spec = self.spec
        state = self._state()
        for r in asked:
            call, scope = pending[r.ref], r.remember
            assert scope is not None  # filtered above
            where = f"{r.name!r} (ref {r.ref!r})"
            decision = events.decision(
                call, kind="restart", output=None, metadata=r.resumed_metadata
            )
            if spec is None or call.source != "approval" or governance.held_by(spec, call) is None:
                raise ResumeError(
                    f"remember on {where}: only the approval of a call a gate paused can be "
                    "remembered (an interrupt's answer is for that call alone)"
                )
            edit = r.input is not None and answers.is_edit(spec, call, r.input)
            if decision != "approved" or edit:
                raise ResumeError(
                    f"remember on {where}: only an approval of the input as it is can be "
                    "remembered (not an edit, and not a restart without tool_approved)"
                )
            if who.identity is None:
                raise ResumeError(
                    f"remember on {where}: a grant names who gave it: say who you are (identity)",
                    code="forbidden",
                )
            if state is None:
                raise ResumeError(f"remember on {where}: only a conversation keeps grants")
            if state.one_turn:
                # A sub-agent's conversation answers one call and closes: a grant made here
                # would let nothing through, and its caller could neither see nor revoke it.
                raise ResumeError(
                    f"remember on {where}: this is a sub-agent's conversation, which answers "
                    "one call and closes, so it keeps no grant; approve without remember"
                )
            grants.check_scope(scope, call, spec=spec, now=now)
        if state is not None and not grants.room(state, adding=len(asked)):
            raise ResumeError(
                f"{grants.MAX_GRANTS} grants are in force in this conversation: revoke one "
                "before remembering another",
                code="conflict",
            )

    def remember(
        self, call: CallState, remember: GrantScope | None, *, who: Who, now: datetime | None
    ) -> Grant | None:
        """The grant an applied approval of ``call`` makes, if it asked for one (a quorum's:
        only if every approval asked for the same)."""
        state = self._state()
        if state is None or now is None:
            return None
        if governance.quorum(self.spec, call) > 1:
            scope = grants.quorum_scope([v.remember for v in call.votes])
            by = [v.identity for v in call.votes]
            admitted = [[v.identity, *v.groups] for v in call.votes]
            subjects = [v.subject or "" for v in call.votes]
            verified = bool(call.votes) and all(v.verified for v in call.votes)
        else:
            scope = remember
            by = [who.identity] if who.identity is not None else []
            admitted = [governance.entries_of(who, governance.lists(self.spec, call))]
            subjects = [who.subject or ""]
            verified = who.verified
        if scope is None or not by:
            return None
        return grants.make(
            state,
            call,
            scope,
            granted_by=by,
            admitted=admitted,
            subjects=subjects,
            verified=verified,
            now=now,
        )

    def approved(self, call: CallState, who: Who) -> None:
        """Keep who approved ``call``'s coming run, and the input they approved: the tool
        activity checks both against the worker's own gate just before the tool runs."""
        if governance.quorum(self.spec, call) > 1:
            call.approved_by = [[v.identity, *v.groups] for v in call.votes]
        else:
            call.approved_by = [governance.entries_of(who, governance.lists(self.spec, call))]
        call.approved_digest = input_digest(call.args)

    def grantors_admit(self, grant: Grant, call: CallState) -> bool:
        """Whether ``grant``'s grantors could approve ``call`` themselves now: as many as its
        quorum are admitted by each of its approver lists, as they stand for this call (a
        policy's ask may name others, a worker may have narrowed its lists since)."""
        spec = self.spec
        held = governance.held_by(spec, call)
        needed = held[1] if held else 1
        among = governance.held_lists(spec, call)
        entries = grant.admitted or [[g] for g in grant.granted_by]
        subjects = grant.subjects or [""] * len(entries)
        requester = call.requester if governance.duties_separated_when_held(spec, call) else None
        count = 0
        for identity, entry, subject in zip(grant.granted_by, entries, subjects, strict=False):
            if requester is not None and (
                identity == requester.identity or (subject != "" and subject == requester.subject)
            ):
                continue  # the grantor asked for this call: they decide nothing about it
            count += governance.entries_admit(entry, among)
        return count >= needed

    def apply_to_pending(self, grant: Grant, *, now: datetime) -> list[CallState]:
        """A new grant answers the pending calls it matches, each with its own record."""
        spec = self.spec
        taken = []
        for call in self.lifecycle.pending():
            if call.source != "approval":
                continue
            admits = lambda g, call=call: self.grantors_admit(g, call)  # noqa: E731  # bound per call
            if grants.find([grant], call, spec=spec, now=now, admits=admits) is None:
                continue
            self.lifecycle.restart(call, grants.let_through_metadata(grant))
            call.granted = grant.id
            call.approved_by = list(grant.admitted) or [[g] for g in grant.granted_by]
            call.approved_digest = input_digest(call.args)
            self.granted(call, grant)
            taken.append(call)
        return taken

    def find_grant(
        self, call: CallState, *, now: datetime, budget: answers.SchemaBudget | None = None
    ) -> Grant | None:
        """The grant in force that lets a call the gate holds run unasked (None: it pauses)."""
        state = self._state()
        if state is None or not state.grants:
            return None
        return grants.find(
            state.grants,
            call,
            spec=self.spec,
            now=now,
            admits=lambda g: self.grantors_admit(g, call),
            budget=budget,
        )

    def let_through(self, call: CallState, grant: Grant) -> None:
        """Run a call the gate holds as approved by ``grant``, recorded as such."""
        call.resumed = True
        call.resumed_metadata = grants.let_through_metadata(grant)
        call.granted = grant.id
        call.approved_by = list(grant.admitted) or [[g] for g in grant.granted_by]
        call.approved_digest = input_digest(call.args)
        self.granted(call, grant)

    def granted(self, call: CallState, grant: Grant) -> None:
        grant.uses += 1
        self.lifecycle.answered(
            call,
            kind="granted",
            via="grant",
            decision="approved",
            identity=grant.granted_by[0] if grant.granted_by else None,
            verified=grant.verified,
            metadata=None,
            grant=grant.id,
            granted_by=list(grant.granted_by),
        )

    def stale(self, call: CallState, *, now: datetime) -> str | None:
        """Why a ready, approved call may no longer run (None: it may); see
        :func:`workflows.grants.stale`."""
        state = self._state()
        if call.approved_digest is not None and input_digest(call.args) != call.approved_digest:
            return "its input is not the one that was approved"
        return grants.stale(call, state.grants if state else [], now=now)

    def void(self, call: CallState, reason: str, *, now: datetime) -> None:
        """An approval that no longer holds: recorded (``voided``, ``stale``), and the call
        pauses again for a fresh one; nothing runs."""
        grant = call.granted
        self.lifecycle.answered(
            call,
            kind="voided",
            via="recheck",
            decision="stale",
            identity=None,
            verified=False,
            metadata={"reason": reason},
            grant=grant,
        )
        call.resumed = False
        call.resumed_metadata = {}
        call.granted = None
        call.approved_by = None
        call.approved_digest = None
        decision = governance.gate_decision(self.spec, call.name)
        metadata = {**gate_metadata(call.name, decision), "reason": "stale", "stale": reason}
        self._pause(call, source="approval", metadata=metadata, now=now)

    # -- the policy set's decisions (activities.policy) ----------------------------------------

    def by_policy(self, call: CallState) -> None:
        """Record that the policy set decided ``call`` by itself: a deny answers it with the
        policy's refusal (nothing runs), an allow lets it run unasked."""
        decided = call.policy
        assert decided is not None and decided.effect != "ask"
        self._record(call, decided, policy_record(decided))
        if decided.effect == "deny":
            self.lifecycle.complete(call, refusal(decided))

    def redecide(self, call: CallState, decided: PolicyDecision) -> bool:
        """A new policy set's decision on a call paused on the last one's: released to run
        when allowed (and no other gate holds it), answered with the refusal when denied, or
        still paused with the new ask's approvers. Released and denied calls each get a record
        with both sets' hashes. Returns whether anything changed."""
        previous = call.policy
        if previous is not None and same_json(
            previous.model_dump(mode="json"), decided.model_dump(mode="json")
        ):
            return False
        call.policy = decided
        record = {
            **policy_record(decided),
            "previous_policy_hash": previous.policy_hash if previous else None,
        }
        if decided.effect == "deny":
            output = refusal(decided)
            self.lifecycle.respond(call, output)
            self._record(call, decided, record, output=output)
        elif decided.effect == "allow" and governance.held_by(self.spec, call) is None:
            self.lifecycle.restart(call, {TOOL_APPROVED: True})
            self._record(call, decided, record)
        else:
            self.lifecycle.reshow(call)
        return True

    def _record(
        self,
        call: CallState,
        decided: PolicyDecision,
        metadata: JsonObject,
        *,
        output: JsonObject | None = None,
    ) -> None:
        """The audit record of a call the policy set allowed or denied by itself."""
        self.lifecycle.answered(
            call,
            kind="policy",
            via="policy",
            decision="denied" if decided.effect == "deny" else "approved",
            identity=POLICY_IDENTITY,
            verified=False,
            metadata=metadata,
            output=output,
        )


def refusal(decided: PolicyDecision) -> JsonObject:
    """What the model is told of a call the policy set denied."""
    return {
        "error": "denied by policy",
        "reason": cut_stored(decided.reason or "a policy forbids this call", 400),
    }


def policy_record(decided: PolicyDecision) -> JsonObject:
    """What a record or a paused call keeps of a policy's decision: the set's hash, the
    policies that decided, and the reason."""
    kept: JsonObject = {"policy_hash": decided.policy_hash, "policy_ids": decided.policy_ids[:8]}
    if decided.reason:
        kept["reason"] = cut_stored(decided.reason, 400)
    return kept

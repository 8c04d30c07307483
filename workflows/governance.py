"""Approval governance: who may answer a paused call, how many must, and the tokens they spend.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Every decision of who may answer lives here: the approver list of a call (the ToolApproval
gate's, or an interrupt-only tool's own), groups (only from a verified identity), the quorum
and its votes, whether an edit still needs the gate, and identity tokens (verified, each spent
once per conversation, see :mod:`workflows.tokens`). Adding an approver list means changing
:func:`approvers` and :func:`could_answer` here; what a caller is shown follows from them.

Functions over plain data (the agent's spec, the calls, the spent-token list, which
:func:`who`'s callers spend into): no Temporal imports, unit-tested in milliseconds, identical
on replay. The time is always the workflow's, passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from temporal_agent_interrupts.workflows import events
from temporal_agent_interrupts.workflows.answers import ResumeError, entries, is_edit, restart_input
from temporal_agent_interrupts.workflows.identity import (
    AnswerBinding,
    IdentityError,
    VerifiedIdentity,
    verify_token,
)
from temporal_agent_interrupts.workflows.input_rounds import shown_digest
from temporal_agent_interrupts.workflows.limits import Refused, names_within
from temporal_agent_interrupts.workflows.state import (
    CallState,
    SpentToken,
)
from temporal_agent_interrupts.workflows.tokens import (
    MAX_SPENT_TOKENS,
    MAX_TOKEN_LIFE,
    TokenFacts,
    has_room,
    is_spent,
    spend,
)
from temporal_agent_interrupts.workflows.types import (
    TOOL_APPROVED,
    AgentSpec,
    AnswerKind,
    Decision,
    GateDecision,
    GrantScope,
    JsonObject,
    PolicyDecision,
    ResumeInput,
    TrustSpec,
    Vote,
    answer_digest,
    input_digest,
    remember_digest,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

GROUP_PREFIX = "group:"
"""An approver that names a group (its members come from a verified token's groups claim)."""

REQUEST_APPROVERS_BYTES = 1024
"""What one pending call's approver list may take wherever it is shown (the rest counted)."""

MAX_ENTRIES = 5
"""Approver entries kept for one grantor (their identity and the groups that admitted them)."""

VOTE_BYTES = 5 * 1024
"""What one kept vote may take as stored JSON (a 256-byte identity, its time and flag, the
grant it asks for, and the group entries that admitted it)."""


@dataclass(frozen=True)
class Who:
    """Who sent an answer: verified from an identity token, or as the caller asserts it."""

    identity: str | None
    verified: bool = False
    groups: tuple[str, ...] = ()
    # The token this answer spends (see ConversationState.spent_tokens, workflows.tokens).
    spent: TokenFacts | None = None
    # A verified identity's account (the token's ``sub``).
    subject: str | None = None
    # The one answer the token was made for, when it says (the web app's login exchange).
    binding: AnswerBinding | None = None
    # The trusted key that verified the token (its kid), for the decision's receipt.
    token_key_id: str | None = None

    def may_answer(self, approvers: Collection[str]) -> bool:
        """Whether an approver list admits this sender (empty: anyone). Groups count only
        when verified: an asserted identity has no groups."""
        if not approvers:
            return True
        person = self.identity is not None and not self.identity.startswith(GROUP_PREFIX)
        if person and self.identity in approvers:
            return True
        return self.verified and any(f"{GROUP_PREFIX}{g}" in approvers for g in self.groups)


# -- who may answer a call ---------------------------------------------------------------------


def approvers(spec: AgentSpec | None, call: CallState) -> list[str]:
    """Who may answer ``call`` (empty: anyone): the gate's approvers for a call it paused (a
    policy's ask's, when it names any: see :func:`held_by`), the tool's own for an
    interrupt-only tool."""
    if spec is None:
        return []
    # A server's form on a gated tool's call is answered by whom its gate admits: the form's
    # data goes to the tool (a payee to confirm), as much a decision as the approval. One
    # answer settles it (a form is data, not a vote: see quorum).
    if call.source in ("approval", "input") or _gated_tool(spec, call):
        held = held_by(spec, call)
        return held[0] if held else []
    tool = spec.tool(call.name)
    return tool.approvers if tool is not None and call.source == "interrupt" else []


def shown_approvers(spec: AgentSpec | None, call: CallState) -> tuple[list[str], int]:
    """``call``'s approvers as every pending call shows them (in results, queries, the memo
    and the stream), within :data:`REQUEST_APPROVERS_BYTES`, and how many were left out."""
    allowed = approvers(spec, call)
    shown = names_within(allowed, REQUEST_APPROVERS_BYTES)
    return shown, len(allowed) - len(shown)


def quorum(spec: AgentSpec | None, call: CallState) -> int:
    """How many distinct approvals settle ``call`` (a denial settles it at once)."""
    if spec is None:
        return 1
    if call.source in ("approval", "input") or _gated_tool(spec, call):
        # A server's form on a gated call is settled as its approval was: by the quorum, each
        # giving the same answer (check_votes), so no one approver names what the call sends.
        held = held_by(spec, call)
        return held[1] if held else 1
    tool = spec.tool(call.name)
    return tool.quorum if tool is not None and call.source == "interrupt" else 1


def _gated_tool(spec: AgentSpec, call: CallState) -> bool:
    """A gated tool that raised an interrupt itself: its answer may carry the gate's
    approval (``tool_approved``), so the gate's approvers and quorum apply."""
    gate = spec.approval
    return call.source == "tool" and gate is not None and call.name not in gate.allow


def gate_of(spec: AgentSpec, name: str) -> tuple[list[str], int] | None:
    """The approvers and quorum of the gates that hold calls of tool ``name``, or None if none
    does: the agent's ToolApproval (for a tool not in its ``allow``), the tool's own gate (an
    MCP tool's, decided from its annotations and lists when it was listed), or both. Where both
    hold, the stricter of each: the toolset's approvers when it names any (the narrower, more
    specific rule), else the agent's, and the larger quorum; neither gate's rules are dropped."""
    approval = spec.approval
    agent = (
        (approval.approvers, approval.quorum) if approval and name not in approval.allow else None
    )
    tool = spec.tool(name)
    own = (
        (tool.approvers, tool.quorum)
        if tool is not None and tool.gate is not None and tool.gate.gated
        else None
    )
    if agent is None or own is None:
        return agent or own
    return (own[0] or agent[0]), max(own[1], agent[1])


def policy_ask(call: CallState) -> PolicyDecision | None:
    """The policy set's ask on ``call``, if that is what it decided."""
    decided = call.policy
    return decided if decided is not None and decided.effect == "ask" else None


def held_by(spec: AgentSpec | None, call: CallState) -> tuple[list[str], int] | None:
    """The approvers and quorum of everything that holds ``call`` until someone approves it:
    the gates of its tool (:func:`gate_of`) and the policy set's ask, or None if nothing does.

    Combined the strict way: the larger quorum; the ask's approvers when it names any (what
    is shown, and checked first), and an answer must also be admitted by the gate's own list
    when that names any (:func:`admitted`)."""
    gate = gate_of(spec, call.name) if spec is not None else None
    ask = policy_ask(call)
    if ask is None:
        return gate
    if gate is None:
        return list(ask.approvers), ask.quorum
    return (list(ask.approvers) or gate[0]), max(ask.quorum, gate[1])


def lists(spec: AgentSpec | None, call: CallState) -> list[list[str]]:
    """Every approver list that must admit an answer to ``call`` (each non-empty): the one
    :func:`approvers` shows, and the gate's when a policy's ask shows its own."""
    if call.source in ("approval", "input") or (spec is not None and _gated_tool(spec, call)):
        return held_lists(spec, call)
    shown = approvers(spec, call)
    return [shown] if shown else []


def held_lists(spec: AgentSpec | None, call: CallState) -> list[list[str]]:
    """The approver lists of what holds ``call`` (:func:`held_by`), each non-empty, whatever
    it is paused on now (a grant asks this of a call not paused yet)."""
    held = held_by(spec, call)
    found = [held[0]] if held and held[0] else []
    gate = gate_of(spec, call.name) if spec is not None else None
    if policy_ask(call) is not None and gate is not None and gate[0] and gate[0] not in found:
        found.append(gate[0])
    return found


def entries_of(who: Who, among: list[list[str]]) -> list[str]:
    """The approver entries that admit ``who`` in any of ``among``: their identity, and each
    ``group:NAME`` a verified token's groups give them that a list names (kept with a grant,
    so its grantors can be checked again against the lists of a later call)."""
    found = [who.identity] if who.identity is not None else []
    if who.verified:
        named = {a for allowed in among for a in allowed if a.startswith(GROUP_PREFIX)}
        mine = sorted(f"{GROUP_PREFIX}{g}" for g in who.groups if f"{GROUP_PREFIX}{g}" in named)
        # First one entry for each list that admits them (at most two lists: a policy's ask
        # and the gate's), so the cut below never drops the only one a list knows: the tool
        # activity checks the gate's list alone, and an approval it could not place would be
        # voided (stale) at every run, however often it is given again.
        kept: list[str] = []
        for allowed in among:
            if any(e in allowed for e in [*found, *kept]):
                continue
            first = next((g for g in mine if g in allowed), None)
            if first is not None:
                kept.append(first)
        found.extend([*kept, *(g for g in mine if g not in kept)])
    return found[:MAX_ENTRIES]


def entries_admit(entries: list[str], among: list[list[str]]) -> bool:
    """Whether a grantor, by the entries that admitted them, is admitted by every list."""
    return all(any(e in allowed for e in entries) for allowed in among if allowed)


def admitted(spec: AgentSpec | None, call: CallState, who: Who) -> bool:
    """Whether every approver list of ``call`` admits ``who``."""
    return all(who.may_answer(allowed) for allowed in lists(spec, call))


def gate_decision(spec: AgentSpec | None, name: str) -> GateDecision | None:
    """What holds a call of an MCP tool (shown on its interrupt, kept in its audit record);
    None for other tools, whose gate is the agent's ToolApproval and says so in its message."""
    tool = spec.tool(name) if spec else None
    if spec is None or tool is None or tool.gate is None:
        return None
    if spec.approval is not None and name not in spec.approval.allow:
        return GateDecision(gated=True, reason="agent", detail="ToolApproval")
    return tool.gate


def gate_holds(spec: AgentSpec | None, call: CallState) -> bool:
    """Whether a gate (the ToolApproval, or an MCP tool's own) holds a ready call until someone
    approves it."""
    if spec is None or held_by(spec, call) is None:
        return False
    if call.edit_passes_gate is not None:
        # Edited: the gate decides afresh, for the edited input (see edit_passes_gate).
        return not call.edit_passes_gate
    return not (call.resumed and call.resumed_metadata.get(TOOL_APPROVED) is True)


def edit_passes_gate(spec: AgentSpec | None, call: CallState, *, approved: bool, who: Who) -> bool:
    """Whether an edited call runs without the gate pausing it again: only as an approval the
    gate itself would take (approvals of the old input do not carry over)."""
    held = held_by(spec, call) if spec else None
    if held is None:
        return True
    _, needed = held
    return (
        approved
        and needed <= 1
        and all(who.may_answer(allowed) for allowed in held_lists(spec, call))
    )


# -- who sent an answer ------------------------------------------------------------------------


def who(
    resume: ResumeInput,
    *,
    spec: AgentSpec | None,
    spent: list[SpentToken],
    now: datetime | None,
) -> Who:
    """Who sent ``resume``: the identity its token proves when the agent verifies identity
    (``trust``), else the identity it asserts.

    Args:
        spent: The conversation's spent tokens (read only: the answer spends its token when
            it is applied).
        now: The workflow's time, which a token's expiry is checked against.

    Raises:
        ResumeError: the agent verifies identity and the token is missing, invalid,
            expired, from a key it does not trust, already spent here, or names someone
            other than ``identity``; or a token came for an agent that verifies none.
    """
    trust = spec.trust if spec else None
    token = resume.identity_token
    if trust is None:
        if token is not None:
            raise ResumeError(
                "this agent does not verify identity tokens: leave out identity_token and "
                "say who you are with identity",
                code="forbidden",
            )
        return Who(identity=resume.identity)
    if token is None:
        raise ResumeError(
            f"this agent verifies who answers: send identity_token, a JWT from "
            f"{trust.issuer} for audience {trust.audience}",
            code="forbidden",
        )
    if now is None:
        raise ResumeError("identity tokens cannot be checked here")  # never in the workflow
    try:
        verified = verified_person(token, trust, now=now)
    except Refused as e:
        raise ResumeError(e.reason, code=e.code) from None
    if verified.send is not None:
        # Made by the web app for one message of its sender: an answer with it would let
        # whoever reads the send in history answer as the requester.
        raise ResumeError(
            "the identity token was made for sending a message: it answers nothing; each "
            "answer needs a token of its own",
            code="forbidden",
        )
    try:
        facts = spendable(verified, asserted=resume.identity, spent=spent, now=now, by="answer")
    except Refused as e:
        raise ResumeError(e.reason, code=e.code) from None
    return Who(
        identity=verified.identity,
        verified=True,
        groups=verified.groups,
        spent=facts,
        # A fingerprint: a token's sub may be kilobytes, and a vote keeps it.
        subject=_fingerprint(verified.subject),
        binding=verified.binding,
        token_key_id=verified.key_id,
    )


def verified_person(token: str, trust: TrustSpec, *, now: datetime) -> VerifiedIdentity:
    """The person a token proves, under ``trust``: what an answer's or a message's token is
    checked for first.

    Raises:
        Refused: ``forbidden``: the token is not valid here, or it names a group (an identity
            may not begin with ``group:``), never quoting the token.
    """
    try:
        verified = verify_token(token, trust, now=now)
    except IdentityError as e:
        raise Refused(f"identity token refused: {e.reason}", code="forbidden") from None
    if verified.identity.startswith(GROUP_PREFIX):
        raise Refused(
            f"the identity token names {verified.identity!r}: an identity may not begin "
            f"with {GROUP_PREFIX!r}, which names a group",
            code="forbidden",
        )
    return verified


def spendable(
    verified: VerifiedIdentity,
    *,
    asserted: str | None,
    spent: list[SpentToken],
    now: datetime,
    by: Literal["answer", "message"],
) -> TokenFacts:
    """The checks a verified token passes before an answer or a message spends it here: the
    identity it carries beside it is the token's own, the token was not used here before, it
    lives at most a day (every token is remembered until it expires, so their number stays
    bounded), and the spent book has room for its account. Returns what it leaves in the book.

    Raises:
        Refused: ``forbidden``, saying which, never quoting the token.
    """
    if asserted is not None and asserted != verified.identity:
        raise Refused(
            f"identity {asserted!r} does not match the identity token's "
            f"{verified.identity!r}: leave out identity, or send your own token",
            code="forbidden",
        )
    facts = token_facts(verified)
    if is_spent(spent, facts):
        used = "used or offered to answer" if by == "answer" else "used"
        raise Refused(
            f"this identity token was already {used} in this conversation: each {by} needs a "
            "fresh token (the one used is in the conversation's history)",
            code="forbidden",
        )
    if verified.expires - now > MAX_TOKEN_LIFE:
        raise Refused(
            "the identity token is valid for more than a day: use a short-lived token "
            "(minutes), as identity providers issue for this",
            code="forbidden",
        )
    if not has_room(spent, facts, now=now):
        done = "answered here with" if by == "answer" else "used"
        raise Refused(
            f"{MAX_SPENT_TOKENS} different accounts have {done} identity tokens here not yet "
            "expired: try again once the oldest have expired",
            code="forbidden",
        )
    return facts


def check_binding(
    resume: ResumeInput,
    pending: dict[str, CallState],
    *,
    who: Who,
    chats: Collection[str],
) -> None:
    """Check that a token made for one answer (``who.binding``) is used for that answer: sent
    to the chat it names (or through it: a sub-agent's ``chats`` include its caller's), for
    calls it names, whose input is the one it names, remembering (a grant) only the scope it
    names for that call. A token that names no answer may answer
    anything (an identity provider's own, made for the person, not the answer).

    Raises:
        ResumeError: the token was made for another chat, another call, or another input.
    """
    binding = who.binding
    if binding is None:
        return
    if binding.chat not in chats:
        raise ResumeError(
            "the identity token was made for an answer in another conversation: it answers "
            "only there",
            code="forbidden",
        )
    for _kind, name, ref in entries(resume):
        shown = binding.digest_of(ref)
        if shown is None:
            raise ResumeError(
                f"the identity token was made for other calls than {name!r} (ref {ref!r}): "
                "it answers only those",
                code="forbidden",
            )
        if shown != shown_digest(pending[ref]):
            raise ResumeError(
                f"the identity token was made for another input of {name!r} (ref {ref!r}) "
                "than it has now (it was edited since): answer the input it has now",
                code="conflict",
            )
    for r in resume.restart:
        # The grant an approval makes is the approver's choice as much as the call is: a copy
        # of the token (read in flight, or from a caller's history on its way to a sub-agent)
        # must not widen "this call" into "every call of the tool". Asking for less (no
        # grant) only narrows.
        if r.remember is not None and binding.remember_of(r.ref) != remember_digest(r.remember):
            raise ResumeError(
                f"the identity token was made for an answer to {r.name!r} (ref {r.ref!r}) that "
                "remembers "
                f"{'another scope' if binding.remember_of(r.ref) else 'nothing'}: it grants "
                "only what the approver chose",
                code="forbidden",
            )
    if binding.answers:
        # The answer itself is the approver's choice too: a copy of an approval's token must
        # not deny, nor a denial's approve, nor either respond with other data.
        try:
            given: list[tuple[str, str, str]] = [
                (r.name, r.ref, answer_digest(r)) for r in [*resume.respond, *resume.restart]
            ]
        except (ValueError, RecursionError):  # parse_resume refuses these first; never a crash
            raise ResumeError("the answer cannot be written as JSON") from None
        for name, ref, digest in given:
            if binding.answer_of(ref) != digest:
                raise ResumeError(
                    f"the identity token was made for another answer to {name!r} (ref "
                    f"{ref!r}): it gives only the answer the approver chose",
                    code="forbidden",
                )


def check_approvers(
    resume: ResumeInput, pending: dict[str, CallState], *, spec: AgentSpec | None, who: Who
) -> None:
    """Check that ``who`` may answer every call the resume answers."""
    for _kind, name, ref in entries(resume):
        call = pending[ref]
        needed = lists(spec, call)
        if not admitted(spec, call, who):
            allowed = [a for each in needed for a in each]
            sender = repr(who.identity) if who.identity else "an answer with no identity"
            groups = " (groups count only from a verified identity token)"
            unverified = not who.verified and any(a.startswith(GROUP_PREFIX) for a in allowed)
            # Two lists (a policy's ask and the gate's): an answer needs one of each.
            who_may = " and also by one of ".join(", ".join(each) for each in needed)
            raise ResumeError(
                f"{name!r} (ref {ref!r}) may be answered only by {who_may}; "
                f"{sender} may not answer it{groups if unverified else ''}",
                code="forbidden",
            )


# -- separation of duties ----------------------------------------------------------------------


def duties_separated(spec: AgentSpec | None, call: CallState) -> bool:
    """Whether ``call``'s requester is kept from answering it: the gate that paused it (the
    agent's ToolApproval) or its interrupt-only tool says ``separate_duties``."""
    if spec is None:
        return False
    tool = spec.tool(call.name)
    if call.source == "approval" or _gated_tool(spec, call):
        gate = spec.approval
        by_gate = gate is not None and call.name not in gate.allow and gate.separate_duties
        return by_gate or (tool is not None and tool.separate_duties)
    return call.source == "interrupt" and tool is not None and tool.separate_duties


def duties_separated_when_held(spec: AgentSpec | None, call: CallState) -> bool:
    """Whether a gate that holds ``call`` (paused or not yet) separates duties: what a grant
    asks of a call before it lets it through."""
    if spec is None:
        return False
    tool = spec.tool(call.name)
    gate = spec.approval
    by_gate = gate is not None and call.name not in gate.allow and gate.separate_duties
    return by_gate or (tool is not None and tool.separate_duties)


def check_duties(
    resume: ResumeInput, pending: dict[str, CallState], *, spec: AgentSpec | None, who: Who
) -> None:
    """Check that ``who`` did not send the message whose turn raised a call it answers, where
    duties are separated (:func:`duties_separated`): the same identity, or the same verified
    account (``subject``) under another spelling. Every kind of answer counts (an approval, a
    denial, an edit, a vote): the requester decides nothing about their own request.

    Only as strong as the identities: with asserted ones (no ``trust``) anyone may say they
    are someone else, so this is advisory there (docs/governance.md).
    """
    for _kind, name, ref in entries(resume):
        call = pending[ref]
        requester = call.requester
        if requester is None or not duties_separated(spec, call):
            continue
        same = who.identity is not None and who.identity == requester.identity
        account = who.subject is not None and who.subject == requester.subject
        if same or account:
            raise ResumeError(
                f"{name!r} (ref {ref!r}) was raised by a message {requester.identity!r} sent, "
                "and this tool separates duties: someone else must answer it",
                code="forbidden",
            )


# -- quorum and votes --------------------------------------------------------------------------


def check_votes(
    resume: ResumeInput, pending: dict[str, CallState], *, spec: AgentSpec | None, who: Who
) -> None:
    """Check each answer to a call that needs a quorum: an approval or a denial (or an edit),
    a restart when it approves a tool's run, from someone named who has not voted yet."""
    said: list[tuple[AnswerKind, str, str, JsonObject | None, JsonObject | None]] = []
    said.extend(("respond", r.name, r.ref, r.output, None) for r in resume.respond)
    said.extend(("restart", r.name, r.ref, None, r.resumed_metadata) for r in resume.restart)
    for kind, name, ref, output, metadata in said:
        call = pending[ref]
        needed = quorum(spec, call)
        if needed <= 1:
            continue
        edit = kind == "restart" and is_edit(spec, call, restart_input(resume, ref))
        decision = events.decision(call, kind=kind, output=output, metadata=metadata)
        if call.source == "input" and decision == "answered":
            differs = [v.identity for v in call.votes if v.answer != form_answer(output)]
            if differs:
                raise ResumeError(
                    f"{name!r} (ref {ref!r}) needs {needed} approvers to give the same answer "
                    f"to its server's form, and {', '.join(differs[:3])} answered otherwise: "
                    "give the same answer, or deny it",
                    code="conflict",
                )
        elif not edit and decision not in ("approved", "denied"):
            raise ResumeError(
                f"{name!r} (ref {ref!r}) needs {needed} approvals: answer it with an "
                "approval or a denial (this answer is neither)"
            )
        if decision == "approved" and kind == "respond" and call.source != "interrupt":
            # Its output would stand in for the tool's, so the approval would not run it.
            raise ResumeError(
                f"{name!r} (ref {ref!r}) needs {needed} approvals: approve it with an "
                "approval that runs it (approve() builds it), not by supplying its output"
            )
        if who.identity is None:
            raise ResumeError(
                f"{name!r} (ref {ref!r}) needs {needed} approvals from distinct people: "
                "say who you are (identity)",
                code="forbidden",
            )
        voters = [v.identity for v in call.votes]
        if not edit and voted(call, who):
            raise ResumeError(
                f"{who.identity!r} has already voted on {name!r} (ref {ref!r}); "
                f"{len(voters)} of {needed} approvals so far ({', '.join(voters)})",
                code="conflict",
            )


def vote_bytes(spec: AgentSpec | None, resume: ResumeInput, pending: dict[str, CallState]) -> int:
    """What the resume's votes may add to the turn: a vote is kept with its call until the
    quorum is met."""
    return VOTE_BYTES * sum(1 for *_, ref in entries(resume) if quorum(spec, pending[ref]) > 1)


def vote(
    spec: AgentSpec | None,
    call: CallState,
    decision: Decision,
    who: Who,
    *,
    now: datetime | None,
    remember: GrantScope | None = None,
    output: JsonObject | None = None,
) -> bool:
    """Count an approval of a call that needs a quorum (or an answer to a server's form on
    such a call, ``output``); True while more are needed.

    Args:
        remember: The grant the approval asks for (kept with the vote: a quorum's grant needs
            every approval to ask for the same one, see workflows.grants).
    """
    needed = quorum(spec, call)
    counts = decision == "approved" or (call.source == "input" and decision == "answered")
    if needed <= 1 or not counts or who.identity is None:
        return False
    if voted(call, who):
        return True  # refused by check_votes; never a second vote, never a settled call
    at = now or call.since or EPOCH  # the workflow always passes its time
    call.votes.append(
        Vote(
            identity=who.identity,
            verified=who.verified,
            at=at,
            subject=who.subject,
            remember=remember,
            groups=[e for e in entries_of(who, lists(spec, call)) if e != who.identity],
            answer=form_answer(output) if call.source == "input" else None,
        )
    )
    return len(call.votes) < needed


def form_answer(output: JsonObject | None) -> str:
    """What names one answer to a server's form, for the votes of a quorum to agree on."""
    return input_digest(output or {})


def voted(call: CallState, who: Who) -> bool:
    """Whether ``who`` has voted on ``call``: the same identity, or the same account (a
    verified token's ``sub``) under another spelling."""
    return any(
        v.identity == who.identity or (who.subject is not None and v.subject == who.subject)
        for v in call.votes
    )


# -- tokens ------------------------------------------------------------------------------------


def spend_answer(spent: list[SpentToken], who: Who, *, now: datetime | None) -> None:
    """Remember the token an applied answer used until it can no longer be accepted (see
    workflows.tokens; :func:`who` has checked there is room)."""
    if who.spent is not None:
        spend(spent, who.spent, now=now or EPOCH)


def spend_refused(
    token: str | None,
    *,
    spec: AgentSpec | None,
    spent: list[SpentToken],
    now: datetime,
) -> None:
    """Spend a valid token whose answer was refused after it reached history (a rejected
    signal, an update its handler refused): its copy there must answer nothing later.

    Only a token that could answer something in this conversation is spent: a token that
    can answer nothing is no threat in history, and spending it would let anyone fill the
    book with their own refused tokens. One whose account an approver list names is kept
    with the accepted answers (each account's share bounded); one that could answer only
    what anyone may answer goes to a pool of its own, oldest forgotten first, so no number
    of accounts takes the room an approver's answer needs (see workflows.tokens)."""
    trust = spec.trust if spec else None
    if token is None or trust is None:
        return
    try:
        verified = verify_token(token, trust, now=now)
    except IdentityError:
        return  # it could not answer anything anyway
    could = could_answer(spec, verified)
    if verified.expires - now > MAX_TOKEN_LIFE or could is None:
        return  # refused for good (too long-lived), or nothing here it could answer
    spend(spent, token_facts(verified), now=now, offered=could == "anyone")


def could_answer(
    spec: AgentSpec | None, verified: VerifiedIdentity
) -> Literal["named", "anyone"] | None:
    """What the account a token proves could answer of the interrupts this agent can raise
    (a call the gate pauses, an interrupt-only tool, a tool that raises one): one whose
    approver list admits it (``"named"``), only ones anyone may answer, or none."""
    if spec is None:
        return None
    sender = Who(identity=verified.identity, verified=True, groups=verified.groups)
    lists: list[list[str]] = []
    for tool in spec.tools:
        held = None if tool.interrupt_only else gate_of(spec, tool.name)
        if tool.interrupt_only:
            lists.append(tool.approvers)
        elif held is not None:
            lists.append(held[0])
        else:
            lists.append([])  # a tool that may raise an interrupt: anyone may answer it
    if any(allowed and sender.may_answer(allowed) for allowed in lists):
        return "named"
    return "anyone" if any(not allowed for allowed in lists) else None


def token_facts(verified: VerifiedIdentity) -> TokenFacts:
    """What a verified token leaves in the spent book: what it signs, its account (``sub``, or
    the identity it names) and until when it could be accepted."""
    account = _fingerprint(verified.subject or verified.identity) or ""
    return TokenFacts(
        digest=verified.digest, subject=account, until=verified.expires, issued=verified.issued
    )


def fingerprint(subject: str | None) -> str | None:
    """What names an account (a token's ``sub``) in votes and requesters: 32 hex digits of its
    SHA-256 (a ``sub`` may be kilobytes)."""
    return _fingerprint(subject)


def _fingerprint(subject: str | None) -> str | None:
    return hashlib.sha256(subject.encode()).hexdigest()[:32] if subject is not None else None

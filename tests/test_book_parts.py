"""The interrupt book's parts, each on its own and without a server: the call lifecycle
(workflows.calls), resume checks (workflows.answers), governance (workflows.governance) and
deadline policy (workflows.deadlines); and the turn machine's one book per turn."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from temporal_agent_interrupts import interrupt, tool
from temporal_agent_interrupts.workflows import Agent, ToolApproval, answers, deadlines, governance
from temporal_agent_interrupts.workflows.answers import ResumeError
from temporal_agent_interrupts.workflows.calls import Lifecycle
from temporal_agent_interrupts.workflows.governance import VOTE_BYTES, Who
from temporal_agent_interrupts.workflows.identity import verify_token
from temporal_agent_interrupts.workflows.limits import json_size
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
    TurnState,
)
from temporal_agent_interrupts.workflows.turn import TurnMachine
from temporal_agent_interrupts.workflows.types import (
    ErrorInfo,
    InterruptRequest,
    InterruptSource,
    TurnEvent,
    Vote,
    input_digest,
    timed_out_output,
)
from tests.agents import Answer, Ask, assistant

# The governance book tests' agent parts: the same tools, issuer and clock.
from tests.test_governance_book import ISSUER, NOW, Target, deploy, officers, resume


@tool("status", "Read-only.")
async def status(inp: Target) -> dict[str, str]:
    return {}


ask = interrupt(
    "ask",
    "Anyone answers.",
    input=Ask,
    output=Answer,
    timeout=timedelta(minutes=30),
    on_timeout=Answer(approved=True),
)

gov = Agent(
    "gov",
    tools=[officers, ask, deploy, status],
    middleware=[ToolApproval(allow=["status"], approvers=["ops@x"])],
    trust=ISSUER.trust(),
    interrupt_timeout=timedelta(hours=1),
    on_interrupt_timeout="cancel",
)
SPEC = gov.spec()


def call(
    name: str, ref: str, *, source: InterruptSource | None = None, **args: object
) -> CallState:
    c = CallState(ref=ref, name=name, args=dict(args))
    if source is not None:
        c.status = "pending"
        c.source = source
        c.since = NOW
    return c


def refused(fn: Callable[..., object], *args: object, **kw: object) -> str:
    with pytest.raises(ResumeError) as e:
        fn(*args, **kw)
    return e.value.reason


# --------------------------------------------------------------------------------------------
# The call lifecycle: each transition's status and the turn event it emits.


class Seen:
    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def __call__(self, event: TurnEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(e.kind, e.ref) for e in self.events]


def vote(identity: str) -> Vote:
    return Vote(identity=identity, verified=False, at=NOW)


def lifecycle(*calls: CallState) -> tuple[Lifecycle, Seen]:
    seen = Seen()
    shown = InterruptRequest(name="shown", ref="shown")
    return Lifecycle(list(calls), emit=seen, show=lambda _: shown), seen


def test_request_pause_answer_settle_emit_in_order():
    life, seen = lifecycle()
    a, b = call("ask", "r1"), call("deploy", "r2")
    life.request([a, b])
    assert [c.status for c in life.calls] == ["ready", "ready"]
    deadline = NOW + timedelta(hours=1)
    a.votes, a.reminded = [vote("z@x")], 3  # stale, from an earlier pause
    life.pause(a, source="interrupt", metadata={"m": 1}, now=NOW, deadline=deadline)
    assert (a.status, a.deadline, a.votes, a.reminded, a.since) == (
        "pending",
        deadline,
        [],
        0,
        NOW,
    )
    assert seen.events[-1].interrupt is not None and seen.events[-1].interrupt.name == "shown"
    assert life.pending() == [a] and life.waiting() == [a] and not life.all_answered()
    life.respond(a, {"approved": True})
    life.pause(b, source="approval", metadata={}, now=NOW, deadline=None)
    life.restart(b, {"tool_approved": True})
    assert life.all_answered() and life.waiting() == [a, b]
    life.settle()
    assert (a.status, a.output) == ("done", {"approved": True})
    assert (b.status, b.resumed, b.resumed_metadata) == ("ready", True, {"tool_approved": True})
    assert seen.kinds() == [
        ("tool_request", "r1"),
        ("tool_request", "r2"),
        ("interrupt", "r1"),
        ("interrupt", "r2"),
        ("tool_response", "r1"),  # a restart has its response when it runs again
    ]


def test_an_edit_keeps_the_models_input_and_drops_the_votes():
    life, _ = lifecycle()
    c = call("deploy", "d1", source="approval", service="web")
    c.votes = [vote("a@x")]
    life.edit(c, {"service": "api"}, passes_gate=False)
    life.edit(c, {"service": "db"}, passes_gate=True)
    assert (c.args, c.original_args, c.votes, c.edit_passes_gate) == (
        {"service": "db"},
        {"service": "web"},
        [],
        True,
    )


def test_expire_falls_back_to_the_stated_answer_when_the_default_does_not_fit():
    a, b = call("ask", "r1", source="interrupt"), call("ask", "r2", source="interrupt")
    life, seen = lifecycle(a, b)
    rooms = iter([10**6, 0])
    expired = life.expire([a, b], output=lambda _: {"approved": True}, room=lambda: next(rooms))
    assert expired == [a, b]
    assert (a.answer_output, b.answer_output) == ({"approved": True}, timed_out_output())
    assert [(e.kind, e.answer.kind if e.answer else None) for e in seen.events] == [
        ("answer", "deadline"),
        ("answer", "deadline"),
    ]


def test_escalate_extends_the_deadline_once_and_says_so():
    c = call("officers", "o1", source="interrupt")
    c.deadline = NOW
    life, seen = lifecycle(c)
    life.escalate(c, extend=timedelta(hours=2))
    assert (c.escalated, c.deadline) == (True, NOW + timedelta(hours=2))
    assert seen.kinds() == [("interrupt", "o1")]


def test_cancel_withdraws_every_unfinished_call_and_says_a_cut_short_run_may_have_run():
    done, failed = call("status", "s1"), call("deploy", "d1")
    pending = call("ask", "r1", source="interrupt")
    life, seen = lifecycle(done, failed, pending)
    life.complete(done, {"ok": True})
    life.fail(failed, ErrorInfo(status="INTERNAL", message="x"), uncertain=True)
    assert life.first_error() == ErrorInfo(status="INTERNAL", message="x")
    assert life.cancel("no") == [failed, pending]
    assert failed.output == {
        "error": "cancelled",
        "reason": "no",
        "note": "stopped while running; it may have taken effect",
    }
    assert pending.output == {"error": "cancelled", "reason": "no"}
    assert seen.kinds()[1:] == [
        ("answer", "d1"),
        ("tool_response", "d1"),
        ("answer", "r1"),
        ("tool_response", "r1"),
    ]


def test_abandon_gives_every_call_of_a_failed_step_a_response():
    failed, answered, ready = (
        call("deploy", "d1"),
        call("ask", "r1", source="interrupt"),
        call("status", "s1"),
    )
    life, seen = lifecycle(failed, answered, ready)
    life.fail(failed, ErrorInfo(status="UNAVAILABLE", message="down"), uncertain=False)
    life.respond(answered, {"approved": False})
    life.abandon(ErrorInfo(status="UNAVAILABLE", message="down"))
    assert [c.output for c in life.calls] == [
        {"error": "UNAVAILABLE: down"},
        {"approved": False},
        {"error": "not run: the turn failed first", "status": "UNAVAILABLE"},
    ]
    assert [k for k, _ in seen.kinds()] == ["tool_response"] * 3


# --------------------------------------------------------------------------------------------
# Resume checks: shape, match, schema fit, the turn's byte budget.


@pytest.mark.parametrize(
    ("raw", "size", "expected"),
    [
        ([], None, "must be a JSON object"),
        ({"respond": [{"name": "a", "ref": "r", "output": {}, "outptu": 1}]}, None, "unknown"),
        ({"respond": "x"}, None, "malformed resume: respond"),
        ({}, 10**9, "resume"),
        ({"metadata": {"x": "y" * 20_000}}, None, "metadata"),
    ],
)
def test_parse_resume_refuses_what_is_not_a_well_formed_resume(raw, size, expected):
    assert expected in refused(answers.parse_resume, raw, size=size)


def test_check_match_names_what_is_wrong_with_the_refs():
    a = call("ask", "r1", source="interrupt", question="q")
    gone = call("ask", "r0")
    gone.status = "done"
    calls = [gone, a]

    def why(**kw: object) -> str:
        return refused(answers.check_match, resume(**kw), calls=calls, known_refs={"old"})

    ok = [{"name": "ask", "ref": "r1", "output": {"approved": True}}]
    assert answers.check_match(resume(respond=ok), calls=calls) == {"r1": a}
    assert "empty resume" in why()
    assert "answered more than once" in why(respond=ok, restart=[{"name": "ask", "ref": "r1"}])
    assert "already answered" in why(respond=[{"name": "ask", "ref": "r0", "output": {}}])
    assert "already answered" in why(respond=[{"name": "ask", "ref": "old", "output": {}}])
    assert "unknown ref 'zz'" in why(respond=[{"name": "ask", "ref": "zz", "output": {}}])
    assert "is a call to 'ask', not 'deploy'" in why(restart=[{"name": "deploy", "ref": "r1"}])
    stale = [{"name": "ask", "ref": "r1", "output": {}, "input_digest": input_digest({"q": 1})}]
    assert "no longer has the input" in why(respond=stale)
    assert "nothing is paused" in refused(
        answers.check_match, resume(respond=ok), calls=[gone], known_refs=()
    )


def test_restarts_edit_only_editable_tools_within_their_schema():
    d = call("deploy", "d1", source="approval", service="web")
    o = call("officers", "o1", source="interrupt", question="q")
    pending = {"d1": d, "o1": o}

    def why(**entry: object) -> str:
        return refused(answers.check_restarts, resume(restart=[entry]), pending, spec=SPEC)

    answers.check_restarts(
        resume(restart=[{"name": "deploy", "ref": "d1", "input": {"service": "api"}}]),
        pending,
        spec=SPEC,
    )
    assert "not declared editable" in why(name="officers", ref="o1", input={"question": "z"})
    assert "input schema" in why(name="deploy", ref="d1", input={"service": 5})
    placeholder = {"omitted": True, "bytes": 9, "sha256": "x"}
    assert "placeholder" in why(name="deploy", ref="d1", input=placeholder)
    # The same input as JSON is no edit: 500 is not 500.0, and an unchanged one is fine.
    assert not answers.is_edit(SPEC, d, {"service": "web"})
    assert answers.is_edit(SPEC, d, {"service": "api"})
    assert not answers.is_edit(SPEC, o, {"question": "z"})  # not editable
    assert not answers.same_json({"n": 500}, {"n": 500.0})


def test_outputs_fit_the_interrupt_only_tools_output_schema():
    a = call("ask", "r1", source="interrupt", question="q")
    bad = resume(respond=[{"name": "ask", "ref": "r1", "output": {"approved": "yes"}}])
    assert "output schema" in refused(answers.check_outputs, bad, {"r1": a}, spec=SPEC)
    good = resume(respond=[{"name": "ask", "ref": "r1", "output": {"approved": True}}])
    answers.check_outputs(good, {"r1": a}, spec=SPEC)


def test_the_byte_budget_counts_outputs_metadata_twice_for_interrupts_edits_and_votes():
    o = call("officers", "o1", source="interrupt", question="q")
    d = call("deploy", "d1", source="approval", service="web")
    pending = {"o1": o, "d1": d}
    r = resume(
        restart=[
            {"name": "officers", "ref": "o1", "resumed_metadata": {"k": "v"}},
            {"name": "deploy", "ref": "d1", "input": {"service": "api"}},
        ]
    )
    adds = json_size({"k": "v"}) * 2 + json_size({}) + json_size({"service": "api"}) + 400
    answers.check_room(r, pending, spec=SPEC, room=adds, vote_bytes=400)
    reason = refused(answers.check_room, r, pending, spec=SPEC, room=adds - 1, vote_bytes=400)
    assert "answer with less, or cancel the turn" in reason


# --------------------------------------------------------------------------------------------
# Governance: who may answer, quorum and votes, tokens.


def test_whose_approver_list_applies_to_a_call():
    assert governance.approvers(SPEC, call("officers", "o1", source="interrupt")) == [
        "a@x",
        "b@x",
        "group:risk",
    ]
    assert governance.approvers(SPEC, call("deploy", "d1", source="approval")) == ["ops@x"]
    # A gated tool that raised an interrupt itself: the gate's list and quorum.
    assert governance.approvers(SPEC, call("deploy", "d1", source="tool")) == ["ops@x"]
    # An allowed tool that raised one: anyone.
    assert governance.approvers(SPEC, call("status", "s1", source="tool")) == []
    assert governance.approvers(None, call("officers", "o1", source="interrupt")) == []
    assert governance.quorum(SPEC, call("officers", "o1", source="interrupt")) == 2
    assert governance.quorum(SPEC, call("officers", "o1", source="tool")) == 1
    assert governance.shown_approvers(SPEC, call("officers", "o1", source="interrupt")) == (
        ["a@x", "b@x", "group:risk"],
        0,
    )


def test_who_may_answer_groups_only_when_verified():
    assert Who("x", verified=True, groups=("risk",)).may_answer(["group:risk"])
    assert not Who("x", groups=("risk",)).may_answer(["group:risk"])
    assert not Who("group:risk", verified=True).may_answer(["group:risk"])
    assert Who(None).may_answer([])
    o = call("officers", "o1", source="interrupt")
    r = resume(respond=[{"name": "officers", "ref": "o1", "output": {"approved": True}}])
    reason = refused(governance.check_approvers, r, {"o1": o}, spec=SPEC, who=Who("z@x"))
    assert "may be answered only by a@x, b@x, group:risk; 'z@x' may not" in reason
    assert "groups count only from a verified identity token" in reason
    governance.check_approvers(r, {"o1": o}, spec=SPEC, who=Who("z@x", True, ("risk",)))


def test_who_verifies_tokens_and_refuses_one_already_spent():
    r = resume(
        respond=[{"name": "ask", "ref": "r1", "output": {}}], identity_token=ISSUER.mint("a@x")
    )
    spent: list = []
    sender = governance.who(r, spec=SPEC, spent=spent, now=NOW)
    assert (sender.identity, sender.verified, sender.spent is not None) == ("a@x", True, True)
    governance.spend_answer(spent, sender, now=NOW)
    assert "already used" in refused(governance.who, r, spec=SPEC, spent=spent, now=NOW)
    untrusted = assistant.spec()
    assert "does not verify identity tokens" in refused(
        governance.who, r, spec=untrusted, spent=[], now=NOW
    )
    asserted = resume(respond=[{"name": "ask", "ref": "r1", "output": {}}], identity="me")
    assert governance.who(asserted, spec=untrusted, spent=[], now=NOW) == Who("me")
    assert "send identity_token" in refused(governance.who, asserted, spec=SPEC, spent=[], now=NOW)


def test_votes_count_distinct_people_until_the_quorum():
    o = call("officers", "o1", source="interrupt")
    pending = {"o1": o}
    approve = resume(respond=[{"name": "officers", "ref": "o1", "output": {"approved": True}}])
    a = Who("a@x", verified=True, subject="sub-a")
    governance.check_votes(approve, pending, spec=SPEC, who=a)
    assert governance.vote(SPEC, o, "approved", a, now=NOW)  # one of two: more needed
    assert "'a@x' has already voted" in refused(
        governance.check_votes, approve, pending, spec=SPEC, who=a
    )
    # The same account under another spelling is the same voter.
    assert governance.voted(o, Who("A@x", verified=True, subject="sub-a"))
    assert not governance.vote(SPEC, o, "approved", Who("b@x"), now=NOW)  # the quorum is met
    assert [v.identity for v in o.votes] == ["a@x", "b@x"]
    assert not governance.vote(SPEC, o, "denied", Who("c@x"), now=NOW)  # a denial settles
    fresh = {"o1": call("officers", "o1", source="interrupt")}
    reason = refused(governance.check_votes, approve, fresh, spec=SPEC, who=Who(None))
    assert "say who you are" in reason
    vague = resume(restart=[{"name": "officers", "ref": "o1", "resumed_metadata": {"x": 1}}])
    assert "this answer is neither" in refused(
        governance.check_votes, vague, pending, spec=SPEC, who=Who("c@x")
    )
    assert governance.vote_bytes(SPEC, approve, pending) == VOTE_BYTES


def test_the_gate_holds_a_call_until_approved_and_decides_again_after_an_edit():
    d = call("deploy", "d1")
    assert governance.gate_holds(SPEC, d)
    assert not governance.gate_holds(SPEC, call("status", "s1"))
    d.resumed, d.resumed_metadata = True, {"tool_approved": True}
    assert not governance.gate_holds(SPEC, d)
    ops, other = Who("ops@x"), Who("x@y")
    assert governance.edit_passes_gate(SPEC, d, approved=True, who=ops)
    assert not governance.edit_passes_gate(SPEC, d, approved=True, who=other)
    assert not governance.edit_passes_gate(SPEC, d, approved=False, who=ops)
    d.edit_passes_gate = False
    assert governance.gate_holds(SPEC, d)


def test_could_answer_and_spend_refused_spend_only_tokens_that_could_answer():
    trust = SPEC.trust
    assert trust is not None
    named = verify_token(ISSUER.mint("ops@x"), trust, now=NOW)
    anyone = verify_token(ISSUER.mint("z@x"), trust, now=NOW)
    assert governance.could_answer(SPEC, named) == "named"
    assert governance.could_answer(SPEC, anyone) == "anyone"  # "ask" takes anyone's answer
    only_named = Agent("only", tools=[officers], trust=ISSUER.trust()).spec()
    assert governance.could_answer(only_named, anyone) is None
    spent: list = []
    governance.spend_refused(ISSUER.mint("z@x"), spec=only_named, spent=spent, now=NOW)
    assert spent == []
    governance.spend_refused(ISSUER.mint("a@x"), spec=only_named, spent=spent, now=NOW)
    governance.spend_refused("not a token", spec=only_named, spent=spent, now=NOW)
    assert len(spent) == 1


# --------------------------------------------------------------------------------------------
# Deadline policy: defaults, reminders, escalation, expiry.


def test_deadlines_come_from_the_tool_else_the_agents_default():
    assert deadlines.deadline_seconds(SPEC, "officers") == 10 * 3600
    assert deadlines.deadline_seconds(SPEC, "deploy") == 3600
    assert deadlines.deadline(SPEC, "deploy", now=NOW) == NOW + timedelta(hours=1)
    assert deadlines.deadline(None, "deploy", now=NOW) is None
    escalate, reminders, cancel = deadlines.policy(SPEC, call("officers", "o1"))
    assert escalate is not None and escalate.extend_seconds == 7200 and not cancel
    assert [r.before_seconds for r in reminders] == [3 * 3600, 3600]  # earliest first
    assert deadlines.policy(SPEC, call("deploy", "d1"))[2]  # the agent's: cancels the turn


def test_due_reminds_then_escalates_then_expires():
    o = call("officers", "o1", source="interrupt")
    o.deadline = NOW + timedelta(hours=10)
    assert deadlines.next_time(SPEC, o) == NOW + timedelta(hours=7)
    assert deadlines.due(SPEC, [o], NOW) == []
    assert [(d.action, d.notify) for d in deadlines.due(SPEC, [o], NOW + timedelta(hours=7))] == [
        ("remind", "nudge")
    ]
    o.reminded = 2
    assert deadlines.next_deadline(SPEC, [o]) == o.deadline
    late = NOW + timedelta(hours=10)
    assert [d.action for d in deadlines.due(SPEC, [o], late)] == ["escalate"]
    assert deadlines.expiring(SPEC, [o], late) == []  # escalated first
    assert deadlines.extension(SPEC, o) == timedelta(hours=2)
    o.escalated = True
    assert [d.action for d in deadlines.due(SPEC, [o], late)] == ["expire"]
    assert deadlines.expiring(SPEC, [o], late) == [o]
    assert deadlines.timeout_output(SPEC, o) == {"approved": False}  # the escalation's then


def test_a_deadline_that_cancels_is_no_expiry_and_defaults_come_from_the_tool_first():
    d = call("deploy", "d1", source="approval")
    d.deadline = NOW
    assert [x.action for x in deadlines.due(SPEC, [d], NOW)] == ["cancel"]
    assert deadlines.expiring(SPEC, [d], NOW) == []
    a = call("ask", "r1", source="interrupt")
    assert deadlines.timeout_output(SPEC, a) == {"approved": True, "note": ""}
    assert deadlines.timeout_output(assistant.spec(), d) == timed_out_output()


# --------------------------------------------------------------------------------------------
# One book per turn.


def test_the_turn_machine_builds_one_book_per_turn_and_it_sees_a_new_spec():
    state = ConversationState(agent="gov", spec=assistant.spec())
    state.turn = TurnState(turn=1, started_at=NOW, base_len=0)
    machine = TurnMachine(state, publish=lambda: None, can_now=lambda: False)
    book = machine.book(state.turn)
    assert machine.book(state.turn) is book
    state.spec = SPEC  # a model result brought a new definition mid-turn
    assert book.spec is SPEC and book.spent is state.spent_tokens
    assert book.approvers(call("deploy", "d1", source="approval")) == ["ops@x"]
    state.turn = TurnState(turn=2, started_at=NOW, base_len=0)
    assert machine.book(state.turn) is not book

"""Approval governance in the interrupt book, without a server: identity, quorum, edits,
deadline policies and the audit trail's memo batches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt
import pytest
from pydantic import BaseModel

from temporal_agent_interrupts import interrupt, tool
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows import Agent, Escalate, Remind, ToolApproval
from temporal_agent_interrupts.workflows.audit import apply, outbox_batch
from temporal_agent_interrupts.workflows.events import answer
from temporal_agent_interrupts.workflows.interrupts import InterruptBook, ResumeError, Who
from temporal_agent_interrupts.workflows.limits import json_size
from temporal_agent_interrupts.workflows.state import (
    CallState,
    ConversationState,
)
from temporal_agent_interrupts.workflows.tokens import live
from temporal_agent_interrupts.workflows.types import (
    AnswerRecord,
    InterruptRequest,
    Notice,
    ResumeInput,
    TurnEvent,
    Vote,
)
from temporal_agent_interrupts.workflows.waits import (
    MIN_NOTICE_BYTES,
    NOTICES_BUDGET,
    notice_within,
)
from tests.agents import Answer, Ask

NOW = datetime.now(UTC)  # tokens are minted against the real clock
ISSUER = TokenIssuer("EdDSA")


class Target(BaseModel):
    service: str


@tool("deploy", "Deploy.", editable=True)
async def deploy(inp: Target) -> dict[str, str]:
    return {"deployed": inp.service}


@tool("nudge", "Remind someone.")
async def nudge(inp: Target) -> dict[str, str]:
    return {}


officers = interrupt(
    "officers",
    "Two officers.",
    input=Ask,
    output=Answer,
    approvers=["a@x", "b@x", "group:risk"],
    quorum=2,
    timeout=timedelta(hours=10),
    reminders=[
        Remind(notify=nudge, before=timedelta(hours=1)),
        Remind(notify=nudge, before=timedelta(hours=3)),
    ],
    on_timeout=Escalate(notify=nudge, extend=timedelta(hours=2), then={"approved": False}),
)

agent = Agent(
    "gov",
    tools=[officers, deploy],
    middleware=[ToolApproval(allow=[], approvers=["ops@x"])],
    trust=ISSUER.trust(),
)


def paused(name: str, ref: str, args: dict[str, object], *, source: str = "interrupt"):
    call = CallState(ref=ref, name=name, args=args)
    book = InterruptBook([call], spec=agent.spec())
    if source == "approval":
        book.gate(call, now=NOW)
    else:
        book.pause(call, source="interrupt", metadata={}, now=NOW)
    return book, call


def resume(**kw: object) -> ResumeInput:
    return ResumeInput.model_validate(kw)


def approve_officers(identity: str, **claims: object) -> ResumeInput:
    return resume(
        respond=[{"name": "officers", "ref": "o1", "output": {"approved": True}}],
        identity_token=ISSUER.mint(identity, **claims),  # type: ignore[arg-type]  # test kwargs
    )


def test_votes_count_distinct_verified_identities_until_the_quorum():
    book, call = paused("officers", "o1", {"question": "wire?"})
    assert book.resume(approve_officers("a@x"), via="update", now=NOW) == []
    assert [(v.identity, v.verified) for v in call.votes] == [("a@x", True)]
    assert call.status == "pending"
    with pytest.raises(ResumeError, match="'a@x' has already voted"):
        book.check(approve_officers("a@x"), now=NOW)
    # A group member counts as themselves.
    (done,) = book.resume(approve_officers("r@x", groups=["risk"]), via="signal", now=NOW)
    assert done is call and call.status == "answered"
    assert [v.identity for v in call.votes] == ["a@x", "r@x"]
    assert len(book.spent) == 2


def test_an_answer_that_neither_approves_nor_denies_is_no_vote():
    book, _ = paused("officers", "o1", {"question": "wire?"})
    maybe = resume(
        respond=[{"name": "officers", "ref": "o1", "output": {"approved": True}}],
        identity_token=ISSUER.mint("a@x"),
    )
    book.check(maybe, now=NOW)  # approves: fine
    vague = resume(
        restart=[{"name": "officers", "ref": "o1", "resumed_metadata": {"more": "info"}}],
        identity_token=ISSUER.mint("a@x"),
    )
    with pytest.raises(ResumeError, match="needs 2 approvals: answer it with an approval or a"):
        book.check(vague, now=NOW)


def test_groups_count_only_when_verified():
    assert Who("x", verified=True, groups=("risk",)).may_answer(["group:risk"])
    assert not Who("x", verified=False, groups=("risk",)).may_answer(["group:risk"])
    assert not Who("group:risk").may_answer(["group:risk"])
    assert Who(None).may_answer([])


def test_an_edit_keeps_the_original_and_the_gate_decides_again():
    book, call = paused("deploy", "d1", {"service": "web"}, source="approval")
    edit = resume(
        restart=[
            {
                "name": "deploy",
                "ref": "d1",
                "input": {"service": "api"},
                "resumed_metadata": {"tool_approved": True},
            }
        ],
        identity_token=ISSUER.mint("ops@x"),
    )
    seen: list[TurnEvent] = []
    InterruptBook(book.calls, spec=agent.spec(), emit=seen.append).resume(
        edit, via="update", now=NOW
    )
    assert (call.args, call.original_args, call.edit_passes_gate) == (
        {"service": "api"},
        {"service": "web"},
        True,
    )
    (event,) = seen
    assert event.answer is not None
    assert (event.answer.kind, event.answer.decision) == ("edit", "edited")
    assert event.answer.original_input == {"service": "web"}
    # Without tool_approved, the edit does not pass the gate.
    book2, call2 = paused("deploy", "d2", {"service": "web"}, source="approval")
    proposal = resume(
        restart=[{"name": "deploy", "ref": "d2", "input": {"service": "db"}}],
        identity_token=ISSUER.mint("ops@x"),
    )
    book2.resume(proposal, via="update", now=NOW)
    assert call2.edit_passes_gate is False


def test_deadline_policies_remind_earliest_first_then_escalate_then_expire():
    book, call = paused("officers", "o1", {"question": "wire?"})
    assert call.deadline == NOW + timedelta(hours=10)
    assert book.next_deadline() == NOW + timedelta(hours=7)
    (due,) = book.due(NOW + timedelta(hours=7))
    assert (due.action, due.notify) == ("remind", "nudge")
    book.remind(call)
    assert book.next_deadline() == NOW + timedelta(hours=9)
    book.remind(call)
    assert book.next_deadline() == NOW + timedelta(hours=10)
    (due,) = book.due(NOW + timedelta(hours=10))
    assert due.action == "escalate"
    book.escalate(call)
    assert call.deadline == NOW + timedelta(hours=12)
    assert book.expire(NOW + timedelta(hours=11)) == []
    (due,) = book.due(NOW + timedelta(hours=12))
    assert due.action == "expire"
    (expired,) = book.expire(NOW + timedelta(hours=12))
    assert expired.answer_output == {"approved": False}


def test_the_memo_batch_names_every_record_within_its_budget():
    state = ConversationState(agent="gov")
    call = CallState(ref="r", name="deploy", args={"service": "x" * 3000})
    for i in range(5):
        event = answer(call, kind="respond", via="update", identity=f"p{i}", output={"n": i})
        apply(state, event.model_copy(update={"at": NOW, "ref": f"r{i}"}))
    batch = outbox_batch(state, budget=400)
    assert [b["ref"] for b in batch] == ["r0", "r1", "r2", "r3", "r4"]
    assert state.audit_outbox == []
    assert AnswerRecord.model_validate(batch[0]).output == {"n": 0}
    # Past the budget, payloads become digests; the record itself stays.
    assert batch[-1]["output"]["omitted"]


def test_declarations_refuse_what_could_never_work():
    with pytest.raises(ValueError, match="need a timeout"):
        interrupt("x", "x", input=Ask, reminders=[Remind(notify=nudge, before=timedelta(1))])
    with pytest.raises(ValueError, match="at most 16"):
        ToolApproval(quorum=17)
    with pytest.raises(ValueError, match="must be a tool with a body"):
        Agent(
            "bad",
            tools=[],
            interrupt_timeout=timedelta(hours=1),
            on_interrupt_timeout=Escalate(notify=officers, extend=timedelta(hours=1)),
        )
    with pytest.raises(ValueError, match="public keys only"):
        Agent(
            "bad2",
            trust=ISSUER.trust().__class__(
                issuer="i", audience="a", jwks={"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}
            ),
        )


# ----------------------------------------------------------------------------------------------
# Found in review: each a way an answer could have taken effect that should not.

pay_officers = Agent(
    "payOfficers",
    tools=[deploy],
    middleware=[ToolApproval(allow=[], approvers=["a@x", "b@x", "c@x"], quorum=2)],
    trust=ISSUER.trust(),
)


def gated_pay(ref: str = "p1", *, source: str = "approval") -> tuple[InterruptBook, CallState]:
    call = CallState(ref=ref, name="deploy", args={"service": "web"})
    book = InterruptBook([call], spec=pay_officers.spec())
    if source == "approval":
        book.gate(call, now=NOW)
    else:
        book.pause(call, source="tool", metadata={}, now=NOW)
    return book, call


def approve_pay(identity: str, ref: str = "p1", **restart: object) -> ResumeInput:
    entry = {"name": "deploy", "ref": ref, "resumed_metadata": {"tool_approved": True}, **restart}
    return resume(restart=[entry], identity_token=ISSUER.mint(identity))


def test_resending_the_input_spelled_otherwise_is_an_edit_not_a_second_vote():
    book, call = gated_pay()
    book.resume(approve_pay("a@x"), via="update", now=NOW)
    assert [v.identity for v in call.votes] == ["a@x"]
    with pytest.raises(ResumeError, match="already voted"):
        book.check(approve_pay("a@x", input={"service": "web"}), now=NOW)
    # A changed input is an edit: the votes go, and the gate decides again.
    book.resume(approve_pay("a@x", input={"service": "api"}), via="update", now=NOW)
    assert (call.votes, call.edit_passes_gate) == ([], False)


def test_one_account_votes_once_however_its_tokens_spell_it():
    book, _ = gated_pay()
    book.resume(approve_pay("a@x"), via="update", now=NOW)
    same_account = ISSUER.mint("b@x", extra={"sub": _sub("a@x")})
    entry = {"name": "deploy", "ref": "p1", "resumed_metadata": {"tool_approved": True}}
    with pytest.raises(ResumeError, match="already voted"):
        book.check(resume(restart=[entry], identity_token=same_account), now=NOW)


def _sub(identity: str) -> str:
    token = ISSUER.mint(identity)
    return jwt.decode(token, options={"verify_signature": False})["sub"]


def test_a_token_refused_after_it_reached_history_is_spent():
    book, _ = gated_pay()
    token = ISSUER.mint("a@x")
    book.spend_refused(token, now=NOW)
    entry = {"name": "deploy", "ref": "p1", "resumed_metadata": {"tool_approved": True}}
    with pytest.raises(ResumeError, match="already used"):
        book.check(resume(restart=[entry], identity_token=token), now=NOW)
    book.spend_refused("not a token", now=NOW)  # junk: nothing to spend, no error
    assert len(book.spent) == 1


def test_a_spent_token_is_remembered_until_the_leeway_has_passed_too():
    book, _ = gated_pay()
    token = ISSUER.mint("a@x", issued_at=NOW, expires_in=timedelta(seconds=5))
    book.resume(
        resume(
            restart=[{"name": "deploy", "ref": "p1", "resumed_metadata": {"tool_approved": True}}],
            identity_token=token,
        ),
        via="update",
        now=NOW,
    )
    later = NOW + timedelta(seconds=30)  # expired, but within the minute of leeway
    book.spent[:] = live(book.spent, later)  # pruning as the next answer would
    assert len(book.spent) == 1
    entry = {"name": "deploy", "ref": "p1", "resumed_metadata": {"tool_approved": True}}
    with pytest.raises(ResumeError, match="already used"):
        book.check(resume(restart=[entry], identity_token=token), now=later)


def test_a_long_lived_token_is_refused():
    book, _ = gated_pay()
    token = ISSUER.mint("a@x", expires_in=timedelta(days=3))
    with pytest.raises(ResumeError, match="valid for more than a day"):
        book.check(approve_pay("a@x").model_copy(update={"identity_token": token}), now=NOW)


def test_a_placeholder_sent_back_as_the_input_is_refused():
    book, _ = paused("deploy", "d9", {"service": "web"}, source="approval")
    placeholder = {"omitted": "input over the budget", "bytes": 90000, "sha256": "ab" * 8}
    edit = resume(
        restart=[
            {
                "name": "deploy",
                "ref": "d9",
                "input": placeholder,
                "resumed_metadata": {"tool_approved": True},
            }
        ],
        identity_token=ISSUER.mint("ops@x"),
    )
    with pytest.raises(ResumeError, match="placeholder"):
        book.check(edit, now=NOW)


def test_an_interrupt_a_gated_tool_raised_takes_the_gates_approvers_and_quorum():
    book, call = gated_pay("t1", source="tool")
    assert (book.approvers(call), book.quorum(call)) == (["a@x", "b@x", "c@x"], 2)
    with pytest.raises(ResumeError, match="may be answered only by a@x"):
        book.check(approve_pay("intern@x", ref="t1"), now=NOW)


def test_a_quorum_on_a_gated_call_counts_only_restart_approvals():
    book, _ = gated_pay()
    respond = resume(
        respond=[{"name": "deploy", "ref": "p1", "output": {"approved": True}}],
        identity_token=ISSUER.mint("a@x"),
    )
    with pytest.raises(ResumeError, match="approve it with an approval that runs it"):
        book.check(respond, now=NOW)


def test_notices_due_together_share_one_budget():
    """128 calls falling due at once schedule 128 notices in one workflow task: each is cut to
    its share (input and metadata to placeholders, then votes), and still parses."""
    big = InterruptRequest(
        name="officers",
        ref="o1",
        input={"question": "x" * 200_000},
        metadata={"note": "y" * 50_000},
        quorum=16,
        votes=[Vote(identity=f"{'v' * 250}{i}", at=NOW, subject="s" * 32) for i in range(15)],
    )
    notice = Notice(chat_id="c", agent="gov", reason="escalation", interrupt=big)
    share = max(MIN_NOTICE_BYTES, NOTICES_BUDGET // 128)
    data = notice_within(notice, share)
    assert json_size(data) <= share
    kept = Notice.model_validate(data)
    assert (kept.interrupt.ref, kept.reason) == ("o1", "escalation")
    assert kept.interrupt.input["omitted"]
    assert 0 < len(kept.interrupt.votes) < 15
    assert 128 * share <= NOTICES_BUDGET + 128  # the whole pass stays within its budget

"""Policies as data: a Cedar policy set decides each tool call, allow, ask or deny.

The decision itself is pure (``activities.policy.decide``), so most of this is unit tests in
milliseconds; the activity is run in Temporal's ``ActivityEnvironment`` with the info the server
gives a conversation's call, which is what its sealing and its conversation check read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path

import cedarpy
import google.genai as genai
import pytest
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from temporal_agent_interrupts import Agent
from temporal_agent_interrupts.activities.policy import (
    MAX_INPUT_DEPTH,
    NO_PERMIT,
    NO_POLICY,
    NOT_EVALUATED,
    TOO_LARGE,
    PolicyError,
    decide,
)
from temporal_agent_interrupts.activities.runtime import AgentActivities
from temporal_agent_interrupts.codec import NO_KEYS, data_converter
from temporal_agent_interrupts.policies import Policy
from temporal_agent_interrupts.worker.__main__ import AgentSpecError, with_policy
from temporal_agent_interrupts.worker.result_keys import generate_result_key, parse_result_keys
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows.activity_io import (
    PolicyCall,
    PolicyInput,
    PolicyRequester,
    PolicyResult,
)
from temporal_agent_interrupts.workflows.config import POLICY_ACTIVITY, WORKFLOW_TYPE
from temporal_agent_interrupts.workflows.seal import Binding, result_body
from temporal_agent_interrupts.workflows.types import ErrorKind
from tests import docs

PAYMENTS = """
// Small payments run; medium ones need two of finance; large ones never run.
@id("small")
permit (principal, action == Action::"call", resource == Tool::"pay")
when { context.input.amount <= 100 };

@id("medium")
@effect("ask")
@approvers("cfo@example.com,group:finance")
@quorum("2")
@deadline("3600")
@reason("payments over 100 need two approvers from finance")
permit (principal, action == Action::"call", resource == Tool::"pay")
when { context.input.amount > 100 && context.input.amount <= 10000 };

@id("limit")
@reason("payments over 10,000 are made by treasury, not by an agent")
forbid (principal, action, resource == Tool::"pay")
when { context.input.amount > 10000 };
"""


# An issuer for the agents whose policies name group approvers (groups need verified identity).
TRUST = TokenIssuer().trust()


def _payments() -> Policy:
    return Policy.from_text(PAYMENTS, name="payments.cedar")


def test_one_policy_set_gives_three_calls_three_outcomes():
    policy = _payments()
    small = decide(policy, agent="bank", tool="pay", input={"amount": 40})
    medium = decide(policy, agent="bank", tool="pay", input={"amount": 2500})
    large = decide(policy, agent="bank", tool="pay", input={"amount": 50_000})

    assert (small.effect, small.policy_ids) == ("allow", ["small"])
    assert medium.effect == "ask" and medium.policy_ids == ["medium"]
    assert medium.approvers == ["cfo@example.com", "group:finance"]
    assert (medium.quorum, medium.deadline_seconds) == (2, 3600.0)
    assert medium.reason == "payments over 100 need two approvers from finance"
    assert large.effect == "deny" and large.policy_ids == ["limit"]
    assert large.reason == "payments over 10,000 are made by treasury, not by an agent"
    assert {d.policy_hash for d in (small, medium, large)} == {policy.hash}


def test_a_call_no_policy_permits_is_denied_as_cedar_denies_it():
    denied = decide(_payments(), agent="bank", tool="delete_account", input={})
    assert (denied.effect, denied.reason, denied.policy_ids) == ("deny", NO_PERMIT, [])


def test_the_requester_and_its_groups_reach_the_policy_and_asserted_groups_do_not():
    policy = Policy.from_text(
        """
        @id("treasury-wires")
        permit (principal in Group::"treasury", action, resource == Tool::"wire");
        @id("self-service") permit (principal, action, resource == Tool::"balance")
        when { principal.verified && context.requester.identity == context.input.owner };
        """
    )
    alice = PolicyRequester(identity="alice@example.com", verified=True, groups=["treasury"])
    assert decide(policy, agent="bank", tool="wire", input={}, requester=alice).effect == "allow"
    # The same claim, asserted rather than verified: its groups are whatever the sender typed.
    asserted = alice.model_copy(update={"verified": False})
    assert decide(policy, agent="bank", tool="wire", input={}, requester=asserted).effect == "deny"
    mine = {"owner": "alice@example.com"}
    assert decide(policy, agent="bank", tool="balance", input=mine, requester=alice).effect == (
        "allow"
    )
    bob = PolicyRequester(identity="bob@example.com", verified=True)
    assert decide(policy, agent="bank", tool="balance", input=mine, requester=bob).effect == "deny"
    # Nobody named: User::"anonymous", unverified.
    assert decide(policy, agent="bank", tool="balance", input={"owner": ""}).effect == "deny"


def test_an_anonymous_requester_is_the_anonymous_user_unverified():
    policy = Policy.from_text(
        '@id("anon") permit (principal == User::"anonymous", action, resource) '
        'when { !principal.verified && context.requester.identity == "" };'
    )
    assert decide(policy, agent="a", tool="t", input={}).effect == "allow"


def test_asks_combine_strictly_one_ask_applies_whole_and_it_beats_a_plain_permit():
    policy = Policy.from_text(
        """
        @id("anyone") permit (principal, action, resource);
        @id("one-quick") @effect("ask") @approvers("ops@example.com") @deadline("60")
        permit (principal, action, resource);
        @id("two-slow") @effect("ask") @approvers("a@example.com,b@example.com") @quorum("2")
        @deadline("7200") permit (principal, action, resource);
        @id("two-quick") @effect("ask") @approvers("c@example.com,d@example.com") @quorum("2")
        @deadline("600") permit (principal, action, resource) when { context.input.urgent };
        """
    )
    calm = decide(policy, agent="a", tool="t", input={"urgent": False})
    # The largest quorum applies, whole: its approvers are not merged with the others'.
    assert calm.effect == "ask" and calm.quorum == 2
    assert calm.approvers == ["a@example.com", "b@example.com"]
    assert calm.policy_ids == ["two-slow", "one-quick"]
    urgent = decide(policy, agent="a", tool="t", input={"urgent": True})
    # A tie on quorum: the shorter deadline applies.
    assert (urgent.deadline_seconds, urgent.approvers) == (
        600.0,
        ["c@example.com", "d@example.com"],
    )
    assert urgent.policy_ids[0] == "two-quick"


def test_a_forbid_beats_every_permit_and_the_first_forbid_s_reason_is_given():
    policy = Policy.from_text(
        """
        @id("anyone") permit (principal, action, resource);
        @id("weekend") forbid (principal, action, resource) when { context.input.weekend };
        @id("frozen") @reason("the account is frozen") forbid (principal, action, resource)
        when { context.input.frozen };
        """
    )
    both = decide(policy, agent="a", tool="t", input={"weekend": True, "frozen": True})
    assert (both.effect, both.reason, both.policy_ids) == (
        "deny",
        "the account is frozen",
        ["weekend", "frozen"],
    )
    plain = decide(policy, agent="a", tool="t", input={"weekend": True, "frozen": False})
    assert (plain.effect, plain.reason) == ("deny", "a policy forbids this call")


def test_a_forbid_or_ask_that_cannot_be_evaluated_fails_closed_a_plain_permit_does_not_matter():
    policy = Policy.from_text(
        """
        @id("anyone") permit (principal, action, resource);
        @id("cap") forbid (principal, action, resource) when { context.input.amount > 100 };
        """
    )
    # No amount: Cedar skips the erroring forbid and would allow; the decision denies.
    missing = decide(policy, agent="a", tool="t", input={})
    assert (missing.effect, missing.reason, missing.policy_ids) == ("deny", NOT_EVALUATED, ["cap"])
    asks = Policy.from_text(
        '@id("anyone") permit (principal, action, resource);\n'
        '@id("big") @effect("ask") permit (principal, action, resource) '
        "when { context.input.amount > 100 };"
    )
    assert decide(asks, agent="a", tool="t", input={"amount": "lots"}).effect == "deny"
    permits = Policy.from_text(
        '@id("anyone") permit (principal, action, resource);\n'
        '@id("odd") permit (principal, action, resource) when { context.input.amount > 1 };'
    )
    assert decide(permits, agent="a", tool="t", input={}).effect == "allow"


def test_numbers_reach_cedar_as_longs_or_decimals_and_the_rest_as_strings():
    policy = Policy.from_text(
        """
        @id("cents") permit (principal, action, resource == Tool::"pay")
        when { context.input.cents <= 500 };
        @id("rate") permit (principal, action, resource == Tool::"fx")
        when { context.input.rate.lessThan(decimal("1.5")) };
        @id("note") permit (principal, action, resource == Tool::"note")
        when { !(context.input has memo) };
        """
    )

    def effect(tool: str, **args: object) -> str:
        return decide(policy, agent="a", tool=tool, input=args).effect

    assert effect("pay", cents=499) == "allow"
    assert effect("pay", cents=2**63) == "deny"  # past a Long: a string, compared with nothing
    assert effect("fx", rate=1.25) == "allow"  # four digits or fewer: decimal("1.25")
    assert effect("fx", rate=1.75) == "deny"
    assert effect("fx", rate=1.23456) == "deny"  # a fifth digit: its text, never a decimal
    assert effect("fx", rate=3) == "deny"  # a Long is no decimal: the permit errors
    assert effect("note", memo=None) == "allow"  # null: left out, as Cedar has none


def test_an_input_past_the_bounds_is_denied_unread():
    policy = Policy.from_text('@id("anyone") permit (principal, action, resource);')
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(MAX_INPUT_DEPTH):
        deep = {"x": deep}
    assert decide(policy, agent="a", tool="t", input=deep).reason == TOO_LARGE
    big = {"text": "x" * 70_000}
    assert decide(policy, agent="a", tool="t", input=big).effect == "deny"
    assert decide(policy, agent="a", tool="t", input={"text": "x" * 1000}).effect == "allow"


def test_an_mcp_tool_s_annotations_are_the_resource_s():
    policy = Policy.from_text(
        '@id("read-only") permit (principal, action, resource) '
        "when { resource.annotations has readOnlyHint && resource.annotations.readOnlyHint "
        '&& resource.agent == "docs" };'
    )
    read_only = {"readOnlyHint": True}
    assert decide(policy, agent="docs", tool="search", input={}, annotations=read_only).effect == (
        "allow"
    )
    assert decide(policy, agent="docs", tool="search", input={}).effect == "deny"
    assert decide(policy, agent="ops", tool="search", input={}, annotations=read_only).effect == (
        "deny"
    )


def test_a_bad_policy_file_is_refused_at_load_naming_the_file_and_cedar_s_message(tmp_path):
    bad = tmp_path / "bad.cedar"
    bad.write_text("permit (principal, action resource);")
    with pytest.raises(PolicyError, match=r"bad\.cedar: Cedar cannot parse.*unexpected token"):
        Policy.from_file(bad)
    with pytest.raises(PolicyError, match=r"missing\.cedar: cannot read"):
        Policy.from_file(tmp_path / "missing.cedar")
    refusals = {
        '@effect("maybe") permit (principal, action, resource);': "@effect is 'allow' or 'ask'",
        '@effect("ask") forbid (principal, action, resource);': "a forbid always denies",
        '@approvers("a@x.com") permit (principal, action, resource);': "only mean something",
        '@effect("ask") @quorum("two") permit (principal, action, resource);': "whole number",
        '@effect("ask") @quorum("3") @approvers("a@x.com") permit (principal, action, resource);': (
            "can never be met"
        ),
        '@effect("ask") @deadline("-5") permit (principal, action, resource);': "positive number",
        '@id("x") permit (principal, action, resource);\n@id("x") forbid (principal, action, '
        "resource);": "unique",
        "// nothing but a comment": "holds no policies",
    }
    for text, message in refusals.items():
        with pytest.raises(PolicyError, match=message):
            Policy.from_text(text, name="p.cedar")


def test_the_hash_is_the_sha256_of_cedar_s_json_form_and_ignores_comments_and_layout():
    policy = _payments()
    canonical = json.dumps(
        json.loads(cedarpy.policies_to_json_str(PAYMENTS)),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    assert policy.hash == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert Policy.from_text(PAYMENTS).hash == policy.hash  # stable, whatever the name
    relaid = "\n".join(line.strip() for line in PAYMENTS.splitlines() if "//" not in line)
    assert Policy.from_text("// a new comment\n" + relaid).hash == policy.hash
    assert Policy.from_text(PAYMENTS.replace("<= 100", "<= 200")).hash != policy.hash
    assert Policy.from_text(PAYMENTS.replace('@quorum("2")', '@quorum("1")')).hash != policy.hash


def test_an_agent_s_definition_carries_its_policy_s_hash_and_one_without_is_unchanged():
    plain = Agent("bank", model="gemini-test", trust=TRUST)
    governed = Agent("bank", model="gemini-test", trust=TRUST, policy=_payments())
    assert "policy_hash" not in plain.spec().model_dump()
    assert governed.spec().policy_hash == _payments().hash
    assert governed.spec().digest != plain.spec().digest
    with pytest.raises(ValueError, match=r"Policy\.from_file"):
        Agent("bank", policy="payments.cedar")  # type: ignore[arg-type]  # refused: a path
    # group:finance is checked against a verified identity, as a gate's approvers are.
    with pytest.raises(ValueError, match="group:finance"):
        Agent("bank", policy=_payments(), trust=None)
    assert Agent("bank", policy=_payments(), trust=TRUST).spec().policy_hash == _payments().hash


def test_agent_worker_policy_gives_every_hosted_agent_the_file_s_policy(tmp_path):
    path = tmp_path / "open.cedar"
    path.write_text('@id("anyone") permit (principal, action, resource);')
    hosted = with_policy([Agent("a", model="m"), Agent("b", model="m")], str(path))
    assert {a.spec().policy_hash for a in hosted} == {Policy.from_file(path).hash}
    assert with_policy([Agent("a", model="m")], None)[0].policy is None
    with pytest.raises(AgentSpecError, match="declare a policy of their own"):
        with_policy([Agent("a", model="m", policy=Policy.from_file(path))], str(path))
    broken = tmp_path / "broken.cedar"
    broken.write_text("permit (")
    with pytest.raises(AgentSpecError, match=r"--policy .*broken\.cedar: Cedar cannot parse"):
        with_policy([Agent("a", model="m")], str(broken))


# --- the activity --------------------------------------------------------------------------------

CONVERTER = data_converter(NO_KEYS).payload_converter


def _env(chat_id: str, *, workflow_type: str = WORKFLOW_TYPE) -> ActivityEnvironment:
    """An activity environment whose info says what the server says of a conversation's call."""
    env = ActivityEnvironment()
    env.payload_converter = CONVERTER
    env.info = dataclasses.replace(
        env.info,
        workflow_id=chat_id,
        workflow_run_id="run-1",
        workflow_type=workflow_type,
        activity_id=f"{POLICY_ACTIVITY}.1.0123456789ab",
        activity_type=POLICY_ACTIVITY,
    )
    return env


def _runtime(*agents: Agent):
    keys = parse_result_keys(generate_result_key("k1"))
    # The Gemini client is never called: no model activity runs here.
    gemini = genai.Client(api_key="unused")
    return AgentActivities(list(agents), gemini=gemini, result_keys=keys), keys


async def test_the_policy_activity_decides_a_message_s_calls_by_ref_and_seals_the_result():
    runtime, keys = _runtime(Agent("bank", model="m", policy=_payments(), trust=TRUST))
    chat_id = f"chat-{uuid.uuid4()}"
    asked = PolicyInput(
        chat_id=chat_id,
        agent="bank",
        calls=[
            PolicyCall(ref="r1", tool="pay", input={"amount": 40}),
            PolicyCall(ref="r2", tool="pay", input={"amount": 2500}),
            PolicyCall(ref="r3", tool="pay", input={"amount": 50_000}),
        ],
        requester=PolicyRequester(identity="alice@example.com"),
    )
    result: PolicyResult = await _env(chat_id).run(
        runtime.policy_decide, RawValue(CONVERTER.to_payload(asked))
    )
    assert {ref: d.effect for ref, d in result.decisions.items()} == {
        "r1": "allow",
        "r2": "ask",
        "r3": "deny",
    }
    assert result.policy_hash == _payments().hash
    binding = Binding(
        workflow_id=chat_id,
        activity_id=f"{POLICY_ACTIVITY}.1.0123456789ab",
        activity_type=POLICY_ACTIVITY,
    )
    assert keys.verify(result.seal, binding, result_body(result)) is None
    # The same result for another activity of the run does not verify: the seal is bound.
    other = dataclasses.replace(binding, activity_id=f"{POLICY_ACTIVITY}.2.0123456789ab")
    assert keys.verify(result.seal, other, result_body(result)) is not None


async def test_the_policy_activity_answers_only_its_conversation_for_an_agent_with_a_policy():
    runtime, _ = _runtime(
        Agent("bank", model="m", policy=Policy.from_text("permit (principal, action, resource);")),
        Agent("plain", model="m"),
    )
    chat_id = f"chat-{uuid.uuid4()}"
    asked = PolicyInput(chat_id=chat_id, agent="bank", calls=[PolicyCall(ref="r1", tool="t")])
    with pytest.raises(ApplicationError) as refused:
        await _env(chat_id, workflow_type="SomeoneElse").run(
            runtime.policy_decide, RawValue(CONVERTER.to_payload(asked))
        )
    assert refused.value.type == ErrorKind.NOT_A_CONVERSATION
    plain = asked.model_copy(update={"agent": "plain"})
    with pytest.raises(ApplicationError) as no_policy:
        await _env(chat_id).run(runtime.policy_decide, RawValue(CONVERTER.to_payload(plain)))
    assert no_policy.value.type == NO_POLICY and no_policy.value.non_retryable


def test_a_policy_file_path_is_what_from_file_reads(tmp_path: Path):
    path = tmp_path / "payments.cedar"
    path.write_text(PAYMENTS, encoding="utf-8")
    loaded = Policy.from_file(path)
    assert (loaded.name, loaded.hash, loaded.ids) == (
        str(path),
        _payments().hash,
        ["small", "medium", "limit"],
    )


def test_the_governance_page_s_policy_file_decides_as_the_page_says():
    text = docs.block(
        "// payments.cedar: small payments run, larger ones need two people, huge ones never run.",
        lang="cedar",
    )
    policy = Policy.from_text(text, name="payments.cedar")

    def pay(amount: int):
        return decide(policy, agent="payments", tool="pay", input={"amount": amount})

    assert pay(100).effect == "allow"
    asked = pay(101)
    assert (asked.effect, asked.quorum, asked.deadline_seconds) == ("ask", 2, 86400.0)
    assert asked.approvers == ["cfo@example.com", "controller@example.com"]
    assert (pay(10_001).effect, pay(10_001).policy_ids) == ("deny", ["limit"])
    signed_in = PolicyRequester(identity="ann@example.com", verified=True)
    read_only = {"readOnlyHint": True}
    search = {"agent": "payments", "tool": "docs_search", "input": {}, "annotations": read_only}
    assert decide(policy, **search, requester=signed_in).effect == "allow"
    assert decide(policy, **search).effect == "deny"  # nobody signed in

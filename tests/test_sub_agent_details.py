"""The Temporal UI's details panel of a conversation paused on a sub-agent (``agent_tool``):
each of the sub-agent's interrupts with its path and chat id, everything the sub-agent sent
escaped like any input, and commands that answer it, pasted here into the real ``temporal`` CLI
(through the caller, which passes the answer on, and on the sub-agent's own chat).

Real dev server, the offline stand-in's rules (``call TOOL {json}``) on the real Gemini wire.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from markdown_it import MarkdownIt
from temporalio.client import Client, WorkflowExecutionStatus

from temporal_agent_interrupts import (
    Agent,
    FinishReason,
    ToolApproval,
    TrustedIssuer,
    agent_tool,
)
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Request
from temporal_agent_interrupts.worker.testing import ScriptedModel, TokenIssuer, hosted
from temporal_agent_interrupts.workflows.details import (
    MAX_INTERRUPTS_IN_DETAILS,
    render_details,
    visible,
)
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.types import (
    InterruptRequest,
)
from tests.agents import SUB_RUNS as RUNS
from tests.agents import sub_pay, supervisor
from tests.helpers import (
    assert_no_workflow_task_failed,
    current_details,
    eventually,
    temporal_cli,
)
from tests.test_operator import agentctl
from tests.test_sub_agents import delegate

APPROVER = "<one of the approvers>"


@pytest.fixture
def offline() -> ScriptedModel:
    return ScriptedModel(offline_rules)


def _tokens(markdown: str) -> list[Any]:
    flat = []
    for token in MarkdownIt("commonmark").parse(markdown):
        flat.append(token)
        flat.extend(token.children or [])
    return flat


def _argv(command: str) -> list[str]:
    """The words bash makes of a suggested command, as an operator's paste would."""
    script = 'temporal() { printf "%s\\0" temporal "$@"; }\n' + command
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    return done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _commands(details: str) -> dict[tuple[str, str], list[str]]:
    """Each suggested command's words, by the workflow it signals and the ref it answers."""
    found: dict[tuple[str, str], list[str]] = {}
    for token in _tokens(details):
        if token.type != "fence":
            continue
        (line,) = token.content.splitlines()
        argv = _argv(line)
        # The namespace is named (the panel's "default" here: the session's server).
        assert argv[:6] == [
            "temporal",
            "workflow",
            "signal",
            "--namespace",
            "default",
            "--workflow-id",
        ]
        assert argv[7:10] == ["--name", "resume", "--input"], argv
        (entry,) = json.loads(argv[10]).get("restart") or json.loads(argv[10])["respond"]
        found[(argv[6], entry["ref"])] = argv
    return found


async def _paste(client: Client, argv: list[str], *, identity: str) -> None:
    """Run a suggested command with the approver filled in, as an operator would."""
    answer = argv[-1]
    assert json.loads(answer)["identity"] == APPROVER
    code, out = await temporal_cli(client, *argv[1:-1], answer.replace(APPROVER, identity))
    assert code == 0, out


async def _waiting(client: Client, chat: Chat, count: int) -> str:
    return await eventually(
        lambda: current_details(client, chat.id),
        lambda d: d.count("in a sub-agent (ref") == count,
        timeout=20,
    )


async def test_a_callers_panel_shows_its_sub_agents_interrupts_and_their_commands_answer_them(
    client, offline
):
    async with hosted(client, agents=[supervisor], model=offline) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("hana", 7) + "\n" + delegate("ivan", 8))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        first, second = await eventually(parent.pending, lambda p: len(p) == 2, timeout=20)
        details = await _waiting(client, parent, 2)
        assert "status **interrupted**" in details
        for i in (first, second):
            assert i.chat_id is not None and len(i.path) == 2
            assert f"### Waiting on `pay` in a sub-agent (ref `{i.ref}`) since 20" in details
            assert f"- sub-agent chat: `{i.chat_id}`" in details
            assert f"- path: `{i.path[0]}` → `{i.ref}`" in details
            assert f"- input: `{json.dumps(i.input)}`" in details
        assert details.count("- approvers: `alice`") == 2
        # Two commands each: through the caller, and on the sub-agent's own chat, with the
        # same answer (the child's ref, and an identity for its approver list).
        commands = _commands(details)
        assert set(commands) == {
            (parent.id, first.ref),
            (first.chat_id, first.ref),
            (parent.id, second.ref),
            (second.chat_id, second.ref),
        }
        for (_, ref), argv in commands.items():
            assert json.loads(argv[-1]) == {
                "restart": [
                    {"name": "pay", "ref": ref, "resumed_metadata": {"tool_approved": True}}
                ],
                "identity": APPROVER,
            }

        # Through the caller: the child's rules check it, so bob (not an approver) is refused
        # there and the refusal is recorded here; nothing runs.
        await _paste(client, commands[(parent.id, first.ref)], identity="bob")
        await eventually(parent.status, lambda s: s.rejections >= 1, timeout=20)
        (refusal,) = await parent.rejections()
        assert "refused by sub-agent" in refusal.reason
        assert RUNS["hana"] == 0
        await _paste(client, commands[(parent.id, first.ref)], identity="alice")
        left = await eventually(parent.pending, lambda p: len(p) == 1, timeout=20)
        assert [p.ref for p in left] == [second.ref]
        assert RUNS["hana"] == 1 and RUNS["ivan"] == 0
        details = await _waiting(client, parent, 1)
        assert f"(ref `{first.ref}`)" not in details
        assert set(_commands(details)) == {(parent.id, second.ref), (second.chat_id, second.ref)}

        # On the sub-agent's own chat: the caller's turn goes on to its end.
        assert second.chat_id is not None
        await _paste(client, commands[(second.chat_id, second.ref)], identity="alice")
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "paid" in done.text
        assert RUNS["hana"] == 1 and RUNS["ivan"] == 1  # each ran once, neither again
        details = await eventually(
            lambda: current_details(client, parent.id), lambda d: "status **idle**" in d
        )
        assert "Waiting on" not in details
        for i in (first, second):
            assert i.chat_id is not None
            (record,) = await agents.audit(i.chat_id)
            assert record.identity == "alice" and record.decision == "approved"
            desc = await client.get_workflow_handle(i.chat_id).describe()
            assert desc.status == WorkflowExecutionStatus.COMPLETED
    await assert_no_workflow_task_failed(client, parent.id)


IDP = TokenIssuer("ES256", issuer="https://login.example.com")
verified_payments = Agent(
    "vpayments",
    system="You make payments.",
    tools=[sub_pay],
    middleware=[ToolApproval(approvers=["alice@example.com"])],
    trust=TrustedIssuer(issuer=IDP.issuer, audience=IDP.audience, jwks=IDP.jwks()),
)
# The caller verifies nobody: the sub-agent's rules are the ones an answer must meet.
verified_supervisor = Agent(
    "vsupervisor", system="You delegate.", tools=[agent_tool(verified_payments)]
)


async def test_a_sub_agent_that_verifies_identity_gets_a_token_in_the_suggested_command(
    client, offline
):
    async with hosted(client, agents=[verified_supervisor], model=offline) as agents:
        parent = await agents.chat("vsupervisor")
        paused = await parent.send(delegate("judy", 3, tool_name="vpayments"))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.issuer == IDP.issuer
        details = await _waiting(client, parent, 1)
        commands = _commands(details)
        assert set(commands) == {(parent.id, i.ref), (i.chat_id, i.ref)}
        placeholder = f"<a fresh JWT from {IDP.issuer}>"
        for argv in commands.values():
            answer = json.loads(argv[-1])
            assert answer["identity_token"] == placeholder and "identity" not in answer
        argv = commands[(parent.id, i.ref)]
        token = IDP.mint("alice@example.com")
        code, out = await temporal_cli(client, *argv[1:-1], argv[-1].replace(placeholder, token))
        assert code == 0, out
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "paid" in done.text
        assert RUNS["judy"] == 1
        assert i.chat_id is not None
        (record,) = await agents.audit(i.chat_id)
        assert record.identity == "alice@example.com" and record.identity_verified
    await assert_no_workflow_task_failed(client, parent.id)


async def test_agentctl_show_names_the_sub_agent_and_path_and_its_approve_goes_through(
    client, offline
):
    tq = f"test-{uuid.uuid4()}"
    async with hosted(client, agents=[supervisor], model=offline, task_queue=tq) as agents:
        parent = await agents.chat("supervisor")
        paused = await parent.send(delegate("kim", 4))
        (i,) = paused.interrupts
        shown = await agentctl(client, "show", parent.id, task_queue=tq)
        assert shown.code == 0, shown.err
        assert "paused on pay" in shown.out
        row = next(line for line in shown.out.splitlines() if "sub-agent" in line)
        assert i.chat_id is not None and i.chat_id in row
        row = next(line for line in shown.out.splitlines() if " path " in line)
        assert f"{i.path[0]} → {i.ref}" in row
        command = f"agentctl approve {parent.id} {i.ref}"
        assert command in shown.out
        approved = await agentctl(
            client, "approve", parent.id, i.ref, "--identity", "alice", task_queue=tq
        )
        assert approved.code == 0, approved.err
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "paid" in done.text
        assert RUNS["kim"] == 1


# What the sub-agent and its model choose, each made to break out of the panel: the caller's
# call id (in the child's chat id, and first on the path), the child's call id (its ref) and the
# payment's input. Refs stay under the 128 bytes a call id may take to be used as one.
HOSTILE_INPUT = "x` [click](http://evil.example) <img src=x onerror=alert(1)>\n```\n\x1b[2J\u202erm"
PARENT_REF = "p``\u202e\n### owned\x07" + uuid.uuid4().hex[:8]
CHILD_REF = "c`\u2066\x1b[31m\u200b[x](http://evil.example)" + uuid.uuid4().hex[:8]


def _hostile_ids(request: Request) -> dict[str, Any]:
    reply = offline_rules(request)
    for part in reply["candidates"][0]["content"]["parts"]:
        call = part.get("functionCall")
        if call is not None:
            call["id"] = {"payments": PARENT_REF, "pay": CHILD_REF}[call["name"]]
    return reply


async def test_a_hostile_sub_agent_cannot_break_out_of_the_callers_panel(client):
    model = ScriptedModel(_hostile_ids)
    async with hosted(client, agents=[supervisor], model=model) as agents:
        parent = await agents.chat(
            "supervisor", chat_id=f"sup`\u202e\n```\ntemporal workflow terminate\n```{uuid.uuid4()}"
        )
        paused = await parent.send(delegate(HOSTILE_INPUT, 9))
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (i,) = paused.interrupts
        assert i.ref == CHILD_REF and i.path == [PARENT_REF, CHILD_REF]
        child_id = f"{parent.id}--{PARENT_REF}"
        assert i.chat_id == child_id
        details = await _waiting(client, parent, 1)

        # Nothing raw reaches the panel: no control or bidi character, no link, image or HTML,
        # one heading, and every value whole inside one code span.
        assert all(c.isprintable() or c == "\n" for c in details), ascii(details)
        tokens = _tokens(details)
        kinds = [t.type for t in tokens]
        assert not set(kinds) & {"link_open", "image", "html_inline", "html_block"}, kinds
        assert kinds.count("heading_open") == 1
        spans = [t.content for t in tokens if t.type == "code_inline"]
        for value in (CHILD_REF, PARENT_REF, child_id, json.dumps(i.input)):
            assert visible(value) in spans, (value, spans)
        heading = tokens[kinds.index("heading_open") + 1]
        assert [c.type for c in heading.children or []] == [
            "text",
            "code_inline",
            "text",
            "code_inline",
            "text",
        ]
        # The commands carry the exact ids, and pasted they work.
        commands = _commands(details)
        assert set(commands) == {(parent.id, CHILD_REF), (child_id, CHILD_REF)}
        await _paste(client, commands[(parent.id, CHILD_REF)], identity="alice")
        done = await eventually(
            parent.last_turn,
            lambda t: t is not None and t.finish_reason == FinishReason.STOP,
            timeout=30,
        )
        assert done is not None and "paid" in done.text
        assert RUNS[HOSTILE_INPUT] == 1
    await assert_no_workflow_task_failed(client, parent.id)


def test_the_panel_shows_at_most_its_limit_of_own_and_delegated_interrupts_together():
    since = datetime(2026, 1, 1, tzinfo=UTC)

    def own(n: int) -> list[CallState]:
        return [
            CallState(ref=f"own-{k}", name="approve", status="pending", since=since)
            for k in range(n)
        ]

    def delegated(n: int) -> list[InterruptRequest]:
        return [
            InterruptRequest(
                name="pay",
                ref=f"sub-{k}",
                source="approval",
                path=[f"call-{k}", f"sub-{k}"],
                chat_id=f"chat--call-{k}",
            )
            for k in range(n)
        ]

    def panel(calls: list[CallState], sub: list[InterruptRequest]) -> str:
        return render_details(
            chat_id="chat",
            namespace="default",
            agent="supervisor",
            status="interrupted",
            turns=1,
            spec=None,
            pending=calls,
            last_turn=None,
            rejections=[],
            rejections_total=0,
            requests=[],
            delegated=sub,
        )

    limit = MAX_INTERRUPTS_IN_DETAILS
    mixed = panel(own(limit - 5), delegated(10))
    assert mixed.count("### Waiting on `approve`") == limit - 5
    assert mixed.count("in a sub-agent (ref") == 5
    assert "`sub-4`" in mixed and "`sub-5`" not in mixed  # the first ones, in call order
    assert "… and 5 more pending" in mixed
    crowded = panel(own(limit + 3), delegated(2))
    assert crowded.count("### Waiting on") == limit and "in a sub-agent" not in crowded
    assert "… and 5 more pending" in crowded
    exact = panel(own(2), delegated(limit - 2))
    assert exact.count("### Waiting on") == limit and "more pending" not in exact

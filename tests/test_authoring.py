"""An agent author's first hour: the README's "Writing an agent", run as printed.

The agent, the test file and the pytest settings are cut out of the README verbatim into a
stand-in for the author's repository, so the README cannot drift from what runs. Also here: the
offline model's ``call TOOL`` rules, the test kit (``worker.testing``) on its own, and
``chat.resume(answers=...)``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from temporalio import activity

from temporal_agent_interrupts import AgentClient, FinishReason, approve, deny, tool
from temporal_agent_interrupts.worker.offline_model import BANNER, parse_calls
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Request
from temporal_agent_interrupts.worker.testing import (
    ScriptedModel,
    call_every_tool,
    calls,
    error,
    hosted,
    offline,
    text,
    tool_runs,
)
from temporal_agent_interrupts.workflows import Agent, ToolApproval
from tests import agents as t
from tests.docs import block
from tests.helpers import eventually, server_address
from tests.test_worker_process import Process, bare_environ

ROOT = Path(__file__).parent.parent


@pytest.fixture
def author_repo(tmp_path: Path) -> Path:
    """A repository laid out as "Writing an agent" says: mypackage/agents.py, tests/, pyproject."""
    (tmp_path / "mypackage").mkdir()
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    (tmp_path / "mypackage" / "agents.py").write_text(block("# mypackage/agents.py", lang="python"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ticket_agent.py").write_text(
        block("# tests/test_ticket_agent.py", lang="python")
    )
    (tmp_path / "pyproject.toml").write_text(block("[tool.pytest.ini_options]", lang="toml"))
    return tmp_path


async def authors_worker(env, repo: Path, queue: str) -> Process:
    """`AGENT_TASK_QUEUE=queue agent-worker --agents mypackage.agents`, run in ``repo``: the
    installed console script, with nothing on PYTHONPATH, as the docs say to run it."""
    address = server_address(env.client)
    environ = bare_environ(repo, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=queue)
    environ.pop("PYTHONPATH", None)
    return await Process.start(
        str(Path(sys.executable).parent / "agent-worker"),
        "--agents",
        "mypackage.agents",
        env=environ,
        cwd=repo,
    )


async def test_the_readme_agent_runs_offline_on_its_own_task_queue(env, author_repo):
    """`AGENT_TASK_QUEUE=tickets agent-worker --agents mypackage.agents`, as the README
    says, with no Gemini key: `call ...` messages drive an interrupt-only tool and a gated tool,
    and the final answers name each tool's real output."""
    queue = f"tickets-{uuid.uuid4()}"
    worker = await authors_worker(env, author_repo, queue)
    try:
        await worker.wait_for("worker ready")
        assert "offline stand-in" in worker.output
        agents = AgentClient(env.client, task_queue=queue)
        chat = await agents.chat("ticketAgent")

        res = await chat.send("hello")
        # An unrecognised message lists this agent's own tools and the syntax.
        assert res.text.startswith(BANNER)
        assert "pickPriority, lookupTicket, closeTicket, refundCustomer" in res.text
        assert "`call TOOL {" in res.text

        res = await chat.send(
            'call pickPriority {"ticket_id": "T-7", "summary": "Printer on fire"}'
        )
        assert res.finish_reason == FinishReason.INTERRUPTED
        (ask,) = res.interrupts
        assert (ask.name, ask.source) == ("pickPriority", "interrupt")
        assert ask.input == {"ticket_id": "T-7", "summary": "Printer on fire"}
        res = await chat.resume(answers=[ask.respond({"priority": "urgent"})])
        assert res.finish_reason == FinishReason.STOP
        assert res.text == f'{BANNER} pickPriority returned {{"priority": "urgent"}}.'

        res = await chat.send(
            'call closeTicket {"ticket_id": "T-7", "resolution": "replaced the printer"}'
        )
        (gate,) = res.interrupts
        assert (gate.name, gate.source) == ("closeTicket", "approval")
        res = await chat.resume(answers=[approve(gate)], identity="lead@example.com")
        assert res.finish_reason == FinishReason.STOP
        assert res.text == (
            f'{BANNER} closeTicket returned {{"closed": true, "ticket_id": "T-7", '
            '"resolution": "replaced the printer"}.'
        )

        # `call TOOL` alone: an example input from the schema; refundCustomer is allowed and
        # under its own threshold, so it runs at once.
        res = await chat.send("call refundCustomer")
        assert res.finish_reason == FinishReason.STOP
        assert res.text.startswith(f'{BANNER} refundCustomer returned {{"refunded": 1.0, ')
        assert await tool_runs(chat) == {"closeTicket": 1, "refundCustomer": 1}
        res = await chat.send('call refundCustomer {"ticket_id": "T-7", "amount": 250}')
        (large,) = res.interrupts
        assert (large.source, large.metadata) == (
            "tool",
            {"reason": "refund over $100", "amount": 250.0},
        )
        res = await chat.resume(answers=[approve(large)])
        assert res.text.startswith(f'{BANNER} refundCustomer returned {{"refunded": 250.0, ')
        assert (await tool_runs(chat))["refundCustomer"] == 3  # paused once, then ran
    finally:
        worker.proc.send_signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output


async def test_the_readme_test_file_passes_as_printed(author_repo):
    """The README's test file, its pyproject settings and the kit, in the author's repository:
    its own dev server, its scripted model, two passing tests and pytest's exit status."""
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=author_repo,
        env=bare_environ(author_repo, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "2 passed" in proc.stdout


# --------------------------------------------------------------------------------------------
# The offline model's `call` rules, without a server


def _request(*texts: str, responses: list[dict] | None = None) -> Request:
    declarations = [
        {
            "name": "pickPriority",
            "description": "choose",
            "parameters_json_schema": {
                "type": "object",
                "properties": {"ticket_id": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["ticket_id", "n"],
            },
        },
        {"name": "lookupTicket", "description": "read"},
    ]
    contents = [{"role": "user", "parts": [{"text": x}]} for x in texts]
    if responses is not None:
        contents.append({"role": "model", "parts": [{"functionCall": {"name": "x", "args": {}}}]})
        contents.append({"role": "user", "parts": [{"functionResponse": r} for r in responses]})
    body = {"contents": contents, "tools": [{"functionDeclarations": declarations}]}
    return Request(model="m", method="generateContent", body=body)


def _parts(reply: dict) -> list[dict]:
    return reply["candidates"][0]["content"]["parts"]


def test_call_messages_parse_into_calls():
    assert parse_calls("hello") is None
    assert parse_calls("call pickPriority") == [("pickPriority", None)]
    assert parse_calls('Call a {"x": {"y": [1]}} and call b.\ncall c {}') == [
        ("a", {"x": {"y": [1]}}),
        ("b", None),
        ("c", {}),
    ]


def test_the_offline_model_calls_a_declared_tool_with_given_or_example_input():
    given = _parts(offline_rules(_request('call pickPriority {"ticket_id": "T-1", "n": 3}')))
    assert given[1:] == [
        {"functionCall": {"name": "pickPriority", "args": {"ticket_id": "T-1", "n": 3}}}
    ]
    made_up = _parts(offline_rules(_request("call pickPriority")))
    assert made_up[1]["functionCall"]["args"] == {"ticket_id": "example", "n": 1}
    both = _parts(offline_rules(_request("call lookupTicket and call pickPriority")))
    assert [p["functionCall"]["name"] for p in both[1:]] == ["lookupTicket", "pickPriority"]


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("call nope", "This agent has no tool named 'nope'."),
        ('call pickPriority {"ticket_id": ', "The input for pickPriority is not valid JSON"),
        ("call pickPriority [1]", "Expected `call TOOL`"),
        ("what can you do?", "I am not Gemini but a stand-in"),
    ],
)
def test_the_offline_model_explains_what_it_cannot_follow(message, says):
    (part,) = _parts(offline_rules(_request(message)))
    assert says in part["text"]
    # Always with this agent's own tools and the syntax: the way forward.
    assert "This agent's tools: pickPriority, lookupTicket." in part["text"]
    assert "`call pickPriority`" in part["text"]


def test_after_a_call_the_offline_model_shows_each_output_or_error():
    responses = [
        {"name": "pickPriority", "response": {"priority": "low"}},
        {"name": "lookupTicket", "response": {"error": "denied by the user", "reason": "no"}},
    ]
    (part,) = _parts(offline_rules(_request("call pickPriority", responses=responses)))
    assert part["text"] == (
        f'{BANNER} pickPriority returned {{"priority": "low"}}. '
        'lookupTicket did not complete: denied by the user {"reason": "no"}.'
    )


def test_a_banking_shaped_agent_of_ones_own_gets_its_own_output_back():
    """The README's old snippet returned {"ok", "transaction"} from transferMoney and the
    offline model printed "transferred $0.00 to None": outputs of another shape are shown."""
    responses = [{"name": "transferMoney", "response": {"ok": True, "transaction": "txn-1"}}]
    (part,) = _parts(offline_rules(_request("Transfer $5 to bob", responses=responses)))
    assert (
        part["text"] == f'{BANNER} transferMoney returned {{"ok": true, "transaction": "txn-1"}}.'
    )


# --------------------------------------------------------------------------------------------
# The kit and answers=, against the session's dev server


class Value(BaseModel):
    value: str


@tool("record", "Records a value.")
async def record(inp: Value) -> dict[str, str]:
    return {"recorded": inp.value}


@tool("flaky", "Fails its first two attempts.", retry=t.FAST_RETRY)
async def flaky(inp: Value) -> dict[str, int]:
    if activity.info().attempt < 3:
        raise RuntimeError("not yet")
    return {"attempt": activity.info().attempt}


@tool("stamp", "Stamps a value; gated.")
async def stamp(inp: Value) -> dict[str, str]:
    return {"stamped": inp.value}


kit_agent = Agent(
    "kit",
    model="gemini-test",
    tools=[t.approve, record, flaky, stamp],
    middleware=[ToolApproval(allow=["record", "flaky"])],
)


async def test_the_kit_scripts_by_function_and_counts_tool_runs(client):
    """A function of the request scripts the model; tool_runs counts every attempt, and a
    respond runs nothing."""
    seen: list[list[str]] = []

    def script(request: Request) -> dict:
        seen.append(request.tool_names())
        if request.function_responses():
            return text(f"saw {len(request.function_responses())} responses")
        return calls(("approve", {"question": "ok?"}), ("flaky", {"value": "f"}))

    model = ScriptedModel(script)
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send("go")
        assert [i.name for i in res.interrupts] == ["approve"]
        res = await chat.resume(answers=[approve(res.interrupts[0])])
        assert res.text == "saw 2 responses"
        assert await tool_runs(chat) == {"flaky": 3}
    assert seen[0] == ["approve", "record", "flaky", "stamp"]
    assert model.calls == 2


async def test_answers_take_every_kind_in_any_mix(client):
    """approve() gives a restart for a gated tool and a respond for an interrupt-only one:
    answers= takes them unsorted; respond= refuses a restart with a clear TypeError."""
    model = ScriptedModel(
        [calls(("approve", {"question": "ok?"}), ("stamp", {"value": "x"})), text("done")]
    )
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send("go")
        answers = [approve(i) for i in res.interrupts]
        assert [type(a).__name__ for a in answers] == ["ToolResponse", "ToolRestart"]
        with pytest.raises(TypeError, match=r"pass answers of mixed kinds as answers=\[\.\.\.\]"):
            await chat.resume(respond=answers)  # type: ignore[arg-type]  # the mistake under test
        with pytest.raises(TypeError, match="not one ToolResponse"):
            await chat.resume(answers=answers[0])  # type: ignore[arg-type]  # the mistake under test
        res = await chat.resume(answers=answers, identity="ops")
        assert res.finish_reason == FinishReason.STOP
        assert await tool_runs(chat) == {"stamp": 1}
        history = await chat.history()
    assert sorted(a.name for a in history.answers) == ["approve", "stamp"]
    sent = model.requests[-1].function_responses()
    assert [r["response"] for r in sent] == [{"approved": True}, {"stamped": "x"}]


async def test_call_every_tool_and_offline_scripts(client):
    """The ready-made scripts: the named tools with example input (TestModel's way), then the
    offline model's `call` syntax through the in-process transport."""
    model = ScriptedModel(call_every_tool("record", "approve"))
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send("anything")
        (ask,) = res.interrupts
        assert (ask.name, ask.input) == ("approve", {"question": "example"})
        res = await chat.resume(answers=[deny(ask, "no")])
        assert res.text == (
            'record returned {"recorded": "example"}. '
            'approve returned {"approved": false, "feedback": "no"}.'
        )
    model = ScriptedModel(offline)
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send('call record {"value": "v"}')
        assert res.text == f'{BANNER} record returned {{"recorded": "v"}}.'


async def test_a_scripted_error_is_retried_like_geminis(client):
    model = ScriptedModel([error(503, "overloaded", retry_after=0), text("recovered")])
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send("hi")
    assert (res.text, model.calls) == ("recovered", 2)


async def test_a_worker_joining_a_queue_whose_workers_host_other_agents_warns(env, author_repo):
    """The newcomer's trap: `agent-worker --agents mypackage.agents` on `make run`'s queue.
    The README says to use a queue of one's own; the worker now also says so when it starts."""
    from examples import ALL_AGENTS
    from temporal_agent_interrupts.worker import build_worker
    from temporal_agent_interrupts.worker.peers import unlike_peers

    queue = f"shared-{uuid.uuid4()}"
    examples_worker = build_worker(
        env.client, agents=ALL_AGENTS, task_queue=queue, gemini=ScriptedModel().client()
    )
    async with examples_worker:
        # Once its poll shows (it is unlike a kit worker), workers hosting the same agents are
        # no concern.
        await eventually(
            lambda: unlike_peers(env.client, task_queue=queue, agents=[kit_agent]), bool
        )
        assert await unlike_peers(env.client, task_queue=queue, agents=ALL_AGENTS) == []
        worker = await authors_worker(env, author_repo, queue)
        try:
            await worker.wait_for("host other agents")
        finally:
            worker.proc.send_signal(signal.SIGTERM)
            assert await worker.wait() == 0, worker.output
    (line,) = [x for x in worker.output.splitlines() if "host other agents" in x]
    assert f"other workers on task queue {queue!r} host other agents" in line
    assert "agents=bankingAgent,deployAgent#" in line
    assert "AGENT_TASK_QUEUE" in line


def test_a_message_that_merely_starts_with_call_still_follows_the_example_rules():
    """Before the rules for `call TOOL` looked at the tool's name, "Call savings and transfer
    $500 to savings" stopped the banking rule with a syntax error."""
    banking = {
        "contents": [{"role": "user", "parts": [{"text": "Call savings and transfer $500"}]}],
        "tools": [{"functionDeclarations": [{"name": "userApproval"}, {"name": "transferMoney"}]}],
    }
    reply = offline_rules(Request(model="m", method="generateContent", body=banking))
    assert _parts(reply)[1]["functionCall"]["name"] == "userApproval"
    (part,) = _parts(offline_rules(_request("call me back")))
    assert "This agent has no tool named 'me'." in part["text"]


async def test_a_script_that_runs_out_fails_the_turn_at_once(client):
    """It answered 500 before, which Temporal retried five times (15 s) and counted as calls."""
    with pytest.raises(TypeError, match="a function or a list of replies"):
        ScriptedModel(text("one reply, not in a list"))  # type: ignore[arg-type]  # the mistake under test
    model = ScriptedModel([])
    async with hosted(client, agents=[kit_agent], model=model) as agents:
        chat = await agents.chat("kit")
        res = await chat.send("hi")
    assert res.finish_reason == FinishReason.FAILED
    assert res.error is not None and "no reply left (0 played)" in res.error.message
    assert model.calls == 1


def test_example_inputs_fit_bounds_steps_tuples_and_deep_optionals():
    """`call TOOL` alone sends example_value(schema): it must pass the tool's own check."""
    from temporal_agent_interrupts.workflows.details import example_value

    class Geo(BaseModel):
        lat: float = Field(ge=-90, le=90)

    class Addr(BaseModel):
        geo: Geo

    class Person(BaseModel):
        addr: Addr | None

    class Item(BaseModel):
        person: Person | None

    class Odd(BaseModel):
        negative: int = Field(lt=0)
        step: int = Field(multiple_of=5)
        small: float = Field(gt=0, lt=1)
        pair: tuple[int, str]
        items: list[Item] = Field(min_length=2)
        code: str = Field(min_length=10, max_length=12)
        kind: Literal["a", "b"]

    value = example_value(Odd.model_json_schema())
    Odd.model_validate(value)  # raises if it does not fit
    assert value["items"][0] == {"person": {"addr": {"geo": {"lat": 0.0}}}}

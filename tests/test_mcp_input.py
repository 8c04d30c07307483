"""An MCP server that asks for input (MCP 2026-07-28, ``InputRequiredResult``): the turn pauses
on one interrupt per form, durably, and the call is retried with the answers and the server's
``requestState`` byte for byte, under the same idempotency key.

The servers are real (``tests/mcp_servers.py``): ``transfer`` (destructive: gated) asks one
form; ``survey`` (read-only) asks two, one round each; ``workspace`` asks for the client's
roots; ``spin`` never stops asking. Each logs what its retries were sent (``inputs.log``) and
the idempotency key of every request (``keys.log``). Answers go in by update, and by the real
``temporal workflow signal``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from temporalio.service import RPCError

from temporal_agent_interrupts import AgentClient, FinishReason, approve, deny
from temporal_agent_interrupts.activities.mcp_input import (
    MAX_INPUT_MESSAGE,
    MAX_INPUT_REQUESTS,
    MAX_REQUEST_STATE,
    MAX_SAMPLE_TOKENS,
    RoundRefused,
    read_round,
)
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.mcp import MCPServerHTTP, mcp_tools
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.offline_model import respond as offline_rules
from temporal_agent_interrupts.worker.standin import Request, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows.config import MCP_ACTIVITY, MCP_SAMPLE_ACTIVITY
from temporal_agent_interrupts.workflows.input_rounds import MAX_INPUT_ROUNDS
from tests import test_mcp_tools as mcp_fixtures
from tests.docs import block
from tests.helpers import (
    SUGGEST_AFTER_EVENTS,
    assert_no_workflow_task_failed,
    cli_signal,
    current_details,
    eventually,
    history,
    scheduled_activities,
    server_address,
)
from tests.mcp_servers import TOKEN, inputs, state_token
from tests.test_docs_examples import load
from tests.test_mcp_tools import ROOT, WORKER, agent_with, names

# The MCP tests' fixtures, by name: the servers (stdio and HTTP) and the offline model.
offline = mcp_fixtures.offline
http_server = mcp_fixtures.http_server
server = mcp_fixtures.server

FORM = {"payee": "Ann", "ok": True}


def keys(state: Path) -> list[str]:
    return (state / "keys.log").read_text().split()


async def test_a_server_that_asks_pauses_and_the_answer_a_script_signals_completes_it_once(
    client, offline, server
):
    declared, state = server
    agent = agent_with(mcp_tools(declared))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send('call transfer {"amount": 5}')).interrupts
        assert gate.source == "approval"
        paused = await chat.resume(answers=[approve(gate)], identity="alice")
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        (form,) = paused.interrupts
        assert (form.source, form.ref, form.name) == ("input", gate.ref, "transfer")
        assert form.metadata["message"] == "transfer: question 1 of 1"
        assert (form.metadata["request"], form.metadata["round"]) == ("q1", 1)
        assert form.output_schema is not None and form.output_schema["required"] == ["payee"]
        assert names(state) == ["transfer"]
        # Not a restart, and not an answer that does not fit the form.
        with pytest.raises(ResumeRejected, match="respond"):
            await chat.resume(answers=[form.restart()])
        with pytest.raises(ResumeRejected, match="does not fit the form"):
            await chat.resume(answers=[form.respond({"ok": True})])
        with pytest.raises(ResumeRejected, match="does not ask for: 'identity'"):
            await chat.resume(answers=[form.respond({**FORM, "identity": "cfo@example.com"})])
        # What pending() shows is what the turn paused on.
        (shown,) = await chat.pending()
        assert shown.source == "input" and shown.output_schema == form.output_schema
        body = {"respond": [form.respond(FORM).model_dump()], "identity": "bob"}
        code, out = await cli_signal(client, chat.id, "resume", json.dumps(body))
        assert code == 0, out
        done = await eventually(
            chat.last_turn,
            lambda r: r is not None and r.finish_reason != FinishReason.INTERRUPTED,
            timeout=30,
        )
        assert done is not None and done.finish_reason == FinishReason.STOP, done
        # The model heard the server's final answer, once, as the call's output.
        (response,) = offline.requests[-1].function_responses()
        assert response["name"] == "transfer"
        assert response["response"] == {
            "done": True,
            "amount": 5,
            "answers": {"q1": {"action": "accept", "content": FORM}},
        }
        records = await agents.audit(chat.id)
    # Asked once, completed once; the gate was asked before the first round only.
    assert names(state) == ["transfer", "transfer:done"]
    (retry,) = inputs(state)
    assert retry["state"] == state_token("transfer", 1)  # byte for byte
    assert retry["answers"] == {"q1": {"action": "accept", "content": FORM}}
    first, second = keys(state)
    assert first == second and len(first) == 32  # one run: one idempotency key
    assert [(r.decision, r.identity) for r in records] == [
        ("approved", "alice"),
        ("answered", "bob"),
    ]
    hist = await assert_no_workflow_task_failed(client, chat.id)
    assert scheduled_activities(hist).count(MCP_ACTIVITY) == 2


async def test_a_two_round_tool_pauses_twice_and_a_denial_declines_a_form(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        # Read-only: no gate, the first round pauses the turn at once.
        (one,) = (await chat.send('call survey {"topic": "lunch"}')).interrupts
        assert (one.source, one.metadata["round"]) == ("input", 1)
        # The Temporal UI's details panel suggests the command that answers the form: a
        # respond with its fields, not an approval.
        shown = await current_details(client, chat.id)
        assert '"respond":[{"name":"survey"' in shown and '"payee":' in shown, shown
        assert "tool_approved" not in shown
        (two,) = (await chat.resume(answers=[one.respond({"payee": "Bo"})])).interrupts
        assert (two.source, two.ref, two.metadata["round"]) == ("input", one.ref, 2)
        assert two.metadata["message"] == "survey: question 2 of 2"
        done = await chat.resume(answers=[deny(two, "not telling")], identity="carol")
        assert done.finish_reason == FinishReason.STOP, done
        (response,) = offline.requests[-1].function_responses()
        assert response["response"] == {"declined": True, "round": 2}
        records = await agents.audit(chat.id)
    sent = inputs(http_server.state)
    assert [r["state"] for r in sent] == [state_token("survey", 1), state_token("survey", 2)]
    assert sent[0]["answers"] == {"q1": {"action": "accept", "content": {"payee": "Bo"}}}
    assert sent[1]["answers"] == {"q2": {"action": "decline"}}
    assert len(set(keys(http_server.state))) == 1
    assert [r.decision for r in records] == ["answered", "denied"]
    assert names(http_server.state) == ["survey", "survey"]


async def test_a_gated_tools_form_is_answered_only_by_whom_its_gate_admits(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server(), approvers=["alice"]))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (gate,) = (await chat.send('call transfer {"amount": 9}')).interrupts
        (form,) = (await chat.resume(answers=[approve(gate)], identity="alice")).interrupts
        assert form.source == "input" and form.approvers == ["alice"]
        # Whoever may signal cannot name the payee of an approved transfer.
        with pytest.raises(ResumeRejected, match="mallory"):
            await chat.resume(answers=[form.respond({"payee": "Mallory"})], identity="mallory")
        done = await chat.resume(answers=[form.respond(FORM)], identity="alice")
        assert done.finish_reason == FinishReason.STOP, done
    assert [r["answers"] for r in inputs(http_server.state)] == [
        {"q1": {"action": "accept", "content": FORM}}
    ]


async def test_roots_are_answered_from_the_servers_configuration_without_a_pause(
    client, offline, http_server
):
    declared = MCPServerHTTP(
        "records",
        http_server.url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        roots=["file:///srv/ledger"],
    )
    agent = agent_with(mcp_tools(declared))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        done = await chat.send("call workspace {}")
        assert done.finish_reason == FinishReason.STOP, done
        assert "file:///srv/ledger" in done.text
    assert [a for n, a in _calls(http_server.state) if n == "workspace"] == [
        {"round": 0},
        {"round": 1, "state": "roots-1"},
    ]


async def test_a_sampling_request_is_answered_by_the_agents_model_with_its_prompt_recorded(
    client, http_server
):
    def rules(request: Request) -> Any:
        if request.method == "generateContent":  # the sampling request, not a turn
            (part,) = request.last_parts
            return text(f"sampled: {part['text']}")
        return offline_rules(request)

    model = ScriptedModel(rules)
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        done = await chat.send('call haiku {"topic": "rain"}')
        assert done.finish_reason == FinishReason.STOP, done  # no person was asked
    (asked,) = [r for r in model.requests if r.method == "generateContent"]
    assert asked.body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert asked.body["generationConfig"]["maxOutputTokens"] == MAX_SAMPLE_TOKENS  # capped
    (response,) = model.requests[-1].function_responses()
    assert response["response"] == {"poem": "sampled: A haiku about rain", "model": agent.model}
    assert names(http_server.state) == ["haiku", "haiku:done"]
    # The prompt is in history: the sampling activity's input.
    hist = await assert_no_workflow_task_failed(client, chat.id)
    (sampled,) = [
        e.activity_task_scheduled_event_attributes
        for e in hist.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == MCP_SAMPLE_ACTIVITY
    ]
    recorded = json.loads(sampled.input.payloads[0].data)
    assert recorded["ask"]["messages"] == [{"role": "user", "text": "A haiku about rain"}]


async def test_a_server_that_never_stops_asking_fails_the_call_not_the_conversation(
    client, offline, http_server
):
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        done = await chat.send("call spin {}")
        assert done.finish_reason == FinishReason.STOP, done
        assert "input request refused" in done.text
        assert f"more than {MAX_INPUT_ROUNDS} times" in done.text
        # The conversation goes on.
        again = await chat.send('call lookup {"key": "k"}')
        assert again.finish_reason == FinishReason.STOP
    spins = [n for n in names(http_server.state) if n == "spin"]
    assert len(spins) == MAX_INPUT_ROUNDS + 1  # the first call and each state-only round


async def test_a_round_survives_continue_as_new(small_histories, offline, http_server):
    client = small_histories.client
    agent = agent_with(mcp_tools(http_server.server()))
    async with hosted(client, agents=[agent], model=offline) as agents:
        chat = await agents.chat(agent.name)
        (one,) = (await chat.send('call survey {"topic": "t"}')).interrupts
        handle = client.get_workflow_handle(chat.id)
        first_run = (await handle.describe()).run_id
        # Refused signals grow the paused run's history past the server's suggestion: it
        # continues as new, carrying the round.
        for n in range(SUGGEST_AFTER_EVENTS):
            try:
                await handle.signal("resume", {"respond": [{"name": "x", "ref": f"x{n}"}]})
            except RPCError:
                break
        await eventually(handle.describe, lambda d: d.run_id != first_run, timeout=30)
        (two,) = (await chat.resume(answers=[one.respond({"payee": "A"})])).interrupts
        done = await chat.resume(answers=[two.respond({"payee": "B"})])
        assert done.finish_reason == FinishReason.STOP, done
    sent = inputs(http_server.state)
    assert [r["state"] for r in sent] == [state_token("survey", 1), state_token("survey", 2)]
    assert [r["answers"]["q2"]["content"] for r in sent[1:]] == [{"payee": "B"}]
    assert len(set(keys(http_server.state))) == 1


async def test_a_worker_killed_between_rounds_loses_nothing(client, http_server):
    queue = f"tq-{uuid.uuid4()}"
    address = server_address(client)
    # Popen returns at once (it does not wait for the worker): nothing blocks the loop.
    first = subprocess.Popen(  # noqa: ASYNC220
        [*WORKER, address, client.namespace, queue, http_server.url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert first.stdout is not None
        line = await asyncio.to_thread(first.stdout.readline)
        assert line.strip() == b"ready"
        from tests.mcp_worker import AGENT, agent

        agents = AgentClient(client, task_queue=queue)
        chat = await agents.chat(AGENT)
        (one,) = (await chat.send('call survey {"topic": "t"}')).interrupts
        first.send_signal(signal.SIGKILL)  # between the rounds: only history holds the wait
        first.wait()
        model = ScriptedModel(offline_rules)
        async with build_worker(
            client, agents=[agent(http_server.url)], task_queue=queue, gemini=model.client()
        ):
            # The first round's answer by `temporal workflow signal`, as a script sends it.
            body = {"respond": [one.respond({"payee": "A"}).model_dump()]}
            code, out = await cli_signal(client, chat.id, "resume", json.dumps(body))
            assert code == 0, out
            (two,) = await eventually(
                chat.pending, lambda p: bool(p) and p[0].metadata["round"] == 2, timeout=30
            )
            done = await chat.resume(answers=[two.respond({"payee": "B"})])
            assert done.finish_reason == FinishReason.STOP, done
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    sent = inputs(http_server.state)
    assert [r["state"] for r in sent] == [state_token("survey", 1), state_token("survey", 2)]
    assert [n for n in names(http_server.state)] == ["survey", "survey:done"]
    assert len(set(keys(http_server.state))) == 1
    await assert_no_workflow_task_failed(client, chat.id)
    assert scheduled_activities(await history(client, chat.id)).count(MCP_ACTIVITY) == 3


def _calls(state: Path) -> list[tuple[str, dict[str, Any]]]:
    from tests.mcp_servers import calls

    return calls(state)


def _form(message: str = "Confirm?", schema: dict[str, Any] | None = None) -> Any:
    return mcp_types.ElicitRequest(
        params=mcp_types.ElicitRequestFormParams(
            message=message,
            requested_schema=schema
            if schema is not None
            else {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        )
    )


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        (
            {f"k{n}": _form() for n in range(MAX_INPUT_REQUESTS + 1)},
            f"the limit is {MAX_INPUT_REQUESTS}",
        ),
        ({"k": _form("x" * (MAX_INPUT_MESSAGE + 1))}, "input message passes"),
        (
            {
                "k": _form(
                    schema={
                        "type": "object",
                        "properties": {"nested": {"type": "object", "properties": {}}},
                    }
                )
            },
            "not a primitive",
        ),
        ({"k": _form(schema={"type": "array"})}, '"type": "object"'),
        (
            {
                "k": mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestURLParams(
                        message="Sign in", url="https://example.com/login"
                    )
                )
            },
            "URL-mode elicitation",
        ),
        (
            {
                "k": mcp_types.CreateMessageRequest(
                    params=mcp_types.CreateMessageRequestParams(
                        messages=[
                            mcp_types.SamplingMessage(
                                role="user",
                                content=mcp_types.ImageContent(
                                    type="image", data="AA==", mime_type="image/png"
                                ),
                            )
                        ],
                        max_tokens=10,
                    )
                )
            },
            "'image' content",
        ),
        (
            {
                "k": mcp_types.CreateMessageRequest(
                    params=mcp_types.CreateMessageRequestParams(messages=[], max_tokens=10)
                )
            },
            "does not end with a user message",
        ),
    ],
)
def test_a_round_out_of_bounds_is_refused_with_its_reason(asked: dict[str, Any], why: str):
    with pytest.raises(RoundRefused, match=why):
        read_round(
            mcp_types.InputRequiredResult(input_requests=asked, request_state="s"),
            previous=None,
            roots=(),
        )


def test_a_large_state_and_too_many_rounds_are_refused():
    with pytest.raises(RoundRefused, match="requestState passes"):
        read_round(
            mcp_types.InputRequiredResult(request_state="x" * (MAX_REQUEST_STATE + 1)),
            previous=None,
            roots=(),
        )
    asked = mcp_types.InputRequiredResult(input_requests={"k": _form()}, request_state="s")
    last = read_round(asked, previous=None, roots=())
    for _ in range(MAX_INPUT_ROUNDS - 1):
        last = read_round(asked, previous=last, roots=())
    assert last.round == MAX_INPUT_ROUNDS
    with pytest.raises(RoundRefused, match=f"more than {MAX_INPUT_ROUNDS} times"):
        read_round(asked, previous=last, roots=())


async def test_the_mcp_page_s_server_that_asks_runs_offline_as_printed(
    client, tmp_path, monkeypatch, capsys
):
    for key in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(key, raising=False)
    server = block(
        "# payee_server.py: a server whose tool asks the user to confirm the payee first",
        lang="python",
    )
    (tmp_path / "payee_server.py").write_text(server)
    source = block(
        "# payee_agent.py: the call pauses on the server's form; the answer completes it",
        lang="python",
    )
    module = load(tmp_path, "payee_agent", source, monkeypatch)
    await module.main(server_address(client))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "interrupted input Who gets 40?", out
    assert out[1].startswith("stop"), out
    assert '"paid": 40' in out[1] and '"to": "Ann"' in out[1] and '"state": "asked"' in out[1]

"""The web app (client/web.py) against a real dev server: AG-UI runs, the approvals API with
every status it returns, identity from the request, and hostile requests.

The official AG-UI client's own test is tests/test_agui_client.py; the inbox page's is
tests/test_inbox_page.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest

from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.client.api import AgentClient
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import MAX_REASON, Access, Forbidden, agents_app
from temporal_agent_interrupts.worker.standin import Reply, calls, text
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually, free_port
from tests.test_operator import VISIBILITY_TIMEOUT
from tests.web import Frame, answer, approval, frames, run_input, served


def gated(approvers: list[str] | None = None) -> Agent:
    """``release`` gated by ToolApproval, ``approve`` interrupt-only, ``lookup`` free."""
    return Agent(
        f"web-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.approve, t.release, t.lookup],
        middleware=[ToolApproval(allow=["lookup"], approvers=approvers or [])],
    )


def types(seen: list[Frame]) -> list[str]:
    return [f.type for f in seen]


# ----------------------------------------------------------------------------------------------
# AG-UI.


async def test_an_agui_run_pauses_with_the_interrupt_outcome_and_a_resume_runs_the_tool(
    run_worker, model, client
):
    agent = gated()
    model.reply(
        Reply.streamed(
            calls(("release", {"service": "api", "version": "2"}, "r1"), say="Checking first."),
            pieces=3,
        ),
        Reply.streamed(text("Released api 2."), pieces=3),
    )
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(AgentClient(client, task_queue=agents.task_queue), dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/{agent.name}"
            first = await frames(http, url, run_input(thread, "release api 2"))
            assert types(first)[0] == "RUN_STARTED"
            finished = first[-1].event
            assert finished["type"] == "RUN_FINISHED"
            assert finished["outcome"]["type"] == "interrupt"
            (interrupt,) = finished["outcome"]["interrupts"]
            assert interrupt["id"] == interrupt["toolCallId"] == "r1"
            assert interrupt["reason"] == "tool_call"
            assert interrupt["responseSchema"]["required"] == ["approved"]
            assert interrupt["metadata"]["input"] == {"service": "api", "version": "2"}
            # What a person is shown travels with it, and the interrupt's words are the
            # call's summary and why it waits, not the gate's "Tool not in approved list".
            shown = interrupt["metadata"]["shown"]
            assert shown["summary"] == "Release: Service api, Version 2"
            assert shown["why"] == "This needs your approval before it runs."
            assert (shown["asked"], shown["said"]) == ("release api 2", "Checking first.")
            assert interrupt["message"] == f"{shown['summary']} — {shown['why']}"
            assert "approved list" not in interrupt["message"]
            assert "MESSAGES_SNAPSHOT" in types(first)
            started = [f.event for f in first if f.type == "TOOL_CALL_START"]
            assert [s["toolCallId"] for s in started] == ["r1"]
            assert t.RUNS["release"] == 0
            # Every frame but a refusal has an id, all distinct and in order.
            ids = [f.id for f in first]
            assert None not in ids and len(set(ids)) == len(ids)

            second = await frames(
                http,
                url,
                run_input(thread, resume=[approval(interrupt)]),
            )
            assert t.RUNS["release"] == 1
            (result,) = [f.event for f in second if f.type == "TOOL_CALL_RESULT"]
            assert result["toolCallId"] == "r1"
            text_out = "".join(f.event["delta"] for f in second if f.type == "TEXT_MESSAGE_CONTENT")
            assert text_out == "Released api 2."
            assert second[-1].event["outcome"] == {"type": "success"}
    await assert_no_workflow_task_failed(client, thread)


async def test_a_refused_resume_is_a_run_error_and_runs_nothing(run_worker, model, client):
    agent = gated()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("ok"))
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(AgentClient(client, task_queue=agents.task_queue), dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/{agent.name}"
            await frames(http, url, run_input(thread, "release api 2"))
            unknown = await frames(
                http,
                url,
                run_input(
                    thread,
                    resume=[{"interruptId": "nope", "status": "resolved", "payload": {}}],
                ),
            )
            assert types(unknown) == ["RUN_ERROR"]
            assert unknown[0].event["code"] == "not_found"
            assert "nope" in unknown[0].event["message"]
            # A message while paused: refused by the conversation itself.
            busy = await frames(http, url, run_input(thread, "hello?"))
            assert types(busy) == ["RUN_ERROR"] and busy[0].event["code"] == "conflict"
            assert "paused" in busy[0].event["message"]
            # A payload that is not an approval.
            bad = await frames(
                http,
                url,
                run_input(
                    thread, resume=[{"interruptId": "r1", "status": "resolved", "payload": 3}]
                ),
            )
            assert types(bad) == ["RUN_ERROR"] and bad[0].event["code"] == "invalid"
    assert t.RUNS["release"] == 0
    await assert_no_workflow_task_failed(client, thread)


async def test_last_event_id_reattaches_with_no_gap_and_no_duplicate(run_worker, model, client):
    """A stream cut after each frame in turn, and picked up with its last id: the frames
    spliced together are those of the uncut run."""
    agent = gated()
    model.reply(
        Reply.streamed(calls(("lookup", {"key": "k"}, "l1"), say="one two three four"), pieces=4),
        Reply.streamed(text("five six"), pieces=2),
    )
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(AgentClient(client, task_queue=agents.task_queue), dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/{agent.name}"
            body = run_input(thread, "look k up")
            whole = await frames(http, url, body)
            assert whole[-1].event["outcome"] == {"type": "success"}
            assert t.RUNS["lookup"] == 1
            for cut in range(1, len(whole)):
                rest = await frames(
                    http, url, body, headers={"Last-Event-ID": str(whole[cut - 1].id)}
                )
                spliced = whole[:cut] + rest
                assert [(f.id, f.type) for f in spliced] == [(f.id, f.type) for f in whole], cut
            assert t.RUNS["lookup"] == 1  # a reattach runs nothing again
            # An id this app never sent.
            refused = await http.post(url, json=body, headers={"Last-Event-ID": "x"})
            assert refused.status_code == 400
            assert refused.headers["content-type"] == "application/problem+json"


# ----------------------------------------------------------------------------------------------
# The approvals API.


async def paused_entry(agents: AgentClient, agent: str, chat_id: str) -> dict[str, Any]:
    async def listed() -> list[Any]:
        return [c for c in await agents.pending(agent=agent) if c.chat_id == chat_id]

    (chat,) = await eventually(listed, lambda c: len(c) == 1, timeout=VISIBILITY_TIMEOUT)
    return chat.model_dump(mode="json")


async def test_the_approvals_api_answers_and_refuses_with_each_status(run_worker, model, client):
    agent = gated(approvers=["ops@example.com"])
    model.reply(
        calls(
            ("release", {"service": "api", "version": "2"}, "r1"),
            ("approve", {"question": "order ink?"}, "a1"),
        ),
        text("done"),
    )
    as_ops = {"X-Agent-Identity": "ops@example.com"}
    as_eve = {"X-Agent-Identity": "eve@example.com"}
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, dev_loopback=True)
        chat = await agents.chat(agent.name)
        await chat.send("release and ask")
        listed = await paused_entry(agents, agent.name, chat.id)
        digest = {i["ref"]: i["input_digest"] for i in listed["interrupts"]}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/api/chats/{chat.id}/interrupts"

            async def post(ref: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
                r = await answer(http, base, chat.id, ref, body, headers=headers)
                if r.status_code != 200:
                    assert r.headers["content-type"] == "application/problem+json"
                    assert r.json()["status"] == r.status_code
                return r.status_code, r.json()

            inbox = await http.get(f"{base}/api/inbox", params={"agent": agent.name})
            assert inbox.status_code == 200
            assert [c["chat_id"] for c in inbox.json()["chats"]] == [chat.id]
            pending = (await http.get(f"{base}/api/chats/{chat.id}/pending")).json()
            assert [i["ref"] for i in pending["interrupts"]] == ["r1", "a1"]

            # 400: malformed JSON, a body that is not an answer, a malformed agent filter.
            r = await http.post(
                f"{url}/r1", content=b"{nope", headers={"content-type": "application/json"}
            )
            assert r.status_code == 400 and r.json()["code"] == "malformed_json"
            assert (await post("r1", {"action": "launch"}, as_ops))[0] == 400
            assert (await post("r1", {"action": "approve"}, as_ops))[0] == 400  # no digest
            r = await http.get(f"{base}/api/inbox", params={"agent": 'a"b'})
            assert r.status_code == 400
            # 415: not JSON. 413: too large, whatever it says and whatever it sends.
            assert (await http.post(f"{url}/r1", content=b"x")).status_code == 415
            big = b" " * (2 * 1024 * 1024)
            r = await http.post(
                f"{url}/r1", content=big, headers={"content-type": "application/json"}
            )
            assert r.status_code == 413
            # 404: no such chat, no such call.
            approve_r1 = {"action": "approve", "input_digest": digest["r1"]}
            r = await answer(http, base, "no-such-chat", "r1", approve_r1, headers=as_ops)
            assert r.status_code == 404 and r.json()["code"] == "not_found"
            assert (await post("zz", approve_r1, as_ops))[0] == 404
            assert (await http.get(f"{base}/api/chats/no-such-chat/audit")).status_code == 404
            # 403: not one of the approvers.
            code, body = await post("r1", approve_r1, as_eve)
            assert (
                code == 403 and body["code"] == "forbidden" and "ops@example.com" in body["detail"]
            )
            # 409: an input other than the one shown.
            code, body = await post("r1", {**approve_r1, "input_digest": "0" * 32}, as_ops)
            assert code == 409 and "no longer has the input" in body["detail"]
            # 422: an output that does not fit the tool's output schema.
            code, body = await post(
                "a1",
                {"action": "respond", "input_digest": digest["a1"], "output": {"approved": "y"}},
                as_ops,
            )
            assert code == 422 and body["code"] == "invalid"
            assert t.RUNS["release"] == 0
            # 200: approved by an approver; the turn stays paused on the other call.
            code, body = await post("r1", approve_r1, as_ops)
            assert code == 200, body
            assert body["result"]["finish_reason"] == "interrupted"
            assert [i["ref"] for i in body["result"]["interrupts"]] == ["a1"]
            # 409: the second click.
            code, body = await post("r1", approve_r1, as_ops)
            assert code == 409 and "already answered" in body["detail"]
            # The step's calls run once all of them are answered.
            assert t.RUNS["release"] == 0
            code, body = await post(
                "a1",
                {"action": "respond", "input_digest": digest["a1"], "output": {"approved": True}},
                as_ops,
            )
            assert code == 200 and body["result"]["text"] == "done"
            assert t.RUNS["release"] == 1
            audit = (await http.get(f"{base}/api/chats/{chat.id}/audit")).json()
            assert [(r["ref"], r["identity"]) for r in audit["records"]] == [
                ("r1", "ops@example.com"),
                ("a1", "ops@example.com"),
            ]
            # 421: a Host this app does not answer to (DNS rebinding).
            r = await http.get(f"{base}/api/inbox", headers={"Host": "evil.example"})
            assert r.status_code == 421
    await assert_no_workflow_task_failed(client, chat.id)


async def test_without_an_identity_source_answers_are_refused(run_worker, model, client):
    agent = gated()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("ok"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        (shown,) = (await chat.send("release")).interrupts
        body = {"action": "approve", "input_digest": shown.input_digest}
        async with httpx2.AsyncClient(timeout=60) as http:
            async with served(agents_app(agents)) as base:
                r = await answer(
                    http, base, chat.id, "r1", body, headers={"X-Agent-Identity": "ops@x"}
                )
                assert r.status_code == 401 and "no way to know who answers" in r.json()["detail"]

            # A function of the request: here a header a fronting proxy sets.
            def by_proxy(request: Any) -> str | None:
                return request.headers.get("x-forwarded-user")

            async with served(agents_app(agents, identity=by_proxy)) as base:
                r = await answer(http, base, chat.id, "r1", body)
                assert r.status_code == 401
                r = await answer(
                    http, base, chat.id, "r1", body, headers={"X-Forwarded-User": "ann@x"}
                )
                assert r.status_code == 200
        (record,) = await chat.audit()
        assert record.identity == "ann@x"
    assert t.RUNS["release"] == 1


async def test_no_worker_is_503_and_too_many_streams_is_429(run_worker, model, client):
    agent = gated()
    model.reply(text("hi"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        app = agents_app(
            agents, dev_loopback=True, streams_per_chat=1, worker_timeout=timedelta(seconds=1)
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            nxt = await next_offset(chat)
            # A stream that waits for the thread's next run holds the one slot.
            held = asyncio.ensure_future(
                frames(
                    http,
                    url,
                    run_input(chat.id),
                    headers={"Last-Event-ID": f"{nxt}/{nxt}.0"},
                )
            )
            await asyncio.sleep(0.5)
            r = await http.post(url, json=run_input(chat.id, "again"))
            assert r.status_code == 429 and r.json()["code"] == "too_many_streams"
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
    async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
        r = await http.get(f"{base}/api/chats/{chat.id}/pending")
        assert r.status_code == 503 and r.json()["code"] == "no_worker"


# ----------------------------------------------------------------------------------------------
# Hostile requests: a clear refusal, nothing run, no workflow task failed.


async def test_hostile_requests_get_clear_refusals_and_fail_nothing(run_worker, model, client):
    agent = gated()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("ok"))
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(
            agents,
            identity=lambda request: request.headers.get("x-user", "tester@example.com"),
            cors_origins=["http://ui.example"],
        )
        chat = await agents.chat(agent.name)
        (shown,) = (await chat.send("release")).interrupts
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"

            async def refused(r: httpx2.Response, status: int) -> dict[str, Any]:
                assert r.status_code == status, r.text
                assert r.headers["content-type"] == "application/problem+json"
                return r.json()

            # Bodies: too large (said and sent), not JSON, nested past what JSON parsing takes,
            # and not a run input.
            big = b"[" * (3 * 1024 * 1024)
            await refused(
                await http.post(url, content=big, headers={"content-type": "application/json"}),
                413,
            )
            deep = b"[" * 200_000 + b"]" * 200_000
            body = await refused(
                await http.post(url, content=deep, headers={"content-type": "application/json"}),
                400,
            )
            assert body["code"] == "malformed_json"
            body = await refused(await http.post(url, json={"threadId": 3}), 400)
            assert "the run input" in body["detail"]
            await refused(await http.post(url, json=run_input("bad\x00id", "hi")), 400)
            lone = json.dumps(run_input("bad\ud800id", "hi"))
            r = await http.post(url, content=lone, headers={"content-type": "application/json"})
            await refused(r, 400)
            await refused(await http.post(f"{base}/agui/a%22b", json=run_input("t", "hi")), 400)

            # CORS: an origin given gets its headers; any other is refused before it acts.
            r = await http.options(url, headers={"Origin": "http://ui.example"})
            assert r.status_code == 204
            assert r.headers["access-control-allow-origin"] == "http://ui.example"
            r = await http.options(url, headers={"Origin": "http://evil.example"})
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
            evil = await http.post(
                f"{base}/api/chats/{chat.id}/interrupts/r1",
                json={"action": "approve", "input_digest": shown.input_digest},
                headers={"Origin": "http://evil.example"},
            )
            assert (await refused(evil, 403))["code"] == "origin"
            # Identity is never taken from the body.
            r = await http.post(
                f"{base}/api/chats/{chat.id}/interrupts/r1",
                json={
                    "action": "approve",
                    "input_digest": shown.input_digest,
                    "identity": "ceo@example.com",
                },
            )
            assert "identity" in (await refused(r, 400))["detail"]

            # Inside a run: what the conversation cannot store is a RUN_ERROR, never a failed
            # workflow task, and nothing runs.
            def resume_with(payload: Any) -> dict[str, Any]:
                entry = {"interruptId": "r1", "status": "resolved", "payload": payload}
                return run_input(chat.id, resume=[entry])

            nested: Any = {"approved": True}
            for _ in range(100):
                nested = {"input": nested}
            for payload in (
                {"approved": True, "input": {"service": "\ud800", "version": "2"}},
                {"approved": True, "input": nested},
                {"approved": True, "input": {"service": "x" * 1_500_000, "version": "2"}},
                {"approved": True, "reason": 1},
                {"approved": True, "extra": 1},
            ):
                seen = await frames(http, url, resume_with(payload))
                assert types(seen) == ["RUN_ERROR"], seen
            # A thread that does not exist: reconnecting to it, answering on it.
            ghost = f"ghost-{uuid.uuid4()}"
            seen = await frames(http, url, run_input(ghost))
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "not_found"
            seen = await frames(
                http,
                url,
                run_input(ghost, resume=[{"interruptId": "x", "status": "cancelled"}]),
            )
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "not_found"
            seen = await frames(http, url, run_input(ghost), headers={"Last-Event-ID": "5/5.0"})
            assert types(seen) == ["RUN_ERROR"]
        assert (await chat.pending())[0].ref == "r1"  # the pause is kept
    assert t.RUNS["release"] == 0
    await assert_no_workflow_task_failed(client, chat.id)


async def test_the_applications_authorize_rule_is_asked_before_anything_is_done(
    run_worker, model, client
):
    """``authorize(request, access)``: here a user may only touch chats named after them."""
    agent = gated()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("ok"))
    asked: list[Access] = []

    async def own_chats_only(request: Any, access: Access) -> bool:
        asked.append(access)
        user = request.headers.get("x-user")
        return access.chat_id is not None and access.chat_id.startswith(f"{user}-")

    async with run_worker(agents=[agent]) as agents:
        app = agents_app(
            agents, identity=lambda request: request.headers.get("x-user"), authorize=own_chats_only
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            thread = f"ann-{uuid.uuid4()}"
            ann, bob = {"X-User": "ann"}, {"X-User": "bob"}
            r = await http.post(url, json=run_input(thread, "release"), headers=bob)
            assert r.status_code == 403 and r.json()["code"] == "forbidden"
            with pytest.raises(AssertionError):  # nothing started for bob
                await frames(http, url, run_input(thread), headers=bob)
            seen = await frames(http, url, run_input(thread, "release"), headers=ann)
            assert seen[-1].event["outcome"]["type"] == "interrupt"
            for path in ("pending", "audit"):
                r = await http.get(f"{base}/api/chats/{thread}/{path}", headers=bob)
                assert r.status_code == 403
            digest = seen[-1].event["outcome"]["interrupts"][0]["metadata"]["inputDigest"]
            body = {"action": "approve", "input_digest": digest}
            assert (await answer(http, base, thread, "r1", body, headers=bob)).status_code == 403
            assert (await http.get(f"{base}/api/inbox", headers=ann)).status_code == 403
            r = await answer(http, base, thread, "r1", body, headers=ann)
            assert r.status_code == 200 and r.json()["result"]["text"] == "ok"
    assert t.RUNS["release"] == 1
    assert {a.action for a in asked} == {"send", "read", "answer", "inbox"}
    # The approvals API names the chat's agent too (read from the server), as AG-UI does.
    assert Access(action="answer", chat_id=thread, agent=agent.name, identity="ann") in asked


async def test_a_refusal_carries_the_reason_the_application_gave_escaped_and_bounded(client):
    """``authorize`` refuses with a reason by raising ``Forbidden``; returning False still
    refuses, saying only what was refused. The reason is the application's text going back to
    whoever was refused: its controls are shown as escapes and it is cut to ``MAX_REASON``."""
    reasons = {
        "ann": "answers on payments chats need the payments-approvers group",
        "eve": "line\nbreak \x1b[31mred\u202e " + "x" * 5000,
    }

    def rule(request: Any, access: Access) -> bool:
        user = request.headers.get("x-user", "")
        if user in reasons:
            raise Forbidden(reasons[user])
        return user == "cy"

    app = agents_app(
        AgentClient(client), identity=lambda r: r.headers.get("x-user"), authorize=rule
    )
    async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:

        async def refusal(user: str) -> str:
            r = await http.get(f"{base}/api/inbox", headers={"X-User": user})
            assert r.status_code == 403, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["code"] == "forbidden"
            return r.json()["detail"]

        assert await refusal("ann") == f"not allowed to inbox: {reasons['ann']}"
        bounded = await refusal("eve")
        assert bounded.startswith("not allowed to inbox: line\\x0abreak \\x1b[31mred\\u202e x")
        assert len(bounded) == len("not allowed to inbox: ") + MAX_REASON
        assert bounded.endswith("…") and "\x1b" not in bounded and "\n" not in bounded
        assert await refusal("bob") == "not allowed to inbox"  # the bool form, as before
        assert (await http.get(f"{base}/api/inbox", headers={"X-User": "cy"})).status_code == 200


def test_dev_mode_serves_loopback_only():
    agents = AgentClient.__new__(AgentClient)
    with pytest.raises(ValueError, match="loopback only"):
        agents_app(agents, dev_loopback=True, allowed_hosts=["agents.example"])
    with pytest.raises(ValueError, match="loopback only"):
        agents_app(agents, dev_loopback=True, cors_origins=["https://app.example"])
    with pytest.raises(TypeError):
        agents_app(agents, identity="header")  # type: ignore[arg-type]  # the wrong form, on purpose


WEB_APP = "# web_app.py: served with uvicorn, in your own service (uvicorn web_app:app --port 8000)"
"""The first line of docs/answering/web.md's FastAPI service, which names its command."""


async def test_the_docs_fastapi_service_serves_the_app_behind_a_login_under_uvicorn(env, tmp_path):
    """The docs' ``web_app.py`` runs as printed, as a reader runs it: saved in a folder of its
    own and served by ``uvicorn web_app:app``, the command its first line gives (only the port
    changed), in a process of its own. Its lifespan connects from the environment and mounts the
    app behind an HS256 login (its secret and the app's key from the environment) with one
    allowed origin; the login answers as its holder, and the service's own route still answers."""
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from tests.docs import block
    from tests.helpers import server_address
    from tests.test_worker_process import Process, bare_environ

    secret = uuid.uuid4().hex + uuid.uuid4().hex
    key = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    source = block(WEB_APP, lang="python")
    command = re.search(r"\((uvicorn [^)]*)\)", source.split("\n", 1)[0])
    assert command is not None, source.split("\n", 1)[0]
    folder = tmp_path / "service"
    folder.mkdir()
    (folder / "web_app.py").write_text(source)
    port = free_port()
    argv = shlex.split(command[1].replace("--port 8000", f"--port {port}"))
    environ = bare_environ(
        tmp_path,
        TEMPORAL_ADDRESS=server_address(env.client),
        LOGIN_SECRET=secret,
        AGENTS_APP_KEY=key.decode(),
    )
    environ.pop("PYTHONPATH")  # a service of its own: the package is installed, not cloned
    uvicorn = await Process.start(
        str(Path(sys.executable).parent / argv[0]), *argv[1:], env=environ, cwd=folder
    )
    try:
        await uvicorn.wait_for("Application startup complete")
        base = f"http://127.0.0.1:{port}"
        login = jwt.encode(
            {"email": "ann@example.com", "aud": "our-app", "exp": int(time.time()) + 3600},
            secret,
            algorithm="HS256",
        )
        async with httpx2.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{base}/health")).json() == {"status": "ok"}
            agents = f"{base}/agents"
            whoami = await http.get(
                f"{agents}/api/whoami", headers={"Authorization": f"Bearer {login}"}
            )
            assert whoami.json() == {"identity": "ann@example.com", "mode": "login"}
            r = await http.options(
                f"{agents}/api/inbox", headers={"Origin": "https://app.example.com"}
            )
            assert r.headers["access-control-allow-origin"] == "https://app.example.com"
            r = await answer(http, agents, "c", "r", {"action": "approve", "input_digest": "d"})
            assert r.status_code == 401 and "login" in r.json()["detail"]
    finally:
        await uvicorn.stop()
    assert "Traceback" not in uvicorn.output, uvicorn.output


async def test_a_partial_resume_ends_with_what_is_still_pending_and_reattaches(
    run_worker, model, client
):
    agent = gated()
    model.reply(
        calls(
            ("release", {"service": "api", "version": "2"}, "r1"),
            ("release", {"service": "web", "version": "3"}, "r2"),
        ),
        text("both done"),
    )
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/{agent.name}"
            first = await frames(http, url, run_input(thread, "release both"))
            shown = first[-1].event["outcome"]["interrupts"]
            assert [i["id"] for i in shown] == ["r1", "r2"]
            approve_r1 = approval(shown[0])
            body = run_input(thread, resume=[approve_r1])
            partial = await frames(http, url, body)
            assert types(partial) == ["RUN_STARTED", "CUSTOM", "RUN_FINISHED"]
            assert partial[1].event["value"]["ref"] == "r1"
            (left,) = partial[-1].event["outcome"]["interrupts"]
            assert left["id"] == "r2"
            # Reattached after each of its frames: the rest, the same, and nothing runs.
            for cut in range(1, len(partial)):
                rest = await frames(
                    http, url, body, headers={"Last-Event-ID": str(partial[cut - 1].id)}
                )
                assert [(f.id, f.type) for f in partial[:cut] + rest] == [
                    (f.id, f.type) for f in partial
                ]
            assert t.RUNS["release"] == 0
            deny_r2 = {"interruptId": "r2", "status": "cancelled"}
            last = await frames(http, url, run_input(thread, resume=[deny_r2]))
            assert last[-1].event["outcome"] == {"type": "success"}
            results = {
                f.event["toolCallId"]: f.event["content"]
                for f in last
                if f.type == "TOOL_CALL_RESULT"
            }
            assert set(results) == {"r1", "r2"} and "denied by the user" in results["r2"]
    assert t.RUNS["release"] == 1  # r1 ran; r2 was denied
    await assert_no_workflow_task_failed(client, thread)


async def test_a_browser_that_comes_back_after_a_worker_restart_finds_the_paused_run(
    run_worker, model, client
):
    """A reconnect (no new message, no answers): the messages, then the same interrupts, after
    the worker that paused it is gone and another took its place."""
    agent = gated()
    model.reply(
        calls(("release", {"service": "api", "version": "2"}, "r1"), say="Releasing api."),
        text("released"),
    )
    thread = f"thread-{uuid.uuid4()}"
    queue = f"test-{uuid.uuid4()}"
    async with run_worker(agents=[agent], task_queue=queue) as agents:
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            paused = (await frames(http, url, run_input(thread, "release api 2")))[-1].event
    async with run_worker(agents=[agent], task_queue=queue) as agents:
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            back = await frames(http, url, run_input(thread))
            assert types(back) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
            assert back[-1].event["outcome"] == paused["outcome"]
            messages = back[1].event["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant"]
            assert messages[0]["content"] == "release api 2"
            assert messages[1]["content"] == "Releasing api."
            (call,) = messages[1]["toolCalls"]
            # The interrupt names a call the snapshot holds.
            assert call["id"] == paused["outcome"]["interrupts"][0]["toolCallId"] == "r1"
            resumed = await frames(
                http,
                url,
                run_input(thread, resume=[approval(paused["outcome"]["interrupts"][0])]),
            )
            assert resumed[-1].event["result"]["text"] == "released"
    assert t.RUNS["release"] == 1


async def test_an_agent_no_worker_hosts_is_one_run_error(run_worker, model, client):
    agent = gated()
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            seen = await frames(http, f"{base}/agui/{agent.name}x", run_input(thread, "hi"))
            assert types(seen)[-1] == "RUN_ERROR" and types(seen).count("RUN_ERROR") == 1
            assert seen[-1].event["code"] == "unknown_agent"
            assert agent.name in seen[-1].event["message"]  # did you mean


async def test_edits_through_agui_and_the_api_run_the_edited_input_once(run_worker, model, client):
    """An approval with ``input`` edits an editable tool: the edited input is what runs (once),
    and the audit record keeps the original."""
    agent = gated()
    model.reply(
        calls(("release", {"service": "api", "version": "2"}, "r1")),
        text("released"),
        calls(("release", {"service": "web", "version": "5"}, "r2")),
        text("released again"),
    )
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, dev_loopback=True)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            thread = f"thread-{uuid.uuid4()}"
            url = f"{base}/agui/{agent.name}"
            (interrupt,) = (await frames(http, url, run_input(thread, "release")))[-1].event[
                "outcome"
            ]["interrupts"]
            assert "input" in interrupt["responseSchema"]["properties"]  # editable
            edit = {"approved": True, "input": {"service": "api", "version": "3"}}
            done = await frames(
                http,
                url,
                run_input(
                    thread, resume=[{"interruptId": "r1", "status": "resolved", "payload": edit}]
                ),
            )
            (result,) = [f.event for f in done if f.type == "TOOL_CALL_RESULT"]
            assert json.loads(result["content"]) == {"released": "api@3"}
            # The approvals API's edit, with the digest of the input shown.
            second = await frames(http, url, run_input(thread, "release web"))
            (shown,) = second[-1].event["outcome"]["interrupts"]
            r = await answer(
                http,
                base,
                thread,
                "r2",
                {
                    "action": "edit",
                    "input_digest": shown["metadata"]["inputDigest"],
                    "input": {"service": "web", "version": "6"},
                },
            )
            assert r.status_code == 200 and r.json()["result"]["text"] == "released again"
    assert t.RUNS["release"] == 2
    records = await AgentClient(client, task_queue=agents.task_queue).audit(thread)
    assert [(r.kind, r.input, r.original_input) for r in records] == [
        ("edit", {"service": "api", "version": "3"}, {"service": "api", "version": "2"}),
        ("edit", {"service": "web", "version": "6"}, {"service": "web", "version": "5"}),
    ]


async def test_an_identity_function_that_breaks_is_a_500_without_its_reason(
    run_worker, model, client
):
    agent = gated()
    model.reply(calls(("release", {"service": "api", "version": "2"}, "r1")), text("ok"))

    def broken(request: Any) -> str:
        raise RuntimeError("db password hunter2")

    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        (shown,) = (await chat.send("release")).interrupts
        body = {"action": "approve", "input_digest": shown.input_digest}
        async with (
            served(agents_app(agents, identity=broken)) as base,
            httpx2.AsyncClient(timeout=60) as http,
        ):
            r = await answer(http, base, chat.id, "r1", body)
            assert r.status_code == 500 and r.json()["code"] == "internal"
            assert "hunter2" not in r.text
            # Asked before the stream starts, so a problem body here too.
            r = await http.post(
                f"{base}/agui/{agent.name}",
                json=run_input(chat.id, resume=[{"interruptId": "r1", "status": "cancelled"}]),
            )
            assert r.status_code == 500 and "hunter2" not in r.text
    assert t.RUNS["release"] == 0


async def test_the_app_served_again_in_the_same_event_loop_answers(client):
    """A cancelled ``serve`` shuts uvicorn down: the next server in the same event loop (the
    next test, or an application that restarts it) is polled for connections, not left with
    its clients hanging."""
    app = agents_app(AgentClient(client), dev_loopback=True)
    for _ in range(3):
        async with served(app) as base, httpx2.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{base}/api/whoami")).status_code == 200


async def test_what_temporal_refuses_is_a_502_saying_so(client):
    """A namespace the server does not have: every read says so, as Temporal's refusal."""
    from temporalio.client import Client

    elsewhere = Client(**{**client.config(), "namespace": "no-such-namespace"})
    app = agents_app(AgentClient(elsewhere), identity=lambda _: "ops@example.com")
    async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
        for path in ("/api/chats/c1/audit", "/api/inbox"):
            r = await http.get(f"{base}{path}")
            assert r.status_code == 502, (path, r.text)
            assert "no-such-namespace" in r.json()["detail"]

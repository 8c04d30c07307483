"""The web app (client/web.py, client/agui.py) reviewed as an attacker, against a real dev server.

Two attackers: one who reaches the app over HTTP and has no Temporal credentials, and one who
also holds the namespace's. Each attempt is a test: where the app holds, the test asserts the
refusal and that nothing happened (no tool ran, what was pending still is, no answer was
recorded, no workflow task failed); where it did not hold, the test came first and the fix in
the commit after it. What is left open is marked ``xfail(strict=True)`` with its reason.

The happy paths and the statuses are tests/test_web_app.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import uuid
from datetime import timedelta
from typing import Any

import httpx2
import pytest

from temporal_agent_interrupts import Agent, ToolApproval
from temporal_agent_interrupts.client import audit as audit_module
from temporal_agent_interrupts.client import web
from temporal_agent_interrupts.client.api import AgentClient, Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import Access, agents_app
from temporal_agent_interrupts.errors import ChatNotFound
from temporal_agent_interrupts.worker import build_worker
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import TokenIssuer
from temporal_agent_interrupts.workflows.types import input_digest
from tests import agents as t
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_operator import VISIBILITY_TIMEOUT
from tests.web import Frame, answer, frames, run_input, served

LOOKUP = {"key": "k"}
RELEASE = {"service": "api", "version": "2"}
ASK = {"question": "order ink?"}

PAUSE = calls(("lookup", LOOKUP, "g1"), ("release", RELEASE, "r1"), ("approve", ASK, "a1"))
"""One model message that pauses on all three kinds of call."""


def three_kinds(*, approvers: list[str] | None = None, trust: Any = None) -> Agent:
    """``lookup`` gated and not editable, ``release`` gated and editable, ``approve``
    interrupt-only (its output ``{approved, note}``)."""
    return Agent(
        f"attack-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup, t.release, t.approve],
        middleware=[ToolApproval(allow=[], approvers=approvers or [])],
        trust=trust,
    )


def types(seen: list[Frame]) -> list[str]:
    return [f.type for f in seen]


def resume(chat_id: str, *entries: dict[str, Any], **more: Any) -> dict[str, Any]:
    return run_input(chat_id, resume=list(entries), **more)


def resolved(ref: str, payload: Any = None, **more: Any) -> dict[str, Any]:
    return {"interruptId": ref, "status": "resolved", "payload": payload, **more}


async def intact(client: Any, chat: Chat, refs: list[str]) -> None:
    """Nothing happened: the same calls are pending, no answer was recorded, no tool ran, no
    workflow task failed."""
    assert [i.ref for i in await chat.pending()] == refs
    assert await chat.audit() == []
    assert t.RUNS["lookup"] == t.RUNS["release"] == 0, t.RUNS
    await assert_no_workflow_task_failed(client, chat.id)


async def paused(agents: AgentClient, agent: Agent) -> tuple[Chat, dict[str, str]]:
    """A chat paused on ``PAUSE``'s three calls, and each call's input digest by ref."""
    chat = await agents.chat(agent.name)
    result = await chat.send("look k up, release api 2, ask about ink")
    assert [i.ref for i in result.interrupts] == ["g1", "r1", "a1"]
    return chat, {i.ref: i.input_digest for i in result.interrupts}


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def raw_request(base: str, request: bytes) -> bytes:
    """``request`` as sent (no client tidies it up), and all the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
    try:
        writer.write(request.replace(b"PORT", str(port_of(base)).encode()))
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


# ----------------------------------------------------------------------------------------------
# Answering for someone else.


async def test_identity_comes_only_from_where_the_apps_mode_reads_it(run_worker, model, client):
    """An identity function (here a header a fronting proxy sets): the dev header, the body,
    the run input's other fields and an entry's metadata name nobody."""
    agent = three_kinds(approvers=["ops@example.com"])
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)

        def proxy_user(request: Any) -> str | None:
            return request.headers.get("x-forwarded-user")

        app = agents_app(agents, identity=proxy_user)
        eve = {"X-Forwarded-User": "eve@example.com"}
        approve_g1 = {"action": "approve", "input_digest": digest["g1"]}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            # The dev mode's header, in a mode that does not read it.
            dev = {"X-Agent-Identity": "ops@example.com"}
            r = await answer(http, base, chat.id, "g1", approve_g1, headers=dev)
            assert r.status_code == 401
            r = await answer(http, base, chat.id, "g1", approve_g1, headers={**eve, **dev})
            assert r.status_code == 403 and "'eve@example.com' may not" in r.json()["detail"]
            whoami = (await http.get(f"{base}/api/whoami", headers=dev)).json()
            assert whoami == {"identity": None, "mode": "function"}
            # The body: refused as a key it does not have, ignored as metadata.
            for key in ("identity", "identity_token", "identityToken"):
                body = {**approve_g1, key: "ops@example.com"}
                r = await answer(http, base, chat.id, "g1", body, headers=eve)
                assert r.status_code == 400 and key in r.json()["detail"]
            body = {**approve_g1, "metadata": {"identity": "ops@example.com"}}
            r = await answer(http, base, chat.id, "g1", body, headers=eve)
            assert r.status_code == 403
            # AG-UI: the identity in the entry's metadata, forwardedProps, state and context.
            url = f"{base}/agui/{agent.name}"
            said = {"identity": "ops@example.com", "user": "ops@example.com"}
            run = resume(
                chat.id,
                resolved("g1", {"approved": True}, metadata=said),
                forwardedProps=said,
                state=said,
                context=[{"description": "identity", "value": "ops@example.com"}],
            )
            seen = await frames(http, url, run, headers=eve)
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "forbidden"
            r = await http.post(url, json=run, headers=dev)
            assert r.status_code == 401  # refused before any stream starts
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_dev_mode_refuses_a_request_a_forwarding_proxy_brings(run_worker, model, client):
    """``dev_loopback=True`` behind a proxy on the same machine: uvicorn takes the client's
    address from the proxy's ``X-Forwarded-For`` (it trusts loopback's), so a forwarded request
    is not loopback and is refused, whatever ``X-Agent-Identity`` it carries. (A proxy that
    forwards no address makes every client loopback: the README says dev mode is for one
    machine.)"""
    agent = three_kinds(approvers=["ops@example.com"])
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, dev_loopback=True)
        approve_g1 = {"action": "approve", "input_digest": digest["g1"]}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            forwarded = {"X-Forwarded-For": "203.0.113.7", "X-Agent-Identity": "ops@example.com"}
            r = await answer(http, base, chat.id, "g1", approve_g1, headers=forwarded)
            assert r.status_code == 403 and r.json()["code"] == "not_loopback"
            r = await http.get(f"{base}/api/inbox", headers=forwarded)
            assert r.status_code == 403
            r = await http.post(
                f"{base}/agui/{agent.name}",
                json=resume(chat.id, resolved("g1", {"approved": True})),
                headers=forwarded,
            )
            assert r.status_code == 403
            # A name past 256 characters is cut, never matched on its first part.
            long = {"X-Agent-Identity": "x" * 256 + "ops@example.com"}
            r = await answer(http, base, chat.id, "g1", approve_g1, headers=long)
            assert r.status_code == 403
        await intact(client, chat, ["g1", "r1", "a1"])


async def forwarding_proxy(
    upstream: str, *, version: bytes = b"HTTP/1.0", add: dict[str, str] | None = None
) -> tuple[asyncio.Server, str]:
    """A reverse proxy on loopback, as nginx's default ``proxy_pass`` forwards: the request
    line in ``version`` (nginx speaks HTTP/1.0 to an upstream unless told otherwise), ``Host``
    set to the upstream's address, ``Connection: close``, the client's other headers passed
    on, ``add`` added (a proxy that says it is one), and no ``X-Forwarded-For``. Every one of
    its clients reaches the app from 127.0.0.1."""
    target = upstream.removeprefix("http://")
    up_host, up_port = target.rsplit(":", 1)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head[:-4].split(b"\r\n")
            method, path, _ = line.split(b" ", 2)
            kept = [
                f
                for f in fields
                if f.split(b":", 1)[0].strip().lower() not in (b"host", b"connection")
            ]
            length = next(
                (int(f.split(b":", 1)[1]) for f in kept if f.lower().startswith(b"content-length")),
                0,
            )
            body = await reader.readexactly(length) if length else b""
            extra = [f"{k}: {v}".encode() for k, v in (add or {}).items()]
            sent = b"\r\n".join(
                [
                    b" ".join([method, path, version]),
                    f"Host: {target}".encode(),
                    b"Connection: close",
                    *kept,
                    *extra,
                ]
            )
            up_reader, up_writer = await asyncio.open_connection(up_host, int(up_port))
            up_writer.write(sent + b"\r\n\r\n" + body)
            await up_writer.drain()
            writer.write(await up_reader.read())
            await writer.drain()
            up_writer.close()
        finally:
            writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def test_dev_mode_behind_a_same_host_proxy_that_forwards_no_address_serves_no_one(
    run_worker, model, client
):
    """Finding 14: nginx's default ``proxy_pass`` on the same machine adds no
    ``X-Forwarded-For`` and sends the upstream's own Host: every client it serves reached a
    ``dev_loopback`` app as loopback and answered as whoever ``X-Agent-Identity`` named. A real
    proxy hop, in each shape a proxy leaves (HTTP/1.0; HTTP/1.1 with a header saying it is
    one), is refused; the app's own loopback clients are still served."""
    agent = three_kinds(approvers=["ops@example.com"])
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, dev_loopback=True)
        approve_g1 = {"action": "approve", "input_digest": digest["g1"]}
        eve = {"X-Agent-Identity": "ops@example.com"}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            # Straight to the app, from this machine: served.
            direct = await http.get(f"{base}/api/whoami", headers=eve)
            assert direct.json()["identity"] == "ops@example.com"
            shapes: list[tuple[bytes, dict[str, str]]] = [
                (b"HTTP/1.0", {}),  # nginx's default
                (b"HTTP/1.1", {"Via": "1.1 proxy"}),
                (b"HTTP/1.1", {"X-Real-IP": "203.0.113.7"}),
                (b"HTTP/1.1", {"Forwarded": "for=203.0.113.7"}),
                (b"HTTP/1.1", {"X-Forwarded-Proto": "https"}),
            ]
            for version, add in shapes:
                server, proxied = await forwarding_proxy(base, version=version, add=add)
                try:
                    r = await http.get(f"{proxied}/api/whoami", headers=eve)
                    assert r.status_code == 403 and r.json()["code"] == "not_loopback", (add, r)
                    r = await http.get(f"{proxied}/api/inbox", headers=eve)
                    assert r.status_code == 403, (version, add)
                    r = await answer(http, proxied, chat.id, "g1", approve_g1, headers=eve)
                    assert r.status_code == 403 and r.json()["code"] == "not_loopback", add
                finally:
                    server.close()
                    await server.wait_closed()
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_authorize_scopes_the_inbox_and_the_approvals_api_by_chat_and_agent(
    run_worker, model, client
):
    """Finding 8: a user the application's rule refused a chat's ``/pending`` still read its
    calls' inputs in ``/api/inbox``; the approvals API asked the rule with no agent; and a
    caller allowed to answer but not to read got the turn's text (and the next calls'
    inputs) back. Now the inbox lists only what the caller may read, every approvals-API
    ``Access`` names the chat's agent, and an answer tells such a caller only how the turn
    ended."""
    agent = three_kinds()
    secret = "the vault code is 4711"
    model.reply(PAUSE, text(secret))
    asked: list[Access] = []

    def rule(request: Any, access: Access) -> bool:
        asked.append(access)
        user = request.headers.get("x-user")
        return not (user == "bob" and access.action == "read")

    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda r: r.headers.get("x-user"), authorize=rule)
        alice, bob = {"X-User": "alice"}, {"X-User": "bob"}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:

            async def inbox(who: dict[str, str]) -> list[str]:
                r = await http.get(f"{base}/api/inbox", params={"agent": agent.name}, headers=who)
                assert r.status_code == 200, r.text
                return [c["chat_id"] for c in r.json()["chats"]]

            # Alice may read it: listed (once visibility has it). Bob may not: not listed,
            # as his /pending is refused.
            await eventually(lambda: inbox(alice), lambda ids: chat.id in ids, timeout=30)
            r = await http.get(f"{base}/api/chats/{chat.id}/pending", headers=bob)
            assert r.status_code == 403
            assert chat.id not in await inbox(bob)

            # Every approvals-API question names the chat's agent.
            asked.clear()
            assert (await http.get(f"{base}/api/chats/{chat.id}/pending", headers=alice)).is_success
            assert (await http.get(f"{base}/api/chats/{chat.id}/audit", headers=alice)).is_success
            r = await answer(
                http,
                base,
                chat.id,
                "g1",
                {"action": "approve", "input_digest": digest["g1"]},
                headers=bob,
            )
            assert r.status_code == 200, r.text
            assert asked and all(a.agent == agent.name for a in asked), asked

            # Bob may answer, not read: the turn's next calls, their inputs and its text are
            # withheld; how it ended is not.
            body = r.json()
            assert body["result_withheld"] is True
            assert body["result"]["finish_reason"] == "interrupted"
            assert body["result"]["interrupts"] == [] and body["result"]["interrupts_omitted"] == 2
            assert "order ink" not in r.text and '"api"' not in r.text
            r = await answer(
                http,
                base,
                chat.id,
                "r1",
                {"action": "approve", "input_digest": digest["r1"]},
                headers=bob,
            )
            assert r.status_code == 200 and r.json()["result_withheld"] is True
            done = {
                "action": "respond",
                "input_digest": digest["a1"],
                "output": {"approved": True, "note": "ok"},
            }
            r = await answer(http, base, chat.id, "a1", done, headers=bob)
            assert r.status_code == 200, r.text
            assert r.json()["result"]["finish_reason"] == "stop"
            assert secret not in r.text and r.json()["result"]["text"] == ""
        # The turn itself went on as answered: the text is the chat's, for those who may read.
        last = await chat.last_turn()
        assert last is not None and last.text == secret


async def test_bearer_mode_with_an_agent_that_verifies_nobody_refuses_every_answer(
    run_worker, model, client
):
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity="bearer")
        bearer = {"Authorization": f"Bearer {TokenIssuer().mint('ops@example.com')}"}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            body = {"action": "approve", "input_digest": digest["g1"]}
            r = await answer(http, base, chat.id, "g1", body, headers=bearer)
            assert r.status_code == 403 and "does not verify identity tokens" in r.json()["detail"]
            seen = await frames(
                http,
                f"{base}/agui/{agent.name}",
                resume(chat.id, resolved("g1", {"approved": True})),
                headers=bearer,
            )
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "forbidden"
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_bearer_tokens_answer_once_as_their_holder_and_never_show_up_anywhere(
    run_worker, model, client, caplog
):
    caplog.set_level(logging.DEBUG)
    issuer = TokenIssuer("ES256")
    agent = three_kinds(approvers=["ops@example.com"], trust=issuer.trust())
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity="bearer")
        garbage = f"not-a-jwt-{uuid.uuid4().hex}"
        ops = issuer.mint("ops@example.com")
        refused = {
            "none": None,
            "empty": "Bearer",
            "basic": "Basic b3BzOnB3",
            "garbage": f"Bearer {garbage}",
            "eve": f"Bearer {issuer.mint('eve@example.com')}",
            "expired": f"Bearer {issuer.mint('ops@example.com', expires_in=timedelta(minutes=-5))}",
            "forged": f"Bearer {TokenIssuer('ES256', kid=issuer.kid).mint('ops@example.com')}",
            "too long": f"Bearer {'a' * 17_000}",
        }
        approve = {ref: {"action": "approve", "input_digest": d} for ref, d in digest.items()}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            shown: list[str] = []
            for why, header in refused.items():
                headers = {"Authorization": header} if header else {}
                r = await answer(http, base, chat.id, "g1", approve["g1"], headers=headers)
                assert r.status_code in (400, 401, 403), (why, r.text)
                shown.append(r.text)
                whoami = await http.get(f"{base}/api/whoami", headers=headers)
                shown.append(whoami.text)
            # The holder's token answers once, as its holder.
            as_ops = {"Authorization": f"Bearer {ops}"}
            r = await answer(http, base, chat.id, "g1", approve["g1"], headers=as_ops)
            assert r.status_code == 200, r.text
            assert (await http.get(f"{base}/api/whoami", headers=as_ops)).json() == {
                "identity": "(identity token)",
                "mode": "bearer",
            }
            # Used again: on another call, by the approvals API and by AG-UI.
            r = await answer(http, base, chat.id, "r1", approve["r1"], headers=as_ops)
            assert r.status_code == 403 and "already used" in r.json()["detail"]
            shown.append(r.text)
            seen = await frames(
                http,
                f"{base}/agui/{agent.name}",
                resume(
                    chat.id,
                    resolved("r1", {"approved": True}, metadata={"inputDigest": digest["r1"]}),
                ),
                headers=as_ops,
            )
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "forbidden"
            shown.append(json.dumps([f.event for f in seen]))
        (record,) = await chat.audit()
        assert (record.ref, record.identity, record.identity_verified) == (
            "g1",
            "ops@example.com",
            True,
        )
        assert [i.ref for i in await chat.pending()] == ["r1", "a1"]
    assert sum(t.RUNS.values()) == 0  # the step's calls run once all three are answered
    # No token is echoed in any answer, and none is in the logs (the app's, uvicorn's, the SDK's).
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    for secret in (garbage, ops, *(h.split()[-1] for h in refused.values() if h)):
        if len(secret) > 20:
            assert all(secret not in s for s in shown)
            assert secret not in logged
    await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# Running a gated tool without an accepted approval.


async def test_no_resume_entry_runs_a_gated_tool_unless_it_is_an_approval(
    run_worker, model, client
):
    agent = three_kinds()
    other = three_kinds()
    model.reply(PAUSE, calls(("lookup", {"key": "x"}, "x1")), text("done"))
    async with run_worker(agents=[agent, other]) as agents:
        chat, _ = await paused(agents, agent)
        elsewhere = await agents.chat(other.name)
        await elsewhere.send("look x up")  # paused on its own ref, x1
        idle = await agents.chat(agent.name)
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            # Not a resume entry at all: refused before any stream starts.
            for entry in (
                {"interruptId": "g1", "status": "approved", "payload": {"approved": True}},
                {"interruptId": "g1", "status": "RESOLVED", "payload": {"approved": True}},
                {"interruptId": "g1", "payload": {"approved": True}},
                {"status": "resolved", "payload": {"approved": True}},
                {"interruptId": 7, "status": "resolved", "payload": {"approved": True}},
                {"interruptId": "g1", "status": "resolved", "metadata": "inputDigest"},
            ):
                r = await http.post(url, json=resume(chat.id, entry))
                assert r.status_code == 400, (entry, r.text)
            r = await http.post(url, json={**run_input(chat.id), "resume": {"g1": True}})
            assert r.status_code == 400

            # Entries that are not an approval of what is pending: a RUN_ERROR each.
            tool_approved = {"approved": True, "tool_approved": True}
            for entries in (
                [resolved("g1", {"approved": "true"})],
                [resolved("g1", {"approved": 1})],
                [resolved("g1", {"approved": None})],
                [resolved("g1", {})],
                [resolved("g1", [True])],
                [resolved("g1", "approved")],
                [resolved("g1", True)],
                [resolved("g1")],
                [resolved("g1", tool_approved)],
                [resolved("g1", {"approved": True, "extra": 1})],
                [resolved("g1", {"approved": True, "reason": ["why"]})],
                # An edit of a tool that is not editable, and edits that are not inputs.
                [resolved("g1", {"approved": True, "input": {"key": "other"}})],
                [resolved("g1", {"approved": True, "input": {"key": 1}})],
                [resolved("r1", {"approved": True, "input": "api@3"})],
                [resolved("r1", {"approved": True, "input": {"service": "api"}})],
                # A digest that is not a string, or not the input's.
                [resolved("g1", {"approved": True}, metadata={"inputDigest": 7})],
                [resolved("g1", {"approved": True}, metadata={"inputDigest": "0" * 32})],
                [resolved("g1", {"approved": True}, metadata={"inputDigest": "g1"})],
                # The same interrupt twice in one resume, either way round.
                [resolved("g1", {"approved": True}), resolved("g1", {"approved": True})],
                [{"interruptId": "g1", "status": "cancelled"}, resolved("g1", {"approved": True})],
                [resolved("g1", {"approved": False}), resolved("g1", {"approved": True})],
                # Another chat's ref; a ref no chat has; a ref in another spelling.
                [resolved("x1", {"approved": True})],
                [resolved("G1", {"approved": True})],
                [resolved("g1 ", {"approved": True})],
                # An interrupt-only tool's answer that does not fit its output.
                [resolved("a1", {"approved": "yes"})],
                [resolved("a1", {"note": "no approved"})],
                # A good answer beside a bad one: the resume is refused whole.
                [resolved("g1", {"approved": True}), resolved("r1", {"approved": "true"})],
                [resolved("r1", {"approved": True}), resolved("a1", {"approved": 1})],
            ):
                seen = await frames(http, url, resume(chat.id, *entries))
                assert types(seen) == ["RUN_ERROR"], (entries, seen)
                assert seen[0].event["code"] in ("invalid", "not_found", "conflict"), seen
            # Answers on a thread that is paused on nothing.
            model.reply(text("hello"))
            await idle.send("hi")
            seen = await frames(http, url, resume(idle.id, resolved("g1", {"approved": True})))
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "conflict"
            await intact(client, chat, ["g1", "r1", "a1"])
            assert [i.ref for i in await elsewhere.pending()] == ["x1"]

            # A cancelled entry denies, whatever its payload says.
            cancel = {"interruptId": "g1", "status": "cancelled", "payload": {"approved": True}}
            seen = await frames(http, url, resume(chat.id, cancel))
            assert seen[-1].event["outcome"]["type"] == "interrupt"
        (record,) = await chat.audit()
        assert (record.ref, record.decision) == ("g1", "denied")
        assert [i.ref for i in await chat.pending()] == ["r1", "a1"]
    assert t.RUNS["lookup"] == 0
    await assert_no_workflow_task_failed(client, chat.id)


async def test_an_approval_through_the_api_approves_only_the_input_it_names(
    run_worker, model, client
):
    """Digest games: a digest that is another call's, a proposed edit's, the right one in
    capitals or cut short; and an edit of a tool that is not editable."""
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            edit = {"service": "api", "version": "666"}
            for ref, shown in (
                ("g1", digest["r1"]),
                ("r1", input_digest(edit)),
                ("r1", digest["r1"].upper()),
                ("r1", digest["r1"][:-1]),
                ("r1", digest["r1"] + " "),
                ("a1", input_digest({"question": "order ink?", "x": 1})),
            ):
                for action in ("approve", "deny", "edit", "respond"):
                    body = {"action": action, "input_digest": shown, "input": edit}
                    body |= {"output": {"approved": True}} if action == "respond" else {}
                    r = await answer(http, base, chat.id, ref, body)
                    assert r.status_code == 409, (ref, action, r.text)
            body = {"action": "edit", "input_digest": digest["g1"], "input": {"key": "other"}}
            r = await answer(http, base, chat.id, "g1", body)
            assert r.status_code == 422 and "not declared editable" in r.json()["detail"]
            for short in ("", "x" * 129):
                body = {"action": "approve", "input_digest": short}
                assert (await answer(http, base, chat.id, "g1", body)).status_code == 400
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_an_edit_racing_an_approval_runs_the_tool_once_with_the_winners_input(
    run_worker, model, client
):
    """Ann approves the input she was shown while Bob edits it, at once, on three chats:
    whichever the conversation takes first wins, the other is refused, and the tool runs once
    with the input the winner saw or gave."""
    agent = three_kinds()
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, identity=lambda request: request.headers.get("x-user"))
        chats = []
        for _ in range(3):
            model.reply(calls(("release", RELEASE, "r1")))
            chat = await agents.chat(agent.name)
            (shown,) = (await chat.send("release api 2")).interrupts
            chats.append((chat, shown.input_digest))
        model.reply(text("done"), text("done"), text("done"))
        edit = {"service": "api", "version": "9"}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:

            async def race(chat: Chat, shown: str) -> tuple[int, int]:
                ann = answer(
                    http,
                    base,
                    chat.id,
                    "r1",
                    {"action": "approve", "input_digest": shown},
                    headers={"X-User": "ann"},
                )
                bob = answer(
                    http,
                    base,
                    chat.id,
                    "r1",
                    {"action": "edit", "input_digest": shown, "input": edit},
                    headers={"X-User": "bob"},
                )
                a, b = await asyncio.gather(ann, bob)
                return a.status_code, b.status_code

            outcomes = await asyncio.gather(*(race(chat, shown) for chat, shown in chats))
        for (chat, _), (ann, bob) in zip(chats, outcomes, strict=True):
            assert sorted((ann, bob)) == [200, 409], (ann, bob)
            released = [
                p.function_response.response
                for m in (await chat.history()).messages
                for p in m.parts
                if p.function_response is not None
            ]
            expected = "api@2" if ann == 200 else "api@9"
            assert released == [{"released": expected}]
            (record,) = await chat.audit()
            assert record.identity == ("ann" if ann == 200 else "bob")
            await assert_no_workflow_task_failed(client, chat.id)
    assert t.RUNS["release"] == 3


async def test_an_agui_approval_without_a_digest_approves_only_what_its_run_showed(
    run_worker, model, client
):
    agent = Agent(
        f"attack-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.release],
        middleware=[ToolApproval(allow=[], approvers=["a@x", "b@x", "c@x"], quorum=2)],
    )
    model.reply(calls(("release", RELEASE, "r1")), text("ok"))
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, dev_loopback=True)
        thread = f"thread-{uuid.uuid4()}"
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            as_a = {"X-Agent-Identity": "a@x"}
            first = await frames(http, url, run_input(thread, "release api 2"), headers=as_a)
            (shown,) = first[-1].event["outcome"]["interrupts"]
            assert shown["metadata"]["input"] == RELEASE  # what a approves, below
            # b edits it; the gate holds the edited call for two approvals; c gives one.
            edit = {"service": "api", "version": "666"}
            digest = shown["metadata"]["inputDigest"]
            body = {"action": "edit", "input_digest": digest, "input": edit}
            r = await answer(http, base, thread, "r1", body, headers={"X-Agent-Identity": "b@x"})
            (edited,) = r.json()["result"]["interrupts"]
            body = {"action": "approve", "input_digest": edited["input_digest"]}
            r = await answer(http, base, thread, "r1", body, headers={"X-Agent-Identity": "c@x"})
            assert r.status_code == 200
            # a approves with no digest, having seen version 2: an editable call's approval
            # must say which input it approves.
            entry = resolved("r1", {"approved": True})
            seen = await frames(http, url, resume(thread, entry), headers=as_a)
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "invalid"
            assert "inputDigest" in seen[0].event["message"]
            # With the digest of what its run showed: refused, the input is no longer that.
            entry["metadata"] = {"inputDigest": digest}
            seen = await frames(http, url, resume(thread, entry), headers=as_a)
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "conflict"
            assert "no longer has the input" in seen[0].event["message"]
    assert t.RUNS["release"] == 0


# ----------------------------------------------------------------------------------------------
# The stream and Last-Event-ID.


async def test_last_event_ids_reach_only_the_thread_in_the_body_and_only_what_it_keeps(
    run_worker, model, client
):
    agent = three_kinds()
    model.reply(text("one"), text("two"), text("three"))
    readers: list[Access] = []

    def no_reads_for_bob(request: Any, access: Access) -> bool:
        readers.append(access)
        return not (access.action == "read" and request.headers.get("x-user") == "bob")

    async with run_worker(agents=[agent]) as agents:
        app = agents_app(
            agents, identity=lambda _: "tester@example.com", authorize=no_reads_for_bob
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            mine, theirs = f"mine-{uuid.uuid4()}", f"theirs-{uuid.uuid4()}"
            await frames(http, url, run_input(mine, "first"))
            whole = await frames(http, url, run_input(mine, "second"))
            theirs_seen = await frames(http, url, run_input(theirs, "theirs"))
            nxt = await next_offset(await agents.chat(agent.name, chat_id=mine))
            # Not an id this app sends: negative, signed, too long, not digits, another form.
            for last_id in (
                "-1/0.0",
                "0/-1.0",
                "+1/1.0",
                "1e3/1000.0",
                f"{'9' * 16}/{'9' * 16}.0",
                "1/1.1234567",
                "0x1/1.0",
                "1/1",
                "1/0.0",  # before its run's start
                "",
            ):
                r = await http.post(url, json=run_input(mine), headers={"Last-Event-ID": last_id})
                assert r.status_code == 400, (last_id, r.text)
            # A run this thread never had.
            huge = f"{10**15 - 1}/{10**15 - 1}.0"
            for last_id in (huge, f"{nxt + 1}/{nxt + 1}.0"):
                seen = await frames(http, url, run_input(mine), headers={"Last-Event-ID": last_id})
                assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] == "not_found"
            # Past the end of a run that ended: nothing more, at once, however far past.
            start = str(whole[0].id).split("/")[0]
            far = f"{start}/{10**15 - 1}.999999"
            assert await frames(http, url, run_input(mine), headers={"Last-Event-ID": far}) == []
            # Another thread's id, on this thread: this thread's frames only, nothing re-run.
            seen = await frames(
                http,
                url,
                run_input(mine, "ignored on a reattach"),
                headers={"Last-Event-ID": str(theirs_seen[0].id)},
            )
            assert seen and all(f.event.get("threadId", mine) == mine for f in seen)
            assert all("theirs" not in json.dumps(f.event) for f in seen)
            # Someone the application does not let read it.
            r = await http.post(
                url,
                json=run_input(mine),
                headers={"Last-Event-ID": str(whole[0].id), "X-User": "bob"},
            )
            assert r.status_code == 403
        chat = await agents.chat(agent.name, chat_id=mine)
        assert (await chat.status()).turns == 2  # the reattaches sent nothing
    assert {a.action for a in readers} == {"send", "read"}


async def test_a_request_dropped_at_once_leaves_no_stream_slot_behind(run_worker, model, client):
    """A client that sends a run and resets the connection before the response starts: the
    app's count of a chat's streams goes back to zero (else two of them would lock the chat
    out, 429, until the app restarts)."""
    agent = three_kinds()
    model.reply(PAUSE)
    asked = decided = 0

    async def slow_rule(_: Any, __: Access) -> bool:
        nonlocal asked, decided
        asked += 1
        await asyncio.sleep(0.2)  # a database lookup: the reset arrives meanwhile
        decided += 1
        return True

    async with run_worker(agents=[agent]) as agents:
        chat, _ = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "tester@example.com", authorize=slow_rule)
        body = json.dumps(run_input(chat.id)).encode()
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            for _ in range(6):
                sock = socket.create_connection(("127.0.0.1", port_of(base)))
                sock.sendall(
                    b"POST /agui/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (agent.name.encode(), len(body), body)
                )
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # a reset, not a goodbye
            # Every rule answered, then no stream held for a while: a request whose rule has
            # just answered takes its slot a moment later (once, this test read "none held" in
            # that moment and its own run was refused 429).
            quiet = 0
            for _ in range(200):
                quiet = quiet + 1 if decided == 6 and not app.state.agents.streams else 0
                if quiet == 10:
                    break
                await asyncio.sleep(0.05)
            assert asked == decided == 6 and not app.state.agents.streams
            seen = await frames(http, f"{base}/agui/{agent.name}", run_input(chat.id))
            assert seen[-1].event["outcome"]["type"] == "interrupt"
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_streams_dropped_while_waiting_leave_the_next_run_its_stream(
    run_worker, model, client
):
    """A conversation admits four followers at once, and a follower that went away keeps its
    place until the conversation's next event (the library's long poll cannot be withdrawn).
    Reattaching to a run an idle thread has not begun, and dropping the connection, four
    times, must not leave the thread's next run without its stream."""
    agent = three_kinds()
    model.reply(text("hi"), text("second"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            nxt = await next_offset(chat)
            for _ in range(5):
                waiting = asyncio.ensure_future(
                    frames(
                        http, url, run_input(chat.id), headers={"Last-Event-ID": f"{nxt}/{nxt}.0"}
                    )
                )
                for _ in range(100):
                    if app.state.agents.streams:
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.7)  # waiting, as a follower does
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                for _ in range(100):
                    if not app.state.agents.streams:
                        break
                    await asyncio.sleep(0.02)
                assert not app.state.agents.streams
            seen = await frames(http, url, run_input(chat.id, "again"))
            assert types(seen)[-1] == "RUN_FINISHED", seen[-1]
            said = "".join(f.event["delta"] for f in seen if f.type == "TEXT_MESSAGE_CONTENT")
            assert said == "second"
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_stream_past_the_conversations_followers_still_gets_the_run(
    run_worker, model, client
):
    """Mid-turn (a tool running), a dropped reattach keeps its follower place until the next
    event: past four of them, a stream was refused as ``too_many_streams``. It reads the run by
    query now while the places are taken (issue 44: polls sent directly by a namespace holder
    took them too), and gets the rest of the run."""
    agent = Agent(f"attack-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.slow])
    model.reply(calls(("slow", {"key": "k", "seconds": 5}, "s1")), text("slept"))
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        thread = f"thread-{uuid.uuid4()}"
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            url = f"{base}/agui/{agent.name}"
            started: list[Frame] = []

            def tool_started(seen: list[Frame]) -> bool:
                started[:] = seen
                return seen[-1].type == "TOOL_CALL_END"

            await frames(http, url, run_input(thread, "sleep"), stop=tool_started)
            run_id = {"Last-Event-ID": str(started[0].id)}
            for _ in range(4):
                waiting = asyncio.ensure_future(
                    frames(http, url, run_input(thread), headers=run_id)
                )
                await asyncio.sleep(0.7)  # read up to the tool call, then waiting for more
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            seen = await frames(http, url, run_input(thread), headers=run_id)
            assert seen[-1].type == "RUN_FINISHED", seen
            assert seen[-1].event["result"]["text"] == "slept"
            assert not any(f.type == "RUN_ERROR" for f in seen), seen
    assert t.RUNS["slow_finished"] == 1
    await assert_no_workflow_task_failed(client, thread)


# ----------------------------------------------------------------------------------------------
# Payloads that could fail a workflow task or lose the paused turn.


def nested(levels: int) -> Any:
    value: Any = {"approved": True}
    for _ in range(levels):
        value = {"n": value}
    return value


async def test_payloads_at_the_limits_and_past_what_json_carries_fail_nothing(
    run_worker, model, client
):
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            api = f"{base}/api/chats/{chat.id}/interrupts"
            url = f"{base}/agui/{agent.name}"
            as_json = {"content-type": "application/json"}

            async def post(ref: str, raw: str | bytes) -> httpx2.Response:
                return await http.post(f"{api}/{ref}", content=raw, headers=as_json)

            def body(action: str, ref: str, **more: Any) -> dict[str, Any]:
                return {"action": action, "input_digest": digest[ref], **more}

            # Sizes: an answer's own limit (1 MiB) below the app's (2 MiB), at the door and
            # past it; what fits the door but not the conversation.
            mib = 1024 * 1024
            note = "n" * (mib - 200)
            respond = body("respond", "a1", output={"approved": True, "note": note})
            r = await post("a1", json.dumps(respond))
            assert r.status_code == 422 and r.json()["code"] == "invalid", r.text
            r = await post("a1", json.dumps(respond) + " " * mib)
            assert r.status_code == 413
            r = await post("g1", json.dumps(body("approve", "g1", metadata={"m": "m" * 900_000})))
            assert r.status_code == 422
            r = await post("g1", json.dumps(body("deny", "g1", reason="r" * 1025)))
            assert r.status_code == 400
            # What JSON parsing takes and a conversation cannot store.
            for raw in (
                '{"action": "respond", "input_digest": "%s", "output": {"approved": NaN}}',
                '{"action": "respond", "input_digest": "%s", "output": {"note": Infinity}}',
                '{"action": "respond", "input_digest": "%s", "output": {"x": -Infinity}}',
                '{"action": "respond", "input_digest": "%s", "output": {"x": 1e400}}',
                '{"action": "respond", "input_digest": "%s", "output": {"x": "\\ud800"}}',
                '{"action": "respond", "input_digest": "%s", "output": {"\\udfff": 1}}',
                '{"action": "approve", "input_digest": "%s", "metadata": {"x": NaN}}',
                '{"action": "deny", "input_digest": "%s", "reason": "\\ud83d"}',
                '{"action": "approve", "input_digest": "\\ud800%s"}',
            ):
                r = await post("a1", raw % digest["a1"])
                assert r.status_code in (400, 422), (raw, r.text)
            r = await post("r1", json.dumps(body("edit", "r1", input=nested(70))))
            assert r.status_code == 422, r.text
            r = await post("a1", json.dumps(body("respond", "a1", output=nested(900))))
            assert r.status_code in (400, 422), r.text
            # Not objects where objects go.
            for raw in ("[]", '"approve"', "1", "null", "true"):
                assert (await post("g1", raw)).status_code == 400, raw
            for output in ([], "yes", 1, None):
                r = await post("a1", json.dumps(body("respond", "a1", output=output)))
                assert r.status_code == 400, output
            for edit in ([], "api@3"):
                r = await post("r1", json.dumps(body("edit", "r1", input=edit)))
                assert r.status_code == 400, edit

            # The same through AG-UI, where the body may be 2 MiB.
            r = await http.post(url, content=b" " * (2 * mib + 1), headers=as_json)
            assert r.status_code == 413
            for entry in (
                resolved("a1", {"approved": True, "note": "n" * (mib + mib // 2)}),
                resolved("g1", {"approved": False, "reason": "r" * (mib + mib // 2)}),
                resolved("r1", {"approved": True, "input": {"service": "s" * (mib + 10)}}),
                resolved("a1", {"approved": True, "note": float("nan")}),
                resolved("a1", {"approved": True, "note": float("inf")}),
                resolved("g1", {"approved": float("nan")}),
                resolved("r1", {"approved": True, "input": nested(70)}),
                resolved("\ud800", {"approved": True}),
                resolved("g1" * 50_000, {"approved": True}),
            ):
                run = resume(chat.id, entry, state=nested(900), forwardedProps=nested(900))
                seen = await frames(http, url, run)
                assert types(seen) == ["RUN_ERROR"], seen
                assert seen[0].event["code"] in ("invalid", "not_found"), seen
                assert len(seen[0].event["message"]) < 2000

            # Ids in paths and bodies: unicode, bidirectional overrides, too long for Temporal.
            for ref in ("r1\u202e", "%F0%9F%98%80", "g1%00", "g1%0a"):
                r = await http.post(f"{api}/{ref}", json=body("approve", "g1"))
                assert r.status_code in (400, 404), (ref, r.text)
            r = await answer(http, base, "\u202e" + chat.id, "g1", body("approve", "g1"))
            assert r.status_code == 404
            long_thread = "\U0001f600" * 300  # 1,200 bytes: past a workflow id's 1,000
            seen = await frames(http, url, run_input(long_thread, "hi"))
            assert types(seen) == ["RUN_ERROR"] and seen[0].event["code"] != "internal", seen
            # Lengths and framings the HTTP parser refuses before the app sees them.
            for framing in (
                b"Content-Length: \xb2",
                b"Content-Length: -1",
                b"Content-Length: 2\r\nContent-Length: 3",
            ):
                got = await raw_request(
                    base,
                    b"POST /api/chats/x/interrupts/y HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                    b"Content-Type: application/json\r\n%s\r\nConnection: close\r\n\r\n{}"
                    % framing,
                )
                assert status_of(got) == 400, got
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_a_number_as_long_as_json_parsing_takes_is_kept_and_read_back(
    run_worker, model, client
):
    """4,000 digits: under Python's 4,300-digit limit, so it reaches the conversation (in an
    answer's audit metadata) and every reader of it."""
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            deny = {"action": "deny", "input_digest": digest["g1"], "metadata": {"n": "N"}}
            raw = json.dumps(deny).replace('"N"', "7" * 4000)
            r = await http.post(
                f"{base}/api/chats/{chat.id}/interrupts/g1",
                content=raw,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 200, r.text
            for path in ("pending", "audit"):
                assert (await http.get(f"{base}/api/chats/{chat.id}/{path}")).status_code == 200
            seen = await frames(http, f"{base}/agui/{agent.name}", run_input(chat.id))
            assert seen[-1].event["outcome"]["type"] == "interrupt"
        (record,) = await chat.audit()
        assert record.decision == "denied"
    assert sum(t.RUNS.values()) == 0
    await assert_no_workflow_task_failed(client, chat.id)


async def test_a_number_past_what_python_parses_is_a_bad_request(run_worker, model, client):
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        huge = "9" * 5000
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            approve = {"action": "approve", "input_digest": digest["g1"], "metadata": {"n": "N"}}
            run = resume(chat.id, resolved("g1", {"approved": "N"}))
            for url, raw in (
                (f"{base}/api/chats/{chat.id}/interrupts/g1", json.dumps(approve)),
                (f"{base}/agui/{agent.name}", json.dumps(run)),
            ):
                raw = raw.replace('"N"', huge)
                r = await http.post(url, content=raw, headers={"content-type": "application/json"})
                assert r.status_code == 400 and r.json()["code"] == "malformed_json", r.text
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_a_run_id_that_cannot_be_echoed_is_refused_before_anything_is_sent(
    run_worker, model, client
):
    agent = three_kinds()
    async with run_worker(agents=[agent]) as agents:
        app = agents_app(agents, identity=lambda _: "tester@example.com")
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            threads = []
            for run_id in ("run\ud800", "run\x00", "run\n", "", "r" * 401):
                thread = f"thread-{uuid.uuid4()}"
                threads.append(thread)
                raw = json.dumps({**run_input(thread, "hello"), "runId": run_id})
                r = await http.post(
                    f"{base}/agui/{agent.name}",
                    content=raw,
                    headers={"content-type": "application/json"},
                )
                assert r.status_code == 400 and "runId" in r.json()["detail"], (run_id, r.text)
        for thread in threads:
            with pytest.raises(ChatNotFound):
                await (await agents.chat(agent.name, chat_id=thread)).status()
    assert model.calls == 0


async def test_an_agents_path_reaches_only_that_agents_threads(run_worker, model, client):
    """An application whose rule is by agent: bob may use ``public`` only. Through
    ``/agui/public`` he must not read, reattach to or answer a ``private`` thread."""
    private, public = three_kinds(), three_kinds()
    model.reply(PAUSE)

    def by_agent(request: Any, access: Access) -> bool:
        return request.headers.get("x-user") != "bob" or access.agent == public.name

    async with run_worker(agents=[private, public]) as agents:
        chat, _ = await paused(agents, private)
        app = agents_app(agents, identity=lambda _: "bob", authorize=by_agent)
        bob = {"X-User": "bob"}
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            assert (
                await http.post(f"{base}/agui/{private.name}", json=run_input(chat.id), headers=bob)
            ).status_code == 403
            url = f"{base}/agui/{public.name}"
            for run, headers in (
                (run_input(chat.id), bob),
                (run_input(chat.id), {**bob, "Last-Event-ID": "0/0.0"}),
                (resume(chat.id, resolved("g1", {"approved": True})), bob),
                (resume(chat.id, {"interruptId": "r1", "status": "cancelled"}), bob),
                (run_input(chat.id, "hello"), bob),
            ):
                seen = await frames(http, url, run, headers=headers)
                assert types(seen) == ["RUN_ERROR"], seen
                assert seen[0].event["code"] in ("not_found", "conflict"), seen
                assert "look k up" not in json.dumps([f.event for f in seen])
        await intact(client, chat, ["g1", "r1", "a1"])


# ----------------------------------------------------------------------------------------------
# DNS rebinding, CSRF and CORS.


async def test_only_the_hosts_given_are_answered_whatever_their_spelling(run_worker, model, client):
    async with run_worker(agents=[three_kinds()]) as agents:
        app = agents_app(
            agents,
            identity=lambda _: "tester@example.com",
            allowed_hosts=["agents.example"],
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            port = port_of(base)
            for host in (
                f"127.0.0.1:{port}",
                f"LOCALHOST:{port}",
                "localhost",
                f"[::1]:{port}",
                "agents.example",
                "Agents.Example:8443",
            ):
                r = await http.get(f"{base}/api/whoami", headers={"Host": host})
                assert r.status_code == 200, host
            for host in (
                f"localhost.:{port}",
                "127.0.0.1.",
                "agents.example.",
                "evil.example",
                "agents.example.evil.example",
                "evil.agents.example",
                "agents.example@evil.example",
                f"127.0.0.1:{port}@evil.example",
                f"localhost:{port}:80",
                "localhost:http",
                "127.1",
                "0x7f000001",
                "2130706433",
                "[::ffff:127.0.0.1]",
                "[0:0:0:0:0:0:0:1]",
                "agents%2eexample",
                "",
            ):
                r = await http.get(f"{base}/api/whoami", headers={"Host": host})
                assert r.status_code == 421, host
            # Two Hosts (the parser refuses them), none (HTTP/1.0), and an absolute target that
            # names this app under another Host, or another host under this Host.
            for request, status in (
                (b"GET /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n", 400),
                (b"GET /api/whoami HTTP/1.0\r\n", 421),
                (b"GET http://127.0.0.1:PORT/api/whoami HTTP/1.1\r\nHost: evil.example\r\n", 421),
                (b"GET http://evil.example/api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n", 404),
            ):
                got = await raw_request(base, request + b"Connection: close\r\n\r\n")
                assert status_of(got) == status, (request, got)


async def test_a_page_of_another_origin_cannot_act_or_read(run_worker, model, client):
    agent = three_kinds()
    model.reply(PAUSE)
    asked: list[Access] = []

    def anyone(_: Any, access: Access) -> bool:
        asked.append(access)
        return True

    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(
            agents,
            identity=lambda _: "tester@example.com",  # say, from the session cookie
            cors_origins=["https://ui.example"],
            authorize=anyone,
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            api = f"{base}/api/chats/{chat.id}/interrupts/g1"
            approve = json.dumps({"action": "approve", "input_digest": digest["g1"]})
            for origin in (
                "null",  # a sandboxed frame, a file: page, a redirect across origins
                "https://ui.example.evil.example",
                "https://ui.example:443",
                "https://UI.example",
                "http://ui.example",
                f"http://127.0.0.1:{port_of(base) + 1}",
                f"http://localhost:{port_of(base)}",  # not the Host it was sent to
            ):
                for kind in ("application/json", "text/plain", "application/x-www-form-urlencoded"):
                    r = await http.post(
                        api, content=approve, headers={"Origin": origin, "Content-Type": kind}
                    )
                    assert r.status_code == 403 and r.json()["code"] == "origin", (origin, kind)
                r = await http.post(
                    f"{base}/agui/{agent.name}",
                    json=resume(chat.id, resolved("g1", {"approved": True})),
                    headers={"Origin": origin},
                )
                assert r.status_code == 403, origin
                for path in ("/api/inbox", f"/api/chats/{chat.id}/pending", "/api/whoami"):
                    r = await http.get(f"{base}{path}", headers={"Origin": origin})
                    assert r.status_code == 403, (origin, path)
                    assert "access-control-allow-origin" not in r.headers
                # Preflights, on any path: refused, with no CORS headers.
                for path in ("/api/chats/x/interrupts/y", "/nowhere", "/inbox"):
                    r = await http.options(
                        f"{base}{path}",
                        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
                    )
                    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
            # A form without Origin (no browser sends one so) is still not JSON.
            r = await http.post(api, content=approve, headers={"Content-Type": "text/plain"})
            assert r.status_code == 415
            # The origin given: CORS headers, never credentials; a preflight acts on nothing.
            ui = {"Origin": "https://ui.example"}
            r = await http.options(
                f"{base}/api/chats/x/interrupts/y",
                headers={**ui, "Access-Control-Request-Method": "POST"},
            )
            assert r.status_code == 204
            assert r.headers["access-control-allow-origin"] == "https://ui.example"
            assert "access-control-allow-credentials" not in r.headers
            assert (await http.get(f"{base}/api/whoami", headers=ui)).status_code == 200
        assert all(a.action != "answer" for a in asked)
        await intact(client, chat, ["g1", "r1", "a1"])


def test_origins_that_name_no_one_site_are_refused_when_the_app_is_made():
    agents = AgentClient.__new__(AgentClient)
    for origin in ("null", "*", "https://*.example", "https://ui.example/app", "ui.example"):
        with pytest.raises(ValueError, match="origin"):
            agents_app(agents, identity=lambda _: "x", cors_origins=[origin])
    agents_app(
        agents,
        identity=lambda _: "x",
        cors_origins=["https://ui.example:8443/", "http://[::1]:3000", "chrome-extension://abc"],
    )


# ----------------------------------------------------------------------------------------------
# What the app tells.


async def test_internal_errors_and_refusals_tell_nothing_of_the_inside(run_worker, model, client):
    agent = three_kinds()
    breaks = Agent(f"attack-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.boom])
    model.reply(PAUSE, calls(("boom", {"key": "k"})))
    secret = "sk-live-hunter2"

    def who(request: Any) -> str:
        if request.headers.get("x-break"):
            raise RuntimeError(f"the identity store's password is {secret}")
        return "tester@example.com"

    def rule(request: Any, _: Access) -> bool:
        if request.headers.get("x-break-rule"):
            raise RuntimeError(f"the rules database's password is {secret}")
        return True

    async with run_worker(agents=[agent, breaks]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=who, authorize=rule)
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            told: list[str] = []
            approve = {"action": "approve", "input_digest": digest["g1"]}
            url = f"{base}/agui/{agent.name}"
            for headers in ({"X-Break": "1"}, {"X-Break-Rule": "1"}):
                r = await answer(http, base, chat.id, "g1", approve, headers=headers)
                assert r.status_code == 500 and r.json()["code"] == "internal"
                told.append(r.text)
                r = await http.post(
                    url, json=resume(chat.id, resolved("g1", {"approved": True})), headers=headers
                )
                assert r.status_code == 500
                told.append(r.text)
            r = await http.get(f"{base}/api/chats/{chat.id}/pending", headers={"X-Break-Rule": "1"})
            assert r.status_code == 500
            told.append(r.text)
            # A secret typed into the wrong field is not quoted back.
            body = {
                "action": "respond",
                "input_digest": digest["a1"],
                "output": {"approved": secret},
            }
            r = await answer(http, base, chat.id, "a1", body)
            assert r.status_code == 422
            told.append(r.text)
            edit = {"service": [secret], "version": "2"}
            body = {"action": "edit", "input_digest": digest["r1"], "input": edit}
            r = await answer(http, base, chat.id, "r1", body)
            assert r.status_code == 422
            told.append(r.text)
            seen = await frames(http, url, resume(chat.id, resolved("a1", {"approved": secret})))
            assert types(seen) == ["RUN_ERROR"]
            told.append(json.dumps([f.event for f in seen]))
            # A tool that fails with a secret in its exception: the turn fails, its reason does
            # not carry the exception's text (Temporal's history keeps it, for operators).
            failed = await frames(
                http, f"{base}/agui/{breaks.name}", run_input(f"thread-{uuid.uuid4()}", "go")
            )
            assert failed[-1].type == "RUN_ERROR"
            assert failed[-1].event["message"] == "tool 'boom' failed"
            told.append(json.dumps([f.event for f in failed]))
        for said in told:
            assert secret not in said and "hunter2" not in said and "Traceback" not in said
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_without_authorize_the_inbox_and_every_chat_are_anyones_to_read(
    run_worker, model, client
):
    """As agents_app's docstring and the README say: with no ``authorize``, identity is asked
    only of answers; the inbox (inputs included), a chat's pending calls, its audit trail and
    its messages are read by whoever reaches the app."""
    agent = three_kinds()
    model.reply(PAUSE)
    async with run_worker(agents=[agent]) as agents:
        chat, digest = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: None)  # nobody is anybody
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:

            async def listed() -> list[dict[str, Any]]:
                r = await http.get(f"{base}/api/inbox", params={"agent": agent.name})
                assert r.status_code == 200
                return r.json()["chats"]

            (entry,) = await eventually(listed, lambda c: len(c) == 1, timeout=VISIBILITY_TIMEOUT)
            assert {i["ref"]: i["input"] for i in entry["interrupts"]}["r1"] == RELEASE
            pending = await http.get(f"{base}/api/chats/{chat.id}/pending")
            assert pending.status_code == 200
            assert (await http.get(f"{base}/api/chats/{chat.id}/audit")).status_code == 200
            seen = await frames(http, f"{base}/agui/{agent.name}", run_input(chat.id))
            (snapshot,) = [f.event for f in seen if f.type == "MESSAGES_SNAPSHOT"]
            assert "look k up" in json.dumps(snapshot)
            # Answers are another matter.
            body = {"action": "approve", "input_digest": digest["g1"]}
            assert (await answer(http, base, chat.id, "g1", body)).status_code == 401
        await intact(client, chat, ["g1", "r1", "a1"])


async def test_connections_that_never_finish_a_request_do_not_shut_the_app_to_others(
    monkeypatch,
):
    """As many connections as the app takes, each stuck before the end of its headers (one
    sends half, one trickles a byte a second, one sends nothing): each is closed at the
    header deadline, and the app answers again. Also the guard of ``_deadline_protocol``'s
    reliance on uvicorn's ``H11Protocol``."""
    monkeypatch.setattr(web, "HEADER_DEADLINE", 1.0)
    monkeypatch.setattr(web, "CONNECTIONS", 30)
    app = agents_app(AgentClient.__new__(AgentClient), identity=lambda _: "x")  # whoami only
    async with served(app) as base, httpx2.AsyncClient(timeout=10) as http:
        held = []
        try:
            for i in range(30):
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
                if i % 3 == 0:
                    writer.write(b"POST /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                elif i % 3 == 1:
                    writer.write(b"G")  # then a byte now and then, below
                held.append((reader, writer))
            r = await http.get(f"{base}/api/whoami")
            assert r.status_code == 503  # full
            loop = asyncio.get_running_loop()
            for _ in range(2):
                await asyncio.sleep(0.5)
                for i, (_, writer) in enumerate(held):
                    if i % 3 == 1 and not writer.is_closing():
                        writer.write(b"E")
            deadline = loop.time() + 10
            status = 0
            while loop.time() < deadline:
                status = (await http.get(f"{base}/api/whoami")).status_code
                if status == 200:
                    break
                await asyncio.sleep(0.2)
            assert status == 200
            # Every stuck connection was closed by the app (EOF), none answered.
            for reader, _ in held:
                assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            for _, writer in held:
                writer.close()


@pytest.mark.parametrize(
    ("framing", "status"),
    [
        ("Transfer-Encoding: chunked\r\n", 411),
        ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400),
    ],
    ids=["chunked", "both-lengths"],
)
async def test_a_request_framed_by_transfer_encoding_is_refused_and_nothing_behind_it_served(
    framing, status
):
    """The codec server's framing rule, from the HTTP stack both servers share: the bytes
    behind a chunked request (a whoami, here) are never read as a request, so a proxy in front
    that frames by the other header cannot smuggle one past the app."""
    app = agents_app(AgentClient.__new__(AgentClient), identity=lambda _: "x")
    async with served(app) as base:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
        try:
            writer.write(
                f"POST /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n0\r\n\r\n".encode()
                + b"GET /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            received = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
    assert received.startswith(f"HTTP/1.1 {status} ".encode()), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1, received


async def test_a_body_that_never_arrives_is_a_408(monkeypatch):
    monkeypatch.setattr(web, "BODY_DEADLINE", 0.5)
    app = agents_app(AgentClient.__new__(AgentClient), identity=lambda _: "x")
    async with served(app) as base:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
        try:
            writer.write(
                b"POST /api/chats/c/interrupts/r HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"act'
            )
            answer_head = await asyncio.wait_for(reader.readline(), 10)
            assert answer_head.startswith(b"HTTP/1.1 408"), answer_head
        finally:
            writer.close()


@pytest.mark.parametrize("bad", ["null", "*", "https://app.example/path", "app.example", ""])
def test_both_http_servers_refuse_a_cors_origin_that_is_no_sites(bad):
    """The web app and the codec server keep one rule (temporal_agent_interrupts/http_rules)."""
    from temporal_agent_interrupts.codec import PayloadKeys, generate_key
    from temporal_agent_interrupts.codec_server import CodecServer

    with pytest.raises(ValueError, match="not one site's origin"):
        agents_app(AgentClient.__new__(AgentClient), identity="bearer", cors_origins=[bad])
    with pytest.raises(ValueError, match="not one site's origin"):
        CodecServer(PayloadKeys.parse(generate_key("k")), cors_origins=[bad])


# ----------------------------------------------------------------------------------------------
# What one request costs (finding 15 of issue 44).


async def test_audit_reads_a_closed_runs_history_once_and_after_that_only_the_open_run(
    small_histories, model, monkeypatch
):
    """``/api/chats/{id}/audit`` read every run's whole history on every request (1.1 s for
    a chat with 94 MB of it). Closed runs' histories never change: each is read once per
    client, and every later audit reads only the chat's open run. The trail is the same."""
    client = small_histories.client
    tq = f"audit-cache-{uuid.uuid4()}"
    asker = Agent(f"audit-cache-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve])
    reads: list[str] = []
    real_read_run = audit_module.read_run

    async def counted(temporal: Any, chat_id: str, run_id: str) -> Any:
        reads.append(run_id)
        return await real_read_run(temporal, chat_id, run_id)

    monkeypatch.setattr(audit_module, "read_run", counted)
    async with build_worker(client, agents=[asker], task_queue=tq, gemini=model.client()):
        agents = AgentClient(client, task_queue=tq)
        chat = await agents.chat(asker.name)
        runs: list[str] = []
        answered = 0
        while len(runs) < 3 and answered < 20:
            n = answered
            model.reply(calls(("approve", {"question": f"q{n}"}, f"a{n}")), text(f"done {n}"))
            (asked,) = (await chat.send(f"turn {n}")).interrupts
            done = await chat.resume(answers=[asked.respond({"approved": True})], identity="ann")
            assert done.text == f"done {n}"
            answered += 1
            runs = [wf.run_id async for wf in client.list_workflows(f'WorkflowId="{chat.id}"')]
        assert len(runs) >= 3, runs
        async with (
            served(agents_app(agents, identity=lambda _: "ann")) as base,
            httpx2.AsyncClient(timeout=60) as http,
        ):
            first = await http.get(f"{base}/api/chats/{chat.id}/audit")
            assert first.status_code == 200, first.text
            read_first = list(reads)
            reads.clear()
            again = await http.get(f"{base}/api/chats/{chat.id}/audit")
            assert again.status_code == 200
    assert set(runs) <= set(read_first)
    # The second audit read only the open run: the closed ones came from what was kept.
    open_run = (await chat.handle.describe()).run_id
    assert reads == [open_run], (reads, runs)
    assert again.json() == first.json()
    assert len(first.json()["records"]) == answered


async def test_a_client_that_goes_away_mid_body_is_not_an_internal_error(
    run_worker, model, client, caplog
):
    """A client that sent part of a body and closed the connection was logged as the app's
    internal error (a traceback at ERROR): it is the client's doing, and nobody is left to
    answer."""
    agent = three_kinds()
    model.reply(PAUSE)
    done = asyncio.Event()
    async with run_worker(agents=[agent]) as agents:
        chat, _ = await paused(agents, agent)
        app = agents_app(agents, identity=lambda _: "ann")

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            finally:
                if scope["type"] == "http" and scope["path"].endswith("/interrupts/g1"):
                    done.set()

        caplog.set_level(logging.DEBUG, logger="temporal_agent_interrupts.client.web")
        async with served(watched) as base:  # type: ignore[arg-type]  # an ASGI app, as uvicorn takes it
            _, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            writer.write(
                f"POST /api/chats/{chat.id}/interrupts/g1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                '{"action": "appr'.encode()
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            await asyncio.wait_for(done.wait(), 30)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        await intact(client, chat, ["g1", "r1", "a1"])

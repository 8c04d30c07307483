"""Operators see, make and revoke grants (remembered decisions) where they answer: ``agentctl``,
the approvals API, the inbox page's API calls, and the Temporal UI's details panel.

Against the session's dev server: ``agentctl`` runs as the installed console script in a
subprocess (as tests/test_operator.py runs it), the web app is served by uvicorn on a loopback
port (tests/web.py). The grant's own rules (matching, quorum, expiry) are tests/test_grants.py's;
here each surface is shown to make, list and end the same grant the API does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
import typer
from playwright.async_api import expect

from temporal_agent_interrupts.client.cli import remember_scope
from temporal_agent_interrupts.client.views import grant_condition, grant_until
from temporal_agent_interrupts.client.web import Access, agents_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.details import render_details
from temporal_agent_interrupts.workflows.grants import describe_match
from temporal_agent_interrupts.workflows.types import Grant, GrantCondition, GrantScope
from tests import agents as t
from tests.browser import UI_TIMEOUT_MS, browser_context, first_page
from tests.helpers import assert_no_workflow_task_failed, current_details, eventually
from tests.test_grants import CFO, UNDER_100, _pay, payer, payments
from tests.test_inbox_page import (
    DEV_IDENTITY,
    click_and_answer,
    inbox_url,
    page_errors,
    release_agent,
    row_of,
)
from tests.test_operator import agentctl
from tests.web import served


@pytest.fixture(autouse=True)
def _paid() -> None:
    payments.clear()


# ----------------------------------------------------------------------------------------------
# Reading a condition as typed, and showing one: pure, no server.


@pytest.mark.parametrize(
    ("typed", "field", "op", "value"),
    [
        ("amount<=100", "amount", "le", 100),
        ("amount<99.5", "amount", "lt", 99.5),
        ("amount>=0", "amount", "ge", 0),
        ("amount>-1", "amount", "gt", -1),
        ('currency=="EUR"', "currency", "eq", "EUR"),
        ("count==3", "count", "eq", 3),
        ("payee.verified==true", "payee.verified", "eq", True),
        ("payee^=NL", "payee", "prefix", "NL"),
        # The first operator splits: the rest is the prefix, operators and all.
        ("note^=a<=b", "note", "prefix", "a<=b"),
    ],
)
def test_a_remember_if_condition_is_read_strictly(typed: str, field: str, op: str, value: Any):
    expected = GrantCondition.model_validate({"field": field, "op": op, "value": value})
    assert grant_condition(typed) == expected


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("amount", "no operator"),
        ("amount=100", "no operator"),
        ("amount<=true", "not a number"),
        ("amount<=ten", "not a number"),
        ("amount<=1e999", "not a number"),
        ("currency==EUR", "quote a string"),
        ("ids==[1]", "quote a string"),
        ("payee^=", "prefix is empty"),
        ("<=3", "not a field path"),
        ("my amount<=3", "not a field path"),
    ],
)
def test_a_malformed_condition_is_refused_saying_why(typed: str, says: str):
    with pytest.raises(typer.BadParameter, match=says):
        grant_condition(typed)


def test_remember_options_must_say_what_is_remembered():
    assert remember_scope(tool=False, conditions=[], until=None) is None
    assert remember_scope(tool=True, conditions=[], until=None) == GrantScope()
    until = remember_scope(tool=True, conditions=[], until="2030-01-01T00:00:00Z")
    assert until is not None and until.until == datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(typer.BadParameter, match="give one"):
        remember_scope(tool=True, conditions=["amount<=1"], until=None)
    with pytest.raises(typer.BadParameter, match="needs --remember-tool or --remember-if"):
        remember_scope(tool=False, conditions=[], until="2030-01-01T00:00:00Z")
    with pytest.raises(typer.BadParameter, match="no UTC offset"):
        grant_until("2030-01-01T00:00:00")
    with pytest.raises(typer.BadParameter, match="not an ISO 8601"):
        grant_until("tomorrow")


def test_conditions_read_as_an_operator_says_them():
    assert describe_match(UNDER_100.match) == "amount ≤ 100"
    both = [
        GrantCondition(field="payee", op="prefix", value="NL"),
        GrantCondition(field="count", op="eq", value="3"),
    ]
    # A string shows quoted: "3" and 3 match different inputs.
    assert describe_match(both) == 'payee starts with "NL" and count = "3"'
    assert describe_match([]) == "every call"


# ----------------------------------------------------------------------------------------------
# The details panel: pure.


def _grant(n: int, **more: Any) -> Grant:
    fields: dict[str, Any] = {
        "id": f"grant-{n}",
        "tool": "pay",
        "match": UNDER_100.match,
        "granted_by": [CFO],
        "at": datetime(2026, 1, 1, tzinfo=UTC),
        "ref": f"p{n}",
    }
    return Grant.model_validate({**fields, **more})


def _details(grants: list[Grant]) -> str:
    return render_details(
        chat_id="chat 1",
        namespace="default",
        agent="payer",
        status="idle",
        turns=1,
        spec=None,
        pending=[],
        last_turn=None,
        rejections=[],
        rejections_total=0,
        requests=[],
        grants=grants,
    )


def test_the_details_panel_lists_the_grants_in_force_with_the_command_that_revokes_them():
    until = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    hostile = _grant(2, tool="pay`**x**", granted_by=["eve`\u202e@example.com"], until=until)
    panel = _details([_grant(1), hostile])
    assert "### Grants in force (2)" in panel
    assert (
        "- `grant-1`: `pay` when `amount ≤ 100`, until revoked, granted by "
        "`cfo@example.com` (asserted)" in panel
    )
    assert "until 2026-01-02 03:04:05 UTC" in panel
    # Whatever a tool name or identity holds stays inside its code span, escaped.
    assert "``pay`**x**``" in panel and "\\u202e" in panel and "\u202e" not in panel
    assert "agentctl revoke-grant 'chat 1' GRANT_ID --reason TEXT" in panel
    assert "### Grants" not in _details([])


def test_the_details_panel_bounds_its_grants():
    many = [_grant(n, match=[GrantCondition(field="memo", value="x" * 256)] * 8) for n in range(32)]
    panel = _details(many)
    shown = panel.split("### Grants in force (32)", 1)[1]
    assert "… and 22 more (agentctl grants" in shown
    assert len(shown) < 10_000


# ----------------------------------------------------------------------------------------------
# agentctl


async def test_agentctl_approves_with_remember_lists_and_revokes_the_grant(
    run_worker, model, client
):
    model.reply(_reply(80, "p1"), text("paid 80"))
    model.reply(_reply(50, "p2"), text("paid 50"))
    async with run_worker(agents=[payer]) as agents:
        queue = agents.task_queue
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        # Strict before anything is sent: a usage error, and the call still waits.
        bad = await agentctl(
            client, "approve", chat.id, "p1", "--remember-if", "amount=100", task_queue=queue
        )
        assert bad.code == 2 and "no operator" in bad.err, bad
        assert [i.ref for i in await chat.pending()] == ["p1"]

        approved = await agentctl(
            client,
            "approve",
            chat.id,
            "p1",
            "--remember-if",
            "amount<=100",
            "--identity",
            CFO,
            "--json",
            task_queue=queue,
        )
        assert approved.code == 0, approved
        (sent,) = approved.json()["restart"]
        assert sent["remember"]["match"] == [{"field": "amount", "op": "le", "value": 100}]

        listed = await agentctl(client, "grants", chat.id, "--json", task_queue=queue)
        assert listed.code == 0, listed
        (grant,) = listed.json()["grants"]
        assert (grant["tool"], grant["granted_by"], grant["uses"]) == ("pay", [CFO], 0)
        # A matching call runs unasked; the human view shows it used, and how to revoke.
        assert (await chat.send("pay 50")).interrupts == []
        shown = await agentctl(client, "grants", chat.id, task_queue=queue)
        assert shown.code == 0, shown
        for expected in (grant["id"], "pay", "amount ≤ 100", "until revoked", CFO, "revoke-grant"):
            assert expected in shown.out, shown.out
        assert shown.out.split(grant["id"], 1)[1].splitlines()[0].rstrip().endswith("1")

        revoked = await agentctl(
            client,
            "revoke-grant",
            chat.id,
            grant["id"],
            "--reason",
            "done for today",
            "--identity",
            CFO,
            "--json",
            task_queue=queue,
        )
        assert revoked.code == 0, revoked
        out = revoked.json()
        assert (out["revoked"]["id"], out["identity"], out["grants"]) == (grant["id"], CFO, [])
        assert await chat.grants() == []
        # Revoked already: a refusal (exit 1) that says so.
        again = await agentctl(client, "revoke-grant", chat.id, grant["id"], task_queue=queue)
        assert again.code == 1 and "rejected" in again.err and "no grant" in again.err, again
        hist = await chat.history()
    assert payments == [(80, None), (50, grant["id"])]
    (ended,) = [a for a in hist.answers if a.kind == "revoked"]
    assert (ended.identity, ended.grant, ended.ref) == (CFO, grant["id"], first.ref)
    await assert_no_workflow_task_failed(client, chat.id)


async def test_agentctl_remember_on_an_interrupt_only_tool_is_refused_and_nothing_is_sent(
    run_worker, model, client
):
    model.reply(calls(("approve", {"question": "order ink?"}, "a1")), text("ok"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        assert (await chat.send("ask")).interrupts
        run = await agentctl(
            client, "approve", chat.id, "a1", "--remember-tool", task_queue=agents.task_queue
        )
        assert run.code == 1 and "interrupt" in run.err, run
        assert [i.ref for i in await chat.pending()] == ["a1"]


# ----------------------------------------------------------------------------------------------
# The approvals API


async def test_the_api_grants_with_an_approval_lists_and_revokes_as_the_logged_in_identity(
    run_worker, model, client
):
    model.reply(_reply(80, "p1"), text("paid 80"))
    model.reply(_reply(30, "p2"), text("paid 30"))
    asked: list[Access] = []

    def cfo_only(request: Any, access: Access) -> bool:
        asked.append(access)
        return access.identity == CFO or access.action == "read"

    async with run_worker(agents=[payer]) as agents:
        app = agents_app(
            agents, identity=lambda request: request.headers.get("x-user"), authorize=cfo_only
        )
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            as_cfo, as_eve = {"X-User": CFO}, {"X-User": "eve@example.com"}
            url = f"{base}/api/chats/{chat.id}"
            approve = {
                "action": "approve",
                "input_digest": first.input_digest,
                "remember": {"match": [{"field": "amount", "op": "le", "value": 100}]},
            }
            # A remember on anything but an approval, or a misspelt scope: 400, nothing sent.
            r = await http.post(
                f"{url}/interrupts/p1", json={**approve, "action": "deny"}, headers=as_cfo
            )
            assert r.status_code == 400 and "remember" in r.json()["detail"], r.text
            r = await http.post(
                f"{url}/interrupts/p1",
                json={**approve, "remember": {"matches": []}},
                headers=as_cfo,
            )
            assert r.status_code == 400, r.text
            # A scope the conversation refuses (a field the tool's input lacks): 422.
            r = await http.post(
                f"{url}/interrupts/p1",
                json={**approve, "remember": {"match": [{"field": "iban", "value": "x"}]}},
                headers=as_cfo,
            )
            assert r.status_code == 422 and "no field" in r.json()["detail"], r.text

            r = await http.post(f"{url}/interrupts/p1", json=approve, headers=as_cfo)
            assert r.status_code == 200 and r.json()["result"]["text"] == "paid 80", r.text
            r = await http.get(f"{url}/grants", headers=as_eve)
            assert r.status_code == 200, r.text
            (grant,) = r.json()["grants"]
            assert (grant["tool"], grant["granted_by"]) == ("pay", [CFO])
            assert (await chat.send("pay 30")).interrupts == []

            # Revoking is answering's business: eve's is refused by the app's rule (403).
            revoke = f"{url}/grants/{grant['id']}/revoke"
            r = await http.post(revoke, json={"reason": "mine"}, headers=as_eve)
            assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
            assert len(await chat.grants()) == 1
            # No identity at all: 401.
            assert (await http.post(revoke, json={})).status_code == 401
            r = await http.post(revoke, json={"reason": "done"}, headers=as_cfo)
            assert r.status_code == 200, r.text
            assert r.json() == {"chat_id": chat.id, "revoked": grant["id"], "grants": []}
            # Gone: 404, with the conversation's reason.
            r = await http.post(revoke, json={}, headers=as_cfo)
            assert r.status_code == 404 and "no grant" in r.json()["detail"], r.text
            # Malformed or too large bodies are refused before anything is sent.
            r = await http.post(revoke, json={"reason": "x", "why": 1}, headers=as_cfo)
            assert r.status_code == 400, r.text
            r = await http.post(
                revoke,
                content=b'{"reason": "' + b"x" * 70_000 + b'"}',
                headers={**as_cfo, "content-type": "application/json"},
            )
            assert r.status_code == 413, r.text
            assert (await http.get(f"{base}/api/chats/no-such/grants")).status_code == 404
        hist = await chat.history()
    (ended,) = [a for a in hist.answers if a.kind == "revoked"]
    assert (ended.identity, ended.grant, ended.metadata) == (CFO, grant["id"], {"reason": "done"})
    assert Access(action="answer", chat_id=chat.id, agent="payer", identity=CFO) in asked
    assert any(a.action == "read" and a.chat_id == chat.id for a in asked)
    await assert_no_workflow_task_failed(client, chat.id)


# ----------------------------------------------------------------------------------------------
# The details panel, as the workflow publishes it


async def test_the_ui_details_show_a_grant_and_stop_once_it_is_revoked(run_worker, model, client):
    model.reply(_reply(80, "p1"), text("paid 80"))
    async with run_worker(agents=[payer]) as agents:
        chat = await agents.chat("payer")
        (first,) = (await chat.send("pay 80")).interrupts
        until = datetime.now(UTC) + timedelta(days=1)
        scope = UNDER_100.model_copy(update={"until": until})
        await chat.resume(answers=[first.approve(remember=scope)], identity=CFO)
        (grant,) = await chat.grants()
        shown = await eventually(
            lambda: current_details(client, chat.id), lambda d: "Grants in force" in d
        )
        assert f"`{grant.id}`: `pay` when `amount ≤ 100`" in shown
        assert f"agentctl revoke-grant {chat.id} GRANT_ID" in shown
        await chat.revoke_grant(grant.id, identity=CFO)
        await eventually(
            lambda: current_details(client, chat.id), lambda d: "Grants in force" not in d
        )
    await assert_no_workflow_task_failed(client, chat.id)


def _reply(amount: float, ref: str) -> dict[str, Any]:
    return calls(_pay(amount, ref))


# ----------------------------------------------------------------------------------------------
# The inbox page, in Chromium


async def test_the_inbox_page_remembers_an_approval_shows_the_grant_and_revokes_it(
    browser: str, run_worker, model, client, tmp_path: Path
) -> None:
    agent = release_agent()
    release = ("release", {"service": "api", "version": "2"})
    model.reply(calls((*release, "r1")), text("released"))
    model.reply(calls((*release, "r2")), text("released again"))
    async with (
        run_worker(agents=[agent]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-grant")
        assert (await chat.send("Release api 2.")).interrupts
        page = await first_page(context)
        errors = page_errors(page)
        await page.goto(inbox_url(origin, agent))
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)

        # Approve, remembering: the page then shows the grant it made.
        await row.get_by_label("Remember for this tool").check()
        approve = row.get_by_role("button", name=f"Approve release in {chat.id}")
        answered = await click_and_answer(page, approve)
        assert answered.status == 200, await answered.text()
        (grant,) = await chat.grants()
        shown = page.locator("#grant-entries tr")
        await expect(shown).to_have_count(1)
        await expect(shown.locator("td.grant-id")).to_have_text(grant.id)
        await expect(shown.locator("td.tool")).to_have_text("release")
        await expect(shown.locator("td.when")).to_have_text("every call")
        await expect(shown.locator("td.until")).to_have_text("until revoked")
        await expect(shown.locator("td.by")).to_have_text(f"{DEV_IDENTITY} (asserted)")

        # It lets the next call through; the page's count says so once asked again.
        assert (await chat.send("Again.")).interrupts == []
        assert t.RUNS["release"] == 2
        await page.get_by_role("button", name="Show grants").click()
        await expect(shown.locator("td.uses")).to_have_text("1")

        # Revoke: the grant ends, and the next call asks again.
        revoke = shown.get_by_role("button", name=f"Revoke {grant.id} in {chat.id}")
        async with page.expect_response(lambda r: r.url.endswith("/revoke")) as posted:
            await revoke.click()
        assert (await posted.value).status == 200
        await expect(page.locator("#grants-status")).to_have_text(
            f"No grants in force on {chat.id}."
        )
        await expect(page.locator("#results li").first).to_contain_text("revoked")
        assert await chat.grants() == []
        assert not errors, errors
        hist = await chat.history()
    (ended,) = [a for a in hist.answers if a.kind == "revoked"]
    assert (ended.identity, ended.grant) == (DEV_IDENTITY, grant.id)

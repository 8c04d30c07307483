"""The approver's inbox page in a real browser: the web app's ``/inbox``, in Chromium.

The app (``client.web.agents_app``, in development mode: the identity is the asserted
``dev@localhost``) is served by uvicorn on a loopback port (``tests.web.served``), against the
session's dev server and a worker hosting a gated tool that counts its runs
(``tests.agents.release``). The page is driven as an approver uses it: it lists the paused call
(its input shown as text, whatever markup the model put in it), Approve runs the tool once and
shows what the turn did, a second tab still showing the call (it has not refreshed since) is
refused and says why, and Deny sends the reason typed. What the pages requested is recorded:
their own origin only.

A payment's call reads as its tool's ``Present`` writes it (its summary, risk, fields, the
requester, the user's request and the model's words; the raw input only behind "details"), an
edit through its form runs the tool once with the edited input, and a respond through the form
made from an interrupt-only tool's output schema answers with the typed output.

Visibility is shared by every test on the session's server, so each test's agent name is its
own and the page is opened with ``?agent=`` (which it passes on to ``/api/inbox``).
"""

from __future__ import annotations

import json
import re
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from playwright.async_api import ConsoleMessage, Locator, Page, Request, Response, Route, expect
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.routing import Mount

from temporal_agent_interrupts import Agent, FinishReason, ToolApproval, agent_tool, interrupt, tool
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.policies import Present, Show
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.config import TOOL_ACTIVITY
from temporal_agent_interrupts.workflows.types import DENIED_BY_USER
from tests import agents as t
from tests.browser import UI_TIMEOUT_MS, browser_context, first_page
from tests.helpers import history, scheduled_activities
from tests.web import served

HOSTILE = {
    "service": '<img src=x onerror="window.__pwned=1">',
    "version": "</pre><script>window.__pwned=2</script>",
}
"""The model's arguments for the gated call: markup a prompt injection could have put there."""

DONE = 'Released. <b>Done</b> <img src=x onerror="window.__pwned=3">'
"""What the model says once the tool ran: shown as the turn's result, as text too."""

DEV_IDENTITY = "dev@localhost"
"""Who a development-mode app takes answers from when the request names no one."""

STATIC = Path(__file__).resolve().parent.parent / "client" / "static"


def release_agent() -> Agent:
    """``release`` gated by ``ToolApproval`` (anyone may answer), under a name of this test's."""
    return Agent(
        f"inbox-page-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.release],
        middleware=[ToolApproval(allow=[])],
    )


def inbox_url(origin: str, agent: Agent, *, mounted_at: str = "") -> str:
    return f"{origin}{mounted_at}/inbox?agent={quote(agent.name)}"


def row_of(page: Page, chat_id: str) -> Locator:
    """The table row of the chat's paused call."""
    return page.locator("#entries tr", has=page.locator("td.chat code", has_text=chat_id))


async def keep_first_listing_of(page: Page, chat_id: str) -> None:
    """From the first ``/api/inbox`` answer that lists ``chat_id`` on, the page gets that answer
    again at every poll: a tab showing the call as it was when it loaded, which has not
    refreshed since (the race a second approver loses, made certain)."""
    kept: list[bytes] = []

    async def replay(route: Route) -> None:
        if kept:
            await route.fulfill(status=200, content_type="application/json", body=kept[0])
            return
        response = await route.fetch()
        body = await response.body()
        if chat_id.encode() in body:
            kept.append(body)
        await route.fulfill(response=response, body=body)

    await page.route(lambda url: urlsplit(url).path == "/api/inbox", replay)


def page_errors(page: Page) -> list[str]:
    """The page's errors from now on: its script's uncaught exceptions, and the console's
    errors (a script or style the policy blocked says so there) but for the refused answers'
    statuses, which the page shows."""
    errors: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error" and "the server responded with a status of" not in message.text:
            errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return errors


async def assert_markup_shown_as_text(page: Page) -> None:
    """Nothing the conversation holds became an element: no image, no script but the page's
    own, none of their handlers ran."""
    assert await page.locator("img").count() == 0
    scripts = await page.eval_on_selector_all("script", "all => all.map(s => s.src)")
    assert len(scripts) == 1 and urlsplit(scripts[0]).path.endswith("/inbox/inbox.js"), scripts
    assert await page.evaluate("() => window.__pwned") is None


async def screenshot(page: Page, path: Path) -> None:
    await page.screenshot(path=path, full_page=True)
    print(f"screenshot of the inbox page: {path}")


async def click_and_answer(page: Page, button: Locator) -> Response:
    """Click an answer button and the app's response to the POST it sends."""
    async with page.expect_response(
        lambda r: r.request.method == "POST" and "/interrupts/" in r.url
    ) as posted:
        await button.click()
    return await posted.value


async def test_approve_runs_the_tool_once_shows_the_result_and_a_stale_second_click_is_refused(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    agent = release_agent()
    model.reply(calls(("release", HOSTILE, "release-1")), text(DONE))
    requested: list[str] = []
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-approve")
        paused = await chat.send("Release it.")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        (call,) = paused.interrupts
        assert (call.name, call.ref, call.input) == ("release", "release-1", HOSTILE)

        async with (
            served(agents_app(agents, dev_loopback=True)) as origin,
            browser_context(browser, tmp_path / "profile", requested=requested) as context,
        ):
            page = await first_page(context)
            errors = page_errors(page)
            loaded = await page.goto(inbox_url(origin, agent))
            assert loaded is not None and loaded.ok
            # The page runs under the app's policy: no inline script or style would.
            policy = await loaded.header_value("content-security-policy") or ""
            assert "default-src 'self'" in policy, policy
            await expect(page.locator("#identity")).to_have_text(DEV_IDENTITY)

            # The paused call is listed (once visibility has it: the page polls), its input as
            # the JSON the model sent, markup and all, as text.
            row = row_of(page, chat.id)
            await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(row.locator("td.tool code.name")).to_have_text("release")
            await expect(row.locator("td.input pre")).to_have_text(
                json.dumps(HOSTILE, indent=2, ensure_ascii=False)
            )
            await expect(row.locator("td.approvers")).to_have_text("anyone")
            await expect(row.locator("td.votes .count")).to_have_text("0 / 1")
            await assert_markup_shown_as_text(page)
            await screenshot(page, tmp_path / "inbox-listed.png")

            # A second tab, as the same approver left it: it keeps showing the call.
            stale = await context.new_page()
            stale_errors = page_errors(stale)
            await keep_first_listing_of(stale, chat.id)
            await stale.goto(inbox_url(origin, agent))
            stale_row = row_of(stale, chat.id)
            await expect(stale_row).to_have_count(1, timeout=UI_TIMEOUT_MS)

            # Approve: the tool runs once, and the page shows what the turn did.
            assert t.RUNS["release"] == 0
            approve = row.get_by_role("button", name=f"Approve release in {chat.id}")
            answered = await click_and_answer(page, approve)
            assert answered.status == 200, await answered.text()
            results = page.locator("#results li")
            await expect(results).to_have_count(1)
            await expect(results).to_contain_text("finished stop")
            await expect(results.locator("q")).to_have_text(DONE)
            assert t.RUNS["release"] == 1
            # Answered, the call leaves the list at a later poll; the result stays.
            await expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
            await expect(results).to_have_count(1)
            await expect(results.locator("q")).to_have_text(DONE)
            await assert_markup_shown_as_text(page)

            # The stale tab's Approve reaches the app, which refuses it; the tab says why.
            again = stale_row.get_by_role("button", name=f"Approve release in {chat.id}")
            refused = await click_and_answer(stale, again)
            assert refused.status == 409, await refused.text()
            assert refused.headers["content-type"].startswith("application/problem+json")
            problem = await refused.json()
            shown = stale.locator("#results li")
            await expect(shown).to_have_count(1)
            await expect(shown).to_have_class("result refused")
            await expect(shown.locator(".detail")).to_have_text(problem["detail"])
            await expect(shown.locator(".status")).to_contain_text("409")
            await expect(
                stale_row.get_by_role("button", name=f"Approve release in {chat.id}")
            ).to_be_disabled()
            assert not errors and not stale_errors, errors + stale_errors
            await screenshot(page, tmp_path / "inbox-approved.png")
            await screenshot(stale, tmp_path / "inbox-refused.png")

        # Exactly once, by the count and by history.
        assert t.RUNS["release"] == 1
        scheduled = scheduled_activities(await history(agents.temporal, chat.id))
        assert scheduled.count(TOOL_ACTIVITY) == 1, scheduled  # release is its only tool

    # Everything either page asked for was the app's: no CDN, no font, no beacon.
    app = urlsplit(origin)
    assert requested and all(
        (urlsplit(url).scheme, urlsplit(url).netloc) == (app.scheme, app.netloc)
        for url in requested
    ), requested
    paths = {urlsplit(url).path for url in requested}
    assert {"/inbox", "/inbox/inbox.js", "/inbox/inbox.css", "/api/whoami", "/api/inbox"} <= paths


async def test_a_chat_that_pauses_after_the_page_loaded_shows_up_and_deny_sends_the_reason(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    agent = release_agent()
    model.reply(
        calls(("release", {"service": "billing", "version": "2.0"}, "release-2")),
        text("Not released."),
    )
    reason = "not on a Friday <b>please</b>"
    async with (
        run_worker(agents=[agent]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        page = await first_page(context)
        errors = page_errors(page)
        await page.goto(inbox_url(origin, agent))
        await expect(page.locator("#status")).to_contain_text("Nothing is waiting")

        # Paused after the page loaded: a later poll lists it, with no reload.
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-deny")
        assert (await chat.send("Release billing 2.0.")).interrupts
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)

        # Deny asks for a reason (optional), in the row, and sends it.
        await row.get_by_role("button", name=f"Deny release in {chat.id}").click()
        await row.get_by_label("Reason (optional)").fill(reason)
        send = row.get_by_role("button", name=f"Send the denial of release in {chat.id}")
        answered = await click_and_answer(page, send)
        assert answered.status == 200, await answered.text()
        result = page.locator("#results li")
        await expect(result).to_contain_text("finished stop")
        await expect(result.locator("q")).to_have_text("Not released.")
        await expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
        await expect(result).to_have_count(1)
        assert not errors, errors

    # The tool never ran; the model was told it was denied, and why.
    assert t.RUNS["release"] == 0
    (response,) = model.requests[-1].function_responses()
    assert response["response"] == {"error": DENIED_BY_USER, "reason": reason}


async def test_a_sub_agent_s_call_is_listed_on_its_caller_with_its_path_and_approved_there(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    # A caller whose only tool is a sub-agent (agent_tool) holding the gated release.
    sub = release_agent()
    boss = Agent(f"inbox-boss-{uuid.uuid4().hex[:8]}", tools=[agent_tool(sub)])
    release = {"service": "billing", "version": "2.1"}
    model.reply(
        calls((sub.name, {"input": "Release billing 2.1."}, "boss-1")),  # the caller's model
        calls(("release", release, "release-3")),  # the sub-agent's
        text("Released 2.1."),  # the sub-agent's, once the tool ran
        text("The release team released it."),  # the caller's, with the sub-agent's answer
    )
    async with (
        run_worker(agents=[boss]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        chat = await agents.chat(boss.name, chat_id=f"{boss.name}-sub")
        paused = await chat.send("Release billing 2.1.")
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        child_id = f"{chat.id}--boss-1"
        page = await first_page(context)
        errors = page_errors(page)
        await page.goto(inbox_url(origin, boss))

        # Listed under the caller's chat, saying which sub-agent chat it waits in and the path.
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
        await expect(row.locator("td.tool code.name")).to_have_text("release")
        await expect(row.locator("td.tool .sub-agent > code")).to_have_text(child_id)
        await expect(row.locator("td.tool .path")).to_have_text("path boss-1 → release-3")
        assert t.RUNS["release"] == 0

        # Approved through the caller: the sub-agent's tool runs once, the caller's turn ends.
        approve = row.get_by_role("button", name=f"Approve release in {chat.id}")
        answered = await click_and_answer(page, approve)
        assert answered.status == 200, await answered.text()
        result = page.locator("#results li")
        await expect(result).to_contain_text("finished stop")
        await expect(result.locator("q")).to_have_text("The release team released it.")
        await expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
        assert not errors, errors

    assert t.RUNS["release"] == 1
    # The sub-agent's tool ran in the sub-agent's chat; the caller ran none of its own.
    assert scheduled_activities(await history(agents.temporal, child_id)).count(TOOL_ACTIVITY) == 1
    assert TOOL_ACTIVITY not in scheduled_activities(await history(agents.temporal, chat.id))
    # The caller's model heard the sub-agent's answer as the call's output.
    (response,) = model.requests[-1].function_responses()
    assert response["response"] == {"text": "Released 2.1.", "chat_id": child_id}


class _Markup(HTMLParser):
    """What the page's HTML loads, and anything inline in it."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.inline: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        self.loads += [v for k, v in attrs if k in ("src", "href") and v is not None]
        self.inline += [f"{tag} {k}=" for k, _ in attrs if k == "style" or k.startswith("on")]
        if tag == "style" or (tag == "script" and not named.get("src")):
            self.inline.append(tag)
        self._in = tag

    def handle_data(self, data: str) -> None:
        if self._in == "script" and data.strip():
            self.inline.append(f"script: {data.strip()[:40]}")

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def test_the_page_has_nothing_inline_and_loads_nothing_from_another_origin() -> None:
    """What the browser test sees through the app, read from the files themselves: the page
    must work under ``default-src 'self'`` wherever it is served, and show data as text."""
    markup = _Markup()
    markup.feed((STATIC / "inbox.html").read_text())
    assert markup.inline == []
    # Relative to the page, so that it works where the app is mounted.
    assert markup.loads == ["inbox/inbox.css", "inbox/inbox.js"]
    css = (STATIC / "inbox.css").read_text()
    assert not re.search(r"@import|url\(", css)
    script = (STATIC / "inbox.js").read_text()
    assert not re.search(r"https?://", script)
    # Data only ever goes through textContent, text nodes and attributes.
    for sink in (
        ".innerHTML",
        ".outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
    ):
        assert sink not in script, sink


async def test_mounted_in_an_application_an_approver_the_call_does_not_name_is_refused(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    """The app inside the team's own (``Mount``, as a FastAPI service mounts it), with the
    application's identity function: the page finds its files and the API under the prefix,
    and an approver the gate does not name is refused (403), the page saying why."""
    agent = Agent(
        f"inbox-page-ops-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.release],
        middleware=[ToolApproval(allow=[], approvers=["ops@example.com"])],
    )
    model.reply(calls(("release", {"service": "billing", "version": "3.0"}, "release-3")))
    # The application's own identity function (its session, say): here, always the same person.
    app_identity = "mallory@example.com"
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-ops")
        assert (await chat.send("Release billing 3.0.")).interrupts
        async with (
            served(
                Starlette(
                    routes=[Mount("/agents", agents_app(agents, identity=lambda _: app_identity))]
                )
            ) as origin,
            browser_context(browser, tmp_path / "profile") as context,
        ):
            page = await first_page(context)
            errors = page_errors(page)
            await page.goto(inbox_url(origin, agent, mounted_at="/agents"))
            await expect(page.locator("#identity")).to_have_text(app_identity)
            row = row_of(page, chat.id)
            await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
            await expect(row.locator("td.approvers")).to_have_text("ops@example.com")

            approve = row.get_by_role("button", name=f"Approve release in {chat.id}")
            refused = await click_and_answer(page, approve)
            assert refused.status == 403, await refused.text()
            problem = await refused.json()
            shown = page.locator("#results li")
            await expect(shown).to_have_class("result refused")
            await expect(shown.locator(".status")).to_contain_text("403")
            await expect(shown.locator(".detail")).to_have_text(problem["detail"])
            assert refused.url.startswith(f"{origin}/agents/api/chats/")
            # Still pending, for someone it names: the row stays, and the result with it.
            await expect(row).to_have_count(1)
            assert not errors, errors
    assert t.RUNS["release"] == 0


async def test_an_input_too_large_for_the_listing_is_approved_only_once_it_is_shown_whole(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    """Finding 12 of issue 44: an input over the listing's 1 KiB is listed as a placeholder,
    and Approve ran it on one click, unseen (a hidden 950,000 wire). Now Approve is off until
    the approver has the whole input shown (fetched from the chat's pending calls, and only
    when its digest is the one listed); then it approves what was shown, once."""
    agent = release_agent()
    hidden = {"service": "wire 950,000 to mallory", "version": "padding " * 300}
    model.reply(calls(("release", hidden, "release-big")), text("Released."))
    async with (
        run_worker(agents=[agent]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-big")
        (call,) = (await chat.send("Release it.")).interrupts
        assert call.input == hidden
        page = await first_page(context)
        errors = page_errors(page)
        await page.goto(inbox_url(origin, agent))
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
        # Listed as a placeholder: not the input, and Approve is not offered for it.
        await expect(row.locator("td.input p.cut")).to_have_count(1)
        await expect(row.locator("td.input pre")).not_to_contain_text("mallory")
        approve = row.get_by_role("button", name=f"Approve release in {chat.id}")
        await expect(approve).to_be_disabled()
        await expect(row.get_by_role("button", name=f"Deny release in {chat.id}")).to_be_enabled()
        # Shown whole, it may be approved: the approval is of what is on the screen.
        await row.get_by_role(
            "button", name=f"Show the whole input of release in {chat.id}"
        ).click()
        await expect(row.locator("td.input pre")).to_have_text(
            json.dumps(hidden, indent=2, ensure_ascii=False)
        )
        await expect(approve).to_be_enabled()
        assert t.RUNS["release"] == 0
        answered = await click_and_answer(page, approve)
        assert answered.status == 200, await answered.text()
        await expect(page.locator("#results li")).to_contain_text("finished stop")
        assert not errors, errors
    assert t.RUNS["release"] == 1


# ----------------------------------------------------------------------------------------------
# What a person is shown, and the edit and respond forms.


class Payment(BaseModel):
    amount: float = Field(title="Amount")
    currency: str
    iban: str = Field(title="Payee IBAN")


paid: list[dict[str, Any]] = []
"""The input each run of ``sendPayment`` got."""


@tool(
    "sendPayment",
    "Send a payment.",
    editable=True,
    present=Present(
        summary="Pay {amount} {currency} to {iban}",
        fields=[
            Show(key="amount", label="Amount", format="money"),
            Show(key="iban", label="To", format="iban"),
        ],
        risk="high",
        risk_note="Money leaves the company's account.",
    ),
)
async def send_payment(payment: Payment) -> dict[str, bool]:
    paid.append(payment.model_dump(mode="json"))
    return {"sent": True}


class Decision(BaseModel):
    verdict: Literal["pay", "hold", "reject"]
    days: int = Field(title="Hold for days", ge=0)
    notify: bool = False
    note: str = ""
    tags: list[str] = []


review_payment = interrupt(
    "reviewPayment", "Ask treasury how to handle a payment.", input=Payment, output=Decision
)

PAY = {"amount": 7300, "currency": "EUR", "iban": "NL91 ABNA 0417 1643 00"}
ASKED = "Pay the supplier's invoice 42, please."
SAID = "I will pay invoice 42 now."


def posts_of(page: Page) -> list[str]:
    """The answers the page sends from now on (their URLs)."""
    sent: list[str] = []

    def record(request: Request) -> None:
        if request.method == "POST" and "/interrupts/" in request.url:
            sent.append(request.url)

    page.on("request", record)
    return sent


async def test_a_payment_reads_as_its_tool_presents_it_and_an_edit_runs_the_edited_input_once(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    paid.clear()
    # A ref no chat id can contain by chance ("pay-1" was inside "inbox-pay-1f3a…").
    pay_ref = "ref_q7x"
    agent = Agent(
        f"inbox-pay-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[send_payment],
        middleware=[ToolApproval(allow=[])],
    )
    model.reply(calls(("sendPayment", PAY, pay_ref), say=SAID), text("Paid."))
    edited = {"amount": 6500.5, "currency": "EUR", "iban": "DE89 3704 0044 0532 0130 00"}
    async with (
        run_worker(agents=[agent]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-pay")
        paused = await chat.send(ASKED, identity="alice@example.com")
        assert paused.finish_reason == FinishReason.INTERRUPTED, paused
        page = await first_page(context)
        errors = page_errors(page)
        posts = posts_of(page)
        await page.goto(inbox_url(origin, agent))
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)

        # The call reads as the tool presents it: the summary first, the risk and its note, why
        # it waits, who asked (asserted: no token), the user's request and the model's words.
        call = row.locator("td.tool")
        await expect(call.locator(".summary")).to_have_text("Pay 7,300.00 EUR to NL91 …00")
        await expect(call.locator(".risk")).to_have_text("high risk")
        await expect(call.locator(".risk-note")).to_have_text(
            " Money leaves the company's account."
        )
        await expect(call.locator(".why")).to_have_text("This needs your approval before it runs.")
        await expect(call.locator(".requester")).to_have_text(
            "Requested by alice@example.com (asserted, not verified)"
        )
        await expect(call.locator("blockquote.asked")).to_have_text(ASKED)
        await expect(call.locator("blockquote.said")).to_have_text(SAID)
        # The fields as labelled values; the gate's words and the raw JSON are not on show
        # (the JSON is behind "details", closed).
        fields = row.locator("td.input dl.fields")
        await expect(fields.locator("dt")).to_have_text(["Amount", "To"])
        await expect(fields.locator("dd")).to_have_text(["7,300.00", "NL91 ABNA 0417 1643 00"])
        await expect(row.locator("td.input .omitted")).to_have_text("1 more field in the input")
        await expect(row.locator("td.input details.raw pre")).to_be_hidden()
        shown_text = await row.inner_text()
        assert pay_ref not in shown_text  # no ref where the summary serves
        assert "null" not in shown_text and "undefined" not in shown_text
        assert "approved list" not in shown_text
        await expect(row.locator("td.votes .count")).to_have_text("0 / 1")
        await screenshot(page, tmp_path / "inbox-payment.png")

        # Edit: a form of the input (offered once the chat says the tool is editable), filled
        # with the call's input. An empty required field is refused here, and nothing is sent.
        await row.get_by_role("button", name=f"Edit the input of sendPayment in {chat.id}").click()
        form = row.locator("form.edit-form")
        amount = form.get_by_label("Amount")
        await expect(amount).to_have_value("7300")
        await expect(form.get_by_label("Currency")).to_have_value("EUR")
        run = form.get_by_role("button", name=f"Run sendPayment in {chat.id} with this input")
        await amount.fill("")
        await run.click()
        await expect(form.locator(".form-problem")).to_have_text(re.compile(r"^Amount.*required"))
        assert posts == [] and paid == []

        await amount.fill("6500.5")
        await form.locator("input").nth(2).fill(edited["iban"])
        answered = await click_and_answer(page, run)
        assert answered.status == 200, await answered.text()
        result = page.locator("#results li")
        await expect(result).to_contain_text("finished stop")
        await expect(result).to_contain_text("edit “Pay 7,300.00 EUR to NL91 …00” (sendPayment)")
        await expect(result.locator("q")).to_have_text("Paid.")
        await expect(row).to_have_count(0, timeout=UI_TIMEOUT_MS)
        assert not errors, errors

    # The tool ran once, with the edited input.
    assert paid == [edited]
    scheduled = scheduled_activities(await history(agents.temporal, chat.id))
    assert scheduled.count(TOOL_ACTIVITY) == 1, scheduled


async def test_a_respond_through_the_form_of_the_output_schema_answers_with_the_typed_output(
    browser: str, run_worker, model, tmp_path: Path
) -> None:
    agent = Agent(
        f"inbox-review-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[review_payment]
    )
    model.reply(calls(("reviewPayment", PAY, "review-1")), text("Held."))
    async with (
        run_worker(agents=[agent]) as agents,
        served(agents_app(agents, dev_loopback=True)) as origin,
        browser_context(browser, tmp_path / "profile") as context,
    ):
        chat = await agents.chat(agent.name, chat_id=f"{agent.name}-review")
        assert (await chat.send("Should we pay invoice 42?")).interrupts
        page = await first_page(context)
        errors = page_errors(page)
        posts = posts_of(page)
        await page.goto(inbox_url(origin, agent))
        row = row_of(page, chat.id)
        await expect(row).to_have_count(1, timeout=UI_TIMEOUT_MS)
        # An interrupt-only tool: why it waits is what the tool is for.
        await expect(row.locator("td.tool .why")).to_have_text(
            "Ask treasury how to handle a payment."
        )

        await row.get_by_role("button", name=f"Respond to reviewPayment in {chat.id}").click()
        form = row.locator("form.respond-form")
        # A control for each kind the schema names: an enum, an integer, a boolean, a string,
        # and a list as JSON.
        verdict = form.get_by_label("Verdict")
        await expect(verdict.locator("option")).to_have_text(["Choose…", "pay", "hold", "reject"])
        await verdict.select_option(label="hold")
        days = form.get_by_label("Hold for days")
        await expect(days).to_have_attribute("step", "1")
        await form.get_by_label("Notify").check()
        await form.get_by_label("Note").fill("after the audit <b>closes</b>")
        tags = form.get_by_label("Tags")
        await expect(tags).to_have_value("[]")
        send = form.get_by_role("button", name=f"Send the answer to reviewPayment in {chat.id}")

        # Refused here, before anything is sent: a fraction for an integer, then bad JSON.
        await days.fill("2.5")
        await send.click()
        await expect(form.locator(".form-problem")).to_have_text("Hold for days is a whole number")
        await days.fill("3")
        await tags.fill('["q3", ')
        await send.click()
        await expect(form.locator(".form-problem")).to_contain_text("Tags is not JSON")
        assert posts == []

        await tags.fill('["q3", "audit"]')
        answered = await click_and_answer(page, send)
        assert answered.status == 200, await answered.text()
        result = page.locator("#results li")
        await expect(result).to_contain_text("finished stop")
        await expect(result.locator("q")).to_have_text("Held.")
        assert not errors, errors

    # The model was told the output typed, as typed.
    (response,) = model.requests[-1].function_responses()
    assert response["response"] == {
        "verdict": "hold",
        "days": 3,
        "notify": True,
        "note": "after the audit <b>closes</b>",
        "tags": ["q3", "audit"],
    }

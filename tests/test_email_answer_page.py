"""An email's link opened in a real browser (Chromium): the answer view shows the call under its
Content-Security-Policy with nothing blocked, and its Deny button posts the denial, with its
reason, once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import expect

from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import tool_runs
from tests.browser import browser_context, first_page
from tests.helpers import assert_no_workflow_task_failed, eventually
from tests.test_email_links import KEY, channel, desk, link_of, smtp_server
from tests.test_inbox_page import page_errors
from tests.test_presentation import PAY
from tests.web import served

# The SMTP server is on loopback, where a password in the clear goes nowhere else.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")


async def test_the_answer_view_s_deny_button_posts_the_denial_once(
    browser: str, run_worker, model, client, tmp_path: Path
) -> None:
    agent = desk(["cfo@example.com"])
    reason = "not this month <b>please</b>"
    model.reply(calls(("sendPayment", PAY, "p1")), text("Not paid."))
    with smtp_server() as (box, port):
        mail = channel(port)
        requested: list[str] = []
        async with (
            run_worker(agents=[agent], channels={"mail": mail}) as agents,
            served(agents_app(agents, link_keys=[KEY])) as base,
            browser_context(browser, tmp_path / "profile", requested=requested) as context,
        ):
            mail.app_url = base
            chat = await agents.chat(agent.name)
            await chat.send("Pay the rent.")

            async def count() -> int:
                return len(box.messages)

            await eventually(count, lambda n: n == 1)
            link = link_of(box.messages[0])

            page = await first_page(context)
            errors = page_errors(page)
            await page.goto(link)
            await expect(page.locator("p.summary")).to_have_text("Pay 7,300.00 EUR to NL91 …00")
            await page.get_by_label("A reason, if you deny (optional)").fill(reason)
            await page.get_by_role("button", name="Deny").click()
            await expect(page.locator("h1")).to_have_text("Denied")
            await expect(page.locator("body")).to_contain_text("answers nothing more")
            assert not errors, errors
            # The page fetched nothing but itself, and posted to itself.
            assert set(requested) == {link}, requested

            (record,) = [r for r in (await chat.history()).answers if r.kind != "notified"]
            assert (record.decision, record.identity) == ("denied", "cfo@example.com")
            assert await tool_runs(chat) == {}

            (response,) = model.requests[-1].function_responses()
            assert response["response"]["reason"] == reason

            # Opened again: refused, saying who answered.
            await page.goto(link)
            await expect(page.locator("h1")).to_have_text("Already answered")
            await expect(page.locator("body")).to_contain_text(
                re.compile("denied by cfo@example.com")
            )
    await assert_no_workflow_task_failed(client, chat.id)

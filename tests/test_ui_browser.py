"""The operator's view in a real browser: the Temporal UI of a test dev server, in Chromium.

The other operator tests read the details panel's Markdown through the query the UI calls
(``tests.helpers.current_details``); this one opens the UI itself, as an operator does, and finds
a paused conversation's interrupt (name, ref, input) where the UI shows it: the workflow's
*User Metadata* tab, *Current Details*, which the UI renders from that Markdown in an iframe of
its own. The current details are the answer to a query, so a worker must be running while the
page loads, as one must for an operator.

The browser is Debian's ``chromium`` package, driven by ``playwright`` (a test extra) through
``executable_path``: no browser download. ``.ci/run`` installs the package. Without it the test
fails under CI (``CI`` set) and is skipped with the install command elsewhere, so that
``make test`` on a machine without Chromium still tells what it did not check (see the README's
"Tests").

Only loopback: the browser's background services are off (their connections would be refused
here anyway), and the page's requests to any other host (the UI asks for a news feed) are
aborted before they leave.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import FrameLocator, Page, Route, async_playwright, expect
from temporalio.testing import WorkflowEnvironment

from examples import banking_agent
from worker.standin import calls
from worker.testing import ScriptedModel, dev_server, hosted

DEBIAN_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ENV = "AGENT_TEST_CHROMIUM"
"""Another Chromium or Chrome binary to drive instead (macOS, say): its full path."""

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # the tests run as root in CI, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Chromium's own background traffic (updates, sync, safe browsing lists, metrics): none of
    # it may leave a machine whose only network is loopback.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

UI_TIMEOUT_MS = 45_000
"""How long the UI may take to show what is asked of it: the app loads its bundle, then asks
the server (and, for the details, a worker) before it draws anything."""

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def chromium() -> str:
    """The Chromium binary to drive, or a failure (under CI) or skip saying how to install it."""
    chosen = os.environ.get(CHROMIUM_ENV, "").strip()
    if chosen:
        if not os.access(chosen, os.X_OK):
            pytest.fail(f"{CHROMIUM_ENV}={chosen} is not an executable file")
        return chosen
    found = DEBIAN_CHROMIUM if os.access(DEBIAN_CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found:
        return found
    message = (
        f"no Chromium at {DEBIAN_CHROMIUM}: the Temporal UI test drives Debian's chromium "
        f"package (install it with `sudo apt-get install -y chromium`, as .ci/run does), or "
        f"set {CHROMIUM_ENV} to a Chromium or Chrome binary"
    )
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(message)
    pytest.skip(message + " (under CI this fails)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def browser_page(profile: Path) -> AsyncIterator[Page]:
    """A page in headless Chromium with a fresh profile, whose requests stay on loopback."""
    executable = chromium()

    async def loopback_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            await context.route("**/*", loopback_only)
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            yield page
        finally:
            await context.close()


async def open_current_details(page: Page, *, ui_port: int, workflow_id: str) -> FrameLocator:
    """Open a workflow in the UI and its *Current Details*: the frame that renders them."""
    await page.goto(f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{workflow_id}")
    # The workflow's page opens on its timeline; the details are under "User Metadata".
    await page.get_by_role("tab", name="User Metadata").click()
    return page.frame_locator("#user-metadata-current-details")


async def screenshot(page: Page, path: Path) -> None:
    await page.screenshot(path=path, full_page=True)
    print(f"screenshot of the Temporal UI: {path}")


@pytest.fixture(scope="module")
async def ui_server() -> AsyncIterator[tuple[WorkflowEnvironment, int]]:
    """A dev server of this module's own, with its UI (the session's server is headless)."""
    port = free_port()
    async with dev_server(ui_port=port) as environment:
        yield environment, port


async def test_the_ui_shows_a_paused_conversations_interrupt_in_its_current_details(
    ui_server: tuple[WorkflowEnvironment, int], tmp_path: Path
) -> None:
    env, ui_port = ui_server
    ask = {"action": "transfer $512.34 to savings-7f3a", "details": "rent for March"}
    model = ScriptedModel([calls(("userApproval", ask, "approval-ref-7f3a"))])
    async with hosted(env.client, agents=[banking_agent], model=model) as agents:
        chat = await agents.chat("bankingAgent", chat_id="ui-browser-paused")
        res = await chat.send("Transfer $512.34 to savings-7f3a, for the rent.")
        (interrupt,) = res.interrupts
        assert (interrupt.name, interrupt.ref, interrupt.input) == (
            "userApproval",
            "approval-ref-7f3a",
            ask,
        )

        async with browser_page(tmp_path / "chromium-profile") as page:
            try:
                details = await open_current_details(page, ui_port=ui_port, workflow_id=chat.id)
                # The pending interrupt's heading names the tool and the ref; its list, the input
                # as the JSON the model sent. Each waits (bounded) for the UI to draw it.
                await expect(
                    details.get_by_role("heading", name=re.compile("^Waiting on"))
                ).to_have_text(
                    re.compile(rf"^Waiting on {interrupt.name} \(ref {interrupt.ref}\) since ")
                )
                await expect(
                    details.get_by_role("listitem").filter(has_text=re.compile("^input:"))
                ).to_have_text(f"input: {json.dumps(interrupt.input)}")
                # And the command that answers it, for this conversation.
                await expect(
                    details.locator("code", has_text="temporal workflow signal")
                ).to_contain_text(f"--workflow-id {chat.id} --name resume")
            finally:
                await screenshot(page, tmp_path / "current-details.png")


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_without_chromium_ci_fails_and_elsewhere_the_skip_says_how_to_install_it(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(f"{__name__}.DEBIAN_CHROMIUM", str(tmp_path / "chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"apt-get install -y chromium"):
        chromium()

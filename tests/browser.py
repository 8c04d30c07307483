"""Headless Chromium for the browser tests (the Temporal UI, the inbox page), on loopback only.

The browser is Debian's ``chromium`` package, driven by ``playwright`` (a test extra) through
``executable_path``: no browser download. ``make test`` installs the package when it is missing
(``scripts/install-chromium``). Without it (a bare ``pytest`` on a machine with no Chromium) the
browser tests fail, saying how to install it: a missing browser never passes for a checked page.
Only ``AGENT_TEST_SKIP_BROWSER=1``, set by whoever runs the suite, skips them instead (see the
README's "Tests"). The ``browser`` fixture (conftest) finds it before any server starts.

Only loopback: the browser's background services are off (their connections would be refused
here anyway), and a page's requests to any other host (the Temporal UI asks for a news feed) are
aborted before they leave.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import BrowserContext, Page, Request, Route, async_playwright

DEBIAN_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ENV = "AGENT_TEST_CHROMIUM"
"""Another Chromium or Chrome binary to drive instead (macOS, say): its full path."""
SKIP_ENV = "AGENT_TEST_SKIP_BROWSER"

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
"""How long a page may take to show what is asked of it (playwright's own default for an
``expect`` is 5 s): the Temporal UI loads its bundle, then asks the server (and, for the details,
a worker, and with keys the codec server) before it draws anything. Measured here: about 2 s.
The inbox page polls a listing that lags visibility by about a second."""

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def chromium() -> str:
    """The Chromium binary to drive, or a failure saying how to install it (a skip only when
    the person running the suite asked for one)."""
    chosen = os.environ.get(CHROMIUM_ENV, "").strip()
    if chosen:
        if not os.access(chosen, os.X_OK):
            pytest.fail(f"{CHROMIUM_ENV}={chosen} is not an executable file")
        return chosen
    found = DEBIAN_CHROMIUM if os.access(DEBIAN_CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found:
        return found
    message = (
        f"no Chromium at {DEBIAN_CHROMIUM}: the browser tests drive Debian's chromium "
        f"package (install it with `sudo apt-get install -y chromium`, as `make test` does), or "
        f"set {CHROMIUM_ENV} to a Chromium or Chrome binary"
    )
    # Failing is the default: whether a run "is CI" cannot be told reliably (.ci/run sets no
    # variable), and a skip nobody asked for would let an unchecked UI pass.
    if os.environ.get(SKIP_ENV, "").strip() == "1":
        pytest.skip(f"{message} (skipped: {SKIP_ENV}=1)")
    pytest.fail(f"{message}; or set {SKIP_ENV}=1 to skip the browser tests knowingly")


@asynccontextmanager
async def browser_context(
    executable: str, profile: Path, *, requested: list[str] | None = None
) -> AsyncIterator[BrowserContext]:
    """Headless Chromium with a fresh profile, whose pages' requests stay on loopback.

    Args:
        requested: Filled with the URL of every request any of its pages makes, whether it was
            let through or aborted (and whatever a page's own route did with it).
    """

    async def loopback_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    def record(request: Request) -> None:
        if requested is not None:
            requested.append(request.url)

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            context.on("request", record)
            await context.route("**/*", loopback_only)
            context.set_default_timeout(UI_TIMEOUT_MS)
            yield context
        finally:
            await context.close()


async def first_page(context: BrowserContext) -> Page:
    """The page a persistent context opens with (or a new one)."""
    return context.pages[0] if context.pages else await context.new_page()


@asynccontextmanager
async def browser_page(executable: str, profile: Path) -> AsyncIterator[Page]:
    """A page in headless Chromium with a fresh profile, whose requests stay on loopback."""
    async with browser_context(executable, profile) as context:
        yield await first_page(context)

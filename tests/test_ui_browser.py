"""The operator's view in a real browser: the Temporal UI of a test dev server, in Chromium.

The other operator tests read the details panel's Markdown through the query the UI calls
(``tests.helpers.current_details``); this one opens the UI itself, as an operator does, and finds
a paused conversation's interrupt (name, ref, input) where the UI shows it: the workflow's
*User Metadata* tab, *Current Details*, which the UI renders from that Markdown in an iframe of
its own. The current details are the answer to a query, so a worker must be running while the
page loads, as one must for an operator.

With payload keys set, everything the UI reads of a conversation reaches the browser encrypted,
the current details included (the query's answer is a payload, and the worker's codec encrypts
it). The second test starts ``agent-codec-server`` and the dev server with
``--ui-codec-endpoint``, and checks that the page shows the interrupt in the current details and
the memo because the browser had the codec server decode them.

The browser is Debian's ``chromium`` package, on loopback only (``tests.browser``): without it
the browser tests fail, saying how to install it, unless ``AGENT_TEST_SKIP_BROWSER=1`` asks for a
skip (the last test here checks both).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import FrameLocator, Page, Response, expect
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.testing import WorkflowEnvironment

from examples import banking_agent
from temporal_agent_interrupts import Chat
from temporal_agent_interrupts.codec import ENCODING, generate_key
from temporal_agent_interrupts.codec import ENV_VAR as PAYLOAD_KEYS_ENV
from temporal_agent_interrupts.worker.devserver import port_open
from temporal_agent_interrupts.worker.standin import calls
from temporal_agent_interrupts.worker.testing import ScriptedModel, dev_server, hosted
from temporal_agent_interrupts.workflows.types import InterruptRequest
from tests import browser as browser_module
from tests.browser import CHROMIUM_ENV, SKIP_ENV, UI_TIMEOUT_MS, browser_page, chromium
from tests.helpers import free_port

ASK = {"action": "transfer $512.34 to savings-7f3a", "details": "rent for March"}
"""What the scripted model asks a human to approve."""


async def open_current_details(page: Page, *, ui_port: int, workflow_id: str) -> FrameLocator:
    """Open a workflow in the UI and its *Current Details*: the frame that renders them."""
    await page.goto(f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{workflow_id}")
    # The workflow's page opens on its timeline; the details are under "User Metadata".
    await page.get_by_role("tab", name="User Metadata").click()
    return page.frame_locator("#user-metadata-current-details")


async def screenshot(page: Page, path: Path) -> None:
    await page.screenshot(path=path, full_page=True)
    print(f"screenshot of the Temporal UI: {path}")


@asynccontextmanager
async def paused_transfer(
    env: WorkflowEnvironment, chat_id: str
) -> AsyncIterator[tuple[Chat, InterruptRequest]]:
    """A banking conversation paused on ``userApproval``, with a worker serving it (the UI's
    current details are a query) until the block ends."""
    model = ScriptedModel([calls(("userApproval", ASK, "approval-ref-7f3a"))])
    async with hosted(env.client, agents=[banking_agent], model=model) as agents:
        chat = await agents.chat("bankingAgent", chat_id=chat_id)
        res = await chat.send("Transfer $512.34 to savings-7f3a, for the rent.")
        (interrupt,) = res.interrupts
        assert (interrupt.name, interrupt.ref, interrupt.input) == (
            "userApproval",
            "approval-ref-7f3a",
            ASK,
        )
        yield chat, interrupt


async def expect_interrupt(
    details: FrameLocator, interrupt: InterruptRequest, chat_id: str
) -> None:
    """The current details show the pending interrupt: its heading names the tool and the ref;
    its list, the input as the JSON the model sent, and the command that answers it. Each
    waits (bounded) for the UI to draw it."""
    heading = details.get_by_role("heading", name=re.compile("^Waiting on"))
    await expect(heading).to_have_text(
        re.compile(
            rf"^Waiting on {re.escape(interrupt.name)} \(ref {re.escape(interrupt.ref)}\) since "
        ),
        timeout=UI_TIMEOUT_MS,
    )
    inputs = details.get_by_role("listitem").filter(has_text=re.compile("^input:"))
    await expect(inputs).to_have_text(
        f"input: {json.dumps(interrupt.input)}", timeout=UI_TIMEOUT_MS
    )
    command = details.locator("code", has_text="temporal workflow signal")
    await expect(command).to_contain_text(
        f"--workflow-id {chat_id} --name resume", timeout=UI_TIMEOUT_MS
    )


async def test_the_ui_shows_a_paused_conversations_interrupt_in_its_current_details(
    browser: str,
    tmp_path: Path,
) -> None:
    ui_port = free_port()
    async with (
        dev_server(ui_port=ui_port) as env,
        paused_transfer(env, "ui-browser-paused") as (chat, interrupt),
        browser_page(browser, tmp_path / "chromium-profile") as page,
    ):
        try:
            details = await open_current_details(page, ui_port=ui_port, workflow_id=chat.id)
            await expect_interrupt(details, interrupt, chat.id)
        finally:
            await screenshot(page, tmp_path / "current-details.png")


@asynccontextmanager
async def codec_server(keys: str, *, cors_origin: str, log: Path) -> AsyncIterator[str]:
    """``agent-codec-server`` as an operator runs it (data-protection.md's command: the
    installed script, not the module), in a process of its own; its URL."""
    port = free_port()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "agent-codec-server"),
            "--port",
            str(port),
            "--cors-origin",
            cors_origin,
            env={**os.environ, PAYLOAD_KEYS_ENV: keys},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not port_open(port):
            if proc.returncode is not None or loop.time() > deadline:
                pytest.fail(f"the codec server did not listen on {port}: {log.read_text()}")
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)


async def test_with_keys_the_ui_reads_the_interrupt_through_the_codec_server(
    browser: str,
    tmp_path: Path,
) -> None:
    keys = generate_key("ui-test")
    ui_port = free_port()
    ui_origin = f"http://127.0.0.1:{ui_port}"
    async with (
        codec_server(keys, cors_origin=ui_origin, log=tmp_path / "codec.log") as codec,
        dev_server(
            ui_port=ui_port, payload_keys=keys, extra_args=["--ui-codec-endpoint", codec]
        ) as env,
        paused_transfer(env, "ui-browser-encrypted") as (chat, interrupt),
        browser_page(browser, tmp_path / "chromium-profile") as page,
    ):
        # Stored encrypted: the memo as the server holds it (no codec on this path).
        raw = await env.client.workflow_service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(
                namespace=env.client.namespace,
                execution=WorkflowExecution(workflow_id=chat.id),
            )
        )
        stored = raw.workflow_execution_info.memo.fields["pending"]
        assert stored.metadata["encoding"] == ENCODING
        assert b"savings-7f3a" not in stored.data and interrupt.ref.encode() not in stored.data

        responses: list[Response] = []
        page.on("response", lambda r: responses.append(r))
        try:
            async with page.expect_request(
                lambda r: r.url.startswith(f"{codec}/decode"), timeout=UI_TIMEOUT_MS
            ) as first_decode:
                details = await open_current_details(page, ui_port=ui_port, workflow_id=chat.id)
            # Said at once, rather than as a timeout on what the page would have shown (the UI
            # itself only says "Codec Server could not connect").
            request = await first_decode.value
            response = await request.response()
            assert response is not None and response.ok, (
                f"the UI's call to the codec server failed: {request.method} {request.url}: "
                f"{request.failure if response is None else response.status} "
                f"(the codec server's log: {(tmp_path / 'codec.log').read_text()!r})"
            )
            await expect_interrupt(details, interrupt, chat.id)
            await screenshot(page, tmp_path / "encrypted-current-details.png")
            # The memo, decoded the same way: the pending list the inbox reads, its input an
            # object (each of its fields a line of its own).
            await page.get_by_role("tab", name="Memo").click()
            for line in (
                f'"name": "{interrupt.name}"',
                f'"ref": "{interrupt.ref}"',
                *(f'"{key}": {json.dumps(value)}' for key, value in interrupt.input.items()),
            ):
                await expect(page.get_by_text(line)).to_be_visible(timeout=UI_TIMEOUT_MS)
        finally:
            await screenshot(page, tmp_path / "encrypted-memo.png")

        # The current details reached the browser encrypted (the answer to the UI's query),
        # and the page shows them because the codec server decoded them.
        queried = [r for r in responses if "/query/__temporal_workflow_metadata" in r.url]
        assert queried, [r.url for r in responses]
        answer = await queried[0].text()
        assert base64.b64encode(ENCODING).decode() in answer
        assert "savings-7f3a" not in answer and interrupt.ref not in answer
        decodes = [r for r in responses if urlsplit(r.url).path == "/decode"]
        assert decodes and all(r.url.startswith(codec) and r.ok for r in decodes), [
            (r.url, r.status) for r in decodes
        ]


@pytest.mark.parametrize(
    ("skip", "outcome"),
    [("", pytest.fail.Exception), ("0", pytest.fail.Exception), ("1", pytest.skip.Exception)],
)
def test_without_chromium_the_tests_fail_unless_a_skip_is_asked_for_and_say_how_to_install_it(
    skip: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser_module, "DEBIAN_CHROMIUM", str(tmp_path / "chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    monkeypatch.setenv("CI", "")  # no longer consulted: without Chromium, CI or not, it fails
    monkeypatch.setenv(SKIP_ENV, skip)
    with pytest.raises(outcome, match=r"apt-get install -y chromium"):
        chromium()

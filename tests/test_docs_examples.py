"""Blocks of the docs pages that no other test runs, run as printed.

``treasury.py`` (Approval governance) is imported from a folder holding it and a JWK Set, as the
page says, and its agent then does what the page claims of it: a wire waits for two treasury
approvers whose tokens the workflow verifies, a token naming someone else is refused, and the
call settles only on the second distinct approval.

``payments_shown.py`` (the same page's "What the approver reads") pauses on a payment that reads
as the page says: its summary, its fields and its risk.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from temporal_agent_interrupts import FinishReason, approve
from temporal_agent_interrupts.errors import ResumeRejected
from temporal_agent_interrupts.worker.testing import (
    ScriptedModel,
    TokenIssuer,
    calls,
    hosted,
    text,
    tool_runs,
)
from tests.docs import block


def load(folder: Path, name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``source`` imported as module ``name`` from ``folder``, as the author's code is."""
    (folder / f"{name}.py").write_text(source)
    monkeypatch.chdir(folder)  # open("jwks.json") is relative to where it runs
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


async def test_the_governance_pages_treasury_agent_takes_two_verified_approvals(
    client, tmp_path, monkeypatch
):
    idp = TokenIssuer("ES256", issuer="https://login.example.com", audience="agent-approvals")
    (tmp_path / "jwks.json").write_text(json.dumps(idp.jwks()))
    source = block(
        "# treasury.py: with your identity provider's JWK Set saved as jwks.json beside it",
        lang="python",
    )
    treasury = load(tmp_path, "treasury", source, monkeypatch)
    (agent,) = treasury.ALL_AGENTS
    assert agent.name == "treasuryAgent"

    model = ScriptedModel(
        [calls(("wireApproval", {"amount": 25000, "to_iban": "DE89"})), text("Wire sent.")]
    )
    async with hosted(client, agents=[agent], model=model) as agents:
        chat = await agents.chat("treasuryAgent")
        res = await chat.send("Wire 25,000 to DE89.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        (ask,) = res.interrupts
        assert (ask.name, ask.quorum) == ("wireApproval", 2)
        assert set(ask.approvers) == {"group:treasury", "cfo@example.com"}

        outsider = idp.mint("mallory@example.com", groups=["marketing"])
        with pytest.raises(ResumeRejected):
            await chat.resume(answers=[approve(ask)], identity_token=outsider)

        first = idp.mint("ann@example.com", groups=["treasury"])
        voted = await chat.resume(answers=[approve(ask)], identity_token=first)
        assert voted.finish_reason == FinishReason.INTERRUPTED  # one vote of two
        (still,) = await chat.pending()
        assert [v.identity for v in still.votes] == ["ann@example.com"]

        second = idp.mint("cfo@example.com")
        done = await chat.resume(answers=[approve(still)], identity_token=second)
        assert done.finish_reason == FinishReason.STOP and done.text == "Wire sent."
        # An interrupt-only tool: the approvals are its output, and nothing ran.
        assert await tool_runs(chat) == {}
        assert model.requests[-1].function_responses()[0]["response"]["approved"] is True


async def test_the_governance_pages_payment_reads_as_the_page_says(client, tmp_path, monkeypatch):
    payments = load(
        tmp_path, "payments_shown", block("# payments_shown.py", lang="python"), monkeypatch
    )
    pay = {"amount": 7300, "currency": "EUR", "iban": "NL91 ABNA 0417 1643 00"}
    model = ScriptedModel([calls(("sendPayment", pay), say="Paying invoice 42."), text("Paid.")])
    async with hosted(client, agents=[payments.payer], model=model) as agents:
        chat = await agents.chat("payer")
        paused = await chat.send("Pay invoice 42.")
        assert paused.finish_reason == FinishReason.INTERRUPTED
        (call,) = paused.interrupts
        shown = call.shown
        assert shown is not None
        assert shown.summary == "Pay 7,300.00 EUR to NL91 …00"
        assert [(f.label, f.value) for f in shown.fields] == [
            ("Amount", "7,300.00"),
            ("To", "NL91 ABNA 0417 1643 00"),
        ]
        assert (shown.risk, shown.risk_note) == ("high", "Money leaves the company's account.")
        assert (shown.asked, shown.said) == ("Pay invoice 42.", "Paying invoice 42.")
        assert "approved list" not in shown.why
        done = await chat.resume(answers=[approve(call)])
        assert done.finish_reason == FinishReason.STOP and done.text == "Paid."

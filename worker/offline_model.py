"""The offline Gemini stand-in's rules: enough of a model to drive the example agents.

This is not a language model. It reads the conversation it is sent and follows fixed rules:

- a message asking to transfer/send/pay money (``Transfer $500 to savings``) calls
  ``userApproval``; an approval then calls ``transferMoney``; a denial ends the turn;
- ``deploy <service> [to <env>]`` calls ``deploy``;
- ``run <command>`` (or a command in backticks) calls ``run_shell``;
- a tool result is summarised in one sentence;
- anything else gets a reply that says what the stand-in can do.

It only calls tools the agent declared. Set ``GEMINI_API_KEY`` to use the real model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.standin import Request, calls, text

BANNER = "[offline stand-in model]"

_TRANSFER = re.compile(
    r"\b(?:transfer|send|pay|move|wire)\b.*?\$?\s*(?P<amount>\d+(?:[.,]\d+)?)"
    r"(?:\s*(?:dollars|usd|\$))?(?:.*?\bto\s+(?:my\s+|the\s+)?(?P<to>[\w-]+))?",
    re.IGNORECASE,
)
_DEPLOY = re.compile(
    r"\bdeploy\s+(?:the\s+)?(?P<service>[\w.-]+)?(?:.*?\bto\s+(?P<env>[\w-]+))?", re.IGNORECASE
)
_TICKS = re.compile(r"`(?P<cmd>[^`]+)`")
_RUN = re.compile(r"\b(?:run|execute)\s+(?P<cmd>.+)$", re.IGNORECASE)
_STATUS = re.compile(r"\bstatus\s+(?:of\s+)?(?P<service>[\w.-]+)", re.IGNORECASE)


def respond(request: Request) -> dict[str, Any]:
    """The stand-in's reply to one ``generateContent`` request."""
    tools = set(request.tool_names())
    last = request.last_parts
    # After a cancelled or cut-short turn the next message shares a content with the tool
    # responses; new text from the user always starts a new step.
    if any("text" in p for p in last):
        return _first_step(" ".join(p["text"] for p in last if "text" in p), tools)
    responses = request.function_responses()
    if responses:
        return _after_tools(responses, tools, request)
    return _first_step(_last_user_text(request), tools)


def _first_step(user: str, tools: set[str]) -> dict[str, Any]:
    if (m := _TRANSFER.search(user)) and {"userApproval", "transferMoney"} & tools:
        amount = float(m["amount"].replace(",", "."))
        to = m["to"] or "savings"
        if "userApproval" in tools:
            return calls(
                (
                    "userApproval",
                    {"action": "transferMoney", "details": f"Transfer ${amount:.2f} to {to}"},
                ),
                say="I need your approval before moving money.",
            )
        return calls(("transferMoney", {"amount": amount, "to_account": to}))
    if (m := _STATUS.search(user)) and "deployStatus" in tools:
        return calls(("deployStatus", {"service": m["service"]}))
    if (m := _DEPLOY.search(user)) and "deploy" in tools:
        args = {"service": m["service"] or "web", "environment": m["env"] or "production"}
        return calls(("deploy", args))
    if (m := _TICKS.search(user) or _RUN.search(user)) and "run_shell" in tools:
        command = m["cmd"].strip().rstrip(".")
        return calls(("run_shell", {"command": command}))
    return text(
        f"{BANNER} I follow fixed rules: I can transfer money ('Transfer $500 to savings'), "
        "deploy a service ('Deploy web to production') or run a command ('Run `ls`'). "
        "Set GEMINI_API_KEY to talk to Gemini."
    )


def _after_tools(
    responses: list[dict[str, Any]], tools: set[str], request: Request
) -> dict[str, Any]:
    summaries = []
    for r in responses:
        name, out = r.get("name", ""), r.get("response", {}) or {}
        if "error" in out:
            summaries.append(f"{name} did not complete: {out['error']}")
            continue
        if name == "userApproval":
            if out.get("approved") is True and "transferMoney" in tools:
                args = _pending_transfer(request)
                if args is not None:
                    return calls(("transferMoney", args))
            feedback = f" ({out['feedback']})" if out.get("feedback") else ""
            summaries.append(f"The transfer was not approved{feedback}, so nothing was moved.")
        elif name == "transferMoney":
            summaries.append(
                f"Done: transferred ${out.get('amount', 0):.2f} to {out.get('to_account')} "
                f"(transaction {out.get('transaction_id')})."
            )
        elif name == "deploy":
            summaries.append(
                f"Deployed {out.get('service')} {out.get('version')} to "
                f"{out.get('environment')} (deployment {out.get('deployment_id')})."
            )
        elif name == "run_shell":
            output = (out.get("stdout") or out.get("stderr") or "").strip()
            summaries.append(
                f"`{out.get('command')}` exited with {out.get('exit_code')}:\n{output[:500]}"
            )
        else:
            summaries.append(f"{name} returned {json.dumps(out)[:300]}")
    return text(f"{BANNER} " + " ".join(summaries))


def _pending_transfer(request: Request) -> dict[str, Any] | None:
    """The transfer the user asked for, from the userApproval call's details."""
    for content in reversed(request.contents):
        for part in content.get("parts", []):
            fc = part.get("functionCall")
            if fc and fc.get("name") == "userApproval":
                details = (fc.get("args") or {}).get("details", "")
                if m := _TRANSFER.search(details):
                    return {
                        "amount": float(m["amount"].replace(",", ".")),
                        "to_account": m["to"] or "savings",
                    }
    return None


def _last_user_text(request: Request) -> str:
    for content in reversed(request.contents):
        if content.get("role", "user") == "user":
            texts = [p["text"] for p in content.get("parts", []) if "text" in p]
            if texts:
                return " ".join(texts)
    return ""

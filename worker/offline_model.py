"""The offline Gemini stand-in's rules: enough of a model to drive any agent without a key.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

This is not a language model. It reads the conversation it is sent and follows fixed rules:

- ``call TOOL {"field": "value"}`` calls any tool the agent declared with that input, and
  ``call TOOL`` alone with an example input made from the tool's JSON schema
  (:func:`workflows.details.example_value`); several ``call`` commands in one message call the
  tools together;
- for the example agents: a message asking to transfer/send/pay money
  (``Transfer $500 to savings``) calls ``userApproval``, and an approval then calls
  ``transferMoney``; ``deploy <service> [to <env>]`` calls ``deploy``; ``run <command>`` (or a
  command in backticks) calls ``run_shell``;
- after the tools answer, it names each tool and shows its output (or its error);
- a message that asks for a JSON answer of a schema (a sub-agent of ``agent_tool(output=...)``)
  gets one: the schema's example value, with the fields a tool's output shares with it filled
  from that output;
- anything else gets a reply listing the agent's own tools and the ``call`` syntax.

It only calls tools the agent declared. Set ``GEMINI_API_KEY`` to use the real model.

:func:`streaming` is what the embedded default serves: the same replies, streamed as Gemini
streams them, a few words per chunk (so a streamed turn shows its text arriving).
"""

from __future__ import annotations

import json
import re
from typing import Any

from temporal_agent_interrupts.worker.standin import Reply, Request, calls, text
from temporal_agent_interrupts.workflows.details import example_value
from temporal_agent_interrupts.workflows.subagents import OUTPUT_REQUEST
from temporal_agent_interrupts.workflows.types import APPROVED, FEEDBACK

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
_CALL = re.compile(r"call\s+(?P<name>[A-Za-z_][\w.:-]*)\s*", re.IGNORECASE)
_JSON = json.JSONDecoder()
# How much of a tool's output the summary shows: enough to read, short enough for a terminal.
SHOWN_OUTPUT_CHARS = 1000


class CallSyntaxError(ValueError):
    """A ``call`` message the stand-in cannot read; the message says how to fix it."""


def parse_calls(message: str) -> list[tuple[str, dict[str, Any] | None]] | None:
    """The ``call TOOL [{json}]`` commands in a message, in order; None if it holds none.

    Raises:
        CallSyntaxError: the message starts with ``call`` but does not follow the syntax.
    """
    rest = message.strip()
    if not _CALL.match(rest):
        return None
    found: list[tuple[str, dict[str, Any] | None]] = []
    while rest:
        m = _CALL.match(rest)
        if m is None:
            raise CallSyntaxError(f"Expected `call TOOL` where the message says {rest[:40]!r}")
        name, rest = m["name"].rstrip(".,;"), rest[m.end() :]
        args: dict[str, Any] | None = None
        if rest.startswith("{"):
            try:
                value, end = _JSON.raw_decode(rest)
            except ValueError as e:
                raise CallSyntaxError(f"The input for {name} is not valid JSON: {e}") from None
            if not isinstance(value, dict):
                raise CallSyntaxError(f"The input for {name} must be a JSON object")
            args, rest = value, rest[end:]
        rest = rest.lstrip().lstrip(".,;").lstrip()
        if rest[:4].lower() == "and ":
            rest = rest[4:].lstrip()
        found.append((name, args))
    return found


STREAM_INTERVAL = 0.04
"""Seconds between the chunks of a streamed reply."""


def streaming(request: Request) -> Reply | dict[str, Any]:
    """:func:`respond`, its text streamed in chunks of about four words."""
    reply = respond(request)
    parts = reply["candidates"][0]["content"]["parts"]
    words = sum(len(p.get("text", "").split()) for p in parts)
    if words < 8:
        return reply
    return Reply.streamed(reply, pieces=min(12, words // 4), interval=STREAM_INTERVAL)


def respond(request: Request) -> dict[str, Any]:
    """The stand-in's reply to one ``generateContent`` request."""
    last = request.last_parts
    # After a cancelled or cut-short turn the next message shares a content with the tool
    # responses; new text from the user always starts a new step.
    if any("text" in p for p in last):
        return _first_step(" ".join(p["text"] for p in last if "text" in p), request)
    responses = request.function_responses()
    if responses:
        _, schema = _output_request(request.user_text())
        if schema is not None:
            return text(json.dumps(_filled(schema, responses), ensure_ascii=False))
        return _after_tools(responses, request)
    return _first_step(request.user_text(), request)


def _output_request(user: str) -> tuple[str, dict[str, Any] | None]:
    """A message's task and the JSON Schema it asks the answer to fit (None: it asks none)."""
    task, marker, schema = user.partition(OUTPUT_REQUEST.strip())
    if not marker:
        return user, None
    try:
        found = json.loads(schema)
    except ValueError:
        return task.strip(), None
    return task.strip(), found if isinstance(found, dict) else None


def _filled(schema: dict[str, Any], responses: list[dict[str, Any]]) -> Any:
    """The schema's example value, its top-level fields taken from the tools' outputs where
    they share a name (the last tool's output wins)."""
    value = example_value(schema)
    if not isinstance(value, dict):
        return value
    properties = schema.get("properties") or {}
    for r in responses:
        out = r.get("response") or {}
        for key in properties:
            if key in out:
                value[key] = out[key]
    return value


def _first_step(user: str, request: Request) -> dict[str, Any]:
    user, schema = _output_request(user)
    tools = request.tool_names()
    if schema is not None and not _CALL.match(user.strip()):
        return text(json.dumps(example_value(schema), ensure_ascii=False))
    first = _CALL.match(user.strip())
    name = first["name"].rstrip(".,;") if first else None
    if name not in tools:
        # Not a call of a declared tool ("Call savings and transfer $500", "call me back"):
        # the example rules come first, then the help.
        if found := _example_rules(user, set(tools)):
            return found
        if name is None:
            return text(_introduction(tools))
        return text(f"{BANNER} This agent has no tool named {name!r}. {_syntax(tools)}")
    try:
        commands = parse_calls(user)
    except CallSyntaxError as e:
        return text(f"{BANNER} {e}. {_syntax(tools)}")
    assert commands is not None  # it starts with `call`
    return _call(commands, request)


def _call(commands: list[tuple[str, dict[str, Any] | None]], request: Request) -> dict[str, Any]:
    tools = request.tool_names()
    unknown = [name for name, _ in commands if name not in tools]
    if unknown:
        return text(f"{BANNER} This agent has no tool named {unknown[0]!r}. {_syntax(tools)}")
    chosen = [
        (name, args if args is not None else example_value(request.tool_schema(name)))
        for name, args in commands
    ]
    return calls(*chosen, say=f"{BANNER} Calling {', '.join(n for n, _ in chosen)}.")


def _syntax(tools: list[str]) -> str:
    if not tools:
        return "This agent declares no tools."
    return (
        f'This agent\'s tools: {", ".join(tools)}. Call one with `call TOOL {{"field": '
        f'"value"}}`, or `call TOOL` alone for an example input made from its schema '
        f"(`call {tools[0]}`)."
    )


def _introduction(tools: list[str]) -> str:
    examples = [
        (("userApproval", "transferMoney"), "transfer money ('Transfer $500 to savings')"),
        (("deploy",), "deploy a service ('Deploy web to production')"),
        (("run_shell",), "run a command ('Run `ls`')"),
    ]
    can = [words for names, words in examples if set(names) & set(tools)]
    rules = f" I also know how to {' or '.join(can)}." if can else ""
    return (
        f"{BANNER} I am not Gemini but a stand-in that follows fixed rules. {_syntax(tools)}"
        f"{rules} Set GEMINI_API_KEY to talk to Gemini."
    )


def _example_rules(user: str, tools: set[str]) -> dict[str, Any] | None:
    """The example agents' rules: a reply, or None when none applies."""
    if (m := _TRANSFER.search(user)) and {"userApproval", "transferMoney"} & tools:
        amount = float(m["amount"].replace(",", "."))
        to = m["to"] or "savings"
        if "userApproval" in tools:
            return calls(
                (
                    "userApproval",
                    {"action": "transferMoney", "details": f"Transfer ${amount:.2f} to {to}"},
                ),
                say=f"{BANNER} I need your approval before moving money.",
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
    return None


def _after_tools(responses: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    tools = set(request.tool_names())
    # A turn the user started with `call` gets plain summaries: the example agents' follow-ups
    # (an approved userApproval goes on to transferMoney) belong to their own rules.
    if _quietly_parsed(request.user_text()) is not None:
        return text(f"{BANNER} {summary(responses)}")
    summaries = []
    for r in responses:
        name, out = r.get("name", ""), r.get("response", {}) or {}
        if "error" in out:
            summaries.append(_said(name, out))
            continue
        if name == "userApproval" and APPROVED in out:
            if out.get(APPROVED) is True and "transferMoney" in tools:
                args = _pending_transfer(request)
                if args is not None:
                    return calls(("transferMoney", args))
            feedback = f" ({out[FEEDBACK]})" if out.get(FEEDBACK) else ""
            summaries.append(f"The transfer was not approved{feedback}, so nothing was moved.")
        else:
            summaries.append(_example_summary(name, out) or _said(name, out))
    return text(f"{BANNER} " + " ".join(summaries))


def summary(responses: list[dict[str, Any]]) -> str:
    """Each tool named with what it returned (its output, or its error), in call order."""
    return " ".join(_said(r.get("name", ""), r.get("response") or {}) for r in responses)


def _said(name: str, out: dict[str, Any]) -> str:
    if "error" not in out:
        return f"{name} returned {_shown(out)}."
    rest = {k: v for k, v in out.items() if k != "error"}
    return f"{name} did not complete: {out['error']}" + (f" {_shown(rest)}." if rest else ".")


def _example_summary(name: str, out: dict[str, Any]) -> str | None:
    """The example tools' outputs in a sentence, when they have the examples' shape."""
    if name == "transferMoney" and {"amount", "to_account", "transaction_id"} <= out.keys():
        return (
            f"Done: transferred ${out['amount']:.2f} to {out['to_account']} "
            f"(transaction {out['transaction_id']})."
        )
    if name == "deploy" and {"service", "version", "environment", "deployment_id"} <= out.keys():
        return (
            f"Deployed {out['service']} {out['version']} to {out['environment']} "
            f"(deployment {out['deployment_id']})."
        )
    if name == "run_shell" and {"command", "exit_code"} <= out.keys():
        output = (out.get("stdout") or out.get("stderr") or "").strip()
        return f"`{out['command']}` exited with {out['exit_code']}:\n{output[:500]}"
    return None


def _shown(out: dict[str, Any]) -> str:
    shown = json.dumps(out, ensure_ascii=False)
    if len(shown) <= SHOWN_OUTPUT_CHARS:
        return shown
    return shown[:SHOWN_OUTPUT_CHARS] + f"… ({len(shown)} characters in all)"


def _quietly_parsed(message: str) -> list[tuple[str, dict[str, Any] | None]] | None:
    try:
        return parse_calls(message)
    except CallSyntaxError:
        return None


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

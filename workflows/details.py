"""What an operator reads: the Markdown of the Temporal UI's details panel, and safe display text.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Pure code. Almost everything shown comes from callers or the model (chat ids, tool input, signal
names, identities, reasons), so every value is escaped before it reaches Markdown or a terminal:

- :func:`visible` makes control characters, line breaks and bidirectional overrides visible as
  escapes, so no value can move the cursor, recolour a terminal or reorder what is shown;
- :func:`code` and :func:`fence` wrap a value in a code span or block whose backtick run is
  longer than any inside the value, so no value can close it; code is never rendered as a link,
  an image or HTML. Nothing taken from input is placed outside them.

Each interrupt leads with what a person is shown of it (``InterruptRequest.shown``: the summary,
why it waits, the requester, the user's request and the model's words, the fields), each value in
a code span; the raw input and metadata follow for operators. The command suggested for each
interrupt is built from the tool's output schema: an approval where the schema is
approval-shaped, else a template whose placeholders the operator fills in.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporal_agent_interrupts.workflows.grants import describe_match
from temporal_agent_interrupts.workflows.input_rounds import form_schema
from temporal_agent_interrupts.workflows.interrupts import schema_error
from temporal_agent_interrupts.workflows.state import (
    CallState,
)
from temporal_agent_interrupts.workflows.text import truncate, visible
from temporal_agent_interrupts.workflows.types import (
    APPROVED,
    TOOL_APPROVED,
    AgentSpec,
    AgentStatus,
    AnswerRecord,
    Grant,
    InterruptRequest,
    JsonObject,
    Rejection,
    Requester,
    Shown,
    ToolSpec,
    TurnResult,
)

MAX_TEXT_IN_DETAILS = 400
MAX_INTERRUPTS_IN_DETAILS = 20
MAX_FIELDS_IN_DETAILS = 6
"""Fields of a call's ``Shown`` the panel lists (the rest are counted): the raw input follows."""
MAX_GRANTS_IN_DETAILS = 10
"""Grants the panel lists (a conversation holds up to ``grants.MAX_GRANTS``); ``agentctl grants``
and the ``grants`` query have them all."""


def _longest_run(text: str, char: str = "`") -> int:
    runs = re.findall(f"{re.escape(char)}+", text)
    return max((len(r) for r in runs), default=0)


def code(text: str) -> str:
    """An inline code span holding exactly ``visible(text)``: nothing in it can end it."""
    body = visible(text)
    ticks = "`" * (_longest_run(body) + 1)
    if not body:
        return "` `"  # an empty span is not a code span at all
    # CommonMark strips one space from each end when both are there (and the body is not all
    # spaces): padding with one lets the body start or end with a backtick, or a space.
    edge_spaces = body.startswith(" ") and body.endswith(" ") and body.strip(" ")
    if body.startswith("`") or body.endswith("`") or edge_spaces:
        return f"{ticks} {body} {ticks}"
    return f"{ticks}{body}{ticks}"


def fence(text: str) -> str:
    """A fenced code block holding ``visible(text)`` on one line: no line in it can close it."""
    body = visible(text)
    ticks = "`" * max(3, _longest_run(body) + 1)
    return f"{ticks}\n{body}\n{ticks}"


def shell_word(value: str) -> str:
    """``value`` quoted as one word for a POSIX shell, on one line.

    Printable text gets ``shlex.quote``; text with control characters gets bash's ``$'...'``
    with escapes, since a quoted line break would split the command across lines.
    """
    if value.isprintable():
        return shlex.quote(value)
    out = []
    for c in value:
        if c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            # Its UTF-8 bytes: exact whatever the shell's locale (bash's \\u is not).
            out.append("".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogatepass")))
    return "$'" + "".join(out) + "'"


def utc(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --------------------------------------------------------------------------------------------
# The answer to suggest


def example_output(schema: JsonObject | None) -> tuple[JsonObject, bool]:
    """An output for an interrupt-only tool, built from its output schema.

    Returns the output and whether it is complete: an approval that fits the schema as it
    stands. Otherwise it is a template: each field the schema requires, with its only allowed
    value where it has one and a ``<name>`` placeholder where a human must choose.
    """
    if not schema:
        return {APPROVED: True}, True
    placeholders: list[str] = []
    value = _example(schema, schema, name="output", depth=0, placeholders=placeholders)
    if not isinstance(value, dict):
        return {APPROVED: True}, False
    complete = not placeholders and schema_error(value, schema) is None
    return value, complete


def example_value(schema: JsonObject | None) -> Any:
    """A made-up value meant to fit ``schema``: its defaults, first enum values and examples,
    and plain stand-ins (``"example"``, a number within its bounds and step, one array item)
    for the rest.

    The offline model sends it for ``call TOOL`` without arguments. Only the required
    properties of an object are filled in. A string ``pattern`` is not honoured: the tool's
    input check then reports it, as it would for the model's own arguments.
    """
    if not schema:
        return {}
    return _example(schema, schema, name="input", depth=0, placeholders=None)


def _resolve(node: Any, root: JsonObject) -> Any:
    for _ in range(8):  # a chain of $refs, bounded
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not (isinstance(ref, str) and ref.startswith("#/$defs/")):
            return node
        node = (root.get("$defs") or {}).get(ref.removeprefix("#/$defs/"), {})
    return node


def _example(
    node: Any, root: JsonObject, *, name: str, depth: int, placeholders: list[str] | None
) -> Any:
    """``placeholders`` None: a concrete value (:func:`example_value`); else a template whose
    undecided leaves are ``<name>`` placeholders, each also listed in ``placeholders``."""
    node = _resolve(node, root)
    # Templates stay shallow for the details panel; a made-up input goes as deep as it must.
    if not isinstance(node, dict) or depth > (4 if placeholders is not None else 24):
        if placeholders is None:
            return {}
        placeholders.append(name)
        return f"<{name}>"
    if "const" in node:
        return node["const"]
    if placeholders is None:
        if "default" in node:
            return node["default"]
        if isinstance(node.get("examples"), list) and node["examples"]:
            return node["examples"][0]
    if node.get("enum"):
        if placeholders is not None and len(node["enum"]) > 1:
            placeholders.append(name)
            # No quotes inside: the template is edited inside a JSON string.
            return f"<{name}: {' | '.join(str(v) for v in node['enum'][:5])}>"
        return node["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = [o for o in node.get(key) or [] if _resolve(o, root).get("type") != "null"]
        if options:
            return _example(options[0], root, name=name, depth=depth + 1, placeholders=placeholders)
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        props: dict[str, Any] = node.get("properties") or {}
        keys = list(node.get("required") or [])
        if placeholders is not None and APPROVED in props and APPROVED not in keys:
            keys.insert(0, APPROVED)
        return {
            k: _example(props.get(k, {}), root, name=k, depth=depth + 1, placeholders=placeholders)
            for k in keys
        }
    if kind == "boolean":
        return True
    if kind == "array":
        if placeholders is not None:
            return []
        fixed = [
            _example(p, root, name=name, depth=depth + 1, placeholders=None)
            for p in node.get("prefixItems") or []
        ]
        if fixed:  # a tuple
            return fixed
        item = _example(node.get("items", {}), root, name=name, depth=depth + 1, placeholders=None)
        return [item] * max(int(node.get("minItems") or 1), 1)
    if placeholders is None:
        return _concrete_leaf(node, kind)
    placeholders.append(name)
    return f"<{name}>"


_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "12:00:00",
    "email": "someone@example.com",
    "uri": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _concrete_leaf(node: JsonObject, kind: Any) -> Any:
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        if kind == "number" and low is not None and high is not None:
            return float((low + high) / 2)  # inside, whichever bound is exclusive
        value = 1 if low is None else low + (1 if "exclusiveMinimum" in node else 0)
        if "maximum" in node:
            value = min(value, node["maximum"])
        if "exclusiveMaximum" in node:
            value = min(value, node["exclusiveMaximum"] - 1)
        step = node.get("multipleOf")
        if isinstance(step, int | float) and step > 0:
            value = math.ceil(value / step) * step
        return int(value) if kind == "integer" else float(value)
    if kind == "null":
        return None
    text = _FORMATS.get(str(node.get("format")), "example")
    text = text.ljust(int(node.get("minLength") or 0), "x")
    return text[: int(node["maxLength"])] if "maxLength" in node else text


def suggested_answer(call: CallState, tool: ToolSpec | None) -> tuple[JsonObject, str]:
    """The ``resume`` payload to suggest for a pending call, and how to introduce it."""
    return _suggest(
        name=call.name,
        ref=call.ref,
        source=call.source,
        output_schema=(
            form_schema(call.input_round)
            if call.source == "input"
            else tool.output_schema
            if tool
            else None
        ),
    )


def _suggest(
    *, name: str, ref: str, source: str, output_schema: JsonObject | None
) -> tuple[JsonObject, str]:
    if source not in ("interrupt", "input"):
        # A form an MCP server asks for is answered with its data, like an interrupt-only tool.
        restart = {"name": name, "ref": ref, "resumed_metadata": {TOOL_APPROVED: True}}
        return {"restart": [restart]}, "approve it (the tool runs with its input as shown)"
    output, complete = example_output(output_schema)
    respond = {"name": name, "ref": ref, "output": output}
    if complete:
        return {"respond": [respond]}, "approve it"
    return {"respond": [respond]}, "answer it (replace each <…> first)"


def resume_command(workflow_id: str, answer: JsonObject, *, namespace: str) -> str:
    """The ``temporal`` CLI command that sends ``answer`` as a ``resume`` signal, on one line.

    It names the namespace: the CLI's default is ``default``, and a conversation in any other
    (a team's ``fintech``) would otherwise be "not found" when the operator pastes it. The JSON
    is ASCII (``json.dumps`` escapes the rest), so one ``shlex.quote`` holds it; the workflow id
    and the namespace may be anything and are quoted by :func:`shell_word`.
    """
    return (
        f"temporal workflow signal --namespace {shell_word(namespace)} "
        f"--workflow-id {shell_word(workflow_id)} --name resume "
        f"--input {shlex.quote(json.dumps(answer, separators=(',', ':')))}"
    )


# --------------------------------------------------------------------------------------------
# The panel


def _requester(requester: Requester) -> str:
    proof = "verified" if requester.verified else "asserted, not verified"
    return f"- requested by {code(truncate(requester.identity, 80))} ({proof})"


def _person(request: InterruptRequest | None) -> list[str]:
    """What a person is shown of a paused call, as the panel's first lines: the summary, the
    tool's stated risk, why it waits, who asked, the user's request and the model's words, and
    the fields. Every value came from the call's input, the model or the tool's author, and
    sits in a code span (the risk is one of a few fixed words). Nothing for a request without
    ``shown`` but its requester (a conversation older than it)."""
    if request is None:
        return []
    shown: Shown | None = request.shown
    if shown is None:
        return [_requester(request.requester)] if request.requester is not None else []
    lines = [f"**{code(truncate(shown.summary, MAX_TEXT_IN_DETAILS))}**", ""]
    if shown.risk is not None:
        note = f": {code(truncate(shown.risk_note, 200))}" if shown.risk_note else ""
        lines.append(f"- risk **{shown.risk}**{note}")
    if shown.why:
        lines.append(f"- why it waits: {code(truncate(shown.why, MAX_TEXT_IN_DETAILS))}")
    if request.requester is not None:
        lines.append(_requester(request.requester))
    if shown.asked:
        lines.append(f"- the user asked: {code(truncate(shown.asked, MAX_TEXT_IN_DETAILS))}")
    if shown.said:
        lines.append(f"- the model said: {code(truncate(shown.said, MAX_TEXT_IN_DETAILS))}")
    for field in shown.fields[:MAX_FIELDS_IN_DETAILS]:
        lines.append(f"- {code(truncate(field.label, 80))}: {code(truncate(field.value, 200))}")
    hidden = shown.fields_omitted + max(len(shown.fields) - MAX_FIELDS_IN_DETAILS, 0)
    if hidden:
        lines.append(f"- … {hidden} more field{'s' if hidden != 1 else ''} in the input")
    return lines


def _who_may(request: InterruptRequest) -> list[str]:
    """Who may answer a paused call, and the votes so far, as panel lines (the requester is
    with what the person is shown: :func:`_person`)."""
    lines = []
    if request.approvers:
        names = ", ".join(code(truncate(a, 80)) for a in request.approvers[:10])
        more = len(request.approvers) - 10
        lines.append(f"- approvers: {names}{f' (+{more} more)' if more > 0 else ''}")
    if request.quorum > 1:
        voted = ", ".join(code(truncate(v.identity, 80)) for v in request.votes[:10])
        lines.append(
            f"- needs {request.quorum} approvals; {len(request.votes)} so far"
            + (f": {voted}" if voted else "")
        )
    if request.editable:
        lines.append("- editable: a restart may change the input")
    return lines


def _heading(name: str, ref: str, since: datetime | None, *, where: str = "") -> str:
    # The panel is rewritten only when the conversation changes, so an age computed here
    # would read "0s" for as long as the interrupt waits: give the instant instead.
    when = f" since {utc(since)}" if since else ""
    return f"### Waiting on {code(name)}{where} (ref {code(ref)}){when}"


def _shown(args: JsonObject, metadata: JsonObject, deadline: datetime | None) -> list[str]:
    """A paused call's input, metadata and deadline, as panel lines."""
    lines = [
        f"- input: {code(truncate(json.dumps(args), MAX_TEXT_IN_DETAILS))}",
        f"- metadata: {code(truncate(json.dumps(metadata), MAX_TEXT_IN_DETAILS))}",
    ]
    if deadline:
        lines.append(f"- deadline: {utc(deadline)}")
    return lines


def _delegated(request: InterruptRequest, *, chat_id: str, namespace: str) -> list[str]:
    """A sub-agent's interrupt (``agent_tool``) as panel lines: where it waits, and the command
    that answers it through this conversation and on the sub-agent's own chat.

    This conversation passes such an answer on to the sub-agent, whose rules check it (its
    approvers, quorum and trust, none of which this conversation's own apply to), so the
    suggested answer asks for what the request says: a token from its issuer when it has one,
    else an identity when it names approvers.
    Everything here came from the sub-agent (its ref, chat id, input), so all of it is escaped
    like any input.
    """
    answer, how = _suggest(
        name=request.name,
        ref=request.ref,
        source=request.source,
        output_schema=request.output_schema,
    )
    if request.approvers:
        answer["identity"] = "<one of the approvers>"
    if request.issuer is not None:
        answer.pop("identity", None)
        answer["identity_token"] = f"<a fresh JWT from {truncate(request.issuer, 100)}>"
    child = request.chat_id or ""
    lines = [
        _heading(request.name, request.ref, request.since, where=" in a sub-agent"),
        *_person(request),
        f"- sub-agent chat: {code(child)}",
        f"- path: {' → '.join(code(step) for step in request.path)}",
        *_shown(request.input, request.metadata, request.deadline),
        *_who_may(request),
        f"- {how}, through this conversation (it passes the answer on to the sub-agent, "
        "whose rules decide):",
        "",
        fence(resume_command(chat_id, answer, namespace=namespace)),
    ]
    if child:
        lines += [
            "",
            "- or on the sub-agent's own chat:",
            "",
            fence(resume_command(child, answer, namespace=namespace)),
        ]
    return lines


def render_details(
    *,
    chat_id: str,
    namespace: str,
    agent: str,
    status: AgentStatus,
    turns: int,
    spec: AgentSpec | None,
    pending: Sequence[CallState],
    last_turn: TurnResult | None,
    rejections: Sequence[Rejection],
    rejections_total: int,
    answers: Sequence[AnswerRecord] = (),
    requests: Sequence[InterruptRequest],
    delegated: Sequence[InterruptRequest] = (),
    grants: Sequence[Grant] = (),
) -> str:
    """The Markdown of the UI's current details: what the conversation waits on and how to
    answer it, how the last turn ended, what was decided and what was refused lately.

    ``namespace``: the conversation's, named in every command the panel suggests.
    ``requests``: the pending calls as requests (who may answer, quorum, votes), in the same
    order. ``delegated``: the interrupts this turn's sub-agents wait on (``agent_tool``), with
    their paths, shown after this conversation's own; :data:`MAX_INTERRUPTS_IN_DETAILS` counts
    both. ``grants``: the grants in force (see :func:`_grant_lines`).
    """
    lines = [f"{code(agent)} · status **{status}** · turn {turns}"]
    asked = {r.ref: r for r in requests}
    trust = spec.trust if spec else None
    shown_own = list(pending[:MAX_INTERRUPTS_IN_DETAILS])
    for call in shown_own:
        tool = spec.tool(call.name) if spec else None
        answer, how = suggested_answer(call, tool)
        request = asked.get(call.ref)
        if request is not None and request.approvers:
            answer["identity"] = "<one of the approvers>"
        if trust is not None:
            answer.pop("identity", None)
            answer["identity_token"] = f"<a fresh JWT from {truncate(trust.issuer, 100)}>"
        lines += [
            "",
            _heading(call.name, call.ref, call.since),
            *_person(request),
            *_shown(call.args, call.metadata, call.deadline),
        ]
        if request is not None:
            lines += _who_may(request)
        lines += [f"- {how}:", "", fence(resume_command(chat_id, answer, namespace=namespace))]
    room = MAX_INTERRUPTS_IN_DETAILS - len(shown_own)
    for request in delegated[:room]:
        lines += ["", *_delegated(request, chat_id=chat_id, namespace=namespace)]
    total = len(pending) + len(delegated)
    if total > MAX_INTERRUPTS_IN_DETAILS:
        more = total - MAX_INTERRUPTS_IN_DETAILS
        lines += ["", f"… and {more} more pending (query `pending` for all of them)"]
    if last_turn and status != "interrupted":
        lines += ["", f"Last turn {last_turn.turn}: **{last_turn.finish_reason.value}**"]
        if last_turn.error:
            error = f"{last_turn.error.status}: {last_turn.error.message}"
            lines.append(f"- error: {code(truncate(error, 300))}")
    if answers:
        lines += ["", "### Recent decisions"]
        for a in answers[-5:]:
            who = a.identity or "unknown"
            proof = ", verified" if a.identity_verified else ""
            # An answer passed on to a sub-agent: where it went, and what the sub-agent decided.
            where = f" in sub-agent {code(truncate(a.chat_id, 120))}" if a.chat_id else ""
            asked = (
                f", requested by {code(truncate(a.requester.identity, 80))}"
                if a.requester is not None
                else ""
            )
            # The receipt's id (its first 16 hex digits: enough to find it in an export).
            receipt = f", receipt {code(a.receipt.id[:16])}" if a.receipt is not None else ""
            lines.append(
                f"- {utc(a.at)} {code(truncate(a.name, 60))} (ref {code(truncate(a.ref, 60))}"
                f"{where}): **{a.verdict or a.decision or a.kind}** by {code(truncate(who, 80))} "
                f"({a.via}{proof}){asked}{receipt}"
            )
    lines += _grant_lines(grants, chat_id=chat_id)
    if rejections:
        lines += ["", f"### Recent rejected answers ({rejections_total} in all)"]
        for r in rejections[-5:]:
            lines.append(
                f"- {utc(r.at)} {code(truncate(r.handler, 60))} ({r.via}): "
                f"{code(truncate(r.reason, 200))}"
            )
    return "\n".join(lines)


def _grant_lines(grants: Sequence[Grant], *, chat_id: str) -> list[str]:
    """The grants in force as panel lines, and the command that ends one.

    Each line is bounded (a grant's conditions may hold 8 values of 256 bytes), and at most
    :data:`MAX_GRANTS_IN_DETAILS` are listed, so the panel stays about the size it was. The
    panel is rewritten at the workflow's publish points (a grant made, used, revoked or
    expired), so an ``until`` is given as an instant, never as time left.
    """
    if not grants:
        return []
    lines = ["", f"### Grants in force ({len(grants)})"]
    for g in grants[:MAX_GRANTS_IN_DETAILS]:
        by = ", ".join(truncate(b, 80) for b in g.granted_by[:5]) or "unknown"
        more = len(g.granted_by) - 5
        until = f"until {utc(g.until)}" if g.until else "until revoked"
        lines.append(
            f"- {code(truncate(g.id, 60))}: {code(truncate(g.tool, 60))} when "
            f"{code(truncate(describe_match(g.match), 200))}, {until}, granted by {code(by)}"
            f"{f' (+{more} more)' if more > 0 else ''} "
            f"({'verified' if g.verified else 'asserted'}), used {g.uses} times"
        )
    if len(grants) > MAX_GRANTS_IN_DETAILS:
        lines.append(
            f"- … and {len(grants) - MAX_GRANTS_IN_DETAILS} more "
            f"(agentctl grants {shell_word(chat_id)})"
        )
    lines += [
        "- revoke one (matching calls ask again):",
        "",
        fence(f"agentctl revoke-grant {shell_word(chat_id)} GRANT_ID --reason TEXT"),
    ]
    return lines

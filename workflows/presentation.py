"""What a person is shown of a paused call, written once for every surface.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

:func:`shown` turns a call, its tool's spec and the turn it came from into a :class:`Shown`: a
title, a one-line summary, labelled fields, the tool's stated risk, the user's message and the
model's words. The conversation writes it on every ``InterruptRequest`` it hands out, so the
inbox page, Slack, email, the details panel, the approvals API and AG-UI all read the same
words, and none of them reads raw JSON or refs to say what a call does.

Pure and bounded: it runs in the workflow (no clock, no randomness, no I/O), each part is cut
to a bound whatever the input's size, and the work is linear in what is shown (at most
:data:`MAX_FIELDS` fields of :data:`MAX_VALUE` characters; a nested value is written as JSON
only up to that length). Text is plain: control and invisible characters are made visible
(``text.visible``), and each surface escapes it for its own markup.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from temporal_agent_interrupts.workflows.state import CallState
from temporal_agent_interrupts.workflows.text import truncate, visible
from temporal_agent_interrupts.workflows.types import (
    CallContext,
    JsonObject,
    Message,
    Present,
    Show,
    ShowFormat,
    Shown,
    ShownField,
    ToolSpec,
)

MAX_FIELDS = 12
"""The most fields shown of one call; the rest are counted (``Shown.fields_omitted``)."""
MAX_VALUE = 200
"""The most characters of one field's value, and of a label."""
MAX_SUMMARY = 200
"""The most characters of the one-line summary."""
MAX_CONTEXT = 500
"""The most characters of the user's message and of the model's words, each."""
MIN_SHARE = 16
"""The fewest characters a value gets in the summary, however many the template names."""
MAX_NOTE = 300
"""The most characters of a tool's risk note."""

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]{1,100})\}")


def context(asked: Message | None, reply: Message) -> CallContext | None:
    """The turn a model reply's calls came from, cut: the user's message (None when the turn
    did not start from one) and the model's words in the reply. None when both are empty, so
    a call made without words costs nothing on the wire."""
    user = asked.text() if asked is not None and asked.role == "user" else ""
    said = reply.text()
    if not user.strip() and not said.strip():
        return None
    return CallContext(
        asked=_cut(user, MAX_CONTEXT, lines=True), said=_cut(said, MAX_CONTEXT, lines=True)
    )


def shown(call: CallState, tool: ToolSpec | None) -> Shown:
    """What a person is shown of ``call`` (see the module's docstring)."""
    present = tool.present if tool is not None else None
    schema = tool.input_schema if tool is not None else {}
    # The tool's name in words: the schema's title names the input model, not the action.
    title = _cut(words(call.name), MAX_VALUE)
    fields, omitted = _fields(call.args, schema, present)
    summary = _summary(call.args, schema, present, title=title, fields=fields)
    ctx = call.context or CallContext()
    return Shown(
        title=title,
        summary=summary,
        why=_why(call, tool),
        fields=fields,
        fields_omitted=omitted,
        risk=present.risk if present else None,
        risk_note=_cut(present.risk_note, MAX_NOTE) if present and present.risk_note else None,
        asked=ctx.asked,
        said=ctx.said,
    )


# --------------------------------------------------------------------------------------------


def _why(call: CallState, tool: ToolSpec | None) -> str:
    """Why the call waits, for the person asked: never the gate's vocabulary or a class name."""
    said = call.metadata.get("message")
    message = said.strip() if isinstance(said, str) else ""
    if call.source == "approval":
        if call.policy is not None and call.policy.effect == "ask":
            return "A policy asks for a person's approval before this runs."
        return "This needs your approval before it runs."
    if call.source == "input":
        return _cut(message or "The tool's server asks for an answer.", MAX_NOTE)
    if call.source == "tool":
        return _cut(message or "The tool asks for an answer before it goes on.", MAX_NOTE)
    # An interrupt-only tool: asking a person is what it is for.
    return _cut(message or (tool.description if tool else "") or "An answer is needed.", MAX_NOTE)


def _cut(text: str, limit: int, *, lines: bool = False) -> str:
    # Cut before making characters visible, so a long run of escapes is bounded too, then cut
    # again: an escape is longer than the character it shows.
    return truncate(visible(truncate(text.strip(), limit), multiline=lines), limit)


def words(key: str) -> str:
    """A key as words for a label: ``payeeIban`` and ``payee_iban`` read ``Payee iban``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).replace("_", " ").replace("-", " ")
    spaced = " ".join(spaced.split()).lower()
    return spaced[:1].upper() + spaced[1:]


def _property(schema: JsonObject, path: list[str]) -> JsonObject:
    node: Any = schema
    for key in path:
        props = node.get("properties") if isinstance(node, dict) else None
        node = props.get(key) if isinstance(props, dict) else None
        if not isinstance(node, dict):
            return {}
    return node


def _at(args: JsonObject, path: list[str]) -> tuple[bool, Any]:
    node: Any = args
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _format_for(prop: JsonObject) -> ShowFormat:
    fmt = prop.get("format")
    if fmt in ("date", "date-time", "time"):
        return "date"
    if fmt == "iban":
        return "iban"
    return "text"


def write(value: Any, fmt: ShowFormat, *, whole: bool = False) -> str:
    """``value`` written for people by ``fmt`` (see ``ShowFormat``), cut to
    :data:`MAX_VALUE`. ``whole``: an IBAN in full, in groups of four (a field, where the
    approver checks the payee), not its country and last two characters (a summary)."""
    if value is None:
        return "—"
    if (
        fmt in ("money", "number")
        and isinstance(value, int | float | str)
        and not isinstance(value, bool)
    ):
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            number = None
        if number is not None and number.is_finite() and abs(number) < Decimal(10) ** 30:
            text = f"{number:,.2f}" if fmt == "money" else f"{number:,}"
            return _cut(text, MAX_VALUE)
    if isinstance(value, str):
        text = value
        if fmt == "iban":
            compact = "".join(value.split())
            if whole:
                text = " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))
            else:
                text = f"{compact[:4]} …{compact[-2:]}" if len(compact) > 8 else compact
        elif fmt == "masked":
            text = f"…{value[-4:]}" if len(value) > 4 else value
        elif fmt == "date":
            text = value.replace("T", " ", 1)
        return _cut(text, MAX_VALUE)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _cut(str(value), MAX_VALUE)
    return _cut(_json_within(value, MAX_VALUE), MAX_VALUE)


def _json_within(value: Any, limit: int) -> str:
    """Compact JSON of ``value``, written only as far as ``limit`` characters (a huge list
    costs no more than a short one)."""
    out: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).iterencode(value):
        out.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return "".join(out)


def _fields(
    args: JsonObject, schema: JsonObject, present: Present | None
) -> tuple[list[ShownField], int]:
    if present is not None and present.fields:
        wanted = present.fields
    else:
        # The default: each of the input's own keys, in the schema's order then the input's.
        props = schema.get("properties")
        order = list(props) if isinstance(props, dict) else []
        order += [k for k in args if k not in order]
        wanted = [
            Show(key=k, format=_format_for(_property(schema, [k]))) for k in order if k in args
        ]
    # A tool's own keys are paths (``payee.iban``); the default's are the input's keys as they
    # are, so a key with a dot in it (``note.Amount``) never reads as another field's path.
    declared = present is not None and bool(present.fields)
    fields: list[ShownField] = []
    for show in wanted[:MAX_FIELDS]:
        path = show.key.split(".") if declared else [show.key]
        found, value = _at(args, path)
        if not found:
            continue
        label = show.label or str(_property(schema, path).get("title") or words(path[-1]))
        shown = write(value, show.format, whole=True)
        fields.append(ShownField(label=_cut(label, MAX_VALUE), value=shown))
    listed = {(s.key.split(".")[0] if declared else s.key) for s in wanted}
    omitted = max(len(wanted) - MAX_FIELDS, 0) + sum(1 for k in args if k not in listed)
    return fields, omitted


def _summary(
    args: JsonObject,
    schema: JsonObject,
    present: Present | None,
    *,
    title: str,
    fields: list[ShownField],
) -> str:
    # Each value gets its share of the line, so a long one (a free-text note) never pushes
    # another (the payee) out of it.
    if present is not None and present.summary:
        template = present.summary[: MAX_SUMMARY * 4]
        formats: dict[str, ShowFormat] = {s.key: s.format for s in present.fields}
        holes = [m for m in _PLACEHOLDER.finditer(template) if m.group(1) is not None]
        literal = len(_PLACEHOLDER.sub("", template))
        share = max(MIN_SHARE, (MAX_SUMMARY - literal) // max(len(holes), 1))

        def fill(m: re.Match[str]) -> str:
            if m.group(0) in ("{{", "}}"):
                return m.group(0)[0]
            key = m.group(1).strip()
            found, value = _at(args, key.split("."))
            if not found:
                return "—"
            fmt = formats.get(key) or _format_for(_property(schema, key.split(".")))
            return truncate(write(value, fmt), share)

        return _cut(_PLACEHOLDER.sub(fill, template), MAX_SUMMARY)
    parts = fields[:4]
    share = max(MIN_SHARE, (MAX_SUMMARY - len(title) - 2) // max(len(parts), 1) - 2)
    said = [truncate(f"{f.label} {f.value}", share) for f in parts]
    text = f"{title}: {', '.join(said)}" if said else title
    return _cut(text, MAX_SUMMARY)

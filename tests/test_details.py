"""What an operator reads (workflows.details), without a server: display text with its
controls made visible, Markdown code that no input can close, shell words bash reads back
exactly, answers suggested from a tool's output schema, and each paused call led by what a
person is shown of it."""

from __future__ import annotations

import json
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from temporal_agent_interrupts.workflows.details import (
    MAX_FIELDS_IN_DETAILS,
    MAX_TEXT_IN_DETAILS,
    code,
    example_output,
    fence,
    render_details,
    shell_word,
    visible,
)
from temporal_agent_interrupts.workflows.state import CallState
from temporal_agent_interrupts.workflows.types import (
    InterruptRequest,
    Requester,
    Shown,
    ShownField,
    gate_metadata,
)


def test_visible_shows_controls_and_bidi_overrides_as_escapes():
    assert visible("a\x1b[31mb\x07\x9b\u202e\n") == "a\\x1b[31mb\\x07\\x9b\\u202e\\x0a"
    assert visible("line one\nline two\tok", multiline=True) == "line one\nline two\tok"
    assert visible("emoji 🙂 and é") == "emoji 🙂 and é"


def _inline(markdown: str) -> list[Token]:
    (paragraph,) = [t for t in MarkdownIt("commonmark").parse(markdown) if t.type == "inline"]
    return paragraph.children or []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("`*_[]()<>!\\\n x#|~&"), max_size=40))
def test_a_code_span_holds_exactly_its_text_whatever_it_is(text):
    children = _inline(f"before {code(text)} after")
    kinds = [c.type for c in children]
    assert kinds == ["text", "code_inline", "text"], kinds
    inner = children[1].content
    assert inner == (visible(text) or " ")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("`~\n x"), max_size=30))
def test_a_fence_holds_exactly_its_text_whatever_it_is(text):
    tokens = MarkdownIt("commonmark").parse(fence(text) + "\n\nafter")
    assert [t.type for t in tokens][:1] == ["fence"]
    assert tokens[0].content == visible(text) + "\n"


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s))
def test_a_shell_word_is_exactly_the_value_to_bash(value):
    done = subprocess.run(
        ["bash", "-c", f"printf %s {shell_word(value)}"], capture_output=True, check=True
    )
    assert done.stdout.decode("utf-8", "surrogateescape") == value
    assert "\n" not in shell_word(value)


class _Schemas:
    APPROVAL = {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}, "feedback": {"type": "string"}},
        "required": ["approved"],
    }
    CHOICE = {
        "type": "object",
        "properties": {
            "priority": {"enum": ["low", "high"], "type": "string"},
            "note": {"type": "string", "default": ""},
        },
        "required": ["priority"],
    }
    NESTED = {
        "type": "object",
        "$defs": {
            "Who": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            }
        },
        "properties": {
            "approved": {"type": "boolean"},
            "who": {"$ref": "#/$defs/Who"},
            "kind": {"const": "sign-off"},
        },
        "required": ["who", "kind"],
    }


def test_the_suggested_output_follows_the_schema():
    assert example_output(None) == ({"approved": True}, True)
    assert example_output(_Schemas.APPROVAL) == ({"approved": True}, True)
    assert example_output(_Schemas.CHOICE) == ({"priority": "<priority: low | high>"}, False)
    output, complete = example_output(_Schemas.NESTED)
    assert output == {"approved": True, "who": {"name": "<name>"}, "kind": "sign-off"}
    assert not complete
    json.dumps(output)


HOSTILE = "<img src=x onerror=alert(1)> **bold** [link](https://evil.example) `tick`\u202e"


def _panel(request: InterruptRequest) -> str:
    call = CallState.model_validate(
        {
            "ref": request.ref,
            "name": request.name,
            "args": request.input,
            "source": request.source,
            "metadata": request.metadata,
        }
    )
    return render_details(
        chat_id="pay-1",
        namespace="default",
        agent="payer",
        status="interrupted",
        turns=1,
        spec=None,
        pending=[call],
        last_turn=None,
        rejections=[],
        rejections_total=0,
        requests=[request],
    )


def _payment(**shown: object) -> InterruptRequest:
    fields = [
        ShownField(label="Amount", value="7,300.00"),
        ShownField(label="To", value="NL91 …00"),
    ]
    return InterruptRequest(
        name="sendPayment",
        ref="r1",
        input={"amount": 7300, "currency": "EUR", "iban": "NL91ABNA0417164300"},
        metadata=gate_metadata("sendPayment"),
        source="approval",
        requester=Requester(identity="alice@example.com", verified=True),
        shown=Shown.model_validate(
            {
                "title": "Send payment",
                "summary": "Pay 7,300.00 EUR to NL91 …00",
                "why": "This needs your approval before it runs.",
                "fields": fields,
                "fields_omitted": 1,
                "risk": "high",
                "risk_note": "Money leaves the company's account.",
                "asked": "Pay the supplier's invoice 42.",
                "said": "I will pay invoice 42 now.",
                **shown,
            }
        ),
    )


def test_each_paused_call_leads_with_what_a_person_is_shown_then_the_command():
    panel = _panel(_payment())
    lines = panel.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("### Waiting on"))
    assert lines[heading + 1 : heading + 12] == [
        "**`Pay 7,300.00 EUR to NL91 …00`**",
        "",
        "- risk **high**: `Money leaves the company's account.`",
        "- why it waits: `This needs your approval before it runs.`",
        "- requested by `alice@example.com` (verified)",
        "- the user asked: `Pay the supplier's invoice 42.`",
        "- the model said: `I will pay invoice 42 now.`",
        "- `Amount`: `7,300.00`",
        "- `To`: `NL91 …00`",
        "- … 1 more field in the input",
        '- input: `{"amount": 7300, "currency": "EUR", "iban": "NL91ABNA0417164300"}`',
    ]
    # Said once (not again under who may answer), and the command is still suggested.
    assert panel.count("requested by") == 1
    assert "temporal workflow signal --namespace default --workflow-id pay-1" in panel


def test_what_a_person_is_shown_is_code_in_the_panel_whatever_it_holds():
    many = [ShownField(label=f"field {chr(65 + i)} {HOSTILE}", value=HOSTILE) for i in range(12)]
    panel = _panel(
        _payment(
            summary=HOSTILE,
            why=HOSTILE,
            asked=HOSTILE * 20,
            said=HOSTILE,
            risk_note=HOSTILE,
            fields=many,
            fields_omitted=0,
        )
    )
    tokens = MarkdownIt("commonmark").parse(panel)
    inline = [c for t in tokens if t.type == "inline" for c in t.children or []]
    kinds = {c.type for c in inline}
    # No link, image or HTML came of it: only text, code and the panel's own emphasis.
    assert kinds <= {"text", "code_inline", "strong_open", "strong_close", "softbreak"}, kinds
    spans = [c.content for c in inline if c.type == "code_inline"]
    assert visible(HOSTILE) in spans
    # Bounded: the user's request is cut, and at most MAX_FIELDS_IN_DETAILS fields are listed.
    assert all(len(s) <= MAX_TEXT_IN_DETAILS + 40 for s in spans if not s.startswith("temporal"))
    listed = [chr(65 + i) for i in range(12) if f"field {chr(65 + i)} <img" in panel]
    assert listed == [chr(65 + i) for i in range(MAX_FIELDS_IN_DETAILS)]
    assert f"… {12 - MAX_FIELDS_IN_DETAILS} more fields in the input" in panel


def test_a_call_shown_before_there_was_a_presentation_still_names_its_requester():
    panel = _panel(_payment().model_copy(update={"shown": None}))
    assert "- requested by `alice@example.com` (verified)" in panel
    assert "why it waits" not in panel

"""What an operator reads (workflows.details), without a server: display text with its
controls made visible, Markdown code that no input can close, shell words bash reads back
exactly, and answers suggested from a tool's output schema."""

from __future__ import annotations

import json
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from temporal_agent_interrupts.workflows.details import (
    code,
    example_output,
    fence,
    shell_word,
    visible,
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

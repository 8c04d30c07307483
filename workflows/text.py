"""Safe display text: values from callers and the model made visible and cut.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Pure code, imported by every module that shows what a conversation holds to a person (the
details panel, ``workflows.presentation``, the views of ``agentctl``), and importing nothing of
the workflow's, so any of them may use it.
"""

from __future__ import annotations

import unicodedata

# Bidirectional controls, line separators and zero-width characters: invisible, and able to
# reorder or break what an operator reads, or to make two ids look the same.
_INVISIBLE = frozenset(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    "\u200b\u200c\u2060\ufeff"
)
# Letters that draw nothing (Hangul fillers) and the combining grapheme joiner.
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u034f")
_JOINER = "\u200d"  # joins emoji in a model's text; in a one-line id it only hides


def _escape(c: str) -> str:
    o = ord(c)
    if o > 0xFFFF:
        return f"\\U{o:08x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def visible(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character (C0, DEL, C1), bidirectional override, line
    separator and zero-width character shown as an escape (``\\x1b``, ``\\u202e``). With
    ``multiline``, line breaks, tabs and the emoji joiner are kept (for a model's reply);
    otherwise they are escaped too."""
    out = []
    for c in text:
        o = ord(c)
        if multiline and c in "\n\t" + _JOINER:
            out.append(c)
        elif (
            o < 0x20
            or 0x7F <= o < 0xA0
            or c in _INVISIBLE
            or c == _JOINER
            or 0xD800 <= o < 0xE000
            or c in _FILLERS
            # Every other format character (soft hyphen, invisible operators, tags, ...):
            # each shows nothing, and two values that differ only by one read the same.
            or (o >= 0xAD and unicodedata.category(c) == "Cf")
        ):
            out.append(_escape(c))
        else:
            out.append(c)
    return "".join(out)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The code blocks of the README and of every page under docs/, for the tests that run them.

A block is found by its language and its first line, wherever it lives: a page can move a block
to another page without its test changing, and a test can never run a copy of what a reader sees.
``tests/test_docs.py`` holds every block to account: each one is run by a test that names its
first line here, or checked by its kind (type-checked, parsed, its commands parsed by the
programs they name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"

# A fenced block: three or more backticks or tildes and a language at the start of a line, the
# text, then the same fence (or a longer one) alone on a line, as CommonMark and
# pymdownx.superfences read it: ~~~ and ```` render as code too, and a ```` block may show a ```
# fence as its text. Indented fences (inside a list item or an admonition) count too: their
# indentation is taken off the text.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>(?P<char>[`~])(?P=char){2,})[ \t]*(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<text>.*?)^(?P=indent)(?P=fence)(?P=char)*[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is (``page`` relative to the root, its first line's
    number), its language and its text as a reader copies it; ``before``, the (up to) three
    lines above its fence, where a page says what a block is (``<!-- model: ... -->``,
    ``<!-- output -->``: see ``tests/test_docs.py``)."""

    page: str
    line: int
    lang: str
    text: str
    before: str = ""

    @property
    def first(self) -> str:
        return self.text.split("\n", 1)[0]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The README, then every Markdown page of the site (the included bench results aside:
    ``make bench`` writes that file, with no code in it)."""
    site = sorted(p for p in DOCS.rglob("*.md") if "results" not in p.relative_to(DOCS).parts)
    return [ROOT / "README.md", *site]


def blocks_of(path: Path, text: str | None = None) -> list[Block]:
    text = path.read_text() if text is None else text
    found = []
    for m in FENCE.finditer(text):
        indent = m["indent"]
        body = m["text"]
        if indent:
            body = "".join(
                line[len(indent) :] if line.startswith(indent) else line
                for line in body.splitlines(keepends=True)
            )
        above = text[: m.start()].splitlines()[-3:]
        found.append(
            Block(
                page=str(path.relative_to(ROOT)),
                line=text.count("\n", 0, m.start()) + 2,  # the block's first line, after ```
                lang=m["lang"],
                text=body,
                before="\n".join(line.strip() for line in above),
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p)]


def block(first_line: str, *, lang: str) -> str:
    """The one ```lang block, on any page, whose first line is ``first_line``: its text as
    printed. Two blocks with that first line are an error, so a test never runs the wrong one."""
    found = [b for b in all_blocks() if b.lang == lang and b.first == first_line]
    assert found, f"no page has a ```{lang} block starting {first_line!r} any more"
    assert len(found) == 1, f"{first_line!r} starts several blocks: {[b.where for b in found]}"
    return found[0].text


def text_of_all_pages() -> str:
    """Every page's text, for tests that check a fact the docs state wherever it is stated."""
    return "\n".join(p.read_text() for p in pages())

"""Griffe extensions for the docs site's API reference (mkdocs.yml loads them for mkdocstrings).

The package documents itself for readers of its source, and two of its habits would not render:

- :class:`SphinxRoles`: docstrings name other objects the Sphinx way (``:class:`~a.b.X```,
  ``:meth:`send```), which Markdown prints as they are. Each role becomes an optional
  cross-reference: a link where the site documents the object, its name as code where it does
  not (or where griffe cannot tell what it names), and never a warning either way.
- :class:`FieldComments`: the fields of the pydantic models (``workflows/types.py``) are
  explained by ``#`` comments above them, not docstrings. The comment block directly above a
  field with no docstring becomes its docstring, so the reference says what each field means.

Nothing in the source changes; both run when mkdocstrings loads the package.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import griffe

PACKAGE = "temporal_agent_interrupts"

# :class:`X`, :func:`~a.b.f`, :meth:`Chat.send` ... (the roles the package's docstrings use).
ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
LOOKUP_ERRORS = (
    KeyError,
    ValueError,
    griffe.AliasResolutionError,
    griffe.CyclicAliasError,
    griffe.NameResolutionError,
)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and every object defined under it (an alias is its target's, found there)."""
    found = [obj]
    for member in obj.members.values():
        if isinstance(member, griffe.Object):
            found.extend(_objects(member))
    return found


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        for obj in _objects(pkg):
            docstring = obj.docstring
            if docstring is not None and ":`" in docstring.value:
                docstring.value = ROLE.sub(lambda m, o=obj: _link(o, m, loader), docstring.value)


def _link(obj: griffe.Object, match: re.Match[str], loader: griffe.GriffeLoader) -> str:
    target = match["target"].removesuffix("()")
    shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
    code = f"<code>{html.escape(shown)}</code>"
    path = _resolve(obj, target, loader)
    if path is None:
        return code
    return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'


def _resolve(obj: griffe.Object, target: str, loader: griffe.GriffeLoader) -> str | None:
    """The path of what ``target`` names, seen from ``obj``: a name in its scope or an enclosing
    one, a path from the package root (``workflows.types.X``, as the docstrings write them), or
    a full path. None: nothing griffe loaded."""
    first, _, rest = target.partition(".")
    candidates = []
    scope: griffe.Object | None = obj
    while scope is not None:
        if first in scope.members:
            candidates.append(f"{scope.path}.{target}")
        scope = scope.parent
    try:
        found = obj.resolve(first)
    except LOOKUP_ERRORS:
        found = None
    if found:
        candidates.append(f"{found}.{rest}" if rest else found)
    candidates += [f"{PACKAGE}.{target}", target]
    for path in candidates:
        try:
            item = loader.modules_collection[path]
            return item.final_target.path if isinstance(item, griffe.Alias) else item.path
        except LOOKUP_ERRORS:
            continue
    return None


class FieldComments(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        for obj in _objects(pkg):
            if isinstance(obj, griffe.Class):
                for member in obj.members.values():
                    if isinstance(member, griffe.Attribute) and member.docstring is None:
                        _from_comment(member)


def _from_comment(field: griffe.Attribute) -> None:
    path = field.filepath
    if not isinstance(path, Path) or path not in field.lines_collection:
        return
    lines = field.lines_collection[path]
    above: list[str] = []
    index = field.lineno - 2 if field.lineno else -1  # the line above, 0-based
    while index >= 0 and lines[index].strip().startswith("#"):
        above.insert(0, lines[index].strip().removeprefix("#").strip())
        index -= 1
    if above:
        field.docstring = griffe.Docstring(" ".join(above), parent=field)

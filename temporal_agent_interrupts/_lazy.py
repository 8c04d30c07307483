"""How the package root and its public namespaces resolve their names: on first use, from the
module that holds each one.

Internal: not covered by the 0.1.x stability promise; the namespaces that use it are public.

The root is imported by the workflow sandbox for every conversation it runs, and the root's own
modules may not import the client, the activities or the worker (tests/test_tooling.py), so a
namespace names where each of its names lives instead of importing it; a name is imported when
it is first read, and is an ordinary attribute from then on.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

PACKAGE = "temporal_agent_interrupts"


def exports(
    namespace: str, home: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``namespace``, whose names live where
    ``home`` says (a module path under the package, ``"client.web"``)."""

    def __getattr__(name: str) -> Any:  # noqa: N807 (a module's __getattr__, by its protocol name)
        where = home.get(name)
        if where is None:
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{PACKAGE}.{where}"), name)
        setattr(sys.modules[namespace], name, value)  # the next lookup is an ordinary attribute
        return value

    def __dir__() -> list[str]:  # noqa: N807 (a module's __dir__, by its protocol name)
        return sorted({*vars(sys.modules[namespace]), *home})

    return __getattr__, __dir__

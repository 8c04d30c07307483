"""The kit for an agent's tests: a scripted Gemini (``ScriptedModel``, ``text``, ``calls``,
``error``), a real dev server (``dev_server``), your worker (``hosted``, ``offline``), and what
ran (``tool_runs``); see Testing your agents in the docs.

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.testing import ScriptedModel, hosted, text

It is the pytest plugin too: ``-p temporal_agent_interrupts.testing`` makes pytest's own
verdict the process's exit status (the Temporal SDK can abort at interpreter exit after every
test passed; sdk-python issue 300). Its two hooks are read from ``worker.pytest_plugin``.

A namespace of its own because only tests import it; the kit lives in ``worker.testing`` (it
starts a dev server, drives the client) and is read on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.worker.testing import (
        BASE_URL,
        Reply,
        Request,
        ScriptedModel,
        TokenIssuer,
        call_every_tool,
        calls,
        dev_server,
        error,
        hosted,
        offline,
        text,
        tool_runs,
    )

_HOME = {
    "BASE_URL": "worker.testing",
    "Reply": "worker.testing",
    "Request": "worker.testing",
    "ScriptedModel": "worker.testing",
    "TokenIssuer": "worker.testing",
    "call_every_tool": "worker.testing",
    "calls": "worker.testing",
    "dev_server": "worker.testing",
    "error": "worker.testing",
    "hosted": "worker.testing",
    "offline": "worker.testing",
    "text": "worker.testing",
    "tool_runs": "worker.testing",
    # The pytest plugin's hooks, not names to import: pytest finds them by dir() when this
    # module is loaded with -p, and reads each only then (it reads only names that start
    # with "pytest_"; a plugin's fixtures are read by dir() as well, which imports the kit).
    "pytest_sessionfinish": "worker.pytest_plugin",
    "pytest_unconfigure": "worker.pytest_plugin",
}

__all__ = [
    "BASE_URL",
    "Reply",
    "Request",
    "ScriptedModel",
    "TokenIssuer",
    "call_every_tool",
    "calls",
    "dev_server",
    "error",
    "hosted",
    "offline",
    "text",
    "tool_runs",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)

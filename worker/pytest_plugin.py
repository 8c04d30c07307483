"""A pytest plugin for tests that use Temporal: pytest's own verdict is the process's exit code.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.testing``.

Load it by its public path, ``-p temporal_agent_interrupts.testing`` (``addopts`` in
``pyproject.toml``) or ``pytest_plugins = ["temporal_agent_interrupts.testing"]`` in the root
``conftest.py``; that namespace reads its hooks from here.

The Temporal Python SDK can abort during interpreter shutdown (``PyGILState_Release``, exit code
134; sdk-python issue 300), after every test has passed. Once pytest has decided its exit status
and printed its summary, this plugin flushes and leaves with exactly that status through
``os._exit``, skipping the interpreter teardown where the abort happens. A failing run still
exits non-zero, because the status is pytest's.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest

_status: int | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _status
    _status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _status is None or os.environ.get("AGENT_TESTS_NO_EXIT_GUARD"):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_status)

"""The docs' examples import through the package, and the plugin example runs as printed.

Every Python block of the README and of the pages under docs/ is checked for imports by a
folder's bare name (``from client import ...`` works from a clone, and loads a second copy of
every module beside the package's)
and for commands that no longer exist (``python -m worker``). The block "Inside your own Temporal
application" runs against the session's dev server with the README's ticket agent: the team's own
workflow and the agent on one worker, an interrupt approved. The README's other blocks run in
``test_newcomer.py`` (the client example), ``test_streaming.py`` (streaming) and
``test_authoring.py`` (the agent, its test file and pytest settings).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from temporal_agent_interrupts import AgentClient
from tests import docs
from tests.docs import block
from tests.helpers import eventually, server_address
from tests.test_worker_process import bare_environ

ROOT = Path(__file__).parent.parent
FOLDERS = ("workflows", "activities", "worker", "client")


def python_blocks() -> list[tuple[str, str]]:
    """Every ```python block of every page: where it starts (``page:line``), and its text."""
    return [(b.where, b.text) for b in docs.all_blocks() if b.lang == "python"]


def test_the_docs_have_python_blocks_to_check():
    assert len(python_blocks()) >= 6


def test_no_readme_python_block_imports_a_folder_by_its_bare_name():
    bare = []
    for where, source in python_blocks():
        page, line = where.rsplit(":", 1)
        tree = ast.parse(source, filename=where)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bare += [
                f"{page}:{int(line) + node.lineno - 1}: {name} "
                f"(import temporal_agent_interrupts.{name})"
                for name in names
                if name.split(".")[0] in FOLDERS
            ]
    assert not bare, bare


def test_every_name_a_readme_block_imports_from_the_package_exists():
    """Blocks that only show a shape (approval governance) are not run; their imports still
    resolve, so none of them names a module or a name that moved."""
    missing = []
    for where, source in python_blocks():
        page, line = where.rsplit(":", 1)
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.split(".")[0] != "temporal_agent_interrupts":
                continue
            module = importlib.import_module(node.module)
            missing += [
                f"{page}:{int(line) + node.lineno - 1}: {node.module}.{a.name}"
                for a in node.names
                if not hasattr(module, a.name)
            ]
    assert not missing, missing


def test_the_readme_names_no_command_by_a_folders_bare_module():
    """``python -m worker`` is ``agent-worker``; ``python -m worker.codec_server`` is
    ``agent-codec-server``; a pytest plugin is named by its package path."""
    bare = rf"(?:python -m|-p) (?:{'|'.join(FOLDERS)})\b[\w.]*"
    stale = re.findall(bare, docs.text_of_all_pages())
    assert not stale, stale


def test_the_checks_above_see_a_bare_import(monkeypatch):
    """The bare-name check finds an import it must refuse, inside a function too."""
    page = docs.ROOT / "README.md"
    text = "Intro.\n\n```python\nfrom temporal_agent_interrupts import Agent\n\ndef f():\n" \
        "    from client import run_script\n```\n"  # fmt: skip
    monkeypatch.setattr(docs, "all_blocks", lambda: docs.blocks_of(page, text))
    with pytest.raises(AssertionError, match=r"README\.md:7: client "):
        test_no_readme_python_block_imports_a_folder_by_its_bare_name()


async def test_the_readme_plugin_example_hosts_an_agent_beside_the_teams_own_workflow(
    env, tmp_path
):
    """``myapp/invoices.py`` and ``myapp/worker.py`` as printed, in the author's repository
    beside the README's ``mypackage/agents.py``, with no Gemini key (the offline stand-in): the
    team's workflow runs on the worker the plugin also serves, and the agent's gated tool runs
    once approved."""
    (tmp_path / "mypackage").mkdir()
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    (tmp_path / "mypackage" / "agents.py").write_text(block("# mypackage/agents.py", lang="python"))
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "invoices.py").write_text(
        block(
            "# myapp/invoices.py: the team's own workflow, in a module of its own as Temporal "
            "advises",
            lang="python",
        )
    )
    queue = f"billing-{uuid.uuid4()}"
    source = block(
        "# myapp/worker.py: python -m myapp.worker, from the folder holding mypackage/ and myapp/",
        lang="python",
    )
    # A task queue and a workflow id of this test's own; everything else is the README's text.
    source = source.replace('"billing"', f'"{queue}"').replace(
        '"invoice-order-42"', f'"invoice-{uuid.uuid4()}"'
    )
    (tmp_path / "myapp" / "worker.py").write_text(source)

    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=server_address(env.client))
    environ["PYTHONPATH"] = f"{tmp_path}:{ROOT}"  # the author's packages, and this checkout
    del environ["AGENT_MODULES"]  # the plugin names its agents itself
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "myapp.worker"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    first, *rest = proc.stdout.splitlines()
    assert first == "invoice sent for order-42"  # the team's workflow and activity
    assert rest == [
        '[offline stand-in model] closeTicket returned {"closed": true, "ticket_id": "T-7", '
        '"resolution": "replaced the printer"}.'
    ]

    # The conversation paused at the gate and was answered: its audit trail says by whom.
    query = f'WorkflowType="AgentWorkflow" AND TaskQueue="{queue}"'

    async def chats() -> list[str]:
        return [w.id async for w in env.client.list_workflows(query)]

    (chat_id,) = await eventually(chats, lambda ids: len(ids) == 1)
    (record,) = await AgentClient(env.client, task_queue=queue).audit(chat_id)
    assert (record.name, record.decision, record.identity) == (
        "closeTicket",
        "approved",
        "lead@example.com",
    )

"""Project tooling: lint and types are clean; the exit guard keeps pytest's verdict."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_ruff_is_clean():
    check = _run(str(BIN / "ruff"), "check", ".")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_pyright_is_clean():
    result = _run(str(BIN / "pyright"), timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


# The public path (the test kit's namespace, as docs/testing.md loads it) and the module it
# reads its hooks from.
@pytest.mark.parametrize(
    "plugin",
    ["temporal_agent_interrupts.testing", "temporal_agent_interrupts.worker.pytest_plugin"],
)
@pytest.mark.parametrize(("body", "expected"), [("assert True", 0), ("assert False", 1)])
def test_exit_guard_keeps_pytests_verdict(tmp_path, body, expected, plugin):
    (tmp_path / "test_sample.py").write_text(f"def test_sample():\n    {body}\n")
    result = _run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        plugin,
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        str(tmp_path),
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == expected, result.stdout + result.stderr
    assert ("1 passed" if expected == 0 else "1 failed") in result.stdout


# --- package boundaries ------------------------------------------------------------------------
# What each part of the one package may import, read from the source (ast), so that a new import
# across a boundary fails here rather than in a review. Imports under ``if TYPE_CHECKING:`` are
# for the type checker only and are not counted, except in ``workflows/``, which names no other
# part at all (``Agent`` takes tools through the ``ToolDeclaration`` protocol).

PKG = "temporal_agent_interrupts"
SUBPACKAGES = ("workflows", "activities", "worker", "client")
# The package root's own modules, which both sides import: the codec, tracing, connection
# settings and the error types.
SHARED = "shared"
PARTS = (*SUBPACKAGES, SHARED, "examples")

FORBIDDEN = {
    # Deterministic code: it may not reach anything that does I/O or reads configuration.
    "workflows": {"activities", "worker", "client", SHARED, "examples"},
    "activities": {"worker", "client", SHARED, "examples"},
    # The worker imports the shared modules, never the client, and hosts the examples only by
    # name (``--agents examples``). Two exceptions: the test kit (worker/testing.py) drives
    # conversations through the client API on purpose, and the worker process serves the web
    # app (client/web.py) beside itself with ``--web``, imported only then.
    "worker": {"client", "examples"},
    "client": {"worker", "examples"},
    SHARED: {"activities", "worker", "client", "examples"},
    "examples": set(),
}
ALLOWED = {"worker/testing.py": {"client"}, "worker/__main__.py": {"client"}}


def _where(root: Path) -> dict[str, Path]:
    """Each part and the folder that holds its modules."""
    return {
        **{part: root / part for part in SUBPACKAGES},
        SHARED: root / PKG,
        "examples": root / "examples",
    }


def _modules(part: str) -> list[Path]:
    folder = _where(ROOT)[part]
    # The shared part is the root's own modules; its links to the subpackages are not its own.
    found = folder.glob("*.py") if part == SHARED else folder.rglob("*.py")
    return sorted(p for p in found if "__pycache__" not in p.parts)


def _part(module: str) -> str | None:
    """Which part an absolute module name belongs to (None: not this project's)."""
    head, _, rest = module.partition(".")
    if head == "examples":
        return "examples"
    if head != PKG:
        return None
    sub = rest.split(".")[0]
    return sub if sub in SUBPACKAGES else SHARED


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_parts(path: Path) -> set[str]:
    """The parts of the project ``path`` imports, anywhere but under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(filter(None, (_part(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PKG:  # from temporal_agent_interrupts import workflows, Agent, ...
                found.update(_part(f"{PKG}.{alias.name}") or SHARED for alias in node.names)
            elif part := _part(node.module):
                found.add(part)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def _part_imports() -> dict[str, dict[str, set[str]]]:
    """For each part: each of its modules and the other parts it imports."""
    return {
        part: {
            str(path.relative_to(ROOT)): _imported_parts(path) - {part} for path in _modules(part)
        }
        for part in PARTS
    }


def test_parts_import_only_across_allowed_boundaries():
    broken = [
        f"{module} imports {sorted(imported & FORBIDDEN[part] - ALLOWED.get(module, set()))}"
        for part, modules in _part_imports().items()
        for module, imported in modules.items()
        if imported & FORBIDDEN[part] - ALLOWED.get(module, set())
    ]
    assert not broken, broken


def test_workflows_name_no_other_part_even_for_the_type_checker():
    named = {
        str(path.relative_to(ROOT)): {
            part
            for node in ast.walk(ast.parse(path.read_text()))
            for name in (
                [
                    f"{node.module}.{a.name}" if node.module == PKG else node.module
                    for a in node.names
                ]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if (part := _part(name)) is not None
        }
        for path in _modules("workflows")
    }
    broken = {m: sorted(p & FORBIDDEN["workflows"]) for m, p in named.items()}
    assert not {m: p for m, p in broken.items() if p}, broken


def test_no_part_imports_one_that_imports_it_back():
    edges = {
        part: set().union(*modules.values()) - set().union(*ALLOWED.values())
        if part == "worker"
        else set().union(*modules.values())
        for part, modules in _part_imports().items()
    }

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges[start]
        )

    cycles = sorted(part for part in PARTS if reaches(part, part))
    assert not cycles, {part: sorted(edges[part]) for part in cycles}


def _workflow_module_imports() -> dict[str, set[str]]:
    """Each module of ``workflows/`` and the modules of ``workflows/`` it imports, anywhere."""
    prefix = f"{PKG}.workflows"
    found: dict[str, set[str]] = {}
    for path in _modules("workflows"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == prefix:  # from ...workflows import audit, config
                    deps.update(alias.name for alias in node.names)
                elif node.module.startswith(f"{prefix}."):
                    deps.add(node.module.removeprefix(f"{prefix}.").split(".")[0])
        found[path.stem] = deps - {path.stem}
    return found


def test_no_module_of_workflows_imports_another_in_a_circle():
    """The turn's parts are handed callables, not the machine: no module of ``workflows/``
    reaches itself through its imports (``__init__`` re-exports, and is no module's own)."""
    edges = {m: d - {"__init__"} for m, d in _workflow_module_imports().items()}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges.get(start, ())
        )

    assert "turn" in edges["tool_step"] or "subagents" in edges["tool_step"]  # the graph is read
    circles = sorted(m for m in edges if m != "__init__" and reaches(m, m))
    assert not circles, {m: sorted(edges[m]) for m in circles}


MAX_CLASS_LINES = 450
"""The most lines a class of ``workflows/`` may take: the core stays in parts, each with a
narrow interface, where the next features land as parts of their own."""

MAX_CONVERSATION_LINES = 650


def test_the_workflow_core_stays_in_parts():
    big = {
        f"{path.name}:{node.name}": node.end_lineno - node.lineno + 1
        for path in _modules("workflows")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    }
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"
    conversation = ROOT / "workflows" / "conversation.py"
    lines = len(conversation.read_text().splitlines())
    assert lines <= MAX_CONVERSATION_LINES, f"conversation.py is {lines} lines"


def test_the_boundary_check_sees_imports(tmp_path):
    """The checks above pass only if the parser finds imports: a module-level one, one inside a
    function, one from the root, and none under TYPE_CHECKING."""
    module = tmp_path / "sample.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        f"import {PKG}.worker.devserver\n"
        "from temporal_agent_interrupts import codec\n"
        "if TYPE_CHECKING:\n"
        "    from examples import ALL_AGENTS\n"
        "def f():\n"
        f"    from {PKG}.client.api import AgentClient\n"
    )
    assert _imported_parts(module) == {"worker", "client", SHARED}


def test_nothing_imports_the_design_cards_folders_by_their_bare_names():
    """From a clone ``import workflows`` would still work (the folders are at the top), and load
    a second copy of every module beside the package's: two ``TurnResult`` classes, two
    registries. Every module in the repository imports them through the package."""
    bare = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in (".venv", PKG, "build") or "__pycache__" in relative.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            bare += [
                f"{relative}:{node.lineno} {n}" for n in names if n.split(".")[0] in SUBPACKAGES
            ]
    assert not bare, bare


def test_a_declared_tool_that_is_not_a_runtime_tool_is_refused_when_the_worker_is_built():
    from temporal_agent_interrupts.activities.runtime import AgentActivities
    from temporal_agent_interrupts.worker.result_keys import UNSIGNED
    from temporal_agent_interrupts.workflows import Agent
    from temporal_agent_interrupts.workflows.types import ToolSpec

    class Duck:
        name = "quack"

        def spec(self) -> ToolSpec:
            return ToolSpec(name="quack", description="", input_schema={"type": "object"})

    agent = Agent("ducks", model="gemini-test", tools=[Duck()])
    with pytest.raises(TypeError, match="not a tool: build tools with"):
        AgentActivities([agent], gemini=None, result_keys=UNSIGNED)  # type: ignore[arg-type]  # never reached: refused first

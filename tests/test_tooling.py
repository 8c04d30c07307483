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


@pytest.mark.parametrize(("body", "expected"), [("assert True", 0), ("assert False", 1)])
def test_exit_guard_keeps_pytests_verdict(tmp_path, body, expected):
    (tmp_path / "test_sample.py").write_text(f"def test_sample():\n    {body}\n")
    result = _run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "worker.pytest_plugin",
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
# What each top-level package may import, read from the source (ast), so that a new import
# across a boundary fails here rather than in a review. Imports under ``if TYPE_CHECKING:`` are
# for the type checker only and are not counted, except in ``workflows/``, which names no other
# package at all (``Agent`` takes tools through the ``ToolDeclaration`` protocol).

PACKAGES = ("workflows", "activities", "worker", "client", "examples")

FORBIDDEN = {
    # Deterministic code: it may not reach anything that does I/O or reads configuration.
    "workflows": {"activities", "worker", "client", "examples"},
    "activities": {"worker", "client", "examples"},
    # The worker imports the client (connection settings) and hosts the examples only by name
    # (``--agents examples:ALL_AGENTS``), so the demo can run a worker.
    "worker": {"examples"},
    "client": {"worker", "examples"},
    "examples": set(),
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_packages(path: Path) -> set[str]:
    """The top-level project packages ``path`` imports, anywhere but under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found & set(PACKAGES)


def _package_imports() -> dict[str, dict[str, set[str]]]:
    """For each package: each of its modules and the other packages it imports."""
    return {
        package: {
            str(path.relative_to(ROOT)): _imported_packages(path) - {package}
            for path in sorted((ROOT / package).rglob("*.py"))
        }
        for package in PACKAGES
    }


def test_packages_import_only_across_allowed_boundaries():
    broken = [
        f"{module} imports {sorted(imported & FORBIDDEN[package])}"
        for package, modules in _package_imports().items()
        for module, imported in modules.items()
        if imported & FORBIDDEN[package]
    ]
    assert not broken, broken


def test_workflows_name_no_other_package_even_for_the_type_checker():
    named = {
        str(path.relative_to(ROOT)): sorted(
            {
                (node.module or "").split(".")[0]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level == 0
            }
            | {
                alias.name.split(".")[0]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Import)
                for alias in node.names
            }
        )
        for path in sorted((ROOT / "workflows").rglob("*.py"))
    }
    broken = {m: [p for p in pkgs if p in FORBIDDEN["workflows"]] for m, pkgs in named.items()}
    assert not {m: p for m, p in broken.items() if p}, broken


def test_no_package_imports_one_that_imports_it_back():
    edges = {
        package: set().union(*modules.values()) for package, modules in _package_imports().items()
    }

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges[start]
        )

    cycles = sorted(package for package in PACKAGES if reaches(package, package))
    assert not cycles, {package: sorted(edges[package]) for package in cycles}


def test_the_boundary_check_sees_imports(tmp_path):
    """The checks above pass only if the parser finds imports: a module-level one, one inside a
    function, and none under TYPE_CHECKING."""
    module = tmp_path / "sample.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import worker.devserver\n"
        "if TYPE_CHECKING:\n"
        "    from examples import ALL_AGENTS\n"
        "def f():\n"
        "    from client.api import AgentClient\n"
    )
    assert _imported_packages(module) == {"worker", "client"}


def test_a_declared_tool_that_is_not_a_runtime_tool_is_refused_when_the_worker_is_built():
    from activities.runtime import AgentActivities
    from workflows import Agent
    from workflows.types import ToolSpec

    class Duck:
        name = "quack"

        def spec(self) -> ToolSpec:
            return ToolSpec(name="quack", description="", input_schema={"type": "object"})

    agent = Agent("ducks", model="gemini-test", tools=[Duck()])
    with pytest.raises(TypeError, match="not a tool: build tools with"):
        AgentActivities([agent], gemini=None)  # type: ignore[arg-type]  # never reached: refused first

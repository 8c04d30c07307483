"""Project tooling: lint and types are clean; the exit guard keeps pytest's verdict."""

from __future__ import annotations

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

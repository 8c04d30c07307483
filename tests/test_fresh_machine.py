"""``make test`` on a fresh machine needs no step by hand, and CI runs exactly that.

``.ci/run`` is ``make test`` from the repository root and nothing else; ``make test`` installs
the browser the browser tests drive (``scripts/install-chromium``, through the ``browser``
target) before it runs pytest; the script does nothing where a browser is already there or the
browser tests are skipped knowingly; and the npm packages of the AG-UI client
tests/test_agui_client.py drives (``npm ci`` from ``tests/agui_client``'s lockfile, through the
``agui-client`` target) when they are missing or the lockfile changed. It runs the suite on two
pytest-xdist workers (``tests/scheduling.py``). ``make dist`` builds the release as
tests/test_release.py checks it: offline, then twine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.scheduling import ALONE, CPU_HEAVY, CPU_HEAVY_UNIT, SLOWEST_FIRST

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-chromium"


def recipe(*targets: str) -> list[str]:
    """The commands ``make`` would run for ``targets`` (a dry run; the venv counted as set up),
    with the Makefile's defaults: not what this run's own make was given (``make test
    TEST_WORKERS=0`` passes its variables on through MAKEFLAGS)."""
    own = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "TEST_WORKERS")
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", *targets],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in own},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_ci_runs_make_test_and_nothing_else():
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"]


def test_make_test_installs_the_browser_before_it_runs_the_suite():
    commands = recipe("test")
    install = commands.index("bash scripts/install-chromium")
    pytest_run = next(i for i, c in enumerate(commands) if " -m pytest" in c)
    assert install < pytest_run, commands
    assert os.access(SCRIPT, os.X_OK)
    syntax = subprocess.run(
        ["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr


def test_make_test_installs_the_agui_client_from_its_lockfile_before_it_runs_the_suite():
    # -W: as if the lockfile had just changed, whatever is installed here now.
    commands = recipe("-W", "tests/agui_client/package-lock.json", "test")
    install = next(i for i, c in enumerate(commands) if "npm ci --prefix tests/agui_client" in c)
    pytest_run = next(i for i, c in enumerate(commands) if " -m pytest" in c)
    assert install < pytest_run, commands
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "tests/agui_client/node_modules/x"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, "tests/agui_client/node_modules is not git-ignored"
    lock = json.loads((ROOT / "tests" / "agui_client" / "package-lock.json").read_text())
    pinned = json.loads((ROOT / "tests" / "agui_client" / "package.json").read_text())
    assert lock["packages"][""]["dependencies"] == pinned["dependencies"]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in pinned["dependencies"].values())


def test_make_test_runs_the_suite_on_two_xdist_workers_sharing_it_by_file():
    (run,) = [c for c in recipe("test") if " -m pytest" in c]
    assert run.endswith("-m pytest -n 2 --dist loadfile"), run
    # The scheduler's lists name files and tests: a renamed one would silently leave them.
    named = {*CPU_HEAVY, *SLOWEST_FIRST} - {CPU_HEAVY_UNIT}
    assert named <= {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert set(CPU_HEAVY).isdisjoint(SLOWEST_FIRST)
    for nodeid in ALONE:
        path, _, name = nodeid.partition("::")
        assert f"\ndef {name}(" in (ROOT / path).read_text().replace("async def", "def"), nodeid


def test_make_dist_builds_offline_and_checks_with_twine():
    commands = recipe("dist")
    assert any("-m build --no-isolation --outdir dist ." in c for c in commands), commands
    assert commands[-1].endswith("twine check --strict dist/*"), commands

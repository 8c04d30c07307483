"""How ``make test`` shares the suite between its pytest-xdist workers (``-n 2 --dist loadfile``).

Each worker is a pytest session of its own, with its own dev servers (conftest's ``env`` and
``small_histories``): a file's tests run on one worker, after one another, as they do in a serial
run, so its module fixtures are set up once. Two changes to xdist's ``loadfile``:

- The files whose tests keep a core busy for long stretches are one unit, run on one worker one
  after another, never two at once: ``pyright`` over the project, the conversations of tens of
  thousands of calls in ``test_durable_input.py`` (each workflow activation there must finish
  within the SDK's 2 s deadlock limit, in a process that shares the machine's two cores with
  the other worker), and the benchmark's quick run (its workers are in process too).
- The slowest units go out first (xdist's own order is by number of tests), so that no long
  file starts near the end while the other worker has nothing left to do.

Measured on 2 cores; the order only balances the two workers, and a file missing from these
lists (a new one) is scheduled as xdist would.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

CPU_HEAVY = ("test_durable_input.py", "test_tooling.py", "test_bench.py")
"""The files run as one unit, never at the same time as each other."""

CPU_HEAVY_UNIT = "cpu-heavy"

SLOWEST_FIRST = (
    CPU_HEAVY_UNIT,
    "test_web_attacks.py",
    "test_agentctl_waits.py",
    "test_operator.py",
    "test_worker_cli.py",
    "test_data_protection.py",
    "test_trust_boundary.py",
    "test_hostile_input.py",
    "test_ui_browser.py",
    "test_newcomer.py",
    "test_release.py",
    "test_audit_trail.py",
    "test_codec_server_attacks.py",
    "test_worker_process.py",
)
"""Units that take 15 s or more (under the load of two workers), slowest first."""


class SlowestFilesFirst(LoadFileScheduling):
    """``--dist loadfile`` with :data:`CPU_HEAVY` as one unit and :data:`SLOWEST_FIRST` first."""

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        return CPU_HEAVY_UNIT if PurePosixPath(path).name in CPU_HEAVY else path

    def _assign_work_unit(self, node: WorkerController) -> None:
        # xdist takes the queue's first unit; a stable sort keeps its order for the rest.
        ordered = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
        self.workqueue.clear()
        self.workqueue.update(ordered)
        super()._assign_work_unit(node)


def _rank(scope: str) -> int:
    name = scope if scope == CPU_HEAVY_UNIT else PurePosixPath(scope).name
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

"""How ``make test`` shares the suite between its pytest-xdist workers (``-n 2 --dist loadfile``).

Each worker is a pytest session of its own, with its own dev servers (conftest's ``env`` and
``small_histories``): a file's tests run on one worker, after one another, as they do in a serial
run, so its module fixtures are set up once. Three changes to xdist's ``loadfile``:

- The files whose tests keep a core busy for long stretches are one unit, run on one worker one
  after another, never two at once: ``pyright`` over the project, the long conversations of
  maximum-size inputs in ``test_durable_input.py`` (each workflow activation there must finish
  within the SDK's 2 s deadlock limit, in a process that shares the machine's two cores with
  the other worker), the benchmark's quick run, and the soak's short run (three worker
  processes, a dev server, the web app and a CLI or two at a time: a core's worth of work for a
  minute and a half).
- The slowest units go out first (xdist's own order is by number of tests), so that no long
  file starts near the end while the other worker has nothing left to do.
- The tests in :data:`ALONE` run last, each once every other worker is idle: the machine to
  themselves, as in a serial run. The 40,960-call conversation is one: its workflow tasks take
  under 0.1 s each alone, yet with the other worker busy (its tests start CLIs and workers by
  the dozen) one of them passed the SDK's 2 s deadlock limit in a clean-clone run. The SDK
  measures that limit in wall time, so a starved process trips it however little work a task
  does; one core stays idle for the test's half-minute instead.

Measured on 2 cores; the order only balances the two workers, and a file missing from these
lists (a new one) is scheduled as xdist would.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

CPU_HEAVY = ("test_durable_input.py", "test_tooling.py", "test_bench.py", "test_soak.py")
"""The files run as one unit, never at the same time as each other."""

CPU_HEAVY_UNIT = "cpu-heavy"

ALONE = ("tests/test_durable_input.py::test_tens_of_thousands_of_tool_calls_still_continue_as_new",)
"""Tests run last, each with every other worker idle (their node ids)."""

SLOWEST_FIRST = (
    CPU_HEAVY_UNIT,
    "test_agentctl_waits.py",
    "test_soak_findings.py",
    "test_worker_cli.py",
    "test_data_protection.py",
    "test_trust_boundary.py",
    "test_web_attacks.py",
    "test_sub_agents_kill.py",
    "test_ending_attacks.py",
    "test_mcp_tools.py",
    "test_hostile_input.py",
    "test_operator.py",
    "test_newcomer.py",
    "test_codec_server_attacks.py",
    "test_streaming.py",
    "test_worker_process.py",
    "test_inbox_page.py",
    "test_release.py",
    "test_sub_agents_doors.py",
    "test_mcp_review_attacks.py",
    "test_audit_trail.py",
    "test_continue_as_new.py",
    "test_readme.py",
)
"""Units that take 15 s or more (under the load of two workers), slowest first."""


class SlowestFilesFirst(LoadFileScheduling):
    """``--dist loadfile`` with :data:`CPU_HEAVY` as one unit, :data:`SLOWEST_FIRST` first and
    :data:`ALONE` last, on an otherwise idle machine."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid in ALONE:
            return nodeid  # a unit of its own
        path = super()._split_scope(nodeid)
        return CPU_HEAVY_UNIT if PurePosixPath(path).name in CPU_HEAVY else path

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self.workqueue:
            return
        # xdist takes the queue's first unit; a stable sort keeps its order for the rest.
        ordered = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
        self.workqueue.clear()
        self.workqueue.update(ordered)
        if self._only_alone_left():
            # This worker takes them, once the others are done. A worker holds back its last
            # test until it knows the next one (for fixture teardown), so the others are told
            # to shut down: they run what they hold, then stop.
            others = [other for other in self.nodes if other is not node]
            for other in others:
                if not other.shutting_down:
                    other.shutdown()
            if any(self._pending_of(self.assigned_work[other]) for other in others):
                return  # asked again as their tests complete (mark_test_complete)
        super()._assign_work_unit(node)

    def mark_test_complete(
        self, node: WorkerController, item_index: int, duration: float = 0
    ) -> None:
        super().mark_test_complete(node, item_index, duration)
        if self._only_alone_left():
            for waiting in self.nodes:
                if waiting is not node and not waiting.shutting_down:
                    self._reschedule(waiting)

    def _only_alone_left(self) -> bool:
        return bool(self.workqueue) and all(scope in ALONE for scope in self.workqueue)


def _rank(scope: str) -> int:
    if scope in ALONE:
        return len(SLOWEST_FIRST) + 1
    name = scope if scope == CPU_HEAVY_UNIT else PurePosixPath(scope).name
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

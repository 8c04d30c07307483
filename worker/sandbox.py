"""The workflow sandbox this project's workers and replayers run in: what passes through it, and
the compiled-snippet instance that saves a worker's CPU on every workflow task.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import py_compile
from collections.abc import Sequence
from types import CodeType
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

# Private, for _CompiledInstance (see there for why, and what it relies on); temporalio is pinned
# to one minor release (pyproject.toml).
from temporalio.worker.workflow_sandbox._runner import _Instance

from temporal_agent_interrupts.errors import QUERY_PUT_OFF

log = logging.getLogger(__name__)

# Side-effect-free modules the workflow uses, passed through the sandbox in every runner: this
# avoids re-importing them for every workflow run (time and memory per conversation), and keeps
# one class per wire type: a model built by a passed-through module must be the same class the
# workflow validates against.
_DATA_AND_LIBRARIES = (
    "temporal_agent_interrupts.workflows.agent",
    "temporal_agent_interrupts.workflows.details",
    "temporal_agent_interrupts.workflows.history",
    "temporal_agent_interrupts.workflows.limits",
    "temporal_agent_interrupts.workflows.types",
    "temporal_agent_interrupts.workflows.interrupts",
    # The interrupt book's parts, which workflows.interrupts composes.
    "temporal_agent_interrupts.workflows.calls",
    "temporal_agent_interrupts.workflows.answers",
    "temporal_agent_interrupts.workflows.governance",
    "temporal_agent_interrupts.workflows.deadlines",
    "temporal_agent_interrupts.workflows.config",
    "temporal_agent_interrupts.workflows.identity",
    # Metrics and spans (workflows.telemetry): the tracing interceptor keeps its context in
    # OpenTelemetry's context variables, which must be the ones the workflow reads.
    "temporal_agent_interrupts.workflows.telemetry",
    "opentelemetry",
    "pydantic",
    "pydantic_core",
    "jsonschema",
    "referencing",
    "rpds",
    "attrs",
    "annotated_types",
    # Identity tokens (workflows.identity) need both. Re-imported in the sandbox, cryptography's
    # native module fails to load a second time, and PyJWT fails to import (its JWKS client
    # subclasses urllib.request's handlers) and reads datetime.now() in every decode, even with
    # its time checks off; passed through, that read is harmless (its value goes unused).
    "jwt",
    "cryptography",
)

PASSTHROUGH = (
    *_DATA_AND_LIBRARIES,
    # The workflow's own code too: the class and the rooms behind it (workflows.turn, .audit,
    # .operator_view, ...). None has module-level state, and every workflow call they make finds
    # the running workflow through the SDK's context, so one copy serves every conversation.
    # Re-imported per conversation, they were most of the cost of starting one (measured: the
    # rooms 12% of a cycle's worker CPU, then the class's module 2.3 ms of the 26 ms left) and
    # of the memory a cached one holds. What the sandbox's restrictions checked in them at run
    # time (no clock, randomness, I/O or environment), the replay tests check instead, replaying
    # every recorded history in the strict sandbox (sandbox_runner(strict=True)).
    "temporal_agent_interrupts.workflows",
)


def ensure_bytecode(modules: Sequence[str]) -> None:
    """Write the ``.pyc`` of modules the sandbox re-imports for every workflow run.

    The sandbox runs the workflow module afresh for each workflow instance. With
    ``PYTHONDONTWRITEBYTECODE=1`` (common in containers, and set on our CI machine) Python never
    caches its bytecode, so every new or evicted conversation recompiled the module from source:
    measured as the largest single cost of starting a conversation. Reading a ``.pyc`` is allowed
    under that setting; only writing is suppressed, so we write it explicitly, once per start.
    """
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py"):
            continue
        try:
            py_compile.compile(origin, cfile=importlib.util.cache_from_source(origin), doraise=True)
        except (OSError, py_compile.PyCompileError) as e:  # a read-only install still works
            log.debug("could not cache bytecode for %s: %s", name, e)


@functools.lru_cache(maxsize=32)
def _compiled(code: str) -> CodeType:
    # "<string>" is what exec() of the same text would name it: tracebacks stay as they were.
    return compile(code, "<string>", "exec")


class _CompiledInstance(_Instance):
    """The SDK's sandboxed instance, with its few fixed snippets compiled once, not per call.

    The sandbox reaches into the workflow by exec() of short source strings, and the data
    converter asks it for a serialization context once per payload per pass (seven passes per
    workflow task), so each workflow task compiled the same two lines dozens of times: measured
    as 5.5% of a worker's CPU over an approval cycle, about 1.8 ms of its 26 ms, half of it the
    compiling. exec() takes a code object as well as a string, so this changes nothing else.
    Measured again once the workflow's own code passed through the sandbox: B1's cycle is 3.7%
    longer without it (median of ten paired rounds, 73.3 against 75.2 ms; 1.025 to 1.048, where
    the same worker against itself spreads 0.995 to 1.016) and its CPU 7% more.

    Private, and no public API serves: the SDK offers no hook around the sandbox's exec(), and a
    runner of our own would mean re-implementing the sandbox. What it relies on:
    ``_Instance(instance_details, runner_class, restrictions)`` is what
    ``SandboxedWorkflowRunner.create_instance`` builds, and every exec() goes through
    ``_run_code(code, **extra_globals)`` with a few fixed strings (tests/test_library_guards.py:
    test_sandbox_instance_is_the_one_compiled_instance_extends). temporalio is pinned to one
    minor release (pyproject.toml), which keeps it stable between upgrades.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = QueryTimeGuard()

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        super()._run_code(_compiled(code), **extra_globals)  # type: ignore[arg-type] -- exec() takes either

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        refused = self._guard.refuse(act, workflow_id=self.instance_details.info.workflow_id)
        return refused if refused is not None else super().activate(act)


class QueryTimeGuard:
    """Refuses the activation the SDK makes of a conversation's new events while it answers a
    query, before any workflow task has brought them, so that what it makes of them is never
    sent.

    When a query reaches a worker directly, with events the run's workflow task has not yet
    taken (its worker died, or the server restarted, so the task waits out the dead sticky
    queue), temporalio 1.35 runs the workflow on those events (a signal, a fired timer, an
    activity's result) to answer the query, keeps the commands it made, and sends them with
    the next task. When that task also brings an update, or a signal, history records the
    event's commands before the update's acceptance, while every replay runs them together,
    the update first: the run no longer replays, and every worker without it in its cache fails
    its tasks for good (tests/test_soak_findings.py; ``python -m bench.soak.sdk_query_repro``
    shows it with a bare workflow).

    That activation is told by its clock: a workflow task starts with a new time and the id of
    its started event as the history's length, and every activation of the same task repeats
    both; this one has the new events (a longer history) but no new task, so the time of the
    last one. Refusing it fails the query (its message says to ask again, and the client does)
    and evicts the run, so the task that brings those events replays them from history with
    whatever else it brings, as every replay will. A false alarm on a real task fails that task
    once; the retry starts from a replay, where nothing repeats a time. That takes two tasks
    starting at the same instant: the dev server's and Temporal's clocks have nanoseconds, the
    time-skipping test server's whole milliseconds (a reviewer saw none in 85 fast tasks).
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None  # (time, history length) of the last activation

    def refuse(
        self, act: WorkflowActivation, *, workflow_id: str
    ) -> WorkflowActivationCompletion | None:
        kinds = {job.WhichOneof("variant") for job in act.jobs}
        if not kinds or kinds <= _NOT_WORK:
            return None  # a query or an eviction: it neither moves the clock nor makes commands
        now = (act.timestamp.ToNanoseconds(), act.history_length)
        last, self._last = self._last, now
        if act.is_replaying or last is None or now[0] != last[0] or now[1] == last[1]:
            return None
        log.warning(
            "conversation %s: refused to run the workflow on events no workflow task has "
            "brought yet (history %d, at the time of the task of history %d) while answering "
            "a query; the task that brings them will run them",
            workflow_id,
            now[1],
            last[1],
        )
        self._last = last
        completion = WorkflowActivationCompletion(run_id=act.run_id)
        completion.failed.failure.message = QUERY_PUT_OFF
        return completion


_NOT_WORK = frozenset({"query_workflow", "remove_from_cache"})


class GuardedRunner(WorkflowRunner):
    """Another runner (a team's unsandboxed one), with :class:`QueryTimeGuard` before each of
    its instances: what the sandbox runner has built in (``_CompiledInstance``)."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self.inner = inner

    def prepare_workflow(
        self, defn: Any
    ) -> None:  # a private SDK type: temporalio.workflow._Definition
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _GuardedInstance(self.inner.create_instance(det), det.info.workflow_id)

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self.inner.set_worker_level_failure_exception_types(types)


class _GuardedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, workflow_id: str) -> None:
        self._inner = inner
        self._workflow_id = workflow_id
        self._guard = QueryTimeGuard()

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        refused = self._guard.refuse(act, workflow_id=self._workflow_id)
        return refused if refused is not None else self._inner.activate(act)

    def get_info(self) -> Any:  # temporalio.workflow.Info, as the SDK declares it
        return self._inner.get_info()

    def get_serialization_context(self, command_info: Any) -> Any:  # the SDK's private types
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:  # the SDK's private types
        return self._inner.get_external_store_context(command_info)


class OurRunner(SandboxedWorkflowRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledInstance(det, self.runner_class, self.restrictions)


def sandbox_runner(*, strict: bool = False) -> SandboxedWorkflowRunner:
    """The workflow sandbox with this project's pass-through modules (workers and replayers).

    Args:
        strict: Re-import the workflow's own code (``workflows`` but its data modules) for
            every run, as the SDK does by default, so the sandbox's restrictions see each call
            it makes. Slower; for replay tests, which check with it what production trusts.
    """
    modules = _DATA_AND_LIBRARIES if strict else PASSTHROUGH
    return OurRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*modules))

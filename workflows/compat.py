"""The compatibility gate: which rules a run was begun under, decided once per run.

Rules added while conversations were already running change which input a handler accepts and
which commands a turn issues, so a run begun before them must replay as it ran. Temporal's patch
marker says which kind of run this is: a new run records the marker first thing (in the
workflow's ``__init__``, before any handler runs, since validators read the rules and may not
record a marker themselves); asking in a run begun earlier records nothing, because its history
has no such marker. Runs begun by continue-as-new are new runs.

Three generations exist:

- ``turn-edges-2026-11`` (:attr:`Rules.edges`): the cancellation and pause fixes. Runs begun
  before the durable-input rules asked for it first thing in ``run``, or earlier in a handler of
  the same first task (after an update's acceptance); it is asked for lazily, in the same
  places, so those runs replay exactly.
- ``durable-input-2026-12`` (:attr:`Rules.durable`): the door, the budgets, one approval one
  run, failed turns that keep what happened, history bounds. It implies the edges.
- ``governance-2026-12`` (:attr:`Rules.governance`): every answer record is also written to
  the memo, so the full audit trail stays in history across runs (a memo upsert where a run
  wrote none before). It implies the durable-input rules; a new run records only this marker.

Every other module takes the answer as a plain ``strict``/``durable`` flag; only this one asks
Temporal. Remove the old branches once no run without the marker can be open (the Temporal UI
lists each run's start; runs older than the marker's date are the ones to wait for).
"""

from __future__ import annotations

from temporalio import workflow

from workflows.limits import MAX_JSON_DEPTH, SERIALIZABLE_DEPTH

TURN_EDGES_PATCH = "turn-edges-2026-11"
DURABLE_INPUT_PATCH = "durable-input-2026-12"
GOVERNANCE_PATCH = "governance-2026-12"


class Rules:
    """The rules of this run. Construct it in the workflow's ``__init__``.

    Args:
        declared: The rules the run's input declares (``ConversationInput.rules``). A run our
            client or continue-as-new begins declares the newest, so it records no marker (an
            event in every new conversation); a run begun any other way asks as before.
    """

    def __init__(self, declared: str | None = None) -> None:
        self.declared = declared == GOVERNANCE_PATCH
        if self.declared and workflow.unsafe.is_replaying():
            # The history decides, not the input: a worker from before this rule ignored the
            # declaration and recorded the marker of the rules it ran (which must be asked for
            # again, or the replay fails), and a worker that took the declaration recorded none.
            if workflow.patched(GOVERNANCE_PATCH):
                self.governance = True
            elif workflow.patched(DURABLE_INPUT_PATCH):
                # A worker of the release before ran it. (Workers go out before clients, see
                # the README: no client that declares reaches a worker older than that.)
                self.governance = False
                self.declared = False
            else:
                self.governance = True  # declared, and taken by a worker that knows it
        else:
            # One marker per run: a new run records only the newest generation, which implies
            # the older ones; a run begun earlier has no such marker and asks for its own.
            self.governance = self.declared or workflow.patched(GOVERNANCE_PATCH)
        self.durable: bool = self.governance or workflow.patched(DURABLE_INPUT_PATCH)
        self._edges: bool | None = True if self.durable else None

    def edges(self) -> bool:
        """Whether this run has the cancellation and pause fixes (asked for on first use)."""
        if self._edges is None:
            self._edges = workflow.patched(TURN_EDGES_PATCH)
        return self._edges

    @property
    def depth(self) -> int:
        """The deepest nesting this run accepts (older runs: only what cannot be stored)."""
        return MAX_JSON_DEPTH if self.durable else SERIALIZABLE_DEPTH

"""The soak's records outside Temporal, in SQLite files of the run's own directory.

- :class:`Ledger`, the "payment provider": every run of a gated or conditional tool writes a row
  (chat id, ref, idempotency key, tool, arguments, worker pid, time), from whichever worker
  process ran it. There is no unique constraint: a duplicate run is a second row, counted and
  reported by the checks, never hidden by the database.
- :class:`ModelCalls`, shared by the workers' scripted models: how many attempts each model call
  has had (a fault is injected into the first attempt only, whichever worker takes it) and every
  fault injected, with its time.

Each connection is opened per write: the writers are separate processes, any of which may be
killed mid-write (SQLite's journal keeps the file whole), and writes are rare enough that a
connection each costs nothing that matters.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another's lock: many processes write at once."""


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


@dataclass(frozen=True)
class Run:
    """One run of a tool that acts on the world, as the ledger recorded it."""

    chat_id: str
    ref: str
    idempotency_key: str
    tool: str
    phase: str
    """``effect``: the tool took effect (the payment was made); ``interrupt``: a conditional
    tool's first run, which paused for approval and did nothing."""
    args: dict[str, Any]
    resumed: bool
    pid: int
    at: float


class Ledger:
    """The payment provider's book (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> None:
        with _connect(self.path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            # Deliberately no UNIQUE constraint: duplicates must show, not be refused.
            conn.execute(
                "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, chat_id TEXT, ref TEXT,"
                " idempotency_key TEXT, tool TEXT, phase TEXT, args TEXT, resumed INTEGER,"
                " pid INTEGER, at REAL)"
            )

    def record(self, run: Run) -> None:
        conn = _connect(self.path)
        try:
            conn.execute(
                "INSERT INTO runs (chat_id, ref, idempotency_key, tool, phase, args, resumed, pid,"
                " at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.chat_id,
                    run.ref,
                    run.idempotency_key,
                    run.tool,
                    run.phase,
                    json.dumps(run.args, sort_keys=True),
                    int(run.resumed),
                    run.pid,
                    run.at,
                ),
            )
        finally:
            conn.close()

    def runs(self) -> list[Run]:
        conn = _connect(self.path)
        try:
            rows = conn.execute(
                "SELECT chat_id, ref, idempotency_key, tool, phase, args, resumed, pid, at"
                " FROM runs ORDER BY id"
            ).fetchall()
        finally:
            conn.close()
        return [
            Run(
                chat_id=r[0],
                ref=r[1],
                idempotency_key=r[2],
                tool=r[3],
                phase=r[4],
                args=json.loads(r[5]),
                resumed=bool(r[6]),
                pid=r[7],
                at=r[8],
            )
            for r in rows
        ]


@dataclass(frozen=True)
class ModelFault:
    """A fault injected into a model call: ``kind`` is ``http429``, ``http503`` or ``hang``."""

    kind: str
    chat_id: str
    key: str
    pid: int
    at: float


class ModelCalls:
    """Attempts per model call, and the faults injected (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> None:
        with _connect(self.path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT PRIMARY KEY, n INTEGER)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS faults (id INTEGER PRIMARY KEY, kind TEXT,"
                " chat_id TEXT, key TEXT, pid INTEGER, at REAL)"
            )

    def attempt(self, key: str) -> int:
        """Count one more attempt of the call ``key``; returns its number (1 for the first)."""
        conn = _connect(self.path)
        try:
            row = conn.execute(
                "INSERT INTO attempts (key, n) VALUES (?, 1)"
                " ON CONFLICT(key) DO UPDATE SET n = n + 1 RETURNING n",
                (key,),
            ).fetchone()
        finally:
            conn.close()
        return int(row[0])

    def fault(self, fault: ModelFault) -> None:
        conn = _connect(self.path)
        try:
            conn.execute(
                "INSERT INTO faults (kind, chat_id, key, pid, at) VALUES (?, ?, ?, ?, ?)",
                (fault.kind, fault.chat_id, fault.key, fault.pid, fault.at),
            )
        finally:
            conn.close()

    def faults(self) -> list[ModelFault]:
        conn = _connect(self.path)
        try:
            rows = conn.execute("SELECT kind, chat_id, key, pid, at FROM faults ORDER BY id")
            return [ModelFault(*r) for r in rows.fetchall()]
        finally:
            conn.close()


def now() -> float:
    """Wall-clock time, the clock every process of the run shares."""
    return time.time()

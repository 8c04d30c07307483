"""Heartbeating while an activity waits, shared by the model, tool and sub-agent activities.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity


@asynccontextmanager
async def heartbeating(
    every: float, *, details: tuple[Any, ...] = (), at_once: bool = False
) -> AsyncIterator[None]:
    """Heartbeat in the background while the body waits on I/O.

    The first beat comes only after ``every`` seconds, so a fast call costs no extra RPC; unless
    ``at_once``, for ``details`` a retry must find even when this attempt is lost soon after it
    starts (``activity.info().heartbeat_details`` in the next attempt).
    """

    async def beat() -> None:
        if at_once:
            activity.heartbeat(*details)
        while True:
            await asyncio.sleep(every)
            activity.heartbeat(*details)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()

"""Heartbeating while an activity waits, shared by the model, tool and sub-agent activities."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity


@asynccontextmanager
async def heartbeating(every: float) -> AsyncIterator[None]:
    """Heartbeat in the background while the body waits on I/O.

    The first beat comes only after ``every`` seconds, so a fast call costs no extra RPC.
    """

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()

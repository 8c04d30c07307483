"""What AG-UI reconnects to idle threads cost: ``python -m bench.agui_reconnects [SECONDS]``.

Issue 44, finding 7: 20 reconnects (``Last-Event-ID`` naming an idle thread's next run) polled at
74.5 queries/s for as long as their clients stayed. This serves ``agents_app`` over a loopback
port, with an in-process worker on the embedded dev server, opens 20 such reconnects (each
reconnecting at once when its stream ends, as a client does) for SECONDS (default 60), and
prints the queries the app asked per second and the CPU this process (app and worker) used.
Then it times the ``status`` query on a conversation whose state is about 1 MB.

Measured on 2 shared cores (commit a2ff364 and after, against 2c18463 before):

- before: 58.6 queries/s (half ``status``), this process 35% of a core;
- after: 6.7 queries/s (one ``status`` per stream, then only the stream offset), 5%.
- ``status`` on a 1.2 MB state, end to end: median 19.4 ms before, 22.5 ms after (noise: the
  round trip dominates there; the carried size, 3 ms at 500 KB and 47 ms past the carry budget
  in process, is now worked out once per state instead of on every call).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import Counter
from typing import Any

import httpx2

from temporal_agent_interrupts import Agent
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.worker.standin import text
from temporal_agent_interrupts.worker.testing import ScriptedModel, dev_server, hosted
from tests.web import frames, run_input, served

RECONNECTS = 20


async def main(seconds: float) -> None:
    asked: Counter[str] = Counter()
    query = Chat._query

    async def counted(self: Chat, what: Any, *args: Any, **kwargs: Any) -> Any:
        asked[what if isinstance(what, str) else what.__name__] += 1
        return await query(self, what, *args, **kwargs)

    agent = Agent(f"bench-{uuid.uuid4().hex[:8]}", model="gemini-test")
    big = "x" * 200_000
    model = ScriptedModel([text("hi")] + [text(big)] * 5)
    async with dev_server() as env, hosted(env.client, agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        # Room for all 20 on one chat however slots are counted (per chat before issue 44).
        app = agents_app(
            agents, identity=lambda r: r.headers.get("x-user"), streams_per_chat=RECONNECTS
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=None) as http:
            url = f"{base}/agui/{agent.name}"
            nxt = await next_offset(chat)

            async def reconnecting(i: int) -> None:
                headers = {"X-User": f"user{i}@example.com", "Last-Event-ID": f"{nxt}/{nxt}.0"}
                while True:
                    await frames(http, url, run_input(chat.id), headers=headers)

            Chat._query = counted  # type: ignore[method-assign]  # counting, for this run only
            cpu, wall = time.process_time(), time.monotonic()
            tasks = [asyncio.create_task(reconnecting(i)) for i in range(RECONNECTS)]
            await asyncio.sleep(seconds)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            Chat._query = query
        total = sum(asked.values())
        print(
            f"{RECONNECTS} reconnects for {wall:.0f} s: {total / wall:.1f} queries/s "
            f"({dict(asked)}), this process {100 * cpu / wall:.0f}% of a core"
        )
        # The status query on a conversation of about 1 MB.
        for i in range(5):
            await chat.send(f"more {i}")
        times = []
        status = await chat.status()
        for _ in range(20):
            started = time.perf_counter()
            status = await chat.status()
            times.append(time.perf_counter() - started)
        times.sort()
        print(
            f"status on a {status.carried_bytes} byte state: median "
            f"{1000 * times[len(times) // 2]:.1f} ms, max {1000 * times[-1]:.1f} ms (20 queries)"
        )


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))

"""What followers cost an answer: ``python -m bench.followers [--rounds N] [--chats N]``.

Issue 51, "answers never starved by watchers". On the embedded dev server, with an in-process
worker and a scripted model that answers at once:

(a) One chat paused at an approval, answered (``Chat.resume``, timed from the call to its
    result) with no follower attached, and with 50 stream followers (``Chat.events``) attached,
    in interleaved rounds; the median of each and their ratio.
(b) ``--chats`` chats (default 1,000), each with one AG-UI follower over HTTP (a reattach with
    ``Last-Event-ID`` naming the thread's next run) to one web process of its own (``agents_app``
    on uvicorn, ``client.web.serve``, as ``agent-worker --web`` serves it); then a message to
    every chat, :data:`SENDS_AT_ONCE` at a time. Every follower must end with its run's
    ``RUN_FINISHED`` and the reply's text. The web process's own end (exit status or signal)
    is reported as it happens; a failure of the bench is reported before it stops the web
    process.
    The web process's RSS and CPU are read from /proc; one chat's answer is timed as in (a)
    while the followers are attached and the messages are sent, against before they were.

Prints a table for docs/performance.md. Timings on a shared 2-core machine move by 20-30%
between runs: read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from typing import Any

import httpx2
from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.client import RPCError
from temporalio.service import RPCStatusCode

from temporal_agent_interrupts import Agent, AgentClient, FinishReason, ToolApproval
from temporal_agent_interrupts.client.api import Chat
from temporal_agent_interrupts.client.stream import next_offset
from temporal_agent_interrupts.errors import AgentError
from temporal_agent_interrupts.worker.standin import Request, calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, dev_server, hosted
from tests import agents as t
from tests.helpers import free_port, server_address
from tests.web import frames, run_input

WEB_PROCESS = textwrap.dedent(
    """
    import asyncio, faulthandler, sys
    from datetime import timedelta
    from temporal_agent_interrupts import AgentClient
    from temporal_agent_interrupts.client.web import agents_app, serve

    faulthandler.enable()

    async def main(address, namespace, queue, port):
        agents = await AgentClient.connect(address, namespace=namespace, task_queue=queue)
        app = agents_app(
            agents,
            identity=lambda request: request.headers.get("x-user"),
            reattach_wait=timedelta(minutes=30),
        )
        await serve(app, port=int(port))

    asyncio.run(main(*sys.argv[1:]))
    """
)


SENDS_AT_ONCE = 50
"""Messages, and the bench's own offset queries, in flight at once in (b), as the chats are
made. The web process that "ended without a word" at 1,000 chats was stopped by this bench
(its SIGTERM, traced): one of the 1,000 messages sent at once raised ``NoWorkerAnswered``
(60 s) in the one in-process worker, whose stop then hung before the error was printed. 1,000
offset queries at once outwaited the server (30 s) in the same way."""


def respond(request: Request) -> dict[str, Any]:
    """The model: asks to look a key up when told to pay, says done after the tool's result,
    and answers anything else with its text."""
    if request.function_responses():
        return text("done")
    said = "".join(p.get("text", "") for p in request.last_parts)
    if said == "pay":
        return calls(("lookup", {"key": "k"}, "c1"))
    return text(f"reply to {said}")


REFUSED: Counter[str] = Counter()
"""Sends and answers the server refused while the chat's workflow task was being retried
(after a timeout: the worker took over 10 s), by what was refused; each is sent again."""


def task_retrying(error: AgentError) -> bool:
    """Whether the server refused an update because the workflow task is being retried
    (FAILED_PRECONDITION: "Workflow Task in failed state"); the product raises it as is."""
    cause = error.__cause__
    return isinstance(cause, RPCError) and cause.status == RPCStatusCode.FAILED_PRECONDITION


async def paused(chat: Chat) -> Any:
    while True:
        try:
            result = await chat.send("pay")
            break
        except AgentError as e:
            if not task_retrying(e):
                raise
            REFUSED["send"] += 1
            await asyncio.sleep(1)
    assert result.finish_reason == FinishReason.INTERRUPTED, result
    return result.interrupts[0]


async def answer_time(chat: Chat, pending: Any) -> float:
    began = time.perf_counter()
    result = await chat.resume(answers=[pending.approve()], identity="bench@example.com")
    took = time.perf_counter() - began
    assert result.finish_reason == FinishReason.STOP and result.text == "done", result
    return took


async def follower(chat: Chat, start: int) -> int:
    """Events from ``start`` until a turn ends other than paused; how many."""
    n = 0
    async for event in chat.events(after=start - 1):
        n += 1
        result = event.result
        if result is not None and result.finish_reason != FinishReason.INTERRUPTED:
            return n
    return n


async def many_followers(chat: Chat, rounds: int, followers: int) -> dict[str, Any]:
    bare: list[float] = []
    watched: list[float] = []
    got: set[int] = set()
    for _ in range(rounds):
        pending = await paused(chat)
        bare.append(await answer_time(chat, pending))
        pending = await paused(chat)
        start = await next_offset(chat)
        tasks = [asyncio.create_task(follower(chat, start)) for _ in range(followers)]
        await asyncio.sleep(1.0)  # attached and waiting
        watched.append(await answer_time(chat, pending))
        got |= set(await asyncio.wait_for(asyncio.gather(*tasks), 120))
    return {
        "bare_ms": statistics.median(bare) * 1000,
        "watched_ms": statistics.median(watched) * 1000,
        "ratio": statistics.median(watched) / statistics.median(bare),
        "events_per_follower": sorted(got),
    }


def progress(what: str) -> None:
    print(f"  ... {what}", file=sys.stderr, flush=True)


def proc_fds(pid: int) -> int:
    """File descriptors process ``pid`` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_figures(pid: int) -> tuple[float, float]:
    """RSS in MiB and CPU seconds (user + system) of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


async def task_failures(chat: Chat) -> list[str]:
    """The workflow task failures and timeouts in ``chat``'s history, as their causes."""
    found = []
    async for event in chat.handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            a = event.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(a.cause)
            found.append(f"#{event.event_id} failed {cause}: {a.failure.message[:300]}")
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            a = event.workflow_task_timed_out_event_attributes
            found.append(f"#{event.event_id} timed out ({TimeoutType.Name(a.timeout_type)})")
    return found


async def web_exit(web: subprocess.Popen[bytes]) -> None:
    """Waits while the web process runs; raises, saying how, once it has ended by itself."""
    while web.poll() is None:  # noqa: ASYNC110  # a child process's end has no event to await here
        await asyncio.sleep(0.5)
    code = web.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    raise RuntimeError(f"the web process ended by itself ({how}); its stderr is above")


async def one_each(
    agents: AgentClient, agent: Agent, cycle: Chat, count: int, samples: int
) -> dict[str, Any]:
    port = free_port()
    web = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WEB_PROCESS,
            server_address(agents.temporal),
            agents.temporal.namespace,
            agents.task_queue,
            str(port),
        ]
    )
    # The web process's own end is raced against the run, so that it is reported as it
    # happens; and the run's own failure is reported before the web process is stopped.
    run = asyncio.ensure_future(load_web(agents, agent, cycle, count, samples, web, port))
    ended = asyncio.ensure_future(web_exit(web))
    try:
        await asyncio.wait({run, ended}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            ended.result()  # raises how it ended
        return run.result()
    except BaseException as e:
        progress(f"(b) stopped: {e!r}; the bench now stops the web process ({web.poll()})")
        with contextlib.suppress(Exception):
            progress(f"the answered chat's failed workflow tasks: {await task_failures(cycle)}")
        raise
    finally:
        ended.cancel()
        web.terminate()
        web.wait(10)


async def load_web(
    agents: AgentClient,
    agent: Agent,
    cycle: Chat,
    count: int,
    samples: int,
    web: subprocess.Popen[bytes],
    port: int,
) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(timeout=None, limits=limits) as http:
        for _ in range(200):
            try:
                await http.get(f"{base}/api/inbox")
                break
            except httpx2.TransportError:
                await asyncio.sleep(0.1)
        at_once = asyncio.Semaphore(SENDS_AT_ONCE)

        async def send(chat: Chat, text: str) -> None:
            async with at_once:
                await chat.send(text)

        began = time.perf_counter()
        chats = [await agents.chat(agent.name) for _ in range(count)]
        await asyncio.gather(*(send(c, "hello") for c in chats))
        made = time.perf_counter() - began
        progress(f"{count} chats made in {made:.0f} s")
        before = []
        for _ in range(samples):
            before.append(await answer_time(cycle, await paused(cycle)))
        rss_idle, cpu_idle = proc_figures(web.pid)

        async def reattach(i: int, chat: Chat) -> list[Any]:
            async with at_once:  # a query each: 1,000 at once outwaited the server (30 s)
                nxt = await next_offset(chat)
            headers = {"X-User": f"user{i}@example.com", "Last-Event-ID": f"{nxt}/{nxt}.0"}
            return await frames(
                http, f"{base}/agui/{agent.name}", run_input(chat.id), headers=headers
            )

        fds_idle = proc_fds(web.pid)
        attaching = time.perf_counter()
        following = [asyncio.ensure_future(reattach(i, c)) for i, c in enumerate(chats)]
        try:
            # Attached once the web process holds a connection for each (a file descriptor):
            # they connect faster than it accepts, through a listen backlog of 128.
            for _ in range(600):
                if proc_fds(web.pid) - fds_idle >= count or all(f.done() for f in following):
                    break
                await asyncio.sleep(0.5)
            attach_s = time.perf_counter() - attaching
            rss_attached, cpu_attached = proc_figures(web.pid)
            progress(
                f"{sum(not f.done() for f in following)} followers waiting after {attach_s:.0f} "
                f"s; the web process holds {proc_fds(web.pid) - fds_idle} more file descriptors"
            )
            sending = asyncio.ensure_future(
                asyncio.gather(*(send(c, f"m{i}") for i, c in enumerate(chats)))
            )
            under = []
            for _ in range(samples):
                under.append(await answer_time(cycle, await paused(cycle)))
            await sending
            progress("messages answered")
            seen = await asyncio.wait_for(asyncio.gather(*following, return_exceptions=True), 600)
            rss_end, cpu_end = proc_figures(web.pid)
        finally:
            for f in following:
                f.cancel()
    failed = [s for s in seen if isinstance(s, BaseException)]
    for error in failed[:3]:
        progress(f"a follower failed: {error!r}")
    ends = Counter(
        "nothing"
        if not s
        else f"{s[-1].type} {s[-1].event.get('code', '')} {s[-1].event.get('message', '')}".strip()
        for s in seen
        if isinstance(s, list)
    )
    progress(f"how the followers' streams ended: {dict(ends)}")
    complete = sum(
        1
        for i, s in enumerate(seen)
        if isinstance(s, list)
        and s
        and s[-1].type == "RUN_FINISHED"
        and "".join(f.event.get("delta", "") for f in s) == f"reply to m{i}"
    )
    return {
        "chats": count,
        "made_s": made,
        "complete": complete,
        "failed": len(failed),
        "rss_idle_mib": rss_idle,
        "rss_attached_mib": rss_attached,
        "rss_end_mib": rss_end,
        "attach_s": attach_s,
        "cpu_attach_s": cpu_attached - cpu_idle,
        "cpu_turns_s": cpu_end - cpu_attached,
        "answer_before_ms": statistics.median(before) * 1000,
        "answer_under_ms": statistics.median(under) * 1000,
        "ratio": statistics.median(under) / statistics.median(before),
    }


async def main(rounds: int, chats: int, samples: int) -> None:
    agent = Agent(
        f"followers-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.lookup],
        middleware=[ToolApproval(allow=[])],
    )
    async with (
        dev_server() as env,
        # Every chat in the worker's cache (its default, 100, replays a chat for nearly every
        # task of (b), and its tasks outran their 10 s timeout on 2 shared cores).
        hosted(
            env.client,
            agents=[agent],
            model=ScriptedModel(respond),
            max_cached_workflows=chats + 100,
        ) as agents,
    ):
        cycle = await agents.chat(agent.name)
        a = await many_followers(cycle, rounds, 50)
        print(
            f"(a) 50 followers on one chat, {rounds} interleaved rounds: answer median "
            f"{a['bare_ms']:.1f} ms bare, {a['watched_ms']:.1f} ms watched: "
            f"{a['ratio']:.2f}x; events per follower {a['events_per_follower']}",
            flush=True,
        )
        b = await one_each(agents, agent, cycle, chats, samples)
        print(
            f"(b) {b['chats']} chats made in {b['made_s']:.0f} s; {b['complete']} of "
            f"{b['chats']} AG-UI followers got their run whole ({b['failed']} failed); web RSS "
            f"{b['rss_idle_mib']:.0f} MiB idle, {b['rss_attached_mib']:.0f} MiB attached, "
            f"{b['rss_end_mib']:.0f} MiB after the turns; web CPU {b['cpu_attach_s']:.1f} s "
            f"attaching ({b['attach_s']:.0f} s), {b['cpu_turns_s']:.1f} s for the turns; one "
            "chat's answer "
            f"{b['answer_before_ms']:.1f} ms before, {b['answer_under_ms']:.1f} ms under "
            f"load: {b['ratio']:.2f}x; refused while a workflow task was retried: "
            f"{dict(REFUSED) or 'none'}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="What followers cost an answer.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chats", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.chats, args.samples))

"""``agentctl``'s waits and exit codes, against the session's dev server.

``--wait`` is the caller's bound on how long a worker may take, not the Temporal server's: the
server gives up on a query by itself after about 30 s (or at once, when no worker has polled the
task queue lately), and agentctl asks again until its own deadline. Every command keeps the
README's exit-code table, with one line on stderr for every error. ``agentctl`` runs as the
installed console script in a subprocess; workers run in this process, on task queues of the
test's own, and are stopped to leave a conversation with no worker.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import pytest
from temporalio.client import Client

from temporal_agent_interrupts import Chat
from temporal_agent_interrupts.client.api import (
    AgentClient,
    ConnectionConfigError,
    ServerNotAnswering,
)
from temporal_agent_interrupts.errors import NoWorkerAnswered
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows import Agent
from temporal_agent_interrupts.workflows.types import TurnResult
from tests import agents as t
from tests import test_worker_cli
from tests.test_operator import AGENTCTL, Run, agentctl_env
from tests.test_worker_process import bare_environ

# A port that accepts connections and never answers (a pytest fixture, shared).
silent_server = test_worker_cli.silent_server

# The server's own limit on a query that no worker takes (measured: 29 s on the dev server).
# A wait longer than this proves agentctl asked again instead of taking the server's word.
LONG_WAIT = 45

# When the late worker of test_wait_outlasts_the_servers_own_query_timeout comes up: past the
# server's limit on a query agentctl asked once started (start-up and about 30 s), and before
# LONG_WAIT runs out. A fixed wait, not a wait for a state: it lets the server's limit pass.
LATE = 38


@dataclass(frozen=True)
class Done:
    """How an ``agentctl`` ended. Not how long it took: which bound ended a wait is told by
    the order things ended in, or by what the error says, never by a timed assertion."""

    run: Run


async def agentctl(
    client: Client,
    *args: str,
    task_queue: str,
    timeout: float = 120,
    environ: dict[str, str] | None = None,
) -> Done:
    """The installed ``agentctl``, with no terminal on stdin (``chat`` reads none).

    ``environ`` overrides variables of the environment every test gives it (the session's
    server, the test's task queue).
    """
    proc = await asyncio.create_subprocess_exec(
        str(AGENTCTL),
        *args,
        env={**agentctl_env(client, task_queue), **(environ or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    code = proc.returncode if proc.returncode is not None else -1
    return Done(Run(code, out.decode(), err.decode()))


T = TypeVar("T")


def one_line_error(run: Run) -> str:
    """The error: exactly one line on stderr, nothing on stdout, no traceback."""
    assert run.out == "", run
    assert run.err.endswith("\n") and run.err.count("\n") == 1, run
    assert run.err.startswith("agentctl: ") and "Traceback" not in run.err, run
    return run.err


async def paused(run_worker, model, *, task_queue: str) -> tuple[Agent, Chat, TurnResult]:
    """A conversation paused on an interrupt-only tool, and no worker on its queue any more."""
    agent = t.ops_agent()
    model.reply(calls(("approve", {"question": "ship?"}), say="I must ask first."))
    async with run_worker(agents=[agent], task_queue=task_queue) as agents:
        chat = await agents.chat(agent.name)
        res = await chat.send("ship it")
    assert [i.name for i in res.interrupts] == ["approve"]
    return agent, chat, res


def queue() -> str:
    return f"tq-waits-{uuid.uuid4()}"


async def test_wait_outlasts_the_servers_own_query_timeout(run_worker, model, client):
    tq, late_tq = queue(), queue()
    _, chat, res = await paused(run_worker, model, task_queue=tq)
    late_agent, late, _ = await paused(run_worker, model, task_queue=late_tq)
    ref = res.interrupts[0].ref
    # Each wait notes when it ended, in order, and so do the server's own limit (the API's wait
    # with no bound of its own, "server's limit") and the late worker's start: which bound
    # ended a wait, its own or the server's, is read from that order.
    happened: list[str] = []

    async def noted(name: str, waiting: Awaitable[T]) -> T:
        try:
            return await waiting
        finally:
            happened.append(name)

    async def api_wait(call, seconds: float | None) -> NoWorkerAnswered:
        with pytest.raises(NoWorkerAnswered) as e:
            await call(worker_timeout=None if seconds is None else timedelta(seconds=seconds))
        return e.value

    async def worker_comes_late() -> Done:
        # agentctl waits for a worker past the server's limit; one comes up after it.
        shown = asyncio.create_task(
            noted(
                "came",
                agentctl(client, "show", late.id, "--wait", "90", "--json", task_queue=late_tq),
            )
        )
        await asyncio.sleep(LATE)  # not waiting for a state: letting the server's limit pass
        assert not shown.done(), shown.result()
        async with run_worker(agents=[late_agent], task_queue=late_tq):
            happened.append("late worker up")
            return await shown

    def before(first: str, then: str) -> bool:
        return happened.index(first) < happened.index(then)

    # Concurrently, so the test takes one long wait, not several.
    long_args = ("approve", chat.id, ref, "--wait", str(LONG_WAIT))
    runs, api = await asyncio.gather(
        asyncio.gather(
            noted("long", agentctl(client, *long_args, task_queue=tq)),
            noted("short", agentctl(client, "approve", chat.id, ref, "--wait", "2", task_queue=tq)),
            noted("show short", agentctl(client, "show", chat.id, "--wait", "2", task_queue=tq)),
            worker_comes_late(),
        ),
        asyncio.gather(
            noted("api long", api_wait(chat.pending, LONG_WAIT)),
            noted("server's limit", api_wait(chat.pending, None)),
            noted("api status", api_wait(chat.status, 2)),
            noted("api history", api_wait(chat.history, 2)),
            noted("api rejections", api_wait(chat.rejections, 2)),
        ),
    )
    long, short, show_short, came = runs
    api_long, unbounded, *api_short = api

    assert long.run.code == 3, long
    # Still waiting once the server's limit had passed and the late worker had come up: it
    # asked again rather than taking the server's word.
    assert before("late worker up", "long"), happened
    err = one_line_error(long.run)
    assert f"no worker answered within {LONG_WAIT}s on task queue '{tq}'" in err
    assert "Nothing was sent" in err
    for name, quick in (("short", short), ("show short", show_short)):
        assert quick.run.code == 3, quick
        # Ended at its own 2 s, while the server still waited (its limit is about 30 s).
        assert before(name, "server's limit"), happened
        assert "no worker answered within 2s" in one_line_error(quick.run)
    # Only a command that would have sent something says that nothing was.
    assert "Nothing was sent" in short.run.err
    assert "Nothing was sent" not in show_short.run.err

    # The API: the wait asked for, as asked, in the exception and its message.
    assert api_long.waited == timedelta(seconds=LONG_WAIT) and not api_long.queued
    assert before("late worker up", "api long"), happened
    assert f"within {LONG_WAIT}s" in str(api_long)
    for name, no_worker in zip(
        ("api status", "api history", "api rejections"), api_short, strict=True
    ):
        assert no_worker.waited == timedelta(seconds=2) and "within 2s" in str(no_worker)
        assert before(name, "server's limit"), happened

    # No worker_timeout: the server's own limit ran out, and the exception says how long that
    # was (never "0s").
    assert unbounded.waited > timedelta(seconds=10) and not unbounded.queued
    assert "before the Temporal server stopped waiting (" in str(unbounded)
    assert "(0s)" not in str(unbounded)

    # Answered by the late worker, not ended by its own bound.
    assert came.run.code == 0, came
    assert came.run.json()["status"] == "interrupted"
    assert before("late worker up", "came"), happened


async def test_a_terminated_conversation_is_closed_with_nothing_to_answer(
    run_worker, model, client
):
    agent = t.ops_agent()
    tq = queue()
    model.reply(calls(("approve", {"question": "ship?"}), say="I must ask first."))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        ref = (await chat.send("ship it")).interrupts[0].ref
        await client.get_workflow_handle(chat.id).terminate("x")

        shown, as_json, answer = await asyncio.gather(
            agentctl(client, "show", chat.id, task_queue=tq),
            agentctl(client, "show", chat.id, "--json", task_queue=tq),
            agentctl(client, "approve", chat.id, ref, task_queue=tq),
        )
    assert shown.run.code == 0, shown
    assert "status closed (terminated)" in shown.run.out
    assert "Last turn 1 was cut off while paused on approve" in shown.run.out
    assert "the agent's last words before the pause: I must ask first." in shown.run.out
    # Nothing is offered to answer: no panel, no ref, no command.
    for offer in ("agentctl approve", "agentctl deny", "agentctl cancel", ref, "(paused) so far"):
        assert offer not in shown.run.out, shown

    assert as_json.run.code == 0, as_json
    view = as_json.run.json()
    assert (view["status"], view["pending"]) == ("closed", [])
    # The last turn is kept as it stood when the workflow was terminated.
    assert view["last_turn"]["finish_reason"] == "interrupted"

    assert answer.run.code == 2, answer
    assert f"conversation '{chat.id}' is closed (terminated)" in one_line_error(answer.run)

    # Without a worker, saying it is closed needs none; reading its last turn does. It ends
    # at its own 2 s: a query of the API with no bound of its own, asked alongside, is still
    # waiting on the server's limit (about 30 s) then.
    servers_limit = asyncio.create_task(_no_worker_answers(chat))
    try:
        quick = await agentctl(client, "show", chat.id, "--wait", "2", task_queue=tq)
        assert not servers_limit.done(), servers_limit
    finally:
        servers_limit.cancel()
    assert quick.run.code == 3, quick
    err = one_line_error(quick.run)
    assert f"conversation '{chat.id}' is closed (terminated) and has nothing pending" in err
    assert "no worker answered within 2s" in err
    # show sends nothing, so it says nothing about sending.
    assert "Nothing was sent" not in err, err
    assert "(`agentctl pending` works without a worker.)" in err


async def _no_worker_answers(chat: Chat) -> None:
    with pytest.raises(NoWorkerAnswered):
        await chat.history(worker_timeout=None)


COMMANDS: list[tuple[str, ...]] = [
    ("pending",),
    ("show", "CHAT"),
    ("respond", "CHAT", "REF", "{}"),
    ("restart", "CHAT", "REF"),
    ("approve", "CHAT", "REF"),
    ("deny", "CHAT", "REF"),
    ("cancel", "CHAT"),
    ("chat", "AGENT", "--id", "CHAT"),
]


def command(words: tuple[str, ...], *, chat_id: str, ref: str, agent: str) -> list[str]:
    names = {"CHAT": chat_id, "REF": ref, "AGENT": agent}
    return [names.get(w, w) for w in words]


async def test_exit_codes_for_settings_every_command(run_worker, model, client):
    tq = queue()
    _, chat, res = await paused(run_worker, model, task_queue=tq)
    ref = res.interrupts[0].ref
    nope = f"nope-{uuid.uuid4().hex[:8]}"

    async def each(*options: str) -> list[Done]:
        return await asyncio.gather(
            *(
                agentctl(
                    client,
                    *options,
                    *command(words, chat_id=chat.id, ref=ref, agent=chat.agent),
                    task_queue=tq,
                )
                for words in COMMANDS
            )
        )

    # An unknown namespace is a bad setting, whatever the command: 2, naming the namespace.
    for words, got in zip(COMMANDS, await each("--namespace", nope), strict=True):
        assert got.run.code == 2, (words, got)
        assert f"namespace '{nope}' does not exist" in one_line_error(got.run), words
    # Temporal not there: 4.
    for words, got in zip(COMMANDS, await each("--address", "127.0.0.1:1"), strict=True):
        assert got.run.code == 4, (words, got)
        assert "cannot reach Temporal at 127.0.0.1:1" in one_line_error(got.run), words
    # An address that is no address: a bad setting, 2, not a traceback.
    for words, got in zip(COMMANDS, await each("--address", "localhost:99999"), strict=True):
        assert got.run.code == 2, (words, got)
        assert "bad Temporal address 'localhost:99999'" in one_line_error(got.run), words


async def test_exit_codes_for_arguments_and_conversations(run_worker, model, client):
    tq = queue()
    agent = t.ops_agent()
    model.reply(calls(("approve", {"question": "a?"})), calls(("approve", {"question": "b?"})))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        chat = await agents.chat(agent.name)
        ref = (await chat.send("go")).interrupts[0].ref
        closed = await agents.chat(agent.name)
        closed_ref = (await closed.send("go")).interrupts[0].ref
        await closed.close("done")
        missing = f"{chat.id}-nope"

        runs = {
            # Arguments agentctl checks, and click's own usage errors: 2, one line.
            "not an object": (2, ("respond", chat.id, ref, "[1]"), "must be a JSON object"),
            "not json": (2, ("respond", chat.id, ref, "{"), "the output is not valid JSON"),
            "bad metadata": (2, ("restart", chat.id, ref, "--metadata", "x"), "--metadata is"),
            "bad agent": (2, ("pending", "--agent", 'a"b'), "cannot contain quotes"),
            "no chat id": (2, ("show",), "Missing argument 'CHAT_ID'"),
            "bad wait": (2, ("approve", chat.id, ref, "--wait", "0"), "'--wait'"),
            "no command": (2, ("bogus",), "No such command 'bogus'"),
            # No such conversation: 2, whatever the command.
            **{
                f"missing {words[0]}": (
                    2,
                    tuple(command(words, chat_id=missing, ref=ref, agent=agent.name)),
                    f"no conversation with id '{missing}'",
                )
                for words in COMMANDS[1:-1]
            },
            # Closed: 2 for everything that would answer it or talk to it.
            **{
                f"closed {words[0]}": (
                    2,
                    tuple(command(words, chat_id=closed.id, ref=closed_ref, agent=agent.name)),
                    f"conversation '{closed.id}' is closed (completed)",
                )
                for words in COMMANDS[2:]
            },
            # Refused by the conversation: 1.
            "not pending": (1, ("deny", chat.id, f"{ref}-x"), "is not pending"),
        }
        results = await asyncio.gather(
            *(agentctl(client, *args, task_queue=tq) for _, args, _ in runs.values())
        )
    for (name, (code, _, says)), got in zip(runs.items(), results, strict=True):
        assert got.run.code == code, (name, got)
        assert says in one_line_error(got.run), (name, got)


# --- where agentctl connects -------------------------------------------------------------------


async def test_a_server_that_accepts_and_never_answers_is_given_up_on(client, silent_server):
    """A hung server (or another program on the port) is reported by address in about 10 s,
    not after the SDK's own 30 s with a raw "Timeout expired"."""
    tq = queue()
    by_option, by_variable, api = await asyncio.gather(
        agentctl(client, "--address", silent_server, "pending", task_queue=tq),
        agentctl(
            client,
            "show",
            "some-chat",
            "--wait",
            "3",
            task_queue=tq,
            environ={"TEMPORAL_ADDRESS": silent_server},
        ),
        _not_answering(silent_server),
    )
    for got in (by_option, by_variable):
        assert got.run.code == 4, got
        err = one_line_error(got.run)
        assert f"cannot reach Temporal at {silent_server}: " in err, err
        # Said only when agentctl's own 10 s bound ends the connection, never after the SDK's
        # 30 s ("Timeout expired"): it gave up first.
        assert "did not answer as Temporal within 10s" in err, err
        assert "Timeout expired" not in err, err

    not_answering = api
    assert not_answering.address == silent_server
    assert not_answering.waited == timedelta(seconds=1)
    assert f"the server at {silent_server} is not answering as Temporal" in str(not_answering)
    # Raised by the 1 s bound given, not by the SDK's own 30 s.
    assert "(no reply within 1s)" in str(not_answering), not_answering


async def _not_answering(address: str) -> ServerNotAnswering:
    with pytest.raises(ServerNotAnswering) as e:
        await AgentClient.connect(address, connect_timeout=timedelta(seconds=1))
    return e.value


# What the SDK made of each, unchecked: port 80, a DNS error, a two-line warning then success,
# and its own "invalid port number" for the last two.
NOT_HOST_PORT = {
    "localhost": "no port; give HOST:PORT",
    "notanaddress": "no port; give HOST:PORT",
    "http://localhost:7233": "give HOST:PORT without a scheme",
    "localhost:abc": "the port 'abc' is not a number",
    "localhost:99999": "the port 99999 is not between 1 and 65535",
}


async def test_an_address_that_is_not_host_port_is_a_usage_error(client, tmp_path):
    """The README's exit 2 for "an address that is not HOST:PORT", whether it comes from
    --address or TEMPORAL_ADDRESS; connect_config checks it, so every entry point does."""
    tq = queue()
    # agent-worker too, started first: it runs while the agentctl processes do.
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporal_agent_interrupts.worker",
        env=bare_environ(tmp_path, TEMPORAL_ADDRESS="localhost"),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    runs = await asyncio.gather(
        *(
            agentctl(client, "--address", address, "pending", task_queue=tq)
            for address in NOT_HOST_PORT
        ),
        *(
            agentctl(client, "pending", task_queue=tq, environ={"TEMPORAL_ADDRESS": address})
            for address in NOT_HOST_PORT
        ),
    )
    sources = ["(--address or target_host)"] * len(NOT_HOST_PORT) + ["(TEMPORAL_ADDRESS)"] * len(
        NOT_HOST_PORT
    )
    addresses = [*NOT_HOST_PORT, *NOT_HOST_PORT]
    for address, source, got in zip(addresses, sources, runs, strict=True):
        assert got.run.code == 2, (address, got)
        # One line: the SDK's UserWarning about URL schemes never gets to print.
        err = one_line_error(got.run)
        assert f"bad Temporal address {address!r} {source}: {NOT_HOST_PORT[address]}" in err, err

    # The API raises the same, before connecting.
    for address, why in NOT_HOST_PORT.items():
        with pytest.raises(ConnectionConfigError, match="bad Temporal address") as e:
            await AgentClient.connect(address)
        assert why in str(e.value)

    # agent-worker maps it to its exit 2 for an unusable configuration.
    out, err = await asyncio.wait_for(worker.communicate(), 60)
    assert worker.returncode == 2, (out, err)
    (line,) = err.decode().splitlines()
    assert (
        "ERROR temporal_agent_interrupts.worker: "
        "bad Temporal address 'localhost' (TEMPORAL_ADDRESS): no port" in line
    )


# --- a restart that pauses again --------------------------------------------------------------


async def test_a_restart_that_pauses_again_on_the_same_ref_says_why(run_worker, model, client):
    agent = t.ops_agent()  # lookup is gated by ToolApproval; charge interrupts on its own
    tq = queue()
    model.reply(calls(("lookup", {"key": "k"})), calls(("charge", {"amount": 7})), text("done"))
    async with run_worker(agents=[agent], task_queue=tq) as agents:
        gated, conditional = await agents.chat(agent.name), await agents.chat(agent.name)
        (lookup,) = (await gated.send("look")).interrupts
        (charge,) = (await conditional.send("pay")).interrupts
        assert (lookup.source, charge.source) == ("approval", "tool")

        again = await agentctl(client, "restart", gated.id, lookup.ref, task_queue=tq)
        assert again.run.code == 0, again
        assert "turn 1 is paused on 1 interrupt(s)" in again.run.out
        *_, last = again.run.out.strip().splitlines()
        assert last == (
            "the call paused again on the same ref: a gated tool runs only when restarted with "
            f'{{"tool_approved": true}} (agentctl approve {gated.id} {lookup.ref} does that)'
        ), again.run.out

        raised = await agentctl(client, "restart", conditional.id, charge.ref, task_queue=tq)
        assert raised.run.code == 0, raised
        *_, last = raised.run.out.strip().splitlines()
        assert last == (
            "the call paused again on the same ref: the tool raised Interrupt again, so its own "
            "condition for running still holds (see its metadata above); a tool that checks "
            f'{{"tool_approved": true}} runs with agentctl approve {conditional.id} {charge.ref}'
        ), raised.run.out

        # --json prints the answer and the turn, nothing else.
        as_json = await agentctl(client, "restart", gated.id, lookup.ref, "--json", task_queue=tq)
        assert as_json.run.code == 0, as_json
        turn = as_json.run.json()["turn"]
        assert [i["ref"] for i in turn["interrupts"]] == [lookup.ref]

        # Approved, the gated call runs and the turn ends: nothing more is said.
        approved = await agentctl(client, "approve", gated.id, lookup.ref, task_queue=tq)
        assert approved.run.code == 0, approved
        assert "turn 1 ended: stop" in approved.run.out, approved.run.out
        assert "paused again" not in approved.run.out

    help_run = await agentctl(client, "restart", "--help", task_queue=tq)
    assert help_run.run.code == 0
    said = " ".join(help_run.run.out.replace("│", " ").split())
    assert """--metadata '{"tool_approved": true}'""" in said, said


async def test_a_piped_chat_denies_without_a_reason_line_and_pending_fits_80_columns(
    run_worker, model, client
):
    """Input piped into `agentctl chat` that ends at the reason prompt still denies (it used to
    leave the chat paused without a word), and `pending` in 80 columns keeps every line within
    them for a generated chat id (`chat-<uuid>`)."""
    agent = Agent(f"pipe-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve])
    model.reply(calls(("approve", {"question": "ok?"})), text("told no"))
    model.reply(calls(("approve", {"question": "again?"})))
    async with run_worker(agents=[agent]) as agents:
        env = agentctl_env(client, agents.task_queue)
        proc = await asyncio.create_subprocess_exec(
            str(AGENTCTL), "chat", agent.name,
            env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(b"go\nd\n"), 60)
        assert proc.returncode == 0, err.decode()
        assert "agent> told no" in out.decode()
        assert "Left" not in out.decode()
        assert model.requests[-1].function_responses()[0]["response"] == {
            "approved": False,
            "feedback": "",
        }

        paused = await agents.chat(agent.name)  # chat-<uuid>
        assert (await paused.send("again")).interrupts
        env["COLUMNS"] = "80"
        proc = await asyncio.create_subprocess_exec(
            str(AGENTCTL), "pending", "--agent", agent.name,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    shown = out.decode()
    assert proc.returncode == 0, err.decode()
    assert f"{paused.id} · {agent.name}\n  waiting since " in shown
    assert max(len(line) for line in shown.splitlines()) <= 80, shown


@pytest.mark.parametrize("address", ["[zz]:7233", "ho%st:7233"])
async def test_an_address_only_the_sdk_refuses_is_a_usage_error_everywhere(
    client, tmp_path, address
):
    """HOST:PORT in shape, but not a host the SDK can parse: agent-worker and the demo
    ended in a ValueError traceback (exit 1); every entry point now says so in one line, exit 2."""
    modules = ("temporal_agent_interrupts.worker", "examples.demo")

    async def entry_point(module: str) -> tuple[int | None, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module,
            env=bare_environ(tmp_path, TEMPORAL_ADDRESS=address), cwd=tmp_path,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out, err

    # The three entry points side by side: each is a process start of its own.
    run, entry_points = await asyncio.gather(
        agentctl(client, "pending", task_queue=queue(), environ={"TEMPORAL_ADDRESS": address}),
        asyncio.gather(*(entry_point(module) for module in modules)),
    )
    assert run.run.code == 2, run
    assert f"bad Temporal address {address!r}: invalid target URL" in one_line_error(run.run)
    for module, (code, out, err) in zip(modules, entry_points, strict=True):
        assert code == 2, (module, out, err)
        (line,) = err.decode().splitlines()
        assert f"bad Temporal address {address!r}: invalid target URL" in line, line


def test_a_failed_query_or_a_bug_is_not_read_as_a_refusal():
    """Exit 1 means the conversation refused; a query the conversation failed to answer was
    reported as 1 too, so a script took a broken conversation for a rejected answer."""
    from temporalio.client import WorkflowQueryFailedError

    from temporal_agent_interrupts.client.api import AgentError
    from temporal_agent_interrupts.client.cli import ExitCode, _failure

    failed = AgentError("query failed: boom")
    failed.__cause__ = WorkflowQueryFailedError("boom")
    assert _failure(failed).code == ExitCode.INTERNAL == 5
    assert _failure(AgentError("ref 'x' is not pending")).code == ExitCode.REFUSED

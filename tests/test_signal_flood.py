"""A flood of signals never ends a paused conversation (issue 44, finding 2).

On a stock server, 33 signals of 1.8 MB sent at once took a paused run past 50 MiB before its
worker got a task in: a run cannot continue as new while signals keep arriving, and the server
terminated it, the pause and its approvals with it. The embedded default caps the signals one
run takes (``worker.devserver.SIGNALS_PER_RUN``), so that the largest signals it takes stay
under that limit; the conversation continues as new well before it reaches the cap
(``RUN.can_signals``), so its own signals always find room.

These run on the session's server, started with the embedded default's own flags
(``worker.testing.dev_server``).
"""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from temporal_agent_interrupts.worker.devserver import (
    SERVER_FLAGS,
    SIGNALS_PER_RUN,
    dev_server_command,
)
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.workflows.limits import RUN, TEMPORAL
from tests.helpers import eventually

SIGNAL_LIMIT = f"history.maximumSignalsPerExecution={SIGNALS_PER_RUN}"


def test_the_signal_limit_keeps_a_flood_under_the_history_limit():
    """The arithmetic: the most a run can be sent, on a paused run (it continues as new at
    4 MiB, plus one task's writes), stays under the size at which the server terminates it;
    and the conversation moves on before its own signals meet the cap."""
    flood = SIGNALS_PER_RUN * TEMPORAL.payload
    assert flood + RUN.can_bytes + TEMPORAL.task < TEMPORAL.history_bytes
    assert RUN.can_signals < SIGNALS_PER_RUN
    assert SIGNAL_LIMIT in SERVER_FLAGS
    command = dev_server_command(db_file=None)
    assert command[command.index(SIGNAL_LIMIT) - 1] == "--dynamic-config-value"


async def test_a_flood_of_large_signals_never_ends_a_paused_conversation(run_worker, model, client):
    """40 junk answers of 1.9 MB sent at once (76 MB, past the 50 MiB at which the server
    terminates a run): the server takes 20 and refuses the rest; the run continues as new
    with the pause, which the real answer then resumes."""
    model.reply(calls(("approve", {"question": "ship?"})), text("survived"))
    junk = {"respond": [{"name": "approve", "ref": "junk", "output": {"pad": "x" * 1_900_000}}]}
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        (pending,) = (await chat.send("go")).interrupts
        handle = client.get_workflow_handle(chat.id)
        first = (await handle.describe()).run_id

        async def one() -> bool:
            try:
                await handle.signal("resume", junk)
            except RPCError:
                # Refused by the server: past the per-run limit (or, without it, because the
                # run was terminated; the assertions below tell which).
                return False
            return True

        taken = sum(await asyncio.gather(*(one() for _ in range(40))))
        status = await eventually(
            chat.status, lambda s: s.rejections >= taken or s.status == "closed", timeout=120
        )
        runs = [
            (wf.run_id, wf.status)
            async for wf in client.list_workflows(f'WorkflowId = "{chat.id}"')
        ]
        latest = (await client.get_workflow_handle(chat.id).describe()).run_id
        done = await chat.resume(respond=[pending.respond({"approved": True})])
    assert WorkflowExecutionStatus.TERMINATED not in [s for _, s in runs]
    assert status.status == "interrupted" and [p.ref for p in status.pending] == [pending.ref]
    assert taken <= SIGNALS_PER_RUN
    # It continued as new, with the pause (asked of the server: visibility may lag behind).
    assert latest != first
    assert done.text == "survived"


async def test_a_paused_conversation_takes_any_number_of_signals_one_after_another(
    run_worker, model, client
):
    """The per-run cap never refuses a conversation that is not flooded faster than it moves
    on: 30 refused answers, each after the last was recorded, are all taken (the run continues
    as new after every 10), and the pause is still there."""
    model.reply(calls(("approve", {"question": "ship?"})), text("shipped"))
    wrong = {"respond": [{"name": "approve", "ref": "nope", "output": {}}]}
    async with run_worker() as agents:
        chat = await agents.chat("budget")
        (pending,) = (await chat.send("go")).interrupts
        handle = client.get_workflow_handle(chat.id)
        for n in range(1, 31):
            await handle.signal("resume", wrong)
            await eventually(chat.status, lambda s, n=n: s.rejections >= n, timeout=30)
        status = await chat.status()
        done = await chat.resume(respond=[pending.respond({"approved": True})])
    assert status.rejections == 30
    assert [p.ref for p in status.pending] == [pending.ref]
    assert done.text == "shipped"

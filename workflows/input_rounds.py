"""An MCP call whose server asks for input: the round's forms, one interrupt each, and the retry.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

MCP 2026-07-28 lets a server answer a tool call with ``InputRequiredResult``: input requests (a
form for a person to fill, the client's roots) and an opaque ``requestState``. The client
retries the same call with the answers and the state echoed byte for byte. Here no activity
holds that wait: the ``mcp_call`` activity returns the round at once (answering a roots
request itself, from the server's configuration), the call pauses on one interrupt per form,
in the server's order, and once the last is answered the call is ready again: the tool step
sends the retry under the same idempotency key. A later round pauses the same way.

A form is answered with ``respond``: its data, which must fit the schema the server asked for
(the interrupt shows it as ``output_schema``). A denial, or a deadline that passes, declines the
form; the server decides what a decline means. The call's approval (a gated tool's) was asked
once, before the first round, and each retry carries it. No Temporal imports.
"""

from __future__ import annotations

from temporal_agent_interrupts.workflows.activity_io import InputForm, InputRound
from temporal_agent_interrupts.workflows.state import CallState
from temporal_agent_interrupts.workflows.types import (
    DENIED_BY_USER,
    TIMED_OUT,
    JsonObject,
    input_digest,
)

MAX_INPUT_ROUNDS = 8
"""The most input rounds one call may have: a server that keeps asking past them fails the call
(the model hears why), never the conversation."""


def shown_digest(call: CallState) -> str:
    """What an answer to ``call`` names as the input it was shown (``input_digest``): the
    input's digest, and for a server's form, the form's too (its round and request key). Every
    form of a call pauses on the call's one ref: an answer shown one form, sent again or late,
    must never fill the next."""
    round_ = call.input_round
    if call.source == "input" and round_ is not None and round_.asking is not None:
        return input_digest({"args": call.args, "round": round_.round, "request": round_.asking})
    return input_digest(call.args)


def declined(output: JsonObject) -> bool:
    """Whether a respond to a server's form declines it: a denial (``deny()``), or the answer
    a passed deadline gives."""
    return output.get("error") in (DENIED_BY_USER, TIMED_OUT)


def answered_form(round_: InputRound, output: JsonObject) -> None:
    """Keep the answer to the form the call is paused on, as the server is sent it."""
    key = round_.asking
    if key is None:
        return
    round_.responses[key] = (
        {"action": "decline"} if declined(output) else {"action": "accept", "content": output}
    )
    round_.asking = None


def sample_answer(text: str, model: str) -> JsonObject:
    """The answer to a sampling request, as the server is sent it (MCP's
    ``CreateMessageResult``): the model's reply."""
    return {
        "role": "assistant",
        "content": {"type": "text", "text": text},
        "model": model,
        "stopReason": "endTurn",
    }


def form_metadata(round_: InputRound, form: InputForm, *, server: str) -> JsonObject:
    """What the interrupt of one form shows: the server's message, and where it is in the
    call's rounds."""
    return {
        "message": form.message,
        "reason": "input",
        "server": server,
        "request": form.key,
        "round": round_.round,
        "forms": len(round_.forms),
    }


def form_schema(round_: InputRound | None) -> JsonObject | None:
    """The schema an answer to the form the call is paused on must fit."""
    if round_ is None:
        return None
    form = round_.form(round_.asking)
    return form.requested_schema if form is not None else None


def round_problem(asked: InputRound | None, previous: InputRound | None) -> str | None:
    """Why a round a server asked for cannot be taken (it fails the call), or None."""
    if asked is None or not (asked.forms or asked.samples):
        return "the server asked for input, and nothing this client answers"
    done = previous.round if previous is not None else 0
    # Rounds the worker answered by itself (roots, state only) count too: more than one may
    # have passed since the last pause.
    if asked.round <= done or asked.round > MAX_INPUT_ROUNDS:
        return f"the server asked for input more than {MAX_INPUT_ROUNDS} times in one call"
    return None

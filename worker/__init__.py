"""Hosting: ``AgentsPlugin`` on a team's own client and worker, or ``build_worker()``, which
wraps it for a worker of agents only.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import google.genai as genai
from temporalio.client import Client
from temporalio.worker import Worker

from temporal_agent_interrupts.activities.notify import Channel
from temporal_agent_interrupts.worker.peers import worker_identity
from temporal_agent_interrupts.worker.plugin import (
    AgentsPlugin,
    agent_converter,
    default_gemini,
    has_gemini_key,
)
from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys
from temporal_agent_interrupts.worker.sandbox import PASSTHROUGH, ensure_bytecode, sandbox_runner
from temporal_agent_interrupts.worker.search_attributes import (
    MissingSearchAttributes,
    SearchAttributesRefused,
    setup_search_attributes,
)
from temporal_agent_interrupts.workflows import Agent
from temporal_agent_interrupts.workflows.seal import ResultKeys

DEFAULT_MAX_CACHED_WORKFLOWS = 100
"""Conversations a worker keeps in memory between their workflow tasks (Temporal's own default
is 1000). Each holds its state and the sandbox's per-run objects (the workflow's code is shared:
it passes through the sandbox); a paused conversation is only waiting, and one evicted is
replayed from its history when next answered (56 ms for a 10-turn run, bench B3). Measured with
``python -m bench b2 --parked 10000``: 187 MiB resident with all of them parked (113 before
parking),
and resuming runs at 0.65 of the parking rate. Raise it for workers that keep many
conversations busy at once."""


def build_worker(
    client: Client,
    *,
    agents: Sequence[Agent],
    task_queue: str,
    gemini: genai.Client | None = None,
    conversation_cache: int = 1000,
    result_keys: ResultKeys | str | None = None,
    channels: Mapping[str, Channel] | None = None,
    receipt_keys: ReceiptKeys | str | None = None,
    **worker_kwargs: Any,
) -> Worker:
    """A worker hosting ``agents`` on ``task_queue``: ``AgentsPlugin`` on a copy of ``client``,
    with the worker options a worker of agents only wants.

    Args:
        client: A connected Temporal client, without an ``AgentsPlugin`` of its own. The
            worker's copy of it carries the plugin, and so the plugin's data converter (see
            ``agent_converter``): a client connected with ``codec.data_converter(keys)``
            keeps its codec; one without a codec encrypts with ``AGENT_PAYLOAD_KEYS`` when
            that is set. With keys, a payload the worker cannot decrypt stops nothing by
            itself: a signal's or update's argument reaches the workflow still encrypted and
            is refused in words; a query fails; a workflow task that cannot read the
            conversation's own input, state or an activity's result fails naming the key id,
            and is retried; an activity's input fails the attempt (the workflow schedules it
            again) and calls ``on_missing_key`` if the converter has one.
        agents: The agents this worker serves. Their names are durable identifiers.
        task_queue: Where conversations for these agents run.
        gemini: The google-genai client for model calls. ``None``: the real API when
            ``GEMINI_API_KEY``/``GOOGLE_API_KEY`` is set, else the offline stand-in.
        conversation_cache: Conversations the model activity keeps, so each model call
            carries only what is new (see ``activities/history.py``); 0 keeps none, and each
            call asks the workflow for the rest (measured in ``bench/``: about 6 ms a call,
            growing with the conversation).
        result_keys: The keys that seal every activity result (``worker.result_keys``);
            ``None`` reads ``AGENT_RESULT_KEYS``.
        channels: Where paused calls are announced, by the names agents give them
            (``Agent(notify=)``; see ``AgentsPlugin``).
        receipt_keys: The keys that sign decision receipts (``worker.receipt_keys``); ``None``
            reads ``AGENT_RECEIPT_KEYS``.
        **worker_kwargs: Passed to ``temporalio.worker.Worker``. Defaults here:
            ``max_cached_workflows`` (``DEFAULT_MAX_CACHED_WORKFLOWS``) and an ``identity``
            that names the agents, so a worker with other agents on the same queue can be
            spotted.

    Raises:
        ValueError: no agents, a ``gemini`` client with the SDK's retries on, or a client that
            already carries an ``AgentsPlugin`` (build a ``Worker`` on it directly).
    """
    plugin = AgentsPlugin(
        agents=agents,
        gemini=gemini,
        conversation_cache=conversation_cache,
        result_keys=result_keys,
        channels=channels,
        receipt_keys=receipt_keys,
    )
    config = client.config()  # as given, before its plugins ran: they run again on the copy
    plugins = list(config.get("plugins") or ())
    if any(isinstance(p, AgentsPlugin) for p in plugins):
        raise ValueError(
            "this client already carries an AgentsPlugin: build a temporalio Worker on it "
            "directly, the plugin reaches it from the client"
        )
    config["plugins"] = [*plugins, plugin]
    worker_kwargs.setdefault("max_cached_workflows", DEFAULT_MAX_CACHED_WORKFLOWS)
    worker_kwargs.setdefault("identity", worker_identity(agents))
    return Worker(Client(**config), task_queue=task_queue, **worker_kwargs)


__all__ = [
    "DEFAULT_MAX_CACHED_WORKFLOWS",
    "PASSTHROUGH",
    "AgentsPlugin",
    "MissingSearchAttributes",
    "SearchAttributesRefused",
    "agent_converter",
    "build_worker",
    "default_gemini",
    "ensure_bytecode",
    "has_gemini_key",
    "sandbox_runner",
    "setup_search_attributes",
]

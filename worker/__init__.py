"""Hosting: ``build_worker()``, the one place that registers what production runs."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import os
import py_compile
from collections.abc import Sequence
from types import CodeType
from typing import Any

import google.genai as genai
from temporalio.client import Client
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

# Private, for _CompiledInstance (see there for why, and what it relies on); temporalio is pinned
# to one minor release (pyproject.toml).
from temporalio.worker.workflow_sandbox._runner import _Instance

from activities.runtime import AgentActivities, genai_transport
from client.codec import ENV_VAR, NO_KEYS, AgentPayloadConverter, EncryptionCodec
from worker.peers import worker_identity
from workflows import Agent, AgentWorkflow

log = logging.getLogger(__name__)

GEMINI_KEY_VARS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

DEFAULT_MAX_CACHED_WORKFLOWS = 100
"""Conversations a worker keeps in memory between their workflow tasks (Temporal's own default
is 1000). Each holds its state and the sandbox's per-run objects (the workflow's code is shared:
it passes through the sandbox); a paused conversation is only waiting, and one evicted is
replayed from its history when next answered (56 ms for a 10-turn run, bench B3). Measured with
``python -m bench b2 --parked 10000``: 187 MiB resident with all of them parked (113 before
parking),
and resuming runs at 0.65 of the parking rate. Raise it for workers that keep many
conversations busy at once."""

# Side-effect-free modules the workflow uses, passed through the sandbox in every runner: this
# avoids re-importing them for every workflow run (time and memory per conversation), and keeps
# one class per wire type: a model built by a passed-through module must be the same class the
# workflow validates against.
_DATA_AND_LIBRARIES = (
    "workflows.agent",
    "workflows.details",
    "workflows.history",
    "workflows.limits",
    "workflows.types",
    "workflows.interrupts",
    # The interrupt book's parts, which workflows.interrupts composes.
    "workflows.calls",
    "workflows.answers",
    "workflows.governance",
    "workflows.deadlines",
    "workflows.config",
    "workflows.identity",
    # Metrics and spans (workflows.telemetry): the tracing interceptor keeps its context in
    # OpenTelemetry's context variables, which must be the ones the workflow reads.
    "workflows.telemetry",
    "opentelemetry",
    "pydantic",
    "pydantic_core",
    "jsonschema",
    "referencing",
    "rpds",
    "attrs",
    "annotated_types",
    # Identity tokens (workflows.identity) need both. Re-imported in the sandbox, cryptography's
    # native module fails to load a second time, and PyJWT fails to import (its JWKS client
    # subclasses urllib.request's handlers) and reads datetime.now() in every decode, even with
    # its time checks off; passed through, that read is harmless (its value goes unused).
    "jwt",
    "cryptography",
)

PASSTHROUGH = (
    *_DATA_AND_LIBRARIES,
    # The workflow's own code too: the class and the rooms behind it (workflows.turn, .audit,
    # .operator_view, ...). None has module-level state, and every workflow call they make finds
    # the running workflow through the SDK's context, so one copy serves every conversation.
    # Re-imported per conversation, they were most of the cost of starting one (measured: the
    # rooms 12% of a cycle's worker CPU, then the class's module 2.3 ms of the 26 ms left) and
    # of the memory a cached one holds. What the sandbox's restrictions checked in them at run
    # time (no clock, randomness, I/O or environment), the replay tests check instead, replaying
    # every recorded history in the strict sandbox (sandbox_runner(strict=True)).
    "workflows",
)


def ensure_bytecode(modules: Sequence[str]) -> None:
    """Write the ``.pyc`` of modules the sandbox re-imports for every workflow run.

    The sandbox runs the workflow module afresh for each workflow instance. With
    ``PYTHONDONTWRITEBYTECODE=1`` (common in containers, and set on our CI machine) Python never
    caches its bytecode, so every new or evicted conversation recompiled the module from source:
    measured as the largest single cost of starting a conversation. Reading a ``.pyc`` is allowed
    under that setting; only writing is suppressed, so we write it explicitly, once per start.
    """
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py"):
            continue
        try:
            py_compile.compile(origin, cfile=importlib.util.cache_from_source(origin), doraise=True)
        except (OSError, py_compile.PyCompileError) as e:  # a read-only install still works
            log.debug("could not cache bytecode for %s: %s", name, e)


@functools.lru_cache(maxsize=32)
def _compiled(code: str) -> CodeType:
    # "<string>" is what exec() of the same text would name it: tracebacks stay as they were.
    return compile(code, "<string>", "exec")


class _CompiledInstance(_Instance):
    """The SDK's sandboxed instance, with its few fixed snippets compiled once, not per call.

    The sandbox reaches into the workflow by exec() of short source strings, and the data
    converter asks it for a serialization context once per payload per pass (seven passes per
    workflow task), so each workflow task compiled the same two lines dozens of times: measured
    as 5.5% of a worker's CPU over an approval cycle, about 1.8 ms of its 26 ms, half of it the
    compiling. exec() takes a code object as well as a string, so this changes nothing else.
    Measured again once the workflow's own code passed through the sandbox: B1's cycle is 3.7%
    longer without it (median of ten paired rounds, 73.3 against 75.2 ms; 1.025 to 1.048, where
    the same worker against itself spreads 0.995 to 1.016) and its CPU 7% more.

    Private, and no public API serves: the SDK offers no hook around the sandbox's exec(), and a
    runner of our own would mean re-implementing the sandbox. What it relies on:
    ``_Instance(instance_details, runner_class, restrictions)`` is what
    ``SandboxedWorkflowRunner.create_instance`` builds, and every exec() goes through
    ``_run_code(code, **extra_globals)`` with a few fixed strings (tests/test_library_guards.py:
    test_sandbox_instance_is_the_one_compiled_instance_extends). temporalio is pinned to one
    minor release (pyproject.toml), which keeps it stable between upgrades.
    """

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        super()._run_code(_compiled(code), **extra_globals)  # type: ignore[arg-type] -- exec() takes either


class _Runner(SandboxedWorkflowRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledInstance(det, self.runner_class, self.restrictions)


def sandbox_runner(*, strict: bool = False) -> SandboxedWorkflowRunner:
    """The workflow sandbox with this project's pass-through modules (workers and replayers).

    Args:
        strict: Re-import the workflow's own code (``workflows`` but its data modules) for
            every run, as the SDK does by default, so the sandbox's restrictions see each call
            it makes. Slower; for replay tests, which check with it what production trusts.
    """
    modules = _DATA_AND_LIBRARIES if strict else PASSTHROUGH
    return _Runner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*modules))


def with_pydantic_converter(client: Client) -> Client:
    """The same connection with the pydantic data converter, which every boundary here needs,
    and a payload codec.

    A client's own codec is kept (``client.codec.data_converter(keys)`` gives one that
    encrypts), and so is its payload converter if it is ours (``AgentPayloadConverter``, the
    pydantic one that names the key id of a payload it cannot decrypt). A client without a
    codec gets the encryption codec without keys: payloads pass in the clear, and one encrypted
    elsewhere fails naming its key id instead of as an unknown encoding.
    """
    converter = client.data_converter
    ours = issubclass(converter.payload_converter_class, AgentPayloadConverter)
    if ours and converter.payload_codec is not None:
        return client
    config = client.config()
    config["data_converter"] = dataclasses.replace(
        converter,
        payload_converter_class=(
            converter.payload_converter_class if ours else AgentPayloadConverter
        ),
        payload_codec=converter.payload_codec or EncryptionCodec(NO_KEYS),
    )
    return Client(**config)


def _warn_if_writing_in_the_clear(client: Client) -> None:
    """``AGENT_PAYLOAD_KEYS`` is read by entry points, not by ``build_worker``: a client
    connected without ``client.codec.data_converter()`` would have the worker write every
    payload in the clear while the environment says to encrypt."""
    codec = client.data_converter.payload_codec
    plain = codec is None or (isinstance(codec, EncryptionCodec) and not codec.keys)
    if plain and os.environ.get(ENV_VAR, "").strip():
        log.warning(
            "%s is set, but the client given to build_worker has no payload keys: this worker "
            "writes payloads IN THE CLEAR. Connect the client with "
            "data_converter=client.codec.data_converter() (which reads %s)",
            ENV_VAR,
            ENV_VAR,
        )


def has_gemini_key(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether the real Gemini is configured: an API key, or Vertex AI (google-genai's own
    ``GOOGLE_GENAI_USE_VERTEXAI``, with its project and location from the environment)."""
    env = os.environ if environ is None else environ
    vertex = env.get("GOOGLE_GENAI_USE_VERTEXAI", "").strip().lower() in ("1", "true", "yes")
    return vertex or any(env.get(k) for k in GEMINI_KEY_VARS)


def default_gemini() -> genai.Client:
    """The real Gemini (API key or Vertex AI) when configured, else the offline stand-in."""
    if has_gemini_key():
        # google-genai reads the key from the environment itself: it never passes through here.
        return genai.Client()
    from worker.offline_model import streaming
    from worker.standin import GeminiStandIn

    # Keeps no requests: a worker runs for weeks, and nobody reads them there.
    server = GeminiStandIn(streaming, keep_requests=0).start()
    log.warning(
        "No GEMINI_API_KEY/GOOGLE_API_KEY set: using the OFFLINE STAND-IN model at %s. It is not "
        "Gemini: it follows fixed rules (`call TOOL {json}` calls any tool of an agent).",
        server.base_url,
    )
    return server.client()


def _reject_sdk_retries(gemini: genai.Client) -> None:
    """Temporal owns retries: an SDK retry loop would hide attempts inside one activity attempt
    and multiply with the activity's retry policy."""
    # The transport's options: google-genai exposes no other way to read what a client was built
    # with (see genai_transport).
    if genai_transport(gemini).get_read_only_http_options().get("retry_options"):
        raise ValueError(
            "the genai.Client has http_options.retry_options set; remove them: Temporal retries "
            "model calls (408, 429 and 5xx, honouring Retry-After) as activity attempts"
        )


def build_worker(
    client: Client,
    *,
    agents: Sequence[Agent],
    task_queue: str,
    gemini: genai.Client | None = None,
    conversation_cache: int = 1000,
    **worker_kwargs: Any,
) -> Worker:
    """A worker hosting ``agents`` on ``task_queue``.

    Args:
        client: A connected Temporal client; its data converter is switched to pydantic, and
            given the payload codec without keys if it has no codec (see
            ``with_pydantic_converter``): pass one from ``client.codec.data_converter`` to
            encrypt (a warning is logged when ``AGENT_PAYLOAD_KEYS`` is set and the client has
            no keys). With keys, a payload the worker cannot decrypt stops nothing by itself:
            a signal's or update's argument reaches the workflow still encrypted and is refused
            in words; a query fails; a workflow task that cannot read the conversation's own
            input, state or an activity's result fails naming the key id, and is retried; an
            activity's input fails the attempt (the workflow schedules it again) and calls
            ``on_missing_key`` if the converter has one (``client.codec.data_converter``).
        agents: The agents this worker serves. Their names are durable identifiers.
        task_queue: Where conversations for these agents run.
        gemini: The google-genai client for model calls. ``None``: the real API when
            ``GEMINI_API_KEY``/``GOOGLE_API_KEY`` is set, else the offline stand-in.
        conversation_cache: Conversations the model activity keeps, so each model call
            carries only what is new (see ``activities/history.py``); 0 keeps none, and each
            call asks the workflow for the rest (measured in ``bench/``: about 6 ms a call,
            growing with the conversation).
        **worker_kwargs: Passed to ``temporalio.worker.Worker`` (for example
            ``max_cached_workflows=0`` in replay tests).
    """
    if not agents:
        raise ValueError("build_worker needs at least one agent")
    if gemini is not None:
        _reject_sdk_retries(gemini)
    acts = AgentActivities(
        agents,
        gemini=gemini if gemini is not None else default_gemini(),
        conversation_cache=conversation_cache,
    )
    worker_kwargs.setdefault("workflow_runner", sandbox_runner())
    worker_kwargs.setdefault("max_cached_workflows", DEFAULT_MAX_CACHED_WORKFLOWS)
    # Names the agents, so a worker with other agents on the same queue can be spotted.
    worker_kwargs.setdefault("identity", worker_identity(agents))
    client = with_pydantic_converter(client)
    _warn_if_writing_in_the_clear(client)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[AgentWorkflow],
        activities=acts.activities(),
        **worker_kwargs,
    )


__all__ = [
    "DEFAULT_MAX_CACHED_WORKFLOWS",
    "build_worker",
    "default_gemini",
    "ensure_bytecode",
    "has_gemini_key",
    "sandbox_runner",
    "with_pydantic_converter",
]

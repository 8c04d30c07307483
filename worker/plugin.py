"""``AgentsPlugin``: the agents, added to a team's own Temporal client and worker.

Internal: not covered by the 0.1.x stability promise; its public name (``AgentsPlugin``) is
imported from ``temporal_agent_interrupts``.

One registration point, as the SDK's own integrations are (``OpenAIAgentsPlugin``, pydantic-ai's
``PydanticAIPlugin``): a ``temporalio.plugin.SimplePlugin`` that sets what the product needs and
leaves the rest of the worker to the team::

    plugin = AgentsPlugin(agents=[payments_agent])
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue="payments", workflows=[TheirWorkflow], activities=[...])

A client's plugins reach every worker built on it, so the plugin goes on the client only. What
it sets:

- on the client: the pydantic data converter (``AgentPayloadConverter``) with the payload codec,
  which encrypts when keys are given or ``AGENT_PAYLOAD_KEYS`` is set; and the tracing
  interceptor when ``OTEL_EXPORTER_OTLP_ENDPOINT`` turns tracing on;
- on the worker: ``AgentWorkflow``, the model and tool activities, and the workflow sandbox with
  this package's pass-through modules (a sandbox the team configured keeps its restrictions and
  gains the pass-through; an unsandboxed runner is left as the team chose it);
- at each worker's start, before it polls: the namespace's search attributes, which every
  conversation upserts (``MissingSearchAttributes``, with the command that registers them).

Everything else about the worker is the team's: task queue, concurrency, ``max_cached_workflows``,
identity, Worker Versioning (deployment options), graceful shutdown and its other workflows and
activities. ``build_worker`` is this plugin with the defaults a worker of agents only wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import google.genai as genai
from temporalio.client import ClientConfig
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter, DefaultFailureConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import ReplayerConfig, Worker, WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from temporal_agent_interrupts.activities.notify import Channel
from temporal_agent_interrupts.activities.runtime import AgentActivities, genai_transport
from temporal_agent_interrupts.activities.subagents import with_sub_agents
from temporal_agent_interrupts.codec import (
    ENV_VAR,
    AgentPayloadConverter,
    EncryptionCodec,
    PayloadKeys,
    ReadingFailureConverter,
    codec_of,
    data_converter,
    load_keys,
)
from temporal_agent_interrupts.tracing import add_tracing
from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys, resolve_receipt_keys
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.worker.sandbox import (
    PASSTHROUGH,
    GuardedRunner,
    OurRunner,
    sandbox_runner,
)
from temporal_agent_interrupts.worker.search_attributes import check_search_attributes
from temporal_agent_interrupts.workflows import Agent, AgentWorkflow
from temporal_agent_interrupts.workflows.seal import ResultKeys

log = logging.getLogger(__name__)

PLUGIN_NAME = "temporal_agent_interrupts.AgentsPlugin"

GEMINI_KEY_VARS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

# Payload converters the plugin may replace with its own, which reads and writes everything they
# do (AgentPayloadConverter is the pydantic one, which extends the default).
_REPLACEABLE = (DefaultPayloadConverter, PydanticPayloadConverter)


async def _never_started(worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
    """Mark ``worker`` as done without ever polling, so that ``async with worker`` and
    ``worker.shutdown()`` return instead of waiting forever for a run that never came.

    It does what the SDK's own run does when its first check (the namespace's) fails: the
    shutdown is marked complete, nothing else having started. A run "already told to stop"
    would not do: its pollers start before it notices the stop, and the server hands them
    tasks from the queue (the team's own workflows', served by other workers), which then wait
    out their timeout. Only on an SDK without that marker does the run go ahead told to stop.
    """
    done = getattr(worker, "_shutdown_complete_event", None)
    bridge = getattr(worker, "_bridge_worker", None)
    if isinstance(done, asyncio.Event) and bridge is not None:
        # Released, not just left: the core worker holds the task queue's registration, and a
        # worker built after the fix (in the same process) would be refused as a duplicate.
        with contextlib.suppress(Exception):
            bridge.initiate_shutdown()
            drains = [
                part.drain_poll_queue()
                for part in (
                    getattr(worker, "_workflow_worker", None),
                    getattr(worker, "_activity_worker", None),
                    getattr(worker, "_nexus_worker", None),
                )
                if part is not None
            ]
            await asyncio.wait_for(asyncio.gather(*drains), 30)
            await asyncio.wait_for(bridge.finalize_shutdown(), 30)
        done.set()
        return
    stopping = asyncio.create_task(worker.shutdown())
    with contextlib.suppress(Exception):
        await next(worker)
    await stopping


class AgentsPlugin(SimplePlugin):
    """Hosts ``agents`` on the workers of the client it is given to.

    Args:
        agents: The agents the workers serve. Their names are durable identifiers.
        gemini: The google-genai client for model calls. ``None``: the real API when
            ``GEMINI_API_KEY``/``GOOGLE_API_KEY`` (or Vertex AI) is configured, else the offline
            stand-in model; made when the first worker is built, not before.
        payload_keys: The keys that encrypt payloads (``PayloadKeys``, or the text
            ``AGENT_PAYLOAD_KEYS`` takes). ``None`` reads ``AGENT_PAYLOAD_KEYS`` when the client
            is configured. Used only when the client brings no codec of its own.
        conversation_cache: Conversations the model activity keeps, so each model call carries
            only what is new (see ``activities/history.py``); 0 keeps none.
        service_name: ``service.name`` of the spans when tracing is on (``OTEL_SERVICE_NAME``
            wins).
        result_keys: The keys that seal every activity result (``ResultKeys``, or the text
            ``AGENT_RESULT_KEYS`` takes; ``worker.result_keys``). ``None`` reads
            ``AGENT_RESULT_KEYS`` when a worker or replayer is built; a worker without keys
            refuses to start.
        unsigned_results: Run workers without result keys (logged loudly at every start):
            anyone who may complete an activity by id can then answer as the model or a tool.
        receipt_keys: The Ed25519 keys that sign decision receipts (``ReceiptKeys``, or the
            text ``AGENT_RECEIPT_KEYS`` takes; ``worker.receipt_keys``). ``None`` reads
            ``AGENT_RECEIPT_KEYS``; without keys, receipts are issued unsigned.
        channels: Where paused calls are announced, by the names agents give them
            (``Agent(notify=["approvals"])``): ``SlackChannel``, ``EmailChannel`` or a
            ``Channel`` of the team's own. Their secrets stay on the worker.

    Raises:
        ValueError: no agents, or a ``gemini`` client with the SDK's own retries on.
    """

    def __init__(
        self,
        *,
        agents: Sequence[Agent],
        gemini: genai.Client | None = None,
        payload_keys: PayloadKeys | str | None = None,
        conversation_cache: int = 1000,
        service_name: str = "agent-worker",
        result_keys: ResultKeys | str | None = None,
        unsigned_results: bool = False,
        channels: Mapping[str, Channel] | None = None,
        receipt_keys: ReceiptKeys | str | None = None,
    ) -> None:
        if not agents:
            raise ValueError("AgentsPlugin needs at least one agent")
        if gemini is not None:
            _reject_sdk_retries(gemini)
        # With the agents they call as tools (agent_tool): a child conversation runs on the
        # caller's task queue, so the same workers host it.
        self.agents: tuple[Agent, ...] = tuple(with_sub_agents(agents))
        self._gemini = gemini
        self._keys = (
            PayloadKeys.parse(payload_keys) if isinstance(payload_keys, str) else payload_keys
        )
        self._conversation_cache = conversation_cache
        self._service_name = service_name
        self._result_keys_given = result_keys
        self._unsigned = unsigned_results
        self._channels = dict(channels or {})
        self._receipt_keys = resolve_receipt_keys(receipt_keys)
        # Resolved when the first worker or replayer is built (a client alone needs none).
        self._result_keys: ResultKeys | None = None
        self._activities: AgentActivities | None = None
        super().__init__(
            PLUGIN_NAME,
            data_converter=self._converter,
            workflows=[AgentWorkflow],
            activities=self._add_activities,
            workflow_runner=_runner,
            run_context=self._run_context,
        )

    @contextlib.asynccontextmanager
    async def _run_context(self) -> AsyncIterator[None]:
        """Around each worker's run: its MCP sessions (and stdio servers) end with it."""
        try:
            yield
        finally:
            if self._activities is not None:
                await self._activities.mcp.aclose()

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Check the namespace before the worker polls: without the search attributes the
        conversations upsert, every workflow task of theirs would fail (and retry forever), so
        the worker refuses to start with ``MissingSearchAttributes``, whose message gives the
        command that registers them."""
        try:
            await check_search_attributes(worker.client)
        except BaseException:
            await _never_started(worker, next)
            raise
        await super().run_worker(worker, next)

    @property
    def agent_activities(self) -> AgentActivities:
        """The model and tool activities the workers run (one set, shared by every worker the
        plugin configures); built with the model client on first use."""
        if self._activities is None:
            self._activities = AgentActivities(
                self.agents,
                gemini=self._gemini if self._gemini is not None else default_gemini(),
                result_keys=self.result_keys,
                conversation_cache=self._conversation_cache,
                channels=self._channels,
            )
        return self._activities

    @property
    def result_keys(self) -> ResultKeys:
        """The keys the workers seal and check results with (resolved on first use).

        Raises:
            ResultKeysMissing: none given, none in ``AGENT_RESULT_KEYS``, and nothing says to
                run without them.
        """
        if self._result_keys is None:
            self._result_keys = resolve_result_keys(
                self._result_keys_given, unsigned=self._unsigned
            )
        return self._result_keys

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        config = super().configure_client(config)
        # Not a SimplePlugin interceptor: a client that brought its own TracingInterceptor keeps
        # it alone, rather than tracing every call twice.
        add_tracing(config, service_name=self._service_name)
        return config

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        converter = config["client"].data_converter
        if not issubclass(converter.payload_converter_class, AgentPayloadConverter):
            raise ValueError(
                "AgentsPlugin is on this worker but not on its client: a worker uses its "
                "client's data converter, which the plugin sets. Give it to the client instead, "
                "Client.connect(..., plugins=[AgentsPlugin(...)]): the client's plugins reach "
                "its workers"
            )
        if AgentWorkflow in (config.get("workflows") or ()):
            raise ValueError(
                "AgentWorkflow is already on this worker (an AgentsPlugin on both the client "
                "and the worker, or two of them): give one AgentsPlugin, to the client"
            )
        config["interceptors"] = [
            *(config.get("interceptors") or ()),
            ResultKeysInterceptor(self.result_keys, receipt_keys=self._receipt_keys),
        ]
        return super().configure_worker(config)

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        # A replay decides as the workers did only with the keys they checked results with.
        config["interceptors"] = [
            *(config.get("interceptors") or ()),
            ResultKeysInterceptor(self.result_keys, receipt_keys=self._receipt_keys),
        ]
        return config

    def _add_activities(
        self, existing: Sequence[Callable[..., Any]] | None
    ) -> list[Callable[..., Any]]:
        return [*(existing or ()), *self.agent_activities.activities()]

    def _converter(self, existing: DataConverter | None) -> DataConverter:
        return agent_converter(existing, keys=self._keys)


def agent_converter(
    existing: DataConverter | None, *, keys: PayloadKeys | None = None
) -> DataConverter:
    """The data converter a client hosting or calling agents needs, made from the one it has.

    - None, the SDK's default or its pydantic converter, without a codec: the pydantic converter
      with the payload codec (``codec.data_converter``), encrypting with ``keys`` (``None``:
      ``AGENT_PAYLOAD_KEYS``).
    - Ours already (``codec.data_converter``): kept as it is; ``keys`` other than the ones its
      codec has (or beside a codec of the team's own) are refused, never dropped.
    - A codec of the team's own, on the default or pydantic payload converter: the codec is kept
      and the payload converter becomes ours; keys as well would encrypt twice, and are refused.

    Raises:
        ValueError: a payload converter of the team's own (the workflow's payloads need ours),
            both a codec of the team's own and keys, or keys other than those of the codec the
            client has.
        PayloadKeysError: ``AGENT_PAYLOAD_KEYS`` cannot be used.
    """
    if existing is None:
        return data_converter(keys)
    if issubclass(existing.payload_converter_class, AgentPayloadConverter):
        if existing.payload_codec is None:
            return data_converter(keys)
        _refuse_other_keys(existing, keys)
        _warn_if_writing_in_the_clear(existing)
        return existing
    if existing.payload_converter_class not in _REPLACEABLE:
        raise ValueError(
            f"the client's payload converter is {existing.payload_converter_class.__name__}; "
            "AgentsPlugin needs its own (temporal_agent_interrupts.codec.AgentPayloadConverter, "
            "the pydantic converter, which reads and writes everything the default does): "
            "connect with a codec of your own if you need one, not a payload converter"
        )
    if existing.payload_codec is None:
        return data_converter(keys)
    chosen = keys if keys is not None else load_keys()
    if chosen:
        raise ValueError(
            f"the client has a payload codec of its own ({type(existing.payload_codec).__name__}) "
            f"and payload keys are given ({ENV_VAR} or payload_keys=): every payload would be "
            "encrypted twice; keep one"
        )
    # The SDK's failure converter becomes ours too: it reads a forged failure's unconvertible
    # details as a placeholder rather than fail the workflow task (codec.ReadingFailureConverter).
    failures = existing.failure_converter_class
    if failures is DefaultFailureConverter:
        failures = ReadingFailureConverter
    return dataclasses.replace(
        existing, payload_converter_class=AgentPayloadConverter, failure_converter_class=failures
    )


def _runner(existing: WorkflowRunner | None) -> WorkflowRunner:
    """The sandbox with this package's pass-through modules, keeping what the team chose."""
    if isinstance(existing, OurRunner):
        return existing  # build_worker's, or a replay test's strict one
    if existing is None or (
        isinstance(existing, SandboxedWorkflowRunner)
        and existing.restrictions is SandboxRestrictions.default
    ):
        return sandbox_runner()
    if isinstance(existing, SandboxedWorkflowRunner):
        # Ours, with their restrictions: its instances carry the QueryTimeGuard.
        return OurRunner(
            restrictions=existing.restrictions.with_passthrough_modules(*PASSTHROUGH),
            runner_class=existing.runner_class,
        )
    if isinstance(existing, GuardedRunner):
        return existing
    # Unsandboxed: the team's decision, and theirs to review; the guard goes in front of it.
    return GuardedRunner(existing)


def _refuse_other_keys(converter: DataConverter, keys: PayloadKeys | None) -> None:
    """Keys given explicitly (``payload_keys=``) that the client's codec does not have would be
    dropped: payloads written in the clear, or under other keys, than the plugin was told."""
    if keys is None:
        return
    codec = codec_of(converter)
    if codec is not None and codec.keys.keys == keys.keys:
        return  # the same keys (a client copied with its plugin, say)
    has = (
        f"our codec with {f'keys {list(codec.keys.ids)}' if codec.keys else 'no keys'}"
        if codec is not None
        else f"a codec of its own ({type(converter.payload_codec).__name__})"
    )
    raise ValueError(
        f"the client's data converter already has {has}, and payload_keys= gives "
        f"{f'keys {list(keys.ids)}' if keys else 'no keys'}: the plugin would drop them. Give "
        "the keys to one place: the client's converter (codec.data_converter(keys)), or "
        "AgentsPlugin(payload_keys=...) on a client connected without a data converter"
    )


def _warn_if_writing_in_the_clear(converter: DataConverter) -> None:
    """A client connected with ``codec.data_converter(NO_KEYS)`` while ``AGENT_PAYLOAD_KEYS`` is
    set writes every payload in the clear, though the environment says to encrypt."""
    codec = codec_of(converter)
    if (
        isinstance(codec, EncryptionCodec)
        and not codec.keys
        and os.environ.get(ENV_VAR, "").strip()
    ):
        log.warning(
            "%s is set, but the client given to the agents' worker has a codec without keys: "
            "this worker writes payloads IN THE CLEAR. Connect the client with "
            "data_converter=temporal_agent_interrupts.codec.data_converter() (which reads %s), "
            "or without a data converter and with AgentsPlugin",
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
    from temporal_agent_interrupts.worker.offline_model import streaming
    from temporal_agent_interrupts.worker.standin import GeminiStandIn

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

"""``agent-worker``: host agents on a task queue until SIGTERM or Ctrl-C.

Internal: not covered by the 0.1.x stability promise (the command and its flags are documented
in docs/reference/settings.md; the public API is the package root and its namespaces).

Connection settings come from ``temporalio.envconfig`` through ``client.api.connect_config``
(``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``,
``TEMPORAL_CONFIG_FILE`` and ``TEMPORAL_PROFILE``), the same path ``agentctl`` and
``AgentClient.connect`` take. With ``--dev-server`` and no address configured anywhere, the
embedded Temporal dev server is started under ``.temporal/`` (unless one already listens on
``localhost:7233``); a configured address, even ``localhost:7233``, is never started for.

Payload encryption: ``AGENT_PAYLOAD_KEYS`` (``client.codec``) encrypts what the worker writes and
decrypts what it reads. A payload it cannot decrypt stops it only when the fleet wrote it and no
caller chose it: an activity's input, which the workflow always writes with the fleet's first
key. Then this worker lacks a key its fleet writes with: it logs the key id and the
conversation, stops gracefully and exits 3, so that a worker that has the key takes the call (the
workflow schedules again a model or tool call whose input this worker could not read; it never
ran). Anything else it cannot decrypt stops nothing: a signal or update argument under a foreign
key is refused as malformed, a query fails, and a workflow task that cannot read its
conversation's input, state or an activity's result fails naming the key id (Temporal retries it,
on whichever worker polls) while this worker goes on serving other conversations. With
``--dev-server`` and keys, the codec server (``temporal_agent_interrupts.codec_server``) runs
in this process on port 8081, and a dev server started here shows payloads in the clear in its UI
through it.

Exit codes: 0 after a graceful stop (or a done ``--setup-search-attributes``); 1 when Temporal
cannot be reached or does not answer; 2 for a bad ``--agents`` (checked first, before anything
connects), an unusable configuration (``AGENT_PAYLOAD_KEYS`` included), or a namespace without
the search attributes (the message says what to fix); 3 after stopping because an activity's
input was encrypted with a key ``AGENT_PAYLOAD_KEYS`` does not list, or one it lists under that id
does not open (the log names the key id).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import signal
import subprocess
import sys
import types
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import NoReturn, TypeVar

from temporalio.client import Client
from temporalio.service import RPCError

from temporal_agent_interrupts.codec import (
    PayloadKeyMissing,
    PayloadKeys,
    data_converter,
    load_keys,
)
from temporal_agent_interrupts.codec_server import DEFAULT_PORT as CODEC_PORT
from temporal_agent_interrupts.codec_server import DEV_UI_ORIGINS, CodecServer
from temporal_agent_interrupts.connection import (
    DEFAULT_ADDRESS,
    DEFAULT_TASK_QUEUE,
    connect_answering,
    connect_config,
)
from temporal_agent_interrupts.errors import ConnectionConfigError, ServerNotAnswering
from temporal_agent_interrupts.tracing import add_tracing, flush_tracing
from temporal_agent_interrupts.worker import (
    DEFAULT_MAX_CACHED_WORKFLOWS,
    build_worker,
    has_gemini_key,
)
from temporal_agent_interrupts.worker.devserver import (
    adopt_dev_server,
    pid_file,
    port_open,
    release_dev_server,
    start_dev_server,
    wait_for_port,
)
from temporal_agent_interrupts.worker.observability import metrics_runtime
from temporal_agent_interrupts.worker.peers import unlike_peers, worker_identity
from temporal_agent_interrupts.worker.receipt_keys import (
    ReceiptKeys,
    dev_receipt_key_file,
    dev_receipt_keys,
    generate_receipt_key,
    resolve_receipt_keys,
)
from temporal_agent_interrupts.worker.result_keys import (
    ResultKeysMissing,
    dev_result_keys,
    generate_result_key,
    resolve_result_keys,
)
from temporal_agent_interrupts.worker.search_attributes import (
    MissingSearchAttributes,
    SearchAttributesRefused,
    check_search_attributes,
    setup_search_attributes,
)
from temporal_agent_interrupts.workflows import Agent

log = logging.getLogger("temporal_agent_interrupts.worker")

T = TypeVar("T")

STATE_DIR = Path(".temporal")
DEV_SERVER_PORT = 7233  # DEFAULT_ADDRESS's
AGENTS_VAR = "AGENT_MODULES"
"""Where ``--agents`` values come from when the command line gives none: whitespace- or
comma-separated ``MODULE[:NAME]`` specs (a container's environment, say)."""

# Capacity defaults, sized for a 2-core box (docs/operating/deploying.md). Model and tool calls
# are async and wait on the network, so 50 at once costs little CPU. Workflow tasks are CPU work
# under one GIL: 20 at once keeps the queue moving without starving activities, and a busy worker
# shows up as schedule-to-start latency while other workers take the rest. A short paused
# conversation holds about 0.2 MB in the cache (measured: bench b2), and a paused one is only
# waiting: it lives in Temporal, and is replayed from history when it is next answered. So the
# cache holds what the worker is working on, not everything it ever touched (see
# worker.DEFAULT_MAX_CACHED_WORKFLOWS).
DEFAULT_MAX_CONCURRENT_ACTIVITIES = 50
DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS = 20
DEFAULT_GRACEFUL_SHUTDOWN_SECONDS = 10.0


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _cache_size(value: str) -> int:
    number = int(value)  # 0 is allowed: no sticky cache, every task replays (tests, debugging)
    if number < 0:
        raise ValueError(value)
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


def _host_port(value: str) -> str:
    host, colon, port = value.rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, like 0.0.0.0:9464, not {value!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (the docs' promise) instead of the whole
    usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _from_env(p: argparse.ArgumentParser, name: str, parse: Callable[[str], T], default: T) -> T:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return parse(value)
    except (ValueError, argparse.ArgumentTypeError):
        p.error(f"environment variable {name}={value!r} is not a valid value")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _Parser(
        prog="agent-worker",
        description="Host agents on a task queue until SIGTERM or Ctrl-C. The Temporal "
        "connection comes from TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, "
        "TEMPORAL_TLS_*, TEMPORAL_CONFIG_FILE and TEMPORAL_PROFILE (temporalio.envconfig); "
        "without an address, localhost:7233.",
    )
    p.add_argument(
        "--task-queue",
        default=os.environ.get("AGENT_TASK_QUEUE") or DEFAULT_TASK_QUEUE,
        help="task queue to poll (env AGENT_TASK_QUEUE; default %(default)s)",
    )
    p.add_argument(
        "--agents",
        action="append",
        default=None,
        metavar="MODULE[:NAME]",
        help="agents to host: MODULE:NAME names an Agent or a list of Agents in an importable "
        "module; MODULE alone means MODULE:ALL_AGENTS; repeat the flag to host more (env "
        f"{AGENTS_VAR}; required: a clone's example agents are --agents examples)",
    )
    p.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="a Cedar policy file that decides every hosted agent's tool calls: allow, ask or "
        "deny (docs/governance.md); an agent that declares its own policy= is refused",
    )
    p.add_argument("--profile", default=None, help="envconfig profile (env TEMPORAL_PROFILE)")
    p.add_argument(
        "--config-file",
        default=None,
        help="envconfig TOML file with the profiles (env TEMPORAL_CONFIG_FILE)",
    )
    p.add_argument(
        "--setup-search-attributes",
        action="store_true",
        help="register the project's search attributes on the namespace, then exit",
    )
    p.add_argument(
        "--generate-result-key",
        action="store_true",
        help="print a new id:base64key entry for AGENT_RESULT_KEYS (the key that seals every "
        "activity result; every worker of a task queue needs the same), then exit",
    )
    p.add_argument(
        "--generate-receipt-key",
        action="store_true",
        help="print a new id:base64seed entry for AGENT_RECEIPT_KEYS (an Ed25519 key that signs "
        "decision receipts; put a new one first and keep the old listed to rotate), then exit",
    )
    p.add_argument(
        "--print-receipt-jwks",
        action="store_true",
        help="print the public keys of AGENT_RECEIPT_KEYS as a JWK Set (what `agentctl verify "
        "--keys` reads; the web app serves it at /.well-known/agent-receipt-keys.json), then "
        "exit",
    )
    p.add_argument(
        "--dev-server",
        action="store_true",
        help="start the embedded dev server under .temporal/ when no address is configured "
        "(no TEMPORAL_ADDRESS, none in a profile) and nothing listens on localhost:7233 yet",
    )
    p.add_argument(
        "--max-concurrent-activities",
        type=_positive_int,
        default=_from_env(
            p, "AGENT_MAX_CONCURRENT_ACTIVITIES", _positive_int, DEFAULT_MAX_CONCURRENT_ACTIVITIES
        ),
        help="model and tool calls run at once (env AGENT_MAX_CONCURRENT_ACTIVITIES; "
        "default %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-workflow-tasks",
        type=_positive_int,
        default=_from_env(
            p,
            "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS",
            _positive_int,
            DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
        ),
        help="workflow tasks processed at once (env AGENT_MAX_CONCURRENT_WORKFLOW_TASKS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--max-cached-workflows",
        type=_cache_size,
        default=_from_env(
            p, "AGENT_MAX_CACHED_WORKFLOWS", _cache_size, DEFAULT_MAX_CACHED_WORKFLOWS
        ),
        help="conversations kept in memory between tasks (env AGENT_MAX_CACHED_WORKFLOWS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--graceful-shutdown-seconds",
        type=_seconds,
        default=_from_env(
            p, "AGENT_GRACEFUL_SHUTDOWN_SECONDS", _seconds, DEFAULT_GRACEFUL_SHUTDOWN_SECONDS
        ),
        help="how long running tool calls may finish after SIGTERM (env "
        "AGENT_GRACEFUL_SHUTDOWN_SECONDS; default %(default)s); give the container a longer "
        "stop grace period",
    )
    p.add_argument(
        "--metrics-bind",
        type=_host_port,
        default=_from_env(p, "AGENT_METRICS_BIND", _host_port, None),
        metavar="HOST:PORT",
        help="serve the SDK's Prometheus metrics on http://HOST:PORT/metrics (env "
        "AGENT_METRICS_BIND; default off)",
    )
    p.add_argument(
        "--web",
        type=_host_port,
        default=_from_env(p, "AGENT_WEB_BIND", _host_port, None),
        metavar="HOST:PORT",
        help="also serve the web app (AG-UI, the approvals API, the inbox page at /inbox) on "
        "http://HOST:PORT (env AGENT_WEB_BIND; default off; `make run` serves it on "
        "127.0.0.1:8234)",
    )
    p.add_argument(
        "--web-identity",
        choices=["dev", "bearer"],
        default=os.environ.get("AGENT_WEB_IDENTITY") or "dev",
        help="who answers through the web app: dev takes the X-Agent-Identity header and "
        "serves loopback only (one machine); bearer passes the request's bearer token on as "
        "the answer's identity token, for agents with trust= (env AGENT_WEB_IDENTITY; default "
        "%(default)s)",
    )
    args = p.parse_args(argv)
    if args.web and args.web_identity == "dev" and args.web.rsplit(":", 1)[0] not in _LOOPBACK:
        p.error("--web-identity dev serves loopback only: bind --web to 127.0.0.1")
    return args


_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


class _FolderModules(importlib.abc.MetaPathFinder):
    """The last finder on ``sys.meta_path``: ``names`` (top-level modules or packages) from
    ``folder``, and nothing else from there; a package's submodules are found through it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.names: set[str] = set()

    @classmethod
    def serve(cls, folder: str, names: set[str]) -> None:
        finder = next((f for f in sys.meta_path if isinstance(f, cls) and f.folder == folder), None)
        if finder is None:
            finder = cls(folder)
            sys.meta_path.append(finder)
        finder.names |= names

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or fullname not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.folder])


class AgentSpecError(ValueError):
    """An ``--agents`` value that names no agents; the one-line message says why."""


def with_policy(agents: Sequence[Agent], path: str | None) -> list[Agent]:
    """``agents``, each deciding its tool calls with the Cedar policy file at ``path`` (none:
    as they are). The file is parsed here, before anything connects, so a bad policy is a
    usage error naming the file and Cedar's message.

    Raises:
        AgentSpecError: the file cannot be read or parsed, or an agent declares its own
            ``policy=`` (which of the two decides would be a guess).
    """
    if path is None:
        return list(agents)
    # Cedar (a native extension) loads only for a worker that is given a policy.
    from temporal_agent_interrupts.activities.policy import Policy, PolicyError

    try:
        policy = Policy.from_file(path)
    except PolicyError as e:
        raise AgentSpecError(f"--policy {e}") from None
    own = [a.name for a in agents if a.policy is not None]
    if own:
        raise AgentSpecError(
            f"--policy {path}: agents {own} declare a policy of their own; host them on a "
            "worker without --policy, or drop their policy="
        )
    try:
        # replace() runs the agent's checks again: the policy's group approvers need trust=.
        return [dataclasses.replace(a, policy=policy) for a in agents]
    except ValueError as e:
        raise AgentSpecError(f"--policy {path}: {e}") from None


def load_agents(specs: Sequence[str] | None) -> list[Agent]:
    """The agents ``--agents`` values name, in order, else those ``AGENT_MODULES`` names.

    There is no default: the package ships no agents (the examples live in the repository, not
    in the wheel), and a worker that quietly hosted someone else's would take conversations
    meant for the real ones on a shared queue.

    Raises:
        AgentSpecError: no spec at all, a module that cannot be imported or raises while
            importing, a missing name, or a value that is not an Agent or a list of Agents.
    """
    if not specs:
        specs = os.environ.get(AGENTS_VAR, "").replace(",", " ").split()
    if not specs:
        raise AgentSpecError(
            f"no agents to host: name them with --agents MODULE[:NAME] (or {AGENTS_VAR}); "
            "from a clone, --agents examples hosts the example agents"
        )
    # The folder the command runs in holds the author's package, as it does for `python -m`;
    # an installed console script starts with only its own bin/ folder on sys.path, so
    # `agent-worker --agents mypackage.agents` found nothing. That folder serves the modules
    # named here and nothing else, after everything installed: on sys.path, even last, it would
    # also serve every module the worker's libraries try and lack (httpx2 looks for h2, socksio
    # and trio, Starlette for multipart), so a socksio.py left in a folder others can write to
    # (/tmp) would run inside the worker.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        _FolderModules.serve(here, {spec.partition(":")[0].strip().split(".")[0] for spec in specs})
    agents: list[Agent] = []
    for spec in specs:
        try:
            agents += _agents_of(spec)
        except AgentSpecError as e:
            raise AgentSpecError(f"--agents {spec}: {e}") from None
    return agents


def _agents_of(spec: str) -> list[Agent]:
    module_name, colon, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name:
        raise AgentSpecError("no module before the colon; expected MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        # Either the module is not on the path, or it is and one of its own imports is not.
        raise AgentSpecError(f"cannot import module {module_name!r}: {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001  # the author's code at import time: any error at all
        raise AgentSpecError(
            f"importing module {module_name!r} raised {type(e).__name__}: {_one_line(e)}"
        ) from None
    if not colon or not attr:
        if not hasattr(module, "ALL_AGENTS"):
            raise AgentSpecError(
                f"module {module_name} has no ALL_AGENTS; name the agent: {module_name}:NAME"
                + _offer(module)
            )
        attr = "ALL_AGENTS"
    if not hasattr(module, attr):
        raise AgentSpecError(f"module {module_name!r} has no attribute {attr!r}" + _offer(module))
    value = getattr(module, attr)
    if isinstance(value, types.ModuleType):
        raise AgentSpecError(
            f"{module_name}:{attr} is a module, not an Agent or a list of Agents; name one "
            f"inside it: {value.__name__}:NAME"
        )
    if not isinstance(value, list | tuple):
        if not isinstance(value, Agent):
            raise AgentSpecError(
                f"{module_name}:{attr} is {_a(value)}, not an Agent or a list of Agents"
            )
        return [value]
    if not value:
        raise AgentSpecError(f"{module_name}:{attr} is empty: no agents to host")
    for n, item in enumerate(value):
        if not isinstance(item, Agent):
            raise AgentSpecError(f"item {n} of {module_name}:{attr} is {_a(item)}, not an Agent")
    return list(value)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or "(no message)"


def _a(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _offer(module: types.ModuleType) -> str:
    """The names in ``module`` that ``--agents`` could take, for a typo's message."""
    names = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (
            isinstance(value, Agent)
            or (
                isinstance(value, list | tuple)
                and bool(value)
                and all(isinstance(v, Agent) for v in value)
            )
        )
    ]
    return f" (agents there: {', '.join(sorted(names))})" if names else ""


def wants_dev_server(*, requested: bool, configured_address: str | None) -> bool:
    """Whether ``--dev-server`` may start the embedded server: only for the default address.

    An address from ``TEMPORAL_ADDRESS`` or a profile, even ``localhost:7233``, is a server
    someone else runs; nothing answering there is an error to report, not a gap to fill.
    """
    return requested and configured_address is None


async def _maybe_start_dev_server(
    args: argparse.Namespace, configured_address: str | None, *, codec_endpoint: str | None
) -> tuple[subprocess.Popen[bytes] | None, int | None]:
    """The dev server this worker started, or the pid of the one it adopted (else None)."""
    if not wants_dev_server(requested=args.dev_server, configured_address=configured_address):
        return None, None
    db_file = STATE_DIR / "temporal.db"
    if port_open(DEV_SERVER_PORT):
        # Whether it answers as Temporal is checked by connecting, as for any other server.
        adopted = adopt_dev_server(db_file)
        log.info(
            "a Temporal server already listens on %s; using it%s",
            DEFAULT_ADDRESS,
            f" (the dev server pid {adopted} that an earlier make demo started: make stop "
            "leaves it alone while this worker runs)"
            if adopted
            else "",
        )
        return None, adopted
    proc = start_dev_server(
        db_file=db_file, log_file=STATE_DIR / "dev-server.log", codec_endpoint=codec_endpoint
    )
    await wait_for_port(DEV_SERVER_PORT, proc=proc)
    log.info("Temporal dev server started (UI: http://localhost:8233, data: .temporal/)")
    return proc, None


async def _start_codec_server(keys: PayloadKeys) -> CodecServer | None:
    """``make run``'s codec server, for the embedded dev server's UI (None if the port is
    taken: the UI then shows payloads encrypted, and the worker runs on)."""
    try:
        server = await CodecServer(
            keys, namespaces=["default"], cors_origins=DEV_UI_ORIGINS, port=CODEC_PORT
        ).start()
    except OSError as e:
        log.warning(
            "could not start the codec server on 127.0.0.1:%d (%s): the UI will show payloads "
            "encrypted; run `agent-codec-server --cors-origin %s` elsewhere",
            CODEC_PORT,
            e.strerror or e,
            DEV_UI_ORIGINS[0],
        )
        return None
    log.info("codec server on %s: the UI shows payloads in the clear", server.url)
    return server


async def run(args: argparse.Namespace, agents: Sequence[Agent]) -> int:
    try:
        # Without a default, so that "nothing configured" (the dev server's case) shows.
        config = connect_config(
            profile=args.profile, config_file=args.config_file, default_address=None
        )
        keys = load_keys()
        # The embedded default signs with a development key file, as it seals results.
        receipt_keys = (
            dev_receipt_keys()
            if config.get("target_host") is None and not args.setup_search_attributes
            else resolve_receipt_keys(None)
        )
        # On the embedded default (nothing configured: the local dev server) the workers share
        # a development key file; any other deployment sets AGENT_RESULT_KEYS (or
        # AGENT_UNSIGNED_RESULTS=1, said loudly).
        result_keys = (
            None  # registering search attributes runs no worker
            if args.setup_search_attributes
            else dev_result_keys()
            if config.get("target_host") is None
            else resolve_result_keys()
        )
    except (ConnectionConfigError, ResultKeysMissing) as e:
        log.error("%s", e)
        return 2
    codec_server: CodecServer | None = None
    if keys and wants_dev_server(
        requested=args.dev_server, configured_address=config.get("target_host")
    ):
        codec_server = await _start_codec_server(keys)
    server, adopted = await _maybe_start_dev_server(
        args,
        config.get("target_host"),
        codec_endpoint=f"http://localhost:{CODEC_PORT}" if keys else None,
    )
    config.setdefault("target_host", DEFAULT_ADDRESS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    missing: list[PayloadKeyMissing] = []

    def on_missing_key(error: PayloadKeyMissing) -> None:
        # Called only for an activity's input (client.codec.EncryptedPayloadConverter): the
        # fleet wrote it with a key this worker lacks. Leave the call to one that has it (exit 3).
        if not missing:
            missing.append(error)
            loop.call_soon_threadsafe(stop.set)

    try:
        config["data_converter"] = data_converter(keys, on_missing_key=on_missing_key)
        if args.metrics_bind:
            # Temporal's metrics and the product's (interrupts raised, answered, expired...).
            config["runtime"] = metrics_runtime(args.metrics_bind)
        # OTEL_EXPORTER_OTLP_ENDPOINT: the worker's workflows and activities join the traces.
        add_tracing(config, service_name="agent-worker")
        try:
            client = await connect_answering(config)
        except ServerNotAnswering as e:
            log.error("%s", e)
            return 1
        except ConnectionConfigError as e:
            log.error("%s", e)
            return 2
        except RuntimeError as e:
            log.error(
                "cannot connect to Temporal at %s (namespace %r): %s",
                config["target_host"],
                config.get("namespace", "default"),
                e,
            )
            return 1
        if args.setup_search_attributes:
            try:
                added = await setup_search_attributes(client)
            except SearchAttributesRefused as e:
                log.error("%s", e)
                return 2
            print(
                f"namespace {client.namespace}: "
                + (
                    f"registered {', '.join(added)}"
                    if added
                    else "search attributes already present"
                )
            )
            return 0
        try:
            await check_search_attributes(client)
        except MissingSearchAttributes as e:
            log.error("%s", e)
            return 2
        except RPCError as e:
            # Typically a namespace that does not exist, or credentials it does not accept.
            log.error(
                "Temporal at %s answered with an error for namespace %r: %s",
                config["target_host"],
                client.namespace,
                e.message,
            )
            return 2
        identity = worker_identity(agents)
        worker = build_worker(
            client,
            agents=agents,
            task_queue=args.task_queue,
            result_keys=result_keys,
            receipt_keys=receipt_keys,
            identity=identity,
            max_concurrent_activities=args.max_concurrent_activities,
            max_concurrent_workflow_tasks=args.max_concurrent_workflow_tasks,
            max_cached_workflows=args.max_cached_workflows,
            graceful_shutdown_timeout=timedelta(seconds=args.graceful_shutdown_seconds),
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Everything made so far (modules, pydantic validators, the SDK, google-genai) lives as
        # long as the process: frozen, a full garbage collection no longer walks it. Measured:
        # 132k objects, a full collection 100 ms before and 0 after. A collection runs inside
        # whatever workflow activation triggers it, and the SDK fails a workflow task that does
        # not yield within 2 s, so its pauses count against that limit.
        gc.collect()
        gc.freeze()
        web = _start_web(args, client, receipt_keys) if args.web else None
        async with worker:
            log.info(
                "worker ready: Temporal %s, namespace %r, task queue %r, agents %s, model %s; "
                "capacity: %d activities, %d workflow tasks, %d cached conversations%s",
                config["target_host"],
                client.namespace,
                args.task_queue,
                [a.name for a in agents],
                "Gemini API" if has_gemini_key() else "offline stand-in",
                args.max_concurrent_activities,
                args.max_concurrent_workflow_tasks,
                args.max_cached_workflows,
                f"; metrics on http://{args.metrics_bind}/metrics" if args.metrics_bind else "",
            )
            await _warn_of_unlike_peers(client, args.task_queue, agents, identity)
            await stop.wait()
            # Leaving the block shuts down gracefully: polls stop, running activities get
            # time to finish, and the server hands cached conversations to other workers at
            # once instead of after a sticky-queue timeout.
            if missing:
                log.error(
                    "%s. That was a model or tool call's input, which the workflow writes with "
                    "the key its fleet encrypts with: this worker lacks it, so it stops (exit 3) "
                    "and leaves the call to a worker that has it. The call never ran; the "
                    "workflow schedules it again (for up to a day), and until a worker with the "
                    "key takes it the conversation waits",
                    missing[0],
                )
            log.info("shutting down gracefully")
            if web is not None:
                web.cancel()
                await asyncio.gather(web, return_exceptions=True)
        return 3 if missing else 0
    finally:
        if codec_server is not None:
            await codec_server.stop()
        if adopted is not None:
            release_dev_server(STATE_DIR / "temporal.db", adopted)
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
            # Gone with the server: a stale pid could name an unrelated process later.
            pid_file(STATE_DIR / "temporal.db").unlink(missing_ok=True)


def _start_web(
    args: argparse.Namespace, client: Client, receipt_keys: ReceiptKeys | None
) -> asyncio.Task[None]:
    """The web app (``client/web.py``) in this process, on this worker's connection; it
    publishes the receipt keys' public half (never a private key: it gets the JWK Set)."""
    # Imported here: a worker that serves no web app needs none of Starlette or uvicorn.
    from temporal_agent_interrupts.client.api import AgentClient
    from temporal_agent_interrupts.client.web import agents_app, serve

    host, _, port = args.web.rpartition(":")
    app = agents_app(
        AgentClient(client, task_queue=args.task_queue),
        identity="bearer" if args.web_identity == "bearer" else None,
        dev_loopback=args.web_identity == "dev",
        # One machine (`make run`): its inbox lists a newcomer's agent on its own queue too.
        inbox_queues="any" if args.web_identity == "dev" else None,
        receipt_jwks=receipt_keys.jwks() if receipt_keys is not None else None,
    )
    ready = asyncio.Event()

    async def run() -> None:
        serving = asyncio.create_task(
            serve(app, host=host.strip("[]"), port=int(port), ready=ready)
        )
        waiter = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if ready.is_set():
                log.info(
                    "web app on http://%s:%s (inbox: /inbox, AG-UI: POST /agui/<agent>; "
                    "identity: %s)",
                    host,
                    port,
                    args.web_identity,
                )
            await serving
        finally:
            waiter.cancel()
            serving.cancel()
            await asyncio.gather(serving, waiter, return_exceptions=True)

    task = asyncio.create_task(run())

    def stopped(done: asyncio.Task[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            # The worker goes on: conversations do not depend on the web app.
            log.error("the web app on %s stopped: %s", args.web, done.exception())

    task.add_done_callback(stopped)
    return task


def main(argv: Sequence[str] | None = None) -> None:
    level = (os.environ.get("AGENT_LOG_LEVEL") or "INFO").strip().upper()
    if level not in LOG_LEVELS:
        _usage_error(f"AGENT_LOG_LEVEL={level!r} is not one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "google_genai.models"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    if args.generate_result_key:
        print(generate_result_key())
        sys.stdout.flush()
        os._exit(0)
    if args.generate_receipt_key:
        print(generate_receipt_key())
        sys.stdout.flush()
        os._exit(0)
    if args.print_receipt_jwks:
        _print_receipt_jwks()
    try:
        # Before anything connects or starts a server, so that a typo fails at once. Registering
        # the search attributes hosts nothing: it runs from any folder, with no agents named and
        # whatever AGENT_MODULES says (a container's, naming modules that are not there).
        agents = (
            []
            if args.setup_search_attributes
            else with_policy(load_agents(args.agents), args.policy)
        )
    except AgentSpecError as e:
        _usage_error(str(e))
    from temporal_agent_interrupts.client.api import (
        run_to_exit,  # the client stack loads only when run
    )

    code = run_to_exit(run(args, agents))
    flush_tracing()  # the spans still batched: os._exit skips the hook that would send them
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown, where the SDK can abort (sdk-python issue 300).
    os._exit(code)


async def _warn_of_unlike_peers(
    client: Client, task_queue: str, agents: Sequence[Agent], identity: str
) -> None:
    try:
        peers = await unlike_peers(client, task_queue=task_queue, agents=agents, identity=identity)
    except RPCError as e:  # a namespace role without DescribeTaskQueue: nothing to warn about
        log.debug("could not list the pollers of task queue %r: %s", task_queue, e.message)
        return
    if peers:
        log.warning(
            "other workers on task queue %r host other agents: %s. Whichever worker takes a "
            "call serves it, so each fails the turns of agents it does not host: run different "
            "agents on a task queue of their own (AGENT_TASK_QUEUE), or host the same ones on "
            "every worker",
            task_queue,
            "; ".join(peers),
        )


def _print_receipt_jwks() -> NoReturn:
    """``--print-receipt-jwks``: the public half of ``AGENT_RECEIPT_KEYS``, every listed key."""
    try:
        keys = resolve_receipt_keys(None)
        if keys is None and dev_receipt_key_file().exists():
            # The embedded default's (make run's) development key.
            keys = dev_receipt_keys()
    except ConnectionConfigError as e:  # PayloadKeysError: the message names no key
        _usage_error(str(e))
    if keys is None:
        _usage_error(
            "AGENT_RECEIPT_KEYS is not set, and no development receipt key was made here "
            "(make run makes one): no receipt keys to publish"
        )
    print(json.dumps(keys.jwks(), indent=2))
    sys.stdout.flush()
    os._exit(0)


def _usage_error(message: str) -> NoReturn:
    print(f"agent-worker: error: {message}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(2)


if __name__ == "__main__":
    main()

"""``agent-worker`` and the client as deployed: configured only through the environment.

Each process here starts with a bare environment (no ``TEMPORAL_*`` or keys from the shell, and a
``HOME`` without a ``temporal.toml``), so the variables a test sets are the only configuration.
Servers are real dev servers: the session's, or a bare one started without the project's search
attributes, standing in for a namespace nobody has prepared.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.connection import connect_config
from temporal_agent_interrupts.errors import ConnectionConfigError
from temporal_agent_interrupts.worker.__main__ import (
    DEFAULT_MAX_CACHED_WORKFLOWS,
    DEFAULT_MAX_CONCURRENT_ACTIVITIES,
    DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
    parse_args,
)
from temporal_agent_interrupts.worker.devserver import DISPATCH_FLAG, temporal_cli
from temporal_agent_interrupts.worker.search_attributes import missing_search_attributes
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES
from tests.helpers import create_namespace, eventually, free_port, server_address

ROOT = Path(__file__).parent.parent
ATTRIBUTES = [key.name for key in SEARCH_ATTRIBUTES]

# Connects the way an application would, and says where it landed. It ends through
# run_script, as the docs tell scripts to: the SDK can abort at interpreter exit (sdk-python
# issue 300, exit code 134) after the probe printed its answer, which once failed this test.
CLIENT_PROBE = textwrap.dedent(
    """
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
    from temporal_agent_interrupts.client.api import AgentClient, run_script

    async def main():
        agents = await AgentClient.connect()
        await agents.temporal.workflow_service.get_system_info(GetSystemInfoRequest())
        print(agents.temporal.service_client.config.target_host, agents.temporal.namespace)

    run_script(main())
    """
)


def bare_environ(tmp_path: Path, **variables: str) -> dict[str, str]:
    """A process's environment with nothing of ours in it but the workers' result key, and where
    a clone's worker finds the example agents: the repository on the path (they are not in the
    package) and named, as the image does (Dockerfile: ``PYTHONPATH`` and ``AGENT_MODULES``). A
    variable given wins."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "LANG", "SYSTEMROOT") if k in os.environ}
    clone = {"PYTHONPATH": str(ROOT), "AGENT_MODULES": "examples"}
    # And the result key every deployment's workers share (workflows.seal): a worker pointed at
    # a configured server refuses to start without it.
    keys = {"AGENT_RESULT_KEYS": os.environ["AGENT_RESULT_KEYS"]}
    return {**env, **clone, **keys, "HOME": str(home), **variables}


class Process:
    """A child process whose merged output is collected as it runs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, *argv: str, env: dict[str, str], cwd: Path) -> Process:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self.lines)

    async def wait_for(self, text: str, *, timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while text not in self.output:
            if self.proc.returncode is not None:
                await self._reader
                if text in self.output:
                    return
                raise AssertionError(
                    f"exited {self.proc.returncode} before {text!r}:\n{self.output}"
                )
            if loop.time() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output}")
            await asyncio.sleep(0.05)

    async def wait(self, *, timeout: float = 60.0) -> int:
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"still running after {timeout}s:\n{self.output}") from None
        await self._reader
        return code

    async def stop(self) -> None:
        """Make sure nothing outlives the test, whatever happened in it."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self._reader


async def run_to_end(*argv: str, env: dict[str, str], cwd: Path, timeout: float = 60) -> Process:
    process = await Process.start(*argv, env=env, cwd=cwd)
    try:
        await process.wait(timeout=timeout)
    finally:
        await process.stop()
    return process


async def worker_cli(*args: str, env: dict[str, str], cwd: Path) -> Process:
    return await run_to_end(sys.executable, "-m", "worker", *args, env=env, cwd=cwd)


async def client_probe(*, env: dict[str, str], cwd: Path) -> Process:
    return await run_to_end(sys.executable, "-c", CLIENT_PROBE, env=env, cwd=cwd)


@pytest.fixture
def no_temporal_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process's own environment, cleared of connection settings from the shell."""
    for name in list(os.environ):
        if name.startswith("TEMPORAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return monkeypatch


@pytest.fixture
async def bare_server() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server started without the project's search attributes."""
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=list(DISPATCH_FLAG),
        dev_server_log_level="error",
        data_converter=pydantic_data_converter,
    )
    async with environment:
        yield environment


# --- one connection path, configured the Temporal way ------------------------------------------


async def test_temporal_address_alone_configures_the_worker_and_the_client(env, tmp_path):
    address = server_address(env.client)
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=address)

    setup = await worker_cli("--setup-search-attributes", env=environ, cwd=tmp_path)
    assert setup.proc.returncode == 0, setup.output
    assert "namespace default: search attributes already present" in setup.output

    probe = await client_probe(env=environ, cwd=tmp_path)
    assert probe.proc.returncode == 0, probe.output
    assert probe.output.split() == [address, "default"]


async def test_the_shipped_env_example_works_as_written(env, tmp_path):
    """Its empty entries count as unset: no TLS from an empty API key, no empty namespace."""
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    assert values["TEMPORAL_API_KEY"] == "" and "TEMPORAL_TLS_CLIENT_CERT_PATH" in values
    # Everything as shipped except the address, which names the compose service.
    environ = bare_environ(tmp_path, **{**values, "TEMPORAL_ADDRESS": server_address(env.client)})
    setup = await worker_cli("--setup-search-attributes", env=environ, cwd=tmp_path)
    assert setup.proc.returncode == 0, setup.output
    assert "search attributes already present" in setup.output


async def test_a_profile_file_chooses_the_server(env, tmp_path, no_temporal_env):
    address = server_address(env.client)
    config = tmp_path / "temporal.toml"
    # The default profile points at a closed port: only the named profile reaches the server.
    config.write_text(
        textwrap.dedent(
            f"""
            [profile.default]
            address = "127.0.0.1:1"

            [profile.staging]
            address = "{address}"
            namespace = "default"
            """
        )
    )
    by_env = bare_environ(tmp_path, TEMPORAL_CONFIG_FILE=str(config), TEMPORAL_PROFILE="staging")
    setup = await worker_cli("--setup-search-attributes", env=by_env, cwd=tmp_path)
    assert setup.proc.returncode == 0, setup.output
    probe = await client_probe(env=by_env, cwd=tmp_path)
    assert probe.proc.returncode == 0, probe.output
    assert probe.output.split() == [address, "default"]

    by_flags = await worker_cli(
        "--setup-search-attributes",
        "--config-file",
        str(config),
        "--profile",
        "staging",
        env=bare_environ(tmp_path),
        cwd=tmp_path,
    )
    assert by_flags.proc.returncode == 0, by_flags.output

    default = await worker_cli(
        "--setup-search-attributes",
        env=bare_environ(tmp_path, TEMPORAL_CONFIG_FILE=str(config)),
        cwd=tmp_path,
    )
    assert default.proc.returncode == 1, default.output
    assert "cannot connect to Temporal at 127.0.0.1:1" in default.output

    agents = await AgentClient.connect(profile="staging", config_file=str(config))
    assert agents.temporal.service_client.config.target_host == address


async def test_an_unknown_profile_is_a_clear_error(tmp_path, no_temporal_env):
    config = tmp_path / "temporal.toml"
    config.write_text(
        '[profile.default]\naddress = "127.0.0.1:1"\n[profile.prod]\naddress = "x:1"\n'
    )
    environ = bare_environ(tmp_path, TEMPORAL_CONFIG_FILE=str(config), TEMPORAL_PROFILE="stagin")
    worker = await worker_cli(env=environ, cwd=tmp_path)
    assert worker.proc.returncode == 2, worker.output
    assert "'stagin'" in worker.output and "default, prod" in worker.output
    assert "Traceback" not in worker.output

    no_temporal_env.setenv("TEMPORAL_CONFIG_FILE", str(config))
    with pytest.raises(ConnectionConfigError, match=r"'nope'.*profiles there: default, prod"):
        await AgentClient.connect(profile="nope")


async def test_a_named_config_file_that_is_missing_stops_instead_of_using_localhost(tmp_path):
    missing = tmp_path / "mounted" / "temporal.toml"
    environ = bare_environ(tmp_path, TEMPORAL_CONFIG_FILE=str(missing))
    worker = await worker_cli(env=environ, cwd=tmp_path)
    assert worker.proc.returncode == 2, worker.output
    assert str(missing) in worker.output and "does not exist" in worker.output
    assert "cannot connect" not in worker.output


def test_without_any_setting_the_address_is_localhost(no_temporal_env):
    assert connect_config() == {"target_host": "localhost:7233"}


def test_api_key_and_tls_settings_reach_the_connection(tmp_path, no_temporal_env):
    monkeypatch = no_temporal_env
    cert, key, ca = (tmp_path / n for n in ("client.pem", "client.key", "ca.pem"))
    for path in (cert, key, ca):
        path.write_bytes(f"-----{path.name}-----".encode())

    monkeypatch.setenv("TEMPORAL_ADDRESS", "ns.acct.tmprl.cloud:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "ns.acct")
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(cert))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(key))
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(ca))
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_NAME", "ns.acct.tmprl.cloud")
    config = connect_config()
    assert config["target_host"] == "ns.acct.tmprl.cloud:7233"
    assert config["namespace"] == "ns.acct"
    tls = config["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == cert.read_bytes()
    assert tls.client_private_key == key.read_bytes()
    assert tls.server_root_ca_cert == ca.read_bytes()
    assert tls.domain == "ns.acct.tmprl.cloud"

    for name in ("CLIENT_CERT_PATH", "CLIENT_KEY_PATH", "SERVER_CA_CERT_PATH", "SERVER_NAME"):
        monkeypatch.delenv(f"TEMPORAL_TLS_{name}")
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-from-env")
    config = connect_config()
    assert config["api_key"] == "key-from-env" and config["tls"] is True

    # An empty value is unset, as in an env file: no key, no TLS.
    monkeypatch.setenv("TEMPORAL_API_KEY", "")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "")
    assert connect_config() == {"target_host": "ns.acct.tmprl.cloud:7233"}

    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(tmp_path / "absent.pem"))
    with pytest.raises(ConnectionConfigError, match=r"absent\.pem"):
        connect_config()
    monkeypatch.delenv("TEMPORAL_TLS_CLIENT_CERT_PATH")

    # The same settings from a profile, in the docs' TOML spelling.
    profiles = tmp_path / "temporal.toml"
    profiles.write_text(
        textwrap.dedent(
            f"""
            [profile.prod]
            address = "temporal.example.internal:7233"
            namespace = "agents"

            [profile.prod.tls]
            client_cert_path = "{cert}"
            client_key_path = "{key}"
            server_name = "temporal.example.internal"
            """
        )
    )
    monkeypatch.delenv("TEMPORAL_API_KEY")
    monkeypatch.delenv("TEMPORAL_NAMESPACE")
    monkeypatch.delenv("TEMPORAL_ADDRESS")
    config = connect_config(profile="prod", config_file=str(profiles))
    assert (config["target_host"], config["namespace"]) == (
        "temporal.example.internal:7233",
        "agents",
    )
    assert config["tls"].client_cert == cert.read_bytes()
    assert config["tls"].domain == "temporal.example.internal"


def imports_envconfig(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(
            a.name.startswith("temporalio.envconfig") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (
            (node.module or "").startswith("temporalio.envconfig")
            or (node.module == "temporalio" and any(a.name == "envconfig" for a in node.names))
        ):
            return True
    return False


def test_envconfig_is_read_in_one_place():
    """Every entry point shares ``temporal_agent_interrupts.connection.connect_config``; none
    reads envconfig itself."""
    readers = sorted(
        str(path.relative_to(ROOT))
        for package in ("workflows", "activities", "worker", "client", "examples", "bench")
        for path in (ROOT / package).rglob("*.py")
        if imports_envconfig(path)
    ) + sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "temporal_agent_interrupts").glob("*.py")
        if imports_envconfig(path)
    )
    assert readers == ["temporal_agent_interrupts/connection.py"]


async def test_setup_runs_from_an_empty_folder_with_no_agents_to_host(env, tmp_path):
    """The walkthrough's four tries, from a flat layout: no ``--agents``, an ``AGENT_MODULES``
    naming a module that is not there, no repository on the path. Registering hosts nothing, so
    none of that matters, through either command."""
    bin_dir = Path(sys.executable).parent
    for command in (
        ["agent-worker", "--setup-search-attributes"],
        ["agentctl", "setup-search-attributes"],
    ):
        namespace = f"flat-{uuid.uuid4().hex[:8]}"
        await create_namespace(env.client, namespace)
        folder = tmp_path / namespace
        folder.mkdir()
        environ = {
            **bare_environ(
                tmp_path,
                TEMPORAL_ADDRESS=server_address(env.client),
                TEMPORAL_NAMESPACE=namespace,
                AGENT_MODULES="idp",
            ),
            "PYTHONPATH": "",
        }
        setup = await run_to_end(str(bin_dir / command[0]), *command[1:], env=environ, cwd=folder)
        assert setup.proc.returncode == 0, setup.output
        assert f"namespace {namespace}: registered {', '.join(ATTRIBUTES)}" in setup.output
        client = await Client.connect(server_address(env.client), namespace=namespace)
        assert await missing_search_attributes(client) == []


# --- capacity ----------------------------------------------------------------------------------


def test_capacity_defaults_and_environment_overrides(monkeypatch):
    for name in (
        "AGENT_MAX_CONCURRENT_ACTIVITIES",
        "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS",
        "AGENT_MAX_CACHED_WORKFLOWS",
    ):
        monkeypatch.delenv(name, raising=False)
    args = parse_args([])
    assert (
        args.max_concurrent_activities,
        args.max_concurrent_workflow_tasks,
        args.max_cached_workflows,
    ) == (
        DEFAULT_MAX_CONCURRENT_ACTIVITIES,
        DEFAULT_MAX_CONCURRENT_WORKFLOW_TASKS,
        DEFAULT_MAX_CACHED_WORKFLOWS,
    )
    monkeypatch.setenv("AGENT_MAX_CONCURRENT_ACTIVITIES", "8")
    monkeypatch.setenv("AGENT_MAX_CACHED_WORKFLOWS", "")  # empty: the default
    args = parse_args(["--max-concurrent-workflow-tasks", "4"])
    assert (args.max_concurrent_activities, args.max_concurrent_workflow_tasks) == (8, 4)
    assert args.max_cached_workflows == DEFAULT_MAX_CACHED_WORKFLOWS


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_MAX_CONCURRENT_ACTIVITIES", "0"),
        ("AGENT_MAX_CONCURRENT_WORKFLOW_TASKS", "many"),
        ("AGENT_MAX_CACHED_WORKFLOWS", "-1"),
        ("AGENT_GRACEFUL_SHUTDOWN_SECONDS", "soon"),
    ],
)
def test_bad_capacity_settings_are_refused_by_name(monkeypatch, capsys, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2
    assert variable in capsys.readouterr().err


# --- a namespace nobody prepared ---------------------------------------------------------------


async def test_worker_refuses_a_namespace_without_the_search_attributes(bare_server, tmp_path):
    assert sorted(await missing_search_attributes(bare_server.client)) == sorted(ATTRIBUTES)
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=server_address(bare_server.client))
    worker = await worker_cli(env=environ, cwd=tmp_path)
    assert worker.proc.returncode == 2, worker.output
    for name in ATTRIBUTES:
        assert name in worker.output
    assert "agent-worker --setup-search-attributes" in worker.output
    assert "worker ready" not in worker.output and "Traceback" not in worker.output


async def test_setup_prepares_a_fresh_namespace_and_a_worker_then_serves_and_stops_on_sigterm(
    bare_server, tmp_path
):
    client = bare_server.client
    assert sorted(await missing_search_attributes(client)) == sorted(ATTRIBUTES)
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=server_address(client))

    setup = await worker_cli("--setup-search-attributes", env=environ, cwd=tmp_path)
    assert setup.proc.returncode == 0, setup.output
    assert f"registered {', '.join(ATTRIBUTES)}" in setup.output
    assert await missing_search_attributes(client) == []
    again = await worker_cli("--setup-search-attributes", env=environ, cwd=tmp_path)
    assert "search attributes already present" in again.output

    queue = f"tq-{uuid.uuid4()}"
    metrics = f"127.0.0.1:{free_port()}"
    worker = await Process.start(
        sys.executable,
        "-m",
        "worker",
        "--task-queue",
        queue,
        "--metrics-bind",
        metrics,
        env=environ,
        cwd=tmp_path,
    )
    try:
        await worker.wait_for("worker ready")
        assert "offline stand-in" in worker.output  # no key in this environment

        chat = await AgentClient(client, task_queue=queue).chat("bankingAgent")
        res = await chat.send("Transfer $500 to savings.")
        assert res.finish_reason == FinishReason.INTERRUPTED
        assert [i.name for i in res.interrupts] == ["userApproval"]

        # What the docs tell operators to watch: paused conversations by search attribute,
        # by the tool they wait on, and by how long they have waited...
        later = (datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for query in (
            'AgentStatus = "interrupted"',
            'AgentStatus = "interrupted" AND PendingInterrupts = "userApproval"',
            f'AgentStatus = "interrupted" AND InterruptedSince < "{later}"',
        ):
            await eventually(
                lambda q=query: client.count_workflows(f'{q} AND WorkflowId = "{chat.id}"'),
                lambda c: c.count == 1,
                timeout=20,
            )
        earlier = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        stale = await client.count_workflows(
            f'AgentStatus = "interrupted" AND InterruptedSince < "{earlier}"'
        )
        assert stale.count == 0  # the age query tells fresh pauses from stale ones

        # ...and the SDK's own metrics.
        def scrape() -> str:
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
                return response.read().decode()

        text = await eventually(
            lambda: asyncio.to_thread(scrape),
            lambda t: "temporal_workflow_task_schedule_to_start_latency" in t,
            timeout=20,
        )
        assert "temporal_activity_schedule_to_start_latency" in text

        worker.proc.terminate()  # SIGTERM, as docker stop sends
        assert await worker.wait(timeout=60) == 0, worker.output
    finally:
        await worker.stop()
    assert "shutting down gracefully" in worker.output
    assert "Traceback" not in worker.output

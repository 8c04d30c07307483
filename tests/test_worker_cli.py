"""``agent-worker`` and ``make demo`` at their edges, none of which needs a Temporal server.

A bad ``--agents`` is refused before anything connects; an address that is configured but dead
starts no dev server; a port that accepts connections and never answers (a hung server, or some
other program) is reported in seconds, by name, instead of after the SDK's 30 s. Processes start
with the bare environment of ``test_worker_process`` and run in a scratch directory, so a
``.temporal/`` appearing there means a dev server was started.
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from examples import ALL_AGENTS, shell_agent
from examples.demo import closing_lines
from temporal_agent_interrupts.client.api import CONNECT_TIMEOUT
from temporal_agent_interrupts.worker.__main__ import load_agents, parse_args, wants_dev_server
from temporal_agent_interrupts.worker.devserver import RecordedServer, recorded_dev_server
from tests.helpers import fake_dev_server
from tests.test_worker_process import bare_environ, free_port

# Connecting to a silent server takes CONNECT_TIMEOUT; the SDK alone took 30 s, and said
# "Timeout expired". Only the project's own bound says this, so a process that says it gave up
# at that bound, before the SDK's (how fast is for bench/, not a timed assertion here).
GAVE_UP_AT_ITS_OWN_BOUND = f"(no reply within {CONNECT_TIMEOUT.total_seconds():g}s)"


def run(
    *argv: str, env: dict[str, str], cwd: Path, stdin: str = "", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, *argv],
            input=stdin,
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        stop_dev_server_started_in(cwd)


def stop_dev_server_started_in(cwd: Path) -> None:
    """A test that failed by starting a dev server must not leave it running on port 7233."""
    server = recorded_dev_server(cwd / ".temporal" / "dev-server.pid")
    if server is not None:
        os.kill(server.pid, signal.SIGTERM)


# --- --agents: a usage error, one line, exit 2, before anything connects -----------------------

# Nothing listens on port 1: a worker that got as far as connecting would say so and exit 1.
CLOSED = "127.0.0.1:1"

AGENT_MODULES = {
    "needsdep.py": "import not_a_real_dependency_xyz\n",
    "agentless.py": "LIMIT = 3\n",
    "oneagent.py": "from examples import banking_agent as my_agent\n",
    "notagents.py": "VALUE = 42\n",
    "mixed.py": "from examples import banking_agent\nAGENTS = [banking_agent, 'deployAgent']\n",
    "empty.py": "AGENTS = []\n",
    "boom.py": "raise RuntimeError('set MY_KEY\\n  before importing me')\n",
    "broken.py": "def agent(:\n",
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "mypackage.agents:banking",
            "cannot import module 'mypackage.agents': No module named 'mypackage'",
        ),
        ("needsdep:agent", "cannot import module 'needsdep': No module named 'not_a_real_dep"),
        (
            "examples:bankingAgent",  # the agent's name, not the variable's
            "module 'examples' has no attribute 'bankingAgent' "
            "(agents there: ALL_AGENTS, banking_agent, deploy_agent, shell_agent)",
        ),
        ("examples:banking", "examples:banking is a module, not an Agent or a list of Agents"),
        ("agentless", "module agentless has no ALL_AGENTS; name the agent: agentless:NAME"),
        (
            "oneagent",
            "module oneagent has no ALL_AGENTS; name the agent: oneagent:NAME "
            "(agents there: my_agent)",
        ),
        ("notagents:VALUE", "notagents:VALUE is an int, not an Agent or a list of Agents"),
        ("mixed:AGENTS", "item 1 of mixed:AGENTS is a str, not an Agent"),
        ("empty:AGENTS", "empty:AGENTS is empty: no agents to host"),
        (
            "boom:agent",
            "importing module 'boom' raised RuntimeError: set MY_KEY before importing me",
        ),
        ("broken:agent", "importing module 'broken' raised SyntaxError: "),
    ],
)
def test_a_bad_agents_value_is_one_line_and_exit_2(tmp_path, spec, expected):
    for name, source in AGENT_MODULES.items():
        (tmp_path / name).write_text(source)
    worker = run(
        "-m",
        "temporal_agent_interrupts.worker",
        "--agents",
        "examples:ALL_AGENTS",
        "--agents",
        spec,
        env=bare_environ(tmp_path, TEMPORAL_ADDRESS=CLOSED),
        cwd=tmp_path,
    )
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert worker.stdout == ""
    (line,) = worker.stderr.splitlines()
    assert line.startswith(f"agent-worker: error: --agents {spec}: "), line
    assert expected in line


def test_a_worker_names_its_agents_or_does_not_start(tmp_path, monkeypatch):
    """The package ships no agents: without ``--agents`` or ``AGENT_MODULES`` the worker says
    what to give, and hosts nobody else's by default."""
    environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=CLOSED)
    del environ["AGENT_MODULES"]
    worker = run("-m", "temporal_agent_interrupts.worker", env=environ, cwd=tmp_path)
    assert worker.returncode == 2, worker.stdout + worker.stderr
    (line,) = worker.stderr.splitlines()
    assert "no agents to host: name them with --agents MODULE[:NAME] (or AGENT_MODULES)" in line
    monkeypatch.setenv("AGENT_MODULES", "examples:shell_agent, examples")
    assert load_agents(None) == [shell_agent, *ALL_AGENTS]
    assert load_agents(["examples:shell_agent"]) == [shell_agent]  # the flag wins


def test_agents_are_checked_before_a_dev_server_starts(tmp_path):
    worker = run(
        "-m",
        "temporal_agent_interrupts.worker",
        "--dev-server",
        "--agents",
        "nope:agent",
        env=bare_environ(tmp_path),
        cwd=tmp_path,
    )
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert "cannot import module 'nope'" in worker.stderr
    assert not (tmp_path / ".temporal").exists()


def test_help_says_what_a_module_alone_means(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    # argparse wraps the help to the terminal's width.
    text = " ".join(capsys.readouterr().out.split())
    assert "--agents MODULE[:NAME]" in text
    assert "MODULE alone means MODULE:ALL_AGENTS" in text


def test_a_module_alone_means_its_all_agents():
    assert load_agents(["examples"]) == ALL_AGENTS
    assert load_agents(["examples:shell_agent", "examples"]) == [shell_agent, *ALL_AGENTS]


# --- --dev-server: only for the default address -------------------------------------------------


def test_the_dev_server_is_only_for_the_default_address():
    assert wants_dev_server(requested=True, configured_address=None)
    assert not wants_dev_server(requested=False, configured_address=None)
    # Configured is configured, even when it names the dev server's own address.
    for address in ("localhost:7233", "127.0.0.1:7233", "temporal:7233"):
        assert not wants_dev_server(requested=True, configured_address=address)


@pytest.mark.parametrize("configured_by", ["TEMPORAL_ADDRESS", "profile"])
def test_a_configured_address_with_nothing_there_starts_no_server(tmp_path, configured_by):
    """`TEMPORAL_ADDRESS=localhost:PORT make run` is someone else's server: when it is down, the
    worker says so and exits 1 instead of standing in for it.

    The address is a port nobody listens on (7233 may be taken by the developer's own server);
    that the dev server's own address counts as configured too is
    test_the_dev_server_is_only_for_the_default_address.
    """
    address = f"localhost:{free_port()}"
    if configured_by == "profile":
        profiles = tmp_path / "temporal.toml"
        profiles.write_text(f'[profile.default]\naddress = "{address}"\n')
        environ = bare_environ(tmp_path, TEMPORAL_CONFIG_FILE=str(profiles))
    else:
        environ = bare_environ(tmp_path, TEMPORAL_ADDRESS=address)
    worker = run(
        "-m",
        "temporal_agent_interrupts.worker",
        "--dev-server",
        env=environ,
        cwd=tmp_path,
        timeout=30,
    )
    output = worker.stdout + worker.stderr
    assert worker.returncode == 1, output
    assert f"cannot connect to Temporal at {address}" in output
    assert "dev server" not in output
    assert not (tmp_path / ".temporal").exists()


# --- a server that accepts connections and never answers ---------------------------------------


@contextmanager
def _silent_port() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()
        for conn in held:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never says a word, like a hung server."""
    with _silent_port() as address:
        yield address


Started = tuple[str, Path, Future[subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def given_up_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """``agent-worker --dev-server`` and ``make demo``, each in a scratch directory of its own,
    against a silent server (:func:`silent_server`'s), started side by side the first time a
    test asks for them: each waits out its connect bound (10 s) while the other does, so the two
    tests below take one such wait between them, not one each. Each test reads its own process:
    ``(address, directory, future result)``."""
    with _silent_port() as address, ThreadPoolExecutor(2) as pool:
        worker_dir = tmp_path_factory.mktemp("worker")
        demo_dir = tmp_path_factory.mktemp("demo")
        worker = pool.submit(
            run,
            "-m",
            "temporal_agent_interrupts.worker",
            "--dev-server",
            env=bare_environ(worker_dir, TEMPORAL_ADDRESS=address),
            cwd=worker_dir,
        )
        demo = pool.submit(demo_against, demo_dir, address)
        yield {"worker": (address, worker_dir, worker), "demo": (address, demo_dir, demo)}


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    """Some other program on the port: a web server that answers, but not as Temporal."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_worker_gives_up_on_a_server_that_does_not_answer(given_up_on):
    silent_server, tmp_path, started = given_up_on["worker"]
    worker = started.result()
    assert worker.returncode == 1, worker.stdout + worker.stderr
    (line,) = [line for line in worker.stderr.splitlines() if " ERROR " in line]
    assert f"the server at {silent_server} is not answering as Temporal" in line
    assert "TEMPORAL_ADDRESS" in line
    assert "Traceback" not in worker.stderr
    # It gave up at its own bound, not at the SDK's.
    assert GAVE_UP_AT_ITS_OWN_BOUND in line, line
    assert "Timeout expired" not in worker.stderr
    assert not (tmp_path / ".temporal").exists()


def demo_against(tmp_path: Path, address: str) -> subprocess.CompletedProcess[str]:
    """``python -m examples.demo`` with TEMPORAL_ADDRESS set, answering its prompt."""
    return run(
        "-m",
        "examples.demo",
        env=bare_environ(tmp_path, TEMPORAL_ADDRESS=address),
        cwd=tmp_path,
        stdin="y\n",
    )


def test_the_demo_gives_up_on_a_server_that_does_not_answer(given_up_on):
    silent_server, _, started = given_up_on["demo"]
    demo = started.result()
    assert demo.returncode == 1, demo.stdout + demo.stderr
    (line,) = demo.stderr.splitlines()
    assert line.startswith(
        f"Cannot run the demo: the server at {silent_server} is not answering as Temporal"
    ), line
    assert "stop whatever listens there, or point TEMPORAL_ADDRESS at a Temporal server" in line
    assert "approve?" not in demo.stdout and "make stop" not in demo.stdout
    # It gave up at its own bound, not at the SDK's.
    assert GAVE_UP_AT_ITS_OWN_BOUND in line, line
    assert "Timeout expired" not in demo.stderr


def test_the_demo_names_a_server_that_is_not_temporal(tmp_path, http_server):
    demo = demo_against(tmp_path, http_server)
    assert demo.returncode == 1, demo.stdout + demo.stderr
    (line,) = demo.stderr.splitlines()
    assert line.startswith(f"Cannot run the demo: cannot connect to Temporal at {http_server}: ")
    assert "Traceback" not in demo.stderr


# --- who stops the server: the demo's closing text ----------------------------------------------


def test_the_demo_offers_make_stop_only_for_a_server_make_stop_would_stop():
    address = "localhost:7233"
    started = closing_lines(address=address, started=True, recorded=None)
    assert started == (
        "The dev server and its UI are still running:",
        "Stop the server with: make stop",
    )
    # An earlier demo's server, whose starter has gone: `make stop` stops it.
    orphan = closing_lines(
        address=address, started=False, recorded=RecordedServer(pid=7, owner=None)
    )
    assert orphan == started

    running = RecordedServer(pid=7, owner=8, owner_command=".venv/bin/agent-worker --dev-server")
    heading, footer = closing_lines(address=address, started=False, recorded=running)
    assert heading == (
        "The dev server at localhost:7233 belongs to pid 8 (.venv/bin/agent-worker "
        "--dev-server), which is still running; it is left alone:"
    )
    assert footer is None

    heading, footer = closing_lines(address=address, started=False, recorded=None)
    assert heading == "The Temporal server at localhost:7233 was already running and is left alone:"
    assert footer is None


@pytest.fixture
def dev_server_lookalike() -> Iterator[subprocess.Popen[str]]:
    server = fake_dev_server()
    try:
        yield server
    finally:
        server.kill()
        server.wait()


def test_a_recorded_dev_server_knows_whether_its_starter_still_runs(tmp_path, dev_server_lookalike):
    pid_file = tmp_path / "dev-server.pid"
    assert recorded_dev_server(pid_file) is None  # no file

    # Written by this process, its parent: owned, as `make run`'s server is by the worker.
    pid_file.write_text(f"{dev_server_lookalike.pid}\n{os.getpid()}\n")
    found = recorded_dev_server(pid_file)
    assert found is not None
    assert (found.pid, found.owner) == (dev_server_lookalike.pid, os.getpid())
    assert sys.executable in found.owner_command or "python" in found.owner_command

    # A starter that is not its parent (it exited; the pid may be anyone's now): an orphan.
    pid_file.write_text(f"{dev_server_lookalike.pid}\n1\n")
    assert recorded_dev_server(pid_file) == RecordedServer(pid=dev_server_lookalike.pid, owner=None)
    # The one-line files written before the starter was recorded: an orphan too.
    pid_file.write_text(f"{dev_server_lookalike.pid}\n")
    assert recorded_dev_server(pid_file) == RecordedServer(pid=dev_server_lookalike.pid, owner=None)

    # A pid that is not a dev server (this test process) is not one.
    pid_file.write_text(f"{os.getpid()}\n")
    assert recorded_dev_server(pid_file) is None


@pytest.mark.parametrize(
    ("argv", "environ", "says"),
    [
        ((), {"AGENT_LOG_LEVEL": "LOUD"}, "AGENT_LOG_LEVEL='LOUD' is not one of"),
        ((), {"AGENT_METRICS_BIND": "nope"}, "AGENT_METRICS_BIND='nope' is not a valid value"),
        (("--metrics-bind", "nope"), {}, "expected HOST:PORT"),
        (("--metrics-bind", "host:99999"), {}, "expected HOST:PORT"),
        (("--bogus",), {}, "unrecognized arguments: --bogus"),
    ],
)
def test_a_setting_that_cannot_work_is_one_line_and_exit_2(tmp_path, argv, environ, says):
    """Before: a bad log level or metrics address ended in a traceback and exit 1."""
    done = run(
        "-m",
        "temporal_agent_interrupts.worker",
        *argv,
        env=bare_environ(tmp_path, **environ),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("agent-worker: error: ") and says in line, line


def test_agents_are_found_in_the_working_folder_which_shadows_no_installed_module(
    tmp_path, monkeypatch
):
    """`agent-worker --agents mine` from the folder holding mine.py finds it (an installed
    console script has only bin/ on sys.path), and that folder serves nothing else, after
    everything installed: a ``pydantic.py`` or ``json.py`` someone left there never replaces
    the real one (tests/test_docs_review.py: nor does a module that is not installed)."""
    import importlib.util

    from temporal_agent_interrupts.worker.__main__ import load_agents

    (tmp_path / "mine.py").write_text(
        "from temporal_agent_interrupts import Agent\nALL_AGENTS = [Agent('mineAgent')]\n"
    )
    (tmp_path / "pydantic_core.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    (agent,) = load_agents(["mine"])
    assert agent.name == "mineAgent"
    assert str(tmp_path) not in sys.path
    # An import that resolves afresh now still finds the installed package, not the folder's.
    spec = importlib.util.find_spec("pydantic_core")
    assert spec is not None and spec.origin is not None
    assert not spec.origin.startswith(str(tmp_path))

"""The release as a team gets it: built from a clean clone, installed from its wheel into a
project of the team's own, and used there.

A clean clone's files (what ``git ls-files`` lists, links kept as links: the package root links
to the four folders) are built the way ``make dist`` builds them, offline (``python -m build
--no-isolation``: this environment's setuptools, no download): an sdist, and a wheel built from
it. ``twine check`` must accept both, the wheel must hold the one package and its metadata only,
and the sdist must hold the source, building the same wheel as the tree does.

Then the wheel is installed (not editable) into a fresh venv, and used by a project laid out like
``temporalio/samples-python``'s hello samples: its own ``workflows.py``, ``activities.py``,
``worker.py`` and ``client.py``, and an agent module with a gated tool. Its worker connects with
``AgentsPlugin`` and runs its own ``Worker`` with its own workflow; its client runs that workflow,
then starts a chat that pauses on the gated tool, and (a second process) approves it. The project
imports root names of the package only, and runs with the offline stand-in model (no key).

The fresh venv gets the project's dependencies from this environment without the network: a
``.pth`` line appends this environment's site-packages to its path. A path line does not run the
``.pth`` files in that directory, so the editable install of the package here stays inactive, and
the package the project imports is the wheel's (checked).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import tomllib
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from tests.helpers import server_address

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "temporal_agent_interrupts"
FOLDERS = ("workflows", "activities", "worker", "client")
"""The design card's folders: at the top of the repository, mapped into the package."""
NOT_SHIPPED = {"examples", "tests", "bench", "docs", ".ci", "scripts"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

BUILD_TIMEOUT = 180
PROCESS_TIMEOUT = 120
"""Bounds on a build and on one of the project's processes; neither is a timed assertion."""


def run(
    *argv: str | Path, cwd: Path, timeout: float = BUILD_TIMEOUT, logs: list[str] | None = None
) -> str:
    """Run a command to its end; its output, or a failure that shows it. ``logs`` collects
    what it wrote to both streams (a build backend warns on stderr)."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    if logs is not None:
        logs.append(done.stdout + done.stderr)
    return done.stdout


def clean_clone(source: Path, dest: Path) -> None:
    """What a fresh clone of ``source`` would hold, with its uncommitted edits: every file git
    tracks or would track (not what it ignores), symbolic links kept as links."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=source)
    for rel in filter(None, listed.split("\0")):
        path = source / rel
        if path.is_symlink():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(path))
        elif path.is_file():  # not a file deleted since the last commit
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


@dataclass(frozen=True)
class Release:
    clone: Path
    sdist: Path
    wheel: Path
    """Built from the sdist, as ``python -m build`` (and so ``make dist``) does."""
    tree_wheel: Path
    """Built straight from the clone's tree, as ``pip install .`` does."""
    editable: Path
    """Built as ``pip install -e .`` builds it (the backend's ``build_editable``)."""
    logs: list[str]
    """What the builds printed."""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    base = tmp_path_factory.mktemp("release")
    clone = base / "clone"
    clean_clone(ROOT, clone)
    for folder in FOLDERS:
        assert (clone / PACKAGE / folder).is_symlink(), f"{PACKAGE}/{folder} is not a link"
    dist, tree = base / "dist", base / "tree"
    logs: list[str] = []
    run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--outdir",
        dist,
        clone,
        cwd=base,
        logs=logs,
    )
    run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--wheel",
        "--outdir",
        tree,
        clone,
        cwd=base,
        logs=logs,
    )
    editable = base / "editable"
    # The hook pip calls for `pip install -e .`, in a copy of the tree (it writes egg-info there).
    editable_tree = base / "editable-tree"
    clean_clone(ROOT, editable_tree)
    build_editable = (
        f"from setuptools import build_meta; build_meta.build_editable({str(editable)!r})"
    )
    run(sys.executable, "-c", build_editable, cwd=editable_tree, logs=logs)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    (tree_wheel,) = tree.glob("*.whl")
    (editable_wheel,) = editable.glob("*.whl")
    return Release(
        clone=clone,
        sdist=sdist,
        wheel=wheel,
        tree_wheel=tree_wheel,
        editable=editable_wheel,
        logs=logs,
    )


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def sdist_names(sdist: Path) -> set[str]:
    """The sdist's files, without its ``NAME-VERSION/`` folder."""
    with tarfile.open(sdist) as tf:
        return {
            str(PurePosixPath(*PurePosixPath(m.name).parts[1:]))
            for m in tf.getmembers()
            if m.isfile()
        }


def test_twine_accepts_the_sdist_and_the_wheel_of_a_real_version(release: Release):
    out = run(
        sys.executable,
        "-m",
        "twine",
        "check",
        "--strict",
        release.sdist,
        release.wheel,
        cwd=release.clone,
    )
    assert out.count("PASSED") == 2, out
    version = PYPROJECT["version"]
    assert release.wheel.name == f"{PACKAGE}-{version}-py3-none-any.whl"
    assert release.sdist.name == f"{PACKAGE}-{version}.tar.gz"
    with zipfile.ZipFile(release.wheel) as zf:
        metadata = zf.read(f"{PACKAGE}-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    assert "\nLicense-Expression: MIT\n" in metadata
    assert "\nClassifier: Typing :: Typed\n" in metadata
    # The changelog has an entry for the version being released.
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()


def test_building_and_installing_print_no_setuptools_warnings(release: Release):
    """``pip install .`` and ``pip install -e .`` showed some 45 lines of setuptools warnings
    (the inbox page's folder, importable but not declared as a package): every build here, the
    sdist, the wheels and the editable one, prints none. What is left is setuptools' note that
    every editable install of a mapped layout gets ("InformationOnly: Editable installation"),
    which is not a warning about this project's configuration."""
    assert len(release.logs) == 3
    for log in release.logs:
        flagged = [
            line
            for line in log.splitlines()
            if re.search(r"Warning|warning:|would be ignored|absent from", line)
            and "byte-compiling is disabled" not in line  # PYTHONDONTWRITEBYTECODE, the tests'
        ]
        assert flagged == [], "\n".join(flagged)


def test_the_wheel_holds_the_one_package_and_its_metadata_only(release: Release):
    names = wheel_names(release.wheel)
    top = {name.split("/")[0] for name in names}
    (dist_info,) = top - {PACKAGE}
    assert dist_info == f"{PACKAGE}-{PYPROJECT['version']}.dist-info", top
    assert f"{PACKAGE}/py.typed" in names
    assert f"{dist_info}/licenses/LICENSE" in names  # the MIT text the metadata declares
    for folder in FOLDERS:
        assert f"{PACKAGE}/{folder}/__init__.py" in names, folder
    # The inbox page is data, not a module: package-data ships it, or the app serves 404s.
    for page in ("inbox.html", "inbox.js", "inbox.css"):
        assert f"{PACKAGE}/client/static/{page}" in names, page
    shipped_parts = {part for name in names for part in PurePosixPath(name).parts}
    assert not shipped_parts & NOT_SHIPPED, sorted(shipped_parts & NOT_SHIPPED)
    with zipfile.ZipFile(release.wheel) as zf:
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    for script in PYPROJECT["scripts"]:
        assert f"{script} = " in entry_points, script


def test_the_sdist_holds_the_source_and_builds_the_same_wheel_as_the_tree(release: Release):
    names = sdist_names(release.sdist)
    for kept in ("pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", f"{PACKAGE}/py.typed"):
        assert kept in names, kept
    # Every module of the wheel from its source: the package root's own, and the four folders
    # at the top, where the build maps them from.
    wheel = wheel_names(release.wheel)
    for name in sorted(n for n in wheel if n.startswith(f"{PACKAGE}/")):
        part = PurePosixPath(name).parts[1]
        source = name.removeprefix(f"{PACKAGE}/") if part in FOLDERS else name
        assert source in names, f"the sdist has no {source} (for the wheel's {name})"
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert not tops & NOT_SHIPPED, sorted(tops & NOT_SHIPPED)
    assert wheel == wheel_names(release.tree_wheel)


# The project, laid out like samples-python's hello samples. Its modules import the package by
# its root names only.
ACTIVITIES = """
from dataclasses import dataclass, field

from temporalio import activity


@dataclass
class ComposeGreetingInput:
    greeting: str
    name: str


@activity.defn
async def compose_greeting(input: ComposeGreetingInput) -> str:
    activity.logger.info("composing a greeting for %s", input.name)
    return f"{input.greeting}, {input.name}!"
"""

WORKFLOWS = """
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ComposeGreetingInput, compose_greeting


@workflow.defn
class GreetingWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            compose_greeting,
            ComposeGreetingInput("Hello", name),
            start_to_close_timeout=timedelta(seconds=10),
        )
"""

SUPPORT_AGENT = '''
import asyncio
import json
from pathlib import Path

from pydantic import BaseModel

from temporal_agent_interrupts import Agent, ToolApproval, tool

REFUNDS = Path(__file__).with_name("refunds.jsonl")
"""Each refund the tool made, one line each: the project's stand-in for a payment system."""


class Refund(BaseModel):
    order: str
    amount: float


def _record(refund: Refund) -> None:
    with REFUNDS.open("a") as f:
        f.write(json.dumps(refund.model_dump()) + "\\n")


@tool("refund", "Refund an order.")
async def refund(inp: Refund) -> dict[str, object]:
    await asyncio.to_thread(_record, inp)
    return {"refunded": inp.amount, "order": inp.order}


support_agent = Agent(
    "supportAgent",
    model="gemini-flash-latest",
    system="You help customers. Refunds need a human's approval.",
    tools=[refund],
    middleware=[ToolApproval(allow=[])],
)
'''

WORKER = """
import asyncio
import logging
import os
import signal

from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.worker import Worker

from activities import compose_greeting
from support_agent import support_agent
from temporal_agent_interrupts import AgentsPlugin
from temporal_agent_interrupts.client.api import run_script
from workflows import GreetingWorkflow

TASK_QUEUE = os.environ.get("TASK_QUEUE", "hello-agents-task-queue")


async def main() -> None:
    logging.basicConfig(level=logging.INFO)
    config = ClientConfig.load_client_connect_config()
    config.setdefault("target_host", "localhost:7233")
    client = await Client.connect(**config, plugins=[AgentsPlugin(agents=[support_agent])])
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[GreetingWorkflow],
        activities=[compose_greeting],
    ):
        print("Worker started", flush=True)
        await stop.wait()


if __name__ == "__main__":
    # Not asyncio.run: the SDK can abort at interpreter exit (sdk-python issue 300), and
    # run_script exits with the script's own status before teardown.
    run_script(main())
"""

CLIENT = """
import asyncio
import json
import os
import sys

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from support_agent import support_agent
from temporal_agent_interrupts import AgentClient, AgentsPlugin, FinishReason, approve
from temporal_agent_interrupts.client.api import run_script
from workflows import GreetingWorkflow

TASK_QUEUE = os.environ.get("TASK_QUEUE", "hello-agents-task-queue")


async def main(step: str, chat_id: str) -> None:
    config = ClientConfig.load_client_connect_config()
    config.setdefault("target_host", "localhost:7233")
    client = await Client.connect(**config, plugins=[AgentsPlugin(agents=[support_agent])])
    agents = AgentClient(client, task_queue=TASK_QUEUE)
    chat = await agents.chat("supportAgent", chat_id=chat_id)
    if step == "start":
        greeting = await client.execute_workflow(
            GreetingWorkflow.run, "World", id=f"hello-{chat_id}", task_queue=TASK_QUEUE
        )
        turn = await chat.send('call refund {"order": "A-17", "amount": 7.5}')
        paused = turn.finish_reason == FinishReason.INTERRUPTED
        report = {
            "greeting": greeting,
            "paused": paused,
            "interrupts": [i.name for i in turn.interrupts],
        }
    else:
        pending = await chat.pending()
        turn = await chat.resume(answers=[approve(i) for i in pending])
        report = {
            "approved": [i.name for i in pending],
            "finished": turn.finish_reason == FinishReason.STOP,
            "text": turn.text,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    run_script(main(sys.argv[1], sys.argv[2]))  # as worker.py: sdk-python issue 300
"""

PROJECT = {
    "activities.py": ACTIVITIES,
    "workflows.py": WORKFLOWS,
    "support_agent.py": SUPPORT_AGENT,
    "worker.py": WORKER,
    "client.py": CLIENT,
}


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed (not editable); its python."""
    run(sys.executable, "-m", "venv", where, cwd=where.parent)  # pip from ensurepip: offline
    python = where / "bin" / "python"
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=where.parent,
    )
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=where)
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (Path(site.strip()) / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @property
    def output(self) -> str:
        return "".join(self.lines)


async def start_worker(python: Path, project: Path, environ: dict[str, str]) -> WorkerProcess:
    process = await asyncio.create_subprocess_exec(
        str(python),
        "worker.py",
        cwd=project,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    worker = WorkerProcess(process)
    assert process.stdout is not None
    stream = process.stdout
    ready = asyncio.get_running_loop().create_future()

    async def read() -> None:  # all along, so that the pipe never fills and blocks the worker
        while line := await stream.readline():
            worker.lines.append(line.decode(errors="replace"))
            if "Worker started" in worker.lines[-1] and not ready.done():
                ready.set_result(None)
        if not ready.done():
            ready.set_result(None)

    worker.reader = asyncio.ensure_future(read())
    await asyncio.wait_for(ready, PROCESS_TIMEOUT)
    assert "Worker started" in worker.output, f"the worker did not start:\n{worker.output}"
    return worker


async def project_run(python: Path, project: Path, environ: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        str(python),
        *args,
        cwd=project,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT)
    assert process.returncode == 0, (
        f"{args} exited {process.returncode}:\n{out.decode()}{err.decode()}"
    )
    return out.decode()


async def test_a_samples_shaped_project_hosts_an_agent_from_the_wheel_beside_its_own_workflow(
    release: Release, env, tmp_path: Path
):
    python = fresh_venv(tmp_path / "venv", release.wheel)
    project = tmp_path / "hello_agents"
    project.mkdir()
    for name, text in PROJECT.items():
        (project / name).write_text(textwrap.dedent(text).lstrip())
    # Nothing of ours in the processes' environment: no PYTHONPATH (which would bring the clone
    # back), no model key (the offline stand-in model answers), no payload keys, no profile;
    # only the result key every deployment's workers hold (the worker refuses to start without).
    base = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL") if k in os.environ}
    environ = {
        **base,
        "AGENT_RESULT_KEYS": os.environ["AGENT_RESULT_KEYS"],
        "HOME": str(tmp_path),
        "TEMPORAL_ADDRESS": server_address(env.client),
        "TEMPORAL_NAMESPACE": "default",
        "TASK_QUEUE": f"hello-agents-{uuid.uuid4()}",
    }

    # The package the project imports is the wheel's, in the fresh venv, with its version.
    probe = await project_run(
        python,
        project,
        environ,
        "-c",
        "import temporal_agent_interrupts as t, temporal_agent_interrupts.worker as w, "
        "importlib.util as u; print(t.__file__); print(w.__file__); print(t.__version__); "
        "print(u.find_spec('examples'))",
    )
    package_file, worker_file, version, examples = probe.splitlines()
    site = str(tmp_path / "venv")
    assert package_file.startswith(site) and worker_file.startswith(site), probe
    assert version == PYPROJECT["version"] and examples == "None"
    assert (tmp_path / "venv" / "bin" / "agent-worker").exists()

    worker = await start_worker(python, project, environ)
    try:
        chat_id = f"refund-{uuid.uuid4()}"
        started = json.loads(
            await project_run(python, project, environ, "client.py", "start", chat_id)
        )
        # The project's own workflow ran on the worker that hosts the agent.
        assert started["greeting"] == "Hello, World!"
        # The gated tool paused before it ran.
        assert started["paused"] is True and started["interrupts"] == ["refund"]
        refunds = project / "refunds.jsonl"
        assert not refunds.exists(), "the gated tool ran before its approval"

        # Approved from another process, as a human's later answer would be.
        done = json.loads(
            await project_run(python, project, environ, "client.py", "approve", chat_id)
        )
        assert done["approved"] == ["refund"] and done["finished"] is True
        assert "refund returned" in done["text"] and '"refunded": 7.5' in done["text"], done
        # Exactly one run, after the approval.
        assert [json.loads(line) for line in refunds.read_text().splitlines()] == [
            {"order": "A-17", "amount": 7.5}
        ]
    finally:
        if worker.process.returncode is None:
            worker.process.terminate()
        code = await asyncio.wait_for(worker.process.wait(), PROCESS_TIMEOUT)
        if worker.reader is not None:
            await worker.reader
    assert code == 0, f"the worker did not stop cleanly on SIGTERM:\n{worker.output}"
    assert "Traceback" not in worker.output, worker.output

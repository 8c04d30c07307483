"""The deployment files, checked without Docker: compose, Dockerfile, env and ignore files.

No Docker engine runs here, so these read the files the way Compose and BuildKit would and
check the facts the docs state about them: pinned images, the dev server's flags and search
attributes, the healthcheck, the named volume, the worker's dependency on a healthy Temporal, its
env file, a non-root user and the real entry point. The wheel test builds the project the way the
Dockerfile's ``pip install .`` does and runs the entry point from it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from temporal_agent_interrupts.worker.__main__ import DEFAULT_GRACEFUL_SHUTDOWN_SECONDS
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES

ROOT = Path(__file__).parent.parent
DISPATCH_FLAG_VALUE = "history.transferProcessorMaxPollRPS=10000"


# --- readers ----------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def image_is_pinned(image: str) -> bool:
    """``name:tag`` (or ``@sha256:``) with a tag that names a release, never ``latest``."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def expected_search_attribute_flags() -> set[str]:
    # Spelled as the Temporal CLI spells types (KEYWORD_LIST -> KeywordList), derived here from
    # the enum rather than from worker.devserver, so a wrong mapping there cannot hide.
    return {
        f"{key.name}={''.join(p.capitalize() for p in key.indexed_value_type.name.split('_'))}"
        for key in SEARCH_ATTRIBUTES
    }


def flag_values(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]


def as_command(value: str | list[str]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuations joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    out = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    return instructions[last_from:]


def base_images() -> list[str]:
    """Every FROM image, with ``${ARG}`` resolved from the ARG defaults declared before it."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images = []
    for kw, rest in dockerfile_instructions():
        if kw == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif kw == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], words[0])
            if image not in stages:  # FROM <earlier stage> is not an image to pull
                images.append(image)
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
    return images


def exec_form(kw: str) -> list[str]:
    values = [rest for k, rest in final_stage() if k == kw]
    assert values, f"the final stage has no {kw}"
    parsed = json.loads(values[-1])  # exec form is a JSON array; shell form would not parse
    assert isinstance(parsed, list)
    return parsed


def docker_glob(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it: ``*`` and ``?`` stay within one path
    segment, ``**`` spans any number of them."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context: the last matching line
    wins, ``!`` re-includes, and an excluded directory takes everything under it along."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        glob = docker_glob(pattern.lstrip("!").strip("/"))
        if any(glob.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("*.pem", "client.pem", True),
        ("*.pem", "certs/client.pem", False),
        ("**/*.pem", "certs/client.pem", True),
        ("**/__pycache__", "worker/__pycache__", True),
        ("**/__pycache__", "__pycache__", True),
        (".env.*", ".env.local", True),
        (".env", ".envrc", False),
    ],
)
def test_the_dockerignore_reader_itself(pattern, path, matches):
    assert bool(docker_glob(pattern).fullmatch(path)) is matches


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    return values


def setuptools_packages() -> list[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["packages"]


def setuptools_folders() -> dict[str, str]:
    """Each package of the distribution and the folder of the repository that holds it."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})
    return {p: mapped.get(p, p.replace(".", "/")) for p in setuptools["packages"]}


# --- compose ----------------------------------------------------------------------------------


def test_compose_parses_and_every_image_is_pinned():
    services = compose()["services"]
    assert set(services) >= {"temporal", "worker"}
    images = {name: s["image"] for name, s in services.items() if "image" in s}
    assert images, "no service pulls an image"
    unpinned = {name: image for name, image in images.items() if not image_is_pinned(image)}
    assert not unpinned, f"images without a release tag: {unpinned}"
    # A service either pulls a pinned image or is built here; nothing floats.
    assert all("image" in s or "build" in s for s in services.values())


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("temporalio/temporal:1.9.1", True),
        ("python:3.11.15-slim-bookworm", True),
        ("temporalio/temporal", False),
        ("temporalio/temporal:latest", False),
        ("localhost:5000/temporal", False),
        ("temporalio/temporal@sha256:" + "0" * 64, True),
    ],
)
def test_the_pin_check_itself(image, pinned):
    assert image_is_pinned(image) is pinned


def test_temporal_runs_the_dev_server_with_our_flags_and_attributes():
    temporal = compose()["services"]["temporal"]
    assert temporal["image"].startswith("temporalio/temporal:")
    command = as_command(temporal["command"])
    assert command[:2] == ["server", "start-dev"]
    # Reachable from the worker container, not only from inside its own.
    assert flag_values(command, "--ip") == ["0.0.0.0"]
    assert DISPATCH_FLAG_VALUE in flag_values(command, "--dynamic-config-value")
    registered = flag_values(command, "--search-attribute")
    assert len(registered) == len(set(registered))
    assert set(registered) == expected_search_attribute_flags()


def test_temporal_runs_with_the_embedded_defaults_dynamic_config():
    """Every ``--dynamic-config-value`` the embedded default starts its server with (the
    dispatch flag, the per-run signal limit that keeps a flood of large signals from getting a
    paused conversation terminated) is in compose's command too."""
    from temporal_agent_interrupts.worker.devserver import SERVER_FLAGS

    command = as_command(compose()["services"]["temporal"]["command"])
    assert set(flag_values(list(SERVER_FLAGS), "--dynamic-config-value")) <= set(
        flag_values(command, "--dynamic-config-value")
    )
    assert "history.maximumSignalsPerExecution=20" in flag_values(command, "--dynamic-config-value")


def test_temporal_keeps_its_database_in_a_named_volume():
    spec = compose()
    temporal = spec["services"]["temporal"]
    (db_file,) = flag_values(as_command(temporal["command"]), "--db-filename")
    named = set(spec.get("volumes") or {})
    mounts = {}
    for volume in temporal["volumes"]:
        source, _, target = volume.partition(":")
        mounts[target.split(":")[0]] = source
    holding = [t for t in mounts if db_file.startswith(t.rstrip("/") + "/")]
    assert holding, f"{db_file} is not inside any mounted volume: {mounts}"
    assert mounts[holding[0]] in named, "the database volume must be a named (declared) volume"


def test_temporal_publishes_grpc_and_ui_and_has_a_healthcheck():
    temporal = compose()["services"]["temporal"]
    published = {str(p).rsplit(":", 1)[-1] for p in temporal["ports"]}
    assert published >= {"7233", "8233"}
    (ui_port,) = flag_values(as_command(temporal["command"]), "--ui-port")
    assert ui_port == "8233"
    health = temporal["healthcheck"]
    test = health["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    assert "temporal operator cluster health" in " ".join(test[1:])
    assert int(health["retries"]) > 0


def test_worker_is_built_here_and_waits_for_a_healthy_temporal():
    worker = compose()["services"]["worker"]
    build = worker["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (ROOT / context / dockerfile).resolve() == (ROOT / "Dockerfile").resolve()
    assert worker["depends_on"]["temporal"]["condition"] == "service_healthy"
    # The image's CMD is the entry point; compose must not replace it with something else.
    assert "command" not in worker and "entrypoint" not in worker


def test_worker_reads_its_settings_from_the_env_file():
    worker = compose()["services"]["worker"]
    env_files = worker["env_file"]
    env_files = [env_files] if isinstance(env_files, str) else env_files
    paths = [e if isinstance(e, str) else e["path"] for e in env_files]
    assert ".env" in paths
    # Addresses come from the env file alone, so pointing at another cluster is an edit there.
    assert "TEMPORAL_ADDRESS" not in (worker.get("environment") or {})


def test_env_example_points_the_worker_at_the_temporal_service():
    spec = compose()
    values = env_example()
    host, _, port = values["TEMPORAL_ADDRESS"].rpartition(":")
    assert host in spec["services"], f"{host!r} is not a compose service"
    assert spec["services"][host]["image"].startswith("temporalio/temporal:")
    (grpc_port,) = flag_values(as_command(spec["services"][host]["command"]), "--port") or ["7233"]
    assert port == grpc_port
    for key in ("GEMINI_API_KEY", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE"):
        assert key in values


def test_env_example_holds_no_secret_and_explains_every_variable():
    lines = (ROOT / ".env.example").read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        if key.endswith(("_KEY", "_KEYS", "_DATA", "_SECRET", "_TOKEN")):
            assert value == "", f"{key} has a value in .env.example"
        # Each variable sits under a comment (directly, or in a block of variables the
        # comment right above the block explains).
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].lstrip().startswith("#"):
            j -= 1
        assert j >= 0 and lines[j].lstrip().startswith("#"), f"{key} has no comment above it"


def test_env_file_stays_out_of_git_and_out_of_the_image():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".env"], cwd=ROOT, capture_output=True, check=False
    )
    assert ignored.returncode == 0, ".env is not git-ignored"
    for secret in (".env", ".env.local", "certs/client.pem", "client.key"):
        assert dockerignored(secret), secret


def test_grace_period_outlasts_the_workers_graceful_shutdown():
    worker = compose()["services"]["worker"]
    match = re.fullmatch(r"(\d+)s", str(worker["stop_grace_period"]))
    assert match, worker["stop_grace_period"]
    assert int(match[1]) >= DEFAULT_GRACEFUL_SHUTDOWN_SECONDS + 5


def test_the_codec_service_serves_the_ui_with_the_workers_keys_on_loopback_only():
    """docs/data-protection.md: the codec server beside the UI, behind the same
    env file, started by the profile .env.example names, answering the UI's origin only."""
    from temporal_agent_interrupts.codec_server import parse_args

    spec = compose()
    codec = spec["services"]["codec"]
    build = codec["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    assert (ROOT / context / "Dockerfile").resolve() == (ROOT / "Dockerfile").resolve()
    command = as_command(codec["command"])
    assert command[:3] == ["python", "-m", "temporal_agent_interrupts.codec_server"]
    args = parse_args(command[3:])  # the real parser: the flags exist and parse
    # All interfaces inside its container (the published port must reach it) ...
    assert args.host == "0.0.0.0"
    # ... and loopback only on the host: it decrypts for whoever reaches it.
    (published,) = codec["ports"]
    host_ip, host_port, container_port = str(published).split(":")
    assert host_ip == "127.0.0.1" and host_port == container_port == str(args.port)
    temporal = spec["services"]["temporal"]
    (ui_port,) = flag_values(as_command(temporal["command"]), "--ui-port")
    assert args.cors_origin == [f"http://localhost:{ui_port}"]
    # The keys are the worker's, from .env, but only they and the namespace it serves: not the
    # whole file (the Gemini and Temporal API keys) in a service that browsers reach.
    assert "env_file" not in codec
    environment = codec["environment"]
    assert environment == {
        "AGENT_PAYLOAD_KEYS": "${AGENT_PAYLOAD_KEYS:-}",
        "TEMPORAL_NAMESPACE": "${TEMPORAL_NAMESPACE:-default}",
    }
    assert {"AGENT_PAYLOAD_KEYS", "TEMPORAL_NAMESPACE"} <= set(env_example())
    # What the worker's env file also holds stays out of it.
    secrets = {"GEMINI_API_KEY", "TEMPORAL_API_KEY"}
    assert secrets <= set(env_example()) and not secrets & set(environment)
    # Without keys it refuses to start, so it runs only with the profile .env.example names.
    (profile,) = codec["profiles"]
    example = (ROOT / ".env.example").read_text()
    assert f"#   COMPOSE_PROFILES={profile}" in example
    assert "COMPOSE_PROFILES" in env_example()


def test_the_ui_reads_payloads_through_the_codec_endpoint_the_env_file_sets():
    spec = compose()
    command = as_command(spec["services"]["temporal"]["command"])
    (flag,) = [arg for arg in command if arg.startswith("--ui-codec-endpoint")]
    # Compose fills it in from .env; empty (no keys) leaves the UI without a codec server.
    assert flag == "--ui-codec-endpoint=${TEMPORAL_CODEC_ENDPOINT:-}"
    values = env_example()
    assert values["TEMPORAL_CODEC_ENDPOINT"] == "" and values["COMPOSE_PROFILES"] == ""
    codec = spec["services"]["codec"]
    (published,) = codec["ports"]
    # The endpoint .env.example suggests is the codec service as the browser reaches it.
    assert (
        f"#   TEMPORAL_CODEC_ENDPOINT=http://localhost:{str(published).split(':')[1]}"
        in (ROOT / ".env.example").read_text()
    )


# --- Dockerfile -------------------------------------------------------------------------------


def test_base_image_is_a_pinned_slim_python_311_or_newer():
    images = base_images()
    assert images
    for image in images:
        assert image_is_pinned(image), image
        match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim(-\w+)?", image)
        assert match, f"{image} is not an exact slim Python release"
        assert (int(match[1]), int(match[2])) >= (3, 11)


def test_image_runs_as_a_non_root_user():
    users = [rest for kw, rest in final_stage() if kw == "USER"]
    assert users, "the final stage sets no USER, so it runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_image_starts_the_real_worker_entry_point_and_stops_on_sigterm():
    assert exec_form("CMD") == ["agent-worker"]
    # The wheel ships no agents: the image copies the examples beside it and names them.
    stage = final_stage()
    assert any(
        kw == "COPY" and rest.endswith("/src/examples /opt/agents/examples") for kw, rest in stage
    )
    assert any(kw == "ENV" and "AGENT_MODULES=examples" in rest for kw, rest in stage)
    assert any(kw == "ENV" and "PYTHONPATH=/opt/agents" in rest for kw, rest in stage)
    entrypoint = exec_form("ENTRYPOINT")
    # An init as PID 1 passes SIGTERM on even before python installs its handlers.
    assert Path(entrypoint[0]).name == "tini" and entrypoint[-1] == "--"
    assert [rest for kw, rest in final_stage() if kw == "STOPSIGNAL"] == ["SIGTERM"]
    assert (ROOT / "worker" / "__main__.py").is_file()
    help_run = subprocess.run(
        [sys.executable, "-m", "temporal_agent_interrupts.worker", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_run.returncode == 0, help_run.stderr
    assert "TEMPORAL_ADDRESS" in help_run.stdout


def test_image_installs_the_project_without_test_extras():
    runs = [rest for kw, rest in dockerfile_instructions() if kw == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert installs, "the Dockerfile never installs the project"
    assert any(re.search(r"pip install (--compile )?\.(\s|$)", r) for r in installs)
    # The read-only venv must carry the bytecode (the image sets PYTHONDONTWRITEBYTECODE), or
    # every start compiles the project from source.
    assert not any("--no-compile" in r for r in installs)
    assert not any("[test" in r or "-e " in r or "--editable" in r for r in installs)
    copies = [rest for kw, rest in dockerfile_instructions() if kw == "COPY"]
    assert any(c.split()[0] == "." for c in copies), "the build stage does not copy the project"


def test_dockerignore_keeps_what_the_install_needs():
    needed = ["pyproject.toml", "README.md", *setuptools_folders().values()]
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not dockerignored(path), f".dockerignore drops {path}, which pip install needs"
    for module in (ROOT / "worker").glob("*.py"):
        assert not dockerignored(f"worker/{module.name}")
    for junk in (".git", ".venv/bin/python", ".temporal/temporal.db", "worker/__pycache__/x.pyc"):
        assert dockerignored(junk), junk


def test_the_built_wheel_carries_every_module_and_runs_the_entry_point(tmp_path):
    """What ``pip install .`` in the image gets: every module of the source, and a runnable worker.

    ``[tool.setuptools] packages`` lists packages by hand, so a new subpackage or a package left
    out of the list would be missing from the image while every test here still passed.
    """
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        shipped = {n for n in names if n.endswith(".py")}
        zf.extractall(tmp_path / "site")
    folders = setuptools_folders()
    source = {
        f"{package.replace('.', '/')}/{p.relative_to(ROOT / folder)}"
        for package, folder in folders.items()
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts and not p.parent.is_symlink()
    }
    assert source, "no source modules found"
    assert source <= shipped, f"missing from the wheel: {sorted(source - shipped)}"
    # One package and its metadata at the top, nothing else: no examples, tests or bench.
    top = {name.split("/")[0] for name in names}
    (dist_info,) = top - {"temporal_agent_interrupts"}
    assert dist_info.endswith(".dist-info"), top
    assert "temporal_agent_interrupts/py.typed" in names
    # Run it from the unpacked wheel, not the source tree (-P: no cwd on sys.path).
    site = tmp_path / "site"
    probe = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "import runpy, sys, importlib.util, temporal_agent_interrupts.worker as w;"
            "print(w.__file__); print(importlib.util.find_spec('examples'));"
            "sys.argv = ['agent-worker', '--help'];"
            "runpy.run_module('temporal_agent_interrupts.worker', run_name='__main__')",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    first, second = probe.stdout.splitlines()[:2]
    assert first.startswith(str(site)) and second == "None"
    assert "TEMPORAL_ADDRESS" in probe.stdout

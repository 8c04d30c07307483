"""The Reference section of the docs site (docs/reference/) is complete: each test fails when the
code grows something the reference does not document, or the reference names what is gone.

- ``api.md``: every root export, every namespace's, and every ``AgentError`` has a ``:::``
  directive (tests/test_public_surface.py holds the list, and that api.md has nothing more);
- ``payloads.md``: every signal, update and query the workflow registers (asked of a running
  conversation, and the names its dynamic signal handler dispatches) has a row in its table,
  and no row names a handler that does not exist; each ``<!-- fields: MODEL -->`` table lists
  exactly the model's fields; the JSON Schemas it links are the models' own; each ``json``
  block (here and in ``agentctl.md``) validates against the model its ``<!-- model: -->`` names;
- ``settings.md``: every environment variable the package reads, and no variable that nothing
  knows; every flag of ``agent-worker``, ``agent-codec-server`` and the web app;
- ``agentctl.md``: every command, argument and option of the real parser, every exit code.

Run ``python -m tests.test_docs_reference`` to write the JSON Schemas again after a change to
the models.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic import BaseModel
from temporalio.api.sdk.v1 import WorkflowMetadata

import temporal_agent_interrupts
from temporal_agent_interrupts import codec_server
from temporal_agent_interrupts.client import web
from temporal_agent_interrupts.client.cli import ExitCode, app
from temporal_agent_interrupts.errors import AgentError
from temporal_agent_interrupts.worker import __main__ as worker_main
from temporal_agent_interrupts.worker import testing
from temporal_agent_interrupts.worker.standin import text
from temporal_agent_interrupts.workflows import conversation, signals
from temporal_agent_interrupts.workflows.agent import Agent
from temporal_agent_interrupts.workflows.answers import ENTRY_KEYS
from temporal_agent_interrupts.workflows.types import ResumeInput, SendInput

ROOT = Path(__file__).parent.parent
REFERENCE = ROOT / "docs" / "reference"
PACKAGE = "temporal_agent_interrupts"
# The folders mapped into the package (beside its root's own modules).
FOLDERS = ("workflows", "activities", "worker", "client")
SCHEMAS = {
    "resume.schema.json": lambda: resume_schema(),
    "send.schema.json": lambda: SendInput.model_json_schema(),
}


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line), up to the next heading of its level
    or above (a ``#`` line inside a code block is no heading)."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    assert heading in lines, f"no heading {heading!r} any more"
    start = lines.index(heading) + 1
    fenced = False
    for i in range(start, len(lines)):
        if lines[i].lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[i]):
            return "\n".join(lines[start:i])
    return "\n".join(lines[start:])


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the Markdown tables in ``text`` (each table's header and
    rule left out)."""
    rows: list[list[str]] = []
    table: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        # A cell may hold an escaped pipe (`dev\\|bearer`).
        rows += [[c.strip() for c in re.split(r"(?<!\\)\|", r.strip()[1:-1])] for r in table[2:]]
        table = []
    return rows


def code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# ----------------------------------------------------------------------------------------------
# api.md


def directives() -> list[str]:
    return re.findall(r"^::: (\S+)$", page("api.md"), re.M)


def test_every_root_export_has_a_directive():
    documented = set(directives())
    missing = [n for n in temporal_agent_interrupts.__all__ if f"{PACKAGE}.{n}" not in documented]
    assert not missing, f"docs/reference/api.md lacks `::: {PACKAGE}.NAME` for: {missing}"


NAMESPACES = ("errors", "types", "policies", "mcp", "web", "hosting", "testing")


@pytest.mark.parametrize("name", NAMESPACES)
def test_every_namespace_export_has_a_directive(name):
    # A namespace's name that is the root's own (errors.AgentError) is documented at the root.
    module = importlib.import_module(f"{PACKAGE}.{name}")
    documented = set(directives())
    missing = [
        n
        for n in module.__all__
        if f"{PACKAGE}.{name}.{n}" not in documented and n not in temporal_agent_interrupts.__all__
    ]
    assert not missing, f"docs/reference/api.md lacks `::: {PACKAGE}.{name}.NAME` for: {missing}"


def test_the_test_kit_is_documented_whole():
    # The kit's namespace re-exports worker.testing whole: every name it has is public.
    documented = set(directives())
    missing = [n for n in testing.__all__ if f"{PACKAGE}.testing.{n}" not in documented]
    assert not missing, f"docs/reference/api.md lacks the test kit's {missing}"


# Deprecated aliases, kept until 0.2: importing one only warns (its test is its own).
_ALIASES = frozenset([f"{PACKAGE}.worker.codec_server"])


def _all_modules() -> None:
    for info in pkgutil.walk_packages(temporal_agent_interrupts.__path__, f"{PACKAGE}."):
        if info.name not in _ALIASES:
            importlib.import_module(info.name)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_agent_error_is_documented():
    _all_modules()
    errors = {
        c
        for c in _subclasses(AgentError) | {AgentError}
        if c.__module__.startswith(PACKAGE) and not c.__name__.startswith("_")
    }
    named = {d.rsplit(".", 1)[-1] for d in directives()}
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in errors if c.__name__ not in named)
    assert len(errors) >= 10
    assert not missing, f"docs/reference/api.md's Errors lack: {missing}"


# ----------------------------------------------------------------------------------------------
# payloads.md


def handler_table() -> list[tuple[str, str]]:
    """(name, kind) of every row of payloads.md's table of handlers."""
    text = section(page("payloads.md"), "## Every signal, update and query")
    return [(name, row[1]) for row in table_rows(text) for name in code_names(row[0])]


def dispatched_signals() -> set[str]:
    """The signal names ``AgentWorkflow.on_signal`` (the dynamic handler) takes: each
    ``name == X`` that ``Signals.take``, which it hands every signal, compares, X a literal or
    a name of that module."""
    assert "self._signals.take(name, args)" in inspect.getsource(
        conversation.AgentWorkflow.on_signal
    )
    source = inspect.getsource(signals.Signals.take)
    tree = ast.parse(inspect.cleandoc("\n" + source))
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == "name"
            and isinstance(node.ops[0], ast.Eq)
        ):
            right = node.comparators[0]
            if isinstance(right, ast.Constant):
                names.add(right.value)
            elif isinstance(right, ast.Name):
                names.add(getattr(signals, right.id))
    return names


def test_the_dynamic_signal_handler_takes_names():
    assert {"resume", "send"} <= dispatched_signals()


async def test_every_handler_the_workflow_registers_is_in_the_payload_table(run_worker, model):
    # The handlers as the worker registered them, those the stream adds at run time too: the
    # SDK's built-in metadata query, asked of a running conversation.
    agent = Agent(f"reference-{uuid.uuid4().hex[:8]}", model="gemini-test")
    model.reply(text("hello"))
    async with run_worker(agents=[agent]) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hi")
        meta: WorkflowMetadata = await chat.handle.query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
    definition = meta.definition
    registered = {
        *((q.name, "query") for q in definition.query_definitions),
        *((u.name, "update") for u in definition.update_definitions),
        *((s.name, "signal") for s in definition.signal_definitions if s.name),
        *((name, "signal") for name in dispatched_signals()),
    }
    # A dynamic query or update would take names no table can list.
    assert ("", "query") not in registered and ("", "update") not in registered
    listed = set(handler_table())
    missing = sorted(registered - listed)
    assert not missing, f"docs/reference/payloads.md's table lacks (name, kind): {missing}"
    stale = sorted(listed - registered)
    assert not stale, f"payloads.md's table lists handlers the workflow does not have: {stale}"


def field_tables() -> list[tuple[str, str, list[str]]]:
    """(page, model path, first-column names) of every ``<!-- fields: MODEL -->`` table."""
    found = []
    for path in sorted(REFERENCE.glob("*.md")):
        text = path.read_text()
        for m in re.finditer(r"<!-- fields: (\S+) -->\n\n((?:\|.*\n)+)", text):
            names = [code_names(row[0])[0] for row in table_rows(m[2])]
            found.append((path.name, m[1], names))
    return found


def model_at(dotted: str) -> type[BaseModel]:
    module, _, name = dotted.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    assert isinstance(model, type) and issubclass(model, BaseModel), dotted
    return model


def test_each_field_table_lists_its_models_fields():
    tables = field_tables()
    assert {"ResumeInput", "ToolResponse", "ToolRestart", "SendInput"} <= {
        t[1].rsplit(".", 1)[-1] for t in tables
    }
    for name, dotted, listed in tables:
        fields = list(model_at(dotted).model_fields)
        assert sorted(listed) == sorted(fields), (
            f"docs/reference/{name}: the table of {dotted} lists {listed}; the model has {fields}"
        )


def test_each_json_block_names_a_model_it_validates_against():
    # The resume payload, agentctl's --json output: what a script reads or sends, as printed.
    found = []
    for path in sorted(REFERENCE.glob("*.md")):
        text = path.read_text()
        blocks = text.count("```json\n")
        named = re.findall(r"<!-- model: (\S+) -->\n```json\n(.*?)```", text, re.S)
        assert len(named) == blocks, f"docs/reference/{path.name}: a json block names no model"
        for dotted, body in named:
            model_at(dotted).model_validate(json.loads(body))
            found.append(dotted.rsplit(".", 1)[-1])
    assert "ResumeInput" in found and "ShowOutput" in found


def resume_schema() -> dict[str, Any]:
    """``ResumeInput``'s JSON Schema, its entries closed as the workflow holds them: a key
    outside ``workflows.answers.ENTRY_KEYS`` rejects the resume, which the models alone (they
    ignore unknown keys, for recorded histories) do not say."""
    schema = ResumeInput.model_json_schema()
    for kind, model in (("respond", "ToolResponse"), ("restart", "ToolRestart")):
        entry = schema["$defs"][model]
        assert sorted(entry["properties"]) == sorted(ENTRY_KEYS[kind]), kind
        entry["additionalProperties"] = False
    return schema


def schema_text(name: str) -> str:
    return json.dumps(SCHEMAS[name](), indent=2) + "\n"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_linked_schemas_are_the_models_own(name):
    path = REFERENCE / "schemas" / name
    assert f"(schemas/{name})" in page("payloads.md")
    assert path.read_text() == schema_text(name), (
        f"docs/reference/schemas/{name} is not the model's schema: "
        "run `.venv/bin/python -m tests.test_docs_reference` to write it again"
    )


# ----------------------------------------------------------------------------------------------
# settings.md

VARIABLE = re.compile(r"\b(?:AGENT|AGENTCTL|TEMPORAL|OTEL|GEMINI|GOOGLE)_[A-Z0-9_]*[A-Z0-9]\b")


def source_strings() -> list[str]:
    """Every string literal in the package's source (docstrings and help texts included)."""
    found = []
    # The package root's own modules (its links lead to the four folders, walked on their own).
    paths = [
        *(ROOT / PACKAGE).glob("*.py"),
        *(p for d in FOLDERS for p in (ROOT / d).rglob("*.py")),
    ]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return found


def variables_read() -> set[str]:
    """The environment variables the package reads: each string literal that is a variable's
    name and nothing else (``os.environ.get("AGENT_LOG_LEVEL")``, ``envvar="AGENTCTL_IDENTITY"``,
    ``ENV_VAR = "AGENT_PAYLOAD_KEYS"``, ``GEMINI_KEY_VARS = ("GEMINI_API_KEY", ...)``)."""
    return {s for s in source_strings() if VARIABLE.fullmatch(s)}


def test_the_package_reads_variables():
    assert {"AGENT_PAYLOAD_KEYS", "AGENT_LOG_LEVEL", "AGENTCTL_IDENTITY"} <= variables_read()


def test_every_variable_the_package_reads_is_in_settings():
    text = page("settings.md")
    missing = sorted(v for v in variables_read() if f"`{v}`" not in text)
    assert not missing, f"docs/reference/settings.md lacks the variables {missing}"


def test_every_variable_settings_names_is_known():
    # Known: named anywhere in the package's source (temporalio.envconfig reads the TEMPORAL_*
    # ones; the source says which it relies on) or in .env.example.
    known = {v for s in source_strings() for v in VARIABLE.findall(s)}
    known |= set(VARIABLE.findall((ROOT / ".env.example").read_text()))
    text = page("settings.md")
    unknown = []
    for m in re.finditer(rf"{VARIABLE.pattern}(?P<star>_\*)?", text):
        name = m[0].removesuffix("_*")
        if m["star"] and not any(k.startswith(name + "_") for k in known):
            unknown.append(m[0])
        elif not m["star"] and name not in known:
            unknown.append(name)
    assert not unknown, f"docs/reference/settings.md names variables nothing knows: {unknown}"


ENTRY_POINTS: dict[str, Callable[[list[str]], object]] = {
    "## `agent-worker`'s flags": worker_main.parse_args,
    "## `agent-codec-server`'s flags": codec_server.parse_args,
    "## The web app's flags": web.main,
}
"""The processes with an argparse parser, by the heading of their table in settings.md."""


def flags_of(program: str) -> set[str]:
    """A program's flags, from its own ``--help`` (which exits before anything starts)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        ENTRY_POINTS[program](["--help"])
    # argparse lists each option at the start of a line, indented two spaces.
    return set(re.findall(r"^  (?:-\w, )?(--[a-z][a-z-]*)", out.getvalue(), re.M)) - {"--help"}


@pytest.mark.parametrize("program", sorted(ENTRY_POINTS))
def test_every_flag_is_in_settings(program):
    flags = flags_of(program)
    assert len(flags) >= 5
    rows = table_rows(section(page("settings.md"), program))
    listed = {name.split()[0] for row in rows for name in code_names(row[0])}
    assert sorted(flags - listed) == [], f"settings.md's table of {program}'s flags lacks some"
    assert sorted(listed - flags) == [], f"settings.md lists {program} flags it does not have"


# ----------------------------------------------------------------------------------------------
# agentctl.md


def agentctl() -> Any:
    """agentctl's click group, as typer builds it to run (typer vendors click: its classes are
    not ``click``'s, so they are read by their attributes)."""
    return typer.main.get_command(app)


def options_of(command: Any) -> set[str]:
    return {o for p in command.params if p.param_type_name == "option" for o in p.opts}


def test_every_global_option_is_documented():
    text = section(page("agentctl.md"), "## Options before the command")
    missing = sorted(o for o in options_of(agentctl()) if f"`{o}" not in text)
    assert not missing, f"agentctl.md's options before the command lack {missing}"


def test_every_command_its_arguments_and_options_are_documented():
    text = page("agentctl.md")
    commands = agentctl().commands
    assert len(commands) >= 10
    documented = set(re.findall(r"^### `agentctl (\S+)`$", text, re.M))
    assert documented == set(commands), (
        f"agentctl.md documents {sorted(documented)}; agentctl has {sorted(commands)}"
    )
    for name, command in commands.items():
        part = section(text, f"### `agentctl {name}`")
        usage = next(iter(re.findall(r"Usage: `(agentctl [^`]*)`", part)), "")
        for argument in (p for p in command.params if p.param_type_name == "argument"):
            metavar = argument.metavar or argument.name or ""
            assert metavar in usage.split(), f"agentctl {name}: usage lacks {metavar}"
        rows = table_rows(part)
        listed = {n.split()[0] for row in rows for n in code_names(row[0])}
        options = options_of(command)
        assert options <= listed, f"agentctl {name}: no row for {sorted(options - listed)}"
        assert listed <= options, f"agentctl {name}: rows for options it lacks: {listed - options}"


def test_every_exit_code_is_in_the_table():
    rows = table_rows(section(page("agentctl.md"), "## Exit codes"))
    listed = {int(row[0]) for row in rows}
    assert listed == {int(c) for c in ExitCode}, "agentctl.md's exit codes are not ExitCode's"


def write_schemas() -> None:
    for name in SCHEMAS:
        (REFERENCE / "schemas").mkdir(exist_ok=True)
        (REFERENCE / "schemas" / name).write_text(schema_text(name))
        print(f"wrote docs/reference/schemas/{name}", file=sys.stderr)


if __name__ == "__main__":
    write_schemas()

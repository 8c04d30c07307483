"""Every code block of every page is run or checked, and the site builds with ``--strict``.

A block is RUN when a test under tests/ names its first line (``block("<first line>",
lang=...)``, found here by reading the tests' source) and uses its text, in a test not marked
``skip`` or ``xfail``. Every block is also CHECKED by its kind,
cheaply, run or not:

- ``python``: compiled, and type-checked by pyright, all blocks in one project, each at the
  path its first line names (``# mypackage/agents.py``) so that their imports of each other
  resolve, with the project's own pyright settings; the code of a command block's
  ``python -c CODE`` too;
- ``bash``, ``sh``, ``console`` (its ``$ `` lines): each command is parsed, and the program
  it names must be one the docs may name: ours (``agentctl``, ``agent-worker``,
  ``agent-codec-server``) with their own parsers, ``temporal`` against its ``--help``, a
  Makefile target, an importable ``python -m`` module, a file another block is, or a tool on a
  short list;
- ``json``: parsed, and validated with the model the page names above the fence
  (``<!-- model: temporal_agent_interrupts.client.views.ShowOutput -->``), with no key the
  model does not have;
- ``toml``: parsed; a ``[profile.*]`` is loaded by ``temporalio.envconfig`` and yields its
  address, a ``[tool.*]`` is a pyproject fragment whose pytest settings pytest knows;
- ``js``: ``node --check``;
- ``text``: only a figure of output, said so above the fence (``<!-- output -->``).

A block of any other kind, or of none, fails until a test runs it or it says what it is. Code
a page shows outside the fences read here (an indented block, raw ``<pre>``, an included file's
block, a docstring's example on the API reference) fails too: each page, rendered with the
site's Markdown extensions and as the built site serves it, shows exactly the blocks found here.
Each checker collects every failure, as ``page:line: why``, and reports them together.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import markdown
import pytest
import typer.core
import typer.main
import yaml
from pydantic import BaseModel, ValidationError
from temporalio.envconfig import ClientConfig

from tests import docs
from tests.docs import ROOT, Block

TESTS = ROOT / "tests"
VENV_BIN = ROOT / ".venv" / "bin"

# The kinds a checker below knows; ``text`` only as a figure of output.
CHECKED = ("python", "bash", "sh", "console", "json", "toml", "js", "javascript")
COMMAND_KINDS = ("bash", "sh", "console")
JS_KINDS = ("js", "javascript")

MODEL_COMMENT = re.compile(r"<!--\s*model:\s*([\w.]+)\s*-->")
OUTPUT_COMMENT = re.compile(r"<!--\s*output\s*-->")
# A block's first line that names the file it is: ``# mypackage/agents.py``, ``# web_app.py:
# served with uvicorn``, ``// agui_client.mjs: ...``.
NAMED_PATH = re.compile(r"^(?:#|//)\s*((?:[\w.-]+/)*[\w-]+\.(?:py|mjs|js))(?::|\s|$)")


def _page_line(b: Block, line_in_block: int) -> str:
    """``page:line`` of the block's ``line_in_block``-th line (1-based)."""
    return f"{b.page}:{b.line + line_in_block - 1}"


def _report(failures: Sequence[str], what: str) -> None:
    assert not failures, f"{len(failures)} {what}:\n" + "\n".join(failures)


# --------------------------------------------------------------------------------------------
# Which blocks a test runs


@dataclass(frozen=True)
class RunCall:
    """A test's ``block("<first line>", lang="<lang>")``: where it is, what it names."""

    where: str
    first: str
    lang: str


def run_calls(tests: Path = TESTS) -> list[RunCall]:
    """Every ``block(...)`` / ``docs.block(...)`` call with a literal first line in the tests'
    source (implicit concatenation of literals is one constant)."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        if _marked_not_to_run(tree):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            if not _runs(node, parents):
                continue
            func = node.func
            named = (isinstance(func, ast.Name) and func.id == "block") or (
                isinstance(func, ast.Attribute)
                and func.attr == "block"
                and isinstance(func.value, ast.Name)
                and func.value.id == "docs"
            )
            first = node.args[0]
            if not (named and isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            lang = next(
                (
                    k.value.value
                    for k in node.keywords
                    if k.arg == "lang"
                    and isinstance(k.value, ast.Constant)
                    and isinstance(k.value.value, str)
                ),
                None,
            )
            if lang is not None:
                where = f"{path.relative_to(tests.parent)}:{node.lineno}"
                found.append(RunCall(where=where, first=first.value, lang=lang))
    return found


# pytest's marks under which a test's block() runs nothing that can fail the suite: skipped, or
# expected to fail (skipif is a condition, and runs where it is false: CI).
NOT_RUN_MARK = re.compile(r"\bmark\.(?:skip|xfail)\b")


def _marked_not_to_run(node: ast.AST) -> bool:
    """A module whose ``pytestmark`` skips or xfails it, or a function or class so decorated."""
    if isinstance(node, ast.Module):
        return any(
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
            and NOT_RUN_MARK.search(ast.unparse(n.value))
            for n in node.body
        )
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return any(NOT_RUN_MARK.search(ast.unparse(d)) for d in node.decorator_list)
    return False


def _runs(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """A block() call whose text is used (not a statement of its own, thrown away), in no test
    or class marked not to run."""
    if isinstance(parents.get(call), ast.Expr):
        return False
    node: ast.AST | None = call
    while node is not None:
        if _marked_not_to_run(node):
            return False
        node = parents.get(node)
    return True


def unaccounted(blocks: Sequence[Block], calls: Sequence[RunCall]) -> list[str]:
    """The blocks neither run by a test nor of a kind checked here; and the tests' calls that
    name a block no page has (their test fails too, when it runs: this says so without
    running it)."""
    run = {(c.lang, c.first) for c in calls}
    failures = []
    for b in blocks:
        if (b.lang, b.first) in run:
            continue
        if b.lang in CHECKED:
            continue
        if b.lang == "text":
            if not OUTPUT_COMMENT.search(b.before):
                failures.append(
                    f"{b.where}: a ```text block is only a figure of output: put "
                    "<!-- output --> on a line above its fence (or make it a kind that is "
                    "checked, or run it in a test)"
                )
            continue
        if not b.lang:
            failures.append(
                f"{b.where}: an unlabeled block: say what kind of block it is (```python, "
                "```bash, ```json with <!-- model: ... -->, ```text after <!-- output -->, ...)"
            )
            continue
        failures.append(
            f"{b.where}: a ```{b.lang} block: no check knows this kind; say what kind of block "
            f"it is ({', '.join(CHECKED)}, or text after <!-- output -->), or run it in a test "
            f'that calls block({b.first!r}, lang="{b.lang}")'
        )
    present = {(b.lang, b.first) for b in blocks}
    failures += [
        f"{c.where}: block({c.first!r}, lang={c.lang!r}) names a block no page has"
        for c in calls
        if (c.lang, c.first) not in present
    ]
    return failures


# --------------------------------------------------------------------------------------------
# Code a page shows that no fence holds


def _markdown_extensions(base_path: Path) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The site's Markdown extensions and their settings (mkdocs.yml), with the snippets'
    base path at ``base_path`` (the root, where `make docs` runs)."""
    names: list[str] = []
    configs: dict[str, dict[str, Any]] = {}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        name, config = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        names.append(name)
        configs[name] = dict(config or {})
    if "pymdownx.snippets" in configs:
        configs["pymdownx.snippets"]["base_path"] = [str(base_path)]
    return names, configs


def rendered_code_blocks(html: str) -> int:
    """The code blocks in a page's HTML, the signatures mkdocstrings renders aside."""
    signatures = len(re.findall(r'<div class="[^"]*\bdoc-signature\b[^"]*"><pre\b', html))
    return len(re.findall(r"<pre\b", html)) - signatures


def _unseen(page: str, rendered: int, found: int) -> list[str]:
    if rendered == found:
        return []
    return [
        f"{page}: renders {rendered} code blocks, and the checks read {found}: code outside a "
        "fence they read (an indented block, raw <pre>, an included file's block, a "
        "docstring's example) is neither run nor checked; make it a ``` block of the page"
    ]


def unseen_code(path: Path, text: str | None = None, *, base_path: Path = ROOT) -> list[str]:
    """A page (the README, or a page of the site before mkdocstrings) renders exactly the code
    blocks ``blocks_of`` finds: one more is code nothing reads."""
    text = path.read_text() if text is None else text
    names, configs = _markdown_extensions(base_path)
    html = markdown.markdown(text, extensions=names, extension_configs=configs)
    return _unseen(
        str(path.relative_to(ROOT)), rendered_code_blocks(html), len(docs.blocks_of(path, text))
    )


def unseen_code_in_site(site: Path) -> list[str]:
    """The built site's pages, as served (includes and the API reference's docstrings in):
    each shows the code blocks of its Markdown page, and no other."""
    failures = []
    for path in docs.pages()[1:]:  # the README is no page of the site
        page = path.relative_to(docs.DOCS).with_suffix("")
        folder = page.parent if page.name == "index" else page
        html = (site / folder / "index.html").read_text()
        failures += _unseen(
            str(path.relative_to(ROOT)), rendered_code_blocks(html), len(docs.blocks_of(path))
        )
    return failures


# --------------------------------------------------------------------------------------------
# python: compile, and pyright over all the blocks at once


# An own-line comment that turns pyright off (a "type: ignore" comment at the top ignores the
# whole file) or down ("pyright: basic", "pyright: reportX=false") for the rest of a block; an
# ignore at the end of a line of code stays visible where it is, and is allowed.
PYRIGHT_OPT_OUT = re.compile(r"^\s*#\s*(?:type:\s*ignore\b|pyright:\s*(?!strict\s*$))")
# Folders pyright skips whatever its settings say (besides any starting with a dot).
PYRIGHT_SKIPS = ("node_modules", "__pycache__")


def _named_path(b: Block) -> str | None:
    m = NAMED_PATH.match(b.first)
    return m[1] if m else None


def _block_file_name(b: Block, suffix: str) -> str:
    return "block_" + re.sub(r"\W", "_", b.page) + f"_{b.line}{suffix}"


def _pyright_settings() -> dict[str, Any]:
    """The project's own pyright settings (its pyproject), less what says where its files are."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pyright"]
    kept = {
        k: v
        for k, v in project.items()
        if k in ("pythonVersion", "typeCheckingMode") or k.startswith("report")
    }
    return {"pythonVersion": "3.11", "typeCheckingMode": "standard", **kept}


def check_python(blocks: Sequence[Block], tmp: Path) -> list[str]:
    """Every python block compiles, and pyright finds no error in it (``page:line: message``)."""
    python = [b for b in blocks if b.lang == "python"]
    failures = []
    compiled = []
    for b in python:
        try:
            compile(b.text, b.where, "exec")
        except SyntaxError as e:
            failures.append(f"{_page_line(b, e.lineno or 1)}: does not compile: {e.msg}")
        else:
            compiled.append(b)  # pyright on the others would only say it again, at length
        for number, line in enumerate(b.text.splitlines(), start=1):
            if PYRIGHT_OPT_OUT.match(line):
                failures.append(
                    f"{_page_line(b, number)}: {line.strip()!r} turns pyright's checks off for "
                    "the block: a reader's copy would hide what the check no longer sees"
                )
    python = compiled

    # Blocks that name the same path (a page and its copy) go to a second project of their own
    # (an execution environment), which falls back on the first for the modules it lacks.
    sets: list[dict[str, Block]] = []
    files: dict[Path, Block] = {}
    for b in python:
        rel = _named_path(b) or _block_file_name(b, ".py")
        if any(part.startswith(".") or part in PYRIGHT_SKIPS for part in Path(rel).parts[:-1]):
            rel = _block_file_name(b, ".py")  # a folder pyright never analyses: checked alone
        index = next((i for i, s in enumerate(sets) if rel not in s), len(sets))
        if index == len(sets):
            sets.append({})
        sets[index][rel] = b
        path = tmp / f"set{index}" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.text)
        files[path.resolve()] = b
        # A package for each folder of the path, so ``from mypackage.agents import ...`` works.
        folder = path.parent
        while folder != tmp / f"set{index}":
            (folder / "__init__.py").touch()
            folder = folder.parent
    if not python:
        return failures
    config = {
        **_pyright_settings(),
        "venvPath": str(ROOT),
        "venv": ".venv",
        "include": [f"set{i}" for i in range(len(sets))],
        # For the checkout's own modules the blocks import, outside every environment below.
        "extraPaths": [str(ROOT)],
        "executionEnvironments": [
            {"root": f"set{i}", "extraPaths": [*(["set0"] if i else []), str(ROOT)]}
            for i in range(len(sets))
        ],
    }
    (tmp / "pyrightconfig.json").write_text(json.dumps(config, indent=2))
    result = subprocess.run(
        [str(VENV_BIN / "pyright"), "-p", str(tmp), "--outputjson"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return [*failures, f"pyright did not report: {result.stdout[-2000:]}{result.stderr}"]
    analysed = report.get("summary", {}).get("filesAnalyzed", 0)
    written = len([p for i in range(len(sets)) for p in (tmp / f"set{i}").rglob("*.py")])
    if analysed < written:
        failures.append(f"pyright analysed {analysed} of the {written} files the blocks make")
    for d in report["generalDiagnostics"]:
        if d["severity"] != "error":
            continue
        b = files.get(Path(d["file"]).resolve())
        where = _page_line(b, d["range"]["start"]["line"] + 1) if b else d["file"]
        rule = f" ({d['rule']})" if d.get("rule") else ""
        message = " ".join(line.strip() for line in d["message"].splitlines())
        failures.append(f"{where}: pyright: {message}{rule}")
    return failures


# --------------------------------------------------------------------------------------------
# bash, sh, console: every command parsed by the program it names


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]


def _source_lines(b: Block) -> Iterator[tuple[int, str]]:
    """The block's lines a shell reads, with their number in the block; in a console block
    only the ``$ `` lines (and their ``\\`` continuations): the rest is output."""
    lines = b.text.splitlines()
    if b.lang != "console":
        yield from enumerate(lines, start=1)
        return
    continued = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("$ "):
            yield number, line[2:]
        elif continued:
            yield number, line
        else:
            continue
        continued = line.rstrip().endswith("\\")


def _logical_lines(b: Block) -> Iterator[tuple[int, str]]:
    """The commands as a shell reads them: ``\\`` and a newline join two lines, a newline
    inside quotes is part of the word, a ``#`` that starts a word outside quotes starts a
    comment. Each with the block line it starts on."""
    buf: list[str] = []
    start: int | None = None
    quote: str | None = None
    for number, line in _source_lines(b):
        start = number if start is None else start
        continued = False
        i = 0
        while i < len(line):
            c = line[i]
            if quote == "'":
                quote = None if c == "'" else quote
            elif quote == '"':
                if c == "\\" and i + 1 < len(line):
                    buf.append(c)
                    i += 1
                    c = line[i]
                elif c == '"':
                    quote = None
            elif c in "'\"":
                quote = c
            elif c == "\\":
                if i + 1 == len(line):
                    continued = True
                    break
                buf.append(c)
                i += 1
                c = line[i]
            elif c == "#" and (not buf or buf[-1] in " \t;|&()\n"):
                break  # a comment, to the end of the line
            buf.append(c)
            i += 1
        if quote is not None:
            buf.append("\n")
            continue
        if continued:
            buf.append(" ")
            continue
        text = "".join(buf).strip()
        if text:
            yield start, text
        buf, start = [], None
    if quote is not None and start is not None:
        yield start, "".join(buf)  # shlex reports the open quote


OPERATOR = re.compile(r"^[();<>|&]+$")
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def _substitutions(text: str) -> list[str]:
    """The commands a line runs inside a word: ``$(...)`` within double quotes and `` `...` ``
    anywhere outside single quotes (shlex keeps both inside one word; an unquoted ``$(`` it
    splits at the parenthesis already)."""
    found = []
    quote: str | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "`":
            end = text.find("`", i + 1)
            if end < 0:
                break
            found.append(text[i + 1 : end])
            i = end
        elif quote == '"' and text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            found.append(text[i + 2 : j - 1])
            i = j - 1
        elif c in "'\"":
            quote = None if quote == c else (quote or c)
        i += 1
    return found


@functools.cache
def _settings_known() -> tuple[frozenset[str], tuple[str, ...]]:
    """The variables the settings page names, and the prefixes it names as ``PREFIX_*``."""
    text = (docs.DOCS / "reference" / "settings.md").read_text()
    names = frozenset(SETTING.findall(text))
    stars = tuple(m + "_" for m in re.findall(rf"({SETTING.pattern})_\*", text))
    return names, stars


# The variables of this product and of the libraries it configures: one a page sets must be one
# the settings page names (a misspelt one is ignored by every process, silently).
SETTING = re.compile(r"\b(?:AGENT|AGENTCTL|TEMPORAL|GEMINI)_[A-Z0-9_]*[A-Z0-9]\b")


def _setting_error(assignment: str) -> str | None:
    name = assignment.split("=", 1)[0]
    if not SETTING.fullmatch(name):
        return None
    names, stars = _settings_known()
    if name in names or name.startswith(stars):
        return None
    return f"{name} is not a setting docs/reference/settings.md names"


def commands_of(b: Block) -> tuple[list[Command], list[str]]:
    """The block's simple commands (split at ``&&``, ``||``, ``;``, ``|``, ``(``/``)``, with
    their leading ``VAR=value`` assignments and any redirections taken off, and those a word
    substitutes), and the lines that do not parse or set a variable that is no setting."""
    commands: list[Command] = []
    failures: list[str] = []

    def parse(text: str, where: str) -> None:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""  # taken off above, where a quote is told from a word
        try:
            tokens = list(lexer)
        except ValueError as e:
            failures.append(f"{where}: does not parse as a shell command: {e}")
            return
        segments: list[list[str]] = [[]]
        skip_next = False
        for token in tokens:
            if skip_next:
                skip_next = False
                continue
            if OPERATOR.match(token):
                if "<" in token or ">" in token:  # a redirection: its target is no argument
                    if segments[-1] and segments[-1][-1].isdigit():
                        segments[-1].pop()  # the 2 of 2>&1
                    skip_next = True
                    continue
                segments.append([])
                continue
            segments[-1].append(token)
        for argv in segments:
            # `export NAME=value` and `NAME=value cmd`: a setting's name must be one.
            if argv and argv[0] == "export":
                argv = argv[1:]
                if all(ASSIGNMENT.match(a) for a in argv):
                    failures.extend(f"{where}: {e}" for a in argv if (e := _setting_error(a)))
                    continue
            while argv and ASSIGNMENT.match(argv[0]):
                if error := _setting_error(argv[0]):
                    failures.append(f"{where}: {error}")
                argv = argv[1:]
            if argv:
                commands.append(Command(where=where, argv=tuple(argv)))
        for inner in _substitutions(text):
            parse(inner, where)

    for number, text in _logical_lines(b):
        parse(text, _page_line(b, number))
    if b.lang == "console" and not any(line.startswith("$ ") for line in b.text.splitlines()):
        failures.append(
            f"{b.where}: a console block with no `$ ` command: if it is a figure of output "
            "(a transcript), make it ```text with <!-- output --> on a line above its fence"
        )
    return commands, failures


# Programs named as they are, with no parser here to check them against.
ALLOWED = {
    # the approvals API and AG-UI over HTTP: the `# curl:` block runs in test_web_process.py
    "curl": "HTTP requests",
    # `docker compose ...`: docker-compose.yml is checked by tests/test_deployment.py
    "docker": "the compose deployment",
    # shell basics, in set-up steps and `since=$(date ...)` lines
    "cp": "shell",
    "cd": "shell",
    "echo": "shell",
    "date": "shell",
    "export": "shell",
    # other tools' installers and servers, shown as their own docs show them
    "npm": "the AG-UI client's install",
    "pip": "installing the package",
    "uvicorn": "serving the web app in your own service",
    # Temporal Cloud's CLI: not installed here (needs an account); its commands are its docs'
    "tcld": "Temporal Cloud",
    # the CI entry point, run by CI itself
    ".ci/run": "CI",
}


def _program(argv0: str) -> str:
    """``.venv/bin/python`` is ``python``, ``python3`` too; paths of other programs stay."""
    name = argv0
    if "/" in argv0 and Path(argv0).parent.name == "bin":
        name = Path(argv0).name
    return "python" if re.fullmatch(r"python3?(\.\d+)?", name) else name


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """stdout and stderr caught (a parser's usage error, or its --help)."""
    caught = io.StringIO()
    with contextlib.redirect_stdout(caught), contextlib.redirect_stderr(caught):
        yield caught


def _argparse_error(parse: Callable[[list[str]], object], args: list[str]) -> str | None:
    """None when ``parse`` accepts ``args`` (``--help`` too), else its one-line error."""
    with _quiet() as caught:
        try:
            parse(args)
        except SystemExit as e:
            if e.code not in (0, None):
                return caught.getvalue().strip().splitlines()[-1]
    return None


@functools.cache
def _agentctl() -> typer.core.TyperGroup:
    """agentctl's commands as its ``main()`` runs them (typer builds a fresh set each call),
    their callbacks taken off: they parse, and nothing runs."""
    from temporal_agent_interrupts.client.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    group.callback = None
    for command in group.commands.values():
        command.callback = None
    return group


def _agentctl_error(args: list[str]) -> str | None:
    """None when agentctl's own parser accepts ``args`` (``--help`` too), else its error."""
    try:
        with _quiet():
            code = _agentctl().main(list(args), prog_name="agentctl", standalone_mode=False)
    except typer.TyperException as e:  # click's usage errors
        return e.format_message()
    return f"exits {code}" if isinstance(code, int) and code != 0 else None


def _worker_parse(args: list[str]) -> object:
    from temporal_agent_interrupts.worker.__main__ import parse_args

    return parse_args(args)


def _codec_server_parse(args: list[str]) -> object:
    from temporal_agent_interrupts.codec_server import parse_args

    return parse_args(args)


@functools.cache
def _temporal_help(path: tuple[str, ...]) -> str:
    result = subprocess.run(
        [str(VENV_BIN / "temporal"), *path, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout + result.stderr


@functools.cache
def _temporal_options() -> str:
    """``temporal options``: the global and connection flags every command takes."""
    result = subprocess.run(
        [str(VENV_BIN / "temporal"), "options"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout


# A flag's line in `--help` (cobra: "  -i, --input stringArray   Input value.") and in
# `temporal options` ("  --output, -o string   Non-logging ..."); a description's continuation
# lines are indented further.
FLAG_LINE = re.compile(
    r"^ {2,6}(?:-(?P<short1>\w), )?--(?P<long>[\w-]+)(?:, -(?P<short2>\w))?(?: (?P<type>\S+))?"
)


def _temporal_subcommands(help_text: str) -> list[str]:
    section = re.search(r"^Available Commands:\n(.*?)(?:\n\n|\Z)", help_text, re.S | re.M)
    if not section:
        return []
    return [line.split()[0] for line in section[1].splitlines() if line.strip()]


@dataclass(frozen=True)
class Flag:
    name: str  # its long name, for an alias or a short flag too
    takes_value: bool


def _temporal_flags(help_text: str) -> dict[str, Flag]:
    """Each flag (``--long``, ``-s`` and aliases) the command takes."""
    flags: dict[str, Flag] = {}
    own = help_text.split("\nFlags:\n", 1)[-1]  # not the examples above it
    last: Flag | None = None
    for line in (own + "\n" + _temporal_options()).splitlines():
        m = FLAG_LINE.match(line)
        if m:
            # A type word (string, int, duration, QUERY, KEY=VALUE) follows a flag that takes
            # a value, one space after it; a switch has two spaces, then its description.
            last = Flag(name=f"--{m['long']}", takes_value=m["type"] is not None)
            names = [last.name, *(f"-{s}" for s in (m["short1"], m["short2"]) if s)]
            flags.update(dict.fromkeys(names, last))
        # `--name string  Signal name. Required. Aliased as "--type".`, maybe a line below.
        for alias in re.findall(r'Aliased as "(--[\w-]+)"', line):
            if last:
                flags[alias] = last
    return flags


def _handler_payloads() -> dict[str, type[BaseModel]]:
    """The conversation's signals, updates and queries that take a payload, by name, and its
    model (docs/reference/payloads.md's table)."""
    from temporal_agent_interrupts.workflows.types import (
        CancelInput,
        HistoryInput,
        MessagesInput,
        ResumeInput,
        SendInput,
    )

    return {
        "resume": ResumeInput,
        "send": SendInput,
        "cancel": CancelInput,
        "close": CancelInput,
        "history": HistoryInput,
        "messages": MessagesInput,
    }


def _temporal_error(args: list[str]) -> str | None:
    path: list[str] = []
    rest = list(args)
    while rest and not rest[0].startswith("-"):
        subcommands = _temporal_subcommands(_temporal_help(tuple(path)))
        if not subcommands:
            break  # a command, not a group: what follows are its arguments
        if rest[0] not in subcommands:
            where = " ".join(["temporal", *path])
            return f"{where} has no command {rest[0]!r} (it has {', '.join(subcommands)})"
        path.append(rest.pop(0))
    help_text = _temporal_help(tuple(path))
    if _temporal_subcommands(help_text):
        return f"{' '.join(['temporal', *path])} is a group of commands, not a command"
    flags = _temporal_flags(help_text)
    command = " ".join(["temporal", *path])
    values: dict[str, list[str]] = {}
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") or arg == "-":
            return f"{command} takes no argument {arg!r} (a flag's value must follow its flag)"
        name, value = arg.split("=", 1) if "=" in arg else (arg, None)
        if not name.startswith("--") and len(name) > 2:
            name, value = name[:2], name[2:]  # -wVALUE
        flag = flags.get(name)
        if flag is None:
            return f"{command} has no flag {name} (see {command} --help)"
        if flag.takes_value and value is None:
            if not rest:
                return f"{name} needs a value"
            value = rest.pop(0)
        values.setdefault(flag.name, []).append(value or "")
    # A payload for one of the conversation's handlers must be one it accepts.
    handler = (values.get("--name") or [""])[-1]
    model = _handler_payloads().get(handler) if path[:1] == ["workflow"] else None
    for payload in values.get("--input", []) if model else []:
        assert model is not None
        problem = _payload_problem(payload, model)
        if problem:
            return f"the {handler!r} payload does not fit {model.__name__}: {problem}"
    return None


@functools.cache
def _make_targets() -> frozenset[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z][\w.-]*(?:[ \t]+[A-Za-z][\w.-]*)*)[ \t]*:(?!=)", line)
        if m:
            targets.update(m[1].split())
    return frozenset(targets)


def _make_error(args: list[str]) -> str | None:
    missing = [
        a for a in args if not a.startswith("-") and not ASSIGNMENT.match(a)
    ]  # make's own flags, and VAR=value overrides, are fine
    unknown = [a for a in missing if a not in _make_targets()]
    if unknown:
        return f"the Makefile has no target {', '.join(unknown)}"
    return None


def _files_named(blocks: Sequence[Block]) -> set[str]:
    """The file names the first lines of the blocks that are files mention (``#
    stream_transfer.py``, ``# terminal 2: python this_file.py``, ``// agui_client.mjs: ...``);
    not a command block's, which would name the file it runs."""
    return {
        word.rstrip(":,")
        for b in blocks
        if b.lang not in COMMAND_KINDS
        for word in b.first.split()
        if re.search(r"\.(?:py|mjs|js)$", word.rstrip(":,"))
    }


def _module_exists(module: str, blocks: Sequence[Block]) -> bool:
    named = {p.removesuffix(".py").replace("/", ".") for b in blocks if (p := _named_path(b))}
    if module in named:
        return True
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package that is not there
        return False


def _python_error(args: list[str], blocks: Sequence[Block]) -> str | None:
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "-m":
            if not rest:
                return "-m needs a module"
            module = rest[0]
            return None if _module_exists(module, blocks) else f"no module {module!r}"
        if arg == "-c":
            return None  # the code is a python block of its own (python_blocks)
        if arg.startswith("-"):
            continue
        return _file_error(arg, blocks)
    return None


def _file_error(name: str, blocks: Sequence[Block]) -> str | None:
    # A file a block of the docs is, or one of the repository's (a clone runs those).
    if name in _files_named(blocks) or (ROOT / name).is_file():
        return None
    return f"{name} is neither a block of the docs (its first line names it) nor a file here"


def command_error(command: Command, blocks: Sequence[Block]) -> str | None:
    """Why the docs may not name this command (None: they may)."""
    program, *args = command.argv
    name = _program(program)
    if name == "agentctl":
        return _agentctl_error(args)
    if name == "agent-worker":
        return _argparse_error(_worker_parse, args)
    if name == "agent-codec-server":
        return _argparse_error(_codec_server_parse, args)
    if name == "temporal":
        return _temporal_error(args)
    if name == "make":
        return _make_error(args)
    if name == "python":
        return _python_error(args, blocks)
    if name == "node":
        files = [a for a in args if not a.startswith("-")]
        return _file_error(files[0], blocks) if files else None
    if name in ALLOWED:
        return None
    return f"{program!r} is not a program the docs may name (see ALLOWED in tests/test_docs.py)"


def python_blocks(blocks: Sequence[Block]) -> list[Block]:
    """The python blocks, and the code of each ``python -c CODE`` in a command block, as a
    python block at the command's line: what ``-c`` runs is checked as a block is."""
    found = [b for b in blocks if b.lang == "python"]
    for b in blocks:
        if b.lang not in COMMAND_KINDS:
            continue
        for command in commands_of(b)[0]:
            program, *args = command.argv
            if _program(program) != "python" or "-c" not in args[:-1]:
                continue
            page, _, line = command.where.rpartition(":")
            code = args[args.index("-c") + 1]
            found.append(Block(page=page, line=int(line), lang="python", text=code))
    return found


def check_commands(blocks: Sequence[Block], every: Sequence[Block] | None = None) -> list[str]:
    """Every command of every bash, sh and console block parses and names a program the docs
    may name (``every``: the blocks whose first lines may name a file, all of them by
    default)."""
    every = blocks if every is None else every
    failures = []
    # The environment the parsers read defaults from is the reader's, not this test run's.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AGENT")}
    try:
        for b in blocks:
            if b.lang not in COMMAND_KINDS:
                continue
            commands, unparsed = commands_of(b)
            failures += unparsed
            for command in commands:
                error = command_error(command, every)
                if error:
                    failures.append(f"{command.where}: {shlex.join(command.argv)}: {error}")
    finally:
        os.environ.update(saved)
    return failures


# --------------------------------------------------------------------------------------------
# json: the model the page names


def _strict_json(text: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"duplicate keys {twice}")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)


def _model(dotted: str) -> type[BaseModel]:
    module, _, name = dotted.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise TypeError(f"{dotted} is not a pydantic model")
    return found


def _unknown_keys(data: Any, value: Any, path: str) -> list[str]:
    """The keys of ``data`` that ``value`` (validated from it) has no field for: a model that
    ignores extras drops them, and a reader would think they meant something."""
    if isinstance(value, BaseModel) and isinstance(data, dict):
        fields = type(value).model_fields
        names = {n: n for n in fields} | {f.alias: n for n, f in fields.items() if f.alias}
        unknown = []
        for key, item in data.items():
            if key not in names:
                if type(value).model_config.get("extra") != "allow":
                    unknown.append(f"{path}.{key} ({type(value).__name__} has no such field)")
                continue
            unknown += _unknown_keys(item, getattr(value, names[key]), f"{path}.{key}")
        return unknown
    if isinstance(value, list | tuple) and isinstance(data, list):
        return [
            u
            for i, (d, v) in enumerate(zip(data, value, strict=False))
            for u in _unknown_keys(d, v, f"{path}[{i}]")
        ]
    if isinstance(value, dict) and isinstance(data, dict):
        return [
            u
            for k, d in data.items()
            if k in value
            for u in _unknown_keys(d, value[k], f"{path}.{k}")
        ]
    return []


def _payload_problem(text: str, model: type[BaseModel]) -> str | None:
    """Why ``text`` is not a JSON value of ``model`` with only the keys it has (None: it is)."""
    try:
        data = _strict_json(text)
    except ValueError as e:
        return f"not JSON: {e}"
    try:
        value = model.model_validate_json(text)
    except ValidationError as e:
        return "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '(the value)'}: {err['msg']}" for err in e.errors()
        )
    unknown = _unknown_keys(data, value, "$")
    return f"keys it does not have: {', '.join(unknown)}" if unknown else None


def check_json(blocks: Sequence[Block]) -> list[str]:
    failures = []
    for b in blocks:
        if b.lang != "json":
            continue
        try:
            _strict_json(b.text)
        except ValueError as e:
            failures.append(f"{b.where}: not JSON: {e}")
            continue
        named = MODEL_COMMENT.search(b.before)
        if not named:
            failures.append(
                f"{b.where}: say which model this JSON is: <!-- model: "
                "temporal_agent_interrupts.some.module.Model --> on one of the 3 lines above "
                "the fence"
            )
            continue
        if not named[1].startswith("temporal_agent_interrupts."):
            # A model from elsewhere says nothing of the product's wire (pydantic.RootModel
            # takes any array): and the import would run whatever module the page names.
            failures.append(f"{b.where}: <!-- model: {named[1]} --> is not one of the package's")
            continue
        try:
            model = _model(named[1])
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            failures.append(f"{b.where}: <!-- model: {named[1]} -->: {e}")
            continue
        problem = _payload_problem(b.text, model)
        if problem:
            failures.append(f"{b.where}: does not fit {named[1]}: {problem}")
    return failures


# --------------------------------------------------------------------------------------------
# toml


def check_toml(blocks: Sequence[Block], *, known_ini: Callable[[str], bool]) -> list[str]:
    """``known_ini``: whether pytest knows an ini setting (the session's config says)."""
    failures = []
    for b in blocks:
        if b.lang != "toml":
            continue
        try:
            data = tomllib.loads(b.text)
        except tomllib.TOMLDecodeError as e:
            at = re.search(r"at line (\d+)", str(e))
            failures.append(f"{_page_line(b, int(at[1])) if at else b.where}: not TOML: {e}")
            continue
        if b.first.startswith("[profile."):
            failures += _profile_failures(b, data)
        elif b.first.startswith("[tool."):
            failures += _pyproject_failures(b, data, known_ini=known_ini)
    return failures


def _profile_failures(b: Block, data: dict[str, Any]) -> list[str]:
    try:
        config = ClientConfig.load(
            config_source=b.text, config_file_strict=True, override_env_vars={}
        )
    except Exception as e:  # noqa: BLE001  # the SDK's loader raises its bridge's errors
        return [f"{b.where}: temporalio.envconfig does not load it: {e}"]
    failures = []
    for name, written in data.get("profile", {}).items():
        profile = config.profiles.get(name)
        address = written.get("address")
        if profile is None or not address or profile.address != address:
            failures.append(
                f"{b.where}: profile {name!r} does not yield the address it sets "
                f"({address!r}; envconfig read {profile.address if profile else None!r})"
            )
    return failures


def _pyproject_failures(
    b: Block, data: dict[str, Any], *, known_ini: Callable[[str], bool]
) -> list[str]:
    if set(data) != {"tool"}:
        return [f"{b.where}: a pyproject fragment has only [tool.*] tables, not {sorted(data)}"]
    failures = []
    ini = data["tool"].get("pytest", {}).get("ini_options", {})
    failures += [f"{b.where}: pytest has no setting {key!r}" for key in ini if not known_ini(key)]
    addopts = ini.get("addopts", "")
    words = shlex.split(" ".join(addopts) if isinstance(addopts, list) else addopts)
    plugins = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-p"]
    failures += [
        f"{b.where}: addopts loads plugin {p!r}, which is not importable"
        for p in plugins
        if not p.startswith("no:") and not _module_exists(p, [])
    ]
    return failures


# --------------------------------------------------------------------------------------------
# js


def check_js(blocks: Sequence[Block], tmp: Path) -> list[str]:
    failures = []
    node = shutil.which("node")
    for b in blocks:
        if b.lang not in JS_KINDS:
            continue
        if node is None:
            failures.append(f"{b.where}: node is not installed, to check it (Node.js 20+)")
            continue
        named = _named_path(b)
        # An ES module (import, top-level await), as the README runs it: .mjs.
        name = Path(named).name if named else _block_file_name(b, ".mjs")
        path = tmp / _block_file_name(b, "") / (name if name.endswith(".mjs") else name + ".mjs")
        path.parent.mkdir(parents=True)
        path.write_text(b.text)
        result = subprocess.run(
            [node, "--check", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            m = re.search(rf"{re.escape(path.name)}:(\d+)", result.stderr)
            where = _page_line(b, int(m[1])) if m else b.where
            errors = [ln for ln in result.stderr.splitlines() if "Error" in ln]
            failures.append(f"{where}: node --check: {errors[0] if errors else result.stderr}")
    return failures


# --------------------------------------------------------------------------------------------
# The tests, over every page


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # From the root, as `make docs` and CI run it: the snippets' base path is the root.
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_strict_and_shows_only_the_code_that_is_checked(tmp_path):
    result = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    _report(unseen_code_in_site(tmp_path / "site"), "pages with code no check reads")


def test_every_code_block_a_page_renders_is_one_the_checks_read():
    _report([f for p in docs.pages() for f in unseen_code(p)], "pages with code no check reads")


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    """A copy of the site with a link to a page that does not exist does not build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", symlinks=True)
    results = tmp_path / "docs" / "results"
    if results.is_symlink():
        results.unlink()
        results.symlink_to(ROOT / "bench" / "results")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # The one warning is that link's: the copy builds as the site does, but for it.
    warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, output
    assert "getting-started.md" in warnings[0], output
    assert "no-such-page.md" in warnings[0], output


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    found = docs.all_blocks()
    assert len(found) >= 10, "the pages' blocks were not found"
    return found


def test_every_block_is_run_or_checked(blocks):
    _report(unaccounted(blocks, run_calls()), "blocks neither run by a test nor checked")


def test_python_blocks_compile_and_type_check(blocks, tmp_path):
    assert any(b.lang == "python" for b in blocks)
    _report(check_python(python_blocks(blocks), tmp_path), "errors in python blocks")


def test_command_blocks_name_commands_that_parse(blocks):
    assert any(b.lang in COMMAND_KINDS for b in blocks)
    _report(check_commands(blocks), "commands that do not parse")


def test_json_blocks_fit_their_models(blocks):
    _report(check_json(blocks), "json blocks that do not fit")


def _pytest_knows(config: pytest.Config) -> Callable[[str], bool]:
    def knows(name: str) -> bool:
        try:
            config.getini(name)
        except ValueError:  # pytest's "unknown configuration value"
            return False
        return True

    return knows


def test_toml_blocks_load(blocks, pytestconfig):
    _report(check_toml(blocks, known_ini=_pytest_knows(pytestconfig)), "toml blocks that fail")


def test_js_blocks_parse(blocks, tmp_path):
    _report(check_js(blocks, tmp_path), "js blocks that do not parse")


# --------------------------------------------------------------------------------------------
# Each checker fails when it should, at the right page:line


def _page(text: str, name: str = "docs/checked.md") -> list[Block]:
    """The blocks of a page that is not there, written here."""
    return docs.blocks_of(ROOT / name, text)


def _fence(lang: str, body: str, above: str = "") -> str:
    return (f"{above}\n" if above else "") + f"```{lang}\n{body}\n```\n"


def test_the_python_check_reports_a_type_error_at_its_line(tmp_path):
    page = "Intro.\n\n" + _fence("python", "import os\n\nx: int = 'a'\nprint(os.sep, x)")
    failures = check_python(_page(page), tmp_path)
    assert len(failures) == 1, failures
    assert failures[0].startswith("docs/checked.md:6: pyright:"), failures
    assert "int" in failures[0]


def test_the_python_check_resolves_blocks_importing_each_other_and_reports_syntax(tmp_path):
    page = (
        _fence("python", "# mypkg/things.py\nVALUE: int = 1")
        + _fence("python", "# main.py\nfrom mypkg.things import VALUE\n\nname: str = VALUE")
        + _fence("python", "def f(:\n    pass")
    )
    failures = check_python(_page(page), tmp_path)
    assert len(failures) == 2, failures  # the import resolved: VALUE is an int
    assert failures[0].startswith("docs/checked.md:12: does not compile"), failures
    assert failures[1].startswith('docs/checked.md:9: pyright: Type "int" is not'), failures


@pytest.mark.parametrize(
    ("body", "line", "expected"),
    [
        ("agentctl pending\nagentctl frobnicate CHAT_ID", 3, "No such command 'frobnicate'"),
        ("agentctl approve order-42", 2, "Missing argument 'REF'"),
        (
            "temporal workflow signal --workflow-id x \\\n  --no-such-flag",
            2,
            "has no flag --no-such-flag",
        ),
        ("temporal workflow frob -w x", 2, "temporal workflow has no command 'frob'"),
        (
            "temporal workflow signal -w x --name resume --input '{\"respnd\": []}'",
            2,
            "the 'resume' payload does not fit ResumeInput: respnd: Extra inputs",
        ),
        (
            'temporal workflow update execute -w x --type send -i \'{"txt": "hi"}\'',
            2,
            "the 'send' payload does not fit SendInput: text: Field required",
        ),
        ("agent-worker --agents m --no-such-option", 2, "unrecognized arguments"),
        ("agent-codec-server --port nope", 2, "invalid"),
        ("echo y | make nosuchtarget", 2, "the Makefile has no target nosuchtarget"),
        ("python -m no_such_module_here", 2, "no module 'no_such_module_here'"),
        ("node missing.mjs", 2, "missing.mjs is neither"),
        ("X=1 rm -rf /   # not a program the docs may name", 2, "'rm' is not a program"),
        ("curl -s 'localhost:1/x' -d '{\n  \"a\": 1}'\nfrob", 4, "'frob' is not a program"),
        ("since=$(whatever -1 hour)", 2, "'whatever' is not a program"),
        ("echo 'unclosed", 2, "does not parse"),
    ],
)
def test_the_command_check_reports_what_does_not_parse(body, line, expected):
    failures = check_commands(_page(_fence("bash", body)))
    assert len(failures) == 1, failures
    assert failures[0].startswith(f"docs/checked.md:{line}: "), failures
    assert expected in failures[0], failures


def test_the_command_check_accepts_what_the_programs_accept():
    body = (
        "make run   # terminal 1\n"
        "AGENT_TASK_QUEUE=q agent-worker --agents mypackage.agents --web 127.0.0.1:8234\n"
        "agentctl respond CHAT_ID REF '{\"a\": 1}' --identity '#alice'   # a # in quotes\n"
        "agentctl --namespace x restart CHAT_ID REF --metadata '{}' && agentctl show CHAT_ID\n"
        "temporal workflow signal -w order-42 --name resume \\\n"
        "  --input '{\"respond\": []}' -o json --address=localhost:7233\n"
        "temporal workflow update execute --workflow-id x --type resume -i '{}'\n"
        "temporal workflow signal -w x --name resume --input "
        '\'{"respond": [{"name": "t", "ref": "REF", "output": {}}], "identity": "a"}\'\n'
        "export AGENT_PAYLOAD_KEYS='k1:...'\n"
        ".venv/bin/python -m temporal_agent_interrupts.worker --help\n"
        "python main.py 2>&1 > /dev/null && node client.mjs\n"
    )
    blocks = _page(
        _fence("bash", body)
        + _fence("python", "# main.py\nprint(1)")
        + _fence("js", "// client.mjs: node client.mjs")
    )
    assert check_commands(blocks) == []


def test_a_console_block_runs_only_its_dollar_lines():
    body = "$ agentctl pending\nPaused: agentctl frobnicate\n$ agentctl frobnicate\nmore output"
    failures = check_commands(_page(_fence("console", body)))
    assert len(failures) == 1, failures
    assert failures[0].startswith("docs/checked.md:4: agentctl frobnicate:"), failures
    transcript = check_commands(_page(_fence("console", "you> hello\nagent> hi")))
    assert len(transcript) == 1
    assert "make it ```text with <!-- output -->" in transcript[0]


def test_the_json_check_reports_a_misfit_and_a_missing_model():
    model = "<!-- model: temporal_agent_interrupts.workflows.types.ResumeInput -->"
    shown = "<!-- model: temporal_agent_interrupts.client.views.ShowOutput -->"
    page = (
        _fence("json", '{"respond": [], "identity": "a"}', model)  # fits
        + _fence("json", '{"respond": [{"name": "x"}]}', model)  # no ref, no output
        + _fence("json", '{"respnd": []}', model)  # extra="forbid"
        + _fence("json", '{"identity": "a"}')  # no model named
        + _fence(
            "json", '{"chat_id": "c", "agent": "a", "status": "idle", "turns": 0, "x": 1}', shown
        )  # a key the model ignores
        + _fence("json", '{"a": 1, "a": 2}', model)
    )
    failures = check_json(_page(page))
    wheres = [f.split(": ", 1)[0] for f in failures]
    assert wheres == [
        "docs/checked.md:7",
        "docs/checked.md:11",
        "docs/checked.md:14",
        "docs/checked.md:18",
        "docs/checked.md:22",
    ], failures
    assert "respond.0.ref" in failures[0]
    assert "respnd" in failures[1]
    assert "<!-- model:" in failures[2]
    assert "$.x (ShowOutput has no such field)" in failures[3]
    assert "duplicate keys" in failures[4]


def test_the_toml_check_loads_profiles_and_pyproject_fragments(pytestconfig):
    page = (
        _fence("toml", '[profile.prod]\naddress = "h:7233"\nnamespace = "n"')
        + _fence("toml", '[profile.prod]\nadress = "h:7233"')
        + _fence("toml", '[tool.pytest.ini_options]\nasyncio_mode = "auto"\nno_such_ini = 1')
        + _fence("toml", "[tool.x]\na = ")
    )
    failures = check_toml(_page(page), known_ini=_pytest_knows(pytestconfig))
    wheres = [f.split(": ", 1)[0] for f in failures]
    assert wheres == ["docs/checked.md:7", "docs/checked.md:11", "docs/checked.md:17"], failures
    assert "'no_such_ini'" in failures[1]


def test_the_js_check_reports_a_syntax_error(tmp_path):
    page = _fence("js", "// a.mjs\nconst x = await f(;\n") + _fence("js", "import x from 'y';")
    failures = check_js(_page(page), tmp_path)
    assert len(failures) == 1, failures
    assert failures[0].startswith("docs/checked.md:3: node --check"), failures


def test_an_unlabeled_block_or_an_unknown_kind_is_unaccounted():
    page = (
        _fence("", "some text")
        + _fence("yaml", "a: 1")
        + _fence("yaml", "b: 2")
        + _fence("text", "output", "<!-- output -->")
        + _fence("text", "not said to be output")
        + _fence("python", "print(1)")
    )
    calls = [
        RunCall(where="tests/test_x.py:1", first="b: 2", lang="yaml"),
        RunCall(where="tests/test_x.py:2", first="gone", lang="python"),
    ]
    failures = unaccounted(_page(page), calls)
    wheres = [f.split(": ", 1)[0] for f in failures]
    assert wheres == [
        "docs/checked.md:2",
        "docs/checked.md:5",
        "docs/checked.md:15",
        "tests/test_x.py:2",
    ], failures
    assert "unlabeled" in failures[0]
    assert "```yaml" in failures[1]
    assert "<!-- output -->" in failures[2]
    assert "names a block no page has" in failures[3]


def test_the_run_calls_are_found_in_the_tests_source(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_text(
        "from tests import docs\nfrom tests.docs import block\n"
        'a = block("# one"\n          " line", lang="python")\n'
        'b = docs.block("make run", lang="bash")\n'
        "c = block(variable, lang='python')\n"
        "d = other.block('x', lang='python')\n"
    )
    found = {(c.first, c.lang) for c in run_calls(tmp_path)}
    assert found == {("# one line", "python"), ("make run", "bash")}


def test_a_run_block_whose_first_line_no_page_has_fails(monkeypatch):
    monkeypatch.setattr(docs, "all_blocks", lambda: _page(_fence("python", "# here\nx = 1")))
    here, missing = "# here", "# a first line no page has"  # not literals: no test runs them
    assert docs.block(here, lang="python") == "# here\nx = 1\n"
    with pytest.raises(AssertionError, match="no page has a ```python block starting"):
        docs.block(missing, lang="python")

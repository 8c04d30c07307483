"""The public API is stated, whole, in one place: the package root's names and each namespace's
``__all__`` are the lists below, and docs/reference/api.md documents exactly those, each at the
path it is imported by. Adding, removing or moving a public name means changing this file, the
namespace and the reference together (and, within 0.1.x, CHANGELOG.md's promise allows no
removal).

- the names that left the root resolve there until 0.2, with a warning that names their home;
- every other module of the package says in its docstring that it is internal;
- the root and the namespaces import nothing heavy until a name is read (the workflow sandbox
  imports the root for every conversation);
- the examples use no deprecated path.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import temporal_agent_interrupts

ROOT = Path(__file__).parent.parent
PACKAGE = "temporal_agent_interrupts"
FOLDERS = ("workflows", "activities", "worker", "client")

ROOT_NAMES = {
    # Authoring.
    "Agent",
    "ToolApproval",
    "TrustedIssuer",
    "tool",
    "interrupt",
    "Interrupt",
    "ToolContext",
    "ToolError",
    "agent_tool",
    # Hosting.
    "AgentsPlugin",
    # Calling.
    "AgentClient",
    "Chat",
    "FinishReason",
    "approve",
    "deny",
    "respond",
    "run_script",
    "AgentError",
}

NAMESPACES = {
    "errors": {
        "AgentError",
        "CancelRejected",
        "ChatNotFound",
        "ConnectionConfigError",
        "EventsGone",
        "GrantRejected",
        "NoWorkerAnswered",
        "PayloadKeyMissing",
        "PayloadKeysError",
        "ResumeRejected",
        "SendRejected",
        "ServerNotAnswering",
        "UnknownAgent",
    },
    "types": {
        "TurnResult",
        "ErrorInfo",
        "InterruptRequest",
        "Vote",
        "Requester",
        "Shown",
        "ShownField",
        "ToolResponse",
        "ToolRestart",
        "GrantScope",
        "GrantCondition",
        "Grant",
        "TurnStream",
        "TurnEvent",
        "TurnAnswer",
        "StatusResult",
        "HistoryResult",
        "PendingResult",
        "RejectionsResult",
        "ConversationResult",
        "Message",
        "Part",
        "Rejection",
        "AnswerRecord",
        "AuditReport",
        "UntrustedRun",
        "Receipt",
        "ReceiptBody",
        "ReceiptChain",
        "verify_chain",
        "ChainCheck",
        "PausedChat",
        "PausedInterrupt",
        "InboxPage",
        "Tool",
        "Status",
        "TOOL_APPROVED",
        "APPROVED",
        "FEEDBACK",
        "TIMED_OUT",
    },
    "policies": {"Remind", "Escalate", "Notice", "Policy", "Present", "Show"},
    "mcp": {"mcp_tools", "MCPServerStdio", "MCPServerHTTP", "MCPToolset"},
    "web": {
        "agents_app",
        "agents_mcp_app",
        "serve",
        "Access",
        "Authorize",
        "Forbidden",
        "IdentityFunction",
        "LoginExchange",
        "Login",
        "LoginHook",
        "jwt_login",
        "SlackInteractivity",
    },
    "payloads": {
        "data_converter",
        "PayloadKeys",
        "load_keys",
        "generate_key",
        "EncryptionCodec",
        "CodecServer",
        "codec_app",
    },
    "hosting": {
        "build_worker",
        "DEFAULT_MAX_CACHED_WORKFLOWS",
        "connect_config",
        "DEFAULT_TASK_QUEUE",
        "metrics_runtime",
        "setup_search_attributes",
        "MissingSearchAttributes",
        "Channel",
        "NotifyInput",
        "EmailChannel",
        "SlackChannel",
        "SlackDirectory",
    },
    "testing": {
        "BASE_URL",
        "Reply",
        "Request",
        "ScriptedModel",
        "TokenIssuer",
        "call_every_tool",
        "calls",
        "dev_server",
        "error",
        "hosted",
        "offline",
        "text",
        "tool_runs",
    },
}

# The names the root exported before 0.1.0's stated surface, and where each went.
MOVED = {
    "Remind": "policies",
    "Escalate": "policies",
    "mcp_tools": "mcp",
    "MCPServerStdio": "mcp",
    "MCPServerHTTP": "mcp",
    **{
        name: "errors"
        for name in (
            "CancelRejected",
            "ChatNotFound",
            "ConnectionConfigError",
            "EventsGone",
            "NoWorkerAnswered",
            "ResumeRejected",
            "SendRejected",
            "ServerNotAnswering",
            "UnknownAgent",
        )
    },
}

INTERNAL = "Internal: not covered by the 0.1.x stability promise"


def namespace(name: str):
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_the_root_exports_the_first_hours_names():
    assert set(temporal_agent_interrupts.__all__) == ROOT_NAMES
    assert len(temporal_agent_interrupts.__all__) == len(ROOT_NAMES)  # no name twice
    for name in ROOT_NAMES:
        assert getattr(temporal_agent_interrupts, name) is not None
    assert set(dir(temporal_agent_interrupts)) >= ROOT_NAMES


@pytest.mark.parametrize("name", sorted(NAMESPACES))
def test_each_namespace_exports_its_list(name):
    module = namespace(name)
    assert set(module.__all__) == NAMESPACES[name]
    assert len(module.__all__) == len(NAMESPACES[name])
    for export in module.__all__:
        assert getattr(module, export) is not None, f"{name}.{export}"
    assert set(dir(module)) >= NAMESPACES[name]
    with pytest.raises(AttributeError, match="no attribute"):
        getattr(module, "no_such_name")  # noqa: B009 (a name no namespace has, on purpose)


def test_a_name_in_two_places_is_one_object():
    assert namespace("errors").AgentError is temporal_agent_interrupts.AgentError


def expected_directives() -> set[str]:
    """Each public name at the path it is imported by; a namespace's name that is the root's
    own (``errors.AgentError``) is documented once, at the root."""
    found = {f"{PACKAGE}.{n}" for n in ROOT_NAMES}
    for name, exports in NAMESPACES.items():
        found |= {f"{PACKAGE}.{name}.{n}" for n in exports if n not in ROOT_NAMES}
    return found


def test_the_reference_documents_exactly_the_public_api():
    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    listed = re.findall(r"^::: (\S+)$", text, re.M)
    assert len(listed) == len(set(listed)), "api.md documents a name twice"
    expected = expected_directives()
    assert sorted(expected - set(listed)) == [], "api.md lacks public names"
    assert sorted(set(listed) - expected) == [], "api.md documents names that are not public"


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_the_root_warns_with_its_new_path(name):
    home = MOVED[name]
    assert name not in temporal_agent_interrupts.__all__
    assert name not in dir(temporal_agent_interrupts)
    with pytest.warns(DeprecationWarning, match=rf"{PACKAGE}\.{home} import {name}`") as caught:
        value = getattr(temporal_agent_interrupts, name)
    assert value is getattr(namespace(home), name)
    assert "0.2" in str(caught[0].message)
    # The warning points at the code that used the old path, not at the package.
    assert caught[0].filename == __file__


def test_an_old_import_statement_warns_every_time():
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match=re.escape(f"{PACKAGE}.errors")):
            # The old path, on purpose: type checkers no longer know it (the root's imports).
            from temporal_agent_interrupts import (  # noqa: F401 (imported only to warn)
                ChatNotFound,  # pyright: ignore[reportAttributeAccessIssue]
            )


def test_every_moved_name_is_public_in_its_namespace():
    for name, home in MOVED.items():
        assert name in NAMESPACES[home], (name, home)


def modules() -> list[Path]:
    return sorted(
        [
            *(ROOT / PACKAGE).glob("*.py"),
            *(p for d in FOLDERS for p in (ROOT / d).rglob("*.py")),
        ]
    )


def public_modules() -> set[str]:
    return {"__init__", *NAMESPACES}


def test_every_other_module_says_it_is_internal():
    unmarked = []
    for path in modules():
        where = str(path.relative_to(ROOT))
        if path.parent.name == PACKAGE and path.stem in public_modules():
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if INTERNAL not in " ".join(doc.split()):
            unmarked.append(where)
    assert len(modules()) > 80
    assert not unmarked, f"modules whose docstring does not say {INTERNAL!r}: {unmarked}"


def test_an_internal_module_names_the_namespace_its_public_names_come_from():
    # Each namespace's names live in internal modules; each such module points at the namespace.
    for name in ["", *NAMESPACES]:
        module = temporal_agent_interrupts if not name else namespace(name)
        public = f"{PACKAGE}.{name}" if name else PACKAGE
        for home in set(module._HOME.values()):
            path = ROOT / PACKAGE / (home.replace(".", "/") + ".py")
            if not path.exists():
                path = ROOT / PACKAGE / home.replace(".", "/") / "__init__.py"
            if home == "errors":
                continue
            doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
            assert f"``{public}``" in doc, f"{home}'s docstring does not point to {public}"


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_root_and_the_namespaces_import_nothing_until_a_name_is_read():
    # errors is left out: it is an ordinary module (it defines the error types).
    lazy = sorted(set(NAMESPACES) - {"errors"})
    loaded = run_python(
        "import sys\n"
        f"import {PACKAGE}\n"
        f"print(' '.join(sorted(m for m in sys.modules if m.startswith('{PACKAGE}'))))\n"
        + "".join(f"import {PACKAGE}.{name}\n" for name in lazy)
        + f"print(' '.join(sorted(m for m in sys.modules if m.startswith('{PACKAGE}'))))\n"
        "print('google.genai' in sys.modules, 'starlette' in sys.modules, 'mcp' in sys.modules)"
    ).splitlines()
    assert loaded[0].split() == [PACKAGE]
    assert set(loaded[1].split()) == {
        PACKAGE,
        f"{PACKAGE}._lazy",
        *(f"{PACKAGE}.{n}" for n in lazy),
    }
    assert loaded[2] == "False False False"


def test_the_examples_use_no_deprecated_path():
    run_python("import examples.banking, examples.shell, examples.deploy, examples.demo")


def test_the_suite_fails_on_a_deprecated_path():
    # pyproject.toml's filterwarnings makes the package's own deprecations errors in the tests,
    # so no test (nor a docs block a test runs) keeps an old path working by accident.
    with pytest.raises(DeprecationWarning, match=re.escape(f"{PACKAGE}.policies")):
        getattr(temporal_agent_interrupts, "Remind")  # noqa: B009 (the old path, on purpose)

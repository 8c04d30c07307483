"""A review of the docs checker (tests/docs.py, tests/test_docs.py): pages that hold code the
checker neither runs nor really checks, each written here as the smallest page that shows it.
Each test fails while the hole is open.

Nothing here names a real block: the pages are written in the tests, and a test that reads
the tests' ``block(...)`` calls reads source written to a temporary folder.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import httpx2
import pytest
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from temporal_agent_interrupts import AgentClient, FinishReason
from temporal_agent_interrupts.client.web import agents_app
from temporal_agent_interrupts.workflows.types import (
    InterruptRequest,
    StatusResult,
    TurnResult,
    input_digest,
)
from tests import docs
from tests import test_docs as td
from tests.docs import ROOT
from tests.test_readme import ask, newcomers_folder, terminal, their_worker
from tests.test_web_process import shell
from tests.web import served


def _page(text: str, name: str = "docs/checked.md") -> list[docs.Block]:
    return docs.blocks_of(ROOT / name, text)


def _fence(lang: str, body: str, above: str = "") -> str:
    return (f"{above}\n" if above else "") + f"```{lang}\n{body}\n```\n"


TYPE_ERROR = "x: int = 'a'"


# --------------------------------------------------------------------------------------------
# Fences the FENCE regex does not see, though the site renders them as code


@pytest.mark.parametrize(
    "text",
    [
        "Intro.\n\n~~~python\nx: int = 'a'\n~~~\n",
        "Intro.\n\n````python\nx: int = 'a'\n````\n",
        "Intro.\n\n~~~~python\nx: int = 'a'\n~~~~\n",
        "??? note \"details\"\n    ~~~python\n    x: int = 'a'\n    ~~~\n",
    ],
    ids=["tilde", "four-backticks", "four-tildes", "tilde-in-details"],
)
def test_tilde_and_long_fences_are_blocks(text):
    """CommonMark and pymdownx.superfences take ~~~ and fences of 4+ backticks: the site
    shows them as code, so the checker must see them."""
    found = _page(text)
    assert [(b.lang, b.text) for b in found] == [("python", "x: int = 'a'\n")], found


def test_a_long_fence_holds_a_shorter_one():
    """A ````markdown block showing a ``` fence is one block (the inner fence is its text)."""
    text = "````markdown\nSee:\n\n```python\nx = 1\n```\n````\n\n```python\ny = 2\n```\n"
    found = _page(text)
    assert [(b.lang, b.first) for b in found] == [("markdown", "See:"), ("python", "y = 2")]


@pytest.mark.parametrize(
    "text",
    [
        "Intro.\n\n    agentctl frobnicate\n    rm -rf /\n\nMore.\n",
        "<pre><code>rm -rf /</code></pre>\n",
    ],
    ids=["indented-code", "raw-pre"],
)
def test_code_the_site_shows_that_no_fence_holds_is_reported(text):
    """An indented code block (Markdown's own) and raw HTML <pre> render as code, and no
    checker reads them."""
    from tests.test_docs import unseen_code  # the check this review adds

    failures = unseen_code(ROOT / "docs" / "checked.md", text)
    assert len(failures) == 1, failures
    assert failures[0].startswith("docs/checked.md: "), failures


def test_an_included_file_with_code_is_reported(tmp_path):
    """A page that includes another file (pymdownx.snippets, as performance.md includes the
    bench results) shows that file's code blocks; the checker reads only the page."""
    from tests.test_docs import unseen_code

    (tmp_path / "included.md").write_text("Results.\n\n```bash\nrm -rf /\n```\n")
    text = 'Intro.\n\n--8<-- "included.md"\n'
    failures = unseen_code(ROOT / "docs" / "checked.md", text, base_path=tmp_path)
    assert len(failures) == 1, failures


def test_a_docstrings_example_in_the_api_reference_counts_and_its_signature_does_not():
    """mkdocstrings renders each signature as a code block (not the docs' code) and a
    docstring's example as one (code no check reads)."""
    from tests.test_docs import rendered_code_blocks

    signature = '<div class="doc-signature highlight"><pre><span></span><code>f()</code></pre>'
    example = '<div class="highlight"><pre><span></span><code>f(1)</code></pre></div>'
    assert rendered_code_blocks(signature * 3) == 0
    assert rendered_code_blocks(signature + example) == 1


# --------------------------------------------------------------------------------------------
# python blocks pyright does not check


@pytest.mark.parametrize(
    "body",
    [
        f"# type: ignore\n{TYPE_ERROR}",
        f"# pyright: basic, reportAssignmentType=false\n{TYPE_ERROR}",
        f"# .private/agents.py\n{TYPE_ERROR}",
        f"# node_modules/agents.py\n{TYPE_ERROR}",
    ],
    ids=[
        "file-type-ignore",
        "pyright-comment",
        "dot-folder",
        "node_modules",
    ],
)
def test_a_python_block_cannot_opt_out_of_pyright(body, tmp_path):
    """A file-level ``# type: ignore`` or ``# pyright:`` comment, or a path pyright excludes by
    default (``**/.*``, ``**/node_modules``), and nothing in the block was checked."""
    failures = td.check_python(_page(_fence("python", body)), tmp_path)
    assert failures, "the block's type error went unreported"


def test_a_misspelt_root_import_is_a_type_error(tmp_path):
    """The package resolves its root names lazily with a module-level ``__getattr__``, which
    tells pyright that every name exists (as Any): ``from temporal_agent_interrupts import
    Agnet`` type-checked clean in every block, and in every user's code."""
    body = "from temporal_agent_interrupts import Agnet\n\nAgnet('refundAgent')"
    failures = td.check_python(_page(_fence("python", body)), tmp_path)
    assert len(failures) == 1, failures
    assert '"Agnet" is unknown import symbol' in failures[0], failures


def test_python_dash_c_in_a_command_block_is_type_checked(tmp_path):
    """``python -c CODE`` runs CODE; the command check waved any CODE through."""
    from tests.test_docs import python_blocks  # the python blocks, with each -c's code

    page = _page(
        _fence("bash", "python -c 'import temporal_agent_interrupts as t; t.no_such_name()'")
    )
    failures = td.check_python(python_blocks(page), tmp_path)
    assert len(failures) == 1, failures
    assert failures[0].startswith("docs/checked.md:2: pyright:"), failures
    assert "no_such_name" in failures[0]


# --------------------------------------------------------------------------------------------
# bash: commands and settings the command check does not see


@pytest.mark.parametrize(
    "body",
    [
        'echo "$(frobnicate --now)"',
        "echo `frobnicate`",
        'agentctl respond CHAT REF "$(agentctl frobnicate)"',
    ],
    ids=["dollar-paren-in-quotes", "backticks", "nested-agentctl"],
)
def test_a_command_substituted_in_quotes_is_checked(body):
    failures = td.check_commands(_page(_fence("bash", body)))
    assert len(failures) == 1, failures
    assert "frobnicate" in failures[0], failures


@pytest.mark.parametrize(
    "body",
    [
        "TEMPORAL_ADRESS=temporal-frontend.internal:7233",
        "export AGENT_PAYLOD_KEYS='k1:...'",
        "AGENT_TASK_QEUE=refunds agent-worker --agents refunds",
    ],
    ids=["env-file-line", "export", "before-a-command"],
)
def test_a_misspelt_setting_is_reported(body):
    """An env-file block (deploying.md's) is all assignments: no command, so nothing was
    checked, and a misspelt variable is silently ignored by every process."""
    failures = td.check_commands(_page(_fence("bash", body)))
    assert len(failures) == 1, failures
    assert "not a setting" in failures[0], failures


def test_the_settings_the_docs_set_are_accepted():
    body = (
        "TEMPORAL_ADDRESS=h:7233\nTEMPORAL_TLS_CLIENT_CERT_PATH=/x\nexport AGENT_PAYLOAD_KEYS=k\n"
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318\nsince=$(date -u)\nCOMPOSE_PROFILES=x\n"
    )
    assert td.check_commands(_page(_fence("bash", body))) == []


@pytest.mark.parametrize(
    "body",
    [
        'temporal workflow update execute -w x --name close --input \'{"reson": "x"}\'',
        "temporal workflow query -w x --name history --input '{\"ende\": 3}'",
    ],
    ids=["close", "history"],
)
def test_every_handler_payload_is_checked(body):
    failures = td.check_commands(_page(_fence("bash", body)))
    assert len(failures) == 1, failures
    assert "does not fit" in failures[0], failures


# --------------------------------------------------------------------------------------------
# json: a model comment that validates nothing


def test_a_json_model_must_be_the_packages():
    """``<!-- model: pydantic.RootModel -->`` takes any array: a model from outside the package
    says nothing about its wire."""
    above = "<!-- model: pydantic.RootModel -->"
    failures = td.check_json(_page(_fence("json", '["anything", 1]', above)))
    assert len(failures) == 1, failures


# --------------------------------------------------------------------------------------------
# RUN: a block() call that runs nothing


def test_a_block_call_in_a_skipped_test_or_thrown_away_runs_nothing(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import pytest\nfrom tests.docs import block\n\n"
        "@pytest.mark.skip(reason='later')\n"
        "def test_skipped():\n    text = block('a: 1', lang='yaml')\n    assert text\n\n"
        "@pytest.mark.xfail(reason='broken')\n"
        "def test_xfailed():\n    assert block('b: 2', lang='yaml')\n\n"
        "def test_thrown_away():\n    block('c: 3', lang='yaml')\n\n"
        "def test_runs():\n    assert block('d: 4', lang='yaml')\n"
    )
    assert {c.first for c in td.run_calls(tmp_path)} == {"d: 4"}


# --------------------------------------------------------------------------------------------
# agent-worker's working folder


def test_the_working_folder_serves_only_the_modules_named(tmp_path):
    """agent-worker appends its working folder to sys.path: an installed module is not
    shadowed, but a module that is *not* installed is imported from the folder. The HTTP client
    (httpx2) looks for ``h2``, ``socksio`` and ``trio``, Starlette for ``multipart``: a
    ``socksio.py`` left in a shared folder (/tmp) runs inside the worker. Run in a fresh
    interpreter with only the venv's paths, as the console script runs."""
    (tmp_path / "mine.py").write_text(
        "from temporal_agent_interrupts import Agent\nALL_AGENTS = [Agent('mineAgent')]\n"
    )
    (tmp_path / "socksio.py").write_text("raise SystemExit('socksio.py from the folder ran')\n")
    script = (
        "import importlib.util, sys\n"
        "sys.path = [p for p in sys.path if p not in ('', sys.argv[1])]\n"
        "from temporal_agent_interrupts.worker.__main__ import load_agents\n"
        "(agent,) = load_agents(['mine'])\n"
        "assert agent.name == 'mineAgent'\n"
        "spec = importlib.util.find_spec('socksio')\n"
        "print('socksio:', spec.origin if spec else None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("socksio:")]
    origin = line.removeprefix("socksio: ")
    assert not origin.startswith(str(tmp_path)), f"the folder's socksio.py is importable: {line}"


# --------------------------------------------------------------------------------------------
# make docs: offline (this one holds; a guard)


EXTERNAL = re.compile(
    r"""(?:src|href)\s*=\s*["'](?:https?:)?//(?!127\.0\.0\.1|localhost)[^"']+["']"""
    r"""|@import\s+(?:url\()?["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//"""
)


def test_the_built_site_loads_nothing_from_elsewhere(tmp_path):
    """Every page's scripts, styles, fonts and images are the site's own: a link (<a href>)
    may lead elsewhere, nothing a browser fetches by itself may."""
    site = tmp_path / "site"
    result = td._mkdocs_build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr
    fetched = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css"):
            continue
        text = path.read_text()
        if path.suffix == ".html":
            # <a href> is a link the reader follows; <link>, <script>, <img> are fetched.
            text = re.sub(r"<a\s[^>]*>", "", text)
        fetched += [f"{path.relative_to(site)}: {m[0]}" for m in EXTERNAL.finditer(text)]
    assert not fetched, "\n".join(fetched)


# --------------------------------------------------------------------------------------------
# The inbox page: "it lists conversations of every task queue; its answers go to each
# conversation itself, through whichever worker serves it" (docs/operating/index.md)

CAUGHT: list[Any] = []
"""What the impostor's worker was sent (it runs unsandboxed, in this process)."""


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class Impostor:
    """A workflow named like ours on a task queue of its own, polled by a worker of its own:
    what anyone who may poll a queue can run (Temporal Cloud grants polling with namespace
    write access; docs/security.md). It says it is paused on a refund."""

    @workflow.run
    async def run(self, *args: Any) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query(dynamic=True)
    def any_query(self, name: str, args: Sequence[RawValue]) -> Any:
        shown = {"order_id": "A-17", "amount": 25}
        paused = InterruptRequest(
            name="refundOrder", ref="r1", input=shown, source="approval",
            input_digest=input_digest(shown),
        )  # fmt: skip
        return StatusResult(
            chat_id=workflow.info().workflow_id, agent="refundAgent", status="interrupted",
            turns=1, pending=[paused],
        ).model_dump(mode="json")  # fmt: skip

    @workflow.update(dynamic=True)
    async def any_update(self, name: str, args: Sequence[RawValue]) -> Any:
        CAUGHT.append(workflow.payload_converter().from_payload(args[0].payload))
        return TurnResult(turn=1, finish_reason=FinishReason.STOP).model_dump(mode="json")


async def test_the_inbox_never_hands_an_approvers_token_to_a_worker_of_another_queue(client):
    """An approver behind the web app (``identity="bearer"``) approves what the inbox lists.
    A chat on another task queue is listed with nothing to tell it apart (agentctl says "on
    task queue X, not this client's: whatever polls that queue wrote what it says"; the page
    shows no queue), and the answer, with the approver's bearer token as its identity token,
    goes to whatever polls that queue: a fresh token, unspent in every real conversation of
    the same issuer and audience, which its holder can now answer as the approver."""
    CAUGHT.clear()
    ours, theirs = f"agents-{uuid.uuid4()}", f"evil-{uuid.uuid4()}"
    chat_id = f"refund-{uuid.uuid4().hex[:8]}"
    token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbm5AZXhhbXBsZS5jb20ifQ.c2ln"
    app = agents_app(AgentClient(client, task_queue=ours), identity="bearer")
    async with Worker(
        client,
        task_queue=theirs,
        workflows=[Impostor],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        await client.start_workflow("AgentWorkflow", {"agent": "refundAgent"}, id=chat_id,
                                    task_queue=theirs)  # fmt: skip
        async with served(app) as base, httpx2.AsyncClient() as http:
            answered = await http.post(
                f"{base}/api/chats/{chat_id}/interrupts/r1",
                headers={"authorization": f"Bearer {token}"},
                json={"action": "approve", "input_digest": input_digest({"order_id": "A-17",
                                                                          "amount": 25})},
            )  # fmt: skip
    sent = [c.get("identity_token") for c in CAUGHT if isinstance(c, dict)]
    assert token not in sent, (
        f"the approver's token went to the worker of {theirs!r} ({answered.status_code})"
    )


# --------------------------------------------------------------------------------------------
# The docs' figures: the data-protection page quotes the bench results it links


def test_the_encryption_cost_is_read_from_the_latest_bench_not_copied():
    """docs/data-protection.md once quoted B1's encryption ratio from one run, which the next
    bench made wrong; it now sends the reader to the Performance page, which includes the
    latest results file whole. No ratio may be copied onto the page again."""
    text = (ROOT / "docs" / "data-protection.md").read_text()
    section = text.split("## What it costs", 1)[1]
    assert not re.search(r"\d\.\d\d\u00d7", section), "a copied ratio: link the results"
    assert "(performance.md#the-latest-figures)" in section


# --------------------------------------------------------------------------------------------
# The README's newcomer: agentctl on their agent's own task queue


async def test_the_audit_command_show_offers_lists_the_readmes_answer(env, tmp_path):
    """The README's refund, answered by its script; ``agentctl show refund-1`` ends with
    "Every answer on record: agentctl audit refund-1", which, run in the same terminal, must
    list that answer. (The refund runs on the task queue ``refunds``; agentctl's is
    ``agents``, and audit leaves out a run on another queue: "No answers on record".)"""
    queue, chat_id = f"refunds-{uuid.uuid4()}", f"refund-{uuid.uuid4().hex[:8]}"
    folder = newcomers_folder(tmp_path, queue=queue, chat_id=chat_id)
    worker = await their_worker(env, folder, queue)
    try:
        ref, _ = await ask(env, folder)
        # This checkout's agentctl (a worktree sharing a clone's venv has the clone's installed).
        environ = {**terminal(env, folder), "PYTHONPATH": str(ROOT)}
        answer = (
            f"temporal workflow update execute --workflow-id {chat_id} --name resume --input "
            f"""'{{"restart": [{{"name": "refundOrder", "ref": "{ref}", """
            """"resumed_metadata": {"tool_approved": true}}], "identity": "you@example.com"}'"""
        )
        await shell(answer, cwd=folder, env=environ)
        shown = await shell(f"agentctl show {chat_id}", cwd=folder, env=environ)
        (offered,) = [ln for ln in shown.splitlines() if ln.startswith("Every answer on record:")]
        commands = re.findall(r"agentctl (?:--task-queue \S+ )?audit \S+", offered)
        assert commands, offered
        audit = await shell(commands[0], cwd=folder, env=environ)
        assert "you@example.com" in audit, audit
    finally:
        await worker.stop()

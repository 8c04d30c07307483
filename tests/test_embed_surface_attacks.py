"""Attacks on the embedding surface: the plugin's start-up check, ``Forbidden`` reasons, the
details panel's command, the public names.

Each test here failed before its fix (see the commit that added it).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from temporal_agent_interrupts import AgentsPlugin
from temporal_agent_interrupts.worker.search_attributes import (
    MissingSearchAttributes,
    setup_search_attributes,
)
from temporal_agent_interrupts.worker.testing import ScriptedModel
from tests import agents as test_agents
from tests.helpers import create_namespace
from tests.team_workflow import GreetingWorkflow, shout


async def test_a_refused_worker_takes_no_task_off_the_queue(client):
    """A worker the check refuses never polls: the tasks waiting on its queue (the team's own
    workflows, which other workers serve) are not handed to it, to time out there."""
    namespace = f"fintech-{uuid.uuid4().hex[:8]}"
    await create_namespace(client, namespace)
    plain = Client(**{**client.config(), "namespace": namespace})
    config = plain.config()
    config["plugins"] = [
        AgentsPlugin(agents=[test_agents.ops_agent()], gemini=ScriptedModel().client())
    ]
    theirs = Client(**config)
    queue = f"team-{uuid.uuid4()}"
    waiting = [
        await plain.start_workflow(
            GreetingWorkflow.run, "ada", id=f"greet-{uuid.uuid4()}", task_queue=queue
        )
        for _ in range(20)
    ]
    await asyncio.sleep(1)  # the tasks reach the queue's backlog
    for _ in range(40):
        with pytest.raises(MissingSearchAttributes):
            await Worker(
                theirs, task_queue=queue, workflows=[GreetingWorkflow], activities=[shout]
            ).run()
    for handle in waiting:
        kinds = [e.event_type async for e in handle.fetch_history_events()]
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED not in kinds, handle.id
    # Fixed, a worker on the same queue starts in the same process (the refused ones let go of
    # the queue) and serves every waiting workflow.
    await setup_search_attributes(theirs)
    async with Worker(theirs, task_queue=queue, workflows=[GreetingWorkflow], activities=[shout]):
        assert [await h.result() for h in waiting] == ["ADA!"] * len(waiting)


async def test_an_authorize_that_returns_forbidden_instead_of_raising_it_refuses(client):
    """``return Forbidden(reason)`` for ``raise Forbidden(reason)`` is an easy slip, and an
    exception is truthy: the app let the request through. It refuses, with the reason, sync or
    async, and where the app only filters (the inbox's chats) it counts as no."""
    from typing import Any

    import httpx2

    from temporal_agent_interrupts import AgentClient
    from temporal_agent_interrupts.client.web import Access, Forbidden, agents_app
    from tests.web import served

    def rule(request: Any, access: Access) -> Any:
        return Forbidden("payments approvers only")

    async def async_rule(request: Any, access: Access) -> Any:
        return Forbidden("payments approvers only")

    for authorize in (rule, async_rule):
        app = agents_app(
            AgentClient(client), identity=lambda r: r.headers.get("x-user"), authorize=authorize
        )
        async with served(app) as base, httpx2.AsyncClient(timeout=60) as http:
            r = await http.get(f"{base}/api/inbox", headers={"X-User": "eve"})
            assert r.status_code == 403, r.text
            assert r.json()["detail"] == "not allowed to inbox: payments approvers only"
            r = await http.get(f"{base}/api/chats/c-1/pending", headers={"X-User": "eve"})
            assert r.status_code == 403, r.text


def test_an_old_import_statement_warns_once_per_statement_at_its_line():
    """``from temporal_agent_interrupts import Remind`` looked the name up twice (the import
    system's check for a submodule of that name, then the import itself), and warned twice."""
    import sys
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        from temporal_agent_interrupts import Remind  # noqa: F401  # pyright: ignore
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert [(w.filename, w.lineno) for w in moved] == [(__file__, line)]
    assert "temporal_agent_interrupts.policies import Remind" in str(moved[0].message)


def test_the_refusal_and_the_docs_name_the_public_paths():
    """The refusal's Python fix, and the docs', are imported from the public namespaces
    (``hosting``, ``web``), not from the internal modules the 0.1.x promise leaves out."""
    import importlib
    import re
    from pathlib import Path
    from types import SimpleNamespace

    from temporal_agent_interrupts.search_attributes import fix_message

    fake = SimpleNamespace(
        namespace="fintech",
        service_client=SimpleNamespace(config=SimpleNamespace(target_host="localhost:7233")),
    )
    message = fix_message(fake, ["AgentName"])  # type: ignore[arg-type]
    (path,) = re.findall(r"await ([\w.]+)\.setup_search_attributes\(client\)", message)
    assert path == "temporal_agent_interrupts.hosting"
    assert hasattr(importlib.import_module(path), "setup_search_attributes")
    docs = Path(__file__).parent.parent / "docs"
    for page in docs.rglob("*.md"):
        text = page.read_text()
        assert "temporal_agent_interrupts.worker.setup_search_attributes" not in text, page
        assert "Forbidden(" not in text or "`temporal_agent_interrupts.client.web`" not in text, (
            page
        )


async def test_the_sdk_members_a_refused_worker_is_stopped_by_are_still_there(client):
    """``worker/plugin.py``'s ``_never_started`` reads four private members of the SDK's
    ``Worker`` (no public call marks a worker done that never ran): if an SDK release renames
    one, the refusal falls back to a run told to stop, which polls. This says so by name."""
    worker = Worker(client, task_queue=f"q-{uuid.uuid4()}", workflows=[GreetingWorkflow])
    assert isinstance(worker._shutdown_complete_event, asyncio.Event)
    bridge = worker._bridge_worker
    assert callable(bridge.initiate_shutdown) and callable(bridge.finalize_shutdown)
    workflows = worker._workflow_worker
    assert workflows is not None and callable(workflows.drain_poll_queue)

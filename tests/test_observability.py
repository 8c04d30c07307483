"""Traces and the product's metrics: what a conversation tells operators, and what it never does.

- Tracing (``OTEL_EXPORTER_OTLP_ENDPOINT``): the contrib's ``TracingInterceptor`` on the client and
  the worker, the product's spans for turns, interrupts, model calls and tools. One conversation
  is one trace from the client's first call through the workflow to the activities; its spans
  name the agent, the chat, the tool and the ref, and no payload appears anywhere in them.
- Metrics: the worker's Prometheus endpoint serves interrupts raised, answered (by decision),
  expired and refused, and the time a human took, labelled by agent and tool.
- Neither adds a workflow command: the recorded histories replay with tracing on, and a traced
  conversation replays with it on or off.

Everything runs against the session's dev server; the only other sockets are on loopback (the
metrics endpoint).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from temporal_agent_interrupts import FinishReason, interrupt
from temporal_agent_interrupts.errors import ResumeRejected, UnknownAgent
from temporal_agent_interrupts.tracing import (
    TRACING_SWITCH,
    SanitizingSpanExporter,
    add_tracing,
    flush_tracing,
    install_tracing,
    span_name,
    tracing_interceptors,
)
from temporal_agent_interrupts.worker import sandbox_runner
from temporal_agent_interrupts.worker.result_keys import ResultKeysInterceptor, resolve_result_keys
from temporal_agent_interrupts.worker.standin import calls, text
from temporal_agent_interrupts.worker.testing import ScriptedModel, hosted
from temporal_agent_interrupts.workflows import Agent, AgentWorkflow, ToolApproval
from temporal_agent_interrupts.workflows.payloads import raw_start
from temporal_agent_interrupts.workflows.state import (
    ConversationInput,
)
from temporal_agent_interrupts.workflows.telemetry import (
    INTERRUPT_WAIT,
    INTERRUPT_WAIT_BUCKETS,
    INTERRUPTS_ANSWERED,
    INTERRUPTS_EXPIRED,
    INTERRUPTS_RAISED,
    REJECTIONS,
    SPAN_ANSWERED,
    SPAN_MODEL_CALL,
    SPAN_RAISED,
    SPAN_TOOL_CALL,
    SPAN_TURN_END,
    SPAN_TURN_START,
    TOOL_CALLS,
    UNKNOWN_AGENT,
)
from temporal_agent_interrupts.workflows.types import (
    ToolResponse,
)
from tests import agents as t
from tests.helpers import (
    assert_no_workflow_task_failed,
    cli_signal,
    eventually,
    metric_values,
    server_address,
)
from tests.histories import load

HISTORIES = Path(__file__).parent / "histories"
ROOT = Path(__file__).parent.parent

# Payloads with a face: none of these may appear in any span.
SECRET_MESSAGE = "zebra-message-7f3a please move the funds"
SECRET_QUESTION = "zebra-question-91c0 wire 9,999 to account 12-34"
SECRET_KEY = "zebra-key-55d1"
SECRET_ANSWER = "zebra-answer-0b6e signed off by the CFO"
SECRET_TEXT = "zebra-text-c44f all done"
SECRET_IDENTITY = "zebra-person@example.com"
SECRETS = (SECRET_MESSAGE, SECRET_QUESTION, SECRET_KEY, SECRET_ANSWER, SECRET_TEXT)
# What exception messages quote: a failing tool's input, and a refused answer's identity and
# the approvers it named.
SECRET_TOOL_INPUT = "zebra-tool-input-2e8b"
SECRET_INTRUDER = "zebra-mallory@example.com"
SECRET_APPROVER = "zebra-treasurer@example.com"


# ----------------------------------------------------------------------------------------------
# Tracing


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span this process makes from here on, as exported: kept in memory.

    OpenTelemetry takes one global tracer provider per process: ``install_tracing`` installs
    the one production does (or adds this exporter to it), so the spans read here went through
    the same batching and the same sanitising exporter as those sent over OTLP. The exporter
    stops keeping spans when the module is done.
    """
    exporter = InMemorySpanExporter()
    assert install_tracing(service_name="agent-tests", exporter=exporter)
    yield exporter
    exporter.shutdown()


def exported(spans: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    """What has been exported so far, the batches still pending sent first."""
    flush_tracing()
    return spans.get_finished_spans()


def traced(client: Client) -> Client:
    """The same connection, with the tracing interceptor (a worker built on it gets it too)."""
    config = client.config()
    config["interceptors"] = [TracingInterceptor()]
    return Client(**config)


def of_chat(finished: tuple[ReadableSpan, ...], chat_id: str) -> list[ReadableSpan]:
    """The spans that name the chat: Temporal's ``temporalWorkflowID`` or our ``agent.chat_id``."""
    return [
        s
        for s in finished
        if (s.attributes or {}).get("temporalWorkflowID") == chat_id
        or (s.attributes or {}).get("agent.chat_id") == chat_id
    ]


def named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def ctx(span: ReadableSpan) -> trace.SpanContext:
    assert span.context is not None
    return span.context


async def test_one_conversation_is_one_trace_with_names_and_refs_and_no_payloads(
    spans, client, model
):
    agent = Agent(
        f"traced-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve, t.lookup]
    )
    model.reply(
        calls(
            ("approve", {"question": SECRET_QUESTION}, "r-ask"),
            ("lookup", {"key": SECRET_KEY}, "r-look"),
        ),
        text(SECRET_TEXT),
    )
    tracing = traced(client)
    # No cache: every workflow task replays the run so far, so a span made on replay would show
    # up twice below.
    async with hosted(tracing, agents=[agent], model=model, max_cached_workflows=0) as agents:
        chat = await agents.chat(agent.name)
        paused = await chat.send(SECRET_MESSAGE)
        (ask,) = paused.interrupts
        done = await chat.resume(
            respond=[ask.respond({"approved": True, "note": SECRET_ANSWER})],
            identity=SECRET_IDENTITY,
        )
    assert done.finish_reason == FinishReason.STOP and done.text == SECRET_TEXT
    mine = of_chat(exported(spans), chat.id)

    # One trace: the client's first call, the workflow, its activities and the product's spans.
    (start,) = named(mine, "StartUpdateWithStartWorkflow:AgentWorkflow")
    assert start.kind == trace.SpanKind.CLIENT
    trace_id = ctx(start).trace_id
    run = named(mine, "RunWorkflow:AgentWorkflow")
    assert run and all(ctx(s).trace_id == trace_id for s in run)
    for name in (
        "RunActivity:agent_interrupts.model_call",
        "RunActivity:agent_interrupts.tool_call",
        SPAN_MODEL_CALL,
        SPAN_TOOL_CALL,
        SPAN_TURN_START,
        SPAN_RAISED,
        SPAN_ANSWERED,
        SPAN_TURN_END,
        "HandleUpdate:resume",
    ):
        found = named(mine, name)
        assert found, f"no {name} span"
        assert all(ctx(s).trace_id == trace_id for s in found), name
    # The activities' product spans are children of the contrib's RunActivity spans.
    (tool_span,) = named(mine, SPAN_TOOL_CALL)
    (run_tool,) = named(mine, "RunActivity:agent_interrupts.tool_call")
    assert tool_span.parent is not None and tool_span.parent.span_id == ctx(run_tool).span_id
    # The resume came in a trace of its own (a later call from anywhere): the workflow's
    # handling of it is in the conversation's trace, linked to the caller's.
    (resume_call,) = [
        s
        for s in exported(spans)
        if s.name == "StartWorkflowUpdate:resume"
        and (s.attributes or {}).get("temporalWorkflowID") == chat.id
    ]
    (handled,) = named(mine, "HandleUpdate:resume")
    assert [link.context.span_id for link in handled.links] == [ctx(resume_call).span_id]

    # Each product span once, though every task replayed the run (spans are made live only).
    assert len(named(mine, SPAN_TURN_START)) == 1
    assert len(named(mine, SPAN_MODEL_CALL)) == 2
    assert len(named(mine, SPAN_TURN_END)) == 2  # the pause, then the end

    def attrs(name: str) -> dict[str, object]:
        (only,) = named(mine, name)
        return dict(only.attributes or {})

    common = {"agent.name": agent.name, "agent.chat_id": chat.id}
    assert (
        attrs(SPAN_RAISED).items()
        >= {
            **common,
            "agent.tool": "approve",
            "agent.ref": "r-ask",
            "agent.source": "interrupt",
            "agent.turn": 1,
        }.items()
    )
    answered = attrs(SPAN_ANSWERED)
    assert (
        answered.items()
        >= {
            **common,
            "agent.tool": "approve",
            "agent.ref": "r-ask",
            "agent.kind": "respond",
            "agent.decision": "approved",
            "agent.via": "update",
        }.items()
    )
    waited = answered["agent.waited_seconds"]
    assert isinstance(waited, float) and waited >= 0
    assert (
        attrs(SPAN_TOOL_CALL).items()
        >= {
            **common,
            "agent.tool": "lookup",
            "agent.ref": "r-look",
            "agent.outcome": "output",
            "agent.resumed": False,
        }.items()
    )
    for model_call in named(mine, SPAN_MODEL_CALL):
        assert (
            dict(model_call.attributes or {}).items()
            >= {
                **common,
                "agent.model": "gemini-test",
            }.items()
        )
    ends = [dict(s.attributes or {}) for s in named(mine, SPAN_TURN_END)]
    assert [e["agent.finish_reason"] for e in ends] == ["interrupted", "stop"]

    # No payload anywhere: names, attributes, events, links, status and resource, as exported.
    everything = "\n".join(s.to_json() for s in exported(spans))
    for secret in (*SECRETS, SECRET_IDENTITY):
        assert secret not in everything, f"{secret!r} is in a span"
    await assert_no_workflow_task_failed(client, chat.id)

    # Replay makes no spans and needs no interceptor: the history replays with tracing on (the
    # spans stay as they were) and off.
    hist = await client.get_workflow_handle(chat.id).fetch_history()
    before = len(exported(spans))
    for interceptors in ([TracingInterceptor()], []):
        replayer = Replayer(
            workflows=[AgentWorkflow],
            data_converter=client.data_converter,
            workflow_runner=sandbox_runner(),
            interceptors=[*interceptors, ResultKeysInterceptor(resolve_result_keys())],
        )
        result = await replayer.replay_workflow(hist, raise_on_replay_failure=True)
        assert result.replay_failure is None
    assert len(exported(spans)) == before


sign_off = interrupt(
    "signOff",
    "Ask the treasurer to sign off.",
    input=t.Ask,
    output=t.Answer,
    approvers=[SECRET_APPROVER],
)


async def test_exceptions_reach_spans_by_their_type_alone(spans, client, model):
    """The SDK and the contrib write an exception's message into the span's status and its
    message and stack trace into an ``exception`` event: a tool's error quoting its input, a
    refused resume naming who tried and who may. What is exported keeps the exception's type."""
    agent = Agent(
        f"traced-errors-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.boom, sign_off]
    )
    model.reply(
        # boom raises RuntimeError(f"database password is hunter2 ({key})"), retried 3 times.
        calls(("boom", {"key": SECRET_TOOL_INPUT}, "b1")),
        calls(("signOff", {"question": "pay?"}, "s1")),
        text("paid"),
    )
    async with hosted(traced(client), agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        failed = await chat.send("try the tool")
        assert failed.finish_reason == FinishReason.FAILED
        (ask,) = (await chat.send("then ask")).interrupts
        with pytest.raises(ResumeRejected, match=re.escape(SECRET_INTRUDER)):
            await chat.resume(answers=[ask.approve()], identity=SECRET_INTRUDER)
        done = await chat.resume(answers=[ask.approve()], identity=SECRET_APPROVER)
    assert done.finish_reason == FinishReason.STOP
    await assert_no_workflow_task_failed(client, chat.id)
    everything = exported(spans)
    mine = of_chat(everything, chat.id)

    # The failing tool: each attempt's span is an error, by its type alone.
    attempts = named(mine, "RunActivity:agent_interrupts.tool_call")
    assert len(attempts) == 3
    for attempt in attempts:
        assert attempt.status.status_code == trace.StatusCode.ERROR
        # The activity seals its failure (workflows.seal) as an ApplicationError whose type
        # is the tool's exception's class: the span names that class, never the message.
        assert attempt.status.description == "ApplicationError"
        (event,) = [e for e in attempt.events if e.name == "exception"]
        assert set(event.attributes or {}) <= {"exception.type", "exception.escaped"}
        assert (event.attributes or {})[
            "exception.type"
        ] == "temporalio.exceptions.ApplicationError"
    # The refused resume: its validator's error is recorded on a workflow span (the contrib
    # names it CompleteWorkflow, though the workflow goes on), which says which error alone.
    refused = [
        e
        for s in mine
        if s.name not in ("RunActivity:agent_interrupts.tool_call", SPAN_TOOL_CALL)
        for e in s.events
        if e.name == "exception"
    ]
    assert refused, "the refused resume left no exception event"
    for event in refused:
        assert set(event.attributes or {}) <= {"exception.type", "exception.escaped"}
        assert (event.attributes or {})[
            "exception.type"
        ] == "temporalio.exceptions.ApplicationError"

    # Nowhere in anything exported: names, attributes, events, links, status, resource.
    text_of_all = "\n".join(s.to_json() for s in everything)
    for secret in (SECRET_TOOL_INPUT, "hunter2", SECRET_INTRUDER, SECRET_APPROVER):
        assert secret not in text_of_all, f"{secret!r} is in a span"
    assert "exception.message" not in text_of_all and "exception.stacktrace" not in text_of_all


def test_the_exporter_keeps_a_status_description_only_as_the_type_it_starts_with():
    provider = SdkTracerProvider()
    kept = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(SanitizingSpanExporter(kept)))
    tracer = provider.get_tracer(__name__)
    with tracer.start_as_current_span("typed") as span:
        span.set_status(trace.StatusCode.ERROR, "pkg.mod.Refused: 'x@example.com' may not")
    with tracer.start_as_current_span("untyped") as span:
        span.set_status(trace.StatusCode.ERROR, "x@example.com may not answer")
    with tracer.start_as_current_span("other events") as span:
        span.add_event("retry", {"agent.attempt": 2})
    with pytest.raises(KeyError), tracer.start_as_current_span("raised"):
        raise KeyError("x@example.com")
    typed, untyped, other, raised = kept.get_finished_spans()
    assert typed.status.description == "pkg.mod.Refused"
    assert untyped.status.status_code == trace.StatusCode.ERROR
    assert untyped.status.description is None
    assert [(e.name, dict(e.attributes or {})) for e in other.events] == [
        ("retry", {"agent.attempt": 2})
    ]
    assert raised.status.description == "KeyError"
    assert [(e.name, dict(e.attributes or {})) for e in raised.events] == [
        ("exception", {"exception.type": "KeyError", "exception.escaped": "False"})
    ]
    assert "x@example.com" not in "".join(s.to_json() for s in kept.get_finished_spans())


# A signal name anyone may send: the workflow's dynamic handler takes every name, and the
# contrib names the worker's span after it. Temporal takes names of up to 1,000 bytes by
# default (``limit.maxIDLength``; a server may allow more): this one is just under.
ODD_SIGNAL = (
    ("zebra-signal-6d2a " + "évil \u202e{not ours}: " * 60).encode()[:990].decode(errors="ignore")
)


async def test_a_signal_of_any_name_names_no_span_after_it(spans, client, model):
    """The real path: a traced conversation, a signal named with a kilobyte of odd text sent
    with the real ``temporal`` CLI, and the spans as exported. The worker's span for it is
    ``HandleSignal:(other)``; the product's own handler names are kept."""
    assert 900 < len(ODD_SIGNAL.encode()) <= 1000
    agent = Agent(f"traced-names-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.approve])
    model.reply(calls(("approve", {"question": "ok?"}, "n1")))
    async with hosted(traced(client), agents=[agent], model=model) as agents:
        chat = await agents.chat(agent.name)
        await chat.send("hello")
        code, out = await cli_signal(client, chat.id, ODD_SIGNAL, "{}")
        assert code == 0, out
        # A known name with a bad payload: refused by the workflow, its span keeps the name.
        code, out = await cli_signal(client, chat.id, "resume", '{"respond": 1}')
        assert code == 0, out
        refused = await eventually(chat.rejections, lambda r: len(r) == 2)
    assert [r.handler for r in refused][1] == "resume"
    mine = of_chat(exported(spans), chat.id)
    names = [s.name for s in mine]
    assert names.count("HandleSignal:(other)") == 1
    assert names.count("HandleSignal:resume") == 1
    assert "HandleUpdate:send" in names and "RunWorkflow:AgentWorkflow" in names
    everything = "\n".join(s.to_json() for s in exported(spans))
    assert "zebra-signal-6d2a" not in everything and "{not ours}" not in everything
    assert all(len(s.name) < 200 for s in exported(spans))
    await assert_no_workflow_task_failed(client, chat.id)


def test_span_names_keep_only_the_names_the_product_defines():
    kept = [
        "HandleSignal:resume",
        "HandleSignal:__temporal_workflow_stream_publish",
        "HandleQuery:__temporal_workflow_metadata",
        "ValidateUpdate:resume",
        "HandleUpdate:__temporal_workflow_stream_poll",
        "RunWorkflow:AgentWorkflow",
        "CompleteWorkflow:AgentWorkflow",
        "RunActivity:agent_interrupts.tool_call",
        # Named by this process's own calls, and the product's own spans: left as they are.
        "StartWorkflowUpdate:resume",
        "SignalWorkflow:anything at all",
        "StartActivity:agent_interrupts.tool_call",
        SPAN_TURN_START,
        "no prefix",
    ]
    assert [span_name(n) for n in kept] == kept
    cut = {
        "HandleSignal:resume ": "HandleSignal:(other)",
        "HandleSignal:a:b": "HandleSignal:(other)",
        "HandleQuery:pendingx": "HandleQuery:(other)",
        "HandleQuery:resume": "HandleQuery:(other)",  # an update's name, not a query's
        "ValidateUpdate:status": "ValidateUpdate:(other)",
        "HandleUpdate:x" * 1000: "HandleUpdate:(other)",
        "RunWorkflow:Impostor": "RunWorkflow:(other)",
        "RunActivity:shell": "RunActivity:(other)",
        "RunStartNexusOperationHandler:svc/op": "RunStartNexusOperationHandler:(other)",
    }
    assert {n: span_name(n) for n in cut} == cut
    # An application that hosts its own workflows on the worker names them.
    assert span_name("RunWorkflow:Billing", also_known={"Billing"}) == "RunWorkflow:Billing"
    provider = SdkTracerProvider()
    kept_spans = InMemorySpanExporter()
    exporter = SanitizingSpanExporter(kept_spans, also_known=["Billing"])
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(__name__)
    for name in ("HandleSignal:whatever", "RunWorkflow:Billing", "HandleQuery:status"):
        with tracer.start_as_current_span(name, attributes={"temporalWorkflowID": "c"}):
            pass
    assert [(s.name, dict(s.attributes or {})) for s in kept_spans.get_finished_spans()] == [
        ("HandleSignal:(other)", {"temporalWorkflowID": "c"}),
        ("RunWorkflow:Billing", {"temporalWorkflowID": "c"}),
        ("HandleQuery:status", {"temporalWorkflowID": "c"}),
    ]


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_recorded_histories_replay_with_tracing_on(spans, path: Path):
    """Spans and metrics add no command: what earlier code recorded replays with them on."""
    hist = load(path)
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=sandbox_runner(),
        interceptors=[TracingInterceptor(), ResultKeysInterceptor(resolve_result_keys())],
    )
    result = await replayer.replay_workflow(hist, raise_on_replay_failure=True)
    assert result.replay_failure is None


# ----------------------------------------------------------------------------------------------
# The switch


def _run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (one global tracer provider per process), from the
    project's root, with ``env`` on top of this environment less the tracing variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_without_the_endpoint_nothing_is_installed(monkeypatch):
    monkeypatch.delenv(TRACING_SWITCH, raising=False)
    provider = trace.get_tracer_provider()
    assert tracing_interceptors(service_name="agent-client") == []
    config: dict[str, object] = {"target_host": "localhost:7233"}
    add_tracing(config, service_name="agent-client")
    assert "interceptors" not in config
    assert trace.get_tracer_provider() is provider


async def test_the_entry_points_trace_only_when_the_endpoint_is_set(client):
    """``AgentClient.connect()`` (and so ``agentctl``) in a fresh process: untouched without
    the variable; with it, the interceptor and a provider exporting over OTLP/HTTP there."""
    code = f"""
        import json, sys
        from opentelemetry import trace
        from temporalio.contrib.opentelemetry import TracingInterceptor
        from temporal_agent_interrupts.client.api import AgentClient, run_script

        async def main():
            agents = await AgentClient.connect({server_address(client)!r})
            interceptors = agents.temporal.config().get("interceptors") or []
            provider = trace.get_tracer_provider()
            exporters = [
                p.span_exporter
                for p in getattr(getattr(provider, "_active_span_processor", None),
                                 "_span_processors", ())
            ]
            print(json.dumps({{
                "traced": any(isinstance(i, TracingInterceptor) for i in interceptors),
                "provider": type(provider).__name__,
                "service": dict(getattr(provider, "resource", None).attributes).get("service.name")
                if hasattr(provider, "resource") else None,
                "exporters": [type(e).__name__ for e in exporters],
                "sends_to": [type(getattr(e, "exporter", None)).__name__ for e in exporters],
                "endpoint": [getattr(getattr(e, "exporter", None), "_endpoint", None)
                             for e in exporters],
                "otlp_loaded": "opentelemetry.exporter.otlp.proto.http" in sys.modules,
            }}))

        run_script(main())  # an exit the SDK cannot turn into an abort
    """
    off = json.loads(_run_python(code))
    assert off == {
        "traced": False,
        "provider": "ProxyTracerProvider",
        "service": None,
        "exporters": [],
        "sends_to": [],
        "endpoint": [],
        "otlp_loaded": False,
    }
    # Nothing listens there, and no span is made: the exporter never sends.
    on = json.loads(_run_python(code, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"))
    assert on == {
        "traced": True,
        "provider": "TracerProvider",
        "service": "agent-client",
        # Every span is cut on its way out (exceptions by their type alone), then sent.
        "exporters": ["SanitizingSpanExporter"],
        "sends_to": ["OTLPSpanExporter"],
        "endpoint": ["http://127.0.0.1:9/v1/traces"],
        "otlp_loaded": True,
    }
    disabled = json.loads(
        _run_python(
            code, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SDK_DISABLED="true"
        )
    )
    assert disabled["traced"] is False and disabled["provider"] == "ProxyTracerProvider"


# ----------------------------------------------------------------------------------------------
# Metrics


hurry = interrupt(
    "hurry",
    "Ask a human who has a second to answer.",
    input=t.Ask,
    output=t.Answer,
    timeout=timedelta(seconds=1),
    on_timeout={"approved": False, "note": "timed out"},
)


@pytest.mark.parametrize(
    "cached",
    [
        pytest.param(True, id="cached"),
        # Every workflow task replays the run from its start: what was counted live before
        # must not be counted again.
        pytest.param(False, id="every-task-replays"),
    ],
)
async def test_interrupts_raised_answered_expired_and_refused_are_counted(
    metered, client, cached: bool
):
    metrics_client, metrics = metered
    agent = Agent(
        f"metered-{uuid.uuid4().hex[:8]}",
        model="gemini-test",
        tools=[t.approve, t.charge, t.lookup, hurry],
        # lookup waits for approval; charge asks for it itself (Interrupt); approve is a question.
        middleware=[ToolApproval(allow=["charge"])],
    )
    model = ScriptedModel(
        [
            calls(
                ("approve", {"question": "q"}, "a1"),
                ("charge", {"amount": 5}, "a2"),
                ("lookup", {"key": "k"}, "a3"),
            ),
            text("answered"),
            calls(("hurry", {"question": "quick?"}, "h1")),
            text("too late"),
            calls(("approve", {"question": "q"}, "c1")),
        ]
    )
    cache: dict[str, Any] = {} if cached else {"max_cached_workflows": 0}
    async with hosted(metrics_client, agents=[agent], model=model, **cache) as agents:
        first = await agents.chat(agent.name)
        paused = await first.send("go")
        ask, charge, look = paused.interrupts
        assert [i.source for i in paused.interrupts] == ["interrupt", "tool", "approval"]
        # Refused: an update naming no pending ref, a signal doing the same, a message while
        # paused, and a signal nobody handles.
        with pytest.raises(ResumeRejected):
            await first.resume(respond=[ToolResponse(name="approve", ref="nope", output={})])
        handle = first.handle
        await handle.signal("resume", {"respond": [{"name": "approve", "ref": "nope"}]})
        await handle.signal("send", {"text": "hello?"})
        await handle.signal("frobnicate", {"x": 1})
        await eventually(first.rejections, lambda r: len(r) == 3)
        done = await first.resume(answers=[ask.approve(), charge.approve(), look.deny()])
        assert done.finish_reason == FinishReason.STOP

        # A deadline passes (a real second on the dev server).
        second = await agents.chat(agent.name)
        (late,) = (await second.send("hurry")).interrupts
        assert late.deadline is not None
        await eventually(
            second.last_turn,
            lambda r: r is not None and r.finish_reason == FinishReason.STOP,
            timeout=15,
        )

        # Withdrawn unanswered.
        third = await agents.chat(agent.name)
        await third.send("again")
        cancelled = await third.cancel()
        assert cancelled.finish_reason == FinishReason.CANCELLED

    name = agent.name

    def counted(samples) -> bool:
        return metric_values(samples, INTERRUPTS_ANSWERED, agent=name, by=("tool", "decision")).get(
            ("approve", "cancelled")
        ) == 1 and bool(metric_values(samples, INTERRUPTS_EXPIRED, agent=name, by=("tool",)))

    samples = await eventually(metrics.scrape, counted, timeout=15, interval=0.2)
    assert metric_values(samples, INTERRUPTS_RAISED, agent=name, by=("tool",)) == {
        ("approve",): 2,
        ("charge",): 1,
        ("lookup",): 1,
        ("hurry",): 1,
    }
    assert metric_values(samples, INTERRUPTS_ANSWERED, agent=name, by=("tool", "decision")) == {
        ("approve", "approved"): 1,
        ("charge", "approved"): 1,
        ("lookup", "denied"): 1,
        ("approve", "cancelled"): 1,
    }
    assert metric_values(samples, INTERRUPTS_EXPIRED, agent=name, by=("tool",)) == {("hurry",): 1}
    refused = metric_values(samples, REJECTIONS, agent=name, by=("handler", "via"))
    assert set(refused) == {
        ("resume", "update"),
        ("resume", "signal"),
        ("send", "signal"),
        ("other", "signal"),
    }
    if cached:
        assert all(count == 1 for count in refused.values()), refused
    else:
        # A known limit (README, "Metrics"): a refused signal issues no command, and Temporal's
        # Core replays a workflow task that issued none as part of the next one when that one
        # brings an update (the resume below), calling it live. Uncached, its refusals count
        # again; never more than once again (the update's task issues commands).
        assert refused[("resume", "update")] == 1  # a refused update is in no history
        assert all(1 <= count <= 2 for count in refused.values()), refused
    # The wait of each answer that settled a call; not of the expired or withdrawn ones.
    assert metric_values(samples, f"{INTERRUPT_WAIT}_count", agent=name, by=("tool",)) == {
        ("approve",): 1,
        ("charge",): 1,
        ("lookup",): 1,
    }
    waited = metric_values(samples, f"{INTERRUPT_WAIT}_sum", agent=name, by=("tool",))
    assert all(0 < v < 60 for v in waited.values())
    buckets = metric_values(samples, f"{INTERRUPT_WAIT}_bucket", agent=name, by=("tool", "le"))
    assert {le for tool, le in buckets if tool == "approve"} == {
        *(f"{b:g}" for b in INTERRUPT_WAIT_BUCKETS),
        "+Inf",
    }
    # The tool activity counts its runs: charge interrupted, then ran once approved.
    assert metric_values(samples, TOOL_CALLS, agent=name, by=("tool", "outcome")) == {
        ("charge", "interrupt"): 1,
        ("charge", "output"): 1,
    }
    # Bounded labels only: never a chat id.
    mine = [labels for _, labels, _ in samples if labels.get("agent") == name]
    chat_ids = {first.id, second.id, third.id}
    assert mine and not any(set(labels.values()) & chat_ids for labels in mine)
    for chat in (first, second, third):
        await assert_no_workflow_task_failed(client, chat.id)


async def test_the_agent_label_names_only_an_agent_the_worker_hosts(metered, client):
    """Whoever may start a workflow names its agent: a name no worker hosts labels nothing.
    Until a model call comes back, the label is ``unknown``; then it is the agent's name."""
    metrics_client, metrics = metered
    agent = Agent(f"labelled-{uuid.uuid4().hex[:8]}", model="gemini-test", tools=[t.lookup])
    forged = f"forged-{uuid.uuid4().hex}"
    queue = f"test-{uuid.uuid4()}"
    model = ScriptedModel([text("hello")])
    async with hosted(metrics_client, agents=[agent], model=model, task_queue=queue) as agents:
        # A conversation with an agent nobody hosts: its refusals count, and its first
        # message closes it (the send raises UnknownAgent), so it is started bare first.
        stranger = await agents.chat(forged)
        await agents.temporal.start_workflow(
            AgentWorkflow.run,
            raw_start(
                ConversationInput(agent=forged),
                converter=agents.temporal.data_converter.payload_converter,
            ),
            id=stranger.id,
            task_queue=queue,
        )
        await stranger.handle.signal("frobnicate", {"x": 1})
        await eventually(stranger.rejections, lambda r: len(r) == 1)
        with pytest.raises(UnknownAgent):
            await stranger.send("hi")
        # A hosted agent's conversation, refused once its model has answered.
        known = await agents.chat(agent.name)
        assert (await known.send("hi")).text == "hello"
        await known.handle.signal("frobnicate", {"x": 1})
        await eventually(known.rejections, lambda r: len(r) == 1)

    def refusals(samples) -> dict[str, float]:
        return {
            labels["agent"]: value
            for metric, labels, value in samples
            if metric == REJECTIONS and labels.get("task_queue") == queue
        }

    samples = await eventually(
        metrics.scrape, lambda found: len(refusals(found)) == 2, timeout=15, interval=0.2
    )
    assert refusals(samples) == {UNKNOWN_AGENT: 1, agent.name: 1}
    assert not any(forged in labels.values() for _, labels, _ in samples)
    for chat in (stranger, known):
        await assert_no_workflow_task_failed(client, chat.id)

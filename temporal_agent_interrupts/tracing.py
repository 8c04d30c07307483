"""Tracing, when asked for: OpenTelemetry spans of every conversation, exported over OTLP.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

``OTEL_EXPORTER_OTLP_ENDPOINT`` (OpenTelemetry's own variable, e.g. ``http://collector:4318``)
turns it on for ``agent-worker``, ``AgentClient.connect()`` and ``agentctl``: each adds
``temporalio.contrib.opentelemetry.TracingInterceptor`` to its Temporal client (a worker built on
that client gets it too), and the process gets a tracer provider that sends spans in batches to
``$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces`` over OTLP/HTTP. The exporter reads the rest of
OpenTelemetry's variables itself (``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TRACES_ENDPOINT``,
certificates, timeouts); ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the process.
An application that has set its own global tracer provider keeps it: spans go there instead,
cut only if its exporter is wrapped in :class:`SanitizingSpanExporter`.
Unset, or with ``OTEL_SDK_DISABLED=true``, nothing is installed and nothing changes.

The client's spans (``StartUpdateWithStartWorkflow:AgentWorkflow``, ``StartWorkflowUpdate:resume``
...) carry the chat id as ``temporalWorkflowID``; the workflow's and the activities' spans join
the trace of the call that started the conversation, and later calls' spans link to it. What the
product adds is in ``workflows/telemetry.py`` and ``activities/telemetry.py``.

Every span the provider installed here exports goes through :class:`SanitizingSpanExporter`:
an exception leaves by its type alone. The SDK and the contrib put the exception's message in
the span's status and its message and stack trace in an ``exception`` event, and those quote
whatever the code that raised chose: a failing tool's input or a secret it held, the identities
and approver lists of a refused resume. Payload encryption keeps them out of history; the
exporter keeps them out of traces.

Names are cut too. The contrib names the spans of the side that receives a call after what the
call names (``HandleSignal:<signal>``, ``HandleQuery:<query>``, ``ValidateUpdate:<update>``,
``HandleUpdate:<update>``, ``RunWorkflow:<type>``, ``RunActivity:<type>``...), and the caller
chose that: the workflow's dynamic signal handler takes a signal of any name, so anyone could
name a span with a kilobyte of text of their own (as much as Temporal takes in a name). Such a
span keeps the name only when it is one the product defines (:data:`KNOWN_NAMES`), and is
``<Prefix>:(other)`` otherwise. The spans of the side that makes a call (``StartWorkflow:``,
``SignalWorkflow:``, ``StartActivity:``...) are named by this process's own code, and keep
their names.

Configuration is read here, when an entry point asks, never at import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence, Set
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status
from temporalio.contrib.opentelemetry import TracingInterceptor

from temporal_agent_interrupts.workflows.config import MODEL_ACTIVITY, TOOL_ACTIVITY, WORKFLOW_TYPE

TRACING_SWITCH = "OTEL_EXPORTER_OTLP_ENDPOINT"

KNOWN_NAMES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # The workflow's dynamic handler takes these (workflows/conversation.py on_signal; the
        # stream's publish, workflows/stream.py) and records any other as a rejection.
        "signal": frozenset({"resume", "send", "__temporal_workflow_stream_publish"}),
        "update": frozenset(
            {
                "send",
                "resume",
                "cancel",
                "close",
                "await_turn",
                "revoke_grant",
                "review_policy",
                "__temporal_workflow_stream_poll",
            }
        ),
        "query": frozenset(
            {
                "pending",
                "status",
                "history",
                "messages",
                "rejections",
                "mcp_listing",
                "grants",
                # temporalio.contrib.workflow_streams registers these two.
                "__temporal_workflow_stream_poll",
                "__temporal_workflow_stream_offset",
                # How many more followers the conversation takes (workflows.stream).
                "__agent_stream_follower_places",
                # Every workflow answers these (the SDK's own).
                "__stack_trace",
                "__enhanced_stack_trace",
                "__temporal_workflow_metadata",
            }
        ),
        "workflow": frozenset({WORKFLOW_TYPE}),
        "activity": frozenset({MODEL_ACTIVITY, TOOL_ACTIVITY}),
        "nexus operation": frozenset(),
    }
)
"""The handler, workflow and activity names the product defines, by kind: what a span named
after a received call may show. ``tests/test_durable_names.py`` fails when the workflow gains a
handler this does not know."""

OTHER_NAME = "(other)"
"""What stands for a name the product does not define, in a span's name."""

# The contrib's prefixes for the side that receives a call, and the kind of name after each.
_RECEIVED: Mapping[str, str] = MappingProxyType(
    {
        "HandleSignal": "signal",
        "HandleQuery": "query",
        "ValidateUpdate": "update",
        "HandleUpdate": "update",
        "RunWorkflow": "workflow",
        "CompleteWorkflow": "workflow",
        "RunActivity": "activity",
        "RunStartNexusOperationHandler": "nexus operation",
        "RunCancelNexusOperationHandler": "nexus operation",
    }
)

# The provider this process installed (None: none, or the application's own is in use).
_installed: Any = None

# What an exported ``exception`` event keeps: which type, and whether it left the span.
_KEPT_EXCEPTION_ATTRIBUTES = ("exception.type", "exception.escaped")
# A status description is kept only as the exception type it starts with ("Type: message").
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


class SanitizingSpanExporter(SpanExporter):
    """Sends spans on to ``exporter`` as :func:`sanitised` cuts them.

    What :func:`install_tracing` puts in front of every exporter it installs. An application
    with its own tracer provider gets the same cut by wrapping its exporter in this.

    Args:
        exporter: Where the spans go.
        also_known: Names of the application's own workflows, activities and handlers that its
            spans keep (an application that hosts more than the agents on its workers).
    """

    def __init__(self, exporter: SpanExporter, *, also_known: Iterable[str] = ()) -> None:
        self.exporter = exporter
        self.also_known = frozenset(also_known)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([sanitised(span, also_known=self.also_known) for span in spans])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def sanitised(span: ReadableSpan, *, also_known: Set[str] = frozenset()) -> ReadableSpan:
    """``span`` as it may leave the process: its exceptions by their type alone, and a name
    taken from a received call only when the product defines it (:func:`span_name`).

    The status description is cut to the exception type it starts with (the SDK and the contrib
    write ``"RuntimeError: password is hunter2 (...)"``: ``"RuntimeError"`` is left); one that
    does not start with a type name is dropped. Each ``exception`` event keeps
    ``exception.type`` and ``exception.escaped`` only: no ``exception.message``, no
    ``exception.stacktrace`` (whose text repeats the message, and those of its causes).
    Attributes, links, other events and times are the span's own; a span with nothing to cut
    is returned as it is.
    """
    status = span.status
    description = _type_name(status.description)
    events = [_sanitised_event(event) for event in span.events]
    name = span_name(span.name, also_known=also_known)
    unchanged = all(a is b for a, b in zip(events, span.events, strict=True))
    if description == status.description and unchanged and name == span.name:
        return span
    return _SanitisedSpan(
        span, name=name, events=events, status=Status(status.status_code, description)
    )


def span_name(name: str, *, also_known: Set[str] = frozenset()) -> str:
    """A span's name as it may leave the process: ``<Prefix>:<name>`` for a call received
    (``HandleSignal:``, ``HandleQuery:``, ``ValidateUpdate:``, ``HandleUpdate:``,
    ``RunWorkflow:``, ``CompleteWorkflow:``, ``RunActivity:``, the Nexus handlers') keeps the
    name only when :data:`KNOWN_NAMES` or ``also_known`` has it, and is ``<Prefix>:(other)``
    otherwise. Every other name is left as it is."""
    prefix, colon, called = name.partition(":")
    kind = _RECEIVED.get(prefix) if colon else None
    if kind is None or called in KNOWN_NAMES[kind] or called in also_known:
        return name
    return f"{prefix}:{OTHER_NAME}"


def _type_name(description: str | None) -> str | None:
    if not description:
        return description
    # Only "Type: message", as the SDK and the contrib write it, names a type; a description
    # without the colon is all message (code of any kind may set one), and is dropped.
    if ":" not in description:
        return None
    head = description.split(":", 1)[0].strip()
    return head if len(head) <= 200 and _TYPE_NAME.fullmatch(head) else None


def _sanitised_event(event: Event) -> Event:
    if event.name != "exception":
        return event
    attributes = event.attributes or {}
    kept = {k: attributes[k] for k in _KEPT_EXCEPTION_ATTRIBUTES if k in attributes}
    if len(kept) == len(attributes):
        return event
    return Event(event.name, kept, event.timestamp)


class _SanitisedSpan(ReadableSpan):
    """A finished span's copy with another name, events and status (and the original's counts
    of what its limits dropped, which the copy's plain collections cannot tell)."""

    def __init__(
        self, span: ReadableSpan, *, name: str, events: Sequence[Event], status: Status
    ) -> None:
        super().__init__(
            name=name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=span.attributes,
            events=events,
            links=span.links,
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
        self._dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        return self._dropped[2]


def tracing_enabled() -> bool:
    """Whether ``OTEL_EXPORTER_OTLP_ENDPOINT`` asks for tracing (and the SDK is not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(os.environ.get(TRACING_SWITCH, "").strip())


def tracing_interceptors(*, service_name: str) -> list[TracingInterceptor]:
    """The interceptor that traces a Temporal client and its workers, or none when tracing is off.

    On the first call with tracing on, installs the global tracer provider (unless the
    application has its own; see :func:`install_tracing`): spans go out in batches, sanitised,
    to the OTLP/HTTP exporter.

    Args:
        service_name: ``service.name`` of this process's spans, unless ``OTEL_SERVICE_NAME``
            says otherwise.
    """
    if not tracing_enabled():
        return []
    install_tracing(service_name=service_name)
    return [TracingInterceptor()]


def add_tracing(config: MutableMapping[str, Any], *, service_name: str) -> None:
    """Add the tracing interceptor to ``Client.connect`` keyword arguments, when tracing is on
    and the caller has not brought a ``TracingInterceptor`` of its own."""
    given = list(config.get("interceptors") or [])
    if any(isinstance(i, TracingInterceptor) for i in given):
        return
    extra = tracing_interceptors(service_name=service_name)
    if extra:
        config["interceptors"] = [*given, *extra]


def flush_tracing(timeout: float = 3.0) -> None:
    """Send the spans still batched, waiting at most ``timeout`` seconds (before ``os._exit``,
    which skips the exit hook that would do it)."""
    if _installed is not None:
        _installed.force_flush(int(timeout * 1000))


def install_tracing(*, service_name: str, exporter: SpanExporter | None = None) -> bool:
    """Send this process's spans, sanitised (:class:`SanitizingSpanExporter`), in batches.

    The first call installs the global tracer provider, with a batch processor in front of
    ``exporter`` wrapped in the sanitiser; without ``exporter``, OTLP/HTTP as OpenTelemetry's
    variables say (what :func:`tracing_interceptors` asks for). A later call with an exporter
    adds it, the same way, to the provider installed. A test passes its in-memory exporter here,
    so what it reads went through what production exports through.

    Args:
        service_name: ``service.name`` of this process's spans, unless ``OTEL_SERVICE_NAME``
            says otherwise.
        exporter: Where the spans go.

    Returns:
        Whether this process's spans now reach ``exporter`` (or OTLP): False when the
        application has set a tracer provider of its own, which exports as it was set up to.
    """
    global _installed
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if _installed is None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    ):
        return False  # the application's own
    if _installed is not None:
        if exporter is not None:
            _installed.add_span_processor(BatchSpanProcessor(SanitizingSpanExporter(exporter)))
        return True
    if exporter is None:
        # Imported only when tracing is on: a process without it never loads the exporter.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(SanitizingSpanExporter(exporter)))
    trace.set_tracer_provider(provider)
    _installed = provider
    return True


__all__ = [
    "KNOWN_NAMES",
    "OTHER_NAME",
    "TRACING_SWITCH",
    "SanitizingSpanExporter",
    "add_tracing",
    "flush_tracing",
    "install_tracing",
    "sanitised",
    "span_name",
    "tracing_enabled",
    "tracing_interceptors",
]

"""Tracing, when asked for: OpenTelemetry spans of every conversation, exported over OTLP.

``OTEL_EXPORTER_OTLP_ENDPOINT`` (OpenTelemetry's own variable, e.g. ``http://collector:4318``)
turns it on for ``python -m worker``, ``AgentClient.connect()`` and ``agentctl``: each adds
``temporalio.contrib.opentelemetry.TracingInterceptor`` to its Temporal client (a worker built on
that client gets it too), and the process gets a tracer provider that sends spans in batches to
``$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces`` over OTLP/HTTP. The exporter reads the rest of
OpenTelemetry's variables itself (``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TRACES_ENDPOINT``,
certificates, timeouts); ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the process.
An application that has set its own global tracer provider keeps it: spans go there instead.
Unset, or with ``OTEL_SDK_DISABLED=true``, nothing is installed and nothing changes.

The client's spans (``StartUpdateWithStartWorkflow:AgentWorkflow``, ``StartWorkflowUpdate:resume``
...) carry the chat id as ``temporalWorkflowID``; the workflow's and the activities' spans join
the trace of the call that started the conversation, and later calls' spans link to it. What the
product adds is in ``workflows/telemetry.py`` and ``activities/telemetry.py``.

Configuration is read here, when an entry point asks, never at import.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from temporalio.contrib.opentelemetry import TracingInterceptor

TRACING_SWITCH = "OTEL_EXPORTER_OTLP_ENDPOINT"

# The provider this process installed (None: none, or the application's own is in use).
_installed: Any = None


def tracing_enabled() -> bool:
    """Whether ``OTEL_EXPORTER_OTLP_ENDPOINT`` asks for tracing (and the SDK is not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(os.environ.get(TRACING_SWITCH, "").strip())


def tracing_interceptors(*, service_name: str) -> list[TracingInterceptor]:
    """The interceptor that traces a Temporal client and its workers, or none when tracing is off.

    On the first call with tracing on, installs the global tracer provider (unless the
    application has its own): a batch processor and an OTLP/HTTP exporter.

    Args:
        service_name: ``service.name`` of this process's spans, unless ``OTEL_SERVICE_NAME``
            says otherwise.
    """
    if not tracing_enabled():
        return []
    _install(service_name)
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


def _install(service_name: str) -> None:
    global _installed
    # Imported only when tracing is on: a process without it never loads the SDK's exporter.
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if _installed is not None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    ):
        return  # ours already, or the application's own
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _installed = provider


__all__ = [
    "TRACING_SWITCH",
    "add_tracing",
    "flush_tracing",
    "tracing_enabled",
    "tracing_interceptors",
]

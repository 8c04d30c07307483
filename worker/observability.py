"""The worker's Prometheus endpoint: Temporal's own metrics and the product's.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

``agent-worker`` builds its Temporal runtime here when ``AGENT_METRICS_BIND`` is set; a test or
an embedding application that wants the same endpoint calls :func:`metrics_runtime` itself.
The product's metrics (names in :mod:`workflows.telemetry`) are recorded by the workflow through
``workflow.metric_meter()`` and by the tool activity through ``activity.metric_meter()``, so they
leave through whatever the runtime exports: here, Prometheus text on ``/metrics``.
"""

from __future__ import annotations

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from temporal_agent_interrupts.workflows.telemetry import INTERRUPT_WAIT, INTERRUPT_WAIT_BUCKETS


def prometheus_config(bind_address: str) -> PrometheusConfig:
    """Prometheus on ``bind_address`` (``HOST:PORT``), with the buckets of the time a human
    takes to answer (seconds to a week, not Temporal's millisecond latencies)."""
    return PrometheusConfig(
        bind_address=bind_address,
        histogram_bucket_overrides={INTERRUPT_WAIT: list(INTERRUPT_WAIT_BUCKETS)},
    )


def metrics_runtime(bind_address: str) -> Runtime:
    """A Temporal runtime serving every metric of its clients' workers on
    ``http://bind_address/metrics``. One per process and address: the endpoint binds at once."""
    return Runtime(telemetry=TelemetryConfig(metrics=prometheus_config(bind_address)))


__all__ = ["metrics_runtime", "prometheus_config"]

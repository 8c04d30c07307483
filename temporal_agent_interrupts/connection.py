"""Where to connect: the Temporal connection settings, read the Temporal way.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

``connect_config`` is the one place every entry point (``agent-worker``, ``agentctl``, the
demo, ``AgentClient.connect``) reads its connection from: a profile file and ``TEMPORAL_*``
variables through ``temporalio.envconfig``, with an address that is not ``HOST:PORT`` refused as
a setting to fix. ``connect_answering`` connects with what it returned, bounded in time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from temporal_agent_interrupts.errors import ConnectionConfigError, ServerNotAnswering

DEFAULT_ADDRESS = "localhost:7233"

DEFAULT_TASK_QUEUE = "agents"
"""Where conversations run unless ``AGENT_TASK_QUEUE`` or a caller names another queue: the worker
process, ``AgentClient`` and ``agentctl`` all default to it."""

# How long connecting may take before the server counts as not answering. The SDK alone waits
# 30 s on a port that accepts and never speaks gRPC (a hung server, or another program there), and
# then reports it like a refused connection. A healthy server, even across an ocean, answers in
# about a second.
CONNECT_TIMEOUT = timedelta(seconds=10)


def connect_config(
    target_host: str | None = None,
    *,
    namespace: str | None = None,
    profile: str | None = None,
    config_file: str | None = None,
    default_address: str | None = DEFAULT_ADDRESS,
) -> dict[str, Any]:
    """Connection settings the Temporal way: a profile file and ``TEMPORAL_*`` variables.

    This is the one place every entry point (``agent-worker``, ``agentctl``,
    ``AgentClient.connect``) reads its connection from, so one set of variables serves them all:
    ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*`` and
    profiles (``TEMPORAL_CONFIG_FILE``, ``TEMPORAL_PROFILE``), all read by
    ``temporalio.envconfig``. Explicit arguments win; without any address the local default
    ``localhost:7233`` is used.

    Args:
        target_host: ``host:port``, overriding the configured address.
        namespace: overrides the configured namespace.
        profile: the profile to load (default: ``TEMPORAL_PROFILE``, else ``default``).
        config_file: the TOML file (default: ``TEMPORAL_CONFIG_FILE``, else
            ``~/.config/temporalio/temporal.toml`` when it exists).
        default_address: the address when nothing configures one. ``None`` leaves
            ``target_host`` out, so a caller can tell "configured" from "defaulted" (``python
            -m worker --dev-server`` starts a server only for the default).

    Returns:
        Keyword arguments for ``temporalio.client.Client.connect``.

    Raises:
        ConnectionConfigError: a named config file does not exist or does not parse, the
            profile is not in it, a certificate or key file it names cannot be read, or the
            address is not ``HOST:PORT`` (no port, a port out of range, a URL scheme).
    """
    # An empty variable means "not set" to whoever wrote `TEMPORAL_API_KEY=` in an env file, but
    # envconfig takes it literally: an empty API key (or TEMPORAL_TLS) turns TLS on, an empty
    # namespace is used as is. Drop empty values before envconfig sees them.
    environ = {k: v for k, v in os.environ.items() if v}
    named_file = config_file or environ.get("TEMPORAL_CONFIG_FILE")
    # envconfig treats a named file that is not there like no file at all: a typo, or a secret
    # that was not mounted into the container, would quietly connect to localhost instead.
    if named_file and not Path(named_file).is_file():
        raise ConnectionConfigError(
            f"the Temporal config file {named_file!r} (config_file or TEMPORAL_CONFIG_FILE) "
            "does not exist"
        )
    try:
        loaded = ClientConfig.load_client_connect_config(
            profile=profile, config_file=config_file, override_env_vars=environ
        )
    except OSError as e:
        # The TLS settings name files; envconfig reads them while loading.
        raise ConnectionConfigError(
            f"cannot read {e.filename!r} named by the Temporal TLS settings "
            f"(TEMPORAL_TLS_* or the profile's tls table): {e.strerror}"
        ) from None
    except RuntimeError as e:
        # envconfig's own ConfigError (a RuntimeError): unknown profile or malformed TOML.
        # Loading does no I/O besides reading files, so nothing else lands here.
        raise ConnectionConfigError(
            _explain_config_error(e, profile=profile, named_file=named_file, environ=environ)
        ) from None
    config: dict[str, Any] = dict(loaded)
    if target_host:
        config["target_host"] = target_host
    if namespace:
        config["namespace"] = namespace
    if "target_host" in config:
        if target_host:
            source = "--address or target_host"
        elif environ.get("TEMPORAL_ADDRESS"):
            source = "TEMPORAL_ADDRESS"
        else:
            wanted = profile or environ.get("TEMPORAL_PROFILE") or "default"
            source = f"the address of the Temporal profile {wanted!r}"
        _check_address(config["target_host"], source=source)
    if default_address is not None:
        config.setdefault("target_host", default_address)
    return config


def _check_address(address: str, *, source: str) -> None:
    """Refuse an address the SDK would misread rather than reject.

    Measured with temporalio 1.35: a host alone (``localhost``) connects to port 80, a word
    alone fails later as a DNS error that reads like an outage, and ``http://host:port`` works
    but prints a two-line deprecation warning. Each is a setting to fix, so it is told as one.
    """
    why: str | None = None
    if "://" in address:
        why = (
            "give HOST:PORT without a scheme, like localhost:7233 (TLS is a setting of its own: "
            "TEMPORAL_TLS, or TEMPORAL_API_KEY)"
        )
    else:
        host, colon, port = address.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        if not colon or not port:
            why = "no port; give HOST:PORT, like localhost:7233"
        elif not host:
            why = "no host; give HOST:PORT, like localhost:7233"
        elif not port.isdigit():
            why = f"the port {port!r} is not a number; give HOST:PORT, like localhost:7233"
        elif not 0 < int(port) < 65536:
            why = f"the port {port} is not between 1 and 65535"
        elif ":" in host and not bracketed:
            why = "an IPv6 host goes in brackets, like [::1]:7233"
        elif any(c.isspace() or c in "/@?#" for c in host):
            why = "the host is not a host name or an IP address; give HOST:PORT"
    if why is not None:
        raise ConnectionConfigError(f"bad Temporal address {address!r} ({source}): {why}")


def _explain_config_error(
    err: RuntimeError, *, profile: str | None, named_file: str | None, environ: dict[str, str]
) -> str:
    wanted = profile or environ.get("TEMPORAL_PROFILE") or "default"
    where = (
        repr(named_file)
        if named_file
        else "the default config file (~/.config/temporalio/temporal.toml; none is named by "
        "TEMPORAL_CONFIG_FILE)"
    )
    try:
        source = Path(named_file) if named_file else None
        known = sorted(ClientConfig.load(config_source=source, override_env_vars=environ).profiles)
    except RuntimeError:
        known = None  # the file itself does not parse: envconfig's message says where
    if known is not None and wanted not in known:
        has = f"profiles there: {', '.join(known)}" if known else "no profiles are defined there"
        return (
            f"the Temporal profile {wanted!r} (--profile or TEMPORAL_PROFILE) is not in "
            f"{where}; {has}"
        )
    return f"cannot load the Temporal connection settings from {where}: {err}"


STARTING = "not healthy yet"
"""What the SDK's connection error says while the server's frontend is still starting."""


async def connect_answering(
    config: Mapping[str, Any], *, timeout: timedelta = CONNECT_TIMEOUT
) -> Client:
    """``Client.connect(**config)``, giving up after ``timeout`` instead of the SDK's 30 s.

    Connecting already makes a real Temporal call (``GetSystemInfo``), so a client returned here
    talked to a Temporal server. ``agent-worker`` and ``make demo`` connect through this with
    what :func:`connect_config` returned; ``AgentClient.connect`` does too.

    Raises:
        ServerNotAnswering: no answer within ``timeout``; the message names the address and how
            to fix it.
        ConnectionConfigError: the SDK refused the address before connecting (it cannot parse
            it, e.g. ``[zz]:7233``): a setting to fix, like the ones ``connect_config`` refuses.
        RuntimeError: the SDK's own connection errors (refused, TLS, not gRPC).
    """
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            while True:
                try:
                    return await Client.connect(**config)
                except RuntimeError as e:
                    # A server that has just opened its port answers "Frontend is not healthy
                    # yet" for a moment (measured on the dev server): it is starting, so wait.
                    if STARTING not in str(e):
                        raise
                await asyncio.sleep(0.2)
    except ValueError as e:
        raise ConnectionConfigError(
            f"bad Temporal address {config.get('target_host')!r}: {e}"
        ) from None
    except TimeoutError:
        address = str(config.get("target_host", "?"))
        raise ServerNotAnswering(
            f"the server at {address} is not answering as Temporal (no reply within "
            f"{timeout.total_seconds():g}s): stop whatever listens there, or point "
            "TEMPORAL_ADDRESS at a Temporal server",
            address=address,
            waited=timeout,
        ) from None


__all__ = ["CONNECT_TIMEOUT", "DEFAULT_ADDRESS", "connect_answering", "connect_config"]

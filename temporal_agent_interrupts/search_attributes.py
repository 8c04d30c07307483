"""The namespace must know the search attributes the workflow upserts.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

Without them the workflow's upsert would fail every workflow task, so every worker that hosts
agents checks at start (``AgentsPlugin.run_worker``, ``agent-worker``) and refuses to run with a
message that says how to fix it: ``setup_search_attributes(client)``, or the commands that call it
(``agent-worker --setup-search-attributes``, ``agentctl setup-search-attributes``), which need no
agents. Shared by both sides, as the connection module is: ``client/`` (``agentctl``) imports
nothing from ``worker/``.
"""

from __future__ import annotations

import logging
import shlex
from datetime import timedelta

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)

LIST_TIMEOUT = timedelta(seconds=30)
"""How long the start-up check waits for the namespace's list of attributes."""


TYPE_NAMES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
}
"""Each attribute type as the ``temporal`` CLI, the UI and tcld name it."""


def search_attribute_args() -> list[str]:
    """``--search-attribute NAME=Type`` for each attribute, as ``temporal server start-dev``
    takes them."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={TYPE_NAMES[key.indexed_value_type]}"]
    return args


class MissingSearchAttributes(Exception):
    """The namespace lacks attributes the workflow upserts; the message says how to add them."""


class SearchAttributesRefused(Exception):
    """The server would not register the attributes (Temporal Cloud manages them itself)."""


def _wanted() -> dict[str, IndexedValueType.ValueType]:
    return {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in SEARCH_ATTRIBUTES
    }


async def missing_search_attributes(client: Client) -> list[str]:
    """The names of the attributes ``client``'s namespace lacks (or has with another type)."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace),
        # Bounded: a worker checks this at start, and a server that accepts and never answers
        # must fail the start with DEADLINE_EXCEEDED, not hang it.
        timeout=LIST_TIMEOUT,
    )
    have = {**resp.custom_attributes, **resp.system_attributes}
    return [name for name, kind in _wanted().items() if have.get(name) != kind]


_FOUND: set[tuple[str, str]] = set()
"""The (server, namespace) pairs this process has found complete: ``agent-worker`` checks before
it builds its worker (to exit 2 with the fix) and the plugin checks again as that worker starts;
a process that starts several workers asks once. Only a complete answer is kept, so a namespace
fixed after a refusal is asked again."""


async def check_search_attributes(client: Client) -> None:
    """Raise ``MissingSearchAttributes`` with the fix when the namespace lacks any."""
    where = (client.service_client.config.target_host, client.namespace)
    if where in _FOUND:
        return
    try:
        missing = await missing_search_attributes(client)
    except RPCError as e:
        if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            # Temporal Cloud manages search attributes through its own API; trust the operator.
            log.warning("could not list search attributes (%s); assuming they exist", e.message)
            return
        raise
    if missing:
        raise MissingSearchAttributes(fix_message(client, missing))
    _FOUND.add(where)


def fix_message(client: Client, missing: list[str]) -> str:
    """What to run to register ``missing`` on ``client``'s namespace, from any folder.

    The commands name the server and namespace the client is connected to: a worker built in a
    team's own code is often connected to a namespace no environment variable names, and a
    command that fixed ``default`` instead would leave the same refusal.
    """
    namespace = client.namespace
    address = client.service_client.config.target_host
    env = f"TEMPORAL_ADDRESS={shlex.quote(address)} TEMPORAL_NAMESPACE={shlex.quote(namespace)}"
    return (
        f"namespace {namespace!r} lacks the search attributes {missing}, which "
        "conversations upsert. Register them once (no agents needed, from any folder) with:\n"
        f"    {env} agent-worker --setup-search-attributes\n"
        f"or: {env} agentctl setup-search-attributes\n"
        "(with the connection's credentials too, if it uses any: TEMPORAL_API_KEY, "
        "TEMPORAL_TLS_*, or TEMPORAL_PROFILE)\n"
        "or, from Python: await temporal_agent_interrupts.hosting.setup_search_attributes(client)\n"
        "(with docker compose: docker compose run --rm worker agent-worker "
        "--setup-search-attributes)\n"
        f"On Temporal Cloud, add them ({_listing()}) in the namespace settings or with tcld."
    )


async def setup_search_attributes(client: Client) -> list[str]:
    """Register the search attributes conversations upsert on ``client``'s namespace.

    Idempotent: adds only those missing, and needs no agents, so a deployment runs it once per
    namespace from anywhere (``agent-worker --setup-search-attributes`` and ``agentctl
    setup-search-attributes`` call it).

    Args:
        client: Connected to the namespace to prepare, with credentials allowed to call the
            operator service.

    Returns:
        The names added (empty: they were all there).

    Raises:
        SearchAttributesRefused: the server would not add them (Temporal Cloud manages them in
            its namespace settings or with tcld); the message says where.
    """
    wanted = _wanted()
    try:
        missing = await missing_search_attributes(client)
    except RPCError as e:
        # Some servers (the time-skipping test server) can add but not list.
        if e.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        missing = list(wanted)
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=client.namespace,
                    search_attributes={name: wanted[name] for name in missing},
                )
            )
        except RPCError as e:
            if e.status not in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
                raise
            raise SearchAttributesRefused(
                f"the server refused to register {missing} on namespace {client.namespace!r} "
                f"({e.message}). On Temporal Cloud, add them ({_listing()}) in the namespace "
                "settings or with tcld; elsewhere, use credentials allowed to call the operator "
                "service."
            ) from None
    return missing


def _listing() -> str:
    """``AgentName=Keyword, ...``: the attributes as the UI, tcld and the CLI name them."""
    args = search_attribute_args()
    return ", ".join(args[1::2])


register_search_attributes = setup_search_attributes
"""The name ``setup_search_attributes`` had before it was public (tests and scripts use it)."""

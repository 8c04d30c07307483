"""The namespace must know the search attributes the workflow upserts.

Without them the workflow's upsert would fail every workflow task, so the worker checks at start
and refuses to run with a message that says how to fix it.
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from temporal_agent_interrupts.worker.devserver import search_attribute_args
from temporal_agent_interrupts.workflows.config import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)


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
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    have = {**resp.custom_attributes, **resp.system_attributes}
    return [name for name, kind in _wanted().items() if have.get(name) != kind]


async def check_search_attributes(client: Client) -> None:
    """Raise ``MissingSearchAttributes`` with the fix when the namespace lacks any."""
    try:
        missing = await missing_search_attributes(client)
    except RPCError as e:
        if e.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            # Temporal Cloud manages search attributes through its own API; trust the operator.
            log.warning("could not list search attributes (%s); assuming they exist", e.message)
            return
        raise
    if missing:
        cli = " ".join(search_attribute_args())
        raise MissingSearchAttributes(
            f"namespace {client.namespace!r} lacks the search attributes {missing}, which "
            "conversations upsert. Register them once with:\n"
            "    agent-worker --setup-search-attributes\n"
            "    (with docker compose: docker compose run --rm worker agent-worker "
            "--setup-search-attributes)\n"
            f"or, on a dev server, start it with: temporal server start-dev {cli}\n"
            f"On Temporal Cloud, add them ({_listing()}) in the namespace settings or with tcld."
        )


async def register_search_attributes(client: Client) -> list[str]:
    """Add whichever attributes are missing; returns the names added."""
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

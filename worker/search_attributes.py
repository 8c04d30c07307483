"""The search attributes every worker checks at start, by the worker side's import path.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts.hosting``.

They live in the package root (``temporal_agent_interrupts.search_attributes``), which both sides
share: ``agentctl setup-search-attributes`` registers them too, and ``client/`` imports nothing
from ``worker/``.
"""

from temporal_agent_interrupts.search_attributes import (
    MissingSearchAttributes,
    SearchAttributesRefused,
    check_search_attributes,
    fix_message,
    missing_search_attributes,
    register_search_attributes,
    setup_search_attributes,
)

__all__ = [
    "MissingSearchAttributes",
    "SearchAttributesRefused",
    "check_search_attributes",
    "fix_message",
    "missing_search_attributes",
    "register_search_attributes",
    "setup_search_attributes",
]

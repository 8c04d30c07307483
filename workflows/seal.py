"""Results only workers can make: a MAC on every activity result the conversation acts on.

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

Whoever may call ``RespondActivityTaskCompletedById`` or ``…FailedById`` (Temporal Cloud grants
them with namespace write access; they need no poll, only the ids history shows) can complete a
running activity with a result of their choosing. Without more, the workflow would take a forged
model reply (tool calls and an agent definition with its gates removed included), a forged tool
output, or a forged classified failure as a worker's.

So each result and each classified failure leaving this product's activities carries a
:class:`~temporal_agent_interrupts.workflows.types.Seal`: HMAC-SHA256, under a key only the
workers hold (``AGENT_RESULT_KEYS``), over the workflow id, the activity id (which names the run:
see :class:`Binding`) and type the result is for, and the result's own canonical bytes. The
workflow checks it before it acts; a result without a valid seal is treated as not received (a
model call is asked again, a tool call "may have taken effect") and the refusal is recorded.

The check is a pure function of history and the key set, so a replay holding the same keys
decides the same. The keys reach the workflow as an extern function the worker's interceptor
sets (:data:`EXTERN`): the secret bytes never enter history, and the workflow's code reads no
environment. Keys rotate: every listed key verifies, the first one seals. A key still sealing
results of a conversation in flight must stay listed until those runs have closed or continued as
new, or their replay decides otherwise.

Nothing here does I/O: the activities seal with the same functions.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from temporalio import workflow

from temporal_agent_interrupts.workflows.types import Seal

EXTERN = "temporal_agent_interrupts.result_keys"
"""The extern function (``workflow.extern_functions()``) that gives the workflow its keys."""

SEAL_DETAIL = "agent_result_seal"
"""The key of the detail a sealed failure carries its seal under (its last detail)."""

_DOMAIN = b"temporal-agent-interrupts/result/v1\0"


@dataclasses.dataclass(frozen=True, repr=False)
class ResultKeys:
    """The key set: ``(id, secret)`` pairs, the first one sealing; every one verifies.

    ``off``: sealing and checking are off (``AGENT_UNSIGNED_RESULTS=1``, said loudly by the
    worker at every start): every result is taken, sealed or not. Its ``repr`` names ids only.
    """

    keys: tuple[tuple[str, bytes], ...] = ()
    off: bool = False

    def __repr__(self) -> str:
        return f"ResultKeys(ids={[k for k, _ in self.keys]!r}, off={self.off})"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.keys)

    @property
    def seals(self) -> bool:
        """Whether :meth:`seal` makes seals (not off, and a key to seal with)."""
        return not self.off and bool(self.keys)

    def seal(self, binding: Binding, body: bytes) -> Seal | None:
        """The seal of ``body`` for ``binding``, with the first key (None when off)."""
        if self.off or not self.keys:
            return None
        key_id, key = self.keys[0]
        return Seal(kid=key_id, mac=_mac(key, binding, body))

    def verify(self, seal: Seal | None, binding: Binding, body: bytes) -> str | None:
        """None when ``seal`` is a valid seal of ``body`` for ``binding``; else why not."""
        if self.off:
            return None
        if seal is None:
            return "it carries no seal"
        key = dict(self.keys).get(seal.kid)
        if key is None:
            return f"it is sealed under key id {seal.kid[:64]!r}, which this worker does not hold"
        if not hmac.compare_digest(_mac(key, binding, body), seal.mac):
            return "its seal does not match it"
        return None


@dataclasses.dataclass(frozen=True)
class Binding:
    """What a result is for: one activity of one run of one workflow.

    The run is named by the activity id, not by the run id: the workflow gives each activity an
    id with a part from ``workflow.uuid4()`` (:func:`activity_id`), whose seed is the run's own,
    so no two runs of a chat (continued as new) share an id. A run id would not do: a reset
    replays the copied events under a new run id, where results sealed for the old one would no
    longer verify; the random seed is the old run's until the reset point (so the copied ids
    come out the same) and new after it (so the old timeline's results fit no new call).
    """

    workflow_id: str
    activity_id: str
    activity_type: str

    def encode(self) -> bytes:
        parts = (self.workflow_id, self.activity_id, self.activity_type)
        # Length-prefixed: no id can be made to read as two.
        return b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in parts)


def _mac(key: bytes, binding: Binding, body: bytes) -> str:
    digest = hmac.new(key, _DOMAIN + binding.encode() + body, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def result_body(result: BaseModel) -> bytes:
    """A result's canonical bytes: its JSON without the seal. pydantic writes fields in their
    declared order and objects in their keys' order, which the data converter keeps both ways,
    so the workflow's copy of a result writes the same bytes as the activity's."""
    return result.model_dump_json(exclude={"seal"}).encode("utf-8", "surrogatepass")


def failure_body(
    *, type: str | None, message: str, non_retryable: bool, details: Sequence[Any]
) -> bytes:
    """A classified failure's canonical bytes: its type, message, retryability and details
    (without the seal), as JSON with sorted keys."""
    return json.dumps(
        {
            "type": type,
            "message": message,
            "non_retryable": non_retryable,
            "details": list(details),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=str,
    ).encode("ascii")


def split_details(details: Sequence[Any]) -> tuple[list[Any], Seal | None]:
    """A failure's details without its seal, and the seal (None when it has none that reads)."""
    if details and isinstance(details[-1], Mapping) and SEAL_DETAIL in details[-1]:
        rest = list(details[:-1])
        raw = details[-1][SEAL_DETAIL]
        try:
            return rest, Seal.model_validate(raw)
        except ValueError:
            return rest, None
    return list(details), None


def seal_detail(seal: Seal | None) -> dict[str, Any] | None:
    """The detail a failure carries its seal in."""
    return None if seal is None else {SEAL_DETAIL: seal.model_dump()}


def activity_id(activity: str, n: int) -> str:
    """The id of the run's ``n``-th activity: its name, its number, and a random part from the
    run's seed (see :class:`Binding`)."""
    return f"{activity}.{n}.{workflow.uuid4().hex[:12]}"


def workflow_keys() -> ResultKeys | None:
    """The key set the worker running this workflow gave it; None when it gave none (a
    replayer or worker without this product's interceptor: then nothing verifies)."""
    found: Callable[[], ResultKeys] | None = workflow.extern_functions().get(EXTERN)
    return found() if found is not None else None

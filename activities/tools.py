"""The tool authoring API: ``tool``, ``interrupt``, ``Interrupt``, ``ToolContext``, ``ToolError``.

Internal: not covered by the 0.1.x stability promise; its public names are imported from
``temporal_agent_interrupts`` and ``temporal_agent_interrupts.types``.

A tool is a typed async function; its input and output schemas come from its pydantic
annotations. Tools run inside the ``tool_call`` activity, so they may do any I/O. Tool names are
durable identifiers: renaming a tool breaks conversations paused on it.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from temporalio.common import RetryPolicy

from temporal_agent_interrupts.workflows.agent import (
    Escalate,
    OnTimeout,
    Remind,
    check_approvers,
    timeout_policy,
)
from temporal_agent_interrupts.workflows.answers import pydantic_reason
from temporal_agent_interrupts.workflows.limits import (
    DOOR,
    json_size,
)
from temporal_agent_interrupts.workflows.types import (
    JsonObject,
    Present,
    RetrySpec,
    Status,
    ToolSpec,
)

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])

# Plain strings, so the error below lists names and not enum reprs.
STATUSES = frozenset(s.value for s in Status)
"""Classified failure statuses, as in gRPC and Genkit (``workflows.types.Status``)."""


class ToolError(Exception):
    """A classified tool failure: it fails the turn with this status and message, no retries.

    Args:
        status: A gRPC/Genkit status name such as ``INVALID_ARGUMENT`` or ``NOT_FOUND``.
        message: Shown to the caller as is, so keep secrets out of it.
    """

    def __init__(self, status: str, message: str) -> None:
        status = status.upper()
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; use one of {sorted(STATUSES)}")
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Interrupt(Exception):  # Genkit's name for it; it is control flow, not an error
    """Raised inside a tool to pause the conversation and ask a human.

    Args:
        metadata: What the human needs to decide, as a JSON object (a dict or a pydantic
            model). Anything else fails the turn with a clear message.
    """

    def __init__(self, metadata: Mapping[str, Any] | BaseModel | None = None) -> None:
        super().__init__("tool interrupted")
        self.metadata: Any = metadata


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it is serving.

    Attributes:
        idempotency_key: The same for every attempt of one run of this call, across retries,
            replays and worker restarts, and different for its next run (another approval).
            Pass it to payment or deploy APIs that deduplicate (an ``Idempotency-Key``
            header), so a run cut short and tried again cannot take effect twice.
    """

    chat_id: str
    ref: str
    agent: str
    resumed: bool = False
    resumed_metadata: JsonObject = field(default_factory=dict)
    idempotency_key: str = ""
    # The model's input when a human edited the call (the tool gets the edited one), else None.
    original_input: JsonObject | None = None

    def resumed_as(self, model: type[M]) -> M:
        """The resume metadata parsed into ``model`` (like Genkit Go's typed ``Resume``).

        Metadata that does not fit is the resumer's mistake, which no retry mends: the turn
        fails classified, and the caller and the model read why (the fields and pydantic's
        reasons, never their values) instead of an unexplained ``INTERNAL``. Catch
        ``ToolError`` to handle it in the tool instead.

        Raises:
            ToolError: ``INVALID_ARGUMENT``, the metadata does not fit ``model``
                (``the resume metadata of call 'REF' does not fit Approval: reason: Field
                required``); ``FAILED_PRECONDITION``, this call was not resumed (check
                ``ctx.resumed`` first: a first run has no resume metadata to parse).
        """
        if not self.resumed:
            raise ToolError(
                "FAILED_PRECONDITION",
                f"resumed_as({model.__name__}) in call {self.ref!r}, which was not resumed: "
                "check ctx.resumed first",
            )
        try:
            return model.model_validate(self.resumed_metadata)
        except ValidationError as e:
            raise ToolError(
                "INVALID_ARGUMENT",
                f"the resume metadata of call {self.ref!r} does not fit {model.__name__}: "
                f"{pydantic_reason(e)}",
            ) from None

    def interrupt(self, metadata: Mapping[str, Any] | BaseModel | None = None) -> typing.NoReturn:
        """Pause the conversation here; the same as ``raise Interrupt(metadata)``."""
        raise Interrupt(metadata)


class _NoInput(BaseModel):
    pass


@dataclass(frozen=True)
class Tool(Generic[M]):
    """A tool an agent can call. Build one with :func:`tool` or :func:`interrupt`."""

    name: str
    description: str
    input: type[M]
    _: KW_ONLY
    output: type[BaseModel] | None = None
    fn: Callable[..., Any] | None = None
    takes_ctx: bool = False
    timeout: timedelta | None = None
    retry: RetryPolicy | None = None
    on_timeout: OnTimeout | None = None
    idempotent: bool = False
    approvers: tuple[str, ...] = ()
    quorum: int = 1
    editable: bool = False
    reminders: tuple[Remind, ...] = ()
    separate_duties: bool = False
    present: Present | None = None

    @property
    def deadline_policies(self) -> tuple[object, ...]:
        """The reminders and escalation of this interrupt's deadline (for the worker, which
        registers the tools they run)."""
        return (self.on_timeout, *self.reminders)

    @property
    def interrupt_only(self) -> bool:
        return self.fn is None

    def spec(self) -> ToolSpec:
        is_interrupt = self.interrupt_only
        on_timeout, cancel, escalate = timeout_policy(self.on_timeout, what=f"tool {self.name!r}")
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=self.input.model_json_schema(),
            output_schema=self.output.model_json_schema() if self.output else None,
            interrupt_only=is_interrupt,
            # For a tool, `timeout` bounds one run; for an interrupt, it is the human's deadline.
            timeout_seconds=(
                self.timeout.total_seconds() if self.timeout and not is_interrupt else None
            ),
            deadline_seconds=(
                self.timeout.total_seconds() if self.timeout and is_interrupt else None
            ),
            on_timeout=on_timeout,
            retry=_retry_spec(self.retry) if self.retry else None,
            idempotent=self.idempotent,
            approvers=list(self.approvers),
            quorum=self.quorum,
            editable=self.editable,
            timeout_cancel=cancel,
            escalate=escalate,
            reminders=[r.spec() for r in self.reminders],
            separate_duties=self.separate_duties,
            present=self.present,
        )

    async def invoke(self, args: M, ctx: ToolContext) -> Any:
        """Run the tool body (the ``tool_call`` activity calls this)."""
        if self.fn is None:
            raise RuntimeError(f"{self.name} is an interrupt-only tool; it has no body to run")
        call_args: tuple[Any, ...] = (args, ctx) if self.takes_ctx else (args,)
        if self.input is _NoInput:
            call_args = call_args[1:]
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(*call_args)
        # A synchronous tool must not block the worker's event loop.
        return await asyncio.to_thread(self.fn, *call_args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests)."""
        if self.fn is None:
            raise TypeError(f"{self.name} is an interrupt-only tool; it has no body to call")
        return self.fn(*args, **kwargs)


def _retry_spec(policy: RetryPolicy) -> RetrySpec:
    return RetrySpec(
        initial_interval_seconds=policy.initial_interval.total_seconds(),
        backoff_coefficient=policy.backoff_coefficient,
        maximum_interval_seconds=(
            policy.maximum_interval.total_seconds() if policy.maximum_interval else None
        ),
        maximum_attempts=policy.maximum_attempts,
        non_retryable_error_types=(
            list(policy.non_retryable_error_types) if policy.non_retryable_error_types else None
        ),
    )


def _retry_problem(policy: RetryPolicy) -> str | None:
    """What the SDK would refuse when the workflow schedules the tool (the same checks)."""
    if policy.maximum_attempts == 1:
        return None  # no retries: the SDK ignores the rest
    if policy.initial_interval < timedelta(0):
        return "initial_interval cannot be negative"
    if policy.backoff_coefficient < 1:
        return "backoff_coefficient cannot be less than 1"
    if policy.maximum_interval is not None and policy.maximum_interval < policy.initial_interval:
        return "maximum_interval cannot be less than initial_interval"
    if policy.maximum_attempts < 0:
        return "maximum_attempts cannot be negative"
    return None


def tool(
    name: str,
    description: str,
    *,
    timeout: timedelta | None = None,
    retry: RetryPolicy | None = None,
    idempotent: bool = False,
    editable: bool = False,
    present: Present | None = None,
) -> Callable[[Callable[..., Awaitable[Any] | Any]], Tool[Any]]:
    """Declare a tool from a typed function.

    The function takes a pydantic model (the input the model supplies) and, optionally, a
    ``ToolContext``. Its return value becomes the function response: a pydantic model or a dict
    is sent as a JSON object, anything else as ``{"result": value}``.

    Args:
        name: The name the model calls; a durable identifier.
        description: What the tool does, for the model.
        timeout: The longest one run may take (the activity's start-to-close timeout).
        retry: Retry policy for unclassified exceptions (3 attempts by default). A
            ``ToolError`` is never retried.
        idempotent: Running it twice does no more than running it once. A run a human
            approved (a restart) gets a single attempt unless the tool says this or gives its
            own ``retry``: one approval, one run. A run cut short is reported to the model as
            "may have taken effect", never silently repeated.
        editable: A human answering an interrupt on this tool may change its input (a
            restart with ``input=``): the tool runs with the edited input,
            ``ctx.original_input`` has the model's, and the approval gate decides again.
            Other tools refuse a changed input.
        present: How a call reads to the person asked to approve it (a summary, labelled
            fields, its risk); without it, a default from the input's JSON schema.
    """

    if retry is not None:
        # Checked here, at import time: the workflow builds the policy when it schedules the
        # tool, and an invalid one would fail every workflow task of every conversation using it.
        problem = _retry_problem(retry)
        if problem:
            raise ValueError(f"tool {name!r}: invalid retry policy: {problem}")

    def decorate(fn: Callable[..., Any]) -> Tool[Any]:
        input_model, takes_ctx, output_model = _inspect(fn, name)
        return Tool(
            name=name,
            description=description,
            input=input_model,
            output=output_model,
            fn=fn,
            takes_ctx=takes_ctx,
            timeout=timeout,
            retry=retry,
            idempotent=idempotent,
            editable=editable,
            present=present,
        )

    return decorate


def interrupt(
    name: str,
    description: str,
    *,
    input: type[M],  # the public keyword from the design
    output: type[BaseModel] | None = None,
    timeout: timedelta | None = None,
    on_timeout: OnTimeout | BaseModel | None = None,
    approvers: Sequence[str] = (),
    quorum: int = 1,
    reminders: Sequence[Remind] = (),
    editable: bool = False,
    separate_duties: bool = False,
    present: Present | None = None,
) -> Tool[M]:
    """Declare an interrupt-only tool: calling it always pauses for a human.

    Args:
        name: The name the model calls; a durable identifier.
        description: When the model should ask, for the model.
        input: What the model supplies (shown to the human).
        output: What the human answers with; a respond that does not fit it is rejected.
        timeout: How long a human has before ``on_timeout`` answers for them.
        on_timeout: What the deadline does: the output to answer with, ``"cancel"`` (the
            turn is cancelled), or ``Escalate(notify=TOOL, extend=..., then=...)``.
        approvers: The identities, or ``group:NAME`` (with verified identity only), that may
            answer (empty: anyone who can answer). An answer from anyone else is rejected
            like any bad resume (and recorded, by signal).
        quorum: Approvals from this many distinct approvers settle a call; one denial
            settles it as denied.
        reminders: ``Remind(notify=TOOL, before=...)`` s ahead of the deadline.
        editable: A restart may change the input (shown to the human again).
        separate_duties: Whoever sent the message a call came from (its requester) may not
            answer it; binding with verified identity (``trust``), advisory without.
        present: How a call reads to the person who answers it (see :func:`tool`).

    Raises:
        ValueError: ``on_timeout`` or ``reminders`` without ``timeout``; an ``on_timeout``
            too large or not an ``output``; an approver that is not a plain identity; a
            quorum the approvers can never meet.
    """
    check_approvers(approvers, what=f"interrupt {name!r}", quorum=quorum)
    if (on_timeout is not None or reminders) and timeout is None:
        raise ValueError(f"interrupt {name!r}: on_timeout and reminders need a timeout")
    if isinstance(on_timeout, BaseModel):
        on_timeout = on_timeout.model_dump(mode="json")
    escalate = on_timeout if isinstance(on_timeout, Escalate) else None
    answer = escalate.then if escalate is not None else on_timeout
    if isinstance(answer, dict) and output is not None:
        # Fail at declaration, not weeks later when the deadline passes.
        output.model_validate(answer)
    if isinstance(on_timeout, dict) and json_size(on_timeout) > DOOR.on_timeout:
        raise ValueError(
            f"interrupt {name!r}: on_timeout is {json_size(on_timeout)} bytes of JSON; the "
            f"limit is {DOOR.on_timeout} (it answers every interrupt that times out)"
        )
    return Tool(
        name=name,
        description=description,
        input=input,
        output=output,
        fn=None,
        timeout=timeout,
        on_timeout=on_timeout,
        approvers=tuple(approvers),
        quorum=quorum,
        reminders=tuple(reminders),
        editable=editable,
        separate_duties=separate_duties,
        present=present,
    )


def _inspect(
    fn: Callable[..., Any], name: str
) -> tuple[type[BaseModel], bool, type[BaseModel] | None]:
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    input_model: type[BaseModel] = _NoInput
    takes_ctx = False
    for p in params:
        hint = hints.get(p.name)
        if hint is ToolContext or p.name == "ctx":
            takes_ctx = True
        elif isinstance(hint, type) and issubclass(hint, BaseModel) and input_model is _NoInput:
            input_model = hint
        else:
            raise TypeError(
                f"tool {name!r}: parameter {p.name!r} must be a pydantic model (the input) or "
                "a ToolContext"
            )
    if takes_ctx and params and (hints.get(params[0].name) is ToolContext):
        raise TypeError(f"tool {name!r}: the input comes first, the ToolContext second")
    ret = hints.get("return")
    output_model = ret if isinstance(ret, type) and issubclass(ret, BaseModel) else None
    return input_model, takes_ctx, output_model


_ANY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Any)


def to_json_object(value: Any) -> JsonObject | None:
    """A tool's return value or interrupt metadata as a JSON object, or None if it is not one."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        dumped = _ANY_ADAPTER.dump_python(dict(value), mode="json")
        return dumped if isinstance(dumped, dict) else None
    return None


def output_object(value: Any) -> JsonObject:
    """A tool's return value as the function response Gemini receives."""
    obj = to_json_object(value)
    if obj is not None:
        return obj
    if value is None:
        return {}
    return {"result": _ANY_ADAPTER.dump_python(value, mode="json")}

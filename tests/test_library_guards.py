"""Guards on the private library members the product uses, one test per library.

Each private use in the product carries a comment saying why no public API serves; each test
here exercises what that use relies on (a signature, an attribute and its type, a behaviour) and
fails naming the library, the member and the assumption, so that an upgrade which moves one is
caught here rather than in production. The uses:

- ``temporalio.contrib.workflow_streams`` (``workflows/stream.py``): the handler names of its
  wire protocol and its draining refusal's type (private constants there), and the private flag
  ``WorkflowStream._detaching`` (``ConversationStream.reattach``); and its poll query's wire
  form (``client/stream.py`` reads by it when a conversation's follower places are taken).
- ``temporalio.worker.workflow_sandbox._runner._Instance`` (``worker._CompiledInstance``).
- google-genai's ``Client._api_client`` (``activities.runtime.genai_transport``).
- ``temporalio.contrib.opentelemetry.TracingWorkflowInboundInterceptor._from_context``
  (``workflows/telemetry.py``).
- ``temporalio.client.WithStartWorkflowOperation._workflow_handle`` (``client/api.py``).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import uuid
from typing import Any

import pytest
from google.genai import Client as GenaiClient
from google.genai import types as gt
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.contrib.opentelemetry import TracingWorkflowInboundInterceptor
from temporalio.contrib.workflow_streams import PollInput, PollResult, WorkflowStreamClient
from temporalio.contrib.workflow_streams import _stream as streams_private
from temporalio.contrib.workflow_streams import _types as streams_types
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._runner import _Instance

import temporal_agent_interrupts.worker.plugin as plugin_module
import temporal_agent_interrupts.worker.sandbox as sandbox_module
from temporal_agent_interrupts.activities.runtime import genai_transport, stream_rest
from temporal_agent_interrupts.worker import PASSTHROUGH
from temporal_agent_interrupts.worker.standin import GeminiStandIn, Reply, Request, text
from temporal_agent_interrupts.worker.testing import hosted
from temporal_agent_interrupts.workflows import AgentWorkflow
from temporal_agent_interrupts.workflows.stream import (
    OFFSET_QUERY,
    POLL_UPDATE,
    PUBLISH_SIGNAL,
    STREAM_DRAINING,
    ConversationStream,
    _serialized_size,
    _wire_size,
)
from temporal_agent_interrupts.workflows.types import Message, Part, TurnEvent
from tests.agents import assistant

# ----------------------------------------------------------------------------------------------
# temporalio.contrib.workflow_streams


def test_workflow_stream_names_are_the_ones_the_stream_spells():
    # workflows/stream.py replaces two of the library's handlers and reads a third, by name,
    # and refuses polls with the library's draining type: all private constants there.
    lib = "temporalio.contrib.workflow_streams"
    for ours, theirs, member in (
        (PUBLISH_SIGNAL, streams_private._PUBLISH_SIGNAL, "_stream._PUBLISH_SIGNAL"),
        (POLL_UPDATE, streams_private._POLL, "_stream._POLL"),
        (OFFSET_QUERY, streams_private._OFFSET_QUERY, "_stream._OFFSET_QUERY"),
        (
            STREAM_DRAINING,
            streams_types.STREAM_DRAINING_ERROR_TYPE,
            "_types.STREAM_DRAINING_ERROR_TYPE",
        ),
    ):
        assert ours == theirs, (
            f"{lib}.{member} is now {theirs!r}; workflows/stream.py spells it {ours!r} (the "
            "handlers it replaces or reads, or the refusal the library's subscriber retries)"
        )
    # The library's own client speaks the same names: they are its wire protocol.
    client_source = inspect.getsource(WorkflowStreamClient)
    for name in (PUBLISH_SIGNAL, POLL_UPDATE, OFFSET_QUERY):
        assert f'"{name}"' in client_source, (
            f"{lib}.WorkflowStreamClient no longer uses {name!r}: the stream's wire protocol "
            "changed, and workflows/stream.py follows the old one"
        )
    assert "STREAM_DRAINING_ERROR_TYPE" in client_source, (
        f"{lib}.WorkflowStreamClient no longer retries a {STREAM_DRAINING!r} refusal: followers "
        "refused while a run hands over (ConversationStream._validate_poll) would stop"
    )


@workflow.defn(name="LibraryGuardStream")
class StreamGuardWorkflow:
    """A ConversationStream alone, driven step by step by the test."""

    def __init__(self) -> None:
        self.stream = ConversationStream(None, next_offset=0)
        self.done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update
    def publish(self, texts: list[str]) -> int:
        for t in texts:
            self.stream.publish(TurnEvent(kind="text", turn=1, text=t))
        return self.stream.next_offset

    @workflow.update
    def trim(self, budget: int) -> None:
        self.stream.trim(budget)

    @workflow.update
    def detach(self) -> None:
        self.stream.detach()

    @workflow.update
    def reattach(self) -> None:
        self.stream.reattach()

    @workflow.query
    def observed(self) -> dict[str, Any]:
        # What the library holds, through its public snapshot, beside what ours counts.
        state = self.stream._stream.get_state()
        return {
            "next_offset": self.stream.next_offset,
            "library_end": state.base_offset + len(state.log),
            "base": state.base_offset,
            "ours": list(self.stream._sizes),
            "library": [_wire_size(_serialized_size(i.data), i.topic) for i in state.log],
        }

    @workflow.signal
    def finish(self) -> None:
        self.done = True


async def _poll(handle: Any, offset: int) -> Any:
    return await handle.start_update(
        POLL_UPDATE,
        PollInput(from_offset=offset),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=PollResult,
    )


async def test_workflow_stream_behaves_as_conversation_stream_relies_on(client: Client):
    lib = "temporalio.contrib.workflow_streams.WorkflowStream"
    queue = f"guard-{uuid.uuid4()}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[StreamGuardWorkflow],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            StreamGuardWorkflow.run, id=f"guard-{uuid.uuid4()}", task_queue=queue
        )
        # The offset query (next_offset) and the sizes trim() counts match the library's log:
        # a Payload published goes in as it is, and nothing else enters the log.
        assert await handle.execute_update(StreamGuardWorkflow.publish, ["a", "bb", "ccc"]) == 3
        seen = await handle.query(StreamGuardWorkflow.observed)
        assert seen["next_offset"] == seen["library_end"] == 3, (
            f"{lib}'s {OFFSET_QUERY!r} query (ConversationStream.next_offset) no longer gives "
            f"base_offset + len(log): {seen}"
        )
        assert seen["ours"] == seen["library"], (
            f"{lib}'s log no longer holds, item for item, the Payloads ConversationStream "
            f"published (topic handle publish of a Payload: its zero-copy path): {seen}"
        )
        # trim() truncates to the offset it derives from those sizes.
        await handle.execute_update(StreamGuardWorkflow.trim, seen["ours"][-1])
        seen = await handle.query(StreamGuardWorkflow.observed)
        assert (seen["base"], seen["next_offset"], seen["ours"]) == (2, 3, seen["library"]), (
            f"{lib}.truncate() no longer moves the base to the offset given, keeping offsets: "
            f"{seen}"
        )

        # The poll query (client/stream.py reads by it while the follower places are taken):
        # immediate, from the oldest kept, each item a base64 serialized Payload.
        read = await handle.query(POLL_UPDATE, PollInput(from_offset=0), result_type=PollResult)
        payload = Payload()
        payload.ParseFromString(base64.b64decode(read.items[0].data))
        assert [i.offset for i in read.items] == [2] and b"ccc" in payload.data, (
            f"{lib}'s {POLL_UPDATE!r} query no longer reads the kept items at once, as "
            f"base64 serialized Payloads: {read}"
        )

        # detach(): a waiting follower is released, a new one refused with the draining type.
        waiting = await _poll(handle, 3)
        await handle.execute_update(StreamGuardWorkflow.detach)
        released = await asyncio.wait_for(waiting.result(), 10)
        assert released.items == [], f"{lib}.detach_pollers() no longer releases polls"
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await (await _poll(handle, 3)).result()
        assert getattr(refused.value.cause, "type", None) == STREAM_DRAINING

        # reattach() sets the private _detaching back: the long poll waits for the next item
        # again instead of returning at once, empty, and a follower would spin.
        await handle.execute_update(StreamGuardWorkflow.reattach)
        follower = await _poll(handle, 3)
        waited = asyncio.ensure_future(follower.result())
        done, _ = await asyncio.wait([waited], timeout=1.0)
        assert not done, (
            f"{lib}._detaching: after detach_pollers(), ConversationStream.reattach() sets it "
            "back to False so the long poll waits again; a poll now returned at once "
            f"({waited.result()!r}): the private flag was renamed or changed meaning"
        )
        await handle.execute_update(StreamGuardWorkflow.publish, ["d"])
        result = await asyncio.wait_for(waited, 10)
        assert [i.offset for i in result.items] == [3]
        await handle.signal(StreamGuardWorkflow.finish)
        await handle.result()


# ----------------------------------------------------------------------------------------------
# temporalio.worker.workflow_sandbox._runner._Instance (worker._CompiledInstance)


async def test_sandbox_instance_is_the_one_compiled_instance_extends(client: Client, model):
    lib = "temporalio.worker.workflow_sandbox._runner._Instance"
    init = list(inspect.signature(_Instance.__init__).parameters)
    assert init == ["self", "instance_details", "runner_class", "restrictions"], (
        f"{lib}.__init__ now takes {init}; worker._Runner builds _CompiledInstance(det, "
        "runner_class, restrictions)"
    )
    run_code = inspect.signature(_Instance._run_code).parameters
    assert list(run_code) == ["self", "code", "extra_globals"], (
        f"{lib}._run_code now takes {list(run_code)}; _CompiledInstance overrides "
        "_run_code(code, **extra_globals), passing the code on compiled"
    )

    # The SDK's runner still builds exactly _Instance: else _Runner would replace a class the
    # SDK no longer uses, and drop whatever its new one does.
    made: list[type] = []

    class Recording(SandboxedWorkflowRunner):
        def create_instance(self, det: WorkflowInstanceDetails) -> Any:
            instance = super().create_instance(det)
            made.append(type(instance))
            return instance

    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
    queue = f"guard-{uuid.uuid4()}"
    Worker(
        client,
        task_queue=queue,
        workflows=[AgentWorkflow],
        workflow_runner=Recording(restrictions=restrictions),
    )
    assert made == [_Instance], (
        f"SandboxedWorkflowRunner.create_instance now builds {made}, not {lib}: "
        "worker.sandbox._CompiledInstance extends the old class"
    )

    # In a real conversation, the sandbox execs the same few source strings again and again:
    # what _CompiledInstance compiles once (bench B1: 3.7% of a cycle).
    sandbox_module._compiled.cache_clear()
    model.reply(text("hi"))
    async with hosted(client, agents=[assistant], model=model) as agents:
        chat = await agents.chat("assistant")
        await chat.send("hello")
    info = sandbox_module._compiled.cache_info()
    assert 0 < info.currsize <= 8 and info.hits > info.misses, (
        f"{lib}._run_code no longer gets a few fixed source strings over and over ({info}): "
        "_CompiledInstance saves nothing; remove it, or adapt it"
    )


# ----------------------------------------------------------------------------------------------
# google-genai: Client._api_client (activities.runtime.genai_transport)


def _body(request: Request) -> Reply:
    return Reply(
        chunks=[{"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}}]}]
    )


async def test_genai_transport_sends_our_body_and_shows_retry_options():
    lib = "google-genai Client._api_client"
    plain = GenaiClient(api_key="unused")
    retrying = GenaiClient(
        api_key="unused", http_options=gt.HttpOptions(retry_options=gt.HttpRetryOptions(attempts=3))
    )
    assert genai_transport(plain) is plain.aio._api_client, (
        f"{lib}: the sync and async clients no longer share one transport"
    )
    # worker._reject_sdk_retries reads retry_options from the transport's options.
    options = genai_transport(retrying).get_read_only_http_options()
    assert options.get("retry_options"), (
        f"{lib}.get_read_only_http_options() no longer shows retry_options ({options}): "
        "build_worker would accept a client that retries inside an activity attempt"
    )
    assert not genai_transport(plain).get_read_only_http_options().get("retry_options")
    with pytest.raises(ValueError, match="retry_options"):
        plugin_module._reject_sdk_retries(retrying)

    # stream_rest sends our body as it is and reads each chunk's JSON from response.body.
    params = list(inspect.signature(genai_transport(plain).async_request_streamed).parameters)
    assert params[:3] == ["http_method", "path", "request_dict"], (
        f"{lib}.async_request_streamed now takes {params}; stream_rest passes (method, path, body)"
    )
    with GeminiStandIn(_body) as server:
        gemini = server.client()
        messages = [Message(role="user", parts=[Part(text="hi")])]
        chunks = await stream_rest(gemini, assistant.spec(), messages)
        (sent,) = server.requests
    assert chunks == _body(sent).chunks, (
        f"{lib}.async_request_streamed no longer yields one chunk's JSON per response.body"
    )
    assert json.loads(json.dumps(sent.body))["contents"][0]["parts"] == [{"text": "hi"}]


# ----------------------------------------------------------------------------------------------
# temporalio.contrib.opentelemetry and temporalio.client


def test_tracing_interceptor_from_context_answers_whether_tracing_is_on():
    # workflows/telemetry.py asks it before making a span, so that a worker without tracing
    # makes none (the library's completed_span would fall back to a global tracer, with a
    # DeprecationWarning). The positive answer is covered by tests/test_observability.py
    # (test_one_conversation_is_one_trace_with_names_and_refs_and_no_payloads).
    lib = "temporalio.contrib.opentelemetry.TracingWorkflowInboundInterceptor._from_context"
    member = inspect.getattr_static(TracingWorkflowInboundInterceptor, "_from_context", None)
    assert isinstance(member, staticmethod), f"{lib} is no longer a static method: {member!r}"
    assert not inspect.signature(member).parameters, f"{lib} now takes arguments"
    assert TracingWorkflowInboundInterceptor._from_context() is None, (
        f"{lib}() no longer answers None where no tracing interceptor is in the context"
    )


async def test_with_start_operation_holds_its_handle_in_a_future():
    # client/api.py retrieves a failed start's exception from this future, so that it is not
    # reported "never retrieved" at some later garbage collection.
    lib = "temporalio.client.WithStartWorkflowOperation._workflow_handle"
    start = WithStartWorkflowOperation(
        StreamGuardWorkflow.run,
        id="unused",
        task_queue="unused",
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
    future = getattr(start, "_workflow_handle", None)
    assert isinstance(future, asyncio.Future) and not future.done(), (
        f"{lib} is no longer a pending asyncio.Future: {future!r}"
    )
    future.set_exception(RuntimeError("start failed"))
    with pytest.raises(RuntimeError, match="start failed"):
        await start.workflow_handle()
    assert future.exception() is not None  # what client/api.py does, now retrieved


def test_payload_sizes_are_counted_as_the_library_measures_them():
    # ConversationStream counts an item as the library's poll result measures it (its private
    # _payload_wire_size), with 32 bytes of envelope: trim() and the poll budget rely on it.
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b"x" * 1000)
    theirs = streams_private._payload_wire_size(payload, "events")
    assert _wire_size(payload.ByteSize(), "events") == theirs + 32, (
        "temporalio.contrib.workflow_streams._stream._payload_wire_size measures an item "
        f"differently now ({theirs}): workflows/stream.py's _wire_size follows the old measure"
    )

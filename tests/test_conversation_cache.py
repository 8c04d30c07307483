"""The model activity's conversation cache (activities.history), without a server.

The miss path's query to the workflow is replaced by a stand-in that records what it was asked,
so these tests see exactly when the cache answers and when the workflow would be asked.
"""

from __future__ import annotations

from collections.abc import Sequence

import google.genai as genai
import pytest
from temporalio.exceptions import ApplicationError

from temporal_agent_interrupts.activities import history
from temporal_agent_interrupts.activities.history import Conversation, ConversationCache
from temporal_agent_interrupts.activities.runtime import AgentActivities
from temporal_agent_interrupts.worker.result_keys import resolve_result_keys
from temporal_agent_interrupts.workflows.activity_io import (
    ModelInput,
)
from temporal_agent_interrupts.workflows.history import EMPTY, step
from temporal_agent_interrupts.workflows.types import (
    ErrorKind,
    FunctionCall,
    Message,
    Part,
)

KEYS = resolve_result_keys()  # the suite's (tests/conftest.py)


def user(text: str) -> Message:
    return Message(role="user", parts=[Part(text=text)])


def model_calls(name: str) -> Message:
    return Message(role="model", parts=[Part(function_call=FunctionCall(name=name, args={"n": 1}))])


def digest(messages: Sequence[Message]) -> str:
    d = EMPTY
    for m in messages:
        d = step(d, m)
    return d


def call(chat_id: str, before: Sequence[Message], new: Sequence[Message]) -> ModelInput:
    """The ModelInput the workflow sends when ``before`` were seen and ``new`` were not."""
    return ModelInput(
        agent="a",
        chat_id=chat_id,
        new_from=len(before),
        new_messages=list(new),
        prefix_digest=digest(before),
        history_size=len(before) + len(new),
    )


class Workflow:
    """Stands in for the ``messages`` query: answers with ``messages[:n]`` and records each ask."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = list(messages)
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, chat_id: str, n: int) -> Conversation:
        self.asked.append((chat_id, n))
        return Conversation().plus(self.messages[:n])


@pytest.fixture
def no_query(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail(chat_id: str, n: int) -> Conversation:
        raise AssertionError(f"the cache asked the workflow ({chat_id}, {n})")

    monkeypatch.setattr(history, "_ask_workflow", fail)


def query(monkeypatch: pytest.MonkeyPatch, messages: Sequence[Message]) -> Workflow:
    wf = Workflow(messages)
    monkeypatch.setattr(history, "_ask_workflow", wf)
    return wf


M = [user("hello"), model_calls("act"), user("more"), model_calls("other")]


# ----------------------------------------------------------------------------------------------
# The bound


def test_keeps_at_most_max_chats_evicting_the_least_recently_used():
    cache = ConversationCache(max_chats=2)
    a, b, c = (Conversation().plus([user(x)]) for x in "abc")
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") is a  # a is now the most recently used; b is next out
    cache.put("c", c)
    assert len(cache) == 2
    assert cache.get("b") is None
    assert cache.get("a") is a and cache.get("c") is c
    # Putting a chat it already holds replaces it rather than growing.
    a2 = a.plus([user("again")])
    cache.put("a", a2)
    assert len(cache) == 2 and cache.get("a") is a2
    # c was used before a's put, so it goes first.
    cache.put("d", Conversation())
    assert cache.get("c") is None and cache.get("a") is a2 and cache.get("d") is not None


def test_put_counts_as_use():
    cache = ConversationCache(max_chats=2)
    cache.put("a", Conversation())
    cache.put("b", Conversation())
    cache.put("a", Conversation())  # a again: b is now the oldest
    cache.put("c", Conversation())
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None


@pytest.mark.parametrize("bad", [-1, -1000, 1.5, True, None])
def test_max_chats_must_be_a_non_negative_int(bad):
    with pytest.raises(ValueError, match="max_chats"):
        ConversationCache(max_chats=bad)


def test_keeps_at_most_max_bytes_of_messages_evicting_the_oldest():
    a, b, c = (Conversation().plus([user(x * 1000)]) for x in "abc")
    size = a.bytes
    assert size > 1000 and b.bytes == size
    cache = ConversationCache(max_bytes=2 * size)
    cache.put("a", a)
    cache.put("b", b)
    assert cache.bytes == 2 * size
    cache.put("c", c)
    assert cache.get("a") is None and cache.get("b") is b and cache.get("c") is c
    assert cache.bytes == 2 * size
    # Replacing a chat counts its new size only; a conversation over the bound is not kept.
    cache.put("b", b.plus([user("x" * 5000)]))
    assert cache.get("b") is None and cache.bytes == size
    assert cache.get("c") is c


def test_max_chats_zero_keeps_nothing():
    cache = ConversationCache(max_chats=0)
    cache.put("a", Conversation().plus(M))
    assert len(cache) == 0
    assert cache.get("a") is None
    assert cache.max_chats == 0


# ----------------------------------------------------------------------------------------------
# Hits, misses and refusals


async def test_hit_returns_prefix_plus_new_without_asking_the_workflow(no_query):
    cache = ConversationCache()
    kept = Conversation().plus(M[:3])  # more than the call needs: only the prefix is used
    cache.put("chat", kept)
    conv = await cache.resolve(call("chat", M[:2], [user("new")]))
    assert conv.messages == [*M[:2], user("new")]
    assert conv.rest == [
        [{"text": "hello"}],
        [{"functionCall": {"args": {"n": 1}, "name": "act"}}],
        [{"text": "new"}],
    ]
    assert conv.digests == [EMPTY, digest(M[:1]), digest(M[:2]), digest([*M[:2], user("new")])]
    assert (cache.hits, cache.misses) == (1, 0)
    # The kept conversation is not modified by building on it.
    assert kept.messages == M[:3] and len(kept.rest) == 3


async def test_miss_asks_the_workflow_for_the_prefix(monkeypatch):
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    conv = await cache.resolve(call("chat", M[:3], [M[3]]))
    assert wf.asked == [("chat", 3)]
    assert conv.messages == M
    assert conv.digests[-1] == digest(M)
    assert (cache.hits, cache.misses) == (0, 1)


async def test_kept_conversation_with_another_prefix_is_a_miss(monkeypatch):
    # The worker kept a turn the workflow rolled back: same length, other messages.
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    cache.put("chat", Conversation().plus([M[0], model_calls("rolled back"), M[2]]))
    conv = await cache.resolve(call("chat", M[:2], [M[2]]))
    assert wf.asked == [("chat", 2)]
    assert conv.messages == M[:3]
    assert (cache.hits, cache.misses) == (0, 1)


async def test_kept_conversation_shorter_than_the_prefix_is_a_miss(monkeypatch):
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    cache.put("chat", Conversation().plus(M[:1]))
    conv = await cache.resolve(call("chat", M[:3], [M[3]]))
    assert wf.asked == [("chat", 3)]
    assert conv.messages == M


async def test_another_chat_is_not_used(monkeypatch):
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    cache.put("other", Conversation().plus(M))
    await cache.resolve(call("chat", M[:2], [M[2]]))
    assert wf.asked == [("chat", 2)]


async def test_workflow_answer_with_another_digest_is_conversation_changed(monkeypatch):
    # The workflow moved on (or rolled back) between scheduling the call and the query.
    wf = query(monkeypatch, [M[0], model_calls("something else")])
    cache = ConversationCache()
    with pytest.raises(ApplicationError) as err:
        await cache.resolve(call("chat", M[:2], [M[2]]))
    assert err.value.type == ErrorKind.CONVERSATION_CHANGED
    assert not err.value.non_retryable  # a retry sees the new state
    assert wf.asked == [("chat", 2)]
    assert cache.get("chat") is None


@pytest.mark.parametrize("kept", [True, False], ids=["hit", "miss"])
async def test_wrong_history_size_is_conversation_changed(monkeypatch, kept):
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    if kept:
        cache.put("chat", Conversation().plus(M[:2]))
    inp = call("chat", M[:2], [M[2]]).model_copy(update={"history_size": 4})
    with pytest.raises(ApplicationError, match="rebuilt 3 messages, expected 4") as err:
        await cache.resolve(inp)
    assert err.value.type == ErrorKind.CONVERSATION_CHANGED
    assert wf.asked == ([] if kept else [("chat", 2)])


async def test_first_call_of_a_conversation_never_asks(no_query):
    cache = ConversationCache(max_chats=0)
    conv = await cache.resolve(call("chat", [], M[:1]))
    assert conv.messages == M[:1]
    assert (cache.hits, cache.misses) == (0, 0)


async def test_cache_off_asks_the_workflow_on_every_later_call(monkeypatch):
    wf = query(monkeypatch, M)
    cache = ConversationCache(max_chats=0)
    # What model_call does: resolve, then keep the conversation with the model's reply.
    conv = await cache.resolve(call("chat", [], M[:1]))
    cache.put("chat", conv.plus([M[1]]))
    conv = await cache.resolve(call("chat", M[:2], [M[2]]))
    cache.put("chat", conv.plus([M[3]]))
    assert wf.asked == [("chat", 2)]
    assert len(cache) == 0
    # The same turn again asks again: nothing was kept.
    await cache.resolve(call("chat", M[:2], [M[2]]))
    assert wf.asked == [("chat", 2), ("chat", 2)]
    assert (cache.hits, cache.misses) == (0, 2)


async def test_cache_on_asks_only_once_per_chat(monkeypatch):
    wf = query(monkeypatch, M)
    cache = ConversationCache()
    conv = await cache.resolve(call("chat", M[:2], [M[2]]))  # a new worker: one ask
    cache.put("chat", conv.plus([M[3]]))
    conv = await cache.resolve(call("chat", M, [user("next")]))
    assert wf.asked == [("chat", 2)]
    assert conv.messages == [*M, user("next")]
    assert (cache.hits, cache.misses) == (1, 1)


# ----------------------------------------------------------------------------------------------
# The option on AgentActivities


def test_agent_activities_passes_conversation_cache_through():
    gemini = genai.Client(api_key="unused")
    assert AgentActivities([], gemini=gemini, result_keys=KEYS).conversations.max_chats == 1000
    assert (
        AgentActivities(
            [], gemini=gemini, result_keys=KEYS, conversation_cache=0
        ).conversations.max_chats
        == 0
    )
    with pytest.raises(ValueError, match="max_chats"):
        AgentActivities([], gemini=gemini, result_keys=KEYS, conversation_cache=-1)

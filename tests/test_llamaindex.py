"""fastmem as a LlamaIndex memory block: the ``BaseMemoryBlock`` interface's behaviours
against the real llama-index-core, inside a real ``Memory``, and a chat engine loop with
LlamaIndex's mock LLM (offline) across processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ImageBlock, TextBlock
from llama_index.core.bridge.pydantic import ValidationError
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.memory import BaseMemoryBlock, Memory
from llama_index.core.storage.chat_store.sql import MessageStatus

import fastmem
from fastmem.integrations.llamaindex import MAX_MESSAGE_BYTES, FastmemMemoryBlock

SOURCE = os.path.dirname(os.path.dirname(fastmem.__file__))
ENV = {**os.environ, "PYTHONPATH": SOURCE}


@pytest.fixture(autouse=True)
def backend():
    """The block exercises no kernel of its own: one run, on the default kernels, not one
    per backend as tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "memories")


def run(coro):
    return asyncio.run(coro)


def msg(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=role, content=text)


def memories_in(root: str, namespace: str) -> list[fastmem.Memory]:
    with fastmem.open(root, namespace=namespace, embedder=None) as store:
        return list(store)


async def dispose(memory: Memory) -> None:
    """Close the connections of Memory's default chat store (an in-memory SQLite database
    through aiosqlite), which warns when they are collected open."""
    engine = memory.sql_store._async_engine
    if engine is not None:
        await engine.dispose()


def small_memory(block: FastmemMemoryBlock, session_id: str = "chat-1") -> Memory:
    """A Memory whose chat history holds ~40 tokens, so that a few turns flush to the block."""
    return Memory.from_defaults(
        session_id=session_id, token_limit=80, chat_history_token_ratio=0.5,
        token_flush_size=10, memory_blocks=[block],
    )  # fmt: skip


# --- the interface, behaviour by behaviour -------------------------------------------------


def test_is_a_memory_block_with_every_abstract_method(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    assert isinstance(block, BaseMemoryBlock)
    assert not getattr(FastmemMemoryBlock, "__abstractmethods__", None)
    assert block.name == "fastmem" and block.priority == 0 and block.accept_short_term_memory
    memory = Memory.from_defaults(memory_blocks=[block])
    assert memory.memory_blocks == [block]
    run(dispose(memory))


def test_put_stores_one_memory_per_message_in_order_with_role_and_session(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    image = ImageBlock(url="https://example.invalid/cat.png")
    messages = [
        msg("user", "My cat is called Tom."),
        msg("assistant", "Nice name!"),
        ChatMessage(role="user", blocks=[image]),  # no text: skipped
        ChatMessage(role="user", blocks=[TextBlock(text="Look:"), image]),  # its text kept
        msg("tool", '{"weather": "sunny"}'),
        msg("assistant", "   "),  # blank: skipped
    ]
    run(block.aput(messages, session_id="chat-1"))
    block.close()
    stored = memories_in(root, "alice")
    assert [m.text for m in stored] == [
        "user: My cat is called Tom.", "assistant: Nice name!", "user: Look:",
        'tool: {"weather": "sunny"}',
    ]  # fmt: skip
    assert {m.session for m in stored} == {"chat-1"}
    assert [m.metadata["role"] for m in stored] == ["user", "assistant", "user", "tool"]
    assert [m.type for m in stored] == ["conversation"] * 3 + ["tool_result"]


def test_put_of_short_term_messages_honours_accept_short_term_memory(root):
    block = FastmemMemoryBlock(path=root, namespace="alice", accept_short_term_memory=False)
    run(block.aput([msg("user", "flushed")], from_short_term_memory=True, session_id="s"))
    run(block.aput([msg("user", "put directly")], session_id="s"))
    block.close()
    assert [m.text for m in memories_in(root, "alice")] == ["user: put directly"]


def test_get_returns_the_context_for_the_latest_user_message(root):
    block = FastmemMemoryBlock(path=root, namespace="alice", budget=60)

    async def main():
        await block.aput([msg("user", "My cat is called Tom."), msg("assistant", "Noted.")])
        await block.aput([msg("user", "My favourite colour is teal."), msg("assistant", "Ok.")])
        await block.aput([msg("user", f"Remark {i} about the weather.") for i in range(6)])
        empty = await block.aget([])
        content = await block.aget(
            [msg("user", "What is my favourite colour?"), msg("assistant", "Teal."),
             msg("user", "And what is my cat called?")],
            session_id="chat-2",
        )  # fmt: skip
        block.close()
        return empty, content

    empty, content = run(main())
    assert "Tom" in content
    assert isinstance(empty, str)  # no question: the pinned and newest memories


def test_get_on_an_empty_store_returns_nothing_and_memory_adds_no_block(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    memory = Memory.from_defaults(memory_blocks=[block])

    async def main():
        content = await block.aget([msg("user", "hello?")])
        await memory.aput(msg("user", "hello?"))
        messages = await memory.aget()
        block.close()
        await dispose(memory)
        return content, messages

    content, messages = run(main())
    assert content == ""
    assert [m.role for m in messages] == [MessageRole.USER]


def test_inside_memory_flushed_messages_come_back_in_the_system_message(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    memory = small_memory(block)

    async def main():
        await memory.aput(msg("user", "My cat is called Tom."))
        await memory.aput(msg("assistant", "What a nice name."))
        for i in range(5):
            await memory.aput(msg("user", f"Tell me about topic number {i}, please."))
            await memory.aput(msg("assistant", f"Topic {i} is interesting."))
        await memory.aput(msg("user", "What is my cat called?"))
        active = await memory.aget_all(status=MessageStatus.ACTIVE)
        messages = await memory.aget()
        block.close()
        await dispose(memory)
        return active, messages

    active, messages = run(main())
    assert "My cat is called Tom." not in [m.content for m in active]  # flushed
    assert messages[0].role == MessageRole.SYSTEM
    assert "<fastmem>" in messages[0].content
    assert "user: My cat is called Tom." in messages[0].content
    stored = memories_in(root, "alice")
    assert stored[0].text == "user: My cat is called Tom." and stored[0].session == "chat-1"


def test_memorys_sync_methods_work_too(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    memory = small_memory(block)
    memory.put(msg("user", "My cat is called Tom."))
    for i in range(5):
        memory.put(msg("user", f"Tell me about topic number {i}, please."))
    memory.put(msg("user", "What is my cat called?"))
    messages = memory.get()  # each sync call runs its own event loop
    block.close()
    run(dispose(memory))
    assert "Tom" in messages[0].content


def test_unicode_is_kept_exactly_and_found(root):
    phrase = "Ünïcödé: 猫の名前はタマ — שלום 🐈‍⬛ naïve café"
    block = FastmemMemoryBlock(path=root, namespace="alice")

    async def main():
        await block.aput([msg("user", phrase)])
        content = await block.aget([msg("user", "タマ 🐈‍⬛ café")])
        block.close()
        return content

    assert phrase in run(main())
    assert memories_in(root, "alice")[0].text == f"user: {phrase}"


def test_huge_messages_are_cut_to_fastmems_limit_and_empty_puts_do_nothing(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    huge = "ß" * MAX_MESSAGE_BYTES  # 2 MiB of UTF-8
    run(block.aput([msg("user", huge), msg("assistant", "That was long.")]))
    run(block.aput([]))
    block.close()
    stored = memories_in(root, "alice")
    assert len(stored) == 2 and stored[1].text == "assistant: That was long."
    assert len(stored[0].text.encode()) <= MAX_MESSAGE_BYTES
    assert stored[0].text.startswith("user: ßß") and set(stored[0].text[6:]) == {"ß"}


@pytest.mark.parametrize(
    "bad",
    [
        "a string",
        [msg("user", "fine"), "not a message"],
        [msg("user", "fine"), {"role": "user", "content": "a dict"}],
    ],
)
def test_bad_puts_are_refused_and_write_nothing(root, bad):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    run(block.aput([msg("user", "before")]))
    with pytest.raises(TypeError) as raised:
        run(block.aput(bad, from_short_term_memory=True, session_id="chat-1"))  # as Memory does
    with pytest.raises(TypeError):
        run(block._aput(bad))
    block.close()
    assert isinstance(raised.value, fastmem.FastmemError)
    assert [m.text for m in memories_in(root, "alice")] == ["user: before"]


def test_bad_settings_are_refused_with_pydantics_errors(root):
    store = fastmem.open(root, namespace="alice")
    try:
        for bad in (
            {},  # neither path nor store
            {"path": root, "store": store},
            {"store": store, "namespace": "alice"},
            {"path": root, "namespace": "Not/Valid"},
            {"path": root, "budget": 0},
            {"path": root, "type": ""},
            {"path": 42},
            {"store": "not a store"},
        ):
            with pytest.raises(ValidationError):
                FastmemMemoryBlock(**bad)
    finally:
        store.close()


def test_truncation_repacks_the_context_to_fewer_tokens(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")

    async def main():
        facts = [msg("user", f"Fact number {i}: the code word is word{i}.") for i in range(30)]
        await block.aput(facts)
        content = await block.aget([msg("user", "What is the code word of fact 7?")])
        shorter = await block.atruncate(content, 40)
        gone = await block.atruncate(content, 10**6)
        foreign = await block.atruncate("some other text", 5)
        block.close()
        return content, shorter, gone, foreign

    content, shorter, gone, foreign = run(main())
    counter = fastmem.tokens.TokenCounter("cl100k_base")
    assert shorter and counter.count(shorter) <= counter.count(content) - 40
    assert gone is None and foreign is None


def test_close_releases_its_own_store_and_a_later_call_reopens_it(root):
    block = FastmemMemoryBlock(path=root, namespace="alice")
    run(block.aput([msg("user", "kept across close")]))
    run(block.aclose())
    block.close()  # idempotent
    assert "kept across close" in run(block.aget([msg("user", "kept")]))
    block.close()


def test_a_store_passed_in_is_used_and_left_open(root):
    store = fastmem.open(root, namespace="alice")
    try:
        block = FastmemMemoryBlock(store=store)
        run(block.aput([msg("user", "through the given store")]))
        block.close()
        assert [m.text for m in store] == ["user: through the given store"]  # still open
    finally:
        store.close()


def test_every_store_call_runs_off_the_event_loop(root):
    store = fastmem.open(root, namespace="alice")
    threads: dict[str, set[int]] = {}
    for name in ("add_many", "context"):
        method = getattr(store, name)

        def spy(*args, _method=method, _name=name, **kwargs):
            threads.setdefault(_name, set()).add(threading.get_ident())
            return _method(*args, **kwargs)

        setattr(store, name, spy)  # instance attributes shadow the methods
    try:
        block = FastmemMemoryBlock(store=store)

        async def main():
            await block.aput([msg("user", "My cat is called Tom.")])
            content = await block.aget([msg("user", "my cat?")])
            await block.atruncate(content, 3)
            return threading.get_ident()

        loop_thread = run(main())
    finally:
        store.close()
    assert set(threads) == {"add_many", "context"} and len(threads["context"]) >= 1
    assert all(loop_thread not in ids for ids in threads.values())


# --- a real chat loop, across processes -----------------------------------------------------

CHAT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.llms import ChatMessage
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.llms.mock import (
        MockFunctionCallingLLMWithChatMemoryOfLastCall, MockLLMWithChatMemoryOfLastCall,
    )
    from llama_index.core.memory import Memory
    from fastmem.integrations.llamaindex import FastmemMemoryBlock

    root, user, action, payload = sys.argv[1:5]

    async def main():
        block = FastmemMemoryBlock(path=root, namespace=user)
        if action == "put-many":
            for i in range(int(payload)):
                await block.aput([ChatMessage(role="user", content=f"{user} note {i}")])
            block.close()
            return
        memory = Memory.from_defaults(
            session_id=f"{user}-{action}", token_limit=80, chat_history_token_ratio=0.5,
            token_flush_size=10, memory_blocks=[block],
        )
        if action == "agent":  # LlamaIndex's agent, on its mock function-calling model
            llm = MockFunctionCallingLLMWithChatMemoryOfLastCall()
            agent = FunctionAgent(llm=llm, tools=[])
            for turn in json.loads(payload):
                await agent.run(turn, memory=memory)
        else:
            llm = MockLLMWithChatMemoryOfLastCall(max_tokens=2)  # answers "text text"
            engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
            for turn in json.loads(payload):
                await engine.achat(turn)
        block.close()
        print(json.dumps([[m.role.value, m.content] for m in llm.last_chat_messages]))

    asyncio.run(main())
    """
)


def chat_process(tmp_path, *args: str) -> list[list[str]]:
    script = tmp_path / "chat.py"
    script.write_text(CHAT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
        check=False, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else []


def system_text(messages: list[list[str]]) -> str:
    return "\n".join(content for role, content in messages if role == "system")


def told(fact: str) -> str:
    """A conversation that tells ``fact``, then talks long enough for Memory to flush it."""
    turns = [fact] + [f"Let us talk about subject number {i} for a while." for i in range(5)]
    return json.dumps(turns)


def test_a_fact_told_in_one_process_is_in_the_model_input_after_a_restart(tmp_path, root):
    chat_process(tmp_path, root, "alice", "first", told("My flight is KL1234 today."))
    assert "user: My flight is KL1234 today." in [m.text for m in memories_in(root, "alice")]
    sent = chat_process(tmp_path, root, "alice", "second", json.dumps(["Which flight am I on?"]))
    assert "KL1234" in system_text(sent)
    assert ["user", "Which flight am I on?"] in sent


def test_a_function_agent_in_a_new_process_gets_the_fact_in_its_input(tmp_path, root):
    chat_process(tmp_path, root, "alice", "first", told("My dentist is Dr Okafor."))
    sent = chat_process(tmp_path, root, "alice", "agent", json.dumps(["Who is my dentist?"]))
    assert "Okafor" in system_text(sent)
    assert ["user", "Who is my dentist?"] in sent


def test_two_users_never_see_each_others_memories(tmp_path, root):
    chat_process(tmp_path, root, "alice", "first", told("My locker code is 4417."))
    chat_process(tmp_path, root, "bob", "first", told("My locker code is 9902."))
    ask = json.dumps(["What is my locker code?"])
    alice = system_text(chat_process(tmp_path, root, "alice", "second", ask))
    bob = system_text(chat_process(tmp_path, root, "bob", "second", ask))
    assert "4417" in alice and "9902" not in alice
    assert "9902" in bob and "4417" not in bob


def test_two_processes_writing_one_store_at_once_lose_nothing(tmp_path, root):
    script = tmp_path / "chat.py"
    script.write_text(CHAT_SCRIPT)
    per_process = 150
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), root, "shared", "put-many", str(per_process)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    texts = [m.text for m in memories_in(root, "shared")]
    assert len(texts) == 2 * per_process
    assert all(texts.count(f"user: shared note {i}") == 2 for i in range(per_process))


def test_one_store_serves_both_frameworks(root):
    """What an AutoGen agent's memory added, a LlamaIndex chat of the same user recalls
    (the same namespace is the same store), and the other way round."""
    pytest.importorskip("autogen_core")
    from autogen_core.memory import MemoryContent

    from fastmem.integrations.autogen import FastmemMemory

    async def main():
        autogen = FastmemMemory(root, namespace="alice")
        fact = MemoryContent(content="Alice's cat is called Tom.", mime_type="text/plain")
        await autogen.add(fact)
        block = FastmemMemoryBlock(path=root, namespace="alice")
        await block.aput([msg("user", "My flight is KL1234 today.")])
        recalled = await block.aget([msg("user", "What is my cat called?")])
        found = await autogen.query("flight KL1234")
        await autogen.close()
        block.close()
        return recalled, [r.content for r in found.results]

    recalled, found = run(main())
    assert "Alice's cat is called Tom." in recalled
    assert found[0] == "user: My flight is KL1234 today."

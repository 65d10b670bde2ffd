"""fastmem as an AutoGen memory: the ``Memory`` interface's behaviours against the real
autogen-core, and a real ``AssistantAgent`` loop with AutoGen's replay model (offline)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("autogen_core")
pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.replay")

from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken, Image
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import AssistantMessage, SystemMessage, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

import fastmem
from fastmem.integrations.autogen import HEADER, FastmemMemory

TEXT, MARKDOWN, JSON = MemoryMimeType.TEXT, MemoryMimeType.MARKDOWN, MemoryMimeType.JSON
# The fastmem being tested, for the agents' processes (the venv may hold another copy).
SOURCE = os.path.dirname(os.path.dirname(fastmem.__file__))


@pytest.fixture(autouse=True)
def backend():
    """The adapter exercises no kernel of its own: one run, on the default kernels, not one
    per backend as tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


def run(coro):
    return asyncio.run(coro)


def user(content: str) -> UserMessage:
    return UserMessage(content=content, source="user")


def text(content: str, **metadata) -> MemoryContent:
    return MemoryContent(content=content, mime_type=TEXT, metadata=metadata or None)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "memories")


def memories_in(root: str, namespace: str) -> list[fastmem.Memory]:
    with fastmem.open(root, namespace=namespace, embedder=None) as store:
        return list(store)


# --- the interface, behaviour by behaviour -------------------------------------------------


def test_is_an_autogen_memory_with_every_abstract_method(root):
    memory = FastmemMemory(root, namespace="alice")
    assert isinstance(memory, Memory)
    assert not getattr(FastmemMemory, "__abstractmethods__", None)
    assert memory.name == "fastmem" and memory.store is None  # opened at the first call


def test_add_then_query_ranks_the_match_first_and_keeps_metadata(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text("The user's cat is called Tom.", category="pets"))
        await memory.add(text("The user works as a nurse in Porto.", category="work"))
        await memory.add(text("The user prefers tea to coffee."))
        result = await memory.query("What is the name of my cat?")
        await memory.close()
        return result.results

    results = run(main())
    assert results[0].content == "The user's cat is called Tom."
    assert results[0].mime_type == TEXT
    assert results[0].metadata["category"] == "pets"
    assert results[0].metadata["id"].startswith("m") and results[0].metadata["score"] == 1.0
    assert [r.metadata["score"] for r in results] == sorted(
        (r.metadata["score"] for r in results), reverse=True
    )


def test_empty_query_returns_the_k_newest_in_chronological_order(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice", k=3)
        for i in range(5):
            await memory.add(text(f"note number {i}"))
        everything = await memory.query()
        two = await memory.query("", k=2)
        await memory.close()
        return [r.content for r in everything.results], [r.content for r in two.results]

    everything, two = run(main())
    assert everything == ["note number 2", "note number 3", "note number 4"]
    assert two == ["note number 3", "note number 4"]


def test_query_keywords_k_and_filters_reach_the_search(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice", session="monday")
        other = FastmemMemory(root, namespace="alice", session="tuesday")
        for i in range(4):
            await memory.add(text(f"monday meeting note {i}"))
            await other.add(text(f"tuesday meeting note {i}"))
        one = await memory.query("meeting note", k=1)
        tuesday = await memory.query("meeting note", k=10, session="tuesday")
        await memory.close()
        await other.close()
        return one.results, tuesday.results

    one, tuesday = run(main())
    assert len(one) == 1
    assert len(tuesday) == 4 and all(r.content.startswith("tuesday") for r in tuesday)


def test_markdown_json_and_other_text_types_round_trip(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(MemoryContent(content="# Plan\n- buy **milk**", mime_type=MARKDOWN))
        await memory.add(MemoryContent(content={"city": "Lisbon", "zip": 1100}, mime_type=JSON))
        await memory.add(MemoryContent(content="a,b\n1,2", mime_type="text/csv"))
        results = (await memory.query()).results
        asked = MemoryContent(content={"city": "Lisbon"}, mime_type=JSON)
        by_json = (await memory.query(asked)).results
        await memory.close()
        return results, by_json

    results, by_json = run(main())
    assert [(r.content, r.mime_type) for r in results] == [
        ("# Plan\n- buy **milk**", MARKDOWN),
        ({"city": "Lisbon", "zip": 1100}, JSON),
        ("a,b\n1,2", "text/csv"),
    ]
    assert by_json[0].content == {"city": "Lisbon", "zip": 1100}


def test_unicode_is_kept_exactly_and_found(root):
    phrase = "Ünïcödé: 猫の名前はタマ — שלום 🐈‍⬛ naïve café"

    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text(phrase, note="ß→ss ✓"))
        found = (await memory.query("タマ 🐈‍⬛ café")).results
        await memory.close()
        return found

    found = run(main())
    assert found[0].content == phrase and found[0].metadata["note"] == "ß→ss ✓"


def test_huge_content_up_to_fastmems_limit_is_stored_and_beyond_it_refused(root):
    largest = ("Großes Dokument. " * 70_000)[: (1 << 20) // 2]  # ~1 MiB of UTF-8 (ß is 2 bytes)
    largest += "x" * ((1 << 20) - len(largest.encode()))
    assert len(largest.encode()) == 1 << 20

    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text(largest))
        with pytest.raises(fastmem.InvalidInputError):
            await memory.add(text(largest + "y"))
        results = (await memory.query()).results
        await memory.close()
        return results

    results = run(main())
    assert len(results) == 1 and results[0].content == largest


@pytest.mark.parametrize(
    "bad, error",
    [
        (MemoryContent(content="", mime_type=TEXT), ValueError),  # fastmem stores no empty memory
        (MemoryContent(content=b"\x00\x01", mime_type=MemoryMimeType.BINARY), ValueError),
        (MemoryContent(content=b"bytes", mime_type=TEXT), TypeError),
        (MemoryContent(content="not a dict", mime_type=JSON), TypeError),
        (MemoryContent(content={"f": {1, 2}}, mime_type=JSON), ValueError),
        (MemoryContent(content="x", mime_type=TEXT, metadata={"mime_type": "x"}), ValueError),
        (MemoryContent(content="x", mime_type=TEXT, metadata={"obj": object()}), ValueError),
        ("a plain string", TypeError),
    ],
)
def test_bad_content_is_refused_and_writes_nothing(root, bad, error):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        with pytest.raises(error) as raised:
            await memory.add(bad)
        await memory.close()
        return raised.value

    raised = run(main())
    assert isinstance(raised, fastmem.FastmemError)
    assert memories_in(root, "alice") == []


def test_image_content_is_refused(root):
    image = Image.from_base64(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
        "RU5ErkJggg=="
    )

    async def main():
        memory = FastmemMemory(root, namespace="alice")
        with pytest.raises(ValueError, match="mime type"):
            await memory.add(MemoryContent(content=image, mime_type=MemoryMimeType.IMAGE))
        with pytest.raises(ValueError, match="image"):
            await memory.query(MemoryContent(content=image, mime_type=MemoryMimeType.IMAGE))
        await memory.close()

    run(main())
    assert memories_in(root, "alice") == []


def test_bad_queries_and_arguments_are_refused(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text("something"))
        with pytest.raises(TypeError):
            await memory.query(42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown query keywords"):
            await memory.query("x", top_k=3)
        with pytest.raises(ValueError):
            await memory.query("x", k=0)
        with pytest.raises(ValueError, match="need a query text"):
            await memory.query("", session="s")
        with pytest.raises(TypeError, match="ChatCompletionContext"):
            await memory.update_context([user("a list, not a model context")])
        await memory.close()

    run(main())
    with pytest.raises(ValueError):
        FastmemMemory(str(root), namespace="Not/Valid")
    with pytest.raises(ValueError):
        FastmemMemory(str(root), budget=0)
    with pytest.raises(TypeError):
        FastmemMemory(42)  # type: ignore[arg-type]


def test_clear_forgets_everything_of_its_namespace_and_nothing_else(root):
    async def main():
        alice = FastmemMemory(root, namespace="alice")
        bob = FastmemMemory(root, namespace="bob")
        await alice.add(text("alice's first note"))
        await alice.add(text("alice's second note"))
        await bob.add(text("bob's note"))
        alice.store.pin((await alice.query()).results[0].metadata["id"])  # pinned ones go too
        await alice.clear()
        after = (await alice.query()).results, (await alice.query("note")).results
        await alice.add(text("alice after the clear"))
        again = (await alice.query()).results
        bobs = (await bob.query()).results
        await alice.close()
        await bob.close()
        return after, again, bobs

    after, again, bobs = run(main())
    assert after == ([], [])
    assert [r.content for r in again] == ["alice after the clear"]
    assert [r.content for r in bobs] == ["bob's note"]


def test_close_releases_its_own_store_and_a_later_call_reopens_it(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text("kept across close"))
        store = memory.store
        await memory.close()
        closed = store._engine.closed  # the handle this memory opened is closed
        await memory.close()  # idempotent
        reopened = (await memory.query()).results
        await memory.close()
        return closed, reopened

    closed, reopened = run(main())
    assert closed is True
    assert [r.content for r in reopened] == ["kept across close"]


def test_a_store_passed_in_is_used_and_left_open(root):
    store = fastmem.open(root, namespace="alice")
    try:
        memory = FastmemMemory(store)

        async def main():
            await memory.add(text("through the given store"))
            await memory.close()

        run(main())
        assert [m.text for m in store] == ["through the given store"]  # still open
        with pytest.raises(ValueError):
            FastmemMemory(store, namespace="bob")
    finally:
        store.close()


def test_a_cancelled_token_cancels_before_anything_is_written(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        token = CancellationToken()
        token.cancel()
        with pytest.raises(asyncio.CancelledError):
            await memory.add(text("never written"), cancellation_token=token)
        with pytest.raises(asyncio.CancelledError):
            await memory.query("anything", cancellation_token=token)
        await memory.close()

    run(main())
    assert memories_in(root, "alice") == []


def test_every_store_call_runs_off_the_event_loop(root):
    store = fastmem.open(root, namespace="alice")
    threads: dict[str, set[int]] = {}
    for name in ("add", "search", "recent", "context", "forget_many"):
        method = getattr(store, name)

        def spy(*args, _method=method, _name=name, **kwargs):
            threads.setdefault(_name, set()).add(threading.get_ident())
            return _method(*args, **kwargs)

        setattr(store, name, spy)  # instance attributes shadow the methods
    try:
        memory = FastmemMemory(store, remember_user_messages=True)

        async def main():
            loop_thread = threading.get_ident()
            await memory.add(text("The user's cat is called Tom."))
            await memory.query("cat")
            await memory.query()
            context = UnboundedChatCompletionContext([user("my cat?")])
            await memory.update_context(context)
            await memory.clear()
            return loop_thread

        loop_thread = run(main())
    finally:
        store.close()
    assert set(threads) == {"add", "search", "recent", "context", "forget_many"}
    assert all(loop_thread not in ids for ids in threads.values())


def test_update_context_adds_the_packed_context_for_the_latest_user_message(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice", budget=40)
        await memory.add(text("The user's cat is called Tom."))
        await memory.add(text("The user's favourite colour is teal."))
        for i in range(6):  # newer memories, so the two facts are not the newest
            await memory.add(text(f"Unrelated remark number {i} about the weather today."))
        context = UnboundedChatCompletionContext(
            [
                UserMessage(content="What is my favourite colour?", source="user"),
                AssistantMessage(content="Teal.", source="assistant"),
                UserMessage(content="And what is my cat called?", source="user"),
            ]
        )
        result = await memory.update_context(context)
        messages = await context.get_messages()
        await memory.close()
        return result, messages

    result, messages = run(main())
    added = messages[-1]
    assert len(messages) == 4 and isinstance(added, SystemMessage)
    assert added.content.startswith(HEADER) and "Tom" in added.content
    best = max(result.memories.results, key=lambda r: r.metadata["score"])
    assert best.content == "The user's cat is called Tom."  # the latest question's match
    assert best.metadata["level"] == "found" and best.metadata["type"] == "fact"
    assert best.metadata["id"].startswith("m") and best.metadata["summary"] is False


def test_update_context_on_an_empty_store_or_without_messages_adds_nothing(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice")
        empty = UnboundedChatCompletionContext()
        result = await memory.update_context(empty)
        asked = UnboundedChatCompletionContext([user("hello?")])
        result2 = await memory.update_context(asked)
        await memory.close()
        return result, await empty.get_messages(), result2, await asked.get_messages()

    result, messages, result2, messages2 = run(main())
    assert result.memories.results == [] and messages == []
    assert result2.memories.results == [] and len(messages2) == 1


def test_remember_user_messages_stores_each_new_user_message_once(root):
    async def main():
        memory = FastmemMemory(root, namespace="alice", remember_user_messages=True, session="s1")
        context = UnboundedChatCompletionContext([user("My dog is Rex.")])
        first = await memory.update_context(context)
        await memory.update_context(context)  # same latest message: not stored again
        await context.add_message(user("I live in Oslo."))
        second = await memory.update_context(context)
        stored = (await memory.query()).results
        await memory.close()
        return first, second, stored

    first, second, stored = run(main())
    assert [r.content for r in stored] == ["user: My dog is Rex.", "user: I live in Oslo."]
    assert first.memories.results == []  # its own message is left out of its context
    assert [r.content for r in second.memories.results] == ["user: My dog is Rex."]


def test_a_remembered_message_too_long_for_one_memory_is_cut_not_refused(root):
    pasted = "Über " * 300_000  # 1.8 MB of UTF-8

    async def main():
        memory = FastmemMemory(root, namespace="alice", remember_user_messages=True)
        context = UnboundedChatCompletionContext([user(pasted)])
        await memory.update_context(context)
        await memory.close()

    run(main())
    [stored] = memories_in(root, "alice")
    assert len(stored.text.encode()) <= 1 << 20 and stored.text.startswith("user: Über Über")


def test_component_config_round_trips(root):
    memory = FastmemMemory(root, namespace="alice", name="prefs", session="s", budget=800, k=7)
    model = memory.dump_component()
    assert model.provider == "fastmem.integrations.autogen.FastmemMemory"
    assert model.component_type == "memory"
    loaded = Memory.load_component(json.loads(model.model_dump_json()))
    assert isinstance(loaded, FastmemMemory)
    assert loaded.dump_component().config == model.config
    assert model.config["namespace"] == "alice" and model.config["budget"] == 800

    agent = AssistantAgent(
        "assistant", model_client=ReplayChatCompletionClient(["ok"]), memory=[memory]
    )
    assert agent.dump_component().config["memory"][0]["config"]["path"] == root


# --- a real agent loop, across processes ------------------------------------------------------

AGENT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.memory import MemoryContent
    from autogen_ext.models.replay import ReplayChatCompletionClient
    from fastmem.integrations.autogen import FastmemMemory

    root, user, action, payload = sys.argv[1:5]

    async def main():
        memory = FastmemMemory(root, namespace=user, remember_user_messages=True)
        if action == "add":
            await memory.add(MemoryContent(content=payload, mime_type="text/plain"))
            await memory.close()
            return
        if action == "add-many":
            for i in range(int(payload)):
                await memory.add(MemoryContent(content=f"{user} note {i}", mime_type="text/plain"))
            await memory.close()
            return
        client = ReplayChatCompletionClient(["Noted."])
        agent = AssistantAgent("assistant", model_client=client, memory=[memory])
        await agent.run(task=payload)
        await memory.close()
        sent = client.create_calls[0]["messages"]
        print(json.dumps([[type(m).__name__, str(m.content)] for m in sent]))

    asyncio.run(main())
    """
)


ENV = {**os.environ, "PYTHONPATH": SOURCE}


def agent_process(tmp_path, *args: str) -> list[list[str]]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
        check=False, env=ENV,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else []


def system_text(messages: list[list[str]]) -> str:
    return "\n".join(content for kind, content in messages if kind == "SystemMessage")


def test_a_fact_added_in_one_process_is_in_the_model_input_after_a_restart(tmp_path, root):
    agent_process(tmp_path, root, "alice", "add", "The user's cat is called Tom.")
    sent = agent_process(tmp_path, root, "alice", "ask", "What is my cat called?")
    assert "Tom" in system_text(sent) and HEADER in system_text(sent)
    assert ["UserMessage", "What is my cat called?"] in sent


def test_a_fact_told_to_the_agent_is_in_the_model_input_in_a_new_process(tmp_path, root):
    first = agent_process(tmp_path, root, "alice", "ask", "Remember: my flight is KL1234 today.")
    assert "KL1234" not in system_text(first)  # nothing was known yet
    sent = agent_process(tmp_path, root, "alice", "ask", "Which flight am I on?")
    assert "KL1234" in system_text(sent)


def test_two_users_never_see_each_others_memories(tmp_path, root):
    agent_process(tmp_path, root, "alice", "ask", "My locker code is 4417.")
    agent_process(tmp_path, root, "bob", "add", "Bob's locker code is 9902.")
    bob = agent_process(tmp_path, root, "bob", "ask", "What is my locker code?")
    alice = agent_process(tmp_path, root, "alice", "ask", "What is my locker code?")
    assert "9902" in system_text(bob) and "4417" not in system_text(bob)
    assert "4417" in system_text(alice) and "9902" not in system_text(alice)


def test_two_processes_writing_one_store_at_once_lose_nothing(tmp_path, root):
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    per_process = 150
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), root, "shared", "add-many", str(per_process)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    texts = [m.text for m in memories_in(root, "shared")]
    assert len(texts) == 2 * per_process
    assert sorted(set(texts)) == sorted(f"shared note {i}" for i in range(per_process))
    assert all(texts.count(f"shared note {i}") == 2 for i in range(per_process))


def test_run_from_a_running_loop_does_not_block_it(root):
    """A context that waits on the writer lock held elsewhere leaves the loop free: a
    ticker on the same loop keeps ticking while update_context waits."""

    async def main():
        memory = FastmemMemory(root, namespace="alice")
        await memory.add(text("The user's cat is called Tom."))
        store = memory.store
        original = store.context
        release = threading.Event()

        def slow_context(*args, **kwargs):
            release.wait(5)  # stands for a context that takes long
            return original(*args, **kwargs)

        store.context = slow_context
        ticks = 0

        async def ticker():
            nonlocal ticks
            while not release.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        async def releaser():
            await asyncio.sleep(0.3)
            release.set()

        context = UnboundedChatCompletionContext([user("cat?")])
        await asyncio.gather(memory.update_context(context), ticker(), releaser())
        await memory.close()
        return ticks

    assert run(main()) >= 10


def test_one_memory_serves_one_event_loop_after_another(root):
    """Sync code drives async APIs with asyncio.run, one loop per call: a memory opened
    by calls racing on one loop must open and close again on the next loop."""
    memory = FastmemMemory(root, namespace="alice")

    async def many_calls():
        await asyncio.gather(*(memory.query("anything") for _ in range(4)))
        await memory.close()

    run(many_calls())
    run(many_calls())  # a lock bound to the first loop would refuse this one
    assert memory.store is None


def test_with_the_embedding_model_a_fact_is_found_by_meaning(root):
    """No word of the question is in the fact: the vector side of the hybrid ranking finds
    it (the other tests run keyword-only, as tests/conftest.py sets FASTMEM_EMBEDDER)."""
    import fastmem.embed

    store = fastmem.open(root, namespace="alice", embedder=fastmem.embed.default_embedder())
    try:
        memory = FastmemMemory(store, budget=60)

        async def main():
            await memory.add(text("The user's cat is called Tom."))
            for i in range(8):
                await memory.add(text(f"Quarterly report number {i} is due on a Friday."))
            results = (await memory.query("Which pet do I own?", k=1)).results
            context = UnboundedChatCompletionContext([user("Which pet do I own?")])
            await memory.update_context(context)
            return results, (await context.get_messages())[-1].content

        results, added = run(main())
    finally:
        store.close()
    assert results[0].content == "The user's cat is called Tom."
    assert "Tom" in added

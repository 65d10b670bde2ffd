"""fastmem.integrations.openai_agents against the installed OpenAI Agents SDK: the Session
interface's behaviours one by one (side by side with the SDK's own SQLiteSession), a real
agent loop through ``Runner`` with a scripted offline model, restarts in new processes,
isolation, and processes writing and popping one store at once.

This file is also the worker the multi-process tests start (``python this_file.py ...``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.memory import SQLiteSession
from agents.memory.session import Session, SessionABC
from agents.memory.session_settings import SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import fastmem
from fastmem.integrations.openai_agents import (
    CHUNK_BYTES,
    FastmemSession,
    memory_instructions,
    session_name,
)  # fmt: skip

set_tracing_disabled(True)  # no trace export: the tests run offline
HERE = os.path.abspath(__file__)

ITEMS = [
    {"role": "user", "content": "Hello, I'm Ada. I live in Lisbon."},
    {"role": "user", "content": [{"type": "input_text", "text": "Zürich 東京 🚀 \u0000 \ud800"}]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Nice to meet you.", "annotations": []}]},
    {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Lisbon"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "18°C, sunny"},
    {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "think"}]},
    {"type": "something_new", "nested": {"a": [1, 2.5, None, True, {"b": "c"}]}},
    {},
]  # fmt: skip


class ScriptedModel(Model):
    """An offline model: answers with the scripted texts in turn and records every input
    it was given (the system instructions and the input items)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.inputs: list[tuple[str | None, list]] = []

    async def get_response(self, system_instructions, input, *args, **kwargs):
        self.inputs.append((system_instructions, input if isinstance(input, list) else [input]))
        text = self.replies.pop(0) if self.replies else "ok"
        message = ResponseOutputMessage(
            id="msg_scripted", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )  # fmt: skip
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model does not stream")

    def seen(self) -> str:
        """Everything the model was given, as one string."""
        return json.dumps(self.inputs, ensure_ascii=False)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def store(tmp_path):
    with fastmem.open(tmp_path / "memory", embedder=None) as s:
        yield s


def one_backend(backend):
    if backend != BACKENDS_FIRST:
        pytest.skip("the processes it starts choose their own kernels: run once")


BACKENDS_FIRST = "cython"


# --- the interface, one behaviour at a time --------------------------------------------------


def test_it_is_the_sdks_session(store):
    session = FastmemSession("s", store)
    assert isinstance(session, SessionABC) and isinstance(session, Session)
    assert session.session_id == "s" and isinstance(session.session_settings, SessionSettings)


def test_items_come_back_exactly_and_in_order(store):
    session = FastmemSession("s", store)

    async def go():
        await session.add_items(ITEMS[:3])
        await session.add_items(ITEMS[3:])
        return await session.get_items()

    got = run(go())
    assert got == json.loads(json.dumps(ITEMS))
    assert json.dumps(got) == json.dumps(ITEMS)  # key order too


def test_it_behaves_as_sqlite_session_step_by_step(store, tmp_path):
    """The same operations on SQLiteSession (file-backed) and FastmemSession give the same
    answers, step by step."""
    ours = FastmemSession("conv", store)
    theirs = SQLiteSession("conv", str(tmp_path / "sqlite.db"))
    steps = [
        ("add", ITEMS[:4]), ("get", None), ("get", 2), ("get", 0), ("get", -1), ("get", 100),
        ("pop", None), ("get", None), ("add", []), ("add", ITEMS[4:]), ("get", 3), ("pop", None),
        ("pop", None), ("clear", None), ("get", None), ("pop", None), ("add", ITEMS[:1]),
        ("get", 1),
    ]  # fmt: skip

    async def step(session, op, arg):
        if op == "add":
            return await session.add_items(arg)
        if op == "get":
            return await session.get_items(arg)
        if op == "pop":
            return await session.pop_item()
        return await session.clear_session()

    async def go():
        for op, arg in steps:
            assert await step(ours, op, arg) == await step(theirs, op, arg), (op, arg)

    run(go())
    theirs.close()


def test_limit_takes_the_newest_items_in_chronological_order(store):
    session = FastmemSession("s", store, session_settings={"limit": 2})
    items = [{"role": "user", "content": f"message {i}"} for i in range(10)]

    async def go():
        for i in range(0, 10, 3):
            await session.add_items(items[i : i + 3])
        return (await session.get_items(), await session.get_items(4), await session.get_items(0),
                await session.get_items(-5), await session.get_items(50))  # fmt: skip

    default, four, zero, negative, more = run(go())
    assert default == items[-2:] and four == items[-4:] and zero == []
    assert negative == items and more == items


def test_pop_returns_the_newest_and_none_when_empty(store):
    session = FastmemSession("s", store)

    async def go():
        assert await session.pop_item() is None
        await session.add_items(ITEMS[:3])
        popped = [await session.pop_item() for _ in range(4)]
        return popped, await session.get_items()

    popped, left = run(go())
    assert popped == [ITEMS[2], ITEMS[1], ITEMS[0], None] and left == []


def test_clear_removes_this_sessions_items_only(store):
    a, b = FastmemSession("a", store), FastmemSession("b", store)
    other = store.add("A note someone else keeps in session a.", session="a")

    async def go():
        await a.add_items(ITEMS[:2])
        await b.add_items(ITEMS[2:4])
        await a.clear_session()
        return await a.get_items(), await b.get_items()

    assert run(go()) == ([], ITEMS[2:4])
    assert store.get(other).session == "a"  # not an item: never taken for one, never cleared


def test_empty_and_huge_items(store):
    """An item longer than a memory's metadata is kept in chunks; it comes back whole,
    counts as one item for limit and pop, and an empty dict is an item too."""
    session = FastmemSession("s", store)
    huge = {"type": "function_call_output", "call_id": "c", "output": "é🚀" * 700_000}
    assert len(json.dumps(huge)) > 40 * CHUNK_BYTES

    async def go():
        await session.add_items([{}, huge, {"role": "user", "content": ""}])
        assert await session.get_items() == [{}, huge, {"role": "user", "content": ""}]
        assert await session.get_items(2) == [huge, {"role": "user", "content": ""}]
        assert await session.pop_item() == {"role": "user", "content": ""}
        assert await session.get_items(1) == [huge]
        assert await session.pop_item() == huge
        return await session.get_items()

    assert run(go()) == [{}]
    assert len(store.recent(1000, session="s")) == 1  # every chunk went with its item


def test_items_msgpack_cannot_hold_as_json_does_come_back_as_json_gives_them(store):
    """An item is kept as itself when msgpack gives it back as a JSON round trip would,
    else as its JSON: a tuple, an int beyond 64 bits, a lone surrogate, a non-str key,
    deep nesting, a float list long enough to outgrow the metadata as msgpack."""
    session = FastmemSession("s", store)
    deep: dict = {"leaf": 1}
    for _ in range(60):
        deep = {"d": deep}
    odd = [{"t": (1, 2)}, {"big": 2**70, "neg": -(2**65)}, {"s": "a\udfffb"}, {"k": {1: "one"}},
           deep, {"floats": [0.0] * 8000}, {"nested": [[[]], {}, "", -0.0, 1e308, False]}]

    async def go():
        await session.add_items(odd)
        got = await session.get_items()
        got[-1]["nested"].append("changed by the caller")  # must not change what is stored
        return got, await session.get_items(3), await session.get_items()

    everything, last3, again = run(go())
    kept = [type(m.metadata["openai_agents"]).__name__ for m in store.recent(10, session="s")]
    assert kept[::-1] == ["str", "str", "str", "str", "str", "str", "dict"]
    want = json.loads(json.dumps(odd))
    assert everything[:-1] == want[:-1] and last3 == want[-3:] and again == want


def test_bad_input_is_refused_and_writes_nothing(store):
    session = FastmemSession("s", store)

    async def go():
        await session.add_items(ITEMS[:1])
        for bad in ({"role": "user"}, "text", None, [ITEMS[1], "not a dict"],
                    [ITEMS[1], {"x": {1, 2}}], [ITEMS[1], {"x": object()}]):  # fmt: skip
            with pytest.raises(fastmem.InvalidTypeError):
                await session.add_items(bad)
        with pytest.raises(fastmem.InvalidTypeError):
            await session.get_items("3")
        return await session.get_items()

    assert run(go()) == ITEMS[:1]
    with pytest.raises(fastmem.InvalidTypeError):
        FastmemSession(7, store)
    with pytest.raises(fastmem.InvalidTypeError):
        FastmemSession("s", store, session_settings=5)
    with pytest.raises(fastmem.InvalidTypeError):
        FastmemSession("s", 3.5)


def test_a_closed_session_refuses_every_call(tmp_path):
    session = FastmemSession("s", tmp_path / "owned", embedder=None)
    session.close()
    session.close()  # idempotent
    for call in (session.get_items(), session.add_items([]), session.pop_item(),
                 session.clear_session()):  # fmt: skip
        with pytest.raises(fastmem.StoreClosedError):
            run(call)


def test_any_session_id_has_its_own_items(store):
    ids = ["", "x" * 300, "x" * 256, "dup", "Dup", "a/b\\c", "\ud800"]
    assert len({session_name(i) for i in ids}) == len(ids)
    sessions = [FastmemSession(i, store) for i in ids]

    async def go():
        for n, s in enumerate(sessions):
            await s.add_items([{"n": n}])
        return [await s.get_items() for s in sessions]

    assert run(go()) == [[{"n": n}] for n in range(len(ids))]


def test_items_survive_a_restart_of_the_store(tmp_path):
    path = tmp_path / "memory"

    async def write():
        session = FastmemSession("s", path, embedder=None)
        await session.add_items(ITEMS)
        session.close()

    async def read():
        session = FastmemSession("s", path, embedder=None)
        try:
            return await session.get_items()
        finally:
            session.close()

    run(write())
    assert run(read()) == json.loads(json.dumps(ITEMS))


def test_calls_leave_the_event_loop_free_and_writes_finish_when_cancelled(store, monkeypatch):
    """A write that waits (here: a store write made slow) runs in a thread: the loop keeps
    ticking meanwhile; a cancelled add_items still writes its items (as SQLiteSession's)."""
    session = FastmemSession("s", store)
    slow_add = store.add_many

    def add_many(items):
        time.sleep(0.3)
        return slow_add(items)

    monkeypatch.setattr(store, "add_many", add_many)

    async def go():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        await session.add_items(ITEMS[:1])
        assert ticks >= 10
        write = asyncio.create_task(session.add_items(ITEMS[1:2]))
        await asyncio.sleep(0.05)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        tick.cancel()
        return await session.get_items()

    assert run(go()) == ITEMS[:2]


# --- a real agent loop ----------------------------------------------------------------------


def test_an_agent_keeps_its_conversation_in_the_session(store):
    session = FastmemSession("conv", store)
    model = ScriptedModel(["Hello Ada!", "You live in Lisbon."])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)

    async def go():
        await Runner.run(agent, "I'm Ada and I live in Lisbon.", session=session)
        result = await Runner.run(agent, "Where do I live?", session=session)
        return result.final_output

    assert run(go()) == "You live in Lisbon."
    second_input = model.inputs[1][1]
    assert [i.get("content") for i in second_input if i.get("role") == "user"] == [
        "I'm Ada and I live in Lisbon.", "Where do I live?"]
    assert len(run(session.get_items())) == 4


def test_memory_instructions_put_the_context_before_the_agents_own(store):
    """A new conversation recalls what an earlier one said, through the instructions; the
    current conversation's own items (already in the input) are left out of the context."""
    first = FastmemSession("monday", store)
    second = FastmemSession("tuesday", store)
    model = ScriptedModel([])

    async def go():
        await first.add_items([{"role": "user", "content": "My cat is called Tom."}])
        agent = Agent(name="a", model=model,
                      instructions=memory_instructions(store, "Be brief.", session=second))
        await Runner.run(agent, "What is my cat called?", session=second)

    run(go())
    system, _ = model.inputs[0]
    assert system.startswith("What you remember") and system.endswith("\n\nBe brief.")
    assert "My cat is called Tom." in system
    assert "What is my cat called?" not in system  # in the input already: not repeated


def test_memory_instructions_call_the_agents_own_instructions_function(store):
    model = ScriptedModel([])
    store.add("The user's name is Ada.", type="fact")

    async def own(run_context, agent):
        return f"You are {agent.name}."

    async def go():
        agent = Agent(name="helper", model=model, instructions=memory_instructions(store, own))
        await Runner.run(agent, "What is my name?")

    run(go())
    system = model.inputs[0][0]
    assert "The user's name is Ada." in system and system.endswith("You are helper.")
    elsewhere = FastmemSession("x", store.path + "-other", embedder=None)  # ids m0... as well
    run(elsewhere.add_items([{"role": "user", "content": "unrelated"}]))
    agent = Agent(name="helper", model=model,
                  instructions=memory_instructions(store, own, session=elsewhere))
    run(Runner.run(agent, "What is my name?"))
    assert "The user's name is Ada." in model.inputs[-1][0]  # not left out for the other's m0
    elsewhere.close()
    with pytest.raises(fastmem.InvalidTypeError):
        memory_instructions("not a store")


# --- processes --------------------------------------------------------------------------------


def worker(argv: list[str]) -> None:
    """What the multi-process tests start: ``tell``/``ask`` an agent, ``write`` items,
    ``pop`` until empty."""
    action, path, session_id = argv[:3]

    async def go():
        session = FastmemSession(session_id, path, embedder=None)
        try:
            if action in ("tell", "ask"):
                model = ScriptedModel(["Noted."])
                instructions = memory_instructions(session.store, "Be brief.", session=session)
                agent = Agent(name="a", model=model, instructions=instructions)
                await Runner.run(agent, argv[3], session=session)
                print(model.seen())
            elif action == "write":
                for i in range(int(argv[3])):
                    await session.add_items([{"writer": argv[4], "i": i}, {"writer": argv[4], "j": i}])
            elif action == "pop":
                popped = []
                while (item := await session.pop_item()) is not None:
                    popped.append(item["i"])
                print(json.dumps(popped))
        finally:
            session.close()

    asyncio.run(go())


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "FASTMEM_EMBEDDER": "none"}
    return subprocess.Popen([sys.executable, HERE, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out


def test_a_fact_told_in_one_process_is_in_the_models_input_after_a_restart(tmp_path, backend):
    one_backend(backend)
    path = str(tmp_path / "memory")
    finish(start("tell", path, "conv", "Remember: my locker code is 4711."))
    same = finish(start("ask", path, "conv", "What is my locker code?"))
    assert "my locker code is 4711" in same  # the session's history, in the input items
    other = finish(start("ask", path, "another-conv", "What is my locker code?"))
    assert "my locker code is 4711" in other  # recalled through the instructions


def test_two_users_never_see_each_others_memories(tmp_path, backend):
    """Users kept apart by namespaces (a store each): neither the history nor the
    instructions of one ever show the other's fact; sessions in one store keep their
    histories apart too."""
    one_backend(backend)
    root = tmp_path / "users"
    model = ScriptedModel([])

    async def go():
        alice = FastmemSession("conv", root, namespace="alice", embedder=None)
        bob = FastmemSession("conv", root, namespace="bob", embedder=None)
        try:
            for session, fact in ((alice, "Alice's PIN is 1234."), (bob, "Bob likes tea.")):
                agent = Agent(name="a", model=model,
                              instructions=memory_instructions(session.store, "Hi.", session=session))
                await Runner.run(agent, fact, session=session)
            agent = Agent(name="a", model=model,
                          instructions=memory_instructions(bob.store, "Hi.", session=bob))
            await Runner.run(agent, "What is Alice's PIN?", session=bob)
        finally:
            alice.close()
            bob.close()

    run(go())
    assert "1234" not in json.dumps(model.inputs[1:])

    async def sessions(store):
        a, b = FastmemSession("a", store), FastmemSession("b", store)
        await a.add_items([{"role": "user", "content": "secret of a"}])
        await b.add_items([{"role": "user", "content": "hello from b"}])
        return await b.get_items()

    with fastmem.open(tmp_path / "shared", embedder=None) as store:
        assert "secret of a" not in json.dumps(run(sessions(store)))


def test_two_processes_writing_one_store_at_once_lose_nothing(tmp_path, backend):
    """Two processes append to one session and a third to another, all at once: every
    item is there, each writer's items in its own order and each call's two together."""
    one_backend(backend)
    path = str(tmp_path / "memory")
    procs = [start("write", path, "shared", "150", "p"), start("write", path, "shared", "150", "q"),
             start("write", path, "own", "100", "r")]  # fmt: skip
    for proc in procs:
        finish(proc)

    async def read(session_id):
        session = FastmemSession(session_id, path, embedder=None)
        try:
            return await session.get_items()
        finally:
            session.close()

    shared, own = run(read("shared")), run(read("own"))
    assert len(shared) == 600 and len(own) == 200
    for writer in ("p", "q"):
        mine = [item for item in shared if item["writer"] == writer]
        assert mine == [x for i in range(150) for x in ({"writer": writer, "i": i},
                                                        {"writer": writer, "j": i})]  # fmt: skip
    for k in range(0, 600, 2):  # one add_items call's items are never split
        assert shared[k]["writer"] == shared[k + 1]["writer"] and "i" in shared[k]


def test_two_processes_popping_at_once_never_get_the_same_item(tmp_path, backend):
    one_backend(backend)
    path = str(tmp_path / "memory")

    async def fill():
        session = FastmemSession("s", path, embedder=None)
        await session.add_items([{"i": i} for i in range(200)])
        session.close()

    run(fill())
    procs = [start("pop", path, "s"), start("pop", path, "s")]
    popped = [json.loads(finish(p)) for p in procs]
    assert sorted(popped[0] + popped[1]) == list(range(200))
    for got in popped:
        assert got == sorted(got, reverse=True)  # each process pops newest first


def test_threads_popping_one_session_never_get_the_same_item(store):
    session = FastmemSession("s", store)
    run(session.add_items([{"i": i} for i in range(100)]))
    results: list[list[int]] = [[], []]

    def popper(out):
        while (item := run(session.pop_item())) is not None:
            out.append(item["i"])

    threads = [threading.Thread(target=popper, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results[0] + results[1]) == list(range(100))


if __name__ == "__main__":
    worker(sys.argv[1:])

"""fastmem.integrations.adk against the installed Google ADK: the memory service's methods
one by one, a real agent loop through ADK's ``Runner`` with a scripted offline model and
the ``preload_memory`` and ``load_memory`` tools, restarts in new processes, users kept
apart, and processes writing one user's store at once.

This file is also the worker the multi-process tests start (``python this_file.py ...``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.events import Event
from google.adk.memory import BaseMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService, Session
from google.adk.tools import load_memory, preload_memory
from google.genai import types

import fastmem
from fastmem.integrations.adk import FastmemMemoryService, user_namespace

HERE = os.path.abspath(__file__)
SEEN: list[str] = []  # what the scripted model was given, one string per call


class ScriptedLlm(BaseLlm):
    """An offline model: records every request's contents (and system instruction); calls
    ``load_memory`` first when the user's message starts with "recall:", then answers."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        SEEN.append(json.dumps([c.model_dump(mode="json", exclude_none=True)
                                for c in llm_request.contents], ensure_ascii=False))  # fmt: skip
        last = llm_request.contents[-1].parts[0] if llm_request.contents else None
        text = getattr(last, "text", None) or ""
        if text.startswith("recall:"):
            call = types.FunctionCall(name="load_memory", args={"query": text[7:]})
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))
            return
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="Noted.")]))


def run(coro):
    return asyncio.run(coro)


def one_backend(backend):
    if backend != "cython":
        pytest.skip("the processes it starts choose their own kernels: run once")


@pytest.fixture
def service(tmp_path):
    svc = FastmemMemoryService(tmp_path / "memories", embedder=None)
    yield svc
    run(svc.close())


def event(text: str | None, author: str = "user", event_id: str = "", ts: float = 1.7e9,
          parts: list | None = None) -> Event:  # fmt: skip
    role = "user" if author == "user" else "model"
    parts = parts if parts is not None else [types.Part(text=text)]
    return Event(id=event_id or Event.new_id(), author=author, timestamp=ts,
                 invocation_id="inv", content=types.Content(role=role, parts=parts))  # fmt: skip


def session(user: str, sid: str, events: list[Event], app: str = "app") -> Session:
    return Session(id=sid, app_name=app, user_id=user, events=events)


def texts(response) -> list[str]:
    return [p.text for m in response.memories for p in m.content.parts if p.text]


def search(svc, query, user="alice", app="app"):
    return run(svc.search_memory(app_name=app, user_id=user, query=query))


def count(svc, user="alice", app="app") -> int:
    with fastmem.open(svc.root, namespace=user_namespace(app, user), embedder=None) as store:
        return len(store)


# --- the service, one method at a time -------------------------------------------------------


def test_it_is_an_adk_memory_service(service):
    assert isinstance(service, BaseMemoryService)
    for name in ("add_session_to_memory", "add_events_to_memory", "add_memory",
                 "search_memory", "delete_memory"):  # fmt: skip
        assert getattr(type(service), name) is not getattr(BaseMemoryService, name), name


def test_a_session_added_is_found_with_its_content_author_and_time(service):
    content_event = event("My cat is called Tom. Ünïcödé 東京 🚀", event_id="e1", ts=1.7e9)
    reply = event("What a nice name.", author="assistant", event_id="e2", ts=1.7e9 + 5)
    run(service.add_session_to_memory(session("alice", "s1", [content_event, reply])))
    found = search(service, "cat Tom")
    entry = next(m for m in found.memories if m.custom_metadata.get("event_id") == "e1")
    assert entry.content == content_event.content  # the Content exactly
    assert entry.author == "user" and entry.id.startswith("m")
    assert entry.custom_metadata == {"session_id": "s1", "event_id": "e1"}
    assert entry.timestamp == "2023-11-14T22:13:20" or entry.timestamp.startswith("2023-11-1")
    assert [m.custom_metadata["event_id"] for m in found.memories] == ["e1", "e2"]  # by time


def test_adding_a_session_again_adds_only_new_events(service):
    events = [event(f"fact number {i}", event_id=f"e{i}", ts=1.7e9 + i) for i in range(3)]
    run(service.add_session_to_memory(session("alice", "s1", events)))
    run(service.add_session_to_memory(session("alice", "s1", events)))
    assert count(service) == 3
    events.append(event("fact number 3", event_id="e3", ts=1.7e9 + 3))
    run(service.add_session_to_memory(session("alice", "s1", events)))
    assert count(service) == 4
    run(service.add_events_to_memory(app_name="app", user_id="alice", events=events[:2]))
    run(service.add_events_to_memory(app_name="app", user_id="alice", events=events[:2]))
    assert count(service) == 6  # the same events under no session are another scope (as ADK's)


def test_events_without_text_are_skipped(service):
    call = types.Part(function_call=types.FunctionCall(name="f", args={}))
    thought = types.Part(text="thinking hard", thought=True)
    events = [event(None, parts=[call]), event(None, parts=[thought]), event(None, parts=[]),
              event("kept text")]  # fmt: skip
    events.append(Event(id="x", author="user", invocation_id="inv"))  # no content at all
    run(service.add_session_to_memory(session("alice", "s", events)))
    assert count(service) == 1
    assert texts(search(service, "kept")) == ["kept text"]


def test_empty_query_finds_nothing_and_an_unknown_user_has_no_store(service, tmp_path):
    run(service.add_session_to_memory(session("alice", "s", [event("hello there")])))
    assert search(service, "").memories == [] and search(service, "   ").memories == []
    assert search(service, "hello", user="nobody").memories == []
    assert sorted(os.listdir(service.root)) == [user_namespace("app", "alice")]


def test_users_and_apps_never_see_each_others_memories(service):
    run(service.add_session_to_memory(session("alice", "s", [event("Alice's PIN is 1234.")])))
    run(service.add_session_to_memory(session("bob", "s", [event("Bob's PIN is 9876.")])))
    run(service.add_session_to_memory(session("alice", "s", [event("Other app PIN 5555.")], app="b")))
    assert texts(search(service, "PIN")) == ["Alice's PIN is 1234."]
    assert texts(search(service, "PIN", user="bob")) == ["Bob's PIN is 9876."]
    assert texts(search(service, "PIN", app="b")) == ["Other app PIN 5555."]
    assert user_namespace("My App", "u") != user_namespace("my-app", "u")
    assert user_namespace("a", "b\0c") != user_namespace("a\0b", "c")


def test_delete_memory_removes_it_for_good(service):
    events = [event("The code is 4711.", event_id="e1"), event("The door is red.", event_id="e2")]
    run(service.add_session_to_memory(session("alice", "s", events)))
    entry = search(service, "code 4711").memories[0]
    run(service.delete_memory(app_name="app", user_id="alice", memory_id=entry.id))
    assert "4711" not in json.dumps(texts(search(service, "code 4711")))
    run(service.add_session_to_memory(session("alice", "s", events)))  # not brought back
    assert "4711" not in json.dumps(texts(search(service, "code 4711")))
    for unknown in (None, "m999", "not-an-id", entry.id):
        run(service.delete_memory(app_name="app", user_id="alice", memory_id=unknown))
    run(service.delete_memory(app_name="app", user_id="nobody", memory_id="m0"))
    with pytest.raises(fastmem.InvalidTypeError):
        run(service.delete_memory(app_name="app", user_id="alice", memory_id=5))
    assert texts(search(service, "door")) == ["The door is red."]


def test_add_memory_writes_explicit_memories(service):
    entries = [
        MemoryEntry(content=types.Content(role="user", parts=[types.Part(text="Ada prefers tea.")]),
                    author="user", timestamp="2024-05-01T10:00:00", custom_metadata={"k": [1, "v"]}),
        MemoryEntry(content=types.Content(parts=[types.Part(text="Ada's cat is Tom.")])),
    ]  # fmt: skip
    run(service.add_memory(app_name="app", user_id="alice", memories=entries))
    found = search(service, "Ada tea")
    tea = next(m for m in found.memories if "tea" in texts_of(m))
    assert tea.content == entries[0].content and tea.author == "user"
    assert tea.timestamp == "2024-05-01T10:00:00" and tea.custom_metadata["k"] == [1, "v"]
    no_text = MemoryEntry(content=types.Content(parts=[types.Part(text="")]))
    for bad, error in (([entries[0], no_text], fastmem.InvalidInputError),
                       ([entries[0], "text"], fastmem.InvalidTypeError),
                       (entries[0], fastmem.InvalidTypeError)):  # fmt: skip
        with pytest.raises(error):
            run(service.add_memory(app_name="app", user_id="alice", memories=bad))
    assert count(service) == 2  # nothing of a refused call was written


def texts_of(entry) -> str:
    return " ".join(p.text for p in entry.content.parts if p.text)


def test_long_events_are_kept_and_found(service):
    long_text = "The launch code is 31337. " + "padding words " * 10_000  # ~140 KB
    huge_text = "needle " + "x" * (1 << 21)  # 2 MiB: cut to a memory's 1 MiB of text
    run(service.add_session_to_memory(session("alice", "s", [event(long_text, event_id="l"),
                                                              event(huge_text, event_id="h")])))
    assert count(service) == 2
    found = search(service, "launch code")
    assert any("31337" in texts_of(m) for m in found.memories)
    assert all(m.content.role == "user" for m in found.memories)


def test_bad_input_is_refused(service):
    for app, user in ((1, "u"), ("a", None), ("", "u"), ("a", "")):
        with pytest.raises(fastmem.InvalidInputError):  # InvalidTypeError is one too
            search(service, "q", user=user, app=app)
    with pytest.raises(fastmem.InvalidTypeError):
        search(service, 42)
    with pytest.raises(fastmem.InvalidTypeError):
        run(service.add_events_to_memory(app_name="a", user_id="u", events="text"))
    with pytest.raises(fastmem.InvalidTypeError):
        run(service.add_events_to_memory(app_name="a", user_id="u", events=["not an event"]))
    with pytest.raises(fastmem.InvalidTypeError):
        run(service.add_session_to_memory("not a session"))
    with pytest.raises(fastmem.InvalidInputError):
        FastmemMemoryService(service.root, budget=0)


def test_many_users_with_few_open_stores(tmp_path):
    svc = FastmemMemoryService(tmp_path / "m", max_open=2, embedder=None)
    try:
        for i in range(6):
            run(svc.add_session_to_memory(session(f"user{i}", "s", [event(f"user {i} fact")])))
        assert len(svc._stores) <= 2
        for i in range(6):
            assert texts(search(svc, "fact", user=f"user{i}")) == [f"user {i} fact"]
    finally:
        run(svc.close())
    with pytest.raises(fastmem.StoreClosedError):
        search(svc, "fact", user="user0")


# --- a real agent loop ----------------------------------------------------------------------


async def agent_turn(root: str, user: str, session_id: str, text: str, remember: bool) -> None:
    """One turn of an ADK agent with both memory tools, then (``remember``) the session
    added to memory, as an app does at a session's end."""
    memory = FastmemMemoryService(root, embedder=None)
    sessions = InMemorySessionService()
    agent = LlmAgent(name="assistant", model=ScriptedLlm(), instruction="Be brief.",
                     tools=[preload_memory, load_memory])  # fmt: skip
    runner = Runner(agent=agent, app_name="app", session_service=sessions, memory_service=memory)
    await sessions.create_session(app_name="app", user_id=user, session_id=session_id)
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for _ in runner.run_async(user_id=user, session_id=session_id, new_message=message):
        pass
    if remember:
        done = await sessions.get_session(app_name="app", user_id=user, session_id=session_id)
        await memory.add_session_to_memory(done)
    await memory.close()


def test_preload_and_load_memory_recall_through_the_service(tmp_path, backend):
    SEEN.clear()
    root = str(tmp_path / "memories")
    run(agent_turn(root, "alice", "s1", "My locker code is 4711.", remember=True))
    run(agent_turn(root, "alice", "s2", "What is my locker code?", remember=False))
    assert "My locker code is 4711." in SEEN[-1]  # preload_memory put it in the request
    run(agent_turn(root, "alice", "s3", "recall: locker code", remember=False))
    assert "4711" in SEEN[-1] and "load_memory" in SEEN[-1]  # the tool's answer
    run(agent_turn(root, "bob", "s4", "recall: What is my locker code?", remember=False))
    assert "4711" not in "".join(SEEN[-2:])


def worker(argv: list[str]) -> None:
    """What the multi-process tests start: ``turn`` (one agent turn, remembered; prints what
    the model saw) or ``write`` (many events, one call each)."""
    action, root, user = argv[:3]
    if action == "turn":
        asyncio.run(agent_turn(root, user, argv[3], argv[4], remember=True))
        print(json.dumps(SEEN))
        return

    async def write():
        memory = FastmemMemoryService(root, embedder=None)
        for i in range(int(argv[3])):
            await memory.add_events_to_memory(
                app_name="app", user_id=user, session_id=argv[4],
                events=[event(f"{argv[4]} note {i}", event_id=f"{argv[4]}-{i}", ts=1.7e9 + i)],
            )  # fmt: skip
        await memory.close()

    asyncio.run(write())


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "FASTMEM_EMBEDDER": "none"}
    return subprocess.Popen([sys.executable, HERE, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return out


def test_a_fact_told_in_one_process_is_in_the_models_input_after_a_restart(tmp_path, backend):
    one_backend(backend)
    root = str(tmp_path / "memories")
    finish(start("turn", root, "alice", "s1", "Remember: my bike is a green Brompton."))
    alice = finish(start("turn", root, "alice", "s2", "Which bike do I ride?"))
    assert "my bike is a green Brompton" in alice
    bob = finish(start("turn", root, "bob", "s3", "Which bike do I ride?"))
    assert "Brompton" not in bob


def test_two_processes_writing_one_users_store_at_once_lose_nothing(tmp_path, backend):
    one_backend(backend)
    root = str(tmp_path / "memories")
    procs = [start("write", root, "alice", "80", "p"), start("write", root, "alice", "80", "q")]
    for proc in procs:
        finish(proc)
    with fastmem.open(root, namespace=user_namespace("app", "alice"), embedder=None) as store:
        notes = sorted(m.text for m in store)
    assert notes == sorted(f"{w} note {i}" for w in "pq" for i in range(80))


if __name__ == "__main__":
    worker(sys.argv[1:])

"""The Hermes Agent provider on the real hermes-agent 0.19.0: its discovery, its
MemoryManager, every hook, and whole agents talking to a fake model in separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import fastmem
from fastmem.integrations import _hermes_install, _writer, hermes
from fastmem.integrations.hermes import FastmemProvider, install, user_namespace

pytest.importorskip("agent.memory_provider", reason="hermes-agent is not installed")
from agent.memory_manager import MemoryManager  # noqa: E402
from agent.memory_provider import MemoryProvider  # noqa: E402

# The directory holding the fastmem under test, for processes started with another cwd
# (the venv's editable install may point at another checkout).
FASTMEM_ROOT = os.path.dirname(os.path.dirname(fastmem.__file__))
# Seconds any wait of these tests may last: a guard against a hang, never a speed bound (the
# machine is shared, at load 10-16 while others work: a fixed bound of a minute failed).
HANG = 300.0
# For writer processes whose test is about what gets written, not about the provider's
# deadlines: a batch waits for the lock, and shutdown() for the backlog, as long as HANG
# (at the real 5 s and 4 s a loaded machine sent writes to side files).
PATIENT = {"TEST_WRITE_WAIT": str(HANG), "TEST_SHUTDOWN_TIMEOUT": str(HANG)}


@pytest.fixture(autouse=True)
def backend():
    """The Hermes provider exercises no kernel: one run, on the default kernels (the
    compiled ones when built), not one per backend as tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A Hermes profile with the provider installed and active."""
    path = tmp_path / "hermes"
    monkeypatch.setenv("HERMES_HOME", str(path))
    install(str(path), activate=True)
    return str(path)


def _provider(home: str, session: str = "s1", **kwargs: Any) -> FastmemProvider:
    p = FastmemProvider()
    p.initialize(session, hermes_home=home, platform=kwargs.pop("platform", "cli"),
                 agent_context=kwargs.pop("agent_context", "primary"), **kwargs)  # fmt: skip
    return p


def _texts(home: str, namespace: str = "default") -> list[str]:
    with fastmem.open(os.path.join(home, "fastmem"), namespace=namespace, readonly=True) as store:
        return [m.text for m in store]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _child_env(home: str) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=home, FASTMEM_EMBEDDER="none")
    env["PYTHONPATH"] = os.pathsep.join([FASTMEM_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# --- install and discovery ---------------------------------------------------------------


def test_install_writes_the_plugin_and_tells_how_to_activate(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "env-home"))
    result = install()  # $HERMES_HOME
    assert result.plugin_dir == str(tmp_path / "env-home" / "plugins" / "fastmem")
    init = _read(os.path.join(result.plugin_dir, "__init__.py"))
    assert "MemoryProvider" in init[:8192] and "def register(ctx)" in init
    assert "FastmemProvider" in init
    assert "name: fastmem" in _read(os.path.join(result.plugin_dir, "plugin.yaml"))
    assert not result.activated and not os.path.exists(result.config_path)
    assert "provider: fastmem" in result.message and result.config_path in result.message


def test_install_activate_keeps_the_rest_of_config_yaml(tmp_path):
    yaml = pytest.importorskip("yaml")
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text(
        "model:\n  default: gpt-x\n  context_length: 131072\nmemory:\n  memory_char_limit: 2200\n"
        "  provider: honcho\nterminal:\n  backend: local\n"
    )
    result = install(home, activate=True)
    assert result.activated and "Activated" in result.message
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["memory"] == {"memory_char_limit": 2200, "provider": "fastmem"}
    assert config["model"]["default"] == "gpt-x" and config["terminal"] == {"backend": "local"}
    assert "honcho" in (home / "config.yaml.bak").read_text()
    again = install(home, activate=False)  # already active: said so, file untouched
    assert again.activated and "is active" in again.message


def test_install_without_pyyaml_edits_the_memory_block_in_place():
    edit = _hermes_install._activated_text_plain
    assert edit("") == "memory:\n  provider: fastmem\n"
    assert edit("model: x\n") == "model: x\nmemory:\n  provider: fastmem\n"
    text = "# mine\nmemory:\n  memory_char_limit: 2200\n  provider: honcho\ndisplay: {}\n"
    assert edit(text) == "# mine\nmemory:\n  memory_char_limit: 2200\n  provider: fastmem\ndisplay: {}\n"
    assert edit("memory:\n  user_char_limit: 9\n") == "memory:\n  provider: fastmem\n  user_char_limit: 9\n"


def test_install_refuses_bad_arguments(tmp_path):
    with pytest.raises(fastmem.InvalidTypeError):
        install(42)  # type: ignore[arg-type]
    with pytest.raises(fastmem.InvalidTypeError):
        install(tmp_path, activate="yes")  # type: ignore[arg-type]
    (tmp_path / "config.yaml").write_text("- a list\n")
    if _has_yaml():
        with pytest.raises(fastmem.InvalidInputError):
            install(tmp_path, activate=True)


def _has_yaml() -> bool:
    try:
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


def test_hermes_discovers_and_loads_the_installed_provider(home):
    from plugins.memory import discover_memory_providers, load_memory_provider

    provider = load_memory_provider("fastmem")
    assert isinstance(provider, MemoryProvider) and provider.name == "fastmem"
    assert type(provider).__module__ == "fastmem.integrations.hermes"
    assert provider.is_available()
    found = {name: available for name, _, available in discover_memory_providers()}
    assert found.get("fastmem") is True


def test_the_module_imports_without_hermes(tmp_path):
    """fastmem never needs Hermes: with `agent` unimportable the provider still works."""
    code = textwrap.dedent("""
        import sys
        sys.modules["agent"] = None  # import agent.* fails
        from fastmem.integrations.hermes import FastmemProvider, install
        assert FastmemProvider.__mro__[1] is object
        r = install(sys.argv[1], activate=True)
        p = FastmemProvider(); p.initialize("s", hermes_home=sys.argv[1])
        p.sync_turn("My dog is Rex.", "ok"); p.shutdown()
        print("OK", r.activated)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=_child_env(str(tmp_path)),
                         capture_output=True, text=True, timeout=HANG)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK True"
    assert _texts(str(tmp_path)) == ["User: My dog is Rex.\nAssistant: ok"]


# --- through Hermes's MemoryManager ---------------------------------------------------------


def test_memory_manager_drives_every_path(home):
    from plugins.memory import load_memory_provider

    manager = MemoryManager()
    manager.add_provider(load_memory_provider("fastmem"))
    manager.initialize_all(session_id="sess-1", platform="cli", agent_context="primary")
    names = {s["name"] for s in manager.get_all_tool_schemas()}
    assert {"fastmem_remember", "fastmem_search", "fastmem_forget", "fastmem_pin"} <= names
    assert not names & {"memory", "session_search"}
    assert "fastmem_search" in manager.build_system_prompt()

    saved = json.loads(manager.handle_tool_call("fastmem_remember", {"text": "The user is a pilot.", "pin": True}))
    assert saved["ok"] and saved["id"].startswith("m")
    manager.sync_all("I fly an Airbus A320.", "Nice.", session_id="sess-1",
                     messages=[{"role": "user", "content": "I fly an Airbus A320."}])  # fmt: skip
    manager.on_memory_write("add", "user", "Prefers metric units.", metadata={"session_id": "sess-1"})
    assert manager.flush_pending(HANG)
    manager.get_provider("fastmem").flush(HANG)
    # Written this session: the model has it already, so prefetch does not repeat it.
    assert "Airbus" not in manager.prefetch_all("Which aircraft do I fly?")
    manager.shutdown_all()
    texts = _texts(home)
    assert "The user is a pilot." in texts and "Prefers metric units." in texts
    assert "User: I fly an Airbus A320.\nAssistant: Nice." in texts

    # A new session: the pinned fact in the system prompt, the rest recalled once.
    manager = MemoryManager()
    manager.add_provider(load_memory_provider("fastmem"))
    manager.initialize_all(session_id="sess-2", platform="cli")
    assert "The user is a pilot." in manager.build_system_prompt()
    recalled = manager.prefetch_all("Which aircraft do I fly?")
    assert "Airbus A320" in recalled and "The user is a pilot." not in recalled  # not twice
    assert "Airbus" not in manager.prefetch_all("Which aircraft do I fly again?")
    manager.shutdown_all()


def _access_counts(home: str) -> dict[str, int]:
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        return {m.text: store.info(m.id).access_count for m in store}


def test_what_the_provider_recalls_counts_as_an_access(home):
    """The provider reads through a read-only handle; its writer records the accesses, so
    importance learns from use (review F6: access_count stayed 0)."""
    from plugins.memory import load_memory_provider

    manager = MemoryManager()
    manager.add_provider(load_memory_provider("fastmem"))
    manager.initialize_all(session_id="sess-1", platform="cli", agent_context="primary")
    manager.handle_tool_call("fastmem_remember", {"text": "The user is a pilot.", "pin": True})
    manager.sync_all("I fly an Airbus A320.", "Nice.", session_id="sess-1")
    manager.sync_all("My cat is called Tom.", "Cute.", session_id="sess-1")
    manager.shutdown_all()
    assert set(_access_counts(home).values()) == {0}

    airbus = "User: I fly an Airbus A320.\nAssistant: Nice."
    for session in ("sess-2", "sess-3"):
        manager = MemoryManager()
        manager.add_provider(load_memory_provider("fastmem"))
        manager.initialize_all(session_id=session, platform="cli")
        assert "The user is a pilot." in manager.build_system_prompt()
        assert "Airbus A320" in manager.prefetch_all("Which aircraft do I fly?")
        manager.shutdown_all()
    counts = _access_counts(home)
    assert counts["The user is a pilot."] == 2  # in the system prompt of both sessions
    assert counts[airbus] >= 2  # recalled in both (and maybe in the prompt's recent ones)
    assert counts["User: My cat is called Tom.\nAssistant: Cute."] <= counts[airbus]


# --- each hook ------------------------------------------------------------------------------


def test_bad_tool_arguments_get_clear_json_errors(home):
    p = _provider(home)
    cases = [
        ("fastmem_remember", {}, "missing required argument 'text'"),
        ("fastmem_remember", {"text": 5}, "'text' must be a string"),
        ("fastmem_remember", {"text": "   "}, "must not be empty"),
        ("fastmem_remember", {"text": "x" * 9000}, "the limit is 8000"),
        ("fastmem_remember", {"text": "ok", "pin": "yes"}, "'pin' must be true or false"),
        ("fastmem_remember", {"text": "ok", "type": 3}, "'type' must be a string"),
        ("fastmem_search", {"query": "x", "limit": 0}, "limit must be an integer from 1 to 20"),
        ("fastmem_search", {"query": "x", "limit": True}, "limit must be an integer"),
        ("fastmem_search", {"query": None}, "missing required argument 'query'"),
        ("fastmem_forget", {"id": "m12345"}, "no memory has the id 'm12345'"),
        ("fastmem_forget", {"id": "bogus"}, "no memory has the id 'bogus'"),
        ("fastmem_forget", {"id": ["m1"]}, "'id' must be a string"),
        ("fastmem_pin", {"id": "m7", "pinned": 1}, "'pinned' must be true or false"),
        ("fastmem_pin", {"id": "m7"}, "no memory has the id 'm7'"),
        ("memory", {"action": "add"}, "unknown tool 'memory'"),
    ]
    for name, args, message in cases:
        result = json.loads(p.handle_tool_call(name, args))
        assert message in result.get("error", ""), (name, args, result)
    assert "must be a JSON object" in json.loads(p.handle_tool_call("fastmem_search", "cat"))["error"]  # type: ignore[arg-type]
    p.shutdown()
    assert _texts(home) == []  # nothing bad was written
    assert "not initialized" in json.loads(FastmemProvider().handle_tool_call("fastmem_search", {"query": "x"}))["error"]


def test_tools_remember_search_pin_and_forget(home):
    p = _provider(home)
    mid = json.loads(p.handle_tool_call("fastmem_remember", {"text": "Standup is at 9:30.", "type": "plan"}))["id"]
    hits = json.loads(p.handle_tool_call("fastmem_search", {"query": "standup", "limit": 3}))["results"]
    assert hits[0]["id"] == mid and hits[0]["type"] == "plan" and hits[0]["pinned"] is False
    assert json.loads(p.handle_tool_call("fastmem_pin", {"id": mid})) == {"ok": True, "id": mid, "pinned": True}
    assert json.loads(p.handle_tool_call("fastmem_search", {"query": "standup"}))["results"][0]["pinned"]
    assert json.loads(p.handle_tool_call("fastmem_forget", {"id": mid})) == {"ok": True, "forgotten": mid}
    assert json.loads(p.handle_tool_call("fastmem_search", {"query": "standup"}))["results"] == []
    assert "no memory" in json.loads(p.handle_tool_call("fastmem_forget", {"id": mid}))["error"]
    p.shutdown()


def test_sync_turn_is_queued_in_order_and_durable(home):
    p = _provider(home, "sess-9")
    started = time.perf_counter()
    for i in range(200):
        p.sync_turn(f"question {i}", f"answer {i}", session_id="sess-9")
    queued = time.perf_counter() - started
    assert queued < 0.5  # enqueue only: no disk, no lock
    p.sync_turn("", "")  # nothing to keep
    p.shutdown()  # drains the queue
    texts = _texts(home)
    assert texts == [f"User: question {i}\nAssistant: answer {i}" for i in range(200)]
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        first = store.get("m0")
        assert first.session == "sess-9" and first.metadata == {"platform": "cli", "source": "hermes-turn"}


def test_a_session_id_longer_than_the_store_allows_is_cut_and_still_its_own(home):
    long_id = "session-" + "x" * 400
    p = _provider(home, long_id)
    p.sync_turn("My boat is called Wanda.", "Nice.")
    p.handle_tool_call("fastmem_remember", {"text": "The user sails on weekends."})
    p.on_delegation("find a marina", "Marina Nord has berths.")
    p.on_session_end([{"role": "user", "content": "I have a boat called Wanda."}])
    p.flush(HANG)
    assert p.prefetch("boat Wanda sails marina") == ""  # all this session's own
    p.shutdown()
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        sessions = {m.session for m in store}
    assert sessions == {long_id[: hermes.SESSION_MAX_CHARS]}


def test_prefetch_does_not_reinject_and_resets_on_session_switch(home):
    writer = _provider(home, "old")
    for fact in ("My sister is called Ines.", "My sister lives in Porto.", "I play the cello."):
        writer.sync_turn(fact, "Noted.")
    writer.shutdown()

    p = _provider(home, "new")
    p.queue_prefetch("Where does my sister live?")
    first = p.prefetch("Where does my sister live?")  # the queued computation
    assert "Porto" in first and "Ines" in first
    again = p.prefetch("Tell me about my sister")
    assert "Porto" not in again and "Ines" not in again  # still in the conversation
    p.on_session_switch("new-2", parent_session_id="new", reason="compression")
    assert "Porto" in p.prefetch("Where does my sister live?")  # compressed away: shown again
    p.on_session_switch("new-3", reset=True)
    assert "Porto" in p.prefetch("Where does my sister live?")
    p.shutdown()


def test_prefetch_from_the_queue_sees_what_the_session_already_has(home):
    p = _provider(home)
    p.sync_turn("My car is a red Fiat.", "Nice.")
    p.flush(HANG)
    p.queue_prefetch("my car")
    assert p.prefetch("my car") == ""  # written this session: not recalled back to it
    assert p.prefetch(123) == "" and FastmemProvider().prefetch("x") == ""  # type: ignore[arg-type]
    p.shutdown()


def test_system_prompt_block_is_small_and_lists_pinned_facts(home):
    p = _provider(home)
    for i in range(60):
        p.handle_tool_call("fastmem_remember", {"text": f"Pinned fact number {i}: " + "word " * 30, "pin": True})
    p.shutdown()
    q = _provider(home, "s2")
    block = q.system_prompt_block()
    assert "Pinned facts:" in block and "Pinned fact number" in block
    assert len(block) < hermes.PROMPT_PINNED_CHARS + 400
    shown = block.count("Pinned fact number")
    assert 1 <= shown < 60
    # The pinned facts in the system prompt are not recalled again by prefetch.
    recalled = q.prefetch("pinned fact number")
    assert recalled.count("Pinned fact number") + shown <= 60
    for line in block.splitlines():
        if line.startswith("- Pinned fact"):
            assert line[2:] not in recalled
    q.shutdown()
    assert FastmemProvider().system_prompt_block() == ""


@pytest.mark.parametrize("style", ["keyword", "positional", "omitted"])
def test_on_memory_write_mirrors_the_builtin_memory(home, style):
    p = _provider(home)

    def write(action: str, content: str, old_text: str | None = None) -> None:
        meta = {"session_id": "s1", "tool_name": "memory", "write_origin": "assistant_tool"}
        if old_text:
            meta["old_text"] = old_text
        if style == "keyword":
            p.on_memory_write(action, "user", content, metadata=meta)
        elif style == "positional":
            p.on_memory_write(action, "user", content, meta)
        else:
            p.on_memory_write(action, "user", content)

    write("add", "Works at Acme as a welder.")
    write("add", "Has two kids.")
    write("replace", "Works at Globex as a foreman.", old_text="Works at Acme")
    write("remove", "Has two kids.", old_text="Has two kids")
    write("consolidate", "ignored")  # not a write the built-in memory mirrors
    p.shutdown()
    texts = _texts(home)
    if style == "omitted":  # without old_text, replace adds and cannot know what it replaced
        assert "Works at Globex as a foreman." in texts and "Has two kids." not in texts
    else:
        assert texts == ["Works at Globex as a foreman."]
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        meta = [m.metadata for m in store if "Globex" in m.text][0]
        assert meta["source"] == "hermes-memory:user"


def test_session_end_and_pre_compress_consolidate_without_a_model(home):
    p = _provider(home, "sess-c")
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi! My name is Dana and I work as a nurse. What's the weather?"},
        {"role": "assistant", "content": "Hello Dana."},
        {"role": "user", "content": [{"type": "text", "text": "Remember that I prefer tea over coffee."}]},
        {"role": "tool", "content": "my tool output"},
        {"role": "user", "content": "Do I like tea?\n<memory-context>\nMy name is Bob.\n</memory-context>"},
    ]
    note = p.on_pre_compress(messages)
    assert "My name is Dana and I work as a nurse." in note
    assert "Remember that I prefer tea over coffee." in note
    assert "weather" not in note and "Bob" not in note and "tool output" not in note
    p.on_session_end(messages)  # the same facts again: stored once
    p.shutdown()
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        facts = [m.text for m in store if m.type == "fact"]
        summaries = [m.text for m in store if m.type == "session_summary"]
    assert sorted(facts) == ["My name is Dana and I work as a nurse.", "Remember that I prefer tea over coffee."]
    assert len(summaries) == 1 and "Session sess-c" in summaries[0] and "3 user messages" in summaries[0]
    assert _provider(home).on_pre_compress([]) == ""


def test_delegation_is_remembered(home):
    p = _provider(home)
    p.on_delegation("Find the cheapest flight to Oslo", "SAS, 89 EUR", child_session_id="child-1")
    p.shutdown()
    assert _texts(home) == ["Delegated task: Find the cheapest flight to Oslo\nResult: SAS, 89 EUR"]


def test_non_primary_contexts_write_nothing(home):
    for context in ("subagent", "cron", "flush"):
        p = _provider(home, agent_context=context)
        p.sync_turn("My password hint is blue.", "ok")
        p.on_memory_write("add", "memory", "cron noise")
        p.on_session_end([{"role": "user", "content": "I am a cron job."}])
        p.on_pre_compress([{"role": "user", "content": "I am a cron job."}])
        p.on_delegation("task", "result")
        assert "read-only" in json.loads(p.handle_tool_call("fastmem_remember", {"text": "x"}))["error"]
        assert "read-only" in json.loads(p.handle_tool_call("fastmem_forget", {"id": "m0"}))["error"]
        assert "read-only" in json.loads(p.handle_tool_call("fastmem_pin", {"id": "m0"}))["error"]
        assert json.loads(p.handle_tool_call("fastmem_search", {"query": "password"}))["results"] == []
        p.shutdown()
    assert _texts(home) == []


def test_each_user_has_a_store_of_their_own(home):
    alice = _provider(home, user_id="alice", platform="telegram")
    bob = _provider(home, user_id="bob", platform="telegram")
    alice_on_discord = _provider(home, user_id="alice", platform="discord")
    alice.sync_turn("My bank is Nordea and my PIN hint is a river.", "Noted.")
    alice.handle_tool_call("fastmem_remember", {"text": "Alice's PIN hint is a river.", "pin": True})
    bob.sync_turn("My bank is Chase.", "Noted.")
    for p in (alice, bob, alice_on_discord):
        p.shutdown()
    spy = _provider(home, "later", user_id="bob", platform="telegram")
    assert "river" not in spy.system_prompt_block()
    for query in ("bank PIN hint river Nordea", "Alice", "my bank"):
        assert "Nordea" not in spy.prefetch(query) and "river" not in spy.prefetch(query)
        assert "Nordea" not in spy.handle_tool_call("fastmem_search", {"query": query})
    assert "Chase" in spy.handle_tool_call("fastmem_search", {"query": "bank"})
    spy.shutdown()
    # The same user id on another platform is another person: nothing was written there.
    assert user_namespace("alice", "discord") != user_namespace("alice", "telegram")
    assert fastmem.namespaces.list_namespaces(os.path.join(home, "fastmem")) == sorted(
        [user_namespace("alice", "telegram"), user_namespace("bob", "telegram")])
    assert user_namespace(None) == user_namespace("") == "default"
    assert user_namespace("Alice", "telegram") != user_namespace("alice", "telegram")
    fastmem.namespaces.check_namespace(user_namespace("x" * 500, "p" * 100))


# --- several providers, threads and processes -------------------------------------------------


def test_several_providers_on_one_profile_share_the_store_and_lose_nothing(home):
    providers = [_provider(home, f"s{i}") for i in range(4)]
    assert len({p.store_path for p in providers}) == 1
    assert hermes._registry[providers[0].store_path].refs == 4

    def talk(i: int, p: FastmemProvider) -> None:
        for j in range(100):
            p.sync_turn(f"agent {i} turn {j}", "ok", session_id=f"s{i}")
            if j % 25 == 0:
                p.handle_tool_call("fastmem_remember", {"text": f"agent {i} fact {j}"})
                p.prefetch(f"agent {i}")

    threads = [threading.Thread(target=talk, args=(i, p)) for i, p in enumerate(providers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in providers[:3]:
        p.shutdown()
    # The last provider keeps the store open and the writer running.
    assert providers[3].handle_tool_call("fastmem_search", {"query": "agent"}) != ""
    providers[3].shutdown()
    assert providers[0].store_path not in hermes._registry
    texts = _texts(home)
    for i in range(4):
        turns = [t for t in texts if t.startswith(f"User: agent {i} turn ")]
        assert turns == [f"User: agent {i} turn {j}\nAssistant: ok" for j in range(100)]  # in order
        assert sum(t.startswith(f"agent {i} fact") for t in texts) == 4


# One Hermes process on a profile: a provider that waits for a start signal (so that the
# processes of a test write at the same time), syncs n turns and shuts down as Hermes does.
WRITER = textwrap.dedent("""
    import os, sys, time
    from fastmem.integrations import _writer, hermes
    from fastmem.integrations.hermes import FastmemProvider
    home, tag, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if os.environ.get("TEST_WRITE_WAIT"):
        _writer.WRITE_WAIT = float(os.environ["TEST_WRITE_WAIT"])
    if os.environ.get("TEST_SHUTDOWN_TIMEOUT"):
        hermes.SHUTDOWN_TIMEOUT = float(os.environ["TEST_SHUTDOWN_TIMEOUT"])
    p = FastmemProvider(); p.initialize("s-" + tag, hermes_home=home, platform="cli")
    print("ready", flush=True)
    while go and not os.path.exists(go):
        time.sleep(0.005)
    for i in range(n):
        p.sync_turn(f"{tag} turn {i} token{tag}x{i}", "ok")
        if i % 10 == 0:
            time.sleep(0.002)  # a turn takes time: the processes' writes interleave
    p.shutdown()
    print("done")
""")


def _start_writer(home: str, tag: str, n: int, go: str = "", **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, home, tag, str(n), go], env={**_child_env(home), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0 and out.strip().endswith("done"), err
    return err


def _start_together(procs: list[subprocess.Popen[str]], go: str) -> None:
    for proc in procs:  # every process imported and initialized: then all start at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    open(go, "w").close()


def _write_together(home: str, go: str, tags: list[str], n: int) -> None:
    """One WRITER process per tag, n turns each, all at the same time; back when all exit."""
    procs = [_start_writer(home, tag, n, go, **PATIENT) for tag in tags]
    _start_together(procs, go)
    for proc in procs:
        _wait_for(proc)


def _turns(texts: list[str], tag: str) -> list[str]:
    """The turns a WRITER process tagged ``tag`` stored, in store order."""
    return [t for t in texts if t.startswith(f"User: {tag} turn ")]


def _written(tag: str, n: int) -> list[str]:
    """What a WRITER process tagged ``tag`` writes, in its order."""
    return [f"User: {tag} turn {i} token{tag}x{i}\nAssistant: ok" for i in range(n)]


def _spill_files(home: str) -> list[str]:
    return sorted(f for f in os.listdir(os.path.dirname(_provider_path(home))) if f.startswith("pending-"))


# A fresh Hermes process right after the writers: every turn found by the fastmem_search
# tool at once (no sleep, no retry). Prints the turns it did not find.
SEARCHER = textwrap.dedent("""
    import json, sys
    from fastmem.integrations.hermes import FastmemProvider
    home, tags, n = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    p = FastmemProvider(); p.initialize("fresh", hermes_home=home, platform="cli")
    missing = []
    for tag in tags:
        for i in range(n):
            reply = json.loads(p.handle_tool_call("fastmem_search", {"query": f"token{tag}x{i}", "limit": 1}))
            texts = [r["text"] for r in reply.get("results", [])]
            if texts != [f"User: {tag} turn {i} token{tag}x{i}\\nAssistant: ok"]:
                missing.append((tag, i, reply))
    p.shutdown()
    print(json.dumps(missing))
""")


def _search_every_turn(home: str, tags: list[str], n: int) -> list[Any]:
    out = subprocess.run([sys.executable, "-c", SEARCHER, home, ",".join(tags), str(n)], env=_child_env(home),
                         capture_output=True, text=True, timeout=HANG)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_three_processes_on_one_profile_and_a_fresh_search_finds_every_turn_at_once(home, tmp_path):
    """Issue 17: three Hermes processes write 50 turns each at the same time; a process
    started right after they exit finds all 150 (before: 4 of 10 sampled, the rest in
    pending files until some process imported them)."""
    tags = ["cli", "gateway", "cron"]
    _write_together(home, str(tmp_path / "go"), tags, 50)
    assert _search_every_turn(home, tags, 50) == []
    assert _spill_files(home) == []  # no side files in normal operation
    texts = _texts(home)
    assert len(texts) == 150
    for tag in tags:  # each process's turns in its order
        assert _turns(texts, tag) == _written(tag, 50)
    with fastmem.open(_provider_path(home), readonly=True) as store:
        assert store.verify().ok


def _provider_path(home: str) -> str:
    return os.path.join(home, "fastmem", "default", "memory")


def test_a_running_gateway_sees_what_a_cli_beside_it_wrote_at_once(home):
    gateway = _provider(home, "gw")
    gateway.sync_turn("gateway turn", "ok")
    assert gateway.flush(HANG)
    _wait_for(_start_writer(home, "cli", 50))
    # No wait, no import: the CLI wrote to the store itself.
    for i in (0, 25, 49):
        hits = json.loads(gateway.handle_tool_call("fastmem_search", {"query": f"tokenclix{i}"}))["results"]
        assert hits[0]["text"] == _written("cli", 50)[i]
    gateway.sync_turn("gateway again", "ok")
    gateway.shutdown()
    texts = _texts(home)
    assert texts[0] == "User: gateway turn\nAssistant: ok" and texts[-1] == "User: gateway again\nAssistant: ok"
    assert len(texts) == 52 and _spill_files(home) == []


# Holds the store's writer lock (the flock on the data file) until its stdin closes: a
# repair of a huge store, or a process stopped in the middle of a write.
LOCK_HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
""")


class _HeldLock:
    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_write_that_meets_a_lock_held_too_long_is_kept_and_written_later_in_order(home, monkeypatch):
    monkeypatch.setattr(_writer, "WRITE_WAIT", 0.4)
    p = _provider(home)
    p.sync_turn("before", "ok")
    assert p.flush(HANG)
    lock = _HeldLock(_provider_path(home) + ".dat")
    try:
        for i in range(5):
            p.sync_turn(f"locked {i}", "ok")
        reply = json.loads(p.handle_tool_call("fastmem_remember", {"text": "Kept while locked."}))
        assert reply["ok"] and reply["pending"] is True and "id" not in reply
        assert p.flush(HANG)
        assert len(_spill_files(home)) >= 1  # durable, beside the store
        p.sync_turn("behind the kept ones", "ok")  # must not overtake them
        assert p.flush(HANG)
        assert [t for t in _texts(home)] == ["User: before\nAssistant: ok"]
        # Reads never wait for the lock, and see what was written.
        assert json.loads(p.handle_tool_call("fastmem_search", {"query": "before"}))["results"]
    finally:
        lock.release()
    p.sync_turn("after", "ok")  # the next batch takes the kept writes in first
    assert p.flush(HANG)
    assert _spill_files(home) == []
    expected = (["User: before\nAssistant: ok"] + [f"User: locked {i}\nAssistant: ok" for i in range(5)]
                + ["Kept while locked.", "User: behind the kept ones\nAssistant: ok", "User: after\nAssistant: ok"])  # fmt: skip
    assert _texts(home) == expected
    p.shutdown()
    assert _texts(home) == expected  # nothing twice


def test_writes_kept_at_a_lock_are_imported_once_by_the_next_processes(home, tmp_path):
    """A process that shuts down while another holds the lock keeps its writes in a file;
    three processes that start at once all look for it: it is imported exactly once."""
    p = _provider(home)
    p.sync_turn("created", "ok")
    p.shutdown()
    lock = _HeldLock(_provider_path(home) + ".dat")
    try:
        _wait_for(_start_writer(home, "kept", 300, TEST_WRITE_WAIT="0.3"))
    finally:
        lock.release()
    kept = _spill_files(home)
    assert kept and len(_texts(home)) == 1
    _write_together(home, str(tmp_path / "go"), ["a", "b", "c"], 5)
    assert _spill_files(home) == []
    texts = _texts(home)
    assert _turns(texts, "kept") == _written("kept", 300)  # once, in order
    assert len(texts) == 1 + 300 + 15


def test_a_damaged_spill_file_is_imported_as_far_as_it_goes_and_kept_aside(home, caplog):
    p = _provider(home)
    p.sync_turn("created", "ok")
    p.shutdown()
    directory = os.path.dirname(_provider_path(home))
    name = os.path.join(directory, "pending-1.000000-1-aaaaaaaa.jsonl")
    good = [{"kind": "add", "args": {"text": "kept one"}}, {"kind": "add", "args": {"text": "kept two"}},
            {"kind": "add", "args": {"text": ""}},  # refused by the store: skipped, logged
            {"kind": "forget", "args": "m999"}]  # fmt: skip
    with open(name, "w", encoding="utf-8") as f:
        f.write(json.dumps(good[0]) + "\n{not json\n\xff\n" + "\n".join(json.dumps(g) for g in good[1:]) + "\n[1]\n")
    with caplog.at_level("WARNING", logger="fastmem"):
        _provider(home, "next").shutdown()  # imports at its start
    assert _texts(home) == ["User: created\nAssistant: ok", "kept one", "kept two"]
    assert _spill_files(home) == []
    assert os.path.exists(os.path.join(directory, "damaged-" + os.path.basename(name)))
    assert "3 damaged lines" in caplog.text and "m999" in caplog.text
    _provider(home, "again").shutdown()
    assert len(_texts(home)) == 3  # not imported twice


def test_fastmem_import_beside_a_writing_hermes_process(home, tmp_path):
    """`fastmem import` of 10,000 memories while a Hermes process writes turns: both
    finish, nothing refused, nothing kept aside, every memory there once."""
    p = _provider(home)
    p.sync_turn("created", "ok")
    p.shutdown()
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"text": f"imported memory {i}", "type": "fact"}) + "\n"
                             for i in range(10_000)))  # fmt: skip
    go = str(tmp_path / "go")
    hermes_proc = _start_writer(home, "agent", 300, go, **PATIENT)
    assert hermes_proc.stdout is not None and hermes_proc.stdout.readline().strip() == "ready"
    importer = subprocess.Popen([sys.executable, "-m", "fastmem", "import", _provider_path(home), str(lines),
                                 "--json"], env=_child_env(home), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    open(go, "w").close()
    out, err = importer.communicate(timeout=HANG)
    assert importer.returncode == 0, err
    assert json.loads(out)["imported"] == 10_000
    _wait_for(hermes_proc)
    assert _spill_files(home) == []
    texts = _texts(home)
    assert len(texts) == 1 + 10_000 + 300
    assert [t for t in texts if t.startswith("imported memory")] == [f"imported memory {i}" for i in range(10_000)]
    assert _turns(texts, "agent") == _written("agent", 300)


def test_a_store_another_process_writes_to_gets_the_writes_at_once(home):
    p = _provider(home)
    p.sync_turn("created", "ok")
    assert p.flush(HANG)
    path = p.store_path
    p.shutdown()
    other = fastmem.open(path, embedder=None)  # another process's writer, in effect
    try:
        q = _provider(home, "s2")
        q.sync_turn("written beside another writer", "ok")
        q.on_memory_write("add", "user", "Likes jazz.")
        reply = json.loads(q.handle_tool_call("fastmem_remember", {"text": "Plays chess."}))
        assert reply["ok"] and not reply.get("pending")
        assert q.flush(HANG)
        assert len(other) == 4  # seen at once by the other writer: no side file, no delay
        other.add("written by the other process")
        q.shutdown()
        assert not [f for f in os.listdir(os.path.dirname(path)) if f.startswith("pending-")]
    finally:
        other.close()
    assert _texts(home) == ["User: created\nAssistant: ok",
                            "User: written beside another writer\nAssistant: ok",
                            "Likes jazz.", "Plays chess.", "written by the other process"]  # fmt: skip


def test_a_backlog_past_the_shutdown_deadline_is_kept_not_dropped(home, monkeypatch):
    monkeypatch.setattr(hermes, "SHUTDOWN_TIMEOUT", 0.3)
    monkeypatch.setattr(_writer, "MAX_BATCH", 1)
    slow_add = _writer._Writer._add_run

    def slow(self, store, ops):  # an embedding model on a busy CPU
        time.sleep(0.1)
        return slow_add(self, store, ops)

    monkeypatch.setattr(_writer._Writer, "_add_run", slow)
    p = _provider(home)
    for i in range(20):
        p.sync_turn(f"turn {i}", "ok")
    p.shutdown()  # returns within the deadline (and the join's second)
    written = len(_texts(home))
    assert written < 20
    monkeypatch.setattr(_writer._Writer, "_add_run", slow_add)
    _provider(home, "s2").shutdown()  # the next writer imports what was kept
    assert _texts(home) == [f"User: turn {i}\nAssistant: ok" for i in range(20)]


# --- end to end: real agents, a fake model, separate processes ------------------------------------


class _FakeModel:
    """An OpenAI-compatible endpoint on 127.0.0.1 that records every chat request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    body = {"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                        "context_length": 131072}]}  # fmt: skip
                    self._send(200, json.dumps(body).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.endswith("/chat/completions"):
                    self._send(404, b"{}")
                    return
                request = json.loads(data)
                model.requests.append(request)
                reply = "Understood."
                if request.get("stream"):
                    chunks = [
                        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": reply}}]},
                        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                                  "total_tokens": 12}},
                    ]  # fmt: skip
                    body = "".join(
                        "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk",
                                               "created": 0, "model": "fake-model", **c}) + "\n\n"
                        for c in chunks
                    ) + "data: [DONE]\n\n"  # fmt: skip
                    self._send(200, body.encode(), "text/event-stream")
                else:
                    body = {"id": "c1", "object": "chat.completion", "created": 0, "model": "fake-model",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}  # fmt: skip
                    self._send(200, json.dumps(body).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def last_user_message(self, marker: str) -> str:
        """The user message of the last request whose user turn starts with ``marker``."""
        for request in reversed(self.requests):
            users = [m for m in request.get("messages", []) if m.get("role") == "user"]
            if users:
                content = users[-1]["content"]
                text = content if isinstance(content, str) else json.dumps(content)
                if text.startswith(marker):
                    return text
        raise AssertionError(f"no request for {marker!r}: {len(self.requests)} requests")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# One process of a Hermes deployment: agents (one per user, as the gateway keeps them) each
# run their turns, then leave as the CLI does (flush, on_session_end + shutdown, close).
AGENT_SCRIPT = textwrap.dedent("""
    import json, sys
    from run_agent import AIAgent
    url, steps = sys.argv[1], json.loads(sys.argv[2])
    agents, history = {}, {}
    for user, text in steps:
        if user not in agents:
            agents[user] = AIAgent(base_url=url, api_key="test", model="fake-model",
                                   api_mode="chat_completions", quiet_mode=True,
                                   skip_context_files=True, enabled_toolsets=["memory"],
                                   max_iterations=3, platform="cli", user_id=user or None)
            provider = agents[user]._memory_manager.get_provider("fastmem")
            assert provider is not None, "fastmem was not loaded"
        result = agents[user].run_conversation(text, conversation_history=history.get(user))
        history[user] = result["messages"]
    for user, agent in agents.items():
        agent._memory_manager.flush_pending(300)
        agent.shutdown_memory_provider(agent._session_messages)
        agent.close()
    print("ok")
""")


def _run_agents(home: str, url: str, steps: list[tuple[str, str]]) -> None:
    out = subprocess.run([sys.executable, "-c", AGENT_SCRIPT, url, json.dumps(steps)], cwd=home,
                         env=_child_env(home), capture_output=True, text=True, timeout=HANG)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _memory_block(text: str) -> str:
    assert "<memory-context>" in text, text[:500]
    return text.split("<memory-context>", 1)[1].split("</memory-context>", 1)[0]


def test_end_to_end_a_restarted_agent_remembers_and_users_stay_apart(home):
    with open(os.path.join(home, "config.yaml"), "a") as f:
        f.write("model:\n  context_length: 131072\n")
    model = _FakeModel()
    try:
        started = time.perf_counter()
        _run_agents(home, model.url, [
            ("", "Hello! My cat is called Miso and she is a grey tabby."),
            ("", "I am learning the bassoon this year."),
            ("alice", "Alice here. My favourite city is Lisbon."),
            ("bob", "Bob here. My favourite city is Oslo."),
        ])  # fmt: skip
        # Same session: the first turn's memory is not recalled into the second turn.
        assert "Miso" not in model.last_user_message("I am learning")
        _run_agents(home, model.url, [
            ("", "What is my cat called?"),
            ("alice", "Alice asks: what is my favourite city?"),
            ("bob", "Bob asks: what is my favourite city?"),
        ])  # fmt: skip
        elapsed = time.perf_counter() - started
    finally:
        model.close()
    cat = _memory_block(model.last_user_message("What is my cat called?"))
    assert "Miso" in cat and "Lisbon" not in cat and "Oslo" not in cat
    alice = _memory_block(model.last_user_message("Alice asks"))
    assert "Lisbon" in alice and "Oslo" not in alice and "Miso" not in alice
    bob = _memory_block(model.last_user_message("Bob asks"))
    assert "Oslo" in bob and "Lisbon" not in bob and "Miso" not in bob
    # The system prompt carries the provider's block.
    system = [m for m in model.requests[-1]["messages"] if m["role"] == "system"][0]["content"]
    assert "fastmem_remember" in system
    assert elapsed < 300  # a hang guard (a write waiting forever), not a speed target: 20-70 s here


def test_the_entry_point_for_later_hermes_versions_registers_the_provider():
    from importlib.metadata import entry_points

    # The installed distribution's metadata (editable or wheel), as Hermes would look it up.
    (entry,) = entry_points(group="hermes_agent.memory_providers", name="fastmem")
    register = entry.load()

    class Ctx:
        provider = None

        def register_memory_provider(self, provider: Any) -> None:
            self.provider = provider

    ctx = Ctx()
    register(ctx)
    assert isinstance(ctx.provider, FastmemProvider) and isinstance(ctx.provider, MemoryProvider)


def test_prefetch_leaves_out_the_current_sessions_memories_even_before_their_ids_are_known(home):
    # A write is readable a moment before the provider learns its id; a second provider on
    # the same session stands in for that moment: its writes are not in the first one's set.
    p = _provider(home, "same")
    other = _provider(home, "same")
    other.sync_turn("My boat is called Wavelet.", "Nice.", session_id="same")
    assert other.flush(HANG)
    assert "Wavelet" not in p.prefetch("what is my boat called?")
    stranger = _provider(home, "another-session")
    assert "Wavelet" in stranger.prefetch("what is my boat called?")
    for q in (p, other, stranger):
        q.shutdown()

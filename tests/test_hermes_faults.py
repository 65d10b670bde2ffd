"""The Hermes provider under faults (issue 18, item 5): it never acknowledges a write it
did not make.

A real hermes-agent 0.19.0 provider (loaded by Hermes's own loader, driven through its
MemoryManager) writes while the fault seam (``tests/faults.py``) makes the store's file
operations fail with ENOSPC, EIO or EROFS. What the provider promises:

- its writer thread survives any exception;
- a write that fails is kept durably in a spill file and written once the fault clears
  (a tool call answers ``"pending": true``), or, when even that fails, reported as not
  saved: a tool call answers with an error, and the model is told in the next recall;
- a batch whose flush (fdatasync) failed is never resolved as written: it is kept and
  tried again, and reaches the store once (so does a spill file whose importer was killed);
- shutdown writes or keeps everything queued.
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any

import pytest
from faults import Faults

import fastmem
from fastmem.integrations import _writer, hermes
from fastmem.integrations.hermes import install

pytest.importorskip("agent.memory_provider", reason="hermes-agent is not installed")
from agent.memory_manager import MemoryManager  # noqa: E402
from plugins.memory import load_memory_provider  # noqa: E402

WRITER = "fastmem.integrations._writer"
HANG = 300.0  # seconds a wait may last: a guard against a hang, never a speed bound
STORE_WRITES = ("write", "fdatasync", "fsync", "fsync_dir", "ftruncate", "replace")


@pytest.fixture(autouse=True)
def backend():
    """No kernel is exercised: one run (tests/conftest.py's fixture would make two)."""
    yield fastmem.BACKEND


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "hermes"
    monkeypatch.setenv("HERMES_HOME", str(path))
    monkeypatch.setattr(_writer, "IDLE_TICK", 0.05)  # retries of kept writes come quickly
    install(str(path), activate=True)
    return str(path)


class Agent:
    """A real provider as Hermes loads and drives it (warnings it shows the user kept)."""

    def __init__(self, home: str, session: str = "s1") -> None:
        self.warnings: list[str] = []
        self.manager = MemoryManager()
        self.manager.add_provider(load_memory_provider("fastmem"))
        self.manager.initialize_all(session_id=session, platform="cli", hermes_home=home,
                                    agent_context="primary", warning_callback=self.warnings.append)  # fmt: skip
        self.provider: hermes.FastmemProvider = self.manager.get_provider("fastmem")

    def turn(self, text: str) -> None:
        self.manager.sync_all(text, "ok", session_id="s1")

    def remember(self, text: str) -> dict[str, Any]:
        return json.loads(self.manager.handle_tool_call("fastmem_remember", {"text": text}))

    def settle(self) -> bool:
        """Hermes's queue drained, then the provider's writer: whether it says all is on disk.
        (Their timeouts guard against a hang: a loaded machine may take more than seconds.)"""
        assert self.manager.flush_pending(HANG)
        return self.provider.flush(HANG)

    def close(self) -> None:
        self.manager.shutdown_all()


def _texts(home: str) -> list[str]:
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", readonly=True) as store:
        assert store.verify().ok
        return [m.text for m in store]


def _spill_files(home: str) -> list[str]:
    directory = os.path.join(home, "fastmem", "default")
    return sorted(f for f in os.listdir(directory) if f.startswith("pending-"))


def _turn(text: str) -> str:
    return f"User: {text}\nAssistant: ok"


def _created(home: str) -> None:
    agent = Agent(home)
    agent.turn("before")
    assert agent.settle()
    agent.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_writes_that_meet_a_failing_disk_are_kept_and_written_once_it_clears(home, code):
    """Every write of the store fails (a full disk, a broken device); the spill file beside
    it can still be written: the writes wait there, then reach the store, in order."""
    _created(home)
    agent = Agent(home)
    with Faults(fail_at=1, errno_=code, only=("write",), sticky=True):
        agent.turn("during 1")
        reply = agent.remember("Remembered during the fault.")
        agent.turn("during 2")
        assert reply == {**reply, "ok": True, "pending": True} and "id" not in reply, reply
        assert agent.settle()  # on disk: in a spill file
        assert _spill_files(home)
    agent.turn("after")
    assert agent.settle()
    expected = [_turn("before"), _turn("during 1"), "Remembered during the fault.", _turn("during 2"), _turn("after")]
    assert _texts(home) == expected
    assert _spill_files(home) == [] and agent.warnings == []
    agent.close()
    assert _texts(home) == expected  # nothing twice


def test_the_writer_survives_an_error_fastmem_does_not_name(home):
    """EROFS (a file system remounted read-only after errors) is no StoreFullError or
    DurabilityError: it reached the writer thread raw and killed it, and every later tool
    call then waited 10 s and answered "saved to a side file" for writes never made."""
    _created(home)
    agent = Agent(home)
    with Faults(fail_at=1, errno_=errno.EROFS, only=("write",), sticky=True, also=(WRITER,)):
        started = time.monotonic()
        reply = agent.remember("Refused by a read-only disk.")
        assert time.monotonic() - started < 5.0
        assert reply.get("error") and "id" not in reply and not reply.get("ok"), reply
    reply = agent.remember("After the fault.")
    assert reply["ok"] and reply["id"], reply
    agent.close()
    assert _texts(home) == [_turn("before"), "After the fault."]


def test_a_write_that_can_be_neither_made_nor_kept_is_reported_to_the_model(home):
    """A full disk takes the spill file too: the tool call answers not saved, the turn
    stored in the background is reported to the user (Hermes's warning line) and to the
    model (the next recall says which writes were lost), and flush() does not say done."""
    _created(home)
    agent = Agent(home)
    with Faults(fail_at=1, errno_=errno.ENOSPC, only=STORE_WRITES, sticky=True, also=(WRITER,)):
        agent.turn("lost turn")
        reply = agent.remember("Lost fact.")
        assert reply.get("error") and not reply.get("ok") and "not saved" in reply["error"], reply
        assert not agent.settle()
    assert _spill_files(home) == []
    assert agent.warnings and "not saved" in agent.warnings[0]
    recalled = agent.manager.prefetch_all("what did I say?")
    assert "1 memory write was NOT saved" in recalled  # the turn (the fact's reply said so)
    assert "not saved" not in agent.manager.prefetch_all("what else?")  # told once
    agent.turn("after")
    assert agent.settle()
    agent.close()
    assert _texts(home) == [_turn("before"), _turn("after")]


def test_shutdown_during_a_fault_keeps_everything_queued(home):
    _created(home)
    agent = Agent(home)
    with Faults(fail_at=1, errno_=errno.ENOSPC, only=("write",), sticky=True):
        for i in range(30):
            agent.turn(f"queued {i}")
        agent.close()  # Hermes drains its queue, then the provider's writer stops
        assert _spill_files(home)
    assert _texts(home) == [_turn("before")]
    Agent(home, "s2").close()  # the next start takes them in
    assert _texts(home) == [_turn("before")] + [_turn(f"queued {i}") for i in range(30)]
    assert _spill_files(home) == []


def test_kept_writes_stay_kept_when_their_import_meets_a_fault(home):
    """A spill file imported while the disk is full must not be dropped (its writes were
    skipped one by one, logged, and the file deleted)."""
    _created(home)
    directory = os.path.join(home, "fastmem", "default")
    name = os.path.join(directory, "pending-1.000000-1-aaaaaaaa.jsonl")
    with open(name, "w", encoding="utf-8") as f:
        now = time.time()  # (the store lists memories by their time)
        f.write("".join(json.dumps({"kind": "add", "args": {"text": f"kept {i}", "timestamp": now + i * 1e-6}}) + "\n"
                        for i in range(3)))  # fmt: skip
    with Faults(fail_at=1, errno_=errno.ENOSPC, only=("write",), sticky=True):
        agent = Agent(home)
        time.sleep(0.01)
        agent.turn("while full")
        assert agent.settle()
        assert os.path.exists(name)
        assert _texts(home) == [_turn("before")]
    agent.turn("after")
    assert agent.settle()
    agent.close()
    assert _texts(home) == [_turn("before"), "kept 0", "kept 1", "kept 2", _turn("while full"), _turn("after")]
    assert _spill_files(home) == []


# --- the sweep: each file operation of a provider's batch fails in turn ------------------


def _batch(agent: Agent, mid: str) -> dict[str, Any]:
    """One batch of every kind of write the provider makes; the tool calls' replies."""
    agent.turn("swept turn")
    replies = {"remember": agent.remember("Swept fact.")}
    replies["pin"] = json.loads(agent.manager.handle_tool_call("fastmem_pin", {"id": mid}))
    agent.manager.on_memory_write("add", "user", "Swept mirror.")
    replies["forget"] = json.loads(agent.manager.handle_tool_call("fastmem_forget", {"id": mid}))
    agent.settle()
    return replies


@pytest.mark.parametrize("spill_fails", [False, True], ids=["spill-works", "spill-fails"])
def test_fault_sweep_under_a_real_provider(home, tmp_path, spill_fails):
    """Each file operation the provider's writer makes for one batch (a turn, a remembered
    fact, a pin, a mirrored write, a forget) fails in turn with ENOSPC, EIO or EROFS, with
    the spill file writable or failing too. After each: the writer thread is alive; every
    write acknowledged (an id, or "pending": kept) is in the store once the fault clears;
    a background write missing from the store was reported to the model; the store
    verifies clean."""
    import shutil
    import threading

    agent = Agent(home)
    mid = agent.remember("Forget me later.")["id"]
    assert agent.settle()
    agent.close()
    template = tmp_path / "template"
    shutil.copytree(home, template)
    also = (WRITER,) if spill_fails else ()
    dry = Faults(also=also)
    with dry:
        agent = Agent(home)
        _batch(agent, mid)
    agent.close()
    n = len(dry.calls)
    assert n > 5
    tried = 0
    for k in range(1, n + 1):
        for code in (errno.ENOSPC, errno.EIO, errno.EROFS):
            shutil.rmtree(home)
            shutil.copytree(template, home)
            agent = Agent(home)
            faults = Faults(fail_at=k, errno_=code, also=also)
            with faults:
                replies = _batch(agent, mid)
            where = f"call {k}/{n} {faults.fired} fails with {errno.errorcode[code]}"
            assert [t for t in threading.enumerate() if t.name == "fastmem-writer" and t.is_alive()], where
            agent.turn("after the fault")
            agent.settle()
            notice = agent.manager.prefetch_all("after the fault")
            agent.close()
            Agent(home, "next").close()  # the next start imports what was kept
            texts = _texts(home)
            assert texts.count(_turn("after the fault")) == 1, where
            remembered = replies["remember"]
            if remembered.get("ok"):  # an id, or kept ("pending"): it must be there
                assert texts.count("Swept fact.") == 1, (where, remembered)
            else:
                assert "not saved" in remembered["error"], (where, remembered)
            for tool in ("pin", "forget"):
                assert replies[tool].get("ok") or "not saved" in replies[tool]["error"], (where, replies[tool])
            if replies["forget"].get("ok"):
                assert "Forget me later." not in texts, where
            missing = [t for t in (_turn("swept turn"), "Swept mirror.") if t not in texts]
            if missing:
                assert "NOT saved" in notice, (where, missing)
            assert _spill_files(home) == [], where
            tried += 1
    print(f"\nprovider sweep ({'spill fails too' if spill_fails else 'spill works'}): {n} calls, {tried} combinations")


# A process with a provider forks (a gateway's worker, a tool's subprocess via fork); the
# child's provider must have a writer of its own: the parent's writer thread is not there.
FORKING = """
import json, os, sys, time
from fastmem.integrations.hermes import FastmemProvider
home = sys.argv[1]
p = FastmemProvider(); p.initialize("parent", hermes_home=home, platform="cli")
assert json.loads(p.handle_tool_call("fastmem_remember", {"text": "From the parent."}))["id"]
pid = os.fork()
if pid == 0:
    q = FastmemProvider(); q.initialize("child", hermes_home=home, platform="cli")
    reply = json.loads(q.handle_tool_call("fastmem_remember", {"text": "From the child."}))
    q.shutdown()
    os._exit(0 if reply.get("id") else 1)
deadline = time.monotonic() + 240
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9); os.waitpid(pid, 0); print("the child hung"); os._exit(2)
    time.sleep(0.05)
p.shutdown()
os._exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_gets_a_writer_of_its_own(home):
    import subprocess
    import sys

    env = dict(os.environ, HERMES_HOME=home, FASTMEM_EMBEDDER="none")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(fastmem.__file__)), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", FORKING, home], env=env, capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(_texts(home)) == ["From the child.", "From the parent."]


# --- kept writes are applied once: an importer killed mid-import, a failed flush -----------

IMPORTER = """
import sys, time
import fastmem
from fastmem.integrations.hermes import FastmemProvider
add_many = fastmem.MemoryStore.add_many
def slow(self, items):  # each commit takes 2 ms more: the kill lands mid-import on a loaded machine too
    time.sleep(0.002)
    return add_many(self, items)
fastmem.MemoryStore.add_many = slow
p = FastmemProvider(); p.initialize("importer", hermes_home=sys.argv[1], platform="cli")
time.sleep(600)  # the writer imports the spill file meanwhile; the test kills this process
"""
KEPT = 2000  # kept writes, each its own commit: the import takes seconds, long enough to be cut


def _spill_file(home: str, n: int) -> str:
    """A spill file of ``n`` adds, each under its own op id (each its own commit)."""
    directory = os.path.join(home, "fastmem", "default")
    name = os.path.join(directory, "pending-1.000000-1-bbbbbbbb.jsonl")
    now = time.time()
    with open(name, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps({"kind": "add", "op": f"op{i}", "args": {
            "text": f"kept {i}", "type": "conversation", "timestamp": now + i * 1e-6, "session": "s1"}}) + "\n"
            for i in range(n)))  # fmt: skip
    return name


def test_an_importer_killed_mid_import_applies_nothing_twice(home):
    """A process importing a spill file is killed (SIGKILL) after some of its writes
    reached the store: the file stays, the next writer imports it again, and every kept
    write is in the store once (it used to apply the whole file again: duplicates)."""
    import signal
    import subprocess
    import sys

    _created(home)
    name = _spill_file(home, KEPT)
    env = dict(os.environ, HERMES_HOME=home, FASTMEM_EMBEDDER="none")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(fastmem.__file__)), env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, "-c", IMPORTER, home], env=env)
    store_dir = os.path.join(home, "fastmem")
    try:
        with fastmem.open(store_dir, namespace="default", readonly=True, embedder=None) as store:
            deadline = time.monotonic() + HANG
            while len(store) < 1 + 20:  # the store's first memory and 20 kept writes
                assert child.poll() is None and time.monotonic() < deadline, "the importer never started"
                time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert os.path.exists(name), "the import finished before the kill: make KEPT larger"
    agent = Agent(home, "next")  # the next start imports what is left
    assert agent.settle()
    agent.close()
    texts = _texts(home)
    counts = {t: texts.count(t) for t in texts}
    assert [t for t, c in counts.items() if c > 1] == []
    assert texts == [_turn("before")] + [f"kept {i}" for i in range(KEPT)]
    assert _spill_files(home) == []


class _LosingSync(Faults):
    """The store's fdatasync fails once; with ``lose``, the bytes written since the last
    sync are gone with it (a device that dropped its dirty pages): the data file is cut
    back to its size at ``size``."""

    def __init__(self, dat: str, lose: bool) -> None:
        super().__init__(fail_at=1, errno_=errno.EIO, only=("fdatasync",))
        self.dat, self.lose, self.size = dat, lose, os.path.getsize(dat)

    def tick(self, kind: str, what: Any) -> str | None:
        if self.lose and self.fired is None and (self.only is None or kind in self.only):
            os.truncate(self.dat, self.size)
        return super().tick(kind, what)


@pytest.mark.parametrize("lose", [False, True], ids=["bytes-reached-the-file", "bytes-lost-with-the-sync"])
def test_a_failed_flush_is_retried_later_without_loss_or_duplication(home, lose):
    """The writer's fdatasync fails (EIO) after its batch was appended: the batch is kept
    (a tool call answers pending) and tried again once the fault clears; it ends up in
    the store once, whether its bytes reached the file (nothing re-added) or were lost with
    the failed sync (added again). It used to be answered "not saved" and never retried."""
    _created(home)
    agent = Agent(home)
    dat = os.path.join(home, "fastmem", "default", "memory.dat")
    with _LosingSync(dat, lose) as faults:
        reply = agent.remember("Its sync fails.")
        assert faults.fired is not None
    assert reply == {**reply, "ok": True, "pending": True}, reply
    assert agent.settle()
    reply = agent.remember("After the fault.")
    assert reply["ok"] and reply["id"], reply
    agent.turn("after")
    assert agent.settle()
    agent.close()
    expected = [_turn("before"), "Its sync fails.", "After the fault.", _turn("after")]
    assert _texts(home) == expected
    assert _spill_files(home) == [] and agent.warnings == []


@pytest.mark.parametrize("mark", [None, "m0", "not an id"])
def test_a_marked_spill_file_skips_what_an_earlier_import_applied(home, mark):
    """A spill file an earlier import started (its first line the mark, as the importer
    writes it before its first write): an add and a mirrored memory-tool write it already
    applied are not applied again; the rest is. A mark that is no id (damage) means every
    memory is looked at: more work, never a write twice."""
    _created(home)
    now = time.time()
    add = {"text": "applied before", "type": "fact", "timestamp": now, "session": "s1"}
    mirror = {"action": "add", "target": "user", "content": "Mirrored before.", "old_text": "",
              "metadata": {}, "timestamp": now + 1e-6}  # fmt: skip
    with fastmem.open(os.path.join(home, "fastmem"), namespace="default", embedder=None) as store:
        store.add(**add)
        hermes._mirror(store, **mirror)
    later = {"text": "not applied yet", "type": "fact", "timestamp": now + 2e-6, "session": "s1"}
    name = os.path.join(home, "fastmem", "default", "pending-1.000000-1-cccccccc.jsonl")
    with open(name, "w", encoding="utf-8") as f:
        for line in ({_writer.MARK: mark}, {"kind": "add", "args": add, "op": "a"},
                     {"kind": "mirror", "args": mirror, "op": "b"}, {"kind": "add", "args": later, "op": "c"}):  # fmt: skip
            f.write(json.dumps(line) + "\n")
    agent = Agent(home, "next")
    assert agent.settle()
    agent.close()
    assert _texts(home) == [_turn("before"), "applied before", "Mirrored before.", "not applied yet"]
    assert _spill_files(home) == []

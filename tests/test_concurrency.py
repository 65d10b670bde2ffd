"""Concurrency: writer processes contending for the lock, reader processes reading during
the writes, a writer killed while it holds the lock, threads sharing a store, and fork.

Every memory's text carries its own digest, so a reader can tell a whole memory from a
partial or garbled one without knowing what was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import fastmem

WRITERS, READERS, ROUNDS, PER_ROUND = 4, 4, 4, 12

COMMON = r"""
import hashlib, json, os, sys, time, fastmem

def text(body):
    return body + " #" + hashlib.sha256(body.encode()).hexdigest()[:16]

def whole(memory):
    body, _, digest = memory.text.rpartition(" #")
    meta = memory.metadata or {}
    return digest == hashlib.sha256(body.encode()).hexdigest()[:16] and meta.get("body") == body
"""

# A writer: rounds of open (waiting for the lock) -> add, add_many -> close; it reports
# each memory once add returned.
WRITER = COMMON + r"""
path, w = sys.argv[1], int(sys.argv[2])
for r in range(int(sys.argv[3])):
    with fastmem.open(path, timeout=120, embedder=None, durability=sys.argv[5]) as s:
        bodies = [f"writer {w} round {r} item {i} " + "words " * ((w + i) % 9) for i in range(int(sys.argv[4]))]
        ids = [s.add(text(bodies[0]), metadata={"body": bodies[0]}, session=f"w{w}")]
        ids += s.add_many([{"text": text(b), "metadata": {"body": b}, "session": f"w{w}"} for b in bodies[1:]])
        for mid, b in zip(ids, bodies):
            print(json.dumps([mid, text(b)]), flush=True)
    time.sleep(0.01)
"""

# A reader: one handle kept open and a fresh one now and then, until the stop file exists.
READER = COMMON + r"""
path, stop = sys.argv[1], sys.argv[2]
checks, last = 0, 0
kept = fastmem.open(path, readonly=True, embedder=None)
while True:
    finished = os.path.exists(stop)  # then one more pass, which sees everything
    fresh = fastmem.open(path, readonly=True, embedder=None) if checks % 5 == 0 else None
    for s in filter(None, (kept, fresh)):
        n = len(s)
        if s is kept:
            assert n >= last, f"the count went down: {last} -> {n}"
            last = n
        got = list(s)
        assert len(got) >= n and len({m.id for m in got}) == len(got), "an id twice"
        assert all(whole(m) for m in got), "a partial or garbled memory"
        assert all(whole(m) for m in s.recent(8))
        assert all(whole(h.memory) for h in s.search("writer round", 5, mode="keyword"))
        checks += 1
    if fresh is not None:
        fresh.close()
    if finished:
        break
print(json.dumps([checks, len(kept)]))
kept.close()
"""

# Holds the lock after acknowledging a few memories, until it is killed.
VICTIM = COMMON + r"""
path = sys.argv[1]
s = fastmem.open(path, timeout=120, embedder=None, durability="always")
for i in range(5):
    body = f"victim item {i}"
    print(json.dumps([s.add(text(body), metadata={"body": body}), text(body)]), flush=True)
print(json.dumps(["holding"]), flush=True)
time.sleep(120)
"""


def _spawn(code: str, *args: object, backend: str) -> subprocess.Popen:
    env = dict(os.environ, FASTMEM_BACKEND=backend, PYTHONWARNINGS="error")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def _digest_ok(text: str) -> bool:
    body, _, digest = text.rpartition(" #")
    return digest == hashlib.sha256(body.encode()).hexdigest()[:16]


def test_writer_and_reader_processes(tmp_path, backend):
    """4 writers contend for the lock (one SIGKILLed while holding it), 4 readers read
    throughout: nothing acknowledged is lost or doubled, no reader sees a partial memory."""
    if backend == "python":  # the lock and file protocol do not depend on the kernels
        pytest.skip("runs once, with the compiled kernels (9 processes)")
    path, stop = str(tmp_path / "shared"), str(tmp_path / "stop")
    with fastmem.open(path, embedder=None):
        pass
    victim = _spawn(VICTIM, path, backend=backend)
    acked = []
    for line in victim.stdout:  # the victim holds the lock from here on
        msg = json.loads(line)
        if msg == ["holding"]:
            break
        acked.append(tuple(msg))
    readers = [_spawn(READER, path, stop, backend=backend) for _ in range(READERS)]
    writers = [
        _spawn(WRITER, path, w, ROUNDS, PER_ROUND, ("always", "batch", "none", "batch")[w], backend=backend)
        for w in range(WRITERS)
    ]  # fmt: skip
    time.sleep(0.5)  # the writers wait on the lock the victim holds...
    victim.send_signal(signal.SIGKILL)  # ...which its death releases
    victim.wait(timeout=30)
    victim.stdout.close()
    victim.stderr.close()
    for proc in writers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        acked += [tuple(json.loads(line)) for line in out.splitlines()]
    with open(stop, "w"):
        pass
    for proc in readers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        checks, _ = json.loads(out)
        assert checks > 1
    assert len(acked) == 5 + WRITERS * ROUNDS * PER_ROUND
    with fastmem.open(path, embedder=None, readonly=True) as store:
        stored = [(m.id, m.text) for m in store]
        assert sorted(stored) == sorted(acked)  # none lost, none twice, each byte-identical
        assert all(_digest_ok(text) for _, text in stored)
        assert store.verify().ok


# A reader paused with a torn tail in its map of the data file (right after the map is made
# at open or at a later call's catch-up, or before verify() scans the file); a writer cuts
# the tail meanwhile (see the test below).
CUT_READER = r"""
import sys, fastmem, fastmem.storage.engine as engine, fastmem.storage.maintenance as maintenance, fastmem.storage.handle_state as state
path, where = sys.argv[1], sys.argv[2]

def paused(real):
    def call(*args, **kwargs):
        if where == "verify":
            pause()
        result = real(*args, **kwargs)
        if where != "verify":
            pause()
        return result
    return call

def pause():
    print("mapped", flush=True)
    sys.stdin.readline()  # the parent cuts the tail meanwhile

if where == "open":
    state.map_same = paused(state.map_same)  # the open's map (_state.build)
store = fastmem.open(path, readonly=True, embedder=None)
if where == "refresh":
    engine.map_data = paused(engine.map_data)
if where == "verify":
    maintenance.build_index = paused(maintenance.build_index)
    store.verify()
print(len(store), flush=True)
"""


@pytest.mark.parametrize("where", ["open", "refresh", "verify"])
def test_a_reader_survives_a_writer_cutting_the_tail_it_mapped(tmp_path, backend, where):
    """A reader maps the data file with a torn tail (here 64 KiB of zeros: blocks allocated,
    never written); a writer cuts the tail before the reader has read it. Bytes past the
    new end of file must not be read through the map (that is SIGBUS, which kills the
    process): the reader reads what is there now and sees the writer's new record."""
    path = str(tmp_path / "cut")
    with fastmem.open(path, embedder=None) as store:
        store.add("before the tail")
    with open(path + ".dat", "ab") as f:
        f.write(bytes(64 * 1024))
    reader = subprocess.Popen(
        [sys.executable, "-c", CUT_READER, path, where], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, FASTMEM_BACKEND=backend),
    )  # fmt: skip
    try:
        assert reader.stdout.readline() == "mapped\n", reader.stderr.read()
        with warnings.catch_warnings():
            warnings.simplefilter("error", fastmem.RecoveryWarning)  # the cut is quiet
            with fastmem.open(path, embedder=None) as store:  # cuts the tail, under the lock
                store.add("after the cut")
        assert os.path.getsize(path + ".dat") < 4096  # the reader's mapped pages are gone
        out, err = reader.communicate("\n", timeout=120)
    finally:
        if reader.returncode is None:
            reader.kill()
            reader.communicate()
    assert reader.returncode != -signal.SIGBUS, "the reader read a cut page through its map"
    assert reader.returncode == 0, err
    assert out == "2\n"


def test_threads_write_and_read_one_store(tmp_path):
    """Writer threads share one handle (add, update, forget, search, context) while reader
    threads poll their own read-only handles: ids are unique, nothing acknowledged is lost."""
    path = str(tmp_path / "threads")
    store = fastmem.open(path, embedder=None, durability="none")
    kept: dict[str, str] = {}
    gone: set[str] = set()
    done = threading.Event()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        try:
            for i in range(60):
                body = f"thread {t} item {i}"
                text = body + " #" + hashlib.sha256(body.encode()).hexdigest()[:16]
                mid = store.add(text, session=f"t{t}")
                with lock:
                    assert mid not in kept
                    kept[mid] = text
                if i % 7 == 3:
                    store.update(mid, importance=0.9, metadata={"i": i})
                if i % 11 == 5:
                    store.forget(mid)
                    with lock:
                        gone.add(mid)
                if i % 10 == 0:
                    store.search(f"thread {t}", 3, mode="keyword")
                    store.context(f"item {i}", 200)
                if i == 30 and t == 0:
                    store.checkpoint()
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            with fastmem.open(path, readonly=True, embedder=None) as r:
                while not done.is_set():
                    for m in r.recent(10):
                        assert _digest_ok(m.text), m.text
                    r.search("thread item", 5, mode="keyword")
        except BaseException as exc:
            errors.append(exc)

    store.add("seed #" + hashlib.sha256(b"seed").hexdigest()[:16])
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in readers:
        t.join()
    assert not errors, errors
    assert {m.id: m.text for m in store} == {
        **{"m0": store.get("m0").text}, **{k: v for k, v in kept.items() if k not in gone}
    }
    assert store.verify().ok
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_every_method_refuses_after_fork_even_while_a_thread_held_the_lock(tmp_path):
    """A child must get StoreForkedError from every method, never a deadlock on a lock a
    parent thread held at fork time, and never a write to the parent's files."""
    store = fastmem.open(str(tmp_path / "forked"), embedder=None)
    mid = store.add("parent")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._engine.lock:  # as the preload thread or another caller would
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    size = os.path.getsize(store.dat_path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report each call's outcome, die rather than hang
        signal.alarm(20)
        calls = [
            lambda: store.add("child"), lambda: store.get(mid), lambda: store.search("parent"),
            lambda: store.context("parent"), lambda: store.recent(), lambda: len(store),
            lambda: list(store), lambda: store.update(mid, importance=0.2), lambda: store.forget(mid),
            lambda: store.verify(), lambda: store.checkpoint(), lambda: store.flush(),
        ]  # fmt: skip
        results = []
        for call in calls:
            try:
                call()
                results.append("ran")
            except fastmem.StoreForkedError:
                results.append("refused")
            except BaseException as exc:
                results.append(type(exc).__name__)
        store.close()  # a child's close leaves the parent's lock and files alone
        os.write(w, json.dumps(results).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60)
    out = os.read(r, 4096) if ready else b""
    os.waitpid(pid, 0)
    release.set()
    holder.join()
    assert json.loads(out or b"[]") == ["refused"] * 12
    assert os.path.getsize(store.dat_path) == size
    store.add("parent again")  # the parent's handle still works
    store.close()


class _SlowEmbedder:
    """Embeds as a model on a busy CPU would: a query waits in ``encode`` until released."""

    name, dim = "slow", 8

    def __init__(self) -> None:
        self.slow, self.embedding, self.release = False, threading.Event(), threading.Event()
        self.fast_with = None  # slow only for texts without this word (when given)

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.slow and not (self.fast_with and all(self.fast_with in t for t in texts)):
            self.embedding.set()
            self.release.wait()
        out = np.array([[len(t) % 5 + 1.0, *range(1, self.dim)] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.mark.parametrize("call", ["search", "context", "context naming a speaker"])
def test_a_slow_query_embedding_does_not_hold_up_reads_on_other_threads(tmp_path, call):
    """F9: a hybrid search or context() embeds its query before it takes the handle's lock
    (as add_many does before it writes): another thread's reads go on meanwhile. So does
    the second embedding of a question naming a speaker (the query without the name), which
    the first round's matches call for: here only that one is slow."""
    embedder = _SlowEmbedder()
    store = fastmem.open(str(tmp_path / "s"), embedder=embedder)
    ids = store.add_many([{"text": f"Melanie: memory number {i}"} for i in range(20)])
    embedder.slow = True
    if call == "context naming a speaker":
        embedder.fast_with = "Melanie"
    errors: list[BaseException] = []

    def query() -> None:
        try:
            if call == "search":
                store.search("memory number 3", 5)
            elif call == "context":
                store.context("memory number 3")
            else:
                store.context("What did Melanie say about memory number 3?")
        except BaseException as exc:
            errors.append(exc)

    querying = threading.Thread(target=query)
    querying.start()
    try:
        assert embedder.embedding.wait(300)  # the query is in its embedding now
        # Free: not held by the embedding thread (checked first, so that a failure here does
        # not wait for a lock it would never get).
        assert store._engine.lock.acquire(blocking=False)  # noqa: SLF001
        store._engine.lock.release()  # noqa: SLF001
        assert store.get(ids[7]).text == "Melanie: memory number 7" and len(store) == 20
        assert [h.id for h in store.search("number 7", 1, mode="keyword")] == [ids[7]]
    finally:
        embedder.release.set()
        querying.join()
    assert errors == []
    store.close()

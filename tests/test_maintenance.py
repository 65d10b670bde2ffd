"""Eviction, compaction, repair and backup (``fastmem.storage.maintenance``)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt
from fastmem.storage import index as _index, maintenance as _maintenance
from fastmem import _kernels

DIM = 8
NO_PRELOAD = fastmem.ContextPolicy(preload=0, recent=0)


def _vec(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(DIM).tolist()


def _build(path: str, n: int = 60) -> list[str]:
    """Memories of 4 interleaved sessions (and none), with updates, pins, forgets."""
    with fastmem.open(path, dim=DIM, durability="none") as s:
        ids = []
        for i in range(n):
            ids.append(s.add(
                f"memory {i}: ünïcødé ✓ " + "word%d " % (i % 7) * (i % 30),
                session=None if i % 5 == 4 else f"s{i % 4}", timestamp=1000.0 + i,
                type=("fact", "plan", "note", "conversation")[i % 4],
                metadata={"i": i} if i % 3 else None, embedding=_vec(i) if i % 6 else None,
            ))  # fmt: skip
            if i == n // 2:
                s.checkpoint()  # base and tail
        s.update(ids[1], importance=0.11, metadata={"changed": [1, 2]})
        s.update(ids[2], metadata={"again": True})
        s.update(ids[2], importance=0.9)
        s.pin(ids[5])
        s.pin(ids[6])
        s.pin(ids[6], False)
        for mid in ids[10:40:2]:
            s.forget(mid)
        s.forget(ids[-1])  # the newest: its id must not come back
    return ids


def _state(store: fastmem.MemoryStore) -> dict[str, fastmem.Memory]:
    return {m.id: m for m in store}


def _open_quietly(path: str, **kwargs: Any) -> fastmem.MemoryStore:
    """Open where no RecoveryWarning is expected (pytest turns it into an error)."""
    return fastmem.open(path, policy=NO_PRELOAD, **kwargs)


def _record_order(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(kind, payload) of every record of the data file, in file order."""
    dat = Path(path + ".dat").read_bytes()
    offsets, _, _, _, bad, _ = _kernels.scan_records(dat, fmt.DAT_HEADER_SIZE, len(dat))
    assert not len(bad)
    return [(h.kind, p) for h, p in (fmt.read_record(dat, int(o), len(dat)) for o in offsets)]


# --- compaction ------------------------------------------------------------------------------


def test_compact_keeps_every_memory_and_reclaims_space(store_path: str) -> None:
    ids = _build(store_path)
    with _open_quietly(store_path) as s:
        before = _state(s)
        hits = [(h.id, h.score) for h in s.search(_vec(7), k=10, mode="vector")]
        keyword = [(h.id, h.score) for h in s.search("word3", k=10, mode="keyword")]
        report = s.compact()
        assert isinstance(report, fastmem.CompactReport)
        assert report.memories == len(before) and report.dropped == 16
        assert report.dat_after < report.dat_before and report.reclaimed > 0
        assert 0 < report.reclaimed_fraction < 1 and report.lock_seconds <= report.seconds
        assert _state(s) == before
        assert [(h.id, h.score) for h in s.search(_vec(7), k=10, mode="vector")] == hits
        assert [(h.id, h.score) for h in s.search("word3", k=10, mode="keyword")] == keyword
        assert s.verify().ok
        new = s.add("after compaction")
        assert int(new[1:]) == len(ids)  # never reuses the id of the forgotten newest memory
        before[new] = s.get(new)
        assert s.verify().ok
    with _open_quietly(store_path, readonly=True) as r:
        assert _state(r) == before and r.verify().ok
    os.remove(store_path + ".idx")  # rebuilt from the compacted data file alone
    with pytest.warns(fastmem.RecoveryWarning):
        s = fastmem.open(store_path, policy=NO_PRELOAD)
    with s:
        assert _state(s) == before and s.verify().ok
        assert int(s.add("next")[1:]) == len(ids) + 1
    assert not [n for n in os.listdir(os.path.dirname(store_path)) if ".compact" in n]


def test_compacted_sessions_are_contiguous(store_path: str) -> None:
    _build(store_path)
    with _open_quietly(store_path) as s:
        s.compact()
        expected = sorted(
            (m.session or "", m.timestamp, m.id) for m in s
        )  # fmt: skip
    records = _record_order(store_path)
    assert all(kind == fmt.KIND_MEMORY for kind, _ in records)
    sessions = [p.get("s") for _, p in records]
    runs = [sessions[0]] + [b for a, b in zip(sessions, sessions[1:]) if a != b]
    assert len(runs) == len(set(runs)), f"a session is split: {runs}"
    for run in set(runs):  # inside a session: by time, then id
        ts = [(p["t"], p["i"]) for _, p in records if p.get("s") == run]
        assert ts == sorted(ts)
    assert len(records) == len(expected)


def _memory_records(path: str) -> dict[int, bytes]:
    dat = Path(path + ".dat").read_bytes()
    out = {}
    for off, n in zip(*_kernels.scan_records(dat, fmt.DAT_HEADER_SIZE, len(dat))[:2]):
        head, payload = fmt.read_record(dat, int(off), len(dat))
        if head.kind == fmt.KIND_MEMORY:
            out[payload["i"]] = dat[int(off) : int(off + n)]
    return out


def test_compaction_folds_updates_into_the_memory_record(store_path: str) -> None:
    ids = _build(store_path)
    original = _memory_records(store_path)
    with _open_quietly(store_path) as s:
        s.compact()
    compacted = _memory_records(store_path)
    changed = {1, 2, 5}  # importance, metadata or pin changed (6 was pinned and unpinned)
    for mid, record in compacted.items():
        assert (record == original[mid]) == (mid not in changed), mid  # the rest byte for byte
    with _open_quietly(store_path) as s:
        m1, m2 = s.get(ids[1]), s.get(ids[2])
    assert (m1.importance, m1.metadata) == (0.11, {"changed": [1, 2]})
    assert (m2.importance, m2.metadata) == (0.9, {"again": True})
    payloads = {p["i"]: p for _, p in _record_order(store_path)}
    assert payloads[1]["p"] == 0.11 and payloads[1]["m"] == {"changed": [1, 2]}
    assert payloads[5]["n"] is True and "n" not in payloads[6]


def test_writes_during_compaction_are_kept(store_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _build(store_path)
    real = _maintenance._new_store
    during: dict[str, Any] = {}

    stores: list[Any] = []

    def new_store_while_writing(engine, *args):  # type: ignore[no-untyped-def]
        store = stores[0]
        # Snapshot taken, rows not read yet: changes made now are in the log it reads.
        store.forget(ids[8])
        store.update(ids[9], metadata={"before the read": 1}, importance=0.42)
        store.evict(ttl={"plan": 0}, now=1000.0 + 42)  # ids 1, 5, 9, ... up to 41: pinned 5 stays
        result = real(engine, *args)  # the records are written; the lock is free
        during["added"] = store.add("written during the compaction", embedding=_vec(99))
        store.update(ids[3], metadata={"during": 1})
        store.forget(ids[4])
        return result

    monkeypatch.setattr(_maintenance, "_new_store", new_store_while_writing)
    with _open_quietly(store_path) as s:
        stores.append(s)
        s.compact()
        assert s.get(during["added"]).text == "written during the compaction"
        assert s.get(ids[3]).metadata == {"during": 1}
        assert ids[4] not in s and ids[8] not in s and ids[9] not in s and ids[13] not in s
        assert ids[5] in s  # pinned
        assert s.verify().ok
        after = _state(s)
    with _open_quietly(store_path, readonly=True) as r:
        assert _state(r) == after


def test_readers_follow_a_compaction(store_path: str) -> None:
    ids = _build(store_path)
    with _open_quietly(store_path) as s:
        before = _state(s)
        reader = _open_quietly(store_path, readonly=True)
        with reader:
            walk = iter(reader)
            first = next(walk)
            s.compact()
            rest = list(walk)  # an iteration across the swap: by id, nothing twice
            assert [first, *rest] == sorted(before.values(), key=lambda m: (m.timestamp, m.id))
            assert reader.get(ids[1]) == before[ids[1]]
            assert _state(reader) == before
            new = s.add("after", embedding=_vec(1))
            assert reader.get(new).text == "after" and len(reader) == len(before) + 1
            s.compact()  # twice: the reader follows again
            assert reader.get(new).text == "after"
            assert reader.verify().ok


def test_a_writer_waiting_for_the_lock_gets_the_compacted_file(store_path: str) -> None:
    _build(store_path)
    code = textwrap.dedent(
        """
        import sys, fastmem
        s = fastmem.open(sys.argv[1], timeout=30)
        mid = s.add("second writer")
        print(mid, len(s), s.verify().ok, flush=True)
        s.close()
        """
    )
    with _open_quietly(store_path) as s:
        proc = subprocess.Popen([sys.executable, "-c", code, store_path], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        s.compact()  # the waiting writer holds a descriptor of the old file
        live = len(s)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    mid, count, ok = out.split()
    assert (int(count), ok) == (live + 1, "True")
    with _open_quietly(store_path, readonly=True) as r:
        assert r.get(mid).text == "second writer" and r.verify().ok


CRASH_CHILD = textwrap.dedent(
    """
    import os, sys, fastmem
    from fastmem.storage import maintenance as _maintenance
    path, at = sys.argv[1], int(sys.argv[2])
    calls = [0]
    real_replace, real_sync = os.replace, _maintenance.fsync_dir

    def step():
        calls[0] += 1
        if calls[0] == at:
            os._exit(9)  # as a SIGKILL would: no clean-up of any kind

    def replace(a, b):
        step()
        real_replace(a, b)
        step()

    def fsync_dir(p):
        step()
        real_sync(p)

    os.replace = replace
    _maintenance.fsync_dir = fsync_dir
    s = fastmem.open(path, policy=fastmem.ContextPolicy(preload=0, recent=0))
    s.compact()
    os._exit(0)
    """
)


@pytest.mark.slow
def test_a_crash_at_each_step_of_the_swap_leaves_one_whole_store(tmp_path: Path, backend: str) -> None:
    if backend == "python":
        pytest.skip("the compaction runs in another process: once is enough")
    src = str(tmp_path / "src")
    _build(src)
    with _open_quietly(src, readonly=True) as r:
        expected = _state(r)
    dat, idx = Path(src + ".dat").read_bytes(), Path(src + ".idx").read_bytes()
    path = str(tmp_path / "s")
    outcomes = set()
    for at in range(1, 20):
        Path(path + ".dat").write_bytes(dat)
        Path(path + ".idx").write_bytes(idx)
        for name in os.listdir(tmp_path):
            if ".compact" in name:
                os.remove(tmp_path / name)
        proc = subprocess.run([sys.executable, "-c", CRASH_CHILD, path, str(at)], capture_output=True, text=True)
        assert proc.returncode in (0, 9), proc.stderr
        compacted = os.path.getsize(path + ".dat") != len(dat)
        outcomes.add(compacted)
        # A reader first (it renames nothing), then the next writer (applies the rule).
        with _open_quietly(path, readonly=True) as r:
            assert _state(r) == expected, at
            assert r.verify().ok
        with _open_quietly(path) as s:
            assert _state(s) == expected, at
            assert s.verify().ok, at
        assert not [n for n in os.listdir(tmp_path) if ".compact" in n], at
        if proc.returncode == 0:
            break
    assert outcomes == {False, True}


# --- eviction ------------------------------------------------------------------------------


def test_evict_by_ttl_importance_count_and_bytes(store_path: str) -> None:
    with _open_quietly(store_path, durability="none") as s:
        old_tool = s.add("old tool output", type="tool_result", timestamp=100.0)
        pinned_tool = s.add("pinned tool output", type="tool_result", timestamp=100.0, pinned=True)
        new_tool = s.add("new tool output", type="tool_result", timestamp=10_000.0)
        old_fact = s.add("old fact", type="fact", timestamp=100.0)
        assert s.evict(ttl={"tool_result": 1000, "unknown type": 1}, now=10_500.0) == [old_tool]
        assert old_tool not in s and pinned_tool in s and new_tool in s and old_fact in s
        scores = dict(zip([f"m{i}" for i in range(4)], s.importance_scores(now=10_500.0).tolist()))
        floor = (scores[new_tool] + scores[old_fact]) / 2
        low, high = sorted([new_tool, old_fact], key=scores.__getitem__)
        assert s.evict(min_importance=floor, now=10_500.0) == [low]
        assert high in s
        more = s.add_many([{"text": f"chatter {i}", "timestamp": 200.0 + i} for i in range(10)])
        gone = s.evict(max_count=5, now=10_500.0)
        assert len(s) == 5 and pinned_tool in s and high in s
        assert gone == more[:7]  # the lowest scores first: the oldest chatter
        rest = sorted((m.id for m in s if m.id != pinned_tool), key=lambda mid: int(mid[1:]))
        assert s.evict(max_count=0) == rest
        assert [m.id for m in s] == [pinned_tool]  # pinned: never evicted
        for i in range(10):
            s.add("x" * 50 + str(i), timestamp=300.0 + i)
        assert s.evict(max_bytes=10**9) == []
        s.evict(max_bytes=300)
        lengths = s._engine.index.column("length")[(s._engine.index.column("flags") & fmt.FLAG_FORGOTTEN) == 0]
        assert int(lengths.sum()) <= 300 + lengths.max()  # pinned ones may stay over it
        assert s.verify().ok
        before = os.path.getsize(store_path + ".dat")
        for bad in ({"ttl": {"x": -1}}, {"ttl": [1]}, {"max_count": -1}, {"max_bytes": 1.5},
                    {"min_importance": float("nan")}, {"ttl": {"x": True}}):  # fmt: skip
            with pytest.raises(fastmem.InvalidInputError):
                s.evict(**bad)
        assert os.path.getsize(store_path + ".dat") == before  # nothing written


def test_eviction_policy_applies_at_checkpoint_and_close(store_path: str) -> None:
    policy = fastmem.EvictionPolicy(max_count=3)
    s = fastmem.open(store_path, evict=policy, policy=NO_PRELOAD)
    ids = [s.add(f"m {i}", timestamp=float(i)) for i in range(5)]
    assert len(s) == 5
    s.checkpoint()
    assert [m.id for m in s] == ids[2:]
    for i in range(3):
        s.add(f"more {i}", timestamp=10.0 + i)
    s.close()
    with _open_quietly(store_path, readonly=True) as r:
        assert [m.text for m in r] == ["more 0", "more 1", "more 2"]
    with pytest.raises(fastmem.InvalidTypeError):
        fastmem.open(store_path, evict={"max_count": 3})  # type: ignore[arg-type]


# --- repair ----------------------------------------------------------------------------------


def test_repair_keeps_every_intact_record_and_what_it_cut(store_path: str) -> None:
    ids = _build(store_path)
    with _open_quietly(store_path, readonly=True) as r:
        before = _state(r)
        offsets = {m.id: r.info(m.id).record_offset for m in r}
    dat = bytearray(Path(store_path + ".dat").read_bytes())
    victims = [ids[0], ids[41], ids[50]]
    for mid in victims:
        dat[offsets[mid] + 25] ^= 0x40
    dat += b"garbage that is not a record at all"  # and a damaged tail (not a torn write)
    Path(store_path + ".dat").write_bytes(bytes(dat))
    with pytest.warns(fastmem.RecoveryWarning):
        s = fastmem.open(store_path, policy=NO_PRELOAD)
    with s:
        assert not s.verify().ok
        with pytest.raises(fastmem.CorruptionError):
            s.compact()  # refuses: repair first
        report = s.repair()
        assert isinstance(report, fastmem.RepairReport) and not report.ok
        cut_at = sorted(p.offset for p in report.cut)
        assert cut_at == sorted([offsets[m] for m in victims] + [len(dat) - 35])
        assert report.memories == len(before) - 3
        assert s.verify().ok
        for mid, m in before.items():
            if mid in victims:
                assert mid not in s
            else:
                assert s.get(mid) == m
        kept = Path(report.damaged_path or "").read_bytes()
        assert report.cut_bytes == len(kept) - 16 * len(report.cut)
        start, n = _maintenance.DAMAGED_REGION.unpack_from(kept, 0)
        assert start == min(cut_at) and kept[16 : 16 + n] == bytes(dat[start : start + n])
        assert s.repair().ok  # nothing left to cut
    with _open_quietly(store_path, readonly=True) as r:
        assert r.verify().ok and len(r) == len(before) - 3


# --- backup ----------------------------------------------------------------------------------


def test_backup_while_a_thread_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    store = fastmem.open(path, dim=DIM, durability="batch", policy=NO_PRELOAD)
    _ = [store.add(f"before {i}", embedding=_vec(i)) for i in range(200)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        i = 0
        try:
            while not stop.is_set():
                store.add(f"during {i} " + "y" * (i % 100), embedding=_vec(i), session=f"s{i % 3}")
                if i % 10 == 9:
                    store.forget(f"m{200 + i - 5}")
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        reports = []
        for k in range(3):
            acked = _state(store)  # everything committed before the call
            reports.append((store.backup(tmp_path / f"copy{k}"), acked))
    finally:
        stop.set()
        thread.join()
        store.close()
    assert not errors
    for report, acked in reports:
        assert isinstance(report, fastmem.BackupReport)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            copy = fastmem.open(report.path, policy=NO_PRELOAD)
        with copy:
            assert copy.verify().ok
            state = _state(copy)
            for mid in acked:
                n = int(mid[1:])
                if n < 204 or (n - 204) % 10:  # never forgotten by the writer: must be there
                    assert state[mid] == acked[mid]
                elif mid in state:  # forgotten during the copy, or after
                    assert state[mid] == acked[mid]
            assert report.memories == len(copy)


def test_backup_of_a_store_another_process_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    with fastmem.open(path, durability="none") as s:
        s.add("first")
    code = textwrap.dedent(
        """
        import sys, fastmem
        s = fastmem.open(sys.argv[1], durability="always")
        for i in range(100000):
            s.add(f"from the writer {i}")
            if i == 50:
                print("going", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "going"
        with _open_quietly(path, readonly=True) as reader:
            seen = _state(reader)
            report = reader.backup(tmp_path / "copy")
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    with _open_quietly(report.path) as copy:
        assert copy.verify().ok
        state = _state(copy)
        assert all(state[mid] == m for mid, m in seen.items())
    with pytest.raises(fastmem.InvalidInputError):
        with _open_quietly(path, readonly=True) as reader:
            reader.backup(report.path)  # refuses to overwrite a store


READER_CHILD = textwrap.dedent(
    """
    import json, sys, time, fastmem
    path, expected = sys.argv[1], json.loads(sys.stdin.readline())
    r = fastmem.open(path, readonly=True, policy=fastmem.ContextPolicy(preload=0, recent=0))
    print("ready", flush=True)
    wrong, calls, deadline = 0, 0, time.time() + float(sys.argv[2])
    while time.time() < deadline:
        for mid, text in expected.items():
            wrong += r.get(mid).text != text
            calls += 1
    print(json.dumps([calls, wrong, r.verify().ok, len(r)]), flush=True)
    """
)


def test_a_reader_process_reads_through_compactions(store_path: str) -> None:
    _build(store_path)
    with _open_quietly(store_path) as s:
        expected = {m.id: m.text for m in s}
        proc = subprocess.Popen([sys.executable, "-c", READER_CHILD, store_path, "1.5"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(expected) + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(3):
            s.compact()
        out, _ = proc.communicate(timeout=60)
    calls, wrong, ok, count = json.loads(out)
    assert calls > len(expected) and wrong == 0 and ok and count == len(expected)


# Swapping files (the review's S3): built aside, adopted whole; past the commit point a
# failure closes the handle, and every descriptor is closed exactly once.

def _open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_a_swap_that_fails_after_the_commit_point_closes_the_handle(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    fds = _open_fds()
    store = fastmem.open(path, embedder=None)
    ids = store.add_many([{"text": f"memory {i}"} for i in range(20)])
    store.forget(ids[3])
    armed = []
    real_new_store, real_load = _maintenance._new_store, _index.MemoryIndex.load

    def new_store(*args, **kwargs):
        result = real_new_store(*args, **kwargs)
        armed.append(1)  # the new files are written: the next index load is the swap's
        return result

    def load(cls, *args, **kwargs):
        if armed:
            armed.clear()
            raise OSError(errno.EIO, "injected: the new index cannot be read")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(_maintenance, "_new_store", new_store)
    monkeypatch.setattr(_index.MemoryIndex, "load", classmethod(load))
    with pytest.raises(OSError, match="injected"):
        store.compact()
    with pytest.raises(fastmem.StoreClosedError):
        store.get(ids[0])  # the old files are no longer the store: the handle is closed
    store.close()  # and closing it again is fine
    assert _open_fds() == fds  # every descriptor closed once, none leaked
    monkeypatch.undo()
    with fastmem.open(path, embedder=None) as store:  # the compacted files, as committed
        assert [m.id for m in store] == [m for i, m in enumerate(ids) if i != 3]
        assert store.verify().ok


def test_a_reader_whose_swap_fails_stays_on_its_files_and_follows_later(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None) as writer:
        ids = writer.add_many([{"text": f"memory {i}"} for i in range(10)])
        reader = fastmem.open(path, embedder=None, readonly=True, policy=NO_PRELOAD)
        assert len(reader) == 10
        writer.forget(ids[0])
        writer.compact()
        writer.add("after the compaction")
    real_load = _index.MemoryIndex.load
    failures = []

    def load(cls, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise OSError(errno.EIO, "injected: the new index cannot be read yet")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(_index.MemoryIndex, "load", classmethod(load))
    with pytest.raises(OSError, match="injected"):
        len(reader)  # the call that meets the swap reports it...
    monkeypatch.undo()
    try:  # ...and the handle is still whole: the next call follows
        assert [m.text for m in reader][-1] == "after the compaction" and len(reader) == 10
    finally:
        reader.close()


class _Fixed:
    """A deterministic embedder for the re-embedding tests: ``name`` and ``dim`` identify it."""

    def __init__(self, name: str, dim: int, seed: int) -> None:
        self.name, self.dim, self._seed = name, dim, seed

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            rng = np.random.default_rng([self._seed, *text.encode()])
            out[i] = rng.standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_reembed_rewrites_every_vector_and_the_stores_embedder(tmp_path):
    path = str(tmp_path / "s")
    old, new = _Fixed("model-a", 8, 1), _Fixed("model-b", 5, 2)
    with fastmem.open(path, embedder=old, policy=NO_PRELOAD) as store:
        ids = store.add_many([{"text": f"memory number {i}", "session": f"s{i % 3}"} for i in range(40)])
        store.add("no vector, written keyword-only", embedding=None)
        store.update(ids[3], importance=0.77, metadata={"k": 1})
        store.pin(ids[4])
        store.forget(ids[5])
        before = [(m.id, m.text, m.importance, m.pinned, m.metadata, m.session) for m in store]
        reader = fastmem.open(path, embedder=None, readonly=True, policy=NO_PRELOAD)
        assert store.reembed(new) == 40
        after = [(m.id, m.text, m.importance, m.pinned, m.metadata, m.session) for m in store]
        assert after == before  # everything but the vectors is as it was
        for m in store:
            np.testing.assert_allclose(store.vector(m.id), new.encode([m.text])[0], atol=2e-3)
        hit = store.search(new.encode(["memory number 7"])[0], k=1, mode="vector")[0]
        assert hit.id == ids[7] and hit.score == pytest.approx(1.0, abs=1e-3)
        assert store.verify().ok
        assert len(reader) == 40 and reader.get(ids[7]).text == "memory number 7"  # follows
        reader.close()
    with pytest.raises(fastmem.DimensionMismatchError):  # the old model's vectors are gone
        fastmem.open(path, embedder=old)
    with pytest.raises(fastmem.EmbedderMismatchError):  # and so is its name
        fastmem.open(path, embedder=_Fixed("model-a", 5, 1))
    with fastmem.open(path, embedder=new, policy=NO_PRELOAD) as store:
        assert store.add("after the change") and store.verify().ok
        with pytest.raises(fastmem.InvalidInputError):
            store.reembed(None)


@pytest.mark.parametrize("readonly", [True, False])
def test_a_handle_following_a_swap_follows_again_when_the_file_is_replaced_meanwhile(
    tmp_path, monkeypatch, readonly
):
    # Seen under load as a raw "ValueError: mmap length is greater than file size": a
    # handle opened the compacted file, and before it mapped it another compaction put a
    # smaller file under the store's name.
    path = str(tmp_path / "s")
    dat_path = path + ".dat"
    writer = fastmem.open(path, embedder=None, policy=NO_PRELOAD)
    ids = writer.add_many([{"text": f"memory {i} " + "filler " * 20} for i in range(60)])
    follower = fastmem.open(path, embedder=None, readonly=readonly, policy=NO_PRELOAD)
    assert len(follower) == 60
    writer.compact()  # the follower meets the swap at its next call
    real_open = os.open
    armed = [threading.get_ident()]

    def open_(file, flags, *args, **kwargs):
        fd = real_open(file, flags, *args, **kwargs)
        if armed and file == dat_path and threading.get_ident() == armed[0]:
            armed.clear()  # the follower has opened the compacted file: replace it again
            for mid in ids[10:]:
                writer.forget(mid)
            writer.compact()
        return fd

    monkeypatch.setattr(os, "open", open_)
    try:
        assert len(follower) == 10  # not a raw ValueError: it follows the newest file
        assert not armed  # (the replacement did come between the open and the map)
        assert [m.id for m in follower] == ids[:10]
        assert follower.verify().ok
    finally:
        monkeypatch.undo()
        follower.close()
        writer.close()

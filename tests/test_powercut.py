"""Power cuts (issue 18, item 4): recorded workloads cut at random points (``tests/powercut.py``).

Every memory acknowledged before the cut (``durability="always"``: its call returned;
``"batch"``: a ``flush``, ``checkpoint``, ``compact`` or reopen returned after it) is there
after a reopen, field for field; nothing is returned that no call wrote; ``verify()`` is
clean. 12 workloads (adds, batches, updates, forgets, flushes, checkpoints, compactions,
reopenings) x 45 cuts = 540 cuts. The same through 2 to 4 writer handles interleaved (each
with its own descriptors and group commit), under ``"batch"`` a memory acknowledged once
a sync of its data file that began after its call returned has returned (the group
commit is an acknowledgement point): 8 workloads x 30 cuts = 240 cuts. And 2 to 4 writers
at once, in threads, adding, flushing and compacting (``ConcurrentWorkload``): every
acknowledged memory there, nothing twice, nothing no call wrote: 8 x 30 cuts.
``benchmarks/powercut.py`` runs 10,000 and more.
"""

from __future__ import annotations

import random

import powercut
import pytest

import fastmem

SEEDS = range(6)
CUTS = 45


@pytest.fixture(autouse=True)
def backend():
    """File I/O is the same under both kernel backends: one run."""
    yield fastmem.BACKEND


@pytest.mark.parametrize("durability", ["always", "batch"])
def test_power_cuts_lose_nothing_acknowledged_and_return_nothing_garbled(tmp_path, durability):
    made, failures, reported = 0, [], 0
    for seed in SEEDS:
        n, failed, damaged = powercut.run_cuts(str(tmp_path), durability, seed, CUTS)
        made, reported = made + n, reported + damaged
        failures += failed
    print(f"\n{durability}: {made} cuts, {len(failures)} failed, {reported} with an unacknowledged tail reported")
    assert failures == [], "\n".join(f[:2000] for f in failures[:5])


MULTI_SEEDS = range(4)
MULTI_CUTS = 30


@pytest.mark.parametrize("durability", ["always", "batch"])
@pytest.mark.parametrize("at_once", [False, True], ids=["interleaved", "at-once"])
def test_power_cuts_among_several_writers_lose_nothing_acknowledged(tmp_path, durability, at_once):
    """2 to 4 writer handles, interleaved in one thread or at once in threads (then also:
    nothing twice)."""
    made, failures, stats = 0, [], {}
    first = 500 if at_once else 300
    for seed in MULTI_SEEDS:
        n, failed, _ = powercut.run_cuts(str(tmp_path), durability, first + seed, MULTI_CUTS,
                                         writers=2 + seed % 3, stats=stats, at_once=at_once)  # fmt: skip
        made += n
        failures += failed
    how = "at once" if at_once else "interleaved"
    print(f"\n{durability}, 2 to 4 writers {how}: {made} cuts, {len(failures)} failed; {stats}")
    assert failures == [], "\n".join(f[:2000] for f in failures[:5])
    if durability == "batch":  # the group commit acknowledged writes (no flush came first)
        assert stats["by_group_commit"] > 0, stats


@pytest.mark.parametrize("at_once", [False, True], ids=["interleaved", "at-once"])
def test_the_harness_finds_a_missing_sync_among_several_writers(tmp_path, monkeypatch, at_once):
    from fastmem.storage import engine as _engine

    monkeypatch.setattr(_engine.Engine, "sync", lambda self, fd, path=None, what="": None)
    failures = []
    first, seeds = (600, 3) if at_once else (400, 2)
    for seed in range(first, first + seeds):
        failures += powercut.run_cuts(
            str(tmp_path), "always", seed, 40, writers=3, at_once=at_once
        )[1]
    assert failures


def test_a_sync_makes_durable_what_was_written_before_it_began():
    """The model: a write logged between a sync's beginning and its return (another
    thread's, beside a group commit) may be lost; one before it may not. And an operation
    is acknowledged by the first sync of its data file begun after it returned."""
    rec = powercut.Recorder.__new__(powercut.Recorder)
    rec.initial = {"s.dat": (1, b"")}
    rec.log = [("mark", "begin", 0, "add", 0, 99), ("write", 1, 0, b"A"), ("mark", "end", 0, 99),
               ("syncing", 1, 7), ("mark", "begin", 1, "add", 0, 99), ("write", 1, 1, b"B"),
               ("mark", "end", 1, 99), ("sync", 1, 7, "group")]  # fmt: skip
    seen = set()
    rng = random.Random(2)
    for _ in range(200):
        files, synced = powercut.files_at_cut(rec, len(rec.log), rng)
        assert files["s.dat"][:1] == b"A" and synced["s.dat"] == 1, files
        seen.add(files["s.dat"])
    assert {b"A", b"AB"} <= seen <= {b"A", b"AB", b"A\x00"}  # (the size reached the disk, B's page not)
    acked, by_group = powercut.synced_acks(rec.log, "/x/s.dat", rec.initial)
    assert acked == {0: len(rec.log)} and by_group == {0}


def test_a_compaction_acknowledges_only_what_was_in_the_file_it_replaced():
    """The model: another thread's add that waited through a compaction and was written to
    the new file is not acknowledged by the compaction's return (it was not in the file
    the compaction synced); an add that returned before it began is."""
    initial = {"s.dat": (1, b"")}
    log = [("mark", "begin", "b.0", "add", 1, 2), ("write", 1, 0, b"A"), ("mark", "end", "b.0", 2),
           ("mark", "begin", "a.0", "compact", 0, 1), ("mark", "begin", "b.1", "add", 1, 2),
           ("create", "s.dat.compact", 3), ("write", 3, 0, b"A"), ("syncing", 3, 0), ("sync", 3, 0, "call"),
           ("rename", "s.dat.compact", "s.dat", 1), ("dirsync",), ("write", 3, 1, b"B"),
           ("mark", "end", "a.0", 1), ("mark", "end", "b.1", 2)]  # fmt: skip
    acked, _ = powercut.synced_acks(log, "/x/s.dat", initial)
    assert acked == {"b.0": 13, "a.0": 13}


def test_the_harness_finds_a_missing_sync(tmp_path, monkeypatch):
    """The harness is worth something only if it fails a store that skips a sync: with
    the data file's fdatasync gone, acknowledged memories are lost at some cut."""
    from fastmem.storage import engine as _engine

    monkeypatch.setattr(_engine.Engine, "sync", lambda self, fd, path=None, what="": None)
    failures = []
    for seed in range(2):
        failures += powercut.run_cuts(str(tmp_path), "always", 100 + seed, 40)[1]
    assert failures


def test_the_harness_finds_a_missing_directory_sync(tmp_path, monkeypatch):
    """... and with the directory fsync after a rename or a new file gone."""
    from fastmem.storage import engine as _engine, maintenance as _maintenance

    monkeypatch.setattr(_engine.Engine, "sync_dir", lambda self, path: None)
    monkeypatch.setattr(_maintenance, "fsync_dir", lambda path: None)
    failures = []
    for seed in range(3):
        failures += powercut.run_cuts(str(tmp_path), "always", 200 + seed, 40)[1]
    assert failures


def test_a_rename_survives_whole_or_not_at_all():
    """The model itself: a cut between a rename and its directory fsync leaves the old
    name or the new one, never neither, and a file created after the last directory fsync
    may be gone."""
    rec = powercut.Recorder.__new__(powercut.Recorder)
    rec.initial = {"s.idx": (1, b"old index")}
    rec.log = [("create", "s.idx.tmp", 2), ("write", 2, 0, b"new index"), ("sync", 2),
               ("rename", "s.idx.tmp", "s.idx")]  # fmt: skip
    seen = set()
    rng = random.Random(1)
    for _ in range(200):
        files, _ = powercut.files_at_cut(rec, len(rec.log), rng)
        assert files.get("s.idx") in (b"old index", b"new index"), files
        seen.add((files["s.idx"], "s.idx.tmp" in files))
    assert seen == {(b"old index", False), (b"old index", True), (b"new index", False)}

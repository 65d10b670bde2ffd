"""Power cuts (issue 18, item 4): recorded workloads cut at random points (``tests/powercut.py``).

Every memory acknowledged before the cut (``durability="always"``: its call returned;
``"batch"``: a ``flush``, ``checkpoint``, ``compact`` or reopen returned after it) is there
after a reopen, field for field; nothing is returned that no call wrote; ``verify()`` is
clean. 12 workloads (adds, batches, updates, forgets, flushes, checkpoints, compactions,
reopenings) x 45 cuts = 540 cuts. ``benchmarks/powercut.py`` runs 10,000 and more.
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


def test_the_harness_finds_a_missing_sync(tmp_path, monkeypatch):
    """The harness is worth something only if it fails a store that skips a sync: with
    the data file's fdatasync gone, acknowledged memories are lost at some cut."""
    from fastmem import _engine

    monkeypatch.setattr(_engine.Engine, "sync", lambda self, fd, path=None, what="": None)
    failures = []
    for seed in range(2):
        failures += powercut.run_cuts(str(tmp_path), "always", 100 + seed, 40)[1]
    assert failures


def test_the_harness_finds_a_missing_directory_sync(tmp_path, monkeypatch):
    """... and with the directory fsync after a rename or a new file gone."""
    from fastmem import _engine, _maintenance

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

"""``MemoryStore.sessions()`` (live memories by session, from the index) and the data file's
format version in ``stats()``: what the inspector's overview shows."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fastmem
from fastmem.errors import InvalidInputError


@pytest.fixture
def store(tmp_path):
    with fastmem.open(str(tmp_path / "s"), embedder=None) as s:
        yield s


def test_counts_by_session_newest_activity_first(store):
    assert store.sessions() == {}
    store.add("no session")
    assert store.sessions() == {}  # memories without a session are not counted
    store.add_many([{"text": f"a{i}", "session": "alpha"} for i in range(3)])
    store.add("b0", session="beta")
    store.add("a3", session="alpha")
    store.add("g0", session="gamma", timestamp=1.0)  # an old timestamp, but the newest write
    assert list(store.sessions().items()) == [("gamma", 1), ("alpha", 4), ("beta", 1)]
    assert store.sessions(2) == {"gamma": 1, "alpha": 4}
    assert store.sessions(0) == {}


def test_forgotten_memories_leave_the_counts(store):
    ids = store.add_many([{"text": f"t{i}", "session": "s"} for i in range(3)])
    store.add("other", session="o")
    store.forget(ids[0])
    store.forget(ids[1], erase=False)
    assert store.sessions() == {"o": 1, "s": 1}
    store.forget(ids[2])
    assert store.sessions() == {"o": 1}


def test_session_names_are_the_stored_ones(store):
    names = ["ünïcode 会话", "x" * 200, "<b>&"]
    for name in names:
        store.add("t", session=name)
    assert store.sessions() == dict.fromkeys(reversed(names), 1)


def test_sees_another_process_and_survives_compaction(tmp_path):
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None) as w:
        w.add_many([{"text": f"t{i}", "session": f"s{i % 3}"} for i in range(9)])
        w.forget("m1")
        with fastmem.open(path, readonly=True, embedder=None) as r:
            code = "import fastmem,sys\nwith fastmem.open(sys.argv[1], embedder=None) as s: s.add('x', session='late')"
            subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)
            assert r.sessions() == {"late": 1, "s2": 3, "s1": 2, "s0": 3}
        w.compact()
        assert w.sessions() == {"late": 1, "s2": 3, "s1": 2, "s0": 3}


@pytest.mark.parametrize("walk_rows", [1 << 16, 7])
def test_a_few_sessions_walked_back_equal_the_whole_columns_sort(tmp_path, monkeypatch, walk_rows):
    """The overview's few sessions are found by walking back from the newest rows (cut short
    here to 7 rows, which then sorts the whole column instead): the same answer either way,
    across the walk's chunks, with forgotten rows and memories without a session."""
    from fastmem.storage import stats as _figures

    monkeypatch.setattr(_figures, "WALK_CHUNK", 5)
    monkeypatch.setattr(_figures, "WALK_ROWS", walk_rows)
    rng = np.random.default_rng(3)
    with fastmem.open(str(tmp_path / "s"), embedder=None) as store:
        names = [None if x == 0 else f"s{x}" for x in rng.integers(0, 12, 300).tolist()]
        items = [{"text": f"t{i}", "session": s} for i, s in enumerate(names)]
        ids = store.add_many(items[:200])
        store.checkpoint()  # the index's base rows, then its tail: both walked
        ids += store.add_many(items[200:])
        store.forget_many([ids[i] for i in rng.choice(300, 40, replace=False).tolist()])
        everything = store.sessions()
        assert sum(everything.values()) == sum(
            1 for i, s in enumerate(names) if s is not None and ids[i] in store
        )
        for n in range(14):
            assert list(store.sessions(n).items()) == list(everything.items())[:n]


@pytest.mark.parametrize("n", [-1, 1.5, "2", True])
def test_a_bad_n_is_refused(store, n):
    with pytest.raises(InvalidInputError):
        store.sessions(n)


def test_a_closed_store_refuses(tmp_path):
    s = fastmem.open(str(tmp_path / "s"), embedder=None)
    s.close()
    with pytest.raises(fastmem.StoreClosedError):
        s.sessions()


def test_stats_names_the_data_files_format_version(store, tmp_path):
    store.add("x")
    version = store.stats().format_version
    assert isinstance(version, int) and version >= 1
    with open(store.path + ".dat", "rb") as f:  # the header: magic (8 bytes), then u16 version
        assert int.from_bytes(f.read(10)[8:10], "little") == version

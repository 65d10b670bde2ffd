"""``recent`` reads its memories in bulk (``_items.read_rows``): the same memories, in the
same order, as one ``get`` per memory, whether the rows are in the checkpointed base or the
tail, plain or not (a metadata update, a compressed record), live or forgotten."""

from __future__ import annotations

import os

import pytest

import fastmem
from fastmem import _format as fmt
from fastmem.storage import records as _items


@pytest.fixture
def store(tmp_path):
    with fastmem.open(os.path.join(tmp_path, "s"), embedder=None) as s:
        yield s


def _fill(store, session, n, start=0):
    return store.add_many([
        {"text": f"turn {start + i} of {session}: " + "word " * (i % 7), "session": session,
         "timestamp": 1_700_000_000.0 + start + i, "metadata": {"n": start + i, "deep": {"l": [i]}}}
        for i in range(n)
    ])  # fmt: skip


def _one_by_one(store, ids):
    return [store.get(mid) for mid in ids]


def test_a_sessions_memories_match_get_across_base_and_tail(store):
    first = _fill(store, "a", 50) + _fill(store, "b", 20)
    store.checkpoint()  # the first rows move to the base
    later = _fill(store, "a", 30, start=50)
    ids_a = [m for m in first + later if store.get(m).session == "a"]
    assert store.recent(1000, session="a") == _one_by_one(store, ids_a[::-1])
    assert store.recent(7, session="a") == _one_by_one(store, ids_a[::-1][:7])
    assert store.recent(0, session="a") == []
    assert store.recent(10, session="nobody") == []


def test_forgotten_and_updated_memories(store):
    ids = _fill(store, "a", 40)
    store.checkpoint()
    store.forget(ids[3])
    store.forget(ids[35], erase=False)
    store.update(ids[10], metadata={"changed": True})  # an update record: not the plain case
    store.update(ids[20], importance=0.9)
    expected = _one_by_one(store, [m for m in ids[::-1] if m not in (ids[3], ids[35])])
    got = store.recent(100, session="a")
    assert got == expected
    assert got[[m.id for m in got].index(ids[10])].metadata == {"changed": True}


def test_a_compressed_record_and_unicode(store):
    long_text = "ünïcode 🌍 " + "the same words again " * 400  # long enough to be compressed
    ids = store.add_many([{"text": long_text, "session": "z"}, {"text": "short", "session": "z"}])
    assert store.recent(5, session="z") == _one_by_one(store, ids[::-1])


def test_every_memory_newest_first(store):
    ids = _fill(store, "a", 30) + _fill(store, "b", 30, start=100)
    store.checkpoint()
    ids += _fill(store, "c", 10, start=200)
    store.forget(ids[0])
    everything = store.recent(1000)
    assert everything == _one_by_one(store, [m.id for m in everything])
    assert [m.id for m in everything] == [m for m in ids[::-1] if m != ids[0]]
    page = store.recent(5, before=everything[9].id)
    assert page == everything[10:15]


def test_read_rows_and_session_rows_directly(store):
    ids = _fill(store, "a", 12)
    _fill(store, "b", 3)
    store.checkpoint()
    ids += _fill(store, "a", 5, start=12)
    store.forget(ids[2])
    engine = store._engine
    live = [m for m in ids if m != ids[2]][::-1]  # newest first
    rows = _items.session_rows(engine.index, "a", fmt.MAX_ID + 1, 1000)
    assert [m.id for m in _items.read_rows(engine, rows)] == live
    rows = _items.session_rows(engine.index, "a", fmt.MAX_ID + 1, 7)  # across base and tail
    assert [m.id for m in _items.read_rows(engine, rows)] == live[:7]
    below = int(live[6][1:])
    rows = _items.session_rows(engine.index, "a", below, 3)
    assert [m.id for m in _items.read_rows(engine, rows)] == live[7:10]
    assert _items.session_rows(engine.index, "nobody", fmt.MAX_ID + 1, 5) == []
    assert _items.read_rows(engine, []) == []


def test_a_name_sharing_the_hash_is_skipped_and_the_page_still_fills(store):
    ids = _fill(store, "a", 10) + _fill(store, "b", 10, start=10)
    tail = store._engine.index.tail
    # "b"'s rows take "a"'s hash, as a 64-bit collision would: the newest candidates of "a"
    # are then all "b"'s, which the names leave out, and the page is filled from older ones.
    tail.rows["session"][10:20] = tail.rows["session"][0]
    assert [m.id for m in store.recent(4, session="a")] == ids[:10][::-1][:4]
    assert [m.id for m in store.recent(100, session="a")] == ids[:10][::-1]

def test_plain_memories_are_read_in_one_call(store, monkeypatch):
    ids = _fill(store, "a", 20)
    store.checkpoint()
    ids += _fill(store, "a", 20, start=20)
    engine = store._engine

    def one_by_one(g):
        raise AssertionError("a plain memory was read one by one")

    monkeypatch.setattr(engine, "memory", one_by_one)
    assert [m.id for m in store.recent(100, session="a")] == ids[::-1]
    assert [m.id for m in store.recent(100)] == ids[::-1]


def test_one_updated_memory_sends_only_its_chunk_the_slow_way(store, monkeypatch):
    ids = _fill(store, "a", 3 * _items.READ_CHUNK)
    store.update(ids[5], metadata={"changed": True})  # not the plain case
    engine = store._engine
    real_get, asked = engine.get, []

    def counted(mid):
        asked.append(mid)
        return real_get(mid)

    monkeypatch.setattr(engine, "get", counted)
    got = store.recent(10_000, session="a")
    assert [m.id for m in got] == ids[::-1]
    assert got[-6].metadata == {"changed": True}
    assert len(asked) == _items.READ_CHUNK  # the oldest chunk, which holds it, and no other


def test_an_offset_past_any_file_is_a_corruption_error(store):
    """A damaged index row may name an offset up to 2**64 - 1 (found by the hostile-index
    test): recent() says the store is damaged, as get() does, not OverflowError."""
    import numpy as np

    store.add_many([{"text": f"memory {i}"} for i in range(5)])
    index = store._engine.index
    assert index.tail.n  # the rows are in the tail (writable arrays), not the mapped base
    index.tail.rows["offset"][index.tail.n - 1] = np.uint64(2**64 - 1)
    with pytest.raises(fastmem.CorruptionError):
        store.recent(5)

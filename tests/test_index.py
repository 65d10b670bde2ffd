"""MemoryIndex (fastmem.storage.index) on hand-built indexes, without a store.

Covers: ``find`` for dense and sparse ids, in the base and the tail, and for missing ids;
``row``/``gather``/``column``/``segments``/``unit_vectors`` agreeing across base and tail,
before and after ``save`` + ``load`` (byte for byte); ``by_time`` with equal timestamps;
``forget`` (live count, flags, keyword postings); ``touch`` (saturating counts,
``stats_changed``); ``change``; the type table; the hot section; damaged ``.idx`` files
(``CorruptIndexError``); replay of a data file with a damaged record in the middle; and a
hypothesis property: random appends, forgets and checkpoints against a dict model.
"""

from __future__ import annotations

import os
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem import _kernels
from fastmem.storage import replay as _replay
from fastmem.storage.recovery import build_index
from fastmem.storage.index import F_FLAGS, F_IMPORTANCE, F_META, MemoryIndex, update_changes
from fastmem.storage.vectors import to_float16
from fastmem.types import Problem

UUID = bytes(range(16))
DIM = 6
FIELDS = fmt.INDEX_DTYPE.names
WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date"]


def make_rows(ids, ts=None, *, types=None, flags=fmt.FLAG_HAS_VECTOR, importance=0.5):
    """INDEX_DTYPE rows for ``ids`` (as ``Engine.commit_memories`` fills them)."""
    rows = np.zeros(len(ids), dtype=fmt.INDEX_DTYPE)
    rows["id"] = ids
    rows["timestamp"] = np.asarray(ids, dtype=np.float64) if ts is None else ts
    rows["session"] = [1 + i % 3 for i in ids]
    rows["offset"] = [fmt.DAT_HEADER_SIZE + 100 * i for i in ids]
    rows["length"] = 100
    rows["importance"] = importance
    rows["type"] = 0 if types is None else types
    rows["flags"] = flags
    rows["text_tokens"] = 2
    return rows


def texts_of(ids):
    return [f"{WORDS[i % len(WORDS)]} m{i}" for i in ids]


def vectors_of(ids):
    rng = np.random.default_rng(list(ids) or [0])
    return to_float16(rng.standard_normal((len(ids), DIM)), DIM)


def append(index, ids, ts=None, **kw):
    if not len(ids):  # the engine never appends nothing (append([]) would raise IndexError)
        return
    rows = make_rows(ids, ts, **kw)
    index.append(rows, vectors_of(ids), texts_of(ids))


def checkpoint(index, path):
    """``save`` then ``load``, as ``Engine.checkpoint`` (no records: covers the header only)."""
    index.save(path, b"", sync=False)
    return MemoryIndex.load(path, UUID, index.dim, b"", fmt.DAT_HEADER_SIZE)


def base_and_tail(tmp_path, base_ids, tail_ids, base_ts=None, tail_ts=None):
    index = MemoryIndex(DIM, UUID)
    append(index, base_ids, base_ts)
    index = checkpoint(index, str(tmp_path / "t.idx"))
    append(index, tail_ids, tail_ts)
    return index


def snapshot(index):
    """Every column, the vectors and the keyword section, as bytes."""
    vectors = np.concatenate([v for _, _, v in index.segments()] or [np.zeros((0, DIM), np.int8)])
    section = index.keyword.section()
    return ({name: index.column(name).tobytes() for name in FIELDS}, vectors.tobytes(),
            [np.asarray(a).tobytes() for a in section], index.live, index.next_id)  # fmt: skip


@pytest.mark.parametrize("ids", [list(range(12)), [0, 3, 4, 9, 20, 21, 22, 50, 51, 80, 99, 200]])
def test_find_dense_sparse_and_missing(tmp_path, ids):
    index = base_and_tail(tmp_path, ids[:7], ids[7:])
    assert (index.n_base, index.tail.n) == (7, 5)
    for g, mid in enumerate(ids):
        assert index.find(mid) == g
    for mid in sorted(set(range(ids[-1] + 3)) - set(ids)):
        assert index.find(mid) == -1, mid
    assert MemoryIndex(DIM, UUID).find(0) == -1


def test_row_gather_column_and_vectors_agree_across_base_and_tail(tmp_path):
    index = base_and_tail(tmp_path, list(range(9)), list(range(9, 15)))
    index.set_field(3, "importance", 0.25)
    index.set_field(12, "importance", 0.75)
    order = np.array([14, 0, 8, 9, 3, 12, 3])
    for i, name in enumerate(FIELDS):
        column = index.column(name)
        assert len(column) == 15 and column.dtype == fmt.INDEX_DTYPE[name]
        got = index.gather(order, (name,))[name]
        assert got.tobytes() == column[order].tobytes()
        assert [index.row(g)[i] for g in range(15)] == column.tolist()
    assert index.row(3)[F_IMPORTANCE] == 0.25 and index.row(12)[F_IMPORTANCE] == 0.75
    # unit_vectors: the dequantised int8 vectors are within int8 error of the float16 ones.
    want = np.concatenate([vectors_of(range(9)), vectors_of(range(9, 15))]).astype(np.float32)
    unit, has = index.unit_vectors(order)
    assert has.all()
    assert np.allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5)
    assert np.abs(unit - want[order]).max() < 0.02
    before = snapshot(index)
    assert snapshot(checkpoint(index, str(tmp_path / "u.idx"))) == before


def test_unit_vectors_of_rows_without_a_vector_are_zero(tmp_path):
    index = MemoryIndex(DIM, UUID)
    append(index, [0, 1], flags=0)
    append(index, [2], flags=fmt.FLAG_HAS_VECTOR)
    unit, has = index.unit_vectors(np.array([0, 2, 1]))
    assert has.tolist() == [False, True, False]
    assert not unit[[0, 2]].any() and abs(np.linalg.norm(unit[1]) - 1) < 1e-5


@pytest.mark.parametrize("split", [0, 3, 6])
def test_by_time_breaks_ties_by_row(tmp_path, split):
    ts = [5.0, 1.0, 5.0, 3.0, 1.0, 5.0, 3.0, 0.5]
    index = base_and_tail(tmp_path, list(range(split)), list(range(split, 8)), ts[:split], ts[split:])
    index.forget(4, index.row(4)[F_FLAGS])
    oldest = [7, 1, 3, 6, 0, 2, 5]  # by (timestamp, row); row 4 is forgotten
    assert list(index.by_time(newest_first=False)) == oldest
    assert list(index.by_time(newest_first=True)) == oldest[::-1]


def test_forget_updates_live_flags_and_postings(tmp_path):
    index = base_and_tail(tmp_path, list(range(7)), list(range(7, 14)))  # apple: rows 0, 7
    rows, _ = index.keyword.search(index, "apple", 10, None, -np.inf, np.inf, 0)
    assert sorted(rows.tolist()) == [0, 7] and index.live == 14
    tokens = index.keyword.live_tokens
    for g in (0, 7):
        index.pinned = [g]
        index.forget(g, index.row(g)[F_FLAGS])
        assert index.pinned is None
    assert index.live == 12 and index.keyword.live_tokens == tokens - 4
    assert index.column("flags")[[0, 7]].tolist() == [fmt.FLAG_HAS_VECTOR | fmt.FLAG_FORGOTTEN] * 2
    assert index.keyword.search(index, "apple", 10, None, -np.inf, np.inf, 0)[0].size == 0
    assert 0 not in list(index.by_time(True)) and 7 not in list(index.by_time(True))
    doc_len = index.keyword.section().doc_len
    assert (doc_len[[0, 7]] & fmt.DOC_DEAD).all() and not (np.delete(doc_len, [0, 7]) & fmt.DOC_DEAD).any()
    loaded = checkpoint(index, str(tmp_path / "u.idx"))
    assert loaded.live == 12 and loaded.keyword.live_tokens == tokens - 4
    assert loaded.keyword.search(loaded, "apple", 10, None, -np.inf, np.inf, 0)[0].size == 0


@pytest.mark.parametrize("g", [1, 5])  # a base row, a tail row
def test_touch_counts_saturate_and_mark_stats(tmp_path, g):
    index = base_and_tail(tmp_path, [0, 1, 2], [3, 4, 5])
    assert not index.stats_changed
    index.touch([], 9.0)
    assert not index.stats_changed
    index.set_field(g, "access_count", 0xFFFFFFFE)
    index.touch([g, g, 0], 123.5)
    assert index.stats_changed
    assert index.row(g)[FIELDS.index("access_count")] == 0xFFFFFFFF
    assert index.column("last_access")[[0, g]].tolist() == [123.5, 123.5]
    assert index.column("access_count")[0] == 1 and index.column("access_count")[2] == 0


@pytest.mark.parametrize("g", [1, 4])
def test_change_importance_pin_and_metadata(tmp_path, g):
    index = base_and_tail(tmp_path, [0, 1, 2], [3, 4, 5])
    flags = index.row(g)[F_FLAGS]
    index.change(g, update_changes(flags, {"i": g, "p": 0.9, "n": True, "m": {"a": 1}}, 4242))
    row = index.row(g)
    assert abs(row[F_IMPORTANCE] - 0.9) < 1e-6 and row[F_META] == 4242
    assert row[F_FLAGS] == flags | fmt.FLAG_PINNED
    index.change(g, update_changes(row[F_FLAGS], {"i": g, "n": False}, 5000))
    assert index.row(g)[F_FLAGS] == flags and index.row(g)[F_META] == 4242
    assert [index.row(h)[F_META] for h in range(6) if h != g] == [0] * 5


def test_type_table_round_trip(tmp_path):
    index = MemoryIndex(DIM, UUID)
    assert [index.type_code(n, create=False) for n in fmt.BUILTIN_TYPES] == [0, 1, 2, 3]
    assert index.type_code("note", create=False) == -1 and index.user_types == []
    codes = [index.type_code(n, create=True) for n in ("note", "email", "note")]
    assert codes == [16, 17, 16]
    append(index, [0, 1, 2], types=[16, 3, 17])
    loaded = checkpoint(index, str(tmp_path / "t.idx"))
    assert loaded.user_types == ["note", "email"]
    assert [loaded.type_name(c) for c in loaded.column("type")] == ["note", "fact", "email"]
    assert loaded.type_code("email", create=False) == 17 and loaded.type_code("x", create=False) == -1
    for bad in (4, 15, 18, 65535):  # reserved, or beyond the table: a damaged row
        with pytest.raises(fastmem.CorruptIndexError):
            loaded.type_name(bad)


def test_save_load_round_trip_and_hot_section(tmp_path):
    index = MemoryIndex(DIM, UUID)
    rng = np.random.default_rng(3)
    n = fmt.HOT_MEMORIES + 40
    ts = rng.integers(0, 50, n).astype(float)  # many equal timestamps
    append(index, list(range(n)), ts, types=[i % 4 for i in range(n)])
    index.forget(10, index.row(10)[F_FLAGS])
    assert index.hot_rows() is None  # nothing checkpointed yet
    before = snapshot(index)
    newest = list(index.by_time(newest_first=True))
    loaded = checkpoint(index, str(tmp_path / "t.idx"))
    assert snapshot(loaded) == before
    assert (loaded.n_base, loaded.tail.n, loaded.dim) == (n, 0, DIM)
    assert loaded.base_order.tolist() == np.lexsort((np.arange(n), ts)).tolist()
    assert list(loaded.by_time(newest_first=True)) == newest
    hot, count = loaded.hot_rows()
    assert count == fmt.HOT_MEMORIES
    hot_ids = np.frombuffer(hot.rows, dtype=fmt.INDEX_DTYPE)["id"].tolist()
    assert hot_ids == newest[: fmt.HOT_MEMORIES]  # ids equal rows here
    append(loaded, [n])
    assert loaded.hot_rows() is None  # the tail has a row: the hot section is stale


@settings(max_examples=60, deadline=None)
@given(
    base_ts=st.lists(st.integers(0, 6), min_size=1, max_size=30),
    tail_ts=st.lists(st.integers(0, 6), min_size=1, max_size=30),
    damaged=st.booleans(),
)
def test_checkpoint_time_order_merges_the_base_and_the_tail(
    tmp_path_factory, base_ts, tail_ts, damaged
):
    """A full checkpoint's time order, from the base's order and the tail's merged, is the
    stable sort of every row's timestamp (ties in id order), tail rows older, newer or tied
    with the base's; a base whose order is not sorted by time (damage) is sorted again."""
    nb = len(base_ts)
    index = base_and_tail(tmp_path_factory.mktemp("o"), list(range(nb)), list(range(nb, nb + len(tail_ts))),
                          [float(t) for t in base_ts], [float(t) for t in tail_ts])  # fmt: skip
    if damaged and nb > 1 and len(set(base_ts)) > 1:
        index.base_order[:] = index.base_order[::-1].copy()  # in bounds, newest first
    ts = np.array(base_ts + tail_ts, dtype=float)
    expected = np.lexsort((np.arange(len(ts)), ts))
    assert index._order().tolist() == expected.tolist()
    loaded = checkpoint(index, str(tmp_path_factory.mktemp("o2") / "t.idx"))
    assert loaded.base_order.tolist() == expected.tolist()


def test_full_checkpoint_drops_the_old_files_vectors_from_the_cache_as_they_are_copied(
    tmp_path, monkeypatch
):
    """A full checkpoint copies the base's vectors file to file, part by part, and after
    each part drops the old file's cached pages of it (issue 21: the new file's pages then
    reuse memory freed a moment before); never a part not copied yet. The new file holds
    the same index."""
    from fastmem.storage import index as _index

    monkeypatch.setattr(_index, "_COPY_PART", 4096, raising=False)  # several parts
    path = str(tmp_path / "t.idx")
    index = base_and_tail(tmp_path, list(range(3000)), list(range(3000, 3100)))
    size = index.base_vectors.nbytes
    events = []
    real_copy, real_advise = os.copy_file_range, os.posix_fadvise

    def copy(src, dst, count, offset_src=None, offset_dst=None):
        n = real_copy(src, dst, count, offset_src, offset_dst)
        events.append(("copy", src, offset_src, offset_src + n))
        return n

    def advise(fd, offset, length, advice):
        events.append(("drop", fd, offset, offset + length, advice))
        return real_advise(fd, offset, length, advice)

    monkeypatch.setattr(os, "copy_file_range", copy)
    monkeypatch.setattr(os, "posix_fadvise", advise)
    before = snapshot(index)
    loaded = checkpoint(index, path)
    assert snapshot(loaded) == before
    copies = [e for e in events if e[0] == "copy"]
    assert len(copies) == -(-size // 4096) and copies[-1][3] - copies[0][2] == size
    copied, dropped = -1, []
    for kind, fd, start, end, *advice in events:
        assert fd == copies[0][1]  # the old file's descriptor
        if kind == "copy":
            copied = end
        else:
            assert advice == [os.POSIX_FADV_DONTNEED] and end <= copied  # only what is copied
            dropped.append((start, end))
    assert dropped[0][0] <= copies[0][2] and dropped[-1][1] == copies[-1][3]
    assert all(b[0] <= a[1] for a, b in pairwise(dropped))  # no part left out


def _damaged(path, at, value):
    """A copy of ``path`` with ``value`` written at ``at`` (``at=None``: one byte short)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if at is None:
        del data[-1]
    else:
        data[at : at + len(value)] = value
    with open(path + ".bad", "wb") as f:
        f.write(data)
    return path + ".bad"


def _use(index):
    """What a store does with a loaded index: every read path."""
    [index.column(name) for name in FIELDS]
    list(index.by_time(True))
    [index.find(i) for i in range(12)]
    [index.type_name(int(c)) for c in index.column("type")]
    index.keyword.search(index, "apple pear", 5, None, -np.inf, np.inf, 0)


@pytest.mark.parametrize("where", ["magic", "rows", "live", "crc", "order", "types", "size"])
def test_damaged_index_file_raises_corrupt_index_error(tmp_path, where):
    index = MemoryIndex(DIM, UUID)
    index.type_code("note", create=True)
    append(index, list(range(10)), types=[16] * 10)
    path = str(tmp_path / "t.idx")
    index.save(path, b"", sync=False)
    with open(path, "rb") as f:
        layout = fmt.header_layout(fmt.unpack_idx_header(f.read(), path))
    at = {"magic": (0, b"X"), "rows": (32, b"\x07"), "live": (40, b"\x09"),
          "crc": (fmt.IDX_HEADER_CRC_AT, b"\x00\x00"), "order": (layout.order + 8, b"\xff\xff"),
          "types": (layout.types, b"\xc1"), "size": (None, b"")}  # fmt: skip
    bad = _damaged(path, *at[where])
    with pytest.raises(fastmem.CorruptIndexError):
        _use(MemoryIndex.load(bad, UUID, DIM, b"", fmt.DAT_HEADER_SIZE))
    loaded = MemoryIndex.load(path, UUID, DIM, b"", fmt.DAT_HEADER_SIZE)
    _use(loaded)  # the undamaged file is fine
    with pytest.raises(fastmem.CorruptIndexError):  # another store's index
        MemoryIndex.load(path, bytes(16), DIM, b"", fmt.DAT_HEADER_SIZE)


def test_damaged_version_byte_of_the_index_is_corruption(tmp_path):
    index = MemoryIndex(DIM, UUID)
    append(index, [0, 1, 2])
    path = str(tmp_path / "t.idx")
    index.save(path, b"", sync=False)
    with pytest.raises(fastmem.CorruptIndexError):
        MemoryIndex.load(_damaged(path, 8, b"\x03"), UUID, DIM, b"", fmt.DAT_HEADER_SIZE)


def _write_store(path):
    with fastmem.open(path, dim=4) as store:
        ids = store.add_many(
            {"text": f"memory {i} {WORDS[i % 7]}", "embedding": np.eye(4)[i % 4] + 0.1,
             "timestamp": 100.0 + i, "session": f"s{i % 2}", "type": ["fact", "note"][i % 2]}
            for i in range(8)
        )  # fmt: skip
        store.update(ids[6], importance=0.05, pinned=True)
        store.forget(ids[7])


def test_checkpoint_equals_replay_of_the_data_file(store_path):
    _write_store(store_path)
    with open(store_path + ".dat", "rb") as f:
        dat = f.read()
    replayed, problems, records = build_index(dat, len(dat), "dat")
    assert problems == [] and records == 10 and replayed.live == 7
    header = fmt.unpack_dat_header(dat, "dat")
    loaded = MemoryIndex.load(store_path + ".idx", header.uuid, 4, dat, len(dat))
    assert len(loaded) == 8 and loaded.user_types == replayed.user_types == ["note"]
    assert snapshot(loaded) == snapshot(replayed)
    with pytest.raises(fastmem.CorruptIndexError):  # the data file lost its last record
        MemoryIndex.load(store_path + ".idx", header.uuid, 4, dat, loaded.covered - 1)


def test_replay_reports_a_damaged_record_and_keeps_the_ones_after_it(store_path):
    _write_store(store_path)
    with open(store_path + ".dat", "rb") as f:
        dat = bytearray(f.read())
    intact, _, _ = build_index(bytes(dat), len(dat), "dat")
    offsets = intact.column("offset").tolist()
    dat[offsets[3] + 30] ^= 0x40  # inside record 3's payload: its CRC fails
    index, problems, records = build_index(bytes(dat), len(dat), "dat")
    assert records == 9
    assert [(p.file, p.offset) for p in problems] == [("dat", offsets[3])]
    assert isinstance(problems[0], Problem)
    assert index.column("id").tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert index.column("offset").tolist() == offsets[:3] + offsets[4:]
    six = index.row(index.find(6))
    assert six[F_FLAGS] & fmt.FLAG_PINNED and abs(six[F_IMPORTANCE] - 0.05) < 1e-6
    assert index.row(index.find(7))[F_FLAGS] & fmt.FLAG_FORGOTTEN and index.live == 6
    assert index.damaged == [(offsets[3], offsets[4])]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 5), st.integers(1, 4), st.integers(0, 3)),
        st.tuples(st.just("forget"), st.integers(0, 10**6)),
        st.tuples(st.just("checkpoint")),
    ),
    max_size=14,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_random_appends_forgets_checkpoints_match_a_model(tmp_path_factory, ops):
    path = str(tmp_path_factory.mktemp("idx") / "t.idx")
    index = MemoryIndex(DIM, UUID)
    model: dict[int, tuple[float, bool]] = {}  # id -> (timestamp, forgotten)
    next_id = 0
    for op in ops:
        if op[0] == "add":  # op: count, gap between ids (1: dense), timestamp bucket
            ids = list(range(next_id, next_id + op[1] * op[2], op[2]))
            next_id = ids[-1] + op[2]
            ts = [float(op[3] + i % 2) for i in range(len(ids))]  # equal timestamps
            append(index, ids, ts)
            model.update({mid: (t, False) for mid, t in zip(ids, ts)})
        elif op[0] == "forget":
            live = sorted(m for m, (_, dead) in model.items() if not dead)
            if live:
                mid = live[op[1] % len(live)]
                index.forget(index.find(mid), index.row(index.find(mid))[F_FLAGS])
                model[mid] = (model[mid][0], True)
        else:
            index = checkpoint(index, path)
    ids = sorted(model)
    assert index.column("id").tolist() == ids
    assert [index.find(mid) for mid in ids] == list(range(len(ids)))
    assert index.live == sum(not dead for _, dead in model.values())
    assert index.next_id == (ids[-1] + 1 if ids else 0)
    live = [g for g, mid in enumerate(ids) if not model[mid][1]]
    oldest = sorted(live, key=lambda g: (model[ids[g]][0], g))
    assert list(index.by_time(newest_first=False)) == oldest
    assert list(index.by_time(newest_first=True)) == oldest[::-1]
    word_rows = index.keyword.search(index, "apple", 100, None, -np.inf, np.inf, 0)[0]
    assert sorted(word_rows.tolist()) == [g for g in live if ids[g] % 7 == 0]
    if os.path.exists(path):
        os.remove(path)


@pytest.mark.parametrize("chunk", [64, 700, 1 << 22])
def test_scan_file_reads_in_chunks_what_the_map_scan_finds(tmp_path, monkeypatch, chunk):
    """``scan_file`` (pread, chunk by chunk) finds the records and damaged regions the scan
    of the whole map finds: records longer than a chunk, damage in the middle, a torn tail;
    and a file cut shorter than ``end`` is scanned as it is now."""
    path = str(tmp_path / "chunks")
    with fastmem.open(path, embedder=None) as store:
        for n in (10, 3000, 40, 900, 5, 2500, 60):
            store.add(f"memory of {n} " + "words " * n)
    with open(path + ".dat", "rb") as f:
        dat = bytearray(f.read())
    offsets = _kernels.scan_records(bytes(dat), fmt.DAT_HEADER_SIZE, len(dat))[0].tolist()
    dat[offsets[2] + 30] ^= 0x40  # record 2 fails its CRC
    dat += dat[offsets[1] : offsets[1] + 100]  # a torn append: its header claims more bytes
    with open(path + ".dat", "wb") as f:
        f.write(dat)
    monkeypatch.setattr(_replay, "_SCAN_CHUNK", chunk)
    fd = os.open(path + ".dat", os.O_RDONLY)
    try:
        for end in (len(dat), len(dat) + 4096):  # the second: cut since the size was taken
            got = _replay.scan_file(fd, fmt.DAT_HEADER_SIZE, end)
            want = _kernels.scan_records(bytes(dat), fmt.DAT_HEADER_SIZE, len(dat))
            assert [a.tolist() for a in got] == [a.tolist() for a in want]
        assert len(want[0]) == 6 and want[4].tolist() == [offsets[2], len(dat) - 100]
        assert [a.tolist() for a in _replay.scan_file(fd, len(dat), len(dat))] == [[]] * 6
    finally:
        os.close(fd)

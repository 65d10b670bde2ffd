"""Corruption sweeps: random bit flips anywhere in both files, and the index cut at every
offset of its tail. (The data file cut at every offset of its tail is
``test_recovery.test_truncated_data_file``; single flips in one record are
``test_recovery.test_bit_flip_in_a_middle_record``.)

What must hold: ``verify()`` reports every damaged record with its offset; reading a
damaged memory raises ``CorruptRecordError``; every intact memory reads as before; and
``repair()`` keeps every intact memory, leaving a store that verifies clean.
"""

from __future__ import annotations

import fcntl
import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt
from fastmem import _kernels

DIM = 8
NO_PRELOAD = fastmem.ContextPolicy(preload=0, recent=0)
FLIP_ROUNDS = 30  # per backend


def _build(path: str) -> tuple[dict[str, fastmem.Memory], dict[str, int]]:
    """~30 memories (vectors, metadata, summaries, long compressed texts, updates, a forget)
    and a checkpoint covering all of it. Returns the live memories and their record offsets."""
    rng = np.random.default_rng(3)
    with fastmem.open(path, dim=DIM, durability="none", policy=NO_PRELOAD) as s:
        ids = []
        for i in range(30):
            ids.append(s.add(
                f"memory {i} ✓ " + "ünïcødé text " * (i % 4) * 10, timestamp=100.0 + i,
                session=f"s{i % 3}", metadata={"i": i}, embedding=rng.standard_normal(DIM),
                type=("fact", "plan", "note")[i % 3],
            ))  # fmt: skip
        s.update(ids[4], metadata={"updated": True}, importance=0.2)
        s.forget(ids[7])
        s.add("the last memory (never damaged: see _flippable)", timestamp=1.0)
    with fastmem.open(path, readonly=True, policy=NO_PRELOAD) as r:
        memories = {m.id: m for m in r}
        offsets = {m.id: r.info(m.id).record_offset for m in r}
    return memories, offsets


def _records(dat: bytes) -> list[tuple[int, int]]:
    offsets, lengths, _, _, bad, _ = _kernels.scan_records(dat, fmt.DAT_HEADER_SIZE, len(dat))
    assert not len(bad)
    return list(zip(offsets.tolist(), lengths.tolist()))


def _quiet_open(path: str, **kwargs: Any) -> tuple[fastmem.MemoryStore, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = fastmem.open(path, policy=NO_PRELOAD, **kwargs)
    assert all(issubclass(w.category, fastmem.RecoveryWarning) for w in caught)
    return store, [str(w.message) for w in caught]


@pytest.mark.slow
def test_random_bit_flips_in_the_data_file(tmp_path: Path, backend: str) -> None:
    src = str(tmp_path / "src")
    memories, offsets = _build(src)
    dat, idx = Path(src + ".dat").read_bytes(), Path(src + ".idx").read_bytes()
    by_offset = {off: mid for mid, off in offsets.items()}
    # Memory records, the newest excepted: a damaged last record that claims more bytes than
    # the file holds looks like an interrupted write, which a writer cuts at open.
    flippable = [(off, n) for off, n in _records(dat) if off in by_offset][:-1]
    rng = random.Random(f"flips-{backend}")
    path = str(tmp_path / "s")
    for round_ in range(FLIP_ROUNDS):
        victims = rng.sample(flippable, rng.randint(1, 3))
        damaged = bytearray(dat)
        for off, n in victims:
            for _ in range(rng.randint(1, 3)):
                pos = off + rng.randrange(n)
                damaged[pos] ^= 1 << rng.randrange(8)
        hit = {by_offset[off] for off, _ in victims}
        ctx = f"round {round_}: records {sorted(off for off, _ in victims)}"
        Path(path + ".dat").write_bytes(bytes(damaged))
        Path(path + ".idx").write_bytes(idx)

        reader, warned = _quiet_open(path, readonly=True)
        with reader:
            assert not warned, ctx
            report = reader.verify()
            found = {p.offset: p.message for p in report.problems if p.file == "dat"}
            assert {off for off, _ in victims} <= found.keys(), (ctx, report.problems)
            for off, message in found.items():  # else: intact records about a damaged memory
                assert off in dict(victims) or "does not exist" in message, (ctx, message)
            for mid, m in memories.items():
                if mid in hit:
                    with pytest.raises(fastmem.CorruptRecordError) as info:
                        reader.get(mid)
                    assert info.value.offset == offsets[mid], ctx
                else:
                    assert reader.get(mid) == m, ctx

        writer, _ = _quiet_open(path)
        with writer:
            repaired = writer.repair()
            assert not repaired.ok and repaired.memories == len(memories) - len(hit), ctx
            assert writer.verify().ok, ctx
            assert {m.id: m for m in writer} == {k: v for k, v in memories.items() if k not in hit}, ctx
        assert repaired.damaged_path is not None
        os.remove(repaired.damaged_path)

        # Without its index, the rebuilt one has no row for a damaged memory; verify still
        # names a damaged region starting at a damaged record, covering each of them.
        Path(path + ".dat").write_bytes(bytes(damaged))
        Path(path + ".idx").unlink()
        reader, warned = _quiet_open(path, readonly=True)
        with reader:
            assert warned, ctx
            problems = [p for p in reader.verify().problems if p.file == "dat"]
            regions = [(p.offset, int(p.message.split()[0])) for p in problems if "damaged bytes" in p.message]
            assert {start for start, _ in regions} <= {off for off, _ in victims}, ctx
            for off, _ in victims:
                assert any(start <= off < start + n for start, n in regions), ctx
            assert all("damaged bytes" in p.message or "does not exist" in p.message for p in problems)
            for mid, m in memories.items():
                if mid in hit:
                    assert mid not in reader, ctx
                else:
                    assert reader.get(mid) == m, ctx


def test_flips_in_the_data_file_header_are_refused(store_path: str) -> None:
    _build(store_path)
    dat = Path(store_path + ".dat").read_bytes()
    for pos in range(fmt.DAT_HEADER_SIZE):
        damaged = bytearray(dat)
        damaged[pos] ^= 1 << (pos % 8)
        Path(store_path + ".dat").write_bytes(bytes(damaged))
        for readonly in (True, False):
            with pytest.raises(fastmem.CorruptionError):
                fastmem.open(store_path, readonly=readonly, policy=NO_PRELOAD)
        assert Path(store_path + ".dat").read_bytes() == damaged  # nothing touched


def _flip_header(path: str, pos: int) -> bytes:
    dat = bytearray(Path(path + ".dat").read_bytes())
    old = bytes(dat[: fmt.DAT_HEADER_SIZE])
    dat[pos] ^= 1 << (pos % 8)
    Path(path + ".dat").write_bytes(bytes(dat))
    return old[:pos] + bytes([dat[pos]]) + old[pos + 1 :]


def _memories(path: str) -> dict[str, fastmem.Memory]:
    with fastmem.open(path, readonly=True, policy=NO_PRELOAD) as r:
        assert r.verify().ok
        return {m.id: m for m in r}


def test_repair_rebuilds_a_damaged_data_file_header(tmp_path: Path, backend: str) -> None:
    src = str(tmp_path / "src")
    memories, _ = _build(src)
    for pos in range(0, fmt.DAT_HEADER_SIZE, 7):  # magic, version, UUID, dimension, CRC...
        path = str(tmp_path / f"s{pos}")
        for ext in (".dat", ".idx"):
            Path(path + ext).write_bytes(Path(src + ext).read_bytes())
        damaged = _flip_header(path, pos)
        with pytest.raises(fastmem.CorruptionError):
            fastmem.open(path, policy=NO_PRELOAD)
        report = fastmem.repair(path)
        assert not report.ok and report.cut[0].offset == 0 and "header" in report.cut[0].message
        kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"s{pos}.dat.damaged-")]
        assert len(kept) == 1 and kept[0].read_bytes()[16:] == damaged  # offset, length, bytes
        assert _memories(path) == memories
        with fastmem.open(path, policy=NO_PRELOAD) as store:  # a writer can go on
            query = memories["m3"]
            hits = store.search(store._engine.index.unit_vectors(np.array([3]))[0][0], 1, mode="vector")
            assert hits[0].id == query.id
            store.add("after the repair", embedding=np.ones(DIM))
        assert fastmem.repair(path).ok  # intact now: rewritten, nothing cut


def test_repair_rebuilds_the_header_of_a_compacted_store_without_its_index(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    _build(path)
    with fastmem.open(path, policy=NO_PRELOAD) as store:
        store.compact()
        late = store.add("added after the compaction", session="s9")
        store.update("m5", importance=0.9)
        store.forget("m6")
    memories = _memories(path)
    assert late in memories and "m6" not in memories
    _flip_header(path, 40)
    os.remove(path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning, match="missing"):  # the index is rebuilt
        assert not fastmem.repair(path).ok
    assert _memories(path) == memories


def test_repair_refuses_what_is_not_a_store_and_a_store_in_use(tmp_path: Path) -> None:
    junk = tmp_path / "junk.dat"
    junk.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(fastmem.CorruptionError):
        fastmem.repair(str(tmp_path / "junk"))
    assert junk.read_bytes() == bytes(range(256)) * 8  # nothing written
    with pytest.raises(fastmem.StoreNotFoundError):
        fastmem.repair(str(tmp_path / "missing"))
    with pytest.raises(fastmem.InvalidTypeError):
        fastmem.repair(123)  # type: ignore[arg-type]
    with pytest.raises(fastmem.StoreNotFoundError):
        fastmem.repair(str(tmp_path), namespace="nobody")
    path = str(tmp_path / "s")
    with fastmem.open(path, dim=DIM, policy=NO_PRELOAD) as store:
        store.add("x")
        assert fastmem.repair(path).ok  # beside another handle: it follows the new files
        assert [m.text for m in store] == ["x"] and store.verify().ok
        holder = os.open(path + ".dat", os.O_RDWR)  # a lock held for longer than a write
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)
            with pytest.raises(fastmem.StoreLockedError):
                fastmem.repair(path, timeout=0.05)
        finally:
            os.close(holder)


def _idx_harmless(idx: bytes) -> set[int]:
    """Index bytes whose change no read sees: padding between sections, and the access
    statistics of each row (kept only in the index; a damaged one skews a score a little)."""
    h = fmt.unpack_idx_header(idx, "idx")
    lay = fmt.header_layout(h)
    n, size = h.rows, fmt.INDEX_DTYPE.itemsize
    harmless: set[int] = set()
    stats = [*range(40, 48), *range(60, 64)]  # last_access, access_count
    for first in (lay.rows, lay.hot + 4):
        count = n if first == lay.rows else struct_count(idx, lay.hot, h.hot_len)
        for i in range(count):
            harmless.update(first + i * size + b for b in stats)
    ends = [(lay.rows + n * size, lay.order), (lay.order + 4 * n, lay.vectors),
            (lay.vectors + n * h.dim, lay.types), (lay.types + h.types_len, lay.hot)]  # fmt: skip
    kw = lay.keyword
    assert kw is not None
    t, p = h.keyword_terms, h.keyword_postings
    ends += [(lay.hot + h.hot_len, kw.terms), (kw.terms + 8 * t, kw.offsets),
             (kw.offsets + 8 * (t + 1), kw.rows), (kw.rows + 4 * p, kw.tf), (kw.tf + 2 * p, kw.doc_len)]  # fmt: skip
    for end, next_start in ends:
        harmless.update(range(end, next_start))
    # After the sections: padding, then the two commit slots, empty after a full checkpoint
    # (a flipped byte leaves an invalid slot, which names nothing, as an empty one).
    harmless.update(range(kw.doc_len + 4 * n, fmt.deltas_at(lay)))
    return harmless


def struct_count(idx: bytes, at: int, length: int) -> int:
    return int.from_bytes(idx[at : at + 4], "little") if length else 0


@pytest.mark.slow
def test_random_bit_flips_in_the_index(store_path: str, backend: str) -> None:
    memories, _ = _build(store_path)
    idx = Path(store_path + ".idx").read_bytes()
    harmless = _idx_harmless(idx)
    rng = random.Random(f"idx-{backend}")
    positions = rng.sample(range(len(idx)), 300) + list(range(0, 160)) + [len(idx) - 1]
    detected = 0
    for pos in positions:
        damaged = bytearray(idx)
        damaged[pos] ^= 1 << rng.randrange(8)
        Path(store_path + ".idx").write_bytes(bytes(damaged))
        reader, warned = _quiet_open(store_path, readonly=True)
        with reader:
            ctx = f"byte {pos} of the index"
            if warned:  # refused at open and rebuilt from the data file
                assert {m.id: m for m in reader} == memories, ctx
                assert reader.verify().ok, ctx
                detected += 1
            elif pos not in harmless:
                assert not reader.verify().ok, ctx
                detected += 1
            else:
                assert {m.id: m for m in reader} == memories, ctx
    Path(store_path + ".idx").write_bytes(idx)
    assert detected >= len([p for p in positions if p not in harmless])


@pytest.mark.slow
def test_index_cut_at_every_offset_of_its_tail(store_path: str) -> None:
    memories, _ = _build(store_path)
    idx = Path(store_path + ".idx").read_bytes()
    cuts = [*range(len(idx) - 600, len(idx)), *range(0, len(idx) - 600, 97)]
    for n, cut in enumerate(cuts):
        Path(store_path + ".idx").write_bytes(idx[:cut])
        readonly = n % 10 != 0  # now and then the writer, which writes a new index
        store, warned = _quiet_open(store_path, readonly=readonly)
        with store:
            assert warned, cut
            assert {m.id: m for m in store} == memories, cut
            assert store.verify().ok, cut
        if not readonly:
            with fastmem.open(store_path, readonly=True, policy=NO_PRELOAD) as r:  # no warning
                assert {m.id: m for m in r} == memories

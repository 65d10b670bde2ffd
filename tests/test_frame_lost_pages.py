"""The batch frame's rule for lost pages (docs/format.md, "Batch frame"): a power loss
during the file's last, unsynced batch that zeroes a page of it and keeps later pages makes
the batch a torn append (none of it, cut quietly); the same damage followed by a later
write (a frame, a record of another kind) is damage in a whole batch (kept, reported)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip
PAGE = 4096


def _records_after(data: bytes, at: int) -> list[tuple[int, int]]:
    out = []
    while at + fmt.RECORD_HEADER_SIZE <= len(data):
        _, _, _, dim, plen, _, _ = fmt.RECORD_HEADER.unpack_from(data, at)
        out.append((at, fmt.record_size(dim, plen)))
        at += out[-1][1]
    return out


def _store(path: str, later: str) -> tuple[int, list[tuple[int, int]]]:
    """m0, then one add_many of four memories of ~3 KB (incompressible), then ``later``:
    nothing, an add_many (a frame) or a forget of m0 without erasing (another kind)."""
    rng = np.random.default_rng(3)
    with fastmem.open(path, durability="always", **QUIET) as s:
        s.add("first", embedding=np.ones(8))
        frame_at = os.path.getsize(path + ".dat")
        s.add_many([{"text": f"batch {i} " + rng.bytes(1500).hex(), "embedding": np.ones(8) + i}
                    for i in range(4)])  # fmt: skip
        if later == "batch":
            s.add_many([{"text": f"later {i}", "embedding": np.ones(8)} for i in range(2)])
        elif later == "forget":
            s.forget("m0", erase=False)
    data = Path(path + ".dat").read_bytes()
    return frame_at, _records_after(data, frame_at)


def _zero(path: str, start: int, stop: int) -> bytes:
    data = bytearray(Path(path + ".dat").read_bytes())
    data[start:stop] = bytes(stop - start)
    Path(path + ".dat").write_bytes(bytes(data))
    os.remove(path + ".idx")  # the index rebuilt from the data file
    return bytes(data)


def _open(path: str, **kwargs: Any) -> tuple[fastmem.MemoryStore, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = fastmem.open(path, **QUIET, **kwargs)
    return store, [str(w.message) for w in caught if "damaged" in str(w.message)]


@pytest.mark.parametrize("lost", ["a middle page", "the frame's page"])
def test_a_batch_with_a_lost_page_before_kept_ones_is_none_of_it(
    tmp_path: Path, backend: str, lost: str
) -> None:
    path = str(tmp_path / "s")
    frame_at, records = _store(path, "none")
    if lost == "a middle page":  # the page after the one the second record starts in
        start = (records[2][0] // PAGE + 1) * PAGE
        stop = start + PAGE
    else:  # the batch's part of the page it started in, the frame with it
        start, stop = frame_at, (frame_at // PAGE + 1) * PAGE
    assert stop < records[-1][0]  # a later record of the batch was kept whole
    _zero(path, start, stop)
    reader, warned = _open(path, readonly=True)
    with reader:
        assert reader.ids() == ["m0"] and reader.verify().ok and not warned  # none of it
    s, warned = _open(path, durability="always")
    with s:
        assert s.ids() == ["m0"] and not warned
        assert os.path.getsize(path + ".dat") == frame_at  # cut at its frame, quietly
        added = s.add("after the cut")
        assert s.verify().ok
    os.remove(path + ".idx")
    r, _ = _open(path, readonly=True)
    with r:
        assert r.ids() == ["m0", added]


@pytest.mark.parametrize("later", ["batch", "forget"])
def test_a_zeroed_page_in_a_batch_a_later_write_follows_is_damage_kept(
    tmp_path: Path, backend: str, later: str
) -> None:
    """A later write (made after the batch's sync: the batch could lose no page) follows
    the zeros: bit rot, not a power loss. Nothing is cut; the damage is reported."""
    path = str(tmp_path / "s")
    _, records = _store(path, later)
    start = (records[2][0] // PAGE + 1) * PAGE
    data = _zero(path, start, start + PAGE)
    s, _ = _open(path, durability="always")
    with s:
        ids = s.ids()
        assert "m1" in ids and "m4" in ids  # the batch's records before and after the zeros
        assert ("m0" in ids) == (later == "batch")  # the forget is read too
        if later == "batch":
            assert {"m5", "m6"} <= set(ids)
        assert not s.verify().ok
    assert os.path.getsize(path + ".dat") == len(data)


def test_a_frame_where_a_batch_record_should_be_keeps_the_records_after_it(
    tmp_path: Path, backend: str
) -> None:
    """A frame naming more records than the file holds, where a batch's second record
    should start: reported as damage, and the records after it (the batch's and a later
    add) are read, not taken for a batch the file ends inside and cut."""
    path = str(tmp_path / "s")
    _, records = _store(path, "none")
    with fastmem.open(path, durability="always", **QUIET) as s:
        s.add("later", embedding=np.ones(8))
    data = Path(path + ".dat").read_bytes()
    second = records[2][0]
    crafted = bytearray(fmt.pack_batch_frame(2))
    crafted[fmt.RECORD_HEADER_SIZE :] = (2**32 - 1).to_bytes(8, "little")
    crc = fmt.crc32(
        bytes(crafted[fmt.RECORD_HEADER_SIZE :]), fmt.crc32(bytes(crafted[: fmt.RECORD_CRC_AT]))
    )
    crafted[fmt.RECORD_CRC_AT : fmt.RECORD_HEADER_SIZE] = crc.to_bytes(4, "little")
    data = data[:second] + bytes(crafted) + data[second:]
    Path(path + ".dat").write_bytes(data)
    os.remove(path + ".idx")
    s, _ = _open(path, durability="always")
    with s:
        assert s.ids() == ["m0", "m1", "m2", "m3", "m4", "m5"]
        problems = [(p.offset, p.message) for p in s.verify().problems]
        assert problems == [(second, f"{fmt.BATCH_FRAME_SIZE} damaged bytes")]
    assert os.path.getsize(path + ".dat") == len(data)


def test_lost_pages_and_frames_inside_batches_scan_the_same_in_every_scan(tmp_path: Path) -> None:
    """Records, frames (inside batches too), runs of zeros (a frame's length, a page, more),
    flipped bits and junk, the file cut anywhere: the compiled scan, the reference scan and
    the catch-up's file scan (whole, and in chunks that cut records and batches) agree."""
    import random

    from test_frame_review import _frame, _record, _same

    from fastmem import _kernels
    from fastmem.storage import replay as _replay
    from fastmem._kernels import reference as ref

    rng = random.Random(1)
    path = tmp_path / "f.dat"
    for _ in range(300):
        out = bytearray(fmt.DAT_HEADER_SIZE)
        for k in range(rng.randint(1, 12)):
            what = rng.random()
            if what < 0.45:
                out += _record(k, rng.choice([5, 100, 300, 2000]))
            elif what < 0.6:
                out += _frame(rng.choice([2, 3, 4, 7]))
            elif what < 0.8:
                out += bytes(rng.choice([28, 30, 64, PAGE, PAGE + 4, 5000]))
            elif what < 0.9:
                rec = bytearray(_record(k, 300))
                rec[rng.randrange(len(rec))] ^= 1
                out += rec
            else:
                out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        data = bytes(out)
        if rng.random() < 0.5:
            data = data[: rng.randint(fmt.DAT_HEADER_SIZE, len(data))]
        start, end = fmt.DAT_HEADER_SIZE, len(data)
        expected = ref.scan_records(data, start, end)
        assert _same(_kernels.scan_records(data, start, end), expected)
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        small, chunk = _replay._SMALL_SCAN, _replay._SCAN_CHUNK
        try:
            for _replay._SMALL_SCAN, _replay._SCAN_CHUNK in ((small, chunk), (0, 97), (0, 4500)):
                assert _same(_replay.scan_file(fd, start, end), expected)
        finally:
            _replay._SMALL_SCAN, _replay._SCAN_CHUNK = small, chunk
            os.close(fd)

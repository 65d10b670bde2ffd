"""Fuzz target: the parsers of both files, called directly on hostile bytes (fast).

Where ``fuzz_open.py`` opens a whole store per input (~150 inputs/s), this target calls
each reader on the bytes themselves, thousands of times a second:

- the data-file scan, compiled (the selected backend) and reference, which must agree (a differential
  check), then ``read_record`` / ``check_record`` / ``decode_payload`` on every record
  the scan found and at every record magic;
- ``unpack_dat_header``, ``unpack_idx_header`` and the layout it describes,
  ``unpack_hot``, ``unpack_types``, and the keyword kernels over hostile postings.

Only ``FastmemError`` may come out of a fastmem reader (the kernels, which are private,
raise ``ValueError`` on bad arguments, which their callers turn into ``CorruptIndexError``).

    python fuzz/fuzz_readers.py -runs=1000000 -max_len=8192 -len_control=0 CORPUS_DIR
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__" and "--random" not in sys.argv:
    import atheris

    with atheris.instrument_imports(include=["fastmem"]):
        import fastmem
else:
    import fastmem
from fastmem import _format as fmt  # noqa: E402
from fastmem import _kernels  # noqa: E402  (the compiled kernels unless FASTMEM_BACKEND=python)
from fastmem._kernels import reference as ref  # noqa: E402

FastmemError = fastmem.FastmemError


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def check_dat(buf: bytes) -> None:
    """Scan ``buf`` as a data file with both backends and read every record found."""
    start = min(fmt.DAT_HEADER_SIZE, len(buf))  # records start after the file header
    try:
        fmt.unpack_dat_header(buf, "fuzz.dat")
    except FastmemError:
        pass
    compiled = _kernels.scan_records(buf, start, len(buf))
    if not _same(compiled, ref.scan_records(buf, start, len(buf))):
        raise AssertionError("the compiled and reference scans disagree")
    offsets, lengths = compiled[0].tolist(), compiled[1].tolist()
    # every record the scan accepts, and every magic (accepted or not)
    at, magics = buf.find(fmt.RECORD_MAGIC), []
    while at != -1 and len(magics) < 64:
        if at < start:
            at = buf.find(fmt.RECORD_MAGIC, at + 1)
            continue
        magics.append(at)
        at = buf.find(fmt.RECORD_MAGIC, at + 1)
    for off in offsets + magics:
        info = _kernels.check_record(buf, off, len(buf))
        if (info is None) != (ref.check_record(buf, off, len(buf)) is None):
            raise AssertionError("check_record disagrees between backends")
        try:
            head, payload = fmt.read_record(buf, off, len(buf), "fuzz.dat")
        except FastmemError:
            if off in offsets:
                try:  # the scan accepted it: only decoding may fail
                    fmt.parse_record_header(buf, off, len(buf))
                except FastmemError:
                    raise AssertionError("the scan accepted a record read_record refuses") from None
            continue
        if info is None:
            raise AssertionError("read_record accepted a record check_record refuses")
        if off in offsets and offsets.index(off) < len(lengths) and head.length != lengths[offsets.index(off)]:
            raise AssertionError("lengths differ between the scan and read_record")


def check_idx(buf: bytes) -> None:
    """Parse ``buf`` as an index (header checksum repaired) and each section it describes."""
    if len(buf) >= fmt.IDX_HEADER_SIZE:
        body = buf[: fmt.IDX_HEADER_CRC_AT]
        buf = body + struct.pack("<I", fmt.crc32(body)) + buf[fmt.IDX_HEADER_SIZE :]
    try:
        h = fmt.unpack_idx_header(buf, "fuzz.idx")
    except FastmemError:
        return
    layout = fmt.header_layout(h)
    view = memoryview(buf)
    for parse in (
        lambda: fmt.unpack_types(view[layout.types : layout.types + h.types_len], "fuzz.idx"),
        lambda: fmt.unpack_hot(view[layout.hot : layout.hot + h.hot_len], "fuzz.idx"),
    ):
        try:
            parse()
        except FastmemError:
            pass


def check_hot_and_types(data: bytes) -> None:
    for parse in (lambda: fmt.unpack_hot(memoryview(data), "x"), lambda: fmt.unpack_types(data, "x")):
        try:
            parse()
        except FastmemError:
            pass


def check_postings(data: bytes) -> None:
    """bm25_topk and merge_postings on hostile postings: ValueError or a result, never a crash."""
    n = 16
    words = np.frombuffer(data[: len(data) // 8 * 8], dtype="<u8")
    if len(words) < 9:
        return
    p = int(words[0] % 64)
    rows = (words[1 : 1 + p] % 32).astype(np.uint32)  # some point past the 16 rows
    tf = (words[1 : 1 + p] >> 8).astype(np.uint16)
    p = len(rows)
    ranges = (words[1:9].astype(np.int64) % 80 - 8).reshape(-1, 2)  # some out of bounds
    doc_len = (words[:n] if len(words) >= n else np.resize(words, n)).astype(np.uint32)
    cols = (np.zeros(n, np.uint16), np.zeros(n, np.float64), np.zeros(n, np.uint64))
    empty = (np.zeros(0, np.uint16), np.zeros(0, np.float64), np.zeros(0, np.uint64))
    try:
        _kernels.bm25_topk(rows, tf[:p], np.ascontiguousarray(ranges), doc_len, np.zeros(0, np.uint32),
                      cols, empty, 5, None, -np.inf, np.inf, 0, float(n), 3.0, 1.2, 0.75,
                      np.zeros(n))  # fmt: skip
    except ValueError:
        pass
    terms = np.sort(words[: max(1, p // 2)])
    offsets = np.sort(words[: len(terms) + 1] % (p + 2)).astype(np.uint64)
    try:
        _kernels.merge_postings(terms, offsets, rows, tf[:p], np.zeros(0, np.uint64),
                           np.zeros(0, np.uint32), np.zeros(0, np.uint16))  # fmt: skip
    except ValueError:
        pass


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode == 0:
        check_dat(body)
    elif mode == 1:
        check_idx(body)
    elif mode == 2:
        check_hot_and_types(body)
    else:
        check_postings(body)


def seed_inputs() -> list[bytes]:
    """Valid files to start from (the same seed store as fuzz_open.py)."""
    import fuzz_open

    fuzz_open._setup()
    dat, idx = fuzz_open._state["dat"], fuzz_open._state["idx"]
    return [b"\x00" + dat, b"\x01" + idx, b"\x03" + dat[:512]]  # type: ignore[operator]


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fuzz_open

    fuzz_open.command_line(one_input, seed_inputs)

if __name__ == "__main__":
    main()

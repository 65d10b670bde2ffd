"""The data-file scan on a hostile file: plausible record headers every 16 bytes.

Each header claims a 64 KiB record whose CRC does not match. A resync that checked every
candidate's CRC from scratch would read 64 KiB per 16 bytes of file (4096x the file);
the compiled scan derives each candidate's CRC from prefix CRCs and reads each byte once.

    python benchmarks/hostile_scan.py
"""

from __future__ import annotations

import struct
import time
import zlib

from fastmem import _format as fmt
from fastmem._kernels._ext import records


def record(payload: bytes) -> bytes:
    head = fmt.RECORD_MAGIC + bytes([fmt.RECORD_VERSION, fmt.KIND_MEMORY]) + struct.pack(
        "<HII", 0, len(payload), len(payload)
    )
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def hostile(size: int, claimed: int = 1 << 16) -> bytes:
    head = fmt.RECORD_MAGIC + bytes([fmt.RECORD_VERSION, fmt.KIND_MEMORY]) + struct.pack(
        "<HII", 0, claimed, claimed
    )
    return bytes(fmt.DAT_HEADER_SIZE) + head[:16] * (size // 16) + bytes(2 * claimed) + record(b"x")


if __name__ == "__main__":
    for size in (1 << 20, 1 << 23, 1 << 26):
        buf = hostile(size)
        started = time.perf_counter()
        offsets = records.scan_records(buf, fmt.DAT_HEADER_SIZE, len(buf))[0]
        took = time.perf_counter() - started
        assert len(offsets) == 1
        print(f"{len(buf) / 2**20:7.1f} MiB packed with headers: scan {took * 1e3:8.1f} ms "
              f"({len(buf) / took / 2**20:.0f} MiB/s)")

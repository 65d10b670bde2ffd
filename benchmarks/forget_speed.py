"""What erasing costs: ``forget`` (erases) against ``forget(erase=False)`` (a tombstone).

A store of N memories with 384-dimensional vectors, checkpointed, then per mode: forgets of
memories the index file holds (an erase then rewrites the index whole), and forgets of
memories added since the checkpoint (only the data file's records are overwritten).
Each forget is timed alone, under ``durability="batch"`` (an erase syncs twice).

    python benchmarks/forget_speed.py [--sizes 10000,100000] [--forgets 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import fastmem


def _items(n: int, start: int, rng: np.random.Generator) -> list[dict]:
    vectors = rng.standard_normal((n, 384)).astype(np.float32)
    return [{"text": f"memory {start + i} about topic {i % 97} " * 4, "embedding": vectors[i]}
            for i in range(n)]  # fmt: skip


def _run(size: int, forgets: int, erase: bool, folder: str) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(size)
    path = os.path.join(folder, f"s{size}{erase}")
    with fastmem.open(path, embedder=None, summarizer=None) as store:
        ids = []
        for lo in range(0, size, 5000):
            ids += store.add_many(_items(min(5000, size - lo), lo, rng))
        store.checkpoint()
        old = []
        for mid in ids[:: max(1, size // forgets)][:forgets]:
            t0 = time.perf_counter()
            store.forget(mid, erase=erase)
            old.append(time.perf_counter() - t0)
        fresh_ids = store.add_many(_items(forgets, size, rng))
        new = []
        for mid in fresh_ids:
            t0 = time.perf_counter()
            store.forget(mid, erase=erase)
            new.append(time.perf_counter() - t0)
    return old, new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--forgets", type=int, default=20)
    args = parser.parse_args()
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"fastmem {fastmem.__version__}")  # fmt: skip
    print("| memories | forget of | tombstone (ms, median / max) | erase (ms, median / max) |")
    print("|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(s) for s in args.sizes.split(",")):
            plain = _run(size, args.forgets, False, folder)
            erased = _run(size, args.forgets, True, folder)
            for i, what in enumerate(("a checkpointed memory", "a memory added since")):
                cells = [f"{1e3 * statistics.median(r[i]):.2f} / {1e3 * max(r[i]):.2f}"
                         for r in (plain, erased)]  # fmt: skip
                print(f"| {size:,} | {what} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()

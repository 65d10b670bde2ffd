"""What adding up several processes' access statistics costs a checkpoint.

Two handles on one store (as two processes: each has its own index and writer lock). Each
round: handle A records accesses and checkpoints; handle B records accesses and
checkpoints over A's file (B reads A's statistics and adds its own: the merge), then B
checkpoints again with nothing new from A (no merge: the file is the one it wrote). At
10,000 memories the checkpoints are full ones; at 100,000, deltas (they start at 16,384
rows), so the merge's reading of the other file shows more there.

    python benchmarks/stats_merge.py [--sizes 10000,100000] [--rounds 5]
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


def _run(size: int, rounds: int, folder: str) -> tuple[list[float], list[float]]:
    path = os.path.join(folder, f"s{size}")
    rng = np.random.default_rng(size)
    with fastmem.open(path, embedder=None, summarizer=None) as store:
        for lo in range(0, size, 5000):
            vectors = rng.standard_normal((min(5000, size - lo), 384)).astype(np.float32)
            store.add_many(
                [{"text": f"memory {lo + i}", "embedding": v} for i, v in enumerate(vectors)]
            )
    merged, alone = [], []
    with fastmem.open(path, embedder=None) as a, fastmem.open(path, embedder=None) as b:
        ids = a.ids()
        for r in range(rounds):
            picks = [ids[i] for i in rng.integers(0, size, 100)]
            a.record_access(picks)
            a.checkpoint()
            b.record_access(picks)
            t0 = time.perf_counter()
            b.checkpoint()  # over A's file: merges
            merged.append(time.perf_counter() - t0)
            b.record_access(picks)
            t0 = time.perf_counter()
            b.checkpoint()  # over its own file: no merge
            alone.append(time.perf_counter() - t0)
    return merged, alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print("| memories | checkpoint over another's file (merge), ms | over its own (no merge), ms |")
    print("|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(s) for s in args.sizes.split(",")):
            merged, alone = _run(size, args.rounds, folder)
            print(
                f"| {size:,} | {1e3 * statistics.median(merged):.1f} | {1e3 * statistics.median(alone):.1f} |"
            )


if __name__ == "__main__":
    main()

"""add_many batch by batch: ``python benchmarks/add_many_batches.py [N]`` (default 1,000,000).

Builds a store of N memories with given vectors (benchmarks/workload.py, each batch of 5,000
made as it is added, as ``checkpoint_speed.py`` does), times every ``add_many`` call and
``close()``, and prints the rates, the sum of the calls and how much the slow ones took
beyond three times the median batch (a checkpoint written in the call shows there), with
the five slowest batches.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import workload

import fastmem


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    w = workload.generate(n)
    folder = tempfile.mkdtemp(prefix="fastmem-batches-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    store = fastmem.open(os.path.join(folder, "store"), dim=workload.DIM)
    times = []
    t0 = time.perf_counter()
    for start in range(0, n, workload.BATCH):
        batch = w.fastmem_batch(start)
        a = time.perf_counter()
        store.add_many(batch)
        times.append(time.perf_counter() - a)
    t1 = time.perf_counter()
    store.close()
    t2 = time.perf_counter()
    median = statistics.median(times)
    excess = sum(t - median for t in times if t > 3 * median)
    slow = sorted(((t, i) for i, t in enumerate(times)), reverse=True)[:5]
    print(f"{n:,} memories: add {n / (t1 - t0):,.0f}/s, close {t2 - t1:.2f} s, in all "
          f"{n / (t2 - t0):,.0f}/s; add_many calls {sum(times):.2f} s (median batch "
          f"{median * 1e3:.1f} ms), slow batches' excess {excess:.2f} s; slowest: "
          + ", ".join(f"#{i} {t * 1e3:.0f} ms" for t, i in slow))  # fmt: skip
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()

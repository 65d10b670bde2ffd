"""Building a store, and closing it after a small write: ``python benchmarks/checkpoint_speed.py N``.

One process (the fastmem on PYTHONPATH, or this checkout's) builds a store of N memories
with given vectors (benchmarks/workload.py, batches of 5,000 built as they are added) and
closes it; its peak RSS above what it held before the first batch is reported. Then, three
times: reopen, add 1,000 memories with given vectors, time ``close()`` alone (the checkpoint:
before issue 21 it rewrote and fsynced the whole index). Prints one JSON line.

    python benchmarks/checkpoint_speed.py 1000000
    PYTHONPATH=/path/to/other/checkout python benchmarks/checkpoint_speed.py 100000
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import workload

import fastmem


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    w = workload.generate(n)
    extra = workload.generate(5000)
    folder = tempfile.mkdtemp(prefix="fastmem-ckpt-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    path = os.path.join(folder, "store")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    store = fastmem.open(path, dim=workload.DIM)
    for start in range(0, n, workload.BATCH):
        store.add_many(w.fastmem_batch(start))
    t1 = time.perf_counter()
    store.close()
    t2 = time.perf_counter()
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    closes, adds = [], []
    for r in range(3):
        store = fastmem.open(path, dim=workload.DIM)
        batch = extra.fastmem_batch(1000 * r)[:1000]
        for item in batch:
            item["timestamp"] = 2e9 + item["timestamp"]  # newer than every stored memory
        a0 = time.perf_counter()
        store.add_many(batch)
        a1 = time.perf_counter()
        store.close()
        a2 = time.perf_counter()
        adds.append(a1 - a0)
        closes.append(a2 - a1)
    size = sum(os.path.getsize(path + ext) for ext in (".dat", ".idx"))
    shutil.rmtree(folder)
    print(json.dumps({
        "n": n, "fastmem": fastmem.__file__, "add_per_s_incl_close": n / (t2 - t0),
        "add_s": t1 - t0, "close_s": t2 - t1, "peak_rss_mb": peak,
        "close_after_1000_ms": [round(1000 * c, 1) for c in closes],
        "close_after_1000_median_ms": round(1000 * float(np.median(closes)), 1),
        "add_1000_ms": [round(1000 * a, 1) for a in adds], "bytes": size,
    }))  # fmt: skip


if __name__ == "__main__":
    main()

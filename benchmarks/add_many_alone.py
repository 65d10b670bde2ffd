"""add_many on its own: ``python benchmarks/add_many_alone.py [N]`` (default 1,000,000).

The benchmark suites write gigabytes just before they time inserts (building stores, the
SQLite peer), and at 1 M the group commit's fsyncs then queue behind that write-back. Run
this on a quiet machine to see add_many and the closing checkpoint by themselves.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import workload

import fastmem


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    batches = workload.generate(n).fastmem_batches()
    folder = tempfile.mkdtemp(prefix="fastmem-add-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    path = os.path.join(folder, "store")
    t0 = time.perf_counter()
    store = fastmem.open(path, dim=workload.DIM)
    for batch in batches:
        store.add_many(batch)
    t1 = time.perf_counter()
    store.close()
    t2 = time.perf_counter()
    print(f"{n:,} memories: add_many {n / (t1 - t0):,.0f}/s, close {t2 - t1:.2f} s, "
          f"in all {n / (t2 - t0):,.0f}/s")  # fmt: skip
    for ext in (".dat", ".idx"):
        os.remove(path + ext)
    os.rmdir(folder)


if __name__ == "__main__":
    main()

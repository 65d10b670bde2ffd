"""add_many on its own: ``python benchmarks/add_many_alone.py [N]`` (default 1,000,000).

The benchmark suites write gigabytes just before they time inserts (building stores, the
SQLite peer), and at 1 M the group commit's fsyncs then queue behind that write-back. Run
this on a quiet machine to see add_many and the closing checkpoint by themselves.

On a loaded machine the wall clock also counts the time spent waiting for a core: the CPU
time of the calling thread (the path a batch waits for: a large batch's token counting is
shared with a helper thread) and of all threads are printed too. ``--alternate`` adds the
batches to one store with the texts counted by the calling thread alone and shared with the
helper thread in turn (medians per batch: the same load for both).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import workload

import fastmem


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 1_000_000
    batches = workload.generate(n).fastmem_batches()
    if "--alternate" in sys.argv:
        return alternate(batches)
    folder = tempfile.mkdtemp(prefix="fastmem-add-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    path = os.path.join(folder, "store")
    t0, main0, all0 = time.perf_counter(), time.thread_time(), time.process_time()
    store = fastmem.open(path, dim=workload.DIM)
    for batch in batches:
        store.add_many(batch)
    t1, main1, all1 = time.perf_counter(), time.thread_time(), time.process_time()
    store.close()
    t2 = time.perf_counter()
    print(f"{n:,} memories: add_many {n / (t1 - t0):,.0f}/s, close {t2 - t1:.2f} s, "
          f"in all {n / (t2 - t0):,.0f}/s; add_many's CPU per memory: "
          f"{(main1 - main0) / n * 1e6:.2f} µs in this thread, "
          f"{(all1 - all0) / n * 1e6:.2f} µs in all threads")  # fmt: skip
    for ext in (".dat", ".idx"):
        os.remove(path + ext)
    os.rmdir(folder)


def alternate(batches: list[list[dict]]) -> None:
    """``--alternate``: one store, the batches added in turn with the texts counted by the
    calling thread alone and by it and the helper thread together (``_items.BESIDE_MIN``):
    both ways see the same load and the same store sizes. Median ms per batch."""
    from fastmem.storage import records as _items

    folder = tempfile.mkdtemp(prefix="fastmem-add-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    path = os.path.join(folder, "store")
    store = fastmem.open(path, dim=workload.DIM)
    store.tokens.count("warm")  # the encoding's load is not add_many's
    ways = {"alone": (10**9, []), "shared with the helper": (_items.BESIDE_MIN, [])}
    for i, batch in enumerate(batches):
        _items.BESIDE_MIN, spent = list(ways.values())[i % 2]
        t0 = time.perf_counter()
        store.add_many(batch)
        spent.append(time.perf_counter() - t0)
    store.close()
    for way, (_, spent) in ways.items():
        per = statistics.median(spent) / len(batches[0])
        print(f"texts counted {way:24s} median {per * 1e6:.2f} µs/memory ({1 / per:,.0f}/s), "
              f"{len(spent)} batches")  # fmt: skip
    for ext in (".dat", ".idx"):
        os.remove(path + ext)
    os.rmdir(folder)


if __name__ == "__main__":
    main()

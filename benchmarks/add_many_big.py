"""One big add_many against the same memories in 5,000-item batches:
``python benchmarks/add_many_big.py [N] [--rounds R]`` (default 200,000 memories, 3 rounds);
the one call is measured as made now (a block at a time: checked, converted and tokenized
before the writer lock; packed, written and quantized into the index under it) and made
whole, as before.

Each measurement runs in a fresh process (its page faults and system time are its own),
with the items built before the clock starts; the ways take turns going first, so a
loaded machine weighs on both alike. Printed per way: memories/s of the add_many calls
(close not counted), their CPU per memory, minor page faults, system and user seconds of
the process over the calls, and its peak resident size; then the medians.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import workload

import fastmem

# One call as it is made now (a block at a time), one call made whole (as before blocks:
# the block sizes set past the batch), and 5,000-item calls.
WAYS = ("one call", "one, whole", "5,000 a call")


def child(way: str, n: int) -> None:
    if way == "one, whole":
        from fastmem.storage import engine as _engine, records as _items

        _engine.PACK_BLOCK = _items.PREP_BLOCK = 1 << 62
    w = workload.generate(n)
    items = [item for start in range(0, n, workload.BATCH) for item in w.fastmem_batch(start)]
    del w
    folder = tempfile.mkdtemp(prefix="fastmem-big-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    store = fastmem.open(os.path.join(folder, "store"), dim=workload.DIM)
    store.add("warm", embedding=items[0]["embedding"])  # the first write's one-time costs
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if way != WAYS[2]:
        store.add_many(items)
    else:
        for start in range(0, n, workload.BATCH):
            store.add_many(items[start : start + workload.BATCH])
    t1, after = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    store.close()
    shutil.rmtree(folder)
    print(json.dumps({
        "rate": n / (t1 - t0),
        "cpu_us": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n * 1e6,
        "faults": after.ru_minflt - before.ru_minflt,
        "sys": after.ru_stime - before.ru_stime,
        "user": after.ru_utime - before.ru_utime,
        "peak_mib": after.ru_maxrss / 1024,
    }))  # fmt: skip


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--child" in sys.argv:
        return child(args[0], int(args[1]))
    n = int(args[0]) if args else 200_000
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in WAYS[r % 3 :] + WAYS[: r % 3]:
            out = subprocess.run([sys.executable, __file__, "--child", way, str(n)],
                                 check=True, capture_output=True, text=True).stdout  # fmt: skip
            got = json.loads(out.strip().splitlines()[-1])
            results[way].append(got)
            print(f"round {r} {way:>12}: {got['rate']:,.0f}/s, {got['cpu_us']:.1f} µs CPU a memory, "
                  f"{got['faults']:,} faults, sys {got['sys']:.2f} s, user {got['user']:.2f} s, "
                  f"peak {got['peak_mib']:,.0f} MiB", flush=True)  # fmt: skip
    for way in WAYS:
        med = {k: statistics.median(g[k] for g in results[way]) for k in results[way][0]}
        print(f"median {way:>12}: {med['rate']:,.0f}/s, {med['cpu_us']:.1f} µs CPU a memory, "
              f"{med['faults']:,.0f} faults, sys {med['sys']:.2f} s, user {med['user']:.2f} s, "
              f"peak {med['peak_mib']:,.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()

"""``MemoryStore.get`` of random ids in a warm process, beside SQLite's primary-key lookup.

    cd /work/main
    PYTHONPATH=$PWD python benchmarks/get_speed.py --size 100000 --rounds 3

Both systems hold the same generated memories (workload.py): fastmem built with
``add_many`` (batches of 5,000, given vectors), SQLite as in storage_peers.py (WAL,
``synchronous=NORMAL``, the embedding as a BLOB). Each round times one pass of ``--ids``
uniformly random ids (the same rows for both, with repeats) per system, alternating, after
a warm-up pass each; the best and the median round are printed. fastmem returns a
``Memory`` (text, type, timestamp, session, importance, pinned, metadata, summary), SQLite
the ``(text, type, ts)`` tuple of ``SELECT text, type, ts FROM memories WHERE id = ?``:
SQLite builds less per call. Both read from the page cache (the files were just written).

Measured 2026-12-04 19:40 UTC (2 shared cores, load 4.9-6.8 from other work; three runs
each, alternating main 16d3842 and branch getfast2; best round of each run):
main 174,541 / 121,574 / 155,980 get/s (SQLite 156,238 / 91,460 / 125,668),
getfast2 408,227 / 418,374 / 430,351 get/s (SQLite 150,490 / 151,109 / 158,464: 2.71-2.77x).
Issue 21's goal, 250,000 get/s (4 us a call), is met. A call is now the lock, one fstat
system call (the freshness check) and one compiled call from the id to the Memory
(_kernels.read_memory: id parse, row lookup, record check and CRC, msgpack, the named
tuple); timed apart at load ~5: fstat ~0.65 us, lock ~0.3, read_memory ~0.55.
(Before, getfast at load 2.1-2.7: 162-181 k get/s against main 6e8c0df's 140-149 k.)
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import workload

import fastmem


def _sqlite(path: str, data: workload.Workload) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for statement in workload.SQLITE_SCHEMA:
        db.execute(statement)
    for batch in data.sqlite_batches():
        with db:
            db.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?)", batch)
    return db


def _rate(get: Callable[[Any], Any], keys: list[Any]) -> float:
    t0 = time.perf_counter()
    for key in keys:
        get(key)
    return len(keys) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--ids", type=int, default=100_000, help="random ids per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = workload.generate(args.size)
    rows = workload.random_rows(args.size, args.ids).tolist()
    with tempfile.TemporaryDirectory(dir=workload.bench_dir()) as folder:
        ids = workload.build_store(os.path.join(folder, "fastmem"), data.fastmem_batches())
        db = _sqlite(os.path.join(folder, "sqlite.db"), data)
        sql = "SELECT text, type, ts FROM memories WHERE id = ?"
        store = fastmem.open(os.path.join(folder, "fastmem"))
        keys = [ids[r] for r in rows]
        for r in rows[:1000]:  # both read the same memories
            assert store.get(ids[r]).text == data.texts[r] == db.execute(sql, (r,)).fetchone()[0]

        def sqlite_get(key: int) -> Any:
            return db.execute(sql, (key,)).fetchone()

        runs: dict[str, list[float]] = {"fastmem": [], "sqlite": []}
        _rate(store.get, keys), _rate(sqlite_get, rows)  # warm-up
        for _ in range(args.rounds):
            runs["fastmem"].append(_rate(store.get, keys))
            runs["sqlite"].append(_rate(sqlite_get, rows))
        store.close()
        db.close()
    load = os.getloadavg()
    print(f"fastmem {fastmem.__file__} ({fastmem.BACKEND}); python {sys.version.split()[0]}; "
          f"{args.size:,} memories, {args.ids:,} random ids per round; load {load[0]:.1f}")
    for name, rates in runs.items():
        print(f"  {name:8s} best {max(rates):>9,.0f} get/s  median {statistics.median(rates):>9,.0f}"
              f"  rounds {', '.join(f'{r:,.0f}' for r in rates)}")
    print(f"  fastmem / sqlite (best): {max(runs['fastmem']) / max(runs['sqlite']):.2f}x")


if __name__ == "__main__":
    main()

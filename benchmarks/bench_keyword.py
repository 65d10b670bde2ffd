"""Keyword (BM25) search benchmarks on the agent-memory workload (workload.py).

    python -m pytest benchmarks/bench_keyword.py --benchmark-only
    FASTMEM_BENCH_SIZES=10000,100000,1000000 \
        python -m pytest benchmarks/bench_keyword.py --benchmark-only

Per size: ``store.search(query, 10, mode="keyword")`` (hits decoded, as a caller gets
them) for two-word queries of frequent words (long postings lists: the worst case) and of
rare words, cycling through 20 queries of each kind; and the first keyword query of a
fresh process (open + one search), timed inside the child. p50/p95 are in the summary.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import numpy as np

import fastmem
import workload

K = 10
FIRST_QUERY_RUNS = 5

FIRST_QUERY_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import fastmem
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1], readonly=True)
hits = store.search(sys.argv[3], 10, mode="keyword")
t1 = time.perf_counter()
store.close()
assert len(hits) == 10
print(json.dumps({"seconds": t1 - t0, "fastmem": fastmem.__file__}))
"""


def _keyword(benchmark: Any, record: Any, size: int, path: str, kind: str) -> None:
    queries = workload.keyword_queries(kind)
    with fastmem.open(path, readonly=True) as store:
        for q in queries:  # warm up: page cache, and the checks every query makes
            store.search(q, K, mode="keyword")
        cycle = itertools.cycle(queries)
        hits = benchmark.pedantic(
            lambda: store.search(next(cycle), K, mode="keyword"),
            rounds=5 * len(queries), iterations=1,
        )  # fmt: skip
    # Two words ranked 2,000th or lower may be in fewer than ten memories of a small store
    # (at 5,000 memories, the smoke run's size).
    assert len(hits) == K or (kind == "rare" and 0 < len(hits) < K), len(hits)
    data = benchmark.stats.stats.data
    record(size, kind=kind, p50_ms=1e3 * statistics.median(data),
           p95_ms=1e3 * float(np.percentile(data, 95)))  # fmt: skip


def bench_keyword_frequent(benchmark: Any, record: Any, size: int,
                           built_store: tuple[str, list[str]]) -> None:
    """Top-10 for two words among the 10 most frequent."""
    _keyword(benchmark, record, size, built_store[0], "frequent")


def bench_keyword_rare(benchmark: Any, record: Any, size: int,
                       built_store: tuple[str, list[str]]) -> None:
    """Top-10 for two words ranked 2,000th or lower."""
    _keyword(benchmark, record, size, built_store[0], "rare")


def bench_keyword_first_query(benchmark: Any, record: Any, size: int,
                              built_store: tuple[str, list[str]]) -> None:
    """Open + the first keyword query (frequent words) in a fresh process."""
    query = workload.keyword_queries("frequent")[0]
    first_query(benchmark, record, size, FIRST_QUERY_CHILD, built_store[0], query)


def first_query(benchmark: Any, record: Any, size: int, child: str, path: str, arg: str) -> None:
    """Time ``child`` (open + one query, timed inside it) in fresh processes; the median."""
    source = workload.fastmem_source()
    runs = []

    def once() -> None:
        runs.append(workload.run_child(child, path, source, arg)["seconds"])

    benchmark.pedantic(once, rounds=FIRST_QUERY_RUNS, iterations=1)
    record(size, open_and_first_query_ms=1e3 * statistics.median(runs))

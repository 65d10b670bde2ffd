"""Search kernel benchmarks on the agent-memory workload (workload.py).

    python -m pytest benchmarks/bench_search.py --benchmark-only
    FASTMEM_BENCH_SIZES=10000,100000,1000000 \\
        python -m pytest benchmarks/bench_search.py --benchmark-only

Per size:

* vector top-10: ``store.search(q, 10, mode="vector")`` (int8 scan on both cores, float16
  rescoring, hits decoded), cycling through 50 queries (stored vectors plus noise); its
  recall@10 against the exact float32 top-10 is recorded;
* the same with a time filter that keeps 1% of the memories (3.65 days of the year);
* the first vector query of a fresh process (open + one search, the level-2 preload off),
  timed inside the child;
* hybrid top-10: text queries of two frequent words whose vectors are known (the ranking's
  cost, not the model's), to set beside vector + keyword;
* ``context(text, 1300)`` for the same texts and vectors: the ≤1,300-token context of
  benchmarks/compare.py, to catch its regressions between the side-by-side runs;
* the importance recompute over every row (``store.importance_scores()``);
* keyword top-10: the keyword benchmarks of bench_keyword.py (frequent and rare words,
  first query), collected here too so that this file covers every search kernel.

Side-by-side figures against numpy, faiss, hnswlib, usearch, SQLite FTS5 and rank-bm25 come
from search_peers.py.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import numpy as np
import pytest

import fastmem
import workload
from bench_keyword import (  # noqa: F401 - collected here as well (see the docstring)
    bench_keyword_first_query,
    bench_keyword_frequent,
    bench_keyword_rare,
    first_query,
)

K = 10
QUERIES = 50
# No level-2 preload thread: the timed calls have the machine to themselves.
QUIET = fastmem.ContextPolicy(preload=0, recent=0)

FIRST_QUERY_CHILD = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
import fastmem
q = np.frombuffer(bytes.fromhex(sys.argv[3]), dtype=np.float32)
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1], readonly=True, policy=fastmem.ContextPolicy(preload=0, recent=0))
hits = store.search(q, 10, mode="vector")
t1 = time.perf_counter()
store.close()
assert len(hits) == 10
print(json.dumps({"seconds": t1 - t0, "fastmem": fastmem.__file__}))
"""


@pytest.fixture(scope="session")
def queries(data: workload.Workload) -> tuple[np.ndarray, list[np.ndarray]]:
    """The query vectors and their exact float32 top-10 rows (ties: the lower row)."""
    q, _ = data.queries(QUERIES)
    truth = []
    for v in q:
        s = data.vectors @ v
        truth.append(np.lexsort((np.arange(len(s)), -s))[:K])
    return q, truth


def _vector(benchmark: Any, path: str, ids: list[str], q: np.ndarray, **filters: Any) -> list[Any]:
    with fastmem.open(path, readonly=True, policy=QUIET) as store:
        for v in q[:5]:  # warm up: page cache, the contiguous scale copy
            store.search(v, K, mode="vector", **filters)
        cycle = itertools.cycle(range(len(q)))
        results: dict[int, Any] = {}

        def one() -> None:
            i = next(cycle)
            results[i] = store.search(q[i], K, mode="vector", **filters)

        benchmark.pedantic(one, rounds=3 * len(q), iterations=1)
    row_of = {mid: i for i, mid in enumerate(ids)}
    return [[row_of[h.id] for h in results[i]] for i in range(len(q))]


def _percentiles(benchmark: Any) -> dict[str, float]:
    data = benchmark.stats.stats.data
    return {"p50_ms": 1e3 * statistics.median(data), "p95_ms": 1e3 * float(np.percentile(data, 95))}


def bench_vector_topk(benchmark: Any, record: Any, size: int,
                      built_store: tuple[str, list[str]], queries: Any) -> None:  # fmt: skip
    """Top-10 by cosine over every memory."""
    q, truth = queries
    found = _vector(benchmark, *built_store, q)
    recall = float(np.mean([len(set(f) & set(t.tolist())) / K for f, t in zip(found, truth)]))
    record(size, **_percentiles(benchmark), recall_at_10=recall)


def bench_vector_filtered_1pct(benchmark: Any, record: Any, size: int,
                               built_store: tuple[str, list[str]], queries: Any) -> None:  # fmt: skip
    """Top-10 among the memories of 1% of the year (a time filter keeping ~1% of rows)."""
    lo = workload.T0 + 0.5 * workload.YEAR
    found = _vector(benchmark, *built_store, queries[0], since=lo, until=lo + 0.01 * workload.YEAR)
    assert all(len(f) == K for f in found)
    record(size, **_percentiles(benchmark))


def bench_vector_first_query(benchmark: Any, record: Any, size: int,
                             built_store: tuple[str, list[str]], queries: Any) -> None:  # fmt: skip
    """Open + the first vector query in a fresh process (warm page cache)."""
    q = queries[0][0].astype(np.float32).tobytes().hex()
    first_query(benchmark, record, size, FIRST_QUERY_CHILD, built_store[0], q)


class _QueryVectors:
    """An embedder that knows the benchmark's query texts: the hybrid ranking's own cost,
    without the model's (one all-MiniLM-L6-v2 query embedding: ~5 ms, see context_speed.py)."""

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        self._vector_of = dict(zip(texts, vectors))

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._vector_of[t] for t in texts]).astype(np.float32)


def bench_hybrid(benchmark: Any, record: Any, size: int,
                 built_store: tuple[str, list[str]], queries: Any) -> None:  # fmt: skip
    """Hybrid top-10 (vector and BM25 rankings fused, with importance and recency) for two
    frequent words with a query vector: to set beside vector top-10 + keyword top-10."""
    texts = workload.keyword_queries("frequent")
    embedder = _QueryVectors(texts, queries[0][: len(texts)])
    with fastmem.open(built_store[0], readonly=True, policy=QUIET, embedder=embedder) as store:
        for text in texts:  # warm up
            store.search(text, K, mode="hybrid")
        cycle = itertools.cycle(texts)
        hits = benchmark.pedantic(lambda: store.search(next(cycle), K, mode="hybrid"),
                                  rounds=3 * len(texts), iterations=1)  # fmt: skip
    assert len(hits) == K
    record(size, **_percentiles(benchmark))


def bench_context(benchmark: Any, record: Any, size: int,
                  built_store: tuple[str, list[str]], queries: Any) -> None:  # fmt: skip
    """A context of at most 1,300 tokens for two frequent words with a query vector: the
    hybrid ranking, the session neighbours and the packing (compare.py's context row)."""
    texts = workload.keyword_queries("frequent")
    embedder = _QueryVectors(texts, queries[0][: len(texts)])
    with fastmem.open(built_store[0], readonly=True, policy=QUIET, embedder=embedder) as store:
        for text in texts:  # warm up
            store.context(text, 1300)
        cycle = itertools.cycle(texts)
        context = benchmark.pedantic(lambda: store.context(next(cycle), 1300),
                                     rounds=3 * len(texts), iterations=1)  # fmt: skip
    assert 0 < context.tokens <= 1300
    record(size, **_percentiles(benchmark), tokens=context.tokens)


def bench_importance_recompute(benchmark: Any, record: Any, size: int,
                               built_store: tuple[str, list[str]]) -> None:  # fmt: skip
    """Every row's importance (base, decayed access count, recency, pins) in one pass."""
    with fastmem.open(built_store[0], readonly=True, policy=QUIET) as store:
        store.importance_scores()  # warm up
        scores = benchmark.pedantic(store.importance_scores, rounds=30, iterations=1)
    assert len(scores) == size
    record(size, **_percentiles(benchmark))

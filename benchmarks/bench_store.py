"""fastmem store benchmarks on the agent-memory workload (workload.py).

    cd /work/main
    python -m pytest benchmarks/bench_store.py --benchmark-only
    FASTMEM_BENCH_SIZES=10000,100000,1000000 \
        python -m pytest benchmarks/bench_store.py --benchmark-only

Per size: ``add_many`` throughput (batches of 5,000, durability "batch"; plus one
"always" run at 10 k), restart in a fresh process, ``get`` of random ids and ``search``
top-10. pytest-benchmark's own table times what runs in this process; figures that are
not its per-call time (memories/s, the restart timed inside each child, recall) are in
``extra_info`` and in the summary printed at the end.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import numpy as np

import fastmem
import workload

ALWAYS_SIZE = 10_000  # "always" fsyncs per add_many: one small size says what it costs
RESTART_RUNS = 7
GET_IDS = 10_000  # random ids cycled through by the get benchmark
SEARCH_QUERIES = 50
SEARCH_WARMUPS = 5
SEARCH_PASSES = 3
K = 10


def _median(benchmark: Any) -> float:
    return float(benchmark.stats.stats.median)


def _percentile(benchmark: Any, q: float) -> float:
    return float(np.percentile(benchmark.stats.stats.data, q))


def _add_many(benchmark: Any, record: Any, n: int, batches: list[list[dict[str, Any]]],
              folder: Path, durability: str, rounds: int) -> None:
    """Time inserting ``batches`` into a new store and closing it (the close writes the
    index file: a store is not complete before it, as the peers' sidecars were counted)."""
    path = folder / f"add_many-{durability}"

    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
        for ext in (".dat", ".idx"):  # each round starts from nothing
            Path(f"{path}{ext}").unlink(missing_ok=True)
        return (path, batches, durability), {}

    ids = benchmark.pedantic(workload.build_store, setup=fresh, rounds=rounds, iterations=1)
    assert len(ids) == n
    record(
        n,
        durability=durability,
        memories_per_s=n / _median(benchmark),
        bytes_per_memory=workload.store_bytes(str(path)) / n,
    )


def bench_add_many(benchmark: Any, record: Any, size: int, data: workload.Workload,
                   scratch_dir: Path) -> None:
    """add_many in batches of 5,000 with precomputed embeddings, durability "batch"."""
    rounds = 5 if size <= 10_000 else 3 if size <= 100_000 else 1  # 1 M: ~1 GB per round
    _add_many(benchmark, record, size, data.fastmem_batches(), scratch_dir, "batch", rounds)


def bench_add_many_always(benchmark: Any, record: Any, scratch_dir: Path) -> None:
    """The same at 10 k with durability "always" (an fdatasync before add_many returns)."""
    batches = workload.generate(ALWAYS_SIZE).fastmem_batches()
    _add_many(benchmark, record, ALWAYS_SIZE, batches, scratch_dir, "always", rounds=5)


def bench_restart(benchmark: Any, record: Any, size: int,
                  built_store: tuple[str, list[str]]) -> None:
    """open + recent(20) with text, in a fresh process each time, timed inside the child.

    pytest-benchmark's table shows each child's whole wall time (interpreter start-up and
    imports included); ``restart_ms`` is the median of what the children timed themselves,
    after their imports, which is what "restart" means for the peers.
    """
    path, _ = built_store
    inner: list[float] = []

    def child() -> None:
        inner.append(workload.restart_seconds("fastmem", path))

    # One untimed warm-up child: the page cache is warm, as it was for the peers.
    benchmark.pedantic(child, rounds=RESTART_RUNS, iterations=1, warmup_rounds=1)
    timed = inner[-RESTART_RUNS:]
    record(
        size,
        restart_ms=1e3 * statistics.median(timed),
        restart_ms_min=1e3 * min(timed),
        restart_ms_max=1e3 * max(timed),
        restart_ms_runs=[round(1e3 * t, 3) for t in timed],
        child_process_ms=1e3 * _median(benchmark),
    )


def bench_get(benchmark: Any, record: Any, size: int, data: workload.Workload,
              built_store: tuple[str, list[str]]) -> None:
    """get() of uniformly random ids (text, type, timestamp ... as a Memory)."""
    path, ids = built_store
    rows = workload.random_rows(size, GET_IDS).tolist()
    picks = [ids[r] for r in rows]
    with fastmem.open(path) as store:
        for r, mid in zip(rows[:1000], picks):  # warm-up, and a check of what is read
            assert store.get(mid).text == data.texts[r]
        cycle = itertools.cycle(picks)
        benchmark(lambda: store.get(next(cycle)))
    record(size, gets_per_s=1 / _median(benchmark), get_us=1e6 * _median(benchmark))


def bench_search(benchmark: Any, record: Any, size: int, data: workload.Workload,
                 built_store: tuple[str, list[str]]) -> None:
    """search() top-10 (int8 brute-force scan, then float16 rescoring of the candidates).

    Queries are 50 stored vectors plus noise (cosine ~0.98 to the source), cycled; recall@10
    is against exact float32 brute force, hit@1 is the source ranked first.
    """
    path, ids = built_store
    queries, sources = data.queries(SEARCH_QUERIES)
    with fastmem.open(path) as store:
        for q in queries[:SEARCH_WARMUPS]:
            store.search(q, K)
        cycle = itertools.cycle(queries)
        # Fixed rounds, not pytest-benchmark's one-second budget (only ~7 rounds at 1 M):
        # every query is timed SEARCH_PASSES times, so median and p95 are over all of them.
        benchmark.pedantic(lambda: store.search(next(cycle), K),
                           rounds=SEARCH_PASSES * SEARCH_QUERIES, iterations=1)  # fmt: skip
        results = [[hit.id for hit in store.search(q, K)] for q in queries]
    row_of = {mid: i for i, mid in enumerate(ids)}
    scores = data.vectors @ queries.T  # (N, queries) exact float32 cosines
    exact = np.argpartition(-scores, K, axis=0)[:K].T
    recall = np.mean([len({row_of[m] for m in got} & set(ex.tolist())) / K
                      for got, ex in zip(results, exact)])  # fmt: skip
    hit1 = np.mean([row_of[got[0]] == src for got, src in zip(results, sources.tolist())])
    record(
        size,
        search_ms=1e3 * _median(benchmark),
        search_ms_p95=1e3 * _percentile(benchmark, 95),
        recall_at_10=float(recall),
        hit_at_1=float(hit1),
    )

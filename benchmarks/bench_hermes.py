"""The Hermes Agent provider's hot paths on a big store (fastmem.integrations.hermes).

    python -m pytest benchmarks/bench_hermes.py --benchmark-only        # 10k and 100k
    FASTMEM_BENCH_SIZES=100000 python -m pytest benchmarks/bench_hermes.py --benchmark-only

The cached workload store of each size (``workload.py``) is copied into a temporary
``$HERMES_HOME/fastmem/default/`` and a real :class:`FastmemProvider` is initialized on
it, as Hermes does. What each benchmark times:

* ``prefetch_cached`` — ``prefetch(q)`` after ``queue_prefetch(q)`` computed ``q``'s
  context in the background: what a turn waits for when the cache answers
  (target ≤ 5 ms at 100k). The session's "already shown" set is cleared between rounds,
  so every round returns a full context rather than an empty one.
* ``prefetch_uncached`` — ``prefetch(q)`` with nothing queued: the context is computed on
  the caller's thread (Hermes 0.19.0 queues the *previous* turn's message, so a turn's
  first prefetch is usually this one). With the default embedder the query is embedded.
* ``sync_turn`` — one ``sync_turn(user, assistant)`` call: it only enqueues; the writer
  thread appends and fsyncs meanwhile, competing for the GIL as it does in Hermes
  (target ≤ 1 ms at 100k). The summary also gives how many turns per second the writer
  stored meanwhile (embedding them is most of that with the default embedder).

The workload's texts are pseudo-English and its vectors random: recall here means
nothing, only cost. Figures depend on the machine; the summary prints p50 and p95.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import workload
from fastmem.integrations.hermes import FastmemProvider

QUERIES = 60
TURNS = 1000


@pytest.fixture
def provider(built_store: tuple[str, list[str]], scratch_dir: Path):
    """A provider initialized on a copy of the cached store, as Hermes initializes it."""
    path = built_store[0]
    home = scratch_dir / "hermes"
    target = home / "fastmem" / "default"
    target.mkdir(parents=True)
    for ext in (".dat", ".idx"):
        shutil.copyfile(path + ext, target / f"memory{ext}")
    p = FastmemProvider()
    p.initialize("bench-session", hermes_home=str(home), platform="cli", agent_context="primary")
    p.system_prompt_block()  # opens the store, as the first system prompt does
    # The model loaded first: a context made before it is keyword-only (empty for a query
    # whose words are not in a small store), which made the rounds differ with the load.
    wait = getattr(getattr(p._shared._reader, "_embedder", None), "wait", None)
    if wait is not None:
        wait()
    yield p
    p.shutdown()


def _ms(benchmark: Any) -> dict[str, float]:
    data = np.array(benchmark.stats.stats.data) * 1000
    return {"p50_ms": float(np.percentile(data, 50)), "p95_ms": float(np.percentile(data, 95))}


def bench_prefetch_cached(benchmark: Any, record: Any, size: int, provider: FastmemProvider) -> None:
    queries = iter(workload.keyword_queries("rare", QUERIES) * 100)
    chars = []

    def queue_one() -> tuple[tuple[str], dict[str, Any]]:
        q = next(queries)
        provider.on_session_switch("bench-session")  # nothing shown yet: a full context
        provider.queue_prefetch(q)
        _, future = provider._cache[q]
        future.result(30)  # computed in the background, before the timed call
        return (q,), {}

    def run(q: str) -> None:
        chars.append(len(provider.prefetch(q)))

    benchmark.pedantic(run, setup=queue_one, rounds=200, iterations=1, warmup_rounds=5)
    assert min(chars) > 0  # every round returned a context
    record(size, **_ms(benchmark), mean_chars=float(np.mean(chars)))


def bench_prefetch_uncached(benchmark: Any, record: Any, size: int, provider: FastmemProvider) -> None:
    queries = iter(workload.keyword_queries("rare", QUERIES, seed=29) * 100)

    def fresh() -> tuple[tuple[str], dict[str, Any]]:
        provider.on_session_switch("bench-session")
        return (next(queries),), {}

    benchmark.pedantic(provider.prefetch, setup=fresh, rounds=60, iterations=1, warmup_rounds=3)
    record(size, **_ms(benchmark))


def bench_sync_turn(benchmark: Any, record: Any, size: int, provider: FastmemProvider) -> None:
    texts = workload.generate(size).texts
    turn = iter(range(10**9))

    def one() -> None:
        i = next(turn)
        provider.sync_turn(texts[i % len(texts)], texts[(i * 7 + 1) % len(texts)], session_id="bench")

    started = time.perf_counter()
    benchmark.pedantic(one, rounds=TURNS, iterations=1, warmup_rounds=20)
    assert provider.flush(600)  # everything queued is on disk
    # Not a target: how fast the writer stores turns (with the default embedder, embedding
    # each turn is most of it); a person's turns come seconds apart.
    record(size, **_ms(benchmark), turns_per_s_written=(TURNS + 20) / (time.perf_counter() - started))

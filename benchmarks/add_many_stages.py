"""Where ``add_many`` spends its time, stage by stage, in µs per memory:
``PYTHONPATH=. python benchmarks/add_many_stages.py [N] [--no-count] [--cpu]``
(default 100,000).

Each stage that ``MemoryStore.add_many`` calls is wrapped with a timer (the checks and
payloads, the vectors, summaries with token counting, and the commit). A batch of
``_items.BESIDE_MIN`` texts or more is counted by a helper thread and the caller together
inside ``prepare_commit`` (its time there is the wait for the counts); a smaller batch's
``count_many`` is timed apart. ``--no-count`` replaces the counter with a constant one
(every text 1 token), to see the rest of the path without counting: the bytes written then
differ, the timings of the other stages do not.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import workload

import fastmem
from fastmem.storage import (
    engine as _engine, index as _index, records as _items, keyword_index as _keyword,
    index_tail as _tail,
)
from fastmem import _kernels, tokens
from fastmem import store as store_module

spent: dict[str, float] = defaultdict(float)
# --cpu: this thread's CPU time (user + system) instead of the wall clock, for a loaded
# machine, where the wall clock also counts the time spent waiting for a core.
clock = time.thread_time if "--cpu" in sys.argv else time.perf_counter


def timed(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += clock() - t0

    return wrapper


# (stage, what wraps it), in the order add_many runs them; indented: part of the one above.
STAGES = (
    ("prepare", "prepare (per item; before the batch kernel)"),
    ("prepare_batch", "prepare_batch (checks, payloads, columns)"),
    ("prepare_commit", "prepare_commit (before the writer lock)"),
    ("  vectors_for", "  vectors_for (float16 and int8 rows)"),
    ("    gather_vectors", "    gather_vectors"),
    ("  tokenize", "  keyword terms"),
    ("  summarize_and_count", "  summarize_and_count"),
    ("  count_many", "  count_many (a small batch's; a large one's is shared by two threads)"),
    ("commit_memories", "commit_memories"),
    ("  pack_payloads", "  pack_payloads"),
    ("  pack_memories", "  pack_memories (payloads with ids and counts)"),
    ("  frame_records", "  frame_records"),
    ("  write", "  write (_append)"),
    ("  index.append", "  index.append"),
    ("    keyword.add", "    keyword.add"),
    ("    tail append", "    tail rows append"),
    ("  checkpoint", "  checkpoint (in add_many; close() is apart)"),
)


class _Ones:
    """--no-count's stand-in for a batch's shared count (``TokenCounter.count_shared``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def work(self, steal: bool = False) -> int:
        return 0

    def counts(self) -> list[int]:
        return [1] * self.n


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 100_000
    if "--no-count" in sys.argv:
        tokens.TokenCounter.count_many = lambda self, texts: [1] * len(texts)  # type: ignore[method-assign]
        tokens.TokenCounter.count_shared = lambda self, texts: _Ones(len(texts))  # type: ignore[method-assign]
    store_module.prepare_commit = timed("prepare_commit", store_module.prepare_commit)
    for name in ("vectors_for", "summarize_and_count", "tokenize"):
        setattr(_items, name, timed(f"  {name}", getattr(_items, name)))
    for name in ("prepare_batch", "gather_vectors", "pack_payloads", "pack_memories", "frame_records"):
        if hasattr(_kernels, name):
            label = {"prepare_batch": name, "gather_vectors": f"    {name}"}.get(name, f"  {name}")
            setattr(_kernels, name, timed(label, getattr(_kernels, name)))
    tokens.TokenCounter.count_many = timed("  count_many", tokens.TokenCounter.count_many)  # type: ignore[method-assign]
    _engine.Engine.commit_memories = timed("commit_memories", _engine.Engine.commit_memories)  # type: ignore[method-assign]
    _engine.Engine._append = timed("  write", _engine.Engine._append)  # type: ignore[method-assign]
    _engine.Engine.checkpoint = timed("  checkpoint", _engine.Engine.checkpoint)  # type: ignore[method-assign]
    _index.MemoryIndex.append = timed("  index.append", _index.MemoryIndex.append)  # type: ignore[method-assign]
    _keyword.KeywordIndex.add = timed("    keyword.add", _keyword.KeywordIndex.add)  # type: ignore[method-assign]
    _tail.Tail.append = timed("    tail append", _tail.Tail.append)  # type: ignore[method-assign]
    batches = workload.generate(n).fastmem_batches()
    folder = tempfile.mkdtemp(prefix="fastmem-add-", dir=os.environ.get("FASTMEM_BENCH_DIR"))
    path = os.path.join(folder, "store")
    store = fastmem.open(path, dim=workload.DIM)
    store.tokens.count("warm")  # the encoding's load is not add_many's
    spent.clear()
    t0, c0 = time.perf_counter(), clock()
    for batch in batches:
        store.add_many(batch)
    t1, c1 = time.perf_counter(), clock()
    during = dict(spent)  # the checkpoint of close() is not add_many's
    store.close()
    t2 = time.perf_counter()
    print(f"{n:,} memories{' (no counting)' if '--no-count' in sys.argv else ''}: "
          f"add_many {n / (t1 - t0):,.0f}/s, close {t2 - t1:.2f} s, backend {fastmem.BACKEND}")  # fmt: skip
    accounted = 0.0
    for key, label in STAGES:
        if key in during:
            print(f"  {label:48s} {during[key] / n * 1e6:6.2f} µs/memory")
            accounted += 0 if key.startswith(" ") else during[key]
    print(f"  {'rest of add_many':48s} {(c1 - c0 - accounted) / n * 1e6:6.2f} µs/memory")
    print(f"  {'add_many in all':48s} {(c1 - c0) / n * 1e6:6.2f} µs/memory"
          f"{' (CPU time of this thread)' if '--cpu' in sys.argv else ''}")
    for ext in (".dat", ".idx"):
        os.remove(path + ext)
    os.rmdir(folder)


if __name__ == "__main__":
    main()

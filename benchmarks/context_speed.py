"""How fast the memory engine answers: open, the first context after a restart, context().

    python benchmarks/context_speed.py [--sizes 100k] [--queries 200] [--dated]

On the shared workload's stores (``workload.py``: pseudo-English texts, random 384-d
vectors, so the recall of these contexts means nothing, only their cost), with the default
embedder (all-MiniLM-L6-v2, fastmem's numpy runtime):

* ``open`` — ``fastmem.open(path)`` in a fresh process, after the imports (median of 5);
* ``first context`` — a fresh process: import fastmem, open, ``context(question)``;
  the wall time from interpreter start, and whether that context was degraded (built
  before the model had loaded), then the time until a full-quality context;
* ``context()`` — p50/p95 over distinct questions in a warm process, the query embedding
  included (each question is new: the query cache never answers). ``--dated``: each
  question also names a day of the workload's year ("... on 14 March, 2024?"), which
  ``context()`` searches as a period (``retrieval.periods``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402

OPEN_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import fastmem
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1], readonly=True)
t1 = time.perf_counter()
store.close()
print(json.dumps({"seconds": t1 - t0}))
"""

FIRST_CONTEXT_CHILD = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[2])
import fastmem
store = fastmem.open(sys.argv[1], readonly=True)
ctx = store.context(sys.argv[3])
t1 = time.perf_counter()
while True:
    full = store.context(sys.argv[3])
    if not full.degraded:
        break
    time.sleep(0.01)
t2 = time.perf_counter()
store.close()
print(json.dumps({"first": t1 - t0, "degraded": ctx.degraded, "tokens": ctx.tokens,
                  "items": len(ctx.items), "full": t2 - t0}))
"""


def questions(count: int, seed: int, dated: bool = False) -> list[str]:
    words = workload.vocabulary()[0]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        about = " ".join(words[i] for i in rng.integers(0, 3000, 3))
        day = time.gmtime(workload.T0 + rng.random() * workload.YEAR) if dated else None
        when = time.strftime(" on %d %B, %Y", day).replace(" 0", " ") if day else ""
        out.append(f"What did we say about {about}{when}?")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100k")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dated", action="store_true", help="questions that name a day")
    args = parser.parse_args()
    import fastmem

    source = workload.fastmem_source()
    for n in workload.parse_sizes(args.sizes):
        qs = questions(args.queries + 10, seed=n, dated=args.dated)  # new to the query cache
        path, _ = workload.cached_store(n, log=print)
        opens = [workload.run_child(OPEN_CHILD, path, source)["seconds"] for _ in range(5)]
        first = workload.run_child(FIRST_CONTEXT_CHILD, path, source, qs[0])
        with fastmem.open(path, readonly=True) as store:
            store._embedder.wait()
            for q in qs[:10]:  # warm: page cache, first calls
                store.context(q)
            times = []
            for q in qs[10:]:
                started = time.perf_counter()
                ctx = store.context(q)
                times.append(time.perf_counter() - started)
                assert ctx.tokens <= 1300
        result = {
            "n": n,
            "open_ms": 1e3 * statistics.median(opens),
            "first_context_s": first["first"],
            "first_degraded": first["degraded"],
            "first_items": first["items"],
            "full_quality_s": first["full"],
            "context_p50_ms": 1e3 * statistics.median(times),
            "context_p95_ms": 1e3 * float(np.percentile(times, 95)),
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main()

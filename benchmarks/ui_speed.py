"""How fast the inspector (``fastmem ui``) answers on a large store: server time per view.

    python benchmarks/ui_speed.py [--sizes 10k,1M] [--requests 60]

On the shared workload's stores (``workload.py``: pseudo-English texts, random 384-d
vectors, timestamps over a year; built once and cached), the inspector's application is
called in-process through Starlette's TestClient (routing, the guard's checks, the store
calls in the thread pool, Jinja2 rendering; no socket, no uvicorn HTTP parsing, no
browser), with the default embedder (all-MiniLM-L6-v2 int8) for queries:

* ``overview`` — ``/``: the count and the newest memories; ``overview figures`` — the
  part it loads after it (``/overview/figures``): ``stats()``, which reads the index alone;
* ``timeline, first page`` — ``/timeline``: 50 memories, newest first;
* ``timeline, deep page`` — ``/timeline?before=ID`` for a random memory: the page after
  it (a cursor found in O(log n), whatever its depth);
* ``search`` — ``/search?q=...`` hybrid, 20 hits, a new question each time;
* ``context`` — ``/context?q=...&budget=1300``, a new question each time, with the time
  ``context()`` itself reported (``Context.seconds``, sent as ``Server-Timing``): the
  view's overhead is the request's time minus that, split into its work in the worker
  thread (taking the context apart, rendering) and the rest (guard, routing, and the
  hand-offs between the event loop and the worker thread, which wait for a free CPU);
* ``... alone`` — the store's own calls for the same requests (``stats()`` and
  ``recent(8)``; ``search()``; ``context()``) through a handle of their own, for comparison:
  a view's own cost is its time minus these.

The inspector is measured settled, as ``fastmem ui`` runs it (``freeze_heap``): its
level-2 preload done and the heap frozen. Each figure is p50 and p95 over ``--requests``
requests after a few warm-up ones.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload

WARMUP = 3


def questions(count: int, seed: int) -> list[str]:
    words = workload.vocabulary()[0]
    rng = np.random.default_rng(seed)
    return [
        f"What did we say about {' '.join(words[i] for i in rng.integers(0, 3000, 3))}?"
        for _ in range(count)
    ]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(path: str, ids: list[str], requests: int) -> dict[str, dict[str, float]]:
    """Every view's figures on the store at ``path`` (``ids``: its memories' ids, the
    deep pages' cursors)."""
    from starlette.testclient import TestClient

    import fastmem
    from fastmem.embed import default_embedder
    from fastmem.ui.app import create_app
    from fastmem.ui.security import Secrets

    embedder = default_embedder()
    embedder.wait()
    app = create_app(
        path,
        readonly=True,
        secrets=Secrets("t", "c"),
        hosts={"testserver"},
        embedder=embedder,
        freeze_heap=True,  # as `fastmem ui` runs it
    )
    rng = np.random.default_rng(7)
    asked = questions(requests + WARMUP, seed=len(ids))
    results: dict[str, dict[str, float]] = {}
    with TestClient(app) as client:
        client.cookies.set("fastmem_ui_8765", "t")
        # Steady state, as the store's calls are measured below: the level-2 preload done
        # and the heap frozen (a preload still running takes the GIL from every request).
        if not app.state.inspector.settled.wait(300):
            raise SystemExit("the inspector did not settle (preload) within 300 s")

        def timed(name: str, urls: list[str]) -> tuple[list[float], list[float]]:
            """Each request's server time (the guard's ``total`` in Server-Timing: from the
            request to its response, the body's rendering included), and context()'s own
            time in it (0 for other views). The client's time (the test client's thread
            hops on top) goes to the JSON only."""
            times, seen, timings = [], [], []
            for i, url in enumerate(urls):
                started = time.perf_counter()
                r = client.get(url)
                took = 1000 * (time.perf_counter() - started)
                if r.status_code != 200:
                    raise SystemExit(f"{url}: {r.status_code} {r.text[:200]}")
                if i >= WARMUP:
                    timing = r.headers.get("server-timing", "")
                    times.append(float(re.search(r"total;dur=([\d.]+)", timing).group(1)))
                    seen.append(took)
                    timings.append(timing)
            results[name] = {
                "p50_ms": pct(times, 0.5),
                "p95_ms": pct(times, 0.95),
                "n": len(times),
                "client_p50_ms": pct(seen, 0.5),
                "client_p95_ms": pct(seen, 0.95),
            }
            parts = [dict(re.findall(r"(\w+);dur=([\d.]+)", t)) for t in timings]
            return times, [{k: float(v) for k, v in p.items()} for p in parts]

        timed("overview", ["/"] * (requests + WARMUP))
        timed("overview figures", ["/overview/figures"] * (requests + WARMUP))
        timed("timeline, first page", ["/timeline"] * (requests + WARMUP))
        cursors = [ids[i] for i in rng.integers(0, len(ids), requests + WARMUP)]
        timed("timeline, deep page", [f"/timeline?before={c}" for c in cursors])
        timed("search", [f"/search?q={q.replace(' ', '+').replace('?', '')}" for q in asked])
        total, parts = timed(
            "context",
            [f"/context?q={q.replace(' ', '+').replace('?', '')}&budget=1300" for q in asked],
        )
        own = [p["context"] for p in parts]
        overhead = [t - c for t, c in zip(total, own)]
        # The view's own time in two: its work in the worker thread after context() returned
        # (taking the context apart, rendering), and the rest (the guard, routing, the hand-
        # offs between the event loop and the worker thread, which wait for a CPU).
        work = [p["thread"] - p["call"] for p in parts]
        handoff = [t - p["thread"] for t, p in zip(total, parts)]
        results["context"].update(
            context_p50_ms=statistics.median(own),
            context_p95_ms=pct(own, 0.95),
            overhead_p50_ms=statistics.median(overhead),
            overhead_p95_ms=pct(overhead, 0.95),
            work_p50_ms=statistics.median(work),
            work_p95_ms=pct(work, 0.95),
            handoff_p50_ms=statistics.median(handoff),
            handoff_p95_ms=pct(handoff, 0.95),
        )
    # The store's own calls for the same requests, in a handle of their own: what each view
    # adds is its time minus these.
    with fastmem.open(path, readonly=True, embedder=embedder) as store:
        store.wait_preload(60)  # as the inspector's handle had: level 2 done, the cache warm
        calls = {
            "stats() + recent(8) alone": lambda q: (store.stats(), store.recent(8)),
            "search() alone": lambda q: store.search(q, 20),
            "context() alone": lambda q: store.context(q, 1300),
        }
        for name, call in calls.items():
            alone = []
            for i, q in enumerate(asked):
                started = time.perf_counter()
                call(q.replace("?", ""))
                if i >= WARMUP:
                    alone.append(1000 * (time.perf_counter() - started))
            results[name] = {"p50_ms": pct(alone, 0.5), "p95_ms": pct(alone, 0.95), "n": len(alone)}
    return results


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10k,1M")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--store",
        help="measure this store instead (its ids must be dense: "
        "m0 to m<count-1>, as a store never compacted has them)",
    )
    args = parser.parse_args()
    os.environ.pop("FASTMEM_EMBEDDER", None)
    out = {}
    print(
        f"# fastmem ui server time (ms), p50 / p95 over {args.requests} requests; "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    if args.store:
        import fastmem

        with fastmem.open(args.store, readonly=True, embedder=None) as store:
            stores = [(args.store, [f"m{i}" for i in range(len(store))])]
    else:
        stores = [workload.cached_store(n, log=_log) for n in workload.parse_sizes(args.sizes)]
    for path, ids in stores:
        n = len(ids)
        figures = measure(path, ids, args.requests)
        out[n] = figures
        print(f"\n{n:,} memories")
        for name, f in figures.items():
            extra = (
                (
                    f"  (context() inside {f['context_p50_ms']:.1f} / {f['context_p95_ms']:.1f}; "
                    f"the view's own {f['overhead_p50_ms']:.1f} / {f['overhead_p95_ms']:.1f}: "
                    f"its work {f['work_p50_ms']:.1f} / {f['work_p95_ms']:.1f}, "
                    f"hand-offs {f['handoff_p50_ms']:.1f} / {f['handoff_p95_ms']:.1f})"
                )
                if "context_p50_ms" in f
                else ""
            )
            print(f"  {name:<22} {f['p50_ms']:7.1f} / {f['p95_ms']:7.1f}{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

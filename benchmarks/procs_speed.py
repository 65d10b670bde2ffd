"""Many processes on one store: what the per-write lock costs, and what it allows.

    python benchmarks/procs_speed.py [--batches 200] [--writers 1,2,4,8] [--baseline PATH_TO_OLD_CHECKOUT]

On keyword-only stores with given 384-d vectors (no model: the write path alone):

* ``single`` — one process: ``add`` (one memory per call) and ``add_many`` (100 per call)
  throughput. With ``--baseline``, the same run on another checkout (e.g. main before the
  per-write lock, whose writer held the lock from open to close), side by side.
* ``writers`` — 1, 2, 4 and 8 processes (``--writers``) each appending ``--batches``
  batches of 100 memories to one store at once: aggregate memories/s (all memories over
  the wall time from the start signal to the last writer's close), and the p50/p99 wait
  for the writer lock (timed around ``flock`` inside the engine). Each writer also applies
  every other writer's records to its own index (that is what keeps ids unique and reads
  fresh): the work grows with the number of writers.
* ``freshness`` — ``len(store)`` on a store nobody else writes to (the per-call check is
  one ``fstat``), and a read right after another process appended one memory.
* ``follow`` — a read-only handle catching up (one ``len``) after another handle appended
  1, 10, 100 or 10,000 memories with vectors: the replay of what others wrote, p50 of
  ``--follow-rounds`` rounds (fewer for 10,000). With ``--baseline``, side by side.

``--only SECTION`` runs one section. ``--replay both`` runs each writer count (and
``follow``) twice, one right after the other: each writer applying the others' plain memory records with the
compiled run (``plain``, what fastmem does) and record by record (``general``, as before
it); each ratio is against the single writer of the same way.

Unfair: two cores for up to four writers plus the OS; the lock is uncontended in
``single``; the baseline checkout pays nothing for the per-call fstat it does not make.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

WRITER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import fastmem
    from fastmem.storage import engine as _engine, replay as _replay
    if os.environ.get("FASTMEM_BENCH_REPLAY") == "general":  # no compiled run of plain records
        _replay.Replayer._plain_run = lambda self, *args: 0
    waits = []
    real = _engine.Engine._flock
    def timed(self):
        t = time.perf_counter()
        real(self)
        waits.append(time.perf_counter() - t)
    _engine.Engine._flock = timed
    path, batches, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((100, 384)).astype(np.float32)
    store = fastmem.open(path, embedder=None, summarizer=None, durability="none", timeout=300,
                         policy=fastmem.ContextPolicy(preload=0, recent=0))
    items = [[{"text": f"p{seed} b{b} i{i} words here", "embedding": vectors[i]}
              for i in range(100)] for b in range(batches)]
    print("ready", flush=True)
    sys.stdin.readline()
    t = time.perf_counter()
    for batch in items:
        store.add_many(batch)
    seconds = time.perf_counter() - t
    store.close()
    print(json.dumps({"seconds": seconds, "memories": 100 * batches, "waits": waits}))
""")

SINGLE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import fastmem
    path, n = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, 384)).astype(np.float32)
    items = [{"text": f"memory {i} words here", "embedding": vectors[i]} for i in range(n)]
    out = {}
    with fastmem.open(path + "-one", embedder=None, summarizer=None, durability="none",
                      policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:
        t = time.perf_counter()
        for item in items[: n // 10]:
            store.add(item["text"], embedding=item["embedding"])
        out["add_per_s"] = (n // 10) / (time.perf_counter() - t)
    with fastmem.open(path + "-many", embedder=None, summarizer=None, durability="none",
                      policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:
        t = time.perf_counter()
        for i in range(0, n, 100):
            store.add_many(items[i : i + 100])
        out["add_many_per_s"] = n / (time.perf_counter() - t)
        t, calls = time.perf_counter(), 20000
        for _ in range(calls):
            len(store)
        out["len_us"] = 1e6 * (time.perf_counter() - t) / calls
    print(json.dumps(out))
""")


def _python(
    code: str, *args: str, checkout: str | None = None, **kw: object
) -> subprocess.Popen[str]:
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    if checkout:
        env["PYTHONPATH"] = checkout
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True,
                            cwd=tempfile.gettempdir(), **kw)  # type: ignore[call-overload]  # fmt: skip


def single(work: str, checkout: str | None) -> dict[str, float]:
    p = _python(
        SINGLE, os.path.join(work, "single"), "20000", checkout=checkout, stdout=subprocess.PIPE
    )
    out, _ = p.communicate()
    return json.loads(out)


def writers(
    work: str, count: int, batches: int, replay: str = "plain", round_: int = 0
) -> dict[str, float]:
    path = os.path.join(work, f"writers-{count}-{replay}-{round_}")
    os.environ["FASTMEM_BENCH_REPLAY"] = replay
    procs = [_python(WRITER, path, str(batches), str(seed), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for seed in range(count)]  # fmt: skip
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.communicate()[0]) for p in procs]
    wall = time.perf_counter() - started
    waits = sorted(w for r in results for w in r["waits"])
    return {"processes": count, "replay": replay, "memories_per_s": sum(r["memories"] for r in results) / wall,
            "lock_wait_p50_ms": 1e3 * waits[len(waits) // 2],
            "lock_wait_p99_ms": 1e3 * waits[int(len(waits) * 0.99)],
            "lock_wait_max_ms": 1e3 * waits[-1]}  # fmt: skip


FRESH = textwrap.dedent("""
    import json, subprocess, sys, time
    import fastmem
    path = sys.argv[1]
    reader = fastmem.open(path, embedder=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
    times = []
    for i in range(200):
        subprocess.run([sys.executable, "-c", f"import fastmem\\nwith fastmem.open({path!r}, embedder=None) as s: s.add('one more {i}')"], check=True)
        t = time.perf_counter(); n = len(reader); times.append(time.perf_counter() - t)
        assert n == i + 1
        t = time.perf_counter(); len(reader); times[-1] -= time.perf_counter() - t  # minus an unchanged call
    print(json.dumps({"after_append_extra_us": 1e6 * sorted(times)[len(times) // 2]}))
""")


FOLLOW = textwrap.dedent("""
    import json, os, statistics, sys, time
    import numpy as np
    import fastmem
    from fastmem.storage import replay as _replay
    if os.environ.get("FASTMEM_BENCH_REPLAY") == "general":  # no compiled run of plain records
        _replay.Replayer._plain_run = lambda self, *args: 0
    path, rounds = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((10000, 384)).astype(np.float32)
    quiet = dict(embedder=None, summarizer=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
    writer = fastmem.open(path, durability="none", **quiet)
    reader = fastmem.open(path, readonly=True, **quiet)
    out = {}
    for k in (1, 10, 100, 10000):
        times = []
        for r in range(rounds if k < 10000 else max(3, rounds // 20)):
            writer.add_many([{"text": f"k{k} r{r} i{i} some words of a memory", "embedding": vectors[i]}
                             for i in range(k)])
            t = time.perf_counter()
            len(reader)
            times.append(time.perf_counter() - t)
        out[f"catch_up_{k}_us"] = 1e6 * statistics.median(times)
    reader.close()
    writer.close()
    print(json.dumps(out))
""")


def follow(work: str, checkout: str | None, rounds: int, replay: str = "plain") -> dict[str, float]:
    os.environ["FASTMEM_BENCH_REPLAY"] = replay
    p = _python(FOLLOW, os.path.join(work, f"follow-{replay}"), str(rounds), checkout=checkout,
                stdout=subprocess.PIPE)  # fmt: skip
    out, _ = p.communicate()
    return json.loads(out)


def freshness(work: str) -> dict[str, float]:
    p = _python(FRESH, os.path.join(work, "fresh"), stdout=subprocess.PIPE)
    return json.loads(p.communicate()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--writers", default="1,2,4,8", help="the numbers of writer processes")
    parser.add_argument("--baseline", help="another checkout to measure 'single' and 'follow' on")
    parser.add_argument("--follow-rounds", type=int, default=400)
    parser.add_argument("--only", choices=("single", "writers", "freshness", "follow"))
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="writers: rounds of every configuration; the median run is reported",
    )
    parser.add_argument("--replay", choices=("plain", "general", "both"), default="plain",
                        help="writers: how each applies the others' memory records: 'plain' "
                             "(the compiled run, as fastmem does), 'general' (record by record, "
                             "as before it), 'both' (alternated, each count run both ways)")  # fmt: skip
    args = parser.parse_args()
    run = (lambda section: args.only in (None, section))  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, "baseline"))
        base = os.path.join(work, "baseline")
        report: dict[str, object] = {}
        if run("single"):
            report["single"] = single(work, None)
            if args.baseline:
                report["single_baseline"] = single(base, args.baseline)
        if run("writers"):
            counts = [int(n) for n in args.writers.split(",")]
            ways = ("general", "plain") if args.replay == "both" else (args.replay,)
            runs: dict[tuple[int, str], list[dict[str, float]]] = {}
            for r in range(args.repeat):  # each configuration once per round, alternated
                for n in counts:
                    for way in ways:
                        runs.setdefault((n, way), []).append(writers(work, n, args.batches, way, r))
            # The run of median throughput of each configuration.
            report["writers"] = [sorted(got, key=lambda w: w["memories_per_s"])[len(got) // 2]
                                 for got in runs.values()]  # fmt: skip
        if run("freshness"):
            report["freshness"] = freshness(work)
        if run("follow"):
            if args.replay == "both":
                report["follow_general"] = follow(work, None, args.follow_rounds, "general")
            report["follow"] = follow(
                work, None, args.follow_rounds, "plain" if args.replay == "both" else args.replay
            )
            if args.baseline:
                report["follow_baseline"] = follow(base, args.baseline, args.follow_rounds)
    print(json.dumps(report, indent=1))
    one = {
        w["replay"]: w["memories_per_s"] for w in report.get("writers", []) if w["processes"] == 1
    }  # type: ignore[attr-defined]
    for w in report.get("writers", []):  # type: ignore[attr-defined]
        print(f"{w['processes']} writer(s), {w['replay']} replay: {w['memories_per_s']:,.0f} memories/s "
              f"({w['memories_per_s'] / one.get(w['replay'], float('nan')):.2f}x one), lock wait p50 {w['lock_wait_p50_ms']:.3f} ms, "
              f"p99 {w['lock_wait_p99_ms']:.3f} ms, max {w['lock_wait_max_ms']:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()

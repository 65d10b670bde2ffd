"""Compaction of a large store with half its memories forgotten: space reclaimed, and how
long readers and other threads wait while it runs.

    python benchmarks/compact_speed.py            # 1,000,000 memories (builds a cached store)
    python benchmarks/compact_speed.py --n 100k

Steps: copy the cached store of the shared workload (384-d vectors, ~115 characters each),
forget a random half, close (checkpoint); then compact it while

* two reader processes (``readonly=True``) call ``get()`` on random live ids in a loop,
  timing every call (wall and CPU time: on a busy machine the wall time includes waiting
  for a core) and the swap itself (the call that meets it opens the new files);
* a thread of the compacting process calls ``get()`` in a loop (it waits whenever the
  compaction holds the store's lock);

and report the bytes before and after, the longest lock hold, and the longest and 99.9th
percentile call of the readers and the thread during the compaction.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import workload  # noqa: E402

READER = """
import json, random, signal, sys, time, warnings
import fastmem
warnings.simplefilter("ignore")
path, ids = sys.argv[1], json.loads(sys.stdin.readline())
store = fastmem.open(path, readonly=True, embedder=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
store.tokens.encoding  # its background load would slow the first calls down
rng = random.Random(int(sys.argv[2]))
from fastmem.storage.engine import Engine
follows, real_swap = [], Engine.swap_to


def timed_swap(engine, fd, *, committed):  # a reader follows a compaction by a swap
    t = time.perf_counter()
    retired = real_swap(engine, fd, committed=committed)
    follows.append(time.perf_counter() - t)
    return retired


Engine.swap_to = timed_swap
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
print("ready", flush=True)
times, cpu, slow = [], [], []
while not stop:
    mid = rng.choice(ids)
    t, c = time.perf_counter(), time.thread_time()
    m = store.get(mid)
    took = time.perf_counter() - t
    cpu.append(time.thread_time() - c)
    times.append(took)
    if took > 0.002:
        slow.append((time.time() - took, took))
    assert m.id == mid
print(json.dumps({"times": times, "cpu": cpu, "slow": slow, "follows": follows}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="1M", help="memories (a multiple of 5,000; 10k, 1M...)")
    parser.add_argument("--forget", type=float, default=0.5, help="share of memories forgotten")
    args = parser.parse_args()
    (n,) = workload.parse_sizes(args.n)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    import fastmem

    cached, ids = workload.cached_store(n, log=log)
    scratch = Path(tempfile.mkdtemp(prefix="compact-", dir=workload.bench_dir()))
    try:
        path = str(scratch / "store")
        for ext in (".dat", ".idx"):
            shutil.copyfile(cached + ext, path + ext)
        rng = np.random.default_rng(5)
        gone = rng.choice(len(ids), int(n * args.forget), replace=False)
        started = time.perf_counter()
        with fastmem.open(path, durability="none", embedder=None) as store:
            for i in gone.tolist():
                store.forget(ids[i])
        log(f"forgot {len(gone):,} memories in {time.perf_counter() - started:.1f} s")
        keep = np.ones(len(ids), dtype=bool)
        keep[gone] = False
        live = [ids[i] for i in np.nonzero(keep)[0][:: max(1, n // 20_000)].tolist()]

        store = fastmem.open(path, durability="batch", embedder=None)
        readers = [
            subprocess.Popen([sys.executable, "-c", READER, path, str(k)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=workload.child_env())
            for k in range(2)
        ]  # fmt: skip
        for r in readers:
            assert r.stdin is not None and r.stdout is not None
            r.stdin.write(json.dumps(live) + "\n")
            r.stdin.flush()
            assert r.stdout.readline().strip() == "ready"
        thread_times: list[float] = []
        done = threading.Event()

        def in_process_reader() -> None:
            k = 0
            while not done.is_set():
                t = time.perf_counter()
                store.get(live[k % len(live)])
                thread_times.append(time.perf_counter() - t)
                k += 1
                time.sleep(0.0005)

        thread = threading.Thread(target=in_process_reader)
        thread.start()
        time.sleep(0.5)
        log("compacting ...")
        window = [time.time()]
        report = store.compact()
        window.append(time.time())
        time.sleep(0.5)  # the readers' next calls meet the swap
        done.set()
        thread.join()
        stats = []
        for r in readers:
            r.send_signal(signal.SIGUSR1)
        for r in readers:
            text, _ = r.communicate(timeout=120)
            out = json.loads(text.strip().splitlines()[-1])
            times = sorted(out["times"])
            during = [took for at, took in out["slow"] if window[0] <= at <= window[1] + 0.5]
            stats.append({"calls": len(times), "max_ms": round(times[-1] * 1e3, 2),
                          "p999_ms": round(times[int(len(times) * 0.999)] * 1e3, 3),
                          "max_cpu_ms": round(max(out["cpu"]) * 1e3, 2),
                          "swap_follow_ms": [round(f * 1e3, 2) for f in out["follows"]],
                          "calls_over_2ms_during_compaction": len(during),
                          "max_ms_during_compaction": round(max(during, default=0.0) * 1e3, 2)})  # fmt: skip
        store.close()
        with fastmem.open(path, readonly=True, embedder=None) as check:
            ok = check.verify().ok
            count = len(check)
        thread_sorted = sorted(thread_times)
        print(json.dumps({
            "memories_before": n, "forgotten": len(gone), "memories_after": count,
            "verify_ok": ok,
            "bytes_before": report.bytes_before, "bytes_after": report.bytes_after,
            "dat_before": report.dat_before, "dat_after": report.dat_after,
            "idx_before": report.idx_before, "idx_after": report.idx_after,
            "reclaimed_fraction": round(report.reclaimed_fraction, 4),
            "compact_seconds": round(report.seconds, 2),
            "lock_held_max_ms": round(report.lock_seconds * 1e3, 2),
            "thread_get_max_ms": round(thread_sorted[-1] * 1e3, 2),
            "thread_get_p999_ms": round(thread_sorted[int(len(thread_sorted) * 0.999)] * 1e3, 3),
            "thread_calls": len(thread_sorted),
            "readers": stats,
        }, indent=1))  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

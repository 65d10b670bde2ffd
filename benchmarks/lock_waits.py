"""How long writers wait for the writer lock: four processes adding batches of 100 memories
while a fifth adds batches of 5,000 (an import beside a gateway and its CLIs).

Each writer is a process of its own with its own handle. The lock wait is the time a write
spends taking the writer lock (``Engine._flock``, timed in each writer); the latency is the
whole ``add_many`` call. Memories have no vectors and no summaries: what is measured is the
lock, not the embedder. The second table says what held the lock and for how long (each
hold timed from the ``flock`` that took it to the one that let it go, in the process that
held it): the small writes, the large ones, or a checkpoint's thread.
``LOCK_WAITS_TAIL_ROWS=N`` in the environment sets the checkpoint limit (an alternative).

    python benchmarks/lock_waits.py [--seconds 10] [--small 4] [--big 1] [--poll-max 0.0002]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def worker(path: str, kind: str, seconds: float, out: str, poll_max: float) -> None:
    import fastmem
    from fastmem.storage import (
        checkpoint as _checkpoint, engine as _engine, writelock as _writelock,
    )

    if poll_max > 0:  # an alternative measured: a shorter longest pause between tries
        _writelock.POLL_MAX = poll_max
    if os.environ.get("LOCK_WAITS_TAIL_ROWS"):  # an alternative measured: rarer checkpoints
        from fastmem.storage import index as _index

        _index.CHECKPOINT_TAIL_ROWS = int(os.environ["LOCK_WAITS_TAIL_ROWS"])

    size = 100 if kind == "small" else 5000
    waits: list[float] = []
    calls: list[float] = []
    holds: list[tuple[str, float]] = []  # (what held the OS lock, for how long)
    taken = [0.0]
    real_fcntl = _engine.fcntl

    class Traced:  # the engine's (and a checkpoint's) fcntl, timing each hold of the writer lock
        def __getattr__(self, name: str) -> object:
            return getattr(real_fcntl, name)

        @staticmethod
        def flock(fd: int, op: int) -> None:
            real_fcntl.flock(fd, op)
            now = time.perf_counter()
            if op & real_fcntl.LOCK_EX:
                taken[0] = now
            elif op == real_fcntl.LOCK_UN and taken[0]:
                thread = threading.current_thread().name
                what = "checkpoint" if thread.startswith("fastmem-checkpoint") else kind
                holds.append((what, now - taken[0]))
                taken[0] = 0.0

    _engine.fcntl = Traced()  # type: ignore[assignment]
    _checkpoint.fcntl = Traced()  # type: ignore[assignment]
    with fastmem.open(path, embedder=None, summarizer=None, timeout=120) as store:
        engine = store._engine
        real = engine._flock

        def timed() -> object:
            started = time.perf_counter()
            try:
                return real()
            finally:
                waits.append(time.perf_counter() - started)

        engine._flock = timed
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            items = [{"text": f"{kind} {os.getpid()} {n + i} words words"} for i in range(size)]
            started = time.perf_counter()
            store.add_many(items)
            calls.append(time.perf_counter() - started)
            n += size
    with open(out, "w") as f:
        json.dump({"kind": kind, "waits": waits, "calls": calls, "memories": n, "holds": holds}, f)


def _row(name: str, values: list[float]) -> str:
    ms = 1e3 * np.array(values)
    return (f"| {name} | {len(ms):,} | {np.percentile(ms, 50):.2f} | {np.percentile(ms, 95):.2f} | "
            f"{np.percentile(ms, 99):.2f} | {ms.max():.1f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--small", type=int, default=4)
    parser.add_argument("--big", type=int, default=1)
    parser.add_argument(
        "--poll-max",
        type=float,
        default=0.0,
        help="seconds: the longest pause between tries for the lock (default: fastmem's)",
    )
    parser.add_argument("--worker", nargs=4, metavar=("PATH", "KIND", "SECONDS", "OUT"))
    args = parser.parse_args()
    if args.worker:
        path, kind, seconds, out = args.worker
        worker(path, kind, float(seconds), out, args.poll_max)
        return
    import fastmem

    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"fastmem {fastmem.__version__}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "store")
        fastmem.open(path, embedder=None).close()
        kinds = ["big"] * args.big + ["small"] * args.small
        outs = [os.path.join(folder, f"w{i}.json") for i in range(len(kinds))]
        env = dict(os.environ, FASTMEM_EMBEDDER="none")
        procs = [subprocess.Popen([sys.executable, __file__, "--poll-max", str(args.poll_max), "--worker",
                                   path, kind, str(args.seconds), out], env=env)
                 for kind, out in zip(kinds, outs)]  # fmt: skip
        for p in procs:
            p.wait(timeout=args.seconds * 20 + 120)
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    poll = f", longest poll pause {args.poll_max * 1e3:g} ms" if args.poll_max else ""
    print(
        f"{args.small} writers of 100-memory batches, {args.big} of 5,000, {args.seconds:g} s{poll}"
    )
    print("| what | count | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("small", "big"):
        mine = [r for r in results if r["kind"] == kind]
        if mine:
            label = "100-batch" if kind == "small" else "5,000-batch"
            print(_row(f"lock wait, {label} writers", [w for r in mine for w in r["waits"]]))
            print(_row(f"add_many, {label} writers", [c for r in mine for c in r["calls"]]))
    holds = [h for r in results for h in r["holds"]]
    print("\n| the writer lock held by | holds | p50 ms | p95 ms | p99 ms | max ms | total s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what, label in (("small", "a 100-memory add_many"), ("big", "a 5,000-memory add_many"),
                        ("checkpoint", "a checkpoint's thread")):  # fmt: skip
        mine = [d for w, d in holds if w == what]
        if mine:
            print(_row(label, mine) + f" {sum(mine):.2f} |")
    total = sum(r["memories"] for r in results)
    print(f"memories written: {total:,} ({total / args.seconds:,.0f}/s)")


if __name__ == "__main__":
    main()

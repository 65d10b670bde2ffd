"""Restart, as a user restarts, over many fresh processes: fastmem and SQLite side by side.

Each run is a fresh interpreter running ``compare.py``'s restart child (imports done
before the clock; fastmem opened with the default embedder, then the 20 newest texts;
SQLite connected, then ``SELECT text ... ORDER BY ts DESC LIMIT 20`` on a table without
embeddings), the two systems alternating so that the machine's noise hits both alike.
Prints the median, p95 and minimum of each and fastmem's ratio to SQLite; with
``--baseline DIR`` (repeatable), also the fastmem of another checkout (e.g. main's) or of an
installed wheel (its site-packages), in the same rounds.

Each child runs ``gc.freeze()`` after its imports, before the clock (both systems alike;
``--no-freeze`` leaves it out): it sets the collector's counts to zero and frees nothing.
Without it, where Python's first cyclic collection falls depends on what the child
allocated before the clock (its imports, even the checkout's path), and one that falls
inside the ~0.5 ms restart adds to that run alone: a lottery that is neither system's
doing (main's child reached the clock with 559 young objects, a branch with one module
more 655, and its restart then ran a collection at 700). ``gc.collect()`` instead is not neutral: what it frees is given back, and SQLite's
restart then took ~0.1 ms longer (0.65-0.68 against 0.56-0.57 ms, 60 runs each).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. python benchmarks/restart_speed.py 100k --runs 40 --baseline /work/main

The stores are built once (compare.py's adapters: fastmem with the vectors given and no
embedder recorded, SQLite with its full and lean tables) and kept under the bench folder,
keyed by the size (``--rebuild`` builds them again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare  # noqa: E402
import workload  # noqa: E402


def build(n: int, rebuild: bool) -> dict[str, str]:
    """The folders of a fastmem and a SQLite store of the first ``n`` memories."""
    root = workload.bench_dir() / f"restart-{n}"
    marker = root / "built.json"
    if rebuild or not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        w = workload.generate(n)
        for name in ("fastmem", "sqlite"):
            os.makedirs(root / name)
            system = compare.SYSTEMS[name](str(root / name / "store"))
            system.add(w)
            system.close()
        compare.Sqlite.prepare_restart(str(root / "sqlite" / "store"))
        marker.write_text(json.dumps({"n": n, "built": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    return {name: str(root / name) for name in ("fastmem", "sqlite")}


def restart_ms(name: str, folder: str, source: str | None) -> float:
    """One restart in a fresh process, in ms: compare.py's child, importing the fastmem of
    ``source`` (a checkout) when given."""
    if source is None:
        return float(compare.run_child("restart", name, folder)["seconds"]) * 1e3
    env = dict(os.environ, PYTHONPATH=source)
    proc = subprocess.run([sys.executable, str(HERE / "compare.py"), "--child", "restart", name, folder],
                          capture_output=True, text=True, check=True, env=env, cwd=source)  # fmt: skip
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]) * 1e3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("size", help="memories, e.g. 100k")
    parser.add_argument("--runs", type=int, default=40, help="fresh processes per system")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--baseline", action="append", default=[],
                        help="a checkout (or a site-packages) whose fastmem is timed too, on the same "
                             "store; repeat it for several")
    parser.add_argument("--no-freeze", action="store_true", help="no gc.freeze() before the clocks")
    args = parser.parse_args()
    if not args.no_freeze:  # inherited by every child (compare.child_restart reads it)
        os.environ["FASTMEM_BENCH_FREEZE"] = "1"
    (n,) = workload.parse_sizes(args.size)
    folders = build(n, args.rebuild)
    systems = [("fastmem", folders["fastmem"], None), ("sqlite", folders["sqlite"], None)]
    for source in args.baseline:
        source = os.path.abspath(source)
        systems.append((f"fastmem ({source})", folders["fastmem"], source))
    for label, folder, source in systems:  # untimed warm-up (page cache)
        restart_ms(label.split()[0], folder, source)
    runs: dict[str, list[float]] = {label: [] for label, _, _ in systems}
    for _ in range(args.runs):  # alternating, so that noise hits every system alike
        for label, folder, source in systems:
            runs[label].append(restart_ms(label.split()[0], folder, source))
    load = os.getloadavg()[0]
    how = "" if args.no_freeze else "; gc.freeze() before the clock"
    print(f"{n:,} memories, {args.runs} fresh processes each, alternating{how}; load average {load:.1f}")
    print("| system | median ms | p95 ms | min ms |\n|---|---:|---:|---:|")
    for name, ms in runs.items():
        print(f"| {name} | {statistics.median(ms):.3f} | {percentile(ms, 0.95):.3f} | {min(ms):.3f} |")
    ratio = statistics.median(runs["sqlite"]) / statistics.median(runs["fastmem"])
    print(f"SQLite ÷ fastmem (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()

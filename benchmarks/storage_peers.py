"""fastmem beside SQLite on the same generated data, in one run.

    cd /work/main
    python benchmarks/storage_peers.py --sizes 10000,100000
    python benchmarks/storage_peers.py --sizes 10000,100000,1000000

For each size, both systems get the same memories (workload.py) and are measured the same
way, as in /work/shared/reference/measured-peers.md:

* insert/s: batches of 5,000 (fastmem ``add_many``, durability "batch"; SQLite one
  transaction per ``executemany``), from opening an empty store to closing it, in a fresh
  process; the data and embeddings are generated in that process before the clock starts.
  Median of 3 runs up to 100 k, one run above (see insert_runs).
* restart: in a fresh process, after imports, open and read the 20 most recent memories
  with their text; median of 5 processes (after one untimed warm-up each), alternating
  between the systems so that noise on this shared machine hits both alike.
* get/s: uniformly random ids (the same rows for both), 20,000 per pass after 2,000
  warm-ups, median of 5 passes, in a fresh process. fastmem returns a ``Memory``;
  SQLite returns the (text, type, ts) tuple of a primary-key lookup.
* bytes/memory: apparent size of all the store's files after close (fastmem ``.dat`` +
  ``.idx``; SQLite the database plus any ``-wal``/``-shm``).

SQLite is driven as for the peers: WAL, ``synchronous=NORMAL``, an index on the timestamp,
the embedding as a float32 BLOB. Results are printed and written to RESULTS-storage.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import workload

HERE = Path(__file__).resolve().parent
SYSTEMS = ("fastmem", "sqlite")
RESTART_RUNS = 5
GET_PASSES, GET_PER_PASS, GET_WARMUP = 5, 20_000, 2_000

# --- workers: each runs in its own fresh process ---------------------------------------


def _insert(system: str, n: int, path: str) -> dict[str, Any]:
    data = workload.generate(n)  # untimed, as the peers' embeddings were computed beforehand
    if system == "fastmem":
        batches = data.fastmem_batches()
        t0 = time.perf_counter()
        ids = workload.build_store(path, batches, durability="batch")
        seconds = time.perf_counter() - t0
        # Ids for the get worker, so it need not assume how fastmem numbers memories.
        Path(path + ".ids").write_text("\n".join(ids))
    else:
        import sqlite3

        rows = data.sqlite_batches()
        t0 = time.perf_counter()
        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for statement in workload.SQLITE_SCHEMA:
            db.execute(statement)
        db.commit()
        for batch in rows:
            with db:  # one transaction per 5,000-row executemany
                db.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?)", batch)
        db.close()  # the last connection checkpoints the WAL into the database
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "per_s": n / seconds}


def _get(system: str, n: int, path: str) -> dict[str, Any]:
    rows = workload.random_rows(n, GET_WARMUP + GET_PASSES * GET_PER_PASS).tolist()
    if system == "fastmem":
        import fastmem

        ids = Path(path + ".ids").read_text().split("\n")
        keys = [ids[r] for r in rows]
        store = fastmem.open(path)
        get = store.get
        text_of = lambda key: get(key).text  # noqa: E731 - only for the check below
        close = store.close
    else:
        import sqlite3

        keys = rows  # INTEGER PRIMARY KEY = the row number given at insert
        db = sqlite3.connect(path)
        sql = "SELECT text, type, ts FROM memories WHERE id = ?"

        def get(key: int) -> Any:
            return db.execute(sql, (key,)).fetchone()

        text_of = lambda key: get(key)[0]  # noqa: E731
        close = db.close
    # A digest of some texts read, for the parent to check that both read the same data.
    digest = hashlib.sha256("\n".join(text_of(k) for k in keys[:200]).encode()).hexdigest()
    for key in keys[:GET_WARMUP]:
        get(key)
    rates = []
    for p in range(GET_PASSES):
        chunk = keys[GET_WARMUP + p * GET_PER_PASS : GET_WARMUP + (p + 1) * GET_PER_PASS]
        t0 = time.perf_counter()
        for key in chunk:
            get(key)
        rates.append(len(chunk) / (time.perf_counter() - t0))
    close()
    return {"per_s": statistics.median(rates), "passes": rates, "digest": digest}


def _worker(argv: list[str]) -> None:
    job, system, n, path = argv
    result = {"insert": _insert, "get": _get}[job](system, int(n), path)
    result["fastmem_source"] = workload.fastmem_source()
    print(json.dumps(result))


def _spawn(job: str, system: str, n: int, path: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", job, system, str(n), path],
        capture_output=True, text=True, check=False, env=workload.child_env(),
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"{job} worker for {system} at {n} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["fastmem_source"] != workload.fastmem_source():
        raise RuntimeError(f"the worker imported fastmem from {result['fastmem_source']}")
    return result


# --- the run ---------------------------------------------------------------------------


def _store_files(system: str, path: str) -> list[str]:
    if system == "fastmem":
        return [path + ".dat", path + ".idx"]
    return [p for p in (path, path + "-wal", path + "-shm") if os.path.exists(p)]


def insert_runs(n: int) -> int:
    """Inserts are timed 3 times up to 100 k (median kept: this machine is shared and noisy),
    once at larger sizes, as the peers' were (a 1 M SQLite insert takes ~40 s)."""
    return 3 if n <= 100_000 else 1


def measure(n: int, folder: Path, log: Any) -> dict[str, dict[str, Any]]:
    """Every figure for both systems at size ``n``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    paths = {"fastmem": str(folder / "fastmem"), "sqlite": str(folder / "sqlite.db")}
    out: dict[str, dict[str, Any]] = {s: {} for s in SYSTEMS}
    runs = insert_runs(n)
    for system in SYSTEMS:
        log(f"{n:>9,}  {system}: inserting ({runs} run{'s' * (runs > 1)}) ...")
        inserts = []
        for _ in range(runs):  # each into a new store; the last one is kept and measured
            for f in _store_files(system, paths[system]) + [paths[system] + ".ids"]:
                Path(f).unlink(missing_ok=True)
            inserts.append(_spawn("insert", system, n, paths[system]))
        inserts.sort(key=lambda r: r["seconds"])
        out[system]["insert"] = inserts[len(inserts) // 2]  # the median run
        out[system]["insert_runs"] = [r["seconds"] for r in inserts]
        files = _store_files(system, paths[system])
        out[system]["bytes"] = sum(os.path.getsize(f) for f in files)
        out[system]["files"] = [os.path.basename(f) for f in files]
        log(f"{n:>9,}  {system}: {out[system]['insert']['per_s']:,.0f} inserts/s, "
            f"{out[system]['bytes'] / n:,.0f} bytes/memory")  # fmt: skip
    log(f"{n:>9,}  restarts ...")
    restarts: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    for system in SYSTEMS:  # one untimed warm-up each
        workload.restart_seconds(system, paths[system])
    for _ in range(RESTART_RUNS):  # alternate, so that a noisy moment hits both
        for system in SYSTEMS:
            restarts[system].append(workload.restart_seconds(system, paths[system]))
    log(f"{n:>9,}  gets ...")
    for system in SYSTEMS:
        out[system]["restart_runs"] = restarts[system]
        out[system]["restart"] = statistics.median(restarts[system])
        out[system]["get"] = _spawn("get", system, n, paths[system])
    if out["fastmem"]["get"]["digest"] != out["sqlite"]["get"]["digest"]:
        raise RuntimeError(f"at {n}: fastmem and SQLite returned different texts for the same ids")
    return out


def machine_line() -> str:
    import numpy as np
    import sqlite3

    import fastmem

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # The commit of the fastmem actually imported (PYTHONPATH may point at another checkout).
    source = Path(fastmem.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--", "fastmem", "src_cython"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        rev += " + uncommitted changes" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return (
        f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}; Python "
        f"{platform.python_version()}, numpy {np.__version__}, SQLite {sqlite3.sqlite_version}; "
        f"fastmem {fastmem.__version__} ({fastmem.BACKEND} kernels, commit {rev}, from {source})"
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:,.0f} ms"


def render(results: dict[int, dict[str, dict[str, Any]]], machine: str, command: str,
           elapsed: float, load: tuple[float, float]) -> str:
    lines = [
        "# fastmem beside SQLite: storage",
        "",
        f"Generated by `{command}` on {time.strftime('%Y-%m-%d %H:%M')} ({elapsed / 60:.1f} min).",
        "",
        f"Machine: {machine}.",
        "",
        f"1-minute load average at start / end: {load[0]:.2f} / {load[1]:.2f} (2 cores, shared: "
        "other processes' load makes single figures noisy; medians are used throughout).",
        "",
        "Same data for both (benchmarks/workload.py: ~115-character pseudo-English texts, random "
        "unit 384-d float32 embeddings passed in, timestamps shuffled over a year); inserts in "
        "batches of 5,000 (fastmem `add_many`, durability \"batch\"; SQLite WAL, "
        "`synchronous=NORMAL`, timestamp index, float32 BLOB, one transaction per "
        "`executemany`; median of 3 runs up to 100 k, 1 run above). Restart = open + 20 most "
        "recent with text, fresh process, after "
        "imports, median of 5. Get = random ids, median of 5 passes of 20,000. Bytes = all of "
        "a store's files after close. How each figure was taken: benchmarks/storage_peers.py.",
        "",
        "| N | figure | fastmem | SQLite | fastmem / SQLite |",
        "|---:|---|---:|---:|---:|",
    ]
    for n, r in results.items():
        f, s = r["fastmem"], r["sqlite"]
        lines += [
            f"| {n:,} | insert /s (higher is better) | {f['insert']['per_s']:,.0f} | "
            f"{s['insert']['per_s']:,.0f} | {_ratio(f['insert']['per_s'], s['insert']['per_s'])} |",
            f"| {n:,} | restart (lower is better) | {_ms(f['restart'])} | {_ms(s['restart'])} | "
            f"{_ratio(f['restart'], s['restart'])} |",
            f"| {n:,} | get /s (higher is better) | {f['get']['per_s']:,.0f} | "
            f"{s['get']['per_s']:,.0f} | {_ratio(f['get']['per_s'], s['get']['per_s'])} |",
            f"| {n:,} | bytes / memory (lower is better) | {f['bytes'] / n:,.0f} | "
            f"{s['bytes'] / n:,.0f} | {_ratio(f['bytes'], s['bytes'])} |",
        ]
    lines += ["", "Details: every insert run (total s; the median is used), restart (ms) and get "
              "pass (per s).", ""]  # fmt: skip
    for n, r in results.items():
        for system in SYSTEMS:
            x = r[system]
            inserts = ", ".join(f"{t:.2f}" for t in x["insert_runs"])
            restarts = ", ".join(f"{t * 1e3:.2f}" for t in x["restart_runs"])
            gets = ", ".join(f"{g:,.0f}" for g in x["get"]["passes"])
            lines.append(f"- {n:,} {system}: inserts {inserts} s; restarts {restarts}; "
                         f"gets {gets}; files {', '.join(x['files'])}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000",
                        help="comma-separated sizes, multiples of 5,000 (default 10000,100000)")
    parser.add_argument("--out", default=str(HERE / "RESULTS-storage.md"),
                        help="where to write the Markdown table")
    parser.add_argument("--keep", action="store_true",
                        help="keep the stores written (under $FASTMEM_BENCH_DIR/peers-N)")
    args = parser.parse_args()
    sizes = workload.parse_sizes(args.sizes)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    results = {}
    for n in sizes:
        folder = workload.bench_dir() / f"peers-{n}"
        results[n] = measure(n, folder, log)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    command = "python benchmarks/storage_peers.py --sizes " + ",".join(map(str, sizes))
    load = (load_start, os.getloadavg()[0])
    text = render(results, machine_line(), command, time.perf_counter() - started, load)
    Path(args.out).write_text(text)
    print(text)
    log(f"written to {args.out}")


if __name__ == "__main__":
    main()

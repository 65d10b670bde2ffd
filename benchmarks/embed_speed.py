"""The default embedder's speed: query latency, batch throughput, and readiness after open().

    python benchmarks/embed_speed.py [--queries 300] [--texts 400] [--fresh 5] [--numpy]

Measures, on LoCoMo dev's questions and turns (``../shared/data/locomo-dev.json``; sentences of
the standard library's docstrings where it is absent):
- query: ``encode([question])`` one at a time on one thread, p50 and p95 (no cache: ``encode``
  bypasses the query cache that ``encode_query`` keeps);
- batch: ``encode(turns)`` for the turns, with ``threads=1`` and ``threads=2``, texts/s;
- ready after open: in ``--fresh`` new processes, the time from ``fastmem.open()`` returning to
  the default model being ready (``store._embedder.wait()``), median and max; the process's
  import of fastmem is before the clock, the import of onnxruntime and tokenizers inside it.
``--numpy`` also measures the float32 numpy runtime (NumpyMiniLM) for comparison.

Bias: one machine, shared (say how busy it was: the script prints the load average); figures
from a busy machine are upper bounds on latency and lower bounds on throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# This checkout's fastmem, not another one installed (a script's folder, not the working
# directory, is first on sys.path); its tests/ for the sample texts.
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

READY = """
import sys, time, fastmem
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1])
t1 = time.perf_counter()
store._embedder.wait()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
store.close()
"""


def questions(n: int) -> list[str]:
    data = HERE.parent.parent / "shared" / "data" / "locomo-dev.json"
    if data.exists():
        qs = [q["question"] for s in json.loads(data.read_text()) for q in s["qa"]]
        return qs[:: max(1, len(qs) // n)][:n]
    from test_embed import real_texts

    return [t[:80] for t in real_texts(n)]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def main() -> None:
    from test_embed import real_texts

    from fastmem import embed

    print(f"fastmem from {Path(embed.__file__).parent}")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--fresh", type=int, default=5)
    parser.add_argument("--numpy", action="store_true")
    args = parser.parse_args()

    import onnxruntime

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
          f"onnxruntime {onnxruntime.__version__}, load average before "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    qs, turns = questions(args.queries), real_texts(args.texts)
    runtimes = [("int8 onnxruntime (default)", lambda t: embed.MiniLM(threads=t))]
    if args.numpy:
        runtimes.append(("float32 numpy (NumpyMiniLM)", lambda t: embed.NumpyMiniLM()))
    results = {}
    for label, make in runtimes:
        model = make(1)
        model.wait()
        for q in qs[:20]:
            model.encode([q])
        times = []
        for q in qs:
            t = time.perf_counter()
            model.encode([q])
            times.append(time.perf_counter() - t)
        times.sort()
        p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95)]
        rates = {}
        for threads in (1, 2):
            m = make(threads)
            m.wait()
            m.encode(turns[:20])
            t = time.perf_counter()
            m.encode(turns)
            rates[threads] = len(turns) / (time.perf_counter() - t)
        results[label] = (p50, p95, rates)
        print(f"{label}: query p50 {ms(p50)}, p95 {ms(p95)} (one thread, {len(qs)} questions); "
              f"batch {rates[1]:.0f} texts/s on 1 thread, {rates[2]:.0f} on 2 "
              f"({len(turns)} LoCoMo turns)")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        env = {k: v for k, v in os.environ.items() if k != "FASTMEM_EMBEDDER"}
        env["PYTHONPATH"] = str(HERE.parent)
        opens, readies = [], []
        for _ in range(args.fresh):
            out = subprocess.run([sys.executable, "-c", READY, path], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()  # fmt: skip
            opens.append(float(out[0]))
            readies.append(float(out[1]))
    print(f"fresh process: open() {ms(statistics.median(opens))}; model ready "
          f"{ms(statistics.median(readies))} after open (median of {args.fresh}, max "
          f"{ms(max(readies))})")  # fmt: skip
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

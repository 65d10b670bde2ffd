"""Run the fuzz targets under atheris and add up the inputs they ran.

    python fuzz/run.py --open 300000 --readers 1000000 [--workdir /tmp/fastmem-fuzz]

Each target runs as its own process (libFuzzer flags below: a 10 s limit per input for
hangs, 2 GiB for memory), with its corpus and any crash artifacts under ``--workdir``.
The count is libFuzzer's own (its last ``#N`` status line); the exit status is non-zero
when a target found a crash, a hang or a memory blow-up. A report line per target and the
total are printed, and appended to ``<workdir>/runs.log``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = {"open": ("fuzz_open.py", 65536), "readers": ("fuzz_readers.py", 16384)}


def run_target(name: str, runs: int, workdir: str) -> tuple[int, int, float]:
    script, max_len = TARGETS[name]
    corpus = os.path.join(workdir, f"corpus_{name}")
    os.makedirs(corpus, exist_ok=True)
    log = os.path.join(workdir, f"{name}.log")
    cmd = [
        sys.executable, os.path.join(HERE, script), f"-runs={runs}", f"-max_len={max_len}",
        "-len_control=0", "-timeout=10", "-rss_limit_mb=2048",
        f"-artifact_prefix={os.path.join(workdir, name)}-", corpus,
    ]  # fmt: skip
    started = time.time()
    with open(log, "w") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    counts = [int(m) for m in re.findall(r"^#(\d+)\s", open(log).read(), re.M)]
    done = re.search(r"^Done (\d+) runs", open(log).read(), re.M)
    return code, int(done.group(1)) if done else max(counts, default=0), time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--open", type=int, default=0, help="inputs for fuzz_open.py")
    parser.add_argument("--readers", type=int, default=0, help="inputs for fuzz_readers.py")
    parser.add_argument("--workdir", default="/tmp/fastmem-fuzz")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    total, failed = 0, False
    procs = []
    for name in ("open", "readers"):
        runs = getattr(args, name)
        if runs:
            procs.append((name, runs))
    for name, runs in procs:
        code, count, took = run_target(name, runs, args.workdir)
        line = (f"{time.strftime('%Y-%m-%d %H:%M:%S')} {name}: {count} inputs in {took:.0f} s, "
                f"exit {code} ({'ok' if code == 0 else 'FINDING: see ' + args.workdir})")  # fmt: skip
        print(line, flush=True)
        with open(os.path.join(args.workdir, "runs.log"), "a") as f:
            f.write(line + "\n")
        total += count
        failed |= code != 0
    print(f"total: {total} inputs{' (with findings)' if failed else ''}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""Hermes processes on one profile: turns stored per second by 1 and by N processes.

    FASTMEM_EMBEDDER=none python benchmarks/hermes_procs.py [--turns 2000] [--procs 3]

Each process is a real :class:`FastmemProvider` (hermes-agent need not be installed: the
provider imports without it) that syncs ``turns`` turns as fast as ``sync_turn`` takes them
and shuts down, which waits until every turn is on disk (fsynced). The clock runs from the
start signal to the last process's shutdown; process start-up and imports are outside it.
Then a fresh process counts the turns (all must be there) and the spill files (must be 0).

What it does not measure: embedding (run without ``FASTMEM_EMBEDDER=none`` to include it;
the default model's cost per turn then dominates), or Hermes's own turn latency (the turns
come back to back here, a real agent spends seconds on the model between them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import os, sys, time
    from fastmem.integrations.hermes import FastmemProvider
    home, tag, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    p = FastmemProvider(); p.initialize("s-" + tag, hermes_home=home, platform="cli")
    p.system_prompt_block()  # opens the store, as Hermes's first system prompt does
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(n):
        p.sync_turn(f"{tag} turn {i}: what the user asked and what the agent answered", "ok")
    p.shutdown()
    print(time.time(), flush=True)
""")


def run(procs: int, turns: int) -> tuple[float, int, int]:
    """(seconds, turns stored, spill files) for ``procs`` processes of ``turns`` each."""
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, HERMES_HOME=home, PYTHONPATH=ROOT)
        go = os.path.join(home, "go")
        children = [
            subprocess.Popen([sys.executable, "-c", CHILD, home, f"p{i}", str(turns), go], env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
            for i in range(procs)
        ]
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        started = time.time()
        open(go, "w").close()
        ended = max(float(child.communicate(timeout=600)[0].strip()) for child in children)
        import fastmem

        base = os.path.join(home, "fastmem", "default", "memory")
        with fastmem.open(base, readonly=True) as store:
            stored = len(store)
        spills = [f for f in os.listdir(os.path.dirname(base)) if f.startswith("pending-")]
        return ended - started, stored, len(spills)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000, help="turns per process")
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="best of")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    import fastmem

    print(f"fastmem {fastmem.__version__} ({fastmem.BACKEND}), {os.cpu_count()} CPUs, "
          f"FASTMEM_EMBEDDER={os.environ.get('FASTMEM_EMBEDDER', '(default)')}")  # fmt: skip
    for procs, turns in ((1, args.turns * args.procs), (args.procs, args.turns)):
        runs = sorted(run(procs, turns) for _ in range(args.repeat))
        seconds = runs[len(runs) // 2][0]
        # A run whose shutdown passed the deadline (a loaded machine) keeps the rest in
        # spill files: stored + kept = all, and it is counted here, not hidden.
        short = [(procs * turns - stored, spills) for _, stored, spills in runs if stored < procs * turns]
        print(f"{procs} process(es) x {turns} turns: median {seconds:.2f} s "
              f"({procs * turns / seconds:,.0f} turns/s) of {[round(r[0], 2) for r in runs]}; "
              f"runs with turns kept in spill files at the shutdown deadline: {short or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()

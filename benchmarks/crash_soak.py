"""The long SIGKILL run: ``tests/crash_harness.py`` for thousands of kills.

    python benchmarks/crash_soak.py                 # 5,000 kills
    python benchmarks/crash_soak.py --kills 20000 --seed 3
    python benchmarks/crash_soak.py --writers 4     # 4 writer processes and a compaction loop

A writer under ``durability="always"`` runs adds, batches, updates, forgets, evictions,
checkpoints and compactions and is killed with SIGKILL at a random moment; after each kill
the store is opened and held to what the writer acknowledged. Prints the totals: kills,
acknowledged memories, lost, garbled, unclean ``verify()``, and where the kills landed.
The store starts afresh every ``--fresh`` kills so each check stays quick.

With ``--writers N`` (N >= 2), each round forks N writer processes and a compaction loop
on one store and kills all N + 1, one by one in a random order, each at a random moment
of its progress (the others write on meanwhile); the store is checked after each round
(N + 1 kills), and no memory may be there twice.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import crash_harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", type=int, default=1000, help="kills per store")
    parser.add_argument("--max-delay", type=float, default=0.08, help="seconds before a kill, at most")
    parser.add_argument("--writers", type=int, default=1, help="writer processes (2+: and a compaction loop)")
    parser.add_argument("--keep", default=None, help="where to copy a store that does not open or read (several writers)")
    args = parser.parse_args()
    totals = {"kills": 0, "acked": 0, "lost": 0, "duplicates": 0, "garbled": 0, "unclean_verify": 0}
    log = functools.partial(print, file=sys.stderr, flush=True)
    phases = dict.fromkeys(crash_harness.PHASES, 0)
    errors: list[str] = []
    started = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="crash-soak-")
    try:
        done = 0
        while done < args.kills:
            n = min(args.fresh, args.kills - done)
            path = os.path.join(folder, f"store{done}")
            if args.writers > 1:
                rounds = -(-n // (args.writers + 1))
                model = crash_harness.run_rounds(path, rounds, args.writers, seed=args.seed * 1000 + done,
                                                 max_delay=args.max_delay, log=log, keep=args.keep)  # fmt: skip
                n = model.kills
            else:
                model = crash_harness.run_kills(path, n, seed=args.seed * 1000 + done, max_delay=args.max_delay, log=log)
            for key, value in (("kills", model.kills), ("acked", model.acked), ("lost", model.lost),
                               ("duplicates", model.duplicates), ("garbled", model.garbled),
                               ("unclean_verify", model.unclean)):  # fmt: skip
                totals[key] += value
            for phase, count in model.phases.items():
                phases[phase] += count
            errors += model.errors
            done += n
            print(f"{done} kills: {json.dumps(totals)}", file=sys.stderr, flush=True)
            for name in os.listdir(folder):
                if name.startswith(f"store{done - n}"):
                    os.remove(os.path.join(folder, name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not totals["acked"]:  # a writer that dies before its first add proves nothing
        errors.append("no memory was acknowledged: the writer never got past open")
    print(json.dumps({**totals, "writers": args.writers, "killed_during": phases, "errors": errors[:20],
                      "seconds": round(time.perf_counter() - started, 1)}, indent=1))  # fmt: skip
    failed = totals["lost"] or totals["duplicates"] or totals["garbled"] or totals["unclean_verify"]
    sys.exit(1 if errors or failed else 0)


if __name__ == "__main__":
    main()

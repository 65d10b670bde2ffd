"""The long power-cut run: ``tests/powercut.py`` for tens of thousands of simulated cuts.

    python benchmarks/powercut.py                    # 10,000 cuts
    python benchmarks/powercut.py --cuts 50000 --seed 7 --procs 2
    python benchmarks/powercut.py --writers 4       # workloads through 1, 2, 3 and 4 handles

Random workloads (adds, batches, updates, forgets, flushes, checkpoints, compactions,
reopenings; half under ``durability="always"``, half under ``"batch"``) are recorded at
the file-operation seam; each is cut at ``--per-workload`` random points, and for each cut
the files a power loss could leave are built (synced bytes plus any subset of the pages
written since, or a prefix with a torn last page; the directory as of its last fsync
plus a prefix of the entry operations since) and reopened. Prints the totals: cuts, lost
(acknowledged memories missing or changed), garbled (memories no call wrote), unclean
``verify()`` (of the synced part), and cuts whose unacknowledged tail verify() reports.
With ``--writers N``, the workloads go through 1 to N writer handles of the store in turn
(interleaved, each with its own group commit), and every other workload of 2 or more
runs them at once, in threads (adds, batches, flushes, compactions); under ``"batch"``, a memory counts as
acknowledged once a sync of its data file that began after its call returned (a group
commit's, a flush's) has returned; the run prints how many a group commit acknowledged.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("FASTMEM_EMBEDDER", "none")


def _one(job: tuple[str, int, int, int, bool]) -> tuple[int, list[str], int, dict[str, int]]:
    import powercut

    durability, seed, cuts, writers, at_once = job
    stats: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="fastmem-powercut-") as tmp:
        return (*powercut.run_cuts(tmp, durability, seed, cuts, writers=writers, stats=stats, at_once=at_once),
                stats)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=10_000)
    parser.add_argument("--per-workload", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--writers", type=int, default=1, help="workloads through 1 to this many writer handles")
    args = parser.parse_args()
    workloads = max(1, args.cuts // args.per_workload)
    cycle = 2 * args.writers  # always and batch through 1 to N writers; then again, at once
    jobs = [("always" if i % 2 == 0 else "batch", args.seed * 1_000_003 + i, args.per_workload,
             1 + (i // 2) % args.writers, (i // 2) % args.writers > 0 and (i // cycle) % 2 == 1)
            for i in range(workloads)]  # fmt: skip
    started = time.perf_counter()
    cuts, failures, reported = 0, [], 0
    acked = by_group = 0
    with multiprocessing.get_context("spawn").Pool(args.procs) as pool:
        for n, failed, tails, stats in pool.imap_unordered(_one, jobs):
            cuts, reported = cuts + n, reported + tails
            acked, by_group = acked + stats.get("acked", 0), by_group + stats.get("by_group_commit", 0)
            failures += failed
    seconds = time.perf_counter() - started
    lost = sum(" lost [" in f and " lost []" not in f for f in failures)
    garbled = sum(" garbled []" not in f for f in failures)
    unclean = sum(" problems []" not in f for f in failures)
    print(f"{cuts} cuts of {workloads} workloads ({workloads - workloads // 2} always, {workloads // 2} batch) "
          f"in {seconds:.0f} s: cuts with a lost memory {lost}, with a garbled one {garbled}, "
          f"with an unclean verify() {unclean}; unacknowledged tails reported by verify(): {reported}; "
          f"writer handles 1 to {args.writers}; operations acknowledged {acked}, first by a group commit "
          f"{by_group}")  # fmt: skip
    for f in failures[:10]:
        print(" ", f[:1000])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

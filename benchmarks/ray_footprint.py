"""What the test cluster costs: its start-up time and its memory.

    python benchmarks/ray_footprint.py [--shards 4] [--json] [--detail]
    python benchmarks/ray_footprint.py --watch SECONDS   # while the tests run: each test cluster's peak

Starts the cluster of the tests (tests/ray_cluster.py: a head and 3 worker nodes on
127.0.0.2..5), times it from the first `ray start` to the last node's "Ray runtime
started", then joins it as a driver, writes one memory to each of ``--shards`` shard actors
of a shared-storage deployment (so the actor processes exist, as in the tests) and sums the
resident memory (RSS, from /proc) of every process of the cluster: the nodes' process
groups and their descendants, the shard actors included; this driver is not counted. Then
stops the cluster by pid. RSS counts pages shared between processes once per process, so
the sum is an upper bound of what the cluster takes.

``--watch`` starts nothing: for SECONDS (or until Ctrl-C) it samples, every 0.5 s, the
RSS of each test cluster on the machine (the processes whose command line names its
``/tmp/fmray*`` directory, and their descendants) and prints each one's peak: run it beside
``python -m pytest -n 2 tests/test_ray_cluster.py``. Other people's test clusters show as
other directories.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
os.environ.setdefault("FASTMEM_EMBEDDER", "none")

import ray  # noqa: E402
from ray_cluster import LocalCluster  # noqa: E402

import fastmem.ray as fray  # noqa: E402


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def by_process(pids: list[int]) -> dict[str, float]:
    """RSS (MB) summed by what each process is (its command line, shortened)."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        words = [Path(w).name for w in cmd.split() if not w.startswith("-")]
        script = next((w for w in words[1:] if w.endswith(".py")), "")
        name = words[0] if words[0].startswith("ray::") or not script else script
        if words[0] == "ray" or words[1:2] == ["ray"]:
            name = "ray start --block"
        out[name] = out.get(name, 0.0) + rss_mb([pid])
    return {k: round(v) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def watch(seconds: float) -> dict[str, tuple[float, int]]:
    """Each /tmp/fmray* cluster's peak RSS (MB) and its process count then."""
    import re

    peaks: dict[str, tuple[float, int]] = {}
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            parents, owner = {}, {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    found = re.search(rb"/tmp/(fmray[a-z0-9_]+)", Path(f"/proc/{entry}/cmdline").read_bytes())
                except (OSError, IndexError, ValueError):
                    continue
                if found:
                    owner[int(entry)] = found.group(1).decode()
            grew = True
            while grew:  # Ray's workers: children of a raylet
                more = {p: owner[parent] for p, parent in parents.items() if parent in owner and p not in owner}
                owner.update(more)
                grew = bool(more)
            for name in set(owner.values()):
                pids = [p for p, d in owner.items() if d == name]
                total = rss_mb(pids)
                if total > peaks.get(name, (0.0, 0))[0]:
                    peaks[name] = (total, len(pids))
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--detail", action="store_true", help="RSS by process kind, with the shards up")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="sample the test clusters running")
    args = parser.parse_args()
    if args.watch:
        for name, (mb, n) in watch(args.watch).items():
            print(f"{name}: peak RSS {mb:.0f} MB over {n} processes")
        return
    started = time.monotonic()
    cluster = LocalCluster(workers=3)
    try:
        startup = time.monotonic() - started
        pids = [pid for node in cluster.nodes.values() for pid in node.pids()]
        idle = rss_mb(pids)
        os.environ.update(cluster.auth)
        ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, namespace="fastmem",
                 log_to_driver=False, logging_level="ERROR")  # fmt: skip
        c = fray.connect(cluster.address, root=os.path.join(cluster.dir, "shared"), shards=args.shards)
        names: dict[int, str] = {}
        for i in range(1000):
            names.setdefault(c.deployment.shard_of(f"n{i}"), f"n{i}")
            if len(names) == args.shards:
                break
        for name in names.values():
            c.open(name).add("one memory")
        pids = [pid for node in cluster.nodes.values() for pid in node.pids()]
        busy = rss_mb(pids)
        detail = by_process(pids) if args.detail else None
        c.shutdown()
        ray.shutdown()
    finally:
        cluster.stop()
    out = {"startup_s": round(startup, 1), "rss_idle_mb": round(idle), "rss_with_shards_mb": round(busy),
           "processes": len(pids), "shards": args.shards, "load": os.getloadavg()}
    if detail:
        out["by_process_mb"] = detail
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()

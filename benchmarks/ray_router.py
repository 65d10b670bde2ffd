"""fastmem on a Ray cluster: what the router costs, and what fanning a job out buys.

    python benchmarks/ray_router.py [--queries 300] [--stores 48] [--wait-ms 150] [--json]

Starts its own cluster on this machine (tests/ray_cluster.py: a head and 3 worker nodes on
127.0.0.2..5), measures, and stops it by pid.

* ``router`` — ``search`` (keyword mode, k=10) on one store of 2,000 memories: in-process
  (``fastmem.open`` on the same files) against through its shard (``RemoteStore.search``:
  a Ray actor call from this driver to the shard on another node, over loopback), p50
  and p95 of ``--queries`` calls each, interleaved so machine load hits both alike.
* ``fanout`` — a latency-bound fleet job: ``reembed`` of ``--stores`` stores of 20
  memories with an embedder that waits ``--wait-ms`` per batch (a stand-in for a slow
  embedding endpoint or a model that takes one batch at a time). The model runs in one
  actor per node, so the job's throughput grows with the nodes: node-local deployments of
  8 shards on 1 node against 8 shards spread over 3 nodes (3, 3 and 2), wall time of the
  whole job, including starting the embed actors (~1-2 s) and each store's compaction.

Unfair, and not shown: the 3 "nodes" share this machine's 2 cores, so a CPU-bound job
(a real model, compaction of large stores) cannot run faster on 3 of them than on 1; the
fan-out figure only shows that waits overlap across nodes. The router figure is loopback
gRPC between processes on one machine, not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
os.environ.setdefault("FASTMEM_EMBEDDER", "none")

import ray  # noqa: E402
from ray_cluster import LocalCluster  # noqa: E402

import fastmem  # noqa: E402
import fastmem.ray as fray  # noqa: E402
from fastmem.ray import jobs  # noqa: E402

WORDS = ("invoice flight hotel budget dinner meeting project deadline garden recipe cat bank "
         "train museum doctor insurance contract laptop birthday concert").split()  # fmt: skip


WAIT = 0.15  # --wait-ms


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def router(cluster: LocalCluster, queries: int) -> dict[str, float]:
    c = fray.connect(cluster.address, root=os.path.join(cluster.dir, "router"), shards=4, name="router")
    try:
        store = c.open("bench")
        for start in range(0, 2000, 500):
            store.add_many([{"text": f"{WORDS[i % 20]} {WORDS[(i * 7) % 20]} note {i}", "session": f"s{i % 9}"}
                            for i in range(start, start + 500)])  # fmt: skip
        path = os.path.dirname(c.deployment.store_path(c.deployment.root, "bench"))
        local = fastmem.open(path, namespace="bench", embedder=None, readonly=True)
        remote_ms, local_ms = [], []
        for i in range(queries + 20):
            q = f"{WORDS[i % 20]} {WORDS[(i * 3) % 20]}"
            t = time.perf_counter()
            a = store.search(q, k=10, mode="keyword")
            r = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            b = local.search(q, k=10, mode="keyword")
            m = (time.perf_counter() - t) * 1e3
            assert [h.id for h in a] == [h.id for h in b]
            if i >= 20:  # warm-up left out
                remote_ms.append(r)
                local_ms.append(m)
        local.close()
        return {"in_process_p50_ms": pct(local_ms, 50), "in_process_p95_ms": pct(local_ms, 95),
                "router_p50_ms": pct(remote_ms, 50), "router_p95_ms": pct(remote_ms, 95),
                "overhead_p95_ms": pct(remote_ms, 95) - pct(local_ms, 95)}  # fmt: skip
    finally:
        c.shutdown()


class SlowEndpoint:
    """An embedder that waits WAIT seconds per batch, as a remote endpoint would."""

    name, dim = "slow-endpoint", 16

    def encode(self, texts):
        import numpy as np

        time.sleep(WAIT)
        out = np.ones((len(texts), 16), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row, len(text) % 16] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def fanout(cluster: LocalCluster, stores: int, nodes: list[str]) -> float:
    name = f"fan{len(nodes)}"
    c = fray.connect(cluster.address, root=os.path.join(cluster.dir, name + "-{node}"), mode="local",
                     nodes=nodes, shards=8, name=name)  # fmt: skip
    try:
        names = [f"s{i:03d}" for i in range(stores)]
        for n in names:
            c.open(n).add_many([{"text": f"{n} {WORDS[j]} item {j}"} for j in range(20)])
        with tempfile.TemporaryDirectory() as tmp:
            jobs.run("verify", names, cluster=c, ledger=os.path.join(tmp, "warm.jsonl"))  # stores open
            t = time.perf_counter()
            summary = jobs.run("reembed", names, cluster=c, ledger=os.path.join(tmp, "l.jsonl"),
                               params={"embedder": SlowEndpoint}, concurrency=16)  # fmt: skip
            seconds = time.perf_counter() - t
        assert summary.ok, summary.failed
        return seconds
    finally:
        c.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--stores", type=int, default=48)
    parser.add_argument("--wait-ms", type=float, default=150.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    global WAIT
    WAIT = args.wait_ms / 1000
    cluster = LocalCluster(workers=3)
    os.environ.update(cluster.auth)
    try:
        ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, namespace="fastmem",
                 log_to_driver=False, logging_level="ERROR")  # fmt: skip
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        out = {"router": router(cluster, args.queries)}
        one = fanout(cluster, args.stores, ["w1"])
        three = fanout(cluster, args.stores, ["w1", "w2", "w3"])
        out["fanout"] = {"stores": args.stores, "wait_ms": args.wait_ms, "one_node_s": one, "three_nodes_s": three,
                         "speedup": one / three}  # fmt: skip
        out["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "ray": ray.__version__,
                          "fastmem": fastmem.__version__}  # fmt: skip
    finally:
        ray.shutdown()
        cluster.stop()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    r, f = out["router"], out["fanout"]
    print(f"search, keyword, k=10, 2,000 memories ({args.queries} queries)")
    print(f"  in-process      p50 {r['in_process_p50_ms']:.3f} ms  p95 {r['in_process_p95_ms']:.3f} ms")
    print(f"  through shard   p50 {r['router_p50_ms']:.3f} ms  p95 {r['router_p95_ms']:.3f} ms")
    print(f"  overhead at p95 {r['overhead_p95_ms']:.3f} ms")
    print(f"reembed of {f['stores']} stores, {f['wait_ms']:g} ms per embedder batch (latency-bound)")
    print(f"  1 node  {f['one_node_s']:.2f} s   3 nodes {f['three_nodes_s']:.2f} s   speed-up {f['speedup']:.2f}x")
    print(f"  ({out['machine']})")


if __name__ == "__main__":
    main()

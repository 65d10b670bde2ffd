"""fastmem on a real Ray cluster: a head and 3 worker nodes on this machine (each its own
`ray start` on 127.0.0.2..5 with its own `fastmem-node` label), started once for this
module and stopped by pid. Nodes are killed (SIGKILL), hung (SIGSTOP) and started again.

The tests run in the order written and share the cluster: each one that takes a node
down brings it back before it ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import fastmem

ray = pytest.importorskip("ray", reason="fastmem[ray] is not installed: pip install 'fastmem[ray]'")

from ray_cluster import LocalCluster

import fastmem.ray as fray
from fastmem.ray import _oplog, jobs
from fastmem.ray._backup import Backups

pytestmark = pytest.mark.xdist_group("ray-cluster")  # one cluster per test run, not per worker
T = 6.0  # the shards' lease (watchdog) seconds
NAMES = [f"u{i:03d}" for i in range(300)]


@pytest.fixture(autouse=True)
def backend():
    """Once, not once per kernel backend: the shards run in their own processes."""
    yield "default"


@pytest.fixture(scope="module")
def cluster():
    local = LocalCluster(workers=3)
    saved = {k: os.environ.get(k) for k in local.auth}
    os.environ.update(local.auth)
    try:
        ray.init(address=local.address, _node_ip_address=local.head_ip, namespace="fastmem",
                 log_to_driver=False, logging_level="ERROR")  # fmt: skip
        yield local
    finally:
        ray.shutdown()
        local.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def settings(local, **more):
    return {"root": os.path.join(local.dir, "shared"), "shards": 2, "name": "shared", "lease": T, **more}


@pytest.fixture(scope="module")
def shared(cluster):
    c = fray.connect(cluster.address, **settings(cluster))
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def stores(shared):
    """300 stores written through the router, 3 memories each: namespace -> ids."""

    def write(name):
        return shared.open(name).add_many([{"text": f"{name} memory {j}", "session": name} for j in range(3)])

    with ThreadPoolExecutor(16) as pool:
        return dict(zip(NAMES, pool.map(write, NAMES)))


@pytest.fixture
def alone(shared):
    """The module's deployment's shard actors stopped (its next use starts them again,
    from the same files): a test's own deployment has the cluster's memory to itself
    (each actor is a process of ~170 MB)."""
    shared.shutdown()


@contextlib.contextmanager
def fresh(cluster, name):
    """A new shared-storage deployment of 2 shards with 12 stores of 2 memories."""
    c = fray.connect(cluster.address, **settings(cluster, root=os.path.join(cluster.dir, name), name=name))
    try:
        for i in range(12):
            c.open(f"{name}-{i}").add_many([{"text": f"{name} {i} memory {j}"} for j in range(2)])
        yield c
    finally:
        c.shutdown()


def on_a_worker(c, cluster):
    """A shard served from a worker node (never the head), and that node's label.

    SPREAD is best effort: a worker restarted by an earlier test may not take actors yet,
    and both shards land on the head (CI saw it for the module's deployment too). Start
    them again (same files) until one is on a worker; a hang guard, not a speed bound."""
    for _ in range(30):
        for row in c.status():
            if row.get("node") in cluster.nodes and row["node"] != "head":
                return row["shard"], row["node"], row["pid"]
        c.shutdown()
        time.sleep(2)
        c.namespaces()  # starts the shard actors again
    pytest.fail(f"no shard on a worker node: {c.status()}")


def test_300_stores_written_through_the_router_read_back_by_another_client(cluster, stores):
    script = f"""
import json, fastmem.ray as fr
c = fr.connect({cluster.address!r}, node_ip_address={cluster.head_ip!r}, **{settings(cluster)!r})
print(json.dumps({{n: [[m.id, m.text] for m in c.open(n)] for n in {NAMES!r}}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False,
                         env={**cluster.env, "PYTHONPATH": str(Path(__file__).parents[1])})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    read = json.loads(out.stdout.strip().splitlines()[-1])
    assert read == {n: [[mid, f"{n} memory {j}"] for j, mid in enumerate(ids)] for n, ids in stores.items()}


def test_a_write_retried_with_the_same_op_id_is_stored_once(shared):
    store = shared.open("retried")
    items = [{"text": "paid the invoice", "type": "fact"}, {"text": "booked the flight"}]
    first = store.add_many(items, op_id="op-1")
    assert store.add_many(items, op_id="op-1") == first  # the retry: same ids, nothing added
    assert len(store) == 2
    # The answer was lost and the router sent again while the first attempt still ran: three
    # attempts in flight at once are one write.
    actor = shared.actor(store.shard)
    more = [{"text": "called the bank"}]
    answers = ray.get([actor.call.remote("retried", "add_many", (more,), {}, "op-2") for _ in range(3)])
    assert [a[0] for a in answers] == ["ok"] * 3 and len({tuple(a[1]) for a in answers}) == 1
    assert len(store) == 3
    # An attempt that arrives after the router gave up on it is refused, never applied late.
    status, error = ray.get(actor.call.remote("retried", "add_many", (more,), {}, "op-3", time.time() - 1))
    assert status == "err" and isinstance(error, fray.ShardUnavailableError)
    assert len(store) == 3
    # A store's own errors come back as themselves, and write nothing.
    with pytest.raises(fastmem.InvalidInputError):
        store.add_many([{"text": ""}], op_id="op-4")
    with pytest.raises(fastmem.UnknownMemoryError):
        store.get("m999")
    assert len(store) == 3


def test_the_command_line_shows_the_shards_and_runs_a_job(cluster, shared, stores, tmp_path):
    def fastmem_ray(*args):
        command = [sys.executable, "-m", "fastmem", "ray", *args, "--address", cluster.address,
                   "--node-ip-address", cluster.head_ip, "--root", shared.deployment.root,
                   "--name", "shared", "--shards", "2", "--json"]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False,
                             env={**cluster.env, "FASTMEM_RAY_JOBS": str(tmp_path / "jobs")})  # fmt: skip
        return out.returncode, json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else out.stderr

    code, rows = fastmem_ray("status")
    assert code == 0 and [r["shard"] for r in rows] == [0, 1] and all(r["serving"] for r in rows)
    code, summary = fastmem_ray("jobs", "run", "verify", "--all")
    assert code == 0 and summary["done"] == len(shared.namespaces()) and summary["failed"] == {}
    assert Path(summary["ledger"]).parent == tmp_path / "jobs"
    code, summary = fastmem_ray("jobs", "run", "export", "u000", "u001", "--dest", str(tmp_path / "out"))
    assert code == 0 and summary["done"] == 2
    lines = (tmp_path / "out" / "u001.jsonl").read_text().splitlines()
    assert [json.loads(line)["text"] for line in lines] == [f"u001 memory {j}" for j in range(3)]
    code, message = fastmem_ray("jobs", "run", "verify", "Not-A-Name")
    assert code == 2 and "not valid" in message


def test_idle_stores_freeze_to_object_storage_and_thaw_on_first_use(cluster, alone, tmp_path):
    pytest.importorskip("s3fs", reason="the cold tier needs s3fs: pip install 'fastmem[ray]'")
    from ray_cluster import moto_s3

    with moto_s3("127.0.0.7") as s3:
        cold = fray.connect(cluster.address, root=os.path.join(cluster.dir, "cold"), shards=2, name="cold",
                            lease=T, cold=s3["url"], cold_options=s3["options"], freeze_after=2.0,
                            idle_close=1.0)  # fmt: skip
        try:
            names = [f"c{i}" for i in range(6)]
            ids = {n: cold.open(n).add_many([{"text": f"{n} fact {j}", "type": "fact"} for j in range(4)])
                   for n in names}  # fmt: skip
            summary = jobs.run("freeze", names[:3], cluster=cold, ledger=str(tmp_path / "freeze.jsonl"))
            assert summary.failed == {} and summary.done == 3
            local = {n: Path(cold.deployment.store_path(cold.deployment.root, n), "memory.dat") for n in names}
            assert not any(local[n].exists() for n in names[:3])
            # The others freeze on their own once idle for freeze_after seconds.
            deadline = time.monotonic() + 30
            while any(local[n].exists() for n in names[3:]) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not any(local[n].exists() for n in names)
            assert sorted(cold.namespaces()) == names  # frozen stores are still the deployment's
            # First use thaws (sha256 checked); a thaw job thaws the rest.
            assert [m.id for m in cold.open("c0")] == ids["c0"] and local["c0"].exists()
            summary = jobs.run("thaw", names[1:3], cluster=cold, ledger=str(tmp_path / "thaw.jsonl"))
            assert summary.failed == {} and all(local[n].exists() for n in names[1:3])
            for n in names:
                assert [m.text for m in cold.open(n)] == [f"{n} fact {j}" for j in range(4)]
        finally:
            cold.shutdown()


def test_reembed_runs_one_model_per_node_not_per_shard(cluster, shared, stores, tmp_path):
    class Letters:  # defined here: Ray sends it to the nodes by value
        name, dim = "letters-v2", 26

        def encode(self, texts):
            import numpy as np

            out = np.full((len(texts), 26), 0.01, dtype=np.float32)
            for row, text in enumerate(texts):
                for ch in text.lower():
                    if "a" <= ch <= "z":
                        out[row, ord(ch) - 97] += 1
            return out / np.linalg.norm(out, axis=1, keepdims=True)

    seen: set[str] = set()

    def progress(finished, total, failed):
        seen.update(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith("fastmem-embed-reembed-test-"))  # fmt: skip

    names = NAMES[:40]
    summary = jobs.run("reembed", names, cluster=shared, job="reembed-test", ledger=str(tmp_path / "l.jsonl"),
                       params={"embedder": Letters}, progress=progress)  # fmt: skip
    assert summary.failed == {} and {r["embedder"] for r in summary.results.values()} == {"letters-v2"}
    shard_nodes = {row["node"] for row in shared.status() if row["shard"] in {shared.deployment.shard_of(n) for n in names}}
    assert 1 <= len(seen) <= len(shard_nodes)  # one model per node that served the job
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] in seen]  # stopped after
    store = shared.open(names[0])
    assert store.vector(stores[names[0]][1]).shape == (26,)
    assert [h.memory.text for h in store.search([1.0] * 26, k=1, mode="vector")]


def test_a_fleet_compact_survives_a_worker_node_killed_mid_job(cluster, shared, stores, tmp_path):
    with ThreadPoolExecutor(16) as pool:  # something to reclaim in every store
        list(pool.map(lambda n: shared.open(n).forget(stores[n][0]), NAMES))
    _, node, _ = on_a_worker(shared, cluster)
    killed = threading.Event()

    def progress(finished, total, failed):
        if finished >= total // 4 and not killed.is_set():
            killed.set()
            cluster.nodes[node].kill()

    ledger = tmp_path / "ledger.jsonl"
    summary = jobs.run("compact", "all", cluster=shared, job="compact-kill", ledger=str(ledger),
                       progress=progress, concurrency=8)  # fmt: skip
    assert killed.is_set()
    # Every store on disk, listed apart from the router: the 300 and those other tests made
    # ("retried" exists only if its test ran earlier on this cluster: the order may differ).
    on_disk = {p.parent.name for p in Path(shared.deployment.root).glob("*/*/memory.dat")}
    everything = sorted(on_disk | set(NAMES))
    assert summary.failed == {} and summary.done == len(everything) and summary.skipped == 0
    done = [json.loads(line)["ns"] for line in ledger.read_text().splitlines()[1:]]
    assert sorted(done) == everything  # each store once in the ledger
    for name in everything:  # ... and once in its shard's memory of what it applied
        path = Path(shared.deployment.store_path(shared.deployment.root, name), _oplog.FILE)
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        assert sum(e["op"] == f"compact-kill:{name}" and "result" in e for e in entries) == 1, name
    # Every store compacted (nothing forgotten left in its files) and nothing lost. (A
    # compaction that committed just before its node died, before the shard wrote its
    # result line, is run again by the retry: it then drops nothing. Every job operation is
    # idempotent, so the store ends the same; the ledger and the op log still say once.)
    with ThreadPoolExecutor(16) as pool:
        after = dict(zip(NAMES, pool.map(lambda n: ([m.id for m in shared.open(n)], shared.open(n).stats().forgotten),
                                         NAMES)))  # fmt: skip
    assert after == {n: (ids[1:], 0) for n, ids in stores.items()}
    # Run again with the same job id: the ledger says every store is done.
    again = jobs.run("compact", "all", cluster=shared, job="compact-kill", ledger=str(ledger))
    assert again.skipped == len(everything) and again.done == 0
    cluster.add_worker(node)


def test_a_shared_storage_shard_serves_again_on_another_node_within_30s(cluster, alone):
    with fresh(cluster, "failover") as shared:
        _failover(cluster, shared)


def _failover(cluster, shared):
    shard, node, _ = on_a_worker(shared, cluster)
    name = next(f"failover-{i}" for i in range(12) if shared.deployment.shard_of(f"failover-{i}") == shard)
    store = shared.open(name)
    before = [m.id for m in store]
    started = time.monotonic()
    cluster.nodes[node].kill()
    mid = store.add("written after its node died")
    elapsed = time.monotonic() - started
    assert elapsed < 30, elapsed
    assert shared.status()[shard]["node"] != node
    assert [m.id for m in store] == [*before, mid]
    print(f"shard {shard} served again {elapsed:.1f} s after node {node} was killed")
    cluster.add_worker(node)


def test_a_node_local_shard_is_unavailable_while_its_node_is_down(cluster, alone):
    local = fray.connect(cluster.address, root=os.path.join(cluster.dir, "local-{node}"), mode="local",
                         nodes=["w2", "w3"], shards=2, name="local", lease=T)  # fmt: skip
    try:
        name = next(f"n{i}" for i in range(1000) if local.deployment.node_of(local.deployment.shard_of(f"n{i}")) == "w3")
        store = local.open(name)
        mid = store.add("kept on w3's own disk", type="fact")
        assert (Path(local.deployment.store_path(os.path.join(cluster.dir, "local-w3"), name)) / "memory.dat").exists()
        assert local.status()[store.shard]["node"] == "w3"
        cluster.nodes["w3"].kill()
        impatient = fray.Cluster(local.deployment, retry_for=4, attempt_timeout=1)
        with pytest.raises(fray.ShardUnavailableError, match="did not answer"):
            impatient.open(name).get(mid)
        cluster.add_worker("w3")
        # The router retries until the shard is back. Ray restarts the actor once it has seen
        # the old node die and the new one join; under CI load that passed the default 60 s
        # once, so this handle waits longer, and says what Ray thought of the actor if not.
        patient = local.open(name, retry_for=180)
        try:
            assert patient.get(mid).text == "kept on w3's own disk"
        except fray.ShardUnavailableError as exc:
            from ray.util.state import list_actors

            actors = [(a.name, a.state, a.node_id) for a in list_actors(limit=1000) if a.name and "local" in a.name]
            raise AssertionError(f"{exc}; Ray's view of the shard actors: {actors}") from exc
        assert local.status()[store.shard]["node"] == "w3"
    finally:
        local.shutdown()


def test_a_hung_node_is_fenced_by_the_watchdog(cluster, alone):
    """The node's Ray processes stop (SIGSTOP); its shard's process runs on, cut off from
    the cluster. Its watchdog must close its stores and exit, and a new copy elsewhere serve."""
    with fresh(cluster, "hung") as shared:
        _hung(cluster, shared)


def _hung(cluster, shared):
    shard, node, old_pid = on_a_worker(shared, cluster)
    name = next(f"hung-{i}" for i in range(12) if shared.deployment.shard_of(f"hung-{i}") == shard)
    store = shared.open(name)
    before = [m.id for m in store]
    started = time.monotonic()
    os.killpg(cluster.nodes[node].pgid, signal.SIGSTOP)  # raylet and agents; not the actors
    try:
        deadline = started + T + 15
        while Path(f"/proc/{old_pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{old_pid}").exists(), "the hung node's shard is still running"
        fenced = time.monotonic() - started
        mid = store.add("written after the old copy was fenced")
        elapsed = time.monotonic() - started
        assert elapsed < T + 20, elapsed
        row = shared.status()[shard]
        assert row["node"] != node and row["pid"] != old_pid
        logs = "".join(p.read_text(errors="replace") for p in Path(cluster.dir).glob("session_*/logs/worker-*.out"))
        assert f"fastmem shard {shard}: stopping: no contact with the cluster" in logs
        assert [m.id for m in store] == [*before, mid]
        assert store.verify().ok
        print(f"shard {shard}: the hung copy exited after {fenced:.1f} s, a new one served after "
              f"{elapsed:.1f} s (T = {T:g} s)")
    finally:
        os.killpg(cluster.nodes[node].pgid, signal.SIGCONT)
        cluster.nodes[node].kill()
    cluster.add_worker(node)



def test_a_wholly_stopped_node_is_replaced_and_its_copy_stands_down_when_it_wakes(cluster, alone):
    """Every process of the node stops, the shard's too (a VM paused): nothing of it can
    act. A new copy serves once the old lease has run out; when the old copy wakes, it
    finds its lease gone and exits without touching a store."""
    with fresh(cluster, "paused") as shared:
        _paused(cluster, shared)


def _paused(cluster, shared):
    shard, node, old_pid = on_a_worker(shared, cluster)
    name = next(f"paused-{i}" for i in range(12) if shared.deployment.shard_of(f"paused-{i}") == shard)
    store = shared.open(name)
    before = [m.id for m in store]
    started = time.monotonic()
    cluster.nodes[node].signal(signal.SIGSTOP)
    try:
        mid = store.add("written while the old copy was stopped")
        elapsed = time.monotonic() - started
        assert elapsed < T + 20, elapsed
        assert shared.status()[shard]["pid"] != old_pid
    finally:
        cluster.nodes[node].signal(signal.SIGCONT)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{old_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{old_pid}").exists(), "the woken copy is still running"
    assert [m.id for m in store] == [*before, mid]
    assert store.verify().ok
    cluster.nodes[node].kill()
    cluster.add_worker(node)


@pytest.mark.parametrize("through", ["ray+gcs", "ray"])
def test_the_mcp_server_serves_a_store_of_the_cluster(cluster, shared, through):
    """As a driver on a node of the cluster (``ray+gcs://``), and from outside it through
    Ray Client's proxy on the head (``ray://``)."""
    mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed")
    user = f"mcp-{through.replace('+', '-')}"
    query = f"name=shared&shards=2&namespace={user}"
    with contextlib.ExitStack() as stack:
        if through == "ray+gcs":
            location = f"ray+gcs://{cluster.address}{shared.deployment.root}?{query}&node_ip={cluster.head_ip}"
        else:
            location = f"{stack.enter_context(cluster.client_proxy())}{shared.deployment.root}?{query}"
        _remember_and_search_over_mcp(mcp, cluster, location)
    assert [m.text for m in shared.open(user)] == ["The user's cat is called Miso."]


def _remember_and_search_over_mcp(mcp, cluster, location):
    import asyncio

    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "fastmem", "mcp", "--store", location],
                                   env={**cluster.env, "PYTHONPATH": str(Path(__file__).parents[1])})  # fmt: skip

    async def work():
        async with stdio_client(params) as (read, write), mcp.ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("remember", {"text": "The user's cat is called Miso.", "type": "fact"})
            found = await session.call_tool("search", {"query": "cat", "mode": "keyword"})
            return json.loads(found.content[0].text)

    hits = asyncio.run(asyncio.wait_for(work(), 120))["hits"]
    assert [h["text"] for h in hits] == ["The user's cat is called Miso."]


def test_hermes_on_a_cluster_keeps_writes_while_its_shard_is_down(cluster, alone, tmp_path, caplog):
    """A Hermes provider writing through a location; the node of its (node-local) shard is
    killed mid-conversation: the turns wait in spill files on this machine, reads give an
    empty context, and once the node is back every turn is in the store exactly once."""
    from fastmem.integrations import _writer
    from fastmem.integrations.hermes import FastmemProvider

    root = os.path.join(cluster.dir, "hermes-{node}")
    location = (f"ray+gcs://{cluster.address}{root}?name=hermes&mode=local&nodes=w1,w2,w3&shards=2&lease={T:g}"
                f"&node_ip={cluster.head_ip}&namespace=hx")  # fmt: skip
    deployment = fray.Deployment(root=root, name="hermes", mode="local", nodes=("w1", "w2", "w3"), shards=2, lease=T)
    node = deployment.node_of(deployment.shard_of("hx.default"))
    reader = fray.Cluster(deployment)
    reader.namespaces()  # the shard actors are up before the conversation starts
    spill = tmp_path / "hermes" / "fastmem-spill" / "hx.default"
    provider = FastmemProvider(store=location)
    provider.initialize("s1", hermes_home=str(tmp_path / "hermes"), platform="cli")
    expected = []
    try:
        for i in range(3):
            provider.sync_turn(f"turn {i} before", "ok")
            expected.append(f"User: turn {i} before\nAssistant: ok")
        assert provider.flush(60)
        cluster.nodes[node].kill()
        for i in range(3):
            provider.sync_turn(f"turn {i} while {node} is down", "ok")
            expected.append(f"User: turn {i} while {node} is down\nAssistant: ok")
        reply = json.loads(provider.handle_tool_call("fastmem_remember", {"text": "The user's dog is Rex."}))
        assert reply["ok"] and reply.get("pending")
        expected.append("The user's dog is Rex.")
        assert provider.flush(60)  # in the store or in a spill file
        assert list(spill.glob(_writer.SPILL_GLOB))  # the shard is down: kept locally
        caplog.set_level(logging.WARNING, logger="fastmem")
        assert provider.prefetch("what is the dog called?") == ""  # no exception into the agent
        assert any("recall failed" in r.getMessage() for r in caplog.records)
        cluster.add_worker(node)
        deadline = time.monotonic() + 120
        while list(spill.glob(_writer.SPILL_GLOB)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not list(spill.glob(_writer.SPILL_GLOB)), "the kept writes were not replayed"
    finally:
        provider.shutdown()
    try:
        assert [m.text for m in reader.open("hx.default")] == expected  # each once, in order
        assert reader.status()[deployment.shard_of("hx.default")]["node"] == node
    finally:
        reader.shutdown()


def test_node_local_stores_backed_up_while_serving_are_restored_after_a_disk_is_lost(cluster, alone, tmp_path):
    def deployment(name):
        return fray.connect(cluster.address, root=os.path.join(cluster.dir, "backed-{node}"), mode="local",
                            nodes=["w1", "w2", "w3"], shards=4, name=name, lease=T)  # fmt: skip

    dest = str(tmp_path / "backups")  # any fsspec URL; S3 itself: tests/test_ray.py against moto
    names = [f"b{i}" for i in range(8)]
    c = deployment("backed")
    try:
        ids = {n: c.open(n).add_many([{"text": f"{n} fact {j}", "type": "fact"} for j in range(3)]) for n in names}
        ledger = str(tmp_path / "backup.jsonl")
        summary = jobs.run("backup", "all", cluster=c, params={"dest": dest}, ledger=ledger)
        assert summary.failed == {} and summary.done == 8
        again = jobs.run("backup", "all", cluster=c, params={"dest": dest}, ledger=ledger, job=summary.job)
        assert again.skipped == 8 and again.done == 0  # the ledger: one backup per store per run
        pruning = jobs.run("backup", "all", cluster=c, params={"dest": dest, "keep": 1}, ledger=str(tmp_path / "b2.jsonl"))
        assert pruning.failed == {} and all(len(r["pruned"]) == 1 for r in pruning.results.values())
        assert all(len(Backups(dest).generations(n)) == 1 for n in names)
        lost = [n for n in names if c.deployment.node_of(c.deployment.shard_of(n)) == "w3"]
        assert lost
        late = c.open(lost[0]).add("written after the backup", type="fact")  # the store served on
    finally:
        c.shutdown()
    # w3's disk is gone for good; a new node with its label (here: w3 itself) starts empty.
    shutil.rmtree(os.path.join(cluster.dir, "backed-w3"))
    c = deployment("backed-again")
    try:
        summary = jobs.run("restore", "all", cluster=c, params={"dest": dest}, ledger=str(tmp_path / "r.jsonl"))
        assert summary.failed == {} and sorted(summary.results) == sorted(lost)  # only what was missing
        for n in names:
            assert [m.id for m in c.open(n)] == ids[n]  # every backed-up memory, the late write lost
        assert late not in c.open(lost[0])
        refused = jobs.run("restore", lost[:1], cluster=c, params={"dest": dest}, ledger=str(tmp_path / "r2.jsonl"))
        assert "RestoreRefusedError" in refused.failed[lost[0]]  # never over a store that is there
    finally:
        c.shutdown()

"""fastmem.ray's parts that need no cluster: the slot map, the operation log, the lease,
the cold tier against a real S3 emulator (moto's server on loopback), and that core fastmem
never imports Ray. The cluster itself: tests/test_ray_cluster.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import fastmem
import fastmem.ray
from fastmem.ray import _lease, _oplog
from fastmem.ray._config import SLOTS, Deployment, slot_of


@pytest.fixture(autouse=True)
def backend():
    """Once, not once per kernel backend: the kernels are not what these test."""
    yield "default"


def test_importing_fastmem_does_not_import_ray_or_fsspec():
    code = "import sys, fastmem, fastmem.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 's3fs', 'fsspec') or m.startswith('fastmem.ray')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_a_namespace_maps_to_the_same_slot_forever():
    # The first byte of SHA-256: pinned values, so a release that changed the map fails here.
    assert [slot_of(n) for n in ("alice", "bob", "u000", "u299")] == [
        hashlib.sha256(n.encode()).digest()[0] for n in ("alice", "bob", "u000", "u299")
    ]
    assert slot_of("alice") == 0x2b
    counts = [0] * SLOTS
    for i in range(25600):
        counts[slot_of(f"user-{i}")] += 1
    assert min(counts) > 50 and max(counts) < 160  # spread evenly


def test_a_slot_belongs_to_exactly_one_shard():
    d = Deployment(root="/x", shards=8)
    owners = [next(s for s in range(8) if slot in d.slots_of(s)) for slot in range(SLOTS)]
    assert owners == [slot % 8 for slot in range(SLOTS)]
    assert d.shard_of("alice") == slot_of("alice") % 8


@pytest.mark.parametrize("bad", [{"shards": 3}, {"shards": 0}, {"mode": "nfs"}, {"mode": "local"},
                                 {"root": ""}, {"name": "Bad Name"}, {"lease": 0}, {"embedder": 3}])  # fmt: skip
def test_a_bad_deployment_is_refused(bad):
    with pytest.raises(fastmem.InvalidInputError):
        Deployment(**{"root": "/x", **bad})


def test_local_mode_pins_each_shard_to_a_node():
    d = Deployment(root="/data/{node}/fastmem", mode="local", shards=4, nodes=["a", "b", "c"])
    assert [d.node_of(s) for s in range(4)] == ["a", "b", "c", "a"]
    assert d.root_on("b") == "/data/b/fastmem"


# --- the operation log: exactly-once retries ----------------------------------------------


def _items(n, tag="x"):
    return [{"text": f"memory {tag} {i}", "type": "fact"} for i in range(n)]


def test_a_shard_writes_a_supersedes_link_with_its_memory(tmp_path):
    """A cluster store's ``add(..., supersedes=)`` reaches the shard as a batch of one item:
    the shard writes it with ``add`` (``add_many`` takes no link); other batches as before."""
    from fastmem.ray._shard import add_items

    with fastmem.open(str(tmp_path / "s"), embedder=None) as store:
        [old] = add_items(store, [{"text": "The user lives in Paris.", "type": "fact"}])
        [new] = add_items(store, [{"text": "The user moved to Berlin.", "supersedes": old}])
        assert store.get(old).metadata == {"superseded_by": new}
        assert add_items(store, _items(2)) == [f"m{int(new[1:]) + 1}", f"m{int(new[1:]) + 2}"]
        with pytest.raises(fastmem.InvalidInputError, match="unknown keys"):
            add_items(store, [{"text": "x", "supersedes": old, "colour": "red"}])


def test_the_op_log_remembers_results_across_reopen(tmp_path):
    log = _oplog.OpLog(str(tmp_path))
    log.intent("op1", _items(2))
    log.finish("op1", ["m0", "m1"], ids=["m0", "m1"])
    log.finish("op2", {"ok": True})
    log.close()
    with open(tmp_path / _oplog.FILE, "ab") as f:
        f.write(b'{"op": "torn", "res')  # a write cut by a kill: skipped
    again = _oplog.OpLog(str(tmp_path))
    assert again.done == {"op1": ["m0", "m1"], "op2": {"ok": True}}
    assert again.intents == {} and again.max_id == 1
    again.close()


def test_a_write_that_happened_before_its_result_was_logged_is_found_not_repeated(tmp_path):
    """The shard died between the store's write and the log's result line: the retry
    finds the batch by its fingerprints among the memories written after the intent."""
    with fastmem.open(tmp_path, namespace="alice", embedder=None) as store:
        log = _oplog.OpLog(str(tmp_path / "alice"))
        first = store.add_many(_items(3, "a"))
        log.finish("op-a", first, ids=first)
        log.intent("op-b", _items(2, "b"))
        written = store.add_many(_items(2, "b"))  # ... and the process dies here
        log.close()
        log = _oplog.OpLog(str(tmp_path / "alice"))
        assert "op-b" in log.intents
        assert log.recover("op-b", store) == written
        # An intent whose write never happened: nothing found, so the shard writes it.
        log.intent("op-c", _items(2, "c"))
        assert log.recover("op-c", store) is None
        # The same texts written earlier than the intent are not taken for this batch.
        log.intent("op-d", _items(3, "a"))
        assert log.recover("op-d", store) is None
        log.close()


def test_an_abandoned_intent_is_forgotten(tmp_path):
    log = _oplog.OpLog(str(tmp_path))
    log.intent("bad", _items(1))
    log.abandon("bad")
    log.close()
    again = _oplog.OpLog(str(tmp_path))
    assert again.intents == {} and "bad" not in again.done
    again.close()


def test_the_op_log_keeps_a_bounded_number_of_results(tmp_path, monkeypatch):
    monkeypatch.setattr(_oplog, "KEEP", 10)
    log = _oplog.OpLog(str(tmp_path))
    for i in range(35):
        log.finish(f"op{i}", i, ids=[f"m{i}"])
    log.close()
    again = _oplog.OpLog(str(tmp_path))
    assert "op34" in again.done and "op0" not in again.done and again.max_id == 34
    assert len((tmp_path / _oplog.FILE).read_text().splitlines()) <= 2 * 10 + 1
    again.close()


# --- the lease ----------------------------------------------------------------------------


def test_one_copy_holds_the_lease_and_a_stopped_copy_loses_it(tmp_path, monkeypatch):
    # The lease's wall clock, moved by the test: a real 0.6 s lease could run out between
    # two lines on a loaded machine.
    clock = [1.7e9]
    monkeypatch.setattr(_lease, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    a = _lease.Lease(str(tmp_path), 7, "copy-a", seconds=0.6)
    b = _lease.Lease(str(tmp_path), 7, "copy-b", seconds=0.6)
    assert a.acquire() and a.valid()
    assert b.acquire() is False and not b.valid()
    clock[0] += 0.7  # a stops renewing (its process is stopped)
    assert not a.valid()
    assert b.acquire() and b.valid()
    with pytest.raises(_lease.LeaseLost):
        a.acquire()  # a wakes up: it must stop, not serve
    b.release()
    assert b.holder() is None


# --- the cold tier against a real S3 emulator ---------------------------------------------


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.6 with a bucket; stopped by its pid."""
    pytest.importorskip("s3fs", reason="the cold tier's S3 tests need s3fs: pip install 'fastmem[ray]'")
    if not Path(sys.executable).with_name("moto_server").exists():
        pytest.skip("moto_server is not installed: pip install 'moto[server]'")
    from ray_cluster import moto_s3

    with moto_s3() as s3:
        yield s3


def _cold(s3):
    from fastmem.ray._cold import ColdTier

    return ColdTier(s3["url"], {**s3["options"], "skip_instance_cache": True})


def test_freeze_then_thaw_brings_back_the_same_files(tmp_path, s3):
    with fastmem.open(tmp_path / "a", namespace="alice", embedder=None) as store:
        ids = store.add_many(_items(20))
    directory = str(tmp_path / "a" / "alice")
    before = {n: Path(directory, n).read_bytes() for n in ("memory.dat", "memory.idx")}
    cold = _cold(s3)
    result = cold.freeze("alice", directory, "node-a")
    assert result["bytes"] > 0 and not Path(directory, "memory.dat").exists()
    manifest = cold.manifest("alice")
    assert manifest["files"]["memory.dat"]["sha256"] == hashlib.sha256(before["memory.dat"]).hexdigest()
    assert cold.frozen("alice")
    cold.thaw("alice", str(tmp_path / "b" / "alice"), "node-b")
    assert Path(tmp_path / "b" / "alice" / "memory.dat").read_bytes() == before["memory.dat"]
    with fastmem.open(tmp_path / "b", namespace="alice", embedder=None) as store:
        assert [store.get(i).text for i in ids] == [f"memory x {i}" for i in range(20)]
        assert store.verify().ok
    assert cold.owner("alice") == "node-b" and not cold.frozen("alice")
    cold.freeze("alice", str(tmp_path / "b" / "alice"), "node-b")  # back for the next tests


def test_a_second_owner_is_refused(tmp_path, s3):
    with fastmem.open(tmp_path / "a", namespace="bob", embedder=None) as store:
        store.add_many(_items(3))
    cold = _cold(s3)
    cold.freeze("bob", str(tmp_path / "a" / "bob"), "node-a")
    # Two nodes thaw at once: the conditional create lets exactly one of them own it.
    outcomes: list[object] = []

    def thaw(node):
        try:
            outcomes.append(_cold(s3).thaw("bob", str(tmp_path / node / "bob"), node))
        except Exception as exc:  # noqa: BLE001 - which error is the assertion
            outcomes.append(exc)

    threads = [threading.Thread(target=thaw, args=(n,)) for n in ("node-b", "node-c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == 1 and isinstance(refused[0], fastmem.ray.StoreOwnedElsewhereError), outcomes
    winner = cold.owner("bob")
    loser = "node-c" if winner == "node-b" else "node-b"
    assert not Path(tmp_path / loser / "bob" / "memory.dat").exists()
    with pytest.raises(fastmem.ray.StoreOwnedElsewhereError, match=winner):
        cold.thaw("bob", str(tmp_path / "d" / "bob"), "node-d")


def test_a_damaged_frozen_file_is_refused_and_nothing_replaced(tmp_path, s3):
    with fastmem.open(tmp_path / "a", namespace="carol", embedder=None) as store:
        store.add_many(_items(5))
    cold = _cold(s3)
    cold.freeze("carol", str(tmp_path / "a" / "carol"), "node-a")
    generation = cold.manifest("carol")["generation"]
    key = cold._key("carol", generation, "memory.dat")
    data = bytearray(cold.fs.cat_file(key))
    data[-3] ^= 0xFF  # bit rot in the bucket
    cold.fs.pipe_file(key, bytes(data))
    with pytest.raises(fastmem.ray.ColdChecksumError, match="sha256"):
        cold.thaw("carol", str(tmp_path / "b" / "carol"), "node-b")
    assert sorted(os.listdir(tmp_path / "b" / "carol")) == []  # no half-thawed file
    assert cold.owner("carol") is None and cold.frozen("carol")  # the claim was given back
    assert json.loads(cold.fs.cat_file(cold._key("carol", "manifest.json")))["generation"] == generation


# --- backups of node-local stores (the same S3 emulator) ------------------------------------


def _backups(s3):
    from fastmem.ray._backup import Backups

    return Backups(s3["url"].replace("/fleet", "/backups"), {**s3["options"], "skip_instance_cache": True})


def test_a_backup_of_a_serving_store_restores_what_it_held(tmp_path, s3):
    backups = _backups(s3)
    with fastmem.open(tmp_path / "a", namespace="dave", embedder=None) as store:
        ids = store.add_many(_items(30))
        put = backups.put(store, "dave", scratch=str(tmp_path / "scratch"))
        later = store.add("written after the backup", type="fact")  # the store went on serving
        assert store.get(later).text == "written after the backup"
    assert put["memories"] == 30 and put["url"].endswith(f"/dave/{put['generation']}")
    assert os.listdir(tmp_path / "scratch") == []  # the local copy is gone once uploaded
    manifest = json.loads(backups.fs.cat_file(backups._key("dave", put["generation"], "manifest.json")))
    assert set(manifest["files"]) == {"memory.dat", "memory.idx"}
    result = backups.restore("dave", str(tmp_path / "b" / "dave"))
    assert result["generation"] == put["generation"]
    with fastmem.open(tmp_path / "b", namespace="dave", embedder=None) as store:
        assert [store.get(i).text for i in ids] == [f"memory x {i}" for i in range(30)]
        assert later not in store and store.verify().ok
    # A store is never silently replaced: the files are there now.
    with pytest.raises(fastmem.ray.RestoreRefusedError, match="already holds"):
        backups.restore("dave", str(tmp_path / "b" / "dave"))


def test_restore_takes_the_newest_complete_backup_and_skips_an_unfinished_one(tmp_path, s3):
    backups = _backups(s3)
    with fastmem.open(tmp_path / "a", namespace="erin", embedder=None) as store:
        store.add_many(_items(3))
        first = backups.put(store, "erin", scratch=str(tmp_path))
        store.add_many(_items(4, "y"))
        second = backups.put(store, "erin", scratch=str(tmp_path))
    # An upload that died before its manifest: newer by name, files present, never restored.
    unfinished = "29991231T000000.000000Z-dead00"
    for name in ("memory.dat", "memory.idx"):
        backups.fs.pipe_file(backups._key("erin", unfinished, name), b"half an upload")
    assert backups.generations("erin") == sorted([first["generation"], second["generation"]], reverse=True)
    assert backups.restore("erin", str(tmp_path / "b" / "erin"))["generation"] == second["generation"]
    with fastmem.open(tmp_path / "b", namespace="erin", embedder=None) as store:
        assert len(store) == 7
    assert backups.restore("erin", str(tmp_path / "c" / "erin"), first["generation"])["memories"] == 3
    with pytest.raises(fastmem.StoreNotFoundError, match="named"):
        backups.restore("erin", str(tmp_path / "d" / "erin"), unfinished)
    with pytest.raises(fastmem.StoreNotFoundError, match="no complete backup"):
        backups.restore("nobody", str(tmp_path / "d" / "nobody"))
    assert "erin" in backups.namespaces() and "nobody" not in backups.namespaces()


def test_a_bit_rotted_backup_is_refused_and_nothing_installed(tmp_path, s3):
    backups = _backups(s3)
    with fastmem.open(tmp_path / "a", namespace="frank", embedder=None) as store:
        store.add_many(_items(5))
        older = backups.put(store, "frank", scratch=str(tmp_path))
        newest = backups.put(store, "frank", scratch=str(tmp_path))
    key = backups._key("frank", newest["generation"], "memory.idx")
    data = bytearray(backups.fs.cat_file(key))
    data[len(data) // 2] ^= 0x01  # one bit of rot in the bucket
    backups.fs.pipe_file(key, bytes(data))
    target = tmp_path / "b" / "frank"
    with pytest.raises(fastmem.ray.BackupChecksumError, match=older["generation"]) as raised:
        backups.restore("frank", str(target))
    assert "memory.idx" in str(raised.value) and "sha256" in str(raised.value)
    assert os.listdir(target) == []  # no half-restored file
    assert backups.restore("frank", str(target), older["generation"])["memories"] == 5  # the way out it names


def test_pruning_keeps_the_newest_backups_and_uploads_that_may_still_be_running(tmp_path, s3):
    import time

    backups = _backups(s3)
    with fastmem.open(tmp_path / "a", namespace="hank", embedder=None) as store:
        made = []
        for i in range(4):
            store.add(f"memory {i}")
            made.append(backups.put(store, "hank", scratch=str(tmp_path))["generation"])

    def unfinished(name):
        backups.fs.pipe_file(backups._key("hank", name, "memory.dat"), b"half an upload")
        return name

    dead = unfinished("20000101T000000.000000Z-dead00")  # died long ago
    running = unfinished(time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() - 60)) + ".000000Z-live00")
    newer = unfinished("29991231T000000.000000Z-live01")
    assert backups.prune("hank", 2) == sorted([made[0], made[1], dead])
    assert backups.generations("hank") == [made[3], made[2]]
    left = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in backups.fs.glob(backups._key("hank", "*")))
    assert left == sorted([made[2], made[3], running, newer])  # an upload under way is not touched
    assert backups.prune("hank", 2) == []
    assert backups.restore("hank", str(tmp_path / "b" / "hank"))["memories"] == 4
    with pytest.raises(fastmem.StoreNotFoundError, match="named"):
        backups.restore("hank", str(tmp_path / "c" / "hank"), made[0])


@pytest.mark.parametrize("op, keep", [("backup", 0), ("backup", "2"), ("backup", True), ("compact", 2)])
def test_keep_is_a_positive_count_for_backups_only(op, keep, tmp_path):
    from fastmem.ray import jobs

    with pytest.raises(fastmem.InvalidInputError, match="keep"):  # before connecting: no cluster here
        jobs.run(op, "all", params={"dest": str(tmp_path), "keep": keep}, ledger=str(tmp_path / "l.jsonl"))
    assert not (tmp_path / "l.jsonl").exists()


def test_backups_and_the_cold_tier_work_on_a_plain_directory_too(tmp_path):
    # fsspec's local file system makes no parent directories by itself (S3 has none to make).
    from fastmem.ray._backup import Backups
    from fastmem.ray._cold import ColdTier

    with fastmem.open(tmp_path / "a", namespace="gina", embedder=None) as store:
        store.add_many(_items(2))
        Backups(f"file://{tmp_path}/backups").put(store, "gina", scratch=str(tmp_path))
    assert Backups(str(tmp_path / "backups")).restore("gina", str(tmp_path / "b" / "gina"))["memories"] == 2
    cold = ColdTier(f"file://{tmp_path}/cold")
    cold.freeze("gina", str(tmp_path / "b" / "gina"), "node-a")
    cold.thaw("gina", str(tmp_path / "c" / "gina"), "node-b")
    with fastmem.open(tmp_path / "c", namespace="gina", embedder=None) as store:
        assert len(store) == 2


@pytest.mark.parametrize("op", ["export", "backup", "restore"])
def test_a_job_that_writes_or_reads_a_destination_needs_one_before_it_starts(op, tmp_path):
    from fastmem.ray import jobs

    with pytest.raises(fastmem.InvalidInputError, match="dest"):  # before connecting: no cluster here
        jobs.run(op, "all", params={}, ledger=str(tmp_path / "l.jsonl"))
    assert not (tmp_path / "l.jsonl").exists()


def test_the_command_line_takes_backup_and_restore_with_their_locations():
    from fastmem.ray.cli import _parser

    backup = _parser().parse_args(["jobs", "run", "backup", "--all", "--dest", "s3://b/p", "--keep", "7"])
    assert (backup.op, backup.all, backup.dest, backup.keep) == ("backup", True, "s3://b/p", 7)
    restore = _parser().parse_args(["jobs", "run", "restore", "alice", "--from", "s3://b/p", "--generation", "g1"])
    assert (restore.op, restore.namespaces, restore.dest, restore.generation) == ("restore", ["alice"], "s3://b/p", "g1")


@pytest.mark.parametrize("location, message", [
    ("/a/path", "starts with"),
    ("ray+gcs://10.0.0.1:6379/data", "namespace"),
    ("ray+gcs://10.0.0.1:6379/data?namespace=alice&colour=red", "unknown setting"),
    ("ray+gcs://10.0.0.1:6379/data?namespace=alice&shards=many", "must be a number"),
    ("ray+gcs:///data?namespace=alice", "HOST:PORT"),
])  # fmt: skip
def test_a_bad_cluster_location_is_refused_before_connecting(location, message):
    with pytest.raises(fastmem.InvalidInputError, match=message):
        fastmem.ray.open_location(location)


def test_fleet_jobs_are_reached_from_the_package_as_documented():
    """``fastmem.ray.jobs.run(...)`` after ``import fastmem.ray`` (it raised AttributeError
    unless ``fastmem.ray.jobs`` had been imported by something else)."""
    script = "import fastmem.ray; print(callable(fastmem.ray.jobs.run))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert out.stdout.split() == ["True"], out.stderr


class _RefusingRay:
    """``ray.init`` refused ``refusals`` times the way Ray Client's proxy refuses a client
    whose server it failed to start, then accepted."""

    def __init__(self, refusals: int, error: type[Exception] = ConnectionAbortedError) -> None:
        self.refusals, self.error, self.calls = refusals, error, 0

    def init(self, **kwargs):
        self.calls += 1
        if self.calls <= self.refusals:
            raise self.error("Initialization failure from server:\nTraceback ...\nRuntimeError: Starting Ray client server failed.")


def test_a_ray_client_refused_while_its_server_starts_is_tried_again(monkeypatch):
    from fastmem.ray import _router

    monkeypatch.setattr(_router.time, "sleep", lambda s: None)
    ray = _RefusingRay(refusals=2)
    _router._join(ray, "ray://head:10001", {})
    assert ray.calls == 3
    ray = _RefusingRay(refusals=3)
    with pytest.raises(fastmem.ray.ClusterUnreachableError, match="Initialization failure .* Starting Ray client server failed"):
        _router._join(ray, "ray://head:10001", {})
    assert ray.calls == _router.CLIENT_TRIES
    for address, error in (("head:6379", ConnectionAbortedError), ("ray://head:10001", ConnectionError)):
        ray = _RefusingRay(refusals=1, error=error)  # only Ray Client's refusal is tried again
        with pytest.raises(fastmem.ray.ClusterUnreachableError):
            _router._join(ray, address, {})
        assert ray.calls == 1


def _ray_status(address: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ray", reason="fastmem[ray] is not installed")  # the command needs it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "fastmem", "ray", "status", "--address", address, "--root", str(tmp_path)]
    # The timeout guards against a hang (Ray's own join waits a minute or more); it bounds
    # nothing: the command is expected to give up after a few seconds.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)


def test_ray_status_on_an_unused_port_says_nothing_answers(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _ray_status(f"127.0.0.1:{port}", tmp_path)
    assert out.returncode == 1, out.stderr
    assert f"nothing answers at 127.0.0.1:{port}" in out.stderr


def test_ray_status_on_a_port_that_accepts_but_never_answers_gives_up(tmp_path):
    """Something listens (a stuck process, another service) but no Ray cluster answers:
    ``ray.init`` would wait for its GCS for minutes; the probe asks for a gRPC reply."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)  # the kernel completes connections; nobody reads or writes them
        port = s.getsockname()[1]
        out = _ray_status(f"127.0.0.1:{port}", tmp_path)
    assert out.returncode == 1, out.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in out.stderr

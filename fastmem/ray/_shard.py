"""A shard: the actor that owns the stores of its slots on one node.

It opens a store on first use (thawing it from the cold tier when it is frozen there),
keeps the ``max_open`` most recently used ones open, closes those idle for ``idle_close``
seconds (and freezes those idle for ``freeze_after``), and applies each write at most once
per operation id (``_oplog``). It serves only while it holds its lease (``_lease``); a
watchdog thread renews the lease and checks that the cluster still counts this node alive,
and when either has failed for T seconds it closes every store and ends the process (Ray
starts a new copy, which waits for the lease).

This module is imported by the actor's process (and by the router to create actors); it
never runs in a process that has not asked for Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import fastmem

from ..embed import default_embedder
from ..errors import FastmemError, InvalidInputError, UnknownMemoryError
from ..export import memory_dict
from ..namespaces import list_namespaces
from ._backup import Backups
from ._cold import ColdTier
from ._config import LABEL, Deployment, slot_dir
from ._embed import embedder_on_node
from ._errors import RestoreRefusedError, ShardUnavailableError
from ._lease import Lease, LeaseLost
from ._oplog import OpLog

READS = frozenset({"get", "recent", "search", "context", "stats", "pinned", "largest", "info",
                   "verify", "vector", "count", "contains", "memories"})  # fmt: skip
WRITES = frozenset({"add_many", "update", "pin", "forget", "evict", "record_access", "flush",
                    "checkpoint"})  # fmt: skip
JOBS = frozenset({"compact", "verify", "export", "reembed", "freeze", "thaw", "backup", "restore", "wait"})
STATELESS_JOBS = frozenset({"freeze", "thaw"})  # idempotent by the store's state, not the log
RESTORED = "ray-restored.json"  # beside a restored store: which job op restored it


# The keys of ``MemoryStore.add``: a batch of one such item that supersedes another memory
# goes through ``add`` (``add_many`` takes no link; the link is written in the same append).
_ADD_KEYS = frozenset({"text", "type", "timestamp", "session", "importance", "pinned", "metadata",
                       "summary", "embedding", "supersedes"})  # fmt: skip


def add_items(store: Any, items: list[dict[str, Any]]) -> list[str]:
    """``store.add_many(items)``, or ``add`` for one item with a ``supersedes`` link."""
    if len(items) == 1 and items[0].get("supersedes") is not None and _ADD_KEYS.issuperset(items[0]):
        return [store.add(**items[0])]
    result: list[str] = store.add_many(items)
    return result


@dataclasses.dataclass
class _Open:
    store: Any
    ops: OpLog
    used: float
    busy: int = 0
    # Held from the op-id check to the result's line: a retry that overtakes its first
    # attempt (still running after the router gave up on it) waits, then finds the result.
    wlock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _plain(value: Any) -> Any:
    """A job's result as JSON-ready values (dataclasses and named tuples flattened)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Shard:
    """One shard's actor (``ray.remote`` is applied by the router)."""

    def __init__(self, deployment: Deployment, shard: int) -> None:
        import ray

        self.d = deployment
        self.shard = shard
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.node: str = str(ctx.get_node_labels().get(LABEL) or self.node_id[:12])
        self.root = deployment.root_on(deployment.node_of(shard) or self.node)
        self.owner = deployment.node_of(shard) or "shared"  # who owns a thawed store
        self.token = f"{socket.gethostname()}:{os.getpid()}:{self.node}:{uuid.uuid4().hex[:8]}"
        self.lease = Lease(os.path.join(self.root, "_shards"), shard, self.token, deployment.lease)
        self.cold = ColdTier(deployment.cold, deployment.cold_options) if deployment.cold else None
        self.stores: OrderedDict[str, _Open] = OrderedDict()
        self.lock = threading.Lock()
        self.opening: dict[str, threading.Lock] = {}
        self.embedder: Any = self._make_embedder(deployment.embedder)
        self.contact = time.monotonic()
        self.stopping = False
        self.started = time.time()
        self.served = 0
        threading.Thread(target=self._ping, name="fastmem-shard-ping", daemon=True).start()
        threading.Thread(target=self._watch, name="fastmem-shard-watchdog", daemon=True).start()

    # --- the watchdog ------------------------------------------------------------------

    def _ping(self) -> None:
        """Record when the cluster (its control store) last said this node is alive."""
        import ray

        while not self.stopping:
            try:
                if any(n["NodeID"] == self.node_id and n["Alive"] for n in ray.nodes()):
                    self.contact = time.monotonic()
            except Exception:  # noqa: BLE001, S110 - no answer is what the watchdog measures
                pass
            time.sleep(min(1.0, self.d.lease / 4))

    def _watch(self) -> None:
        while not self.stopping:
            try:
                self.lease.acquire()
            except LeaseLost as exc:
                self._stop(f"lease lost: {exc}")
            except OSError:
                pass  # the shared file system did not answer: the lease runs out on its own
            if self.lease.valid_until and not self.lease.valid():
                self._stop("the lease could not be renewed for T seconds")
            if time.monotonic() - self.contact > self.d.lease:
                self._stop(f"no contact with the cluster for {self.d.lease:g} s")
            self._housekeeping()
            time.sleep(min(1.0, self.d.lease / 4))

    def _stop(self, why: str) -> None:
        """Close every store and end the process: a copy that lost its lease or the
        cluster must not touch the stores again (Ray starts a new copy elsewhere)."""
        self.stopping = True
        with self.lock:
            for entry in self.stores.values():
                with contextlib.suppress(Exception):
                    entry.store.close()
                    entry.ops.close()
            self.stores.clear()
        with contextlib.suppress(Exception):
            self.lease.release()
        print(f"fastmem shard {self.shard}: stopping: {why}", flush=True)
        os._exit(1)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        idle = []
        with self.lock:
            for ns, entry in self.stores.items():
                if entry.busy == 0 and now - entry.used > self.d.idle_close:
                    idle.append(ns)
            for ns in idle:
                self._close(ns)
        if self.cold is not None and self.d.freeze_after is not None:
            for ns in self._local_namespaces():
                if ns not in self.stores and self._idle_for(ns) > self.d.freeze_after:
                    with contextlib.suppress(FastmemError, OSError):
                        self._freeze(ns)

    def _idle_for(self, namespace: str) -> float:
        try:
            return time.time() - os.stat(os.path.join(self._dir(namespace), "memory.dat")).st_mtime
        except FileNotFoundError:
            return 0.0

    # --- stores ------------------------------------------------------------------------

    def _make_embedder(self, spec: str | Callable[[], Any]) -> Any:
        if spec == "none":
            return None
        if spec == "default":
            return default_embedder()
        return spec() if callable(spec) else None

    def _dir(self, namespace: str) -> str:
        return self.d.store_path(self.root, namespace)

    def _close(self, namespace: str) -> None:
        entry = self.stores.pop(namespace, None)
        if entry is not None:
            try:
                entry.store.close()
            finally:
                entry.ops.close()

    def _acquire(self, namespace: str, create: bool = True) -> _Open:
        with self.lock:
            entry = self.stores.get(namespace)
            if entry is not None:
                self.stores.move_to_end(namespace)
                entry.busy += 1
                entry.used = time.monotonic()
                return entry
            gate = self.opening.setdefault(namespace, threading.Lock())
        with gate:
            with self.lock:
                entry = self.stores.get(namespace)
            if entry is None:
                entry = self._open(namespace, create)
                with self.lock:
                    self.stores[namespace] = entry
                    self._trim()
            with self.lock:
                entry.busy += 1
                entry.used = time.monotonic()
            return entry

    def _open(self, namespace: str, create: bool) -> _Open:
        directory = self._dir(namespace)
        if not os.path.exists(os.path.join(directory, "memory.dat")):
            if self.cold is not None and self.cold.manifest(namespace) is not None:
                self.cold.thaw(namespace, directory, self.owner)
            elif not create:
                raise fastmem.StoreNotFoundError(f"no store {namespace!r} in this deployment")
        parent = os.path.dirname(directory)
        store = fastmem.open(parent, namespace=namespace, embedder=self.embedder,
                             durability=self.d.durability)  # fmt: skip
        return _Open(store, OpLog(directory), time.monotonic())

    def _trim(self) -> None:
        while len(self.stores) > self.d.max_open:
            victim = next((ns for ns, e in self.stores.items() if e.busy == 0), None)
            if victim is None:
                return
            self._close(victim)

    def _release(self, entry: _Open) -> None:
        with self.lock:
            entry.busy -= 1
            entry.used = time.monotonic()

    def _local_namespaces(self) -> list[str]:
        found = []
        for slot in self.d.slots_of(self.shard):
            found += list_namespaces(os.path.join(self.root, slot_dir(slot)))
        return found

    # --- what the router calls ---------------------------------------------------------

    def _check(self, namespace: str, deadline: float | None) -> None:
        if self.stopping or not self.lease.valid():
            raise ShardUnavailableError(
                f"shard {self.shard} on {self.node} does not hold its lease yet (another copy "
                f"may still hold it; it runs out within {self.d.lease:g} s)"
            )
        if deadline is not None and time.time() > deadline:
            # The router gave up on this attempt (and will retry with the same op id, or
            # has told its caller that nothing was applied): never apply it late.
            raise ShardUnavailableError("the request arrived after its deadline")
        if self.d.shard_of(namespace) != self.shard:
            raise InvalidInputError(f"namespace {namespace!r} belongs to shard {self.d.shard_of(namespace)}")

    def call(self, namespace: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
             op: str | None = None, deadline: float | None = None) -> tuple[str, Any]:  # fmt: skip
        """Run ``method`` on ``namespace``'s store; ``("ok", value)`` or ``("err", error)``."""
        try:
            self._check(namespace, deadline)
            if method not in READS and method not in WRITES:
                raise InvalidInputError(f"{method!r} is not a store method the router serves")
            entry = self._acquire(namespace, create=method in WRITES)
            try:
                self.served += 1
                return "ok", self._run(entry, method, args, kwargs, op)
            finally:
                self._release(entry)
        except (FastmemError, OSError) as exc:  # the caller's error, raised on its side
            return "err", exc

    def _run(self, entry: _Open, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
             op: str | None) -> Any:  # fmt: skip
        store, ops = entry.store, entry.ops
        if method == "count":
            return len(store)
        if method == "contains":
            return args[0] in store
        if method == "memories":
            return list(store)
        if method not in WRITES or op is None:
            return getattr(store, method)(*args, **kwargs)
        with entry.wlock:
            return self._write_once(store, ops, method, args, kwargs, op)

    def _write_once(self, store: Any, ops: OpLog, method: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any], op: str) -> Any:  # fmt: skip
        if op in ops.done:
            return ops.done[op]
        if method == "add_many":
            items = list(args[0])
            found = ops.recover(op, store) if op in ops.intents else None
            if found is None:
                ops.intent(op, items)
                try:
                    found = add_items(store, items)
                except FastmemError:
                    ops.abandon(op)  # checked before anything is written: nothing was
                    raise
            ops.finish(op, found, ids=found)
            return found
        retried = op in ops.intents  # an attempt died after its intent line
        ops.intent(op, [])  # so a retry of a forget whose result line was never written knows
        try:
            result = getattr(store, method)(*args, **kwargs)
        except UnknownMemoryError:
            if method != "forget" or not retried:
                ops.abandon(op)
                raise
            result = None  # forgotten by the attempt that died before its result was written
        except FastmemError:
            ops.abandon(op)
            raise
        ops.finish(op, _plain(result))
        return result

    def job(self, namespace: str, op: str, job_op: str, params: dict[str, Any],
            deadline: float | None = None) -> tuple[str, Any]:  # fmt: skip
        """One store's part of a fleet job; applied once per ``job_op`` id."""
        try:
            self._check(namespace, deadline)
            if op not in JOBS:
                raise InvalidInputError(f"{op!r} is not a fleet job (one of {sorted(JOBS)})")
            if op == "freeze":
                return "ok", self._freeze(namespace)
            if op == "thaw":
                return "ok", self._thaw(namespace)
            if op == "restore":
                return "ok", self._restore(namespace, job_op, params)
            entry = self._acquire(namespace, create=False)
            try:
                if op == "backup":
                    return "ok", self._backup(entry, namespace, job_op, params)
                with entry.wlock:
                    if job_op in entry.ops.done:
                        return "ok", {**entry.ops.done[job_op], "remembered": True}
                    result = _plain(self._job(entry.store, namespace, op, params))
                    entry.ops.finish(job_op, result)
                    return "ok", result
            finally:
                self._release(entry)
        except (FastmemError, OSError) as exc:  # the caller's error, raised on its side
            return "err", exc

    def _job(self, store: Any, namespace: str, op: str, params: dict[str, Any]) -> Any:
        if op == "compact":
            return store.compact()
        if op == "verify":
            report = store.verify()
            return {"ok": report.ok, "problems": len(report.problems), "records": report.records}
        if op == "wait":  # a latency-bound stand-in (benchmarks): the store waits on I/O
            time.sleep(float(params.get("seconds", 0.05)))
            return {"memories": len(store)}
        if op == "reembed":  # the model runs in the node's one embed actor (fastmem.ray._embed)
            factory = params.get("embedder")
            embedder = embedder_on_node(str(params["job"]), self.node_id, factory if callable(factory) else None)
            return {"memories": store.reembed(embedder), "embedder": embedder.name}
        return self._export(store, namespace, params)

    def _export(self, store: Any, namespace: str, params: dict[str, Any]) -> dict[str, Any]:
        import fsspec  # type: ignore[import-untyped]

        dest = str(params.get("dest") or "")
        if not dest:
            raise InvalidInputError("export needs dest= (a directory or fsspec URL)")
        lines = [json.dumps(memory_dict(m), ensure_ascii=False) for m in store]
        data = ("\n".join(lines) + ("\n" if lines else "")).encode()
        fs, base = fsspec.core.url_to_fs(dest, **dict(params.get("options") or {}))
        target = f"{base.rstrip('/')}/{namespace}.jsonl"
        fs.makedirs(base, exist_ok=True)
        fs.pipe_file(target + ".tmp", data)
        fs.mv(target + ".tmp", target)  # a reader never sees half a file
        return {"memories": len(lines), "bytes": len(data), "path": target}

    def _backup(self, entry: _Open, namespace: str, job_op: str, params: dict[str, Any]) -> dict[str, Any]:
        """Outside the write lock, unlike the other jobs: writes go on while the copy is
        taken and uploaded (two attempts of one job op at once only make two backups)."""
        with entry.wlock:
            if job_op in entry.ops.done:
                return {**entry.ops.done[job_op], "remembered": True}
        backups = Backups(str(params.get("dest") or ""), params.get("options"))
        result = backups.put(entry.store, namespace, scratch=os.path.join(self.root, "_backup"))
        if params.get("keep"):
            result["pruned"] = backups.prune(namespace, int(params["keep"]))
        with entry.wlock:
            entry.ops.finish(job_op, result)
        return result

    def _restore(self, namespace: str, job_op: str, params: dict[str, Any]) -> dict[str, Any]:
        """Install the newest complete backup as the store's files on this node, never over
        a store that is here (or frozen in the cold tier)."""
        directory = self._dir(namespace)
        marker = os.path.join(directory, RESTORED)
        with self.opening.setdefault(namespace, threading.Lock()):  # no open of it meanwhile
            with contextlib.suppress(FileNotFoundError, ValueError), open(marker, "rb") as f:
                done = json.loads(f.read())
                if done.get("job_op") == job_op:  # a retry of the attempt that restored it
                    return {**done["result"], "remembered": True}
            if namespace in self.stores or os.path.exists(os.path.join(directory, "memory.dat")):
                raise RestoreRefusedError(f"store {namespace!r} already has files on {self.node} "
                                          f"({directory}): a restore never replaces a store")  # fmt: skip
            if self.cold is not None and self.cold.manifest(namespace) is not None:
                raise RestoreRefusedError(f"store {namespace!r} is in the cold tier: thaw it instead")
            backups = Backups(str(params.get("dest") or ""), params.get("options"))
            result = backups.restore(namespace, directory, params.get("generation"))
            with open(marker, "w") as f:
                json.dump({"job_op": job_op, "result": result}, f)
            return result

    def _freeze(self, namespace: str) -> dict[str, Any]:
        if self.cold is None:
            raise InvalidInputError("this deployment has no cold tier (cold=...)")
        directory = self._dir(namespace)
        gate = self.opening.setdefault(namespace, threading.Lock())
        with gate:
            with self.lock:
                entry = self.stores.get(namespace)
                if entry is not None and entry.busy:
                    raise ShardUnavailableError(f"store {namespace!r} is in use; freeze it later")
                self._close(namespace)
            if not os.path.exists(os.path.join(directory, "memory.dat")):
                if self.cold.manifest(namespace) is not None:
                    return {"frozen": "already"}
                raise fastmem.StoreNotFoundError(f"no store {namespace!r} in this deployment")
            result = self.cold.freeze(namespace, directory, self.owner)
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)  # what is left: the lock file, empty now
            return result

    def _thaw(self, namespace: str) -> dict[str, Any]:
        if self.cold is None:
            raise InvalidInputError("this deployment has no cold tier (cold=...)")
        entry = self._acquire(namespace, create=False)  # thaws when frozen
        self._release(entry)
        return {"thawed": True, "memories": len(entry.store)}

    def namespaces(self, deadline: float | None = None) -> tuple[str, Any]:
        """Every store of this shard: on disk, and frozen in the cold tier."""
        try:
            if self.stopping or not self.lease.valid():
                raise ShardUnavailableError(f"shard {self.shard} does not hold its lease yet")
            found = set(self._local_namespaces())
            if self.cold is not None:
                for slot in self.d.slots_of(self.shard):
                    found.update(self.cold.namespaces(slot))
            return "ok", sorted(found)
        except (FastmemError, OSError) as exc:
            return "err", exc

    def status(self) -> dict[str, Any]:
        return {"shard": self.shard, "node": self.node, "node_id": self.node_id, "pid": os.getpid(),
                "serving": self.lease.valid() and not self.stopping, "open": len(self.stores),
                "served": self.served, "up_seconds": round(time.time() - self.started, 1),
                "root": self.root}  # fmt: skip

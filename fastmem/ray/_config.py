"""A deployment's settings and the namespace -> slot -> shard map (no Ray needed here).

Every namespace hashes to one of :data:`SLOTS` (256) slots with SHA-256, never with
Python's ``hash()`` (salted per process), so the map is the same in every process, on
every node, in every release: a namespace's directory is ``<root>/<slot>/<namespace>/``
forever. A deployment runs ``shards`` actors (256 by default: one per slot); shard ``i``
owns the slots ``s`` with ``s % shards == i``. Fewer shards than slots keep the map of
namespaces to directories (so files never move) and only change which actor serves a
slot: on a small cluster each actor is a process (~100 MB), and 256 of them would not fit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import InvalidInputError
from ..namespaces import check_namespace

SLOTS = 256
MODES = ("shared", "local")
LABEL = "fastmem-node"  # the node label (and custom resource prefix) that pins local shards
RAY_NAMESPACE = "fastmem"  # Ray's own namespace for the named actors


def slot_of(namespace: str) -> int:
    """The slot (0-255) of ``namespace``: the first byte of its SHA-256."""
    return hashlib.sha256(check_namespace(namespace).encode()).digest()[0]


def slot_dir(slot: int) -> str:
    return f"{slot:02x}"


@dataclasses.dataclass(frozen=True)
class Deployment:
    """How a cluster's shards are laid out; the first client's settings create the actors.

    Args:
        name: the deployment's name (several can share a cluster): its actors are
            ``fastmem-<name>-NNN`` in Ray's namespace ``fastmem``.
        root: the directory of the stores: in ``"shared"`` mode one path every node sees
            (NFS, a cluster file system); in ``"local"`` mode a path on each node's own disk,
            where ``{node}`` (if present) is replaced by the node's label value.
        mode: ``"shared"`` (a shard restarts on any node) or ``"local"`` (shard ``i`` is
            pinned to the node labelled ``nodes[i % len(nodes)]``).
        shards: how many shard actors (a divisor of 256).
        nodes: ``"local"`` mode: the values of the ``fastmem-node`` label of the nodes
            that hold the stores.
        cold: an fsspec URL (``s3://bucket/prefix``, ``file:///...``) of the cold tier;
            ``None`` for none.
        cold_options: fsspec storage options for ``cold`` (endpoint, credentials).
        freeze_after: seconds a store may stay unused before its shard freezes it to
            ``cold`` (``None``: only a ``freeze`` job freezes).
        max_open: stores a shard keeps open (least recently used closed first).
        idle_close: seconds after which an unused open store is closed.
        lease: seconds T of the watchdog: a shard that cannot renew its lease or reach the
            cluster for T seconds closes its stores and exits; a new copy takes over after T.
        embedder: ``"none"`` (keyword-only stores), ``"default"`` (the packaged model) or a
            picklable callable returning an embedder (built once in each shard).
        durability: the stores' ``durability=`` (see ``fastmem.open``).
        concurrency: calls a shard runs at once (threads; stores are thread-safe).
    """

    root: str
    name: str = "default"
    mode: str = "shared"
    shards: int = SLOTS
    nodes: tuple[str, ...] = ()
    cold: str | None = None
    cold_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    freeze_after: float | None = None
    max_open: int = 64
    idle_close: float = 300.0
    lease: float = 10.0
    embedder: str | Callable[[], Any] = "none"
    durability: str = "batch"
    concurrency: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.root, str) or not self.root:
            raise InvalidInputError("root must be a non-empty path")
        check_namespace(self.name)
        if self.mode not in MODES:
            raise InvalidInputError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not isinstance(self.shards, int) or self.shards < 1 or SLOTS % self.shards:
            raise InvalidInputError(f"shards must divide {SLOTS} (1, 2, 4, ... 256), not {self.shards!r}")
        if self.mode == "local" and not self.nodes:
            raise InvalidInputError("mode='local' needs nodes=[...]: the fastmem-node labels of the nodes")
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if self.lease <= 0 or self.max_open < 1 or self.concurrency < 1:
            raise InvalidInputError("lease, max_open and concurrency must be positive")
        if not (isinstance(self.embedder, str) and self.embedder in ("none", "default")) and not callable(
            self.embedder
        ):
            raise InvalidInputError("embedder must be 'none', 'default' or a callable returning one")

    def shard_of(self, namespace: str) -> int:
        return slot_of(namespace) % self.shards

    def slots_of(self, shard: int) -> list[int]:
        return list(range(shard, SLOTS, self.shards))

    def node_of(self, shard: int) -> str | None:
        """The label value of the node a ``"local"`` shard is pinned to."""
        return self.nodes[shard % len(self.nodes)] if self.mode == "local" else None

    def root_on(self, node: str | None) -> str:
        return self.root.replace("{node}", node or "shared")

    def store_path(self, root: str, namespace: str) -> str:
        """The directory that holds ``namespace``'s store (``memory.dat``/``.idx``) and the
        shard's small files beside it."""
        return os.path.join(root, slot_dir(slot_of(namespace)), check_namespace(namespace))


def actor_name(deployment: Deployment, shard: int) -> str:
    return f"fastmem-{deployment.name}-{shard:03d}"


def check_names(namespaces: Sequence[str]) -> list[str]:
    return [check_namespace(n) for n in namespaces]

"""A writer's target on a Ray cluster: the store a ``ray+gcs://`` / ``ray://`` location
names, served by its shard through :mod:`fastmem.ray`'s router (``fastmem[ray]``).

The writer (:mod:`fastmem.integrations._writer`) is the same as for a local store; only
where its writes go changes. A write the shard did not answer within :data:`WRITE_RETRY`
seconds (its node is down, it is restarting) is kept in a spill file on this machine and
replayed when the shard answers again. Every write is tried under an operation id given
before its first try and kept in the spill file; the shard remembers the ids it applied
(its op log), so a replay of a write whose answer was lost (applied, then the node died
before the answer arrived) is applied once: nothing lost, nothing twice.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastmem.errors import InvalidInputError
from fastmem.namespaces import check_namespace

from ._writer import LocalTarget

__all__ = ["SCHEMES", "ClusterTarget", "is_location", "store_namespace"]

SCHEMES = ("ray://", "ray+gcs://")
# A write's wait for its shard before it is kept in a spill file, and one attempt's: short,
# so that a turn is never held up and a shutdown is bounded (the writer joins for the
# shutdown timeout plus CALL_BOUND), and spilled writes are retried every idle tick.
WRITE_RETRY, WRITE_ATTEMPT = 2.0, 2.0
# A read's (prefetch, search): Hermes waits 8 s for a prefetch; a queued one that failed
# is computed again, so two must fit.
READ_RETRY, READ_ATTEMPT = 2.0, 3.0


def is_location(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEMES)


def store_namespace(location: str, namespace: str) -> str:
    """The namespace on the cluster of a profile's ``namespace`` (``default``,
    ``u-<hash>``): the location's ``?namespace=P`` is the profile's prefix, ``P.default``,
    ``P.u-<hash>`` (several profiles share one deployment without sharing stores)."""
    prefix = parse_qs(urlsplit(location).query).get("namespace", [""])[-1]
    return check_namespace(f"{prefix}.{namespace}" if prefix else namespace)


class _WithOp:
    """A remote store whose writes carry op ids derived from one: ``add``/``add_many``
    the op id itself (one batch per id), other writes the id and their arguments (a
    handler that forgets two memories makes two writes, each with its own id, the same in
    every replay of it)."""

    def __init__(self, store: Any, op_id: str | None) -> None:
        self._store, self._op = store, op_id

    def __getattr__(self, name: str) -> Any:  # reads: as the store's
        return getattr(self._store, name)

    def _sub(self, method: str, *args: Any) -> str | None:
        if self._op is None:
            return None
        digest = hashlib.sha256(json.dumps([method, *args], sort_keys=True, default=str).encode()).hexdigest()
        return f"{self._op}:{method}:{digest[:16]}"

    def add(self, text: str, **fields: Any) -> str:
        mid: str = self._store.add(text, op_id=self._op, **fields)
        return mid

    def add_many(self, items: Any) -> list[str]:
        ids: list[str] = self._store.add_many(items, op_id=self._op)
        return ids

    def forget(self, mid: str) -> None:
        self._store.forget(mid, op_id=self._sub("forget", mid))

    def pin(self, mid: str, pinned: bool = True) -> None:
        self._store.pin(mid, pinned, op_id=self._sub("pin", mid, pinned))

    def update(self, mid: str, **fields: Any) -> None:
        self._store.update(mid, op_id=self._sub("update", mid, fields), **fields)

    def record_access(self, ids: Any, now: float | None = None) -> None:
        self._store.record_access(ids, now, op_id=self._sub("record_access", list(ids), now))


class ClusterTarget(LocalTarget):
    """The store ``namespace`` of the deployment ``location`` names; its spill files go
    beside ``path`` (on this machine). Connects on first use, in the writer's thread (or
    a reader's), never in the constructor: a Hermes ``initialize`` stays cheap."""

    call_bound = WRITE_RETRY + WRITE_ATTEMPT

    def __init__(self, path: str, location: str, namespace: str,
                 on_connect: Callable[[], object] | None = None) -> None:  # fmt: skip
        """``on_connect``: called once, after the first connection (Ray registers its
        shutdown at exit then: an owner that writes at exit registers its hook after it)."""
        if not is_location(location):
            raise InvalidInputError(f"a cluster location starts with {' or '.join(SCHEMES)}, not {location!r}")
        super().__init__(path)
        self.location, self.namespace = location, check_namespace(namespace)
        self._store: Any = None
        self._lock = threading.Lock()
        self._on_connect = on_connect
        # The shard did not answer, or Ray itself failed the call (shut down, a lost
        # connection): nothing says it was applied, and its op id makes a replay safe.
        kept: list[type[BaseException]] = [importlib.import_module("fastmem.ray").ShardUnavailableError]
        try:
            kept.append(importlib.import_module("ray.exceptions").RayError)
        except ImportError:
            pass
        self.kept = tuple(kept)

    def open(self) -> Any:
        """The write handle (connecting to the cluster on first use).

        Raises:
            ClusterUnreachableError, RayUnavailableError, InvalidInputError: as
                :func:`fastmem.ray.open_location`; the writer keeps the writes meanwhile.
        """
        with self._lock:
            if self._store is None:
                fray = importlib.import_module("fastmem.ray")
                self._store = fray.open_location(self.location, self.namespace, retry_for=WRITE_RETRY,
                                                 attempt_timeout=WRITE_ATTEMPT)  # fmt: skip
                if self._on_connect is not None:
                    self._on_connect()
            return self._store

    def open_reader(self) -> Any:
        """A handle for reads, with the reads' patience, on the same connection."""
        store = self.open()
        return store.cluster.open(self.namespace, retry_for=READ_RETRY, attempt_timeout=READ_ATTEMPT)

    def scoped(self, store: Any, op_id: str | None) -> Any:
        return _WithOp(store, op_id)

    def flush(self, store: Any) -> None:
        """Nothing: the shard's answer means the store has the write (it survives the
        shard's process being killed; on disk within its group commit, ~5 ms)."""

"""The client side: finds a namespace's shard, calls it, and retries while it restarts.

Every write carries an operation id made once per call (or given by the caller) and sent
again with every retry, so a write whose answer was lost is applied once (the shard
remembers the id beside the store). Every attempt also carries a deadline: a shard that
receives an attempt after the router gave up on it refuses it instead of applying it late.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import InvalidInputError
from ..namespaces import check_namespace
from ._config import RAY_NAMESPACE, Deployment, actor_name
from ._errors import ClusterUnreachableError, RayUnavailableError, ShardUnavailableError

PROBE_TIMEOUT = 3.0  # seconds to connect to the cluster's port before Ray is asked to join


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError(f"fastmem.ray needs Ray ({exc}): pip install 'fastmem[ray]'") from None
    return ray


class Cluster:
    """A connection to a Ray cluster serving fastmem stores; make it with :func:`connect`."""

    def __init__(self, deployment: Deployment, *, address: str | None = None, retry_for: float = 60.0,
                 attempt_timeout: float = 15.0, node_ip_address: str | None = None) -> None:  # fmt: skip
        ray = _ray()
        self.deployment = deployment
        self.retry_for = retry_for
        self.attempt_timeout = attempt_timeout
        if not ray.is_initialized():
            probe(address)
            extra = {} if node_ip_address is None else {"_node_ip_address": node_ip_address}
            _join(ray, address, extra)
        self._handles: dict[int, Any] = {}

    # --- shards ------------------------------------------------------------------------

    def actor(self, shard: int) -> Any:
        """Shard ``shard``'s actor, created (detached: it outlives this client) if missing."""
        handle = self._handles.get(shard)
        if handle is not None:
            return handle
        ray = _ray()
        from ._shard import Shard

        d = self.deployment
        options: dict[str, Any] = {
            "name": actor_name(d, shard), "namespace": RAY_NAMESPACE, "lifetime": "detached",
            "get_if_exists": True, "max_restarts": -1, "max_task_retries": 0,
            "max_concurrency": d.concurrency, "num_cpus": 0,
        }  # fmt: skip
        node = d.node_of(shard)
        if node is not None:
            options["label_selector"] = {"fastmem-node": node}
        else:
            options["scheduling_strategy"] = "SPREAD"  # one node's loss takes few shards
        handle = ray.remote(Shard).options(**options).remote(d, shard)
        self._handles[shard] = handle
        return handle

    def invoke(self, shard: int, method: str, *args: Any, timeout: float | None = None,
               retry_for: float | None = None) -> Any:  # fmt: skip
        """Call ``method`` on shard ``shard``; retry with backoff while it is unavailable.

        Raises:
            ShardUnavailableError: no answer for ``retry_for`` seconds (nothing applied).
            FastmemError: what the store raised (as ``MemoryStore`` would).
        """
        ray = _ray()
        from ray import exceptions as rx

        timeout = self.attempt_timeout if timeout is None else timeout
        retry_for = self.retry_for if retry_for is None else retry_for
        start, delay, why = time.monotonic(), 0.05, "no attempt"
        while True:
            deadline = time.time() + timeout
            ref = None
            try:
                ref = getattr(self.actor(shard), method).remote(*args, deadline=deadline)
                status, value = ray.get(ref, timeout=timeout)
            except rx.GetTimeoutError:
                why = f"no answer within {timeout:g} s"
                with contextlib.suppress(Exception):
                    ray.cancel(ref)  # queued for a shard that is not up: drop it
            except (rx.RayActorError, rx.TaskCancelledError, rx.ObjectLostError, rx.RaySystemError) as exc:
                why = f"{type(exc).__name__}"
                if isinstance(exc, rx.ActorDiedError):
                    self._handles.pop(shard, None)  # killed for good: get_if_exists makes a new one
            else:
                if status == "ok":
                    return value
                if not isinstance(value, ShardUnavailableError):
                    raise value
                why = str(value)
            if time.monotonic() - start + delay > retry_for:
                raise ShardUnavailableError(
                    f"shard {shard} did not answer for {retry_for:g} s ({why}); a write may have been "
                    f"applied if an attempt timed out: retry it with the same op_id to apply it once"
                )
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    def open(self, namespace: str, *, retry_for: float | None = None,
             attempt_timeout: float | None = None) -> RemoteStore:  # fmt: skip
        """The store of ``namespace`` (created on its first write), served by its shard;
        ``retry_for``/``attempt_timeout``: this handle's own, instead of the cluster's."""
        return RemoteStore(self, check_namespace(namespace), retry_for=retry_for, attempt_timeout=attempt_timeout)

    def namespaces(self) -> list[str]:
        """Every store of the deployment (on the nodes' disks and frozen in the cold tier)."""
        found: set[str] = set()
        for shard in range(self.deployment.shards):
            found.update(self.invoke(shard, "namespaces"))
        return sorted(found)

    def status(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Each shard's state: node, pid, serving or not, open stores (``None`` fields for
        a shard that did not answer within ``timeout``)."""
        ray = _ray()
        refs = {s: self.actor(s).status.remote() for s in range(self.deployment.shards)}
        out = []
        for shard, ref in refs.items():
            try:
                out.append(ray.get(ref, timeout=timeout))
            except Exception as exc:  # noqa: BLE001 - a status lists what did not answer
                out.append({"shard": shard, "serving": False, "error": type(exc).__name__})
        return out

    def shutdown(self) -> None:
        """Stop every shard actor of the deployment for good (their stores are closed by
        the process ending: every acknowledged write is already in the files)."""
        ray = _ray()
        for shard in range(self.deployment.shards):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(actor_name(self.deployment, shard), namespace=RAY_NAMESPACE), no_restart=True)
        self._handles.clear()


class RemoteStore:
    """A store served by its shard, with ``MemoryStore``'s methods and plain values
    (``Memory``, ``Hit``, ``Context``, ``StoreStats``...). Writes take an optional
    ``op_id``: the same id sent twice (by this client's retries, or yours) is applied once."""

    def __init__(self, cluster: Cluster, namespace: str, *, retry_for: float | None = None,
                 attempt_timeout: float | None = None) -> None:  # fmt: skip
        self.cluster = cluster
        self.namespace = namespace
        self.shard = cluster.deployment.shard_of(namespace)
        self.retry_for = retry_for  # None: the cluster's
        self.attempt_timeout = attempt_timeout

    def _call(self, method: str, *args: Any, op: str | None = None, **kwargs: Any) -> Any:
        return self.cluster.invoke(self.shard, "call", self.namespace, method, args, kwargs, op,
                                   timeout=self.attempt_timeout, retry_for=self.retry_for)  # fmt: skip

    # --- writes ------------------------------------------------------------------------

    def add(self, text: str, *, op_id: str | None = None, **fields: Any) -> str:
        if fields.get("supersedes", ...) is None:  # add's default, not an item key
            del fields["supersedes"]
        ids: list[str] = self.add_many([{"text": text, **fields}], op_id=op_id)
        return ids[0]

    def add_many(self, items: Iterable[Mapping[str, Any]], *, op_id: str | None = None) -> list[str]:
        if isinstance(items, (str, bytes, Mapping)):
            raise InvalidInputError("add_many takes an iterable of dicts")
        batch = [dict(item) for item in items]
        if not batch:
            return []
        result: list[str] = self._call("add_many", batch, op=op_id or _new_op())
        return result

    def update(self, mid: str, *, op_id: str | None = None, **fields: Any) -> None:
        self._call("update", mid, op=op_id or _new_op(), **fields)

    def pin(self, mid: str, pinned: bool = True, *, op_id: str | None = None) -> None:
        self._call("pin", mid, pinned, op=op_id or _new_op())

    def forget(self, mid: str, *, op_id: str | None = None) -> None:
        self._call("forget", mid, op=op_id or _new_op())

    def evict(self, **policy: Any) -> list[str]:
        result: list[str] = self._call("evict", op=_new_op(), **policy)
        return result

    def record_access(self, ids: Iterable[str], now: float | None = None, *, op_id: str | None = None) -> None:
        self._call("record_access", list(ids), now, op=op_id or _new_op())

    def flush(self) -> None:
        self._call("flush")

    def checkpoint(self) -> None:
        self._call("checkpoint")

    def compact(self) -> dict[str, Any]:
        """Compact now (once, however often the call is retried): the report as a dict."""
        result: dict[str, Any] = self.cluster.invoke(self.shard, "job", self.namespace, "compact",
                                                     f"compact:{_new_op()}", {}, timeout=600.0)  # fmt: skip
        return result

    # --- reads -------------------------------------------------------------------------

    def get(self, mid: str) -> Any:
        return self._call("get", mid)

    def recent(self, n: int = 20) -> list[Any]:
        result: list[Any] = self._call("recent", n)
        return result

    def search(self, query: Any, k: int = 10, **filters: Any) -> list[Any]:
        result: list[Any] = self._call("search", query, k, **filters)
        return result

    def context(self, query: str = "", budget: int = 1300, **options: Any) -> Any:
        return self._call("context", query, budget, **options)

    def stats(self) -> Any:
        return self._call("stats")

    def pinned(self) -> list[Any]:
        result: list[Any] = self._call("pinned")
        return result

    def largest(self, n: int = 10) -> list[Any]:
        result: list[Any] = self._call("largest", n)
        return result

    def info(self, mid: str) -> Any:
        return self._call("info", mid)

    def vector(self, mid: str) -> Any:
        return self._call("vector", mid)

    def verify(self) -> Any:
        return self._call("verify")

    def __len__(self) -> int:
        count: int = self._call("count")
        return count

    def __contains__(self, mid: object) -> bool:
        return bool(self._call("contains", mid))

    def __iter__(self) -> Iterator[Any]:
        """Every live memory, oldest first (fetched in one call)."""
        return iter(self._call("memories"))

    def close(self) -> None:
        """Nothing to release: the shard keeps the store open while it is used."""

    def __enter__(self) -> RemoteStore:  # noqa: PYI034 - as MemoryStore.__enter__
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastmem.ray.RemoteStore {self.namespace!r} shard {self.shard}>"


def probe(address: str | None, timeout: float = PROBE_TIMEOUT) -> None:
    """Fail at once, with the address in the message, when nothing listens at ``address``
    (``HOST:PORT`` or ``ray://HOST:PORT``): Ray's own join retries for a minute or more.
    ``None`` and ``"auto"`` (a cluster found through this node) are left to Ray.

    Raises:
        ClusterUnreachableError: no TCP connection within ``timeout`` seconds.
    """
    if address is None or address == "auto":
        return
    from urllib.parse import urlsplit

    target = address.split("://", 1)[-1]
    try:
        host, port = urlsplit(f"//{target}").hostname, urlsplit(f"//{target}").port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise InvalidInputError(f"a cluster address is HOST:PORT or ray://HOST:PORT, not {address!r}")
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ClusterUnreachableError(
            f"nothing answers at {address} ({exc or type(exc).__name__}): is the Ray head node up, and is "
            f"this its GCS address (`ray start --head --port=...`; for Ray Client, ray://HOST:10001)?"
        ) from None
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("0", "", "false"):
            _ask_grpc(conn, address, timeout)


# An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (Ray's
# GCS, Ray Client's proxy) answers with a SETTINGS frame of its own at once.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type, the 4th byte of a frame's 9-byte header


def _ask_grpc(conn: socket.socket, address: str, timeout: float) -> None:
    """Raise unless what listens at ``address`` answers as a gRPC server within ``timeout``:
    a port that accepts connections and says nothing (a stuck process, another service)
    would make ``ray.init`` wait for a GCS for minutes."""
    reply = b""
    deadline = time.monotonic() + timeout
    try:
        conn.sendall(_HTTP2_PREFACE)
        while len(reply) < 9 and (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(64)
            if not chunk:
                break
            reply += chunk
    except OSError:
        pass
    if len(reply) < 9 or reply[3] != _SETTINGS:
        said = "nothing" if not reply else f"{len(reply)} bytes that are not gRPC"
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address}: something accepts connections there but said "
            f"{said} within {timeout:g} s (a Ray head's GCS or a Ray Client server answers at "
            f"once): is this the cluster's address (`ray start --head --port=...`; for Ray Client, "
            f"ray://HOST:10001)?"
        )


CLIENT_TRIES = 3  # Ray Client's proxy may fail to start a client's server in time under load


def _join(ray: Any, address: str | None, extra: dict[str, Any]) -> None:
    """``ray.init`` on ``address``. Through Ray Client (``ray://``) the head's proxy starts a
    server process for each client and refuses the client when that start fails (seen here
    once in three connections on a loaded machine): such a refusal is tried again.

    Raises:
        ClusterUnreachableError: something answers at ``address`` but no cluster is joined.
    """
    for attempt in range(1, CLIENT_TRIES + 1):
        try:
            ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=False,
                     logging_level="ERROR", **extra)  # fmt: skip
            return
        except (ConnectionError, RuntimeError) as exc:  # something answers there, not a Ray head
            lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
            why = " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(exc).__name__
            refused = isinstance(exc, ConnectionAbortedError) and bool(lines) and "Initialization failure" in lines[0]
            if not (refused and str(address).startswith("ray://") and attempt < CLIENT_TRIES):
                raise ClusterUnreachableError(f"could not join a Ray cluster at {address}: {why}") from None
            time.sleep(attempt)


def _new_op() -> str:
    return uuid.uuid4().hex


def connect(address: str | None = None, root: str | None = None, *, namespace: str | None = None,
            retry_for: float = 60.0, attempt_timeout: float = 15.0, node_ip_address: str | None = None,
            **deployment: Any) -> Any:  # fmt: skip
    """Connect to a Ray cluster's fastmem deployment.

    Args:
        address: the cluster (``"10.0.0.1:6379"``, ``"auto"``, ``"ray://host:10001"``);
            ``None`` joins the cluster of ``RAY_ADDRESS`` or starts a local one.
        root: where the stores live (see :class:`fastmem.ray.Deployment`).
        namespace: return that namespace's store rather than the cluster.
        retry_for: seconds a call retries while its shard is unavailable.
        attempt_timeout: seconds one attempt waits for its answer.
        node_ip_address: this machine's address in the cluster, when it is a node of it and
            Ray would guess another (several nodes on one machine's loopback addresses).
        deployment: the other fields of :class:`fastmem.ray.Deployment` (``mode``,
            ``shards``, ``nodes``, ``cold``...). The first client creates the shard actors
            with them; later clients must pass the same.

    Returns:
        a :class:`Cluster`, or with ``namespace`` a :class:`RemoteStore`.
    """
    if root is None:
        raise InvalidInputError("connect needs root= (where the stores live)")
    cluster = Cluster(Deployment(root=root, **deployment), address=address, retry_for=retry_for,
                      attempt_timeout=attempt_timeout, node_ip_address=node_ip_address)  # fmt: skip
    return cluster if namespace is None else cluster.open(namespace)


def split(namespaces: Sequence[str], deployment: Deployment) -> dict[int, list[str]]:
    """``namespaces`` grouped by shard."""
    out: dict[int, list[str]] = {}
    for name in namespaces:
        out.setdefault(deployment.shard_of(name), []).append(name)
    return out


LOCATION_SCHEMES = ("ray://", "ray+gcs://")


def open_location(location: str, namespace: str | None = None, *, retry_for: float | None = None,
                  attempt_timeout: float | None = None) -> RemoteStore:  # fmt: skip
    """The store a location names, for integrations that take a store path.

    ``ray://HOST:PORT/ROOT?...`` connects through Ray Client (from outside the cluster);
    ``ray+gcs://HOST:PORT/ROOT?...`` joins as a driver on a node of the cluster. The query
    gives the deployment: ``name``, ``shards``, ``mode``, ``nodes`` (comma-separated),
    ``cold``, ``lease``, ``namespace``, and ``node_ip`` (this node's address in the
    cluster). E.g. ``ray+gcs://10.0.0.1:6379/mnt/shared/fastmem?shards=64&namespace=alice``.

    ``retry_for`` and ``attempt_timeout`` are the returned handle's (see :func:`connect`).

    Raises:
        InvalidInputError: not such a location, or no namespace.
        ClusterUnreachableError: nothing answers at HOST:PORT.
    """
    from urllib.parse import parse_qs, urlsplit

    if not isinstance(location, str) or not location.startswith(LOCATION_SCHEMES):
        raise InvalidInputError(f"a cluster location starts with {' or '.join(LOCATION_SCHEMES)}")
    parts = urlsplit(location)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    namespace = namespace or query.pop("namespace", None)
    query.pop("namespace", None)
    if not namespace:
        raise InvalidInputError(f"{location}: name the store with ?namespace=NAME (or --namespace)")
    if not parts.netloc or not parts.path:
        raise InvalidInputError(f"{location}: give the cluster as HOST:PORT and the stores' root as the path")
    address = f"ray://{parts.netloc}" if parts.scheme == "ray" else parts.netloc
    fields: dict[str, Any] = {}
    numbers: dict[str, type] = {"shards": int, "lease": float}
    for key, value in query.items():
        if key in ("name", "mode", "cold"):
            fields[key] = value
        elif key in numbers:
            try:
                fields[key] = numbers[key](value)
            except ValueError:
                raise InvalidInputError(f"{location}: {key} must be a number") from None
        elif key == "nodes":
            fields[key] = tuple(n for n in value.split(",") if n)
        elif key != "node_ip":
            raise InvalidInputError(f"{location}: unknown setting {key!r}")
    cluster: Cluster = connect(address, parts.path, node_ip_address=query.get("node_ip"), **fields)
    return cluster.open(namespace, retry_for=retry_for, attempt_timeout=attempt_timeout)

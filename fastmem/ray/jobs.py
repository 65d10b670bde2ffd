"""Fleet jobs: one operation over many stores, each run by the shard that owns it.

``run("compact", "all", cluster=c)`` compacts every store of the deployment. A *ledger*
(a JSON-lines file) records each store's outcome as it arrives; running the same job id
again skips the stores the ledger says are done, so an interrupted job resumes where it
stopped. Each store's operation carries the id ``<job>:<namespace>``, which its shard
remembers beside the store: a store is never done twice, even when the client died after
the shard finished it but before the ledger line was written. A store that fails is
recorded with its error and the job goes on; the summary lists the failures.

Operations: ``compact``, ``verify``, ``export`` (``params={"dest": URL}``: one JSON-lines
file per store), ``reembed`` (``params={"embedder": factory}``), ``freeze`` and ``thaw``
(the cold tier), ``backup`` (``params={"dest": URL}``: a copy of each store, taken while it
serves, under ``<dest>/<namespace>/<UTC time>/``) and ``restore`` (``params={"dest": URL}``:
each store's newest complete backup installed on the node whose shard now owns it, never
over files that are there; ``"all"`` means every store backed up there that the deployment
does not have).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from ..errors import InvalidInputError
from ._backup import Backups
from ._config import check_names
from ._embed import stop_services
from ._router import Cluster, connect

OPS = ("compact", "verify", "export", "reembed", "freeze", "thaw", "backup", "restore", "wait")


@dataclasses.dataclass
class JobSummary:
    job: str
    op: str
    ledger: str
    total: int
    done: int = 0  # done by this run
    skipped: int = 0  # done by an earlier run of the job (the ledger said so)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    results: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def default_ledger(job: str) -> str:
    base = os.environ.get("FASTMEM_RAY_JOBS") or os.path.join(os.path.expanduser("~"), ".cache", "fastmem", "ray-jobs")
    return os.path.join(base, f"{job}.jsonl")


def read_ledger(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the job's header, namespace -> its last outcome) from a ledger file."""
    header: dict[str, Any] = {}
    outcome: dict[str, Any] = {}
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue  # a torn last line: that store is done again, by op id once
            if "job" in entry:
                header = entry
            elif "ns" in entry:
                outcome[entry["ns"]] = entry
    return header, outcome


def run(op: str, namespaces: Sequence[str] | str = "all", *, cluster: Cluster | None = None,
        job: str | None = None, ledger: str | None = None, params: dict[str, Any] | None = None,
        concurrency: int | None = None, timeout: float = 600.0, retry_for: float = 120.0,
        progress: Callable[[int, int, int], None] | bool | None = None,
        address: str | None = None, root: str | None = None, **deployment: Any) -> JobSummary:  # fmt: skip
    """Run ``op`` on ``namespaces`` (or ``"all"``) and return a :class:`JobSummary`.

    Args:
        op: one of ``compact``, ``verify``, ``export``, ``reembed``, ``freeze``, ``thaw``,
            ``backup``, ``restore``.
        namespaces: the stores, or ``"all"`` (every store of the deployment; for
            ``restore``, every store in the backups that the deployment does not have).
        cluster: a :class:`Cluster` (else one is made from ``address``, ``root``, ``deployment``).
        job: the job's id: the same id resumes an interrupted job (default: a new one).
        ledger: the ledger file (default ``~/.cache/fastmem/ray-jobs/<job>.jsonl``).
        params: the operation's parameters (``dest`` for export, backup and restore, with
            fsspec ``options``; ``keep`` for backup: each store's newest complete backups
            to keep, older ones deleted; ``generation`` for restore; ``embedder`` for reembed).
        concurrency: stores in flight at once (default: 2 per shard, at most 64).
        timeout: seconds one store's operation may take.
        retry_for: seconds a store's shard may stay unavailable before the store is
            recorded as failed.
        progress: ``callback(finished, total, failed)``, or ``True`` for a progress bar on
            stderr (only on a terminal).
    """
    if op not in OPS:
        raise InvalidInputError(f"op must be one of {OPS}, not {op!r}")
    if op in ("export", "backup", "restore") and not (params or {}).get("dest"):
        raise InvalidInputError(f"{op} needs params={{'dest': URL}} (--dest): a directory or fsspec URL")
    keep = (params or {}).get("keep")
    if keep is not None and (op != "backup" or isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise InvalidInputError(f"keep is for backup, an int >= 1 (the newest backups kept), not {keep!r}")
    if cluster is None:
        cluster = connect(address, root, **deployment)
    job = job or f"{op}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    ledger = ledger or default_ledger(job)
    header, outcome = read_ledger(ledger)
    if header and header.get("op") != op:
        raise InvalidInputError(f"ledger {ledger} is of a {header.get('op')!r} job, not {op!r}")
    names = cluster.namespaces() if namespaces == "all" else check_names(list(namespaces))
    if op == "restore" and namespaces == "all":
        backups = Backups(str((params or {}).get("dest") or ""), (params or {}).get("options"))
        names = sorted(set(backups.namespaces()) - set(names))
    summary = JobSummary(job, op, ledger, len(names))
    todo = [n for n in names if outcome.get(n, {}).get("status") != "done"]
    summary.skipped = len(names) - len(todo)
    os.makedirs(os.path.dirname(os.path.abspath(ledger)), exist_ok=True)
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    lock = threading.Lock()
    started = time.monotonic()

    def record(entry: dict[str, Any]) -> None:
        with lock:
            os.write(fd, json.dumps(entry, default=str).encode() + b"\n")

    def one(namespace: str) -> Any:
        shard = cluster.deployment.shard_of(namespace)
        return cluster.invoke(shard, "job", namespace, op, f"{job}:{namespace}", {**(params or {}), "job": job},
                              timeout=timeout, retry_for=retry_for)  # fmt: skip

    bar = _Bar(len(names), summary.skipped) if progress is True else None
    try:
        if not header:
            record({"job": job, "op": op, "started": time.time(), "stores": len(names)})
        workers = concurrency or min(64, 2 * cluster.deployment.shards)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastmem-job") as pool:
            futures = {pool.submit(one, n): n for n in todo}
            for future in as_completed(futures):
                name = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - a failed store is recorded, the job goes on
                    summary.failed[name] = f"{type(exc).__name__}: {exc}"
                    record({"ns": name, "status": "failed", "error": summary.failed[name]})
                else:
                    summary.done += 1
                    summary.results[name] = result
                    record({"ns": name, "status": "done", "result": result})
                finished = summary.skipped + summary.done + len(summary.failed)
                if callable(progress):
                    progress(finished, len(names), len(summary.failed))
                if bar is not None:
                    bar.update(finished, len(summary.failed))
    finally:
        os.close(fd)
        if bar is not None:
            bar.close()
        if op == "reembed":
            stop_services(job)
    summary.seconds = time.monotonic() - started
    return summary


class _Bar:
    """A rich progress bar on stderr, only when it is a terminal."""

    def __init__(self, total: int, already: int) -> None:
        self.progress: Any = None
        if not sys.stderr.isatty():
            return
        from rich.progress import Progress

        self.progress = Progress(transient=True)
        self.progress.start()
        self.task = self.progress.add_task("stores", total=total, completed=already)

    def update(self, finished: int, failed: int) -> None:
        if self.progress is not None:
            label = f"stores ({failed} failed)" if failed else "stores"
            self.progress.update(self.task, completed=finished, description=label)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()

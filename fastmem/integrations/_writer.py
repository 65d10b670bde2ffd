"""A store's write queue for a process that may not hold its writer lock: one thread
applies the writes in order, and keeps what it cannot write in durable pending files.

Used by the Hermes provider (:mod:`fastmem.integrations.hermes`), and written for any
integration whose processes share one store. A write is an op: a kind and its arguments
(JSON data, so that it can wait in a pending file). The writer itself knows ``add``
(consecutive adds go in one ``add_many``) and ``barrier`` (nothing: its future says that
everything queued before it is on disk); every other kind is applied by the handler the
owner passes in, ``handler(store, args)``. Arguments come back from a pending file as
JSON gives them (a tuple as a list): handlers take either.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import fastmem
from fastmem.errors import EmbedderUnavailableError, FastmemError, StoreLockedError

__all__ = ["PENDING", "Handler"]

logger = logging.getLogger(__name__)

LOCK_WAIT = 0.05  # seconds per attempt at the store's writer lock (rides over a reopen)
RETRY_LOCK = 1.0  # seconds between attempts while another process holds the lock
IDLE_TICK = 1.0  # seconds between imports of other processes' pending writes
MAX_BATCH = 64  # writes per commit: bounds one batch's embedding time (~1 s on a laptop CPU)

Handler = Callable[["fastmem.MemoryStore", Any], Any]  # applies one kind of write


class _Pending:
    """A write kept in a pending file: it reaches the store when a writer imports it."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()


@dataclass
class _Op:
    kind: str  # add, barrier, or a kind the owner's handlers apply
    args: Any
    future: Future[Any]


def _open_store(path: str, **kwargs: Any) -> fastmem.MemoryStore:
    """Open with the default embedder, or keyword-only when the model is not installed
    (memories stay readable either way; vectors come back with the model)."""
    try:
        return fastmem.open(path, **kwargs)
    except EmbedderUnavailableError as exc:
        logger.warning("fastmem: embedding model unavailable (%s); keyword search only", exc)
        return fastmem.open(path, embedder=None, **kwargs)


class _Writer:
    """One thread that applies a store's writes in order and acknowledges each batch only
    after an fsync.

    It keeps the store's writer lock for as long as the store is in use here: closing a
    store checkpoints its index (~130 ms and the whole index rewritten at 100k memories),
    too much to do after every turn. When another process holds the lock (a gateway beside
    this CLI), batches go to durable ``pending-*.jsonl`` files beside the store instead; the
    lock holder imports them within about a second, and whoever takes the lock next imports
    what is left. The same happens to what is still queued at the shutdown deadline.
    """

    def __init__(self, path: str, handlers: Mapping[str, Handler]) -> None:
        self.path = path
        self._handlers = dict(handlers)
        self._queue: queue.Queue[_Op | None] = queue.Queue()
        self._store: fastmem.MemoryStore | None = None
        self._deadline: float | None = None  # set by stop(): what is not written by then is kept
        self._next_try = 0.0  # when to try for the lock again after finding it taken
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="fastmem-writer", daemon=True)
        self._thread.start()

    def submit(self, kind: str, args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put(_Op(kind, args, future))
        return future

    def stop(self, timeout: float) -> None:
        """Write what is queued (to a pending file past ``timeout``), then close."""
        self._deadline = time.monotonic() + timeout
        self._queue.put(None)
        self._thread.join(timeout + 1.0)

    def _run(self) -> None:
        while True:
            try:
                op = self._queue.get(timeout=IDLE_TICK)
            except queue.Empty:
                self._idle()
                continue
            stopping = op is None
            batch = [] if op is None else [op]
            while len(batch) < MAX_BATCH:  # what else is queued joins this batch (one fsync)
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                else:
                    batch.append(more)
            if batch and self._deadline is not None and time.monotonic() >= self._deadline:
                # Out of time (embedding a backlog, say): keep the rest for the next writer.
                self._spill(batch + self._drain(), "was not written before the shutdown deadline")
                stopping = True
            elif batch:
                self._write(batch)
            if stopping:
                self._close()
                return

    def _drain(self) -> list[_Op]:
        """Everything still queued (the stop sentinel dropped: nothing behind it is lost)."""
        rest: list[_Op] = []
        while True:
            try:
                op = self._queue.get_nowait()
            except queue.Empty:
                return rest
            if op is not None:
                rest.append(op)

    def _idle(self) -> None:
        """Between writes: import other processes' pending writes, or try for the lock."""
        store = self._acquire()
        if store is not None:
            try:
                self._import_pending(store)
            except Exception as exc:  # the next tick tries again
                logger.warning("fastmem: importing pending writes into %s failed: %s", self.path, exc)

    def _write(self, batch: list[_Op]) -> None:
        store = self._acquire()
        if store is None:
            self._spill(batch, "is locked by another process")
            return
        self._import_pending(store)  # older than this batch: first
        results: list[tuple[_Op, Any, BaseException | None]] = []
        i = 0
        while i < len(batch):
            if batch[i].kind == "add":  # a run of adds: one add_many, one commit
                j = i
                while j < len(batch) and batch[j].kind == "add":
                    j += 1
                results.extend(self._add_run(store, batch[i:j]))
                i = j
                continue
            op = batch[i]
            try:
                results.append((op, self._apply(store, op.kind, op.args), None))
            except Exception as exc:  # a user error (unknown id...): reported to its caller
                results.append((op, None, exc))
            i += 1
        try:
            store.flush()  # acknowledged = on disk
        except Exception as exc:
            logger.warning("fastmem: flush of %s failed: %s", self.path, exc)
        for op, value, error in results:
            if error is None:
                op.future.set_result(value)
            else:
                op.future.set_exception(error)

    def _add_run(self, store: fastmem.MemoryStore, ops: list[_Op]) -> list[tuple[_Op, Any, Any]]:
        try:
            ids = store.add_many([op.args for op in ops])
            return [(op, mid, None) for op, mid in zip(ops, ids)]
        except FastmemError:  # one bad item refuses the batch: add the others one by one
            out: list[tuple[_Op, Any, Any]] = []
            for op in ops:
                try:
                    out.append((op, store.add(**op.args), None))
                except Exception as exc:
                    out.append((op, None, exc))
            return out

    def _apply(self, store: fastmem.MemoryStore, kind: str, args: Any) -> Any:
        if kind == "barrier":
            return None
        handler = self._handlers.get(kind)
        if handler is None:
            raise ValueError(f"unknown write {kind!r}")
        return handler(store, args)

    def _acquire(self) -> fastmem.MemoryStore | None:
        """The writable handle, or None while another process holds the lock (or the store
        cannot be opened); tries again at most every RETRY_LOCK seconds."""
        if self._store is not None:
            return self._store
        now = time.monotonic()
        if now < self._next_try:
            return None
        try:
            self._store = _open_store(self.path, timeout=LOCK_WAIT)
        except Exception as exc:  # locked elsewhere, or damaged: the writes go to a file
            self._next_try = now + RETRY_LOCK
            if not isinstance(exc, StoreLockedError) and not self._warned:
                logger.warning("fastmem: cannot open %s for writing: %s", self.path, exc)
                self._warned = True
            return None
        self._warned = False
        return self._store

    def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:  # pending files stay for the next holder: imports take time a shutdown lacks
                store.close()
            except Exception as exc:
                logger.warning("fastmem: closing %s failed: %s", self.path, exc)

    # Pending files: writes that could not be made to the store, as JSON lines.

    def _spill(self, ops: list[_Op], why: str) -> None:
        lines = [json.dumps({"kind": op.kind, "args": op.args}) for op in ops if op.kind != "barrier"]
        directory = os.path.dirname(self.path)
        name = os.path.join(directory, f"pending-{time.time():.6f}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl")
        try:
            if lines:
                fd, tmp = tempfile.mkstemp(dir=directory, prefix=".pending-")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write("\n".join(lines) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, name)  # whole or absent: the importer never sees half a file
                logger.info("fastmem: %s %s; %d writes kept in %s", self.path, why, len(lines), name)
        except Exception as exc:
            logger.error("fastmem: could not keep %d writes for %s: %s", len(lines), self.path, exc)
        for op in ops:
            op.future.set_result(PENDING)

    def _import_pending(self, store: fastmem.MemoryStore) -> None:
        """Apply the pending files (oldest first, by the time in their names), then delete
        them; a crash between the two imports a file twice rather than never."""
        names = sorted(glob.glob(os.path.join(os.path.dirname(self.path), "pending-*.jsonl")))
        for name in names:
            try:
                with open(name, encoding="utf-8") as f:
                    entries = [json.loads(line) for line in f if line.strip()]
            except FileNotFoundError:  # imported meanwhile by an earlier holder of the lock
                continue
            except (OSError, ValueError) as exc:
                logger.warning("fastmem: cannot read %s: %s", name, exc)
                continue
            for entry in entries:
                try:
                    kind, args = entry["kind"], entry["args"]
                    if kind == "add":
                        store.add(**args)
                    else:
                        self._apply(store, kind, args)
                except (FastmemError, KeyError, TypeError) as exc:
                    logger.warning("fastmem: a pending write in %s failed: %s", name, exc)
            store.flush()
            os.unlink(name)

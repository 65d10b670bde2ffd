"""A store's write queue: one thread per store per process applies the writes in order and
acknowledges each batch only after an fsync, so that a caller (Hermes's ``sync_turn``)
never waits for the disk, an embedding or another process.

Used by the Hermes provider (:mod:`fastmem.integrations.hermes`), and written for any
integration whose processes share one store. A write is an op: a kind and its arguments
(JSON data, so that it can wait in a spill file). The writer itself knows ``add``
(consecutive adds go in one ``add_many``), ``open`` and ``barrier`` (nothing: the future
says that the store is open, or that everything queued before it is on disk); every other
kind is applied by the handler the owner passes in, ``handler(store, args)``. Arguments
come back from a spill file as JSON gives them (a tuple as a list): handlers take either.

Every process writes to the store itself. The store's writer lock is taken per write
(any number of processes open one store read-write), so a batch waits at most for another
process's append, a few milliseconds; every handle, in any process, sees it as soon as it
is acknowledged. Nothing goes to a side file in normal operation.

Spill files (``pending-*.jsonl`` beside the store) keep, durably, only two things:

- what is still queued at the shutdown deadline (:meth:`_Writer.stop`; an embedding
  backlog on a busy CPU, say): the process is leaving, it cannot wait;
- a batch that did not get the writer lock within ``WRITE_WAIT`` seconds (another
  process held it that long: a repair of a large store, a stopped process), or that met a
  fault of the disk (any ``OSError``: a full disk, an I/O error, a read-only remount) or
  whose sync failed (its writes may or may not have reached the file: a failed
  ``fdatasync`` does not say), and the writes queued behind it while that file waits, so
  that the store gets them in order.

Nothing is acknowledged that was not made: a write is answered with its result once a
``flush`` has made its batch durable, with ``PENDING`` once it is in a spill file, and
otherwise with an error that says "not saved" (the spill file could not be written
either). The thread survives any error; after a fault it reopens the store for the next
write (a failed sync is sticky on a handle).

Any writer of the store imports them: when it opens the store (so the next start of any
process on the profile takes them in), before its next batch after it spilled, and when
idle (every ``IDLE_TICK`` seconds). Each file is imported once: the importer holds an
``flock`` on the file while it applies it and deletes it before letting go; an importer
that gets the flock afterwards finds the file deleted (``st_nlink == 0``) and skips it;
a killed importer's flock is released by the OS and the next importer takes the file
over.

Each kept write reaches the store once, even when an import is cut short (the process
killed, a fault of the disk) or a batch's sync failed. Before the first write of a file
is applied, the file is rewritten (atomically, under the importer's flock) with a first
line ``{"stored_after": "m<N>"}``: memories its writes add get ids above ``m<N>`` (ids
grow with every add, in any process). An importer that finds that line checks, before
applying, which of the file's adds a store already holds among the memories above the
mark (the same text, time, session and type; the writer gives every add a time) and
skips them. A batch whose sync failed is kept with the mark of its first new id. The
other writes are idempotent (a pin, a forget: of a forgotten memory it is refused and
logged, a consolidated fact is added unless stored), and the Hermes provider's mirrored
writes recognise themselves. A target whose store remembers op ids itself (a cluster's
shard) needs none of this. One limit: after a failed ``fdatasync`` the kernel may keep
pages it could not write in its cache, so a write can be seen in the store, and skipped,
and still be lost with a power cut (Linux's behaviour; no file API can tell).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import logging
import os
import queue
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import fastmem
from fastmem.errors import (
    DurabilityError,
    EmbedderUnavailableError,
    FastmemError,
    StoreClosedError,
    StoreFullError,
    StoreLockedError,
)  # fmt: skip

__all__ = ["PENDING", "Handler", "LocalTarget"]

logger = logging.getLogger(__name__)

# A write waits for the writer lock in slices, not in one wait of the store's own timeout,
# so that the shutdown deadline can cut the wait short (what is not written by then is
# spilled, not left to a daemon thread that dies with the interpreter).
LOCK_SLICE = 0.25  # seconds per attempt (the store's timeout=)
WRITE_WAIT = fastmem.LOCK_TIMEOUT  # seconds a batch waits for the lock in all before it is spilled
IDLE_TICK = 1.0  # seconds between looks for spill files while nothing is queued
MAX_BATCH = 64  # writes per commit: bounds one batch's embedding time (~1 s on a laptop CPU)
SPILL_GLOB = "pending-*.jsonl"

Handler = Callable[["fastmem.MemoryStore", Any], Any]  # applies one kind of write
MARK = "stored_after"  # a spill file's first line: its adds may be stored above this id (or any: null)


class _Unmarked:
    """A spill file without a mark: none of its writes was applied yet."""


_UNMARKED = _Unmarked()


class _Pending:
    """A write kept in a spill file: it reaches the store when a writer imports it."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()
_NO_OPS = frozenset({"open", "barrier"})  # nothing to write: never spilled


@dataclass
class _Op:
    kind: str  # add, open, barrier, or a kind the owner's handlers apply
    args: Any
    future: Future[Any]
    # The operation id this write is tried under, given before its first try and kept in
    # its spill file: a store that remembers ids (a cluster's shard) applies a replay of a
    # write whose answer was lost once. Consecutive adds tried as one batch share one.
    op_id: str | None = None


def _open_store(path: str, **kwargs: Any) -> fastmem.MemoryStore:
    """Open with the default embedder, or keyword-only when the model is not installed
    (memories stay readable either way; vectors come back with the model)."""
    try:
        return fastmem.open(path, **kwargs)
    except EmbedderUnavailableError as exc:
        logger.warning("fastmem: embedding model unavailable (%s); keyword search only", exc)
        return fastmem.open(path, embedder=None, **kwargs)


class LocalTarget:
    """Where a writer's writes go: the store at ``path`` on this machine. (A store served
    elsewhere has a target of the same shape: :class:`fastmem.integrations._cluster.ClusterTarget`.)"""

    call_bound = 0.0  # seconds one write may take beyond the lock waits the writer bounds itself
    kept: tuple[type[BaseException], ...] = ()  # errors besides _kept_for's that keep a write for later

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self) -> Any:
        return _open_store(self.path, timeout=LOCK_SLICE)

    def scoped(self, store: Any, op_id: str | None) -> Any:
        """``store``, its writes carrying ``op_id`` (a local store needs none: its writes
        are acknowledged or not, never lost in between)."""
        return store

    def flush(self, store: Any) -> None:
        store.flush()  # acknowledged = on disk

    @property
    def remembers_ops(self) -> bool:
        """Whether the store applies a write replayed under the same op id once by itself
        (a target that scopes its writes with op ids: a cluster's shard); when not, a
        spill file's import recognises what it already applied (see the module docstring)."""
        return type(self).scoped is not LocalTarget.scoped


def new_op_id() -> str:
    return uuid.uuid4().hex


class _Writer:
    """One thread that applies a store's writes in order (see the module docstring)."""

    def __init__(self, path: str, handlers: Mapping[str, Handler], target: LocalTarget | None = None) -> None:
        self.path = path  # the spill files go beside it
        self._target = target or LocalTarget(path)
        self._handlers = dict(handlers)
        self._queue: queue.Queue[_Op | None] = queue.Queue()
        self._store: fastmem.MemoryStore | None = None
        self._deadline: float | None = None  # set by stop(): what is not written by then is kept
        self._spilled: set[str] = set()  # this writer's spill files not yet seen imported
        self._warned = False
        self._open_error: BaseException | None = None  # why the store could not be opened
        self._stopped = False
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fastmem-writer", daemon=True)
        self._thread.start()

    def submit(self, kind: str, args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._submit_lock:
            if self._stopped:  # behind the stop sentinel it would never be written
                future.set_exception(StoreClosedError(f"the writer of {self.path} has stopped; not saved"))
            else:
                self._queue.put(_Op(kind, args, future))
        return future

    def stop(self, timeout: float) -> None:
        """Write what is queued (to a spill file past ``timeout``), then close."""
        self._deadline = time.monotonic() + timeout
        with self._submit_lock:
            self._stopped = True
            self._queue.put(None)
        # A write begun just before the deadline may take its target's bound more.
        self._thread.join(timeout + self._target.call_bound + 1.0)

    def _run(self) -> None:
        while True:
            batch: list[_Op] = []
            stopping = False
            try:
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
                if batch and self._past_deadline():
                    # Out of time (embedding a backlog, say): keep the rest for the next writer.
                    self._spill(batch + self._drain(), "was not written before the shutdown deadline")
                    stopping = True
                elif batch:
                    self._write(batch)
            except BaseException as exc:
                # The thread outlives any error: a dead writer would leave every later
                # write queued forever, and its callers told "pending" for nothing. What
                # this batch had not settled is reported as not saved.
                logger.exception("fastmem: the writer of %s failed", self.path)
                self._drop_store()
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            if stopping:
                self._close()
                return

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

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
        """Between writes: import spill files (this process's, or a stopped one's)."""
        if not self._spilled and not glob.glob(os.path.join(os.path.dirname(self.path), SPILL_GLOB)):
            return  # the usual case: one listdir a second, no open
        store = self._acquire()
        if store is not None:
            self._import_spilled(store)

    def _locked_retry(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, tried again while another process holds the writer lock, for up to
        WRITE_WAIT seconds and never past the shutdown deadline; then StoreLockedError.
        A call refused with StoreLockedError has written nothing: trying again is safe."""
        give_up = time.monotonic() + WRITE_WAIT
        if self._deadline is not None:
            give_up = min(give_up, self._deadline)
        while True:
            try:
                return call(*args, **kwargs)
            except StoreLockedError:
                if time.monotonic() + LOCK_SLICE > give_up:
                    raise

    def _write(self, batch: list[_Op]) -> None:
        store = self._acquire()
        if store is None:
            self._spill(batch, "could not be opened for writing", self._open_error)
            return
        if self._spilled and not self._import_spilled(store):
            # This writer's earlier writes still wait in a file: what follows waits behind them.
            self._spill(batch, "waits behind earlier writes the store could not take yet")
            return
        _give_op_ids(batch)  # before the first try: a replay must carry the same ids
        results: list[tuple[_Op, Any, BaseException | None]] = []
        stopped: BaseException | None = None  # the lock or a fault: this op and the rest are kept
        i = 0
        while i < len(batch) and stopped is None:
            if batch[i].kind == "add":  # a run of adds: one add_many, one commit
                j = i
                while j < len(batch) and batch[j].kind == "add" and batch[j].op_id == batch[i].op_id:
                    j += 1
                done, stopped = self._add_run(store, batch[i:j])
                results.extend(done)
                i += len(done)
            else:
                op = batch[i]
                try:
                    scoped = self._target.scoped(store, op.op_id)
                    results.append((op, self._locked_retry(self._apply, scoped, op.kind, op.args), None))
                except Exception as exc:
                    if self._kept(exc):
                        stopped = exc
                        break
                    results.append((op, None, exc))  # a user error (unknown id...) goes to its caller
                i += 1
        rest = batch[len(results) :]
        mark: str | None | _Unmarked = _UNMARKED  # a kept batch: which of its adds may be stored
        if results:
            try:
                self._target.flush(store)  # acknowledged = on disk
            except Exception as exc:
                # Not on disk, or not known to be: nothing of this batch is acknowledged.
                # Kept, marked: its import skips what did reach the file (module docstring).
                logger.warning("fastmem: the sync of %s failed; its %d writes are kept to be tried again: %s",
                               self.path, len(results), exc)  # fmt: skip
                made = [op for op, _, error in results if error is None and op.kind not in _NO_OPS]
                new_ids = [value for op, value, error in results if error is None and op.kind == "add"]
                mark = _mark_below(new_ids) if new_ids else _UNMARKED  # only adds are checked
                rest = made + rest
                # A barrier (or an open) says the sync failed: the store's disk is failing.
                failed = _not_saved(exc, "the store's sync failed")
                results = [(op, None, error or failed) for op, _, error in results
                           if error is not None or op.kind in _NO_OPS]  # fmt: skip
                stopped = stopped or exc
        if stopped is not None and not isinstance(stopped, StoreLockedError):
            self._drop_store()  # a failed sync is sticky on the handle: the next write reopens
        for op, value, error in results:
            if error is None:
                op.future.set_result(value)
            else:
                op.future.set_exception(error)
        if rest:
            why = (f"met the writer lock held for over {WRITE_WAIT:g} s" if isinstance(stopped, StoreLockedError)
                   else "could not be written")  # fmt: skip
            self._spill(rest, f"{why} (last try: {stopped})", stopped, mark)

    def _add_run(self, store: fastmem.MemoryStore, ops: list[_Op]) -> tuple[list[tuple[_Op, Any, Any]], BaseException | None]:
        """Adds as one commit; one bad item refuses the commit, so then one by one. The
        lock held too long or a fault of the disk ends the run (returned with what was
        done): the caller keeps that op and the rest."""
        try:
            ids = self._locked_retry(self._target.scoped(store, ops[0].op_id).add_many, [op.args for op in ops])
            return [(op, mid, None) for op, mid in zip(ops, ids)], None
        except Exception as exc:
            if self._kept(exc):
                return [], exc
        out: list[tuple[_Op, Any, Any]] = []
        run = ops[0].op_id
        for k, op in enumerate(ops):  # tried alone from now on (kept so, if spilled): each its own id
            op.op_id = f"{run}/{k}"
        for op in ops:
            try:
                out.append((op, self._locked_retry(self._target.scoped(store, op.op_id).add, **op.args), None))
            except Exception as exc:
                if self._kept(exc):
                    return out, exc
                out.append((op, None, exc))
        return out, None

    def _apply(self, store: fastmem.MemoryStore, kind: str, args: Any) -> Any:
        if kind in _NO_OPS:
            return None
        handler = self._handlers.get(kind)
        if handler is None:
            raise ValueError(f"unknown write {kind!r}")
        return handler(store, args)

    def _acquire(self) -> fastmem.MemoryStore | None:
        """The read-write handle, opened (and the store created) on first use; spill files
        found then are imported first. None when the store cannot be opened now."""
        if self._store is not None:
            return self._store
        try:
            store = self._locked_retry(self._target.open)
        except Exception as exc:  # locked for long, damaged, a failing disk: writes are kept in a file
            self._open_error = exc
            self._warn("cannot open %s for writing: %s", self.path, exc)
            return None
        self._store, self._open_error = store, None
        self._import_spilled(store)
        return self._store

    def _warn(self, message: str, *args: Any) -> None:
        """Log a failure once until a write succeeds again (a retry every idle tick)."""
        if not self._warned:
            logger.warning("fastmem: " + message, *args)
            self._warned = True

    def _drop_store(self) -> None:
        """Close the handle after a fault: the next write opens the store again (a failed
        sync is sticky on a handle; a new one reads what actually reached the file)."""
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception as exc:  # the fault again: the handle is closed all the same
                logger.debug("fastmem: closing %s after a fault: %s", self.path, exc)

    def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:  # spill files stay for the next writer: imports take time a shutdown lacks
                store.close()
            except Exception as exc:
                logger.warning("fastmem: closing %s failed: %s", self.path, exc)

    # --- spill files: writes that could not be made to the store, as JSON lines ----------

    def _spill(self, ops: list[_Op], why: str, cause: BaseException | None = None,
               mark: str | None | _Unmarked = _UNMARKED) -> None:  # fmt: skip
        """Keep ``ops`` durably in a spill file (their futures say PENDING); when even that
        fails, they are not saved, and their futures say so (never PENDING). ``mark``:
        the first of them may be in the store already, as memories above it."""
        try:
            _give_op_ids(ops)  # writes never tried get theirs now: a replay carries them
            lines = [json.dumps({"kind": op.kind, "args": op.args, "op": op.op_id})
                     for op in ops if op.kind not in _NO_OPS]  # fmt: skip
            count = len(lines)
            if lines and not isinstance(mark, _Unmarked) and not self._target.remembers_ops:
                lines.insert(0, json.dumps({MARK: mark}))
            if lines:
                directory = os.path.dirname(self.path)
                # The time first: importers take files oldest first, so the store gets them in order.
                unique = f"{time.time():.6f}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                name = os.path.join(directory, f"pending-{unique}.jsonl")
                _write_durably(name, lines)
                self._spilled.add(name)
                logger.warning("fastmem: %s %s; %d writes kept in %s (imported by the next writer)",
                               self.path, why, count, name)  # fmt: skip
        except Exception as exc:
            n = sum(op.kind not in _NO_OPS for op in ops)
            logger.error("fastmem: %d writes to %s not saved: they %s, and could not be kept in a spill file "
                         "either: %s", n, self.path, why, exc)  # fmt: skip
            error = _not_saved(cause or exc, f"it could not be written, nor kept in a spill file ({exc})")
            for op in ops:
                op.future.set_exception(error)
            return
        for op in ops:
            op.future.set_result(PENDING)

    def _import_spilled(self, store: fastmem.MemoryStore) -> bool:
        """Apply every spill file of the store, oldest first; True when none of this
        writer's own is left (they must reach the store before its later writes)."""
        for name in sorted(glob.glob(os.path.join(os.path.dirname(self.path), SPILL_GLOB))):
            if not self._import_file(store, name, wait=name in self._spilled):
                break  # the lock is taken for long, or the disk fails: the rest later, in order
        self._spilled = {name for name in self._spilled if os.path.exists(name)}
        return not self._spilled

    def _import_file(self, store: fastmem.MemoryStore, name: str, *, wait: bool) -> bool:
        """Import one spill file once (see the module docstring); False when the store
        could not take it (its lock stayed taken, or a fault of the disk): what is left of
        the file is kept, for the next try."""
        try:
            fd = os.open(name, os.O_RDONLY)
        except FileNotFoundError:  # imported meanwhile
            return True
        except OSError as exc:
            logger.warning("fastmem: cannot import %s: %s", name, exc)
            return True
        try:
            if not _claim(fd, WRITE_WAIT if wait else 0.0):
                return True  # another process is importing it
            if os.fstat(fd).st_nlink == 0:  # imported and deleted while we waited
                return True
            with os.fdopen(os.dup(fd), encoding="utf-8", errors="replace") as f:
                entries, damaged, mark = _entries(f, name)
        except OSError as exc:
            os.close(fd)
            logger.warning("fastmem: cannot import %s: %s", name, exc)
            return True
        try:
            if not self._target.remembers_ops:
                if isinstance(mark, _Unmarked):
                    # Before the first write is applied: a later importer (this one killed,
                    # say) knows where to look for what it applied. The new file is locked
                    # before it takes the name: no other importer can start on it.
                    mark = _high_mark(store)
                    fd = _replace_locked(name, [json.dumps({MARK: mark})] + [json.dumps(e) for e in entries], fd)
                else:
                    entries = _not_stored(store, entries, mark, name)
            done, stopped = self._apply_entries(store, entries, name)
            if done < len(entries):
                # Keep what is left under the same name (old first: the order holds); an
                # importer waiting on the old file finds it deleted.
                head = [] if isinstance(mark, _Unmarked) else [json.dumps({MARK: mark})]
                _write_durably(name, head + [json.dumps(e) for e in entries[done:]])
                if not isinstance(stopped, StoreLockedError):
                    self._warn("kept writes in %s wait: %s", name, stopped)
                    self._drop_store()
                return False
            self._target.flush(store)
            if damaged:  # lines no writer wrote (damage): kept for a person, out of the glob
                aside = os.path.join(os.path.dirname(name), "damaged-" + os.path.basename(name))
                os.replace(name, aside)
                logger.error("fastmem: %s had %d damaged lines; the file is kept as %s", name, damaged, aside)
            else:
                os.unlink(name)  # before the flock goes: nobody imports it again
            logger.info("fastmem: imported %d kept writes from %s", len(entries), name)
            self._warned = False
            return True
        except Exception as exc:
            # A fault while importing: the file stays (a sync that failed may have lost what
            # was applied; applied again, it is there twice rather than never).
            self._warn("cannot import %s now: %s", name, exc)
            self._drop_store()
            return False
        finally:
            os.close(fd)  # lets go of the flock

    def _apply_entries(
        self, store: fastmem.MemoryStore, entries: list[dict[str, Any]], name: str
    ) -> tuple[int, BaseException | None]:
        """Apply entries in order (runs of adds tried as one batch, under their op id, as
        one commit each); the number applied before the store's lock stayed taken or the
        disk (or the store's server) failed (all of them otherwise), and that error."""
        i = 0
        while i < len(entries):
            j = i + 1
            op = entries[i].get("op")  # None in a file written before writes had op ids
            if entries[i].get("kind") == "add":
                while j < len(entries) and entries[j].get("kind") == "add" and entries[j].get("op") == op:
                    j += 1
            run = entries[i:j]
            try:
                if run[0].get("kind") == "add":
                    try:
                        self._locked_retry(self._target.scoped(store, op).add_many, [e["args"] for e in run])
                    except Exception as exc:
                        if self._kept(exc):
                            raise
                        if op is not None:  # tried alone from now on (kept so): each its own id
                            for k, e in enumerate(run):
                                e["op"] = f"{op}/{k}"
                        for k, e in enumerate(run):  # a bad entry: the others one by one
                            try:
                                self._locked_retry(self._target.scoped(store, e.get("op")).add, **e["args"])
                            except Exception as exc2:
                                if self._kept(exc2):
                                    return i + k, exc2
                                logger.warning("fastmem: a kept write in %s failed: %s", name, exc2)
                else:
                    scoped = self._target.scoped(store, op)
                    self._locked_retry(self._apply, scoped, run[0]["kind"], run[0]["args"])
            except Exception as exc:
                if self._kept(exc):
                    return i, exc
                logger.warning("fastmem: a kept write in %s failed: %s", name, exc)
            i = j
        return i, None

    def _kept(self, exc: BaseException) -> bool:
        return _kept_for(exc) or isinstance(exc, self._target.kept)


def _give_op_ids(ops: list[_Op]) -> None:
    """An op id for each op that has none: one for each run of consecutive adds (tried as
    one batch), one for each other write."""
    run: str | None = None
    for op in ops:
        if op.op_id is not None:
            run = None
        elif op.kind == "add":
            run = op.op_id = run or new_op_id()
        else:
            run, op.op_id = None, new_op_id()


def _kept_for(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` is kept to be tried again: the store's lock held
    too long, or a fault of the disk or file system (a full disk, an I/O error, a read-only
    remount: any ``OSError``), or a handle closed under it; not the caller's mistake (an
    unknown id, bad input), which is reported to the caller."""
    return isinstance(exc, (StoreLockedError, OSError, StoreClosedError))


def _not_saved(exc: BaseException, why: str) -> FastmemError:
    """The error a caller gets for a write that was not made: it says "not saved"."""
    kind = StoreFullError if isinstance(exc, StoreFullError) else DurabilityError
    code = getattr(exc, "errno", None) or errno.EIO
    return kind(code, f"not saved: {why}: {exc}", getattr(exc, "filename", None))


def _claim(fd: int, wait: float) -> bool:
    """Take the import flock on a spill file, waiting up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _entries(f: Any, name: str) -> tuple[list[dict[str, Any]], int, str | None | _Unmarked]:
    """The kept writes of a spill file, how many lines were not one (damage: files are
    written whole, through a temp file and a rename), and its mark (``_UNMARKED``: none;
    a mark that is no id counts as ``None``, every memory checked: more work, never a
    write twice)."""
    out: list[dict[str, Any]] = []
    damaged = 0
    mark: str | None | _Unmarked = _UNMARKED
    for number, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and MARK in entry and not out and isinstance(mark, _Unmarked):
            value = entry[MARK]
            ok = isinstance(value, str) and len(value) < 22 and value[:1] == "m" and value[1:].isdigit()
            mark = value if ok and value[1:].isascii() else None
        elif isinstance(entry, dict) and isinstance(entry.get("kind"), str) and "args" in entry:
            out.append(entry)
        else:
            damaged += 1
            logger.warning("fastmem: %s line %d is not a kept write; skipped", name, number)
    return out, damaged, mark


def _mark_below(ids: list[Any]) -> str | None:
    """The mark under the first of ``ids`` (memory ids a batch was given)."""
    first = min(int(mid[1:]) for mid in ids)
    return f"m{first - 1}" if first > 0 else None


def _high_mark(store: fastmem.MemoryStore) -> str | None:
    """An id at or above every id given out so far, or below none of them; None in an
    empty store. (Ids are unique and grow from m0: the highest is at least the count of
    memories less one; the live ones above that say the rest.)"""
    count = len(store)
    lower = f"m{count - 1}" if count else None
    above = store.ids(after=lower)
    return above[-1] if above else lower


def _not_stored(store: fastmem.MemoryStore, entries: list[dict[str, Any]], mark: str | None,
                name: str) -> list[dict[str, Any]]:  # fmt: skip
    """``entries`` less the adds the store holds already, among the memories above
    ``mark`` (an import cut short applied them): the same text, time, session and type."""
    wanted: dict[str, list[int]] = defaultdict(list)  # text -> the adds' positions
    for k, entry in enumerate(entries):
        args = entry.get("args")
        if entry.get("kind") == "add" and isinstance(args, dict) and isinstance(args.get("text"), str):
            wanted[args["text"]].append(k)
    if not wanted:
        return entries
    stored: set[int] = set()
    for mid in store.ids(after=mark):
        try:
            memory = store.get(mid)
        except FastmemError:  # forgotten meanwhile
            continue
        for k in wanted.get(memory.text, ()):
            args = entries[k]["args"]
            if (k not in stored and args.get("session") == memory.session
                    and args.get("type", "conversation") == memory.type
                    and (args.get("timestamp") is None or args["timestamp"] == memory.timestamp)):  # fmt: skip
                stored.add(k)
                break
    if stored:
        logger.info("fastmem: %d kept writes of %s were stored by an earlier import; not applied again",
                    len(stored), name)  # fmt: skip
    return [entry for k, entry in enumerate(entries) if k not in stored]


def _replace_locked(name: str, lines: list[str], fd: int) -> int:
    """Write ``lines`` durably over ``name`` (a spill file whose flock ``fd`` holds), the
    new file flocked before it takes the name: the descriptor of the new file, which
    holds its flock (``fd`` is closed)."""
    directory = os.path.dirname(name)
    new, tmp = tempfile.mkstemp(dir=directory, prefix=".pending-")
    try:
        data = ("\n".join(lines) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(new, view) :]
        os.fsync(new)
        fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else has it yet
        os.replace(tmp, name)
        tmp = ""
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the rename itself must survive a power loss
        finally:
            os.close(dfd)
    except BaseException:
        os.close(new)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    os.close(fd)
    return new


def _write_durably(name: str, lines: list[str]) -> None:
    """Write ``name`` whole or not at all: a temp file, fsynced, renamed over it."""
    directory = os.path.dirname(name)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".pending-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a power loss
    finally:
        os.close(dfd)

"""Power-cut simulation (issue 18, item 4): record every file operation a store makes, then
build the files a power cut at any point could leave, and check what a reopen returns.

The recorder sits at the fault seam of ``tests/faults.py`` (the module globals ``os`` of
fastmem's I/O modules; the compiled kernels do no file I/O, ``tests/test_faults.py``
checks it) and logs, in order: every ``write``/``pwrite`` (offset and bytes; also the
index's buffered writes through ``os.fdopen``), ``ftruncate``, ``fdatasync``/``fsync`` of a
file, the creation of a file, ``replace``/``rename``, ``remove``, and each directory fsync.

The model of what survives a cut (what ext4 and most journaling file systems promise):

- a file's bytes as of its last ``fsync``/``fdatasync`` survive; of what was written (or
  cut) since, any subset of its 4 KiB pages, or a prefix of the operations whose last
  write is torn at a page boundary; a page not written reads as zeros when the size grew;
- directory entries (creations, renames, removals) survive as of the last directory
  fsync, plus a prefix of the entry operations since (the journal keeps their order): a
  rename is atomic (old or new name, never neither), and a file whose creation did not
  survive is gone with its bytes.

A sync is logged twice, when it begins and when it returns: it makes durable what was
written before it began (another thread's write between the two, a group commit's
beside the caller's, may or may not be).

A workload (``Workload``) runs adds, batches, updates, forgets, flushes, checkpoints,
compactions and reopenings under ``durability="always"`` or ``"batch"``, through one
writer handle or several (``writers``: 2 to 4 handles of the store, each with its own
descriptors, writer lock turns and group commit thread, taking turns at random), recording
a mark before and after each operation and the store's contents after it. ``check_cut``
builds the files for a cut at a given point, opens them and compares: every memory
acknowledged before the cut is there, field for field; nothing is returned that no
operation wrote (a garbled or resurrected memory), and ``verify()`` is clean.

Acknowledged: under ``"always"``, when its call returned. Under ``"batch"``, when a sync
of the data file it was written to returned that began after its call returned (the
group commit's, every few ms, or a ``flush``, ``checkpoint`` or ``close``: the group commit
is an acknowledgement point), or when an operation that replaced the data file (a
compaction) returned after it; with one writer, also when a ``flush``, ``checkpoint``,
``compact`` or reopen returned after it.
"""

from __future__ import annotations

import itertools
import os as _real_os
import random
import stat
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import faults
from faults import MODULES

import fastmem
from fastmem import ContextPolicy

PAGE = 4096
QUIET = ContextPolicy(preload=0, recent=0)


class Recorder:
    """Installs recording proxies at the seam; ``log`` is the list of events."""

    def __init__(self, directory: str) -> None:
        self.dir = _real_os.path.abspath(directory)
        self.log: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._ids: dict[int, int] = {}  # real inode -> the model's file id (inodes are reused)
        self._next = 0
        self._tokens = itertools.count()  # pairs a sync's begin and end events
        self.initial: dict[str, tuple[int, bytes]] = {}  # name -> (file id, bytes): all durable
        for name in sorted(_real_os.listdir(self.dir)):
            path = _real_os.path.join(self.dir, name)
            if _real_os.path.isfile(path):
                with open(path, "rb") as f:
                    self.initial[name] = (self._new_id(_real_os.stat(path).st_ino), f.read())
        self._saved: list[tuple[Any, str, Any]] = []

    def _new_id(self, ino: int) -> int:
        self._next += 1
        self._ids[ino] = self._next
        return self._next

    def _name(self, path: Any) -> str | None:
        path = _real_os.path.abspath(_real_os.fsdecode(path))
        return _real_os.path.basename(path) if _real_os.path.dirname(path) == self.dir else None

    def _file(self, fd: int) -> int | None:
        st = _real_os.fstat(fd)
        return None if stat.S_ISDIR(st.st_mode) else self._ids.get(st.st_ino)

    def add(self, *event: Any) -> None:
        with self._lock:
            self.log.append(event)

    def mark(self, *label: Any) -> None:
        """A mark in the log; the calling thread's id last (which thread renamed what)."""
        self.add("mark", *label, threading.get_ident())

    def install(self) -> Recorder:
        return faults.install(self, MODULES, {"os": _RecOs(self)})

    def uninstall(self) -> None:
        faults.uninstall(self)

    def __enter__(self) -> Recorder:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


class _RecOs:
    def __init__(self, rec: Recorder) -> None:
        self._r = rec

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_os, name)

    def write(self, fd: int, data: Any) -> int:
        fid = self._r._file(fd)
        if fid is None:
            return _real_os.write(fd, data)
        with self._r._lock:  # the offset and the write as one step
            append = _fcntl_append(fd)
            offset = _real_os.fstat(fd).st_size if append else _real_os.lseek(fd, 0, _real_os.SEEK_CUR)
            n = _real_os.write(fd, data)
            self._r.log.append(("write", fid, offset, bytes(memoryview(data)[:n])))
        return n

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        n = _real_os.pwrite(fd, data, offset)
        fid = self._r._file(fd)
        if fid is not None:
            self._r.add("write", fid, offset, bytes(memoryview(data)[:n]))
        return n

    def ftruncate(self, fd: int, length: int) -> None:
        _real_os.ftruncate(fd, length)
        fid = self._r._file(fd)
        if fid is not None:
            self._r.add("trunc", fid, length)

    def _sync(self, fd: int, call: Any) -> None:
        """A file's sync, logged when it begins and when it returns (a group commit's
        thread syncs while the caller's thread writes: only what was written before the
        sync began is sure to be durable when it returns)."""
        fid = self._r._file(fd)
        if fid is None:
            call(fd)
            return
        token = next(self._r._tokens)
        who = "group" if threading.current_thread().name == "fastmem-commit" else "call"
        self._r.add("syncing", fid, token)
        call(fd)
        self._r.add("sync", fid, token, who)

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, _real_os.fdatasync)

    def fsync(self, fd: int) -> None:
        if stat.S_ISDIR(_real_os.fstat(fd).st_mode):
            _real_os.fsync(fd)
            self._r.add("dirsync")
        else:
            self._sync(fd, _real_os.fsync)

    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        name = self._r._name(path)
        existed = _real_os.path.exists(path)
        fd = _real_os.open(path, flags, mode, **kw)
        if name is not None and not stat.S_ISDIR(_real_os.fstat(fd).st_mode):
            ino = _real_os.fstat(fd).st_ino
            if not existed:
                with self._r._lock:
                    self._r.log.append(("create", name, self._r._new_id(ino)))
            elif flags & _real_os.O_TRUNC:
                self._r.add("trunc", self._r._ids[ino], 0)
        return fd

    def replace(self, src: Any, dst: Any) -> None:
        _real_os.replace(src, dst)
        a, b = self._r._name(src), self._r._name(dst)
        if a is not None and b is not None:
            self._r.add("rename", a, b, threading.get_ident())

    rename = replace

    def remove(self, path: Any) -> None:
        _real_os.remove(path)
        name = self._r._name(path)
        if name is not None:
            self._r.add("unlink", name)

    unlink = remove

    def fdopen(self, fd: int, *args: Any, **kw: Any) -> Any:
        return _RecFile(_real_os.fdopen(fd, *args, **kw), self._r, self._r._file(fd))


def _fcntl_append(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & _real_os.O_APPEND)


class _RecFile:
    """A buffered file (the index is written so): each ``write`` logged at its offset."""

    def __init__(self, f: Any, rec: Recorder, fid: int | None) -> None:
        self._file, self._r, self._fid = f, rec, fid

    def write(self, data: Any) -> int:
        offset = self._file.tell()
        n = self._file.write(data)
        if self._fid is not None:
            self._r.add("write", self._fid, offset, bytes(memoryview(data).cast("B")[:n]))
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _RecFile:
        self._file.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.__exit__(*exc)


# --- what a cut leaves ------------------------------------------------------------------------


@dataclass
class _FileState:
    durable: bytes = b""
    current: bytearray = field(default_factory=bytearray)
    pending: list[tuple[Any, ...]] = field(default_factory=list)  # writes and cuts not synced
    done: int = 0  # operations made durable (the number of the first one pending)

    def sync(self, upto: int) -> None:
        """Make the operations before number ``upto`` durable."""
        if upto > self.done:
            buf = bytearray(self.durable)
            for op in self.pending[: upto - self.done]:
                _apply(buf, op)
            self.durable, self.pending, self.done = bytes(buf), self.pending[upto - self.done :], upto


def _apply(buf: bytearray, op: tuple[Any, ...]) -> None:
    if op[0] == "trunc":
        del buf[op[1] :]
        return
    _, offset, data = op
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def _pages(op: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A write as writes of the 4 KiB pages of the file it touches."""
    if op[0] != "write":
        return [op]
    _, offset, data = op
    out, at = [], offset
    while at < offset + len(data):
        end = min((at // PAGE + 1) * PAGE, offset + len(data))
        out.append(("write", at, data[at - offset : end - offset]))
        at = end
    return out


def files_at_cut(rec: Recorder, cut: int, rng: random.Random) -> tuple[dict[str, bytes], dict[str, int]]:
    """The files (name -> bytes) that a power cut after ``rec.log[:cut]`` may leave, and
    how many bytes of each were synced (what follows is the cut's)."""
    files: dict[int, _FileState] = {}
    for fid, data in rec.initial.values():
        files[fid] = _FileState(data, bytearray(data))
    names = {name: fid for name, (fid, _) in rec.initial.items()}
    durable_names = dict(names)
    name_ops: list[tuple[Any, ...]] = []  # entry operations since the last directory fsync
    began: dict[int, int] = {}  # a sync begun: token -> the file's operations before it
    for event in rec.log[:cut]:
        kind = event[0]
        if kind == "write":
            state = files[event[1]]
            op = ("write", event[2], event[3])
            _apply(state.current, op)
            state.pending.append(op)
        elif kind == "trunc":
            state = files[event[1]]
            op = ("trunc", event[2])
            _apply(state.current, op)
            state.pending.append(op)
        elif kind == "syncing":
            state = files[event[1]]
            began[event[2]] = state.done + len(state.pending)
        elif kind == "sync":
            state = files[event[1]]
            # (An event of two fields, a test's: everything written before it.)
            state.sync(began.pop(event[2]) if len(event) > 2 else state.done + len(state.pending))
        elif kind == "create":
            files[event[2]] = _FileState()
            names[event[1]] = event[2]
            name_ops.append(event)
        elif kind == "rename":
            names[event[2]] = names.pop(event[1])
            name_ops.append(event)
        elif kind == "unlink":
            names.pop(event[1], None)
            name_ops.append(event)
        elif kind == "dirsync":
            durable_names, name_ops = dict(names), []
    # The directory: what its last fsync made durable, then a prefix of the entry operations.
    left = dict(durable_names)
    for event in name_ops[: rng.randint(0, len(name_ops))]:
        if event[0] == "create":
            left[event[1]] = event[2]
        elif event[0] == "rename":
            if event[1] in left:
                left[event[2]] = left.pop(event[1])
        else:
            left.pop(event[1], None)
    out, synced = {}, {}
    for name, fid in left.items():
        state = files[fid]
        buf = bytearray(state.durable)
        ops = state.pending
        how = rng.random()
        if how < 0.4:  # a prefix of the operations, the last write torn at a page boundary
            keep = rng.randint(0, len(ops))
            for op in ops[:keep]:
                _apply(buf, op)
            if keep < len(ops):
                pages = _pages(ops[keep])
                for op in pages[: rng.randint(0, len(pages))]:
                    _apply(buf, op)
        else:  # any subset of the pages written since the last sync
            size = len(state.current)
            for op in ops:
                for page in _pages(op):
                    if page[0] == "trunc" or rng.random() < 0.5:
                        _apply(buf, page)
            if how < 0.7 and len(buf) < size:  # the size reached the disk, some pages not
                buf.extend(bytes(size - len(buf)))
        out[name] = bytes(buf)
        synced[name] = len(state.durable)
    return out, synced


# --- the workload ------------------------------------------------------------------------


def _contents(store: fastmem.MemoryStore) -> dict[str, tuple[Any, ...]]:
    return {m.id: tuple(m) for m in store}


class Workload:
    """Random store operations, recorded: marks before and after each, and the contents
    after it (``snapshots[k]``; ``snapshots[-1]`` is before the first). ``writers``: that
    many handles of the store, each operation made through one of them at random."""

    OPS = ("add", "add", "add", "add_many", "add_many", "update", "forget", "flush",
           "checkpoint", "compact", "reopen")  # fmt: skip

    def __init__(self, directory: str, durability: str, seed: int, n_ops: int = 30, writers: int = 1) -> None:
        self.dir, self.durability, self.rng = directory, durability, random.Random(seed)
        self.base = _real_os.path.join(directory, "s")
        self.n_ops, self.writers = n_ops, writers
        self.by_group_commit = 0  # operations whose first acknowledgement was a group commit's sync
        with fastmem.open(self.base, embedder=None, policy=QUIET, durability="always") as store:
            store.add("the first memory", timestamp=1.0, metadata={"seed": seed})
            self.snapshots: dict[int, dict[str, tuple[Any, ...]]] = {-1: _contents(store)}
        self.acked: dict[int, int] = {}  # op -> the mark index after which it is acknowledged
        self.rec = Recorder(directory)

    def _open(self) -> fastmem.MemoryStore:
        return fastmem.open(self.base, embedder=None, policy=QUIET, durability=self.durability)

    def run(self) -> None:
        rng, rec = self.rng, self.rec
        waiting: list[int] = []  # "batch": ops not yet made durable by a flush or close
        one = self.writers == 1
        with rec:
            stores = [self._open() for _ in range(self.writers)]
            try:
                for k in range(self.n_ops):
                    h = 0 if one else rng.randrange(self.writers)
                    op = rng.choice(self.OPS)
                    live = sorted(self.snapshots[k - 1])
                    rec.mark("begin", k, op, h)
                    self._do(stores[h], op, live, k)
                    if op == "reopen":
                        stores[h].close()
                        stores[h] = self._open()
                    rec.mark("end", k)
                    end = len(rec.log)
                    waiting.append(k)
                    if self.durability == "always" or (one and op in ("flush", "reopen", "compact", "checkpoint")):
                        for j in waiting:  # made durable when this one returned
                            self.acked[j] = end
                        waiting = []
                    self.snapshots[k] = _contents(stores[h])
                    if self.durability == "batch" and rng.random() < 0.3:
                        time.sleep(rng.uniform(0.0, 0.012))  # a pause: the group commit's thread syncs
            finally:
                for store in stores:
                    store.close()
        if one:  # closed: durable (several handles: as far as a sync of the last data file says)
            for j in waiting:
                self.acked[j] = len(rec.log)
        if self.durability == "batch":
            synced, by_group = synced_acks(rec.log, self.base + ".dat", rec.initial)
            for j, at in synced.items():
                if at < self.acked.get(j, len(rec.log) + 1):
                    self.acked[j] = at
                    self.by_group_commit += j in by_group

    def _do(self, store: fastmem.MemoryStore, op: str, live: list[str], k: int) -> None:
        rng = self.rng
        t = 10.0 + k
        if op == "add":
            store.add(f"memory {k} " + "word " * rng.randint(0, 300), timestamp=t,
                      metadata={"k": k}, session=f"s{k % 3}")  # fmt: skip
        elif op == "add_many":
            store.add_many([{"text": f"batch {k}.{i} " + "x" * rng.randint(0, 2000), "timestamp": t + i / 10}
                            for i in range(rng.randint(2, 6))])  # fmt: skip
        elif op == "update" and live:
            store.update(rng.choice(live), importance=rng.random(), metadata={"u": k}, pinned=rng.random() < 0.3)
        elif op == "forget" and len(live) > 1:
            store.forget(rng.choice(live))
        elif op == "flush":
            store.flush()
        elif op == "checkpoint":
            store.checkpoint()
        elif op == "compact":
            store.compact()


def synced_acks(log: list[tuple[Any, ...]], dat: str,
                initial: dict[str, tuple[int, bytes]]) -> tuple[dict[int, int], set[int]]:  # fmt: skip
    """Under ``"batch"``: operation -> the log position where it is acknowledged by a
    sync (the first sync of the data file it was written to that began after it returned),
    or by an operation that replaced the data file (a compaction: everything before it is
    in the new file, synced, before that returns); and the operations a group commit's
    sync (not a caller's) acknowledged."""
    name = _real_os.path.basename(dat)
    names = {n: fid for n, (fid, _) in initial.items()}
    ended: list[tuple[int, int | None]] = []  # (op, the data file's id when it returned)
    acked: dict[int, int] = {}
    by_group: set[int] = set()
    began: dict[int, int] = {}  # token -> how many ops had returned when the sync began
    running: dict[int, Any] = {}  # thread -> the op it runs
    replaced: dict[Any, set[int | None]] = {}  # op -> the data files it replaced (renamed over)
    for position, event in enumerate(log):
        kind = event[0]
        if kind == "create":
            names[event[1]] = event[2]
        elif kind == "rename":
            if event[2] == name and len(event) > 3 and event[3] in running:
                replaced[running[event[3]]].add(names.get(name))
            names[event[2]] = names.pop(event[1])
        elif kind == "unlink":
            names.pop(event[1], None)
        elif kind == "mark" and event[1] == "begin":
            running[event[-1]] = event[2]
            replaced[event[2]] = set()
        elif kind == "mark" and event[1] == "end":
            running.pop(event[-1], None)
            ended.append((event[2], names.get(name)))
            old = replaced.pop(event[2], set())
            if old:  # it replaced the data file: what was in the old one is in the new one
                for op, in_file in ended[:-1]:
                    if in_file in old:
                        acked.setdefault(op, position + 1)
                acked.setdefault(event[2], position + 1)
        elif kind == "syncing":
            began[event[2]] = len(ended)
        elif kind == "sync" and len(event) > 2:
            for op, fid in ended[: began.pop(event[2], 0)]:
                if fid == event[1] and op not in acked:
                    acked[op] = position + 1
                    if event[3] == "group":
                        by_group.add(op)
    return acked, by_group


class ConcurrentWorkload:
    """Several writers at once: ``writers`` threads, each with its own handle of the store,
    adding memories (one, or a batch) as fast as they can, now and then a ``flush``; one
    of them compacts now and then. What each call returned is kept (``written``: id ->
    the memory's fields); the texts of every call begun (``texts``), to tell a memory in
    flight from a garbled one. Operations are named ``"<writer>.<n>"`` in the marks."""

    def __init__(self, directory: str, durability: str, seed: int, writers: int = 3, n_ops: int = 12) -> None:
        self.dir, self.durability, self.seed = directory, durability, seed
        self.base = _real_os.path.join(directory, "s")
        self.writers, self.n_ops = writers, n_ops
        with fastmem.open(self.base, embedder=None, policy=QUIET, durability="always") as store:
            first = store.add("the first memory", timestamp=1.0, metadata={"seed": seed})
            self.written: dict[str, tuple[Any, ...]] = {first: tuple(store.get(first))}
        self.texts: set[str] = {"the first memory"}
        self.ids: dict[str, list[str]] = {}  # op -> the ids it returned
        self.acked: dict[str, int] = {}
        self.by_group_commit = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.rec = Recorder(directory)

    def _writer(self, w: int, store: fastmem.MemoryStore) -> None:
        rng = random.Random(self.seed * 31 + w)
        rec = self.rec
        for n in range(self.n_ops):
            key = f"{w}.{n}"
            r = rng.random()
            op = "add" if r < 0.55 else "add_many" if r < 0.85 else "flush" if r < 0.93 or w else "compact"
            items = [{"text": f"w{w} op{n} item{i} " + "word " * rng.randint(0, 400),
                      "timestamp": 100.0 + w + n / 100 + i / 10_000, "session": f"w{w}", "metadata": {"w": w, "n": n}}
                     for i in range(1 if op == "add" else rng.randint(2, 5) if op == "add_many" else 0)]  # fmt: skip
            with self._lock:
                self.texts.update(item["text"] for item in items)
            rec.mark("begin", key, op, w)
            if op == "add":
                ids = [store.add(**items[0])]
            elif op == "add_many":
                ids = store.add_many(items)
            elif op == "flush":
                ids = []
                store.flush()
            else:
                ids = []
                store.compact()
            rec.mark("end", key)
            fields = {mid: tuple(store.get(mid)) for mid in ids}
            with self._lock:
                self.ids[key] = ids
                self.written.update(fields)
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0.0, 0.008))  # a pause: the group commit's thread syncs

    def run(self) -> None:
        with self.rec:
            stores = [fastmem.open(self.base, embedder=None, policy=QUIET, durability=self.durability)
                      for _ in range(self.writers)]  # fmt: skip
            threads = [threading.Thread(target=self._guarded, args=(w, s)) for w, s in enumerate(stores)]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                for store in stores:
                    store.close()
        if self.durability == "always":
            ends = {e[2]: i + 1 for i, e in enumerate(self.rec.log) if e[0] == "mark" and e[1] == "end"}
            self.acked = {key: at for key, at in ends.items() if key in self.ids}
        else:
            self.acked, by_group = synced_acks(self.rec.log, self.base + ".dat", self.rec.initial)
            self.by_group_commit = len(by_group)

    def _guarded(self, w: int, store: fastmem.MemoryStore) -> None:
        try:
            self._writer(w, store)
        except Exception as exc:  # reported by the check: a writer must not fail
            self.errors.append(f"writer {w}: {exc!r}")


def check_concurrent_cut(work: ConcurrentWorkload, cut: int, rng: random.Random, scratch: str) -> CutResult:
    """Build the files of a cut after ``work.rec.log[:cut]``, open them and compare: every
    memory acknowledged before the cut is there, field for field; every memory there was
    written by some call (returned or in flight), once; verify() clean."""
    got, report, synced, failed = _open_cut(work.rec, cut, rng, scratch)
    if failed is not None:
        return failed
    lost, garbled = [], []
    acked_ids = [mid for key, at in work.acked.items() if at <= cut for mid in work.ids.get(key, ())]
    for mid in acked_ids:
        if got.get(mid) != work.written[mid]:
            lost.append(mid)
    seen: set[str] = set()
    for mid, fields in got.items():
        text = fields[1] if len(fields) > 1 else None
        known = work.written.get(mid)
        if (known is not None and known != fields) or (known is None and text not in work.texts) or text in seen:
            garbled.append(mid)
        seen.add(text)
    return _result(lost, garbled, report, synced)


@dataclass
class CutResult:
    lost: list[str]
    garbled: list[str]
    problems: list[str]  # what verify() reports of the synced part: nothing may be
    reported: int = 0  # problems verify() reports in what was written since the last sync


def check_cut(work: Workload, cut: int, rng: random.Random, scratch: str) -> CutResult:
    """Build the files of a cut after ``work.rec.log[:cut]`` in ``scratch``, open them and
    compare with what was acknowledged before it."""
    got, report, synced, failed = _open_cut(work.rec, cut, rng, scratch)
    if failed is not None:
        return failed
    log = work.rec.log[:cut]
    started = max([e[2] for e in log if e[0] == "mark" and e[1] == "begin"], default=-1)
    acked = -1  # the last of the operations acknowledged before the cut, and all before it
    while work.acked.get(acked + 1, cut + 1) <= cut:
        acked += 1
    candidates = [work.snapshots[j] for j in range(acked, started + 1)]
    lost, garbled = [], []
    for mid in set(got).union(*candidates):
        if mid in got:
            if not any(snap.get(mid) == got[mid] for snap in candidates):
                garbled.append(mid)
        elif all(mid in snap for snap in candidates):
            lost.append(mid)
    return _result(lost, garbled, report, synced)


def _open_cut(rec: Recorder, cut: int, rng: random.Random, scratch: str) -> tuple[
        dict[str, tuple[Any, ...]], Any, dict[str, int], CutResult | None]:  # fmt: skip
    """The files a cut after ``rec.log[:cut]`` may leave, written to ``scratch`` and
    opened: (the memories, verify()'s report, the synced bytes of each file, or a
    failed result when they do not open or read)."""
    files, synced = files_at_cut(rec, cut, rng)
    for name in _real_os.listdir(scratch):
        _real_os.remove(_real_os.path.join(scratch, name))
    for name, data in files.items():
        with open(_real_os.path.join(scratch, name), "wb") as f:
            f.write(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastmem.RecoveryWarning)
        try:
            store = fastmem.open(_real_os.path.join(scratch, "s"), embedder=None, policy=QUIET)
        except fastmem.FastmemError as exc:
            return {}, None, synced, CutResult([], [], [f"does not open: {exc!r}"])
        try:
            return _contents(store), store.verify(), synced, None
        except fastmem.FastmemError as exc:  # a damaged record reached a read
            return {}, None, synced, CutResult([], [], [f"reading raised {exc!r}"])
        finally:
            store.close()


def _result(lost: list[str], garbled: list[str], report: Any, synced: dict[str, int]) -> CutResult:
    # A crash may leave pages of an unacknowledged append, not the whole of it: when that is
    # not a torn tail (zeros, or too short: cut at open), its bytes are kept and verify()
    # reports them; that is the cut, reported exactly, as long as it lies past what was synced.
    cut_start = synced.get("s.dat", 0)
    theirs = [p for p in report.problems if p.file == "dat" and p.offset is not None and p.offset >= cut_start]
    problems = [str(p) for p in report.problems if p not in theirs]
    return CutResult(lost, garbled, problems, len(theirs))


def run_cuts(directory: str, durability: str, seed: int, cuts: int, n_ops: int = 30,
             writers: int = 1, stats: dict[str, int] | None = None,
             at_once: bool = False) -> tuple[int, list[str], int]:  # fmt: skip
    """One recorded workload and ``cuts`` random cuts of it; (cuts made, failures, cuts
    whose unacknowledged tail verify() reports as damaged bytes). A :class:`Workload` of
    ``n_ops`` operations through ``writers`` handles interleaved, or with ``at_once`` a
    :class:`ConcurrentWorkload` (``writers`` threads at once; its writers' errors are
    failures too). ``stats``, when given, counts ``"acked"`` operations and those a group
    commit acknowledged (``"by_group_commit"``)."""
    name = f"{'conc' if at_once else 'work'}-{durability}-{seed}-{writers}"
    work_dir, scratch = _real_os.path.join(directory, name), _real_os.path.join(directory, f"cut-{name}")
    _real_os.makedirs(work_dir)
    _real_os.makedirs(scratch)
    work: Workload | ConcurrentWorkload
    if at_once:
        work = ConcurrentWorkload(work_dir, durability, seed, writers)
    else:
        work = Workload(work_dir, durability, seed, n_ops, writers)
    work.run()
    if stats is not None:
        stats["acked"] = stats.get("acked", 0) + len(work.acked)
        stats["by_group_commit"] = stats.get("by_group_commit", 0) + work.by_group_commit
    rng = random.Random(seed * 7919 + (3 if at_once else 1))
    errors = work.errors if isinstance(work, ConcurrentWorkload) else []
    failures, reported = [f"{durability} x{writers} seed {seed}: {e}" for e in errors], 0
    how = f"{durability} x{writers}{' at once,' if at_once else ''} seed {seed}"
    n = len(work.rec.log)
    for i in range(cuts):
        cut = rng.randint(0, n) if i else n  # the last one: after everything
        if isinstance(work, ConcurrentWorkload):
            result = check_concurrent_cut(work, cut, rng, scratch)
        else:
            result = check_cut(work, cut, rng, scratch)
        reported += result.reported > 0
        if result.lost or result.garbled or result.problems:
            failures.append(f"{how} cut {cut}/{n} ({work.rec.log[cut - 1] if cut else '-'}...): lost "
                            f"{result.lost}, garbled {result.garbled}, problems {result.problems}")  # fmt: skip
    return cuts, failures, reported


__all__ = ["ConcurrentWorkload", "Recorder", "Workload", "check_concurrent_cut", "check_cut", "files_at_cut",
           "run_cuts", "synced_acks"]

"""``MemoryStore``: an agent's memories in two files, reopened in milliseconds.

The store is the public facade: it checks every argument, takes the lock and delegates to
the subpackages that do the work: :mod:`fastmem.storage` (the files, the lock, the index,
writes, and maintenance: eviction, compaction, repair, backup, verify) and
:mod:`fastmem.recall` (ranking, and the context's levels and packer).

>>> import fastmem, tempfile, os
>>> d = tempfile.mkdtemp()
>>> with fastmem.open(os.path.join(d, "agent")) as store:
...     mid = store.add("The user's name is Ada.", type="fact")
...     store.get(mid).text
"The user's name is Ada."
>>> with fastmem.open(os.path.join(d, "agent"), readonly=True) as store:
...     [m.text for m in store.recent(5)]
["The user's name is Ada."]
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, cast

import numpy as np

from . import _format as fmt
from .recall import packing as _packing
from .recall import preload as _preload
from .recall import query as _query
from .recall import ranking as _ranking
from .recall import supersedes as _supersedes
from .storage import erase as _erase
from .storage import maintenance as _maintenance
from .storage import records as _records
from .storage import stats as _stats
from .storage.importance import importance_scores
from .storage.engine import Engine, no_cyclic_gc
from .storage.index import F_FLAGS, F_ID
from .storage.records import (
    DURABILITY, STORED_ENCODING, SUMMARY_TOKENS, check_real, check_str, check_utf8,
    Batch, check_batch, check_ids, check_open, check_search, prepare_commit,
)  # fmt: skip
from .embed import (  # light: the model's libraries load in its thread
    Embedder, default_embedder, embedder_for_existing,
)  # fmt: skip
from .errors import (
    DimensionMismatchError,
    EmbedderMismatchError,
    InvalidInputError,
    InvalidTypeError,
    UnknownMemoryError,
)
from .namespaces import base_path, namespace_path
from .summarize import KeySentences, Summarizer
from .tokens import TokenCounter, counter_for
from .types import (
    BackupReport, CompactReport, Context, ContextPolicy, EvictionPolicy, Hit, Memory,
    RecordInfo, RecordSize, RepairReport, Report, StoreStats,
)  # fmt: skip

__all__ = ["MemoryStore", "open", "repair", "DURABILITY", "LOCK_TIMEOUT"]

# Seconds a write (or an open) waits for another process's hold of the writer lock, by
# default: a write holds it for micro- to milliseconds. The edge's defaults are this one.
LOCK_TIMEOUT = 5.0
_DEFAULT: Any = object()  # a keyword left out: the documented default
_QUIET = ContextPolicy(preload=0, recent=0)  # no background loading: for a one-off job
# The default, made once (frozen): made per open, its checks cost ~0.02 ms of a fresh
# process's restart (issue 21).
_POLICY = ContextPolicy()


def open(  # noqa: A001 - the name users expect: fastmem.open(path)
    path: str | os.PathLike[str],
    *,
    dim: int | None = None,
    embedder: Embedder | None = _DEFAULT,
    readonly: bool = False,
    durability: str = "batch",
    timeout: float = LOCK_TIMEOUT,
    summarizer: Summarizer | None = _DEFAULT,
    policy: ContextPolicy | None = None,
    evict: EvictionPolicy | None = None,
    namespace: str | None = None,
) -> MemoryStore:
    """Open the store at ``path`` (``path.dat`` and ``path.idx``), creating it if needed.

    Args:
        path: the store's name; its two files are ``<path>.dat`` and ``<path>.idx``.
        dim: the embedding dimension (fixed by the first vector when left out).
        embedder: an object with ``encode(list[str]) -> array (n, dim)`` used when ``add``
            gets no ``embedding`` (see :class:`fastmem.embed.Embedder`); by default
            all-MiniLM-L6-v2 (int8, onnxruntime; shipped in the package), loaded in the background;
            ``None`` for none (keyword search only).
        readonly: never write (and never take the writer lock): for consumers that must not
            write, and read-only media. Every handle, read-only or not, sees every memory
            committed in any process before its call.
        durability: ``"always"`` (``add`` returns after fsync), ``"batch"`` (group commit:
            on disk within ~5 ms, and at ``flush``/``close``) or ``"none"`` (the OS decides).
            Under every mode, a memory whose ``add`` returned survives the process being
            killed; the modes differ on power loss.
        timeout: seconds a write (or the open) waits for another process's write or
            compaction before ``StoreLockedError``. Any number of processes open a store
            read-write; the writer lock is held for one write at a time.
        summarizer: writes each new memory's summary when none is given (default:
            :class:`fastmem.summarize.KeySentences`, 64 tokens); ``None`` for none.
        policy: how contexts are built and memories ranked (:class:`ContextPolicy`).
        evict: an :class:`EvictionPolicy` that ``checkpoint()`` and ``close()`` apply.
        namespace: one user's or profile's store under the directory ``path``: its own
            two files, ``<path>/<namespace>/memory.dat`` and ``.idx`` (see
            :mod:`fastmem.namespaces` for valid names); no other namespace's memory can
            enter its searches or contexts.

    Raises:
        StoreLockedError: another process held the writer lock for ``timeout`` seconds.
        StoreNotFoundError: ``readonly=True`` and there is no store at ``path``.
        CorruptionError: the data file's header is damaged or it is not a fastmem file.
        DimensionMismatchError: ``dim`` differs from the store's.
        EmbedderMismatchError: the store was written by another embedder.
        EmbedderUnavailableError: the default embedder is not installed.
    """
    if namespace is not None:
        path = namespace_path(path, namespace, create=readonly is False)
    return MemoryStore(
        path, dim=dim, embedder=embedder, readonly=readonly, durability=durability,
        timeout=timeout, summarizer=summarizer, policy=policy, evict=evict,
    )  # fmt: skip


def repair(
    path: str | os.PathLike[str], *, namespace: str | None = None, timeout: float = LOCK_TIMEOUT
) -> RepairReport:
    """Repair the store at ``path`` without opening it first: what ``MemoryStore.repair``
    does, and also for a store whose data-file header is damaged, which ``open`` refuses
    (the header is rebuilt from the records and the index; see
    ``fastmem.storage.maintenance.rebuild_header``). A store that is not damaged is rewritten
    with a fresh index and reported ``ok``.

    Raises:
        StoreNotFoundError: there is no store at ``path``.
        StoreLockedError: another process held the writer lock for ``timeout`` seconds.
        CorruptionError: the data file holds no intact record.
    """
    if namespace is not None:
        path = namespace_path(path, namespace, create=False)
    base = base_path(path)
    timeout = check_real(timeout, "timeout", 0.0, 1e9)
    rebuilt = _maintenance.rebuild_header(base + ".dat", base + ".idx", timeout)
    with MemoryStore(base, embedder=None, policy=_QUIET, timeout=timeout) as store:
        report = store.repair()
    if rebuilt is None:
        return report
    return dataclasses.replace(report, ok=False, cut=[rebuilt, *report.cut],
                               cut_bytes=report.cut_bytes + fmt.DAT_HEADER_SIZE)  # fmt: skip


class MemoryStore:
    """An open fastmem store; create it with :func:`fastmem.open`.

    Safe to share between threads and processes: any number of processes open a store
    read-write, and each write takes the writer lock (an OS lock on the data file, released
    when the process ends, however it ends) for its append; every call sees every write
    committed before it, in any process.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dim: int | None = None,
        embedder: Embedder | None = _DEFAULT,
        readonly: bool = False,
        durability: str = "batch",
        timeout: float = LOCK_TIMEOUT,
        summarizer: Summarizer | None = _DEFAULT,
        policy: ContextPolicy | None = None,
        evict: EvictionPolicy | None = None,
    ) -> None:
        base = base_path(path)
        timeout = check_open(dim, durability, readonly, timeout, embedder, summarizer, policy, _DEFAULT)
        self._eviction = _maintenance.check_policy(evict)
        self.path = base
        self.dat_path, self.idx_path = base + ".dat", base + ".idx"
        self.readonly = readonly
        self.durability = durability
        self.policy = policy or _POLICY
        self._preload: _preload.Preload | None = None
        self.tokens = TokenCounter(STORED_ENCODING)
        self._summarizer: Summarizer | None = (
            KeySentences(SUMMARY_TOKENS, self.tokens.count) if summarizer is _DEFAULT else summarizer
        )
        self._engine, self._embedder = _open_engine(
            base, embedder, readonly=readonly, durability=durability, timeout=timeout, dim=dim,
            cache_bytes=self.policy.cache_bytes,
        )  # fmt: skip
        self._last_call = time.monotonic()  # when a caller last asked for memories (see Preload)
        # Dropped without close() (even in a reference cycle): the engine lets go of the
        # files and the writer lock when the store is collected, with a ResourceWarning.
        weakref.finalize(self, self._engine.collected).atexit = False
        self._start_preload()

    # --- writing -----------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        type: str = "conversation",  # noqa: A002 - the documented keyword
        timestamp: float | None = None,
        session: str | None = None,
        importance: float | None = None,
        pinned: bool = False,
        metadata: dict[str, Any] | None = None,
        summary: str | None = None,
        embedding: Any = None,
        supersedes: str | None = None,
    ) -> str:
        """Store one memory and return its id (``"m<number>"``).

        Args:
            text: the memory's content; non-empty, at most 1 MiB of UTF-8.
            type: ``conversation``, ``tool_result``, ``plan``, ``fact`` or your own name.
            timestamp: Unix seconds; now when left out.
            session: the session it belongs to.
            importance: 0 to 1; left out, the type's default (fact 0.9 ... conversation 0.3).
            pinned: kept in every context ("remember this").
            metadata: a dict of msgpack types, at most 64 KiB packed.
            summary: a short form of the text (at most 64 KiB).
            embedding: a precomputed vector of the store's dimension (normalised on write).
            supersedes: the id of a live memory this one replaces (a changed fact, a
                corrected figure): the old one stays, marked ``superseded_by`` the new id
                in its metadata, and contexts show the newest version in its place.

        Raises:
            InvalidInputError: a value is out of range (nothing is written).
            UnknownMemoryError: ``supersedes`` is no live memory's id (nothing is written).
            InvalidTypeError: a value has the wrong type (nothing is written).
            DimensionMismatchError: the embedding's length is not the store's dimension.
        """
        return self._add(
            [{"text": text, "type": type, "timestamp": timestamp, "session": session,
              "importance": importance, "pinned": pinned, "metadata": metadata,
              "summary": summary, "embedding": embedding}], supersedes
        )[0]  # fmt: skip

    def add_many(self, items: Iterable[Mapping[str, Any]]) -> list[str]:
        """Store many memories in one write and one commit; returns their ids in order.

        Each item is a dict with ``add``'s keyword names (``text`` required; ``supersedes``
        is ``add``'s only). Every item is checked before anything is written: one bad item
        raises and writes nothing.
        """
        return self._add(items, None)

    def _add(self, items: Iterable[Mapping[str, Any]], supersedes: str | None) -> list[str]:
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise InvalidTypeError("add_many takes an iterable of dicts")
        items = list(items)
        engine = self._engine
        with engine.lock:
            engine.check_writable(appending=True)
            dim = engine.index.dim
            if supersedes is not None:
                engine.live_row(supersedes)  # fails before the embedding (checked again below)
        if not items:
            return []
        # Checked, embedded and summarized before the writer lock: other processes' writes
        # wait only for the append. No collection walks the batch: it is freed before one can run.
        with no_cyclic_gc():
            now = time.time()
            batch = Batch(items, now)
            vectors16 = prepare_commit(batch, self._embedder, self._summarizer, self.tokens, dim)
            # A plain add only appends: a checkpoint's thread may go on beside it. The link
            # to the old memory changes one of its rows: that waits for the thread.
            with engine.writing(appending=supersedes is None):
                ids = (engine.commit_memories(batch, vectors16) if supersedes is None
                       else _supersedes.commit(engine, batch, vectors16, supersedes))  # fmt: skip
            del batch, vectors16
        return ids

    def check_items(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Check items as ``add_many`` would, writing nothing: what an import does before
        its first write, so that a bad line in a file leaves the store as it was. An
        item's embedding must have the store's dimension (or, in an empty store, the
        first embedding's).

        Raises:
            InvalidInputError: an item is invalid; its ``item`` attribute says which.
            InvalidTypeError: an item has a value of the wrong type (``item`` too).
        """
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise InvalidTypeError("check_items takes an iterable of dicts")
        with self._engine.lock:
            self._engine.check()
            dim = self._engine.index.dim
        check_batch(items, dim)

    def update(
        self,
        mid: str,
        *,
        importance: float | None = None,
        pinned: bool | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Change a memory's importance, pin or metadata (``None`` leaves a field as it is).

        Raises:
            UnknownMemoryError: no live memory has this id.
        """
        engine = self._engine
        with engine.writing():
            g, row = engine.live_row(mid)
            payload: dict[str, Any] = {"i": row[F_ID], "t": time.time()}
            if importance is not None:
                payload["p"] = check_real(importance, "importance", 0.0, 1.0)
            if pinned is not None:
                if not isinstance(pinned, bool):
                    raise InvalidTypeError("pinned must be True or False")
                payload["n"] = pinned
            if metadata is not None:  # a superseded memory keeps its link (see add)
                payload["m"] = _supersedes.keep_link(engine, g, row, metadata)
            if len(payload) == 2:
                return
            _supersedes.write_update(engine, g, row, payload)

    def pin(self, mid: str, pinned: bool = True) -> None:
        """Pin a memory ("remember this") or, with ``pinned=False``, unpin it."""
        self.update(mid, pinned=pinned)

    def forget(self, mid: str, *, erase: bool = True) -> None:
        """Forget a memory: gone from every read and, unless ``erase=False``, from the disk
        (its text, summary, metadata and vector overwritten in the store's files before
        this returns; ``False``: a tombstone only, the bytes stay until ``compact()``).

        Raises:
            UnknownMemoryError: no live memory has this id.
            InvalidTypeError: ``erase`` is not a bool.
            DurabilityError: the write failed; if it says "forgotten, but erasing ...
                failed", the memory is forgotten and the next write erases its bytes.
        """
        with self._engine.writing():
            _erase.forget(self._engine, mid, erase, time.time())

    def forget_many(self, ids: Iterable[str], *, erase: bool = True) -> None:
        """``forget`` for many memories at once: every id is checked before anything is
        written, then one write (and one erase pass) for them all, so that clearing a
        session or a namespace costs far less than a ``forget`` per memory.

        Raises:
            UnknownMemoryError: an id names no live memory (nothing is forgotten).
            InvalidTypeError: ``ids`` is one string, or ``erase`` is not a bool.
        """
        with self._engine.writing():
            _erase.forget_many(self._engine, ids, erase, time.time())

    def record_access(self, ids: Iterable[str], now: float | None = None) -> None:
        """Count one access for each memory of ``ids`` (unknown or forgotten ids are
        left out): what ``context()`` does for the memories it uses. For a process
        that reads through a read-only handle (the Hermes provider) and hands the ids
        to its writer, so that importance still learns from use.

        Raises:
            ReadOnlyError: the store was opened with ``readonly=True``.
        """
        wanted = check_ids(ids, "ids")
        when = time.time() if now is None else check_real(now, "now", 0.0, fmt.MAX_TIMESTAMP)
        with self._engine.lock:
            self._engine.check_writable()
            self._engine.index.touch(sorted(self._engine.rows_of(wanted)), when)

    # --- reading -----------------------------------------------------------------------

    def get(self, mid: str) -> Memory:
        """The memory with id ``mid``.

        Raises:
            UnknownMemoryError: no live memory has this id.
            CorruptRecordError: its record in the data file is damaged.
        """
        self._last_call = time.monotonic()
        engine = self._engine
        with engine.lock:
            engine.check()
            return engine.get(mid)

    def vector(self, mid: str) -> np.ndarray | None:
        """The embedding stored with memory ``mid`` (unit length, float16 precision, as a
        float32 array), or ``None`` when it has none: what an export needs so that an
        import keeps vectors given with ``add(embedding=...)`` instead of re-embedding.

        Raises:
            UnknownMemoryError: no live memory has this id.
            CorruptRecordError: its record in the data file is damaged.
        """
        with self._engine.lock:
            self._engine.check()
            return self._engine.vector(self._engine.live_row(mid)[1])

    @_records.retried_if_erased
    def recent(self, n: int = 20, *, before: str | None = None,
               session: str | None = None) -> list[Memory]:
        """The ``n`` newest live memories, newest first; those after memory ``before`` (a page);
        of ``session`` only: the last added first, in any process (a conversation's log)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInputError(f"n must be an int >= 0, got {n!r}")
        n, self._last_call = min(n, 1 << 62), time.monotonic()  # n: more than any store holds
        with (engine := self._engine).lock:
            engine.check()
            if before is None and session is None and (hot := engine.hot_recent(n)) is not None:
                return hot
            return _newest(engine, n, before, session)

    @_records.retried_if_erased
    def pinned(self) -> list[Memory]:
        """The pinned memories, most important first (ties: the older id first)."""
        with self._engine.lock:
            self._engine.check()
            return [self._engine.memory(g) for g in _packing.pinned_rows(self._engine.index)]

    def __iter__(self) -> Iterator[Memory]:
        """Live memories, oldest first (by timestamp, then id)."""
        engine = self._engine
        with engine.lock:
            engine.check()
            ids = engine.index.column("id")
            order = [int(ids[g]) for g in engine.index.by_time(newest_first=False)]
        for mid in order:  # by id: a compaction meanwhile numbers the rows anew
            with engine.lock:
                engine.check()
                g = engine.index.find(mid)
                if g >= 0 and not engine.index.row(g)[F_FLAGS] & fmt.FLAG_FORGOTTEN:
                    try:
                        memory = engine.memory(g)
                    except _records.MemoryErased:  # forgotten by another process just now
                        continue
                    yield memory

    def __len__(self) -> int:
        with self._engine.lock:
            self._engine.check()
            return self._engine.index.live

    def types(self) -> dict[str, int]:
        """Live memories by type name, from the index's type column alone (``stats`` for more)."""
        with self._engine.lock:
            self._engine.check()
            return _live_types(self._engine.index)

    def sessions(self, n: int | None = None) -> dict[str, int]:
        """Live memories by session name (none: not counted), newest activity first, at most ``n``
        sessions; from the index and one record per session. ``InvalidInputError``: a bad ``n``."""
        with self._engine.lock:
            self._engine.check()
            return _stats.sessions(self._engine, n)

    def ids(self, after: str | None = None) -> list[str]:
        """Live memories' ids, oldest first; with ``after``, those added after it (ids grow
        with every add, in any process). Raises ``UnknownMemoryError`` for a bad ``after``."""
        with self._engine.lock:
            self._engine.check()
            return _live_ids(self._engine.index, -1 if after is None else _records.parse_id(after))

    def __contains__(self, mid: object) -> bool:
        with self._engine.lock:
            self._engine.check()
            try:
                self._engine.live_row(mid)  # type: ignore[arg-type]
            except (UnknownMemoryError, InvalidTypeError):
                return False
            return True

    @_records.retried_if_erased
    def search(
        self,
        query: str | Sequence[float] | np.ndarray,
        k: int = 10,
        *,
        types: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        session: str | None = None,
        mode: str = "hybrid",
    ) -> list[Hit]:
        """The ``k`` live memories that best match ``query``.

        Args:
            query: text, or a vector of the store's dimension (a vector is searched by
                vector whatever the mode).
            k: how many hits, 1 to 10,000.
            types: keep only these types.
            since: keep only timestamps at or after ``since``.
            until: keep only timestamps at or before ``until``.
            session: keep only this session.
            mode: ``"hybrid"`` (text: vector and keyword rankings fused as ``context()``
                ranks, with importance and recency bonuses; the policy's weights), ``"vector"``
                (cosine; text is embedded by the store's embedder) or ``"keyword"`` (Okapi
                BM25 over the memories' text; tokenization rules in ``fastmem.storage.keyword_index``).

        Returns:
            Hits best first (ties: the older id first). Vector mode: ``score`` is the exact
            cosine against the stored float16 vector (an int8 scan picks candidates, they
            are rescored). Keyword mode: the BM25 score. Hybrid: the fused relevance (1 for
            the best hit), with ``vector`` (approximate cosine) and ``keyword`` (BM25) set.
            A hybrid search that can make no query vector yet ranks by keywords alone.
            A hybrid search lists the newest truth first: a superseded memory's newest live
            version (that passes the filters) takes its place and score, found or not (its
            ``vector`` and ``keyword`` then ``None`` unless it was a candidate), and the old
            memory follows it.
        """
        lo, hi, session, names = check_search(query, k, types, since, until, session, mode)
        self._last_call = time.monotonic()
        if mode == "vector" or not isinstance(query, str):
            vector = self._embed_query(query) if isinstance(query, str) else query
            try:
                flat = np.ndim(vector) == 1
            except ValueError:  # e.g. lists nested deeper than numpy's 64 dimensions
                flat = False
            if not flat:
                raise InvalidInputError("query must be text or one flat vector")
        if mode == "hybrid" and isinstance(query, str):  # embedded before the lock (see rank)
            embedded, degraded = _ranking.embed_query(self._embedder, query)
        engine = self._engine
        with engine.lock:
            engine.check()
            where = _ranking.filters(engine.index, names, lo, hi, session)
            if mode == "hybrid" and isinstance(query, str):
                return _query.hybrid_search(engine, self.policy, query, k, where, embedded, degraded, session)
            if mode == "keyword":
                return _query.keyword_search(engine, cast(str, query), k, where, session)
            return _query.vector_search(engine, vector, k, where, session, (self.dat_path, self.idx_path))

    def _embed_query(self, text: str) -> np.ndarray:
        if self._embedder is None:
            raise InvalidInputError(
                "this store has no embedder: search text with mode='keyword' or 'hybrid', or "
                "pass a vector"
            )
        wait = getattr(self._embedder, "wait", None)
        if wait is not None:
            wait()  # a vector search asked for explicitly waits for the model
        return _ranking.query_vector(self._embedder, text)

    # --- context: the three levels ------------------------------------------------------

    @_records.retried_if_erased
    def context(
        self,
        query: str = "",
        budget: int = 1300,
        *,
        session: str | None = None,
        encoding: str | None = None,
        exclude: Iterable[str] | None = None,
        types: Iterable[str] | None = None,
    ) -> Context:
        """The memories that matter for ``query``, as text within ``budget`` tokens.

        Merges pinned memories, the newest memories (level 1: with a query, only when it is
        about the current conversation, see ``ContextPolicy``) and a hybrid search for the
        query over everything (level 3); removes duplicates; orders them for a model to
        read (pinned first, then by time under one header per session and day); uses a
        memory's summary where its full text would not fit or matter, and the passage of a
        long memory that matches the query (marked ``(excerpt)``) rather than all of it. ``tokens`` is the
        exact count of ``text`` in ``encoding`` (``cl100k_base``, whose counts the index keeps, by default) and never exceeds
        ``budget``. Every memory used counts as an access (importance statistics).

        Args:
            query: what the model is about to be asked ("" for no search).
            budget: tokens, 1 to 1,000,000 (≈1,300 is what fastmem is tuned for).
            session: the current session: its memories rank a little higher, and level 1
                is included when it is the newest memories' session.
            encoding: count with another tiktoken encoding than the store's.
            exclude: ids of memories to leave out (e.g. those the model has already been
                shown this session); ids of forgotten or unknown memories are ignored.
            types: keep only memories of these types, at every level (``None``: all).
        """
        self._last_call = time.monotonic()
        budget = _query.check_budget(budget)
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a string, not {type(query).__name__}")
        check_utf8(query, "query")
        session = check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=True)
        counter = self._counter(encoding)
        excluded_ids = set() if exclude is None else check_ids(exclude, "exclude")
        return _query.answer(
            self._engine, self.policy, query, embedder=self._embedder, session=session,
            budget=budget, counter=counter, stored_counts=counter is self.tokens,
            exclude=excluded_ids, touch=not self.readonly, types=_records.type_names(types),
        )  # fmt: skip

    def _counter(self, encoding: str | None) -> TokenCounter:
        if encoding is None or (isinstance(encoding, str) and encoding == self.tokens.name):
            return self.tokens
        return counter_for(encoding)  # checks the type

    def importance_scores(self, now: float | None = None) -> np.ndarray:
        """Every row's current importance (float32; forgotten rows ``-inf``), computed by
        the compiled kernel from base importance, decayed access count, recency and pins."""
        with self._engine.lock:
            self._engine.check()
            return importance_scores(self._engine.index, self.policy,
                                               time.time() if now is None else float(now))  # fmt: skip

    @property
    def preload_progress(self) -> tuple[int, int]:
        """Level 2: (memories preloaded, memories to preload) by the background thread."""
        preload = self._preload
        return (0, 0) if preload is None else (preload.done, preload.total)

    def wait_preload(self, timeout: float | None = None) -> bool:
        """Wait for the level-2 preload to finish; whether it has."""
        preload = self._preload
        return True if preload is None else preload.finished.wait(timeout)

    def _start_preload(self) -> None:
        if self._preload is None and not self._engine.closed and (self.policy.preload or self.policy.recent):
            me = weakref.ref(self)  # the preload thread must not keep a dropped store alive
            self._preload = _preload.Preload(self._engine, self.policy, lambda: getattr(me(), "_last_call", 0.0))

    def _stop_preload(self) -> None:
        preload, self._preload = self._preload, None
        if preload is not None:
            preload.stop()

    # --- figures for operators ----------------------------------------------------------

    def stats(self) -> StoreStats:
        """The store's figures, read from the index alone (no record is decoded, so it
        costs milliseconds even at a million memories): counts by type, pins, sessions,
        time span, tokens, vectors and file sizes."""
        with self._engine.lock:
            self._engine.check()
            return _stats.stats(self._engine)

    def largest(self, n: int = 10) -> list[RecordSize]:
        """The ``n`` live memories with the largest records, largest first (ties: the
        older id first)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInputError(f"n must be an int >= 0, got {n!r}")
        with self._engine.lock:
            self._engine.check()
            return _stats.largest(self._engine.index, n)

    def info(self, mid: str) -> RecordInfo:
        """Where and how memory ``mid`` is stored, from its index row.

        Raises:
            UnknownMemoryError: no live memory has this id.
        """
        with self._engine.lock:
            self._engine.check()
            g, row = self._engine.live_row(mid)
            score = importance_scores(self._engine.index, self.policy, time.time(),
                                                np.array([g]))[0]  # fmt: skip
            return _stats.record_info(row, float(score))

    # --- durability, maintenance and integrity (fastmem.storage.maintenance) --------------------

    def flush(self) -> None:
        """Make every write so far durable (fsync); for readers, catch up with the writer."""
        with self._engine.lock:
            self._engine.check()
            self._engine.flush()

    def checkpoint(self) -> None:
        """Write the index file now (``close`` does it too), so the next open replays nothing."""
        with self._engine.writing():
            self._evict_by_policy()
            self._engine.checkpoint()

    def _evict_by_policy(self) -> None:
        p = self._eviction
        if p is not None:
            _maintenance.evict(self._engine, self.policy, p.ttl, p.min_importance, p.max_count,
                               p.max_bytes, None)  # fmt: skip

    def evict(
        self,
        *,
        ttl: Mapping[str, float] | None = None,
        min_importance: float | None = None,
        max_count: int | None = None,
        max_bytes: int | None = None,
        now: float | None = None,
        erase: bool = True,
    ) -> list[str]:
        """Forget the memories the policies select; returns their ids. Pinned memories
        are never evicted. The policies (each optional, all applied) are those of
        :class:`EvictionPolicy`: ``ttl`` seconds by type name, an importance-score floor,
        a maximum count, a maximum of live record bytes (lowest scores go first).
        ``erase``: as ``forget``'s (``False``: tombstones, ``compact()`` reclaims the space).
        """
        return _maintenance.evict(self._engine, self.policy, ttl, min_importance, max_count,
                                  max_bytes, now, erase)  # fmt: skip

    def compact(self) -> CompactReport:
        """Rewrite the live memories into new files and swap them in atomically (a crash
        leaves the old store or the new one); a session's memories end up side by side.

        Ids stay the same and are never reused. Other threads wait only for the snapshot
        and the swap; readers in other processes move to the new files on their next call.
        Returns a :class:`CompactReport` (bytes before and after, time the lock was held).

        Raises:
            CorruptionError: the data file has damaged records: ``repair()`` it.
        """
        self._stop_preload()
        try:
            return _maintenance.compact(self._engine)
        finally:
            self._start_preload()

    def repair(self) -> RepairReport:
        """Keep every intact record of a damaged data file: rewrite the store from them
        (as ``compact`` does) and rebuild its index. What is cut away is kept in
        ``<name>.dat.damaged-<time>`` (see ``docs/format.md``) and listed in the
        :class:`RepairReport`."""
        self._stop_preload()
        try:
            return _maintenance.repair(self._engine)
        finally:
            self._start_preload()

    def reembed(self, embedder: Embedder | None = _DEFAULT) -> int:
        """Rewrite every memory's vector with ``embedder`` (default: the default model) and
        record it as the store's embedder, atomically (a compaction, whose swap is the commit
        point); returns how many memories were re-embedded. Other processes' writes wait
        until it is done; their handles then need this embedder to open the store.

        Raises:
            InvalidInputError: the embedder does not say its ``name`` and ``dim``.
        """
        new = _resolve_embedder(embedder)
        identity = _embedder_identity(new)
        if new is None or identity is None:
            raise InvalidInputError("reembed needs an embedder with a name and a dim")
        self._stop_preload()
        try:
            count = _maintenance.reembed(self._engine, new, identity)
            self._embedder = new
            return count
        finally:
            self._start_preload()

    def backup(self, dest: str | os.PathLike[str]) -> BackupReport:
        """Copy the store to ``dest`` (``dest.dat``, ``dest.idx``; new names) while
        writes go on: the copy holds every memory committed before the call, opens
        without recovery and ``verify()``s clean."""
        return _maintenance.backup(self._engine, dest)

    def verify(self) -> Report:
        """Check every record's checksum and the index against the data file.

        Returns a :class:`Report`; each problem names its file and byte offset (or row).
        """
        return _maintenance.verify(self._engine)

    def close(self) -> None:
        """Checkpoint the index, make everything durable and release the lock; idempotent."""
        preload = self._preload  # kept: preload_progress still answers after close
        if preload is not None:
            preload.stop()  # outside the lock: the preload thread takes it between chunks
        self._engine.close(before=self._evict_by_policy)

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._engine.closed else f"{self._engine.index.live} memories"
        mode = "readonly" if self.readonly else self.durability
        return f"<fastmem.MemoryStore {self.path!r} {state}, {mode}>"


def _live_types(index: Any) -> dict[str, int]:
    """``MemoryStore.types``: a count per type code by ``np.bincount`` (no sort, and not
    ``np.unique``, whose first call imports ``numpy.ma``: ms of a fresh process's restart)."""
    codes, flags = index.column("type"), index.column("flags")
    counts = np.bincount(codes[flags & fmt.FLAG_FORGOTTEN == 0], minlength=1)
    return {index.type_name(int(c)): int(counts[c]) for c in np.flatnonzero(counts).tolist()}


def _live_ids(index: Any, after: int) -> list[str]:
    """``MemoryStore.ids``: the ids above ``after`` of the live rows, from two columns of the
    index (no record is read); what a cache of the store (the LangGraph adapter's catalog)
    reads to catch up with other processes' adds: at once when no id above ``after`` was
    ever given out, as between two writes of its own."""
    if after >= index.next_id - 1:
        return []
    ids, flags = index.column("id"), index.column("flags")
    return [f"m{i}" for i in np.sort(ids[(ids > after) & (flags & fmt.FLAG_FORGOTTEN == 0)]).tolist()]


def _newest(engine: Engine, n: int, before: str | None, session: str | None) -> list[Memory]:
    """``recent``'s memories when the index's copy of the newest cannot give them; those of
    a session newest id first (``packing.session_ids`` says why ids, not timestamps).

    Raises:
        UnknownMemoryError: ``before`` is no memory's id (never added, or compacted away).
    """
    if session is None:
        return _records.read_rows(engine, islice(_newest_first(engine, before), n))
    check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=False)
    below = fmt.MAX_ID + 1 if before is None else _records.parse_id(before)
    if before is not None and engine.index.find(below) < 0:
        raise UnknownMemoryError(f"no memory has the id {before!r} (never added, or compacted away)")
    out: list[Memory] = []
    while len(out) < n:  # the index keeps the name's 64-bit hash: each memory's name is checked
        want = n - len(out)
        read = _records.read_rows(engine, _records.session_rows(engine.index, session, below, want))
        out += [m for m in read if m.session == session]
        if len(read) < want:
            break
        below = int(read[-1].id[1:])
    return out


def _newest_first(engine: Engine, before: str | None) -> Iterator[int]:
    """Live rows newest first, as ``index.by_time`` gives them; after the row of memory
    ``before`` (an id, live or forgotten) when given: a timeline's next page found by
    binary search in the time order (then among the rows of the same timestamp), not by
    walking the rows before it.

    Raises:
        UnknownMemoryError: ``before`` is no memory's id (never added, or compacted away).
    """
    index = engine.index
    if before is None:
        return index.by_time(newest_first=True)
    g = index.find(_records.parse_id(before))
    if g < 0:
        raise UnknownMemoryError(f"no memory has the id {before!r} (never added, or compacted away)")
    nb, base_order, tail_order = index.n_base, index.base_order, index._tail_sorted()
    base_ts, tail_ts = index.base_rows["timestamp"], index.tail.rows["timestamp"]
    import bisect  # here: recent(before=...) alone uses it

    if g < nb:  # a base row: then the tail's strictly older rows (a tie goes to the tail first)
        at = base_ts[g]
        lo = bisect.bisect_left(range(nb), at, key=lambda i: base_ts[base_order[i]])
        hi = bisect.bisect_right(range(nb), at, lo=lo, key=lambda i: base_ts[base_order[i]])
        bi = lo + int(np.flatnonzero(base_order[lo:hi] == g)[0]) - 1
        ti = bisect.bisect_left(range(len(tail_order)), base_ts[g], key=lambda i: tail_ts[tail_order[i]]) - 1
    else:  # a tail row: then the base's rows as old or older
        ti = int(np.flatnonzero(tail_order == g - nb)[0]) - 1
        bi = bisect.bisect_right(range(nb), tail_ts[g - nb], key=lambda i: base_ts[base_order[i]]) - 1
    return _merge_newest(index, bi, ti)


def _merge_newest(index: Any, bi: int, ti: int) -> Iterator[int]:
    """``index.by_time(newest_first=True)`` from base position ``bi`` and tail position ``ti``
    of the two time orders down (the same merge, started part way)."""
    nb, base_order, tail_order = index.n_base, index.base_order, index._tail_sorted()
    base_ts, tail_ts = index.base_rows["timestamp"], index.tail.rows["timestamp"]
    b_flags, t_flags = index.base_rows["flags"], index.tail.rows["flags"]
    while bi >= 0 or ti >= 0:
        if bi >= 0 and (ti < 0 or base_ts[base_order[bi]] > tail_ts[tail_order[ti]]):
            b = int(base_order[bi])
            bi -= 1
            if not b_flags[b] & fmt.FLAG_FORGOTTEN:
                yield b
        else:
            t = int(tail_order[ti])
            ti -= 1
            if not t_flags[t] & fmt.FLAG_FORGOTTEN:
                yield nb + t


def _resolve_embedder(embedder: Any) -> Any:
    """The embedder a store uses: the default model unless one (or ``None``) is given.

    ``FASTMEM_EMBEDDER=none`` in the environment makes the default ``None`` (a keyword-only
    store): for tools and tests that never embed.
    """
    if embedder is not _DEFAULT:
        return embedder
    choice = os.environ.get("FASTMEM_EMBEDDER", "default")
    if choice == "none":
        return None
    if choice != "default":
        raise InvalidInputError(f"FASTMEM_EMBEDDER must be 'default' or 'none', not {choice!r}")
    return default_embedder()  # the model loads in the background: open never waits


def _open_engine(base: str, given: Any, **options: Any) -> tuple[Engine, Any]:
    """The engine of the store at ``base`` and the embedder it is used with: ``given``, or
    the default one (see :func:`_resolve_embedder`), unless the store was written by another
    model that fastmem knows (e.g. 0.1's float32 one: :func:`embedder_for_existing`). The
    engine checks the embedder against the data file's header as it opens the file, so a
    restart reads the header once; only a store the default does not fit is looked at again.
    """
    embedder = _resolve_embedder(given)
    try:
        return Engine(base, identity=_embedder_identity(embedder), **options), embedder
    except (EmbedderMismatchError, DimensionMismatchError):
        if given is not _DEFAULT or embedder is None:
            raise
        writer = embedder_for_existing(base, embedder)
        if writer is embedder:
            raise
    return Engine(base, identity=_embedder_identity(writer), **options), writer


def _embedder_identity(embedder: Any) -> tuple[str, int] | None:
    """(model name, dimension) when the embedder says them (``name`` and ``dim``)."""
    name, dim = getattr(embedder, "name", None), getattr(embedder, "dim", None)
    if isinstance(name, str) and isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
        return name, dim
    return None



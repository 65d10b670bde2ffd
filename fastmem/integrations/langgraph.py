"""fastmem as a LangGraph store: :class:`FastmemStore`, a ``langgraph.store.base.BaseStore``.

One line switches a graph's long-term memory to fastmem::

    from fastmem.integrations.langgraph import FastmemStore
    graph = builder.compile(store=FastmemStore("agent_memory"))

Every LangGraph item is one fastmem memory of the store at ``path`` (``path.dat``,
``path.idx``):

- its text is the item's indexed text (the ``index`` fields of its value, one per line),
  which fastmem embeds and indexes for keywords, and which :meth:`FastmemStore.context`
  shows the model;
- its type names its namespace (``"lg:" + ".".join(namespace)``; an item put with
  ``index=False`` or without indexed text has ``"lg!"`` instead), so a search of a namespace
  prefix ranks only the memories of the namespaces under it, filtered in fastmem's kernels;
- its metadata holds the item: namespace, key, value, creation time and TTL.

A put that replaces an item adds the new memory, then forgets the old one (a tombstone:
its bytes stay until ``compact()``, as a replaced row's do in LangGraph's own stores); a
put of ``None`` (a delete) and an expired TTL forget and erase it. Within a process the adapter keeps a catalog of the items (key to
memory id, and the values) that it loads on the first call needing it and brings up to date
from the store before each batch: other processes' puts by :meth:`fastmem.MemoryStore.ids`,
their deletes by the live count. A search with a query needs no catalog: a new process's
first search costs fastmem's restart and one ranking, not a read of every item.

Search with a ``query`` is fastmem's hybrid ranking (vector and BM25, fused;
:meth:`fastmem.MemoryStore.search`), scores 0 to 1 (1: the best hit). Without a query,
items come newest first (``updated_at``), as ``SqliteStore`` orders them. ``filter`` takes
the operators of LangGraph's ``InMemoryStore`` with its semantics (``$eq``, ``$ne``,
``$gt``, ``$gte``, ``$lt``, ``$lte``, nested dicts and lists as exact matches), except that
a comparison with a missing or non-numeric field is false instead of a ``TypeError``.

This module needs ``langgraph`` (``pip install 'fastmem[langgraph]'``); ``import fastmem``
never imports it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import heapq
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np
from typing_extensions import Self

import fastmem
from fastmem.embed import default_embedder, ready_within
from fastmem.errors import (
    DependencyUnavailableError,
    InvalidInputError,
    InvalidTypeError,
    UnknownMemoryError,
)
from fastmem.integrations._langgraph_filter import (  # matches: importable from here as before
    compile_filter, does_match, matches,  # noqa: F401
)  # fmt: skip

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
    )  # fmt: skip
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise DependencyUnavailableError(
        "fastmem.integrations.langgraph needs langgraph: pip install 'fastmem[langgraph]'"
    ) from exc

__all__ = ["FastmemStore", "LangChainEmbedder"]

logger = logging.getLogger(__name__)

INDEXED, UNINDEXED = "lg:", "lg!"  # type prefixes: searchable by a query, or not
HASHED_INDEXED, HASHED_UNINDEXED = "lh:", "lh!"  # the same for a namespace too long to spell
TYPE_CHARS = 64  # fastmem's longest type name
HEAD_CHARS = 45  # of a long namespace's text kept in its type name, before a 16-hex hash
MAX_K = 10_000  # fastmem's largest search
META = "langgraph"  # the metadata key that holds the item
# Ranking for items rather than conversation turns: an item's neighbours in the file are
# unrelated items, so no smoothing or lifting by them; no level 1 (newest memories) in
# contexts: a context here answers from the items of a namespace prefix; no level-2 preload
# thread: a search reads its own hits, and an idle graph should not spend CPU.
POLICY = fastmem.ContextPolicy(recent=0, preload=0, neighbour_weight=0.0, neighbour_gap=1000.0)
CONTEXT_BUDGET = 1300
# Seconds a query search waits for the embedding model still loading (it is ready ~0.1 s
# after the open): a LangGraph query is a semantic search, never a keyword-only one.
EMBED_WAIT = 30.0


class LangChainEmbedder:
    """A LangChain ``Embeddings`` (or anything ``index["embed"]`` takes) as a fastmem
    embedder: unit float32 vectors, identified by ``name`` and ``dim`` (a store refuses an
    embedder other than the one that wrote it).

    Args:
        embed: an ``Embeddings``, a function of a list of texts, or a provider string
            (LangGraph's ``ensure_embeddings`` takes them all).
        dim: the vectors' dimension.
        name: the identity recorded in the store (default: the class's name).
    """

    def __init__(self, embed: Any, dim: int, name: str | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidInputError(f"index['dims'] must be an int >= 1, got {dim!r}")
        self.embeddings = ensure_embeddings(embed)
        self.dim = dim
        label = embed if isinstance(embed, str) else getattr(embed, "model", None)
        self.name = name or f"langchain:{label or type(self.embeddings).__name__}"

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of ``texts``, shape ``(len(texts), dim)``."""
        return _unit(np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32))

    def encode_query(self, text: str) -> np.ndarray:
        """The unit vector of one query."""
        return _unit(np.asarray([self.embeddings.embed_query(text)], dtype=np.float32))[0]


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


class _Entry:
    """One item in the catalog: its memory and what ``Item`` needs."""

    __slots__ = (
        "created",
        "expires",
        "indexed",
        "key",
        "mid",
        "namespace",
        "number",
        "times",
        "ttl",
        "updated",
        "value",
    )  # fmt: skip

    def __init__(self, mid: str, memory: fastmem.Memory, item: dict[str, Any]) -> None:
        self.mid, self.number = mid, int(mid[1:])
        self.namespace: tuple[str, ...] = tuple(item["namespace"])
        self.key: str = item["key"]
        self.value: dict[str, Any] = item["value"]
        self.created: float = item.get("created_at", memory.timestamp)
        self.updated: float = memory.timestamp
        self.ttl: float | None = item.get("ttl")
        self.expires: float | None = item.get("expires_at")
        self.indexed = memory.type.startswith((INDEXED, HASHED_INDEXED))
        self.times: tuple[datetime, datetime] | None = None  # made at the first read

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires < now

    def item(self, cls: type[Item] = Item, score: float | None = None) -> Any:
        if self.times is None:
            self.times = (_datetime(self.created), _datetime(self.updated))
        created, updated = self.times
        if cls is SearchItem:
            return SearchItem(self.namespace, self.key, dict(self.value), created, updated, score)
        return Item(value=dict(self.value), key=self.key, namespace=self.namespace,
                    created_at=created, updated_at=updated)  # fmt: skip


def _newness(entry: _Entry) -> tuple[float, int]:
    return entry.updated, entry.number


def _datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _item_of(memory: fastmem.Memory) -> dict[str, Any] | None:
    """The LangGraph item a memory holds, or ``None`` for a memory written otherwise (or
    whose namespace has a label a put would refuse: a get finds only valid namespaces)."""
    meta = memory.metadata
    item = meta.get(META) if isinstance(meta, dict) else None
    if (isinstance(item, dict) and isinstance(item.get("namespace"), list)
            and isinstance(item.get("key"), str) and isinstance(item.get("value"), dict)
            and all(type(label) is str and label and "." not in label and "\x00" not in label
                    for label in item["namespace"])):  # fmt: skip
        return item
    return None


def namespace_type(namespace: tuple[str, ...], indexed: bool) -> str:
    """The fastmem type name of a namespace's items: ``lg:`` (or ``lg!``, not searchable
    by a query) and the namespace's labels joined by ``.`` (LangGraph forbids ``.`` in a
    label); a namespace longer than a type name may be keeps its first characters and a
    hash of the whole (``lh:``, ``lh!``)."""
    text = ".".join(namespace)
    if len(text) <= TYPE_CHARS - 3:
        return (INDEXED if indexed else UNINDEXED) + text
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return (HASHED_INDEXED if indexed else HASHED_UNINDEXED) + text[:HEAD_CHARS] + digest


def _type_may_match(type_name: str, prefix_text: str) -> bool:
    """Whether a type's namespaces may lie under the namespace prefix whose text (labels
    joined by ``.``) is ``prefix_text``: exactly for a spelled-out namespace, from its
    first characters for a hashed one (its hits are checked against the item's own
    namespace after the search)."""
    if not prefix_text:
        return True
    body = type_name[3:]
    if type_name.startswith((INDEXED, UNINDEXED)):
        return body == prefix_text or body.startswith(prefix_text + ".")
    head = body[:HEAD_CHARS]
    if len(prefix_text) < HEAD_CHARS:
        return head.startswith(prefix_text + ".") or head == prefix_text
    return prefix_text.startswith(head)


def _under(namespace: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return namespace[: len(prefix)] == prefix


def _check_labels(namespace: Any, what: str) -> tuple[str, ...]:
    if not isinstance(namespace, tuple):
        raise InvalidNamespaceError(f"{what} must be a tuple of strings, not {type(namespace).__name__}")
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(f"Invalid namespace label {label!r} in {namespace}: labels must be strings")
        if not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} in {namespace}: labels must be non-empty, "
                "without periods ('.') or NUL bytes"
            )
    return namespace


def _check_window(limit: Any, offset: Any) -> None:
    for name, n in (("limit", limit), ("offset", offset)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInputError(f"{name} must be an int >= 0, got {n!r}")


# --- the store ----------------------------------------------------------------------------


class FastmemStore(BaseStore):
    """A LangGraph ``BaseStore`` kept in a fastmem store; pass it to ``compile(store=...)``.

    Args:
        path: the fastmem store's name (``path.dat`` and ``path.idx``, made if missing), or
            an open :class:`fastmem.MemoryStore` (then closing this store leaves it open).
        index: LangGraph's index configuration. ``fields``: the JSON paths whose text is
            embedded (default ``["$"]``: every string of the value); ``embed`` and ``dims``:
            an embedding model to use instead of fastmem's own (all-MiniLM-L6-v2, shipped);
            without ``index`` every item is indexed whole with fastmem's model.
        ttl: LangGraph's TTL configuration: ``default_ttl`` (minutes), ``refresh_on_read``
            (default true), ``omit_expired`` (hide expired items before a sweep removes them;
            default false, as ``SqliteStore``) and ``sweep_interval_minutes`` (for
            :meth:`start_ttl_sweeper`).
        **options: passed to :func:`fastmem.open` (``durability``, ``timeout``, ``embedder``,
            ``readonly``...).

    Raises:
        InvalidInputError: a bad ``index`` or ``ttl`` configuration.
        fastmem.StoreLockedError, fastmem.CorruptionError: as :func:`fastmem.open`.
    """

    supports_ttl = True

    def __init__(
        self,
        path: str | os.PathLike[str] | fastmem.MemoryStore,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        **options: Any,
    ) -> None:
        # Plain dicts (LangGraph's TypedDicts, read by key): what BaseStore's attributes hold.
        self.index_config: dict[str, Any] | None = None if index is None else dict(index)
        self.ttl_config: dict[str, Any] | None = None if ttl is None else dict(ttl)  # type: ignore[assignment]
        self._fields = self._check_config()
        self._embedder: Any = None  # waited for before a query search, when known
        if isinstance(path, fastmem.MemoryStore):
            self.store, self._owned = path, False
        else:
            options.setdefault("policy", POLICY)
            embed = (self.index_config or {}).get("embed")
            if embed is not None and "embedder" not in options:
                options["embedder"] = LangChainEmbedder(embed, (self.index_config or {}).get("dims", 0))
            self.store, self._owned = fastmem.open(path, **options), True
            if "embedder" in options:
                self._embedder = options["embedder"]
            elif os.environ.get("FASTMEM_EMBEDDER", "default") != "none":
                self._embedder = default_embedder()  # the process's model, which the store uses
        self._lock = threading.RLock()
        self._catalog: dict[tuple[tuple[str, ...], str], _Entry] | None = None
        self._by_ns: dict[tuple[str, ...], dict[str, _Entry]] = {}
        self._ordered: dict[tuple[str, ...], list[_Entry]] = {}  # newest first, made when asked
        self._namespaces_changed = 0  # counts namespaces made and emptied: for the cache below
        self._prefix_types: dict[tuple[str, ...], tuple[int, list[str]]] = {}
        self._live: set[str] = set()  # every live memory id known, LangGraph's or not
        self._by_id: dict[str, _Entry] = {}
        self._last: str | None = None  # the newest id read by a catch-up
        self._seen: tuple[int, int] | None = None  # the data file when last caught up
        self._types: tuple[tuple[int, int], list[str]] | None = None  # (file, type names)
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._dat_fd: int | None = None  # the data file, for _file_state's fstat

    @classmethod
    def open(cls, path: str | os.PathLike[str], **kwargs: Any) -> FastmemStore:
        """``FastmemStore(path, **kwargs)``: open (or create) the store at ``path``."""
        return cls(path, **kwargs)

    def _check_config(self) -> list[tuple[str, Any]]:
        config = self.index_config or {}
        fields = config.get("fields") or ["$"]
        if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
            raise InvalidInputError(f"index['fields'] must be a list of JSON paths, got {fields!r}")
        ttl = self.ttl_config or {}
        default = ttl.get("default_ttl")
        if default is not None and not _positive(default):
            raise InvalidInputError(f"ttl['default_ttl'] must be minutes > 0 or None, got {default!r}")
        return [(f, f if f == "$" else tokenize_path(f)) for f in fields]

    # --- BaseStore ---------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; reads see the store as it was before the batch's puts
        (as LangGraph's stores do), and puts of one key keep the last.

        Raises:
            InvalidNamespaceError: an op's namespace has a bad label, or a put's is empty.
            InvalidInputError: a bad limit, offset, value or TTL (nothing is written).
            ValueError: an unknown filter operator or op type.
        """
        ops = list(ops)
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            self._check_op(op)
            if isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op
        results: list[Result] = [None] * len(ops)
        with self._lock:
            now = time.time()
            for i, op in enumerate(ops):
                if isinstance(op, GetOp):
                    results[i] = self._get(op, now)
                elif isinstance(op, SearchOp):
                    results[i] = self._search(op, now)
                elif isinstance(op, ListNamespacesOp):
                    results[i] = self._list_namespaces(op, now)
            if puts:
                self._put(list(puts.values()), now)
        return results

    def get(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> Item | None:
        """``BaseStore.get`` without building a batch: the item, or ``None``.

        Raises:
            InvalidNamespaceError: a label of the namespace is bad.
        """
        if type(namespace) is not tuple:
            _check_labels(namespace, "namespace")  # raises
        if type(key) is not str:
            key = str(key)
        with self._lock:
            self._sync()
            entry = self._catalog.get((namespace, key))  # type: ignore[union-attr]
            if entry is None:
                _check_labels(namespace, "namespace")  # a found one's labels were checked by its put
                return None
            if entry.expires is None:  # no TTL: nothing to hide or refresh (the common case)
                return entry.item()
            if refresh_ttl is None:
                refresh_ttl = (self.ttl_config or {}).get("refresh_on_read", True)
            return self._get(GetOp(namespace, key, refresh_ttl), time.time())

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread: the event loop never waits on the disk, the
        lock or the embedding model."""
        return await asyncio.to_thread(self.batch, list(ops))

    # --- what no LangGraph store has -------------------------------------------------------

    def context(
        self, namespace_prefix: tuple[str, ...], query: str = "", budget: int = CONTEXT_BUDGET
    ) -> fastmem.Context:
        """fastmem's context for ``query`` from the items under ``namespace_prefix``: their
        most relevant texts, packed into at most ``budget`` tokens (counted exactly), for a
        node to put in front of the model (``.text``, or ``.messages`` as chat messages).

        It is :meth:`fastmem.MemoryStore.context` of the prefix's namespaces' types: ranked,
        packed and shown as fastmem does for any agent; memories of other namespaces,
        unindexed items and memories not written through LangGraph never enter it.

        Raises:
            InvalidNamespaceError: a label of the prefix is bad.
            fastmem.InvalidInputError: a bad budget or query.
        """
        prefix = _check_labels(namespace_prefix, "namespace_prefix")
        with self._lock:
            self._sync()
            types = self._search_types(prefix)
            now = time.time()
            omit = bool((self.ttl_config or {}).get("omit_expired"))
            wanted = set(types)
            # A hashed type may also hold a namespace outside the prefix that shares its
            # first characters; expired items are hidden when the configuration says so.
            exclude = {e.mid for ns, d in self._by_ns.items() if namespace_type(ns, True) in wanted
                       for e in d.values() if not _under(ns, prefix) or (omit and e.expired(now))}  # fmt: skip
        return self.store.context(query, budget, exclude=exclude, types=types)

    async def acontext(
        self, namespace_prefix: tuple[str, ...], query: str = "", budget: int = CONTEXT_BUDGET
    ) -> fastmem.Context:
        """:meth:`context` in a worker thread."""
        return await asyncio.to_thread(self.context, namespace_prefix, query, budget)

    # --- TTL ---------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Forget the items whose TTL has run out; returns how many (as ``SqliteStore``)."""
        with self._lock:
            self._sync()
            now = time.time()
            expired = []
            for entry in [e for e in self._catalog.values() if e.expired(now)]:  # type: ignore[union-attr]
                fresh = self._reread(entry)  # another process may have refreshed it
                if fresh is not None and fresh.expired(now):
                    expired.append(fresh)
            self._forget(expired, erase=True)  # a delete: its bytes are erased
            return len(expired)

    def start_ttl_sweeper(self, sweep_interval_minutes: int | None = None) -> concurrent.futures.Future[None]:
        """Sweep every ``sweep_interval_minutes`` (default: the ``ttl`` configuration's, else
        5) in a daemon thread until :meth:`stop_ttl_sweeper` or :meth:`close`; the future
        completes when it stops."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._sweeper is not None and self._sweeper.is_alive():
            future.set_result(None)
            return future
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or 5
        if not _positive(minutes):
            raise InvalidInputError(f"sweep_interval_minutes must be > 0, got {minutes!r}")
        self._stop.clear()

        def sweep_loop() -> None:
            while not self._stop.wait(float(minutes) * 60):
                try:
                    swept = self.sweep_ttl()
                    if swept:
                        logger.info("fastmem store swept %d expired items", swept)
                except Exception:
                    logger.exception("fastmem store TTL sweep failed")
            future.set_result(None)

        self._sweeper = threading.Thread(target=sweep_loop, daemon=True, name="fastmem-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; whether it has stopped within ``timeout`` seconds."""
        sweeper = self._sweeper
        if sweeper is None or not sweeper.is_alive():
            return True
        self._stop.set()
        sweeper.join(timeout)
        return not sweeper.is_alive()

    # --- life ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the sweeper and close the fastmem store (unless it was given open); idempotent."""
        self.stop_ttl_sweeper(timeout=5.0)
        with self._lock:
            fd, self._dat_fd = self._dat_fd, None
            if fd is not None:
                os.close(fd)
        if self._owned:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FastmemStore {self.store.path!r}>"

    # --- the ops -------------------------------------------------------------------------

    def _check_op(self, op: Any) -> None:
        if isinstance(op, (GetOp, PutOp)):
            _check_labels(op.namespace, "namespace")
            if not isinstance(op.key, str):
                raise InvalidTypeError(f"key must be a string, not {type(op.key).__name__}")
        if isinstance(op, PutOp):
            if not op.namespace:
                raise InvalidNamespaceError("Namespace cannot be empty.")
            if op.value is not None and not isinstance(op.value, Mapping):
                raise InvalidTypeError(f"a value must be a dict or None, not {type(op.value).__name__}")
            if op.ttl is not None and not _positive(op.ttl):
                raise InvalidInputError(f"ttl must be minutes > 0 or None, got {op.ttl!r}")
            if op.index is not None and op.index is not False and (
                isinstance(op.index, str) or not all(isinstance(p, str) and p for p in op.index)
            ):
                raise InvalidTypeError(f"index must be False, None or a list of JSON paths, got {op.index!r}")
        elif isinstance(op, SearchOp):
            _check_labels(op.namespace_prefix, "namespace_prefix")
            _check_window(op.limit, op.offset)
            if op.filter is not None and not isinstance(op.filter, Mapping):
                raise InvalidTypeError(f"filter must be a dict, not {type(op.filter).__name__}")
            if op.query is not None and not isinstance(op.query, str):
                raise InvalidTypeError(f"query must be a string, not {type(op.query).__name__}")
        elif isinstance(op, ListNamespacesOp):
            _check_window(op.limit, op.offset)
            for condition in op.match_conditions or ():
                _check_labels(tuple(condition.path), "a match condition's path")
                if condition.match_type not in ("prefix", "suffix"):
                    raise ValueError(f"Unsupported match type: {condition.match_type}")
            depth = op.max_depth
            if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
                raise InvalidInputError(f"max_depth must be an int >= 1 or None, got {depth!r}")
        elif not isinstance(op, GetOp):
            raise ValueError(f"Unknown operation type: {type(op)}")  # noqa: TRY004 - as InMemoryStore

    def _get(self, op: GetOp, now: float) -> Item | None:
        self._sync()
        entry = self._catalog.get((op.namespace, op.key))  # type: ignore[union-attr]
        if entry is None or not self._visible(entry, now):
            return None
        if op.refresh_ttl:
            entry = self._refresh([entry], now)[0]
        return entry.item()

    def _visible(self, entry: _Entry, now: float) -> bool:
        return not (entry.expired(now) and (self.ttl_config or {}).get("omit_expired")
                    and (fresh := self._reread(entry)) is not None and fresh.expired(now))  # fmt: skip

    def _search(self, op: SearchOp, now: float) -> list[SearchItem]:
        if op.limit == 0:
            return []
        if op.query:
            found = self._ranked(op, now)
        else:
            self._sync()
            found = [(None, e) for e in self._newest(op, now)]  # type: ignore[misc]
        entries = self._refresh([e for _, e in found], now) if op.refresh_ttl else [e for _, e in found]
        return [e.item(SearchItem, score) for (score, _), e in zip(found, entries)]

    def _newest(self, op: SearchOp, now: float) -> list[_Entry]:
        """The items under the prefix that pass the filter, newest first (``updated_at``,
        then the later write), paged: each namespace's items are kept in that order, merged,
        and tested until the page is full."""
        lists = []
        for ns, keys in self._by_ns.items():
            if _under(ns, op.namespace_prefix):
                ordered = self._ordered.get(ns)
                if ordered is None:
                    ordered = self._ordered[ns] = sorted(keys.values(), key=_newness, reverse=True)
                lists.append(ordered)
        test = compile_filter(op.filter)
        omit = bool((self.ttl_config or {}).get("omit_expired"))
        page: list[_Entry] = []
        skip = op.offset
        for entry in heapq.merge(*lists, key=_newness, reverse=True):
            if not test(entry.value) or (omit and not self._visible(entry, now)):
                continue
            if skip:
                skip -= 1
                continue
            page.append(entry)
            if len(page) == op.limit:
                break
        return page

    def _ranked(self, op: SearchOp, now: float) -> list[tuple[float, _Entry]]:
        """fastmem's hybrid ranking of the indexed items under the prefix, filtered and
        paged; the search widens (up to fastmem's 10,000 hits) until the page is full."""
        if self._catalog is not None:
            self._sync()
        types = self._search_types(op.namespace_prefix)
        if not types:
            return []
        if self._embedder is not None:
            ready_within(self._embedder, EMBED_WAIT)
        want = op.offset + op.limit
        omit = bool((self.ttl_config or {}).get("omit_expired"))
        # The type filter scopes the search exactly (but for long, hashed namespaces): a
        # filter or expiry may drop hits, so only then is there room to spare at first.
        k = min(MAX_K, want if not op.filter and not omit else max(2 * want, 20))
        test = compile_filter(op.filter)
        while True:
            hits = self.store.search(op.query, k, types=types)
            kept: list[tuple[float, _Entry]] = []
            seen: set[tuple[tuple[str, ...], str]] = set()
            # Without the catalog, of two copies of a key among the hits (a crash between a
            # put's add and forget) the newer is the item.
            newest = {} if self._catalog is not None else _newest_copies(hits)
            for hit in hits:
                item = _item_of(hit.memory)
                if item is None:
                    continue
                entry = _Entry(hit.id, hit.memory, item)
                ident = (entry.namespace, entry.key)
                if not _under(entry.namespace, op.namespace_prefix) or ident in seen:
                    continue
                if newest.get(ident, entry.number) != entry.number:
                    continue
                if self._catalog is not None:  # an older copy a crash or a race left
                    current = self._catalog.get(ident)
                    if current is None or current.mid != hit.id:
                        continue
                    entry = current
                seen.add(ident)
                if test(entry.value) and not (omit and entry.expired(now)):
                    kept.append((hit.score, entry))
            if len(kept) >= want or len(hits) < k or k >= MAX_K:
                return kept[op.offset : want]
            k = min(MAX_K, k * 4)

    def _search_types(self, prefix: tuple[str, ...]) -> list[str]:
        """The indexed types whose namespaces may lie under ``prefix``: from the catalog
        when it is loaded, else from the store's types (read from the index alone)."""
        text = ".".join(prefix)
        if self._catalog is not None:
            cached = self._prefix_types.get(prefix)
            if cached is None or cached[0] != self._namespaces_changed:
                names = {namespace_type(ns, True) for ns, d in self._by_ns.items() if d and _under(ns, prefix)}
                cached = self._prefix_types[prefix] = (self._namespaces_changed, sorted(names))
            return cached[1]
        state = self._file_state()
        if self._types is None or self._types[0] != state:
            self._types = (state, [t for t in self.store.types() if t.startswith((INDEXED, HASHED_INDEXED))])
        return [t for t in self._types[1] if _type_may_match(t, text)]

    def _list_namespaces(self, op: ListNamespacesOp, now: float) -> list[tuple[str, ...]]:
        self._sync()
        names: Iterable[tuple[str, ...]] = [ns for ns, d in self._by_ns.items() if d]
        if (self.ttl_config or {}).get("omit_expired"):
            names = [ns for ns in names if any(self._visible(e, now) for e in self._by_ns[ns].values())]
        if op.match_conditions:
            names = [ns for ns in names if all(does_match(c, ns) for c in op.match_conditions)]
        found = sorted({ns[: op.max_depth] for ns in names} if op.max_depth is not None else names)
        return found[op.offset : op.offset + op.limit]

    def _put(self, ops: list[PutOp], now: float) -> None:
        """Add the new values in one write, then forget what they replace (one write, a
        tombstone each: see :meth:`_forget`) and the deletes (one write and one erase pass);
        a crash in between leaves two memories of a key: the next catalog load keeps the
        newer."""
        self._sync()
        catalog = self._catalog
        assert catalog is not None
        adds: list[dict[str, Any]] = []
        deletes: list[_Entry] = []
        for op in ops:
            old = catalog.get((op.namespace, op.key))
            if op.value is None:
                if old is not None:
                    deletes.append(old)
                continue
            value = dict(op.value)
            texts = [] if op.index is False else self._texts(value, op.index)
            text = "\n".join(texts)
            indexed = bool(text.strip())
            item = {"namespace": list(op.namespace), "key": op.key, "value": value,
                    "created_at": now if old is None else old.created}  # fmt: skip
            if op.ttl is not None:
                item["ttl"], item["expires_at"] = float(op.ttl), now + 60.0 * op.ttl
            adds.append({"text": text if indexed else (op.key or "-"), "timestamp": now,
                         "type": namespace_type(op.namespace, indexed), "metadata": {META: item}})  # fmt: skip
        if adds:
            # One write for the batch; every item is checked first (nothing is written
            # when one is bad: too large, not msgpack data).
            ids = self.store.add_many(adds)
            if self._last is not None and int(ids[0][1:]) == int(self._last[1:]) + 1:
                # Ids are given out in order under the writer lock: no other process
                # added between the last catch-up and this write, which the next
                # catch-up can start after (it then costs one comparison).
                self._last = ids[-1]
            replaced: list[_Entry] = []
            for mid, add in zip(ids, adds):
                # The new memory wins over the one it replaces, which is forgotten.
                self._learn(mid, fastmem.Memory(mid, add["text"], add["type"], now, None, 0.0,
                                                False, add["metadata"], None), replaced)  # fmt: skip
            self._forget(replaced, erase=False, drop=False)
        self._forget(deletes, erase=True)

    def _texts(self, value: dict[str, Any], index: list[str] | None) -> list[str]:
        paths = self._fields if index is None else [(p, p if p == "$" else tokenize_path(p)) for p in index]
        texts: list[str] = []
        for path, tokens in paths:
            texts.extend(_leaf_texts(value) if path == "$" else get_text_at_path(value, tokens))
        return [t for t in texts if t]

    # --- the catalog ----------------------------------------------------------------------

    def _file_state(self) -> tuple[int, int]:
        """The data file's inode and size: every write appends to it, and a compaction
        swaps in a new file, so an unchanged pair means nothing was written since. By an
        fstat of a descriptor kept open (a third of a stat by path: a get's largest cost);
        a file no name links to any more was swapped out, and the new one is opened."""
        fd = self._dat_fd
        if fd is not None:
            st = os.fstat(fd)
            if st.st_nlink:
                return st.st_ino, st.st_size
            os.close(fd)
        self._dat_fd = fd = os.open(self.store.dat_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(fd)
        return st.st_ino, st.st_size

    def _sync(self) -> None:
        """Load the catalog, or bring it up to date with what other processes wrote."""
        state = self._file_state()  # before reading: a write after it shows next time
        if self._catalog is not None and state == self._seen:
            return
        if self._catalog is None:
            self._catalog, self._by_ns, self._live, self._by_id, self._last = {}, {}, set(), {}, None
            self._ordered = {}
        for mid in self.store.ids(after=self._last):
            self._last = mid
            if mid not in self._live:
                self._read(mid)
        if len(self.store) != len(self._live):  # forgets elsewhere: drop what is gone
            live = set(self.store.ids())
            for mid in self._live - live:
                self._drop(mid)
            for mid in sorted(live - self._live, key=lambda m: int(m[1:])):
                self._read(mid)
        self._seen = state

    def _read(self, mid: str) -> _Entry | None:
        try:
            memory = self.store.get(mid)
        except UnknownMemoryError:  # forgotten meanwhile
            return None
        return self._learn(mid, memory)

    def _learn(
        self, mid: str, memory: fastmem.Memory, replaced: list[_Entry] | None = None
    ) -> _Entry | None:
        """Enter a live memory in the catalog; of two memories of one key, the newer wins
        and the older (left by a crash between a put's add and forget, or by two
        processes putting one key at once) is forgotten, or added to ``replaced`` for the
        caller to forget with others in one write."""
        self._live.add(mid)
        item = _item_of(memory)
        if item is None or self._catalog is None:
            return None
        entry = _Entry(mid, memory, item)
        ident = (entry.namespace, entry.key)
        old = self._catalog.get(ident)
        if old is not None and old.number > entry.number:
            self._forget([entry], erase=False, drop=False)
            return old
        self._catalog[ident] = entry
        self._by_id[mid] = entry
        keys = self._by_ns.get(entry.namespace)
        if keys is None:
            keys = self._by_ns[entry.namespace] = {}
            self._namespaces_changed += 1
        keys.pop(entry.key, None)
        keys[entry.key] = entry
        self._ordered.pop(entry.namespace, None)
        if old is not None and old.mid != mid:
            if replaced is None:
                self._forget([old], erase=False, drop=False)
            else:
                replaced.append(old)
        return entry

    def _forget(self, entries: list[_Entry], *, erase: bool, drop: bool = True) -> None:
        """Forget the memories of ``entries`` in one write (``MemoryStore.forget_many``).
        ``erase``: overwrite their bytes too, for a delete (a put of ``None``, an expired
        TTL), which a user means as "gone"; a replaced value only gets a tombstone, as
        LangGraph's own stores keep a replaced row's bytes until their vacuum (SQLite's
        freed pages, Postgres's dead tuples), and ``compact()`` reclaims it: an erase costs
        ~5 ms (it rewrites the index), a tombstone ~0.2 ms. ``drop``: out of the catalog too
        (not for an older copy, whose key the catalog holds for the newer one)."""
        if not entries or (self.store.readonly and not drop):
            return  # an older copy a writer will forget; a read-only handle only reads
        ids = [entry.mid for entry in entries]
        try:
            self.store.forget_many(ids, erase=erase)
        except UnknownMemoryError:  # another process forgot one first: the others one by one
            for mid in ids:
                try:
                    self.store.forget(mid, erase=erase)
                except UnknownMemoryError:
                    pass
        for entry in entries:
            self._live.discard(entry.mid)
            self._by_id.pop(entry.mid, None)
            if drop:
                self._drop(entry.mid, entry)

    def _drop(self, mid: str, entry: _Entry | None = None) -> None:
        self._live.discard(mid)
        catalog = self._catalog or {}
        found = self._by_id.pop(mid, None)
        entry = entry or found
        if entry is not None and catalog.get((entry.namespace, entry.key)) is entry:
            del catalog[(entry.namespace, entry.key)]
            keys = self._by_ns.get(entry.namespace)
            self._ordered.pop(entry.namespace, None)
            if keys is not None:
                keys.pop(entry.key, None)
                if not keys:
                    del self._by_ns[entry.namespace]
                    self._namespaces_changed += 1

    def _reread(self, entry: _Entry) -> _Entry | None:
        """The entry as the store has it now (another process may have refreshed its TTL)."""
        try:
            memory = self.store.get(entry.mid)
        except UnknownMemoryError:
            self._drop(entry.mid, entry)
            return None
        item = _item_of(memory)
        if item is None:
            return None
        fresh = _Entry(entry.mid, memory, item)
        if self._catalog is not None and self._catalog.get((fresh.namespace, fresh.key)) is entry:
            self._catalog[(fresh.namespace, fresh.key)] = fresh
            self._by_id[fresh.mid] = fresh
            self._by_ns[fresh.namespace][fresh.key] = fresh
            self._ordered.pop(fresh.namespace, None)
        return fresh

    def _refresh(self, entries: list[_Entry], now: float) -> list[_Entry]:
        """Restart the TTL of the entries that have one (``refresh_on_read``); their new
        expiry is written to their metadata, so every process sees it."""
        if self.store.readonly or not (self.ttl_config or {}).get("refresh_on_read", True):
            return entries
        out = []
        for entry in entries:
            if entry.ttl is not None:
                item: dict[str, Any] = {
                        "namespace": list(entry.namespace), "key": entry.key, "value": entry.value,
                        "created_at": entry.created, "ttl": entry.ttl,
                        "expires_at": now + 60.0 * entry.ttl}  # fmt: skip
                try:
                    self.store.update(entry.mid, metadata={META: item})
                except UnknownMemoryError:  # replaced or deleted meanwhile: shown as read
                    out.append(entry)
                    continue
                entry.expires = item["expires_at"]
            out.append(entry)
        return out


def _newest_copies(hits: list[fastmem.Hit]) -> dict[tuple[tuple[str, ...], str], int]:
    """The newest memory's number of each item among search hits."""
    newest: dict[tuple[tuple[str, ...], str], int] = {}
    for hit in hits:
        item = _item_of(hit.memory)
        if item is not None:
            ident = (tuple(item["namespace"]), item["key"])
            newest[ident] = max(newest.get(ident, -1), int(hit.id[1:]))
    return newest


def _leaf_texts(value: Any) -> list[str]:
    """The strings of a value, in order: the text of ``"$"`` (LangGraph's own stores embed
    the value's JSON; fastmem embeds and indexes its words, and a context shows them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _leaf_texts(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaf_texts(v)]
    return []


def _positive(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x > 0

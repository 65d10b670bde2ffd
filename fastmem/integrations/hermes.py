"""fastmem as a Hermes Agent memory provider (hermes-agent 0.19.0's ``MemoryProvider``).

Install it into a Hermes profile with ``fastmem hermes install`` (or :func:`install`), set
``memory: {provider: fastmem}`` in ``$HERMES_HOME/config.yaml`` and restart Hermes.

Where the memories live: ``<hermes_home>/fastmem/<namespace>/memory.dat`` and ``.idx``.
``hermes_home`` is per profile; the namespace is ``default`` without a ``user_id`` (the
CLI) and ``u-<hash of platform and user_id>`` for a gateway user, so one user's memories
never enter another's searches or contexts (see :func:`user_namespace`).

Threads and processes. Hermes calls a provider from its turn thread, a prefetch thread
and its ``mem-sync`` worker, and the gateway keeps one provider per cached agent. Every
provider of one store in a process shares one :class:`_Shared` entry (refcounted): a
read-only handle for reads (recall never waits for a write) and one writer thread that
applies writes in order, each batch fsynced before it is acknowledged. One process at a
time holds a store's writer lock; another process on the same profile (a CLI beside the
gateway) writes its batches to durable ``pending-*.jsonl`` files beside the store, which
the lock holder imports within about a second and the next holder imports otherwise.
What is still queued at the shutdown deadline is kept the same way: nothing queued is
dropped.

This module imports without hermes-agent (the base class falls back to ``object``), so
``fastmem`` never needs Hermes.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import logging
import os
import queue
import re
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fastmem
from fastmem.errors import (
    EmbedderUnavailableError,
    FastmemError,
    InvalidInputError,
    InvalidTypeError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)
from fastmem.namespaces import namespace_path

if TYPE_CHECKING:
    _Base = object
else:
    try:  # Hermes's ABC when Hermes is installed; plain object otherwise
        from agent.memory_provider import MemoryProvider as _Base
    except ImportError:
        _Base = object

__all__ = ["FastmemProvider", "InstallResult", "install", "register", "user_namespace"]

logger = logging.getLogger(__name__)

CONTEXT_BUDGET = 1300  # tokens per prefetch: Hermes's built-in memory is ~1,300 tokens in all
PROMPT_PINNED_CHARS = 1200  # pinned facts in the system prompt (~300 tokens)
TURN_MAX_CHARS = 16_000  # per side of a stored turn; the rest of a pasted file is cut
TOOL_TEXT_MAX_CHARS = 8_000
QUERY_MAX_CHARS = 4_000
TOOL_WAIT = 10.0  # seconds a tool call waits for its write to be on disk
LOCK_WAIT = 0.05  # seconds per attempt at the store's writer lock (rides over a reopen)
RETRY_LOCK = 1.0  # seconds between attempts while another process holds the lock
IDLE_TICK = 1.0  # seconds between imports of other processes' pending writes
SHUTDOWN_TIMEOUT = 4.0  # Hermes drains its own queue for 5 s before calling shutdown()
CACHE_SECONDS = 120.0  # a queued prefetch older than this is computed again
FACTS_PER_SESSION = 20
MAX_BATCH = 64  # writes per commit: bounds one batch's embedding time (~1 s on a laptop CPU)

_TOOL_PREFIX = "fastmem_"
_MIRROR_SOURCE = "hermes-memory"  # metadata["source"] of mirrored built-in memory writes


def user_namespace(user_id: Any = None, platform: Any = None) -> str:
    """The namespace of a Hermes user: ``default`` without a user id, else ``u-`` and a
    hash of platform and user id (user ids are case-sensitive and may clash across
    platforms; namespaces must be lower case, so they are hashed rather than slugged)."""
    if user_id is None or user_id == "":
        return "default"
    digest = hashlib.sha256(f"{platform or ''}\0{user_id}".encode("utf-8", "replace"))
    return "u-" + digest.hexdigest()[:32]


# --- the shared store: one read handle and one writer per store per process --------------


class _Pending:
    """A write kept in a pending file: it reaches the store when a writer imports it."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()


@dataclass
class _Op:
    kind: str  # add, add_unique, forget, pin, mirror, barrier
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

    def __init__(self, path: str) -> None:
        self.path = path
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
        if kind == "forget":
            store.forget(args)
            return args
        if kind == "pin":
            store.pin(args[0], args[1])
            return args[0]
        if kind == "add_unique":  # consolidated facts: not again if already stored
            folded = " ".join(args["text"].casefold().split())
            for hit in store.search(args["text"], 5, mode="keyword"):
                if " ".join(hit.memory.text.casefold().split()) == folded:
                    return hit.id
            return store.add(**args)
        if kind == "mirror":
            return _mirror(store, **args)
        if kind == "barrier":
            return None
        raise ValueError(f"unknown write {kind!r}")

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
                        self._apply(store, kind, tuple(args) if kind == "pin" else args)
                except (FastmemError, KeyError, TypeError) as exc:
                    logger.warning("fastmem: a pending write in %s failed: %s", name, exc)
            store.flush()
            os.unlink(name)


def _mirror(store: fastmem.MemoryStore, action: str, target: str, content: str,
            old_text: str, metadata: dict[str, Any], timestamp: float | None = None) -> str | None:  # fmt: skip
    """Apply a built-in ``memory`` tool write (add/replace/remove of one entry)."""
    source = f"{_MIRROR_SOURCE}:{target}"

    def mirrored(text: str) -> list[str]:
        if not text:
            return []
        return [
            h.id for h in store.search(text, 20, mode="keyword", types=["fact"])
            if (h.memory.metadata or {}).get("source") == source and text in h.memory.text
        ]  # fmt: skip

    if action in ("replace", "remove"):
        for mid in mirrored(old_text or (content if action == "remove" else "")):
            store.forget(mid)
    if action in ("add", "replace") and content:
        meta = {"source": source, **{k: v for k, v in metadata.items() if isinstance(v, str)}}
        return store.add(content[:TOOL_TEXT_MAX_CHARS], type="fact", metadata=meta, timestamp=timestamp)
    return None


class _Shared:
    """One store's read handle, writer and prefetch thread, shared by every provider of it
    in this process (the gateway keeps a provider per cached agent)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refs = 0
        self.writer = _Writer(path)
        self.prefetcher = ThreadPoolExecutor(1, thread_name_prefix="fastmem-prefetch")
        self._reader: fastmem.MemoryStore | None = None
        self._reader_lock = threading.Lock()
        if glob.glob(os.path.join(os.path.dirname(path), "pending-*.jsonl")):
            self.writer.submit("barrier", None)  # import what an earlier writer could not write

    def reader(self) -> fastmem.MemoryStore:
        """The read-only handle: opened on first use; readers never wait for a writer."""
        with self._reader_lock:
            if self._reader is None:
                for attempt in range(100):
                    try:
                        self._reader = _open_store(self.path, readonly=True)
                        break
                    except StoreNotFoundError:  # new store: the writer creates it
                        if attempt == 0:
                            self.writer.submit("barrier", None).result(TOOL_WAIT)
                        else:
                            time.sleep(0.02)  # another process is creating it right now
                else:
                    raise StoreNotFoundError(f"fastmem: {self.path} was not created in time")
            return self._reader

    def close(self, timeout: float) -> None:
        self.writer.stop(timeout)
        self.prefetcher.shutdown(wait=False, cancel_futures=True)
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


_registry: dict[str, _Shared] = {}
_registry_lock = threading.Lock()


def _acquire_shared(path: str) -> _Shared:
    with _registry_lock:
        shared = _registry.get(path)
        if shared is None:
            shared = _registry[path] = _Shared(path)
        shared.refs += 1
        return shared


def _release_shared(shared: _Shared, timeout: float) -> None:
    with _registry_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        _registry.pop(shared.path, None)
    shared.close(timeout)


@atexit.register
def _close_all() -> None:
    """A process that exits without shutdown() (a crash of the host, a test) still writes
    what is queued: Hermes's worker threads are daemons."""
    with _registry_lock:
        shared = list(_registry.values())
        _registry.clear()
    for s in shared:
        try:
            s.close(SHUTDOWN_TIMEOUT)
        except Exception:  # pragma: no cover - interpreter teardown
            pass


# --- consolidation without a model ---------------------------------------------------------

_SELF_STATEMENT = re.compile(
    r"\b(my|mine|i am|i'm|i was|i have|i've|i like|i love|i prefer|i hate|i don't|i do not|"
    r"i live|i work|i use|i need|i want|call me|remember)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a multimodal list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _user_texts(messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return []
    return [
        t for t in (_text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user")
        if t.strip()
    ]  # fmt: skip


def extract_facts(messages: Any, limit: int = FACTS_PER_SESSION) -> list[str]:
    """What the user said about themselves or asked to be remembered: their first-person
    statements (not questions), as written. No model: a pattern over sentences."""
    facts: list[str] = []
    seen: set[str] = set()
    for text in _user_texts(messages):
        if "<memory-context>" in text:  # an API copy with recalled memories: not the user's words
            text = text.split("<memory-context>")[0]
        for sentence in _SENTENCE.split(text):
            s = " ".join(sentence.split())
            key = s.casefold()
            if 12 <= len(s) <= 300 and not s.endswith("?") and _SELF_STATEMENT.search(s) and key not in seen:
                seen.add(key)
                facts.append(s)
                if len(facts) >= limit:
                    return facts
    return facts


def summarize_session(messages: Any, session_id: str) -> str | None:
    """A line per user request (first 160 characters), at most 8: what the session was about."""
    asks = _user_texts(messages)
    if not asks:
        return None
    day = time.strftime("%d %b %Y", time.gmtime())
    count = f"{len(asks)} user message" + ("s" if len(asks) != 1 else "")
    lines = [f"Session {session_id or '?'} ({day}, {count}). The user asked:"]
    for text in asks[:8]:
        one = " ".join(text.split("<memory-context>")[0].split())
        lines.append("- " + (one[:160] + "…" if len(one) > 160 else one))
    return "\n".join(lines)


# --- the provider ------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _error(message: str) -> str:
    return _json({"error": message})


_TOOLS: list[dict[str, Any]] = [
    {
        "name": "fastmem_remember",
        "description": "Save something to long-term memory (kept across sessions): a fact about the "
                       "user, a decision, a plan. Pinned memories appear in every session.",
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "What to remember, self-contained."},
                "type": {"type": "string", "description": "fact (default), plan, or another kind."},
                "pin": {"type": "boolean", "description": "Show it in every session (default false)."},
            },
            "required": ["text"],
        },
    },
    {
        "name": "fastmem_search",
        "description": "Search long-term memory (all earlier sessions) for a question or keywords.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "default 5"},
            },
            "required": ["query"],
        },
    },
    {
        "name": "fastmem_forget",
        "description": "Delete a memory by its id (as fastmem_search returns it, e.g. 'm42').",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
    },
    {
        "name": "fastmem_pin",
        "description": "Pin a memory by id so it appears in every session, or unpin it (pinned=false).",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "pinned": {"type": "boolean"}},
            "required": ["id"],
        },
    },
]  # fmt: skip


class FastmemProvider(_Base):
    """Hermes Agent memory provider backed by a fastmem store (see the module docstring).

    One instance per Hermes agent; all hooks accept extra keyword arguments (later Hermes
    versions pass more) and none raises for a user's bad input.
    """

    def __init__(self, *, context_budget: int = CONTEXT_BUDGET) -> None:
        self._budget = context_budget
        self._shared: _Shared | None = None
        self._session_id = ""
        self._platform = "cli"
        self._writes = True
        self._lock = threading.Lock()
        # What the model has seen this session and need not be given again: memories
        # injected by prefetch (Hermes replays each turn's block for the whole session),
        # memories written this session (they are in the conversation) and the pinned
        # facts in the system prompt.
        self._injected: set[str] = set()
        self._written: set[str] = set()
        self._prompt_ids: set[str] = set()
        self._cache: dict[str, tuple[float, Future[tuple[str, set[str]]]]] = {}

    # -- identity ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "fastmem"

    def is_available(self) -> bool:
        """True when fastmem's kernels load; no network, no files touched."""
        try:
            return fastmem.BACKEND in ("cython", "python")
        except Exception:
            return False

    @property
    def store_path(self) -> str | None:
        """The store's base path (``.dat``/``.idx`` beside it) once initialized."""
        return None if self._shared is None else self._shared.path

    # -- lifecycle ---------------------------------------------------------------------

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        """Bind to the profile's store for this user; cheap (the store opens on first use)."""
        if self._shared is not None:  # initialized again: let go of the old binding first
            self.shutdown()
        home = kwargs.get("hermes_home") or os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes")
        self._platform = str(kwargs.get("platform") or "cli")
        namespace = user_namespace(kwargs.get("user_id"), self._platform)
        path = namespace_path(os.path.join(str(home), "fastmem"), namespace, create=True)
        # Cron runs, subagents and flushes must not write into the user's memory.
        self._writes = (kwargs.get("agent_context") or "primary") == "primary"
        self._session_id = str(session_id or "")
        self._reset_session()
        self._shared = _acquire_shared(path)

    def shutdown(self, **kwargs: Any) -> None:
        """Write what is queued (bounded in time), then close the store if no other
        provider in this process uses it."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _release_shared(shared, SHUTDOWN_TIMEOUT)

    def flush(self, timeout: float = TOOL_WAIT) -> bool:
        """Wait until every write queued so far is on disk (in the store, or in a pending
        file while another process holds the store's lock); False on timeout."""
        if self._shared is None:
            return True
        try:
            self._shared.writer.submit("barrier", None).result(timeout)
            return True
        except FutureTimeout:
            return False

    # -- what the model sees ------------------------------------------------------------

    def system_prompt_block(self, **kwargs: Any) -> str:
        """A short note on the memory and its tools, and the pinned facts (bounded)."""
        if self._shared is None:
            return ""
        lines = [
            "# Long-term memory (fastmem)",
            "Memories from earlier sessions are recalled into <memory-context> blocks. Save "
            "lasting facts with fastmem_remember; look further back with fastmem_search.",
        ]
        shown: set[str] = set()
        try:
            ctx = self._shared.reader().context("", budget=1000)
            pinned = [item for item in ctx.items if item.level == 0]
        except FastmemError as exc:
            logger.warning("fastmem: pinned facts unavailable: %s", exc)
            pinned = []
        used = 0
        for item in pinned:
            line = "- " + " ".join(item.text.split())[:300]
            if used + len(line) > PROMPT_PINNED_CHARS:
                break
            if not shown:
                lines.append("Pinned facts:")
            lines.append(line)
            used += len(line)
            shown.add(item.id)
        with self._lock:
            self._prompt_ids = shown
        return "\n".join(lines)

    def _recall(self, query: str) -> tuple[str, set[str]]:
        """The context for ``query`` without what the model has already seen this session."""
        assert self._shared is not None
        with self._lock:
            seen = self._injected | self._written | self._prompt_ids
        reader = self._shared.reader()
        ctx = reader.context(query[:QUERY_MAX_CHARS], budget=self._budget, exclude=seen)
        # A write of this session is readable a moment before its id reaches _written (the
        # writer fsyncs in between): leave this session's memories out all the same.
        own = {i.id for i in ctx.items if self._session_id and i.session == self._session_id[:256]}
        if own:
            with self._lock:
                self._written |= own
            ctx = reader.context(query[:QUERY_MAX_CHARS], budget=self._budget, exclude=seen | own)
        if not ctx.items:
            return "", set()
        return ctx.text, {item.id for item in ctx.items}

    def queue_prefetch(self, query: str, *, session_id: str = "", **kwargs: Any) -> None:
        """Start computing ``query``'s context in the background; prefetch returns it."""
        if self._shared is None or not isinstance(query, str):
            return
        future = self._shared.prefetcher.submit(self._recall, query)
        with self._lock:
            self._cache[query] = (time.monotonic(), future)
            while len(self._cache) > 4:  # oldest first: dicts keep insertion order
                del self._cache[next(iter(self._cache))]

    def prefetch(self, query: str, *, session_id: str = "", **kwargs: Any) -> str:
        """The memories relevant to ``query`` (≤ the token budget) that this session has not
        been shown yet: from the queued computation when there is one, else computed now."""
        if self._shared is None or not isinstance(query, str):
            return ""
        with self._lock:
            cached = self._cache.pop(query, None)
        result: tuple[str, set[str]] | None = None
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            try:
                result = cached[1].result(timeout=5.0)
            except Exception as exc:  # computed again below
                logger.debug("fastmem: queued prefetch failed: %s", exc)
        try:
            if result is None:
                result = self._recall(query)
        except FastmemError as exc:
            logger.warning("fastmem: recall failed: %s", exc)
            return ""
        text, ids = result
        with self._lock:
            fresh = ids - self._injected - self._written - self._prompt_ids
            if ids and not fresh:  # all shown meanwhile (a queued result raced a turn)
                return ""
            self._injected |= ids
        return text

    # -- writes ------------------------------------------------------------------------

    def _submit_add(self, item: dict[str, Any]) -> Future[Any] | None:
        if self._shared is None or not self._writes:
            return None
        future = self._shared.writer.submit("add", item)
        future.add_done_callback(self._note_written)
        return future

    def _note_written(self, future: Future[Any]) -> None:
        if future.exception() is None and isinstance(future.result(), str):
            with self._lock:
                self._written.add(future.result())

    def sync_turn(self, user_content: str, assistant_content: str, *, session_id: str = "",
                  messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:  # fmt: skip
        """Queue the finished turn (returns at once; the writer stores it in order)."""
        user = _text_of(user_content).strip()
        assistant = _text_of(assistant_content).strip()
        if not (user or assistant):
            return
        text = f"User: {user[:TURN_MAX_CHARS]}\nAssistant: {assistant[:TURN_MAX_CHARS]}"
        session = (session_id or self._session_id or None)
        self._submit_add({
            "text": text, "type": "conversation", "timestamp": time.time(),
            "session": session[:256] if session else None,
            "metadata": {"platform": self._platform, "source": "hermes-turn"},
        })  # fmt: skip

    def on_memory_write(self, action: str, target: str, content: str,
                        metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:  # fmt: skip
        """Mirror the built-in ``memory`` tool's add/replace/remove into fastmem."""
        if self._shared is None or not self._writes or action not in ("add", "replace", "remove"):
            return
        meta = dict(metadata or {})
        old_text = meta.pop("old_text", None) or kwargs.get("old_text") or ""
        args = {"action": action, "target": str(target or "memory"), "content": _text_of(content),
                "old_text": str(old_text), "metadata": {k: v for k, v in meta.items() if isinstance(v, str)},
                "timestamp": time.time()}  # fmt: skip
        future = self._shared.writer.submit("mirror", args)
        future.add_done_callback(self._note_written)

    def _consolidate(self, messages: Any, *, summary: bool) -> list[str]:
        """Store the user's first-person statements as facts (and a session summary)."""
        facts = extract_facts(messages)
        if self._shared is None or not self._writes:
            return facts
        session = self._session_id[:256] or None
        for fact in facts:
            future = self._shared.writer.submit("add_unique", {
                "text": fact, "type": "fact", "session": session, "importance": 0.8,
                "timestamp": time.time(),
                "metadata": {"source": "hermes-consolidation"},
            })  # fmt: skip
            future.add_done_callback(self._note_written)
        text = summarize_session(messages, self._session_id) if summary else None
        if text:
            self._shared.writer.submit("add_unique", {
                "text": text, "type": "session_summary", "session": session, "importance": 0.5,
                "timestamp": time.time(),
                "metadata": {"source": "hermes-consolidation"},
            })  # fmt: skip
        return facts

    def on_session_end(self, messages: list[dict[str, Any]], **kwargs: Any) -> None:
        """Consolidate the session: its facts and a summary (no model call)."""
        self._consolidate(messages, summary=True)

    def on_pre_compress(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """Keep the facts of the messages about to be compressed; tell the compressor."""
        facts = self._consolidate(messages, summary=False)
        if not facts:
            return ""
        return ("Facts the user stated in these messages (saved to long-term memory; keep "
                "them in the summary):\n" + "\n".join(f"- {f}" for f in facts))  # fmt: skip

    def on_session_switch(self, new_session_id: str, *, parent_session_id: str = "",
                          reset: bool = False, rewound: bool = False, **kwargs: Any) -> None:  # fmt: skip
        """A new or compressed conversation: what was shown is gone, so it may be shown again."""
        if new_session_id:
            self._session_id = str(new_session_id)
        self._reset_session()

    def _reset_session(self) -> None:
        with self._lock:
            self._injected.clear()
            self._written.clear()
            self._cache.clear()

    def on_delegation(self, task: str, result: str, *, child_session_id: str = "",
                      **kwargs: Any) -> None:  # fmt: skip
        """Remember what a subagent was asked and what it found."""
        if _text_of(task).strip() or _text_of(result).strip():
            session = self._session_id[:256] or None
            self._submit_add({
                "text": f"Delegated task: {_text_of(task)[:TURN_MAX_CHARS]}\n"
                        f"Result: {_text_of(result)[:TURN_MAX_CHARS]}",
                "type": "tool_result", "session": session, "timestamp": time.time(),
                "metadata": {"source": "hermes-delegation", "child_session_id": str(child_session_id)},
            })  # fmt: skip

    # -- tools -------------------------------------------------------------------------

    def get_tool_schemas(self, **kwargs: Any) -> list[dict[str, Any]]:
        return [dict(tool) for tool in _TOOLS]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """Run one fastmem tool; always a JSON string (``{"error": ...}`` for bad input)."""
        if self._shared is None:
            return _error("fastmem is not initialized")
        if not isinstance(args, dict):
            return _error(f"arguments must be a JSON object, not {type(args).__name__}")
        handler = {
            "fastmem_remember": self._tool_remember, "fastmem_search": self._tool_search,
            "fastmem_forget": self._tool_forget, "fastmem_pin": self._tool_pin,
        }.get(tool_name)  # fmt: skip
        if handler is None:
            return _error(f"unknown tool {tool_name!r}; fastmem has {[t['name'] for t in _TOOLS]}")
        try:
            return handler(args)
        except _BadArgs as exc:
            return _error(str(exc))
        except FastmemError as exc:
            return _error(str(exc))

    def _wait(self, future: Future[Any]) -> Any:
        """The write's result, or PENDING if it is still queued or was kept in a pending
        file (another process holds the store): it will reach the store, later."""
        try:
            return future.result(TOOL_WAIT)
        except FutureTimeout:
            return PENDING

    @staticmethod
    def _pending_reply() -> str:
        return _json({"ok": True, "pending": True,
                      "note": "saved; another Hermes process is using this memory store, so it "
                              "will be stored when that process takes it in (within seconds)"})  # fmt: skip

    def _tool_remember(self, args: dict[str, Any]) -> str:
        text = _arg_str(args, "text", TOOL_TEXT_MAX_CHARS)
        kind = _arg_str(args, "type", 64, default="fact")
        pin = _arg_bool(args, "pin", default=False)
        if not self._writes:
            return _error("memory is read-only in this agent context")
        future = self._submit_add({"text": text, "type": kind, "pinned": pin, "timestamp": time.time(),
                                   "session": self._session_id[:256] or None,
                                   "metadata": {"source": "hermes-tool"}})  # fmt: skip
        assert future is not None
        mid = self._wait(future)
        return self._pending_reply() if mid is PENDING else _json({"ok": True, "id": mid, "pinned": pin})

    def _tool_search(self, args: dict[str, Any]) -> str:
        query = _arg_str(args, "query", QUERY_MAX_CHARS)
        limit = args.get("limit", 5)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 20:
            raise _BadArgs(f"limit must be an integer from 1 to 20, got {limit!r}")
        assert self._shared is not None
        hits = self._shared.reader().search(query, limit)
        return _json({"results": [
            {"id": h.id, "text": h.memory.text[:1000], "type": h.memory.type,
             "date": time.strftime("%Y-%m-%d", time.gmtime(h.memory.timestamp)),
             "pinned": h.memory.pinned, "score": round(h.score, 3)}
            for h in hits
        ]})  # fmt: skip

    def _tool_forget(self, args: dict[str, Any]) -> str:
        mid = _arg_str(args, "id", 32)
        if not self._writes:
            return _error("memory is read-only in this agent context")
        assert self._shared is not None
        try:
            done = self._wait(self._shared.writer.submit("forget", mid))
        except UnknownMemoryError as exc:
            return _error(str(exc))
        return self._pending_reply() if done is PENDING else _json({"ok": True, "forgotten": mid})

    def _tool_pin(self, args: dict[str, Any]) -> str:
        mid = _arg_str(args, "id", 32)
        pinned = _arg_bool(args, "pinned", default=True)
        if not self._writes:
            return _error("memory is read-only in this agent context")
        assert self._shared is not None
        try:
            done = self._wait(self._shared.writer.submit("pin", (mid, pinned)))
        except UnknownMemoryError as exc:
            return _error(str(exc))
        if done is PENDING:
            return self._pending_reply()
        return _json({"ok": True, "id": mid, "pinned": pinned})


class _BadArgs(ValueError):
    pass


def _arg_str(args: dict[str, Any], key: str, max_chars: int, default: str | None = None) -> str:
    value = args.get(key, default)
    if value is None:
        raise _BadArgs(f"missing required argument {key!r}")
    if not isinstance(value, str):
        raise _BadArgs(f"{key!r} must be a string, not {type(value).__name__}")
    value = value.strip()
    if not value:
        raise _BadArgs(f"{key!r} must not be empty")
    if len(value) > max_chars:
        raise _BadArgs(f"{key!r} is {len(value)} characters; the limit is {max_chars}")
    return value


def _arg_bool(args: dict[str, Any], key: str, *, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise _BadArgs(f"{key!r} must be true or false, not {value!r}")
    return value


def register(ctx: Any) -> None:
    """Hermes's plugin hook: ``ctx.register_memory_provider(FastmemProvider())``."""
    ctx.register_memory_provider(FastmemProvider())


# --- installing into a Hermes profile -------------------------------------------------------

PLUGIN_INIT = '''\
"""fastmem memory provider for Hermes Agent: a MemoryProvider over a fastmem store.

Written by `fastmem hermes install`; the provider itself is
fastmem.integrations.hermes.FastmemProvider (fastmem must be installed in the Python that
runs Hermes). Activate with `memory: {provider: fastmem}` in config.yaml.
"""

import logging

try:
    from fastmem.integrations.hermes import FastmemProvider
except ImportError as exc:  # Hermes reports a failed plugin import only at DEBUG level
    logging.getLogger(__name__).warning(
        "fastmem memory provider: cannot import fastmem (%s); pip install fastmem into the "
        "Python environment that runs Hermes", exc)
    raise


def register(ctx):
    ctx.register_memory_provider(FastmemProvider())
'''

PLUGIN_YAML = '''\
name: fastmem
version: {version}
description: "fastmem: unbounded local memory in two files; a bounded, relevant slice (~1,300 tokens) recalled each turn. No server, no LLM calls."
hooks:
  - on_session_end
  - on_pre_compress
  - on_session_switch
  - on_memory_write
  - on_delegation
'''


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install` did; ``message`` says it for a person."""

    hermes_home: str
    plugin_dir: str
    config_path: str
    activated: bool
    message: str


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".fastmem-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:  # keep the mode of the file replaced (mkstemp makes 0600)
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _provider_in(text: str) -> str | None:
    """memory.provider from config.yaml's text (PyYAML when importable)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        match = re.search(r"^memory:[ \t]*\n(?:[ \t]+.*\n|[ \t]*\n)*?[ \t]+provider:[ \t]*['\"]?([\w.-]*)", text, re.M)
        return match.group(1) if match else None
    data = yaml.safe_load(text) or {}
    memory = data.get("memory") if isinstance(data, dict) else None
    return memory.get("provider") if isinstance(memory, dict) else None


def _activated_text(text: str) -> str:
    """config.yaml's text with memory.provider set to fastmem, the rest kept."""
    try:
        import yaml
    except ImportError:
        return _activated_text_plain(text)
    data = yaml.safe_load(text) if text.strip() else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInputError("config.yaml does not hold a mapping; set memory.provider by hand")
    memory = data.get("memory")
    if not isinstance(memory, dict):
        memory = data["memory"] = {}
    memory["provider"] = "fastmem"
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _activated_text_plain(text: str) -> str:
    """Without PyYAML: edit the ``memory:`` block's lines (comments and order kept)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"memory:\s*(#.*)?$", line):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1] in " \t"):
                if re.match(r"[ \t]+provider:", lines[j]):
                    indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
                    lines[j] = f"{indent}provider: fastmem"
                    return "\n".join(lines) + "\n"
                j += 1
            lines.insert(i + 1, "  provider: fastmem")
            return "\n".join(lines) + "\n"
    return text + ("" if not text or text.endswith("\n") else "\n") + "memory:\n  provider: fastmem\n"


def install(hermes_home: str | os.PathLike[str] | None = None, *, activate: bool = False) -> InstallResult:
    """Install the fastmem provider into a Hermes profile (hermes-agent need not be importable).

    Writes ``<hermes_home>/plugins/fastmem/`` (``__init__.py``, ``plugin.yaml``); with
    ``activate``, sets ``memory.provider: fastmem`` in ``<hermes_home>/config.yaml``
    (the rest of the file is kept; the previous file is saved as ``config.yaml.bak``).

    Args:
        hermes_home: the profile directory; ``$HERMES_HOME`` or ``~/.hermes`` by default.
        activate: also set the provider in config.yaml.

    Raises:
        InvalidTypeError: an argument has the wrong type.
        InvalidInputError: config.yaml is not a YAML mapping (with ``activate``).
        OSError: the files cannot be written.
    """
    if hermes_home is not None and not isinstance(hermes_home, (str, os.PathLike)):
        raise InvalidTypeError(f"hermes_home must be a path, not {type(hermes_home).__name__}")
    if not isinstance(activate, bool):
        raise InvalidTypeError("activate must be True or False")
    home = os.fspath(hermes_home) if hermes_home is not None else (
        os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes"))  # fmt: skip
    home = os.path.abspath(home)
    plugin_dir = os.path.join(home, "plugins", "fastmem")
    os.makedirs(plugin_dir, exist_ok=True)
    _write_atomic(os.path.join(plugin_dir, "__init__.py"), PLUGIN_INIT)
    _write_atomic(os.path.join(plugin_dir, "plugin.yaml"), PLUGIN_YAML.format(version=fastmem.__version__))

    config_path = os.path.join(home, "config.yaml")
    try:
        with open(config_path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    active = _provider_in(text) == "fastmem"
    notes = [f"Installed the fastmem memory provider in {plugin_dir}."]
    if activate and not active:
        new_text = _activated_text(text)
        if text:
            _write_atomic(config_path + ".bak", text)
        _write_atomic(config_path, new_text)
        active = True
        notes.append(f"Activated it: memory.provider is fastmem in {config_path}"
                     + (f" (previous file: {config_path}.bak)." if text else "."))  # fmt: skip
    elif active:
        notes.append(f"It is active: memory.provider is fastmem in {config_path}.")
    else:
        notes.append(f"To activate it, set this in {config_path} (or run "
                     f"`fastmem hermes install --activate`):\n  memory:\n    provider: fastmem")  # fmt: skip
    notes.append("Then restart Hermes (CLI and gateway). fastmem must be installed in the Python "
                 "that runs Hermes; memories are kept in " + os.path.join(home, "fastmem") + ".")  # fmt: skip
    return InstallResult(home, plugin_dir, config_path, active, "\n".join(notes))

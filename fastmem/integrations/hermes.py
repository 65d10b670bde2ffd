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
read-only handle for reads and one writer thread that applies writes in order, each batch
fsynced before it is acknowledged (``sync_turn`` only queues). Every process on a profile
(the CLI, the gateway, cron jobs) writes to the store itself: the store's writer lock is
taken per write, and a search in any process sees every turn acknowledged before it, in
any process. There are no side files in normal operation. ``pending-*.jsonl`` files
beside the store keep, durably, only what was still queued at the shutdown deadline, a
batch that met the writer lock held by another process for more than
:data:`~fastmem.integrations._writer.WRITE_WAIT` seconds, and a batch that met a fault of
the disk or whose sync failed (a tool call then answers ``"pending": true``); the next
writer of the store imports them, in any process, each write once, even when an import
is cut short (see :mod:`fastmem.integrations._writer`). The installer is
:mod:`fastmem.integrations._hermes_install` (:func:`install` here).

On a Ray cluster (``fastmem[ray]``): with a location ``ray+gcs://HOST:PORT/ROOT?...`` (or
``ray://``; the syntax of :func:`fastmem.ray.open_location`) given as ``store=``, in
``FASTMEM_HERMES_STORE`` or as ``store`` in ``<hermes_home>/fastmem/config.json``, the
store is served by its shard and the same writer writes to it through the router
(:mod:`fastmem.integrations._cluster`). Writes the shard cannot take (its node is down)
wait in spill files under ``<hermes_home>/fastmem-spill/<namespace>/`` with their
operation ids and are replayed when it answers again, each stored once; reads meanwhile
give an empty context and a logged warning.

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
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import fastmem
from fastmem.errors import FastmemError, InvalidInputError, StoreNotFoundError, UnknownMemoryError
from fastmem.namespaces import namespace_path
from fastmem.types import Level

from ._hermes_install import STORE_ENV, InstallResult, configured_store, install, save_settings
from ._writer import PENDING, SPILL_GLOB, Handler, LocalTarget, _not_saved, _open_store, _Writer

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
SHUTDOWN_TIMEOUT = 4.0  # Hermes drains its own queue for 5 s before calling shutdown()
CACHE_SECONDS = 120.0  # a queued prefetch older than this is computed again
FACTS_PER_SESSION = 20
# The store's limit on a session name (a longer one is refused): Hermes's ids are cut to it.
# TODO(merge): take a public constant when fastmem grows one (today _format.MAX_SESSION_CHARS).
SESSION_MAX_CHARS = 256
PROMPT_CONTEXT_BUDGET = 1000  # tokens of the context the system prompt's pinned facts come from
PINNED_LINE_MAX_CHARS = 300  # per pinned fact in the system prompt
SEARCH_TEXT_MAX_CHARS = 1000  # per hit in fastmem_search's reply
PREFETCH_CACHE_SIZE = 4  # queued prefetches kept per provider (Hermes queues one per turn)

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
# The writer (fastmem.integrations._writer) applies "add" itself; the provider's other
# writes are these handlers. Their arguments may come back from a spill file (JSON).


def _forget(store: fastmem.MemoryStore, mid: str) -> str:
    store.forget(mid)
    return mid


def _pin(store: fastmem.MemoryStore, args: Any) -> str:
    mid, pinned = args  # a tuple, or a list when read back from a spill file
    store.pin(mid, pinned)
    return str(mid)


def _add_unique(store: fastmem.MemoryStore, args: dict[str, Any]) -> str:
    """Add, unless the same text (case and spacing aside) is stored: consolidated facts."""
    folded = " ".join(args["text"].casefold().split())
    for hit in store.search(args["text"], 5, mode="keyword"):
        if " ".join(hit.memory.text.casefold().split()) == folded:
            return hit.id
    return store.add(**args)


def _mirror_write(store: fastmem.MemoryStore, args: dict[str, Any]) -> str | None:
    return _mirror(store, **args)


def _record_access(store: fastmem.MemoryStore, args: dict[str, Any]) -> None:
    """The memories a context gave the model, counted as the store counts its own
    contexts' (the provider reads through a read-only handle, which counts nothing; the
    counts live in the writer's handle until it checkpoints)."""
    store.record_access(args["ids"], args["now"])


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

    # A replace forgets the old entry rather than superseding it (add's ``supersedes``): the
    # built-in memory holds it no more, and a later remove of the new entry would bring a
    # superseded one back into contexts (a forgotten successor ends the link).
    if action in ("replace", "remove"):
        for mid in mirrored(old_text or (content if action == "remove" else "")):
            store.forget(mid)
    if action in ("add", "replace") and content:
        text = content[:TOOL_TEXT_MAX_CHARS]
        if timestamp is not None:  # applied before (a kept write imported again): once
            for mid in mirrored(text):
                if (memory := store.get(mid)).text == text and memory.timestamp == timestamp:
                    return mid
        meta = {"source": source, **{k: v for k, v in metadata.items() if isinstance(v, str)}}
        return store.add(text, type="fact", metadata=meta, timestamp=timestamp)
    return None


_HANDLERS: dict[str, Handler] = {
    "forget": _forget, "pin": _pin, "add_unique": _add_unique, "mirror": _mirror_write,
    "access": _record_access,
}  # fmt: skip


class _Shared:
    """One store's read handle, writer and prefetch thread, shared by every provider of it
    in this process (the gateway keeps a provider per cached agent)."""

    def __init__(self, path: str, target: LocalTarget | None = None) -> None:
        self.path = path
        self.target = target or LocalTarget(path)
        self.key = _shared_key(path, target)
        self.refs = 0
        self.writer = _Writer(path, _HANDLERS, self.target)
        self.prefetcher = ThreadPoolExecutor(1, thread_name_prefix="fastmem-prefetch")
        self._reader: fastmem.MemoryStore | None = None
        self._reader_lock = threading.Lock()
        # The store is opened (and created) on first use: a gateway user who never says
        # anything gets no store. Writes an earlier process could not make are taken in now.
        if glob.glob(os.path.join(os.path.dirname(path), SPILL_GLOB)):
            self.writer.submit("open", None)

    def reader(self) -> fastmem.MemoryStore:
        """The read-only handle, opened on first use. It sees every write acknowledged
        before each call, in any process, and never waits for the writer lock (a write on
        the writer's handle may wait for another process's, up to WRITE_WAIT seconds)."""
        with self._reader_lock:
            if self._reader is None and hasattr(self.target, "open_reader"):  # a cluster's store
                self._reader = self.target.open_reader()
            if self._reader is None:
                try:
                    self._reader = _open_store(self.path, readonly=True)
                except StoreNotFoundError:  # new, or being created by another process
                    try:  # the writer creates it, or waits (writer lock) until it is created
                        self.writer.submit("open", None).result(TOOL_WAIT)
                    except FutureTimeout:
                        pass  # the open below says what is wrong
                    self._reader = _open_store(self.path, readonly=True)
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


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's writer and prefetch threads: the shared
    entries it inherited would queue its writes forever (a tool call answered "queued"
    after 10 s). The child starts afresh; the parent's entries are left alone (their
    threads and handles are the parent's). (The edge keeps its own hook: fastmem's at-fork
    registry is private to the package.)"""
    global _registry, _registry_lock
    _registry, _registry_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _shared_key(path: str, target: LocalTarget | None) -> str:
    """The registry's key: the store's path, and a cluster store's location before it."""
    location = getattr(target, "location", None)
    return f"{location}|{path}" if location else path


def _acquire_shared(path: str, target: LocalTarget | None = None) -> _Shared:
    with _registry_lock:
        shared = _registry.get(_shared_key(path, target))
        if shared is None:
            shared = _Shared(path, target)
            _registry[shared.key] = shared
        shared.refs += 1
        return shared


def _release_shared(shared: _Shared, timeout: float) -> None:
    with _registry_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        _registry.pop(shared.key, None)
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


SUMMARY_ASKS, SUMMARY_ASK_CHARS = 8, 160  # a session summary: the first 8 requests, 160 characters each


def summarize_session(messages: Any, session_id: str) -> str | None:
    """A line per user request (its first SUMMARY_ASK_CHARS characters), at most
    SUMMARY_ASKS: what the session was about."""
    asks = _user_texts(messages)
    if not asks:
        return None
    day = time.strftime("%d %b %Y", time.gmtime())
    count = f"{len(asks)} user message" + ("s" if len(asks) != 1 else "")
    lines = [f"Session {session_id or '?'} ({day}, {count}). The user asked:"]
    for text in asks[:SUMMARY_ASKS]:
        one = " ".join(text.split("<memory-context>")[0].split())
        lines.append("- " + (one[:SUMMARY_ASK_CHARS] + "…" if len(one) > SUMMARY_ASK_CHARS else one))
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

    def __init__(self, *, context_budget: int = CONTEXT_BUDGET, store: str | None = None) -> None:
        self._budget = context_budget
        self._location = store  # a cluster location; None: the profile's settings say
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
        # Writes that were not saved (a failing disk, and no spill file could keep them)
        # since the model was last told: the next recall says so.
        self._unsaved = 0
        self._unsaved_reason = ""
        self._warn_user: Any = None  # Hermes's warning_callback (the CLI shows it)

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
        """The store's base path (``.dat``/``.idx`` beside it) once initialized; on a
        cluster, the local path its spill files go beside."""
        return None if self._shared is None else self._shared.path

    # -- lifecycle ---------------------------------------------------------------------

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        """Bind to the profile's store for this user; cheap (the store opens on first use)."""
        if self._shared is not None:  # initialized again: let go of the old binding first
            self.shutdown()
        home = kwargs.get("hermes_home") or os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes")
        self._platform = str(kwargs.get("platform") or "cli")
        namespace = user_namespace(kwargs.get("user_id"), self._platform)
        location = self._location or configured_store(str(home))
        target = None
        if location:  # a store served by a Ray cluster; writes it cannot take now wait here
            from ._cluster import ClusterTarget, store_namespace

            namespace = store_namespace(location, namespace)
            path = namespace_path(os.path.join(str(home), "fastmem-spill"), namespace, create=True)
            # Ray shuts down at exit (registered when it connects): what is queued then must
            # be written before, so _close_all is registered again after it (runs first).
            target = ClusterTarget(path, location, namespace, on_connect=lambda: atexit.register(_close_all))
        else:
            path = namespace_path(os.path.join(str(home), "fastmem"), namespace, create=True)
        # Cron runs, subagents and flushes must not write into the user's memory.
        self._writes = (kwargs.get("agent_context") or "primary") == "primary"
        self._session_id = str(session_id or "")
        callback = kwargs.get("warning_callback")
        self._warn_user = callback if callable(callback) else None
        self._reset_session()
        self._shared = _acquire_shared(path, target)

    def get_config_schema(self) -> list[dict[str, Any]]:
        """``hermes memory setup``: the one setting, where the stores live."""
        return [{"key": "store", "required": False, "default": "", "env_var": STORE_ENV,
                 "description": "Empty: this profile's own directory. Or a Ray cluster's deployment, "
                                "e.g. ray+gcs://HOST:6379/ROOT?shards=16&namespace=PROFILE (fastmem[ray])"}]  # fmt: skip

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        save_settings(values, hermes_home)

    def shutdown(self, **kwargs: Any) -> None:
        """Write what is queued (bounded in time), then close the store if no other
        provider in this process uses it."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _release_shared(shared, SHUTDOWN_TIMEOUT)

    def flush(self, timeout: float = TOOL_WAIT) -> bool:
        """Wait until every write queued so far is on disk (in the store, or in a spill
        file when the store could not take it: its lock held too long by another process, a
        failing disk); False on timeout, or when writes of the last batch were not saved."""
        if self._shared is None:
            return True
        try:
            self._shared.writer.submit("barrier", None).result(timeout)
            return True
        except FutureTimeout:
            return False
        except Exception as exc:  # writes before it were not saved (and could not be kept)
            logger.warning("fastmem: flush: %s", exc)
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
            ctx = self._shared.reader().context("", budget=PROMPT_CONTEXT_BUDGET)
            pinned = [item for item in ctx.items if item.level == Level.PINNED]
        except FastmemError as exc:
            logger.warning("fastmem: pinned facts unavailable: %s", exc)
            pinned = []
        used = 0
        for item in pinned:
            line = "- " + " ".join(item.text.split())[:PINNED_LINE_MAX_CHARS]
            if used + len(line) > PROMPT_PINNED_CHARS:
                break
            if not shown:
                lines.append("Pinned facts:")
            lines.append(line)
            used += len(line)
            shown.add(item.id)
        with self._lock:
            self._prompt_ids = shown
        self._note_used(shown)
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
        session = self._session()
        own = {i.id for i in ctx.items if session and i.session == session}
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
            while len(self._cache) > PREFETCH_CACHE_SIZE:  # oldest first: dicts keep insertion order
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
        notice = self._unsaved_notice()
        with self._lock:
            fresh = ids - self._injected - self._written - self._prompt_ids
            if ids and not fresh:  # all shown meanwhile (a queued result raced a turn)
                return notice
            self._injected |= ids
        self._note_used(ids)
        return notice + "\n\n" + text if notice and text else notice or text

    def _unsaved_notice(self) -> str:
        """A line for the model about writes that were not saved since it was last told."""
        with self._lock:
            count, reason = self._unsaved, self._unsaved_reason
            self._unsaved = 0
        if not count:
            return ""
        return (f"[fastmem: {count} memory write{'s were' if count != 1 else ' was'} NOT saved to "
                f"long-term memory ({reason}). Tell the user if it matters; ask them to save it "
                f"again once the problem is fixed.]")  # fmt: skip

    def _track(self, future: Future[Any]) -> None:
        """Count a write that was not saved (not a caller's mistake): the model is told in
        the next recall, the user at once (Hermes's warning line, in the CLI)."""
        future.add_done_callback(self._note_unsaved)

    def _note_unsaved(self, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is None or isinstance(exc, (InvalidInputError, UnknownMemoryError)):
            return
        reason = " ".join(str(exc).split())[:200]
        with self._lock:
            first = self._unsaved == 0
            self._unsaved += 1
            self._unsaved_reason = reason
        logger.error("fastmem: a memory write was not saved: %s", exc)
        if first and self._warn_user is not None:
            try:
                self._warn_user(f"fastmem: a memory write was not saved: {reason}")
            except Exception:  # the host's callback must not break the writer
                logger.debug("fastmem: warning_callback failed", exc_info=True)

    def _note_used(self, ids: set[str]) -> None:
        """Count the memories given to the model as accessed (queued: no wait)."""
        if ids and self._shared is not None and self._writes:
            self._shared.writer.submit("access", {"ids": sorted(ids), "now": time.time()})

    # -- writes ------------------------------------------------------------------------

    def _submit_add(self, item: dict[str, Any], *, track: bool = True) -> Future[Any] | None:
        """Queue an add; ``track``: a failure is told in the next recall (a tool call's
        own reply says it instead)."""
        if self._shared is None or not self._writes:
            return None
        future = self._shared.writer.submit("add", item)
        future.add_done_callback(self._note_written)
        if track:
            self._track(future)
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
        self._submit_add({
            "text": text, "type": "conversation", "timestamp": time.time(),
            "session": self._session(session_id),
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
        self._track(future)

    def _consolidate(self, messages: Any, *, summary: bool) -> list[str]:
        """Store the user's first-person statements as facts (and a session summary)."""
        facts = extract_facts(messages)
        if self._shared is None or not self._writes:
            return facts
        session = self._session()
        for fact in facts:
            future = self._shared.writer.submit("add_unique", {
                "text": fact, "type": "fact", "session": session, "importance": 0.8,
                "timestamp": time.time(),
                "metadata": {"source": "hermes-consolidation"},
            })  # fmt: skip
            future.add_done_callback(self._note_written)
            self._track(future)
        text = summarize_session(messages, self._session_id) if summary else None
        if text:
            self._track(self._shared.writer.submit("add_unique", {
                "text": text, "type": "session_summary", "session": session, "importance": 0.5,
                "timestamp": time.time(),
                "metadata": {"source": "hermes-consolidation"},
            }))  # fmt: skip
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

    def _session(self, session_id: Any = None) -> str | None:
        """The session name stored with a write: ``session_id`` or this provider's, cut to
        the store's limit; ``None`` when there is none."""
        return str(session_id or self._session_id)[:SESSION_MAX_CHARS] or None

    def _reset_session(self) -> None:
        with self._lock:
            self._injected.clear()
            self._written.clear()
            self._cache.clear()

    def on_delegation(self, task: str, result: str, *, child_session_id: str = "",
                      **kwargs: Any) -> None:  # fmt: skip
        """Remember what a subagent was asked and what it found."""
        if _text_of(task).strip() or _text_of(result).strip():
            session = self._session()
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
        """The write's result; PENDING when it was kept in a spill file (the store could
        not take it now: it reaches the store later), _QUEUED when it is still queued.
        Raises a fastmem error when it was not saved."""
        try:
            return future.result(TOOL_WAIT)
        except FutureTimeout:
            return _QUEUED
        except FastmemError:
            raise
        except Exception as exc:  # an error the writer did not expect: still "not saved"
            raise _not_saved(exc, "the write failed") from exc

    def _pending_reply(self, done: Any) -> str:
        if done is _QUEUED:
            return _json({"ok": True, "pending": True,
                          "note": "queued, not on disk yet (the memory store is busy); it is "
                                  "written shortly, unless the agent stops first"})  # fmt: skip
        return _json({"ok": True, "pending": True,
                      "note": "kept in a side file beside the memory store, which could not "
                              "take it now; it is stored with the next write or start"})  # fmt: skip

    def _tool_remember(self, args: dict[str, Any]) -> str:
        text = _arg_str(args, "text", TOOL_TEXT_MAX_CHARS)
        kind = _arg_str(args, "type", 64, default="fact")
        pin = _arg_bool(args, "pin", default=False)
        if not self._writes:
            return _error("memory is read-only in this agent context")
        future = self._submit_add({"text": text, "type": kind, "pinned": pin, "timestamp": time.time(),
                                   "session": self._session(),
                                   "metadata": {"source": "hermes-tool"}}, track=False)  # fmt: skip
        assert future is not None
        mid = self._wait(future)
        return self._pending_reply(mid) if mid in (PENDING, _QUEUED) else _json({"ok": True, "id": mid, "pinned": pin})

    def _tool_search(self, args: dict[str, Any]) -> str:
        query = _arg_str(args, "query", QUERY_MAX_CHARS)
        limit = args.get("limit", 5)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 20:
            raise _BadArgs(f"limit must be an integer from 1 to 20, got {limit!r}")
        assert self._shared is not None
        hits = self._shared.reader().search(query, limit)
        return _json({"results": [
            {"id": h.id, "text": h.memory.text[:SEARCH_TEXT_MAX_CHARS], "type": h.memory.type,
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
        return self._pending_reply(done) if done in (PENDING, _QUEUED) else _json({"ok": True, "forgotten": mid})

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
        if done in (PENDING, _QUEUED):
            return self._pending_reply(done)
        return _json({"ok": True, "id": mid, "pinned": pinned})


class _BadArgs(ValueError):
    pass


_QUEUED = object()  # a tool call's write still queued when its wait ran out


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

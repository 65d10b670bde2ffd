"""fastmem as a Google ADK memory service (``google.adk.memory.BaseMemoryService``).

Switch an ADK app from ``InMemoryMemoryService`` in one line::

    from fastmem.integrations.adk import FastmemMemoryService

    memory_service = FastmemMemoryService("memories")  # was: InMemoryMemoryService()
    runner = Runner(agent=agent, app_name="app", session_service=sessions,
                    memory_service=memory_service)

ADK's ``load_memory`` and ``preload_memory`` tools then recall through fastmem: a search
returns the memories of fastmem's packed context for the query (pinned memories and the
best matches of its hybrid search, fitted to ``budget`` tokens, a long memory cut to its
matching passage or its summary), so ``preload_memory`` never floods the prompt.

Scoping: every (app_name, user_id) pair has a store of its own, a namespace under the
root directory (:func:`user_namespace`): separate files, so no search of one user can see
another user's memories, whatever the query. Each event with text is one memory (its text
is what is searched; its ``Content`` is kept exactly, as JSON, in the memory's metadata up
to 60 KB), in the store's session named after the ADK session, with the event's author and
timestamp; adding a session again adds only the events not added before.

Every call that touches a store runs in a worker thread (``asyncio.to_thread``): the event
loop never waits on a search, a write or the writer lock.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import fastmem
from fastmem.errors import (
    DependencyUnavailableError,
    InvalidInputError,
    InvalidTypeError,
    StoreClosedError,
    UnknownMemoryError,
)  # fmt: skip
from fastmem.namespaces import namespace_path

try:
    from google.adk.memory import BaseMemoryService
    from google.adk.memory.base_memory_service import SearchMemoryResponse
    from google.adk.memory.memory_entry import MemoryEntry
    from google.genai import types
except ImportError as exc:  # pragma: no cover - the tests run with ADK installed
    raise DependencyUnavailableError(
        "fastmem.integrations.adk needs Google ADK: pip install 'fastmem[adk]'"
    ) from exc

__all__ = ["METADATA_KEY", "FastmemMemoryService", "user_namespace"]

METADATA_KEY = "adk"  # a memory's ADK fields (event id, author, content) in its metadata
_UNKNOWN_SESSION = "__unknown_session_id__"  # ADK's own name for events of no session
_CONTENT_BYTES = 60_000  # a Content's JSON kept up to this many bytes (metadata: 64 KiB)
_MAX_TEXT_BYTES = (1 << 20) - 16  # a memory's text: at most 1 MiB of UTF-8
_DELETED_TYPE = "adk_deleted"  # marks an event deleted, so adding its session again skips it
_DELETED_TEXT = "(deleted)"
_EVENT_TYPE = "conversation"  # an event's memory type
_ENTRY_TYPE = "fact"  # add_memory's explicit memories: ranked as facts


def user_namespace(app_name: str, user_id: str) -> str:
    """The namespace of (``app_name``, ``user_id``): both names in a readable short form
    and a hash of the pair, so two pairs never share one even when their short forms
    match (``"My App"`` and ``"my-app"``).

    Raises:
        InvalidTypeError: a name is not a string.
        InvalidInputError: a name is empty.
    """
    for value, what in ((app_name, "app_name"), (user_id, "user_id")):
        if not isinstance(value, str):
            raise InvalidTypeError(f"{what} must be a string, not {type(value).__name__}")
        if not value:
            raise InvalidInputError(f"{what} must not be empty")
    pair = json.dumps([app_name, user_id])  # unambiguous, whatever characters they hold
    digest = hashlib.sha256(pair.encode()).hexdigest()[:20]
    return f"{_slug(app_name)}-{_slug(user_id)}-{digest}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower())[:20].strip("-") or "_"


def _session_name(session_id: str) -> str:
    if 0 < len(session_id) <= 256:
        try:
            session_id.encode("utf-8")
            return session_id
        except UnicodeEncodeError:
            pass
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


class FastmemMemoryService(BaseMemoryService):
    """An ADK memory service on fastmem stores, one per (app, user) under ``root``.

    Args:
        root: the directory of the namespaces (created if missing).
        budget: tokens of the context a search returns (exact, ``cl100k_base``).
        max_results: at most this many memories per search.
        max_open: stores kept open at once; the least recently used idle one is closed
            beyond it (a server with many users keeps its file descriptors bounded).
        **open_options: what ``fastmem.open`` takes for each store (``embedder``,
            ``timeout``...).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        budget: int = 1300,
        max_results: int = 50,
        max_open: int = 64,
        **open_options: Any,
    ) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise InvalidTypeError(f"root must be a path, not {type(root).__name__}")
        for value, what in ((budget, "budget"), (max_results, "max_results"),
                            (max_open, "max_open")):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{what} must be an int >= 1, got {value!r}")
        self.root = os.fspath(root)
        self.budget, self.max_results, self._max_open = budget, max_results, max_open
        self._open_options = open_options
        self._lock = threading.Lock()
        self._stores: OrderedDict[str, fastmem.MemoryStore] = OrderedDict()
        self._in_use: dict[str, int] = {}
        self._closed = False

    # --- BaseMemoryService ----------------------------------------------------------------

    async def add_session_to_memory(self, session: Any) -> None:
        """Add the session's events that have text and were not added before.

        Raises:
            InvalidTypeError: ``session`` has no ``app_name``, ``user_id``, ``id`` and
                ``events`` (nothing is written).
        """
        try:
            app_name, user_id = session.app_name, session.user_id
            session_id, events = session.id, session.events
        except AttributeError:
            raise InvalidTypeError("session must be an ADK Session") from None
        await self.add_events_to_memory(
            app_name=app_name, user_id=user_id, events=events, session_id=session_id
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Any],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Add the events that have text and were not added before (a delta; an event is
        known by its id, or, without one, by a hash of its author, time and content).
        ``custom_metadata`` is accepted and not used.

        Raises:
            InvalidTypeError: a name is not a string or ``events`` is not a list of events.
        """
        namespace = user_namespace(app_name, user_id)
        if session_id is not None and not isinstance(session_id, str):
            raise InvalidTypeError(f"session_id must be a string, not {type(session_id).__name__}")
        if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Sequence):
            raise InvalidTypeError("events must be a list of ADK events")
        scope = session_id or _UNKNOWN_SESSION
        name = _session_name(scope)  # once for the batch: every event is of this session
        records = [r for r in (_event_record(e, scope, name) for e in events) if r is not None]
        if records:
            await asyncio.to_thread(self._add_new, namespace, records)

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Add explicit memories (stored as facts: they rank above conversation). Each
        needs text in its content; ``custom_metadata`` is accepted and not used.

        Raises:
            InvalidTypeError: ``memories`` is not a list of ``MemoryEntry``.
            InvalidInputError: an entry has no text (nothing is written).
        """
        namespace = user_namespace(app_name, user_id)
        if isinstance(memories, (str, bytes, Mapping)) or not isinstance(memories, Sequence):
            raise InvalidTypeError("memories must be a list of MemoryEntry")
        records = [_entry_record(i, entry) for i, entry in enumerate(memories)]
        if records:
            await asyncio.to_thread(self._write, namespace, records)

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        """The user's memories that matter for ``query``: those of fastmem's packed context
        (at most ``budget`` tokens and ``max_results`` memories), oldest first. Empty for
        an empty query.

        Raises:
            InvalidTypeError: a name or ``query`` is not a string.
        """
        namespace = user_namespace(app_name, user_id)
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a string, not {type(query).__name__}")
        if not query.strip():
            return SearchMemoryResponse()
        entries = await asyncio.to_thread(self._search, namespace, query)
        return SearchMemoryResponse(memories=entries)

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        """Delete the memory ``memory_id`` (a ``MemoryEntry.id`` a search returned); an
        unknown id, or ``None``, deletes nothing. A deleted event stays deleted when its
        session is added again.

        Raises:
            InvalidTypeError: ``memory_id`` is not a string.
        """
        namespace = user_namespace(app_name, user_id)
        if memory_id is None:
            return
        if not isinstance(memory_id, str):
            raise InvalidTypeError(f"memory_id must be a string, not {type(memory_id).__name__}")
        await asyncio.to_thread(self._delete, namespace, memory_id)

    async def close(self) -> None:
        """Close every store this service opened; idempotent."""
        await asyncio.to_thread(self._close_all)

    # --- the stores ---------------------------------------------------------------------

    def _store(self, namespace: str, create: bool) -> fastmem.MemoryStore | None:
        """The namespace's open store, marked in use (give it back with ``_release``);
        ``None`` when it has no store and ``create`` is false."""
        with self._lock:
            if self._closed:
                raise StoreClosedError("FastmemMemoryService is closed")
            store = self._stores.get(namespace)
            if store is None:
                path = namespace_path(self.root, namespace, create=False)
                if not create and not os.path.exists(path + ".dat"):
                    return None
                store = fastmem.open(self.root, namespace=namespace, **self._open_options)
                self._stores[namespace] = store
            self._stores.move_to_end(namespace)
            self._in_use[namespace] = self._in_use.get(namespace, 0) + 1
            self._close_idle()
            return store

    def _release(self, namespace: str) -> None:
        with self._lock:
            self._in_use[namespace] -= 1
            if not self._in_use[namespace]:
                del self._in_use[namespace]
            self._close_idle()

    def _close_idle(self) -> None:
        """Close least recently used stores nobody is using while over ``max_open``."""
        for name in list(self._stores):
            if len(self._stores) <= self._max_open:
                return
            if name not in self._in_use:
                self._stores.pop(name).close()

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
            stores, self._stores = list(self._stores.values()), OrderedDict()
        for store in stores:
            store.close()

    # --- the work, in a worker thread ---------------------------------------------------

    def _write(self, namespace: str, records: list[dict[str, Any]]) -> None:
        store = self._store(namespace, create=True)
        assert store is not None
        try:
            store.add_many(records)
        finally:
            self._release(namespace)

    def _add_new(self, namespace: str, records: list[dict[str, Any]]) -> None:
        """Add the events not in the store yet (nor deleted), one commit for all."""
        store = self._store(namespace, create=True)
        assert store is not None
        try:
            known: dict[str, set[Any]] = {}
            new = []
            for record in records:
                session = record["session"]
                if session not in known:
                    known[session] = {
                        meta.get("event_id") for m in store.recent(1 << 62, session=session)
                        if (meta := _meta(m)) is not None
                    }  # fmt: skip
                event_id = record["metadata"][METADATA_KEY]["event_id"]
                if event_id not in known[session]:
                    known[session].add(event_id)
                    new.append(record)
            if new:
                store.add_many(new)
        finally:
            self._release(namespace)

    def _search(self, namespace: str, query: str) -> list[MemoryEntry]:
        store = self._store(namespace, create=False)
        if store is None:
            return []
        try:
            context = store.context(query, self.budget)
            entries = []
            for item in context.items:
                if item.type == _DELETED_TYPE:
                    continue
                try:
                    memory = store.get(item.id)
                except UnknownMemoryError:  # forgotten since the context was built
                    continue
                entries.append((memory.timestamp, memory.id, _memory_entry(
                    memory, item.text, whole=item.text == memory.text)))  # fmt: skip
                if len(entries) == self.max_results:
                    break
            entries.sort(key=lambda e: (e[0], int(e[1][1:])))  # as they happened
            return [entry for _, _, entry in entries]
        finally:
            self._release(namespace)

    def _delete(self, namespace: str, memory_id: str) -> None:
        store = self._store(namespace, create=False)
        if store is None:
            return
        try:
            try:
                memory = store.get(memory_id)
            except (UnknownMemoryError, InvalidInputError):
                return  # not a memory of this user's: nothing to delete (as ADK's services)
            if memory.type == _DELETED_TYPE:
                return
            meta = _meta(memory)
            if meta is not None and "event_id" in meta and memory.session is not None:
                marker = {METADATA_KEY: {"event_id": meta["event_id"]}}
                store.add(_DELETED_TEXT, type=_DELETED_TYPE, session=memory.session,
                          importance=0.0, metadata=marker)  # fmt: skip
            try:
                store.forget(memory_id)
            except UnknownMemoryError:
                pass  # deleted meanwhile by another process
        finally:
            self._release(namespace)


# --- events, entries and memories -------------------------------------------------------------


def _event_text(content: Any) -> str:
    """An event's searchable text: its text parts that are not thoughts (as ADK's own
    services take it)."""
    parts = getattr(content, "parts", None) or []
    texts = [p.text.strip() for p in parts
             if getattr(p, "text", None) and not getattr(p, "thought", False)]  # fmt: skip
    return " ".join(t for t in texts if t)


def _fit(text: str) -> str:
    if text.isascii() and len(text) <= _MAX_TEXT_BYTES:  # the common case: nothing to fix
        return text
    encoded = text.encode("utf-8", "replace")
    if len(encoded) > _MAX_TEXT_BYTES:
        return encoded[:_MAX_TEXT_BYTES].decode("utf-8", "ignore") + " …"
    return encoded.decode("utf-8")


def _content_meta(content: Any) -> dict[str, Any]:
    """What a memory keeps of a ``Content``: its JSON when it fits, else its role."""
    data = content.model_dump_json(exclude_none=True)
    if len(data.encode("utf-8")) <= _CONTENT_BYTES:
        return {"content": data}
    return {"role": content.role or "user"}


def _event_record(event: Any, session_id: str, name: str | None = None) -> dict[str, Any] | None:
    """The memory of an ADK event, ``None`` for one without text; ``name``: the store's
    session name of ``session_id`` (:func:`_session_name`), when the caller has it.

    Raises:
        InvalidTypeError: ``event`` is not an ADK event.
    """
    try:
        content, author, timestamp, event_id = event.content, event.author, event.timestamp, event.id
    except AttributeError:
        raise InvalidTypeError(f"events must be ADK events, not {type(event).__name__}") from None
    text = _event_text(content) if content is not None else ""
    if not text:
        return None
    author = author or ""
    timestamp = float(timestamp)
    if not event_id:  # as ADK's SqliteMemoryService: a hash of what the event is
        body = content.model_dump_json(exclude_none=True)
        event_id = hashlib.sha256(f"{author}:{timestamp}:{body}".encode()).hexdigest()[:32]
    meta = {"event_id": event_id, "author": author, "session_id": session_id,
            **_content_meta(content)}  # fmt: skip
    return {"text": _fit(text), "type": _EVENT_TYPE, "timestamp": timestamp,
            "session": name or _session_name(session_id),
            "metadata": {METADATA_KEY: meta}}  # fmt: skip


def _entry_record(i: int, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, MemoryEntry):
        raise InvalidTypeError(f"memories[{i}] must be a MemoryEntry, not {type(entry).__name__}")
    text = _event_text(entry.content)
    if not text:
        raise InvalidInputError(f"memories[{i}] has no text to remember")
    meta: dict[str, Any] = {"author": entry.author or "", **_content_meta(entry.content)}
    if entry.custom_metadata:
        try:  # kept when JSON can carry it (the store keeps msgpack types)
            meta["custom"] = json.loads(json.dumps(entry.custom_metadata))
        except (TypeError, ValueError):
            raise InvalidInputError(f"memories[{i}].custom_metadata is not JSON") from None
    record: dict[str, Any] = {"text": _fit(text), "type": _ENTRY_TYPE,
                              "metadata": {METADATA_KEY: meta}}  # fmt: skip
    if entry.timestamp:
        record["timestamp"] = _parse_time(i, entry.timestamp)
    return record


def _parse_time(i: int, value: str) -> float:
    try:
        return datetime.fromisoformat(value).timestamp()
    except (TypeError, ValueError):
        raise InvalidInputError(f"memories[{i}].timestamp {value!r} is not ISO 8601") from None


def _meta(memory: fastmem.Memory) -> dict[str, Any] | None:
    meta = memory.metadata.get(METADATA_KEY) if isinstance(memory.metadata, dict) else None
    return meta if isinstance(meta, dict) else None


@functools.lru_cache(maxsize=4096)
def _content(data: str) -> types.Content | None:
    """The ``Content`` of a stored JSON text (``None``: it does not validate), made once per
    text: validating one costs ~60 µs (google.genai checks every field of every part before
    pydantic does), which a search paid for every memory it returned. Entries of one text
    share one ``Content``, as ADK's ``InMemoryMemoryService`` shares its events' contents."""
    try:
        return types.Content.model_validate_json(data)
    except ValueError:
        return None


def _memory_entry(memory: fastmem.Memory, shown: str, whole: bool) -> MemoryEntry:
    """The ``MemoryEntry`` of a memory: its exact ``Content`` when the context shows it
    whole, else the text the context shows (a summary or the passage that matches)."""
    meta = _meta(memory) or {}
    content = None
    if whole and isinstance(meta.get("content"), str):
        content = _content(meta["content"])
    if content is None:
        author = meta.get("author")
        role = meta.get("role") or ("model" if author not in (None, "", "user") else "user")
        content = types.Content(role=role, parts=[types.Part(text=shown)])
    custom: dict[str, Any] = {"session_id": meta.get("session_id", memory.session)}
    if "event_id" in meta:
        custom["event_id"] = meta["event_id"]
    if isinstance(meta.get("custom"), dict):
        custom.update(meta["custom"])
    return MemoryEntry(
        id=memory.id, content=content, author=meta.get("author") or None,
        timestamp=datetime.fromtimestamp(memory.timestamp).isoformat(),
        custom_metadata={k: v for k, v in custom.items() if v is not None},
    )  # fmt: skip

"""fastmem as an OpenAI Agents SDK session (``agents.memory.SessionABC``, openai-agents).

Switch a conversation from ``SQLiteSession`` in one line::

    from fastmem.integrations.openai_agents import FastmemSession

    session = FastmemSession("conversation-42", "agent_memory")  # was: SQLiteSession(...)
    result = await Runner.run(agent, "Hello", session=session)

The session keeps each conversation's items exactly (the JSON round trip of each item dict,
as ``SQLiteSession`` keeps them), in the order they were added, across restarts and
processes: each item is one memory of the store, in the store's session named after the
session id, its JSON in the memory's metadata and a readable line ("user: ...", "tool
call: ...") as its text. One store holds any number of sessions, and because the items are
ordinary memories, :func:`memory_instructions` can put fastmem's packed context for the
latest user input (what earlier conversations said that matters now) in front of an agent's
own instructions::

    agent = Agent(name="assistant", instructions=memory_instructions(
        session.store, "You are a helpful assistant.", session=session))

Every call that touches the store runs in a worker thread (``asyncio.to_thread``): the event
loop never waits on a read, a write or the writer lock. Writes finish even when the awaiting
task is cancelled (as ``SQLiteSession``'s do), so a cancelled run never leaves half an item.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import fastmem
from fastmem.errors import (
    DependencyUnavailableError,
    InvalidInputError,
    InvalidTypeError,
    StoreClosedError,
    UnknownMemoryError,
)  # fmt: skip

try:
    from agents.items import TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - the tests run with the SDK installed
    raise DependencyUnavailableError(
        "fastmem.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'fastmem[openai-agents]'"
    ) from exc

__all__ = ["HEADER", "METADATA_KEY", "FastmemSession", "memory_instructions", "session_name"]

# The metadata key under which a memory holds its item (so a memory without it, added to the
# same session by other code, is never taken for an item): the item itself (msgpack keeps
# JSON's types: a read decodes it in the store's compiled reader, no json.loads), or its
# JSON text when msgpack cannot hold it as JSON does (an int beyond 64 bits, a lone
# surrogate, deep nesting) or it may not fit the metadata's 64 KiB as msgpack.
METADATA_KEY = "openai_agents"
CHUNK_KEY = "openai_agents_chunk"  # a chunk of a long item's JSON (see CHUNK_BYTES)
# The first line of the context memory_instructions puts before an agent's instructions.
HEADER = "What you remember (fastmem), most relevant first:"
# An item's JSON is kept whole in one memory's metadata up to this many UTF-8 bytes (the
# store takes 64 KiB of metadata); a longer one is cut into chunks of this size, each in a
# memory of its own, written in the same commit (all or none of them).
CHUNK_BYTES = 60_000
# An item is kept as itself when a bound of its msgpack size is within this (the store
# takes 64 KiB of metadata) and it is nested at most _NATIVE_DEPTH deep (the store takes 64).
_NATIVE_BYTES = 60_000
_NATIVE_DEPTH = 48
# A memory's text is at most 1 MiB of UTF-8: a longer item's readable line is cut there (its
# JSON is kept whole all the same).
_MAX_TEXT_BYTES = (1 << 20) - 16
_PART_TYPE = "agent_item_part"  # the memories that carry the second and later chunks
_PART_TEXT = "(continued)"  # their text: a memory's text may not be empty
_TOOL_TYPES = frozenset({
    "function_call", "function_call_output", "computer_call", "computer_call_output",
    "file_search_call", "web_search_call", "code_interpreter_call", "local_shell_call",
    "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output", "mcp_call", "mcp_list_tools", "custom_tool_call",
    "custom_tool_call_output", "image_generation_call", "tool_search_call",
    "tool_search_output",
})  # fmt: skip
_T = TypeVar("_T")


def session_name(session_id: str) -> str:
    """The store's session name for ``session_id``: the id itself when the store takes it
    (1 to 256 characters), else ``"sha256:"`` and the id's hash.

    Raises:
        InvalidTypeError: ``session_id`` is not a string.
    """
    if not isinstance(session_id, str):
        raise InvalidTypeError(f"session_id must be a string, not {type(session_id).__name__}")
    try:
        session_id.encode("utf-8")
        fits = 0 < len(session_id) <= 256
    except UnicodeEncodeError:  # a lone surrogate: the store takes valid UTF-8 only
        fits = False
    if fits:
        return session_id
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
    return "sha256:" + digest


class FastmemSession(SessionABC):
    """An Agents SDK session whose items live in a fastmem store.

    Args:
        session_id: the conversation's id; any string (one longer than 256 characters is
            stored under its hash, see :func:`session_name`).
        store: an open :class:`fastmem.MemoryStore` (shared by many sessions; the caller
            closes it), or a store's path, opened here with ``open_options`` and closed by
            :meth:`close`.
        session_settings: ``SessionSettings`` (or its dict): ``limit`` is the number of
            newest items ``get_items()`` returns when it is given no ``limit``.
        namespace: with a path, the user's namespace under it (see :mod:`fastmem.namespaces`).
        **open_options: with a path, what ``fastmem.open`` takes (``embedder``, ``timeout``...).

    Raises:
        InvalidTypeError: ``session_id`` is not a string, or ``store`` is neither a store
            nor a path.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: fastmem.MemoryStore | str | os.PathLike[str],
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        namespace: str | None = None,
        **open_options: Any,
    ) -> None:
        self._name = session_name(session_id)
        self.session_id = session_id
        self.session_settings = _settings(session_settings)
        if isinstance(store, fastmem.MemoryStore):
            if namespace is not None or open_options:
                raise InvalidInputError("namespace and open options go with a path, not a store")
            self._store, self._owned = store, False
        elif isinstance(store, (str, os.PathLike)):
            self._store = fastmem.open(store, namespace=namespace, **open_options)
            self._owned = True
        else:
            raise InvalidTypeError(
                f"store must be a fastmem.MemoryStore or a path, not {type(store).__name__}"
            )
        self._closed = False

    @property
    def store(self) -> fastmem.MemoryStore:
        """The store the items are kept in (for :func:`memory_instructions`, searches...)."""
        return self._store

    @property
    def name(self) -> str:
        """The store's session name of this conversation (:func:`session_name`)."""
        return self._name

    # --- the Session interface ----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation's items, oldest first.

        Args:
            limit: the newest ``limit`` items only (still oldest first); ``None``: the
                session settings' limit, or every item. 0 gives none; a negative limit
                gives every item (as ``SQLiteSession``'s).

        Raises:
            InvalidTypeError: ``limit`` is not an int.
            StoreClosedError: the session or its store was closed.
        """
        self._check_open()
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidTypeError(f"limit must be an int or None, not {type(limit).__name__}")
        if limit == 0:
            return []
        wanted = None if limit is None or limit < 0 else limit
        items = await asyncio.to_thread(self._get_items, wanted)
        return cast("list[TResponseInputItem]", items)  # the SDK's item dicts, as written

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` to the conversation, in order, in one commit: every item is
        checked (a dict that JSON can encode) before anything is written.

        Raises:
            InvalidTypeError: ``items`` is not a list of dicts, or an item cannot be
                encoded as JSON (nothing is written).
            StoreClosedError: the session or its store was closed.
        """
        self._check_open()
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
            raise InvalidTypeError(f"items must be a list of dicts, not {type(items).__name__}")
        if not items:
            return
        records = await asyncio.to_thread(self._records, list(items))
        await _finish(asyncio.to_thread(self._store.add_many, records))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; ``None`` when the conversation is empty.

        Two processes popping one conversation at once never get the same item.

        Raises:
            StoreClosedError: the session or its store was closed.
        """
        self._check_open()
        item = await _finish(asyncio.to_thread(self._pop_item))
        return cast("TResponseInputItem | None", item)

    async def clear_session(self) -> None:
        """Remove every item of this conversation (other sessions and memories stay).

        Raises:
            StoreClosedError: the session or its store was closed.
        """
        self._check_open()
        await _finish(asyncio.to_thread(self._clear))

    def close(self) -> None:
        """Close the session (and the store, when the session opened it); idempotent."""
        self._closed = True
        if self._owned:
            self._store.close()

    def __repr__(self) -> str:
        return f"<FastmemSession {self.session_id!r} in {self._store.path!r}>"

    # --- the work, in a worker thread ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"FastmemSession {self.session_id!r} is closed")

    def _records(self, items: list[Any]) -> list[dict[str, Any]]:
        """The memories that hold ``items``, checked and encoded; one item is one memory
        unless its JSON is longer than ``CHUNK_BYTES``. The cycle collector is paused
        meanwhile (as the store's ``add_many`` pauses it): the records hold no cycles, yet
        a bulk add's thousands of dicts would trigger full collections (a third of the time)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._encode(items)
        finally:
            if enabled:
                gc.enable()

    def _encode(self, items: list[Any]) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidTypeError(f"items[{i}] must be a dict, not {type(item).__name__}")
            text, kind = render(item)
            size = _native_size(item, 1)
            if size is not None and size <= _NATIVE_BYTES:  # JSON can encode it: no need to try
                records.append({"text": text, "type": kind, "session": self._name,
                                "metadata": {METADATA_KEY: item}})  # fmt: skip
                continue
            first = {"text": text, "type": kind, "session": self._name}
            try:  # ASCII, as SQLiteSession writes it: a lone surrogate survives too
                encoded = json.dumps(item).encode("ascii")
            except (TypeError, ValueError) as exc:
                raise InvalidTypeError(f"items[{i}] cannot be encoded as JSON: {exc}") from None
            if len(encoded) <= CHUNK_BYTES:
                records.append({**first, "metadata": {METADATA_KEY: encoded.decode()}})
                continue
            key, parts = uuid.uuid4().hex, (len(encoded) + CHUNK_BYTES - 1) // CHUNK_BYTES
            for part in range(parts):
                chunk = encoded[part * CHUNK_BYTES : (part + 1) * CHUNK_BYTES]
                meta = {CHUNK_KEY: {"key": key, "part": part, "parts": parts, "chunk": chunk}}
                record = first if part == 0 else {
                    "text": _PART_TEXT, "type": _PART_TYPE, "session": self._name,
                    "importance": 0.0,
                }  # fmt: skip
                records.append({**record, "metadata": meta})
        return records

    def _get_items(self, limit: int | None) -> list[dict[str, Any]]:
        if limit is None:  # the common case, a runner's read of the whole history: no ids
            newest = self._store.recent(1 << 62, session=self._name)
            plain = [m.metadata.get(METADATA_KEY) if type(m.metadata) is dict else None
                     for m in reversed(newest)]  # fmt: skip
            if all(type(item) is dict for item in plain):
                return plain  # type: ignore[return-value]
        return [item for _, item in self._items_with_ids(limit)]

    def _items_with_ids(self, limit: int | None) -> list[tuple[list[str], dict[str, Any]]]:
        """The newest ``limit`` items (every item for ``None``), oldest first, each with the
        ids of the memories that hold it."""
        if limit is None:
            return _assemble(self._store.recent(1 << 62, session=self._name))
        window = limit
        while True:  # a chunked item takes several memories: widen until `limit` items are in
            newest = self._store.recent(window, session=self._name)
            items = _assemble(newest)
            if len(items) >= limit or len(newest) < window:
                return items[-limit:]
            window *= 2

    def _pop_item(self) -> dict[str, Any] | None:
        window = 8
        while True:
            newest = self._store.recent(window, session=self._name)
            found = _newest_item(newest)
            if found is None:
                if len(newest) < window:
                    return None
                window *= 2
                continue
            ids, item = found
            if item is None and len(newest) == window and ids[0] == newest[-1].id:
                window *= 2  # an incomplete item reaching the window's end: see all of it
                continue
            try:  # the claim: whoever forgets the item's first memory pops it
                self._store.forget(ids[0])
            except UnknownMemoryError:
                continue  # another process popped it meanwhile: look again
            for mid in ids[1:]:
                _forget_quietly(self._store, mid)
            if item is not None:
                return item
            # an item that cannot be read (left incomplete by a process killed while it
            # popped it, or damaged) is dropped, as SQLiteSession drops rows it cannot decode

    def _clear(self) -> None:
        ids = [m.id for m in self._store.recent(1 << 62, session=self._name) if _meta(m) is not None]
        try:
            self._store.forget_many(ids)  # one write and one erase pass for the whole session
        except UnknownMemoryError:  # another process forgot one meanwhile: one by one then
            for mid in ids:
                _forget_quietly(self._store, mid)


def _settings(value: Any) -> SessionSettings:
    """``SessionSettings`` from what ``SQLiteSession`` takes: ``None``, settings or a dict."""
    if value is None:
        return SessionSettings()
    if isinstance(value, SessionSettings):
        return value
    if isinstance(value, Mapping):
        return SessionSettings(**value)
    raise InvalidTypeError(
        f"session_settings must be SessionSettings or a dict, not {type(value).__name__}"
    )


# --- items and memories ---------------------------------------------------------------------


def render(item: Mapping[str, Any]) -> tuple[str, str]:
    """An item's readable line (the memory's text, what searches and contexts see) and the
    memory type it is stored as: ``conversation`` for messages, ``tool_result`` for tool
    calls and their outputs, ``agent_item`` for anything else (reasoning, compaction...)."""
    kind, role = item.get("type"), item.get("role")
    if isinstance(role, str) and kind in (None, "message"):
        text, memory_type = f"{role}: {_text_of(item.get('content'))}", "conversation"
    elif kind in ("function_call", "custom_tool_call"):
        args = item.get("arguments", item.get("input", ""))
        text, memory_type = f"tool call: {item.get('name', '')}({_text_of(args)})", "tool_result"
    elif isinstance(kind, str) and kind in _TOOL_TYPES:
        body = _text_of(item.get("output", item.get("action", item.get("arguments", ""))))
        text, memory_type = f"{kind.replace('_', ' ')}: {body}", "tool_result"
    else:
        body = _text_of(item.get("summary", item.get("content", item.get("text", ""))))
        text, memory_type = f"{kind if isinstance(kind, str) else 'item'}: {body}", "agent_item"
    text = text.strip() or "item"
    if text.isascii() and len(text) <= _MAX_TEXT_BYTES:  # the common case: nothing to fix
        return text, memory_type
    encoded = text.encode("utf-8", "replace")
    if len(encoded) > _MAX_TEXT_BYTES:
        text = encoded[:_MAX_TEXT_BYTES].decode("utf-8", "ignore") + " …"
    return text.encode("utf-8", "replace").decode("utf-8"), memory_type


def _text_of(value: Any) -> str:
    """The text in an item's content (a string, or a list of parts: texts are kept, an
    image or a file is named)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("text", "output", "refusal"):
            if isinstance(value.get(key), str):
                return value[key]
        part = value.get("type")
        return f"[{part}]" if isinstance(part, str) else json.dumps(value, default=str)[:2000]
    if isinstance(value, (list, tuple)):
        return " ".join(t for t in (_text_of(v) for v in value) if t)
    return "" if value is None else json.dumps(value, default=str)


def _meta(memory: fastmem.Memory) -> tuple[str, Any] | None:
    """What a memory holds of an item: ``("item", dict)``, ``("json", str)`` (a whole
    item), ``("chunk", dict)`` (``key``, ``part``, ``parts``, ``chunk``), or ``None``."""
    metadata = memory.metadata
    if type(metadata) is not dict:
        return None
    value = metadata.get(METADATA_KEY)
    if type(value) is dict:
        return "item", value
    if type(value) is str:
        return "json", value
    value = metadata.get(CHUNK_KEY)
    return ("chunk", value) if type(value) is dict else None


def _whole(meta: tuple[str, Any]) -> dict[str, Any] | None:
    """A whole item's dict (``None``: its JSON does not decode to one)."""
    return meta[1] if meta[0] == "item" else _decode(meta[1])


def _native_size(value: Any, depth: int) -> int | None:
    """A bound of the msgpack size of ``value`` when msgpack gives it back as a JSON round
    trip would: only dicts with str keys, lists, str, int within 64 bits, float, bool and
    None, nested less than ``_NATIVE_DEPTH`` deep; ``None`` otherwise (a tuple, which both
    give back as a list, goes the JSON way too: the check stays exact and simple)."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return len(value) + 5
        return 4 * len(value) + 5 if _utf8(value) else None
    if kind is dict:
        if depth >= _NATIVE_DEPTH:
            return None
        total = 5
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _utf8(k)):
                return None
            if type(v) is str and v.isascii():  # most values: no call for them
                total += 4 * len(k) + 10 + len(v)
                continue
            size = _native_size(v, depth + 1)
            if size is None:
                return None
            total += 4 * len(k) + 5 + size
        return total
    if kind is list:
        if depth >= _NATIVE_DEPTH:
            return None
        total = 5
        for v in value:
            size = _native_size(v, depth + 1)
            if size is None:
                return None
            total += size
        return total
    if kind is int:
        return 9 if -(1 << 63) <= value < (1 << 64) else None
    return 9 if kind is float or kind is bool or value is None else None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON escapes it, msgpack cannot hold it
        return False
    return True


def _assemble(newest: list[fastmem.Memory]) -> list[tuple[list[str], dict[str, Any]]]:
    """The complete items among memories given newest first, oldest first, each with its
    memories' ids. A memory that is no item, an item whose JSON does not decode, and the
    chunks of an incomplete item are skipped (``SQLiteSession`` skips rows it cannot decode)."""
    out: list[tuple[list[str], dict[str, Any]]] = []
    memories = list(reversed(newest))
    i = 0
    while i < len(memories):
        meta = _meta(memories[i])
        i += 1
        if meta is None:
            continue
        if meta[0] != "chunk":
            item = _whole(meta)
            if item is not None:
                out.append(([memories[i - 1].id], item))
            continue
        head = meta[1]
        parts = head.get("parts")
        if head.get("part") != 0 or not isinstance(parts, int):
            continue  # a chunk whose first memory is gone (or outside the window)
        group, chunks = [memories[i - 1].id], [head.get("chunk")]
        while len(group) < parts and i < len(memories):
            nxt = _meta(memories[i])
            if nxt is None or nxt[0] != "chunk" or nxt[1].get("key") != head.get("key") \
                    or nxt[1].get("part") != len(group):  # fmt: skip
                break
            group.append(memories[i].id)
            chunks.append(nxt[1].get("chunk"))
            i += 1
        if len(group) == parts and all(isinstance(c, bytes) for c in chunks):
            item = _decode(b"".join(chunks))
            if item is not None:
                out.append((group, item))
    return out


def _newest_item(newest: list[fastmem.Memory]) -> tuple[list[str], dict[str, Any] | None] | None:
    """The newest item among memories given newest first: the ids of its memories (first
    memory first) and the item, ``None`` when it cannot be read (incomplete, or its JSON
    does not decode); ``None`` when there is no item at all."""
    for i, memory in enumerate(newest):
        meta = _meta(memory)
        if meta is None:
            continue
        if meta[0] != "chunk":
            return [memory.id], _whole(meta)
        group = []
        for other in newest[i:]:  # the item's chunks, newest first
            other_meta = _meta(other)
            if other_meta is None or other_meta[0] != "chunk" \
                    or other_meta[1].get("key") != meta[1].get("key"):  # fmt: skip
                break
            group.append(other)
        assembled = _assemble(group)
        if assembled:
            return assembled[0]
        return [m.id for m in reversed(group)], None
    return None


def _decode(data: Any) -> dict[str, Any] | None:
    try:
        if isinstance(data, bytes):
            data = data.decode("ascii")
        item = json.loads(data)
    except (TypeError, ValueError):
        return None
    return item if isinstance(item, dict) else None


def _forget_quietly(store: fastmem.MemoryStore, mid: str) -> None:
    try:
        store.forget(mid)
    except UnknownMemoryError:  # forgotten meanwhile by another process: the same outcome
        pass


async def _finish(awaitable: Awaitable[_T]) -> _T:
    """Await a write to its end even when the caller is cancelled (then re-raise the
    cancellation): a write that has begun in its thread cannot be taken back."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


# --- dynamic instructions -------------------------------------------------------------------


def memory_instructions(
    store: fastmem.MemoryStore,
    instructions: str | Callable[[Any, Any], str | Awaitable[str]] = "",
    *,
    budget: int = 1300,
    session: FastmemSession | None = None,
    header: str = HEADER,
) -> Callable[[Any, Any], Awaitable[str]]:
    """Dynamic instructions (an ``Agent``'s ``instructions=``) that put fastmem's packed
    context for the latest user input in front of the agent's own instructions.

    Args:
        store: the store to recall from (often ``session.store``).
        instructions: the agent's own instructions: a string, or a function of
            ``(run_context, agent)`` as the SDK takes (sync or async).
        budget: tokens of the context (exact, ``cl100k_base``).
        session: the conversation being run: its items are already in the model's input,
            so they are left out of the context (and its memories rank a little higher).
        header: the line before the context.

    Returns:
        An async function of ``(run_context, agent)`` returning the instructions.
    """
    if not isinstance(store, fastmem.MemoryStore):
        raise InvalidTypeError(f"store must be a fastmem.MemoryStore, not {type(store).__name__}")
    if session is not None and not isinstance(session, FastmemSession):
        raise InvalidTypeError("session must be a FastmemSession")
    if not (isinstance(instructions, str) or callable(instructions)):
        raise InvalidTypeError("instructions must be a string or a function (context, agent)")

    async def instructions_with_memory(run_context: Any, agent: Any) -> str:
        own: Any = instructions
        if callable(own):
            own = own(run_context, agent)
            if isinstance(own, Awaitable):
                own = await own
        query = latest_user_text(getattr(run_context, "turn_input", None) or [])
        found = await asyncio.to_thread(_context_text, store, query, budget, session)
        if not found:
            return str(own or "")
        return f"{header}\n{found}\n\n{own}" if own else f"{header}\n{found}"

    return instructions_with_memory


def _context_text(
    store: fastmem.MemoryStore, query: str, budget: int, session: FastmemSession | None
) -> str:
    """The context's text, leaving out the memories of the items the model is shown anyway
    (the session's newest ``limit`` items, which the runner puts in its input)."""
    if session is None or session.store is not store:  # another store's ids mean nothing here
        return store.context(query, budget).text
    limit = session.session_settings.limit if session.session_settings else None
    shown = session._items_with_ids(None if limit is None or limit < 0 else limit)
    exclude = [mid for ids, _ in shown for mid in ids]
    return store.context(query, budget, session=session.name, exclude=exclude).text


def latest_user_text(items: Sequence[Any]) -> str:
    """The text of the last user message among Responses input items ("" when none)."""
    if isinstance(items, str):
        return items
    for item in reversed(items):
        if isinstance(item, Mapping) and item.get("role") == "user":
            return _text_of(item.get("content"))
    return ""

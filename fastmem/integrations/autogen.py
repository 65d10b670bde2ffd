"""fastmem as an AutoGen memory (``autogen_core.memory.Memory``, autogen-core 0.7.5).

Switch an agent from ``ListMemory`` or ``ChromaDBVectorMemory`` in one line::

    from fastmem.integrations.autogen import FastmemMemory

    memory = FastmemMemory("memories", namespace="alice")  # was: ListMemory()
    agent = AssistantAgent("assistant", model_client=client, memory=[memory])

Before each model call the agent calls :meth:`FastmemMemory.update_context`, which adds
fastmem's packed context for the latest user message (``MemoryStore.context``: pinned
memories, the newest ones, and the best matches of a hybrid search, fitted to ``budget``
tokens) to the model context as one ``SystemMessage``, as ``ListMemory`` adds its list.

Scoping: one namespace per user (``namespace=``): a user's memories live in their own
files under ``path`` and cannot enter another user's queries or contexts. ``session``
labels what this memory writes (its memories rank a little higher in contexts built
for that session); queries and contexts read the whole namespace, so a fact told in one
session is recalled in the next.

Every call that touches the store runs in a worker thread (``asyncio.to_thread``): the
event loop never waits on a search, a context, a write or the writer lock.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

import fastmem
from fastmem.errors import DependencyUnavailableError, InvalidInputError, InvalidTypeError
from fastmem.namespaces import check_namespace

try:
    from autogen_core import CancellationToken, Component, Image
    from autogen_core.memory import (
        Memory,
        MemoryContent,
        MemoryMimeType,
        MemoryQueryResult,
        UpdateContextResult,
    )
    from autogen_core.model_context import ChatCompletionContext
    from autogen_core.models import SystemMessage, UserMessage
    from pydantic import BaseModel
except ImportError as exc:  # pragma: no cover - the tests run with AutoGen installed
    raise DependencyUnavailableError(
        "fastmem.integrations.autogen needs AutoGen: pip install 'fastmem[autogen]'"
    ) from exc

__all__ = ["HEADER", "FastmemMemory", "FastmemMemoryConfig"]

# The SystemMessage's first line, as ListMemory's "Relevant memory content ..." line: the
# context's own headers (session and day) follow it.
HEADER = "Relevant memory content (fastmem):"
# MemoryContent mime types stored as text. JSON is stored as its JSON text and given back
# as a dict; images and binary data have no text to search or to show a model.
_TEXT_TYPES = (MemoryMimeType.TEXT.value, MemoryMimeType.MARKDOWN.value)
_JSON = MemoryMimeType.JSON.value
_MIME_KEY = "mime_type"  # where the content's mime type is kept in a memory's metadata
_QUERY_KEYWORDS = ("k", "types", "since", "until", "session", "mode")
MAX_MESSAGE_BYTES = 1 << 20  # fastmem's largest memory: a longer user message is cut to it


class FastmemMemoryConfig(BaseModel):
    """What :class:`FastmemMemory` is rebuilt from (``dump_component``/``load_component``)."""

    path: str
    """The store: a directory of namespaces when ``namespace`` is set, else a store's name."""
    namespace: str | None = None
    """The user's (or profile's) namespace under ``path``."""
    name: str | None = None
    """This memory's name, as ``ListMemory``'s."""
    session: str | None = None
    """The session written with every memory this instance adds."""
    budget: int = 1300
    """Tokens of the context ``update_context`` adds (exact, ``cl100k_base``)."""
    k: int = 5
    """Results a ``query`` returns unless it asks for another ``k``."""
    type: str = "fact"
    """The fastmem type of the memories ``add`` writes (facts rank high)."""
    remember_user_messages: bool = False
    """Also store the latest user message at each ``update_context`` (a conversation turn)."""


class FastmemMemory(Memory, Component[FastmemMemoryConfig]):
    """An AutoGen ``Memory`` kept in a fastmem store: persistent, shared by processes,
    searched by fastmem's hybrid ranking, and packed to a token budget for the model.

    Args:
        path: a directory of namespaces (with ``namespace``), or a store's name (its files
            are ``<path>.dat`` and ``<path>.idx``); or an open :class:`fastmem.MemoryStore`,
            which this memory uses and never closes.
        namespace: the user's namespace under ``path`` (see :mod:`fastmem.namespaces`).
        name: this memory's name (default ``"fastmem"``).
        session: a session label written with every memory this instance adds.
        budget: tokens of the context ``update_context`` adds, 1 to 1,000,000.
        k: results of a ``query`` (its ``k=`` keyword overrides it), 1 to 10,000.
        type: the fastmem type of what ``add`` writes (``"fact"``: ranks high).
        remember_user_messages: at each ``update_context``, also store the latest user
            message (type ``conversation``) if it is not the one stored last, so that what
            the user told the agent is remembered without an explicit ``add``. It is stored
            as ``"<source>: <text>"`` (``"user: ..."``), cut to 1 MiB of UTF-8.

    Raises:
        InvalidInputError: a value is out of range or a namespace is not valid.
        InvalidTypeError: a value has the wrong type.

    The store is opened at the first call (in a worker thread), not here.
    """

    component_type = "memory"
    component_config_schema = FastmemMemoryConfig
    component_provider_override = "fastmem.integrations.autogen.FastmemMemory"

    def __init__(
        self,
        path: str | os.PathLike[str] | fastmem.MemoryStore,
        *,
        namespace: str | None = None,
        name: str | None = None,
        session: str | None = None,
        budget: int = 1300,
        k: int = 5,
        type: str = "fact",
        remember_user_messages: bool = False,
    ) -> None:
        self._given: fastmem.MemoryStore | None = None
        if isinstance(path, fastmem.MemoryStore):
            if namespace is not None:
                raise InvalidInputError("namespace goes with a path, not with an open store")
            self._given, path = path, path.path
        elif not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(
                f"path must be a str, os.PathLike or MemoryStore, not {_type_name(path)}"
            )
        self._path = os.fspath(path)
        self._namespace = None if namespace is None else check_namespace(namespace)
        self._name = _optional_str(name, "name") or "fastmem"
        self._session = _optional_str(session, "session")
        self._budget = _int_in(budget, "budget", 1, 1_000_000)
        self._k = _int_in(k, "k", 1, 10_000)
        if not isinstance(type, str) or not type:
            raise InvalidTypeError("type must be a non-empty string")
        self._type = type
        if not isinstance(remember_user_messages, bool):
            raise InvalidTypeError("remember_user_messages must be True or False")
        self._remember = remember_user_messages
        self._store: fastmem.MemoryStore | None = self._given
        # A threading lock, not an asyncio one: an asyncio lock binds to the first loop that
        # waits on it, and sync callers run one loop per call (asyncio.run).
        self._opening = threading.Lock()
        self._last_remembered: str | None = None

    # --- AutoGen's interface -------------------------------------------------------------

    @property
    def name(self) -> str:
        """This memory's name."""
        return self._name

    async def add(
        self, content: MemoryContent, cancellation_token: CancellationToken | None = None
    ) -> None:
        """Store one ``MemoryContent`` as a memory.

        Text and Markdown are stored as they are, JSON (a dict) as its JSON text; the
        content's ``metadata`` is kept with it (msgpack types, at most 64 KiB) and its mime
        type under the metadata key ``mime_type``.

        Args:
            content: the memory; its text must be non-empty and at most 1 MiB of UTF-8.
            cancellation_token: a token cancelled before the write starts cancels it; once
                started, the write completes.

        Raises:
            InvalidInputError: empty or oversized text, a mime type fastmem cannot store
                (images, binary), or metadata that uses the key ``mime_type``.
            InvalidTypeError: ``content`` is not a ``MemoryContent``, or its content does not
                fit its mime type.
            asyncio.CancelledError: the token was cancelled before the write.
        """
        text, metadata = _to_record(content)
        _raise_if_cancelled(cancellation_token)
        store = await self._open()
        await asyncio.to_thread(
            store.add, text, type=self._type, session=self._session, metadata=metadata
        )

    async def query(
        self,
        query: str | MemoryContent = "",
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> MemoryQueryResult:
        """The memories that best match ``query`` (fastmem's hybrid search), best first.

        An empty query returns the ``k`` newest memories, oldest first (``ListMemory``'s
        chronological order). Each result's ``metadata`` is the metadata it was added with
        plus ``id`` (fastmem's id) and ``score`` (1 for the best hit of a search).

        Args:
            query: text, or a text, Markdown or JSON ``MemoryContent``.
            cancellation_token: cancels the wait for the results.
            **kwargs: ``k`` and the filters of ``MemoryStore.search``: ``types``,
                ``since``, ``until``, ``session``, ``mode``.

        Raises:
            InvalidInputError: an unknown keyword, or a value ``search`` refuses.
            InvalidTypeError: ``query`` is neither text nor a ``MemoryContent``.
        """
        text = _query_text(query)
        unknown = set(kwargs) - set(_QUERY_KEYWORDS)
        if unknown:
            raise InvalidInputError(
                f"unknown query keywords {sorted(unknown)}; known: {list(_QUERY_KEYWORDS)}"
            )
        k = kwargs.pop("k", self._k)
        _raise_if_cancelled(cancellation_token)
        store = await self._open()
        job = asyncio.ensure_future(asyncio.to_thread(_query, store, text, k, kwargs))
        if cancellation_token is not None:
            cancellation_token.link_future(job)
        return MemoryQueryResult(results=await job)

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        """Add fastmem's context for the latest user message to ``model_context``.

        The context (pinned memories, the newest ones and the best matches, packed to
        ``budget`` tokens) goes in as one ``SystemMessage`` starting with :data:`HEADER`;
        nothing is added when the store has nothing to say. With
        ``remember_user_messages``, the latest user message is stored first (and left out
        of the context: the model has it already).

        Raises:
            InvalidTypeError: ``model_context`` is not a ``ChatCompletionContext``.

        Returns:
            The memories used, one ``MemoryContent`` per line of the context: what was shown
            (full text, summary or excerpt) with ``id``, ``level``, ``score``, ``type``,
            ``session``, ``timestamp``, ``summary`` and ``excerpt`` in its metadata.
        """
        if not isinstance(model_context, ChatCompletionContext):
            raise InvalidTypeError(
                f"update_context takes a ChatCompletionContext, not {_type_name(model_context)}"
            )
        messages = await model_context.get_messages()
        source, latest = _latest_user_message(messages)
        store = await self._open()
        line = _cut(f"{source}: {latest.strip()}") if self._remember and latest.strip() else None
        if line == self._last_remembered:
            line = None  # the same message again (another agent's turn, a tool round)
        context, added = await asyncio.to_thread(
            _context, store, latest, self._budget, self._session, line
        )
        if line is not None:
            self._last_remembered = line
        if not context.text:
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        await model_context.add_message(SystemMessage(content=f"{HEADER}\n{context.text}"))
        results = [_shown(item) for item in context.items if item.id != added]
        return UpdateContextResult(memories=MemoryQueryResult(results=results))

    async def clear(self) -> None:
        """Forget every memory of this memory's store (its namespace), pinned ones too.

        Other adapters and processes using the same namespace lose them as well: the
        store is what a ``FastmemMemory`` reads from, so it is what ``clear`` empties.
        The space is given back by ``MemoryStore.compact()``.
        """
        store = await self._open()
        await asyncio.to_thread(_forget_all, store)

    async def close(self) -> None:
        """Close the store this memory opened (a store passed in stays open: its owner
        closes it); a later call opens it again, as ``ChromaDBVectorMemory`` does."""
        await asyncio.to_thread(self._close)

    # --- component configuration ---------------------------------------------------------

    def _to_config(self) -> FastmemMemoryConfig:
        return FastmemMemoryConfig(
            path=self._path, namespace=self._namespace, name=self._name, session=self._session,
            budget=self._budget, k=self._k, type=self._type,
            remember_user_messages=self._remember,
        )  # fmt: skip

    @classmethod
    def _from_config(cls, config: FastmemMemoryConfig) -> FastmemMemory:
        return cls(
            config.path, namespace=config.namespace, name=config.name, session=config.session,
            budget=config.budget, k=config.k, type=config.type,
            remember_user_messages=config.remember_user_messages,
        )  # fmt: skip

    # --- the store -----------------------------------------------------------------------

    @property
    def store(self) -> fastmem.MemoryStore | None:
        """The open store (``None`` before the first call and after ``close``)."""
        return self._store

    async def _open(self) -> fastmem.MemoryStore:
        store = self._store
        if store is not None:
            return store
        return await asyncio.to_thread(self._open_now)

    def _open_now(self) -> fastmem.MemoryStore:
        with self._opening:  # one open, however many calls wait for it
            if self._store is None:
                self._store = fastmem.open(self._path, namespace=self._namespace)
            return self._store

    def _close(self) -> None:
        with self._opening:
            store, self._store = self._store, self._given
        if store is not None and store is not self._given:
            store.close()


# --- translation between AutoGen's types and fastmem's (run in worker threads where slow) ---


def _to_record(content: object) -> tuple[str, dict[str, Any]]:
    """The text and metadata a ``MemoryContent`` is stored as; raises on what cannot be."""
    if not isinstance(content, MemoryContent):
        raise InvalidTypeError(f"add takes a MemoryContent, not {_type_name(content)}")
    mime = _mime(content.mime_type)
    metadata = dict(content.metadata or {})
    if _MIME_KEY in metadata:
        raise InvalidInputError(f"metadata key {_MIME_KEY!r} is fastmem's: use another name")
    value = content.content
    if mime == _JSON:
        if not isinstance(value, dict):
            raise InvalidTypeError(f"JSON content must be a dict, not {_type_name(value)}")
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"JSON content cannot be written as JSON: {exc}") from None
    elif mime in _TEXT_TYPES or mime.startswith("text/"):
        if not isinstance(value, str):
            raise InvalidTypeError(f"{mime} content must be a str, not {_type_name(value)}")
        text = value
    else:
        raise InvalidInputError(
            f"fastmem stores text: mime type {mime!r} is not supported (use text/plain, "
            f"text/markdown, another text/* type or application/json)"
        )
    metadata[_MIME_KEY] = mime
    return text, metadata


def _mime(mime_type: object) -> str:
    if isinstance(mime_type, MemoryMimeType):
        return mime_type.value
    if isinstance(mime_type, str):
        return mime_type
    raise InvalidTypeError(
        f"mime_type must be a MemoryMimeType or a str, not {_type_name(mime_type)}"
    )


def _query_text(query: object) -> str:
    if isinstance(query, str):
        return query
    if isinstance(query, MemoryContent):
        if isinstance(query.content, (Image, bytes)):
            raise InvalidInputError("fastmem searches text: an image or bytes cannot be a query")
        text, _ = _to_record(query)
        return text
    raise InvalidTypeError(f"query must be a str or a MemoryContent, not {_type_name(query)}")


def _query(
    store: fastmem.MemoryStore, text: str, k: Any, filters: dict[str, Any]
) -> list[MemoryContent]:
    if text.strip():
        hits = store.search(text, k, **filters)
        return [_to_content(h.memory, h.score) for h in hits]
    if filters:  # MemoryStore.recent has no filters: refuse rather than ignore them
        raise InvalidInputError(f"an empty query returns the newest memories: {sorted(filters)} "
                                f"need a query text")  # fmt: skip
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 10_000:
        raise InvalidInputError(f"k must be an int from 1 to 10000, got {k!r}")
    return [_to_content(m, None) for m in reversed(store.recent(k))]


def _to_content(memory: fastmem.Memory, score: float | None) -> MemoryContent:
    metadata = dict(memory.metadata or {})
    mime = metadata.pop(_MIME_KEY, MemoryMimeType.TEXT.value)
    content: Any = memory.text
    if mime == _JSON:
        try:
            content = json.loads(memory.text)
        except ValueError:  # written by something else under this mime type: give the text
            mime = MemoryMimeType.TEXT.value
    metadata["id"] = memory.id
    if score is not None:
        metadata["score"] = score
    try:
        mime_type: MemoryMimeType | str = MemoryMimeType(mime)
    except ValueError:
        mime_type = str(mime)
    return MemoryContent(content=content, mime_type=mime_type, metadata=metadata)


def _shown(item: fastmem.ContextItem) -> MemoryContent:
    """One line of a context as a MemoryContent: what the model was shown, and why."""
    metadata = {
        "id": item.id, "level": item.level.name.lower(), "score": item.score, "type": item.type,
        "session": item.session, "timestamp": item.timestamp, "summary": item.summary,
        "excerpt": item.excerpt,
    }  # fmt: skip
    return MemoryContent(content=item.text, mime_type=MemoryMimeType.TEXT, metadata=metadata)


def _context(
    store: fastmem.MemoryStore, query: str, budget: int, session: str | None, line: str | None
) -> tuple[fastmem.Context, str | None]:
    added = None if line is None else store.add(line, type="conversation", session=session)
    exclude = None if added is None else [added]  # the model has this message already
    context = store.context(query, budget, session=session, exclude=exclude)
    return context, added


def _forget_all(store: fastmem.MemoryStore) -> None:
    ids = [memory.id for memory in store]
    try:
        store.forget_many(ids)  # one write and one erase pass for the whole namespace
    except fastmem.UnknownMemoryError:  # another handle forgot one meanwhile: one by one then
        for mid in ids:
            try:
                store.forget(mid)
            except fastmem.UnknownMemoryError:
                pass


def _latest_user_message(messages: list[Any]) -> tuple[str, str]:
    """The source and text of the newest ``UserMessage`` (``("user", "")`` when there is
    none); of a message made of parts, its text parts joined (images have no text)."""
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            if isinstance(message.content, str):
                return message.source, message.content
            return message.source, "\n".join(p for p in message.content if isinstance(p, str))
    return "user", ""


def _cut(text: str) -> str:
    """``text`` within fastmem's largest memory (1 MiB of UTF-8): a pasted file is cut, not
    refused, so that the agent's turn goes on."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    return data[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore")


def _raise_if_cancelled(token: CancellationToken | None) -> None:
    if token is not None and token.is_cancelled():
        raise asyncio.CancelledError("cancelled before the call started")


def _optional_str(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a string or None, not {_type_name(value)}")
    return value


def _int_in(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{what} must be an int, not {_type_name(value)}")
    if not lo <= value <= hi:
        raise InvalidInputError(f"{what} must be from {lo} to {hi}, got {value}")
    return value


def _type_name(value: object) -> str:
    return type(value).__name__

"""fastmem as a LlamaIndex memory block (``llama_index.core.memory``, llama-index-core 0.14).

LlamaIndex's ``Memory`` keeps the recent chat in its chat store and, when that grows past
its token limit, flushes the oldest messages to its memory blocks; before each model call
it asks every block for content to put in front of the chat. :class:`FastmemMemoryBlock`
is such a block: it stores the flushed messages in a fastmem store (one memory per
message) and answers with fastmem's packed context for the current input (pinned
memories, the newest ones and the best matches of a hybrid search, within ``budget``
tokens). Plug it in with one line::

    from llama_index.core.memory import Memory
    from fastmem.integrations.llamaindex import FastmemMemoryBlock

    memory = Memory.from_defaults(
        session_id="chat-1",
        memory_blocks=[FastmemMemoryBlock(path="memories", namespace="alice")],
    )

Scoping: one namespace per user; ``Memory``'s ``session_id`` becomes each stored memory's
session (its memories rank a little higher in that session's contexts), and contexts
read the whole namespace, so what was said in one session is recalled in the next.

Every call that touches the store runs in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import fastmem
from fastmem.errors import DependencyUnavailableError, InvalidInputError, InvalidTypeError
from fastmem.namespaces import check_namespace

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
    from llama_index.core.bridge.pydantic import (
        Field,
        PrivateAttr,
        field_validator,
        model_validator,
    )
    from llama_index.core.memory import BaseMemoryBlock
except ImportError as exc:  # pragma: no cover - the tests run with LlamaIndex installed
    raise DependencyUnavailableError(
        "fastmem.integrations.llamaindex needs LlamaIndex: pip install 'fastmem[llamaindex]'"
    ) from exc

__all__ = ["MAX_MESSAGE_BYTES", "FastmemMemoryBlock"]

# fastmem's largest memory (1 MiB of UTF-8): a longer message is cut to it, not refused,
# because Memory has already archived it when it reaches the block.
MAX_MESSAGE_BYTES = 1 << 20
_TOOL_ROLES = (MessageRole.TOOL, MessageRole.FUNCTION)


class FastmemMemoryBlock(BaseMemoryBlock[str]):
    """A LlamaIndex memory block kept in a fastmem store.

    Args:
        name: the block's name in ``Memory``'s template (default ``"fastmem"``).
        path: a directory of namespaces (with ``namespace``), or a store's name (its
            files are ``<path>.dat`` and ``<path>.idx``).
        namespace: the user's namespace under ``path`` (see :mod:`fastmem.namespaces`).
        store: an open :class:`fastmem.MemoryStore` to use instead of ``path`` (the block
            never closes it).
        budget: tokens of the context the block returns, 1 to 1,000,000.
        type: the fastmem type of stored user and assistant messages (tool results are
            stored as ``tool_result``).
        priority: ``Memory``'s truncation order (0: never truncated; fastmem's context is
            already within ``budget``). When ``Memory`` truncates the block, it gets a
            context packed to fewer tokens rather than nothing.

    Raises:
        pydantic.ValidationError: a value is out of range, both or neither of ``path`` and
            ``store`` are given, or the namespace is not valid (a ``ValueError``).

    The store is opened at the first call (in a worker thread); :meth:`close` closes it.
    """

    name: str = Field(default="fastmem", description="The name of the memory block.")
    path: str | None = Field(default=None, description="The store's directory or name.")
    namespace: str | None = Field(default=None, description="The user's namespace.")
    store: Any = Field(default=None, exclude=True, description="An open MemoryStore.")
    budget: int = Field(default=1300, ge=1, le=1_000_000, description="Context tokens.")
    type: str = Field(default="conversation", min_length=1, description="Stored messages' type.")

    _opened: Any = PrivateAttr(default=None)  # the store this block opened itself
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _last: Any = PrivateAttr(default=None)  # (content, query, session) of the last _aget

    @field_validator("path", mode="before")
    @classmethod
    def _check_path(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"path must be a str or os.PathLike, not {type(value).__name__}")
        return None if value is None else os.fspath(value)

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str | None) -> str | None:
        return None if value is None else check_namespace(value)

    @field_validator("store")
    @classmethod
    def _check_store(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, fastmem.MemoryStore):
            raise ValueError(f"store must be a fastmem.MemoryStore, not {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _path_or_store(self) -> FastmemMemoryBlock:
        if (self.path is None) == (self.store is None):
            raise ValueError("give FastmemMemoryBlock a path or an open store, not both")
        if self.store is not None and self.namespace is not None:
            raise ValueError("namespace goes with a path, not with an open store")
        return self

    # --- BaseMemoryBlock -----------------------------------------------------------------

    async def _aget(
        self,
        messages: list[ChatMessage] | None = None,
        session_id: str | None = None,
        **block_kwargs: Any,
    ) -> str:
        """fastmem's context for the newest user message of ``messages`` ("" when the
        store has nothing to say); ``Memory`` passes its ``session_id``."""
        query = _latest_user_text(messages or [])
        store = await self._store()
        context = await asyncio.to_thread(store.context, query, self.budget, session=session_id)
        self._last = (context.text, query, session_id, context.tokens)
        return context.text

    async def aput(
        self,
        messages: list[ChatMessage],
        from_short_term_memory: bool = False,
        session_id: str | None = None,
    ) -> None:
        """``BaseMemoryBlock.aput`` (which writes ``session_id`` into each message before
        ``_aput``), after checking that ``messages`` is a list of ``ChatMessage``: a bad
        item raises fastmem's ``InvalidTypeError`` rather than an ``AttributeError``.

        Raises:
            InvalidTypeError: ``messages`` is not a list of ``ChatMessage`` (nothing written).
        """
        _check_messages(messages)
        await super().aput(messages, from_short_term_memory, session_id)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Store the messages ``Memory`` flushed, one memory per message (``role: text``),
        in order, in one write. Only text is kept (images, audio and tool-call parts have
        no text); a message with no text is skipped; the session is ``Memory``'s."""
        items = _to_items(messages, self.type)
        if not items:
            return
        store = await self._store()
        await asyncio.to_thread(store.add_many, items)

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """A context packed to ``tokens_to_truncate`` fewer tokens for the same input
        (``None`` when nothing would be left, or the content is not this block's latest)."""
        last = self._last
        if last is None or last[0] != content:
            return None
        _, query, session, tokens = last
        budget = tokens - max(int(tokens_to_truncate), 0)
        if budget < 1:
            return None
        store = await self._store()
        context = await asyncio.to_thread(store.context, query, budget, session=session)
        return context.text or None

    # --- the store -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store this block opened (one passed as ``store`` stays open); a later
        call opens it again."""
        with self._lock:
            opened, self._opened = self._opened, None
        if opened is not None:
            opened.close()

    async def aclose(self) -> None:
        """:meth:`close`, off the event loop."""
        await asyncio.to_thread(self.close)

    async def _store(self) -> fastmem.MemoryStore:
        store = self.store if self.store is not None else self._opened
        if store is not None:
            return store
        return await asyncio.to_thread(self._open)

    def _open(self) -> fastmem.MemoryStore:
        with self._lock:  # a threading lock: Memory's sync methods run their own loops
            if self._opened is None:
                assert self.path is not None  # the validator requires a path or a store
                self._opened = fastmem.open(self.path, namespace=self.namespace)
            return self._opened


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise InvalidTypeError(
            f"messages must be a list of ChatMessage, not {type(messages).__name__}"
        )
    for position, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            error = InvalidTypeError(
                f"messages[{position}] is a {type(message).__name__}, not a ChatMessage"
            )
            error.item = position
            raise error


def _to_items(messages: Any, type_: str) -> list[dict[str, Any]]:
    """The ``add_many`` items of flushed messages; checks them all before any write."""
    _check_messages(messages)
    items = []
    for position, message in enumerate(messages):
        text = "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock)).strip()
        if not text:
            continue
        role = message.role.value if isinstance(message.role, MessageRole) else str(message.role)
        line = _cut(f"{role}: {text}")
        session = message.additional_kwargs.get("session_id")
        if session is not None and not isinstance(session, str):
            raise InvalidInputError(f"messages[{position}]'s session_id must be a string")
        items.append({
            "text": line, "session": session, "metadata": {"role": role},
            "type": "tool_result" if message.role in _TOOL_ROLES else type_,
        })  # fmt: skip
    return items


def _cut(text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    return data[: MAX_MESSAGE_BYTES].decode("utf-8", "ignore")  # a split character is dropped


def _latest_user_text(messages: list[ChatMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ChatMessage) and message.role == MessageRole.USER:
            return "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock))
    return ""

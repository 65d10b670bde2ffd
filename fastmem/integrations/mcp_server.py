"""An MCP server over one fastmem store, on stdio: ``fastmem mcp --store PATH``.

Tools: ``remember``, ``search``, ``context``, ``forget``, ``pin``; the store's figures as
the resource ``fastmem://stats``. Built on the official ``mcp`` SDK (``pip install
'fastmem[mcp]'``): ``MCPServer`` in mcp 2.x, ``FastMCP`` in 1.x. This module imports
without the SDK; :func:`serve` and :func:`build_server` then raise
:class:`McpUnavailableError` with the install hint.

Any number of servers (one per MCP client), agents and ``fastmem`` commands can use one
store at once: each write takes the store's writer lock for its own few milliseconds, and
every call sees every write acknowledged before it, in any process. A write that waits
longer than ``timeout`` (``--timeout``, by default ``fastmem.LOCK_TIMEOUT``, 5 s: another
process's repair of a huge store, say) comes back as a tool error naming the process that
holds the lock. A bad argument (an unknown id, an empty text, k out of range) comes back as
a tool error with fastmem's message; it never stops the server.

An MCP client config (Claude Desktop, Cursor, ...)::

    {"mcpServers": {"fastmem": {"command": "fastmem",
                                "args": ["mcp", "--store", "/home/me/.fastmem/agent"]}}}
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..errors import EmbedderUnavailableError, FastmemError, McpUnavailableError
from ..export import memory_dict  # the same JSON shape as `fastmem export`

__all__ = ["McpUnavailableError", "build_server", "serve"]  # the error lives in fastmem.errors


def _sdk() -> tuple[Any, type[Exception]]:
    """The SDK's server class and its tool-error class, for mcp 2.x or 1.x (imported by
    name, so that type checking does not depend on which major version is installed)."""
    try:
        server = importlib.import_module("mcp.server.mcpserver")
        errors = importlib.import_module("mcp.server.mcpserver.exceptions")
        return server.MCPServer, errors.ToolError
    except ImportError:
        pass
    try:
        server = importlib.import_module("mcp.server.fastmcp")  # mcp 1.x
        errors = importlib.import_module("mcp.server.fastmcp.exceptions")
        return server.FastMCP, errors.ToolError
    except ImportError as exc:
        raise McpUnavailableError(
            f"the MCP server needs the official MCP SDK ({exc}): pip install 'fastmem[mcp]'"
        ) from None


def build_server(store: Any) -> Any:
    """An MCP server (the SDK's object, not started) whose tools work on ``store``, an open
    writable :class:`fastmem.MemoryStore`."""
    server_class, tool_error = _sdk()
    from .. import __version__
    import dataclasses

    server = server_class("fastmem", instructions=(
        "Long-term memory that survives restarts. Call `context` with the user's question "
        "before answering to get the memories that matter (within a token budget); "
        "`remember` facts, plans and results worth keeping; `pin` what the user asks you to "
        "remember always; `forget` what the user asks you to forget."
    ))  # fmt: skip

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a store call; fastmem's errors become tool errors the model can read."""
        try:
            return fn(*args, **kwargs)
        except (FastmemError, ValueError, TypeError) as exc:
            raise tool_error(" ".join(str(exc).split()) or type(exc).__name__) from None

    @server.tool()
    def remember(
        text: str,
        type: str = "conversation",  # noqa: A002 - the store's own keyword
        session: str | None = None,
        pinned: bool = False,
        importance: float | None = None,
        metadata: dict[str, Any] | None = None,
        supersedes: str | None = None,
    ) -> dict[str, Any]:
        """Store a memory: a fact, plan, tool result or conversation turn. Returns its id.

        type: conversation, tool_result, plan, fact, or a name of your own.
        pinned: true for something the user asked to always remember.
        importance: 0 to 1 (default: by type, fact highest).
        supersedes: the id of a memory this one replaces (a changed fact, a corrected
            figure): the old one is kept but contexts show this one in its place.
        """
        mid = call(store.add, text, type=type, session=session, pinned=pinned,
                   importance=importance, metadata=metadata, supersedes=supersedes)  # fmt: skip
        return {"id": mid}

    @server.tool()
    def search(query: str, k: int = 10, mode: str = "hybrid", session: str | None = None,
               types: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
        """The k memories that best match the query, best first.

        mode: hybrid (default), vector or keyword.
        types: only memories of these types (e.g. ["fact", "plan"]).
        """
        hits = call(store.search, query, k, mode=mode, session=session, types=types)
        return {"hits": [{"score": h.score, **memory_dict(h.memory)} for h in hits]}

    @server.tool()
    def context(query: str, budget: int = 1300, session: str | None = None) -> dict[str, Any]:
        """The memories that matter for the query, packed as text within `budget` tokens
        (exact tiktoken count): give `text` to the model."""
        ctx = call(store.context, query, budget, session=session)
        return {"text": ctx.text, "tokens": ctx.tokens, "budget": ctx.budget,
                "degraded": ctx.degraded, "ids": [item.id for item in ctx.items]}  # fmt: skip

    @server.tool()
    def forget(id: str) -> dict[str, Any]:  # noqa: A002 - the memory's id, as remember returns it
        """Forget a memory by id: it no longer appears in any search or context."""
        call(store.forget, id)
        return {"forgotten": id}

    @server.tool()
    def pin(id: str, pinned: bool = True) -> dict[str, Any]:  # noqa: A002
        """Pin a memory (kept in every context) or, with pinned=false, unpin it."""
        call(store.pin, id, pinned)
        return {"id": id, "pinned": pinned}

    @server.resource("fastmem://stats", name="stats", mime_type="application/json",
                     description="the store's figures: memories, types, sessions, sizes")  # fmt: skip
    def stats() -> str:
        import json

        return json.dumps({**dataclasses.asdict(store.stats()), "version": __version__})

    return server


def serve(
    path: str | os.PathLike[str], *, namespace: str | None = None, timeout: float | None = None
) -> None:
    """Open the store at ``path`` for writing and serve it over stdio until the client
    closes the connection; the store is closed (checkpointed) on the way out. ``timeout``
    is how long a write waits for another process's (the store's ``timeout=``; ``None``:
    its default).

    Raises:
        McpUnavailableError: the ``mcp`` package is not installed.
        StoreLockedError: another process held the store's writer lock for the whole
            timeout while the store was being opened (a repair or compaction, say).
    """
    import fastmem

    import sys

    _sdk()  # fail before opening (and perhaps creating) the store
    if isinstance(path, str) and path.startswith(("ray://", "ray+gcs://")):
        # A store served by a Ray cluster (fastmem[ray]; imported by name: only when asked for).
        remote = importlib.import_module("fastmem.ray").open_location(path, namespace=namespace)
        build_server(remote).run("stdio")
        return
    waits: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    try:
        store = fastmem.open(path, namespace=namespace, **waits)
    except EmbedderUnavailableError as exc:
        # A server without the model still remembers and finds by keywords; say so on
        # stderr (stdout is the protocol's).
        sys.stderr.write(f"fastmem mcp: keyword search only: {' '.join(str(exc).split())}\n")
        store = fastmem.open(path, namespace=namespace, embedder=None, **waits)
    with store:
        build_server(store).run("stdio")

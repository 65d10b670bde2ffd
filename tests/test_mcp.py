"""The MCP server, driven by the official SDK's own client over stdio: ``python -m fastmem mcp
--store PATH`` runs as a real subprocess, as an MCP client (Claude Desktop, Cursor...) runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest

import fastmem

pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

# The fastmem being tested, for the server process (the venv may hold another copy).
SOURCE = os.path.dirname(os.path.dirname(fastmem.__file__))


@pytest.fixture(autouse=True)
def backend():
    """The MCP server exercises no kernel: one run, on the default kernels (the compiled
    ones when built; its process uses them anyway), not one per backend as
    tests/conftest.py's fixture would."""
    yield fastmem.BACKEND


def _params(path: str, *options: str) -> StdioServerParameters:
    env = {"PYTHONPATH": SOURCE, "FASTMEM_EMBEDDER": "none"}
    return StdioServerParameters(command=sys.executable, args=["-m", "fastmem", "mcp", "--store", path,
                                                               *options], env=env)  # fmt: skip


def _payload(result: Any) -> Any:
    """A tool result's JSON: the structured content when the SDK gives it, else the text."""
    structured = getattr(result, "structured_content", None)
    if structured is None:
        structured = getattr(result, "structuredContent", None)
    if structured is not None:
        return structured
    return json.loads(result.content[0].text)


def _is_error(result: Any) -> bool:
    value = getattr(result, "is_error", None)
    return bool(getattr(result, "isError", False) if value is None else value)


async def _session(path: str, work: Any, *options: str) -> Any:
    async with stdio_client(_params(path, *options)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)


def run(path: str, work: Any) -> Any:
    return asyncio.run(asyncio.wait_for(_session(path, work), 60))


def test_tools_resource_errors_and_persistence(tmp_path):
    path = str(tmp_path / "mem")

    async def first(session: ClientSession) -> dict[str, Any]:
        tools = {t.name for t in (await session.list_tools()).tools}
        assert tools >= {"remember", "search", "context", "forget", "pin"}
        out: dict[str, Any] = {}
        r = await session.call_tool("remember", {"text": "The user's cat is called Miso.", "type": "fact"})
        assert not _is_error(r), r
        out["cat"] = _payload(r)["id"]
        r = await session.call_tool("remember", {"text": "Book the dentist for Tuesday.", "type": "plan",
                                                 "session": "s1", "metadata": {"source": "chat"}})
        out["plan"] = _payload(r)["id"]
        r = await session.call_tool("remember", {"text": "Temporary note about parking."})
        out["tmp"] = _payload(r)["id"]
        assert len({out["cat"], out["plan"], out["tmp"]}) == 3

        hits = _payload(await session.call_tool("search", {"query": "cat", "mode": "keyword"}))["hits"]
        assert [h["id"] for h in hits] == [out["cat"]]
        assert hits[0]["text"] == "The user's cat is called Miso." and hits[0]["type"] == "fact"
        r = await session.call_tool("search", {"query": "cat", "mode": "keyword", "types": ["plan"]})
        assert _payload(r)["hits"] == []

        r = _payload(await session.call_tool("pin", {"id": out["plan"]}))
        assert r == {"id": out["plan"], "pinned": True}
        r = _payload(await session.call_tool("forget", {"id": out["tmp"]}))
        assert r == {"forgotten": out["tmp"]}

        ctx = _payload(await session.call_tool("context", {"query": "What is the cat's name?", "budget": 200}))
        assert "Miso" in ctx["text"] and "parking" not in ctx["text"]
        assert 0 < ctx["tokens"] <= 200 and out["cat"] in ctx["ids"]

        resources = (await session.list_resources()).resources
        assert "fastmem://stats" in {str(r.uri) for r in resources}
        read = await session.read_resource("fastmem://stats")
        stats = json.loads(read.contents[0].text)
        assert stats["memories"] == 2 and stats["forgotten"] == 1 and stats["pinned"] == 1
        assert stats["types"] == {"fact": 1, "plan": 1}

        # Bad arguments: tool errors with fastmem's message; the server keeps serving.
        bad = [
            ("forget", {"id": out["tmp"]}, "never added, or forgotten"),
            ("pin", {"id": "nonsense"}, "no memory has the id"),
            ("remember", {"text": "   "}, "text is empty"),
            ("remember", {"text": "x", "importance": 7}, "importance"),
            ("search", {"query": "cat", "k": 0}, "k must be"),
            ("search", {"query": "cat", "mode": "psychic"}, "mode must be"),
            ("context", {"query": "cat", "budget": -5}, "budget"),
        ]
        for name, args, message in bad:
            r = await session.call_tool(name, args)
            assert _is_error(r), (name, args)
            assert message in r.content[0].text, (name, r.content[0].text)
        r = await session.call_tool("remember", {"text": 42})  # schema: text must be a string
        assert _is_error(r)
        assert len(_payload(await session.call_tool("search", {"query": "dentist", "mode": "keyword"}))["hits"]) == 1
        return out

    ids = run(path, first)

    # A new server process over the same files: everything is still there.
    async def second(session: ClientSession) -> None:
        hits = _payload(await session.call_tool("search", {"query": "dentist Tuesday", "mode": "keyword"}))["hits"]
        assert [h["id"] for h in hits] == [ids["plan"]]
        assert hits[0]["pinned"] is True and hits[0]["metadata"] == {"source": "chat"}
        assert hits[0]["session"] == "s1"
        stats = json.loads((await session.read_resource("fastmem://stats")).contents[0].text)
        assert stats["memories"] == 2

    run(path, second)
    with fastmem.open(path, readonly=True) as store:
        assert {m.id for m in store} == {ids["cat"], ids["plan"]}


def test_remember_supersedes_an_older_memory(tmp_path):
    async def work(session: ClientSession) -> None:
        old = _payload(await session.call_tool("remember", {"text": "The user lives in Paris.", "type": "fact"}))["id"]
        r = await session.call_tool("remember", {"text": "The user moved to Berlin.", "type": "fact",
                                                 "supersedes": old})  # fmt: skip
        assert not _is_error(r), r
        new = _payload(r)["id"]
        ctx = _payload(await session.call_tool("context", {"query": "user lives Paris", "budget": 200}))
        assert new in ctx["ids"] and old not in ctx["ids"] and "Paris" not in ctx["text"]
        hits = _payload(await session.call_tool("search", {"query": "Paris", "mode": "keyword"}))["hits"]
        assert [(h["id"], h["metadata"]) for h in hits] == [(old, {"superseded_by": new})]
        r = await session.call_tool("remember", {"text": "x", "supersedes": "m99"})
        assert _is_error(r) and "no memory has the id" in r.content[0].text

    run(str(tmp_path / "mem"), work)


def test_two_servers_on_one_store_see_each_others_memories_at_once(tmp_path):
    """Issue 17: two MCP clients configured on one store (Claude Desktop and Cursor, say)
    each start a server; both write, and each finds the other's memory at once (before:
    the second server exited with "open for writing in another process")."""
    path = str(tmp_path / "mem")

    async def both() -> None:
        async with contextlib.AsyncExitStack() as stack:
            sessions = []
            for _ in range(2):
                read, write = await stack.enter_async_context(stdio_client(_params(path)))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                sessions.append(session)
            a, b = sessions
            r = await a.call_tool("remember", {"text": "The user's cat is called Miso.", "type": "fact"})
            assert not _is_error(r), r
            cat = _payload(r)["id"]
            r = await b.call_tool("remember", {"text": "The user's dog is called Rex.", "type": "fact"})
            assert not _is_error(r), r
            dog = _payload(r)["id"]
            assert cat != dog
            # No sleep, no retry: each server's next call sees the other's write.
            hits = _payload(await b.call_tool("search", {"query": "cat Miso", "mode": "keyword"}))["hits"]
            assert [h["id"] for h in hits] == [cat]
            hits = _payload(await a.call_tool("search", {"query": "dog Rex", "mode": "keyword"}))["hits"]
            assert [h["id"] for h in hits] == [dog]
            ctx = _payload(await a.call_tool("context", {"query": "What are the pets called?", "budget": 200}))
            assert "Miso" in ctx["text"] and "Rex" in ctx["text"]
            r = _payload(await b.call_tool("forget", {"id": cat}))  # one server forgets the other's
            assert r == {"forgotten": cat}
            assert _payload(await a.call_tool("search", {"query": "cat Miso", "mode": "keyword"}))["hits"] == []
            stats = json.loads((await a.read_resource("fastmem://stats")).contents[0].text)
            assert stats["memories"] == 1 and stats["forgotten"] == 1

    asyncio.run(asyncio.wait_for(both(), 60))
    with fastmem.open(path, readonly=True) as store:
        assert [m.text for m in store] == ["The user's dog is called Rex."]
        assert store.verify().ok


def test_a_write_that_waits_too_long_is_a_tool_error_naming_the_holder(tmp_path):
    """A lock held past --timeout (a helper process holds the data file's flock, as a long
    repair would) while a server runs: the write fails with a tool error naming that
    process, reads go on, and the server writes again once the lock is free."""
    path = str(tmp_path / "mem")
    with fastmem.open(path) as store:
        store.add("The user's cat is called Miso.")

    async def work(session: ClientSession) -> None:
        # The server has the store open; then the lock is taken (a server's open, too, needs
        # the lock for a moment: started beside a longer hold, it would exit with code 3).
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                                   "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
                                   path + ".dat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        try:
            r = await session.call_tool("remember", {"text": "Written while locked."})
            assert _is_error(r)
            message = r.content[0].text
            assert "locked for writing" in message and f"process {holder.pid}" in message, message
            hits = _payload(await session.call_tool("search", {"query": "cat", "mode": "keyword"}))["hits"]
            assert [h["text"] for h in hits] == ["The user's cat is called Miso."]
        finally:
            assert holder.stdin is not None and holder.stdout is not None
            holder.stdin.close()
            holder.wait(10)
            holder.stdout.close()
        r = await session.call_tool("remember", {"text": "Written after."})
        assert not _is_error(r), r

    asyncio.run(asyncio.wait_for(_session(path, work, "--timeout", "0.2"), 60))
    with fastmem.open(path, readonly=True) as store:
        assert [m.text for m in store] == ["The user's cat is called Miso.", "Written after."]


def test_missing_sdk(tmp_path):
    """Without the SDK, the module still imports and serve() says what to install."""
    path = str(tmp_path / "mem")
    env = {**os.environ, "PYTHONPATH": SOURCE, "FASTMEM_EMBEDDER": "none"}
    code = (
        "import sys; sys.modules['mcp'] = None\n"  # an import of mcp now fails
        "from fastmem.integrations import mcp_server\n"
        "from fastmem.cli import main\n"
        f"sys.exit(main(['mcp', '--store', {path!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "pip install 'fastmem[mcp]'" in proc.stderr and "Traceback" not in proc.stderr

"""The MCP server, driven by the official SDK's own client over stdio: ``python -m fastmem mcp
--store PATH`` runs as a real subprocess, as an MCP client (Claude Desktop, Cursor...) runs it."""

from __future__ import annotations

import asyncio
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


def _params(path: str) -> StdioServerParameters:
    env = {"PYTHONPATH": SOURCE, "FASTMEM_EMBEDDER": "none"}
    return StdioServerParameters(command=sys.executable, args=["-m", "fastmem", "mcp", "--store", path],
                                 env=env)  # fmt: skip


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


async def _session(path: str, work: Any) -> Any:
    async with stdio_client(_params(path)) as (read, write):
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

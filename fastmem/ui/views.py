"""What each page of the inspector shows, read from a store through the public API only.

Plain functions from a :class:`fastmem.MemoryStore` (and the request's parameters) to
plain data the templates render; no web framework here, so the same facts are easy to
test. Nothing reads every memory: the timeline pages through ``recent(before=...)``, the
overview reads ``stats()`` (the index alone) and the newest few memories.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import fastmem
from fastmem import Context, ContextItem, Level, Memory, MemoryStore
from fastmem.export import SUPERSEDED_BY, to_jsonable
from fastmem.tokens import counter_for

__all__ = [
    "LEVELS",
    "ContextView",
    "Segment",
    "context_json",
    "context_view",
    "figures",
    "group_timeline",
    "memory_detail",
    "older_versions",
    "overview",
    "preview",
    "pulse",
    "search_view",
    "visible",
    "when",
]

# Level names as the pages show them, and the CSS class of each.
LEVELS = {
    Level.PINNED: ("pinned", "lv-pinned"),
    Level.RECENT: ("level 1", "lv-recent"),
    Level.FOUND: ("level 3", "lv-found"),
}
# C0 controls (but tab and line feed) and DEL show as their Unicode control pictures.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
METADATA_SHOWN = 200_000  # characters of a memory's metadata JSON shown in full
SUPERSEDES_HOPS = 20  # the most newer versions a memory's page follows
OLDER_SEARCHES = 5  # the most searches a memory's page makes for its older versions
OLDER_CANDIDATES = 50  # the hits each of those searches looks through
QUERY_CHARS = 2000  # of a newer version's text, searched for its older versions
SESSIONS_SHOWN = 12  # sessions on the overview, newest activity first


def visible(text: str) -> str:
    """``text`` with control characters as visible symbols (U+2400...): a memory holding
    an escape sequence or a NUL shows what it holds. HTML escaping is the templates' job."""
    return _CONTROL.sub(
        lambda m: "\u2421" if m.group() == "\x7f" else chr(0x2400 + ord(m.group())), text
    )


def preview(text: str, n: int = 240) -> str:
    """The first ``n`` characters of ``text`` on one line (whitespace collapsed), "…" if cut."""
    flat = " ".join(text[: n * 4].split())
    return visible(flat[:n] + ("…" if len(flat) > n or len(text) > n * 4 else ""))


def when(ts: float | None) -> str:
    """A timestamp as UTC date and time, ``-`` for none (or one out of range)."""
    if ts is None or not 0 <= ts < 253402300800:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def day(ts: float) -> str:
    """A timestamp's day (UTC) as the timeline's headers show it."""
    return time.strftime("%a %d %b %Y", time.gmtime(ts)) if 0 <= ts < 253402300800 else "(no date)"


# --- overview and live -----------------------------------------------------------------


def overview(store: MemoryStore) -> dict[str, Any]:
    """The overview page: the count and the newest memories (its figures, :func:`figures`,
    load after it: ``stats()`` reads six columns of every index row, a tenth of a second or
    more at a million memories)."""
    return {"memories": len(store), "newest": store.recent(8)}


def figures(store: MemoryStore, embedder: str) -> dict[str, Any]:
    """The overview's figures: ``stats()`` and ``sessions()`` (the index, and one record
    per session shown), the embedder and version."""
    stats = store.stats()
    return {
        "stats": stats,
        "embedder": embedder,
        "version": fastmem.__version__,
        "top_types": list(stats.types.items())[:12],
        "top_sessions": list(store.sessions(SESSIONS_SHOWN).items()),
    }


def pulse(store: MemoryStore, data_path: str) -> dict[str, Any]:
    """A cheap fingerprint of the store: the count, the newest memory, and the data file's
    size, which every write (an add, pin, update, forget, supersede; a compaction) changes,
    since each appends a record. What the pages poll to show other processes' writes."""
    newest = store.recent(1)
    try:
        size = os.path.getsize(data_path)
    except OSError:  # replaced at this instant (a compaction's rename): the next poll sees it
        size = None
    return {
        "memories": len(store),
        "newest": newest[0].id if newest else None,
        "newest_ts": newest[0].timestamp if newest else None,
        "data_bytes": size,
    }


# --- timeline --------------------------------------------------------------------------


def group_timeline(memories: list[Memory], previous: Memory | None = None) -> list[dict[str, Any]]:
    """Memories (newest first) with a header row wherever the day or the session changes;
    ``previous`` is the last memory of the page before (no header repeated across pages)."""
    out: list[dict[str, Any]] = []
    last = (day(previous.timestamp), previous.session) if previous is not None else None
    for m in memories:
        key = (day(m.timestamp), m.session)
        if key != last:
            out.append({"header": True, "day": key[0], "session": m.session})
            last = key
        out.append({"header": False, "memory": m})
    return out


# --- one memory ------------------------------------------------------------------------


def memory_detail(store: MemoryStore, mid: str) -> dict[str, Any]:
    """A memory in full: its fields, how it is stored and used (``info``), its metadata as
    JSON, and the newer versions that replace it (``superseded_by`` links, followed)."""
    memory = store.get(mid)
    info = store.info(mid)
    meta = None
    if memory.metadata is not None:
        meta = json.dumps(to_jsonable(memory.metadata), ensure_ascii=False, indent=2)
    chain: list[Memory] = []
    seen = {memory.id}
    link = (memory.metadata or {}).get(SUPERSEDED_BY)
    while isinstance(link, str) and link not in seen and len(chain) < SUPERSEDES_HOPS:
        seen.add(link)
        try:
            newer = store.get(link)
        except fastmem.UnknownMemoryError:  # forgotten since: the chain ends there
            break
        chain.append(newer)
        link = (newer.metadata or {}).get(SUPERSEDED_BY)
    return {
        "m": memory,
        "info": info,
        "meta": meta,
        "meta_cut": meta is not None and len(meta) > METADATA_SHOWN,
        "own_meta": json.dumps(
            to_jsonable({k: v for k, v in (memory.metadata or {}).items() if k != SUPERSEDED_BY}),
            ensure_ascii=False,
            indent=2,
        ),
        "chain": chain,
    }


def older_versions(store: MemoryStore, mid: str) -> list[Memory]:
    """The older versions memory ``mid`` replaces, newest first (each was superseded by the
    one before it in the list; ``mid`` replaced the first).

    The link is kept in the old memory's metadata only (``superseded_by``), so no index
    answers "which memory links here"; each step searches the store with the newer
    version's text (an older version of a fact is worded much like its replacement) and
    keeps the hit whose link names it. A version that is not among the nearest hits of its
    replacement's text is not found: the list ends there.
    """
    out: list[Memory] = []
    link, newer_text = mid, store.get(mid).text
    seen = {mid}
    for _ in range(OLDER_SEARCHES):
        hits = store.search(newer_text[:QUERY_CHARS], OLDER_CANDIDATES)
        by_link = {
            h.memory.metadata.get(SUPERSEDED_BY): h.memory
            for h in hits
            if isinstance(h.memory.metadata, dict)
        }
        found = False
        while (older := by_link.get(link)) is not None and older.id not in seen:
            seen.add(older.id)  # the hits may hold several steps of the chain
            out.append(older)
            link, newer_text, found = older.id, older.text, True
        if not found or len(out) >= SUPERSEDES_HOPS:
            break
    return out


# --- search ----------------------------------------------------------------------------


def search_view(
    store: MemoryStore,
    q: str,
    *,
    mode: str,
    k: int,
    types: list[str] | None,
    session: str | None,
    since: float | None,
    until: float | None,
) -> dict[str, Any]:
    """``store.search`` with the page's filters, and the time it took."""
    started = time.perf_counter()
    hits = store.search(
        q, k, mode=mode, types=types or None, session=session, since=since, until=until
    )
    return {"hits": hits, "ms": 1000 * (time.perf_counter() - started)}


# --- context: what the model would see -------------------------------------------------


@dataclass
class Segment:
    """A piece of ``Context.text`` in order: a header line, or one item's line."""

    text: str
    tokens: int
    item: ContextItem | None = None  # None: a header


@dataclass
class ContextView:
    """One context, taken apart for the page: the exact text as segments, the budget by
    level, and the candidates left out."""

    ctx: Context
    segments: list[Segment]
    by_level: dict[str, int]  # tokens of the items of each level, "headers" for the rest
    counts: dict[str, int]  # items of each level
    bar: list[tuple[str, str, float, int]]  # (label, css class, % of the budget, tokens)
    unplaced: list[ContextItem] = field(
        default_factory=list
    )  # items not found in the text (none expected)
    ms: float = 0.0  # what the page's call to context() took, as the page measured it


def context_view(store: MemoryStore, q: str, budget: int, session: str | None) -> ContextView:
    """``store.context(q, budget)`` and its parts: each line of the text in order with its
    item (level, tokens, reason, score parts) or as a header with its tokens."""
    started = time.perf_counter()
    ctx = store.context(q, budget, session=session)
    ms = 1000 * (time.perf_counter() - started)
    count = (
        store.tokens.count if ctx.encoding == store.tokens.name else counter_for(ctx.encoding).count
    )
    segments = _segments(ctx.text, ctx.items, count)
    placed = {id(s.item) for s in segments if s.item is not None}
    unplaced = [item for item in ctx.items if id(item) not in placed]
    by_level = {"pinned": 0, "level 1": 0, "level 3": 0}
    counts = dict.fromkeys(by_level, 0)
    for item in ctx.items:
        name = LEVELS[item.level][0]
        by_level[name] += item.tokens
        counts[name] += 1
    by_level["headers"] = max(0, ctx.tokens - sum(by_level.values()))
    bar = [
        (name, cls, 100.0 * by_level[name] / ctx.budget, by_level[name])
        for name, cls in (
            ("pinned", "lv-pinned"),
            ("level 1", "lv-recent"),
            ("level 3", "lv-found"),
            ("headers", "lv-header"),
        )
    ]
    return ContextView(ctx, segments, by_level, counts, bar, unplaced, ms)


def _segments(text: str, items: list[ContextItem], count: Any) -> list[Segment]:
    """``text`` cut into its lines in order: at each place, the longest item line that
    stands there whole (a memory may hold line breaks, or the text of a shorter memory),
    else one header line."""
    by_first: dict[str, list[ContextItem]] = {}
    for item in items:
        by_first.setdefault(item.line.split("\n", 1)[0], []).append(item)
    out: list[Segment] = []
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        best = None
        for item in by_first.get(text[pos:end], ()):
            stop = pos + len(item.line)
            whole = stop == len(text) or text[stop] == "\n"
            if (
                whole
                and text.startswith(item.line, pos)
                and (best is None or len(item.line) > len(best.line))
            ):
                best = item
        if best is not None:
            by_first[text[pos:end]].remove(best)
            out.append(Segment(best.line, best.tokens, best))
            pos += len(best.line) + 1
            continue
        if end > pos:
            out.append(Segment(text[pos:end], count(text[pos:end])))
        pos = end + 1
    return out


def context_json(view: ContextView) -> dict[str, Any]:
    """The context view as JSON: the same facts the page shows."""

    def item(i: ContextItem) -> dict[str, Any]:
        return {
            "id": i.id,
            "level": LEVELS[i.level][0],
            "tokens": i.tokens,
            "reason": i.reason,
            "score": i.score,
            "rank": i.rank,
            "vector": i.vector,
            "keyword": i.keyword,
            "summary": i.summary,
            "excerpt": i.excerpt,
            "line": i.line,
        }

    ctx = view.ctx
    return {
        "text": ctx.text,
        "tokens": ctx.tokens,
        "budget": ctx.budget,
        "encoding": ctx.encoding,
        "degraded": ctx.degraded,
        "seconds": ctx.seconds,
        "lines": [
            {
                "header": s.item is None,
                "tokens": s.tokens,
                "text": s.text,
                **({"item": item(s.item)} if s.item is not None else {}),
            }
            for s in view.segments
        ],
        "left_out": [item(i) for i in ctx.left_out],
    }

"""The context a model reads after a restart: the memories that matter, in a token budget.

``MemoryStore.context(query, budget)`` gathers candidates from the three levels (pinned
memories, the newest memories, and a hybrid search for the query), and this module packs
them: de-duplicated, pinned facts first, then in time order under one header per session
and day, full text where it fits and matters, summaries where they let more evidence in,
and never a token over the budget — the final text is counted exactly with tiktoken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._format import MAX_TIMESTAMP
from .errors import InvalidInputError
from .types import Context, ContextItem, Level

__all__ = ["pack", "render"]

@dataclass(slots=True)
class Candidate:
    """A memory the packer may use, best first within its level."""

    item: ContextItem
    tokens: int  # of ``item.text``, in the context's encoding
    priority: float  # higher goes in first
    alternative: tuple[str, int] | None = None  # (summary, tokens) to use if the text won't fit


PINNED_HEADER = "## Pinned"


def group_header(session: str | None, timestamp: float) -> str:
    """One header per session and day, so dates are not repeated on every line."""
    if not 0 <= timestamp <= MAX_TIMESTAMP:  # a damaged index row: no date rather than an error
        return f"## {session}" if session else "## (no date)"
    day = time.strftime("%d %b %Y", time.gmtime(timestamp)).lstrip("0")
    return f"## {session} · {day}" if session else f"## {day}"


def render(items: list[ContextItem]) -> str:
    """Pinned first (by score), then by time under session/day headers."""
    pinned = [i for i in items if i.level == 0]
    rest = sorted((i for i in items if i.level != 0), key=lambda i: (i.timestamp, i.id))
    lines: list[str] = []
    if pinned:
        lines.append(PINNED_HEADER)
        lines.extend(_line(i) for i in pinned)
    if rest:
        header = None
        for item in rest:
            h = group_header(item.session, item.timestamp)
            if h != header:
                lines.append(h)
                header = h
            lines.append(_line(item))
    return "\n".join(lines)


def _line(item: ContextItem) -> str:
    prefix = "" if item.type == "conversation" else f"[{item.type}] "
    return prefix + ("(summary) " if item.summary else "") + item.text


def pack(
    candidates: list[Candidate],
    budget: int,
    count: Callable[[str], int],
) -> tuple[str, int, list[ContextItem]]:
    """Choose and render candidates within ``budget`` tokens, exactly.

    Candidates go in by descending priority while the estimate (their stored token counts
    plus a line break and the headers they open) fits; a candidate whose text does not fit
    may go in as its summary. The rendered text is then counted exactly, and the
    lowest-priority items leave until it fits.

    Returns ``(text, tokens, items)``.
    """
    order = sorted(range(len(candidates)), key=lambda i: -candidates[i].priority)
    chosen: dict[int, ContextItem] = {}
    used = 0
    headers: set[str] = set()
    header_cost: dict[str, int] = {}
    for i in order:
        c = candidates[i]
        h = PINNED_HEADER if c.item.level == 0 else group_header(c.item.session, c.item.timestamp)
        extra = 0
        if h not in headers:
            if h not in header_cost:
                header_cost[h] = count(h) + 1
            extra = header_cost[h]
        prefix = 0 if c.item.type == "conversation" else 3
        if used + extra + c.tokens + 1 + prefix <= budget:
            chosen[i] = c.item
            used += extra + c.tokens + 1 + prefix
            headers.add(h)
        elif c.alternative is not None and used + extra + c.alternative[1] + 4 + prefix <= budget:
            chosen[i] = _as_summary(c.item, c.alternative[0])
            used += extra + c.alternative[1] + 4 + prefix
            headers.add(h)
    kept = sorted(chosen, key=lambda i: -candidates[i].priority)
    while True:
        items = [chosen[i] for i in kept]
        text = render(items)
        tokens = count(text) if text else 0
        if tokens <= budget:
            return text, tokens, items
        # The estimate was short (tokens merge differently across lines): drop the least.
        kept.pop()


def _as_summary(item: ContextItem, summary: str) -> ContextItem:
    return ContextItem(item.id, item.level, item.score, summary, True, item.timestamp,
                       item.session, item.type)  # fmt: skip


def new_context(
    text: str, tokens: int, budget: int, items: list[ContextItem], encoding: str,
    degraded: bool, started: float,
) -> Context:  # fmt: skip
    return Context(text, tokens, budget, items, encoding, degraded, time.perf_counter() - started)


def check_budget(budget: Any) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= 1_000_000:
        raise InvalidInputError(f"budget must be an int from 1 to 1000000 tokens, got {budget!r}")
    return budget

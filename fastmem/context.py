"""The context a model reads after a restart: the memories that matter, in a token budget.

``MemoryStore.context(query, budget)`` gathers candidates from the three levels (pinned
memories, the newest memories, and a hybrid search for the query), and this module packs
them: de-duplicated, pinned facts first, then in time order under one header per session
and day, full text where it fits and matters, summaries where they let more evidence in,
and never a token over the budget — the final text is counted exactly with tiktoken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._format import MAX_TIMESTAMP
from .errors import InvalidInputError

__all__ = ["Context", "ContextItem", "ContextPolicy", "pack"]

DAY = 86400.0


@dataclass(frozen=True)
class ContextPolicy:
    """How a store builds contexts and ranks memories; every field has a default.

    Level 1 (hot restore) is the newest ``recent`` memories, or those of the last
    ``recent_minutes``, or the whole last session (``recent_session``); they may take
    ``recent_share`` of a context's budget. Level 2 preloads the summaries of the
    ``preload`` most important memories in the background, ``preload_chunk`` at a time.
    Level 3 ranks ``candidates`` memories for the query; a hit's full text is read when its
    relevance (0 to 1, relative to the best hit) reaches ``full_text_score``, its summary
    otherwise. Pinned memories may take ``pinned_share`` of the budget.

    Ranking takes the ``candidates`` best memories by vector and by keyword (BM25) and the
    memories next to them in their sessions, adds the two scores as z-scores with their
    weights, smooths each with its neighbours' (``neighbour_weight``), lets a memory rank
    just below (``neighbour_gap``) a neighbour that matches strongly, and adds importance,
    recency and same-session bonuses with their weights.
    Importance is the memory's base importance (by type unless given) plus decayed access
    frequency, a recency bonus and a pin bonus.
    """

    recent: int = 4
    recent_minutes: float | None = None
    recent_session: bool = False
    recent_share: float = 0.08
    pinned_share: float = 0.3
    preload: int = 1000
    preload_chunk: int = 128
    candidates: int = 64
    full_text_score: float = 0.35
    vector_weight: float = 1.0
    keyword_weight: float = 0.3
    neighbour_weight: float = 0.3
    neighbour_gap: float = 1.0
    importance_weight: float = 0.1
    recency_weight: float = 0.05
    session_weight: float = 0.1
    near_duplicate: float = 0.97
    access_half_life_days: float = 30.0
    access_weight: float = 0.3
    recency_half_life_days: float = 7.0
    pin_bonus: float = 1.0
    type_importance: Mapping[str, float] = field(
        default_factory=lambda: {"fact": 0.9, "plan": 0.7, "tool_result": 0.5, "conversation": 0.3}
    )
    cache_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("recent", "preload", "preload_chunk", "candidates", "cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"ContextPolicy.{name} must be an int >= 0, got {value!r}")
        for name in ("recent_share", "pinned_share", "full_text_score", "near_duplicate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InvalidInputError(f"ContextPolicy.{name} must be from 0 to 1, got {value!r}")
        for name in ("vector_weight", "keyword_weight", "neighbour_weight", "neighbour_gap",
                     "importance_weight", "recency_weight", "session_weight", "access_weight",
                     "pin_bonus"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1e6:
                raise InvalidInputError(f"ContextPolicy.{name} must be >= 0, got {value!r}")
        for name in ("access_half_life_days", "recency_half_life_days"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value < 1e6:
                raise InvalidInputError(f"ContextPolicy.{name} must be > 0, got {value!r}")
        if self.recent_minutes is not None and not (
            isinstance(self.recent_minutes, (int, float)) and self.recent_minutes > 0
        ):
            raise InvalidInputError("ContextPolicy.recent_minutes must be > 0 or None")
        for name, value in self.type_importance.items():
            if not isinstance(name, str) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise InvalidInputError("ContextPolicy.type_importance maps type names to 0..1")


@dataclass(frozen=True, slots=True)
class ContextItem:
    """One memory in a context: which level brought it, its score and what was shown."""

    id: str
    level: int  # 0 pinned, 1 recent (hot restore), 3 found by search for the query
    score: float
    text: str  # the memory's full text, or its summary when ``summary`` is true
    summary: bool
    timestamp: float
    session: str | None
    type: str


@dataclass(frozen=True)
class Context:
    """What ``MemoryStore.context`` returns.

    ``text`` is what to give the model; ``tokens`` is its exact token count, never over the
    budget. ``degraded`` is true when the embedding model was not loaded yet and the
    context was built from keywords, recency and importance alone.
    """

    text: str
    tokens: int
    budget: int
    items: list[ContextItem]
    encoding: str
    degraded: bool = False
    seconds: float = 0.0

    @property
    def messages(self) -> list[dict[str, str]]:
        """The context as OpenAI chat messages (one system message; none when empty)."""
        if not self.text:
            return []
        return [{"role": "system", "content": self.text}]


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

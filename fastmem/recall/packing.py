"""The context a model reads after a restart: the levels, and the packer.

:func:`build` gathers candidates from the levels — pinned memories, level 1 (the newest
memories, :func:`level1_rows`) and level 3 (the ranked hits it is handed, a
:class:`~fastmem.recall.hits.Ranking`) — and packs them: de-duplicated, pinned facts
first, then in time order under one header per day (naming the session when several share
the day), full text where it fits and matters, summaries where they let more evidence in,
the passage of a long memory that matches the query (:func:`excerpt`) rather than the whole
of it, chosen by value per token, and never a token over the budget: the final text is
counted exactly with tiktoken. The packer calls nothing of the ranking
(:mod:`~fastmem.recall.query` runs one, then the other). Level 2 is
:mod:`~fastmem.recall.preload`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from itertools import islice

import numpy as np

from .. import _format as fmt
from .._stopwords import QUERY_STOP_WORDS
from ..storage.engine import Engine
from ..storage.index import (
    F_META,
    F_SESSION,
    F_SUMMARY_TOKENS,
    F_TEXT_TOKENS,
    F_TS,
    F_TYPE,
    MemoryIndex,
    session_hash,
)
from ..tokens import TokenCounter
from ..types import Context, ContextItem, ContextPolicy, Level
from .hits import SPEAKER, WORD, Ranked, Ranking, speaker_of
from .supersedes import newest

__all__ = ["build", "excerpt", "level1_rows", "pack", "pinned_rows", "render", "session_ids"]

# What a memory whose tokens were never counted (a store written before token counts) is
# taken to cost when the pinned and recent shares are filled: a summary's bound.
UNCOUNTED_TOKENS = 64
# Candidates are read until their tokens reach this many budgets: enough for the packer to
# choose from when some do not fit and short evidence ranked below long memories still
# wins by value per token (2 budgets: BEAM dev 0.50, 4: 0.58, 8: 0.62), and no more records
# decoded than that.
CANDIDATE_BUDGETS = 8
# The packer's estimate of what a line costs beyond its text: the line break, the
# "[type] " prefix of a memory that is not a conversation turn, and "(summary) ".
LINE_BREAK_TOKENS = 1
TYPE_PREFIX_TOKENS = 3
SUMMARY_MARK_TOKENS = 3
# Found memories up to this many tokens go in by relevance alone; a longer one's priority is
# scaled by (DENSITY_TOKENS / tokens) ** policy.length_penalty: value per token.
DENSITY_TOKENS = 64
EXCERPT_MARK = "(excerpt) "
ELLIPSIS = "…"

class Candidate:
    """A memory the packer may use, best first within its level. (A plain class: a
    dataclass compiles its generated methods at every import of fastmem.)"""

    __slots__ = ("alternative", "excerpt", "item", "priority", "tokens", "whole")

    def __init__(
        self,
        item: ContextItem,
        tokens: int,  # of ``item.text``, in the context's encoding
        priority: float,  # higher goes in first
        alternative: tuple[str, int] | None = None,  # (summary, tokens) if the text won't fit
        excerpt: Callable[[str], str | None] | None = None,  # the text is too long: its passage
        whole: bool = False,  # with ``excerpt``: the whole text (``tokens``) if it fits, else
        # the passage
    ) -> None:
        self.item, self.tokens, self.priority = item, tokens, priority
        self.alternative, self.excerpt, self.whole = alternative, excerpt, whole


PINNED_HEADER = "## Pinned"


def group_header(session: str | None, timestamp: float, named: bool = True) -> str:
    """One header per session and day, so dates are not repeated on every line; the
    session's name only when ``named`` (several sessions share the day in this context)."""
    if not 0 <= timestamp <= fmt.MAX_TIMESTAMP:  # a damaged index row: no date rather than an error
        return f"## {session}" if session else "## (no date)"
    day = time.strftime("%d %b %Y", time.gmtime(timestamp)).lstrip("0")
    return f"## {session} · {day}" if session and named else f"## {day}"


def _day(timestamp: float) -> int:
    return int(timestamp // 86400) if 0 <= timestamp <= fmt.MAX_TIMESTAMP else -1


def render(items: list[ContextItem]) -> str:
    """Pinned first (by score), then by time under session/day headers (a day's header
    names its session only when several sessions share that day)."""
    pinned = [i for i in items if i.level == Level.PINNED]
    rest = sorted((i for i in items if i.level != Level.PINNED), key=lambda i: (i.timestamp, int(i.id[1:])))
    sessions: dict[int, set[str | None]] = {}
    for item in rest:
        sessions.setdefault(_day(item.timestamp), set()).add(item.session)
    lines: list[str] = []
    if pinned:
        lines.append(PINNED_HEADER)
        lines.extend(_line(i) for i in pinned)
    if rest:
        header = None
        for item in rest:
            named = _day(item.timestamp) < 0 or len(sessions[_day(item.timestamp)]) > 1
            h = group_header(item.session, item.timestamp, named)
            if h != header:
                lines.append(h)
                header = h
            lines.append(_line(item))
    return "\n".join(lines)


def _line(item: ContextItem) -> str:
    return item.line  # "[type] (summary) text" (EXCERPT_MARK for an excerpt)


# --- excerpts -----------------------------------------------------------------------------

# A passage ends at . ! ? or … followed by a space, or at a line break.
_BREAK = re.compile(r"(?<=[.!?\u2026])\s+|\s*\n+\s*")


def _stem(word: str) -> str:
    """A crude stem, enough to match "deploy" with "deployment" and "tests" with "test"."""
    return word[:6] if len(word) > 6 else word.rstrip("s") or word


def query_stems(query: str) -> frozenset[str]:
    """The query's content words (question and function words left out), stemmed."""
    words = (w.lower() for w in WORD.findall(query))
    return frozenset(_stem(w) for w in words if w not in QUERY_STOP_WORDS and len(w) > 1)


def excerpt(text: str, terms: frozenset[str], max_tokens: int, count: Callable[[str], int],
            truncate: Callable[[str, int], str]) -> str | None:  # fmt: skip
    """The passage of ``text`` that best matches ``terms`` (:func:`query_stems`), within
    ``max_tokens`` tokens: the sentence or line holding the most of the query's words
    (those rare in ``text`` weigh more), grown with its neighbours while it fits, "…" where
    it was cut, the speaker prefix ("assistant: ") kept. ``None`` when no passage holds a
    query word (the caller shows a summary instead).

    >>> from fastmem.tokens import TokenCounter
    >>> c = TokenCounter()
    >>> excerpt("bob: Hi. The flat is in Berlin. Rent is 900 EUR. Bye.",
    ...         query_stems("what is the rent?"), 12, c.count, c.truncate)
    'bob: … Rent is 900 EUR. …'
    """
    spans, at = [], 0
    speaker = SPEAKER.match(text)
    head = speaker.group(0) if speaker else ""
    at = len(head)
    for m in _BREAK.finditer(text, at):
        if m.start() > at:
            spans.append((at, m.start()))
        at = max(at, m.end())
    if at < len(text):
        spans.append((at, len(text)))
    if not spans or not terms:
        return None
    words = [{_stem(w.lower()) for w in WORD.findall(text[a:b])} & terms for a, b in spans]
    df: dict[str, int] = {}
    for found in words:
        for t in found:
            df[t] = df.get(t, 0) + 1
    score = [sum(math.log(1.0 + len(spans) / df[t]) for t in found) for found in words]
    best = max(range(len(spans)), key=lambda i: (score[i], -i))
    if score[best] <= 0:
        return None
    cost = [count(text[a:b]) + 1 for a, b in spans]
    room = max_tokens - count(head) - 2 * count(ELLIPSIS) - 1
    lo = hi = best
    used = cost[best]
    while True:  # grow towards the better neighbour (ties: what follows) while it fits
        left = score[lo - 1] if lo > 0 and used + cost[lo - 1] <= room else None
        right = score[hi + 1] if hi + 1 < len(spans) and used + cost[hi + 1] <= room else None
        if left is None and right is None:
            break
        if right is not None and (left is None or right >= left):
            hi += 1
            used += cost[hi]
        else:
            lo -= 1
            used += cost[lo]
    body = text[spans[lo][0] : spans[hi][1]]
    before = ELLIPSIS + " " if lo > 0 else ""
    after = " " + ELLIPSIS if hi + 1 < len(spans) else ""
    out = head + before + body + after
    if count(out) > max_tokens:  # one passage longer than the room: its beginning
        out = truncate(head + before + body, max(0, max_tokens - count(ELLIPSIS) - 1)).rstrip() + " " + ELLIPSIS
        if count(out) > max_tokens:
            return None
    return out


def pack(
    candidates: list[Candidate],
    budget: int,
    count: Callable[[str], int],
) -> tuple[str, int, list[ContextItem], list[ContextItem]]:
    """Choose and render candidates within ``budget`` tokens, exactly.

    Candidates go in by descending priority while the estimate (their stored token counts
    plus a line break and the headers they open) fits; a candidate whose text does not fit
    may go in as its summary. A candidate with an ``excerpt`` function (a long memory: its
    ``tokens`` are the most its passage may take) is cut to its passage only when it is
    reached and could fit, so the passages of memories left out are never computed; one
    marked ``whole`` (the only match: its ``tokens`` are its whole text's) goes in whole when
    it fits and is cut to its passage otherwise. The rendered text is then counted exactly,
    and the lowest-priority items leave until it fits.

    Returns ``(text, tokens, items, left_out)``: each item with its line's exact ``tokens``
    and its ``reason``; ``left_out``, the best candidates that did not go in, each with why.
    """
    order = sorted(range(len(candidates)), key=lambda i: -candidates[i].priority)
    chosen: dict[int, ContextItem] = {}
    why_not: dict[int, str] = {}  # candidates left out: why (see Context.left_out)
    used = 0
    headers: set[str] = set()
    header_cost: dict[str, int] = {}
    for i in order:
        c = candidates[i]
        # The header as its group will show (the day alone) when no other session shares it.
        h = PINNED_HEADER if c.item.level == Level.PINNED else group_header(c.item.session, c.item.timestamp, False)
        extra = 0
        if h not in headers:
            if h not in header_cost:
                header_cost[h] = count(h) + LINE_BREAK_TOKENS
            extra = header_cost[h]
        line = LINE_BREAK_TOKENS + (0 if c.item.type == "conversation" else TYPE_PREFIX_TOKENS)
        if c.excerpt is not None and not (c.whole and used + extra + c.tokens + line <= budget):
            room = budget - used - extra - line - SUMMARY_MARK_TOKENS
            if not c.whole and room < min(c.tokens, c.alternative[1] if c.alternative else c.tokens):
                why_not[i] = f"did not fit: its passage or summary needs up to {c.tokens} tokens, {max(0, room)} left"
                continue
            shown = _cut(c, count)
            if shown is None:
                why_not[i] = "no passage of it matches the question, and it has no summary"
                continue
            c = shown
            line += SUMMARY_MARK_TOKENS
        if used + extra + c.tokens + line <= budget:
            chosen[i] = c.item
            used += extra + c.tokens + line
            headers.add(h)
        elif c.alternative is not None and used + extra + c.alternative[1] + SUMMARY_MARK_TOKENS + line <= budget:
            chosen[i] = _as_summary(c.item, c.alternative[0], f"its summary: the text's {c.tokens} tokens did not fit")
            used += extra + c.alternative[1] + SUMMARY_MARK_TOKENS + line
            headers.add(h)
        else:
            why_not[i] = f"did not fit: needs {extra + c.tokens + line} tokens, {budget - used} were left at its turn"
    kept = sorted(chosen, key=lambda i: -candidates[i].priority)
    while True:
        items = [chosen[i] for i in kept]
        text = render(items)
        tokens = count(text) if text else 0
        if tokens <= budget:
            items = [dataclasses.replace(item, tokens=count(_line(item))) for item in items]
            return text, tokens, items, _left_out(candidates, order, chosen, kept, why_not)
        # The estimate was short (tokens merge differently across lines): drop the least.
        why_not[kept.pop()] = "left out when the whole text was counted exactly: it came to more than the budget"


def _left_out(candidates: list[Candidate], order: list[int], chosen: dict[int, ContextItem],
              kept: list[int], why_not: dict[int, str]) -> list[ContextItem]:  # fmt: skip
    """The best candidates that did not go in (at most ``Context.LEFT_OUT``), each with
    the tokens of its text and the reason it stayed out."""
    went_in = set(kept)
    out = []
    for i in order:
        if i in went_in:
            continue
        c = candidates[i]
        item = chosen.get(i, c.item)
        why = why_not.get(i, "did not fit")
        out.append(dataclasses.replace(item, tokens=c.tokens, reason=f"{why} ({c.item.reason})"))
        if len(out) == Context.LEFT_OUT:
            break
    return out


def _cut(c: Candidate, count: Callable[[str], int]) -> Candidate | None:
    """A long memory's candidate as its passage, else its summary, else ``None``."""
    passage = c.excerpt(c.item.text) if c.excerpt is not None else None
    if passage is not None:
        return Candidate(_as_excerpt(c.item, passage), count(passage), c.priority, c.alternative)
    if c.alternative is not None:
        return Candidate(_as_summary(c.item, c.alternative[0]), c.alternative[1], c.priority)
    return None


def _as_summary(item: ContextItem, summary: str, why: str = "") -> ContextItem:
    reason = f"{item.reason}; {why}" if why else item.reason
    return dataclasses.replace(item, text=summary, summary=True, excerpt=False, reason=reason)


def _as_excerpt(item: ContextItem, passage: str) -> ContextItem:
    return dataclasses.replace(item, text=passage, summary=False, excerpt=True)


# --- the levels ---------------------------------------------------------------------------


def pinned_rows(index: MemoryIndex) -> list[int]:
    """Pinned live memories, most important first (ties: the older row); kept on the
    index until a pin or forget changes them."""
    if index.pinned is None:
        pinned, importance = [], []
        for first, rows, _ in index.segments():
            flags = rows["flags"]
            hit = np.nonzero((flags & fmt.FLAG_PINNED != 0) & (flags & fmt.FLAG_FORGOTTEN == 0))[0]
            pinned.append(hit + first)
            importance.append(rows["importance"][hit])
        found: list[int] = []
        if pinned:
            all_rows = np.concatenate(pinned)
            found = all_rows[np.lexsort((all_rows, -np.concatenate(importance)))].tolist()
        index.pinned = found
    return index.pinned


def level1_rows(index: MemoryIndex, policy: ContextPolicy) -> list[int]:
    """Level 1, newest first: the last ``recent`` memories, or those of the last
    ``recent_minutes``, or the whole last session (policy)."""
    newest = index.by_time(newest_first=True)
    if policy.recent_session:
        out: list[int] = []
        last = None
        for g in newest:
            row = index.row(g)
            if last is None:
                last = row[F_SESSION]
            elif row[F_SESSION] != last:
                break
            out.append(g)
        return out
    if policy.recent_minutes is not None:
        out, since = [], None
        for g in newest:
            ts = index.row(g)[F_TS]
            since = ts - policy.recent_minutes * 60 if since is None else since
            if ts < since:
                break
            out.append(g)
        return out
    return list(islice(newest, policy.recent))


def session_ids(index: MemoryIndex, session: str, below: int) -> list[int]:
    """The ids of the live memories of ``session`` below ``below``, newest first (by the
    64-bit hash the index keeps of the name: the caller checks each memory's own). By id,
    not timestamp: ids grow with every commit in every process (they are given under the
    writer lock), while a timestamp is its writer's clock when the write began, so two
    processes writing one session (or a clock step) put timestamps out of the order of the
    writes, and a conversation's log (an agent framework's session) must come back in it."""
    wanted, ids = session_hash(session), []
    for _, seg, _ in index.segments():  # three columns scanned: no record is read
        keep = (seg["session"] == wanted) & (seg["flags"] & fmt.FLAG_FORGOTTEN == 0)
        ids.append(seg["id"][keep & (seg["id"] < below)])
    return np.sort(np.concatenate(ids))[::-1].tolist() if ids else []


def _level_priority(level: Level, position: int) -> float:
    """Pinned, then recent memories go in before any search hit (whose priority is its
    relevance, at most 1), each level in its own order."""
    return 3.0 - level - position * 1e-6


def about_now(index: MemoryIndex, recent: list[int], ranked: list[Ranked], query: str,
              session: str | None, policy: ContextPolicy) -> bool:  # fmt: skip
    """Whether level 1 takes budget: no query (a hot restore), ``recent_always``, the
    caller's ``session`` is the newest memories' session, or the best match is one of the
    newest memories. A question whose best matches are old gets no level 1."""
    if not query.strip() or policy.recent_always:
        return True
    if not recent:
        return False
    if session and index.row(recent[0])[F_SESSION] == session_hash(session):
        return True
    return bool(ranked) and ranked[0].row in recent


def build(
    engine: Engine, policy: ContextPolicy, ranking: Ranking, *, budget: int,
    counter: TokenCounter, stored_counts: bool, exclude: set[int], query: str = "",
    session: str | None = None, allowed: np.ndarray | None = None,
) -> tuple[str, int, list[ContextItem], list[ContextItem]]:  # fmt: skip
    """The context from the three levels: pinned memories (up to ``pinned_share`` of the
    budget), level 1 (up to ``recent_share``, when :func:`about_now`) and the ranked search
    hits for ``query``, never the rows of ``exclude`` (nor, with ``allowed``, a type mask as
    :func:`~fastmem.recall.ranking.type_mask` makes, pinned or newest rows of other types); packed into ``budget`` tokens of
    ``counter``'s encoding. Returns ``(text, tokens, items, left_out)`` (see :func:`pack`)."""
    index = engine.index
    ranked = ranking.hits
    levels: dict[int, tuple[Level, float]] = {}  # row -> (level, priority)
    share = {Level.PINNED: policy.pinned_share * budget, Level.RECENT: policy.recent_share * budget}
    spent = {Level.PINNED: 0.0, Level.RECENT: 0.0}
    recent = level1_rows(index, policy)
    if not about_now(index, recent, ranked, query, session, policy):
        recent = []
    for level, rows in ((Level.PINNED, pinned_rows(index)), (Level.RECENT, recent)):
        for i, g in enumerate(rows):
            row = index.row(g)
            cost = row[F_TEXT_TOKENS] if row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS else UNCOUNTED_TOKENS
            if g in levels or g in exclude or spent[level] + cost > share[level] or (
                allowed is not None and not allowed[row[F_TYPE]]
            ):
                continue
            spent[level] += cost
            levels[g] = (level, _level_priority(level, i))
    scores = {}
    parts: dict[int, tuple[int, float | None, float]] = {}  # row -> (rank, cosine, BM25)
    for place, hit in enumerate(ranked, 1):
        scores[hit.row] = hit.relevance
        parts[hit.row] = (place, hit.cosine, hit.keyword)
        if hit.row not in levels and hit.row not in exclude:
            levels[hit.row] = (Level.FOUND, hit.relevance)
    candidates = _candidates(engine, policy, levels, scores, counter, stored_counts, budget,
                             query_stems(query), ranking.focus, ranking.sole, exclude, parts,
                             ranking.theirs)  # fmt: skip
    return pack(candidates, budget, counter.count)


def _candidates(
    engine: Engine, policy: ContextPolicy, levels: dict[int, tuple[Level, float]],
    scores: dict[int, float], counter: TokenCounter, stored_counts: bool, budget: int,
    terms: frozenset[str] = frozenset(), focus: frozenset[str] | None = None,
    sole: int = -1, exclude: set[int] | frozenset[int] = frozenset(),
    parts: dict[int, tuple[int, float | None, float]] | None = None,
    theirs: frozenset[int] | None = None,
) -> list[Candidate]:  # fmt: skip
    """Context candidates for rows, best first, near-duplicates left out (the better one
    stays). Reading stops once the candidates whose priority is at least the next row's
    relevance fill the budget (no later row can go in before them: a priority is at most
    the relevance), or after ``CANDIDATE_BUDGETS`` budgets of tokens.

    A found memory longer than ``item_share`` of the budget becomes its excerpt for
    ``terms`` (or its summary), unless it is the only match (the only found memory, or row
    ``sole``: :func:`~fastmem.recall.ranking.sole_match`), which goes in whole when it fits, by its
    relevance alone (it is what the query asks for), and as its excerpt otherwise. Other
    found memories' priorities are their value per token, and ``other_speaker`` times that for a turn of a speaker not in
    ``focus`` (:func:`~fastmem.recall.speakers.named_speakers`; see :class:`ContextPolicy`), and ``other_conversation``
    times that again when its session is not in ``theirs`` (:func:`~fastmem.recall.speakers.their_sessions`).

    A memory replaced by a newer one (``add``'s ``supersedes``) gives its place to the newest
    live version (:func:`~fastmem.recall.supersedes.newest`), which then goes in only once; when
    that version went in already or is in ``exclude``, the old one is left out."""
    import heapq  # here, not at import (with the helper thread's queue, open() loads it)

    index = engine.index
    order = sorted(levels, key=lambda g: -levels[g][1])
    vectors, has_vector = index.unit_vectors(np.array(order, dtype=np.int64))
    kept = np.zeros((len(order), vectors.shape[1]), dtype=np.float32)
    n_kept = 0
    seen_texts: set[str] = set()
    shown: set[int] = set()  # rows that went in
    out: list[Candidate] = []
    total = 0
    cap = int(policy.item_share * budget)
    found = sum(1 for level, _ in levels.values() if level == Level.FOUND)

    def cut(text: str) -> str | None:
        return excerpt(text, terms, cap, counter.count, counter.truncate)

    waiting: list[tuple[float, int]] = []  # (-priority, tokens) of candidates not yet ahead
    queued = 0  # candidates of ``out`` put in ``waiting``
    ahead = 0  # tokens of the candidates whose priority is at least the current relevance
    for j, g in enumerate(order):
        if total > CANDIDATE_BUDGETS * budget:
            break
        level, priority = levels[g]
        score, is_sole, vector, has = scores.get(g, 0.0), g == sole, vectors[j], has_vector[j]
        place, cosine, bm25 = (parts or {}).get(g, (0, None, None))
        why = [_why(level, place, score)]
        for done in out[queued:]:
            heapq.heappush(waiting, (-done.priority, done.tokens))
        queued = len(out)
        while waiting and -waiting[0][0] >= priority:
            ahead += heapq.heappop(waiting)[1]
        if ahead >= budget:
            break
        row = index.row(g)
        memory = engine.cached_memory(g)
        newer = newest(engine, g) if row[F_META] or memory.metadata is not None else None
        if newer is not None:  # the newest truth in the old one's place
            if newer in exclude:
                continue
            why.append(f"the newest version of {engine.cached_memory(g).id}, which ranked here")
            g, row, memory = newer, index.row(newer), engine.cached_memory(newer)
            one, flag = index.unit_vectors(np.array([g], dtype=np.int64))
            vector, has = one[0], flag[0]
        if g in shown:  # went in already (for an older version, or before its own)
            continue
        key = " ".join(memory.text.casefold().split())
        if key in seen_texts:
            continue
        if has:
            if (level == Level.FOUND and n_kept
                    and float((kept[:n_kept] @ vector).max()) >= policy.near_duplicate):  # fmt: skip
                continue
            kept[n_kept] = vector
            n_kept += 1
        shown.add(g)
        seen_texts.add(key)
        if stored_counts and row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS:
            text_tokens, summary_tokens = row[F_TEXT_TOKENS], row[F_SUMMARY_TOKENS]
        else:
            text_tokens = counter.count(memory.text)
            summary_tokens = counter.count(memory.summary) if memory.summary else 0
        summary = (memory.summary, summary_tokens) if memory.summary else None
        long = level == Level.FOUND and text_tokens > cap
        whole = long and (found == 1 or is_sole)
        if whole:
            why.append("the only match: whole if it fits")
        elif long:
            why.append(f"longer than {policy.item_share:.0%} of the budget: its passage that matches")
        if long and not whole:  # its passage (cut by the packer if it gets that far), at most ``cap``
            text_tokens = min(text_tokens, cap)
        if focus and level == Level.FOUND:
            speaker = speaker_of(memory)
            if speaker and speaker.group(0) not in focus:
                priority *= policy.other_speaker
                why.append(f"another speaker's turn than the question's (priority x{policy.other_speaker:g})")
                if theirs and int(row[F_SESSION]) not in theirs:
                    priority *= policy.other_conversation
                    why.append("from a conversation none of the question's speakers is in "
                               f"(priority x{policy.other_conversation:g})")
        if level == Level.FOUND and score < policy.full_text_score and summary is not None and not long:
            why.append(f"its summary: relevance below {policy.full_text_score:g}")
        item = ContextItem(memory.id, level, score, memory.text, False, memory.timestamp,
                           memory.session, memory.type, reason="; ".join(why), vector=cosine,
                           keyword=bm25, rank=place)  # fmt: skip
        if level == Level.FOUND and not is_sole and policy.length_penalty and text_tokens > DENSITY_TOKENS:
            priority *= (DENSITY_TOKENS / text_tokens) ** policy.length_penalty
        if long:
            out.append(Candidate(item, text_tokens, priority, summary, cut, whole))
            total += text_tokens
        elif summary is not None and level == Level.FOUND and score < policy.full_text_score:
            # Weakly related: its summary first (more evidence fits), its text if room.
            item = _as_summary(item, memory.summary or "")
            out.append(Candidate(item, summary_tokens, priority))
            total += summary_tokens
        else:
            out.append(Candidate(item, text_tokens, priority, summary))
            total += text_tokens
    return out


def _why(level: Level, place: int, relevance: float) -> str:
    """Why a memory is a candidate: its level, and its rank for the question if it has one."""
    ranked = f"#{place} for the question, relevance {relevance:.2f}" if place else ""
    if level == Level.PINNED:
        return "pinned: in every context" + (f" (also {ranked})" if ranked else "")
    if level == Level.RECENT:
        return "level 1: one of the newest memories" + (f" (also {ranked})" if ranked else "")
    return f"level 3: {ranked}"

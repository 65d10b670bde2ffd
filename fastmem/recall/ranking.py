"""Ranking: which memories match a query, as plain functions over an index.

Each function takes a :class:`~fastmem.storage.index.MemoryIndex` (and, where records are read,
the data file's map), a :class:`~fastmem.types.ContextPolicy` and the query; none opens a
file or takes a lock (the caller holds the store's), so the ranking can be tested and
tuned on a hand-built index:

- :func:`rank`: level 3, the hybrid ranking ``context()`` and ``search(mode="hybrid")``
  use: vector and keyword candidates, their neighbours, fused scores, bonuses;
- :func:`vector_search`: exact cosine top-k (an int8 scan, then float16 rescoring);
- :func:`keyword_search`: BM25 top-k.
"""

from __future__ import annotations

import math
import re
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import _format as fmt
from . import vector_search as _vsearch
from ..storage.index import F_OFFSET, MemoryIndex, session_hash
from .._stopwords import QUERY_STOP_WORDS
from .._threads import at_fork
from ..storage.vectors import quantize, to_float16
from ..embed import Embedder
from ..errors import CorruptIndexError, CorruptRecordError, EmbedderUnavailableError
from ..types import DAY, ContextPolicy
from .hits import Ranked

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "NO_FILTERS",
    "Filters",
    "Ranked",
    "content_words",
    "filters",
    "has_identifier",
    "identifiers",
    "inflected",
    "inflections",
    "keyword_search",
    "periods",
    "query_vector",
    "rank",
    "sole_match",
    "type_mask",
    "vector_search",
]  # fmt: skip



class Filters(NamedTuple):
    """What a search keeps: as the kernels take it (type mask, time range, session hash)."""

    allowed: np.ndarray | None
    since: float
    until: float
    session: int

    def mask(self, fields: dict[str, np.ndarray]) -> np.ndarray:
        """Which rows pass, from their fields (``MemoryIndex.gather``)."""
        ts = fields["timestamp"]
        keep = (fields["flags"] & fmt.FLAG_FORGOTTEN) == 0
        keep &= (ts >= self.since) & (ts <= self.until)  # a NaN timestamp fails both
        if self.session:
            keep &= fields["session"] == self.session
        if self.allowed is not None:
            keep &= self.allowed[fields["type"]].astype(bool)
        return keep

    def keeps(self, index: MemoryIndex, row: int) -> bool:
        """Whether row ``row`` passes."""
        rows = np.array([row], dtype=np.int64)
        return bool(self.mask(index.gather(rows, ("flags", "timestamp", "session", "type")))[0])


NO_FILTERS = Filters(None, -math.inf, math.inf, 0)


def type_mask(index: MemoryIndex, names: list[str] | None) -> np.ndarray | None:
    """The kernels' type filter: one byte per type code (``None``: every type)."""
    if names is None:
        return None
    allowed = np.zeros(fmt.TYPE_CODES, dtype=np.uint8)
    for name in names:
        code = index.type_code(name, create=False)
        if code >= 0:
            allowed[code] = 1
    return allowed


def filters(
    index: MemoryIndex, types: list[str] | None, since: float, until: float, session: str | None
) -> Filters:
    return Filters(type_mask(index, types), since, until, session_hash(session))


def embed_query(
    embedder: Embedder | None, query: str, wait: float = 0.0
) -> tuple[np.ndarray | None, bool]:
    """``(vector, degraded)`` for :func:`rank`: the query's embedding (``None`` without an
    embedder or a query), or ``degraded`` when the model has not loaded yet. Made before
    the caller takes the store's lock: a slow model must not hold up the handle's other
    threads (as ``add_many`` embeds before it writes).

    A model still loading that can embed a query meanwhile (``encode_query_now``: the
    default model, in numpy) does so: not degraded. If it cannot (a text its numpy
    tokenizer refuses), the model is waited for up to ``wait`` seconds."""
    if embedder is None or not query.strip():
        return None, False
    if not getattr(embedder, "ready", True):
        now = getattr(embedder, "encode_query_now", None)
        vector = now(query) if now is not None else None
        if vector is not None:
            return np.asarray(vector), False
        if not (wait and _ready_within(embedder, wait)):
            return None, True
    return query_vector(embedder, query), False


def _ready_within(embedder: Embedder, wait: float) -> bool:
    """Whether the model itself (not its numpy query path) is ready within ``wait`` s."""
    wait_for = getattr(embedder, "wait", None)
    if wait_for is not None:
        try:
            wait_for(wait)
        except EmbedderUnavailableError:
            return False
    return bool(getattr(embedder, "ready", True))


def rank(
    index: MemoryIndex, query: str, k: int, *, policy: ContextPolicy, vector: np.ndarray | None,
    degraded: bool, session: str | None, now: float, where: Filters = NO_FILTERS,
    own_turns: bool = False,
) -> tuple[list[Ranked], bool]:  # fmt: skip
    """Level 3: rows ranked for ``query``, best first, with relevance from 0 to 1.

    The ``k`` best rows by vector and the ``k`` best by keyword, and the memories next
    to them in their sessions, are scored by both (z-scores over these candidates,
    weighted); each score is then smoothed with its neighbours' (an answer often sits
    next to the turn that matches the question) and importance, recency and the
    current session add small bonuses.

    ``own_turns``: the query is about one speaker of a conversation (``query.answer``
    knows): a strong match also lifts the memories two rows away in its session, as it
    lifts those next to it. In a dialogue those are its speaker's own previous and next
    turns, past the other speaker's reply, which the speaker focus then demotes.

    ``vector`` and ``degraded`` are :func:`embed_query`'s. Returns ``(ranked, degraded)``:
    ``degraded`` when the embedder was not loaded yet and the store holds vectors (the
    ranking then has no vector component).
    """
    degraded = degraded and bool(index.dim)
    if not query.strip() or not index.live:
        return [], False
    parts = []
    words = inflected(index, content_words(query))
    if vector is not None and index.dim:
        keyword_job = _keyword_worker().submit(index.keyword.search, index, words, k, *where)
        try:
            parts.append(_vector_candidates(index, vector, k, where)[0])
        finally:
            keyword_job.exception()  # it reads the index: done before anything can change it
        kw_rows, kw_scores = keyword_job.result()
    else:
        vector = None  # a store without vectors
        kw_rows, kw_scores = index.keyword.search(index, words, k, *where)
    parts.append(kw_rows)
    id_rows, id_scores = _identifier_matches(index, query, k, where, policy)
    parts.append(id_rows)
    spans = periods(query) if policy.identifier_weight else []
    for since, until in spans:  # the best matches written then, however far down they rank
        inside = where._replace(since=max(where.since, since), until=min(where.until, until))
        if vector is not None:
            parts.append(_vector_candidates(index, vector, k, inside)[0])
        else:
            parts.append(index.keyword.search(index, words, k, *inside)[0])
    found = _sorted_unique(np.concatenate(parts).astype(np.int64))
    if not len(found):
        return [], degraded
    neighbours = with_neighbours(index, found, where, 2 if own_turns else 1)
    cand = neighbours.rows
    prev, nxt = neighbours.at(-1), neighbours.at(1)
    score = np.zeros(len(cand))
    cosines = None
    if vector is not None:
        cosines = _cosines(index, cand, vector)
        score += policy.vector_weight * _z(cosines)
    keyword = _spread(cand, kw_rows, kw_scores)
    score += policy.keyword_weight * _z(keyword)
    # Neighbours: smooth, then let a strong match lift the memory next to it (and, for a
    # question about one speaker, that speaker's own turns two rows away).
    floor = float(score.min())
    smooth = score + policy.neighbour_weight * (_at(score, prev, floor) + _at(score, nxt, floor))
    near = [prev, nxt]
    if own_turns:
        near += [neighbours.at(-2), neighbours.at(2)]
    lifted = np.max([_at(smooth, positions, -np.inf) for positions in near], axis=0)
    fused = np.maximum(smooth, lifted - policy.neighbour_gap)
    fused += bonuses(index, cand, policy, session, now)
    if id_scores is not None and len(id_rows):
        # The memories holding the query's identifiers go up by a share of the whole
        # spread of scores (all of it at weight 1: above any memory without them).
        held = _spread(cand, id_rows, id_scores)
        fused += policy.identifier_weight * (float(fused.max() - fused.min()) + 1e-3) * held
    if spans:
        # A date is an identifier of time: the memories written then go up as those holding
        # the query's identifiers do (at weight 1, above every memory written at another time).
        spread = float(fused.max() - fused.min()) + 1e-3
        fused += policy.identifier_weight * spread * _within(index, cand, spans)
    order = np.lexsort((cand, -fused))
    lo, hi = float(fused.min()), float(fused.max())
    relevance = (fused - lo) / (hi - lo) if hi > lo else np.ones(len(fused))
    return [
        Ranked(int(cand[i]), float(relevance[i]), None if cosines is None else float(cosines[i]),
               float(keyword[i]))
        for i in order
    ], degraded  # fmt: skip


def sole_match(ranked: list[Ranked]) -> int:
    """The row of the only match for a query: the best row of :func:`rank` when the vector
    side and the keyword side each rank it first of the candidates too (the two disagree on
    everything else, so a memory both put first is what the query asks about); -1 when
    there is none or the ranking has no vector side.

    >>> sole_match([Ranked(7, 1.0, 0.6, 12.0), Ranked(3, 0.9, 0.5, 4.0)])
    7
    """
    best = ranked[0] if ranked else None
    if best is None or best.cosine is None or best.keyword <= 0:
        return -1
    for other in ranked[1:]:
        if (other.cosine or 0.0) > best.cosine or other.keyword > best.keyword:
            return -1
    return best.row


def _spread(cand: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` of ``rows`` at their places in the sorted ``cand`` (0 elsewhere); a row
    the filters dropped (a damaged row) is not a candidate."""
    out = np.zeros(len(cand))
    at = np.searchsorted(cand, rows)
    kept = at < len(cand)
    kept[kept] &= cand[at[kept]] == rows[kept]
    out[at[kept]] = values[kept]
    return out


# An identifier held by more memories than this is vocabulary ("API", "2024"), not a key.
IDENTIFIER_MAX_ROWS = 8


def _identifier_matches(
    index: MemoryIndex, query: str, k: int, where: Filters, policy: ContextPolicy
) -> tuple[np.ndarray, np.ndarray | None]:
    """The memories holding the query's exact identifiers (:func:`identifiers`) that
    few memories hold (``IDENTIFIER_MAX_ROWS``), and for each the share of those
    identifiers it holds; ``None`` when there are none."""
    found = list(dict.fromkeys(identifiers(query)))[:4]
    if not found or not policy.identifier_weight:
        return np.zeros(0, dtype=np.int64), None
    held: dict[int, int] = {}
    keys = 0
    for word in found:
        rows, _ = index.keyword.search(index, word, IDENTIFIER_MAX_ROWS + 1, *where)
        if 0 < len(rows) <= IDENTIFIER_MAX_ROWS:
            keys += 1
            for g in np.asarray(rows).tolist():
                held[g] = held.get(g, 0) + 1
    if not held:
        return np.zeros(0, dtype=np.int64), None
    rows = np.array(sorted(held), dtype=np.int64)
    return rows, np.array([held[g] / keys for g in rows.tolist()])


# English, whatever the locale (calendar's names follow LC_TIME once a program sets it).
_MONTH_NAMES = ("january", "february", "march", "april", "may", "june", "july", "august",
                "september", "october", "november", "december")  # fmt: skip
_MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, 1)} | {
    name[:3]: i for i, name in enumerate(_MONTH_NAMES, 1)} | {"sept": 9}  # fmt: skip
_MONTH = "(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(\d{4})\b"
# "3 June, 2023", "3rd of June 2023"; "June 3, 2023"; "2023-06-03"; "June 2023".
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}", re.IGNORECASE)
_ISO_DAY = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+{_YEAR}", re.IGNORECASE)
# Each day pattern with the groups of its year, month and day.
_DAY_PATTERNS = ((_DAY_MONTH_YEAR, (3, 2, 1)), (_MONTH_DAY_YEAR, (3, 1, 2)), (_ISO_DAY, (1, 2, 3)))
# At most this many dates of a query are looked up (each is a filtered scan).
MAX_PERIODS = 4


def periods(query: str) -> list[tuple[float, float]]:
    """The days the query names (``[since, until)`` in Unix seconds, UTC, as the context's
    headers show them), or the months it names when it names no day: "on 3 June, 2023",
    "June 3rd, 2023", "2023-06-03", "in June 2023". A year alone, or a day without its year,
    names no period here (a four-digit number may be a count or a model).

    >>> [datetime.fromtimestamp(t, timezone.utc).strftime("%d %b %Y") for span in
    ...  periods("What did Nate do on 25 May, 2022 and in June 2022?") for t in span]
    ['25 May 2022', '26 May 2022']
    """
    spans: list[tuple[datetime, datetime]] = []
    for pattern, (y, m, d) in _DAY_PATTERNS:
        for found in pattern.finditer(query):
            month = found.group(m)
            try:
                day = datetime(int(found.group(y)), _MONTHS.get(month.lower()) or int(month),
                               int(found.group(d)), tzinfo=timezone.utc)  # fmt: skip
                spans.append((day, day + timedelta(days=1)))
            except (ValueError, OverflowError):  # "31 June", "2023-13-01", "9999-12-31"
                continue
    if not spans:
        for found in _MONTH_YEAR.finditer(query):
            year, month = int(found.group(2)), _MONTHS[found.group(1).lower()]
            if 1 <= year <= 9998 and found.group(1) != "may":  # "it may 2023 be": the verb
                start = datetime(year, month, 1, tzinfo=timezone.utc)
                end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc)
                spans.append((start, end))
    return list(dict.fromkeys((a.timestamp(), b.timestamp()) for a, b in spans))[:MAX_PERIODS]


def _within(index: MemoryIndex, rows: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    """1.0 for the ``rows`` written in one of ``spans``, else 0.0."""
    ts = index.gather(rows, ("timestamp",))["timestamp"].astype(np.float64)
    inside = np.zeros(len(rows), dtype=bool)
    for since, until in spans:
        inside |= (ts >= since) & (ts < until)
    return inside.astype(np.float64)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for a 1-d array, without np.unique: its first call in a process
    imports numpy.ma (10-25 ms), which was every fresh process's first search or context."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


# A memory's neighbours are looked for up to this many rows before and after it: the rows of
# other sessions written in between (two conversations written at once, interleaved) and of
# forgotten or filtered-out memories are skipped, as far as this.
NEIGHBOUR_ROWS = 8


class Neighbours(NamedTuple):
    """:func:`with_neighbours`' candidates and, for each, where its neighbours are among them."""

    rows: np.ndarray  # sorted
    links: dict[int, np.ndarray]  # step (±1, ±2, ...) -> position in ``rows`` of the memory
    #                               that many memories after (before) in its session, or -1

    def at(self, step: int) -> np.ndarray:
        """The positions of each row's neighbour ``step`` memories away in its session."""
        return self.links[step]


def with_neighbours(
    index: MemoryIndex, found: np.ndarray, where: Filters, reach: int = 1
) -> Neighbours:
    """``found`` (sorted, distinct rows) plus, for each, the ``reach`` memories before and
    after it in its own session (a memory's neighbours are the memories written just before
    and after it in the same session: those of another session are never its neighbours,
    even when they sit next to it in the store), among the live memories that pass the
    filters, looked for up to ``NEIGHBOUR_ROWS`` rows away; and each candidate's neighbours
    up to ``reach`` steps away among the candidates (:class:`Neighbours`). Memories without
    a session are one session, as they always were: the order they were added in is their
    conversation.
    """
    near, run = _windows(found, max(NEIGHBOUR_ROWS, reach), len(index))
    fields = index.gather(near, ("flags", "timestamp", "session", "type"))
    kept = where.mask(fields)
    rows, session, run = near[kept], fields["session"][kept], run[kept]
    n = len(rows)
    # Each kept row's next memory in its session: the next row of the same run and session.
    order = np.lexsort((rows, session, run))
    by_run, by_session = run[order], session[order]
    same = np.zeros(n, dtype=bool)  # order[i + 1] is the next memory of order[i]'s session
    same[:-1] = (by_run[1:] == by_run[:-1]) & (by_session[1:] == by_session[:-1])
    nxt = np.full(n, -1, dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    nxt[order[:-1][same[:-1]]] = order[1:][same[:-1]]
    prev[order[1:][same[:-1]]] = order[:-1][same[:-1]]
    chains = {}  # step -> index in ``rows`` of the memory that many steps away, or -1
    for sign, link in ((1, nxt), (-1, prev)):
        at = np.arange(n, dtype=np.int64)
        for step in range(1, reach + 1):
            at = np.where(at >= 0, link[np.maximum(at, 0)], -1)
            chains[sign * step] = at
    is_found = _member(rows, found)
    chosen = is_found.copy()
    for at in chains.values():
        chosen[at[is_found & (at >= 0)]] = True
    position = np.cumsum(chosen) - 1  # a chosen row's position among the candidates
    links = {}
    for step, at in chains.items():
        target = np.maximum(at, 0)
        links[step] = np.where((at >= 0) & chosen[target], position[target], -1)[chosen]
    return Neighbours(rows[chosen], links)


def _windows(found: np.ndarray, span: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows up to ``span`` rows from the sorted, distinct rows ``found`` (of ``n``),
    sorted, and for each the run of consecutive rows it is in (numbered from 0): within a
    run, every row between two of its rows is one of them. Without a sort (it was most of
    the cost): the windows of sorted rows are sorted, and merge where they touch."""
    if not len(found):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo = np.maximum(found - span, 0)
    hi = np.minimum(found + span, n - 1)
    starts = np.flatnonzero(np.concatenate(([True], lo[1:] > hi[:-1] + 1)))
    first, last = lo[starts], np.maximum.reduceat(hi, starts)
    lengths = last - first + 1
    run = np.repeat(np.arange(len(starts)), lengths)
    offsets = np.cumsum(lengths) - lengths  # each run's start in the result
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(first - offsets, lengths), run


def _member(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which of the sorted ``rows`` are in ``values`` (without np.isin: see _sorted_unique)."""
    values = np.sort(values)
    if not len(values):
        return np.zeros(len(rows), dtype=bool)
    at = np.minimum(np.searchsorted(values, rows), len(values) - 1)
    return values[at] == rows


def _at(values: np.ndarray, positions: np.ndarray, missing: float) -> np.ndarray:
    """``values`` at ``positions`` (those of :meth:`Neighbours.at`), ``missing`` where
    there is none (-1)."""
    return np.where(positions >= 0, values[np.maximum(positions, 0)], missing)


def _cosines(index: MemoryIndex, rows: np.ndarray, query: Any) -> np.ndarray:
    """Approximate cosines (int8 vectors) of ``rows`` with a query vector; rows without a
    vector get the lowest."""
    q = np.asarray(query, dtype=np.float32)
    q = q / (np.linalg.norm(q) or 1.0)
    vectors, has = index.unit_vectors(rows)
    out = vectors @ q
    if has.any() and not has.all():
        out[~has] = out[has].min()
    return out


def bonuses(index: MemoryIndex, rows: np.ndarray, policy: ContextPolicy, session: str | None,
            now: float) -> np.ndarray:  # fmt: skip
    """Importance, recency and same-session bonuses of ``rows``, weighted by the policy."""
    wanted = session_hash(session) if session else 0
    scale = 1.0 / (policy.recency_half_life_days * DAY)
    fields = index.gather(rows, ("importance", "timestamp", "session"))
    age = np.fmax(0.0, now - fields["timestamp"].astype(np.float64))  # fmax: a NaN age is 0
    with np.errstate(invalid="ignore"):  # a damaged row's importance: a signalling NaN
        bonus = policy.importance_weight * fields["importance"].astype(np.float64)
    bonus += policy.recency_weight * 2.0 ** (-age * scale)
    if wanted:
        bonus += policy.session_weight * (fields["session"] == wanted)
    return bonus


def _vector_candidates(index: MemoryIndex, query: Any, k: int, where: Filters) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the ``k`` best int8 scores for a query vector (no rescoring)."""
    q16 = to_float16([query], index.dim, "query")
    q8, _ = quantize(q16)
    return _vsearch.scan(index, q8[0], k, *where)


def vector_search(
    index: MemoryIndex, data: Any, query: Any, k: int, where: Filters, *,
    paths: tuple[str, str] = ("", ""),
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Rows and exact cosines (against the stored float16 vectors) of the best matches for
    a query vector, best first (ties: the older row first); more than ``k`` rows, so a
    caller that drops some still has ``k``. ``query`` is checked even when nothing can
    match. ``paths`` (data file, index file) name the files in errors.

    Raises:
        InvalidInputError: the query is not a finite vector of the index's dimension.
        CorruptIndexError: an index row points outside ``data``.
        CorruptRecordError: a stored vector is not finite.
    """
    q16 = to_float16([query], index.dim, "query")
    if not index.dim:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    q8, _ = quantize(q16)
    q = np.asarray(query, dtype=np.float64)
    q = q / np.linalg.norm(q)
    want = _vsearch.candidate_count(k, len(index))
    cand, _ = _vsearch.scan(index, q8[0], want, *where)
    dat_path, idx_path = paths
    try:
        exact = _vsearch.rescore(index, data, cand, q)
    except ValueError:  # an index row pointing outside the data file
        raise CorruptIndexError(f"{idx_path}: a row points outside the data file; run repair()",
                                path=idx_path, offset=0) from None  # fmt: skip
    if not np.isfinite(exact).all():  # an index row over a damaged vector
        raise CorruptRecordError(
            f"{dat_path}: a stored vector is not finite; run repair()", path=dat_path,
            offset=int(index.row(int(cand[~np.isfinite(exact)][0]))[F_OFFSET]),
        )  # fmt: skip
    best = np.lexsort((cand, -exact))  # rows are in id order: ties to the older id
    return cand[best], exact[best]


def keyword_search(index: MemoryIndex, query: str, k: int, where: Filters) -> tuple[np.ndarray, np.ndarray]:
    """Rows and BM25 scores of the ``k`` best keyword matches, best first."""
    return index.keyword.search(index, query, k, *where)


def content_words(query: str) -> str:
    """The query without question and function words, for BM25 (all of it if nothing is
    left): they match everywhere and push the content words' matches down."""
    words = [w for w in query.split() if w.strip("?!.,;:'\"()").lower() not in QUERY_STOP_WORDS]
    return " ".join(words) if words else query


# Inflections are made for words of at least this many letters ("bus", "was" have none
# worth looking up) and at most this many are searched for one word.
INFLECTED_MIN_LETTERS = 4
_VOWELS = frozenset("aeiouy")
# Irregular verbs among English's most used (those whose forms a question and an answer
# may differ by: "brought" and "bring", "written" and "wrote"), each form to all of them;
# "be", "have", "do" and the like are question words, left out before this.
_IRREGULAR_VERBS = """
    become/became begin/began/begun break/broke/broken bring/brought build/built buy/bought
    catch/caught choose/chose/chosen come/came cut/cutting draw/drew/drawn drive/drove/driven
    eat/ate/eaten fall/fell/fallen feel/felt find/found fly/flew/flown forget/forgot/forgotten
    get/got/gotten give/gave/given go/went/gone grow/grew/grown hear/heard hold/held keep/kept
    know/knew/known lead/led leave/left lose/lost make/made meet/met pay/paid ride/rode/ridden
    rise/rose/risen run/ran/running say/said see/saw/seen sell/sold send/sent show/shown
    sing/sang/sung sit/sat/sitting sleep/slept speak/spoke/spoken spend/spent stand/stood
    swim/swam/swum/swimming take/took/taken teach/taught tell/told think/thought
    throw/threw/thrown understand/understood wear/wore/worn win/won/winning write/wrote/written
    """
_IRREGULAR = {form: forms for forms in (tuple(verb.split("/")) for verb in _IRREGULAR_VERBS.split())
              for form in forms}  # fmt: skip


def inflections(word: str) -> list[str]:
    """The English inflections of ``word`` (lowercase), the word first: each base it may be
    made from ("camped": camp, campe; "activities": activity; "tried": try; "brought":
    bring), or the word itself when it has no ending, with its -s, -es, -ed, -d, -ing, -ies,
    -ied forms, a doubled final consonant ("plan": planned) and, for a common irregular
    verb, its other forms ("write": wrote, written).
    Most forms are no word at all; no memory holds those, so they cost a lookup and nothing
    more. A word shorter than ``INFLECTED_MIN_LETTERS`` or not made of ASCII letters alone
    is returned as it is.

    >>> [w for w in inflections("camped") if w in ("camp", "camping", "camps")]
    ['camp', 'camping', 'camps']
    >>> "activity" in inflections("activities"), inflections("bus")
    (True, ['bus'])
    """
    word = word.lower()
    if len(word) < INFLECTED_MIN_LETTERS or not (word.isascii() and word.isalpha()):
        return [word]
    bases = set(_IRREGULAR.get(word, ())[:1])  # "brought": bring
    if word.endswith("ies") and len(word) > 4:  # "stories": story; "movies": movie
        bases |= {word[:-3] + "y", word[:-1]}
    elif word.endswith("es") and len(word) > 4:
        bases |= {word[:-2], word[:-1]}
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        bases.add(word[:-1])
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 3 and not _VOWELS.isdisjoint(stem):
            bases |= {stem, stem + "e"}
            if stem[-1] == stem[-2]:  # "planned": plan
                bases.add(stem[:-1])
            if suffix == "ed" and stem.endswith("i"):  # "tried": try
                bases.add(stem[:-1] + "y")
    forms = set()
    for b in (b for b in bases or {word} if len(b) >= 3):  # an uninflected word: its own base
        if b in _IRREGULAR:  # its past forms are its own: "sees", "seeing", "saw", "seen"
            forms |= {*_IRREGULAR[b], b + "s", (b[:-1] if b[-1] == "e" != b[-2] else b) + "ing"}
            continue
        forms |= {b, b + "s", b + "es", b + "ed", b + "ing", b + "d"}
        if b.endswith("e"):
            forms |= {b[:-1] + "ing", b[:-1] + "ed"}
        if b.endswith("y"):
            forms |= {b[:-1] + "ies", b[:-1] + "ied"}
        if b[-1] not in _VOWELS and b[-1] not in "wx" and b[-2] in _VOWELS and b[-3] not in _VOWELS:
            forms |= {b + b[-1] + "ed", b + b[-1] + "ing"}  # "plan": planned, planning
    forms.discard(word)
    return [word, *sorted(forms)]


def inflected(index: MemoryIndex, words: str) -> str:
    """``words`` (a keyword query) with each word that no memory's postings hold replaced by
    its :func:`inflections`: the memories say "camping" or "visit" where the question says
    "camped" or "visited", and the keyword side has no stemming. A word some memory holds
    stays as it is (its exact form is what the query asks for, and expanding it finds
    other memories: on BEAM dev the inflections of every query word lost 0.015)."""
    split = words.split()
    found = [inflections(word.strip("?!.,;:'\"()")) for word in split]
    asked = [i for i, forms in enumerate(found) if len(forms) > 1]  # words that have inflections
    if not asked:
        return words
    held = index.keyword.held([found[i][0] for i in asked])
    for i in (i for i, known in zip(asked, held.tolist()) if not known):
        split[i] = " ".join(found[i])
    return " ".join(split)


# A word with a digit in it ("v2", "2024", "INC-4411"), a dotted, slashed or underscored
# name ("settings.py", "api/v1", "user_id"), an acronym or an inner capital ("JWT", "getUser").
_IDENTIFIER = re.compile(
    r"\b\w*\d\w*\b|\b\w+(?:[._/]\w+)+\b|\b[A-Z]{2,}s?\b|\b[a-z]+[A-Z]\w*\b"
)


def identifiers(query: str) -> list[str]:
    """The exact identifiers in ``query`` (numbers, codes, file names, acronyms), which
    the keyword side finds better than any embedding: the memories holding one that few
    memories hold rank higher (``ContextPolicy.identifier_weight``).

    >>> identifiers("where is settings.py for INC-4411?"), identifiers("what did Ada like?")
    (['settings.py', 'INC', '4411'], [])
    """
    return [m.group(0) for m in _IDENTIFIER.finditer(query)]


def has_identifier(query: str) -> bool:
    """Whether ``query`` holds an exact identifier (see :func:`identifiers`)."""
    return _IDENTIFIER.search(query) is not None


def query_vector(embedder: Embedder, query: str) -> np.ndarray:
    """The query's vector; from a model still loading, its numpy query path's when it has one
    (a context's second ranking, see ``query.answer``, must not wait for onnxruntime
    when its first did not), else the model's (which waits for the load)."""
    if not getattr(embedder, "ready", True):
        now = getattr(embedder, "encode_query_now", None)
        vector = now(query) if now is not None else None
        if vector is not None:
            return np.asarray(vector)
    encode_query = getattr(embedder, "encode_query", None)
    if encode_query is not None:
        return np.asarray(encode_query(query))
    return np.asarray(embedder.encode([query]))[0]


def _z(x: np.ndarray) -> np.ndarray:
    """Standard scores: comparable across the vector and keyword scales."""
    std = float(x.std())
    return (x - x.mean()) / std if std > 0 else np.zeros(len(x))


# One thread per process runs a ranking's keyword search while the caller's thread scans
# the vectors (both release the GIL).
_keyword_thread: ThreadPoolExecutor | None = None
_keyword_thread_lock = threading.Lock()


def _keyword_worker() -> ThreadPoolExecutor:
    global _keyword_thread
    with _keyword_thread_lock:
        if _keyword_thread is None:
            from concurrent.futures import ThreadPoolExecutor  # here: import fastmem needs none

            _keyword_thread = ThreadPoolExecutor(1, thread_name_prefix="fastmem-keyword")
        return _keyword_thread


@at_fork
def _after_fork_in_child() -> None:
    global _keyword_thread, _keyword_thread_lock
    _keyword_thread, _keyword_thread_lock = None, threading.Lock()  # the parent's thread and lock

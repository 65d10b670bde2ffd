"""One question's trip: for ``context()``, ranked (:mod:`~fastmem.recall.ranking`, with
:mod:`~fastmem.recall.speakers`), then packed (:mod:`~fastmem.recall.packing`); the ranking's
result goes to the packer whole, in a :class:`~fastmem.recall.hits.Ranking`, and the packer
calls nothing back. For ``search()``, ranked in its mode and read as hits.

``answer`` takes the engine's lock itself, and not while it embeds the question (either
time). The search functions run under the lock the facade holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..embed import Embedder
from ..storage.engine import Engine
from ..storage.records import parse_id
from ..errors import InvalidInputError
from ..tokens import TokenCounter
from ..types import Context, ContextPolicy, Hit, Memory
from . import packing, ranking, speakers, supersedes
from .hits import Ranked, Ranking


def check_budget(budget: Any) -> int:
    """``budget`` if it is a context's budget (1 to 1,000,000 tokens), else InvalidInputError."""
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= 1_000_000:
        raise InvalidInputError(f"budget must be an int from 1 to 1000000 tokens, got {budget!r}")
    return budget


def answer(
    engine: Engine, policy: ContextPolicy, query: str, *, embedder: Embedder | None,
    session: str | None, budget: int, counter: TokenCounter, stored_counts: bool,
    exclude: set[str], touch: bool, types: list[str] | None = None,
) -> Context:  # fmt: skip
    """``MemoryStore.context`` of the memories of ``types`` (all when ``None``; at every
    level): the question embedded (:func:`~fastmem.recall.ranking.embed_query`, before the
    engine's lock is taken), level 3 ranked (:func:`~fastmem.recall.ranking.rank`), then
    packed (:func:`~fastmem.recall.packing.build`); the memories used counted as accesses
    when ``touch``.

    When the query names a speaker of its best matches, it is ranked again with the
    embedding of the query without that name (:func:`~fastmem.recall.speakers.without_names`; the keyword
    side keeps the whole query). A speaker's own turns say "I", not their name: the name pulls
    the query's embedding towards the other speakers' turns that address or mention them.
    On LoCoMo dev, the evidence of a question naming one speaker ranks, among that
    speaker's turns, in the first 30 for 54% of the multi-hop evidence with the name and
    74% without it. The lock is let go while that second embedding is made, as for the
    first (a slow model holds up no other thread). ``other_speaker`` 1 turns this off with
    the speaker focus.

    When it names two speakers or more ("What do Jon and Gina both like?"), the second
    ranking's keyword side leaves the names out as well: every turn holds one of them (its
    ``"Jon: "`` prefix), so they tell no speaker's turns from the other's and lift most the
    turns that address the other by name ("Thanks, Gina!"). With one name the keyword side
    keeps it: that name is its own speaker's turns.
    """
    started = time.perf_counter()
    # Embedded before the lock is taken: a loading model embeds in numpy meanwhile, and a slow
    # one holds up no other thread of the handle.
    vector, degraded = ranking.embed_query(embedder, query, wait=policy.embedder_wait)
    with engine.lock:
        engine.check()
        where = ranking.filters(engine.index, types, -math.inf, math.inf, None)
        hits, degraded, sole = _rank(engine, policy, query, vector, degraded, session, where=where)
        focus = _focus(engine, policy, query, hits)
        second = vector is not None and embedder is not None and policy.other_speaker < 1
        names = speakers.names_in(focus, query) if second else []
        rest = speakers.without(query, names)
        if rest is None:
            found = _ranking(engine, policy, hits, degraded, sole, focus)
            return _pack(engine, policy, query, found, session, budget, counter, stored_counts,
                         exclude, touch, where, started)  # fmt: skip
        words = rest if len(names) > 1 else query
    assert embedder is not None
    vector = ranking.query_vector(embedder, rest)
    with engine.lock:
        engine.check()
        where = ranking.filters(engine.index, types, -math.inf, math.inf, None)
        hits, degraded, sole = _rank(engine, policy, words, vector, degraded, session, own_turns=True,
                                     where=where)  # fmt: skip
        found = _ranking(engine, policy, hits, degraded, sole, _focus(engine, policy, query, hits))
        return _pack(engine, policy, query, found, session, budget, counter, stored_counts,
                     exclude, touch, where, started)  # fmt: skip


def _rank(
    engine: Engine, policy: ContextPolicy, query: str, vector: np.ndarray | None, degraded: bool,
    session: str | None, own_turns: bool = False, where: ranking.Filters = ranking.NO_FILTERS,
) -> tuple[list[Ranked], bool, int]:  # fmt: skip
    """The ranked rows, whether the ranking is degraded, and the only match's row."""
    hits, degraded = ranking.rank(engine.index, query, policy.candidates, policy=policy,
                                  vector=vector, degraded=degraded, session=session,
                                  now=time.time(), own_turns=own_turns, where=where)  # fmt: skip
    return hits, degraded, ranking.sole_match(hits)


def _focus(engine: Engine, policy: ContextPolicy, query: str, hits: list[Ranked]) -> frozenset[str] | None:
    """The question's speakers among the best hits (unless ``other_speaker`` is 1)."""
    if policy.other_speaker >= 1:
        return None
    return speakers.named_speakers(engine, hits[: speakers.SPEAKER_ROWS], query)


def _ranking(engine: Engine, policy: ContextPolicy, hits: list[Ranked], degraded: bool, sole: int,
             focus: frozenset[str] | None) -> Ranking:  # fmt: skip
    """What the packer needs of the ranking: the hits, the only match, the question's
    speakers and (unless ``other_conversation`` is 1) their conversations."""
    theirs = (speakers.their_sessions(engine.index, focus)
              if focus and policy.other_conversation < 1 else None)  # fmt: skip
    return Ranking(hits, degraded, sole, focus, theirs)


def _pack(
    engine: Engine, policy: ContextPolicy, query: str, found: Ranking, session: str | None,
    budget: int, counter: TokenCounter, stored_counts: bool, exclude: set[str], touch: bool,
    where: ranking.Filters, started: float,
) -> Context:  # fmt: skip
    text, tokens, items, left_out = packing.build(
        engine, policy, found, budget=budget, counter=counter, stored_counts=stored_counts,
        exclude=engine.rows_of(exclude), query=query, session=session, allowed=where.allowed)
    if touch:
        index = engine.index
        index.touch([index.find(parse_id(item.id)) for item in items], time.time())
    return Context(text, tokens, budget, items, counter.name, found.degraded,
                   time.perf_counter() - started, left_out)  # fmt: skip


def hybrid_search(engine: Engine, policy: ContextPolicy, query: str, k: int, where: ranking.Filters,
                  vector: np.ndarray | None, degraded: bool, session: str | None) -> list[Hit]:  # fmt: skip
    """``search(mode="hybrid")`` of text: ranked as ``context()`` ranks it, the newest truth
    first (a superseded memory's newest live version in its place)."""
    index = engine.index
    ranked, _ = ranking.rank(index, query, max(k, policy.candidates), policy=policy,
                             vector=vector, degraded=degraded, session=None, now=time.time(),
                             where=where)  # fmt: skip
    found = supersedes.newest_first(engine, [(r.row, r.relevance, r.cosine, r.keyword) for r in ranked],
                                    lambda g: where.keeps(index, g))  # fmt: skip
    return _hits(engine, found, k, session, policy)


def keyword_search(engine: Engine, query: str, k: int, where: ranking.Filters,
                   session: str | None) -> list[Hit]:  # fmt: skip
    """``search(mode="keyword")``: BM25."""
    rows, scores = ranking.keyword_search(engine.index, query, k, where)
    return _hits(engine, [(g, s, None, None) for g, s in zip(rows.tolist(), scores.tolist())], k, session)


def vector_search(engine: Engine, vector: Any, k: int, where: ranking.Filters,
                  session: str | None, paths: tuple[str, str]) -> list[Hit]:  # fmt: skip
    """``search(mode="vector")``, or of a vector (one flat sequence of floats, checked by
    ``ranking.vector_search``): exact cosines of the int8 scan's candidates."""
    rows, exact = ranking.vector_search(engine.index, engine.data(), vector, k, where, paths=paths)
    return _hits(engine, [(g, s, None, None) for g, s in zip(rows.tolist(), exact.tolist())], k, session)


def _hits(engine: Engine, found: Iterable[tuple[int, float, float | None, float | None]], k: int,
          session: str | None, hybrid: ContextPolicy | None = None) -> list[Hit]:  # fmt: skip
    """The first ``k`` of ``found`` (rows with their score, cosine and BM25) as hits, with a
    hybrid search's bonuses (``hybrid``: its policy)."""
    hits = []
    for g, score, cosine, keyword in found:
        memory = engine.memory(g)
        if session is not None and memory.session != session:
            continue  # a 64-bit hash collision
        hits.append(Hit(memory.id, score, memory, cosine, keyword, supersedes.newest_id(engine, g, memory),
                        *_bonuses(hybrid, memory)))  # fmt: skip
        if len(hits) == k:
            break
    return hits


def _bonuses(policy: ContextPolicy | None, memory: Memory) -> tuple[float | None, float | None]:
    """A hybrid hit's importance and recency bonuses, as ``ranking.bonuses`` adds them to
    its fused score (``(None, None)`` for the other modes, which add none)."""
    if policy is None:
        return None, None
    age = max(0.0, time.time() - memory.timestamp)
    recency = policy.recency_weight * 2.0 ** (-age / (policy.recency_half_life_days * 86400.0))
    return policy.importance_weight * memory.importance, recency

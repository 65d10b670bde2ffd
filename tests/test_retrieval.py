"""Ranking (fastmem.recall.ranking) as plain functions over a hand-built index, without a store.

Each test writes a small data file with known vectors (``fastmem.open`` + ``add_many``),
closes it, and rebuilds its index from the data file alone (``_files.build_index``); the
functions are then checked against independent computations: ``vector_search`` against
numpy brute force over the stored float16 vectors (hypothesis), filters in
``vector_search``/``keyword_search``/``rank`` against filtering the unfiltered result,
``rank``'s relevance scale, neighbours, degraded (keyword-only) ranking and the policy's
bonuses, ``importance_scores`` against the numpy reference, ``content_words``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem._kernels import reference as _kernels_py
from fastmem.storage.recovery import build_index
from fastmem.storage.index import session_hash
from fastmem.recall import ranking as retrieval
from fastmem.recall.ranking import (
    NO_FILTERS,
    bonuses,
    content_words,
    filters,
    keyword_search,
    type_mask,
    vector_search,
)  # fmt: skip
from fastmem.storage.importance import importance_scores
from fastmem.types import DAY, ContextPolicy

NOW = 1.7e9
DIM = 8


def rank(index, query, k, *, embedder, **kwargs):
    """``retrieval.rank`` with the query embedded first, as the store does (before its lock)."""
    vector, degraded = retrieval.embed_query(embedder, query)
    return retrieval.rank(index, query, k, vector=vector, degraded=degraded, **kwargs)


class FakeEmbedder:
    """A deterministic embedder: a table of vectors (``ready=False``: still loading)."""

    name = "fake"
    dim = DIM

    def __init__(self, table, ready=True):
        self.table, self.ready = table, ready

    def encode(self, texts):
        if not self.ready:
            raise AssertionError("encode called before the embedder is ready")
        return np.array([self.table[t] for t in texts], dtype=np.float32)


def build(tmp_path, items, forget=()):
    """A data file holding ``items`` (``add_many`` dicts) minus ``forget`` (positions), and
    its index rebuilt from it: ``(index, data file bytes)``."""
    path = str(tmp_path / f"s{len(list(tmp_path.iterdir()))}")
    with fastmem.open(path, dim=DIM) as store:
        ids = store.add_many(items)
        for i in forget:
            store.forget(ids[i])
    with open(path + ".dat", "rb") as f:
        dat = f.read()
    index, problems, _ = build_index(dat, len(dat), path)
    assert problems == []
    return index, dat


def stored_halves(index, dat):
    """The float16 vectors as the data file holds them, read with numpy alone."""
    offsets = index.column("offset").astype(np.int64) + fmt.RECORD_HEADER_SIZE
    return np.stack([np.frombuffer(dat, "<f2", DIM, int(o)) for o in offsets]).astype(np.float64)


def passes(index, where_types, since, until, session):
    """Which rows a filter keeps, computed from the columns (not by ``Filters.mask``)."""
    names = [index.type_name(int(c)) for c in index.column("type")]
    ts, sess = index.column("timestamp"), index.column("session")
    dead = (index.column("flags") & fmt.FLAG_FORGOTTEN) != 0
    return np.array([
        not dead[g] and since <= ts[g] <= until and (where_types is None or names[g] in where_types)
        and (session is None or sess[g] == session_hash(session))
        for g in range(len(index))
    ], dtype=bool)  # fmt: skip


FILTER_CASES = [
    (None, -math.inf, math.inf, None),
    (["fact"], -math.inf, math.inf, None),
    (["fact", "plan", "nonexistent"], 2.0, 6.0, None),
    (None, 3.0, 3.0, "a"),
    (["note"], -math.inf, math.inf, "b"),
    (["nonexistent"], -math.inf, math.inf, None),
]


def items_from(rng, n, pool):
    vectors = rng.standard_normal((pool, DIM))
    return [
        {"text": f"w{i % 5} w{i % 3} filler", "embedding": vectors[rng.integers(pool)],
         "timestamp": float(rng.integers(10)), "type": ["fact", "note", "plan"][i % 3],
         "session": ["a", "b", None][int(rng.integers(3))]}
        for i in range(n)
    ]  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), pool=st.integers(1, 30), seed=st.integers(0, 2**16),
       case=st.sampled_from(FILTER_CASES), k=st.integers(1, 5), forget=st.sets(st.integers(0, 29)))
def test_vector_search_equals_brute_force(tmp_path_factory, n, pool, seed, case, k, forget):
    rng = np.random.default_rng(seed)
    index, dat = build(tmp_path_factory.mktemp("v"), items_from(rng, n, pool),
                       sorted(i for i in forget if i < n))  # fmt: skip
    q = rng.standard_normal(DIM)
    rows, scores = vector_search(index, dat, q, k, filters(index, *case))
    qn = q / np.linalg.norm(q)  # rounded sums, row by row: equal vectors give equal cosines
    exact = np.array([math.fsum(h * qn) for h in stored_halves(index, dat)])
    keep = np.flatnonzero(passes(index, *case))  # n <= 32: every row is a candidate
    want = keep[np.lexsort((keep, -exact[keep]))]  # best first, ties (same vector): older row
    assert rows.tolist() == want.tolist()
    assert np.allclose(scores, exact[want], rtol=0, atol=1e-12)


def test_vector_search_checks_the_query(tmp_path):
    index, dat = build(tmp_path, items_from(np.random.default_rng(0), 3, 3))
    with pytest.raises(fastmem.InvalidInputError):
        vector_search(index, dat, np.zeros(DIM), 3, NO_FILTERS)
    with pytest.raises(fastmem.DimensionMismatchError):
        vector_search(index, dat, np.ones(DIM + 1), 3, NO_FILTERS)


@pytest.mark.parametrize("case", FILTER_CASES)
def test_keyword_search_and_rank_apply_filters(tmp_path, case):
    index, _ = build(tmp_path, items_from(np.random.default_rng(1), 24, 24), forget=[0, 5])
    every, every_scores = keyword_search(index, "w0 w1", len(index), NO_FILTERS)
    assert len(every) == len(set(every.tolist())) and 0 not in every.tolist()
    keep = passes(index, *case)
    want = every[keep[every]][:4]
    rows, scores = keyword_search(index, "w0 w1", 4, filters(index, *case))
    assert rows.tolist() == want.tolist()  # BM25 statistics do not depend on the filter
    assert np.array_equal(scores, every_scores[keep[every]][:4])
    ranked, _ = rank(index, "w0 w2", 5, policy=ContextPolicy(), embedder=None, session=None,
                     now=NOW, where=filters(index, *case))  # fmt: skip
    assert all(keep[r.row] for r in ranked)
    hits = keyword_search(index, "w0 w2", len(index), NO_FILTERS)[0]
    assert bool(ranked) == bool(keep[hits].any())


def _table(texts, vectors):
    return FakeEmbedder(dict(zip(texts, vectors)))


def test_rank_relevance_scale_and_order(tmp_path):
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((12, DIM))
    items = [{"text": f"topic{i} shared words", "embedding": vectors[i], "timestamp": NOW,
              "session": f"s{i}"} for i in range(12)]  # fmt: skip
    index, _ = build(tmp_path, items)
    embedder = _table(["topic7 please"], [vectors[7] + 0.05 * rng.standard_normal(DIM)])
    ranked, degraded = rank(index, "topic7 please", 4, policy=ContextPolicy(),
                            embedder=embedder, session=None, now=NOW)  # fmt: skip
    assert not degraded and ranked[0].row == 7
    relevance = [r.relevance for r in ranked]
    assert relevance[0] == 1.0 and relevance[-1] == 0.0
    assert relevance == sorted(relevance, reverse=True) and all(0 <= x <= 1 for x in relevance)
    assert len({r.row for r in ranked}) == len(ranked)
    assert ranked[0].keyword > 0 and all(r.cosine is not None for r in ranked)
    assert ranked[0].cosine == max(r.cosine for r in ranked)


def test_degraded_ranking_is_keyword_only(tmp_path):
    vectors = np.eye(DIM)[:6] + 0.1
    texts = ["red apple", "green pear", "red car", "blue sky", "apple pie", "sky high"]
    items = [{"text": t, "embedding": v, "timestamp": NOW} for t, v in zip(texts, vectors)]
    index, _ = build(tmp_path, items)
    embedder = _table(["apple"], [vectors[1]])  # the vector would favour "green pear"
    args = {"policy": ContextPolicy(), "session": None, "now": NOW}
    with_vectors, degraded = rank(index, "apple", 3, embedder=embedder, **args)
    assert not degraded and with_vectors[0].row == 1 and with_vectors[0].keyword == 0
    assert all(r.cosine is not None for r in with_vectors)
    embedder.ready = False
    loading, degraded = rank(index, "apple", 3, embedder=embedder, **args)
    assert degraded and all(r.cosine is None for r in loading)
    assert loading == rank(index, "apple", 3, embedder=None, **args)[0]
    assert [r.row for r in loading][:2] == [0, 4]  # the keyword matches, then neighbours
    assert {r.row for r in loading if r.keyword > 0} == {0, 4}


def test_a_strong_match_lifts_its_neighbour_in_the_same_session(tmp_path):
    texts = [
        "museum opening hours",  # 0: another session, the row before the match
        "I bought a red bicycle yesterday",  # 1: the match
        "it cost two hundred dollars",  # 2: the next turn of its session, no query word
        "the price of eggs went up",  # 3: a weaker match in a third session
        "they were cheap last week",  # 4: the next turn of that session, no query word
        "eggs and bread",  # 5: a fourth session, next to row 4
    ]
    sessions = ["museum", "bike", "bike", "shop", "shop", "market"]
    items = [{"text": t, "session": s, "timestamp": NOW, "embedding": np.ones(DIM)}
             for t, s in zip(texts, sessions)]  # fmt: skip
    index, _ = build(tmp_path, items)

    def relevance(policy):
        ranked, _ = rank(index, "red bicycle price", 5, policy=policy, embedder=None,
                         session=None, now=NOW)  # fmt: skip
        assert ranked[0].row == 1
        return {r.row: r.relevance for r in ranked}

    lifted = relevance(ContextPolicy())
    # Rows 0 and 5 sit next to a match in the store but in other sessions: no neighbours.
    assert set(lifted) == {1, 2, 3, 4}
    assert lifted[2] > lifted[4]  # next to the stronger match
    flat = relevance(ContextPolicy(neighbour_weight=0.0, neighbour_gap=1e5))
    assert flat[2] == flat[4] < flat[3]


def _interleaved(tmp_path, forget=()):
    """Two conversations written at once: their turns alternate in the store."""
    texts = [
        "we talked about the weather",  # 0: a, the turn before the match
        "museum opening hours",  # 1: b
        "I bought a red bicycle yesterday",  # 2: a, the match
        "the museum closes at five",  # 3: b
        "it cost two hundred dollars",  # 4: a, the turn after the match
        "see you at the museum",  # 5: b
        "it has a basket too",  # 6: a, two turns after the match
    ]
    items = [{"text": t, "session": "ab"[i % 2], "timestamp": NOW + i, "embedding": np.ones(DIM)}
             for i, t in enumerate(texts)]  # fmt: skip
    return build(tmp_path, items, forget)[0]


def test_neighbours_come_from_the_memorys_own_session_when_sessions_interleave(tmp_path):
    index = _interleaved(tmp_path)
    args = {"policy": ContextPolicy(), "embedder": None, "session": None, "now": NOW}
    ranked, _ = rank(index, "red bicycle", 5, **args)
    assert ranked[0].row == 2
    assert {r.row for r in ranked} == {0, 2, 4}  # never 1 or 3: another conversation's turns
    # A question about one speaker reaches two turns away in the session, not two rows.
    ranked, _ = rank(index, "red bicycle", 5, own_turns=True, **args)
    assert {r.row for r in ranked} == {0, 2, 4, 6}


def test_a_forgotten_memory_does_not_part_its_neighbours(tmp_path):
    index = _interleaved(tmp_path, forget=[4])
    ranked, _ = rank(index, "red bicycle", 5, policy=ContextPolicy(), embedder=None,
                     session=None, now=NOW)  # fmt: skip
    assert {r.row for r in ranked} == {0, 2, 6}  # the next live turn of the match's session
    # The session filter keeps the same neighbours; another session's filter none of them.
    where = retrieval.filters(index, None, -math.inf, math.inf, "a")
    ranked, _ = rank(index, "red bicycle", 5, policy=ContextPolicy(), embedder=None,
                     session=None, now=NOW, where=where)  # fmt: skip
    assert {r.row for r in ranked} == {0, 2, 6}


def test_a_query_word_no_memory_holds_is_looked_up_by_its_inflections(tmp_path):
    texts = ["we went camping by the lake", "two camps were full", "the museum was closed",
             "museums and camping gear"]  # fmt: skip
    items = [{"text": t, "timestamp": NOW, "session": f"s{i}", "embedding": np.ones(DIM)}
             for i, t in enumerate(texts)]  # fmt: skip
    index, _ = build(tmp_path, items)
    args = {"policy": ContextPolicy(), "embedder": None, "session": None, "now": NOW}

    def matched(query):
        return {r.row for r in rank(index, query, 4, **args)[0] if r.keyword > 0}

    # No memory holds "camped": those saying "camping" or "camps" match (the keyword side
    # has no stemming).
    assert matched("where have they camped?") == {0, 1, 3}
    # A word some memory holds is searched for as it is: "camps" does not bring "camping".
    assert matched("how many camps") == {1}
    assert matched("museum") == {2}
    assert retrieval.inflected(index, "camped museum?") == " ".join(
        [*retrieval.inflections("camped"), "museum?"])  # fmt: skip


@pytest.mark.parametrize(
    "weights, session, first",
    [({"importance_weight": 10.0}, None, 0), ({"recency_weight": 10.0}, None, 1),
     ({"session_weight": 10.0}, "old", 0), ({"session_weight": 10.0}, "new", 1)],
)  # fmt: skip
def test_bonuses_move_the_order_as_the_policy_weighs_them(tmp_path, weights, session, first):
    # Two memories equal in text and vector: only the bonuses tell them apart.
    items = [{"text": "alpha beta", "embedding": np.ones(DIM), "timestamp": NOW - 30 * DAY,
              "importance": 0.9, "session": "old"},
             {"text": "alpha beta", "embedding": np.ones(DIM), "timestamp": NOW,
              "importance": 0.1, "session": "new"}]  # fmt: skip
    index, _ = build(tmp_path, items)
    policy = ContextPolicy(**{"importance_weight": 0, "recency_weight": 0, "session_weight": 0, **weights})
    embedder = _table(["alpha"], [np.ones(DIM)])
    ranked, _ = rank(index, "alpha", 2, policy=policy, embedder=embedder, session=session, now=NOW)
    assert [r.row for r in ranked] == [first, 1 - first]


def test_bonuses_formula(tmp_path):
    ts = [NOW, NOW - 7 * DAY, NOW - 14 * DAY, NOW + 50]  # the last: in the future, age 0
    items = [{"text": f"t{i}", "timestamp": t, "importance": 0.2 * i, "session": "s" if i % 2 else None}
             for i, t in enumerate(ts)]  # fmt: skip
    index, _ = build(tmp_path, items)
    policy = ContextPolicy(importance_weight=2.0, recency_weight=3.0, session_weight=5.0)
    got = bonuses(index, np.array([3, 0, 1, 2]), policy, "s", NOW)
    want = [2 * 0.6 + 3 + 5, 0 + 3, 2 * 0.2 + 1.5 + 5, 2 * 0.4 + 0.75]
    assert np.allclose(got, want, rtol=1e-6)
    assert np.allclose(bonuses(index, np.array([1]), policy, None, NOW), [0.4 + 1.5], rtol=1e-6)


def test_importance_scores_all_rows_one_row_and_reference(tmp_path):
    rng = np.random.default_rng(5)
    items = [{"text": f"m{i}", "timestamp": NOW - float(rng.integers(0, 60 * DAY)),
              "importance": float(rng.random()), "pinned": bool(i % 7 == 3)} for i in range(40)]  # fmt: skip
    index, _ = build(tmp_path, items, forget=[4, 9])
    for g in rng.integers(0, 40, 60).tolist():
        index.touch([g], NOW - float(rng.integers(0, 90 * DAY)))
    index.set_field(11, "access_count", 0xFFFFFFFF)
    policy = ContextPolicy(access_weight=0.7, recency_weight=0.4, pin_bonus=2.0)
    everything = importance_scores(index, policy, NOW)
    want = np.empty(40, dtype=np.float32)
    _kernels_py.importance(
        index.column("importance"), index.column("flags"), index.column("access_count"),
        index.column("last_access"), index.column("timestamp"), want, NOW,
        policy.access_half_life_days * DAY, policy.access_weight,
        policy.recency_half_life_days * DAY, policy.recency_weight, policy.pin_bonus,
        fmt.FLAG_PINNED, fmt.FLAG_FORGOTTEN,
    )  # fmt: skip
    assert np.allclose(everything, want, rtol=1e-6) and np.isinf(everything[[4, 9]]).all()
    picked = np.array([39, 3, 4, 11, 0, 3])
    assert np.array_equal(importance_scores(index, policy, NOW, picked), everything[picked])
    # Row 3 by hand: base + pin bonus + recency (its access terms are checked above).
    row = index.row(3)
    access = row[9] * 2 ** (-(NOW - row[5]) / (30 * DAY))
    hand = row[7] + 0.7 * access / (1 + access) + 0.4 * 2 ** (-(NOW - row[1]) / (7 * DAY)) + 2.0
    assert abs(everything[3] - hand) < 1e-5


def test_inflections():
    assert {"camp", "camps", "camping"} <= set(retrieval.inflections("camped"))
    assert {"activity", "activities"} <= set(retrieval.inflections("Activities"))
    assert {"movie", "movies"} <= set(retrieval.inflections("movies"))
    assert {"try", "tries", "trying"} <= set(retrieval.inflections("tried"))
    assert {"plans", "planned", "planning"} <= set(retrieval.inflections("plan"))
    assert {"write", "writes"} <= set(retrieval.inflections("writing"))
    assert {"bring", "brings", "bringing"} <= set(retrieval.inflections("brought"))
    assert {"saw", "see", "seeing"} <= set(retrieval.inflections("seen")) and "seed" not in retrieval.inflections("seen")
    assert retrieval.inflections("camped")[0] == "camped"
    for word in ("bus", "v2", "naïve", "user_id", ""):  # short, not letters, not ASCII
        assert retrieval.inflections(word) == [word.lower()]


def test_content_words():
    assert content_words("What did I say about the red bicycle?") == "say about red bicycle?"
    assert content_words("Where could the keys be") == "keys"
    assert content_words("how did you do it?") == "how did you do it?"  # nothing left: all
    assert content_words("Where's Paris") == "Where's Paris"  # not a stop word with the 's


def test_type_mask_and_filters(tmp_path):
    index, _ = build(tmp_path, items_from(np.random.default_rng(3), 6, 6))
    assert type_mask(index, None) is None
    mask = type_mask(index, ["fact", "note", "missing"])
    assert mask.shape == (fmt.TYPE_CODES,) and np.flatnonzero(mask).tolist() == [3, 16]
    assert index.type_code("missing", create=False) == -1  # a filter creates no type
    where = filters(index, ["plan"], 1.0, 2.0, "a")
    assert (where.since, where.until, where.session) == (1.0, 2.0, session_hash("a"))
    assert filters(index, None, 0, 1, None).session == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), span=st.integers(0, 10),
       rows=st.lists(st.integers(0, 59), min_size=1, max_size=12))  # fmt: skip
def test_neighbour_windows_are_the_rows_near_the_found_ones_and_their_runs(n, span, rows):
    found = np.unique(np.array([r % n for r in rows], dtype=np.int64))
    near, run = retrieval._windows(found, span, n)
    expected = sorted({g + s for g in found.tolist() for s in range(-span, span + 1)} & set(range(n)))
    assert near.tolist() == expected
    # A run is consecutive rows; a new one starts after each gap.
    assert run.tolist() == np.concatenate(([0], np.cumsum(np.diff(near) != 1))).tolist()

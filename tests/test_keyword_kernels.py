"""The keyword kernels (tokenizer, BM25 top-k, postings merge): compiled == reference ==
brute force."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem._kernels import reference as ref

kw_ext = pytest.importorskip("fastmem._kernels._ext.keyword")


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def _fnv(token: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in token:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h


def test_tokenization_rules():
    text = "Hello, WORLD! naïve it's 42x café—bar 東京 a_b"
    tokens = [b"hello", b"world", "naïve".encode(), b"it", b"s", b"42x",
              "café—bar".encode(), "東京".encode(), b"a", b"b"]  # fmt: skip
    want = Counter(_fnv(t) for t in tokens)
    for tokenize in (kw_ext.tokenize_batch, ref.tokenize_batch):
        terms, docs, tf, lens = tokenize([text])
        assert dict(zip(terms.tolist(), tf.tolist())) == want
        assert terms.tolist() == sorted(want) and set(docs.tolist()) == {0}
        assert lens.tolist() == [len(tokens)]


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=80), max_size=8))
def test_tokenize_batch_matches_reference(texts):
    got = kw_ext.tokenize_batch(texts)
    want = ref.tokenize_batch(texts)
    data = [t.lower().encode() for t in texts]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    # brute force: a regular expression and a Counter per text
    for i, raw in enumerate(data):
        counts = Counter(_fnv(t) for t in re.findall(rb"[0-9a-z\x80-\xff]+", raw))
        mine = got[0][got[1] == i].tolist()
        assert mine == sorted(counts)
        assert got[2][got[1] == i].tolist() == [counts[t] for t in mine]
        assert got[3][i] == sum(counts.values())


@given(st.lists(st.lists(st.sampled_from(["a", "b", "zz", "9", "é", "Ω", "x1", "y"]), max_size=200)
                .map(" ".join), max_size=4))
def test_tokenize_batch_matches_reference_across_the_sort_switch(texts):
    """Texts of 0 to 200 words with repeats: the compiled kernel sorts up to 64 terms one
    way and more another; both give the reference's output."""
    got, want = kw_ext.tokenize_batch(texts), ref.tokenize_batch(texts)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def test_tokenize_batch_reads_each_ascii_character_as_the_rules_say():
    """Every ASCII character alone, between letters and repeated before an upper-case
    letter at a text's end: the compiled tokenizer's byte table against the reference and
    a regular expression (a token may end a text, a separator may start or end one)."""
    texts = [form.format(c=chr(c)) for c in range(128) for form in ("{c}", "a{c}B", "{c}{c}{c}Z")]
    got, want = kw_ext.tokenize_batch(texts), ref.tokenize_batch(texts)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    for i, text in enumerate(texts):
        counts = Counter(_fnv(t) for t in re.findall(rb"[0-9a-z]+", text.lower().encode()))
        assert got[0][got[1] == i].tolist() == sorted(counts)
        assert got[3][i] == sum(counts.values())


def test_tokenize_caps_tf_and_rejects_non_bytes():
    text = "A " * 70000
    for tokenize in (kw_ext.tokenize_batch, ref.tokenize_batch):
        terms, docs, tf, lens = tokenize([text])
        assert tf.tolist() == [65535] and lens.tolist() == [70000]
        with pytest.raises(TypeError):
            tokenize([b"text"])


def _csr(terms, rows, tf):
    order = np.argsort(terms, kind="stable")
    terms, rows, tf = terms[order], rows[order], tf[order]
    return terms, rows, tf


corpora = st.fixed_dictionaries({
    "docs": st.lists(st.lists(st.integers(0, 11), max_size=12), min_size=1, max_size=40),
    "split": st.floats(0, 1),
    "dead": st.lists(st.booleans(), min_size=40, max_size=40),
    "types": st.lists(st.integers(0, 3), min_size=40, max_size=40),
    "stamps": st.lists(st.integers(0, 5), min_size=40, max_size=40),
    "sessions": st.lists(st.integers(0, 2), min_size=40, max_size=40),
    "query": st.lists(st.integers(0, 13), min_size=1, max_size=4),
    "k": st.integers(1, 12),
    "want_types": st.none() | st.sets(st.integers(0, 3)),
    "since": st.none() | st.integers(0, 5),
    "until": st.none() | st.integers(0, 5),
    "session": st.integers(0, 2),
})  # fmt: skip


def _kernel_inputs(c):
    """Postings split into a base (CSR, merged by the kernel) and a tail, as the store has."""
    docs = c["docs"]
    n = len(docs)
    texts = [" ".join(f"W{t}" for t in d) for d in docs]
    terms, rows, tf, lens = kw_ext.tokenize_batch(texts)
    nb = int(c["split"] * n)
    in_base = rows < nb
    empty = (np.zeros(0, np.uint64), np.zeros(1, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.uint16))
    b = kw_ext.merge_postings(*empty, *_csr(terms[in_base], rows[in_base], tf[in_base]))
    t_terms, t_rows, t_tf = _csr(terms[~in_base], rows[~in_base], tf[~in_base])
    dead = np.array(c["dead"][:n])
    raw_len = lens | np.where(dead, np.uint32(fmt.DOC_DEAD), np.uint32(0)).astype(np.uint32)
    q = np.array(sorted({_fnv(f"w{t}".encode()) for t in c["query"]}), dtype=np.uint64)
    rows_parts, tf_parts, ranges, at = [], [], [], 0
    for term in q.tolist():
        i = np.searchsorted(b[0], term)
        a, e = (int(b[1][i]), int(b[1][i + 1])) if i < len(b[0]) and b[0][i] == term else (0, 0)
        sel = t_terms == term
        rows_parts += [b[2][a:e], t_rows[sel]]
        tf_parts += [b[3][a:e], t_tf[sel]]
        ranges.append((at, at + (e - a) + int(sel.sum())))
        at = ranges[-1][1]
    post_rows = np.concatenate(rows_parts).astype(np.uint32)
    post_tf = np.concatenate(tf_parts).astype(np.uint16)
    types = np.array(c["types"][:n], dtype=np.uint16)
    stamps = np.array(c["stamps"][:n], dtype=np.float64)
    sessions = np.array(c["sessions"][:n], dtype=np.uint64)
    allowed = None
    if c["want_types"] is not None:
        allowed = np.zeros(65536, dtype=np.uint8)
        allowed[list(c["want_types"])] = 1
    live = ~dead
    n_live = float(live.sum())
    avgdl = float(lens[live].sum()) / n_live if n_live and lens[live].sum() else 1.0
    since = -math.inf if c["since"] is None else float(c["since"])
    until = math.inf if c["until"] is None else float(c["until"])
    args = (
        post_rows, post_tf, np.array(ranges, dtype=np.int64).reshape(-1, 2),
        raw_len[:nb], raw_len[nb:], (types[:nb], stamps[:nb], sessions[:nb]),
        (types[nb:], stamps[nb:], sessions[nb:]), c["k"], allowed, since, until, c["session"],
        n_live, avgdl, 1.2, 0.75,
    )  # fmt: skip
    return args, n


def _brute_force(c):
    """BM25 straight from the definition, on the token lists."""
    docs, n = c["docs"], len(c["docs"])
    live = [not d for d in c["dead"][:n]]
    n_live = sum(live)
    tokens = sum(len(d) for d, ok in zip(docs, live) if ok)
    avgdl = tokens / n_live if n_live and tokens else 1.0
    scores = [0.0] * n
    for term in sorted(set(c["query"]), key=lambda t: _fnv(f"w{t}".encode())):
        df = sum(1 for d, ok in zip(docs, live) if ok and term in d)
        if not df:
            continue
        idf = math.log(1 + (n_live - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(term)
            if live[i] and tf:
                scores[i] += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * len(d) / avgdl))
    keep = []
    for i in range(n):
        if scores[i] <= 0:
            continue
        if c["want_types"] is not None and c["types"][i] not in c["want_types"]:
            continue
        if c["since"] is not None and c["stamps"][i] < c["since"]:
            continue
        if c["until"] is not None and c["stamps"][i] > c["until"]:
            continue
        if c["session"] and c["sessions"][i] != c["session"]:
            continue
        keep.append((-scores[i], i))
    keep.sort()
    return [i for _, i in keep[: c["k"]]], [-s for s, _ in keep[: c["k"]]]


@given(corpora)
def test_bm25_topk_matches_reference_and_brute_force(c):
    args, n = _kernel_inputs(c)
    scratch = np.zeros(n + 3, dtype=np.float64)
    got_rows, got_scores = kw_ext.bm25_topk(*args, scratch)
    assert not scratch.any()  # left zeros for the next query
    want_rows, want_scores = ref.bm25_topk(*args, np.zeros(n, dtype=np.float64))
    assert got_rows.tolist() == want_rows.tolist()
    assert got_scores.tolist() == want_scores.tolist()  # the same float64 operations
    brute_rows, brute_scores = _brute_force(c)
    assert np.allclose(got_scores, brute_scores, rtol=1e-12, atol=0)
    # Rows agree except where brute force's summation order makes a near-tie flip.
    if len(set(np.round(brute_scores, 9))) == len(brute_scores):
        assert got_rows.tolist() == brute_rows


def test_bm25_topk_rejects_postings_past_the_rows():
    args = (
        np.array([0, 5], np.uint32), np.array([1, 1], np.uint16), np.array([[0, 2]], np.int64),
        np.array([1, 1], np.uint32), np.zeros(0, np.uint32),
        (np.zeros(2, np.uint16), np.zeros(2), np.zeros(2, np.uint64)),
        (np.zeros(0, np.uint16), np.zeros(0), np.zeros(0, np.uint64)),
        10, None, -math.inf, math.inf, 0, 2.0, 1.0, 1.2, 0.75,
    )  # fmt: skip
    for kernel in (kw_ext.bm25_topk, ref.bm25_topk):
        with pytest.raises(ValueError):
            kernel(*args, np.zeros(2))
        bad_range = (*args[:2], np.array([[1, 3]], np.int64), *args[3:])
        with pytest.raises(ValueError):
            kernel(*bad_range, np.zeros(2))


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=60),
       st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=60))  # fmt: skip
def test_merge_postings_matches_reference(old, new):
    def postings(pairs, first_row):
        terms = np.array([t for t, _ in pairs], dtype=np.uint64)
        rows = np.arange(first_row, first_row + len(pairs), dtype=np.uint32)
        tf = np.array([f for _, f in pairs], dtype=np.uint16)
        return _csr(terms, rows, tf)

    empty = (np.zeros(0, np.uint64), np.zeros(1, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.uint16))
    base = kw_ext.merge_postings(*empty, *postings(old, 0))
    assert all(np.array_equal(a, b) for a, b in zip(base, ref.merge_postings(*empty, *postings(old, 0))))
    tail = postings(new, len(old))
    got = kw_ext.merge_postings(*base, *tail)
    want = ref.merge_postings(*base, *tail)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    # brute force: every (term, row, tf) once, rows ascending within a term
    terms, offsets, rows, tf = got
    triples = [(int(terms[i]), int(rows[j]), int(tf[j]))
               for i in range(len(terms)) for j in range(int(offsets[i]), int(offsets[i + 1]))]  # fmt: skip
    every = [(t, r, f) for r, (t, f) in enumerate(old + new)]
    assert triples == sorted(every)


def test_merge_postings_rejects_inconsistent_input():
    bad = (np.array([5, 3], np.uint64), np.array([0, 1, 2], np.uint64), np.zeros(2, np.uint32),
           np.ones(2, np.uint16))  # fmt: skip
    none = (np.zeros(0, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.uint16))
    for merge in (kw_ext.merge_postings, ref.merge_postings):
        with pytest.raises(ValueError):
            merge(*bad, *none)
        with pytest.raises(ValueError):
            merge(bad[0][:1], np.array([0, 3], np.uint64), *bad[2:], *none)


def _sorted_as_reference_and_brute_force(terms, rows, tf):
    """The compiled sort_postings of the postings, checked against the reference and
    against Python's sort (stable: rows keep their order within a term)."""
    got = kw_ext.sort_postings(terms, rows, tf)
    want = ref.sort_postings(terms, rows, tf)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert list(zip(*(a.tolist() for a in got))) == sorted(
        zip(terms.tolist(), rows.tolist(), tf.tolist()), key=lambda p: p[0]
    )
    return got


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 5), st.integers(1, 9)),
                max_size=300))  # fmt: skip
def test_sort_postings_matches_reference(pairs):
    terms = np.array([t for t, _ in pairs], dtype=np.uint64)
    rows = np.arange(len(pairs), dtype=np.uint32)
    tf = np.array([f for _, f in pairs], dtype=np.uint16)
    got = _sorted_as_reference_and_brute_force(terms, rows, tf)
    for sort in (kw_ext.sort_postings, ref.sort_postings):
        with pytest.raises(ValueError):
            sort(terms, rows[:-1] if len(rows) else np.zeros(1, np.uint32), tf)


@pytest.mark.parametrize("distinct", [1, 3, 700, 1_400, 6_000])
def test_sort_postings_large_matches_reference(distinct):
    # 12,000 postings (over the compiled kernel's GROUP_MIN): few distinct terms are grouped
    # in its hash table (700 and 1,400 grow it), 6,000 are more than it takes (radix sort);
    # term 0 and 2**64 - 1 are terms like any other.
    rng = np.random.default_rng(distinct)
    vocab = rng.integers(0, 2**64, distinct, dtype=np.uint64, endpoint=False)
    vocab[0], vocab[-1] = 0, 2**64 - 1
    terms = vocab[rng.integers(0, distinct, 12_000)]
    rows = rng.permutation(12_000).astype(np.uint32)  # any order: the sort keeps it
    tf = rng.integers(1, 9, 12_000).astype(np.uint16)
    got = _sorted_as_reference_and_brute_force(terms, rows, tf)
    strided = kw_ext.sort_postings(np.repeat(terms, 2)[::2], np.repeat(rows, 2)[::2], tf)
    assert all(np.array_equal(g, s) for g, s in zip(got, strided))


_NO_POSTINGS = (np.zeros(0, np.uint64), np.zeros(1, np.uint64), np.zeros(0, np.uint32),
                np.zeros(0, np.uint16))  # fmt: skip


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=60),
       st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=40), max_size=6))  # fmt: skip
def test_merge_postings_runs_matches_merging_each_run_in_turn(old, runs):
    base = kw_ext.merge_postings(*_NO_POSTINGS, *_csr(*_pairs(old, 0)))
    first, tails = len(old), []
    for pairs in runs:
        tails.append(kw_ext.sort_postings(*_pairs(pairs, first)))
        first += len(pairs)
    got = kw_ext.merge_postings_runs(*base, tails)
    want = ref.merge_postings_runs(*base, tails)
    folded = base
    for tail in tails:
        folded = kw_ext.merge_postings(*folded, *tail)
    for g, w, f in zip(got, want, folded):
        assert g.dtype == w.dtype == f.dtype and np.array_equal(g, w) and np.array_equal(g, f)
    # brute force: every (term, row, tf) once, rows ascending within a term
    terms, offsets, rows, tf = got
    triples = [(int(terms[i]), int(rows[j]), int(tf[j]))
               for i in range(len(terms)) for j in range(int(offsets[i]), int(offsets[i + 1]))]  # fmt: skip
    every = [(t, r, f) for r, (t, f) in enumerate(old + [p for run in runs for p in run])]
    assert triples == sorted(every)


def _pairs(pairs, first_row):
    terms = np.array([t for t, _ in pairs], dtype=np.uint64)
    rows = np.arange(first_row, first_row + len(pairs), dtype=np.uint32)
    tf = np.array([f for _, f in pairs], dtype=np.uint16)
    return terms, rows, tf


def test_merge_postings_runs_rejects_inconsistent_input():
    good = _NO_POSTINGS
    unsorted = (np.array([5, 3], np.uint64), np.arange(2, dtype=np.uint32), np.ones(2, np.uint16))
    short = (np.array([3], np.uint64), np.arange(2, dtype=np.uint32), np.ones(2, np.uint16))
    bad_base = (np.array([5, 3], np.uint64), np.array([0, 1, 2], np.uint64), np.zeros(2, np.uint32),
                np.ones(2, np.uint16))  # fmt: skip
    for merge in (kw_ext.merge_postings_runs, ref.merge_postings_runs):
        for base, runs in ((good, [unsorted]), (good, [short]), (bad_base, [])):
            with pytest.raises(ValueError):
                merge(*base, runs)

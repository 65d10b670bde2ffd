"""Keyword search through the store: searchable after add, reopen, crash, rebuild; filters."""

from __future__ import annotations

import math
import os
import re
import shutil
import warnings
from collections import Counter
from pathlib import Path

import pytest

import fastmem
from fastmem import _format as fmt

TEXTS = [
    ("The user's name is Ada and she lives in Lisbon.", "fact", "s1", 10.0),
    ("Flights to Lisbon in May cost 189 EUR.", "tool_result", "s1", 20.0),
    ("Plan: book the hotel in Lisbon before March.", "plan", "s2", 30.0),
    ("Ada prefers green tea over coffee.", "fact", "s2", 40.0),
    ("Weather in Porto: rain, 14 degrees.", "tool_result", None, 50.0),
    ("Naïve café talk about 東京 and Lisbon.", "conversation", None, 60.0),
]


def _add(store, rows=TEXTS):
    return store.add_many(
        [{"text": t, "type": y, "session": s, "timestamp": ts} for t, y, s, ts in rows]
    )


def _ids(store, query, **kw):
    return [h.id for h in store.search(query, mode="keyword", **kw)]


def _tokens(text):
    return re.findall(r"[0-9a-z\x80-\U0010ffff]+", text.lower())


def _brute(memories, query, k=10):
    """BM25 over (id, text) pairs, straight from the definition; ids best first."""
    docs = [(mid, Counter(_tokens(text)), len(_tokens(text))) for mid, text in memories]
    n = len(docs)
    avgdl = sum(d[2] for d in docs) / n
    scores = {}
    for term in set(_tokens(query)):
        df = sum(1 for d in docs if term in d[1])
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for mid, counts, length in docs:
            tf = counts[term]
            if tf:
                norm = tf + 1.2 * (1 - 0.75 + 0.75 * length / avgdl)
                scores[mid] = scores.get(mid, 0.0) + idf * tf * 2.2 / norm
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], int(kv[0][1:])))
    return [mid for mid, _ in ranked[:k]], dict(ranked)


def test_searchable_as_soon_as_add_returns(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        assert _ids(store, "lisbon")[0] in ids
        mid = store.add("A zebra crossed the road.")
        assert _ids(store, "ZEBRA") == [mid]


def test_scores_are_bm25(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        store.add("tea tea tea and more tea", type="fact")
        memories = [(m.id, m.text) for m in store]
        for query in ("lisbon", "ada tea", "lisbon tea hotel", "café 東京", "nothing-here"):
            want, scores = _brute(memories, query)
            hits = store.search(query, mode="keyword")
            assert [h.id for h in hits] == want, query
            for h in hits:
                assert h.score == pytest.approx(scores[h.id], rel=1e-12)
                assert h.memory.id == h.id
        assert ids


def test_filters_forget_and_k(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        assert set(_ids(store, "lisbon")) == {ids[0], ids[1], ids[2], ids[5]}
        assert set(_ids(store, "lisbon", types=["fact", "plan"])) == {ids[0], ids[2]}
        assert _ids(store, "lisbon", types=["unknown-type"]) == []
        assert set(_ids(store, "lisbon", since=15, until=30)) == {ids[1], ids[2]}
        assert set(_ids(store, "lisbon", session="s1")) == {ids[0], ids[1]}
        assert len(_ids(store, "lisbon", k=2)) == 2
        store.forget(ids[0])
        assert ids[0] not in _ids(store, "lisbon ada")
        memories = [(m.id, m.text) for m in store]
        assert _ids(store, "lisbon ada") == _brute(memories, "lisbon ada")[0]


def test_queries_without_words_find_nothing(store_path):
    with fastmem.open(store_path) as store:
        assert _ids(store, "lisbon") == []  # empty store
        _add(store)
        assert _ids(store, "") == [] and _ids(store, " ,.;!? ") == []


def test_bad_keyword_queries_raise(store_path):
    with fastmem.open(store_path) as store:
        _add(store)
        with pytest.raises(fastmem.InvalidTypeError):
            store.search([1.0, 2.0], mode="keyword")
        with pytest.raises(fastmem.InvalidInputError):
            store.search("lisbon", mode="fuzzy")
        with pytest.raises(fastmem.InvalidInputError):
            store.search("lisbon", 0, mode="keyword")
        with pytest.raises(fastmem.InvalidInputError):
            store.search("\ud800", mode="keyword")
        with pytest.raises(fastmem.InvalidTypeError):
            store.search("lisbon", mode="keyword", types="fact")


def _scored(store, query):
    return [(h.id, h.score) for h in store.search(query, mode="keyword", k=20)]


def test_same_results_after_reopen_from_the_persisted_section(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        store.forget(ids[1])
        before = {q: _scored(store, q) for q in ("lisbon", "ada tea", "porto rain")}
    raw = Path(store_path + ".idx").read_bytes()
    h = fmt.unpack_idx_header(raw, "idx")
    assert h.keyword_version == fmt.KEYWORD_VERSION and h.keyword_postings > 0
    with fastmem.open(store_path, readonly=True) as store:
        kw = store._engine.index.keyword
        assert kw.base is not None and kw.tail_n == 0  # mapped from the file, nothing replayed
        assert {q: _scored(store, q) for q in before} == before


def test_held_looks_in_the_checkpoint_and_the_memories_added_since(store_path):
    with fastmem.open(store_path) as store:
        _add(store, TEXTS[:3])
        store.checkpoint()
        _add(store, TEXTS[3:])
        kw = store._engine.index.keyword
        assert kw.n_base == 3 and kw.tail_n == 3
        words = ["Lisbon", "flights", "porto", "東京", "lisbons", "okapi", "okapi porto"]
        # In the checkpoint's section, added since, in neither; any term of a word counts.
        assert kw.held(words).tolist() == [True, True, True, True, False, False, True]
        assert kw.held([]).tolist() == []


def test_crash_before_a_checkpoint_replays_into_the_postings(store_path, tmp_path):
    crashed = str(tmp_path / "crashed")
    with fastmem.open(store_path) as store:
        first = _add(store, TEXTS[:3])
        store.checkpoint()
        later = _add(store, TEXTS[3:])
        store.forget(first[0], erase=False)  # (an erase would write a full checkpoint)
        store.flush()
        # The files as a crash would leave them: the records, and the last checkpoint.
        for ext in (".dat", ".idx"):
            shutil.copy(store_path + ext, crashed + ext)
        want = {q: _scored(store, q) for q in ("lisbon", "ada tea", "porto")}
    with fastmem.open(crashed) as store:
        assert store._engine.index.keyword.tail_n == len(later)
        assert {q: _scored(store, q) for q in want} == want
        assert first[0] not in _ids(store, "ada")


def test_rebuilt_index_searches_the_same(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        store.forget(ids[2])
        want = {q: _scored(store, q) for q in ("lisbon", "ada tea", "hotel")}
    os.remove(store_path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        store = fastmem.open(store_path)
    with store:
        assert {q: _scored(store, q) for q in want} == want


def test_reader_follows_a_writer(store_path):
    with fastmem.open(store_path) as writer:
        _add(writer, TEXTS[:2])
        writer.flush()
        with fastmem.open(store_path, readonly=True) as reader:
            assert len(_ids(reader, "lisbon")) == 2
            mid = writer.add("An okapi is a relative of the giraffe.")
            writer.flush()
            assert _ids(reader, "okapi") == [mid]
            writer.forget(mid)
            writer.checkpoint()
            assert _ids(reader, "okapi giraffe") == []
            assert _scored(reader, "lisbon") == _scored(writer, "lisbon")


def test_index_without_postings_builds_them_in_the_background(store_path):
    with fastmem.open(store_path) as store:
        ids = _add(store)
        store.forget(ids[3])
        want = {q: _scored(store, q) for q in ("lisbon", "ada tea")}
    _strip_keyword_section(store_path + ".idx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid index: no rebuild, no warning
        store = fastmem.open(store_path)
    with store:
        assert store._engine.index.keyword._builder is not None
        store.add("Lisbon again, for the tail.")
        store.forget(ids[4])
        memories = [(m.id, m.text) for m in store]
        for query in ("lisbon", "ada tea", "porto"):
            want_ids, scores = _brute(memories, query)
            hits = store.search(query, mode="keyword")
            assert [h.id for h in hits] == want_ids
            assert [h.score for h in hits] == pytest.approx([scores[i] for i in want_ids], rel=1e-12)
        want = {q: _scored(store, q) for q in want}
    with fastmem.open(store_path, readonly=True) as store:
        assert fmt.unpack_idx_header(Path(store_path + ".idx").read_bytes(), "").keyword_version
        assert {q: _scored(store, q) for q in want} == want


def _strip_keyword_section(path):
    """Make ``path`` an index as written before the keyword section existed."""
    raw = Path(path).read_bytes()
    h = fmt.unpack_idx_header(raw, path)
    end = fmt.header_layout(h).hot + h.hot_len
    old = h._replace(keyword_version=0, keyword_terms=0, keyword_postings=0, keyword_live_tokens=0)
    Path(path).write_bytes(fmt.pack_idx_header(old) + raw[fmt.IDX_HEADER_SIZE : end])


def test_damaged_postings_raise_a_fastmem_error(store_path):
    with fastmem.open(store_path) as store:
        _add(store)
    path = store_path + ".idx"
    raw = bytearray(Path(path).read_bytes())
    h = fmt.unpack_idx_header(raw, path)
    kw = fmt.header_layout(h).keyword
    raw[kw.rows : kw.tf] = b"\xff" * (kw.tf - kw.rows)  # every posting points past the rows
    Path(path).write_bytes(raw)
    with fastmem.open(store_path, readonly=True) as store:
        with pytest.raises(fastmem.CorruptIndexError):
            store.search("lisbon", mode="keyword")

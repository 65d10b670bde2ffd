"""KeywordIndex.add's few-rows path (one add caught up with) against its general path:
the same token counts, live token count and postings for any sequence of adds; and the
numbering of the texts from the first row that tokenize does for it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem._kernels import reference as ref
from fastmem.storage import keyword_index as _keyword

WORDS = ["ada", "lisbon", "tea", "Tea", "é", "東京", "x1", "it's", "", "  ", "9 9 9"]
texts = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)
# A batch of rows: each a text and whether it is forgotten; sizes on both sides of the limit.
batches = st.lists(st.lists(st.tuples(texts, st.booleans()), min_size=1,
                            max_size=_keyword._FEW_ROWS + 3), max_size=12)  # fmt: skip


def _added(
    batches: list[list[tuple[str, bool]]], few_rows: int, premade: bool
) -> _keyword.KeywordIndex:
    kw = _keyword.KeywordIndex()
    limit = _keyword._FEW_ROWS
    _keyword._FEW_ROWS = few_rows
    try:
        for batch in batches:
            batch_texts = [t for t, _ in batch]
            dead = np.array([d for _, d in batch], dtype=bool)
            tokens = _keyword.tokenize(batch_texts) if premade else None
            kw.add(kw.n_base + kw.tail_n, batch_texts, dead, tokens)
    finally:
        _keyword._FEW_ROWS = limit
    return kw


@settings(max_examples=200, deadline=None)
@given(batches, st.booleans())
def test_few_rows_path_keeps_the_same_postings_as_the_general_path(batches, premade):
    few = _added(batches, _keyword._FEW_ROWS, premade)
    general = _added(batches, 0, premade)
    assert few.tail_n == general.tail_n == sum(len(b) for b in batches)
    assert few.tail_len[: few.tail_n].tolist() == general.tail_len[: general.tail_n].tolist()
    assert few.live_tokens == general.live_tokens
    expected_live = sum(
        int(_keyword.tokenize([t])[3][0]) for b in batches for t, dead in b if not dead
    )
    assert few.live_tokens == expected_live
    for a, b in zip(few.tail_postings(), general.tail_postings()):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
    a, b = few.section(), general.section()
    for name in ("terms", "offsets", "rows", "tf", "doc_len"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name


def test_one_forgotten_row_counts_no_tokens():
    kw = _keyword.KeywordIndex()
    kw.add(0, ["ada drinks tea"], np.array([True]))
    kw.add(1, ["ada"], np.array([False]))
    assert kw.live_tokens == 1
    assert kw.tail_len[:2].tolist() == [3 | fmt.DOC_DEAD, 1]
    _, rows, _ = kw.tail_postings()
    assert sorted(rows.tolist()) == [0, 0, 0, 1]


@given(st.lists(texts, max_size=6), st.integers(0, 2**32 - 7))
def test_tokenize_numbers_the_texts_from_first_in_both_kernels(batch, first):
    kw_ext = pytest.importorskip("fastmem._kernels._ext.keyword")
    from_zero = ref.tokenize_batch(batch)
    for fn in (kw_ext.tokenize_batch, ref.tokenize_batch):
        terms, docs, tf, lens = fn(batch, first)
        assert docs.dtype == np.uint32
        assert docs.tolist() == [first + d for d in from_zero[1].tolist()]
        for got, want in zip((terms, tf, lens), (from_zero[0], from_zero[2], from_zero[3])):
            assert got.dtype == want.dtype and got.tolist() == want.tolist()

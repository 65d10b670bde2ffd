"""Vector search through the store: the int8 scan over a reopened base (whose scale
column the first scan copies) and the tail, forgets after that copy, exact rescoring."""

from __future__ import annotations

import functools
import operator

import numpy as np

import fastmem
from fastmem._kernels import reference as _kernels_py
from fastmem.recall import vector_search as _vsearch


def _unit(rng, n, dim):
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_search_after_reopen_forget_and_add_equals_brute_force(store_path):
    rng = np.random.default_rng(11)
    dim, n = 24, 3000
    vecs = _unit(rng, n + 200, dim)
    half = _kernels_py.to_half(vecs)[0].view(np.float16).astype(np.float64)
    with fastmem.open(store_path) as store:
        store.add_many({"text": f"t{i}", "embedding": vecs[i], "timestamp": float(i)} for i in range(n))
    forgotten: set[int] = set()

    def brute(q, k, count, keep=lambda i: True):
        qn = q.astype(np.float64) / np.linalg.norm(q.astype(np.float64))
        scores = sorted((-(half[i] @ qn), i) for i in range(count) if i not in forgotten and keep(i))
        return [f"m{i}" for _, i in scores[:k]], qn

    with fastmem.open(store_path) as store:
        index = store._engine.index
        assert index.n_base == n and index.base_scales is None
        q = vecs[7] + 0.2 * _unit(rng, 1, dim)[0]
        want, qn = brute(q, 10, n)
        hits = store.search(q, 10, mode="vector")
        assert [h.id for h in hits] == want
        # The exact cosine: float16 * float64 products summed in order (a left fold: since
        # CPython 3.12 the built-in sum() of floats is compensated and can differ by an ulp).
        assert [h.score for h in hits] == [
            functools.reduce(operator.add, (half[int(h.id[1:])] * qn).tolist(), 0.0) for h in hits
        ]
        # The first scan left the base's scales contiguous; later scans read that copy.
        assert np.array_equal(index.base_scales, index.base_rows["scale"])
        for h in hits[:3]:  # forgotten after the copy: the flags are still read
            store.forget(h.id)
            forgotten.add(int(h.id[1:]))
        assert [h.id for h in store.search(q, 10, mode="vector")] == brute(q, 10, n)[0]
        store.add_many({"text": f"t{i}", "embedding": vecs[i], "timestamp": float(i)}
                       for i in range(n, n + 200))  # fmt: skip
        q = vecs[n + 5] + 0.2 * _unit(rng, 1, dim)[0]  # hits from the tail and the base
        assert [h.id for h in store.search(q, 10, mode="vector")] == brute(q, 10, n + 200)[0]
        got = [h.id for h in store.search(q, 7, mode="vector", since=2000, until=3100)]
        assert got == brute(q, 7, n + 200, lambda i: 2000 <= i <= 3100)[0]
    with fastmem.open(store_path, readonly=True) as reader:
        assert [h.id for h in reader.search(q, 10, mode="vector")] == brute(q, 10, n + 200)[0]


def test_candidate_count():
    assert _vsearch.candidate_count(10, 1_000_000) == 72
    assert _vsearch.candidate_count(10, 50) == 50

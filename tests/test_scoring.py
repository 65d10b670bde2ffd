"""The importance kernel against its numpy reference and a plain-Python brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastmem._kernels import reference as ref

scoring = pytest.importorskip("fastmem._kernels._ext.scoring")

PINNED, FORGOTTEN = 2, 1


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def _columns(n, seed):
    rng = np.random.default_rng(seed)
    now = 1.7e9
    base = rng.random(n, dtype=np.float32)
    flags = rng.integers(0, 8, n).astype(np.uint16)
    count = np.where(rng.random(n) < 0.5, 0, rng.integers(0, 1000, n)).astype(np.uint32)
    last = now - rng.exponential(86400 * 30, n) + np.where(rng.random(n) < 0.1, 3600.0, 0.0)
    ts = now - rng.exponential(86400 * 60, n) + np.where(rng.random(n) < 0.1, 7200.0, 0.0)
    return base, flags, count, last, ts, now


def _brute(base, flags, count, last, ts, now, params):
    a_hl, a_w, r_hl, r_w, pin = params
    out = []
    for i in range(len(base)):
        if flags[i] & FORGOTTEN:
            out.append(-math.inf)
            continue
        s = float(base[i])
        if count[i]:
            d = int(count[i]) * 2.0 ** (-max(0.0, now - last[i]) / a_hl)
            s += a_w * d / (1 + d)
        s += r_w * 2.0 ** (-max(0.0, now - ts[i]) / r_hl)
        s += pin if flags[i] & PINNED else 0.0
        out.append(s)
    return np.array(out, dtype=np.float32)


@given(
    st.integers(0, 300),
    st.integers(0, 2**32),
    st.tuples(
        st.floats(60, 1e9), st.floats(0, 2), st.floats(60, 1e9), st.floats(0, 2), st.floats(0, 5)
    ),
)
def test_importance_matches_reference_and_brute_force(n, seed, params):
    base, flags, count, last, ts, now = _columns(n, seed)
    expected = _brute(base, flags, count, last, ts, now, params)
    for kernel in (scoring.importance, ref.importance):
        out = np.full(n, np.nan, dtype=np.float32)
        kernel(base, flags, count, last, ts, out, now, *params, PINNED, FORGOTTEN)
        np.testing.assert_allclose(out, expected, rtol=2e-7, atol=1e-7)
        assert np.array_equal(np.isneginf(out), (flags & FORGOTTEN) != 0)


def test_importance_orders_by_each_component():
    """More accesses, a later access, a newer memory and a pin each raise the score."""
    now = 1.7e9
    base = np.full(5, 0.5, dtype=np.float32)
    flags = np.array([0, 0, 0, 0, PINNED], dtype=np.uint16)
    count = np.array([1, 5, 5, 0, 0], dtype=np.uint32)
    last = np.array([now, now, now - 86400 * 90, 0, 0])
    ts = np.array([now - 1e7, now - 1e7, now - 1e7, now, now - 1e7])
    for kernel in (scoring.importance, ref.importance):
        out = np.empty(5, dtype=np.float32)
        kernel(base, flags, count, last, ts, out, now, 86400 * 30, 0.5, 86400 * 7, 0.3, 1.0,
               PINNED, FORGOTTEN)  # fmt: skip
        assert out[1] > out[0] > out[2] > base[0]  # more accesses > fewer > long ago
        assert out[3] > out[2]  # new
        assert out[4] > 1.4  # pinned


@pytest.mark.parametrize("kernel", [scoring.importance, ref.importance])
def test_importance_validates(kernel):
    base = np.zeros(3, dtype=np.float32)
    cols = (np.zeros(3, np.uint16), np.zeros(3, np.uint32), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError):
        kernel(base, *cols, np.zeros(2, np.float32), 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 2, 1)
    with pytest.raises(ValueError):
        kernel(base, *cols, np.zeros(3, np.float32), 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 2, 1)


def test_importance_threads_match_one_thread_and_reference():
    """Enough rows for the chunks shared by threads, as strided columns of index rows."""
    from fastmem import _format as fmt

    n = 300_000
    base, flags, count, last, ts, now = _columns(n, 9)
    rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
    rows["importance"], rows["flags"], rows["access_count"] = base, flags, count
    rows["last_access"], rows["timestamp"] = last, ts
    cols = (rows["importance"], rows["flags"], rows["access_count"], rows["last_access"],
            rows["timestamp"])  # fmt: skip
    params = (86400.0 * 7, 0.5, 86400.0 * 30, 0.3, 1.0, PINNED, FORGOTTEN)
    whole = np.full(n, np.nan, dtype=np.float32)
    old = scoring._set_min_threaded_rows(0)
    try:
        scoring.importance(*cols, whole, now, *params)
    finally:
        scoring._set_min_threaded_rows(old)
    pieces = np.full(n, np.nan, dtype=np.float32)
    for a in range(0, n, 1000):  # small calls: one thread each
        scoring.importance(*(c[a : a + 1000] for c in cols), pieces[a : a + 1000], now, *params)
    assert np.array_equal(whole, pieces)
    want = np.full(n, np.nan, dtype=np.float32)
    ref.importance(*cols, want, now, *params)
    np.testing.assert_allclose(whole, want, rtol=2e-7, atol=1e-7)

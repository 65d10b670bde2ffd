"""The keyword search's reference kernels (the test oracle of ``fastmem._kernels._ext.keyword``): a
text's terms, BM25 over the postings, and the postings' merge and sort. Each has the same
signature and results as its compiled twin; ``fastmem._kernels.reference`` hands them on."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

import numpy as np

_TOKEN = re.compile(rb"[0-9a-z\x80-\xff]+")
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


@functools.lru_cache(maxsize=1 << 16)
def fnv1a64(token: bytes) -> int:
    """64-bit FNV-1a hash of ``token``: a keyword term."""
    h = _FNV_OFFSET
    for byte in token:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    return h


def tokenize_batch(
    texts: list[str], first: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The terms of texts (rules: ``fastmem.storage.keyword_index``).

    A token is a maximal run of bytes in ``[0-9a-z]`` or ``>= 0x80`` of
    ``text.lower().encode()`` (UTF-8); its term is
    ``fnv1a64(token)``. Returns ``(terms u64, docs u32, tf u16, doc_len u32)``: one entry per
    distinct term of each text, by text then ascending term, ``tf`` its count (capped at
    65535), and ``doc_len[i]`` the number of tokens of text ``i``; a text's ``docs`` entries
    are ``first + i`` (the row of text ``i``, when ``first`` is the first text's).
    """
    if not isinstance(texts, list) or any(type(t) is not str for t in texts):
        raise TypeError("tokenize_batch takes a list of str")
    terms: list[int] = []
    docs: list[int] = []
    tfs: list[int] = []
    lens = []
    for i, text in enumerate(texts):
        tokens = _TOKEN.findall(text.lower().encode())
        lens.append(len(tokens))
        for term, count in sorted(Counter(fnv1a64(t) for t in tokens).items()):
            terms.append(term)
            docs.append(first + i)
            tfs.append(min(count, 65535))
    return (
        np.array(terms, dtype=np.uint64),
        np.array(docs, dtype=np.uint32),
        np.array(tfs, dtype=np.uint16),
        np.array(lens, dtype=np.uint32),
    )


DEAD = 0x80000000  # top bit of a doc_len entry: the row is forgotten


def bm25_topk(
    post_rows: np.ndarray,
    post_tf: np.ndarray,
    ranges: np.ndarray,
    base_len: np.ndarray,
    tail_len: np.ndarray,
    base_cols: tuple[np.ndarray, np.ndarray, np.ndarray],
    tail_cols: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int,
    type_allowed: np.ndarray | None,
    since: float,
    until: float,
    session: int,
    n_live: float,
    avgdl: float,
    k1: float,
    b: float,
    scratch: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Filtered Okapi BM25 top-k over the postings of the query's terms.

    Query term ``j``'s postings are ``post_rows/post_tf[ranges[j, 0]:ranges[j, 1]]`` (global
    rows, each at most once per term). ``base_len`` and ``tail_len`` are the token counts
    of rows ``[0, nb)`` and ``[nb, nb + len(tail_len))``, with ``DEAD`` set on forgotten
    rows; ``base_cols``/``tail_cols`` are their ``(types, timestamps, sessions)``, read
    only for the filters. Forgotten rows and postings with ``tf == 0`` do not count. For
    term ``j`` with ``df`` such rows::

        idf = ln(1 + (n_live - df + 0.5) / (df + 0.5))
        score(row) += idf * (tf * (k1 + 1)) / (tf + k1 * (1 - b + b * doc_len / avgdl))

    summed over the terms in order (float64). Rows with a positive score that pass the
    filters (as ``topk_int8``'s: ``since <= timestamp <= until``, ``session`` 0 = any,
    ``type_allowed[type]``) are ranked by score, ties to the lower row. ``scratch`` (float64,
    at least one entry per row, zeros) is the compiled kernel's accumulator; it is left zeros.

    Returns ``(rows int64, scores float64)``, best first, at most ``k`` of each.

    Raises:
        ValueError: a range or a posting's row is out of bounds.
    """
    raw_len = np.concatenate([base_len, tail_len]).astype(np.int64)
    n = len(raw_len)
    if len(scratch) < n:
        raise ValueError("scratch is shorter than the rows")
    total = 0
    for a, e in ranges.tolist():
        if a < 0 or e < a or e > len(post_rows):
            raise ValueError("a posting range is out of bounds")
        total += e - a
        if e > a and int(post_rows[a:e].max()) >= n:
            raise ValueError("a posting points past the rows")
    if total == 0 or k <= 0 or n_live <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    dead = (raw_len & DEAD) != 0
    doc_len = (raw_len & (DEAD - 1)).astype(np.float64)
    scores = np.zeros(n, dtype=np.float64)
    for a, e in ranges.tolist():
        rows = post_rows[a:e].astype(np.int64)
        tf = post_tf[a:e].astype(np.float64)
        keep = (tf != 0) & ~dead[rows]
        rows, tf = rows[keep], tf[keep]
        df = len(rows)
        if df == 0:
            continue
        idf = math.log(1.0 + (n_live - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * doc_len[rows] / avgdl)
        scores[rows] += idf * (tf * (k1 + 1.0)) / (tf + norm)
    mask = scores > 0
    types, stamps, sessions = (np.concatenate([c, d]) for c, d in zip(base_cols, tail_cols))
    if not (math.isinf(since) and since < 0):
        mask &= stamps >= since
    if not (math.isinf(until) and until > 0):
        mask &= stamps <= until
    if session:
        mask &= sessions == session
    if type_allowed is not None:
        mask &= type_allowed[types].astype(bool)
    rows = np.nonzero(mask)[0]
    best = np.lexsort((rows, -scores[rows]))[:k]
    return rows[best].astype(np.int64), scores[rows[best]]


def merge_postings(
    b_terms: np.ndarray,
    b_offsets: np.ndarray,
    b_rows: np.ndarray,
    b_tf: np.ndarray,
    t_terms: np.ndarray,
    t_rows: np.ndarray,
    t_tf: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge postings in CSR form (``b_*``: ascending distinct terms, offsets, rows, tf)
    with postings given one per entry (``t_*``, sorted by term), which come after them:
    returns the merged CSR ``(terms u64, offsets u64, rows u32, tf u16)``, each term's base
    postings first.

    Raises:
        ValueError: the inputs are inconsistent or out of order.
    """
    nt = len(b_terms)
    if len(b_offsets) != nt + 1 or len(b_tf) != len(b_rows) or not len(t_rows) == len(t_tf) == len(t_terms):
        raise ValueError("postings arrays have inconsistent lengths")
    counts = np.diff(b_offsets.astype(np.int64)).astype(np.int64)
    if b_offsets[0] != 0 or b_offsets[-1] != len(b_rows):
        raise ValueError("the posting offsets do not span the postings")
    if (counts < 0).any() or (b_terms[1:] <= b_terms[:-1]).any():
        raise ValueError("the posting offsets or terms are out of order")
    if (t_terms[1:] < t_terms[:-1]).any():
        raise ValueError("the new postings are not sorted by term")
    every = np.concatenate([np.repeat(b_terms.astype(np.uint64), counts), t_terms.astype(np.uint64)])
    order = np.argsort(every, kind="stable")  # base postings before new ones of a term
    every = every[order]
    rows = np.concatenate([b_rows, t_rows]).astype(np.uint32)[order]
    tf = np.concatenate([b_tf, t_tf]).astype(np.uint16)[order]
    terms, starts = np.unique(every, return_index=True)
    offsets = np.append(starts, len(every)).astype(np.uint64)
    return terms.astype(np.uint64), offsets, rows, tf


def merge_postings_runs(
    b_terms: np.ndarray,
    b_offsets: np.ndarray,
    b_rows: np.ndarray,
    b_tf: np.ndarray,
    runs: list[tuple[np.ndarray, ...]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``merge_postings`` of the base and each run in turn (runs sorted by term, each
    after the one before it): each term's base postings first, then each run's in order.

    Raises:
        ValueError: the inputs are inconsistent or out of order.
    """
    merged = (b_terms, b_offsets, b_rows, b_tf)
    for run in runs or [(np.zeros(0, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.uint16))]:
        merged = merge_postings(*merged, *run)
    return merged


def sort_postings(
    terms: np.ndarray, rows: np.ndarray, tf: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Postings sorted by term, stably (rows keep their order within a term): copies
    ``(terms u64, rows u32, tf u16)``.

    Raises:
        ValueError: the arrays differ in length.
    """
    if not len(terms) == len(rows) == len(tf):
        raise ValueError("postings arrays have inconsistent lengths")
    order = np.argsort(terms, kind="stable")
    return (terms[order].astype(np.uint64), rows[order].astype(np.uint32),
            tf[order].astype(np.uint16))  # fmt: skip

"""Keyword search: BM25 over the memories' text, from postings kept in the index file.

Tokenization (the same for memories and queries):

1. ``text.lower()`` (Python's Unicode lowercasing), encoded as UTF-8;
2. a token is a maximal run of ASCII digits and letters ``[0-9a-z]`` or of bytes
   ``>= 0x80`` (so words in any non-ASCII script survive whole, together with any
   non-ASCII punctuation touching them: ``"naïve"`` is one token, ``"it's"`` two);
   every other ASCII byte separates tokens;
3. a term is the 64-bit FNV-1a hash of the token's bytes. There is no stemming and no
   stop-word list here: BM25's idf already makes words that occur everywhere count for
   little, and a query made only of such words still finds something. (The hybrid
   ranking drops question and function words from its query first:
   ``fastmem._stopwords`` says where each list applies; and it looks up a query word
   that no posting holds by its inflections, ``ranking.inflected``.)

A memory's token count (its BM25 document length) counts every token, repeats included;
a repeated query word counts once.

Scoring is Okapi BM25 with ``k1 = 1.2``, ``b = 0.75`` and Lucene's non-negative idf
``ln(1 + (N - df + 0.5) / (df + 0.5))``, where ``N`` is the number of live memories,
``df`` the live memories holding the term and the average length is over live memories
(``fastmem._kernels.reference.bm25_topk`` has the formula).

Where the postings live: the last checkpoint's postings are a section of the ``.idx``
file (term hashes, offsets, rows, term frequencies, token counts; ``docs/format.md``),
mapped lazily like the other sections. Memories added since (by ``add`` or replayed from
``.dat`` at open) are tokenized as they are applied, into in-memory runs; the next
checkpoint merges them into the section. An index written before the section existed is
given its postings by a background thread started at open (opening does not wait; a
keyword search waits for it), and the next checkpoint persists them.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np

from .. import _format as fmt
from .. import _kernels
from ..errors import CorruptIndexError, CorruptionError

K1 = 1.2
B = 0.75
# New postings wait, unsorted, until a search needs them or there are this many; then
# they are sorted into a run. Runs below SMALL_RUN postings are merged as in a binary
# counter (single adds make many tiny runs); bigger ones stay apart until the checkpoint
# sorts the whole tail once, so add_many never re-sorts what it already sorted.
_PENDING_POSTINGS = 1 << 20
_PENDING_BATCHES = 1024
_SMALL_RUN = 1 << 20
_FEW_ROWS = 8  # KeywordIndex.add takes this many rows or fewer without numpy's masks
_U64 = np.zeros(0, dtype=np.uint64)
_U32 = np.zeros(0, dtype=np.uint32)
_U16 = np.zeros(0, dtype=np.uint16)


def tokenize(
    texts: list[str], first: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(terms, docs, tf, doc_len)`` of ``texts`` (see the module docstring); ``docs``
    count from ``first``."""
    return _kernels.tokenize_batch(texts, first)


def query_terms(text: str) -> np.ndarray:
    """The distinct terms of a query, ascending."""
    return tokenize([text])[0]


def _empty_section(n_rows: int = 0) -> fmt.KeywordSection:
    return fmt.KeywordSection(_U64, np.zeros(1, dtype=np.uint64), _U32, _U16,
                              np.zeros(n_rows, dtype=np.uint32))  # fmt: skip


def _sorted_run(terms: np.ndarray, rows: np.ndarray, tf: np.ndarray) -> tuple[np.ndarray, ...]:
    """Postings sorted by term; rows stay ascending within a term (the sort is stable)."""
    return _kernels.sort_postings(terms, rows, tf)


class KeywordIndex:
    """Postings of a ``MemoryIndex``: the checkpoint's section plus in-memory runs."""

    def __init__(self) -> None:
        self.n_base = 0
        self.base: fmt.KeywordSection | None = _empty_section()
        self.live_tokens = 0  # token count of the live rows
        self._builder: threading.Thread | None = None
        self._build_error: BaseException | None = None
        self.tail_len = _U32.copy()  # doc_len of the rows after the base (DOC_DEAD = forgotten)
        self.tail_n = 0
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_postings = 0
        self._runs: list[tuple[np.ndarray, ...]] = []  # sorted by term; older rows first
        self._scratch = np.zeros(0, dtype=np.float64)
        # Orders the builder's last step against forget/add in the store's thread.
        self._lock = threading.Lock()

    # --- loading -----------------------------------------------------------------------

    @classmethod
    def from_section(cls, section: fmt.KeywordSection, live_tokens: int) -> KeywordIndex:
        kw = cls()
        kw.n_base = len(section.doc_len)
        kw.base = section
        kw.live_tokens = live_tokens
        return kw

    def load_tail(
        self, doc_len: np.ndarray, run: tuple[np.ndarray, np.ndarray, np.ndarray], live_tokens: int
    ) -> None:
        """Take the rows after the base as an index file's delta holds them: their token
        counts and their postings (one run sorted by term), as views of its map."""
        self.tail_len, self.tail_n = doc_len, len(doc_len)
        self._runs = [run] if len(run[0]) else []
        self.live_tokens = live_tokens

    def mark_dead(self, rows: np.ndarray) -> None:
        """Base ``rows`` are forgotten (a delta's changed rows, applied to the base)."""
        if len(rows) and self.base is not None:
            self.base.doc_len[rows] |= np.uint32(fmt.DOC_DEAD)

    @classmethod
    def build_in_background(
        cls, base_rows: np.ndarray, dat: Any, path: str
    ) -> KeywordIndex:
        """Postings for a base written without them, tokenized from its records by a
        thread; ``wait()`` joins it."""
        kw = cls()
        kw.n_base = len(base_rows)
        kw.base = None
        kw._builder = threading.Thread(
            target=kw._build, args=(base_rows, dat, path), name="fastmem-keyword", daemon=True
        )
        kw._builder.start()
        return kw

    def _build(self, base_rows: np.ndarray, dat: Any, path: str) -> None:
        try:
            n = len(base_rows)
            offsets = base_rows["offset"].tolist()
            lengths = base_rows["length"].tolist()
            runs, doc_len = [], np.zeros(n, dtype=np.uint32)
            step = 8192
            for first in range(0, n, step):
                texts = []
                for off, length in zip(offsets[first : first + step], lengths[first : first + step]):
                    try:
                        text = fmt.read_record(dat, off, off + length, path)[1].get("x")
                    except CorruptionError:
                        text = None  # verify() reports the record; it has no words here
                    texts.append(text if isinstance(text, str) else "")
                terms, docs, tf, lens = tokenize(texts)
                runs.append((terms, docs + np.uint32(first), tf))
                doc_len[first : first + len(lens)] = lens
            terms = np.concatenate([r[0] for r in runs]) if runs else _U64
            rows = np.concatenate([r[1] for r in runs]) if runs else _U32
            tf = np.concatenate([r[2] for r in runs]) if runs else _U16
            terms, rows, tf = _sorted_run(terms, rows, tf)
            empty = _empty_section()
            t, o, r, f = _kernels.merge_postings(
                empty.terms, empty.offsets, empty.rows, empty.tf, terms, rows, tf
            )
            with self._lock:  # a forget sets the flags first, then takes this lock
                dead = (base_rows["flags"] & fmt.FLAG_FORGOTTEN) != 0
                live_tokens = int(doc_len[~dead].sum(dtype=np.uint64))
                doc_len[dead] |= np.uint32(fmt.DOC_DEAD)
                self.live_tokens += live_tokens  # rows added meanwhile counted theirs
                self.base = fmt.KeywordSection(t, o, r, f, doc_len)
        except BaseException as exc:  # reported by the search that waits for it
            self._build_error = exc

    def wait(self) -> fmt.KeywordSection:
        """The base postings, once the background build (if any) has finished.

        Raises:
            CorruptIndexError: the build failed.
        """
        if self._builder is not None:
            self._builder.join()
        if self.base is None:
            raise CorruptIndexError(
                f"building the keyword postings failed ({self._build_error!r}); "
                f"delete the .idx file to rebuild the index"
            )
        return self.base

    def delta_ready(self) -> bool:
        """Whether the base postings are a mapped section (a delta can be written over
        them): not built in the background."""
        return self._builder is None and self.base is not None

    @property
    def built_unsaved(self) -> bool:
        """Postings built in the background are ready, and no checkpoint holds them yet."""
        return self._builder is not None and self.base is not None

    def frozen(self) -> KeywordIndex:
        """A copy of the postings so far, for a checkpoint written by a thread while rows
        are added here (``fastmem.storage.checkpoint``): the runs are shared (a run is never
        changed in place, only replaced), the token counts are a view of the rows so far."""
        self._consolidate()
        kw = copy.copy(self)
        kw._runs, kw._pending, kw._lock = list(self._runs), [], threading.Lock()
        kw.tail_len = self.tail_len[: self.tail_n]
        return kw

    def continue_from(self, older: KeywordIndex, first: int) -> None:
        """Take ``older``'s rows from global row ``first`` on (this index's base, loaded
        from a checkpoint, holds the rows before): their token counts and postings."""
        start = first - older.n_base
        self.tail_len = older.tail_len[start : older.tail_n].copy()
        self.tail_n = older.tail_n - start
        self._pending, self._pending_postings = list(older._pending), older._pending_postings
        self._runs = []
        for run in older._runs:  # a run frozen for the checkpoint, or merged with one, is cut
            if len(run[1]) and int(run[1].min()) < first:
                keep = run[1] >= first
                run = tuple(part[keep] for part in run)
            if len(run[0]):
                self._runs.append(run)
        self.live_tokens = older.live_tokens

    # --- changes -----------------------------------------------------------------------

    def add(
        self, first_row: int, texts: list[str], forgotten: np.ndarray,
        tokens: tuple[np.ndarray, ...] | None = None,
    ) -> None:  # fmt: skip
        """Tokenize the texts of rows ``first_row, first_row + 1, ...`` (the next rows);
        ``tokens``: :func:`tokenize` of them, made before (it is consumed)."""
        assert first_row == self.n_base + self.tail_n
        # Tokenized here: the rows numbered as they are tokenized (no pass to offset them).
        terms, rows, tf, lens = tokenize(texts, first_row) if tokens is None else tokens
        if tokens is not None:
            rows = rows + np.uint32(first_row)
        end = self.tail_n + len(texts)
        if end > len(self.tail_len):
            grown = np.zeros(max(end, 2 * len(self.tail_len), 64), dtype=np.uint32)
            grown[: self.tail_n] = self.tail_len[: self.tail_n]
            self.tail_len = grown
        if len(texts) <= _FEW_ROWS:
            self._add_few(terms, rows, tf, lens, forgotten)
            return
        with self._lock:
            self.live_tokens += int(lens[~forgotten].sum(dtype=np.uint64))
        lens[forgotten] |= np.uint32(fmt.DOC_DEAD)
        self.tail_len[self.tail_n : end] = lens
        self.tail_n = end
        if len(terms):
            self._pending.append((terms, rows, tf))
            self._pending_postings += len(terms)
            if self._pending_postings >= _PENDING_POSTINGS or len(self._pending) >= _PENDING_BATCHES:
                self._consolidate()

    def _add_few(
        self, terms: np.ndarray, rows: np.ndarray, tf: np.ndarray, lens: np.ndarray,
        forgotten: np.ndarray,
    ) -> None:  # fmt: skip
        """:meth:`add` of a few rows (one, usually: another process's ``add`` caught up
        with, a single ``add``): the same token counts and postings, with Python ints where
        the general path makes a numpy call for each step (each ~1 µs, several µs on the
        cold caches a read after a wait finds)."""
        counts, dead_rows, live, at = lens.tolist(), forgotten.tolist(), 0, self.tail_n
        for count, dead in zip(counts, dead_rows):
            if dead:
                self.tail_len[at] = count | fmt.DOC_DEAD
            else:
                live += count
                self.tail_len[at] = count
            at += 1
        with self._lock:
            self.live_tokens += live
        self.tail_n = at
        if len(terms):
            self._pending.append((terms, rows, tf))
            self._pending_postings += len(terms)
            if self._pending_postings >= _PENDING_POSTINGS or len(self._pending) >= _PENDING_BATCHES:
                self._consolidate()

    def forget(self, g: int) -> None:
        """Row ``g`` is forgotten: it no longer counts for N, df or the average length."""
        with self._lock:
            if g >= self.n_base:
                lens, i = self.tail_len, g - self.n_base
            elif self.base is not None:
                lens, i = self.base.doc_len, g
            else:  # the builder reads the flags last, and the caller has set them
                return
            if not lens[i] & fmt.DOC_DEAD:
                self.live_tokens -= int(lens[i])
                lens[i] |= np.uint32(fmt.DOC_DEAD)
                if self.live_tokens < 0:  # a damaged header's count: the rows' own counts hold
                    self.live_tokens = self._counted_live_tokens()

    def erase(self, rows: np.ndarray) -> None:
        """Drop every posting of ``rows`` (forgotten already) and set their token counts to
        0 (forgotten): an erased memory's words are in no copy of the index, as in one
        rebuilt from the data file, whose records no longer hold them (fastmem.storage.erase)."""
        base = self.wait()
        self._consolidate()
        rows = np.asarray(rows, dtype=np.uint32)
        with self._lock:
            in_base, in_tail = rows[rows < self.n_base], rows[rows >= self.n_base]
            if len(in_base):
                base.doc_len[in_base] = np.uint32(fmt.DOC_DEAD)
                keep = ~np.isin(base.rows, in_base)
                if not keep.all():
                    counts = np.diff(base.offsets).astype(np.intp)
                    term_of = np.repeat(np.arange(len(base.terms)), counts)
                    kept = np.bincount(term_of[keep], minlength=len(base.terms))
                    offsets = np.zeros(int(np.count_nonzero(kept)) + 1, dtype=base.offsets.dtype)
                    np.cumsum(kept[kept > 0], out=offsets[1:])
                    self.base = fmt.KeywordSection(base.terms[kept > 0], offsets, base.rows[keep],
                                                   base.tf[keep], base.doc_len)  # fmt: skip
            if len(in_tail):
                self.tail_len[in_tail - np.uint32(self.n_base)] = np.uint32(fmt.DOC_DEAD)
                runs = []
                for run in self._runs:  # replaced, never changed in place (see frozen)
                    keep = ~np.isin(run[1], in_tail)
                    run = run if keep.all() else tuple(part[keep] for part in run)
                    if len(run[0]):
                        runs.append(run)
                self._runs = runs

    def _counted_live_tokens(self) -> int:
        """The live rows' token count, summed from each row's (``live_tokens`` keeps it)."""
        parts = [self.tail_len[: self.tail_n]] + ([self.base.doc_len] if self.base is not None else [])
        return sum(int(d[(d & np.uint32(fmt.DOC_DEAD)) == 0].sum(dtype=np.uint64)) for d in parts)

    def _consolidate(self) -> None:
        """Sort the pending postings into a run; small runs are merged as in a binary
        counter (each at most half the size of the one before it), so there are few."""
        if not self._pending:
            return
        parts = self._pending
        run = _sorted_run(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
        self._pending, self._pending_postings = [], 0
        while (
            self._runs
            and len(self._runs[-1][0]) < _SMALL_RUN
            and len(self._runs[-1][0]) <= 2 * len(run[0])
        ):
            older = self._runs.pop()
            # Stable: the older run's rows stay first within a term.
            run = _sorted_run(*(np.concatenate([a, b]) for a, b in zip(older, run)))
        self._runs.append(run)

    def tail_postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every posting added since the checkpoint, as one run sorted by term."""
        self._consolidate()
        if len(self._runs) > 1:  # runs hold consecutive rows: concatenated, rows ascend
            self._runs = [_sorted_run(*(np.concatenate(parts) for parts in zip(*self._runs)))]
        return self._runs[0] if self._runs else (_U64, _U32, _U16)  # type: ignore[return-value]

    def section(self) -> fmt.KeywordSection:
        """The base and the tail merged, for a checkpoint (waits for a background build).

        The tail's runs are merged into the base in one pass (they hold consecutive rows,
        older first, so each term's rows stay ascending): the same postings as sorting the
        runs into one first, without that sort's copies of every new posting (the peak of
        a 1 M store's first checkpoint: issue 21), and without moving the postings merged
        so far again for each run, as merging the runs one after another did."""
        base = self.wait()
        self._consolidate()
        try:
            terms, offsets, rows, tf = _kernels.merge_postings_runs(
                base.terms, base.offsets, base.rows, base.tf, self._runs
            )
        except ValueError as exc:
            raise CorruptIndexError(f"the keyword postings are damaged ({exc})") from None
        doc_len = np.concatenate([base.doc_len, self.tail_len[: self.tail_n]])
        return fmt.KeywordSection(terms, offsets, rows, tf, doc_len)

    # --- search ------------------------------------------------------------------------

    def held(self, words: list[str]) -> np.ndarray:
        """For each of ``words``, whether any posting holds one of its terms (a forgotten
        memory's postings count too: such a word is then only not looked up by its other
        inflections, as the hybrid ranking does for a query word that no posting holds,
        ``ranking.inflected``)."""
        terms, word_of, _, _ = tokenize(words)
        out = np.zeros(len(words), dtype=bool)
        for known in (self.wait().terms, self.tail_postings()[0]):
            if len(known) and len(terms):
                at = np.minimum(np.searchsorted(known, terms), len(known) - 1)
                out[word_of[known[at] == terms]] = True
        return out

    def search(
        self,
        index: Any,
        text: str,
        k: int,
        type_allowed: np.ndarray | None,
        since: float,
        until: float,
        session: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-``k`` global rows of ``index`` for ``text`` and their scores, best first
        (ties: the lower row), among live rows passing the filters (as vector search's).

        Raises:
            CorruptIndexError: the postings are damaged.
        """
        base = self.wait()
        terms = query_terms(text)
        n = self.n_base + self.tail_n
        if not len(terms) or not index.live or not n:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        t_terms, t_rows, t_tf = self.tail_postings()
        bt = base.terms
        b_lo = np.searchsorted(bt, terms, "left")
        b_hi = np.searchsorted(bt, terms, "right")  # 0 or 1 entries: terms are distinct
        b_start = np.where(b_hi > b_lo, base.offsets[np.minimum(b_lo, len(bt))], 0).astype(np.int64)
        b_end = np.where(b_hi > b_lo, base.offsets[np.minimum(b_lo + 1, len(bt))], 0).astype(np.int64)
        if ((b_start < 0) | (b_end < b_start) | (b_end > len(base.rows))).any():
            # Damaged offsets (a u64 past int64 wraps negative): refuse them here, before the
            # tail's postings are merged in Python, as the kernel refuses them otherwise.
            raise CorruptIndexError(
                "the keyword postings' offsets are damaged; delete the .idx file to rebuild it"
            )
        t_lo = np.searchsorted(t_terms, terms, "left").astype(np.int64)
        t_hi = np.searchsorted(t_terms, terms, "right").astype(np.int64)
        if not (t_hi > t_lo).any():  # nothing new matches: the mapped postings as they are
            post_rows, post_tf = base.rows, base.tf
            ranges = np.stack([b_start, b_end], axis=1)
        else:
            rows_parts, tf_parts, ranges_l, at = [], [], [], 0
            for j in range(len(terms)):
                a, e, c, d = int(b_start[j]), int(b_end[j]), int(t_lo[j]), int(t_hi[j])
                rows_parts += [base.rows[a:e], t_rows[c:d]]
                tf_parts += [base.tf[a:e], t_tf[c:d]]
                ranges_l.append((at, at + (e - a) + (d - c)))
                at += (e - a) + (d - c)
            post_rows = np.concatenate(rows_parts).astype(np.uint32, copy=False)
            post_tf = np.concatenate(tf_parts).astype(np.uint16, copy=False)
            ranges = np.array(ranges_l, dtype=np.int64).reshape(-1, 2)
        if len(self._scratch) < n:
            self._scratch = np.zeros(max(n, 2 * len(self._scratch)), dtype=np.float64)
        base_rows, tail_rows = index.base_rows, index.tail.rows[: index.tail.n]
        cols = ("type", "timestamp", "session")
        avgdl = self.live_tokens / index.live if self.live_tokens > 0 else 1.0
        try:
            rows, scores = _kernels.bm25_topk(
                post_rows, post_tf, np.ascontiguousarray(ranges), base.doc_len,
                self.tail_len[: self.tail_n], tuple(base_rows[c] for c in cols),
                tuple(tail_rows[c] for c in cols), k, type_allowed, since, until, session,
                float(index.live), avgdl, K1, B, self._scratch,
            )  # fmt: skip
        except ValueError as exc:
            raise CorruptIndexError(
                f"the keyword postings are damaged ({exc}); delete the .idx file to rebuild it"
            ) from None
        in_base = rows[rows < index.n_base]  # a damaged section may mark a forgotten row live
        if len(in_base):
            if (base_rows["flags"][in_base] & fmt.FLAG_FORGOTTEN).any():
                raise CorruptIndexError(
                    "the keyword section lists a forgotten memory as live; delete the .idx "
                    "file to rebuild it"
                )
        return rows, scores

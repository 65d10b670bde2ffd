"""Prototype (issue 20, item 1): BEAM dev recall when a long memory is found by its passages.

    PYTHONPATH=. python benchmarks/passages_proto.py --variant base|mean|first|max|max-excerpt \
        [--data ../shared/data/beam-dev] [--cache DIR] [--out FILE]

Every message is split into passages of at most 254 wordpieces (``--split``: ``balanced``,
sentence and line ends, about equal lengths; ``greedy``, each as long as fits; ``cut``, only
the first 254 wordpieces, today's vector) and each passage is embedded by the default
int8 MiniLM from its token ids ([CLS] + passage + [SEP]); the vectors are kept in ``--cache``.

- ``base``: the store as today (a long message's vector is of its first 256 wordpieces).
- ``mean``: variant (a), no format change: each message is added with the normalised mean
  of its passages' vectors (a message that fits has its one vector, as today).
- ``first``: the control for ``max``: the same patched search over a side matrix holding only
  each message's first passage (what today's vector sees, in float32 rather than int8).
- ``max``: variant (b): the base store, and the vector side of ``retrieval.rank`` (its
  candidates and its cosines) replaced by a side matrix of every passage's vector, passage ->
  message row; a message scores as its best passage.
- ``paired``: no context: each variant measured so far against ``base``, question by
  question, with a bootstrap interval (:func:`paired`).
- ``vectors``: no context: the vector side alone (:func:`vector_only`).
- ``max-excerpt``: ``max``, and a long message that the context cuts shows its best passage
  by vector (with "…" marks) instead of the keyword excerpt.

The patches live in this script only: a measurement, not the design.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import fastmem
from fastmem.recall import packing as context_mod
from fastmem.recall import ranking as retrieval
from fastmem.embed import MAX_TOKENS, ONNX_MODEL_DIR, default_embedder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam import DEFAULT_DATA, SHORT, load, norm, run_fastmem
from locomo import store_for, table

LIMIT = MAX_TOKENS - 2  # the wordpieces of a passage, [CLS] and [SEP] aside (the model's window)

# A passage may start where a sentence ends (. ! ? or … and a space) or after a line break.
_BREAK = re.compile(r"(?<=[.!?\u2026])\s+|\s*\n\s*")


def split(text: str, offsets: Sequence[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """The balanced split: token ranges ``[a, b)`` that cover the ``len(offsets)`` tokens
    of ``text`` in order, each at most ``limit`` tokens long. ``offsets[i]`` is token ``i``'s character span in
    ``text`` (the text's own tokens, no special tokens).

    A text of at most ``limit`` tokens is one range. A longer one is cut into
    ``ceil(n / limit)`` ranges or a few more: each cut at the sentence or line end nearest
    to an equal share of what is left, at least a quarter of ``limit`` after the previous
    cut (no scraps), and at the last word start within ``limit`` tokens where no sentence
    ends in reach.

    >>> split("One two. Three four.", [(0, 3), (4, 7), (7, 8), (9, 14), (15, 19), (19, 20)], 4)
    [(0, 3), (3, 6)]
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    n = len(offsets)
    if n <= limit:
        return [(0, n)]
    starts = [a for a, _ in offsets]
    cuts = sorted({bisect_left(starts, m.end()) for m in _BREAK.finditer(text)} - {0, n})
    out = []
    at = 0
    while n - at > limit:
        share = (n - at) / math.ceil((n - at) / limit)
        lo = bisect_left(cuts, at + max(1, limit // 4))
        hi = bisect_right(cuts, at + limit)
        if lo < hi:
            end = min(cuts[lo:hi], key=lambda c: (abs(c - at - share), c))
        else:  # one long sentence: at the last word start in reach
            end = at + limit
            while end > at + 1 and offsets[end][0] == offsets[end - 1][1]:
                end -= 1
            if end == at + 1:  # a single word of over ``limit`` wordpieces
                end = at + limit
        out.append((at, end))
        at = end
    out.append((at, n))
    return out


class Side:
    """One conversation's passages: vectors (float32, unit), owner row of each, char spans."""

    def __init__(self, vectors: np.ndarray, owner: np.ndarray, spans: np.ndarray, texts: list[str]):
        self.vectors, self.owner, self.spans, self.texts = vectors, owner, spans, texts
        self.starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        self.row_of = {t: i for i, t in enumerate(texts)}
        self.query: np.ndarray | None = None

    def scores(self, query: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        self.query = q
        return np.maximum.reduceat(self.vectors @ q, self.starts)

    def first_only(self) -> Side:
        return Side(
            self.vectors[self.starts], self.owner[self.starts], self.spans[self.starts], self.texts
        )


def greedy(text: str, offsets, limit: int) -> list[tuple[int, int]]:
    """Each passage as long as fits, cut at the last sentence end in reach (else at ``limit``)."""
    n = len(offsets)
    starts = [a for a, _ in offsets]
    cuts = sorted({bisect_left(starts, m.end()) for m in _BREAK.finditer(text)} - {0, n})
    out, at = [], 0
    while n - at > limit:
        hi = bisect_right(cuts, at + limit)
        end = cuts[hi - 1] if hi and cuts[hi - 1] > at else at + limit
        out.append((at, end))
        at = end
    return out + [(at, n)]


SPLITS = {
    "balanced": split,
    "greedy": greedy,
    "cut": lambda text, offsets, limit: [(0, min(len(offsets), limit))],  # today's vector
}


def passages_of(texts: list[str], tokenizer, embedder, how: str) -> tuple[Side, float, float]:
    """A conversation's passages, and the seconds taken to embed them and to embed the texts
    as today (cut at 256 wordpieces), for the write cost."""
    ids, owner, spans = [], [], []
    for row, text in enumerate(texts):
        enc = tokenizer.encode(text)
        offsets = enc.offsets[1:-1]
        body = enc.ids[1:-1]
        for a, b in SPLITS[how](text, offsets, LIMIT):
            ids.append([enc.ids[0], *body[a:b], enc.ids[-1]])
            owner.append(row)
            spans.append((offsets[a][0], offsets[b - 1][1]))
    started = time.perf_counter()
    vectors = embedder._encode_ids(ids)
    passage_s = time.perf_counter() - started
    started = time.perf_counter()
    if how == "balanced":  # once is enough for the write cost
        embedder.encode(texts)
    today_s = time.perf_counter() - started
    return Side(vectors, np.array(owner), np.array(spans), texts), passage_s, today_s


CURRENT: dict[str, Side | None] = {"side": None}


def patch_search(sides: dict[str, Side], excerpts: bool) -> None:
    real_open = fastmem.open

    def opened(path, *args, **kwargs):  # which conversation's side matrix the search uses
        CURRENT["side"] = sides.get(Path(str(path)).name)
        return real_open(path, *args, **kwargs)

    def candidates(index, query, k, where):
        s = CURRENT["side"].scores(query)
        best = np.lexsort((np.arange(len(s)), -s))[:k]
        return best.astype(np.int64), s[best]

    def cosines(index, rows, query):
        return CURRENT["side"].scores(query)[rows]

    fastmem.open = opened
    retrieval._vector_candidates = candidates
    retrieval._cosines = cosines
    if excerpts:
        keyword_excerpt = context_mod.excerpt

        def best_passage(text, terms, max_tokens, count, truncate):
            side = CURRENT["side"]
            row = side.row_of.get(text)
            if row is None or side.query is None:
                return keyword_excerpt(text, terms, max_tokens, count, truncate)
            at = np.flatnonzero(side.owner == row)
            i = at[int(np.argmax(side.vectors[at] @ side.query))]
            a, b = side.spans[i]
            head = text[: text.index(": ") + 2] if a > 0 and ": " in text[:40] else ""
            out = head + ("… " if a > 0 else "") + text[a:b] + (" …" if b < len(text) else "")
            if count(out) > max_tokens:
                out = truncate(out, max(0, max_tokens - 2)).rstrip() + " …"
            return out if count(out) <= max_tokens else None

        context_mod.excerpt = best_passage


def shown(convs: list, budget: int, cache: str, tokenizer) -> tuple[float, float, list[float]]:
    """Of the gold messages over 256 wordpieces: the share in the context whole, and the share
    there whole or as an excerpt (which the measure does not credit: only whole texts count);
    and each question's recall, in order (for :func:`paired`)."""
    import tempfile

    whole, present, recall = [], [], []
    for name, msgs, qs in convs:
        with (
            tempfile.TemporaryDirectory() as tmp,
            fastmem.open(store_for(f"conv{name}", msgs, tmp, cache)) as store,
        ):
            store._embedder.wait()
            long = {
                m["metadata"]["id"]
                for m in msgs
                if len(tokenizer.encode(m["text"]).ids) > MAX_TOKENS
            }
            for question, _, ids in qs:
                ctx = store.context(question, budget=budget)
                text = norm(ctx.text)
                got = {store.get(item.id).metadata["id"] for item in ctx.items}
                texts = [norm(m["text"]) for m in msgs if m["metadata"]["id"] in ids]
                recall.append(sum(t in text for t in texts) / len(ids))
                for i in ids:
                    if i in long:
                        whole.append(
                            norm(next(m["text"] for m in msgs if m["metadata"]["id"] == i)) in text
                        )
                        present.append(i in got)
    return float(np.mean(whole)), float(np.mean(present)), recall


def paired(cache: Path) -> list[str]:
    """Each measured variant against today, and (b) against its control, question by
    question: the mean difference and a 95% bootstrap interval over the questions (10,000
    resamples, seed 0)."""
    runs = {
        f.stem[len("per-question-") :]: np.array(json.loads(f.read_text()))
        for f in sorted(cache.glob("per-question-*.json"))
    }
    pairs = [(name, "base-balanced") for name in runs if name != "base-balanced"]
    pairs += [(name, "first-cut") for name in ("max-balanced", "max-excerpt-balanced")]
    out = []
    for name, against in pairs:
        if name not in runs or against not in runs:
            continue
        diff = runs[name] - runs[against]
        picks = np.random.default_rng(0).integers(0, len(diff), size=(10_000, len(diff)))
        lo, hi = np.percentile(diff[picks].mean(axis=1), [2.5, 97.5])
        out.append(
            f"{name} against {against}: {diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]; "
            f"{int((diff > 0).sum())} questions up, {int((diff < 0).sum())} down"
        )
    return out


def vector_only(convs: list, cache: Path, embedder, k: int = 20) -> list[str]:
    """The vector side alone, before fusion and packing: the share of gold messages among the
    ``k`` best messages by cosine, gold that fits in 256 wordpieces apart from longer gold,
    and the share of those ``k`` taken by long messages; today's vector (``cut``), the mean
    of the balanced passages, and their max. Needs the ``cut`` and ``balanced`` caches."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, msgs, qs in convs:
        cut = np.load(cache / f"passages-cut-{name}.npz")["vectors"]
        z = np.load(cache / f"passages-balanced-{name}.npz")
        side = Side(z["vectors"], z["owner"], z["spans"], [m["text"] for m in msgs])
        long = np.diff(np.r_[side.starts, len(side.owner)]) > 1
        mean = np.add.reduceat(side.vectors, side.starts)
        mean /= np.linalg.norm(mean, axis=1, keepdims=True)
        row = {m["metadata"]["id"]: i for i, m in enumerate(msgs)}
        for question, _, ids in qs:
            q = embedder.encode_query(question)
            for how, s in (("today", cut @ q), ("mean", mean @ q), ("max", side.scores(q))):
                top = set(np.argsort(-s)[:k].tolist())
                d = out.setdefault(how, {"short": [], "long": [], "crowd": []})
                d["crowd"].append(float(np.mean([long[i] for i in top])))
                for i in ids:
                    d["long" if long[row[i]] else "short"].append(row[i] in top)
    return [
        f"{how}: gold in the vector top {k}: fitting {np.mean(d['short']):.3f} "
        f"(n={len(d['short'])}), longer {np.mean(d['long']):.3f} (n={len(d['long'])}); "
        f"long messages take {np.mean(d['crowd']):.3f} of the top {k}"
        for how, d in out.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variant",
        required=True,
        choices=("base", "mean", "first", "max", "max-excerpt", "vectors", "paired"),
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--budget", type=int, default=1300)
    parser.add_argument("--split", default="balanced", choices=tuple(SPLITS))
    parser.add_argument("--cache", default="/tmp/passages-cache")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    convs = load(Path(args.data))
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ONNX_MODEL_DIR / "tokenizer.json"))
    tokenizer.no_truncation()
    embedder = default_embedder()
    embedder.wait()
    sides: dict[str, Side] = {}
    cost = []
    for name, msgs, _ in convs:
        texts = [m["text"] for m in msgs]
        file = cache / f"passages-{args.split}-{name}.npz"
        if file.exists():
            z = np.load(file)
            sides[f"conv{name}"] = Side(z["vectors"], z["owner"], z["spans"], texts)
            cost.append(json.loads(str(z["cost"])))
        else:
            side, passage_s, today_s = passages_of(texts, tokenizer, embedder, args.split)
            c = {
                "messages": len(texts),
                "passages": len(side.owner),
                "passage_s": passage_s,
                "today_s": today_s,
            }
            np.savez(
                file, vectors=side.vectors, owner=side.owner, spans=side.spans, cost=json.dumps(c)
            )
            sides[f"conv{name}"] = side
            cost.append(c)
    if args.variant == "paired":
        print("\n".join(paired(cache)))
        return
    if args.variant == "vectors":
        print("\n".join(vector_only(convs, cache, embedder)))
        return
    store_cache = str(cache / (f"mean-{args.split}" if args.variant == "mean" else "base"))
    if args.variant == "mean":
        for name, msgs, _ in convs:
            side = sides[f"conv{name}"]
            sums = np.add.reduceat(side.vectors, side.starts)
            sums /= np.linalg.norm(sums, axis=1, keepdims=True)
            for m, vec in zip(msgs, sums):
                m["embedding"] = vec
    elif args.variant in ("first", "max", "max-excerpt"):
        use = {k: s.first_only() if args.variant == "first" else s for k, s in sides.items()}
        patch_search(use, args.variant == "max-excerpt")
    result = run_fastmem(convs, args.budget, store_cache)
    long_whole, long_present, per_question = shown(convs, args.budget, store_cache, tokenizer)
    (cache / f"per-question-{args.variant}-{args.split}.json").write_text(json.dumps(per_question))
    n_msg = sum(c["messages"] for c in cost)
    lines = [
        (
            f"variant {args.variant}, {args.split} passages: BEAM dev ({len(convs)} conversations, {n_msg} messages, "
            f"{sum(c['passages'] for c in cost)} passages), budget {args.budget}"
        ),
        "",
        *table({"fastmem": result}, list(result["by_category"]), SHORT),
        "",
        (
            f"contexts: mean {result['mean_tokens']:.0f} tokens, largest {result['max_tokens']}, "
            f"{result['over_budget']} over budget; gold share {100 * result['gold_share']:.0f}%; "
            f"context() p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms"
        ),
        (
            f"gold messages over 256 wordpieces: {long_whole:.3f} in the context whole, "
            f"{long_present:.3f} whole or as an excerpt"
        ),
        (
            f"embedding (int8 MiniLM, {embedder.threads} threads): every passage "
            f"{sum(c['passage_s'] for c in cost):.1f} s, today's cut texts {sum(c['today_s'] for c in cost):.1f} s "
            f"({1e3 * sum(c['passage_s'] for c in cost) / n_msg:.1f} vs "
            f"{1e3 * sum(c['today_s'] for c in cost) / n_msg:.1f} ms per message)"
        ),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(result), file=sys.stderr)


if __name__ == "__main__":
    main()

"""LoCoMo retrieval: recall of evidence turns within a 1,300-token context.

    python benchmarks/locomo.py [--data ../shared/data/locomo-dev.json] [--budget 1300]
                                [--baselines] [--cache DIR] [--out benchmarks/RESULTS-locomo.md]

The measure of ``shared/data/README.md``: each conversation goes into a fresh store, one
memory per turn (text ``"<speaker>: <text>"``, the session's date as timestamp, the session
as session, the ``dia_id`` in metadata). For every question of categories 1-4 with evidence,
``store.context(question, budget)`` is built; an evidence turn counts as recalled when its
whole text is in the context's text. Reports mean recall overall and per category, the
largest context (tokens, exact cl100k_base; never above the budget) and context latency.

``--baselines`` also measures, on the same turns and tokenizer, the plain baselines of the
data README packed greedily in rank order (whole turns, one per line): recency, MiniLM
cosine, BM25 (rank-bm25) and their reciprocal-rank fusion.

``--cache DIR`` keeps the built stores and copies them afresh for each run (access counts
never leak between runs).

``--interleave`` puts each conversation in a store with the next one (the last with the
first), written at once as two agents writing to one store do: their turns alternate, each
with its own session (named after its conversation) and timestamp. Each conversation's
questions are asked of its store.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import fastmem
from fastmem.embed import MiniLM, default_embedder

HERE = Path(__file__).resolve().parent
# fastmem.open's options for every store these benchmarks open (``--embedder``).
STORE_OPTIONS: dict[str, object] = {}
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "locomo-dev.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def session_keys(conversation: dict) -> list[str]:
    keys = [k for k in conversation if re.fullmatch(r"session_\d+", k)]
    return sorted(keys, key=lambda k: int(k.split("_")[1]))


def session_time(text: str) -> float:
    """'1:56 pm on 8 May, 2023' -> Unix seconds (UTC)."""
    when = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    return when.replace(tzinfo=timezone.utc).timestamp()


def turns_of(sample: dict) -> list[dict]:
    conv = sample["conversation"]
    out = []
    for key in session_keys(conv):
        start = session_time(conv[f"{key}_date_time"])
        for i, turn in enumerate(conv[key]):
            out.append({
                "text": f"{turn['speaker']}: {turn['text']}",
                "timestamp": start + 60.0 * i,  # a minute per turn keeps them in order
                "session": key.replace("_", " "),
                "metadata": {"dia_id": turn["dia_id"]},
            })  # fmt: skip
    return out


def evidence_ids(qa: dict, known: set[str]) -> list[str]:
    """The question's evidence ids that exist ("D8:6; D9:17" and "D:11:26" included)."""
    out = set()
    for entry in qa.get("evidence", []):
        for part in re.split(r"[;,\s]+", entry):
            m = re.fullmatch(r"D:?(\d+):(\d+)", part.strip())
            if m and f"D{m.group(1)}:{m.group(2)}" in known:
                out.add(f"D{m.group(1)}:{m.group(2)}")
    return sorted(out)


def questions(sample: dict, known: set[str]) -> list[tuple[str, int, list[str]]]:
    out = []
    for qa in sample["qa"]:
        if qa.get("category") in CATEGORIES:
            ids = evidence_ids(qa, known)
            if ids:
                out.append((qa["question"], qa["category"], ids))
    return out


def store_for(name: str, items: list[dict], tmp: str, cache: str) -> str:
    """A fresh store of ``items`` in ``tmp``: built there, or copied from ``cache`` (where
    it is built under ``name`` the first time)."""
    path = os.path.join(tmp, name)
    if cache:
        src = os.path.join(cache, name)
        if not os.path.exists(src + ".idx"):
            os.makedirs(cache, exist_ok=True)
            with fastmem.open(src, durability="none", **STORE_OPTIONS) as store:
                store.add_many(items)
        for ext in (".dat", ".idx"):
            shutil.copyfile(src + ext, path + ext)
    else:
        with fastmem.open(path, durability="none", **STORE_OPTIONS) as store:
            store.add_many(items)
    return path


def interleaved(first: dict, second: dict) -> list[dict]:
    """The turns of two conversations written at once (``--interleave``): alternating, each
    conversation's sessions named after it."""
    a, b = ([{**t, "session": f"{s['sample_id']} {t['session']}"} for t in turns_of(s)]
            for s in (first, second))  # fmt: skip
    out = [t for pair in zip(a, b) for t in pair]
    return out + a[len(b):] + b[len(a):]


def run_fastmem(data: list[dict], budget: int, cache: str = "", policy: object = None,
                interleave: bool = False) -> dict:  # fmt: skip
    """fastmem as a user runs it: the default embedder, a store per conversation (with
    ``interleave``, a store per conversation and the next, their turns alternating)."""
    recalls: dict[int, list[float]] = {c: [] for c in CATEGORIES}
    latencies, max_tokens, over = [], 0, 0
    each: dict[str, list] = {}  # "<sample>#<n>" -> [category, recall] (paired comparisons)
    for j, sample in enumerate(data):
        turns = turns_of(sample)
        text_of = {t["metadata"]["dia_id"]: t["text"] for t in turns}
        name = sample["sample_id"]
        if interleave:
            other = data[(j + 1) % len(data)]
            turns, name = interleaved(sample, other), f"{name}+{other['sample_id']}"
        with tempfile.TemporaryDirectory() as tmp:
            path = store_for(name, turns, tmp, cache)
            kwargs = {} if policy is None else {"policy": policy}
            with fastmem.open(path, **kwargs, **STORE_OPTIONS) as store:  # as after a restart
                _wait_ready(store)
                for n, (question, category, ids) in enumerate(questions(sample, set(text_of))):
                    started = time.perf_counter()
                    ctx = store.context(question, budget=budget)
                    latencies.append(time.perf_counter() - started)
                    max_tokens = max(max_tokens, ctx.tokens)
                    over += ctx.tokens > budget
                    recalls[category].append(
                        sum(text_of[i] in ctx.text for i in ids) / len(ids)
                    )
                    each[f"{sample['sample_id']}#{n}"] = [CATEGORIES[category], recalls[category][-1]]
    every = [r for rs in recalls.values() for r in rs]
    return {
        "recall": statistics.fmean(every),
        "by_category": {CATEGORIES[c]: statistics.fmean(r) for c, r in recalls.items() if r},
        "questions": len(every),
        "max_tokens": max_tokens,
        "over_budget": over,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p95_ms": 1e3 * float(np.percentile(latencies, 95)),
        "per_question": each,
    }


def _wait_ready(store: fastmem.MemoryStore) -> None:
    wait = getattr(store._embedder, "wait", None)
    if wait is not None:
        wait()  # recall is measured at full quality; degraded contexts are another figure


def plain_rankings(cosines: np.ndarray, bm25: np.ndarray) -> dict[str, list[int]]:
    """The plain baselines' orders of the memories: recency (newest first), cosine, BM25,
    and the reciprocal-rank fusion (k = 60) of the two."""
    cos = np.argsort(-cosines, kind="stable").tolist()
    kw = np.argsort(-bm25, kind="stable").tolist()
    fused: dict[int, float] = {}
    for ranking in (cos, kw):
        for rank, i in enumerate(ranking, 1):
            fused[i] = fused.get(i, 0.0) + 1.0 / (60 + rank)
    return {
        "recency": list(range(len(cos) - 1, -1, -1)),
        "cosine": cos,
        "bm25": kw,
        "rrf": sorted(fused, key=lambda i: -fused[i]),
    }


def run_baselines(data: list[dict], budget: int, embedder: MiniLM) -> dict[str, dict]:
    from rank_bm25 import BM25Okapi

    from fastmem.tokens import TokenCounter

    count = TokenCounter().count
    token = re.compile(r"[0-9a-z\x80-\uffff]+")
    names = ("recency", "cosine", "bm25", "rrf")
    recalls: dict[str, dict[int, list[float]]] = {n: {c: [] for c in CATEGORIES} for n in names}
    for sample in data:
        turns = turns_of(sample)
        texts = [t["text"] for t in turns]
        where = {t["metadata"]["dia_id"]: i for i, t in enumerate(turns)}
        cost = [count(t) + 1 for t in texts]
        vectors = embedder.encode(texts)
        bm25 = BM25Okapi([token.findall(t.lower()) for t in texts])
        for question, category, ids in questions(sample, set(where)):
            orders = plain_rankings(embedder.encode_query(question) @ vectors.T,
                                    bm25.get_scores(token.findall(question.lower())))  # fmt: skip
            for name, order in orders.items():
                used, chosen = 0, set()
                for i in order:
                    if used + cost[i] <= budget:
                        chosen.add(int(i))
                        used += cost[i]
                recalls[name][category].append(sum(where[e] in chosen for e in ids) / len(ids))
    return {
        name: {
            "recall": statistics.fmean([r for rs in by.values() for r in rs]),
            "by_category": {CATEGORIES[c]: statistics.fmean(r) for c, r in by.items() if r},
        }
        for name, by in recalls.items()
    }


def table(result: dict[str, dict], cats: list[str], short: dict[str, str] | None = None) -> list[str]:
    """A markdown table: a row per method, its recall overall and per category."""
    heads = [short.get(c, c) for c in cats] if short else cats
    lines = ["| method | recall | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(cats)]
    for name, r in result.items():
        row = " | ".join(f"{r['by_category'].get(c, float('nan')):.3f}" for c in cats)
        lines.append(f"| {name} | {r['recall']:.3f} | {row} |")
    return lines


def publish(report: str, result: dict, out: str, script: str) -> None:
    """Print the report (and write it to ``out`` with the command that made it); the raw
    figures go to stderr as JSON."""
    print(report)
    if out:
        Path(out).write_text(
            f"{report}\n\nCommand: `python benchmarks/{script} --baselines --out {out}`\n"
        )
    json.dump(result, sys.stderr, indent=1)


def arguments(doc: str, default_data: Path, interleave: bool = False) -> argparse.Namespace:
    """The command line both recall benchmarks take (``doc``: the script's docstring;
    ``interleave``: this one's ``--interleave`` too)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--data", default=str(default_data))
    parser.add_argument("--budget", type=int, default=1300)
    parser.add_argument("--baselines", action="store_true")
    parser.add_argument("--cache", default="", help="keep built stores here between runs")
    parser.add_argument("--out", default="")
    parser.add_argument("--per-question", default="",
                        help="write each question's recall here (JSON), for paired comparisons")
    parser.add_argument("--against", default="",
                        help="a --per-question file: the paired bootstrap of this run against it")
    parser.add_argument("--policy", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ContextPolicy field other than its default (repeatable)")
    parser.add_argument("--embedder", default="", metavar="MODULE:NAME",
                        help="another embedder: NAME() from MODULE (importable), for every store "
                             "(use a --cache of its own)")
    if interleave:
        parser.add_argument("--interleave", action="store_true",
                            help="each conversation in a store with the next, turns alternating")
    return parser.parse_args()


def use_embedder(spec: str) -> None:
    """Open every store with ``--embedder MODULE:NAME``'s embedder, ``NAME()`` from ``MODULE``
    (the default embedder when ``spec`` is empty)."""
    if spec:
        module, _, name = spec.partition(":")
        STORE_OPTIONS["embedder"] = getattr(importlib.import_module(module), name)()


def policy_of(settings: list[str]) -> object:
    """The ContextPolicy of ``--policy FIELD=VALUE`` settings (None: the default)."""
    if not settings:
        return None
    values = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        values[name] = json.loads(value)
    return fastmem.ContextPolicy(**values)


def save_per_question(path: str, result: dict, against: str = "") -> None:
    """Write fastmem's per-question recalls (``--per-question``), print the paired
    comparison with ``against`` when given, and drop them from the printed figures."""
    each = result["fastmem"].pop("per_question")
    if path:
        Path(path).write_text(json.dumps(each))
    if against:
        print(paired(json.loads(Path(against).read_text()), each), file=sys.stderr)


def paired(base: dict, new: dict, resamples: int = 10_000, seed: int = 0) -> str:
    """The mean difference in recall of ``new`` against ``base`` question by question (the
    questions both answered), its 95% bootstrap interval (``resamples`` resamples of the
    questions, ``seed``), the questions up and down; then the same per category."""
    rng = np.random.default_rng(seed)
    keys = sorted(set(base) & set(new))
    cats = sorted({base[k][0] for k in keys})
    lines = []
    for cat in [None, *cats]:
        ks = [k for k in keys if cat is None or base[k][0] == cat]
        d = np.array([new[k][1] - base[k][1] for k in ks])
        means = d[rng.integers(0, len(d), (resamples, len(d)))].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        lines.append(f"paired {cat or 'all'} ({len(d)}): {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]"
                     f" up {int((d > 0).sum())} / down {int((d < 0).sum())}")
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__, DEFAULT_DATA, interleave=True)
    use_embedder(args.embedder)
    data = json.loads(Path(args.data).read_text())
    result = {"fastmem": run_fastmem(data, args.budget, args.cache, policy_of(args.policy),
                                     args.interleave)}  # fmt: skip
    save_per_question(args.per_question, result, args.against)
    if args.baselines:
        result.update(run_baselines(data, args.budget, default_embedder()))
    title = (
        f"LoCoMo evidence recall within {args.budget} tokens — {len(data)} conversations of "
        f"{Path(args.data).name}, {result['fastmem']['questions']} questions"
        + (", each conversation's turns alternating with the next one's in its store"
           if args.interleave else "")
    )  # fmt: skip
    lines = [title, "", *table(result, list(CATEGORIES.values()))]
    f = result["fastmem"]
    lines += [
        "",
        f"fastmem contexts: largest {f['max_tokens']} tokens, {f['over_budget']} over budget; "
        f"context() p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms (query embedding included).",
    ]
    publish("\n".join(lines), result, args.out, "locomo.py")


if __name__ == "__main__":
    main()

"""Recall in a big store: LoCoMo's questions asked of a store that holds much else.

    python benchmarks/haystack.py [--sizes 0,10k,30k,100k] [--budget 1300]
                                  [--cache DIR] [--per-question PREFIX] [--policy FIELD=VALUE]

An agent's store is not one conversation: after months it holds other conversations, tool
results and notes. This measures LoCoMo's evidence recall (the measure of
``shared/data/README.md``: ``context(question, 1300)``, a turn counts when its whole text is
in the context) when the five dev conversations share one store with unrelated memories, at
several store sizes:

* ``0``: the five conversations alone, together in one store (2,760 turns; each question is
  asked of the whole store, so the other four conversations are already a small haystack);
* ``N``: the same five plus unrelated memories up to N in all: first every message of BEAM's
  dev conversations (``beam-dev``, ``beam-500k-dev``: 8,202 long messages about software,
  writing, careers, maths), then generated filler: each a random speaker ("Alex: ",
  "user: ", ...) and one to three sentences drawn from random BEAM messages.

Every memory keeps the vector the default embedder gives its text, except the generated
filler, whose vector is the normalised sum of the vectors of the messages its sentences
came from plus noise (embedding 90k texts would take ~25 minutes on two shared cores): it
sits among the real messages' vectors, as a real text would, though not exactly where its
own embedding would put it. Vectors are read from the stores ``locomo.py`` and ``beam.py``
cache (``--cache`` of those scripts; built here when missing).

Memories go in session by session in time order (LoCoMo 2022-2023, BEAM 2024; the filler's
sessions spread over 2022-2024), each session's memories together, as an agent writes them.
Reports recall overall and per category at each size, each size paired question by question
against size 0 (the mean difference and its 95% bootstrap interval), and context latency.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import fastmem

sys.path.insert(0, str(Path(__file__).resolve().parent))
import beam
import locomo

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
FILLER_SPEAKERS = ("Alex", "Sam", "Priya", "Tomás", "Wen", "user", "assistant")
FILLER_SESSION = 20  # generated memories per filler session
FILLER_NOISE = 0.03  # per-dimension noise on a filler vector (its sources' cosine ~0.5-0.8)
SEED = 0
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def vectors_of(path: str) -> dict[str, np.ndarray]:
    """Each memory's stored vector in the store at ``path``, by its text."""
    with fastmem.open(path, readonly=True) as store:
        return {m.text: store.vector(m.id) for m in store}


def sources(cache: str) -> tuple[list[list[dict]], list[list[dict]]]:
    """(the five LoCoMo conversations' sessions, BEAM's sessions): lists of items for
    ``add_many``, each with its ``embedding``, read from (or first built into) ``cache``."""
    targets = []
    with tempfile.TemporaryDirectory() as tmp:
        for sample in json.loads((DATA / "locomo-dev.json").read_text()):
            turns = locomo.turns_of(sample)
            path = locomo.store_for(sample["sample_id"], turns, tmp, f"{cache}/cache-locomo")
            vec = vectors_of(path)
            for t in turns:
                t["embedding"] = vec[t["text"]]
                t["metadata"] = {**t["metadata"], "conversation": sample["sample_id"]}
                t["session"] = f"{sample['sample_id']} {t['session']}"
            targets += _sessions(turns)
        hay = []
        for folder, sub in (("beam-dev", "cache-beam"), ("beam-500k-dev", "cache-b500")):
            for name, msgs, _ in beam.load(DATA / folder):
                path = locomo.store_for(f"conv{name}", msgs, tmp, f"{cache}/{sub}")
                vec = vectors_of(path)
                for m in msgs:
                    m["embedding"] = vec[m["text"]]
                    m["session"] = f"{folder}-{name} {m['session']}"
                    m["metadata"] = None
                hay += _sessions(msgs)
    return targets, hay


def _sessions(items: list[dict]) -> list[list[dict]]:
    out: dict[str, list[dict]] = {}
    for item in items:
        out.setdefault(item["session"], []).append(item)
    return list(out.values())


def filler(hay: list[list[dict]], n: int, rng: np.random.Generator) -> list[list[dict]]:
    """``n`` generated memories in sessions of ``FILLER_SESSION`` (see the module's doc)."""
    messages = [m for session in hay for m in session]
    split = [[s for s in _SENTENCE.split(m["text"].partition(": ")[2]) if len(s) > 20]
             for m in messages]  # fmt: skip
    usable = [i for i, s in enumerate(split) if s]
    lo = locomo.session_time("12:00 am on 1 January, 2022")
    hi = beam.anchor_time("December-31-2024")
    out, session = [], []
    for j in range(n):
        picks = rng.choice(usable, size=int(rng.integers(1, 4)))
        text = " ".join(split[i][int(rng.integers(len(split[i])))] for i in picks)
        v = sum(messages[i]["embedding"] for i in picks).astype(np.float64)
        v = v / np.linalg.norm(v) + rng.normal(0.0, FILLER_NOISE, len(v))
        if not session:
            start = float(rng.uniform(lo, hi))
        session.append({
            "text": f"{FILLER_SPEAKERS[int(rng.integers(len(FILLER_SPEAKERS)))]}: {text}",
            "timestamp": start + 60.0 * len(session), "session": f"filler {j // FILLER_SESSION}",
            "embedding": (v / np.linalg.norm(v)).astype(np.float32),
        })  # fmt: skip
        if len(session) == FILLER_SESSION or j == n - 1:
            out.append(session)
            session = []
    return out


def build(path: str, targets: list, hay: list, size: int, rng: np.random.Generator) -> int:
    """A store at ``path`` of the targets and unrelated memories up to ``size`` in all;
    returns its size."""
    sessions = list(targets)
    have = sum(len(s) for s in targets)
    for session in hay:
        if have >= size:
            break
        sessions.append(session[: size - have])
        have += len(sessions[-1])
    if have < size:
        sessions += filler(hay, size - have, rng)
    sessions.sort(key=lambda s: s[0]["timestamp"])
    items = [m for s in sessions for m in s]
    with fastmem.open(path, durability="none") as store:
        for start in range(0, len(items), 5000):
            store.add_many(items[start : start + 5000])
    return len(items)


def measure(path: str, budget: int, policy: object = None) -> dict:
    """LoCoMo's recall in the store at ``path`` (per question, per category, latency)."""
    data = json.loads((DATA / "locomo-dev.json").read_text())
    each, latencies, over = {}, [], 0
    with fastmem.open(path, **({} if policy is None else {"policy": policy})) as store:
        locomo._wait_ready(store)
        for sample in data:
            text_of = {t["metadata"]["dia_id"]: t["text"] for t in locomo.turns_of(sample)}
            for n, (question, category, ids) in enumerate(locomo.questions(sample, set(text_of))):
                started = time.perf_counter()
                ctx = store.context(question, budget=budget)
                latencies.append(time.perf_counter() - started)
                over += ctx.tokens > budget
                hit = sum(text_of[i] in ctx.text for i in ids) / len(ids)
                each[f"{sample['sample_id']}#{n}"] = [locomo.CATEGORIES[category], hit]
    cats = list(locomo.CATEGORIES.values())
    return {
        "recall": statistics.fmean(r for _, r in each.values()),
        "by_category": {c: statistics.fmean(r for k, r in each.values() if k == c) for c in cats},
        "over_budget": over,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p95_ms": 1e3 * float(np.percentile(latencies, 95)),
        "per_question": each,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,10k,30k,100k")
    parser.add_argument("--budget", type=int, default=1300)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "fastmem-haystack"))
    parser.add_argument("--per-question", default="",
                        help="write each size's recalls to PREFIX-N.json")
    parser.add_argument("--policy", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ContextPolicy field other than its default (repeatable)")
    args = parser.parse_args()
    sizes = [int(float(s.lower().replace("k", "e3").replace("m", "e6")))
             for s in args.sizes.split(",")]  # fmt: skip
    targets, hay = sources(args.cache)
    results = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            total = build(f"{tmp}/haystack", targets, hay, size, np.random.default_rng(SEED))
            built = time.perf_counter() - started
            policy = locomo.policy_of(args.policy)
            results[total] = measure(f"{tmp}/haystack", args.budget, policy)
            print(f"{total} memories (built in {built:.0f} s): recall "
                  f"{results[total]['recall']:.3f}", file=sys.stderr, flush=True)
        if args.per_question:
            Path(f"{args.per_question}-{total}.json").write_text(
                json.dumps(results[total]["per_question"]))
    cats = list(locomo.CATEGORIES.values())
    first = results[min(results)]["per_question"]
    lines = [
        (f"LoCoMo dev's evidence recall within {args.budget} tokens, the five conversations in "
         "one store with unrelated memories"),
        "",
        "| memories | recall | " + " | ".join(cats) + " | against the smallest | p50 / p95 ms |",
        "|---:|---:|" + "---:|" * len(cats) + "---|---|",
    ]
    for total, r in sorted(results.items()):
        diff = locomo.paired(first, r["per_question"]).split("\n")[0].split(": ", 1)[1]
        row = " | ".join(f"{r['by_category'][c]:.3f}" for c in cats)
        lines.append(f"| {total:,} | {r['recall']:.3f} | {row} | {diff} | "
                     f"{r['p50_ms']:.0f} / {r['p95_ms']:.0f} |")
    over = sum(r["over_budget"] for r in results.values())
    lines += ["", f"Contexts over budget: {over}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""BEAM (128K track) retrieval: recall of gold messages within a 1,300-token context.

    python benchmarks/beam.py [--data ../shared/data/beam-dev] [--budget 1300]
                              [--baselines] [--cache DIR] [--out benchmarks/RESULTS-beam.md]

The measure of ``shared/data/README.md``: each conversation goes into a fresh store, one
memory per message (text ``"<role>: <content>"``, session ``session_<batch>``, timestamp the
session's time anchor at midnight UTC plus the message's position in the session in
seconds, the message id in metadata). For every probing question with evidence,
``store.context(question, budget)`` is built; a gold message counts as recalled when its
whole text (whitespace-normalised) is in the context's text. Reports mean recall overall and
per ability, the largest context (exact cl100k_base tokens; never above the budget), the
mean share of the context taken by the gold messages, and context latency.

Unlike LoCoMo, messages are long (assistant replies: median ~900 tokens), so how a ranking
is packed matters: ``--baselines`` measures each plain ranking (recency, MiniLM cosine,
BM25, their reciprocal-rank fusion) packed two ways — ``prefix``: the longest prefix of the
ranking that fits (LoCoMo's packing), and ``skip``: every message in rank order that still
fits, skipping those that do not.

``--cache DIR`` keeps the built stores (embedding ~2,400 long messages takes minutes on two
cores) and copies them afresh for each run, so access counts never leak between runs.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import fastmem
from fastmem.embed import MiniLM, default_embedder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo import (
    STORE_OPTIONS,
    arguments,
    plain_rankings,
    policy_of,
    publish,
    save_per_question,
    store_for,
    table,
    use_embedder,
)

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "beam-dev"
ABILITIES = (
    "information_extraction", "multi_session_reasoning", "knowledge_update",
    "temporal_reasoning", "contradiction_resolution", "instruction_following",
    "preference_following", "event_ordering", "summarization", "abstention",
)  # fmt: skip
SHORT = {
    "information_extraction": "IE", "multi_session_reasoning": "MSR", "knowledge_update": "KU",
    "temporal_reasoning": "TR", "contradiction_resolution": "CR", "instruction_following": "IF",
    "preference_following": "PF", "event_ordering": "EO", "summarization": "SUM",
    "abstention": "ABS",
}  # fmt: skip


def norm(text: str) -> str:
    return " ".join(text.split())


def anchor_time(text: str) -> float:
    """'March-15-2024' -> Unix seconds (midnight UTC)."""
    when = datetime.strptime(text.strip(), "%B-%d-%Y")
    return when.replace(tzinfo=timezone.utc).timestamp()


def messages_of(chat: list[dict]) -> list[dict]:
    out = []
    for batch in chat:
        msgs = [m for exchange in batch["turns"] for m in exchange]
        anchor = batch.get("time_anchor") or next(
            (m["time_anchor"] for m in msgs if m.get("time_anchor")), None
        )
        start = anchor_time(anchor) if anchor else 0.0
        for i, m in enumerate(msgs):
            out.append({
                "text": f"{m['role']}: {m['content']}",
                "timestamp": start + float(i),
                "session": f"session_{batch['batch_number']}",
                "metadata": {"id": int(m["id"])},
            })  # fmt: skip
    return out


def _flat_ids(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [i for v in value.values() for i in _flat_ids(v)]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _flat_ids(v)]
    m = re.search(r"(\d+)\s*$", str(value))
    return [int(m.group(1))] if m else []


def questions(probing: dict, known: set[int]) -> list[tuple[str, str, list[int]]]:
    """(question, ability, gold ids) for every question with evidence in the chat."""
    out = []
    for ability in ABILITIES:
        for q in probing.get(ability, []):
            ids = sorted({i for i in _flat_ids(q.get("source_chat_ids")) if i in known})
            if ids:
                out.append((q["question"], ability, ids))
    return out


def load(data: Path) -> list[tuple[str, list[dict], list[tuple[str, str, list[int]]]]]:
    convs = []
    for folder in sorted((p for p in data.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
        msgs = messages_of(json.loads((folder / "chat.json").read_text()))
        known = {m["metadata"]["id"] for m in msgs}
        qs = questions(json.loads((folder / "probing_questions.json").read_text()), known)
        convs.append((folder.name, msgs, qs))
    return convs


def run_fastmem(convs: list, budget: int, cache: str = "", policy: object = None) -> dict:
    """fastmem as a user runs it: the default embedder, a store per conversation."""
    recalls: dict[str, list[float]] = {a: [] for a in ABILITIES}
    latencies, sizes, gold_share, over = [], [], [], 0
    each: dict[str, list] = {}  # "<conversation>#<n>" -> [ability, recall] (paired comparisons)
    for name, msgs, qs in convs:
        text_of = {m["metadata"]["id"]: norm(m["text"]) for m in msgs}
        with tempfile.TemporaryDirectory() as tmp:
            path = store_for(f"conv{name}", msgs, tmp, cache)
            kwargs = {} if policy is None else {"policy": policy}
            with fastmem.open(path, **kwargs, **STORE_OPTIONS) as store:  # as after a restart
                # Full quality (degraded contexts are another figure); --embedder's may not load
                # in the background.
                getattr(store._embedder, "wait", lambda: None)()
                for n, (question, ability, ids) in enumerate(qs):
                    started = time.perf_counter()
                    ctx = store.context(question, budget=budget)
                    latencies.append(time.perf_counter() - started)
                    sizes.append(ctx.tokens)
                    over += ctx.tokens > budget
                    text = norm(ctx.text)
                    hit = [i for i in ids if text_of[i] in text]
                    recalls[ability].append(len(hit) / len(ids))
                    each[f"{name}#{n}"] = [ability, len(hit) / len(ids)]
                    gold_share.append(sum(store.tokens.count(text_of[i]) for i in hit) / budget)
    every = [r for rs in recalls.values() for r in rs]
    return {
        "recall": statistics.fmean(every),
        "by_category": {a: statistics.fmean(r) for a, r in recalls.items() if r},
        "questions": len(every),
        "max_tokens": max(sizes),
        "mean_tokens": statistics.fmean(sizes),
        "gold_share": statistics.fmean(gold_share),
        "over_budget": over,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p95_ms": 1e3 * float(np.percentile(latencies, 95)),
        "per_question": each,
    }


def run_baselines(convs: list, budget: int, embedder: MiniLM) -> dict[str, dict]:
    from rank_bm25 import BM25Okapi

    from fastmem.tokens import TokenCounter

    count = TokenCounter().count
    token = re.compile(r"[0-9a-z\x80-\uffff]+")
    rankings = ("recency", "cosine", "bm25", "rrf")
    names = [f"{r}-{p}" for r in rankings for p in ("prefix", "skip")]
    recalls: dict[str, dict[str, list[float]]] = {n: {a: [] for a in ABILITIES} for n in names}
    for _, msgs, qs in convs:
        texts = [m["text"] for m in msgs]
        where = {m["metadata"]["id"]: i for i, m in enumerate(msgs)}
        cost = [count(t) + 1 for t in texts]
        vectors = embedder.encode(texts)
        bm25 = BM25Okapi([token.findall(t.lower()) for t in texts])
        for question, ability, ids in qs:
            orders = plain_rankings(embedder.encode_query(question) @ vectors.T,
                                    bm25.get_scores(token.findall(question.lower())))  # fmt: skip
            for name, order in orders.items():
                for packing in ("prefix", "skip"):
                    used, chosen = 0, set()
                    for i in order:
                        if used + cost[i] <= budget:
                            chosen.add(int(i))
                            used += cost[i]
                        elif packing == "prefix":
                            break
                    hit = sum(where[e] in chosen for e in ids) / len(ids)
                    recalls[f"{name}-{packing}"][ability].append(hit)
    return {
        name: {
            "recall": statistics.fmean([r for rs in by.values() for r in rs]),
            "by_category": {a: statistics.fmean(r) for a, r in by.items() if r},
        }
        for name, by in recalls.items()
    }


def report(result: dict, budget: int, convs: list, data: str) -> str:
    f = result["fastmem"]
    cats = [a for a in ABILITIES if a in f["by_category"]]
    title = (
        f"BEAM {'500K' if '500k' in Path(data).name else '128K'} evidence recall within {budget} tokens — {len(convs)} conversations of "
        f"{Path(data).name}, {sum(len(c[1]) for c in convs)} messages, {f['questions']} questions"
    )
    lines = [title, "", *table(result, cats, SHORT)]
    lines += [
        "",
        "Abilities: " + ", ".join(f"{SHORT[a]} {a}" for a in cats) + ".",
        f"fastmem contexts: mean {f['mean_tokens']:.0f} tokens, largest {f['max_tokens']}, "
        f"{f['over_budget']} over budget; recalled gold messages fill {100 * f['gold_share']:.0f}% "
        f"of the budget on average; context() p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms "
        f"(query embedding included).",
    ]
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__, DEFAULT_DATA)
    use_embedder(args.embedder)
    convs = load(Path(args.data))
    result = {"fastmem": run_fastmem(convs, args.budget, args.cache, policy_of(args.policy))}
    save_per_question(args.per_question, result, args.against)
    if args.baselines:
        result.update(run_baselines(convs, args.budget, default_embedder()))
    publish(report(result, args.budget, convs, args.data), result, args.out, "beam.py")


if __name__ == "__main__":
    main()

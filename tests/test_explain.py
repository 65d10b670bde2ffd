"""Provenance: what ``context()`` says about each line (tokens, reason, rank, score parts),
the candidates it left out, a hybrid hit's score parts, and ``recent(before=...)`` pages.

The inspector (``fastmem ui``) and ``fastmem context --explain`` show these facts; these
tests pin that they are the context's own.
"""

from __future__ import annotations

import json
import random

import pytest

import fastmem
from fastmem import Level
from fastmem.cli import main

TURNS = [
    f"turn {i}: we talked about the weather in city {i} and the deploy of service {i % 7}"
    for i in range(200)
]


@pytest.fixture
def filled(tmp_path):
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None) as store:
        store.add("The user likes green tea.", type="fact", pinned=True)
        store.add_many(
            [
                {"text": t, "session": f"s{i // 50}", "timestamp": 1e9 + i * 100}
                for i, t in enumerate(TURNS)
            ]
        )
    return path


def _line(item: fastmem.ContextItem) -> str:  # as the context renders it, spelled out here
    prefix = "" if item.type == "conversation" else f"[{item.type}] "
    mark = "(summary) " if item.summary else "(excerpt) " if item.excerpt else ""
    assert item.line == prefix + mark + item.text
    return item.line


def test_each_item_has_its_lines_tokens_and_a_reason(filled):
    with fastmem.open(filled, embedder=None, readonly=True) as store:
        ctx = store.context("deploy of service 3", budget=200)
        counter = store.tokens
    assert ctx.items
    lines = ctx.text.split("\n")
    for item in ctx.items:
        assert _line(item) in lines
        assert item.tokens == counter.count(_line(item)) > 0
        assert item.reason
    pinned = [i for i in ctx.items if i.level == Level.PINNED]
    assert pinned and pinned[0].reason.startswith("pinned")
    found = [i for i in ctx.items if i.level == Level.FOUND]
    assert found and all(i.reason.startswith("level 3: #") and i.rank >= 1 for i in found)
    assert found[0].keyword is not None and found[0].keyword > 0
    # The lines' tokens and the headers' make the whole (line breaks may merge or not).
    headers = sum(counter.count(line) for line in lines if line.startswith("## "))
    assert abs(sum(i.tokens for i in ctx.items) + headers - ctx.tokens) <= len(lines)


def test_left_out_are_ranked_candidates_that_did_not_fit(filled):
    with fastmem.open(filled, embedder=None, readonly=True) as store:
        small = store.context("deploy of service 3", budget=120)
        large = store.context("deploy of service 3", budget=5000)
    assert small.left_out, "a small budget leaves matching memories out"
    assert len(small.left_out) <= fastmem.Context.LEFT_OUT
    shown = {i.id for i in small.items}
    for item in small.left_out:
        assert item.id not in shown
        assert item.tokens > 0
        assert "fit" in item.reason or "counted exactly" in item.reason
    # What a small budget left out, a large one takes in.
    assert {i.id for i in small.left_out} <= {i.id for i in large.items}
    assert not large.left_out or all(
        i.id not in {j.id for j in large.items} for i in large.left_out
    )


def test_a_summary_in_place_of_the_text_says_why(tmp_path):
    path = str(tmp_path / "s")
    long = "The release checklist. " + " ".join(
        f"Step {i} checks the build log." for i in range(200)
    )
    with fastmem.open(path, embedder=None) as store:
        store.add(long, summary="The release checklist: 200 steps.", type="plan")
        store.add("Unrelated: the cat sleeps.", type="fact")
        ctx = store.context("release checklist", budget=60)
    (item,) = [i for i in ctx.items if i.id == "m0"]
    assert item.summary or item.excerpt
    assert "passage" in item.reason or "summary" in item.reason


def test_context_is_unchanged_by_provenance(filled):
    """Old callers: the same text, tokens and item fields as before (positional too)."""
    with fastmem.open(filled, embedder=None, readonly=True) as store:
        ctx = store.context("deploy of service 3", budget=200)
    item = ctx.items[0]
    again = fastmem.ContextItem(
        item.id,
        item.level,
        item.score,
        item.text,
        item.summary,
        item.timestamp,
        item.session,
        item.type,
    )
    assert again.tokens == 0 and again.reason == "" and again.rank == 0
    old = fastmem.Context("t", 1, 10, [], "cl100k_base")
    assert old.left_out == []


def test_hybrid_hits_report_importance_and_recency_bonuses(filled):
    with fastmem.open(filled, embedder=None, readonly=True) as store:
        (hit,) = store.search("deploy of service 3", 1)
        policy = store.policy
        (kw,) = store.search("deploy of service 3", 1, mode="keyword")
    assert hit.importance_bonus == pytest.approx(policy.importance_weight * hit.memory.importance)
    assert 0 <= hit.recency_bonus <= policy.recency_weight
    assert kw.importance_bonus is None and kw.recency_bonus is None


def test_recent_pages_equal_the_whole_order(tmp_path):
    random.seed(3)
    path = str(tmp_path / "s")

    def ts() -> float:  # many ties, as a bulk import of one moment makes
        return float(random.choice([5, 6, 7, random.random() * 10]))

    with fastmem.open(path, embedder=None) as store:
        ids = store.add_many([{"text": f"t{i}", "timestamp": ts()} for i in range(300)])
        store.checkpoint()  # rows in the index's base and in its tail
        store.add_many([{"text": f"u{i}", "timestamp": ts()} for i in range(100)])
        for mid in random.sample(ids, 30):
            store.forget(mid)
        whole = [m.id for m in store.recent(1000)]
        paged: list[str] = []
        cursor = None
        while page := store.recent(37, before=cursor):
            paged += [m.id for m in page]
            cursor = page[-1].id
        assert paged == whole and len(whole) == 370
        with pytest.raises(fastmem.UnknownMemoryError):
            store.recent(5, before="m99999")


def test_cli_context_explain(filled, capsys):
    assert (
        main(["context", filled, "deploy of service 3", "--budget", "150", "--explain", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["items"] and all("reason" in i and i["tokens"] > 0 for i in data["items"])
    assert "left_out" in data
    assert main(["context", filled, "deploy of service 3", "--budget", "150", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "level 3" in out and "did not fit" in out

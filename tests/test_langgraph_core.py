"""The two core calls the LangGraph adapter needs, tested without LangGraph:
``MemoryStore.ids(after=)`` (its catalog's catch-up) and ``MemoryStore.context(types=)``
(a context from one namespace prefix's memories only)."""

from __future__ import annotations

import os

import pytest

import fastmem


@pytest.fixture
def store(tmp_path):
    with fastmem.open(os.fspath(tmp_path / "s"), embedder=None) as s:
        yield s


def test_ids_lists_live_ids_oldest_first_and_after_one(store):
    ids = store.add_many([{"text": f"memory {i}"} for i in range(5)])
    assert store.ids() == ids
    store.forget(ids[1])
    assert store.ids() == [ids[0], *ids[2:]]
    assert store.ids(after=ids[2]) == ids[3:]
    assert store.ids(after=ids[4]) == []
    assert store.ids(after=ids[1]) == ids[2:]  # a forgotten id still marks a place


def test_ids_sees_another_handles_adds(tmp_path):
    path = os.fspath(tmp_path / "s")
    with fastmem.open(path, embedder=None) as a, fastmem.open(path, embedder=None) as b:
        first = a.add("one")
        assert b.ids() == [first]
        second = b.add("two")
        assert a.ids(after=first) == [second]


def test_ids_refuses_what_is_no_id(store):
    with pytest.raises(fastmem.UnknownMemoryError):
        store.ids(after="x1")
    with pytest.raises(fastmem.InvalidTypeError):
        store.ids(after=3)


def test_context_of_types_shows_no_other_type_at_any_level(store):
    store.add("Alice's cat is called Tom.", type="lg:alice")
    store.add("Bob's cat is called Rex.", type="lg:bob", pinned=True)
    store.add("Bob's other cat is called Max.", type="lg:bob")
    only_alice = store.context("what is the cat called", 300, types=["lg:alice"])
    assert "Tom" in only_alice.text
    assert "Rex" not in only_alice.text and "Max" not in only_alice.text  # pinned, found
    assert {item.type for item in only_alice.items} == {"lg:alice"}
    everything = store.context("what is the cat called", 300)
    assert "Rex" in everything.text and "Tom" in everything.text
    assert store.context("cat", 300, types=[]).text == ""
    assert store.context("cat", 300, types=["no-such-type"]).text == ""


def test_context_types_must_be_names(store):
    store.add("a memory")
    with pytest.raises(fastmem.InvalidTypeError):
        store.context("memory", 100, types="lg:alice")
    with pytest.raises(fastmem.InvalidTypeError):
        store.context("memory", 100, types=[1])


def test_a_search_refuses_types_given_as_one_string(store):
    store.add("a fact", type="fact")
    with pytest.raises(fastmem.InvalidTypeError):
        store.search("fact", types="fact", mode="keyword")  # read as "f", "a", "c", "t" before
    assert [h.memory.type for h in store.search("fact", types=["fact"], mode="keyword")] == ["fact"]


def test_types_counts_live_memories_by_type_as_stats_does(store):
    ids = store.add_many([{"text": "a", "type": "fact"}, {"text": "b", "type": "lg:x"},
                          {"text": "c", "type": "lg:x"}, {"text": "d"}])  # fmt: skip
    assert store.types() == {"fact": 1, "lg:x": 2, "conversation": 1} == store.stats().types
    store.forget(ids[1])
    store.forget(ids[0])
    assert store.types() == {"lg:x": 1, "conversation": 1} == store.stats().types

"""FastmemStore against the real LangGraph: each behaviour BaseStore promises, checked one by
one (often against LangGraph's own InMemoryStore on the same data), an agent loop across
processes, users kept apart, and two processes writing at once."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime

from conftest import BACKENDS
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    PutOp,
    SearchItem,
    SearchOp,
)  # fmt: skip
from langgraph.store.memory import InMemoryStore, _compare_values

import fastmem
from fastmem.embed import default_embedder
from fastmem.integrations.langgraph import FastmemStore, namespace_type

HERE = os.path.dirname(os.path.abspath(__file__))
AGENT = os.path.join(HERE, "langgraph_agent.py")


def open_store(path, **kwargs):
    """A FastmemStore with fastmem's real model (tests are keyword-only unless told)."""
    if "embed" not in kwargs.get("index", {}):
        kwargs.setdefault("embedder", default_embedder())
    return FastmemStore(path, **kwargs)


@pytest.fixture
def path(tmp_path):
    return os.fspath(tmp_path / "lg")


@pytest.fixture
def store(path):
    with open_store(path) as s:
        yield s


def keys(items):
    return [i.key for i in items]


# --- get, put, delete -------------------------------------------------------------------


def test_put_then_get_returns_the_item(store):
    store.put(("users", "alice"), "prefs", {"theme": "dark", "n": 3, "tags": ["a", "b"], "x": None})
    item = store.get(("users", "alice"), "prefs")
    assert isinstance(item, Item) and not isinstance(item, SearchItem)
    assert item.namespace == ("users", "alice") and item.key == "prefs"
    assert item.value == {"theme": "dark", "n": 3, "tags": ["a", "b"], "x": None}
    assert isinstance(item.created_at, datetime) and item.created_at.tzinfo is not None
    assert item.created_at == item.updated_at


def test_a_second_put_replaces_and_keeps_created_at(store):
    store.put(("a",), "k", {"v": 1})
    first = store.get(("a",), "k")
    time.sleep(0.01)
    store.put(("a",), "k", {"v": 2})
    second = store.get(("a",), "k")
    assert second.value == {"v": 2}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    assert len(store.store) == 1  # the replaced memory is forgotten


def test_put_none_and_delete_remove_the_item(store):
    store.put(("a",), "k1", {"v": 1})
    store.put(("a",), "k2", {"v": 2})
    store.put(("a",), "k1", None)
    store.delete(("a",), "k2")
    assert store.get(("a",), "k1") is None and store.get(("a",), "k2") is None
    assert store.search(("a",)) == [] and store.list_namespaces() == []
    store.delete(("a",), "never")  # deleting what is not there is no error


def test_get_of_a_missing_key_or_namespace_is_none(store):
    store.put(("a", "b"), "k", {"v": 1})
    assert store.get(("a", "b"), "other") is None
    assert store.get(("a",), "k") is None  # a namespace is exact for get
    assert store.get(("a", "b", "c"), "k") is None


def test_a_batch_reads_before_its_puts_and_keeps_the_last_put_of_a_key(store):
    store.put(("a",), "k", {"v": 0})
    results = store.batch([
        PutOp(("a",), "k", {"v": 1}),
        GetOp(("a",), "k"),
        PutOp(("a",), "k", {"v": 2}),
        SearchOp(("a",)),
        ListNamespacesOp(),
    ])  # fmt: skip
    assert results[0] is None and results[2] is None
    assert results[1].value == {"v": 0}  # as InMemoryStore and SqliteStore: reads first
    assert [r.value for r in results[3]] == [{"v": 0}]
    assert results[4] == [("a",)]
    assert store.get(("a",), "k").value == {"v": 2}


# --- namespaces ---------------------------------------------------------------------------


def test_search_of_a_prefix_never_crosses_a_label_boundary(store):
    store.put(("users", "al"), "k", {"text": "short name"})
    store.put(("users", "alice"), "k", {"text": "long name"})
    store.put(("users", "alice", "notes"), "k", {"text": "deeper"})
    assert {i.namespace for i in store.search(("users", "al"))} == {("users", "al")}
    assert {i.namespace for i in store.search(("users", "al"), query="name")} == {("users", "al")}
    under = store.search(("users", "alice"), query="name")
    assert {i.namespace for i in under} == {("users", "alice"), ("users", "alice", "notes")}
    assert len(store.search(())) == 3 and len(store.search(("users",), query="x")) == 3


def test_two_users_never_see_each_others_items(store):
    store.put(("memories", "alice"), "f1", {"text": "Alice's bank PIN is 1234"})
    store.put(("memories", "bob"), "f1", {"text": "Bob likes hiking"})
    for query in ("bank PIN", "what is the PIN", "hiking", None):
        found = store.search(("memories", "bob"), query=query, limit=50)
        assert all(i.namespace == ("memories", "bob") for i in found), query
    assert "1234" not in store.context(("memories", "bob"), "what is the bank PIN?").text
    assert "1234" in store.context(("memories", "alice"), "what is the bank PIN?").text


LISTED = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
          ("x", "y"), ("users", "1", "v1"), ("users", "2", "v1"), ("users", "2", "v2")]  # fmt: skip


@pytest.mark.parametrize("kwargs", [
    {}, {"prefix": ("a", "b")}, {"prefix": ("a", "b"), "max_depth": 3}, {"max_depth": 1},
    {"max_depth": 2, "limit": 2, "offset": 1}, {"suffix": ("f",)}, {"suffix": ("v1",)},
    {"prefix": ("users", "*")}, {"prefix": ("*", "b")}, {"suffix": ("*", "v2")},
    {"prefix": ("a",), "suffix": ("f",)}, {"prefix": ("users", "*", "v1")}, {"limit": 3},
    {"offset": 4}, {"offset": 20}, {"prefix": ("nothing",)}, {"prefix": ("a", "b", "c", "d")},
])  # fmt: skip
def test_list_namespaces_matches_in_memory_store(store, kwargs):
    reference = InMemoryStore()
    for ns in LISTED:
        store.put(ns, "k", {"v": 1})
        reference.put(ns, "k", {"v": 1})
    assert store.list_namespaces(**kwargs) == reference.list_namespaces(**kwargs)


def test_a_namespace_longer_than_a_type_name_works_and_stays_apart(store):
    long_a = ("tenants", "a" * 40, "user-" + "1" * 30)
    long_b = ("tenants", "a" * 40, "user-" + "2" * 30)  # the same first 45 characters
    assert namespace_type(long_a, True) != namespace_type(long_b, True)
    assert len(namespace_type(long_a, True)) <= 64
    store.put(long_a, "k", {"text": "the first tenant's note"})
    store.put(long_b, "k", {"text": "the second tenant's note"})
    assert store.get(long_a, "k").value == {"text": "the first tenant's note"}
    assert [i.namespace for i in store.search(long_a, query="note")] == [long_a]
    assert [i.namespace for i in store.search(long_b)] == [long_b]
    assert sorted(store.list_namespaces(prefix=("tenants",))) == sorted([long_a, long_b])
    assert "second" not in store.context(long_a, "note").text
    with open_store(store.store.path) as fresh:  # a new handle: no catalog yet
        assert [i.namespace for i in fresh.search(long_b, query="note")] == [long_b]


# --- search -------------------------------------------------------------------------------


def test_search_without_a_query_is_newest_first_and_pages_exactly(store):
    for i in range(25):
        store.put(("docs",), f"d{i:02}", {"i": i})
    store.put(("docs",), "d03", {"i": 3, "touched": True})  # updated: now the newest
    listed = store.search(("docs",), limit=100)
    assert keys(listed)[0] == "d03" and keys(listed)[1:] == [f"d{i:02}" for i in range(24, -1, -1) if i != 3]
    assert all(i.score is None for i in listed)
    pages = [keys(store.search(("docs",), limit=7, offset=o)) for o in range(0, 28, 7)]
    assert list(itertools.chain(*pages)) == keys(listed)
    assert store.search(("docs",), limit=0) == []


def test_search_with_a_query_ranks_the_relevant_item_first(store):
    store.put(("kb",), "pets", {"text": "Alice has a tabby cat called Tom"})
    store.put(("kb",), "food", {"text": "Alice loves spicy Thai curry"})
    store.put(("kb",), "work", {"text": "Alice works as a structural engineer"})
    found = store.search(("kb",), query="What cuisine does she enjoy?")
    assert keys(found)[0] == "food"
    assert all(isinstance(i, SearchItem) for i in found)
    scores = [i.score for i in found]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert keys(store.search(("kb",), query="cat", limit=1)) == ["pets"]


def test_query_results_page_without_gaps_or_repeats(store):
    for i in range(30):
        store.put(("kb",), f"k{i}", {"text": f"note number {i} about the garden and roses"})
    whole = keys(store.search(("kb",), query="garden roses", limit=30))
    assert sorted(whole) == sorted(f"k{i}" for i in range(30))
    pages = [keys(store.search(("kb",), query="garden roses", limit=8, offset=o)) for o in range(0, 32, 8)]
    assert list(itertools.chain(*pages)) == whole


FILTERED = [
    {"status": "active", "score": 4.5, "n": 1, "meta": {"lang": "en", "v": 2}, "tags": ["a", "b"], "ok": True},
    {"status": "archived", "score": 3.0, "n": 2, "meta": {"lang": "fr", "v": 2}, "tags": ["a"], "ok": False},
    {"status": "active", "score": 5.0, "n": 3, "meta": {"lang": "en", "v": 3}, "tags": ["b", "a"]},
    {"status": "draft", "n": 4, "meta": None, "score": "high"},
    {"text": "no status at all", "n": 5},
]  # fmt: skip
FILTERS = [
    {"status": "active"}, {"status": {"$eq": "active"}}, {"status": {"$ne": "active"}},
    {"score": {"$gt": 4.5}}, {"score": {"$gte": 4.5}}, {"score": {"$lt": 4.5}}, {"score": {"$lte": 3}},
    {"score": {"$gte": 3, "$lt": 5}}, {"meta": {"lang": "en"}}, {"meta": {"lang": "en", "v": 3}},
    {"tags": ["a", "b"]}, {"ok": True}, {"ok": False}, {"status": "active", "n": 3},
    {"missing": None}, {"n": {"$ne": 2}}, {"status": "nothing"}, {"n": 2.0},
]  # fmt: skip


@pytest.mark.parametrize("flt", FILTERS)
def test_filters_match_in_memory_store(store, flt):
    reference = InMemoryStore()
    for i, value in enumerate(FILTERED):
        store.put(("f",), f"k{i}", value)
        reference.put(("f",), f"k{i}", value)
    expected = []  # InMemoryStore's comparison of each item; one it cannot compare: no match
    for i, value in enumerate(FILTERED):
        try:
            if all(_compare_values(value.get(k), f) for k, f in flt.items()):
                expected.append(f"k{i}")
        except (TypeError, ValueError):  # InMemoryStore's search raises here
            pass
    try:
        assert sorted(keys(reference.search(("f",), filter=flt, limit=100))) == expected
    except (TypeError, ValueError):
        pass
    assert sorted(keys(store.search(("f",), filter=flt, limit=100))) == expected
    with_query = store.search(("f",), filter=flt, query="status", limit=100)
    assert sorted(keys(with_query)) == expected


def test_a_comparison_with_a_missing_field_is_no_match(store):
    store.put(("f",), "with", {"score": 2})
    store.put(("f",), "without", {"other": 1})
    assert keys(store.search(("f",), filter={"score": {"$gt": 1}})) == ["with"]


def test_an_unknown_filter_operator_is_a_value_error(store):
    store.put(("f",), "k", {"n": 1})
    with pytest.raises(ValueError, match="Unsupported operator"):
        store.search(("f",), filter={"n": {"$in": [1]}})


# --- what is indexed ----------------------------------------------------------------------


def _text_of(store, namespace, key):
    for memory in store.store:
        item = (memory.metadata or {}).get("langgraph", {})
        if tuple(item.get("namespace", ())) == namespace and item.get("key") == key:
            return memory.text, memory.type
    raise AssertionError("no memory")


def test_index_fields_choose_the_embedded_text(path):
    with open_store(path, index={"fields": ["title", "body.sections[*].text"]}) as store:
        store.put(("d",), "k", {"title": "Roses", "body": {"sections": [{"text": "prune"}, {"text": "water"}]},
                                "secret": "not indexed"})  # fmt: skip
        assert _text_of(store, ("d",), "k")[0] == "Roses\nprune\nwater"
        store.put(("d",), "k2", {"title": "Tulips", "secret": "zzz"}, index=["secret"])
        assert _text_of(store, ("d",), "k2")[0] == "zzz"
    with open_store(path) as store:  # the default: every string of the value
        store.put(("d",), "k3", {"a": "one", "b": {"c": ["two", 3]}, "d": True})
        assert _text_of(store, ("d",), "k3")[0] == "one\ntwo"


def test_an_item_put_with_index_false_is_found_by_key_and_filter_not_by_query(store):
    store.put(("d",), "hidden", {"text": "the launch code is swordfish", "kind": "secret"}, index=False)
    store.put(("d",), "shown", {"text": "the weather is mild", "kind": "note"})
    assert store.get(("d",), "hidden").value["kind"] == "secret"
    assert keys(store.search(("d",), filter={"kind": "secret"})) == ["hidden"]
    assert keys(store.search(("d",), query="launch code swordfish", limit=10)) == ["shown"]
    assert "swordfish" not in store.context(("d",), "what is the launch code?").text
    assert _text_of(store, ("d",), "hidden")[1] == namespace_type(("d",), False)


def test_a_langchain_embeddings_can_replace_fastmems_model(path):
    from langchain_core.embeddings import DeterministicFakeEmbedding

    with open_store(path, index={"dims": 16, "embed": DeterministicFakeEmbedding(size=16)}) as store:
        store.put(("d",), "k", {"text": "hello"})
        assert keys(store.search(("d",), query="hello")) == ["k"]
        assert store.store.stats().dim == 16
    with pytest.raises((fastmem.EmbedderMismatchError, fastmem.DimensionMismatchError)):
        open_store(path)  # the store remembers the model that wrote its vectors


# --- TTL ----------------------------------------------------------------------------------


def test_ttl_items_expire_and_a_sweep_forgets_them(path):
    with open_store(path, ttl={"default_ttl": 0.5 / 60}) as store:  # half a second
        store.put(("t",), "short", {"text": "gone soon"})
        store.put(("t",), "kept", {"text": "stays"}, ttl=None)
        assert store.sweep_ttl() == 0
        time.sleep(0.7)
        assert store.get(("t",), "short", refresh_ttl=False) is not None  # until a sweep
        assert store.sweep_ttl() == 1
        assert store.get(("t",), "short") is None and store.get(("t",), "kept") is not None
        assert keys(store.search(("t",))) == ["kept"]


def test_omit_expired_hides_items_before_the_sweep(path):
    with open_store(path, ttl={"omit_expired": True}) as store:
        store.put(("t",), "short", {"text": "a fleeting thought"}, ttl=0.3 / 60)
        store.put(("t",), "kept", {"text": "a lasting thought"})
        assert store.get(("t",), "short") is not None
        time.sleep(0.5)
        assert store.get(("t",), "short") is None
        assert keys(store.search(("t",))) == ["kept"] == keys(store.search(("t",), query="thought"))
        assert store.list_namespaces() == [("t",)]
        store.delete(("t",), "kept")
        assert store.list_namespaces() == []


def test_a_read_refreshes_the_ttl_unless_told_not_to(path):
    with open_store(path, ttl={"refresh_on_read": True}) as store:
        store.put(("t",), "read", {"text": "read often"}, ttl=0.6 / 60)
        store.put(("t",), "unread", {"text": "never read"}, ttl=0.6 / 60)
        for _ in range(3):
            time.sleep(0.25)
            assert store.get(("t",), "read") is not None
            assert store.get(("t",), "unread", refresh_ttl=False) is not None
        time.sleep(0.2)
        assert store.sweep_ttl() == 1
        assert store.get(("t",), "read") is not None and store.get(("t",), "unread") is None


def test_a_refresh_in_one_handle_is_seen_by_anothers_sweep(path):
    with open_store(path) as a, open_store(path) as b:
        a.put(("t",), "k", {"text": "x"}, ttl=0.5 / 60)
        assert b.get(("t",), "k", refresh_ttl=False) is not None  # b's catalog holds it
        time.sleep(0.35)
        a.get(("t",), "k")  # refreshed: another 0.5 s
        time.sleep(0.3)
        assert b.sweep_ttl() == 0 and b.get(("t",), "k") is not None


def test_the_sweeper_thread_sweeps_and_stops(path):
    with open_store(path) as store:
        store.put(("t",), "k", {"text": "x"}, ttl=0.2 / 60)
        future = store.start_ttl_sweeper(sweep_interval_minutes=0.3 / 60)
        deadline = time.time() + 10
        while store.get(("t",), "k", refresh_ttl=False) is not None and time.time() < deadline:
            time.sleep(0.1)
        assert store.get(("t",), "k") is None
        assert store.stop_ttl_sweeper(timeout=5)
        assert future.result(timeout=5) is None


# --- values, bad input --------------------------------------------------------------------


def test_unicode_namespaces_keys_and_values(store):
    ns, key = ("用户", "zoë 🐈"), "ключ/✓"
    store.put(ns, key, {"text": "Zoë's cat 猫 is called Ünal 🐈", "emoji": "🎉"})
    assert store.get(ns, key).value["emoji"] == "🎉"
    assert keys(store.search(("用户",), query="猫")) == [key]
    assert store.list_namespaces(prefix=("用户",)) == [ns]


def test_empty_and_large_values(store):
    store.put(("v",), "empty", {})
    assert store.get(("v",), "empty").value == {}
    big = {"text": "lorem ipsum " * 5000}  # ~60 KB
    store.put(("v",), "big", big)
    assert store.get(("v",), "big").value == big
    assert keys(store.search(("v",), query="lorem ipsum")) == ["big"]


def test_a_value_over_the_limit_is_refused_and_changes_nothing(store):
    store.put(("v",), "k", {"text": "before"})
    before = len(store.store)
    with pytest.raises(fastmem.InvalidInputError, match="65536"):
        store.batch([PutOp(("v",), "other", {"ok": 1}), PutOp(("v",), "k", {"text": "x" * 200_000})])
    assert store.get(("v",), "k").value == {"text": "before"} and store.get(("v",), "other") is None
    assert len(store.store) == before


@pytest.mark.parametrize("bad", [("a.b",), ("",), ("a", 1), ("a\x00",)])
def test_bad_namespaces_raise_invalid_namespace_error(store, bad):
    for call in (lambda: store.put(bad, "k", {"v": 1}), lambda: store.get(bad, "k"),
                 lambda: store.search(bad), lambda: store.batch([PutOp(bad, "k", {"v": 1})]),
                 lambda: store.batch([GetOp(bad, "k")]), lambda: store.batch([SearchOp(bad)]),
                 lambda: store.list_namespaces(prefix=bad), lambda: store.context(bad, "q")):  # fmt: skip
        with pytest.raises(InvalidNamespaceError):
            call()
    assert len(store.store) == 0


def test_other_bad_input_is_refused_clearly(store):
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp((), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph",), "k", {"v": 1})  # LangGraph's own rule for put()
    with pytest.raises(TypeError):
        store.batch([PutOp(("a",), "k", ["not", "a", "dict"])])
    with pytest.raises(ValueError):
        store.search(("a",), limit=-1)
    with pytest.raises(ValueError):
        store.list_namespaces(max_depth=0)
    with pytest.raises(ValueError):
        store.batch(["not an op"])
    with pytest.raises(ValueError):
        store.put(("a",), "k", {"v": 1}, ttl=-5)
    with pytest.raises(fastmem.InvalidInputError):
        store.put(("a",), "k", {"when": datetime.now()})  # not msgpack data
    assert len(store.store) == 0


# --- async --------------------------------------------------------------------------------


def test_the_async_calls_work_and_run_off_the_event_loop(store):
    threads = []
    batch = store.batch

    def recording(ops):
        threads.append(threading.get_ident())
        return batch(ops)

    store.batch = recording  # type: ignore[method-assign]

    async def main():
        loop_thread = threading.get_ident()
        await store.aput(("a", "b"), "k", {"text": "asynchronous hello"})
        item = await store.aget(("a", "b"), "k")
        found = await store.asearch(("a",), query="hello")
        listed = await store.alist_namespaces()
        await store.adelete(("a", "b"), "k")
        gone = await store.aget(("a", "b"), "k")
        many = await asyncio.gather(*(store.aput(("p",), f"k{i}", {"i": i}) for i in range(20)))
        context = await store.acontext(("a",), "hello")
        return loop_thread, item, found, listed, gone, many, context

    loop_thread, item, found, listed, gone, many, context = asyncio.run(main())
    off_loop = list(threads)
    assert item.value == {"text": "asynchronous hello"} and keys(found) == ["k"]
    assert listed == [("a", "b")] and gone is None and len(many) == 20
    assert len(store.search(("p",), limit=50)) == 20
    assert len(off_loop) >= 25 and loop_thread not in off_loop
    assert context.text == ""  # the only item under ("a",) was deleted


# --- restart, processes, context ----------------------------------------------------------


def test_everything_survives_a_restart(path):
    with open_store(path) as store:
        store.put(("u", "1"), "a", {"text": "persisted fact about llamas", "n": 1})
        store.put(("u", "2"), "b", {"text": "another", "n": 2}, index=False)
        store.put(("u", "1"), "gone", {"text": "deleted"})
        store.delete(("u", "1"), "gone")
    with open_store(path) as store:
        assert keys(store.search(("u",), query="llamas")) == ["a"]  # no catalog loaded yet
        assert store.get(("u", "1"), "a").value == {"text": "persisted fact about llamas", "n": 1}
        assert store.get(("u", "1"), "gone") is None
        assert store.list_namespaces() == [("u", "1"), ("u", "2")]
        assert keys(store.search(("u",), filter={"n": 2})) == ["b"]


def test_one_handle_sees_anothers_puts_and_deletes(path):
    with open_store(path) as a, open_store(path) as b:
        a.put(("s",), "k1", {"text": "one"})
        assert b.get(("s",), "k1").value == {"text": "one"}
        a.put(("s",), "k1", {"text": "uno"})
        a.put(("s",), "k2", {"text": "two"})
        assert b.get(("s",), "k1").value == {"text": "uno"}
        assert sorted(keys(b.search(("s",)))) == ["k1", "k2"]
        a.delete(("s",), "k2")
        assert b.get(("s",), "k2") is None and keys(b.search(("s",))) == ["k1"]
        b.put(("s",), "k1", {"text": "eins"})
        assert a.get(("s",), "k1").value == {"text": "eins"} and len(a.store) == 1


def test_an_older_copy_of_a_key_left_by_a_crash_loses_to_the_newer(path):
    with open_store(path) as store:
        store.put(("c",), "k", {"text": "old value"})
    with fastmem.open(path) as raw:  # a crash between a put's add and its forget
        [old] = list(raw)
        meta = json.loads(json.dumps(old.metadata))
        meta["langgraph"]["value"] = {"text": "new value"}
        raw.add("new value", type=old.type, metadata=meta)
    with open_store(path) as store:  # a new process's first search: no catalog yet
        found = store.search(("c",), query="old value")  # the older copy ranks first
        assert [i.value for i in found] == [{"text": "new value"}]
    with open_store(path) as store:
        assert store.get(("c",), "k").value == {"text": "new value"}
        assert len(store.store) == 1  # the older copy was forgotten
        assert [i.value for i in store.search(("c",), query="value")] == [{"text": "new value"}]


def test_context_is_packed_within_the_budget_from_the_prefix_only(store):
    for i in range(40):
        store.put(("m", "alice"), f"f{i}", {"text": f"Alice's fact number {i}: she visited city {i}"})
        store.put(("m", "bob"), f"f{i}", {"text": f"Bob's fact number {i}: he visited town {i}"})
    context = store.context(("m", "alice"), "Which cities did she visit?", budget=120)
    assert 0 < context.tokens <= 120 and "Alice" in context.text and "Bob" not in context.text
    assert store.context(("m", "carol"), "anything").text == ""
    assert store.context(("m",), "town", budget=2000).text.count("Bob") > 0


def _once(backend):
    """The subprocess tests run fastmem's default kernels in their own processes: once."""
    if backend != BACKENDS[0]:
        pytest.skip("runs in subprocesses with the default kernels: once is enough")


def _run(*args, timeout=240):
    env = dict(os.environ, FASTMEM_EMBEDDER="default",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, AGENT, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_agent_loop_a_fact_told_in_one_process_reaches_the_model_in_the_next(path, backend):
    _once(backend)
    _run(path, "alice", "remember: My sister Ada moved to Lisbon last spring.")
    _run(path, "bob", "remember: I am allergic to peanuts.")
    [alice_input] = json.loads(_run(path, "alice", "Where does my sister live now?"))
    assert "Lisbon" in alice_input[0] and "peanuts" not in alice_input[0]
    assert alice_input[-1] == "Where does my sister live now?"
    [bob_input] = json.loads(_run(path, "bob", "Where does my sister live now?"))
    assert "Lisbon" not in bob_input[0]  # another user's namespace never reaches bob's model


def test_two_processes_writing_at_once_lose_nothing(path, backend):
    _once(backend)
    n = 60
    procs = [subprocess.Popen([sys.executable, AGENT, "--write", path, tag, str(n)],
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
             for tag in ("p1", "p2")]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    with open_store(path) as store:
        found = store.search(("shared",), limit=1000)
        assert sorted(keys(found)) == sorted([f"{t}-{i}" for t in ("p1", "p2") for i in range(n)] + ["last-writer"])
        assert store.get(("shared",), "last-writer").value["i"] == n - 1
        assert len(store.store) == 2 * n + 1  # one memory per key: the older copies forgotten


def test_it_opens_in_one_line_or_over_an_open_store(path):
    with FastmemStore.open(path, embedder=default_embedder()) as store:
        store.put(("a",), "k", {"text": "one line"})
    with fastmem.open(path) as raw:
        store = FastmemStore(raw)
        assert store.get(("a",), "k").value == {"text": "one line"}
        store.close()  # leaves the store it was given open
        assert len(raw) == 1


def test_a_query_finds_an_exact_identifier_by_its_keyword(store):
    for i in range(30):
        store.put(("tickets",), f"t{i}", {"text": f"Ticket INC-{4400 + i}: the printer on floor {i % 5} is jammed"})
    found = store.search(("tickets",), query="what happened with INC-4417?", limit=3)
    assert keys(found)[0] == "t17"  # a vector alone ranks these near-identical texts alike


def test_omit_expired_leaves_expired_items_out_of_the_context(path):
    with open_store(path, ttl={"omit_expired": True}) as store:
        store.put(("m",), "old", {"text": "the wifi password is hunter2"}, ttl=0.3 / 60)
        store.put(("m",), "new", {"text": "the door code is 4321"})
        assert "hunter2" in store.context(("m",), "what is the wifi password?").text
        time.sleep(0.5)
        assert "hunter2" not in store.context(("m",), "what is the wifi password?").text


def test_a_read_only_store_reads_and_refuses_writes(path):
    with open_store(path, ttl={"default_ttl": 10}) as store:
        store.put(("r",), "k", {"text": "read me"})
    with open_store(path, readonly=True) as store:
        assert store.get(("r",), "k").value == {"text": "read me"}  # no TTL refresh written
        assert keys(store.search(("r",), query="read")) == ["k"]
        with pytest.raises(fastmem.ReadOnlyError):
            store.put(("r",), "k2", {"text": "no"})

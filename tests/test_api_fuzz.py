"""Every public method with hostile arguments: a clear ``FastmemError`` and nothing written.

``test_store.py`` lists the known bad inputs one by one; here hypothesis puts hostile
values (wrong types, NaN and infinities, huge numbers, lone surrogates, bytes, huge
strings, deep or exotic containers, numpy values) into any argument of any method. A call
may succeed (the value happened to be valid); when it raises, the error must be a
``FastmemError`` with a message, and the data file must be unchanged byte for byte.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt

DIM = 8
HUGE_TEXT = "x" * (fmt.MAX_TEXT_BYTES + 1)
HUGE_UTF8 = "é" * (fmt.MAX_TEXT_BYTES // 2 + 1)  # under the limit in characters, over in bytes


def _deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc80" * 3, "ok\ud83d"])
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([np.float32("nan"), np.float64("inf"), np.int64(-1), np.uint64(2**64 - 1),
                     np.float16(65504), -0.0, 1e-320]),  # fmt: skip
)
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    st.text(max_size=30),
    SURROGATES,
    st.binary(max_size=20),
    st.sampled_from([HUGE_TEXT, HUGE_UTF8, "", " \n\t", "\x00", "m1", "m" + "9" * 30, "m-1"]),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=10),
    st.lists(st.integers(-5, 5), min_size=DIM, max_size=DIM),
    st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), SURROGATES), st.integers(), max_size=3),
    st.sampled_from([
        object(), {1, 2}, (1.0,) * DIM, np.full(DIM, np.nan), np.ones((2, DIM)), np.ones(DIM, dtype=bool),
        np.array(["a"] * DIM), _deep(600), {"k": _deep(600)}, {"k": object()}, {"k": {1: 2}},
        {"k": "\ud800"}, {"k": 2**70}, {"k": {"s": {1, 2}}}, {"b": "x" * (fmt.MAX_METADATA_BYTES + 1)},
        lambda: None, type, Ellipsis, [{"text": "x"}], [{"text": 1}], iter([1, 2]),
    ]),  # fmt: skip
)

# Each method, with valid arguments; one of them is replaced by a hostile value.
CALLS = {
    "add": ("hello there", {"type": "fact", "timestamp": 1.7e9, "session": "s", "importance": 0.5,
                            "pinned": False, "metadata": {"a": 1}, "summary": "hi",
                            "embedding": [1.0] * DIM}),
    "add_many": ([{"text": "one", "embedding": [1.0] * DIM}], {}),
    "get": ("m0", {}),
    "update": ("m0", {"importance": 0.4, "pinned": True, "metadata": {"b": 2}}),
    "pin": ("m0", {"pinned": True}),
    "forget": ("m1", {}),
    "search": ("hello", {"k": 3, "types": ["fact"], "since": 0.0, "until": 2e9, "session": "s",
                         "mode": "keyword"}),
    "context": ("hello", {"budget": 200, "session": "s", "encoding": "cl100k_base"}),
    "recent": (5, {}),
}  # fmt: skip


def _store(path: str) -> fastmem.MemoryStore:
    store = fastmem.open(path, dim=DIM, embedder=None, durability="none")
    store.add_many([{"text": f"memory {i} hello", "embedding": [1.0 + i] + [0.5] * (DIM - 1),
                     "session": "s", "type": "fact"} for i in range(3)])  # fmt: skip
    store.flush()
    return store


def _call_checked(store: fastmem.MemoryStore, name: str, args: tuple, kwargs: dict) -> None:
    with open(store.dat_path, "rb") as f:
        before = f.read()
    try:
        getattr(store, name)(*args, **kwargs)
    except fastmem.FastmemError as exc:
        assert str(exc), "an error without a message"
        with open(store.dat_path, "rb") as f:
            assert f.read() == before, f"{name} raised {exc!r} but wrote to the data file"


def test_every_method_with_a_hostile_argument(tmp_path):
    store = _store(str(tmp_path / "s"))

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(sorted(CALLS)), st.data())
    def check(name, data):
        first, kwargs = CALLS[name]
        kwargs = dict(kwargs)
        slot = data.draw(st.sampled_from(["<first>", *kwargs]), label="argument")
        value = data.draw(HOSTILE, label="value")
        if slot == "<first>":
            first = value
        else:
            kwargs[slot] = value
        if name == "search" and data.draw(st.booleans(), label="other mode"):
            kwargs["mode"] = data.draw(st.sampled_from(["vector", "hybrid"]))
        _call_checked(store, name, (first,), kwargs)

    try:
        check()
        assert store.verify().ok
    finally:
        store.close()


def test_add_many_items_with_hostile_fields(tmp_path):
    store = _store(str(tmp_path / "s"))
    keys = ["text", "type", "timestamp", "session", "importance", "pinned", "metadata", "summary",
            "embedding", "colour"]  # fmt: skip

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.dictionaries(st.sampled_from(keys), HOSTILE, max_size=4), min_size=1, max_size=3))
    def check(items):
        items = [{"text": "fine", **item} for item in items]
        _call_checked(store, "add_many", (items,), {})

    try:
        check()
        assert store.verify().ok
    finally:
        store.close()


OPEN_KEYWORDS = ["dim", "embedder", "readonly", "durability", "timeout", "summarizer", "policy", "namespace"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OPEN_KEYWORDS), HOSTILE)
def test_open_with_a_hostile_argument(tmp_path_factory, name, value):
    path = str(tmp_path_factory.mktemp("open") / "s")
    try:
        fastmem.open(path, **{"embedder": None, name: value}).close()
    except fastmem.FastmemError as exc:
        assert str(exc)
    else:
        return
    if os.path.exists(path + ".dat"):  # a refused open may have created the store, empty
        assert os.path.getsize(path + ".dat") <= fmt.DAT_HEADER_SIZE


@pytest.mark.parametrize("path", [b"bytes/path", "", None, 3, "\ud800", "a\x00b"])
def test_open_with_a_hostile_path(path):
    with pytest.raises(fastmem.FastmemError):
        fastmem.open(path, embedder=None)


def test_arrays_where_a_name_or_a_flat_vector_goes_are_refused(tmp_path):
    deep: list = [1.0]
    for _ in range(70):  # numpy arrays have at most 64 dimensions
        deep = [deep]
    with _store(str(tmp_path / "s")) as store:
        for mode in ("vector", "hybrid"):
            with pytest.raises(fastmem.InvalidInputError):
                store.search(deep, mode=mode)
        with pytest.raises(fastmem.InvalidTypeError):  # compared with "conversation" it was ambiguous
            store.add_many([{"text": "x", "type": np.full(8, np.nan)}])


def test_nan_and_infinite_numbers_are_refused_everywhere(tmp_path):
    with _store(str(tmp_path / "s")) as store:
        size = os.path.getsize(store.dat_path)
        for bad in (math.nan, math.inf, -math.inf):
            for call in (
                lambda: store.add("x", timestamp=bad),
                lambda: store.add("x", importance=bad),
                lambda: store.update("m0", importance=bad),
                lambda: store.search("x", since=bad),
                lambda: store.search("x", until=bad),
                lambda: store.search([bad] * DIM, mode="vector"),
                lambda: store.add("x", embedding=[bad] * DIM),
            ):
                with pytest.raises(fastmem.InvalidInputError):
                    call()
        assert os.path.getsize(store.dat_path) == size

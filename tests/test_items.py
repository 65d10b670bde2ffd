"""add_many's batch kernels (``prepare_batch``, ``gather_vectors``): the compiled twins
against the Python references (which check each item with ``fastmem.storage.records.prepare``),
good and bad items alike, and a store built from a mix of items byte for byte against the
one fastmem wrote before the kernels existed (``fixtures/add_many``)."""

from __future__ import annotations

import sys
from collections import UserDict
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem.storage import records as _items
from fastmem import _kernels
from fastmem._kernels import reference as ref

ext = pytest.importorskip("fastmem._kernels._ext.items")

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import build_add_many  # noqa: E402

from fastmem.tokens import TokenCounter

NOW = 1_767_300_000.5


def test_compiled_constants_match_the_format():
    c = ext.CONSTANTS
    assert c["MAX_TEXT_BYTES"] == fmt.MAX_TEXT_BYTES
    assert c["MAX_TYPE_CHARS"] == fmt.MAX_TYPE_CHARS
    assert c["MAX_SESSION_CHARS"] == fmt.MAX_SESSION_CHARS
    assert c["MAX_TIMESTAMP"] == fmt.MAX_TIMESTAMP
    assert c["FLAG_PINNED"] == fmt.FLAG_PINNED
    assert c["MAX_DIM"] == fmt.MAX_DIM
    assert c["DEFAULT_IMPORTANCE"] == fmt.DEFAULT_IMPORTANCE
    assert c["DEFAULT_USER_TYPE_IMPORTANCE"] == fmt.DEFAULT_USER_TYPE_IMPORTANCE
    assert c["ADD_KEYS"] == _items.ADD_KEYS


@pytest.mark.parametrize("beside", [False, True], ids=["counted-here", "counted-beside"])
def test_a_mix_of_items_writes_the_bytes_fastmem_wrote_before(tmp_path, backend, beside, monkeypatch):
    """The fixture was written item by item, before prepare_batch; each backend (the
    autouse ``backend`` fixture) writes the same data and index files, whether a batch's
    texts are counted in the helper thread (its keyword terms and int8 rows then made
    before the writer lock) or not."""
    monkeypatch.setattr(_items, "BESIDE_MIN", 1 if beside else 10**9)
    with pytest.warns(fastmem.RecoveryWarning):  # the pre-made header has no index yet
        build_add_many.build(str(tmp_path / "store"))
    for name in ("store.dat", "store.idx"):
        want = (FIXTURES / "add_many" / name).read_bytes()
        assert (tmp_path / name).read_bytes() == want, f"{name} ({backend})"
    # Its records are the item-by-item path's: the same file without its batch frames.
    assert _as_v1((tmp_path / "store.dat").read_bytes()) == (FIXTURES / "add_many" / "store-v1.dat").read_bytes()


def _as_v1(data: bytes) -> bytes:
    """A data file as data file version 1 wrote it: its batch frames left out."""
    h = fmt.unpack_dat_header(data, "")
    out = [fmt.pack_dat_header(h.uuid, h.dim, h.created, h.next_id, h.compacted_end, h.embedder)]
    out[0] = out[0][:8] + (1).to_bytes(2, "little") + out[0][10:60]
    out[0] += fmt.crc32(out[0]).to_bytes(4, "little")
    offsets, lengths = _kernels.scan_records(data, fmt.DAT_HEADER_SIZE, len(data))[:2]
    out += [data[o : o + n] for o, n in zip(offsets.tolist(), lengths.tolist())]
    return b"".join(out)


# --- both backends: the same results, or the same error -----------------------------------

GOOD_TEXT = st.one_of(st.text(min_size=1, max_size=12), st.sampled_from(["hello", "naïve café", "東京"]))
GOOD = {
    "text": GOOD_TEXT,
    "type": st.sampled_from([None, "conversation", "fact", "plan", "tool_result", "journal", "ñ",
                             "t" * 64]),
    "timestamp": st.one_of(st.none(), st.floats(0, fmt.MAX_TIMESTAMP), st.integers(0, 2**40)),
    "session": st.sampled_from([None, "s1", "s2", "sesión", "s" * 256]),
    "importance": st.one_of(st.none(), st.floats(0, 1), st.sampled_from([0.3, 0.5, 0.7, 0.9, 0, 1])),
    "pinned": st.booleans(),
    "metadata": st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
    "summary": st.one_of(st.none(), GOOD_TEXT),
    "embedding": st.sampled_from([None, [1.0, 2.0], np.ones(3, np.float32)]),
}  # fmt: skip
# Values at and beyond each check's edge, and of every wrong type, for any key.
EDGES = [
    "", " ", " \t\n", "\x1c\x1f", "\x00", "\x85", "\u3000", "x" * 65, "y" * 257, "\ud800",
    "ok\udfff", "x" * (fmt.MAX_TEXT_BYTES + 1), "é" * (fmt.MAX_TEXT_BYTES // 2 + 1), -0.0, -1e-300,
    1.0000000000000002, fmt.MAX_TIMESTAMP, fmt.MAX_TIMESTAMP * (1 + 2**-52), np.float64(0.5),
    np.float32(0.25), np.int64(1), 2**70, [1.0, 2.0], {"a": 1}, {1: 2}, object(),
    type("Str", (str,), {})("sub"), type("Float", (float,), {})(0.5), None, True, False, 0, 1, -1,
    0.0, 1.0, 0.3, 0.9, float("nan"), float("inf"), -float("inf"), "a", "fact", "conversation",
    "t" * 64, "s" * 256, b"x", "\x7f", "\x7fz", "a\x00",
]  # fmt: skip
BAD = st.one_of(
    st.text(max_size=4), st.binary(max_size=4), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-2, 2), st.sampled_from(EDGES),
)


@st.composite
def items(draw):
    """A valid item, often with one or two keys (or an unknown key) given a bad value, and
    now and then not a dict at all."""
    item = {"text": draw(GOOD["text"])}
    for key in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=5, unique=True)):
        value = draw(GOOD[key], label=key)
        if value is not None or draw(st.booleans()):  # None given, or left out
            item[key] = value
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2]))):
        item[draw(st.sampled_from([*sorted(GOOD), "colour"]))] = draw(BAD, label="bad")
    if draw(st.booleans()) and draw(st.booleans()):
        del item["text"]
    shape = draw(st.integers(0, 19))
    if shape == 0:
        return UserDict(item)  # a Mapping, not a dict
    if shape == 1:
        return draw(BAD)
    if shape == 2:
        return type("Items", (dict,), {})(item)  # a dict subclass
    return item


def _outcome(prepare_batch, batch):
    try:
        out = prepare_batch(list(batch), NOW, _items.prepare)
    except fastmem.FastmemError as exc:
        return "error", type(exc), str(exc), getattr(exc, "item", None)
    payloads, texts, embeddings, type_names, type_index, sessions, session_index, imp, flags, ts = out
    arrays = (type_index, session_index, imp, flags, ts)
    return (
        "ok",
        [msgpack.packb(p, use_bin_type=True) for p in payloads],  # key order and value types
        [(type(t), t) for t in texts], [id(e) for e in embeddings], type_names, sessions,
        [(a.dtype.str, a.tolist()) for a in arrays],
    )


@pytest.mark.parametrize("key", [*sorted(GOOD), "colour"])
def test_prepare_batch_agrees_with_the_reference_at_every_edge(key):
    """Each edge value in each key of otherwise valid items (alone, after a good item,
    and beside a pin, an importance and a session), and as the item itself."""
    bases = [{"text": "fine"}, {"text": "fine", "type": "fact", "session": "s", "pinned": True,
                                "importance": 0.5, "timestamp": 1.5}]  # fmt: skip
    for value in EDGES:
        for base in bases:
            item = {**base, key: value}
            for batch in ([item], [{"text": "first"}, item]):
                assert _outcome(ext.prepare_batch, batch) == _outcome(ref.prepare_batch, batch), (key, value)
    for value in EDGES:
        assert _outcome(ext.prepare_batch, [value]) == _outcome(ref.prepare_batch, [value])


@given(st.lists(items(), max_size=6))
def test_prepare_batch_agrees_with_the_reference(batch):
    assert _outcome(ext.prepare_batch, batch) == _outcome(ref.prepare_batch, batch)


@given(st.lists(items(), max_size=6))
def test_every_item_with_a_summary_is_checked_by_the_fallback(batch):
    """Batch learns which items came with a summary from the calls of prepare_batch's
    fallback (a bulk load's payloads are not looked at one by one): both backends pass
    every such item to it."""
    for kernel in (ext.prepare_batch, ref.prepare_batch):
        called: list[int] = []

        def fallback(i, item, now, called=called):
            called.append(i)
            return _items.prepare(i, item, now)

        try:
            payloads = kernel(list(batch), NOW, fallback)[0]
        except fastmem.FastmemError:
            continue
        summarized = [j for j, p in enumerate(payloads) if "u" in p]
        assert set(summarized) <= set(called)
    try:
        assert _items.Batch(list(batch), NOW).summarized == summarized
    except fastmem.FastmemError:
        pass


def test_a_batch_knows_its_items_given_a_summary():
    batch = [{"text": "a"}, {"text": "b", "summary": "s"}, {"text": "c", "metadata": {"k": 1}},
             {"text": "d", "summary": "t", "session": "x"}, {"text": "e"}]  # fmt: skip
    assert _items.Batch(batch, NOW).summarized == [1, 3]


def test_prepare_batch_raises_for_the_first_bad_item_in_order():
    batch = [{"text": "fine"}, {"text": "fine", "importance": 2.0}, {"text": ""}]
    for kernel in (ext.prepare_batch, ref.prepare_batch):
        with pytest.raises(fastmem.InvalidInputError, match="importance must be a finite number"):
            kernel(batch, NOW, _items.prepare)


VECTOR_SHAPES = st.sampled_from([
    lambda rng: rng.standard_normal(8).astype(np.float32),
    lambda rng: rng.standard_normal(8).astype(np.float32),  # the common case, twice as often
    lambda rng: rng.standard_normal(8),  # float64
    lambda rng: rng.standard_normal(8).astype(">f4"),  # not native
    lambda rng: rng.standard_normal(16).astype(np.float32)[::2],  # not contiguous
    lambda rng: rng.standard_normal(4).astype(np.float32),  # another length
    lambda rng: rng.standard_normal((1, 8)).astype(np.float32),  # 2-D
    lambda rng: np.zeros(0, np.float32),
    lambda rng: [1.0] * 8,
    lambda rng: np.ma.masked_array(np.ones(8, np.float32)),  # a subclass
])  # fmt: skip


@given(st.lists(VECTOR_SHAPES, max_size=5), st.sampled_from([0, 4, 8, fmt.MAX_DIM]), st.integers(0, 99))
def test_gather_vectors_agrees_with_the_reference(makers, dim, seed):
    rng = np.random.default_rng(seed)
    vectors = [make(rng) for make in makers]
    got, want = ext.gather_vectors(vectors, dim), ref.gather_vectors(vectors, dim)
    if want is None:
        assert got is None
    else:
        assert got.dtype == want.dtype == np.float32 and got.flags.c_contiguous
        assert np.array_equal(got, want) and got.shape == (len(vectors), dim or len(vectors[0]))


def test_gather_vectors_refuses_an_overlong_vector():
    v = np.ones(fmt.MAX_DIM + 1, np.float32)
    assert ext.gather_vectors([v], 0) is None and ref.gather_vectors([v], 0) is None


@given(st.lists(st.integers(0, 9), max_size=8), st.booleans(), st.integers(0, 3))
def test_gather_vectors_of_rows_of_one_array(picks, consecutive, start):
    """Rows of one 2-D array (a model's batch): consecutive ones come back as a read-only
    view of it, any others as a copy; the values are the rows' either way."""
    rows = np.random.default_rng(start).standard_normal((14, 4)).astype(np.float32)
    if consecutive:
        picks = list(range(start, start + len(picks)))
    vectors = [rows[i] for i in picks]
    got, want = ext.gather_vectors(vectors, 4), ref.gather_vectors(vectors, 4)
    if not picks:
        assert got is None and want is None
        return
    assert np.array_equal(got, rows[picks]) and np.array_equal(want, rows[picks])
    assert got.flags.c_contiguous and got.dtype == np.float32
    if len(picks) > 1 and all(b == a + 1 for a, b in zip(picks, picks[1:])):
        assert np.shares_memory(got, rows) and not got.flags.writeable
    else:
        assert not np.shares_memory(got, rows)


# --- a large batch: its texts counted in the helper thread ----------------------------------


def _large_batch(n: int) -> list[dict]:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((n, 8)).astype(np.float32)
    return [{"text": f"note {i} about the trip", "embedding": vectors[i]} for i in range(n)]


def test_a_bad_vector_in_a_large_batch_is_the_error_even_when_counting_fails(store_path, monkeypatch):
    """The helper thread's counting error comes second: the vectors are checked first,
    as when the texts were counted after them; nothing is written either way."""
    items = _large_batch(_items.BESIDE_MIN)
    items[-3]["embedding"] = np.full(8, np.nan, dtype=np.float32)

    class Broken:
        def work(self):
            raise RuntimeError("the counter failed")

        counts = work

    def broken(self, texts):
        return Broken()

    with fastmem.open(store_path, dim=8, embedder=None) as store:
        monkeypatch.setattr(TokenCounter, "count_shared", broken)
        with pytest.raises(fastmem.InvalidInputError, match=f"item {len(items) - 3}:"):
            store.add_many(items)
        items[-3]["embedding"] = np.ones(8, dtype=np.float32)
        with pytest.raises(RuntimeError, match="the counter failed"):
            store.add_many(items)
        monkeypatch.undo()
        assert len(store) == 0
        assert store.add_many(items[:2]) == ["m0", "m1"]  # the ids no failed call took


def test_add_many_frees_its_batch_before_the_collector_is_back_on(store_path):
    """The cycle collector is paused while a batch lives, and the batch's young payloads
    are freed by reference counting before it is back on: ten batches of 1,000 run at most
    three collections (each call leaves ~100 young objects of its own: the ids, the index's
    new runs), where a pause that ended with them alive ran one per batch."""
    import gc

    runs = []

    def seen(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    with fastmem.open(store_path, dim=8, embedder=None) as store:
        batches = [_large_batch(1000) for _ in range(10)]
        gc.callbacks.append(seen)
        try:
            for batch in batches:
                store.add_many(batch)
        finally:
            gc.callbacks.remove(seen)
        assert len(store) == 10_000
    assert gc.isenabled() and len(runs) <= 3, runs


def test_a_large_batch_counts_its_texts_beside_and_stores_them_as_one_by_one(store_path):
    items = _large_batch(_items.BESIDE_MIN + 5)
    with fastmem.open(store_path, dim=8, embedder=None) as store:
        ids = store.add_many(items)
        counter = store.tokens
        for mid, item in zip(ids[::97], items[::97]):
            assert store.info(mid).text_tokens == counter.count(item["text"])
        assert [h.id for h in store.search("note 300", k=1, mode="keyword")] == [ids[300]]


@given(st.integers(0, 2**64 - 1), st.integers(0, 30))
def test_memory_ids_agree_with_the_reference(first, n):
    n = min(n, 2**64 - first)
    got = ext.memory_ids(first, n)
    assert got == ref.memory_ids(first, n) == ["m" + str(first + i) for i in range(n)]
    assert all(type(mid) is str and mid.isascii() and {mid: 1}[f"m{first + i}"] for i, mid in enumerate(got))

"""A large ``add_many`` is made ready a block of items at a time (vectors, int8 rows and
keyword terms: ``_items.PREP_BLOCK``), its float16 rows made again from the caller's float32
arrays as they are packed: the files, rows, vectors and search results are those of the
batch made whole, and a bad item in a late block still writes nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem.storage import engine as _engine, records as _items
from fastmem import _format as fmt
from fastmem.storage.vectors import BlockedVectors
from fastmem.errors import DimensionMismatchError, InvalidInputError

DIM = 8


class LetterEmbedder:
    """A deterministic stand-in embedder (a unit test's): letter counts of the text."""

    name, dim = "letters", DIM

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(len(texts))
        out = np.ones((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            for ch in text:
                out[i, ord(ch) % DIM] += 1
        return out


def _mixed(n: int) -> list[dict[str, Any]]:
    """Items whose embeddings are float32 arrays (the common case), in runs of other kinds:
    float64 arrays, lists, none (embedded, or stored without a vector)."""
    rng = np.random.default_rng(7)
    items = []
    for i in range(n):
        kind = (i // 9) % 4
        vec = rng.standard_normal(DIM).astype(np.float32)
        embedding: Any = (vec, vec.astype(np.float64), vec.tolist(), None)[kind]
        items.append({"text": f"item {i} " + f"word{i % 17} " * (1 + i % 5),
                      "timestamp": 1e9 + i, "type": ("fact", "plan", "ñote")[i % 3],
                      "session": f"s{i % 4}" if i % 2 else None, "embedding": embedding})  # fmt: skip
    return items


def _state(path: str) -> list[Any]:
    with fastmem.open(path, readonly=True, embedder=None, summarizer=None) as r:
        assert r.verify().ok
        query = np.ones(DIM, dtype=np.float32)
        return [
            Path(path + ".dat").read_bytes()[fmt.DAT_HEADER_SIZE :],
            [tuple(m)[:-1] for m in r],
            [None if (v := r.vector(mid)) is None else v.tolist() for mid in r.ids()],
            [(h.id, h.score) for h in r.search(query, k=20, mode="vector")],
            [(h.id, h.score) for h in r.search("word3 item", k=20, mode="keyword")],
        ]


@pytest.mark.parametrize("embedder", [None, LetterEmbedder()], ids=["no embedder", "embedder"])
def test_a_batch_made_in_blocks_is_the_batch_made_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder: Any
) -> None:
    states = []
    # 7: blocks the packing's 5 cut across; 10: a multiple of them (views)
    for prep in (10**9, 7, 10):
        monkeypatch.setattr(_items, "PREP_BLOCK", prep)
        monkeypatch.setattr(_engine, "PACK_BLOCK", 5)
        path = str(tmp_path / f"s{prep}")
        with fastmem.open(path, durability="none", embedder=embedder, summarizer=None) as s:
            s.add_many(_mixed(100))
            s.add_many([{"text": f"plain {i}", "timestamp": 1.0} for i in range(30)])
        states.append(_state(path))
    assert states[0] == states[1] == states[2]
    assert sum(v is not None for v in states[0][2]) == (130 if embedder else 81)


def test_a_batch_of_blocks_without_vectors_keeps_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_items, "PREP_BLOCK", 4)
    path = str(tmp_path / "s")
    items = [{"text": f"t{i}", "embedding": None if i < 9 else np.ones(DIM, np.float32)}
             for i in range(12)]  # fmt: skip
    with fastmem.open(path, durability="none", embedder=None, summarizer=None) as s:
        ids = s.add_many(items)
        assert [s.vector(mid) is None for mid in ids] == [True] * 9 + [False] * 3
        assert s.add_many([{"text": f"u{i}"} for i in range(10)])  # no vector in any block
        assert s.verify().ok and len(s) == 22


@pytest.mark.parametrize("bad", ["nan", "zero", "length"])
def test_a_bad_embedding_in_a_late_block_writes_nothing(
    store_path: str, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setattr(_items, "PREP_BLOCK", 7)
    items = _mixed(60)
    items[45]["embedding"] = {"nan": np.full(DIM, np.nan, np.float32),
                              "zero": np.zeros(DIM, np.float32),
                              "length": np.ones(DIM + 1, np.float32)}[bad]  # fmt: skip
    with fastmem.open(store_path, durability="none", embedder=None, summarizer=None) as s:
        s.add("before", embedding=np.ones(DIM))
        size = os.path.getsize(store_path + ".dat")
        error = DimensionMismatchError if bad == "length" else InvalidInputError
        with pytest.raises(error, match="item 45" if bad != "length" else "length 9"):
            s.add_many(items)
        assert os.path.getsize(store_path + ".dat") == size and len(s) == 1
        assert s.add_many(_mixed(20))[0] == "m1"
        assert s.verify().ok and len(s) == 21


def test_an_embedding_made_bad_before_it_is_packed_writes_nothing(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float16 rows are made again from the caller's arrays as they are packed: an
    array changed meanwhile (a caller's race) to one no store takes is refused there, and
    the write cut back."""
    monkeypatch.setattr(_items, "PREP_BLOCK", 7)
    monkeypatch.setattr(_engine, "PACK_BLOCK", 7)
    items = [{"text": f"t{i}", "embedding": np.ones(DIM, np.float32) + i} for i in range(30)]
    real = _engine.Engine.commit_memories

    def spoiling(self: Any, *args: Any, **kwargs: Any) -> Any:
        items[20]["embedding"][:] = np.nan
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_engine.Engine, "commit_memories", spoiling)
    with fastmem.open(store_path, durability="none", embedder=None, summarizer=None) as s:
        s.add("before", embedding=np.ones(DIM))
        size = os.path.getsize(store_path + ".dat")
        with pytest.raises(InvalidInputError):
            s.add_many(items)
        assert os.path.getsize(store_path + ".dat") == size and len(s) == 1
        monkeypatch.setattr(_engine.Engine, "commit_memories", real)
        assert s.add_many(_mixed(10))[0] == "m1"
        assert s.verify().ok


def test_blocked_vectors_slices_as_one_array() -> None:
    made: list[int] = []
    whole = np.arange(26 * 3, dtype=np.float16).reshape(26, 3)

    def maker(lo: int, hi: int) -> Any:
        def make() -> np.ndarray:
            made.append(lo)
            return whole[lo:hi].copy()

        return make

    vectors = BlockedVectors([whole[0:10], maker(10, 20), maker(20, 26)], [10, 10, 6], 3)
    assert vectors.shape == (26, 3) and len(vectors) == 26
    for lo, hi in [(0, 10), (0, 5), (10, 15), (15, 20), (20, 26), (3, 24), (0, 26), (25, 40), (26, 30)]:
        assert np.array_equal(vectors[lo:hi], whole[lo:hi]), (lo, hi)
    assert np.array_equal(np.asarray(vectors), whole)
    made.clear()
    vectors[10:12], vectors[12:20], vectors[20:22], vectors[22:26]
    assert made == [10, 20]  # each block made once as it is packed in order
    with pytest.raises(ValueError):
        vectors[0:10:2]

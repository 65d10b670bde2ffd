"""The default embedder: all-MiniLM-L6-v2 in numpy, checked against sentence-transformers,
and the store using it (background load, recorded identity, degraded contexts)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
import types
import unittest
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fastmem
from fastmem import embed
from fastmem.errors import EmbedderMismatchError, EmbedderUnavailableError, InvalidTypeError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev.json"


@pytest.fixture(autouse=True)
def backend() -> str:
    """Once, with the default kernels: the model runs in numpy whatever the backend."""
    return fastmem.BACKEND


@pytest.fixture(scope="module")
def model() -> embed.MiniLM:
    m = embed.default_embedder()
    assert m.wait(120)
    return m


# Empty, one character, longer than the model's 256 tokens, non-ASCII.
EDGE_TEXTS = ["", "a", "word " * 400, "Ünïcödé 漢字 and an emoji 🎉"]


def real_texts(n: int) -> list[str]:
    """``n`` conversation turns from the LoCoMo dev half; where the shared data is not beside
    the checkout, ``n`` sentences of the standard library's docstrings (real English too)."""
    texts: list[str] = []
    if DATA.exists():
        for sample in json.loads(DATA.read_text()):
            for key, turns in sample["conversation"].items():
                if key.startswith("session_") and isinstance(turns, list):
                    texts.extend(turn["text"] for turn in turns)
    else:
        for module in (argparse, asyncio, collections, logging, pathlib, subprocess, tarfile,
                       threading, unittest, zipfile):
            for obj in vars(module).values():
                doc = obj.__doc__ if isinstance(obj, (type, types.FunctionType)) else None
                if isinstance(doc, str):
                    texts.extend(s for s in " ".join(doc.split()).split(". ") if len(s) > 30)
        texts = sorted(set(texts))
    assert len(texts) >= n, len(texts)
    return texts[:: len(texts) // n][:n]


def test_the_numpy_runtime_gives_sentence_transformers_vectors(model):
    from sentence_transformers import SentenceTransformer

    texts = real_texts(60) + EDGE_TEXTS
    ours = model.encode(texts)
    theirs = SentenceTransformer(str(model.path), device="cpu").encode(
        texts, normalize_embeddings=True, batch_size=16
    )
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cosines = (ours * theirs).sum(axis=1)
    assert cosines.min() >= 0.9999, (cosines.min(), texts[int(cosines.argmin())])


def test_batching_does_not_change_a_vector(model):
    texts = real_texts(40)
    together = model.encode(texts)
    alone = np.stack([model.encode([t])[0] for t in texts[:8]])
    np.testing.assert_allclose(together[:8], alone, atol=1e-5)


def test_query_vectors_are_cached_and_read_only(model):
    first = model.encode_query("what does the user eat?")
    assert model.encode_query("what does the user eat?") is first
    assert not first.flags.writeable
    np.testing.assert_allclose(first, model.encode(["what does the user eat?"])[0], atol=1e-6)


def test_encode_takes_a_list_of_strings(model):
    for bad in ("one string", [b"bytes"], None, [1]):
        with pytest.raises(InvalidTypeError):
            model.encode(bad)  # type: ignore[arg-type]
    assert model.encode([]).shape == (0, 384)


def test_the_model_is_found_without_a_download(model, monkeypatch, tmp_path):
    assert embed.find_model() == model.path
    monkeypatch.setenv("FASTMEM_MODEL_PATH", str(model.path))
    assert embed.find_model() == model.path
    with pytest.raises(EmbedderUnavailableError, match="embedder=None"):
        embed.find_model(tmp_path)


def copy_model(model: embed.MiniLM, dest: Path, weights: bytes | None = None) -> Path:
    dest.mkdir()
    shutil.copy(model.path / "tokenizer.json", dest / "tokenizer.json")
    if weights is None:
        os.symlink(model.path / "model.safetensors", dest / "model.safetensors")
    else:
        (dest / "model.safetensors").write_bytes(weights)
    return dest


def test_weights_that_fail_their_checksum_are_refused(model, tmp_path):
    weights = bytearray((model.path / "model.safetensors").read_bytes())
    weights[len(weights) // 2] ^= 1  # one bit of one weight
    tampered = embed.MiniLM(copy_model(model, tmp_path / "m", bytes(weights)))
    with pytest.raises(EmbedderUnavailableError, match="sha256"):
        tampered.wait(60)
    assert not tampered.ready
    with pytest.raises(EmbedderUnavailableError):
        tampered.encode(["x"])


def test_a_store_whose_model_failed_writes_nothing_it_cannot_embed(model, tmp_path):
    weights = (model.path / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0"
    broken = embed.MiniLM(copy_model(model, tmp_path / "m", weights))
    path = str(tmp_path / "store")
    with fastmem.open(path, embedder=broken) as store:
        store.add("given a vector", embedding=np.ones(384, dtype=np.float32))
        size = os.path.getsize(path + ".dat")
        with pytest.raises(EmbedderUnavailableError):
            store.add("needs the model")
        assert os.path.getsize(path + ".dat") == size and len(store) == 1
        context = store.context("vector", budget=100)  # keywords still answer
        assert context.degraded and "given a vector" in context.text


@pytest.mark.parametrize(
    "damage",
    [b"", b"\x01", struct.pack("<Q", 1 << 40), struct.pack("<Q", 5) + b"{bad}",
     struct.pack("<Q", 80) + json.dumps(
         {"w.weight": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4]}}
     ).encode().ljust(80)],
)  # fmt: skip
def test_a_damaged_weights_file_gives_a_clear_error(damage):
    with pytest.raises(EmbedderUnavailableError):
        embed._read_safetensors(damage)


def test_a_default_store_embeds_and_records_its_model(model, store_path, monkeypatch):
    monkeypatch.delenv("FASTMEM_EMBEDDER")
    with fastmem.open(store_path, durability="none") as store:
        assert store._embedder is model
        store.add("The user adores cats and has two of them at home.")
        store.add("The deployment failed because the disk was full.", type="tool_result")
        store.add("Quarterly taxes are due in April.", type="fact")
        hits = store.search("Which pets does the user own?", k=1, mode="vector")
        assert "cats" in hits[0].memory.text
        context = store.context("Which pets does the user own?", budget=200)
        assert not context.degraded and "cats" in context.text

    class Other:  # another model of the same dimension
        name, dim = "someone/else", 384

        def encode(self, texts):
            return np.ones((len(texts), 384), dtype=np.float32)

    with pytest.raises(EmbedderMismatchError):
        fastmem.open(store_path, embedder=Other())
    with fastmem.open(store_path, embedder=None, readonly=True) as store:
        assert len(store) == 3  # keyword-only use of a store with vectors is fine


def test_a_store_ranks_by_keywords_until_the_model_is_ready(model, store_path):
    with fastmem.open(store_path, embedder=model, durability="none") as store:
        store.add_many([{"text": f"note {i} about the garden"} for i in range(20)])
    gate = threading.Event()

    class Loading(embed.MiniLM):  # a model whose load has not ended yet
        def _load(self) -> None:
            gate.wait(60)
            super()._load()

    with fastmem.open(store_path, embedder=Loading()) as store:
        context = store.context("garden", budget=100)
        assert context.degraded and "garden" in context.text
        assert store.search("garden", k=3)  # hybrid: keywords alone meanwhile
        gate.set()
        assert store._embedder.wait(60)
        assert not store.context("garden", budget=100).degraded


def test_without_the_model_open_says_what_to_install(store_path, monkeypatch, tmp_path):
    monkeypatch.delenv("FASTMEM_EMBEDDER")
    monkeypatch.setenv("FASTMEM_MODEL_PATH", str(tmp_path / "nowhere"))
    monkeypatch.setattr(embed, "_default", None)
    with pytest.raises(EmbedderUnavailableError, match=r"fastmem\[embed\]"):
        fastmem.open(store_path)
    assert not os.path.exists(store_path + ".dat")


def test_a_fresh_process_answers_before_and_after_the_model_loads(store_path, model):
    with fastmem.open(store_path, embedder=model, durability="none") as store:
        store.add("The user's favourite colour is teal.", pinned=True, type="fact")
        store.add("We planned a trip to Lisbon in May.", type="plan")
    script = (
        "import sys, fastmem\n"
        "store = fastmem.open(sys.argv[1])\n"
        "first = store.context('where are we travelling?', budget=120)\n"
        "store._embedder.wait()\n"
        "later = store.context('where are we travelling?', budget=120)\n"
        "print(first.tokens <= 120, 'Lisbon' in later.text, later.degraded)\n"
        "store.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTMEM_EMBEDDER"}
    out = subprocess.run(
        [sys.executable, "-c", script, store_path], env=env, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    assert out == ["True", "True", "False"]


def test_search_recall_on_real_embeddings(model, store_path):
    """Vector search (int8 scan, exact rescoring) against exact float32 top-10, on
    all-MiniLM-L6-v2 embeddings of real conversation turns: real vectors crowd together
    far more than random ones, which is where a quantized scan could lose neighbours."""
    texts = real_texts(600)
    vectors = model.encode(texts)
    queries = vectors[7::30]  # turns as queries: each has close neighbours among the others
    with fastmem.open(store_path, embedder=model, durability="none") as store:
        ids = store.add_many([{"text": t, "embedding": v} for t, v in zip(texts, vectors)])
        row_of = {mid: i for i, mid in enumerate(ids)}
        stored = vectors.astype(np.float16).astype(np.float64)  # what the store keeps
        stored /= np.linalg.norm(stored, axis=1, keepdims=True)
        found = total = 0
        for q in queries:
            exact = set(np.argsort(-(stored @ q.astype(np.float64)), kind="stable")[:10].tolist())
            hits = store.search(q, k=10, mode="vector")
            found += len(exact & {row_of[h.id] for h in hits})
            total += 10
    assert found / total >= 0.99, found / total

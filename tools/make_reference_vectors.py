"""Write the float32 reference vectors the embedder tests compare against.

The tests hold both runtimes (int8 on onnxruntime, float32 in numpy) to sentence-transformers
on the upstream all-MiniLM-L6-v2 weights. Running sentence-transformers needs torch, a
multi-GB download on most machines, so its vectors are computed once here and checked in as
``tests/data/minilm_reference.npz``; the test command then needs no torch.

Run from the repository's root, with the ``reference`` extra (torch's CPU build):

    pip install -e '.[reference]'
    python tools/make_reference_vectors.py          # rewrites tests/data/minilm_reference.npz
    python tools/make_reference_vectors.py --check  # recomputes, compares with the checked-in file

The texts are sentences of the standard library's docstrings (real English, licensed with
Python) and the edge cases the tests name (empty, one character, past the model's 256 tokens,
non-ASCII). They are stored with their vectors, so the file does not depend on the Python that
reads it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "minilm_reference.npz"
MODULES = ("argparse", "asyncio", "collections", "logging", "pathlib", "subprocess", "tarfile",
           "threading", "unittest", "zipfile")  # fmt: skip
EDGE_TEXTS = ["", "a", "word " * 400, "Ünïcödé 漢字 and an emoji 🎉"]
COUNT = 200  # real sentences; the tests use the first 120


def sentences(n: int) -> list[str]:
    """``n`` distinct docstring sentences, spread evenly over the sorted candidates."""
    found: set[str] = set()
    for name in MODULES:
        for obj in vars(importlib.import_module(name)).values():
            doc = obj.__doc__ if isinstance(obj, (type, types.FunctionType)) else None
            if isinstance(doc, str):
                found.update(s for s in " ".join(doc.split()).split(". ") if len(s) > 30)
    texts = sorted(found)
    return texts[:: len(texts) // n][:n]


def compute(texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    from fastmem import embed

    model = SentenceTransformer(str(embed.find_model()), device="cpu")
    return model.encode(texts, normalize_embeddings=True, batch_size=16).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="recompute and compare with the checked-in file; write nothing")  # fmt: skip
    args = parser.parse_args(argv)
    from fastmem import embed

    if args.check:
        stored = np.load(OUT)
        texts = [str(t) for t in stored["texts"]]
        cosines = (compute(texts) * stored["vectors"]).sum(axis=1)
        print(f"{len(texts)} texts, min cosine to the checked-in vectors {cosines.min():.6f}")
        return 0 if cosines.min() >= 0.99999 else 1
    texts = sentences(COUNT) + EDGE_TEXTS
    weights = embed.find_model() / "model.safetensors"
    about = {
        "model": embed.MODEL_NAME,
        "model.safetensors sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "python": sys.version.split()[0],
        "made by": "tools/make_reference_vectors.py",
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, texts=np.array(texts), vectors=compute(texts),
                        about=np.array(json.dumps(about)))  # fmt: skip
    print(f"wrote {OUT} ({len(texts)} texts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

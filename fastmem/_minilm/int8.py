"""The default model's int8 graph in numpy, for a query while onnxruntime loads.

A fresh process's first ``context()`` used to wait for onnxruntime's import, its session and
``tokenizers`` (~150 ms of CPU). This module computes the same vector from the same packaged
weights with numpy alone: the tokens by :mod:`fastmem._minilm.wordpiece`, then all-MiniLM-L6-v2's
int8 graph as onnxruntime runs it (``model.onnx``, built by ``tools/build_model.py``):

* the word embeddings are int8 rows with a float32 scale each;
* every matrix product is int8: the activations are quantized at run time to uint8 with one
  scale and zero point for the whole tensor (ONNX's ``DynamicQuantizeLinear``), the weights
  are int8 with one scale per output channel and zero point 0, and the integer product is
  scaled back to float32 (``MatMulIntegerToFloat`` / ``DynamicQuantizeMatMul``);
* attention, LayerNorm, exact GELU and mean pooling in float32.

The integer products run as float32 products of small integers (exact: a sum of 384
products of at most 255 x 127 stays below 2**24; the 1,536-term sums of the last dense
layer could exceed it only in values no text reaches). Where onnxruntime's kernels round
differently (its LayerNorm's variance, its erf), the vectors differ in the last bits: cosine
to onnxruntime's ≥ 0.999 on hundreds of texts (``tests/test_query_int8.py``).

The weights are read in place from ``model.onnx.data`` (a read-only memory map: nothing is
copied but the rows a query uses and each layer's weights while it runs), at the offsets
``int8_table.json`` lists (written by ``tools/build_query_table.py``: the graph is a
protobuf message, which fastmem does not parse).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from contextlib import nullcontext
from typing import Any

import numpy as np

from .bert import gelu as _gelu
from .bert import layer_norm as _layer_norm
from .wordpiece import WordPiece

__all__ = ["TABLE_FILE", "VOCAB_FILE", "Int8Query"]

TABLE_FILE = "int8_table.json"
VOCAB_FILE = "vocab.txt"
DATA_FILE = "model.onnx.data"
# The linear layers of one BERT layer, by the names of the float32 model's tensors.
ATTENTION = ("attention.self.query", "attention.self.key", "attention.self.value")


class Int8Query:
    """all-MiniLM-L6-v2's int8 graph in numpy: one text at a time, as onnxruntime runs it.

    Args:
        folder: the packaged model's folder (``model.onnx.data``, ``int8_table.json``,
            ``vocab.txt``).
        table_sha256: the sha256 ``int8_table.json`` must have (``None``: not checked).
        data_sha256: the sha256 of ``model.onnx.data`` the table must name (the caller
            checks the file itself against it).

    Raises:
        OSError: a file could not be read.
        ValueError: a file is not what the pinned checksums say, or the table is damaged.
    """

    def __init__(self, folder: str, *, table_sha256: str | None, data_sha256: str | None) -> None:
        with open(os.path.join(folder, TABLE_FILE), "rb") as f:
            raw = f.read()
        if table_sha256 is not None and hashlib.sha256(raw).hexdigest() != table_sha256:
            raise ValueError(f"{TABLE_FILE} does not have the sha256 fastmem pins ({table_sha256})")
        table = json.loads(raw)
        if data_sha256 is not None and table[f"{DATA_FILE}_sha256"] != data_sha256:
            raise ValueError(f"{TABLE_FILE} describes another {DATA_FILE}")
        with open(os.path.join(folder, VOCAB_FILE), "rb") as f:
            vocab = f.read()
        if table_sha256 is not None and hashlib.sha256(vocab).hexdigest() != table[f"{VOCAB_FILE}_sha256"]:
            raise ValueError(f"{VOCAB_FILE} does not have the sha256 its table names")
        words = vocab.decode("utf-8").split("\n")
        if words and not words[-1]:
            words.pop()
        self.tokenizer = WordPiece(words, max_tokens=int(table["max_tokens"]))
        self.layers, self.heads = int(table["layers"]), int(table["heads"])
        self.hidden = int(table["hidden"])
        self.attention_scale = np.float32(table["attention_scale"])
        with open(os.path.join(folder, DATA_FILE), "rb") as f:  # read in place, never copied
            data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
        self._w: dict[str, np.ndarray] = {}
        for name, info in table["tensors"].items():
            start, length = int(info["offset"]), int(info["length"])
            dtype, shape = np.dtype(info["dtype"]).newbyteorder("<"), tuple(info["shape"])
            if start < 0 or start + length > len(data) or length != dtype.itemsize * int(np.prod(shape)):
                raise ValueError(f"{TABLE_FILE}: {name} has a bad byte range")
            self._w[name] = data[start : start + length].view(dtype).reshape(shape)

    def ids(self, text: str) -> list[int]:
        """The text's token ids (``[CLS] … [SEP]``, at most 256).

        Raises:
            fastmem._minilm.wordpiece.UnsupportedText: a character the tokenizer does not take on
                trust (the caller uses ``tokenizers`` then).
        """
        return self.tokenizer.encode(text)

    def pooled(self, ids: list[int]) -> np.ndarray:
        """The mean-pooled last hidden state for one text's ids (not normalized), float32."""
        with _one_blas_thread():
            return self._pooled(ids)

    def _pooled(self, ids: list[int]) -> np.ndarray:
        w = self._w
        length = len(ids)
        rows = np.asarray(ids, dtype=np.intp)
        words = w["embeddings.word_embeddings.weight_q"][rows].astype(np.float32)
        words *= w["embeddings.word_embeddings.weight_scale"][rows]
        x = words + w["embeddings.token_type_embeddings.weight"][0]
        x += w["embeddings.position_embeddings.weight"][:length]
        x = _layer_norm(x, w, "embeddings.LayerNorm")
        heads, head_dim = self.heads, self.hidden // self.heads
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."
            xq, x_scale = _quantize(x)  # one quantization feeds query, key and value
            q, k, v = (
                _int8_linear(xq, x_scale, w, p + name).reshape(length, heads, head_dim).transpose(1, 0, 2)
                for name in ATTENTION
            )  # fmt: skip
            scores = (q @ k.transpose(0, 2, 1)) * self.attention_scale
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = (scores @ v).transpose(1, 0, 2).reshape(length, self.hidden)
            x = _layer_norm(
                _int8_linear(*_quantize(attended), w, p + "attention.output.dense") + x,
                w, p + "attention.output.LayerNorm",
            )  # fmt: skip
            hidden = _gelu(_int8_linear(*_quantize(x), w, p + "intermediate.dense"))
            x = _layer_norm(
                _int8_linear(*_quantize(hidden), w, p + "output.dense") + x, w, p + "output.LayerNorm"
            )
        return x.mean(axis=0, dtype=np.float32)


def _one_blas_thread() -> Any:
    """BLAS limited to one thread for the small products of a query (~10 x 384 rows): with
    OpenBLAS's threads a query took 50-110 ms of CPU here, on one 8.5 ms. numpy's own
    OpenBLAS is set directly (ctypes: ~1 ms the first time); another BLAS through
    threadpoolctl when it is installed (~4-10 ms to import); else BLAS's own threads."""
    global _blas
    if _blas is None:
        _blas = _bundled_openblas() or _threadpoolctl() or False
    return nullcontext() if _blas is False else _blas()


_blas: Any = None  # what _one_blas_thread calls for a context manager, or False


def _bundled_openblas() -> Any:
    """The one-thread context of the OpenBLAS inside numpy's wheel (numpy.libs), if that
    is the BLAS numpy uses."""
    import glob

    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]["name"]
    except (AttributeError, KeyError, TypeError):
        return None
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs", "libscipy_openblas64_*.so*"))
    if blas != "scipy-openblas" or len(libs) != 1:
        return None
    import ctypes
    from contextlib import contextmanager

    lib = ctypes.CDLL(libs[0])  # already loaded by numpy: the same library
    get, set_ = lib.scipy_openblas_get_num_threads64_, lib.scipy_openblas_set_num_threads64_
    get.restype = ctypes.c_int

    @contextmanager
    def one_thread() -> Any:
        before = get()
        set_(1)
        try:
            yield
        finally:
            set_(before)

    return one_thread


def _threadpoolctl() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    controller = ThreadpoolController()
    return lambda: controller.limit(limits=1, user_api="blas")


def _quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """ONNX's DynamicQuantizeLinear as onnxruntime computes it: uint8 with one scale and zero
    point for the whole tensor, its range stretched to include 0. Returns the quantized
    values minus their zero point (as float32: what the product multiplies) and the scale."""
    lo = min(np.float32(x.min()), np.float32(0))
    hi = max(np.float32(x.max()), np.float32(0))
    scale = np.float32(1) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zero = np.float32(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    q = np.clip(np.rint(x / scale) + zero, 0, 255)
    q -= zero
    return q, scale


def _int8_linear(xq: np.ndarray, x_scale: np.float32, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    """An int8 product scaled back to float32, plus the bias (MatMulIntegerToFloat): the
    integer sums are exact in float32 (see the module's docstring)."""
    acc = xq @ w[name + ".weight_q"].astype(np.float32)
    acc *= x_scale * w[name + ".weight_scale"]
    acc += w[name + ".bias"]
    return acc

"""BERT's float32 building blocks in numpy: what both numpy forward passes of
all-MiniLM-L6-v2 share (the float32 model's, ``fastmem.embed.NumpyMiniLM``, and the int8
graph's query path, ``fastmem._minilm.int8``), and the reader of the float32 weights."""

from __future__ import annotations

import math
import struct

import numpy as np

from ..errors import EmbedderUnavailableError

__all__ = ["gelu", "layer_norm", "linear", "read_safetensors"]

MAX_SAFETENSORS_HEADER = 1 << 20


def linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    # One 2-d product: a 3-d one would run a small BLAS call per text.
    out = x.reshape(-1, x.shape[-1]) @ w[name + ".weight_t"]
    out += w[name + ".bias"]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(1e-12)) * w[name + ".weight"] + w[name + ".bias"]


def gelu(x: np.ndarray) -> np.ndarray:
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


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (weights of linear layers pre-transposed).

    The format is an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte range, then the bytes; each is checked before use.
    """
    if len(data) < 8:
        raise EmbedderUnavailableError("model.safetensors is too short")
    (size,) = struct.unpack_from("<Q", data, 0)
    if not 2 <= size <= min(MAX_SAFETENSORS_HEADER, len(data) - 8):
        raise EmbedderUnavailableError("model.safetensors has a bad header length")
    import json  # here: only the float32 model's weights need it

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

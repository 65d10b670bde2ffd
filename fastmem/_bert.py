"""BERT's float32 building blocks in numpy: what both numpy forward passes of
all-MiniLM-L6-v2 share (the float32 model's, ``fastmem.embed.NumpyMiniLM``, and the int8
graph's query path, ``fastmem._minilm_int8``)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["gelu", "layer_norm", "linear"]


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

"""Shared fixtures: every test runs once per kernel backend (compiled and reference)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, settings

# Stores opened without an embedder= are keyword-only in tests (and in the processes they
# start): most tests use small vectors of their own. tests/test_embed.py uses the real model.
os.environ.setdefault("FASTMEM_EMBEDDER", "none")

import fastmem
from fastmem import _kernels  # noqa: E402

settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _backends() -> list[str]:
    try:
        from fastmem._kernels._ext import bpe, items, keyword, reader, records, scoring, topk, vectors  # noqa: F401
    except ImportError:
        if os.environ.get("FASTMEM_BACKEND") != "python":
            raise  # a build without its extension must not pass as a full test run
        return ["python"]
    return ["cython", "python"]


BACKENDS = _backends()


@pytest.fixture(params=BACKENDS, autouse=True)
def backend(request: pytest.FixtureRequest):
    """Run the test with the compiled kernels, then with the numpy reference (once, with the
    first, for a test marked ``kernels_unused``)."""
    if request.param != BACKENDS[0] and request.node.get_closest_marker("kernels_unused"):
        pytest.skip("uses none of fastmem's kernels: once is enough")
    previous = _kernels.BACKEND
    _kernels.use(request.param)
    yield request.param
    _kernels.use(previous)


@contextmanager
def torn_tail_allowed() -> Iterator[None]:
    """For an open after a writer was killed at a random moment: the kill may land inside
    an append, whose torn tail the open cuts (a RecoveryWarning). That warning alone is
    allowed; any other recovery (a rebuilt index) still fails the test."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "fastmem cut .* interrupted write", fastmem.RecoveryWarning
        )
        yield


@pytest.fixture
def store_path(tmp_path):
    """A path for a new store (its two files do not exist yet)."""
    return str(tmp_path / "agent_memory")


def pytest_configure(config):
    """Under pytest-xdist's default `-n N` distribution, keep each `xdist_group` on one
    worker, as `--dist loadgroup` does (other tests spread as with `load`): the Ray cluster
    tests share one cluster, and two workers would start two. A worker's options come from
    the command line, where `-n` alone says `--dist no`; it must mark the groups too."""
    dist = getattr(config.option, "dist", None)
    if os.environ.get("PYTEST_XDIST_WORKER") and dist in ("no", "load"):
        config.option.loadgroup = True  # the worker adds "@group" to the grouped tests' ids
    elif dist == "load":
        config.option.dist = "loadgroup"  # the controller schedules by those ids

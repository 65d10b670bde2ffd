"""Shared fixtures: every test runs once per kernel backend (compiled and reference)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# Stores opened without an embedder= are keyword-only in tests (and in the processes they
# start): most tests use small vectors of their own. tests/test_embed.py uses the real model.
os.environ.setdefault("FASTMEM_EMBEDDER", "none")

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
        from fastmem._ext import keyword, records, scoring, topk, vectors  # noqa: F401
    except ImportError:
        if os.environ.get("FASTMEM_BACKEND") != "python":
            raise  # a build without its extension must not pass as a full test run
        return ["python"]
    return ["cython", "python"]


BACKENDS = _backends()


@pytest.fixture(params=BACKENDS, autouse=True)
def backend(request: pytest.FixtureRequest):
    """Run the test with the compiled kernels, then with the numpy reference."""
    previous = _kernels.BACKEND
    _kernels.use(request.param)
    yield request.param
    _kernels.use(previous)


@pytest.fixture
def store_path(tmp_path):
    """A path for a new store (its two files do not exist yet)."""
    return str(tmp_path / "agent_memory")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (-n), keep each xdist_group on one worker (the Ray cluster tests
    share one cluster: two workers would start two); other tests spread as with --dist load."""
    from xdist.scheduler import LoadGroupScheduling

    return LoadGroupScheduling(config, log)

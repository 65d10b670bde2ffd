"""Fixtures for the fastmem benchmarks (the workload itself is described in workload.py).

Sizes come from ``FASTMEM_BENCH_SIZES`` (default ``10000,100000``; add ``1000000`` to
opt in to 1 M). Stores are built once and cached under ``FASTMEM_BENCH_DIR`` (default
``/tmp/fastmem-bench``), so a second run skips the build.

The headline figures of each test are kept in ``benchmark.extra_info`` (they end up in
``--benchmark-json``) and are also printed as one table at the end of the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import workload

SIZES = workload.parse_sizes(os.environ.get("FASTMEM_BENCH_SIZES"))

# (test name, size) -> the figures to print at the end: filled by the `record` fixture.
_SUMMARY: dict[tuple[str, int], dict[str, Any]] = {}


def _size_id(n: int) -> str:  # 10000 -> "10k", 1000000 -> "1M"
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


@pytest.fixture(scope="session", params=SIZES, ids=_size_id)
def size(request: pytest.FixtureRequest) -> int:
    """The store size. Session-scoped so pytest runs every test of one size before the
    next size: each workload and store is generated or loaded once."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def data(size: int) -> workload.Workload:
    """The first ``size`` memories of the workload."""
    return workload.generate(size)


@pytest.fixture(scope="session")
def built_store(request: pytest.FixtureRequest, size: int,
                data: workload.Workload) -> tuple[str, list[str]]:
    """(path, ids) of the cached store of ``size`` memories, built on first use."""
    del data  # generated first, so a build reuses it (workload.generate is cached)
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def log(msg: str) -> None:  # shown as it happens, though pytest captures output
        if capture is None:
            print(f"[fastmem-bench] {msg}", flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(f"\n[fastmem-bench] {msg}", flush=True)

    return workload.cached_store(size, log=log)


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """An empty folder for stores a test writes, on the same disk as the cached stores
    (pytest's tmp_path may be elsewhere); removed afterwards, as a 1 M store is ~1 GB."""
    path = workload.bench_dir() / "scratch"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def record(request: pytest.FixtureRequest, benchmark: Any):
    """``record(size, **figures)``: put figures in extra_info and in the final table."""

    def _record(n: int, **figures: Any) -> None:
        benchmark.extra_info.update(figures)
        name = request.node.originalname
        _SUMMARY.setdefault((name, n), {}).update(figures)

    return _record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _SUMMARY:
        return
    import fastmem

    tr = terminalreporter
    source = os.path.dirname(os.path.dirname(fastmem.__file__))
    tr.section(f"fastmem figures ({fastmem.BACKEND} kernels, fastmem from {source})")
    # By size, then in the order the tests ran (dicts keep insertion order; sort is stable).
    for (name, n), figures in sorted(_SUMMARY.items(), key=lambda kv: kv[0][1]):
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in figures.items() if not isinstance(v, list))
        tr.write_line(f"{n:>9,}  {name:<24} {shown}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)

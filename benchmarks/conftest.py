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
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

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


class _Smoke(BenchmarkFixture):
    """pytest-benchmark's fixture under ``--benchmark-disable`` (a quick smoke run, as CI's):
    each benchmark runs as written, every round of it (what a benchmark checks afterwards,
    e.g. every query's results, is there), timed with ``perf_counter`` instead of by the
    plugin (which runs a disabled benchmark once and keeps no figures). The plugin's own
    fixture becomes one (its class is changed: the plugin accepts nothing else)."""

    _smoke_times: list[float]

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        return self.pedantic(target, args, kwargs)

    def pedantic(self, target: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                 setup: Any = None, rounds: int = 1, warmup_rounds: int = 0,
                 iterations: int = 1) -> Any:  # fmt: skip
        self._mode = "benchmark.pedantic(...)"  # used (the plugin warns otherwise)
        result = None
        for i in range(warmup_rounds + rounds):
            call_args, call_kwargs = args, kwargs or {}
            if setup is not None:
                made = setup()
                if made is not None:
                    call_args, call_kwargs = made
            started = time.perf_counter()
            for _ in range(iterations):
                result = target(*call_args, **call_kwargs)
            if i >= warmup_rounds:
                self._smoke_times.append((time.perf_counter() - started) / iterations)
        return result

    def _smoke_stats(self) -> Any:
        times = self._smoke_times or [float("nan")]
        return SimpleNamespace(stats=SimpleNamespace(data=times, median=statistics.median(times)))

    stats = property(_smoke_stats, lambda self, value: None)  # type: ignore[assignment]


@pytest.fixture
def benchmark(benchmark: Any) -> Any:
    """The plugin's fixture; with ``--benchmark-disable``, made a :class:`_Smoke`."""
    if benchmark.disabled:
        benchmark.__class__ = _Smoke
        benchmark._smoke_times = []
    return benchmark


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

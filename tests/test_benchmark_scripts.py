"""The benchmark scripts that reach into fastmem's private modules (to time one stage, or to
build a store a particular way) still run. Nothing else would notice a refactor that moves
what they wrap: ``add_many_stages.py`` wrapped ``_index._Tail`` long after it had moved to
``_tail.Tail``, and failed with an AttributeError at its first line of work. Each runs at its
smallest size (one batch of the workload), with each kernel backend; what it prints is not
checked, only that it ran. ``procs_speed.py`` is left out: it starts several writer
processes for tens of seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastmem

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SOURCE = os.path.dirname(os.path.dirname(fastmem.__file__))  # the fastmem under test

pytestmark = pytest.mark.skipif(
    not (BENCHMARKS / "workload.py").is_file(),
    reason="benchmarks/ is not beside the tests (a wheel's test run copies tests/ only)",
)


@pytest.mark.parametrize("argv", [
    ["add_many_alone.py", "5000"],
    ["add_many_stages.py", "5000"],
    ["add_many_stages.py", "5000", "--no-count", "--cpu"],
    ["compact_speed.py", "--n", "5000"],
    ["token_speed.py", "--workload", "5000", "--repeat", "1"],
    ["hostile_scan.py"],
    ["agents_session.py", "--items", "200", "--rounds", "1", "--reads", "1", "--adk", "100"],
])  # fmt: skip
def test_a_benchmark_script_that_wraps_private_code_still_runs(
    argv: list[str], backend: str, tmp_path: Path
) -> None:
    if argv[0] == "agents_session.py":  # it times the integrations' own helpers too
        pytest.importorskip("agents", reason="the openai-agents extra is not installed")
        pytest.importorskip("google.adk", reason="the adk extra is not installed")
    env = {**os.environ, "PYTHONPATH": SOURCE, "FASTMEM_BENCH_DIR": str(tmp_path),
           "FASTMEM_BACKEND": backend}  # fmt: skip
    done = subprocess.run([sys.executable, str(BENCHMARKS / argv[0]), *argv[1:]], check=False,
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()


@pytest.mark.slow
def test_the_pytest_benchmark_suites_run_as_a_quick_smoke(backend: str, tmp_path: Path) -> None:
    """Every ``benchmarks/bench_*.py`` benchmark runs at 5,000 memories with
    ``--benchmark-disable``: each runs its rounds once, untimed by the plugin, and checks
    what it checks (recall, result counts). 20 s to 2 minutes on a loaded 2-core machine;
    the timeout guards against a hang, it is not a speed bound."""
    if backend != "cython":
        pytest.skip("the suites run with the default kernels: once is enough")
    env = {**os.environ, "PYTHONPATH": SOURCE, "FASTMEM_BENCH_DIR": str(tmp_path),
           "FASTMEM_BENCH_SIZES": "5000"}  # fmt: skip
    env.pop("FASTMEM_EMBEDDER", None)  # the suites use the default model, as users run them
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(BENCHMARKS), "--benchmark-disable", "-q",
         "-p", "no:randomly"],
        check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-2000:])
    assert " passed" in done.stdout and "failed" not in done.stdout

"""The type stubs of the compiled modules match them, and the package type-checks."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def backend():
    """Static checks: one run is enough."""
    return "none"


# Absent when the tests run against an installed fastmem (CI copies tests/ out of the checkout).
CONFIG = os.path.join(ROOT, "pyproject.toml")


def _run(*args):
    pytest.importorskip("mypy")
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_stubs_match_the_compiled_modules():
    pytest.importorskip("fastmem._kernels._ext.records")
    import fastmem._kernels._ext

    compiled = sorted(
        f"fastmem._kernels._ext.{info.name}" for info in pkgutil.iter_modules(fastmem._kernels._ext.__path__)
    )
    stubbed = sorted(f"fastmem._kernels._ext.{f[:-4]}" for f in os.listdir(fastmem._kernels._ext.__path__[0])
                     if f.endswith(".pyi"))  # fmt: skip
    assert compiled == stubbed  # every compiled module has its stub, and no stub is stale
    config = ["--mypy-config-file", CONFIG] if os.path.exists(CONFIG) else []
    out = _run("mypy.stubtest", *config, *compiled)
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_type_checks():
    if not os.path.exists(CONFIG):
        pytest.skip("type-checks the source tree with its pyproject.toml settings")
    out = _run("mypy", "fastmem")
    assert out.returncode == 0, out.stdout + out.stderr

"""The type stubs of the compiled modules match them, and the package type-checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def backend():
    """Static checks: one run is enough."""
    return "none"


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_stubs_match_the_compiled_modules():
    pytest.importorskip("fastmem._ext.records")
    out = _run("mypy.stubtest", "--mypy-config-file", "pyproject.toml",
               "fastmem._ext.records", "fastmem._ext.topk", "fastmem._ext.vectors",
               "fastmem._ext.keyword")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_type_checks():
    out = _run("mypy", "fastmem")
    assert out.returncode == 0, out.stdout + out.stderr

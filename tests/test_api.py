"""The public surface: names, backend selection, and what ``import fastmem`` costs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastmem
from fastmem import _kernels


def test_public_names():
    assert fastmem.__version__ == "0.2.0"
    for name in fastmem.__all__:
        assert getattr(fastmem, name) is not None, name
    assert issubclass(fastmem.CorruptRecordError, fastmem.FastmemError)
    assert issubclass(fastmem.UnknownMemoryError, KeyError)
    assert issubclass(fastmem.InvalidTypeError, TypeError)
    assert issubclass(fastmem.InvalidInputError, ValueError)


def _run(code, **env):
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_backend_follows_the_environment(backend):
    assert fastmem.BACKEND == backend
    assert _run("import fastmem; print(fastmem.BACKEND)", FASTMEM_BACKEND="python").stdout.strip() == "python"
    out = _run("import fastmem; print(fastmem.BACKEND)", FASTMEM_BACKEND="cython").stdout.strip()
    assert out == "cython"
    bad = _run("import fastmem", FASTMEM_BACKEND="fortran")
    assert bad.returncode != 0 and "FASTMEM_BACKEND" in bad.stderr


def test_cython_backend_fails_loudly_without_the_extension(monkeypatch):
    import fastmem._kernels._ext

    monkeypatch.delattr(fastmem._kernels._ext, "records", raising=False)
    monkeypatch.setitem(sys.modules, "fastmem._kernels._ext.records", None)  # as if never built
    with pytest.raises(ImportError, match="compiled extension is missing"):
        _kernels.use("cython")
    assert _kernels.use("auto") == "python" and fastmem.BACKEND == "python"


def test_import_pulls_in_nothing_heavy():
    code = ("import sys, fastmem\n"
            "heavy = {'torch', 'sentence_transformers', 'tiktoken', 'transformers', 'scipy'}\n"
            "print(sorted(heavy & set(sys.modules)))")  # fmt: skip
    assert _run(code).stdout.strip() == "[]"

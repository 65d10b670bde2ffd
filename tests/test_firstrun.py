"""The first ten minutes: `fastmem doctor`, the demo importing the fastmem that runs it (not
the checkout in its working directory), and the warning for a source tree without kernels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastmem

SOURCE = str(Path(fastmem.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def backend() -> str:
    """Once: these tests start processes, which pick their kernels themselves."""
    return fastmem.BACKEND


def run(args: list[str], *, cwd: str | None = None, env_extra: dict[str, str] | None = None,
        drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "FASTMEM_BACKEND"}
    env.update({"PYTHONPATH": SOURCE, **(env_extra or {})})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, check=False)  # fmt: skip


@pytest.mark.skipif(fastmem.BACKEND != "cython", reason="needs the compiled kernels")
def test_doctor_reports_kernels_embedder_and_tokenizers():
    proc = run(["-m", "fastmem", "doctor", "--json"], env_extra={"FASTMEM_EMBEDDER": "default"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fastmem"] == fastmem.__version__ and report["problems"] == []
    assert report["kernels"]["backend"] == "cython"
    from fastmem._kernels._ext import topk

    assert report["kernels"]["simd"] == topk.simd() in topk.SIMD_LEVELS
    assert report["kernels"]["openmp"] is topk.OPENMP  # the wheels are built without it
    assert set(report["kernels"]["compiled"]) == {"records", "scoring", "topk", "vectors", "keyword"}
    e = report["embedder"]
    assert e["status"] == "ok" and e["name"] == fastmem.embed.INT8_NAME
    assert e["sha256"] == fastmem.embed.ONNX_SHA256 and e["weights"].endswith("model.onnx")
    assert e["load_ms"] > 0 and e["query_p50_ms"] > 0
    assert report["token_counter"]["status"] == "ok"
    human = run(["-m", "fastmem", "doctor"], env_extra={"FASTMEM_EMBEDDER": "default"})
    assert human.returncode == 0 and "onnxruntime" in human.stdout and "compiled" in human.stdout


def test_doctor_says_what_is_wrong_and_exits_1(tmp_path):
    """The numpy fallback chosen explicitly is fine; a broken embedder is a problem."""
    code = ("import sys, fastmem.embed as e, pathlib; e.ONNX_MODEL_DIR = pathlib.Path(sys.argv[1]);"
            " from fastmem.doctor import diagnose; import json; print(json.dumps(diagnose()))")
    proc = run(["-c", code, str(tmp_path)],
               env_extra={"FASTMEM_EMBEDDER": "default", "FASTMEM_BACKEND": "python"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kernels"]["backend"] == "python"
    assert report["embedder"]["status"] == "unavailable"
    assert [p for p in report["problems"] if "kernels" in p] == []
    assert any("reinstall fastmem" in p for p in report["problems"])


@pytest.mark.skipif(fastmem.BACKEND != "cython", reason="needs the compiled kernels")
def test_the_demo_children_import_this_fastmem_not_the_working_directory(tmp_path):
    """Started in a folder with a fastmem/ of its own (as a checkout is), the demo's fresh
    processes must still run the fastmem that started them, with its compiled kernels."""
    decoy = tmp_path / "checkout"
    (decoy / "fastmem").mkdir(parents=True)
    (decoy / "fastmem" / "__init__.py").write_text("raise ImportError('the decoy was imported')\n")
    # The parent itself does not import the decoy either (that is the user's Python's
    # business); its children are the demo's. `python -P -m fastmem` in a form 3.10 (which
    # has no -P) runs too: drop the working directory from sys.path, then run the module.
    parent = ("import runpy, sys; del sys.path[0]; "
              "runpy.run_module('fastmem', run_name='__main__', alter_sys=True)")  # fmt: skip
    proc = run(["-c", parent, "demo", "--json"], cwd=str(decoy),
               env_extra={"FASTMEM_EMBEDDER": "none"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "decoy" not in proc.stderr
    assert json.loads(proc.stdout)["restart"]["backend"] == "cython"


def _tree_without_kernels(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    shutil.copytree(Path(SOURCE) / "fastmem", root / "fastmem",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "models"))  # fmt: skip
    (root / "setup.py").write_text("# a checkout\n")
    (root / "src_cython").mkdir()
    return root


def test_a_source_tree_without_kernels_warns_once_with_the_build_command(tmp_path):
    root = _tree_without_kernels(tmp_path)
    code = "import fastmem, importlib; import fastmem._kernels; print(fastmem.BACKEND)"
    proc = run(["-c", code], cwd=str(root), drop=("PYTHONPATH",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"
    assert proc.stderr.count("RuntimeWarning") == 1
    assert "setup.py build_ext --inplace" in proc.stderr
    chosen = run(["-c", code], cwd=str(root), drop=("PYTHONPATH",),
                 env_extra={"FASTMEM_BACKEND": "python"})  # fmt: skip
    assert chosen.returncode == 0 and chosen.stderr == "", chosen.stderr


def test_the_demo_fails_loudly_on_the_fallback_kernels(tmp_path):
    root = _tree_without_kernels(tmp_path)
    env = {"FASTMEM_EMBEDDER": "none", "PYTHONPATH": str(root)}
    proc = run(["-W", "ignore", "-m", "fastmem", "demo"], cwd=str(tmp_path), env_extra=env)
    assert proc.returncode == 1
    assert "numpy fallback" in proc.stderr and "build_ext --inplace" in proc.stderr
    chosen = run(["-m", "fastmem", "demo", "--json"], cwd=str(tmp_path),
                 env_extra={**env, "FASTMEM_BACKEND": "python"})  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["restart"]["backend"] == "python"

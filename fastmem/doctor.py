"""``fastmem doctor``: what is installed and whether it works, in one screen.

Prints the version and where fastmem was imported from, which kernels loaded (compiled or the
numpy fallback) and the CPU's SIMD features, the embedder (model, runtime, where its weights
came from, their checksum) with its measured load and first-query times, and the two
tokenizers (the embedder's and tiktoken's, which counts context tokens).

:func:`diagnose` returns the same as a dict (``--json`` prints it); its ``problems`` list is
empty when everything a default store needs works.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["diagnose", "run"]

BUILD_HINT = "python setup.py build_ext --inplace (in a checkout) or pip install ."


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _simd() -> list[str]:
    """The CPU's SIMD features that matter here (numpy's own detection; no /proc parsing)."""
    features: dict[str, bool] = {}
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # 2.x, 1.x
        try:
            features = importlib.import_module(module).__cpu_features__
            break
        except (ImportError, AttributeError):
            continue
    wanted = ("SSE42", "AVX2", "FMA3", "F16C", "AVX512F", "AVX512VNNI", "AVX512BF16", "NEON", "ASIMD",
              "ASIMDDP", "SVE")  # fmt: skip
    return [name for name in wanted if features.get(name)]


def _kernels() -> dict[str, Any]:
    import fastmem
    from fastmem import _kernels

    modules = {}
    for name in ("records", "scoring", "topk", "vectors", "keyword"):
        try:
            module = importlib.import_module(f"fastmem._kernels._ext.{name}")
            modules[name] = getattr(module, "__file__", None)
        except ImportError as exc:
            modules[name] = f"missing ({exc})"
    # The variant of the vector scan's dot product chosen for this processor at import
    # (FASTMEM_SIMD can lower it); only the compiled kernels have one.
    # Whether the scans were compiled with OpenMP: source builds are when the compiler has it,
    # the published wheels are not (README, "Install / build wheels").
    level, openmp = "none (numpy fallback)", None
    if _kernels.BACKEND == "cython":
        try:
            topk = importlib.import_module("fastmem._kernels._ext.topk")
            level, openmp = topk.simd(), bool(topk.OPENMP)
        except (ImportError, AttributeError):
            level = "unknown"
    package = Path(fastmem.__file__).resolve().parent
    checkout = (package.parent / "setup.py").is_file() and (package.parent / "src_cython").is_dir()
    return {"backend": _kernels.BACKEND, "requested": os.environ.get("FASTMEM_BACKEND", "auto"),
            "compiled": modules, "source_checkout": checkout, "simd": level, "cpu_simd": _simd(),
            "openmp": openmp,
            "build": ("portable (-O3, no -march=native unless built with FASTMEM_NATIVE=1); "
                      "the top-k and scoring loops use OpenMP when built with it")}  # fmt: skip


def _embedder() -> dict[str, Any]:
    from fastmem import embed
    from fastmem.errors import FastmemError

    if os.environ.get("FASTMEM_EMBEDDER") == "none":
        return {"status": "off (FASTMEM_EMBEDDER=none: stores are keyword-only)"}
    try:
        # A new instance, not the shared one: its load time is this call's to measure.
        t0 = time.perf_counter()
        model = embed.MiniLM()
        model.wait()
        ready = time.perf_counter() - t0
        t1 = time.perf_counter()
        model.encode(["what did we plan for the trip to Porto?"])
        first = time.perf_counter() - t1
        times = []
        for _ in range(20):
            t = time.perf_counter()
            model.encode(["what did we plan for the trip to Porto?"])
            times.append(time.perf_counter() - t)
        times.sort()
    except FastmemError as exc:
        return {"status": "unavailable", "error": " ".join(str(exc).split())}
    info = model.describe()
    info.update(status="ok", load_ms=round(ready * 1e3, 1), first_query_ms=round(first * 1e3, 2),
                query_p50_ms=round(times[len(times) // 2] * 1e3, 2))  # fmt: skip
    return info


def _token_counter() -> dict[str, Any]:
    from fastmem.errors import FastmemError
    from fastmem.tokens import DEFAULT_ENCODING, TokenCounter

    t0 = time.perf_counter()
    try:
        n = TokenCounter().count("How many tokens is this sentence?")
    except FastmemError as exc:
        return {"status": "unavailable", "error": " ".join(str(exc).split())}
    return {"status": "ok", "encoding": DEFAULT_ENCODING, "tiktoken": _version("tiktoken"),
            "load_ms": round((time.perf_counter() - t0) * 1e3, 1), "sample_tokens": n}  # fmt: skip


def diagnose() -> dict[str, Any]:
    """Everything ``fastmem doctor`` prints, as a dict; ``problems`` lists what is wrong."""
    import fastmem

    report: dict[str, Any] = {
        "fastmem": fastmem.__version__,
        "imported_from": str(Path(fastmem.__file__).resolve().parent),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "kernels": _kernels(),
        "embedder": _embedder(),
        "embedder_tokenizer": {
            "tokenizers": _version("tokenizers"), "onnxruntime": _version("onnxruntime")
        },
        "token_counter": _token_counter(),
    }
    problems = []
    kernels = report["kernels"]
    if kernels["backend"] != "cython" and kernels["requested"] != "python":
        where = "this source checkout" if kernels["source_checkout"] else "this install"
        problems.append(f"the compiled kernels did not load in {where} (the numpy fallback "
                        f"is several times slower): {BUILD_HINT}")  # fmt: skip
    if report["embedder"]["status"] == "unavailable":
        problems.append(f"embedder: {report['embedder']['error']}")
    if report["token_counter"]["status"] != "ok":
        problems.append(f"token counter: {report['token_counter']['error']}")
    report["problems"] = problems
    return report


def run(out: Any) -> int:
    """``fastmem doctor``; ``out`` is the CLI's output. Exit code 1 when there are problems."""
    report = diagnose()
    if out.json:
        out.emit(report)
        return 1 if report["problems"] else 0
    from rich.markup import escape

    p = out.console.print
    k, e, t = report["kernels"], report["embedder"], report["token_counter"]
    p(f"[bold]fastmem {report['fastmem']}[/bold] from {escape(report['imported_from'])}"
      + (" (a source checkout)" if k["source_checkout"] else ""))  # fmt: skip
    p(f"python     {report['python']} on {report['platform']}")
    backend = "[green]compiled[/green]" if k["backend"] == "cython" else "[red]numpy fallback[/red]"
    threads = {True: ", OpenMP", False: ", serial (built without OpenMP)"}.get(k["openmp"], "")
    p(f"kernels    {backend} (FASTMEM_BACKEND={k['requested']}), vector scan SIMD: {k['simd']}"
      f"{threads}")  # fmt: skip
    p(f"  CPU      {', '.join(k['cpu_simd']) or 'no SIMD features detected'}")
    if e["status"] == "ok":
        p(f"embedder   {escape(e['name'])} ({e['dim']} dims)")
        p(f"  runtime  {escape(e['runtime'])}, {e['threads']} threads for lists of texts")
        p(f"  weights  {escape(e['weights'])}")
        p(f"           sha256 {e['sha256'][:16]}… checked at load")
        p(f"           {escape(e['source'])}")
        p(f"  timing   ready {e['load_ms']:.0f} ms after construction; first query "
          f"{e['first_query_ms']:.1f} ms, then p50 {e['query_p50_ms']:.2f} ms")  # fmt: skip
    else:
        p(f"embedder   [yellow]{escape(e['status'])}[/yellow] {escape(e.get('error', ''))}")
    p(f"tokenizer  tokenizers {report['embedder_tokenizer']['tokenizers']}, "
      f"{escape(str(e.get('tokenizer', '-')))}")  # fmt: skip
    if t["status"] == "ok":
        p(f"tokens     tiktoken {t['tiktoken']}, {t['encoding']} (offline), loaded in "
          f"{t['load_ms']:.0f} ms")  # fmt: skip
    else:
        p(f"tokens     [red]unavailable[/red] {escape(t['error'])}")
    for problem in report["problems"]:
        p(f"[red]problem[/red]    {escape(problem)}")
    if not report["problems"]:
        p("[green]everything a default store needs works[/green]")
    return 1 if report["problems"] else 0


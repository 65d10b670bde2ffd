"""What ``import fastmem`` loads: the store's own modules, numpy, lz4 and msgpack, and nothing
that only some calls need (the model's runtime, the token counter's tiktoken, the CLI's rich,
the integrations, the agent frameworks, the numpy reference kernels when the compiled ones are
there). Each check runs in a fresh interpreter, whose ``sys.modules`` is what a user's
process gets; the benchmark of what the import costs is benchmarks/cold_start.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastmem

SOURCE = str(Path(fastmem.__file__).resolve().parents[1])  # the fastmem these tests import

# Loaded by the calls that need them, never by the import.
NEVER = (
    "onnxruntime", "tokenizers", "tiktoken", "tiktoken_ext", "torch", "rich", "threadpoolctl",
    "fastmem.integrations", "fastmem.ui", "fastmem.ray", "fastmem.cli", "fastmem.doctor",
    "fastmem.cli.demo", "ray", "langgraph", "langchain_core", "agents", "google.adk",
    "autogen_core", "autogen_agentchat", "llama_index", "starlette", "uvicorn", "mcp",
)  # fmt: skip
# Standard library modules that only some calls need, imported where they are first used:
# the import never loads them (neither numpy's import nor the interpreter's start does).
STDLIB_LATER = {
    "glob": "a writer's sweep of the files aside that killed checkpoints left",
    "bisect": "recent(before=...)",
    "base64": "exporting metadata that holds bytes",
    "hashlib": "the model's checksums (BLAKE2 for fingerprints and sessions comes without it)",
    "concurrent.futures": "a ranking's keyword thread, the model's encoding threads",
    "logging": "nothing of fastmem's: a library that logs",
    "calendar": "nothing: dates in questions are parsed with English month names",
    "traceback": "a failure's frames",
}
# Every package outside the standard library that the import may load.
THIRD_PARTY = {"fastmem", "numpy", "lz4", "msgpack"}
# What the interpreter and the build add by themselves: the editable install's finder,
# setuptools' distutils shim, the compiled kernels' shared Cython runtime.
RUNTIME_PREFIXES = ("__editable__", "_distutils_hack", "_cython_", "cython_runtime", "__main__")


@pytest.fixture(autouse=True)
def backend() -> str:
    """Once: each check runs in a fresh interpreter that picks its own kernels."""
    return fastmem.BACKEND


def modules_after(
    code: str, backend: str | None = None, embedder: str | None = None
) -> dict[str, object]:
    """``sys.modules`` (sorted names) and fastmem.BACKEND after running ``code`` in a fresh
    interpreter, started outside the checkout with this checkout first on its path
    (``embedder``: its ``FASTMEM_EMBEDDER``, the tests' own otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "FASTMEM_BACKEND"}
    if embedder is not None:
        env["FASTMEM_EMBEDDER"] = embedder
    if backend is not None:
        env["FASTMEM_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (SOURCE, env.get("PYTHONPATH"))))
    script = (f"{code}\nimport json, sys, fastmem\n"
              "print(json.dumps({'modules': sorted(sys.modules), 'backend': fastmem.BACKEND,"
              " 'file': fastmem.__file__}))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=os.path.dirname(SOURCE), timeout=120, check=True)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(SOURCE + os.sep), result["file"]
    return result


def loaded(names: list[str], prefix: str) -> list[str]:
    return [m for m in names if m == prefix or m.startswith(prefix + ".")]


def test_import_fastmem_loads_none_of_what_only_some_calls_need():
    names = modules_after("import fastmem")["modules"]
    assert {prefix: loaded(names, prefix) for prefix in NEVER if loaded(names, prefix)} == {}


def test_import_fastmem_loads_no_package_beyond_numpy_lz4_and_msgpack():
    names = modules_after("import fastmem")["modules"]
    outside = {m.split(".")[0] for m in names} - set(sys.stdlib_module_names)
    unexpected = {m for m in outside - THIRD_PARTY if not m.startswith(RUNTIME_PREFIXES)}
    assert unexpected == set()


def test_import_fastmem_loads_no_standard_module_that_only_some_calls_need():
    """Each would cost every fresh process its load; the calls that need one import it
    (what the import costs: benchmarks/cold_start.py)."""
    names = modules_after("import fastmem")["modules"]
    assert sorted(m for m in STDLIB_LATER if loaded(names, m)) == []


def test_the_numpy_reference_kernels_load_only_without_the_compiled_ones():
    compiled = modules_after("import fastmem")
    if compiled["backend"] != "cython":
        pytest.skip("fastmem's compiled kernels are not built here")
    assert loaded(compiled["modules"], "fastmem._kernels.reference") == []
    assert loaded(compiled["modules"], "fastmem._kernels.bpe_reference") == []
    reference = modules_after("import fastmem", backend="python")
    assert reference["backend"] == "python"
    assert "fastmem._kernels.reference" in reference["modules"]


def test_the_public_api_is_whole_without_the_lazy_modules():
    """Every public name resolves in a fresh process and the import still loads none of
    what the calls load later (a name bound lazily would import its module here)."""
    names = modules_after("import fastmem\nfor n in fastmem.__all__: getattr(fastmem, n)")["modules"]
    assert {prefix: loaded(names, prefix) for prefix in NEVER if loaded(names, prefix)} == {}


def test_the_command_line_loads_rich_only_to_print(tmp_path):
    """``fastmem context --json`` (a hook's call) answers without rich (~40 ms of imports);
    the command line's import alone loads none of the integrations."""
    names = modules_after("import fastmem.cli")["modules"]
    never = [prefix for prefix in NEVER if prefix != "fastmem.cli"]
    assert {prefix: loaded(names, prefix) for prefix in never if loaded(names, prefix)} == {}
    path = str(tmp_path / "store")
    with fastmem.open(path, embedder=None) as store:
        store.add("We planned a trip to Lisbon in May.")
    code = (f"from fastmem.cli import main\n"
            f"assert main(['context', {path!r}, 'where are we travelling?', '--json']) == 0")  # fmt: skip
    names = modules_after(code)["modules"]
    assert loaded(names, "rich") == []
    names = modules_after(code.replace(", '--json'", ""))["modules"]  # printed for a person
    assert loaded(names, "rich") != []


def test_a_first_search_and_context_import_no_numpy_ma(tmp_path):
    """np.unique (and union1d, isin...) import numpy.ma at their first call in a process,
    10-25 ms that every fresh process's first search or context paid."""
    path = str(tmp_path / "store")
    with fastmem.open(path, embedder=None, dim=4) as store:
        store.add_many([{"text": f"note {i} about the garden", "embedding": [1.0, i, 0.0, 1.0]}
                        for i in range(50)])  # fmt: skip
    code = (f"import fastmem\n"
            f"with fastmem.open({path!r}, embedder=None, readonly=True) as store:\n"
            f"    assert store.search('garden', k=5)\n"
            f"    assert store.search([1.0, 3.0, 0.0, 1.0], k=5)\n"
            f"    assert 'garden' in store.context('the garden?', budget=200).text\n")  # fmt: skip
    assert loaded(modules_after(code)["modules"], "numpy.ma") == []


def test_an_installed_package_opens_a_store_without_pathlib(tmp_path):
    """pathlib (with the urllib.parse it imports) is loaded neither by the import nor by
    open() with the default embedder. The child runs as an installed package does, without
    site's path hooks (here an editable install's finder imports pathlib itself)."""
    import site

    path = str(tmp_path / "store")
    with fastmem.open(path, embedder=None) as store:
        store.add("We planned a trip to Lisbon in May.")
    paths = [SOURCE, *site.getsitepackages()]
    code = (f"import sys\nsys.path[:0] = {paths!r}\nimport fastmem\n"
            f"before = 'pathlib' in sys.modules\n"
            f"store = fastmem.open({path!r}, readonly=True)\n"
            f"print(before, 'pathlib' in sys.modules, fastmem.__file__)\n"
            f"store.close()\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("FASTMEM_BACKEND", "FASTMEM_EMBEDDER")}
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env=env, cwd=os.path.dirname(SOURCE), timeout=120, check=True)  # fmt: skip
    before, after, file = out.stdout.split()
    assert file.startswith(SOURCE + os.sep)
    assert (before, after) == ("False", "False")


def test_a_context_beyond_ascii_loads_no_tiktoken(tmp_path):
    """A context whose headers hold "·" (two sessions on a day), whose memories are not
    ASCII and whose long memory is cut to an excerpt ("…") counts every token with the
    compiled counter: tiktoken's load (~80 ms of CPU) is never on a first context's path."""
    compiled = modules_after("import fastmem")
    if compiled["backend"] != "cython":
        pytest.skip("fastmem's compiled kernels are not built here")
    path = str(tmp_path / "store")
    long = " ".join(f"Étape {i}: le café à Zürich, 東京 trip 🚆 number {i}." for i in range(400))
    with fastmem.open(path, embedder=None, dim=4) as store:
        store.add_many([
            {"text": "Réunion d'équipe: on part à Lisbonne en mai 🇵🇹", "session": "équipe",
             "timestamp": 1_780_000_000.0, "embedding": [1.0, 0.0, 0.0, 1.0]},
            {"text": "東京への出張は六月です", "session": "travel", "timestamp": 1_780_000_100.0,
             "embedding": [1.0, 1.0, 0.0, 1.0]},
            {"text": long, "session": "travel", "timestamp": 1_780_000_200.0,
             "embedding": [0.0, 1.0, 1.0, 1.0]},
        ])  # fmt: skip
    code = (f"import fastmem\n"
            f"with fastmem.open({path!r}, embedder=None, readonly=True) as store:\n"
            f"    ctx = store.context('Lisbonne café Zürich 東京', budget=300)\n"
            f"    assert ' · ' in ctx.text and '…' in ctx.text and '東京' in ctx.text, ctx.text\n"
            f"    assert ctx.tokens == fastmem.tokens.TokenCounter().count(ctx.text)\n")  # fmt: skip
    names = modules_after(code)["modules"]
    assert loaded(names, "tiktoken") == []


def test_the_command_line_answers_a_hook_without_shutil_or_numpy_ma(tmp_path):
    """``fastmem context/search STORE Q --json`` on a store with vectors, as a hook runs
    them: argparse's help formatter would import shutil (with bz2 and lzma) for every
    argument added, and counting every memory's vector (``stats()``: its ``np.unique``
    imports numpy.ma; ~130 ms of CPU at 1M memories) only to know that one has a vector."""
    from fastmem.embed import default_embedder

    path = str(tmp_path / "store")
    with fastmem.open(path, embedder=default_embedder()) as store:  # vectors
        store.add("We planned a trip to Lisbon in May.")
        store.add("The garden needs water on Fridays.")
    # The query's vector was used (the store has vectors): the context is not degraded, the
    # hits have a cosine (from the model, or its numpy query path while the model loads).
    vector_used = {"context": "assert not out['degraded'], out",
                   "search": "assert out and all(h['vector'] is not None for h in out), out"}  # fmt: skip
    for command in ("context", "search"):
        code = (f"import contextlib, io, json\nfrom fastmem.cli import main\nbuf = io.StringIO()\n"
                f"with contextlib.redirect_stdout(buf):\n"
                f"    assert main([{command!r}, {path!r}, 'where are we travelling?', '--json']) == 0\n"
                f"out = json.loads(buf.getvalue())\n{vector_used[command]}")  # fmt: skip
        names = modules_after(code, embedder="default")["modules"]
        assert [m for m in ("shutil", "numpy.ma", "rich", "tiktoken") if m in names] == []


def test_open_loads_nothing_the_import_did_not():
    """A restart's clock starts after the imports: what open() (and an embedder's
    fingerprint, which it checks against the store's) imports would be paid inside it."""
    code = textwrap.dedent("""
        import sys, tempfile, fastmem
        from fastmem import _format
        path = tempfile.mkdtemp() + "/s"
        fastmem.open(path, embedder=None).close()
        before = set(sys.modules)
        _format.embedder_fingerprint("a model", 384)
        fastmem.open(path, embedder=None, readonly=True).close()
        print(sorted(set(sys.modules) - before))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": SOURCE}, cwd="/", timeout=120)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "[]"

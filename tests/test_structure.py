"""The package's structure: imports only downward, no circle, the edge on the public API,
no reaching into another module's underscore attributes, and the public names pinned.

The package is built in layers (``LAYERS``, bottom to top): most are one subpackage, and the
root package's own modules sit in three (the values at the bottom, the models above the
kernels, the facade at the top). Inside a layer, modules stand on floors. A module may
import from a lower layer, or from its own layer on its floor or a lower one. A new module
must be given a floor here (the test fails until it is). docs/architecture.md
draws the same picture (tools/draw_architecture.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fastmem

PACKAGE = Path(fastmem.__file__).parent

# (layer, its floors bottom to top). A layer named after a subpackage names its modules
# inside it ("" is its __init__); the others name modules of the root package ("" is
# fastmem/__init__.py).
LAYERS: list[tuple[str, list[tuple[str, ...]]]] = [
    # The public values every layer uses, and two private leaves (threads that survive a
    # fork; the stop words of summaries and queries); the on-disk format, which the kernels read.
    ("values", [("errors", "_threads", "_stopwords"), ("types", "namespaces", "_format"),
                ("export",)]),
    # The compiled kernels (_ext) beside their numpy references; "" picks one or the other.
    ("_kernels", [("_ext", "bpe_reference", "keyword_reference", "index_open_reference"),
                  ("reference",), ("",)]),
    # MiniLM in numpy, from the packaged int8 weights: a query's vector while onnxruntime loads.
    ("_minilm", [("", "bert", "wordpiece"), ("int8",)]),
    # The public models a memory is written with: its vector, its token counts, its summary.
    ("models", [("embed", "tokens", "summarize")]),
    # The storage engine: the two files, records, the index, recovery, other processes' writes.
    ("storage", [("", "fileio", "forkexit", "index_tail", "keyword_index", "vectors", "writelock"),
                 ("replay",),
                 ("index",),
                 ("access_counts", "checkpoint", "importance", "records", "recovery"),
                 ("erase", "handle_state"),
                 ("engine",),
                 ("maintenance", "stats")]),
    # Recall: ranking, then packing (the packer calls nothing of the ranking), and level 2.
    ("recall", [("", "hits", "supersedes", "vector_search"),
                ("packing", "ranking"),
                ("preload", "speakers"),
                ("query",)]),
    # The facade; doctor reads what is installed for the CLI.
    ("facade", [("store",), ("",), ("doctor",)]),
    # The edge: on the public API only (see test_the_edge_uses_public_modules_only).
    ("edge", [("__main__",)]),
]  # fmt: skip
# The edge's subpackages: every module in them is on the edge's floor (integrations: Hermes, MCP
# and the agent frameworks; ui: the inspector; ray: fastmem[ray]). None is imported by the rest
# (tests/test_ray.py and test_imports check that `import fastmem` loads none of them).
EDGE_PACKAGES = ("cli", "integrations", "ui", "ray")
PUBLIC = {"", "errors", "types", "namespaces", "export", "embed", "tokens", "summarize", "doctor"}
# The modules a query's ranking runs in: the packer imports none of them.
RANKING = {"recall.ranking", "recall.speakers", "recall.vector_search", "recall.query"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.with_suffix("").relative_to(PACKAGE).parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _floors() -> dict[str, tuple[int, int]]:
    """Each module's (layer, floor)."""
    out = {}
    for i, (layer, floors) in enumerate(LAYERS):
        sub = (PACKAGE / layer / "__init__.py").exists()
        for j, names in enumerate(floors):
            for name in names:
                out[(f"{layer}.{name}" if name else layer) if sub else name] = (i, j)
    edge = (len(LAYERS) - 1, 0)
    out.update({name: edge for name in MODULES if name.split(".")[0] in EDGE_PACKAGES})
    return out


FLOOR = _floors()
EDGE = {name for name, place in FLOOR.items() if place[0] == len(LAYERS) - 1}


def _imports(name: str) -> set[str]:
    """The fastmem modules ``name`` imports, at the top or inside functions."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "fastmem":
                module = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                targets.append(sub if sub in MODULES else module)
        elif isinstance(node, ast.Import):
            targets = [a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == "fastmem"]
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def test_every_module_has_a_floor():
    assert sorted(set(MODULES) - set(FLOOR)) == []
    assert sorted(set(FLOOR) - set(MODULES)) == []  # no floor names a module that is gone


def test_no_module_imports_from_a_higher_floor():
    upward = [
        f"{name or '__init__'} (layer, floor {FLOOR[name]}) imports {dep or '__init__'} {FLOOR[dep]}"
        for name, deps in GRAPH.items()
        for dep in deps
        if FLOOR[dep] > FLOOR[name]
    ]
    assert upward == []


def test_a_layer_has_fewer_floors_than_the_flat_package_had():
    """Before the layers, fastmem/ was one folder of 40 modules on 17 floors."""
    assert max(len(floors) for _, floors in LAYERS) < 17


def test_the_packer_imports_nothing_of_the_ranking():
    """A query is ranked, then packed: what the packer needs of the ranking it is handed."""
    reached, todo = set(), ["recall.packing"]
    while todo:
        for dep in GRAPH[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert reached & RANKING == set()


def test_the_import_graph_has_no_circle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                circles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_the_edge_uses_public_modules_only():
    private = {
        name: sorted(dep for dep in deps if dep not in PUBLIC and dep not in EDGE)
        for name, deps in GRAPH.items()
        if name in EDGE
    }
    assert {name: deps for name, deps in private.items() if deps} == {}


# `store._x` outside store.py, `engine._x` outside storage/engine.py: one module's underscore
# attributes are its own (the engine's interface for maintenance has no underscores).
_REACHING = [
    ("store", re.compile(r"\bstore\._[a-z]"), {"store.py"}),
    ("engine", re.compile(r"\b(?:engine|_engine)\._[a-z]"), {"engine.py"}),
]


@pytest.mark.parametrize("owner, pattern, allowed", _REACHING, ids=[r[0] for r in _REACHING])
def test_no_module_reaches_into_another_modules_privates(owner, pattern, allowed):
    found = [
        f"{path.relative_to(PACKAGE)}:{i}: {line.strip()}"
        for path in MODULES.values()
        if path.name not in allowed
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_store_stays_a_facade():
    source = MODULES["store"].read_text().splitlines()
    start = next(i for i, line in enumerate(source) if line.startswith("class MemoryStore"))
    end = next((i for i, line in enumerate(source[start + 1 :], start + 1)
                if line and not line[0].isspace() and not line.startswith(")")), len(source))  # fmt: skip
    # 600 until the public API grew by ids(), types(), forget_many(), recent()'s paging and
    # context(types=) for the integrations, each mostly docstring; search's ranking went to
    # recall.query with the layers. Modules: 1,000 since the engine took the erase's and the
    # compaction's recovery cases (the CLI's commands are one module on purpose: one file to read).
    assert end - start <= 630, f"MemoryStore is {end - start} lines"
    too_long = {name: n for name, path in MODULES.items()
                if name != "cli" and (n := len(path.read_text().splitlines())) > 1000}  # fmt: skip
    assert too_long == {}


def test_public_names_are_pinned():
    assert fastmem.__all__ == sorted(fastmem.__all__, key=str.casefold)
    assert fastmem.__all__ == [
        "__version__",
        "BACKEND",
        "BackupReport",
        "CompactReport",
        "Context",
        "ContextItem",
        "ContextPolicy",
        "CorruptIndexError",
        "CorruptionError",
        "CorruptRecordError",
        "DependencyUnavailableError",
        "DimensionMismatchError",
        "DURABILITY",
        "DurabilityError",
        "EmbedderMismatchError",
        "EmbedderUnavailableError",
        "EncodingUnavailableError",
        "EvictionPolicy",
        "FastmemError",
        "FormatVersionError",
        "Hit",
        "InvalidInputError",
        "InvalidTypeError",
        "Level",
        "LOCK_TIMEOUT",  # the default lock wait: the CLI, MCP and Hermes use this one
        "Memory",
        "MemoryStore",
        "open",
        "Problem",
        "ReadOnlyError",
        "RecordInfo",
        "RecordSize",
        "RecoveryWarning",
        "repair",
        "RepairReport",
        "Report",
        "StoreClosedError",
        "StoreForkedError",
        "StoreFullError",
        "StoreLockedError",
        "StoreNotFoundError",
        "StoreStats",
        "UnknownMemoryError",
    ]
    for name in fastmem.__all__:
        assert getattr(fastmem, name) is not None


@pytest.mark.kernels_unused
def test_the_architecture_picture_is_up_to_date():
    """docs/architecture.md shows docs/img/architecture.svg, drawn from LAYERS and the imports."""
    import subprocess
    import sys

    tool = PACKAGE.parent / "tools" / "draw_architecture.py"
    if not tool.exists():
        pytest.skip("tools/ is not beside the installed package")
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

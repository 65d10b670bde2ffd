"""The package's structure: imports only downward, no circle, the edge on the public API,
no reaching into another module's underscore attributes, and the public names pinned.

The floors below are the allowed order: a module may import from its own floor or lower.
A new module must be given a floor here (the test fails until it is).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fastmem

PACKAGE = Path(fastmem.__file__).parent

FLOORS: list[tuple[str, ...]] = [
    # leaves: import nothing of fastmem's (_bpe_py: the token counter's reference, tiktoken)
    ("errors", "_stopwords", "_threads", "_ext", "_bpe_py", "_writelock", "_bert", "_wordpiece"),
    # _writelock: how a write waits for the writer lock (its pace and the gate); _bert: the
    # float32 BERT pieces both numpy paths share; _wordpiece: the query's tokenizer in Python
    ("_minilm_int8",),  # the packaged int8 graph in numpy, for a query while onnxruntime loads
    ("types", "_format", "namespaces", "summarize", "embed", "export", "_forkexit"),
    ("_idxopen",),  # the checks an index file passes at open (the reference of heads.idx_open)
    ("_keyword_py",),  # the keyword search's reference kernels
    ("_kernels_py",),  # the numpy reference kernels
    ("_kernels",),  # picks the compiled kernels or the reference
    ("_vectors", "_keyword", "_replay", "_tail", "tokens", "_io"),  # tokens: cl100k_base by a
    # kernel; _io: the engine's stateless parts (OS errors mapped, group commit, torn tails)
    ("_index",),
    ("_vsearch",),
    ("_items", "retrieval", "_files", "_checkpoint"),  # what add accepts; ranking; files around
    # the store's two; a bulk load's checkpoint written by a thread
    ("_erase", "_stats", "_state"),  # forget's erase pass; access counts merged across processes;
    # _state: a handle's map and index built from the files (recovery at open, a replaced file)
    ("_engine",),  # the storage engine
    ("_figures", "_maintenance", "_supersede", "context"),  # over the engine
    ("store",),  # the facade
    ("",),  # fastmem/__init__.py
    ("doctor",),  # what is installed: reads the kernels' choice and the embedder, for the CLI
    # The edge: on the public API only (see test_the_edge_uses_public_modules_only).
    ("cli", "__main__", "_demo"),
]  # fmt: skip
# The edge's subpackages: every module in them is on the edge's floor (integrations: Hermes, MCP
# and the agent frameworks; ui: the inspector; ray: fastmem[ray]). None is imported by the rest
# (tests/test_ray.py and test_imports check that `import fastmem` loads none of them).
EDGE_PACKAGES = ("integrations", "ui", "ray")
PUBLIC = {"", "errors", "types", "namespaces", "export", "embed", "tokens", "summarize", "doctor"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.with_suffix("").relative_to(PACKAGE).parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
FLOORS[-1] += tuple(name for name in MODULES if name.split(".")[0] in EDGE_PACKAGES)
EDGE = set(FLOORS[-1])


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
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def test_every_module_has_a_floor():
    assert sorted(set(MODULES) - set(FLOOR)) == []
    assert sorted(set(FLOOR) - set(MODULES)) == []  # no floor names a module that is gone


def test_no_module_imports_from_a_higher_floor():
    upward = [
        f"{name or '__init__'} (floor {FLOOR[name]}) imports {dep or '__init__'} (floor {FLOOR[dep]})"
        for name, deps in GRAPH.items()
        for dep in deps
        if FLOOR[dep] > FLOOR[name]
    ]
    assert upward == []


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


# `store._x` outside store.py, `engine._x` outside _engine.py: one module's underscore
# attributes are its own (the engine's interface for maintenance has no underscores).
_REACHING = [
    ("store", re.compile(r"\bstore\._[a-z]"), {"store.py"}),
    ("engine", re.compile(r"\b(?:engine|_engine)\._[a-z]"), {"_engine.py"}),
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
    # context(types=) for the integrations, each mostly docstring; modules 900 until the
    # engine took the erase's and the compaction's recovery cases (1,000 now): the layout's
    # rework (one subpackage per floor) is where the facade and the engine get thin again.
    assert end - start <= 650, f"MemoryStore is {end - start} lines"
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

"""FastmemStore beside LangGraph's own stores, InMemoryStore and SqliteStore, in one run.

    cd /work/main
    PYTHONPATH=$PWD python benchmarks/langgraph_store.py --sizes 10000 100000

For each size N: N items in 100 namespaces ``("users", "u<j>")``, each value
``{"text": ..., "n": i, "kind": ..., "score": ...}`` with ``text`` the indexed field, put
into each store in batches of 500 (``batch`` of ``PutOp``s), then timed:

- put: 500 single ``put`` calls of new keys, one namespace;
- get: 2,000 ``get`` calls of random keys;
- search, query: 50 ``search(("users",), query=..., limit=10)`` over all N items, and 50
  over one user's namespace (N/100 items);
- search, filter: 50 ``search(("users",), filter={"kind": "b", "score": {"$gte": 7}},
  limit=10)``;
- restart (the largest N): a new process opens the store and runs one query search (time
  from the open, imports excluded), FastmemStore against SqliteStore (InMemoryStore keeps
  nothing across a restart);
- adapter overhead: FastmemStore's get, query search and put against the MemoryStore call
  each wraps (``get``, ``search(types=...)``, ``add``), same arguments.

Every store embeds with the same model, fastmem's all-MiniLM-L6-v2 (int8), through a cache
filled before the clock starts (texts cycle through 2,000 sentences): the comparison is of
stores, not of models, and no timed call waits for the model. SqliteStore runs with its
vector index (sqlite-vec) on a file, as ``SqliteStore.from_conn_string`` opens it (rollback
journal, ``synchronous=FULL``: it syncs every transaction, where fastmem's default groups
syncs within 5 ms; see docs/guides/langgraph.md for what is unfair each way).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

import fastmem
from fastmem.embed import default_embedder

SENTENCES = 2000
NAMESPACES = 100
KINDS = ("a", "b", "c", "d")
DIM = 384
SUBJECTS = ["The user", "My sister", "Our team lead", "The landlord", "A colleague", "The doctor",
            "My neighbour", "The customer", "Grandpa", "The new intern"]  # fmt: skip
VERBS = ["prefers", "asked about", "complained about", "recommended", "is allergic to",
         "wants to learn", "booked", "forgot", "bought", "keeps talking about"]  # fmt: skip
OBJECTS = ["spicy Thai curry", "the quarterly budget", "hiking in the Alps", "a red bicycle",
           "peanuts", "the Python migration", "a flight to Lisbon", "the dentist appointment",
           "jazz records", "the broken heater", "sourdough baking", "the tax return",
           "a used piano", "the chess club", "cheap hotels in Rome", "the fire alarm",
           "Kubernetes upgrades", "oat milk", "the garden fence", "vintage cameras"]  # fmt: skip
TIMES = ["yesterday", "last week", "every morning", "on Fridays", "in March", "twice",
         "again today", "since spring", "at the meeting", "before lunch"]  # fmt: skip
QUERIES = ["What food does she like?", "Who has allergies?", "travel plans to Portugal",
           "problems with the house", "music hobbies", "work on cloud infrastructure",
           "money and taxes", "learning new skills", "sports and outdoor trips",
           "appointments with doctors"]  # fmt: skip


def sentences() -> list[str]:
    combos = itertools.product(SUBJECTS, VERBS, OBJECTS, TIMES)
    picked = random.Random(7).sample(list(combos), SENTENCES)
    return [f"{s} {v} {o} {t}." for s, v, o, t in picked]


class CachedEmbedder:
    """fastmem's model behind a cache of the benchmark's texts: what every store embeds with."""

    name, dim = "bench:minilm-int8-cached", DIM

    def __init__(self, cache: dict[str, np.ndarray]) -> None:
        self.cache = cache

    def encode(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, default_embedder().encode(missing)))
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, DIM), np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def langgraph(self, texts: Any) -> list[list[float]]:  # LangGraph's EmbeddingsFunc
        return self.encode(list(texts)).tolist()


def load_cache(path: str) -> dict[str, np.ndarray]:
    if os.path.exists(path):
        data = np.load(path, allow_pickle=False)
        return dict(zip(data["texts"].tolist(), data["vectors"]))
    texts = sentences() + QUERIES
    model = default_embedder()
    model.wait(120)
    vectors = model.encode(texts)
    np.savez(path, texts=np.array(texts), vectors=vectors)
    return dict(zip(texts, vectors))


def items(n: int, texts: list[str]) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    return [(("users", f"u{i % NAMESPACES}"), f"k{i}",
             {"text": texts[i % len(texts)], "n": i, "kind": KINDS[i % 4], "score": i % 10})
            for i in range(n)]  # fmt: skip


def sqlite_store(path: str, embedder: CachedEmbedder) -> Any:
    """A SqliteStore with its vector index, connected as ``from_conn_string`` connects. Its
    sqlite-vec index is an extension: where Python's own sqlite3 cannot load extensions
    (Debian's can't), pysqlite3-binary's module stands in (same SQLite API, SQLite 3.51)."""
    import sqlite3

    from langgraph.store.sqlite import SqliteStore

    module: Any = sqlite3
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        from pysqlite3 import dbapi2 as module  # type: ignore[import-not-found, no-redef]
    conn = module.connect(path, check_same_thread=False, isolation_level=None)
    index = {"dims": DIM, "embed": embedder.langgraph, "fields": ["text"], "text_fields": ["text"]}
    store = SqliteStore(conn, index=index)  # type: ignore[arg-type]
    store.setup()
    return store


def open_stores(workdir: str, embedder: CachedEmbedder) -> dict[str, Any]:
    from langgraph.store.memory import InMemoryStore

    from fastmem.integrations.langgraph import FastmemStore

    index = {"dims": DIM, "embed": embedder.langgraph, "fields": ["text"]}
    sqlite = sqlite_store(os.path.join(workdir, "sqlite.db"), embedder)
    return {
        "InMemoryStore": InMemoryStore(index=index),  # type: ignore[arg-type]
        "SqliteStore": sqlite,
        "FastmemStore": FastmemStore(os.path.join(workdir, "fastmem"), index={"fields": ["text"]},
                                     embedder=embedder),
    }  # fmt: skip


def per_op(fn: Any, args: list[Any], budget: float = 15.0) -> float:
    """Median microseconds of one call, each timed alone, over ``args`` (or as many as
    ``budget`` seconds allow: InMemoryStore's query search takes seconds at 100k items)."""
    times = []
    spent = 0.0
    for a in args:
        t0 = time.perf_counter()
        fn(a)
        took = time.perf_counter() - t0
        times.append(took * 1e6)
        spent += took
        if spent > budget and len(times) >= 3:
            break
    return statistics.median(times)


def fill(store: Any, data: list[Any]) -> float:
    from langgraph.store.base import PutOp

    t0 = time.perf_counter()
    for i in range(0, len(data), 500):
        store.batch([PutOp(ns, key, value) for ns, key, value in data[i : i + 500]])
    return time.perf_counter() - t0


def measure(name: str, store: Any, data: list[Any], rng: random.Random) -> dict[str, float]:
    n = len(data)
    out = {"fill_s": fill(store, data)}
    fresh = [(("users", "u0"), f"new{i}", {"text": data[i][2]["text"], "n": -i, "kind": "a", "score": 0})
             for i in range(500)]  # fmt: skip
    out["put"] = per_op(lambda a: store.put(*a), fresh)
    keys = [data[rng.randrange(n)] for _ in range(2000)]
    out["get"] = per_op(lambda a: store.get(a[0], a[1]), keys)
    queries = [QUERIES[i % len(QUERIES)] for i in range(50)]
    out["search query, all"] = per_op(lambda q: store.search(("users",), query=q, limit=10), queries)
    users = [(q, f"u{rng.randrange(NAMESPACES)}") for q in queries]
    out["search query, 1 user"] = per_op(lambda a: store.search(("users", a[1]), query=a[0], limit=10), users)
    flt = {"kind": "b", "score": {"$gte": 7}}
    out["search filter"] = per_op(lambda _: store.search(("users",), filter=flt, limit=10), list(range(50)))
    return out


RESTART = """
import sys, time, numpy as np
sys.path.insert(0, {bench!r})
import langgraph_store as b
cache = b.load_cache({cache!r})
emb = b.CachedEmbedder(cache)
kind = {kind!r}
if kind == "FastmemStore":
    from fastmem.integrations.langgraph import FastmemStore
    t0 = time.perf_counter()
    store = FastmemStore({path!r}, index={{"fields": ["text"]}}, embedder=emb)
else:
    import langgraph.store.sqlite, sqlite3
    try:
        import pysqlite3
    except ImportError:
        pass
    t0 = time.perf_counter()
    store = b.sqlite_store({path!r}, emb)
found = store.search(("users",), query=b.QUERIES[0], limit=10)
print(time.perf_counter() - t0, len(found))
"""


def restart(kind: str, path: str, cache_path: str) -> float:
    code = RESTART.format(bench=os.path.dirname(os.path.abspath(__file__)), cache=cache_path, kind=kind, path=path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, found = done.stdout.split()
    assert int(found) == 10, done.stdout
    return float(seconds)


def paired(adapter: Any, core: Any, args: list[Any]) -> tuple[float, float]:
    """Median microseconds of the adapter's call and of the core call, timed in turns on the
    same arguments (the load of a shared machine changes between two separate runs)."""
    a_times, c_times = [], []
    for a, c in args:
        t0 = time.perf_counter()
        adapter(a)
        t1 = time.perf_counter()
        core(c)
        t2 = time.perf_counter()
        a_times.append((t1 - t0) * 1e6)
        c_times.append((t2 - t1) * 1e6)
    return statistics.median(a_times), statistics.median(c_times)


def in_blocks(adapter: Any, core: Any, args: list[Any], block: int = 50) -> tuple[float, float]:
    """``paired`` for writes, in blocks of ``block`` calls each: the adapter's first put after
    a block of core adds reads those adds into its catalog (another writer's work), which a
    call-by-call alternation would charge to every put."""
    a_times: list[float] = []
    c_times: list[float] = []
    for i in range(0, len(args), block):
        for a, _ in args[i : i + block]:
            t0 = time.perf_counter()
            adapter(a)
            a_times.append((time.perf_counter() - t0) * 1e6)
        for _, c in args[i : i + block]:
            t0 = time.perf_counter()
            core(c)
            c_times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(a_times), statistics.median(c_times)


def overhead(store: Any, data: list[Any], rng: random.Random) -> dict[str, tuple[float, float]]:
    """(adapter, core) microseconds per call."""
    from fastmem.integrations.langgraph import namespace_type

    core = store.store
    sample = [data[rng.randrange(len(data))] for _ in range(2000)]
    gets = [((ns, key), store._catalog[(ns, key)].mid) for ns, key, _ in sample]
    types = [namespace_type(("users", f"u{j}"), True) for j in range(NAMESPACES)]
    queries = [(q, q) for q in QUERIES * 5]
    puts = [(i, {"text": data[i][2]["text"], "type": types[0], "metadata": {"langgraph": {
             "namespace": ["users", "u0"], "key": f"x{i}", "value": data[i][2], "created_at": 0.0}}})
            for i in range(400)]  # fmt: skip
    return {
        "get": paired(lambda a: store.get(*a), core.get, gets),
        "search query": paired(lambda q: store.search(("users",), query=q, limit=10),
                               lambda q: core.search(q, 10, types=types), queries),
        "put": in_blocks(lambda i: store.put(("users", "u0"), f"y{i}", data[i][2]),
                         lambda a: core.add(**a), puts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--overhead-only", action="store_true",
                        help="only FastmemStore's overhead over the core calls, at the largest size")
    args = parser.parse_args()
    from importlib.metadata import version

    import langgraph.version  # noqa: F401

    print(f"fastmem {fastmem.__version__}, langgraph {version('langgraph')}, "
          f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    root = args.workdir or tempfile.mkdtemp(prefix="lg-bench-")
    os.makedirs(root, exist_ok=True)
    cache_path = os.path.join(root, "vectors.npz")
    cache = load_cache(cache_path)
    embedder = CachedEmbedder(cache)
    texts = sentences()
    rows: dict[int, dict[str, dict[str, float]]] = {}
    if args.overhead_only:
        from fastmem.integrations.langgraph import FastmemStore

        n = max(args.sizes)
        data = items(n, texts)
        with FastmemStore(os.path.join(root, f"overhead{n}"), index={"fields": ["text"]}, embedder=embedder) as store:
            fill(store, data)
            store.get(*data[0][:2])  # the catalog loaded
            print_overhead(n, overhead(store, data, random.Random(1)))
        return
    for n in args.sizes:
        workdir = os.path.join(root, f"n{n}")
        os.makedirs(workdir, exist_ok=True)
        data = items(n, texts)
        stores = open_stores(workdir, embedder)
        rows[n] = {}
        for name, store in stores.items():
            rows[n][name] = measure(name, store, data, random.Random(n))
            print(f"N={n} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in rows[n][name].items()), flush=True)
        report(n, rows[n])
        if n == max(args.sizes):
            print_overhead(n, overhead(stores["FastmemStore"], data, random.Random(1)))
        stores["FastmemStore"].close()
        stores["SqliteStore"].conn.close()
        if n == max(args.sizes):
            fm = [restart("FastmemStore", os.path.join(workdir, "fastmem"), cache_path) for _ in range(3)]
            sq = [restart("SqliteStore", os.path.join(workdir, "sqlite.db"), cache_path) for _ in range(3)]
            print(f"\nrestart at N={n} (open + first query search, best of 3): FastmemStore "
                  f"{min(fm) * 1e3:.1f} ms, SqliteStore {min(sq) * 1e3:.1f} ms: "
                  f"{min(sq) / min(fm):.2f}x")  # fmt: skip
    print(json.dumps(rows))


def print_overhead(n: int, over: dict[str, tuple[float, float]]) -> None:
    print(f"\nN={n}: adapter overhead over the core call (us per call, adapter / core):")
    for op, (a, c) in over.items():
        print(f"  {op:<14} {a:10.1f} {c:10.1f}   {100 * (a / c - 1):+.0f}%")


def report(n: int, row: dict[str, dict[str, float]]) -> None:
    print(f"\nN={n}: microseconds per call (fill: seconds for all N); ratio = fastest peer / FastmemStore")
    ops = list(row["FastmemStore"])
    print(f"  {'operation':<22}{'InMemoryStore':>15}{'SqliteStore':>15}{'FastmemStore':>15}{'ratio':>8}")
    for op in ops:
        peers = min(row["InMemoryStore"][op], row["SqliteStore"][op])
        print(f"  {op:<22}{row['InMemoryStore'][op]:>15,.1f}{row['SqliteStore'][op]:>15,.1f}"
              f"{row['FastmemStore'][op]:>15,.1f}{peers / row['FastmemStore'][op]:>8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

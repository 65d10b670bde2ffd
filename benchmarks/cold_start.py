"""Cold start: what a fresh process waits for before its first answer, beside the floor of
any Python process that uses numpy and SQLite.

Each run is a fresh interpreter; the kinds alternate run by run (floor, import, first
context, command line...) so that the machine's noise hits them alike. Timed:

* ``floor``: ``python -c "import sqlite3, numpy"``, the process's wall time;
* ``import``: ``python -c "import fastmem"``, the process's wall time;
* ``context``: a fresh process imports fastmem, opens the store (read-only, the default
  embedder: the model loads in the background from ``open()`` on) and asks one
  ``context(question, budget=1300)`` that waits for the model however long it takes (the
  default policy waits 0.5 s, then answers degraded): the process's wall time, and inside it
  the time from the start of the import to the context's return;
* ``context ... sessions``: the same on a store of the first size whose memories are in 25
  named sessions (so a day's header names its session: "## chat 3 · 5 Mar 2026") and one in
  five of whose texts has words beyond ASCII (café, Zürich, 東京...): what counting such a
  context's tokens costs a fresh process (each child reports whether it loaded tiktoken);
* ``cli-context`` / ``cli-search``: ``python -m fastmem context STORE QUESTION --json`` (and
  ``search``) as a hook runs them, the process's wall time (the command line waits for the
  model rather than answer without it).

Children run outside the checkout (their working directory is a temporary folder) with the
fastmem this script imports first on ``PYTHONPATH``, or another tree given by ``--baseline``
(the same runs, interleaved: e.g. a checkout of the commit before a change). Each child checks
``fastmem.BACKEND == "cython"``. Python's bytecode cache is on for the children (in a folder
of the bench directory), as it is for an installed package: with ``PYTHONDONTWRITEBYTECODE``
every import compiles fastmem's sources again (``--no-bytecode`` measures that).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cold_start.py \\
        --sizes 10k --runs 21 [--baseline /tmp/before]

The stores are workload.py's (random 384-d vectors and pseudo-English texts, built once and
cached); the questions are ordinary English (their vector is made by the real model).

``--recall LOCOMO_JSON`` (and/or ``--recall-beam BEAM_DIR``) measures instead what a first
context that does not wait for the model costs: the recall of locomo.py's and beam.py's
measure for a full context, for one whose question is embedded by the numpy query path
(onnxruntime never loaded: a fresh process's first context), and for a degraded one
(keywords, recency, importance), on the same stores and questions:

    python benchmarks/cold_start.py --recall ../shared/data/locomo-dev.json \
        --recall-beam ../shared/data/beam-dev --beam-conversations 3 --cache /tmp/recall-cache
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workload

QUESTIONS = (
    "what did we plan for the garden project next week?",
    "which restaurant did the user like in March?",
    "why did the deployment fail on Friday?",
    "what is the user's daughter called?",
    "how much was the kitchen renovation budget?",
)

FIRST_CONTEXT = """
import json, sys, time
t0 = time.perf_counter()
import fastmem
t1 = time.perf_counter()
import fastmem.embed  # loaded by open() anyway: its default_embedder() is the store's model
# A first *full* context: it waits for the model however long its load takes (the default
# policy waits 0.5 s, then answers from keywords, recency and importance: degraded), or
# embeds the question in numpy meanwhile (fastmem's default since that path exists).
store = fastmem.open(sys.argv[1], readonly=True, policy=fastmem.ContextPolicy(embedder_wait=60))
t2 = time.perf_counter()
loading = not fastmem.embed.default_embedder().ready
ctx = store.context(sys.argv[2], budget=1300)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "context": t3 - t2, "to_answer": t3 - t0,
                  "model": fastmem.embed.default_embedder().load_seconds, "degraded": ctx.degraded,
                  "onnxruntime_at_answer": "onnxruntime" in sys.modules and not loading,
                  "tokens": ctx.tokens, "backend": fastmem.BACKEND, "file": fastmem.__file__,
                  "tiktoken": "tiktoken" in sys.modules}))
store.close()
"""
CHECK = "import json, fastmem; print(json.dumps({'backend': fastmem.BACKEND, 'file': fastmem.__file__}))"


def child_env(tree: str, bytecode: bool, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTMEM_EMBEDDER", "FASTMEM_BACKEND")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, os.environ.get("PYTHONPATH"))))
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, str]:
    """The wall time and the CPU time (user + system, all its threads) of ``python *argv``
    in a fresh process, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


ACCENTS = (" — café with Zoë in Zürich", " (naïve façade, 5 €)", " · 東京 trip", " ✅ done",
           " über-cool résumé")  # fmt: skip


def sessions_store(n: int, folder: str) -> str:
    """A store in ``folder`` of the workload's first ``n`` memories in 25 named sessions, one
    text in five with words beyond ASCII."""
    import fastmem

    batches = workload.generate(n).fastmem_batches()
    i = 0
    for batch in batches:
        for item in batch:
            item["session"] = f"chat {i % 25}"
            if i % 5 == 0:
                item["text"] += ACCENTS[i // 5 % len(ACCENTS)]
            i += 1
    path = os.path.join(folder, f"sessions-{n}")
    with fastmem.open(path, dim=workload.DIM) as store:
        for batch in batches:
            store.add_many(batch)
    return path


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


class NotReady:
    """The default model's identity, never loaded: a context with it is what a context built
    before the model is ready gets (``degraded``: keywords, recency, importance)."""

    ready = False

    def __init__(self, model: object) -> None:
        self.name, self.dim = model.name, model.dim  # type: ignore[attr-defined]

    def wait(self, timeout: float | None = None) -> bool:
        return False

    def encode(self, texts: list[str]) -> object:
        raise AssertionError("a degraded context must not embed")


def recall(locomo_json: Path | None, beam_dir: Path | None, beam_n: int, budget: int,
           cache: str) -> None:
    """Recall of a full context and of a degraded one (benchmarks/locomo.py's and beam.py's
    measure), on the same stores and questions: what a first context that does not wait for
    the model costs."""
    import beam
    import locomo

    import fastmem
    from fastmem.embed import MiniLM, default_embedder

    model = default_embedder()
    model.wait()
    # The same model's identity, onnxruntime never loaded: every query embedded by the numpy
    # path (MiniLM.encode_query_now), as a fresh process's first context is.
    numpy_only = MiniLM(background=False)
    sets = []  # (title, each text made comparable by, [(store, items, questions, gold texts)])
    if locomo_json:
        convs = []
        for sample in json.loads(Path(locomo_json).read_text()):
            turns = locomo.turns_of(sample)
            text_of = {t["metadata"]["dia_id"]: t["text"] for t in turns}
            qs = [(q, locomo.CATEGORIES[c], ids) for q, c, ids in locomo.questions(sample, set(text_of))]
            convs.append((sample["sample_id"], turns, qs, text_of))
        sets.append((f"LoCoMo dev ({len(convs)} conversations)", str, convs))
    if beam_dir:
        convs = [(f"conv{name}", msgs, qs, {m["metadata"]["id"]: m["text"] for m in msgs})
                 for name, msgs, qs in beam.load(beam_dir)[:beam_n]]  # fmt: skip
        sets.append((f"BEAM dev ({len(convs)} conversations)", beam.norm, convs))
    for title, norm, convs in sets:
        got: dict[str, dict[str, list[float]]] = {"full": {}, "numpy query": {}, "degraded": {}}
        refused = 0
        for name, items, qs, text_of in convs:
            with tempfile.TemporaryDirectory() as tmp:
                path = locomo.store_for(name, items, tmp, cache)
                modes = (("full", model), ("numpy query", numpy_only), ("degraded", NotReady(model)))
                for mode, embedder in modes:
                    with fastmem.open(path, embedder=embedder, readonly=True) as store:
                        for question, group, ids in qs:
                            ctx = store.context(question, budget=budget)
                            if mode == "numpy query" and ctx.degraded:
                                refused += 1  # a character the numpy tokenizer refuses
                            else:
                                assert ctx.degraded == (mode == "degraded")
                            text = norm(ctx.text)
                            got[mode].setdefault(group, []).append(
                                sum(norm(text_of[i]) in text for i in ids) / len(ids))  # fmt: skip
        groups = list(got["full"])
        print(f"\n{title}, budget {budget}: recall of the gold turns")
        print("| first context | recall | " + " | ".join(groups) + " |")
        print("|---|---:|" + "---:|" * len(groups))
        for mode, by in got.items():
            every = [r for rs in by.values() for r in rs]
            cells = " | ".join(f"{statistics.fmean(by[g]):.3f}" for g in groups)
            print(f"| {mode} | {statistics.fmean(every):.3f} | {cells} |")
        print(f"({sum(len(v) for v in got['full'].values())} questions; the numpy path refused "
              f"{refused}, answered degraded; onnxruntime loaded by it: {numpy_only.ready})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10k", help="store sizes (default 10k; e.g. 10k,1M)")
    parser.add_argument("--runs", type=int, default=21, help="runs of each kind (default 21)")
    parser.add_argument("--baseline", action="append", default=[], metavar="TREE",
                        help="another fastmem tree (the folder holding its fastmem/), run alike")  # fmt: skip
    parser.add_argument("--no-bytecode", action="store_true",
                        help="children compile every module anew (no bytecode cache)")
    parser.add_argument("--no-cli", action="store_true", help="leave out the command line runs")
    parser.add_argument("--json", type=Path, help="also write every run's figures to this file")
    parser.add_argument("--recall", type=Path, metavar="LOCOMO_JSON",
                        help="instead: recall of full and degraded first contexts on LoCoMo")
    parser.add_argument("--recall-beam", type=Path, metavar="BEAM_DIR",
                        help="instead: the same on BEAM (its first --beam-conversations)")
    parser.add_argument("--beam-conversations", type=int, default=3)
    parser.add_argument("--cache", default="", help="with --recall: keep the built stores here")
    args = parser.parse_args()
    if args.recall or args.recall_beam:
        recall(args.recall, args.recall_beam, args.beam_conversations, 1300, args.cache)
        return

    ours = workload.fastmem_source()
    trees = {"fastmem": ours, **{f"baseline{i + 1}": t for i, t in enumerate(args.baseline)}}
    cache = workload.bench_dir() / "cold-start-pycache"
    cwd = tempfile.mkdtemp(prefix="cold-start-")
    envs = {name: child_env(tree, not args.no_bytecode, cache) for name, tree in trees.items()}
    for name, tree in trees.items():  # the right fastmem, compiled kernels
        found = last_json(run(["-c", CHECK], envs[name], cwd)[2])
        if found["backend"] != "cython" or not found["file"].startswith(os.path.abspath(tree)):
            sys.exit(f"{name}: the child imported {found} (want {tree}, backend cython)")
    stores = {n: workload.cached_store(n, log=print)[0] for n in workload.parse_sizes(args.sizes)}
    first = next(iter(stores))
    with_sessions = sessions_store(first, cwd)

    # What each run of a round is: (label, argv builder, tree name or None for the floor).
    kinds: list[tuple[str, str | None, object]] = [("floor", None, lambda q: ["-c", "import sqlite3, numpy"])]
    for name in trees:
        kinds.append((f"{name} import", name, lambda q: ["-c", "import fastmem"]))
        for n, path in stores.items():
            kinds.append((f"{name} context {n:,}", name,
                          lambda q, p=path: ["-c", FIRST_CONTEXT, p, q]))  # fmt: skip
        kinds.append((f"{name} context {first:,} sessions", name,
                      lambda q: ["-c", FIRST_CONTEXT, with_sessions, q]))  # fmt: skip
        if not args.no_cli:
            n, path = next(iter(stores.items()))
            for command in ("context", "search"):
                kinds.append((f"{name} cli-{command} {n:,}", name,
                              lambda q, p=path, c=command: ["-m", "fastmem", c, p, q, "--json"]))  # fmt: skip
    floor_env = envs["fastmem"]
    results: dict[str, list[dict]] = {label: [] for label, _, _ in kinds}
    for i in range(args.runs + 1):  # the first round warms the caches and is not counted
        question = QUESTIONS[i % len(QUESTIONS)]
        for label, tree, argv in kinds:
            wall, cpu, out = run(argv(question), envs[tree] if tree else floor_env, cwd)
            row: dict = {"wall": wall, "cpu": cpu}
            if " context " in label:
                row.update(last_json(out))
            elif "cli-context" in label:
                row["degraded"] = json.loads(out)["degraded"]
            if i:
                results[label].append(row)
        print(f"round {i}/{args.runs}", file=sys.stderr, end="\r")

    floor = statistics.median(r["wall"] for r in results["floor"])
    print(f"\n{sys.platform}, Python {sys.version.split()[0]}, {os.cpu_count()} cores; "
          f"{args.runs} runs each, medians; bytecode cache {'off' if args.no_bytecode else 'on'}")
    floor_cpu = statistics.median(r["cpu"] for r in results["floor"])
    parts: dict[str, dict[str, float]] = {}
    print(f"{'kind':36s} {'wall ms':>8s} {'p90':>7s} {'- floor':>8s} {'cpu ms':>7s} "
          f"{'- floor':>8s} {'in-process':>11s} {'degraded':>9s}")  # fmt: skip
    for label, rows in results.items():
        full = [r for r in rows if not r.get("degraded")] or [{"wall": float("nan"), "cpu": float("nan")}]
        walls = sorted(r["wall"] for r in full)
        wall, cpu = statistics.median(walls), statistics.median(r["cpu"] for r in full)
        inside = statistics.median(r["to_answer"] for r in full) if "to_answer" in full[0] else None
        if "to_answer" in full[0]:  # where the in-process time went
            parts[label] = {k: statistics.median(r[k] for r in full) for k in ("import", "open", "context")}
            loads = [r["model"] for r in full if r.get("model") is not None]
            parts[label]["model"] = statistics.median(loads) if loads else float("nan")
            parts[label]["loaded"] = len(loads)  # onnxruntime ready before the context returned
            parts[label]["tiktoken"] = sum(bool(r.get("tiktoken")) for r in full)
        print(f"{label:36s} {1000 * wall:8.1f} {1000 * walls[int(0.9 * (len(walls) - 1))]:7.1f} "
              f"{1000 * (wall - floor):+8.1f} {1000 * cpu:7.1f} {1000 * (cpu - floor_cpu):+8.1f} "
              f"{'' if inside is None else f'{1000 * inside:.1f}':>11s} "
              f"{sum(bool(r.get('degraded')) for r in rows):>4d}/{len(rows)}")  # fmt: skip
    for label, p in parts.items():
        print(f"{label}: import {1000 * p['import']:.1f} ms, open {1000 * p['open']:.2f} ms, "
              f"context {1000 * p['context']:.1f} ms (onnxruntime ready before the answer in "
              f"{p['loaded']:.0f} runs, {1000 * p['model']:.1f} ms after open; tiktoken loaded "
              f"in {p['tiktoken']:.0f} runs)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"trees": trees, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""What a read costs right after another process appended one memory.

    python benchmarks/read_after_append.py [--memories 10000] [--rounds 300]
        [--replay plain|general|separate|arrays|both|compare|lists] [--map room|remap]

Two processes on one store of ``--memories`` memories (keyword-only, no model: given
384-d vectors, so ``search`` runs the vector and keyword paths without an embedder):

* a writer process keeps the store open (as a gateway does) and, each round, adds one
  memory with ``add`` and says so on its stdout;
* this process keeps its own handle and, once the writer answers, times one call that must
  see the new memory — ``get`` of its id, ``recent(1)``, a keyword ``search`` for its words
  or a vector ``search`` for its vector; then it asks the writer again, which this time
  appends nothing and just answers, and times the same call again.

Both calls come right after a wait on the pipe (the same cold caches); the extra of a round
is the first call's time minus the second's: the catch-up on what the other process
appended. Reported as p50 and p95 of the rounds' extras (``--rounds`` per call), with each
call's own p50 and p95.

``--map remap`` maps the data file again whenever it grew (Python's ``mmap``, as before
the map with room past the file's end): compare it with ``--map room`` in runs alternated
one after the other.

Unfair, or at least noisy: both processes share the machine's cores with whatever else
runs, and a p95 of differences carries the noise of both calls; the second ``get`` answers
from the decoded-memory cache the first one filled (a few µs of the extra is that decode,
which any first read of a memory pays).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import fastmem
from fastmem import _format as fmt
from fastmem.storage import (
    index as _index, keyword_index as _keyword, replay as _replay, handle_state as _state,
)
from fastmem import _kernels

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import fastmem
    path = sys.argv[1]
    rng = np.random.default_rng(1)
    store = fastmem.open(path, embedder=None, summarizer=None, durability="batch",
                         policy=fastmem.ContextPolicy(preload=0, recent=0))
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.strip()
        if words == "-":  # a round with nothing appended: answer all the same
            print("-", flush=True)
            continue
        mid = store.add(f"{words} appended by the other process",
                        embedding=rng.standard_normal(384).astype(np.float32))
        print(mid, flush=True)
    store.close()
""")


def _no_plain_run(self: _replay.Replayer, *args: object) -> int:
    return 0  # every record the general way


def _plain_run_quantized_after(
    self: _replay.Replayer, offsets: np.ndarray, lengths: np.ndarray, kinds: np.ndarray,
    dims: np.ndarray, first: int, n: int,
) -> int:  # fmt: skip
    """The compiled run as it was before the kernel quantized: the int8 rows made by a
    separate call after the decode (and, with ``_keyword._FEW_ROWS = 0``, the keyword
    postings' general path)."""
    self._flush()
    index = self.index
    stop = min(n, first + _replay._PLAIN_ROWS)
    rows = np.empty(stop - first, dtype=fmt.INDEX_DTYPE)
    vectors = np.empty((stop - first, index.dim), dtype=np.uint16)
    count, texts, vectored = _kernels.memory_rows(
        self.dat, offsets, lengths, kinds, dims, first, stop, index.next_id, index.dim,
        index.type_codes, fmt.DEFAULT_IMPORTANCE, fmt.DEFAULT_USER_TYPE_IMPORTANCE,
        self.sessions, _replay.session_hash, rows, vectors,
    )  # fmt: skip
    if not count:
        return 0
    rows, vectors = rows[:count], vectors[:count]
    quantized = _kernels.quantize_half(vectors) if vectored == count else None
    index.append(rows, vectors.view("<f2") if vectored else None, texts, quantized=quantized,
                 forgotten=0)  # fmt: skip
    last = first + count - 1
    off = int(offsets[last])
    crc_at = off + fmt.RECORD_CRC_AT
    index.note_applied(off, int(lengths[last]), int.from_bytes(self.dat[crc_at : crc_at + 4], "little"))
    return count


def build(path: str, n: int) -> None:
    rng = np.random.default_rng(0)
    with fastmem.open(path, embedder=None, summarizer=None, durability="none") as store:
        for lo in range(0, n, 5000):
            k = min(5000, n - lo)
            vectors = rng.standard_normal((k, 384)).astype(np.float32)
            store.add_many([{"text": f"memory {lo + i} about topic {(lo + i) % 97} and more words",
                             "embedding": vectors[i]} for i in range(k)])  # fmt: skip


def percentiles(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"p50_us": 1e6 * s[len(s) // 2], "p95_us": 1e6 * s[min(len(s) - 1, int(len(s) * 0.95))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--replay", choices=("plain", "general", "both", "separate", "compare",
                                             "arrays", "lists"),
                        default="plain",
                        help="how this process applies the other's memory record: 'plain' (the "
                             "compiled run, fastmem's), 'general' (record by record, as before "
                             "it), 'separate' (the compiled run with the int8 rows made by a "
                             "separate call and the keyword postings' general path, as before "
                             "they were folded in), 'arrays' (the compiled run with the few "
                             "records' scanned columns made into numpy arrays, as before they "
                             "were lists), 'both' (general and plain alternated call by call), "
                             "'compare' (separate and plain alternated), 'lists' (arrays and "
                             "plain alternated, which goes first swapped every round)")  # fmt: skip
    parser.add_argument("--map", choices=("room", "remap"), default="room",
                        help="how this process maps the data file: 'room' (fastmem's: a map "
                             "with room past the file's end, shown further as the file grows) "
                             "or 'remap' (mapped again after each append, as before)")  # fmt: skip
    args = parser.parse_args()
    if args.map == "remap":
        _state.DataMap = None  # mmap, made again whenever the file grew
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "store")
        build(path, args.memories)
        reader = fastmem.open(path, embedder=None, summarizer=None,
                              policy=fastmem.ContextPolicy(preload=0, recent=0))  # fmt: skip
        same_vectors = np.random.default_rng(1)  # the writer's vectors, in its order
        writer = subprocess.Popen([sys.executable, "-c", WRITER, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert writer.stdin is not None and writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        calls = {
            "get": lambda mid, word: reader.get(mid),
            "recent": lambda mid, word: reader.recent(1),
            "search": lambda mid, word: reader.search(word, k=5, mode="keyword"),
            "search_vector": lambda mid, word: reader.search(vector, k=5),
        }
        ways = {"both": ("general", "plain"), "compare": ("separate", "plain"),
                "lists": ("arrays", "plain")}.get(args.replay, (args.replay,))  # fmt: skip
        plain_run = _replay.Replayer._plain_run
        runs = {"plain": plain_run, "general": _no_plain_run, "separate": _plain_run_quantized_after,
                "arrays": plain_run}  # fmt: skip
        catch_up_scan = _index.scan_file
        few_rows = _keyword._FEW_ROWS
        after = {(way, name): [] for way in ways for name in calls}
        alone = {(way, name): [] for way in ways for name in calls}
        for r in range(args.rounds):
            # 'lists' swaps its two ways' order every round: the first call of a pair finds
            # the caches the last pair's search left (~80 µs colder on the machine measured),
            # so a way always first would seem slower than it is.
            order = ways[::-1] if args.replay == "lists" and r % 2 else ways
            for (name, call), way in ((c, w) for c in calls.items() for w in order):
                # The way this process applies the other's memory record: the compiled run
                # of plain records (fastmem's), or one of the ways before it (see --replay).
                _replay.Replayer._plain_run = runs[way]
                # 'arrays': the few records' columns as numpy arrays (four numpy calls), which
                # the compiled run takes through typed views, as before they were lists.
                _index.scan_file = _replay.scan_file if way == "arrays" else catch_up_scan
                _keyword._FEW_ROWS = 0 if way == "separate" else few_rows
                word = f"zq{name}{way}{r}x"
                for appended in (True, False):
                    # Either way this process waits on the pipe for the writer's answer: the
                    # call after the wait finds the same cold caches, appended or not.
                    writer.stdin.write((word if appended else "-") + "\n")
                    writer.stdin.flush()
                    answer = writer.stdout.readline().strip()
                    if appended:
                        mid = answer
                        vector = same_vectors.standard_normal(384).astype(np.float32)
                    t = time.perf_counter()
                    got = call(mid, word)
                    took = time.perf_counter() - t
                    if name == "get":
                        assert got.id == mid
                    elif name == "recent":
                        assert got[0].id == mid
                    else:
                        assert any(hit.id == mid for hit in got), (mid, got)
                    (after if appended else alone)[way, name].append(took)
        writer.stdin.close()
        writer.wait()
        reader.close()
    report = {}
    for (way, name), took in after.items():
        extra = [a - b for a, b in zip(took, alone[way, name])]
        report[f"{name} ({way} replay)"] = {
            "extra": percentiles(extra), "after_append": percentiles(took),
            "nothing_appended": percentiles(alone[way, name])}  # fmt: skip
    print(json.dumps({"memories": args.memories, "rounds": args.rounds, "map": args.map, **report},
                     indent=1))  # fmt: skip
    for name, r in report.items():
        print(
            f"{name:22s} extra after another process's add: p50 {r['extra']['p50_us']:7.1f} µs, "
            f"p95 {r['extra']['p95_us']:7.1f} µs (with nothing appended: p50 {r['nothing_appended']['p50_us']:.1f}, "
            f"p95 {r['nothing_appended']['p95_us']:.1f} µs)"
        )


if __name__ == "__main__":
    main()

"""The agent-memory workload the benchmarks share, and the cached stores built from it.

It copies the workload of ``/work/shared/reference/measured-peers.md``, so that figures
from here can be set beside the peers measured there:

* about 115 characters of pseudo-English per memory, from a 20,000-word vocabulary
  drawn with Zipf frequencies (fixed seed);
* a random unit-norm float32 384-d embedding, computed beforehand and passed in;
* a float64 timestamp spread over one year and *not* in insertion order, so
  ``recent()`` cannot just read the end of the file;
* a type string.

Memories are generated in blocks of ``BATCH`` with one random stream per block, so the
workload of N memories is exactly the first N of any larger one: the 10 k store holds
the first 10 k memories of the 1 M store.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORKLOAD_VERSION = 1  # bump when the generated data changes: cached stores are then rebuilt
SEED = 20_240_601
DIM = 384
BATCH = 5_000  # memories per add_many (and per SQLite transaction), as for every peer
VOCAB_SIZE = 20_000
ZIPF_EXPONENT = 1.0  # classic Zipf: the r-th most frequent word has frequency ~ 1/r
WORD_RANK_JITTER = 25.0  # see vocabulary()
TEXT_CHARS = (90, 140)  # per-memory target length, uniform: mean ~115 characters
TYPES = ("conversation", "tool_result", "plan", "fact")
TYPE_WEIGHTS = (0.55, 0.25, 0.10, 0.10)
T0 = 1_704_067_200.0  # 2024-01-01 UTC
YEAR = 365 * 86_400.0

DEFAULT_SIZES = (10_000, 100_000)


def bench_dir() -> Path:
    """Where stores are cached between runs: ``$FASTMEM_BENCH_DIR`` or a folder in /tmp."""
    default = Path(tempfile.gettempdir()) / "fastmem-bench"
    path = Path(os.environ.get("FASTMEM_BENCH_DIR") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def parse_sizes(text: str | None) -> list[int]:
    """``"10000,100000"`` (also ``10k,1M``) -> [10000, 100000]; multiples of BATCH only."""
    if not text:
        return list(DEFAULT_SIZES)
    sizes = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1].lower(), 1)
        n = int(float(part[:-1] if scale != 1 else part) * scale)
        if n <= 0 or n % BATCH:
            raise ValueError(f"size {part!r}: must be a positive multiple of {BATCH}")
        sizes.append(n)
    return sizes


# --- generation ------------------------------------------------------------------------


def _block_rng(block: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([SEED, block]))


@functools.cache
def vocabulary() -> tuple[list[str], np.ndarray, np.ndarray]:
    """20,000 distinct pseudo-words, most frequent first; their Zipf CDF and lengths + 1.

    Words are built from English-like syllables; shorter words tend to get higher ranks,
    as in real text (frequent words are short), so the mean word length is realistic.
    """
    rng = np.random.default_rng(np.random.SeedSequence([SEED, 0xC0FFEE]))
    onsets = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "y", "z", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gr", "pl", "pr",
              "sh", "sl", "sp", "st", "str", "th", "tr", "wh")  # fmt: skip
    vowels = ("a", "e", "i", "o", "u", "ea", "ee", "ai", "ou", "oo", "ie", "y")
    codas = ("", "", "", "n", "r", "s", "t", "l", "m", "d", "ck", "ng", "nt", "st", "rd", "ll")
    words: set[str] = set()
    while len(words) < VOCAB_SIZE:
        syllables = 1 + rng.binomial(3, 0.4)  # 1-4 syllables, mostly 1-2
        word = "".join(
            onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
            + codas[rng.integers(len(codas))]
            for _ in range(syllables)
        )  # fmt: skip
        if 1 < len(word) <= 14:
            words.add(word)
    ranked = sorted(words)  # deterministic: sets are unordered
    # Rank by length plus a random jitter: short words tend to be frequent, and the mean
    # length of running text comes out at ~4.7 characters, as in English.
    key = np.array([len(w) for w in ranked]) + rng.random(len(ranked)) * WORD_RANK_JITTER
    ranked = [ranked[i] for i in np.argsort(key, kind="stable")]
    weights = 1.0 / np.arange(1, VOCAB_SIZE + 1) ** ZIPF_EXPONENT
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    spaced_len = np.array([len(w) + 1 for w in ranked])  # + the space after it
    return ranked, cdf, spaced_len


def _block(block: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Memories ``block * BATCH`` to ``(block + 1) * BATCH``: texts, vectors, timestamps, types."""
    words, cdf, word_len = vocabulary()
    rng = _block_rng(block)
    targets = rng.integers(TEXT_CHARS[0], TEXT_CHARS[1] + 1, size=BATCH)
    # One stream of words for the whole block, cut where the running length passes each
    # text's cumulative target: lengths stay close to their targets and errors don't add up.
    wanted = int(targets.sum())
    stream = np.searchsorted(cdf, rng.random(wanted // 4), side="right")
    while word_len[stream].sum() < wanted + 200:
        more = np.searchsorted(cdf, rng.random(wanted // 8), side="right")
        stream = np.concatenate([stream, more])
    ends = np.searchsorted(np.cumsum(word_len[stream]), np.cumsum(targets)) + 1
    starts = np.concatenate(([0], ends[:-1]))
    ids = stream.tolist()
    texts = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        sentence = " ".join([words[i] for i in ids[a:b]])
        texts.append(sentence[0].upper() + sentence[1:] + ".")
    vectors = rng.standard_normal((BATCH, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    timestamps = T0 + rng.random(BATCH) * YEAR
    types = rng.choice(len(TYPES), size=BATCH, p=TYPE_WEIGHTS).astype(np.uint8)
    return texts, vectors, timestamps, types


# The SQLite peer's table (storage_peers.py, compare.py): the workload's columns, an index
# on the timestamp for "the newest first".
SQLITE_SCHEMA = (
    "CREATE TABLE memories (id INTEGER PRIMARY KEY, text TEXT NOT NULL, type TEXT NOT NULL,"
    " ts REAL NOT NULL, embedding BLOB NOT NULL)",
    "CREATE INDEX memories_ts ON memories (ts)",
)


@dataclass(frozen=True)
class Workload:
    """N generated memories, column by column (row i is the memory added i-th)."""

    texts: list[str]
    vectors: np.ndarray  # (N, DIM) float32, unit norm
    timestamps: np.ndarray  # (N,) float64, Unix seconds, shuffled over one year
    types: np.ndarray  # (N,) uint8 codes into TYPES

    def __len__(self) -> int:
        return len(self.texts)

    def fastmem_batch(self, start: int) -> list[dict[str, Any]]:
        """The ``add_many`` argument for the batch of rows from ``start``."""
        return [
            {"text": self.texts[i], "type": TYPES[self.types[i]],
             "timestamp": float(self.timestamps[i]), "embedding": self.vectors[i]}
            for i in range(start, min(start + BATCH, len(self)))
        ]  # fmt: skip

    def sqlite_batch(self, start: int) -> list[tuple[int, str, str, float, bytes]]:
        """``executemany`` rows (id, text, type, ts, float32 embedding BLOB) for
        :data:`SQLITE_SCHEMA`, for the batch of rows from ``start``."""
        return [
            (i, self.texts[i], TYPES[self.types[i]], float(self.timestamps[i]),
             self.vectors[i].tobytes())
            for i in range(start, min(start + BATCH, len(self)))
        ]  # fmt: skip

    def fastmem_batches(self) -> list[list[dict[str, Any]]]:
        """Every batch's ``add_many`` argument, built ahead so that a timed insert only inserts."""
        return [self.fastmem_batch(start) for start in range(0, len(self), BATCH)]

    def sqlite_batches(self) -> list[list[tuple[int, str, str, float, bytes]]]:
        """Every batch's ``executemany`` rows, built ahead."""
        return [self.sqlite_batch(start) for start in range(0, len(self), BATCH)]

    def queries(self, count: int = 50, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
        """``count`` stored vectors plus small Gaussian noise, renormalised (cosine ~0.98 to
        the source), as in the peers' measurement; returns (queries, source rows)."""
        rng = np.random.default_rng(np.random.SeedSequence([SEED, seed]))
        sources = rng.choice(len(self), size=count, replace=False)
        # Noise of norm ~0.2: cos = 1 / sqrt(1 + DIM * sigma^2) ~= 0.98.
        sigma = np.sqrt((1 / 0.98**2 - 1) / DIM)
        q = self.vectors[sources] + rng.normal(0.0, sigma, (count, DIM)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        return q, sources


KEYWORD_KINDS = ("frequent", "rare")
FREQUENT_RANKS = (0, 10)  # words ranked 1-10: each in ~17% to ~86% of the memories
RARE_RANKS = (2_000, VOCAB_SIZE)  # each in ~0.01% to ~0.05% of the memories


def keyword_queries(kind: str, count: int = 20, seed: int = 13) -> list[str]:
    """``count`` two-word keyword queries of ``kind``: "frequent" (both words among the 10
    most frequent, the worst case for an inverted index: long postings lists) or "rare"
    (both words ranked 2,000 or lower). Fixed seed, two distinct words each."""
    words = vocabulary()[0]
    lo, hi = FREQUENT_RANKS if kind == "frequent" else RARE_RANKS
    rng = np.random.default_rng(np.random.SeedSequence([SEED, seed, KEYWORD_KINDS.index(kind)]))
    return [" ".join(words[i] for i in rng.choice(np.arange(lo, hi), 2, replace=False))
            for _ in range(count)]  # fmt: skip


def random_rows(n: int, count: int, seed: int = 11) -> np.ndarray:
    """``count`` row numbers drawn uniformly (with repeats) from ``range(n)``, fixed seed."""
    return np.random.default_rng(np.random.SeedSequence([SEED, seed, n])).integers(0, n, count)


@functools.lru_cache(maxsize=1)  # the 1 M workload is ~2 GB: keep only the latest
def generate(n: int) -> Workload:
    """The first ``n`` memories of the workload (``n`` a multiple of BATCH)."""
    if n <= 0 or n % BATCH:
        raise ValueError(f"n must be a positive multiple of {BATCH}, got {n}")
    texts: list[str] = []
    vectors = np.empty((n, DIM), dtype=np.float32)
    timestamps = np.empty(n, dtype=np.float64)
    types = np.empty(n, dtype=np.uint8)
    for block in range(n // BATCH):
        t, v, ts, ty = _block(block)
        s = slice(block * BATCH, (block + 1) * BATCH)
        texts += t
        vectors[s], timestamps[s], types[s] = v, ts, ty
    return Workload(texts, vectors, timestamps, types)


# --- cached fastmem stores -------------------------------------------------------------


def _cache_key(n: int) -> str:
    from fastmem import _format

    return f"fastmem-w{WORKLOAD_VERSION}-f{_format.FORMAT_VERSION}-{n}"


def _layout_digest() -> str:
    """A digest of the fastmem modules that decide what the files hold.

    FORMAT_VERSION alone is not enough while the format is being worked on: an index
    laid out differently under the same version could still open without a warning,
    and restarts would then be timed on the old layout.
    """
    import hashlib

    import fastmem

    package = Path(fastmem.__file__).parent
    digest = hashlib.sha256()
    for name in ("_format.py", "storage/index.py", "storage/keyword_index.py", "store.py"):
        digest.update((package / name).read_bytes())  # (a module that moved: an error, not a stale store)
    return digest.hexdigest()[:16]


def _cached_store_ok(folder: Path, n: int) -> bool:
    """A cached store is used only if its marker matches and it opens cleanly with N memories."""
    import fastmem

    marker = folder / "workload.json"
    if not marker.exists():
        return False
    try:
        info = json.loads(marker.read_text())
        if (info.get("workload_version"), info.get("n"), info.get("fastmem_layout")) != (
            WORKLOAD_VERSION, n, _layout_digest()
        ):
            return False
        # Any warning (an index rebuilt, a tail cut) means the files are not what a clean
        # close leaves: rebuild rather than time a recovery.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with fastmem.open(folder / "store", readonly=True) as store:
                return len(store) == n
    except Exception:  # noqa: BLE001 - stale for whatever reason: rebuild it
        return False


def build_store(path: str | os.PathLike[str], batches: list[list[dict[str, Any]]],
                durability: str = "batch") -> list[str]:
    """Insert ``batches`` into a new store at ``path`` with add_many, then close it."""
    import fastmem

    ids: list[str] = []
    store = fastmem.open(path, dim=DIM, durability=durability)
    try:
        for batch in batches:
            ids += store.add_many(batch)
    finally:
        store.close()
    return ids


def cached_store(n: int, *, log: Any = None) -> tuple[str, list[str]]:
    """Path of a store holding the first ``n`` memories and their ids, built once and
    kept under :func:`bench_dir` (rebuilt when the workload or fastmem's layout code
    changes, or the files do not open cleanly)."""
    root = bench_dir()
    folder = root / _cache_key(n)
    if not _cached_store_ok(folder, n):
        if log:
            log(f"building the {n:,}-memory store in {folder} ...")
        started = time.perf_counter()
        shutil.rmtree(folder, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".build-{n}-", dir=root))
        ids = build_store(scratch / "store", generate(n).fastmem_batches())
        np.save(scratch / "ids.npy", np.array(ids))
        (scratch / "workload.json").write_text(
            json.dumps({"workload_version": WORKLOAD_VERSION, "n": n, "seed": SEED,
                        "fastmem_layout": _layout_digest(),
                        "built": time.strftime("%Y-%m-%dT%H:%M:%S")})  # fmt: skip
        )
        os.replace(scratch, folder)  # atomic: a half-built store is never taken as cached
        if log:
            log(f"built in {time.perf_counter() - started:.1f} s")
    ids = np.load(folder / "ids.npy").tolist()
    return str(folder / "store"), ids


def store_bytes(path: str) -> int:
    """Both files of a fastmem store together (apparent size)."""
    return sum(os.path.getsize(path + ext) for ext in (".dat", ".idx"))


# --- restarts in fresh processes --------------------------------------------------------

# "Restart" as the peers were measured: in a fresh process, after the imports, open the
# store and read the 20 most recent memories with their text. The child times itself with
# perf_counter, so interpreter start-up and imports are left out; it prints one JSON line.
RESTART_CHILD = {
    "fastmem": """
import json, sys, time
sys.path.insert(0, sys.argv[2])  # the fastmem the parent imported (see fastmem_source)
import fastmem  # with numpy and msgpack: imports are not part of a restart
t0 = time.perf_counter()
store = fastmem.open(sys.argv[1])
texts = [m.text for m in store.recent(20)]
t1 = time.perf_counter()
store.close()
assert len(texts) == 20 and all(texts)
print(json.dumps({"seconds": t1 - t0, "fastmem": fastmem.__file__}))
""",
    "sqlite": """
import json, sqlite3, sys, time
t0 = time.perf_counter()
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT id, text, type, ts FROM memories ORDER BY ts DESC LIMIT 20").fetchall()
texts = [r[1] for r in rows]
t1 = time.perf_counter()
db.close()
assert len(texts) == 20 and all(texts)
print(json.dumps({"seconds": t1 - t0}))
""",
}


def fastmem_source() -> str:
    """The folder holding the ``fastmem`` package this process imported.

    Children must time the same code: ``python -c`` would import the fastmem of its working
    directory first, and a worker script the one on its path, which need not be this one
    (e.g. a checkout of another commit on PYTHONPATH beside the editable install).
    """
    import fastmem

    return os.path.dirname(os.path.dirname(os.path.abspath(fastmem.__file__)))


def child_env() -> dict[str, str]:
    """This environment, with :func:`fastmem_source` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (fastmem_source(), env.get("PYTHONPATH"))))
    return env


def run_child(code: str, *args: str, timeout: float = 600.0) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (same venv and environment); its last stdout
    line, parsed as JSON."""
    return run_python(["-c", code, *map(str, args)], timeout=timeout)


def run_python(argv: list[str], *, timeout: float) -> dict[str, Any]:
    """``python *argv`` in a fresh interpreter (same venv, :func:`child_env`); its last
    stdout line, parsed as JSON."""
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True, text=True, timeout=timeout, check=False, env=child_env(),
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def restart_seconds(system: str, path: str) -> float:
    """One restart of ``system`` ("fastmem" or "sqlite") in a fresh process, in seconds."""
    source = fastmem_source()
    result = run_child(RESTART_CHILD[system], path, source)
    if system == "fastmem" and not result["fastmem"].startswith(source + os.sep):
        raise RuntimeError(f"the child imported {result['fastmem']}, not the fastmem in {source}")
    return float(result["seconds"])


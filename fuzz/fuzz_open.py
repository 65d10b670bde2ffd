"""Fuzz target: hostile bytes as a store's ``.dat`` or ``.idx``, then every read path.

The first byte of an input picks what the rest is (``MODES``) and whether the store is
opened read-only; the harness writes those bytes beside a valid copy of the other file,
opens the store and reads everything it can: ``len``, ``recent``, iteration, ``get``,
keyword, vector and hybrid search, ``context``, ``verify``, and (writers) an ``add``, a
checkpoint and ``close``. Only fastmem's own errors (``FastmemError``) may come out; any
other exception, a crash, a hang (``-timeout``) or a memory blow-up (``-rss_limit_mb``)
is a finding, saved by libFuzzer as ``crash-<sha1>``.

Run (libFuzzer flags; ``fuzz/run.py`` runs the targets and adds up the inputs)::

    python fuzz/fuzz_open.py -runs=100000 -max_len=65536 -timeout=10 CORPUS_DIR

``CORPUS_DIR`` is seeded with the valid files of each mode when empty. Without atheris,
``python fuzz/fuzz_open.py --random N`` runs ``N`` inputs made by a simple mutator (the
test suite's smoke run uses ``one_input`` the same way).
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__" and "--random" not in sys.argv:  # under atheris (libFuzzer)
    import atheris

    with atheris.instrument_imports(include=["fastmem"]):  # coverage guides the mutations
        import fastmem
else:
    import fastmem
from fastmem import _format as fmt  # noqa: E402

DIM = 8
# What the bytes after the mode byte are. "fixed" modes repair the checksums the fuzzer
# would almost never get right, so that its mutations reach the parsers behind them.
MODES = ("dat", "idx", "idx-fixed-crc", "dat-fixed-crc")
READONLY_BIT = 0x80

_state: dict[str, object] = {}
_thread_errors: list[BaseException] = []


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    # fastmem's threads (preload, keyword build, group commit) must not die of hostile
    # bytes either: what kills one is raised again in the fuzzing thread.
    if args.exc_value is not None and not isinstance(args.exc_value, fastmem.FastmemError):
        _thread_errors.append(args.exc_value)


threading.excepthook = _thread_excepthook


def _vector(i: int) -> list[float]:
    rng = np.random.default_rng(i)
    return rng.standard_normal(DIM).tolist()


def make_seed_store(directory: str) -> tuple[bytes, bytes]:
    """A small store with every kind of record and section: ``(dat bytes, idx bytes)``."""
    path = os.path.join(directory, "seed")
    policy = fastmem.ContextPolicy(preload=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastmem.RecoveryWarning)
        with fastmem.open(path, dim=DIM, embedder=None, summarizer=None, policy=policy) as s:
            ids = s.add_many([
                {"text": f"memory {i}: alpha beta {'gamma ' * (i % 3)}delta", "session": f"s{i % 2}",
                 "type": ("fact", "plan", "note")[i % 3], "timestamp": 1_700_000_000 + i,
                 "embedding": _vector(i), "metadata": {"n": i, "b": b"\x00\x01"} if i % 2 else None,
                 "summary": "short" if i % 4 == 0 else None}
                for i in range(6)
            ])  # fmt: skip
            s.add("a longer memory " + "with repeated words " * 40, embedding=_vector(9))
            s.update(ids[1], importance=0.8, metadata={"k": "v"})
            s.pin(ids[2])
            s.forget(ids[3])
            s.checkpoint()
            s.add("after the checkpoint: epsilon zeta", embedding=_vector(10), session="s1")
            s.forget(ids[4])
        # closed: the index covers everything; add a tail the index does not cover
        with fastmem.open(path, embedder=None, summarizer=None, policy=policy, durability="none") as s:
            s.add("tail memory eta theta", embedding=_vector(11))
            with open(path + ".idx", "rb") as f:
                idx = f.read()
            s.add("tail memory iota", embedding=_vector(12))
            s.flush()
            with open(path + ".dat", "rb") as f:
                dat = f.read()
    return dat, idx


def fix_idx_crc(idx: bytes) -> bytes:
    """The index with its header checksum recomputed."""
    if len(idx) < fmt.IDX_HEADER_SIZE:
        return idx
    body = idx[: fmt.IDX_HEADER_CRC_AT]
    return body + struct.pack("<I", fmt.crc32(body)) + idx[fmt.IDX_HEADER_SIZE :]


def fix_dat_crcs(dat: bytes) -> bytes:
    """The data file with its header checksum and every framed record's checksum
    recomputed (records found by their magic, lengths taken as they are)."""
    buf = bytearray(dat)
    if len(buf) >= fmt.DAT_HEADER_SIZE:
        buf[fmt.DAT_HEADER_SIZE - 4 : fmt.DAT_HEADER_SIZE] = struct.pack(
            "<I", fmt.crc32(bytes(buf[: fmt.DAT_HEADER_SIZE - 4]))
        )
    pos = buf.find(fmt.RECORD_MAGIC, fmt.DAT_HEADER_SIZE)
    while pos != -1 and pos + fmt.RECORD_HEADER_SIZE <= len(buf):
        _, _, _, dim, plen, _, _ = fmt.RECORD_HEADER.unpack_from(buf, pos)
        end = pos + fmt.RECORD_HEADER_SIZE + 2 * dim + plen
        if end <= len(buf):
            crc = fmt.crc32(bytes(buf[pos + fmt.RECORD_HEADER_SIZE : end]),
                            fmt.crc32(bytes(buf[pos : pos + fmt.RECORD_CRC_AT])))  # fmt: skip
            buf[pos + fmt.RECORD_CRC_AT : pos + fmt.RECORD_HEADER_SIZE] = struct.pack("<I", crc)
        pos = buf.find(fmt.RECORD_MAGIC, pos + 1)
    return bytes(buf)


def seed_inputs() -> list[bytes]:
    """One valid input per mode, writable and read-only."""
    _setup()
    dat, idx = _state["dat"], _state["idx"]
    out = []
    for mode, name in enumerate(MODES):
        body = dat if name.startswith("dat") else idx
        for ro in (0, READONLY_BIT):
            out.append(bytes([mode | ro]) + body)  # type: ignore[operator]
    return out


def _setup() -> None:
    if _state:
        return
    # tmpfs when there is one: creating files on a disk file system costs more than the rest
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="fastmem-fuzz-", dir=shm)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    dat, idx = make_seed_store(directory)
    _state.update(dir=directory, dat=dat, idx=idx, path=os.path.join(directory, "store"))


def one_input(data: bytes) -> None:
    """Write ``data`` as a store's file and read the store every way there is."""
    _setup()
    if not data:
        return
    mode, readonly = MODES[(data[0] & 0x7F) % len(MODES)], bool(data[0] & READONLY_BIT)
    body = data[1:]
    dat, idx = _state["dat"], _state["idx"]
    if mode == "dat":
        dat = body
    elif mode == "dat-fixed-crc":
        dat = fix_dat_crcs(body)
    elif mode == "idx":
        idx = body
    else:
        idx = fix_idx_crc(body)
    path = str(_state["path"])
    for suffix, content in ((".dat", dat), (".idx", idx)):
        with open(path + suffix, "wb") as f:
            f.write(content)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy warning on hostile bytes is a finding too
        warnings.simplefilter("ignore", fastmem.RecoveryWarning)
        exercise(path, readonly)
    if _thread_errors:
        raise _thread_errors.pop()


def _try(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except fastmem.FastmemError:
        return None


def exercise(path: str, readonly: bool) -> None:
    """Open the store at ``path`` and call every read (and, for a writer, a few writes)."""
    policy = fastmem.ContextPolicy(preload=0, recent=0)  # no preload thread: ~2x faster
    try:
        store = fastmem.open(path, embedder=None, summarizer=None, readonly=readonly,
                             durability="none", policy=policy)  # fmt: skip
    except fastmem.FastmemError:
        return
    try:
        _try(len, store)
        _try(store.recent, 5)
        ids = _try(lambda: [m.id for m in store]) or []
        for mid in ids[:20]:
            _try(store.get, mid)
        _try(store.get, "m3")
        _try(store.search, "alpha gamma memory", mode="keyword")
        _try(store.search, "alpha beta", 3, mode="hybrid", session="s1")
        _try(store.search, _vector(1), 4, mode="vector")
        _try(store.search, "tail", types=["fact", "note"], since=0.0, mode="keyword")
        _try(store.context, "alpha memory", 200, session="s0")
        _try(store.verify)
        if not readonly:
            _try(store.add, "written after a hostile open", embedding=_vector(3))
            if ids:
                _try(store.update, ids[0], importance=0.5)
                _try(store.forget, ids[-1])
            _try(store.checkpoint)
            _try(store.search, "hostile written", mode="keyword")
    finally:
        _try(store.close)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if op < 0.5 and len(buf) > 1:  # flip bits / set bytes
            at = rng.randrange(1, len(buf))
            buf[at] = rng.choice((buf[at] ^ (1 << rng.randrange(8)), rng.randrange(256), 0, 0xFF))
        elif op < 0.65 and len(buf) > 2:  # truncate
            del buf[rng.randrange(2, len(buf)) :]
        elif op < 0.8:  # insert random bytes
            at = rng.randrange(1, len(buf) + 1)
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op < 0.9 and len(buf) > 8:  # overwrite a little-endian integer with an edge value
            at = rng.randrange(1, len(buf) - 7)
            width = rng.choice((2, 4, 8))
            value = rng.choice((0, 1, (1 << (8 * width)) - 1, 1 << (8 * width - 1), rng.getrandbits(8 * width)))
            buf[at : at + width] = value.to_bytes(width, "little")
        else:  # copy a slice elsewhere (duplicates records or headers)
            a = rng.randrange(1, len(buf))
            b = min(len(buf), a + rng.randint(1, 256))
            at = rng.randrange(1, len(buf))
            buf[at:at] = buf[a:b]
    return bytes(buf)


def random_inputs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` inputs: mutated seed files, and a few purely random ones."""
    rng = random.Random(seed)
    seeds = seed_inputs()
    out = []
    for i in range(n):
        if i % 16 == 15:
            out.append(bytes([rng.randrange(256)]) + rng.randbytes(rng.randint(0, 5000)))
        else:
            out.append(_mutate(rng, rng.choice(seeds)))
    return out


def command_line(one_input: Callable[[bytes], None], seed_inputs: Callable[[], list[bytes]]) -> None:
    """Both targets' command line: ``--random N [SEED]`` feeds ``one_input`` N inputs of the plain
    mutator (no atheris needed); otherwise atheris fuzzes it, from ``seed_inputs`` when the corpus
    folder is empty."""
    if len(sys.argv) >= 3 and sys.argv[1] == "--random":
        n = int(sys.argv[2])
        for data in random_inputs(n, seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0):
            one_input(data)
        print(f"Done {n} runs (random mutator)")
        return
    import atheris  # imported (instrumenting fastmem) by the target run as __main__

    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    if corpus and not os.listdir(corpus[0]):
        for i, data in enumerate(seed_inputs()):
            with open(os.path.join(corpus[0], f"seed-{i}"), "wb") as f:
                f.write(data)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()

if __name__ == "__main__":
    command_line(one_input, seed_inputs)

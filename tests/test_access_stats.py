"""Access statistics (counts and last-access times) of several processes add up: a
checkpoint keeps what other processes' checkpoints wrote since it loaded the index, plus
its own process's accesses (real processes, each with its own handle)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastmem


@pytest.fixture(autouse=True)
def backend() -> str:
    """The processes run the default kernels: one run is enough."""
    return fastmem.BACKEND


# A process that opens the store, waits for a line on stdin (so that it has loaded the
# index before the other process checkpoints), counts its accesses, and closes.
_WORKER = textwrap.dedent(
    """
    import sys
    import fastmem
    if sys.argv[6] == "delta":  # a small store's checkpoints append deltas, as a large one's do
        import fastmem.storage.index
        fastmem.storage.index.DELTA_MIN_BASE = 1
    path, ids, times, when = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
    store = fastmem.open(path, embedder=None)
    print("open", flush=True)
    sys.stdin.readline()
    for _ in range(times):
        store.record_access(ids, now=when)
    how = sys.argv[5]
    if how == "checkpoint":
        store.checkpoint()
    store.close()
    print("done", flush=True)
    """
)


def _start(
    path: str, ids: list[str], times: int, when: float, how: str, delta: bool
) -> subprocess.Popen[str]:
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER, path, ",".join(ids), str(times), str(when), how,
         "delta" if delta else "full"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


def _finish(proc: subprocess.Popen[str]) -> None:
    out, _ = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0 and out.strip() == "done"


@pytest.mark.parametrize("how", ["close", "checkpoint"])
@pytest.mark.parametrize("delta", [False, True], ids=["full", "delta"])
def test_two_processes_accesses_both_count(tmp_path: Path, how: str, delta: bool) -> None:
    path = str(tmp_path / "agent")
    with fastmem.open(path, embedder=None) as store:
        ids = store.add_many([{"text": f"memory {i}"} for i in range(20)])
        store.record_access([ids[5]], now=1000.0)  # a count both processes load
    a = _start(path, [ids[1], ids[5]], 3, 2000.0, how, delta)
    b = _start(
        path, [ids[2], ids[5]], 2, 1500.0, how, delta
    )  # loaded the index before a's checkpoint
    _finish(a)
    _finish(b)
    with fastmem.open(path, embedder=None, readonly=True) as store:
        got = {
            i: (store.info(ids[i]).access_count, store.info(ids[i]).last_access) for i in (1, 2, 5)
        }
    assert got == {1: (3, 2000.0), 2: (2, 1500.0), 5: (6, 2000.0)}

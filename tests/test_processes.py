"""Many processes on one store, each with its own read-write handle (real processes).

Every process writes (the writer lock is held per write) and every read sees every write
acknowledged, in any process, before it began (``tests/procs_worker.py`` checks each read
against the shared acknowledgement file). Afterwards every acknowledged memory is there
exactly once with its latest state, and ``verify()`` is clean; with writers SIGKILLed at
random moments, nothing acknowledged is lost and the lock is never left held.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import torn_tail_allowed
from procs_worker import read_acks

import fastmem

WORKER = str(Path(__file__).with_name("procs_worker.py"))
SECONDS = float(os.environ.get("FASTMEM_PROCS_SECONDS", "20"))
# Seconds a worker may take beyond SECONDS to show progress (see procs_worker.py): a guard
# against a hang, never a speed bound (the machine is shared, at load 10-16 at times).
HANG = 300.0
KILLS = 24  # in the killed-writers test, each after new progress


@pytest.fixture(autouse=True)
def backend() -> str:
    """The workers are other processes with the default kernels: one run is enough."""
    return fastmem.BACKEND


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts workers; any still running when the test ends (it failed) are killed and reaped."""
    started: list[subprocess.Popen[bytes]] = []

    def start(path: str, acks: str, seed: int, seconds: float, *extra: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "FASTMEM_EMBEDDER": "none"}
        # The checkout under test, not whatever fastmem the venv has installed (the worker
        # script's own directory, tests/, is the only one Python puts first).
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        worker = subprocess.Popen([sys.executable, WORKER, path, acks, str(seed), str(seconds), *extra],
                                  env=env, stderr=subprocess.PIPE)  # fmt: skip
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.returncode is None:  # neither reaped nor read by the test
            worker.kill()
            worker.communicate()


def _acks(path: str) -> list[dict]:
    """Every line, each complete: with no process killed, no line can be torn."""
    text = Path(path).read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _check_final_state(store_path: str, acks: list[dict], *, killed: bool) -> None:
    assert [a for a in acks if a["op"] == "miss"] == []  # every read saw what was acknowledged
    adds = [a for a in acks if a["op"] == "add"]
    ids = [a["id"] for a in adds]
    assert len(ids) == len(set(ids))  # unique across processes
    forgotten = {a["id"] for a in acks if a["op"] == "forget"}
    importance = {a["id"]: a["importance"] for a in acks if a["op"] == "update"}
    with torn_tail_allowed() if killed else contextlib.nullcontext():
        store = fastmem.open(store_path, embedder=None, timeout=1)  # the lock is free
    with store:
        assert store.verify().ok
        live = {m.id: m for m in store}
        for a in adds:
            if a["id"] in forgotten:
                assert a["id"] not in live
            elif a["kind"] == "durable" or not killed:  # a killed owner's forget may be unacked
                memory = live[a["id"]]
                assert memory.text == a["text"]
                if a["id"] in importance:
                    assert memory.importance == pytest.approx(importance[a["id"]], abs=1e-6)
        texts = [m.text for m in live.values()]
        assert len(texts) == len(set(texts))  # nothing twice
        store.add("the lock was not left held")


def test_eight_processes_write_and_read_one_store(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    path, acks = str(tmp_path / "shared"), str(tmp_path / "acks.jsonl")
    Path(acks).touch()
    with fastmem.open(path, embedder=None):
        pass  # created once, so the workers race on writes, not on creation
    workers = [start(path, acks, seed, SECONDS) for seed in range(8)]
    for w in workers:
        _, err = w.communicate(timeout=SECONDS + HANG)
        assert w.returncode == 0, err.decode()[-2000:]
    lines = _acks(acks)
    done = [a for a in lines if a["op"] == "done"]
    assert len(done) == 8 and all(d["writes"] > 0 and d["reads"] > 0 for d in done)
    _check_final_state(path, lines, killed=False)


def test_compaction_beside_three_writers_loses_nothing_and_refuses_no_write(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    path, acks = str(tmp_path / "shared"), str(tmp_path / "acks.jsonl")
    Path(acks).touch()
    seconds = min(SECONDS, 8.0)
    workers = [start(path, acks, seed, seconds) for seed in range(3)]
    # Two compactors: a handle following one compaction meets the next one too.
    workers += [start(path, acks, seed, seconds, "--compact") for seed in (98, 99)]
    for w in workers:
        _, err = w.communicate(timeout=seconds + HANG)
        assert w.returncode == 0, err.decode()[-2000:]  # no StoreLockedError, no other error
    lines = _acks(acks)
    assert all(a["compactions"] > 0 for a in lines if a["op"] == "done" and a["seed"] in (98, 99))
    _check_final_state(path, lines, killed=False)


def test_writers_killed_at_random_lose_nothing_acknowledged(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]]
) -> None:
    path, acks = str(tmp_path / "shared"), str(tmp_path / "acks.jsonl")
    Path(acks).touch()
    rng = random.Random(7)
    seeds = iter(range(1000))
    # The workers would write for an hour: every one of them is killed first.
    workers = [start(path, acks, next(seeds), 3600, *(["--compact"] if i == 0 else [])) for i in range(4)]
    # Each kill waits for new progress (an acknowledged write since the last kill), not for
    # the clock: on a loaded machine a worker's imports alone can outlast a fixed delay, and
    # then the kills would test nothing.
    seen = 0
    for _ in range(KILLS):
        seen = _wait_for_new_acks(acks, seen, workers)
        time.sleep(rng.uniform(0.05, 0.4))
        i = rng.randrange(len(workers))
        workers[i].send_signal(signal.SIGKILL)  # mid-append, mid-compaction, anywhere
        workers[i].communicate()
        workers[i] = start(path, acks, next(seeds), 3600, *(["--compact"] if i == 0 else []))
    for w in workers:
        w.send_signal(signal.SIGKILL)
        w.communicate()
    lines = read_acks(acks)  # a kill may have torn a line: it was never acknowledged
    assert len([a for a in lines if a["op"] == "add"]) > 0
    _check_final_state(path, lines, killed=True)


def _wait_for_new_acks(acks: str, seen: int, workers: list[subprocess.Popen[bytes]]) -> int:
    """Wait until more than ``seen`` writes are acknowledged; returns how many there are.
    Fails when a worker ends by itself, or when no write is acknowledged for HANG seconds."""
    waited = time.monotonic() + HANG
    while True:
        writes = sum(a["op"] in ("add", "forget", "update") for a in read_acks(acks))
        if writes > seen:
            return writes
        assert time.monotonic() < waited and all(w.poll() is None for w in workers)
        time.sleep(0.02)

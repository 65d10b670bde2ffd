"""Writers waiting for the writer lock: what they do while they wait, and what a
checkpoint written beside a load holds the lock for.

Two handles on one store in one process contend for the lock as two processes do (the
lock is ``flock``, held per open file). Nothing here asserts a time: each test checks
what has happened at a point where the lock is still held by the other handle.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import fastmem
from fastmem.storage import writelock as _writelock


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_a_waiting_writer_catches_up_before_it_gets_the_lock(store_path):
    # Two writers wait: the first is next in line (it holds the gate, where there is one,
    # after 50 ms) and only polls; the second applies what the holder appends while it waits.
    holder = fastmem.open(store_path, embedder=None, summarizer=None)
    waiters = [
        fastmem.open(store_path, embedder=None, summarizer=None, timeout=30) for _ in range(2)
    ]
    holder.add("before")
    assert [len(w) for w in waiters] == [1, 1]
    result: list[object] = []
    threads = [
        threading.Thread(target=lambda w=w: result.append(w.add("after the wait"))) for w in waiters
    ]
    with holder._engine.write_lock():  # another process's long write, in effect
        for thread in threads:
            thread.start()
            time.sleep(0.2)  # the waiters poll the lock now, in this order
        holder.add_many([{"text": f"written while the others wait {i}"} for i in range(50)])
        end = os.path.getsize(store_path + ".dat")
        # Still held: the second waiter applied the 50 records while waiting, not once it
        # holds the lock (where every other writer would wait for that replay too).
        assert _wait_for(lambda: waiters[1]._engine.valid_end == end)
        assert not result
    for thread in threads:
        thread.join(30)
    assert sorted(result) == ["m51", "m52"]
    assert len(waiters[0]) == len(waiters[1]) == len(holder) == 53
    holder.close()
    for w in waiters:
        w.close()


def test_a_checkpoints_file_left_aside_by_a_killed_process_is_removed_at_open(store_path):
    import subprocess
    import sys

    fastmem.open(store_path, embedder=None).close()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = f"{store_path}.idx.{int(gone.stdout)}-0.tmp"  # its process has exited
    running = f"{store_path}.idx.{os.getppid()}-0.tmp"  # a process still running: kept
    for name in (orphan, running):
        with open(name, "wb") as f:
            f.write(b"half a checkpoint")
    with fastmem.open(store_path, embedder=None) as store:
        store.add("after")
    assert not os.path.exists(orphan)
    assert os.path.exists(running)
    os.remove(running)


@pytest.mark.skipif(_writelock.GATE is None, reason="no open-file-description locks here")
def test_a_writer_that_lets_the_lock_go_waits_behind_one_already_waiting(store_path, monkeypatch):
    # Every wait sleeps 0.3 s between tries: a writer that lets the lock go and tries again
    # at once would get it first, unless the gate (held by the one waiting) sends it behind.
    for name in ("POLL_FIRST", "POLL_MAX", "POLL_OLD"):
        monkeypatch.setattr(_writelock, name, 0.3)
    monkeypatch.setattr(_writelock, "GATE_AFTER", 0.0)  # (else only after 50 ms of waiting)
    first = fastmem.open(store_path, embedder=None, summarizer=None, timeout=30)
    second = fastmem.open(store_path, embedder=None, summarizer=None, timeout=30)
    waited: list[str] = []
    with first._engine.write_lock():
        thread = threading.Thread(target=lambda: waited.append(second.add("waited")))
        thread.start()
        time.sleep(0.1)  # its first try failed: it sleeps, holding the gate
    again = first.add("let go and took again")
    thread.join(30)
    assert int(waited[0][1:]) < int(again[1:])  # the one waiting wrote first
    first.close()
    second.close()

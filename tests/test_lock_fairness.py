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

import fastmem


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_a_waiting_writer_catches_up_before_it_gets_the_lock(store_path):
    holder = fastmem.open(store_path, embedder=None, summarizer=None)
    waiter = fastmem.open(store_path, embedder=None, summarizer=None, timeout=30)
    holder.add("before")
    assert len(waiter) == 1
    result: list[object] = []
    with holder._engine.write_lock():  # another process's long write, in effect
        thread = threading.Thread(target=lambda: result.append(waiter.add("after the wait")))
        thread.start()
        time.sleep(0.2)  # the waiter polls the lock now
        holder.add_many([{"text": f"written while the other waits {i}"} for i in range(50)])
        end = os.path.getsize(store_path + ".dat")
        # Still held: the waiter applied the 50 records while waiting, not once it holds
        # the lock (where every other writer would wait for that replay too).
        assert _wait_for(lambda: waiter._engine.valid_end == end)
        assert not result
    thread.join(30)
    assert result == ["m51"]
    assert len(waiter) == len(holder) == 52
    holder.close()
    waiter.close()

"""Background threads that do not hold up the call that started them."""

from __future__ import annotations

import _thread
import os
import queue
import threading
import time
from collections.abc import Callable

# How long a background thread waits before it starts. Importing an extension (``dlopen``)
# and the Rust parsers of ``tokenizers`` and ``tiktoken`` hold the GIL for tens of
# milliseconds without a switch; a loader that started at once stalled the ``open()`` that
# started it (measured at 1 M memories: 6 to 60 ms with the default embedder, 1.8 ms
# without). ``open()`` takes about a millisecond, so a short wait lets it return first.
START_DELAY = 0.02  # seconds


class Background:
    """``target`` run once in a daemon thread of its own, started ``START_DELAY`` after it
    is asked for; the caller does not wait.

    ``threading.Thread.start`` returns only after the new thread has run and handed the
    GIL back (two wake-ups across cores, 0.2 to 1 ms each on a 2-core VM), and creating a
    thread costs 60 to 90 µs more. ``open()`` asks for up to three loaders (tiktoken, the
    preload, the embedding model), so one starter thread per process, made by the first
    request, starts them after the delay: the caller only queues them. A fresh process's
    open + 20 newest at 10 k: 1.37 ms with Thread.start, 1.01 ms so (default embedder).
    Whoever needs the result first runs ``target``: a ``join()`` before the thread has
    started runs it in the caller (a store closed at once does not wait out the delay).
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.name = name  # for a debugger: such a thread has no threading.Thread object
        self._target = target
        self._ident: int | None = None
        self._done = threading.Event()
        self._claim = threading.Lock()  # held by whichever runs target: starter or joiner
        self._pid = os.getpid()
        _starter().put(self)

    def _run(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._target()
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for ``target`` to return (or run it here, if its thread has not started);
        False on timeout. In a forked child, where the thread does not exist (as
        ``threading`` treats its threads there), at once."""
        if os.getpid() != self._pid:
            return True
        if self._claim.acquire(blocking=False):
            self._run()
            return True
        return self._done.wait(timeout)

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return self._ident == _thread.get_ident()


_starter_queue: tuple[int, queue.SimpleQueue[Background]] | None = None
_starter_lock = threading.Lock()


def _starter() -> queue.SimpleQueue[Background]:
    """This process's queue of threads to start (its starter is made by the first)."""
    global _starter_queue
    with _starter_lock:
        if _starter_queue is None or _starter_queue[0] != os.getpid():  # none, or forked since
            todo: queue.SimpleQueue[Background] = queue.SimpleQueue()
            _thread.start_new_thread(_start_loop, (todo,))
            _starter_queue = (os.getpid(), todo)
        return _starter_queue[1]


def _start_loop(todo: queue.SimpleQueue[Background]) -> None:
    while True:
        batch = [todo.get()]
        time.sleep(START_DELAY)  # the caller returns meanwhile
        while not todo.empty():  # what the same call asked for: started together
            batch.append(todo.get())
        for thread in batch:
            if thread._claim.acquire(blocking=False):  # not run by a join() meanwhile
                _thread.start_new_thread(thread._run, ())

"""Background loaders that do not hold up the call that started them."""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Callable

START_DELAY = 0.02  # seconds


def let_the_caller_return() -> None:
    """Wait a moment before loading in a background thread.

    Importing an extension (``dlopen``) and the Rust parsers of ``tokenizers`` and
    ``tiktoken`` hold the GIL for tens of milliseconds without a switch; a loader that
    starts at once stalls the ``open()`` that started it (measured at 1 M memories: 6 to
    60 ms with the default embedder, 1.8 ms without). ``open()`` takes about a millisecond,
    so a short sleep lets it return first.
    """
    time.sleep(START_DELAY)


class Background:
    """``target`` run once in a daemon thread that its starter does not wait for.

    ``threading.Thread.start`` returns only after the new thread has run and handed the
    GIL back: two wake-ups across cores, 0.2 to 1 ms each on a 2-core VM. ``open()``
    starts up to three loaders, which took a fresh process's restart (open + 20 newest)
    from 0.7 ms to 1.7–2 ms. ``_thread.start_new_thread`` returns once the thread exists.
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.name = name  # for a debugger: such a thread has no threading.Thread object
        self._target = target
        self._ident: int | None = None
        self._done = threading.Event()
        self._pid = os.getpid()
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._target()
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for ``target`` to return; False on timeout. In a forked child, where the
        thread does not exist (as ``threading`` treats its threads there), at once."""
        if os.getpid() != self._pid:
            return True
        return self._done.wait(timeout)

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return self._ident == _thread.get_ident()

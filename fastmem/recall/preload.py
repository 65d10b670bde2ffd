"""Level 2 of the context: the most important memories read into the engine's cache in the
background after a restart (:class:`Preload`), so the first contexts find them decoded."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .._threads import Background, Flag
from ..errors import FastmemError
from ..storage.engine import Engine
from ..storage.importance import importance_scores
from ..types import ContextPolicy
from .packing import level1_rows


class Preload:
    """Level 2: a background thread that reads the most important memories (their summaries
    and texts) into the engine's cache, a chunk at a time, taking the lock only per chunk
    so callers never wait long; stopped by ``stop()`` (the store's ``close()``).

    It works for later calls, so it gives way to the call being made: each step waits until
    callers have left the store alone for ``_QUIET`` seconds (at most ``_MAX_DEFER``, so a
    busy caller does not starve it). The first search after a restart would otherwise wait
    for the importance pass over every row (at 1 M rows, faulting in 80 MB of rows).
    """

    _QUIET = 0.05
    _MAX_DEFER = 0.5

    def __init__(self, engine: Engine, policy: ContextPolicy, last_call: Callable[[], float]) -> None:
        self.engine, self.policy, self.last_call = engine, policy, last_call
        self.done = 0
        self.total = 0
        self.finished = Flag()
        self._stopping = Flag()
        self._thread = Background(self._run, "fastmem-preload")

    def _run(self) -> None:
        engine, policy = self.engine, self.policy
        try:
            if not self._defer():
                return
            with engine.lock:
                if engine.closed:
                    return
                epoch = engine.epoch
                for g in level1_rows(engine.index, policy):  # level 1 first: loaded whole
                    engine.cached_memory(g)
                scores = importance_scores(engine.index, policy, time.time())
                k = min(policy.preload, int(np.count_nonzero(np.isfinite(scores))))
                top = np.argpartition(-scores, k - 1)[:k] if k else np.zeros(0, np.int64)
                top = top[np.lexsort((top, -scores[top]))].tolist()
            self.total = len(top)
            chunk = max(1, policy.preload_chunk)
            for start in range(0, len(top), chunk):
                if not self._defer():
                    return
                with engine.lock:
                    if engine.closed or engine.epoch != epoch:  # rows were numbered anew
                        return
                    for g in top[start : start + chunk]:
                        engine.cached_memory(g)
                self.done = min(start + chunk, len(top))
        except (FastmemError, OSError):
            pass  # a damaged record, a failing disk: the caller meets it when it reads that memory
        finally:
            self.finished.set()

    def _defer(self) -> bool:
        """Wait for a quiet moment (see the class); False once the preload is stopped."""
        deadline = time.monotonic() + self._MAX_DEFER
        while True:
            wait = min(self.last_call() + self._QUIET, deadline) - time.monotonic()
            if wait <= 0:
                return not self._stopping.is_set()
            if self._stopping.wait(wait):
                return False

    def stop(self) -> None:
        self._stopping.set()
        if not self._thread.is_current():
            self._thread.join()

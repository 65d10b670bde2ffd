"""The cache of decoded memories a store keeps (level 2 fills it; contexts read from it)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .types import Memory

ENTRY_OVERHEAD = 200  # bytes a cached memory costs beyond its text and summary


class ContentCache:
    """Decoded memories by row, least recently used first out, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[int, tuple[Memory, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, g: int) -> Memory | None:
        with self._lock:
            hit = self._items.get(g)
            if hit is None:
                return None
            self._items.move_to_end(g)
            return hit[0]

    def put(self, g: int, memory: Memory) -> None:
        size = len(memory.text) + len(memory.summary or "") + ENTRY_OVERHEAD
        with self._lock:
            old = self._items.pop(g, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[g] = (memory, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)

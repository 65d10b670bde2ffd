"""The index's tail: the rows added since the last checkpoint, in growable arrays.

A bulk load writes every row into the tail once. Memory touched for the first time is
what costs there: on a VM whose free memory goes back to the host (free page reporting,
as on this project's machines), the first write to a page idle for a few seconds costs
~2 s per GiB, against ~0.15 s for a page this process used a moment before (issue 21).
So the tail reserves its room once, and a checkpoint's successor takes over its arrays
(:meth:`Tail.take`) instead of filling fresh ones.
"""

from __future__ import annotations

import numpy as np

from .. import _format as fmt

__all__ = ["NO_ROWS", "Tail"]

NO_ROWS = np.zeros(0, dtype=fmt.INDEX_DTYPE)


class Tail:
    """Rows added since the last checkpoint, in arrays that double when full (or take the
    room they are told to reserve)."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.saved = 0  # the first rows, read from the index file's delta (views of its map)
        self.rows = NO_ROWS  # allocated by the first append: an open needs none
        self.dim = dim
        # Made at the first use: it was a restart's only numpy call, and numpy's first
        # call in a process costs ~15 µs (issue 21).
        self._vectors: np.ndarray | None = None

    @property
    def vectors(self) -> np.ndarray:
        if self._vectors is None:
            self._vectors = np.zeros((0, self.dim), dtype=np.int8)
        return self._vectors

    @vectors.setter
    def vectors(self, vectors: np.ndarray) -> None:
        self._vectors = vectors

    def append(self, rows: np.ndarray, vectors: np.ndarray, reserve: int = 0) -> None:
        self.stage(rows, vectors, reserve)
        self.n += len(rows)

    def stage(self, rows: np.ndarray, vectors: np.ndarray, reserve: int = 0) -> None:
        """Copy rows and their vectors past the tail's own rows, where nothing reads them
        (readers and a checkpoint's frozen copy see the first ``n``): ``publish`` makes
        them the tail's; an append that fails meanwhile leaves the tail as it was."""
        end = self.n + len(rows)
        self._hold(end, reserve)
        self.rows[self.n : end] = rows
        self.vectors[self.n : end] = vectors

    def room(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The tail's room for ``count`` rows past its own (grown to hold them): views of
        its rows and int8 vectors there, for a kernel to write the rows into in place of
        :meth:`stage`'s copies (the replay of another process's records: its rows are
        decoded and quantized straight into the tail); ``publish`` makes them the tail's."""
        end = self.n + count
        self._hold(end, 0)
        return self.rows[self.n : end], self.vectors[self.n : end]

    def _hold(self, end: int, reserve: int) -> None:
        """Grow the arrays (if they must) to hold ``end`` rows, or ``reserve``."""
        if end > len(self.rows):
            cap = max(end, 2 * len(self.rows), 64, reserve)
            grown = np.zeros(cap, dtype=fmt.INDEX_DTYPE)
            grown[: self.n] = self.rows[: self.n]
            self.rows = grown
            gv = np.zeros((cap, self.vectors.shape[1]), dtype=np.int8)
            gv[: self.n] = self.vectors[: self.n]
            self.vectors = gv

    def publish(self, count: int) -> None:
        """The ``count`` rows staged last are the tail's now."""
        self.n += count

    def take(self, other: Tail, first: int) -> None:
        """Continue an empty tail with ``other``'s rows from ``first`` on, moved to the front
        of ``other``'s own arrays (pages already written: see the module), which this tail
        owns from now on; ``other`` must not be used after."""
        if self.n or other.saved or self.dim != other.dim:
            raise ValueError("Tail.take continues an empty tail of the same dimension")
        m = other.n - first
        rows, vectors = other.rows, other.vectors
        rows[:m] = rows[first : other.n]  # numpy copies through a buffer where they overlap
        vectors[:m] = vectors[first : other.n]
        self.rows, self.vectors, self.n = rows, vectors, m

    def set_dim(self, dim: int) -> None:
        """Called once, when the first vector fixes the dimension (no row has one yet)."""
        self.dim = dim
        self.vectors = np.zeros((len(self.rows), dim), dtype=np.int8)

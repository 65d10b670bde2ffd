"""The index's tail (fastmem.storage.index_tail): growth, and a checkpoint's successor taking its arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem.storage.index_tail import Tail

DIM = 4


def _rows(first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
    rows["id"] = np.arange(first, first + n)
    vectors = (np.arange(first, first + n)[:, None] + np.arange(DIM)).astype(np.int8)
    return rows, vectors


def _filled(n: int, reserve: int = 0) -> Tail:
    tail = Tail(DIM)
    rows, vectors = _rows(0, n)
    tail.append(rows, vectors, reserve)
    return tail


@given(n=st.integers(0, 300), data=st.data())
def test_take_moves_the_rows_from_first_on_to_the_front_of_the_same_arrays(n, data):
    first = data.draw(st.integers(0, n))  # first > n - first: the ranges overlap
    old = _filled(n, reserve=512)
    rows, vectors = old.rows, old.vectors
    expected_rows, expected_vectors = rows[first:n].copy(), vectors[first:n].copy()
    new = Tail(DIM)
    new.take(old, first)
    assert new.n == n - first
    assert new.rows is rows and new.vectors is vectors
    assert np.array_equal(new.rows[: new.n], expected_rows)
    assert np.array_equal(new.vectors[: new.n], expected_vectors)


def test_appends_after_take_continue_in_the_arrays_taken():
    old = _filled(300, reserve=512)
    rows = old.rows
    new = Tail(DIM)
    new.take(old, 200)
    more, more_vectors = _rows(300, 100)
    new.append(more, more_vectors)
    assert new.rows is rows  # room was left: nothing allocated
    assert new.rows["id"][: new.n].tolist() == list(range(200, 400))
    assert np.array_equal(new.vectors[: new.n], _rows(200, 200)[1])
    grown, grown_vectors = _rows(400, 500)  # past the room: the arrays grow, rows kept
    new.append(grown, grown_vectors)
    assert new.rows["id"][: new.n].tolist() == list(range(200, 900))


def test_take_refuses_a_tail_that_holds_rows_or_another_dimension():
    with pytest.raises(ValueError):
        _filled(10).take(_filled(20), 5)
    with pytest.raises(ValueError):
        Tail(DIM + 1).take(_filled(20), 5)


def test_staged_rows_are_not_the_tails_until_published():
    tail = _filled(10)
    rows, vectors = _rows(10, 5)
    tail.stage(rows, vectors)
    assert tail.n == 10  # unread: a reader and a frozen copy see the first n rows
    again, _ = _rows(10, 3)  # a failed append's staging is overwritten by the next
    tail.append(again, vectors[:3])
    assert tail.n == 13 and list(tail.rows["id"][:13]) == list(range(13))
    tail.stage(*_rows(13, 300))  # grows the arrays, rows kept
    tail.publish(300)
    assert tail.n == 313 and list(tail.rows["id"][:313]) == list(range(313))
    assert (tail.vectors[:313] == _rows(0, 313)[1]).all()

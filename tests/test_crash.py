"""SIGKILL at random moments of a writer under ``durability="always"``: during appends,
batches, updates, forgets, evictions, index checkpoints and compactions (see
``tests/crash_harness.py``). After every kill the store opens, ``verify()`` is clean, every
acknowledged memory is there byte for byte, and nothing garbled is ever returned.
Several writer processes and a compaction loop on one store, killed one by one: the same,
and no memory twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import crash_harness  # noqa: E402

KILLS = 200
ROUNDS = 8  # of 4 writers and a compaction loop: 40 kills


@pytest.mark.slow
def test_sigkill_anywhere_loses_nothing_acknowledged(tmp_path: Path, backend: str) -> None:
    if backend != "cython" and "cython" in _backends():
        pytest.skip("the writers run in other processes with the default backend: one run is enough")
    model = crash_harness.run_kills(str(tmp_path / "killed"), KILLS, seed=7)
    assert model.errors == []
    assert (model.lost, model.garbled, model.unclean) == (0, 0, 0)
    assert model.kills == KILLS
    assert model.acked > KILLS, "the writers acknowledged too little to test anything"
    # The kills landed in every kind of step, maintenance included.
    for phase in ("add", "checkpoint", "compact", "evict"):
        assert model.phases[phase] > 0, model.phases


@pytest.mark.slow
def test_sigkill_among_several_writers_loses_nothing_and_doubles_nothing(tmp_path: Path, backend: str) -> None:
    if backend != "cython" and "cython" in _backends():
        pytest.skip("the writers run in other processes with the default backend: one run is enough")
    model = crash_harness.run_rounds(str(tmp_path / "shared"), ROUNDS, writers=4, seed=11)
    assert model.errors == []
    assert (model.lost, model.duplicates, model.garbled, model.unclean) == (0, 0, 0, 0)
    assert model.kills == ROUNDS * 5
    assert model.acked > ROUNDS * 4, "the writers acknowledged too little to test anything"
    assert model.phases["compact"] > 0, model.phases  # the compaction loop was killed at work


def test_the_checker_counts_a_memory_there_twice(tmp_path: Path) -> None:
    """The duplicate check is worth something only if it fires: a memory acknowledged once
    and then added again under another id is counted."""
    import fastmem

    path = str(tmp_path / "twice")
    text = crash_harness._text(1, 1, __import__("random").Random(1))
    with fastmem.open(path, dim=4, embedder=None) as store:
        mid = store.add(text, metadata={"i": 1}, session="s", embedding=[1.0, 0, 0, 0])
        store.add(text, metadata={"i": 1}, session="s", embedding=[1.0, 0, 0, 0])
    model = crash_harness.Model()
    model.memories[mid] = (crash_harness.digest(text), {"i": 1}, "s")
    model.in_flight.add(crash_harness.digest(text))
    model.check(path)
    assert model.duplicates == 1 and model.lost == 0


def _backends() -> list[str]:
    from conftest import BACKENDS

    return BACKENDS

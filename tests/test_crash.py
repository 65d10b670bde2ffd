"""SIGKILL at random moments of a writer under ``durability="always"``: during appends,
batches, updates, forgets, evictions, index checkpoints and compactions (see
``tests/crash_harness.py``). After every kill the store opens, ``verify()`` is clean, every
acknowledged memory is there byte for byte, and nothing garbled is ever returned."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import crash_harness  # noqa: E402

KILLS = 200


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


def _backends() -> list[str]:
    from conftest import BACKENDS

    return BACKENDS

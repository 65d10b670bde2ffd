"""Which index a handle that opens without the lock reads while compaction files exist.

Only a lone ``.idx.compact`` (its data file renamed into place, the index not yet: the
moment between a compaction's renames, or for ever after the compacting process was killed
there) means the index under the store's name may be the old data file's: then the handle
builds its index from the data file. While a compaction is still writing its files, or
after one was killed before its commit, ``.dat.compact`` is there too and the index under
the name is the data file's: it is loaded, not rebuilt by a full replay of the data file.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from test_erase_stale import compaction_killed_in_another_process

import fastmem
from fastmem.storage import maintenance as _maintenance

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip


def _store(path: str) -> list[str]:
    with fastmem.open(path, **QUIET) as store:
        ids = store.add_many([{"text": f"memory {i} " + "filler " * 10} for i in range(40)])
        for mid in ids[30:]:
            store.forget(mid)
    return ids[:30]


def test_a_reader_opening_during_a_compaction_loads_the_index(store_path: str, monkeypatch) -> None:
    ids = _store(store_path)
    real_commit = _maintenance._commit
    opened: list[Any] = []

    def commit(engine: Any, *args: Any) -> Any:
        assert os.path.exists(store_path + ".dat.compact")
        assert os.path.exists(store_path + ".idx.compact")
        reader = fastmem.open(store_path, readonly=True, **QUIET)
        opened.append((reader._engine.index.file is not None, [m.id for m in reader]))
        reader.close()
        return real_commit(engine, *args)

    monkeypatch.setattr(_maintenance, "_commit", commit)
    with fastmem.open(store_path, **QUIET) as writer:
        writer.compact()
    assert opened == [(True, ids)]


def test_a_reader_after_a_compaction_killed_before_commit_loads_the_index(store_path: str) -> None:
    ids = _store(store_path)
    compaction_killed_in_another_process(store_path, at=".dat")
    assert os.path.exists(store_path + ".dat.compact")
    with fastmem.open(store_path, readonly=True, **QUIET) as reader:
        assert reader._engine.index.file is not None  # loaded, not rebuilt
        assert [m.id for m in reader] == ids and reader.verify().ok


@pytest.fixture(autouse=True)
def backend() -> str:
    """Files and processes, the same under both kernel backends: one run."""
    return fastmem.BACKEND

"""An erase cut short by a killed process is finished by a writer whose bulk load has a
checkpoint being written by a thread (fastmem.storage.checkpoint), whether the thread publishes its
file before the erase or after it.

The redo owed (``MemoryIndex.erase_pending``) is noted by the replay of the killed process's
forget record. A handle never replays while its checkpoint thread runs (it waits for the
thread first, ``Engine.check``), so the index that ``Background.adopt`` replaces never holds a
redo owed: the replay after it notes the redo on the new index, and the next write does it.
A thread's file made after such a forget record is never published (``_still_right``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from test_stats_processes import backend, small_limit  # noqa: F401 - fixtures: one run, a small tail

import fastmem
from fastmem.storage import index as _index

SECRET = "Ada lives at 12 Quillfeather Lane"

# A writer of its own that forgets (erases) ``argv[2]``, and is SIGKILLed once the forget
# record is durable, before any byte of the memory's records is overwritten.
_KILLED_ERASER = textwrap.dedent(
    """
    import os, signal, sys
    import fastmem
    from fastmem.storage import erase as _erase
    store = fastmem.open(sys.argv[1], embedder=None)
    _erase._redo_on = lambda engine, pending: os.kill(os.getpid(), signal.SIGKILL)
    store.forget(sys.argv[2])
    """
)


def _kill_an_eraser(path: str, mid: str) -> None:
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    args = [sys.executable, "-c", _KILLED_ERASER, path, mid]
    assert subprocess.run(args, check=False, env=env, timeout=120).returncode == -signal.SIGKILL


def _found(folder: Path) -> list[str]:
    return [f.name for f in folder.iterdir() if SECRET.encode() in f.read_bytes()]


@pytest.mark.parametrize("published", ["before", "after"])
def test_a_killed_erase_is_finished_beside_a_checkpoint_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, published: str
) -> None:
    path = str(tmp_path / "agent")
    with fastmem.open(path, embedder=None) as store:
        store.add_many([{"text": f"memory {i}"} for i in range(20)])
        secret = store.add(SECRET)
        store.checkpoint()  # the index file holds it too (its row and hot section)
    assert _found(tmp_path)
    gate = threading.Event()
    real_save = _index.MemoryIndex.save

    def gated(self: _index.MemoryIndex, *args: object, **kwargs: object) -> object:
        if threading.current_thread().name == "fastmem-checkpoint":
            assert gate.wait(60)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(_index.MemoryIndex, "save", gated)
    loader = fastmem.open(path, embedder=None)
    try:
        loader.add_many([{"text": f"bulk {i}"} for i in range(600)])
        background = loader._engine._background
        assert background is not None and not background.done()
        if published == "before":
            gate.set()
            background.wait()
            assert background._written is not None  # published, not adopted yet
        _kill_an_eraser(path, secret)
        gate.set()
        background.wait()
        assert (background._written is not None) == (published == "before")  # after: discarded
        assert _found(tmp_path)  # the forget record is there; the erase is not done
        loader.add("one more")  # a write: the redo owed, done
        assert SECRET.encode() not in Path(path + ".dat").read_bytes()
        with pytest.raises(fastmem.UnknownMemoryError):
            loader.get(secret)
    finally:
        gate.set()
        loader.close()
    assert _found(tmp_path) == []
    with fastmem.open(path, embedder=None, readonly=True) as reader:
        assert len(reader) == 621 and reader.verify().ok

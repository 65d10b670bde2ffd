"""A handle following another's compaction, at the worst moments of the swap.

A compaction commits by renaming ``.dat.compact`` over ``.dat``, then ``.idx.compact`` over
``.idx``. A handle that meets the new data file between the two renames finds the old index
under ``.idx`` (stale for the new file) and looks for ``.idx.compact``; if the second rename
comes in between, neither name holds the index it tried, though ``.idx`` now holds the right
one. Each test here stops the follower at one such point (a hook in the same process stands
for the other process) and checks it follows without rebuilding anything: no
``RecoveryWarning``, the compacted contents, ``verify()`` clean.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import fastmem
from fastmem.storage import index as _index

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip


@pytest.mark.parametrize("readonly", [True, False])
def test_a_follower_between_the_renames_builds_its_index_from_the_new_data_file(
    store_path: str, monkeypatch: pytest.MonkeyPatch, readonly: bool
) -> None:
    """Between a compaction's renames of the data file and of the index, the index under the
    store's name is the old file's (its check can pass when the compaction only reordered
    records): a follower that meets the swap then never reads it, builds its index from the
    new data file (no warning: nothing is damaged) and finds the memories where they are."""
    idx_path, pending = store_path + ".idx", store_path + ".idx.compact"
    writer = fastmem.open(store_path, **QUIET)
    ids = writer.add_many([{"text": f"memory {i} " + "filler " * 20} for i in range(60)])
    for mid in ids[10:]:
        writer.forget(mid)
    writer.checkpoint()  # the old index covers the old file: stale for the new one
    follower = fastmem.open(store_path, readonly=readonly, **QUIET)
    assert len(follower) == 10
    real_replace, real_load = os.replace, _index.MemoryIndex.load.__func__
    state: dict[str, Any] = {"between": False, "met": None, "loaded": []}

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_replace(src, dst, *args, **kwargs)
        if src == store_path + ".dat.compact":  # the commit point; the index not renamed yet
            state["between"] = True
            try:
                state["met"] = [(m.id, m.text) for m in follower]  # it meets the swap now
            finally:
                state["between"] = False

    def load(cls: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        if state["between"]:
            state["loaded"].append(path)
        return real_load(cls, path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(_index.MemoryIndex, "load", classmethod(load))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            writer.compact()
        monkeypatch.undo()
        assert state["met"] == [(mid, writer.get(mid).text) for mid in ids[:10]]
        assert idx_path not in state["loaded"]
        assert [str(w.message) for w in caught if issubclass(w.category, fastmem.RecoveryWarning)] == []
        assert [m.id for m in follower] == ids[:10]
        assert follower.verify().ok and writer.verify().ok
        assert not os.path.exists(pending)
    finally:
        monkeypatch.undo()
        follower.close()
        writer.close()


def test_a_follower_maps_a_file_cut_back_and_grown_again_meanwhile(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw "mmap length is greater than file size": a follower took the data file's size
    with a torn append in it; before its map, a writer cut the torn bytes (the file shorter
    than that size: mmap refuses it) and appended a longer record (the file longer again by
    the time the follower looks at why). It maps the file as it is now."""
    dat_path = store_path + ".dat"
    from fastmem.storage import handle_state as _state

    # mmap's own size check, which refuses the map: the map with room past the file's end
    # checks the size itself (tests/test_data_map.py meets the same race there).
    monkeypatch.setattr(_state, "DataMap", None)
    writer = fastmem.open(store_path, **QUIET)
    writer.add("one")
    follower = fastmem.open(store_path, readonly=True, **QUIET)
    assert len(follower) == 1
    acknowledged = os.path.getsize(dat_path)
    with open(dat_path, "ab") as f:
        f.write(b"\x00" * 40)  # a killed writer's torn append
    from fastmem.storage import fileio as _io

    real_mmap = _io.mmap.mmap
    armed = [True]

    class Proxy:
        ACCESS_READ, ACCESS_COPY = _io.mmap.ACCESS_READ, _io.mmap.ACCESS_COPY

        @staticmethod
        def mmap(fd: int, size: int, **kwargs: Any) -> Any:
            if not (armed and size == acknowledged + 40):
                return real_mmap(fd, size, **kwargs)
            armed.clear()
            os.truncate(dat_path, acknowledged)  # the writer cuts the torn bytes...
            try:
                return real_mmap(fd, size, **kwargs)
            finally:  # ...and appends a record longer than them, before the follower looks
                writer.add("two, a record longer than the torn bytes it replaced")

    monkeypatch.setattr(_io, "mmap", Proxy)
    try:
        n = len(follower)
        monkeypatch.undo()
        assert not armed
        assert n in (1, 2) and len(follower) == 2
        assert [m.text for m in follower][-1].startswith("two")
        assert follower.verify().ok
    finally:
        monkeypatch.undo()
        follower.close()
        writer.close()


def _deleted_files_open(prefix: str) -> list[str]:
    """This process's descriptors of files under ``prefix`` that no name links to any more."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith(" (deleted)"):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd (Linux)")
def test_a_follower_replaced_again_and_again_before_its_map_keeps_no_old_file_open(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each time the follower opens the store's data file, another compaction replaces it
    before the follower maps it (three times): it follows to the newest file and keeps none
    of the replaced ones open (a descriptor of one keeps its disk space in use)."""
    dat_path = store_path + ".dat"
    writer = fastmem.open(store_path, **QUIET)
    ids = writer.add_many([{"text": f"memory {i} " + "filler " * 20} for i in range(60)])
    follower = fastmem.open(store_path, readonly=True, **QUIET)
    assert len(follower) == 60
    writer.compact()  # the follower meets the swap at its next call
    real_open = os.open
    left = [ids[40:], ids[30:40], ids[20:30]]  # what each compaction in its way drops
    busy = []  # the writer's own opens during its compaction are not the follower's

    def open_(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(file, flags, *args, **kwargs)
        if left and not busy and file == dat_path and flags == os.O_RDONLY:
            busy.append(1)
            try:
                for mid in left.pop(0):
                    writer.forget(mid)
                writer.compact()  # replaced again before the follower maps what it opened
            finally:
                busy.clear()
        return fd

    monkeypatch.setattr(os, "open", open_)
    try:
        assert len(follower) == 20
    finally:
        monkeypatch.undo()
    try:
        assert not left
        assert [m.id for m in follower] == ids[:20] and follower.verify().ok
        import time

        deadline = time.monotonic() + 10  # the release thread closes the replaced files
        while (leaked := _deleted_files_open(store_path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not leaked
    finally:
        follower.close()
        writer.close()

"""``forget`` erases: after the call the memory's text, summary, metadata and vector are in
no file of the store (the records are overwritten in place, the index rewritten when it
held them), nor in a backup taken after it; a process killed in the middle of an erase
leaves a store whose next writer finishes it. ``erase=False`` keeps the cheap tombstone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt
from fastmem.storage.index import F_ID, F_LENGTH, F_OFFSET

DIM = 32
SECRET = "Ada lives at 12 Quillfeather Lane"
SUMMARY = "quillfeather summary"
META = "quillfeather-meta-value"
OLD_META = "quillfeather-older-meta"


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _term(word: str) -> bytes:
    """The keyword index's hash of ``word``, as the index stores it (u64, little-endian)."""
    from fastmem.storage.keyword_index import tokenize

    return tokenize([word])[0].astype("<u8").tobytes()


def _traces(v: np.ndarray) -> list[bytes]:
    """Byte patterns the memory leaves: its strings, its float16 and int8 vectors, and the
    keyword index's hash of its rarest word."""
    f16 = v.astype("<f2")
    scale = np.float32(np.abs(f16.astype(np.float32)).max()) / np.float32(127)
    q8 = np.rint(f16.astype(np.float32) / scale).astype(np.int8)
    return [SECRET.encode(), b"Quillfeather", SUMMARY.encode(), META.encode(),
            OLD_META.encode(), f16.tobytes()[:24], q8.tobytes()[:24],
            _term("quillfeather")]  # fmt: skip


def _found(folder: Path, patterns: list[bytes]) -> list[tuple[str, bytes]]:
    """Every (file, pattern) of ``patterns`` in any file under ``folder``."""
    hits = []
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            hits += [(f.name, p) for p in patterns if p in data]
    return hits


def _fill(store: fastmem.MemoryStore, n: int = 40, seed: int = 100) -> list[str]:
    return store.add_many(
        [{"text": f"other memory {i}", "embedding": _vector(seed + i)} for i in range(n)]
    )


def _add_secret(store: fastmem.MemoryStore) -> str:
    mid = store.add(SECRET, summary=SUMMARY, metadata={"where": OLD_META}, embedding=_vector(1),
                    session="s1", type="fact")  # fmt: skip
    store.update(mid, importance=0.8)
    store.update(mid, metadata={"where": META})  # an update record holds metadata too
    return mid


def _open(path: Path, **kw) -> fastmem.MemoryStore:
    return fastmem.open(path / "agent", embedder=None, summarizer=None, **kw)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_forget_leaves_no_trace_in_the_files(tmp_path: Path, checkpointed: bool) -> None:
    with _open(tmp_path) as store:
        others = _fill(store)
        mid = _add_secret(store)
        _fill(store, 5, seed=300)
        if checkpointed:  # the index's rows, vectors and hot section hold it too
            store.checkpoint()
            assert _found(tmp_path, _traces(_vector(1)))
        store.forget(mid)
        assert _found(tmp_path, _traces(_vector(1))) == []
        with pytest.raises(fastmem.UnknownMemoryError):
            store.get(mid)
        assert store.verify().ok, store.verify().problems
        assert [h.memory.text for h in store.search(_vector(100), k=1)] == ["other memory 0"]
        assert len(store) == 45
    assert _found(tmp_path, _traces(_vector(1))) == []
    with _open(tmp_path) as store:
        assert store.verify().ok
        assert len(store) == 45 and store.get(others[3]).text == "other memory 3"
        new = store.add("after", embedding=_vector(7))
        assert int(new[1:]) > int(mid[1:])  # the erased id is never given again
        store.compact()
        assert store.verify().ok and len(store) == 46


def test_forget_erase_false_keeps_the_tombstone_only(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        _fill(store)
        mid = _add_secret(store)
        store.forget(mid, erase=False)
        with pytest.raises(fastmem.UnknownMemoryError):
            store.get(mid)
        assert _found(tmp_path, [SECRET.encode()])
        assert store.verify().ok


def test_evict_erases(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        _fill(store)
        mid = _add_secret(store)
        store.checkpoint()
        assert store.evict(ttl={"fact": 0.0}, now=2e9) == [mid]
        assert _found(tmp_path, _traces(_vector(1))) == []
        assert store.verify().ok


@pytest.mark.parametrize("checkpointed", [False, True])
def test_forget_many_erases_them_all_in_one_pass(tmp_path: Path, checkpointed: bool) -> None:
    with _open(tmp_path) as store:
        others = _fill(store)
        mid = _add_secret(store)
        twins = [store.add(f"{SECRET} twin {i}", embedding=_vector(50 + i)) for i in range(3)]
        if checkpointed:
            store.checkpoint()
        store.forget_many([mid, *twins, mid])  # a repeated id is forgotten once
        assert _found(tmp_path, _traces(_vector(1)) + [b"twin"]) == []
        assert len(store) == 40 and store.verify().ok
        for gone in (mid, *twins):
            with pytest.raises(fastmem.UnknownMemoryError):
                store.get(gone)
        store.forget_many([])  # nothing to do
        assert store.get(others[0]).text == "other memory 0"


def test_forget_many_checks_every_id_before_it_writes(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        ids = _fill(store, 5)
        size = os.path.getsize(tmp_path / "agent.dat")
        with pytest.raises(fastmem.UnknownMemoryError):
            store.forget_many([ids[0], "m999"])
        with pytest.raises(fastmem.InvalidTypeError):
            store.forget_many(ids[0])  # one id as a string: its letters are not ids
        with pytest.raises(fastmem.InvalidTypeError):
            store.forget_many(ids, erase="yes")  # type: ignore[arg-type]
        assert os.path.getsize(tmp_path / "agent.dat") == size and len(store) == 5
        store.forget_many(ids[:2], erase=False)  # tombstones only: the bytes stay
        assert len(store) == 3 and _found(tmp_path, [b"other memory 1"])


def test_a_backup_after_forget_holds_no_trace(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        _fill(store)
        mid = _add_secret(store)
        store.checkpoint()
        store.forget(mid)
        report = store.backup(tmp_path / "copy" / "agent")
        assert report.memories == 40
    assert _found(tmp_path / "copy", _traces(_vector(1))) == []
    with fastmem.open(tmp_path / "copy" / "agent", embedder=None) as copy:
        assert copy.verify().ok and len(copy) == 40


def test_another_handle_forgets_nothing_back(tmp_path: Path) -> None:
    """A second handle (as another process) had the memory's vector in its index: after it
    applies the forget, its checkpoints write none of it back."""
    with _open(tmp_path) as a, _open(tmp_path) as b:
        _fill(a)
        mid = _add_secret(a)
        a.checkpoint()
        assert b.get(mid).text == SECRET  # b maps the index that holds it
        a.forget(mid)
        with pytest.raises(fastmem.UnknownMemoryError):
            b.get(mid)
        b.add("from b", embedding=_vector(9))
        assert b.verify().ok, b.verify().problems
        b.checkpoint()
        assert _found(tmp_path, _traces(_vector(1))) == []
        a.add("from a", embedding=_vector(10))
        a.checkpoint()
        assert _found(tmp_path, _traces(_vector(1))) == []
        assert a.verify().ok and b.verify().ok


def test_a_reader_that_meets_an_erased_record_finds_the_memory_forgotten(tmp_path: Path) -> None:
    """A handle that looked at the row just before another process erased the record reads
    the erased record: the memory is forgotten, not damaged and not empty."""
    with _open(tmp_path) as a, _open(tmp_path) as b:
        _fill(a)
        mid = _add_secret(a)
        engine = b._engine
        assert b.get(mid).text == SECRET
        row = engine.live_row(mid)[1]
        a.forget(mid)
        with pytest.raises(fastmem.UnknownMemoryError):
            engine.decode(row, engine.data(), row[F_OFFSET], engine.dat_end)


@pytest.mark.parametrize("read", ["get", "recent", "search"])
def test_a_reader_that_meets_a_half_erased_record_finds_the_memory_forgotten(
    tmp_path: Path, read: str
) -> None:
    """A handle reading a record while another process's erase is halfway through it (the
    forget record already written, the record's bytes half old, half new: its checksum
    fails) finds the memory forgotten, not the store damaged."""
    with _open(tmp_path) as a, _open(tmp_path) as b:
        _fill(a)
        mid = _add_secret(a)
        a.checkpoint()
        row = a._engine.live_row(mid)[1]
        offset, length = int(row[F_OFFSET]), int(row[F_LENGTH])
        engine, check, erasing = b._engine, b._engine.check, []

        def check_then_erase(*args: object, **kwargs: object) -> None:  # the erase lands
            check(*args, **kwargs)  # between b's look and its read
            if not erasing:
                erasing.append(mid)
                a.forget(mid, erase=False)  # the forget record: written before any erase
                with open(tmp_path / "agent.dat", "r+b") as f:
                    f.seek(offset + length // 2)
                    f.write(b"\0" * (length - length // 2))

        engine.check = check_then_erase
        if read == "get":
            with pytest.raises(fastmem.UnknownMemoryError):
                b.get(mid)
        elif read == "recent":
            assert mid not in [m.id for m in b.recent(100)]
        else:
            assert mid not in [h.memory.id for h in b.search("Quillfeather Lane", k=50, mode="keyword")]
        assert erasing == [mid]


def test_a_pending_erase_never_writes_over_records_it_does_not_own(tmp_path: Path) -> None:
    """The redo of an erase (a killed eraser's forget, replayed) overwrites only its own
    memory's record: given a span that names another memory's record, or no record's start
    (a span of another data file), it writes nothing; its own damaged record it erases."""
    from fastmem.storage import erase as _erase

    with _open(tmp_path) as store:
        ids = _fill(store, 3)
        rows = [store._engine.live_row(mid)[1] for mid in ids]
        dat = tmp_path / "agent.dat"
        before = dat.read_bytes()
        own, other = (int(r[F_ID]) for r in rows[:2])
        spans = {
            "another memory's record": [int(rows[1][F_OFFSET]), int(rows[1][F_LENGTH])],
            "inside a record": [int(rows[1][F_OFFSET]) + 8, int(rows[1][F_LENGTH])],
            "across two records": [int(rows[0][F_OFFSET]) + 30, int(rows[0][F_LENGTH])],
            "the start of a longer record": [int(rows[1][F_OFFSET]), int(rows[1][F_LENGTH]) - 9],
        }
        fd = os.open(dat, os.O_RDWR | os.O_APPEND)
        try:
            for why, span in spans.items():
                assert not _erase.redo(fd, [(own, 1.0, None, span, 0)]), why
                assert dat.read_bytes() == before, why
            with open(dat, "r+b") as f:  # its own record, half overwritten (a killed eraser)
                f.seek(int(rows[0][F_OFFSET]) + 40)
                f.write(b"\xff" * 8)
            span = [int(rows[0][F_OFFSET]), int(rows[0][F_LENGTH])]
            assert _erase.redo(fd, [(own, 1.0, None, span, 0)])
        finally:
            os.close(fd)
        after = dat.read_bytes()
        assert fmt.is_erased(after, span[0], span[1], own)
        start, end = int(rows[1][F_OFFSET]), int(rows[2][F_OFFSET]) + int(rows[2][F_LENGTH])
        assert after[start:end] == before[start:end]  # the others' records: as they were
        assert other != own


# A process that stops in the middle of an erase: ``os.pwrite`` (the erase's in-place write)
# writes part of its bytes, or none, then the process waits to be killed.
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    import fastmem, test_erase as t
    with t._open(__import__("pathlib").Path({folder!r}), durability="always") as store:
        t._fill(store)
        mid = t._add_secret(store)
        if {later}:
            t._fill(store, 5, seed=300)
        store.checkpoint()
        real, calls = os.pwrite, []
        def torn(fd, data, offset):
            calls.append(offset)
            if len(calls) < {call}:
                return real(fd, data, offset)
            part = {part}
            if part:
                real(fd, bytes(data)[:part], offset)
            print("ERASING", flush=True)
            time.sleep(60)
        os.pwrite = torn
        store.forget(mid)
    """
)


@pytest.mark.parametrize(("call", "part", "later"), [
    (1, 0, True), (1, 12, True), (1, 40, True), (1, 150, True), (2, 30, True), (3, 50, True),
    (1, 40, False), (3, 0, False),
])  # fmt: skip
def test_sigkill_in_the_middle_of_an_erase(
    tmp_path: Path, call: int, part: int, later: bool
) -> None:
    """Killed before its first overwrite, inside one (of the memory record, of an update
    record holding metadata), between two, or while the index is rewritten (the 3rd
    pwrite); ``later``: memories were added after it (else its update record is the last
    one the index file covers: erased, its checksum changes)."""
    folder = tmp_path / "s"
    code = _CHILD.format(tests=str(Path(__file__).parent), folder=str(folder), part=part, call=call,
                         later=later)  # fmt: skip
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ERASING", "the child never reached the erase"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = _open(folder)
    with store:
        with pytest.raises(fastmem.UnknownMemoryError):
            store.get("m40")
        assert len(store) == (45 if later else 40)
        assert store.verify().ok, store.verify().problems
        assert _found(folder, _traces(_vector(1))) == []
        store.backup(tmp_path / "copy" / "agent")
    assert _found(tmp_path / "copy", _traces(_vector(1))) == []


def test_forget_during_a_compaction_is_erased_from_the_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction copies the records while the forget runs: the erase follows it."""
    from fastmem.storage import maintenance as _maintenance

    real = _maintenance._new_store
    with _open(tmp_path) as store:
        _fill(store)
        mid = _add_secret(store)
        store.checkpoint()

        def forget_meanwhile(engine, *args):  # type: ignore[no-untyped-def]
            store.forget(mid)  # the snapshot is taken, the records not copied yet
            return real(engine, *args)

        monkeypatch.setattr(_maintenance, "_new_store", forget_meanwhile)
        store.compact()
        assert _found(tmp_path, _traces(_vector(1))) == []
        assert store.verify().ok and len(store) == 40
    with _open(tmp_path) as store:
        assert store.verify().ok and len(store) == 40


def test_a_backup_finishes_an_erase_its_copy_missed(tmp_path: Path) -> None:
    """The backup copies without the writer lock: it may copy a record before an erase
    overwrites it, and the forget record after. The copy is erased all the same."""
    with _open(tmp_path) as store:
        _fill(store)
        mid = _add_secret(store)
        store.flush()
        row = store._engine.live_row(mid)[1]
        offset, length = row[F_OFFSET], row[F_LENGTH]
        with open(tmp_path / "agent.dat", "rb") as f:
            f.seek(offset)
            original = f.read(length)
        store.forget(mid)
        with open(tmp_path / "agent.dat", "r+b") as f:  # what a copy made just before sees
            f.seek(offset)
            f.write(original)
        store.backup(tmp_path / "copy" / "agent")
    assert _found(tmp_path / "copy", [SECRET.encode()]) == []
    with fastmem.open(tmp_path / "copy" / "agent", embedder=None) as copy:
        assert copy.verify().ok and len(copy) == 40


def test_the_mcp_servers_forget_tool_erases(tmp_path: Path) -> None:
    """Through a real MCP server process: its ``forget`` tool is ``forget``."""
    pytest.importorskip("mcp")
    import test_mcp

    async def work(session):  # type: ignore[no-untyped-def]
        made = test_mcp._payload(await session.call_tool("remember", {"text": SECRET}))
        await session.call_tool("remember", {"text": "another memory"})
        assert _found(tmp_path, [SECRET.encode()])
        done = await session.call_tool("forget", {"id": made["id"]})
        assert not test_mcp._is_error(done), done
        return _found(tmp_path, [SECRET.encode()])

    assert test_mcp.run(str(tmp_path / "mem"), work) == []


def test_the_hermes_providers_forget_tool_erases(tmp_path: Path) -> None:
    """Through the Hermes provider (its writer thread writes): nothing of the memory is
    left in the store's files, nor in the provider's own files under the Hermes home."""
    import json

    from fastmem.integrations.hermes import FastmemProvider

    home = tmp_path / "hermes"
    provider = FastmemProvider()
    provider.initialize("s1", hermes_home=str(home), platform="cli")
    try:
        made = json.loads(provider.handle_tool_call("fastmem_remember", {"text": SECRET}))
        provider.handle_tool_call("fastmem_remember", {"text": "another memory"})
        assert provider.flush(60)
        assert _found(home, [SECRET.encode()])  # written: the check below can fail
        reply = json.loads(provider.handle_tool_call("fastmem_forget", {"id": made["id"]}))
        assert reply.get("ok") or "forgotten" in json.dumps(reply), reply
        assert _found(home, [SECRET.encode()]) == []
    finally:
        provider.shutdown()
    assert _found(home, [SECRET.encode()]) == []

"""MemoryStore: the public API, its validation, durability modes, locking and readers."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem.storage import index as _index, records as _items
from fastmem._kernels import reference as _kernels_py


def unit(rng, n, dim=16):
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def snapshot(store):
    return [(m.id, m.text, m.type, m.timestamp, m.session, m.importance, m.pinned, m.metadata, m.summary)
            for m in store]  # fmt: skip


def test_open_makes_exactly_two_files(tmp_path):
    with fastmem.open(tmp_path / "sub" / "agent_memory") as store:
        store.add("hello")
    assert sorted(os.listdir(tmp_path / "sub")) == ["agent_memory.dat", "agent_memory.idx"]
    for name in os.listdir(tmp_path / "sub"):
        assert os.stat(tmp_path / "sub" / name).st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "sub").st_mode & 0o777 == 0o700


def test_add_get_roundtrip_every_field(store_path):
    with fastmem.open(store_path) as store:
        mid = store.add(
            "Ada prefers tea ☕", type="fact", timestamp=1_700_000_000.5, session="s-1",
            importance=0.8, pinned=True, metadata={"k": [1, 2.5, "x", None, b"\x00"], "n": {"a": 1}},
            summary="tea",
        )  # fmt: skip
        m = store.get(mid)
    assert m == fastmem.Memory(
        id=mid, text="Ada prefers tea ☕", type="fact", timestamp=1_700_000_000.5, session="s-1",
        importance=0.8, pinned=True, metadata={"k": [1, 2.5, "x", None, b"\x00"], "n": {"a": 1}},
        summary="tea",
    )  # fmt: skip
    with fastmem.open(store_path, readonly=True) as store:
        assert store.get(mid) == m


def test_defaults(store_path):
    with fastmem.open(store_path) as store:
        a = store.get(store.add("hi"))
        b = store.get(store.add("plan it", type="plan"))
        c = store.get(store.add("mine", type="journal"))
    assert (a.type, a.importance, a.pinned, a.metadata, a.session) == ("conversation", 0.3, False, None, None)
    assert b.importance == 0.7 and c.type == "journal" and c.importance == 0.5


def test_ids_len_contains_and_iteration_order(store_path):
    with fastmem.open(store_path) as store:
        ids = store.add_many([{"text": f"t{i}", "timestamp": float(10 - i % 3)} for i in range(9)])
        assert ids == [f"m{i}" for i in range(9)]
        assert len(store) == 9 and "m3" in store and "m9" not in store
        assert "bogus" not in store and 42 not in store
        order = [m.id for m in store]
        # oldest first by timestamp, then id
        assert order == ["m2", "m5", "m8", "m1", "m4", "m7", "m0", "m3", "m6"]
        assert [m.id for m in store.recent(4)] == ["m6", "m3", "m0", "m7"]
        assert store.recent(0) == []


def test_update_pin_forget(store_path):
    with fastmem.open(store_path) as store:
        a, b = store.add("a", metadata={"v": 1}), store.add("b")
        store.update(a, importance=0.25, metadata={"v": 2})
        store.pin(b)
        store.forget(a)
        assert a not in store and len(store) == 1
        with pytest.raises(fastmem.UnknownMemoryError):
            store.get(a)
        with pytest.raises(fastmem.UnknownMemoryError):
            store.forget(a)
        with pytest.raises(KeyError):  # UnknownMemoryError is a KeyError too
            store.update(a, importance=0.1)
        store.pin(b, pinned=False)
        store.update(b, metadata={"w": "x"})
    with fastmem.open(store_path) as store:
        m = store.get(b)
        assert (m.pinned, m.metadata) == (False, {"w": "x"}) and len(store) == 1
        assert store.verify().ok


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"text": ""}, fastmem.InvalidInputError),
        ({"text": "   \n"}, fastmem.InvalidInputError),
        ({"text": 5}, fastmem.InvalidTypeError),
        ({"text": b"bytes"}, fastmem.InvalidTypeError),
        ({"text": "x" * (fmt.MAX_TEXT_BYTES + 1)}, fastmem.InvalidInputError),
        ({"text": "é" * (fmt.MAX_TEXT_BYTES // 2 + 1)}, fastmem.InvalidInputError),
        ({"text": "bad \udcff surrogate"}, fastmem.InvalidInputError),
        ({"text": "x", "type": ""}, fastmem.InvalidInputError),
        ({"text": "x", "type": 3}, fastmem.InvalidTypeError),
        ({"text": "x", "timestamp": math.nan}, fastmem.InvalidInputError),
        ({"text": "x", "timestamp": -1}, fastmem.InvalidInputError),
        ({"text": "x", "timestamp": "now"}, fastmem.InvalidTypeError),
        ({"text": "x", "importance": 1.5}, fastmem.InvalidInputError),
        ({"text": "x", "importance": True}, fastmem.InvalidTypeError),
        ({"text": "x", "pinned": 1}, fastmem.InvalidTypeError),
        ({"text": "x", "session": ""}, fastmem.InvalidInputError),
        ({"text": "x", "metadata": [1]}, fastmem.InvalidTypeError),
        ({"text": "x", "metadata": {"f": object()}}, fastmem.InvalidInputError),
        ({"text": "x", "metadata": {"f": {1: 2}}}, fastmem.InvalidInputError),
        ({"text": "x", "metadata": {"big": "x" * fmt.MAX_METADATA_BYTES}}, fastmem.InvalidInputError),
        ({"text": "x", "summary": 7}, fastmem.InvalidTypeError),
        ({"text": "x", "embedding": [0.0] * 16}, fastmem.InvalidInputError),
        ({"text": "x", "embedding": [math.nan] + [1.0] * 15}, fastmem.InvalidInputError),
        ({"text": "x", "embedding": [1.0] * 8}, fastmem.DimensionMismatchError),
        ({"text": "x", "embedding": ["a"] * 16}, fastmem.InvalidTypeError),
        ({"text": "x", "embedding": [[1.0] * 16]}, fastmem.InvalidInputError),
        ({"text": "x", "embedding": [1e300] * 16}, fastmem.InvalidInputError),
    ],
)
def test_bad_input_raises_and_writes_nothing(store_path, kwargs, error):
    with fastmem.open(store_path, dim=16) as store:
        store.add("keep me", embedding=np.ones(16))
        size = os.path.getsize(store_path + ".dat")
        with pytest.raises(error) as info:
            store.add(**kwargs)
        assert isinstance(info.value, fastmem.FastmemError) and str(info.value)
        with pytest.raises(error):
            store.add_many([{"text": "fine"}, kwargs])
        assert os.path.getsize(store_path + ".dat") == size and len(store) == 1
        assert store.verify().ok


def test_add_many_rejects_bad_items(store_path):
    with fastmem.open(store_path) as store:
        with pytest.raises(fastmem.InvalidInputError, match="unknown keys"):
            store.add_many([{"text": "a", "colour": "red"}])
        with pytest.raises(fastmem.InvalidTypeError):
            store.add_many(["just a string"])
        with pytest.raises(fastmem.InvalidTypeError):
            store.add_many("text")
        with pytest.raises(fastmem.InvalidInputError, match="item 1"):
            store.add_many([{"text": "a", "embedding": [1.0, 2.0]}, {"text": "b", "embedding": [0.0, 0.0]}])
        assert store.add_many([]) == [] and len(store) == 0


def test_bad_ids(store_path):
    with fastmem.open(store_path) as store:
        store.add("x")
        for bad in ["", "m", "x1", "m-1", "m1.0", "m٣", "m99"]:
            with pytest.raises(fastmem.UnknownMemoryError):
                store.get(bad)
        with pytest.raises(fastmem.InvalidTypeError):
            store.get(0)


def test_bad_open_arguments(store_path, tmp_path):
    with pytest.raises(fastmem.InvalidInputError):
        fastmem.open(store_path, durability="sometimes")
    with pytest.raises(fastmem.InvalidInputError):
        fastmem.open(store_path, dim=0)
    with pytest.raises(fastmem.InvalidTypeError):
        fastmem.open(3.5)
    with pytest.raises(fastmem.InvalidInputError):
        fastmem.open(store_path, timeout=-1)
    with pytest.raises(fastmem.StoreNotFoundError):
        fastmem.open(store_path, readonly=True)
    assert not os.path.exists(store_path + ".dat")
    (tmp_path / "junk.dat").write_bytes(b"definitely not a fastmem file, no sir" * 3)
    with pytest.raises(fastmem.CorruptionError):
        fastmem.open(tmp_path / "junk")


def test_dimension_is_fixed_per_store(store_path):
    with fastmem.open(store_path) as store:
        store.add("a")  # no vector yet: the dimension is still open
        store.add("b", embedding=np.ones(8))
        with pytest.raises(fastmem.DimensionMismatchError):
            store.add("c", embedding=np.ones(9))
    with pytest.raises(fastmem.DimensionMismatchError):
        fastmem.open(store_path, dim=16)
    with fastmem.open(store_path, dim=8) as store:
        assert len(store) == 2


def test_closed_and_readonly_errors(store_path):
    store = fastmem.open(store_path)
    mid = store.add("x")
    store.close()
    store.close()  # idempotent
    for call in (lambda: store.get(mid), lambda: store.add("y"), lambda: len(store)):
        with pytest.raises(fastmem.StoreClosedError):
            call()
    with fastmem.open(store_path, readonly=True) as reader:
        with pytest.raises(fastmem.ReadOnlyError):
            reader.add("nope")
        with pytest.raises(fastmem.ReadOnlyError):
            reader.forget(mid)


def test_two_writers_share_a_store_and_see_each_others_writes(store_path):
    with fastmem.open(store_path) as a, fastmem.open(store_path) as b:
        first = a.add("written by a")
        assert b.get(first).text == "written by a" and len(b) == 1  # at once, no reopen
        second = b.add("written by b")
        assert int(second[1:]) == int(first[1:]) + 1  # ids stay unique and increasing
        code = (f"import fastmem\nwith fastmem.open({store_path!r}) as s:\n"
                f" print(s.add('written by another process'), len(s))")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        third, count = out.stdout.split()
        assert (int(third[1:]), count) == (int(second[1:]) + 1, "3")
        assert [m.text for m in a] == ["written by a", "written by b", "written by another process"]
        assert a.search("another process", mode="keyword")[0].id == third
        a.forget(first)
        assert first not in b and len(b) == 2
        assert a.verify().ok and b.verify().ok


def test_a_write_waits_for_the_lock_then_names_its_holder(store_path):
    with fastmem.open(store_path) as store:
        store.add("before")
    with subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({store_path + '.dat'!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\ntime.sleep(float(sys.argv[1]))", "1.0"],
        stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(fastmem.StoreLockedError, match=f"process {holder.pid}"):
            fastmem.open(store_path, timeout=0.05)  # the open waits too...
        with fastmem.open(store_path, timeout=10) as store:  # ...and gets it when it is let go
            store.add("after the wait")
            assert len(store) == 2


def test_lock_is_released_when_the_writer_is_killed(store_path):
    code = f"import fastmem, os, signal\ns = fastmem.open({store_path!r})\ns.add('x')\nos.kill(os.getpid(), signal.SIGKILL)"
    subprocess.run([sys.executable, "-c", code])
    with fastmem.open(store_path) as store:
        assert [m.text for m in store] == ["x"]


@pytest.mark.parametrize("durability", fastmem.DURABILITY)
def test_durability_modes_keep_everything_across_reopen(store_path, durability):
    with fastmem.open(store_path, durability=durability) as store:
        ids = [store.add(f"memory {i}") for i in range(50)]
        store.flush()
    with fastmem.open(store_path, durability=durability) as store:
        assert [store.get(i).text for i in ids] == [f"memory {i}" for i in range(50)]


def test_reader_sees_commits_of_a_live_writer(store_path):
    writer = fastmem.open(store_path)
    writer.add("first")
    reader = fastmem.open(store_path, readonly=True)
    assert [m.text for m in reader.recent(5)] == ["first"]
    mid = writer.add("second", metadata={"a": 1})
    writer.forget("m0")
    assert [m.text for m in reader.recent(5)] == ["second"] and len(reader) == 1
    writer.checkpoint()  # the index file is replaced under the reader
    writer.add("third")
    assert [m.text for m in reader.recent(5)] == ["third", "second"]
    assert reader.get(mid).metadata == {"a": 1}
    writer.close()
    assert len(reader) == 2
    reader.close()


def test_reader_never_sees_a_partial_record(store_path):
    with fastmem.open(store_path) as store:
        store.add("whole")
    with fastmem.open(store_path, readonly=True) as reader:
        with open(store_path + ".dat", "ab") as f:  # half of a record, as a writer mid-append
            f.write(fmt.RECORD_MAGIC + bytes(30))
        assert [m.text for m in reader] == ["whole"]


def test_threads_share_a_store(store_path):
    with fastmem.open(store_path) as store:
        def work(t):
            for i in range(100):
                mid = store.add(f"{t}-{i}")
                assert store.get(mid).text == f"{t}-{i}"
                store.recent(3)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(store) == 400 and len({m.text for m in store}) == 400
        assert store.verify().ok


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_cannot_use_the_parents_store(store_path):
    with fastmem.open(store_path) as store:
        store.add("parent")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                store.add("child")
                os.write(w, b"wrote")
            except fastmem.StoreForkedError:
                os.write(w, b"refused")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 16) == b"refused"
        assert [m.text for m in store] == ["parent"]


def test_search_exact_ranking_and_filters(store_path):
    rng = np.random.default_rng(7)
    vecs = unit(rng, 300)
    items = [{"text": f"t{i}", "embedding": vecs[i], "timestamp": float(i), "type": ["fact", "plan", "mine"][i % 3],
              "session": f"s{i % 4}"} for i in range(300)]  # fmt: skip
    with fastmem.open(store_path) as store:
        store.add_many(items[:200])
        store.checkpoint()
        store.add_many(items[200:])  # hits come from the base and from the tail
        store.add("no vector")
        store.forget("m5")
        q = vecs[5] + 0.3 * unit(rng, 1)[0]
        # the vectors as stored: unit float16, rounded as the reference kernel documents
        half = _kernels_py.to_half(vecs)[0].view(np.float16).astype(np.float64)
        qn = q.astype(np.float64) / np.linalg.norm(q.astype(np.float64))

        def brute(keep):
            scores = [(-(half[i] @ qn), i) for i in range(300) if i != 5 and keep(i)]
            return [f"m{i}" for _, i in sorted(scores)]

        hits = store.search(q, k=10)
        assert [h.id for h in hits] == brute(lambda i: True)[:10]
        assert all(abs(h.score - float(half[int(h.id[1:])] @ qn)) < 1e-9 for h in hits)
        assert [h.id for h in store.search(q, 5, types=["fact", "mine"])] == brute(lambda i: i % 3 != 1)[:5]
        assert [h.id for h in store.search(q, 5, since=100, until=250)] == brute(lambda i: 100 <= i <= 250)[:5]
        assert [h.id for h in store.search(q, 5, session="s2")] == brute(lambda i: i % 4 == 2)[:5]
        assert store.search(q, 5, types=["unknown type"]) == []
        assert len(store.search(q, 10_000)) == 299
        with pytest.raises(fastmem.DimensionMismatchError):
            store.search(np.ones(3))
        with pytest.raises(fastmem.InvalidInputError):
            store.search(q, k=0)
        with pytest.raises(fastmem.InvalidTypeError):
            store.search(q, types="fact")


def test_search_recall_on_a_larger_random_store(store_path):
    rng = np.random.default_rng(3)
    vecs = unit(rng, 20_000, 64)
    with fastmem.open(store_path) as store:
        store.add_many({"text": f"t{i}", "embedding": vecs[i]} for i in range(len(vecs)))
        queries = vecs[:20] + 0.05 * unit(rng, 20, 64)
        recall = []
        for q in queries:
            exact = np.argsort(-(vecs @ (q / np.linalg.norm(q))), kind="stable")[:10]
            got = [int(h.id[1:]) for h in store.search(q, 10)]
            recall.append(len(set(got) & set(exact.tolist())) / 10)
    assert np.mean(recall) >= 0.99


def test_verify_reports_numbers(store_path):
    with fastmem.open(store_path) as store:
        store.add_many([{"text": f"t{i}"} for i in range(10)])
        store.forget("m3")
        report = store.verify()
        sizes = os.path.getsize(store_path + ".dat") + os.path.getsize(store_path + ".idx")
    assert report.ok and report.problems == [] and report.records == 11 and report.bytes == sizes


def test_repr(store_path):
    with fastmem.open(store_path) as store:
        store.add("x")
        assert "1 memories" in repr(store)
    assert "closed" in repr(store)


def test_restart_reads_the_newest_memories_from_the_hot_section(store_path):
    rng = np.random.default_rng(5)
    ts = rng.permutation(400).astype(float)
    with fastmem.open(store_path) as store:
        store.add_many({"text": f"memory {i}", "timestamp": ts[i]} for i in range(400))
        store.forget("m7")
    with fastmem.open(store_path, readonly=True) as store:
        assert store._engine.index.hot_rows() is not None  # a clean checkpoint: the fast path is on
        expected = list(store)[::-1]
        assert store.recent(30) == expected[:30]
        assert store.recent(fmt.HOT_MEMORIES + 5) == expected[: fmt.HOT_MEMORIES + 5]
        assert store.verify().ok
    # Damage one copied record: recent() still answers from the rows, verify() tells.
    idx = Path(store_path + ".idx")
    raw = bytearray(idx.read_bytes())
    h = fmt.unpack_idx_header(raw, "idx")
    layout = fmt.idx_layout(h.rows, h.dim, h.types_len, h.hot_len)
    raw[layout.size - 5] ^= 0x20
    idx.write_bytes(bytes(raw))
    with fastmem.open(store_path, readonly=True) as store:
        assert store.recent(len(store)) == expected
        report = store.verify()
        assert not report.ok and "hot section" in report.problems[0].message
    # Any change after the checkpoint turns the copy off until the next one.
    with fastmem.open(store_path) as store:
        store.add("newest", timestamp=1000.0)
        assert store._engine.index.hot_rows() is None and store.recent(1)[0].text == "newest"


def test_search_checks_its_query_even_on_an_empty_store(store_path):
    with fastmem.open(store_path) as store:
        with pytest.raises(fastmem.InvalidInputError):
            store.search([math.nan, 1.0])
        with pytest.raises(fastmem.InvalidInputError):
            store.search([[1.0, 2.0]])
        assert store.search([1.0, 2.0]) == []


def test_reader_process_follows_a_writer_process(store_path):
    """A reader in this process polls while a writer process appends: counts only grow,
    every memory it sees is whole, and at the end it sees them all."""
    with fastmem.open(store_path) as store:
        store.add("start")
    code = (
        "import sys, time, fastmem\n"
        "with fastmem.open(sys.argv[1]) as s:\n"
        "    for b in range(60):\n"
        "        s.add_many([{'text': f'w{b}-{i} ' * (1 + i % 7), 'metadata': {'b': b}} for i in range(25)])\n"
        "        time.sleep(0.003)  # a writer that takes a while: the reader reads meanwhile\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, store_path])
    seen = []
    with fastmem.open(store_path, readonly=True) as reader:
        while True:
            finished = writer.poll() is not None  # then this last pass sees everything
            seen.append(len(reader))
            for m in reader.recent(5):
                if m.text != "start":
                    b, i = m.text.split()[0][1:].split("-")
                    assert m.text == f"w{b}-{i} " * (1 + int(i) % 7) and m.metadata == {"b": int(b)}
            if finished:
                break
        assert writer.returncode == 0
        assert seen == sorted(seen) and seen[-1] == 1501 and reader.verify().ok
        assert len(set(seen)) > 2  # it did read while the writer wrote


# --- figures for operators and the edge's needs: stats, largest, info, pinned, check_items,
# record_access ----------------------------------------------------------------------------


def test_stats_counts_live_memories_by_type(store_path):
    with fastmem.open(store_path, dim=4) as store:
        store.add("a fact", type="fact", timestamp=100.0, session="s1", pinned=True,
                  embedding=[1, 0, 0, 0])  # fmt: skip
        store.add("two turns", timestamp=200.0, session="s1")
        gone = store.add("three", timestamp=300.0, session="s2")
        store.add("four", type="plan", timestamp=150.0, session="s2")
        store.forget(gone)
        stats = store.stats()
    assert isinstance(stats, fastmem.StoreStats)
    assert (stats.memories, stats.forgotten, stats.pinned, stats.with_vector) == (3, 1, 1, 1)
    assert stats.types == {"conversation": 1, "fact": 1, "plan": 1}
    assert (stats.sessions, stats.oldest, stats.newest, stats.dim) == (2, 100.0, 200.0, 4)
    assert stats.dat_bytes == os.path.getsize(store_path + ".dat")
    assert stats.text_tokens > 0 and stats.backend == fastmem.BACKEND


def test_largest_orders_by_record_size_then_id(store_path):
    with fastmem.open(store_path) as store:
        small, big, same = store.add("x"), store.add("y" * 500), store.add("z")
        top = store.largest(3)
        assert [r.id for r in top] == [big, small, same]
        assert top[0].bytes > top[1].bytes and top[0] == (big, top[0].bytes, top[0].tokens)
        assert store.largest(0) == []
        with pytest.raises(fastmem.InvalidInputError):
            store.largest(-1)


def test_info_reports_the_row_and_the_one_score(store_path):
    with fastmem.open(store_path) as store:
        mid = store.add("where is it", type="fact")
        store.add("another")
        info = store.info(mid)
        assert info.record_bytes > 0 and info.text_tokens == 3 and not info.has_vector
        assert info.access_count == 0 and info.last_access is None
        scores = store.importance_scores()
        assert info.importance_score == pytest.approx(float(scores[0]), rel=1e-6)
        with pytest.raises(fastmem.UnknownMemoryError):
            store.info("m99")


def test_pinned_lists_pinned_memories_most_important_first(store_path):
    with fastmem.open(store_path) as store:
        low = store.add("low", pinned=True, importance=0.2)
        store.add("not pinned", importance=1.0)
        high = store.add("high", pinned=True, importance=0.9)
        assert [m.id for m in store.pinned()] == [high, low]
        store.pin(high, False)
        assert [m.id for m in store.pinned()] == [low]


def test_check_items_writes_nothing_and_names_the_item(store_path):
    with fastmem.open(store_path, dim=3) as store:
        store.check_items([{"text": "fine"}, {"text": "also", "embedding": [1, 2, 3]}])
        with pytest.raises(fastmem.InvalidInputError) as err:
            store.check_items([{"text": "fine"}, {"text": "bad", "embedding": [1, 2]}])
        assert err.value.item == 1 and str(err.value).startswith("item 1:")
        with pytest.raises(fastmem.InvalidTypeError) as err:
            store.check_items([{"text": "ok"}, {"text": "ok"}, {"text": 3}])
        assert err.value.item == 2
        with pytest.raises(fastmem.InvalidTypeError):
            store.check_items({"text": "a dict is not a list"})
        assert len(store) == 0
    assert os.path.getsize(store_path + ".dat") == fmt.DAT_HEADER_SIZE


def test_check_items_in_an_empty_store_takes_the_first_embeddings_length(store_path):
    with fastmem.open(store_path) as store:
        store.check_items([{"text": "a", "embedding": [1, 0]}, {"text": "b", "embedding": [0, 1]}])
        with pytest.raises(fastmem.DimensionMismatchError) as err:
            store.check_items([{"text": "a", "embedding": [1, 0]}, {"text": "b", "embedding": [0, 1, 0]}])
        assert err.value.item == 1


def test_record_access_feeds_importance_and_survives_reopen(store_path):
    with fastmem.open(store_path) as store:
        a, b = store.add("a"), store.add("b")
        store.record_access([a, a, "m77", "nonsense"], now=1_800_000_000.0)  # unknown ids: left out
        assert store.info(a).access_count == 1 and store.info(b).access_count == 0
        assert store.info(a).last_access == 1_800_000_000.0
        scores = store.importance_scores(now=1_800_000_000.0)
        assert scores[0] > scores[1]  # the same memory but for the access
    with fastmem.open(store_path) as store:
        assert store.info(a).access_count == 1
        with pytest.raises(fastmem.InvalidTypeError):
            store.record_access("m0")
    with fastmem.open(store_path, readonly=True) as reader, pytest.raises(fastmem.ReadOnlyError):
        reader.record_access([a])


# A failure after the append (the review's S4): the same ids again, nothing unacknowledged kept.


def test_a_failure_after_the_append_leaves_nothing_behind(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None) as store:
        first = store.add("acknowledged before")
        size = os.path.getsize(path + ".dat")
        real = _index.MemoryIndex.append
        calls = []

        def failing_append(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise MemoryError("while applying the batch")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(_index.MemoryIndex, "append", failing_append)
        with pytest.raises(MemoryError):
            store.add("never acknowledged", type="a-new-type")
        assert os.path.getsize(path + ".dat") == size  # the records are cut off again
        second = store.add("acknowledged after")
        assert int(second[1:]) == int(first[1:]) + 1  # the id was not used
        assert [m.text for m in store] == ["acknowledged before", "acknowledged after"]
        assert store.verify().ok
    for index_file in (True, False):  # from the checkpoint, and rebuilt from the data file
        if not index_file:
            os.remove(path + ".idx")
        with pytest.warns(fastmem.RecoveryWarning) if not index_file else contextlib.nullcontext():
            with fastmem.open(path, embedder=None) as store:
                assert [m.text for m in store] == ["acknowledged before", "acknowledged after"]
                assert store.verify().ok


def test_batched_counts_and_summaries_equal_one_text_at_a_time():
    """The write path counts a batch's texts once, in threads, and skips the default
    summarizer for texts within its budget (issue 21): the same summaries and counts as
    counting and summarizing each text alone."""
    from fastmem.storage.records import SUMMARY_TOKENS, summarize_and_count
    from fastmem.summarize import KeySentences
    from fastmem.tokens import TokenCounter

    tokens = TokenCounter()
    rng = np.random.default_rng(3)
    words = ["alpha", "beta.", "gamma!", "delta\n", "ünïcode", "🌱", "x" * 40, "the", "of"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 120)))) for _ in range(3000)]
    texts += ["word " * 64, "word " * 63 + "wordy", "a" * 300]  # around the budget
    payloads = [{"x": t} for t in texts]
    payloads[5]["u"] = "given summary"
    summarizer = KeySentences(SUMMARY_TOKENS, tokens.count)
    text_counts, summary_counts = summarize_and_count(payloads, summarizer, tokens)
    for i, (text, payload) in enumerate(zip(texts, payloads)):
        summary = "given summary" if i == 5 else summarizer.summarize([text])[0]
        if summary is not None and i != 5:
            summary = tokens.truncate(summary.strip(), SUMMARY_TOKENS)
            summary = summary if summary and summary != text else None
        assert payload.get("u") == summary, i
        count = len(tokens.encode(text))
        want = [count, 0 if summary is None else len(tokens.encode(summary))]
        assert [text_counts[i], summary_counts[i]] == want, i
    assert sum("u" in p for p in payloads) > 100  # long texts were summarized


@settings(max_examples=2000, deadline=None)
@given(st.floats(width=32) | st.sampled_from([0.0, -0.0, 0.3, 0.5, 1.0, 2.0**-149, 2.0**-126, 3.4025001647762064e38]))
def test_an_importance_reads_back_as_numpy_prints_its_float32(x):
    """f32 finds the shortest decimal without numpy's formatter (its first use cost a
    restart ~45 µs); it must give what ``str(np.float32(x))`` gives, for every float32."""
    expected = float(str(np.float32(x)))
    got = _items._shortest_f32(x)
    assert got == expected or (math.isnan(got) and math.isnan(expected))
    assert math.copysign(1, got) == math.copysign(1, expected)


def test_the_importances_known_from_the_start_are_what_numpy_prints():
    """f32's table starts with the types' default importances and 1.0 (a restart's first
    memories skip working them out): each entry must be a float32 and the decimal numpy
    prints for it, as f32 would have found."""
    from fastmem._format import DEFAULT_IMPORTANCE

    for value in (*DEFAULT_IMPORTANCE.values(), 1.0):
        key = float(np.float32(value))  # what a row's float32 importance reads as
        short = _items._F32_SHORT[key]  # there from the import (other tests add more)
        assert short == float(str(np.float32(key))) == _items._shortest_f32(key)
        assert _items.f32(key) == short


def test_recent_of_a_session_is_its_log_in_the_order_of_the_writes(tmp_path):
    """recent(session=...) keeps one session's memories, newest write first, by id: a
    memory written later with an older timestamp (another process's clock, a clock step)
    still comes first; forgotten memories and other sessions are left out; ``before``
    pages by id; the same answer before and after a checkpoint (tail rows, then base rows)."""
    path = tmp_path / "log"
    with fastmem.open(path, embedder=None) as store:
        ids = store.add_many([{"text": f"a{i}", "session": "A", "timestamp": 100.0 + i} for i in range(4)])
        store.add("b", session="B", timestamp=500.0)
        late = store.add("a-late", session="A", timestamp=1.0)
        store.forget(ids[1])
        for _ in range(2):
            assert [m.text for m in store.recent(10, session="A")] == ["a-late", "a3", "a2", "a0"]
            assert [m.id for m in store.recent(2, session="A")] == [late, ids[3]]
            assert [m.text for m in store.recent(2, session="A", before=ids[3])] == ["a2", "a0"]
            assert store.recent(0, session="A") == [] and store.recent(5, session="C") == []
            assert [m.text for m in store.recent(2)] == ["b", "a3"]  # no session: by time
            store.checkpoint()
        with pytest.raises(fastmem.InvalidInputError):
            store.recent(1, session="")
        with pytest.raises(fastmem.InvalidTypeError):
            store.recent(1, session=7)
        with pytest.raises(fastmem.UnknownMemoryError):
            store.recent(1, session="A", before="m999")

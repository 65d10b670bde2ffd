"""The newest truth: ``add(..., supersedes=old)`` (issue 20, item 4).

The old memory stays (``get``, ``search``) marked ``superseded_by`` the new id in its
metadata; contexts show the newest live version in its place, never both.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

import fastmem
from fastmem import embed
from fastmem.errors import InvalidInputError, InvalidTypeError, UnknownMemoryError


def _open(path: str, **options):
    return fastmem.open(path, embedder=None, summarizer=None, **options)


def test_the_old_memory_stays_marked_and_the_new_one_is_returned(store_path):
    with _open(store_path) as store:
        old = store.add("The user lives in Paris.", type="fact", metadata={"source": "chat"})
        new = store.add("The user moved to Berlin.", type="fact", supersedes=old)
        assert new != old
        assert store.get(old).text == "The user lives in Paris."
        assert store.get(old).metadata == {"source": "chat", "superseded_by": new}
        assert store.get(new).metadata is None
        hits = {h.id: h for h in store.search("user Paris Berlin", mode="keyword")}
        assert hits[old].superseded_by == new and hits[new].superseded_by is None


def test_context_shows_the_newer_memory_in_place_of_the_older(store_path):
    with _open(store_path) as store:
        old = store.add("The project deadline is March 3.", type="fact")
        store.add("Unrelated: the cat likes tuna.", type="fact")
        ctx = store.context("project deadline", budget=200)
        assert old in [i.id for i in ctx.items]
        # "Friday" shares no word with the query: found only through the old one's place.
        new = store.add("It moved to Friday.", type="fact", supersedes=old)
        ctx = store.context("project deadline", budget=200)
        ids = [i.id for i in ctx.items]
        assert new in ids and old not in ids
        assert "March 3" not in ctx.text and "Friday" in ctx.text
        assert ids.count(new) == 1
        # Both found: the newer one goes in once, the older one not at all.
        newest = store.add(
            "The project deadline moved again, to April 9.", type="fact", supersedes=new
        )
        ctx = store.context("project deadline moved", budget=200)
        ids = [i.id for i in ctx.items]
        assert ids.count(newest) == 1 and old not in ids and new not in ids


def test_a_chain_is_followed_to_the_newest_live_memory(store_path):
    with _open(store_path) as store:
        a = store.add("Budget figure: 100 euros.", type="fact")
        b = store.add("Budget corrected: 120.", type="fact", supersedes=a)
        c = store.add("Budget corrected again: 130.", type="fact", supersedes=b)
        assert [i.id for i in store.context("Budget figure euros", budget=200).items] == [c]
        assert store.search("Budget figure euros", mode="keyword")[0].superseded_by == c
        store.forget(c)  # a forgotten successor: the chain ends at the last live one
        assert [i.id for i in store.context("Budget figure euros", budget=200).items] == [b]
        store.forget(b)
        assert [i.id for i in store.context("Budget figure euros", budget=200).items] == [a]
        assert store.search("Budget figure euros", mode="keyword")[0].superseded_by is None


def test_an_excluded_successor_leaves_the_old_one_out(store_path):
    with _open(store_path) as store:
        old = store.add("The office is on floor 2.", type="fact")
        new = store.add("Moved: floor 5.", type="fact", supersedes=old)
        assert [i.id for i in store.context("office floor", budget=200, exclude=[new]).items] == []


@pytest.mark.parametrize("bad, error", [
    ("m99", UnknownMemoryError), ("x", UnknownMemoryError), ("", UnknownMemoryError),
    (5, InvalidTypeError), ("m1", UnknownMemoryError),  # m1: the id the new memory would get
])  # fmt: skip
def test_a_bad_supersedes_raises_and_writes_nothing(store_path, bad, error):
    with _open(store_path) as store:
        old = store.add("The user lives in Paris.")
        size = os.path.getsize(store.dat_path)
        with pytest.raises(error):
            store.add("The user moved to Berlin.", supersedes=bad)
        assert os.path.getsize(store.dat_path) == size
        assert len(store) == 1 and store.get(old).metadata is None


def test_a_forgotten_memory_cannot_be_superseded(store_path):
    with _open(store_path) as store:
        old = store.add("The user lives in Paris.")
        store.forget(old)
        size = os.path.getsize(store.dat_path)
        with pytest.raises(UnknownMemoryError):
            store.add("The user moved to Berlin.", supersedes=old)
        assert os.path.getsize(store.dat_path) == size and len(store) == 0


def test_metadata_too_large_for_the_link_raises_and_writes_nothing(store_path):
    with _open(store_path) as store:
        big = {"blob": "x" * (fmt_limit() - 12)}  # fits; with the link ("m2"), ~14 bytes over
        old = store.add("Lives in Paris.", metadata=big)
        size = os.path.getsize(store.dat_path)
        with pytest.raises(InvalidInputError):
            store.add("Moved to Berlin.", supersedes=old)
        assert os.path.getsize(store.dat_path) == size and len(store) == 1


@pytest.mark.parametrize("short", [False, True])
def test_a_failed_write_keeps_neither_the_memory_nor_the_link(store_path, short):
    # The new memory and the old one's link are one append: a full disk at its write, or
    # part-way through it (half written, then the rest fails), leaves neither.
    from faults import Faults

    with _open(store_path, durability="always") as store:
        old = store.add("The user lives in Paris.")
        size = os.path.getsize(store.dat_path)
        with Faults(fail_at=1, errno_=errno.ENOSPC, only=("write",), short=short) as faults:
            with pytest.raises(fastmem.StoreFullError):
                store.add("The user moved to Berlin.", supersedes=old)
        assert len(faults.calls) == 1 + short
        assert os.path.getsize(store.dat_path) == size and len(store) == 1
        assert store.get(old).metadata is None
        with Faults(only=("write",)) as faults:
            new = store.add("The user moved to Berlin.", supersedes=old)
        assert len(faults.calls) == 1  # both records in one append
    with _open(store_path) as store:
        assert store.get(old).metadata == {"superseded_by": new} and store.verify().ok


def fmt_limit() -> int:
    from fastmem import _format

    return _format.MAX_METADATA_BYTES


def test_update_of_the_metadata_keeps_the_link(store_path):
    with _open(store_path) as store:
        old = store.add("Lives in Paris.", type="fact")
        new = store.add("Moved to Berlin.", type="fact", supersedes=old)
        store.context("Paris", budget=100)  # the old memory decoded into the cache first
        store.update(old, metadata={"checked": True})
        assert store.get(old).metadata == {"checked": True, "superseded_by": new}
        assert [i.id for i in store.context("Lives in Paris", budget=100).items] == [new]


def test_a_handle_sees_another_handles_link(store_path):
    with _open(store_path) as store:
        old = store.add("Lives in Paris.", type="fact")
        with _open(store_path, readonly=True) as reader:
            assert [i.id for i in reader.context("Lives in Paris", budget=100).items] == [old]
            new = store.add("Moved to Berlin.", type="fact", supersedes=old)
            assert [i.id for i in reader.context("Lives in Paris", budget=100).items] == [new]


def test_the_link_survives_reopen_replay_compaction_and_a_kill(store_path):
    with _open(store_path) as store:
        old = store.add("Lives in Paris.", type="fact")
        new = store.add("Moved to Berlin.", type="fact", supersedes=old)
    with _open(store_path) as store:  # reopened from the checkpoint
        assert store.get(old).metadata == {"superseded_by": new}
        assert [i.id for i in store.context("Lives in Paris", budget=100).items] == [new]
        store.compact()  # the metadata folded into the memory record
        assert store.get(old).metadata == {"superseded_by": new}
        assert [i.id for i in store.context("Lives in Paris", budget=100).items] == [new]
    # A process killed right after add returned: the next open replays both records.
    code = (
        "import os, fastmem\n"
        f"s = fastmem.open({store_path!r}, embedder=None, summarizer=None)\n"
        "old = s.add('The deadline is May 1.', type='fact')\n"
        "new = s.add('Deadline now June 2.', type='fact', supersedes=old)\n"
        "print(old, new, flush=True)\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(fastmem.__file__))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    killed_old, killed_new = out.stdout.split()
    with _open(store_path) as store:
        assert store.get(killed_old).metadata == {"superseded_by": killed_new}
        ids = [i.id for i in store.context("deadline May", budget=100).items]
        assert killed_new in ids and killed_old not in ids
        assert store.verify().ok


def test_context_with_the_real_embedder_shows_berlin_not_paris(store_path):
    with fastmem.open(store_path, embedder=embed.default_embedder()) as store:
        paris = store.add("The user lives in Paris.", type="fact")
        store.add("The user likes green tea.", type="fact")
        store.add("The user's sister is called Maria.", type="fact")
        before = store.context("Where does the user live?", budget=200).text
        assert "Paris" in before
        store.add("The user moved to Berlin.", type="fact", supersedes=paris)
        ctx = store.context("Where does the user live?", budget=200)
        assert "Berlin" in ctx.text and "Paris" not in ctx.text

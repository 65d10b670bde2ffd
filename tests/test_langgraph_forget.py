"""How the LangGraph store forgets: a replaced value gets a tombstone (its bytes stay until
``compact()``, as a replaced row's do in LangGraph's own stores), a delete and an expired
TTL erase the bytes; a batch's replacements and deletes take one write each."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import PutOp  # noqa: E402

import fastmem  # noqa: E402
from fastmem.integrations.langgraph import FastmemStore  # noqa: E402


@pytest.fixture
def lg(tmp_path):
    with FastmemStore(os.fspath(tmp_path / "s"), embedder=None) as store:
        yield store


def _on_disk(store: FastmemStore, marker: str) -> bool:
    store.store.flush()
    with open(store.store.dat_path, "rb") as f:
        return marker.encode() in f.read()


def test_a_replaced_value_is_tombstoned_and_a_deleted_one_erased(lg):
    lg.put(("u",), "k", {"text": "old-secret-QX1"})
    lg.put(("u",), "k", {"text": "new value"})
    assert lg.get(("u",), "k").value == {"text": "new value"}
    assert len(lg.store) == 1
    assert _on_disk(lg, "old-secret-QX1")  # a tombstone: the bytes wait for compact()
    lg.store.compact()
    assert not _on_disk(lg, "old-secret-QX1")
    lg.put(("u",), "gone", {"text": "deleted-secret-QX2"})
    lg.delete(("u",), "gone")
    assert lg.get(("u",), "gone") is None
    assert not _on_disk(lg, "deleted-secret-QX2")  # a delete erases at once


def test_a_batchs_replacements_and_deletes_take_one_forget_each(lg, monkeypatch):
    lg.batch([PutOp(("u",), f"k{i}", {"text": f"first {i}"}) for i in range(6)])
    calls: list[tuple[list[str], bool]] = []
    real = lg.store.forget_many

    def counted(ids, *, erase=True):
        calls.append((list(ids), erase))
        return real(ids, erase=erase)

    monkeypatch.setattr(lg.store, "forget_many", counted)
    monkeypatch.setattr(lg.store, "forget", lambda *a, **k: pytest.fail("forget one by one"))
    lg.batch([PutOp(("u",), f"k{i}", {"text": f"second {i}"}) for i in range(4)]
             + [PutOp(("u",), "k4", None), PutOp(("u",), "k5", None)])  # fmt: skip
    assert [(len(ids), erase) for ids, erase in calls] == [(4, False), (2, True)]
    assert sorted(item.key for item in lg.search(("u",))) == ["k0", "k1", "k2", "k3"]
    assert lg.get(("u",), "k2").value == {"text": "second 2"}
    assert len(lg.store) == 4


def test_a_replace_another_process_forgot_first_still_lands(tmp_path):
    path = os.fspath(tmp_path / "s")
    with FastmemStore(path, embedder=None) as a:
        a.put(("u",), "k", {"text": "one"})
        with fastmem.open(path, embedder=None) as other:
            other.forget(other.ids()[0])  # behind the adapter's back, before its replace
        a.batch([PutOp(("u",), "k", {"text": "two"}), PutOp(("u",), "x", {"text": "three"})])
        assert a.get(("u",), "k").value == {"text": "two"}
        assert len(a.store) == 2


def test_an_expired_item_is_swept_and_erased(tmp_path):
    with FastmemStore(os.fspath(tmp_path / "s"), embedder=None, ttl={"refresh_on_read": False}) as lg:
        lg.put(("u",), "short", {"text": "expiring-secret-QX3"}, ttl=0.0001)
        lg.put(("u",), "kept", {"text": "kept"})
        time.sleep(0.02)
        assert lg.sweep_ttl() == 1
        assert [i.key for i in lg.search(("u",))] == ["kept"]
        assert not _on_disk(lg, "expiring-secret-QX3")


def test_a_compaction_elsewhere_is_followed(tmp_path):
    path = os.fspath(tmp_path / "s")
    with FastmemStore(path, embedder=None) as a:
        a.put(("u",), "k", {"text": "one"})
        a.put(("u",), "k", {"text": "two"})  # a tombstone for compact() to drop
        assert a.get(("u",), "k").value == {"text": "two"}
        with FastmemStore(path, embedder=None) as b:
            b.store.compact()  # a new data file swapped in under the same name
            b.put(("u",), "after", {"text": "three"})
        assert a.get(("u",), "after").value == {"text": "three"}
        assert a.get(("u",), "k").value == {"text": "two"}


def test_a_memory_with_a_label_put_would_refuse_is_no_item(lg):
    from langgraph.store.base import InvalidNamespaceError

    meta = {"langgraph": {"namespace": ["a.b"], "key": "k", "value": {"v": 1}, "created_at": 0.0}}
    lg.store.add("written by other code", type="lg:a.b", metadata=meta)
    lg.put(("ok",), "k", {"v": 2})
    with pytest.raises(InvalidNamespaceError):
        lg.get(("a.b",), "k")  # refused, not found through the foreign memory
    assert lg.list_namespaces() == [("ok",)]

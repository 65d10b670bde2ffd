"""Isolation and security: namespaces never leak into each other, files are private,
no code-carrying formats, metadata holds only msgpack's own types."""

from __future__ import annotations

import os
import re
import stat
import struct
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem.namespaces import list_namespaces

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["alice", "bob-2", "user_42", "a.b", "0", "x" * 64, "-", "a..b"])
def test_valid_namespaces(tmp_path, name):
    with fastmem.open(tmp_path, namespace=name, embedder=None) as store:
        store.add("hello")
    assert os.path.exists(tmp_path / name / "memory.dat")
    assert list_namespaces(tmp_path) == [name]


@pytest.mark.parametrize(
    "name, error",
    [("", fastmem.InvalidInputError), (".", fastmem.InvalidInputError), ("..", fastmem.InvalidInputError),
     (".hidden", fastmem.InvalidInputError), ("../bob", fastmem.InvalidInputError),
     ("a/b", fastmem.InvalidInputError), ("/etc", fastmem.InvalidInputError), ("a\\b", fastmem.InvalidInputError),
     ("Alice", fastmem.InvalidInputError), ("x" * 65, fastmem.InvalidInputError), ("a\x00", fastmem.InvalidInputError),
     ("é", fastmem.InvalidInputError), ("a b", fastmem.InvalidInputError), ("a\n", fastmem.InvalidInputError),
     ("\ud800", fastmem.InvalidInputError), (3, fastmem.InvalidTypeError), (b"alice", fastmem.InvalidTypeError)],
)  # fmt: skip
def test_invalid_namespaces_are_refused_and_create_nothing(tmp_path, name, error):
    root = tmp_path / "root"
    with pytest.raises(error):
        fastmem.open(root, namespace=name, embedder=None)
    with pytest.raises(error):
        fastmem.open(root, namespace=name, readonly=True, embedder=None)
    assert not root.exists() and os.listdir(tmp_path) == ["root"] * 0


def test_readonly_namespace_that_does_not_exist(tmp_path):
    with pytest.raises(fastmem.StoreNotFoundError):
        fastmem.open(tmp_path, namespace="nobody", readonly=True, embedder=None)
    assert list_namespaces(tmp_path) == [] and not (tmp_path / "nobody").exists()


USERS = ("alice", "bob")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(USERS), st.sampled_from(["add", "add_many", "search", "context",
                                                                    "recent", "get", "reopen", "update"]),
                          st.integers(0, 5)), min_size=5, max_size=40))  # fmt: skip
def test_interleaved_users_never_see_each_other(tmp_path_factory, ops):
    """Two users' stores open side by side; adds, searches (every mode), contexts, recent,
    get by id and reopening interleave: every result belongs to the user who asked."""
    root = tmp_path_factory.mktemp("users")
    stores = {u: fastmem.open(root, namespace=u, embedder=None, dim=4) for u in USERS}
    readers = {}
    try:
        for user, op, i in ops:
            store = stores[user]
            other = USERS[1 - USERS.index(user)]
            shared = f"shared words secret {i} about the trip"  # the same words for both users
            vec = np.eye(4)[i % 4] + 0.1
            if op == "add":
                store.add(f"{user} owns this: {shared}", embedding=vec, session="s", metadata={"owner": user})
            elif op == "add_many":
                store.add_many([{"text": f"{user} owns this: {shared} {j}", "embedding": vec + j,
                                 "metadata": {"owner": user}} for j in range(3)])  # fmt: skip
            elif op == "reopen":
                store.close()
                stores[user] = fastmem.open(root, namespace=user, embedder=None)
                if user not in readers:  # (setdefault would open one each time and drop it unclosed)
                    readers[user] = fastmem.open(root, namespace=user, readonly=True, embedder=None)
            elif op == "update" and len(store):
                store.update("m0", importance=0.9)
            seen = []
            seen += [h.memory for mode in ("keyword", "hybrid") for h in stores[user].search(shared, 20, mode=mode)]
            seen += [h.memory for h in stores[user].search(vec, 20, mode="vector")]
            seen += stores[user].recent(50) + list(stores[user])
            if len(stores[user]):
                seen.append(stores[user].get("m0"))  # both users have an m0: each sees their own
            if user in readers:
                seen += [h.memory for h in readers[user].search(shared, 20, mode="keyword")]
            context = stores[user].context(shared, 1000, session="s")
            assert other not in context.text
            for memory in seen:
                assert memory.text.startswith(f"{user} owns this") and memory.metadata == {"owner": user}
    finally:
        for s in [*stores.values(), *readers.values()]:
            s.close()


def test_files_are_0600_and_directories_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)  # fastmem must not rely on the umask for privacy
    try:
        with fastmem.open(tmp_path / "a" / "b" / "store", embedder=None) as store:
            store.add("secret")
            store.checkpoint()
            store.add("more")
        with fastmem.open(tmp_path / "ns", namespace="alice", embedder=None) as store:
            store.add("secret")
    finally:
        os.umask(old)
    modes = {}
    for directory, dirs, files in os.walk(tmp_path):
        for name in dirs + files:
            path = os.path.join(directory, name)
            modes[os.path.relpath(path, tmp_path)] = stat.S_IMODE(os.stat(path).st_mode)
    assert {p for p, m in modes.items() if m != (0o700 if os.path.isdir(tmp_path / p) else 0o600)} == set()
    assert "a/b/store.idx" in modes and "ns/alice/memory.dat" in modes and len(modes) == 8


FORBIDDEN = re.compile(
    r"\b(import\s+(pickle|marshal|shelve|dill|cloudpickle)|from\s+(pickle|marshal|shelve)\s+import"
    r"|pickle\.|marshal\.|eval\(|exec\(|yaml\.(unsafe_)?load|allow_pickle\s*=\s*True|__import__\()"
)


def test_no_code_carrying_formats_in_the_package():
    """No pickle, marshal, eval/exec or yaml.load anywhere in fastmem's own code."""
    if not (ROOT / "setup.py").exists():
        pytest.skip("a check of the source tree; these tests run against an installed fastmem")
    sources = [p for p in (ROOT / "fastmem").rglob("*") if p.suffix in (".py", ".pyi")]
    sources += [p for p in (ROOT / "src_cython").glob("*") if p.suffix in (".pyx", ".pxd")]
    sources.append(ROOT / "setup.py")
    assert len(sources) > 10
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text().splitlines(), 1) if FORBIDDEN.search(line)]  # fmt: skip
    assert found == []


@pytest.mark.parametrize(
    "metadata",
    [{"x": msgpack.ExtType(5, b"code")}, {"t": msgpack.Timestamp(1, 0)}, {"x": [msgpack.ExtType(1, b"")]},
     {"x": {"y": msgpack.Timestamp(0, 5)}}, {1: "int key"}, {"x": {2: 3}}, {"x": {1, 2}}, {"x": object()}],
)  # fmt: skip
def test_metadata_takes_only_msgpack_types(tmp_path, metadata):
    with fastmem.open(tmp_path / "m", embedder=None) as store:
        mid = store.add("x")
        size = os.path.getsize(store.dat_path)
        with pytest.raises(fastmem.InvalidInputError):
            store.add("y", metadata=metadata)
        with pytest.raises(fastmem.InvalidInputError):
            store.update(mid, metadata=metadata)
        assert os.path.getsize(store.dat_path) == size
        store.add("z", metadata={"ok": [1, 2.5, "s", b"b", True, None, {"n": -1}]})
        assert store.get("m1").metadata == {"ok": [1, 2.5, "s", b"b", True, None, {"n": -1}]}


def test_metadata_nests_no_deeper_than_a_payload_may(tmp_path):
    """Found by test_api_fuzz: metadata 65 to 511 levels deep passed the check (msgpack's
    own limit is 512) and the compiled packer then raised a bare ValueError from add()."""

    def nested(levels: int) -> dict:
        value: object = 1
        for _ in range(levels):
            value = [value]
        return {"k": value}

    deepest = fmt.MAX_PAYLOAD_DEPTH - 2  # the payload map, the metadata map, then the lists
    with fastmem.open(tmp_path / "m", embedder=None) as store:
        mid = store.add("fits", metadata=nested(deepest))
        assert store.get(mid).metadata == nested(deepest)
        size = os.path.getsize(store.dat_path)
        for levels in (deepest + 1, 100, 400):
            with pytest.raises(fastmem.InvalidInputError, match="nested at most"):
                store.add("too deep", metadata=nested(levels))
            with pytest.raises(fastmem.InvalidInputError, match="nested at most"):
                store.update(mid, metadata=nested(levels))
        assert os.path.getsize(store.dat_path) == size and store.verify().ok


def test_an_extension_type_in_a_stored_record_is_damage(tmp_path):
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None):
        pass
    stored = msgpack.packb({"i": 0, "t": 1.0, "x": "hi", "m": {"e": msgpack.ExtType(7, b"payload")}})
    head = fmt.RECORD_MAGIC + bytes([fmt.RECORD_VERSION, fmt.KIND_MEMORY]) + struct.pack(
        "<HII", 0, len(stored), len(stored)
    )
    with open(path + ".dat", "ab") as f:
        f.write(head + struct.pack("<I", zlib.crc32(stored, zlib.crc32(head))) + stored)
    os.remove(path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        store = fastmem.open(path, embedder=None, readonly=True)
    with store:
        assert len(store) == 0
        problems = store.verify().problems
        assert [p.offset for p in problems] == [fmt.DAT_HEADER_SIZE] and "extension" in problems[0].message

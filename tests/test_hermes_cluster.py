"""The Hermes provider on a cluster's store, against a fake shard (no Ray): writes the shard
cannot take wait in local spill files with their operation ids and are replayed once it
answers, each stored once, even when the shard applied a write and its answer was lost.
On a real cluster: tests/test_ray_cluster.py (test_hermes_on_a_cluster_...)."""

from __future__ import annotations

import glob
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fastmem
import fastmem.ray
from fastmem.integrations import _cluster, _writer
from fastmem.integrations.hermes import FastmemProvider

LOCATION = "ray+gcs://127.0.0.1:1/srv/fastmem?shards=4&namespace=laptop"


@pytest.fixture(autouse=True)
def backend():
    """No kernel is exercised: one run (tests/conftest.py's fixture would make two)."""
    yield fastmem.BACKEND


class FakeShard:
    """A shard and its router: a real store, an op log (op id -> result) as the shard's,
    ``up`` (else ShardUnavailableError, nothing applied) and ``lose_answers`` (the next N
    writes are applied, then their answers are lost: the router gives up all the same)."""

    def __init__(self, path: str) -> None:
        self.store = fastmem.open(path, embedder=None)
        self.done: dict[str, Any] = {}
        self.up = True
        self.lose_answers = 0
        self.cluster = self  # open_reader: cluster.open(namespace, ...)
        self.writes: list[str | None] = []  # op ids of the writes that reached the store

    def open(self, namespace: str, **kwargs: Any) -> FakeShard:
        return self

    def _check(self) -> None:
        if not self.up:
            raise fastmem.ray.ShardUnavailableError("shard 1 did not answer for 2 s (fake)")

    def _write(self, op_id: str | None, apply: Any) -> Any:
        self._check()
        if op_id is not None and op_id in self.done:
            result = self.done[op_id]
        else:
            result = apply()
            self.writes.append(op_id)
            if op_id is not None:
                self.done[op_id] = result
        if self.lose_answers:
            self.lose_answers -= 1
            raise fastmem.ray.ShardUnavailableError("shard 1 did not answer for 2 s (answer lost)")
        return result

    def add(self, text: str, *, op_id: str | None = None, **fields: Any) -> str:
        return self.add_many([{"text": text, **fields}], op_id=op_id)[0]

    def add_many(self, items: list[dict[str, Any]], *, op_id: str | None = None) -> list[str]:
        result: list[str] = self._write(op_id, lambda: self.store.add_many(items))
        return result

    def forget(self, mid: str, *, op_id: str | None = None) -> None:
        self._write(op_id, lambda: self.store.forget(mid))

    def pin(self, mid: str, pinned: bool = True, *, op_id: str | None = None) -> None:
        self._write(op_id, lambda: self.store.pin(mid, pinned))

    def record_access(self, ids: Any, now: Any = None, *, op_id: str | None = None) -> None:
        self._write(op_id, lambda: self.store.record_access(ids, now))

    def __getattr__(self, name: str) -> Any:  # reads
        self._check()
        return getattr(self.store, name)

    def close(self) -> None:
        pass

    def texts(self) -> list[str]:
        return [m.text for m in self.store]


@pytest.fixture
def shard(tmp_path, monkeypatch):
    fake = FakeShard(str(tmp_path / "cluster" / "memory"))
    opened: list[tuple[str, str]] = []

    def open_location(location, namespace=None, **kwargs):
        opened.append((location, namespace))
        return fake

    monkeypatch.setattr(fastmem.ray, "open_location", open_location)
    monkeypatch.setattr(_writer, "IDLE_TICK", 0.05)  # replays come quickly
    fake.opened = opened
    yield fake
    fake.store.close()


@pytest.fixture
def provider(tmp_path, shard):
    p = FastmemProvider(store=LOCATION)
    p.initialize("s1", hermes_home=str(tmp_path / "hermes"), platform="cli")
    yield p
    p.shutdown()


def _spill_files(tmp_path: Path) -> list[str]:
    return glob.glob(str(tmp_path / "hermes" / "fastmem-spill" / "*" / _writer.SPILL_GLOB))


def _wait_replayed(tmp_path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _spill_files(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _spill_files(tmp_path) == []


def test_a_write_whose_answer_was_lost_is_stored_once_when_replayed(tmp_path, shard, provider):
    shard.lose_answers = 1  # applied on the shard, then the answer is lost
    provider.sync_turn("My cat is called Tom.", "Noted.", session_id="s1")
    assert provider.flush()  # kept in a spill file (the writer cannot know it was applied)
    _wait_replayed(tmp_path)
    assert shard.texts() == ["User: My cat is called Tom.\nAssistant: Noted."]
    assert len(shard.writes) == 1 and shard.writes[0] is not None  # the replay found the op id done
    assert shard.opened == [(LOCATION, "laptop.default")]  # the location's namespace: the profile's prefix


def test_the_spill_file_keeps_the_op_id_the_first_try_used(tmp_path, shard, provider):
    shard.lose_answers = 1
    for i in range(3):
        provider.sync_turn(f"turn {i}", "ok", session_id="s1")
    shard.up = False  # kept in the file until the shard answers again
    assert provider.flush()
    files = _spill_files(tmp_path)
    entries = [json.loads(line) for name in files for line in Path(name).read_text().splitlines()]
    tried = set(shard.done)  # the op ids the shard applied (answers lost)
    assert entries and all(e["op"] for e in entries)
    assert tried <= {e["op"] for e in entries}  # replayed under the id of its first try
    shard.up = True
    _wait_replayed(tmp_path)
    assert shard.texts() == [f"User: turn {i}\nAssistant: ok" for i in range(3)]


def test_while_the_shard_is_down_writes_wait_locally_and_reads_degrade(tmp_path, shard, provider, caplog):
    provider.sync_turn("I live in Lyon.", "Nice.", session_id="s1")
    assert provider.flush() and len(shard.texts()) == 1
    shard.up = False
    caplog.set_level(logging.WARNING, logger="fastmem")
    for i in range(4):
        provider.sync_turn(f"turn {i} while down", "ok", session_id="s1")
    reply = json.loads(provider.handle_tool_call("fastmem_remember", {"text": "The user prefers tea."}))
    assert reply["ok"] and reply["pending"]  # kept locally, said so
    assert provider.flush()
    assert _spill_files(tmp_path) and len(shard.texts()) == 1  # nothing reached the shard
    # Reads: an empty context and a warning, never an exception into the agent.
    assert provider.prefetch("where does the user live?") == ""
    assert "fastmem" in provider.system_prompt_block()
    assert "error" in json.loads(provider.handle_tool_call("fastmem_search", {"query": "Lyon"}))
    assert any("recall failed" in r.getMessage() for r in caplog.records)
    shard.up = True
    _wait_replayed(tmp_path)
    assert shard.texts() == ["User: I live in Lyon.\nAssistant: Nice.",
                             *[f"User: turn {i} while down\nAssistant: ok" for i in range(4)],
                             "The user prefers tea."]  # fmt: skip
    found = json.loads(provider.handle_tool_call("fastmem_search", {"query": "Lyon"}))["results"]
    assert found[0]["text"] == "User: I live in Lyon.\nAssistant: Nice."


def test_writes_kept_at_shutdown_are_replayed_by_the_next_start(tmp_path, shard):
    home = str(tmp_path / "hermes")
    first = FastmemProvider(store=LOCATION)
    first.initialize("s1", hermes_home=home)
    shard.up = False
    first.sync_turn("written while the shard was down", "ok")
    first.shutdown()
    assert _spill_files(tmp_path)
    shard.up = True
    second = FastmemProvider(store=LOCATION)
    second.initialize("s2", hermes_home=home)
    try:
        _wait_replayed(tmp_path)
    finally:
        second.shutdown()
    assert shard.texts() == ["User: written while the shard was down\nAssistant: ok"]


def test_a_forget_whose_answer_was_lost_is_not_refused_on_replay(tmp_path, shard, provider):
    mid = shard.store.add("an old fact", type="fact")
    shard.lose_answers = 1
    reply = json.loads(provider.handle_tool_call("fastmem_forget", {"id": mid}))
    assert reply["ok"] and reply["pending"]
    _wait_replayed(tmp_path)
    assert mid not in shard.store and len(shard.writes) == 1  # replayed as done, not applied again


def test_the_location_comes_from_the_profile(tmp_path, shard, monkeypatch):
    home = tmp_path / "hermes"
    p = FastmemProvider()
    p.save_config({"store": LOCATION.replace("laptop", "desk")}, str(home))
    assert json.loads((home / "fastmem" / "config.json").read_text())["store"].endswith("namespace=desk")
    p.initialize("s1", hermes_home=str(home), platform="telegram", user_id="42")
    p.sync_turn("hello", "hi")  # connects on first use, not in initialize
    p.shutdown()
    assert shard.opened[-1][1].startswith("desk.u-")
    monkeypatch.setenv("FASTMEM_HERMES_STORE", LOCATION)  # the profile's .env wins
    p.initialize("s1", hermes_home=str(home))
    p.sync_turn("hello", "hi")
    p.shutdown()
    assert shard.opened[-1][1] == "laptop.default"
    assert [f["key"] for f in p.get_config_schema()] == ["store"]


def test_a_bad_location_is_refused():
    with pytest.raises(fastmem.InvalidInputError):
        _cluster.ClusterTarget("/tmp/x/memory", "s3://bucket/x", "default")
    with pytest.raises(fastmem.InvalidInputError):
        _cluster.store_namespace("ray+gcs://h:1/r?namespace=Bad", "default")


def test_ray_status_fails_fast_when_nothing_answers(tmp_path):
    pytest.importorskip("ray", reason="fastmem[ray] is not installed")
    out = subprocess.run([sys.executable, "-m", "fastmem", "ray", "status", "--address", "127.0.0.1:9",
                          "--root", str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1], check=False)  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "nothing answers at 127.0.0.1:9" in out.stderr



def test_joining_something_that_is_not_a_ray_head_raises_a_fastmem_error(monkeypatch):
    ray = pytest.importorskip("ray", reason="fastmem[ray] is not installed")
    import socket

    def refuse(*args, **kwargs):  # what Ray raises after its own ~20 s of retries
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:1")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    # The probe's gRPC question needs a real head to answer: this test is about what follows.
    monkeypatch.setattr(fastmem.ray._router, "_ask_grpc", lambda *args: None)
    with socket.create_server(("127.0.0.1", 0)) as server:  # the port is open: the probe passes
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(fastmem.ray.ClusterUnreachableError, match=f"could not join a Ray cluster at {address}"):
            fastmem.ray.connect(address, root="/x")

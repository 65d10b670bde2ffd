"""The seed design of ../shared/BRIEF.md, written as its first cut would be: the peer that
fastmem's own design is measured against in compare.py.

* ``<path>.dat``: each memory's content (text, type, timestamp) as an lz4-compressed msgpack
  record appended at the end, the record's length before it;
* ``<path>.idx``: one lz4-compressed msgpack snapshot of *all* index entries (id, timestamp,
  type, offset, length, float32 embedding), rewritten whole (temporary file + rename) on
  every ``save()``, which ``add_many`` calls once per batch so that a batch is durable;
* opening reads and unpacks the whole snapshot into Python objects;
* vector search: a Python loop of cosines (one ``numpy.dot`` per entry) and ``heapq``;
* keyword search: no index; every record is read and its words counted.
"""

from __future__ import annotations

import heapq
import os
import struct
from typing import Any

import lz4.frame
import msgpack
import numpy as np

_LEN = struct.Struct("<I")


class SeedStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: list[dict[str, Any]] = []
        if os.path.exists(path + ".idx"):
            with open(path + ".idx", "rb") as f:
                self.entries = msgpack.unpackb(lz4.frame.decompress(f.read()))
            for e in self.entries:
                e["emb"] = np.frombuffer(e["emb"], dtype=np.float32)
        self.data = open(path + ".dat", "a+b")  # noqa: SIM115 - open for the store's life

    def add_many(self, items: list[dict[str, Any]]) -> None:
        self.data.seek(0, os.SEEK_END)
        for item in items:
            record = lz4.frame.compress(msgpack.packb(
                {"text": item["text"], "type": item["type"], "ts": item["timestamp"]}))  # fmt: skip
            offset = self.data.tell()
            self.data.write(_LEN.pack(len(record)) + record)
            self.entries.append({"id": len(self.entries), "ts": item["timestamp"], "type": item["type"],
                                 "offset": offset, "length": len(record),
                                 "emb": np.asarray(item["embedding"], dtype=np.float32)})  # fmt: skip
        self.save()

    def save(self) -> None:
        self.data.flush()
        os.fsync(self.data.fileno())
        snapshot = [{**e, "emb": e["emb"].tobytes()} for e in self.entries]
        tmp = self.path + ".idx.tmp"
        with open(tmp, "wb") as f:
            f.write(lz4.frame.compress(msgpack.packb(snapshot)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path + ".idx")

    def text(self, row: int) -> str:
        e = self.entries[row]
        self.data.seek(e["offset"] + _LEN.size)
        return str(msgpack.unpackb(lz4.frame.decompress(self.data.read(e["length"])))["text"])

    def recent(self, n: int) -> list[int]:
        return [e["id"] for e in heapq.nlargest(n, self.entries, key=lambda e: e["ts"])]

    def vector(self, q: np.ndarray, k: int) -> list[int]:
        q = q / np.linalg.norm(q)
        scores = ((float(np.dot(q, e["emb"])) / float(np.linalg.norm(e["emb"])), e["id"])
                  for e in self.entries)  # fmt: skip
        return [row for _, row in heapq.nlargest(k, scores)]

    def keyword(self, query: str, k: int) -> list[int]:
        words = query.lower().split()
        scored = []
        for e in self.entries:
            tokens = self.text(e["id"]).lower().split()
            score = sum(tokens.count(w) for w in words)
            if score:
                scored.append((score, -e["id"]))
        return [-neg for _, neg in heapq.nlargest(k, scored)]

    def close(self) -> None:
        self.data.close()

"""The shard's memory of the operations it applied to one store: exactly-once retries.

A small JSON-lines file beside the store (``<root>/<slot>/<namespace>/ray-ops.jsonl``),
written only by the shard that owns the store, so the store's own format is unchanged.
A line is written with one ``write`` (a killed process leaves at most a torn last line,
skipped when read). For an ``add_many`` the shard writes an *intent* (the items'
fingerprints and the highest memory id it knew) before the write and the ids after it;
if it died in between, the retry finds the batch's memories by their fingerprints among
those written after the intent instead of writing them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

FILE = "ray-ops.jsonl"
KEEP = 4096  # operation ids remembered per store (a retry comes within seconds, not days)


def fingerprint(item: Mapping[str, Any]) -> str:
    """What identifies an item of a batch among the memories written after its intent."""
    key = json.dumps([item.get("text"), item.get("type") or "conversation", item.get("session")],
                     ensure_ascii=False)  # fmt: skip
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def id_number(mid: str) -> int:
    return int(mid[1:])


class OpLog:
    """The applied operations of one store (op id -> result) and pending intents."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE)
        self.done: dict[str, Any] = {}
        self.intents: dict[str, dict[str, Any]] = {}
        self.max_id = 0
        self.lines = 0
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            for raw in f:
                self._apply(raw)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _apply(self, raw: bytes) -> None:
        try:
            entry = json.loads(raw)
            op = entry["op"]
        except (ValueError, KeyError, TypeError):
            return  # a torn last line: its write never finished, so its op was not acknowledged
        self.lines += 1
        if entry.get("abandon"):  # the write raised: nothing of it was applied
            self.intents.pop(op, None)
            return
        if "intent" in entry:
            self.intents[op] = entry
            return
        self.intents.pop(op, None)
        self.done[op] = entry.get("result")
        ids = entry.get("ids")
        if ids:
            self.max_id = max(self.max_id, max(id_number(i) for i in ids))

    def _write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        os.write(self._fd, line)  # one write: survives the process being killed
        self._apply(line)
        if self.lines > 2 * KEEP:
            self._rewrite()

    def intent(self, op: str, items: Iterable[Mapping[str, Any]]) -> None:
        self._write({"op": op, "intent": [fingerprint(i) for i in items], "after": self.max_id})

    def finish(self, op: str, result: Any, ids: list[str] | None = None) -> None:
        entry: dict[str, Any] = {"op": op, "result": result}
        if ids is not None:
            entry["ids"] = ids
        self._write(entry)

    def abandon(self, op: str) -> None:
        """The operation raised (a bad item, say): forget its intent."""
        self._write({"op": op, "abandon": True})

    def recover(self, op: str, memories: Iterable[Any]) -> list[str] | None:
        """The ids of a batch whose intent has no result: its memories if the write
        happened before the shard died (found by fingerprint, in id order, after the
        intent's highest id), else ``None`` (not written: apply it now)."""
        intent = self.intents.get(op)
        if intent is None:
            return None
        wanted: list[str] = intent["intent"]
        after = intent["after"]
        fresh = sorted((m for m in memories if id_number(m.id) > after), key=lambda m: id_number(m.id))
        prints = [fingerprint({"text": m.text, "type": m.type, "session": m.session}) for m in fresh]
        for start in range(len(fresh) - len(wanted) + 1):
            if prints[start : start + len(wanted)] == wanted:
                return [m.id for m in fresh[start : start + len(wanted)]]
        return None

    def _rewrite(self) -> None:
        """Keep the newest KEEP results (and every pending intent): a temporary file, then rename."""
        keep = list(self.done.items())[-KEEP:]
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.writelines(json.dumps({"op": op, "result": result}, separators=(",", ":")).encode() + b"\n"
                         for op, result in keep)  # fmt: skip
            f.writelines(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in self.intents.values())
            f.write(json.dumps({"op": "_max", "result": None, "ids": [f"m{self.max_id}"]}).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o600)
        self.done = dict(keep)
        self.lines = len(keep) + len(self.intents) + 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

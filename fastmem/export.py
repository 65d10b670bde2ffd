"""A memory as JSON and back: the shape ``fastmem export`` writes and ``fastmem import``
reads, and the MCP server's tools return.

One memory is one JSON object with the fields of :data:`EXPORT_FIELDS` (``fastmem export
--vectors`` adds ``"embedding"``). Metadata may hold ``bytes`` (the store keeps msgpack,
JSON has no bytes): they are written as ``{"$bytes": "<base64>"}`` and read back as bytes.

>>> from fastmem.types import Memory
>>> m = Memory("m7", "The user prefers tea.", "fact", 1.5e9, None, 0.9, True, {"raw": b"\\x00"}, None)
>>> line = memory_dict(m)
>>> line["id"], line["metadata"]
('m7', {'raw': {'$bytes': 'AA=='}})
>>> from_jsonable(line["metadata"])
{'raw': b'\\x00'}
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Memory

__all__ = ["BYTES_TAG", "EMBEDDING_FIELD", "EXPORT_FIELDS", "from_jsonable", "memory_dict", "to_jsonable"]

# The fields export writes and import reads back; "id" is written for reference only (a
# store numbers its memories itself, so imported ones get new ids).
EXPORT_FIELDS = ("id", "text", "type", "timestamp", "session", "importance", "pinned",
                 "metadata", "summary")  # fmt: skip
EMBEDDING_FIELD = "embedding"  # the stored vector, with `fastmem export --vectors`
BYTES_TAG = "$bytes"  # metadata may hold bytes (msgpack does, JSON does not): base64 under this key


def memory_dict(memory: Memory) -> dict[str, Any]:
    """``memory``'s fields of :data:`EXPORT_FIELDS` as a JSON-ready dict (bytes tagged)."""
    return {name: to_jsonable(getattr(memory, name)) for name in EXPORT_FIELDS}


def to_jsonable(value: Any) -> Any:
    """``value`` with every ``bytes`` inside it (dicts, lists, tuples) as ``{"$bytes": base64}``."""
    if isinstance(value, bytes):
        return {BYTES_TAG: base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def from_jsonable(value: Any) -> Any:
    """The inverse of :func:`to_jsonable` (tuples come back as lists).

    Raises:
        ValueError: a ``{"$bytes": ...}`` value is not valid base64.
    """
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(BYTES_TAG), str):
            return base64.b64decode(value[BYTES_TAG], validate=True)
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value

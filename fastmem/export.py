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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Memory

__all__ = [
    "BYTES_TAG", "EMBEDDING_FIELD", "EXPORT_FIELDS", "SUPERSEDED_BY", "from_jsonable", "memory_dict",
    "relink", "to_jsonable", "unlink",
]  # fmt: skip

# The fields export writes and import reads back; "id" is written for reference only (a
# store numbers its memories itself, so imported ones get new ids).
EXPORT_FIELDS = ("id", "text", "type", "timestamp", "session", "importance", "pinned",
                 "metadata", "summary")  # fmt: skip
EMBEDDING_FIELD = "embedding"  # the stored vector, with `fastmem export --vectors`
# The metadata key of a memory replaced by a newer one (``add``'s ``supersedes``): the newer
# one's id, which an import maps to the id the newer one gets there.
SUPERSEDED_BY = "superseded_by"
BYTES_TAG = "$bytes"  # metadata may hold bytes (msgpack does, JSON does not): base64 under this key


def memory_dict(memory: Memory) -> dict[str, Any]:
    """``memory``'s fields of :data:`EXPORT_FIELDS` as a JSON-ready dict (bytes tagged)."""
    return {name: to_jsonable(getattr(memory, name)) for name in EXPORT_FIELDS}


def to_jsonable(value: Any) -> Any:
    """``value`` with every ``bytes`` inside it (dicts, lists, tuples) as ``{"$bytes": base64}``."""
    if isinstance(value, bytes):
        import base64  # here: most stores' metadata holds no bytes

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
            import base64

            return base64.b64decode(value[BYTES_TAG], validate=True)
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


def unlink(metadata: Any) -> tuple[Any, Any]:
    """An imported memory's ``metadata`` without its link to a newer memory (``None`` when
    nothing else is left), and that link (``None``: none). The link names the exporting
    store's id; :func:`relink` maps it once every memory is imported."""
    if not isinstance(metadata, dict) or SUPERSEDED_BY not in metadata:
        return metadata, None
    rest = {k: v for k, v in metadata.items() if k != SUPERSEDED_BY}
    return rest or None, metadata[SUPERSEDED_BY]


def relink(imported: list[tuple[Any, Any, Any, str]]) -> list[tuple[str, dict[str, Any]]]:
    """The updates that link imported memories to their successors' new ids: for each
    ``(exported id, metadata, link, new id)``, ``(new id, metadata with the new link)`` when
    the link names an imported memory; a link to one not imported is dropped (``add``'s
    ``supersedes`` would refuse it too)."""
    new_ids = {old: new for old, _, _, new in imported if isinstance(old, str)}
    return [
        (new, {**(metadata or {}), SUPERSEDED_BY: new_ids[link]})
        for _, metadata, link, new in imported
        if isinstance(link, str) and link in new_ids
    ]

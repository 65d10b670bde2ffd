"""The newest truth: a memory replaced by a newer one (``add(..., supersedes=old)``).

The caller knows when a new memory updates an old one ("moved to Berlin" after "lives in
Paris", a corrected figure); the store keeps that link, and contexts show the newest live
version in place of the old one. Telling it from the texts alone was measured and does
not work (README, recall: 4-18% precision), so the store does not guess.

The link is the old memory's metadata key :data:`KEY` (the new memory's id), an ordinary
update record right after the new memory's record, in the same write (one append: both
or neither). No new record kind or field: replay, compaction (which folds metadata into
the memory record), backups, exports and older readers carry it as any metadata. The old
memory stays (``get`` and ``search`` find it: history questions still can).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .. import _format as fmt
from ..storage.engine import Engine
from ..storage.index import F_FLAGS, F_ID, F_META, update_changes
from ..storage.records import Batch, check_metadata
from ..export import SUPERSEDED_BY
from ..types import Memory

KEY = SUPERSEDED_BY  # export names it: an import maps its ids


def write_update(engine: Engine, g: int, row: tuple[Any, ...], payload: dict[str, Any]) -> None:
    """Append the update record ``payload`` of live row ``g`` and apply it to the index
    (under ``engine.writing()``)."""
    offset = engine.append_change(fmt.KIND_UPDATE, payload)
    engine.note_change(g, row)
    engine.index.change(g, update_changes(row[F_FLAGS], payload, offset))


def commit(engine: Engine, batch: Batch, vectors16: Any, old: str) -> list[str]:
    """Commit the one memory of ``batch`` as the newer version of live memory ``old``
    (under ``engine.writing()``); returns its id in a list, as ``commit_memories`` does.

    Raises:
        UnknownMemoryError: ``old`` is no live memory's id (nothing is written).
        InvalidInputError: ``old``'s metadata would be over the size limit with the link.
    """
    g, row = engine.live_row(old)
    # The id the new memory gets (commit_memories numbers from next_id, under the lock).
    link = f"m{engine.index.next_id}"
    metadata = check_metadata({**(_metadata(engine, g, row) or {}), KEY: link})
    change = {"i": row[F_ID], "t": time.time(), "m": metadata}
    return engine.commit_memories(batch, vectors16, (g, change))


def keep_link(engine: Engine, g: int, row: tuple[Any, ...], metadata: Any) -> dict[str, Any] | None:
    """``metadata`` checked for ``update`` of row ``g``: a superseded memory keeps its link
    (the caller replaces its own keys, not the store's record of what replaced the memory).

    Raises:
        InvalidInputError, InvalidTypeError: as ``check_metadata``.
    """
    checked = check_metadata(metadata)
    link = _link(_metadata(engine, g, row))
    if checked is None or link is None or KEY in checked:
        return checked
    return check_metadata({**checked, KEY: link})


def newest(engine: Engine, g: int, memory: Memory | None = None) -> int | None:
    """The row of the newest live memory that replaces row ``g`` (the links followed to
    the end), or ``None`` when none does. A link to a forgotten memory ends the chain
    there; a link that is not to a newer memory (written by hand into metadata) is ignored,
    so the walk always ends. ``memory``: row ``g``'s, when the caller has it fresh."""
    index = engine.index
    row = index.row(g)
    found = None
    link = _link(memory.metadata if memory is not None else _metadata(engine, g, row))
    while link is not None:
        digits = link[1:]
        if link[:1] != "m" or not digits.isdigit() or not digits.isascii() or len(digits) > 20:
            break
        number = int(digits)
        if number <= row[F_ID]:
            break
        g, newer = index.find_row(number)
        if newer is None or newer[F_FLAGS] & fmt.FLAG_FORGOTTEN:
            break
        found, row = g, newer
        link = _link(_metadata(engine, g, row))
    return found


def newest_first(
    engine: Engine, found: Iterable[tuple[int, float, Any, Any]], passes: Callable[[int], bool]
) -> Iterator[tuple[int, float, Any, Any]]:
    """A hybrid search's ``found`` rows ``(row, score, cosine, BM25)``, best first, with the
    newest truth first: a superseded memory's newest live version (:func:`newest`) takes
    its place and score when it ranked lower or not at all, and the old memory follows it
    (search keeps the history, as ``get`` does; a context shows the newest version alone).
    A version that ``passes`` (the search's filters) rejects is not brought in; each row
    comes once. Lazy: the caller reads only as many as it keeps."""
    found = list(found)
    ranked = {g: (cosine, keyword) for g, _, cosine, keyword in found}
    listed: set[int] = set()
    for g, score, cosine, keyword in found:
        linked = engine.index.row(g)[F_META] or engine.cached_memory(g).metadata is not None
        newer = newest(engine, g) if linked else None
        if newer is not None and newer not in listed and passes(newer):
            listed.add(newer)
            yield (newer, score, *ranked.get(newer, (None, None)))
        if g not in listed:
            listed.add(g)
            yield (g, score, cosine, keyword)


def newest_id(engine: Engine, g: int, memory: Memory) -> str | None:
    """:func:`newest` as an id (what ``Hit.superseded_by`` says)."""
    if memory.metadata is None and not engine.index.row(g)[F_META]:
        return None  # the common case: no metadata, no link
    found = newest(engine, g, memory)
    return None if found is None else f"m{engine.index.row(found)[F_ID]}"


def _metadata(engine: Engine, g: int, row: tuple[Any, ...]) -> Any:
    """Row ``g``'s current metadata. An update's is read from its record: a decoded memory
    in the cache may be older than the update (another handle, or this one, wrote it)."""
    if row[F_META]:
        _, update = fmt.read_record(engine.data(), row[F_META], engine.dat_end, engine.dat_path)
        return update.get("m")
    return engine.cached_memory(g).metadata


def _link(metadata: Any) -> str | None:
    link = metadata.get(KEY) if isinstance(metadata, dict) else None
    return link if isinstance(link, str) else None

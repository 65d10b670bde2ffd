"""What ``add`` and ``add_many`` accept: every argument checked before anything is written,
and each item turned into its record payload (with summary, token counts and vector).

The checks raise :class:`InvalidInputError` or :class:`InvalidTypeError` naming the item
and the field; nothing here touches a file.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack
import numpy as np

from .. import _format as fmt
from .. import _kernels
from .index import (
    F_FLAGS,
    F_ID,
    F_IMPORTANCE,
    F_LENGTH,
    F_OFFSET,
    F_TS,
    Quantized,
    QuantizedBlock,
    default_importance,
    session_hash,
)  # fmt: skip
from .fileio import no_cyclic_gc
from .keyword_index import tokenize
from .replay import read_payload
from .._threads import Beside
from .vectors import BlockedVectors, to_float16, to_float16_quantized
from ..embed import Embedder
from ..errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidInputError,
    InvalidTypeError,
    UnknownMemoryError,
)
from ..summarize import KeySentences, Summarizer
from ..tokens import TokenCounter
from ..types import ContextPolicy, Memory

SUMMARY_TOKENS = 64  # a summary's bound, whoever writes it
STORED_ENCODING = "cl100k_base"  # the token counts kept in the index; others count on demand
ADD_KEYS = frozenset(
    ("text", "type", "timestamp", "session", "importance", "pinned", "metadata", "summary",
     "embedding")
)  # fmt: skip


class Prepared:
    """One checked item of a batch: its record payload and the fields its index row takes."""

    __slots__ = ("payload", "type_name", "session", "importance", "flags", "embedding")

    def __init__(
        self, payload: dict[str, Any], type_name: str, session: str | None, importance: float,
        flags: int, embedding: Any,
    ) -> None:  # fmt: skip
        self.payload = payload
        self.type_name = type_name
        self.session = session
        self.importance = importance
        self.flags = flags
        self.embedding = embedding


def parse_id(mid: Any) -> int:
    if not isinstance(mid, str):
        raise InvalidTypeError(f"a memory id is a string like 'm42', not {type(mid).__name__}")
    if len(mid) < 2 or len(mid) > 21 or mid[0] != "m" or not mid[1:].isdigit() or not mid[1:].isascii():
        raise UnknownMemoryError(f"no memory has the id {mid!r}")
    return int(mid[1:])


_F32, _F32_BITS = struct.Struct("<f"), struct.Struct("<I")
# The types' default importances (and 1.0) are what most rows hold: known from the start,
# a restart's first memories need not work them out (issue 21: 0.5, a power of two, goes
# to numpy's formatter, whose first use costs a fresh process ~45 µs). Each is the decimal
# numpy prints for its float32 (tests/test_store.py checks).
_F32_SHORT: dict[float, float] = {
    _F32.unpack(_F32.pack(v))[0]: v for v in (*fmt.DEFAULT_IMPORTANCE.values(), 1.0)
}
_F32_MAX = float(np.finfo(np.float32).max)


def f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (0.3, not 0.30000001)."""
    short = _F32_SHORT.get(x)
    if short is None:
        short = _shortest_f32(x)
        if len(_F32_SHORT) < 4096:  # importances repeat: keep the common ones
            _F32_SHORT[x] = short
    return short


def _shortest_f32(x: float) -> float:
    """``float(str(np.float32(x)))`` without numpy's formatter, whose first use costs a
    fresh process ~45 µs (a restart's first memory): the fewest significant digits whose
    correctly rounded decimal reads back as the same float32. Where that decimal is the
    shortest (every float32 whose neighbours are equally far, i.e. all but powers of two
    and non-finite values), it is what numpy prints; numpy answers for the others."""
    try:
        single = _F32.unpack(_F32.pack(x))[0]
        mantissa = _F32_BITS.unpack(_F32.pack(single))[0] & 0x7FFFFF
        if single != 0.0 and math.isfinite(single) and mantissa:
            for digits in range(1, 10):  # 9 significant digits always read back (IEEE 754)
                short = float(f"{single:.{digits}g}")
                if abs(short) <= _F32_MAX and _F32.unpack(_F32.pack(short))[0] == single:
                    return short
    except OverflowError:  # beyond float32's range
        pass
    return float(str(np.float32(x)))


def check_str(value: Any, name: str, max_chars: int, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > max_chars:
        raise InvalidInputError(f"{name} must have 1 to {max_chars} characters")
    check_utf8(value, name)
    return value


def type_names(types: Iterable[str] | None) -> list[str] | None:
    """A search's ``types``, listed and checked (``None``: every type)."""
    if isinstance(types, str):
        raise InvalidTypeError("types must be an iterable of type names, not one name")
    names = None if types is None else list(types)
    for name in names or ():
        check_str(name, "a type", fmt.MAX_TYPE_CHARS, optional=False)
    return names


def check_utf8(value: str, name: str) -> None:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidInputError(f"{name} is not valid Unicode (lone surrogates)") from None


def check_real(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"{name} must be a number, not {type(value).__name__}")
    x = float(value)
    if not (math.isfinite(x) and lo <= x <= hi):
        raise InvalidInputError(f"{name} must be a finite number from {lo} to {hi}, got {value!r}")
    return x


def check_metadata(metadata: Any) -> dict[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidTypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    try:
        packed = msgpack.packb(dict(metadata), use_bin_type=True)
        value = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(
            f"metadata must hold only msgpack types (str keys, numbers, str, bytes, lists, "
            f"dicts, bool, None): {exc}"
        ) from None
    if not _plain(value, 1):
        raise InvalidInputError(
            "metadata must hold only msgpack types (str keys, numbers, str, bytes, lists, "
            f"dicts, bool, None): no extension types, and nested at most "
            f"{fmt.MAX_PAYLOAD_DEPTH - 1} levels deep"
        )
    if len(packed) > fmt.MAX_METADATA_BYTES:
        raise InvalidInputError(
            f"metadata is {len(packed)} bytes packed; the limit is {fmt.MAX_METADATA_BYTES}: "
            f"keep large content in the memory's text"
        )
    return value


_PLAIN = (str, bytes, int, float, bool, type(None))


def _plain(value: Any, depth: int) -> bool:
    """Only msgpack's own types: a msgpack.ExtType or Timestamp would pack, but it is not
    data every reader understands; and no deeper than a record's payload may nest
    (``value`` is at ``depth`` of the payload)."""
    if depth > fmt.MAX_PAYLOAD_DEPTH:
        return False
    if isinstance(value, dict):
        return all(_plain(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    return isinstance(value, _PLAIN)


def prepare(i: int, item: Any, now: float) -> Prepared:
    """Check item ``i`` of a batch (as ``add`` takes it) and build its record payload."""
    if type(item) is not dict and not isinstance(item, Mapping):
        raise InvalidTypeError(f"item {i} must be a dict, not {type(item).__name__}")
    if not ADD_KEYS.issuperset(item):
        unknown = sorted(map(str, item.keys() - ADD_KEYS))
        raise InvalidInputError(f"item {i} has unknown keys {unknown}")
    get = item.get
    text = get("text")
    if type(text) is not str:
        raise InvalidTypeError(f"item {i}: text must be a string, not {type(text).__name__}")
    if not text or text.isspace():
        raise InvalidInputError(f"item {i}: text is empty")
    if not text.isascii():
        check_utf8(text, "text")
        if len(text) > fmt.MAX_TEXT_BYTES // 4 and len(text.encode()) > fmt.MAX_TEXT_BYTES:
            raise InvalidInputError(f"item {i}: text is over {fmt.MAX_TEXT_BYTES} bytes of UTF-8")
    elif len(text) > fmt.MAX_TEXT_BYTES:
        raise InvalidInputError(f"item {i}: text is over {fmt.MAX_TEXT_BYTES} bytes of UTF-8")
    payload: dict[str, Any] = {"i": 0, "t": now, "x": text}
    ts = get("timestamp")
    if ts is not None:
        payload["t"] = check_real(ts, "timestamp", 0.0, fmt.MAX_TIMESTAMP)
    type_name = get("type")
    if type_name is None or (type(type_name) is str and type_name == "conversation"):
        type_name = "conversation"
    else:
        payload["y"] = check_str(type_name, "type", fmt.MAX_TYPE_CHARS, optional=False)
    session = get("session")
    if session is not None:
        payload["s"] = check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=False)
    importance = get("importance")
    if importance is None:
        importance = default_importance(type_name)
    else:
        importance = check_real(importance, "importance", 0.0, 1.0)
        if importance != default_importance(type_name):
            payload["p"] = importance
    pinned = get("pinned", False)
    if pinned is not False:
        if pinned is not True:
            raise InvalidTypeError(f"item {i}: pinned must be True or False")
        payload["n"] = True
    metadata = get("metadata")
    if metadata is not None:
        payload["m"] = check_metadata(metadata)
    summary = get("summary")
    if summary is not None:
        check_str(summary, "summary", fmt.MAX_SUMMARY_BYTES, optional=False)
        if len(summary.encode()) > fmt.MAX_SUMMARY_BYTES:
            raise InvalidInputError(f"item {i}: summary is over {fmt.MAX_SUMMARY_BYTES} bytes")
        payload["u"] = summary
    return Prepared(payload, type_name, session, importance, fmt.FLAG_PINNED if pinned else 0,
                    get("embedding"))


class Batch:
    """The checked items of one ``add_many``: payloads, and the columns of their index rows.

    ``type_names`` and ``sessions`` list the distinct values in order of first use;
    ``type_index`` gives each item's index into ``type_names`` and ``session_index`` into
    ``sessions`` counting from 1 (0: no session). ``flags`` gains ``FLAG_HAS_VECTOR`` in
    :func:`vectors_for`; ``text_tokens`` and ``summary_tokens`` are
    :func:`summarize_and_count`'s."""

    __slots__ = ("payloads", "texts", "embeddings", "type_names", "type_index", "sessions",
                 "session_index", "importance", "flags", "timestamps", "text_tokens",
                 "summary_tokens", "quantized", "terms", "summarized")  # fmt: skip

    def __init__(self, items: list[Any], now: float) -> None:
        # The items given a summary: every such item is checked by ``prepare`` (the
        # compiled prepare_batch takes only items without one), so a bulk load's payloads
        # need not be looked at one by one for a summary.
        self.summarized: list[int] = []

        def checked(i: int, item: Any, now: float) -> Prepared:
            prepared = prepare(i, item, now)
            if "u" in prepared.payload:
                self.summarized.append(i)
            return prepared

        (self.payloads, self.texts, self.embeddings, self.type_names, self.type_index,
         self.sessions, self.session_index, self.importance, self.flags,
         self.timestamps) = _kernels.prepare_batch(items, now, checked)  # fmt: skip
        # Set by summarize_and_count's result: the token counts of texts and summaries.
        self.text_tokens = self.summary_tokens = np.zeros(0, dtype=np.uint32)
        # The index's int8 rows and scales, and the texts' keyword terms, when made before
        # the writer lock (:func:`prepare_commit`); None: the index makes them. (A list:
        # one pair per PREP_BLOCK items, from vectors_for.)
        self.quantized: Quantized | list[QuantizedBlock] | None = None
        # (A list: one tuple per PREP_BLOCK texts, from keyword_terms.)
        self.terms: tuple[np.ndarray, ...] | list[tuple[np.ndarray, ...]] | None = None

    def __len__(self) -> int:
        return len(self.payloads)


class Block:
    """Memories ``lo:hi`` of a :class:`Batch`, as ``frame_batch`` reads them (a large batch
    is packed a block at a time). Its sessions are those the block uses, renumbered: each
    block hashes only its own."""

    def __init__(self, batch: Batch, lo: int, hi: int) -> None:
        self.payloads = batch.payloads[lo:hi]
        self.type_names, self.type_index = batch.type_names, batch.type_index[lo:hi]
        self.importance, self.flags = batch.importance[lo:hi], batch.flags[lo:hi]
        self.timestamps = batch.timestamps[lo:hi]
        self.text_tokens, self.summary_tokens = batch.text_tokens[lo:hi], batch.summary_tokens[lo:hi]
        index = np.asarray(batch.session_index[lo:hi])
        used = np.unique(index)
        used = used[used > 0]
        number = np.zeros(len(batch.sessions) + 1, dtype=index.dtype)
        number[used] = np.arange(1, len(used) + 1)
        self.session_index = number[index]
        self.sessions = [batch.sessions[i - 1] for i in used.tolist()]

    def __len__(self) -> int:
        return len(self.payloads)


# Items a larger batch's vectors and keyword terms are made at a time (vectors_for,
# keyword_terms): whole-batch arrays cost fresh pages, zeroed by the kernel in huge pages
# (a 200 k batch's float32 rows alone are ~300 MB), where a block's are reused. A multiple
# of the engine's packing block, whose slices of the float16 rows are then views; above
# 5,000, the batch size the benchmarks' peers use, whose calls stay one block. 4,096 did
# as well at 200 k (benchmarks/add_many_big.py).
PREP_BLOCK = 8192

# Items from which a batch's texts are counted by the helper thread and this one together
# (the hand-over costs ~0.1-0.5 ms of waking threads on 2 cores).
BESIDE_MIN = 512
# Seconds this thread waits, once its counts are in, for the helper to return. Returning
# takes the GIL: asked for while this thread runs Python, it is handed over only ~5 ms
# later (the switch interval), and a helper descheduled while holding it stalls this
# thread. Measured at 600 k, batches in turn in one process (load ~3.3): median 8.0-8.5
# µs per memory without the wait, 7.0-7.4 with it, 7.3-7.8 counted alone. A helper the
# machine has descheduled costs at most this.
HELPER_RETURN_WAIT = 0.0005


def prepare_commit(batch: Batch, embedder: Embedder | None, summarizer: Summarizer | None,
                   tokens: TokenCounter, dim: int) -> np.ndarray | BlockedVectors | None:
    """Everything ``add_many`` makes of a checked batch before its writer lock: the float16
    vectors (returned), the summaries and token counts, and the index's int8 rows and
    keyword terms.

    The compiled counter lets the GIL go, so the texts of a large batch are counted by the
    helper thread (:class:`~fastmem._threads.Beside`) while this one makes the vectors and
    terms, then by both (``TokenCounter.count_shared``): on two cores the counting costs
    about half its time. The results and the errors raised are the same, in the same order
    (a bad vector is the error before any of counting's; the helper raises nothing here:
    this thread counts whatever the helper left)."""
    sharing = tokens.count_shared(batch.texts) if len(batch) >= BESIDE_MIN else None
    helper = None if sharing is None else Beside(sharing.work)
    try:
        vectors16 = vectors_for(batch, embedder, dim)
        if sharing is not None:
            batch.terms = keyword_terms(batch.texts)
        # The rest of the counting, here too, and never a wait for the helper (on a loaded
        # machine it may not get a core): whatever it has not finished is counted here.
        text_counts = None if sharing is None else sharing.counts()
        if helper is not None:
            helper.wait(HELPER_RETURN_WAIT)
    finally:
        if helper is not None:
            helper.discard()  # not started yet: it never runs
    batch.text_tokens, batch.summary_tokens = summarize_and_count(
        batch.payloads, summarizer, tokens, text_counts, batch.summarized
    )
    return vectors16


def keyword_terms(texts: list[str]) -> tuple[np.ndarray, ...] | list[tuple[np.ndarray, ...]]:
    """``keyword_index.tokenize`` of the texts; of more than ``PREP_BLOCK`` texts, a list of it
    for each ``PREP_BLOCK`` texts in turn (``MemoryIndex.append`` adds them block by block:
    no array of the whole batch's postings is made)."""
    if len(texts) <= PREP_BLOCK:
        return tokenize(texts)
    # Each block's arrays copied out of the tokenizer's, which are ~3x larger (room for
    # the most terms texts could have): kept until the write, those would be most of a
    # large batch's memory (155 MB of 200,000 texts), and copied, the larger ones are
    # freed and reused by the next block.
    return [
        tuple(part.copy() for part in tokenize(texts[lo : lo + PREP_BLOCK]))
        for lo in range(0, len(texts), PREP_BLOCK)
    ]


def summarize_and_count(
    payloads: list[dict[str, Any]], summarizer: Summarizer | None, tokens: TokenCounter,
    text_counts: list[int] | None = None, given: list[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Give each payload its summary (unless it has one); returns the token counts of the
    texts and of the summaries (0: none), as uint32 arrays: the payloads' ``"k"``.

    Every text is encoded once, in one batch (``text_counts``: counted already). The
    default summarizer (:class:`KeySentences` counting with ``tokens``) returns no summary
    for a text of at most its ``max_tokens`` tokens: such texts are not passed to it, so
    they are not encoded a second time. ``given``: the payloads that came with a summary,
    ascending (None: each payload is looked at)."""
    counts = np.array(
        tokens.count_many([p["x"] for p in payloads]) if text_counts is None else text_counts,
        dtype=np.uint32,
    )
    if given is None:
        given = [j for j, p in enumerate(payloads) if "u" in p]
    summed = list(given)  # the payloads with a summary
    if summarizer is not None:
        if isinstance(summarizer, KeySentences) and summarizer.count == tokens.count:
            long = np.flatnonzero(counts > summarizer.max_tokens).tolist()
            todo = [j for j in long if "u" not in payloads[j]]
        else:
            todo = [j for j, p in enumerate(payloads) if "u" not in p]
        made = summarizer.summarize([payloads[j]["x"] for j in todo]) if todo else []
        if not isinstance(made, list) or len(made) != len(todo):
            raise InvalidInputError("the summarizer must return a list: one summary or None per text")
        for j, summary in zip(todo, made):
            if summary is None:
                continue
            if not isinstance(summary, str):
                raise InvalidTypeError(f"the summarizer returned a {type(summary).__name__}, not a str")
            summary = tokens.truncate(summary.strip(), SUMMARY_TOKENS)
            if summary and summary != payloads[j]["x"]:
                check_utf8(summary, "the summary")
                payloads[j]["u"] = summary
                summed.append(j)
    summary_counts = np.zeros(len(payloads), dtype=np.uint32)
    if summed:
        summary_counts[summed] = tokens.count_many([payloads[j]["u"] for j in summed])
    return counts, summary_counts


def frame_batch(
    batch: Batch | Block, index: Any, first_id: int, vectors16: np.ndarray | BlockedVectors | None
) -> tuple[np.ndarray, bytes, np.ndarray, np.ndarray]:
    """The index rows (``INDEX_DTYPE``, without offsets and lengths) and the framed records
    (``frame_records``: bytes, lengths, CRCs) of a batch whose first id is ``first_id``.
    New type names get their codes in ``index`` (the caller drops them if the write fails)."""
    n = len(batch)
    stored, raw_lens = _kernels.pack_memories(
        batch.payloads, first_id, batch.text_tokens, batch.summary_tokens
    )
    for j in np.flatnonzero(raw_lens >= fmt.COMPRESS_MIN):  # most memories: no call to make
        stored[j], raw_lens[j] = fmt.compress_payload(stored[j])
    codes = [index.type_code(name, create=True) for name in batch.type_names]
    rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
    rows["id"] = np.arange(first_id, first_id + n)
    rows["timestamp"] = batch.timestamps
    rows["type"] = np.array(codes, dtype=np.uint16)[batch.type_index]
    hashes = [0] + [session_hash(session) for session in batch.sessions]
    rows["session"] = np.array(hashes, dtype=np.uint64)[batch.session_index]
    rows["importance"] = batch.importance
    rows["flags"] = batch.flags
    rows["text_tokens"], rows["summary_tokens"] = batch.text_tokens, batch.summary_tokens
    has_vector = None
    if isinstance(vectors16, BlockedVectors):  # (a batch packed whole: all its rows at once)
        vectors16 = vectors16[0 : len(vectors16)]
    if vectors16 is not None:
        has_vector = ((rows["flags"] & fmt.FLAG_HAS_VECTOR) != 0).view(np.uint8)
    data, lengths, crcs = _kernels.frame_records(
        fmt.KIND_MEMORY, stored, raw_lens,
        None if vectors16 is None else vectors16.view(np.uint16), has_vector,
    )  # fmt: skip
    return rows, data, lengths, crcs


def frame_changes(kind: int, payloads: list[dict[str, Any]]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Update or forget records (``kind``) of ``payloads``, framed as ``frame_records`` does:
    bytes, lengths, CRCs."""
    stored, raw_lens = zip(*(fmt.encode_payload(payload) for payload in payloads))
    return _kernels.frame_records(kind, list(stored), np.array(raw_lens, dtype=np.uint32), None, None)


_new_memory = tuple.__new__  # Memory's fields in order, without keyword parsing


class MemoryErased(UnknownMemoryError):
    """The record of a row read a moment before was erased since (another process forgot
    the memory): the call that read the row sees the forget if it looks again."""


def retried_if_erased(call: Any) -> Any:
    """A read of memories, made again when one of them was erased by another process
    between the look at the rows and the read of its record (its next look applies the
    forget; the erase, fastmem.storage.erase, cannot wait for readers, which take no lock)."""

    @functools.wraps(call)
    def retried(*args: Any, **kwargs: Any) -> Any:
        looked_again = False
        for _ in range(8):
            try:
                return call(*args, **kwargs)
            except MemoryErased:
                continue
            except CorruptRecordError:
                # Or read while the erase was halfway through it (half old bytes, half new:
                # its checksum fails). The erase's forget record is written before it
                # begins, so one more look finds the memory forgotten; damage fails again.
                if looked_again:
                    raise
                looked_again = True
        return call(*args, **kwargs)

    return retried



def decode_memory(
    row: tuple[Any, ...], buf: Any, offset: int, end: int, update: Callable[[], Any] | None,
    dat_path: str, idx_path: str, *, precise: bool,
) -> Memory:  # fmt: skip
    """The memory of index row ``row`` from its record at ``offset`` of ``buf`` (``read_payload``'s
    ``precise``), its metadata the one of the update record ``update()`` reads, if any.

    Raises:
        CorruptIndexError: the row points at another record, or at a misplaced update.
        CorruptRecordError: the record is damaged or has no text.
    """
    kind, _, p, record_end = read_payload(buf, offset, end, dat_path, precise=precise)
    if kind != fmt.KIND_MEMORY or p["i"] != row[F_ID] or record_end - offset != row[F_LENGTH]:
        raise CorruptIndexError(
            f"{idx_path}: row of memory m{row[F_ID]} points at another record "
            f"(offset {row[F_OFFSET]}); delete the .idx file to rebuild it",
            path=idx_path,
        )
    text = p.get("x")
    if "e" in p:  # erased since the caller looked at the row: forgotten (fastmem.storage.erase)
        raise MemoryErased(f"no memory has the id 'm{row[F_ID]}' (forgotten)")
    if not isinstance(text, str):
        raise CorruptRecordError(f"{dat_path}: the record at offset {offset} has no text", offset=offset)
    metadata = p.get("m")
    if update is not None:
        changed = update()
        if changed.get("i") != row[F_ID]:
            raise CorruptIndexError(f"{idx_path}: metadata of m{row[F_ID]} is misplaced")
        metadata = changed.get("m")
    return _new_memory(
        Memory,
        (f"m{row[F_ID]}", text, p.get("y", "conversation"), row[F_TS], p.get("s"),
         f32(row[F_IMPORTANCE]), bool(row[F_FLAGS] & fmt.FLAG_PINNED), metadata,
         p.get("u")),
    )  # fmt: skip


def read_rows(engine: Any, rows: Iterable[int]) -> list[Memory]:
    """The memories of live index rows ``rows`` (global row numbers), in that order: by
    ``READ_CHUNK`` rows, each chunk in one compiled call (``_kernels.read_hot`` over the rows
    and the data file) when every memory in it is the plain case, else one by one
    (``engine.get``: the compiled read of a plain one, the general one of the others, which
    gives the same memories or the precise error). What ``recent`` reads: a call per memory
    cost more than its decoding.

    Raises:
        MemoryErased: a record was erased by another process since its row was read.
    """
    g = np.fromiter(rows, dtype=np.int64)
    index, nb = engine.index, engine.index.n_base
    out: list[Memory] = []
    picked = np.empty(len(g), dtype=fmt.INDEX_DTYPE)
    in_base = g < nb
    if in_base.any():
        picked[in_base] = index.base_rows[g[in_base]]
    if not in_base.all():
        picked[~in_base] = index.tail.rows[g[~in_base] - nb]
    with no_cyclic_gc():  # thousands of new tuples and dicts, no cycle: collections would
        for at in range(0, len(g), READ_CHUNK):  # cost more than the reading (twice, at 10k)
            chunk = picked[at : at + READ_CHUNK]
            # A damaged index may name an offset past the file: read_hot answers None, and
            # that chunk goes the slower way, which says what is damaged.
            with memoryview(engine.data()) as view, view[: engine.dat_end] as records:
                memories = _kernels.read_hot(chunk.tobytes(), chunk["offset"].tolist(), records,
                                             len(chunk), Memory, f32)  # fmt: skip
            out += memories if memories is not None else [_get(engine, i) for i in chunk["id"].tolist()]
    return out


def _get(engine: Any, mid: int) -> Memory:
    """``engine.get``, for a row that was live when the caller looked: not found now, it was
    forgotten since (by another process, whose erase this read met)."""
    try:
        return engine.get(f"m{mid}")
    except UnknownMemoryError as exc:
        raise MemoryErased(str(exc)) from exc


# Rows read_rows reads in one call: a memory that is not the plain case (its metadata
# changed by ``update``) sends only its chunk the slower way.
READ_CHUNK = 1024


def session_rows(index: Any, session: str, below: int, n: int) -> list[int]:
    """The global index rows of the ``n`` newest live memories of ``session`` (by the 64-bit
    hash the index keeps of its name: the caller checks each memory's own) whose ids are
    below ``below``, newest id first. From three columns; within the base and within the
    tail ids increase, so each gives its last ``n`` and only those are sorted (a page of a
    long session sorts no more than twice its size)."""
    wanted, picked, ids, offset = session_hash(session), [], [], 0
    for seg in (index.base_rows, index.tail.rows[: index.tail.n]):
        keep = np.flatnonzero((seg["session"] == wanted) & (seg["flags"] & fmt.FLAG_FORGOTTEN == 0)
                              & (seg["id"] < below))[-n:]  # fmt: skip
        picked.append(offset + keep)
        ids.append(seg["id"][keep])
        offset += len(seg)
    rows, order = np.concatenate(picked), np.argsort(np.concatenate(ids), kind="stable")[::-1]
    return rows[order[:n]].tolist()


def vectors_for(batch: Batch, embedder: Embedder | None, dim: int) -> np.ndarray | BlockedVectors | None:
    """Unit float16 vectors (n, dim) for the items that have or get one (zeros elsewhere),
    or None when no item has one. Sets ``batch.quantized``, the index's int8 rows and
    scales of them (made in the same pass).

    A batch of more than ``PREP_BLOCK`` items is done ``PREP_BLOCK`` items at a time (each
    block's items without an embedding embedded in one call): its float32 rows never
    exist whole. Its float16 rows are returned as blocks (:class:`BlockedVectors`), which
    ``add_many`` packs block by block, and ``batch.quantized`` is a list of one pair per
    block. A block whose items all gave float32 arrays (the common case) is only checked
    here: its float16 rows are made again as it is packed, its int8 rows as the index
    takes them (a function in the list), so that neither exists for the whole batch
    (an array the caller changes meanwhile is the caller's race: what is written is
    what it holds then, checked again)."""
    n = len(batch)
    if n <= PREP_BLOCK:
        got = _block_vectors(batch, embedder, dim, 0, n)
        if got is None:
            return None
        batch.quantized = got[1], got[2]
        return got[0]
    halves: list[np.ndarray | Callable[[], np.ndarray] | None] = []
    quantized: list[QuantizedBlock | None] = []
    for lo in range(0, n, PREP_BLOCK):
        hi = min(n, lo + PREP_BLOCK)
        got = _block_vectors(batch, embedder, dim, lo, hi, quantize=False)
        if got is None:
            halves.append(None)
            quantized.append(None)
            continue
        half, q, scales, remakeable = got
        dim = half.shape[1]
        # A block of float32 arrays (the common case) is converted again when it is packed,
        # and quantized again into the index's tail, not kept: the batch's float16 and
        # int8 rows then never exist whole.
        if remakeable:
            halves.append(functools.partial(_float16_again, batch, lo, hi, dim))
            quantized.append(functools.partial(_quantized_again, batch, lo, hi, dim))
        else:
            halves.append(half)
            quantized.append((q, scales))
    if all(h is None for h in halves):
        return None
    sizes = [min(PREP_BLOCK, n - lo) for lo in range(0, n, PREP_BLOCK)]
    # The int8 rows stay in blocks too: the index copies each into its tail.
    batch.quantized = [
        (np.zeros((size, dim), dtype=np.int8), np.zeros(size, dtype=np.float32)) if qs is None
        else qs for qs, size in zip(quantized, sizes)
    ]  # fmt: skip
    blocks = [np.zeros((size, dim), dtype="<f2") if h is None else h for h, size in zip(halves, sizes)]
    return BlockedVectors(blocks, sizes, dim)


def _block_vectors(
    batch: Batch, embedder: Embedder | None, dim: int, lo: int, hi: int, quantize: bool = True
) -> tuple[np.ndarray, Any, Any, bool] | None:
    """``(float16 rows, int8 rows, scales, remakeable)`` of items ``lo:hi`` (zeros for the
    items without a vector; sets their ``FLAG_HAS_VECTOR``), or None when none has one;
    ``remakeable``: every item gave a float32 array (:func:`_float16_again` makes the
    float16 rows again). Errors name the item by its place in the whole batch.
    ``quantize=False``: a remakeable block's int8 rows and scales are not made (None)."""
    embeddings = batch.embeddings[lo:hi] if lo or hi < len(batch) else batch.embeddings
    # The common case first: every item has a float32 array (one copy, no list per item).
    stacked = _kernels.gather_vectors(embeddings, dim)
    remakeable = stacked is not None
    given = None if stacked is not None else [j for j, e in enumerate(embeddings) if e is not None]
    if given is not None and len(given) < len(embeddings) and embedder is not None:
        missing = [j for j, e in enumerate(embeddings) if e is None]
        encoded = embedder.encode([batch.texts[lo + j] for j in missing])
        embeddings = list(embeddings)  # (the batch's own list stays as given)
        for j, vec in zip(missing, encoded):
            embeddings[j] = vec
        given = None
    if given is not None and not given:
        return None
    every = given is None or len(given) == len(embeddings)
    rows = embeddings if every else [embeddings[j] for j in given]  # type: ignore[union-attr]
    if stacked is None:
        stacked = _kernels.gather_vectors(rows, dim)
    try:
        if quantize or not remakeable:
            half, q, scales = to_float16_quantized(rows if stacked is None else stacked, dim)
        else:  # only checked here: made again later (vectors_for)
            half, q, scales = to_float16(rows if stacked is None else stacked, dim), None, None
    except InvalidInputError as exc:
        row = getattr(exc, "row", None)
        if row is not None:
            raise InvalidInputError(f"item {lo + (row if given is None else given[row])}: {exc}") from None
        for j in range(len(embeddings)) if given is None else given:  # find the item to name
            try:
                to_float16([embeddings[j]], dim)
            except InvalidInputError as item_exc:
                raise type(item_exc)(f"item {lo + j}: {item_exc}") from None
        raise InvalidInputError("embeddings have different lengths") from None
    flags = batch.flags[lo:hi]  # (a view: the batch's flags change)
    if every:
        flags |= fmt.FLAG_HAS_VECTOR
        return half, q, scales, remakeable
    vectors = np.zeros((len(embeddings), half.shape[1]), dtype="<f2")
    vectors[given] = half
    flags[given] |= fmt.FLAG_HAS_VECTOR
    assert q is not None and scales is not None  # (quantized above: not remakeable)
    q_all = np.zeros(vectors.shape, dtype=np.int8)
    q_all[given] = q
    scales_all = np.zeros(len(embeddings), dtype=np.float32)  # 0: no vector, as the index has it
    scales_all[given] = scales
    return vectors, q_all, scales_all, False


def _quantized_again(batch: Batch, lo: int, hi: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 rows and scales of items ``lo:hi``, as :func:`_float16_again` makes their
    float16 rows again."""
    _, q, scales = to_float16_quantized(_kernels.gather_vectors(batch.embeddings[lo:hi], dim), dim)
    return q, scales


def _float16_again(batch: Batch, lo: int, hi: int, dim: int) -> np.ndarray:
    """The float16 rows of items ``lo:hi``, each of which gave a float32 array: made again
    as :func:`vectors_for` made them (the same bytes)."""
    return to_float16(_kernels.gather_vectors(batch.embeddings[lo:hi], dim), dim)


def check_ids(ids: Any, name: str) -> set[str]:
    """A list of memory ids, as a set (unknown ids are the caller's to ignore)."""
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        raise InvalidTypeError(f"{name} must be a list of memory ids")
    wanted = set(ids)
    for mid in wanted:
        if not isinstance(mid, str):
            raise InvalidTypeError(f"{name} holds memory ids (strings), not {type(mid).__name__}")
    return wanted


def check_batch(items: Iterable[Mapping[str, Any]], dim: int) -> None:
    """Check items as ``add_many`` would (see ``MemoryStore.check_items``); an embedding must
    have ``dim`` floats, or in an empty store (``dim`` 0) the first embedding's length.

    Raises:
        InvalidInputError: an item is invalid; its ``item`` attribute says which.
    """
    now = 0.0  # no timestamp is kept: any time will do
    for i, item in enumerate(items):
        try:
            prepare(i, item, now)
            embedding = item.get("embedding")
            if embedding is not None:
                dim = dim or to_float16([embedding], 0).shape[1]
                to_float16([embedding], dim)
        except InvalidInputError as exc:
            if exc.item is None:
                message = str(exc)
                exc = type(exc)(message if message.startswith(f"item {i}:") else f"item {i}: {message}")
                exc.item = i
            raise exc from None


DURABILITY = ("always", "batch", "none")
SEARCH_MODES = ("hybrid", "vector", "keyword")
MAX_K = 10_000  # hits a search returns at most


def check_open(
    dim: Any, durability: Any, readonly: Any, timeout: Any, embedder: Any, summarizer: Any,
    policy: Any, default: object,
) -> float:
    """Check ``fastmem.open``'s arguments (``default``: a keyword left out); the timeout."""
    if dim is not None:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= fmt.MAX_DIM:
            raise InvalidInputError(f"dim must be an int from 1 to {fmt.MAX_DIM}, got {dim!r}")
    if not isinstance(durability, str) or durability not in DURABILITY:
        raise InvalidInputError(f"durability must be one of {DURABILITY}, got {durability!r}")
    if not isinstance(readonly, bool):
        raise InvalidTypeError("readonly must be True or False")
    if embedder is not default and embedder is not None and not callable(getattr(embedder, "encode", None)):
        raise InvalidTypeError("embedder must have an encode(list[str]) method, or be None")
    if summarizer is not default and summarizer is not None and not callable(
        getattr(summarizer, "summarize", None)
    ):
        raise InvalidTypeError("summarizer must have a summarize(list[str]) method, or be None")
    if policy is not None and not isinstance(policy, ContextPolicy):
        raise InvalidTypeError("policy must be a fastmem.ContextPolicy")
    return check_real(timeout, "timeout", 0.0, 1e9)


def check_search(
    query: Any, k: Any, types: Any, since: Any, until: Any, session: Any, mode: Any
) -> tuple[float, float, str | None, list[str] | None]:
    """Check ``search``'s arguments; ``(since, until, session, type names)`` as checked."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"k must be an int from 1 to {MAX_K}, got {k!r}")
    lo = -math.inf if since is None else check_real(since, "since", -1e300, 1e300)
    hi = math.inf if until is None else check_real(until, "until", -1e300, 1e300)
    session = check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=True)
    if types is not None and (isinstance(types, str) or not isinstance(types, Iterable)):
        raise InvalidTypeError("types must be a list of type names")
    names = type_names(types)
    if not isinstance(mode, str) or mode not in SEARCH_MODES:
        raise InvalidInputError(f"mode must be 'hybrid', 'vector' or 'keyword', got {mode!r}")
    if isinstance(query, str):
        check_utf8(query, "query")
        if mode != "vector" and len(query) > fmt.MAX_TEXT_BYTES:
            raise InvalidInputError(f"query is over {fmt.MAX_TEXT_BYTES} characters")
    elif mode == "keyword":
        raise InvalidTypeError(f"a keyword query is a string, not {type(query).__name__}")
    return lo, hi, session, names

"""fastmem's public value types: what the store's methods take and return.

Everything here is plain data (named tuples and frozen dataclasses) with no behaviour
beyond checking its own fields, so every module may import it.

The dataclasses' ``__init__`` is written out here rather than generated: ``@dataclass``
compiles each method it makes from source at every import (about 0.6 ms a class, most of
this module's import), while these are compiled once into the bytecode cache. They are
dataclasses all the same (``dataclasses.fields``, ``asdict``, ``replace``, frozen: assigning
a field raises ``FrozenInstanceError``), with the generated repr, equality and hash of
the fields in order (``_fields_methods``); ``tests/test_types.py`` checks each class against
the dataclass ``@dataclass(frozen=True)`` would make from its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple, TypeVar

from .errors import InvalidInputError

__all__ = [
    "DAY",
    "BackupReport",
    "CompactReport",
    "Context",
    "ContextItem",
    "ContextPolicy",
    "EvictionPolicy",
    "Hit",
    "Level",
    "Memory",
    "Problem",
    "RecordInfo",
    "RecordSize",
    "RepairReport",
    "Report",
    "StoreStats",
]

DAY = 86400.0

_T = TypeVar("_T")
_set = object.__setattr__  # a frozen dataclass's __init__ sets its fields past __setattr__


class _Factory:
    """The default of a field made by its ``default_factory``; shown as ``@dataclass`` shows
    it in a signature: ``<factory>``."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY: Any = _Factory()


def _fields_methods(cls: type[_T]) -> type[_T]:
    """Give a dataclass made with ``repr=False, eq=False`` the ``__repr__``, ``__eq__`` and
    ``__hash__`` that ``@dataclass(frozen=True)`` generates: over its fields, in order."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    for name, value in (("_field_names", names), ("_field_values", attrgetter(*names)),
                        ("__repr__", _repr), ("__eq__", _eq), ("__hash__", _hash)):  # fmt: skip
        setattr(cls, name, value)
    return cls


def _repr(self: Any) -> str:
    values = ", ".join(f"{n}={v!r}" for n, v in zip(self._field_names, self._field_values(self)))
    return f"{self.__class__.__qualname__}({values})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return self._field_values(self) == self._field_values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self._field_values(self))


class Problem(NamedTuple):
    """A damaged or inconsistent place found while reading a store."""

    file: str  # "dat" or "idx"
    offset: int  # byte offset in that file (row number for index rows)
    message: str


class Memory(NamedTuple):
    """One stored memory, as ``get``, ``recent``, ``search`` and iteration return it.

    Immutable; a named tuple because ``get`` builds one per call, and a tuple builds
    several times faster than a frozen dataclass.
    """

    id: str
    text: str
    type: str
    timestamp: float
    session: str | None
    importance: float
    pinned: bool
    metadata: dict[str, Any] | None
    summary: str | None


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False, slots=True)
class Hit:
    """A search result: the memory and its score (see ``MemoryStore.search``); a hybrid
    search also reports each component: the approximate cosine and the BM25 score, and the
    importance and recency bonuses added to the fused score (the policy's weights times the
    memory's importance and its recency decay; before the fused score is rescaled so that
    the best hit has 1). ``superseded_by`` is the id of the newest live memory that
    replaces this one (``add``'s ``supersedes``), ``None`` when none does."""

    id: str
    score: float
    memory: Memory
    vector: float | None = None
    keyword: float | None = None
    superseded_by: str | None = None
    importance_bonus: float | None = None
    recency_bonus: float | None = None

    def __init__(
        self, id: str, score: float, memory: Memory, vector: float | None = None,
        keyword: float | None = None, superseded_by: str | None = None,
        importance_bonus: float | None = None, recency_bonus: float | None = None,
    ) -> None:  # fmt: skip
        _set(self, "id", id)
        _set(self, "score", score)
        _set(self, "memory", memory)
        _set(self, "vector", vector)
        _set(self, "keyword", keyword)
        _set(self, "superseded_by", superseded_by)
        _set(self, "importance_bonus", importance_bonus)
        _set(self, "recency_bonus", recency_bonus)


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class Report:
    """What ``verify()`` found. ``ok`` is true when ``problems`` is empty."""

    ok: bool
    problems: list[Problem] = field(default_factory=list)
    records: int = 0  # valid records in the data file
    bytes: int = 0  # both files together

    def __init__(
        self, ok: bool, problems: list[Problem] = _FACTORY, records: int = 0, bytes: int = 0,
    ) -> None:  # fmt: skip
        _set(self, "ok", ok)
        _set(self, "problems", [] if problems is _FACTORY else problems)
        _set(self, "records", records)
        _set(self, "bytes", bytes)


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class ContextPolicy:
    """How a store builds contexts and ranks memories; every field has a default.

    Level 1 (hot restore) is the newest ``recent`` memories, or those of the last
    ``recent_minutes``, or the whole last session (``recent_session``); they may take
    ``recent_share`` of a context's budget. Level 2 preloads the summaries of the
    ``preload`` most important memories in the background, ``preload_chunk`` at a time.
    Level 3 ranks ``candidates`` memories for the query; a hit's full text is read when its
    relevance (0 to 1, relative to the best hit) reaches ``full_text_score``, its summary
    otherwise. Pinned memories may take ``pinned_share`` of the budget.

    Ranking takes the ``candidates`` best memories by vector and by keyword (BM25) and the
    memories next to them in their sessions, adds the two scores as z-scores with their
    weights, smooths each with its neighbours' (``neighbour_weight``), lets a memory rank
    just below (``neighbour_gap``) a neighbour that matches strongly, and adds importance,
    recency and same-session bonuses with their weights. When the query holds an exact
    identifier (a number, a code, a file name, an acronym) that only a few memories hold
    (``ranking.IDENTIFIER_MAX_ROWS``), those memories go up by ``identifier_weight``
    times the spread of the candidates' scores, times the share of such identifiers they
    hold (at 1, the memory holding them all ranks above every memory holding none): it
    must not lose to a vague semantic match. A date in the query (a day such as "3 June,
    2023" or "2023-06-03", or a month, "June 2023"; ``ranking.periods``) is an identifier
    of time: the memories written then (UTC, as the headers show them) are searched for
    too and go up by the same weight. A query word that no memory holds is looked up on the
    keyword side by its inflections ("camped": camp, camping; ``ranking.inflected``).

    Packing spends the budget on evidence. Level 1 takes budget only when the question is
    about the current conversation (no query; ``session`` names the newest memories'
    session; the best match is one of them) or ``recent_always`` asks for it. No found
    memory takes more than ``item_share`` of the budget unless it is the only match (the
    only memory found, or the best one when the vector and the keyword side both rank it
    first: it goes in whole, first, when it fits): a longer one shows its passage that
    matches the query (an excerpt, marked so) or its summary. Found memories go in by value
    per token: relevance times
    ``(DENSITY_TOKENS / tokens) ** length_penalty`` for those longer than
    ``DENSITY_TOKENS`` (0: by relevance alone). When the query names a speaker of the best
    matches (the ``"Name: "`` a conversation turn starts with, a proper name, not a role such
    as ``user``), or is asked in the first person ("I", "my") and the best matches include the
    user's own messages (``user: ``), the other speakers' found memories go in at
    ``other_speaker`` times their priority: a question about one person is answered by that
    person's own turns; a question naming a speaker is also ranked with the embedding of the
    query without that name, as the speaker's own turns say "I", and there a match lifts
    the rows two away (in a dialogue, that speaker's own previous and next turns) as it
    lifts its neighbours (1: all three off). Another speaker's turn from a session in which
    none of the question's speakers takes part among the ranked memories (another
    conversation of a store that holds many) goes in at ``other_conversation`` times that
    again (1: off).
    Importance is the memory's base importance (by type unless given) plus decayed access
    frequency, a recency bonus and a pin bonus.
    """

    recent: int = 4
    recent_minutes: float | None = None
    recent_session: bool = False
    recent_share: float = 0.08
    recent_always: bool = False
    pinned_share: float = 0.3
    preload: int = 1000
    preload_chunk: int = 128
    candidates: int = 64
    full_text_score: float = 0.35
    item_share: float = 0.25
    length_penalty: float = 0.5
    other_speaker: float = 0.7
    other_conversation: float = 0.5
    vector_weight: float = 1.0
    keyword_weight: float = 0.3
    identifier_weight: float = 1.0
    neighbour_weight: float = 0.3
    neighbour_gap: float = 1.0
    importance_weight: float = 0.1
    recency_weight: float = 0.05
    session_weight: float = 0.1
    near_duplicate: float = 0.97
    access_half_life_days: float = 30.0
    access_weight: float = 0.3
    recency_half_life_days: float = 7.0
    pin_bonus: float = 1.0
    embedder_wait: float = 0.5  # seconds a context waits for a loading model
    cache_bytes: int = 16 << 20

    def __init__(
        self, recent: int = 4, recent_minutes: float | None = None, recent_session: bool = False,
        recent_share: float = 0.08, recent_always: bool = False, pinned_share: float = 0.3,
        preload: int = 1000, preload_chunk: int = 128, candidates: int = 64,
        full_text_score: float = 0.35, item_share: float = 0.25, length_penalty: float = 0.5,
        other_speaker: float = 0.7, other_conversation: float = 0.5, vector_weight: float = 1.0,
        keyword_weight: float = 0.3, identifier_weight: float = 1.0, neighbour_weight: float = 0.3,
        neighbour_gap: float = 1.0, importance_weight: float = 0.1, recency_weight: float = 0.05,
        session_weight: float = 0.1, near_duplicate: float = 0.97,
        access_half_life_days: float = 30.0, access_weight: float = 0.3,
        recency_half_life_days: float = 7.0, pin_bonus: float = 1.0, embedder_wait: float = 0.5,
        cache_bytes: int = 16 << 20,
    ) -> None:  # fmt: skip
        _set(self, "recent", recent)
        _set(self, "recent_minutes", recent_minutes)
        _set(self, "recent_session", recent_session)
        _set(self, "recent_share", recent_share)
        _set(self, "recent_always", recent_always)
        _set(self, "pinned_share", pinned_share)
        _set(self, "preload", preload)
        _set(self, "preload_chunk", preload_chunk)
        _set(self, "candidates", candidates)
        _set(self, "full_text_score", full_text_score)
        _set(self, "item_share", item_share)
        _set(self, "length_penalty", length_penalty)
        _set(self, "other_speaker", other_speaker)
        _set(self, "other_conversation", other_conversation)
        _set(self, "vector_weight", vector_weight)
        _set(self, "keyword_weight", keyword_weight)
        _set(self, "identifier_weight", identifier_weight)
        _set(self, "neighbour_weight", neighbour_weight)
        _set(self, "neighbour_gap", neighbour_gap)
        _set(self, "importance_weight", importance_weight)
        _set(self, "recency_weight", recency_weight)
        _set(self, "session_weight", session_weight)
        _set(self, "near_duplicate", near_duplicate)
        _set(self, "access_half_life_days", access_half_life_days)
        _set(self, "access_weight", access_weight)
        _set(self, "recency_half_life_days", recency_half_life_days)
        _set(self, "pin_bonus", pin_bonus)
        _set(self, "embedder_wait", embedder_wait)
        _set(self, "cache_bytes", cache_bytes)
        self.__post_init__()

    def __post_init__(self) -> None:
        for name in ("recent", "preload", "preload_chunk", "candidates", "cache_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"ContextPolicy.{name} must be an int >= 0, got {value!r}")
        for name in ("recent_share", "pinned_share", "full_text_score", "near_duplicate",
                     "item_share", "other_speaker", "other_conversation"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InvalidInputError(f"ContextPolicy.{name} must be from 0 to 1, got {value!r}")
        for name in ("vector_weight", "keyword_weight", "neighbour_weight", "neighbour_gap",
                     "importance_weight", "recency_weight", "session_weight", "access_weight",
                     "pin_bonus", "embedder_wait", "identifier_weight", "length_penalty"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1e6:
                raise InvalidInputError(f"ContextPolicy.{name} must be >= 0, got {value!r}")
        for name in ("access_half_life_days", "recency_half_life_days"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value < 1e6:
                raise InvalidInputError(f"ContextPolicy.{name} must be > 0, got {value!r}")
        if not isinstance(self.recent_always, bool):
            raise InvalidInputError("ContextPolicy.recent_always must be a bool")
        if self.recent_minutes is not None and not (
            isinstance(self.recent_minutes, (int, float)) and self.recent_minutes > 0
        ):
            raise InvalidInputError("ContextPolicy.recent_minutes must be > 0 or None")


class Level(IntEnum):
    """Which level of loading put a memory into a context. Level 2 (the background
    preload) only warms the cache: what it loads enters a context as a search hit."""

    PINNED = 0  # "remember this": every context
    RECENT = 1  # level 1, the hot restore: the newest memories
    FOUND = 3  # level 3, on demand: ranked for the query


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False, slots=True)
class ContextItem:
    """One memory in a context: which level brought it, its score and what was shown."""

    id: str
    level: Level
    score: float
    text: str  # the memory's full text, its summary (``summary``) or an excerpt (``excerpt``)
    summary: bool
    timestamp: float
    session: str | None
    type: str
    excerpt: bool = False  # the passage of a long memory that matches the query
    # Provenance (what ``fastmem context --explain`` and the inspector show): the tokens of
    # this item's line as the context renders it ("[type] (summary) text"), counted alone in
    # the context's encoding; why it was chosen (or, in ``Context.left_out``, why it did
    # not go in); a found memory's approximate cosine and BM25 score (None: not ranked, or
    # no vector side); its place in the ranking (1: the best match; 0: not ranked).
    tokens: int = 0
    reason: str = ""
    vector: float | None = None
    keyword: float | None = None
    rank: int = 0

    def __init__(
        self, id: str, level: Level, score: float, text: str, summary: bool, timestamp: float,
        session: str | None, type: str, excerpt: bool = False, tokens: int = 0, reason: str = "",
        vector: float | None = None, keyword: float | None = None, rank: int = 0,
    ) -> None:  # fmt: skip
        _set(self, "id", id)
        _set(self, "level", level)
        _set(self, "score", score)
        _set(self, "text", text)
        _set(self, "summary", summary)
        _set(self, "timestamp", timestamp)
        _set(self, "session", session)
        _set(self, "type", type)
        _set(self, "excerpt", excerpt)
        _set(self, "tokens", tokens)
        _set(self, "reason", reason)
        _set(self, "vector", vector)
        _set(self, "keyword", keyword)
        _set(self, "rank", rank)

    @property
    def line(self) -> str:
        """This item's line as ``Context.text`` holds it: ``"[type] "`` unless it is a
        conversation turn, ``"(summary) "`` or ``"(excerpt) "`` when it is one, its text."""
        prefix = "" if self.type == "conversation" else f"[{self.type}] "
        return prefix + ("(summary) " if self.summary else "(excerpt) " if self.excerpt else "") + self.text


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class Context:
    """What ``MemoryStore.context`` returns.

    ``text`` is what to give the model; ``tokens`` is its exact token count, never over the
    budget. ``degraded`` is true when no query vector could be made (the model not
    loaded yet and no way to embed the question meanwhile) and the context was built from
    keywords, recency and importance alone; while the default model loads, the question is
    embedded in numpy from the same weights, which is not degraded. Each item says its
    line's ``tokens`` and the ``reason`` it was chosen; ``left_out`` holds the candidates
    that ranked well but did not fit (best first, at most ``LEFT_OUT``), each with the
    ``reason`` it stayed out and the ``tokens`` it would have needed. The headers' tokens
    and the line breaks make up the difference between ``tokens`` and the items' sum.
    """

    text: str
    tokens: int
    budget: int
    items: list[ContextItem]
    encoding: str
    degraded: bool = False
    seconds: float = 0.0
    left_out: list[ContextItem] = field(default_factory=list)

    LEFT_OUT: ClassVar[int] = 12  # the most candidates ``left_out`` lists

    def __init__(
        self, text: str, tokens: int, budget: int, items: list[ContextItem], encoding: str,
        degraded: bool = False, seconds: float = 0.0, left_out: list[ContextItem] = _FACTORY,
    ) -> None:  # fmt: skip
        _set(self, "text", text)
        _set(self, "tokens", tokens)
        _set(self, "budget", budget)
        _set(self, "items", items)
        _set(self, "encoding", encoding)
        _set(self, "degraded", degraded)
        _set(self, "seconds", seconds)
        _set(self, "left_out", [] if left_out is _FACTORY else left_out)

    @property
    def messages(self) -> list[dict[str, str]]:
        """The context as OpenAI chat messages (one system message; none when empty)."""
        if not self.text:
            return []
        return [{"role": "system", "content": self.text}]


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class EvictionPolicy:
    """What ``evict`` forgets; ``fastmem.open(..., evict=EvictionPolicy(...))`` applies it
    at every ``checkpoint()`` and at ``close()``. Pinned memories are never evicted.

    Attributes:
        ttl: seconds a memory of each type lives, by type name (``{"tool_result": 86400}``);
            types not named live forever.
        min_importance: forget memories whose current importance score (the one
            ``importance_scores()`` computes: base importance, accesses, recency) is below.
        max_count: keep at most this many memories (pinned ones count, but stay), forgetting
            the lowest scores first (ties: the oldest).
        max_bytes: keep the live memories' records within this many bytes of the data file
            (what a compaction keeps), forgetting the lowest scores first.
    """

    ttl: Mapping[str, float] | None = None
    min_importance: float | None = None
    max_count: int | None = None
    max_bytes: int | None = None

    def __init__(
        self, ttl: Mapping[str, float] | None = None, min_importance: float | None = None,
        max_count: int | None = None, max_bytes: int | None = None,
    ) -> None:  # fmt: skip
        _set(self, "ttl", ttl)
        _set(self, "min_importance", min_importance)
        _set(self, "max_count", max_count)
        _set(self, "max_bytes", max_bytes)


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class CompactReport:
    """What ``compact()`` did. Sizes are the data file's and the index file's as they were
    on disk before (the index as of the last checkpoint) and after."""

    dat_before: int
    idx_before: int
    dat_after: int
    idx_after: int
    memories: int  # live memories kept
    dropped: int  # forgotten memories whose records are gone
    seconds: float  # the whole compaction
    lock_seconds: float  # the longest time the store's lock was held for it

    def __init__(
        self, dat_before: int, idx_before: int, dat_after: int, idx_after: int, memories: int,
        dropped: int, seconds: float, lock_seconds: float,
    ) -> None:  # fmt: skip
        _set(self, "dat_before", dat_before)
        _set(self, "idx_before", idx_before)
        _set(self, "dat_after", dat_after)
        _set(self, "idx_after", idx_after)
        _set(self, "memories", memories)
        _set(self, "dropped", dropped)
        _set(self, "seconds", seconds)
        _set(self, "lock_seconds", lock_seconds)

    @property
    def bytes_before(self) -> int:
        """Bytes of both files before the compaction."""
        return self.dat_before + self.idx_before

    @property
    def bytes_after(self) -> int:
        """Bytes of both files after the compaction."""
        return self.dat_after + self.idx_after

    @property
    def reclaimed(self) -> int:
        """Bytes of both files given back."""
        return self.bytes_before - self.bytes_after

    @property
    def reclaimed_fraction(self) -> float:
        """The share of ``bytes_before`` given back, from 0.0 to 1.0."""
        return self.reclaimed / self.bytes_before if self.bytes_before else 0.0


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class RepairReport:
    """What ``repair()`` did. ``ok`` when nothing had to be cut away (the index was rebuilt
    all the same)."""

    ok: bool
    memories: int  # live memories in the repaired store
    records: int  # intact records found in the damaged data file
    cut: list[Problem] = field(default_factory=list)  # the regions and records left out
    cut_bytes: int = 0
    damaged_path: str | None = None  # where their bytes were kept (see docs/format.md)
    bytes_before: int = 0
    bytes_after: int = 0

    def __init__(
        self, ok: bool, memories: int, records: int, cut: list[Problem] = _FACTORY,
        cut_bytes: int = 0, damaged_path: str | None = None, bytes_before: int = 0,
        bytes_after: int = 0,
    ) -> None:  # fmt: skip
        _set(self, "ok", ok)
        _set(self, "memories", memories)
        _set(self, "records", records)
        _set(self, "cut", [] if cut is _FACTORY else cut)
        _set(self, "cut_bytes", cut_bytes)
        _set(self, "damaged_path", damaged_path)
        _set(self, "bytes_before", bytes_before)
        _set(self, "bytes_after", bytes_after)


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class BackupReport:
    """What ``backup()`` wrote: ``<path>.dat`` and ``<path>.idx``."""

    path: str
    memories: int
    bytes: int  # both files

    def __init__(self, path: str, memories: int, bytes: int) -> None:
        _set(self, "path", path)
        _set(self, "memories", memories)
        _set(self, "bytes", bytes)


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class StoreStats:
    """A store's figures (``MemoryStore.stats()``), read from the index alone: what
    ``fastmem stats`` prints and the MCP server's stats resource serves."""

    path: str
    memories: int  # live
    forgotten: int  # tombstoned, until compact()
    pinned: int
    with_vector: int
    dim: int
    types: dict[str, int]  # live memories by type name, most first
    sessions: int
    oldest: float | None  # timestamps
    newest: float | None
    text_tokens: int  # cl100k_base tokens of the live memories' texts
    dat_bytes: int
    idx_bytes: int
    backend: str  # "cython" or "python": the kernels in use
    format_version: int  # of the data file and its records (docs/format.md)

    def __init__(
        self, path: str, memories: int, forgotten: int, pinned: int, with_vector: int, dim: int,
        types: dict[str, int], sessions: int, oldest: float | None, newest: float | None,
        text_tokens: int, dat_bytes: int, idx_bytes: int, backend: str, format_version: int,
    ) -> None:  # fmt: skip
        _set(self, "path", path)
        _set(self, "memories", memories)
        _set(self, "forgotten", forgotten)
        _set(self, "pinned", pinned)
        _set(self, "with_vector", with_vector)
        _set(self, "dim", dim)
        _set(self, "types", types)
        _set(self, "sessions", sessions)
        _set(self, "oldest", oldest)
        _set(self, "newest", newest)
        _set(self, "text_tokens", text_tokens)
        _set(self, "dat_bytes", dat_bytes)
        _set(self, "idx_bytes", idx_bytes)
        _set(self, "backend", backend)
        _set(self, "format_version", format_version)


class RecordSize(NamedTuple):
    """One of ``MemoryStore.largest()``: a memory's record bytes and text tokens."""

    id: str
    bytes: int
    tokens: int


@_fields_methods
@dataclass(frozen=True, init=False, repr=False, eq=False)
class RecordInfo:
    """Where and how a memory is stored (``MemoryStore.info()``), from its index row."""

    record_offset: int  # in the data file
    record_bytes: int
    text_tokens: int | None  # None: not counted (a store written before token counts)
    summary_tokens: int | None
    has_vector: bool
    access_count: int
    last_access: float | None
    importance_score: float  # the score eviction and the level-2 preload rank by

    def __init__(
        self, record_offset: int, record_bytes: int, text_tokens: int | None,
        summary_tokens: int | None, has_vector: bool, access_count: int, last_access: float | None,
        importance_score: float,
    ) -> None:  # fmt: skip
        _set(self, "record_offset", record_offset)
        _set(self, "record_bytes", record_bytes)
        _set(self, "text_tokens", text_tokens)
        _set(self, "summary_tokens", summary_tokens)
        _set(self, "has_vector", has_vector)
        _set(self, "access_count", access_count)
        _set(self, "last_access", last_access)
        _set(self, "importance_score", importance_score)

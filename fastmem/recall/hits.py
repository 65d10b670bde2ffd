"""What ranking hands the packer: the ranked rows (:class:`Ranked`) and what the ranking
learnt about the question (:class:`Ranking`); and what both sides read in a text, a
conversation turn's speaker (:func:`speaker_of`) and its words (:data:`WORD`). The packer
takes these and calls nothing of the ranking.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

# A conversation turn's ``"Name: "`` prefix (a name of up to 32 characters, no space or colon).
SPEAKER = re.compile(r"[^\s:]{1,32}: ")
# A word of a question or a text (letters and digits).
WORD = re.compile(r"[^\W_]+")


class Ranked(NamedTuple):
    """One row of :func:`~fastmem.recall.ranking.rank`'s result."""

    row: int
    relevance: float  # 0 to 1: 1 for the best row
    cosine: float | None  # approximate (int8) cosine; None without a vector component
    keyword: float  # BM25 score (0: no keyword match)


class Ranking(NamedTuple):
    """Everything the packer needs from the ranking of one question."""

    hits: list[Ranked]  # best first
    degraded: bool  # no query vector could be made: keywords and recency only
    sole: int = -1  # the row of the only match (:func:`~fastmem.recall.ranking.sole_match`)
    focus: frozenset[str] | None = None  # the question's speakers (``speakers.named_speakers``)
    theirs: frozenset[int] | None = None  # their conversations (``speakers.their_sessions``)


def speaker_of(memory: Any) -> re.Match[str] | None:
    """The ``"Name: "`` prefix of a conversation turn; a memory of another type has no
    speaker (a fact written "Trip: ..." is no turn of someone called Trip)."""
    return SPEAKER.match(memory.text) if memory.type == "conversation" else None

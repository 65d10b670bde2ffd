"""Summaries written once, when a memory is stored: its key sentences, bounded in tokens.

A summarizer is any object with ``summarize(texts: list[str]) -> list[str | None]``
(``None``: the text needs no summary). The default, :class:`KeySentences`, is extractive
and local: no model, no network, microseconds per memory. Pass your own (a local model, an
LLM call) as ``fastmem.open(..., summarizer=...)``; the store still bounds what it returns.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from ._stopwords import STOP_WORDS

__all__ = ["Summarizer", "KeySentences", "split_sentences"]


class Summarizer(Protocol):
    """What ``fastmem.open(summarizer=...)`` takes: anything that summarizes a batch of texts
    (a local model, an LLM call, :class:`KeySentences`)."""

    def summarize(self, texts: list[str]) -> list[str | None]:
        """One summary per text, in order; ``None`` where a text needs none."""
        ...


# A sentence ends at . ! ? or … followed by a space, or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])\s+|\s*\n+\s*")
_WORD = re.compile(r"[^\W_]+")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after ``.``, ``!``, ``?`` or ``…`` followed by a space,
    and at line breaks; empty pieces dropped."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


class KeySentences:
    """Extractive summary: the sentences whose content words recur most in the text, plus
    the first sentence (where people put the point), in their original order, within
    ``max_tokens``. Texts of at most ``max_tokens`` tokens get no summary: they are their
    own summary.

    ``count`` counts tokens exactly (the store passes its tiktoken counter); without one,
    four characters count as a token.
    """

    def __init__(self, max_tokens: int = 64, count: Callable[[str], int] | None = None) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 8:
            raise ValueError(f"max_tokens must be an int >= 8, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.count = count or (lambda s: (len(s) + 3) // 4)

    def summarize(self, texts: list[str]) -> list[str | None]:
        """The key sentences of each text, or ``None`` for a text short enough already."""
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> str | None:
        # Cheap exit first: a token is at least one character.
        if len(text) <= self.max_tokens or self.count(text) <= self.max_tokens:
            return None
        sentences = split_sentences(text)
        words = [[w for w in _WORD.findall(s.lower()) if w not in STOP_WORDS] for s in sentences]
        freq = Counter(w for ws in words for w in set(ws))
        scores = [
            sum(freq[w] for w in ws) / (len(ws) + 4) ** 0.5 + (1.0 if i == 0 else 0.0)
            for i, ws in enumerate(words)
        ]
        chosen: list[int] = []
        used = 0
        for i in sorted(range(len(sentences)), key=lambda i: (-scores[i], i)):
            cost = self.count(sentences[i]) + 1
            if used + cost <= self.max_tokens:
                chosen.append(i)
                used += cost
        if not chosen:  # even the best sentence is too long: its beginning
            return _prefix(sentences[0], self.max_tokens, self.count)
        return " ".join(sentences[i] for i in sorted(chosen))


def _prefix(sentence: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The longest word-boundary prefix of ``sentence`` within ``max_tokens`` (with "…")."""
    words = sentence.split()
    lo, hi = 0, len(words)
    while lo < hi:  # the most words that fit
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + "…") <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + "…" if lo else sentence[: max_tokens] + "…"

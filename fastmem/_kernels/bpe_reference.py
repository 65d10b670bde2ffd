"""The readable reference of the compiled cl100k_base token counter (``fastmem._kernels._ext.bpe``):
tiktoken itself, and the parser of tiktoken's ranks files; re-exported by
``fastmem._kernels.reference`` with the other kernels' references."""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

# cl100k_base's split pattern, as tiktoken holds it; the compiled counter implements exactly
# this one by hand and refuses an encoding with any other.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


def ranks_file(data: bytes) -> dict[bytes, int]:
    """``{token: rank}`` of a ``.tiktoken`` ranks file, as tiktoken's ``load_tiktoken_bpe``
    returns it: each line ``<base64 token> <decimal rank>`` (empty lines skipped), ranks
    below 2**32 - 1.

    Raises:
        ValueError: a line that is not such a line (its number is in the message), or a
            token listed twice.
        TypeError: ``data`` is not bytes.
    """
    if not isinstance(data, bytes):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    ranks: dict[bytes, int] = {}
    lines = 0
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line:
            continue
        token, _, rank = line.partition(b" ")
        if not (token and len(token) % 4 == 0 and rank.isdigit() and len(rank) <= 10
                and int(rank) < 0xFFFFFFFF and _BASE64.fullmatch(token)):  # fmt: skip
            raise ValueError(f"not a tiktoken ranks file (line {number})")
        ranks[base64.b64decode(token, validate=True)] = int(rank)
        lines += 1
    if len(ranks) != lines:
        raise ValueError("a token listed twice")
    return ranks


_BASE64 = re.compile(rb"[A-Za-z0-9+/]*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


class Cl100kCounter:
    """Exact token counts in a tiktoken encoding with cl100k_base's pattern: tiktoken itself,
    ``len(encoding.encode_ordinary(text))``. The compiled twin splits and merges text on its
    own (but for code points its Unicode table does not know) and must count the same.

    Raises:
        ValueError: the encoding's split pattern is not cl100k_base's.
    """

    def __init__(self, source: Any, encode: Callable[[str], list[int]] | None = None) -> None:
        """``source``: a tiktoken encoding with cl100k_base's pattern, or the bytes of a
        ``.tiktoken`` ranks file the caller has checked is cl100k_base's, with ``encode``
        (tiktoken's ``encode_ordinary``). The compiled twin builds its table from the file;
        this one only checks it (:func:`ranks_file`) and counts with ``encode``."""
        if isinstance(source, bytes):
            if not callable(encode):
                raise TypeError("a counter made from a ranks file needs encode()")
            ranks = ranks_file(source)
            if any(not 0 < len(k) <= 255 for k in ranks):
                raise ValueError("a token this counter cannot hold")
            self._encode = encode
            self._token_bytes: Callable[[int], bytes] = {r: k for k, r in ranks.items()}.__getitem__
            return
        if source._pat_str != CL100K_PATTERN:
            raise ValueError("not cl100k_base's pattern: this counter would split it wrongly")
        self._encode = source.encode_ordinary
        self._token_bytes = source.decode_single_token_bytes

    def count(self, text: str) -> int:
        """The number of tokens of ``text`` (special tokens counted as plain text)."""
        return len(self._encode(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """The token count of each text in ``texts``."""
        return [len(self._encode(t)) for t in texts]

    def shared(self, texts: Sequence[str]) -> SharedCount:
        """The counts of ``texts`` made by every thread that calls the result's ``work()``."""
        return SharedCount(self._encode, texts)

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (special tokens as plain text)."""
        return list(self._encode(text))

    def token_ends(self, text: str, limit: int) -> list[int] | None:
        """Where each of the first ``limit`` tokens of ``text`` ends, as character offsets in
        order (fewer when it has fewer); -1 for a token that ends inside a character (its
        UTF-8 split between tokens); None when the text has a lone surrogate."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return None
        ends, at = [], 0
        for token in self._encode(text)[: max(limit, 0)]:
            at += len(self._token_bytes(token))
            inside = at < len(data) and data[at] & 0xC0 == 0x80
            ends.append(-1 if inside else len(data[:at].decode("utf-8")))
        return ends


class SharedCount:
    """One batch's token counts, counted by every thread that calls :meth:`work` at once:
    the texts in steps of ``STEP``, each taken under a lock, counted into the thread's own
    list and copied in unless another thread finished that step first; ``work(steal=True)``
    also counts the steps other threads hold but have not finished (its caller never waits
    for a descheduled thread). When it returns, every count is in."""

    STEP = 64

    def __init__(self, encode: Callable[[str], list[int]], texts: Sequence[str]) -> None:
        self._encode = encode
        self._texts = list(texts)
        self._out: list[int] = [0] * len(self._texts)
        self._state = [0] * -(-len(self._texts) // self.STEP)  # free, taken, counted
        self._lock = threading.Lock()

    def work(self, steal: bool = False) -> int:
        """Count free steps until none is left (and, with ``steal``, the taken ones);
        returns how many steps this call counted first."""
        mine = 0
        while True:
            with self._lock:
                s = next((i for i, state in enumerate(self._state) if state == 0), -1)
                if s >= 0:
                    self._state[s] = 1
                elif steal:
                    s = next((i for i, state in enumerate(self._state) if state == 1), -1)
            if s < 0:
                return mine
            a = s * self.STEP
            local = [len(self._encode(t)) for t in self._texts[a : a + self.STEP]]
            with self._lock:
                if self._state[s] != 2:
                    self._out[a : a + len(local)] = local
                    self._state[s] = 2
                    mine += 1

    def counts(self) -> list[int]:
        """The count of each text; counts what is not counted yet itself."""
        self.work(steal=True)
        return self._out

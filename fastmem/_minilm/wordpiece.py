"""BERT's uncased WordPiece tokenizer in pure Python, for the default model's queries.

What ``tokenizers`` does with all-MiniLM-L6-v2's ``tokenizer.json`` (BertNormalizer with
lowercasing, BertPreTokenizer, WordPiece, ``[CLS] … [SEP]``, cut at 256 tokens), so that a
fresh process can embed its first question before ``tokenizers`` (and onnxruntime) have
loaded: the same ids, tested against ``tokenizers`` itself (``tests/test_wordpiece.py``).
The vocabulary is ``vocab.txt`` beside the model (one token a line, in id order; written by
``tools/build_query_table.py`` from ``tokenizer.json``).

The steps, as ``tokenizers`` takes them:

1. The special tokens (``[CLS]``, ``[MASK]``...) written in the text are cut out of it
   first, as they are (not normalized), and become their own ids.
2. Normalization: control characters, NUL and U+FFFD are dropped, white space becomes a
   space; CJK ideographs get a space on each side; accents are stripped (NFD, then every
   nonspacing mark dropped); each character is lowercased on its own (no final sigma).
3. Pre-tokenization: words split at white space, each punctuation character a word.
4. WordPiece: each word is cut greedily into the longest pieces of the vocabulary (the
   later ones prefixed ``##``); a word that cannot be cut, or of more than 100 characters,
   is ``[UNK]``.

Unicode's tables differ between Python's ``unicodedata`` (Unicode 14 in CPython 3.11) and
the Rust crates ``tokenizers`` is built with (older: a character they do not know is kept as
a letter, neither dropped nor split off). A text is refused (:class:`UnsupportedText`) when
one of its characters could be classed differently by them: one assigned after Unicode 3.2
(the oldest tables ``unicodedata`` carries) that is not a letter, number, symbol or spacing
mark today (a newer punctuation mark, format character or nonspacing mark), or one whose
category changed since 3.2 in a way that changes what the tokenizer does with it (a letter
that became a mark; not a connector that became other punctuation). The caller then uses ``tokenizers``. Every other code point was
compared with ``tokenizers``' ids, alone and between letters (``tests/test_wordpiece.py``).
"""

from __future__ import annotations

import unicodedata

__all__ = ["UnsupportedText", "WordPiece"]

CLS, SEP, UNK = "[CLS]", "[SEP]", "[UNK]"
SPECIAL = ("[PAD]", UNK, CLS, SEP, "[MASK]")
MAX_WORD_CHARS = 100
# Unicode's White_Space property (what Rust's char::is_whitespace tests).
WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)
# CJK ideographs, as BERT's tokenizer lists them (each becomes a word of its own).
CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
       (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip
OTHER = frozenset(("Cc", "Cf", "Co", "Cs"))  # dropped by the normalizer's clean-up
# Categories whose characters the normalizer and pre-tokenizer keep as they are (letters,
# numbers, symbols, spacing marks): a character assigned after Unicode 3.2 in one of these
# is kept by tables that do not know it too (an unknown character is kept as a letter).
PLAIN = frozenset(("Lu", "Ll", "Lt", "Lm", "Lo", "Nd", "Nl", "No", "Sm", "Sc", "Sk", "So", "Mc", "Me", "Cn"))
ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


class UnsupportedText(ValueError):
    """A text this tokenizer cannot promise to split as ``tokenizers`` does."""


def _role(category: str) -> str:
    """What the normalizer and pre-tokenizer do with a character of this category: split it
    off (punctuation), drop it (control, format, private use, nonspacing mark) or keep it."""
    if category[0] == "P":
        return "P"
    return category if category in OTHER or category == "Mn" else "keep"


def _is_cjk(code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in CJK)


class WordPiece:
    """BERT's uncased tokenizer over ``vocab`` (tokens in id order).

    Args:
        vocab: the vocabulary, one token per id.
        max_tokens: the longest id list :meth:`encode` returns, ``[CLS]`` and ``[SEP]``
            included (the model's 256).
    """

    def __init__(self, vocab: list[str], *, max_tokens: int = 256) -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.max_tokens = max_tokens
        self._unk = self.ids[UNK]
        self._special = {token: self.ids[token] for token in SPECIAL}
        self._checked: set[str] = set()  # characters that passed _check
        self._known: dict[str, tuple[int, ...]] = {}  # a word's pieces, once cut

    @classmethod
    def from_file(cls, path: str, **kwargs: int) -> WordPiece:
        """The tokenizer over a ``vocab.txt`` (one token a line, in id order)."""
        with open(path, encoding="utf-8") as f:
            vocab = f.read().split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        return cls(vocab, **kwargs)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, ``[CLS]`` first and ``[SEP]`` last, at most ``max_tokens``.

        Raises:
            UnsupportedText: a character this tokenizer does not take on trust (see the
                module's docstring), or a lone surrogate (no UTF-8 form: ``tokenizers``
                refuses it too).
        """
        ids: list[int] = []
        limit = self.max_tokens - 2
        for piece, special in self._split_special(text):
            if special:
                ids.append(self._special[piece])
            else:
                for word in self._words(piece):
                    ids.extend(self._word_ids(word))
            if len(ids) >= limit:
                break
        return [self._special[CLS], *ids[:limit], self._special[SEP]]

    def _split_special(self, text: str) -> list[tuple[str, bool]]:
        """The text cut at the special tokens written in it (leftmost, longest first)."""
        if "[" not in text:
            return [(text, False)]
        out: list[tuple[str, bool]] = []
        start = at = 0
        while (at := text.find("[", at)) >= 0:
            match = next((t for t in SPECIAL if text.startswith(t, at)), None)
            if match is None:
                at += 1
                continue
            if at > start:
                out.append((text[start:at], False))
            out.append((match, True))
            start = at = at + len(match)
        if start < len(text):
            out.append((text[start:], False))
        return out

    def _normalize(self, text: str) -> str:
        if text.isascii():  # the common case, without a loop over the characters
            if text.isprintable():
                return text.lower()
            out = []
            for c in text:
                if c in WHITE_SPACE and c in "\t\n\r ":
                    out.append(" ")
                elif c.isprintable():
                    out.append(c)
                # any other ASCII control character (NUL, \x0b, \x0c, \x7f...) is dropped
            return "".join(out).lower()
        self._check(text)
        out = []
        for c in text:
            code = ord(c)
            if c in "\t\n\r":
                out.append(" ")
                continue
            if code == 0xFFFD or unicodedata.category(c) in OTHER:
                continue
            if c in WHITE_SPACE:
                out.append(" ")
            elif _is_cjk(code):
                out.append(f" {c} ")
            else:
                out.append(c)
        decomposed = unicodedata.normalize("NFD", "".join(out))
        return "".join(c.lower() for c in decomposed if unicodedata.category(c) != "Mn")

    def _check(self, text: str) -> None:
        checked = self._checked
        for c in text:
            if c.isascii() or c in checked:
                continue
            code = ord(c)
            if 0xD800 <= code <= 0xDFFF:
                raise UnsupportedText("a lone surrogate has no UTF-8 form")
            now, then = unicodedata.category(c), unicodedata.ucd_3_2_0.category(c)
            if _role(now) != _role(then) if then != "Cn" else now not in PLAIN:
                raise UnsupportedText(
                    f"U+{code:04X}'s Unicode properties may differ in tokenizers' tables"
                )
            if len(checked) < 100_000:
                checked.add(c)

    def _words(self, text: str) -> list[str]:
        """Words: split at white space, each punctuation character a word of its own."""
        words: list[str] = []
        for chunk in self._normalize(text).split(" "):
            if not chunk:
                continue
            if chunk.isalnum():
                words.append(chunk)
                continue
            start = 0
            for i, c in enumerate(chunk):
                if c in ASCII_PUNCTUATION or (not c.isascii() and unicodedata.category(c)[0] == "P"):
                    if i > start:
                        words.append(chunk[start:i])
                    words.append(c)
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def _word_ids(self, word: str) -> tuple[int, ...]:
        known = self._known.get(word)
        if known is not None:
            return known
        ids = self._cut(word)
        if len(self._known) < 10_000:
            self._known[word] = ids
        return ids

    def _cut(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first WordPiece."""
        if len(word) > MAX_WORD_CHARS:
            return (self._unk,)
        vocab = self.ids
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                found = vocab.get(piece)
                if found is not None:
                    pieces.append(found)
                    break
                end -= 1
            else:
                return (self._unk,)
            start = end
        return tuple(pieces)

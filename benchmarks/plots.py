"""The README's figures, drawn from the results files the benchmarks write.

    python benchmarks/plots.py

* docs/img/restart.png and docs/img/query-latency.png from results-compare.json
  (``python benchmarks/compare.py``, whose command each figure names);
* docs/img/locomo-recall.png from RESULTS-locomo.md (``LOCOMO_COMMAND``);
* docs/img/beam-recall.png from RESULTS-beam.md (``BEAM_COMMAND``).

Needs matplotlib (``pip install '.[bench]'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "img"
FASTMEM_RED = "#d62728"
LOCOMO_COMMAND = "python benchmarks/locomo.py --baselines --out benchmarks/RESULTS-locomo.md"
BEAM_COMMAND = "python benchmarks/beam.py --baselines --out benchmarks/RESULTS-beam.md"
OTHERS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f", "#17becf", "#e377c2", "#bcbd22"]


def _colors(names: list[str]) -> dict[str, str]:
    """fastmem in red, every other system in a colour of its own."""
    others = iter(OTHERS)
    return {n: FASTMEM_RED if n == "fastmem" else next(others) for n in names}


def _lines(ax: Any, results: dict[str, Any], key: str) -> None:
    sizes = sorted(results, key=int)
    peers = list(dict.fromkeys(p for s in sizes for p in results[s]))
    colors = _colors(peers)
    for peer in peers:
        points = [(int(s), results[s][peer][key]) for s in sizes if key in results[s].get(peer, {})]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=peer, color=colors[peer],
                    linewidth=2.5 if peer == "fastmem" else 1.5, zorder=3 if peer == "fastmem" else 2)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memories in the store")
    ax.grid(True, which="both", alpha=0.3)


def _save(fig: Any, name: str, commands: list[str]) -> None:
    """docs/img/``name``, with the commands that regenerate it along the bottom."""
    fig.text(0.01, 0.01, "; ".join([*commands, "python benchmarks/plots.py"]), fontsize=7,
             alpha=0.7, wrap=True)  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(DOCS / name, dpi=110)


def restart(data: dict[str, Any]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    _lines(ax, data["results"], "restart_ms")
    ax.set_ylabel("ms (median of 5 fresh processes)")
    ax.set_title("Restart: open + the 20 newest memories with text", fontsize=11)
    ax.legend(fontsize=8)
    _save(fig, "restart.png", data["commands"])


def query_latency(data: dict[str, Any]) -> None:
    fig, (vec, kw) = plt.subplots(1, 2, figsize=(10, 4.2))
    _lines(vec, data["results"], "vector_p50_ms")
    vec.set_title("vector top-10, p50", fontsize=11)
    vec.set_ylabel("ms per query")
    _lines(kw, data["results"], "keyword_p50_ms")
    kw.set_title("keyword top-10, p50", fontsize=11)
    vec.legend(fontsize=8)
    kw.legend(fontsize=8)
    _save(fig, "query-latency.png", data["commands"])


def locomo_table(text: str) -> tuple[list[str], dict[str, list[float]]]:
    """The header and rows of a recall results file's first table (RESULTS-locomo.md,
    RESULTS-beam.md)."""
    rows = [line.strip().strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0]][1:]
    return header, {r[0].strip(): [float(c) for c in r[1:]] for r in rows[2:]}


def recall_bars(text: str, name: str, command: str) -> None:
    """Bars of recall by method, overall and per category, from a recall results file."""
    header, table = locomo_table(text)
    fig, ax = plt.subplots(figsize=(8 if len(header) < 8 else 11, 4.2))
    width = 0.8 / len(table)
    colors = _colors(list(table))
    for i, (method, values) in enumerate(table.items()):
        xs = [j + i * width for j in range(len(header))]
        ax.bar(xs, values, width, label=method, color=colors[method])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(header))], header)
    ax.set_ylabel("evidence recall within 1,300 tokens")
    ax.set_ylim(0, 1)
    ax.set_title(text.splitlines()[0].replace(" — ", "\n"), fontsize=10)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    _save(fig, name, [command])


def main() -> None:
    data = json.loads((HERE / "results-compare.json").read_text())
    restart(data)
    query_latency(data)
    recall_bars((HERE / "RESULTS-locomo.md").read_text(), "locomo-recall.png", LOCOMO_COMMAND)
    recall_bars((HERE / "RESULTS-beam.md").read_text(), "beam-recall.png", BEAM_COMMAND)
    print("wrote", ", ".join(str(p.relative_to(HERE.parent)) for p in sorted(DOCS.glob("*.png"))))


if __name__ == "__main__":
    main()

"""Draw the package's layers as docs/img/architecture.svg, from tests/test_structure.py's table
(the order the suite enforces) and the imports it reads from the source.

    python tools/draw_architecture.py [--check]

Each band is a layer, bottom to top; inside it, each row is a floor and each box a module
(a subpackage's modules named without its prefix). On the right, an arrow from a layer to each
lower layer it imports. ``--check`` exits 1 when the checked-in picture is not what this draws
(tests/test_structure.py runs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "architecture.svg"

WIDTH = 980
LABEL_W = 200  # the layers' names, on the left
ARROWS_W = 150  # the imports between layers, on the right
BOX_H = 22
ROW_GAP = 6
BAND_PAD = 10
CHAR_W = 7.2  # a character of the boxes' 12 px monospace text
COLOURS = ["#eef2f7", "#f7f3ea"]

# What each layer is, under its name.
ABOUT = {
    "values": "public values, the format",
    "_kernels": "compiled + numpy references",
    "_minilm": "a query in numpy",
    "models": "vector, tokens, summary",
    "storage": "the storage engine",
    "recall": "rank, then pack",
    "facade": "MemoryStore, open",
    "edge": "CLI, integrations, ui, ray",
}


def _structure():  # the suite's own table, so the picture cannot drift from what it enforces
    sys.path.insert(0, str(ROOT))  # this checkout's package, whatever is installed
    spec = importlib.util.spec_from_file_location("structure", ROOT / "tests" / "test_structure.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _short(layer: str, name: str, subpackage: bool) -> str:
    if subpackage:
        name = name[len(layer) + 1 :] if name != layer else "__init__"
    return name or "__init__"


def draw() -> str:
    s = _structure()
    layers = s.LAYERS
    floor = s.FLOOR
    # the rows of each layer: its floors' module names (the edge: its packages, not every module)
    rows: list[list[list[str]]] = []
    for i, (layer, floors) in enumerate(layers):
        sub = (s.PACKAGE / layer / "__init__.py").exists()
        if layer == "edge":
            rows.append([["__main__", *(f"{p}/" for p in s.EDGE_PACKAGES)]])
            continue
        rows.append([[_short(layer, f"{layer}.{n}" if sub and n else (layer if sub else n), sub)
                      for n in names] for names in floors])  # fmt: skip
    # which layers each layer imports
    uses: dict[int, set[int]] = {i: set() for i in range(len(layers))}
    for name, deps in s.GRAPH.items():
        for dep in deps:
            a, b = floor[name][0], floor[dep][0]
            if a != b:
                uses[a].add(b)
    heights = [2 * BAND_PAD + len(r) * BOX_H + (len(r) - 1) * ROW_GAP for r in rows]
    total = sum(heights) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{total}" '
           f'viewBox="0 0 {WIDTH} {total}" font-family="monospace" font-size="12">',
           '<defs><marker id="a" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
           '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">'
           "fastmem: layers bottom to top; a module imports from lower layers, or from its own "
           "layer's lower floors</text>"]  # fmt: skip
    y = total
    middles = {}
    for i, (layer, _) in enumerate(layers):
        h = heights[i]
        y -= h
        middles[i] = y + h / 2
        out.append(f'<rect x="0" y="{y}" width="{WIDTH}" height="{h}" fill="{COLOURS[i % 2]}" '
                   'stroke="#ccc"/>')  # fmt: skip
        name = layer + ("/" if (s.PACKAGE / layer / "__init__.py").exists() else "")
        out.append(f'<text x="8" y="{y + h / 2 - 3}" font-weight="bold">{escape(name)}</text>')
        out.append(f'<text x="8" y="{y + h / 2 + 12}" font-size="10" fill="#555">'
                   f"{escape(ABOUT.get(layer, ''))}</text>")  # fmt: skip
        ry = y + h - BAND_PAD - BOX_H  # floors from the bottom of the band up
        for names in rows[i]:
            x = LABEL_W
            for n in names:
                w = len(n) * CHAR_W + 12
                out.append(f'<rect x="{x:.0f}" y="{ry}" width="{w:.0f}" height="{BOX_H}" rx="4" '
                           'fill="white" stroke="#888"/>')  # fmt: skip
                out.append(f'<text x="{x + 6:.0f}" y="{ry + 15}">{escape(n)}</text>')
                x += w + 6
            ry -= BOX_H + ROW_GAP
    # the arrows between layers: one column per importing layer
    for k, (i, targets) in enumerate(sorted(uses.items())):
        x = WIDTH - ARROWS_W + 10 + k * (ARROWS_W - 20) / max(1, len(layers) - 1)
        for j in sorted(targets):
            out.append(f'<line x1="{x:.0f}" y1="{middles[i]:.0f}" x2="{x:.0f}" '
                       f'y2="{middles[j] - 4:.0f}" stroke="#555" stroke-width="1" '
                       'marker-end="url(#a)" opacity="0.6"/>')  # fmt: skip
        out.append(f'<circle cx="{x:.0f}" cy="{middles[i]:.0f}" r="3" fill="#555"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in picture")
    args = parser.parse_args()
    svg = draw()
    if args.check:
        if not OUT.exists() or OUT.read_text() != svg:
            print(f"{OUT.relative_to(ROOT)} is out of date: python tools/draw_architecture.py",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    OUT.write_text(svg)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

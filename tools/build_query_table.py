"""Write what fastmem's numpy query path reads beside the packaged int8 model.

fastmem embeds a fresh process's first questions in numpy (``fastmem/_minilm/int8.py``)
while onnxruntime loads, from the same weights onnxruntime runs (``model.onnx.data``). The
numpy path does not parse the ONNX graph (a protobuf message: that needs the ``onnx``
package, which fastmem does not depend on). This script reads the graph once, with
``onnx``, and writes two small files beside it:

* ``int8_table.json``: for every tensor the forward pass reads, its name in BERT's terms
  (``encoder.layer.0.attention.self.query.weight_q``...), dtype, shape and byte range in
  ``model.onnx.data``; the constants of the graph (the attention's scale, LayerNorm's
  epsilon); and the sha256 of ``model.onnx``, ``model.onnx.data`` and ``vocab.txt``, which
  must be those fastmem pins (``fastmem/embed.py``).
* ``vocab.txt``: ``tokenizer.json``'s WordPiece vocabulary, one token a line in id order
  (read in a few milliseconds, where the JSON takes ~15 ms to parse).

It also checks that the graph is the one the numpy path computes: per layer, the int8
products (``MatMulIntegerToFloat`` for query, key and value from one
``DynamicQuantizeLinear``; ``DynamicQuantizeMatMul`` for the three dense layers), the exact
GELU, LayerNorm and SkipLayerNorm, every weight zero point 0 (symmetric int8), and mean
pooling. Run from the repository's root after ``tools/build_model.py``:

    pip install 'onnx<1.18'                  # a tool's dependency, not fastmem's
    python tools/build_query_table.py        # writes the two files
    python tools/build_query_table.py --check  # exits 1 if the committed files differ
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "fastmem" / "models" / "all-MiniLM-L6-v2-int8"
TABLE = "int8_table.json"
VOCAB = "vocab.txt"
DATA_FILE = "model.onnx.data"
LAYERS = 6
# The per-layer sequence of operators the numpy path reproduces (shape plumbing left out).
LAYER_OPS = [
    "MatMulIntegerToFloat", "MatMulIntegerToFloat", "FusedMatMul", "Add", "Softmax",
    "MatMulIntegerToFloat", "MatMul", "DynamicQuantizeMatMul", "Add", "LayerNormalization",
    "DynamicQuantizeMatMul", "Gelu", "DynamicQuantizeMatMul", "SkipLayerNormalization",
]  # fmt: skip
PLUMBING = {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Transpose", "DynamicQuantizeLinear"}
DTYPES = {1: "float32", 3: "int8"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bert_name(name: str) -> str:
    """``bert.encoder.layer.0.attention.self.key.bias`` -> ``encoder.layer.0...`` (the names
    of the float32 model's tensors, which fastmem's numpy helpers use)."""
    return name.removeprefix("bert.")


def build(folder: Path) -> tuple[str, str]:
    """The table's and the vocabulary's text, from the graph in ``folder``."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    for layer in range(LAYERS):  # a layer's nodes, by the name of what they compute
        ops = [n.op_type for n in graph.node if n.op_type not in PLUMBING
               and n.output[0].startswith(f"/bert/encoder/layer.{layer}/")]  # fmt: skip
        if ops != LAYER_OPS:
            sys.exit(f"layer {layer} is not of the form the numpy path computes: {ops}")
    pooling = [n.op_type for n in graph.node if n.op_type not in PLUMBING
               and not n.output[0].startswith(("/bert/", "word_rows"))]  # fmt: skip
    if pooling != ["Cast", "Mul", "ReduceSum", "ReduceSum", "Clip", "Div"]:
        sys.exit(f"the pooling is not a masked mean: {pooling}")
    for node in graph.node:
        if node.op_type in ("LayerNormalization", "SkipLayerNormalization"):
            eps = next(a.f for a in node.attribute if a.name == "epsilon")
            if abs(eps - 1e-12) > 1e-18:
                sys.exit(f"{node.name}: epsilon {eps}, the numpy path uses 1e-12")
        if node.op_type == "Gelu" and node.domain != "com.microsoft":
            sys.exit(f"{node.name}: not the exact (erf) GELU")
    alphas = {a.f for n in graph.node if n.op_type == "FusedMatMul" for a in n.attribute
              if a.name == "alpha"}  # fmt: skip
    if len(alphas) != 1:
        sys.exit(f"attention scales: {alphas}")

    def external(name: str, as_name: str) -> tuple[str, dict[str, object]]:
        init = inits[name]
        ext = {e.key: e.value for e in init.external_data}
        if init.data_location != onnx.TensorProto.EXTERNAL or ext.get("location") != DATA_FILE:
            sys.exit(f"{name} is not in {DATA_FILE}")
        return as_name, {"dtype": DTYPES[init.data_type], "shape": list(init.dims),
                         "offset": int(ext["offset"]), "length": int(ext["length"])}  # fmt: skip

    def zero(name: str) -> None:
        init = inits[name]
        if init.data_location == onnx.TensorProto.EXTERNAL:
            ext = {e.key: e.value for e in init.external_data}
            with open(folder / DATA_FILE, "rb") as f:
                f.seek(int(ext["offset"]))
                raw = f.read(int(ext["length"]))
        else:
            raw = numpy_helper.to_array(init).tobytes()
        if any(raw):
            sys.exit(f"{name}: a weight zero point is not 0 (the numpy path assumes symmetric int8)")

    tensors: dict[str, dict[str, object]] = {}
    for name in inits:
        if name.startswith("bert.") and (name.endswith(".bias") or ".LayerNorm." in name
                                         or "position_embeddings" in name
                                         or "token_type_embeddings" in name):  # fmt: skip
            key, info = external(name, bert_name(name))
            tensors[key] = info
    for key, name in (("embeddings.word_embeddings.weight_q", "bert.embeddings.word_embeddings.weight_int8"),
                      ("embeddings.word_embeddings.weight_scale", "bert.embeddings.word_embeddings.weight_scale")):  # fmt: skip
        tensors[key] = external(name, key)[1]
    for node in graph.node:
        if node.op_type == "MatMulIntegerToFloat":
            weight, scale, zp, bias = node.input[1], node.input[3], node.input[5], node.input[6]
        elif node.op_type == "DynamicQuantizeMatMul":
            weight, scale, zp, bias = node.input[1], node.input[2], node.input[3], node.input[4]
        else:
            continue
        layer = bert_name(bias)[: -len(".bias")]
        tensors[layer + ".weight_q"] = external(weight, layer)[1]
        tensors[layer + ".weight_scale"] = external(scale, layer)[1]
        zero(zp)
    expected = 4 + 2 + LAYERS * (6 * 3 + 4)  # embeddings, word table, per layer
    if len(tensors) != expected:
        sys.exit(f"{len(tensors)} tensors found, {expected} expected")

    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    words = sorted(vocab, key=vocab.__getitem__)
    if [vocab[w] for w in words] != list(range(len(words))) or any("\n" in w or "\r" in w for w in words):
        sys.exit("the vocabulary is not one token per id without line breaks")
    vocab_text = "\n".join(words) + "\n"
    table = {
        "about": "written by tools/build_query_table.py: what fastmem/_minilm/int8.py reads",
        "model.onnx_sha256": sha256(folder / "model.onnx"),
        f"{DATA_FILE}_sha256": sha256(folder / DATA_FILE),
        f"{VOCAB}_sha256": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
        "layers": LAYERS, "heads": 12, "hidden": 384, "max_tokens": 256,
        "attention_scale": alphas.pop(), "layer_norm_epsilon": 1e-12,
        "tensors": dict(sorted(tensors.items(), key=lambda kv: kv[1]["offset"])),  # type: ignore[arg-type,return-value]
    }  # fmt: skip
    return json.dumps(table, indent=1) + "\n", vocab_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files")
    args = parser.parse_args()
    table, vocab = build(MODEL)
    if args.check:
        same = (MODEL / TABLE).read_text() == table and (MODEL / VOCAB).read_text() == vocab
        print("the committed files are up to date" if same else "the committed files differ")
        sys.exit(0 if same else 1)
    (MODEL / TABLE).write_text(table)
    (MODEL / VOCAB).write_text(vocab, encoding="utf-8")
    print(f"{MODEL / TABLE}: sha256 {sha256(MODEL / TABLE)}")
    print(f"{MODEL / VOCAB}: sha256 {sha256(MODEL / VOCAB)}")


if __name__ == "__main__":
    main()

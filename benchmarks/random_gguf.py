"""A random-weight model of a real model's shape, as a GGUF file of any block type, for speed runs.

    python benchmarks/random_gguf.py qwen3-0.6b [--type Q4_K_M] [--out FILE.gguf]

transformers builds the model with the shape below (random weights: speed does not depend on
them), llama.cpp's own ``convert_hf_to_gguf.py`` writes it as f16, and ``llama-quantize`` (built by
``make llama-cpp``) makes the block type. The vocabulary is the real one (Gemma 3's) or SmolLM2's
padded by the converter to the real model's size (Qwen3's), so the LM head costs what it costs in
the real model. The file lands in
``~/.cache/anyspec/test-files/random-<shape>-<type>.gguf`` and is reused; print its path.
Then: ``python benchmarks/forward_rows.py --model <that path>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gguf_models import tiny_model, to_gguf  # noqa: E402
from tokenizer_files import SMOLLM2, SMOLLM2_GGUF, _load, _registry, gemma3_gguf  # noqa: E402

from anyspec.bench.llama import _env, _program  # noqa: E402
from anyspec.fetch import package_file  # noqa: E402
from anyspec.paths import cache_dir  # noqa: E402

SHAPES = {  # the published configs' sizes
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 tie_word_embeddings=True, max_position_embeddings=40960)),
    "gemma3-1b": ("gemma3", dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, layers=26,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                 sliding_window=512, query_pre_attn_scalar=256, tie_word_embeddings=True,
                                 max_position_embeddings=32768)),
}


def random_gguf(shape: str, block_type: str = "Q4_K_M", out: Path | None = None) -> Path:
    arch, config = SHAPES[shape]
    out = out or cache_dir() / "test-files" / f"random-{shape}-{block_type.lower()}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if arch == "gemma3":
        tokenizer = _load(gemma3_gguf())
    else:
        tokenizer = _load(_registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = dict(config)
        tiny_model(arch, tokenizer, folder / "hf", layers=config.pop("layers"), sharp=1.0, **config)
        f16 = to_gguf(folder / "hf", folder / "f16.gguf", "f16")
        partial = out.with_suffix(".partial")
        quantize = _program("llama-quantize")
        subprocess.run([str(quantize), str(f16), str(partial), block_type], check=True, capture_output=True,
                       env=_env(quantize))
        partial.replace(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_K_M", help="a llama-quantize type name")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    print(random_gguf(args.shape, args.type, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time to build the draft/target vocabulary mapping for Qwen2.5 (152k) x Gemma-3 (262k).

Compares a cold build (empty cache), a cached build, and the string-matching method of vLLM and
HF (swap Ġ/▁, compare strings) on the same pair. Tokenizer loading is not counted.

    .venv/bin/python benchmarks/vocab_build.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def timed(fn, repeat: int) -> tuple[tuple[float, float], object]:
    """Median wall and CPU seconds (CPU time shows the cost when other processes share the cores)."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return (statistics.median(wall), statistics.median(cpu)), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, metavar="N",
                        help="each way of building is timed N times; the medians are shown "
                             "(default %(default)s)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import conftest

    from anyspec.vocab import VocabMapping, load_tokenizer
    from anyspec.vocab import cache as vocab_cache
    from anyspec.vocab.analyze import string_match

    target = load_tokenizer(conftest.ggml_vocab_file("qwen2"))
    draft = load_tokenizer(conftest.gemma3_gguf())
    sizes = (len(target), len(draft))

    with tempfile.TemporaryDirectory() as tmp:
        vocab_cache.vocab_cache_dir = lambda: Path(tmp)

        def cold():
            for f in Path(tmp).iterdir():
                f.unlink()
            return VocabMapping(target, draft, *sizes)

        cold_s, mapping = timed(cold, args.repeat)
        cached_s, cached = timed(lambda: VocabMapping(target, draft, *sizes), args.repeat)
        assert cached.from_cache and cached.intersection_size == mapping.intersection_size
        nocache_s, _ = timed(lambda: VocabMapping(target, draft, *sizes, cache=False), args.repeat)

    tables = (mapping.target_token_bytes, mapping.draft_token_bytes)
    string_s, by_string = timed(lambda: string_match(target, draft, *tables, *sizes), args.repeat)
    pairs = [d for d in range(len(by_string)) if by_string[d] >= 0]
    false = sum(1 for d in pairs if tables[1][d] != tables[0][int(by_string[d])])

    print(f"Qwen2 ({sizes[0]:,} tokens, target) x Gemma-3 ({sizes[1]:,} tokens, draft); "
          f"median of {args.repeat}, tokenizer loading not counted\n")
    rows = [
        ("bytes, cold (empty cache, incl. write)", cold_s, mapping.intersection_size, 0),
        ("bytes, no cache", nocache_s, mapping.intersection_size, 0),
        ("bytes, cached", cached_s, cached.intersection_size, 0),
        ("strings (vLLM/HF method)", string_s, len(pairs), false),
    ]
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print(f"{'method':<40} {'wall s':>7} {'CPU s':>7} {'draft ids shared':>17} {'false matches':>14}")
    for name, (wall, cpu), shared, bad in rows:
        print(f"{name:<40} {wall:>7.3f} {cpu:>7.3f} {shared:>17,} {bad:>14,}")


if __name__ == "__main__":
    main()

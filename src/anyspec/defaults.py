"""The tuned defaults, in one place (measured in the README's tuning section, ``benchmarks/tune.py``).

On a 2-core AVX2 CPU, SmolLM2-135M -> Qwen2.5-Coder-1.5B in bf16: a round drafts up to 5 tokens and
stops early after a token the draft itself gives less than 0.5; scoring 6 rows costs about 1.4x one.
"""

NUM_SPECULATIVE_TOKENS = 5
DRAFT_CONFIDENCE = 0.5

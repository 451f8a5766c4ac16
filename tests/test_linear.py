"""The CPU linear kernels swapped in by the transformers backend (backends/linear.py)."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROMPTS, noisy_copy, tiny
from tiny_models import one_thread  # noqa: F401  (autouse fixture)
from torch import nn

from anyspec.backends.linear import Int8Linear, OneDNNLinear, onednn_available, swap_linears
from anyspec.backends.transformers import TransformersModel, resolve_dtype
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.errors import ConfigError

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


def linear(n_in=96, n_out=200, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_equals_nn_linear(bias):
    lin = linear(bias=bias)
    x = torch.randn(2, 7, 96)
    torch.testing.assert_close(OneDNNLinear(lin)(x), lin(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_close_to_nn_linear(bias):
    lin = linear(bias=bias)
    x = torch.randn(3, 96)
    want, got = lin(x), Int8Linear(lin)(x)
    assert got.dtype == torch.float32
    # int8 weights and bf16 inputs: about 1% of the output's scale, never exact
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    assert not torch.equal(got, want)


@pytest.mark.parametrize("kernel", ["int8", pytest.param("onednn", marks=needs_onednn)])
def test_rows_do_not_depend_on_how_many_come_together(kernel):
    """Verifying k tokens must score each one as decoding it alone would."""
    module = nn.Sequential(linear(n_in=256, n_out=512))
    swap_linears(module, kernel)
    x = torch.randn(9, 256)
    together = module(x)
    for m in (1, 2, 4, 5, 8):
        alone = torch.cat([module(x[i:i + m]) for i in range(0, 9, m)])
        if kernel == "int8":
            assert torch.equal(alone, together), m
        else:
            torch.testing.assert_close(alone, together, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("kernel,cls", [("int8", Int8Linear),
                                        pytest.param("onednn", OneDNNLinear, marks=needs_onednn)])
def test_swap_replaces_every_linear_and_keeps_the_model_close(tok_qwen2, kernel, cls):
    model = tiny("qwen2", tok_qwen2, seed=0)
    ids = torch.tensor([tok_qwen2.encode(PROMPTS[0])])
    before = model.model(input_ids=ids).logits
    n_linear = sum(type(m) is nn.Linear for m in model.model.modules())
    assert swap_linears(model.model, kernel) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in model.model.modules())
    assert sum(isinstance(m, cls) for m in model.model.modules()) == n_linear
    after = model.model(input_ids=ids).logits
    tolerance = 1e-4 if kernel == "onednn" else 0.05 * before.abs().max()
    assert (after - before).abs().max() < tolerance


def test_int8_target_speculative_greedy_equals_int8_target_alone(tok_qwen2, tok_llama2):
    """Lossless against the model as loaded: an int8 target with and without a draft."""
    target = tiny("qwen2", tok_qwen2, seed=0)
    swap_linears(target.model, "int8")
    draft = noisy_copy(tiny("qwen2", tok_qwen2, seed=0), 0.3, seed=5)
    swap_linears(draft.model, "int8")
    other_draft = tiny("llama", tok_llama2, seed=1)
    swap_linears(other_draft.model, "int8")
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    accepted = 0
    for d in (draft, other_draft):
        spec = Engine(target, d, SpeculativeConfig(num_speculative_tokens=4, draft_sample_method="greedy"))
        alone = Engine(target, None)
        for prompt in PROMPTS[:4]:
            result = spec.generate(prompt, params)
            assert result.token_ids == alone.generate(prompt, params).token_ids
            accepted += result.stats.accepted
    assert accepted > 0


def test_resolve_dtype_names_and_draft_default():
    assert resolve_dtype("float32") == "fp32"
    assert resolve_dtype(torch.bfloat16) == "bf16"
    assert resolve_dtype("int8") == "int8"
    assert resolve_dtype("auto", draft=True) == "int8"  # the draft's numbers never reach the output
    assert resolve_dtype(None) in ("fp32", "bf16")
    with pytest.raises(ConfigError, match="unknown dtype 'int4'"):
        resolve_dtype("int4")


def test_model_reports_its_dtype(tok_qwen2):
    model = tiny("qwen2", tok_qwen2, seed=0)
    assert TransformersModel(model.model, tok_qwen2).dtype == "fp32"

"""The CPU linear kernels swapped in by the transformers backend (backends/linear.py)."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROMPTS, noisy_copy, tiny
from tiny_models import one_thread  # noqa: F401  (autouse fixture)
from torch import nn

from anyspec.backends.linear import (
    Int8Linear,
    OneDNNLinear,
    RowwiseLinear,
    int8_weights,
    onednn_available,
    rowwise_attention,
    rowwise_available,
    swap_linears,
)
from anyspec.backends.load import resolve_dtype
from anyspec.backends.transformers import TransformersModel
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.errors import ConfigError

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
needs_rowwise = pytest.mark.skipif(not rowwise_available(), reason="anyspec's AVX2 kernel is not built here")
ROWWISE = [pytest.param("bf16", marks=needs_rowwise), pytest.param("int8", marks=needs_rowwise)]


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


@needs_rowwise
@pytest.mark.parametrize("shape", [(96, 200), (37, 11), (1536, 300), (8, 5)])
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_rowwise_kernel_computes_the_product_of_its_stored_weights(shape, weights):
    """fp32 accumulation of the bf16 (or int8 x scale) weights, against a float64 product."""
    n_in, n_out = shape
    lin = linear(n_in, n_out)
    x = torch.randn(13, n_in)  # 13 rows: two passes of 6 and a remainder in the kernel
    got = RowwiseLinear(lin, weights)(x)
    if weights == "bf16":
        w = lin.weight.detach().to(torch.bfloat16).double()
    else:
        q, scale = int8_weights(lin.weight)
        w = q.double() * scale.double()[:, None]
    want = x.double() @ w.T + lin.bias.detach().double()
    assert got.dtype == torch.float32
    assert (got.double() - want).abs().max() < 1e-5 * n_in ** 0.5 * want.abs().max()


@needs_rowwise
def test_rowwise_kernel_keeps_the_model_dtype():
    lin = linear()
    x = torch.randn(3, 96).to(torch.bfloat16)
    y = RowwiseLinear(lin, "bf16")(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 200)


@pytest.mark.parametrize("kernel", ["int8-torch", pytest.param("onednn", marks=needs_onednn), *ROWWISE])
def test_rows_do_not_depend_on_how_many_come_together(kernel):
    """Verifying k tokens must score each one as decoding it alone would."""
    module = nn.Sequential(linear(n_in=256, n_out=512))
    swap_linears(module, kernel)
    x = torch.randn(9, 256)
    together = module(x)
    for m in (1, 2, 4, 5, 8):
        alone = torch.cat([module(x[i:i + m]) for i in range(0, 9, m)])
        if kernel != "onednn":
            assert torch.equal(alone, together), m
        else:
            torch.testing.assert_close(alone, together, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("kernel,cls", [("int8-torch", Int8Linear),
                                        pytest.param("onednn", OneDNNLinear, marks=needs_onednn),
                                        pytest.param("bf16", RowwiseLinear, marks=needs_rowwise),
                                        pytest.param("int8", RowwiseLinear, marks=needs_rowwise)])
def test_swap_replaces_every_linear_and_keeps_the_model_close(tok_qwen2, kernel, cls):
    model = tiny("qwen2", tok_qwen2, seed=0)
    ids = torch.tensor([tok_qwen2.encode(PROMPTS[0])])
    before = model.model(input_ids=ids).logits
    n_linear = sum(type(m) is nn.Linear for m in model.model.modules())
    assert swap_linears(model.model, kernel) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in model.model.modules())
    assert sum(isinstance(m, cls) for m in model.model.modules()) == n_linear
    after = model.model(input_ids=ids).logits
    tolerance = 1e-4 if kernel == "onednn" else 0.05 * before.abs().max()  # bf16 and int8 round weights
    assert (after - before).abs().max() < tolerance


@pytest.mark.parametrize("kernel", ["int8-torch", *ROWWISE])
def test_quantized_target_speculative_greedy_equals_the_same_target_alone(tok_qwen2, tok_llama2, kernel):
    """Lossless against the model as loaded: a target on each kernel, with and without a draft."""
    target = tiny("qwen2", tok_qwen2, seed=0)
    swap_linears(target.model, kernel)
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
    with pytest.raises(ConfigError, match="unknown draft dtype 'int4'"):
        resolve_dtype("int4", draft=True)


def test_model_reports_its_dtype(tok_qwen2):
    model = tiny("qwen2", tok_qwen2, seed=0)
    assert TransformersModel(model.model, tok_qwen2).dtype == "fp32"


@needs_rowwise
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [16, 67, 128])  # head sizes through each of the kernel's vector and tail paths
def test_rowwise_attention_equals_causal_attention_and_keeps_rows_apart(dtype, d):
    """Grouped-query causal attention with a cache: close to torch's; row m alone equals row m in a block."""
    torch.manual_seed(0)
    heads, kv_heads, past, m = 4, 2, 9, 5
    module = nn.Module()
    q = torch.randn(1, heads, m, d).to(dtype)
    k = torch.randn(1, kv_heads, past + m, d).to(dtype)
    v = torch.randn(1, kv_heads, past + m, d).to(dtype)
    got, _ = rowwise_attention(module, q, k, v, None, scaling=d ** -0.5)
    assert got.shape == (1, m, heads, d) and got.dtype == dtype
    mask = torch.ones(m, past + m, dtype=torch.bool).tril(diagonal=past)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-2)
    for row in range(m):  # the same row with only the keys before it, as one-by-one decoding sees it
        alone, _ = rowwise_attention(module, q[:, :, row:row + 1], k[:, :, :past + row + 1],
                                     v[:, :, :past + row + 1], None, scaling=d ** -0.5)
        assert torch.equal(alone[0, 0], got[0, row])


@needs_rowwise
@pytest.mark.parametrize("d", [16, 67, 128])
def test_rowwise_attention_shares_a_key_value_head_without_changing_a_bit(d):
    """The heads of a group read their shared keys and values together, 8 keys and 64 values at a time;
    each head must be the same bits as with a copy of its own, on any number of threads."""
    torch.manual_seed(0)
    heads, kv_heads, past, m = 6, 2, 150, 3
    module = nn.Module()
    q = torch.randn(1, heads, m, d)
    k, v = torch.randn(1, kv_heads, past + m, d), torch.randn(1, kv_heads, past + m, d)
    own_k, own_v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            grouped, _ = rowwise_attention(module, q, k, v, None, scaling=d ** -0.5)
            alone, _ = rowwise_attention(module, q, own_k, own_v, None, scaling=d ** -0.5)
            assert torch.equal(grouped, alone)
            results.append(grouped)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    mask = torch.ones(m, past + m, dtype=torch.bool).tril(diagonal=past)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(results[0], want.transpose(1, 2), rtol=0, atol=1e-5)


def test_rowwise_kernel_says_why_it_is_off(monkeypatch):
    """No silent fallback: the reason reaches the user's warning (transformers.swap_cpu_kernels)."""
    from anyspec.backends import linear as module

    monkeypatch.setenv("ANYSPEC_KERNELS", "0")
    assert module._build_rowwise() == "turned off with ANYSPEC_KERNELS=0"
    monkeypatch.setattr(module, "_ROWWISE", [module._build_rowwise()])
    assert module.rowwise_problem() == "turned off with ANYSPEC_KERNELS=0"
    assert not module.rowwise_available()
    with pytest.raises(RuntimeError, match="ANYSPEC_KERNELS=0"):
        module.rowwise_kernel()


def test_a_gguf_model_without_the_kernels_says_it_runs_de_quantized(monkeypatch, capsys, tmp_path):
    from anyspec.backends import load as backend

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("ANYSPEC_KERNELS", "0")
    assert backend.resolve_dtype("auto", spec=str(gguf)) in ("bf16", "fp32")
    err = capsys.readouterr().err
    assert err == ("anyspec: m.gguf is a GGUF model and anyspec's kernels are off here (turned off "
                   "with ANYSPEC_KERNELS=0); "
                   "loading it de-quantized through transformers instead\n")
    monkeypatch.setenv("ANYSPEC_KERNELS", "1")
    backend.resolve_dtype("auto", spec=str(tmp_path / "folder"))
    assert capsys.readouterr().err == ""


def test_bf16_without_the_kernel_warns_with_the_reason(monkeypatch, capsys, tok_llama2, tmp_path):
    from tiny_models import save_tiny_model

    from anyspec.backends import linear as module
    from anyspec.backends import load as backend

    folder = save_tiny_model(tok_llama2, tmp_path / "m", arch="llama")
    monkeypatch.setattr(module, "_ROWWISE", ["turned off with ANYSPEC_KERNELS=0"])
    monkeypatch.setattr(backend, "cpu_has_bf16", lambda: False)
    model = backend.load_model(str(folder), dtype="bf16")
    assert not any(isinstance(m, RowwiseLinear) for m in model.model.modules())
    err = capsys.readouterr().err
    assert "bf16 is emulated" in err and "(turned off with ANYSPEC_KERNELS=0)" in err


@needs_rowwise
def test_anyspec_isa_caps_the_instruction_set_level(monkeypatch):
    from anyspec.backends.build import limit_isa
    from anyspec.backends.linear import rowwise_kernel

    lib = rowwise_kernel()
    best = lib.best_isa()
    try:
        for value, level in (("plain", 0), ("1", 1), ("AVX512", 2), ("amx", 3)):
            monkeypatch.setenv("ANYSPEC_ISA", value)
            limit_isa(lib)
            assert lib.isa() == min(level, best)
        monkeypatch.setenv("ANYSPEC_ISA", "sse9")
        with pytest.raises(ConfigError, match="ANYSPEC_ISA must be 0, 1, 2 or 3"):
            limit_isa(lib)
    finally:
        lib.set_isa(best)


@needs_rowwise
def test_the_tiles_stand_in_and_threshold_come_from_the_environment(monkeypatch):
    """ANYSPEC_AMX_STANDIN=1 gives level 3 on any CPU, which ANYSPEC_ISA still caps; ANYSPEC_AMX_ROWS
    sets the rows from which a pass takes the tiles."""
    from anyspec.backends.build import limit_isa
    from anyspec.backends.linear import rowwise_kernel

    lib = rowwise_kernel()
    level, rows = lib.isa(), lib.amx_rows()
    try:
        monkeypatch.setenv("ANYSPEC_AMX_STANDIN", "1")
        monkeypatch.setenv("ANYSPEC_AMX_ROWS", "12")
        limit_isa(lib)
        assert lib.amx_standin() and lib.best_isa() == 3 and lib.isa() == 3 and lib.amx_rows() == 12
        monkeypatch.setenv("ANYSPEC_ISA", "avx2")
        limit_isa(lib)
        assert lib.isa() == 1
        monkeypatch.setenv("ANYSPEC_AMX_STANDIN", "0")
        monkeypatch.delenv("ANYSPEC_ISA")
        limit_isa(lib)
        assert not lib.amx_standin()
        assert lib.isa() == lib.cpu_isa(), "the tiles are taken only when asked for"
        assert lib.best_isa() == (3 if lib.amx_hw_usable() else lib.cpu_isa())
        bad = (("ANYSPEC_AMX_ROWS", "0"), ("ANYSPEC_AMX_ROWS", "many"), ("ANYSPEC_AMX_STANDIN", "yes"))
        for name, value in bad:
            monkeypatch.setenv(name, value)
            with pytest.raises(ConfigError, match=f"{name} must be"):
                limit_isa(lib)
            monkeypatch.delenv(name)
    finally:
        lib.set_amx_standin(False)
        lib.set_amx_rows(rows)
        lib.set_isa(level)

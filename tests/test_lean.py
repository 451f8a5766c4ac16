"""The lean forward for Llama-family int8 models (backends/lean.py and its C++ decoder stack)."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROMPTS, noisy_copy, tiny
from test_linear import needs_rowwise
from tiny_models import one_thread, save_tiny_model  # noqa: F401  (autouse fixture)

from anyspec.backends.lean import LeanModel, lean_unsupported
from anyspec.backends.linear import swap_linears
from anyspec.backends.load import load_model
from anyspec.backends.transformers import TransformersModel
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.model import MultiSequence, PrefixSharing


def pair(arch, tokenizer, kernel=None, seed=0):
    """The same network twice: through transformers, and through the lean forward."""
    reference = tiny(arch, tokenizer, seed=seed)
    if kernel:
        swap_linears(reference.model, kernel)
    return reference, LeanModel(reference.model, tokenizer)


def ids_of(tokenizer, n=300):
    ids = []
    while len(ids) < n:
        ids += tokenizer.encode(" ".join(PROMPTS))
    return ids[:n]


@pytest.mark.parametrize("kernel", [None, pytest.param("int8", marks=needs_rowwise)])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_forward_equals_transformers(tok_qwen2, arch, kernel):
    reference, lean = pair(arch, tok_qwen2, kernel)
    assert (lean.native is not None) == (kernel == "int8")  # int8: the C++ stack; fp32: Python
    ids = ids_of(tok_qwen2)
    # a prompt, one token, then past the 256 positions allocated at first (the cache grows)
    chunks = [ids[:7], ids[7:8], ids[8:300]]
    want = torch.cat([reference.extend(c) for c in chunks])
    got = torch.cat([lean.extend(c) for c in chunks])
    assert got.shape == want.shape == (300, reference.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert lean.cached_ids == ids
    if kernel:  # transformers' q/k/v modules now read views of the fused weights: one copy in memory
        q_proj, fused = reference.model.model.layers[0].self_attn.q_proj, lean.layers[0]["qkv"]
        assert q_proj.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()


@needs_rowwise
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_rows_do_not_depend_on_how_many_come_together(tok_qwen2, arch):
    """Verification scores k+1 tokens at once; each must equal decoding it alone, bit for bit."""
    _, lean = pair(arch, tok_qwen2, "int8")
    ids = ids_of(tok_qwen2, 40)
    lean.extend(ids[:30])
    together = lean.extend(ids[30:40])
    lean.crop(30)
    alone = torch.cat([lean.extend([i]) for i in ids[30:40]])
    assert torch.equal(together, alone)


@needs_rowwise
def test_lean_native_stack_gives_the_same_bits_on_any_number_of_threads(tok_qwen2):
    """The C++ stack runs in one parallel region; how its work is split must not change a bit."""
    _, lean = pair("qwen2", tok_qwen2, "int8")
    ids = ids_of(tok_qwen2, 40)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        lean.reset()
        results.append(torch.cat([lean.extend(ids[:33]), lean.extend(ids[33:34]), lean.extend(ids[34:40])]))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@pytest.mark.parametrize("kernel", [None, pytest.param("int8", marks=needs_rowwise)])
def test_lean_crop_forgets_and_last_keeps_the_final_rows(tok_qwen2, kernel):
    reference, lean = pair("llama", tok_qwen2, kernel)
    ids = ids_of(tok_qwen2, 30)
    for model in (reference, lean):
        model.extend(ids[:20])
        model.crop(12)
    want = reference.extend(ids[20:26])
    got = lean.extend(ids[20:26], last=2)
    assert lean.cached_ids == ids[:12] + ids[20:26]
    torch.testing.assert_close(got, want[-2:], rtol=1e-4, atol=1e-4)
    lean.reset()
    fresh = lean.extend(ids[:12] + ids[20:26])
    torch.testing.assert_close(fresh[-2:], got, rtol=1e-5, atol=1e-5)


def test_lean_says_why_a_model_is_unsupported(tok_qwen2, monkeypatch):
    model = tiny("llama", tok_qwen2, seed=0).model
    assert lean_unsupported(model) is None
    monkeypatch.setenv("ANYSPEC_LEAN", "0")
    assert "ANYSPEC_LEAN=0" in lean_unsupported(model)
    monkeypatch.delenv("ANYSPEC_LEAN")
    model.config.hidden_act = "gelu"
    assert "activation gelu" in lean_unsupported(model)
    model.config.hidden_act = "silu"
    model.config.model_type = "gemma3_text"
    assert "architecture gemma3_text" in lean_unsupported(model)


@needs_rowwise
def test_load_model_runs_int8_llama_models_lean(tok_llama2, tmp_path):
    folder = save_tiny_model(tok_llama2, tmp_path / "m", arch="llama")
    assert type(load_model(str(folder), dtype="int8")) is LeanModel
    assert type(load_model(str(folder), dtype="fp32")) is TransformersModel


@needs_rowwise
def test_speculation_with_lean_int8_models_equals_the_target_alone(tok_qwen2, tok_llama2):
    """Lossless against the target as loaded: a lean int8 target, a lean int8 draft of another vocabulary."""
    _, target = pair("qwen2", tok_qwen2, "int8")
    close = noisy_copy(tiny("qwen2", tok_qwen2, seed=0), 0.3, seed=5)
    swap_linears(close.model, "int8")
    _, other = pair("llama", tok_llama2, "int8", seed=1)
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    accepted = 0
    for draft in (LeanModel(close.model, tok_qwen2), other):
        for algorithm in ("tli", "slem"):
            spec = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=4, algorithm=algorithm))
            for prompt in PROMPTS[:3]:
                result = spec.generate(prompt, params)
                assert result.token_ids == Engine(target, None).generate(prompt, params).token_ids
                accepted += result.stats.accepted
    assert accepted > 0


@needs_rowwise
def test_prefix_cache_reuses_what_requests_share_and_changes_no_token(tok_qwen2, tok_llama2):
    """A request starts from the previous one's KV for their shared prefix: same tokens as a cold start."""
    _, target = pair("qwen2", tok_qwen2, "int8")
    _, draft = pair("llama", tok_llama2, "int8", seed=1)
    assert target.row_invariant and draft.row_invariant
    first = PROMPTS[0]
    prompts = [first, first + "    # and then", PROMPTS[1], first, first]  # shared, unrelated, repeated
    runs = [SamplingParams(temperature=0.0, max_new_tokens=16)] * 4 + [
        SamplingParams(temperature=0.8, max_new_tokens=16, seed=3)]
    cold = [Engine(target, draft, SpeculativeConfig(num_speculative_tokens=3, prefix_cache=False)
                   ).generate(p, params) for p, params in zip(prompts, runs, strict=True)]
    assert all(r.stats.prompt_cached == 0 for r in cold)
    warm_engine = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=3))
    warm = [warm_engine.generate(p, params) for p, params in zip(prompts, runs, strict=True)]
    assert [r.token_ids for r in warm] == [r.token_ids for r in cold]
    cached = [r.stats.prompt_cached for r in warm]
    n_first = len(tok_qwen2.encode(first))
    assert cached[1] >= n_first - 1  # the whole first prompt (less a token the merge may change)
    assert cached[3] < n_first - 1  # after an unrelated prompt: at most what the two share
    assert cached[4] == n_first - 1  # the same prompt again: everything but the last token, fed as decode
    plain = TransformersModel(tiny("qwen2", tok_qwen2, seed=0).model, tok_qwen2)  # not row-invariant
    alone = Engine(plain, None)
    assert [alone.generate(first, runs[0]).stats.prompt_cached for _ in range(2)] == [0, 0]


ROWWISE = [pytest.param(kernel, marks=needs_rowwise) for kernel in ("bf16", "int8")]


@pytest.mark.parametrize("kernel", ROWWISE)
def test_lean_forward_of_two_sequences_gives_each_the_bits_it_gets_alone(tok_qwen2, kernel):
    """Rows of two sequences at other positions in one pass, as the GGUF models batch them; a third
    sequence that adopts one's prompt continues it with the same bits."""
    _, lean = pair("qwen2", tok_qwen2, kernel)
    ids = ids_of(tok_qwen2, 60)
    prompts, more = [ids[:23], ids[23:40]], [ids[40:43], ids[50:52]]
    alone = []
    for prompt, after in zip(prompts, more, strict=True):
        lean.reset()
        alone.append((lean.extend(prompt), lean.extend(after, last=1)))
    seqs = [lean.new_sequence() for _ in prompts]
    first = lean.forward([(s, p, None) for s, p in zip(seqs, prompts, strict=True)])
    second = lean.forward([(s, a, 1) for s, a in zip(seqs[::-1], more[::-1], strict=True)])[::-1]
    for (a, b), x, y in zip(alone, first, second, strict=True):
        assert torch.equal(a, x) and torch.equal(b, y)
    assert [s.cached_ids for s in seqs] == [p + a for p, a in zip(prompts, more, strict=True)]
    assert isinstance(lean, MultiSequence) and isinstance(seqs[0], PrefixSharing)
    fresh = lean.new_sequence()
    fresh.adopt(seqs[0], len(prompts[0]))  # the prompt's keys and values, copied, not computed
    assert torch.equal(fresh.extend(more[0], last=1), alone[0][1])


@pytest.mark.parametrize("kernel", ROWWISE)
def test_lean_tree_rows_equal_each_branch_as_a_chain(tok_qwen2, kernel):
    """A tree of rows (two branches from one root): each row the same bits as its branch alone, and
    ``keep_rows`` keeps one branch's keys and values."""
    _, lean = pair("llama", tok_qwen2, kernel)
    ids = ids_of(tok_qwen2, 30)
    a, b, c, d, e, after = ids[20:26]
    tree, parents = [a, b, c, d, e], [-1, 0, 0, 1, 2]
    lean.extend(ids[:20])
    rows = lean.extend(tree, parents=parents)
    assert lean.tree_attention
    for branch in ([0, 1, 3], [0, 2, 4]):
        lean.crop(20)
        assert torch.equal(rows[branch], lean.extend([tree[j] for j in branch]))
    lean.crop(20)
    lean.extend(tree, parents=parents)
    lean.keep_rows(20, [0, 2, 4])
    assert lean.cached_ids == ids[:20] + [a, c, e]
    kept = lean.extend([after])
    lean.crop(20)
    lean.extend([a, c, e])
    assert torch.equal(kept, lean.extend([after]))


@needs_rowwise
@pytest.mark.parametrize("tree", [0, 2])
def test_batched_generation_on_lean_models_equals_each_request_alone(tok_qwen2, tree):
    """``generate_batch`` with a lean target and draft: every request's ids as ``generate`` alone,
    with requests joining as others end (two at a time for four)."""
    _, target = pair("qwen2", tok_qwen2, "bf16")
    close = noisy_copy(tiny("qwen2", tok_qwen2, seed=0), 0.3, seed=5)
    swap_linears(close.model, "int8")
    # batch_k off: the rounds draft k tokens, whatever the tiny models' measured passes cost
    engine = Engine(target, LeanModel(close.model, tok_qwen2),
                    SpeculativeConfig(num_speculative_tokens=4, tree=tree, batch_k=False))
    assert engine.batchable
    requests = [(p, SamplingParams(temperature=0.0, max_new_tokens=10 + 5 * i))
                for i, p in enumerate(PROMPTS[:4])]
    alone = [engine.generate(p, params) for p, params in requests]
    together = engine.generate_batch(requests, max_batch=2)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert sum(r.stats.accepted for r in together) > 0
    target_alone = Engine(target, None)
    assert [r.token_ids for r in alone] == [target_alone.generate(*request).token_ids for request in requests]

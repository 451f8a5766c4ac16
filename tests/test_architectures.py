"""Each architecture of the table on the GGUF kernels against transformers in fp32 (backends/arch.py).

A random-weight transformers model of each family is written to GGUF (fp32) by llama.cpp's own
converter, so the kernels read the file a user would download and transformers runs the very
same weights. Attention is made sharp, and each test also switches its feature off in the loaded
model to show that the comparison would catch it.
"""

from __future__ import annotations

import pytest
import torch
from gguf_models import tiny_model, to_gguf
from tiny_models import one_thread  # noqa: F401
from tokenizer_files import MISTRAL_COMMON, MISTRAL_V1, package_file

from anyspec.backends.linear import rowwise_possible

pytestmark = [pytest.mark.skipif(not rowwise_possible(), reason="this CPU has no AVX2 or ANYSPEC_KERNELS=0"),
              pytest.mark.slow]
SEQUENCES, LENGTH = 4, 256  # 1,024 positions a model


def _off_rope_freqs(model):
    from anyspec.backends.arch import Rotary, inv_freq

    d = model.description
    d.rotary = [Rotary(inv_freq(d.rope_dim, 500000.0))]


def _off_qk_norms(model):
    for layer in model.layers:
        layer.q_norm = layer.k_norm = torch.empty(0)


def _off_windows(model):
    for layer in model.layers:
        layer.window = 0
        layer.rope = 0


def _off_partial_rotary(model):
    model.arch.rope_dim = 0
    d = model.description
    from anyspec.backends.arch import Rotary, inv_freq

    d.rotary = [Rotary(inv_freq(d.head_dim, 10000.0))]


def _off_scales(model):
    model.description.logit_scale = 1.0
    model.arch.residual_scale = 1.0


def _off_nope(model):
    for layer in model.layers:
        layer.rope = 0


def _off_softcap(model):
    model.arch.attn_softcap = 0.0


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
CASES = {
    # name: (architecture, transformers config, what turns the feature off in the loaded model)
    "llama3-rope-freqs": ("llama", dict(rope_parameters=LLAMA3_ROPE), _off_rope_freqs),
    "qwen3": ("qwen3", {}, _off_qk_norms),
    "phi3-partial-rotary": ("phi3", dict(partial_rotary_factor=0.5, num_key_value_heads=4, head_dim=None,
                                         pad_token_id=None), _off_partial_rotary),
    "gemma3": ("gemma3", dict(layers=6, sliding_window=24, query_pre_attn_scalar=32), _off_windows),
    "gemma2": ("gemma2", dict(layers=2, sliding_window=24, tie_word_embeddings=True, query_pre_attn_scalar=32,
                              attn_logit_softcapping=2.0, final_logit_softcapping=30.0), _off_softcap),
    "granite": ("granite", dict(head_dim=None, embedding_multiplier=6.0, residual_multiplier=0.5,
                                attention_multiplier=0.05, logits_scaling=4.0), _off_scales),
    "smollm3": ("smollm3", dict(layers=4, no_rope_layer_interval=4, pad_token_id=0), _off_nope),
}


@pytest.fixture(scope="module")
def built(tok_smollm2, tok_mistral, tmp_path_factory):
    """name -> (transformers model, GGUF path), built on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            arch, config, _ = CASES[name]
            config = dict(config)
            folder = tmp_path_factory.mktemp(name)
            tokenizer, spm = tok_smollm2, None
            if arch == "gemma2":  # its converter reads only a SentencePiece model
                tokenizer, spm = tok_mistral, package_file(*MISTRAL_COMMON, *MISTRAL_V1)
            model = tiny_model(arch, tokenizer, folder, layers=config.pop("layers", 2), spm=spm, **config)
            cache[name] = model, to_gguf(folder, folder / "model.gguf")
        return cache[name]

    return get


def _positions(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (LENGTH,), generator=g).tolist() for _ in range(SEQUENCES)]


def _compare(model, reference, sequences):
    """Max |logit difference| over all positions, the share of top-1 agreement, and the reference's
    top-2 margin at each disagreement."""
    worst, agree, total, margins = 0.0, 0, 0, []
    for ids in sequences:
        model.reset()
        got = model.extend(ids)
        with torch.no_grad():
            want = reference(torch.tensor([ids])).logits[0].float()
        worst = max(worst, (got - want).abs().max().item())
        top = want.topk(2, dim=-1)
        same = got.argmax(-1) == top.indices[:, 0]
        agree += int(same.sum())
        total += len(ids)
        margins += (top.values[:, 0] - top.values[:, 1])[~same].tolist()
    return worst, agree / total, margins


@pytest.mark.parametrize("name", list(CASES))
def test_an_architecture_on_the_kernels_equals_transformers_in_fp32(name, built):
    from anyspec.backends.gguf import GGUFModel, gguf_problem
    from anyspec.backends.load import known_context

    reference, path = built(name)
    assert gguf_problem(path) is None
    model = GGUFModel(path)
    assert known_context(str(path)) == model.context_length  # what is checked before a load
    sequences = _positions(model.vocab_size)
    scale = max(reference(torch.tensor([sequences[0][:32]])).logits.abs().max().item(), 1.0)
    worst, agree, margins = _compare(model, reference, sequences)
    # fp32 weights on both sides: only the order of fp32 sums differs
    assert worst <= 2e-3 * scale, (name, worst, scale)
    assert agree >= 0.999 and all(m < 20 * worst for m in margins), (name, agree, margins)
    assert SEQUENCES * LENGTH >= 1000

    print(f"\n{name}: max |diff| {worst:.2e} (logits up to {scale:.1f}), top-1 {agree:.4f}")
    CASES[name][2](model)  # the feature off: the same comparison must see it
    off_worst, off_agree, _ = _compare(model, reference, sequences[:2])
    print(f"{name} with it off: max |diff| {off_worst:.2e}, top-1 {off_agree:.4f}")
    assert off_worst > 50 * max(worst, 1e-4 * scale) and off_agree < 0.95, (name, off_worst, off_agree)


@pytest.mark.parametrize("name", ["gemma3", "phi3-partial-rotary", "smollm3"])
def test_an_architectures_rows_are_the_same_bits_alone_or_together(name, built):
    from anyspec.backends.gguf import GGUFModel

    _, path = built(name)
    model = GGUFModel(path)
    ids = _positions(model.vocab_size)[0][:60]  # past gemma3's 24-token window
    other = model.new_sequence()
    model.reset()
    model.extend(ids[:40])
    alone = torch.cat([model.extend([t]) for t in ids[40:]])
    model.crop(40)
    other.extend(ids[5:30])
    together = model.forward([(model.own, ids[40:], None), (other, ids[30:33], None)])[0]
    assert torch.equal(alone, together)

    # a tree of two branches deeper than gemma3's window, beside another sequence: each row the
    # same bits as its branch alone
    root, one, two = ids[30], ids[31:60], ids[2:29]
    nodes = [root] + one + two
    parents = [-1] + list(range(len(one))) + [0] + list(range(30, 30 + len(two) - 1))
    branch = {0: [root]} | {1 + j: [root] + one[:j + 1] for j in range(len(one))}
    branch |= {30 + j: [root] + two[:j + 1] for j in range(len(two))}
    alone = []
    for j in range(len(nodes)):
        model.crop(30)
        alone.append(model.extend(branch[j])[-1])
    model.crop(30)
    tree = model.forward([(model.own, nodes, None, parents), (other, ids[33:36], None)])[0]
    assert [j for j in range(len(nodes)) if not torch.equal(tree[j], alone[j])] == []


def _dequantized(model):
    """The model with every product's weights widened to fp32 (no int8 activations then)."""
    kernel = model.kernel
    for layer in model.layers:
        for field in ("q", "k", "v", "o", "gate", "up", "down"):
            p = getattr(layer, field)
            if p.weight is None or not p.weight.numel():
                continue
            wide = kernel.Product()
            wide.weight = kernel.dequant_rows(p.weight, p.type, p.K, torch.arange(p.weight.shape[0]))
            wide.K = p.K
            if p.bias is not None:
                wide.bias = p.bias
            setattr(layer, field, wide)
    weight, kind, k = model.lm_head
    model.lm_head = kernel.dequant_rows(weight, kind, k, torch.arange(weight.shape[0])), 0, k


REAL_TEXT_POSITIONS = 1024
@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b"])
def test_a_builtin_on_the_kernels_equals_transformers_on_its_dequantized_weights(name):
    """Real weights (Gemma 3 with its Q5_0, Q8_0, Q4_K and Q6_K blocks; Qwen2.5 with Q5_0): transformers
    de-quantizes the same file to fp32. With the weights widened to fp32 too, only the order of fp32 sums
    differs; on the blocks themselves, the int8 activations add their rounding error."""
    import fnmatch
    import inspect
    import shlex
    import string
    import textwrap

    from transformers import AutoModelForCausalLM

    from anyspec.backends.gguf import GGUFModel
    from anyspec.models import gguf_path

    path = gguf_path(name, progress=False)
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    model = GGUFModel(path)
    bos = [model.tokenizer.bos_token_id] if model.tokenizer.bos_token_id is not None else []
    sequences = [bos + model.tokenizer.encode(inspect.getsource(module), add_special_tokens=False)[:256]
                 for module in (textwrap, string, shlex, fnmatch)]  # each text from its start
    assert sum(map(len, sequences)) >= REAL_TEXT_POSITIONS
    worst, agree, margins = _compare(model, reference, sequences)
    print(f"\n{name} on its blocks: max |diff| {worst:.2f}, top-1 {agree:.4f}, margins {margins[-3:]}")
    # the int8 activations' rounding (each product's is checked exactly in test_gguf); SmolLM2 on its
    # Q4_1 blocks, the long-standing path, agrees on 96% of 1,024 positions of textwrap's source
    assert agree >= 0.93 and worst < 8.0, (agree, worst)
    _dequantized(model)
    wide_worst, wide_agree, wide_margins = _compare(model, reference, sequences)
    print(f"{name} widened to fp32: max |diff| {wide_worst:.2e}, top-1 {wide_agree:.4f}")
    assert wide_worst < 0.02 and wide_agree >= 0.998 and all(m < 20 * wide_worst for m in wide_margins)


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
def test_the_converters_other_types_run_on_the_kernels(outtype, tok_smollm2, tmp_path):
    """A Llama written as F16, BF16 or Q8_0 matrices by the converter, against transformers on the file's
    own (de-quantized) weights: F16 and BF16 exactly widened, Q8_0 through int8 activations."""
    from transformers import AutoModelForCausalLM

    from anyspec.backends.gguf import GGUFModel, gguf_problem

    tiny_model("llama", tok_smollm2, tmp_path, head_dim=None)  # transformers reads heads of hidden / heads
    path = to_gguf(tmp_path, tmp_path / f"model-{outtype}.gguf", outtype)
    assert gguf_problem(path) is None
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    model = GGUFModel(path)
    worst, agree, _ = _compare(model, reference, _positions(model.vocab_size))
    print(f"\nllama as {outtype}: max |diff| {worst:.2e}, top-1 {agree:.4f}")
    assert (worst < 1e-5 and agree == 1.0) if outtype != "q8_0" else (worst < 0.05 and agree >= 0.97)

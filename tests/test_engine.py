"""The engine on tiny random-weight models with real, different tokenizers (fp32).

Greedy speculative output must be token-identical to the target alone, whatever the draft does.
"""

from __future__ import annotations

import functools
import gc

import pytest
import torch
from tiny_models import one_thread, record_inputs  # noqa: F401  (one_thread: autouse fixture)
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from anyspec.backends.transformers import TransformersModel
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.errors import ConfigError, EngineBusy

# This file tests TLI (SLEM has test_slem.py), with every round drafting all k tokens: random drafts
# are unsure of everything, so the default confidence stop would end most rounds after one token.
TLI = functools.partial(SpeculativeConfig, algorithm="tli", draft_confidence=0.0)

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. Then",
    "数据科学 🤖 naïve café — ∑ résumé",  # tokens outside the intersection, multi-byte characters
    "x",
    "class Stack:\n\tdef push(self, item):\n\t\tself.items.append(item)",
    "   leading spaces and trailing spaces   ",
    "1234567890 + 987654321 =",
    "<html><body><p>Hello</p></body></html>",
]


def tiny(arch: str, tokenizer, seed: int, hidden: int = 64) -> TransformersModel:
    torch.manual_seed(seed)
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = config_cls(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=1024, tie_word_embeddings=False)
    return TransformersModel(model_cls(config).float(), tokenizer, name=f"{arch}-{seed}")


def noisy_copy(model: TransformersModel, scale: float, seed: int) -> TransformersModel:
    """The same network with perturbed weights: a draft that agrees with the target most of the time."""
    torch.manual_seed(seed)
    clone = type(model.model)(model.model.config).float()
    clone.load_state_dict(model.model.state_dict())
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp(min=1e-3))
    return TransformersModel(clone, model.tokenizer, name="noisy-copy")


@pytest.fixture(scope="module")
def qwen_target(tok_qwen2):
    return tiny("qwen2", tok_qwen2, seed=0)


@pytest.fixture(scope="module")
def llama_target(tok_llama2):
    return tiny("llama", tok_llama2, seed=2)


@pytest.fixture(scope="module")
def llama_draft(tok_llama2):
    return tiny("llama", tok_llama2, seed=1)


@pytest.fixture(scope="module")
def gpt2_draft(tok_gpt2):
    return tiny("qwen2", tok_gpt2, seed=3)


def greedy(max_new_tokens=16, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, **kw)


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("context", ["retokenize", "token-map"])
def test_greedy_equals_target_only_byte_level_target_sentencepiece_draft(qwen_target, llama_draft, k,
                                                                          context):
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=k,
                                                                draft_context=context))
    baseline = Engine(qwen_target, None)
    for prompt in (PROMPTS[k - 1], PROMPTS[(k + 3) % len(PROMPTS)]):
        want = baseline.generate(prompt, greedy())
        got = engine.generate(prompt, greedy())
        assert got.token_ids == want.token_ids, prompt
        assert got.text == want.text
        assert got.stats.drafted > 0


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_target_only_sentencepiece_target_byte_level_draft(llama_target, gpt2_draft, k):
    engine = Engine(llama_target, gpt2_draft, TLI(num_speculative_tokens=k))
    baseline = Engine(llama_target, None)
    for prompt in PROMPTS[k - 1: k + 2]:
        assert engine.generate(prompt, greedy()).token_ids == baseline.generate(prompt, greedy()).token_ids


def test_target_only_path_matches_transformers_generate(qwen_target):
    prompt = PROMPTS[0]
    ours = Engine(qwen_target, None).generate(prompt, greedy(max_new_tokens=12))
    ids = torch.tensor([qwen_target.tokenizer.encode(prompt)])
    ref = qwen_target.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)
    assert ours.token_ids == ref[0, ids.shape[1]:].tolist()
    assert ours.stats.drafted == 0 and ours.stats.rounds == 12


def test_target_emits_tokens_outside_the_intersection(qwen_target, llama_draft):
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=4))
    to_draft = engine.bridge.target_to_draft
    prompt = PROMPTS[2]
    prompt_ids = qwen_target.tokenizer.encode(prompt)
    assert any(to_draft[t] < 0 for t in prompt_ids), "the prompt should hold target-only tokens"
    got = engine.generate(prompt, greedy(max_new_tokens=24))
    assert any(to_draft[t] < 0 for t in got.token_ids), "the target should emit target-only tokens"
    assert got.token_ids == Engine(qwen_target, None).generate(prompt, greedy(max_new_tokens=24)).token_ids


@pytest.mark.parametrize(("k", "context", "noise"), [(2, "retokenize", 0.0), (4, "retokenize", 0.0),
                                                     (8, "retokenize", 0.0), (4, "token-map", 0.1)])
def test_agreeing_draft_gives_zero_partial_and_full_acceptance(qwen_target, k, context, noise):
    """A (noisy) copy of the target, drafted through the intersection like any other draft.

    Rejections come from the noise, from target-only tokens and, with ``retokenize``, from the
    draft reading its own tokenization of text the random target spelled unusually.
    """
    draft = noisy_copy(qwen_target, scale=noise, seed=k)
    engine = Engine(qwen_target, draft, TLI(num_speculative_tokens=k, draft_context=context))
    baseline = Engine(qwen_target, None)
    hist = [0] * (k + 1)
    for prompt in PROMPTS[:4]:
        got = engine.generate(prompt, greedy(max_new_tokens=40))
        assert got.token_ids == baseline.generate(prompt, greedy(max_new_tokens=40)).token_ids
        hist = [a + b for a, b in zip(hist, got.stats.accepted_hist, strict=True)]
    assert hist[0] > 0, hist
    assert sum(hist[1:k]) > 0, hist
    assert hist[k] > 0, hist


@pytest.mark.parametrize("draft", [False, True])
def test_a_prompt_beyond_the_context_is_refused_before_any_forward(qwen_target, llama_draft, draft):
    """The tiny target reads 1024 tokens: prompt + max_new_tokens beyond that is a ConfigError."""
    prompt = "word " * 1000
    n = len(qwen_target.tokenizer.encode(prompt))
    assert n < 1024 < n + 100
    engine = Engine(qwen_target, llama_draft if draft else None, TLI())
    calls = record_inputs(qwen_target)
    try:
        with pytest.raises(ConfigError, match=f"the prompt has {n} tokens and up to 100 more"):
            engine.generate(prompt, greedy(max_new_tokens=100))
        assert calls == []
        assert len(engine.generate("x", greedy(max_new_tokens=3)).token_ids) == 3
    finally:
        del qwen_target.extend


def test_max_new_tokens_is_never_exceeded(qwen_target, tok_qwen2):
    draft = noisy_copy(qwen_target, scale=0.0, seed=0)  # accepts everything
    engine = Engine(qwen_target, draft, TLI(num_speculative_tokens=8))
    for n in (1, 2, 5, 9, 17):
        got = engine.generate(PROMPTS[1], greedy(max_new_tokens=n))
        assert len(got.token_ids) == n and got.finish_reason == "length"
        want = Engine(qwen_target, None).generate(PROMPTS[1], greedy(max_new_tokens=n))
        assert got.token_ids == want.token_ids


def test_eos_stops_and_is_not_emitted(qwen_target, llama_draft):
    prompt = PROMPTS[4]
    free = Engine(qwen_target, None).generate(prompt, greedy(max_new_tokens=20)).token_ids
    stop_token = free[7]
    before = qwen_target.model.generation_config.eos_token_id
    qwen_target.model.generation_config.eos_token_id = stop_token
    try:
        for draft in (None, llama_draft):
            got = Engine(qwen_target, draft, TLI(num_speculative_tokens=3)).generate(
                prompt, greedy(max_new_tokens=20))
            assert got.token_ids == free[: free.index(stop_token)]
            assert got.finish_reason == "stop"
    finally:
        qwen_target.model.generation_config.eos_token_id = before


def test_stop_string_trims_text_and_streaming_matches(qwen_target, llama_draft):
    prompt = PROMPTS[1]
    full = Engine(qwen_target, None).generate(prompt, greedy(max_new_tokens=30)).text
    stop = full[10:14]
    pieces: list[str] = []
    got = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=4)).generate(
        prompt, greedy(max_new_tokens=30, stop=[stop]), on_text=pieces.append)
    assert got.text == full[: full.index(stop)]
    assert "".join(pieces) == got.text
    assert got.finish_reason == "stop"


def test_streamed_pieces_add_up_to_the_text(qwen_target, llama_draft):
    pieces: list[str] = []
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=5))
    got = engine.generate(PROMPTS[2], greedy(max_new_tokens=30), on_text=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == got.text
    assert list(engine.stream(PROMPTS[2], greedy(max_new_tokens=30))) == pieces


def test_stop_ends_a_generation_after_its_round_with_its_text_and_statistics(qwen_target, llama_draft):
    """``stop`` set while the first piece is out: the stream ends before its next round, the text it
    gave is the result's, a prefix of the whole answer, counted in its statistics; a stop string
    the answer was holding text back for gives that text out."""
    import threading

    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=3))
    full = engine.generate(PROMPTS[2], greedy(max_new_tokens=30))
    for params in (greedy(max_new_tokens=30), greedy(max_new_tokens=30, stop=["not in the answer"])):
        stop = threading.Event()
        stream = engine.stream(PROMPTS[2], params, stop)
        pieces = [next(stream)]
        stop.set()
        with pytest.raises(StopIteration) as done:
            while True:
                pieces.append(next(stream))
        result = done.value.value
        assert result.finish_reason == "abort" and "".join(pieces) == result.text
        assert result.token_ids == full.token_ids[:len(result.token_ids)] and len(result.token_ids) < 30
        assert result.text == full.text[:len(result.text)] and result.text
        assert result.stats.generated == len(result.token_ids) and result.stats.rounds >= 1
    assert engine.generate(PROMPTS[2], greedy(max_new_tokens=30)).token_ids == full.token_ids


def test_max_new_tokens_0_reads_and_scores_the_prompt_alone(qwen_target, llama_draft):
    """max_new_tokens 0: nothing generated and nothing streamed; the prompt's logprobs are those a
    generation reports; what it leaves in the caches changes no later answer."""
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=3))
    scored = engine.generate(PROMPTS[1], greedy(max_new_tokens=4, prompt_logprobs=1))
    pieces = []
    got = engine.generate(PROMPTS[1], greedy(max_new_tokens=0, prompt_logprobs=1), on_text=pieces.append)
    assert got.text == "" and got.token_ids == [] and pieces == [] and got.finish_reason == "length"
    assert got.prompt_logprobs == scored.prompt_logprobs and got.stats.generated == 0
    engine.generate(PROMPTS[1], greedy(max_new_tokens=0))
    after = engine.generate(PROMPTS[1], greedy(max_new_tokens=4))
    assert after.token_ids == scored.token_ids


def test_a_second_stream_waits_for_the_first_to_end_or_close(qwen_target, llama_draft):
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=5))
    params = greedy(max_new_tokens=30)
    alone = [engine.generate(p, params).text for p in PROMPTS[:2]]
    first, second = engine.stream(PROMPTS[0], params), engine.stream(PROMPTS[1], params)
    head = next(first)
    with pytest.raises(EngineBusy, match="running a generation"):
        next(second)
    assert head + "".join(first) == alone[0]  # the first stream goes on unharmed
    third = engine.stream(PROMPTS[1], params)
    next(third)
    third.close()  # a closed stream frees the engine
    assert engine.generate(PROMPTS[1], params).text == alone[1]


def test_a_stop_that_is_no_event_is_refused_before_the_generation(qwen_target, llama_draft):
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=5))
    with pytest.raises(ConfigError, match="stop must be a threading.Event"):
        engine.stream(PROMPTS[0], greedy(max_new_tokens=4), stop=True)
    with pytest.raises(ConfigError, match="on_text must be a callable"):
        engine.generate(PROMPTS[0], greedy(max_new_tokens=4), on_text="x")
    assert engine.generate(PROMPTS[0], greedy(max_new_tokens=4)).token_ids


def test_a_stream_dropped_unfinished_in_a_reference_cycle_frees_the_engine(qwen_target, llama_draft):
    """As a web framework drops a client's stream when the client leaves: the stream is never
    closed, and a reference cycle keeps it from being freed at once."""
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=5))
    params = greedy(max_new_tokens=30)
    alone = engine.generate(PROMPTS[1], params).text
    holder = {"stream": engine.stream(PROMPTS[0], params)}
    holder["self"] = holder
    next(holder["stream"])
    gc.disable()  # the collector would otherwise run at a moment of its own choosing
    try:
        del holder
        assert engine.generate(PROMPTS[1], params).text == alone
    finally:
        gc.enable()


def test_sampling_is_seeded_and_respects_limits(qwen_target, llama_draft):
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=4))
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=20, seed=11)
    a, b = engine.generate(PROMPTS[0], params), engine.generate(PROMPTS[0], params)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20
    other = engine.generate(PROMPTS[0], SamplingParams(temperature=0.9, max_new_tokens=20, seed=12))
    assert other.token_ids != a.token_ids
    s = a.stats
    assert s.rounds == sum(s.accepted_hist)
    assert s.accepted == sum(i * c for i, c in enumerate(s.accepted_hist))
    assert 0 <= s.acceptance_rate <= 1 and s.drafted >= s.accepted


def test_sampling_with_an_agreeing_draft_accepts_often(qwen_target):
    draft = noisy_copy(qwen_target, scale=0.0, seed=0)
    engine = Engine(qwen_target, draft,
                    TLI(num_speculative_tokens=4, draft_context="token-map"))
    got = engine.generate(PROMPTS[1], SamplingParams(temperature=1.0, max_new_tokens=30, seed=3))
    # q' is p restricted to the intersection: acceptance = the mass p puts on the intersection.
    assert got.stats.acceptance_rate > 0.5, got.stats


def test_chat_messages_use_each_side_template(qwen_target, llama_draft):
    messages = [{"role": "user", "content": "Write a haiku about bytes."}]
    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=3))
    got = engine.generate(messages, greedy(max_new_tokens=10))
    rendered = qwen_target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = Engine(qwen_target, None).generate(rendered, greedy(max_new_tokens=10))
    assert got.stats.prompt_tokens == len(qwen_target.tokenizer.encode(rendered, add_special_tokens=False))
    assert got.token_ids == want.token_ids


def test_draft_with_other_vocab_and_flag_off_fails(qwen_target, llama_draft):
    with pytest.raises(ConfigError, match="use_heterogeneous_vocab"):
        Engine(qwen_target, llama_draft, TLI(use_heterogeneous_vocab=False))


def test_same_vocab_with_flag_off_decodes_exactly(qwen_target):
    draft = noisy_copy(qwen_target, scale=0.3, seed=5)
    engine = Engine(qwen_target, draft, TLI(num_speculative_tokens=4,
                                                          use_heterogeneous_vocab=False))
    got = engine.generate(PROMPTS[0], greedy(max_new_tokens=20))
    want = Engine(qwen_target, None).generate(PROMPTS[0], greedy(max_new_tokens=20))
    assert got.token_ids == want.token_ids
    assert got.stats.accepted > 0


def test_retokenize_keeps_the_draft_cache_across_rounds(qwen_target, tok_qwen2):
    """The draft's prompt is encoded and prefilled once; later calls feed only the changed tail."""
    draft = noisy_copy(qwen_target, scale=0.0, seed=0)
    k = 4
    engine = Engine(qwen_target, draft, TLI(num_speculative_tokens=k))
    calls = record_inputs(draft)
    try:
        got = engine.generate(PROMPTS[0], greedy(max_new_tokens=30))
    finally:
        del draft.extend
    calls = [len(ids) for ids in calls]
    prompt_len = len(tok_qwen2.encode(PROMPTS[0]))
    assert calls[0] == prompt_len > 12
    window = 4
    assert max(calls[1:]) <= window + k + 2, calls
    assert got.stats.accepted > 0


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_prefix_cache_must_be_a_bool(bad):
    with pytest.raises(ConfigError, match="prefix_cache must be True or False"):
        SpeculativeConfig(prefix_cache=bad)


LONG = "one two three four five six seven eight nine ten " * 30  # about 300 tokens


def test_a_long_prefill_runs_in_chunks_and_changes_no_answer(qwen_target, llama_draft, monkeypatch):
    """The target's prefill and the draft's first catch-up read at most PREFILL_CHUNK tokens a
    forward; the answer is the one a single prefill forward gives."""
    from anyspec.engine import batch

    engine = Engine(qwen_target, llama_draft, TLI(num_speculative_tokens=3))
    monkeypatch.setattr(batch, "PREFILL_CHUNK", 10**9)
    whole = engine.generate(LONG, greedy(max_new_tokens=8))
    monkeypatch.setattr(batch, "PREFILL_CHUNK", 64)
    calls, draft_calls = record_inputs(qwen_target), record_inputs(llama_draft)
    try:
        chunked = engine.generate(LONG, greedy(max_new_tokens=8))
    finally:
        del qwen_target.extend, llama_draft.extend
    n = len(qwen_target.tokenizer.encode(LONG))
    assert n > 256
    assert [len(c) for c in calls[:n // 64 + 1]] == [64] * ((n - 1) // 64) + [(n - 1) % 64 or 64]
    assert max(len(c) for c in calls + draft_calls) <= 64 and len(draft_calls[0]) == 64
    assert chunked.token_ids == whole.token_ids


def test_a_cancelled_long_prefill_stops_after_one_chunk(qwen_target, monkeypatch):
    """A generation removed from a batch mid-prefill (a client gone) has computed one chunk, not the
    whole prompt: the worker is free again after one pass."""
    from anyspec.engine import batch

    monkeypatch.setattr(batch, "PREFILL_CHUNK", 32)
    engine = Engine(qwen_target, None)
    qwen_target.reset()
    running = batch.Batch(lambda *a: None, lambda *a: None, lambda *a: None)
    steps = engine.steps(LONG, greedy(max_new_tokens=4), qwen_target, None, running, "request")
    running.add("request", steps)
    running.step()
    running.remove("request")
    assert qwen_target.num_cached == 32 and len(running) == 0
    assert running.step() == 0  # nothing of it is left to run


@pytest.mark.parametrize("max_batch", [0, -1, 1.5])
def test_generate_batch_refuses_a_max_batch_below_one(qwen_target, max_batch):
    """In a thread: a max_batch that admits no request would otherwise loop for ever."""
    import threading

    raised = []

    def call():
        try:
            Engine(qwen_target, None).generate_batch([("hi", greedy(2))], max_batch=max_batch)
        except ConfigError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert raised and raised[0].startswith("max_batch must be an integer >= 1")

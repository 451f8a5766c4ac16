"""Batched generation on the default pair's GGUF files: each request gets what it gets alone.

The target (Qwen2.5-Coder-1.5B, Q4_K_M) and the draft (SmolLM2-135M, Q4_1) each hold one KV cache
per request; a ``Batch`` runs the forwards of all requests together. Greedy answers must be
token-identical to the same request alone, with prompts of different lengths, requests joining
while others are mid-stream and requests cancelled mid-stream; sampled answers must draw from the
target's own distribution.
"""

import pytest
import torch

from anyspec.config import SamplingParams, SpeculativeConfig
from anyspec.engine import Engine
from anyspec.engine.batch import Batch, Forward

PROMPTS = [
    "def fibonacci(n):",
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
    "Write a Python function that reverses a linked list, with a docstring and type hints:\n\n",
    "1, 2, 3, 4,",
    [{"role": "user", "content": "What is the difference between TCP and UDP?"}],
    "The quick brown fox",
]


@pytest.fixture(scope="module")
def engine():
    from anyspec.backends.gguf import GGUFModel
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, gguf_path

    target = GGUFModel(gguf_path(DEFAULT_TARGET), name="target")
    draft = GGUFModel(gguf_path(DEFAULT_DRAFT), name="draft")
    return Engine(target, draft, SpeculativeConfig(num_speculative_tokens=5))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n)


def test_forward_of_several_sequences_equals_each_alone(engine):
    """The model pass itself: rows of three sequences at other positions, in one forward, are the same
    bits as each sequence's rows alone."""
    target = engine.target
    prompts = [target.tokenizer.encode(t) for t in ("def f(x):", "Hello there, my friend", "1 2 3")]
    alone = []
    for ids in prompts:
        target.reset()
        alone.append((target.extend(ids), target.extend([11, 12, 13])))
    seqs = [target.new_sequence() for _ in prompts]
    first = target.forward([(s, ids, None) for s, ids in zip(seqs, prompts, strict=True)])
    second = target.forward([(s, [11, 12, 13], None) for s in seqs[::-1]])[::-1]
    for (a, b), x, y in zip(alone, first, second, strict=True):
        assert torch.equal(a, x) and torch.equal(b, y)
    with pytest.raises(ValueError, match="twice"):
        target.forward([(seqs[0], [1], None), (seqs[0], [2], None)])


SYSTEM = ("You are a careful senior engineer. Answer in plain words, name the trade-offs, and keep every "
          "answer short enough to read in a minute.")


def test_a_fresh_slot_adopts_the_prefix_another_slot_holds(engine):
    """A request on a fresh sequence copies the KV cache of its prompt's prefix from another sequence
    of the model (a shared system prompt): the same bits as computing it, the answer equal to the
    request computed from scratch, and the copy counted as cached."""
    from anyspec.engine.prefix import common_prefix, reuse_prefix
    from anyspec.engine.prompt import encode_prompt

    target = engine.target
    chat = lambda q: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]  # noqa: E731
    first, second = chat("What is a linked list?"), chat("When is a hash map the wrong choice?")
    ids = [encode_prompt(target.tokenizer, p)[0] for p in (first, second)]
    shared = common_prefix(*ids)
    assert shared > 30
    cold = Engine(target, engine.draft, SpeculativeConfig(num_speculative_tokens=5, prefix_cache=False))
    alone = cold.generate(second, greedy(16))
    target.reset()  # its own sequence holds the whole prompt now

    holder = target.new_sequence()  # a slot that served the first chat
    holder.extend(ids[0])
    seq = target.new_sequence()
    assert reuse_prefix(seq, ids[1][:-1]) == shared
    computed = target.new_sequence()
    computed.extend(ids[1][:shared])
    mine, theirs = seq.cache.keys + seq.cache.values, computed.cache.keys + computed.cache.values
    assert all(torch.equal(a[:, :shared], b[:, :shared]) for a, b in zip(mine, theirs, strict=True))
    assert reuse_prefix(seq, ids[1][:-1], enabled=False) == 0 and seq.num_cached == 0

    [result] = engine.generate_batch([(second, greedy(16))])
    assert result.stats.prompt_cached == shared
    assert result.token_ids == alone.token_ids and alone.stats.prompt_cached == 0
    del holder, computed


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["slem", "tli"])
def test_batched_greedy_answers_equal_each_request_alone(engine, algorithm):
    config = SpeculativeConfig(num_speculative_tokens=5, algorithm=algorithm)
    engine = Engine(engine.target, engine.draft, config)
    requests = [(p, greedy(12 + 7 * (i % 3))) for i, p in enumerate(PROMPTS)]
    alone = [engine.generate(p, params) for p, params in requests]
    # max_batch 3 for 6 requests: the later ones join as the first ones end, mid-stream for the others
    together = engine.generate_batch(requests, max_batch=3)
    for (prompt, _), a, b in zip(requests, alone, together, strict=True):
        assert b.token_ids == a.token_ids, f"{prompt!r}: batched answer differs from the request alone"
        assert b.text == a.text and b.finish_reason == a.finish_reason
    assert sum(r.stats.accepted for r in together) > 0
    assert len({tuple(r.token_ids) for r in alone}) == len(alone)


@pytest.mark.slow
def test_cancelling_and_joining_mid_stream_leave_the_others_unchanged(engine):
    """Requests start at different passes and two are cancelled mid-stream; the passes really hold
    several requests; every finished answer equals the request alone."""
    requests = [(p, greedy(24)) for p in PROMPTS]
    alone = [engine.generate(p, params).token_ids for p, params in requests]
    texts, done = {}, {}
    batch = Batch(lambda i, t: texts.setdefault(i, []).append(t), done.__setitem__,
                  lambda i, exc: pytest.fail(f"request {i} failed: {exc}"), drafts=(engine.draft,))
    slots = [engine.new_slot() for _ in requests]
    widest, passes = 0, 0
    joins = {0: [0, 1, 2], 3: [3], 7: [4], 11: [5]}  # pass number -> requests that join then
    cancels = {5: 1, 9: 3}  # pass number -> the request cancelled then
    while len(batch) or passes <= max(joins):
        for i in joins.get(passes, []):
            batch.add(i, engine.steps(*requests[i], *slots[i], batch, i))
        if passes in cancels and cancels[passes] in batch:
            batch.remove(cancels[passes])
        widest = max(widest, len(batch))
        batch.step()
        passes += 1
    assert widest >= 4
    cancelled = {cancels[p] for p in cancels}
    assert set(done) == set(range(len(requests))) - cancelled
    for i, result in done.items():
        assert result.token_ids == alone[i], f"request {i} differs from alone"
        assert "".join(texts[i]) == result.text
    # a cancelled request's slot serves a new request exactly as a fresh one would
    again = Batch(lambda *a: None, done.__setitem__, lambda i, exc: pytest.fail(str(exc)),
                  drafts=(engine.draft,))
    again.add("again", engine.steps(*requests[0], *slots[1], again, "again"))
    while len(again):
        again.step()
    assert done["again"].token_ids == alone[0]


def test_a_long_prompt_shares_the_passes_of_a_generation_mid_stream(engine):
    """A 600-token prompt joins while another request is mid-stream: the target passes they share hold
    at most ``SHARED_PREFILL`` of its rows beside the other's round, not a whole prefill chunk, and
    both answers are those of each request alone."""
    from anyspec.engine.batch import PREFILL_CHUNK, SHARED_PREFILL

    long_prompt = "Summarise this log in one line:\n" + "".join(
        f"worker {i % 7} finished job {i} in {i * 37 % 1000} ms\n" for i in range(60))
    requests = [(PROMPTS[0], greedy(40)), (long_prompt, greedy(8))]
    alone = [engine.generate(p, params).token_ids for p, params in requests]
    # every prompt row through the passes (no prefix copied from the runs alone)
    config = SpeculativeConfig(num_speculative_tokens=5, prefix_cache=False)
    engine = Engine(engine.target, engine.draft, config)
    assert len(engine.target.tokenizer.encode(long_prompt)) > 2 * PREFILL_CHUNK
    done = {}
    batch = Batch(lambda *a: None, done.__setitem__, lambda i, exc: pytest.fail(f"request {i}: {exc}"),
                  drafts=(engine.draft,))
    slots = [engine.new_slot() for _ in requests]
    batch.add(0, engine.steps(*requests[0], *slots[0], batch, 0))
    for _ in range(4):  # the first request's prefill and first rounds
        batch.step()
    batch.add(1, engine.steps(*requests[1], *slots[1], batch, 1))
    shared = []
    while len(batch):
        model, both = batch.next_model(), len(batch) == 2
        rows = batch.step()
        if model is engine.target and both:
            shared.append(rows)
    assert len(shared) >= 10, shared  # the prompt's rows went through many shared passes
    assert max(shared) <= SHARED_PREFILL + 20, shared  # its rows, and the other's verify (k 5, branches)
    assert [done[0].token_ids, done[1].token_ids] == alone


def test_a_request_takes_the_free_slot_holding_the_longest_prefix_of_its_prompt():
    """The rule generate_batch and the server's scheduler share: the free slot whose target sequence
    holds most of the prompt (the first of equals), taken out of the free list; a new one when none
    is free."""
    from types import SimpleNamespace

    from anyspec.engine.batch import take_slot

    a, b, c = ((SimpleNamespace(cached_ids=ids), None) for ids in ([1, 2, 9], [1, 2, 3, 4], [1, 2, 3, 5]))
    free = [a, b, c]
    assert take_slot(free, [1, 2, 3, 4, 7], lambda: "new") is b and free == [a, c]
    assert take_slot(free, [1, 2, 3, 4, 7], lambda: "new") is c and free == [a]
    free.append(b)
    assert take_slot(free, [8], lambda: "new") is a and free == [b]  # none shares any: the first
    assert take_slot(free, [1], lambda: "new") is b and take_slot(free, [1], lambda: "new") == "new"


def test_a_model_with_one_cache_cannot_batch(tok_qwen2, tmp_path):
    from tiny_models import save_tiny_model

    from anyspec.backends.load import load_model
    from anyspec.errors import ConfigError

    folder = save_tiny_model(tok_qwen2, tmp_path / "t", arch="qwen2")
    target = load_model(str(folder), dtype="fp32", name="target")  # transformers' forward
    with pytest.raises(ConfigError, match="one at a time"):
        Engine(target).new_slot()


def test_the_model_protocols_tell_the_backends_apart(tok_qwen2, tmp_path):
    """A GGUF model holds several caches and its sequences share prefixes, and so does a lean model
    on the row-wise kernels; a transformers model holds one cache and shares nothing: what the loop
    and the scheduler decide batching by."""
    from tiny_models import save_tiny_model

    from anyspec.backends.gguf import GGUFModel
    from anyspec.backends.lean import LeanModel
    from anyspec.backends.linear import rowwise_available
    from anyspec.backends.load import load_model
    from anyspec.engine.model import Model, MultiSequence, PrefixSharing
    from anyspec.models import gguf_path

    gguf = GGUFModel(gguf_path("smollm2-135m"), name="draft")
    seq = gguf.new_sequence()
    assert isinstance(gguf, MultiSequence) and isinstance(seq, PrefixSharing)
    assert not isinstance(seq, MultiSequence)
    saved = save_tiny_model(tok_qwen2, tmp_path / "t", arch="qwen2")
    folder = load_model(str(saved), dtype="fp32", name="target")
    assert isinstance(folder, Model) and not isinstance(folder, (MultiSequence, PrefixSharing))
    assert Engine(gguf).batchable and not Engine(folder).batchable
    if rowwise_available():
        lean = load_model(str(saved), dtype="int8", name="target")
        assert isinstance(lean, LeanModel) and isinstance(lean, MultiSequence)
        assert isinstance(lean.new_sequence(), PrefixSharing)
        assert Engine(lean).batchable


def test_a_forward_is_what_a_generation_yields(engine):
    steps = engine.steps("def f(x):", greedy(3), *engine.new_slot(), Batch(print, print, print), 0)
    first = next(steps)
    assert isinstance(first, Forward) and first.last == 1 and len(first.ids) > 1
    steps.close()


@pytest.mark.slow
def test_sampling_inside_a_batch_draws_from_the_targets_distribution(engine):
    """TLI sampling, eight requests per batch beside two greedy requests of other prompts: the first
    two tokens' joint frequencies over 960 seeds match the target's own distribution (chi-square)."""
    from test_sampling import chi_square_pvalue

    from anyspec.algorithms.sampling import logits_to_probs
    from anyspec.engine.prompt import encode_prompt

    target = engine.target
    prompt, top_k = "My favourite colour is", 4
    ids, _, _ = encode_prompt(target.tokenizer, prompt)
    target.reset()
    first = logits_to_probs(target.extend(ids, last=1)[-1], 1.0, top_k)
    joint = {}
    for a in torch.nonzero(first).flatten().tolist():
        target.crop(len(ids))
        second = logits_to_probs(target.extend([a])[-1], 1.0, top_k)
        for b in torch.nonzero(second).flatten().tolist():
            joint[(a, b)] = first[a].item() * second[b].item()
    cells = list(joint)
    tli = Engine(target, engine.draft, SpeculativeConfig(num_speculative_tokens=3, algorithm="tli"))
    counts = torch.zeros(len(cells))
    n, per_batch, drafted = 960, 8, 0
    for start in range(0, n, per_batch):
        requests = [(prompt, SamplingParams(temperature=1.0, top_k=top_k, max_new_tokens=2, seed=s))
                    for s in range(start, start + per_batch)]
        others = [(PROMPTS[(start // per_batch + j) % len(PROMPTS)], greedy(3)) for j in range(2)]
        results = tli.generate_batch(requests + others, max_batch=per_batch + 2)[:per_batch]
        for r in results:
            assert (r.token_ids[0], r.token_ids[1]) in joint, "a pair the target gives probability 0"
            counts[cells.index((r.token_ids[0], r.token_ids[1]))] += 1
            drafted += r.stats.drafted
    assert drafted > 0
    assert chi_square_pvalue(counts, torch.tensor([joint[c] for c in cells])) > 1e-3


def test_generate_batch_is_the_engines_one_generation(engine):
    """``generate_batch`` and a stream share the engine's models (and their threads), so neither
    begins while the other runs: ``EngineBusy``, whichever came first, and both answers unharmed."""
    import threading

    from anyspec.errors import EngineBusy

    params = greedy(8)
    alone = [engine.generate(p, params).token_ids for p in PROMPTS[:2]]
    stream = engine.stream(PROMPTS[1], params)
    next(stream)
    with pytest.raises(EngineBusy, match="running a generation"):
        engine.generate_batch([(PROMPTS[0], params)])
    for _ in stream:
        pass
    admitted, release, out = threading.Event(), threading.Event(), []

    def slot():
        admitted.set()
        release.wait(60)
        return Engine.new_slot(engine)

    engine.new_slot = slot
    try:
        batch = threading.Thread(target=lambda: out.extend(engine.generate_batch([(PROMPTS[0], params)])))
        batch.start()
        assert admitted.wait(60)
        with pytest.raises(EngineBusy, match="generate_batch"):
            engine.generate(PROMPTS[1], params)
        release.set()
        batch.join(120)
    finally:
        del engine.new_slot
    assert [r.token_ids for r in out] == alone[:1]
    assert engine.generate(PROMPTS[1], params).token_ids == alone[1]

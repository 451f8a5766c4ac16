"""SLEM (String-Level Exact Match): the draft writes freely, its text is re-encoded for the target.

Greedy output must be token-identical to the target alone; sampled output must be distributed as
the target's (chi-square, with a negative control); the re-encoding must spell the draft's bytes.
Tokenizers are real (SmolLM2, Qwen2, Llama-2 SentencePiece); models are tiny random fp32
networks, plus two stand-ins without a network: a draft that knows the target's text (so that
rounds accept something) and logit tables (so that exact distributions are known).
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch
from test_engine import PROMPTS, greedy, noisy_copy, tiny
from test_sampling import chi_square_pvalue, gumbel_draws
from tiny_models import one_thread, record_inputs  # noqa: F401  (one_thread: autouse fixture)

from anyspec.algorithms import slem, tli
from anyspec.algorithms.sampling import logits_to_probs
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.bridge import token_bytes_table
from anyspec.engine.context import ANCHOR, DraftContext, append_retokenize
from anyspec.errors import ConfigError

# Every round drafts all k tokens here (the default confidence stop would cut random drafts short).
SLEM = functools.partial(SpeculativeConfig, algorithm="slem", draft_confidence=0.0)

# A Qwen2 draft has no UNK token; only the token-map context would ever use it.
pytestmark = pytest.mark.filterwarnings("ignore:the draft tokenizer has no unk token")

TOKENIZERS = {"smollm2": "tok_smollm2", "qwen2": "tok_qwen2", "llama2": "tok_llama2"}
ARCH = {"smollm2": "llama", "qwen2": "qwen2", "llama2": "llama"}


@pytest.fixture(scope="module")
def tokenizers(request):
    return lambda name: request.getfixturevalue(TOKENIZERS[name])


@pytest.fixture(scope="module")
def targets(tokenizers):
    made = {}

    def get(name):
        if name not in made:
            made[name] = tiny(ARCH[name], tokenizers(name), seed=0)
        return made[name]

    return get


@pytest.fixture(scope="module")
def baseline():
    """Target-only greedy outputs, computed once per (target, prompt, length)."""
    done = {}

    def get(target, prompt, n):
        key = (target.name, id(target), prompt, n)
        if key not in done:
            done[key] = Engine(target, None).generate(prompt, greedy(max_new_tokens=n))
        return done[key]

    return get


class TokenListCache:
    """The cache half of the backend interface for models without a network: just the ids."""

    cached_ids: list[int]
    row_invariant = tree_attention = False
    context_length = kernel_level = None

    @property
    def num_cached(self) -> int:
        return len(self.cached_ids)

    def reset(self) -> None:
        self.cached_ids = []

    def crop(self, n: int) -> None:
        del self.cached_ids[n:]


class TextOracleDraft(TokenListCache):
    """A draft "model" without a network that knows the text the target will write.

    It spells ``reference`` (the bytes of its prompt tokens + the target's greedy output) in its
    OWN tokens, longest token first, so it uses its own merges (SmolLM2's "\\n   ") and knows
    nothing of the target's tokenization. At pseudo-random byte offsets, and wherever its context
    has left the reference, it writes a wrong token ("~"). It runs through the engine exactly like
    a model: ``extend`` returns logits whose argmax is its choice.
    """

    def __init__(self, tokenizer, reference: bytes, wrong_every: int = 5):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.name = "oracle"
        self.table = token_bytes_table(tokenizer, self.vocab_size)
        self.by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(self.table):
            self.by_bytes.setdefault(b, i)
        self.longest = max(len(b) for b in self.table)
        self.reference = reference
        self.wrong_every = wrong_every
        self.cached_ids: list[int] = []


    def extend(self, ids: list[int], last: int | None = None) -> torch.Tensor:
        self.cached_ids.extend(ids)
        n = len(ids) if last is None else last
        rows = []
        for end in range(len(self.cached_ids) - n + 1, len(self.cached_ids) + 1):
            row = torch.zeros(self.vocab_size)
            row[self.choose(b"".join(self.table[i] for i in self.cached_ids[:end]))] = 30.0  # sure of it
            rows.append(row)
        return torch.stack(rows)

    def choose(self, text: bytes) -> int:
        wrong = self.by_bytes[b"~"]
        rest = self.reference[len(text):]
        if not self.reference.startswith(text) or not rest:
            return wrong
        if zlib.crc32(str(len(text)).encode()) % self.wrong_every == 0 and not rest.startswith(b"~"):
            return wrong
        for size in range(min(self.longest, len(rest)), 0, -1):
            if rest[:size] in self.by_bytes:
                return self.by_bytes[rest[:size]]
        return wrong  # a byte no draft token spells (the random target wrote invalid UTF-8)


PAIRS = [("smollm2", "qwen2"), ("qwen2", "smollm2"), ("llama2", "qwen2"), ("smollm2", "llama2")]


@pytest.mark.parametrize("k", range(1, 7))
@pytest.mark.parametrize(("draft_name", "target_name"), PAIRS, ids=[f"{d}->{t}" for d, t in PAIRS])
def test_greedy_equals_target_only_with_a_draft_that_knows_the_text(tokenizers, targets, baseline, k,
                                                                   draft_name, target_name):
    """Rounds accept none and some; from k = 2 on, proposals hold target-only tokens."""
    target = targets(target_name)
    draft_tok = tokenizers(draft_name)
    hist = [0] * (k + 1)
    proposals: list[list[int]] = []
    engine = None
    target_table = token_bytes_table(target.tokenizer, target.vocab_size)
    for prompt in (PROMPTS[k % len(PROMPTS)], PROMPTS[(k + 4) % len(PROMPTS)]):
        want = baseline(target, prompt, 40)
        draft_table = token_bytes_table(draft_tok, len(draft_tok))
        prompt_bytes = b"".join(draft_table[i] for i in draft_tok.encode(prompt))
        draft = TextOracleDraft(draft_tok, prompt_bytes + b"".join(target_table[t] for t in want.token_ids)
                                + b" and more text after the end")
        engine = Engine(target, draft, SLEM(num_speculative_tokens=k))
        calls = record_inputs(target)
        try:
            got = engine.generate(prompt, greedy(max_new_tokens=40))
        finally:
            del target.extend
        assert got.token_ids == want.token_ids, prompt
        assert got.text == want.text
        s = got.stats
        rounds = calls[1:] if s.prompt_tokens > 1 else calls  # the prompt is prefilled in one call
        assert s.rounds == sum(s.accepted_hist) == len(rounds)
        assert s.accepted == sum(i * c for i, c in enumerate(s.accepted_hist)) <= s.drafted
        assert s.drafted == sum(len(c) - 1 for c in rounds)  # each round feeds [pending] + proposal
        assert all(len(c) - 1 <= k for c in rounds)
        hist = [a + b for a, b in zip(hist, s.accepted_hist, strict=True)]
        proposals += [c[1:] for c in rounds]
    assert hist[0] > 0, hist
    assert sum(hist[1:]) > 0, hist
    # One draft token re-encodes to itself or to pieces of it: target-only tokens (no draft twin)
    # need the text of two or more draft tokens, as merges the draft does not have.
    if k >= 2:
        to_draft = engine.bridge.target_to_draft
        assert any(to_draft[t] < 0 for p in proposals for t in p), "no target-only token was proposed"


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize(("draft_name", "target_name"), PAIRS[:3], ids=[f"{d}->{t}" for d, t in PAIRS[:3]])
def test_greedy_equals_target_only_with_a_random_draft(tokenizers, targets, baseline, k, draft_name,
                                                       target_name):
    target = targets(target_name)
    draft = tiny(ARCH[draft_name], tokenizers(draft_name), seed=k)
    engine = Engine(target, draft, SLEM(num_speculative_tokens=k))
    for prompt in (PROMPTS[k - 1], PROMPTS[k + 1]):
        got = engine.generate(prompt, greedy())
        assert got.token_ids == baseline(target, prompt, 16).token_ids, prompt
        assert got.stats.drafted > 0


def test_a_draft_that_writes_eos_stops_drafting_for_the_round(tokenizers, targets, baseline):
    """After its EOS the draft's text has ended: no more draft forwards that round."""
    target, tok = targets("qwen2"), tokenizers("smollm2")
    draft = tiny("llama", tok, seed=3)
    calls = record_inputs(draft)
    logged = draft.extend

    def eos_first(ids, last=None):
        logits = logged(ids, last).clone()
        logits[:, tok.eos_token_id] = 1e4
        return logits

    draft.extend = eos_first
    got = Engine(target, draft, SLEM(num_speculative_tokens=4)).generate(
        PROMPTS[0], greedy())
    assert got.token_ids == baseline(target, PROMPTS[0], 16).token_ids
    assert len(calls) <= got.stats.rounds  # one catch-up forward per round at most, none after the EOS
    assert got.stats.drafted == 0


def test_same_vocabulary_draft_decodes_exactly(targets, baseline):
    target = targets("qwen2")
    draft = noisy_copy(target, scale=0.0, seed=0)
    engine = Engine(target, draft, SLEM(num_speculative_tokens=4,
                                                     use_heterogeneous_vocab=False))
    got = engine.generate(PROMPTS[0], greedy(max_new_tokens=24))
    assert got.token_ids == baseline(target, PROMPTS[0], 24).token_ids
    assert got.stats.accepted > 0


def test_slem_config_without_a_draft_is_the_target_alone(targets, baseline):
    target = targets("qwen2")
    alone = Engine(target, None, SpeculativeConfig(algorithm="slem"))
    assert alone.generate(PROMPTS[1], greedy()).token_ids == baseline(target, PROMPTS[1], 16).token_ids
    sampled = alone.generate(PROMPTS[1], SamplingParams(temperature=1.0, max_new_tokens=5, seed=0))
    assert len(sampled.token_ids) == 5 and sampled.stats.drafted == 0


def test_sampling_is_seeded_and_stats_add_up(targets, tokenizers):
    target = targets("qwen2")
    engine = Engine(target, tiny("llama", tokenizers("smollm2"), seed=4),
                    SLEM(num_speculative_tokens=4))
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=20, seed=11)
    a, b = engine.generate(PROMPTS[0], params), engine.generate(PROMPTS[0], params)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20
    s = a.stats
    assert s.rounds == sum(s.accepted_hist) and s.drafted > 0
    assert s.accepted == sum(i * c for i, c in enumerate(s.accepted_hist)) <= s.drafted


# --- re-encoding the draft's text for the target -------------------------------------------------


def tables_for(tok):
    return token_bytes_table(tok, len(tok)), tok.encode(ANCHOR, add_special_tokens=False)


def spell(table, ids) -> bytes:
    return b"".join(table[i] for i in ids)


@pytest.mark.filterwarnings("ignore:the target tokenizer has no unk token")
def test_a_draft_only_merge_becomes_several_target_tokens(tok_smollm2, tok_qwen2):
    from anyspec.vocab import VocabMapping

    smol_table, _ = tables_for(tok_smollm2)
    qwen_table, qwen_anchor = tables_for(tok_qwen2)
    draft_ids = tok_smollm2.encode("\n    return x", add_special_tokens=False)
    assert spell(smol_table, draft_ids[:1]) == b"\n   "  # SmolLM2 merges newline + indentation
    mapping = VocabMapping(tok_qwen2, tok_smollm2, len(tok_qwen2), len(tok_smollm2), "cpu")
    assert int(mapping.draft_to_target[draft_ids[0]]) < 0, "TLI could never propose this token"
    ids = slem.retokenize(slem.draft_bytes(draft_ids, smol_table), tok_qwen2, qwen_table, qwen_anchor, 10)
    assert spell(qwen_table, ids) == b"\n    return x"
    assert [tok_qwen2.convert_ids_to_tokens(i) for i in ids[:2]] == ["Ċ", "ĠĠĠ"]
    assert len(ids) > len(draft_ids)
    capped = slem.retokenize(slem.draft_bytes(draft_ids, smol_table), tok_qwen2, qwen_table, qwen_anchor, 2)
    assert capped == ids[:2]


def test_an_unfinished_utf8_character_is_dropped(tok_qwen2, tok_llama2):
    text = "café 🤖"
    data = text.encode()[:-2]  # the robot's last two bytes not drafted yet
    for tok in (tok_qwen2, tok_llama2):
        table, anchor = tables_for(tok)
        ids = slem.retokenize(data, tok, table, anchor, 10)
        assert spell(table, ids) == "café ".encode()
        assert slem.retokenize("🤖".encode()[:3], tok, table, anchor, 10) == []
    # Draft tokens that split a character (byte-level BPE) -> SentencePiece target: the complete
    # characters go through, the half emoji waits for the next round.
    qwen_table, _ = tables_for(tok_qwen2)
    draft_ids = tok_qwen2.encode("naïve 🤖", add_special_tokens=False)
    data = slem.draft_bytes(draft_ids[:-1], qwen_table)
    assert data.startswith("naïve ".encode()) and data != "naïve ".encode()  # ends inside the emoji
    table, anchor = tables_for(tok_llama2)
    assert spell(table, slem.retokenize(data, tok_llama2, table, anchor, 10)) == "naïve ".encode()


def test_sentencepiece_target_gets_no_dummy_prefix(tok_llama2):
    table, anchor = tables_for(tok_llama2)
    ids = slem.retokenize(b"Hello", tok_llama2, table, anchor, 10)
    assert spell(table, ids) == b"Hello"  # not b" Hello": "Hello" continues the committed text
    assert [tok_llama2.convert_ids_to_tokens(i) for i in ids] == ["Hello"]
    ids = slem.retokenize(b" world\n  x", tok_llama2, table, anchor, 10)
    assert spell(table, ids) == b" world\n  x"
    assert tok_llama2.convert_ids_to_tokens(ids[0]) == "▁world"


def test_special_tokens_end_the_draft_text_and_bad_bytes_propose_nothing(tok_qwen2):
    table, anchor = tables_for(tok_qwen2)
    eos = tok_qwen2.convert_tokens_to_ids("<|endoftext|>")
    ids = tok_qwen2.encode("Hi there", add_special_tokens=False)
    assert slem.draft_bytes(ids + [eos] + ids, table) == b"Hi there"
    assert slem.retokenize(b"\xff\xfe ok", tok_qwen2, table, anchor, 10) == []
    assert slem.retokenize(b"", tok_qwen2, table, anchor, 10) == []
    assert slem.retokenize(b"abc", tok_qwen2, table, anchor, 0) == []


@pytest.mark.parametrize("target_name", ["qwen2", "llama2"])
def test_the_proposer_waits_for_whole_characters_and_spells_the_draft_text(tokenizers, target_name):
    """The draft reads only complete characters, so its text cannot continue a half character;
    then the target ids spell the draft's text exactly (no SentencePiece dummy prefix)."""
    from anyspec.engine.bridge import build_bridge
    from anyspec.engine.context import DraftReader
    from anyspec.engine.proposers import SLEM

    smol = tokenizers("smollm2")
    target = tiny(ARCH[target_name], tokenizers(target_name), seed=0, hidden=32)
    draft = TextOracleDraft(smol, b"")
    bridge = build_bridge(draft, target, SpeculativeConfig(algorithm="slem"))
    proposer, anchor_ids = SLEM(bridge, target.tokenizer), DraftReader(draft, bridge, True).anchor_ids
    ctx = DraftContext(ids=[], n_fixed=0)
    draft_ids = smol.encode("ok\n    return x", add_special_tokens=False)
    append_retokenize(ctx, "é".encode()[:1], smol, bridge.draft_bytes, anchor_ids)
    assert proposer.to_target(ctx, draft_ids, 4) == []
    append_retokenize(ctx, "é".encode()[1:], smol, bridge.draft_bytes, anchor_ids)
    ids = proposer.to_target(ctx, draft_ids, 10)
    assert spell(bridge.target_bytes, ids) == b"ok\n    return x"
    assert proposer.to_target(ctx, draft_ids, 2) == ids[:2]


# --- sampling is exact -----------------------------------------------------------------------------

VT = 8


def second_order_table(seed=0) -> torch.Tensor:
    """Target logits ``[VT, VT, VT]`` indexed by the last two tokens."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(VT, VT, VT, generator=g) * 1.5


def exact_joint_2(table, before, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """P(first two tokens) after context ``before = (a, b)``, flattened ``[VT * VT]``."""
    p = lambda a, b: logits_to_probs(table[a, b], temperature, top_k, top_p)  # noqa: E731
    first = p(*before)
    return torch.stack([first[x] * p(before[1], x) for x in range(VT)]).reshape(-1)


def arbitrary_proposal(rng: torch.Generator, k: int) -> list[int]:
    """Any proposal at all, blind to the target: random length 0..k, token 5 half the time, else any
    id (skewed on purpose: with uniform ids the negative control's bias would cancel out)."""
    m = int(torch.randint(0, k + 1, (1,), generator=rng))
    ids = torch.randint(0, VT, (m,), generator=rng)
    return torch.where(torch.rand(m, generator=rng) < 0.5, 5, ids).tolist()


def sample_two(table, proposal_rng, seed, settings, buggy=None) -> list[int]:
    """SLEM rounds from context (0, 1) until two tokens are committed, verified as the engine does:
    exact match against the target's Gumbel-max choices for ``seed`` (or, with ``buggy`` a
    generator, by ``buggy_exact_match``)."""
    out, context = [], [0, 1]
    while len(out) < 2:
        proposed = arbitrary_proposal(proposal_rng, 4)
        seq = context + proposed
        logits = torch.stack([table[seq[i - 1], seq[i]] for i in range(len(context) - 1, len(seq))])
        p = logits_to_probs(logits, settings["temperature"], settings["top_k"], settings["top_p"])
        if buggy is not None:
            n, nxt = buggy_exact_match(p, proposed, buggy)
        else:
            choices = gumbel_draws(p, list(range(len(out), len(out) + len(p))), seed)
            n, nxt = tli.verify_exact(choices, proposed)
        out += proposed[:n] + [nxt]
        context = context + proposed[:n] + [nxt]
    return out[:2]


def buggy_exact_match(p, proposed, generator):
    """The classic bug: accept t with probability p(t), but on a miss draw afresh from p (t again
    possible), which over-weights proposed tokens."""
    for i, t in enumerate(proposed):
        if torch.rand(1, generator=generator) < p[i, t]:
            continue
        return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(proposed), int(torch.multinomial(p[len(proposed)], 1, generator=generator))


SETTINGS = {"plain": dict(temperature=1.0, top_k=0, top_p=1.0),
            "temp-topk-topp": dict(temperature=0.7, top_k=5, top_p=0.9)}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_exact_match_verification_samples_the_target_for_any_proposal(name):
    settings = SETTINGS[name]
    table = second_order_table()
    proposals = torch.Generator().manual_seed(4)
    counts = torch.zeros(VT * VT)
    for seed in range(15_000):
        a, b = sample_two(table, proposals, seed, settings)
        counts[a * VT + b] += 1
    assert chi_square_pvalue(counts, exact_joint_2(table, (0, 1), **settings)) > 1e-3


def test_chi_square_catches_resampling_from_p_after_a_miss():
    """Negative control: the same test, with a verifier that is biased towards the proposal."""
    table = second_order_table()
    generator, proposals = torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)
    counts = torch.zeros(VT * VT)
    for _ in range(15_000):
        a, b = sample_two(table, proposals, None, SETTINGS["plain"], buggy=generator)
        counts[a * VT + b] += 1
    assert chi_square_pvalue(counts, exact_joint_2(table, (0, 1))) < 1e-6


# --- config ------------------------------------------------------------------------------------------


def test_slem_needs_the_draft_to_read_its_own_tokenization():
    with pytest.raises(ConfigError, match="draft_context='retokenize'"):
        SpeculativeConfig(algorithm="slem", draft_context="token-map")
    SpeculativeConfig(algorithm="slem")  # the default context is fine


def test_auto_is_slem_unless_the_draft_reads_the_token_map():
    from anyspec.engine import algorithm_for

    auto = SpeculativeConfig()
    assert auto.algorithm == "auto"
    assert algorithm_for(auto, SamplingParams(temperature=0.0)) == "slem"
    assert algorithm_for(auto, SamplingParams(temperature=0.7)) == "slem"
    token_map = SpeculativeConfig(draft_context="token-map")
    assert algorithm_for(token_map, SamplingParams(temperature=0.0)) == "tli"
    assert algorithm_for(SpeculativeConfig(algorithm="tli"), SamplingParams(temperature=0.0)) == "tli"
    with pytest.raises(ConfigError, match="auto, tli, slem"):
        SpeculativeConfig(algorithm="slam")


def test_generate_command_offers_both_algorithms(no_loading, capsys):
    from anyspec.cli.commands import build_parser

    assert build_parser().parse_args(["generate", "--prompt", "x", "--algorithm", "slem"]).algorithm == "slem"
    assert build_parser().parse_args(["generate", "--prompt", "x"]).algorithm == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--algorithm", "slam"])
    assert "invalid choice" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--algorithm", "slem"]).algorithm == "slem"


# --- sampling through the engine, on real tokenizers ---------------------------------------------


class TableModel(TokenListCache):
    """A second-order "model" without a network: its logits are ``table[prev, last]`` over a few
    real tokens of ``tokenizer`` (-inf elsewhere); tokens outside ``support`` count as one
    "other" bucket. Exact distributions are known, and the engine drives it like any model."""

    def __init__(self, tokenizer, tokens: list[str], seed: int, scale: float = 1.5):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.name = "table"
        self.support = tokenizer.convert_tokens_to_ids(tokens)
        assert tokenizer.unk_token_id not in self.support
        self.bucket = {t: i for i, t in enumerate(self.support)}
        s = len(self.support)
        self.table = torch.randn(s + 1, s + 1, s, generator=torch.Generator().manual_seed(seed)) * scale
        self.cached_ids: list[int] = []


    def eos_ids(self) -> set[int]:
        return set()

    def row(self, prev: int | None, last: int) -> torch.Tensor:
        other = len(self.support)
        return self.table[self.bucket.get(prev, other), self.bucket.get(last, other)]

    def extend(self, ids: list[int], last: int | None = None) -> torch.Tensor:
        self.cached_ids.extend(ids)
        n = len(ids) if last is None else last
        out = torch.full((n, self.vocab_size), float("-inf"))
        for r, end in enumerate(range(len(self.cached_ids) - n, len(self.cached_ids))):
            prev = self.cached_ids[end - 1] if end else None
            out[r, self.support] = self.row(prev, self.cached_ids[end])
        return out


# Target: Llama-2 (SentencePiece) tokens; draft: SmolLM2 tokens, among them its "\n   " merge, which
# the target spells "<0x0A>" + "▁▁▁". Small vocabularies: sampling over them is the test's cost.
TARGET_TOKENS = ["<0x0A>", "▁▁▁", "▁return", "▁x", "x", "▁+", "y", "1"]
DRAFT_TOKENS = ["ĊĠĠĠ", "Ġreturn", "Ġx", "x", "Ġ+", "1", "Ċ", "y"]
DRAFT_AS_TARGET = [0, 2, 3, 4, 5, 7, 0, 6]  # the target token each draft token starts with


def engine_samples(tok_llama2, tok_smollm2, n: int, settings: dict, seed: int):
    target = TableModel(tok_llama2, TARGET_TOKENS, seed=0)
    draft = TableModel(tok_smollm2, DRAFT_TOKENS, seed=1)
    # The draft imitates the target (plus noise), so that rounds often accept several tokens.
    context = torch.tensor(DRAFT_AS_TARGET + [len(TARGET_TOKENS)])
    imitation = target.table[context][:, context][:, :, DRAFT_AS_TARGET]
    draft.table = imitation + 0.5 * torch.randn(imitation.shape, generator=torch.Generator().manual_seed(1))
    engine = Engine(target, draft, SLEM(num_speculative_tokens=3))
    counts = torch.zeros(len(TARGET_TOKENS) ** 2)
    multi = 0
    for i in range(n):
        got = engine.generate("def f(x):", SamplingParams(max_new_tokens=3, seed=seed + i, **settings))
        a, b = (target.bucket[t] for t in got.token_ids[:2])
        counts[a * len(TARGET_TOKENS) + b] += 1
        multi += got.stats.accepted >= 2
    p = lambda prev, last: logits_to_probs(target.row(prev, last), **settings)  # noqa: E731
    prompt = tok_llama2.encode("def f(x):")
    first = p(prompt[-2], prompt[-1])
    joint = torch.stack([first[a] * p(prompt[-1], t) for a, t in enumerate(target.support)]).reshape(-1)
    return counts, joint, multi


def test_engine_samples_the_target_through_slem(tok_llama2, tok_smollm2):
    counts, joint, multi = engine_samples(tok_llama2, tok_smollm2, 2500, dict(temperature=1.0), seed=0)
    assert chi_square_pvalue(counts, joint) > 1e-3
    assert multi > 50, "rounds that accept two re-encoded tokens should be common"

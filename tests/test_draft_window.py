"""The draft's window on a long prompt (``--draft-window``, ``context.prompt_window``): the draft
reads only the prompt's end, the target all of it, and the answer stays the target alone's."""

import pytest
from test_engine import greedy, llama_draft, qwen_target  # noqa: F401  (fixtures)
from tiny_models import one_thread  # noqa: F401  (autouse fixture)

from anyspec.engine import Engine, SpeculativeConfig
from anyspec.engine.context import prompt_window
from anyspec.errors import ConfigError


def test_the_window_starts_at_a_multiple_and_holds_one_to_two_windows():
    ids = list(range(2000))
    assert prompt_window(ids[:1000], 256) == ids[512:1000]  # 488 tokens, from 2 * 256
    assert prompt_window(ids[:511], 256) == ids[:511]  # under two windows: all of it
    assert prompt_window(ids[:512], 256) == ids[256:512]
    assert prompt_window(ids[:1100], 256)[0] == 768  # the prompt grew: the start moves by whole windows
    assert prompt_window(ids[:1023], 256)[0] == 512  # and stays put until then
    assert prompt_window(ids, 0) == ids


def test_the_draft_reads_the_window_and_the_answer_is_the_target_alones(qwen_target, llama_draft):  # noqa: F811
    prompt = " ".join(f"item {i} costs {i * 3} coins;" for i in range(40)) + " so item 7 costs"
    want = Engine(qwen_target, None).generate(prompt, greedy(16)).token_ids
    for window, reads_all in ((0, True), (16, False)):
        engine = Engine(qwen_target, llama_draft, SpeculativeConfig(draft_window=window))
        got = engine.generate(prompt, greedy(16))
        assert got.token_ids == want
        prompt_ids = engine.reader.start(prompt, prompt, [])
        assert (len(prompt_ids.ids) > 100) == reads_all
        assert 16 <= len(prompt_ids.ids) < 32 or reads_all
        assert llama_draft.cached_ids[:len(prompt_ids.ids)] == prompt_ids.ids


def test_a_negative_window_is_refused():
    with pytest.raises(ConfigError, match="draft_window must be an integer >= 0"):
        SpeculativeConfig(draft_window=-1)


def test_past_its_room_the_draft_keeps_the_last_half_of_its_context():
    from anyspec.engine.context import DraftContext, fit

    def made():  # 3 prompt ids, then 4 generated ones ending at these bytes of "abcdefg"
        return DraftContext(ids=[1, 2, 3, 10, 11, 12, 13], n_fixed=3, text=bytearray(b"abcdefg"),
                            ends=[2, 3, 5, 7])

    assert fit(made(), 7) == made() and fit(made(), None) == made()
    cut = fit(made(), 5)  # 2 kept: generated ids go with their bytes
    assert (cut.ids, cut.n_fixed, bytes(cut.text), cut.ends) == ([12, 13], 0, b"defg", [2, 4])
    cut = fit(made(), 6)
    assert (cut.ids, cut.n_fixed, bytes(cut.text), cut.ends) == ([11, 12, 13], 0, b"cdefg", [1, 3, 5])
    longer = DraftContext(ids=[1, 2, 3, 4, 5, 6, 10], n_fixed=6, text=bytearray(b"ab"), ends=[2])
    cut = fit(longer, 6)  # 3 kept: prompt ids alone go
    assert (cut.ids, cut.n_fixed, bytes(cut.text), cut.ends) == ([5, 6, 10], 2, b"ab", [2])


@pytest.mark.parametrize("context", ["retokenize", "token-map"])
def test_a_draft_reads_no_further_than_its_own_context(qwen_target, tok_gpt2, context):  # noqa: F811
    """A GPT-2 draft's positions are learned: position 32 of a 32-position one is an IndexError.
    Its context slides instead, over a prompt and an answer longer than it, the answer the target's."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from anyspec.backends.transformers import TransformersModel

    torch.manual_seed(4)
    config = GPT2Config(vocab_size=len(tok_gpt2), n_positions=32, n_embd=32, n_layer=2, n_head=4)
    draft = TransformersModel(GPT2LMHeadModel(config).float(), tok_gpt2, name="gpt2-32")
    assert draft.context_length == 32
    prompt = " ".join(f"item {i} costs {i * 3} coins;" for i in range(8))
    want = Engine(qwen_target, None).generate(prompt, greedy(60, ignore_eos=True)).token_ids
    engine = Engine(qwen_target, draft, SpeculativeConfig(draft_window=0, draft_context=context))
    got = engine.generate(prompt, greedy(60, ignore_eos=True))
    assert got.token_ids == want and got.stats.drafted > 0
    assert len(draft.cached_ids) <= 32

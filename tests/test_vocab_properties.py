"""Property tests on synthetic vocabularies: small tokenizers built in memory, and raw tables."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from anyspec.vocab import VocabMapping, detect_family, token_table
from anyspec.vocab.bytes import TokenTable, bytes_to_unicode, strings_to_bytes
from anyspec.vocab.family import BYTE_LEVEL, METASPACE
from anyspec.vocab.mapping import _eligible, _match_exact, match_tables

SPECIALS = ["<s>", "</s>", "<unk>"]
# A small alphabet, so that two random vocabularies share tokens, including multi-byte UTF-8.
PIECE = st.lists(st.sampled_from([b"a", b"b", b" ", b"\n", b"\t", b"\xc3\xa9", b"\xe4\xb8\xad", b"\x10"]),
                 min_size=1, max_size=4).map(b"".join)


def wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def byte_level_tokenizer(pieces: list[bytes]) -> tuple[PreTrainedTokenizerFast, list[bytes | None]]:
    """Specials first, then every single byte, then ``pieces``; returns the bytes of each id."""
    table = bytes_to_unicode()
    spell = lambda b: "".join(table[x] for x in b)  # noqa: E731
    vocab, intended = {}, []
    for s in SPECIALS:
        vocab[s] = len(vocab)
        intended.append(None)
    for b in [bytes([i]) for i in range(256)] + pieces:
        if spell(b) not in vocab:
            vocab[spell(b)] = len(vocab)
            intended.append(b)
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return wrap(backend), intended


def metaspace_tokenizer(pieces: list[bytes]) -> tuple[PreTrainedTokenizerFast, list[bytes | None]]:
    """SentencePiece-style: ``▁`` for space, ``<0xNN>`` byte pieces, then ``pieces`` (UTF-8 only)."""
    vocab, intended = {}, []
    for s in SPECIALS:
        vocab[s] = len(vocab)
        intended.append(None)
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = len(vocab)
        intended.append(bytes([i]))
    for b in pieces:
        try:
            spelled = b.decode("utf-8").replace(" ", "\u2581")
        except UnicodeDecodeError:
            continue
        if spelled not in vocab:
            vocab[spelled] = len(vocab)
            intended.append(b)
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    backend.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return wrap(backend), intended


def check_mapping(mapping: VocabMapping, target_bytes: list, draft_bytes: list) -> None:
    d2t, t2d = mapping.draft_to_target.numpy(), mapping.target_to_draft.numpy()
    mask = mapping.intersection_mask.numpy()
    assert (mask == (d2t >= 0)).all() and mapping.intersection_size == int(mask.sum())
    target_has = {b for b in target_bytes if b}
    for d, b in enumerate(draft_bytes):
        if d >= len(d2t):
            break
        if not b or b not in target_has:
            assert d2t[d] == -1, (d, b)
            continue
        t = int(d2t[d])
        assert target_bytes[t] == b, "a mapped pair decodes to different bytes"
        assert int(d2t[t2d[t]]) == t and draft_bytes[int(t2d[t])] == b
    for t, b in enumerate(target_bytes):
        if t < len(t2d) and t2d[t] >= 0:
            assert draft_bytes[int(t2d[t])] == b


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_synthetic_families_are_detected():
    assert detect_family(byte_level_tokenizer([])[0]).kind == BYTE_LEVEL
    family = detect_family(metaspace_tokenizer([])[0])
    assert family.kind == METASPACE and family.byte_fallback and family.space == "\u2581"


@FAST
@given(target_pieces=st.lists(PIECE, max_size=30), draft_pieces=st.lists(PIECE, max_size=30),
       swap=st.booleans())
def test_byte_level_and_metaspace_mappings(target_pieces, draft_pieces, swap):
    from anyspec.vocab import cache as vocab_cache

    target, target_bytes = byte_level_tokenizer(target_pieces)
    draft, draft_bytes = metaspace_tokenizer(draft_pieces)
    if swap:
        target, target_bytes, draft, draft_bytes = draft, draft_bytes, target, target_bytes
    assert token_table(target).as_list()[3:] == target_bytes[3:]
    assert token_table(draft).as_list()[3:] == draft_bytes[3:]
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(vocab_cache, "vocab_cache_dir",
                                                                    lambda: Path(folder)):
        for cache in (False, True, True):
            mapping = VocabMapping(target, draft, len(target), len(draft), cache=cache)
            check_mapping(mapping, target_bytes, draft_bytes)
        assert mapping.from_cache
    newline = draft_bytes.index(b"\n")
    assert target_bytes[mapping.map_draft_to_target_ids(torch.tensor([newline])).item()] == b"\n"


pieces_with_gaps = st.lists(st.one_of(st.none(), PIECE, st.just(b"")), min_size=0, max_size=40)


def table_of(pieces, special_bits, fallback_bits) -> TokenTable:
    n = len(pieces)
    special = np.array([special_bits >> i & 1 for i in range(n)], dtype=bool)
    fallback = np.array([fallback_bits >> i & 1 for i in range(n)], dtype=bool)
    return TokenTable.from_list(list(pieces), special, fallback)


@settings(max_examples=200, deadline=None)
@given(pieces_with_gaps, pieces_with_gaps, st.integers(0, 2**40), st.integers(0, 2**40),
       st.integers(0, 2**40), st.integers(-5, 5), st.integers(-5, 5))
def test_match_tables_against_brute_force(target_pieces, draft_pieces, sbits, fbits, gbits, pad_t, pad_d):
    target = table_of(target_pieces, sbits, fbits)
    draft = table_of(draft_pieces, sbits >> 3, gbits)
    t_size, d_size = max(len(target) + pad_t, 1), max(len(draft) + pad_d, 1)
    d2t, t2d = match_tables(target, draft, t_size, d_size)
    assert d2t.shape == (d_size,) and t2d.shape == (t_size,)

    def preferred(table, size, piece):
        ids = [i for i in range(min(len(table), size)) if table.present[i] and not table.special[i]
               and table[i] == piece]
        return min(ids, key=lambda i: (table.fallback[i], i)) if ids else -1

    for d in range(d_size):
        ok = d < len(draft) and draft.present[d] and not draft.special[d] and draft[d]
        want = preferred(target, t_size, draft[d]) if ok else -1
        assert d2t[d] == want
    for t in range(t_size):
        ok = t < len(target) and target.present[t] and not target.special[t] and target[t]
        want = preferred(draft, d_size, target[t]) if ok else -1
        assert t2d[t] == want
    exact = _match_exact(target, draft, _eligible(target, t_size), _eligible(draft, d_size), t_size, d_size)
    assert (exact[0] == d2t).all() and (exact[1] == t2d).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=6), max_size=40))
def test_array_path_equals_reference_for_any_strings(strings):
    from anyspec.vocab.bytes import _array_bytes
    from anyspec.vocab.family import Family

    for family in (Family(BYTE_LEVEL), Family(METASPACE, space="\u2581", byte_fallback=True)):
        pieces = {i: 65 for i, s in enumerate(strings) if s == "A"} if family.byte_fallback else {}
        blob, offsets = _array_bytes(strings, family, pieces)
        got = [blob[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
        assert got == strings_to_bytes(strings, family, pieces)

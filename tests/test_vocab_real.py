"""The vocabulary bridge on real tokenizers of several families (fetched from pinned packages)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizer_files import reference_tokenizations

from anyspec.vocab import VocabMapping, detect_family
from anyspec.vocab.analyze import string_match
from anyspec.vocab.bytes import token_table
from anyspec.vocab.family import BYTE_LEVEL, METASPACE, WORDPIECE

REFERENCE_FAMILIES = [("gpt-2", "tok_gpt2", BYTE_LEVEL), ("qwen2", "tok_qwen2", BYTE_LEVEL),
                      ("llama-bpe", "tok_llama3", BYTE_LEVEL), ("llama-spm", "tok_llama2", METASPACE),
                      ("phi-3", "tok_phi3", METASPACE), ("mpt", None, BYTE_LEVEL),
                      ("command-r", None, BYTE_LEVEL), ("refact", None, BYTE_LEVEL),
                      ("gemma-4", None, METASPACE)]


@pytest.mark.parametrize(("name", "fixture", "family"), REFERENCE_FAMILIES)
def test_reference_tokenizations_concatenate_to_the_input(name, fixture, family, request, tok_ggml):
    tok = request.getfixturevalue(fixture) if fixture else tok_ggml(name)
    assert detect_family(tok).kind == family
    table = token_table(tok)
    prefix = family == METASPACE and _prepends_space(tok)
    checked = 0
    for text, ids in reference_tokenizations(name):
        got = b"".join(table[i] for i in ids)
        want = text.encode("utf-8")
        if prefix and want:
            want = b" " + want  # this SentencePiece vocabulary prepends a space to the input
        assert got == want, (name, text)
        checked += 1
    assert checked >= 40


def _prepends_space(tok) -> bool:
    from anyspec.vocab.family import _components

    backend = tok.backend_tokenizer
    parts = _components(backend.normalizer) + _components(backend.pre_tokenizer)
    return any(c.get("type") == "Prepend" or c.get("prepend_scheme") in ("first", "always") for c in parts)


def test_wordpiece_reference_matches_normalized_input(tok_bert):
    assert detect_family(tok_bert).kind == WORDPIECE
    table = token_table(tok_bert)
    normalizer = tok_bert.backend_tokenizer.normalizer
    unk = tok_bert.unk_token_id
    checked = 0
    for text, ids in reference_tokenizations("bert-bge"):
        if unk in ids:
            continue
        got = b"".join(table[i] for i in ids)
        want = "".join(normalizer.normalize_str(text).split()).encode("utf-8")
        assert got == want, text
        checked += 1
    assert checked >= 30


def test_tekken_bytes_are_the_rank_file_bytes(tok_tekken):
    from tokenizer_files import MISTRAL_COMMON, TEKKEN

    from anyspec.fetch import package_file
    from anyspec.vocab.bytes import tiktoken_ranks

    ranks = tiktoken_ranks(package_file(*MISTRAL_COMMON, *TEKKEN))
    table = token_table(tok_tekken)
    n_special = 1000
    assert table.special[:n_special].all() and not table.special[n_special:].any()
    for rank in [0, 10, 255, 256, 1000, 5000, 65000, len(table) - n_special - 1]:
        assert table[n_special + rank] == ranks[rank]
    text = "def f(x):\n\treturn x * 2  # café\n"
    ids = tok_tekken.encode(text, add_special_tokens=False)
    assert b"".join(table[i] for i in ids) == text.encode()


def _mapped_pairs_agree(mapping: VocabMapping) -> int:
    d2t = mapping.draft_to_target.numpy()
    pairs = np.flatnonzero(d2t >= 0)
    target, draft = mapping.target_token_bytes, mapping.draft_token_bytes
    bad = [d for d in pairs.tolist() if draft[d] != target[int(d2t[d])]]
    assert not bad, f"{len(bad)} false matches, e.g. draft ids {bad[:5]}"
    return len(pairs)


PAIRS = [("tok_qwen2", "tok_mistral"), ("tok_mistral", "tok_qwen2"), ("tok_qwen2", "tok_llama2"),
         ("tok_llama3", "tok_gpt2"), ("tok_phi3", "tok_smollm2"), ("tok_qwen2", "tok_gemma3"),
         ("tok_gemma3", "tok_qwen2"), ("tok_tekken", "tok_llama2"), ("tok_bert", "tok_gpt2"),
         ("tok_llama2", "tok_mistral"), ("tok_gemma3", "tok_mistral"), ("tok_llama3", "tok_gemma3")]


@pytest.mark.parametrize(("target_name", "draft_name"), PAIRS)
def test_no_false_matches_and_at_least_string_matching(target_name, draft_name, request, vocab_cache):
    target, draft = request.getfixturevalue(target_name), request.getfixturevalue(draft_name)
    mapping = VocabMapping(target, draft, len(target), len(draft))
    n = _mapped_pairs_agree(mapping)
    assert n == mapping.intersection_size > 0
    by_string = string_match(target, draft, mapping.target_token_bytes, mapping.draft_token_bytes,
                             len(target), len(draft))
    correct = [d for d in np.flatnonzero(by_string >= 0).tolist()
               if mapping.draft_token_bytes[d] == mapping.target_token_bytes[int(by_string[d])]]
    assert mapping.intersection_size >= len(correct)
    inside = mapping.intersection_mask.numpy()
    assert inside[correct].all(), "a true string match is missing from the byte intersection"


@pytest.mark.parametrize("draft_name", ["tok_gemma3", "tok_mistral"])
def test_newline_tab_and_accent_are_shared_with_qwen(draft_name, tok_qwen2, request, vocab_cache):
    draft = request.getfixturevalue(draft_name)
    for target, other, name in [(tok_qwen2, draft, "forward"), (draft, tok_qwen2, "reverse")]:
        mapping = VocabMapping(target, other, len(target), len(other))
        target_table, draft_table = mapping.target_token_bytes, mapping.draft_token_bytes
        for text in ["\n", "\t", "é"]:
            piece = text.encode()
            draft_ids = [i for i, b in enumerate(draft_table.pieces)
                         if b == piece and not draft_table.special[i]]
            target_ids = [i for i, b in enumerate(target_table.pieces)
                          if b == piece and not target_table.special[i]]
            assert draft_ids and target_ids, (name, text)
            preferred = min(target_ids, key=lambda i: (target_table.fallback[i], i))
            mapped = mapping.map_draft_to_target_ids(torch.tensor(draft_ids))
            assert mapped.tolist() == [preferred] * len(draft_ids), (name, text)
            d = draft_ids[0]
            assert mapping.intersection_mask[d]


def test_special_tokens_and_eos(tok_qwen2, tok_gemma3, vocab_cache):
    mapping = VocabMapping(tok_qwen2, tok_gemma3, 151936, 262144)
    im_end = tok_qwen2.convert_tokens_to_ids("<|im_end|>")
    end_of_turn = tok_gemma3.convert_tokens_to_ids("<end_of_turn>")
    assert im_end in mapping.target_eos_ids and tok_qwen2.eos_token_id in mapping.target_eos_ids
    assert end_of_turn in mapping.draft_eos_ids and tok_gemma3.eos_token_id in mapping.draft_eos_ids
    for token in ["<bos>", "<eos>", "<pad>", "<unused12>", "<start_of_turn>", "<end_of_turn>"]:
        idx = tok_gemma3.convert_tokens_to_ids(token)
        assert not mapping.intersection_mask[idx], token
    for token in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "[PAD151700]"]:
        idx = tok_qwen2.convert_tokens_to_ids(token)
        assert mapping.target_to_draft[idx] == -1, token


ALL_TOKENIZERS = ["tok_gpt2", "tok_llama2", "tok_phi3", "tok_qwen2", "tok_llama3", "tok_bert", "tok_mistral",
                  "tok_tekken", "tok_smollm2", "tok_gemma3"]


@pytest.mark.parametrize("fixture", ALL_TOKENIZERS)
def test_array_path_equals_token_by_token_reference(fixture, request):
    from anyspec.vocab.bytes import byte_piece_ids, strings_to_bytes, token_strings

    tok = request.getfixturevalue(fixture)
    family = detect_family(tok)
    strings = token_strings(tok)
    pieces = byte_piece_ids(tok, strings) if family.byte_fallback else {}
    reference = strings_to_bytes(strings, family, pieces)
    table = token_table(tok)
    assert len(table) == len(tok)
    assert table.as_list() == reference
    special = set(np.flatnonzero(table.special).tolist())
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        idx = getattr(tok, name, None)
        if idx is not None:
            assert idx in special, name


@pytest.mark.parametrize(("fixture", "markers"), [
    ("tok_llama3", ["<|end_of_text|>", "<|eot_id|>"]), ("tok_smollm2", ["<|im_end|>"]),
    ("tok_mistral", ["</s>"]), ("tok_gpt2", ["<|endoftext|>"]), ("tok_phi3", ["<|end|>", "<|endoftext|>"]),
])
def test_eos_ids_include_end_of_turn_markers(fixture, markers, request):
    from anyspec.vocab.bytes import eos_ids

    tok = request.getfixturevalue(fixture)
    found = eos_ids(tok)
    assert tok.eos_token_id in found
    for marker in markers:
        assert tok.convert_tokens_to_ids(marker) in found, marker


def test_sentencepiece_model_file_keeps_the_dummy_prefix(tok_mistral):
    import sentencepiece
    from tokenizer_files import MISTRAL_COMMON, MISTRAL_V1

    from anyspec.fetch import package_file

    model_file = str(package_file(*MISTRAL_COMMON, *MISTRAL_V1))
    reference = sentencepiece.SentencePieceProcessor(model_file=model_file)
    for text in ["Hello world", "def f(x):\n\treturn x # café\n", "Zoë\tZürich"]:
        assert tok_mistral.encode(text, add_special_tokens=False) == reference.encode(text), text


@pytest.mark.parametrize("name", ["qwen2", "llama-bpe", "gpt-2", "mpt", "refact", "command-r"])
def test_a_gguf_tokenizer_from_metadata_alone_splits_as_its_pre_tokenizer_says(name, capsys):
    """Architectures transformers does not load get their tokenizer from the GGUF's metadata alone;
    its ``tokenizer.ggml.pre`` picks the regex that splits text before the merges, so the ids are
    llama.cpp's own on its reference texts."""
    from tokenizer_files import ggml_vocab_file

    from anyspec.vocab.gguf import _bpe_from_gguf, read_gguf_metadata

    fields = read_gguf_metadata(ggml_vocab_file(name))
    tok, note = _bpe_from_gguf(fields)
    checked = 0
    for text, ids in reference_tokenizations(name):
        assert tok.encode(text, add_special_tokens=False) == ids, (name, text)
        checked += 1
    assert checked >= 40 and note is None and capsys.readouterr().err == ""


def test_a_gguf_pre_tokenizer_anyspec_does_not_know_is_said(capsys):
    from tokenizer_files import ggml_vocab_file

    from anyspec.vocab.gguf import _bpe_from_gguf, read_gguf_metadata

    fields = read_gguf_metadata(ggml_vocab_file("qwen2")) | {"tokenizer.ggml.pre": "made-up"}
    assert "pre-tokenizer 'made-up' is not one anyspec knows" in _bpe_from_gguf(fields)[1]


def test_a_gguf_tokenizer_transformers_reads_splits_as_its_pre_tokenizer_says_too(tmp_path, monkeypatch):
    """transformers reads SmolLM2's GGUF (a Llama) but splits its ``smollm`` kind as GPT-2's, without
    the digits first: the tokenizer anyspec loads splits as the file says, as the metadata-only one."""
    from tokenizer_files import SMOLLM2, SMOLLM2_GGUF, _registry

    from anyspec.fetch import package_file
    from anyspec.vocab.analyze import default_sample
    from anyspec.vocab.gguf import _bpe_from_gguf, read_gguf_metadata
    from anyspec.vocab.loading import load_tokenizer

    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(tmp_path))  # converted anew, not read from the cache
    path = _registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF))
    text = default_sample() + "}\n 12345 at 3.14 and\n\n 2026"
    tokenizer = load_tokenizer(path)
    loaded = tokenizer.encode(text, add_special_tokens=False)
    assert loaded == _bpe_from_gguf(read_gguf_metadata(path))[0].encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("}\n 12", add_special_tokens=False)) == [
        "}", "\u010a\u0120", "1", "2"]  # a newline and a space, then each digit alone

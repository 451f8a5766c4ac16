"""VocabMapping's API, the cache, load_tokenizer's errors and the analyze CLI."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from test_vocab_properties import byte_level_tokenizer, metaspace_tokenizer, wrap
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from anyspec.cli import main
from anyspec.errors import ConfigError
from anyspec.vocab import VocabMapping, detect_space_prefix, load_tokenizer
from anyspec.vocab import cache as vocab_cache
from anyspec.vocab.mapping import unk_id


@pytest.fixture(scope="module")
def pair():
    target, target_bytes = byte_level_tokenizer([b" a", b"ab", b"\n\n", b"\xc3\xa9t\xc3\xa9"])
    draft, draft_bytes = metaspace_tokenizer([b" a", b"ab", b"\xc3\xa9t\xc3\xa9", b"zz"])
    return target, target_bytes, draft, draft_bytes


def test_constrain_draft_logits(pair, vocab_cache):
    target, _, draft, _ = pair
    mapping = VocabMapping(target, draft, len(target), len(draft))
    logits = torch.randn(2, 3, len(draft), dtype=torch.bfloat16)
    before = logits.clone()
    out = mapping.constrain_draft_logits(logits)
    assert torch.equal(logits, before), "the input must not be modified"
    inside = mapping.intersection_mask
    assert torch.isneginf(out[..., ~inside]).all()
    assert torch.equal(out[..., inside], logits[..., inside])
    assert 0 < int(inside.sum()) < len(draft)
    with pytest.raises(ValueError, match="draft vocab"):
        mapping.constrain_draft_logits(torch.zeros(len(draft) + 1))


def test_maps_absent_unk_and_out_of_range(pair, vocab_cache):
    target, target_bytes, draft, draft_bytes = pair
    mapping = VocabMapping(target, draft, len(target), len(draft))
    zz = draft_bytes.index(b"zz")
    ab = draft_bytes.index(b"ab")
    ids = torch.tensor([[ab, zz], [-3, len(draft) + 7]])
    got = mapping.map_draft_to_target_ids(ids)
    assert got.shape == ids.shape and got.dtype == torch.long
    assert got.tolist() == [[target_bytes.index(b"ab"), -1], [-1, -1]]
    filled = mapping.map_draft_to_target_ids(ids, fill_unk=True)
    assert filled.tolist() == [[target_bytes.index(b"ab"), target.unk_token_id]] + [[target.unk_token_id] * 2]
    back = mapping.map_target_to_draft_ids(got[0, :1])
    assert back.tolist() == [ab]
    assert mapping.target_token_bytes[int(got[0, 0])] == b"ab"
    assert mapping.draft_token_bytes[len(draft) + 100] == b""


def test_padded_and_truncated_model_vocabs(pair, vocab_cache):
    target, target_bytes, draft, draft_bytes = pair
    padded = VocabMapping(target, draft, len(target) + 64, len(draft) + 32)
    assert padded.draft_to_target.shape == (len(draft) + 32,)
    assert padded.target_to_draft.shape == (len(target) + 64,)
    assert (padded.draft_to_target[len(draft):] == -1).all()
    assert (padded.target_to_draft[len(target):] == -1).all()
    assert padded.intersection_mask.shape == (len(draft) + 32,)
    ete = target_bytes.index(b"\xc3\xa9t\xc3\xa9")
    cut = VocabMapping(target, draft, ete, len(draft))  # the model has no row for that token
    assert cut.target_to_draft.shape == (ete,)
    assert (cut.draft_to_target < ete).all()
    assert draft_bytes.index(b"\xc3\xa9t\xc3\xa9") not in cut.intersection_mask.nonzero().flatten().tolist()


def test_token_id_zero_is_an_ordinary_id(vocab_cache):
    vocab = {"a": 0, "b": 1, "ab": 2}
    left = wrap(Tokenizer(models.BPE(vocab, [])))
    right = wrap(Tokenizer(models.BPE({"ab": 0, "a": 1, "c": 2}, [])))
    mapping = VocabMapping(left, right, 3, 3)
    assert mapping.draft_to_target.tolist() == [2, 0, -1]
    assert mapping.target_to_draft.tolist() == [1, -1, 0]
    assert mapping.map_draft_to_target_ids(torch.tensor([1])).item() == 0


def test_lowest_id_wins_among_equal_bytes(vocab_cache):
    target = wrap(Tokenizer(models.BPE({"z": 0, "a": 1, "q": 2, "aa": 3}, [])))
    dup = Tokenizer(models.BPE({"<0x61>": 0, "y": 1, "a": 2, "a\u2581": 3}, [], byte_fallback=True))
    dup.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    draft = wrap(dup)
    mapping = VocabMapping(target, draft, 4, 4)
    # draft ids 0 (<0x61>) and 2 ("a") are both b"a": both map to target 1, and target 1 maps
    # back to the ordinary token 2 rather than the byte piece.
    assert mapping.draft_to_target.tolist()[:3] == [1, -1, 1]
    assert mapping.target_to_draft.tolist()[1] == 2


def test_unk_ladder():
    tok, _ = byte_level_tokenizer([])
    assert unk_id(tok, "target") == tok.unk_token_id
    no_unk = wrap(Tokenizer(models.BPE({"a": 0, "</s>": 1}, [])))
    no_unk.unk_token = None
    with pytest.warns(UserWarning, match="eos"):
        assert unk_id(no_unk, "draft") == no_unk.eos_token_id == 1

    class Bare:
        unk_token_id = None
        eos_token_id = None

    with pytest.raises(ValueError, match="neither an unk nor an eos"):
        unk_id(Bare(), "draft")


def test_detect_space_prefix_never_raises(tok_gpt2, tok_llama2):
    assert detect_space_prefix(tok_gpt2) == ("Ġ",)
    assert detect_space_prefix(tok_llama2) == ("▁",)

    class Broken:
        def encode(self, text, add_special_tokens=False):
            raise RuntimeError("no")

    class Empty:
        def encode(self, text, add_special_tokens=False):
            return []

        def convert_ids_to_tokens(self, ids):
            return []

    class SplitMarker(Empty):
        def encode(self, text, add_special_tokens=False):
            return [7, 8]

        def convert_ids_to_tokens(self, ids):
            return ["\u2581", "a"]

    assert detect_space_prefix(SplitMarker()) == ("▁",)
    assert detect_space_prefix(Broken()) == ("Ġ", "▁")
    assert detect_space_prefix(Empty()) == ("Ġ", "▁")


def test_cache_roundtrip_corruption_and_tampering(pair, vocab_cache):
    target, target_bytes, draft, draft_bytes = pair
    first = VocabMapping(target, draft, len(target), len(draft))
    assert not first.from_cache
    files = list(vocab_cache.iterdir())
    assert [f.suffix for f in files] == [".bin"], "exactly one finished file, no partial left behind"
    second = VocabMapping(target, draft, len(target), len(draft))
    assert second.from_cache
    assert torch.equal(first.draft_to_target, second.draft_to_target)
    assert torch.equal(first.target_to_draft, second.target_to_draft)
    assert second.target_token_bytes.as_list() == first.target_token_bytes.as_list()

    files[0].write_bytes(b"garbage")
    third = VocabMapping(target, draft, len(target), len(draft))
    assert not third.from_cache and torch.equal(third.draft_to_target, first.draft_to_target)

    # A cache entry whose bytes disagree with the tokenizer is detected by the sampled check.
    key = vocab_cache_module().mapping_key(target, draft, len(target), len(draft))
    t, d, d2t, t2d = vocab_cache_module().load(key)
    wrong = type(t)(bytes(len(t.blob)), t.offsets, t.present, t.special, t.fallback)
    vocab_cache_module().save(key, wrong, d, d2t, t2d)
    fourth = VocabMapping(target, draft, len(target), len(draft))
    assert not fourth.from_cache and fourth.target_token_bytes.as_list() == first.target_token_bytes.as_list()

    other = VocabMapping(target, draft, len(target) + 1, len(draft))
    assert not other.from_cache, "model vocab sizes are part of the key"
    none = VocabMapping(draft, target, len(draft), len(target), cache=False)
    assert not none.from_cache and len(list(vocab_cache.iterdir())) == 2


def vocab_cache_module():
    return vocab_cache


def test_fingerprint_is_content_based(pair):
    target, _, draft, _ = pair
    assert vocab_cache.fingerprint(target) == vocab_cache.fingerprint(byte_level_tokenizer(
        [b" a", b"ab", b"\n\n", b"\xc3\xa9t\xc3\xa9"])[0])
    assert vocab_cache.fingerprint(target) != vocab_cache.fingerprint(draft)
    assert vocab_cache.fingerprint(target) != vocab_cache.fingerprint(byte_level_tokenizer([b" a"])[0])


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="not a tokenizer"):
        load_tokenizer(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no tokenizer files"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ConfigError) as err:
        load_tokenizer(tmp_path / "bad.gguf")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as err2:
        load_tokenizer(tmp_path / "tokenizer.json")
    for e in (err, err2):
        assert "\n" not in str(e.value)


def test_load_tokenizer_folder_and_json(tmp_path):
    tok, intended = byte_level_tokenizer([b"hello"])
    tok.save_pretrained(tmp_path / "tok")
    for path in (tmp_path / "tok", tmp_path / "tok" / "tokenizer.json"):
        loaded = load_tokenizer(path)
        assert len(loaded) == len(tok)
        assert loaded.convert_tokens_to_ids("hello") == intended.index(b"hello")


def test_cli_analyze_errors_are_one_line(tmp_path, capsys):
    assert main(["analyze", "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err

    for args in (["--target", "no-such-model", "--draft", "no-such-model"],
                 ["--target", str(tmp_path), "--draft", str(tmp_path),
                  "--text", str(tmp_path / "missing.txt")]):
        assert main(["analyze", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err

    left = Tokenizer(models.BPE({"a": 0, "b": 1}, []))
    left.pre_tokenizer = pre_tokenizers.ByteLevel()
    left.decoder = decoders.ByteLevel()
    right = Tokenizer(models.BPE({"c": 0, "d": 1}, []))
    right.decoder = decoders.ByteLevel()
    wrap(left).save_pretrained(tmp_path / "left")
    wrap(right).save_pretrained(tmp_path / "right")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["analyze", "--target", str(tmp_path / "left"), "--draft", str(tmp_path / "right")]) == 2
    err = capsys.readouterr().err
    assert "share no token" in err and err.count("\n") == 1


def test_cli_analyze_report(tok_gpt2, tok_llama2, capsys, tmp_path, vocab_cache):
    from tokenizer_files import ggml_vocab_file

    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n\treturn x  # café\n")
    args = ["analyze", "--target", str(ggml_vocab_file("gpt-2")),
            "--draft", str(ggml_vocab_file("llama-spm"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--text", str(text), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(args) == 0
    plain = capsys.readouterr().out
    s, i, c = report["string_matching"], report["intersection"], report["coverage"]
    assert s["false_matches"] > 0, "byte-level vs SentencePiece strings give false matches"
    assert i["draft_tokens"] >= s["correct_matches"] and s["missed_by_strings"] > 0
    ids = tok_gpt2.encode(text.read_text(), add_special_tokens=False)
    assert c["target_tokens"] == len(ids) and 0 < c["in_intersection"] <= len(ids)
    assert report["target"]["family"] == "byte-level" and "metaspace" in report["draft"]["family"]
    assert "Verdict:" in plain and "FALSE" in plain and f"{s['false_matches']:,}" in plain
    assert np.isclose(c["share"], c["in_intersection"] / c["target_tokens"], atol=1e-4)

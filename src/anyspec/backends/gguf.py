"""GGUF models run in their own block formats on anyspec's CPU kernel (``csrc/quant.cpp``).

The file is memory-mapped with the ``gguf`` package and every matrix keeps the integer weights and
scales of the quantization type it was stored in (``MATRIX_TYPES``; F16, BF16 and F32 too), so
the model that runs is the file the user has, and loading it takes seconds. Each activation row
is quantized to int8 by itself and multiplied with integer dot products, so a row's logits are
the same bits whatever number of rows is computed with it: verifying k draft tokens scores each
one exactly as decoding it alone would.

The architectures are arch.py's table. ``gguf_problem`` says why another file cannot run here,
before any heavy work.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from anyspec.backends.arch import (
    MISSING_METADATA,
    arch_problem,
    describe,
    field_of,
    kernel_arch,
    layer_tensors,
    shape_problem,
)
from anyspec.backends.gguf_file import read_gguf
from anyspec.backends.linear import rowwise_kernel, rowwise_problem
from anyspec.backends.stack import Rows, StackModel
from anyspec.errors import ConfigError

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16 = (
    0, 1, 2, 3, 6, 7, 8, 11, 12, 13, 14, 20, 23, 30)
MATRIX_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q3_K: "Q3_K",
                Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS",
                F32: "F32", F16: "F16", BF16: "BF16"}
# csrc/quant.h: the blocks interleaved 16 rows at a time (repack_x16), each in the layout that holds
# its integer weights and scales exactly
Q4_0_X16, Q4_1_X16, Q8_0_X16, Q4_K_X16, Q6_K_X16, S8_X16 = 1002, 1003, 1008, 1012, 1014, 1100
X16 = {Q4_0: Q4_0_X16, Q4_1: Q4_1_X16, Q8_0: Q8_0_X16, Q4_K: Q4_K_X16, Q6_K: Q6_K_X16, Q5_0: Q8_0_X16,
       IQ4_NL: Q8_0_X16, Q3_K: Q6_K_X16, Q5_1: S8_X16, Q5_K: S8_X16, IQ4_XS: S8_X16}
EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>")


def gguf_problem(path: Path, reader=None) -> str | None:
    """Why this GGUF file cannot run on anyspec's GGUF kernels (None: it can)."""
    reader = reader or read_gguf(path)
    problem = arch_problem(reader)
    if problem:
        return problem
    for t in reader.tensors:
        kind = int(t.tensor_type)
        if kind in X16 and t.name.startswith("blk.") and len(t.shape) == 2 and int(t.shape[1]) % 16:
            return f"tensor {t.name} has {int(t.shape[1])} rows (quantized products: a multiple of 16)"
        if kind not in MATRIX_TYPES:
            kinds = ", ".join(MATRIX_TYPES.values())
            return f"tensor {t.name} is {t.tensor_type.name} (GGUF kernels: {kinds})"
    return broken_problem(reader) or rowwise_problem()


def check_consistent(path: Path) -> None:
    """A one-line ConfigError for a file whose tensors contradict its metadata (``broken_problem``),
    or that holds none."""
    reader = read_gguf(path)
    if not reader.tensors:
        raise ConfigError(f"{path} holds a vocabulary and no weights (a --vocab-only GGUF); give a model's "
                          "GGUF file")
    if broken := broken_problem(reader):
        raise ConfigError(f"{Path(path).name} is inconsistent: {broken}; convert or download it again")


def broken_problem(reader) -> str | None:
    """A tensor that an architecture of the table needs and the file lacks, one whose shape
    contradicts the metadata, or metadata such an architecture cannot go without (None: all there and
    consistent, or an architecture the table lacks)."""
    if problem := arch_problem(reader):
        return problem if problem == MISSING_METADATA else None
    d = describe(reader, lambda name: None)
    names = {t.name for t in reader.tensors}
    for i in range(d.n_layers):
        missing = [n for n in layer_tensors(d.family, i).values() if n not in names]
        if missing:
            return f"tensor {missing[0]} is missing"
    return shape_problem(reader, d)


def dequantized_problem(reader) -> str | None:
    """Why transformers cannot load this file de-quantized (None: it can), from the metadata alone."""
    from gguf import GGMLQuantizationType
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = field_of(reader, "general.architecture", "?")
    if not {arch, arch.replace("moe", "_moe")} & set(GGUF_SUPPORTED_ARCHITECTURES):
        return f"transformers reads no GGUF architecture {arch}"
    for t in reader.tensors:
        kind = GGMLQuantizationType(int(t.tensor_type)).name
        if kind not in DEQUANTIZABLE_NAMES:
            return f"the gguf package de-quantizes no {kind}"
    return None


# what the gguf package de-quantizes (gguf.quants), for transformers' loading of a GGUF file
DEQUANTIZABLE_NAMES = ("F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ2_XXS IQ2_XS IQ2_S "
                       "IQ3_XXS IQ3_S IQ1_S IQ1_M IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4 NVFP4").split()


class GGUFModel(StackModel):
    """A GGUF decoder and its KV cache: ``extend`` appends tokens and returns their logits.

    It can hold more sequences than its own (``new_sequence``), each with its own cache, and
    ``forward`` extends several of them in one pass over the weights (``stack.StackModel``); a
    row's logits are the same bits whatever else is in the pass. ``kernel`` is a build of
    ``csrc/`` other than the cached one (``benchmarks/kernel_ab.py``); its weights, layers and
    arch are that build's objects.
    """

    row_invariant = True  # every product and the attention compute each row alone (tested)
    tree_attention = True  # forward takes a tree of rows, each attending to its own ancestors
    context_length: int  # the file's

    def __init__(self, path: str | os.PathLike, name: str = "model", reader=None, kernel=None):
        from anyspec.vocab import load_tokenizer

        self.path = Path(path)
        reader = reader or read_gguf(self.path)
        problem = gguf_problem(self.path, reader)
        if problem:
            raise ConfigError(f"{self.path.name} cannot run on anyspec's GGUF kernels: {problem}")
        self.name, self.dtype, self.device = name, "gguf", torch.device("cpu")
        tensors = {t.name: t for t in reader.tensors}
        d = self.description = describe(reader, lambda n: _vector(tensors[n]))
        for note in d.notes:
            print(f"anyspec: {self.path.name}: {note}", file=sys.stderr)
        self.heads, self.kv_heads, self.head_dim, self.eps = d.heads, d.kv_heads, d.head_dim, d.eps
        self.context_length, self.n_layers = d.context_length, d.n_layers
        self.kernel = kernel or rowwise_kernel()
        self.arch = kernel_arch(self.kernel, d)
        self.embed = _matrix(tensors["token_embd.weight"])
        self.vocab_size = self.embed[0].shape[0]
        self._head_tensor = tensors.get("output.weight") or tensors["token_embd.weight"]
        self.lm_head = _product(self.kernel, self._head_tensor)
        self.final_norm = _vector(tensors["output_norm.weight"])
        self.layers = [self._layer(tensors, i) for i in range(d.n_layers)]
        self.tokenizer = load_tokenizer(self.path)
        self._eos = {int(v) for v in [field_of(reader, "tokenizer.ggml.eos_token_id")] if v is not None}
        self.hold_sequences()

    def _layer(self, tensors: dict, i: int):
        """Layer ``i`` as the stack takes it: its norms, its products (quantized rows regrouped)."""
        layer = self.kernel.Layer()
        for key, name in layer_tensors(self.description.family, i).items():
            if key.endswith("norm"):
                setattr(layer, key, _vector(tensors[name]))
                continue
            product = self.kernel.Product()
            product.weight, product.type, product.K = _product(self.kernel, tensors[name])
            bias = tensors.get(name.replace(".weight", ".bias"))
            if bias is not None:
                product.bias = _vector(bias)
            setattr(layer, key, product)
        layer.rope = self.description.layer_rope[i]
        layer.window = self.description.layer_window[i]
        return layer

    @property
    def kernel_level(self) -> int:
        return self.kernel.isa()

    def eos_ids(self) -> set[int]:
        """The file's end-of-sequence id and the chat turn's end tokens its vocabulary has."""
        ids = set(self._eos)
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in EOS_NAMES if t in vocab and vocab[t] < self.vocab_size)
        return ids

    def restricted_head(self, ids: torch.Tensor) -> Head:
        """The LM head's rows ``ids`` alone, for forwards whose caller reads no other logits (TLI's
        draft, confined to the intersection). Each row is the same bits as in the whole head."""
        ids = torch.as_tensor(ids, dtype=torch.long).sort().values
        return Head(ids, _product(self.kernel, self._head_tensor, ids))

    def decode(self, rows: Rows, head: Head | None) -> torch.Tensor:
        """The logits of ``rows.picked`` (``StackModel.forward``). With a ``head``
        (``restricted_head``) only its rows are computed, and the others are -inf."""
        weight, kind, k = self.embed
        x = self.kernel.dequant_rows(weight, kind, k, rows.ids)
        if self.description.embed_scale != 1.0:
            x = x * self.description.embed_scale
        h = self.kernel.rms_norm_rows(self.run_stack(x, rows, self.layers), self.final_norm, self.eps)
        weight, kind, k = self.lm_head if head is None else head.product
        logits = self.kernel.typed_linear(h, weight, kind, k, None, None)
        width = self.vocab_size if head is None else len(head.ids)
        if logits.shape[1] != width:
            logits = logits[:, :width]
        if self.description.logit_scale != 1.0:
            logits = logits / self.description.logit_scale
        if self.description.final_softcap:
            cap = self.description.final_softcap
            logits = torch.tanh(logits / cap) * cap
        if head is not None:
            part, logits = logits, logits.new_full((len(rows.picked), self.vocab_size), float("-inf"))
            logits[:, head.ids] = part
        return logits


class Head(NamedTuple):
    ids: torch.Tensor  # the vocabulary rows it computes, ascending
    product: tuple  # (weight, type, K) of those rows


def _matrix(t) -> tuple[torch.Tensor, int, int]:
    """(weight, type, K) of a 2-D GGUF tensor; quantized rows stay bytes of the memory-mapped file."""
    kind, k = int(t.tensor_type), int(t.shape[0])
    data = np.asarray(t.data)
    if kind == F16:  # widened once; exact
        return torch.from_numpy(data.astype(np.float32)).reshape(-1, k), F32, k
    with warnings.catch_warnings():  # the map is read-only; the kernels never write to it
        warnings.simplefilter("ignore", UserWarning)
        if kind == F32:
            return torch.from_numpy(data).reshape(-1, k), F32, k
        if kind == BF16:
            return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16).reshape(-1, k), BF16, k
        return torch.from_numpy(data.reshape(data.shape[0], -1)), kind, k


def _product(kernel, t, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, int, int]:
    """A matrix for products: quantized rows interleaved 16 at a time (the same values, regrouped);
    only its ``rows``, where given."""
    weight, kind, k = _matrix(t)
    if rows is not None:
        weight = weight[rows].contiguous()
    if kind in X16:
        return kernel.repack_x16(weight, kind, k), X16[kind], k
    return weight, kind, k


def _vector(t) -> torch.Tensor:
    return torch.from_numpy(np.asarray(t.data, dtype=np.float32).copy()).reshape(-1)

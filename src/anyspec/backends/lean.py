"""A lean forward pass for Llama-family decoders (llama, qwen2, mistral) on anyspec's CPU kernel.

Its decoder is described as a GGUF file's is (``arch.describe_hf``, the same ``Description``), so
the C++ stack gets the same ``Arch`` from it (``arch.kernel_arch``).

A small model's forward is many small matrix products, and transformers' per-layer Python (cache
objects, masks, hooks, dtype casts) can cost more than the products themselves. This is the same
computation, written out once:

* q/k/v and gate/up are one matrix product each (the rows of the swapped-in kernels are
  concatenated, scales included, so the numbers are those of the separate products; the
  original modules become views of the fused weights, one copy in memory);
* the KV cache (``stack.KVCache``) is one preallocated tensor per layer, grown by doubling;
  ``crop`` only forgets positions, and the next ``extend`` writes over them; the model holds
  several sequences, each with its own cache (``stack.StackModel``);
* norms, rotary embeddings and attention run in fp32.

With anyspec's row-wise kernel in every product (int8 and bf16 models) the whole stack is one C++ call
(``decoder_forward`` in ``csrc/decoder.cpp``), the GGUF models' own: rows of several sequences
run together and a tree of rows attends along its branches, each row the same bits as alone.
Otherwise each sequence runs the same steps in Python below, the readable reference that the
tests compare with transformers, one sequence after another and as a chain only.

Used for int8 and bf16 model folders on anyspec's row-wise kernel (GGUF files run the same C++
stack from ``backends/gguf.py``). The numbers differ from transformers' in rounding only
(activations stay fp32 here, transformers rounds them to bf16 between steps), so a near-tie can
go the other way than in transformers' own forward. For a draft that changes nothing but the
acceptance; a target runs this same forward alone and in speculation, so speculation stays
lossless against it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from anyspec.backends.arch import describe_hf, hf_problem, kernel_arch
from anyspec.backends.linear import RowwiseLinear, rowwise_kernel
from anyspec.backends.stack import Rows, Sequence, StackModel, check_distinct
from anyspec.backends.transformers import Pretrained

BF16, I8S = 30, 1000  # decoder_forward's type codes (csrc/quant.h) for the row-wise kernels' weights


def lean_unsupported(model) -> str | None:
    """Why ``model`` cannot run the lean forward, or None when it can."""
    if os.environ.get("ANYSPEC_LEAN", "1") == "0":
        return "turned off with ANYSPEC_LEAN=0"
    problem = hf_problem(model.config)
    if problem:
        return problem
    layer = model.model.layers[0]
    linears = [layer.self_attn.q_proj, layer.mlp.gate_proj, model.lm_head]
    if not all(isinstance(m, RowwiseLinear) or (type(m) is nn.Linear and m.weight.dtype == torch.float32)
               for m in linears):
        return "its linear layers are neither anyspec's row-wise kernel nor fp32 nn.Linear"
    return None


def fuse(*linears: nn.Module) -> nn.Module:
    """One module whose output is the outputs of ``linears`` side by side.

    Row-wise kernels are fused in place: each original module's weight (and scale, bias) becomes a
    view into the fused tensors, so transformers' own forward keeps working without a second copy.
    """
    if all(isinstance(m, RowwiseLinear) for m in linears):
        scales = [m.scale for m in linears]
        fused = RowwiseLinear.from_parts(
            torch.cat([m.weight for m in linears]),
            None if scales[0] is None else torch.cat(scales),
            _cat_bias([m.bias for m in linears], [m.out_features for m in linears]))
        start = 0
        for m in linears:
            rows = slice(start, start + m.out_features)
            m.weight = fused.weight[rows]
            if m.scale is not None:
                m.scale = fused.scale[rows]
            if m.bias is not None:
                m.bias = fused.bias[rows]
            start += m.out_features
        return fused
    fused = nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                      bias=any(m.bias is not None for m in linears))
    fused.weight.data = torch.cat([m.weight.detach().float() for m in linears])
    if fused.bias is not None:
        fused.bias.data = _cat_bias([m.bias for m in linears], [m.out_features for m in linears])
    return fused


def _cat_bias(biases, sizes) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    parts = [torch.zeros(n) if b is None else b.detach().float() for b, n in zip(biases, sizes, strict=True)]
    return torch.cat(parts)


def _parts(module: RowwiseLinear) -> tuple:
    return module.weight, module.scale, module.bias


def native_layers(layers: list[dict], d) -> list:
    """``decoder_forward``'s layers (csrc/decoder.cpp's ``Layer``) over fused row-wise kernels, with
    the rotary tables and windows of the description ``d``."""
    kernel = rowwise_kernel()
    out = []
    for i, layer in enumerate(layers):
        native = kernel.Layer()
        native.attn_norm, native.ffn_norm = layer["attn_norm"], layer["mlp_norm"]
        native.rope, native.window = d.layer_rope[i], d.layer_window[i]
        for field, name in (("q", "qkv"), ("o", "o"), ("gate", "gate_up"), ("down", "down")):
            module, product = layer[name], kernel.Product()
            weight, scale, bias = _parts(module)
            product.weight, product.K = weight, module.in_features
            product.type = BF16 if weight.dtype == torch.bfloat16 else I8S
            if scale is not None:
                product.scale = scale
            if bias is not None:
                product.bias = bias
            setattr(native, field, product)
        out.append(native)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' layout (halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class LeanModel(StackModel, Pretrained):
    """A transformers model's weights run by the lean forward: ``extend``, ``crop`` and ``reset`` on
    its own sequence, ``new_sequence`` and ``forward`` for several (``stack.StackModel``)."""

    def __init__(self, model, tokenizer, name: str = "model", dtype: str | None = None):
        super().__init__(model, tokenizer, name=name, dtype=dtype)
        d = self.description = describe_hf(model.config)
        self.heads, self.kv_heads, self.head_dim, self.eps = d.heads, d.kv_heads, d.head_dim, d.eps
        self.n_layers = d.n_layers
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()  # rows widened to fp32 as they are looked up
        self.final_norm = inner.norm.weight.detach().float()
        self.lm_head = model.lm_head
        self.layers = [dict(
            attn_norm=layer.input_layernorm.weight.detach().float(),
            qkv=fuse(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
            o=layer.self_attn.o_proj,
            mlp_norm=layer.post_attention_layernorm.weight.detach().float(),
            gate_up=fuse(layer.mlp.gate_proj, layer.mlp.up_proj),
            down=layer.mlp.down_proj,
        ) for layer in inner.layers]
        self.native = None  # the whole stack in one C++ call, when every product is the row-wise kernel
        products = ("qkv", "o", "gate_up", "down")
        if all(isinstance(layer[p], RowwiseLinear) for layer in self.layers for p in products):
            self.native = native_layers(self.layers, d)
            self.kernel = rowwise_kernel()
            self.arch = kernel_arch(self.kernel, d)
        self.hold_sequences()

    @property
    def row_invariant(self) -> bool:
        """Each token's numbers independent of the tokens computed with it (the C++ stack, tested)."""
        return self.native is not None

    @property
    def tree_attention(self) -> bool:
        """Whether forward takes a tree of rows: on the C++ stack only."""
        return self.native is not None

    @property
    def kernel_level(self) -> int | None:
        return self.kernel.isa() if self.native is not None else None

    def forward(self, batch: list[tuple], head=None) -> list[torch.Tensor]:
        if self.native is not None:
            return super().forward(batch, head)
        if any(len(entry) > 3 and entry[3] is not None for entry in batch):
            raise ValueError("forward: a tree of rows needs the C++ stack (row-wise kernels)")
        check_distinct(batch)
        return [self._reference(seq, ids, last) for seq, ids, last, *_ in batch]

    def decode(self, rows: Rows, head=None) -> torch.Tensor:
        """The logits of ``rows.picked`` on the C++ stack (``StackModel.forward``)."""
        x = self.run_stack(self.embed[rows.ids].float(), rows, self.native)
        return self.lm_head(rms_norm(x, self.final_norm, self.eps)).float()

    @torch.no_grad()
    def _reference(self, seq: Sequence, ids: list[int], last: int | None) -> torch.Tensor:
        """``ids`` through the Python steps, over ``seq``'s cache."""
        start, m = seq.num_cached, len(ids)
        end = start + m
        seq.cache.reserve(start, end, seq.context_length)
        cos, sin = self.description.rotary[0].angles(torch.arange(start, end))
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)  # transformers' halves
        mask = None
        if m > 1:
            mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        x = self.embed[torch.tensor(ids)].float()
        for layer, keys, values in zip(self.layers, seq.cache.keys, seq.cache.values, strict=True):
            qkv = layer["qkv"](rms_norm(x, layer["attn_norm"], self.eps))
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = rotate(q.view(m, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            keys[:, start:end] = rotate(k.view(m, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            values[:, start:end] = v.view(m, self.kv_heads, self.head_dim).transpose(0, 1)
            attn = F.scaled_dot_product_attention(q[None], keys[None, :, :end], values[None, :, :end],
                                                  attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
            x = x + layer["o"](attn[0].transpose(0, 1).reshape(m, q_size))
            gate, up = layer["gate_up"](rms_norm(x, layer["mlp_norm"], self.eps)).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
        keep = m if last is None else last
        seq.cached_ids.extend(ids)
        return self.lm_head(rms_norm(x[m - keep:], self.final_norm, self.eps)).float()
